/* Internal structures of the engine: bound weights, state pools, step buffers. */
#ifndef STRATA_ENGINE_IMPL_H
#define STRATA_ENGINE_IMPL_H

#include "strata/engine.h"

typedef struct {
    st_weight_t gate, up, down; /* [w, d], [w, d], [d, w] */
} st_ffn_w_t;

typedef struct {
    float *in_norm, *post_norm;   /* [d] */
    float *attn_res, *mlp_res;    /* [d] w_eff = γ ⊙ w, NULL without AttnRes */
    /* KDA */
    st_weight_t q, k, v;          /* [H*dk, d]; MLA: q = q_b_proj [H*dqk, q_lora] or q_proj */
    float *conv_q, *conv_k, *conv_v; /* [C, K] */
    st_weight_t f_a, f_b;         /* [r, d], [H*dk, r] */
    float *A_log, *dt_bias;       /* [H], [H*dk] */
    st_weight_t b;                /* [H, d] */
    float *o_norm;                /* [dv] */
    st_weight_t g_a, g;           /* output gate: g [H*dv, d] (full rank) or g_b [H*dv, r] after g_a */
    st_weight_t o;                /* [d, H*dv] */
    /* MLA */
    st_weight_t q_a;              /* [q_lora, d] */
    float *q_a_norm;              /* [q_lora] */
    st_weight_t kv_a;             /* [kv_lora + rope, d] */
    float *kv_a_norm;             /* [kv_lora] */
    st_weight_t kv_b;             /* [H*(nope+v), kv_lora] */
    float *kv_b_f32;              /* same, fp32, for the absorbed form */
    /* FFN */
    st_ffn_w_t dense;
    st_weight_t router;           /* [n, d] */
    float *router_bias;           /* [n] or NULL */
    st_weight_t lat_down, lat_up; /* [ℓ, d], [d, ℓ] */
    float *lat_norm;              /* [ℓ] or NULL */
    st_ffn_w_t shared;
    st_expert_weights_t *experts; /* [n] when run locally, else NULL */
} st_layer_w_t;

typedef struct {
    int n_layers;
    st_weight_t embed, lm_head;   /* [V, d] */
    float *final_norm, *out_res;  /* [d] */
    st_layer_w_t *layers;
} st_engine_w_t;

st_status_t st_engine_bind(st_engine_w_t *W, const st_ckpt_t *ck, bool local_experts);
void st_engine_unbind(st_engine_w_t *W);

#endif
