/* MLA absorbed decode bandwidth: B sequences × ctx tokens of 576-wide bf16 latent rows in 64-row
 * pages, H query heads; KV bytes read per time against the copy ceiling. */
#include <math.h>

#include "bench_common.h"

static void bench(int B, int ctx, int H, int split) {
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
    for (int r = 0; r < 2; r++) BK(st_cuda_mla_decode(&bs, o, q, pool, bt, len, B, H, page, max_pages, ctx, split, sc, ws, wsb));
    st_gpu_timer_t t;
    BK(st_gpu_timer_init(&t));
    int it = 10;
    double ms;
    BK(st_gpu_timer_start(&t, &bs));
    for (int r = 0; r < it; r++) BK(st_cuda_mla_decode(&bs, o, q, pool, bt, len, B, H, page, max_pages, ctx, split, sc, ws, wsb));
    BK(st_gpu_timer_stop(&t, &bs, &ms));
    ms /= it;
    printf("RESULT mla_decode B=%d ctx=%d H=%d split=%d: %.3f ms, %.0f GB/s KV read = %.1f%% of copy, %.1f TFLOP/s\n", B,
           ctx, H, split, ms, kvb / (ms * 1e6), 100.0 * kvb / (ms * 1e6) / b_copy_gbs,
           2.0 * rows * H * (576 + 512) / (ms * 1e9));
    st_gpu_timer_cleanup(&t);
    st_gpu_free(pool), st_gpu_free(q), st_gpu_free(o), st_gpu_free(bt), st_gpu_free(len), st_gpu_free(ws);
    free(hbt), free(hlen);
}

int main(void) {
    bench_init("bench_gpu_mla", 0);
    bench(64, 32768, 16, 1024);
    bench(64, 32768, 16, 2048);
    bench(64, 4096, 16, 256);
    bench(16, 32768, 64, 1024);
    bench(64, 32768, 128, 1024);
    return 0;
}
