/* A fake coordinator drives a real strata-attn and real strata-expert servers over loopback:
 *  1. hostile Worker/Generate requests (the max_tokens wrap-around of issue 13, ids past the
 *     vocabulary, NaN temperature, too many stop ids, an oversized prompt) end INVALID_ARGUMENT /
 *     OUT_OF_RANGE before any chunk, and the worker keeps serving;
 *  2. a full worker (every sequence slot taken) answers RESOURCE_EXHAUSTED before any chunk;
 *  3. a flood of placements naming ~150 expert servers does not fill the worker's expert-server
 *     table: a server that joins afterwards is used;
 *  4. a map with more holders than the table has slots fails requests with an error naming the full
 *     table, and the worker serves again once the map shrinks;
 *  5. SIGTERM drains: a new request is refused "draining" before any chunk, the one in flight
 *     finishes, the worker exits 0;
 *  6. with a cluster secret the worker's port refuses calls without the coordinator's member token
 *     (skipped while common/rpc does not enforce tokens).
 * Bounded by alarm(); every child is killed at exit. */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

#include "harness.h"
#include "strata/model.h"
#include "strata/proto.h"
#include "strata/rpc.h"

#define MAX_REAL 16
#define R 8

static uv_loop_t loop;
static st_config_t cfg;
static char tmp[512], bin[512], ck[600];
static pid_t kids[8];
static int n_kids;

/* ---------------------------------------------------------------- processes */

static pid_t spawn(char *const argv[], const char *log) {
    pid_t p = fork();
    if (p == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        execv(argv[0], argv);
        _exit(127);
    }
    if (p > 0) kids[n_kids++] = p;
    return p;
}

static void kill_kids(void) {
    for (int i = 0; i < n_kids; i++)
        if (kids[i] > 0) {
            kill(kids[i], SIGKILL);
            waitpid(kids[i], NULL, 0);
            kids[i] = 0;
        }
}

static void forget_kid(pid_t p) {
    for (int i = 0; i < n_kids; i++)
        if (kids[i] == p) kids[i] = 0;
}

static void on_alarm(int sig) {
    (void)sig;
    static const char m[] = "FAIL test_worker_guard: watchdog expired\n";
    if (write(2, m, sizeof m - 1) < 0) {
    }
    for (int i = 0; i < n_kids; i++)
        if (kids[i] > 0) kill(kids[i], SIGKILL);
    _exit(1);
}

static void tail_log(const char *name) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "echo '== %s'; tail -n 30 '%s/%s' 1>&2", name, tmp, name);
    if (system(cmd) != 0) {
    }
}

/* ---------------------------------------------------------------- the fake coordinator */

typedef struct {
    uint64_t id;
    st_proto_role_t role;
    char name[64], endpoint[128];
    uint32_t capacity;
} member_t;

static member_t real[MAX_REAL];
static int n_real;
static uint8_t *pl_buf;
static size_t pl_len;
static uint64_t pl_version;

static void reply(st_rpc_call_t *call, uint8_t *buf, size_t n, st_status_t s) {
    if (s != ST_OK) {
        st_rpc_call_finish(call, ST_ERR_INTERNAL, "encode");
        return;
    }
    st_rpc_call_reply(call, buf, n);
    free(buf);
}

static void noop(void *arg) {
    (void)arg;
}

static void h_register(st_rpc_call_t *call, const uint8_t *req, size_t len, void *arg) {
    (void)arg;
    st_proto_register_req_t r;
    if (st_proto_register_req_decode(req, len, &r) != ST_OK || n_real == MAX_REAL) {
        st_rpc_call_finish(call, ST_ERR_INVALID_ARG, "bad register");
        return;
    }
    member_t *m = &real[n_real];
    *m = (member_t){.id = 100 + (uint64_t)n_real, .role = r.role, .capacity = r.capacity};
    snprintf(m->name, sizeof m->name, "%s", r.name ? r.name : "");
    snprintf(m->endpoint, sizeof m->endpoint, "%s", r.data_endpoint ? r.data_endpoint : "");
    n_real++;
    st_proto_register_req_cleanup(&r);
    st_proto_register_reply_t rep = {.member_id = m->id, .heartbeat_interval_ms = 100, .placement_version = pl_version};
    uint8_t *buf = NULL;
    size_t n = 0;
    st_status_t s = st_proto_register_reply_encode(&rep, &buf, &n);
    reply(call, buf, n, s);
}

