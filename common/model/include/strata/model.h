/* Strata model files: config.json (SPEC §1), safetensors shards + index, weight views, MXFP4
 * decode, the random-checkpoint writer (`strata ckpt init`) and the tokenizers (tiktoken BPE with
 * Kimi's pattern, byte-level fallback). Wraps jansson (JSON), PCRE2 and mmap; nothing here computes
 * the model. */
#ifndef STRATA_MODEL_H
#define STRATA_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "strata/base.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ST_MAX_LAYERS 256
/* Largest width config.json may imply: hidden_size, intermediate sizes, ranks, and the products the
 * engine forms (heads × head dims, kv_lora_rank + rope dims, shared experts × moe width, a KDA
 * head's state dk × dv). Keeps every width and its products with small counts inside an int. */
#define ST_CONFIG_MAX_WIDTH (1 << 24)

typedef enum { ST_ACT_SITU = 0, ST_ACT_SILU = 1 } st_act_t;

/* Parsed, validated config (SPEC §1). Widths derived from tensor shapes (f_a / g_a ranks) are
 * filled by st_ckpt_open, not by the config parser. */
typedef struct {
    /* trunk */
    int d;              /* hidden_size */
    int n_layers;       /* num_hidden_layers */
    int vocab;          /* vocab_size */
    float rms_eps;      /* rms_norm_eps */
    bool tie_embeddings;
    int bos_id, eos_id; /* -1 when absent */
    /* KDA (linear_attn_config) */
    int kda_heads, kda_head_dim, conv_k;
    bool gate_bounded;        /* gate_lower_bound present */
    float gate_lower_bound;   /* g_min (e.g. -5) */
    bool full_rank_gate;      /* use_full_rank_gate: g_proj [H*dv, d]; else g_a/g_b low rank */
    int f_rank;               /* rank of f_a_proj (from shapes; 0 until st_ckpt_open) */
    int g_rank;               /* rank of g_a_proj when !full_rank_gate (from shapes) */
    bool is_mla[ST_MAX_LAYERS]; /* layer l (0-based) is MLA iff (l+1) in full_attn_layers */
    /* MLA */
    int mla_heads;            /* num_attention_heads */
    int q_lora_rank;          /* 0 = no Q compression (q_proj) */
    int kv_lora_rank, qk_nope, qk_rope, v_head_dim;
    bool mla_output_gate;     /* mla_use_output_gate */
    /* AttnRes */
    int attn_res_block;       /* 0 = plain residuals */
    /* FFN / MoE */
    int first_k_dense, intermediate;
    int n_experts, top_k, n_shared, moe_inter;
    int latent;               /* routed_expert_hidden_size; 0 = experts at width d */
    bool latent_norm;         /* latent_moe_use_norm */
    bool renormalize;         /* moe_renormalize */
    float routed_scale;       /* routed_scaling_factor */
    st_act_t act;
    float situ_beta1, situ_beta2;
    bool experts_mxfp4;       /* quantization_config present with mxfp4-pack-quantized */
} st_config_t;

/* Parse config.json text (top-level or nested text_config). Errors name the key. Every width is at
 * most ST_CONFIG_MAX_WIDTH and every float finite and in range after conversion to float. */
st_status_t st_config_parse(st_config_t *cfg, const char *json_text);
/* Read and parse a config.json file: a regular file of at most 64 MiB (a directory or FIFO is
 * refused at once, ST_ERR_CONFIG); open/read errors are ST_ERR_IO. */
st_status_t st_config_load(st_config_t *cfg, const char *path);
static inline bool st_config_is_moe_layer(const st_config_t *c, int l) {
    return c->n_experts > 0 && l >= c->first_k_dense;
}
static inline int st_config_expert_width(const st_config_t *c) { /* width experts work in */
    return c->latent > 0 ? c->latent : c->d;
}

/* ---- tensors ---- */
typedef enum { ST_DT_F32 = 0, ST_DT_BF16, ST_DT_F16, ST_DT_U8, ST_DT_MXFP4 } st_dtype_t;
const char *st_dtype_name(st_dtype_t t);
size_t st_dtype_size(st_dtype_t t); /* bytes per element; MXFP4: 0 (use packed views) */

