/* config.json parsing (SPEC §1): the tiny preset round trip, nested vs flat, Kimi Linear's flat
 * file, and one broken key at a time → an error naming the key; no input crashes the parser. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "strata/model.h"

static const char *k_tiny =
    "{\"architectures\":[\"KimiK3ForConditionalGeneration\"],\"model_type\":\"kimi_k3\",\"bos_token_id\":256,"
    "\"eos_token_id\":257,\"tie_word_embeddings\":false,\"text_config\":{"
    "\"hidden_size\":128,\"num_hidden_layers\":8,\"vocab_size\":512,\"intermediate_size\":256,"
    "\"rms_norm_eps\":1e-05,\"tie_word_embeddings\":false,\"hidden_act\":\"situ\",\"activation_situ_beta\":4.0,"
    "\"activation_situ_linear_beta\":25.0,\"attn_res_block_size\":2,\"num_attention_heads\":4,"
    "\"num_key_value_heads\":4,\"q_lora_rank\":64,\"kv_lora_rank\":64,\"qk_nope_head_dim\":32,"
    "\"qk_rope_head_dim\":16,\"v_head_dim\":32,\"mla_use_nope\":true,\"mla_use_output_gate\":true,"
    "\"first_k_dense_replace\":1,\"num_experts\":16,\"num_experts_per_token\":4,\"num_shared_experts\":1,"
    "\"moe_intermediate_size\":64,\"routed_expert_hidden_size\":64,\"latent_moe_use_norm\":true,"
    "\"moe_router_activation_func\":\"sigmoid\",\"moe_renormalize\":true,\"routed_scaling_factor\":1.0,"
    "\"bos_token_id\":256,\"eos_token_id\":257,"
    "\"linear_attn_config\":{\"num_heads\":4,\"head_dim\":32,\"short_conv_kernel_size\":4,"
    "\"gate_lower_bound\":-5.0,\"use_full_rank_gate\":true,\"full_attn_layers\":[4,8],"
    "\"kda_layers\":[1,2,3,5,6,7]}}}";

/* Kimi Linear 48B-A3B, flat (checkpoint-layout §7.1) */
static const char *k_kimi_linear =
    "{\"architectures\":[\"KimiLinearForCausalLM\"],\"model_type\":\"kimi_linear\",\"hidden_size\":2304,"
    "\"intermediate_size\":9216,\"num_hidden_layers\":27,\"rms_norm_eps\":1e-5,\"vocab_size\":163840,"
    "\"hidden_act\":\"silu\",\"rope_theta\":10000,\"head_dim\":72,\"num_attention_heads\":32,"
    "\"num_key_value_heads\":32,\"kv_lora_rank\":512,\"q_lora_rank\":null,\"qk_nope_head_dim\":128,"
    "\"qk_rope_head_dim\":64,\"v_head_dim\":128,\"mla_use_nope\":true,\"num_experts\":256,"
    "\"num_experts_per_token\":8,\"num_shared_experts\":1,\"moe_intermediate_size\":1024,"
    "\"moe_router_activation_func\":\"sigmoid\",\"moe_renormalize\":true,\"routed_scaling_factor\":2.446,"
    "\"first_k_dense_replace\":1,\"eos_token_id\":163586,\"bos_token_id\":163584,"
    "\"linear_attn_config\":{\"head_dim\":128,\"num_heads\":32,\"short_conv_kernel_size\":4,"
    "\"kda_layers\":[1,2,3,5,6,7,9,10,11,13,14,15,17,18,19,21,22,23,25,26],"
    "\"full_attn_layers\":[4,8,12,16,20,24,27]}}";

