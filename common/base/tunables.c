/* The one configuration table: every Strata setting that is not a flag of one command, declared once
 * (name, type, default, unit, meaning), read once, printed by `strata config` and logged at each
 * role's start. This file holds the only getenv in Strata. Not the model config (config.json,
 * st_config_t in strata/model.h). Modelled on UCX's ucs_config_field_t table that `ucx_info -c`
 * prints. */
#include "strata/base.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

typedef enum { TUN_INT, TUN_BOOL, TUN_STR, TUN_ENUM, TUN_CPUS } tun_type_t;

#define TUN_SECRET 1u  /* value never printed or logged (its length is) */
#define TUN_OUTSIDE 2u /* another library's variable, read by that library: shown, never set */

typedef struct {
    const char *name; /* the variable is STRATA_<name> (TUN_OUTSIDE: <name> as is) */
    tun_type_t type;
    const char *dfl;  /* default, as text */
    long lo, hi;      /* TUN_INT: accepted range */
    const char *choices; /* TUN_ENUM: '|'-separated, the value's index is its integer */
    const char *unit;
    unsigned flags;
    const char *doc;  /* one line */
} tun_field_t;

/* NOTE: order and count follow st_tun_id_t in strata/base.h (static_assert below). */
static const tun_field_t g_fields[] = {
    [ST_TUN_LOG] = {"LOG", TUN_ENUM, "info", 0, 0, "error|warn|info|debug", "", 0,
                    "lowest level of the log lines every process prints on stderr"},
    [ST_TUN_LOG_FORMAT] = {"LOG_FORMAT", TUN_ENUM, "text", 0, 0, "text|json", "", 0,
                           "log lines as dated text or as one JSON object each (time, level, role, src, msg)"},
    [ST_TUN_THREADS] = {"THREADS", TUN_INT, "0", 0, 256, NULL, "threads", 0,
                        "threads of the CPU kernels' linear layers (0: one per online CPU)"},
    [ST_TUN_STATE] = {"STATE", TUN_STR, "", 0, 0, NULL, "path", 0,
                      "state directory of strata up/down/status/generate (empty: /tmp/strata-<uid>); --state wins"},
    [ST_TUN_API_KEY] = {"API_KEY", TUN_STR, "", 0, 0, NULL, "", TUN_SECRET,
                        "client API key: the coordinator requires it, strata generate sends it; --api-key wins"},
    [ST_TUN_CLUSTER_SECRET_FILE] = {"CLUSTER_SECRET_FILE", TUN_STR, "", 0, 0, NULL, "path", 0,
                                    "cluster secret file of every role when --cluster-secret-file is not given"},
    [ST_TUN_WORKER_SYNC] = {"WORKER_SYNC", TUN_BOOL, "0", 0, 1, NULL, "", 0,
                            "attention worker: finish each micro-batch before sending the next (no overlap; diagnosis)"},
    [ST_TUN_CUDA_GRAPHS] = {"CUDA_GRAPHS", TUN_BOOL, "1", 0, 1, NULL, "", 0,
                            "GPU roles: replay decode steps (engine) and decode-size dispatches (expert server) as CUDA graphs "
                            "(0: plain launches; diagnosis)"},
    [ST_TUN_HOST_ROUTE] = {"HOST_ROUTE", TUN_BOOL, "0", 0, 1, NULL, "", 0,
                           "GPU engine: quantile routing on the host, one sync per MoE layer (diagnosis)"},
    [ST_TUN_XFER_SPIN_US] = {"XFER_SPIN_US", TUN_INT, "-1", -1, 10000000, NULL, "us", 0,
                             "same-host data path: how long a thread waiting for its peer spins before it sleeps "
                             "(-1: 2000 in a role that drives a GPU, whose host has a core to spare for it; 30 otherwise)"},
    [ST_TUN_XFER_SHM] = {"XFER_SHM", TUN_BOOL, "1", 0, 1, NULL, "", 0,
                         "attention worker: ask a server on this host for a shared-memory channel (0: every server "
                         "over UCX, as across hosts; comparisons)"},
    [ST_TUN_CONTROL_CPUS] = {"CONTROL_CPUS", TUN_CPUS, "", 0, 0, NULL, "", 0,
                             "CPU roles: the CPUs of a role's control threads (its event loop; gRPC's, UCX's and libuv's "
                             "threads), so that its data-path threads (a worker's compute thread, an expert server's data "
                             "and link threads, the kernels' threads) have the process's other CPUs to themselves; strata "
                             "up's core split sets the coordinator's (empty: every thread on every CPU of the process)"},
    [ST_TUN_UCX_TLS] = {"UCX_TLS", TUN_STR, "", 0, 0, NULL, "", TUN_OUTSIDE,
                        "UCX's transports, read by UCX (strata up sets tcp when unset)"},
    [ST_TUN_UCX_NET_DEVICES] = {"UCX_NET_DEVICES", TUN_STR, "", 0, 0, NULL, "", TUN_OUTSIDE,
                                "UCX's devices, read by UCX (unset: Strata limits UCX to the listen address's "
                                "interface and the RDMA devices)"},
};
_Static_assert(sizeof g_fields / sizeof g_fields[0] == ST_TUN_COUNT, "one field per st_tun_id_t");

