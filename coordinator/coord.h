/* The coordinator: membership and heartbeats, expert placement, global quantile thresholds, the
 * client front door (gRPC Generate, OpenAI-compatible HTTP) and the REST status endpoint. */
#ifndef STRATA_COORD_H
#define STRATA_COORD_H

#include <stdint.h>

#include "strata/base.h"

typedef struct {
    const char *ckpt;         /* checkpoint directory (config.json is read for shapes) */
    const char *grpc;         /* host:port (port 0 = ephemeral) */
    const char *http;         /* host:port */
    const char *model_name;   /* reported by /v1/models (default: the checkpoint directory's name) */
    const char *ready_file;   /* written with the bound endpoints once listening */
    int replicas;             /* R: holders per expert (default 1) */
    uint32_t heartbeat_ms;    /* members heartbeat this often; dropped after 2 missed (default 500) */
    int quantile;             /* routing mode shown in /status (workers choose theirs) */
    float lambda;             /* quantile decay (default 0.9) */
    int expect_workers, expect_experts; /* /readyz needs this many alive (default 1 each) */
    const st_sec_opts_t *sec;  /* cluster secret and TLS (st_sec_opts_finish done) */
} st_coord_opts_t;

int st_coord_run(const st_coord_opts_t *o);

#endif
