/* Expert server threads (see server.h).
 * Main loop thread: gRPC membership (placement, heartbeats), signals.
 * Data thread: a libuv loop of its own that owns UCX (listener, workers' connections, dispatches,
 * replies) and computes each dispatch it landed, then sends the reply from the same thread: no
 * thread hand-off per layer. A GPU server's data thread polls UCX while the device computes, so the
 * next dispatch lands meanwhile (it is computed next, in order). After a dispatch it polls UCX
 * (st_tp_poll) until the data path's spin (XFER_SPIN_US) passes with nothing moving, before it
 * sleeps on UCX's event fd, so the next layer's dispatch finds it awake. Receive/reply buffers are
 * preallocated slots: nothing is allocated per dispatch.
 * Upload thread (GPU): the placed experts' uploads while nothing computes.
 * Same-host workers (common/xfer): a worker whose hello says it runs on this host gets a channel in
 * shared memory, served by a link thread of its own that waits on the worker's doorbell (spin, then
 * futex), computes from the request slot straight into the reply slot and signals: no UCX,
 * no queue, no copy. The worker's UCX connection stays the control path: its loss ends the link. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <uv.h>

#include "compute.h"
#include "server.h"
#ifdef STRATA_WITH_CUDA
#include "compute_gpu.h"
#include "strata/gpu.h"
#endif
#include "strata/member.h"
#include "strata/transport.h"
#include "strata/wire.h"
#include "strata/xfer.h"

enum { SLOT_FREE = 0, SLOT_RECV, SLOT_READY, SLOT_SENDING };

#ifdef STRATA_WITH_CUDA
#define ST_ES_PINNED(es) ((es)->gpu != NULL) /* slot buffers from the pinned arena */
#else
#define ST_ES_PINNED(es) 0
#endif

typedef struct es es_t;
typedef struct {
    es_t *es;
    int idx, state;
    st_tp_recv_t recv;
    st_tp_send_req_t send;
    uint8_t *in, *out; /* payload buffers, cap bytes each */
    st_tp_ep_t *ep;    /* reply endpoint; NULL once the peer is lost (data thread only) */
    st_wire_info_t info;
    st_status_t result;
    uint32_t n_out;    /* output rows of the reply (compute_one) */
    uint64_t t_arrive; /* ns, when the dispatch landed: the reply reports the time it spent here */
#ifdef STRATA_WITH_CUDA
    const st_es_gpu_peer_t *peer; /* a same-host worker's device memory for this slot (wire.h PEER), or NULL */
#endif
    char err[256];
} slot_t;

struct es {
    st_es_opts_t o;
    st_rpc_sec_t rpc_sec; /* toward the coordinator (lives as long as the membership) */
    uv_loop_t loop;  /* main: gRPC, signals */
    uv_loop_t dloop; /* data thread's: UCX */
    st_tp_t *tp;
    st_member_t *mem;
    st_ckpt_t *ck;
    st_es_compute_t cx;  /* CPU compute (use_cuda false) */
#ifdef STRATA_WITH_CUDA
    st_es_gpu_t *gpu;    /* GPU compute (use_cuda true) */
    st_gpu_arena_t pinned; /* its slot buffers: rows go between them and the device without a host copy */
#endif
    slot_t *slots;
    size_t cap;
    pthread_t dth, uth; /* data thread; upload thread (GPU only, uth_on) */
    int uth_on;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uv_async_t async; /* on dloop: offers to send, the stop */
    uv_signal_t sig_int, sig_term;
    int stop;         /* under mu */
    uint64_t served, rows;
    uint64_t n_msgs;  /* data thread: messages handled (its spin restarts when this moves) */
    int *ready, ready_n, ready_head; /* data thread: landed dispatches to compute, a ring of slot indices */
    /* GPU: the (layer, expert) pairs placed here, uploaded by the upload thread between dispatches
     * (so the first requests do not pay for it); want[i], i = layer · n_experts + expert, under mu */
    unsigned char *want;
    size_t n_want, bind_next; /* pairs; next index to look at (upload thread, under mu) */
    int placed;               /* a placement has been applied to want */
    /* the compute resources (es->cx / es->gpu) in use: by the data thread (a dispatch), the upload
     * thread (an upload) or a link thread; under mu.
     * NOTE: whoever clears it broadcasts cv (link threads wait for it there) */
    int busy;
    /* same-host links (see the top): the list and the number of link threads still running, under mu */
    struct shm_link *links;
    int n_link_threads;
    st_tp_recv_t hello_recv[4]; /* data thread: hellos being received (a header, no payload) */
    int hello_busy[4];
    uint8_t hello_buf[8];
};

/* ---------------------------------------------------------------- compute */

