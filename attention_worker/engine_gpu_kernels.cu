/* CUDA plumbing of the GPU engine (declared in engine_gpu.h): async copies and sets, timing and
 * ordering events, mapped pinned host memory and the profiling stream gate. No compute: every kernel
 * the engine launches lives in kernels/ (strata/kernels_cuda.h). */
#include <cuda_runtime.h>

#include "engine_gpu.h"

#include "cuda_common.cuh" /* kernels/: ST_STREAM, ST_LAUNCH_OK */

extern "C" st_status_t eg_memcpy_async(const st_gpu_stream_t *s, void *dst, const void *src, size_t bytes, int kind) {
    if (!bytes) return ST_OK;
    cudaMemcpyKind k = kind == 1 ? cudaMemcpyHostToDevice : kind == 2 ? cudaMemcpyDeviceToHost : cudaMemcpyDeviceToDevice;
    return ST_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, k, ST_STREAM(s)));
}
extern "C" st_status_t eg_memset_async(const st_gpu_stream_t *s, void *dst, int byte, size_t bytes) {
    if (!bytes) return ST_OK;
    return ST_CUDA_CHECK(cudaMemsetAsync(dst, byte, bytes, ST_STREAM(s)));
}

/* ------------------------------------------------------------------ profiling (STRATA_EGPU_PROF) */
extern "C" st_status_t eg_events_create(void **ev, int n) {
    for (int i = 0; i < n; i++) {
        st_status_t rc = ST_CUDA_CHECK(cudaEventCreate((cudaEvent_t *)&ev[i]));
        if (rc != ST_OK) {
            eg_events_destroy(ev, i);
            return rc;
        }
    }
    return ST_OK;
}
extern "C" void eg_events_destroy(void **ev, int n) {
    for (int i = 0; i < n; i++)
        if (ev[i]) cudaEventDestroy((cudaEvent_t)ev[i]), ev[i] = NULL;
}
extern "C" st_status_t eg_event_record(void *ev, const st_gpu_stream_t *s) {
    return ST_CUDA_CHECK(cudaEventRecord((cudaEvent_t)ev, ST_STREAM(s)));
}
extern "C" st_status_t eg_event_create_sync(void **ev) {
    return ST_CUDA_CHECK(cudaEventCreateWithFlags((cudaEvent_t *)ev, cudaEventDisableTiming));
}
extern "C" st_status_t eg_stream_wait(const st_gpu_stream_t *s, void *ev) {
    return ST_CUDA_CHECK(cudaStreamWaitEvent(ST_STREAM(s), (cudaEvent_t)ev, 0));
}
extern "C" st_status_t eg_event_sync(void *ev) { return ST_CUDA_CHECK(cudaEventSynchronize((cudaEvent_t)ev)); }
extern "C" bool eg_event_done(void *ev) {
    cudaError_t e = cudaEventQuery((cudaEvent_t)ev);
    if (e == cudaErrorNotReady) return false;
    if (e != cudaSuccess) cudaGetLastError(); /* reported by the sync that follows */
    return true;
}
extern "C" double eg_event_ms(void *a, void *b) {
    float ms = -1.f;
    return cudaEventElapsedTime(&ms, (cudaEvent_t)a, (cudaEvent_t)b) == cudaSuccess ? (double)ms : -1.0;
}
extern "C" st_status_t eg_host_alloc(void **p, size_t bytes) {
    return ST_CUDA_CHECK(cudaHostAlloc(p, bytes, cudaHostAllocMapped));
}
extern "C" void eg_host_free(void *p) {
    if (p) cudaFreeHost(p);
}
__device__ __forceinline__ long long eg_globaltimer() {
    long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__global__ void gate_kernel(volatile int *gate, long long timeout_ns) {
    long long t0 = eg_globaltimer();
    while (gate[0] == 0) {
        if (eg_globaltimer() - t0 > timeout_ns) {
            gate[1] = gate[1] + 1;
            break;
        }
        __nanosleep(2000);
    }
}
extern "C" st_status_t eg_gate(const st_gpu_stream_t *s, int *gate, long long timeout_ns) {
    int *dg = NULL;
    st_status_t rc = ST_CUDA_CHECK(cudaHostGetDevicePointer((void **)&dg, gate, 0));
    if (rc != ST_OK) return rc;
    gate_kernel<<<1, 1, 0, ST_STREAM(s)>>>(dg, timeout_ns);
    return ST_LAUNCH_OK("gate_kernel");
}

