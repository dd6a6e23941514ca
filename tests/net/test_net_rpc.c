/* st_rpc over loopback in one process: unary round trip (with proto messages), server streaming of
 * N messages written from a timer, deadline expiry on a handler that never answers (its cancel
 * callback must fire), unknown method, then a clean shutdown. Then security: the token check (no
 * handler runs without it, rotation, open methods, the peer, metadata), the status mapping, PEM
 * errors at create, and TLS / mTLS with certificates the openssl CLI makes in a temporary folder
 * (fails when the openssl CLI is absent: scripts/deps.sh installs it). Bounded by a watchdog and alarm(). */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

#include "harness.h"
#include "strata/proto.h"
#include "strata/rpc.h"

#define N_STREAM 200

static uv_loop_t loop;
static uv_timer_t watchdog;
static int pending_checks;
static st_rpc_server_t *srv;
static st_rpc_channel_t *ch;

/* ---- server side ---- */

static void h_heartbeat(st_rpc_call_t *call, const uint8_t *req, size_t len, void *arg) {
    st_proto_heartbeat_req_t hb;
    if (st_proto_heartbeat_req_decode(req, len, &hb) != ST_OK) {
        st_rpc_call_finish(call, ST_ERR_PROTOCOL, "bad heartbeat");
        return;
    }
    st_proto_heartbeat_reply_t r = {.known = 1, .placement_version = hb.member_id * 10, .threshold_version = hb.step + 1};
    uint8_t *buf;
    size_t n;
    if (st_proto_heartbeat_reply_encode(&r, &buf, &n) != ST_OK) {
        st_rpc_call_finish(call, ST_ERR_INTERNAL, "encode");
        return;
    }
    st_rpc_call_reply(call, buf, n);
    free(buf);
}

typedef struct {
    st_rpc_call_t *call;
    uv_timer_t timer;
    uint32_t sent, total;
    int cancelled;
} gen_t;

static void gen_closed(uv_handle_t *h) { free(h->data); }

static void gen_tick(uv_timer_t *t) {
    gen_t *g = t->data;
    for (int k = 0; k < 7 && g->sent < g->total; k++, g->sent++) {
        st_proto_generate_chunk_t c = {.index = g->sent, .token_id = 1000 + g->sent, .text = "tok",
                                       .finish = g->sent + 1 == g->total ? ST_PROTO_FINISH_LENGTH : ST_PROTO_FINISH_NONE};
        uint8_t *buf;
        size_t n;
        if (st_proto_generate_chunk_encode(&c, &buf, &n) == ST_OK) {
            st_rpc_call_write(g->call, buf, n);
            free(buf);
        }
    }
    if (g->sent == g->total) {
        st_rpc_call_finish(g->call, ST_OK, NULL);
        uv_timer_stop(t);
        uv_close((uv_handle_t *)t, gen_closed);
    }
}

static void h_generate(st_rpc_call_t *call, const uint8_t *req, size_t len, void *arg) {
    st_proto_generate_req_t r;
    if (st_proto_generate_req_decode(req, len, &r) != ST_OK) {
        st_rpc_call_finish(call, ST_ERR_PROTOCOL, "bad request");
        return;
    }
    gen_t *g = calloc(1, sizeof *g);
    g->call = call;
    g->total = r.max_tokens;
    st_proto_generate_req_cleanup(&r);
    uv_timer_init(&loop, &g->timer);
    g->timer.data = g;
    uv_timer_start(&g->timer, gen_tick, 1, 1);
}

static int never_cancelled;
static void never_cancel(st_rpc_call_t *call, void *arg) {
    never_cancelled++;
    st_rpc_call_finish(call, ST_ERR_CANCELLED, NULL);
}
static void h_never(st_rpc_call_t *call, const uint8_t *req, size_t len, void *arg) {
    st_rpc_call_on_cancel(call, never_cancel, NULL);
}

/* ---- client side ---- */

static void check_done(void);

static void on_hb_reply(st_status_t st, const uint8_t *reply, size_t len, const char *detail, void *arg) {
    CHECK(st == ST_OK, "heartbeat status %s (%s)", st_status_str(st), detail);
    st_proto_heartbeat_reply_t r;
    if (st == ST_OK) {
        CHECK(st_proto_heartbeat_reply_decode(reply, len, &r) == ST_OK, "decode reply");
        CHECK(r.known == 1 && r.placement_version == 70 && r.threshold_version == 43, "reply fields %d %llu %llu",
              r.known, (unsigned long long)r.placement_version, (unsigned long long)r.threshold_version);
    }
    check_done();
}

