/* Coordinator membership against a real strata-coordinator process on loopback ($STRATA_BIN), as
 * an attacker and as a member would see it (issue 13):
 *   members  random unguessable ids; forged heartbeats (guessed id, old id, wrong or no token) do
 *            not keep a member alive; a stalled coordinator does not drop members that heartbeat; 300 registrations cannot fill the member table for good;
 *            ReportScores with NaN / Inf / negative / out-of-range values or a mismatched shape is
 *            refused and changes nothing (/metrics and /status stay valid); a member finds a
 *            coordinator restarted on another port through its coordinator file, and a live one in
 *            a seed list; a coordinator outage is logged rate-limited, never at ERROR.
 *   auth     (needs common/rpc's token checks and st_rpc_call_peer) RegisterMember and Heartbeat
 *            without the cluster token are refused UNAUTHENTICATED; a heartbeat with the right id
 *            and token from another connection does not count; ReportScores with a wrong member
 *            token is UNAUTHENTICATED.
 *   quiet    (needs common/rpc to stop logging failed client calls at ERROR) a 3 s coordinator
 *            outage: a few WARN lines from the whole member process, no ERROR.
 * Usage: test_coord_members [members|restart|quiet|auth]   (internal: --heartbeat ADDR ID TOKEN SECRET_FILE) */
#define _GNU_SOURCE /* strcasestr */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

#include "harness.h"
#include "strata/member.h"
#include "strata/proto.h"
#include "strata/rpc.h"

#define HB_MS 100 /* the coordinators' heartbeat: dead after ~200 ms, forgotten ~1 s later */

static uv_loop_t loop;
static char tmp[512], bin[512], ck[600], secret_file[600];
static st_sec_opts_t sec; /* the cluster's token, derived like the roles do */

/* ---------------------------------------------------------------- processes */

typedef struct {
    pid_t pid;
    char ready[700], grpc[128], http[128];
    int grpc_port;
} coord_proc_t;

static pid_t children[8];
static int n_children;

static void kill_children(void) {
    for (int i = 0; i < n_children; i++)
        if (children[i] > 0) {
            kill(children[i], SIGKILL);
            waitpid(children[i], NULL, 0);
            children[i] = 0;
        }
}

static void on_fatal(int sig) {
    kill_children();
    signal(sig, SIG_DFL);
    raise(sig);
}

static int read_ready(coord_proc_t *c) {
    FILE *f = fopen(c->ready, "r");
    if (!f) return 0;
    char line[120];
    c->grpc[0] = c->http[0] = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = 0;
        if (!strncmp(line, "grpc=", 5)) snprintf(c->grpc, sizeof c->grpc, "%s", line + 5);
        if (!strncmp(line, "http=", 5)) snprintf(c->http, sizeof c->http, "%s", line + 5);
    }
    fclose(f);
    const char *p = strrchr(c->grpc, ':');
    c->grpc_port = p ? atoi(p + 1) : 0;
    return c->grpc[0] && c->http[0];
}

/* strata-coordinator on ephemeral loopback ports, writing ready (removed first). */
static int coord_start_hb(coord_proc_t *c, const char *ready, int hb_ms) {
    snprintf(c->ready, sizeof c->ready, "%s", ready);
    unlink(ready);
    char exe[600], hb[16];
    snprintf(exe, sizeof exe, "%s/strata-coordinator", bin);
    snprintf(hb, sizeof hb, "%d", hb_ms);
    pid_t pid = fork();
    if (pid == 0) {
        execl(exe, exe, "--ckpt", ck, "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0", "--ready-file", ready,
              "--heartbeat-ms", hb, "--cluster-secret-file", secret_file, (char *)NULL);
        _exit(127);
    }
    if (pid < 0) return 0;
    c->pid = pid;
    children[n_children++] = pid;
    for (int i = 0; i < 200; i++) { /* 10 s */
        if (read_ready(c)) return 1;
        if (waitpid(pid, NULL, WNOHANG) == pid) return 0;
        usleep(50000);
    }
    return 0;
}

static int coord_start(coord_proc_t *c, const char *ready) { return coord_start_hb(c, ready, HB_MS); }

/* SIGTERM and wait (10 s at most): the exit status, -1 on a signal or a hang. Under ASan this is
 * where leaks and errors would surface. */
static int coord_stop(coord_proc_t *c) {
    if (c->pid <= 0) return -1;
    kill(c->pid, SIGTERM);
    int ws = 0, rc = -1;
    for (int i = 0; i < 200; i++) {
        if (waitpid(c->pid, &ws, WNOHANG) == c->pid) {
            rc = WIFEXITED(ws) ? WEXITSTATUS(ws) : -1;
            break;
        }
        usleep(50000);
    }
    if (rc == -1 && !WIFEXITED(ws)) {
        kill(c->pid, SIGKILL);
        waitpid(c->pid, NULL, 0);
    }
    for (int i = 0; i < n_children; i++)
        if (children[i] == c->pid) children[i] = 0;
    c->pid = 0;
    return rc;
}

static void coord_kill(coord_proc_t *c) {
    kill(c->pid, SIGKILL);
    waitpid(c->pid, NULL, 0);
    for (int i = 0; i < n_children; i++)
        if (children[i] == c->pid) children[i] = 0;
}

/* ---------------------------------------------------------------- rpc, synchronously */

typedef struct {
    int done;
    st_status_t st;
    uint8_t *buf;
    size_t len;
    char detail[512];
} res_t;

