/* Strata data plane over UCX UCP active messages (host memory only). One st_tp_t per process: a
 * UCP context + worker owned by the libuv loop thread, progressed from the worker's event fd.
 * Listener and connect by TCP host:port (sockaddr CM), peer-failure detection on both sides, and
 * allocation-free send/receive: the caller owns every request record (st_tp_send_req_t,
 * st_tp_recv_t) until its callback returns it.
 *
 * Threads and callbacks: every function is called on the loop thread. User callbacks (send done,
 * receive done, accept, peer lost) run from the loop, never inside a UCX callback, and may call any
 * st_tp function except st_tp_destroy. The exception is st_tp_am_begin_fn, which runs inside
 * UCX's receive callback: it may only pick a buffer (no st_tp calls). A function taking a request
 * with a callback either fails (callback never called) or succeeds and calls it exactly once. */
#ifndef STRATA_TRANSPORT_H
#define STRATA_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "strata/base.h"

#ifdef __cplusplus
extern "C" {
#endif

struct uv_loop_s;

#define ST_TP_HDR_MAX 128u /* AM header bytes (the wire header is 64) */
#define ST_TP_AM_IDS 32u   /* active-message ids 0 .. ST_TP_AM_IDS-1 */

typedef struct st_tp st_tp_t;
typedef struct st_tp_ep st_tp_ep_t;

/* ---- requests (caller-owned, not touched by the caller between submit and callback) ---- */
typedef struct st_tp_send_req st_tp_send_req_t;
typedef void (*st_tp_send_fn)(st_tp_send_req_t *req, st_status_t st); /* ST_OK, ST_ERR_PEER, ST_ERR_CANCELLED */
struct st_tp_send_req {
    st_tp_send_fn cb; /* set by the caller */
    void *user;       /* free for the caller */
    /* private */
    st_tp_send_req_t *next;
    st_tp_t *tp;
    st_status_t status;
    uint16_t am_id, hdr_len; /* kept while the send is held (connection still authenticating) */
    const void *payload;
    size_t len;
    uint8_t hdr[ST_TP_HDR_MAX]; /* NOTE: UCX may read the header until completion, so it lives here */
};

typedef struct st_tp_recv st_tp_recv_t;
struct st_tp_recv {
    /* set by st_tp_am_begin_fn before returning the record */
    void *buf;   /* landing buffer, host memory, >= cap bytes */
    size_t cap;
    void *user;
    /* filled by the transport before st_tp_am_done_fn */
    st_tp_ep_t *ep; /* the endpoint it came on (replies go here); NULL if unknown or closed */
    uint16_t am_id;
    size_t hdr_len;
    uint8_t hdr[ST_TP_HDR_MAX];
    size_t len;         /* payload bytes now in buf */
    st_status_t status; /* ST_OK; ST_ERR_PROTOCOL len > cap; ST_ERR_PEER transfer failed */
    /* private */
    st_tp_recv_t *next;
    st_tp_t *tp;
    void *arg;
    void (*done)(void *arg, st_tp_recv_t *r);
};

/* A message arrived: return a record with buf/cap set (the payload is copied or pulled into it),
 * or NULL to drop the message. Runs inside UCX's callback: pick a buffer, nothing else. hdr is
 * valid only during the call (it is also copied into the record). */
typedef st_tp_recv_t *(*st_tp_am_begin_fn)(void *arg, st_tp_ep_t *ep, const void *hdr, size_t hdr_len, size_t len);
/* The payload is in r->buf (or r->status says why not); r is the caller's again. */
typedef void (*st_tp_am_done_fn)(void *arg, st_tp_recv_t *r);

/* The peer went away (error, close or kill: ST_ERR_PEER) or failed the handshake (ST_ERR_AUTH; see
 * st_tp_set_secret). Called once; the endpoint is freed when it returns. */
typedef void (*st_tp_lost_fn)(st_tp_ep_t *ep, st_status_t why, void *arg);
/* A peer connected to our listener (with a secret: and proved it); set its lost callback here. */
typedef void (*st_tp_accept_fn)(st_tp_t *tp, st_tp_ep_t *ep, void *arg);

/* Sets UCX_TCP_CM_REUSEADDR=y unless the environment says otherwise. UCX itself (context, worker and
 * the sockets of its transports) starts on the first st_tp_listen or st_tp_connect.
 * NOTE: UCX's tcp transport opens a listening socket of its own on every network interface it uses,
 * besides the st_tp_listen socket. So the first st_tp_listen(host) limits UCX's network devices to
 * the interface that owns host (plus RDMA devices, which open no sockets), unless host is a wildcard
 * (0.0.0.0, ::) or UCX_NET_DEVICES is set. Such a process talks only over that interface. */
st_status_t st_tp_create(struct uv_loop_s *loop, st_tp_t **out);
/* The same limit for a process that connects first (or only): host is the address it serves on
 * (e.g. its gRPC --listen host). Before the first listen/connect; NULL: every interface (default). */
void st_tp_set_local_host(st_tp_t *tp, const char *host);
/* Force-closes endpoints (pending sends/receives complete with ST_ERR_CANCELLED or ST_ERR_PEER,
 * lost callbacks are not called), destroys the listener, and releases UCX once the loop has run
 * the handle close callbacks: keep running the loop after this. */
void st_tp_destroy(st_tp_t *tp);

/* Data-plane authentication (docs/security.md). With a secret set (before listen/connect), every
 * connection first runs a mutual challenge-response (HMAC-SHA256 under a key derived from the
 * secret, over both sides' random nonces; 2 round trips at connect, nothing per message):
 *   client HELLO{nonce_c} -> server CHALLENGE{nonce_s, mac_S} -> client checks mac_S (a server
 *   without the secret is detected too) -> PROOF{mac_C} -> server checks mac_C -> OK.
 * The accept callback runs only for a peer that has proven the secret; sends posted on a connecting
 * endpoint are held and go out in order after OK; any other message from a peer that has not
 * proven it is dropped (never handed to a handler) and the connection closed; a peer that fails or
 * stays silent for 5 s is closed with a rate-limited WARN naming it. A client endpoint is reported
 * lost: ST_ERR_AUTH when it found the server wrong or silent, ST_ERR_PEER when the server closed it.
 * The secret is copied (NULL: back to insecure). Without a secret nothing is checked (insecure
 * mode), as before; only a peer that starts the handshake is closed at once (it would never work). */
void st_tp_set_secret(st_tp_t *tp, const st_secret_t *secret);
/* How long a connection may take to prove the secret (default 5000 ms; tests shorten it). */
void st_tp_set_handshake_timeout_ms(st_tp_t *tp, unsigned ms);

/* Listen on host:port (port 0 = ephemeral); *bound_port gets the port. One listener per st_tp_t. */
st_status_t st_tp_listen(st_tp_t *tp, const char *host, uint16_t port, st_tp_accept_fn on_accept, void *arg,
                         uint16_t *bound_port);
/* Start connecting; sends may be posted at once (UCX queues them until wire-up). Failure to reach
 * the peer is reported through the lost callback. */
st_status_t st_tp_connect(st_tp_t *tp, const char *host, uint16_t port, st_tp_ep_t **out);
void st_tp_ep_on_lost(st_tp_ep_t *ep, st_tp_lost_fn fn, void *arg);
void st_tp_ep_set_user(st_tp_ep_t *ep, void *user);
void *st_tp_ep_user(const st_tp_ep_t *ep);
/* Close now (FORCE: in-flight operations fail, the peer sees a lost connection). No lost callback.
 * The handle is invalid afterwards. */
void st_tp_ep_close(st_tp_ep_t *ep);

/* Progress and deliver now (callbacks run inside), without sleeping or arming the event fd: for the
 * thread that runs the loop, polling while it waits for a reply instead of sleeping in the loop (no
 * wake-up). Nonzero when something happened. Never from a callback. The loop's next turn re-arms
 * (an event consumed here may leave the fd readable: that turn then returns at once). */
int st_tp_poll(st_tp_t *tp);

st_status_t st_tp_set_am_handler(st_tp_t *tp, uint16_t am_id, st_tp_am_begin_fn begin, st_tp_am_done_fn done,
                                 void *arg);
/* Send header (<= ST_TP_HDR_MAX, copied into req) + payload (host memory, must stay valid until
 * req->cb). Set req->cb before calling. */
st_status_t st_tp_send(st_tp_ep_t *ep, uint16_t am_id, const void *hdr, size_t hdr_len, const void *payload,
                       size_t len, st_tp_send_req_t *req);

#ifdef __cplusplus
}
#endif
#endif
