/* Worker side of the counting estimator (format 2): per (layer, expert) the count of this step's
 * tokens at or above tau, on probed layers the count between rho and tau, bit-packed; layers with
 * no tau yet send two order statistics instead. Byte map: docs/quantile.md. No networking. */
#include <math.h>
#include <stdlib.h>

#include "qinternal.h"

#define QC_TCLASS 33 /* size estimates kept per bit length of T */

struct st_qsum {
    uint32_t n_layers, n_experts, k, max_tokens;
    size_t budget;
    uint32_t *cnt, *band;  /* [n] */
    float *col;            /* [max_tokens] one expert's column (init sections) */
    uint64_t *last;        /* [L] summary number when the layer was last sent (0: never) */
    uint32_t *order;       /* [L] layers by priority */
    uint8_t *seen, *sel;   /* [L] */
    double est_cnt[QC_TCLASS], est_band[QC_TCLASS]; /* bytes of a count / band plane, by T class */
    /* current summary */
    uint8_t *buf;
    size_t cap, len, limit;
    uint32_t n_sections, last_sections, worker;
    uint64_t seq;
    const st_qtable_t *th;
    int open, planned;
};

void st_qsum_count_layer(const float *scores, uint32_t T, uint32_t n, const float *tau, const float *rho,
                         uint32_t *cnt, uint32_t *band) {
    for (uint32_t j = 0; j < n; j++) cnt[j] = 0;
    const int with_band = rho && band;
    if (with_band)
        for (uint32_t j = 0; j < n; j++) band[j] = 0;
    /* NOTE: blocks of 8 with a fixed inner count, so that -O2 vectorizes them (SLP) */
    const uint32_t n8 = n & ~7u;
    for (uint32_t t = 0; t < T; t++) {
        const float *restrict row = scores + (size_t)t * n;
        uint32_t *restrict c = cnt;
        const float *restrict th = tau;
        for (uint32_t j = 0; j < n8; j += 8)
            for (uint32_t i = 0; i < 8; i++) c[j + i] += row[j + i] >= th[j + i];
        for (uint32_t j = n8; j < n; j++) c[j] += row[j] >= th[j];
        if (with_band) {
            /* exactly one of s >= rho, s >= tau holds iff s lies in [min, max) of the two */
            uint32_t *restrict bd = band;
            const float *restrict pr = rho;
            for (uint32_t j = 0; j < n8; j += 8)
                for (uint32_t i = 0; i < 8; i++) bd[j + i] += (uint32_t)(row[j + i] >= pr[j + i]) ^ (uint32_t)(row[j + i] >= th[j + i]);
            for (uint32_t j = n8; j < n; j++) bd[j] += (uint32_t)(row[j] >= pr[j]) ^ (uint32_t)(row[j] >= th[j]);
        }
    }
}

static uint32_t qc_bits(uint64_t v) {
    uint32_t b = 0;
    while (v) { b++; v >>= 1; }
    return b;
}

/* Bytes of one plane (frame of reference + bit width + exceptions) for v[0..n); with out, writes it. */
static size_t qc_plane(const uint32_t *v, uint32_t n, uint8_t *out) {
    uint32_t base = UINT32_MAX;
    for (uint32_t j = 0; j < n; j++) base = v[j] < base ? v[j] : base;
    uint32_t hist[33] = {0};
    for (uint32_t j = 0; j < n; j++) hist[qc_bits(v[j] - base)]++;
    /* width w: exceptions are the values needing more than w bits */
    size_t best = SIZE_MAX;
    uint32_t bw = 32, exc_at = 0, above = 0;
    for (int w = 32; w >= 0; w--) {
        size_t sz = ((size_t)n * (uint32_t)w + 7) / 8 + (size_t)ST_QC_EXC_BYTES * above;
        if (above <= 65535u && sz <= best) { best = sz; bw = (uint32_t)w; exc_at = above; }
        above += hist[w];
    }
    if (out) {
        uint8_t *p = out;
        st_q_put32(p, base);
        p[4] = (uint8_t)bw;
        p[5] = 0;
        st_q_put16(p + 6, (uint16_t)exc_at);
        p += ST_QC_PLANE_HDR;
        uint8_t *ex = p + ((size_t)n * bw + 7) / 8;
        uint64_t lim = bw == 32 ? UINT64_MAX : (1ull << bw), acc = 0;
        uint32_t held = 0; /* bits in acc, < 8 between values */
        for (uint32_t j = 0; j < n; j++) {
            uint64_t d = v[j] - base;
            if (d >= lim) { /* exception: full value in the list, 0 in the packed slot */
                st_q_put16(ex, (uint16_t)j);
                st_q_put32(ex + 2, v[j]);
                ex += ST_QC_EXC_BYTES;
                d = 0;
            }
            acc |= d << held; /* held + bw <= 39 bits */
            held += bw;
            while (held >= 8) { *p++ = (uint8_t)acc; acc >>= 8; held -= 8; }
        }
        if (held) *p = (uint8_t)acc;
    }
    return ST_QC_PLANE_HDR + best;
}

