/* The engine's fp32-in / bf16-out element kernels vs their C twins: st_cuda_rmsnorm (st_rmsnorm),
 * st_cuda_glu (st_glu, SiTU and SiLU, halves of one [T, 2n] buffer), st_cuda_mul_sigmoid (st_mul_sigmoid),
 * st_cuda_split_bf16 (st_split_bf16, bit-exact), each with and without the split `lo` output; and the
 * first AttnRes versions st_cuda_attnres_phase1_strided + st_cuda_attnres_phase2_rmsnorm_v1
 * (st_attnres_phase1, st_attnres_phase2, st_rmsnorm), including gathered rows and no AttnRes state.
 * Odd widths, one token, T = 0 and the largest batch (8192 tokens). */
#include <math.h>
#include <string.h>

#include "glue_test.h"
#include "strata/kernels.h"

static void rmsnorm_case(int T, int n, bool weighted, bool split, uint64_t seed) {
    st_rng_t r = {seed};
    size_t N = (size_t)T * n;
    float *x = gl_randn(N + 1, 3.f, &r), *w = gl_randn(n, 0.3f, &r), *ref = gt_xmalloc(4 * (N + 1));
    for (int i = 0; i < n; i++) w[i] += 1.f;
    st_rmsnorm(ref, x, weighted ? w : NULL, T, n, 1e-5f);
    float *dx = gt_up(x, 4 * (N + 1)), *dw = gt_up(w, 4 * (size_t)n);
    uint16_t *dy = gt_dev(2 * (N + 1)), *dlo = gt_dev(2 * (N + 1));
    GT_OK(st_cuda_rmsnorm(&gt_stream, dy, split ? dlo : NULL, dx, weighted ? dw : NULL, T, n, 1e-5f));
    char what[96];
    snprintf(what, sizeof what, "rmsnorm T=%d n=%d w=%d", T, n, weighted);
    if (N) gl_check_split(what, dy, split ? dlo : NULL, ref, N);
    st_gpu_free(dx), st_gpu_free(dw), st_gpu_free(dy), st_gpu_free(dlo);
    free(x), free(w), free(ref);
}

static void glu_case(int T, int n, bool situ, bool split, uint64_t seed) {
    st_rng_t r = {seed};
    size_t N = (size_t)T * 2 * n, M = (size_t)T * n;
    float *gu = gl_randn(N + 1, 4.f, &r), *ref = gt_xmalloc(4 * (M + 1));
    st_glu(ref, gu, gu + n, T, n, 2 * n, situ ? ST_ACT_SITU : ST_ACT_SILU, 4.f, 25.f);
    float *dgu = gt_up(gu, 4 * (N + 1));
    uint16_t *dh = gt_dev(2 * (M + 1)), *dlo = gt_dev(2 * (M + 1));
    GT_OK(st_cuda_glu(&gt_stream, dh, split ? dlo : NULL, dgu, dgu + n, T, n, 2 * n, situ, 4.f, 25.f));
    char what[96];
    snprintf(what, sizeof what, "glu %s T=%d n=%d", situ ? "situ" : "silu", T, n);
    if (M) gl_check_split(what, dh, split ? dlo : NULL, ref, M);
    CHECK(st_cuda_glu(&gt_stream, dh, NULL, dgu, dgu + n, T, n, n - 1, situ, 4.f, 25.f) == ST_ERR_INVALID_ARG,
          "glu: ld_in < n accepted");
    st_gpu_free(dgu), st_gpu_free(dh), st_gpu_free(dlo);
    free(gu), free(ref);
}

static void mul_sigmoid_case(size_t n, bool split, uint64_t seed) {
    st_rng_t r = {seed};
    float *x = gl_randn(n + 1, 2.f, &r), *g = gl_randn(n + 1, 3.f, &r), *ref = gt_xmalloc(4 * (n + 1));
    st_mul_sigmoid(ref, x, g, n);
    float *dx = gt_up(x, 4 * (n + 1)), *dg = gt_up(g, 4 * (n + 1));
    uint16_t *dy = gt_dev(2 * (n + 1)), *dlo = gt_dev(2 * (n + 1));
    GT_OK(st_cuda_mul_sigmoid(&gt_stream, dy, split ? dlo : NULL, dx, dg, n));
    char what[64];
    snprintf(what, sizeof what, "mul_sigmoid n=%zu", n);
    if (n) gl_check_split(what, dy, split ? dlo : NULL, ref, n);
    st_gpu_free(dx), st_gpu_free(dg), st_gpu_free(dy), st_gpu_free(dlo);
    free(x), free(g), free(ref);
}

static void split_case(size_t n, uint64_t seed) {
    st_rng_t r = {seed};
    float *x = gl_randn(n + 1, 10.f, &r);
    if (n > 3) x[0] = 0.f, x[1] = -0.f, x[2] = 1e-30f, x[3] = 3.0e38f;
    uint16_t *hi = gt_xmalloc(2 * (n + 1)), *lo = gt_xmalloc(2 * (n + 1)), *ghi = gt_xmalloc(2 * (n + 1)),
             *glo = gt_xmalloc(2 * (n + 1));
    st_split_bf16(hi, lo, x, n);
    float *dx = gt_up(x, 4 * (n + 1));
    uint16_t *dhi = gt_dev(2 * (n + 1)), *dlo = gt_dev(2 * (n + 1));
    GT_OK(st_cuda_split_bf16(&gt_stream, dhi, dlo, dx, n));
    gt_down(ghi, dhi, 2 * n);
    gt_down(glo, dlo, 2 * n);
    CHECK(memcmp(hi, ghi, 2 * n) == 0 && memcmp(lo, glo, 2 * n) == 0, "split_bf16 n=%zu: not bit-exact", n);
    st_gpu_free(dx), st_gpu_free(dhi), st_gpu_free(dlo);
    free(x), free(hi), free(lo), free(ghi), free(glo);
}

