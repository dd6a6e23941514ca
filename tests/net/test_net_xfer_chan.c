/* common/xfer channels: a server process (fork) answering a client's requests through one channel,
 * up to all slots in flight, thousands of rounds with every byte checked; the server's thread waits on
 * the doorbell only (no other wake-up); a killed server fails the client's wait fast with
 * ST_ERR_PEER naming it; an abort releases a server blocked in next; bad posts, lengths beyond the
 * caps written into shared memory, a non-channel region and a boot id that is not one are refused. */
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "strata/xfer.h"

#define SLOTS 4
#define REQ_CAP 65536
#define REP_CAP (2 * REQ_CAP)
#define ROUNDS 4000


typedef struct {
    uint32_t round, quit;
    uint64_t len;
} req_hdr_t;

static size_t req_len(uint32_t i) { return (size_t)((i * 2654435761u) % REQ_CAP) + (i % 3 == 0 ? 0 : 1); }

/* the server: reply = [request bytes + 1, then the request bytes reversed], header echoed + 1 */
static int server(int wr) {
    st_xfer_chan_t *c = NULL;
    uint8_t h[ST_XFER_HANDLE_BYTES];
    if (st_xfer_chan_create(SLOTS, REQ_CAP, REP_CAP, &c) || st_xfer_chan_export(c, h)) return 10;
    st_xfer_chan_label(c, "worker");
    if (st_fd_write_full(wr, h, sizeof h)) return 11;
    int idle = 0;
    for (;;) {
        uint32_t s;
        st_xfer_msg_t m;
        st_status_t rc = st_xfer_chan_next(c, 100, &s, &m);
        if (rc == ST_ERR_TIMEOUT && ++idle < 100) continue; /* idle polls; 10 s of silence ends it */
        if (rc) return 20;
        idle = 0;
        req_hdr_t q;
        if (m.hdr_len != sizeof q || m.len > REQ_CAP) return 21;
        memcpy(&q, m.hdr, sizeof q);
        if (q.quit) break;
        if (q.len != m.len) return 22;
        const uint8_t *in = m.payload;
        uint8_t *out = st_xfer_chan_rep_buf(c, s);
        for (size_t k = 0; k < m.len; k++) out[k] = (uint8_t)(in[k] + 1), out[m.len + k] = in[m.len - 1 - k];
        q.round++;
        if (st_xfer_chan_reply(c, s, &q, sizeof q, 2 * m.len)) return 23;
    }
    st_xfer_chan_destroy(c);
    return 0;
}

static uint8_t pat(uint32_t i, size_t k) { return (uint8_t)(i * 17 + k * 5 + (k >> 8)); }