#define TUN_VAL_MAX 512
typedef struct {
    char text[TUN_VAL_MAX]; /* the value as given ("" for an empty string) */
    long num;               /* TUN_INT, TUN_BOOL, TUN_ENUM */
    st_tun_src_t src;
} tun_value_t;

static tun_value_t g_val[ST_TUN_COUNT];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER; /* flags set after the load */
static char g_load_err[1024];                           /* invalid environment values, for st_tun_load */

static const char *src_name(st_tun_src_t s) {
    return s == ST_TUN_FROM_FLAG ? "flag" : s == ST_TUN_FROM_ENV ? "env" : "default";
}

/* what a value of f must be, for error texts */
static const char *tun_expect(const tun_field_t *f, char *buf, size_t n) {
    if (f->type == TUN_INT) snprintf(buf, n, "an integer in %ld..%ld", f->lo, f->hi);
    else if (f->type == TUN_BOOL) snprintf(buf, n, "a boolean (1/0, yes/no, true/false, on/off)");
    else if (f->type == TUN_ENUM) snprintf(buf, n, "one of %s", f->choices);
    else if (f->type == TUN_CPUS) snprintf(buf, n, "a CPU list such as 3 or 0-3,8 (CPUs below %d)", ST_CPU_MAX);
    else snprintf(buf, n, "a string under %d bytes", TUN_VAL_MAX);
    return buf;
}

static void var_name(const tun_field_t *f, char *out, size_t n) {
    snprintf(out, n, "%s%s", f->flags & TUN_OUTSIDE ? "" : "STRATA_", f->name);
}

/* text → v per f's type; 0 on success, -1 (v untouched) when it does not parse */
static int tun_parse(const tun_field_t *f, const char *text, tun_value_t *v) {
    long num = 0;
    if (strlen(text) >= TUN_VAL_MAX) return -1;
    switch (f->type) {
    case TUN_STR: break;
    case TUN_CPUS:
        if (st_cpu_list_parse(text, NULL) != 0) return -1;
        break;
    case TUN_BOOL:
        if (!strcmp(text, "1") || !strcmp(text, "yes") || !strcmp(text, "true") || !strcmp(text, "on")) num = 1;
        else if (!strcmp(text, "0") || !strcmp(text, "no") || !strcmp(text, "false") || !strcmp(text, "off")) num = 0;
        else return -1;
        break;
    case TUN_INT: {
        char *end;
        errno = 0;
        num = strtol(text, &end, 10);
        if (errno || end == text || *end || num < f->lo || num > f->hi) return -1;
        break;
    }
    case TUN_ENUM: {
        size_t tl = strlen(text);
        const char *c = f->choices;
        for (num = 0;; num++) {
            const char *bar = strchr(c, '|');
            size_t cl = bar ? (size_t)(bar - c) : strlen(c);
            if (cl == tl && !strncmp(c, text, tl)) break;
            if (!bar) return -1;
            c = bar + 1;
        }
        break;
    }
    }
    snprintf(v->text, sizeof v->text, "%s", text);
    v->num = num;
    return 0;
}

