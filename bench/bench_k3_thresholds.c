/* Global quantile thresholds at K3 scale (issue 16 item 1): the counting estimator of
 * common/quantile with K3's shape (92 MoE layers x 896 experts, k 16, k_max 32) on a synthetic
 * skewed router. Prints each figure next to its budget, how cost grows with workers, tokens and
 * layers, and ends with the RESULT lines. A program that prints figures, not a test.
 *
 *   build/bin/bench_k3_thresholds            # full run, ~2-4 min of one core
 *   build/bin/bench_k3_thresholds --quick    # smaller scaling table and balance window
 *   build/bin/bench_k3_thresholds --exact    # also the exact estimator's balance (slow)
 *
 * CPU figures are thread CPU time (clock_gettime THREAD_CPUTIME), so other load on a shared
 * machine inflates them less than wall time; wall time is printed beside. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "qsynth.h"
#include "strata/base.h"
#include "strata/quantile.h"
#ifdef ST_BENCH_PROTO
#include "strata/proto.h"
#endif

#define K3_L 92
#define K3_N 896
#define K3_K 16
#define KMAX 32
#define POOL_T 4096
#define POOL_BLOCKS 6

#define BUDGET_COORD_MS 50.0
#define BUDGET_BYTES 65536.0

static double cpu_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* A pool of K3 router scores, drawn once: block b = [POOL_T, n]. Worker w's layer l at step s
 * reads T rows from a block and offset that vary with (w, l, s): the load is stationary, which
 * is what a cost measurement needs (balance under drift is measured separately below). */
typedef struct {
    float *blk[POOL_BLOCKS];
} pool_t;

static const float *pool_rows(const pool_t *p, uint32_t w, uint32_t l, uint32_t s, uint32_t T) {
    uint32_t b = (w * 7 + l * 3 + s) % POOL_BLOCKS;
    uint32_t span = POOL_T - T + 1, off = (uint32_t)(((uint64_t)w * 2654435761u + l * 40503u + s * 977u) % span);
    return p->blk[b] + (size_t)off * K3_N;
}

typedef struct {
    double coord_cpu_ms, coord_wall_ms;     /* per step: merge of every summary + end_step */
    double bytes_mean, bytes_max;           /* per worker per step */
    double layers_mean;                     /* layers per summary */
    double build_ms;                        /* one worker's summary, all its layers (CPU) */
    double state_mb;
} cost_t;

/* W workers x T tokens on L layers: `steps` steps, the last `timed` timed. */
static int run_cost(const pool_t *pool, uint32_t W, uint32_t T, uint32_t L, int steps, int timed, cost_t *out) {
    st_qstate_t *q = NULL;
    if (st_qstate_create(L, K3_N, K3_K, 0.9, NULL, &q) != ST_OK) {
        fprintf(stderr, "create: %s\n", st_err_last());
        return -1;
    }
    size_t cap = st_qsum_max_bytes(L, K3_N, K3_K, T);
    uint8_t *bufs = malloc(cap * W);
    size_t *lens = malloc(sizeof(size_t) * W);
    /* one builder per worker: each keeps its own layer rotation */
    st_qsum_t **bs = calloc(W, sizeof *bs);
    for (uint32_t w = 0; w < W; w++) st_qsum_create(L, K3_N, K3_K, T, &bs[w]);
    memset(out, 0, sizeof *out);
    st_qtable_t th = {0};
    int n_t = 0;
    for (int s = 0; s < steps; s++) {
        double build = 0, bsum = 0, bmax = 0, lay = 0;
        for (uint32_t w = 0; w < W; w++) {
            double t0 = cpu_s();
            st_qsum_begin(bs[w], bufs + w * cap, cap, w + 1, (uint64_t)s, th.version ? &th : NULL);
            for (uint32_t l = 0; l < L; l++) st_qsum_add_layer(bs[w], l, pool_rows(pool, w, l, (uint32_t)s, T), T);
            st_qsum_finish(bs[w], &lens[w]);
            build += cpu_s() - t0;
            bsum += (double)lens[w];
            bmax = fmax(bmax, (double)lens[w]);
            lay += st_qsum_last_sections(bs[w]);
        }
        double c0 = cpu_s(), w0 = st_time_sec();
        for (uint32_t w = 0; w < W; w++)
            if (st_qstate_merge(q, bufs + w * cap, lens[w]) != ST_OK) fprintf(stderr, "merge: %s\n", st_err_last());
        st_qstate_end_step(q, &th);
        double c1 = cpu_s(), w1 = st_time_sec();
        if (s >= steps - timed) {
            out->coord_cpu_ms += 1e3 * (c1 - c0);
            out->coord_wall_ms += 1e3 * (w1 - w0);
            out->bytes_mean += bsum / W;
            out->bytes_max = fmax(out->bytes_max, bmax);
            out->layers_mean += lay / W;
            out->build_ms += 1e3 * build / W;
            n_t++;
        }
    }
    out->coord_cpu_ms /= n_t;
    out->coord_wall_ms /= n_t;
    out->bytes_mean /= n_t;
    out->layers_mean /= n_t;
    out->build_ms /= n_t;
    st_qstate_stats_t st;
    st_qstate_stats(q, &st);
    out->state_mb = (double)st.state_bytes / 1048576.0;
    for (uint32_t w = 0; w < W; w++) st_qsum_destroy(bs[w]);
    free(bs); free(bufs); free(lens);
    st_qstate_destroy(q);
    return 0;
}

