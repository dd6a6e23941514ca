/* UCX UCP behind st_tp: active messages, sockaddr listener/connect, peer error handling, the
 * data-plane handshake (cluster secret), and progress driven by libuv (worker event fd → uv_poll_t;
 * uv_idle_t while UCX is busy). The only file that includes <ucp/api/ucp.h>. Recipes:
 * /work/shared/notes/c-ecosystem.md §2.
 *
 * NOTE: UCX callbacks (AM receive, send/recv completion, error, connection request) only record
 * what happened on intrusive lists; drive() delivers user callbacks (and runs the handshake) after
 * ucp_worker_progress returns. So user code never runs inside UCX except st_tp_am_begin_fn, and
 * nothing ever calls ucp_worker_progress from within a UCX callback. */
#include "strata/transport.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>
#include <uv.h>

/* ---- handshake wire format (AM header only, no payload) ----
 * Byte map (72 bytes): 0 magic "STHS" | 4 version | 5 type | 6 pad[2] | 8 a[32] | 40 b[32]
 *   HELLO     a = nonce_c
 *   CHALLENGE a = nonce_s, b = mac_S = HMAC(k, "strata-tp-v1 S" || nonce_c || nonce_s)
 *   PROOF     a = mac_C = HMAC(k, "strata-tp-v1 C" || nonce_c || nonce_s)
 *   OK        (nothing)
 * k = HMAC(cluster secret, "strata-ucx-v1"). Distinct labels stop a MAC being reflected back. */
#define HS_AM_ID ST_TP_AM_IDS /* outside the callers' ids 0 .. ST_TP_AM_IDS-1 */
#define HS_VERSION 1
#define HS_TIMEOUT_MS 5000u
#define HS_MAX_PENDING 128 /* connections proving the secret at once; more are refused */
enum { HS_HELLO = 1, HS_CHALLENGE, HS_PROOF, HS_OK };
typedef struct {
    uint8_t magic[4];
    uint8_t version, type, pad[2];
    uint8_t a[32], b[32];
} hs_msg_t;
_Static_assert(sizeof(hs_msg_t) == 72 && sizeof(hs_msg_t) <= ST_TP_HDR_MAX, "handshake message layout");

/* Per-endpoint handshake state. NONE: no handshake (insecure, or trusted from the start). */
enum { HS_NONE = 0, HS_C_WAIT_CHALLENGE, HS_C_WAIT_OK, HS_S_WAIT_HELLO, HS_S_WAIT_PROOF, HS_DONE };

struct st_tp_ep {
    st_tp_t *tp;
    ucp_ep_h ep;
    st_tp_ep_t *prev, *next; /* tp->eps */
    st_tp_ep_t *lost_next;   /* tp->lost list */
    int failed, closed, on_lost_list, ucx_closed;
    ucs_status_t fail_status;
    st_tp_lost_fn lost_fn;
    void *lost_arg;
    void *user;
    char peer[64];
    /* authentication: peer_ok = the peer proved the secret (its messages are delivered);
       can_send = our sends go out (else they are held, in order); visible = the user has the handle
       (client endpoints, and server endpoints once accepted) */
    int peer_ok, can_send, visible;
    int hs, hs_in_ready, on_hs_list;
    double hs_deadline;
    st_tp_ep_t *hs_next; /* tp->hs_head list: a handshake message to process */
    hs_msg_t hs_in;
    uint8_t nonce_c[32], nonce_s[32];
    st_tp_send_req_t *held_head, *held_tail;
    st_status_t lost_why; /* what the lost callback gets */
    char why[128];        /* our reason, when we closed it (else UCX's error) */
};

typedef struct {
    st_tp_t *tp;
    uint16_t id;
    st_tp_am_begin_fn begin;
    st_tp_am_done_fn done;
    void *arg;
} am_handler_t;

typedef struct conn_req {
    struct conn_req *next;
    ucp_conn_request_h req;
} conn_req_t;

typedef struct close_req {
    struct close_req *next;
    void *req;
} close_req_t;

struct st_tp {
    uv_loop_t *loop;
    uv_poll_t poll;
    uv_idle_t idle;
    uv_timer_t hs_timer; /* handshake deadlines; runs only while a connection is authenticating */
    int open_handles, poll_open;
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_listener_h listener;
    st_tp_accept_fn on_accept;
    void *accept_arg;
    int in_drive, destroying;
    st_tp_ep_t *eps;
    st_tp_ep_t *lost_head, *lost_tail;
    st_tp_send_req_t *sdone_head, *sdone_tail;
    st_tp_recv_t *rdone_head, *rdone_tail;
    conn_req_t *conn_head;
    close_req_t *closing;
    am_handler_t handlers[ST_TP_AM_IDS];
    st_tp_ep_t *hs_head; /* endpoints with a handshake message to process */
    int secure;
    uint8_t key[32]; /* HMAC(secret, "strata-ucx-v1") */
    unsigned hs_timeout_ms;
    char local_host[256]; /* st_tp_set_local_host; "" = none */
};

static st_status_t ucs_fail(st_status_t st, ucs_status_t us, const char *what, const char *peer) {
    return ST_FAIL(st, "transport: %s%s%s: %s", what, peer ? " " : "", peer ? peer : "", ucs_status_string(us));
}

static st_status_t status_from_ucs(ucs_status_t s) {
    if (s == UCS_OK) return ST_OK;
    if (s == UCS_ERR_CANCELED) return ST_ERR_CANCELLED;
    return ST_ERR_PEER;
}

static void drive(st_tp_t *tp);
static void on_idle(uv_idle_t *h) { drive(h->data); }

/* Make the loop progress the worker soon (sends posted outside drive, lists to deliver). */
static void schedule(st_tp_t *tp) {
    if (!tp->destroying && tp->worker && !uv_is_active((uv_handle_t *)&tp->idle)) uv_idle_start(&tp->idle, on_idle);
}

