/* Coordinator side of the counting estimator (format 2): sums the workers' counts per
 * (layer, expert) as they arrive, and at the end of a step sets each threshold to the linearized
 * (1 - k/n) quantile of the decayed distribution (a damped Newton / stochastic-approximation step),
 * with the density from the probe band, a drift term, and safeguards for far-off thresholds.
 * Derivation and error/balance argument: docs/quantile.md "The math". */
#include <math.h>
#include <stdlib.h>

#include "qinternal.h"

#define QC_CLIP_RATE 2.0  /* one update moves tau by at most this many probe widths ... */
#define QC_CLIP_GROW 24   /* ... doubled along a streak of significant errors, up to 2^24 */
#define QC_SLOPE_STEP 4.0 /* the density estimate changes by at most this factor per probe */
#define QC_MIN_BAND 32.0  /* band tokens the density estimate keeps at least */
#define QC_BAND_TRUST 16.0 /* a probe with this many band tokens that disagrees 2x replaces the estimate */
#define QC_YOUNG 4        /* a layer is probed every step for its first updates */
#define QC_BRACKET_SD 5.0 /* a rate this many sd (and half of k/n) off k/n brackets the quantile ... */
#define QC_BRACKET_AGE 8  /* ... for this many updates */

struct st_qstate {
    uint32_t L, n, k, H;
    double p, lambda;
    st_qstate_opts_t o;
    /* per (l, j) */
    /* NOTE: thresholds, widths and densities here are in z = logit(score) (qc_z) */
    double *x;      /* [L*n] level of the threshold estimate */
    double *u;      /* [L*n] drift (z per step), trend term */
    double *sT, *sR; /* [L*n] decayed sums: tokens x their thresholds, excess counts (count - p N) */
    double *aT, *aR; /* [L*n] the same weighted by age in steps */
    double *f;      /* [L*n] density at tau: tokens' rate per unit of z (-dF/dz) */
    double *sB, *sM; /* [L*n] decayed probe-band count and band tokens x width */
    float *resid;   /* [L*n] smoothed (observed rate - k/n) / (k/n) */
    int8_t *clip;   /* [L*n] signed streak of updates with the rate significantly off k/n */
    double *lo, *hi; /* [L*n] recent thresholds seen with a rate above / below k/n (safeguard) */
    float *rlo, *rhi; /* [L*n] the rates seen there */
    uint8_t *alo, *ahi; /* [L*n] their age in updates (> QC_BRACKET_AGE: none) */
    uint8_t *cool;  /* [L*n] updates left without a drift term after the history was moved */
    /* per layer */
    double *W;      /* [L] decayed tokens counted */
    double *Wa, *Waa; /* [L] weighted by age, by age^2 */
    double *gam;    /* [L] gain of the last update; nlast: its tokens */
    double *nlast;
    uint64_t *upd;  /* [L] end_step index of the last update */
    uint8_t *set;   /* [L] */
    uint32_t *nupd; /* [L] updates since the layer's first tau */
    double *iT, *ir1, *ir2; /* [L] init pool: tokens, sum T*q1, sum T*q2 */
    double *ix1, *ix2;      /* [L*n] init pool: sum T*z(x1), sum T*z(x2) */
    /* published tables, a ring */
    uint64_t version, steps;
    uint64_t *ring_ver;
    float *ring_tau, *ring_rho; /* [H][L*n] */
    float *ring_tz, *ring_rz;   /* [H][L*n] z of the published (fp32) tau and rho, computed once */
    /* this step's counts */
    uint32_t *ac, *ab;      /* [L*n] */
    uint64_t *aN;           /* [L] tokens in count planes */
    uint32_t *nv;           /* [L] table versions seen in the layer this step */
    uint32_t *vslot;        /* [L*H] */
    double *vN, *vNB;       /* [L*H] tokens per version: count plane, band plane */
    uint8_t *touched;       /* [L] */
    /* merge scratch */
    uint32_t *scr;          /* [L*n*2] decoded planes of one summary */
    uint32_t *soff;         /* [L] section offsets of one summary */
    /* stats */
    uint64_t summaries, sections, layers_updated;
    double last_tokens;
};

void st_qstate_opts_default(st_qstate_opts_t *o) {
    *o = (st_qstate_opts_t){.history = 16, .probe_every = 4, .probe_rate = 0.5, .slope_decay = 0.7,
                            .trend_gain = 1.0, .lead = 2.0, .min_tokens = 0};
}

void st_qstate_destroy(st_qstate_t *q) {
    if (!q) return;
    free(q->x); free(q->u); free(q->f); free(q->sB); free(q->sM); free(q->resid); free(q->clip);
    free(q->sT); free(q->sR); free(q->aT); free(q->aR); free(q->Wa); free(q->Waa);
    free(q->cool); free(q->lo); free(q->hi); free(q->rlo); free(q->rhi); free(q->alo); free(q->ahi); free(q->nupd);
    free(q->W); free(q->gam); free(q->nlast); free(q->upd); free(q->set); free(q->iT); free(q->ir1); free(q->ir2);
    free(q->ix1); free(q->ix2); free(q->ring_ver); free(q->ring_tau); free(q->ring_rho); free(q->ring_tz); free(q->ring_rz); free(q->ac); free(q->ab);
    free(q->aN); free(q->nv); free(q->vslot); free(q->vN); free(q->vNB); free(q->touched); free(q->scr); free(q->soff);
    free(q);
}