static void h_heartbeat(st_rpc_call_t *call, const uint8_t *req, size_t len, void *arg) {
    (void)arg;
    st_proto_heartbeat_req_t r;
    if (st_proto_heartbeat_req_decode(req, len, &r) != ST_OK) {
        st_rpc_call_finish(call, ST_ERR_INVALID_ARG, "bad heartbeat");
        return;
    }
    int known = 0;
    for (int i = 0; i < n_real; i++)
        known |= real[i].id == r.member_id;
    st_proto_heartbeat_req_cleanup(&r);
    st_proto_heartbeat_reply_t rep = {.known = known, .placement_version = pl_version};
    uint8_t *buf;
    size_t n;
    st_status_t s = st_proto_heartbeat_reply_encode(&rep, &buf, &n);
    reply(call, buf, n, s);
}

static void h_placement(st_rpc_call_t *call, const uint8_t *req, size_t len, void *arg) {
    (void)arg;
    st_proto_version_req_t r;
    if (st_proto_version_req_decode(req, len, &r) != ST_OK) {
        st_rpc_call_finish(call, ST_ERR_INVALID_ARG, "bad request");
        return;
    }
    if (pl_buf && r.known_version != pl_version) {
        st_rpc_call_reply(call, pl_buf, pl_len);
        return;
    }
    st_proto_placement_t u = {.version = pl_version, .unchanged = 1};
    uint8_t *buf;
    size_t n;
    st_status_t s = st_proto_placement_encode(&u, &buf, &n);
    reply(call, buf, n, s);
}

static void h_thresholds(st_rpc_call_t *call, const uint8_t *req, size_t len, void *arg) {
    (void)req, (void)len, (void)arg;
    st_proto_thresholds_t t = {.unchanged = 1};
    uint8_t *buf;
    size_t n;
    st_status_t s = st_proto_thresholds_encode(&t, &buf, &n);
    reply(call, buf, n, s);
}

static void h_scores(st_rpc_call_t *call, const uint8_t *req, size_t len, void *arg) {
    (void)req, (void)len, (void)arg;
    st_proto_scores_reply_t t = {0};
    uint8_t *buf;
    size_t n;
    st_status_t s = st_proto_scores_reply_encode(&t, &buf, &n);
    reply(call, buf, n, s);
}

static const member_t *real_by_name(const char *name) { /* the newest registration */
    for (int i = n_real - 1; i >= 0; i--)
        if (!strcmp(real[i].name, name)) return &real[i];
    return NULL;
}

/* holders(cell, out[R]) → count; fake expert members [fake_lo, fake_hi) and [fake2_lo, fake2_hi)
 * (after the first) are listed alive at a port where nothing listens */
typedef int (*holders_fn)(size_t cell, uint64_t *out);

static void publish(holders_fn holders, uint64_t fake_lo, uint64_t fake_hi, uint64_t fake2_lo, uint64_t fake2_hi) {
    size_t cells = (size_t)cfg.n_layers * cfg.n_experts;
    st_proto_placement_t p = {
        .version = pl_version + 1, .n_layers = (uint32_t)cfg.n_layers, .n_experts = (uint32_t)cfg.n_experts};
    p.offsets = calloc(cells + 1, sizeof(uint32_t));
    p.member_ids = calloc(cells * R, sizeof(uint64_t));
    size_t nm = (size_t)n_real + (size_t)(fake_hi - fake_lo) + (size_t)(fake2_hi - fake2_lo);
    p.members = calloc(nm ? nm : 1, sizeof(st_proto_member_t));
    char(*names)[32] = calloc(nm ? nm : 1, 32);
    for (size_t i = 0; i < cells; i++) {
        int k = holders(i, p.member_ids + p.offsets[i]);
        p.offsets[i + 1] = p.offsets[i] + (uint32_t)k;
    }
    p.n_member_ids = p.offsets[cells];
    for (int i = 0; i < n_real; i++)
        p.members[p.n_members++] = (st_proto_member_t){.member_id = real[i].id,
                                                       .role = real[i].role,
                                                       .name = real[i].name,
                                                       .data_endpoint = real[i].endpoint,
                                                       .capacity = real[i].capacity,
                                                       .alive = 1};
    uint64_t lo[2] = {fake_lo, fake2_lo}, hi[2] = {fake_hi, fake2_hi};
    for (int g = 0; g < 2; g++)
        for (uint64_t f = lo[g]; f < hi[g]; f++) {
            snprintf(names[p.n_members], 32, "fake-%llu", (unsigned long long)f);
            p.members[p.n_members] = (st_proto_member_t){.member_id = f,
                                                         .role = ST_PROTO_ROLE_EXPERT,
                                                         .name = names[p.n_members],
                                                         .data_endpoint = "127.0.0.1:1",
                                                         .capacity = 4096,
                                                         .alive = 1};
            p.n_members++;
        }
    uint8_t *buf;
    size_t n;
    if (st_proto_placement_encode(&p, &buf, &n) == ST_OK) {
        free(pl_buf);
        pl_buf = buf;
        pl_len = n;
        pl_version = p.version;
    } else {
        fprintf(stderr, "publish: %s\n", st_err_last());
    }
    free(p.offsets);
    free(p.member_ids);
    free(p.members);
    free(names);
}

