/* The MoE dispatch plan on the GPU (st_cuda_moe_dispatch_plan) against its C version on one host
 * thread (st_moe_dispatch_plan, the worker's st_dispatch_plan_build plus the pair weights its pack
 * gathers), timed in the same run, at an 8K-token prefill (T 8192, top-8 of 64 experts, 1 and 3
 * servers) and at K3's shape (T 4096, top-16 of 896 experts, 8 servers). Routing: every token its kc
 * distinct experts, uniform; contiguous placement, every expert held (no token fails). The GPU figure
 * is the mean of back-to-back launches (stream order, launch cost included) and of replays of a graph
 * holding one plan; the host figure the median of timed builds.
 * Prints `RESULT dispatch_plan_{gpu,graph,host}_us_T<T>_kc<kc>_E<E>_S<S> <µs>` and the ratio host / GPU.
 * Run: build-cuda/bin/bench_gpu_dispatch_plan */
#include <stdbool.h>
#include <string.h>
#include <time.h>

#include "bench_common.h"
#include "strata/kernels.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *xmalloc(size_t b) {
    void *p = malloc(b ? b : 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    return p;
}

/* a plan's tables (with the C scratch for 16 slots a token) in one host or device block */
static st_moe_plan_t plan_tables(int S, int E, int M, bool dev) {
    size_t b = st_moe_plan_bytes(S, E, M, 16);
    st_moe_plan_t p;
    st_moe_plan_carve(&p, S, E, M, 16, dev ? bdev(b) : xmalloc((b + 255) / 256 * 256));
    return p;
}
static void plan_tables_free(st_moe_plan_t *p, bool dev) { dev ? st_gpu_free(p->n_rows) : free(p->n_rows); }

static void run_shape(int T, int kc, int E, int S) {
    const size_t N = (size_t)T * kc;
    int *ids = xmalloc(4 * N), *cnt = xmalloc(4 * (size_t)T), *so = xmalloc(4 * (size_t)E);
    float *wts = xmalloc(4 * N);
    bool *failed = xmalloc((size_t)T);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int t = 0; t < T; t++) {
        bool used[1024] = {false};
        for (int i = 0; i < kc;) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            int e = (int)((x >> 33) % (uint64_t)E);
            if (!used[e]) used[e] = true, i++;
        }
        for (int e = 0, i = 0; e < E; e++)
            if (used[e]) ids[(size_t)t * kc + i] = e, wts[(size_t)t * kc + i] = 1.0f / (float)(i + 1), i++;
        cnt[t] = kc;
        failed[t] = false;
    }
    for (int e = 0; e < E; e++)
        so[e] = (int)((long long)e * S / E);

    /* the host reference: median of 11 builds */
    const int M = (int)N;
    st_moe_plan_t h = plan_tables(S, E, M, false);
    double v[11];
    for (int r = 0; r < 11; r++) {
        double t0 = now_s();
        st_moe_dispatch_plan(&h, ids, cnt, wts, so, failed, T, kc);
        v[r] = now_s() - t0;
    }
    b_sort(v, 11);
    const double host_us = 1e6 * v[5];

    /* the device */
    st_moe_plan_t d = plan_tables(S, E, M, true);
    int *d_ids = bdev(4 * N), *d_cnt = bdev(4 * (size_t)T), *d_so = bdev(4 * (size_t)E);
    float *d_wts = bdev(4 * N);
    uint8_t *d_f = bdev((size_t)T);
    BK(st_gpu_memcpy_h2d(d_ids, ids, 4 * N));
    BK(st_gpu_memcpy_h2d(d_cnt, cnt, 4 * (size_t)T));
    BK(st_gpu_memcpy_h2d(d_so, so, 4 * (size_t)E));
    BK(st_gpu_memcpy_h2d(d_wts, wts, 4 * N));
    BK(st_gpu_memset(d_f, 0, (size_t)T));
    const size_t wsb = st_cuda_moe_dispatch_plan_ws_bytes(T, kc, E, S);
    void *d_ws = bdev(wsb);
    double ms, gms;
    BTIME(ms, 200, st_cuda_moe_dispatch_plan(&bs, &d, d_ids, d_cnt, d_wts, d_so, d_f, T, kc, d_ws, wsb));
    void *ge = NULL;
    BK(st_gpu_capture_begin(&bs));
    BK(st_cuda_moe_dispatch_plan(&bs, &d, d_ids, d_cnt, d_wts, d_so, d_f, T, kc, d_ws, wsb));
    BK(st_gpu_capture_end(&bs, &ge));
    BTIME(gms, 200, st_gpu_graph_launch(ge, &bs));
    st_gpu_graph_destroy(ge);
    /* the figures stand for the plan only if it is the host's */
    int n_rows = 0, n_out = 0;
    for (int s = 0; s < S; s++) {
        int a, b;
        BK(st_gpu_stream_sync(&bs));
        BK(st_gpu_memcpy_d2h(&a, d.n_rows + s, sizeof a));
        BK(st_gpu_memcpy_d2h(&b, d.n_out + s, sizeof b));
        if (a != h.n_rows[s] || b != h.n_out[s]) {
            fprintf(stderr, "server %d: GPU plan %d pairs / %d nodes, host %d / %d\n", s, a, b, h.n_rows[s],
                    h.n_out[s]);
            exit(1);
        }
        n_rows += a, n_out += b;
    }
    char tag[64];
    snprintf(tag, sizeof tag, "T%d_kc%d_E%d_S%d", T, kc, E, S);
    printf("%-24s %8d pairs %8d nodes   host %8.1f us   gpu %6.1f us   graph %6.1f us   host/gpu %5.1fx\n", tag, n_rows,
           n_out, host_us, 1e3 * ms, 1e3 * gms, host_us / (1e3 * ms));
    printf("RESULT dispatch_plan_host_us_%s %.1f us\n", tag, host_us);
    printf("RESULT dispatch_plan_gpu_us_%s %.1f us (host/gpu %.1fx)\n", tag, 1e3 * ms, host_us / (1e3 * ms));
    printf("RESULT dispatch_plan_graph_us_%s %.1f us (host/graph %.1fx)\n", tag, 1e3 * gms, host_us / (1e3 * gms));
    plan_tables_free(&d, true), plan_tables_free(&h, false);
    st_gpu_free(d_ids), st_gpu_free(d_cnt), st_gpu_free(d_so), st_gpu_free(d_wts), st_gpu_free(d_f), st_gpu_free(d_ws);
    free(ids), free(cnt), free(so), free(wts), free(failed);
}

int main(void) {
    bench_init("bench_gpu_dispatch_plan", 0);
    run_shape(8192, 8, 64, 1);
    run_shape(8192, 8, 64, 3);
    run_shape(4096, 16, 896, 8);
    return 0;
}
