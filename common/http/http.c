/* HTTP/1.1 serving on libuv + llhttp (Debian node-llhttp sources), optionally over TLS (OpenSSL with
 * memory BIOs over the libuv stream). Not a general web server: one request at a time per
 * connection, no HTTP/2, no upgrade.
 *
 * Input: each connection reads into one buffer of IN_SLACK + max_header bytes; [in_off, in_len) is
 * not parsed yet. llhttp is paused at each message end until the handler has ended its response;
 * the bytes behind it stay where they are (only in_off moves) and the buffer is compacted only when
 * that moves fewer bytes than it frees. While it is full, reading stops. At most MSGS_PER_TICK
 * messages are parsed per loop iteration; an idle handle continues in the next one. Parse state
 * (url, headers, body) is copied into a per-request buffer with offsets (callbacks see slices).
 *
 * One deadline timer per connection, by phase: idle between requests, a request's headers from its
 * first byte, its body from the end of its headers, the TLS handshake from accept, and the linger
 * after the last response (the client's remaining input is drained so that it reads the reply
 * before the close). */
#include "strata/http.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <llhttp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <uv.h>

#include "http_fuzz.h"

#define MAX_HEADERS 64
#define IN_SLACK (64u << 10)  /* input buffer: IN_SLACK + max_header bytes per connection */
#define MIN_ROOM 4096         /* below this much free space at its end the input buffer may compact */
#define MSGS_PER_TICK 16      /* pipelined requests parsed per connection per loop iteration */
#define WQ_PAUSE (1u << 20)   /* parse no new request while this many response bytes are unsent */
#define WQ_LIMIT (64u << 20)  /* close a client that leaves this many response bytes unread */
#define LINGER_MS 1000        /* after the last response: drain the client's input this long */
#define MAX_REJECTING 64      /* connections being turned away with 503 at once; beyond: closed */
#define REQ_KEEP (64u << 10)  /* request buffers larger than this are freed between requests */
#define SLAB (64u << 10)      /* read buffer for TLS records and drained input */

enum { PH_IDLE, PH_HANDSHAKE, PH_HEAD, PH_BODY, PH_RESP, PH_DRAIN };

#define REJECT_BODY \
    "{\"error\":{\"message\":\"Server busy: too many connections, retry shortly\",\"type\":\"server_error\"," \
    "\"param\":null,\"code\":null}}\n"
#define REJECT_HEAD(len)                                                                                              \
    "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: " #len "\r\n"            \
    "Retry-After: 1\r\nConnection: close\r\n\r\n"
#define REJECT_BODY_LEN 120 /* checked against sizeof REJECT_BODY below */
#define REJECT_HEAD_(len) REJECT_HEAD(len)
static const char REJECT_503[] = REJECT_HEAD_(REJECT_BODY_LEN) REJECT_BODY;
_Static_assert(sizeof REJECT_BODY - 1 == REJECT_BODY_LEN, "REJECT_BODY_LEN");

typedef struct route {
    char *method, *path;
    st_http_handler_fn fn;
    void *arg;
} route_t;

typedef struct conn conn_t;

struct st_http_server {
    uv_loop_t *loop;
    uv_tcp_t listener;
    int listening;
    uint16_t port;
    st_http_opts_t opts;
    size_t in_cap;
    char *slab;
    SSL_CTX *tls;
    llhttp_settings_t settings;
    route_t *routes;
    size_t n_routes;
    conn_t *conns;
    size_t n_conns, n_rejecting;
    int open_handles, closing;
    st_http_stats_t st;
    void (*done)(void *);
    void *done_arg;
};

struct st_http_res {
    conn_t *conn; /* NULL once the connection is gone */
    int streaming, ended;
    st_http_close_fn close_fn;
    void *close_arg;
    /* the access log's line (opts.access_log) */
    st_http_server_t *srv;
    int status;
    size_t bytes;
    double t0;
    char peer[64], line[200];
};

typedef struct {
    size_t name_off, name_len, val_off, val_len;
} hdr_t;

