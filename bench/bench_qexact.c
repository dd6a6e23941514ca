/* Benchmark of common/quantile: summary bytes per worker per step, worker build time, and
 * coordinator merge + end_step time per step, at tiny / small / K3 shapes, decode and prefill
 * token counts, 1 / 8 / 64 workers; compared with a dense 1000-bin fp32 histogram per expert.
 * A program that prints figures, not a test. Usage: bench_quantile [max_entries_per_step_M] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/base.h"
#include "strata/quantile.h"

#define POOL (1u << 24)

static float *g_pool; /* logistic(normal) scores, drawn once */

/* Scores of one (worker, layer): a window of the pool plus a per-expert skew (some hot experts). */
static void gen(float *s, uint32_t T, uint32_t n, st_rng_t *r) {
    uint32_t off = (uint32_t)(st_rng_next(r) % POOL);
    for (uint32_t t = 0; t < T; t++)
        for (uint32_t j = 0; j < n; j++) {
            float v = g_pool[(off + (size_t)t * n + j) % POOL] + 0.03f * (float)(j % 11) + (j % 97 == 5 ? 0.2f : 0.f);
            s[(size_t)t * n + j] = v;
        }
}

typedef struct { const char *name; uint32_t n, L, k; } shape_t;

int main(int argc, char **argv) {
    double max_pts = argc > 1 ? atof(argv[1]) * 1e6 : 150e6; /* skip runs gathering more points per step */
    const shape_t shapes[] = {{"tiny", 16, 7, 4}, {"small", 64, 11, 8}, {"K3", 896, 92, 16}};
    const uint32_t Ts[] = {1, 32, 256, 4096}, Ws[] = {1, 8, 64};
    g_pool = malloc(sizeof(float) * POOL);
    st_rng_t r = {12345};
    for (uint32_t i = 0; i < POOL; i++) g_pool[i] = (float)(1.0 / (1.0 + exp(-(double)st_rng_normal(&r) - 1.0)));
    printf("# bench_quantile: lambda=0.9, 6 warm-up steps then 3 timed steps; distinct summaries per step = W (8 at T=4096)\n");
    printf("# B/worker: summary bytes per worker per step; x smaller: dense 1000-bin histogram / that; build ms: worker,\n"
           "# all layers; coord ms: merge of W summaries + end_step; coord MB: state memory; exact %%: set taus certified\n"
           "# exact; max bound: largest certified rank-error bound, %% of target (a worst case, not the error; unset: too\n"
           "# little data for a threshold yet, SPEC 7)\n");
    printf("# %-5s %5s %4s %3s | %11s %9s %7s | %10s %10s | %9s %8s %9s\n", "shape", "T", "W", "k", "B/worker", "x smaller", "B/tok",
           "build ms", "coord ms", "coord MB", "exact %", "max bound");
    for (size_t si = 0; si < ST_ARRAY_LEN(shapes); si++) {
        const shape_t *sh = &shapes[si];
        double dense = (double)sh->n * 1000 * 4 * sh->L;
        for (size_t ti = 0; ti < ST_ARRAY_LEN(Ts); ti++) {
            uint32_t T = Ts[ti];
            size_t cap = st_qxsum_max_bytes(sh->L, sh->n, sh->k, T);
            for (size_t wi = 0; wi < ST_ARRAY_LEN(Ws); wi++) {
                uint32_t W = Ws[wi], D = T >= 4096 && W > 8 ? 8 : W;
                double est_pts = 2.0 * W * T * sh->k * sh->L; /* ~1.5-2 kT listed per layer per worker */
                if (est_pts > max_pts) {
                    printf("  %-5s %5u %4u %3u | skipped: ~%.0fM listed scores per step to gather (raise the limit: arg 1)\n",
                           sh->name, T, W, sh->k, est_pts / 1e6);
                    continue;
                }
                uint8_t *buf = malloc(cap * D);
                size_t len[64];
                float *sc = malloc(sizeof(float) * (size_t)T * sh->n);
                st_qxsum_t *b;
                st_qxstate_t *q;
                st_qxstate_opts_t o;
                st_qxstate_opts_default(&o);
                o.max_summaries = 64;
                uint64_t per_expert = (uint64_t)W * (2ull * sh->k * T / sh->n + 64);
                o.max_step_entries = (uint32_t)(per_expert < (1u << 16) ? (1u << 16) : per_expert * 2);
                if (st_qxsum_create(sh->L, sh->n, sh->k, T, &b) != ST_OK ||
                    st_qxstate_create(sh->L, sh->n, sh->k, 0.9, &o, &q) != ST_OK) {
                    printf("  %-5s %5u %4u: create failed: %s\n", sh->name, T, W, st_err_last());
                    free(buf); free(sc);
                    continue;
                }
                double bytes = 0, t_build = 0, t_coord = 0;
                int timed = 0, ok = 1;
                for (int step = 0; step < 9 && ok; step++) {
                    st_qtable_t th;
                    st_qxstate_table(q, &th);
                    double bsum = 0;
                    for (uint32_t d = 0; d < D; d++) {
                        double tb = 0;
                        st_qxsum_begin(b, buf + d * cap, cap, d, (uint64_t)step, &th);
                        for (uint32_t l = 0; l < sh->L; l++) {
                            gen(sc, T, sh->n, &r);
                            double t0 = st_time_sec();
                            if (st_qxsum_add_layer(b, l, sc, T) != ST_OK) ok = 0;
                            tb += st_time_sec() - t0;
                        }
                        st_qxsum_finish(b, &len[d]);
                        bsum += (double)len[d];
                        if (step >= 6) t_build += tb / D;
                    }
                    double t0 = st_time_sec();
                    for (uint32_t w = 0; w < W; w++)
                        if (st_qxstate_merge(q, buf + (w % D) * cap, len[w % D]) != ST_OK) ok = 0;
                    st_qxstate_end_step(q, NULL);
                    double dt = st_time_sec() - t0;
                    if (step >= 6) { bytes += bsum / D; t_coord += dt; timed++; }
                }
                st_qxstate_stats_t stt;
                st_qxstate_stats(q, &stt);
                if (!ok) printf("  %-5s %5u %4u: error: %s\n", sh->name, T, W, st_err_last());
                else
                {
                    char ex[32], me[32];
                    if (stt.n_set) {
                        snprintf(ex, sizeof ex, "%.1f", 100.0 * stt.n_exact / stt.n_set);
                        snprintf(me, sizeof me, "%.3f", 100.0 * stt.max_rel_uncert);
                    } else {
                        snprintf(ex, sizeof ex, "unset");
                        snprintf(me, sizeof me, "-");
                    }
                    printf("  %-5s %5u %4u %3u | %11.0f %9.0f %7.1f | %10.3f %10.3f | %9.1f %8s %9s\n", sh->name, T, W, sh->k,
                           bytes / timed, dense / (bytes / timed), bytes / timed / T, 1e3 * t_build / timed,
                           1e3 * t_coord / timed, stt.state_bytes / 1048576.0, ex, me);
                }
                fflush(stdout);
                st_qxstate_destroy(q);
                st_qxsum_destroy(b);
                free(buf); free(sc);
            }
        }
        printf("  (%s dense 1000-bin fp32 histogram baseline: %.0f B per worker per step)\n", sh->name, dense);
    }
    free(g_pool);
    return 0;
}
