/* The OpenAI-compatible request side of the coordinator's front door as pure functions (no loop, no
 * I/O, no logging): /v1/completions body JSON → st_proto_generate_req_t with every check, the checks
 * every Generate request passes (HTTP and gRPC alike), and a strict UTF-8 cleaner for completion
 * text. Fuzzed by fuzz/fuzz_openai.c; tested by tests/coordinator/test_openai.c. */
#ifndef STRATA_COORD_OPENAI_H
#define STRATA_COORD_OPENAI_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "strata/base.h"
#include "strata/model.h"
#include "strata/proto.h"

#define ST_OPENAI_MAX_TOKENS 1000000u /* max_tokens: 1..this */
#define ST_OPENAI_MAX_TOP_K 1000000   /* top_k: -1 or 0 (off) .. this */
#define ST_OPENAI_MAX_TEMPERATURE 100.0
#define ST_OPENAI_MAX_STOP 16
#define ST_OPENAI_MAX_STOP_STRINGS 16   /* "stop": strings of any length up to ST_OPENAI_MAX_STOP_BYTES */
#define ST_OPENAI_MAX_STOP_BYTES 1024
#define ST_OPENAI_MAX_CHOICES 64        /* n x prompts of a batch */
#define ST_OPENAI_MAX_LOGPROBS 20       /* top_logprobs (chat) / logprobs (completions) */
#define ST_OPENAI_MAX_LOGIT_BIAS 300    /* logit_bias entries */

typedef struct {
    const char *model; /* the served model's name: another "model" is a 400 */
    int vocab;         /* token ids (prompt and stop) must be below it; 0: not checked */
    const st_tokenizer_t *tok; /* chat: renders and encodes the conversation (required for chat) */
} st_openai_limits_t;

typedef struct {
    char *text;    /* or */
    uint32_t *ids; /* token ids */
    size_t n_ids;
} st_openai_prompt_t;

/* A parsed /v1/completions or /v1/chat/completions request. req's pointers point into this
 * struct's own allocations: release with st_openai_req_cleanup. */
typedef struct {
    st_proto_generate_req_t req;
    int stream, chat, include_usage, echo;
    int tools;                        /* chat: tools were declared (tool calls are parsed back) */
    int n;                            /* choices per prompt */
    int logprobs;                     /* -1: none; else the sampled token's logprob and this many top ones */
    size_t n_prompts;                 /* 1, or a completions batch: req holds the first prompt, */
    st_openai_prompt_t *batch;        /* batch[i - 1] prompt i (n_prompts - 1 of them) */
    size_t n_stop_strs;
    char *stop_strs[ST_OPENAI_MAX_STOP_STRINGS]; /* NUL-terminated, never empty */
    uint32_t stops[ST_OPENAI_MAX_STOP];
    uint32_t bias_ids[ST_OPENAI_MAX_LOGIT_BIAS]; /* req.logit_bias_* point here */
    float bias_values[ST_OPENAI_MAX_LOGIT_BIAS];
} st_openai_req_t;

/* Why a request was refused: the OpenAI error "message" and "param" (NULL when no one field). */
typedef struct {
    char message[320];
    const char *param;
} st_openai_err_t;

/* Parse and check a /v1/completions body of len bytes (need not be NUL-terminated). ST_OK fills
 * *out; ST_ERR_INVALID_ARG or ST_ERR_OUT_OF_RANGE (a client's mistake: answer 400) fills *err;
 * ST_ERR_NO_MEMORY otherwise. Every numeric field is range-checked before it is converted. */
st_status_t st_openai_parse_completion(const char *body, size_t len, const st_openai_limits_t *lim,
                                       st_openai_req_t *out, st_openai_err_t *err);
/* The same for a /v1/chat/completions body: "messages" are rendered in Kimi's chat format (see
 * chat.c) and encoded with lim->tok into req.prompt_tokens; "max_completion_tokens" is max_tokens,
 * "stream_options.include_usage" is honoured, "tools" are declared to the model. */