/* NOTE: runs once, from the first log line at the latest (st_log_msg reads ST_TUN_LOG), so it must not
 * log: what is wrong goes into g_load_err for st_tun_load and st_tun_log. */
static void tun_load_once(void) {
    size_t el = 0;
    for (int i = 0; i < ST_TUN_COUNT; i++) {
        const tun_field_t *f = &g_fields[i];
        tun_value_t *v = &g_val[i];
        if (tun_parse(f, f->dfl, v) != 0) abort(); /* our own table is wrong */
        v->src = ST_TUN_FROM_DEFAULT;
        char var[64];
        var_name(f, var, sizeof var);
        const char *e = getenv(var); /* the one getenv of Strata */
        if (!e) continue;
        if (tun_parse(f, e, v) == 0) v->src = ST_TUN_FROM_ENV;
        else if (el < sizeof g_load_err - 1) {
            char ex[96];
            el += (size_t)snprintf(g_load_err + el, sizeof g_load_err - el, "%s%s='%.64s' is not %s", el ? "; " : "",
                                   var, e, tun_expect(f, ex, sizeof ex));
        }
    }
}

void st_tun_ensure(void) { pthread_once(&g_once, tun_load_once); }

st_status_t st_tun_load(void) {
    st_tun_ensure();
    if (g_load_err[0]) return ST_FAIL(ST_ERR_CONFIG, "environment: %s", g_load_err);
    return ST_OK;
}

static const tun_field_t *tun_find(const char *name, size_t n, int *id) {
    for (int i = 0; i < ST_TUN_COUNT; i++) {
        const char *fn = g_fields[i].name;
        if (strlen(fn) == n && !strncmp(fn, name, n)) {
            *id = i;
            return &g_fields[i];
        }
    }
    return NULL;
}

st_status_t st_tun_set(const char *name, const char *value) {
    if (!strncmp(name, "STRATA_", 7)) name += 7;
    int id;
    const tun_field_t *f = tun_find(name, strlen(name), &id);
    if (!f) return ST_REJECT(ST_ERR_INVALID_ARG, "no setting named '%s' (strata config lists them)", name);
    if (f->flags & TUN_OUTSIDE)
        return ST_REJECT(ST_ERR_INVALID_ARG, "%s belongs to UCX: set it in the environment", f->name);
    st_tun_ensure();
    tun_value_t v;
    char ex[96];
    if (tun_parse(f, value, &v) != 0)
        return ST_REJECT(ST_ERR_INVALID_ARG, "%s: '%.64s' is not %s", f->name, value, tun_expect(f, ex, sizeof ex));
    v.src = ST_TUN_FROM_FLAG;
    pthread_mutex_lock(&g_mu);
    g_val[id] = v;
    pthread_mutex_unlock(&g_mu);
    if (id == ST_TUN_LOG) st_log_set_level((st_log_level_t)v.num);
    if (id == ST_TUN_LOG_FORMAT) st_log_set_format((st_log_format_t)v.num);
    return ST_OK;
}

