/* Linear layer on the GPU: y = x·Wᵀ through cuBLAS (bf16 in, fp32 accumulate). CPU: kernels/linear.c. */
#include <cublas_v2.h>

#include "cuda_common.cuh"

extern "C" st_status_t st_cuda_linear(const st_gpu_stream_t *s, void *y, bool y_f32, const st_bf16_t *x,
                                      const st_bf16_t *W, int T, int N, int K) {
    if (T < 0 || N <= 0 || K <= 0) return ST_FAIL(ST_ERR_INVALID_ARG, "linear: T=%d N=%d K=%d", T, N, K);
    if (T == 0) return ST_OK;
    const float one = 1.f, zero = 0.f;
    // NOTE: cuBLAS is column-major. Row-major W [N,K] is col-major Wᵀ (K×N); row-major y [T,N] is
    // col-major yᵀ (N×T) = W · xᵀ, so C(N×T) = op_T(Wbuf) · xbuf with lda = ldb = K, ldc = N.
    return ST_CUBLAS_CHECK(cublasGemmEx((cublasHandle_t)s->cublas, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &one, W,
                                        CUDA_R_16BF, K, x, CUDA_R_16BF, K, &zero, y,
                                        y_f32 ? CUDA_R_32F : CUDA_R_16BF, N, CUBLAS_COMPUTE_32F,
                                        CUBLAS_GEMM_DEFAULT));
}
