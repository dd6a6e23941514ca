/* config.json → st_config_t (SPEC §1), validation, and the presets of `strata ckpt init`.
 * Widths that come from tensor shapes (f_a/g_a ranks) are filled by st_ckpt_open, not here. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_impl.h"

#define CFG_FAIL(...) ST_FAIL(ST_ERR_CONFIG, "config.json: " __VA_ARGS__)

/* ---- typed getters: absent keys take the default; present keys of the wrong type are errors ---- */

static st_status_t get_int(json_t *obj, const char *key, const char *path, bool required, int64_t def,
                           int64_t *out) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        if (required) return CFG_FAIL("key '%s%s' is missing", path, key);
        *out = def;
        return ST_OK;
    }
    if (json_is_integer(v)) {
        *out = (int64_t)json_integer_value(v);
        return ST_OK;
    }
    if (json_is_real(v)) { /* accept 4.0 for 4 */
        double d = json_real_value(v);
        if (isfinite(d) && d == floor(d) && fabs(d) < 1e15) {
            *out = (int64_t)d;
            return ST_OK;
        }
    }
    return CFG_FAIL("key '%s%s' must be an integer", path, key);
}

static st_status_t get_pos_int(json_t *obj, const char *key, const char *path, bool required, int def,
                               int *out) {
    int64_t v = 0;
    st_status_t s = get_int(obj, key, path, required, def, &v);
    if (s) return s;
    if (v <= 0 || v > (1 << 30))
        return CFG_FAIL("key '%s%s' must be a positive integer (got %lld)", path, key, (long long)v);
    *out = (int)v;
    return ST_OK;
}

static st_status_t get_nonneg_int(json_t *obj, const char *key, const char *path, int def, int *out) {
    int64_t v = 0;
    st_status_t s = get_int(obj, key, path, false, def, &v);
    if (s) return s;
    if (v < 0 || v > (1 << 30))
        return CFG_FAIL("key '%s%s' must be a non-negative integer (got %lld)", path, key, (long long)v);
    *out = (int)v;
    return ST_OK;
}

static st_status_t get_num(json_t *obj, const char *key, const char *path, bool *present, double def,
                           double *out) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        if (present) *present = false;
        *out = def;
        return ST_OK;
    }
    if (!json_is_number(v)) return CFG_FAIL("key '%s%s' must be a number", path, key);
    double d = json_number_value(v);
    if (!isfinite(d)) return CFG_FAIL("key '%s%s' must be finite", path, key);
    if (present) *present = true;
    *out = d;
    return ST_OK;
}

/* d as a float: refuses a value that overflows to ±inf or underflows to 0 (the checks that follow
 * are on the float the model uses, not on the double that was written) */
static st_status_t to_float(double d, const char *path, const char *key, float *out) {
    float f = (float)d;
    if (!isfinite(f) || (f == 0.0f && d != 0.0))
        return CFG_FAIL("key '%s%s' = %g is outside the range of a float", path, key, d);
    *out = f;
    return ST_OK;
}

/* The widths the engine forms from the config must fit comfortably in an int (see model.h). */
static st_status_t check_widths(const st_config_t *z) {
    const struct {
        const char *key;
        int64_t w;
    } k[] = {
        {"hidden_size", z->d},
        {"intermediate_size", z->intermediate},
        {"moe_intermediate_size", z->moe_inter},
        {"routed_expert_hidden_size", z->latent},
        {"q_lora_rank", z->q_lora_rank},
        {"linear_attn_config.num_heads' x 'linear_attn_config.head_dim", (int64_t)z->kda_heads * z->kda_head_dim},
        {"linear_attn_config.head_dim' x 'linear_attn_config.head_dim", (int64_t)z->kda_head_dim * z->kda_head_dim},
        {"num_attention_heads' x 'qk_nope_head_dim + qk_rope_head_dim",
         (int64_t)z->mla_heads * ((int64_t)z->qk_nope + z->qk_rope)},
        {"num_attention_heads' x 'qk_nope_head_dim + v_head_dim",
         (int64_t)z->mla_heads * ((int64_t)z->qk_nope + z->v_head_dim)},
        {"num_attention_heads' x 'kv_lora_rank", (int64_t)z->mla_heads * z->kv_lora_rank},
        {"kv_lora_rank' + 'qk_rope_head_dim", (int64_t)z->kv_lora_rank + z->qk_rope},
        {"num_shared_experts' x 'moe_intermediate_size", (int64_t)z->n_shared * z->moe_inter},
    };
    for (size_t i = 0; i < ST_ARRAY_LEN(k); i++)
        if (k[i].w > ST_CONFIG_MAX_WIDTH)
            return CFG_FAIL("key '%s' = %lld exceeds the supported maximum width %d", k[i].key, (long long)k[i].w,
                            ST_CONFIG_MAX_WIDTH);
    return ST_OK;
}

