/* common/xfer's CUDA backend between two processes on one GPU (fork before CUDA starts; handles over
 * pipes): device regions over CUDA IPC with stream-ordered put / signal / wait, round trips with the
 * data checked; the same exchange captured once in a CUDA graph per side and replayed with a new
 * epoch each time; the watchdog (a wait nobody signals ends at its deadline, raises the error word,
 * a chained wait returns at once, a captured graph drains); and the pinned host ring (a host region
 * mapped into the GPU: GPU put + signal seen by a CPU wait, CPU put + signal seen by a GPU wait).
 * Exit 77 without a device. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "strata/gpu.h"
#include "strata/kernels.h"
#include "strata/xfer.h"

#define SLOT (1u << 20)
#define F_RT (SLOT + 0)      /* round trips */
#define F_GRAPH (SLOT + 8)   /* the captured exchange */
#define F_DOG (SLOT + 16)    /* never signalled */
#define REGION (SLOT + 64)
#define ROUNDS 16
#define REPLAYS 16
#define RING_DATA (256u << 10)
#define F_UP (2 * RING_DATA)      /* ring: GPU → CPU */
#define F_DOWN (2 * RING_DATA + 8) /* ring: CPU → GPU */
#define RING (2 * RING_DATA + 64)

#define OK(call)                                                                                   \
    do {                                                                                           \
        st_status_t rc_ = (call);                                                                  \
        if (rc_ != ST_OK) {                                                                        \
            fprintf(stderr, "FATAL %s:%d: %s -> %d %s\n", __FILE__, __LINE__, #call, rc_, st_err_last()); \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static void write_all(int fd, const void *p, size_t n) {
    if (st_fd_write_full(fd, p, n)) exit(90);
}
static void read_all(int fd, void *p, size_t n) {
    if (st_fd_read_full(fd, p, n)) exit(91);
}
static size_t round_bytes(int i) { return (size_t)((i * 104729) % SLOT) + 1; }
static uint8_t pat(int i, size_t k) { return (uint8_t)(i * 29 + (int)(k * 13) + (int)(k >> 9)); }

/* opens the peer's handle read from fd */
static st_xfer_region_t *open_from(int fd, size_t min_bytes) {
    uint8_t h[ST_XFER_HANDLE_BYTES];
    st_xfer_region_t *r = NULL;
    read_all(fd, h, sizeof h);
    OK(st_xfer_region_open(h, sizeof h, min_bytes, &r));
    return r;
}
static st_xfer_region_t *create_to(int fd, st_xfer_kind_t kind, size_t bytes) {
    uint8_t h[ST_XFER_HANDLE_BYTES];
    st_xfer_region_t *r = NULL;
    OK(st_xfer_region_create(kind, bytes, &r));
    OK(st_xfer_region_export(r, h));
    write_all(fd, h, sizeof h);
    return r;
}

/* The child: echoes each round of B (its region, written by the parent) into A (the parent's). */
static int child(int rd, int wr) {
    if (st_gpu_device_count() <= 0) return 77;
    st_gpu_stream_t s;
    OK(st_gpu_init(0));
    OK(st_gpu_stream_create(&s));
    st_xfer_region_t *b = create_to(wr, ST_XFER_DEVICE, REGION);
    st_xfer_region_t *a = open_from(rd, REGION);
    uint32_t *err = NULL, *epoch = NULL;
    OK(st_gpu_host_alloc((void **)&err, 64));
    OK(st_gpu_malloc((void **)&epoch, 4));
    *err = 0;
    int fails = 0;
    /* 1: round trips, all queued at once (each wait holds the stream until the parent's round lands) */
    for (int i = 1; i <= ROUNDS; i++) {
        OK(st_xfer_wait(&s, b, F_RT, (uint32_t)i, NULL, 10000, err));
        OK(st_xfer_put(&s, a, 0, st_xfer_region_ptr(b), round_bytes(i)));
        OK(st_xfer_signal(&s, a, F_RT, (uint32_t)i, NULL));
    }
    OK(st_gpu_stream_sync(&s));
    fails += *err != 0;
    /* 2: the captured mirror image, replayed with epoch = r */
    void *g = NULL;
    OK(st_gpu_capture_begin(&s));
    OK(st_xfer_wait(&s, b, F_GRAPH, 1, epoch, 10000, err));
    OK(st_xfer_put(&s, a, 0, st_xfer_region_ptr(b), SLOT));
    OK(st_xfer_signal(&s, a, F_GRAPH, 1, epoch));
    OK(st_gpu_capture_end(&s, &g));
    for (uint32_t r = 1; r <= REPLAYS; r++) {
        OK(st_gpu_memcpy_h2d(epoch, &r, 4));
        OK(st_gpu_graph_launch(g, &s));
        OK(st_gpu_stream_sync(&s));
    }
    fails += *err != 0;
    st_gpu_graph_destroy(g);
    /* 4: the pinned host ring: GPU → parent's CPU, then parent's CPU → GPU */
    st_xfer_region_t *ring = open_from(rd, RING);
    OK(st_xfer_region_gpu_map(ring));
    uint8_t *h = malloc(RING_DATA), *d = NULL;
    OK(st_gpu_malloc((void **)&d, RING_DATA));
    for (size_t k = 0; k < RING_DATA; k++) h[k] = pat(77, k);
    OK(st_gpu_memcpy_h2d(d, h, RING_DATA));
    OK(st_xfer_put(&s, ring, 0, d, RING_DATA));
    OK(st_xfer_signal(&s, ring, F_UP, 1, NULL));
    OK(st_xfer_wait(&s, ring, F_DOWN, 1, NULL, 10000, err));
    OK(st_gpu_memcpy_async(&s, d, (uint8_t *)st_xfer_region_ptr(ring) + RING_DATA, RING_DATA, ST_GPU_COPY_H2D));
    OK(st_gpu_stream_sync(&s));
    OK(st_gpu_memcpy_d2h(h, d, RING_DATA));
    for (size_t k = 0; k < RING_DATA; k++) fails += h[k] != pat(78, k);
    fails += *err != 0;
    char done = 'd';
    write_all(wr, &done, 1);
    read_all(rd, &done, 1); /* the parent unmapped our regions */
    st_xfer_region_destroy(ring);
    st_xfer_region_destroy(a);
    st_xfer_region_destroy(b);
    st_gpu_free(d), st_gpu_free(epoch), st_gpu_host_free(err);
    free(h);
    st_gpu_stream_destroy(&s);
    return fails ? 2 : 0;
}

int main(void) {
    int p2c[2], c2p[2];
    if (pipe(p2c) || pipe(c2p)) return 1;
    signal(SIGPIPE, SIG_IGN);
    pid_t pid = fork(); /* NOTE: before any CUDA call: a forked child cannot use a CUDA context */
    if (pid == 0) {
        close(p2c[1]), close(c2p[0]);
        _exit(child(p2c[0], c2p[1]));
    }
    close(p2c[0]), close(c2p[1]);
    if (st_gpu_device_count() <= 0) {
        printf("test_gpu_xfer: no CUDA device, skipped\n");
        waitpid(pid, NULL, 0);
        return 77;
    }
    st_gpu_stream_t s;
    OK(st_gpu_init(0));
    OK(st_gpu_stream_create(&s));
    char desc[256];
    st_gpu_describe(desc, sizeof desc);
    printf("test_gpu_xfer on %s\n", desc);
    st_xfer_region_t *a = create_to(p2c[1], ST_XFER_DEVICE, REGION);
    st_xfer_region_t *b = open_from(c2p[0], REGION);
    st_xfer_region_label(b, "child");
    uint8_t *h = malloc(SLOT), *src = NULL, *chk = NULL;
    uint32_t *err = NULL, *epoch = NULL;
    OK(st_gpu_malloc((void **)&src, SLOT));
    OK(st_gpu_malloc((void **)&chk, SLOT));
    OK(st_gpu_malloc((void **)&epoch, 4));
    OK(st_gpu_host_alloc((void **)&err, 64));
    *err = 0;

    /* 1: round trips through the child's region and back into ours */
    size_t bad = 0;
    for (int i = 1; i <= ROUNDS; i++) {
        size_t n = round_bytes(i);
        for (size_t k = 0; k < n; k++) h[k] = pat(i, k);
        OK(st_gpu_memcpy_h2d(src, h, n));
        OK(st_gpu_memset(chk, 0, SLOT));
        OK(st_xfer_put(&s, b, 0, src, n));
        OK(st_xfer_signal(&s, b, F_RT, (uint32_t)i, NULL));
        OK(st_xfer_wait(&s, a, F_RT, (uint32_t)i, NULL, 10000, err));
        OK(st_gpu_memcpy_async(&s, chk, st_xfer_region_ptr(a), n, ST_GPU_COPY_D2D));
        OK(st_gpu_stream_sync(&s));
        OK(st_gpu_memcpy_d2h(h, chk, n));
        for (size_t k = 0; k < n; k++) bad += h[k] != pat(i, k);
    }
    CHECK(bad == 0 && *err == 0, "IPC round trips: %zu bad bytes, err %u", bad, *err);

    /* 2: the same exchange captured once, replayed with epoch r: flags 1 + r */
    void *g = NULL;
    OK(st_gpu_capture_begin(&s));
    OK(st_xfer_put(&s, b, 0, src, SLOT));
    OK(st_xfer_signal(&s, b, F_GRAPH, 1, epoch));
    OK(st_xfer_wait(&s, a, F_GRAPH, 1, epoch, 10000, err));
    OK(st_gpu_memcpy_async(&s, chk, st_xfer_region_ptr(a), SLOT, ST_GPU_COPY_D2D));
    OK(st_gpu_capture_end(&s, &g));
    bad = 0;
    for (uint32_t r = 1; r <= REPLAYS; r++) {
        for (size_t k = 0; k < SLOT; k++) h[k] = pat(100 + (int)r, k);
        OK(st_gpu_memcpy_h2d(src, h, SLOT));
        OK(st_gpu_memcpy_h2d(epoch, &r, 4));
        OK(st_gpu_graph_launch(g, &s));
        OK(st_gpu_stream_sync(&s));
        OK(st_gpu_memcpy_d2h(h, chk, SLOT));
        for (size_t k = 0; k < SLOT; k++) bad += h[k] != pat(100 + (int)r, k);
    }
    CHECK(bad == 0 && *err == 0, "graph replays: %zu bad bytes, err %u", bad, *err);
    st_gpu_graph_destroy(g);

    /* 3: the watchdog: nobody signals F_DOG */
    uint64_t t0 = st_time_ns();
    OK(st_xfer_wait(&s, a, F_DOG, 1, NULL, 50, err));
    OK(st_gpu_stream_sync(&s));
    double ms = (double)(st_time_ns() - t0) / 1e6;
    CHECK(*err == ST_FLAG_ERR_TIMEOUT && ms >= 45 && ms < 3000, "watchdog: err %u after %.1f ms", *err, ms);
    t0 = st_time_ns();
    OK(st_xfer_wait(&s, a, F_DOG, 1, NULL, 10000, err)); /* err already set: returns at once */
    OK(st_gpu_stream_sync(&s));
    ms = (double)(st_time_ns() - t0) / 1e6;
    CHECK(ms < 1000, "chained wait after a timeout took %.1f ms", ms);
    *err = 0;
    OK(st_gpu_capture_begin(&s));
    for (int i = 0; i < 4; i++) OK(st_xfer_wait(&s, a, F_DOG, 1, NULL, 50, err));
    OK(st_gpu_capture_end(&s, &g));
    t0 = st_time_ns();
    OK(st_gpu_graph_launch(g, &s));
    OK(st_gpu_stream_sync(&s));
    ms = (double)(st_time_ns() - t0) / 1e6;
    CHECK(*err == ST_FLAG_ERR_TIMEOUT && ms < 1000, "graph of 4 stuck waits drained in %.1f ms, err %u", ms, *err);
    st_gpu_graph_destroy(g);
    CHECK(st_xfer_wait(&s, a, F_DOG, 1, NULL, 0, err) == ST_ERR_INVALID_ARG, "unbounded GPU wait refused");
    CHECK(st_xfer_put(&s, b, SLOT, src, 65) == ST_ERR_OUT_OF_RANGE, "put past the end");

    /* 4: the pinned host ring */
    st_xfer_region_t *ring = create_to(p2c[1], ST_XFER_HOST, RING);
    st_xfer_region_label(ring, "child (ring)");
    OK(st_xfer_region_gpu_map(ring));
    CHECK(st_xfer_wait_host(ring, F_UP, 1, 10000) == ST_OK, "ring: GPU signal seen by the CPU: %s", st_err_last());
    uint8_t *rp = st_xfer_region_ptr(ring);
    bad = 0;
    for (size_t k = 0; k < RING_DATA; k++) bad += rp[k] != pat(77, k);
    CHECK(bad == 0, "ring: %zu bad bytes from the GPU", bad);
    for (size_t k = 0; k < RING_DATA; k++) rp[RING_DATA + k] = pat(78, k);
    OK(st_xfer_signal_host(ring, F_DOWN, 1));
    char done = 0;
    read_all(c2p[0], &done, 1);
    /* our mappings of the child's memory go before the child frees it */
    st_xfer_region_destroy(ring);
    st_xfer_region_destroy(b);
    write_all(p2c[1], &done, 1);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child exit %d", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    st_xfer_region_destroy(a);
    st_gpu_free(src), st_gpu_free(chk), st_gpu_free(epoch), st_gpu_host_free(err);
    free(h);
    st_gpu_stream_destroy(&s);
    return st_test_done();
}