st_status_t st_qstate_create(uint32_t n_layers, uint32_t n_experts, uint32_t k, double lambda, const st_qstate_opts_t *opts,
                             st_qstate_t **out) {
    st_qstate_opts_t o;
    if (opts) o = *opts; else st_qstate_opts_default(&o);
    if (!out || !n_layers || !n_experts || n_experts > ST_QSUM_MAX_EXPERTS || !k || k >= n_experts ||
        !(lambda >= 0 && lambda < 1) || o.history < 2 || o.history > 1024 || !o.probe_every ||
        !(o.probe_rate > 0 && o.probe_rate <= 1) || !(o.slope_decay >= 0 && o.slope_decay < 1) ||
        !(o.trend_gain >= 0 && o.trend_gain <= 4) || !(o.lead >= 0 && o.lead <= 64) || !(o.min_tokens >= 0))
        return ST_FAIL(ST_ERR_INVALID_ARG, "qstate: bad config layers=%u experts=%u k=%u lambda=%g", n_layers, n_experts, k,
                       lambda);
    st_qstate_t *q = calloc(1, sizeof *q);
    if (!q) return ST_FAIL(ST_ERR_NO_MEMORY, "qstate: out of memory");
    size_t ln = (size_t)n_layers * n_experts, L = n_layers, H = o.history;
    q->L = n_layers; q->n = n_experts; q->k = k; q->H = o.history; q->lambda = lambda; q->o = o;
    q->p = (double)k / n_experts;
    if (q->o.min_tokens == 0) q->o.min_tokens = 2.0 / q->p;
    q->x = calloc(ln, sizeof(double)); q->u = calloc(ln, sizeof(double)); q->f = calloc(ln, sizeof(double));
    q->sB = calloc(ln, sizeof(double)); q->sM = calloc(ln, sizeof(double)); q->resid = calloc(ln, sizeof(float));
    q->clip = calloc(ln, 1);
    q->lo = calloc(ln, sizeof(double)); q->hi = calloc(ln, sizeof(double));
    q->sT = calloc(ln, sizeof(double)); q->sR = calloc(ln, sizeof(double));
    q->aT = calloc(ln, sizeof(double)); q->aR = calloc(ln, sizeof(double));
    q->Wa = calloc(L, sizeof(double)); q->Waa = calloc(L, sizeof(double));
    q->rlo = calloc(ln, sizeof(float)); q->rhi = calloc(ln, sizeof(float));
    q->alo = calloc(ln, 1); q->ahi = calloc(ln, 1); q->cool = calloc(ln, 1); q->nupd = calloc(L, sizeof(uint32_t));
    q->W = calloc(L, sizeof(double)); q->gam = calloc(L, sizeof(double)); q->nlast = calloc(L, sizeof(double));
    q->upd = calloc(L, sizeof(uint64_t)); q->set = calloc(L, 1);
    q->iT = calloc(L, sizeof(double)); q->ir1 = calloc(L, sizeof(double)); q->ir2 = calloc(L, sizeof(double));
    q->ix1 = calloc(ln, sizeof(double)); q->ix2 = calloc(ln, sizeof(double));
    q->ring_ver = calloc(H, sizeof(uint64_t));
    q->ring_tau = malloc(sizeof(float) * ln * H); q->ring_rho = malloc(sizeof(float) * ln * H);
    q->ring_tz = malloc(sizeof(float) * ln * H); q->ring_rz = malloc(sizeof(float) * ln * H);
    q->ac = calloc(ln, sizeof(uint32_t)); q->ab = calloc(ln, sizeof(uint32_t));
    q->aN = calloc(L, sizeof(uint64_t)); q->nv = calloc(L, sizeof(uint32_t));
    q->vslot = calloc(L * H, sizeof(uint32_t)); q->vN = calloc(L * H, sizeof(double)); q->vNB = calloc(L * H, sizeof(double));
    q->touched = calloc(L, 1);
    q->scr = malloc(sizeof(uint32_t) * ln * 2); q->soff = malloc(sizeof(uint32_t) * L);
    if (!q->x || !q->u || !q->f || !q->sB || !q->sM || !q->resid || !q->clip || !q->lo || !q->hi || !q->rlo ||
        !q->sT || !q->sR || !q->aT || !q->aR || !q->Wa || !q->Waa || !q->cool ||
        !q->rhi || !q->alo || !q->ahi || !q->nupd || !q->W || !q->gam || !q->nlast || !q->upd ||
        !q->set || !q->iT || !q->ir1 || !q->ir2 || !q->ix1 || !q->ix2 || !q->ring_ver || !q->ring_tau || !q->ring_rho || !q->ring_tz || !q->ring_rz ||
        !q->ac || !q->ab || !q->aN || !q->nv || !q->vslot || !q->vN || !q->vNB || !q->touched || !q->scr || !q->soff) {
        st_qstate_destroy(q);
        return ST_FAIL(ST_ERR_NO_MEMORY, "qstate: out of memory for %u x %u", n_layers, n_experts);
    }
    /* NOTE: touch the table ring now: its pages would otherwise fault in over the first
     * `history` steps, on the step's clock */
    memset(q->ring_tau, 0, sizeof(float) * ln * H); memset(q->ring_rho, 0, sizeof(float) * ln * H);
    memset(q->ring_tz, 0, sizeof(float) * ln * H); memset(q->ring_rz, 0, sizeof(float) * ln * H);
    *out = q;
    return ST_OK;
}

