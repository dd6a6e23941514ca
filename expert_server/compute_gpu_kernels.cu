/* CUDA glue for the expert server's GPU path (compute_gpu.c): fp32 → bf16 rows and async copies.
 * The FFN itself is kernels/moe_ffn.cu (st_cuda_moe_ffn_f32out). */
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "compute_gpu_glue.h"

__global__ void es_f32_to_bf16_kernel(__nv_bfloat16 *y, const float *x, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (; i < n; i += stride) y[i] = __float2bfloat16_rn(x[i]); /* NOTE: RNE, as st_f32_to_bf16 */
}

extern "C" st_status_t es_gpu_f32_to_bf16(const st_gpu_stream_t *s, st_bf16_t *y, const float *x, size_t n) {
    if (n == 0) return ST_OK;
    size_t blocks = (n + 255) / 256;
    if (blocks > 4096) blocks = 4096;
    es_f32_to_bf16_kernel<<<(unsigned)blocks, 256, 0, (cudaStream_t)s->stream>>>((__nv_bfloat16 *)y, x, n);
    return ST_LAUNCH_CHECK("es_f32_to_bf16");
}

extern "C" st_status_t es_gpu_copy_async(const st_gpu_stream_t *s, void *dst, const void *src, size_t bytes, int h2d) {
    if (bytes == 0) return ST_OK;
    return ST_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, h2d ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost,
                                         (cudaStream_t)s->stream));
}
