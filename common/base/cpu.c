/* A role's control threads apart from its data path (CONTROL_CPUS; see strata/base.h). */
#define _GNU_SOURCE /* CPU_SET, pthread_setaffinity_np, pthread_setname_np */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>

#include "strata/base.h"

_Static_assert(ST_CPU_MAX <= CPU_SETSIZE, "a CPU list fits a cpu_set_t");

static cpu_set_t g_data; /* the data-path threads' CPUs; set once by st_cpu_control, before they start */
static int g_have_data;

int st_cpu_list_parse(const char *list, uint64_t *mask) {
    const char *p = list;
    long last = -1;
    if (mask) memset(mask, 0, ST_CPU_MAX / 8);
    if (!*p) return 0; /* empty: no CPU */
    for (;;) {
        char *end;
        if (*p < '0' || *p > '9') return -1;
        errno = 0;
        long a = strtol(p, &end, 10), b = a;
        if (errno || a >= ST_CPU_MAX) return -1;
        if (*end == '-') {
            if (end[1] < '0' || end[1] > '9') return -1;
            b = strtol(end + 1, &end, 10);
            if (errno || b >= ST_CPU_MAX || b < a) return -1;
        }
        if (a <= last) return -1; /* ascending, no repeats */
        for (long c = a; mask && c <= b; c++) mask[c / 64] |= 1ull << (c % 64);
        last = b;
        if (!*end) return 0;
        if (*end != ',') return -1;
        p = end + 1;
    }
}

static void set_text(const cpu_set_t *s, char *out, size_t n) {
    size_t k = 0;
    out[0] = 0;
    for (int c = 0; c < ST_CPU_MAX && k < n; c++) {
        if (!CPU_ISSET(c, s) || (c > 0 && CPU_ISSET(c - 1, s))) continue;
        int e = c;
        while (e + 1 < ST_CPU_MAX && CPU_ISSET(e + 1, s)) e++;
        k += (size_t)(e > c ? snprintf(out + k, n - k, "%s%d-%d", k ? "," : "", c, e)
                            : snprintf(out + k, n - k, "%s%d", k ? "," : "", c));
    }
}

void st_cpu_control(const char *role) {
    const char *list = st_tun_str(ST_TUN_CONTROL_CPUS);
    uint64_t mask[ST_CPU_MAX / 64];
    if (!*list || st_cpu_list_parse(list, mask) != 0) return; /* unset (the table refused a bad one) */
    cpu_set_t proc, ctl, data;
    CPU_ZERO(&ctl);
    for (int c = 0; c < ST_CPU_MAX; c++)
        if (mask[c / 64] >> (c % 64) & 1) CPU_SET(c, &ctl);
    int err = pthread_getaffinity_np(pthread_self(), sizeof proc, &proc);
    if (err) {
        st_log_warn("%s: CONTROL_CPUS ignored: this thread's CPUs: %s", role, strerror(err));
        return;
    }
    CPU_XOR(&data, &proc, &ctl);
    CPU_AND(&data, &data, &proc); /* the process's CPUs less the control ones */
    if (!CPU_COUNT(&data)) data = proc;
    err = pthread_setaffinity_np(pthread_self(), sizeof ctl, &ctl);
    char dt[256], ct[256];
    set_text(&data, dt, sizeof dt);
    set_text(&ctl, ct, sizeof ct);
    if (err) {
        st_log_warn("%s: control threads on CPUs %s: %s; every thread stays on CPUs %s", role, ct, strerror(err), dt);
        return;
    }
    g_data = data;
    g_have_data = 1;
    st_log_info("%s: control threads on CPUs %s, data-path threads on %s", role, ct, dt);
}

void st_cpu_data_thread(const char *name) {
    pthread_setname_np(pthread_self(), name); /* NOTE: ERANGE past 15 characters: the name stays */
    if (!g_have_data) return;
    int err = pthread_setaffinity_np(pthread_self(), sizeof g_data, &g_data);
    if (err) st_log_warn("%s: data-path CPUs: %s (the thread stays on the control CPUs)", name, strerror(err));
}