static st_status_t get_bool(json_t *obj, const char *key, const char *path, bool def, bool *out) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return ST_OK;
    }
    if (!json_is_boolean(v)) return CFG_FAIL("key '%s%s' must be true or false", path, key);
    *out = json_is_true(v);
    return ST_OK;
}

static st_status_t get_str(json_t *obj, const char *key, const char *path, const char *def, const char **out) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return ST_OK;
    }
    if (!json_is_string(v)) return CFG_FAIL("key '%s%s' must be a string", path, key);
    *out = json_string_value(v);
    return ST_OK;
}

/* bos/eos: an integer, or a list whose first entry is used (some HF configs list several eos) */
static st_status_t get_token_id(json_t *tc, json_t *top, const char *key, int vocab, int *out) {
    json_t *v = json_object_get(tc, key);
    if (!v || json_is_null(v)) v = json_object_get(top, key);
    if (!v || json_is_null(v)) {
        *out = -1;
        return ST_OK;
    }
    if (json_is_array(v) && json_array_size(v) > 0) v = json_array_get(v, 0);
    if (!json_is_integer(v)) return CFG_FAIL("key '%s' must be an integer token id", key);
    json_int_t id = json_integer_value(v);
    if (id < 0 || id >= vocab)
        return CFG_FAIL("key '%s' = %lld is outside the vocabulary [0, %d)", key, (long long)id, vocab);
    *out = (int)id;
    return ST_OK;
}

/* A 1-based layer list: entries in 1..n_layers, no repeats. mark[l] set for each (0-based). */
static st_status_t get_layer_list(json_t *lac, const char *key, int n_layers, bool *mark, bool *present) {
    json_t *v = json_object_get(lac, key);
    *present = false;
    if (!v || json_is_null(v)) return ST_OK;
    if (!json_is_array(v)) return CFG_FAIL("key 'linear_attn_config.%s' must be a list of layer numbers", key);
    *present = true;
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e) {
        if (!json_is_integer(e))
            return CFG_FAIL("key 'linear_attn_config.%s' entry %zu is not an integer", key, i);
        json_int_t x = json_integer_value(e);
        if (x < 1 || x > n_layers)
            return CFG_FAIL("key 'linear_attn_config.%s' entry %lld is outside 1..%d (1-based layers)", key,
                            (long long)x, n_layers);
        if (mark[x - 1]) return CFG_FAIL("key 'linear_attn_config.%s' lists layer %lld twice", key, (long long)x);
        mark[x - 1] = true;
    }
    return ST_OK;
}

static st_status_t parse_quant(json_t *q, st_config_t *c) {
    if (!json_is_object(q)) return CFG_FAIL("key 'quantization_config' must be an object");
    const char *fmt = NULL;
    st_status_t s = get_str(q, "format", "quantization_config.", NULL, &fmt);
    if (s) return s;
    if (!fmt) return CFG_FAIL("key 'quantization_config.format' is missing");
    if (strcmp(fmt, "mxfp4-pack-quantized") != 0)
        return CFG_FAIL("key 'quantization_config.format' = \"%s\" is not supported (only mxfp4-pack-quantized)",
                        fmt);
    /* If the group description is present it must say what MXFP4 means: 4-bit, groups of 32. */
    json_t *groups = json_object_get(q, "config_groups");
    if (groups && json_is_object(groups)) {
        const char *gname;
        json_t *g;
        json_object_foreach(groups, gname, g) {
            json_t *w = json_is_object(g) ? json_object_get(g, "weights") : NULL;
            if (!json_is_object(w)) continue;
            json_t *gs = json_object_get(w, "group_size"), *nb = json_object_get(w, "num_bits");
            if (gs && json_is_integer(gs) && json_integer_value(gs) != 32)
                return CFG_FAIL("key 'quantization_config.config_groups.%s.weights.group_size' must be 32", gname);
            if (nb && json_is_integer(nb) && json_integer_value(nb) != 4)
                return CFG_FAIL("key 'quantization_config.config_groups.%s.weights.num_bits' must be 4", gname);
        }
    }
    c->experts_mxfp4 = true;
    return ST_OK;
}

