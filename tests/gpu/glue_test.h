/* Helpers of the tests of the engine's kernels (test_gpu_glue_*.c): fp32 random data, device copies of
 * fp32 arrays, and the check of a split bf16 output (hi, lo) against an fp32 reference. */
#ifndef STRATA_GLUE_TEST_H
#define STRATA_GLUE_TEST_H

#include "gpu_test.h"

static inline float *gl_randn(size_t n, float sd, st_rng_t *r) {
    float *x = gt_xmalloc(4 * n);
    for (size_t i = 0; i < n; i++) x[i] = sd * st_rng_normal(r);
    return x;
}
static inline float *gl_down_f32(const void *d, size_t n) {
    float *h = gt_xmalloc(4 * n);
    gt_down(h, d, 4 * n);
    return h;
}
/* bf16 device array → fp32 host */
static inline float *gl_down_bf(const void *d, size_t n) {
    uint16_t *b = gt_xmalloc(2 * n);
    float *h = gt_xmalloc(4 * n);
    gt_down(b, d, 2 * n);
    gt_from_bf(h, b, n);
    free(b);
    return h;
}
/* hi alone: bf16 rounding of the output (rel L2 and max error 1e-2); hi + lo: the split carries the
 * value to ~2^-16, so 1e-4 (fp32 summation order and expf differences stay far below it) */
static inline void gl_check_split(const char *what, const void *d_hi, const void *d_lo, const float *ref, size_t n) {
    float *hi = gl_down_bf(d_hi, n);
    char w[160];
    snprintf(w, sizeof w, "%s (bf16)", what);
    st_t_close(w, hi, ref, n, 1e-2, 1e-2);
    if (d_lo) {
        float *lo = gl_down_bf(d_lo, n);
        for (size_t i = 0; i < n; i++) hi[i] += lo[i];
        snprintf(w, sizeof w, "%s (hi + lo)", what);
        st_t_close(w, hi, ref, n, 1e-4, 1e-5);
        free(lo);
    }
    free(hi);
}

#endif
