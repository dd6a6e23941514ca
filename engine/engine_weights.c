/* Engine weight binding: resolves every tensor the attention worker needs from an open checkpoint
 * (views into the mmap for matrices, fp32 copies for vectors), with shapes checked against the
 * config. Routed experts are bound too when the engine runs them locally. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

#include "engine_impl.h"

#define NAME_MAX_LEN 256
#define TRY(x)                                                                                    \
    do {                                                                                          \
        st_status_t s_ = (x);                                                                     \
        if (s_ != ST_OK) return s_;                                                               \
    } while (0)

/* a*b (+ c) as a matrix width, or -1 when it is not in 1..INT_MAX. NOTE: widths multiply config.json
 * values (each up to 2^30 as parsed), so they are formed in 64 bits and checked before any int use. */
static int width(int64_t a, int64_t b, int64_t c) {
    int64_t w = a * b + c;
    return a >= 0 && b >= 0 && c >= 0 && w > 0 && w <= INT_MAX ? (int)w : -1;
}
#define WIDTH_OR_FAIL(var, a, b, c, what)                                                                     \
    do {                                                                                                      \
        (var) = width((a), (b), (c));                                                                         \
        if ((var) < 0) return ST_FAIL(ST_ERR_CHECKPOINT, "layer %d: %s width out of range", l, (what));       \
    } while (0)

static st_status_t wt(const st_ckpt_t *ck, st_weight_t *w, int rows, int cols, const char *fmt, int l) {
    char stem[NAME_MAX_LEN];
    snprintf(stem, sizeof stem, fmt, l);
    return st_ckpt_weight(ck, stem, rows, cols, w);
}

static st_status_t vec(const st_ckpt_t *ck, float **dst, int n, bool pad, const char *fmt, int l) {
    char name[NAME_MAX_LEN];
    snprintf(name, sizeof name, fmt, l);
    *dst = malloc((size_t)n * sizeof(float));
    if (!*dst) return ST_FAIL(ST_ERR_NO_MEMORY, "vector %s", name);
    return st_ckpt_vec_f32(ck, name, n, pad, *dst);
}

/* depthwise conv weight [C, 1, K] → fp32 [C, K] */
static st_status_t conv_w(const st_ckpt_t *ck, float **dst, int C, int K, const char *fmt, int l) {
    char name[NAME_MAX_LEN];
    snprintf(name, sizeof name, fmt, l);
    int64_t shape[3] = {C, 1, K};
    const st_tensor_t *t;
    TRY(st_ckpt_get(ck, name, 3, shape, &t));
    *dst = malloc((size_t)C * (size_t)K * sizeof(float));
    if (!*dst) return ST_FAIL(ST_ERR_NO_MEMORY, "conv weight %s", name);
    st_weight_t w = {.dtype = t->dtype, .rows = C, .cols = K, .data = t->data};
    if (t->dtype != ST_DT_F32 && t->dtype != ST_DT_BF16 && t->dtype != ST_DT_F16)
        return ST_FAIL(ST_ERR_CHECKPOINT, "tensor '%s' has dtype %s, expected a float type", name, st_dtype_name(t->dtype));
    st_weight_rows_f32(&w, 0, C, *dst);
    return ST_OK;
}

/* w_eff = γ ⊙ w of one AttnRes sublayer (SPEC §5: the norm weight folds into the query). */
static st_status_t res_weff(const st_ckpt_t *ck, float **dst, int d, const char *norm_fmt,
                            const char *proj_fmt, int l) {
    float *g = NULL;
    st_status_t s = vec(ck, &g, d, false, norm_fmt, l);
    if (s == ST_OK) s = vec(ck, dst, d, false, proj_fmt, l);
    if (s == ST_OK)
        for (int c = 0; c < d; c++) (*dst)[c] *= g[c];
    free(g);
    return s;
}