/* NOTE: the estimator works on z = logit(s), not on the score s: router scores are sigmoid
 * outputs, and near saturation (s within 1e-5 of 1) their distribution in s spans a few float
 * steps while in z it stays smooth, which is what the linear (Newton) model needs. Outside (0, 1)
 * z continues linearly, so any finite score maps monotonically (and back). Counts do not change:
 * s >= tau iff z(s) >= z(tau). */
#define QC_Z_HI 17.0   /* z(1): above logit(1 - 2^-24) = 16.6 */
#define QC_Z_LO -104.0 /* z(0): below logit(smallest float) = -103.3 */
static float qc_z(float s) {
    if (s >= 1.0f) return (float)QC_Z_HI + (s - 1.0f);
    if (s <= 0.0f) return (float)QC_Z_LO + s;
    return logf(s) - log1pf(-s);
}
static double qc_s(double z) {
    if (z >= QC_Z_HI) return 1.0 + (z - QC_Z_HI);
    if (z <= QC_Z_LO) return z - QC_Z_LO;
    return 1.0 / (1.0 + (double)expf((float)-z));
}

static uint32_t qc_slot_of(const st_qstate_t *q, uint64_t ver) {
    /* NOTE: history-1, not history: end_step writes the slot of version+1 while this step's counts
     * still refer to the tables they were built on, so the oldest slot must not be in use. */
    if (!ver || ver > q->version || q->version - ver >= q->H - 1) return UINT32_MAX;
    uint32_t s = (uint32_t)(ver % q->H);
    return q->ring_ver[s] == ver ? s : UINT32_MAX;
}

static const float *qc_tau(const st_qstate_t *q, uint32_t slot) { return q->ring_tau + (size_t)slot * q->L * q->n; }
static const float *qc_rho(const st_qstate_t *q, uint32_t slot) { return q->ring_rho + (size_t)slot * q->L * q->n; }
static const float *qc_tz(const st_qstate_t *q, uint32_t slot) { return q->ring_tz + (size_t)slot * q->L * q->n; }
static const float *qc_rz(const st_qstate_t *q, uint32_t slot) { return q->ring_rz + (size_t)slot * q->L * q->n; }

/* Decode one plane at b[*off, end) into v[0..n); *vmax = its largest value. 0, or -1 (malformed). */
static int qc_unpack(const uint8_t *b, size_t *off, size_t end, uint32_t n, uint32_t *v, uint32_t *vmax) {
    if (end - *off < ST_QC_PLANE_HDR) return -1;
    const uint8_t *p = b + *off;
    uint32_t base = st_q_get32(p), w = p[4], ne = st_q_get16(p + 6);
    if (w > 32 || p[5] != 0 || ne > n) return -1;
    size_t nb = ((size_t)n * w + 7) / 8;
    if (end - *off - ST_QC_PLANE_HDR < nb + (size_t)ST_QC_EXC_BYTES * ne) return -1;
    const uint8_t *d = p + ST_QC_PLANE_HDR;
    const uint64_t mask = w == 32 ? 0xffffffffull : ((1ull << w) - 1);
    if ((uint64_t)base + mask > UINT32_MAX) return -1;
    uint32_t j = 0, mx = 0;
    if (w <= 8) {
        /* narrow planes (decode counts: 3-5 bits): 8 values are exactly w bytes, one load */
        for (; (j + 8) <= n && (size_t)(j / 8) * w + 8 <= nb; j += 8) {
            uint64_t x;
            memcpy(&x, d + (size_t)(j / 8) * w, 8); /* NOTE: little-endian hosts only (as the rest of Strata) */
            for (uint32_t i = 0; i < 8; i++) {
                uint32_t y = base + (uint32_t)((x >> (i * w)) & mask);
                v[j + i] = y;
                mx = y > mx ? y : mx;
            }
        }
    }
    /* values whose 8-byte window lies inside the packed bytes: one unaligned load each */
    uint32_t fast = nb >= 8 ? (uint32_t)(w ? ((nb - 8) * 8) / w : n) : 0;
    if (fast > n) fast = n;
    for (size_t bit = (size_t)j * w; j < fast; j++, bit += w) {
        uint64_t win;
        memcpy(&win, d + (bit >> 3), 8); /* NOTE: little-endian hosts only (as the rest of Strata) */
        uint32_t x = base + (uint32_t)((win >> (bit & 7)) & mask);
        v[j] = x;
        mx = x > mx ? x : mx;
    }
    for (size_t bit = (size_t)j * w; j < n; j++, bit += w) {
        uint64_t win = 0;
        for (size_t by = bit >> 3, i = 0; by + i < nb && i < 8; i++) win |= (uint64_t)d[by + i] << (8 * i);
        uint32_t x = base + (uint32_t)((win >> (bit & 7)) & mask);
        v[j] = x;
        mx = x > mx ? x : mx;
    }
    const uint8_t *ex = d + nb;
    int32_t prev = -1;
    for (uint32_t i = 0; i < ne; i++, ex += ST_QC_EXC_BYTES) {
        uint32_t e = st_q_get16(ex);
        if ((int32_t)e <= prev || e >= n || v[e] != base) return -1; /* ascending; its packed slot is 0 */
        prev = (int32_t)e;
        v[e] = st_q_get32(ex + 2);
        mx = v[e] > mx ? v[e] : mx;
    }
    *off += ST_QC_PLANE_HDR + nb + (size_t)ST_QC_EXC_BYTES * ne;
    *vmax = mx;
    return 0;
}

#define BAD(...) return ST_REJECT(ST_ERR_PROTOCOL, "qstate_merge: " __VA_ARGS__)