static void on_reply(st_status_t st, const uint8_t *reply, size_t len, const char *detail, void *arg) {
    res_t *r = arg;
    r->st = st;
    r->len = len;
    r->buf = malloc(len + 1);
    if (len) memcpy(r->buf, reply, len);
    snprintf(r->detail, sizeof r->detail, "%s", detail ? detail : "");
    r->done = 1;
}

static st_status_t call(st_rpc_channel_t *ch, const char *path, const uint8_t *req, size_t len, res_t *r) {
    memset(r, 0, sizeof *r);
    if (st_rpc_unary(ch, path, req, len, 5000, on_reply, r) != ST_OK) return ST_ERR_INTERNAL;
    while (!r->done) uv_run(&loop, UV_RUN_ONCE);
    return r->st;
}

static void noop_cb(uv_timer_t *t) { (void)t; }

static void run_for(double s) { /* the loop runs (member timers, rpc hand-offs) for s seconds */
    double end = st_time_sec() + s;
    uv_timer_t t;
    uv_timer_init(&loop, &t);
    while (st_time_sec() < end) {
        uv_timer_start(&t, noop_cb, 10, 0);
        uv_run(&loop, UV_RUN_ONCE);
    }
    uv_timer_stop(&t);
    uv_close((uv_handle_t *)&t, NULL);
    uv_run(&loop, UV_RUN_NOWAIT);
}

static st_rpc_channel_t *channel(const char *addr, const char *token) {
    st_rpc_sec_t s = {.token = token};
    st_rpc_channel_t *ch = NULL;
    if (st_rpc_channel_create_ex(addr, &s, &ch) != ST_OK) return NULL;
    return ch;
}

/* RegisterMember; ST_OK fills *rep. */
static st_status_t reg(st_rpc_channel_t *ch, st_proto_role_t role, const char *name, const char *endpoint,
                       st_proto_register_reply_t *rep, res_t *r) {
    st_proto_register_req_t q = {.role = role, .name = (char *)name, .data_endpoint = (char *)endpoint, .capacity = 4};
    uint8_t *b;
    size_t n;
    if (st_proto_register_req_encode(&q, &b, &n) != ST_OK) return ST_ERR_INTERNAL;
    st_status_t s = call(ch, ST_PROTO_METHOD_REGISTER, b, n, r);
    free(b);
    if (s == ST_OK && st_proto_register_reply_decode(r->buf, r->len, rep) != ST_OK) s = ST_ERR_PROTOCOL;
    free(r->buf);
    r->buf = NULL;
    return s;
}

/* n registrations at once (a flood arrives faster than any heartbeat interval): statuses in st[],
 * the last refusal's text in detail. */
static void reg_flood(st_rpc_channel_t *ch, int n, st_status_t *st, char *detail, size_t dn) {
    res_t *r = calloc((size_t)n, sizeof *r);
    int issued = 0;
    for (int k = 0; k < n; k++) {
        char name[32], ep[32];
        snprintf(name, sizeof name, "flood-%d", k);
        snprintf(ep, sizeof ep, "127.0.0.1:%d", 20000 + k);
        st_proto_register_req_t q = {.role = ST_PROTO_ROLE_EXPERT, .name = name, .data_endpoint = ep, .capacity = 4};
        uint8_t *b;
        size_t len;
        r[k].done = 1;
        r[k].st = ST_ERR_INTERNAL;
        if (st_proto_register_req_encode(&q, &b, &len) != ST_OK) continue;
        r[k].done = 0;
        if (st_rpc_unary(ch, ST_PROTO_METHOD_REGISTER, b, len, 10000, on_reply, &r[k]) != ST_OK) r[k].done = 1;
        else issued++;
        free(b);
    }
    for (int k = 0; k < n; k++) {
        while (!r[k].done) uv_run(&loop, UV_RUN_ONCE);
        st[k] = r[k].st;
        if (r[k].st != ST_OK) snprintf(detail, dn, "%s", r[k].detail);
        free(r[k].buf);
    }
    free(r);
}

/* Heartbeat; 1 known, 0 not known, -1 error. */
static int heartbeat(st_rpc_channel_t *ch, uint64_t id, const char *token) {
    st_proto_heartbeat_req_t q = {.member_id = id, .step = 1};
    snprintf(q.member_token, sizeof q.member_token, "%s", token);
    uint8_t *b;
    size_t n;
    res_t r;
    if (st_proto_heartbeat_req_encode(&q, &b, &n) != ST_OK) return -1;
    st_status_t s = call(ch, ST_PROTO_METHOD_HEARTBEAT, b, n, &r);
    free(b);
    st_proto_heartbeat_reply_t rep;
    int known = -1;
    if (s == ST_OK && st_proto_heartbeat_reply_decode(r.buf, r.len, &rep) == ST_OK) known = rep.known;
    free(r.buf);
    return known;
}

static st_status_t report(st_rpc_channel_t *ch, const st_proto_scores_t *sc, res_t *r) {
    uint8_t *b;
    size_t n;
    if (st_proto_scores_encode(sc, &b, &n) != ST_OK) return ST_ERR_INTERNAL;
    st_status_t s = call(ch, ST_PROTO_METHOD_REPORT_SCORES, b, n, r);
    free(b);
    free(r->buf);
    r->buf = NULL;
    return s;
}

/* ---------------------------------------------------------------- HTTP GET (blocking, loopback) */