static uint32_t stream_got;
static int stream_bad;
static void on_gen_msg(const uint8_t *msg, size_t len, void *arg) {
    st_proto_generate_chunk_t c;
    if (st_proto_generate_chunk_decode(msg, len, &c) != ST_OK) {
        stream_bad++;
        return;
    }
    if (c.index != stream_got || c.token_id != 1000 + stream_got || strcmp(c.text, "tok") != 0) stream_bad++;
    stream_got++;
    st_proto_generate_chunk_cleanup(&c);
}
static void on_gen_done(st_status_t st, const char *detail, void *arg) {
    CHECK(st == ST_OK, "stream status %s (%s)", st_status_str(st), detail);
    CHECK(stream_got == N_STREAM, "stream got %u of %d", stream_got, N_STREAM);
    CHECK(stream_bad == 0, "%d bad stream messages", stream_bad);
    check_done();
}

static double never_t0;
static void on_never_reply(st_status_t st, const uint8_t *reply, size_t len, const char *detail, void *arg) {
    double dt = st_time_sec() - never_t0;
    CHECK(st == ST_ERR_TIMEOUT, "never: status %s (%s)", st_status_str(st), detail);
    CHECK(dt > 0.2 && dt < 3.0, "never: deadline after %.3f s (want ~0.3)", dt);
    check_done();
}

static void on_unknown_reply(st_status_t st, const uint8_t *reply, size_t len, const char *detail, void *arg) {
    CHECK(st == ST_ERR_UNSUPPORTED, "unknown method: status %s (%s)", st_status_str(st), detail);
    check_done();
}

static int server_closed;
static void on_server_closed(void *arg) { server_closed = 1; }

/* ---- security: synchronous helpers (the loop runs until the callback; every call has a deadline) ---- */

static void run_until(const int *flag) {
    while (!*flag) uv_run(&loop, UV_RUN_ONCE);
}

typedef struct {
    int done;
    st_status_t st;
    char reply[512];
    int n_msg;
    double dt;
} res_t;

static double call_t0;
static void on_res(st_status_t st, const uint8_t *reply, size_t len, const char *detail, void *arg) {
    res_t *r = arg;
    r->st = st;
    snprintf(r->reply, sizeof r->reply, "%.*s", (int)len, reply ? (const char *)reply : "");
    r->dt = st_time_sec() - call_t0;
    r->done = 1;
}
static res_t unary_ms(st_rpc_channel_t *c, const char *path, const char *req, uint32_t timeout_ms) {
    res_t r = {0};
    call_t0 = st_time_sec();
    if (st_rpc_unary(c, path, req, strlen(req), timeout_ms, on_res, &r) != ST_OK) return (res_t){.st = ST_ERR_INTERNAL};
    run_until(&r.done);
    return r;
}
static res_t unary(st_rpc_channel_t *c, const char *path, const char *req) { return unary_ms(c, path, req, 5000); }
static void on_smsg(const uint8_t *msg, size_t len, void *arg) { ((res_t *)arg)->n_msg++; }
static void on_sdone(st_status_t st, const char *detail, void *arg) {
    res_t *r = arg;
    r->st = st;
    r->done = 1;
}
static res_t stream(st_rpc_channel_t *c, const char *path) {
    res_t r = {0};
    if (st_rpc_stream_open(c, path, "s", 1, 5000, on_smsg, on_sdone, &r, NULL) != ST_OK)
        return (res_t){.st = ST_ERR_INTERNAL};
    run_until(&r.done);
    return r;
}
static void on_closed_flag(void *arg) { *(int *)arg = 1; }
static void close_sync(st_rpc_server_t *s) {
    int done = 0;
    st_rpc_server_close(s, on_closed_flag, &done);
    run_until(&done);
}
static st_rpc_channel_t *chan(int port, const st_rpc_sec_t *sec) {
    char target[64];
    snprintf(target, sizeof target, "127.0.0.1:%d", port);
    st_rpc_channel_t *c = NULL;
    st_status_t st = st_rpc_channel_create_ex(target, sec, &c);
    CHECK(st == ST_OK && c, "channel_create_ex to %s: %s", target, st_status_str(st));
    return c;
}

/* ---- security: server side ---- */

static int guarded_runs, open_runs;

