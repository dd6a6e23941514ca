/* libFuzzer harness: config.json text → st_config_parse. Beyond "no crash": a rejected input gets
 * ST_ERR_CONFIG and leaves the output untouched; an accepted one satisfies the ranges SPEC §1 and
 * the engine rely on (every derived width fits an int), and written back as flat JSON it parses to
 * the same struct. */
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz/fuzz.h"
#include "strata/model.h"

static int64_t prod(int64_t a, int64_t b) { return a * b; } /* inputs are ints: no int64 overflow */

static void check_ranges(const st_config_t *c) {
    FUZZ_REQUIRE(c->d > 0 && c->n_layers > 0 && c->n_layers <= ST_MAX_LAYERS && c->vocab > 0);
    FUZZ_REQUIRE(isfinite(c->rms_eps) && c->rms_eps > 0 && c->rms_eps < 1);
    FUZZ_REQUIRE(c->bos_id >= -1 && c->bos_id < c->vocab && c->eos_id >= -1 && c->eos_id < c->vocab);
    int n_mla = 0;
    for (int l = 0; l < ST_MAX_LAYERS; l++) {
        FUZZ_REQUIRE(!c->is_mla[l] || l < c->n_layers);
        n_mla += c->is_mla[l];
    }
    if (n_mla < c->n_layers) /* some KDA layer */
        FUZZ_REQUIRE(c->kda_heads > 0 && c->kda_head_dim > 0 && c->conv_k > 0);
    if (c->gate_bounded) FUZZ_REQUIRE(isfinite(c->gate_lower_bound) && c->gate_lower_bound < 0);
    FUZZ_REQUIRE(c->f_rank == 0 && c->g_rank == 0); /* from shapes, not the parser */
    if (n_mla > 0)
        FUZZ_REQUIRE(c->mla_heads > 0 && c->kv_lora_rank > 0 && c->qk_nope > 0 && c->v_head_dim > 0 && c->qk_rope >= 0 &&
                c->q_lora_rank >= 0);
    else
        FUZZ_REQUIRE(c->mla_heads == 0 && c->kv_lora_rank == 0 && c->qk_nope == 0 && c->v_head_dim == 0);
    FUZZ_REQUIRE(c->attn_res_block >= 0 && c->first_k_dense >= 0 && c->first_k_dense <= c->n_layers);
    FUZZ_REQUIRE(c->n_experts >= 0 && c->intermediate >= 0);
    if (c->n_experts == 0 || c->first_k_dense > 0) FUZZ_REQUIRE(c->intermediate > 0);
    if (c->n_experts > 0) {
        FUZZ_REQUIRE(c->top_k >= 1 && c->top_k <= c->n_experts && c->moe_inter > 0 && c->n_shared >= 0 && c->latent >= 0);
        FUZZ_REQUIRE(isfinite(c->routed_scale) && c->routed_scale > 0);
        if (c->experts_mxfp4) FUZZ_REQUIRE(st_config_expert_width(c) % 32 == 0 && c->moe_inter % 32 == 0);
    }
    FUZZ_REQUIRE(c->act == ST_ACT_SITU || c->act == ST_ACT_SILU);
    FUZZ_REQUIRE(isfinite(c->situ_beta1) && c->situ_beta1 > 0 && isfinite(c->situ_beta2) && c->situ_beta2 > 0);
    /* the widths the engine forms from these (engine_weights.c, engine.c) fit an int */
    const int64_t widths[] = {
        prod(c->kda_heads, c->kda_head_dim),
        prod(c->mla_heads, (int64_t)c->qk_nope + c->qk_rope),
        prod(c->mla_heads, (int64_t)c->qk_nope + c->v_head_dim),
        prod(c->mla_heads, c->kv_lora_rank),
        (int64_t)c->kv_lora_rank + c->qk_rope,
        prod(c->n_shared, c->moe_inter),
        c->d, c->intermediate, c->moe_inter, c->latent, c->q_lora_rank,
    };
    for (size_t i = 0; i < sizeof widths / sizeof widths[0]; i++) FUZZ_REQUIRE(widths[i] >= 0 && widths[i] <= INT_MAX / 4);
}

