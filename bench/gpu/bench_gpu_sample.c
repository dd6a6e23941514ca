/* Sampling on the device (issue 17 item 4): the `small` preset's decode at batch 256 (written at start
 * under $STRATA_BENCH_TMP or /tmp, ~2 GB) with every sequence sampled on the device (temperature 0.8,
 * top-p 0.9, presence 0.5, frequency 0.3: st_seq_chunk_t.sample) against greedy device argmax
 * (st_seq_chunk_t.argmax), tokens fed back; ratio = sampled / greedy tok/s (the goal: 1). Then the
 * kernel alone, st_cuda_sample over 256 rows of the preset's vocab per option set, against
 * st_cuda_argmax. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_common.h"
#include "strata/base.h"
#include "strata/engine.h"
#include "strata/kernels.h"
#include "strata/model.h"

#define B 256
#define PROMPT 128
#define STEPS 32

static st_engine_t *eng;
static float *logits;
static int slots[B], tok[B], am[B];
static st_sample_params_t sp[B];

/* one decode step of all B sequences; their tokens become the next inputs */
static double step(bool sample) {
    static st_seq_chunk_t ch[B];
    static int in[B];
    memcpy(in, tok, sizeof in);
    for (int i = 0; i < B; i++) {
        ch[i] = (st_seq_chunk_t){.slot = slots[i], .n_tokens = 1, .tokens = &in[i]};
        if (sample)
            ch[i].sample = &sp[i], ch[i].token = &tok[i];
        else
            ch[i].argmax = &am[i];
    }
    double t0 = st_time_sec();
    BK(st_engine_step(eng, ch, B, logits));
    double t = st_time_sec() - t0;
    if (!sample) memcpy(tok, am, sizeof tok);
    for (int i = 0; i < B; i++)
        sp[i].pos++;
    return t;
}

static double mean_steps(bool sample) {
    step(sample); /* warm-up (graph capture) */
    double tot = 0;
    for (int s = 0; s < STEPS; s++)
        tot += step(sample);
    return tot / STEPS;
}

static void kernel_alone(int V) {
    float *d_lg = bdev((size_t)B * V * 4);
    int *d_ids = bdev(B * 4), *d_cnt = bdev((size_t)B * V * 4), *d_tid = bdev(B * ST_SAMPLE_MAX_TOP * 4);
    float *d_lp = bdev(B * 4), *d_tlp = bdev(B * ST_SAMPLE_MAX_TOP * 4);
    st_sample_row_t *rows = malloc(sizeof *rows * B), *d_rows = bdev(sizeof *rows * B);
    BK(st_gpu_memset(d_cnt, 0, (size_t)B * V * 4));
    double ms_amax = 0;
    BK(st_cuda_fill_uniform(&bs, d_lg, false, (size_t)B * V, -8.f, 8.f, 3));
    BTIME(ms_amax, 20, st_cuda_argmax(&bs, d_ids, d_lg, B, V));
    printf("RESULT sample_kernel_argmax_b%d_V%d %.1f us\n", B, V, ms_amax * 1e3);
    struct {
        const char *name;
        float t, p, pres, freq;
        int k, n_top;
    } cfg[] = {{"greedy", 0, 1, 0, 0, 0, -1},
               {"temperature", 0.8f, 1, 0, 0, 0, -1},
               {"top_k50", 0.8f, 1, 0, 0, 50, -1},
               {"top_p0.9", 0.8f, 0.9f, 0, 0, 0, -1},
               {"top_p_penalties", 0.8f, 0.9f, 0.5f, 0.3f, 0, -1},
               {"top_p_logprobs20", 0.8f, 0.9f, 0, 0, 0, 20}};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        for (int i = 0; i < B; i++)
            rows[i] = (st_sample_row_t){.temperature = cfg[c].t,
                                        .top_p = cfg[c].p,
                                        .presence = cfg[c].pres,
                                        .frequency = cfg[c].freq,
                                        .top_k = cfg[c].k,
                                        .n_top = cfg[c].n_top,
                                        .row = i,
                                        .count_row = i,
                                        .seed = (uint64_t)i};
        BK(st_gpu_memcpy_h2d(d_rows, rows, sizeof *rows * B));
        double ms = 0;
        BTIME(ms, 20, st_cuda_sample(&bs, d_ids, d_lp, d_tid, d_tlp, d_lg, B, V, d_rows, NULL, NULL, d_cnt));
        printf("RESULT sample_kernel_%s_b%d_V%d %.1f us (%.2fx argmax)\n", cfg[c].name, B, V, ms * 1e3, ms / ms_amax);
    }
    st_gpu_free(d_lg), st_gpu_free(d_ids), st_gpu_free(d_cnt), st_gpu_free(d_tid), st_gpu_free(d_lp);
    st_gpu_free(d_tlp), st_gpu_free(d_rows);
    free(rows);
}

