/* st_ckpt_init → st_ckpt_open round trip on the tiny preset: every K3 tensor name, shape and dtype
 * (checkpoint-layout §3), sizes, determinism, the MXFP4 variant and the router skew. */
#include <jansson.h>
#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "strata/model.h"

typedef struct {
    char name[160];
    st_dtype_t dt;
    int ndim;
    int64_t shape[4];
} exp_t;

static exp_t g_exp[4096];
static int g_nexp;

static void E(st_dtype_t dt, int ndim, int64_t a, int64_t b, int64_t c, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static void E(st_dtype_t dt, int ndim, int64_t a, int64_t b, int64_t c, const char *fmt, ...) {
    exp_t *e = &g_exp[g_nexp++];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->name, sizeof e->name, fmt, ap);
    va_end(ap);
    e->dt = dt;
    e->ndim = ndim;
    e->shape[0] = a, e->shape[1] = b, e->shape[2] = c;
}

/* The K3 layout for the tiny preset, written out independently of ckpt_init.c. */
static void expected_tiny(bool mx) {
    const st_dtype_t B = ST_DT_BF16, F = ST_DT_F32, U = ST_DT_U8;
    const int d = 128, P = 4 * 32, L = 8;
    g_nexp = 0;
    E(B, 2, 512, d, 0, "model.embed_tokens.weight");
    E(B, 2, 512, d, 0, "lm_head.weight");
    E(B, 1, d, 0, 0, "model.norm.weight");
    E(B, 1, d, 0, 0, "model.output_attn_res_norm.weight");
    E(B, 2, 1, d, 0, "model.output_attn_res_proj.weight");
    for (int l = 0; l < L; l++) {
#define LP "model.layers.%d."
        E(B, 1, d, 0, 0, LP "input_layernorm.weight", l);
        E(B, 1, d, 0, 0, LP "post_attention_layernorm.weight", l);
        E(B, 1, d, 0, 0, LP "self_attention_res_norm.weight", l);
        E(B, 1, d, 0, 0, LP "mlp_res_norm.weight", l);
        E(B, 2, 1, d, 0, LP "self_attention_res_proj.weight", l);
        E(B, 2, 1, d, 0, LP "mlp_res_proj.weight", l);
        bool mla = l == 3 || l == 7;
        if (!mla) {
            E(B, 2, P, d, 0, LP "self_attn.q_proj.weight", l);
            E(B, 2, P, d, 0, LP "self_attn.k_proj.weight", l);
            E(B, 2, P, d, 0, LP "self_attn.v_proj.weight", l);
            E(F, 3, P, 1, 4, LP "self_attn.q_conv1d.weight", l);
            E(F, 3, P, 1, 4, LP "self_attn.k_conv1d.weight", l);
            E(F, 3, P, 1, 4, LP "self_attn.v_conv1d.weight", l);
            E(B, 2, 32, d, 0, LP "self_attn.f_a_proj.weight", l);
            E(B, 2, P, 32, 0, LP "self_attn.f_b_proj.weight", l);
            E(F, 1, 128, 0, 0, LP "self_attn.A_log", l);
            E(F, 1, P, 0, 0, LP "self_attn.dt_bias", l);
            E(B, 2, 4, d, 0, LP "self_attn.b_proj.weight", l);
            E(F, 1, 32, 0, 0, LP "self_attn.o_norm.weight", l);
            E(B, 2, P, d, 0, LP "self_attn.g_proj.weight", l);
            E(B, 2, d, P, 0, LP "self_attn.o_proj.weight", l);
        } else {
            E(B, 2, 64, d, 0, LP "self_attn.q_a_proj.weight", l);
            E(B, 1, 64, 0, 0, LP "self_attn.q_a_layernorm.weight", l);
            E(B, 2, 4 * 48, 64, 0, LP "self_attn.q_b_proj.weight", l);
            E(B, 2, 64 + 16, d, 0, LP "self_attn.kv_a_proj_with_mqa.weight", l);
            E(B, 1, 64, 0, 0, LP "self_attn.kv_a_layernorm.weight", l);
            E(B, 2, 4 * 64, 64, 0, LP "self_attn.kv_b_proj.weight", l);
            E(B, 2, 4 * 32, d, 0, LP "self_attn.g_proj.weight", l);
            E(B, 2, d, 4 * 32, 0, LP "self_attn.o_proj.weight", l);
        }
        if (l == 0) {
            E(B, 2, 256, d, 0, LP "mlp.gate_proj.weight", l);
            E(B, 2, 256, d, 0, LP "mlp.up_proj.weight", l);
            E(B, 2, d, 256, 0, LP "mlp.down_proj.weight", l);
            continue;
        }
#define MP LP "block_sparse_moe."
        E(B, 2, 16, d, 0, MP "gate.weight", l);
        E(F, 1, 16, 0, 0, MP "gate.e_score_correction_bias", l);
        E(B, 2, 64, d, 0, MP "routed_expert_down_proj.weight", l);
        E(B, 1, 64, 0, 0, MP "routed_expert_norm.weight", l);
        E(B, 2, d, 64, 0, MP "routed_expert_up_proj.weight", l);
        E(B, 2, 64, d, 0, MP "shared_experts.gate_proj.weight", l);
        E(B, 2, 64, d, 0, MP "shared_experts.up_proj.weight", l);
        E(B, 2, d, 64, 0, MP "shared_experts.down_proj.weight", l);
        for (int j = 0; j < 16; j++)
            for (int w = 1; w <= 3; w++) {
                /* w1/w3 [64, 64], w2 [64, 64] (latent 64 = expert width 64 in tiny) */
                if (mx) {
                    E(U, 2, 64, 32, 0, MP "experts.%d.w%d.weight_packed", l, j, w);
                    E(U, 2, 64, 2, 0, MP "experts.%d.w%d.weight_scale", l, j, w);
                } else {
                    E(B, 2, 64, 64, 0, MP "experts.%d.w%d.weight", l, j, w);
                }
            }
    }
}