static void on_poll(uv_poll_t *h, int status, int events) {
    if (status < 0) st_log_warn("transport: event fd poll: %s", uv_strerror(status));
    drive(h->data);
}

/* ---- completion lists, filled from UCX callbacks ---- */

static void push_send(st_tp_t *tp, st_tp_send_req_t *r) {
    r->next = NULL;
    if (tp->sdone_tail) tp->sdone_tail->next = r; else tp->sdone_head = r;
    tp->sdone_tail = r;
}

static void push_recv(st_tp_t *tp, st_tp_recv_t *r) {
    r->next = NULL;
    if (tp->rdone_tail) tp->rdone_tail->next = r; else tp->rdone_head = r;
    tp->rdone_tail = r;
}

static void on_send_done(void *request, ucs_status_t status, void *user_data) {
    st_tp_send_req_t *r = user_data;
    st_tp_t *tp = r->tp;
    r->status = status_from_ucs(status);
    ucp_request_free(request);
    push_send(tp, r);
}

static void on_rndv_done(void *request, ucs_status_t status, size_t length, void *user_data) {
    st_tp_recv_t *r = user_data;
    r->status = status_from_ucs(status);
    if (status == UCS_OK) r->len = length;
    ucp_request_free(request);
    push_recv(r->tp, r);
}

/* Record that the endpoint is finished (UCX error, or our own verdict); deliver() closes it and
 * calls the lost callback. Safe inside UCX callbacks. */
static void mark_lost(st_tp_ep_t *e) {
    st_tp_t *tp = e->tp;
    e->failed = 1;
    e->lost_next = NULL;
    e->on_lost_list = 1;
    if (tp->lost_tail) tp->lost_tail->lost_next = e; else tp->lost_head = e;
    tp->lost_tail = e;
}

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status) {
    st_tp_ep_t *e = arg;
    if (e->failed || e->closed) return;
    e->fail_status = status;
    snprintf(e->why, sizeof e->why, "%s%s", ucs_status_string(status),
             e->hs == HS_C_WAIT_CHALLENGE ? " (before the handshake: a server without our cluster secret closes the "
                                            "connection)"
                                          : "");
    mark_lost(e);
}

/* The handshake failed (or the peer broke the protocol): close it. */
static void hs_fail(st_tp_ep_t *e, st_status_t why, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void hs_fail(st_tp_ep_t *e, st_status_t why, const char *fmt, ...) {
    if (e->failed || e->closed) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->why, sizeof e->why, fmt, ap);
    va_end(ap);
    e->lost_why = why;
    e->fail_status = UCS_ERR_REJECTED;
    mark_lost(e);
    schedule(e->tp);
}

static void on_conn_request(ucp_conn_request_h req, void *arg) {
    st_tp_t *tp = arg;
    conn_req_t *c = malloc(sizeof *c); /* connection set-up, not the hot path */
    if (!c) {
        st_log_error("transport: out of memory accepting a connection");
        ucp_listener_reject(tp->listener, req);
        return;
    }
    c->req = req;
    c->next = tp->conn_head;
    tp->conn_head = c;
}

static st_tp_ep_t *ep_find(st_tp_t *tp, ucp_ep_h h) {
    for (st_tp_ep_t *e = tp->eps; e; e = e->next)
        if (e->ep == h) return e;
    return NULL;
}

static ucs_status_t on_am(void *arg, const void *header, size_t header_length, void *data, size_t length,
                          const ucp_am_recv_param_t *param) {
    am_handler_t *h = arg;
    st_tp_t *tp = h->tp;
    st_tp_ep_t *ep = (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? ep_find(tp, param->reply_ep) : NULL;
    if (tp->secure && (!ep || !ep->peer_ok)) {
        /* NOTE: returning without taking the data drops it (UCX releases a rendezvous descriptor) */
        if (!ep)
            st_log_every(ST_LOG_WARN, 5.0, "transport: AM %u from an unknown endpoint dropped (not authenticated)",
                         h->id);
        else
            hs_fail(ep, ST_ERR_AUTH, "sent data (AM %u) before proving the cluster secret", h->id);
        return UCS_OK;
    }
    if (header_length > ST_TP_HDR_MAX) {
        st_log_error("transport: AM %u with a %zu-byte header (max %u) dropped", h->id, header_length, ST_TP_HDR_MAX);
        return UCS_OK;
    }
    st_tp_recv_t *r = h->begin(h->arg, ep, header, header_length, length);
    if (!r) return UCS_OK; /* dropped: for rendezvous UCX releases the descriptor */
    r->ep = ep;
    r->am_id = h->id;
    r->hdr_len = header_length;
    if (header_length) memcpy(r->hdr, header, header_length);
    r->len = 0;
    r->tp = tp;
    r->arg = h->arg;
    r->done = h->done;
    if (length > r->cap) {
        st_log_error("transport: AM %u of %zu bytes does not fit a %zu-byte buffer", h->id, length, r->cap);
        r->status = ST_ERR_PROTOCOL;
        push_recv(tp, r);
        return UCS_OK;
    }
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
        ucp_request_param_t p = {
            .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMORY_TYPE,
            .cb.recv_am = on_rndv_done,
            .user_data = r,
            .memory_type = UCS_MEMORY_TYPE_HOST,
        };
        ucs_status_ptr_t s = ucp_am_recv_data_nbx(tp->worker, data, r->buf, length, &p);
        if (s == NULL) {
            r->status = ST_OK;
            r->len = length;
            push_recv(tp, r);
        } else if (UCS_PTR_IS_ERR(s)) {
            st_log_error("transport: rendezvous receive of %zu bytes: %s", length, ucs_status_string(UCS_PTR_STATUS(s)));
            r->status = ST_ERR_PEER;
            push_recv(tp, r);
        }
        return UCS_OK;
    }
    memcpy(r->buf, data, length);
    r->status = ST_OK;
    r->len = length;
    push_recv(tp, r);
    return UCS_OK;
}