int main(void) {
    bench_init("bench_gpu_sample", 0);
    const char *tmp = getenv("STRATA_BENCH_TMP");
    char dir[512];
    snprintf(dir, sizeof dir, "%s/bench-sample-small-%d", tmp ? tmp : "/tmp", (int)getpid());
    st_config_t pc;
    BK(st_config_preset(&pc, "small"));
    st_ckpt_init_opts_t io = {
        .preset = "small", .out_dir = dir, .seed = 5, .dtype = ST_DT_BF16, .mxfp4_experts = pc.experts_mxfp4};
    st_ckpt_t *ck;
    BK(st_ckpt_init(&io));
    BK(st_ckpt_open(&ck, dir));
    const st_config_t *c = st_ckpt_config(ck);
    int V = c->vocab;
    st_engine_opts_t o;
    st_engine_opts_default(&o);
    o.device = 0;
    o.max_seqs = B;
    o.max_batch_tokens = B * 4;
    o.max_ctx = PROMPT + 4 * STEPS + 8;
    BK(st_engine_create(&eng, ck, &o));
    logits = malloc((size_t)B * V * sizeof(float));
    st_rng_t rng = {.s = 99};
    int prompt[PROMPT];
    for (int i = 0; i < PROMPT; i++)
        prompt[i] = (int)(st_rng_next(&rng) % (uint64_t)V);
    for (int i = 0; i < B; i++)
        BK(st_engine_seq_open(eng, &slots[i]));
    for (int i0 = 0; i0 < B; i0 += 8) { /* prompts, 8 sequences per step */
        st_seq_chunk_t ch[8];
        for (int i = 0; i < 8; i++)
            ch[i] = (st_seq_chunk_t){.slot = slots[i0 + i], .n_tokens = PROMPT - (i0 + i) % 7, .tokens = prompt};
        BK(st_engine_step(eng, ch, 8, logits));
    }
    for (int i = 0; i < B; i++) {
        tok[i] = prompt[i % PROMPT];
        sp[i] = (st_sample_params_t){.temperature = 0.8f,
                                     .top_p = 0.9f,
                                     .presence = 0.5f,
                                     .frequency = 0.3f,
                                     .seed = 1000 + (uint64_t)i,
                                     .n_top = -1};
    }
    double g = mean_steps(false), s = mean_steps(true), g2 = mean_steps(false);
    double gm = 0.5 * (g + g2);
    printf("RESULT e2e_small_decode_b%d_greedy_argmax %.0f tok/s (step %.3f ms; %.3f before, %.3f after)\n", B, B / gm,
           gm * 1e3, g * 1e3, g2 * 1e3);
    printf("RESULT e2e_small_decode_b%d_sampled %.0f tok/s (step %.3f ms; temperature 0.8, top-p 0.9, presence 0.5, "
           "frequency 0.3)\n",
           B, B / s, s * 1e3);
    printf("RESULT e2e_small_decode_b%d_sampled_vs_greedy %.3f (tok/s ratio)\n", B, gm / s);
    for (int i = 0; i < B; i++)
        st_engine_seq_close(eng, slots[i]);
    st_engine_destroy(eng);
    free(logits);
    kernel_alone(V);
    st_ckpt_close(ck);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return 0;
}