static void test_rounds(void) {
    int p[2];
    CHECK(pipe(p) == 0, "pipe");
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        _exit(server(p[1]));
    }
    close(p[1]);
    uint8_t h[ST_XFER_HANDLE_BYTES];
    st_xfer_chan_t *c = NULL;
    CHECK(st_fd_read_full(p[0], h, sizeof h) == 0, "handle");
    CHECK(st_xfer_chan_open(h, sizeof h, &c) == ST_OK, "open: %s", st_err_last());
    if (!c) return;
    CHECK(st_xfer_chan_slots(c) == SLOTS && st_xfer_chan_req_cap(c) == REQ_CAP && st_xfer_chan_rep_cap(c) == REP_CAP,
          "shape %u %zu %zu", st_xfer_chan_slots(c), st_xfer_chan_req_cap(c), st_xfer_chan_rep_cap(c));
    st_xfer_chan_label(c, "es-chan");
    uint32_t in_slot[SLOTS] = {0}; /* round in flight per slot, 0 none */
    size_t bad = 0;
    int done = 0, posted = 0;
    uint64_t t0 = st_time_ns();
    /* keep `depth` slots in flight (1 .. SLOTS, changing every 500 rounds), answered in post order */
    for (uint32_t i = 1; done < ROUNDS && bad == 0;) {
        int depth = 1 + (int)((i / 500) % SLOTS);
        while (posted - done < depth && (int)i <= ROUNDS) {
            uint32_t s = i % SLOTS;
            if (in_slot[s]) break;
            size_t n = req_len(i);
            uint8_t *b = st_xfer_chan_req_buf(c, s);
            for (size_t k = 0; k < n; k++) b[k] = pat(i, k);
            req_hdr_t q = {.round = i, .len = n};
            if (st_xfer_chan_post(c, s, &q, sizeof q, n) != ST_OK) { bad++; break; }
            in_slot[s] = i++;
            posted++;
        }
        uint32_t s = (uint32_t)(done + 1) % SLOTS, r = in_slot[s];
        st_xfer_msg_t m;
        if (!r || st_xfer_chan_wait_reply(c, s, 10000, &m) != ST_OK) { bad++; break; }
        req_hdr_t q;
        memcpy(&q, m.hdr, sizeof q);
        size_t n = req_len(r);
        bad += m.hdr_len != sizeof q || q.round != r + 1 || m.len != 2 * n;
        const uint8_t *o = m.payload;
        for (size_t k = 0; bad == 0 && k < n; k++) bad += o[k] != (uint8_t)(pat(r, k) + 1) || o[n + k] != pat(r, n - 1 - k);
        in_slot[s] = 0;
        done++;
    }
    double ms = (double)(st_time_ns() - t0) / 1e6;
    CHECK(bad == 0 && done == ROUNDS, "%d of %d rounds, %zu bad: %s", done, ROUNDS, bad, bad ? st_err_last() : "");
    printf("channel: %d requests (0..64 KB, replies twice as large, 1..%d in flight) in %.1f ms\n", done, SLOTS, ms);
    /* busy slot and oversized posts are the caller's bugs: refused */
    req_hdr_t q = {.quit = 0};
    CHECK(st_xfer_chan_post(c, 0, &q, sizeof q, REQ_CAP + 1) == ST_ERR_INVALID_ARG, "payload over the cap");
    CHECK(st_xfer_chan_post(c, 0, &q, ST_XFER_MSG_HDR + 1, 0) == ST_ERR_INVALID_ARG, "header over the cap");
    CHECK(st_xfer_chan_post(c, SLOTS, &q, sizeof q, 0) == ST_ERR_INVALID_ARG, "slot out of range");
    st_xfer_msg_t m;
    CHECK(st_xfer_chan_wait_reply(c, 1, 10, &m) == ST_ERR_INVALID_ARG, "wait on an idle slot");
    /* the server leaves: kill it while a request is pending; the wait fails fast naming it */
    q.round = 1;
    q.len = 0;
    CHECK(st_xfer_chan_post(c, 0, &q, sizeof q, 0) == ST_OK && st_xfer_chan_wait_reply(c, 0, 5000, &m) == ST_OK,
          "one more round");
    kill(pid, SIGSTOP); /* stopped: it cannot answer, but it is alive */
    CHECK(st_xfer_chan_post(c, 1, &q, sizeof q, 0) == ST_OK, "post");
    st_status_t rc = st_xfer_chan_wait_reply(c, 1, 150, &m);
    CHECK(rc == ST_ERR_TIMEOUT && strstr(st_err_last(), "es-chan"), "stopped server: rc %d %s", rc, st_err_last());
    kill(pid, SIGKILL);
    uint64_t t1 = st_time_ns();
    CHECK(st_xfer_chan_post(c, 2, &q, sizeof q, 0) == ST_OK, "post to a dead server (nothing checks yet)");
    rc = st_xfer_chan_wait_reply(c, 2, 20000, &m);
    ms = (double)(st_time_ns() - t1) / 1e6;
    CHECK(rc == ST_ERR_PEER && ms < 2000 && strstr(st_err_last(), "es-chan"), "killed server: rc %d after %.0f ms: %s",
          rc, ms, st_err_last());
    waitpid(pid, NULL, 0);
    st_xfer_chan_destroy(c);
    close(p[0]);
}

static void *aborter(void *arg) {
    usleep(30000);
    st_xfer_chan_abort(arg, "stopping");
    return NULL;
}