static int64_t numel(const exp_t *e) {
    int64_t n = 1;
    for (int i = 0; i < e->ndim; i++) n *= e->shape[i];
    return n;
}

static void check_layout(const st_ckpt_t *ck, bool mx, const char *dir) {
    expected_tiny(mx);
    int bad = 0;
    for (int i = 0; i < g_nexp; i++) {
        const exp_t *e = &g_exp[i];
        const st_tensor_t *t = st_ckpt_find(ck, e->name);
        bool ok = t && t->dtype == e->dt && t->ndim == e->ndim;
        for (int k = 0; ok && k < e->ndim; k++) ok = t->shape[k] == e->shape[k];
        if (!ok && bad++ < 10)
            fprintf(stderr, "tensor %s: %s\n", e->name, t ? "wrong dtype/shape" : "missing");
        char full[256];
        snprintf(full, sizeof full, "language_model.%.159s", e->name);
        if (st_ckpt_find(ck, full) != t) bad++;
    }
    CHECK(bad == 0, "%d tensors disagree with the K3 layout (mx=%d)", bad, mx);
    /* the index names exactly these tensors, with the prefix, and total_size is right */
    char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    json_t *idx = json_load_file(path, 0, NULL);
    json_t *wm = json_object_get(idx, "weight_map");
    CHECK(wm && (int)json_object_size(wm) == g_nexp, "index has %zu tensors, expected %d",
          wm ? json_object_size(wm) : 0, g_nexp);
    int64_t bytes = 0;
    for (int i = 0; i < g_nexp; i++) bytes += numel(&g_exp[i]) * (int64_t)st_dtype_size(g_exp[i].dt);
    json_t *ts = json_object_get(json_object_get(idx, "metadata"), "total_size");
    CHECK(json_is_integer(ts) && json_integer_value(ts) == bytes, "total_size %lld, expected %lld",
          ts ? (long long)json_integer_value(ts) : -1LL, (long long)bytes);
    const char *k;
    json_t *v;
    int unprefixed = 0, shard_ok = 1;
    json_object_foreach(wm, k, v) {
        if (strncmp(k, "language_model.", 15) != 0) unprefixed++;
        /* layer L lives in shard L+1 of 9, globals in shard 9 */
        int L = -1;
        const char *fn = json_string_value(v);
        if (sscanf(k, "language_model.model.layers.%d.", &L) == 1) {
            char want[64];
            snprintf(want, sizeof want, "model-%05d-of-%06d.safetensors", L + 1, 9);
            if (strcmp(fn, want) != 0) shard_ok = 0;
        } else if (strcmp(fn, "model-00009-of-000009.safetensors") != 0) {
            shard_ok = 0;
        }
    }
    CHECK(unprefixed == 0, "%d index names lack the language_model. prefix", unprefixed);
    CHECK(shard_ok, "shard placement differs from one layer per shard + globals last");
    json_decref(idx);
}