struct conn {
    uv_tcp_t tcp;
    uv_timer_t timer; /* the deadline of the current phase */
    uv_idle_t kick;   /* more to parse next loop iteration, or a deferred close */
    uv_shutdown_t shut;
    st_http_server_t *srv;
    conn_t *prev, *next;
    llhttp_t parser;
    int phase;
    char *in; /* raw input (plaintext under TLS); [in_off, in_len) not parsed yet; in_cap bytes */
    size_t in_off, in_len;
    char *buf; /* current request: url, header names/values, body, each NUL-terminated */
    size_t len, cap;
    size_t url_off, url_len, body_off, body_len;
    int in_name;
    hdr_t hdr[MAX_HEADERS];
    size_t n_hdr, head_bytes;
    int err_status; /* set by a callback that aborts the parse */
    st_http_res_t *res;
    int keep_alive, closing, handles, pumping, reading, eof, reject, doomed, shut_sent, wq_blocked;
    int writes;
    size_t wq_bytes;
    SSL *ssl; /* owns rbio (ciphertext in) and wbio (ciphertext out) */
    BIO *rbio, *wbio;
    st_http_sink_fn sink; /* fake connection (fuzzing): no socket, output goes here */
    void *sink_arg;
    int *gone;
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
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
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

static void conn_pump(conn_t *c);
static void conn_finish(conn_t *c);
static void dispatch(conn_t *c);

/* ---- connection lifetime ---- */

static void server_maybe_done(st_http_server_t *s) {
    if (!s->closing || s->open_handles) return;
    for (size_t i = 0; i < s->n_routes; i++) {
        free(s->routes[i].method);
        free(s->routes[i].path);
    }
    free(s->routes);
    free(s->slab);
    SSL_CTX_free(s->tls);
    void (*done)(void *) = s->done;
    void *arg = s->done_arg;
    free(s);
    if (done) done(arg);
}

static void conn_free(conn_t *c) {
    st_http_server_t *s = c->srv;
    if (c->prev) c->prev->next = c->next;
    else s->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    if (c->reject) s->n_rejecting--;
    else s->n_conns--;
    if (c->gone) *c->gone = 1;
    SSL_free(c->ssl);
    free(c->in);
    free(c->buf);
    free(c);
    s->open_handles--;
    server_maybe_done(s);
}

static void conn_handle_closed(uv_handle_t *h) {
    conn_t *c = h->data;
    if (--c->handles == 0) conn_free(c);
}

static void conn_close(conn_t *c) {
    if (c->closing) return;
    c->closing = 1;
    c->reading = 0;
    if (c->res) {
        st_http_res_t *r = c->res;
        r->conn = NULL;
        c->res = NULL;
        if (r->close_fn) r->close_fn(r, r->close_arg);
    }
    if (!c->sink) uv_close((uv_handle_t *)&c->tcp, conn_handle_closed);
    uv_close((uv_handle_t *)&c->timer, conn_handle_closed);
    uv_close((uv_handle_t *)&c->kick, conn_handle_closed);
}

static void on_kick(uv_idle_t *h) {
    conn_t *c = h->data;
    uv_idle_stop(h);
    if (c->doomed) conn_close(c);
    else conn_pump(c);
}

static void kick(conn_t *c) {
    if (!c->closing) uv_idle_start(&c->kick, on_kick);
}

/* Close soon, from the loop rather than from inside a caller's write (its on_close would re-enter). */
static void conn_doom(conn_t *c) {
    c->doomed = 1;
    kick(c);
}

static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf);
static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf);

static void set_reading(conn_t *c, int on) {
    if (c->closing || c->reading == on) return;
    c->reading = on;
    if (c->sink) return;
    if (on) uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
    else uv_read_stop((uv_stream_t *)&c->tcp);
}

static void on_deadline(uv_timer_t *t);

static void timer_arm(conn_t *c, uint32_t ms) {
    if (!c->closing) uv_timer_start(&c->timer, on_deadline, ms, 0);
}

/* ---- output ---- */

static void conn_linger(conn_t *c);

static void on_written(uv_write_t *req, int status) {
    wr_t *w = (wr_t *)req;
    conn_t *c = w->conn;
    c->writes--;
    c->wq_bytes -= w->len;
    free(w);
    if (status < 0) {
        conn_close(c);
        return;
    }
    if (c->closing) return;
    if (c->phase == PH_DRAIN) {
        if (!c->writes) conn_linger(c);
    } else if (c->wq_blocked && c->wq_bytes <= WQ_PAUSE / 2) {
        c->wq_blocked = 0;
        kick(c);
    }
}

static wr_t *wr_new(size_t n) {
    wr_t *w = malloc(sizeof *w + n); /* HTTP is off the hot path */
    if (!w) st_log_every(ST_LOG_ERROR, 10, "http: cannot allocate a %zu-byte write", n);
    return w;
}

/* Hands w (ciphertext under TLS) to the socket; takes ownership. */
static st_status_t raw_send(conn_t *c, wr_t *w) {
    if (c->sink) {
        c->sink(c->sink_arg, w->data, w->len);
        free(w);
        return ST_OK;
    }
    w->conn = c;
    uv_buf_t ub = uv_buf_init(w->data, (unsigned)w->len);
    if (uv_write(&w->req, (uv_stream_t *)&c->tcp, &ub, 1, on_written) != 0) {
        free(w);
        conn_doom(c);
        return ST_ERR_PEER;
    }
    c->writes++;
    c->wq_bytes += w->len;
    if (c->wq_bytes > WQ_LIMIT) {
        st_log_every(ST_LOG_WARN, 10, "http: a client left %zu response bytes unread: closing it", c->wq_bytes);
        conn_doom(c);
    }
    return ST_OK;
}

static st_status_t tls_flush(conn_t *c) {
    size_t n;
    while ((n = BIO_ctrl_pending(c->wbio)) > 0) {
        wr_t *w = wr_new(n);
        if (!w) {
            conn_doom(c);
            return ST_ERR_NO_MEMORY;
        }
        int r = BIO_read(c->wbio, w->data, (int)ST_MIN(n, (size_t)INT_MAX));
        if (r <= 0) {
            free(w);
            conn_doom(c);
            return ST_ERR_INTERNAL;
        }
        w->len = (size_t)r;
        st_status_t st = raw_send(c, w);
        if (st) return st;
    }
    return ST_OK;
}

/* One write of up to three pieces (head, body, trailer), in order. */
static st_status_t conn_write(conn_t *c, const void *a, size_t an, const void *b, size_t bn, const void *d, size_t dn) {
    if (c->closing || c->doomed) return ST_ERR_PEER;
    size_t n = an + bn + dn;
    if (!n) return ST_OK;
    wr_t *w = wr_new(n);
    if (!w) return ST_ERR_NO_MEMORY;
    if (an) memcpy(w->data, a, an);
    if (bn) memcpy(w->data + an, b, bn);
    if (dn) memcpy(w->data + an + bn, d, dn);
    w->len = n;
    if (!c->ssl) return raw_send(c, w);
    ERR_clear_error();
    int ok = n <= INT_MAX && SSL_write(c->ssl, w->data, (int)n) == (int)n; /* memory BIO: all or error */
    free(w);
    if (!ok) {
        st_log_debug("http: TLS write failed");
        conn_doom(c);
        return ST_ERR_PEER;
    }
    return tls_flush(c);
}

