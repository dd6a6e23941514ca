/* The EXACT reference estimator, coordinator side (format 1; the roles use the counting one,
 * qcstate.c): validates and stages worker summaries, and at the end of a step folds them into the
 * decayed per-(layer, expert) distribution D and publishes tau/rho. Derivations (exactness,
 * pruning, compaction bound): docs/quantile.md "Reference: the exact estimator". */
#include <math.h>
#include <stdlib.h>

#include "qinternal.h"

/* Tuning constants of the estimator; the proofs in docs/quantile.md use these values. */
/* sigma = sqrt((k/n)*T_step + 1): the step-to-step sampling noise of the count above tau. */
#define Q_RHO_FACTOR 1.5   /* rho = value at rank 1.5*m + 4*sigma of D: the report cut for workers */
#define Q_RHO_SIGMA 4.0
#define Q_KEEP_FACTOR 2.0  /* D keeps known entries down to rank 2*m + 8*sigma (prune below) */
#define Q_KEEP_SIGMA 8.0
#define Q_BUCKET_EPS 0.002 /* compaction: a bucket within rank of m weighs at most 0.2% of m, */
#define Q_BUCKET_SLOPE 0.01 /* plus 1% of its rank distance from m */
#define Q_UNK 8            /* unknown-mass items kept per (l, j) */
#define Q_UNK_DROP 1e-7    /* unknown items lighter than this fraction of m are forgotten */

/* One entry of D: mass w whose scores all lie in [lo, hi]; a point when lo == hi (exact). */
typedef struct {
    float hi, lo;
    double w;
} q_ent_t;

typedef struct { /* mass w whose scores are all < c, positions unknown */
    float c;
    double w;
} q_unk_t;

typedef struct { /* one gathered score of the step and how many tokens had it */
    float s;
    uint32_t c;
} q_pt_t;

typedef struct {
    const uint8_t *p;
    size_t len;
    uint32_t slot; /* ring slot of the table it was built on, UINT32_MAX: none */
} q_staged_t;

struct st_qxstate {
    uint32_t L, n, k;
    double lambda, kn;
    st_qxstate_opts_t o;
    /* D for (l, j): known entries ent[(l*n+j)*max_entries ...] (cnt of them) plus up to Q_UNK
     * "unknown" items unk[(l*n+j)*Q_UNK ...] (ucnt): mass w somewhere strictly below score c,
     * i.e. tokens a worker counted but did not list (below its cut), or mass pruned here. */
    q_ent_t *ent;
    uint32_t *cnt;
    q_unk_t *unk;
    uint8_t *ucnt;
    float *unc;       /* [L*n] certified rank uncertainty / m at the last published tau (NaN: unset) */
    double *W;        /* [L] decayed token count of each layer */
    /* ring of published tables */
    uint64_t version;
    uint64_t *ring_ver; /* [history] */
    float *ring_tau, *ring_rho; /* [history][L*n] */
    /* staging */
    q_staged_t *st;   /* [max_summaries] */
    uint32_t *sec;    /* [max_summaries][L] section offset, 0 = none */
    uint32_t *cur;    /* [max_summaries] record cursor for the layer being folded */
    uint32_t n_st;
    uint64_t demand;  /* upper bound of gathered entries per (l, j) this step */
    /* scratch for end_step */
    q_pt_t *pts;      /* [max_step_entries] */
    q_unk_t *su;      /* [max_summaries + Q_UNK + 2] the step's unknown items of one (l, j) */
    q_ent_t *tmp;     /* [max_entries + max_step_entries] */
    q_ent_t *tmp2;    /* same size: compaction trial runs */
    /* stats */
    uint64_t n_set, n_exact, compactions;
    double max_rel_uncert;
};

void st_qxstate_opts_default(st_qxstate_opts_t *o) {
    o->min_target = 1.0;
    o->max_entries = 1024;
    o->max_summaries = 256;
    o->max_step_entries = 1u << 16;
    o->history = 16;
}

