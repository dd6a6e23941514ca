/* st_tp security on loopback (UCX_TLS=tcp), one process, one loop, several st_tp:
 *  listen:  a process that listens on 127.0.0.1 (and clients that set their local host to it) has
 *           no LISTEN socket on any other address (UCX's tcp transport used to open one per
 *           interface, the external one included): read from /proc/net/tcp{,6} for our own fds.
 *  good:    server A and client B share the secret: B's sends posted before the handshake are
 *           held and arrive in order, after A's accept; replies flow back; more sends go direct.
 *  wrong:   client C holds another secret: C sees A as a fake server (lost with ST_ERR_AUTH), its
 *           held sends fail, A's handler and accept callback never run.
 *  raw:     client D has no secret and sends active messages at once: none reaches A's handler,
 *           A never accepts it, D's endpoint is closed.
 *  silent:  client E connects and says nothing: A closes it after the handshake timeout.
 *  mute:    secure client G connects to a server F without the secret and without any handler of
 *           its own: F survives (UCX 1.13 crashed on a message to a worker with no handler) and
 *           closes G at once; G's held send fails, its endpoint is reported lost.
 *  stalled: secure client H connects to a socket that never answers: H gives up after the
 *           handshake timeout with ST_ERR_AUTH.
 * Everything is bounded (alarm + per-step deadlines). */
#include <arpa/inet.h>
#include <dirent.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include "harness.h"
#include "strata/transport.h"

#define AM_DATA 3
#define AM_REPLY 4
#define N_GOOD 16
#define HS_MS 600u
#define BIG (1u << 20) /* a rendezvous-sized message among the held ones */

static uv_loop_t loop;
static uv_timer_t beat;

/* ---- server A: counts what reaches its handler and its accept callback ---- */
typedef struct {
    st_tp_t *tp;
    int accepts, received, recv_bad, before_accept, lost;
    uint64_t next_seq;
    st_tp_send_req_t rep[N_GOOD + 4];
    uint64_t rep_seq[N_GOOD + 4];
    int n_rep;
} server_t;
static server_t A;

/* ---- a client ---- */
typedef struct client {
    const char *name;
    st_tp_t *tp;
    st_tp_ep_t *ep;
    int lost;
    st_status_t lost_why;
    double t_connect, t_lost;
    struct {
        st_tp_send_req_t req;
        int calls;
        st_status_t st;
    } s[N_GOOD + 4];
    int n_sent, replies;
    uint8_t *big;
} client_t;

static uint8_t small_payload[256];

static st_tp_recv_t *begin_any(void *arg, st_tp_ep_t *ep, const void *hdr, size_t hlen, size_t len) {
    st_tp_recv_t *r = calloc(1, sizeof *r); /* test-only: servers use pools */
    r->buf = malloc(len ? len : 1);
    r->cap = len;
    return r;
}

/* Server side: the order messages arrive in is the order of their headers here (a rendezvous
 * payload may finish after smaller messages behind it). */
static st_tp_recv_t *srv_begin(void *arg, st_tp_ep_t *ep, const void *hdr, size_t hlen, size_t len) {
    server_t *s = arg;
    uint64_t seq = ~0ull;
    if (hlen == sizeof seq) memcpy(&seq, hdr, sizeof seq);
    if (seq != s->next_seq) {
        fprintf(stderr, "server: message %llu, expected %llu\n", (unsigned long long)seq,
                (unsigned long long)s->next_seq);
        s->recv_bad++;
    }
    s->next_seq = seq + 1;
    return begin_any(arg, ep, hdr, hlen, len);
}

static void rep_sent(st_tp_send_req_t *req, st_status_t st) {}

