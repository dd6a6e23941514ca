/* Block Attention Residuals (SPEC §5): the direct softmax over sources and the two-phase form
 * (completed blocks scored once, the current partial merged by online softmax). */
#include <math.h>
#include <string.h>

#include "strata/kernels.h"

/* s = Σ_c V[c]/sqrt(mean(V²)+eps) · w_eff[c] */
static float attnres_score(const float *V, const float *w_eff, int d, float eps) {
    float ss = 0.0f, dot = 0.0f;
    for (int c = 0; c < d; c++) {
        ss += V[c] * V[c];
        dot += V[c] * w_eff[c];
    }
    return dot / sqrtf(ss / (float)d + eps);
}

void st_attnres_direct(float *out, const float *const *src, int n_src, const float *w_eff, int d,
                       float eps) {
    float mx = -INFINITY, sum = 0.0f;
    for (int i = 0; i < n_src; i++) mx = fmaxf(mx, attnres_score(src[i], w_eff, d, eps));
    memset(out, 0, (size_t)d * sizeof(float));
    for (int i = 0; i < n_src; i++) {
        float e = expf(attnres_score(src[i], w_eff, d, eps) - mx);
        sum += e;
        for (int c = 0; c < d; c++) out[c] += e * src[i][c];
    }
    for (int c = 0; c < d; c++) out[c] /= sum;
}

void st_attnres_phase1(float *stats, float *acc, const float *const *blocks, int m, const float *w_eff,
                       int Q, int T, int d, float eps) {
    for (int t = 0; t < T; t++)
        for (int q = 0; q < Q; q++) {
            const float *w = w_eff + (size_t)q * d;
            float *st = stats + ((size_t)t * Q + q) * 2;
            float *a = acc + ((size_t)t * Q + q) * d;
            float mx = -INFINITY, sum = 0.0f;
            for (int i = 0; i < m; i++) mx = fmaxf(mx, attnres_score(blocks[i] + (size_t)t * d, w, d, eps));
            memset(a, 0, (size_t)d * sizeof(float));
            for (int i = 0; i < m; i++) {
                const float *V = blocks[i] + (size_t)t * d;
                float e = expf(attnres_score(V, w, d, eps) - mx);
                sum += e;
                for (int c = 0; c < d; c++) a[c] += e * V[c];
            }
            st[0] = mx; /* -inf when m = 0: the merge below then weighs the blocks by 0 */
            st[1] = sum;
        }
}

void st_attnres_phase2(float *out, const float *partial, const float *stats, const float *acc,
                       const float *w_eff_q, int q, int Q, int T, int d, float eps) {
    for (int t = 0; t < T; t++) {
        const float *P = partial + (size_t)t * d;
        const float *st = stats + ((size_t)t * Q + q) * 2;
        const float *a = acc + ((size_t)t * Q + q) * d;
        float *o = out + (size_t)t * d;
        float sp = attnres_score(P, w_eff_q, d, eps);
        float mx = fmaxf(st[0], sp);
        float cb = expf(st[0] - mx), cp = expf(sp - mx); /* rescale blocks' state; partial's weight */
        float inv = 1.0f / (st[1] * cb + cp);
        for (int c = 0; c < d; c++) o[c] = (a[c] * cb + cp * P[c]) * inv;
    }
}
