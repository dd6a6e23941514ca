/* The OpenAI-compatible request side of the coordinator's front door as pure functions (no loop, no
 * I/O, no logging): /v1/completions body JSON → st_proto_generate_req_t with every check, the checks
 * every Generate request passes (HTTP and gRPC alike), and a strict UTF-8 cleaner for completion
 * text. Fuzzed by fuzz/fuzz_openai.c; tested by tests/coordinator/test_openai.c. */
#ifndef STRATA_COORD_OPENAI_H
#define STRATA_COORD_OPENAI_H

#include <stddef.h>
#include <stdint.h>

#include "strata/base.h"
#include "strata/proto.h"

#define ST_OPENAI_MAX_TOKENS 1000000u /* max_tokens: 1..this */
#define ST_OPENAI_MAX_TOP_K 1000000   /* top_k: -1 or 0 (off) .. this */
#define ST_OPENAI_MAX_TEMPERATURE 100.0
#define ST_OPENAI_MAX_STOP 16

typedef struct {
    const char *model; /* the served model's name: another "model" is a 400 */
    int vocab;         /* token ids (prompt and stop) must be below it; 0: not checked */
} st_openai_limits_t;

/* A parsed /v1/completions request. req's pointers point into this struct's own allocations:
 * release with st_openai_req_cleanup. */
typedef struct {
    st_proto_generate_req_t req;
    int stream;
    uint32_t stops[ST_OPENAI_MAX_STOP];
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
void st_openai_req_cleanup(st_openai_req_t *r);

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
