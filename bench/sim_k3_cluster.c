/* K3-scale cluster simulation (issue 16 item 4): the real strata-coordinator binary with hundreds of
 * simulated members on loopback. Expert servers (on hosts of 8) hold K3's 92 x 896 = 82,432 expert
 * instances with replicas 1 and 2; attention workers heartbeat and report K3-shaped format-2
 * summaries (synthetic skewed router, 256 tokens a step). Measures placement time and balance,
 * republish time after an expert server is lost, heartbeat cost, the threshold step, and /status and
 * /metrics size and time, each next to its budget. A program that prints figures, not a test.
 *
 *   build/bin/sim_k3_cluster        # 64 servers on 8 hosts, 184 workers (64 reporting, then all), R 1 and 2 (~2 min)
 *   build/bin/sim_k3_cluster --servers 32 --workers 64 --steps 6 --replicas 2
 *
 * 248 members by default: the coordinator's member table holds 256 (MAX_MEMBERS in coord_impl.h).
 * Members are simulated in this one process over one gRPC channel (gRPC shares the connection),
 * speaking the same protobuf messages as the roles. Coordinator CPU is read from /proc/PID/stat. */
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

#include "qsynth.h"
#include "strata/base.h"
#include "strata/model.h"
#include "strata/proto.h"
#include "strata/quantile.h"
#include "strata/rpc.h"

#define T_TOK 256
#define POOL 8     /* distinct summaries built per step (workers send them in turn) */
#define BLOCKS 12  /* score blocks [T_TOK, n] the layers draw from */
#define RPC_MS 20000
/* Members beat every 0.8 x HB_MS; the coordinator drops one after 2 x HB_MS without. 1 s, not the
 * default 500 ms: on the shared 2-core build machine (load often 5-10) the coordinator is starved
 * for longer than 1 s at times, and a drop there says nothing about the coordinator's cost. */
#define HB_MS "1000"

typedef struct {
    uint64_t id;
    char token[ST_PROTO_TOKEN_MAX + 1];
    char name[32], ep[64];
    int host, beating;
} sm_t;

static uv_loop_t g_loop;
static st_rpc_channel_t *g_ch;
static sm_t *g_m;
static int g_n, g_servers, g_hosts, g_workers, g_reporting;
static uint64_t g_beats, g_beats_failed, g_forgotten; /* forgotten: a reply said "known: false" (dropped) */
static pid_t g_pid;
static char g_http[128];

/* ---- RPC helpers (async calls, loop run until done) ---- */
typedef struct {
    int done;
    st_status_t st;
    uint8_t *buf;
    size_t len;
} call_t;

static void on_reply(st_status_t st, const uint8_t *b, size_t n, const char *detail, void *arg) {
    (void)detail;
    call_t *c = arg;
    c->st = st;
    if (st == ST_OK && n) {
        c->buf = malloc(n);
        if (c->buf) memcpy(c->buf, b, n);
    }
    c->len = n;
    c->done = 1;
}

static void call_start(call_t *c, const char *path, const uint8_t *req, size_t len) {
    memset(c, 0, sizeof *c);
    if (st_rpc_unary(g_ch, path, req, len, RPC_MS, on_reply, c) != ST_OK) c->done = 1, c->st = ST_ERR_PEER;
}

static void wait_calls(call_t *c, int n) {
    for (int i = 0; i < n; i++)
        while (!c[i].done) uv_run(&g_loop, UV_RUN_ONCE);
}

static st_status_t call_sync(const char *path, const uint8_t *req, size_t len, call_t *c) {
    call_start(c, path, req, len);
    wait_calls(c, 1);
    return c->st;
}

/* heartbeats of every beating member, every 400 ms (the coordinator drops after 2 x 500 ms) */
static void on_beat(st_status_t st, const uint8_t *b, size_t n, const char *detail, void *arg) {
    (void)detail, (void)arg;
    st_proto_heartbeat_reply_t r;
    if (st == ST_OK) g_beats++;
    else g_beats_failed++;
    if (st == ST_OK && st_proto_heartbeat_reply_decode(b, n, &r) == ST_OK && !r.known) g_forgotten++;
}

