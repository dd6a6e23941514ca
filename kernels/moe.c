/* MoE dispatch and combine (SPEC §6): routed slots grouped by expert, the latent rows gathered into
 * that order, and the weighted combine of the expert outputs in slot order (= ascending expert id). */
#include <math.h>
#include <string.h>

#include "strata/kernels.h"

void st_moe_group(int *offsets, int *row_of, const int *ids, const int *cnt, int T, int kc, int E) {
    memset(offsets, 0, (size_t)(E + 1) * sizeof(int));
    for (int t = 0; t < T; t++)
        for (int i = 0; i < cnt[t]; i++) offsets[ids[(size_t)t * kc + i] + 1]++;
    for (int e = 0; e < E; e++) offsets[e + 1] += offsets[e];
    for (int e = 0; e < E; e++) /* rows of expert e in (t, i) order */
        for (int t = 0, r = offsets[e]; t < T; t++)
            for (int i = 0; i < cnt[t]; i++)
                if (ids[(size_t)t * kc + i] == e) row_of[(size_t)t * kc + i] = r++;
    for (int t = 0; t < T; t++)
        for (int i = cnt[t]; i < kc; i++) row_of[(size_t)t * kc + i] = -1;
}

void st_moe_gather(float *xg, const float *z, const int *row_of, const int *cnt, int T, int kc, int l) {
    for (int t = 0; t < T; t++)
        for (int i = 0; i < cnt[t]; i++)
            memcpy(xg + (size_t)row_of[(size_t)t * kc + i] * l, z + (size_t)t * l, (size_t)l * sizeof(float));
}

void st_moe_expand(uint16_t *dst, const float *rows, const uint32_t *src, int n, int n_in, int w) {
    for (int r = 0; r < n; r++)
        for (int c = 0; c < w; c++)
            dst[(size_t)r * w + c] = src[r] < (uint32_t)n_in ? st_f32_to_bf16(rows[(size_t)src[r] * w + c]) : 0;
}

void st_moe_combine(float *u, float *partial, const float *yg, const float *yf, const int *row_of, const float *p,
                    const int *cnt, const float *norm_w, int T, int kc, int l, float eps) {
    for (int t = 0; t < T; t++) {
        float *ut = u ? u + (size_t)t * l : NULL;
        for (int c = 0; c < l; c++) {
            float a = 0.0f;
            for (int i = 0; i < cnt[t]; i++) {
                const float *y = yg ? yg + (size_t)row_of[(size_t)t * kc + i] * l : yf + ((size_t)t * kc + i) * l;
                a = a + p[(size_t)t * kc + i] * y[c];
            }
            if (ut) ut[c] = a;
            else partial[(size_t)t * l + c] += a;
        }
        if (ut && norm_w) st_rmsnorm(ut, ut, norm_w, 1, l, eps);
    }
}