/* ---------------- balance under drift (the test_qbalance load, one layer) ---------------- */
static void route_q(const float *s, const float *tau, double *load) {
    int idx[K3_N], c = 0;
    for (int j = 0; j < K3_N; j++)
        if (s[j] >= tau[j]) idx[c++] = j;
    if (c > KMAX) {
        for (int a = 0; a < KMAX; a++) {
            int m = a;
            for (int z = a + 1; z < c; z++) {
                float dz = s[idx[z]] - tau[idx[z]], dm = s[idx[m]] - tau[idx[m]];
                if (dz > dm || (dz == dm && idx[z] < idx[m])) m = z;
            }
            int t = idx[a]; idx[a] = idx[m]; idx[m] = t;
        }
        c = KMAX;
    }
    for (int a = 0; a < c; a++) load[idx[a]] += 1;
}
static void route_topk(const float *s, double *load) {
    float v[K3_K];
    int id[K3_K], m = 0;
    for (int j = 0; j < K3_N; j++) {
        float x = s[j];
        if (m == K3_K && !(x > v[K3_K - 1])) continue;
        int z = m < K3_K ? m++ : K3_K - 1;
        while (z > 0 && v[z - 1] < x) { v[z] = v[z - 1]; id[z] = id[z - 1]; z--; }
        v[z] = x;
        id[z] = j;
    }
    for (int a = 0; a < K3_K; a++) load[id[a]] += 1;
}
static void spread(const double *ld, double *mx, double *mn) {
    double mean = 0;
    for (int j = 0; j < K3_N; j++) mean += ld[j];
    mean /= K3_N;
    *mx = 0;
    *mn = INFINITY;
    for (int j = 0; j < K3_N; j++) { *mx = fmax(*mx, ld[j] / mean); *mn = fmin(*mn, ld[j] / mean); }
}

typedef struct { double mx, mn, mxx, mnx, mxk, tokens; } bal_t;