static void h_echo(st_rpc_call_t *call, const uint8_t *req, size_t len, void *arg) {
    guarded_runs++;
    st_rpc_call_reply(call, req, len);
}
static void h_stream3(st_rpc_call_t *call, const uint8_t *req, size_t len, void *arg) {
    guarded_runs++;
    for (int i = 0; i < 3; i++) st_rpc_call_write(call, "m", 1);
    st_rpc_call_finish(call, ST_OK, NULL);
}
/* Replies with what it saw: "auth=<authorization>|tok=<x-strata-token>|other=<x-none>|peer=<peer>". */
static void h_open(st_rpc_call_t *call, const uint8_t *req, size_t len, void *arg) {
    open_runs++;
    const char *a = st_rpc_call_header(call, ST_RPC_MD_AUTH), *t = st_rpc_call_header(call, ST_RPC_MD_TOKEN);
    const char *o = st_rpc_call_header(call, "x-none");
    char buf[512];
    int n = snprintf(buf, sizeof buf, "auth=%s|tok=%s|other=%s|peer=%s", a ? a : "(null)", t ? t : "(null)",
                     o ? o : "(null)", st_rpc_call_peer(call));
    st_rpc_call_reply(call, buf, (size_t)n);
}
/* Finishes with the status named by the request ("auth", "capacity", "range", "invalid"). */
static void h_status(st_rpc_call_t *call, const uint8_t *req, size_t len, void *arg) {
    st_status_t st = ST_ERR_INTERNAL;
    if (len == 4 && memcmp(req, "auth", 4) == 0) st = ST_ERR_AUTH;
    if (len == 8 && memcmp(req, "capacity", 8) == 0) st = ST_ERR_CAPACITY;
    if (len == 5 && memcmp(req, "range", 5) == 0) st = ST_ERR_OUT_OF_RANGE;
    if (len == 7 && memcmp(req, "invalid", 7) == 0) st = ST_ERR_INVALID_ARG;
    st_rpc_call_finish(call, st, "as asked");
}

static st_rpc_server_t *sec_server(const st_rpc_sec_t *sec, int *port) {
    st_rpc_server_t *s = NULL;
    st_status_t st = st_rpc_server_create_ex("127.0.0.1:0", sec, &s);
    CHECK(st == ST_OK && s, "server_create_ex: %s", st_status_str(st));
    if (!s) return NULL;
    st_rpc_server_add_method(s, "/t/Echo", h_echo, NULL);
    st_rpc_server_add_method(s, "/t/Stream", h_stream3, NULL);
    st_rpc_server_add_method(s, "/t/Status", h_status, NULL);
    st_rpc_server_add_open_method(s, "/t/Open", h_open, NULL);
    *port = 0;
    CHECK(st_rpc_server_start(s, port) == ST_OK && *port > 0, "start port %d", *port);
    return s;
}