void st_qxstate_destroy(st_qxstate_t *q) {
    if (!q) return;
    free(q->ent); free(q->cnt); free(q->unk); free(q->ucnt); free(q->unc); free(q->su); free(q->W);
    free(q->ring_ver); free(q->ring_tau); free(q->ring_rho);
    free(q->st); free(q->sec); free(q->cur); free(q->pts); free(q->tmp); free(q->tmp2);
    free(q);
}

st_status_t st_qxstate_create(uint32_t n_layers, uint32_t n_experts, uint32_t k, double lambda,
                             const st_qxstate_opts_t *opts, st_qxstate_t **out) {
    st_qxstate_opts_t o;
    if (opts) o = *opts; else st_qxstate_opts_default(&o);
    if (!out || !n_layers || !n_experts || n_experts > ST_QSUM_MAX_EXPERTS || !k || k > n_experts ||
        !(lambda >= 0 && lambda < 1) || !(o.min_target >= 0) || o.max_entries < 16 || !o.max_summaries ||
        o.max_step_entries < 16 || o.history < 2)
        return ST_FAIL(ST_ERR_INVALID_ARG, "qstate: bad config layers=%u experts=%u k=%u lambda=%g max_entries=%u",
                       n_layers, n_experts, k, lambda, o.max_entries);
    st_qxstate_t *q = calloc(1, sizeof *q);
    if (!q) return ST_FAIL(ST_ERR_NO_MEMORY, "qstate: out of memory");
    size_t ln = (size_t)n_layers * n_experts;
    q->L = n_layers; q->n = n_experts; q->k = k; q->lambda = lambda; q->kn = (double)k / n_experts; q->o = o;
    q->ent = malloc(sizeof(q_ent_t) * ln * o.max_entries);
    q->cnt = calloc(ln, sizeof(uint32_t));
    q->unk = malloc(sizeof(q_unk_t) * ln * Q_UNK);
    q->ucnt = calloc(ln, 1);
    q->unc = malloc(sizeof(float) * ln);
    q->su = malloc(sizeof(q_unk_t) * ((size_t)o.max_summaries + Q_UNK + 2));
    q->W = calloc(n_layers, sizeof(double));
    q->ring_ver = calloc(o.history, sizeof(uint64_t));
    q->ring_tau = malloc(sizeof(float) * ln * o.history);
    q->ring_rho = malloc(sizeof(float) * ln * o.history);
    q->st = calloc(o.max_summaries, sizeof(q_staged_t));
    q->sec = calloc((size_t)o.max_summaries * n_layers, sizeof(uint32_t));
    q->cur = calloc(o.max_summaries, sizeof(uint32_t));
    q->pts = malloc(sizeof(q_pt_t) * o.max_step_entries);
    q->tmp = malloc(sizeof(q_ent_t) * ((size_t)o.max_entries + o.max_step_entries));
    q->tmp2 = malloc(sizeof(q_ent_t) * ((size_t)o.max_entries + o.max_step_entries));
    if (!q->ent || !q->cnt || !q->unk || !q->ucnt || !q->unc || !q->su || !q->W || !q->ring_ver || !q->ring_tau || !q->ring_rho || !q->st ||
        !q->sec || !q->cur || !q->pts || !q->tmp || !q->tmp2) {
        st_qxstate_destroy(q);
        return ST_FAIL(ST_ERR_NO_MEMORY, "qstate: out of memory for %u x %u x %u entries", n_layers, n_experts,
                       o.max_entries);
    }
    *out = q;
    return ST_OK;
}

static uint32_t qxstate_slot_of(const st_qxstate_t *q, uint64_t ver) {
    /* NOTE: history-1, not history: end_step writes the slot of version+1 while still reading the
     * report cuts of staged summaries, so the oldest slot must not be in use. */
    if (!ver || ver > q->version || q->version - ver >= q->o.history - 1) return UINT32_MAX;
    uint32_t s = (uint32_t)(ver % q->o.history);
    return q->ring_ver[s] == ver ? s : UINT32_MAX;
}

