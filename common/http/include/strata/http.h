/* Strata HTTP/1.1 server on libuv + llhttp: a route table (method + exact path), bounded requests
 * (413 body, 431 headers, 400 malformed then close), keep-alive with pipelining, plain responses
 * and chunked / Server-Sent-Events streams that the handler may keep open and write from the loop
 * later, optionally over TLS (OpenSSL). Serves /healthz, /metrics, /v1/completions and friends; not
 * a general web server (no HTTP/2, no upgrade).
 *
 * Bounded against slow and greedy clients: a request's headers and its body each have a deadline
 * (408 then close), connections idle between requests are closed, at most max_conns connections
 * are served (the next get a fixed 503 and are closed), at most 64 KiB + max_header of unparsed
 * input is held per connection (reading pauses while a response is pending and the buffer is
 * full), and pipelined requests are parsed a few per loop iteration.
 *
 * Threads: everything on the loop thread. Ownership: a handler receives a response handle and must
 * end it exactly once (st_http_res_send / _json / _stream_end), now or later. The handle stays valid
 * until then even if the client goes away (writes then fail with ST_ERR_PEER and the on_close
 * callback tells the handler). The request is valid only during the handler call. */
#ifndef STRATA_HTTP_H
#define STRATA_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "strata/base.h"

#ifdef __cplusplus
extern "C" {
#endif

struct uv_loop_s;

typedef struct st_http_server st_http_server_t;
typedef struct st_http_res st_http_res_t;

/* Zero in any field means its default. */
typedef struct {
    size_t max_body;            /* bytes; larger → 413 (default 1 MiB) */
    size_t max_header;          /* request line + headers; larger → 431 (default 16 KiB) */
    uint32_t idle_timeout_ms;   /* close a connection idle between requests this long (default 30 s) */
    uint32_t header_timeout_ms; /* a request's line + headers must arrive within this, counted from its
                                   first byte; else 408 and close (default 10 s). Also bounds the TLS
                                   handshake. */
    uint32_t body_timeout_ms;   /* its body must arrive within this after the headers; else 408 and
                                   close (default 30 s) */
    uint32_t max_conns;         /* connections served at once (default 1024); beyond it a connection
                                   gets 503 (Retry-After: 1) and is closed. Lowered at create to the
                                   soft RLIMIT_NOFILE less headroom (a quarter, at least 128) for the
                                   process's other descriptors: call st_fd_limit_raise() first. */
    const char *tls_cert;       /* PEM certificate (chain) file; with tls_key: HTTPS only (TLS 1.2+) */
    const char *tls_key;        /* PEM private key file */
    bool access_log;            /* one info line per response: peer "METHOD PATH" status body-bytes seconds */
} st_http_opts_t;

/* Counters for operators (st_http_server_stats). */
typedef struct {
    uint64_t open_conns;    /* connections being served now */
    uint64_t max_conns;     /* the cap in force (after the descriptor-limit clamp) */
    uint64_t accepted;      /* connections served since start */
    uint64_t rejected;      /* connections turned away at the cap (503) */
    uint64_t timed_out;     /* requests whose headers or body missed their deadline (408), and TLS
                               handshakes that did */
    uint64_t buffered_high; /* high-water mark of unparsed input bytes held by one connection */
} st_http_stats_t;

typedef struct {
    const char *method; /* "GET" */
    const char *path;   /* "/v1/completions", without the query */
    const char *query;  /* after '?', or "" */
    const char *body;   /* NUL-terminated for convenience; body_len bytes */
    size_t body_len;
    size_t n_headers;
    const char *const *header_names;  /* as received */
    const char *const *header_values;
} st_http_req_t;

/* Case-insensitive header lookup; NULL if absent. */
const char *st_http_req_header(const st_http_req_t *req, const char *name);

typedef void (*st_http_handler_fn)(const st_http_req_t *req, st_http_res_t *res, void *arg);
typedef void (*st_http_close_fn)(st_http_res_t *res, void *arg);

/* host: "127.0.0.1"; port 0 = ephemeral. opts may be NULL. With tls_cert/tls_key set, a missing or
 * unreadable file, or a key that does not match the certificate, fails here (ST_ERR_CONFIG). */
st_status_t st_http_server_create(struct uv_loop_s *loop, const char *host, uint16_t port, const st_http_opts_t *opts,
                                  st_http_server_t **out);
uint16_t st_http_server_port(const st_http_server_t *srv);
void st_http_server_stats(const st_http_server_t *srv, st_http_stats_t *out); /* loop thread */
/* Exact-match route; an unmatched path is 404, a matched path with another method 405 (with an
 * Allow header); both with an OpenAI-shaped JSON error body. A request target holding a byte
 * outside printable ASCII is 400. */
st_status_t st_http_route(st_http_server_t *srv, const char *method, const char *path, st_http_handler_fn fn,
                          void *arg);
/* Close the listener and every connection (open responses see on_close), then done(arg) once
 * all handles are closed. Responses not yet ended must still be ended by their handlers. */
void st_http_server_close(st_http_server_t *srv, void (*done)(void *arg), void *arg);

/* Whole response with Content-Length; ends the response. */
void st_http_res_send(st_http_res_t *res, int status, const char *content_type, const void *body, size_t len);
/* JSON built with jansson's json_pack format (e.g. "{s:s, s:i}"); 500 if the format fails. */
void st_http_res_json(st_http_res_t *res, int status, const char *fmt, ...);
/* Chunked streaming: begin once, write any number of times, end once. */
st_status_t st_http_res_stream_begin(st_http_res_t *res, int status, const char *content_type);
st_status_t st_http_res_stream_write(st_http_res_t *res, const void *data, size_t len);
/* One Server-Sent Event ("event: <event>" if non-NULL, one "data:" line per line of data). Begins
 * a text/event-stream response if not begun. */
st_status_t st_http_res_sse(st_http_res_t *res, const char *event, const char *data);
void st_http_res_stream_end(st_http_res_t *res);
void st_http_res_on_close(st_http_res_t *res, st_http_close_fn fn, void *arg);
int st_http_res_is_open(const st_http_res_t *res); /* client still connected */

#ifdef __cplusplus
}
#endif
#endif