static void test_token(void) {
    int port;
    st_rpc_server_t *s = sec_server(&(st_rpc_sec_t){.token = "tok-A"}, &port);
    if (!s) return;
    st_rpc_channel_t *none = chan(port, NULL), *wrong = chan(port, &(st_rpc_sec_t){.token = "tok-B"});
    st_rpc_channel_t *longer = chan(port, &(st_rpc_sec_t){.token = "tok-AA"});
    st_rpc_channel_t *right = chan(port, &(st_rpc_sec_t){.token = "tok-A"});
    st_rpc_channel_t *bearer = chan(port, &(st_rpc_sec_t){.bearer = "sk-123"});

    res_t r = unary(none, "/t/Echo", "hi");
    CHECK(r.st == ST_ERR_AUTH, "no token: %s", st_status_str(r.st));
    r = unary(wrong, "/t/Echo", "hi");
    CHECK(r.st == ST_ERR_AUTH, "wrong token: %s", st_status_str(r.st));
    r = unary(longer, "/t/Echo", "hi");
    CHECK(r.st == ST_ERR_AUTH, "token with the right prefix: %s", st_status_str(r.st));
    r = stream(wrong, "/t/Stream");
    CHECK(r.st == ST_ERR_AUTH && r.n_msg == 0, "stream, wrong token: %s, %d messages", st_status_str(r.st), r.n_msg);
    r = unary(none, "/t/NoSuchMethod", "hi");
    CHECK(r.st == ST_ERR_AUTH, "unknown method without token: %s (want auth: do not reveal methods)",
          st_status_str(r.st));
    CHECK(guarded_runs == 0, "a guarded handler ran %d times without the token", guarded_runs);
    CHECK(st_rpc_server_auth_failures(s) == 5, "auth failures counted: %llu",
          (unsigned long long)st_rpc_server_auth_failures(s));

    r = unary(right, "/t/Echo", "hi");
    CHECK(r.st == ST_OK && strcmp(r.reply, "hi") == 0, "right token: %s '%s'", st_status_str(r.st), r.reply);
    r = stream(right, "/t/Stream");
    CHECK(r.st == ST_OK && r.n_msg == 3, "stream, right token: %s, %d messages", st_status_str(r.st), r.n_msg);
    CHECK(guarded_runs == 2, "guarded handlers ran %d times with the token (want 2)", guarded_runs);

    /* the status mapping both ways (the coordinator turns these into 400 / 429 / 401) */
    static const struct {
        const char *req;
        st_status_t want;
    } map[] = {{"auth", ST_ERR_AUTH}, {"capacity", ST_ERR_CAPACITY}, {"range", ST_ERR_OUT_OF_RANGE},
               {"invalid", ST_ERR_INVALID_ARG}};
    for (size_t i = 0; i < ST_ARRAY_LEN(map); i++) {
        r = unary(right, "/t/Status", map[i].req);
        CHECK(r.st == map[i].want, "handler status %s reached the client as %s", st_status_str(map[i].want),
              st_status_str(r.st));
    }

    /* open method: no cluster token needed; the handler sees the bearer, metadata and peer */
    r = unary(bearer, "/t/Open", "x");
    CHECK(r.st == ST_OK, "open method without token: %s", st_status_str(r.st));
    CHECK(strncmp(r.reply, "auth=Bearer sk-123|tok=(null)|other=(null)|peer=", 48) == 0, "open saw '%s'", r.reply);
    const char *peer = strstr(r.reply, "peer=");
    peer = peer ? peer + 5 : "";
    const char *pp = strncmp(peer, "ipv4:127.0.0.1:", 15) == 0 ? peer + 15 : NULL;
    int cport = pp ? atoi(pp) : 0;
    CHECK(pp && strspn(pp, "0123456789") == strlen(pp) && cport > 0 && cport < 65536 && cport != port,
          "peer '%s' (want ipv4:127.0.0.1:<client port>)", peer);
    r = unary(right, "/t/Open", "x");
    CHECK(r.st == ST_OK && strncmp(r.reply, "auth=(null)|tok=tok-A|", 22) == 0, "open with token saw '%s'", r.reply);
    CHECK(open_runs == 2, "open handler ran %d times", open_runs);

    /* rotation: the old token stops working at once, the new one works; NULL turns the check off */
    st_rpc_server_set_token(s, "tok-C");
    st_rpc_channel_t *rotated = chan(port, &(st_rpc_sec_t){.token = "tok-C"});
    int runs0 = guarded_runs;
    r = unary(right, "/t/Echo", "hi");
    CHECK(r.st == ST_ERR_AUTH, "old token after rotation: %s", st_status_str(r.st));
    r = unary(rotated, "/t/Echo", "hi");
    CHECK(r.st == ST_OK, "new token after rotation: %s", st_status_str(r.st));
    CHECK(guarded_runs == runs0 + 1, "runs after rotation: %d (want %d)", guarded_runs, runs0 + 1);
    st_rpc_server_set_token(s, "");
    r = unary(rotated, "/t/Echo", "hi");
    CHECK(r.st == ST_ERR_AUTH, "empty token set: fail closed, got %s", st_status_str(r.st));
    st_rpc_server_set_token(s, NULL);
    r = unary(none, "/t/Echo", "hi");
    CHECK(r.st == ST_OK, "token check off: %s", st_status_str(r.st));

    st_rpc_channel_t *bad = NULL;
    CHECK(st_rpc_channel_create_ex("127.0.0.1:1", &(st_rpc_sec_t){.token = "a\nb"}, &bad) == ST_ERR_INVALID_ARG &&
              !bad, "token with a newline refused at channel create");
    st_rpc_server_t *bs = NULL;
    CHECK(st_rpc_server_create_ex("127.0.0.1:0", &(st_rpc_sec_t){.token = ""}, &bs) == ST_ERR_INVALID_ARG && !bs,
          "empty server token refused at create");

    st_rpc_channel_destroy(none);
    st_rpc_channel_destroy(wrong);
    st_rpc_channel_destroy(longer);
    st_rpc_channel_destroy(right);
    st_rpc_channel_destroy(bearer);
    st_rpc_channel_destroy(rotated);
    close_sync(s);
}