static st_status_t parse_obj(st_config_t *c, json_t *top) {
    if (!json_is_object(top)) return CFG_FAIL("top level is not a JSON object");
    json_t *tc = json_object_get(top, "text_config");
    if (tc && !json_is_null(tc) && !json_is_object(tc)) return CFG_FAIL("key 'text_config' must be an object");
    if (!tc || json_is_null(tc)) tc = top;

    st_config_t z;
    memset(&z, 0, sizeof z);
    st_status_t s;
    double dv = 0;
    bool present;
    const char *str;

    /* trunk */
    if ((s = get_pos_int(tc, "hidden_size", "", true, 0, &z.d))) return s;
    if ((s = get_pos_int(tc, "num_hidden_layers", "", true, 0, &z.n_layers))) return s;
    if (z.n_layers > ST_MAX_LAYERS)
        return CFG_FAIL("key 'num_hidden_layers' = %d exceeds the supported maximum %d", z.n_layers, ST_MAX_LAYERS);
    if ((s = get_pos_int(tc, "vocab_size", "", true, 0, &z.vocab))) return s;
    if ((s = get_num(tc, "rms_norm_eps", "", NULL, 1e-5, &dv))) return s;
    if (!(dv > 0 && dv < 1)) return CFG_FAIL("key 'rms_norm_eps' must be in (0, 1)");
    if ((s = to_float(dv, "", "rms_norm_eps", &z.rms_eps))) return s;
    if (!(z.rms_eps < 1.0f)) return CFG_FAIL("key 'rms_norm_eps' must be in (0, 1) as a float (got %.9g)", dv);
    {
        json_t *tie = json_object_get(tc, "tie_word_embeddings");
        json_t *src = (tie && !json_is_null(tie)) ? tc : top;
        if ((s = get_bool(src, "tie_word_embeddings", "", false, &z.tie_embeddings))) return s;
    }
    if ((s = get_token_id(tc, top, "bos_token_id", z.vocab, &z.bos_id))) return s;
    if ((s = get_token_id(tc, top, "eos_token_id", z.vocab, &z.eos_id))) return s;

    /* KDA. Without linear_attn_config every layer is MLA. */
    json_t *lac = json_object_get(tc, "linear_attn_config");
    if (lac && !json_is_null(lac)) {
        const char *p = "linear_attn_config.";
        if (!json_is_object(lac)) return CFG_FAIL("key 'linear_attn_config' must be an object");
        if ((s = get_pos_int(lac, "num_heads", p, true, 0, &z.kda_heads))) return s;
        if ((s = get_pos_int(lac, "head_dim", p, true, 0, &z.kda_head_dim))) return s;
        if ((s = get_pos_int(lac, "short_conv_kernel_size", p, false, 4, &z.conv_k))) return s;
        if ((s = get_num(lac, "gate_lower_bound", p, &present, 0.0, &dv))) return s;
        if (present && !(dv < 0))
            return CFG_FAIL("key 'linear_attn_config.gate_lower_bound' must be negative (got %g)", dv);
        z.gate_bounded = present;
        if (present && (s = to_float(dv, p, "gate_lower_bound", &z.gate_lower_bound))) return s;
        if ((s = get_bool(lac, "use_full_rank_gate", p, false, &z.full_rank_gate))) return s;
        bool full_present, kda_present;
        bool kda_mark[ST_MAX_LAYERS] = {false};
        if ((s = get_layer_list(lac, "full_attn_layers", z.n_layers, z.is_mla, &full_present))) return s;
        if ((s = get_layer_list(lac, "kda_layers", z.n_layers, kda_mark, &kda_present))) return s;
        if (!full_present && !kda_present)
            return CFG_FAIL("key 'linear_attn_config.full_attn_layers' is missing (and no kda_layers)");
        if (!full_present) /* derive MLA layers as the complement of kda_layers */
            for (int l = 0; l < z.n_layers; l++) z.is_mla[l] = !kda_mark[l];
        if (kda_present && full_present)
            for (int l = 0; l < z.n_layers; l++)
                if (kda_mark[l] == z.is_mla[l])
                    return CFG_FAIL("keys 'linear_attn_config.kda_layers' and 'full_attn_layers' disagree at "
                                    "layer %d (1-based): it must be in exactly one of them",
                                    l + 1);
    } else {
        for (int l = 0; l < z.n_layers; l++) z.is_mla[l] = true;
        z.conv_k = 4;
    }
    int n_mla = 0;
    for (int l = 0; l < z.n_layers; l++) n_mla += z.is_mla[l];

    /* MLA: required only when some layer is MLA */
    bool need_mla = n_mla > 0;
    if ((s = get_pos_int(tc, "num_attention_heads", "", need_mla, 1, &z.mla_heads))) return s;
    {
        int kvh;
        if ((s = get_pos_int(tc, "num_key_value_heads", "", false, z.mla_heads, &kvh))) return s;
        if (z.mla_heads % kvh != 0)
            return CFG_FAIL("key 'num_key_value_heads' = %d does not divide num_attention_heads = %d", kvh,
                            z.mla_heads);
    }
    if ((s = get_nonneg_int(tc, "q_lora_rank", "", 0, &z.q_lora_rank))) return s;
    if ((s = get_pos_int(tc, "kv_lora_rank", "", need_mla, 1, &z.kv_lora_rank))) return s;
    if ((s = get_pos_int(tc, "qk_nope_head_dim", "", need_mla, 1, &z.qk_nope))) return s;
    if ((s = get_nonneg_int(tc, "qk_rope_head_dim", "", 0, &z.qk_rope))) return s;
    if ((s = get_pos_int(tc, "v_head_dim", "", need_mla, 1, &z.v_head_dim))) return s;
    if ((s = get_bool(tc, "mla_use_output_gate", "", false, &z.mla_output_gate))) return s;
    {
        bool nope;
        if ((s = get_bool(tc, "mla_use_nope", "", true, &nope))) return s;
        if (!nope && need_mla)
            return CFG_FAIL("key 'mla_use_nope' = false (rotary MLA) is not supported");
    }
    if (!need_mla) { /* keep MLA widths zero so sizes derived from them are not used by mistake */
        z.mla_heads = z.kv_lora_rank = z.qk_nope = z.qk_rope = z.v_head_dim = z.q_lora_rank = 0;
    }

    /* AttnRes */
    if ((s = get_nonneg_int(tc, "attn_res_block_size", "", 0, &z.attn_res_block))) return s;

    /* FFN / MoE */
    if ((s = get_nonneg_int(tc, "num_experts", "", 0, &z.n_experts))) return s;
    if (!json_object_get(tc, "num_experts") && json_object_get(tc, "n_routed_experts"))
        if ((s = get_nonneg_int(tc, "n_routed_experts", "", 0, &z.n_experts))) return s;
    if ((s = get_nonneg_int(tc, "first_k_dense_replace", "", 0, &z.first_k_dense))) return s;
    if (z.first_k_dense > z.n_layers)
        return CFG_FAIL("key 'first_k_dense_replace' = %d exceeds num_hidden_layers = %d", z.first_k_dense,
                        z.n_layers);
    bool need_dense = z.n_experts == 0 || z.first_k_dense > 0;
    if ((s = get_pos_int(tc, "intermediate_size", "", need_dense, 1, &z.intermediate))) return s;
    if (!need_dense) {
        int64_t tmp = 0;
        if ((s = get_int(tc, "intermediate_size", "", false, 0, &tmp))) return s;
        z.intermediate = tmp > 0 && tmp <= (1 << 30) ? (int)tmp : 0;
    }
    if (z.n_experts > 0) {
        const char *kkey = json_object_get(tc, "num_experts_per_token") || !json_object_get(tc, "num_experts_per_tok")
                               ? "num_experts_per_token"
                               : "num_experts_per_tok";
        if ((s = get_pos_int(tc, kkey, "", true, 0, &z.top_k))) return s;
        if (z.top_k > z.n_experts)
            return CFG_FAIL("key '%s' = %d exceeds num_experts = %d", kkey, z.top_k, z.n_experts);
        const char *skey = json_object_get(tc, "num_shared_experts") || !json_object_get(tc, "n_shared_experts")
                               ? "num_shared_experts"
                               : "n_shared_experts";
        if ((s = get_nonneg_int(tc, skey, "", 0, &z.n_shared))) return s;
        if ((s = get_pos_int(tc, "moe_intermediate_size", "", true, 0, &z.moe_inter))) return s;
        if ((s = get_nonneg_int(tc, "routed_expert_hidden_size", "", 0, &z.latent))) return s;
        if ((s = get_bool(tc, "latent_moe_use_norm", "", false, &z.latent_norm))) return s;
        if ((s = get_str(tc, "moe_router_activation_func", "", "sigmoid", &str))) return s;
        if (strcmp(str, "sigmoid") != 0)
            return CFG_FAIL("key 'moe_router_activation_func' = \"%s\" is not supported (only sigmoid)", str);
        /* K3 and Kimi Linear: every layer after the dense ones is MoE, one expert group */
        int freq, groups;
        if ((s = get_pos_int(tc, "moe_layer_freq", "", false, 1, &freq))) return s;
        if (freq != 1) return CFG_FAIL("key 'moe_layer_freq' = %d is not supported (only 1)", freq);
        if ((s = get_pos_int(tc, "num_expert_group", "", false, 1, &groups))) return s;
        if (groups != 1) return CFG_FAIL("key 'num_expert_group' = %d is not supported (grouped top-k)", groups);
        if ((s = get_bool(tc, "moe_renormalize", "", true, &z.renormalize))) return s;
        if ((s = get_num(tc, "routed_scaling_factor", "", NULL, 1.0, &dv))) return s;
        if (!(dv > 0)) return CFG_FAIL("key 'routed_scaling_factor' must be positive");
        if ((s = to_float(dv, "", "routed_scaling_factor", &z.routed_scale))) return s;
    } else {
        z.renormalize = true;
        z.routed_scale = 1.0f;
    }

    /* activation */
    if ((s = get_str(tc, "hidden_act", "", "silu", &str))) return s;
    if (strcmp(str, "situ") == 0)
        z.act = ST_ACT_SITU;
    else if (strcmp(str, "silu") == 0)
        z.act = ST_ACT_SILU;
    else
        return CFG_FAIL("key 'hidden_act' = \"%s\" is not supported (situ or silu)", str);
    if ((s = get_num(tc, "activation_situ_beta", "", NULL, 4.0, &dv))) return s;
    if (!(dv > 0)) return CFG_FAIL("key 'activation_situ_beta' must be positive");
    if ((s = to_float(dv, "", "activation_situ_beta", &z.situ_beta1))) return s;
    if ((s = get_num(tc, "activation_situ_linear_beta", "", NULL, 25.0, &dv))) return s;
    if (!(dv > 0)) return CFG_FAIL("key 'activation_situ_linear_beta' must be positive");
    if ((s = to_float(dv, "", "activation_situ_linear_beta", &z.situ_beta2))) return s;

    /* quantization: text_config first (the raw K3 file), then top level (HF hoists it) */
    json_t *q = json_object_get(tc, "quantization_config");
    if (!q || json_is_null(q)) q = json_object_get(top, "quantization_config");
    if (q && !json_is_null(q) && (s = parse_quant(q, &z))) return s;
    if (z.experts_mxfp4 && z.n_experts > 0) {
        int w = st_config_expert_width(&z);
        if (w % 32 != 0)
            return CFG_FAIL("key '%s' = %d must be a multiple of 32 for MXFP4 experts",
                            z.latent ? "routed_expert_hidden_size" : "hidden_size", w);
        if (z.moe_inter % 32 != 0)
            return CFG_FAIL("key 'moe_intermediate_size' = %d must be a multiple of 32 for MXFP4 experts",
                            z.moe_inter);
    }
    if ((s = check_widths(&z))) return s;
    *c = z;
    return ST_OK;
}