/* One dispatch → its output rows in s->out (the reply's payload, s->n_out rows). */
static void compute_one(es_t *es, slot_t *s) {
    st_wire_dispatch_t d;
    s->result = st_wire_dispatch_decode(s->in, &s->info, &d);
    if (s->result != ST_OK) {
        snprintf(s->err, sizeof s->err, "malformed dispatch: %s", st_err_last());
        return;
    }
    s->n_out = d.n_out;
#ifdef STRATA_WITH_CUDA
    if (es->gpu) {
        /* NOTE: binding uploads an expert the first time a dispatch needs it (the placement path:
         * it allocates and synchronises); afterwards it is a table lookup */
        for (uint32_t k = 0; k < s->info.expert_count && s->result == ST_OK; k++)
            s->result = st_es_gpu_bind(es->gpu, (int)s->info.layer, d.expert_ids[k]);
        if (s->result == ST_OK)
            s->result = st_es_gpu_run_peer(es->gpu, (int)s->info.layer, s->info.expert_count, &d,
                                           d.src ? s->info.unique : s->info.token_count, s->info.slots, (float *)s->out,
                                           s->peer);
        if (s->result != ST_OK) snprintf(s->err, sizeof s->err, "%s", st_err_last());
        else
            st_es_gpu_note_served(es->gpu, s->info.token_count, (double)(st_time_ns() - s->t_arrive) * 1e-9);
        return;
    }
#endif
    if (d.peer) {
        s->result = ST_ERR_PROTOCOL;
        snprintf(s->err, sizeof s->err, "a dispatch through device memory to a server that computes on the CPU");
        return;
    }
    for (uint32_t k = 0; k < s->info.expert_count && s->result == ST_OK; k++)
        s->result = st_es_compute_bind(&es->cx, (int)s->info.layer, (int)d.expert_ids[k]);
    if (s->result == ST_OK) s->result = st_es_compute_run(&es->cx, (int)s->info.layer, s->info.expert_count, &d, (float *)s->out);
    if (s->result != ST_OK) snprintf(s->err, sizeof s->err, "%s", st_err_last());
}

#ifdef STRATA_WITH_CUDA
/* One placed pair not bound yet, uploaded (called with mu held, which it drops around the upload);
 * returns 0 when none is left. */
static int bind_one(es_t *es) {
    const int n_exp = st_ckpt_config(es->ck)->n_experts;
    if (es->busy) return 0; /* a dispatch is running: its thread signals when done */
    while (es->bind_next < es->n_want && !es->want[es->bind_next]) es->bind_next++;
    if (es->bind_next >= es->n_want) {
        if (es->bind_next == es->n_want && es->placed) { /* once per placement */
            size_t n = 0;
            for (size_t i = 0; i < es->n_want; i++) n += es->want[i];
            st_log_info("expert %s: the %zu placed experts are resident (%.1f MiB on the device)", es->o.name, n,
                        (double)st_es_gpu_weight_bytes(es->gpu) / (1 << 20));
            es->bind_next++;
        }
        return 0;
    }
    const size_t i = es->bind_next++;
    es->busy = 1;
    pthread_mutex_unlock(&es->mu);
    if (st_es_gpu_bind(es->gpu, (int)(i / (size_t)n_exp), (int)(i % (size_t)n_exp)) != ST_OK)
        st_log_warn("expert %s: upload of expert %zu of layer %zu: %s", es->o.name, i % (size_t)n_exp,
                    i / (size_t)n_exp, st_err_last());
    pthread_mutex_lock(&es->mu);
    es->busy = 0;
    pthread_cond_broadcast(&es->cv);
    return 1;
}

/* Uploads placed experts one at a time while nothing computes (a dispatch never waits for more than one). */
static void *upload_main(void *arg) {
    es_t *es = arg;
    st_cpu_data_thread("st-upload");
    pthread_mutex_lock(&es->mu);
    while (!es->stop)
        if (!bind_one(es)) pthread_cond_wait(&es->cv, &es->mu);
    pthread_mutex_unlock(&es->mu);
    return NULL;
}
#endif

/* The compute resources, taken by a thread that computes (it waits while another one does). */
static void busy_take(es_t *es) {
    pthread_mutex_lock(&es->mu);
    while (es->busy) pthread_cond_wait(&es->cv, &es->mu); /* whoever clears busy broadcasts */
    es->busy = 1;
    pthread_mutex_unlock(&es->mu);
}
static void busy_give(es_t *es) {
    pthread_mutex_lock(&es->mu);
    es->busy = 0;
    pthread_cond_broadcast(&es->cv);
    pthread_mutex_unlock(&es->mu);
}

/* ---------------------------------------------------------------- data thread */

static void slot_free(slot_t *s) {
    s->state = SLOT_FREE;
    s->ep = NULL;
}

static void on_sent(st_tp_send_req_t *req, st_status_t st) {
    slot_t *s = req->user;
    if (st != ST_OK) st_log_warn("expert: reply seq %llu not delivered: %s", (unsigned long long)s->info.seq, st_status_str(st));
    slot_free(s);
}

/* The reply to s (COMBINE or ERROR) into h; its payload bytes (s->out) in *len. A COMBINE that cannot
 * be encoded (our bug) goes out as an ERROR saying why, so the worker fails those tokens at once
 * instead of waiting out its timeout; false: not even that could be encoded. */
static bool reply_header(slot_t *s, st_wire_header_t *h, size_t *len) {
    if (s->result == ST_OK) {
        st_wire_info_t r = st_wire_reply_info(&s->info, ST_OK, s->n_out, 0);
        uint64_t us = (st_time_ns() - s->t_arrive) / 1000; /* queued + computed */
        r.compute_us = us > 0xffffffffu ? 0xffffffffu : (uint32_t)us;
        *len = r.payload_bytes;
        if (st_wire_header_encode(&r, h) == ST_OK) return true;
        s->result = ST_ERR_INTERNAL;
        snprintf(s->err, sizeof s->err, "expert server: %s", st_err_last());
        st_log_every(ST_LOG_ERROR, 10.0, "%s", s->err);
    }
    *len = strlen(s->err);
    if (*len > ST_WIRE_MAX_ERROR_TEXT) *len = ST_WIRE_MAX_ERROR_TEXT;
    memcpy(s->out, s->err, *len);
    st_wire_info_t r = st_wire_reply_info(&s->info, s->result, 0, *len);
    return st_wire_header_encode(&r, h) == ST_OK;
}