static void srv_done(void *arg, st_tp_recv_t *r) {
    server_t *s = arg;
    uint64_t seq = ~0ull;
    if (r->hdr_len == sizeof seq) memcpy(&seq, r->hdr, sizeof seq);
    if (r->status != ST_OK || !r->ep || r->hdr_len != sizeof seq) s->recv_bad++;
    else if (!st_tp_ep_user(r->ep)) s->before_accept++; /* a message from an endpoint never accepted */
    s->received++;
    if (r->ep && s->n_rep < (int)ST_ARRAY_LEN(s->rep)) { /* echo the sequence number */
        int k = s->n_rep++;
        s->rep_seq[k] = seq;
        s->rep[k].cb = rep_sent;
        if (st_tp_send(r->ep, AM_REPLY, &s->rep_seq[k], sizeof seq, NULL, 0, &s->rep[k]) != ST_OK) s->recv_bad++;
    }
    free(r->buf);
    free(r);
}

static void srv_lost(st_tp_ep_t *ep, st_status_t why, void *arg) { ((server_t *)arg)->lost++; }

static void srv_accept(st_tp_t *tp, st_tp_ep_t *ep, void *arg) {
    server_t *s = arg;
    s->accepts++;
    st_tp_ep_set_user(ep, s);
    st_tp_ep_on_lost(ep, srv_lost, s);
}

static void cli_done(void *arg, st_tp_recv_t *r) {
    client_t *c = arg;
    if (r->status == ST_OK && r->am_id == AM_REPLY) c->replies++;
    free(r->buf);
    free(r);
}

static void cli_lost(st_tp_ep_t *ep, st_status_t why, void *arg) {
    client_t *c = arg;
    c->lost++;
    c->lost_why = why;
    c->t_lost = st_time_sec();
    c->ep = NULL;
}

static void cli_sent(st_tp_send_req_t *req, st_status_t st) {
    client_t *c = req->user;
    for (int i = 0; i < c->n_sent; i++)
        if (&c->s[i].req == req) {
            c->s[i].calls++;
            c->s[i].st = st;
        }
}

static st_status_t cli_send(client_t *c, uint64_t seq, const void *payload, size_t len) {
    int i = c->n_sent++;
    c->s[i].req.cb = cli_sent;
    c->s[i].req.user = c;
    st_status_t st = st_tp_send(c->ep, AM_DATA, &seq, sizeof seq, payload, len, &c->s[i].req);
    if (st != ST_OK) c->n_sent--;
    return st;
}

static void client_init(client_t *c, const char *name, const st_secret_t *secret) {
    memset(c, 0, sizeof *c);
    c->name = name;
    if (st_tp_create(&loop, &c->tp) != ST_OK) {
        fprintf(stderr, "st_tp_create failed\n");
        exit(2);
    }
    st_tp_set_local_host(c->tp, "127.0.0.1"); /* a client that only connects keeps UCX on lo too */
    st_tp_set_handshake_timeout_ms(c->tp, HS_MS);
    if (secret) st_tp_set_secret(c->tp, secret);
    st_tp_set_am_handler(c->tp, AM_REPLY, begin_any, cli_done, c);
}

static int client_connect(client_t *c, uint16_t port) {
    c->t_connect = st_time_sec();
    if (st_tp_connect(c->tp, "127.0.0.1", port, &c->ep) != ST_OK) return 0;
    st_tp_ep_on_lost(c->ep, cli_lost, c);
    return 1;
}

/* every send got exactly one callback */
static int sends_all_called(const client_t *c) {
    for (int i = 0; i < c->n_sent; i++)
        if (c->s[i].calls != 1) return 0;
    return 1;
}

static void on_beat(uv_timer_t *t) {}

/* Run the loop until cond() or the deadline; returns cond(). */
static int wait_for(int (*cond)(void), double secs) {
    double t0 = st_time_sec();
    while (!cond() && st_time_sec() - t0 < secs) uv_run(&loop, UV_RUN_ONCE);
    return cond();
}
static void run_for(double secs) {
    double t0 = st_time_sec();
    while (st_time_sec() - t0 < secs) uv_run(&loop, UV_RUN_ONCE);
}

/* ---- listening sockets of this process, from /proc ---- */

