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
    /* the client front door (docs/security.md) */
    const char *api_key;      /* clients send "Authorization: Bearer <api_key>" on /v1/ routes and gRPC Generate/Status; NULL: open */
    int auth_all;             /* /metrics and /status need the key too (/healthz, /readyz never do) */
    int max_queue;            /* requests waiting for a worker slot beyond it get 429 (0: default 1024; -1: none wait) */
    double queue_timeout_s;   /* a request waits at most this long for a slot (0: default 60) */
    const char *http_tls_cert, *http_tls_key; /* PEM files: serve HTTPS only (NULL: plain HTTP) */
    double stream_idle_timeout_s; /* no token from the worker this long: cancel, tell the client (0: default 60) */
    uint32_t test_reply_delay_ms; /* tests only: answer ReportScores and GetThresholds this late (0: at once) */
} st_coord_opts_t;

int st_coord_run(const st_coord_opts_t *o);

#endif
