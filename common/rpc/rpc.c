/* gRPC C core behind st_rpc: one completion queue and one thread per process that hands events to
 * the libuv loop; per-call state machines advance on the loop thread. The only file that includes
 * gRPC. Recipes and pitfalls: /work/shared/notes/c-ecosystem.md §1 (one send in flight per call,
 * SEND_MESSAGE drains its byte buffer, CQ shutdown → drain → destroy). */
#include "strata/rpc.h"

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#define container_of(p, T, m) ((T *)((char *)(p) - offsetof(T, m)))

/* Every tag handed to gRPC is one of these, embedded in its owner. */
typedef struct st_rpc_tag {
    void (*fn)(struct st_rpc_tag *t, int ok);
} st_rpc_tag_t;

typedef struct {
    st_rpc_tag_t *tag;
    int ok;
} rpc_event_t;

/* ---- process runtime: CQ thread → loop ---- */

static struct {
    int inited;
    uv_loop_t *loop;
    grpc_completion_queue *cq;
    pthread_t thread;
    pthread_mutex_t mu;
    rpc_event_t *q, *q2; /* q filled by the CQ thread under mu; q2 drained by the loop */
    size_t n, cap, cap2;
} g;
/* NOTE: outside g, which is zeroed at cleanup while the loop may still be closing this handle. */
static uv_async_t g_async;

static void *cq_thread(void *unused) {
    (void)unused;
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(g.cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN) break;
        if (ev.type != GRPC_OP_COMPLETE) continue;
        pthread_mutex_lock(&g.mu);
        if (g.n == g.cap) {
            size_t cap = g.cap ? g.cap * 2 : 256;
            rpc_event_t *q = realloc(g.q, cap * sizeof *q);
            if (!q) { /* process-level: we cannot drop a tag without hanging its owner */
                st_log_error("rpc: out of memory queueing %zu completion events", g.n + 1);
                abort();
            }
            g.q = q;
            g.cap = cap;
        }
        g.q[g.n++] = (rpc_event_t){ev.tag, ev.success};
        pthread_mutex_unlock(&g.mu);
        uv_async_send(&g_async);
    }
    return NULL;
}

/* NOTE: uv_async_send coalesces wake-ups, so take everything queued at once. */
static void on_async(uv_async_t *a) {
    (void)a;
    pthread_mutex_lock(&g.mu);
    rpc_event_t *batch = g.q;
    size_t n = g.n, cap = g.cap;
    g.q = g.q2;
    g.cap = g.cap2;
    g.q2 = NULL; /* NOTE: a callback may call st_rpc_cleanup(); the batch is ours until the end */
    g.cap2 = 0;
    g.n = 0;
    pthread_mutex_unlock(&g.mu);
    for (size_t i = 0; i < n && g.inited; i++) batch[i].tag->fn(batch[i].tag, batch[i].ok);
    if (!g.inited) {
        free(batch);
        return;
    }
    g.q2 = batch;
    g.cap2 = cap;
}