static bool feq(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

static bool same_cfg(const st_config_t *a, const st_config_t *b) {
    return a->d == b->d && a->n_layers == b->n_layers && a->vocab == b->vocab && feq(a->rms_eps, b->rms_eps) &&
           a->tie_embeddings == b->tie_embeddings && a->bos_id == b->bos_id && a->eos_id == b->eos_id &&
           a->kda_heads == b->kda_heads && a->kda_head_dim == b->kda_head_dim && a->conv_k == b->conv_k &&
           a->gate_bounded == b->gate_bounded && (!a->gate_bounded || feq(a->gate_lower_bound, b->gate_lower_bound)) &&
           a->full_rank_gate == b->full_rank_gate && memcmp(a->is_mla, b->is_mla, sizeof a->is_mla) == 0 &&
           a->mla_heads == b->mla_heads && a->q_lora_rank == b->q_lora_rank && a->kv_lora_rank == b->kv_lora_rank &&
           a->qk_nope == b->qk_nope && a->qk_rope == b->qk_rope && a->v_head_dim == b->v_head_dim &&
           a->mla_output_gate == b->mla_output_gate && a->attn_res_block == b->attn_res_block &&
           a->first_k_dense == b->first_k_dense && a->intermediate == b->intermediate &&
           a->n_experts == b->n_experts && a->top_k == b->top_k && a->n_shared == b->n_shared &&
           a->moe_inter == b->moe_inter && a->latent == b->latent && a->latent_norm == b->latent_norm &&
           a->renormalize == b->renormalize && feq(a->routed_scale, b->routed_scale) && a->act == b->act &&
           feq(a->situ_beta1, b->situ_beta1) && feq(a->situ_beta2, b->situ_beta2) &&
           a->experts_mxfp4 == b->experts_mxfp4;
}

#define SETI(o, k, v) json_object_set_new((o), (k), json_integer(v))
#define SETR(o, k, v) json_object_set_new((o), (k), json_real((double)(v)))
#define SETB(o, k, v) json_object_set_new((o), (k), json_boolean(v))

/* The flat config.json that describes c. */
static json_t *write_cfg(const st_config_t *c) {
    json_t *o = json_object();
    SETI(o, "hidden_size", c->d);
    SETI(o, "num_hidden_layers", c->n_layers);
    SETI(o, "vocab_size", c->vocab);
    SETR(o, "rms_norm_eps", c->rms_eps);
    SETB(o, "tie_word_embeddings", c->tie_embeddings);
    if (c->bos_id >= 0) SETI(o, "bos_token_id", c->bos_id);
    if (c->eos_id >= 0) SETI(o, "eos_token_id", c->eos_id);
    if (c->kda_heads > 0) {
        json_t *lac = json_object(), *full = json_array();
        SETI(lac, "num_heads", c->kda_heads);
        SETI(lac, "head_dim", c->kda_head_dim);
        SETI(lac, "short_conv_kernel_size", c->conv_k);
        if (c->gate_bounded) SETR(lac, "gate_lower_bound", c->gate_lower_bound);
        SETB(lac, "use_full_rank_gate", c->full_rank_gate);
        for (int l = 0; l < c->n_layers; l++)
            if (c->is_mla[l]) json_array_append_new(full, json_integer(l + 1));
        json_object_set_new(lac, "full_attn_layers", full);
        json_object_set_new(o, "linear_attn_config", lac);
    }
    if (c->mla_heads > 0) {
        SETI(o, "num_attention_heads", c->mla_heads);
        if (c->q_lora_rank > 0) SETI(o, "q_lora_rank", c->q_lora_rank);
        SETI(o, "kv_lora_rank", c->kv_lora_rank);
        SETI(o, "qk_nope_head_dim", c->qk_nope);
        SETI(o, "qk_rope_head_dim", c->qk_rope);
        SETI(o, "v_head_dim", c->v_head_dim);
    }
    SETB(o, "mla_use_output_gate", c->mla_output_gate);
    SETI(o, "attn_res_block_size", c->attn_res_block);
    SETI(o, "num_experts", c->n_experts);
    SETI(o, "first_k_dense_replace", c->first_k_dense);
    if (c->intermediate > 0) SETI(o, "intermediate_size", c->intermediate);
    if (c->n_experts > 0) {
        SETI(o, "num_experts_per_token", c->top_k);
        SETI(o, "num_shared_experts", c->n_shared);
        SETI(o, "moe_intermediate_size", c->moe_inter);
        SETI(o, "routed_expert_hidden_size", c->latent);
        SETB(o, "latent_moe_use_norm", c->latent_norm);
        SETB(o, "moe_renormalize", c->renormalize);
        SETR(o, "routed_scaling_factor", c->routed_scale);
    }
    json_object_set_new(o, "hidden_act", json_string(c->act == ST_ACT_SITU ? "situ" : "silu"));
    SETR(o, "activation_situ_beta", c->situ_beta1);
    SETR(o, "activation_situ_linear_beta", c->situ_beta2);
    if (c->experts_mxfp4)
        json_object_set_new(o, "quantization_config", json_pack("{s:s}", "format", "mxfp4-pack-quantized"));
    return o;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = 0;
    st_config_t c, before;
    memset(&c, 0xa5, sizeof c);
    memcpy(&before, &c, sizeof c);
    st_status_t s = st_config_parse(&c, text);
    free(text);
    if (s != ST_OK) {
        FUZZ_REQUIRE(s == ST_ERR_CONFIG);
        FUZZ_REQUIRE(memcmp(&c, &before, sizeof c) == 0); /* output written only on success */
        return 0;
    }
    check_ranges(&c);
    json_t *o = write_cfg(&c);
    char *again = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    FUZZ_REQUIRE(again);
    st_config_t c2;
    s = st_config_parse(&c2, again);
    if (s != ST_OK) fprintf(stderr, "fuzz_config: round trip of %s: %s\n", again, st_err_last());
    FUZZ_REQUIRE(s == ST_OK);
    FUZZ_REQUIRE(same_cfg(&c, &c2));
    free(again);
    return 0;
}