static size_t qc_init_bytes(uint32_t n) { return ST_QSUM_SECTION_BYTES + ST_QC_INIT_HDR + 8ull * n; }
static size_t qc_count_max(uint32_t n) { return ST_QSUM_SECTION_BYTES + 2ull * (ST_QC_PLANE_HDR + 4ull * n); }

size_t st_qsum_max_bytes(uint32_t n_layers, uint32_t n_experts, uint32_t k, uint32_t max_tokens) {
    if (!n_layers || !n_experts || n_experts > ST_QSUM_MAX_EXPERTS || !k || k > n_experts || !max_tokens) return 0;
    size_t sec = qc_init_bytes(n_experts) > qc_count_max(n_experts) ? qc_init_bytes(n_experts) : qc_count_max(n_experts);
    size_t all = ST_QSUM_HEADER_BYTES + (size_t)n_layers * sec;
    size_t b = ST_QSUM_DEFAULT_BUDGET;
    if (b < ST_QSUM_HEADER_BYTES + sec) b = ST_QSUM_HEADER_BYTES + sec;
    return all < b ? all : b;
}

st_status_t st_qsum_create(uint32_t n_layers, uint32_t n_experts, uint32_t k, uint32_t max_tokens, st_qsum_t **out) {
    if (!out || !st_qsum_max_bytes(n_layers, n_experts, k, max_tokens))
        return ST_FAIL(ST_ERR_INVALID_ARG, "qsum: bad shape layers=%u experts=%u k=%u max_tokens=%u", n_layers, n_experts,
                       k, max_tokens);
    st_qsum_t *b = calloc(1, sizeof *b);
    if (!b) return ST_FAIL(ST_ERR_NO_MEMORY, "qsum: out of memory");
    b->n_layers = n_layers;
    b->n_experts = n_experts;
    b->k = k;
    b->max_tokens = max_tokens;
    b->budget = st_qsum_max_bytes(n_layers, n_experts, k, max_tokens);
    b->cnt = malloc(sizeof(uint32_t) * n_experts);
    b->band = malloc(sizeof(uint32_t) * n_experts);
    b->col = malloc(sizeof(float) * max_tokens);
    b->last = calloc(n_layers, sizeof(uint64_t));
    b->order = malloc(sizeof(uint32_t) * n_layers);
    b->seen = malloc(n_layers);
    b->sel = malloc(n_layers);
    if (!b->cnt || !b->band || !b->col || !b->last || !b->order || !b->seen || !b->sel) {
        st_qsum_destroy(b);
        return ST_FAIL(ST_ERR_NO_MEMORY, "qsum: out of memory");
    }
    /* first guess of a plane's size for T tokens: counts spread over ~8 sd of the expected
     * count (k/n)T; measured sizes replace it */
    double p = (double)k / n_experts;
    for (int c = 0; c < QC_TCLASS; c++) {
        double T = c ? ldexp(1.0, c) : 1.0, mu = p * T;
        double span = fmin(T, mu + 8.0 * sqrt(mu) + 4.0);
        b->est_cnt[c] = b->est_band[c] = ST_QC_PLANE_HDR + n_experts * (qc_bits((uint64_t)span) + 0.5) / 8.0;
    }
    *out = b;
    return ST_OK;
}