st_status_t st_qstate_merge(st_qstate_t *q, const void *bytes, size_t len) {
    const uint8_t *b = bytes;
    if (!q || !b) return ST_FAIL(ST_ERR_INVALID_ARG, "qstate_merge: NULL argument");
    st_status_t hs = st_q_check_header(b, len, ST_QSUM_FORMAT, q->L, q->n, q->k, "qstate_merge");
    if (hs != ST_OK) return hs;
    uint64_t ver = st_q_get64(b + ST_QH_TAU_VERSION);
    uint32_t slot = UINT32_MAX;
    if (ver) {
        slot = qc_slot_of(q, ver);
        if (slot == UINT32_MAX && ver > q->version)
            BAD("built on table version %llu, newer than the newest published (%llu)", (unsigned long long)ver,
                (unsigned long long)q->version);
        if (slot == UINT32_MAX) /* well-formed but stale: the sender is behind, not wrong */
            return ST_REJECT(ST_ERR_OUT_OF_RANGE, "qstate_merge: built on table version %llu, not among the last %u published (newest %llu)",
                             (unsigned long long)ver, q->H - 1, (unsigned long long)q->version);
    }
    uint32_t n_sec = st_q_get32(b + ST_QH_SECTIONS);
    if (n_sec > q->L) BAD("%u sections > %u layers", n_sec, q->L);
    const uint32_t n = q->n;
    const float *tau_t = slot != UINT32_MAX ? qc_tau(q, slot) : NULL, *rho_t = slot != UINT32_MAX ? qc_rho(q, slot) : NULL;
    for (uint32_t l = 0; l < q->L; l++) q->soff[l] = 0;
    /* pass 1: validate everything and decode the planes into scratch */
    size_t off = ST_QSUM_HEADER_BYTES;
    for (uint32_t s = 0; s < n_sec; s++) {
        if (len - off < ST_QSUM_SECTION_BYTES) BAD("section %u truncated", s);
        uint32_t layer = st_q_get32(b + off), T = st_q_get32(b + off + 4), sbytes = st_q_get32(b + off + 12);
        uint16_t kind = st_q_get16(b + off + 8), flags = st_q_get16(b + off + 10);
        if (layer >= q->L) BAD("section %u: layer %u >= %u", s, layer, q->L);
        if (q->soff[layer]) BAD("section %u: layer %u repeated", s, layer);
        if (T == 0) BAD("layer %u: zero tokens", layer);
        if (sbytes < ST_QSUM_SECTION_BYTES || sbytes > len - off) BAD("layer %u: section size %u out of bounds", layer, sbytes);
        if ((uint64_t)q->aN[layer] + T > UINT32_MAX || q->iT[layer] + T > 4e9) BAD("layer %u: too many tokens this step", layer);
        size_t p = off + ST_QSUM_SECTION_BYTES, end = off + sbytes;
        if (kind == ST_QC_KIND_INIT) {
            if (flags) BAD("layer %u: init section with flags 0x%x", layer, flags);
            if (end - p != ST_QC_INIT_HDR + 8ull * n) BAD("layer %u: init section of %u bytes", layer, sbytes);
            uint32_t r1 = st_q_get32(b + p), r2 = st_q_get32(b + p + 4);
            if (r1 < 1 || r1 > r2 || r2 > T) BAD("layer %u: init ranks %u, %u of %u tokens", layer, r1, r2, T);
            for (uint32_t j = 0; j < n; j++) {
                float x1 = st_q_getf(b + p + 8 + 8ull * j), x2 = st_q_getf(b + p + 12 + 8ull * j);
                if (!isfinite(x1) || !isfinite(x2) || x1 < x2 || (r1 == r2 && x1 != x2))
                    BAD("layer %u expert %u: init scores %g, %g", layer, j, (double)x1, (double)x2);
            }
        } else if (kind == ST_QC_KIND_COUNT) {
            if (flags & ~ST_QC_FLAG_BAND) BAD("layer %u: unknown flags 0x%x", layer, flags);
            if (!tau_t || !st_qtau_is_set(tau_t[(size_t)layer * n])) BAD("layer %u: counts without a threshold", layer);
            int band = (flags & ST_QC_FLAG_BAND) != 0;
            if (band && !st_qtau_is_set(rho_t[(size_t)layer * n])) BAD("layer %u: band counts without a probe", layer);
            uint32_t *vc = q->scr + (size_t)layer * n * 2, *vb = vc + n, mc = 0, mb = 0;
            if (qc_unpack(b, &p, end, n, vc, &mc)) BAD("layer %u: malformed count plane", layer);
            if (band && qc_unpack(b, &p, end, n, vb, &mb)) BAD("layer %u: malformed band plane", layer);
            if (p != end) BAD("layer %u: %zu stray bytes in section", layer, end - p);
            if (mc > T) BAD("layer %u: a count of %u > %u tokens", layer, mc, T);
            const float *tl = tau_t + (size_t)layer * n, *rl = rho_t + (size_t)layer * n;
            for (uint32_t j = 0; band && j < n; j++)
                if (vb[j] > (rl[j] < tl[j] ? T - vc[j] : vc[j]))
                    BAD("layer %u expert %u: band count %u out of range", layer, j, vb[j]);
        } else {
            BAD("layer %u: unknown section kind %u", layer, kind);
        }
        q->soff[layer] = (uint32_t)off;
        off = end;
    }
    if (off != len) BAD("%zu stray bytes after %u sections", len - off, n_sec);
    /* pass 2: add */
    for (uint32_t layer = 0; layer < q->L; layer++) {
        if (!q->soff[layer]) continue;
        const uint8_t *sec = b + q->soff[layer];
        uint32_t T = st_q_get32(sec + 4);
        uint16_t kind = st_q_get16(sec + 8);
        int band = (st_q_get16(sec + 10) & ST_QC_FLAG_BAND) != 0;
        q->sections++;
        if (kind == ST_QC_KIND_INIT) {
            if (q->set[layer]) continue; /* built on an older table: the layer has its tau now */
            const uint8_t *p = sec + ST_QSUM_SECTION_BYTES;
            uint32_t r1 = st_q_get32(p), r2 = st_q_get32(p + 4);
            /* an order statistic of rank r among T sits at rate ~ r/(T+1) */
            q->iT[layer] += T;
            q->ir1[layer] += (double)T * r1 / (T + 1.0);
            q->ir2[layer] += (double)T * r2 / (T + 1.0);
            double *x1 = q->ix1 + (size_t)layer * n, *x2 = q->ix2 + (size_t)layer * n;
            for (uint32_t j = 0; j < n; j++) {
                x1[j] += (double)T * qc_z(st_q_getf(p + 8 + 8ull * j));
                x2[j] += (double)T * qc_z(st_q_getf(p + 12 + 8ull * j));
            }
            continue;
        }
        const uint32_t *restrict vc = q->scr + (size_t)layer * n * 2, *restrict vb = vc + n;
        uint32_t *restrict ac = q->ac + (size_t)layer * n, *restrict ab = q->ab + (size_t)layer * n;
        const uint32_t n8 = n & ~7u; /* NOTE: fixed inner count so that -O2 vectorizes (SLP) */
        for (uint32_t j = 0; j < n8; j += 8)
            for (uint32_t i = 0; i < 8; i++) ac[j + i] += vc[j + i];
        for (uint32_t j = n8; j < n; j++) ac[j] += vc[j];
        if (band) {
            for (uint32_t j = 0; j < n8; j += 8)
                for (uint32_t i = 0; i < 8; i++) ab[j + i] += vb[j + i];
            for (uint32_t j = n8; j < n; j++) ab[j] += vb[j];
        }
        q->aN[layer] += T;
        q->touched[layer] = 1;
        uint32_t *vs = q->vslot + (size_t)layer * q->H, i = 0;
        while (i < q->nv[layer] && vs[i] != slot) i++;
        if (i == q->nv[layer]) {
            vs[i] = slot;
            q->vN[(size_t)layer * q->H + i] = q->vNB[(size_t)layer * q->H + i] = 0;
            q->nv[layer]++;
        }
        q->vN[(size_t)layer * q->H + i] += T;
        if (band) q->vNB[(size_t)layer * q->H + i] += T;
    }
    q->summaries++;
    return ST_OK;
}
#undef BAD

