/* Flags of the transfer layer on the GPU: one-thread signal and wait kernels (capturable in a CUDA
 * graph) over device, CUDA-IPC or mapped pinned host memory, with a %globaltimer deadline as the
 * watchdog that lets a stream or graph drain. C twins: kernels/flag.c (st_flag_signal, st_flag_wait). */
#include "cuda_common.cuh"

/* NOTE: system scope throughout: the peer is another process (another GPU, or the CPU through mapped
 * host memory), so device-scope ordering would not do. */
__device__ __forceinline__ uint32_t flag_ld_acquire(const uint32_t *p) {
    uint32_t v;
    asm volatile("ld.acquire.sys.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void flag_st_release(uint32_t *p, uint32_t v) {
    asm volatile("st.release.sys.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint64_t flag_clock_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__global__ void flag_signal_kernel(uint32_t *flag, uint32_t seq, const uint32_t *epoch) {
    uint32_t target = seq + (epoch ? flag_ld_acquire(epoch) : 0u);
    /* the copy or kernel queued before this one has completed (stream order); the fence makes this
     * thread's view of it, and the store below, visible system-wide in that order */
    __threadfence_system();
    flag_st_release(flag, target);
}

__global__ void flag_wait_kernel(const uint32_t *flag, uint32_t seq, const uint32_t *epoch, uint64_t timeout_ns,
                                 uint32_t *err) {
    uint32_t target = seq + (epoch ? flag_ld_acquire(epoch) : 0u);
    uint64_t t0 = flag_clock_ns();
    for (;;) {
        if ((int32_t)(flag_ld_acquire(flag) - target) >= 0) return;
        if (err && flag_ld_acquire(err)) return;
        if (flag_clock_ns() - t0 >= timeout_ns) {
            if (err) flag_st_release(err, ST_FLAG_ERR_TIMEOUT);
            return;
        }
        __nanosleep(100); /* leave the memory system to the peer's writes */
    }
}

extern "C" st_status_t st_cuda_flag_signal(const st_gpu_stream_t *s, uint32_t *flag, uint32_t seq,
                                           const uint32_t *epoch) {
    if (!flag || ((uintptr_t)flag & 3)) return ST_FAIL(ST_ERR_INVALID_ARG, "flag_signal: flag %p", (void *)flag);
    flag_signal_kernel<<<1, 1, 0, ST_STREAM(s)>>>(flag, seq, epoch);
    return ST_LAUNCH_OK("flag_signal_kernel");
}

extern "C" st_status_t st_cuda_flag_wait(const st_gpu_stream_t *s, const uint32_t *flag, uint32_t seq,
                                         const uint32_t *epoch, uint64_t timeout_ns, uint32_t *err) {
    if (!flag || ((uintptr_t)flag & 3) || timeout_ns == 0)
        return ST_FAIL(ST_ERR_INVALID_ARG, "flag_wait: flag %p, timeout %llu ns", (const void *)flag,
                       (unsigned long long)timeout_ns);
    flag_wait_kernel<<<1, 1, 0, ST_STREAM(s)>>>(flag, seq, epoch, timeout_ns, err);
    return ST_LAUNCH_OK("flag_wait_kernel");
}
