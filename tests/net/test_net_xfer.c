/* common/xfer's host backend between two processes (fork; handles travel over a pipe, as they would
 * over the control connection): puts + signals in both directions for many rounds with the data
 * checked (some rounds slow enough that the waiter sleeps on the futex); a waiter fails fast with
 * ST_ERR_PEER when the peer is killed (-9), on either side of a region; a peer that never signals
 * times out; an abort from another thread releases a waiter; bad, short, foreign, tampered, reused
 * and world-readable handles are refused; the shared-memory name is gone once both sides mapped. */
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "strata/xfer.h"

#define SLOT 65536          /* data bytes per direction */
#define FLAG_OFF SLOT       /* the flag after the data */
#define REGION (SLOT + 64)
#define ROUNDS 3000

static void write_all(int fd, const void *p, size_t n) {
    if (st_fd_write_full(fd, p, n)) _exit(90);
}

static size_t round_bytes(int i) { return (size_t)((i * 7919) % SLOT) + 1; }
static uint8_t pat(int i, size_t k, int dir) { return (uint8_t)(i * 31 + (int)k * 7 + dir * 101); }

/* the child of the ping-pong: owns region B (parent → child), opens region A (child → parent) */
static int child_pingpong(int rd, int wr) {
    st_xfer_region_t *b = NULL, *a = NULL;
    uint8_t h[ST_XFER_HANDLE_BYTES];
    if (st_xfer_region_create(ST_XFER_HOST, REGION, &b) != ST_OK) return 10;
    st_xfer_region_label(b, "parent");
    if (st_xfer_region_export(b, h) != ST_OK) return 11;
    write_all(wr, h, sizeof h);
    if (st_fd_read_full(rd, h, sizeof h)) return 12;
    if (st_xfer_region_open(h, sizeof h, REGION, &a) != ST_OK) return 13;
    uint8_t *in = st_xfer_region_ptr(b), *out = st_xfer_region_ptr(a);
    for (int i = 1; i <= ROUNDS; i++) {
        if (st_xfer_wait_host(b, FLAG_OFF, (uint32_t)i, 10000) != ST_OK) return 20;
        size_t n = round_bytes(i);
        for (size_t k = 0; k < n; k++)
            if (in[k] != pat(i, k, 0)) return 21;
        if (i % 97 == 0) usleep(3000); /* the parent sleeps on the futex: the wake must reach it */
        for (size_t k = 0; k < n; k++) out[k] = pat(i, k, 1);
        if (st_xfer_signal_host(a, FLAG_OFF, (uint32_t)i) != ST_OK) return 22;
    }
    st_xfer_region_destroy(a);
    st_xfer_region_destroy(b);
    return 0;
}

static void test_pingpong(void) {
    int p2c[2], c2p[2];
    CHECK(pipe(p2c) == 0 && pipe(c2p) == 0, "pipes");
    pid_t pid = fork();
    if (pid == 0) {
        close(p2c[1]), close(c2p[0]);
        _exit(child_pingpong(p2c[0], c2p[1]));
    }
    close(p2c[0]), close(c2p[1]);
    st_xfer_region_t *a = NULL, *b = NULL;
    uint8_t h[ST_XFER_HANDLE_BYTES], hb[ST_XFER_HANDLE_BYTES];
    CHECK(st_xfer_region_create(ST_XFER_HOST, REGION, &a) == ST_OK, "create A: %s", st_err_last());
    st_xfer_region_label(a, "child");
    CHECK(st_xfer_region_export(a, h) == ST_OK, "export A");
    CHECK(st_fd_read_full(c2p[0], hb, sizeof hb) == 0, "B's handle");
    write_all(p2c[1], h, sizeof h);
    CHECK(st_xfer_region_open(hb, sizeof hb, REGION, &b) == ST_OK, "open B: %s", st_err_last());
    /* the opener unlinked B's name: nothing is left in /dev/shm for it */
    char path[128];
    snprintf(path, sizeof path, "/dev/shm%s", (const char *)hb + 32);
    struct stat st;
    CHECK(stat(path, &st) != 0, "%s still exists after both sides mapped it", path);
    int bad = 0, waits = 0;
    uint8_t *out = b ? st_xfer_region_ptr(b) : NULL, *in = a ? st_xfer_region_ptr(a) : NULL;
    uint64_t t0 = st_time_ns();
    for (int i = 1; b && a && i <= ROUNDS; i++) {
        size_t n = round_bytes(i);
        for (size_t k = 0; k < n; k++) out[k] = pat(i, k, 0);
        if (st_xfer_signal_host(b, FLAG_OFF, (uint32_t)i) != ST_OK) { bad++; break; }
        if (st_xfer_wait_host(a, FLAG_OFF, (uint32_t)i, 10000) != ST_OK) { bad++; break; }
        waits++;
        for (size_t k = 0; k < n; k++) bad += in[k] != pat(i, k, 1);
    }
    double ms = (double)(st_time_ns() - t0) / 1e6;
    CHECK(bad == 0 && waits == ROUNDS, "ping-pong: %d rounds of %d, %d bad bytes", waits, ROUNDS, bad);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child exit %d", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    printf("ping-pong: %d rounds (1..%d bytes each way) in %.1f ms\n", waits, SLOT, ms);
    st_xfer_region_destroy(b);
    st_xfer_region_destroy(a);
    close(p2c[1]), close(c2p[0]);
}