/* ---------------- end of step ---------------- */

static int qc_probed(const st_qstate_t *q, uint32_t l, uint64_t ver) {
    return q->o.probe_every == 1 || q->nupd[l] < QC_YOUNG || (l + ver) % q->o.probe_every == 0;
}

/* A layer's first tau from the pooled order statistics: x1 at rate q1, x2 at rate q2 > q1. */
static void qc_init_layer(st_qstate_t *q, uint32_t l) {
    const uint32_t n = q->n;
    double T = q->iT[l], q1 = q->ir1[l] / T, q2 = q->ir2[l] / T, beta = q->o.probe_rate, p = q->p;
    for (uint32_t j = 0; j < n; j++) {
        size_t i = (size_t)l * n + j;
        double x1 = q->ix1[i] / T, x2 = q->ix2[i] / T, gap = x1 - x2;
        double f = gap > 0 && q2 > q1 ? (q2 - q1) / gap : 0;
        double tau = x1;
        if (f > 0) {
            double d = (q1 - p) / f; /* move from rate q1 to rate k/n along the secant, at most 2 gaps */
            tau = x1 + fmax(-2 * gap, fmin(2 * gap, d));
        } else {
            /* no spread seen (one token per worker, or ties): a guess the probes correct */
            double scale = fmax(fabs(x1) * 0.05, 0.1); /* in z units */
            f = beta * p / scale;
        }
        q->x[i] = tau;
        q->u[i] = 0;
        q->sT[i] = q->sR[i] = q->aT[i] = q->aR[i] = 0;
        q->cool[i] = 0;
        q->f[i] = f;
        q->sB[i] = 1.0; /* a prior worth one band token */
        q->sM[i] = 1.0 / f;
        q->resid[i] = 0;
        q->clip[i] = 0;
        q->alo[i] = q->ahi[i] = QC_BRACKET_AGE + 1;
        q->ix1[i] = q->ix2[i] = 0;
    }
    q->iT[l] = q->ir1[l] = q->ir2[l] = 0;
    q->W[l] = q->Wa[l] = q->Waa[l] = 0;
    q->nupd[l] = 0;
    q->upd[l] = q->steps;
    q->set[l] = 1;
}

/* How far off k/n a step's rate must be to count as evidence (brackets, streaks): far beyond its
 * sampling noise and by half the target, so that noise never makes it (a saturated or tied score
 * distribution, or a tau outside the scores, does). */
static double qc_far(double p, double N) { return fmax(QC_BRACKET_SD * sqrt(p * (1 - p) / N), 0.5 * p); }

/* One update of layer l from this step's counts (docs/quantile.md "The math"): the decayed,
 * linearized quantile and its drift, from sufficient statistics re-read with the newest density;
 * then the trust region and the safeguards. */
