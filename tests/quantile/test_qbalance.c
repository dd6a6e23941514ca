/* Balance of quantile routing with the counting estimator at K3 shapes (SPEC §7 goal: every
 * expert gets (k/n)N +- 10% with thresholds settled), checked against the exact estimator on the
 * same load, with top-k beside them. The router's hot experts drift during the run; workers route
 * with thresholds LAG end_steps old. Full K3 has 92 MoE layers: the load here is K3's per-layer
 * shape (896 experts, k 16, k_max 32; 64 workers x 256 decode tokens, 8 x 4096 prefill tokens) on
 * one layer (layers are independent: balance depends on the per-layer shape); bench_k3_thresholds
 * runs all 92 for cost. QBAL_* variables: debugging knobs (see main). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "qsynth.h"
#include "strata/base.h"
#include "strata/quantile.h"

#define N_EXP 896
#define TOPK 16
#define KMAX 32
/* Workers route step t with the table published after step t-1-LAG's counts (hist[LAG]):
 * LAG 1 = the counts of step t-2 reach the step t (report + end_step, then the fetch). */
#define LAG 1

typedef struct {
    const char *name;
    uint32_t workers, T, layers; /* layers: estimator layers; the exact one runs layer 0 only */
    double lambda, period;       /* decay; drift: steps for the hot set to rotate once */
    uint32_t warm, measured;     /* steps */
    uint32_t skip_every;         /* >0: worker w leaves layer l out of step t's summary when
                                    (w+t+l) % skip_every == 0 (what the byte budget does at K3 prefill) */
} scen_t;

/* Quantile routing of one token as SPEC §7: active iff s >= tau, at most KMAX with the largest
 * s - tau. Adds the chosen experts to load. */
static void route_q(const float *s, const float *tau, double *load) {
    int idx[N_EXP], c = 0;
    for (int j = 0; j < N_EXP; j++)
        if (s[j] >= tau[j]) idx[c++] = j;
    if (c > KMAX) { /* keep the KMAX largest s - tau (ties: lower id), partial selection */
        for (int a = 0; a < KMAX; a++) {
            int m = a;
            for (int z = a + 1; z < c; z++) {
                float dz = s[idx[z]] - tau[idx[z]], dm = s[idx[m]] - tau[idx[m]];
                if (dz > dm || (dz == dm && idx[z] < idx[m])) m = z;
            }
            int t = idx[a]; idx[a] = idx[m]; idx[m] = t;
        }
        c = KMAX;
    }
    for (int a = 0; a < c; a++) load[idx[a]] += 1;
}

/* Top-k of the same scores (the checkpoint's routing; no correction bias in this load). */
static void route_topk(const float *s, double *load) {
    float v[TOPK];
    int id[TOPK], m = 0;
    for (int j = 0; j < N_EXP; j++) {
        float x = s[j];
        if (m == TOPK && !(x > v[TOPK - 1])) continue;
        int z = m < TOPK ? m++ : TOPK - 1;
        while (z > 0 && v[z - 1] < x) { v[z] = v[z - 1]; id[z] = id[z - 1]; z--; }
        v[z] = x;
        id[z] = j;
    }
    for (int a = 0; a < TOPK; a++) load[id[a]] += 1;
}

static void spread(const double *load, double *mx, double *mn) {
    double mean = 0;
    *mx = 0;
    *mn = INFINITY;
    for (int j = 0; j < N_EXP; j++) mean += load[j];
    mean /= N_EXP;
    for (int j = 0; j < N_EXP; j++) {
        *mx = fmax(*mx, load[j] / mean);
        *mn = fmin(*mn, load[j] / mean);
    }
}

