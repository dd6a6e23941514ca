/* st_tp over UCX on loopback (UCX_TLS=tcp), three processes:
 *  phase 1: this process listens, child C1 connects; each side sends 1000 active messages of
 *           8 B .. 4 MiB (eager and rendezvous) with checksums and verifies all it receives;
 *           then C1 is killed and the listener side's peer-lost callback must fire in bounded time.
 *           C1 drives its transport by polling alone (st_tp_poll, never its loop), as a role's
 *           spinning thread does; this process by its loop.
 *  phase 2: this process (still running) connects to child C2's listener, exchanges 50 messages
 *           each way, kills C2, and its client-side peer-lost callback must fire.
 * Children are forked before any UCX state exists. Everything is bounded by alarms and a watchdog. */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

#include "harness.h"
#include "strata/transport.h"

#define AM_DATA 3
#define WINDOW 8
#define MAX_MSG (4u << 20)
#define N_PHASE1 1000
#define N_PHASE2 50
#define LOST_BOUND_S 10.0

typedef struct {
    uint64_t seq, size, sum, dir;
} msg_hdr_t;

static size_t msg_size(uint64_t i) { return (size_t)8 << (i % 20); } /* 8 B .. 4 MiB */

static uint64_t fill_word(uint64_t dir, uint64_t seq, uint64_t k) {
    uint64_t z = (dir * 1000003u + seq) * 0x9E3779B97F4A7C15ull + k * 0xBF58476D1CE4E5B9ull;
    return z ^ (z >> 29);
}

static uint64_t checksum(const uint8_t *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = (h ^ w) * 1099511628211ull;
    }
    for (; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* One side of an exchange. */
typedef struct {
    uv_loop_t *loop;
    st_tp_t *tp;
    st_tp_ep_t *ep;
    uint64_t dir; /* our direction tag */
    int n;        /* messages each way */
    int posted, sent_ok, send_fail;
    int received, recv_bad;
    uint8_t *seen;
    struct slot {
        st_tp_send_req_t req;
        uint8_t *buf;
        int busy;
    } slots[WINDOW];
    int lost;
    double lost_at;
    void (*on_done)(void *);
    void *done_arg;
    int done_called;
} peer_t;

static void maybe_done(peer_t *p) {
    if (!p->done_called && p->received == p->n && p->sent_ok + p->send_fail == p->n) {
        p->done_called = 1;
        if (p->on_done) p->on_done(p);
    }
}

static void on_sent(st_tp_send_req_t *req, st_status_t st);

static void pump(peer_t *p) {
    for (int s = 0; s < WINDOW && p->posted < p->n && p->ep; s++) {
        struct slot *sl = &p->slots[s];
        if (sl->busy) continue;
        uint64_t seq = (uint64_t)p->posted;
        size_t n = msg_size(seq);
        for (size_t k = 0; k + 8 <= n; k += 8) {
            uint64_t w = fill_word(p->dir, seq, k);
            memcpy(sl->buf + k, &w, 8);
        }
        msg_hdr_t h = {seq, n, checksum(sl->buf, n), p->dir};
        sl->req.cb = on_sent;
        sl->req.user = p;
        st_status_t st = st_tp_send(p->ep, AM_DATA, &h, sizeof h, sl->buf, n, &sl->req);
        if (st != ST_OK) {
            p->send_fail++;
            p->posted++;
            continue;
        }
        sl->busy = 1;
        p->posted++;
    }
}

static void on_sent(st_tp_send_req_t *req, st_status_t st) {
    peer_t *p = req->user;
    struct slot *sl = (struct slot *)req; /* req is the first member */
    sl->busy = 0;
    if (st == ST_OK) p->sent_ok++;
    else p->send_fail++;
    pump(p);
    maybe_done(p);
}

static st_tp_recv_t *on_begin(void *arg, st_tp_ep_t *ep, const void *hdr, size_t hlen, size_t len) {
    /* test-only: a fresh record per message (servers use a pool sized at start-up) */
    st_tp_recv_t *r = calloc(1, sizeof *r);
    r->buf = malloc(len ? len : 1);
    r->cap = len;
    return r;
}

static void on_recv(void *arg, st_tp_recv_t *r) {
    peer_t *p = arg;
    msg_hdr_t h;
    int ok = r->status == ST_OK && r->hdr_len == sizeof h && r->am_id == AM_DATA && r->ep != NULL;
    if (ok) {
        memcpy(&h, r->hdr, sizeof h);
        ok = h.dir != p->dir && h.seq < (uint64_t)p->n && h.size == r->len && h.size == msg_size(h.seq) &&
             !p->seen[h.seq] && checksum(r->buf, r->len) == h.sum;
        if (ok) {
            p->seen[h.seq] = 1;
            /* verify content too, not only self-consistency */
            for (size_t k = 0; ok && k + 8 <= r->len; k += 8) {
                uint64_t w;
                memcpy(&w, (uint8_t *)r->buf + k, 8);
                ok = w == fill_word(h.dir, h.seq, k);
            }
        }
    }
    if (!ok) {
        p->recv_bad++;
        fprintf(stderr, "bad message: status %d hdr_len %zu len %zu\n", r->status, r->hdr_len, r->len);
    }
    p->received++;
    free(r->buf);
    free(r);
    maybe_done(p);
}

static void peer_init(peer_t *p, uv_loop_t *loop, uint64_t dir, int n) {
    memset(p, 0, sizeof *p);
    p->loop = loop;
    p->dir = dir;
    p->n = n;
    p->seen = calloc((size_t)n, 1);
    for (int s = 0; s < WINDOW; s++) p->slots[s].buf = malloc(MAX_MSG);
    if (st_tp_create(loop, &p->tp) != ST_OK) {
        fprintf(stderr, "st_tp_create failed\n");
        exit(2);
    }
    st_tp_set_am_handler(p->tp, AM_DATA, on_begin, on_recv, p);
}

static void peer_cleanup(peer_t *p) {
    for (int s = 0; s < WINDOW; s++) free(p->slots[s].buf);
    free(p->seen);
}

static void on_lost(st_tp_ep_t *ep, st_status_t why, void *arg) {
    peer_t *p = arg;
    p->lost++;
    p->lost_at = st_time_sec();
    p->ep = NULL;
}

static void on_accept(st_tp_t *tp, st_tp_ep_t *ep, void *arg) {
    peer_t *p = arg;
    if (p->ep) { /* one peer per phase */
        st_tp_ep_close(ep);
        return;
    }
    p->ep = ep;
    st_tp_ep_on_lost(ep, on_lost, p);
    pump(p);
}

static void write_int(int fd, int v) {
    if (write(fd, &v, sizeof v) != (ssize_t)sizeof v) _exit(3);
}

static int read_int(int fd, int timeout_ms) {
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    if (poll(&pf, 1, timeout_ms) != 1) return -1000;
    int v;
    if (read(fd, &v, sizeof v) != (ssize_t)sizeof v) return -1001;
    return v;
}

/* ---- children ---- */

static int child_result_fd;
static void child_done(void *arg) {
    peer_t *p = arg;
    write_int(child_result_fd, p->recv_bad + p->send_fail + (p->n - p->sent_ok));
}

static void child_prepare(void) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    alarm(90);
}