/* child_owner 1: the child creates the region and the parent opens it; 0: the other way round.
 * Then the child is killed and the parent's wait must fail with ST_ERR_PEER, quickly. */
static void test_peer_killed(int child_owner) {
    int p2c[2], c2p[2];
    CHECK(pipe(p2c) == 0 && pipe(c2p) == 0, "pipes");
    pid_t pid = fork();
    if (pid == 0) {
        close(p2c[1]), close(c2p[0]);
        uint8_t h[ST_XFER_HANDLE_BYTES];
        st_xfer_region_t *r = NULL;
        if (child_owner) {
            if (st_xfer_region_create(ST_XFER_HOST, REGION, &r) || st_xfer_region_export(r, h)) _exit(10);
            write_all(c2p[1], h, sizeof h);
        } else {
            if (st_fd_read_full(p2c[0], h, sizeof h) || st_xfer_region_open(h, sizeof h, REGION, &r)) _exit(11);
            write_all(c2p[1], "k", 1);
        }
        for (;;) pause();
    }
    close(p2c[0]), close(c2p[1]);
    st_xfer_region_t *r = NULL;
    uint8_t h[ST_XFER_HANDLE_BYTES];
    char ok = 0;
    if (child_owner) {
        CHECK(st_fd_read_full(c2p[0], h, sizeof h) == 0, "handle from child");
        CHECK(st_xfer_region_open(h, sizeof h, REGION, &r) == ST_OK, "open: %s", st_err_last());
    } else {
        CHECK(st_xfer_region_create(ST_XFER_HOST, REGION, &r) == ST_OK, "create");
        CHECK(st_xfer_region_export(r, h) == ST_OK, "export");
        write_all(p2c[1], h, sizeof h);
        CHECK(st_fd_read_full(c2p[0], &ok, 1) == 0 && ok == 'k', "child opened");
    }
    if (r) {
        st_xfer_region_label(r, "es-test");
        /* alive and silent: a short wait times out */
        uint64_t t0 = st_time_ns();
        st_status_t rc = st_xfer_wait_host(r, FLAG_OFF, 1, 200);
        double ms = (double)(st_time_ns() - t0) / 1e6;
        CHECK(rc == ST_ERR_TIMEOUT && ms >= 200 && ms < 3000, "silent peer: rc %d after %.0f ms", rc, ms);
        CHECK(strstr(st_err_last(), "es-test") && strstr(st_err_last(), "did not signal"), "timeout text: %s",
              st_err_last());
        kill(pid, SIGKILL);
        t0 = st_time_ns();
        rc = st_xfer_wait_host(r, FLAG_OFF, 1, 20000);
        ms = (double)(st_time_ns() - t0) / 1e6;
        CHECK(rc == ST_ERR_PEER && ms < 2000, "killed %s: rc %d after %.0f ms (bound 20 s)",
              child_owner ? "owner" : "opener", rc, ms);
        CHECK(strstr(st_err_last(), "es-test") && strstr(st_err_last(), "exited"), "peer-dead text: %s", st_err_last());
        printf("peer killed (%s): ST_ERR_PEER after %.1f ms: %s\n", child_owner ? "owner" : "opener", ms, st_err_last());
    }
    waitpid(pid, NULL, 0);
    st_xfer_region_destroy(r);
    close(p2c[1]), close(c2p[0]);
}

