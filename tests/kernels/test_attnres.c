/* Block AttnRes: two-phase (phase 1 over completed blocks, phase 2 merging the partial) equals the
 * direct softmax over [blocks.., partial]; direct vs fp64. */
#include "harness.h"
#include "strata/kernels.h"

static float urand(st_rng_t *r, float a) { return (float)(a * (2.0 * st_rng_uniform(r) - 1.0)); }

int main(void) {
    st_rng_t r = {5};
    enum { T = 4, d = 37, Q = 3, MMAX = 4 };
    const float eps = 1e-5f;
    for (int m = 0; m <= MMAX; m++) {
        float *blk[MMAX], partial[T * d], w[Q * d];
        for (int i = 0; i < m; i++) {
            blk[i] = malloc(sizeof(float) * T * d);
            float amp = 1.0f + 3.0f * (float)i; /* different scales: the rms key matters */
            for (int j = 0; j < T * d; j++) blk[i][j] = urand(&r, amp);
        }
        for (int j = 0; j < T * d; j++) partial[j] = urand(&r, 2.0f);
        for (int j = 0; j < Q * d; j++) w[j] = urand(&r, 3.0f); /* sharp softmax */
        float stats[T * Q * 2], acc[T * Q * d], out2[T * d], outd[T * d], out64[T * d];
        for (size_t j = 0; j < ST_ARRAY_LEN(acc); j++) acc[j] = NAN;
        st_attnres_phase1(stats, acc, (const float *const *)blk, m, w, Q, T, d, eps);
        for (int q = 0; q < Q; q++) {
            st_attnres_phase2(out2, partial, stats, acc, w + q * d, q, Q, T, d, eps);
            for (int t = 0; t < T; t++) {
                const float *src[MMAX + 1];
                for (int i = 0; i < m; i++) src[i] = blk[i] + t * d;
                src[m] = partial + t * d;
                st_attnres_direct(outd + t * d, src, m + 1, w + q * d, d, eps);
                double s[MMAX + 1], mx = -INFINITY, sum = 0;
                for (int i = 0; i <= m; i++) {
                    double ss = 0, dot = 0;
                    for (int c = 0; c < d; c++) {
                        ss += (double)src[i][c] * src[i][c];
                        dot += (double)src[i][c] * w[q * d + c];
                    }
                    s[i] = dot / sqrt(ss / d + eps);
                    if (s[i] > mx) mx = s[i];
                }
                for (int i = 0; i <= m; i++) sum += (s[i] = exp(s[i] - mx));
                for (int c = 0; c < d; c++) {
                    double o = 0;
                    for (int i = 0; i <= m; i++) o += s[i] * src[i][c];
                    out64[t * d + c] = (float)(o / sum);
                }
            }
            char what[64];
            snprintf(what, sizeof what, "attnres two-phase vs direct m=%d q=%d", m, q);
            st_t_close(what, out2, outd, T * d, 2e-6, 0);
            snprintf(what, sizeof what, "attnres direct vs fp64 m=%d q=%d", m, q);
            st_t_close(what, outd, out64, T * d, 2e-6, 0);
        }
        if (m == 0) CHECK(memcmp(out2, partial, sizeof partial) == 0, "m=0 must return the partial");
        for (int i = 0; i < m; i++) free(blk[i]);
    }
    return st_test_done();
}