/* ---- TLS ---- */

static char tdir[64];

static void tpath(char *out, size_t n, const char *name) { snprintf(out, n, "%s/%s", tdir, name); }

static int write_file(const char *name, const char *text) {
    char p[128];
    tpath(p, sizeof p, name);
    FILE *f = fopen(p, "w");
    if (!f) return 0;
    fputs(text, f);
    return fclose(f) == 0;
}

/* A CA, a server certificate for 127.0.0.1/localhost and a client certificate from it; and a
 * self-signed client certificate from nobody. EC P-256: fast. */
static int make_certs(void) {
    char cmd[4096];
    const char *ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    snprintf(cmd, sizeof cmd,
             "cd '%s' && exec >openssl.log 2>&1 && "
             "openssl req -x509 %s -keyout ca.key -out ca.pem -days 2 -subj /CN=strata-test-ca "
             "-addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign && "
             "openssl req %s -keyout srv.key -out srv.csr -subj /CN=localhost && "
             "openssl x509 -req -in srv.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out srv.pem -days 2 -extfile srv.ext && "
             "openssl req %s -keyout cli.key -out cli.csr -subj /CN=strata-test-client && "
             "openssl x509 -req -in cli.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out cli.pem -days 2 -extfile cli.ext && "
             "openssl req -x509 %s -keyout rogue.key -out rogue.pem -days 2 -subj /CN=strata-test-client",
             tdir, ec, ec, ec, ec);
    if (!write_file("srv.ext", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n") ||
        !write_file("cli.ext", "extendedKeyUsage=clientAuth\n") || !write_file("garbage.pem", "not a certificate\n"))
        return 0;
    return system(cmd) == 0;
}

static void test_pem_errors(void) {
    char cert[128], key[128], nope[128], garbage[128];
    tpath(cert, sizeof cert, "srv.pem");
    tpath(key, sizeof key, "srv.key");
    tpath(nope, sizeof nope, "no-such-file.pem");
    tpath(garbage, sizeof garbage, "garbage.pem");
    st_rpc_server_t *s = (st_rpc_server_t *)&s; /* output untouched on failure */
    st_rpc_server_t *const s0 = s;
    CHECK(st_rpc_server_create_ex("127.0.0.1:0", &(st_rpc_sec_t){.tls_cert = nope, .tls_key = key}, &s) != ST_OK &&
              s == s0, "server with a missing certificate file refused at create");
    CHECK(st_rpc_server_create_ex("127.0.0.1:0", &(st_rpc_sec_t){.tls_cert = garbage, .tls_key = garbage}, &s) != ST_OK &&
              s == s0, "server with a file that is not PEM refused at create");
    CHECK(st_rpc_server_create_ex("127.0.0.1:0", &(st_rpc_sec_t){.tls_cert = tdir, .tls_key = tdir}, &s) != ST_OK &&
              s == s0, "server with a directory as certificate refused at create");
    CHECK(st_rpc_server_create_ex("127.0.0.1:0", &(st_rpc_sec_t){.tls_cert = cert}, &s) == ST_ERR_INVALID_ARG && s == s0,
          "server with a certificate but no key refused at create");
    CHECK(st_rpc_server_create_ex("127.0.0.1:0",
                                  &(st_rpc_sec_t){.tls_cert = cert, .tls_key = key, .tls_client_auth = 1}, &s) ==
                  ST_ERR_INVALID_ARG && s == s0,
          "client auth without a CA refused at create");
    st_rpc_channel_t *c = NULL;
    CHECK(st_rpc_channel_create_ex("127.0.0.1:1", &(st_rpc_sec_t){.tls = 1, .tls_ca = nope}, &c) != ST_OK && !c,
          "channel with a missing CA file refused at create");
}

static void test_tls(void) {
    char cert[128], key[128], ca[128], ccert[128], ckey[128], rcert[128], rkey[128];
    tpath(cert, sizeof cert, "srv.pem");
    tpath(key, sizeof key, "srv.key");
    tpath(ca, sizeof ca, "ca.pem");
    tpath(ccert, sizeof ccert, "cli.pem");
    tpath(ckey, sizeof ckey, "cli.key");
    tpath(rcert, sizeof rcert, "rogue.pem");
    tpath(rkey, sizeof rkey, "rogue.key");

    st_rpc_server_t *bad = NULL;
    CHECK(st_rpc_server_create_ex("127.0.0.1:0", &(st_rpc_sec_t){.tls_cert = cert, .tls_key = ckey}, &bad) ==
                  ST_ERR_INVALID_ARG && !bad,
          "server whose key does not match its certificate refused at create");

    /* a TLS channel really speaks TLS: against a clear-text server it fails */
    int port, runs0 = guarded_runs;
    st_rpc_server_t *s = sec_server(NULL, &port);
    if (!s) return;
    st_rpc_channel_t *tc = chan(port, &(st_rpc_sec_t){.tls = 1, .tls_ca = ca});
    res_t r = unary(tc, "/t/Echo", "x");
    CHECK(r.st == ST_ERR_PEER && guarded_runs == runs0, "TLS channel against a clear-text server: %s",
          st_status_str(r.st));
    st_rpc_channel_destroy(tc);
    close_sync(s);

    /* TLS, server certificate only, plus the token */
    s = sec_server(&(st_rpc_sec_t){.token = "tls-tok", .tls_cert = cert, .tls_key = key}, &port);
    if (!s) return;
    st_rpc_channel_t *ok = chan(port, &(st_rpc_sec_t){.token = "tls-tok", .tls = 1, .tls_ca = ca});
    st_rpc_channel_t *named = chan(port, &(st_rpc_sec_t){.token = "tls-tok", .tls_ca = ca, .tls_target_name = "localhost"});
    st_rpc_channel_t *misnamed =
        chan(port, &(st_rpc_sec_t){.token = "tls-tok", .tls_ca = ca, .tls_target_name = "wrong.example"});
    st_rpc_channel_t *clear = chan(port, &(st_rpc_sec_t){.token = "tls-tok"});
    st_rpc_channel_t *roots = chan(port, &(st_rpc_sec_t){.token = "tls-tok", .tls = 1});
    r = unary(ok, "/t/Echo", "over tls");
    CHECK(r.st == ST_OK && strcmp(r.reply, "over tls") == 0, "TLS call: %s '%s'", st_status_str(r.st), r.reply);
    r = stream(ok, "/t/Stream");
    CHECK(r.st == ST_OK && r.n_msg == 3, "TLS stream: %s, %d messages", st_status_str(r.st), r.n_msg);
    r = unary(named, "/t/Echo", "x");
    CHECK(r.st == ST_OK, "TLS call with tls_target_name=localhost: %s", st_status_str(r.st));
    r = unary(ok, "/t/Open", "x");
    CHECK(r.st == ST_OK && strstr(r.reply, "|peer=ipv4:127.0.0.1:"), "TLS peer: '%s'", r.reply);
    CHECK(guarded_runs == runs0 + 3, "TLS handlers ran %d times (want 3)", guarded_runs - runs0);
    r = unary(misnamed, "/t/Echo", "x");
    CHECK(r.st == ST_ERR_PEER, "TLS with a name not in the certificate: %s", st_status_str(r.st));
    r = unary(clear, "/t/Echo", "x");
    CHECK(r.st == ST_ERR_PEER && r.dt < 4.0, "clear text against TLS: %s after %.2f s (want a prompt peer error)",
          st_status_str(r.st), r.dt);
    r = unary(roots, "/t/Echo", "x");
    CHECK(r.st != ST_OK, "TLS against default roots (test CA not among them): %s", st_status_str(r.st));
    CHECK(guarded_runs == runs0 + 3, "a handler ran on a refused connection (%d)", guarded_runs - runs0);
    st_rpc_channel_destroy(ok);
    st_rpc_channel_destroy(named);
    st_rpc_channel_destroy(misnamed);
    st_rpc_channel_destroy(clear);
    st_rpc_channel_destroy(roots);
    close_sync(s);

    /* mTLS */
    runs0 = guarded_runs;
    s = sec_server(&(st_rpc_sec_t){.tls_cert = cert, .tls_key = key, .tls_ca = ca, .tls_client_auth = 1}, &port);
    if (!s) return;
    st_rpc_channel_t *nocert = chan(port, &(st_rpc_sec_t){.tls = 1, .tls_ca = ca});
    st_rpc_channel_t *rogue = chan(port, &(st_rpc_sec_t){.tls = 1, .tls_ca = ca, .tls_cert = rcert, .tls_key = rkey});
    st_rpc_channel_t *good = chan(port, &(st_rpc_sec_t){.tls = 1, .tls_ca = ca, .tls_cert = ccert, .tls_key = ckey});
    r = unary(nocert, "/t/Echo", "x");
    CHECK(r.st != ST_OK && r.st != ST_ERR_TIMEOUT, "mTLS without a client certificate: %s", st_status_str(r.st));
    r = unary(rogue, "/t/Echo", "x");
    CHECK(r.st != ST_OK && r.st != ST_ERR_TIMEOUT, "mTLS with a certificate from another issuer: %s",
          st_status_str(r.st));
    CHECK(guarded_runs == runs0, "a handler ran without a valid client certificate");
    r = unary(good, "/t/Echo", "mtls");
    CHECK(r.st == ST_OK && strcmp(r.reply, "mtls") == 0, "mTLS with the client certificate: %s", st_status_str(r.st));
    st_rpc_channel_destroy(nocert);
    st_rpc_channel_destroy(rogue);
    st_rpc_channel_destroy(good);
    close_sync(s);
}

/* ---- descriptor exhaustion (own process: it lowers RLIMIT_NOFILE) ----
 * gRPC 1.51 stops accepting on a port after accept4() fails with EMFILE. Whatever the gRPC version,
 * the server must either accept again once descriptors are free, or report the loss through
 * st_rpc_accept_failures() (so that the role can report not ready and be restarted). */
static void spin_ms(int ms) {
    double t = st_time_sec() + ms / 1000.0;
    while (st_time_sec() < t) {
        uv_run(&loop, UV_RUN_NOWAIT);
        usleep(2000);
    }
}

static int emfile_child(void) {
    alarm(30);
    uv_loop_init(&loop);
    CHECK(st_rpc_init(&loop) == ST_OK, "init");
    int port;
    st_rpc_server_t *s = sec_server(NULL, &port);
    if (!s) return st_test_done();
    st_rpc_channel_t *c = chan(port, NULL);
    res_t r = unary(c, "/t/Echo", "x");
    CHECK(r.st == ST_OK, "before exhaustion: %s", st_status_str(r.st));
    st_rpc_channel_destroy(c);

    int n_open = 0;
    DIR *d = opendir("/proc/self/fd");
    for (struct dirent *e; d && (e = readdir(d));) n_open += e->d_name[0] != '.';
    if (d) closedir(d);
    struct rlimit old, low;
    getrlimit(RLIMIT_NOFILE, &old);
    low = old;
    low.rlim_cur = (rlim_t)n_open + 24;
    CHECK(setrlimit(RLIMIT_NOFILE, &low) == 0, "lower RLIMIT_NOFILE to %d", n_open + 24);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int spare = open("/dev/null", O_RDONLY | O_CLOEXEC), fds[64], n = 0, err = 0;
    CHECK(spare >= 0, "spare descriptor");
    while (n < 64) { /* each client costs one descriptor here and one in the server */
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0) {
            err = errno;
            break;
        }
        if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) err = errno;
        fds[n++] = fd;
        spin_ms(10);
    }
    CHECK(err == EMFILE && n > 0, "descriptors exhausted after %d clients (%s)", n, strerror(err));
    /* NOTE: now no descriptor is free: the spare's goes to one more client, whose connection waits in
     * the backlog for an accept that must fail (closing a client instead would let the server free
     * its side of it first) */
    if (spare >= 0 && n < 64) {
        close(spare);
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd >= 0) {
            connect(fd, (struct sockaddr *)&a, sizeof a);
            fds[n++] = fd;
        }
        spin_ms(300);
    }
    for (int i = 0; i < n; i++) close(fds[i]);
    setrlimit(RLIMIT_NOFILE, &old);
    spin_ms(200);

    c = chan(port, NULL);
    r = unary_ms(c, "/t/Echo", "x", 1500);
    uint64_t lost = st_rpc_accept_failures();
    printf("after EMFILE: new connection %s, st_rpc_accept_failures()=%llu\n", st_status_str(r.st),
           (unsigned long long)lost);
    CHECK(r.st == ST_OK || lost > 0, "the server neither accepts again (%s) nor reports the lost port",
          st_status_str(r.st));
    st_rpc_channel_destroy(c);
    close_sync(s);
    st_rpc_cleanup();
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    return st_test_done();
}