static bool same_cfg(const st_config_t *a, const st_config_t *b) {
    return a->d == b->d && a->n_layers == b->n_layers && a->vocab == b->vocab && a->rms_eps == b->rms_eps &&
           a->tie_embeddings == b->tie_embeddings && a->bos_id == b->bos_id && a->eos_id == b->eos_id &&
           a->kda_heads == b->kda_heads && a->kda_head_dim == b->kda_head_dim && a->conv_k == b->conv_k &&
           a->gate_bounded == b->gate_bounded && a->gate_lower_bound == b->gate_lower_bound &&
           a->full_rank_gate == b->full_rank_gate && memcmp(a->is_mla, b->is_mla, sizeof a->is_mla) == 0 &&
           a->mla_heads == b->mla_heads && a->q_lora_rank == b->q_lora_rank && a->kv_lora_rank == b->kv_lora_rank &&
           a->qk_nope == b->qk_nope && a->qk_rope == b->qk_rope && a->v_head_dim == b->v_head_dim &&
           a->mla_output_gate == b->mla_output_gate && a->attn_res_block == b->attn_res_block &&
           a->first_k_dense == b->first_k_dense && a->intermediate == b->intermediate &&
           a->n_experts == b->n_experts && a->top_k == b->top_k && a->n_shared == b->n_shared &&
           a->moe_inter == b->moe_inter && a->latent == b->latent && a->latent_norm == b->latent_norm &&
           a->renormalize == b->renormalize && a->routed_scale == b->routed_scale && a->act == b->act &&
           a->situ_beta1 == b->situ_beta1 && a->situ_beta2 == b->situ_beta2 && a->experts_mxfp4 == b->experts_mxfp4;
}

/* Apply one edit to the tiny config's text_config (or top level) and expect an error naming `key`. */
typedef void (*edit_fn)(json_t *top, json_t *tc);

static void expect_error(const char *what, edit_fn fn, const char *key) {
    json_t *top = json_loads(k_tiny, 0, NULL);
    fn(top, json_object_get(top, "text_config"));
    char *text = json_dumps(top, JSON_COMPACT);
    st_config_t c;
    memset(&c, 0x5a, sizeof c);
    st_config_t before = c;
    st_status_t s = st_config_parse(&c, text);
    CHECK(s == ST_ERR_CONFIG, "%s: status %d", what, (int)s);
    CHECK(strstr(st_err_last(), key) != NULL, "%s: error '%s' does not name '%s'", what, st_err_last(), key);
    CHECK(memcmp(&c, &before, sizeof c) == 0, "%s: output written on failure", what);
    free(text);
    json_decref(top);
}

static void e_no_hidden(json_t *t, json_t *tc) { json_object_del(tc, "hidden_size"); }
static void e_hidden_str(json_t *t, json_t *tc) { json_object_set_new(tc, "hidden_size", json_string("128")); }
static void e_hidden_neg(json_t *t, json_t *tc) { json_object_set_new(tc, "hidden_size", json_integer(-128)); }
static void e_kvheads(json_t *t, json_t *tc) { json_object_set_new(tc, "num_key_value_heads", json_integer(3)); }
static void e_full_range(json_t *t, json_t *tc) {
    json_t *l = json_pack("[i,i]", 4, 9);
    json_object_set_new(json_object_get(tc, "linear_attn_config"), "full_attn_layers", l);
}
static void e_full_zero(json_t *t, json_t *tc) {
    json_object_set_new(json_object_get(tc, "linear_attn_config"), "full_attn_layers", json_pack("[i,i]", 0, 8));
}
static void e_kda_range(json_t *t, json_t *tc) {
    json_object_set_new(json_object_get(tc, "linear_attn_config"), "kda_layers", json_pack("[i,i,i]", 1, 2, 99));
}
static void e_lists_disagree(json_t *t, json_t *tc) { /* layer 4 in both lists */
    json_object_set_new(json_object_get(tc, "linear_attn_config"), "kda_layers",
                        json_pack("[i,i,i,i,i,i,i]", 1, 2, 3, 4, 5, 6, 7));
}
static void e_act(json_t *t, json_t *tc) { json_object_set_new(tc, "hidden_act", json_string("gelu")); }
static void e_router(json_t *t, json_t *tc) {
    json_object_set_new(tc, "moe_router_activation_func", json_string("softmax"));
}
static void e_topk(json_t *t, json_t *tc) { json_object_set_new(tc, "num_experts_per_token", json_integer(17)); }
static void e_layers(json_t *t, json_t *tc) { json_object_set_new(tc, "num_hidden_layers", json_integer(300)); }
static void e_kda_heads(json_t *t, json_t *tc) {
    json_object_set_new(json_object_get(tc, "linear_attn_config"), "num_heads", json_integer(0));
}
static void e_quant(json_t *t, json_t *tc) {
    json_object_set_new(tc, "quantization_config", json_pack("{s:s}", "format", "nvfp4-pack-quantized"));
}
static void e_bos(json_t *t, json_t *tc) { json_object_set_new(tc, "bos_token_id", json_integer(512)); }
static void e_text_config(json_t *t, json_t *tc) { json_object_set_new(t, "text_config", json_integer(1)); }
static void e_lac_type(json_t *t, json_t *tc) { json_object_set_new(tc, "linear_attn_config", json_string("x")); }
static void e_eps(json_t *t, json_t *tc) { json_object_set_new(tc, "rms_norm_eps", json_real(-1.0)); }
static void e_dense(json_t *t, json_t *tc) { json_object_del(tc, "intermediate_size"); }
static void e_groups(json_t *t, json_t *tc) { json_object_set_new(tc, "num_expert_group", json_integer(8)); }
static void e_moe_inter_mx(json_t *t, json_t *tc) {
    json_object_set_new(tc, "quantization_config", json_pack("{s:s}", "format", "mxfp4-pack-quantized"));
    json_object_set_new(tc, "moe_intermediate_size", json_integer(48));
}

