/* The EXACT reference estimator, worker side (format 1; the roles use the counting one, qcsum.c):
 * turns one step's router scores into exact top tails (byte map in docs/quantile.md "Reference:
 * the exact estimator"). Not the coordinator; no networking. */
#include <math.h>
#include <stdlib.h>

#include "qinternal.h"

struct st_qxsum {
    uint32_t n_layers, n_experts, k, max_tokens;
    float *col;        /* [max_tokens] one expert's column */
    uint32_t *want;    /* [n_experts] entries each expert wants */
    uint32_t *off;     /* [n_experts] end of its segment in pool; UINT32_MAX: explicit record */
    float *pool;       /* [qxsum_budget(max_tokens)] implicit experts' listed scores */
    uint8_t *seen;     /* [n_layers] layer already added */
    /* current summary */
    uint8_t *buf;
    size_t cap, len;
    uint32_t n_sections;
    const st_qtable_t *th;
    int open;
};

/* Rank quota when no report cut exists: twice this worker's target share mu = (k/n)T plus three
 * standard deviations of its sampling noise, so a worker holding more than its share of the global
 * top still lists all of it (with lambda = 0 nothing older backs it up). */
static uint32_t qxsum_rank_quota(uint32_t n, uint32_t k, uint32_t T) {
    double mu = (double)k * T / n;
    double q = ceil(2.0 * mu + 3.0 * sqrt(mu)) + 1.0;
    return q < (double)T ? (uint32_t)q : T;
}

/* Per-layer budget of listed entries: covers the rank quota for every expert (<= 2kT + 3n*sqrt(kT/n)
 * + 2n) and the report-cut mode, ~1.5kT once settled, with room to spare. */
static uint64_t qxsum_budget(uint32_t n, uint32_t k, uint32_t T) {
    uint64_t b = 3ull * k * T + (uint64_t)ceil(3.0 * n * sqrt((double)k * T / n)) + 2ull * n;
    uint64_t dense = (uint64_t)n * T;
    return b < dense ? b : dense;
}

size_t st_qxsum_max_bytes(uint32_t n_layers, uint32_t n_experts, uint32_t k, uint32_t max_tokens) {
    if (!n_layers || !n_experts || n_experts > ST_QSUM_MAX_EXPERTS || !k || k > n_experts || !max_tokens)
        return 0;
    uint64_t per_layer = ST_QSUM_SECTION_BYTES + 12ull * n_experts + 4ull * qxsum_budget(n_experts, k, max_tokens);
    return (size_t)(ST_QSUM_HEADER_BYTES + (uint64_t)n_layers * per_layer);
}

st_status_t st_qxsum_create(uint32_t n_layers, uint32_t n_experts, uint32_t k, uint32_t max_tokens,
                           st_qxsum_t **out) {
    if (!out || !st_qxsum_max_bytes(n_layers, n_experts, k, max_tokens))
        return ST_FAIL(ST_ERR_INVALID_ARG, "qsum: bad shape layers=%u experts=%u k=%u max_tokens=%u",
                       n_layers, n_experts, k, max_tokens);
    st_qxsum_t *b = calloc(1, sizeof *b);
    if (!b) goto err_nomem;
    b->n_layers = n_layers;
    b->n_experts = n_experts;
    b->k = k;
    b->max_tokens = max_tokens;
    b->col = malloc(sizeof(float) * max_tokens);
    b->want = malloc(sizeof(uint32_t) * n_experts);
    b->seen = malloc(n_layers);
    b->off = malloc(sizeof(uint32_t) * n_experts);
    b->pool = malloc(sizeof(float) * qxsum_budget(n_experts, k, max_tokens));
    if (!b->col || !b->want || !b->seen || !b->off || !b->pool) goto err_free;
    *out = b;
    return ST_OK;
err_free:
    st_qxsum_destroy(b);
err_nomem:
    return ST_FAIL(ST_ERR_NO_MEMORY, "qsum: out of memory");
}

void st_qxsum_destroy(st_qxsum_t *b) {
    if (!b) return;
    free(b->col);
    free(b->want);
    free(b->seen);
    free(b->off);
    free(b->pool);
    free(b);
}