static st_status_t bind_kda(const st_ckpt_t *ck, const st_config_t *c, st_layer_w_t *L, int l) {
    int H = c->kda_heads, dk = c->kda_head_dim, dv = dk, P, d = c->d; /* P = H * dk = H * dv */
    WIDTH_OR_FAIL(P, H, dk, 0, "KDA heads x head_dim");
    if (c->f_rank <= 0) return ST_FAIL(ST_ERR_CHECKPOINT, "layer %d: f_a_proj rank unknown", l);
    TRY(wt(ck, &L->q, P, d, "model.layers.%d.self_attn.q_proj", l));
    TRY(wt(ck, &L->k, P, d, "model.layers.%d.self_attn.k_proj", l));
    TRY(wt(ck, &L->v, P, d, "model.layers.%d.self_attn.v_proj", l));
    TRY(conv_w(ck, &L->conv_q, P, c->conv_k, "model.layers.%d.self_attn.q_conv1d.weight", l));
    TRY(conv_w(ck, &L->conv_k, P, c->conv_k, "model.layers.%d.self_attn.k_conv1d.weight", l));
    TRY(conv_w(ck, &L->conv_v, P, c->conv_k, "model.layers.%d.self_attn.v_conv1d.weight", l));
    TRY(wt(ck, &L->f_a, c->f_rank, d, "model.layers.%d.self_attn.f_a_proj", l));
    TRY(wt(ck, &L->f_b, P, c->f_rank, "model.layers.%d.self_attn.f_b_proj", l));
    TRY(vec(ck, &L->A_log, H, true, "model.layers.%d.self_attn.A_log", l));
    TRY(vec(ck, &L->dt_bias, P, false, "model.layers.%d.self_attn.dt_bias", l));
    TRY(wt(ck, &L->b, H, d, "model.layers.%d.self_attn.b_proj", l));
    TRY(vec(ck, &L->o_norm, dv, false, "model.layers.%d.self_attn.o_norm.weight", l));
    if (c->full_rank_gate) {
        TRY(wt(ck, &L->g, P, d, "model.layers.%d.self_attn.g_proj", l));
    } else {
        if (c->g_rank <= 0) return ST_FAIL(ST_ERR_CHECKPOINT, "layer %d: g_a_proj rank unknown", l);
        TRY(wt(ck, &L->g_a, c->g_rank, d, "model.layers.%d.self_attn.g_a_proj", l));
        TRY(wt(ck, &L->g, P, c->g_rank, "model.layers.%d.self_attn.g_b_proj", l));
    }
    TRY(wt(ck, &L->o, d, P, "model.layers.%d.self_attn.o_proj", l));
    return ST_OK;
}

static st_status_t bind_mla(const st_ckpt_t *ck, const st_config_t *c, st_layer_w_t *L, int l) {
    int H = c->mla_heads, d = c->d, q_w, kva_w, kvb_w, v_w;
    WIDTH_OR_FAIL(q_w, H, (int64_t)c->qk_nope + c->qk_rope, 0, "MLA query");
    WIDTH_OR_FAIL(kva_w, c->kv_lora_rank, 1, c->qk_rope, "MLA kv_a");
    WIDTH_OR_FAIL(kvb_w, H, (int64_t)c->qk_nope + c->v_head_dim, 0, "MLA kv_b");
    WIDTH_OR_FAIL(v_w, H, c->v_head_dim, 0, "MLA value");
    if (c->q_lora_rank > 0) {
        TRY(wt(ck, &L->q_a, c->q_lora_rank, d, "model.layers.%d.self_attn.q_a_proj", l));
        TRY(vec(ck, &L->q_a_norm, c->q_lora_rank, false, "model.layers.%d.self_attn.q_a_layernorm.weight", l));
        TRY(wt(ck, &L->q, q_w, c->q_lora_rank, "model.layers.%d.self_attn.q_b_proj", l));
    } else {
        TRY(wt(ck, &L->q, q_w, d, "model.layers.%d.self_attn.q_proj", l));
    }
    TRY(wt(ck, &L->kv_a, kva_w, d, "model.layers.%d.self_attn.kv_a_proj_with_mqa", l));
    TRY(vec(ck, &L->kv_a_norm, c->kv_lora_rank, false, "model.layers.%d.self_attn.kv_a_layernorm.weight", l));
    TRY(wt(ck, &L->kv_b, kvb_w, c->kv_lora_rank, "model.layers.%d.self_attn.kv_b_proj", l));
    /* fp32 copy of W_UKV for the absorbed decode form */
    size_t n = (size_t)L->kv_b.rows * (size_t)L->kv_b.cols;
    L->kv_b_f32 = malloc(n * sizeof(float));
    if (!L->kv_b_f32) return ST_FAIL(ST_ERR_NO_MEMORY, "layer %d: kv_b copy", l);
    st_weight_rows_f32(&L->kv_b, 0, L->kv_b.rows, L->kv_b_f32);
    if (c->mla_output_gate)
        TRY(wt(ck, &L->g, v_w, d, "model.layers.%d.self_attn.g_proj", l));
    TRY(wt(ck, &L->o, d, v_w, "model.layers.%d.self_attn.o_proj", l));
    return ST_OK;
}

static st_status_t bind_ffn(const st_ckpt_t *ck, const st_config_t *c, st_ffn_w_t *f, int width,
                            const char *prefix, int l) {
    char fmt[NAME_MAX_LEN];
    snprintf(fmt, sizeof fmt, "model.layers.%%d.%s.gate_proj", prefix);
    TRY(wt(ck, &f->gate, width, c->d, fmt, l));
    snprintf(fmt, sizeof fmt, "model.layers.%%d.%s.up_proj", prefix);
    TRY(wt(ck, &f->up, width, c->d, fmt, l));
    snprintf(fmt, sizeof fmt, "model.layers.%%d.%s.down_proj", prefix);
    TRY(wt(ck, &f->down, c->d, width, fmt, l));
    return ST_OK;
}

