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

/* Which chat format the checkpoint was trained on (st_chat_format_of_config). */
typedef enum { ST_CHAT_K2 = 0, ST_CHAT_K3 = 1 } st_chat_format_t;

typedef struct {
    const char *model; /* the served model's name: another "model" is a 400 */
    st_chat_format_t chat_format; /* chat: K2 / Kimi Linear (default) or K3 */
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
    st_chat_format_t chat_format;     /* chat: the format the reply is read in */
    int thinking;                     /* chat, K3: the reply opens in the think channel */
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
/* ---- K3's format ("XTML", chat.c) ----
 * As the checkpoint's encoding_k3.py build_chat_segments renders it (vendored in vLLM:
 * vllm/tokenizers/encoding_k3.py): <|open|>message role="user"<|sep|>TEXT<|close|>message<|sep|>
 * <|end_of_msg|> per message, no [BOS]; the tool declaration (key-sorted compact JSON) and, with
 * thinking, the thinking-effort note first; assistant turns with think / response channels and
 * typed tool-call arguments; tool results named and numbered after the assistant's calls (put in
 * call order by tool_call_id); tool_choice and response_format notes; then the assistant's turn
 * opened in its think (or response) channel. Attribute values escape & and ". Every text piece is
 * encoded on its own with special tokens read as text, as the reference does. */
typedef struct {
    int thinking;                  /* the think channel (the reference's default: on) */
    const char *effort;            /* with thinking: "low", "high" or "max" (NULL: "max") */
    const char *tool_choice;       /* NULL/"auto", "none" or "required" (a note to the model) */
    const json_t *response_format; /* NULL or {"type":"json_object"|"json_schema", ...} */
} st_chat_k3_opts_t;
st_status_t st_chat_render_k3(const st_tokenizer_t *tk, const json_t *messages, const json_t *tools,
                              const st_chat_k3_opts_t *o, st_chat_prompt_t *out, st_openai_err_t *err);
/* K3 when config.json (its top level) says model_type "kimi_k3" or an architecture KimiK3* and the
 * tokenizer tk (unless NULL) has K3's markers <|open|> <|close|> <|sep|> <|end_of_msg|>; else K2's
 * format (Kimi Linear, K2; also `strata ckpt init` folders, written in K3's layout, with K2's
 * tokenizer names or none). */
st_chat_format_t st_chat_format_of_config(const json_t *config, const st_tokenizer_t *tk);
/* A K3 reply read back: the generation prompt left the think (thinking) or response channel open,
 * so the text is REASONING<|close|>think<|sep|><|open|>response<|sep|>CONTENT<|close|>response<|sep|>
 * [<|open|>tools<|sep|>(<|open|>call tool="NAME" index="I"<|sep|>ARGUMENTS<|close|>call<|sep|>)*
 * <|close|>tools<|sep|>]<|close|>message<|sep|>, any of it cut short. Arguments (typed
 * <|open|>argument key= type=<|sep|>VALUE<|close|>argument<|sep|> elements, or one raw json block)
 * become OpenAI's JSON text; ids are "functions.NAME:I-1". tool_calls is NULL when no call is
 * complete; the caller releases it. */
typedef struct {
    size_t reasoning_off, reasoning_len;
    size_t content_off, content_len;
    json_t *tool_calls;
} st_chat_k3_reply_t;
void st_chat_k3_reply(const char *text, size_t len, int thinking, st_chat_k3_reply_t *out);
/* K3 streamed token by token: of a reply's text so far [0, len) (final: the whole reply), the parts
 * of the think channel [*r_off, +*r_len) and of the response channel [*c_off, +*c_len) from byte
 * `sent` on that can go out now — nothing a marker still being written could turn into markup (a
 * tail that begins one of the channel markers is held back). The caller gives them out in that
 * order and moves `sent` to the end of what it gave (it may give less: whole UTF-8 characters). */
void st_chat_k3_stream(const char *text, size_t len, int thinking, int final, size_t sent, size_t *r_off,
                       size_t *r_len, size_t *c_off, size_t *c_len);

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
