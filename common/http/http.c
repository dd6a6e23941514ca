/* HTTP/1.1 serving on libuv + llhttp (Debian node-llhttp sources). One request at a time per
 * connection: llhttp is paused at each message end until the handler has ended its response, and
 * bytes that arrived behind it (pipelining) are kept and parsed afterwards. Parse state is copied
 * into a per-connection buffer with offsets (callbacks see transient slices). */
#include "strata/http.h"

#include <jansson.h>
#include <llhttp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <uv.h>

#define MAX_HEADERS 64

typedef struct route {
    char *method, *path;
    st_http_handler_fn fn;
    void *arg;
} route_t;

typedef struct conn conn_t;

struct st_http_server {
    uv_loop_t *loop;
    uv_tcp_t listener;
    uint16_t port;
    st_http_opts_t opts;
    llhttp_settings_t settings;
    route_t *routes;
    size_t n_routes;
    conn_t *conns;
    int open_handles, closing;
    void (*done)(void *);
    void *done_arg;
};

struct st_http_res {
    conn_t *conn; /* NULL once the connection is gone */
    int streaming, ended, head_sent;
    st_http_close_fn close_fn;
    void *close_arg;
};

typedef struct {
    size_t name_off, name_len, val_off, val_len;
} hdr_t;

struct conn {
    uv_tcp_t tcp;
    uv_timer_t idle;
    st_http_server_t *srv;
    conn_t *prev, *next;
    llhttp_t parser;
    char *buf; /* current request: url, header names/values, body, each NUL-terminated */
    size_t len, cap;
    size_t url_off, url_len, body_off, body_len;
    int in_body, in_value;
    hdr_t hdr[MAX_HEADERS];
    size_t n_hdr;
    size_t head_bytes;
    int err_status; /* set by a callback that aborts the parse */
    char *pending;  /* bytes after a paused message */
    size_t pending_len;
    st_http_res_t *res;
    int keep_alive, closing, handles, in_dispatch, need_resume, writes;
    int close_after_write;
};

typedef struct {
    uv_write_t req;
    conn_t *conn;
    size_t len;
    char data[];
} wr_t;

static const char *reason(int status) {
    switch (status) {
    case 200: return "OK";
    case 201: return "Created";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return status < 300 ? "OK" : status < 500 ? "Client Error" : "Server Error";
    }
}

/* ---- connection lifetime ---- */

static void server_maybe_done(st_http_server_t *s) {
    if (!s->closing || s->open_handles) return;
    for (size_t i = 0; i < s->n_routes; i++) {
        free(s->routes[i].method);
        free(s->routes[i].path);
    }
    free(s->routes);
    void (*done)(void *) = s->done;
    void *arg = s->done_arg;
    free(s);
    if (done) done(arg);
}

static void conn_handle_closed(uv_handle_t *h) {
    conn_t *c = h->data;
    if (--c->handles) return;
    st_http_server_t *s = c->srv;
    if (c->prev) c->prev->next = c->next; else s->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    free(c->buf);
    free(c->pending);
    free(c);
    s->open_handles--;
    server_maybe_done(s);
}

static void conn_close(conn_t *c) {
    if (c->closing) return;
    c->closing = 1;
    if (c->res) {
        st_http_res_t *r = c->res;
        r->conn = NULL;
        c->res = NULL;
        if (r->close_fn) r->close_fn(r, r->close_arg);
    }
    uv_close((uv_handle_t *)&c->tcp, conn_handle_closed);
    uv_close((uv_handle_t *)&c->idle, conn_handle_closed);
}

static void on_written(uv_write_t *req, int status) {
    wr_t *w = (wr_t *)req;
    conn_t *c = w->conn;
    free(w);
    c->writes--;
    if (status < 0 && status != UV_ECANCELED) conn_close(c);
    else if (c->close_after_write && !c->writes) conn_close(c);
}

