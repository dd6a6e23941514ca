/* Transfer-layer benchmark: common/xfer's host backend (POSIX shared memory, spin-then-futex waits)
 * between two processes of this host, at 1 KB .. 8 MB: the round trip of put + signal + wait each way
 * (the MoE layer's dispatch → reply pattern) and its half, the one-way latency; and streaming bandwidth
 * (put + signal into 2 slots, the consumer returns credits). Next to each, ucx_perftest measured in the
 * same run at the same size (ucp_am_lat: one-way latency; ucp_am_bw: bandwidth) over the same
 * UCX_TLS as the cluster (tcp unless set), started the way bench/bench_serving.sh does. A program that
 * prints figures, not a test; figures are `RESULT name value unit (...)` lines.
 * usage: bench_xfer [sizes in bytes ...]   (default 1K 4K 16K 64K 256K 1M 4M 8M) */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "strata/xfer.h"

#define MAXB (8u << 20)
#define F_DATA (2 * (size_t)MAXB)
#define F_CREDIT (F_DATA + 8)
#define REGION (F_DATA + 64)
#define SLOTS 2
#define TIMEOUT_MS 20000

typedef struct {
    int mode; /* 0 ping-pong, 1 stream, 2 quit */
    size_t size;
    int iters;
} cmd_t;


static void die(const char *what) {
    fprintf(stderr, "bench_xfer: %s: %s\n", what, st_err_last());
    exit(1);
}

/* The peer: owns region `in` (the bench writes into it), writes into the bench's region `out`. */
static int peer(int rd, int wr) {
    st_xfer_region_t *in = NULL, *out = NULL;
    uint8_t h[ST_XFER_HANDLE_BYTES];
    if (st_xfer_region_create(ST_XFER_HOST, REGION, &in) || st_xfer_region_export(in, h)) die("peer region");
    st_xfer_region_label(in, "bench");
    if (st_fd_write_full(wr, h, sizeof h) || st_fd_read_full(rd, h, sizeof h)) return 2;
    if (st_xfer_region_open(h, sizeof h, REGION, &out)) die("peer open");
    uint8_t *src = st_xfer_region_ptr(in), *dst = st_xfer_region_ptr(out);
    uint32_t seq = 0;
    cmd_t c;
    while (st_fd_read_full(rd, &c, sizeof c) == 0 && c.mode != 2) {
        for (int i = 0; i < c.iters; i++) {
            seq++;
            if (st_xfer_wait_host(in, F_DATA, seq, TIMEOUT_MS)) die("peer wait");
            if (c.mode == 0) memcpy(dst, src, c.size); /* the reply, as large as the request */
            if (st_xfer_signal_host(out, c.mode == 0 ? F_DATA : F_CREDIT, seq)) die("peer signal");
        }
        if (st_fd_write_full(wr, "k", 1)) return 2;
    }
    st_xfer_region_destroy(out);
    st_xfer_region_destroy(in);
    return 0;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* ucx_perftest at `size`: server in the background on a random port, client in the foreground; the
 * last row's columns: lat 50% / avg / overall (µs) and bw avg / overall (MB/s). false when it failed. */
static bool perftest(const char *test, size_t size, double *median, double *overall) {
    int port = 20000 + (int)(st_time_ns() % 20000);
    long n = 400000000L / (long)(size + 1);
    n = n > 5000 ? 5000 : n < 50 ? 50 : n;
    char sz[32], iters[32], pt[16], cmd[256];
    snprintf(sz, sizeof sz, "%zu", size);
    snprintf(iters, sizeof iters, "%ld", n);
    snprintf(pt, sizeof pt, "%d", port);
    pid_t srv = fork();
    if (srv == 0) {
        int nul = open("/dev/null", O_WRONLY);
        if (nul >= 0) dup2(nul, 1), dup2(nul, 2);
        execlp("ucx_perftest", "ucx_perftest", "-t", test, "-s", sz, "-n", iters, "-p", pt, (char *)NULL);
        _exit(127);
    }
    usleep(500000);
    snprintf(cmd, sizeof cmd, "ucx_perftest 127.0.0.1 -p %d -t %s -s %zu -n %ld -f 2>/dev/null", port, test, size, n);
    FILE *p = popen(cmd, "r");
    bool ok = false;
    char line[512];
    while (p && fgets(line, sizeof line, p)) {
        double v[8];
        long it;
        if (sscanf(line, " %ld %lf %lf %lf %lf %lf %lf %lf", &it, &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6]) == 8) {
            bool bw = strstr(test, "_bw") != NULL;
            *median = bw ? v[3] : v[0];
            *overall = bw ? v[4] : v[2];
            ok = true;
        }
    }
    if (p) pclose(p);
    kill(srv, SIGTERM);
    waitpid(srv, NULL, 0);
    return ok;
}