/* ---------------------------------------------------------------- the client side */

typedef struct {
    int done, chunks, tokens, finish;
    st_status_t st;
    char detail[512], err[512];
} res_t;

static void on_msg(const uint8_t *msg, size_t len, void *arg) {
    res_t *r = arg;
    st_proto_generate_chunk_t c;
    if (st_proto_generate_chunk_decode(msg, len, &c) != ST_OK) return;
    r->chunks++;
    if (c.finish == ST_PROTO_FINISH_NONE || c.finish == ST_PROTO_FINISH_STOP || c.finish == ST_PROTO_FINISH_LENGTH)
        r->tokens++;
    if (c.finish != ST_PROTO_FINISH_NONE) r->finish = c.finish;
    if (c.error && c.error[0]) snprintf(r->err, sizeof r->err, "%s", c.error);
    st_proto_generate_chunk_cleanup(&c);
}

static void on_done(st_status_t st, const char *detail, void *arg) {
    res_t *r = arg;
    r->st = st;
    snprintf(r->detail, sizeof r->detail, "%s", detail ? detail : "");
    r->done = 1;
}

static void pump(double seconds, const int *flag) {
    double t0 = st_time_sec();
    while (st_time_sec() - t0 < seconds && !(flag && *flag)) {
        uv_run(&loop, UV_RUN_NOWAIT);
        usleep(1000);
    }
}

static void start(st_rpc_channel_t *ch, const st_proto_generate_req_t *q, res_t *r) {
    memset(r, 0, sizeof *r);
    uint8_t *buf;
    size_t n;
    if (st_proto_generate_req_encode(q, &buf, &n) != ST_OK ||
        st_rpc_stream_open(ch, ST_PROTO_METHOD_WORKER_GENERATE, buf, n, 30000, on_msg, on_done, r, NULL) != ST_OK) {
        r->done = 1;
        r->st = ST_ERR_INTERNAL;
        snprintf(r->detail, sizeof r->detail, "could not start the call");
        return;
    }
    free(buf);
}

static void call(st_rpc_channel_t *ch, const st_proto_generate_req_t *q, res_t *r) {
    start(ch, q, r);
    pump(30, &r->done);
}

static uint32_t ptoks[512];

static st_proto_generate_req_t req_tokens(size_t n, uint32_t max_tokens) {
    for (size_t i = 0; i < n; i++)
        ptoks[i] = (uint32_t)(1 + (i * 7) % 200);
    return (st_proto_generate_req_t){
        .n_prompt_tokens = n, .prompt_tokens = ptoks, .max_tokens = max_tokens, .ignore_eos = 1};
}

static int alive(pid_t p) {
    return waitpid(p, NULL, WNOHANG) == 0;
}

/* ---------------------------------------------------------------- placements */

static uint64_t id_a, id_b, flood_lo;
static int all_on_a(size_t cell, uint64_t *out) {
    (void)cell;
    out[0] = id_a;
    return 1;
}
static int all_on_b(size_t cell, uint64_t *out) {
    (void)cell;
    out[0] = id_b;
    return 1;
}
/* flood round: expert-a first, then a fresh fake replica per expert (8 new fakes each round) */
static int flood(size_t cell, uint64_t *out) {
    out[0] = id_a;
    out[1] = flood_lo + cell % 8;
    return 2;
}
/* more holders than slots: 64 fakes hold the dense layer's cells (never dispatched to), and six
 * more (larger ids: they come last) hold every routed expert */
