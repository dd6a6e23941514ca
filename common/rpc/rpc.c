/* gRPC C core behind st_rpc: one completion queue and one thread per process that hands events to
 * the libuv loop; per-call state machines advance on the loop thread. The only file that includes
 * gRPC. Recipes and pitfalls: /work/shared/notes/c-ecosystem.md §1 (one send in flight per call,
 * SEND_MESSAGE drains its byte buffer, CQ shutdown → drain → destroy). Security (token metadata,
 * TLS/mTLS credentials) at the end of the server and client parts; OpenSSL is used only to check
 * PEM files at create so that a bad file is an error there, not a dead port later. */
#include "strata/rpc.h"

#include <errno.h>
#include <fcntl.h>
#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/log.h>
#include <grpc/support/time.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
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

/* gRPC's own log lines, into ours. NOTE: any stranger can make gRPC log an ERROR per connection (a
 * failed TLS handshake), so those are rate-limited; the accept failure that ends a port in 1.51 and
 * assertion messages (an abort follows) always pass. Called from gRPC's threads. */
static uint64_t g_accept_failures; /* atomic builtins only */

static void grpc_log_to_st(gpr_log_func_args *a) {
    static st_log_rl_t rl;
    uint64_t sup;
    if (a->severity != GPR_LOG_SEVERITY_ERROR) {
        st_log_msg(a->severity == GPR_LOG_SEVERITY_INFO ? ST_LOG_INFO : ST_LOG_DEBUG, a->file, a->line, "grpc: %s",
                   a->message);
    } else if (strstr(a->message, "accept4")) {
        __atomic_fetch_add(&g_accept_failures, 1, __ATOMIC_RELAXED);
        st_log_msg(ST_LOG_ERROR, a->file, a->line,
                   "grpc: %s: gRPC 1.51 accepts no more connections on this port until the process restarts "
                   "(keep descriptors below RLIMIT_NOFILE)", a->message);
    } else if (strncmp(a->message, "assertion failed", 16) == 0) {
        st_log_msg(ST_LOG_ERROR, a->file, a->line, "grpc: %s", a->message);
    } else if (st_log_rl_pass(&rl, 10.0, &sup)) {
        st_log_msg(ST_LOG_WARN, a->file, a->line, "grpc: %s [%llu similar suppressed]", a->message,
                   (unsigned long long)sup);
    }
}

uint64_t st_rpc_accept_failures(void) { return __atomic_load_n(&g_accept_failures, __ATOMIC_RELAXED); }

st_status_t st_rpc_init(uv_loop_t *loop) {
    if (g.inited) return ST_FAIL(ST_ERR_INVALID_ARG, "rpc: st_rpc_init called twice");
    gpr_set_log_function(grpc_log_to_st);
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
    case ST_ERR_AUTH: return GRPC_STATUS_UNAUTHENTICATED;
    case ST_ERR_NOT_FOUND: return GRPC_STATUS_NOT_FOUND;
    default: return GRPC_STATUS_INTERNAL;
    }
}

static st_status_t status_of(grpc_status_code c) {
    switch (c) {
    case GRPC_STATUS_OK: return ST_OK;
    case GRPC_STATUS_CANCELLED: return ST_ERR_CANCELLED;
    case GRPC_STATUS_NOT_FOUND: return ST_ERR_NOT_FOUND;
    case GRPC_STATUS_INVALID_ARGUMENT:
    case GRPC_STATUS_ALREADY_EXISTS:
    case GRPC_STATUS_FAILED_PRECONDITION: return ST_ERR_INVALID_ARG;
    case GRPC_STATUS_OUT_OF_RANGE: return ST_ERR_OUT_OF_RANGE;
    case GRPC_STATUS_DEADLINE_EXCEEDED: return ST_ERR_TIMEOUT;
    case GRPC_STATUS_RESOURCE_EXHAUSTED: return ST_ERR_CAPACITY;
    case GRPC_STATUS_UNIMPLEMENTED: return ST_ERR_UNSUPPORTED;
    case GRPC_STATUS_UNAVAILABLE: return ST_ERR_PEER;
    case GRPC_STATUS_UNAUTHENTICATED:
    case GRPC_STATUS_PERMISSION_DENIED: return ST_ERR_AUTH;
    default: return ST_ERR_INTERNAL;
    }
}

