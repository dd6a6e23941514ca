/* The GPU engine's sampling op (st_seq_chunk_t.sample; the head samples each chunk of logits rows on
 * the device): sequence A is sampled with every option, keep_logits and logprobs; twin B gets the
 * same tokens in the same steps, plain logits. Per step: A's token is st_sample_rows' over A's
 * processed row (no further processing: the draw depends only on (seed, position, logits)), its
 * logprobs and top ids the same; processed − raw (B) is the bias minus the penalties of the tokens
 * sampled so far (tracked here); the first step has a 300-row all_logits prompt ahead of A, so A's
 * row sits in the head's second chunk of rows; a reopened slot starts its counts over. tiny preset;
 * exit 77 without a GPU. The kernel alone: test_gpu_sample. */
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "strata/engine.h"
#include "strata/gpu.h"

enum { P = 300, STEPS = 10 };

int main(void) {
    if (st_gpu_device_count() <= 0) {
        printf("test_gpu_engine_sample: no CUDA device, skipped\n");
        return 77;
    }
    const char *tmp = getenv("STRATA_TEST_TMP");
    char dir[512];
    snprintf(dir, sizeof dir, "%s/gpu-sample-tiny-%d", tmp ? tmp : "/tmp", (int)getpid());
    st_ckpt_init_opts_t io = {.preset = "tiny", .out_dir = dir, .seed = 7, .dtype = ST_DT_BF16};
    st_ckpt_t *ck = NULL;
    if (st_ckpt_init(&io) != ST_OK || st_ckpt_open(&ck, dir) != ST_OK) {
        fprintf(stderr, "cannot make tiny checkpoint: %s\n", st_err_last());
        return 1;
    }
    const st_config_t *cfg = st_ckpt_config(ck);
    int V = cfg->vocab;
    st_engine_opts_t eo;
    st_engine_opts_default(&eo);
    eo.max_seqs = 3, eo.max_batch_tokens = P + 16, eo.max_ctx = P + 32, eo.device = 0;
    st_engine_t *e = NULL;
    CHECK(st_engine_create(&e, ck, &eo) == ST_OK, "GPU engine: %s", st_err_last());
    if (!e) return st_test_done();
    int ptoks[P], toks[8], cur = 0, tok = -1, tids[ST_SAMPLE_MAX_TOP], wt[ST_SAMPLE_MAX_TOP];
    for (int i = 0; i < P; i++)
        ptoks[i] = (i * 7919 + 13) % V;
    for (int i = 0; i < 8; i++)
        toks[i] = (i * 104729 + 5) % V;
    float *lg = malloc(sizeof(float) * (size_t)(P + 2) * V), *proc = malloc(sizeof(float) * V), lp = 0;
    float tlp[ST_SAMPLE_MAX_TOP], wtl[ST_SAMPLE_MAX_TOP];
    int *cnt = calloc((size_t)V, sizeof(int));
    const uint32_t bias_ids[3] = {5, 9, 5};
    const float bias_v[3] = {3.0f, -2.0f, 0.5f};
    st_sample_params_t sp = {.temperature = 0.9f,
                             .top_k = 40,
                             .top_p = 0.9f,
                             .presence = 1.0f,
                             .frequency = 0.5f,
                             .seed = 77,
                             .n_top = 5,
                             .n_bias = 3,
                             .bias_ids = bias_ids,
                             .bias_values = bias_v};
    for (int round = 0; round < 2; round++) {
        int sa, sb, sp_slot;
        CHECK(st_engine_seq_open(e, &sa) == ST_OK && st_engine_seq_open(e, &sb) == ST_OK &&
                  st_engine_seq_open(e, &sp_slot) == ST_OK,
              "open");
        memset(cnt, 0, sizeof(int) * (size_t)V);
        int same_tok = 1, same_lp = 1, moved = 0;
        double worst = 0;
        const int *in = toks;
        int n = 8;
        for (int step = 0; step < STEPS; step++) {
            sp.pos = (uint32_t)step;
            st_seq_chunk_t c[3] = {{.slot = sp_slot, .n_tokens = P, .tokens = ptoks, .all_logits = true},
                                   {.slot = sa,
                                    .n_tokens = n,
                                    .tokens = in,
                                    .sample = &sp,
                                    .keep_logits = true,
                                    .token = &tok,
                                    .logprob = &lp,
                                    .top_ids = tids,
                                    .top_logprobs = tlp},
                                   {.slot = sb, .n_tokens = n, .tokens = in}};
            int first = step == 0 ? 0 : 1, rows = step == 0 ? P : 0; /* the prompt rides the first step only */
            if (st_engine_step(e, c + first, 3 - first, lg) != ST_OK) {
                CHECK(0, "step %d: %s", step, st_err_last());
                break;
            }
            const float *pa = lg + (size_t)rows * V, *rb = lg + (size_t)(rows + 1) * V;
            /* processed − raw = bias − penalties of the tokens sampled so far */
            for (int v = 0; v < V; v++) {
                double want = cnt[v] > 0 ? -((double)sp.frequency * cnt[v] + sp.presence) : 0;
                for (int i = 0; i < 3; i++)
                    want += bias_ids[i] == (uint32_t)v ? bias_v[i] : 0;
                worst = fmax(worst, fabs((double)pa[v] - rb[v] - want));
            }
            memcpy(proc, pa, sizeof(float) * V);
            st_sample_row_t r = {.temperature = sp.temperature,
                                 .top_p = sp.top_p,
                                 .top_k = sp.top_k,
                                 .n_top = 5,
                                 .count_row = -1,
                                 .pos = sp.pos,
                                 .seed = sp.seed};
            int want;
            float wlp;
            st_sample_rows(&want, &wlp, wt, wtl, proc, 1, V, &r, NULL, NULL, NULL);
            same_tok &= tok == want;
            same_lp &= fabsf(lp - wlp) <= 1e-5f && memcmp(tids, wt, sizeof(int) * 5) == 0;
            for (int i = 0; i < 5; i++)
                same_lp &= fabsf(tlp[i] - wtl[i]) <= 1e-5f;
            if (tok >= 0 && tok < V) cnt[tok]++;
            moved += step > 0 && tok != cur;
            cur = tok;
            in = &cur;
            n = 1;
        }
        CHECK(same_tok, "round %d: the device's tokens are st_sample_rows' over the processed rows", round);
        CHECK(same_lp, "round %d: logprobs and the top 5", round);
        CHECK(worst < 1e-3, "round %d: processed − raw is the bias minus the penalties (worst %.2e)", round, worst);
        CHECK(moved > 0, "round %d: sampling moves (%d changes)", round, moved);
        st_engine_seq_close(e, sa);
        st_engine_seq_close(e, sb);
        st_engine_seq_close(e, sp_slot);
    }
    st_engine_destroy(e);
    free(lg), free(proc), free(cnt);
    st_ckpt_close(ck);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return st_test_done();
}