static void test_local(void) {
    st_xfer_chan_t *srv = NULL, *cli = NULL;
    uint8_t h[ST_XFER_HANDLE_BYTES];
    CHECK(st_xfer_chan_create(0, 1, 1, &srv) == ST_ERR_INVALID_ARG, "0 slots");
    CHECK(st_xfer_chan_create(ST_XFER_CHAN_MAX_SLOTS + 1, 1, 1, &srv) == ST_ERR_INVALID_ARG, "too many slots");
    CHECK(st_xfer_chan_create(2, ST_XFER_MAX_BYTES, 1, &srv) == ST_ERR_INVALID_ARG, "too large");
    /* a plain region is not a channel */
    st_xfer_region_t *r = NULL;
    CHECK(st_xfer_region_create(ST_XFER_HOST, 8192, &r) == ST_OK && st_xfer_region_export(r, h) == ST_OK, "region");
    CHECK(st_xfer_chan_open(h, sizeof h, &cli) == ST_ERR_PROTOCOL, "plain region opened as a channel");
    st_xfer_region_destroy(r);
    /* both ends in this process (a host region opens in its own process too) */
    CHECK(st_xfer_chan_create(SLOTS, 1000, 2000, &srv) == ST_OK && st_xfer_chan_export(srv, h) == ST_OK, "create");
    CHECK(st_xfer_chan_open(h, sizeof h - 1, &cli) == ST_ERR_INVALID_ARG, "short handle");
    CHECK(st_xfer_chan_open(h, sizeof h, &cli) == ST_OK, "open: %s", st_err_last());
    if (!srv || !cli) return;
    uint32_t s = 99;
    st_xfer_msg_t m;
    uint64_t t0 = st_time_ns();
    CHECK(st_xfer_chan_next(srv, 30, &s, &m) == ST_ERR_TIMEOUT && s == 99, "idle next");
    CHECK((st_time_ns() - t0) / 1000000 >= 30, "idle next waited its 30 ms");
    memcpy(st_xfer_chan_req_buf(cli, 3), "abc", 3);
    CHECK(st_xfer_chan_post(cli, 3, "H", 1, 3) == ST_OK, "post");
    CHECK(st_xfer_chan_post(cli, 3, "H", 1, 3) == ST_ERR_INVALID_ARG, "a busy slot is refused");
    CHECK(!st_xfer_chan_reply_in(cli, 3) && st_xfer_chan_reply_in(cli, 2), "reply_in: pending and idle slots");
    CHECK(st_xfer_chan_next(srv, 1000, &s, &m) == ST_OK && s == 3 && m.len == 3 && m.hdr_len == 1 &&
              !memcmp(m.payload, "abc", 3) && !memcmp(m.hdr, "H", 1),
          "request seen in place");
    CHECK(st_xfer_chan_reply(srv, 3, NULL, 0, 2001) == ST_ERR_INVALID_ARG, "reply over the cap");
    memcpy(st_xfer_chan_rep_buf(srv, 3), "xyz!", 4);
    CHECK(st_xfer_chan_reply(srv, 3, "R", 1, 4) == ST_OK, "reply");
    CHECK(st_xfer_chan_reply_in(cli, 3), "reply_in after the reply");
    uint64_t t_before = st_time_ns();
    CHECK(st_xfer_chan_wait_reply(cli, 3, 1000, &m) == ST_OK && m.len == 4 && !memcmp(m.payload, "xyz!", 4), "reply seen");
    CHECK(m.sent_ns > t0 && m.sent_ns <= t_before, "reply stamped when sent: %llu in (%llu, %llu]",
          (unsigned long long)m.sent_ns, (unsigned long long)t0, (unsigned long long)t_before);
    /* lengths beyond the caps written into the shared control block (byte map in chan.c: the data
     * starts at 512 for 4 slots, slot 0's control block at 128, its request payload length at +24) */
    uint8_t *base = (uint8_t *)st_xfer_chan_req_buf(cli, 0) - ST_XFER_MSG_HDR - 512;
    CHECK(st_xfer_chan_post(cli, 0, NULL, 0, 10) == ST_OK, "post");
    uint64_t huge = 1u << 30;
    memcpy(base + 128 + 24, &huge, 8);
    CHECK(st_xfer_chan_next(srv, 1000, &s, &m) == ST_ERR_PROTOCOL, "request longer than the cap refused");
    CHECK(st_xfer_chan_reply(srv, 0, NULL, 0, 0) == ST_OK, "answer it anyway");
    uint32_t hl = ST_XFER_MSG_HDR + 1;
    memcpy(base + 128 + 20, &hl, 4); /* the client's view of the reply header length */
    CHECK(st_xfer_chan_wait_reply(cli, 0, 1000, &m) == ST_ERR_PROTOCOL, "reply header over the cap refused");
    /* an abort ends a server's next at once */
    pthread_t th;
    pthread_create(&th, NULL, aborter, srv);
    t0 = st_time_ns();
    st_status_t rc = st_xfer_chan_next(srv, 20000, &s, &m);
    double ms = (double)(st_time_ns() - t0) / 1e6;
    pthread_join(th, NULL);
    CHECK(rc == ST_ERR_PEER && ms < 2000 && strstr(st_err_last(), "stopping"), "abort: rc %d after %.0f ms", rc, ms);
    st_xfer_chan_destroy(cli);
    st_xfer_chan_destroy(srv);
    char id[37], id2[37];
    CHECK(st_xfer_host_id(id) == ST_OK && strlen(id) == 36 && id[8] == '-' && id[13] == '-', "boot id %s", id);
    CHECK(st_xfer_host_id(id2) == ST_OK && !strcmp(id, id2), "boot id stable");
    st_xfer_hello_t he, got;
    CHECK(st_xfer_hello_init(&he, 2, 12345) == ST_OK && st_xfer_hello_check(&he, sizeof he, &got) == ST_OK &&
              got.n_slots == 2 && got.req_bytes == 12345,
          "hello from this host");
    CHECK(st_xfer_hello_check(&he, sizeof he - 1, &got) == ST_ERR_PROTOCOL, "short hello");
    st_xfer_hello_t bad = he;
    bad.host[0] = bad.host[0] == '0' ? '1' : '0';
    CHECK(st_xfer_hello_check(&bad, sizeof bad, &got) == ST_ERR_UNSUPPORTED, "hello from another host");
    bad = he;
    bad.n_slots = 0;
    CHECK(st_xfer_hello_check(&bad, sizeof bad, &got) == ST_ERR_PROTOCOL, "hello for 0 slots");
    bad = he;
    bad.host[36] = 'x';
    CHECK(st_xfer_hello_check(&bad, sizeof bad, &got) == ST_ERR_PROTOCOL, "unterminated boot id");
}