static void child_client(int port_fd, int result_fd) { /* C1 */
    child_prepare();
    int port = read_int(port_fd, 30000);
    if (port <= 0) _exit(4);
    uv_loop_t loop;
    uv_loop_init(&loop);
    peer_t p;
    peer_init(&p, &loop, 2, N_PHASE1);
    child_result_fd = result_fd;
    p.on_done = child_done;
    p.done_arg = &p;
    if (st_tp_connect(p.tp, "127.0.0.1", (uint16_t)port, &p.ep) != ST_OK) _exit(5);
    st_tp_ep_on_lost(p.ep, on_lost, &p);
    pump(&p);
    for (;;) st_tp_poll(p.tp); /* until killed */
}

static void child_server(int result_fd) { /* C2 */
    child_prepare();
    uv_loop_t loop;
    uv_loop_init(&loop);
    peer_t p;
    peer_init(&p, &loop, 4, N_PHASE2);
    child_result_fd = result_fd;
    p.on_done = child_done;
    p.done_arg = &p;
    uint16_t port = 0;
    if (st_tp_listen(p.tp, "127.0.0.1", 0, on_accept, &p, &port) != ST_OK) _exit(7);
    write_int(result_fd, port);
    uv_run(&loop, UV_RUN_DEFAULT);
    _exit(8);
}

/* ---- parent ---- */

static uv_loop_t loop;
static peer_t P;
static pid_t c1, c2;
static int c1_res, c2_res;
static int phase;
static double t_kill;
static uv_timer_t tick;