static void send_reply(es_t *es, slot_t *s) {
    st_wire_header_t h;
    size_t len;
    if (!reply_header(s, &h, &len)) {
        slot_free(s);
        return;
    }
    s->send.cb = on_sent;
    s->send.user = s;
    s->state = SLOT_SENDING;
    if (st_tp_send(s->ep, ST_WIRE_AM_REPLY, &h, sizeof h, s->out, len, &s->send) != ST_OK) slot_free(s);
    __atomic_add_fetch(&es->served, 1, __ATOMIC_RELAXED); /* link threads count too */
    __atomic_add_fetch(&es->rows, s->result == ST_OK ? s->info.token_count : 0, __ATOMIC_RELAXED); /* pairs */
}

static void offers_send(es_t *es);

/* Links made (offers to send), or the stop: UCX goes, and with its handles the data loop ends. */
static void on_async(uv_async_t *a) {
    es_t *es = a->data;
    pthread_mutex_lock(&es->mu);
    int stop = es->stop;
    pthread_mutex_unlock(&es->mu);
    if (!stop) {
        offers_send(es);
        return;
    }
    if (!es->tp) return;
    st_tp_destroy(es->tp); /* NOTE: no loss callbacks: the endpoints the ready slots name are gone */
    es->tp = NULL;
    for (; es->ready_n; es->ready_n--, es->ready_head = (es->ready_head + 1) % es->o.slots)
        slot_free(&es->slots[es->ready[es->ready_head]]);
    uv_close((uv_handle_t *)&es->async, NULL);
}

static st_tp_recv_t *am_begin(void *arg, st_tp_ep_t *ep, const void *hdr, size_t hdr_len, size_t len) {
    es_t *es = arg;
    for (int i = 0; i < es->o.slots; i++) {
        slot_t *s = &es->slots[i];
        if (s->state != SLOT_FREE) continue;
        s->state = SLOT_RECV;
        s->recv.buf = s->in;
        s->recv.cap = es->cap;
        s->recv.user = s;
        return &s->recv;
    }
    return NULL; /* all slots busy: dropped; the worker's deadline fails or retries it */
}

static void am_done(void *arg, st_tp_recv_t *r) {
    es_t *es = arg;
    slot_t *s = r->user;
    if (r->status == ST_ERR_PROTOCOL && r->ep && r->hdr_len == sizeof(st_wire_header_t)) {
        /* larger than a slot: answer with a clear error instead of letting the worker time out */
        st_wire_header_t h;
        memcpy(&h, r->hdr, sizeof h);
        st_wire_info_t info;
        if (st_wire_header_decode(r->hdr, r->hdr_len, (size_t)h.payload_bytes, &info) == ST_OK) {
            s->info = info;
            s->ep = r->ep;
            s->result = ST_ERR_CAPACITY;
            snprintf(s->err, sizeof s->err, "dispatch of %u rows (%llu bytes) exceeds this server's %d rows (--max-rows)",
                     info.token_count, (unsigned long long)info.payload_bytes, es->o.max_rows);
            st_log_warn("expert %s: %s", es->o.name, s->err);
            send_reply(es, s);
            return;
        }
    }
    if (r->status != ST_OK || !r->ep) {
        st_log_warn("expert: dispatch lost in transfer: %s", st_status_str(r->status));
        slot_free(s);
        return;
    }
    st_wire_info_t info;
    if (st_wire_header_decode(r->hdr, r->hdr_len, r->len, &info) != ST_OK || info.kind != ST_WIRE_KIND_DISPATCH) {
        st_log_warn("expert: dropped a message with a bad header from %p: %s", (void *)r->ep, st_err_last());
        slot_free(s);
        return;
    }
    s->info = info;
    s->ep = r->ep;
    s->t_arrive = st_time_ns();
    es->n_msgs++;
    if (info.row_width != (uint32_t)st_config_expert_width(st_ckpt_config(es->ck))) {
        s->result = ST_ERR_PROTOCOL;
        snprintf(s->err, sizeof s->err, "row width %u, this model's experts work at %d", info.row_width,
                 st_config_expert_width(st_ckpt_config(es->ck)));
        send_reply(es, s);
        return;
    }
    /* computed by this thread once its poll returns (serve_ready), and answered from here */
    s->state = SLOT_READY;
    es->ready[(es->ready_head + es->ready_n) % es->o.slots] = s->idx;
    es->ready_n++;
}

#ifdef STRATA_WITH_CUDA
static void poll_tp(void *arg) {
    es_t *es = arg;
    st_tp_poll(es->tp);
}
#endif

/* The landed dispatches, in order: computed (a GPU server polls UCX meanwhile: what lands then joins
 * the line) and answered. Data thread, outside UCX's callbacks. */
static void serve_ready(es_t *es) {
    while (es->ready_n && es->tp) {
        slot_t *s = &es->slots[es->ready[es->ready_head]];
        es->ready_head = (es->ready_head + 1) % es->o.slots;
        es->ready_n--;
        if (!s->ep) { /* the worker is gone: nobody to answer */
            slot_free(s);
            continue;
        }
        busy_take(es);
#ifdef STRATA_WITH_CUDA
        if (es->gpu) st_es_gpu_set_wait(es->gpu, poll_tp, es);
#endif
        compute_one(es, s);
#ifdef STRATA_WITH_CUDA
        if (es->gpu) st_es_gpu_set_wait(es->gpu, NULL, NULL);
#endif
        busy_give(es);
        if (s->ep) send_reply(es, s);
        else slot_free(s); /* lost while it computed */
    }
}