st_status_t st_config_parse(st_config_t *cfg, const char *json_text) {
    if (!json_text) return CFG_FAIL("no text");
    json_error_t err;
    json_t *root = json_loads(json_text, JSON_REJECT_DUPLICATES, &err);
    if (!root) return ST_FAIL(ST_ERR_CONFIG, "config.json: invalid JSON at line %d: %s", err.line, err.text);
    st_status_t s = parse_obj(cfg, root);
    json_decref(root);
    return s;
}

st_status_t st_config_load(st_config_t *cfg, const char *path) {
    char *text = NULL;
    size_t len = 0;
    st_status_t s = st_model_read_file(path, ST_MODEL_MAX_JSON, ST_ERR_CONFIG, &text, &len);
    if (s) return s;
    if (strlen(text) != len) {
        free(text);
        return ST_FAIL(ST_ERR_CONFIG, "%s: contains a NUL byte", path);
    }
    s = st_config_parse(cfg, text);
    free(text);
    return s;
}

/* ---- presets ---- */

static void preset_common(st_config_t *c) {
    memset(c, 0, sizeof *c);
    c->rms_eps = 1e-5f;
    c->tie_embeddings = false;
    c->bos_id = 256;
    c->eos_id = 257;
    c->conv_k = 4;
    c->gate_bounded = true;
    c->gate_lower_bound = -5.0f;
    c->full_rank_gate = true;
    c->mla_output_gate = true;
    c->first_k_dense = 1;
    c->latent_norm = true;
    c->renormalize = true;
    c->routed_scale = 1.0f;
    c->act = ST_ACT_SITU;
    c->situ_beta1 = 4.0f;
    c->situ_beta2 = 25.0f;
}