static void mkdir_p(const char *p) { mkdir(p, 0755); }

static bool files_equal(const char *a, const char *b) {
    char *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    bool eq = st_file_read_all(a, &x, &nx) == ST_OK && st_file_read_all(b, &y, &ny) == ST_OK && nx == ny &&
              memcmp(x, y, nx) == 0;
    free(x);
    free(y);
    return eq;
}

static bool dirs_equal(const char *a, const char *b) {
    const char *names[] = {"config.json", "model.safetensors.index.json"};
    char pa[600], pb[600];
    for (size_t i = 0; i < 2; i++) {
        snprintf(pa, sizeof pa, "%s/%s", a, names[i]);
        snprintf(pb, sizeof pb, "%s/%s", b, names[i]);
        if (!files_equal(pa, pb)) return false;
    }
    for (int s = 1; s <= 9; s++) {
        snprintf(pa, sizeof pa, "%s/model-%05d-of-000009.safetensors", a, s);
        snprintf(pb, sizeof pb, "%s/model-%05d-of-000009.safetensors", b, s);
        if (!files_equal(pa, pb)) return false;
    }
    return true;
}

/* Top-k load at layer 1 with x̂ = RMSNorm(embedding; post_attention_layernorm[1]) over every token. */
static void router_loads(const st_ckpt_t *ck, int *load) {
    const st_config_t *c = st_ckpt_config(ck);
    int d = c->d, n = c->n_experts, V = c->vocab, k = c->top_k;
    st_weight_t emb, gate;
    float *x = malloc(sizeof(float) * (size_t)d), *W = malloc(sizeof(float) * (size_t)n * d),
          *gm = malloc(sizeof(float) * (size_t)d), *b = malloc(sizeof(float) * (size_t)n),
          *sc = malloc(sizeof(float) * (size_t)n);
    CHECK(st_ckpt_weight(ck, "model.embed_tokens", V, d, &emb) == ST_OK, "embed");
    CHECK(st_ckpt_weight(ck, "model.layers.1.block_sparse_moe.gate", n, d, &gate) == ST_OK, "gate");
    CHECK(st_ckpt_vec_f32(ck, "model.layers.1.post_attention_layernorm.weight", d, false, gm) == ST_OK, "gamma");
    CHECK(st_ckpt_vec_f32(ck, "model.layers.1.block_sparse_moe.gate.e_score_correction_bias", n, false, b) == ST_OK,
          "bias");
    st_weight_rows_f32(&gate, 0, n, W);
    memset(load, 0, sizeof(int) * (size_t)n);
    for (int t = 0; t < V; t++) {
        st_weight_rows_f32(&emb, t, 1, x);
        double ss = 0;
        for (int i = 0; i < d; i++) ss += (double)x[i] * x[i];
        float r = (float)(1.0 / sqrt(ss / d + c->rms_eps));
        for (int i = 0; i < d; i++) x[i] = x[i] * r * gm[i];
        for (int j = 0; j < n; j++) {
            double z = 0;
            for (int i = 0; i < d; i++) z += (double)W[(size_t)j * d + i] * x[i];
            sc[j] = (float)(1.0 / (1.0 + exp(-z))) + b[j];
        }
        for (int s = 0; s < k; s++) {
            int best = -1;
            for (int j = 0; j < n; j++)
                if (sc[j] > -1e30f && (best < 0 || sc[j] > sc[best])) best = j;
            load[best]++;
            sc[best] = -1e31f;
        }
    }
    free(x), free(W), free(gm), free(b), free(sc);
}