static void qc_update_layer(st_qstate_t *q, uint32_t l, const float *tz_now) {
    const uint32_t n = q->n, H = q->H, nv = q->nv[l];
    const double p = q->p, beta = q->o.probe_rate;
    /* NOTE: the versions in version order, not arrival order, so the fp sums below (and so the
     * tables) do not depend on the order the summaries were merged in */
    uint32_t *vs = q->vslot + (size_t)l * H;
    double *vn = q->vN + (size_t)l * H, *vnb = q->vNB + (size_t)l * H;
    for (uint32_t a = 1; a < nv; a++)
        for (uint32_t z = a; z > 0 && q->ring_ver[vs[z - 1]] > q->ring_ver[vs[z]]; z--) {
            uint32_t ts = vs[z]; vs[z] = vs[z - 1]; vs[z - 1] = ts;
            double tn = vn[z]; vn[z] = vn[z - 1]; vn[z - 1] = tn;
            tn = vnb[z]; vnb[z] = vnb[z - 1]; vnb[z - 1] = tn;
        }
    double N = (double)q->aN[l], NB = 0;
    for (uint32_t v = 0; v < nv; v++) NB += vnb[v];
    uint64_t dt64 = q->steps - q->upd[l];
    double dt = dt64 < 1 ? 1.0 : (double)dt64;
    double decay = pow(q->lambda, dt);
    /* per-layer weights: W = sum of decayed tokens, Wa / Waa: weighted by age (in steps) / age^2 */
    double W0 = q->W[l], Wa0 = q->Wa[l];
    q->Waa[l] = decay * (q->Waa[l] + 2 * dt * Wa0 + dt * dt * W0);
    q->Wa[l] = decay * (Wa0 + dt * W0);
    q->W[l] = decay * W0 + N;
    const double W = q->W[l], Wa = q->Wa[l], Waa = q->Waa[l];
    const double g = N / W;
    q->gam[l] = g;
    q->nlast[l] = N;
    q->nupd[l]++;
    q->upd[l] = q->steps;
    const double abar = Wa / W, var = Waa / W - abar * abar;
    /* the drift only from a spread of ages (not the first updates) and with memory (lambda > 0) */
    const int drift = q->lambda > 0 && q->o.trend_gain > 0 && var > 0.25;
    const double fd = q->o.slope_decay, noise = 4.0 * sqrt(p * (1 - p) / N);
    for (uint32_t j = 0; j < n; j++) {
        size_t i = (size_t)l * n + j;
        double f = q->f[i];
        const double rr = (double)q->ac[i] / N, far = qc_far(p, N);
        /* band: density update from the tokens between rho and tau, only near the target: far
         * from it (tau in a gap between tied scores, or outside them) the band says nothing
         * about the density at the quantile */
        if (NB > 0 && fabs(rr - p) <= far) {
            double M = 0;
            for (uint32_t v = 0; v < nv; v++)
                if (vnb[v] > 0) M += vnb[v] * fabs((double)qc_tz(q, vs[v])[i] - (double)qc_rz(q, vs[v])[i]);
            if (M > 0) {
                double B = q->ab[i], fb = B / M;
                if (B >= QC_BAND_TRUST && (fb > 2 * f || fb < 0.5 * f)) {
                    /* a well-populated band that disagrees 2x: the estimate was wrong (a
                     * saturated or shifted distribution), start over from this probe */
                    q->sB[i] = B;
                    q->sM[i] = M;
                    f = fb;
                } else {
                    /* decay only once the pool holds QC_MIN_BAND tokens: at small T a few probes
                     * see a handful of band tokens, too few for a density */
                    double d = fd * q->sB[i] + B >= QC_MIN_BAND ? fd : 1.0;
                    q->sB[i] = d * q->sB[i] + B;
                    q->sM[i] = d * q->sM[i] + M;
                    double fn = fmax(q->sB[i], 0.5) / q->sM[i];
                    f = fmin(f * QC_SLOPE_STEP, fmax(f / QC_SLOPE_STEP, fn));
                }
                q->f[i] = f;
            }
        }
        /* this step: tokens x the thresholds they were counted at, and the excess count */
        double tN = 0;
        for (uint32_t v = 0; v < nv; v++) tN += vn[v] * (double)qc_tz(q, vs[v])[i];
        const double tb = tN / N, ex = (double)q->ac[i] - p * N;
        /* decayed sums; a step's Newton target is y = tau_a + (count_a - p N_a) / (f N_a), so
         * sum w y = sT + sR / f, re-read with the newest f */
        q->aT[i] = decay * (q->aT[i] + dt * q->sT[i]);
        q->aR[i] = decay * (q->aR[i] + dt * q->sR[i]);
        q->sT[i] = decay * q->sT[i] + tN;
        q->sR[i] = decay * q->sR[i] + ex;
        /* bracket evidence: the raw rate at the (token-weighted) thresholds the workers used */
        int c = q->clip[i], sig = rr > p + far ? 1 : rr < p - far ? -1 : 0;
        {
            int streak = c >= 2 || c <= -2; /* brackets hold while a streak runs */
            if (q->alo[i] <= QC_BRACKET_AGE && !streak) q->alo[i]++;
            if (q->ahi[i] <= QC_BRACKET_AGE && !streak) q->ahi[i]++;
            if (sig > 0) {
                q->lo[i] = tb; q->rlo[i] = (float)rr; q->alo[i] = 0;
                if (q->ahi[i] <= QC_BRACKET_AGE && q->hi[i] <= tb) q->ahi[i] = QC_BRACKET_AGE + 1;
            } else if (sig < 0) {
                q->hi[i] = tb; q->rhi[i] = (float)rr; q->ahi[i] = 0;
                if (q->alo[i] <= QC_BRACKET_AGE && q->lo[i] >= tb) q->alo[i] = QC_BRACKET_AGE + 1;
            }
        }
        /* streak: consecutive steps whose rate is far off k/n in the same direction */
        c = sig == 0 ? 0 : sig > 0 ? (c > 0 ? c + 1 : 1) : (c < 0 ? c - 1 : -1);
        c = c > QC_CLIP_GROW ? QC_CLIP_GROW : c < -QC_CLIP_GROW ? -QC_CLIP_GROW : c;
        q->clip[i] = (int8_t)c;
        const int ac = c < 0 ? -c : c;
        q->resid[i] = (float)((1 - g) * q->resid[i] + g * (rr - p) / p);
        /* level and drift: weighted regression of the targets on their age */
        double Y = q->sT[i] + q->sR[i] / f, YA = q->aT[i] + q->aR[i] / f, ybar = Y / W, u = 0;
        if (drift && !q->cool[i]) u = -q->o.trend_gain * (YA / W - ybar * abar) / var;
        if (q->cool[i]) q->cool[i]--;
        double xn = ybar + u * abar; /* the level now (age 0) */
        const double cur = (double)tz_now[i], sd3 = 3.0 * sqrt(p * (1 - p) / N);
        int anchor = 0;
        if ((rr > p + sd3 && xn < cur) || (rr < p - sd3 && xn > cur)) {
            /* this step's own data say the opposite of where the history points: the history was
             * read through a linear model far outside its range (a saturated score, a density
             * that moved); drop it and take this step's damped Newton step from tau */
            double rc = fmin(1.0, fmax(0.0, rr - f * (cur - tb)));
            xn = cur + g * (rc - p) / f;
            u = 0;
            anchor = 1;
        }
        /* trust region around the published tau, in rate: QC_CLIP_RATE probe bands, doubled along
         * a streak; never below 4 sd of the step's sampling noise (a clip inside the noise would
         * bias tau); and a floor along a streak (a density far too high, at a saturated or tied
         * score, would crawl): from half a probe width, doubling */
        double lim = fmax(QC_CLIP_RATE * beta * p * ldexp(1.0, ac), noise) / f, want = xn;
        want = fmin(cur + lim, fmax(cur - lim, want));
        if (ac >= 2) {
            double fl = 0.5 * beta * p / f * ldexp(1.0, ac - 2);
            if (c > 0 && want < cur + fl) want = cur + fl;
            if (c < 0 && want > cur - fl) want = cur - fl;
        }
        /* safeguard (Newton with bisection): never step past a threshold recently seen far on the
         * other side of the target; along a streak cover at least a quarter of the way to it */
        int has_lo = q->alo[i] <= QC_BRACKET_AGE, has_hi = q->ahi[i] <= QC_BRACKET_AGE, guard = 0;
        if (has_lo && want <= q->lo[i]) {
            guard = 1;
            want = cur > q->lo[i] ? 0.5 * (cur + q->lo[i]) : q->lo[i] + beta * p / f;
        } else if (has_hi && want >= q->hi[i]) {
            guard = 1;
            want = cur < q->hi[i] ? 0.5 * (cur + q->hi[i]) : q->hi[i] - beta * p / f;
        } else if (ac >= 2 && has_lo && has_hi && q->hi[i] > q->lo[i]) {
            if (c < 0 && cur > q->lo[i] && want > cur - 0.25 * (cur - q->lo[i])) { want = cur - 0.25 * (cur - q->lo[i]); guard = 1; }
            if (c > 0 && cur < q->hi[i] && want < cur + 0.25 * (q->hi[i] - cur)) { want = cur + 0.25 * (q->hi[i] - cur); guard = 1; }
        }
        if (guard && has_lo && has_hi && q->hi[i] > q->lo[i] && q->alo[i] <= 2 && q->ahi[i] <= 2) {
            /* a recent bracket the Newton step overshot: the density was too low */
            f = fmax(f, ((double)q->rlo[i] - q->rhi[i]) / (q->hi[i] - q->lo[i]));
            q->f[i] = f;
            Y = q->sT[i] + q->sR[i] / f;
            YA = q->aT[i] + q->aR[i] / f;
        }
        if (anchor || want != xn || guard || ac >= 2) {
            /* the moved history would read as drift while the data catch up: none for the
             * decay horizon */
            double h = q->lambda > 0 ? 1.0 / (1.0 - q->lambda) : 0;
            q->cool[i] = (uint8_t)fmin(64.0, ceil(h));
        }
        if (anchor) {
            /* the whole history collapses onto the new level, without drift */
            q->sT[i] = want * W;
            q->sR[i] = 0;
            q->aT[i] = want * Wa;
            q->aR[i] = 0;
            u = 0;
            xn = want;
        } else if (want != xn || guard || ac >= 2) {
            /* move the history with tau (every target by the same amount, so the level lands on
             * `want`); a clipped, guarded or streaking step also forgets the drift */
            double shift = want - ybar;
            q->sR[i] += f * shift * W;
            q->aR[i] = f * (ybar + shift) * Wa - q->aT[i]; /* age-weighted targets at the new mean: no drift */
            u = 0;
            xn = want;
        }
        q->x[i] = xn;
        q->u[i] = u;
    }
}

