/* Strata GPU runtime: device selection, streams (each with its cuBLAS handle and workspace),
 * device and pinned arenas, and CUDA/cuBLAS error -> st_status_t. The only code besides
 * the kernels/ .cu files that includes cuda_runtime.h; this header itself is plain C and CUDA-free. */
#ifndef STRATA_GPU_H
#define STRATA_GPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "strata/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Number of CUDA devices; 0 (and ST_OK) when the driver or devices are absent. */
int st_gpu_device_count(void);
/* Select device dev for the calling thread. */
st_status_t st_gpu_init(int dev);
/* Human-readable device line ("NVIDIA H200, sm_90, 132 SMs, 139.8 GiB") into buf. */
void st_gpu_describe(char *buf, size_t n);
/* Marks the range an external profiler records (`ncu --profile-from-start off`): start, then stop. */
void st_gpu_profiler(bool on);

/* A stream with its own cuBLAS handle and cuBLAS workspace (allocated once at create, so GEMMs on
 * this stream never allocate). The fields are opaque CUDA handles stored as void*. */
typedef struct {
    void *stream;      /* cudaStream_t */
    void *cublas;      /* cublasHandle_t bound to stream */
    void *cublas_ws;   /* device workspace for cuBLAS */
    size_t cublas_ws_bytes;
} st_gpu_stream_t;
st_status_t st_gpu_stream_create(st_gpu_stream_t *s);
void st_gpu_stream_destroy(st_gpu_stream_t *s);
st_status_t st_gpu_stream_sync(const st_gpu_stream_t *s);
/* CUDA graphs: capture what is queued on s (relaxed mode) between begin and end into an executable
 * graph (*exec), launch it on a stream, destroy it (NULL is fine). */
st_status_t st_gpu_capture_begin(const st_gpu_stream_t *s);
st_status_t st_gpu_capture_end(const st_gpu_stream_t *s, void **exec);
st_status_t st_gpu_graph_launch(void *exec, const st_gpu_stream_t *s);
void st_gpu_graph_destroy(void *exec);

/* Error conversion: log once with context, record in st_err_last, return ST_ERR_DEVICE (or ST_OK
 * when err == 0). cuda_err is a cudaError_t, cublas_err a cublasStatus_t. */
st_status_t st_gpu_cuda_status(int cuda_err, const char *what, const char *file, int line);
st_status_t st_gpu_cublas_status(int cublas_err, const char *what, const char *file, int line);
#define ST_CUDA_CHECK(call) st_gpu_cuda_status((int)(call), #call, __FILE__, __LINE__)
#define ST_CUBLAS_CHECK(call) st_gpu_cublas_status((int)(call), #call, __FILE__, __LINE__)
/* Status of the last launch on this thread (cudaGetLastError), named by what. */
st_status_t st_gpu_last_launch(const char *what, const char *file, int line);
#define ST_LAUNCH_CHECK(what) st_gpu_last_launch((what), __FILE__, __LINE__)

/* Start-up allocations (never on the per-token path). The copies and the memset are complete on
 * return, so work queued next on any stream sees them. */
st_status_t st_gpu_malloc(void **p, size_t bytes);
void st_gpu_free(void *p);
st_status_t st_gpu_memcpy_h2d(void *dst, const void *src, size_t bytes);
st_status_t st_gpu_memcpy_d2h(void *dst, const void *src, size_t bytes);
st_status_t st_gpu_memset(void *dst, int byte, size_t bytes);

/* Arenas: one cudaMalloc (device) or cudaMallocHost (pinned) at init, bump allocation after,
 * 256-byte aligned; alloc returns NULL (no log) when full. */
typedef struct {
    uint8_t *base;
    size_t cap, used, high;
    int pinned; /* 1: host pinned memory */
} st_gpu_arena_t;
st_status_t st_gpu_arena_init(st_gpu_arena_t *a, size_t cap, int pinned);
void st_gpu_arena_cleanup(st_gpu_arena_t *a);
void *st_gpu_arena_alloc(st_gpu_arena_t *a, size_t bytes);
static inline void st_gpu_arena_reset(st_gpu_arena_t *a) { a->used = 0; }

/* Timing with CUDA events on a stream (benchmarks). */
typedef struct {
    void *start, *stop; /* cudaEvent_t */
} st_gpu_timer_t;
st_status_t st_gpu_timer_init(st_gpu_timer_t *t);
void st_gpu_timer_cleanup(st_gpu_timer_t *t);
st_status_t st_gpu_timer_start(st_gpu_timer_t *t, const st_gpu_stream_t *s);
/* records the stop event, waits for it, returns milliseconds since start in *ms */
st_status_t st_gpu_timer_stop(st_gpu_timer_t *t, const st_gpu_stream_t *s, double *ms);

/* Ceilings measured in the same run as a benchmark: device-to-device copy bandwidth of `bytes`
 * (GB/s counting bytes read + written, best of iters) and cuBLAS bf16 GEMM n×n×n with fp32
 * accumulation (TFLOP/s, mean of iters after warm-up, random data). Allocate and free their own
 * buffers (start-up / benchmark use only). */
st_status_t st_gpu_ceiling_copy(const st_gpu_stream_t *s, size_t bytes, int iters, double *gbs);
st_status_t st_gpu_ceiling_gemm(const st_gpu_stream_t *s, int n, int iters, double *tflops);

#ifdef __cplusplus
}
#endif
#endif
