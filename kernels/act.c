/* Activations: sigmoid, SiLU, and the gated GLU forms SiTU / SiLU (SPEC §6). fp32. */
#include <math.h>

#include "strata/kernels.h"

float st_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); } /* exp overflow → 0, fine */

float st_silu(float x) { return x * st_sigmoid(x); }

void st_glu(float *h, const float *gate, const float *up, int T, int n, int ld_in, st_act_t act,
            float b1, float b2) {
    for (int t = 0; t < T; t++) {
        const float *a = gate + (size_t)t * ld_in, *u = up + (size_t)t * ld_in;
        float *o = h + (size_t)t * n;
        if (act == ST_ACT_SITU) {
            for (int c = 0; c < n; c++)
                o[c] = (b1 * tanhf(a[c] / b1) * st_sigmoid(a[c])) * (b2 * tanhf(u[c] / b2));
        } else {
            for (int c = 0; c < n; c++) o[c] = st_silu(a[c]) * u[c];
        }
    }
}

void st_mul_sigmoid(float *y, const float *x, const float *gate, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = x[i] * st_sigmoid(gate[i]);
}