#define F_LO 5000u
#define G_LO 9000u
static int overfull(size_t cell, uint64_t *out) {
    size_t e = cell % (size_t)cfg.n_experts, l = cell / (size_t)cfg.n_experts;
    if (l == 0) {
        for (int k = 0; k < 4; k++)
            out[k] = F_LO + e * 4 + (size_t)k;
        return 4;
    }
    out[0] = G_LO + cell % 6;
    return 1;
}

static char caddr[64], exe[700];
static pid_t worker;
static st_rpc_channel_t *ch;

/* (Re)start the worker under test and wait for it to register; a fresh channel to it. */
static int start_worker(void) {
    char log[700];
    snprintf(log, sizeof log, "%s/attn.log", tmp);
    char *wargv[] = {exe,
                     "--coordinator",
                     caddr,
                     "--ckpt",
                     ck,
                     "--listen",
                     "127.0.0.1:0",
                     "--name",
                     "attn-t",
                     "--max-seqs",
                     "2",
                     "--max-batch-tokens",
                     "64",
                     "--max-ctx",
                     "512",
                     "--micro-batches",
                     "1",
                     "--expert-timeout-ms",
                     "1500",
                     "--drain-timeout-s",
                     "20",
                     "--insecure",
                     NULL};
    int before = n_real;
    worker = spawn(wargv, log);
    double t0 = st_time_sec();
    while (st_time_sec() - t0 < 30 && !(n_real > before && real_by_name("attn-t") >= &real[before]))
        pump(0.05, NULL);
    const member_t *w = real_by_name("attn-t");
    if (!w || w < &real[before]) return -1;
    if (ch) st_rpc_channel_destroy(ch);
    ch = NULL;
    return st_rpc_channel_create(w->endpoint, &ch) == ST_OK ? 0 : -1;
}

static int done_ok(const res_t *r, int tokens) {
    return r->done && r->st == ST_OK && r->tokens == tokens && r->finish == ST_PROTO_FINISH_LENGTH;
}