/* ---------------- merge: validate everything, then stage ---------------- */

#define HBAD(...) return ST_REJECT(ST_ERR_PROTOCOL, __VA_ARGS__)
st_status_t st_q_check_header(const uint8_t *b, size_t len, uint16_t format, uint32_t L, uint32_t n, uint32_t k,
                              const char *who) {
    if (len < ST_QSUM_HEADER_BYTES) HBAD("%s: truncated: %zu bytes < header %u", who, len, ST_QSUM_HEADER_BYTES);
    if (st_q_get32(b + ST_QH_MAGIC) != ST_QSUM_MAGIC) HBAD("%s: bad magic 0x%08x", who, st_q_get32(b + ST_QH_MAGIC));
    if (st_q_get16(b + ST_QH_FORMAT) != format)
        HBAD("%s: format version %u, expected %u", who, st_q_get16(b + ST_QH_FORMAT), format);
    if (st_q_get16(b + ST_QH_HDR_BYTES) != ST_QSUM_HEADER_BYTES)
        HBAD("%s: header size %u", who, st_q_get16(b + ST_QH_HDR_BYTES));
    if (st_q_get32(b + ST_QH_TOTAL) != len)
        HBAD("%s: length field %u, got %zu bytes (truncated?)", who, st_q_get32(b + ST_QH_TOTAL), len);
    if (st_q_get32(b + ST_QH_LAYERS) != L || st_q_get32(b + ST_QH_EXPERTS) != n || st_q_get32(b + ST_QH_K) != k)
        HBAD("%s: shape %ux%u k=%u, coordinator %ux%u k=%u", who, st_q_get32(b + ST_QH_LAYERS),
             st_q_get32(b + ST_QH_EXPERTS), st_q_get32(b + ST_QH_K), L, n, k);
    return ST_OK;
}
#undef HBAD

#define BAD(...) return ST_REJECT(ST_ERR_PROTOCOL, "qxstate_merge: " __VA_ARGS__)