/* The data thread: asleep in its loop on UCX's event fd until something comes; after a dispatch, UCX
 * polled without sleeping until the data path's spin passes with nothing moving (the next layer's
 * dispatch comes within it while a worker is stepping), with a turn of the loop every millisecond
 * (offers, the stop). Ends when the loop has no handle left (the stop). */
static void *data_main(void *arg) {
    es_t *es = arg;
    st_cpu_data_thread("st-data");
    const uint64_t spin = st_xfer_spin_ns();
    for (;;) {
        uint64_t seen = es->n_msgs;
        if (!uv_run(&es->dloop, UV_RUN_ONCE)) return NULL;
        serve_ready(es);
        if (es->n_msgs == seen) continue; /* no dispatch (a connection, an offer): no spin */
        uint64_t t0 = st_time_ns(), t_turn = t0;
        seen = es->n_msgs;
        while (es->tp && st_time_ns() - t0 < spin) {
            int moved = st_tp_poll(es->tp); /* a reply's rendezvous moves only while both sides progress */
            serve_ready(es);
            uint64_t now = st_time_ns();
            if (moved || es->n_msgs != seen) seen = es->n_msgs, t0 = now;
            if (now - t_turn > 1000000) {
                if (!uv_run(&es->dloop, UV_RUN_NOWAIT)) return NULL;
                serve_ready(es);
                t_turn = now;
            }
        }
    }
}

/* ---------------------------------------------------------------- same-host links */

/* One same-host worker's channel and the thread that makes and serves it. Freed when its three holders
 * let go: the thread (once it left), the OFFER (its send's callback, or the data thread when there is none
 * to send) and the UCX endpoint (its loss callback, or the server's teardown). */
typedef struct shm_link {
    es_t *es;
    st_xfer_chan_t *ch; /* the thread's; NULL until it made it and once it destroyed it (under mu) */
    st_tp_ep_t *ep;     /* the worker's connection; NULL once lost (data thread) */
    uint32_t n_slots;   /* the channel asked for */
    size_t req, rep;
    int ready;          /* the thread made the channel (1) or could not (-1); under mu */
    int offered;        /* the data thread took the ready link (data thread) */
    int lost;           /* the worker's connection is gone (under mu) */
    st_tp_send_req_t offer;
    uint8_t handle[ST_XFER_HANDLE_BYTES];
    uint32_t magic;     /* the OFFER's header */
    slot_t slot;        /* compute_one's view of the request being served (thread only) */
#ifdef STRATA_WITH_CUDA
    st_es_gpu_peer_t *peer; /* [n_slots] the worker's device memory per slot (wire.h PEER; thread only) */
#endif
    uint64_t done_ns;   /* when the thread answered its last request (thread only) */
    int refs;           /* under mu */
    struct shm_link *next;
} shm_link_t;

static void link_put(shm_link_t *l) {
    es_t *es = l->es;
    pthread_mutex_lock(&es->mu);
    int last = --l->refs == 0;
    if (last)
        for (shm_link_t **pp = &es->links; *pp; pp = &(*pp)->next)
            if (*pp == l) {
                *pp = l->next;
                break;
            }
    pthread_mutex_unlock(&es->mu);
    if (!last) return;
#ifdef STRATA_WITH_CUDA
    free(l->peer);
#endif
    free(l);
}

/* A worker's device memory for slot k (wire.h PEER): opened (replacing the slot's earlier one), or
 * the reason it cannot be, in s (the answer: a COMBINE of no rows, or an ERROR; the worker then
 * sends that slot's rows through the channel). */
static void link_peer(shm_link_t *l, uint32_t k, const void *payload, size_t len, slot_t *s) {
    es_t *es = l->es;
    st_wire_peer_t w;
    s->result = st_wire_peer_check(payload, len, &w);
#ifdef STRATA_WITH_CUDA
    if (s->result == ST_OK && (!es->gpu || !l->peer)) s->result = ST_FAIL(ST_ERR_UNSUPPORTED, "no device here");
    if (s->result == ST_OK) {
        busy_take(es);
        st_es_gpu_peer_close(es->gpu, &l->peer[k]);
        s->result = st_es_gpu_peer_open(es->gpu, &w, &l->peer[k]);
        busy_give(es);
    }
#else
    if (s->result == ST_OK) s->result = ST_FAIL(ST_ERR_UNSUPPORTED, "no device here");
#endif
    s->n_out = 0;
    if (s->result != ST_OK)
        snprintf(s->err, sizeof s->err, "no device memory shared: %s", st_err_last());
    else
        st_log_info("expert %s: a same-host worker's slot %u reads and writes its device memory in place", es->o.name,
                    k);
}

