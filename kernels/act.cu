/* Element-wise activations on the GPU over fp32 inputs with bf16 outputs (the input of the next GEMM;
 * optional split `lo`, see st_split_bf): GLU (SiTU / SiLU, SPEC §6) and x ⊙ σ(gate).
 * CPU: st_glu, st_mul_sigmoid (kernels/act.c). */
#include "cuda_common.cuh"

__global__ void glu32_kernel(st_bf16_t *h, st_bf16_t *lo, const float *gate, const float *up, int T, int n, int ld, int situ, float b1,
                             float b2) {
    st_pdl_trigger(); /* the GEMM that reads this output may start loading its weights */
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)T * n) return;
    size_t t = i / n, c = i % n;
    float a = gate[t * ld + c], u = up[t * ld + c];
    float sg = 1.f / (1.f + expf(-a));
    h[i] = st_split_bf(situ ? (b1 * tanhf(a / b1) * sg) * (b2 * tanhf(u / b2)) : a * sg * u, lo ? lo + i : NULL);
}
extern "C" st_status_t st_cuda_glu(const st_gpu_stream_t *s, st_bf16_t *h, st_bf16_t *lo, const float *gate, const float *up, int T, int n,
                                int ld_in, bool situ, float b1, float b2) {
    if (T < 0 || n <= 0 || ld_in < n) return ST_FAIL(ST_ERR_INVALID_ARG, "glu: T=%d n=%d ld=%d", T, n, ld_in);
    size_t N = (size_t)T * n;
    if (!N) return ST_OK;
    glu32_kernel<<<(unsigned)((N + 255) / 256), 256, 0, ST_STREAM(s)>>>(h, lo, gate, up, T, n, ld_in, situ, b1, b2);
    return ST_LAUNCH_OK("glu32_kernel");
}


__global__ void mul_sigmoid32_kernel(st_bf16_t *y, st_bf16_t *lo, const float *x, const float *g, size_t n) {
    st_pdl_trigger(); /* the GEMM that reads this output may start loading its weights */
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = st_split_bf(x[i] * st_sigf(g[i]), lo ? lo + i : NULL);
}
extern "C" st_status_t st_cuda_mul_sigmoid(const st_gpu_stream_t *s, st_bf16_t *y, st_bf16_t *lo, const float *x, const float *gate,
                                        size_t n) {
    if (!n) return ST_OK;
    mul_sigmoid32_kernel<<<(unsigned)((n + 255) / 256), 256, 0, ST_STREAM(s)>>>(y, lo, x, gate, n);
    return ST_LAUNCH_OK("mul_sigmoid32_kernel");
}
