/* UCX UCP behind st_tp: active messages, sockaddr listener/connect, peer error handling, and
 * progress driven by libuv (worker event fd → uv_poll_t; uv_idle_t while UCX is busy). The only file
 * that includes <ucp/api/ucp.h>. Recipes: /work/shared/notes/c-ecosystem.md §2.
 *
 * NOTE: UCX callbacks (AM receive, send/recv completion, error, connection request) only record
 * what happened on intrusive lists; drive() delivers user callbacks after ucp_worker_progress
 * returns. So user code never runs inside UCX except st_tp_am_begin_fn, and nothing ever calls
 * ucp_worker_progress from within a UCX callback. */
#include "strata/transport.h"

#include <netdb.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>
#include <uv.h>

struct st_tp_ep {
    st_tp_t *tp;
    ucp_ep_h ep;
    st_tp_ep_t *prev, *next; /* tp->eps */
    st_tp_ep_t *lost_next;   /* tp->lost list */
    int failed, closed, on_lost_list;
    ucs_status_t fail_status;
    st_tp_lost_fn lost_fn;
    void *lost_arg;
    void *user;
    char peer[64];
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
    int open_handles;
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
    if (!tp->destroying && !uv_is_active((uv_handle_t *)&tp->idle)) uv_idle_start(&tp->idle, on_idle);
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

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status) {
    st_tp_ep_t *e = arg;
    st_tp_t *tp = e->tp;
    if (e->failed || e->closed) return;
    e->failed = 1;
    e->fail_status = status;
    e->lost_next = NULL;
    e->on_lost_list = 1;
    if (tp->lost_tail) tp->lost_tail->lost_next = e; else tp->lost_head = e;
    tp->lost_tail = e;
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

/* ---- endpoints ---- */

static st_tp_ep_t *ep_new(st_tp_t *tp, const char *peer) {
    st_tp_ep_t *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    e->tp = tp;
    snprintf(e->peer, sizeof e->peer, "%s", peer);
    e->next = tp->eps;
    if (tp->eps) tp->eps->prev = e;
    tp->eps = e;
    return e;
}

static void ep_unlink_free(st_tp_ep_t *e) {
    st_tp_t *tp = e->tp;
    if (e->prev) e->prev->next = e->next; else tp->eps = e->next;
    if (e->next) e->next->prev = e->prev;
    free(e);
}

/* FORCE close: legal because every endpoint uses UCP_ERR_HANDLING_MODE_PEER. */
static void ep_force_close(st_tp_ep_t *e) {
    st_tp_t *tp = e->tp;
    e->closed = 1;
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
        st_log_warn("transport: peer %s lost: %s", e->peer, ucs_status_string(e->fail_status));
        ep_force_close(e);
        if (e->lost_fn) e->lost_fn(e, ST_ERR_PEER, e->lost_arg);
        ep_unlink_free(e);
    }
    if (tp->closing) reap_closes(tp);
    return did;
}

/* Progress until idle, deliver, then arm the event fd; UCS_ERR_BUSY means more is pending. */
static void drive(st_tp_t *tp) {
    if (tp->in_drive) return;
    tp->in_drive = 1;
    for (;;) {
        /* NOTE: deliver after every productive progress call, so receive records are handed back
           (and sends re-posted) before UCX drains more messages off the wire. */
        unsigned n = ucp_worker_progress(tp->worker);
        if (deliver(tp) || n) continue;
        ucs_status_t s = ucp_worker_arm(tp->worker);
        if (s == UCS_ERR_BUSY) {
            uv_idle_start(&tp->idle, on_idle);
        } else {
            if (s != UCS_OK) st_log_warn("transport: ucp_worker_arm: %s", ucs_status_string(s));
            /* closes still in flight complete on fd events too, but keep polling them cheaply */
            if (tp->closing) uv_idle_start(&tp->idle, on_idle);
            else uv_idle_stop(&tp->idle);
        }
        break;
    }
    tp->in_drive = 0;
}

/* ---- public ---- */