/* An idle server's polls spin only within the data path's spin of its last request, then sleep: six
 * 50 ms polls after a request, with a 100 ms spin, spin ~100 ms in all (each spun its 50 ms before). */
static void test_idle_poll(void) {
    CHECK(st_tun_set("XFER_SPIN_US", "100000") == ST_OK, "XFER_SPIN_US=100000");
    st_xfer_set_spin(false);
    st_xfer_chan_t *srv = NULL, *cli = NULL;
    uint8_t h[ST_XFER_HANDLE_BYTES];
    CHECK(st_xfer_chan_create(2, 64, 64, &srv) == ST_OK && st_xfer_chan_export(srv, h) == ST_OK &&
              st_xfer_chan_open(h, sizeof h, &cli) == ST_OK,
          "channel: %s", st_err_last());
    uint32_t s;
    st_xfer_msg_t m;
    if (srv && cli) {
        CHECK(st_xfer_chan_post(cli, 0, NULL, 0, 1) == ST_OK && st_xfer_chan_next(srv, 1000, &s, &m) == ST_OK, "a request");
        struct timespec a, b;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
        int idle = 0;
        for (int i = 0; i < 6; i++) idle += st_xfer_chan_next(srv, 50, &s, &m) == ST_ERR_TIMEOUT;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
        double cpu_ms = (double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) / 1e6;
        CHECK(idle == 6 && cpu_ms < 200, "six idle 50 ms polls took %.0f ms of CPU (300 when each spins)", cpu_ms);
    }
    st_xfer_chan_destroy(cli);
    st_xfer_chan_destroy(srv);
    CHECK(st_tun_set("XFER_SPIN_US", "30") == ST_OK, "XFER_SPIN_US=30");
    st_xfer_set_spin(false);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    test_idle_poll();
    test_local();
    test_rounds();
    return st_test_done();
}