int st_tun_parse_flag(int argc, char **argv, int *i) {
    if (strcmp(argv[*i], "--set") != 0) return 0;
    if (*i + 1 >= argc) {
        fprintf(stderr, "--set needs NAME=VALUE\n");
        return -1;
    }
    const char *kv = argv[++*i], *eq = strchr(kv, '=');
    char name[64];
    if (!eq || (size_t)(eq - kv) >= sizeof name) {
        fprintf(stderr, "--set takes NAME=VALUE (got '%s')\n", kv);
        return -1;
    }
    memcpy(name, kv, (size_t)(eq - kv));
    name[eq - kv] = 0;
    if (st_tun_set(name, eq + 1) != ST_OK) {
        fprintf(stderr, "--set: %s\n", st_err_last());
        return -1;
    }
    return 1;
}

void st_tun_export(void) {
    st_tun_ensure();
    for (int i = 0; i < ST_TUN_COUNT; i++) {
        if (g_val[i].src != ST_TUN_FROM_FLAG) continue;
        char var[64];
        var_name(&g_fields[i], var, sizeof var);
        setenv(var, g_val[i].text, 1);
    }
}

long st_tun_int(st_tun_id_t id) {
    st_tun_ensure();
    pthread_mutex_lock(&g_mu);
    long n = g_val[id].num;
    pthread_mutex_unlock(&g_mu);
    return n;
}

const char *st_tun_str(st_tun_id_t id) {
    st_tun_ensure();
    return g_val[id].text; /* NOTE: flags are set at start-up, before other threads read strings */
}

st_tun_src_t st_tun_source(st_tun_id_t id) {
    st_tun_ensure();
    return g_val[id].src;
}

/* "NAME  VALUE  (source)  [type, default D, unit]  meaning" */
static void tun_line(int i, char *out, size_t n, int with_doc) {
    const tun_field_t *f = &g_fields[i];
    const tun_value_t *v = &g_val[i];
    char var[64], val[80];
    var_name(f, var, sizeof var);
    if ((f->flags & TUN_SECRET) && v->text[0]) snprintf(val, sizeof val, "<%zu characters>", strlen(v->text));
    else {
        const char *q = f->type == TUN_STR || f->type == TUN_CPUS ? "\"" : "";
        snprintf(val, sizeof val, "%s%.64s%s", q, v->text, q);
    }
    const char *ty = f->type == TUN_INT    ? "int"
                     : f->type == TUN_BOOL ? "bool"
                     : f->type == TUN_STR  ? "string"
                     : f->type == TUN_CPUS ? "CPU list"
                                           : f->choices;
    int k = with_doc ? snprintf(out, n, "%-28s %-24s %-8s", var, val, src_name(v->src))
                     : snprintf(out, n, "%-28s %-24s %s", var, val, src_name(v->src));
    if (with_doc && k > 0 && (size_t)k < n)
        snprintf(out + k, n - (size_t)k, " [%s%s%s, default \"%s\"%s] %s", ty, *f->unit ? ", " : "", f->unit, f->dfl,
                 f->flags & TUN_OUTSIDE ? ", UCX's" : "", f->doc);
}

void st_tun_print(FILE *out) {
    st_tun_ensure();
    fprintf(out, "%-28s %-24s %-8s %s\n", "# VARIABLE", "VALUE", "FROM", "[TYPE, DEFAULT] MEANING");
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < ST_TUN_COUNT; i++) {
        char line[1024];
        tun_line(i, line, sizeof line, 1);
        fprintf(out, "%s\n", line);
    }
    pthread_mutex_unlock(&g_mu);
    if (g_load_err[0]) fprintf(out, "# ignored (default used): %s\n", g_load_err);
}

void st_tun_log(const char *role) {
    st_tun_ensure();
    st_log_info("%s: configuration (strata config explains each entry):", role);
    for (int i = 0; i < ST_TUN_COUNT; i++) {
        char line[256];
        pthread_mutex_lock(&g_mu);
        tun_line(i, line, sizeof line, 0);
        pthread_mutex_unlock(&g_mu);
        st_log_info("  %s", line);
    }
    if (g_load_err[0]) st_log_warn("%s: ignored (default used): %s", role, g_load_err);
}
