/* The worker's share of quantile thresholds on the GPU (issue 16 item 1): per step, at every one of
 * K3's 92 MoE layers (896 experts, top-16: τ puts ~16 experts of a token at or above it, k_max 32 as
 * the engine's default 2k), the quantile router without counts (st_cuda_router_quantile), the same
 * router with the threshold counts made in its pass (st_cuda_router_quantile_count, every layer
 * probed: an upper bound, settled tables probe 1 layer in 4), and that plus the counts' copy to
 * pinned host memory (2 × 896 uint32 per layer), at T 256 (decode) and 4096 (prefill). Counting's
 * cost is the difference, set against the 1 ms budget and against the roofline of the separate pass
 * it replaced (one read of the [T, n] fp32 scores of every layer at 4.2 TB/s). Logits are distinct per
 * layer (not L2-resident) and refilled, untimed, before every timed step (the router writes σ in
 * place). Beside it, the host side of the same summary: st_qsum_add_layer_counts for the 92 layers
 * (packing only) and, for reference, the CPU path it replaces (st_qsum_add_layer from the scores).
 * Run: build-cuda/bin/bench_gpu_route_count   (budget: 1 ms per step on the GPU) */
#include <math.h>
#include <string.h>
#include <time.h>

#include "bench_common.h"
#include "strata/quantile.h"

enum { L = 92, N = 896, K = 16, KMAX = 2 * K, REPS = 11 };
#define HBM_BPS 4.2e12 /* H200 HBM3e, bytes/s */
#define LOGIT_LO -3.0f
#define LOGIT_HI 3.0f

enum { RUN_ROUTER, RUN_COUNT, RUN_COUNT_COPY };
static const char *run_name[] = {"router", "router + counts", "router + counts + copies"};

static float *d_s, *d_tau, *d_rho, *d_w;
static int *d_id, *d_cnt;
static uint32_t *d_c, *h_c;

/* one step of mode m over the 92 layers */
static st_status_t step(int T, int m) {
    for (int l = 0; l < L; l++) {
        float *s = d_s + (size_t)l * T * N;
        const float *tau = d_tau + (size_t)l * N;
        uint32_t *qc = d_c + (size_t)l * 2 * N;
        st_status_t rc = m == RUN_ROUTER
                             ? st_cuda_router_quantile(&bs, d_id, d_w, d_cnt, s, tau, T, N, KMAX, true, 2.5f)
                             : st_cuda_router_quantile_count(&bs, d_id, d_w, d_cnt, s, tau, T, N, KMAX, true, 2.5f, qc,
                                                             d_rho + (size_t)l * N);
        if (rc == ST_OK && m == RUN_COUNT_COPY)
            rc = st_gpu_memcpy_async(&bs, h_c + (size_t)l * 2 * N, qc, 2 * N * sizeof(uint32_t), ST_GPU_COPY_D2H);
        if (rc != ST_OK) return rc;
    }
    return ST_OK;
}