/* Bounds of a server connection that is not doing anything useful. gRPC 1.51 has no connection
 * cap (GRPC_ARG_MAX_ALLOWED_INCOMING_CONNECTIONS came later) and stops accepting for good after
 * accept4() fails with EMFILE (fixed upstream in grpc/grpc#33656, 1.57): these only shorten how
 * long a silent or idle connection holds a descriptor. The roles raise RLIMIT_NOFILE. */
#define RPC_HANDSHAKE_TIMEOUT_MS 10000     /* TCP accepted → TLS done and HTTP/2 SETTINGS received */
#define RPC_MAX_IDLE_MS (10 * 60 * 1000)   /* no call open on the connection: GOAWAY */

#define RPC_MAX_ARGS 5
static void arg_int(grpc_channel_args *ca, const char *key, int v) {
    grpc_arg *a = &ca->args[ca->num_args++];
    a->type = GRPC_ARG_INTEGER;
    a->key = (char *)key;
    a->value.integer = v;
}

/* a: RPC_MAX_ARGS slots. target_name: client TLS name override (NULL: none). */
static grpc_channel_args *args_make(grpc_arg *a, grpc_channel_args *ca, int server, const char *target_name) {
    ca->num_args = 0;
    ca->args = a;
    arg_int(ca, GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, (int)ST_RPC_MAX_MESSAGE);
    arg_int(ca, GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, (int)ST_RPC_MAX_MESSAGE);
    if (server) {
        arg_int(ca, GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, RPC_HANDSHAKE_TIMEOUT_MS);
        arg_int(ca, GRPC_ARG_MAX_CONNECTION_IDLE_MS, RPC_MAX_IDLE_MS);
    }
    if (target_name) {
        grpc_arg *t = &a[ca->num_args++];
        t->type = GRPC_ARG_STRING;
        t->key = (char *)GRPC_SSL_TARGET_NAME_OVERRIDE_ARG;
        t->value.string = (char *)target_name;
    }
    return ca;
}

/* ---- PEM files (read once, checked with OpenSSL so that create reports what is wrong) ---- */

#define RPC_PEM_MAX (1u << 20)

/* A regular file of 1 byte to 1 MiB (st_file_read_all refuses FIFOs and directories). Caller frees. */
static st_status_t pem_read(const char *what, const char *path, char **out) {
    char *buf;
    size_t n;
    if (st_file_read_all(path, &buf, &n) != ST_OK)
        return ST_FAIL(ST_ERR_IO, "rpc: %s %s: %s", what, path, st_err_last());
    if (n == 0 || n > RPC_PEM_MAX) {
        free(buf);
        return ST_FAIL(ST_ERR_IO, "rpc: %s %s: not a regular file of 1 byte to 1 MiB", what, path);
    }
    *out = buf;
    return ST_OK;
}

static void pem_free(char *p) { /* keys are secrets: do not leave them in freed memory */
    if (!p) return;
    explicit_bzero(p, strlen(p));
    free(p);
}

static int pem_no_passphrase(char *buf, int size, int rwflag, void *u) {
    (void)buf, (void)size, (void)rwflag, (void)u;
    return -1; /* never prompt on the terminal: encrypted keys are refused */
}

static X509 *pem_first_cert(const char *pem) {
    BIO *b = BIO_new_mem_buf(pem, -1);
    X509 *x = b ? PEM_read_bio_X509(b, NULL, pem_no_passphrase, NULL) : NULL;
    BIO_free(b);
    return x;
}

static st_status_t pem_check_ca(const char *path, const char *pem) {
    X509 *x = pem_first_cert(pem);
    ERR_clear_error();
    if (!x) return ST_FAIL(ST_ERR_INVALID_ARG, "rpc: tls_ca %s: no PEM certificate in it", path);
    X509_free(x);
    return ST_OK;
}