st_status_t st_qxsum_begin(st_qxsum_t *b, void *buf, size_t cap, uint32_t worker_id, uint64_t step,
                          const st_qtable_t *th) {
    if (!b || !buf) return ST_FAIL(ST_ERR_INVALID_ARG, "qxsum_begin: NULL argument");
    if (cap < ST_QSUM_HEADER_BYTES) return ST_FAIL(ST_ERR_CAPACITY, "qxsum_begin: buffer of %zu bytes too small", cap);
    if (th && th->version && (th->n_layers != b->n_layers || th->n_experts != b->n_experts || !th->tau || !th->rho))
        return ST_FAIL(ST_ERR_INVALID_ARG, "qxsum_begin: table shape %ux%u, builder %ux%u", th->n_layers,
                       th->n_experts, b->n_layers, b->n_experts);
    b->buf = buf;
    b->cap = cap;
    b->len = ST_QSUM_HEADER_BYTES;
    b->n_sections = 0;
    b->th = (th && th->version) ? th : NULL;
    b->open = 1;
    memset(b->seen, 0, b->n_layers);
    uint8_t *h = b->buf;
    memset(h, 0, ST_QSUM_HEADER_BYTES);
    st_q_put32(h + 0, ST_QSUM_MAGIC);
    st_q_put16(h + 4, ST_QXSUM_FORMAT);
    st_q_put16(h + 6, ST_QSUM_HEADER_BYTES);
    st_q_put32(h + 12, b->n_layers);
    st_q_put32(h + 16, b->n_experts);
    st_q_put32(h + 20, b->k);
    st_q_put64(h + 24, b->th ? b->th->version : 0);
    st_q_put32(h + 32, worker_id);
    st_q_put64(h + 40, step);
    return ST_OK;
}

/* Value of rank r (1-based) in descending order of x[0..n); reorders x. Quickselect with a
 * three-way partition, so long runs of ties cost one pass. */
float st_q_select_desc(float *x, uint32_t n, uint32_t r) {
    uint32_t lo = 0, hi = n, want = r - 1;
    while (hi - lo > 1) {
        float p = x[lo + (hi - lo) / 2], t;
        uint32_t lt = lo, i = lo, gt = hi; /* [lo,lt) > p, [lt,i) == p, [gt,hi) < p */
        while (i < gt) {
            if (x[i] > p) { t = x[lt]; x[lt++] = x[i]; x[i++] = t; }
            else if (x[i] < p) { t = x[--gt]; x[gt] = x[i]; x[i] = t; }
            else i++;
        }
        if (want < lt) hi = lt;
        else if (want >= gt) lo = gt;
        else return p;
    }
    return x[want];
}

static int qxsum_cmp_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