/* Serve one request of slot k in place and answer it. */
static void link_serve(shm_link_t *l, uint32_t k, const st_xfer_msg_t *m) {
    es_t *es = l->es;
    slot_t *s = &l->slot;
    s->in = (uint8_t *)m->payload; /* NOTE: the request slot, read in place (the worker waits for our reply) */
    s->out = st_xfer_chan_rep_buf(l->ch, k);
    /* time at the server starts when the worker posted it (one clock on one host) if this thread was
     * still serving the previous request then (that wait is the server's), else when this thread saw it
     * (its wake-up is the transport's) */
    uint64_t now = st_time_ns();
    s->t_arrive = m->sent_ns < l->done_ns ? m->sent_ns : now;
    s->result = ST_OK;
    bool hdr_ok =
        m->hdr_len == sizeof(st_wire_header_t) && st_wire_header_decode(m->hdr, m->hdr_len, m->len, &s->info) == ST_OK;
#ifdef STRATA_WITH_CUDA
    s->peer = l->peer && l->peer[k].base ? &l->peer[k] : NULL;
#endif
    if (hdr_ok && s->info.kind == ST_WIRE_KIND_PEER) {
        link_peer(l, k, m->payload, m->len, s);
    } else if (!hdr_ok || s->info.kind != ST_WIRE_KIND_DISPATCH) {
        /* answered, so the worker fails this dispatch now instead of at its deadline */
        memset(&s->info, 0, sizeof s->info);
        s->result = ST_ERR_PROTOCOL;
        snprintf(s->err, sizeof s->err, "malformed dispatch header: %s", st_err_last());
    } else if (s->info.row_width != (uint32_t)st_config_expert_width(st_ckpt_config(es->ck))) {
        s->result = ST_ERR_PROTOCOL;
        snprintf(s->err, sizeof s->err, "row width %u, this model's experts work at %d", s->info.row_width,
                 st_config_expert_width(st_ckpt_config(es->ck)));
    } else {
        busy_take(es);
        compute_one(es, s);
        busy_give(es);
    }
    st_wire_header_t h;
    size_t len = 0;
    if (!reply_header(s, &h, &len) || st_xfer_chan_reply(l->ch, k, &h, sizeof h, len) != ST_OK)
        st_log_warn("expert %s: no reply to a same-host dispatch: %s", es->o.name, st_err_last());
    __atomic_add_fetch(&es->served, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&es->rows, s->result == ST_OK ? s->info.token_count : 0, __ATOMIC_RELAXED);
    l->done_ns = st_time_ns();
}

/* The channel a worker asked for (link_main, before it serves): making and page-locking hundreds of
 * MB takes about a second, which the data thread cannot spend (dispatches would wait). */
static st_status_t link_make(shm_link_t *l) {
    es_t *es = l->es;
    st_xfer_chan_t *ch = NULL;
    st_status_t rc = st_xfer_chan_create(l->n_slots, l->req, l->rep, &ch);
#if defined(STRATA_WITH_CUDA) && defined(STRATA_XFER_GPU)
    /* rows go between the slots and the device by DMA, as from the pinned UCX slots */
    if (rc == ST_OK && es->gpu && st_xfer_chan_gpu_map(ch) != ST_OK)
        st_log_warn("expert %s: a same-host channel is not page-locked (copies stay synchronous): %s", es->o.name,
                    st_err_last());
#endif
    if (rc == ST_OK) {
        st_xfer_chan_label(ch, "a same-host attention worker");
        rc = st_xfer_chan_export(ch, l->handle);
    }
    if (rc != ST_OK) {
        st_log_warn("expert %s: no same-host channel for a worker (it stays on UCX): %s", es->o.name, st_err_last());
        st_xfer_chan_destroy(ch);
        ch = NULL;
    }
    pthread_mutex_lock(&es->mu);
    l->ch = ch;
    l->ready = ch ? 1 : -1;
    if (ch && (l->lost || es->stop))
        st_xfer_chan_abort(ch, l->lost ? "the worker's connection was lost" : "the expert server is stopping");
    pthread_mutex_unlock(&es->mu);
    uv_async_send(&es->async); /* the data thread sends the offer (on_async) */
    return ch ? ST_OK : ST_ERR_NO_MEMORY;
}

static void *link_main(void *arg) {
    shm_link_t *l = arg;
    es_t *es = l->es;
    st_cpu_data_thread("st-link");
    if (link_make(l) == ST_OK) {
        for (;;) {
            uint32_t k;
            st_xfer_msg_t m;
            st_status_t rc = st_xfer_chan_next(l->ch, 200, &k, &m);
            if (rc == ST_ERR_TIMEOUT) continue; /* idle; a stop or the worker's loss aborts the channel */
            if (rc != ST_OK) break;             /* aborted, the worker exited, or it broke the channel (logged) */
            link_serve(l, k, &m);
        }
#ifdef STRATA_WITH_CUDA
        if (es->gpu) { /* its cached dispatch graphs may name the channel's memory, or the worker's */
            busy_take(es);
            st_es_gpu_forget(es->gpu);
            for (uint32_t k = 0; l->peer && k < l->n_slots; k++)
                st_es_gpu_peer_close(es->gpu, &l->peer[k]);
            busy_give(es);
        }
#endif
        pthread_mutex_lock(&es->mu);
        st_xfer_chan_t *ch = l->ch;
        l->ch = NULL;
        pthread_mutex_unlock(&es->mu);
        st_xfer_chan_destroy(ch); /* unmapped; the name was unlinked when the worker opened it (or now) */
        st_log_info("expert %s: same-host link to a worker closed: %s", es->o.name, st_err_last());
    }
    link_put(l);
    pthread_mutex_lock(&es->mu);
    es->n_link_threads--;
    pthread_cond_broadcast(&es->cv);
    pthread_mutex_unlock(&es->mu);
    return NULL;
}

static void offer_sent(st_tp_send_req_t *req, st_status_t st) {
    shm_link_t *l = req->user;
    if (st != ST_OK) { /* the worker stays on UCX; the link ends with its connection */
        pthread_mutex_lock(&l->es->mu);
        if (l->ch) st_xfer_chan_abort(l->ch, "the offer was not delivered");
        pthread_mutex_unlock(&l->es->mu);
    }
    link_put(l);
}