static st_status_t conn_write(conn_t *c, const void *a, size_t an, const void *b, size_t bn, const void *d, size_t dn) {
    if (c->closing) return ST_ERR_PEER;
    wr_t *w = malloc(sizeof *w + an + bn + dn); /* HTTP is off the hot path */
    if (!w) return ST_FAIL(ST_ERR_NO_MEMORY, "http: cannot allocate a %zu-byte write", an + bn + dn);
    memcpy(w->data, a, an);
    if (bn) memcpy(w->data + an, b, bn);
    if (dn) memcpy(w->data + an + bn, d, dn);
    w->conn = c;
    w->len = an + bn + dn;
    uv_buf_t ub = uv_buf_init(w->data, (unsigned)w->len);
    int rc = uv_write(&w->req, (uv_stream_t *)&c->tcp, &ub, 1, on_written);
    if (rc) {
        free(w);
        conn_close(c);
        return ST_ERR_PEER;
    }
    c->writes++;
    return ST_OK;
}

static void on_idle_timeout(uv_timer_t *t) { conn_close(t->data); }

static void idle_arm(conn_t *c) {
    if (!c->closing && c->srv->opts.idle_timeout_ms)
        uv_timer_start(&c->idle, on_idle_timeout, c->srv->opts.idle_timeout_ms, 0);
}

/* ---- request parsing ---- */

static int buf_append(conn_t *c, const char *at, size_t n) {
    if (c->len + n + 1 > c->cap) {
        size_t cap = c->cap ? c->cap : 1024;
        while (cap < c->len + n + 1) cap *= 2;
        char *b = realloc(c->buf, cap);
        if (!b) return -1;
        c->buf = b;
        c->cap = cap;
    }
    memcpy(c->buf + c->len, at, n);
    c->len += n;
    return 0;
}

static int fail_with(llhttp_t *p, int status, const char *why) {
    conn_t *c = p->data;
    c->err_status = status;
    llhttp_set_error_reason(p, why);
    return HPE_USER;
}

static int head_add(llhttp_t *p, const char *at, size_t n) {
    conn_t *c = p->data;
    c->head_bytes += n;
    if (c->head_bytes > c->srv->opts.max_header) return fail_with(p, 431, "headers too large");
    if (buf_append(c, at, n)) return fail_with(p, 500, "out of memory");
    return 0;
}

static int terminate(conn_t *c) { return buf_append(c, "", 1); } /* keep the NUL in the buffer */

static int on_message_begin(llhttp_t *p) {
    conn_t *c = p->data;
    c->len = c->url_off = c->url_len = c->body_off = c->body_len = 0;
    c->n_hdr = c->head_bytes = 0;
    c->in_body = c->in_value = 0;
    uv_timer_stop(&c->idle);
    return 0;
}

static int on_url(llhttp_t *p, const char *at, size_t n) {
    conn_t *c = p->data;
    c->url_len += n;
    return head_add(p, at, n);
}
static int on_url_complete(llhttp_t *p) {
    conn_t *c = p->data;
    c->url_off = c->len - c->url_len;
    return terminate(c) ? fail_with(p, 500, "out of memory") : 0;
}

static int on_header_field(llhttp_t *p, const char *at, size_t n) {
    conn_t *c = p->data;
    if (!c->in_value && c->n_hdr < MAX_HEADERS && c->hdr[c->n_hdr].name_len == 0) c->hdr[c->n_hdr].name_off = c->len;
    if (c->n_hdr >= MAX_HEADERS) return fail_with(p, 431, "too many headers");
    c->hdr[c->n_hdr].name_len += n;
    return head_add(p, at, n);
}
static int on_header_field_complete(llhttp_t *p) {
    conn_t *c = p->data;
    c->in_value = 1;
    c->hdr[c->n_hdr].val_off = c->len + 1;
    c->hdr[c->n_hdr].val_len = 0;
    return terminate(c) ? fail_with(p, 500, "out of memory") : 0;
}
static int on_header_value(llhttp_t *p, const char *at, size_t n) {
    conn_t *c = p->data;
    c->hdr[c->n_hdr].val_len += n;
    return head_add(p, at, n);
}
static int on_header_value_complete(llhttp_t *p) {
    conn_t *c = p->data;
    c->in_value = 0;
    if (terminate(c)) return fail_with(p, 500, "out of memory");
    c->n_hdr++;
    if (c->n_hdr < MAX_HEADERS) c->hdr[c->n_hdr] = (hdr_t){0};
    return 0;
}