static char *http_get(const char *hostport, const char *path) {
    char host[64];
    const char *c = strrchr(hostport, ':');
    if (!c || (size_t)(c - hostport) >= sizeof host) return NULL;
    memcpy(host, hostport, (size_t)(c - hostport));
    host[c - hostport] = 0;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(c + 1))};
    if (inet_pton(AF_INET, host, &a.sin_addr) != 1) return NULL;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct timeval tv = {.tv_sec = 5};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return NULL;
    }
    char req[256];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", path, hostport);
    if (write(fd, req, (size_t)n) != n) {
        close(fd);
        return NULL;
    }
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (len + 4096 > cap) buf = realloc(buf, cap *= 2);
        ssize_t k = read(fd, buf + len, cap - len - 1);
        if (k <= 0) break;
        len += (size_t)k;
    }
    close(fd);
    buf[len] = 0;
    char *body = strstr(buf, "\r\n\r\n");
    if (strncmp(buf, "HTTP/1.1 200", 12) != 0 || !body) {
        free(buf);
        return NULL;
    }
    char *out = strdup(body + 4);
    free(buf);
    return out;
}

static json_t *status_json(const coord_proc_t *c) {
    char *s = http_get(c->http, "/status");
    if (!s) return NULL;
    json_error_t e;
    json_t *j = json_loads(s, 0, &e);
    free(s);
    return j;
}

/* The member named name in /status: 1 alive, 0 dead, -1 absent, -2 no status. */
static int member_state(const coord_proc_t *c, const char *name) {
    json_t *j = status_json(c);
    if (!j) return -2;
    int st = -1;
    size_t i;
    json_t *m;
    json_array_foreach(json_object_get(j, "members"), i, m) {
        if (!strcmp(json_string_value(json_object_get(m, "name")) ?: "", name)) st = json_is_true(json_object_get(m, "alive"));
    }
    json_decref(j);
    return st;
}

static int member_count(const coord_proc_t *c) {
    json_t *j = status_json(c);
    if (!j) return -1;
    int n = (int)json_array_size(json_object_get(j, "members"));
    json_decref(j);
    return n;
}

/* /metrics: every sample line is "name[{labels}] value" with a finite value. */
static int metrics_valid(const char *text, char *bad, size_t bn) {
    const char *p = text;
    int samples = 0;
    while (*p) {
        const char *e = strchr(p, '\n');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        char line[512];
        snprintf(line, sizeof line, "%.*s", (int)ST_MIN(n, sizeof line - 1), p);
        p += n + (e ? 1 : 0);
        if (!line[0] || line[0] == '#') continue;
        char *sp = strrchr(line, ' ');
        char *end = NULL;
        double v = sp ? strtod(sp + 1, &end) : NAN;
        if (!sp || !end || *end || !isfinite(v) || strcasestr(sp + 1, "nan") || strcasestr(sp + 1, "inf")) {
            snprintf(bad, bn, "%s", line);
            return 0;
        }
        samples++;
    }
    return samples > 0;
}

static double metric(const char *text, const char *prefix) { /* first sample starting with prefix */
    const char *p = strstr(text, prefix);
    while (p && p != text && p[-1] != '\n') p = strstr(p + 1, prefix);
    if (!p) return NAN;
    const char *e = strchr(p, '\n');
    const char *sp = p;
    for (const char *q = p; q < (e ? e : p + strlen(p)); q++)
        if (*q == ' ') sp = q;
    return strtod(sp + 1, NULL);
}

/* ---------------------------------------------------------------- members */

static int is_hex32(const char *t) {
    if (strlen(t) != 32) return 0;
    for (int i = 0; i < 32; i++)
        if (!strchr("0123456789abcdef", t[i])) return 0;
    return 1;
}

/* grpc.health.v1.Health/Check: a coordinator without members cannot serve (NOT_SERVING = 2) */
static void test_health(st_rpc_channel_t *ch) {
    res_t r;
    static const uint8_t empty[1] = {0}, coordsvc[] = "\x0a\x15strata.v1.Coordinator", other[] = "\x0a\x04nope",
                         cut[] = "\x0a\x05" "ab", extra[] = "\x10\x07\x0a\x00";
    CHECK(call(ch, "/grpc.health.v1.Health/Check", empty, 0, &r) == ST_OK && r.len == 2 && r.buf[0] == 0x08 &&
              r.buf[1] == 2,
          "health of the server (\"\"): NOT_SERVING without members (%s)", st_status_str(r.st));
    free(r.buf);
    CHECK(call(ch, "/grpc.health.v1.Health/Check", coordsvc, sizeof coordsvc - 1, &r) == ST_OK && r.len == 2 &&
              r.buf[1] == 2,
          "health of strata.v1.Coordinator");
    free(r.buf);
    CHECK(call(ch, "/grpc.health.v1.Health/Check", extra, sizeof extra - 1, &r) == ST_OK && r.len == 2,
          "an unknown varint field is skipped");
    free(r.buf);
    CHECK(call(ch, "/grpc.health.v1.Health/Check", other, sizeof other - 1, &r) == ST_ERR_NOT_FOUND,
          "an unknown service: gRPC NOT_FOUND, as the health protocol says");
    free(r.buf);
    CHECK(call(ch, "/grpc.health.v1.Health/Check", cut, sizeof cut - 1, &r) == ST_ERR_INVALID_ARG,
          "a cut request is refused");
    free(r.buf);
}