/* The first certificate of the chain must belong to the key. */
static st_status_t pem_check_pair(const char *cert_path, const char *cert, const char *key_path, const char *key) {
    st_status_t st = ST_OK;
    X509 *x = pem_first_cert(cert);
    BIO *b = BIO_new_mem_buf(key, -1);
    EVP_PKEY *k = b ? PEM_read_bio_PrivateKey(b, NULL, pem_no_passphrase, NULL) : NULL;
    BIO_free(b);
    if (!x) st = ST_FAIL(ST_ERR_INVALID_ARG, "rpc: tls_cert %s: no PEM certificate in it", cert_path);
    else if (!k) st = ST_FAIL(ST_ERR_INVALID_ARG, "rpc: tls_key %s: no unencrypted PEM private key in it", key_path);
    else if (X509_check_private_key(x, k) != 1)
        st = ST_FAIL(ST_ERR_INVALID_ARG, "rpc: tls_key %s does not belong to the certificate in %s", key_path, cert_path);
    else if (X509_cmp_current_time(X509_get0_notAfter(x)) < 0)
        st_log_warn("rpc: tls_cert %s has expired: peers will refuse it", cert_path);
    ERR_clear_error();
    EVP_PKEY_free(k);
    X509_free(x);
    return st;
}

/* A metadata value gRPC will send: printable ASCII, not empty (else start_batch would fail). */
static int md_value_ok(const char *v) {
    if (!v || !*v) return 0;
    for (; *v; v++)
        if (*v < 0x20 || *v > 0x7e) return 0;
    return 1;
}

static gpr_timespec deadline_in(uint32_t ms) {
    return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis((int64_t)ms, GPR_TIMESPAN));
}

/* ---- server ---- */

typedef struct {
    char *path;
    st_rpc_handler_fn fn;
    void *arg;
    int open; /* the server's token is not required (st_rpc_server_add_open_method) */
} rpc_method_t;

/* The request metadata, copied at accept: n entries then their NUL-terminated strings, one block. */
typedef struct {
    const char *key, *value;
} md_kv_t;

typedef struct out_msg {
    struct out_msg *next;
    grpc_byte_buffer *bb;
} out_msg_t;

struct st_rpc_call {
    st_rpc_server_t *srv;
    st_rpc_call_t *prev, *next; /* server's list */
    grpc_call *call;
    const rpc_method_t *method;
    char method_name[128]; /* printable copy, for logs */
    char *peer;            /* grpc_call_get_peer (gpr_free) */
    md_kv_t *md;           /* request metadata (free) */
    size_t n_md;
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
    grpc_server_credentials *creds; /* made at create; released at start or close */
    int tls;
    int token_on;   /* a token is required; token NULL then (out of memory) refuses everything */
    char *token;
    size_t token_len;
    uint64_t auth_failures;
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
    gpr_free(c->peer);
    free(c->md);
    grpc_call_unref(c->call);
    free(c);
}

static md_kv_t *md_copy(const grpc_metadata_array *a, size_t *n_out) {
    size_t bytes = a->count * sizeof(md_kv_t);
    for (size_t i = 0; i < a->count; i++)
        bytes += GRPC_SLICE_LENGTH(a->metadata[i].key) + GRPC_SLICE_LENGTH(a->metadata[i].value) + 2;
    md_kv_t *kv = malloc(bytes ? bytes : 1);
    if (!kv) return NULL;
    char *p = (char *)(kv + a->count);
    for (size_t i = 0; i < a->count; i++) {
        const grpc_slice *sl[2] = {&a->metadata[i].key, &a->metadata[i].value};
        for (int j = 0; j < 2; j++) {
            size_t n = GRPC_SLICE_LENGTH(*sl[j]);
            if (n) memcpy(p, GRPC_SLICE_START_PTR(*sl[j]), n);
            p[n] = 0;
            if (j == 0) kv[i].key = p; else kv[i].value = p;
            p += n + 1;
        }
    }
    *n_out = a->count;
    return kv;
}

