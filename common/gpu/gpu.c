/* Strata GPU runtime (see strata/gpu.h): thin wrappers over the CUDA runtime and cuBLAS that turn
 * their errors into st_status_t with the library's own text. No kernels here. */
#include "strata/gpu.h"

#include <cublas_v2.h>
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

st_status_t st_gpu_cuda_status(int cuda_err, const char *what, const char *file, int line) {
    if (cuda_err == 0) return ST_OK;
    return st_fail(ST_ERR_DEVICE, file, line, "%s: CUDA error %d (%s): %s", what, cuda_err,
                   cudaGetErrorName((cudaError_t)cuda_err), cudaGetErrorString((cudaError_t)cuda_err));
}

st_status_t st_gpu_cublas_status(int cublas_err, const char *what, const char *file, int line) {
    if (cublas_err == 0) return ST_OK;
    return st_fail(ST_ERR_DEVICE, file, line, "%s: cuBLAS error %d (%s): %s", what, cublas_err,
                   cublasGetStatusName((cublasStatus_t)cublas_err),
                   cublasGetStatusString((cublasStatus_t)cublas_err));
}

st_status_t st_gpu_last_launch(const char *what, const char *file, int line) {
    return st_gpu_cuda_status((int)cudaGetLastError(), what, file, line);
}

int st_gpu_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

st_status_t st_gpu_init(int dev) { return ST_CUDA_CHECK(cudaSetDevice(dev)); }

void st_gpu_load_eagerly(void) { setenv("CUDA_MODULE_LOADING", "EAGER", 0); }

bool st_gpu_loads_eagerly(void) {
    /* cuModuleGetLoadingMode (driver API, CUDA 11.7+), reached through the runtime */
    typedef int (*mode_fn)(int *);
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult q;
    int mode = 0;
    if (cudaGetDriverEntryPointByVersion("cuModuleGetLoadingMode", &fn, 11070, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess || !fn || ((mode_fn)fn)(&mode) != 0) {
        (void)cudaGetLastError();
        return false;
    }
    return mode == 1; /* CU_MODULE_EAGER_LOADING */
}

void st_gpu_describe(char *buf, size_t n) {
    int dev = 0;
    struct cudaDeviceProp p;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&p, dev) != cudaSuccess) {
        snprintf(buf, n, "no CUDA device");
        return;
    }
    snprintf(buf, n, "%s, sm_%d%d, %d SMs, %.1f GiB, L2 %d MiB", p.name, p.major, p.minor,
             p.multiProcessorCount, (double)p.totalGlobalMem / (1024.0 * 1024 * 1024), p.l2CacheSize >> 20);
}

st_status_t st_gpu_capture_begin(const st_gpu_stream_t *s) {
    return ST_CUDA_CHECK(cudaStreamBeginCapture((cudaStream_t)s->stream, cudaStreamCaptureModeRelaxed));
}
st_status_t st_gpu_capture_end(const st_gpu_stream_t *s, void **exec) {
    cudaGraph_t graph = NULL;
    *exec = NULL;
    st_status_t rc = ST_CUDA_CHECK(cudaStreamEndCapture((cudaStream_t)s->stream, &graph));
    if (rc == ST_OK) rc = ST_CUDA_CHECK(cudaGraphInstantiate((cudaGraphExec_t *)exec, graph, 0));
    if (graph) cudaGraphDestroy(graph);
    return rc;
}
st_status_t st_gpu_graph_launch(void *exec, const st_gpu_stream_t *s) {
    return ST_CUDA_CHECK(cudaGraphLaunch((cudaGraphExec_t)exec, (cudaStream_t)s->stream));
}
void st_gpu_graph_destroy(void *exec) {
    if (exec) cudaGraphExecDestroy((cudaGraphExec_t)exec);
}

void st_gpu_profiler(bool on) {
    if ((on ? cudaProfilerStart() : cudaProfilerStop()) != cudaSuccess) (void)cudaGetLastError();
}

st_status_t st_gpu_stream_create(st_gpu_stream_t *s) {
    memset(s, 0, sizeof *s);
    cudaStream_t st;
    cublasHandle_t h;
    st_status_t rc = ST_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    if (rc) return rc;
    rc = ST_CUBLAS_CHECK(cublasCreate(&h));
    if (rc) goto err_stream;
    rc = ST_CUBLAS_CHECK(cublasSetStream(h, st));
    if (rc) goto err_handle;
    s->cublas_ws_bytes = (size_t)64 << 20; /* NOTE: cuBLAS on Hopper asks for up to 32 MiB */
    rc = ST_CUDA_CHECK(cudaMalloc(&s->cublas_ws, s->cublas_ws_bytes));
    if (rc) goto err_handle;
    rc = ST_CUBLAS_CHECK(cublasSetWorkspace(h, s->cublas_ws, s->cublas_ws_bytes));
    if (rc) goto err_ws;
    s->stream = st;
    s->cublas = h;
    return ST_OK;
err_ws:
    cudaFree(s->cublas_ws);
err_handle:
    cublasDestroy(h);
err_stream:
    cudaStreamDestroy(st);
    memset(s, 0, sizeof *s);
    return rc;
}

