/* RMSNorm and per-head L2 norm (SPEC §3.1, §4, notation). fp32 throughout. */
#include <math.h>

#include "strata/kernels.h"

void st_rmsnorm(float *y, const float *x, const float *w, int T, int n, float eps) {
    for (int t = 0; t < T; t++) {
        const float *xr = x + (size_t)t * n;
        float *yr = y + (size_t)t * n;
        float ss = 0.0f;
        for (int c = 0; c < n; c++) ss += xr[c] * xr[c];
        float inv = 1.0f / sqrtf(ss / (float)n + eps);
        for (int c = 0; c < n; c++) yr[c] = w ? xr[c] * inv * w[c] : xr[c] * inv;
    }
}

void st_l2norm_heads(float *x, int T, int H, int dh, float eps) {
    for (size_t i = 0; i < (size_t)T * H; i++) {
        float *u = x + i * dh;
        float ss = 0.0f;
        for (int c = 0; c < dh; c++) ss += u[c] * u[c];
        float inv = 1.0f / sqrtf(ss + eps);
        for (int c = 0; c < dh; c++) u[c] *= inv;
    }
}
