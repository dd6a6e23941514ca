/* The attention worker's host work per MoE layer on the data path (attention_worker/dispatch.c):
 * the plan (each token's leaves cut into tree nodes per server, grouped by expert), the pack of each
 * server's dispatch (sources, pairs, distinct rows: fp32 as the CPU engine hands them over, bf16 as
 * the GPU engine does) and the unpack of the replies (node rows pointed to where they lie); and,
 * apart, the CPU engine's finish of each token's tree from those rows (st_moe_finish_nodes; a GPU
 * engine finishes on the device). Shapes: `small` (2 servers, and 1 as bench_afd_1gpu runs it) at batch
 * 1, 32, 256 and an 8K prefill, and K3's widths (d 7168 → ℓ 3584, 896 experts, top-16, 16 expert
 * servers) at batch 1, 32 and 256; random top-k routing, experts placed in
 * contiguous blocks. Each figure is the mean of repeats over at least 0.2 s; the yardstick is memcpy
 * of the bytes the worker moves (the bf16 rows packed) in the same run, one thread (the worker's
 * compute thread does this work alone).
 * Prints a table and `RESULT dispatch_host_us_<shape>_b<T> <µs per layer>` (plan + bf16 pack + unpack)
 * and `RESULT dispatch_host_vs_memcpy_<shape>_b<T> <ratio>` (that time over memcpy of the rows packed).
 * usage: bench_dispatch */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dispatch.h"
#include "strata/base.h"
#include "strata/model.h"

typedef struct {
    const char *name;
    int n_experts, kc, ew, servers, max_T; /* max_T: the largest batch measured */
} shape_t;

/* mean seconds of fn over repeats adding up to at least 0.2 s */
#define TIME_IT(out, body)                                                                                             \
    do {                                                                                                               \
        int reps_ = 0;                                                                                                 \
        double t0_ = st_time_sec(), t_;                                                                                \
        do {                                                                                                           \
            body;                                                                                                      \
            reps_++;                                                                                                   \
        } while ((t_ = st_time_sec() - t0_) < 0.2 || reps_ < 3);                                                       \
        (out) = t_ / reps_;                                                                                            \
    } while (0)