void st_gpu_stream_destroy(st_gpu_stream_t *s) {
    if (s->cublas) cublasDestroy((cublasHandle_t)s->cublas);
    if (s->cublas_ws) cudaFree(s->cublas_ws);
    if (s->stream) cudaStreamDestroy((cudaStream_t)s->stream);
    memset(s, 0, sizeof *s);
}

st_status_t st_gpu_stream_sync(const st_gpu_stream_t *s) {
    return ST_CUDA_CHECK(cudaStreamSynchronize((cudaStream_t)s->stream));
}

st_status_t st_gpu_stream_wait(const st_gpu_stream_t *s, void *ev) {
    return ST_CUDA_CHECK(cudaStreamWaitEvent((cudaStream_t)s->stream, (cudaEvent_t)ev, 0));
}

st_status_t st_gpu_event_create(void **ev) {
    cudaEvent_t e;
    st_status_t rc = ST_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    if (rc == ST_OK) *ev = e;
    return rc;
}
st_status_t st_gpu_events_create(void **ev, int n) {
    for (int i = 0; i < n; i++) {
        cudaEvent_t e;
        st_status_t rc = ST_CUDA_CHECK(cudaEventCreate(&e));
        if (rc != ST_OK) {
            st_gpu_events_destroy(ev, i);
            return rc;
        }
        ev[i] = e;
    }
    return ST_OK;
}
void st_gpu_events_destroy(void **ev, int n) {
    for (int i = 0; i < n; i++) {
        if (ev[i]) cudaEventDestroy((cudaEvent_t)ev[i]);
        ev[i] = NULL;
    }
}
st_status_t st_gpu_event_record(void *ev, const st_gpu_stream_t *s) {
    return ST_CUDA_CHECK(cudaEventRecord((cudaEvent_t)ev, (cudaStream_t)s->stream));
}
st_status_t st_gpu_event_sync(void *ev) { return ST_CUDA_CHECK(cudaEventSynchronize((cudaEvent_t)ev)); }
bool st_gpu_event_done(void *ev) {
    cudaError_t e = cudaEventQuery((cudaEvent_t)ev);
    if (e == cudaErrorNotReady) return false;
    if (e != cudaSuccess) (void)cudaGetLastError(); /* reported by the sync that follows */
    return true;
}
double st_gpu_event_elapsed_ms(void *a, void *b) {
    float ms = -1.f;
    if (cudaEventElapsedTime(&ms, (cudaEvent_t)a, (cudaEvent_t)b) == cudaSuccess) return (double)ms;
    (void)cudaGetLastError();
    return -1.0;
}

st_status_t st_gpu_host_alloc(void **p, size_t bytes) {
    void *q = NULL;
    st_status_t rc = ST_CUDA_CHECK(cudaHostAlloc(&q, bytes ? bytes : 1, cudaHostAllocMapped));
    if (rc == ST_OK) *p = q;
    return rc;
}
void st_gpu_host_free(void *p) {
    if (p) cudaFreeHost(p);
}