static void run_balance(uint32_t W, uint32_t T, double lambda, double period, int warm, int meas, int lag, int exact, bal_t *o) {
    st_qsynth_opts_t so;
    st_qsynth_opts_default(&so, 1, K3_N);
    so.period = period;
    st_qsynth_t *sy;
    st_qsynth_create(&so, &sy);
    st_qstate_t *q;
    st_qsum_t *b;
    st_qxstate_t *qx = NULL;
    st_qxsum_t *bx = NULL;
    st_qstate_create(1, K3_N, K3_K, lambda, NULL, &q);
    st_qsum_create(1, K3_N, K3_K, T, &b);
    st_qxstate_opts_t xo;
    st_qxstate_opts_default(&xo);
    xo.max_step_entries = 1u << 20;
    if (exact) {
        st_qxstate_create(1, K3_N, K3_K, lambda, &xo, &qx);
        st_qxsum_create(1, K3_N, K3_K, T, &bx);
    }
    size_t cap = st_qsum_max_bytes(1, K3_N, K3_K, T), capx = st_qxsum_max_bytes(1, K3_N, K3_K, T), len;
    uint8_t *buf = malloc(cap), *bufx = exact ? malloc(capx * W) : NULL;
    float *sc = malloc(sizeof(float) * (size_t)W * T * K3_N);
    double *lq = calloc(K3_N, sizeof(double)), *lx = calloc(K3_N, sizeof(double)), *lk = calloc(K3_N, sizeof(double));
    st_qtable_t h[8] = {{0}}, hx[8] = {{0}};
    st_rng_t rng = {42};
    o->tokens = 0;
    for (int s = 0; s < warm + meas; s++) {
        st_qsynth_scores(sy, 0, s, sc, W * T, &rng);
        const st_qtable_t *th = &h[lag], *thx = &hx[lag];
        if (s >= warm && th->version && st_qtau_is_set(th->tau[0])) {
            o->tokens += (double)W * T;
            for (size_t t = 0; t < (size_t)W * T; t++) {
                route_q(sc + t * K3_N, th->tau, lq);
                route_topk(sc + t * K3_N, lk);
                if (exact && thx->version && st_qtau_is_set(thx->tau[0])) route_q(sc + t * K3_N, thx->tau, lx);
            }
        }
        for (uint32_t w = 0; w < W; w++) {
            st_qsum_begin(b, buf, cap, w + 1, s, th->version ? th : NULL);
            st_qsum_add_layer(b, 0, sc + (size_t)w * T * K3_N, T);
            st_qsum_finish(b, &len);
            st_qstate_merge(q, buf, len);
            if (exact) {
                st_qxsum_begin(bx, bufx + w * capx, capx, w + 1, s, thx->version ? thx : NULL);
                st_qxsum_add_layer(bx, 0, sc + (size_t)w * T * K3_N, T);
                st_qxsum_finish(bx, &len);
                st_qxstate_merge(qx, bufx + w * capx, len);
            }
        }
        memmove(h + 1, h, sizeof(st_qtable_t) * 7);
        st_qstate_end_step(q, &h[0]);
        if (exact) {
            memmove(hx + 1, hx, sizeof(st_qtable_t) * 7);
            st_qxstate_end_step(qx, &hx[0]);
        }
    }
    spread(lq, &o->mx, &o->mn);
    spread(lk, &o->mxk, &(double){0});
    o->mxx = o->mnx = NAN;
    if (exact) spread(lx, &o->mxx, &o->mnx);
    free(buf); free(bufx); free(sc); free(lq); free(lx); free(lk);
    st_qsum_destroy(b); st_qstate_destroy(q); st_qxsum_destroy(bx); st_qxstate_destroy(qx); st_qsynth_destroy(sy);
}