static char *error_json(int status, const char *msg, size_t *len) {
    json_t *j = json_pack("{s:{s:s, s:s, s:n, s:n}}", "error", "message", msg, "type",
                          status >= 500 ? "server_error" : "invalid_request_error", "param", "code");
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!s) return NULL;
    size_t n = strlen(s);
    char *b = realloc(s, n + 2);
    if (!b) {
        free(s);
        return NULL;
    }
    b[n] = '\n';
    b[n + 1] = '\0';
    *len = n + 1;
    return b;
}

/* A reply from the server itself (bad request, timeout): JSON error, Connection: close, then drain
 * and close. */
static void error_reply(conn_t *c, int status, const char *msg) {
    size_t bl = 0;
    char *body = error_json(status, msg, &bl);
    static const char fallback[] =
        "{\"error\":{\"message\":\"error\",\"type\":\"server_error\",\"param\":null,\"code\":null}}\n";
    char head[256];
    int n =
        snprintf(head, sizeof head,
                 "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n",
                 status, reason(status), body ? bl : sizeof fallback - 1);
    conn_write(c, head, (size_t)n, body ? body : fallback, body ? bl : sizeof fallback - 1, NULL, 0);
    free(body);
    conn_finish(c);
}

/* ---- closing gracefully: send what is queued, half-close, drain the client's input, close ---- */

static void on_shutdown(uv_shutdown_t *r, int status) {
    if (status < 0) conn_close(r->data);
}

static void conn_linger(conn_t *c) {
    if (c->closing || c->shut_sent) return;
    c->shut_sent = 1;
    if (c->sink || c->eof || c->doomed || uv_shutdown(&c->shut, (uv_stream_t *)&c->tcp, on_shutdown) != 0) {
        conn_close(c);
        return;
    }
    timer_arm(c, LINGER_MS);
    set_reading(c, 1);
}

/* No more requests on this connection. */
static void conn_finish(conn_t *c) {
    if (c->closing || c->phase == PH_DRAIN) return;
    c->phase = PH_DRAIN;
    c->in_off = c->in_len = 0;
    uv_idle_stop(&c->kick);
    if (c->doomed) kick(c);
    timer_arm(c, c->srv->opts.idle_timeout_ms); /* bound on the client reading what is queued */
    if (c->ssl && SSL_is_init_finished(c->ssl)) {
        ERR_clear_error();
        SSL_shutdown(c->ssl); /* close_notify */
        tls_flush(c);
    }
    if (!c->writes) conn_linger(c);
}

/* ---- input ---- */

static void note_buffered(conn_t *c) {
    size_t held = c->in_len - c->in_off + (c->rbio ? BIO_ctrl_pending(c->rbio) : 0);
    if (held > c->srv->st.buffered_high) c->srv->st.buffered_high = held;
}

/* Free bytes at the end of the input buffer; compacts first when that moves fewer bytes than it
 * frees, so each input byte is moved O(1) times. */
static size_t in_room(conn_t *c) {
    size_t cap = c->srv->in_cap;
    if (!c->in && !(c->in = malloc(cap))) return 0;
    if (c->in_off == c->in_len) {
        c->in_off = c->in_len = 0;
    } else if (cap - c->in_len < MIN_ROOM && c->in_off >= c->in_len - c->in_off) {
        memmove(c->in, c->in + c->in_off, c->in_len - c->in_off);
        c->in_len -= c->in_off;
        c->in_off = 0;
    }
    return cap - c->in_len;
}

static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf) {
    conn_t *c = h->data;
    if (c->ssl || c->reject || c->phase == PH_DRAIN) {
        /* NOTE: consumed at once (into the TLS read BIO, or dropped); one loop thread per server */
        *buf = uv_buf_init(c->srv->slab, SLAB);
        return;
    }
    size_t room = in_room(c);
    *buf = uv_buf_init(room ? c->in + c->in_len : NULL, (unsigned)room);
}

/* Pulls decrypted bytes into the input buffer while it has room; advances the handshake. 0, or -1
 * when the connection is being closed. */
static int tls_pull(conn_t *c) {
    size_t room;
    while ((room = in_room(c)) > 0) {
        ERR_clear_error();
        int n = SSL_read(c->ssl, c->in + c->in_len, (int)ST_MIN(room, (size_t)INT_MAX));
        if (n > 0) {
            c->in_len += (size_t)n;
            continue;
        }
        int e = SSL_get_error(c->ssl, n);
        if (e == SSL_ERROR_WANT_READ) break;
        if (e == SSL_ERROR_ZERO_RETURN) { /* close_notify: the client's EOF */
            c->eof = 1;
            break;
        }
        char why[160];
        ERR_error_string_n(ERR_peek_last_error(), why, sizeof why);
        st_log_debug("http: TLS: %s", why);
        tls_flush(c); /* the alert, if any */
        conn_close(c);
        return -1;
    }
    if (tls_flush(c)) return -1; /* handshake messages */
    if (c->phase == PH_HANDSHAKE && SSL_is_init_finished(c->ssl)) {
        c->phase = PH_IDLE;
        timer_arm(c, c->srv->opts.idle_timeout_ms);
    }
    return 0;
}

static void reject_reply(conn_t *c) {
    conn_write(c, REJECT_503, sizeof REJECT_503 - 1, NULL, 0, NULL, 0);
    conn_finish(c);
}