static void run(const shape_t *sh, int T) {
    int E = sh->n_experts, kc = sh->kc, ew = sh->ew, S = sh->servers, P = T * kc;
    st_rng_t r = {.s = 7 + (uint64_t)T};
    float *z = malloc(sizeof(float) * (size_t)T * ew), *wts = malloc(sizeof(float) * (size_t)P);
    uint16_t *zb = malloc(sizeof(uint16_t) * (size_t)T * ew);
    int *ids = malloc(sizeof(int) * (size_t)P), *cnt = malloc(sizeof(int) * (size_t)T),
        *ent = calloc((size_t)T, sizeof(int));
    float *out = malloc(sizeof(float) * (size_t)P * ew), *u = malloc(sizeof(float) * (size_t)T * ew);
    const float **at = calloc((size_t)P, sizeof *at);
    uint32_t *tid = malloc(sizeof(uint32_t) * (size_t)kc);
    int *server_of = malloc(sizeof(int) * (size_t)E);
    bool *failed = calloc((size_t)T, sizeof(bool));
    uint8_t *mark = calloc((size_t)E, 1);
    for (size_t i = 0; i < (size_t)T * ew; i++)
        z[i] = st_rng_normal(&r), zb[i] = st_f32_to_bf16(z[i]);
    for (int t = 0; t < T; t++) { /* kc distinct experts, ascending */
        memset(mark, 0, (size_t)E);
        for (int i = 0; i < kc;) {
            int e = (int)(st_rng_next(&r) % (uint64_t)E);
            if (!mark[e]) mark[e] = 1, i++;
        }
        for (int e = 0, i = 0; e < E; e++)
            if (mark[e]) ids[t * kc + i] = e, wts[t * kc + i] = (float)st_rng_uniform(&r), i++;
        cnt[t] = kc;
    }
    for (int e = 0; e < E; e++)
        server_of[e] = (int)((long)e * S / E);
    st_moe_work_t w = {.layer = 1,
                       .T = T,
                       .kc = kc,
                       .ew = ew,
                       .z = z,
                       .ids = ids,
                       .cnt = cnt,
                       .wts = wts,
                       .tok_ent = ent,
                       .out = out,
                       .at = at};
    st_dispatch_plan_t p;
    if (st_dispatch_plan_init(&p, S, E, P) != ST_OK) {
        fprintf(stderr, "bench_dispatch: %s\n", st_err_last());
        exit(1);
    }
    st_dispatch_plan_build(&p, &w, server_of, failed);
    /* each server's message: sources, pairs, rows (fp32 room, bf16 fits) */
    uint8_t **msg = malloc(sizeof(uint8_t *) * (size_t)S);
    size_t max_out = 1, rows16 = 0, rows32 = 0;
    for (int s = 0; s < S; s++) {
        msg[s] = malloc(16 * ((size_t)P + 1) + sizeof(float) * (size_t)p.n_uniq[s] * ew + 64);
        max_out = ST_MAX(max_out, (size_t)p.n_out[s]);
        rows16 += (size_t)p.n_uniq[s] * ew * 2, rows32 += (size_t)p.n_uniq[s] * ew * 4;
    }
    float **rep = malloc(sizeof(float *) * (size_t)S); /* each server's reply rows */
    for (int s = 0; s < S; s++) {
        rep[s] = malloc(sizeof(float) * max_out * ew);
        for (size_t i = 0; i < (size_t)p.n_out[s] * ew; i++)
            rep[s][i] = st_rng_normal(&r);
    }
    double t_plan, t_pack32, t_pack16, t_unpack, t_finish, t_copy;
    TIME_IT(t_plan, st_dispatch_plan_build(&p, &w, server_of, failed));
#define PACK(zsrc, zbsrc)                                                                                              \
    do {                                                                                                               \
        w.z = (zsrc), w.zb = (zbsrc);                                                                                  \
        for (int s = 0; s < S; s++) {                                                                                  \
            uint32_t *sr = (uint32_t *)msg[s], *orow = sr + P;                                                         \
            st_dispatch_pack(&p, s, &w, sr, orow, (float *)(orow + P), orow + 2 * P);                                  \
        }                                                                                                              \
    } while (0)
    TIME_IT(t_pack32, PACK(z, NULL));
    TIME_IT(t_pack16, PACK(NULL, zb));
    w.z = z, w.zb = NULL;
    TIME_IT(t_unpack, for (int s = 0; s < S; s++) st_dispatch_unpack(&p, s, &w, rep[s], false));
    /* the CPU engine's finish gathers the node rows of tokens with three or more into w->out: unpack
     * again before each */
    double t_both;
    TIME_IT(t_both, {
        for (int s = 0; s < S; s++)
            st_dispatch_unpack(&p, s, &w, rep[s], false);
        st_moe_finish_nodes(u, at, ids, cnt, T, kc, ew, out, tid);
    });
    t_finish = t_both - t_unpack;
    /* the yardstick: memcpy of the bytes the bf16 pack moves */
    size_t bytes = rows16;
    uint8_t *a = malloc(bytes + 64), *b = malloc(bytes + 64);
    memset(a, 1, bytes), memset(b, 2, bytes);
    TIME_IT(t_copy, memcpy(b, a, bytes); a[0] ^= b[bytes - 1]);
    int pairs = 0, outs = 0, uniq = 0;
    for (int s = 0; s < S; s++)
        pairs += p.n_rows[s], outs += p.n_out[s], uniq += p.n_uniq[s];
    double host = t_plan + t_pack16 + t_unpack; /* the worker's; the finish is the engine's (on a GPU: the device's) */
    printf("%-6s %4d %3d %6d %6d %6d %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.2f %7.2f\n", sh->name, T, S, pairs, uniq,
           outs, 1e6 * t_plan, 1e6 * t_pack32, 1e6 * t_pack16, 1e6 * t_unpack, 1e6 * t_finish, 1e6 * t_copy,
           (double)bytes / (1 << 20), host / t_copy);
    printf("RESULT dispatch_host_us_%s_b%d %.1f\n", sh->name, T, 1e6 * host);
    printf("RESULT dispatch_host_vs_memcpy_%s_b%d %.2f\n", sh->name, T, host / t_copy);
    st_dispatch_plan_cleanup(&p);
    for (int s = 0; s < S; s++)
        free(msg[s]), free(rep[s]);
    free(msg), free(rep), free(a), free(b), free(z), free(zb), free(wts), free(ids), free(cnt), free(ent), free(out),
        free(u), free(server_of), free(failed), free(mark), free(at), free(tid);
}

int main(void) {
    st_config_t small;
    if (st_config_preset(&small, "small") != ST_OK) {
        fprintf(stderr, "bench_dispatch: %s\n", st_err_last());
        return 1;
    }
    shape_t shapes[] = {
        {"small", small.n_experts, small.top_k, st_config_expert_width(&small), 2, 8192},
        {"small1", small.n_experts, small.top_k, st_config_expert_width(&small), 1, 8192}, /* bench_afd_1gpu's */
        {"k3", 896, 16, 3584, 16, 256},
    };
    printf("per MoE layer, µs (one thread); finish: the CPU engine's (not the worker's); memcpy: the bf16 rows packed\n");
    printf("%-6s %4s %3s %6s %6s %6s %9s %9s %9s %9s %9s %9s %9s %7s\n", "shape", "T", "S", "pairs", "rows", "nodes",
           "plan", "pack32", "pack16", "unpack", "finish", "memcpy", "MiB", "×memcpy");
    for (size_t i = 0; i < ST_ARRAY_LEN(shapes); i++) {
        static const int Ts[] = {1, 32, 256, 8192}; /* decode batches; one 8K prefill */
        for (size_t j = 0; j < ST_ARRAY_LEN(Ts) && Ts[j] <= shapes[i].max_T; j++)
            run(&shapes[i], Ts[j]);
    }
    return 0;
}