st_status_t st_qxstate_merge(st_qxstate_t *q, const void *bytes, size_t len) {
    const uint8_t *b = bytes;
    if (!q || !b) return ST_FAIL(ST_ERR_INVALID_ARG, "qxstate_merge: NULL argument");
    st_status_t hs = st_q_check_header(b, len, ST_QXSUM_FORMAT, q->L, q->n, q->k, "qxstate_merge");
    if (hs != ST_OK) return hs;
    uint64_t ver = st_q_get64(b + ST_QH_TAU_VERSION);
    uint32_t slot = UINT32_MAX;
    if (ver) {
        slot = qxstate_slot_of(q, ver);
        if (slot == UINT32_MAX)
            BAD("built on table version %llu, not among the last %u published (newest %llu)", (unsigned long long)ver,
                q->o.history, (unsigned long long)q->version);
    }
    uint32_t n_sec = st_q_get32(b + ST_QH_SECTIONS);
    if (n_sec > q->L) BAD("%u sections > %u layers", n_sec, q->L);
    if (q->n_st >= q->o.max_summaries)
        return ST_FAIL(ST_ERR_CAPACITY, "qxstate_merge: more than %u summaries this step", q->o.max_summaries);
    uint32_t *secs = q->sec + (size_t)q->n_st * q->L; /* scratch row of the slot it would take */
    memset(secs, 0, sizeof(uint32_t) * q->L);
    const float *rho_t = slot != UINT32_MAX ? q->ring_rho + (size_t)slot * q->L * q->n : NULL;
    size_t off = ST_QSUM_HEADER_BYTES;
    uint32_t max_rec = 0;
    for (uint32_t s = 0; s < n_sec; s++) {
        if (len - off < ST_QSUM_SECTION_BYTES) BAD("section %u truncated", s);
        uint32_t layer = st_q_get32(b + off), T = st_q_get32(b + off + 4), n_rec = st_q_get32(b + off + 8),
                 sbytes = st_q_get32(b + off + 12);
        if (layer >= q->L) BAD("section %u: layer %u >= %u", s, layer, q->L);
        if (secs[layer]) BAD("section %u: layer %u repeated", s, layer);
        if (T == 0) BAD("layer %u: zero tokens", layer);
        if (n_rec > q->n) BAD("layer %u: %u records > %u experts", layer, n_rec, q->n);
        if (sbytes < ST_QSUM_SECTION_BYTES || sbytes > len - off) BAD("layer %u: section size %u out of bounds", layer, sbytes);
        const float *rho = rho_t ? rho_t + (size_t)layer * q->n : NULL;
        size_t p = off + ST_QSUM_SECTION_BYTES, end = off + sbytes;
        uint32_t next_j = 0; /* experts < next_j are settled */
        for (uint32_t r = 0; r < n_rec; r++) {
            if (end - p < 4) BAD("layer %u record %u truncated", layer, r);
            uint16_t ef = st_q_get16(b + p), m = st_q_get16(b + p + 2);
            uint32_t j = ef & 0x7fffu;
            int expl = (ef & ST_Q_REC_EXPLICIT) != 0;
            p += 4;
            if (j >= q->n || j < next_j) BAD("layer %u record %u: expert %u out of order or range", layer, r, j);
            for (uint32_t i = next_j; i < j; i++) /* omitted experts need a report cut */
                if (!rho || rho[i] != rho[i]) BAD("layer %u: expert %u omitted without a report cut", layer, i);
            next_j = j + 1;
            float cut;
            uint32_t n_at = 0;
            if (expl) {
                if (end - p < 8) BAD("layer %u expert %u: record truncated", layer, j);
                cut = st_q_getf(b + p);
                n_at = st_q_get32(b + p + 4);
                p += 8;
                if (!isfinite(cut)) BAD("layer %u expert %u: non-finite cut", layer, j);
            } else {
                if (!rho || rho[j] != rho[j]) BAD("layer %u expert %u: implicit record without a report cut", layer, j);
                cut = rho[j];
            }
            if ((size_t)m * 4 > end - p) BAD("layer %u expert %u: %u scores truncated", layer, j, m);
            if ((uint64_t)m + n_at > T) BAD("layer %u expert %u: %u+%u scores > %u tokens", layer, j, m, n_at, T);
            float prev = INFINITY;
            for (uint32_t i = 0; i < m; i++) {
                float v = st_q_getf(b + p + 4 * i);
                if (!isfinite(v) || v > prev || (expl ? !(v > cut) : !(v >= cut)))
                    BAD("layer %u expert %u: score %u (%g) not finite, descending and above the cut %g", layer, j, i,
                        (double)v, (double)cut);
                prev = v;
            }
            p += 4ull * m;
            if ((uint32_t)m + 1 > max_rec) max_rec = (uint32_t)m + 1;
        }
        for (uint32_t i = next_j; i < q->n; i++)
            if (!rho || rho[i] != rho[i]) BAD("layer %u: expert %u omitted without a report cut", layer, i);
        if (p != end) BAD("layer %u: %zu stray bytes in section", layer, end - p);
        secs[layer] = (uint32_t)off;
        off = end;
    }
    if (off != len) BAD("%zu stray bytes after %u sections", len - off, n_sec);
    if (q->demand + max_rec > q->o.max_step_entries)
        return ST_FAIL(ST_ERR_CAPACITY, "qxstate_merge: step would gather over %u entries per expert (max_step_entries)",
                       q->o.max_step_entries);
    q->demand += max_rec;
    q->st[q->n_st] = (q_staged_t){.p = b, .len = len, .slot = slot};
    q->n_st++;
    return ST_OK;
}
#undef BAD