static void run(const scen_t *c, int with_exact) {
    const uint32_t W = c->workers, T = c->T, L = c->layers, n = N_EXP;
    const double p = (double)TOPK / N_EXP;
    st_qsynth_opts_t so;
    st_qsynth_opts_default(&so, L, n);
    so.period = c->period;
    st_qsynth_t *sy = NULL;
    st_qstate_t *q = NULL;
    st_qsum_t *b = NULL;
    st_qxstate_t *qx = NULL;
    st_qxsum_t *bx = NULL;
    CHECK(st_qsynth_create(&so, &sy) == ST_OK, "qsynth");
    st_qstate_opts_t qo;
    st_qstate_opts_default(&qo);
    if (getenv("QBAL_TREND")) qo.trend_gain = atof(getenv("QBAL_TREND"));
    if (getenv("QBAL_LEAD")) qo.lead = atof(getenv("QBAL_LEAD"));
    if (getenv("QBAL_PROBE")) qo.probe_every = (uint32_t)atoi(getenv("QBAL_PROBE"));
    CHECK(st_qstate_create(L, n, TOPK, c->lambda, &qo, &q) == ST_OK, "qstate");
    CHECK(st_qsum_create(L, n, TOPK, T, &b) == ST_OK, "qsum");
    st_qxstate_opts_t xo;
    st_qxstate_opts_default(&xo);
    xo.max_step_entries = 1u << 20;
    if (with_exact) {
        CHECK(st_qxstate_create(1, n, TOPK, c->lambda, &xo, &qx) == ST_OK, "qxstate");
        CHECK(st_qxsum_create(1, n, TOPK, T, &bx) == ST_OK, "qxsum");
    }
    size_t cap = st_qsum_max_bytes(L, n, TOPK, T), capx = st_qxsum_max_bytes(1, n, TOPK, T);
    uint8_t *buf = malloc(cap), *bufx = with_exact ? malloc(capx * W) : NULL;
    float *sc = malloc(sizeof(float) * (size_t)W * T * n * L);
    double *ld_q = calloc((size_t)L * n, sizeof(double)), *ld_x = calloc(n, sizeof(double)), *ld_k = calloc(n, sizeof(double));
    st_qtable_t hist[8], histx[8]; /* hist[LAG]: the table workers route with */
    memset(hist, 0, sizeof hist);
    memset(histx, 0, sizeof histx);
    st_rng_t rng = {0x5eed0000u + W};
    double bytes = 0, tokens = 0, sections = 0;
    uint32_t steps = c->warm + c->measured;
    for (uint32_t st = 0; st < steps; st++) {
        for (uint32_t l = 0; l < L; l++) st_qsynth_scores(sy, l, st, sc + (size_t)l * W * T * n, W * T, &rng);
        int lag = getenv("QBAL_LAG") ? atoi(getenv("QBAL_LAG")) % 8 : LAG;
        const st_qtable_t *th = &hist[lag], *thx = &histx[lag];
        /* route (measured window only), then report */
        int measure = st >= c->warm;
        if (measure) {
            tokens += (double)W * T;
            for (uint32_t l = 0; l < L; l++) {
                const float *tau = th->version && st_qtau_is_set(th->tau[(size_t)l * n]) ? th->tau + (size_t)l * n : NULL;
                CHECK(tau != NULL, "%s: layer %u has no thresholds at step %u", c->name, l, st);
                if (!tau) break;
                for (size_t t = 0; t < (size_t)W * T; t++) route_q(sc + ((size_t)l * W * T + t) * n, tau, ld_q + (size_t)l * n);
            }
            for (size_t t = 0; t < (size_t)W * T; t++) route_topk(sc + t * n, ld_k);
            if (with_exact && thx->version && st_qtau_is_set(thx->tau[0]))
                for (size_t t = 0; t < (size_t)W * T; t++) route_q(sc + t * n, thx->tau, ld_x);
        }
        for (uint32_t w = 0; w < W; w++) {
            size_t len = 0;
            st_qsum_begin(b, buf, cap, w + 1, st, th->version ? th : NULL);
            for (uint32_t l = 0; l < L; l++)
                if (!c->skip_every || getenv("QBAL_NOSKIP") || (w + st + l) % c->skip_every)
                    st_qsum_add_layer(b, l, sc + ((size_t)l * W * T + (size_t)w * T) * n, T);
            st_qsum_finish(b, &len);
            bytes += (double)len;
            sections += st_qsum_last_sections(b);
            st_status_t s = st_qstate_merge(q, buf, len);
            CHECK(s == ST_OK, "%s: merge: %s", c->name, st_err_last());
            if (with_exact) {
                uint8_t *bx_buf = bufx + (size_t)w * capx;
                st_qxsum_begin(bx, bx_buf, capx, w + 1, st, thx->version ? thx : NULL);
                st_qxsum_add_layer(bx, 0, sc + (size_t)w * T * n, T);
                st_qxsum_finish(bx, &len);
                s = st_qxstate_merge(qx, bx_buf, len);
                CHECK(s == ST_OK, "%s: exact merge: %s", c->name, st_err_last());
            }
        }
        memmove(hist + 1, hist, sizeof(st_qtable_t) * 7);
        CHECK(st_qstate_end_step(q, &hist[0]) == ST_OK, "end_step");
        if (with_exact) {
            memmove(histx + 1, histx, sizeof(st_qtable_t) * 7);
            CHECK(st_qxstate_end_step(qx, &histx[0]) == ST_OK, "exact end_step");
        }
    }
    /* noise of a per-expert load over `tokens` (SPEC §7): must sit well inside the tolerance */
    double noise = sqrt((1 - p) / (tokens * p));
    double mxq = 0, mnq = INFINITY, mxx = NAN, mnx = NAN, mxk, mnk;
    for (uint32_t l = 0; l < L; l++) {
        double a, z;
        spread(ld_q + (size_t)l * n, &a, &z);
        mxq = fmax(mxq, a);
        mnq = fmin(mnq, z);
    }
    spread(ld_k, &mxk, &mnk);
    if (with_exact) spread(ld_x, &mxx, &mnx);
    printf("%-8s %2u x %4u tok, %u layer(s), lambda %.1f, drift period %.0f steps, lag %d, %u+%u steps (N = %.0f tokens, "
           "noise 1 sd %.2f%%)\n",
           c->name, W, T, L, c->lambda, c->period, LAG, c->warm, c->measured, tokens, 100 * noise);
    printf("    counting: max/mean %.4f min/mean %.4f | exact: %.4f %.4f | top-k: %.3f %.3f | %.0f B/summary, %.2f layers/summary\n",
           mxq, mnq, mxx, mnx, mxk, mnk, bytes / ((double)W * steps), sections / ((double)W * steps));
    CHECK(4 * noise < 0.05, "%s: sampling noise %.3f too large for the tolerance", c->name, noise);
    CHECK(mxk > 3.0, "%s: the load is not skewed enough (top-k max/mean %.2f)", c->name, mxk);
    CHECK(mxq <= 1.10 && mnq >= 0.90, "%s: counting estimator max/mean %.4f min/mean %.4f outside +-10%%", c->name, mxq, mnq);
    if (with_exact) /* the counting estimator is no worse than the exact one on the same load, up to noise */
        CHECK(fmax(mxq - 1, 1 - mnq) <= fmax(mxx - 1, 1 - mnx) + 3 * noise, "%s: counting %.4f/%.4f vs exact %.4f/%.4f",
              c->name, mxq, mnq, mxx, mnx);
    free(buf); free(bufx); free(sc); free(ld_q); free(ld_x); free(ld_k);
    st_qsum_destroy(b);
    st_qstate_destroy(q);
    st_qxsum_destroy(bx);
    st_qxstate_destroy(qx);
    st_qsynth_destroy(sy);
}

int main(void) {
    /* decode: the coordinator's default lambda, a slow drift (a hot expert's bump lasts 600 steps) */
    scen_t dec = {"decode", 64, 256, 1, 0.9, 6000, 30, 30, 0};
    /* prefill: one summary in 4 leaves the layer out, as the 60 KB budget makes K3 prefill
     * summaries carry ~70 of 92 layers; a fast drift (bumps of 100 steps), lambda 0.5 */
    scen_t pre = {"prefill", 8, 4096, 1, 0.5, 1000, 20, 20, 4};
    int exact = 1;
#if defined(__SANITIZE_ADDRESS__)
    exact = 0; /* sanitizer builds run ~3x slower: the same checks without the exact reference */
#endif
    const char *only = getenv("QBAL_ONLY"); /* debugging: one scenario; QBAL_NOEXACT: skip the reference */
    if (getenv("QBAL_NOEXACT")) exact = 0;
    if (!only || !strcmp(only, dec.name)) run(&dec, exact);
    if (!only || !strcmp(only, pre.name)) run(&pre, exact);
    return st_test_done();
}
