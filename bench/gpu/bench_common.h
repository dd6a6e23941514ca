/* Shared by the GPU benchmarks: device start-up, the ceilings (copy bandwidth, bf16 GEMM) measured
 * in the same run, and a timing loop. Figures are printed as "RESULT name value unit". */
#ifndef STRATA_BENCH_GPU_COMMON_H
#define STRATA_BENCH_GPU_COMMON_H
#include <stdio.h>
#include <stdlib.h>

#include "strata/gpu.h"
#include "strata/kernels_cuda.h"

/* p [n] (bf16 if bf16 else fp32) = uniform [lo, hi) from a counter hash of (index, seed) (bench_fill.cu) */
st_status_t st_cuda_fill_uniform(const st_gpu_stream_t *s, void *p, bool bf16, size_t n, float lo, float hi,
                                 uint64_t seed);

#define BK(call)                                                                              \
    do {                                                                                      \
        st_status_t rc_ = (call);                                                             \
        if (rc_ != ST_OK) {                                                                   \
            fprintf(stderr, "FATAL %s:%d: %s -> %s\n", __FILE__, __LINE__, #call, st_err_last()); \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

static st_gpu_stream_t bs;
static double b_copy_gbs, b_gemm_tflops;

static void bench_init(const char *name, int want_gemm) {
    if (st_gpu_device_count() <= 0) {
        printf("%s: no CUDA device\n", name);
        exit(77);
    }
    BK(st_gpu_init(0));
    BK(st_gpu_stream_create(&bs));
    char d[256];
    st_gpu_describe(d, sizeof d);
    printf("%s on %s\n", name, d);
    BK(st_gpu_ceiling_copy(&bs, (size_t)2 << 30, 5, &b_copy_gbs));
    printf("RESULT ceiling_copy_d2d %.0f GB/s (2 GiB, read+written)\n", b_copy_gbs);
    if (want_gemm) {
        BK(st_gpu_ceiling_gemm(&bs, 8192, 10, &b_gemm_tflops));
        printf("RESULT ceiling_gemm_bf16_8192 %.1f TFLOP/s\n", b_gemm_tflops);
    }
}

static void *bdev(size_t bytes) {
    void *p;
    BK(st_gpu_malloc(&p, bytes));
    return p;
}

/* v[0..n) ascending (insertion: a few samples) */
static inline void b_sort(double *v, int n) {
    for (int a = 1; a < n; a++)
        for (int b = a; b > 0 && v[b - 1] > v[b]; b--) {
            double x = v[b];
            v[b] = v[b - 1], v[b - 1] = x;
        }
}

/* median over 5 repetitions of the mean of `it` calls of statement st (3 warm-up calls first), ms */
#define BTIME(ms_out, it, st)                                                  \
    do {                                                                       \
        for (int w_ = 0; w_ < 3; w_++) BK(st);                                 \
        st_gpu_timer_t t_;                                                     \
        BK(st_gpu_timer_init(&t_));                                            \
        double v_[5];                                                          \
        for (int r_ = 0; r_ < 5; r_++) {                                       \
            BK(st_gpu_timer_start(&t_, &bs));                                  \
            for (int i_ = 0; i_ < (it); i_++) BK(st);                          \
            BK(st_gpu_timer_stop(&t_, &bs, &v_[r_]));                          \
            v_[r_] /= (it);                                                    \
        }                                                                      \
        b_sort(v_, 5);                                                         \
        st_gpu_timer_cleanup(&t_);                                             \
        (ms_out) = v_[2];                                                      \
    } while (0)

#endif