/* median of REPS timed steps of mode m, each from freshly filled logits (2 warm-up steps first), ms */
static double time_step(int T, int m) {
    st_gpu_timer_t t;
    BK(st_gpu_timer_init(&t));
    double v[REPS];
    for (int r = -2; r < REPS; r++) {
        BK(st_cuda_fill_uniform(&bs, d_s, false, (size_t)L * T * N, LOGIT_LO, LOGIT_HI, 7 + T));
        BK(st_gpu_timer_start(&t, &bs));
        BK(step(T, m));
        double ms;
        BK(st_gpu_timer_stop(&t, &bs, &ms));
        if (r >= 0) v[r] = ms;
    }
    st_gpu_timer_cleanup(&t);
    b_sort(v, REPS);
    return v[REPS / 2];
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

int main(void) {
    bench_init("bench_gpu_route_count", 0);
    const int Ts[] = {256, 4096};
    float *tau = malloc(sizeof(float) * L * N), *rho = malloc(sizeof(float) * L * N);
    /* logits uniform in [lo, hi): τ at the logit with a K/N tail (~16 active of 896), ρ at 1.5 K/N
     * (~8 more in the band) */
    const float span = LOGIT_HI - LOGIT_LO;
    for (int i = 0; i < L * N; i++) {
        tau[i] = sigmoid(LOGIT_HI - span * (float)K / N);
        rho[i] = sigmoid(LOGIT_HI - span * 1.5f * (float)K / N);
    }
    d_tau = bdev(sizeof(float) * L * N), d_rho = bdev(sizeof(float) * L * N), d_c = bdev(sizeof(uint32_t) * L * 2 * N);
    d_id = bdev(sizeof(int) * 4096 * KMAX), d_w = bdev(sizeof(float) * 4096 * KMAX), d_cnt = bdev(sizeof(int) * 4096);
    BK(st_gpu_memcpy_h2d(d_tau, tau, sizeof(float) * L * N));
    BK(st_gpu_memcpy_h2d(d_rho, rho, sizeof(float) * L * N));
    BK(st_gpu_host_alloc((void **)&h_c, sizeof(uint32_t) * L * 2 * N));
    st_qtable_t tab = {.version = 1, .n_layers = L, .n_experts = N, .tau = tau, .rho = rho};
    size_t cap = (size_t)1 << 24, len = 0; /* every layer in one summary: the packing of all 92 */
    uint8_t *buf = malloc(cap);
    st_qsum_t *qb = NULL;
    BK(st_qsum_create(L, N, K, 4096, &qb));
    BK(st_qsum_set_budget(qb, cap));
    double res[2][3], added[2] = {0, 0}, roof[2] = {0, 0};
    for (size_t ti = 0; ti < 2; ti++) {
        int T = Ts[ti];
        d_s = bdev(sizeof(float) * L * T * N);
        double *ms = res[ti];
        for (int m = RUN_ROUTER; m <= RUN_COUNT_COPY; m++) ms[m] = time_step(T, m);
        roof[ti] = (double)L * T * N * sizeof(float) / HBM_BPS * 1e3;
        added[ti] = ms[RUN_COUNT_COPY] - ms[RUN_ROUTER];
        printf("T %4d, %d layers x %d experts, k_max %d, every layer probed (median of %d steps):\n", T, L, N, KMAX,
               REPS);
        for (int m = RUN_ROUTER; m <= RUN_COUNT_COPY; m++)
            printf("  %-26s %.4f ms per step\n", run_name[m], ms[m]);
        printf("  counting's cost: %.4f ms in the router, %.4f ms with the copies (budget 1 ms: %.2fx; a separate pass "
               "re-reading the scores: roofline %.4f ms, %.2fx of it)\n",
               ms[RUN_COUNT] - ms[RUN_ROUTER], added[ti], added[ti] / 1.0, roof[ti], added[ti] / roof[ti]);
        /* the counts of the last step are in h_c (RUN_COUNT_COPY ran last): a sanity check on them */
        BK(st_gpu_stream_sync(&bs));
        double at = 0, inband = 0;
        for (int l = 0; l < L; l++)
            for (int j = 0; j < N; j++) at += h_c[(size_t)l * 2 * N + j], inband += h_c[(size_t)l * 2 * N + N + j];
        printf("  per token and layer: %.2f experts at or above tau, %.2f in the band\n", at / ((double)L * T),
               inband / ((double)L * T));
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
        b_sort(pk, 5);
        /* the CPU path it replaces: the scores (σ, as the last step left them) to the host, st_qsum_add_layer */
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
        printf("  host packing of the counts %.3f ms; the CPU path from scores %.2f ms (its score copies not counted)\n",
               pk[2], cpu);
        st_gpu_free(d_s);
    }
    for (int ti = 0; ti < 2; ti++) {
        const char *sfx = ti ? "_t4096" : "", *kind = ti ? "prefill" : "decode";
        printf("RESULT k3_router_ms_per_step%s %.4f ms (T %d, %s: the router alone; %.2fx the 1 ms budget, %.2fx the "
               "%.4f ms roofline of one pass over the scores)\n",
               sfx, res[ti][RUN_ROUTER], Ts[ti], kind, res[ti][RUN_ROUTER] / 1.0, res[ti][RUN_ROUTER] / roof[ti], roof[ti]);
        printf("RESULT k3_router_count_ms_per_step%s %.4f ms (T %d, %s: the router counting, every layer probed; %.2fx "
               "the 1 ms budget, %.2fx the roofline)\n",
               sfx, res[ti][RUN_COUNT], Ts[ti], kind, res[ti][RUN_COUNT] / 1.0, res[ti][RUN_COUNT] / roof[ti]);
        printf("RESULT k3_worker_gpu_ms_per_step%s %.4f ms (T %d, %s: counting + copies over the router alone; "
               "%.2fx the 1 ms budget, %.2fx the roofline)\n",
               sfx, added[ti], Ts[ti], kind, added[ti] / 1.0, added[ti] / roof[ti]);
    }
    st_qsum_destroy(qb);
    st_gpu_host_free(h_c);
    st_gpu_free(d_tau), st_gpu_free(d_rho), st_gpu_free(d_c), st_gpu_free(d_id), st_gpu_free(d_w), st_gpu_free(d_cnt);
    free(tau), free(rho), free(buf);
    return 0;
}