static void beat_timer(uv_timer_t *t) {
    (void)t;
    for (int i = 0; i < g_n; i++) {
        if (!g_m[i].beating) continue;
        st_proto_heartbeat_req_t h = {.member_id = g_m[i].id, .step = 1};
        memcpy(h.member_token, g_m[i].token, sizeof h.member_token);
        uint8_t *buf;
        size_t len;
        if (st_proto_heartbeat_req_encode(&h, &buf, &len) != ST_OK) continue;
        if (st_rpc_unary(g_ch, ST_PROTO_METHOD_HEARTBEAT, buf, len, RPC_MS, on_beat, NULL) != ST_OK) g_beats_failed++;
        free(buf);
    }
}

static void tick(uv_timer_t *t) { (void)t; }

/* run the loop (heartbeats keep going) for s seconds */
static void idle(double s) {
    double t0 = st_time_sec();
    uv_timer_t t;
    uv_timer_init(&g_loop, &t);
    while (st_time_sec() - t0 < s) {
        uv_timer_start(&t, tick, 20, 0);
        uv_run(&g_loop, UV_RUN_ONCE);
    }
    uv_close((uv_handle_t *)&t, NULL);
    uv_run(&g_loop, UV_RUN_NOWAIT);
}

/* ---- the coordinator process ---- */
static double proc_cpu_s(void) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)g_pid);
    FILE *f = fopen(path, "r");
    if (!f) return NAN;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    unsigned long ut = 0, stt = 0;
    /* after ")": state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime */
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &stt) != 2) return NAN;
    return (double)(ut + stt) / (double)sysconf(_SC_CLK_TCK);
}

static size_t proc_rss_kb(void) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)g_pid);
    FILE *f = fopen(path, "r");
    size_t kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6)) kb = strtoul(line + 6, NULL, 10);
    if (f) fclose(f);
    return kb;
}

static int start_coordinator(const char *bin, const char *dir, int replicas, char *grpc) {
    char exe[1200], ck[600], ready[700], log[700], rep[8];
    snprintf(exe, sizeof exe, "%s/strata-coordinator", bin);
    snprintf(ck, sizeof ck, "%s", dir);
    snprintf(ready, sizeof ready, "%s/ready", dir);
    snprintf(log, sizeof log, "%s/coordinator-r%d.log", dir, replicas);
    snprintf(rep, sizeof rep, "%d", replicas);
    unlink(ready);
    fflush(stdout); /* the child must not flush our buffer again */
    g_pid = fork();
    if (g_pid < 0) return -1;
    if (g_pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM); /* the simulation killed: its coordinator goes too */
        FILE *f = freopen(log, "w", stdout);
        (void)f;
        dup2(STDOUT_FILENO, STDERR_FILENO);
        execl(exe, exe, "--ckpt", ck, "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0", "--replicas", rep, "--routing",
              "quantile", "--lambda", "0.5", "--heartbeat-ms", HB_MS, "--insecure", "--ready-file", ready, (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 300; i++) {
        char *txt;
        if (access(ready, R_OK) == 0 && st_file_read_all(ready, &txt, NULL) == ST_OK) {
            char *g = strstr(txt, "grpc="), *h = strstr(txt, "http=");
            if (g && h && sscanf(g + 5, "%127s", grpc) == 1 && sscanf(h + 5, "%127s", g_http) == 1) {
                free(txt);
                return 0;
            }
            free(txt);
        }
        usleep(50000);
    }
    fprintf(stderr, "sim: the coordinator did not start (log %s)\n", log);
    return -1;
}

static void stop_coordinator(void) {
    if (g_pid <= 0) return;
    kill(g_pid, SIGTERM);
    for (int i = 0; i < 100 && waitpid(g_pid, NULL, WNOHANG) == 0; i++) usleep(50000);
    if (waitpid(g_pid, NULL, WNOHANG) == 0) {
        kill(g_pid, SIGKILL);
        waitpid(g_pid, NULL, 0);
    }
    g_pid = 0;
}

/* ---- HTTP GET (blocking; the loop waits meanwhile, a few ms) ---- */
static char *http_get(const char *path, size_t *body_len, double *secs) {
    char host[128];
    snprintf(host, sizeof host, "%s", g_http);
    char *c = strrchr(host, ':');
    if (!c) return NULL;
    *c = 0;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(c + 1))};
    inet_pton(AF_INET, host, &a.sin_addr);
    double t0 = st_time_sec();
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        if (fd >= 0) close(fd);
        return NULL;
    }
    char req[256];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: sim\r\nConnection: close\r\n\r\n", path);
    if (write(fd, req, (size_t)n) != n) {
        close(fd);
        return NULL;
    }
    size_t cap = 1 << 20, len = 0;
    char *buf = malloc(cap + 1);
    for (;;) {
        if (len == cap) buf = realloc(buf, (cap *= 2) + 1);
        ssize_t r = read(fd, buf + len, cap - len);
        if (r <= 0) break;
        len += (size_t)r;
    }
    close(fd);
    *secs = st_time_sec() - t0;
    buf[len] = 0;
    char *body = strstr(buf, "\r\n\r\n");
    if (!body) {
        free(buf);
        return NULL;
    }
    body += 4;
    *body_len = len - (size_t)(body - buf);
    memmove(buf, body, *body_len + 1);
    return buf;
}