/* ---------------- end of step ---------------- */

static int qxstate_cmp_pt(const void *a, const void *b) {
    float x = ((const q_pt_t *)a)->s, y = ((const q_pt_t *)b)->s;
    return (x < y) - (x > y);
}

/* Greedy compaction, one pass in descending hi order. Invariant: buckets (lo < hi) are pairwise
 * disjoint, so at most one straddles any score. A point inside the nearest bucket above it is
 * absorbed into that bucket (its interval does not change); otherwise neighbours merge while the
 * bucket weighs at most EPS*m + SLOPE*(its rank distance from m). The rank uncertainty at tau is
 * then one bucket's weight (docs/quantile.md §Compaction). */
static uint32_t qxstate_compact(q_ent_t *e, uint32_t cnt, double m, double alpha) {
    uint32_t o = 0, cb = UINT32_MAX; /* cb: index in the output of the nearest bucket */
    double r0 = 0, cum = 0;          /* rank at the start of e[o-1], rank after it */
    for (uint32_t i = 0; i < cnt; i++) {
        if (cb != UINT32_MAX && e[i].hi >= e[cb].lo && e[i].lo == e[i].hi) {
            e[cb].w += e[i].w;
            cum += e[i].w;
            continue;
        }
        if (o > 0) {
            q_ent_t *a = &e[o - 1];
            double end = cum + e[i].w, dist = r0 > m ? r0 - m : (end < m ? m - end : 0);
            if (a->w + e[i].w <= alpha * (Q_BUCKET_EPS * m + Q_BUCKET_SLOPE * dist)) {
                if (e[i].lo < a->lo) a->lo = e[i].lo;
                a->w += e[i].w;
                cum = end;
                if (a->lo < a->hi) cb = o - 1;
                continue;
            }
        }
        r0 = cum;
        cum += e[i].w;
        e[o++] = e[i];
        if (e[o - 1].lo < e[o - 1].hi) cb = o - 1;
    }
    return o;
}

static int qxstate_cmp_unk(const void *a, const void *b) {
    float x = ((const q_unk_t *)a)->c, y = ((const q_unk_t *)b)->c;
    return (x < y) - (x > y);
}

/* Sort unknown items by c descending, combine equal c, forget negligible ones, and fold the lightest
 * into their upper neighbours until at most Q_UNK remain. */
static uint32_t qxstate_unk_norm(q_unk_t *u, uint32_t nu, double m) {
    qsort(u, nu, sizeof(q_unk_t), qxstate_cmp_unk);
    uint32_t o = 0;
    for (uint32_t i = 0; i < nu; i++) {
        if (!(u[i].w > Q_UNK_DROP * m)) continue;
        if (o && u[o - 1].c == u[i].c) u[o - 1].w += u[i].w;
        else u[o++] = u[i];
    }
    while (o > Q_UNK) { /* NOTE: move the lightest item (not the top one) up into its upper neighbour:
                          * c stays a true bound and the least mass loses precision */
        uint32_t best = 1;
        for (uint32_t i = 2; i < o; i++) if (u[i].w < u[best].w) best = i;
        u[best - 1].w += u[best].w;
        memmove(u + best, u + best + 1, sizeof(q_unk_t) * (o - best - 1));
        o--;
    }
    return o;
}

/* Fold the step's gathered points (sorted, combined) and unknown items into D for (l, j); compute
 * tau and rho. su[0..nsu) are the step's unknown items; the array has room for Q_UNK + 2 more. */