static void *aborter(void *arg) {
    usleep(50000);
    st_xfer_region_abort(arg, "expert server es7 lost (connection closed)");
    return NULL;
}

static void test_abort(void) {
    st_xfer_region_t *r = NULL;
    CHECK(st_xfer_region_create(ST_XFER_HOST, REGION, &r) == ST_OK, "create");
    if (!r) return;
    st_xfer_region_label(r, "es7");
    pthread_t th;
    pthread_create(&th, NULL, aborter, r);
    uint64_t t0 = st_time_ns();
    st_status_t rc = st_xfer_wait_host(r, FLAG_OFF, 3, 20000);
    double ms = (double)(st_time_ns() - t0) / 1e6;
    pthread_join(th, NULL);
    CHECK(rc == ST_ERR_PEER && ms >= 45 && ms < 2000, "abort: rc %d after %.0f ms", rc, ms);
    CHECK(strstr(st_err_last(), "es7 lost"), "abort text: %s", st_err_last());
    /* met flags still read as met after an abort (the data arrived) */
    CHECK(st_xfer_signal_host(r, FLAG_OFF, 3) == ST_OK && st_xfer_wait_host(r, FLAG_OFF, 3, 10) == ST_OK,
          "met after abort");
    st_xfer_region_destroy(r);
}

static st_status_t open_tampered(const uint8_t *h, int at, uint8_t xor_, st_xfer_region_t **r) {
    uint8_t t[ST_XFER_HANDLE_BYTES];
    memcpy(t, h, sizeof t);
    t[at] ^= xor_;
    return st_xfer_region_open(t, sizeof t, 0, r);
}

static void test_bad_handles(void) {
    st_xfer_region_t *own = NULL, *r = NULL;
    uint8_t h[ST_XFER_HANDLE_BYTES];
    CHECK(st_xfer_region_create(ST_XFER_HOST, 0, &own) == ST_ERR_INVALID_ARG, "0 bytes refused");
    CHECK(st_xfer_region_create(ST_XFER_HOST, 10000, &own) == ST_OK, "create");
    if (!own) return;
    CHECK(st_xfer_region_export(own, h) == ST_OK, "export");
    char path[128];
    snprintf(path, sizeof path, "/dev/shm%s", (const char *)h + 32);
    struct stat st;
    CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0600, "%s mode %03o", path, (unsigned)(st.st_mode & 0777));

    CHECK(st_xfer_region_open(h, ST_XFER_HANDLE_BYTES - 1, 0, &r) == ST_ERR_INVALID_ARG, "short handle");
    CHECK(st_xfer_region_open(NULL, ST_XFER_HANDLE_BYTES, 0, &r) == ST_ERR_INVALID_ARG, "NULL handle");
    CHECK(open_tampered(h, 0, 0x01, &r) == ST_ERR_PROTOCOL, "bad magic");
    CHECK(open_tampered(h, 4, 0x02, &r) == ST_ERR_PROTOCOL, "bad version");
    CHECK(open_tampered(h, 6, 0x04, &r) == ST_ERR_PROTOCOL, "bad kind");
    CHECK(open_tampered(h, 100, 0x01, &r) == ST_ERR_PROTOCOL, "reserved byte set");
    CHECK(open_tampered(h, 32 + 20, 0x40, &r) == ST_ERR_PROTOCOL, "non-hex name");
    CHECK(open_tampered(h, 32 + 1, 0x01, &r) == ST_ERR_PROTOCOL, "foreign name prefix");
    CHECK(open_tampered(h, 32 + 60, 0x2f, &r) == ST_ERR_PROTOCOL, "bytes after the name");
    CHECK(open_tampered(h, 32 + 44, h[32 + 44] == '0' ? '0' ^ '1' : h[32 + 44] ^ '0', &r) == ST_ERR_PEER,
          "no such region"); /* the last hex digit changed (to '1' or '0') */
    CHECK(open_tampered(h, 9, 0x01, &r) == ST_ERR_PROTOCOL, "size differs from the object");
    CHECK(open_tampered(h, 16, 0x01, &r) == ST_ERR_PROTOCOL, "nonce differs from the region's");
    CHECK(open_tampered(h, 15, 0x10, &r) == ST_ERR_PROTOCOL, "absurd size");
    CHECK(st_xfer_region_open(h, sizeof h, 20000, &r) == ST_ERR_PROTOCOL, "smaller than min_bytes");