int main(int argc, char **argv) {
    int quick = 0, exact = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--exact")) exact = 1;
        else { fprintf(stderr, "usage: bench_k3_thresholds [--quick] [--exact]\n"); return 2; }
    }
    st_log_set_level(ST_LOG_WARN);
    printf("# bench_k3_thresholds: counting estimator, K3 shape %d MoE layers x %d experts, k %d, k_max %d%s\n", K3_L, K3_N, K3_K,
           KMAX, quick ? " (--quick)" : "");
    st_qsynth_opts_t so;
    st_qsynth_opts_default(&so, 1, K3_N);
    printf("# synthetic router: sigmoid(skew + heat + token shift + N(0,1)); skew sd %.2f, token sd %.2f, hot amplitude %.2f logit,"
           " %.0f%% of experts in a bump at a time\n", so.skew_sd, so.token_sd, so.hot_amp, 100 * so.hot_frac);
    st_qsynth_t *sy;
    st_qsynth_create(&so, &sy);
    pool_t pool;
    st_rng_t rng = {7};
    for (int i = 0; i < POOL_BLOCKS; i++) {
        pool.blk[i] = malloc(sizeof(float) * (size_t)POOL_T * K3_N);
        st_qsynth_scores(sy, 0, 100.0 * i, pool.blk[i], POOL_T, &rng);
    }
    st_qsynth_destroy(sy);

    /* ---- worker side: CPU reference of the summary builder ---- */
    {
        st_qstate_t *q;
        st_qsum_t *b;
        st_qstate_opts_t o;
        st_qstate_opts_default(&o);
        st_qstate_create(K3_L, K3_N, K3_K, 0.9, &o, &q);
        const uint32_t Ts[] = {256, 4096};
        printf("\n## worker: summary of one step, all %d layers, one CPU core (the GPU does this in the router epilogue)\n", K3_L);
        for (int ti = 0; ti < 2; ti++) {
            uint32_t T = Ts[ti];
            st_qsum_create(K3_L, K3_N, K3_K, T, &b);
            st_qsum_set_budget(b, 1u << 30); /* every layer: the cost of the full summary */
            size_t cap = 4u << 20, len;
            uint8_t *buf = malloc(cap);
            st_qtable_t th = {0};
            /* settle a table first (init, then counts) so every layer has tau and 1 in 4 a probe */
            for (int s = 0; s < 7; s++) {
                st_qsum_begin(b, buf, cap, 1, s, th.version ? &th : NULL);
                for (uint32_t l = 0; l < K3_L; l++) st_qsum_add_layer(b, l, pool_rows(&pool, 1, l, s, T), T);
                st_qsum_finish(b, &len);
                st_qstate_merge(q, buf, len);
                st_qstate_end_step(q, &th);
            }
            double t_sum = 0, t_cnt = 0;
            int reps = T == 256 ? 8 : 2;
            uint32_t *c = malloc(4 * K3_N), *bd = malloc(4 * K3_N);
            for (int r = 0; r < reps; r++) {
                double t0 = cpu_s();
                st_qsum_begin(b, buf, cap, 1, 10 + r, &th);
                for (uint32_t l = 0; l < K3_L; l++) st_qsum_add_layer(b, l, pool_rows(&pool, 1, l, r, T), T);
                st_qsum_finish(b, &len);
                double t1 = cpu_s();
                for (uint32_t l = 0; l < K3_L; l++) {
                    const float *rho = th.rho + (size_t)l * K3_N;
                    st_qsum_count_layer(pool_rows(&pool, 1, l, r, T), T, K3_N, th.tau + (size_t)l * K3_N,
                                        st_qtau_is_set(rho[0]) ? rho : NULL, c, bd);
                }
                t_sum += t1 - t0;
                t_cnt += cpu_s() - t1;
            }
            printf("  T=%4u: %.2f ms per step (counting alone %.2f ms, %.3f ns per score), %zu B for all %d layers\n", T,
                   1e3 * t_sum / reps, 1e3 * t_cnt / reps, 1e9 * t_cnt / reps / ((double)T * K3_N * K3_L), len, K3_L);
            free(c); free(bd); free(buf);
            st_qsum_destroy(b);
        }
        st_qstate_destroy(q);
    }

    /* ---- the two budget shapes ---- */
    cost_t dec, pre;
    printf("\n## coordinator and bytes at the budget shapes (settled: after init and %d count steps)\n", 6);
    run_cost(&pool, 64, 256, K3_L, 10, 3, &dec);
    run_cost(&pool, 8, 4096, K3_L, 10, 3, &pre);
    printf("  %-26s %12s %12s %14s %14s %12s %10s\n", "shape", "coord CPU ms", "coord wall", "B/worker mean", "B/worker max",
           "layers/sum", "state MB");
    printf("  %-26s %12.2f %12.2f %14.0f %14.0f %12.1f %10.1f\n", "decode 64 x 256", dec.coord_cpu_ms, dec.coord_wall_ms,
           dec.bytes_mean, dec.bytes_max, dec.layers_mean, dec.state_mb);
    printf("  %-26s %12.2f %12.2f %14.0f %14.0f %12.1f %10.1f\n", "prefill 8 x 4096", pre.coord_cpu_ms, pre.coord_wall_ms,
           pre.bytes_mean, pre.bytes_max, pre.layers_mean, pre.state_mb);
    printf("  budget: coordinator <= %.0f ms of one core per step: decode %.2f ms (%s), prefill %.2f ms (%s)\n", BUDGET_COORD_MS,
           dec.coord_cpu_ms, dec.coord_cpu_ms <= BUDGET_COORD_MS ? "ok" : "OVER", pre.coord_cpu_ms,
           pre.coord_cpu_ms <= BUDGET_COORD_MS ? "ok" : "OVER");
    printf("  budget: <= %.0f B per worker per step (summary): decode max %.0f B (%s), prefill max %.0f B (%s)\n", BUDGET_BYTES,
           dec.bytes_max, dec.bytes_max <= BUDGET_BYTES ? "ok" : "OVER", pre.bytes_max, pre.bytes_max <= BUDGET_BYTES ? "ok" : "OVER");
    printf("  worker CPU build (the reference; the GPU budget is 1 ms in the router epilogue): decode %.2f ms, prefill %.2f ms per step\n",
           dec.build_ms, pre.build_ms);

