/* k3-mini: K3's exact per-layer widths (d 7168, 96 heads, latent 3584, MXFP4 experts) load and run.
 * Writes a ~7 GB checkpoint once (kept in $STRATA_K3MINI_DIR or the test tmp dir), checks the
 * tensors against the K3 inventory shapes, runs a prompt then decode, and checks prefill-then-decode
 * against one longer prefill. Label `slow`. */
#include <stdlib.h>
#include <sys/stat.h>

#include "harness.h"
#include "strata/engine.h"

int main(void) {
    const char *dir = getenv("STRATA_K3MINI_DIR");
    char buf[512];
    if (!dir) {
        const char *tmp = getenv("STRATA_TEST_TMP");
        snprintf(buf, sizeof buf, "%s/k3-mini", tmp ? tmp : "/tmp");
        dir = buf;
    }
    char cfgp[600];
    snprintf(cfgp, sizeof cfgp, "%s/config.json", dir);
    struct stat st;
    if (stat(cfgp, &st) != 0) {
        st_ckpt_init_opts_t o = {.preset = "k3-mini", .out_dir = dir, .seed = 5, .dtype = ST_DT_BF16, .mxfp4_experts = true};
        double t0 = st_time_sec();
        CHECK(st_ckpt_init(&o) == ST_OK, "k3-mini init: %s", st_err_last());
        printf("k3-mini checkpoint written in %.1f s\n", st_time_sec() - t0);
    }
    st_ckpt_t *ck;
    if (st_ckpt_open(&ck, dir) != ST_OK) {
        fprintf(stderr, "open: %s\n", st_err_last());
        return 1;
    }
    const st_config_t *c = st_ckpt_config(ck);
    CHECK(c->d == 7168 && c->kda_heads == 96 && c->mla_heads == 96 && c->latent == 3584 && c->moe_inter == 3072,
          "K3 widths");
    CHECK(c->experts_mxfp4, "experts are MXFP4");
    /* K3 inventory shapes (checkpoint-layout §3) */
    const st_tensor_t *t;
    int64_t s_q[] = {12288, 7168}, s_alog[] = {128}, s_kvb[] = {24576, 512}, s_w1p[] = {3072, 1792},
            s_w1s[] = {3072, 112}, s_w2p[] = {3584, 1536}, s_w2s[] = {3584, 96}, s_conv[] = {12288, 1, 4};
    CHECK(st_ckpt_get(ck, "model.layers.0.self_attn.q_proj.weight", 2, s_q, &t) == ST_OK, "q_proj");
    CHECK(st_ckpt_get(ck, "model.layers.0.self_attn.A_log", 1, s_alog, &t) == ST_OK && t->dtype == ST_DT_F32, "A_log [128] F32");
    CHECK(st_ckpt_get(ck, "model.layers.0.self_attn.q_conv1d.weight", 3, s_conv, &t) == ST_OK, "conv");
    CHECK(st_ckpt_get(ck, "model.layers.3.self_attn.kv_b_proj.weight", 2, s_kvb, &t) == ST_OK, "kv_b_proj");
    CHECK(st_ckpt_get(ck, "model.layers.1.block_sparse_moe.experts.0.w1.weight_packed", 2, s_w1p, &t) == ST_OK &&
              t->dtype == ST_DT_U8, "w1 packed");
    CHECK(st_ckpt_get(ck, "model.layers.1.block_sparse_moe.experts.31.w1.weight_scale", 2, s_w1s, &t) == ST_OK, "w1 scale");
    CHECK(st_ckpt_get(ck, "model.layers.2.block_sparse_moe.experts.5.w2.weight_packed", 2, s_w2p, &t) == ST_OK, "w2 packed");
    CHECK(st_ckpt_get(ck, "model.layers.2.block_sparse_moe.experts.5.w2.weight_scale", 2, s_w2s, &t) == ST_OK, "w2 scale");

    st_engine_opts_t eo;
    st_engine_opts_default(&eo);
    eo.max_seqs = 2;
    eo.max_batch_tokens = 12;
    eo.max_ctx = 16;
    st_engine_t *e;
    if (st_engine_create(&e, ck, &eo) != ST_OK) {
        fprintf(stderr, "engine: %s\n", st_err_last());
        return 1;
    }
    int V = c->vocab, toks[12];
    for (int i = 0; i < 12; i++) toks[i] = (i * 977 + 13) % V;
    float *one = malloc(sizeof(float) * 12 * (size_t)V), *inc = malloc(sizeof(float) * 12 * (size_t)V);
    int a, b;
    st_engine_seq_open(e, &a);
    st_seq_chunk_t ch = {.slot = a, .n_tokens = 12, .tokens = toks, .all_logits = true};
    double t0 = st_time_sec();
    CHECK(st_engine_step(e, &ch, 1, one) == ST_OK, "prefill 12");
    double tp = st_time_sec() - t0;
    st_engine_seq_open(e, &b);
    ch = (st_seq_chunk_t){.slot = b, .n_tokens = 8, .tokens = toks, .all_logits = true};
    CHECK(st_engine_step(e, &ch, 1, inc) == ST_OK, "prefill 8");
    t0 = st_time_sec();
    for (int i = 8; i < 12; i++) {
        ch = (st_seq_chunk_t){.slot = b, .n_tokens = 1, .tokens = &toks[i], .all_logits = true};
        CHECK(st_engine_step(e, &ch, 1, inc + (size_t)i * V) == ST_OK, "decode");
    }
    double td = (st_time_sec() - t0) / 4;
    st_t_close("k3-mini prefill-then-decode vs one prefill", inc, one, (size_t)12 * V, 1e-3, 1e-3);
    printf("k3-mini: prefill 12 tokens %.2f s, decode %.2f s/token\n", tp, td);
    free(one);
    free(inc);
    st_engine_destroy(e);
    st_ckpt_close(ck);
    return st_test_done();
}
