/* RMSNorm (fp32 in, bf16 out for the next GEMM); fp32 math. CPU version: st_rmsnorm (kernels/norm.c).
 * (KDA's per-head L2Norm runs inside st_cuda_kda_prep.) */
#include "cuda_common.cuh"

/* one block per row; x [T, n] fp32, y (and lo) [T, n] bf16; w [n] fp32 or NULL */
__global__ void rmsnorm32_kernel(st_bf16_t *y, st_bf16_t *lo, const float *x, const float *w, int n, float eps) {
    st_pdl_trigger(); /* the GEMM that reads this output may start loading its weights */
    __shared__ float red[32];
    const float *xr = x + (size_t)blockIdx.x * n;
    float ss = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
    ss = st_block_sum(ss, red);
    float r = rsqrtf(ss / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = xr[i] * r;
        y[(size_t)blockIdx.x * n + i] = st_split_bf(w ? v * w[i] : v, lo ? lo + (size_t)blockIdx.x * n + i : NULL);
    }
}
extern "C" st_status_t st_cuda_rmsnorm(const st_gpu_stream_t *s, st_bf16_t *y, st_bf16_t *lo, const float *x, const float *w, int T, int n,
                                    float eps) {
    if (T < 0 || n <= 0) return ST_FAIL(ST_ERR_INVALID_ARG, "rmsnorm: T=%d n=%d", T, n);
    if (T == 0) return ST_OK;
    rmsnorm32_kernel<<<T, 256, 0, ST_STREAM(s)>>>(y, lo, x, w, n, eps);
    return ST_LAUNCH_OK("rmsnorm32_kernel");
}