st_status_t st_tp_create(uv_loop_t *loop, st_tp_t **out) {
    setenv("UCX_TCP_CM_REUSEADDR", "y", 0); /* restarts on fixed ports (TIME_WAIT) */
    st_tp_t *tp = calloc(1, sizeof *tp);
    if (!tp) return ST_FAIL(ST_ERR_NO_MEMORY, "transport: cannot allocate");
    tp->loop = loop;
    st_status_t st;
    ucs_status_t s;
    ucp_config_t *cfg;
    s = ucp_config_read(NULL, NULL, &cfg);
    if (s != UCS_OK) {
        st = ucs_fail(ST_ERR_CONFIG, s, "ucp_config_read", NULL);
        goto err_tp;
    }
    ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP};
    s = ucp_init(&p, cfg, &tp->ctx);
    ucp_config_release(cfg);
    if (s != UCS_OK) {
        st = ucs_fail(ST_ERR_UNSUPPORTED, s, "ucp_init", NULL);
        goto err_tp;
    }
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
    int rc = uv_poll_init(loop, &tp->poll, efd);
    if (rc) {
        st = ST_FAIL(ST_ERR_INTERNAL, "transport: uv_poll_init: %s", uv_strerror(rc));
        goto err_worker;
    }
    uv_idle_init(loop, &tp->idle);
    tp->poll.data = tp->idle.data = tp;
    tp->open_handles = 2;
    uv_poll_start(&tp->poll, UV_READABLE, on_poll);
    for (uint16_t i = 0; i < ST_TP_AM_IDS; i++) tp->handlers[i] = (am_handler_t){.tp = tp, .id = i};
    schedule(tp); /* first arm */
    *out = tp;
    return ST_OK;
err_worker:
    ucp_worker_destroy(tp->worker);
err_ctx:
    ucp_cleanup(tp->ctx);
err_tp:
    free(tp);
    return st;
}

static void on_handle_closed(uv_handle_t *h) {
    st_tp_t *tp = h->data;
    if (--tp->open_handles) return;
    ucp_worker_destroy(tp->worker);
    ucp_cleanup(tp->ctx);
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
    for (st_tp_ep_t *e = tp->eps; e; e = e->next)
        if (!e->closed) ep_force_close(e);
    /* Bounded: force-closes finish locally. Deliver what completes, so every request gets its
       callback. NOTE: we are on the loop, not in a UCX callback, so progressing here is legal. */
    double t0 = st_time_sec();
    do {
        while (ucp_worker_progress(tp->worker)) {
        }
        deliver(tp);
    } while (tp->closing && st_time_sec() - t0 < 2.0);
    if (tp->closing) st_log_warn("transport: endpoints still closing after 2 s; releasing anyway");
    while (tp->closing) {
        close_req_t *c = tp->closing;
        tp->closing = c->next;
        ucp_request_cancel(tp->worker, c->req);
        ucp_request_free(c->req);
        free(c);
    }
    while (tp->eps) ep_unlink_free(tp->eps);
    tp->destroying = 1;
    uv_idle_stop(&tp->idle);
    uv_poll_stop(&tp->poll);
    uv_close((uv_handle_t *)&tp->poll, on_handle_closed);
    uv_close((uv_handle_t *)&tp->idle, on_handle_closed);
}

static st_status_t resolve(const char *host, uint16_t port, struct sockaddr_storage *sa, socklen_t *len) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *res;
    char ps[8];
    snprintf(ps, sizeof ps, "%u", port);
    int rc = getaddrinfo(host, ps, &hints, &res); /* NOTE: may block on DNS; start-up only */
    if (rc) return ST_FAIL(ST_ERR_INVALID_ARG, "transport: cannot resolve %s: %s", host, gai_strerror(rc));
    memcpy(sa, res->ai_addr, res->ai_addrlen);
    *len = res->ai_addrlen;
    freeaddrinfo(res);
    return ST_OK;
}

st_status_t st_tp_listen(st_tp_t *tp, const char *host, uint16_t port, st_tp_accept_fn on_accept, void *arg,
                         uint16_t *bound_port) {
    if (tp->listener) return ST_FAIL(ST_ERR_INVALID_ARG, "transport: already listening");
    struct sockaddr_storage sa;
    socklen_t sl;
    st_status_t st = resolve(host, port, &sa, &sl);
    if (st) return st;
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
    ucp_am_handler_param_t ap = {
        .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                      UCP_AM_HANDLER_PARAM_FIELD_ARG,
        .id = am_id,
        .flags = UCP_AM_FLAG_WHOLE_MSG,
        .cb = on_am,
        .arg = h,
    };
    ucs_status_t s = ucp_worker_set_am_recv_handler(tp->worker, &ap);
    if (s != UCS_OK) return ucs_fail(ST_ERR_INTERNAL, s, "ucp_worker_set_am_recv_handler", NULL);
    return ST_OK;
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
    if (s == NULL) push_send(tp, req); /* done already: the callback still comes from the loop */
    schedule(tp);
    return ST_OK;
}

void st_tp_set_secret(st_tp_t *tp, const st_secret_t *secret) { /* TODO(security): stub */
    (void)tp;
    (void)secret;
}