static void test_emfile(const char *self) {
    pid_t pid = fork();
    if (pid == 0) {
        execl(self, self, "emfile", (char *)NULL);
        _exit(127);
    }
    int ws = 0;
    CHECK(pid > 0 && waitpid(pid, &ws, 0) == pid && WIFEXITED(ws) && WEXITSTATUS(ws) == 0,
          "descriptor exhaustion child: status 0x%x", ws);
}

/* Returns 1 when the TLS part was skipped (no openssl). */
static int test_security(void) {
    test_token();
    snprintf(tdir, sizeof tdir, "/tmp/strata-rpc-tls-XXXXXX");
    if (!mkdtemp(tdir)) {
        CHECK(0, "mkdtemp");
        return 0;
    }
    int have_openssl = system("openssl version >/dev/null 2>&1") == 0;
    int certs = have_openssl && make_certs();
    CHECK(!have_openssl || certs, "openssl could not make the test certificates (see %s/openssl.log)", tdir);
    if (!have_openssl) write_file("garbage.pem", "not a certificate\n");
    test_pem_errors(); /* the missing, garbage and directory cases need no openssl */
    if (certs) test_tls();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tdir);
    if (certs || !have_openssl) CHECK(system(cmd) == 0, "rm %s", tdir);
    return !have_openssl;
}