static void test_ids(st_rpc_channel_t *ch) {
    st_proto_register_reply_t r[3];
    res_t rr;
    char name[32];
    int ok = 1;
    for (int i = 0; i < 3; i++) {
        snprintf(name, sizeof name, "ids-%d", i);
        ok &= reg(ch, ST_PROTO_ROLE_EXPERT, name, "127.0.0.1:9", &r[i], &rr) == ST_OK;
    }
    CHECK(ok, "three registrations: %s", rr.detail);
    if (!ok) return;
    int tokens = 1, seq = 0, high = 0, safe = 1;
    for (int i = 0; i < 3; i++) {
        tokens &= is_hex32(r[i].member_token);
        high |= r[i].member_id >> 32 != 0;
        safe &= r[i].member_id < (1ull << 53);
        for (int k = 0; k < 3; k++) seq |= k != i && (r[k].member_id == r[i].member_id + 1 || r[k].member_id == r[i].member_id);
    }
    CHECK(tokens, "member tokens are 32 hex digits (got \"%s\")", r[0].member_token);
    CHECK(safe, "member ids below 2^53 (exact in JSON): %llu %llu %llu", (unsigned long long)r[0].member_id,
          (unsigned long long)r[1].member_id, (unsigned long long)r[2].member_id);
    CHECK(!seq && high, "member ids are random, not a counter: %llu %llu %llu", (unsigned long long)r[0].member_id,
          (unsigned long long)r[1].member_id, (unsigned long long)r[2].member_id);
    CHECK(strcmp(r[0].member_token, r[1].member_token) != 0, "each registration its own token");
}

static void test_forged_heartbeat(st_rpc_channel_t *ch, const coord_proc_t *c) {
    st_proto_register_reply_t r;
    res_t rr;
    CHECK(reg(ch, ST_PROTO_ROLE_EXPERT, "forged", "127.0.0.1:10", &r, &rr) == ST_OK, "register: %s", rr.detail);
    CHECK(heartbeat(ch, r.member_id, r.member_token) == 1, "a heartbeat with id and token counts");
    CHECK(heartbeat(ch, r.member_id, "00000000000000000000000000000000") == 0, "wrong token: not known");
    CHECK(heartbeat(ch, r.member_id, "") == 0, "no token: not known");
    CHECK(heartbeat(ch, r.member_id + 1, r.member_token) == 0, "guessed id (id + 1) with the token: not known");
    /* the member stops; an attacker keeps sending what it can forge: the member still dies */
    double end = st_time_sec() + 8.0 * HB_MS / 1000.0;
    int forged_known = 0;
    while (st_time_sec() < end) {
        forged_known |= heartbeat(ch, r.member_id, "") == 1;
        forged_known |= heartbeat(ch, r.member_id, "0123456789abcdef0123456789abcdef") == 1;
        forged_known |= heartbeat(ch, r.member_id ^ 1, r.member_token) == 1;
        usleep(20000);
    }
    CHECK(!forged_known, "no forged heartbeat was accepted");
    CHECK(member_state(c, "forged") == 0, "forged heartbeats did not keep the member alive (state %d)",
          member_state(c, "forged"));
    /* a dropped member's own old id and token no longer count: it must register again */
    CHECK(heartbeat(ch, r.member_id, r.member_token) == 0, "the dropped member's old id is not known");
}

static void test_flood(st_rpc_channel_t *ch, const coord_proc_t *c) {
    st_proto_register_reply_t r;
    res_t rr;
    /* the same member 300 times (restarts, reconnections): one entry, never full */
    int ok = 0;
    for (int i = 0; i < 300; i++) ok += reg(ch, ST_PROTO_ROLE_EXPERT, "same", "127.0.0.1:11", &r, &rr) == ST_OK;
    CHECK(ok == 300, "300 re-registrations of one name and endpoint all succeed (%d; last: %s)", ok, rr.detail);
    json_t *j = status_json(c);
    size_t i, same = 0;
    json_t *m;
    json_array_foreach(json_object_get(j, "members"), i, m) same += !strcmp(json_string_value(json_object_get(m, "name")) ?: "", "same");
    json_decref(j);
    CHECK(same == 1, "re-registration replaces the entry: %zu entries named 'same'", same);
    /* 300 distinct members at once: beyond the table, a clear RESOURCE_EXHAUSTED */
    int okd = 0, full = 0, other = 0;
    char detail[512] = "";
    st_status_t fs[300];
    reg_flood(ch, 300, fs, detail, sizeof detail);
    for (int k = 0; k < 300; k++) {
        okd += fs[k] == ST_OK;
        full += fs[k] == ST_ERR_CAPACITY;
        other += fs[k] != ST_OK && fs[k] != ST_ERR_CAPACITY;
    }
    CHECK(okd >= 200 && full > 0 && other == 0 && okd + full == 300, "flood: %d registered, %d refused full, %d other", okd,
          full, other);
    CHECK(strstr(detail, "member table full") != NULL, "the refusal says why: \"%s\"", detail);
    /* nothing heartbeats: the flood dies and is forgotten, the table empties */
    int n = -1;
    for (int t = 0; t < 300; t++) { /* up to 15 s; ~5 s expected (400 ms heartbeats) */
        n = member_count(c);
        if (n >= 0 && n <= 24) break;
        usleep(50000);
    }
    /* (the 16 most recently dead stay listed a while) */
    CHECK(n >= 0 && n <= 24, "dead members are forgotten: /status lists %d members", n);
    CHECK(reg(ch, ST_PROTO_ROLE_EXPERT, "after-flood", "127.0.0.1:12", &r, &rr) == ST_OK, "registration after the flood: %s",
          rr.detail);
    /* the placement's member list carries live members only */
    st_proto_version_req_t q = {0};
    uint8_t *b;
    size_t len;
    st_proto_version_req_encode(&q, &b, &len);
    st_proto_placement_t p;
    int pok = call(ch, ST_PROTO_METHOD_PLACEMENT, b, len, &rr) == ST_OK && st_proto_placement_decode(rr.buf, rr.len, &p) == ST_OK;
    free(b);
    free(rr.buf);
    int dead = 0;
    for (size_t k = 0; pok && k < p.n_members; k++) dead += !p.members[k].alive;
    CHECK(pok && dead == 0 && p.n_members >= 1, "placement lists %zu members, %d dead", pok ? p.n_members : 0, dead);
    if (pok) st_proto_placement_cleanup(&p);
}

