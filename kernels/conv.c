/* Depthwise causal short convolution + SiLU of KDA (SPEC §3.1), with the rolling input window
 * carried across calls. */
#include "strata/kernels.h"

void st_conv_silu(float *y, const float *x, float *state, const float *w, int T, int C, int K) {
    const int S = K - 1; /* window rows kept in state */
    for (int t = 0; t < T; t++)
        for (int c = 0; c < C; c++) {
            float acc = 0.0f;
            for (int j = 0; j < K; j++) {
                int src = t - S + j; /* input index; < 0 reads the carried window */
                float xv = src >= 0 ? x[(size_t)src * C + c] : state[(size_t)(S + src) * C + c];
                acc += w[(size_t)c * K + j] * xv;
            }
            y[(size_t)t * C + c] = st_silu(acc);
        }
    /* new window = last S rows of (old window ++ x), oldest first */
    for (int i = 0; i < S; i++) {
        int src = T - S + i; /* index into x, or into the old window when negative */
        for (int c = 0; c < C; c++)
            state[(size_t)i * C + c] = src >= 0 ? x[(size_t)src * C + c] : state[(size_t)(i + T) * C + c];
    }
}