/* Decide reading and closing after any change. */
static void conn_settle(conn_t *c) {
    if (c->closing) return;
    if (c->eof && c->phase != PH_DRAIN) {
        if (c->res) { /* the client left while its response is pending */
            conn_close(c);
            return;
        }
        if (c->in_off == c->in_len) { /* all answered: send what is queued, then close */
            conn_finish(c);
            return;
        }
    }
    if (c->phase == PH_IDLE && c->in && c->in_off == c->in_len) { /* hold no buffer between requests */
        free(c->in);
        c->in = NULL;
        c->in_off = c->in_len = 0;
    }
    /* NOTE: read while there is room, even with a response pending, so that a client leaving is
       noticed (EOF → on_close); stop when the buffer is full (under TLS: its plaintext) */
    int want = !c->eof && (c->phase == PH_DRAIN || c->reject || !c->in || in_room(c) > 0);
    if (want && c->ssl && BIO_ctrl_pending(c->rbio) >= SLAB) want = 0; /* belt and braces */
    set_reading(c, want);
}

/* Parses what is buffered: dispatches each complete request, one at a time. */
static void conn_pump(conn_t *c) {
    if (c->pumping) return; /* a handler ended its response synchronously: the loop below goes on */
    c->pumping = 1;
    int msgs = 0;
    while (!c->closing && !c->doomed && c->phase != PH_DRAIN && !c->reject) {
        /* NOTE: decrypt even while a response is pending, so that the plaintext buffer's cap is
           what stops reading and ciphertext cannot pile up in the read BIO */
        if (c->ssl && tls_pull(c) != 0) break;
        if (c->res || c->in_off == c->in_len) break;
        if (c->wq_bytes > WQ_PAUSE) { /* the client is not reading its responses: wait */
            c->wq_blocked = 1;
            break;
        }
        if (msgs == MSGS_PER_TICK) { /* let the loop breathe; continue next iteration */
            kick(c);
            break;
        }
        if (llhttp_get_errno(&c->parser) == HPE_PAUSED) llhttp_resume(&c->parser);
        const char *p = c->in + c->in_off;
        llhttp_errno_t e = llhttp_execute(&c->parser, p, c->in_len - c->in_off);
        if (e == HPE_OK) {
            c->in_off = c->in_len;
        } else if (e == HPE_PAUSED) {
            c->in_off += (size_t)(llhttp_get_error_pos(&c->parser) - p);
            msgs++;
            dispatch(c);
        } else {
            int status = c->err_status ? c->err_status : 400;
            const char *why = llhttp_get_error_reason(&c->parser);
            char msg[200];
            if (status >= 500) st_log_every(ST_LOG_ERROR, 10, "http: %s", why ? why : "internal error");
            else st_log_debug("http: bad request (%d): %s: %s", status, llhttp_errno_name(e), why ? why : "");
            snprintf(msg, sizeof msg, "%s: %s", reason(status), why ? why : "malformed request");
            error_reply(c, status, msg);
        }
    }
    note_buffered(c);
    c->pumping = 0;
    conn_settle(c);
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
    conn_t *c = st->data;
    if (c->closing) return;
    if (nread == UV_ENOBUFS) { /* no room: wait for the parser */
        set_reading(c, 0);
        return;
    }
    if (nread < 0) {
        c->reading = 0;
        if (nread != UV_EOF || c->res) { /* an error, or the client left while its response is pending */
            conn_close(c);
            return;
        }
        uv_read_stop(st);
        c->eof = 1;
        if (c->phase == PH_DRAIN || c->reject) { /* closing already: once what is queued is written */
            if (c->phase != PH_DRAIN || !c->writes) conn_close(c);
            return;
        }
        conn_pump(c);
        return;
    }
    if (nread == 0 || c->phase == PH_DRAIN) return;
    if (!c->ssl) {
        if (c->reject) return;
        c->in_len += (size_t)nread; /* on_alloc pointed the read at the input buffer */
        conn_pump(c);
        return;
    }
    if (BIO_write(c->rbio, buf->base, (int)nread) != (int)nread) {
        conn_close(c);
        return;
    }
    if (!c->reject) {
        conn_pump(c);
        return;
    }
    ERR_clear_error(); /* turned away at the cap: finish the handshake to say so */
    int r = SSL_do_handshake(c->ssl);
    if (tls_flush(c)) return;
    if (r == 1) reject_reply(c);
    else if (SSL_get_error(c->ssl, r) != SSL_ERROR_WANT_READ) conn_close(c);
}

static void on_deadline(uv_timer_t *t) {
    conn_t *c = t->data;
    st_http_server_t *s = c->srv;
    switch (c->phase) {
    case PH_HEAD:
    case PH_BODY:
        s->st.timed_out++;
        st_log_debug("http: request %s not received in time: 408", c->phase == PH_HEAD ? "headers" : "body");
        error_reply(c, 408, c->phase == PH_HEAD ? "Request headers not received in time"
                                                : "Request body not received in time");
        break;
    case PH_HANDSHAKE:
        if (!c->reject) s->st.timed_out++;
        st_log_debug("http: TLS handshake not completed in time");
        conn_close(c);
        break;
    case PH_RESP: break; /* not armed: the handler owns the pace of its response */
    default: conn_close(c); /* idle between requests, or lingering */
    }
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
    if (c->cap > REQ_KEEP) { /* do not hold a large body's buffer between requests */
        free(c->buf);
        c->buf = NULL;
        c->cap = 0;
    }
    c->len = c->url_off = c->url_len = c->body_off = c->body_len = 0;
    c->n_hdr = c->head_bytes = 0;
    c->in_name = 0;
    c->err_status = 0;
    c->phase = PH_HEAD;
    timer_arm(c, c->srv->opts.header_timeout_ms); /* counted from the request's first byte */
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
    for (size_t i = 0; i < c->url_len; i++) {
        unsigned char ch = (unsigned char)c->buf[c->url_off + i];
        if (ch < 0x21 || ch > 0x7e) return fail_with(p, 400, "request target holds a byte outside printable ASCII");
    }
    return terminate(c) ? fail_with(p, 500, "out of memory") : 0;
}