/* A handshake message: copy it and let deliver() answer (no sends from inside UCX callbacks). */
static ucs_status_t on_am_hs(void *arg, const void *header, size_t header_length, void *data, size_t length,
                             const ucp_am_recv_param_t *param) {
    st_tp_t *tp = arg;
    st_tp_ep_t *e = (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? ep_find(tp, param->reply_ep) : NULL;
    (void)data;
    if (!e) {
        st_log_every(ST_LOG_WARN, 5.0, "transport: handshake message from an unknown endpoint dropped");
        return UCS_OK;
    }
    if (e->failed || e->closed) return UCS_OK;
    if (!tp->secure) {
        hs_fail(e, ST_ERR_AUTH, "it starts the cluster-secret handshake, but this process has no secret (--insecure?)");
        return UCS_OK;
    }
    if (header_length != sizeof(hs_msg_t) || length || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
        hs_fail(e, ST_ERR_AUTH, "malformed handshake message (%zu-byte header, %zu-byte payload)", header_length,
                length);
        return UCS_OK;
    }
    if (e->hs_in_ready) { /* one message at a time: each step waits for our answer */
        hs_fail(e, ST_ERR_AUTH, "handshake messages out of turn");
        return UCS_OK;
    }
    memcpy(&e->hs_in, header, sizeof e->hs_in);
    e->hs_in_ready = 1;
    if (!e->on_hs_list) {
        e->on_hs_list = 1;
        e->hs_next = tp->hs_head;
        tp->hs_head = e;
    }
    return UCS_OK;
}

/* ---- endpoints ---- */

static st_tp_ep_t *ep_new(st_tp_t *tp, const char *peer) {
    st_tp_ep_t *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    e->tp = tp;
    e->lost_why = ST_ERR_PEER;
    e->peer_ok = e->can_send = 1; /* until a handshake says otherwise */
    snprintf(e->peer, sizeof e->peer, "%s", peer);
    e->next = tp->eps;
    if (tp->eps) tp->eps->prev = e;
    tp->eps = e;
    return e;
}

static void ep_unlink_free(st_tp_ep_t *e) {
    st_tp_t *tp = e->tp;
    if (e->on_hs_list) {
        for (st_tp_ep_t **pp = &tp->hs_head; *pp; pp = &(*pp)->hs_next)
            if (*pp == e) {
                *pp = e->hs_next;
                break;
            }
    }
    if (e->prev) e->prev->next = e->next; else tp->eps = e->next;
    if (e->next) e->next->prev = e->prev;
    free(e);
}

/* Sends held for an endpoint that never authenticated: each gets its callback (from deliver). */
static void fail_held(st_tp_ep_t *e, st_status_t st) {
    while (e->held_head) {
        st_tp_send_req_t *r = e->held_head;
        e->held_head = r->next;
        r->status = st;
        push_send(e->tp, r);
    }
    e->held_tail = NULL;
}

/* FORCE close: legal because every endpoint uses UCP_ERR_HANDLING_MODE_PEER. */
static void ep_force_close(st_tp_ep_t *e) {
    st_tp_t *tp = e->tp;
    fail_held(e, e->failed ? ST_ERR_PEER : ST_ERR_CANCELLED);
    e->closed = 1;
    if (e->ucx_closed) return;
    e->ucx_closed = 1;
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS, .flags = UCP_EP_CLOSE_FLAG_FORCE};
    ucs_status_ptr_t s = ucp_ep_close_nbx(e->ep, &p);
    if (s && !UCS_PTR_IS_ERR(s)) {
        close_req_t *c = malloc(sizeof *c);
        if (c) {
            c->req = s;
            c->next = tp->closing;
            tp->closing = c;
        } else {
            st_log_error("transport: out of memory tracking a close; leaking one request");
        }
    }
    schedule(tp);
}

static void reap_closes(st_tp_t *tp) {
    for (close_req_t **pp = &tp->closing; *pp;) {
        close_req_t *c = *pp;
        if (ucp_request_check_status(c->req) != UCS_INPROGRESS) {
            ucp_request_free(c->req);
            *pp = c->next;
            free(c);
        } else {
            pp = &c->next;
        }
    }
}

/* ---- sending ---- */

static st_status_t post_send(st_tp_ep_t *ep, uint16_t am_id, size_t hdr_len, const void *payload, size_t len,
                             st_tp_send_req_t *req) {
    ucp_request_param_t p = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS |
                        UCP_OP_ATTR_FIELD_MEMORY_TYPE,
        .cb.send = on_send_done,
        .user_data = req,
        .flags = UCP_AM_SEND_FLAG_REPLY,
        .memory_type = UCS_MEMORY_TYPE_HOST,
    };
    ucs_status_ptr_t s = ucp_am_send_nbx(ep->ep, am_id, req->hdr, hdr_len, payload, len, &p);
    if (UCS_PTR_IS_ERR(s)) return ucs_fail(ST_ERR_PEER, UCS_PTR_STATUS(s), "send to", ep->peer);
    if (s == NULL) push_send(ep->tp, req); /* done already: the callback still comes from the loop */
    return ST_OK;
}

/* The endpoint may send now: post what was held, in order. */
static void flush_held(st_tp_ep_t *e) {
    while (e->held_head) {
        st_tp_send_req_t *r = e->held_head;
        e->held_head = r->next;
        if (post_send(e, r->am_id, r->hdr_len, r->payload, r->len, r) != ST_OK) {
            r->status = ST_ERR_PEER; /* st_tp_send returned OK: the callback reports it */
            push_send(e->tp, r);
        }
    }
    e->held_tail = NULL;
}

/* ---- handshake ---- */

static void hs_free_sent(st_tp_send_req_t *r, st_status_t st) {
    (void)st;
    free(r);
}

