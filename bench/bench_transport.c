/* Transport benchmark: st_tp (UCX active messages driven by libuv) on loopback, two processes.
 * For each message size: round trips (request/response, the MoE layer pattern) and one-way
 * streaming with a window of 8 in flight (what `ucx_perftest ucp_am_bw` measures). Prints MB/s;
 * bench/bench_serving.sh puts them next to ucx_perftest. --poll: both sides poll (st_tp_poll) instead
 * of sleeping in the loop, as the roles do while a worker steps (what `ucp_am_lat` does).
 * usage: bench_transport [--poll] [sizes...] */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

#include "strata/transport.h"

#define AM_REQ 5
#define AM_REP 6
#define WINDOW 8
#define MAXB (8u << 20)

typedef struct {
    uv_loop_t loop;
    st_tp_t *tp;
    st_tp_ep_t *ep;
    st_tp_recv_t recv[WINDOW * 2];
    int recv_busy[WINDOW * 2];
    uint8_t *rbuf[WINDOW * 2];
    st_tp_send_req_t send[WINDOW];
    int send_busy[WINDOW];
    uint8_t *sbuf;
    /* client state */
    size_t size;
    int todo, inflight, got, mode; /* mode 0 ping-pong, 1 stream */
    double t0, t1;
    int done, poll;
} side_t;

static side_t S;

static st_tp_recv_t *begin(void *arg, st_tp_ep_t *ep, const void *hdr, size_t hdr_len, size_t len) {
    for (int i = 0; i < WINDOW * 2; i++)
        if (!S.recv_busy[i]) {
            S.recv_busy[i] = 1;
            S.recv[i].buf = S.rbuf[i];
            S.recv[i].cap = MAXB;
            S.recv[i].user = (void *)(intptr_t)i;
            return &S.recv[i];
        }
    return NULL;
}

static void on_sent(st_tp_send_req_t *r, st_status_t st) { S.send_busy[(int)(intptr_t)r->user] = 0; }

static int post(uint16_t am, size_t size) {
    for (int i = 0; i < WINDOW; i++)
        if (!S.send_busy[i]) {
            S.send_busy[i] = 1;
            S.send[i].cb = on_sent;
            S.send[i].user = (void *)(intptr_t)i;
            uint64_t h = size;
            if (st_tp_send(S.ep, am, &h, sizeof h, S.sbuf, size, &S.send[i]) != ST_OK) {
                S.send_busy[i] = 0;
                return -1;
            }
            return 0;
        }
    return -1;
}

/* server: echo every request (ping-pong) or answer only the last of a stream with 8 bytes */
static void srv_done(void *arg, st_tp_recv_t *r) {
    uint64_t want_reply;
    memcpy(&want_reply, r->hdr, sizeof want_reply);
    if (r->ep && !S.ep) S.ep = r->ep;
    S.recv_busy[(int)(intptr_t)r->user] = 0;
    if (want_reply != (uint64_t)-1) post(AM_REP, (size_t)want_reply);
}

static void on_accept(st_tp_t *tp, st_tp_ep_t *ep, void *arg) { S.ep = ep; }

static void cli_kick(void);

static void cli_done(void *arg, st_tp_recv_t *r) {
    S.recv_busy[(int)(intptr_t)r->user] = 0;
    S.got++;
    S.inflight--;
    cli_kick();
}

/* ping-pong: one request at a time, same size back; stream: window of requests that ask for an
 * 8-byte ack each (the reply counts the message as delivered) */
static void cli_kick(void) {
    while (S.todo > 0 && S.inflight < (S.mode ? WINDOW : 1)) {
        uint64_t h = S.mode ? 8 : S.size;
        int i;
        for (i = 0; i < WINDOW && S.send_busy[i]; i++) {
        }
        if (i == WINDOW) break;
        S.send_busy[i] = 1;
        S.send[i].cb = on_sent;
        S.send[i].user = (void *)(intptr_t)i;
        if (st_tp_send(S.ep, AM_REQ, &h, sizeof h, S.sbuf, S.size, &S.send[i]) != ST_OK) {
            S.send_busy[i] = 0;
            break;
        }
        S.todo--;
        S.inflight++;
    }
    if (S.todo == 0 && S.inflight == 0 && !S.done) {
        S.t1 = st_time_sec();
        S.done = 1;
        uv_stop(&S.loop);
    }
}

/* The loop until the client is done (the server: for ever): asleep in it, or polling. */
static void run(void) {
    if (!S.poll) {
        uv_run(&S.loop, UV_RUN_DEFAULT);
        return;
    }
    for (unsigned i = 0; !S.done; i++) {
        st_tp_poll(S.tp);
        if (i % 256 == 0) uv_run(&S.loop, UV_RUN_NOWAIT); /* connections, handshakes */
    }
}

static void setup(void) {
    uv_loop_init(&S.loop);
    for (int i = 0; i < WINDOW * 2; i++) S.rbuf[i] = malloc(MAXB);
    S.sbuf = malloc(MAXB);
    memset(S.sbuf, 7, MAXB);
    st_tp_create(&S.loop, &S.tp);
}

int main(int argc, char **argv) {
    size_t sizes[16] = {4096, 65536, 262144, 1 << 20, 2621440};
    int n_sizes = 5, a = 1;
    if (a < argc && !strcmp(argv[a], "--poll")) S.poll = 1, a++;
    if (a < argc) {
        n_sizes = 0;
        for (int i = a; i < argc && n_sizes < 16; i++) sizes[n_sizes++] = (size_t)strtoull(argv[i], NULL, 10);
    }
    if (!getenv("UCX_TLS")) setenv("UCX_TLS", "tcp", 1);
    st_log_set_level(ST_LOG_WARN);
    int pfd[2];
    if (pipe(pfd) != 0) return 1;
    pid_t child = fork();
    if (child == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        setup();
        uint16_t port = 0;
        st_tp_set_am_handler(S.tp, AM_REQ, begin, srv_done, NULL);
        if (st_tp_listen(S.tp, "127.0.0.1", 0, on_accept, NULL, &port) != ST_OK) _exit(1);
        if (write(pfd[1], &port, sizeof port) != sizeof port) _exit(1);
        run();
        _exit(0);
    }
    uint16_t port;
    if (read(pfd[0], &port, sizeof port) != sizeof port) return 1;
    setup();
    st_tp_set_am_handler(S.tp, AM_REP, begin, cli_done, NULL);
    if (st_tp_connect(S.tp, "127.0.0.1", port, &S.ep) != ST_OK) return 1;
    printf("%10s %14s %14s %14s\n", "bytes", "round trip us", "rt MB/s (2x)", "stream MB/s");
    for (int k = 0; k < n_sizes; k++) {
        double r[2];
        for (int mode = 0; mode < 2; mode++) {
            size_t sz = sizes[k];
            int n = (int)ST_MAX(20, ST_MIN(2000, (200u << 20) / (sz + 1)));
            S.size = sz;
            S.mode = mode;
            S.todo = 3; /* warm-up */
            S.got = S.inflight = S.done = 0;
            uv_run(&S.loop, UV_RUN_NOWAIT);
            cli_kick();
            run();
            S.todo = n;
            S.got = S.inflight = S.done = 0;
            S.t0 = st_time_sec();
            cli_kick();
            run();
            double dt = S.t1 - S.t0;
            r[mode] = mode ? sz * (double)n / dt / 1e6 : dt / n * 1e6;
        }
        printf("%10zu %14.1f %14.1f %14.1f\n", sizes[k], r[0], 2.0 * sizes[k] / r[0], r[1]);
    }
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    return 0;
}
