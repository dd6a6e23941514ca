/* Which CUDA runtime calls wait for device work they do not depend on: while a kernel spins on a
 * pinned host flag (an early-launched walk waiting for its release, st_cuda_flag_wait), one call at a
 * time is timed, made either by the same process (on another stream: "same") or by a second process
 * on the same GPU ("cross": an expert server beside an attention worker, with or without MPS). A call
 * that takes about as long as the flag stays unset waited for the spin. A process with such a wait
 * pending must not make those calls on any thread: the wait is released only by the host, so they
 * block until the wait's watchdog fires.
 *
 *   nvcc -O2 -arch=sm_90a kernels/dev/sync_probe.cu -o sync_probe     (or: cmake -DSTRATA_KERNELS_DEV=ON)
 *   ./sync_probe [same|cross] [hold_ms]     default: both, 300 ms
 *
 * Prints one line per (mode, call): its time, and "WAITS" when it took more than half of hold_ms. */
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CK(x)                                                                                     \
    do {                                                                                          \
        cudaError_t e_ = (x);                                                                     \
        if (e_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));   \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* spins until *flag != 0 or 10 s passed (globaltimer), like st_cuda_flag_wait */
__global__ void spin(volatile unsigned *flag, volatile unsigned *started) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    *started = 1;
    __threadfence_system();
    do asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    while (*flag == 0 && t - t0 < 10000000000ull);
}

__global__ void touch(float *p) { p[threadIdx.x] += 1.f; }
__global__ void fresh_kernel(float *p) { p[threadIdx.x] *= 2.f; }

/* ---- the calls probed (state in globals: each runs in the process that set it up) ---- */
static cudaStream_t A, B;
static float *d, *d2, *big, *ph;
static void *reg;
static size_t reg_bytes = 8u << 20;
static cudaGraph_t graph;
static cudaGraphExec_t gexec;
static cudaEvent_t ev;
static float *pin;

static void setup(void) {
    CK(cudaSetDevice(0));
    CK(cudaStreamCreateWithFlags(&A, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&B, cudaStreamNonBlocking));
    CK(cudaMalloc(&d, 4096));
    CK(cudaMalloc(&d2, 4096));
    CK(cudaHostAlloc((void **)&pin, 4096, cudaHostAllocDefault));
    reg = aligned_alloc(4096, reg_bytes);
    memset(reg, 0, reg_bytes);
}

static void op_kernel(void) { touch<<<1, 32, 0, B>>>(d); CK(cudaStreamSynchronize(B)); }
static void op_copy_async(void) { CK(cudaMemcpyAsync(d, pin, 64, cudaMemcpyHostToDevice, B)); CK(cudaStreamSynchronize(B)); }
static void op_copy_sync(void) { float x[16] = {0}; CK(cudaMemcpy(d, x, sizeof x, cudaMemcpyHostToDevice)); }
static void op_memset(void) { CK(cudaMemset(d, 0, 4096)); }
static void op_memset_async(void) { CK(cudaMemsetAsync(d, 0, 4096, B)); CK(cudaStreamSynchronize(B)); }
static void op_malloc_small(void) { CK(cudaMalloc(&big, 1u << 20)); }
static void op_free_small(void) { CK(cudaFree(big)); }
static void op_malloc_big(void) { CK(cudaMalloc(&big, 1u << 30)); }
static void op_free_big(void) { CK(cudaFree(big)); }
static void op_malloc_async(void) { CK(cudaMallocAsync((void **)&big, 1u << 20, B)); CK(cudaStreamSynchronize(B)); }
static void op_free_async(void) { CK(cudaFreeAsync(big, B)); CK(cudaStreamSynchronize(B)); }
static void op_malloc_host(void) { CK(cudaMallocHost(&ph, 1u << 20)); }
static void op_free_host(void) { CK(cudaFreeHost(ph)); }
static void op_register(void) { CK(cudaHostRegister(reg, reg_bytes, cudaHostRegisterMapped | cudaHostRegisterPortable)); }
static void op_unregister(void) { CK(cudaHostUnregister(reg)); }
static void op_event_create(void) { CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming)); }
static void op_event_destroy(void) { CK(cudaEventDestroy(ev)); }
static void op_capture(void) {
    CK(cudaStreamBeginCapture(B, cudaStreamCaptureModeRelaxed));
    touch<<<1, 32, 0, B>>>(d2);
    CK(cudaStreamEndCapture(B, &graph));
}
static void op_instantiate(void) { CK(cudaGraphInstantiate(&gexec, graph, 0)); }
static void op_graph_launch(void) { CK(cudaGraphLaunch(gexec, B)); CK(cudaStreamSynchronize(B)); }
static void op_exec_destroy(void) { CK(cudaGraphExecDestroy(gexec)); }
static void op_graph_destroy(void) { CK(cudaGraphDestroy(graph)); }
static void op_fresh_kernel(void) { fresh_kernel<<<1, 32, 0, B>>>(d2); CK(cudaStreamSynchronize(B)); }
static void op_func_attr(void) { CK(cudaFuncSetAttribute(touch, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 << 10)); }
static void op_stream_create(void) {
    cudaStream_t C;
    CK(cudaStreamCreateWithFlags(&C, cudaStreamNonBlocking));
    CK(cudaStreamDestroy(C));
}
static void op_device_sync(void) { CK(cudaDeviceSynchronize()); }