st_status_t st_config_preset(st_config_t *cfg, const char *preset) {
    st_config_t c;
    preset_common(&c);
    if (!preset) return ST_FAIL(ST_ERR_INVALID_ARG, "no preset name (tiny, small, k3-mini)");
    if (strcmp(preset, "tiny") == 0) {
        c.d = 128, c.n_layers = 8, c.vocab = 512;
        c.kda_heads = 4, c.kda_head_dim = 32, c.f_rank = 32;
        c.mla_heads = 4, c.qk_nope = 32, c.qk_rope = 16, c.v_head_dim = 32, c.kv_lora_rank = 64;
        c.q_lora_rank = 64;
        c.n_experts = 16, c.top_k = 4, c.n_shared = 1, c.latent = 64, c.moe_inter = 64;
        c.intermediate = 256, c.attn_res_block = 2;
        c.is_mla[3] = c.is_mla[7] = true;
    } else if (strcmp(preset, "small") == 0) {
        c.d = 1024, c.n_layers = 12, c.vocab = 32768;
        c.kda_heads = 8, c.kda_head_dim = 128, c.f_rank = 128;
        c.mla_heads = 8, c.qk_nope = 128, c.qk_rope = 64, c.v_head_dim = 128, c.kv_lora_rank = 512;
        c.q_lora_rank = 384;
        c.n_experts = 64, c.top_k = 8, c.n_shared = 2, c.latent = 512, c.moe_inter = 768;
        c.intermediate = 4096, c.attn_res_block = 4;
        c.is_mla[3] = c.is_mla[7] = c.is_mla[11] = true;
    } else if (strcmp(preset, "k3-mini") == 0) {
        c.d = 7168, c.n_layers = 4, c.vocab = 4096;
        c.kda_heads = 96, c.kda_head_dim = 128, c.f_rank = 128;
        c.mla_heads = 96, c.qk_nope = 128, c.qk_rope = 64, c.v_head_dim = 128, c.kv_lora_rank = 512;
        c.q_lora_rank = 1536;
        c.n_experts = 32, c.top_k = 4, c.n_shared = 2, c.latent = 3584, c.moe_inter = 3072;
        c.intermediate = 33792, c.attn_res_block = 2;
        c.is_mla[3] = true;
        c.experts_mxfp4 = true;
    } else {
        return ST_FAIL(ST_ERR_INVALID_ARG, "unknown preset '%s' (tiny, small, k3-mini)", preset);
    }
    *cfg = c;
    return ST_OK;
}