static void test_scores(st_rpc_channel_t *ch, const coord_proc_t *c) {
    st_proto_register_reply_t r;
    res_t rr;
    CHECK(reg(ch, ST_PROTO_ROLE_ATTENTION, "scorer", "127.0.0.1:13", &r, &rr) == ST_OK, "register worker: %s", rr.detail);
    enum { L = 8, E = 16 }; /* the tiny preset */
    static uint32_t load[L * E];
    for (int i = 0; i < L * E; i++) load[i] = (uint32_t)i % 5;
    st_proto_scores_t base = {.worker_id = r.member_id, .step = 1, .n_layers = L, .n_experts = E, .n_load = L * E,
                              .load = load, .dispatch_bytes = 1000, .reply_bytes = 1000, .messages = 4};
    for (int k = 0; k < ST_PROTO_STAGES; k++) base.stage_s[k] = 0.001;
    memcpy(base.member_token, r.member_token, sizeof base.member_token);
    CHECK(report(ch, &base, &rr) == ST_OK, "a valid report is accepted: %s", rr.detail);
    char *m0 = http_get(c->http, "/metrics");
    double steps0 = m0 ? metric(m0, "strata_worker_steps_total") : NAN;
    double att0 = m0 ? metric(m0, "strata_step_stage_seconds_total{stage=\"attention\"}") : NAN;
    CHECK(steps0 == 1, "one step counted (%g)", steps0);
    static const double bad_s[] = {NAN, INFINITY, -INFINITY, -1.0, 1e9};
    for (size_t i = 0; i < ST_ARRAY_LEN(bad_s); i++) {
        st_proto_scores_t s = base;
        s.step = 2 + i;
        s.stage_s[i % ST_PROTO_STAGES] = bad_s[i];
        CHECK(report(ch, &s, &rr) == ST_ERR_INVALID_ARG, "stage time %g refused INVALID_ARGUMENT (%s)", bad_s[i], rr.detail);
    }
    st_proto_scores_t s = base;
    s.n_layers = L - 1;
    s.n_load = 0;
    s.load = NULL;
    CHECK(report(ch, &s, &rr) == ST_ERR_INVALID_ARG, "n_layers mismatching the model refused (%s)", rr.detail);
    s = base;
    s.n_experts = E * 2;
    s.n_load = 0;
    s.load = NULL;
    CHECK(report(ch, &s, &rr) == ST_ERR_INVALID_ARG, "n_experts mismatching the model refused (%s)", rr.detail);
    static uint32_t huge[L * E];
    memcpy(huge, load, sizeof huge);
    huge[17] = 0xffffffffu;
    s = base;
    s.load = huge;
    CHECK(report(ch, &s, &rr) == ST_ERR_INVALID_ARG, "load 2^32-1 refused (%s)", rr.detail);
    s = base;
    s.dispatch_bytes = 1ull << 62;
    CHECK(report(ch, &s, &rr) == ST_ERR_INVALID_ARG, "dispatch bytes 2^62 refused (%s)", rr.detail);
    /* summaries that do not parse, with otherwise valid numbers: refused, and nothing counted */
    static uint8_t junk[64];
    const uint8_t *sums[2] = {junk, junk};
    size_t lens[2] = {sizeof junk, 0};
    s = base;
    s.n_summaries = 1;
    s.summaries = sums;
    s.summary_lens = lens;
    CHECK(report(ch, &s, &rr) == ST_ERR_INVALID_ARG, "a malformed summary refused (%s)", rr.detail);
    s.summaries = sums + 1;
    s.summary_lens = lens + 1;
    CHECK(report(ch, &s, &rr) == ST_ERR_INVALID_ARG, "an empty summary refused (%s)", rr.detail);
    /* not this worker's token / not a worker */
    /* (the status code, UNAUTHENTICATED, is checked in the auth mode: it needs common/rpc's mapping) */
    s = base;
    s.member_token[0] = s.member_token[0] == 'a' ? 'b' : 'a';
    CHECK(report(ch, &s, &rr) != ST_OK && strstr(rr.detail, "wrong member token"), "a report with a wrong member token refused (%s)",
          rr.detail);
    s = base;
    s.worker_id ^= 1;
    CHECK(report(ch, &s, &rr) != ST_OK && strstr(rr.detail, "unknown member"), "a report for another id refused (%s)", rr.detail);
    /* nothing moved, and both views are still valid */
    char *m1 = http_get(c->http, "/metrics"), bad[512] = "";
    CHECK(m1 && metrics_valid(m1, bad, sizeof bad), "/metrics is valid text with finite values (bad line: %s)", bad);
    double steps1 = m1 ? metric(m1, "strata_worker_steps_total") : NAN;
    double att1 = m1 ? metric(m1, "strata_step_stage_seconds_total{stage=\"attention\"}") : NAN;
    CHECK(steps1 == steps0 && att1 == att0, "refused reports changed nothing (steps %g -> %g, attention %g -> %g)", steps0,
          steps1, att0, att1);
    json_t *j = status_json(c);
    CHECK(j != NULL, "/status is valid JSON");
    json_t *split = json_object_get(j, "step_ms");
    const char *key;
    json_t *v;
    int finite = split != NULL;
    json_object_foreach(split, key, v) finite &= json_is_number(v) && isfinite(json_number_value(v));
    CHECK(finite, "/status step_ms values are finite numbers");
    json_decref(j);
    free(m0);
    free(m1);
}