static const struct {
    const char *name;
    void (*fn)(void);
} OPS[] = {
    {"kernel on B + sync B", op_kernel},
    {"cudaMemcpyAsync H2D pinned on B + sync B", op_copy_async},
    {"cudaMemcpy H2D pageable (legacy stream)", op_copy_sync},
    {"cudaMemset (synchronous)", op_memset},
    {"cudaMemsetAsync on B + sync B", op_memset_async},
    {"cudaMalloc 1 MiB", op_malloc_small},
    {"cudaFree 1 MiB", op_free_small},
    {"cudaMalloc 1 GiB", op_malloc_big},
    {"cudaFree 1 GiB", op_free_big},
    {"cudaMallocAsync 1 MiB on B + sync B", op_malloc_async},
    {"cudaFreeAsync on B + sync B", op_free_async},
    {"cudaMallocHost 1 MiB", op_malloc_host},
    {"cudaFreeHost", op_free_host},
    {"cudaHostRegister 8 MiB mapped", op_register},
    {"cudaHostUnregister", op_unregister},
    {"cudaEventCreate", op_event_create},
    {"cudaEventDestroy", op_event_destroy},
    {"capture on B (relaxed): begin, kernel, end", op_capture},
    {"cudaGraphInstantiate", op_instantiate},
    {"cudaGraphLaunch on B + sync B", op_graph_launch},
    {"cudaGraphExecDestroy", op_exec_destroy},
    {"cudaGraphDestroy", op_graph_destroy},
    {"first launch of a new kernel + sync B", op_fresh_kernel},
    {"cudaFuncSetAttribute (dynamic smem)", op_func_attr},
    {"cudaStreamCreate + Destroy", op_stream_create},
    {"cudaDeviceSynchronize (for scale)", op_device_sync},
};
#define N_OPS (int)(sizeof OPS / sizeof OPS[0])

/* ---- the spin ---- */
static unsigned *flag_h, *started_h;
static int hold_ms = 300;

static void *setter(void *arg) {
    (void)arg;
    usleep((useconds_t)hold_ms * 1000);
    __atomic_store_n(flag_h, 1u, __ATOMIC_RELEASE);
    return NULL;
}

/* start the spin on A, wait until it runs; the setter thread releases it hold_ms later */
static pthread_t hold(void) {
    *flag_h = 0, *started_h = 0;
    spin<<<1, 1, 0, A>>>(flag_h, started_h);
    CK(cudaGetLastError());
    while (!__atomic_load_n(started_h, __ATOMIC_ACQUIRE)) {}
    pthread_t th;
    pthread_create(&th, NULL, setter, NULL);
    return th;
}

static void report(const char *mode, int i, double ms) {
    printf("%-6s %-44s %8.2f ms %s\n", mode, OPS[i].name, ms, ms > hold_ms / 2 ? "WAITS" : "");
    fflush(stdout);
}

static void same(void) {
    for (int i = 0; i < N_OPS; i++) {
        pthread_t th = hold();
        double t0 = now_ms();
        OPS[i].fn();
        double ms = now_ms() - t0;
        pthread_join(th, NULL);
        CK(cudaStreamSynchronize(A));
        report("same", i, ms);
    }
}

/* parent spins, child calls: a shared page says which call, when, and how long it took */
struct xshm {
    volatile int go, done, ready;
    volatile double ms;
};

static void cross(void) {
    struct xshm *x = (struct xshm *)mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    memset(x, 0, sizeof *x);
    pid_t pid = fork();
    if (pid == 0) { /* its own CUDA context, initialised after the fork */
        setup();
        op_kernel();
        x->ready = 1;
        for (int i = 0; i < N_OPS; i++) {
            while (x->go != i + 1) usleep(50);
            double t0 = now_ms();
            OPS[i].fn();
            x->ms = now_ms() - t0;
            __sync_synchronize();
            x->done = i + 1;
        }
        _exit(0);
    }
    setup();
    CK(cudaHostAlloc((void **)&flag_h, 64, cudaHostAllocMapped));
    started_h = flag_h + 8;
    while (!x->ready) usleep(100);
    for (int i = 0; i < N_OPS; i++) {
        pthread_t th = hold();
        x->go = i + 1;
        while (x->done != i + 1) usleep(20);
        pthread_join(th, NULL);
        CK(cudaStreamSynchronize(A));
        report("cross", i, x->ms);
    }
    waitpid(pid, NULL, 0);
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "both";
    if (argc > 2) hold_ms = atoi(argv[2]);
    if (!strcmp(mode, "cross") || !strcmp(mode, "both")) cross(); /* before this process touches CUDA */
    if (!strcmp(mode, "same") || !strcmp(mode, "both")) {
        if (strcmp(mode, "both")) setup();
        if (!flag_h) {
            CK(cudaHostAlloc((void **)&flag_h, 64, cudaHostAllocMapped));
            started_h = flag_h + 8;
        }
        same();
    }
    return 0;
}