st_status_t st_openai_parse_chat(const char *body, size_t len, const st_openai_limits_t *lim, st_openai_req_t *out,
                                 st_openai_err_t *err);
void st_openai_req_cleanup(st_openai_req_t *r);

/* ---- Kimi's chat format (chat.c) ----
 * The K2 / Kimi Linear grammar: <|im_system|>/<|im_user|>/<|im_assistant|> + role (or name) +
 * <|im_middle|> + content + <|im_end|>, the default system message when the first message is not
 * a system one, the tool declaration, assistant tool calls and tool results as K2's official
 * template renders them (tests/coordinator/data/kimi-k2-instruct-0905.jinja, checked with Jinja2),
 * then the assistant's turn. Template markup becomes special-token ids; everything a client wrote
 * (content, names, ids, arguments) is encoded with special tokens read as plain text, so a user
 * typing "<|im_end|>" cannot end a turn. With a tokenizer that lacks a marker (the byte
 * tokenizer), the marker is encoded as text. */
typedef struct {
    st_tok_ids_t ids; /* the prompt's token ids */
    char *text;       /* the rendered prompt (markers as their text), NUL-terminated */
    size_t len;
} st_chat_prompt_t;
/* messages: the request's "messages" array; tools: its "tools" array or NULL. ST_OK fills *out;
 * ST_ERR_INVALID_ARG fills *err (a client's mistake); ST_ERR_NO_MEMORY / ST_ERR_INTERNAL. */
st_status_t st_chat_render(const st_tokenizer_t *tk, const json_t *messages, const json_t *tools, st_chat_prompt_t *out,
                           st_openai_err_t *err);
void st_chat_prompt_cleanup(st_chat_prompt_t *p);
/* Kimi's tool-call section in generated text: <|tool_calls_section_begin|> (<|tool_call_begin|> ID
 * <|tool_call_argument_begin|> ARGS <|tool_call_end|>)* <|tool_calls_section_end|>. Returns the
 * OpenAI "tool_calls" array (id ID, function name from "functions.NAME:IDX", arguments ARGS) and
 * *content_len, the length of the text before the section; NULL when text has no complete call. */
json_t *st_chat_tool_calls(const char *text, size_t len, size_t *content_len);
/* json.dumps(v, ensure_ascii=False) as Python writes it (Hugging Face's tojson): ", " and ": "
 * separators, floats in repr form. malloc'd, NULL on no memory. */
char *st_chat_tojson(const json_t *v);

/* The checks every Generate request passes before it is queued or proxied (also the gRPC one,
 * decoded from protobuf). ST_OK, or ST_ERR_INVALID_ARG / ST_ERR_OUT_OF_RANGE with *err filled. */
st_status_t st_openai_check(const st_proto_generate_req_t *r, const st_openai_limits_t *lim, st_openai_err_t *err);

/* Strict UTF-8 (Unicode 3.9, table 3-7 well-formed sequences) out of arbitrary bytes: well-formed
 * sequences are copied, each maximal ill-formed subpart becomes one U+FFFD (Unicode's "maximal
 * subpart" practice), and a valid but incomplete sequence at the end is held back unless final
 * (streams: it completes with the next chunk). out needs 3·n + 1 bytes; it is NUL-terminated (a
 * NUL input byte is copied, so use *out_len). Returns the bytes of in consumed. */
size_t st_openai_utf8_clean(const unsigned char *in, size_t n, char *out, size_t *out_len, int final);
/* 1 if s[0..n) is entirely well-formed UTF-8. */
int st_openai_utf8_valid(const unsigned char *s, size_t n);

/* "Authorization: Bearer <key>" against the expected key, in time independent of the key's
 * content (both sides are hashed, so not of its length either). 1 if it matches. */
int st_openai_bearer_ok(const char *authorization, const char *key);

#endif