/* Regressions (issue 13, fuzz_config): floats that pass the double checks but overflow or underflow
 * as floats (routed_scaling_factor 2e74 became +inf; rms_norm_eps 1e-50 became 0), and widths whose
 * products overflow the engine's int arithmetic (engine_weights.c: heads x head_dim). */
static void e_scale_inf(json_t *t, json_t *tc) { json_object_set_new(tc, "routed_scaling_factor", json_real(2.1e74)); }
static void e_eps_zero(json_t *t, json_t *tc) { json_object_set_new(tc, "rms_norm_eps", json_real(1e-50)); }
static void e_eps_one(json_t *t, json_t *tc) { json_object_set_new(tc, "rms_norm_eps", json_real(0.99999999999)); }
static void e_beta_inf(json_t *t, json_t *tc) { json_object_set_new(tc, "activation_situ_beta", json_real(1e300)); }
static void e_beta2_inf(json_t *t, json_t *tc) {
    json_object_set_new(tc, "activation_situ_linear_beta", json_real(1e39));
}
static void e_gate_zero(json_t *t, json_t *tc) {
    json_object_set_new(json_object_get(tc, "linear_attn_config"), "gate_lower_bound", json_real(-1e-50));
}
static void e_gate_inf(json_t *t, json_t *tc) {
    json_object_set_new(json_object_get(tc, "linear_attn_config"), "gate_lower_bound", json_real(-1e300));
}
static void e_kda_width(json_t *t, json_t *tc) { /* 2^16 x 2^16 = 2^32: int overflow in the engine */
    json_t *lac = json_object_get(tc, "linear_attn_config");
    json_object_set_new(lac, "num_heads", json_integer(65536));
    json_object_set_new(lac, "head_dim", json_integer(65536));
}
static void e_kv_width(json_t *t, json_t *tc) { /* kv_lora_rank + qk_rope_head_dim = 2^31 */
    json_object_set_new(tc, "kv_lora_rank", json_integer(1 << 30));
    json_object_set_new(tc, "qk_rope_head_dim", json_integer(1 << 30));
}
static void e_mla_width(json_t *t, json_t *tc) {
    json_object_set_new(tc, "num_attention_heads", json_integer(40000));
    json_object_set_new(tc, "num_key_value_heads", json_integer(40000));
    json_object_set_new(tc, "qk_nope_head_dim", json_integer(60000));
}
static void e_shared_width(json_t *t, json_t *tc) {
    json_object_set_new(tc, "num_shared_experts", json_integer(1 << 20));
    json_object_set_new(tc, "moe_intermediate_size", json_integer(1 << 12));
}
static void e_hidden_huge(json_t *t, json_t *tc) { json_object_set_new(tc, "hidden_size", json_integer(1 << 30)); }

/* config.json that is not a regular file: refused at once with a config error. Before the fix a
 * directory sized its read buffer from lseek's LLONG_MAX (malloc failure; an abort under ASan) and a
 * FIFO blocked in open() forever (the alarm turns that into a failure). */
