/* The attention worker process: the engine with remote experts, a continuous-batching scheduler on a
 * compute thread, UCX dispatch/combine to the expert servers, and the Worker.Generate gRPC service
 * that the coordinator forwards client requests to. */
#ifndef STRATA_AW_WORKER_H
#define STRATA_AW_WORKER_H

#include <stdint.h>

#include "strata/base.h"

#include "strata/engine.h"

typedef struct {
    const char *ckpt;
    const char *coordinator;   /* host:port */
    const char *listen;        /* gRPC host:port for Worker.Generate (port 0 = ephemeral) */
    const char *name;
    int max_seqs, max_batch_tokens, max_ctx;
    st_route_mode_t routing;
    int k_max;
    int micro_batches;         /* 1 or 2 (default 2: ping-pong when the batch is large enough) */
    int min_mb_tokens;         /* split only when each micro-batch gets at least this many tokens */
    uint32_t expert_timeout_ms;/* bound on every wait for an expert server (default 5000) */
    int device;                /* -1 = CPU engine; N = the GPU engine on cuda:N */
    const st_sec_opts_t *sec;  /* cluster secret and TLS (st_sec_opts_finish done) */
} st_aw_opts_t;

/* Runs until SIGINT/SIGTERM; returns the process exit code. */
int st_aw_run(const st_aw_opts_t *o);

#endif