static st_status_t bind_moe(const st_ckpt_t *ck, const st_config_t *c, st_layer_w_t *L, int l,
                            bool local_experts) {
    int d = c->d, n = c->n_experts;
    TRY(wt(ck, &L->router, n, d, "model.layers.%d.block_sparse_moe.gate", l));
    char name[NAME_MAX_LEN];
    snprintf(name, sizeof name, "model.layers.%d.block_sparse_moe.gate.e_score_correction_bias", l);
    if (st_ckpt_find(ck, name)) { /* optional: absent = no selection bias */
        L->router_bias = malloc((size_t)n * sizeof(float));
        if (!L->router_bias) return ST_FAIL(ST_ERR_NO_MEMORY, "router bias");
        TRY(st_ckpt_vec_f32(ck, name, n, false, L->router_bias));
    }
    if (c->latent > 0) {
        TRY(wt(ck, &L->lat_down, c->latent, d, "model.layers.%d.block_sparse_moe.routed_expert_down_proj", l));
        TRY(wt(ck, &L->lat_up, d, c->latent, "model.layers.%d.block_sparse_moe.routed_expert_up_proj", l));
        if (c->latent_norm)
            TRY(vec(ck, &L->lat_norm, c->latent, false, "model.layers.%d.block_sparse_moe.routed_expert_norm.weight", l));
    }
    if (c->n_shared > 0) {
        int sw;
        WIDTH_OR_FAIL(sw, c->n_shared, c->moe_inter, 0, "shared experts");
        TRY(bind_ffn(ck, c, &L->shared, sw, "block_sparse_moe.shared_experts", l));
    }
    if (local_experts) {
        L->experts = calloc((size_t)n, sizeof(st_expert_weights_t));
        if (!L->experts) return ST_FAIL(ST_ERR_NO_MEMORY, "expert table");
        for (int j = 0; j < n; j++) TRY(st_ckpt_expert(ck, l, j, &L->experts[j]));
    }
    return ST_OK;
}

st_status_t st_engine_bind(st_engine_w_t *W, const st_ckpt_t *ck, bool local_experts) {
    const st_config_t *c = st_ckpt_config(ck);
    int d = c->d;
    memset(W, 0, sizeof *W);
    W->layers = calloc((size_t)c->n_layers, sizeof(st_layer_w_t));
    if (!W->layers) return ST_FAIL(ST_ERR_NO_MEMORY, "layer table");
    W->n_layers = c->n_layers;
    TRY(wt(ck, &W->embed, c->vocab, d, "model.embed_tokens", 0));
    TRY(vec(ck, &W->final_norm, d, false, "model.norm.weight", 0));
    if (c->tie_embeddings) W->lm_head = W->embed;
    else TRY(wt(ck, &W->lm_head, c->vocab, d, "lm_head", 0));
    if (c->attn_res_block > 0)
        TRY(res_weff(ck, &W->out_res, d, "model.output_attn_res_norm.weight", "model.output_attn_res_proj.weight", 0));
    for (int l = 0; l < c->n_layers; l++) {
        st_layer_w_t *L = &W->layers[l];
        TRY(vec(ck, &L->in_norm, d, false, "model.layers.%d.input_layernorm.weight", l));
        TRY(vec(ck, &L->post_norm, d, false, "model.layers.%d.post_attention_layernorm.weight", l));
        if (c->attn_res_block > 0) {
            TRY(res_weff(ck, &L->attn_res, d, "model.layers.%d.self_attention_res_norm.weight",
                         "model.layers.%d.self_attention_res_proj.weight", l));
            TRY(res_weff(ck, &L->mlp_res, d, "model.layers.%d.mlp_res_norm.weight",
                         "model.layers.%d.mlp_res_proj.weight", l));
        }
        TRY(c->is_mla[l] ? bind_mla(ck, c, L, l) : bind_kda(ck, c, L, l));
        if (st_config_is_moe_layer(c, l)) TRY(bind_moe(ck, c, L, l, local_experts));
        else TRY(bind_ffn(ck, c, &L->dense, c->intermediate, "mlp", l));
    }
    return ST_OK;
}

void st_engine_unbind(st_engine_w_t *W) {
    if (!W->layers) return;
    free(W->final_norm);
    free(W->out_res);
    for (int l = 0; l < W->n_layers; l++) {
        st_layer_w_t *L = &W->layers[l];
        free(L->in_norm); free(L->post_norm); free(L->attn_res); free(L->mlp_res);
        free(L->conv_q); free(L->conv_k); free(L->conv_v); free(L->A_log); free(L->dt_bias);
        free(L->o_norm); free(L->q_a_norm); free(L->kv_a_norm); free(L->kv_b_f32);
        free(L->router_bias); free(L->lat_norm); free(L->experts);
    }
    free(W->layers);
    memset(W, 0, sizeof *W);
}