st_status_t st_gpu_ipc_export(void *ptr, uint8_t handle[ST_GPU_IPC_HANDLE_BYTES]) {
    _Static_assert(sizeof(cudaIpcMemHandle_t) == ST_GPU_IPC_HANDLE_BYTES, "IPC handle size");
    cudaIpcMemHandle_t h;
    st_status_t rc = ST_CUDA_CHECK(cudaIpcGetMemHandle(&h, ptr));
    if (rc == ST_OK) memcpy(handle, &h, sizeof h);
    return rc;
}
st_status_t st_gpu_ipc_open(const uint8_t handle[ST_GPU_IPC_HANDLE_BYTES], void **ptr) {
    cudaIpcMemHandle_t h;
    void *p = NULL;
    memcpy(&h, handle, sizeof h);
    st_status_t rc = ST_CUDA_CHECK(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess));
    if (rc == ST_OK) *ptr = p;
    return rc;
}
void st_gpu_ipc_close(void *ptr) {
    if (ptr && cudaIpcCloseMemHandle(ptr) != cudaSuccess) (void)cudaGetLastError();
}
st_status_t st_gpu_host_register(void *p, size_t bytes, void **dev) {
    void *d = NULL;
    st_status_t rc = ST_CUDA_CHECK(cudaHostRegister(p, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable));
    if (rc) return rc;
    rc = ST_CUDA_CHECK(cudaHostGetDevicePointer(&d, p, 0));
    if (rc) {
        cudaHostUnregister(p);
        return rc;
    }
    *dev = d;
    return ST_OK;
}
void st_gpu_host_unregister(void *p) {
    if (p && cudaHostUnregister(p) != cudaSuccess) (void)cudaGetLastError();
}
bool st_gpu_host_pinned(const void *p) {
    struct cudaPointerAttributes a;
    if (!p || cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return a.type == cudaMemoryTypeHost;
}
void *st_gpu_host_dev(const void *p) {
    struct cudaPointerAttributes a;
    if (!p || cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return a.type == cudaMemoryTypeHost ? a.devicePointer : NULL;
}

st_status_t st_gpu_memcpy_async(const st_gpu_stream_t *s, void *dst, const void *src, size_t bytes,
                                st_gpu_copy_t kind) {
    static const enum cudaMemcpyKind k[3] = {cudaMemcpyDeviceToDevice, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost};
    if ((unsigned)kind > ST_GPU_COPY_D2H) return ST_FAIL(ST_ERR_INVALID_ARG, "memcpy_async: copy kind %d", (int)kind);
    if (!bytes) return ST_OK;
    return ST_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, k[kind], (cudaStream_t)s->stream));
}
st_status_t st_gpu_memset_async(const st_gpu_stream_t *s, void *dst, int byte, size_t bytes) {
    if (!bytes) return ST_OK;
    return ST_CUDA_CHECK(cudaMemsetAsync(dst, byte, bytes, (cudaStream_t)s->stream));
}

st_status_t st_gpu_malloc(void **p, size_t bytes) { return ST_CUDA_CHECK(cudaMalloc(p, bytes ? bytes : 1)); }
void st_gpu_free(void *p) {
    if (p) cudaFree(p);
}
/* NOTE: cudaMemcpy from pageable memory returns once the data is staged, and cudaMemset returns at once;
 * both run on the legacy stream, which our non-blocking streams do not wait for. So both finish here
 * before returning: a kernel queued next on any stream sees the bytes (a test's poisoned output buffer
 * was once overwritten by its memset after the kernel had written it). */
st_status_t st_gpu_memcpy_h2d(void *dst, const void *src, size_t bytes) {
    st_status_t s = ST_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
    return s ? s : ST_CUDA_CHECK(cudaStreamSynchronize(0));
}
st_status_t st_gpu_memcpy_d2h(void *dst, const void *src, size_t bytes) {
    return ST_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}
st_status_t st_gpu_memset(void *dst, int byte, size_t bytes) {
    st_status_t s = ST_CUDA_CHECK(cudaMemset(dst, byte, bytes));
    return s ? s : ST_CUDA_CHECK(cudaStreamSynchronize(0));
}

st_status_t st_gpu_arena_init(st_gpu_arena_t *a, size_t cap, int pinned) {
    memset(a, 0, sizeof *a);
    void *p = NULL;
    st_status_t rc = pinned ? ST_CUDA_CHECK(cudaMallocHost(&p, cap)) : ST_CUDA_CHECK(cudaMalloc(&p, cap));
    if (rc) return rc;
    a->base = (uint8_t *)p;
    a->cap = cap;
    a->pinned = pinned;
    return ST_OK;
}

void st_gpu_arena_cleanup(st_gpu_arena_t *a) {
    if (a->base) {
        if (a->pinned) cudaFreeHost(a->base);
        else cudaFree(a->base);
    }
    memset(a, 0, sizeof *a);
}

void *st_gpu_arena_alloc(st_gpu_arena_t *a, size_t bytes) {
    size_t off = (a->used + 255) & ~(size_t)255;
    if (off + bytes > a->cap) return NULL;
    a->used = off + bytes;
    if (a->used > a->high) a->high = a->used;
    return a->base + off;
}