int main(void) {
    st_log_set_level(ST_LOG_WARN);
    const char *tmp = getenv("STRATA_TEST_TMP");
    if (!tmp || !*tmp) tmp = "/tmp";
    mkdir_p(tmp);
    char root[512], a[600], b[600], c2[600], m[600], sk[600];
    snprintf(root, sizeof root, "%s/test_ckpt_init.%d", tmp, (int)getpid());
    mkdir_p(root);
    snprintf(a, sizeof a, "%s/a", root);
    snprintf(b, sizeof b, "%s/b", root);
    snprintf(c2, sizeof c2, "%s/c", root);
    snprintf(m, sizeof m, "%s/mx", root);
    snprintf(sk, sizeof sk, "%s/skew", root);

    st_ckpt_init_opts_t o = {.preset = "tiny", .out_dir = a, .seed = 1, .dtype = ST_DT_BF16};
    CHECK(st_ckpt_init(&o) == ST_OK, "init tiny: %s", st_err_last());
    st_ckpt_t *ck = NULL;
    CHECK(st_ckpt_open(&ck, a) == ST_OK, "open tiny: %s", st_err_last());
    if (!ck) return st_test_done();

    /* config round trip */
    const st_config_t *c = st_ckpt_config(ck);
    st_config_t p;
    CHECK(st_config_preset(&p, "tiny") == ST_OK, "preset");
    CHECK(c->d == p.d && c->n_layers == p.n_layers && c->vocab == p.vocab && c->kda_heads == p.kda_heads &&
              c->kda_head_dim == p.kda_head_dim && c->mla_heads == p.mla_heads && c->q_lora_rank == p.q_lora_rank &&
              c->kv_lora_rank == p.kv_lora_rank && c->qk_nope == p.qk_nope && c->qk_rope == p.qk_rope &&
              c->v_head_dim == p.v_head_dim && c->n_experts == p.n_experts && c->top_k == p.top_k &&
              c->n_shared == p.n_shared && c->moe_inter == p.moe_inter && c->latent == p.latent &&
              c->intermediate == p.intermediate && c->attn_res_block == p.attn_res_block &&
              c->first_k_dense == p.first_k_dense && c->bos_id == 256 && c->eos_id == 257 &&
              c->rms_eps == p.rms_eps && c->gate_bounded && c->gate_lower_bound == -5.0f && c->full_rank_gate &&
              c->mla_output_gate && c->latent_norm && c->renormalize && c->routed_scale == 1.0f &&
              c->act == ST_ACT_SITU && c->situ_beta1 == 4.0f && c->situ_beta2 == 25.0f && !c->experts_mxfp4 &&
              !c->tie_embeddings,
          "config read back differs from the preset");
    CHECK(memcmp(c->is_mla, p.is_mla, sizeof p.is_mla) == 0 && c->is_mla[3] && c->is_mla[7] && !c->is_mla[0],
          "MLA layers");
    CHECK(c->f_rank == 32 && c->g_rank == 0, "f_rank %d g_rank %d from shapes", c->f_rank, c->g_rank);

    check_layout(ck, false, a);

    /* byte-level tokenizer of the presets; bos/eos (>= 256) decode to nothing */
    {
        const char *txt = "h\xc3\xa9llo\n";
        int ids[16];
        ids[0] = c->bos_id;
        int n = st_tok_encode(txt, ids + 1, 15);
        ids[1 + n] = c->eos_id;
        char back[16];
        int m = st_tok_decode(ids, n + 2, back, 16);
        CHECK(n == 7 && ids[2] == 0xc3 && m == 7 && memcmp(back, txt, 7) == 0, "tokenizer round trip");
        CHECK(st_tok_encode(txt, ids, 3) == 3, "encode respects max_ids");
    }

    /* views */
    st_weight_t w;
    CHECK(st_ckpt_weight(ck, "model.layers.0.self_attn.q_proj", 128, 128, &w) == ST_OK && w.dtype == ST_DT_BF16,
          "q_proj view");
    CHECK(st_ckpt_weight(ck, "model.layers.0.self_attn.q_proj", 128, 64, &w) == ST_ERR_CHECKPOINT &&
              strstr(st_err_last(), "q_proj.weight") && strstr(st_err_last(), "[128, 128]") &&
              strstr(st_err_last(), "[128, 64]"),
          "shape mismatch names tensor and both shapes: %s", st_err_last());
    float alog[128];
    CHECK(st_ckpt_vec_f32(ck, "model.layers.0.self_attn.A_log", 4, false, alog) != ST_OK, "A_log without pad");
    CHECK(st_ckpt_vec_f32(ck, "model.layers.0.self_attn.A_log", 4, true, alog) == ST_OK, "A_log: %s", st_err_last());
    bool alog_ok = true;
    for (int h = 0; h < 4; h++) alog_ok &= alog[h] >= 0.0f && alog[h] <= logf(16.0f) && alog[h] != 0.0f;
    CHECK(alog_ok, "A_log values in log(U(1,16))");
    float res[128];
    CHECK(st_ckpt_vec_f32(ck, "model.layers.2.mlp_res_proj.weight", 128, false, res) == ST_OK, "[1,d] vector");
    {
        double ss = 0;
        for (int i = 0; i < 128; i++) ss += (double)res[i] * res[i];
        CHECK(ss > 0.3 && ss < 3.0, "res_proj norm² %.3f ~ 1", ss);
    }
    float mat[128 * 128];
    CHECK(st_ckpt_weight(ck, "model.layers.0.self_attn.o_proj", 128, 128, &w) == ST_OK, "o_proj");
    st_weight_rows_f32(&w, 0, 128, mat);
    {
        double ss = 0;
        for (int i = 0; i < 128 * 128; i++) ss += (double)mat[i] * mat[i];
        CHECK(fabs(ss / 128 - 1.0) < 0.1, "o_proj row norm² %.3f ~ 1 (N/sqrt(fan_in))", ss / 128);
    }

    /* sizes */
    st_ckpt_sizes_t sz;
    CHECK(st_ckpt_sizes(ck, &sz) == ST_OK, "sizes");
    {
        int64_t p_all = 0, p_exp = 0, b_exp = 0, b_all = 0;
        for (int i = 0; i < g_nexp; i++) {
            int64_t n = numel(&g_exp[i]);
            p_all += n;
            b_all += n * 2 * (g_exp[i].dt == ST_DT_F32 ? 2 : 1);
            if (strstr(g_exp[i].name, ".experts.")) p_exp += n, b_exp += 2 * n;
        }
        CHECK(sz.params_total == p_all, "params_total %lld vs %lld", (long long)sz.params_total, (long long)p_all);
        CHECK(sz.params_active == p_all - p_exp + p_exp / 16 * 4, "params_active %lld", (long long)sz.params_active);
        CHECK(sz.bytes_routed_experts == b_exp && sz.bytes_attention_worker == b_all - b_exp, "bytes");
        CHECK(sz.bytes_per_expert_layer == 3 * 64 * 64 * 2, "bytes per expert %lld",
              (long long)sz.bytes_per_expert_layer);
    }

    /* no skew: roughly uniform */
    int load[16];
    router_loads(ck, load);
    {
        int mx = 0;
        for (int j = 0; j < 16; j++) mx = ST_MAX(mx, load[j]);
        double mean = 512.0 * 4 / 16;
        CHECK(mx < 2.0 * mean, "no skew: max load %d vs mean %.0f", mx, mean);
    }
    float emb_row_a[128];
    st_weight_t ew;
    CHECK(st_ckpt_weight(ck, "model.layers.1.block_sparse_moe.experts.5.w2", 64, 64, &ew) == ST_OK, "expert bf16");
    float ex_bf16[64 * 64];
    st_weight_rows_f32(&ew, 0, 64, ex_bf16);
    (void)emb_row_a;
    st_ckpt_close(ck);

    /* determinism */
    o.out_dir = b;
    CHECK(st_ckpt_init(&o) == ST_OK, "init again");
    CHECK(dirs_equal(a, b), "same seed gives identical files");
    o.out_dir = c2;
    o.seed = 2;
    CHECK(st_ckpt_init(&o) == ST_OK, "init seed 2");
    CHECK(!dirs_equal(a, c2), "different seed gives different files");

    /* MXFP4 experts */
    o.out_dir = m;
    o.seed = 1;
    o.mxfp4_experts = true;
    CHECK(st_ckpt_init(&o) == ST_OK, "init mxfp4: %s", st_err_last());
    ck = NULL;
    CHECK(st_ckpt_open(&ck, m) == ST_OK, "open mxfp4: %s", st_err_last());
    if (ck) {
        CHECK(st_ckpt_config(ck)->experts_mxfp4, "quantization_config → experts_mxfp4");
        check_layout(ck, true, m);
        CHECK(st_ckpt_weight(ck, "model.layers.1.block_sparse_moe.experts.5.w2", 64, 64, &ew) == ST_OK &&
                  ew.dtype == ST_DT_MXFP4 && ew.scale != NULL,
              "MXFP4 view: %s", st_err_last());
        float ex_mx[64 * 64];
        st_weight_rows_f32(&ew, 0, 64, ex_mx);
        /* the same seed draws the same values; MXFP4 (E2M1, group 32) keeps them within ~15% rel L2 */
        st_t_close("mxfp4 expert vs bf16 expert", ex_mx, ex_bf16, 64 * 64, 0.2, 1.0);
        CHECK(st_ckpt_weight(ck, "model.layers.1.block_sparse_moe.experts.5.w2", 64, 32, &ew) == ST_ERR_CHECKPOINT,
              "MXFP4 shape check");
        CHECK(st_ckpt_sizes(ck, &sz) == ST_OK && sz.bytes_per_expert_layer == 3 * (64 * 32 + 64 * 2),
              "mxfp4 bytes per expert %lld", (long long)sz.bytes_per_expert_layer);
        CHECK(sz.params_total > 0 && sz.bytes_routed_experts == 7LL * 16 * 3 * (64 * 32 + 64 * 2), "mxfp4 bytes");
        st_ckpt_close(ck);
    }

    /* skewed router: the hot experts (n/8 = 2) get >= 3x the mean top-k load */
    o.out_dir = sk;
    o.mxfp4_experts = false;
    o.skew_router = 4.0f;
    CHECK(st_ckpt_init(&o) == ST_OK, "init skew");
    ck = NULL;
    CHECK(st_ckpt_open(&ck, sk) == ST_OK, "open skew: %s", st_err_last());
    if (ck) {
        router_loads(ck, load);
        int top[2] = {0, 0};
        for (int j = 0; j < 16; j++) {
            if (load[j] > top[0]) top[1] = top[0], top[0] = load[j];
            else if (load[j] > top[1]) top[1] = load[j];
        }
        double mean = 512.0 * 4 / 16;
        printf("skew 4: hot loads %d %d, mean %.0f\n", top[0], top[1], mean);
        CHECK(top[0] >= 3 * mean && top[1] >= 3 * mean, "hot loads %d %d < 3x mean %.0f", top[0], top[1], mean);
        st_ckpt_close(ck);
    }

    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", root);
    return st_test_done();
}