/* ---------------------------------------------------------------- a member across a restart */

typedef struct {
    int registered;
    uint64_t id;
    char token[ST_PROTO_TOKEN_MAX + 1];
} mstate_t;

static void on_registered(void *arg, uint64_t id, const char *token) {
    mstate_t *s = arg;
    s->registered++;
    s->id = id;
    snprintf(s->token, sizeof s->token, "%s", token);
}

static int wait_registered(mstate_t *s, int count, double timeout_s) {
    double end = st_time_sec() + timeout_s;
    while (s->registered < count && st_time_sec() < end) run_for(0.02);
    return s->registered >= count;
}

static void on_stopped(void *arg) { *(int *)arg = 1; }

static void member_stop(st_member_t *m) {
    int done = 0;
    st_member_stop(m, on_stopped, &done);
    while (!done) uv_run(&loop, UV_RUN_ONCE);
}

/* Lines this process logs while its loop runs for s seconds (fd 2 redirected to a file); only
 * lines containing `only` when given. */
static int count_log(double s, const char *only, int *errors) {
    char path[700];
    snprintf(path, sizeof path, "%s/outage.log", tmp);
    fflush(stderr);
    int saved = dup(2), fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0600);
    dup2(fd, 2);
    close(fd);
    run_for(s);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    FILE *f = fopen(path, "r");
    int n = 0;
    char line[1024];
    *errors = 0;
    while (f && fgets(line, sizeof line, f)) {
        if (only && !strstr(line, only)) continue;
        n++;
        *errors += strstr(line, "ERROR") != NULL;
    }
    if (f) fclose(f);
    return n;
}

static void test_restart(void) {
    char ready[700];
    snprintf(ready, sizeof ready, "%s/coord-r.ready", tmp);
    coord_proc_t c1 = {0}, c2 = {0};
    if (!coord_start(&c1, ready)) {
        CHECK(0, "first coordinator starts");
        return;
    }
    mstate_t ms = {0};
    st_rpc_sec_t rs = {.token = sec.grpc_token};
    /* the seed is the first coordinator's fixed address; the file knows where it is now */
    st_member_opts_t mo = {.role = ST_PROTO_ROLE_EXPERT, .name = "mover", .data_endpoint = "127.0.0.1:14", .capacity = 1,
                           .coordinator = c1.grpc, .coordinator_file = ready, .sec = &rs, .rpc_timeout_ms = 500,
                           .on_registered = on_registered, .arg = &ms};
    st_member_t *m = NULL;
    CHECK(st_member_start(&loop, &mo, &m) == ST_OK, "member starts: %s", st_err_last());
    if (!m) return;
    CHECK(wait_registered(&ms, 1, 5.0), "member registers with the first coordinator");
    CHECK(is_hex32(ms.token), "on_registered gets the member token (\"%s\")", ms.token);
    CHECK(member_state(&c1, "mover") == 1, "first coordinator lists it alive");
    uint64_t id1 = ms.id;
    /* outage: the coordinator dies; its port stays taken (bound, not listening: refused) */
    int port1 = c1.grpc_port;
    coord_kill(&c1);
    int hold = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port1)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    int held = bind(hold, (struct sockaddr *)&a, sizeof a) == 0;
    int errors = 0, lines = count_log(2.5, "member.c", &errors);
    CHECK(errors == 0 && lines <= 2, "a 2.5 s outage: the member logs %d lines (%d ERROR): rate-limited WARNs only", lines,
          errors);
    if (!coord_start(&c2, ready)) {
        CHECK(0, "second coordinator starts");
    } else {
        CHECK(!held || c2.grpc_port != port1, "second coordinator on another port (%d, was %d)", c2.grpc_port, port1);
        CHECK(wait_registered(&ms, 2, 10.0), "member re-registers with the coordinator on the new port");
        CHECK(ms.id != id1, "a new registration (id %llu, was %llu)", (unsigned long long)ms.id, (unsigned long long)id1);
        int st = -2;
        for (int i = 0; i < 20 && st != 1; i++, usleep(50000)) st = member_state(&c2, "mover");
        CHECK(st == 1, "second coordinator lists the member alive (%d)", st);
        /* and it stays alive: its heartbeats (with the new token) count */
        run_for(5.0 * HB_MS / 1000.0);
        CHECK(member_state(&c2, "mover") == 1, "heartbeats keep it alive at the new coordinator");
    }
    member_stop(m);
    close(hold);
    /* a seed list: a dead address first, then the live one */
    if (c2.pid > 0) {
        char seeds[300];
        snprintf(seeds, sizeof seeds, "127.0.0.1:%d,%s", port1, c2.grpc);
        hold = socket(AF_INET, SOCK_STREAM, 0);
        held = bind(hold, (struct sockaddr *)&a, sizeof a) == 0;
        mstate_t ms2 = {0};
        st_member_opts_t mo2 = mo;
        mo2.name = "seeded";
        mo2.coordinator = seeds;
        mo2.coordinator_file = NULL;
        mo2.arg = &ms2;
        st_member_t *m2 = NULL;
        CHECK(st_member_start(&loop, &mo2, &m2) == ST_OK, "member with a seed list starts: %s", st_err_last());
        if (m2) {
            CHECK(wait_registered(&ms2, 1, 5.0), "member registers through the second seed (%s)", seeds);
            member_stop(m2);
        }
        close(hold);
        coord_kill(&c2);
    }
}