static st_status_t hs_send(st_tp_ep_t *e, int type, const uint8_t *a, const uint8_t *b) {
    st_tp_send_req_t *r = calloc(1, sizeof *r); /* connection set-up only; freed on completion */
    if (!r) return ST_FAIL(ST_ERR_NO_MEMORY, "transport: handshake with %s", e->peer);
    hs_msg_t m = {.magic = {'S', 'T', 'H', 'S'}, .version = HS_VERSION, .type = (uint8_t)type};
    if (a) memcpy(m.a, a, sizeof m.a);
    if (b) memcpy(m.b, b, sizeof m.b);
    memcpy(r->hdr, &m, sizeof m);
    r->cb = hs_free_sent;
    r->tp = e->tp;
    st_status_t st = post_send(e, HS_AM_ID, sizeof m, NULL, 0, r);
    if (st != ST_OK) free(r);
    return st;
}

static void hs_mac(const st_tp_t *tp, const st_tp_ep_t *e, char side, uint8_t out[32]) {
    uint8_t m[14 + 64];
    memcpy(m, "strata-tp-v1 ", 13);
    m[13] = (uint8_t)side;
    memcpy(m + 14, e->nonce_c, 32);
    memcpy(m + 46, e->nonce_s, 32);
    st_hmac_sha256(tp->key, sizeof tp->key, m, sizeof m, out);
}

static void on_hs_tick(uv_timer_t *t);

static void hs_begin(st_tp_ep_t *e, int state) {
    st_tp_t *tp = e->tp;
    e->hs = state;
    e->peer_ok = e->can_send = 0;
    e->hs_deadline = st_time_sec() + tp->hs_timeout_ms / 1e3;
    if (!uv_is_active((uv_handle_t *)&tp->hs_timer)) {
        uint64_t tick = ST_MAX(10u, ST_MIN(250u, tp->hs_timeout_ms / 4));
        uv_timer_start(&tp->hs_timer, on_hs_tick, tick, tick);
    }
}

static int hs_pending(const st_tp_ep_t *e) { return e->hs != HS_NONE && e->hs != HS_DONE && !e->failed && !e->closed; }

/* Deadlines: a connection that has not finished the handshake in time is closed. */
static void on_hs_tick(uv_timer_t *t) {
    st_tp_t *tp = t->data;
    double now = st_time_sec();
    int left = 0;
    for (st_tp_ep_t *e = tp->eps; e; e = e->next) {
        if (!hs_pending(e)) continue;
        if (now >= e->hs_deadline)
            hs_fail(e, ST_ERR_AUTH, "no handshake within %u ms (%s)", tp->hs_timeout_ms,
                    e->hs == HS_C_WAIT_CHALLENGE ? "no answer to HELLO: does the server have the cluster secret?"
                    : e->hs == HS_S_WAIT_HELLO   ? "silent peer, or one without the cluster secret"
                                                 : "stalled half-way");
        else
            left = 1;
    }
    if (!left) uv_timer_stop(t);
}

static void hs_process(st_tp_ep_t *e) {
    st_tp_t *tp = e->tp;
    hs_msg_t m = e->hs_in;
    e->hs_in_ready = 0;
    if (e->failed || e->closed) return;
    if (memcmp(m.magic, "STHS", 4) != 0) {
        hs_fail(e, ST_ERR_AUTH, "not a strata handshake message");
        return;
    }
    if (m.version != HS_VERSION) {
        hs_fail(e, ST_ERR_AUTH, "handshake version %u, this build speaks %u", m.version, HS_VERSION);
        return;
    }
    uint8_t mac[32];
    if (e->hs == HS_S_WAIT_HELLO && m.type == HS_HELLO) {
        memcpy(e->nonce_c, m.a, 32);
        if (st_random_bytes(e->nonce_s, 32) != ST_OK) {
            hs_fail(e, ST_ERR_INTERNAL, "no randomness for the handshake");
            return;
        }
        hs_mac(tp, e, 'S', mac);
        e->hs = HS_S_WAIT_PROOF;
        if (hs_send(e, HS_CHALLENGE, e->nonce_s, mac) != ST_OK) hs_fail(e, ST_ERR_PEER, "cannot send the challenge");
    } else if (e->hs == HS_C_WAIT_CHALLENGE && m.type == HS_CHALLENGE) {
        memcpy(e->nonce_s, m.a, 32);
        hs_mac(tp, e, 'S', mac);
        if (!st_ct_equal(mac, m.b, 32)) {
            hs_fail(e, ST_ERR_AUTH,
                    "the server did not prove the cluster secret (a different secret, or not a strata server)");
            return;
        }
        e->peer_ok = 1; /* the server is genuine: what it sends from now on is delivered */
        hs_mac(tp, e, 'C', mac);
        e->hs = HS_C_WAIT_OK;
        if (hs_send(e, HS_PROOF, mac, NULL) != ST_OK) hs_fail(e, ST_ERR_PEER, "cannot send the proof");
    } else if (e->hs == HS_S_WAIT_PROOF && m.type == HS_PROOF) {
        hs_mac(tp, e, 'C', mac);
        if (!st_ct_equal(mac, m.a, 32)) {
            hs_fail(e, ST_ERR_AUTH, "the client did not prove the cluster secret");
            return;
        }
        e->hs = HS_DONE;
        e->peer_ok = e->can_send = 1;
        if (hs_send(e, HS_OK, NULL, NULL) != ST_OK) {
            hs_fail(e, ST_ERR_PEER, "cannot send the handshake OK");
            return;
        }
        e->visible = 1;
        if (tp->on_accept) tp->on_accept(tp, e, tp->accept_arg);
    } else if (e->hs == HS_C_WAIT_OK && m.type == HS_OK) {
        /* NOTE: the held sends go out only now, so none can reach the server before our proof even
           if UCX delivered active messages out of order */
        e->hs = HS_DONE;
        e->can_send = 1;
        flush_held(e);
    } else {
        hs_fail(e, ST_ERR_AUTH, "unexpected handshake message %u in state %d", m.type, e->hs);
    }
}

