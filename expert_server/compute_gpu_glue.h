/* Internal: the CUDA glue of compute_gpu.c (compute_gpu_kernels.cu). Pointers are device memory
 * unless marked host; everything is asynchronous on s. */
#ifndef STRATA_ES_COMPUTE_GPU_GLUE_H
#define STRATA_ES_COMPUTE_GPU_GLUE_H

#include <stddef.h>

#include "strata/gpu.h"
#include "strata/kernels_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif
/* cudaMemcpyAsync, h2d 1: host (pinned) → device, 0: device → host (pinned) */
st_status_t es_gpu_copy_async(const st_gpu_stream_t *s, void *dst, const void *src, size_t bytes, int h2d);
#ifdef __cplusplus
}
#endif
#endif
