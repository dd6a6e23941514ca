/* The engine's fp32-in / bf16-out element kernels vs their C twins: st_cuda_rmsnorm (st_rmsnorm),
 * st_cuda_glu (st_glu, SiTU and SiLU, halves of one [T, 2n] buffer), st_cuda_mul_sigmoid (st_mul_sigmoid),
 * each with and without the split `lo` output. Odd widths, one token, T = 0 and the largest batch
 * (8192 tokens). */
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
    return st_test_done();
}