static void accept_pending(st_tp_t *tp) {
    while (tp->conn_head) {
        conn_req_t *c = tp->conn_head;
        tp->conn_head = c->next;
        char peer[64] = "?";
        ucp_conn_request_attr_t ca = {.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR};
        if (ucp_conn_request_query(c->req, &ca) == UCS_OK) {
            char host[48];
            struct sockaddr_storage *sa = &ca.client_address;
            if (getnameinfo((struct sockaddr *)sa, sizeof *sa, host, sizeof host, NULL, 0, NI_NUMERICHOST) == 0)
                snprintf(peer, sizeof peer, "%s:%u", host,
                         ntohs(sa->ss_family == AF_INET6 ? ((struct sockaddr_in6 *)sa)->sin6_port
                                                         : ((struct sockaddr_in *)sa)->sin_port));
        }
        if (tp->secure) { /* bound the connections that have not proven anything yet */
            int n = 0;
            for (st_tp_ep_t *e = tp->eps; e; e = e->next) n += hs_pending(e);
            if (n >= HS_MAX_PENDING) {
                st_log_every(ST_LOG_WARN, 5.0, "transport: %d connections still authenticating; refused %s", n, peer);
                ucp_listener_reject(tp->listener, c->req);
                free(c);
                continue;
            }
        }
        st_tp_ep_t *e = ep_new(tp, peer);
        if (!e) {
            st_log_error("transport: out of memory accepting %s", peer);
            ucp_listener_reject(tp->listener, c->req);
            free(c);
            continue;
        }
        ucp_ep_params_t ep = {
            .field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                          UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
            .conn_request = c->req,
            .err_mode = UCP_ERR_HANDLING_MODE_PEER,
            .err_handler = {.cb = on_ep_error, .arg = e},
        };
        ucs_status_t s = ucp_ep_create(tp->worker, &ep, &e->ep);
        free(c);
        if (s != UCS_OK) {
            ucs_fail(ST_ERR_PEER, s, "accept", peer);
            ep_unlink_free(e);
            continue;
        }
        if (tp->secure) {
            hs_begin(e, HS_S_WAIT_HELLO); /* accepted once it proves the secret */
            continue;
        }
        e->visible = 1;
        if (tp->on_accept) tp->on_accept(tp, e, tp->accept_arg);
    }
}

/* Deliver what UCX callbacks recorded. Returns nonzero if anything was delivered. */
static int deliver(st_tp_t *tp) {
    int did = 0;
    if (tp->conn_head) {
        accept_pending(tp);
        did = 1;
    }
    while (tp->hs_head) {
        st_tp_ep_t *e = tp->hs_head;
        tp->hs_head = e->hs_next;
        e->on_hs_list = 0;
        hs_process(e);
        did = 1;
    }
    while (tp->sdone_head) {
        st_tp_send_req_t *r = tp->sdone_head;
        tp->sdone_head = r->next;
        if (!tp->sdone_head) tp->sdone_tail = NULL;
        r->next = NULL;
        r->cb(r, r->status);
        did = 1;
    }
    while (tp->rdone_head) {
        st_tp_recv_t *r = tp->rdone_head;
        tp->rdone_head = r->next;
        if (!tp->rdone_head) tp->rdone_tail = NULL;
        r->next = NULL;
        r->done(r->arg, r);
        did = 1;
    }
    while (tp->lost_head) {
        st_tp_ep_t *e = tp->lost_head;
        tp->lost_head = e->lost_next;
        if (!tp->lost_head) tp->lost_tail = NULL;
        e->on_lost_list = 0;
        did = 1;
        if (e->closed) { /* the user closed it after the error was recorded */
            ep_force_close(e);
            ep_unlink_free(e);
            continue;
        }
        if (e->lost_why == ST_ERR_AUTH)
            st_log_every(ST_LOG_WARN, 5.0, "transport: %s: connection closed: %s", e->peer, e->why);
        else if (!e->visible)
            st_log_every(ST_LOG_WARN, 5.0, "transport: %s went away during the handshake: %s", e->peer, e->why);
        else
            st_log_warn("transport: peer %s lost: %s", e->peer, e->why);
        ep_force_close(e);
        if (e->visible && e->lost_fn) e->lost_fn(e, e->lost_why, e->lost_arg);
        ep_unlink_free(e);
    }
    if (tp->closing) reap_closes(tp);
    return did;
}

/* Progress and deliver until neither does anything; nonzero when something happened. NOTE: deliver
 * after every productive progress call, so receive records are handed back (and sends re-posted)
 * before UCX drains more messages off the wire. */
static int progress_all(st_tp_t *tp) {
    int did = 0;
    for (;;) {
        unsigned n = ucp_worker_progress(tp->worker);
        if (!deliver(tp) && !n) return did;
        did = 1;
    }
}

/* Progress until idle, deliver, then arm the event fd; UCS_ERR_BUSY means more is pending. */
static void drive(st_tp_t *tp) {
    if (tp->in_drive || !tp->worker) return;
    tp->in_drive = 1;
    progress_all(tp);
    ucs_status_t s = ucp_worker_arm(tp->worker);
    if (s == UCS_ERR_BUSY) {
        uv_idle_start(&tp->idle, on_idle);
    } else {
        if (s != UCS_OK) st_log_warn("transport: ucp_worker_arm: %s", ucs_status_string(s));
        /* closes still in flight complete on fd events too, but keep polling them cheaply */
        if (tp->closing) uv_idle_start(&tp->idle, on_idle);
        else uv_idle_stop(&tp->idle);
    }
    tp->in_drive = 0;
}

int st_tp_poll(st_tp_t *tp) { /* as drive, without arming: a poller comes back at once */
    if (tp->in_drive || !tp->worker) return 0;
    tp->in_drive = 1;
    int did = progress_all(tp);
    tp->in_drive = 0;
    return did;
}

/* ---- UCX start-up ---- */

