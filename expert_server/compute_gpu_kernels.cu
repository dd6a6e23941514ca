/* CUDA glue for the expert server's GPU path (compute_gpu.c): async copies. The conversion and the
 * FFN are kernels/ (st_cuda_f32_to_bf16, st_cuda_moe_ffn_table_f32out). */

#include <cuda_runtime.h>

#include "compute_gpu_glue.h"

extern "C" st_status_t es_gpu_copy_async(const st_gpu_stream_t *s, void *dst, const void *src, size_t bytes, int h2d) {
    if (bytes == 0) return ST_OK;
    return ST_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, h2d ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost,
                                         (cudaStream_t)s->stream));
}