st_status_t st_gpu_timer_init(st_gpu_timer_t *t) {
    cudaEvent_t a, b;
    st_status_t rc = ST_CUDA_CHECK(cudaEventCreate(&a));
    if (rc) return rc;
    rc = ST_CUDA_CHECK(cudaEventCreate(&b));
    if (rc) {
        cudaEventDestroy(a);
        return rc;
    }
    t->start = a;
    t->stop = b;
    return ST_OK;
}
void st_gpu_timer_cleanup(st_gpu_timer_t *t) {
    if (t->start) cudaEventDestroy((cudaEvent_t)t->start);
    if (t->stop) cudaEventDestroy((cudaEvent_t)t->stop);
    t->start = t->stop = NULL;
}
st_status_t st_gpu_timer_start(st_gpu_timer_t *t, const st_gpu_stream_t *s) {
    return ST_CUDA_CHECK(cudaEventRecord((cudaEvent_t)t->start, (cudaStream_t)s->stream));
}
st_status_t st_gpu_timer_stop(st_gpu_timer_t *t, const st_gpu_stream_t *s, double *ms) {
    float f = 0;
    st_status_t rc = ST_CUDA_CHECK(cudaEventRecord((cudaEvent_t)t->stop, (cudaStream_t)s->stream));
    if (!rc) rc = ST_CUDA_CHECK(cudaEventSynchronize((cudaEvent_t)t->stop));
    if (!rc) rc = ST_CUDA_CHECK(cudaEventElapsedTime(&f, (cudaEvent_t)t->start, (cudaEvent_t)t->stop));
    if (!rc) *ms = f;
    return rc;
}

st_status_t st_gpu_ceiling_copy(const st_gpu_stream_t *s, size_t bytes, int iters, double *gbs) {
    void *a = NULL, *b = NULL;
    st_gpu_timer_t t = {0};
    double best = 0, ms = 0;
    st_status_t rc = st_gpu_malloc(&a, bytes);
    if (!rc) rc = st_gpu_malloc(&b, bytes);
    if (!rc) rc = ST_CUDA_CHECK(cudaMemset(a, 1, bytes));
    if (!rc) rc = st_gpu_timer_init(&t);
    for (int i = 0; !rc && i < iters + 2; i++) {
        rc = st_gpu_timer_start(&t, s);
        if (!rc) rc = ST_CUDA_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, (cudaStream_t)s->stream));
        if (!rc) rc = st_gpu_timer_stop(&t, s, &ms);
        if (!rc && i >= 2 && 2.0 * (double)bytes / (ms * 1e6) > best) best = 2.0 * (double)bytes / (ms * 1e6);
    }
    st_gpu_timer_cleanup(&t);
    st_gpu_free(a);
    st_gpu_free(b);
    if (!rc) *gbs = best;
    return rc;
}

#include <cuda_bf16.h>
st_status_t st_gpu_ceiling_gemm(const st_gpu_stream_t *s, int n, int iters, double *tflops) {
    size_t el = (size_t)n * n;
    void *A = NULL, *B = NULL, *C = NULL;
    uint16_t *h = (uint16_t *)malloc(el * 2);
    st_gpu_timer_t t = {0};
    double ms = 0;
    const float one = 1.f, zero = 0.f;
    st_status_t rc = h ? ST_OK : ST_FAIL(ST_ERR_NO_MEMORY, "ceiling_gemm host buffer");
    if (!rc) rc = st_gpu_malloc(&A, el * 2);
    if (!rc) rc = st_gpu_malloc(&B, el * 2);
    if (!rc) rc = st_gpu_malloc(&C, el * 2);
    if (!rc) {
        st_rng_t r = {12345};
        for (size_t i = 0; i < el; i++) h[i] = st_f32_to_bf16((float)st_rng_uniform(&r) * 2.f - 1.f);
        rc = st_gpu_memcpy_h2d(A, h, el * 2);
        if (!rc) rc = st_gpu_memcpy_h2d(B, h, el * 2);
    }
    if (!rc) rc = st_gpu_timer_init(&t);
    for (int i = 0; !rc && i < 3; i++)
        rc = ST_CUBLAS_CHECK(cublasGemmEx((cublasHandle_t)s->cublas, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &one, A,
                                          CUDA_R_16BF, n, B, CUDA_R_16BF, n, &zero, C, CUDA_R_16BF, n,
                                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    if (!rc) rc = st_gpu_timer_start(&t, s);
    for (int i = 0; !rc && i < iters; i++)
        rc = ST_CUBLAS_CHECK(cublasGemmEx((cublasHandle_t)s->cublas, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &one, A,
                                          CUDA_R_16BF, n, B, CUDA_R_16BF, n, &zero, C, CUDA_R_16BF, n,
                                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    if (!rc) rc = st_gpu_timer_stop(&t, s, &ms);
    if (!rc) *tflops = 2.0 * n * (double)n * n * iters / (ms * 1e9);
    st_gpu_timer_cleanup(&t);
    st_gpu_free(A), st_gpu_free(B), st_gpu_free(C);
    free(h);
    return rc;
}
