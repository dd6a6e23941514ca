/* RMSNorm (fp32 in, bf16 out for the next GEMM) and per-head L2Norm (bf16 in place); fp32 math.
 * CPU versions: kernels/norm.c. */
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

/* one warp per (token, head); x [T, H, dh] bf16 in place */
__global__ void l2norm_kernel(st_bf16_t *x, int rows, int dh, float eps) {
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), l = threadIdx.x & 31;
    if (row >= rows) return;
    st_bf16_t *p = x + (size_t)row * dh;
    float ss = 0.f;
    for (int i = l; i < dh; i += 32) {
        float v = st_bf(p[i]);
        ss += v * v;
    }
    ss = st_warp_sum(ss);
    float r = rsqrtf(ss + eps);
    for (int i = l; i < dh; i += 32) p[i] = st_tobf(st_bf(p[i]) * r);
}

extern "C" st_status_t st_cuda_l2norm_heads(const st_gpu_stream_t *s, st_bf16_t *x, int T, int H, int dh,
                                            float eps) {
    if (T < 0 || H <= 0 || dh <= 0) return ST_FAIL(ST_ERR_INVALID_ARG, "l2norm: T=%d H=%d dh=%d", T, H, dh);
    int rows = T * H;
    if (rows == 0) return ST_OK;
    l2norm_kernel<<<(rows + 7) / 8, 256, 0, ST_STREAM(s)>>>(x, rows, dh, eps);
    return ST_LAUNCH_OK("l2norm_kernel");
}