/* A read-only view of one stored tensor inside a mapped shard. Owns nothing: valid while the
 * checkpoint stays open. */
typedef struct {
    st_dtype_t dtype;
    int ndim;
    int64_t shape[4];
    const void *data; /* payload */
    size_t nbytes;
} st_tensor_t;

/* A 2-D weight matrix W [rows, cols] (row-major, y = W x), in one of: F32, BF16, F16, or
 * MXFP4 (packed codes [rows, cols/2] u8 + E8M0 scales [rows, cols/32] u8). Owns nothing. */
typedef struct {
    st_dtype_t dtype;
    int rows, cols;
    const void *data;     /* F32/BF16/F16 elements, or MXFP4 packed codes */
    const uint8_t *scale; /* MXFP4 only */
} st_weight_t;

/* Decode rows [r0, r0+n) of W into fp32 dst [n, cols]. */
void st_weight_rows_f32(const st_weight_t *w, int r0, int n, float *dst);
/* MXFP4: one E2M1 nibble and one E8M0 scale byte → value */
float st_mxfp4_value(uint8_t nibble, uint8_t scale);

/* ---- checkpoint ---- */
typedef struct st_ckpt st_ckpt_t;

/* Open a checkpoint directory: config.json + model.safetensors.index.json (or a single
 * model.safetensors). Every shard is mmapped and every header validated (offsets inside the file,
 * sorted, non-overlapping, sizes = dtype × shape). Names are resolved with or without the
 * `language_model.` prefix. Fills cfg->f_rank / g_rank from shapes. */
st_status_t st_ckpt_open(st_ckpt_t **out, const char *dir);
void st_ckpt_close(st_ckpt_t *ck);
const st_config_t *st_ckpt_config(const st_ckpt_t *ck);
const char *st_ckpt_dir(const st_ckpt_t *ck);

/* Look up a tensor by its name without the `language_model.` prefix (e.g.
 * "model.layers.3.self_attn.q_proj.weight"). NULL if absent (no log). */
const st_tensor_t *st_ckpt_find(const st_ckpt_t *ck, const char *name);
/* Look up a tensor and check its shape; a missing tensor or disagreeing shape is
 * ST_ERR_CHECKPOINT naming the tensor. ndim = number of dims given. */
st_status_t st_ckpt_get(const st_ckpt_t *ck, const char *name, int ndim, const int64_t *shape,
                        const st_tensor_t **out);
/* A matrix weight [rows, cols]: `<stem>.weight` (F32/BF16/F16), or `<stem>.weight_packed` +
 * `<stem>.weight_scale` (MXFP4). Shape checked. */
st_status_t st_ckpt_weight(const st_ckpt_t *ck, const char *stem, int rows, int cols, st_weight_t *out);
/* A vector of n values converted to fp32 into dst (F32/BF16/F16). Shape must have n elements
 * (leading 1-dims allowed, e.g. [1,d]); for A_log, `n_min` allows a longer zero-padded vector:
 * pass allow_pad = true to accept numel >= n and use the first n. */
st_status_t st_ckpt_vec_f32(const st_ckpt_t *ck, const char *name, int n, bool allow_pad, float *dst);

/* Routed expert j of MoE layer l (SPEC §6): gate = w1 [mi, ew], up = w3 [mi, ew], down = w2 [ew, mi],
 * ew = st_config_expert_width. Shapes checked; MXFP4 or dense. */
typedef struct {
    st_weight_t gate, up, down;
} st_expert_weights_t;
st_status_t st_ckpt_expert(const st_ckpt_t *ck, int layer, int j, st_expert_weights_t *out);

/* Sizes for `strata ckpt inspect`. */
typedef struct {
    int64_t params_total, params_active;   /* active per token: trunk + k routed experts */
    int64_t bytes_attention_worker;        /* everything except routed experts */
    int64_t bytes_routed_experts;          /* all routed experts, all layers */
    int64_t bytes_per_expert_layer;        /* one expert of one layer */
} st_ckpt_sizes_t;
st_status_t st_ckpt_sizes(const st_ckpt_t *ck, st_ckpt_sizes_t *out);

