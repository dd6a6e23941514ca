/* Helpers for the GPU tests: skip (exit 77) without a device, bf16 host arrays, device buffers that
 * are NaN-poisoned before every run, and comparisons through tests/harness.h. */
#ifndef STRATA_GPU_TEST_H
#define STRATA_GPU_TEST_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "harness.h"
#include "strata/base.h"
#include "strata/gpu.h"
#include "strata/kernels_cuda.h"

static st_gpu_stream_t gt_stream;

static inline void gt_init_or_skip(const char *name) {
    if (st_gpu_device_count() <= 0) {
        printf("%s: no CUDA device, skipped\n", name);
        exit(77);
    }
    if (st_gpu_init(0) != ST_OK || st_gpu_stream_create(&gt_stream) != ST_OK) {
        fprintf(stderr, "%s: GPU init failed: %s\n", name, st_err_last());
        exit(1);
    }
    char d[256];
    st_gpu_describe(d, sizeof d);
    printf("%s on %s\n", name, d);
}

#define GT_OK(call)                                                                        \
    do {                                                                                   \
        st_status_t rc_ = (call);                                                          \
        if (rc_ != ST_OK) {                                                                \
            fprintf(stderr, "FATAL %s:%d: %s -> %d %s\n", __FILE__, __LINE__, #call, rc_, \
                    st_err_last());                                                        \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

static inline void *gt_dev(size_t bytes) {
    void *p = NULL;
    GT_OK(st_gpu_malloc(&p, bytes));
    GT_OK(st_gpu_memset(p, 0xff, bytes)); /* NaN in bf16 and fp32 */
    return p;
}
static inline void gt_poison(void *p, size_t bytes) { GT_OK(st_gpu_memset(p, 0xff, bytes)); }
static inline void *gt_up(const void *h, size_t bytes) {
    void *p = gt_dev(bytes);
    GT_OK(st_gpu_memcpy_h2d(p, h, bytes));
    return p;
}
static inline void gt_down(void *h, const void *d, size_t bytes) {
    GT_OK(st_gpu_stream_sync(&gt_stream));
    GT_OK(st_gpu_memcpy_d2h(h, d, bytes));
}

/* random normal fp32, rounded through bf16 (so CPU and GPU see the same values); bf optional out */
static inline void gt_randn_bf(float *x, uint16_t *bf, size_t n, float sd, st_rng_t *r) {
    for (size_t i = 0; i < n; i++) {
        uint16_t h = st_f32_to_bf16(st_rng_normal(r) * sd);
        if (bf) bf[i] = h;
        x[i] = st_bf16_to_f32(h);
    }
}
static inline void gt_to_bf(uint16_t *bf, float *x, size_t n) { /* rounds x in place too */
    for (size_t i = 0; i < n; i++) {
        bf[i] = st_f32_to_bf16(x[i]);
        x[i] = st_bf16_to_f32(bf[i]);
    }
}
static inline void gt_from_bf(float *x, const uint16_t *bf, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = st_bf16_to_f32(bf[i]);
}
static inline void *gt_xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) { fprintf(stderr, "out of memory\n"); exit(1); }
    return p;
}

#endif