int main(int argc, char **argv) {
    size_t sizes[32];
    int ns = 0;
    if (argc > 1) {
        for (int i = 1; i < argc && ns < 32; i++) {
            char *e = NULL;
            unsigned long long v = strtoull(argv[i], &e, 10);
            if (*e == 'K' || *e == 'k') v <<= 10;
            if (*e == 'M' || *e == 'm') v <<= 20;
            if (v == 0 || v > MAXB) {
                fprintf(stderr, "usage: bench_xfer [sizes 1 .. 8M ...]\n");
                return 2;
            }
            sizes[ns++] = (size_t)v;
        }
    } else {
        for (size_t s = 1024; s <= MAXB; s *= 4) sizes[ns++] = s;
        sizes[ns++] = MAXB;
    }
    setenv("UCX_TLS", "tcp", 0); /* the cluster's transport (bench_serving.sh: UCX_TLS=${UCX_TLS:-tcp}) */
    signal(SIGPIPE, SIG_IGN);
    int p2c[2], c2p[2];
    if (pipe(p2c) || pipe(c2p)) return 1;
    pid_t pid = fork();
    if (pid == 0) {
        close(p2c[1]), close(c2p[0]);
        _exit(peer(p2c[0], c2p[1]));
    }
    close(p2c[0]), close(c2p[1]);
    st_xfer_region_t *in = NULL, *out = NULL;
    uint8_t h[ST_XFER_HANDLE_BYTES];
    if (st_xfer_region_create(ST_XFER_HOST, REGION, &in) || st_xfer_region_export(in, h)) die("region");
    st_xfer_region_label(in, "bench peer");
    if (st_fd_read_full(c2p[0], h, sizeof h)) die("peer handle");
    if (st_xfer_region_open(h, sizeof h, REGION, &out)) die("open");
    if (st_xfer_region_export(in, h) || st_fd_write_full(p2c[1], h, sizeof h)) die("send handle");
    uint8_t *src = malloc(MAXB), *dst = st_xfer_region_ptr(out);
    for (size_t k = 0; k < MAXB; k++) src[k] = (uint8_t)(k * 131);
    uint32_t seq = 0;
    double *lat = malloc(sizeof(double) * 5000);
    char ack;
    printf("# common/xfer host backend (shared memory) vs ucx_perftest, UCX_TLS=%s, same run\n", getenv("UCX_TLS"));
    printf("# %9s %10s %10s %10s %10s %10s %7s | %10s %10s %7s\n", "bytes", "rtt p50 us", "1way p50", "1way mean",
           "am_lat p50", "am_lat avg", "lat x", "xfer MB/s", "am_bw MB/s", "bw x");
    for (int si = 0; si < ns; si++) {
        size_t n = sizes[si];
        /* ping-pong: put n + signal, wait for the n-byte reply */
        long it = (long)((256u << 20) / n);
        int iters = it > 5000 ? 5000 : it < 50 ? 50 : (int)it;
        cmd_t c = {0, n, iters};
        if (st_fd_write_full(p2c[1], &c, sizeof c)) die("command");
        for (int i = 0; i < iters; i++) {
            uint64_t t0 = st_time_ns();
            seq++;
            memcpy(dst, src, n);
            if (st_xfer_signal_host(out, F_DATA, seq) || st_xfer_wait_host(in, F_DATA, seq, TIMEOUT_MS)) die("ping-pong");
            lat[i] = (double)(st_time_ns() - t0) / 1e3;
        }
        if (st_fd_read_full(c2p[0], &ack, 1)) die("peer");
        double sum = 0;
        for (int i = 0; i < iters; i++) sum += lat[i];
        qsort(lat, (size_t)iters, sizeof *lat, cmp_d);
        double rtt50 = lat[iters / 2], one_mean = sum / iters / 2;
        /* stream: SLOTS slots of n bytes, credits back */
        it = (long)((512u << 20) / n);
        iters = it > 20000 ? 20000 : it < 100 ? 100 : (int)it;
        c = (cmd_t){1, n, iters};
        if (st_fd_write_full(p2c[1], &c, sizeof c)) die("command");
        uint32_t base = seq;
        uint64_t t0 = st_time_ns();
        for (int i = 0; i < iters; i++) {
            uint32_t s = base + (uint32_t)i + 1;
            if (i >= SLOTS && st_xfer_wait_host(in, F_CREDIT, s - SLOTS, TIMEOUT_MS)) die("credit");
            memcpy(dst + (size_t)(i % SLOTS) * n, src, n);
            if (st_xfer_signal_host(out, F_DATA, s)) die("stream signal");
        }
        seq = base + (uint32_t)iters;
        if (st_xfer_wait_host(in, F_CREDIT, seq, TIMEOUT_MS)) die("last credit");
        double secs = (double)(st_time_ns() - t0) / 1e9, mbs = (double)n * iters / secs / 1e6;
        if (st_fd_read_full(c2p[0], &ack, 1)) die("peer");
        double am_lat50 = 0, am_lat = 0, am_bw50 = 0, am_bw = 0;
        bool have_lat = perftest("ucp_am_lat", n, &am_lat50, &am_lat);
        bool have_bw = perftest("ucp_am_bw", n, &am_bw50, &am_bw);
        printf("  %9zu %10.2f %10.2f %10.2f %10.2f %10.2f %7.2f | %10.0f %10.0f %7.2f\n", n, rtt50, rtt50 / 2, one_mean,
               am_lat50, am_lat, have_lat && rtt50 > 0 ? am_lat50 / (rtt50 / 2) : 0, mbs, am_bw,
               have_bw && am_bw > 0 ? mbs / am_bw : 0);
        printf("RESULT xfer_host_rtt_us_%zu %.2f us (p50; mean %.2f)\n", n, rtt50, 2 * one_mean);
        printf("RESULT xfer_host_oneway_us_%zu %.2f us (p50 half round trip; ucp_am_lat p50 %.2f us%s: %.2fx faster)\n",
               n, rtt50 / 2, am_lat50, have_lat ? "" : " FAILED", have_lat && rtt50 > 0 ? am_lat50 / (rtt50 / 2) : 0);
        printf("RESULT xfer_host_bw_mb_s_%zu %.0f MB/s (ucp_am_bw %.0f MB/s%s: ratio %.2f)\n", n, mbs, am_bw,
               have_bw ? "" : " FAILED", have_bw && am_bw > 0 ? mbs / am_bw : 0);
        fflush(stdout);
    }
    cmd_t q = {2, 0, 0};
    st_fd_write_full(p2c[1], &q, sizeof q);
    int status = 0;
    waitpid(pid, &status, 0);
    st_xfer_region_destroy(out);
    st_xfer_region_destroy(in);
    free(src);
    free(lat);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
