/* The expert server: receives dispatches over UCX from any number of attention workers (or through
 * same-host channels), runs each on the thread that received it, replies on the same endpoint.
 * Registers with the coordinator. */
#ifndef STRATA_ES_SERVER_H
#define STRATA_ES_SERVER_H

#include <stdbool.h>
#include <stdint.h>

#include "strata/base.h"

typedef struct {
    const char *ckpt;        /* checkpoint directory */
    const char *coordinator; /* host:port (gRPC) */
    const char *coordinator_file; /* optional: the coordinator's current address (its ready file), re-read on reconnect */
    const char *host;        /* UCX listen host (default 127.0.0.1) */
    uint16_t port;           /* 0 = ephemeral */
    const char *name;
    int max_rows;            /* rows per dispatch (default 4096) */
    int slots;               /* dispatches in flight (default 16) */
    bool use_cuda;           /* false: CPU compute; true: CUDA device cuda_device (STRATA_WITH_CUDA builds) */
    int cuda_device;
    const st_sec_opts_t *sec;  /* cluster secret and TLS (st_sec_opts_finish done) */
} st_es_opts_t;

/* Runs until SIGINT/SIGTERM; returns the process exit code. */
int st_es_run(const st_es_opts_t *o);

#endif