static void qxstate_fold(st_qxstate_t *q, size_t lj, uint32_t n_pts, uint32_t nsu, double m, double sig, float *tau,
                        float *rho) {
    q_ent_t *D = q->ent + lj * q->o.max_entries, *t = q->tmp;
    q_unk_t *U = q->unk + lj * Q_UNK, *su = q->su;
    uint32_t nd = q->lambda > 0 ? q->cnt[lj] : 0, nt = 0;
    for (uint32_t i = 0; q->lambda > 0 && i < q->ucnt[lj]; i++) su[nsu++] = (q_unk_t){U[i].c, U[i].w * q->lambda};
    /* merge lambda*D and the new points by (hi desc, buckets first); equal points combine. */
    uint32_t i = 0, k = 0;
    while (i < nd || k < n_pts) {
        q_ent_t x;
        if (k >= n_pts || (i < nd && D[i].hi >= q->pts[k].s)) {
            x = D[i++];
            x.w *= q->lambda;
            if (x.lo == x.hi && k < n_pts && q->pts[k].s == x.hi) x.w += q->pts[k++].c;
        } else {
            x = (q_ent_t){.hi = q->pts[k].s, .lo = q->pts[k].s, .w = q->pts[k].c};
            k++;
        }
        if (x.w > 0) t[nt++] = x;
    }
    /* Prune below rank KEEP*m of the known mass. NOTE (proof, docs/quantile.md §Pruning): the pruned
     * mass becomes an unknown item "< c" with c just above the first dropped entry, so nothing is
     * lost, only located less precisely; it can move tau only if tau falls below c, which needs the
     * known mass above c (>= KEEP*m now, >= lambda*KEEP*m next step) to fall under the next target
     * m' = lambda*m + (k/n)*T_new, i.e. a step bringing more than lambda*(KEEP-1)*W tokens with none
     * of them above c. Then tau is the certified lower bound and the reported uncertainty shows it. */
    double cum = 0, lim = Q_KEEP_FACTOR * m + Q_KEEP_SIGMA * sig;
    for (uint32_t a = 0; a < nt; a++) {
        if (cum >= lim) {
            double w = 0;
            for (uint32_t z = a; z < nt; z++) w += t[z].w;
            su[nsu++] = (q_unk_t){nextafterf(t[a].hi, INFINITY), w};
            nt = a;
            break;
        }
        cum += t[a].w;
    }
    if (nt > q->o.max_entries - q->o.max_entries / 4) {
        /* Finest buckets that bring the count to half the capacity: bisect the budget scale
         * alpha in (0, 1] on a copy (alpha = 1 is the coarsest the error bound allows). */
        uint32_t target = q->o.max_entries / 2;
        double lo_a = 0, hi_a = 1;
        memcpy(q->tmp2, t, sizeof(q_ent_t) * nt);
        if (qxstate_compact(q->tmp2, nt, m, 1.0) <= target) {
            for (int it = 0; it < 7; it++) { /* alpha to 1/128: plenty */
                double mid = 0.5 * (lo_a + hi_a);
                memcpy(q->tmp2, t, sizeof(q_ent_t) * nt);
                if (qxstate_compact(q->tmp2, nt, m, mid) <= target) hi_a = mid; else lo_a = mid;
            }
        }
        nt = qxstate_compact(t, nt, m, hi_a);
        q->compactions++;
    }
    if (nt > q->o.max_entries) { /* still too many: the lowest become unknown mass */
        double w = 0;
        for (uint32_t z = q->o.max_entries; z < nt; z++) w += t[z].w;
        su[nsu++] = (q_unk_t){nextafterf(t[q->o.max_entries].hi, INFINITY), w};
        nt = q->o.max_entries;
    }
    memcpy(D, t, sizeof(q_ent_t) * nt);
    q->cnt[lj] = nt;
    nsu = qxstate_unk_norm(su, nsu, m);
    memcpy(U, su, sizeof(q_unk_t) * nsu);
    q->ucnt[lj] = (uint8_t)nsu;

    /* Query on the known mass: tau = value at rank m, rho = value at rank RHO*m (descending). Unknown
     * mass is counted as lowest, so tau is exact or a lower bound of the true quantile. */
    *tau = NAN;
    *rho = NAN;
    q->unc[lj] = NAN;
    if (!(m > 0)) return;
    cum = 0;
    double mr = Q_RHO_FACTOR * m + Q_RHO_SIGMA * sig;
    for (uint32_t a = 0; a < nt; a++) {
        if (*tau != *tau && cum + D[a].w >= m) {
            /* NOTE: inside a bucket, interpolate by the missing mass (assumes it spread evenly);
             * lo would bias every bucketed tau low, i.e. every such expert slightly overloaded. */
            float v = D[a].lo;
            if (D[a].lo < D[a].hi) {
                double f = (m - cum) / D[a].w;
                v = (float)((double)D[a].hi - f * ((double)D[a].hi - (double)D[a].lo));
                if (v < D[a].lo) v = D[a].lo;
            }
            *tau = v;
        }
        cum += D[a].w;
        if (cum >= mr && q->lambda > 0) { *rho = D[a].lo; break; } /* lambda = 0: rank quota only */
    }
    if (*tau != *tau) { /* too little known: a lower bound */
        *tau = nt ? D[nt - 1].lo : -INFINITY;
        for (uint32_t a = 0; a < nsu; a++) if (U[a].c < *tau) *tau = nextafterf(U[a].c, -INFINITY);
    }
    if (*rho == *rho && *rho > *tau) *rho = *tau;
    /* Certified rank error of tau: the true W(>=tau) is at least lo_m (mass entirely >= tau), the
     * true W(>tau) at most up_m (mass possibly > tau, unknown items included), so tau misses the
     * target rank m by at most max(m - lo_m, up_m - m, 0). */
    double lo_m = 0, up_m = 0;
    for (uint32_t a = 0; a < nt && D[a].hi >= *tau; a++) {
        if (D[a].lo >= *tau) lo_m += D[a].w;
        if (D[a].hi > *tau) up_m += D[a].w;
    }
    for (uint32_t a = 0; a < nsu; a++)
        if (U[a].c > *tau) up_m += U[a].w;
    double unc = m - lo_m > up_m - m ? m - lo_m : up_m - m;
    if (unc < 0) unc = 0;
    q->unc[lj] = (float)(unc / m);
    if (m < q->o.min_target) { /* unset layer: no tau, but keep the report cut so traffic stays small */
        *tau = NAN;
        return;
    }
    q->n_set++;
    if (unc == 0) q->n_exact++;
    if (unc / m > q->max_rel_uncert) q->max_rel_uncert = unc / m;
}