static int own_inode(unsigned long ino) {
    DIR *d = opendir("/proc/self/fd");
    int found = 0;
    for (struct dirent *de; d && !found && (de = readdir(d));) {
        char p[300], l[64];
        snprintf(p, sizeof p, "/proc/self/fd/%s", de->d_name);
        ssize_t n = readlink(p, l, sizeof l - 1);
        if (n <= 0) continue;
        l[n] = 0;
        unsigned long v;
        if (sscanf(l, "socket:[%lu]", &v) == 1 && v == ino) found = 1;
    }
    if (d) closedir(d);
    return found;
}

/* Counts our LISTEN sockets; any not on a loopback address is a failure. *saw_port: one of them
 * is on port. */
static int check_listeners(const char *when, uint16_t port, int *saw_port) {
    int n = 0;
    *saw_port = 0;
    const char *files[2] = {"/proc/net/tcp", "/proc/net/tcp6"};
    for (int f = 0; f < 2; f++) {
        FILE *fp = fopen(files[f], "r");
        if (!fp) continue;
        char line[512], addr[40];
        unsigned lport, state;
        unsigned long ino;
        if (!fgets(line, sizeof line, fp)) line[0] = 0; /* header */
        while (fgets(line, sizeof line, fp)) {
            if (sscanf(line, " %*d: %39[0-9A-Fa-f]:%x %*s %x %*s %*s %*s %*s %*s %lu", addr, &lport, &state, &ino) != 4)
                continue;
            if (state != 0x0A || !own_inode(ino)) continue; /* 0A: TCP_LISTEN */
            char text[INET6_ADDRSTRLEN] = "?";
            int loopback;
            if (f == 0) {
                struct in_addr a = {.s_addr = (uint32_t)strtoul(addr, NULL, 16)}; /* printed as the raw word */
                inet_ntop(AF_INET, &a, text, sizeof text);
                loopback = (ntohl(a.s_addr) >> 24) == 127;
            } else {
                struct in6_addr a;
                for (int w = 0; w < 4; w++) {
                    char word[9];
                    memcpy(word, addr + 8 * w, 8);
                    word[8] = 0;
                    uint32_t v = (uint32_t)strtoul(word, NULL, 16);
                    memcpy(&a.s6_addr[4 * w], &v, 4);
                }
                inet_ntop(AF_INET6, &a, text, sizeof text);
                loopback = IN6_IS_ADDR_LOOPBACK(&a) ||
                           (IN6_IS_ADDR_V4MAPPED(&a) && a.s6_addr[12] == 127);
            }
            n++;
            if (lport == port) *saw_port = 1;
            CHECK(loopback, "%s: a socket of this process listens on %s:%u (only loopback was asked for)", when, text,
                  lport);
        }
        fclose(fp);
    }
    return n;
}

static int host_has_external_interface(void) {
    struct ifaddrs *ifs, *i;
    int yes = 0;
    if (getifaddrs(&ifs) != 0) return 0;
    for (i = ifs; i; i = i->ifa_next)
        if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && !(i->ifa_flags & IFF_LOOPBACK) &&
            (i->ifa_flags & IFF_UP))
            yes = 1;
    freeifaddrs(ifs);
    return yes;
}

/* ---- scenarios ---- */
static client_t B, C, D, E, G, H;
static st_tp_t *F; /* a server without the secret */
static int F_accepts;
static void f_accept(st_tp_t *tp, st_tp_ep_t *ep, void *arg) { F_accepts++; }

static int good_done(void) { return A.received >= N_GOOD && B.replies >= N_GOOD && sends_all_called(&B); }
static int good_more_done(void) { return A.received == N_GOOD + 1 && B.replies == N_GOOD + 1 && sends_all_called(&B); }
static int b_closed_seen(void) { return A.lost == 1; }
static int c_lost(void) { return C.lost && sends_all_called(&C); }
static int d_lost(void) { return D.lost && sends_all_called(&D); }
static int e_lost(void) { return E.lost > 0; }
static int g_lost(void) { return G.lost && sends_all_called(&G); }
static int h_lost(void) { return H.lost && sends_all_called(&H); }