st_status_t st_rpc_init(uv_loop_t *loop) {
    if (g.inited) return ST_FAIL(ST_ERR_INVALID_ARG, "rpc: st_rpc_init called twice");
    grpc_init();
    g.loop = loop;
    g.cq = grpc_completion_queue_create_for_next(NULL);
    if (!g.cq) {
        grpc_shutdown();
        return ST_FAIL(ST_ERR_INTERNAL, "rpc: cannot create completion queue");
    }
    if (pthread_mutex_init(&g.mu, NULL) != 0) goto err_cq;
    if (uv_async_init(loop, &g_async, on_async) != 0) goto err_mu;
    if (pthread_create(&g.thread, NULL, cq_thread, NULL) != 0) goto err_async;
    g.inited = 1;
    return ST_OK;
err_async:
    uv_close((uv_handle_t *)&g_async, NULL);
err_mu:
    pthread_mutex_destroy(&g.mu);
err_cq:
    grpc_completion_queue_shutdown(g.cq);
    while (grpc_completion_queue_next(g.cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type != GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(g.cq);
    grpc_shutdown();
    return ST_FAIL(ST_ERR_INTERNAL, "rpc: cannot start the completion-queue thread");
}

void st_rpc_cleanup(void) {
    if (!g.inited) return;
    grpc_completion_queue_shutdown(g.cq);
    pthread_join(g.thread, NULL);
    if (g.n) st_log_warn("rpc: %zu completion events left at cleanup (calls still open?)", g.n);
    grpc_completion_queue_destroy(g.cq);
    uv_close((uv_handle_t *)&g_async, NULL);
    pthread_mutex_destroy(&g.mu);
    free(g.q);
    free(g.q2);
    grpc_shutdown();
    memset(&g, 0, sizeof g);
}

/* ---- helpers ---- */

static grpc_byte_buffer *bb_from(const void *p, size_t n) {
    grpc_slice s = grpc_slice_from_copied_buffer(p, n);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return bb;
}

/* Flatten (byte buffers may be multi-slice). Caller unrefs the slice. */
static grpc_slice bb_flatten(grpc_byte_buffer *bb) {
    grpc_byte_buffer_reader rd;
    if (!grpc_byte_buffer_reader_init(&rd, bb)) return grpc_empty_slice();
    grpc_slice all = grpc_byte_buffer_reader_readall(&rd);
    grpc_byte_buffer_reader_destroy(&rd);
    return all;
}

static grpc_status_code code_of(st_status_t st) {
    switch (st) {
    case ST_OK: return GRPC_STATUS_OK;
    case ST_ERR_INVALID_ARG:
    case ST_ERR_PROTOCOL:
    case ST_ERR_PARSE: return GRPC_STATUS_INVALID_ARGUMENT;
    case ST_ERR_OUT_OF_RANGE: return GRPC_STATUS_OUT_OF_RANGE;
    case ST_ERR_CAPACITY: return GRPC_STATUS_RESOURCE_EXHAUSTED;
    case ST_ERR_TIMEOUT: return GRPC_STATUS_DEADLINE_EXCEEDED;
    case ST_ERR_CANCELLED: return GRPC_STATUS_CANCELLED;
    case ST_ERR_PEER: return GRPC_STATUS_UNAVAILABLE;
    case ST_ERR_UNSUPPORTED: return GRPC_STATUS_UNIMPLEMENTED;
    default: return GRPC_STATUS_INTERNAL;
    }
}

static st_status_t status_of(grpc_status_code c) {
    switch (c) {
    case GRPC_STATUS_OK: return ST_OK;
    case GRPC_STATUS_CANCELLED: return ST_ERR_CANCELLED;
    case GRPC_STATUS_INVALID_ARGUMENT:
    case GRPC_STATUS_NOT_FOUND:
    case GRPC_STATUS_ALREADY_EXISTS:
    case GRPC_STATUS_FAILED_PRECONDITION: return ST_ERR_INVALID_ARG;
    case GRPC_STATUS_OUT_OF_RANGE: return ST_ERR_OUT_OF_RANGE;
    case GRPC_STATUS_DEADLINE_EXCEEDED: return ST_ERR_TIMEOUT;
    case GRPC_STATUS_RESOURCE_EXHAUSTED: return ST_ERR_CAPACITY;
    case GRPC_STATUS_UNIMPLEMENTED: return ST_ERR_UNSUPPORTED;
    case GRPC_STATUS_UNAVAILABLE: return ST_ERR_PEER;
    default: return ST_ERR_INTERNAL;
    }
}

static grpc_channel_args *msg_size_args(grpc_arg a[2], grpc_channel_args *ca) {
    a[0].type = GRPC_ARG_INTEGER;
    a[0].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    a[0].value.integer = (int)ST_RPC_MAX_MESSAGE;
    a[1].type = GRPC_ARG_INTEGER;
    a[1].key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
    a[1].value.integer = (int)ST_RPC_MAX_MESSAGE;
    ca->num_args = 2;
    ca->args = a;
    return ca;
}

static gpr_timespec deadline_in(uint32_t ms) {
    return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis((int64_t)ms, GPR_TIMESPAN));
}

/* ---- server ---- */

typedef struct {
    char *path;
    st_rpc_handler_fn fn;
    void *arg;
} rpc_method_t;

typedef struct out_msg {
    struct out_msg *next;
    grpc_byte_buffer *bb;
} out_msg_t;

struct st_rpc_call {
    st_rpc_server_t *srv;
    st_rpc_call_t *prev, *next; /* server's list */
    grpc_call *call;
    const rpc_method_t *method;
    char method_name[128];
    st_rpc_tag_t tag_recv, tag_close, tag_send, tag_status;
    grpc_byte_buffer *recv_bb;
    grpc_byte_buffer *send_bb; /* in flight */
    out_msg_t *out_head, *out_tail;
    int pending;      /* batches handed to gRPC, not yet returned */
    int cancelled_rc; /* written by RECV_CLOSE_ON_SERVER */
    int cancelled;
    int closed;       /* RECV_CLOSE_ON_SERVER returned */
    int md_sent, status_started;
    int handler_done; /* reply/finish called (or the handler will never run) */
    int finish_requested;
    grpc_status_code finish_code;
    grpc_slice finish_detail;
    st_rpc_cancel_fn cancel_fn;
    void *cancel_arg;
};

struct st_rpc_server {
    grpc_server *srv;
    char *addr;
    rpc_method_t *methods;
    size_t n_methods;
    int started, closing, shutdown_done, new_pending, destroyed;
    st_rpc_tag_t tag_new, tag_shutdown;
    grpc_call *new_call;
    grpc_call_details details;
    grpc_metadata_array req_md;
    st_rpc_call_t *calls;
    void (*done)(void *);
    void *done_arg;
};

static void server_maybe_done(st_rpc_server_t *s);
static void call_pump(st_rpc_call_t *c);

static void call_free(st_rpc_call_t *c) {
    st_rpc_server_t *s = c->srv;
    if (c->prev) c->prev->next = c->next; else s->calls = c->next;
    if (c->next) c->next->prev = c->prev;
    for (out_msg_t *m = c->out_head, *nx; m; m = nx) {
        nx = m->next;
        grpc_byte_buffer_destroy(m->bb);
        free(m);
    }
    if (c->recv_bb) grpc_byte_buffer_destroy(c->recv_bb);
    if (c->send_bb) grpc_byte_buffer_destroy(c->send_bb);
    grpc_slice_unref(c->finish_detail);
    grpc_call_unref(c->call);
    free(c);
}

/* Frees the call once the handler is done with it and gRPC has returned every tag. May free the
 * server (close path): callers must not touch either afterwards. */
static void call_maybe_free(st_rpc_call_t *c) {
    if (c->pending || !c->handler_done) {
        if (c->srv->closing && !c->pending) server_maybe_done(c->srv);
        return;
    }
    st_rpc_server_t *s = c->srv;
    call_free(c);
    if (s->closing) server_maybe_done(s);
}

static void start_batch(st_rpc_call_t *c, grpc_op *ops, size_t n, st_rpc_tag_t *tag) {
    grpc_call_error e = grpc_call_start_batch(c->call, ops, n, tag, NULL);
    if (e != GRPC_CALL_OK) {
        /* Our own invariant (one op of each kind in flight) was broken: a bug, not bad input. */
        st_log_error("rpc: %s: grpc_call_start_batch failed (%d)", c->method_name, (int)e);
        abort();
    }
    c->pending++;
}

static void call_on_close(st_rpc_tag_t *t, int ok) {
    st_rpc_call_t *c = container_of(t, st_rpc_call_t, tag_close);
    c->pending--;
    c->closed = 1;
    if (c->cancelled_rc && !c->cancelled) {
        c->cancelled = 1;
        if (!c->handler_done && c->cancel_fn) {
            c->pending++; /* NOTE: the callback may finish the call; free only below */
            c->cancel_fn(c, c->cancel_arg);
            c->pending--;
        }
    }
    call_maybe_free(c);
}

static void call_on_send(st_rpc_tag_t *t, int ok) {
    st_rpc_call_t *c = container_of(t, st_rpc_call_t, tag_send);
    c->pending--;
    grpc_byte_buffer_destroy(c->send_bb);
    c->send_bb = NULL;
    if (!ok) c->cancelled = 1; /* stream broken: RECV_CLOSE will tell the handler */
    call_pump(c);
    call_maybe_free(c);
}

static void call_on_status(st_rpc_tag_t *t, int ok) {
    st_rpc_call_t *c = container_of(t, st_rpc_call_t, tag_status);
    c->pending--;
    call_maybe_free(c);
}

/* Start the next send, or the status once the queue is empty. One send in flight at a time. */
static void call_pump(st_rpc_call_t *c) {
    if (c->send_bb || c->status_started) return;
    grpc_op ops[2];
    memset(ops, 0, sizeof ops);
    size_t n = 0;
    if (!c->md_sent) {
        ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
        c->md_sent = 1;
    }
    if (c->out_head && !c->cancelled) {
        out_msg_t *m = c->out_head;
        c->out_head = m->next;
        if (!c->out_head) c->out_tail = NULL;
        c->send_bb = m->bb;
        free(m);
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n++].data.send_message.send_message = c->send_bb;
        start_batch(c, ops, n, &c->tag_send);
    } else if (c->finish_requested) {
        ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
        ops[n].data.send_status_from_server.status = c->finish_code;
        ops[n++].data.send_status_from_server.status_details = &c->finish_detail;
        c->status_started = 1;
        start_batch(c, ops, n, &c->tag_status);
    } else if (n) {
        c->md_sent = 0; /* nothing to send yet */
    }
}