static st_status_t resolve(const char *host, uint16_t port, struct sockaddr_storage *sa, socklen_t *len) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *res;
    char ps[8];
    snprintf(ps, sizeof ps, "%u", port);
    if (st_host_is_localhost(host)) host = "127.0.0.1";
    int rc = getaddrinfo(host, ps, &hints, &res); /* NOTE: may block on DNS; start-up only */
    if (rc) return ST_FAIL(ST_ERR_INVALID_ARG, "transport: cannot resolve %s: %s", host, gai_strerror(rc));
    memcpy(sa, res->ai_addr, res->ai_addrlen);
    *len = res->ai_addrlen;
    freeaddrinfo(res);
    return ST_OK;
}

static int addr_is_loopback(const struct sockaddr *sa) {
    if (sa->sa_family == AF_INET) return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    if (sa->sa_family == AF_INET6) return IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)sa)->sin6_addr);
    return 0;
}

static int addr_is_any(const struct sockaddr *sa) {
    if (sa->sa_family == AF_INET) return ((const struct sockaddr_in *)sa)->sin_addr.s_addr == htonl(INADDR_ANY);
    if (sa->sa_family == AF_INET6) return IN6_IS_ADDR_UNSPECIFIED(&((const struct sockaddr_in6 *)sa)->sin6_addr);
    return 0;
}

static int addr_equal(const struct sockaddr *a, const struct sockaddr *b) {
    if (a->sa_family != b->sa_family) return 0;
    if (a->sa_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr == ((const struct sockaddr_in *)b)->sin_addr.s_addr;
    if (a->sa_family == AF_INET6)
        return !memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr, &((const struct sockaddr_in6 *)b)->sin6_addr,
                       sizeof(struct in6_addr));
    return 0;
}

/* UCX's tcp transport listens on every interface it uses (for its own connection establishment,
 * apart from the sockaddr listener), so a process serving on 127.0.0.1 would also accept on the
 * host's external address. Keep UCX to the interface that owns host, plus the RDMA devices (they
 * open no sockets; named as UCX does: <ibdev>:<port>). */
static void limit_devices(ucp_config_t *cfg, const char *host) {
    if (!host || !*host || st_tun_source(ST_TUN_UCX_NET_DEVICES) != ST_TUN_FROM_DEFAULT) return;
    struct sockaddr_storage sa;
    socklen_t sl;
    if (resolve(host, 0, &sa, &sl) != ST_OK || addr_is_any((struct sockaddr *)&sa)) return;
    struct ifaddrs *ifs;
    if (getifaddrs(&ifs) != 0) {
        st_log_warn("transport: getifaddrs: %s; UCX may listen on every interface", strerror(errno));
        return;
    }
    char devs[1024] = "";
    for (struct ifaddrs *i = ifs; i && !devs[0]; i = i->ifa_next)
        if (i->ifa_addr && addr_equal(i->ifa_addr, (struct sockaddr *)&sa))
            snprintf(devs, sizeof devs, "%s", i->ifa_name);
    /* 127.0.0.2 etc. belong to the loopback interface without being listed */
    for (struct ifaddrs *i = ifs; i && !devs[0]; i = i->ifa_next)
        if (i->ifa_addr && (i->ifa_flags & IFF_LOOPBACK) && addr_is_loopback((struct sockaddr *)&sa))
            snprintf(devs, sizeof devs, "%s", i->ifa_name);
    freeifaddrs(ifs);
    if (!devs[0]) {
        st_log_warn("transport: %s is not an address of this host's interfaces; UCX may listen on every interface",
                    host);
        return;
    }
    DIR *d = opendir("/sys/class/infiniband");
    for (struct dirent *de; d && (de = readdir(d));) {
        if (de->d_name[0] == '.') continue;
        char path[512];
        snprintf(path, sizeof path, "/sys/class/infiniband/%s/ports", de->d_name);
        DIR *pd = opendir(path);
        for (struct dirent *pe; pd && (pe = readdir(pd));) {
            if (pe->d_name[0] == '.') continue;
            size_t n = strlen(devs);
            snprintf(devs + n, sizeof devs - n, ",%s:%s", de->d_name, pe->d_name);
        }
        if (pd) closedir(pd);
    }
    if (d) closedir(d);
    ucs_status_t s = ucp_config_modify(cfg, "NET_DEVICES", devs);
    if (s != UCS_OK) st_log_warn("transport: UCX_NET_DEVICES=%s: %s", devs, ucs_status_string(s));
    else st_log_debug("transport: UCX devices limited to %s (those of %s; UCX_NET_DEVICES overrides)", devs, host);
}

static st_status_t am_register(st_tp_t *tp, uint16_t id, ucp_am_recv_callback_t cb, void *arg) {
    ucp_am_handler_param_t ap = {
        .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                      UCP_AM_HANDLER_PARAM_FIELD_ARG,
        .id = id,
        .flags = UCP_AM_FLAG_WHOLE_MSG,
        .cb = cb,
        .arg = arg,
    };
    ucs_status_t s = ucp_worker_set_am_recv_handler(tp->worker, &ap);
    if (s != UCS_OK) return ucs_fail(ST_ERR_INTERNAL, s, "ucp_worker_set_am_recv_handler", NULL);
    return ST_OK;
}