static void check_special_files(void) {
    const char *tmp = getenv("STRATA_TEST_TMP");
    if (!tmp || !*tmp) tmp = "/tmp";
    char dir[512], fifo[512];
    snprintf(dir, sizeof dir, "%s/test_config_dir.%d", tmp, (int)getpid());
    snprintf(fifo, sizeof fifo, "%s/test_config_fifo.%d", tmp, (int)getpid());
    mkdir(tmp, 0755);
    CHECK(mkdir(dir, 0755) == 0, "mkdir %s", dir);
    CHECK(mkfifo(fifo, 0644) == 0, "mkfifo %s", fifo);
    st_config_t c;
    memset(&c, 0x5a, sizeof c);
    st_config_t before = c;
    alarm(20);
    st_status_t s = st_config_load(&c, dir);
    CHECK(s == ST_ERR_CONFIG && strstr(st_err_last(), "not a regular file"), "directory: %d '%s'", (int)s,
          st_err_last());
    s = st_config_load(&c, fifo);
    CHECK(s == ST_ERR_CONFIG && strstr(st_err_last(), "not a regular file"), "FIFO: %d '%s'", (int)s, st_err_last());
    alarm(0);
    CHECK(memcmp(&c, &before, sizeof c) == 0, "output written on failure");
    rmdir(dir);
    unlink(fifo);
    /* a regular file still loads */
    char file[512];
    snprintf(file, sizeof file, "%s/test_config_file.%d.json", tmp, (int)getpid());
    FILE *f = fopen(file, "wb");
    CHECK(f && fwrite(k_tiny, 1, strlen(k_tiny), f) == strlen(k_tiny), "write %s", file);
    if (f) fclose(f);
    CHECK(st_config_load(&c, file) == ST_OK && c.d == 128, "regular file: %s", st_err_last());
    unlink(file);
}