static int on_headers_complete(llhttp_t *p) {
    conn_t *c = p->data;
    if ((p->flags & F_CONTENT_LENGTH) && p->content_length > c->srv->opts.max_body)
        return fail_with(p, 413, "body too large");
    c->body_off = c->len;
    return 0;
}

static int on_body(llhttp_t *p, const char *at, size_t n) {
    conn_t *c = p->data;
    if (c->body_len + n > c->srv->opts.max_body) return fail_with(p, 413, "body too large");
    c->body_len += n;
    return buf_append(c, at, n) ? fail_with(p, 500, "out of memory") : 0;
}

static int on_message_complete(llhttp_t *p) {
    conn_t *c = p->data;
    if (terminate(c)) return fail_with(p, 500, "out of memory");
    c->keep_alive = llhttp_should_keep_alive(p);
    return HPE_PAUSED; /* one request at a time: resume after the response ends */
}

static void error_reply(conn_t *c, int status) {
    char msg[160];
    int n = snprintf(msg, sizeof msg,
                     "HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n%s\n",
                     status, reason(status), strlen(reason(status)) + 1, reason(status));
    uv_read_stop((uv_stream_t *)&c->tcp);
    c->close_after_write = 1;
    if (conn_write(c, msg, (size_t)n, NULL, 0, NULL, 0) == ST_OK && c->writes == 0) conn_close(c);
}

static void dispatch(conn_t *c);

/* Feed bytes; a completed message pauses the parser and is dispatched. */
static void feed(conn_t *c, const char *data, size_t n) {
    llhttp_errno_t e = llhttp_execute(&c->parser, data, n);
    if (e == HPE_OK) return;
    if (e == HPE_PAUSED) {
        const char *pos = llhttp_get_error_pos(&c->parser);
        size_t used = pos ? (size_t)(pos - data) : n;
        if (used < n) {
            char *rest = malloc(n - used);
            if (!rest) {
                error_reply(c, 500);
                return;
            }
            memcpy(rest, data + used, n - used);
            free(c->pending);
            c->pending = rest;
            c->pending_len = n - used;
        }
        dispatch(c);
        return;
    }
    int status = c->err_status ? c->err_status : 400;
    if (status >= 500) st_log_error("http: %s", llhttp_get_error_reason(&c->parser));
    else st_log_warn("http: bad request (%d): %s: %s", status, llhttp_errno_name(e), llhttp_get_error_reason(&c->parser));
    error_reply(c, status);
}

static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf) {
    static char slab[65536]; /* NOTE: one loop thread, and feed() copies what it keeps */
    (void)h;
    (void)hint;
    *buf = uv_buf_init(slab, sizeof slab);
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
    conn_t *c = s->data;
    if (nread < 0) {
        conn_close(c);
        return;
    }
    if (nread == 0 || c->closing) return;
    if (c->res) {
        /* NOTE: keep reading while a response is open, so a client that leaves is noticed (EOF →
           on_close); bytes behind the request wait in pending, bounded by one maximal request. */
        char *p = realloc(c->pending, c->pending_len + (size_t)nread);
        if (!p) {
            conn_close(c);
            return;
        }
        memcpy(p + c->pending_len, buf->base, (size_t)nread);
        c->pending = p;
        c->pending_len += (size_t)nread;
        if (c->pending_len > c->srv->opts.max_header + c->srv->opts.max_body) uv_read_stop(s);
        return;
    }
    feed(c, buf->base, (size_t)nread);
}

/* After a response ended: parse what was pipelined behind it, then read again. Iterative so that
 * handlers answering synchronously do not recurse. */
static void conn_resume(conn_t *c) {
    while (c->need_resume && !c->closing) {
        c->need_resume = 0;
        llhttp_resume(&c->parser);
        char *p = c->pending;
        size_t n = c->pending_len;
        c->pending = NULL;
        c->pending_len = 0;
        if (n) {
            c->in_dispatch = 1;
            feed(c, p, n);
            c->in_dispatch = 0;
            free(p);
            if (c->res || c->need_resume) continue; /* another request was dispatched */
        }
        if (!c->closing && !c->res) {
            uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read); /* no-op if still reading */
            idle_arm(c);
        }
    }
}