int main(void) {
    signal(SIGALRM, on_alarm);
    alarm(150);
    st_log_set_level(ST_LOG_WARN);
    const char *b = getenv("STRATA_BIN"), *tdir = getenv("STRATA_TEST_TMP");
    if (!b) {
        fprintf(stderr, "STRATA_BIN must point at build/bin\n");
        return 1;
    }
    snprintf(bin, sizeof bin, "%s", b);
    snprintf(tmp, sizeof tmp, "%s/worker_guard.XXXXXX", tdir ? tdir : "/tmp");
    if (!mkdtemp(tmp)) return 1;
    setenv("UCX_TLS", "tcp", 0);
    setenv("UCX_NET_DEVICES", "lo", 0);
    setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 0);
    setenv("UCX_TCP_CM_REUSEADDR", "y", 0);
    unsetenv("STRATA_CLUSTER_SECRET_FILE");
    snprintf(ck, sizeof ck, "%s/ck", tmp);
    char cmd[1400], path[700];
    snprintf(cmd, sizeof cmd, "'%s/strata' ckpt init --preset tiny --out '%s' --seed 3 >/dev/null 2>&1", bin, ck);
    if (system(cmd) != 0) {
        fprintf(stderr, "ckpt init failed\n");
        return 1;
    }
    snprintf(path, sizeof path, "%s/config.json", ck);
    if (st_config_load(&cfg, path) != ST_OK) return 1;

    uv_loop_init(&loop);
    if (st_rpc_init(&loop) != ST_OK) return 1;
    st_rpc_server_t *coord;
    int port = 0;
    if (st_rpc_server_create("127.0.0.1:0", &coord) != ST_OK ||
        st_rpc_server_add_method(coord, ST_PROTO_METHOD_REGISTER, h_register, NULL) != ST_OK ||
        st_rpc_server_add_method(coord, ST_PROTO_METHOD_HEARTBEAT, h_heartbeat, NULL) != ST_OK ||
        st_rpc_server_add_method(coord, ST_PROTO_METHOD_PLACEMENT, h_placement, NULL) != ST_OK ||
        st_rpc_server_add_method(coord, ST_PROTO_METHOD_THRESHOLDS, h_thresholds, NULL) != ST_OK ||
        st_rpc_server_add_method(coord, ST_PROTO_METHOD_REPORT_SCORES, h_scores, NULL) != ST_OK ||
        st_rpc_server_start(coord, &port) != ST_OK)
        return 1;
    char log[700];
    snprintf(caddr, sizeof caddr, "127.0.0.1:%d", port);
    snprintf(exe, sizeof exe, "%s/strata-attn", bin);
    char eexe[700], elog[700];
    snprintf(eexe, sizeof eexe, "%s/strata-expert", bin);
    snprintf(elog, sizeof elog, "%s/expert-a.log", tmp);
    char *eargv[] = {eexe,       "--coordinator", caddr, "--ckpt",  ck,  "--listen",   "127.0.0.1:0", "--name",
                     "expert-a", "--max-rows",    "512", "--slots", "4", "--insecure", NULL};
    spawn(eargv, elog);
    int wok = start_worker();
    double t0 = st_time_sec();
    while (st_time_sec() - t0 < 30 && !real_by_name("expert-a"))
        pump(0.05, NULL);
    const member_t *ea = real_by_name("expert-a");
    CHECK(wok == 0 && ea, "the worker and the expert server register");
    if (wok != 0 || !ea) {
        tail_log("attn.log");
        kill_kids();
        return st_test_done();
    }
    id_a = ea->id;

    /* ---- 1. hostile requests: a status before any chunk; the worker survives */
    res_t r;
    st_proto_generate_req_t q = req_tokens(60, 0xFFFFFFFFu - 58); /* (int) -59: a 2-int buffer before the fix */
    call(ch, &q, &r);
    CHECK(r.done && r.st == ST_ERR_OUT_OF_RANGE && r.chunks == 0, "max_tokens 2^32-59: %s (%s), %d chunks",
          st_status_str(r.st), r.detail, r.chunks);
    q = req_tokens(4, 0x80000000u);
    call(ch, &q, &r);
    CHECK(r.st == ST_ERR_OUT_OF_RANGE && r.chunks == 0 && strstr(r.detail, "max_tokens"), "max_tokens 2^31: %s (%s)",
          st_status_str(r.st), r.detail);
    q = req_tokens(4, 4);
    ptoks[2] = (uint32_t)cfg.vocab;
    call(ch, &q, &r);
    CHECK(r.st == ST_ERR_OUT_OF_RANGE && r.chunks == 0, "token id = vocab: %s (%s)", st_status_str(r.st), r.detail);
    q = req_tokens(4, 4);
    q.temperature = NAN;
    call(ch, &q, &r);
    CHECK(r.st == ST_ERR_INVALID_ARG && r.chunks == 0, "NaN temperature: %s (%s)", st_status_str(r.st), r.detail);
    uint32_t stops[17] = {0};
    q = req_tokens(4, 4);
    q.stop_ids = stops;
    q.n_stop_ids = 17;
    call(ch, &q, &r);
    CHECK(r.st == ST_ERR_OUT_OF_RANGE && r.chunks == 0, "17 stop ids: %s (%s)", st_status_str(r.st), r.detail);
    q = req_tokens(512, 1); /* the whole context: no room for a token (over --max-batch-tokens is fine: chunked) */
    call(ch, &q, &r);
    CHECK(r.st == ST_ERR_OUT_OF_RANGE && r.chunks == 0, "prompt of the whole context: %s (%s)", st_status_str(r.st),
          r.detail);
    q = req_tokens(200, 4);
    q.max_tokens = 500; /* 200 > 64 anyway; and prompt + max_tokens > 512 */
    call(ch, &q, &r);
    CHECK(r.st == ST_ERR_OUT_OF_RANGE && r.chunks == 0, "prompt + max_tokens over the context: %s",
          st_status_str(r.st));
    pump(0.3, NULL);
    CHECK(alive(worker), "the worker survives the hostile requests");
    if (!alive(worker)) { /* (the code before the fix) go on with a fresh one */
        forget_kid(worker);
        start_worker();
    }

    /* ---- the map: every expert on expert-a; a normal request is served */
    publish(all_on_a, 0, 0, 0, 0);
    t0 = st_time_sec();
    do {
        q = req_tokens(4, 8);
        call(ch, &q, &r);
    } while (!done_ok(&r, 8) && st_time_sec() - t0 < 10 && (pump(0.1, NULL), 1));
    CHECK(done_ok(&r, 8), "a valid request is served: %s %s %s (%d tokens)", st_status_str(r.st), r.detail, r.err,
          r.tokens);

    /* ---- 2. a full worker (2 sequence slots): the third concurrent request is refused before any chunk */
    res_t c3[3];
    st_proto_generate_req_t lq = req_tokens(4, 200);
    for (int i = 0; i < 3; i++)
        start(ch, &lq, &c3[i]);
    t0 = st_time_sec();
    while (!(c3[0].done && c3[1].done && c3[2].done) && st_time_sec() - t0 < 60)
        pump(0.01, NULL);
    int n_ok = 0, n_full = 0;
    for (int i = 0; i < 3; i++) {
        n_ok += done_ok(&c3[i], 200);
        n_full += c3[i].st == ST_ERR_CAPACITY && c3[i].chunks == 0;
        if (!done_ok(&c3[i], 200))
            fprintf(stderr, "  call %d: %s (%s) %d chunks %s\n", i, st_status_str(c3[i].st), c3[i].detail, c3[i].chunks,
                    c3[i].err);
    }
    CHECK(n_ok == 2 && n_full == 1, "two served, one RESOURCE_EXHAUSTED before any chunk (%d served, %d refused)", n_ok,
          n_full);

    /* ---- 3. a flood of placements: 10 rounds × 8 fresh replicas + 70 alive servers holding nothing */
    for (int round = 0; round < 10; round++) {
        flood_lo = 1000 + (uint64_t)round * 8;
        publish(flood, flood_lo, flood_lo + 8, 2000 + (uint64_t)round * 70, 2000 + (uint64_t)round * 70 + 70);
        pump(0.15, NULL);
    }
    snprintf(elog, sizeof elog, "%s/expert-b.log", tmp);
    char *bargv[] = {eexe,       "--coordinator", caddr, "--ckpt",  ck,  "--listen",   "127.0.0.1:0", "--name",
                     "expert-b", "--max-rows",    "512", "--slots", "4", "--insecure", NULL};
    spawn(bargv, elog);
    t0 = st_time_sec();
    while (st_time_sec() - t0 < 30 && !real_by_name("expert-b"))
        pump(0.05, NULL);
    const member_t *eb = real_by_name("expert-b");
    CHECK(eb != NULL, "expert-b registers");
    if (eb) {
        id_b = eb->id;
        publish(all_on_b, 0, 0, 0, 0);
        t0 = st_time_sec();
        do {
            pump(0.1, NULL);
            q = req_tokens(4, 8);
            call(ch, &q, &r);
        } while (!done_ok(&r, 8) && st_time_sec() - t0 < 8);
        CHECK(done_ok(&r, 8), "after the flood a new expert server gets a slot and serves: %s %s %s",
              st_status_str(r.st), r.detail, r.err);

        /* ---- 4. more holders than slots: a clear error naming the table, then recovery */
        publish(overfull, F_LO, F_LO + 64, G_LO, G_LO + 6);
        t0 = st_time_sec();
        do {
            pump(0.1, NULL);
            q = req_tokens(4, 8);
            call(ch, &q, &r);
            /* a request already running when the map lands fails mid-stream (tokens > 0); wait for one
             * that meets the new map at its first step */
        } while (!(r.done && r.tokens == 0 && strstr(r.err, "table is full")) && st_time_sec() - t0 < 8);
        CHECK(r.done && r.tokens == 0 && strstr(r.err, "expert-server table is full"),
              "a full table fails requests naming it: %s %s", st_status_str(r.st), r.err);
        publish(all_on_b, 0, 0, 0, 0);
        t0 = st_time_sec();
        do {
            pump(0.1, NULL);
            q = req_tokens(4, 8);
            call(ch, &q, &r);
        } while (!done_ok(&r, 8) && st_time_sec() - t0 < 8);
        CHECK(done_ok(&r, 8), "served again once the map shrinks: %s %s %s", st_status_str(r.st), r.detail, r.err);
    }
    CHECK(alive(worker), "the worker is still running");

    /* ---- 5. SIGTERM drains */
    res_t longr, late;
    lq = req_tokens(4, 300);
    start(ch, &lq, &longr);
    t0 = st_time_sec();
    while (longr.chunks == 0 && !longr.done && st_time_sec() - t0 < 10)
        pump(0.005, NULL);
    kill(worker, SIGTERM);
    pump(0.2, NULL);
    q = req_tokens(4, 4);
    call(ch, &q, &late);
    CHECK(late.st == ST_ERR_CAPACITY && late.chunks == 0 && strstr(late.detail, "draining"),
          "while draining a new request is refused before any chunk: %s (%s), %d chunks", st_status_str(late.st),
          late.detail, late.chunks);
    pump(30, &longr.done);
    CHECK(done_ok(&longr, 300), "the request in flight finishes: %s %s %s, %d tokens", st_status_str(longr.st),
          longr.detail, longr.err, longr.tokens);
    int status = -1;
    t0 = st_time_sec();
    while (st_time_sec() - t0 < 15 && waitpid(worker, &status, WNOHANG) == 0)
        pump(0.02, NULL);
    forget_kid(worker);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the drained worker exits 0 (status %d)", status);

    /* ---- 6. with a cluster secret the port takes only the coordinator's member token */
    {
        /* does common/rpc enforce tokens yet? */
        st_rpc_server_t *ps;
        int pport = 0;
        st_rpc_sec_t psec = {.token = "probe-token"};
        int enforced = 0;
        if (st_rpc_server_create_ex("127.0.0.1:0", &psec, &ps) == ST_OK &&
            st_rpc_server_add_method(ps, ST_PROTO_METHOD_WORKER_GENERATE, h_scores, NULL) == ST_OK &&
            st_rpc_server_start(ps, &pport) == ST_OK) {
            char pa[64];
            snprintf(pa, sizeof pa, "127.0.0.1:%d", pport);
            st_rpc_channel_t *pc;
            if (st_rpc_channel_create(pa, &pc) == ST_OK) {
                q = req_tokens(4, 4);
                call(pc, &q, &r);
                enforced = r.st == ST_ERR_AUTH;
                st_rpc_channel_destroy(pc);
            }
            st_rpc_server_close(ps, noop, NULL);
        }
        CHECK(enforced, "common/rpc refuses a call without the server's token");
        if (enforced) {
            char sf[700];
            snprintf(sf, sizeof sf, "%s/cluster.secret", tmp);
            FILE *f = fopen(sf, "w");
            if (f) {
                fprintf(f, "%s\n", "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff");
                fclose(f);
            }
            chmod(sf, 0600);
            snprintf(log, sizeof log, "%s/attn-sec.log", tmp);
            char *sargv[] = {exe,
                             "--coordinator",
                             caddr,
                             "--ckpt",
                             ck,
                             "--listen",
                             "127.0.0.1:0",
                             "--name",
                             "attn-sec",
                             "--max-seqs",
                             "2",
                             "--max-batch-tokens",
                             "64",
                             "--cluster-secret-file",
                             sf,
                             NULL};
            spawn(sargv, log);
            t0 = st_time_sec();
            while (st_time_sec() - t0 < 30 && !real_by_name("attn-sec"))
                pump(0.05, NULL);
            const member_t *ws = real_by_name("attn-sec");
            CHECK(ws != NULL, "a worker with a cluster secret registers");
            if (ws) {
                st_secret_t sec;
                char cluster_token[65];
                st_secret_load(sf, &sec);
                st_secret_token(&sec, "strata-grpc-v1", cluster_token);
                st_rpc_channel_t *c0, *c1;
                st_rpc_sec_t wrong = {.token = cluster_token}; /* a member's token is not the coordinator's */
                st_rpc_channel_create(ws->endpoint, &c0);
                st_rpc_channel_create_ex(ws->endpoint, &wrong, &c1);
                q = req_tokens(4, 4);
                call(c0, &q, &r);
                CHECK(r.st == ST_ERR_AUTH && r.chunks == 0, "no token: %s (%s)", st_status_str(r.st), r.detail);
                call(c1, &q, &r);
                CHECK(r.st == ST_ERR_AUTH && r.chunks == 0, "the cluster token is not the member token: %s (%s)",
                      st_status_str(r.st), r.detail);
                st_rpc_channel_destroy(c0);
                st_rpc_channel_destroy(c1);
            }
        }
    }
    if (st_t_fail) {
        tail_log("attn.log");
        tail_log("expert-b.log");
    }
    kill_kids();
    st_rpc_channel_destroy(ch);
    if (!st_t_fail && !getenv("KEEP_TMP")) {
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
        if (system(cmd) != 0) {
        }
    }
    int rc = st_test_done();
    fflush(stdout);
    _exit(rc); /* the rpc thread and servers are not torn down: the process ends here */
}