/* A coordinator that stalls (stopped 1.5 s, five heartbeat periods, as a starved process is): the
 * heartbeats sent meanwhile wait in its socket and libuv runs the sweep timer before them, so the
 * sweep must not count the time it was not listening as the members' silence. The member stays
 * the same registration (before: dropped on resume, then registered again). Its own coordinator,
 * with 300 ms heartbeats: on this busy machine a resumed process may need more than 200 ms to run. */
static void test_stall(void) {
    char ready[700];
    snprintf(ready, sizeof ready, "%s/coord-s.ready", tmp);
    coord_proc_t c = {0};
    if (!coord_start_hb(&c, ready, 300)) {
        CHECK(0, "stall coordinator starts");
        return;
    }
    mstate_t ms = {0};
    st_rpc_sec_t rs = {.token = sec.grpc_token};
    st_member_opts_t mo = {.role = ST_PROTO_ROLE_EXPERT, .name = "patient", .data_endpoint = "127.0.0.1:15", .capacity = 1,
                           .coordinator = c.grpc, .sec = &rs, .rpc_timeout_ms = 5000, .on_registered = on_registered,
                           .arg = &ms};
    st_member_t *m = NULL;
    CHECK(st_member_start(&loop, &mo, &m) == ST_OK, "member starts: %s", st_err_last());
    if (m) {
        CHECK(wait_registered(&ms, 1, 5.0), "member registers");
        run_for(0.6);
        uint64_t id1 = ms.id;
        int drops = 0;
        for (int round = 0; round < 3; round++) { /* three stalls: a drop on any of them fails */
            kill(c.pid, SIGSTOP);
            run_for(1.5); /* the member keeps heartbeating into the stopped process */
            kill(c.pid, SIGCONT);
            run_for(1.0);
            drops += ms.registered != 1 || ms.id != id1;
        }
        CHECK(drops == 0 && ms.registered == 1,
              "a member heartbeating through three 1.5 s coordinator stalls stays registered (%d registrations, "
              "%d rounds with a drop)",
              ms.registered, drops);
        CHECK(member_state(&c, "patient") == 1, "and alive");
        member_stop(m);
    }
    CHECK(coord_stop(&c) == 0, "the stalled coordinator stops cleanly");
}

/* The whole process during an outage (needs common/rpc to leave failed calls to the caller's log):
 * no ERROR line, a few WARNs. */
static void test_quiet(void) {
    char ready[700];
    snprintf(ready, sizeof ready, "%s/coord-q.ready", tmp);
    coord_proc_t c = {0};
    if (!coord_start(&c, ready)) {
        CHECK(0, "coordinator starts");
        return;
    }
    mstate_t ms = {0};
    st_rpc_sec_t rs = {.token = sec.grpc_token};
    st_member_opts_t mo = {.role = ST_PROTO_ROLE_ATTENTION, .name = "quiet", .data_endpoint = "127.0.0.1:18", .capacity = 1,
                           .coordinator = c.grpc, .sec = &rs, .rpc_timeout_ms = 500, .on_registered = on_registered, .arg = &ms};
    st_member_t *m = NULL;
    CHECK(st_member_start(&loop, &mo, &m) == ST_OK, "member starts: %s", st_err_last());
    if (!m) return;
    CHECK(wait_registered(&ms, 1, 5.0), "member registers");
    coord_kill(&c);
    int errors = 0, lines = count_log(3.0, NULL, &errors);
    CHECK(errors == 0 && lines <= 4, "a 3 s coordinator outage logs %d lines, %d of them ERROR (want a few WARNs)", lines, errors);
    member_stop(m);
}

/* ---------------------------------------------------------------- auth (needs common/rpc's checks) */

static void test_auth(const coord_proc_t *c, st_rpc_channel_t *ch) {
    st_rpc_channel_t *none = channel(c->grpc, NULL), *wrong = channel(c->grpc, "not-the-cluster-token");
    st_proto_register_reply_t r;
    res_t rr;
    CHECK(reg(none, ST_PROTO_ROLE_ATTENTION, "intruder", "127.0.0.1:15", &r, &rr) == ST_ERR_AUTH,
          "RegisterMember without the cluster token refused UNAUTHENTICATED (%s)", rr.detail);
    CHECK(reg(wrong, ST_PROTO_ROLE_EXPERT, "intruder2", "127.0.0.1:16", &r, &rr) == ST_ERR_AUTH,
          "RegisterMember with a wrong cluster token refused UNAUTHENTICATED (%s)", rr.detail);
    CHECK(member_state(c, "intruder") == -1 && member_state(c, "intruder2") == -1, "no intruder in /status");
    /* a real member, then its id and token from another connection (another process) */
    CHECK(reg(ch, ST_PROTO_ROLE_EXPERT, "bound", "127.0.0.1:17", &r, &rr) == ST_OK, "register: %s", rr.detail);
    char idbuf[32];
    snprintf(idbuf, sizeof idbuf, "%llu", (unsigned long long)r.member_id);
    pid_t pid = fork();
    if (pid == 0) {
        char self[600];
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        self[n > 0 ? n : 0] = 0;
        execl(self, self, "--heartbeat", c->grpc, idbuf, r.member_token, secret_file, (char *)NULL);
        _exit(127);
    }
    int ws = 0;
    waitpid(pid, &ws, 0);
    int rc = WIFEXITED(ws) ? WEXITSTATUS(ws) : -1;
    CHECK(rc == 0, "a heartbeat with the right id and token from another connection is not accepted (child: %d)", rc);
    CHECK(heartbeat(ch, r.member_id, r.member_token) == 1, "the registering connection's heartbeat still counts");
    st_proto_heartbeat_req_t q = {.member_id = r.member_id};
    memcpy(q.member_token, r.member_token, sizeof q.member_token);
    uint8_t *b;
    size_t n;
    st_proto_heartbeat_req_encode(&q, &b, &n);
    CHECK(call(none, ST_PROTO_METHOD_HEARTBEAT, b, n, &rr) == ST_ERR_AUTH, "Heartbeat without the cluster token refused");
    free(b);
    free(rr.buf);
    /* a worker's report with a wrong member token: UNAUTHENTICATED */
    CHECK(reg(ch, ST_PROTO_ROLE_ATTENTION, "bound-w", "127.0.0.1:19", &r, &rr) == ST_OK, "register worker: %s", rr.detail);
    st_proto_scores_t sc = {.worker_id = r.member_id, .n_layers = 8, .n_experts = 16};
    snprintf(sc.member_token, sizeof sc.member_token, "%s", "0123456789abcdef0123456789abcdef");
    CHECK(report(ch, &sc, &rr) == ST_ERR_AUTH, "ReportScores with a wrong member token: UNAUTHENTICATED (%s)", rr.detail);
    st_rpc_channel_destroy(none);
    st_rpc_channel_destroy(wrong);
}

