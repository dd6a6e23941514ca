/* Strata control-plane RPC over gRPC C core (HTTP/2, clear or TLS/mTLS, with a shared-token check
 * on the server; docs/security.md): a byte-payload server with unary and server-streaming handlers,
 * and a client with deadlines. Messages are opaque bytes here; strata/proto.h encodes them. Not
 * for tensors.
 *
 * Threads: one completion-queue thread per process blocks in grpc_completion_queue_next and hands
 * every event to the libuv loop given to st_rpc_init() (mutex queue + uv_async_send). All
 * callbacks and handlers run on that loop thread, and every function here must be called from it.
 *
 * Callbacks: a function taking a callback either fails (returns an error, never calls it) or
 * succeeds and calls it exactly once. */
#ifndef STRATA_RPC_H
#define STRATA_RPC_H

#include <stddef.h>
#include <stdint.h>

#include "strata/base.h"

#ifdef __cplusplus
extern "C" {
#endif

struct uv_loop_s;

#define ST_RPC_MAX_MESSAGE (64u << 20) /* both directions, client and server */

/* Process-wide start: grpc_init, the completion queue, its thread and the loop hand-off. */
st_status_t st_rpc_init(struct uv_loop_s *loop);
/* How many times gRPC's accept() failed for a reason other than EAGAIN (EMFILE, ENFILE, ...), from
 * its own log line; any thread. NOTE: in gRPC 1.51 the listener that hit it never accepts again
 * (grpc/grpc#20418; 1.57 retries): a role seeing this > 0 should report not ready / restart. */
uint64_t st_rpc_accept_failures(void);
/* Process-wide stop, on the loop thread, after every server's close callback has run and every
 * client call has completed. Joins the CQ thread; the loop must run once more to close the
 * hand-off handle. */
void st_rpc_cleanup(void);

/* ---- security (docs/security.md) ----
 * Request metadata keys (lower case, printable ASCII values):
 *   x-strata-token: <token>          the cluster token; checked by the server, sent by channels
 *   authorization: Bearer <bearer>   a client's API key; sent by channels, read by open methods
 * token: a server with a token finishes every call to a method added with st_rpc_server_add_method
 * (and to unknown methods) that does not carry exactly that token with UNAUTHENTICATED, before the
 * message is read or any handler runs; it compares in constant time, logs a rate-limited WARN
 * naming the peer and method, and counts it (st_rpc_server_auth_failures). A channel with a token
 * sends it on every unary and streaming call. Tokens and bearers: printable ASCII, not empty.
 * TLS: files in PEM, read and checked once at create (missing, unreadable, not PEM, a key that does
 * not match its certificate, an encrypted key: create fails and says which). A server with
 * tls_cert + tls_key serves TLS only, and with tls_ca + tls_client_auth requires a client
 * certificate issued by that CA (mTLS). A channel uses TLS when tls is set or any TLS field is
 * given (never clear text by accident): it verifies the server against tls_ca (gRPC's default
 * roots when NULL) and the name in the target (or tls_target_name), and presents tls_cert/tls_key
 * when given. Status mapping: a call refused UNAUTHENTICATED or PERMISSION_DENIED reports
 * ST_ERR_AUTH to the client; a handler finishing with ST_ERR_AUTH sends UNAUTHENTICATED. A TLS
 * handshake that fails (wrong CA, no client certificate, clear text against TLS) reports ST_ERR_PEER. */
#define ST_RPC_MD_TOKEN "x-strata-token"
#define ST_RPC_MD_AUTH "authorization"
typedef struct {
    const char *token;
    const char *bearer;          /* channel: sent as "authorization: Bearer <bearer>" (client API key) */
    int tls;                     /* channel: use TLS (servers: ignored, TLS is implied by tls_cert) */
    const char *tls_cert;        /* certificate chain (server) or client certificate (mTLS) */
    const char *tls_key;         /* its private key */
    const char *tls_ca;          /* CA bundle: the server's issuer (channel) / client issuer (server) */
    int tls_client_auth;         /* server: require and verify a client certificate */
    const char *tls_target_name; /* channel: name to check in the server certificate (default: host) */
} st_rpc_sec_t;

/* ---- server ---- */
typedef struct st_rpc_server st_rpc_server_t;
typedef struct st_rpc_call st_rpc_call_t; /* one incoming call, owned by its handler until finished */

/* Called once per call with the request bytes (valid only during the call: copy what you keep).
 * The handler (now or later, on the loop thread) answers with st_rpc_call_reply(), or writes any
 * number of messages and then st_rpc_call_finish(); exactly one of reply/finish ends the call and
 * invalidates the handle. */
typedef void (*st_rpc_handler_fn)(st_rpc_call_t *call, const uint8_t *req, size_t len, void *arg);
/* The client went away, the deadline passed, or the server is closing. The handle stays valid
 * until reply/finish (writes then fail with ST_ERR_CANCELLED) or the server's close callback. */
typedef void (*st_rpc_cancel_fn)(st_rpc_call_t *call, void *arg);

/* addr: "127.0.0.1:0" for an ephemeral port. Bound at start exactly as given: pass an IP address
 * (a host name binds every address it resolves to; ":port" or "0.0.0.0:port" binds all interfaces).
 * Connections that never finish the handshake are dropped after 10 s, connections without a call
 * after 10 min. NOTE: gRPC 1.51 stops accepting on a port for good once accept() fails with EMFILE
 * (grpc/grpc#20418, fixed in 1.57): processes must keep their descriptors below RLIMIT_NOFILE. */
st_status_t st_rpc_server_create(const char *addr, st_rpc_server_t **out); /* no token, no TLS */
/* sec may be NULL (= st_rpc_server_create); strings are copied. */
st_status_t st_rpc_server_create_ex(const char *addr, const st_rpc_sec_t *sec, st_rpc_server_t **out);
/* Replace the required token (copied; NULL: no check) at any time, on the loop thread; calls already
 * accepted keep the verdict they got. An empty or non-printable token refuses every guarded call. */
void st_rpc_server_set_token(st_rpc_server_t *srv, const char *token);
/* Calls refused for a missing or wrong token since create. */
uint64_t st_rpc_server_auth_failures(const st_rpc_server_t *srv);
/* path: "/strata.v1.Coordinator/Method". Before start. Unknown paths get UNIMPLEMENTED (or
 * UNAUTHENTICATED from a server with a token, when the call lacks it). The server's token (if any)
 * is required on it. */
st_status_t st_rpc_server_add_method(st_rpc_server_t *srv, const char *path, st_rpc_handler_fn fn, void *arg);
/* A method the server's token does not guard (a client-facing one, e.g. Generate): its handler
 * checks what it needs with st_rpc_call_header(). */
st_status_t st_rpc_server_add_open_method(st_rpc_server_t *srv, const char *path, st_rpc_handler_fn fn, void *arg);
st_status_t st_rpc_server_start(st_rpc_server_t *srv, int *bound_port);
/* Stop accepting, cancel every open call (their cancel callbacks fire), wait for gRPC to let go,
 * destroy, then call done(arg). Open handles are freed before done: drop them in the cancel cb. */
void st_rpc_server_close(st_rpc_server_t *srv, void (*done)(void *arg), void *arg);

st_status_t st_rpc_call_write(st_rpc_call_t *call, const void *msg, size_t len); /* copies msg */
/* End the call: ST_OK sends gRPC OK; an error maps to the matching gRPC code with detail text. */
void st_rpc_call_finish(st_rpc_call_t *call, st_status_t st, const char *detail);
/* write + finish(ST_OK); on a write failure the call is finished with that error. */
st_status_t st_rpc_call_reply(st_rpc_call_t *call, const void *msg, size_t len);
void st_rpc_call_on_cancel(st_rpc_call_t *call, st_rpc_cancel_fn fn, void *arg);
int st_rpc_call_is_cancelled(const st_rpc_call_t *call);
const char *st_rpc_call_method(const st_rpc_call_t *call);
/* The connection the call came on, as gRPC names it ("ipv4:127.0.0.1:40123"); valid with the call. */
const char *st_rpc_call_peer(const st_rpc_call_t *call);
/* A request metadata value by (lower-case) key, NUL-terminated copy valid with the call; NULL if absent
 * (the first one when repeated; a "-bin" value is raw bytes, cut at its first NUL). */
const char *st_rpc_call_header(const st_rpc_call_t *call, const char *key);

/* ---- client ---- */
typedef struct st_rpc_channel st_rpc_channel_t;
typedef struct st_rpc_stream st_rpc_stream_t;

/* target: "host:port". Connects lazily. Destroy only after its calls have completed. */
st_status_t st_rpc_channel_create(const char *target, st_rpc_channel_t **out);
/* sec may be NULL (= st_rpc_channel_create); strings are copied. */
st_status_t st_rpc_channel_create_ex(const char *target, const st_rpc_sec_t *sec, st_rpc_channel_t **out);
void st_rpc_channel_destroy(st_rpc_channel_t *ch);

/* st: ST_OK with the reply, or the mapped error (ST_ERR_TIMEOUT deadline, ST_ERR_UNSUPPORTED
 * unknown method, ST_ERR_PEER unreachable or TLS handshake failed, ST_ERR_AUTH refused,
 * ST_ERR_CANCELLED, ...) with gRPC's detail text. reply and detail are valid only during the
 * callback. The text is also in st_err_last(); the log gets it at DEBUG for the peer's verdicts on
 * the request (INVALID_ARG, OUT_OF_RANGE, CAPACITY) and at most once per 10 s per kind otherwise. */
typedef void (*st_rpc_reply_fn)(st_status_t st, const uint8_t *reply, size_t len, const char *detail, void *arg);
typedef void (*st_rpc_msg_fn)(const uint8_t *msg, size_t len, void *arg);
typedef void (*st_rpc_done_fn)(st_status_t st, const char *detail, void *arg);

st_status_t st_rpc_unary(st_rpc_channel_t *ch, const char *path, const void *req, size_t len, uint32_t timeout_ms,
                         st_rpc_reply_fn cb, void *arg);
/* Server-streaming: on_msg per message, then on_done exactly once. timeout_ms bounds the whole
 * stream. *out (optional) is valid until on_done and may be passed to st_rpc_stream_cancel(). */
st_status_t st_rpc_stream_open(st_rpc_channel_t *ch, const char *path, const void *req, size_t len,
                               uint32_t timeout_ms, st_rpc_msg_fn on_msg, st_rpc_done_fn on_done, void *arg,
                               st_rpc_stream_t **out);
void st_rpc_stream_cancel(st_rpc_stream_t *s); /* on_done then reports ST_ERR_CANCELLED */

#ifdef __cplusplus
}
#endif
#endif
