/* The expert server's one glue kernel (compute_gpu.c): the expansion of a distinct-rows dispatch.
 * The conversion and the FFN are kernels/ (st_cuda_f32_to_bf16, st_cuda_moe_ffn_table); the
 * copies are common/gpu's. */

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "compute_gpu_glue.h"

/* grid (ceil(w / 1024), n), 256 threads × 4 columns */
__global__ void es_expand_bf16_kernel(uint2 *dst, const float4 *rows, const uint32_t *src, int n_in, int w4) {
    const int r = blockIdx.y, c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= w4) return;
    const uint32_t k = src[r];
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (k < (uint32_t)n_in) v = rows[(size_t)k * w4 + c];
    __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
    dst[(size_t)r * w4 + c] = make_uint2(*reinterpret_cast<uint32_t *>(&lo), *reinterpret_cast<uint32_t *>(&hi));
}

extern "C" st_status_t es_gpu_expand_bf16(const st_gpu_stream_t *s, st_bf16_t *dst, const float *rows, const uint32_t *src,
                                          int n, int n_in, int w) {
    if (n <= 0) return ST_OK;
    if (w % 4 || n > 65535 * 64)
        return ST_FAIL(ST_ERR_INVALID_ARG, "expand_bf16: width %d (multiple of 4), %d rows", w, n);
    const int w4 = w / 4;
    for (int r0 = 0; r0 < n; r0 += 65535) { /* gridDim.y ≤ 65535 */
        const int nr = n - r0 < 65535 ? n - r0 : 65535;
        es_expand_bf16_kernel<<<dim3((w4 + 255) / 256, nr), 256, 0, (cudaStream_t)s->stream>>>(
            reinterpret_cast<uint2 *>(dst) + (size_t)r0 * w4, reinterpret_cast<const float4 *>(rows), src + r0, n_in, w4);
        st_status_t rc = st_gpu_last_launch("es_expand_bf16_kernel", __FILE__, __LINE__);
        if (rc) return rc;
    }
    return ST_OK;
}