static int on_header_field(llhttp_t *p, const char *at, size_t n) {
    conn_t *c = p->data;
    if (!c->in_name) { /* a new header */
        if (c->n_hdr >= MAX_HEADERS) return fail_with(p, 431, "too many headers");
        c->hdr[c->n_hdr] = (hdr_t){.name_off = c->len};
        c->in_name = 1;
    }
    c->hdr[c->n_hdr].name_len += n;
    return head_add(p, at, n);
}
static int on_header_field_complete(llhttp_t *p) {
    conn_t *c = p->data;
    if (c->n_hdr >= MAX_HEADERS) return fail_with(p, 431, "too many headers");
    if (!c->in_name) c->hdr[c->n_hdr] = (hdr_t){.name_off = c->len}; /* empty name */
    c->in_name = 0;
    if (terminate(c)) return fail_with(p, 500, "out of memory");
    c->hdr[c->n_hdr].val_off = c->len;
    c->hdr[c->n_hdr].val_len = 0;
    return 0;
}
static int on_header_value(llhttp_t *p, const char *at, size_t n) {
    conn_t *c = p->data;
    c->hdr[c->n_hdr].val_len += n;
    return head_add(p, at, n);
}
static int on_header_value_complete(llhttp_t *p) {
    conn_t *c = p->data;
    if (terminate(c)) return fail_with(p, 500, "out of memory");
    c->n_hdr++;
    return 0;
}

static int on_headers_complete(llhttp_t *p) {
    conn_t *c = p->data;
    p->upgrade = 0; /* no protocol switch (Upgrade, CONNECT): served as a plain request */
    if ((p->flags & F_CONTENT_LENGTH) && p->content_length > c->srv->opts.max_body)
        return fail_with(p, 413, "body too large");
    c->body_off = c->len;
    c->phase = PH_BODY;
    timer_arm(c, c->srv->opts.body_timeout_ms);
    if ((p->flags & F_CHUNKED) || p->content_length > 0) { /* curl waits a second for this before a body */
        for (size_t i = 0; i < c->n_hdr; i++)
            if (!strcasecmp(c->buf + c->hdr[i].name_off, "expect") &&
                !strcasecmp(c->buf + c->hdr[i].val_off, "100-continue")) {
                static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
                conn_write(c, cont, sizeof cont - 1, NULL, 0, NULL, 0);
                break;
            }
    }
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
    c->phase = PH_RESP;
    uv_timer_stop(&c->timer);
    return HPE_PAUSED; /* one request at a time: resume after the response ends */
}

/* ---- responses ---- */

static void res_done(st_http_res_t *r) {
    conn_t *c = r->conn;
    r->ended = 1;
    if (r->srv && r->srv->opts.access_log) /* status 0: the client left before any answer */
        st_log_info("access: %s \"%s\" %d %zu %.3f s%s", r->peer, r->line, r->status, r->bytes, st_time_sec() - r->t0,
                    c ? "" : " (client gone)");
    free(r);
    if (!c) return;
    c->res = NULL;
    if (c->closing) return;
    if (!c->keep_alive) {
        conn_finish(c);
        return;
    }
    c->phase = PH_IDLE;
    timer_arm(c, c->srv->opts.idle_timeout_ms);
    conn_pump(c); /* what was pipelined behind it */
}

static void res_send_ex(st_http_res_t *r, int status, const char *ctype, const char *extra, const void *body,
                        size_t len) {
    if (r->ended || r->streaming) {
        st_log_error("http: response ended twice or already streaming");
        return;
    }
    conn_t *c = r->conn;
    r->status = status;
    r->bytes = len;
    if (c) {
        char h[1024];
        int n = snprintf(h, sizeof h,
                         "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%sConnection: %s\r\n\r\n",
                         status, reason(status), ctype ? ctype : "text/plain", len, extra ? extra : "",
                         c->keep_alive ? "keep-alive" : "close");
        if (n > 0 && (size_t)n < sizeof h) {
            conn_write(c, h, (size_t)n, body, len, NULL, 0);
        } else {
            st_log_error("http: response head too long (content type %.40s...)", ctype);
            static const char e[] =
                "HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
            conn_write(c, e, sizeof e - 1, NULL, 0, NULL, 0);
            c->keep_alive = 0;
        }
    }
    res_done(r);
}

static void res_error(st_http_res_t *r, int status, const char *extra, const char *msg) {
    size_t bl = 0;
    char *body = error_json(status, msg, &bl);
    if (body) res_send_ex(r, status, "application/json", extra, body, bl);
    else res_send_ex(r, 500, "text/plain", NULL, "internal\n", 9);
    free(body);
}