/* Child of test_auth: heartbeat from this process's own connection. Exit 0 when not known. */
static int heartbeat_child(char **argv) {
    st_sec_opts_t s = {.secret_file = argv[5]};
    if (st_sec_opts_finish(&s, "test") != ST_OK || uv_loop_init(&loop) != 0 || st_rpc_init(&loop) != ST_OK) return 2;
    st_rpc_channel_t *ch = channel(argv[2], s.grpc_token);
    int known = heartbeat(ch, strtoull(argv[3], NULL, 10), argv[4]);
    st_rpc_channel_destroy(ch);
    st_rpc_cleanup();
    uv_run(&loop, UV_RUN_DEFAULT);
    return known == 0 ? 0 : known == 1 ? 1 : 2;
}

int main(int argc, char **argv) {
    if (argc == 6 && !strcmp(argv[1], "--heartbeat")) return heartbeat_child(argv);
    const char *mode = argc > 1 ? argv[1] : "members";
    const char *b = getenv("STRATA_BIN"), *t = getenv("STRATA_TEST_TMP");
    if (!b) {
        fprintf(stderr, "STRATA_BIN not set (ctest sets it)\n");
        return 1;
    }
    snprintf(bin, sizeof bin, "%s", b);
    snprintf(tmp, sizeof tmp, "%s/coordm.XXXXXX", t ? t : "/tmp");
    if (!mkdtemp(tmp)) return 1;
    signal(SIGSEGV, on_fatal);
    signal(SIGABRT, on_fatal);
    signal(SIGPIPE, SIG_IGN);
    atexit(kill_children);
    char cmd[1400];
    snprintf(ck, sizeof ck, "%s/ck", tmp);
    snprintf(cmd, sizeof cmd, "'%s/strata' ckpt init --preset tiny --out '%s' --seed 3 >/dev/null 2>&1", bin, ck);
    if (system(cmd) != 0) {
        fprintf(stderr, "cannot write a tiny checkpoint\n");
        return 1;
    }
    snprintf(secret_file, sizeof secret_file, "%s/cluster.secret", tmp);
    sec.secret_file = secret_file;
    if (st_secret_generate_file(secret_file) != ST_OK || st_sec_opts_finish(&sec, "test") != ST_OK) return 1;
    uv_loop_init(&loop);
    if (st_rpc_init(&loop) != ST_OK) return 1;
    if (!strcmp(mode, "restart")) {
        test_restart();
    } else if (!strcmp(mode, "quiet")) {
        test_quiet();
    } else {
        coord_proc_t c = {0};
        char ready[700];
        snprintf(ready, sizeof ready, "%s/coord.ready", tmp);
        CHECK(coord_start(&c, ready), "coordinator starts");
        st_rpc_channel_t *ch = channel(c.grpc, sec.grpc_token);
        if (c.pid > 0 && ch) {
            if (!strcmp(mode, "auth")) {
                test_auth(&c, ch);
            } else {
                test_health(ch);
                test_ids(ch);
                test_forged_heartbeat(ch, &c);
                test_scores(ch, &c);
                test_stall();
                /* the flood on a coordinator with 400 ms heartbeats: 300 registrations land well
                 * within the 0.8 s before the first would be dropped, even under ASan */
                coord_proc_t f = {0};
                char fready[700];
                snprintf(fready, sizeof fready, "%s/coord-f.ready", tmp);
                st_rpc_channel_t *fch = NULL;
                CHECK(coord_start_hb(&f, fready, 400) && (fch = channel(f.grpc, sec.grpc_token)), "flood coordinator starts");
                if (fch) test_flood(fch, &f);
                CHECK(f.pid > 0 && waitpid(f.pid, NULL, WNOHANG) == 0, "the flooded coordinator is still running");
                st_rpc_channel_destroy(fch);
                CHECK(coord_stop(&f) == 0, "the flooded coordinator stops cleanly");
            }
            int alive = waitpid(c.pid, NULL, WNOHANG) == 0;
            CHECK(alive, "the coordinator is still running");
        }
        st_rpc_channel_destroy(ch);
        if (c.pid > 0) CHECK(coord_stop(&c) == 0, "the coordinator stops cleanly (exit 0, no sanitizer report)");
    }
    kill_children();
    st_rpc_cleanup();
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    if (st_t_fail == 0) {
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
        if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", tmp);
    }
    return st_test_done();
}