static void on_tick(uv_timer_t *t) {
    /* Phase machine, polled every 10 ms: bounded waits without blocking the loop. */
    if (phase == 1 && P.done_called) {
        int r = read_int(c1_res, 0);
        if (r == -1000) return; /* child not finished yet */
        CHECK(r == 0, "child C1 reports %d problems", r);
        CHECK(P.recv_bad == 0 && P.send_fail == 0 && P.sent_ok == N_PHASE1 && P.received == N_PHASE1,
              "phase 1 parent: sent %d ok %d failed, received %d (%d bad)", P.sent_ok, P.send_fail, P.received,
              P.recv_bad);
        printf("phase 1: %d messages each way verified; killing C1\n", N_PHASE1);
        kill(c1, SIGKILL);
        t_kill = st_time_sec();
        phase = 2;
    } else if (phase == 2) {
        if (P.lost) {
            double dt = P.lost_at - t_kill;
            CHECK(P.lost == 1 && dt < LOST_BOUND_S, "listener-side lost callback after %.3f s (%d calls)", dt, P.lost);
            printf("phase 1: listener side saw C1 lost after %.3f s\n", dt);
            /* phase 2: we keep running and connect out to C2 */
            int port = read_int(c2_res, 10000);
            CHECK(port > 0, "C2 port %d", port);
            free(P.seen);
            P.seen = calloc(N_PHASE2, 1);
            P.n = N_PHASE2;
            P.posted = P.sent_ok = P.send_fail = P.received = P.recv_bad = 0;
            P.lost = 0;
            P.done_called = 0;
            if (port > 0 && st_tp_connect(P.tp, "127.0.0.1", (uint16_t)port, &P.ep) == ST_OK) {
                st_tp_ep_on_lost(P.ep, on_lost, &P);
                pump(&P);
                phase = 3;
            } else {
                CHECK(0, "connect to C2");
                phase = 5;
            }
        } else if (st_time_sec() - t_kill > LOST_BOUND_S) {
            CHECK(0, "no lost callback %.0f s after killing C1", LOST_BOUND_S);
            phase = 5;
        }
    } else if (phase == 3 && P.done_called) {
        int r = read_int(c2_res, 0);
        if (r == -1000) return;
        CHECK(r == 0, "child C2 reports %d problems", r);
        CHECK(P.recv_bad == 0 && P.send_fail == 0 && P.sent_ok == N_PHASE2 && P.received == N_PHASE2,
              "phase 2 parent: sent %d ok %d failed, received %d (%d bad)", P.sent_ok, P.send_fail, P.received,
              P.recv_bad);
        printf("phase 2: %d messages each way verified; killing C2\n", N_PHASE2);
        kill(c2, SIGKILL);
        t_kill = st_time_sec();
        phase = 4;
    } else if (phase == 4) {
        if (P.lost) {
            double dt = P.lost_at - t_kill;
            CHECK(dt < LOST_BOUND_S, "client-side lost callback after %.3f s", dt);
            printf("phase 2: client side saw C2 lost after %.3f s\n", dt);
            phase = 5;
        } else if (st_time_sec() - t_kill > LOST_BOUND_S) {
            CHECK(0, "no client-side lost callback %.0f s after killing C2", LOST_BOUND_S);
            phase = 5;
        }
    }
    if (phase == 5) {
        uv_timer_stop(t);
        uv_close((uv_handle_t *)t, NULL);
        st_tp_destroy(P.tp);
        phase = 6;
    }
}

int main(void) {
    alarm(150);
    setvbuf(stdout, NULL, _IONBF, 0);
    int p1[2], r1[2], r2[2];
    if (pipe(p1) || pipe(r1) || pipe(r2)) return 1;
    fflush(NULL);
    c1 = fork();
    if (c1 == 0) child_client(p1[0], r1[1]);
    c2 = fork();
    if (c2 == 0) child_server(r2[1]);
    c1_res = r1[0];
    c2_res = r2[0];

    uv_loop_init(&loop);
    peer_init(&P, &loop, 1, N_PHASE1);
    uint16_t port = 0;
    CHECK(st_tp_listen(P.tp, "127.0.0.1", 0, on_accept, &P, &port) == ST_OK && port > 0, "listen, port %u", port);
    write_int(p1[1], port);
    phase = 1;
    uv_timer_init(&loop, &tick);
    uv_timer_start(&tick, on_tick, 10, 10);
    double t0 = st_time_sec();
    while (phase != 6 && st_time_sec() - t0 < 120) uv_run(&loop, UV_RUN_ONCE);
    CHECK(phase == 6, "phases did not finish (stuck in %d): posted %d sent %d failed %d received %d", phase, P.posted, P.sent_ok, P.send_fail, P.received);
    if (phase != 6) {
        kill(c1, SIGKILL);
        kill(c2, SIGKILL);
        st_tp_destroy(P.tp);
        uv_close((uv_handle_t *)&tick, NULL);
    }
    uv_run(&loop, UV_RUN_DEFAULT);
    CHECK(uv_loop_close(&loop) == 0, "loop closed cleanly");
    int ws;
    CHECK(waitpid(c1, &ws, 0) == c1 && WIFSIGNALED(ws) && WTERMSIG(ws) == SIGKILL, "C1 died by our SIGKILL");
    CHECK(waitpid(c2, &ws, 0) == c2 && WIFSIGNALED(ws) && WTERMSIG(ws) == SIGKILL, "C2 died by our SIGKILL");
    peer_cleanup(&P);
    return st_test_done();
}