static int call_token_ok(const st_rpc_call_t *c, const char **why) {
    const st_rpc_server_t *s = c->srv;
    const char *v = st_rpc_call_header(c, ST_RPC_MD_TOKEN);
    *why = !v ? "missing" : "wrong";
    return v && s->token && strlen(v) == s->token_len && st_ct_equal(v, s->token, s->token_len);
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
    c->peer = grpc_call_get_peer(c->call);
    c->md = md_copy(&s->req_md, &c->n_md);
    size_t ml = GRPC_SLICE_LENGTH(s->details.method);
    const char *mp = (const char *)GRPC_SLICE_START_PTR(s->details.method);
    size_t nl = ST_MIN(ml, sizeof c->method_name - 1);
    for (size_t i = 0; i < nl; i++) /* NOTE: the client chose these bytes; they go into logs */
        c->method_name[i] = mp[i] >= 0x20 && mp[i] < 0x7f ? mp[i] : '?';
    c->method_name[nl] = 0;
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
    if (!c->md) {
        st_log_error("rpc: out of memory copying the metadata of %s", c->method_name);
        call_finish_code(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        call_maybe_free(c);
        return;
    }
    /* NOTE: before RECV_MESSAGE: a caller without the token gets nothing read or run. Unknown
     * methods are guarded too, so the method set is not revealed to strangers. */
    const char *why;
    if (s->token_on && !(c->method && c->method->open) && !call_token_ok(c, &why)) {
        s->auth_failures++;
        st_log_every(ST_LOG_WARN, 10.0, "rpc: %s: refused %s from %s: %s %s", s->addr, c->method_name,
                     c->peer ? c->peer : "?", why, ST_RPC_MD_TOKEN);
        call_finish_code(c, GRPC_STATUS_UNAUTHENTICATED, "missing or wrong " ST_RPC_MD_TOKEN);
        call_maybe_free(c);
        return;
    }
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
    if (s->creds) grpc_server_credentials_release(s->creds);
    free(s->token);
    free(s->addr);
    free(s);
    if (done) done(arg);
}

st_status_t st_rpc_server_create(const char *addr, st_rpc_server_t **out) {
    return st_rpc_server_create_ex(addr, NULL, out);
}

/* TLS credentials from the PEM files, read and checked now (not at start). */
static st_status_t server_tls_creds(const st_rpc_sec_t *sec, grpc_server_credentials **out) {
    if (!sec->tls_cert || !sec->tls_key)
        return ST_FAIL(ST_ERR_INVALID_ARG, "rpc: a TLS server needs both tls_cert and tls_key");
    if (sec->tls_client_auth && !sec->tls_ca)
        return ST_FAIL(ST_ERR_INVALID_ARG, "rpc: tls_client_auth needs tls_ca (the client certificates' issuer)");
    char *cert = NULL, *key = NULL, *ca = NULL;
    st_status_t st = pem_read("tls_cert", sec->tls_cert, &cert);
    if (!st) st = pem_read("tls_key", sec->tls_key, &key);
    if (!st && sec->tls_ca) st = pem_read("tls_ca", sec->tls_ca, &ca);
    if (!st) st = pem_check_pair(sec->tls_cert, cert, sec->tls_key, key);
    if (!st && ca) st = pem_check_ca(sec->tls_ca, ca);
    if (!st) {
        grpc_ssl_pem_key_cert_pair pair = {key, cert};
        /* NOTE: gRPC copies the strings. */
        *out = grpc_ssl_server_credentials_create_ex(
            ca, &pair, 1,
            sec->tls_client_auth ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                 : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
            NULL);
        if (!*out) st = ST_FAIL(ST_ERR_INTERNAL, "rpc: gRPC refused the TLS server credentials");
    }
    free(cert);
    pem_free(key);
    free(ca);
    return st;
}

/* "localhost:PORT" (any localhost name, st_host_is_localhost) → "127.0.0.1:PORT" into out, so that gRPC
 * never asks a resolver for it (a minimal container without /etc/hosts has none that answers); the
 * name goes to host. 0 when addr is anything else (then out and host are not written). */
static int localhost_addr(const char *addr, char *out, size_t n, char *host, size_t hn) {
    const char *c = strrchr(addr, ':');
    if (!c || c == addr || (size_t)(c - addr) >= hn) return 0;
    memcpy(host, addr, (size_t)(c - addr));
    host[c - addr] = 0;
    if (!st_host_is_localhost(host)) return 0;
    return snprintf(out, n, "127.0.0.1%s", c) < (int)n;
}

st_status_t st_rpc_server_create_ex(const char *addr, const st_rpc_sec_t *sec, st_rpc_server_t **out) {
    if (!g.inited) return ST_FAIL(ST_ERR_INVALID_ARG, "rpc: st_rpc_init not called");
    if (!addr || !*addr || !out) return ST_FAIL(ST_ERR_INVALID_ARG, "rpc: server needs an address");
    if (sec && sec->token && !md_value_ok(sec->token))
        return ST_FAIL(ST_ERR_INVALID_ARG, "rpc: server token must be printable ASCII and not empty");
    int tls = sec && (sec->tls_cert || sec->tls_key || sec->tls_client_auth); /* sec->tls: channels only */
    grpc_server_credentials *cr = NULL;
    if (tls) {
        st_status_t st = server_tls_creds(sec, &cr);
        if (st) return st;
    } else {
        cr = grpc_insecure_server_credentials_create();
    }
    char lo[300], lo_host[256];
    if (localhost_addr(addr, lo, sizeof lo, lo_host, sizeof lo_host)) addr = lo;
    st_rpc_server_t *s = calloc(1, sizeof *s);
    if (!s || !(s->addr = strdup(addr))) goto err_mem;
    if (sec && sec->token) {
        if (!(s->token = strdup(sec->token))) goto err_mem;
        s->token_len = strlen(s->token);
        s->token_on = 1;
    }
    s->creds = cr;
    s->tls = tls;
    grpc_arg a[RPC_MAX_ARGS];
    grpc_channel_args ca;
    s->srv = grpc_server_create(args_make(a, &ca, 1, NULL), NULL);
    grpc_server_register_completion_queue(s->srv, g.cq, NULL);
    s->tag_new.fn = server_on_new;
    s->tag_shutdown.fn = server_on_shutdown;
    *out = s;
    return ST_OK;
err_mem:
    if (s) free(s->addr);
    free(s);
    grpc_server_credentials_release(cr);
    return ST_FAIL(ST_ERR_NO_MEMORY, "rpc: cannot allocate server");
}

void st_rpc_server_set_token(st_rpc_server_t *s, const char *token) {
    if (token && !md_value_ok(token)) {
        /* NOTE: fail closed: a token nobody can send refuses every guarded call */
        st_log_error("rpc: %s: new token is empty or not printable ASCII; refusing every guarded call", s->addr);
        token = NULL;
        s->token_on = 1;
    } else {
        s->token_on = token != NULL;
    }
    if (s->token) explicit_bzero(s->token, s->token_len);
    free(s->token);
    s->token = token ? strdup(token) : NULL;
    s->token_len = s->token ? strlen(s->token) : 0;
    if (token && !s->token) st_log_error("rpc: %s: out of memory setting the token; refusing every guarded call", s->addr);
}

uint64_t st_rpc_server_auth_failures(const st_rpc_server_t *s) { return s->auth_failures; }

static st_status_t add_method(st_rpc_server_t *s, const char *path, st_rpc_handler_fn fn, void *arg, int open) {
    if (!path || path[0] != '/' || !fn) return ST_FAIL(ST_ERR_INVALID_ARG, "rpc: bad method path or handler");
    if (s->started) return ST_FAIL(ST_ERR_INVALID_ARG, "rpc: %s: add methods before start", path);
    rpc_method_t *m = realloc(s->methods, (s->n_methods + 1) * sizeof *m);
    if (!m) return ST_FAIL(ST_ERR_NO_MEMORY, "rpc: cannot add method %s", path);
    s->methods = m;
    char *p = strdup(path);
    if (!p) return ST_FAIL(ST_ERR_NO_MEMORY, "rpc: cannot add method %s", path);
    m[s->n_methods++] = (rpc_method_t){p, fn, arg, open};
    return ST_OK;
}

st_status_t st_rpc_server_add_method(st_rpc_server_t *s, const char *path, st_rpc_handler_fn fn, void *arg) {
    return add_method(s, path, fn, arg, 0);
}

st_status_t st_rpc_server_add_open_method(st_rpc_server_t *s, const char *path, st_rpc_handler_fn fn, void *arg) {
    return add_method(s, path, fn, arg, 1);
}

st_status_t st_rpc_server_start(st_rpc_server_t *s, int *bound_port) {
    if (s->started || s->closing) return ST_FAIL(ST_ERR_INVALID_ARG, "rpc: %s: server already started or closing", s->addr);
    /* NOTE: exactly the address given: gRPC binds every address a name resolves to, so pass an IP */
    int port = grpc_server_add_http2_port(s->srv, s->addr, s->creds);
    if (port == 0) return ST_FAIL(ST_ERR_IO, "rpc: cannot listen on %s%s", s->addr, s->tls ? " (TLS)" : "");
    grpc_server_credentials_release(s->creds);
    s->creds = NULL;
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

const char *st_rpc_call_peer(const st_rpc_call_t *c) { return c->peer ? c->peer : ""; }

const char *st_rpc_call_header(const st_rpc_call_t *c, const char *key) {
    if (!key) return NULL;
    for (size_t i = 0; i < c->n_md; i++)
        if (strcmp(c->md[i].key, key) == 0) return c->md[i].value;
    return NULL;
}

/* ---- client ---- */

struct st_rpc_channel {
    grpc_channel *ch;
    char *target;
    grpc_metadata md[2]; /* sent on every call: token, authorization */
    size_t n_md;
};

st_status_t st_rpc_channel_create(const char *target, st_rpc_channel_t **out) {
    return st_rpc_channel_create_ex(target, NULL, out);
}

static st_status_t channel_tls_creds(const st_rpc_sec_t *sec, grpc_channel_credentials **out) {
    if (!sec->tls_cert != !sec->tls_key)
        return ST_FAIL(ST_ERR_INVALID_ARG, "rpc: a client certificate needs both tls_cert and tls_key");
    char *cert = NULL, *key = NULL, *ca = NULL;
    st_status_t st = ST_OK;
    if (sec->tls_ca) st = pem_read("tls_ca", sec->tls_ca, &ca);
    if (!st && sec->tls_cert) st = pem_read("tls_cert", sec->tls_cert, &cert);
    if (!st && sec->tls_key) st = pem_read("tls_key", sec->tls_key, &key);
    if (!st && ca) st = pem_check_ca(sec->tls_ca, ca);
    if (!st && cert) st = pem_check_pair(sec->tls_cert, cert, sec->tls_key, key);
    if (!st) {
        grpc_ssl_pem_key_cert_pair pair = {key, cert};
        /* NOTE: gRPC copies the strings; ca NULL: its default roots */
        *out = grpc_ssl_credentials_create(ca, cert ? &pair : NULL, NULL, NULL);
        if (!*out) st = ST_FAIL(ST_ERR_INTERNAL, "rpc: gRPC refused the TLS channel credentials");
    }
    free(ca);
    free(cert);
    pem_free(key);
    return st;
}

static void channel_free(st_rpc_channel_t *c) {
    for (size_t i = 0; i < c->n_md; i++) {
        grpc_slice_unref(c->md[i].key);
        grpc_slice_unref(c->md[i].value);
    }
    free(c->target);
    free(c);
}

static void channel_add_md(st_rpc_channel_t *c, const char *key, const char *prefix, const char *value) {
    grpc_metadata *m = &c->md[c->n_md++];
    memset(m, 0, sizeof *m);
    m->key = grpc_slice_from_static_string(key);
    size_t pl = strlen(prefix), vl = strlen(value);
    m->value = grpc_slice_malloc(pl + vl);
    memcpy(GRPC_SLICE_START_PTR(m->value), prefix, pl);
    memcpy(GRPC_SLICE_START_PTR(m->value) + pl, value, vl);
}

st_status_t st_rpc_channel_create_ex(const char *target, const st_rpc_sec_t *sec, st_rpc_channel_t **out) {
    if (!g.inited) return ST_FAIL(ST_ERR_INVALID_ARG, "rpc: st_rpc_init not called");
    if (!target || !*target || !out) return ST_FAIL(ST_ERR_INVALID_ARG, "rpc: channel needs a target");
    if (sec && sec->token && !md_value_ok(sec->token))
        return ST_FAIL(ST_ERR_INVALID_ARG, "rpc: channel token must be printable ASCII and not empty");
    if (sec && sec->bearer && !md_value_ok(sec->bearer))
        return ST_FAIL(ST_ERR_INVALID_ARG, "rpc: channel bearer must be printable ASCII and not empty");
    if (sec && sec->tls_target_name && !md_value_ok(sec->tls_target_name))
        return ST_FAIL(ST_ERR_INVALID_ARG, "rpc: bad tls_target_name");
    /* NOTE: any TLS file or name implies TLS: never fall back to clear text silently */
    int tls = sec && (sec->tls || sec->tls_ca || sec->tls_cert || sec->tls_key || sec->tls_target_name);
    grpc_channel_credentials *cr = NULL;
    if (tls) {
        st_status_t st = channel_tls_creds(sec, &cr);
        if (st) return st;
    } else {
        cr = grpc_insecure_credentials_create();
    }
    st_rpc_channel_t *c = calloc(1, sizeof *c);
    if (!c || !(c->target = strdup(target))) {
        free(c);
        grpc_channel_credentials_release(cr);
        return ST_FAIL(ST_ERR_NO_MEMORY, "rpc: cannot allocate channel");
    }
    if (sec && sec->token) channel_add_md(c, ST_RPC_MD_TOKEN, "", sec->token);
    if (sec && sec->bearer) channel_add_md(c, ST_RPC_MD_AUTH, "Bearer ", sec->bearer);
    grpc_arg a[RPC_MAX_ARGS];
    grpc_channel_args ca;
    char lo[300], lo_host[256];
    const char *tname = tls && sec ? sec->tls_target_name : NULL;
    if (localhost_addr(target, lo, sizeof lo, lo_host, sizeof lo_host)) {
        target = lo;
        if (tls && !tname) tname = lo_host; /* the certificate is still checked against the name given */
    }
    c->ch = grpc_channel_create(target, cr, args_make(a, &ca, 0, tname));
    grpc_channel_credentials_release(cr);
    if (!c->ch) {
        channel_free(c);
        return ST_FAIL(ST_ERR_INVALID_ARG, "rpc: cannot create channel to %s", target);
    }
    *out = c;
    return ST_OK;
}

void st_rpc_channel_destroy(st_rpc_channel_t *c) {
    if (!c) return;
    grpc_channel_destroy(c->ch);
    channel_free(c);
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
    /* NOTE: the caller gets st and detail and decides; here only what an operator must see, at a
     * bounded rate (a peer that is down fails every call: one line per 10 s per kind, not per call). */
    switch (st) {
    case ST_OK:
    case ST_ERR_CANCELLED: break;
    case ST_ERR_INVALID_ARG:
    case ST_ERR_OUT_OF_RANGE:
    case ST_ERR_NOT_FOUND:
    case ST_ERR_CAPACITY: /* the peer refused this request (its client's mistake or load): not ours */
        ST_REJECT(st, "rpc: %s refused: %s (grpc status %d)", s->path, detail, (int)s->status);
        break;
    case ST_ERR_PEER:
    case ST_ERR_TIMEOUT: /* an unreachable or slow peer: the caller knows what it means and logs it */
        st_err_set("rpc: %s failed: %s (grpc status %d)", s->path, detail, (int)s->status);
        st_log_every(ST_LOG_DEBUG, 10.0, "%s (%s)", st_err_last(), st_status_str(st));
        break;
    case ST_ERR_AUTH:
        st_err_set("rpc: %s refused: %s (grpc status %d)", s->path, detail, (int)s->status);
        st_log_every(ST_LOG_ERROR, 10.0, "%s (%s): check the cluster secret / token", st_err_last(),
                     st_status_str(st));
        break;
    default:
        st_err_set("rpc: %s failed: %s (grpc status %d)", s->path, detail, (int)s->status);
        st_log_every(ST_LOG_ERROR, 10.0, "%s (%s)", st_err_last(), st_status_str(st));
        break;
    }
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
    ops[0].data.send_initial_metadata.count = ch->n_md;
    ops[0].data.send_initial_metadata.metadata = ch->n_md ? ch->md : NULL;
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
