/* The worker's share of quantile thresholds on the GPU (issue 16 item 1): per step, at every one of
 * K3's 92 MoE layers (896 experts), the router epilogue's threshold counts (st_cuda_route_count:
 * counts at τ and the probe band, every layer probed: an upper bound, settled tables probe 1 layer
 * in 4) and their copy to pinned host memory (2 × 896 uint32 per layer), at T 256 (decode) and
 * 4096 (prefill). Scores are distinct per layer (not L2-resident: another upper bound). Beside it,
 * the host side of the same summary: st_qsum_add_layer_counts for the 92 layers (packing only) and,
 * for reference, the CPU path it replaces (st_qsum_add_layer from the scores).
 * Run: build-cuda/bin/bench_gpu_route_count   (budget: 1 ms per step on the GPU) */
#include <math.h>
#include <string.h>
#include <time.h>

#include "bench_common.h"
#include "strata/quantile.h"

enum { L = 92, N = 896, K = 16 };

static float *d_s, *d_tau, *d_rho;
static uint32_t *d_c, *h_c;

/* one step: the counts of every layer and their copies back */
static st_status_t step(int T) {
    for (int l = 0; l < L; l++) {
        st_status_t rc = st_cuda_route_count(&bs, d_c + (size_t)l * 2 * N, d_c + (size_t)l * 2 * N + N,
                                             d_s + (size_t)l * T * N, d_tau + (size_t)l * N, d_rho + (size_t)l * N, T, N);
        if (rc == ST_OK)
            rc = st_gpu_memcpy_async(&bs, h_c + (size_t)l * 2 * N, d_c + (size_t)l * 2 * N, 2 * N * sizeof(uint32_t),
                                     ST_GPU_COPY_D2H);
        if (rc != ST_OK) return rc;
    }
    return ST_OK;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

int main(void) {
    bench_init("bench_gpu_route_count", 0);
    const int Ts[] = {256, 4096};
    float *tau = malloc(sizeof(float) * L * N), *rho = malloc(sizeof(float) * L * N);
    for (int i = 0; i < L * N; i++) {
        tau[i] = 1.0f - (float)K / N; /* scores uniform in [0, 1): ~k/n of them at or above τ */
        rho[i] = tau[i] - 0.5f * (float)K / N;
    }
    d_tau = bdev(sizeof(float) * L * N), d_rho = bdev(sizeof(float) * L * N), d_c = bdev(sizeof(uint32_t) * L * 2 * N);
    BK(st_gpu_memcpy_h2d(d_tau, tau, sizeof(float) * L * N));
    BK(st_gpu_memcpy_h2d(d_rho, rho, sizeof(float) * L * N));
    BK(st_gpu_host_alloc((void **)&h_c, sizeof(uint32_t) * L * 2 * N));
    st_qtable_t tab = {.version = 1, .n_layers = L, .n_experts = N, .tau = tau, .rho = rho};
    size_t cap = (size_t)1 << 24, len = 0; /* every layer in one summary: the packing of all 92 */
    uint8_t *buf = malloc(cap);
    st_qsum_t *qb = NULL;
    BK(st_qsum_create(L, N, K, 4096, &qb));
    BK(st_qsum_set_budget(qb, cap));
    double res[2] = {0, 0};
    for (size_t ti = 0; ti < 2; ti++) {
        int T = Ts[ti];
        d_s = bdev(sizeof(float) * L * T * N);
        BK(st_cuda_fill_uniform(&bs, d_s, false, (size_t)L * T * N, 0.f, 1.f, 7 + T));
        double ms;
        BTIME(ms, 10, step(T));
        res[ti] = ms;
        BK(st_gpu_stream_sync(&bs));
        /* host side from the copied counts: the packing of the 92 layers (median of 5) */
        double pk[5];
        for (int r = 0; r < 5; r++) {
            double t0 = now_ms();
            BK(st_qsum_begin(qb, buf, cap, 1, (uint64_t)r + 1, &tab));
            for (int l = 0; l < L; l++)
                BK(st_qsum_add_layer_counts(qb, (uint32_t)l, (uint32_t)T, h_c + (size_t)l * 2 * N, h_c + (size_t)l * 2 * N + N));
            BK(st_qsum_finish(qb, &len));
            pk[r] = now_ms() - t0;
        }
        for (int a = 1; a < 5; a++)
            for (int b = a; b > 0 && pk[b - 1] > pk[b]; b--) {
                double x = pk[b]; pk[b] = pk[b - 1]; pk[b - 1] = x;
            }
        /* the CPU path it replaces: the scores to the host, st_qsum_add_layer (one run) */
        float *hs = malloc(sizeof(float) * (size_t)T * N);
        double cpu = 0;
        BK(st_qsum_begin(qb, buf, cap, 1, 99, &tab));
        for (int l = 0; l < L; l++) {
            BK(st_gpu_memcpy_d2h(hs, d_s + (size_t)l * T * N, sizeof(float) * (size_t)T * N));
            double t0 = now_ms();
            BK(st_qsum_add_layer(qb, (uint32_t)l, hs, (uint32_t)T));
            cpu += now_ms() - t0;
        }
        BK(st_qsum_finish(qb, &len));
        if (st_qsum_last_sections(qb) != L) {
            fprintf(stderr, "FATAL: %u of %d layers in the summary\n", st_qsum_last_sections(qb), L);
            return 1;
        }
        free(hs);
        printf("T %4d: GPU counts + copies %.4f ms per step (%d layers x %d experts, every layer probed; budget 1 ms %s); "
               "host packing of the counts %.3f ms; the CPU path from scores %.2f ms (its score copies not counted)\n",
               T, ms, L, N, ms <= 1.0 ? "ok" : "OVER", pk[2], cpu);
        st_gpu_free(d_s);
    }
    printf("RESULT k3_worker_gpu_ms_per_step %.4f ms (T 256, decode; budget 1 ms)\n", res[0]);
    printf("RESULT k3_worker_gpu_ms_per_step_t4096 %.4f ms (T 4096, prefill; budget 1 ms)\n", res[1]);
    st_qsum_destroy(qb);
    st_gpu_host_free(h_c);
    st_gpu_free(d_tau), st_gpu_free(d_rho), st_gpu_free(d_c);
    free(tau), free(rho), free(buf);
    return 0;
}
