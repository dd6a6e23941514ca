/* Internal: the one CUDA kernel of compute_gpu.c (compute_gpu_kernels.cu); the copies, events and
 * streams it needs are common/gpu's (strata/gpu.h). Pointers are device memory; asynchronous on s. */
#ifndef STRATA_ES_COMPUTE_GPU_GLUE_H
#define STRATA_ES_COMPUTE_GPU_GLUE_H

#include <stddef.h>

#include "strata/gpu.h"
#include "strata/kernels_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif
/* dst [n, w] bf16: row r = bf16(rows[src[r]]) of rows [n_in, w] fp32 (round to nearest even; a source
 * ≥ n_in gives zeros: the wire decoder rejects those first). The CPU path's loop is compute.c's. */
st_status_t es_gpu_expand_bf16(const st_gpu_stream_t *s, st_bf16_t *dst, const float *rows, const uint32_t *src, int n,
                               int n_in, int w);
#ifdef __cplusplus
}
#endif
#endif