static st_tp_recv_t *hello_begin(void *arg, st_tp_ep_t *ep, const void *hdr, size_t hdr_len, size_t len) {
    es_t *es = arg;
    if (len != 0) return NULL;
    for (int i = 0; i < 4; i++)
        if (!es->hello_busy[i]) {
            es->hello_busy[i] = 1;
            es->hello_recv[i].buf = es->hello_buf;
            es->hello_recv[i].cap = sizeof es->hello_buf;
            es->hello_recv[i].user = (void *)(intptr_t)i;
            return &es->hello_recv[i];
        }
    return NULL; /* the worker stays on UCX */
}

/* A worker asks for the same-host path: on this host, a channel (a slot per micro-batch, requests as
 * large as both sides allow, replies as large as ours), made by its own thread (link_make), whose
 * handle the data thread sends back once it exists (offers_send). */
static void hello_done(void *arg, st_tp_recv_t *r) {
    es_t *es = arg;
    es->hello_busy[(int)(intptr_t)r->user] = 0;
    st_xfer_hello_t h;
    if (r->status != ST_OK || !r->ep || es->stop || st_tp_ep_user(r->ep)) return;
    if (st_xfer_hello_check(r->hdr, r->hdr_len, &h) != ST_OK) {
        st_log_info("expert %s: a worker stays on UCX: %s", es->o.name, st_err_last());
        return;
    }
    shm_link_t *l = calloc(1, sizeof *l);
    if (!l) return;
    *l = (shm_link_t){.es = es, .ep = r->ep, .n_slots = h.n_slots, .magic = ST_XFER_HELLO_MAGIC,
                      .slot = {.es = es, .idx = -1}, .refs = 3};
    l->req = h.req_bytes < es->cap ? (size_t)h.req_bytes : es->cap;
#ifdef STRATA_WITH_CUDA
    if (es->gpu) l->peer = calloc(h.n_slots, sizeof *l->peer); /* NULL: the worker's PEER is refused */
#endif
    l->rep = es->cap + ST_WIRE_MAX_ERROR_TEXT;
    pthread_t th;
    pthread_mutex_lock(&es->mu);
    int ok = pthread_create(&th, NULL, link_main, l) == 0;
    if (ok) {
        pthread_detach(th);
        es->n_link_threads++;
        l->next = es->links;
        es->links = l;
    }
    pthread_mutex_unlock(&es->mu);
    if (!ok) {
        st_log_warn("expert %s: no same-host channel for a worker (it stays on UCX): no link thread", es->o.name);
#ifdef STRATA_WITH_CUDA
        free(l->peer);
#endif
        free(l);
        return;
    }
    st_tp_ep_set_user(r->ep, l);
}

/* Data thread: the offers of the links whose channel is made (or could not be: nothing to send). */
static void offers_send(es_t *es) {
    for (;;) {
        shm_link_t *l;
        pthread_mutex_lock(&es->mu);
        for (l = es->links; l && (l->offered || !l->ready); l = l->next) {}
        if (l) l->offered = 1;
        pthread_mutex_unlock(&es->mu);
        if (!l) return;
        if (l->ready < 0 || !l->ep) { /* no channel, or no worker to offer it to */
            link_put(l);
            continue;
        }
        l->offer.cb = offer_sent;
        l->offer.user = l;
        if (st_tp_send(l->ep, ST_WIRE_AM_SHM_OFFER, &l->magic, sizeof l->magic, l->handle, sizeof l->handle, &l->offer) !=
            ST_OK)
            offer_sent(&l->offer, ST_ERR_PEER);
        else
            st_log_info("expert %s: a worker on this host gets a shared-memory channel (%u slots of %zu + %zu bytes)",
                        es->o.name, l->n_slots, l->req, l->rep);
    }
}

static void on_lost(st_tp_ep_t *ep, st_status_t why, void *arg) {
    es_t *es = arg;
    int n = 0;
    for (int i = 0; i < es->o.slots; i++)
        if (es->slots[i].ep == ep) {
            es->slots[i].ep = NULL;
            n++;
        }
    st_log_info("expert: attention worker disconnected (%s); %d replies dropped", st_status_str(why), n);
    shm_link_t *l = st_tp_ep_user(ep);
    if (l) {
        l->ep = NULL;
        pthread_mutex_lock(&es->mu);
        l->lost = 1;
        if (l->ch) st_xfer_chan_abort(l->ch, "the worker's connection was lost");
        pthread_mutex_unlock(&es->mu);
        link_put(l);
    }
}

static void on_accept(st_tp_t *tp, st_tp_ep_t *ep, void *arg) { st_tp_ep_on_lost(ep, on_lost, arg); }

static void on_placement(void *arg, const st_proto_placement_t *p) {
    es_t *es = arg;
    uint64_t me = st_member_id(es->mem);
    size_t held = 0;
    for (size_t i = 0; i < p->n_member_ids; i++) held += p->member_ids[i] == me;
    if (es->want && p->offsets && (size_t)p->n_layers * p->n_experts == es->n_want) {
        pthread_mutex_lock(&es->mu);
        for (size_t i = 0; i < es->n_want; i++) {
            unsigned char w = 0;
            for (uint32_t j = p->offsets[i]; j < p->offsets[i + 1] && j < p->n_member_ids; j++) w |= p->member_ids[j] == me;
            es->want[i] = w;
        }
        es->bind_next = 0; /* the upload thread uploads what is not resident yet */
        es->placed = 1;
        pthread_cond_signal(&es->cv);
        pthread_mutex_unlock(&es->mu);
    }
    st_log_info("expert %s: placement v%llu assigns %zu (layer, expert) pairs here", es->o.name,
                (unsigned long long)p->version, held);
}