/* m blocks (m = 0: no AttnRes state, plain RMSNorm of the partial rows), Q queries; phase 2 + norm for
 * query q over n_rows rows (gathered through rows when gather) */
static void attnres_v1_case(int m, int Q, int T, int d, bool gather, bool split, uint64_t seed) {
    st_rng_t r = {seed};
    size_t Td = (size_t)T * d, bstride = Td + 5;
    float *blocks = gl_randn(bstride * (m ? m : 1), 1.f, &r), *w = gl_randn((size_t)Q * d, 0.5f, &r),
          *partial = gl_randn(Td, 1.f, &r), *nw = gl_randn(d, 0.2f, &r);
    for (int i = 0; i < d; i++) nw[i] += 1.f;
    const float *bp[64];
    for (int i = 0; i < m; i++) bp[i] = blocks + i * bstride;
    float *stats = gt_xmalloc(4 * (size_t)T * Q * 2), *acc = gt_xmalloc(4 * Td * Q);
    const float eps = 1e-6f, neps = 1e-5f;
    int q = Q - 1;
    st_attnres_phase1(stats, acc, bp, m, w, Q, T, d, eps);
    int n_rows = gather ? (T + 1) / 2 : T;
    int *rows = gt_xmalloc(sizeof(int) * n_rows);
    for (int i = 0; i < n_rows; i++) rows[i] = gather ? T - 1 - 2 * i : i;
    float *h = gt_xmalloc(4 * Td), *ref = gt_xmalloc(4 * (size_t)n_rows * d);
    if (m) st_attnres_phase2(h, partial, stats, acc, w + (size_t)q * d, q, Q, T, d, eps);
    else memcpy(h, partial, 4 * Td);
    for (int i = 0; i < n_rows; i++) st_rmsnorm(ref + (size_t)i * d, h + (size_t)rows[i] * d, nw, 1, d, neps);
    float *dB = gt_up(blocks, 4 * bstride * (m ? m : 1)), *dw = gt_up(w, 4 * (size_t)Q * d), *dP = gt_up(partial, 4 * Td),
          *dnw = gt_up(nw, 4 * (size_t)d), *dS = gt_dev(4 * (size_t)T * Q * 2), *dA = gt_dev(4 * Td * Q);
    int *dR = gt_up(rows, sizeof(int) * n_rows);
    uint16_t *dxn = gt_dev(2 * (size_t)n_rows * d), *dlo = gt_dev(2 * (size_t)n_rows * d);
    char what[128];
    if (m) {
        GT_OK(st_cuda_attnres_phase1_strided(&gt_stream, dS, dA, dB, bstride, m, dw, Q, T, d, eps));
        float *gs = gl_down_f32(dS, (size_t)T * Q * 2), *ga = gl_down_f32(dA, Td * Q);
        snprintf(what, sizeof what, "attnres_phase1_strided m=%d Q=%d T=%d d=%d: stats", m, Q, T, d);
        st_t_close(what, gs, stats, (size_t)T * Q * 2, 1e-5, 1e-5);
        snprintf(what, sizeof what, "attnres_phase1_strided m=%d Q=%d T=%d d=%d: acc", m, Q, T, d);
        st_t_close(what, ga, acc, Td * Q, 1e-4, 1e-5); /* m exp-weighted terms: the max error is a few ulp of the largest */
        free(gs), free(ga);
    }
    GT_OK(st_cuda_attnres_phase2_rmsnorm_v1(&gt_stream, dxn, split ? dlo : NULL, dP, m ? dS : NULL, dA,
                                            dw + (size_t)q * d, q, Q, dnw, gather ? dR : NULL, n_rows, d, eps, neps));
    snprintf(what, sizeof what, "attnres_phase2_rmsnorm_v1 m=%d Q=%d T=%d d=%d rows=%d", m, Q, T, d, n_rows);
    gl_check_split(what, dxn, split ? dlo : NULL, ref, (size_t)n_rows * d);
    st_gpu_free(dB), st_gpu_free(dw), st_gpu_free(dP), st_gpu_free(dnw), st_gpu_free(dS), st_gpu_free(dA),
        st_gpu_free(dR), st_gpu_free(dxn), st_gpu_free(dlo);
    free(blocks), free(w), free(partial), free(nw), free(stats), free(acc), free(rows), free(h), free(ref);
}

int main(void) {
    gt_init_or_skip("test_gpu_glue_act");
    static const int Ts[] = {1, 37, 8192}, ns[] = {1, 257, 1024, 7168};
    uint64_t seed = 1;
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++) {
            if (Ts[i] == 8192 && ns[j] > 1024) continue;
            rmsnorm_case(Ts[i], ns[j], (i + j) & 1, j & 1, seed++);
            glu_case(Ts[i], ns[j], true, (i + j) & 1, seed++);
            glu_case(Ts[i], ns[j], false, !((i + j) & 1), seed++);
            mul_sigmoid_case((size_t)Ts[i] * ns[j], j & 1, seed++);
        }
    rmsnorm_case(0, 64, true, true, seed++);
    glu_case(0, 64, true, true, seed++);
    mul_sigmoid_case(0, true, seed++);
    split_case(1, seed++);
    split_case(12345, seed++);
    split_case(0, seed++);
    attnres_v1_case(0, 1, 5, 129, false, true, seed++);
    attnres_v1_case(1, 3, 1, 1024, false, false, seed++);
    attnres_v1_case(4, 5, 33, 257, true, true, seed++);
    attnres_v1_case(9, 2, 300, 1024, false, true, seed++);
    return st_test_done();
}
