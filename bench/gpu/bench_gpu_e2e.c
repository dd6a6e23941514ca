/* End-to-end GPU engine benchmark on the `small` preset (written at start under $STRATA_BENCH_TMP
 * or /tmp, ~2 GB): prefill of one 8K-token prompt, and decode steps at batch 1, 32 and 256
 * (tokens/s, logits copied to the host as the engine API does). For decode, the memory floor: the
 * bytes a step must move (weights touched, KDA state read and written, MLA cache read) over the
 * copy bandwidth measured in the same run, and measured / floor.
 * Then the greedy decode step without the decode-step graphs and with every linear layer on cuBLAS
 * (st_engine_cuda_set_graphs, backend_cuda.h). STRATA_BENCH_NCU_BATCH=B: only decode at batch B,
 * with one greedy step inside the profiler range (`ncu --profile-from-start off`: each kernel of a
 * decode step). */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../engine/backend_cuda.h" /* graphs on/off (internal) */
#include "bench_common.h"
#include "strata/base.h"
#include "strata/engine.h"
#include "strata/gpu.h"
#include "strata/kernels_cuda.h"
#include "strata/model.h"

#define PREFILL 8192
#define DEC_PROMPT 128
#define DEC_STEPS 16

typedef struct {
    int L, n;
    unsigned char *used; /* [L][n] */
} hit_t;
static void hit_hook(void *ctx, int layer, int T, int n, const float *scores, int *ids, int *cnt, int kmax) {
    hit_t *h = ctx;
    (void)scores;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < cnt[t]; i++) h->used[(size_t)layer * n + ids[(size_t)t * kmax + i]] = 1;
}

static st_engine_t *eng;
static float *logits;

static bool greedy; /* step_all asks for the device argmax (st_seq_chunk_t.argmax): no logits to the host */
static double step_all(const int *slots, int B, int *tok) {
    static st_seq_chunk_t ch[512];
    static int am[512];
    for (int i = 0; i < B; i++)
        ch[i] = (st_seq_chunk_t){.slot = slots[i], .n_tokens = 1, .tokens = &tok[i], .argmax = greedy ? &am[i] : NULL};
    double t0 = st_time_sec();
    BK(st_engine_step(eng, ch, B, logits));
    return st_time_sec() - t0;
}

/* mean seconds of DEC_STEPS greedy steps (after one warm-up step, which also captures a graph) */
static double greedy_mean(const int *slots, int B, int *tok) {
    greedy = true;
    step_all(slots, B, tok);
    double tot = 0;
    for (int s = 0; s < DEC_STEPS; s++) tot += step_all(slots, B, tok);
    greedy = false;
    return tot / DEC_STEPS;
}

static const char *preset = "small"; /* STRATA_BENCH_PRESET (e.g. k3-mini: K3's layer widths, 4 layers) */
static void run_engine(const st_ckpt_t *ck);

/* STRATA_BENCH_AB="NAME=VALUE[,NAME=VALUE...]": the greedy decode step once more with these variables
 * set (read again when the engine recaptures its graphs), in the same process, so a variant is compared
 * without machine-to-machine variance. The variables are unset afterwards. (Kernel variants are no
 * longer switched by variables: they are compared in kernels/dev programs; docs/kernels.md.) */
