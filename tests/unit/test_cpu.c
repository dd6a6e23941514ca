/* common/base CPU split of a role (CONTROL_CPUS): CPU lists are parsed strictly (and the table
 * refuses a bad one); a CPU the kernel refuses leaves every thread where it was; st_cpu_control moves
 * the calling thread (and the threads it starts later) to the control CPUs, st_cpu_data_thread moves
 * a data-path thread back to the process's other CPUs and names it. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>

#include "harness.h"
#include "strata/base.h"

static cpu_set_t g_seen;
static char g_name[32];

static void *data_thread(void *arg) {
    (void)arg;
    st_cpu_data_thread("st-test-data");
    pthread_getaffinity_np(pthread_self(), sizeof g_seen, &g_seen);
    pthread_getname_np(pthread_self(), g_name, sizeof g_name);
    return NULL;
}

static void *plain_thread(void *arg) {
    (void)arg;
    pthread_getaffinity_np(pthread_self(), sizeof g_seen, &g_seen);
    return NULL;
}

static void run(void *(*fn)(void *)) {
    pthread_t t;
    CHECK(pthread_create(&t, NULL, fn, NULL) == 0, "thread");
    pthread_join(t, NULL);
}

int main(void) {
    uint64_t m[ST_CPU_MAX / 64];
    CHECK(st_cpu_list_parse("0-3,8", m) == 0 && m[0] == 0x10full && !m[1], "0-3,8");
    CHECK(st_cpu_list_parse("1023", m) == 0 && m[15] == 1ull << 63, "the last CPU");
    CHECK(st_cpu_list_parse("", m) == 0 && !m[0], "empty: no CPU");
    const char *bad[] = {"3,1", "1-", "-1", "2-1", "1,,2", "1,", "a", "1024", " 1", "1 ", "0-1,1", "+1", "99999999999999999999"};
    for (size_t i = 0; i < ST_ARRAY_LEN(bad); i++) CHECK(st_cpu_list_parse(bad[i], NULL) == -1, "'%s' refused", bad[i]);
    CHECK(st_tun_set("CONTROL_CPUS", "3,1") == ST_ERR_INVALID_ARG && strstr(st_err_last(), "CPU list"),
          "the table refuses a bad list: %s", st_err_last());
    CHECK(!strcmp(st_tun_str(ST_TUN_CONTROL_CPUS), ""), "the default: unset");

    cpu_set_t proc, now;
    CHECK(sched_getaffinity(0, sizeof proc, &proc) == 0, "affinity");
    int last = -1;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &proc)) last = c;

    /* unset: nothing moves, the thread is named */
    st_cpu_control("test");
    run(data_thread);
    CHECK(CPU_EQUAL(&g_seen, &proc) && !strcmp(g_name, "st-test-data"), "unset: no move; named '%s'", g_name);

    /* a CPU this process may not use (or that does not exist): a warning, nothing moves */
    int absent = -1;
    for (int c = ST_CPU_MAX - 1; c >= 0 && absent < 0; c--)
        if (!CPU_ISSET(c, &proc)) absent = c;
    char list[32];
    if (absent >= 0) {
        snprintf(list, sizeof list, "%d", absent);
        CHECK(st_tun_set("CONTROL_CPUS", list) == ST_OK, "CONTROL_CPUS=%s", list);
        st_cpu_control("test");
        sched_getaffinity(0, sizeof now, &now);
        run(data_thread);
        CHECK(CPU_EQUAL(&now, &proc) && CPU_EQUAL(&g_seen, &proc), "CPU %d refused by the kernel: nothing moved", absent);
    }

    /* the last CPU for control: this thread and the threads it starts there, the data path on the rest */
    snprintf(list, sizeof list, "%d", last);
    CHECK(st_tun_set("CONTROL_CPUS", list) == ST_OK, "CONTROL_CPUS=%s", list);
    st_cpu_control("test");
    cpu_set_t ctl, data;
    CPU_ZERO(&ctl);
    CPU_SET(last, &ctl);
    CPU_XOR(&data, &proc, &ctl);
    if (!CPU_COUNT(&data)) data = proc; /* one CPU: the data path shares it */
    sched_getaffinity(0, sizeof now, &now);
    CHECK(CPU_EQUAL(&now, &ctl), "the calling thread on CPU %d", last);
    run(plain_thread);
    CHECK(CPU_EQUAL(&g_seen, &ctl), "a thread it starts follows it");
    run(data_thread);
    CHECK(CPU_EQUAL(&g_seen, &data) && CPU_COUNT(&g_seen) == (CPU_COUNT(&proc) > 1 ? CPU_COUNT(&proc) - 1 : 1),
          "a data-path thread on the other %d CPU(s)", CPU_COUNT(&g_seen));
    return st_test_done();
}