/* UCX context + worker, on the first listen/connect (host: the interface to keep UCX to). */
static st_status_t ucx_start(st_tp_t *tp, const char *host) {
    if (tp->worker) return ST_OK;
    st_status_t st;
    ucs_status_t s;
    ucp_config_t *cfg;
    s = ucp_config_read(NULL, NULL, &cfg);
    if (s != UCS_OK) return ucs_fail(ST_ERR_CONFIG, s, "ucp_config_read", NULL);
    limit_devices(cfg, tp->local_host[0] ? tp->local_host : host);
    ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP};
    s = ucp_init(&p, cfg, &tp->ctx);
    ucp_config_release(cfg);
    if (s != UCS_OK) return ucs_fail(ST_ERR_UNSUPPORTED, s, "ucp_init", NULL);
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE, .thread_mode = UCS_THREAD_MODE_SINGLE};
    s = ucp_worker_create(tp->ctx, &wp, &tp->worker);
    if (s != UCS_OK) {
        st = ucs_fail(ST_ERR_UNSUPPORTED, s, "ucp_worker_create", NULL);
        goto err_ctx;
    }
    int efd;
    s = ucp_worker_get_efd(tp->worker, &efd);
    if (s != UCS_OK) {
        st = ucs_fail(ST_ERR_UNSUPPORTED, s, "ucp_worker_get_efd", NULL);
        goto err_worker;
    }
    for (uint16_t i = 0; i < ST_TP_AM_IDS; i++)
        if (tp->handlers[i].begin && (st = am_register(tp, i, on_am, &tp->handlers[i])) != ST_OK) goto err_worker;
    /* NOTE: always, even without a secret: UCX 1.13 crashes on an active message that reaches a
       worker with no handler registered at all (with one, unknown ids are dropped with a warning) */
    if ((st = am_register(tp, HS_AM_ID, on_am_hs, tp)) != ST_OK) goto err_worker;
    int rc = uv_poll_init(tp->loop, &tp->poll, efd);
    if (rc) {
        st = ST_FAIL(ST_ERR_INTERNAL, "transport: uv_poll_init: %s", uv_strerror(rc));
        goto err_worker;
    }
    tp->poll.data = tp;
    tp->poll_open = 1;
    tp->open_handles++;
    uv_poll_start(&tp->poll, UV_READABLE, on_poll);
    schedule(tp); /* first arm */
    return ST_OK;
err_worker:
    ucp_worker_destroy(tp->worker);
    tp->worker = NULL;
err_ctx:
    ucp_cleanup(tp->ctx);
    tp->ctx = NULL;
    return st;
}

/* ---- public ---- */

st_status_t st_tp_create(uv_loop_t *loop, st_tp_t **out) {
    setenv("UCX_TCP_CM_REUSEADDR", "y", 0); /* restarts on fixed ports (TIME_WAIT) */
    st_tp_t *tp = calloc(1, sizeof *tp);
    if (!tp) return ST_FAIL(ST_ERR_NO_MEMORY, "transport: cannot allocate");
    tp->loop = loop;
    tp->hs_timeout_ms = HS_TIMEOUT_MS;
    uv_idle_init(loop, &tp->idle);
    uv_timer_init(loop, &tp->hs_timer);
    tp->idle.data = tp->hs_timer.data = tp;
    tp->open_handles = 2;
    for (uint16_t i = 0; i < ST_TP_AM_IDS; i++) tp->handlers[i] = (am_handler_t){.tp = tp, .id = i};
    *out = tp;
    return ST_OK;
}

static void on_handle_closed(uv_handle_t *h) {
    st_tp_t *tp = h->data;
    if (--tp->open_handles) return;
    if (tp->worker) ucp_worker_destroy(tp->worker);
    if (tp->ctx) ucp_cleanup(tp->ctx);
    free(tp);
}

void st_tp_destroy(st_tp_t *tp) {
    if (!tp) return;
    if (tp->listener) ucp_listener_destroy(tp->listener);
    tp->listener = NULL;
    while (tp->conn_head) {
        conn_req_t *c = tp->conn_head;
        tp->conn_head = c->next;
        free(c);
    }
    tp->destroying = 1; /* no handshake answers, no accept callbacks from here on */
    while (tp->hs_head) {
        tp->hs_head->on_hs_list = 0;
        tp->hs_head = tp->hs_head->hs_next;
    }
    for (st_tp_ep_t *e = tp->eps; e; e = e->next)
        if (!e->closed) ep_force_close(e);
    /* Bounded: force-closes finish locally. Deliver what completes, so every request gets its
       callback. NOTE: we are on the loop, not in a UCX callback, so progressing here is legal. */
    double t0 = st_time_sec();
    if (tp->worker) {
        do {
            while (ucp_worker_progress(tp->worker)) {
            }
            deliver(tp);
        } while (tp->closing && st_time_sec() - t0 < 2.0);
    }
    if (tp->closing) st_log_warn("transport: endpoints still closing after 2 s; releasing anyway");
    while (tp->closing) {
        close_req_t *c = tp->closing;
        tp->closing = c->next;
        ucp_request_cancel(tp->worker, c->req);
        ucp_request_free(c->req);
        free(c);
    }
    while (tp->eps) ep_unlink_free(tp->eps);
    uv_idle_stop(&tp->idle);
    uv_timer_stop(&tp->hs_timer);
    if (tp->poll_open) {
        uv_poll_stop(&tp->poll);
        uv_close((uv_handle_t *)&tp->poll, on_handle_closed);
    }
    uv_close((uv_handle_t *)&tp->idle, on_handle_closed);
    uv_close((uv_handle_t *)&tp->hs_timer, on_handle_closed);
}

void st_tp_set_local_host(st_tp_t *tp, const char *host) {
    snprintf(tp->local_host, sizeof tp->local_host, "%s", host ? host : "");
}

void st_tp_set_secret(st_tp_t *tp, const st_secret_t *secret) {
    if (!secret || !secret->len) {
        tp->secure = 0;
        memset(tp->key, 0, sizeof tp->key);
        return;
    }
    static const char label[] = "strata-ucx-v1"; /* a key of its own: the secret never meets the wire */
    st_hmac_sha256(secret->key, secret->len, label, sizeof label - 1, tp->key);
    tp->secure = 1;
}

void st_tp_set_handshake_timeout_ms(st_tp_t *tp, unsigned ms) { tp->hs_timeout_ms = ms ? ms : HS_TIMEOUT_MS; }