static void dispatch(conn_t *c) {
    st_http_server_t *s = c->srv;
    if (!c->buf) { /* llhttp always delivers a target; be safe anyway */
        error_reply(c, 400, "Bad Request: no request target");
        return;
    }
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
        .body = c->body_len ? c->buf + c->body_off : "",
        .body_len = c->body_len,
        .n_headers = c->n_hdr,
        .header_names = names,
        .header_values = vals,
    };
    st_http_res_t *r = calloc(1, sizeof *r);
    if (!r) {
        error_reply(c, 500, "Internal Server Error: out of memory");
        return;
    }
    r->conn = c;
    c->res = r;
    if (s->opts.access_log) {
        r->srv = s;
        r->t0 = st_time_sec();
        int n = snprintf(r->line, sizeof r->line, "%s %.150s%s", req.method, req.path, strlen(req.path) > 150 ? "..." : "");
        for (int i = 0; i < n && i < (int)sizeof r->line - 1; i++) /* a client's bytes: printable ASCII only */
            if ((unsigned char)r->line[i] < 0x20 || (unsigned char)r->line[i] >= 0x7f || r->line[i] == '"') r->line[i] = '?';
        struct sockaddr_storage sa;
        int sl = sizeof sa;
        snprintf(r->peer, sizeof r->peer, "-");
        if (!c->sink && uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&sa, &sl) == 0) {
            char ip[INET6_ADDRSTRLEN] = "?";
            if (sa.ss_family == AF_INET) {
                struct sockaddr_in *a = (struct sockaddr_in *)&sa;
                uv_ip4_name(a, ip, sizeof ip);
                snprintf(r->peer, sizeof r->peer, "%s:%u", ip, ntohs(a->sin_port));
            } else if (sa.ss_family == AF_INET6) {
                struct sockaddr_in6 *a = (struct sockaddr_in6 *)&sa;
                uv_ip6_name(a, ip, sizeof ip);
                snprintf(r->peer, sizeof r->peer, "[%s]:%u", ip, ntohs(a->sin6_port));
            }
        }
    }
    const route_t *hit = NULL;
    char allow[128] = "";
    size_t al = 0;
    for (size_t i = 0; i < s->n_routes && !hit; i++) {
        if (strcmp(s->routes[i].path, req.path) != 0) continue;
        if (strcmp(s->routes[i].method, req.method) == 0) hit = &s->routes[i];
        else if (al + strlen(s->routes[i].method) + 3 < sizeof allow)
            al += (size_t)snprintf(allow + al, sizeof allow - al, "%s%s", al ? ", " : "", s->routes[i].method);
    }
    if (hit) {
        hit->fn(&req, r, hit->arg);
        return;
    }
    char msg[300];
    snprintf(msg, sizeof msg, "%s (%s %.200s%s)", al ? "Invalid method for URL" : "Invalid URL", req.method, req.path,
             strlen(req.path) > 200 ? "..." : "");
    if (al) {
        char extra[160];
        snprintf(extra, sizeof extra, "Allow: %s\r\n", allow);
        res_error(r, 405, extra, msg);
    } else {
        res_error(r, 404, NULL, msg);
    }
}

/* ---- accepting ---- */

static conn_t *conn_new(st_http_server_t *s, int fake) {
    conn_t *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->srv = s;
    if (!fake) {
        uv_tcp_init(s->loop, &c->tcp);
        c->tcp.data = c;
        c->handles++;
    }
    uv_timer_init(s->loop, &c->timer);
    uv_idle_init(s->loop, &c->kick);
    c->timer.data = c->kick.data = c->shut.data = c;
    c->handles += 2;
    s->open_handles++;
    c->next = s->conns;
    if (s->conns) s->conns->prev = c;
    s->conns = c;
    llhttp_init(&c->parser, HTTP_REQUEST, &s->settings);
    c->parser.data = c;
    return c;
}

static void bare_closed(uv_handle_t *h) {
    st_http_server_t *s = h->data;
    free(h);
    s->open_handles--;
    server_maybe_done(s);
}

/* Over the cap with too many already being turned away: accept (or the listener stalls), try one
 * write of the 503, close. */
static void reject_now(st_http_server_t *s, uv_stream_t *l) {
    uv_tcp_t *t = malloc(sizeof *t);
    if (!t) return;
    uv_tcp_init(s->loop, t);
    t->data = s;
    s->open_handles++;
    if (uv_accept(l, (uv_stream_t *)t) == 0 && !s->tls) {
        uv_buf_t b = uv_buf_init((char *)REJECT_503, sizeof REJECT_503 - 1);
        uv_try_write((uv_stream_t *)t, &b, 1);
    }
    uv_close((uv_handle_t *)t, bare_closed);
}

static void on_connection(uv_stream_t *l, int status) {
    st_http_server_t *s = l->data;
    if (status < 0) {
        st_log_every(ST_LOG_WARN, 10, "http: accept: %s", uv_strerror(status));
        return;
    }
    int reject = s->n_conns >= s->st.max_conns;
    if (reject) {
        s->st.rejected++;
        st_log_every(ST_LOG_WARN, 10, "http: %zu connections open (max_conns): turning new ones away with 503",
                     s->n_conns);
    }
    conn_t *c = reject && s->n_rejecting >= MAX_REJECTING ? NULL : conn_new(s, 0);
    if (!c) {
        reject_now(s, l);
        return;
    }
    if (reject) {
        c->reject = 1;
        s->n_rejecting++;
    } else {
        s->n_conns++;
        s->st.accepted++;
    }
    if (uv_accept(l, (uv_stream_t *)&c->tcp) != 0) {
        conn_close(c);
        return;
    }
    if (s->tls) {
        c->ssl = SSL_new(s->tls);
        c->rbio = BIO_new(BIO_s_mem());
        c->wbio = BIO_new(BIO_s_mem());
        if (!c->ssl || !c->rbio || !c->wbio) {
            st_log_every(ST_LOG_ERROR, 10, "http: cannot set up TLS for a connection");
            if (!c->ssl) {
                BIO_free(c->rbio);
                BIO_free(c->wbio);
            } else {
                SSL_set_bio(c->ssl, c->rbio, c->wbio); /* SSL_free frees them (NULL ok) */
            }
            c->rbio = c->wbio = NULL;
            conn_close(c);
            return;
        }
        SSL_set_bio(c->ssl, c->rbio, c->wbio);
        SSL_set_accept_state(c->ssl);
        c->phase = PH_HANDSHAKE;
        timer_arm(c, s->opts.header_timeout_ms);
    } else if (reject) {
        reject_reply(c);
        return;
    } else {
        c->phase = PH_IDLE;
        timer_arm(c, s->opts.idle_timeout_ms);
    }
    set_reading(c, 1);
}