static void call_finish_code(st_rpc_call_t *c, grpc_status_code code, const char *detail) {
    c->handler_done = 1;
    c->finish_requested = 1;
    c->finish_code = code;
    grpc_slice_unref(c->finish_detail);
    c->finish_detail = grpc_slice_from_copied_string(detail ? detail : "");
    call_pump(c);
}

static void call_on_recv(st_rpc_tag_t *t, int ok) {
    st_rpc_call_t *c = container_of(t, st_rpc_call_t, tag_recv);
    c->pending--;
    if (!ok || !c->recv_bb || c->srv->closing) {
        call_finish_code(c, GRPC_STATUS_INVALID_ARGUMENT, "no request message");
        call_maybe_free(c);
        return;
    }
    grpc_slice all = bb_flatten(c->recv_bb);
    grpc_byte_buffer_destroy(c->recv_bb);
    c->recv_bb = NULL;
    /* NOTE: keep the call alive across the handler even if it finishes synchronously. */
    c->pending++;
    c->method->fn(c, GRPC_SLICE_START_PTR(all), GRPC_SLICE_LENGTH(all), c->method->arg);
    c->pending--;
    grpc_slice_unref(all);
    call_maybe_free(c);
}

static void server_arm(st_rpc_server_t *s);

static void server_on_new(st_rpc_tag_t *t, int ok) {
    st_rpc_server_t *s = container_of(t, st_rpc_server_t, tag_new);
    s->new_pending = 0;
    if (!ok || !s->new_call) {
        grpc_call_details_destroy(&s->details);
        grpc_metadata_array_destroy(&s->req_md);
        if (s->closing) server_maybe_done(s);
        else server_arm(s);
        return;
    }
    st_rpc_call_t *c = calloc(1, sizeof *c);
    if (!c) { /* cannot track it: refuse it */
        st_log_error("rpc: out of memory accepting a call");
        grpc_call_cancel_with_status(s->new_call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory", NULL);
        grpc_call_unref(s->new_call);
        grpc_call_details_destroy(&s->details);
        grpc_metadata_array_destroy(&s->req_md);
        if (!s->closing) server_arm(s);
        return;
    }
    c->srv = s;
    c->call = s->new_call;
    c->finish_detail = grpc_empty_slice();
    c->tag_recv.fn = call_on_recv;
    c->tag_close.fn = call_on_close;
    c->tag_send.fn = call_on_send;
    c->tag_status.fn = call_on_status;
    size_t ml = GRPC_SLICE_LENGTH(s->details.method);
    const char *mp = (const char *)GRPC_SLICE_START_PTR(s->details.method);
    snprintf(c->method_name, sizeof c->method_name, "%.*s", (int)ST_MIN(ml, sizeof c->method_name - 1), mp);
    for (size_t i = 0; i < s->n_methods; i++)
        if (strlen(s->methods[i].path) == ml && memcmp(s->methods[i].path, mp, ml) == 0) c->method = &s->methods[i];
    grpc_call_details_destroy(&s->details);
    grpc_metadata_array_destroy(&s->req_md);
    c->next = s->calls;
    if (s->calls) s->calls->prev = c;
    s->calls = c;
    if (!s->closing) server_arm(s);

    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    op.data.recv_close_on_server.cancelled = &c->cancelled_rc;
    start_batch(c, &op, 1, &c->tag_close);
    if (!c->method) {
        st_log_warn("rpc: unknown method %s", c->method_name);
        call_finish_code(c, GRPC_STATUS_UNIMPLEMENTED, "unknown method");
        call_maybe_free(c);
        return;
    }
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &c->recv_bb;
    start_batch(c, &op, 1, &c->tag_recv);
}

static void server_arm(st_rpc_server_t *s) {
    grpc_call_details_init(&s->details);
    grpc_metadata_array_init(&s->req_md);
    s->new_call = NULL;
    grpc_call_error e = grpc_server_request_call(s->srv, &s->new_call, &s->details, &s->req_md, g.cq, g.cq, &s->tag_new);
    if (e != GRPC_CALL_OK) {
        st_log_error("rpc: server %s: grpc_server_request_call failed (%d); not accepting calls", s->addr, (int)e);
        grpc_call_details_destroy(&s->details);
        grpc_metadata_array_destroy(&s->req_md);
        return;
    }
    s->new_pending = 1;
}

static void server_on_shutdown(st_rpc_tag_t *t, int ok) {
    st_rpc_server_t *s = container_of(t, st_rpc_server_t, tag_shutdown);
    s->shutdown_done = 1;
    server_maybe_done(s);
}

static void server_maybe_done(st_rpc_server_t *s) {
    if (s->destroyed || !s->closing || !s->shutdown_done || s->new_pending) return;
    for (st_rpc_call_t *c = s->calls; c; c = c->next)
        if (c->pending) return;
    s->destroyed = 1;
    while (s->calls) call_free(s->calls); /* handlers that never finished: documented */
    grpc_server_destroy(s->srv);
    void (*done)(void *) = s->done;
    void *arg = s->done_arg;
    for (size_t i = 0; i < s->n_methods; i++) free(s->methods[i].path);
    free(s->methods);
    free(s->addr);
    free(s);
    if (done) done(arg);
}

st_status_t st_rpc_server_create(const char *addr, st_rpc_server_t **out) {
    if (!g.inited) return ST_FAIL(ST_ERR_INVALID_ARG, "rpc: st_rpc_init not called");
    st_rpc_server_t *s = calloc(1, sizeof *s);
    if (!s) return ST_FAIL(ST_ERR_NO_MEMORY, "rpc: cannot allocate server");
    s->addr = strdup(addr);
    if (!s->addr) {
        free(s);
        return ST_FAIL(ST_ERR_NO_MEMORY, "rpc: cannot allocate server");
    }
    grpc_arg a[2];
    grpc_channel_args ca;
    s->srv = grpc_server_create(msg_size_args(a, &ca), NULL);
    grpc_server_register_completion_queue(s->srv, g.cq, NULL);
    s->tag_new.fn = server_on_new;
    s->tag_shutdown.fn = server_on_shutdown;
    *out = s;
    return ST_OK;
}

st_status_t st_rpc_server_add_method(st_rpc_server_t *s, const char *path, st_rpc_handler_fn fn, void *arg) {
    if (s->started) return ST_FAIL(ST_ERR_INVALID_ARG, "rpc: %s: add methods before start", path);
    if (!path || path[0] != '/' || !fn) return ST_FAIL(ST_ERR_INVALID_ARG, "rpc: bad method path or handler");
    rpc_method_t *m = realloc(s->methods, (s->n_methods + 1) * sizeof *m);
    if (!m) return ST_FAIL(ST_ERR_NO_MEMORY, "rpc: cannot add method %s", path);
    s->methods = m;
    char *p = strdup(path);
    if (!p) return ST_FAIL(ST_ERR_NO_MEMORY, "rpc: cannot add method %s", path);
    m[s->n_methods++] = (rpc_method_t){p, fn, arg};
    return ST_OK;
}

st_status_t st_rpc_server_start(st_rpc_server_t *s, int *bound_port) {
    grpc_server_credentials *cr = grpc_insecure_server_credentials_create();
    int port = grpc_server_add_http2_port(s->srv, s->addr, cr);
    grpc_server_credentials_release(cr);
    if (port == 0) return ST_FAIL(ST_ERR_IO, "rpc: cannot listen on %s", s->addr);
    grpc_server_start(s->srv);
    s->started = 1;
    server_arm(s);
    if (bound_port) *bound_port = port;
    return ST_OK;
}

void st_rpc_server_close(st_rpc_server_t *s, void (*done)(void *), void *arg) {
    s->closing = 1;
    s->done = done;
    s->done_arg = arg;
    grpc_server_shutdown_and_notify(s->srv, g.cq, &s->tag_shutdown);
    grpc_server_cancel_all_calls(s->srv);
    if (!s->started) s->new_pending = 0;
}

st_status_t st_rpc_call_write(st_rpc_call_t *c, const void *msg, size_t len) {
    if (c->handler_done) return ST_FAIL(ST_ERR_INVALID_ARG, "rpc: %s: write after finish", c->method_name);
    if (c->cancelled || c->srv->closing) return ST_ERR_CANCELLED; /* expected; the cancel cb says why */
    out_msg_t *m = malloc(sizeof *m);
    if (!m) return ST_FAIL(ST_ERR_NO_MEMORY, "rpc: %s: cannot queue a message", c->method_name);
    m->bb = bb_from(msg, len);
    m->next = NULL;
    if (c->out_tail) c->out_tail->next = m; else c->out_head = m;
    c->out_tail = m;
    call_pump(c);
    return ST_OK;
}

void st_rpc_call_finish(st_rpc_call_t *c, st_status_t st, const char *detail) {
    if (c->handler_done) {
        st_log_error("rpc: %s: call finished twice", c->method_name);
        return;
    }
    call_finish_code(c, code_of(st), detail ? detail : (st ? st_status_str(st) : ""));
    call_maybe_free(c);
}

st_status_t st_rpc_call_reply(st_rpc_call_t *c, const void *msg, size_t len) {
    st_status_t st = st_rpc_call_write(c, msg, len);
    st_rpc_call_finish(c, st, NULL);
    return st;
}

void st_rpc_call_on_cancel(st_rpc_call_t *c, st_rpc_cancel_fn fn, void *arg) {
    c->cancel_fn = fn;
    c->cancel_arg = arg;
}
int st_rpc_call_is_cancelled(const st_rpc_call_t *c) { return c->cancelled || c->srv->closing; }
const char *st_rpc_call_method(const st_rpc_call_t *c) { return c->method_name; }

const char *st_rpc_call_peer(const st_rpc_call_t *c) { (void)c; return ""; } /* TODO(security): stub */

/* ---- client ---- */

struct st_rpc_channel {
    grpc_channel *ch;
    char *target;
};

st_status_t st_rpc_channel_create(const char *target, st_rpc_channel_t **out) {
    if (!g.inited) return ST_FAIL(ST_ERR_INVALID_ARG, "rpc: st_rpc_init not called");
    st_rpc_channel_t *c = calloc(1, sizeof *c);
    if (!c || !(c->target = strdup(target))) {
        free(c);
        return ST_FAIL(ST_ERR_NO_MEMORY, "rpc: cannot allocate channel");
    }
    grpc_channel_credentials *cr = grpc_insecure_credentials_create();
    grpc_arg a[2];
    grpc_channel_args ca;
    c->ch = grpc_channel_create(target, cr, msg_size_args(a, &ca));
    grpc_channel_credentials_release(cr);
    if (!c->ch) {
        free(c->target);
        free(c);
        return ST_FAIL(ST_ERR_INVALID_ARG, "rpc: cannot create channel to %s", target);
    }
    *out = c;
    return ST_OK;
}

void st_rpc_channel_destroy(st_rpc_channel_t *c) {
    if (!c) return;
    grpc_channel_destroy(c->ch);
    free(c->target);
    free(c);
}

/* Shared by unary and streaming client calls. */
struct st_rpc_stream {
    st_rpc_tag_t tag_start, tag_msg, tag_status;
    grpc_call *call;
    grpc_metadata_array md_init, md_trail;
    grpc_byte_buffer *send_bb, *recv_bb;
    grpc_status_code status;
    grpc_slice detail;
    int pending, streaming, got_reply;
    grpc_slice reply; /* unary */
    char path[128];
    st_rpc_reply_fn on_reply;
    st_rpc_msg_fn on_msg;
    st_rpc_done_fn on_done;
    void *arg;
};

static void cl_free(st_rpc_stream_t *s) {
    grpc_metadata_array_destroy(&s->md_init);
    grpc_metadata_array_destroy(&s->md_trail);
    if (s->send_bb) grpc_byte_buffer_destroy(s->send_bb);
    if (s->recv_bb) grpc_byte_buffer_destroy(s->recv_bb);
    grpc_slice_unref(s->detail);
    grpc_slice_unref(s->reply);
    grpc_call_unref(s->call);
    free(s);
}

static void cl_maybe_done(st_rpc_stream_t *s) {
    if (s->pending) return;
    st_status_t st = status_of(s->status);
    char *detail = grpc_slice_to_c_string(s->detail);
    if (st != ST_OK && st != ST_ERR_CANCELLED)
        ST_FAIL(st, "rpc: %s failed: %s (grpc status %d)", s->path, detail, (int)s->status);
    if (!s->streaming) {
        if (st == ST_OK && !s->got_reply) st = ST_FAIL(ST_ERR_PROTOCOL, "rpc: %s: OK without a reply", s->path);
        s->on_reply(st, st == ST_OK ? GRPC_SLICE_START_PTR(s->reply) : NULL, st == ST_OK ? GRPC_SLICE_LENGTH(s->reply) : 0,
                    detail, s->arg);
    } else {
        s->on_done(st, detail, s->arg);
    }
    gpr_free(detail);
    cl_free(s);
}

static void cl_on_start(st_rpc_tag_t *t, int ok) {
    st_rpc_stream_t *s = container_of(t, st_rpc_stream_t, tag_start);
    s->pending--;
    grpc_byte_buffer_destroy(s->send_bb);
    s->send_bb = NULL;
    cl_maybe_done(s);
}

static void cl_on_status(st_rpc_tag_t *t, int ok) {
    st_rpc_stream_t *s = container_of(t, st_rpc_stream_t, tag_status);
    s->pending--;
    cl_maybe_done(s);
}

static void cl_recv_next(st_rpc_stream_t *s) {
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &s->recv_bb;
    if (grpc_call_start_batch(s->call, &op, 1, &s->tag_msg, NULL) != GRPC_CALL_OK) {
        st_log_error("rpc: %s: cannot post a receive", s->path);
        abort(); /* our invariant: one receive in flight */
    }
    s->pending++;
}

static void cl_on_msg(st_rpc_tag_t *t, int ok) {
    st_rpc_stream_t *s = container_of(t, st_rpc_stream_t, tag_msg);
    s->pending--;
    if (ok && s->recv_bb) {
        grpc_slice all = bb_flatten(s->recv_bb);
        grpc_byte_buffer_destroy(s->recv_bb);
        s->recv_bb = NULL;
        if (s->streaming) {
            s->on_msg(GRPC_SLICE_START_PTR(all), GRPC_SLICE_LENGTH(all), s->arg);
            grpc_slice_unref(all);
            cl_recv_next(s);
        } else {
            grpc_slice_unref(s->reply);
            s->reply = all;
            s->got_reply = 1;
        }
    }
    cl_maybe_done(s);
}

static st_status_t cl_start(st_rpc_channel_t *ch, const char *path, const void *req, size_t len, uint32_t timeout_ms,
                            st_rpc_stream_t *s) {
    snprintf(s->path, sizeof s->path, "%s", path);
    s->tag_start.fn = cl_on_start;
    s->tag_msg.fn = cl_on_msg;
    s->tag_status.fn = cl_on_status;
    s->detail = grpc_empty_slice();
    s->reply = grpc_empty_slice();
    grpc_metadata_array_init(&s->md_init);
    grpc_metadata_array_init(&s->md_trail);
    grpc_slice method = grpc_slice_from_copied_string(path);
    s->call = grpc_channel_create_call(ch->ch, NULL, GRPC_PROPAGATE_DEFAULTS, g.cq, method, NULL, deadline_in(timeout_ms),
                                       NULL);
    grpc_slice_unref(method);
    if (!s->call) {
        grpc_metadata_array_destroy(&s->md_init);
        grpc_metadata_array_destroy(&s->md_trail);
        return ST_FAIL(ST_ERR_INTERNAL, "rpc: cannot create call %s to %s", path, ch->target);
    }
    s->send_bb = bb_from(req, len);
    grpc_op ops[4];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = s->send_bb;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &s->md_init;
    grpc_call_error e = grpc_call_start_batch(s->call, ops, 4, &s->tag_start, NULL);
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[0].data.recv_status_on_client.trailing_metadata = &s->md_trail;
    ops[0].data.recv_status_on_client.status = &s->status;
    ops[0].data.recv_status_on_client.status_details = &s->detail;
    grpc_call_error e2 = e == GRPC_CALL_OK ? grpc_call_start_batch(s->call, ops, 1, &s->tag_status, NULL) : e;
    if (e != GRPC_CALL_OK || e2 != GRPC_CALL_OK) {
        /* NOTE: if the first batch started, its tag will still come back; wait for it. */
        st_log_error("rpc: %s: cannot start call (%d/%d)", path, (int)e, (int)e2);
        abort();
    }
    s->pending = 2;
    cl_recv_next(s);
    return ST_OK;
}

st_status_t st_rpc_unary(st_rpc_channel_t *ch, const char *path, const void *req, size_t len, uint32_t timeout_ms,
                         st_rpc_reply_fn cb, void *arg) {
    st_rpc_stream_t *s = calloc(1, sizeof *s);
    if (!s) return ST_FAIL(ST_ERR_NO_MEMORY, "rpc: cannot allocate call %s", path);
    s->on_reply = cb;
    s->arg = arg;
    st_status_t st = cl_start(ch, path, req, len, timeout_ms, s);
    if (st) free(s);
    return st;
}

st_status_t st_rpc_stream_open(st_rpc_channel_t *ch, const char *path, const void *req, size_t len,
                               uint32_t timeout_ms, st_rpc_msg_fn on_msg, st_rpc_done_fn on_done, void *arg,
                               st_rpc_stream_t **out) {
    st_rpc_stream_t *s = calloc(1, sizeof *s);
    if (!s) return ST_FAIL(ST_ERR_NO_MEMORY, "rpc: cannot allocate call %s", path);
    s->streaming = 1;
    s->on_msg = on_msg;
    s->on_done = on_done;
    s->arg = arg;
    st_status_t st = cl_start(ch, path, req, len, timeout_ms, s);
    if (st) {
        free(s);
        return st;
    }
    if (out) *out = s;
    return ST_OK;
}

void st_rpc_stream_cancel(st_rpc_stream_t *s) { grpc_call_cancel(s->call, NULL); }

/* TODO(security): stubs until the security work lands */
st_status_t st_rpc_server_create_ex(const char *addr, const st_rpc_sec_t *sec, st_rpc_server_t **out) {
    (void)sec;
    return st_rpc_server_create(addr, out);
}
st_status_t st_rpc_server_add_open_method(st_rpc_server_t *srv, const char *path, st_rpc_handler_fn fn, void *arg) {
    return st_rpc_server_add_method(srv, path, fn, arg);
}
const char *st_rpc_call_header(const st_rpc_call_t *c, const char *key) {
    (void)c;
    (void)key;
    return NULL;
}
void st_rpc_server_set_token(st_rpc_server_t *srv, const char *token) {
    (void)srv;
    (void)token;
}
st_status_t st_rpc_channel_create_ex(const char *target, const st_rpc_sec_t *sec, st_rpc_channel_t **out) {
    (void)sec;
    return st_rpc_channel_create(target, out);
}