st_status_t st_tp_listen(st_tp_t *tp, const char *host, uint16_t port, st_tp_accept_fn on_accept, void *arg,
                         uint16_t *bound_port) {
    if (tp->listener) return ST_FAIL(ST_ERR_INVALID_ARG, "transport: already listening");
    struct sockaddr_storage sa;
    socklen_t sl;
    st_status_t st = resolve(host, port, &sa, &sl);
    if (st) return st;
    if ((st = ucx_start(tp, host)) != ST_OK) return st;
    ucp_listener_params_t lp = {
        .field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER,
        .sockaddr = {.addr = (struct sockaddr *)&sa, .addrlen = sl},
        .conn_handler = {.cb = on_conn_request, .arg = tp},
    };
    ucs_status_t s = ucp_listener_create(tp->worker, &lp, &tp->listener);
    if (s != UCS_OK) {
        char what[96];
        snprintf(what, sizeof what, "listen on %s:%u", host, port);
        return ucs_fail(ST_ERR_IO, s, what, NULL);
    }
    ucp_listener_attr_t la = {.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR};
    s = ucp_listener_query(tp->listener, &la);
    if (s != UCS_OK) {
        ucp_listener_destroy(tp->listener);
        tp->listener = NULL;
        return ucs_fail(ST_ERR_INTERNAL, s, "ucp_listener_query", NULL);
    }
    const struct sockaddr *bsa = (const struct sockaddr *)&la.sockaddr;
    uint16_t bp = ntohs(bsa->sa_family == AF_INET6 ? ((const struct sockaddr_in6 *)bsa)->sin6_port
                                                   : ((const struct sockaddr_in *)bsa)->sin_port);
    tp->on_accept = on_accept;
    tp->accept_arg = arg;
    if (bound_port) *bound_port = bp;
    schedule(tp);
    return ST_OK;
}

st_status_t st_tp_connect(st_tp_t *tp, const char *host, uint16_t port, st_tp_ep_t **out) {
    struct sockaddr_storage sa;
    socklen_t sl;
    st_status_t st = resolve(host, port, &sa, &sl);
    if (st) return st;
    if ((st = ucx_start(tp, NULL)) != ST_OK) return st;
    char peer[64];
    snprintf(peer, sizeof peer, "%s:%u", host, port);
    st_tp_ep_t *e = ep_new(tp, peer);
    if (!e) return ST_FAIL(ST_ERR_NO_MEMORY, "transport: cannot allocate endpoint for %s", peer);
    ucp_ep_params_t ep = {
        .field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
        .flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER,
        .sockaddr = {.addr = (struct sockaddr *)&sa, .addrlen = sl},
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {.cb = on_ep_error, .arg = e},
    };
    ucs_status_t s = ucp_ep_create(tp->worker, &ep, &e->ep);
    if (s != UCS_OK) {
        ep_unlink_free(e);
        return ucs_fail(ST_ERR_PEER, s, "connect", peer);
    }
    e->visible = 1;
    if (tp->secure) { /* HELLO goes out as soon as UCX has wired the connection up */
        hs_begin(e, HS_C_WAIT_CHALLENGE);
        if ((st = st_random_bytes(e->nonce_c, 32)) != ST_OK || (st = hs_send(e, HS_HELLO, e->nonce_c, NULL)) != ST_OK) {
            ep_force_close(e);
            ep_unlink_free(e);
            return st;
        }
    }
    schedule(tp);
    *out = e;
    return ST_OK;
}

void st_tp_ep_on_lost(st_tp_ep_t *ep, st_tp_lost_fn fn, void *arg) {
    ep->lost_fn = fn;
    ep->lost_arg = arg;
}
void st_tp_ep_set_user(st_tp_ep_t *ep, void *user) { ep->user = user; }
void *st_tp_ep_user(const st_tp_ep_t *ep) { return ep->user; }

void st_tp_ep_close(st_tp_ep_t *ep) {
    if (ep->closed) return;
    if (ep->on_lost_list) { /* error recorded, not yet delivered: deliver() closes it, no callback */
        ep->closed = 1;
        return;
    }
    ep_force_close(ep);
    ep_unlink_free(ep);
}

st_status_t st_tp_set_am_handler(st_tp_t *tp, uint16_t am_id, st_tp_am_begin_fn begin, st_tp_am_done_fn done,
                                 void *arg) {
    if (am_id >= ST_TP_AM_IDS || !begin || !done)
        return ST_FAIL(ST_ERR_INVALID_ARG, "transport: bad AM handler for id %u", am_id);
    am_handler_t *h = &tp->handlers[am_id];
    h->begin = begin;
    h->done = done;
    h->arg = arg;
    return tp->worker ? am_register(tp, am_id, on_am, h) : ST_OK; /* else when UCX starts */
}

st_status_t st_tp_send(st_tp_ep_t *ep, uint16_t am_id, const void *hdr, size_t hdr_len, const void *payload,
                       size_t len, st_tp_send_req_t *req) {
    st_tp_t *tp = ep->tp;
    if (hdr_len > ST_TP_HDR_MAX || !req->cb || am_id >= ST_TP_AM_IDS)
        return ST_FAIL(ST_ERR_INVALID_ARG, "transport: send to %s: bad header length %zu, id %u or no callback",
                       ep->peer, hdr_len, am_id);
    if (ep->failed || ep->closed) return ST_ERR_PEER; /* already reported by the lost callback */
    if (hdr_len) memcpy(req->hdr, hdr, hdr_len);
    req->status = ST_OK;
    req->tp = tp;
    if (!ep->can_send) { /* still authenticating: held, posted in order after the handshake */
        req->am_id = am_id;
        req->hdr_len = (uint16_t)hdr_len;
        req->payload = payload;
        req->len = len;
        req->next = NULL;
        if (ep->held_tail) ep->held_tail->next = req; else ep->held_head = req;
        ep->held_tail = req;
        return ST_OK;
    }
    st_status_t st = post_send(ep, am_id, hdr_len, payload, len, req);
    if (st == ST_OK) schedule(tp);
    return st;
}