static void check_done(void) {
    if (--pending_checks > 0) return;
    /* let the server notice the expired call's cancellation before closing */
    st_rpc_server_close(srv, on_server_closed, NULL);
}

static void on_watchdog(uv_timer_t *t) {
    CHECK(0, "watchdog: %d checks still pending", pending_checks);
    fprintf(stderr, "watchdog fired\n");
    _exit(st_test_done());
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "emfile") == 0) return emfile_child();
    alarm(60);
    uv_loop_init(&loop);
    CHECK(st_rpc_init(&loop) == ST_OK, "init");
    CHECK(st_rpc_server_create("127.0.0.1:0", &srv) == ST_OK, "server create");
    st_rpc_server_add_method(srv, ST_PROTO_METHOD_HEARTBEAT, h_heartbeat, NULL);
    st_rpc_server_add_method(srv, ST_PROTO_METHOD_GENERATE, h_generate, NULL);
    st_rpc_server_add_method(srv, "/strata.test/Never", h_never, NULL);
    int port = 0;
    CHECK(st_rpc_server_start(srv, &port) == ST_OK && port > 0, "server start port %d", port);
    char target[64];
    snprintf(target, sizeof target, "127.0.0.1:%d", port);
    CHECK(st_rpc_channel_create(target, &ch) == ST_OK, "channel");

    uint8_t *buf;
    size_t n;
    st_proto_heartbeat_req_t hb = {.member_id = 7, .step = 42, .inflight = 3};
    st_proto_heartbeat_req_encode(&hb, &buf, &n);
    pending_checks = 4;
    CHECK(st_rpc_unary(ch, ST_PROTO_METHOD_HEARTBEAT, buf, n, 5000, on_hb_reply, NULL) == ST_OK, "unary");
    free(buf);

    st_proto_generate_req_t gr = {.prompt = "hello", .max_tokens = N_STREAM};
    st_proto_generate_req_encode(&gr, &buf, &n);
    CHECK(st_rpc_stream_open(ch, ST_PROTO_METHOD_GENERATE, buf, n, 10000, on_gen_msg, on_gen_done, NULL, NULL) == ST_OK,
          "stream open");
    free(buf);

    never_t0 = st_time_sec();
    CHECK(st_rpc_unary(ch, "/strata.test/Never", "x", 1, 300, on_never_reply, NULL) == ST_OK, "never");
    CHECK(st_rpc_unary(ch, "/strata.v1.Coordinator/NoSuchMethod", "", 0, 5000, on_unknown_reply, NULL) == ST_OK,
          "unknown");

    uv_timer_init(&loop, &watchdog);
    uv_timer_start(&watchdog, on_watchdog, 50000, 0);
    uv_unref((uv_handle_t *)&watchdog);
    while (!server_closed) uv_run(&loop, UV_RUN_ONCE);
    CHECK(never_cancelled == 1, "cancel callback of the never-answering call fired %d times", never_cancelled);
    int skipped_tls = test_security();
    st_rpc_channel_destroy(ch);
    st_rpc_cleanup();
    uv_timer_stop(&watchdog);
    uv_close((uv_handle_t *)&watchdog, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    CHECK(uv_loop_close(&loop) == 0, "loop closed cleanly");
    test_emfile("/proc/self/exe");
    int rc = st_test_done();
    if (skipped_tls) {
        printf("openssl CLI not found (scripts/deps.sh installs it): TLS checks could not run\n");
        return 1;
    }
    return rc;
}