#ifdef ST_BENCH_PROTO
    /* ---- what travels around the estimator (the landed coordinator/worker messages) ---- */
    {
        /* Thresholds: tau for every layer, rho only for the probed layers (1 in probe_every once settled) */
        size_t cells = (size_t)K3_L * K3_N, n, n_all;
        float *tau = malloc(sizeof(float) * cells), *rho = malloc(sizeof(float) * cells);
        uint32_t rl[K3_L];
        size_t nrl = 0;
        for (size_t i = 0; i < cells; i++) tau[i] = 0.9f + 1e-6f * (float)(i % 97), rho[i] = tau[i] - 0.01f;
        for (uint32_t l = 0; l < K3_L; l += 4) rl[nrl++] = l;
        st_proto_thresholds_t t = {.version = 9, .n_layers = K3_L, .n_experts = K3_N, .tau = tau, .rho = rho,
                                   .n_rho = nrl * K3_N, .n_rho_layers = nrl, .rho_layers = rl};
        uint8_t *out;
        double c0 = cpu_s();
        int reps = 10;
        for (int r = 0; r < reps; r++) {
            st_proto_thresholds_encode(&t, &out, &n);
            if (r < reps - 1) free(out);
        }
        double enc = (cpu_s() - c0) / reps;
        free(out);
        t.n_rho = cells, t.n_rho_layers = 0, t.rho_layers = NULL; /* the whole-table form, for comparison */
        st_proto_thresholds_encode(&t, &out, &n_all);
        free(out);
        /* ReportScores as the worker builds it: the summaries, then whole layers of loads while the
         * message stays under 64 KB (attention_worker/worker.c REPORT_BUDGET) */
        uint32_t *load = malloc(sizeof(uint32_t) * cells);
        for (size_t i = 0; i < cells; i++) load[i] = (uint32_t)(i * 2654435761u % 10);
        size_t sum_len = (size_t)dec.bytes_max, n2, n3;
        uint8_t *fake = calloc(1, sum_len + 1);
        const uint8_t *sums[1] = {fake};
        size_t lens[1] = {sum_len};
        size_t room = 65536 - 1024 > sum_len + 4 ? 65536 - 1024 - sum_len - 4 : 0, layers = room / K3_N; /* 1-byte varints */
        layers = layers > K3_L ? K3_L : layers;
        st_proto_scores_t r = {.worker_id = 1, .step = 1, .n_layers = K3_L, .n_experts = K3_N, .summaries = sums, .summary_lens = lens,
                               .n_summaries = 1, .load = load, .n_load = layers * K3_N};
        st_proto_scores_encode(&r, &out, &n2);
        free(out);
        r.load = load, r.n_load = cells;
        st_proto_scores_encode(&r, &out, &n3);
        free(out);
        printf("\n## around the estimator (the coordinator's and worker's messages)\n");
        printf("  Thresholds reply (tau every layer, rho for the %zu probed layers): %zu B (every rho row: %zu B), encoded in %.2f ms;\n"
               "  64 workers fetching every version: %.1f ms of coordinator CPU and %.1f MB per step\n",
               nrl, n, n_all, 1e3 * enc, 64e3 * enc, 64.0 * (double)n / 1e6);
        printf("  ReportScores, the decode summary (%zu B) + loads of %zu layers (the rest follow in the next reports): %zu B "
               "(budget 65536: %s); with every layer's loads it would be %zu B\n",
               sum_len, layers, n2, n2 <= 65536 ? "ok" : "OVER", n3);
        free(tau); free(rho); free(load); free(fake);
    }