/* ---- random checkpoint writer (`strata ckpt init`) ---- */
typedef struct {
    const char *preset;  /* "tiny", "small", "k3-mini" */
    const char *out_dir;
    uint64_t seed;
    st_dtype_t dtype;    /* ST_DT_BF16 or ST_DT_F32 for non-F32-by-layout tensors */
    float skew_router;   /* 0 = none; >0 makes a few experts hot */
    bool mxfp4_experts;  /* routed experts as MXFP4 (default for k3-mini) */
} st_ckpt_init_opts_t;
st_status_t st_ckpt_init(const st_ckpt_init_opts_t *opts);
/* Fill cfg with a preset's config (what st_ckpt_init writes to config.json). */
st_status_t st_config_preset(st_config_t *cfg, const char *preset);

/* ---- byte-level tokenizer of the presets: token = byte value (0..255); ids >= 256 are special
 * and decode to nothing. bos/eos come from the config. Kept for callers that have no
 * st_tokenizer_t; st_tokenizer_load gives the same behaviour for checkpoints without
 * tiktoken.model. ---- */
int st_tok_encode(const char *text, int *ids, int max_ids); /* returns count */
int st_tok_decode(const int *ids, int n, char *out, int max_out); /* returns bytes written */

/* ---- the checkpoint's tokenizer (tokenizer.c, tiktoken.c) ----
 * A folder with `tiktoken.model` (one "base64(token) rank" per line, ranks 0..N-1 = token ids) is a
 * tiktoken BPE: Kimi's pre-tokenisation pattern run through PCRE2 (JIT), lowest-rank-pair merges,
 * special tokens from `tokenizer_config.json` `added_tokens_decoder` (ids N.. N+257, unnamed ones
 * `<|reserved_token_ID|>`), and the reference's cuts (400,000-code-point slices, runs of at most
 * 25,000 whitespace / non-whitespace code points, encoded independently). A folder without
 * tiktoken.model gets the byte tokenizer above, with a warning.
 * Ids without an embedding row (>= config.json vocab_size, when config.json is there) are never
 * emitted by encode and refused by decode. bos/pad come from config.json (else
 * tokenizer_config.json); eos is every id listed by config.json, generation_config.json and
 * tokenizer_config.json's eos_token.
 * A loaded tokenizer is immutable: encode/decode may run on many threads at once. */
typedef struct st_tokenizer st_tokenizer_t;
typedef enum { ST_TOKENIZER_BYTES = 0, ST_TOKENIZER_TIKTOKEN = 1 } st_tokenizer_kind_t;
#define ST_TOK_MAX_EOS 8

typedef struct {
    const char *pattern; /* PCRE2 pattern (UTF + UCP) instead of Kimi's; NULL = Kimi's. A custom pattern
                          * turns the ASCII fast path off */
    bool no_fast_path;   /* split every piece with PCRE2 (tests compare the fast path with it) */
    bool quiet;          /* no warning when the folder has no tiktoken.model */
} st_tokenizer_opts_t;

/* Load from a checkpoint folder: tiktoken.model + tokenizer_config.json (+ config.json and
 * generation_config.json when present). opts may be NULL. Malformed files are ST_ERR_PARSE /
 * ST_ERR_CONFIG naming the file and line or key; *out is written only on success. */
st_status_t st_tokenizer_load(st_tokenizer_t **out, const char *dir, const st_tokenizer_opts_t *opts);
/* The same from explicit files; any of the JSON paths may be NULL (absent). ranks_path NULL gives
 * the byte tokenizer. */
st_status_t st_tokenizer_load_files(st_tokenizer_t **out, const char *ranks_path, const char *tokenizer_config,
                                    const char *config, const char *generation_config,
                                    const st_tokenizer_opts_t *opts);
void st_tokenizer_destroy(st_tokenizer_t *tk);