void st_qsum_destroy(st_qsum_t *b) {
    if (!b) return;
    free(b->cnt); free(b->band); free(b->col); free(b->last); free(b->order); free(b->seen); free(b->sel);
    free(b);
}

st_status_t st_qsum_set_budget(st_qsum_t *b, size_t bytes) {
    if (!b) return ST_FAIL(ST_ERR_INVALID_ARG, "qsum_set_budget: NULL");
    size_t sec = qc_init_bytes(b->n_experts) > qc_count_max(b->n_experts) ? qc_init_bytes(b->n_experts) : qc_count_max(b->n_experts);
    if (bytes < ST_QSUM_HEADER_BYTES + sec)
        return ST_FAIL(ST_ERR_INVALID_ARG, "qsum_set_budget: %zu bytes < one section (%zu)", bytes, ST_QSUM_HEADER_BYTES + sec);
    b->budget = bytes;
    return ST_OK;
}

st_status_t st_qsum_begin(st_qsum_t *b, void *buf, size_t cap, uint32_t worker_id, uint64_t step, const st_qtable_t *th) {
    if (!b || !buf) return ST_FAIL(ST_ERR_INVALID_ARG, "qsum_begin: NULL argument");
    if (cap < ST_QSUM_HEADER_BYTES) return ST_FAIL(ST_ERR_CAPACITY, "qsum_begin: buffer of %zu bytes too small", cap);
    if (th && th->version && (th->n_layers != b->n_layers || th->n_experts != b->n_experts || !th->tau || !th->rho))
        return ST_FAIL(ST_ERR_INVALID_ARG, "qsum_begin: table shape %ux%u, builder %ux%u", th->n_layers, th->n_experts,
                       b->n_layers, b->n_experts);
    b->buf = buf;
    b->cap = cap;
    b->limit = cap < b->budget ? cap : b->budget;
    b->len = ST_QSUM_HEADER_BYTES;
    b->n_sections = 0;
    b->th = (th && th->version) ? th : NULL;
    b->open = 1;
    b->planned = 0;
    b->worker = worker_id;
    b->seq++;
    memset(b->seen, 0, b->n_layers);
    uint8_t *h = b->buf;
    memset(h, 0, ST_QSUM_HEADER_BYTES);
    st_q_put32(h + ST_QH_MAGIC, ST_QSUM_MAGIC);
    st_q_put16(h + ST_QH_FORMAT, ST_QSUM_FORMAT);
    st_q_put16(h + ST_QH_HDR_BYTES, ST_QSUM_HEADER_BYTES);
    st_q_put32(h + ST_QH_LAYERS, b->n_layers);
    st_q_put32(h + ST_QH_EXPERTS, b->n_experts);
    st_q_put32(h + ST_QH_K, b->k);
    st_q_put64(h + ST_QH_TAU_VERSION, b->th ? b->th->version : 0);
    st_q_put32(h + ST_QH_WORKER, worker_id);
    st_q_put64(h + ST_QH_STEP, step);
    return ST_OK;
}

static int qc_layer_set(const st_qsum_t *b, uint32_t l) { return b->th && st_qtau_is_set(b->th->tau[(size_t)l * b->n_experts]); }
static int qc_layer_probed(const st_qsum_t *b, uint32_t l) { return b->th && st_qtau_is_set(b->th->rho[(size_t)l * b->n_experts]); }

/* Which layers this summary carries (decided at its first layer, when T is known): the ones sent
 * longest ago first (ties: a rotation that differs per worker, so that workers cover different
 * layers), as many as the estimated sizes fit in the budget. */