/* a number after "key": in the JSON text (first occurrence after `after`, if given) */
static double json_num(const char *s, const char *after, const char *key) {
    if (after && !(s = strstr(s, after))) return NAN;
    char k[96];
    snprintf(k, sizeof k, "\"%s\":", key);
    const char *p = strstr(s, k);
    return p ? strtod(p + strlen(k), NULL) : NAN;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* wall time of a GET (what a client sees; on an oversubscribed machine mostly waiting for a core)
 * and the coordinator's CPU per GET (its work: /proc ticks over 10 GETs) */
static void get_stats(const char *path, double budget_ms, double budget_bytes) {
    enum { N = 10 };
    double t[N];
    size_t n = 0;
    double c0 = proc_cpu_s();
    for (int i = 0; i < N; i++) {
        char *b = http_get(path, &n, &t[i]);
        free(b);
        if (!b) t[i] = NAN;
    }
    double cpu_ms = 1e3 * (proc_cpu_s() - c0) / N;
    qsort(t, N, sizeof t[0], cmp_d);
    int ok = n <= budget_bytes && (1e3 * t[N / 2] <= budget_ms || cpu_ms <= budget_ms);
    printf("  GET %-8s %9zu B (budget %s); wall median %6.1f ms, max %6.1f ms; coordinator CPU %5.1f ms per GET (budget %s)%s\n",
           path, n, budget_bytes > 0 ? "1 MB" : "none", 1e3 * t[N / 2], 1e3 * t[N - 1], cpu_ms, budget_ms > 0 ? "50 ms" : "none",
           budget_ms <= 0 ? "" : ok ? "  ok" : "  OVER");
}

/* ---- members ---- */
static int register_all(int from, int to, int role, double *worst_s, double *last_s) {
    call_t *c = calloc((size_t)(to - from), sizeof *c);
    int bad = 0;
    for (int i = from; i < to; i++) {
        sm_t *m = &g_m[i];
        st_proto_register_req_t r = {.role = (st_proto_role_t)role, .name = m->name, .data_endpoint = m->ep, .capacity = 4096};
        uint8_t *buf;
        size_t len;
        if (st_proto_register_req_encode(&r, &buf, &len) != ST_OK) {
            c[i - from] = (call_t){.done = 1, .st = ST_ERR_INVALID_ARG};
            continue;
        }
        double t0 = st_time_sec();
        call_start(&c[i - from], ST_PROTO_METHOD_REGISTER, buf, len);
        free(buf);
        if (role == ST_PROTO_ROLE_EXPERT) { /* one by one: each registration re-places */
            wait_calls(&c[i - from], 1);
            double dt = st_time_sec() - t0;
            if (worst_s && dt > *worst_s) *worst_s = dt;
            if (last_s) *last_s = dt;
        }
    }
    wait_calls(c, to - from);
    for (int i = from; i < to; i++) {
        st_proto_register_reply_t rr;
        if (c[i - from].st != ST_OK || st_proto_register_reply_decode(c[i - from].buf, c[i - from].len, &rr) != ST_OK) {
            bad++;
        } else {
            g_m[i].id = rr.member_id;
            memcpy(g_m[i].token, rr.member_token, sizeof g_m[i].token);
            g_m[i].beating = 1;
        }
        free(c[i - from].buf);
    }
    free(c);
    return bad;
}

static int server_index(uint64_t id) {
    for (int i = 0; i < g_servers; i++)
        if (g_m[i].id == id) return i;
    return -1;
}

/* fetch the map; print balance; returns the version (0 on failure); *holder_out (optional) a copy of
 * member_ids per cell as server indices [cells * R], -1 none */
static uint64_t check_placement(int R, int dense, int lost, double expert_mb, int **holder_out, size_t *cells_out) {
    st_proto_version_req_t vr = {0};
    uint8_t *buf;
    size_t len;
    st_proto_version_req_encode(&vr, &buf, &len);
    call_t c;
    double t0 = st_time_sec();
    st_status_t s = call_sync(ST_PROTO_METHOD_PLACEMENT, buf, len, &c);
    double dt = st_time_sec() - t0;
    free(buf);
    st_proto_placement_t p;
    if (s != ST_OK || st_proto_placement_decode(c.buf, c.len, &p) != ST_OK) {
        printf("  GetPlacement failed: %s\n", st_err_last());
        free(c.buf);
        return 0;
    }
    size_t cells = (size_t)p.n_layers * p.n_experts;
    int *cnt = calloc((size_t)g_servers, sizeof(int)), *hold = malloc(sizeof(int) * cells * (size_t)R + 1);
    long same_server = 0, same_host = 0, missing = 0, on_lost = 0, moe_cells = 0;
    for (size_t i = 0; i < cells; i++) {
        uint32_t a = p.offsets[i], b = p.offsets[i + 1];
        for (int r = 0; r < R; r++) hold[i * (size_t)R + r] = -1;
        if (i < (size_t)dense * p.n_experts) continue; /* dense layers: no experts */
        if (a == b) {
            missing++;
            continue;
        }
        moe_cells++;
        for (uint32_t k = a; k < b && (int)(k - a) < R; k++) {
            int si = server_index(p.member_ids[k]);
            hold[i * (size_t)R + (k - a)] = si;
            if (si >= 0) cnt[si]++;
            if (si == lost && lost >= 0) on_lost++;
            for (uint32_t q = a; q < k; q++) {
                int sj = server_index(p.member_ids[q]);
                same_server += si == sj;
                same_host += si >= 0 && sj >= 0 && si != sj && g_m[si].host == g_m[sj].host;
            }
        }
        if ((int)(b - a) < R) missing++;
    }
    int mn = 1 << 30, mx = 0, live = 0;
    double sum = 0;
    for (int i = 0; i < g_servers; i++) {
        if (i == lost) continue;
        live++;
        mn = cnt[i] < mn ? cnt[i] : mn;
        mx = cnt[i] > mx ? cnt[i] : mx;
        sum += cnt[i];
    }
    double mean = sum / (live ? live : 1);
    printf("  map v%llu: %ld expert cells x R %d on %d servers / %d hosts; GetPlacement %zu B in %.1f ms\n",
           (unsigned long long)p.version, moe_cells, R, live, g_hosts, c.len, 1e3 * dt);
    printf("  experts per server min %d max %d mean %.1f (max/mean %.4f); bytes per server min %.1f GB max %.1f GB\n", mn, mx,
           mean, mx / mean, mn * expert_mb / 1024, mx * expert_mb / 1024);
    printf("  replicas on one server: %ld, on one host: %ld, experts short of R holders: %ld\n", same_server, same_host, missing);
    if (lost >= 0) printf("  assignments still on the lost server: %ld\n", on_lost);
    uint64_t v = p.version;
    if (holder_out) *holder_out = hold;
    else free(hold);
    if (cells_out) *cells_out = cells;
    free(cnt);
    st_proto_placement_cleanup(&p);
    free(c.buf);
    return v;
}

/* ---- reports ---- */
typedef struct {
    st_qsynth_t *sy;
    float *blk[BLOCKS];
    st_qsum_t *b[POOL];
    uint8_t *buf[POOL];
    size_t cap, len[POOL];
    float *tau, *rho; /* [L_moe, n] */
    uint64_t version;
} rep_t;

static st_status_t fetch_table(rep_t *rp, const st_config_t *cfg, size_t *reply_bytes, double *secs) {
    st_proto_version_req_t vr = {.known_version = rp->version};
    uint8_t *buf;
    size_t len;
    st_proto_version_req_encode(&vr, &buf, &len);
    call_t c;
    double t0 = st_time_sec();
    st_status_t s = call_sync(ST_PROTO_METHOD_THRESHOLDS, buf, len, &c);
    *secs = st_time_sec() - t0;
    free(buf);
    st_proto_thresholds_t t;
    if (s != ST_OK || st_proto_thresholds_decode(c.buf, c.len, &t) != ST_OK) {
        free(c.buf);
        return ST_ERR_PEER;
    }
    if (!t.unchanged) {
        *reply_bytes = c.len;
        size_t E = (size_t)cfg->n_experts, off = (size_t)cfg->first_k_dense * E, moe = (size_t)(cfg->n_layers - cfg->first_k_dense) * E;
        memcpy(rp->tau, t.tau + off, sizeof(float) * moe);
        for (size_t i = 0; i < moe; i++) rp->rho[i] = NAN;
        for (size_t i = 0; i < t.n_rho_layers; i++)
            memcpy(rp->rho + ((size_t)t.rho_layers[i] - cfg->first_k_dense) * E, t.rho + i * E, sizeof(float) * E);
        rp->version = t.version;
    }
    st_proto_thresholds_cleanup(&t);
    free(c.buf);
    return ST_OK;
}

static void build_pool(rep_t *rp, uint32_t L, uint32_t E, uint64_t step) {
    st_qtable_t th = {.version = rp->version, .n_layers = L, .n_experts = E, .tau = rp->tau, .rho = rp->rho};
    for (int p = 0; p < POOL; p++) {
        st_qsum_begin(rp->b[p], rp->buf[p], rp->cap, (uint32_t)p, step, rp->version ? &th : NULL);
        for (uint32_t l = 0; l < L; l++) {
            st_qsum_add_layer(rp->b[p], l, rp->blk[(p * 5 + l + step) % BLOCKS], T_TOK);
            if (l % 16 == 15) uv_run(&g_loop, UV_RUN_NOWAIT); /* keep the members' heartbeats going */
        }
        st_qsum_finish(rp->b[p], &rp->len[p]);
    }
}

static double send_reports(rep_t *rp, const st_config_t *cfg, int nw, uint64_t step, size_t *bytes_max) {
    call_t *c = calloc((size_t)nw, sizeof *c);
    double t0 = st_time_sec();
    *bytes_max = 0;
    for (int w = 0; w < nw; w++) {
        sm_t *m = &g_m[g_servers + w];
        int p = w % POOL;
        const uint8_t *sums[1] = {rp->buf[p]};
        size_t lens[1] = {rp->len[p]};
        st_proto_scores_t r = {.worker_id = m->id, .step = step, .threshold_version = rp->version,
                               .n_layers = (uint32_t)cfg->n_layers, .n_experts = (uint32_t)cfg->n_experts,
                               .n_summaries = 1, .summaries = sums, .summary_lens = lens};
        memcpy(r.member_token, m->token, sizeof r.member_token);
        uint8_t *buf;
        size_t len;
        if (st_proto_scores_encode(&r, &buf, &len) != ST_OK) continue;
        *bytes_max = len > *bytes_max ? len : *bytes_max;
        call_start(&c[w], ST_PROTO_METHOD_REPORT_SCORES, buf, len);
        free(buf);
    }
    wait_calls(c, nw);
    int bad = 0;
    for (int w = 0; w < nw; w++) bad += c[w].st != ST_OK, free(c[w].buf);
    if (bad) printf("  step %llu: %d reports refused: %s\n", (unsigned long long)step, bad, st_err_last());
    free(c);
    return st_time_sec() - t0;
}

static int run(const char *bin, const char *dir, const st_config_t *cfg, int R, int steps, double expert_mb) {
    char grpc[128];
    printf("\n## replicas %d: %d expert servers on %d hosts, %d attention workers (%d members)\n", R, g_servers, g_hosts,
           g_workers, g_n);
    if (start_coordinator(bin, dir, R, grpc) != 0) return 1;
    if (st_rpc_channel_create(grpc, &g_ch) != ST_OK) return 1;
    for (int i = 0; i < g_n; i++) g_m[i].id = 0, g_m[i].beating = 0;
    uv_timer_t beat;
    uv_timer_init(&g_loop, &beat);
    uv_timer_start(&beat, beat_timer, (uint64_t)(0.8 * atoi(HB_MS)), (uint64_t)(0.8 * atoi(HB_MS)));
    /* placement: servers join one by one */
    double worst = 0, last = 0, t0 = st_time_sec();
    int bad = register_all(0, g_servers, ST_PROTO_ROLE_EXPERT, &worst, &last);
    double all = st_time_sec() - t0;
    size_t n;
    double ts;
    char *st = http_get("/status", &n, &ts);
    double upd_max = st ? json_num(st, "\"placement\"", "update_ms_max") : NAN;
    double upd_last = st ? json_num(st, "\"placement\"", "update_ms_last") : NAN;
    free(st);
    printf("### placement\n  %d registrations (%d refused) one by one in %.2f s; slowest RegisterMember (re-places) %.1f ms, "
           "last %.1f ms\n  coordinator placement update: slowest %.1f ms, last (all %d servers) %.1f ms (budget 1000 ms)%s\n",
           g_servers, bad, all, 1e3 * worst, 1e3 * last, upd_max, g_servers, upd_last, upd_max <= 1000 ? "  ok" : "  OVER");
    int *before = NULL;
    size_t cells = 0;
    uint64_t v1 = check_placement(R, cfg->first_k_dense, -1, expert_mb, &before, &cells);
    /* attention workers */
    bad = register_all(g_servers, g_n, ST_PROTO_ROLE_ATTENTION, NULL, NULL);
    printf("### membership\n  %d attention workers registered (%d refused)\n", g_workers, bad);
    /* heartbeat cost: only heartbeats for a while */
    idle(0.5);
    double c0 = proc_cpu_s(), w0 = st_time_sec();
    uint64_t b0 = g_beats;
    idle(4.0);
    double cpu = proc_cpu_s() - c0, wall = st_time_sec() - w0;
    uint64_t nb = g_beats - b0;
    double hb_cost = nb ? cpu / (double)nb : 0;
    printf("  heartbeats: %llu in %.1f s (%d members every %d ms), %llu failed; coordinator CPU %.3f s = %.1f us per "
           "heartbeat (%.1f%% of a core, timers included)\n",
           (unsigned long long)nb, wall, g_n, (int)(0.8 * atoi(HB_MS)), (unsigned long long)g_beats_failed, cpu, nb ? 1e6 * cpu / (double)nb : NAN,
           100 * cpu / wall);
    /* threshold steps */
    uint32_t L = (uint32_t)(cfg->n_layers - cfg->first_k_dense), E = (uint32_t)cfg->n_experts;
    rep_t rp = {0};
    st_qsynth_opts_t so;
    st_qsynth_opts_default(&so, 1, E);
    so.seed = 42;
    st_qsynth_create(&so, &rp.sy);
    st_rng_t rng = {7};
    for (int b = 0; b < BLOCKS; b++) {
        rp.blk[b] = malloc(sizeof(float) * T_TOK * E);
        st_qsynth_scores(rp.sy, 0, 10.0 * b, rp.blk[b], T_TOK, &rng);
    }
    rp.cap = st_qsum_max_bytes(L, E, (uint32_t)cfg->top_k, T_TOK);
    for (int p = 0; p < POOL; p++) {
        rp.buf[p] = malloc(rp.cap);
        st_qsum_create(L, E, (uint32_t)cfg->top_k, T_TOK, &rp.b[p]);
    }
    rp.tau = malloc(sizeof(float) * L * E);
    rp.rho = malloc(sizeof(float) * L * E);
    /* the budget shape first (g_reporting workers report; the rest only heartbeat: the coordinator
     * closes a step when every live worker reported, or on its 50 ms timer), then every worker */
    int shapes[2] = {g_reporting < g_workers ? g_reporting : g_workers, g_workers};
    uint64_t step = 0;
    for (int sh = 0; sh < (shapes[0] == shapes[1] ? 1 : 2); sh++) {
        int nw = shapes[sh];
        printf("### threshold steps: %d of %d workers report, %d tokens each, K3-shaped format-2 summaries (%d distinct per step)\n",
               nw, g_workers, T_TOK, POOL);
        double cpu_steady = 0, wall_steady = 0, fetch_s = 0, c_all = proc_cpu_s();
        size_t rep_max = 0, th_bytes = 0;
        int n_steady = 0;
        uint64_t beats0 = g_beats;
        for (int s = 1; s <= steps; s++) {
            step++;
            fetch_table(&rp, cfg, &th_bytes, &fetch_s);
            build_pool(&rp, L, E, step);
            double c1 = proc_cpu_s();
            double dt = send_reports(&rp, cfg, nw, step, &rep_max);
            idle(0.06); /* the step's publish (the 50 ms timer when not every worker reports) */
            double dc = proc_cpu_s() - c1;
            if (s > steps / 2) cpu_steady += dc, wall_steady += dt, n_steady++;
            if (s == 1 || s == steps)
                printf("  step %d: reports in %.1f ms wall, coordinator CPU %.1f ms; table v%llu\n", s, 1e3 * dt, 1e3 * dc,
                       (unsigned long long)rp.version);
        }
        double beat_cpu = (double)(g_beats - beats0) * hb_cost; /* heartbeats meanwhile, at the rate measured above */
        double all_cpu = proc_cpu_s() - c_all - beat_cpu;
        st = http_get("/status", &n, &ts);
        double merge_ms = st ? json_num(st, "\"step_ms\"", "coordinator_merge") : NAN, nset = st ? json_num(st, "\"thresholds\"", "set") : NAN;
        double stale = st ? json_num(st, "\"thresholds\"", "stale_summaries") : NAN;
        free(st);
        double per_step = 1e3 * cpu_steady / n_steady;
        printf("  steady state (last %d steps): coordinator CPU %.1f ms per step (decode + merge + publish + gRPC + the heartbeats "
               "meanwhile)%s; reports of a step in %.1f ms wall\n",
               n_steady, per_step, nw <= 64 ? (per_step <= 50 ? "  (budget 50 ms at 64 workers: ok)" : "  (budget 50 ms at 64 workers: OVER)") : "",
               1e3 * wall_steady / n_steady);
        printf("  all %d steps: %.1f ms of coordinator CPU per step without the heartbeats; estimator alone (merge + end_step, "
               "/status step_ms.coordinator_merge, since start) %.1f ms per step; thresholds set %.0f of %u\n",
               steps, 1e3 * all_cpu / steps, merge_ms, nset, L * E);
        printf("  members dropped so far (a heartbeat answered unknown): %llu; summaries dropped as stale so far: %.0f\n",
               (unsigned long long)g_forgotten, stale);
        printf("  ReportScores up to %zu B per worker per step (budget 65536)%s; Thresholds reply %zu B in %.1f ms (x %d workers "
               "fetching each version = %.1f MB per step)\n",
               rep_max, rep_max <= 65536 ? "  ok" : "  OVER", th_bytes, 1e3 * fetch_s, nw, th_bytes * (double)nw / 1e6);
    }
    st = http_get("/status", &n, &ts);
    printf("### REST (coordinator RSS %.0f MB; its event loop's longest stall in the last 60 s: %.0f ms)\n", proc_rss_kb() / 1024.0,
           st ? 1e3 * json_num(st, "\"loop\"", "stall_max_s_last_60s") : NAN);
    free(st);
    get_stats("/status", 50, 1 << 20);
    get_stats("/metrics", 0, 0);
    /* lose an expert server */
    int lost = 17 % g_servers;
    g_m[lost].beating = 0;
    double tl = st_time_sec();
    uint64_t v2 = 0;
    while (st_time_sec() - tl < 10) {
        st_proto_version_req_t vr = {.known_version = v1};
        uint8_t *buf;
        size_t len;
        st_proto_version_req_encode(&vr, &buf, &len);
        call_t c;
        st_status_t s = call_sync(ST_PROTO_METHOD_PLACEMENT, buf, len, &c);
        free(buf);
        st_proto_placement_t p;
        if (s == ST_OK && st_proto_placement_decode(c.buf, c.len, &p) == ST_OK) {
            if (!p.unchanged) v2 = p.version;
            st_proto_placement_cleanup(&p);
        }
        free(c.buf);
        if (v2) break;
        idle(0.01);
    }
    double seen = st_time_sec() - tl;
    st = http_get("/status", &n, &ts);
    upd_last = st ? json_num(st, "\"placement\"", "update_ms_last") : NAN;
    free(st);
    printf("### an expert server is lost (%s on host %d stops heartbeating)\n  new map v%llu seen %.2f s after its heartbeats "
           "stopped (detection: 2 heartbeat intervals of " HB_MS " ms + the sweep); republish (placement update) %.1f ms (budget 1000 ms)%s\n",
           g_m[lost].name, g_m[lost].host, (unsigned long long)v2, seen, upd_last, upd_last <= 1000 ? "  ok" : "  OVER");
    int *after = NULL;
    check_placement(R, cfg->first_k_dense, lost, expert_mb, &after, NULL);
    long moved = 0, kept_bad = 0;
    for (size_t i = 0; before && after && i < cells; i++)
        for (int r = 0; r < R; r++) {
            int b = before[i * (size_t)R + r];
            if (b < 0) continue;
            int found = 0;
            for (int q = 0; q < R; q++) found |= after[i * (size_t)R + q] == b;
            if (b == lost) moved++;
            else kept_bad += !found;
        }
    printf("  assignments moved: %ld (the lost server's); survivors' assignments moved: %ld\n", moved, kept_bad);
    free(before);
    free(after);
    /* teardown */
    uv_timer_stop(&beat);
    uv_close((uv_handle_t *)&beat, NULL);
    idle(0.3);
    for (int p = 0; p < POOL; p++) st_qsum_destroy(rp.b[p]), free(rp.buf[p]);
    for (int b = 0; b < BLOCKS; b++) free(rp.blk[b]);
    free(rp.tau), free(rp.rho);
    st_qsynth_destroy(rp.sy);
    st_rpc_channel_destroy(g_ch);
    g_ch = NULL;
    stop_coordinator();
    return 0;
}

int main(int argc, char **argv) {
    const char *bin = NULL, *config = STRATA_SOURCE_DIR "/fuzz/corpus/config/k3_mxfp4.json", *reps = "1,2";
    int steps = 10;
    g_servers = 64, g_hosts = 8, g_workers = 184, g_reporting = 64;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--bin")) bin = argv[i + 1];
        else if (!strcmp(argv[i], "--config")) config = argv[i + 1];
        else if (!strcmp(argv[i], "--servers")) g_servers = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--hosts")) g_hosts = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--workers")) g_workers = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reporting")) g_reporting = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--steps")) steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--replicas")) reps = argv[i + 1];
        else {
            fprintf(stderr, "usage: sim_k3_cluster [--bin DIR] [--config F] [--servers N] [--hosts H] [--workers W] [--reporting N] [--steps S] [--replicas 1,2]\n");
            return 2;
        }
    }
    if (g_servers < 2 || g_hosts < 1 || g_workers < 1 || g_reporting < 1 || steps < 2) return 2;
    char self[1024], bind[1024];
    if (!bin) { /* beside this program */
        ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
        self[k > 0 ? k : 0] = 0;
        char *sl = strrchr(self, '/');
        if (sl) *sl = 0;
        snprintf(bind, sizeof bind, "%s", self);
        bin = bind;
    }
    st_log_set_level(ST_LOG_ERROR);
    char dir[] = "/tmp/sim_k3.XXXXXX";
    if (!mkdtemp(dir)) return 1;
    char *txt, path[600];
    size_t tl;
    st_config_t cfg;
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (st_file_read_all(config, &txt, &tl) != ST_OK || st_file_write_all(path, txt, tl) != ST_OK || st_config_load(&cfg, path) != ST_OK) {
        fprintf(stderr, "sim: %s\n", st_err_last());
        return 1;
    }
    free(txt);
    int latent = cfg.latent ? cfg.latent : cfg.d;
    double expert_mb = 3.0 * latent * cfg.moe_inter * (cfg.experts_mxfp4 ? 17.0 / 32.0 : 2.0) / (1 << 20);
    printf("# sim_k3_cluster: the coordinator's config and logs in %s\n", dir);
    printf("# sim_k3_cluster: %s: %d layers (%d dense) x %d experts, top-%d = %d expert instances; an expert %.1f MB (%s)\n", config,
           cfg.n_layers, cfg.first_k_dense, cfg.n_experts, cfg.top_k, (cfg.n_layers - cfg.first_k_dense) * cfg.n_experts, expert_mb,
           cfg.experts_mxfp4 ? "mxfp4" : "bf16");
    g_n = g_servers + g_workers;
    g_m = calloc((size_t)g_n, sizeof *g_m);
    for (int i = 0; i < g_n; i++) {
        sm_t *m = &g_m[i];
        if (i < g_servers) {
            m->host = i % g_hosts;
            snprintf(m->name, sizeof m->name, "expert-%d", i);
            snprintf(m->ep, sizeof m->ep, "10.1.%d.%d:%d", m->host / 250, m->host % 250 + 1, 20000 + i / g_hosts);
        } else {
            snprintf(m->name, sizeof m->name, "attn-%d", i - g_servers);
            snprintf(m->ep, sizeof m->ep, "127.0.0.1:%d", 1 + (i - g_servers));
        }
    }
    uv_loop_init(&g_loop);
    if (st_rpc_init(&g_loop) != ST_OK) return 1;
    int rc = 0;
    for (const char *r = reps; *r && !rc; r++) {
        if (*r < '1' || *r > '8') continue;
        rc = run(bin, dir, &cfg, *r - '0', steps, expert_mb);
    }
    st_rpc_cleanup();
    uv_run(&g_loop, UV_RUN_DEFAULT);
    uv_loop_close(&g_loop);
    free(g_m);
    return rc;
}