st_tokenizer_kind_t st_tokenizer_kind(const st_tokenizer_t *tk);
int32_t st_tokenizer_n_ids(const st_tokenizer_t *tk);   /* ids that can be emitted: [0, n) */
int32_t st_tokenizer_bos(const st_tokenizer_t *tk);     /* -1 when none */
int32_t st_tokenizer_pad(const st_tokenizer_t *tk);     /* -1 when none */
int st_tokenizer_eos(const st_tokenizer_t *tk, const int32_t **ids); /* every stop id; returns count */
bool st_tokenizer_is_eos(const st_tokenizer_t *tk, int32_t id);
/* The id of a special token's exact text ("<|im_end|>"), or -1 (none, or no embedding row). */
int32_t st_tokenizer_special_id(const st_tokenizer_t *tk, const char *text);
/* A special/added token (tiktoken: id >= number of ranks; bytes: id >= 256) */
bool st_tokenizer_is_special(const st_tokenizer_t *tk, int32_t id);
/* The bytes of one token (not NUL-terminated; may be part of a UTF-8 character). Byte-tokenizer
 * specials have no text (len 0). ST_ERR_OUT_OF_RANGE for an id outside [0, n_ids). */
st_status_t st_tokenizer_token_bytes(const st_tokenizer_t *tk, int32_t id, const char **bytes, size_t *len);
/* Longest token text in bytes; a stream step writes at most 3 * this + 12 bytes. */
size_t st_tokenizer_max_token_bytes(const st_tokenizer_t *tk);

/* Growable id list the caller owns (zero-initialise; st_tok_ids_free releases). */
typedef struct {
    int32_t *ids;
    size_t n, cap;
} st_tok_ids_t;
void st_tok_ids_free(st_tok_ids_t *v);

/* encode flags */
#define ST_TOK_ALLOW_SPECIAL 1u /* special tokens' text becomes their id: template markup only. Without
                                 * it the text is ordinary text (user and tool content), so a user
                                 * typing "<|im_end|>" cannot end a turn */
/* Append the ids of len bytes of text. Invalid UTF-8 is read as U+FFFD per maximal ill-formed
 * subsequence (as Python's errors="replace"). ST_ERR_NO_MEMORY / ST_ERR_INTERNAL (PCRE2 failure)
 * leave out->n as it was. */
st_status_t st_tokenizer_encode(const st_tokenizer_t *tk, const char *text, size_t len, unsigned flags,
                                st_tok_ids_t *out);

/* decode flags */
#define ST_TOK_SKIP_SPECIAL 1u /* leave out tokens marked "special" in tokenizer_config.json */
#define ST_TOK_RAW_BYTES 2u    /* give the bytes as they are, not repaired to valid UTF-8 */
/* ids → text: *text is malloc'd and NUL-terminated (caller frees). An id outside [0, n_ids) or
 * without an embedding row is ST_ERR_OUT_OF_RANGE. Unless ST_TOK_RAW_BYTES, invalid UTF-8 becomes
 * U+FFFD. */
st_status_t st_tokenizer_decode(const st_tokenizer_t *tk, const int32_t *ids, size_t n, unsigned flags, char **text,
                                size_t *len);

/* Incremental decoding for streams: each step gives the text that is complete so far, holding
 * back the bytes of a UTF-8 character that later tokens finish; output is always valid UTF-8.
 * Embedded by the caller; no allocation. */
typedef struct {
    uint8_t pend[4];
    int n_pend;
    unsigned flags; /* ST_TOK_SKIP_SPECIAL */
} st_tok_stream_t;
void st_tok_stream_init(st_tok_stream_t *st, unsigned flags);
/* Feed one id; writes *n bytes (no NUL) to out. cap must be at least
 * 3 * st_tokenizer_max_token_bytes + 12, else ST_ERR_INVALID_ARG and nothing consumed. An id
 * that decode would refuse is ST_ERR_OUT_OF_RANGE, the stream unchanged. */
st_status_t st_tok_stream_put(const st_tokenizer_t *tk, st_tok_stream_t *st, int32_t id, char *out, size_t cap,
                              size_t *n);
/* End of stream: held-back bytes become U+FFFD. out needs 12 bytes; returns bytes written. */
size_t st_tok_stream_flush(st_tok_stream_t *st, char *out);

#ifdef __cplusplus
}
#endif
#endif