/* ---- public: server ---- */

static void listener_closed(uv_handle_t *h) {
    st_http_server_t *s = h->data;
    s->open_handles--;
    server_maybe_done(s);
}

static uint32_t fd_cap(uint32_t want) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return want;
    uint64_t cur = rl.rlim_cur, head = ST_MAX(cur / 4, 128); /* gRPC, UCX, files, connections being turned away */
    uint64_t allow = cur > 2 * head ? cur - head : ST_MAX(cur / 2, 1);
    if (want <= allow) return want;
    st_log_info("http: max_conns %u lowered to %llu: %llu open files allowed (st_fd_limit_raise raises it)", want,
                (unsigned long long)allow, (unsigned long long)cur);
    return (uint32_t)allow;
}

static st_status_t tls_error(const char *what, const char *path) {
    char why[256] = "unknown error";
    unsigned long e = ERR_peek_last_error();
    if (e) ERR_error_string_n(e, why, sizeof why);
    ERR_clear_error();
    return ST_FAIL(ST_ERR_CONFIG, "http: TLS %s %s: %s", what, path ? path : "", why);
}

static st_status_t tls_ctx_create(const char *cert, const char *key, SSL_CTX **out) {
    const char *files[2] = {cert, key};
    for (int i = 0; i < 2; i++) { /* OpenSSL's own text for these is vague */
        FILE *f = fopen(files[i], "r");
        if (!f)
            return ST_FAIL(ST_ERR_CONFIG, "http: TLS %s %s: %s", i ? "private key" : "certificate", files[i],
                           strerror(errno));
        fclose(f);
    }
    ERR_clear_error();
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (!ctx) return tls_error("context", NULL);
    st_status_t st = ST_OK;
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE);
    SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
    if (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1) st = tls_error("certificate", cert);
    else if (SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1) st = tls_error("private key", key);
    else if (SSL_CTX_check_private_key(ctx) != 1) st = tls_error("private key does not match the certificate;", key);
    if (st) {
        SSL_CTX_free(ctx);
        return st;
    }
    *out = ctx;
    return ST_OK;
}

static st_status_t server_new(uv_loop_t *loop, const st_http_opts_t *opts, st_http_server_t **out) {
    st_http_opts_t o = {.max_body = 1u << 20,
                        .max_header = 16u << 10,
                        .idle_timeout_ms = 30000,
                        .header_timeout_ms = 10000,
                        .body_timeout_ms = 30000,
                        .max_conns = 1024};
    if (opts) {
        if (opts->max_body) o.max_body = opts->max_body;
        if (opts->max_header) o.max_header = opts->max_header;
        if (opts->idle_timeout_ms) o.idle_timeout_ms = opts->idle_timeout_ms;
        if (opts->header_timeout_ms) o.header_timeout_ms = opts->header_timeout_ms;
        if (opts->body_timeout_ms) o.body_timeout_ms = opts->body_timeout_ms;
        if (opts->max_conns) o.max_conns = opts->max_conns;
        o.tls_cert = opts->tls_cert;
        o.tls_key = opts->tls_key;
        o.access_log = opts->access_log;
    }
    if (o.max_header > (64u << 20)) return ST_FAIL(ST_ERR_INVALID_ARG, "http: max_header %zu too large", o.max_header);
    if (!o.tls_cert != !o.tls_key)
        return ST_FAIL(ST_ERR_CONFIG, "http: TLS needs both a certificate and a key file (got only the %s)",
                       o.tls_cert ? "certificate" : "key");
    SSL_CTX *tls = NULL;
    if (o.tls_cert) {
        st_status_t st = tls_ctx_create(o.tls_cert, o.tls_key, &tls);
        if (st) return st;
    }
    st_http_server_t *s = calloc(1, sizeof *s);
    char *slab = malloc(SLAB);
    if (!s || !slab) {
        free(s);
        free(slab);
        SSL_CTX_free(tls);
        return ST_FAIL(ST_ERR_NO_MEMORY, "http: cannot allocate server");
    }
    s->loop = loop;
    s->opts = o;
    s->tls = tls;
    s->slab = slab;
    s->in_cap = IN_SLACK + o.max_header;
    s->st.max_conns = fd_cap(o.max_conns);
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
    *out = s;
    return ST_OK;
}

st_status_t st_http_server_create(uv_loop_t *loop, const char *host, uint16_t port, const st_http_opts_t *opts,
                                  st_http_server_t **out) {
    struct sockaddr_storage sa;
    int rc = uv_ip4_addr(host, port, (struct sockaddr_in *)&sa);
    if (rc) rc = uv_ip6_addr(host, port, (struct sockaddr_in6 *)&sa);
    if (rc) return ST_FAIL(ST_ERR_INVALID_ARG, "http: bad listen address %s", host);
    st_http_server_t *s;
    st_status_t st = server_new(loop, opts, &s);
    if (st) return st;
    uv_tcp_init(loop, &s->listener);
    s->listener.data = s;
    s->listening = 1;
    s->open_handles = 1;
    rc = uv_tcp_bind(&s->listener, (struct sockaddr *)&sa, 0);
    if (!rc) rc = uv_listen((uv_stream_t *)&s->listener, 511, on_connection);
    if (rc) {
        st = ST_FAIL(ST_ERR_IO, "http: cannot listen on %s:%u: %s", host, port, uv_strerror(rc));
        s->closing = 1; /* s is freed once the loop has closed the handle */
        uv_close((uv_handle_t *)&s->listener, listener_closed);
        return st;
    }
    struct sockaddr_storage bound;
    int bl = sizeof bound;
    uv_tcp_getsockname(&s->listener, (struct sockaddr *)&bound, &bl);
    s->port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                : ((struct sockaddr_in *)&bound)->sin_port);
    if (s->tls) st_log_info("http: serving HTTPS only on %s:%u (%s)", host, s->port, s->opts.tls_cert);
    *out = s;
    return ST_OK;
}

