/* st_rpc over loopback in one process: unary round trip (with proto messages), server streaming of
 * N messages written from a timer, deadline expiry on a handler that never answers (its cancel
 * callback must fire), unknown method, then a clean shutdown. Bounded by a watchdog and alarm(). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

int main(void) {
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
    uv_timer_start(&watchdog, on_watchdog, 20000, 0);
    uv_unref((uv_handle_t *)&watchdog);
    while (!server_closed) uv_run(&loop, UV_RUN_ONCE);
    CHECK(never_cancelled == 1, "cancel callback of the never-answering call fired %d times", never_cancelled);
    st_rpc_channel_destroy(ch);
    st_rpc_cleanup();
    uv_timer_stop(&watchdog);
    uv_close((uv_handle_t *)&watchdog, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    CHECK(uv_loop_close(&loop) == 0, "loop closed cleanly");
    return st_test_done();
}
