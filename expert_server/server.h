/* The expert server: receives dispatches over UCX from any number of attention workers, runs them
 * on a compute thread, replies on the same endpoint. Registers with the coordinator. */
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
    /* A dispatch of at most this many rows that arrives while nothing computes runs on the loop
     * thread, saving the queue's two thread hand-offs (--inline-rows; 0: always queue). < 0: the
     * default, ST_ES_INLINE_ROWS_GPU on a GPU server (a small dispatch computes in tens of µs there),
     * 0 on the CPU (where it takes long enough that receiving the next dispatch meanwhile matters
     * more). */
    int inline_rows;
    const st_sec_opts_t *sec;  /* cluster secret and TLS (st_sec_opts_finish done) */
} st_es_opts_t;

#define ST_ES_INLINE_ROWS_GPU 512

/* Runs until SIGINT/SIGTERM; returns the process exit code. */
int st_es_run(const st_es_opts_t *o);

#endif