static void qc_plan(st_qsum_t *b, uint32_t T) {
    const uint32_t L = b->n_layers, rot = (uint32_t)(((uint64_t)b->worker * 2654435761u) % L);
    for (uint32_t i = 0; i < L; i++) b->order[i] = (i + rot) % L;
    for (uint32_t i = 1; i < L; i++) { /* insertion sort by last-sent, stable: keeps the rotation */
        uint32_t x = b->order[i], a = i;
        while (a > 0 && b->last[b->order[a - 1]] > b->last[x]) { b->order[a] = b->order[a - 1]; a--; }
        b->order[a] = x;
    }
    int c = (int)qc_bits(T);
    double used = ST_QSUM_HEADER_BYTES;
    for (uint32_t i = 0; i < L; i++) {
        uint32_t l = b->order[i];
        double est = !qc_layer_set(b, l) ? (double)qc_init_bytes(b->n_experts)
                                          : ST_QSUM_SECTION_BYTES + b->est_cnt[c] + (qc_layer_probed(b, l) ? b->est_band[c] : 0);
        b->sel[l] = used + est <= (double)b->limit;
        if (b->sel[l]) used += est;
    }
    b->planned = 1;
}

/* Append a COUNT section (count plane, band plane when band) if it fits the room left; a section
 * that does not fit waits for a later summary. */
static void qc_put_counts(st_qsum_t *b, uint32_t layer, uint32_t T, const uint32_t *cnt, const uint32_t *band) {
    const uint32_t n = b->n_experts;
    const int c = (int)qc_bits(T);
    uint8_t *sec = b->buf + b->len;
    size_t a = qc_plane(cnt, n, NULL), bb = band ? qc_plane(band, n, NULL) : 0;
    size_t need = ST_QSUM_SECTION_BYTES + a + bb;
    b->est_cnt[c] += 0.25 * ((double)a - b->est_cnt[c]);
    if (band) b->est_band[c] += 0.25 * ((double)bb - b->est_band[c]);
    if (need > b->limit - b->len) return;
    qc_plane(cnt, n, sec + ST_QSUM_SECTION_BYTES);
    if (band) qc_plane(band, n, sec + ST_QSUM_SECTION_BYTES + a);
    st_q_put32(sec + 0, layer);
    st_q_put32(sec + 4, T);
    st_q_put16(sec + 8, ST_QC_KIND_COUNT);
    st_q_put16(sec + 10, band ? ST_QC_FLAG_BAND : 0);
    st_q_put32(sec + 12, (uint32_t)need);
    b->len += need;
    b->n_sections++;
    b->last[layer] = b->seq;
}

st_status_t st_qsum_add_layer(st_qsum_t *b, uint32_t layer, const float *scores, uint32_t T) {
    if (!b || !b->open) return ST_FAIL(ST_ERR_INVALID_ARG, "qsum_add_layer: no summary begun");
    if (layer >= b->n_layers) return ST_FAIL(ST_ERR_OUT_OF_RANGE, "qsum_add_layer: layer %u >= %u", layer, b->n_layers);
    if (b->seen[layer]) return ST_FAIL(ST_ERR_INVALID_ARG, "qsum_add_layer: layer %u added twice", layer);
    if (T == 0) return ST_OK;
    if (!scores) return ST_FAIL(ST_ERR_INVALID_ARG, "qsum_add_layer: NULL scores");
    if (T > b->max_tokens) return ST_FAIL(ST_ERR_OUT_OF_RANGE, "qsum_add_layer: %u tokens > max %u", T, b->max_tokens);
    if (!b->planned) qc_plan(b, T);
    b->seen[layer] = 1;
    if (!b->sel[layer]) return ST_OK;
    const uint32_t n = b->n_experts;
    const int c = (int)qc_bits(T);
    uint8_t *sec = b->buf + b->len;
    size_t room = b->limit - b->len;
    if (!qc_layer_set(b, layer)) {
        /* INIT: per expert the scores of local rank r1 ~ (k/n)T and r2 ~ 2(k/n)T */
        size_t need = qc_init_bytes(n);
        if (need > room) return ST_OK; /* waits for a later summary */
        double mu = (double)b->k * T / n;
        uint32_t r1 = (uint32_t)fmin(T, fmax(1.0, ceil(mu)));
        uint32_t r2 = (uint32_t)fmin(T, fmax((double)r1 + 1.0, ceil(2.0 * mu)));
        uint8_t *p = sec + ST_QSUM_SECTION_BYTES + ST_QC_INIT_HDR;
        for (uint32_t j = 0; j < n; j++) {
            for (uint32_t t = 0; t < T; t++) {
                float s = scores[(size_t)t * n + j];
                if (!isfinite(s)) return ST_FAIL(ST_ERR_INVALID_ARG, "qsum_add_layer: layer %u token %u expert %u: non-finite score", layer, t, j);
                b->col[t] = s + 0.0f;
            }
            float x2 = st_q_select_desc(b->col, T, r2);
            /* after the select, col[0..r2) holds the r2 largest */
            float x1 = r1 == r2 ? x2 : st_q_select_desc(b->col, r2, r1);
            st_q_putf(p, x1);
            st_q_putf(p + 4, x2);
            p += 8;
        }
        st_q_put32(sec + ST_QSUM_SECTION_BYTES, r1);
        st_q_put32(sec + ST_QSUM_SECTION_BYTES + 4, r2);
        st_q_put32(sec + 0, layer);
        st_q_put32(sec + 4, T);
        st_q_put16(sec + 8, ST_QC_KIND_INIT);
        st_q_put16(sec + 10, 0);
        st_q_put32(sec + 12, (uint32_t)need);
    } else {
        /* NOTE: no finiteness pass here (it would cost as much as the counting): a NaN score
         * counts as below every threshold, an infinite one as what it is */
        const float *tau = b->th->tau + (size_t)layer * n, *rho = qc_layer_probed(b, layer) ? b->th->rho + (size_t)layer * n : NULL;
        st_qsum_count_layer(scores, T, n, tau, rho, b->cnt, rho ? b->band : NULL);
        qc_put_counts(b, layer, T, b->cnt, rho ? b->band : NULL);
        (void)c;
        return ST_OK;
    }
    b->len += st_q_get32(sec + 12);
    b->n_sections++;
    b->last[layer] = b->seq;
    return ST_OK;
}