st_status_t st_qxsum_add_layer(st_qxsum_t *b, uint32_t layer, const float *scores, uint32_t T) {
    if (!b || !b->open) return ST_FAIL(ST_ERR_INVALID_ARG, "qxsum_add_layer: no summary begun");
    if (layer >= b->n_layers) return ST_FAIL(ST_ERR_OUT_OF_RANGE, "qxsum_add_layer: layer %u >= %u", layer, b->n_layers);
    if (b->seen[layer]) return ST_FAIL(ST_ERR_INVALID_ARG, "qxsum_add_layer: layer %u added twice", layer);
    if (T == 0) return ST_OK;
    if (!scores) return ST_FAIL(ST_ERR_INVALID_ARG, "qxsum_add_layer: NULL scores");
    if (T > b->max_tokens) return ST_FAIL(ST_ERR_OUT_OF_RANGE, "qxsum_add_layer: %u tokens > max %u", T, b->max_tokens);
    const uint32_t n = b->n_experts;
    for (size_t i = 0; i < (size_t)T * n; i++)
        if (!isfinite(scores[i]))
            return ST_FAIL(ST_ERR_INVALID_ARG, "qxsum_add_layer: layer %u token %zu expert %zu: non-finite score",
                           layer, i / n, i % n);
    const float *rho = b->th ? b->th->rho + (size_t)layer * n : NULL;

    /* Pass 1: what each expert wants to list: with a report cut, how many scores reach it (one
     * row-major sweep; a NaN cut compares false); without, the rank quota. 65536 = too many for
     * one record (the list length is 16 bits): that expert is truncated, explicitly. */
    uint64_t total = 0;
    uint32_t quota = qxsum_rank_quota(n, b->k, T), maxw = 0;
    for (uint32_t j = 0; j < n; j++) b->want[j] = (rho && rho[j] == rho[j]) ? 0 : quota;
    if (rho)
        for (uint32_t t = 0; t < T; t++) {
            const float *row = scores + (size_t)t * n;
            for (uint32_t j = 0; j < n; j++) b->want[j] += row[j] >= rho[j];
        }
    for (uint32_t j = 0; j < n; j++) {
        if (b->want[j] > 65536u) b->want[j] = 65536u;
        total += b->want[j];
        if (b->want[j] > maxw) maxw = b->want[j];
    }
    /* Over budget (a stale report cut): water-fill, the largest q with sum min(want, q) <= budget. */
    uint64_t budget = qxsum_budget(n, b->k, T);
    uint32_t q = maxw;
    if (total > budget) {
        uint32_t lo = 0, hi = maxw;
        while (lo < hi) {
            uint32_t mid = lo + (hi - lo + 1) / 2;
            uint64_t s = 0;
            for (uint32_t j = 0; j < n; j++) s += b->want[j] < mid ? b->want[j] : mid;
            if (s <= budget) lo = mid; else hi = mid - 1;
        }
        q = lo;
    }

    /* Gather the implicit experts' scores (all >= their cut) into pool segments, row-major. */
    uint32_t used = 0;
    for (uint32_t j = 0; j < n; j++) {
        int implicit = rho && rho[j] == rho[j] && b->want[j] <= q && b->want[j] <= 65535u;
        b->off[j] = implicit ? used : UINT32_MAX;
        if (implicit) used += b->want[j];
    }
    if (rho && used)
        for (uint32_t t = 0; t < T; t++) {
            const float *row = scores + (size_t)t * n;
            for (uint32_t j = 0; j < n; j++)
                if (b->off[j] != UINT32_MAX && row[j] >= rho[j]) b->pool[b->off[j]++] = row[j] + 0.0f; /* -0 -> +0 */
        }

    /* Pass 2: write the section. Worst case is within st_qxsum_max_bytes; check anyway. */
    size_t sec = b->len;
    if (sec + ST_QSUM_SECTION_BYTES > b->cap) goto err_cap;
    size_t p = sec + ST_QSUM_SECTION_BYTES;
    uint32_t n_rec = 0;
    for (uint32_t j = 0; j < n; j++) {
        int implicit = b->off[j] != UINT32_MAX;
        if (implicit && b->want[j] == 0) continue; /* omitted: nothing >= rho */
        uint32_t m = 0;
        float cut = 0, *list = b->col;
        uint32_t n_at = 0;
        if (implicit) {
            m = b->want[j];
            list = b->pool + b->off[j] - m;
        } else {
            uint32_t r = b->want[j] < q ? b->want[j] : q;
            if (r > 65535u) r = 65535u;
            for (uint32_t t = 0; t < T; t++) b->col[t] = scores[(size_t)t * n + j] + 0.0f;
            cut = st_q_select_desc(b->col, T, r ? r : 1);
            if (r == 0) { /* budget exhausted: report only the top value's group */
                cut = b->col[0];
                for (uint32_t t = 1; t < T; t++) if (b->col[t] > cut) cut = b->col[t];
            }
            for (uint32_t t = 0; t < T; t++) {
                float s = b->col[t];
                if (s > cut) b->col[m++] = s;
                else n_at += s == cut;
            }
        }
        qsort(list, m, sizeof(float), qxsum_cmp_desc);
        size_t need = 4 + (implicit ? 0 : 8) + 4ull * m;
        if (p + need > b->cap) goto err_cap;
        st_q_put16(b->buf + p, (uint16_t)(j | (implicit ? 0 : ST_Q_REC_EXPLICIT)));
        st_q_put16(b->buf + p + 2, (uint16_t)m);
        p += 4;
        if (!implicit) {
            st_q_putf(b->buf + p, cut);
            st_q_put32(b->buf + p + 4, n_at);
            p += 8;
        }
        for (uint32_t i = 0; i < m; i++, p += 4) st_q_putf(b->buf + p, list[i]);
        n_rec++;
    }
    st_q_put32(b->buf + sec, layer);
    st_q_put32(b->buf + sec + 4, T);
    st_q_put32(b->buf + sec + 8, n_rec);
    st_q_put32(b->buf + sec + 12, (uint32_t)(p - sec));
    b->len = p;
    b->n_sections++;
    b->seen[layer] = 1;
    return ST_OK;
err_cap:
    return ST_FAIL(ST_ERR_CAPACITY, "qxsum_add_layer: buffer of %zu bytes full at layer %u (size it with st_qxsum_max_bytes)",
                   b->cap, layer);
}

st_status_t st_qxsum_finish(st_qxsum_t *b, size_t *out_bytes) {
    if (!b || !b->open || !out_bytes) return ST_FAIL(ST_ERR_INVALID_ARG, "qxsum_finish: no summary begun");
    if (b->len > UINT32_MAX) return ST_FAIL(ST_ERR_CAPACITY, "qxsum_finish: summary over 4 GiB");
    st_q_put32(b->buf + 8, (uint32_t)b->len);
    st_q_put32(b->buf + 36, b->n_sections);
    b->open = 0;
    *out_bytes = b->len;
    return ST_OK;
}
