/* The CUDA backend's interface beyond the backend table (engine/backend_cuda.c): for benchmarks
 * that compare the decode-step graphs against plain launches in one process. Internal header. */
#ifndef STRATA_ENGINE_BACKEND_CUDA_H
#define STRATA_ENGINE_BACKEND_CUDA_H

#include <stdbool.h>

#include "strata/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Decode-step graphs on or off (st_engine_opts_t.cuda_graphs at creation); drops the captured
 * graphs, so the next steps capture the kernels chosen then. Nothing on a CPU engine. */
void st_engine_cuda_set_graphs(st_engine_t *e, bool on);

#ifdef __cplusplus
}
#endif
#endif