static void res_done(st_http_res_t *r) {
    conn_t *c = r->conn;
    r->ended = 1;
    free(r);
    if (!c) return;
    c->res = NULL;
    if (!c->keep_alive) {
        c->close_after_write = 1;
        if (!c->writes) conn_close(c);
        return;
    }
    c->need_resume = 1;
    if (!c->in_dispatch) conn_resume(c);
}

static void dispatch(conn_t *c) {
    st_http_server_t *s = c->srv;
    const char *names[MAX_HEADERS], *vals[MAX_HEADERS];
    for (size_t i = 0; i < c->n_hdr; i++) {
        names[i] = c->buf + c->hdr[i].name_off;
        vals[i] = c->buf + c->hdr[i].val_off;
    }
    char *url = c->buf + c->url_off;
    char *q = strchr(url, '?');
    if (q) *q++ = '\0';
    st_http_req_t req = {
        .method = llhttp_method_name((llhttp_method_t)llhttp_get_method(&c->parser)),
        .path = url,
        .query = q ? q : "",
        .body = c->buf + c->body_off,
        .body_len = c->body_len,
        .n_headers = c->n_hdr,
        .header_names = names,
        .header_values = vals,
    };
    if (!c->body_len) req.body = "";
    st_http_res_t *r = calloc(1, sizeof *r);
    if (!r) {
        error_reply(c, 500);
        return;
    }
    r->conn = c;
    c->res = r;
    const route_t *hit = NULL;
    int path_seen = 0;
    for (size_t i = 0; i < s->n_routes && !hit; i++) {
        if (strcmp(s->routes[i].path, req.path) != 0) continue;
        path_seen = 1;
        if (strcmp(s->routes[i].method, req.method) == 0) hit = &s->routes[i];
    }
    int nested = c->in_dispatch;
    c->in_dispatch = 1;
    if (hit) hit->fn(&req, r, hit->arg);
    else if (path_seen) st_http_res_json(r, 405, "{s:s}", "error", "method not allowed");
    else st_http_res_json(r, 404, "{s:s, s:s}", "error", "not found", "path", req.path);
    c->in_dispatch = nested;
    if (!nested && c->need_resume) conn_resume(c);
}

static void on_connection(uv_stream_t *l, int status) {
    st_http_server_t *s = l->data;
    if (status < 0) {
        st_log_warn("http: accept: %s", uv_strerror(status));
        return;
    }
    conn_t *c = calloc(1, sizeof *c);
    if (!c) {
        st_log_error("http: out of memory accepting a connection");
        return;
    }
    c->srv = s;
    uv_tcp_init(s->loop, &c->tcp);
    uv_timer_init(s->loop, &c->idle);
    c->tcp.data = c->idle.data = c;
    c->handles = 2;
    s->open_handles++;
    c->next = s->conns;
    if (s->conns) s->conns->prev = c;
    s->conns = c;
    if (uv_accept(l, (uv_stream_t *)&c->tcp) != 0) {
        conn_close(c);
        return;
    }
    llhttp_init(&c->parser, HTTP_REQUEST, &s->settings);
    c->parser.data = c;
    uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
    idle_arm(c);
}

/* ---- public: server ---- */

static void listener_closed(uv_handle_t *h) {
    st_http_server_t *s = h->data;
    s->open_handles--;
    server_maybe_done(s);
}

