/* Synthetic K3-shaped router scores for tests and benchmarks (qsynth.h). Not on any serving path. */
#include <math.h>
#include <stdlib.h>

#include "qsynth.h"

#define QS_TAB_BITS 16

struct st_qsynth {
    st_qsynth_opts_t o;
    float *ntab;   /* [1 << QS_TAB_BITS] standard normal quantiles, a fast N(0,1) draw */
    float *skew;   /* [L*n] */
    double *phase; /* [L*n] in [0, 1) */
    float *mu;     /* [n] scratch of one call: offsets at the step */
};

void st_qsynth_opts_default(st_qsynth_opts_t *o, uint32_t n_layers, uint32_t n_experts) {
    *o = (st_qsynth_opts_t){.n_layers = n_layers, .n_experts = n_experts, .skew_sd = 0.1, .token_sd = 0.1,
                            .hot_amp = 0.5, .hot_frac = 0.1, .period = 6000, .seed = 7};
}

/* Acklam's rational approximation of the normal quantile (|rel err| < 1.2e-9): table set-up only. */
static double qs_ndtri(double p) {
    static const double a[] = {-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02,
                               1.383577518672690e+02, -3.066479806614716e+01, 2.506628277459239e+00};
    static const double b[] = {-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
                               6.680131188771972e+01, -1.328068155288572e+01};
    static const double c[] = {-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
                               -2.549732539343734e+00, 4.374664141464968e+00, 2.938163982698783e+00};
    static const double d[] = {7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00, 3.754408661907416e+00};
    if (p < 0.02425) {
        double q = sqrt(-2 * log(p));
        return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
    }
    if (p > 1 - 0.02425) return -qs_ndtri(1 - p);
    double q = p - 0.5, r = q * q;
    return (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
           (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
}

st_status_t st_qsynth_create(const st_qsynth_opts_t *o, st_qsynth_t **out) {
    if (!o || !out || !o->n_layers || !o->n_experts || !(o->hot_frac > 0 && o->hot_frac < 1) || !(o->period > 0))
        return ST_FAIL(ST_ERR_INVALID_ARG, "qsynth: bad options");
    st_qsynth_t *sy = calloc(1, sizeof *sy);
    if (!sy) return ST_FAIL(ST_ERR_NO_MEMORY, "qsynth");
    size_t ln = (size_t)o->n_layers * o->n_experts;
    sy->o = *o;
    sy->ntab = malloc(sizeof(float) << QS_TAB_BITS);
    sy->skew = malloc(sizeof(float) * ln);
    sy->phase = malloc(sizeof(double) * ln);
    sy->mu = malloc(sizeof(float) * o->n_experts);
    if (!sy->ntab || !sy->skew || !sy->phase || !sy->mu) {
        st_qsynth_destroy(sy);
        return ST_FAIL(ST_ERR_NO_MEMORY, "qsynth");
    }
    for (uint32_t i = 0; i < (1u << QS_TAB_BITS); i++) sy->ntab[i] = (float)qs_ndtri((i + 0.5) / (double)(1u << QS_TAB_BITS));
    st_rng_t r = {o->seed * 0x9E3779B97F4A7C15ull + 1};
    for (size_t i = 0; i < ln; i++) {
        sy->skew[i] = (float)(o->skew_sd * st_rng_normal(&r));
        sy->phase[i] = st_rng_uniform(&r);
    }
    *out = sy;
    return ST_OK;
}

void st_qsynth_destroy(st_qsynth_t *sy) {
    if (!sy) return;
    free(sy->ntab); free(sy->skew); free(sy->phase); free(sy->mu);
    free(sy);
}

double st_qsynth_offset(const st_qsynth_t *sy, uint32_t layer, uint32_t expert, double step) {
    size_t i = (size_t)layer * sy->o.n_experts + expert;
    double w = sy->o.hot_frac, u = step / sy->o.period + sy->phase[i];
    u -= floor(u);
    /* a raised-cosine bump of width hot_frac (in periods): heat rises and falls smoothly */
    double heat = u < w ? 0.5 * (1.0 - cos(6.283185307179586 * u / w)) : 0.0;
    return sy->skew[i] + sy->o.hot_amp * heat;
}

void st_qsynth_scores(const st_qsynth_t *sy, uint32_t layer, double step, float *scores, uint32_t T, st_rng_t *rng) {
    const uint32_t n = sy->o.n_experts;
    float *mu = sy->mu;
    for (uint32_t j = 0; j < n; j++) mu[j] = (float)st_qsynth_offset(sy, layer, j, step);
    const uint32_t mask = (1u << QS_TAB_BITS) - 1;
    for (uint32_t t = 0; t < T; t++) {
        uint64_t r0 = st_rng_next(rng);
        float a = (float)sy->o.token_sd * sy->ntab[r0 & mask];
        float *row = scores + (size_t)t * n;
        uint32_t j = 0;
        for (; j + 4 <= n; j += 4) {
            uint64_t r = st_rng_next(rng);
            for (int q = 0; q < 4; q++) {
                float x = mu[j + q] + a + sy->ntab[(r >> (16 * q)) & mask];
                row[j + q] = 1.0f / (1.0f + expf(-x));
            }
        }
        for (uint64_t r = st_rng_next(rng); j < n; j++, r >>= 16) {
            float x = mu[j] + a + sy->ntab[r & mask];
            row[j] = 1.0f / (1.0f + expf(-x));
        }
    }
}
