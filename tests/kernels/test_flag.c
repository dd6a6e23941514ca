/* The transfer layer's CPU flags (kernels/flag.c, the twins of kernels/flag.cu): met / not met
 * modulo 2^32 and with an epoch, a wait that sees a signal from another thread together with the
 * data written before it, a bounded wait that times out and raises the error word, and a wait that
 * returns at once once the error word is set. */
#include <pthread.h>
#include <unistd.h>

#include "harness.h"
#include "strata/kernels.h"

static uint32_t g_flag, g_data[256];

static void *signaller(void *arg) {
    (void)arg;
    usleep(5000);
    for (int i = 0; i < 256; i++) g_data[i] = 1000u + (uint32_t)i;
    st_flag_signal(&g_flag, 7, NULL);
    return NULL;
}

int main(void) {
    uint32_t f = 0, epoch = 100, err = 0;
    CHECK(!st_flag_met(&f, 1, NULL), "0 does not meet 1");
    st_flag_signal(&f, 1, NULL);
    CHECK(f == 1 && st_flag_met(&f, 1, NULL) && !st_flag_met(&f, 2, NULL), "flag %u", f);
    f = 0xfffffff0u; /* wrap: 0x10 is 32 steps after 0xfffffff0 */
    CHECK(!st_flag_met(&f, 0x10u, NULL), "0xfffffff0 must not meet 0x10");
    st_flag_signal(&f, 0x10u, NULL);
    CHECK(st_flag_met(&f, 0x10u, NULL) && st_flag_met(&f, 0xfffffff8u, NULL), "wrapped flag %u", f);
    f = 0;
    st_flag_signal(&f, 5, &epoch);
    CHECK(f == 105 && st_flag_met(&f, 5, &epoch) && !st_flag_met(&f, 6, &epoch) && st_flag_met(&f, 105, NULL),
          "epoch: flag %u", f);

    /* met already: true at once, err untouched */
    CHECK(st_flag_wait(&f, 5, &epoch, 1000, &err) && err == 0, "met wait, err %u", err);

    /* timeout: false after >= timeout, err raised */
    uint64_t t0 = st_time_ns();
    bool ok = st_flag_wait(&f, 6, &epoch, 20 * 1000000ull, &err);
    double ms = (double)(st_time_ns() - t0) / 1e6;
    CHECK(!ok && err == ST_FLAG_ERR_TIMEOUT && ms >= 20.0 && ms < 2000.0, "timeout: ok %d err %u after %.1f ms", ok,
          err, ms);
    /* err set: the next wait returns at once (a chain of waits drains) */
    t0 = st_time_ns();
    ok = st_flag_wait(&f, 6, &epoch, 10ull * 1000000000ull, &err);
    ms = (double)(st_time_ns() - t0) / 1e6;
    CHECK(!ok && ms < 100.0, "wait with err set returned %d after %.1f ms", ok, ms);
    /* no err word: a timeout only returns false */
    CHECK(!st_flag_wait(&f, 6, &epoch, 1000000, NULL), "timeout without err word");

    /* another thread: the data written before the signal is seen after the wait */
    pthread_t th;
    pthread_create(&th, NULL, signaller, NULL);
    err = 0;
    ok = st_flag_wait(&g_flag, 7, NULL, 10ull * 1000000000ull, &err);
    int bad = 0;
    for (int i = 0; i < 256; i++) bad += g_data[i] != 1000u + (uint32_t)i;
    CHECK(ok && err == 0 && bad == 0, "cross-thread wait ok %d err %u, %d stale words", ok, err, bad);
    pthread_join(th, NULL);
    return st_test_done();
}