st_status_t st_http_server_create(uv_loop_t *loop, const char *host, uint16_t port, const st_http_opts_t *opts,
                                  st_http_server_t **out) {
    st_http_server_t *s = calloc(1, sizeof *s);
    if (!s) return ST_FAIL(ST_ERR_NO_MEMORY, "http: cannot allocate server");
    s->loop = loop;
    s->opts = (st_http_opts_t){.max_body = 1u << 20, .max_header = 16u << 10, .idle_timeout_ms = 30000};
    if (opts) {
        if (opts->max_body) s->opts.max_body = opts->max_body;
        if (opts->max_header) s->opts.max_header = opts->max_header;
        s->opts.idle_timeout_ms = opts->idle_timeout_ms;
    }
    llhttp_settings_init(&s->settings);
    s->settings.on_message_begin = on_message_begin;
    s->settings.on_url = on_url;
    s->settings.on_url_complete = on_url_complete;
    s->settings.on_header_field = on_header_field;
    s->settings.on_header_field_complete = on_header_field_complete;
    s->settings.on_header_value = on_header_value;
    s->settings.on_header_value_complete = on_header_value_complete;
    s->settings.on_headers_complete = on_headers_complete;
    s->settings.on_body = on_body;
    s->settings.on_message_complete = on_message_complete;

    struct sockaddr_storage sa;
    int rc = uv_ip4_addr(host, port, (struct sockaddr_in *)&sa);
    if (rc) rc = uv_ip6_addr(host, port, (struct sockaddr_in6 *)&sa);
    if (rc) {
        free(s);
        return ST_FAIL(ST_ERR_INVALID_ARG, "http: bad listen address %s", host);
    }
    uv_tcp_init(loop, &s->listener);
    s->listener.data = s;
    s->open_handles = 1;
    rc = uv_tcp_bind(&s->listener, (struct sockaddr *)&sa, 0);
    if (!rc) rc = uv_listen((uv_stream_t *)&s->listener, 128, on_connection);
    if (rc) {
        st_status_t st = ST_FAIL(ST_ERR_IO, "http: cannot listen on %s:%u: %s", host, port, uv_strerror(rc));
        s->closing = 1; /* s is freed once the loop has closed the handle */
        uv_close((uv_handle_t *)&s->listener, listener_closed);
        return st;
    }
    struct sockaddr_storage bound;
    int bl = sizeof bound;
    uv_tcp_getsockname(&s->listener, (struct sockaddr *)&bound, &bl);
    s->port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                : ((struct sockaddr_in *)&bound)->sin_port);
    *out = s;
    return ST_OK;
}

uint16_t st_http_server_port(const st_http_server_t *s) { return s->port; }

st_status_t st_http_route(st_http_server_t *s, const char *method, const char *path, st_http_handler_fn fn,
                          void *arg) {
    route_t *r = realloc(s->routes, (s->n_routes + 1) * sizeof *r);
    if (!r) return ST_FAIL(ST_ERR_NO_MEMORY, "http: cannot add route %s %s", method, path);
    s->routes = r;
    char *m = strdup(method), *p = strdup(path);
    if (!m || !p) {
        free(m);
        free(p);
        return ST_FAIL(ST_ERR_NO_MEMORY, "http: cannot add route %s %s", method, path);
    }
    r[s->n_routes++] = (route_t){m, p, fn, arg};
    return ST_OK;
}

void st_http_server_close(st_http_server_t *s, void (*done)(void *), void *arg) {
    s->closing = 1;
    s->done = done;
    s->done_arg = arg;
    for (conn_t *c = s->conns; c; c = c->next) conn_close(c);
    uv_close((uv_handle_t *)&s->listener, listener_closed);
}

const char *st_http_req_header(const st_http_req_t *req, const char *name) {
    for (size_t i = 0; i < req->n_headers; i++)
        if (strcasecmp(req->header_names[i], name) == 0) return req->header_values[i];
    return NULL;
}

/* ---- public: responses ---- */

static st_status_t send_head(st_http_res_t *r, int status, const char *ctype, const char *framing) {
    conn_t *c = r->conn;
    char h[512];
    int n = snprintf(h, sizeof h, "HTTP/1.1 %d %s\r\nContent-Type: %s\r\n%s\r\nConnection: %s\r\n\r\n", status,
                     reason(status), ctype ? ctype : "text/plain", framing, c->keep_alive ? "keep-alive" : "close");
    if (n <= 0 || (size_t)n >= sizeof h) return ST_FAIL(ST_ERR_INVALID_ARG, "http: response head too long");
    r->head_sent = 1;
    return conn_write(c, h, (size_t)n, NULL, 0, NULL, 0);
}

