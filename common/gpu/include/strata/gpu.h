/* Strata GPU runtime: device selection, streams (each with its cuBLAS handle and workspace), events,
 * pinned host memory, synchronous and stream-ordered copies, CUDA graphs, device and pinned arenas,
 * and CUDA/cuBLAS error -> st_status_t (with the library's own text). The one home of CUDA runtime
 * plumbing: the engine and the expert server call these and define none of their own. Built only
 * with CUDA (the CPU build needs none of it); this header itself is plain C and CUDA-free. */
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
/* Kernels load when the process's CUDA context is made (CUDA_MODULE_LOADING=EAGER), unless the
 * process was started with its own choice. Effective only before the process's first CUDA call. */
void st_gpu_load_eagerly(void);
/* Whether this process's context loads kernels eagerly. With lazy loading a kernel's first launch
 * (ours or a library's, e.g. a cuBLAS GEMM of a new shape) waits for all device work the process
 * queued, on every stream (kernels/dev/sync_probe.cu): device work that waits for the host would
 * hold that launch until it is released. */
bool st_gpu_loads_eagerly(void);
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
/* s waits (on the device) for ev's last record; nothing if ev was never recorded. */
st_status_t st_gpu_stream_wait(const st_gpu_stream_t *s, void *ev);

/* Events (cudaEvent_t as void*). st_gpu_event_create: one ordering event (no timing: cheaper to
 * record and to wait for); st_gpu_events_create: n timing events (st_gpu_event_elapsed_ms), all
 * or none (on error none is left and ev is untouched past what was made). st_gpu_events_destroy
 * destroys ev[0..n) and sets them NULL (NULL entries are fine): it also destroys ordering events
 * (n = 1). */
st_status_t st_gpu_event_create(void **ev);
st_status_t st_gpu_events_create(void **ev, int n);
void st_gpu_events_destroy(void **ev, int n);
st_status_t st_gpu_event_record(void *ev, const st_gpu_stream_t *s);
/* the host waits for ev's last record */
st_status_t st_gpu_event_sync(void *ev);
/* true once ev's last record completed (or on an error, which the next sync reports) */
bool st_gpu_event_done(void *ev);
/* milliseconds from timing event a to b (both recorded and completed), or -1 */
double st_gpu_event_elapsed_ms(void *a, void *b);

/* Pinned host memory, mapped into the device's address space (a kernel may read or poll it; copies
 * from and to it are DMA and truly asynchronous). Start-up only. free(NULL) is fine. */
st_status_t st_gpu_host_alloc(void **p, size_t bytes);
void st_gpu_host_free(void *p);

/* CUDA IPC and host registration (common/xfer's regions; start-up only). st_gpu_ipc_export: the
 * handle of a cudaMalloc'd allocation (ptr: its start) that another process opens with
 * st_gpu_ipc_open (mapped on its current device, peer access enabled where needed; not in the
 * exporting process itself) and unmaps with st_gpu_ipc_close. st_gpu_host_register: page-locks host
 * memory p[0..bytes) (page-aligned, e.g. a shared mapping), maps it into every device's address space
 * and gives the device address in *dev; st_gpu_host_unregister undoes it (NULL is fine). */
#define ST_GPU_IPC_HANDLE_BYTES 64
st_status_t st_gpu_ipc_export(void *ptr, uint8_t handle[ST_GPU_IPC_HANDLE_BYTES]);
st_status_t st_gpu_ipc_open(const uint8_t handle[ST_GPU_IPC_HANDLE_BYTES], void **ptr);
void st_gpu_ipc_close(void *ptr);
st_status_t st_gpu_host_register(void *p, size_t bytes, void **dev);
void st_gpu_host_unregister(void *p);
/* Whether p is page-locked host memory the driver knows (st_gpu_host_alloc, a pinned arena,
 * st_gpu_host_register): copies from and to it can be captured in a graph. */
bool st_gpu_host_pinned(const void *p);
/* The device's address of page-locked host memory p that is mapped into it (allocated or registered
 * mapped, as above), for a kernel to read or write it where it lies; NULL when there is none. */
void *st_gpu_host_dev(const void *p);

/* Stream-ordered copies and memset (queued on s, no host wait; 0 bytes: nothing queued). A copy
 * from or to pageable host memory is staged by the driver and may return only once the host side
 * is consumed; pinned memory (st_gpu_host_alloc, a pinned arena) makes it asynchronous. The values
 * of st_gpu_copy_t are fixed (0, 1, 2). */
typedef enum {
    ST_GPU_COPY_D2D = 0, /* device -> device */
    ST_GPU_COPY_H2D = 1, /* host -> device */
    ST_GPU_COPY_D2H = 2  /* device -> host */
} st_gpu_copy_t;
st_status_t st_gpu_memcpy_async(const st_gpu_stream_t *s, void *dst, const void *src, size_t bytes,
                                st_gpu_copy_t kind);
st_status_t st_gpu_memset_async(const st_gpu_stream_t *s, void *dst, int byte, size_t bytes);

/* CUDA graphs: capture what is queued on s (relaxed mode) between begin and end into an executable
 * graph (*exec; instantiated, NULL on error), launch (replay) it on a stream, destroy it (NULL is
 * fine). */
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
