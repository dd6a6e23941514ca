/* Decode-sized linear layers: st_cuda_linear (the skinny kernel up to 32 tokens and small W, cuBLAS
 * beyond: kernels/linear.cu) vs a plain cublasGemmEx on the shapes of the `small` trunk, its LM head
 * and K3-sized projections, T = 1 … 64 tokens. Each call reads a different copy of W (copies totalling
 * ≥ 256 MB, more than the L2), so the figures are from HBM; the calls are captured into one CUDA graph
 * and replayed, so the time is the GPU's (a decode step runs as a graph too), not the host's launch
 * rate. GB/s counts W's bytes, next to the copy ceiling measured in the same run. */
#include <cublas_v2.h>

#include "bench_common.h"

static double graph_us(void *exec, int calls) {
    double ms;
    BTIME(ms, 1, st_gpu_graph_launch(exec, &bs));
    return ms * 1e3 / calls;
}

/* y [T, N] fp32 = x [T, K] · Wᵀ through cuBLAS alone (the column-major mapping of kernels/linear.cu) */
static st_status_t cublas_linear(float *y, const st_bf16_t *x, const st_bf16_t *W, int T, int N, int K) {
    const float one = 1.f, zero = 0.f;
    cublasStatus_t st = cublasGemmEx((cublasHandle_t)bs.cublas, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &one, W, CUDA_R_16BF,
                                     K, x, CUDA_R_16BF, K, &zero, y, CUDA_R_32F, N, CUBLAS_COMPUTE_32F,
                                     CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) {
        st_err_set("cublasGemmEx: status %d", (int)st);
        return ST_ERR_DEVICE;
    }
    return ST_OK;
}

int main(void) {
    bench_init("bench_gpu_linear", 0);
    static const int shapes[][2] = {{3072, 1024}, {1024, 1024}, {512, 1024}, {64, 1024}, {1024, 512},
                                    {1024, 1536}, {32768, 1024}, {4096, 7168}, {7168, 4096}};
    static const int Ts[] = {1, 8, 16, 32, 64};
    printf("%6s %6s %3s | %9s %8s | %9s %8s | %s\n", "N", "K", "T", "strata us", "GB/s", "cuBLAS us", "GB/s",
           "speed-up");
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        int N = shapes[i][0], K = shapes[i][1];
        size_t wb = (size_t)N * K * 2;
        int copies = (int)(((size_t)256 << 20) / wb) + 1;
        st_bf16_t *W = bdev(wb * copies), *x = bdev((size_t)64 * K * 2);
        float *y = bdev((size_t)64 * N * 4);
        BK(st_gpu_memset(W, 0x3c, wb * copies)); /* bf16 0x3c3c ≈ 0.0115: finite */
        BK(st_gpu_memset(x, 0x3c, (size_t)64 * K * 2));
        for (size_t j = 0; j < sizeof Ts / sizeof Ts[0]; j++) {
            int T = Ts[j];
            double us[2];
            for (int v = 0; v < 2; v++) {
                void *exec;
                BK(cublas_linear(y, x, W, T, N, K)); /* cuBLAS set-up outside the capture */
                BK(st_gpu_stream_sync(&bs));
                BK(st_gpu_capture_begin(&bs));
                for (int c = 0; c < copies; c++)
                    BK(v == 0 ? st_cuda_linear(&bs, y, N, true, 0.f, x, K, W + (size_t)c * N * K, T, N, K)
                              : cublas_linear(y, x, W + (size_t)c * N * K, T, N, K));
                BK(st_gpu_capture_end(&bs, &exec));
                us[v] = graph_us(exec, copies);
                st_gpu_graph_destroy(exec);
            }
            printf("%6d %6d %3d | %9.2f %8.0f | %9.2f %8.0f | %.2fx\n", N, K, T, us[0], wb / us[0] / 1e3, us[1],
                   wb / us[1] / 1e3, us[1] / us[0]);
            printf("RESULT linear_N%d_K%d_T%d %.2f us (%.0f GB/s, %.0f%% of copy) cublas %.2f us: %.2fx\n", N, K, T,
                   us[0], wb / us[0] / 1e3, 100.0 * wb / us[0] / 1e3 / b_copy_gbs, us[1], us[1] / us[0]);
        }
        st_gpu_free(W), st_gpu_free(x), st_gpu_free(y);
    }
    return 0;
}