st_status_t st_qxstate_end_step(st_qxstate_t *q, st_qtable_t *out) {
    if (!q) return ST_FAIL(ST_ERR_INVALID_ARG, "qxstate_end_step: NULL");
    uint32_t slot = (uint32_t)((q->version + 1) % q->o.history);
    float *tau_all = q->ring_tau + (size_t)slot * q->L * q->n, *rho_all = q->ring_rho + (size_t)slot * q->L * q->n;
    q->n_set = q->n_exact = 0;
    q->max_rel_uncert = 0;
    for (uint32_t l = 0; l < q->L; l++) {
        uint64_t T = 0;
        for (uint32_t s = 0; s < q->n_st; s++) {
            uint32_t off = q->sec[(size_t)s * q->L + l];
            q->cur[s] = off ? off + ST_QSUM_SECTION_BYTES : 0;
            if (off) T += st_q_get32(q->st[s].p + off + 4);
        }
        q->W[l] = q->lambda * q->W[l] + (double)T;
        double m = q->kn * q->W[l];
        for (uint32_t j = 0; j < q->n; j++) {
            size_t lj = (size_t)l * q->n + j;
            uint32_t np = 0, nsu = 0;
            for (uint32_t s = 0; s < q->n_st; s++) {
                if (!q->cur[s]) continue;
                const uint8_t *b = q->st[s].p;
                uint32_t off = q->sec[(size_t)s * q->L + l], end = off + st_q_get32(b + off + 12);
                uint32_t Ts = st_q_get32(b + off + 4), listed = 0;
                float c;
                if (q->cur[s] < end && (st_q_get16(b + q->cur[s]) & 0x7fffu) == j) {
                    const uint8_t *r = b + q->cur[s];
                    uint16_t m16 = st_q_get16(r + 2);
                    uint32_t p = 4;
                    if (st_q_get16(r) & ST_Q_REC_EXPLICIT) {
                        c = st_q_getf(r + 4);
                        uint32_t n_at = st_q_get32(r + 8);
                        if (n_at) q->pts[np++] = (q_pt_t){.s = c + 0.0f, .c = n_at};
                        listed = n_at;
                        p = 12;
                    } else {
                        c = q->ring_rho[((size_t)q->st[s].slot * q->L + l) * q->n + j];
                    }
                    for (uint32_t i = 0; i < m16; i++) q->pts[np++] = (q_pt_t){.s = st_q_getf(r + p + 4 * i) + 0.0f, .c = 1};
                    listed += m16;
                    q->cur[s] += p + 4u * m16;
                } else {
                    c = q->ring_rho[((size_t)q->st[s].slot * q->L + l) * q->n + j];
                }
                if (Ts > listed) q->su[nsu++] = (q_unk_t){c + 0.0f, (double)(Ts - listed)};
            }
            /* NOTE: sorting, then summing integer counts of equal scores (and of equal cuts in
             * qxstate_unk_norm), makes the result independent of arrival order, bit for bit. */
            qsort(q->pts, np, sizeof(q_pt_t), qxstate_cmp_pt);
            uint32_t u = 0;
            for (uint32_t i = 0; i < np; i++) {
                if (u && q->pts[u - 1].s == q->pts[i].s) q->pts[u - 1].c += q->pts[i].c;
                else q->pts[u++] = q->pts[i];
            }
            nsu = qxstate_unk_norm(q->su, nsu, 0); /* combine the step's own items exactly first */
            qxstate_fold(q, lj, u, nsu, m, sqrt(q->kn * (double)T + 1), &tau_all[lj], &rho_all[lj]);
        }
    }
    q->version++;
    q->ring_ver[slot] = q->version;
    q->n_st = 0;
    q->demand = 0;
    if (out) st_qxstate_table(q, out);
    return ST_OK;
}