static void on_member_stopped(void *arg) {
    es_t *es = arg;
    st_rpc_cleanup();
    uv_close((uv_handle_t *)&es->sig_int, NULL);
    uv_close((uv_handle_t *)&es->sig_term, NULL);
    uv_async_send(&es->async); /* the data thread closes UCX (es->stop is set) and leaves */
}

static void on_signal(uv_signal_t *h, int sig) {
    es_t *es = h->data;
    if (es->stop) return;
    unsigned long long replays = 0, direct = 0, leaf_dev = 0;
    char split[400] = "";
#ifdef STRATA_WITH_CUDA
    if (es->gpu) {
        st_es_gpu_counts_t n;
        st_es_gpu_counts(es->gpu, &n);
        replays = n.replays, direct = n.direct, leaf_dev = n.leaf_dev;
        pthread_mutex_lock(&es->mu); /* the split is the compute's: read between dispatches, never waiting */
        int idle = !es->busy;
        es->busy |= idle;
        pthread_mutex_unlock(&es->mu);
        if (idle) {
            st_es_gpu_split(es->gpu, split, sizeof split);
            busy_give(es);
        }
    }
#endif
    st_log_info("expert %s: signal %d, stopping (%llu dispatches, %llu rows served; %llu by a graph replay, %llu "
                "without copying rows, %llu with the leaf table on the device)%s%s",
                es->o.name, sig, (unsigned long long)es->served, (unsigned long long)es->rows, replays, direct,
                leaf_dev, split[0] ? "; per dispatch, host tables / launches / device / at the server: " : "", split);
    pthread_mutex_lock(&es->mu);
    es->stop = 1;
    for (shm_link_t *l = es->links; l; l = l->next)
        if (l->ch) st_xfer_chan_abort(l->ch, "the expert server is stopping");
    pthread_cond_broadcast(&es->cv);
    pthread_mutex_unlock(&es->mu);
    st_member_stop(es->mem, on_member_stopped, es);
}

