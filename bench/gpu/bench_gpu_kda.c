/* KDA benchmarks: chunked prefill tokens/s (B·T = 65536, T = 8192, H = 32 and 96) and decode state
 * bandwidth (N = 64, 256 sequences, H = 32) against the copy ceiling, as the engine runs them (fp32
 * activations; the block widths are the kernels' measured constants, kernels/kda.cu). */
#include <math.h>
#include <string.h>

#include "bench_common.h"

#define D 128

static void bench_chunked(int B, int T, int H) {
    size_t ntok = (size_t)B * T, n = ntok * H * D;
    st_bf16_t *q = bdev(2 * n), *k = bdev(2 * n), *v = bdev(2 * n);
    float *o = bdev(4 * n), *g = bdev(4 * n), *beta = bdev(4 * ntok * H), *S = bdev(4 * (size_t)B * H * D * D);
    int *cu = bdev(sizeof(int) * (B + 1)), hcu[1025];
    for (int b = 0; b <= B; b++) hcu[b] = b * T;
    BK(st_gpu_memcpy_h2d(cu, hcu, sizeof(int) * (B + 1)));
    /* q, k as the engine passes them, L2-normed per head: uniform on ±√(3/D) gives E‖x‖² = 1 */
    const float a = sqrtf(3.f / D);
    BK(st_cuda_fill_uniform(&bs, q, true, n, -a, a, 1));
    BK(st_cuda_fill_uniform(&bs, k, true, n, -a, a, 2));
    BK(st_cuda_fill_uniform(&bs, v, true, n, -1.f, 1.f, 3));
    BK(st_cuda_fill_uniform(&bs, g, false, n, -1.f, -0.01f, 4));
    BK(st_cuda_fill_uniform(&bs, beta, false, ntok * H, 0.1f, 0.9f, 5));
    st_gpu_timer_t t;
    BK(st_gpu_timer_init(&t));
    {
        BK(st_gpu_memset(S, 0, 4 * (size_t)B * H * D * D));
        BK(st_cuda_kda_chunked(&bs, o, q, k, v, g, beta, S, NULL, cu, B, H, 1.f / sqrtf(D)));
        double ms = 0;
        int it = 3;
        BK(st_gpu_timer_start(&t, &bs));
        for (int r = 0; r < it; r++) BK(st_cuda_kda_chunked(&bs, o, q, k, v, g, beta, S, NULL, cu, B, H, 1.f / sqrtf(D)));
        BK(st_gpu_timer_stop(&t, &bs, &ms));
        ms /= it;
        printf("RESULT kda_chunked B=%d T=%d H=%d: %.3f ms, %.2f M tokens/s, %.1f M token-heads/s\n", B, T, H, ms,
               ntok / (ms * 1e3), ntok * H / (ms * 1e3));
    }
    st_gpu_timer_cleanup(&t);
    st_gpu_free(q), st_gpu_free(k), st_gpu_free(v), st_gpu_free(o), st_gpu_free(g), st_gpu_free(beta), st_gpu_free(S),
        st_gpu_free(cu);
}

static void bench_decode(int N, int H) {
    size_t n = (size_t)N * H * D, ss = (size_t)N * H * D * D;
    float *q = bdev(4 * n), *k = bdev(4 * n), *v = bdev(4 * n), *o = bdev(4 * n);
    float *g = bdev(4 * n), *beta = bdev(4 * (size_t)N * H), *S = bdev(4 * ss);
    BK(st_cuda_fill_uniform(&bs, q, false, n, -0.1f, 0.1f, 1));
    BK(st_cuda_fill_uniform(&bs, k, false, n, -0.1f, 0.1f, 2));
    BK(st_cuda_fill_uniform(&bs, v, false, n, -1.f, 1.f, 3));
    BK(st_cuda_fill_uniform(&bs, g, false, n, -0.5f, -0.01f, 4));
    BK(st_cuda_fill_uniform(&bs, beta, false, (size_t)N * H, 0.1f, 0.9f, 5));
    BK(st_cuda_fill_uniform(&bs, S, false, ss, -0.1f, 0.1f, 6));
    st_gpu_timer_t t;
    BK(st_gpu_timer_init(&t));
    {
        for (int r = 0; r < 3; r++) BK(st_cuda_kda_decode(&bs, o, q, k, v, g, beta, S, NULL, N, H, 0.088f));
        int it = 50;
        double ms = 0;
        BK(st_gpu_timer_start(&t, &bs));
        for (int r = 0; r < it; r++) BK(st_cuda_kda_decode(&bs, o, q, k, v, g, beta, S, NULL, N, H, 0.088f));
        BK(st_gpu_timer_stop(&t, &bs, &ms));
        ms /= it;
        double bytes = 2.0 * 4 * ss + n * (4 * 4 + 4) + 4.0 * N * H; /* S read + written; q, k, v, g, o; β */
        printf("RESULT kda_decode N=%d H=%d: %.2f us, %.0f GB/s = %.1f%% of copy\n", N, H, ms * 1e3,
               bytes / (ms * 1e6), 100.0 * bytes / (ms * 1e6) / b_copy_gbs);
    }
    st_gpu_timer_cleanup(&t);
    st_gpu_free(q), st_gpu_free(k), st_gpu_free(v), st_gpu_free(o), st_gpu_free(g), st_gpu_free(beta), st_gpu_free(S);
}

int main(void) {
    bench_init("bench_gpu_kda", 1);
    bench_decode(64, 32);
    bench_decode(256, 32);
    bench_chunked(8, 8192, 32);
    bench_chunked(8, 8192, 96);
    bench_chunked(64, 1024, 32);
    return 0;
}