int main(void) {
    alarm(60);
    setvbuf(stdout, NULL, _IONBF, 0);
    uv_loop_init(&loop);
    uv_timer_init(&loop, &beat);
    uv_timer_start(&beat, on_beat, 5, 5); /* UV_RUN_ONCE returns at least every 5 ms */
    st_secret_t k1 = {.len = 32}, k2 = {.len = 32};
    memset(k1.key, 0x11, 32);
    memset(k2.key, 0x11, 32);
    k2.key[31] = 0x12; /* one byte apart */

    /* listen */
    CHECK(st_tp_create(&loop, &A.tp) == ST_OK, "create A");
    st_tp_set_secret(A.tp, &k1);
    st_tp_set_handshake_timeout_ms(A.tp, HS_MS);
    st_tp_set_am_handler(A.tp, AM_DATA, srv_begin, srv_done, &A);
    uint16_t port = 0;
    CHECK(st_tp_listen(A.tp, "127.0.0.1", 0, srv_accept, &A, &port) == ST_OK && port, "A listens on 127.0.0.1:%u",
          port);
    run_for(0.05);
    int saw;
    int n = check_listeners("after listen", port, &saw);
    CHECK(saw && n >= 1, "A's listener found among this process's %d LISTEN sockets", n);
    if (!host_has_external_interface()) printf("note: no external interface here; the listen check is weaker\n");
    printf("listen: %d LISTEN sockets of this process checked\n", n);

    /* good: sends posted at once are held until the handshake, then arrive in order */
    client_init(&B, "B", &k1);
    B.big = malloc(BIG);
    memset(B.big, 0x5a, BIG);
    CHECK(client_connect(&B, port), "B connects");
    for (uint64_t i = 0; i < N_GOOD; i++)
        CHECK(cli_send(&B, i, i == 5 ? B.big : small_payload, i == 5 ? BIG : sizeof small_payload) == ST_OK,
              "B posts %llu", (unsigned long long)i);
    CHECK(wait_for(good_done, 10), "good: A got %d/%d, B got %d replies", A.received, N_GOOD, B.replies);
    printf("good: connect → %d messages and replies in %.1f ms\n", N_GOOD, (st_time_sec() - B.t_connect) * 1e3);
    CHECK(A.accepts == 1 && A.before_accept == 0 && A.recv_bad == 0,
          "good: accepted once (%d), nothing before the accept (%d), in order (%d bad)", A.accepts, A.before_accept,
          A.recv_bad);
    for (int i = 0; i < B.n_sent; i++) CHECK(B.s[i].st == ST_OK, "good: send %d: %s", i, st_status_str(B.s[i].st));
    CHECK(cli_send(&B, N_GOOD, small_payload, 8) == ST_OK, "B sends after the handshake");
    CHECK(wait_for(good_more_done, 10), "good: one more each way (%d, %d)", A.received, B.replies);
    CHECK(B.lost == 0, "good: B not lost");
    st_tp_ep_close(B.ep);
    B.ep = NULL;
    CHECK(wait_for(b_closed_seen, 10), "good: A sees B leave");

    /* wrong secret: a fake server for C, an impostor for A */
    int acc0 = A.accepts, rec0 = A.received;
    client_init(&C, "C", &k2);
    CHECK(client_connect(&C, port), "C connects");
    for (uint64_t i = 0; i < 4; i++) CHECK(cli_send(&C, 100 + i, small_payload, 64) == ST_OK, "C posts (held)");
    CHECK(wait_for(c_lost, 10), "wrong: C's endpoint reported lost (%d) and its sends called back", C.lost);
    CHECK(C.lost == 1 && C.lost_why == ST_ERR_AUTH, "wrong: C lost once with ST_ERR_AUTH (%s)",
          st_status_str(C.lost_why));
    for (int i = 0; i < C.n_sent; i++) CHECK(C.s[i].st != ST_OK, "wrong: C's held send %d not sent", i);
    printf("wrong: C saw the fake server after %.1f ms\n", (C.t_lost - C.t_connect) * 1e3);

    /* raw: no secret, active messages at once */
    client_init(&D, "D", NULL);
    CHECK(client_connect(&D, port), "D connects");
    for (uint64_t i = 0; i < 4; i++) CHECK(cli_send(&D, 200 + i, small_payload, 64) == ST_OK, "D posts");
    CHECK(wait_for(d_lost, 10), "raw: D's endpoint closed by A (%d)", D.lost);
    printf("raw: D closed after %.1f ms\n", (D.t_lost - D.t_connect) * 1e3);

    /* silent: connect, say nothing */
    client_init(&E, "E", NULL);
    CHECK(client_connect(&E, port), "E connects");
    CHECK(wait_for(e_lost, HS_MS / 1e3 + 5), "silent: E closed by A");
    double dt = E.t_lost - E.t_connect;
    CHECK(E.lost == 1 && dt >= 0.8 * HS_MS / 1e3 && dt < HS_MS / 1e3 + 3,
          "silent: closed after %.3f s (timeout %.3f s)", dt, HS_MS / 1e3);
    printf("silent: E closed after %.1f ms\n", dt * 1e3);
    run_for(0.2); /* anything late would show now */
    CHECK(A.accepts == acc0 && A.received == rec0, "A accepted %d and received %d from C, D, E (want 0, 0)",
          A.accepts - acc0, A.received - rec0);

    /* mute: secure client, server without the secret (and without handlers) */
    CHECK(st_tp_create(&loop, &F) == ST_OK, "create F");
    uint16_t fport = 0;
    CHECK(st_tp_listen(F, "127.0.0.1", 0, f_accept, NULL, &fport) == ST_OK, "F listens");
    client_init(&G, "G", &k1);
    CHECK(client_connect(&G, fport), "G connects");
    CHECK(cli_send(&G, 300, small_payload, 64) == ST_OK, "G posts (held)");
    CHECK(wait_for(g_lost, HS_MS / 1e3 + 5), "mute: F closes G (%d)", G.lost);
    CHECK(G.lost == 1 && G.s[0].st != ST_OK, "mute: G lost once (%s), held send %s", st_status_str(G.lost_why),
          st_status_str(G.s[0].st));
    printf("mute: G closed after %.1f ms\n", (G.t_lost - G.t_connect) * 1e3);

    /* stalled: a TCP socket that never answers */
    int sfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t slen = sizeof sin;
    CHECK(sfd >= 0 && bind(sfd, (struct sockaddr *)&sin, sizeof sin) == 0 && listen(sfd, 8) == 0 &&
              getsockname(sfd, (struct sockaddr *)&sin, &slen) == 0,
          "a mute socket");
    client_init(&H, "H", &k1);
    CHECK(client_connect(&H, ntohs(sin.sin_port)), "H connects");
    CHECK(cli_send(&H, 400, small_payload, 64) == ST_OK, "H posts (held)");
    CHECK(wait_for(h_lost, HS_MS / 1e3 + 5), "stalled: H gives up (%d)", H.lost);
    dt = H.t_lost - H.t_connect;
    CHECK(H.lost == 1 && H.lost_why == ST_ERR_AUTH && H.s[0].st != ST_OK && dt >= 0.8 * HS_MS / 1e3,
          "stalled: H lost with %s after %.3f s, held send %s", st_status_str(H.lost_why), dt,
          st_status_str(H.s[0].st));
    printf("stalled: H gave up after %.1f ms\n", dt * 1e3);

    n = check_listeners("at the end", port, &saw);
    printf("end: %d LISTEN sockets of this process checked\n", n);

    client_t *all[] = {&B, &C, &D, &E, &G, &H};
    for (size_t i = 0; i < ST_ARRAY_LEN(all); i++) st_tp_destroy(all[i]->tp);
    st_tp_destroy(A.tp);
    st_tp_destroy(F);
    uv_timer_stop(&beat);
    uv_close((uv_handle_t *)&beat, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    CHECK(uv_loop_close(&loop) == 0, "loop closed cleanly");
    close(sfd);
    free(B.big);
    return st_test_done();
}