#ifndef STRATA_XFER_GPU
    CHECK(st_xfer_region_create(ST_XFER_DEVICE, 4096, &r) == ST_ERR_UNSUPPORTED, "device region in the CPU build");
    CHECK(open_tampered(h, 6, 0x01 ^ 0x02, &r) == ST_ERR_UNSUPPORTED, "device handle in the CPU build");
#endif
    /* open to others: refused */
    CHECK(chmod(path, 0644) == 0, "chmod");
    CHECK(st_xfer_region_open(h, sizeof h, 0, &r) == ST_ERR_PROTOCOL, "world-readable region refused");
    CHECK(chmod(path, 0600) == 0, "chmod back");
    /* none of the refusals consumed it: the genuine handle opens once, then never again */
    CHECK(st_xfer_region_open(h, sizeof h, 10000, &r) == ST_OK, "genuine handle: %s", st_err_last());
    st_xfer_region_t *r2 = NULL;
    CHECK(st_xfer_region_open(h, sizeof h, 0, &r2) == ST_ERR_PEER && !r2, "second open refused");
    CHECK(stat(path, &st) != 0, "name unlinked after the open");
    if (r) {
        CHECK(st_xfer_region_export(r, h) == ST_ERR_INVALID_ARG, "an opened region is not exported again");
        /* bounds */
        uint8_t x[16] = {0};
        CHECK(st_xfer_put_host(r, 10000 - 16, x, 16) == ST_OK, "put at the end");
        CHECK(st_xfer_put_host(r, 10000 - 15, x, 16) == ST_ERR_OUT_OF_RANGE, "put past the end");
        CHECK(st_xfer_put_host(r, SIZE_MAX, x, 2) == ST_ERR_OUT_OF_RANGE, "put at SIZE_MAX");
        CHECK(st_xfer_signal_host(r, 4, 1) == ST_ERR_INVALID_ARG, "misaligned flag");
        CHECK(st_xfer_signal_host(r, 10000, 1) == ST_ERR_OUT_OF_RANGE, "flag past the end");
        CHECK(st_xfer_wait_host(r, 0, 1, 0) == ST_ERR_INVALID_ARG, "unbounded wait refused");
        /* the two mappings are the same memory */
        CHECK(st_xfer_put_host(r, 64, "hello", 6) == ST_OK && memcmp((uint8_t *)st_xfer_region_ptr(own) + 64, "hello", 6) == 0,
              "shared bytes");
        CHECK(st_xfer_signal_host(own, 128, 9) == ST_OK && st_xfer_test_host(r, 128, 9) && !st_xfer_test_host(r, 128, 10),
              "shared flag");
    }
    st_xfer_region_destroy(r);
    st_xfer_region_destroy(own);
    /* a region nobody opened leaves nothing behind */
    CHECK(st_xfer_region_create(ST_XFER_HOST, 100, &own) == ST_OK && st_xfer_region_export(own, h) == ST_OK, "create 2");
    snprintf(path, sizeof path, "/dev/shm%s", (const char *)h + 32);
    st_xfer_region_destroy(own);
    CHECK(stat(path, &st) != 0, "%s left behind", path);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    test_bad_handles();
    test_abort();
    test_peer_killed(0);
    test_peer_killed(1);
    test_pingpong();
    /* the same with every wait asleep at once (XFER_SPIN_US 0: the futex path) and with the 2 ms spin
     * of a GPU role (the forked child inherits the setting) */
    const char *spins[] = {"0", "2000"};
    for (int i = 0; i < 2; i++) {
        CHECK(st_tun_set("XFER_SPIN_US", spins[i]) == ST_OK, "XFER_SPIN_US=%s: %s", spins[i], st_err_last());
        st_xfer_set_spin(false);
        printf("XFER_SPIN_US=%s: ", spins[i]);
        test_pingpong();
    }
    return st_test_done();
}