st_status_t st_qstate_end_step(st_qstate_t *q, st_qtable_t *out) {
    if (!q) return ST_FAIL(ST_ERR_INVALID_ARG, "qstate_end_step: NULL");
    const uint32_t n = q->n, L = q->L;
    q->steps++;
    const float *tz_now = q->version ? qc_tz(q, (uint32_t)(q->version % q->H)) : NULL;
    double tokens = 0;
    for (uint32_t l = 0; l < L; l++) {
        if (!q->set[l] && q->iT[l] >= q->o.min_tokens) qc_init_layer(q, l);
        if (q->set[l] && q->aN[l] && tz_now) {
            qc_update_layer(q, l, tz_now);
            q->layers_updated++;
            tokens += (double)q->aN[l];
        }
    }
    q->last_tokens = tokens;
    /* publish version+1 */
    uint64_t v = q->version + 1;
    uint32_t s = (uint32_t)(v % q->H);
    float *tau = q->ring_tau + (size_t)s * L * n, *rho = q->ring_rho + (size_t)s * L * n;
    float *tz = q->ring_tz + (size_t)s * L * n, *rz = q->ring_rz + (size_t)s * L * n;
    for (uint32_t l = 0; l < L; l++) {
        size_t o = (size_t)l * n;
        if (!q->set[l]) {
            for (uint32_t j = 0; j < n; j++) tau[o + j] = rho[o + j] = tz[o + j] = rz[o + j] = NAN;
            continue;
        }
        int probe = qc_probed(q, l, v);
        double dir = ((v + l) / q->o.probe_every) % 2 ? 1.0 : -1.0; /* alternate below / above tau */
        for (uint32_t j = 0; j < n; j++) {
            size_t i = o + j;
            /* NOTE: the published tau leads the level by `lead` steps of drift: the step that routes
             * with it comes that much after the counts of the update */
            float t = (float)qc_s(q->x[i] + q->u[i] * q->o.lead);
            tau[i] = t;
            tz[i] = qc_z(t); /* NOTE: z of the fp32 value workers compare with, not of the level */
            if (!probe) { rho[i] = rz[i] = NAN; continue; }
            float r = (float)qc_s((double)tz[i] + dir * q->o.probe_rate * q->p / q->f[i]);
            if (r == t) r = nextafterf(t, dir > 0 ? INFINITY : -INFINITY);
            rho[i] = r;
            rz[i] = qc_z(r);
        }
    }
    q->ring_ver[s] = v;
    q->version = v;
    /* clear the step's counts */
    for (uint32_t l = 0; l < L; l++) {
        if (q->touched[l]) {
            memset(q->ac + (size_t)l * n, 0, sizeof(uint32_t) * n);
            memset(q->ab + (size_t)l * n, 0, sizeof(uint32_t) * n);
        }
        q->touched[l] = 0;
        q->aN[l] = 0;
        q->nv[l] = 0;
    }
    if (out) st_qstate_table(q, out);
    return ST_OK;
}