#endif

    /* ---- scaling ---- */
    printf("\n## how the cost grows (coordinator CPU ms per step; bytes per worker per step, mean / max; layers per summary)\n");
    printf("  %-30s %10s %12s %12s %10s\n", "W x T, layers", "coord ms", "B mean", "B max", "layers");
    const uint32_t Ws[] = {8, 16, 32, 64, 128}, Tq[] = {1, 32, 256, 1024, 4096}, Ls[] = {23, 46, 92};
    for (size_t i = 0; i < ST_ARRAY_LEN(Ws); i++) {
        if (quick && (Ws[i] == 16 || Ws[i] == 128)) continue;
        cost_t c;
        run_cost(&pool, Ws[i], 256, K3_L, 8, 2, &c);
        printf("  %4u x %4u, %2d layers %10s %10.2f %12.0f %12.0f %10.1f\n", Ws[i], 256, K3_L, "(workers)", c.coord_cpu_ms,
               c.bytes_mean, c.bytes_max, c.layers_mean);
    }
    for (size_t i = 0; i < ST_ARRAY_LEN(Tq); i++) {
        if (quick && (Tq[i] == 32 || Tq[i] == 1024)) continue;
        cost_t c;
        run_cost(&pool, 8, Tq[i], K3_L, 8, 2, &c);
        printf("  %4u x %4u, %2d layers %10s %10.2f %12.0f %12.0f %10.1f\n", 8, Tq[i], K3_L, "(tokens)", c.coord_cpu_ms, c.bytes_mean,
               c.bytes_max, c.layers_mean);
    }
    for (size_t i = 0; i < ST_ARRAY_LEN(Ls); i++) {
        cost_t c;
        run_cost(&pool, 64, 256, Ls[i], 8, 2, &c);
        printf("  %4u x %4u, %2u layers %10s %10.2f %12.0f %12.0f %10.1f\n", 64, 256, Ls[i], "(layers)", c.coord_cpu_ms, c.bytes_mean,
               c.bytes_max, c.layers_mean);
    }

    /* ---- balance under drift at the K3 per-layer shape ---- */
    printf("\n## balance: per-expert load of quantile routing (k_max %d) over the measured steps, one K3 layer, hot experts drifting,\n"
           "## workers routing with the table published after the counts of two steps before (lag 2)\n", KMAX);
    bal_t bd, bp;
    int warm = 30, meas = quick ? 20 : 40;
    run_balance(64, 256, 0.9, 6000, warm, meas, 1, exact, &bd);
    run_balance(8, 4096, 0.5, 1000, 20, quick ? 12 : 24, 1, exact, &bp);
    double nd = sqrt((1 - (double)K3_K / K3_N) / (bd.tokens * K3_K / K3_N)), np = sqrt((1 - (double)K3_K / K3_N) / (bp.tokens * K3_K / K3_N));
    printf("  decode  64 x  256, lambda 0.9, bumps of 600 steps: max/mean %.4f min/mean %.4f (exact: %.4f %.4f; top-k max/mean %.2f);"
           " N %.0f tokens, noise 1 sd %.2f%%\n", bd.mx, bd.mn, bd.mxx, bd.mnx, bd.mxk, bd.tokens, 100 * nd);
    printf("  prefill  8 x 4096, lambda 0.5, bumps of 100 steps: max/mean %.4f min/mean %.4f (exact: %.4f %.4f; top-k max/mean %.2f);"
           " N %.0f tokens, noise 1 sd %.2f%%\n", bp.mx, bp.mn, bp.mxx, bp.mnx, bp.mxk, bp.tokens, 100 * np);
    printf("  budget: every expert within +-10%% of (k/n)N: decode %s, prefill %s\n",
           bd.mx <= 1.10 && bd.mn >= 0.90 ? "ok" : "FAILED", bp.mx <= 1.10 && bp.mn >= 0.90 ? "ok" : "FAILED");

    printf("\nRESULT k3_coord_ms_per_step %.2f\n", dec.coord_cpu_ms);
    printf("RESULT k3_worker_bytes_per_step %.0f\n", dec.bytes_max);
    printf("RESULT k3_balance_max_over_mean %.4f\n", bd.mx);
    for (int i = 0; i < POOL_BLOCKS; i++) free(pool.blk[i]);
    return 0;
}