void st_qxstate_table(const st_qxstate_t *q, st_qtable_t *out) {
    memset(out, 0, sizeof *out);
    out->n_layers = q->L;
    out->n_experts = q->n;
    if (!q->version) return;
    size_t slot = q->version % q->o.history;
    out->version = q->version;
    out->tau = q->ring_tau + slot * q->L * q->n;
    out->rho = q->ring_rho + slot * q->L * q->n;
}

float st_qxstate_uncertainty(const st_qxstate_t *q, uint32_t layer, uint32_t expert) {
    if (!q->version || layer >= q->L || expert >= q->n) return NAN;
    return q->unc[(size_t)layer * q->n + expert];
}

void st_qxstate_stats(const st_qxstate_t *q, st_qxstate_stats_t *out) {
    memset(out, 0, sizeof *out);
    out->version = q->version;
    out->n_set = q->n_set;
    out->n_exact = q->n_exact;
    out->max_rel_uncert = q->max_rel_uncert;
    out->compactions = q->compactions;
    size_t ln = (size_t)q->L * q->n;
    for (size_t i = 0; i < ln; i++) out->entries += q->cnt[i];
    out->state_bytes = sizeof *q + ln * (q->o.max_entries * sizeof(q_ent_t) + 8) + q->L * 8 +
                       ln * 8 * q->o.history + (size_t)q->o.max_summaries * (sizeof(q_staged_t) + 4 * q->L + 4) +
                       q->o.max_step_entries * sizeof(q_pt_t) + 2 * (q->o.max_entries + q->o.max_step_entries) * sizeof(q_ent_t);
}