st_status_t st_http_server_create_detached(uv_loop_t *loop, const st_http_opts_t *opts, size_t in_cap,
                                           st_http_server_t **out) {
    st_http_opts_t o = opts ? *opts : (st_http_opts_t){0};
    o.tls_cert = o.tls_key = NULL;
    st_http_server_t *s;
    st_status_t st = server_new(loop, &o, &s);
    if (st) return st;
    if (in_cap) s->in_cap = in_cap;
    *out = s;
    return ST_OK;
}

uint16_t st_http_server_port(const st_http_server_t *s) { return s->port; }

void st_http_server_stats(const st_http_server_t *s, st_http_stats_t *out) {
    *out = s->st;
    out->open_conns = s->n_conns;
}

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
    for (conn_t *c = s->conns; c; c = c->next) conn_close(c); /* unlinked only when freed */
    if (s->listening) uv_close((uv_handle_t *)&s->listener, listener_closed);
    else server_maybe_done(s);
}

const char *st_http_req_header(const st_http_req_t *req, const char *name) {
    for (size_t i = 0; i < req->n_headers; i++)
        if (strcasecmp(req->header_names[i], name) == 0) return req->header_values[i];
    return NULL;
}

/* ---- public: responses ---- */

void st_http_res_send(st_http_res_t *r, int status, const char *ctype, const void *body, size_t len) {
    res_send_ex(r, status, ctype, NULL, body, len);
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
        static const char e[] = "{\"error\":{\"message\":\"internal error\",\"type\":\"server_error\",\"param\":null,"
                                "\"code\":null}}\n";
        st_http_res_send(r, 500, "application/json", e, sizeof e - 1);
        return;
    }
    size_t n = strlen(s);
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
    r->status = status;
    conn_t *c = r->conn;
    if (!c) return ST_ERR_PEER;
    char h[1024];
    int n = snprintf(h, sizeof h,
                     "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nTransfer-Encoding: chunked\r\nCache-Control: no-cache\r\n"
                     "Connection: %s\r\n\r\n",
                     status, reason(status), ctype ? ctype : "text/plain", c->keep_alive ? "keep-alive" : "close");
    if (n <= 0 || (size_t)n >= sizeof h) return ST_FAIL(ST_ERR_INVALID_ARG, "http: response head too long");
    return conn_write(c, h, (size_t)n, NULL, 0, NULL, 0);
}

st_status_t st_http_res_stream_write(st_http_res_t *r, const void *data, size_t len) {
    if (!r->streaming || r->ended) return ST_FAIL(ST_ERR_INVALID_ARG, "http: stream write outside a stream");
    if (!r->conn) return ST_ERR_PEER;
    r->bytes += len;
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

int st_http_res_is_open(const st_http_res_t *r) { return r->conn != NULL && !r->conn->closing && !r->conn->doomed; }

/* ---- fuzzing: a fake connection fed from memory ---- */

int st_http_fuzz_run(st_http_server_t *s, const void *data, size_t len, size_t chunk, int expire, st_http_sink_fn sink,
                     void *arg) {
    conn_t *c = conn_new(s, 1);
    if (!c) return -1;
    int gone = 0, stalls = 0, rc = 0;
    c->gone = &gone;
    c->sink = sink;
    c->sink_arg = arg;
    s->n_conns++;
    s->st.accepted++;
    c->phase = PH_IDLE;
    timer_arm(c, s->opts.idle_timeout_ms);
    c->reading = 1;
    const char *p = data;
    size_t off = 0;
    if (!chunk) chunk = 1;
    while (!gone && !c->closing && off < len) {
        size_t n = ST_MIN(chunk, len - off);
        if (c->reading && c->phase != PH_DRAIN && !c->reject) n = ST_MIN(n, in_room(c));
        if (!c->reading || !n) {
            uv_run(s->loop, UV_RUN_NOWAIT);
            if (++stalls > 10000) { /* not reading, and nothing the loop does changes that */
                rc = -1;
                break;
            }
            continue;
        }
        stalls = 0;
        if (c->phase == PH_DRAIN) {
            off += n; /* dropped */
            continue;
        }
        memcpy(c->in + c->in_len, p + off, n);
        off += n;
        c->in_len += n;
        conn_pump(c);
    }
    /* let held responses end and kicked parsing finish */
    for (int i = 0; !gone && !c->closing && (c->res || uv_is_active((uv_handle_t *)&c->kick)); i++) {
        if (i == 10000) {
            rc = -1;
            break;
        }
        uv_run(s->loop, UV_RUN_NOWAIT);
    }
    if (!gone && !c->closing && expire) on_deadline(&c->timer);
    if (!gone && !c->closing) { /* the client's EOF */
        c->reading = 0;
        if (c->res || c->phase == PH_DRAIN) conn_close(c);
        else {
            c->eof = 1;
            conn_pump(c);
        }
    }
    for (int i = 0; !gone && i < 10000; i++) {
        if (!c->closing && !c->writes && i > 100) conn_close(c); /* should have closed by now */
        uv_run(s->loop, UV_RUN_NOWAIT);
    }
    return gone ? rc : -1;
}
