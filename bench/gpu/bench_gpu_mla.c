/* MLA absorbed decode bandwidth: B sequences × ctx tokens of 576-wide bf16 latent rows in 64-row
 * pages, H query heads; KV bytes read per time against the copy ceiling, tensor rate against the
 * cuBLAS bf16 GEMM ceiling, and against the roofline min(copy, GEMM / (2·H·1088/1152 FLOP/B)).
 * The kernel is the product's (v6, kernels/mla.cu); a summary table (% of copy, TFLOP/s) is printed
 * last. BENCH_MLA_ONLY=i: shape i only (e.g. under ncu). */
#include <math.h>

#include "bench_common.h"

#define NSHAPE 13
static double pct[NSHAPE], tfs[NSHAPE];
static int shp[NSHAPE][3];

static void bench(int si, int B, int ctx, int H, int split) {
    const int page = 64, max_pages = ctx / page;
    size_t rows = (size_t)B * ctx, kvb = rows * 576 * 2;
    st_bf16_t *pool = bdev(kvb), *q = bdev((size_t)B * H * 576 * 2), *o = bdev((size_t)B * H * 512 * 2);
    int *bt = bdev(sizeof(int) * B * max_pages), *len = bdev(sizeof(int) * B);
    int *hbt = malloc(sizeof(int) * B * max_pages), *hlen = malloc(sizeof(int) * B);
    for (int i = 0; i < B * max_pages; i++) hbt[i] = (int)(((long)i * 7919) % (B * max_pages)); /* scattered pages */
    for (int b = 0; b < B; b++) hlen[b] = ctx;
    BK(st_gpu_memcpy_h2d(bt, hbt, sizeof(int) * B * max_pages));
    BK(st_gpu_memcpy_h2d(len, hlen, sizeof(int) * B));
    BK(st_cuda_fill_uniform(&bs, pool, true, rows * 576, -1.f, 1.f, 1));
    BK(st_cuda_fill_uniform(&bs, q, true, (size_t)B * H * 576, -0.1f, 0.1f, 2));
    size_t wsb = st_cuda_mla_decode_ws_bytes(B, H, ctx, split);
    void *ws = bdev(wsb);
    const float sc = 1.f / sqrtf(192.f);
    shp[si][0] = B, shp[si][1] = ctx, shp[si][2] = H;
    double ms;
    BTIME(ms, 5, st_cuda_mla_decode(&bs, o, q, pool, bt, len, B, H, page, max_pages, ctx, split, sc, ws, wsb));
    const double gbs = kvb / (ms * 1e6), tfl = 2.0 * rows * H * (576 + 512) / (ms * 1e9);
    const double roof = fmin(b_copy_gbs, b_gemm_tflops * 1e3 / (2.0 * H * (576 + 512) / 1152.0));
    pct[si] = 100.0 * gbs / b_copy_gbs, tfs[si] = tfl;
    printf("RESULT mla_decode B=%d ctx=%d H=%d split=%d: %.3f ms, %.0f GB/s KV read = %.1f%% of copy, "
           "%.1f TFLOP/s = %.1f%% of GEMM, %.1f%% of roofline\n",
           B, ctx, H, split, ms, gbs, pct[si], tfl, 100.0 * tfl / b_gemm_tflops, 100.0 * gbs / roof);
    fflush(stdout);
    st_gpu_free(pool), st_gpu_free(q), st_gpu_free(o), st_gpu_free(bt), st_gpu_free(len), st_gpu_free(ws);
    free(hbt), free(hlen);
}

int main(void) {
    bench_init("bench_gpu_mla", 1);
    static const int S[NSHAPE][4] = {
        {64, 4096, 16, 256},  {64, 32768, 16, 1024}, {128, 4096, 16, 256},  {128, 32768, 16, 1024},
        {16, 32768, 64, 1024}, {64, 4096, 64, 512},  {64, 32768, 64, 512},  {128, 4096, 64, 512},
        {128, 32768, 64, 512}, {64, 4096, 128, 512}, {64, 32768, 128, 512}, {128, 4096, 128, 512},
        {128, 32768, 128, 512}};
    const char *only = getenv("BENCH_MLA_ONLY"); /* one shape (its row number from 0), e.g. under ncu */
    for (int i = 0; i < NSHAPE; i++)
        if (!only || atoi(only) == i) bench(i, S[i][0], S[i][1], S[i][2], S[i][3]);
    printf("\nSUMMARY (copy %.0f GB/s, GEMM %.1f TFLOP/s)\n%-15s %9s %9s\n", b_copy_gbs, b_gemm_tflops, "B x ctx, H",
           "% copy", "TFLOP/s");
    for (int i = 0; i < NSHAPE; i++) {
        if (!shp[i][0]) continue; /* not run (BENCH_MLA_ONLY) */
        char t[32];
        snprintf(t, sizeof t, "%dx%dK H%d", shp[i][0], shp[i][1] / 1024, shp[i][2]);
        printf("%-15s %9.1f %9.1f\n", t, pct[i], tfs[i]);
    }
    return 0;
}