st_status_t st_qsum_add_layer_counts(st_qsum_t *b, uint32_t layer, uint32_t T, const uint32_t *cnt, const uint32_t *band) {
    if (!b || !b->open) return ST_FAIL(ST_ERR_INVALID_ARG, "qsum_add_layer_counts: no summary begun");
    if (layer >= b->n_layers) return ST_FAIL(ST_ERR_OUT_OF_RANGE, "qsum_add_layer_counts: layer %u >= %u", layer, b->n_layers);
    if (b->seen[layer]) return ST_FAIL(ST_ERR_INVALID_ARG, "qsum_add_layer_counts: layer %u added twice", layer);
    if (T == 0) return ST_OK;
    if (T > b->max_tokens) return ST_FAIL(ST_ERR_OUT_OF_RANGE, "qsum_add_layer_counts: %u tokens > max %u", T, b->max_tokens);
    if (!qc_layer_set(b, layer))
        return ST_FAIL(ST_ERR_INVALID_ARG, "qsum_add_layer_counts: layer %u has no threshold yet: its scores are needed", layer);
    int probed = qc_layer_probed(b, layer);
    if (!cnt || (probed && !band)) return ST_FAIL(ST_ERR_INVALID_ARG, "qsum_add_layer_counts: layer %u: counts%s missing", layer, probed ? " or band" : "");
    for (uint32_t j = 0; j < b->n_experts; j++)
        if (cnt[j] > T || (probed && band[j] > T))
            return ST_FAIL(ST_ERR_INVALID_ARG, "qsum_add_layer_counts: layer %u expert %u: count over %u tokens", layer, j, T);
    if (!b->planned) qc_plan(b, T);
    b->seen[layer] = 1;
    if (!b->sel[layer]) return ST_OK;
    qc_put_counts(b, layer, T, cnt, probed ? band : NULL);
    return ST_OK;
}

st_status_t st_qsum_finish(st_qsum_t *b, size_t *out_bytes) {
    if (!b || !b->open || !out_bytes) return ST_FAIL(ST_ERR_INVALID_ARG, "qsum_finish: no summary begun");
    st_q_put32(b->buf + ST_QH_TOTAL, (uint32_t)b->len);
    st_q_put32(b->buf + ST_QH_SECTIONS, b->n_sections);
    b->open = 0;
    b->last_sections = b->n_sections;
    *out_bytes = b->len;
    return ST_OK;
}

uint32_t st_qsum_last_sections(const st_qsum_t *b) { return b ? b->last_sections : 0; }