st_status_t st_qstate_step_counts(const st_qstate_t *q, uint32_t layer, uint32_t *cnt, uint32_t *band, uint64_t *tokens) {
    if (!q || layer >= q->L || !cnt || !band || !tokens) return ST_FAIL(ST_ERR_INVALID_ARG, "qstate_step_counts: bad argument");
    memcpy(cnt, q->ac + (size_t)layer * q->n, sizeof(uint32_t) * q->n);
    memcpy(band, q->ab + (size_t)layer * q->n, sizeof(uint32_t) * q->n);
    *tokens = q->aN[layer];
    return ST_OK;
}

void st_qstate_table(const st_qstate_t *q, st_qtable_t *out) {
    if (!q || !out) return;
    *out = (st_qtable_t){.version = q->version, .n_layers = q->L, .n_experts = q->n};
    if (q->version) {
        uint32_t s = (uint32_t)(q->version % q->H);
        out->tau = qc_tau(q, s);
        out->rho = qc_rho(q, s);
    }
}

void st_qstate_stats(const st_qstate_t *q, st_qstate_stats_t *out) {
    if (!q || !out) return;
    *out = (st_qstate_stats_t){.version = q->version, .summaries = q->summaries, .sections = q->sections,
                               .layers_updated = q->layers_updated, .last_tokens = q->last_tokens};
    for (uint32_t l = 0; l < q->L; l++) {
        if (!q->set[l]) continue;
        out->n_set += q->n;
        for (uint32_t j = 0; j < q->n; j++) {
            double r = fabs(q->resid[(size_t)l * q->n + j]);
            if (r > out->max_rel_uncert) out->max_rel_uncert = r;
        }
    }
    size_t ln = (size_t)q->L * q->n, L = q->L;
    /* per cell: 13 doubles, 3 floats, 4 bytes; 2 uint32 counts + 2 scratch; the table ring */
    out->state_bytes = sizeof *q + ln * (13 * sizeof(double) + 3 * sizeof(float) + 4 + 4 * sizeof(uint32_t)) +
                       L * (9 * sizeof(double) + 3 * sizeof(uint64_t) + (size_t)q->H * (2 * sizeof(double) + 4) + 16) +
                       ln * q->H * 4 * sizeof(float); /* tau, rho and their z */
}

float st_qstate_uncertainty(const st_qstate_t *q, uint32_t layer, uint32_t expert) {
    if (!q || layer >= q->L || expert >= q->n || !q->set[layer]) return NAN;
    double g = q->gam[layer], N = q->nlast[layer];
    if (!(N > 0)) return INFINITY;
    /* an exponential average with gain g of rates with variance p(1-p)/N */
    return (float)sqrt(g / (2.0 - g) * (1.0 - q->p) / (q->p * N));
}
