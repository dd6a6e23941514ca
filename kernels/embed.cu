/* Token embedding on the GPU (SPEC §2): rows of the bf16 table into the fp32 residual stream.
 * CPU: st_embed (kernels/embed.c). */
#include "cuda_common.cuh"

__global__ void embed_kernel(float *partial, const st_bf16_t *E, const int *tok, int d) {
    const st_bf16_t *row = E + (size_t)tok[blockIdx.x] * d;
    float *o = partial + (size_t)blockIdx.x * d;
    for (int c = threadIdx.x; c < d; c += blockDim.x) o[c] = st_bf(row[c]);
}
extern "C" st_status_t st_cuda_embed(const st_gpu_stream_t *s, float *partial, const st_bf16_t *E, const int *tok, int T,
                                int d) {
    if (T <= 0) return ST_OK;
    embed_kernel<<<T, 256, 0, ST_STREAM(s)>>>(partial, E, tok, d);
    return ST_LAUNCH_OK("embed_kernel");
}

