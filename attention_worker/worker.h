/* The attention worker process: the engine with remote experts, a continuous-batching scheduler on a
 * compute thread, UCX dispatch/combine to the expert servers, and the Worker.Generate gRPC service
 * that the coordinator forwards client requests to (and that only the coordinator may call). */
#ifndef STRATA_AW_WORKER_H
#define STRATA_AW_WORKER_H

#include <stdint.h>

#include "strata/base.h"
#include "strata/engine.h"
#include "strata/proto.h"

typedef struct {
    const char *ckpt;
    const char *coordinator;   /* host:port */
    const char *coordinator_file; /* optional: the coordinator's current address (its ready file), re-read on reconnect */
    const char *listen;        /* gRPC host:port for Worker.Generate (port 0 = ephemeral) */
    const char *name;
    int max_seqs, max_batch_tokens, max_ctx;
    st_route_mode_t routing;
    int k_max;
    int micro_batches;         /* at most this many ping-pong micro-batches per step, 1..4 (default 2); the
                                * count each step size runs is measured (mbtune.h) */
    int min_mb_tokens;         /* split only when each micro-batch gets at least this many tokens (default 16) */
    uint32_t expert_timeout_ms;/* bound on every wait for an expert server (default 5000) */
    int device;                /* -1 = CPU engine; N = the GPU engine on cuda:N */
    int drain_timeout_s;       /* SIGTERM: finish in-flight requests for at most this long (< 0: 30) */
    const st_sec_opts_t *sec;  /* cluster secret and TLS (st_sec_opts_finish done); NULL = insecure */
} st_aw_opts_t;

/* SIGINT stops at once (requests in flight end "cancelled"); SIGTERM drains: new requests are
 * refused (RESOURCE_EXHAUSTED "draining", before any chunk, so the coordinator sends them elsewhere),
 * the ones in flight finish within drain_timeout_s, then the worker exits; a second signal stops at
 * once. Returns the process exit code (0 after a stop or a drain). */
int st_aw_run(const st_aw_opts_t *o);

/* What one Worker/Generate request may ask of this worker. */
typedef struct {
    int max_ctx;    /* prompt + generated tokens */
    int max_prompt; /* prompt tokens (a prompt is prefilled in one step: --max-batch-tokens) */
    int max_stop;   /* stop token ids */
} st_aw_limits_t;

#define ST_AW_DEFAULT_MAX_TOKENS 16 /* a request's max_tokens 0 */

/* Range-checks every field of a request before anything is cast or sized from it: the prompt
 * (token ids, or text at one token per byte) is 1..max_prompt tokens, each id < c->vocab;
 * max_tokens (0 = ST_AW_DEFAULT_MAX_TOKENS) is 1..max_ctx - prompt; temperature 0..100 and top_p
 * 0..1 (finite); top_k <= vocab; at most max_stop stop ids, each < vocab; top_logprobs <= 20 and
 * only with logprobs. Pure (no allocation, no
 * logging above DEBUG). ST_OK with *n_prompt and *max_tokens written; else ST_ERR_INVALID_ARG (a
 * malformed request) or ST_ERR_OUT_OF_RANGE (a count or id beyond the limits), reason in
 * st_err_last(). */
#define ST_AW_MAX_LOGIT_BIAS 1024 /* logit_bias entries of one request */
st_status_t st_aw_check_request(const st_config_t *c, const st_aw_limits_t *lim, const st_proto_generate_req_t *r,
                                int *n_prompt, int *max_tokens);

#endif