static void ab_env(const char *spec, bool set) {
    char buf[512], *save = NULL;
    snprintf(buf, sizeof buf, "%s", spec);
    for (char *kv = strtok_r(buf, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        if (!eq) continue;
        *eq = 0;
        if (set) setenv(kv, eq + 1, 1);
        else unsetenv(kv);
    }
}

static void ab_compare(const int *slots, int B, int *tok, double gmean, const char *tag) {
    const char *ab = getenv("STRATA_BENCH_AB");
    if (!ab || !*ab) return;
    ab_env(ab, true);
    st_engine_cuda_set_graphs(eng, true); /* recapture with the variant */
    double amean = greedy_mean(slots, B, tok);
    ab_env(ab, false);
    st_engine_cuda_set_graphs(eng, true);
    double bmean = greedy_mean(slots, B, tok); /* the default again: drift between the two */
    printf("RESULT e2e_%s_decode_b%d%s_greedy_ab %.0f tok/s with %s (step %.3f ms; default %.3f ms before, %.3f "
           "after: %.3fx)\n", preset, B, tag, B / amean, ab, amean * 1e3, gmean * 1e3, bmean * 1e3,
           amean / (0.5 * (gmean + bmean)));
}

int main(void) {
    (void)bdev;
    bench_init("bench_gpu_e2e", 0);
    const char *tmp = getenv("STRATA_BENCH_TMP"), *pe = getenv("STRATA_BENCH_PRESET");
    if (pe && *pe) preset = pe;
    st_config_t pc;
    BK(st_config_preset(&pc, preset));
    char dir[512];
    snprintf(dir, sizeof dir, "%s/bench-e2e-%s-%d", tmp ? tmp : "/tmp", preset, (int)getpid());
    st_ckpt_init_opts_t io = {.preset = preset, .out_dir = dir, .seed = 5, .dtype = ST_DT_BF16,
                              .mxfp4_experts = pc.experts_mxfp4};
    double t0 = st_time_sec();
    st_ckpt_t *ck;
    BK(st_ckpt_init(&io));
    BK(st_ckpt_open(&ck, dir));
    printf("%s checkpoint written in %.1f s\n", preset, st_time_sec() - t0);
    run_engine(ck);
    st_ckpt_close(ck);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return 0;
}

static void run_engine(const st_ckpt_t *ck) {
    const char *tag = "";
    const st_config_t *c = st_ckpt_config(ck);
    int V = c->vocab, n_mla = 0, n_kda = 0;
    for (int l = 0; l < c->n_layers; l++) c->is_mla[l] ? n_mla++ : n_kda++;
    st_engine_opts_t o;
    st_engine_opts_default(&o);
    o.device = 0;
    o.max_seqs = 260;
    o.max_batch_tokens = PREFILL;
    o.max_ctx = PREFILL + 64;
    o.kv_pages = 4 * n_mla * ((PREFILL + 64) / 64 + 1) + 260 * n_mla * 4;
    BK(st_engine_create(&eng, ck, &o));
    logits = malloc((size_t)256 * V * sizeof(float));
    int *prompt = malloc(PREFILL * sizeof(int));
    st_rng_t rng = {.s = 99};
    for (int i = 0; i < PREFILL; i++) prompt[i] = (int)(st_rng_next(&rng) % 256);

    /* prefill: one 8K prompt (a warm-up one first: cuBLAS heuristics, module load) */
    const char *ncu = getenv("STRATA_BENCH_NCU_BATCH");
    int ncu_b = ncu ? atoi(ncu) : 0;
    double tp[3] = {1, 1, 1};
    for (int r = 0; r < (ncu_b ? 0 : 3); r++) {
        int slot;
        BK(st_engine_seq_open(eng, &slot));
        st_seq_chunk_t ch = {.slot = slot, .n_tokens = PREFILL, .tokens = prompt};
        double a = st_time_sec();
        BK(st_engine_step(eng, &ch, 1, logits));
        tp[r] = st_time_sec() - a;
        st_engine_seq_close(eng, slot);
    }
    double tpre = tp[1] < tp[2] ? tp[1] : tp[2];
    if (!ncu_b)
        printf("RESULT e2e_%s_prefill_8k%s %.0f tok/s (%.1f ms for %d tokens; runs %.1f %.1f ms)\n", preset, tag,
           PREFILL / tpre, tpre * 1e3, PREFILL, tp[1] * 1e3, tp[2] * 1e3);

    st_ckpt_sizes_t sz;
    BK(st_ckpt_sizes(ck, &sz));
    int batches[3] = {1, 32, 256};
    hit_t hit = {.L = c->n_layers, .n = c->n_experts};
    hit.used = calloc((size_t)c->n_layers * c->n_experts, 1);
    for (int bi = 0; bi < 3; bi++) {
        int B = batches[bi];
        if (ncu_b && B != ncu_b) continue;
        int slots[256], tok[256];
        for (int i = 0; i < B; i++) BK(st_engine_seq_open(eng, &slots[i]));
        /* prompts of DEC_PROMPT tokens, up to 64 sequences per step */
        for (int i0 = 0; i0 < B; i0 += 64) {
            st_seq_chunk_t ch[64];
            int nb = B - i0 < 64 ? B - i0 : 64;
            for (int i = 0; i < nb; i++)
                ch[i] = (st_seq_chunk_t){.slot = slots[i0 + i], .n_tokens = DEC_PROMPT, .tokens = prompt + (i0 + i) % 64};
            BK(st_engine_step(eng, ch, nb, logits));
        }
        for (int i = 0; i < B; i++) tok[i] = prompt[i];
        step_all(slots, B, tok); /* warm-up */
        step_all(slots, B, tok);
        if (ncu_b) { /* one greedy step (its graph captured by the warm-up) inside the profiler's range */
            greedy = true;
            step_all(slots, B, tok);
            st_gpu_profiler(true);
            step_all(slots, B, tok);
            st_gpu_profiler(false);
            greedy = false;
            for (int i = 0; i < B; i++) st_engine_seq_close(eng, slots[i]);
            continue;
        }
        /* one step with the routing recorded: the experts a step touches */
        memset(hit.used, 0, (size_t)c->n_layers * c->n_experts);
        st_engine_set_route_hook(eng, hit_hook, &hit);
        step_all(slots, B, tok);
        st_engine_set_route_hook(eng, NULL, NULL);
        long experts = 0;
        for (size_t i = 0; i < (size_t)c->n_layers * c->n_experts; i++) experts += hit.used[i];
        double tot = 0, best = 1e30;
        for (int s = 0; s < DEC_STEPS; s++) {
            double t = step_all(slots, B, tok);
            tot += t;
            if (t < best) best = t;
        }
        double mean = tot / DEC_STEPS;
        int ctx = st_engine_seq_len(eng, slots[0]);
        /* memory floor of one decode step */
        double w_bytes = (double)sz.bytes_attention_worker - (double)V * c->d * 2 /* embedding: B rows only */
                         + (double)experts * sz.bytes_per_expert_layer;
        double S_bytes = (double)B * n_kda * 2.0 *
                         ((double)c->kda_heads * c->kda_head_dim * c->kda_head_dim * 4 +
                          3.0 * (c->conv_k - 1) * c->kda_heads * c->kda_head_dim * 4);
        double kv_bytes = (double)B * n_mla * (ctx + 1.0) * (c->kv_lora_rank + c->qk_rope) * 2;
        double lg_bytes = (double)B * V * 4;
        double floor_s = (w_bytes + S_bytes + kv_bytes + lg_bytes) / (b_copy_gbs * 1e9);
        printf("RESULT e2e_%s_decode_b%d%s %.0f tok/s (step %.2f ms mean, %.2f best; ctx %d)\n", preset, B, tag, B / mean,
               mean * 1e3, best * 1e3, ctx);
        printf("RESULT e2e_%s_decode_b%d%s_floor %.3f ms (weights %.1f MB incl. %ld expert-layers, state %.1f MB, "
               "cache %.1f MB, logits %.1f MB at %.0f GB/s) measured/floor %.1fx\n",
               preset, B, tag, floor_s * 1e3, w_bytes / 1e6, experts, S_bytes / 1e6, kv_bytes / 1e6, lg_bytes / 1e6, b_copy_gbs,
               mean / floor_s);
        /* greedy serving: each sequence takes the device argmax, no logits row crosses PCIe */
        double gmean = greedy_mean(slots, B, tok), gfloor = floor_s - lg_bytes / (b_copy_gbs * 1e9);
        printf("RESULT e2e_%s_decode_b%d%s_greedy %.0f tok/s (step %.2f ms mean; device argmax, no logits to the "
               "host) measured/floor %.1fx\n", preset, B, tag, B / gmean, gmean * 1e3, gmean / gfloor);
        { /* the same without the decode-step graphs (plain launches) */
            st_engine_cuda_set_graphs(eng, false);
            double nmean = greedy_mean(slots, B, tok);
            st_engine_cuda_set_graphs(eng, true);
            printf("RESULT e2e_%s_decode_b%d%s_greedy_no_graphs %.0f tok/s (step %.2f ms mean; graphs: %.2fx)\n", preset,
                   B, tag, B / nmean, nmean * 1e3, nmean / gmean);
            ab_compare(slots, B, tok, gmean, tag);
        }
        for (int i = 0; i < B; i++) st_engine_seq_close(eng, slots[i]);
    }
    st_engine_stats_t st;
    st_engine_get_stats(eng, &st);
    printf("engine: %llu steps, %llu tokens\n", (unsigned long long)st.steps, (unsigned long long)st.tokens);
    st_engine_destroy(eng);
    free(hit.used), free(logits), free(prompt);
}