int st_es_run(const st_es_opts_t *opts) {
    es_t *es = calloc(1, sizeof *es);
    if (!es) return 1;
    es->o = *opts;
    if (es->o.max_rows <= 0) es->o.max_rows = 4096;
    if (es->o.slots <= 0) es->o.slots = 16;
    if (!es->o.host) es->o.host = "127.0.0.1";
    if (!es->o.name) es->o.name = "expert";
    st_xfer_set_spin(es->o.use_cuda);
    int rc = 1;
    if (st_ckpt_open(&es->ck, es->o.ckpt) != ST_OK) goto out;
    const st_config_t *c = st_ckpt_config(es->ck);
    if (c->n_experts <= 0) {
        ST_FAIL(ST_ERR_CONFIG, "%s has no routed experts", es->o.ckpt);
        goto out_ck;
    }
    if (es->o.use_cuda) {
#ifdef STRATA_WITH_CUDA
        if (st_es_gpu_create(&es->gpu, es->ck, es->o.cuda_device, es->o.max_rows) != ST_OK) goto out_ck;
        char dev[256];
        st_gpu_describe(dev, sizeof dev);
        st_log_info("expert %s: compute on cuda:%d (%s), placed experts uploaded as bf16 between dispatches", es->o.name,
                    es->o.cuda_device, dev);
        es->n_want = (size_t)c->n_layers * (size_t)c->n_experts;
        if (!(es->want = calloc(es->n_want, 1))) {
            ST_FAIL(ST_ERR_NO_MEMORY, "expert: placement table");
            goto out_ck;
        }
#else
        ST_FAIL(ST_ERR_CONFIG, "--device cuda:%d: built without CUDA", es->o.cuda_device);
        goto out_ck;
#endif
    } else if (st_es_compute_init(&es->cx, es->ck, es->o.max_rows) != ST_OK)
        goto out_ck;
    /* the largest dispatch: distinct fp32 rows, every row distinct (≥ plain or bf16 rows, ≥ the reply) */
    es->cap = st_wire_dispatch_bytes((uint32_t)es->o.max_rows, (uint32_t)c->n_experts,
                                     (uint32_t)st_config_expert_width(c), (uint32_t)es->o.max_rows, false);
    es->slots = calloc((size_t)es->o.slots, sizeof(slot_t));
    es->ready = calloc((size_t)es->o.slots, sizeof(int));
    if (!es->slots || !es->ready) goto out_slots;
#ifdef STRATA_WITH_CUDA
    /* GPU: slot buffers pinned, so the rows go between them and the device by DMA, with no host copy */
    if (es->gpu &&
        st_gpu_arena_init(&es->pinned, (size_t)es->o.slots * (2 * es->cap + ST_WIRE_MAX_ERROR_TEXT + 512), 1) != ST_OK)
        goto out_slots;
#endif
    for (int i = 0; i < es->o.slots; i++) {
        es->slots[i] = (slot_t){.es = es, .idx = i};
#ifdef STRATA_WITH_CUDA
        if (ST_ES_PINNED(es)) {
            es->slots[i].in = st_gpu_arena_alloc(&es->pinned, es->cap);
            es->slots[i].out = st_gpu_arena_alloc(&es->pinned, es->cap + ST_WIRE_MAX_ERROR_TEXT);
        } else
#endif
        {
            es->slots[i].in = malloc(es->cap);
            es->slots[i].out = malloc(es->cap + ST_WIRE_MAX_ERROR_TEXT);
        }
        if (!es->slots[i].in || !es->slots[i].out) {
            ST_FAIL(ST_ERR_NO_MEMORY, "expert: %d slots of %zu bytes", es->o.slots, es->cap);
            goto out_slots;
        }
    }
    /* the kernels' threads exist: this thread and the libraries' threads to the control CPUs */
    char who[96];
    snprintf(who, sizeof who, "expert %s", es->o.name);
    st_cpu_control(who);
    uv_loop_init(&es->loop);
    uv_loop_init(&es->dloop);
    pthread_mutex_init(&es->mu, NULL);
    pthread_cond_init(&es->cv, NULL);
    uv_async_init(&es->dloop, &es->async, on_async);
    es->async.data = es;
    uint16_t port = 0;
    if (st_rpc_init(&es->loop) != ST_OK) goto out_loop;
    /* NOTE: made and set up here, before the data thread runs its loop (the thread's start orders it) */
    if (st_tp_create(&es->dloop, &es->tp) != ST_OK) goto out_rpc;
    const st_sec_opts_t *sec = es->o.sec;
    if (sec && sec->have_secret) st_tp_set_secret(es->tp, &sec->secret); /* workers must prove it */
    if (st_tp_set_am_handler(es->tp, ST_WIRE_AM_DISPATCH, am_begin, am_done, es) != ST_OK ||
        st_tp_set_am_handler(es->tp, ST_WIRE_AM_SHM_HELLO, hello_begin, hello_done, es) != ST_OK ||
        st_tp_listen(es->tp, es->o.host, es->o.port, on_accept, es, &port) != ST_OK)
        goto out_tp;
    char endpoint[300];
    snprintf(endpoint, sizeof endpoint, "%s:%u", es->o.host, port);
    if (sec)
        es->rpc_sec = (st_rpc_sec_t){.token = sec->have_secret ? sec->grpc_token : NULL,
                                     .tls = sec->tls,
                                     .tls_ca = sec->tls_ca,
                                     .tls_cert = sec->tls_cert, /* mTLS when given */
                                     .tls_key = sec->tls_key};
    st_member_opts_t mo = {.role = ST_PROTO_ROLE_EXPERT, .name = es->o.name, .data_endpoint = endpoint,
                           .capacity = (uint32_t)es->o.max_rows, .coordinator = es->o.coordinator,
                           .coordinator_file = es->o.coordinator_file,
                           .sec = sec ? &es->rpc_sec : NULL, .on_placement = on_placement, .arg = es};
    if (pthread_create(&es->dth, NULL, data_main, es) != 0) {
        ST_FAIL(ST_ERR_INTERNAL, "expert: no data thread");
        goto out_tp;
    }
    if (st_member_start(&es->loop, &mo, &es->mem) != ST_OK) {
        pthread_mutex_lock(&es->mu);
        es->stop = 1;
        pthread_mutex_unlock(&es->mu);
        uv_async_send(&es->async);
        pthread_join(es->dth, NULL); /* UCX closed, the data loop ended */
        st_rpc_cleanup();
        goto out_loops;
    }
#ifdef STRATA_WITH_CUDA
    es->uth_on = es->gpu && pthread_create(&es->uth, NULL, upload_main, es) == 0;
    if (es->gpu && !es->uth_on) st_log_warn("expert %s: no upload thread: experts upload when first used", es->o.name);
#endif
    st_log_info("expert %s: serving %s on UCX %s, %d slots × %d rows, %s", es->o.name, es->o.ckpt, endpoint,
                es->o.slots, es->o.max_rows,
                sec && sec->have_secret ? "workers prove the cluster secret" : "no data-plane authentication");
    st_member_serve(&es->loop, &es->sig_int, &es->sig_term, on_signal, es, es->dth, "expert", es->o.name, endpoint);
    if (es->uth_on) pthread_join(es->uth, NULL); /* it left at the stop's broadcast */
    /* the link threads leave within a slice of their abort (at the stop, or here); then the links go */
    pthread_mutex_lock(&es->mu);
    for (shm_link_t *l = es->links; l; l = l->next)
        if (l->ch) st_xfer_chan_abort(l->ch, "the expert server is stopping");
    while (es->n_link_threads > 0) pthread_cond_wait(&es->cv, &es->mu);
    shm_link_t *links = es->links;
    es->links = NULL;
    pthread_mutex_unlock(&es->mu);
    while (links) {
        shm_link_t *next = links->next;
        free(links);
        links = next;
    }
    rc = 0;
    goto out_loop_closed;
out_tp:
    st_tp_destroy(es->tp);
out_rpc:
    st_rpc_cleanup();
out_loop:
    uv_close((uv_handle_t *)&es->async, NULL);
out_loops:
    uv_run(&es->dloop, UV_RUN_DEFAULT);
    uv_run(&es->loop, UV_RUN_DEFAULT);
out_loop_closed:
    uv_loop_close(&es->dloop);
    uv_loop_close(&es->loop);
out_slots:
    for (int i = 0; es->slots && i < es->o.slots && !ST_ES_PINNED(es); i++) {
        free(es->slots[i].in);
        free(es->slots[i].out);
    }
#ifdef STRATA_WITH_CUDA
    if (es->pinned.base) st_gpu_arena_cleanup(&es->pinned);
#endif
    free(es->slots);
    free(es->ready);
    st_es_compute_cleanup(&es->cx);
#ifdef STRATA_WITH_CUDA
    st_es_gpu_destroy(es->gpu);
#endif
out_ck:
    free(es->want);
    st_ckpt_close(es->ck);
out:
    if (rc) fprintf(stderr, "strata-expert: %s\n", st_err_last());
    free(es);
    return rc;
}