int main(void) {
    st_log_set_level(ST_LOG_WARN);
    st_config_t c, p;
    memset(&c, 0, sizeof c);

    /* the tiny preset written out as K3's nested config parses back to the preset */
    CHECK(st_config_parse(&c, k_tiny) == ST_OK, "tiny: %s", st_err_last());
    CHECK(st_config_preset(&p, "tiny") == ST_OK, "preset");
    p.f_rank = p.g_rank = 0; /* from shapes, not the config */
    CHECK(same_cfg(&c, &p), "tiny config differs from the preset");
    CHECK(c.f_rank == 0, "parser leaves f_rank to st_ckpt_open");
    CHECK(c.is_mla[3] && c.is_mla[7] && !c.is_mla[0] && !c.is_mla[4], "MLA layers 4, 8 (1-based)");

    /* flat (no text_config) gives the same result */
    {
        json_t *top = json_loads(k_tiny, 0, NULL);
        char *flat = json_dumps(json_object_get(top, "text_config"), JSON_COMPACT);
        st_config_t f;
        CHECK(st_config_parse(&f, flat) == ST_OK && same_cfg(&f, &c), "flat vs nested: %s", st_err_last());
        /* bos/eos only at the top level of a nested file */
        json_t *tc = json_object_get(top, "text_config");
        json_object_del(tc, "bos_token_id");
        json_object_del(tc, "eos_token_id");
        json_object_set_new(top, "bos_token_id", json_integer(300));
        char *t2 = json_dumps(top, JSON_COMPACT);
        CHECK(st_config_parse(&f, t2) == ST_OK && f.bos_id == 300 && f.eos_id == 257, "bos/eos from top level");
        json_object_del(top, "bos_token_id");
        json_object_del(top, "eos_token_id");
        free(t2);
        t2 = json_dumps(top, JSON_COMPACT);
        CHECK(st_config_parse(&f, t2) == ST_OK && f.bos_id == -1 && f.eos_id == -1, "absent bos/eos → -1");
        /* quantization_config at the top level (HF hoists it) */
        json_object_set_new(top, "quantization_config", json_pack("{s:s}", "format", "mxfp4-pack-quantized"));
        free(t2);
        t2 = json_dumps(top, JSON_COMPACT);
        CHECK(st_config_parse(&f, t2) == ST_OK && f.experts_mxfp4, "quantization_config → MXFP4");
        free(t2);
        free(flat);
        json_decref(top);
    }

    /* Kimi Linear: absent keys take SPEC §1's defaults */
    CHECK(st_config_parse(&c, k_kimi_linear) == ST_OK, "kimi linear: %s", st_err_last());
    CHECK(c.d == 2304 && c.n_layers == 27 && !c.gate_bounded && !c.full_rank_gate && !c.mla_output_gate &&
              c.attn_res_block == 0 && c.latent == 0 && c.q_lora_rank == 0 && c.act == ST_ACT_SILU &&
              fabsf(c.routed_scale - 2.446f) < 1e-6f && c.n_experts == 256 && c.top_k == 8 && !c.experts_mxfp4 &&
              c.eos_id == 163586 && c.is_mla[26] && c.is_mla[3] && !c.is_mla[25] && !c.is_mla[0],
          "kimi linear values");
    {
        int n_mla = 0;
        for (int l = 0; l < 27; l++) n_mla += c.is_mla[l];
        CHECK(n_mla == 7, "kimi linear: %d MLA layers", n_mla);
    }

    /* K3's own text_config values (checkpoint-layout §4), nested, bos/eos repeated at the top */
    {
        json_t *top = json_loads(k_tiny, 0, NULL), *tc = json_object_get(top, "text_config");
        json_t *lac = json_object_get(tc, "linear_attn_config");
        json_t *full = json_array(), *kda = json_array();
        for (int l = 1; l <= 93; l++)
            json_array_append_new((l % 4 == 0 || l == 93) ? full : kda, json_integer(l));
        json_object_set_new(lac, "full_attn_layers", full);
        json_object_set_new(lac, "kda_layers", kda);
        json_object_set_new(lac, "num_heads", json_integer(96));
        json_object_set_new(lac, "head_dim", json_integer(128));
        json_t *kv = json_pack("{s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:b,s:i,s:s}",
                               "hidden_size", 7168, "num_hidden_layers", 93, "vocab_size", 163840,
                               "intermediate_size", 33792, "attn_res_block_size", 12, "num_attention_heads", 96,
                               "num_key_value_heads", 96, "q_lora_rank", 1536, "kv_lora_rank", 512,
                               "qk_nope_head_dim", 128, "qk_rope_head_dim", 64, "v_head_dim", 128, "num_experts", 896,
                               "num_experts_per_token", 16, "num_shared_experts", 2, "moe_intermediate_size", 3072,
                               "routed_expert_hidden_size", 3584, "use_grouped_topk", 1, "moe_layer_freq", 1,
                               "topk_method", "noaux_tc");
        json_object_update(tc, kv);
        json_decref(kv);
        json_object_set_new(tc, "bos_token_id", json_integer(163584));
        json_object_set_new(tc, "eos_token_id", json_integer(163586));
        json_object_set_new(tc, "quantization_config", json_pack("{s:s}", "format", "mxfp4-pack-quantized"));
        char *text = json_dumps(top, JSON_COMPACT);
        st_config_t k;
        CHECK(st_config_parse(&k, text) == ST_OK, "K3 config: %s", st_err_last());
        int n_mla = 0;
        for (int l = 0; l < 93; l++) n_mla += k.is_mla[l];
        CHECK(n_mla == 24 && k.is_mla[91] && k.is_mla[92] && k.is_mla[3] && !k.is_mla[90] && k.n_experts == 896 &&
                  k.top_k == 16 && k.latent == 3584 && k.experts_mxfp4 && k.eos_id == 163586 &&
                  k.attn_res_block == 12 && k.kda_heads == 96,
              "K3 values");
        free(text);
        json_decref(top);
    }

    /* one broken key at a time */
    expect_error("missing hidden_size", e_no_hidden, "'hidden_size'");
    expect_error("hidden_size string", e_hidden_str, "'hidden_size'");
    expect_error("hidden_size negative", e_hidden_neg, "'hidden_size'");
    expect_error("kv heads do not divide", e_kvheads, "'num_key_value_heads'");
    expect_error("full_attn_layers out of range", e_full_range, "full_attn_layers");
    expect_error("full_attn_layers 0", e_full_zero, "full_attn_layers");
    expect_error("kda_layers out of range", e_kda_range, "kda_layers");
    expect_error("layer lists disagree", e_lists_disagree, "kda_layers");
    expect_error("bad hidden_act", e_act, "'hidden_act'");
    expect_error("bad router", e_router, "'moe_router_activation_func'");
    expect_error("k > n", e_topk, "'num_experts_per_token'");
    expect_error("too many layers", e_layers, "'num_hidden_layers'");
    expect_error("zero KDA heads", e_kda_heads, "num_heads");
    expect_error("unknown quantization", e_quant, "quantization_config.format");
    expect_error("bos outside vocab", e_bos, "'bos_token_id'");
    expect_error("text_config not an object", e_text_config, "'text_config'");
    expect_error("linear_attn_config not an object", e_lac_type, "'linear_attn_config'");
    expect_error("negative eps", e_eps, "'rms_norm_eps'");
    expect_error("dense layer without intermediate_size", e_dense, "'intermediate_size'");
    expect_error("mxfp4 width", e_moe_inter_mx, "'moe_intermediate_size'");
    expect_error("grouped top-k", e_groups, "'num_expert_group'");
    expect_error("routed_scaling_factor overflows a float", e_scale_inf, "'routed_scaling_factor'");
    expect_error("rms_norm_eps underflows a float", e_eps_zero, "'rms_norm_eps'");
    expect_error("rms_norm_eps rounds to 1 as a float", e_eps_one, "'rms_norm_eps'");
    expect_error("activation_situ_beta overflows a float", e_beta_inf, "'activation_situ_beta'");
    expect_error("activation_situ_linear_beta overflows a float", e_beta2_inf, "'activation_situ_linear_beta'");
    expect_error("gate_lower_bound underflows to -0", e_gate_zero, "gate_lower_bound");
    expect_error("gate_lower_bound overflows to -inf", e_gate_inf, "gate_lower_bound");
    expect_error("KDA heads x head_dim overflows an int", e_kda_width, "linear_attn_config.num_heads");
    expect_error("kv_lora_rank + qk_rope_head_dim overflows an int", e_kv_width, "maximum width");
    expect_error("MLA heads x head dims too wide", e_mla_width, "num_attention_heads");
    expect_error("shared experts x moe width too wide", e_shared_width, "num_shared_experts");
    expect_error("hidden_size too wide", e_hidden_huge, "'hidden_size'");
    check_special_files();

    /* not JSON, or not an object */
    const char *bad[] = {"", "{", "{\"hidden_size\":}", "[1,2,3]", "null", "42", "\"x\"", "{\"text_config\":[]}",
                         "{\"hidden_size\":1e999}"};
    for (size_t i = 0; i < ST_ARRAY_LEN(bad); i++) {
        st_status_t s = st_config_parse(&c, bad[i]);
        CHECK(s == ST_ERR_CONFIG && strstr(st_err_last(), "config.json"), "bad input %zu: %d '%s'", i, (int)s,
              st_err_last());
    }
    CHECK(st_config_parse(&c, "{") == ST_ERR_CONFIG && strstr(st_err_last(), "JSON"), "invalid JSON message: %s",
          st_err_last());
    CHECK(st_config_parse(&c, NULL) == ST_ERR_CONFIG, "NULL text");
    CHECK(st_config_load(&c, "/nonexistent/config.json") == ST_ERR_IO, "missing file");

    /* every prefix and many single-byte corruptions of a valid file: an error or OK, never a crash */
    {
        size_t n = strlen(k_tiny);
        char *buf = malloc(n + 1);
        int ok = 0, err = 0;
        for (size_t cut = 0; cut < n; cut++) {
            memcpy(buf, k_tiny, cut);
            buf[cut] = 0;
            (*(st_config_parse(&c, buf) == ST_OK ? &ok : &err))++;
        }
        st_rng_t r = {7};
        const char junk[] = "{}[],:\"0-9e.tfn \\x";
        for (int it = 0; it < 3000; it++) {
            memcpy(buf, k_tiny, n + 1);
            for (int k = 0; k < 3; k++) buf[st_rng_next(&r) % n] = junk[st_rng_next(&r) % (sizeof junk - 1)];
            (*(st_config_parse(&c, buf) == ST_OK ? &ok : &err))++;
        }
        CHECK(err > 0, "corruptions rejected: %d ok, %d errors", ok, err);
        free(buf);
    }

    /* presets */
    CHECK(st_config_preset(&p, "small") == ST_OK && p.d == 1024 && p.n_layers == 12 && p.is_mla[11] &&
              p.n_experts == 64 && p.top_k == 8 && p.f_rank == 128,
          "small preset");
    CHECK(st_config_preset(&p, "k3-mini") == ST_OK && p.d == 7168 && p.kda_heads == 96 && p.latent == 3584 &&
              p.moe_inter == 3072 && p.intermediate == 33792 && p.is_mla[3] && !p.is_mla[2] && p.experts_mxfp4,
          "k3-mini preset");
    CHECK(st_config_preset(&p, "huge") == ST_ERR_INVALID_ARG && strstr(st_err_last(), "huge"), "unknown preset");
    return st_test_done();
}