void st_http_res_send(st_http_res_t *r, int status, const char *ctype, const void *body, size_t len) {
    if (r->ended || r->streaming) {
        st_log_error("http: response ended twice or already streaming");
        return;
    }
    if (r->conn) {
        char framing[64];
        snprintf(framing, sizeof framing, "Content-Length: %zu", len);
        conn_t *c = r->conn;
        char h[512];
        int n = snprintf(h, sizeof h, "HTTP/1.1 %d %s\r\nContent-Type: %s\r\n%s\r\nConnection: %s\r\n\r\n", status,
                         reason(status), ctype ? ctype : "text/plain", framing, c->keep_alive ? "keep-alive" : "close");
        conn_write(c, h, (size_t)n, body, len, NULL, 0);
    }
    res_done(r);
}

void st_http_res_json(st_http_res_t *r, int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    json_error_t err;
    json_t *j = json_vpack_ex(&err, 0, fmt, ap);
    va_end(ap);
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!s) {
        st_log_error("http: JSON reply \"%s\" failed: %s", fmt, j ? "dump" : err.text);
        static const char e[] = "{\"error\":\"internal\"}\n";
        st_http_res_send(r, 500, "application/json", e, sizeof e - 1);
        return;
    }
    size_t n = strlen(s);
    s[n] = '\0';
    char *body = realloc(s, n + 2);
    if (body) {
        body[n] = '\n';
        st_http_res_send(r, status, "application/json", body, n + 1);
        free(body);
    } else {
        st_http_res_send(r, status, "application/json", s, n);
        free(s);
    }
}

st_status_t st_http_res_stream_begin(st_http_res_t *r, int status, const char *ctype) {
    if (r->ended || r->streaming) return ST_FAIL(ST_ERR_INVALID_ARG, "http: stream begun twice or after end");
    r->streaming = 1;
    if (!r->conn) return ST_ERR_PEER;
    return send_head(r, status, ctype, "Transfer-Encoding: chunked\r\nCache-Control: no-cache");
}

st_status_t st_http_res_stream_write(st_http_res_t *r, const void *data, size_t len) {
    if (!r->streaming || r->ended) return ST_FAIL(ST_ERR_INVALID_ARG, "http: stream write outside a stream");
    if (!r->conn) return ST_ERR_PEER;
    if (!len) return ST_OK; /* an empty chunk would end the stream */
    char pre[24];
    int n = snprintf(pre, sizeof pre, "%zx\r\n", len);
    return conn_write(r->conn, pre, (size_t)n, data, len, "\r\n", 2);
}

st_status_t st_http_res_sse(st_http_res_t *r, const char *event, const char *data) {
    if (!r->streaming) {
        st_status_t st = st_http_res_stream_begin(r, 200, "text/event-stream");
        if (st) return st;
    }
    size_t dl = strlen(data), el = event ? strlen(event) : 0, lines = 1;
    for (size_t i = 0; i < dl; i++) lines += data[i] == '\n';
    size_t cap = el + 8 + dl + lines * 7 + 2;
    char *b = malloc(cap);
    if (!b) return ST_FAIL(ST_ERR_NO_MEMORY, "http: cannot format an event of %zu bytes", dl);
    size_t n = 0;
    if (event) n += (size_t)sprintf(b, "event: %s\n", event);
    const char *p = data;
    for (;;) {
        const char *nl = strchr(p, '\n');
        size_t ll = nl ? (size_t)(nl - p) : strlen(p);
        memcpy(b + n, "data: ", 6);
        n += 6;
        memcpy(b + n, p, ll);
        n += ll;
        b[n++] = '\n';
        if (!nl) break;
        p = nl + 1;
    }
    b[n++] = '\n';
    st_status_t st = st_http_res_stream_write(r, b, n);
    free(b);
    return st;
}

void st_http_res_stream_end(st_http_res_t *r) {
    if (r->ended || !r->streaming) {
        st_log_error("http: stream end without a stream");
        if (!r->ended && !r->streaming) st_http_res_send(r, 500, NULL, "", 0);
        return;
    }
    if (r->conn) conn_write(r->conn, "0\r\n\r\n", 5, NULL, 0, NULL, 0);
    res_done(r);
}

void st_http_res_on_close(st_http_res_t *r, st_http_close_fn fn, void *arg) {
    r->close_fn = fn;
    r->close_arg = arg;
}

int st_http_res_is_open(const st_http_res_t *r) { return r->conn != NULL && !r->conn->closing; }
