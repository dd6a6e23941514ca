/* Attention worker (see worker.h).
 *
 * Threads. The loop thread owns the control plane: gRPC (Worker.Generate, membership), request
 * calls. The compute thread owns the engine, the sequences and the scheduler, and the data plane:
 * a libuv loop of its own (dloop) with UCX (the expert servers' endpoints), the expert-server table
 * and the placement it follows. So a dispatch is sent, and its reply landed, by the thread that
 * packs and unpacks it: no hand-off per layer. The compute thread runs dloop whenever it waits
 * (polled without sleeping for the data path's spin, XFER_SPIN_US, then asleep on UCX's event fd, the
 * wake-up async or a deadline). The two threads meet under `mu`:
 *   inbox   loop → compute: new requests, cancellations, a new placement (woken by `dwake`);
 *   outbox  compute → loop: token chunks, finishes, score reports (woken by uv_async).
 * Every wait on the network is bounded by expert_timeout_ms. A server that fails or times out is
 * retried once on a replica; tokens with no live holder fail only their own sequences.
 *
 * Same-host servers (common/xfer): after connecting, the worker sends the server a hello (boot id);
 * a server on this host answers with a shared-memory channel (a slot per micro-batch). From then on
 * the compute thread packs that server's dispatches straight into its request slot, rings its
 * doorbell, and waits on the reply slot's flag itself (spin, then futex; bounded): no uv_async, no
 * condvar, no copy into a send buffer. The UCX connection stays for the hello and as the liveness
 * signal (its loss aborts the channel); servers elsewhere stay on UCX.
 *
 * Requests are range-checked on the loop before anything is sized from them (st_aw_check_request);
 * a client's mistake ends the call with INVALID_ARGUMENT / OUT_OF_RANGE and a full or draining
 * worker with RESOURCE_EXHAUSTED, both before any chunk, so the coordinator can answer 400 or queue
 * and retry. With a cluster secret the gRPC port takes only the coordinator's member token. */
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <uv.h>

#include "dispatch.h"
#include "mbtune.h"
#include "strata/member.h"
#include "strata/proto.h"
#include "strata/quantile.h"
#include "strata/rpc.h"
#include "strata/transport.h"
#include "strata/wire.h"
#include "strata/xfer.h"
#include "worker.h"

/* Expert-server table: slots are recycled (a server that leaves the placement is closed and its slot
 * reused once the compute thread has moved past it), and only servers that hold experts in the
 * current placement take one, so no flood of registrations fills it for good. */
#define MAX_SERVERS 64
#define MAX_MB ST_MBT_MAX /* micro-batches in flight per step (--micro-batches) */
/* One step's ReportScores stays under 64 KB (issue 16): the summaries share ST_QSUM_DEFAULT_BUDGET,
 * the loads take what is left after REPORT_FIXED bytes of the other fields and framing. */
#define REPORT_BUDGET 65536u
#define REPORT_FIXED 1024u
enum { MB_DONE, MB_LAUNCHED, MB_AT_EXPERTS }; /* a micro-batch's state within a step */
#define MAX_STOP 16
/* A same-host dispatch's bf16 rows of at least ZRUN_MIN_BYTES in at most ZRUN_MAX runs of
 * consecutive tokens go from the device into the request slot by the copy engine (one D2H copy a run
 * and a stream sync, ~10-20 µs) instead of through the host's pinned copy row by row (8 MiB at an 8K
 * prefill on `small`: ~1.8 ms a layer, measured on the H200 host, 2026-12-03). */
#define ZRUN_MIN_BYTES (512u << 10)
#define ZRUN_MAX 64
/* A hand-off of at least this many routed slots (T·kc) is planned on the device (st_engine_mb_plan):
 * the host's plan costs ~10 ns a slot (0.6–0.7 ms at an 8K prefill's 65 536), the device's two round
 * trips a few tens of µs whatever the size */
#define PLAN_DEV_MIN_SLOTS 8192

enum { P_IDLE = 0, P_QUEUED, P_SENT, P_DONE, P_FAILED };
enum { EV_CHUNK = 1, EV_REPORT, EV_END };
enum { SRV_FREE = 0, SRV_USED, SRV_RETIRED }; /* srv_t.state */
enum { IN_NEW = 1, IN_CANCEL };

typedef struct aw aw_t;

typedef struct {
    uint64_t id;
    char name[64], endpoint[128];
    uint32_t capacity; /* rows per dispatch it accepts */
    st_tp_ep_t *ep;    /* compute thread only */
    int alive;         /* under mu */
    int state;         /* SRV_*; changed by the table (compute thread) under mu */
    uint64_t retired_gen; /* SRV_RETIRED: reusable once the compute thread applied this placement */
    /* same host: the channel (set by channel_attach and taken away by srv_reap, under mu; used by the
     * compute thread while a pend names it) and the records of the hello / offer exchange */
    st_xfer_chan_t *chan;
    bool chan_read;    /* the engine's device reads replies in the channel where they lie (st_engine_host_map) */
    uint32_t chan_peer; /* bit mb: the server opened micro-batch mb's device memory (wire.h ST_WIRE_FLAG_PEER):
                         * its dispatches' rows and replies stay on the device (set with chan, under mu) */
    st_tp_send_req_t hello;
    st_tp_recv_t offer;
    int hello_busy, offer_busy;
    uint64_t conn;     /* this slot's connections so far (under mu): an attach made for an earlier one is dropped */
    uint8_t offer_buf[ST_XFER_HANDLE_BYTES];
} srv_t;

typedef struct {
    aw_t *aw;
    int mb, s, state; /* state under mu */
    uint64_t seq;
    st_wire_header_t hdr;
    uint8_t *sbuf, *rbuf;
    bool rbuf_read; /* rbuf: the engine's device reads replies there in place (st_engine_host_alloc) */
    bool rcopy;     /* the reply's rows are to be copied into the work's rows (set with the dispatch) */
    size_t slen, cap;
    size_t rlen;
    st_tp_send_req_t send;
    int send_busy; /* UCX still holds `send` */
    int recv_busy; /* UCX is landing a reply in rbuf */
    int soft;      /* failed by an answer (error reply, capacity), not by the server going away */
    st_xfer_chan_t *chan;  /* same host: the channel this dispatch went through (set with state, under mu) */
    const uint8_t *rview;  /* same host: the reply in the channel's slot (else it is in rbuf) */
    bool peer;             /* the dispatch went through the engine's device memory: its output rows are in
                            * aw->peer[mb]'s reply region from reply_row */
    uint32_t reply_row;
    double t_sent, t_recv; /* when UCX took the dispatch, when the reply came (am_begin, am_done) */
    double t_seen;         /* when this thread saw the reply's header (am_begin) */
    st_tp_recv_t recv;
    char err[256];
} pend_t;

#define EV_INLINE 1024 /* a token chunk without logits fits, logprobs included (≤ 20 top: < 256 bytes) */

/* compute → loop events, from a pool sized at start-up (no allocation per token) */
typedef struct ev {
    struct ev *next;
    int kind, req, mb, s;
    uint64_t gen;
    uint8_t *bytes; /* inl, a report buffer, or malloc'd (a --dump-logits chunk) */
    size_t len;
    int finish, heap, rep;
    st_status_t status; /* EV_END: how the call ends (text in inl) */
    uint8_t inl[EV_INLINE];
} ev_t;

typedef struct in_msg {
    struct in_msg *next;
    int kind, req;
    uint64_t gen;
    int n_prompt, max_tokens; /* IN_NEW: checked by st_aw_check_request */
    st_proto_generate_req_t r;
} in_msg_t;

typedef struct {
    int used;
    uint64_t gen;
    st_rpc_call_t *call; /* loop only; NULL once cancelled or finished */
} req_t;

typedef struct {
    int used, req, slot;
    uint64_t gen;
    int *toks, n_prompt, n_gen, max_tokens;
    /* sampling on the engine (st_seq_chunk_t.sample): sp.pos is set per step, sp.bias_* point into
     * bias (owned: ids then values, NULL without logit_bias); tok receives the step's token, and
     * with logprobs (sp.n_top ≥ 0) lp, top_ids, top_lp its logprob and the sp.n_top top ones */
    st_sample_params_t sp;
    void *bias;
    int tok;
    float lp;
    int top_ids[ST_SAMPLE_MAX_TOP];
    float top_lp[ST_SAMPLE_MAX_TOP];
    uint32_t stop[MAX_STOP];
    int n_stop, dump, prefilled, cancelled, failed, ignore_eos;
    int n_fed; /* prompt tokens fed to the engine so far (chunked prefill) */
    char err[256];
} seq_t;

struct aw {
    st_aw_opts_t o;
    uv_loop_t loop;
    uv_async_t async;
    uv_signal_t sig_int, sig_term;
    uv_timer_t retry_timer; /* re-applies the last placement while some holders have no slot */
    uv_timer_t flush_timer; /* after a drain: lets the last chunks leave before the server closes */
    st_aw_limits_t lim;
    st_rpc_sec_t member_sec; /* toward the coordinator (kept: the member may reconnect) */
    int secure;              /* a cluster secret: Worker/Generate needs the coordinator's member token */
    char boot_token[65];     /* random: what Worker/Generate requires until the coordinator's arrives */
    st_ckpt_t *ck;
    const st_config_t *c;
    st_engine_t *e;
    st_engine_mb_t *mbs[MAX_MB];
    st_engine_peer_mem_t peer[MAX_MB]; /* each micro-batch's device memory for same-host servers; reply NULL:
                                        * none (a CPU engine) */
    bool peer_off;                     /* compute thread: a server that shared it failed unanswered (remote_finish) */
    st_tp_t *tp;                       /* on dloop */
    uv_loop_t dloop;                   /* the compute thread's: UCX, the server table's timer, dwake */
    uv_async_t dwake;                  /* wakes the compute thread (inbox, placement, signals) */
    uv_timer_t dtimer;                 /* bounds a sleep of the compute thread */
    int dl_closed;                     /* under mu: dwake is closed (the compute thread left) */
    int dl_asleep;                     /* compute thread: in a blocking turn of dloop (dl_sleep) */
    double t_polled;                   /* compute thread: when its last poll of the data path ended */
    uint8_t *place_in;                 /* under mu: the newest map (encoded), for the compute thread */
    size_t place_in_len;
    st_rpc_server_t *rpc;
    st_member_t *mem;
    int rpc_port;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop, compute_done;
    int draining;          /* under mu: SIGTERM seen; new requests refused */
    double drain_deadline; /* under mu */
    /* shared under mu */
    ev_t *ev_pool, *ev_free;
    pthread_cond_t cv_ev;          /* an event went back to the pool */
    uint8_t *rep_buf[2];           /* ReportScores encodings, double-buffered */
    size_t rep_cap;
    int rep_busy[2];
    in_msg_t *in_head, *in_tail;
    ev_t *ev_head, *ev_tail;
    srv_t srv[MAX_SERVERS]; /* compute thread; fields the loop thread reads under mu */
    int n_srv;      /* slots ever used (high-water mark; never shrinks); a slot's state says whether it
                     * holds a server */
    int *holders;   /* [n_layers][n_experts][R] server indices, -1 none */
    int R;
    uint64_t place_gen, place_applied; /* local placement generations: applied to the table / copied
                                        * for the steps (both by the compute thread, at different times) */
    uint64_t place_version;            /* the coordinator's version of the newest map */
    char srv_full[200];                /* non-empty while holders were left out: the table is full */
    /* the newest map (encoded) while some holders wait for a slot */
    uint8_t *place_copy;
    size_t place_copy_len;
    uint32_t retry_ms;
    pend_t pend[MAX_MB][MAX_SERVERS];
    req_t *reqs;    /* [max_seqs * 2] */
    int n_reqs;
    uint32_t active;
    /* compute thread only */
    seq_t *seqs;    /* [max_seqs] */
    in_msg_t *wait_head, *wait_tail; /* admitted to the worker, waiting for a sequence slot */
    double map_wait_since;
    int *hl;        /* private copy of holders */
    int *server_of[MAX_MB], *server_of2; /* [n_experts] */
    st_dispatch_plan_t plan[MAX_MB], plan2;
    /* plan[m]'s rows of its first plan_pinned[m] servers page-locked for the device's copies (a plan
     * built there), grown as servers come; −1: that failed, the copies go through pageable memory */
    int plan_pinned[MAX_MB];
    bool *tok_failed[MAX_MB];
    float *logits[MAX_MB];
    uint64_t step, next_seq;
    uint64_t peer_seq; /* PEER messages' sequence numbers (attach threads: atomic), above the dispatches' */
    size_t pay_cap;
    /* quantile routing: thresholds from the coordinator, score summaries and loads back to it */
    float *tau_in, *rho_in;      /* [n_layers][n_experts], under mu */
    uint64_t tau_in_version;
    float *tau_cur, *rho_cur;    /* compute thread's copy */
    uint64_t tau_cur_version;
    st_qtable_t qtab;            /* view of the MoE rows of tau_cur/rho_cur */
    st_qsum_t *qsum[MAX_MB];
    uint8_t *qbuf[MAX_MB];
    size_t qcap, qlen[MAX_MB];
    int hook_mb;
    int ucx_out[MAX_MB];         /* compute thread: dispatches sent over UCX since the micro-batch's last wait */
    bool sync_mb; /* STRATA_WORKER_SYNC=1: collect each micro-batch right after its launch (comparisons) */
    uint32_t *load;              /* [n_layers][n_experts] tokens per expert this step */
    int load_next;               /* first layer of the next report's loads */
    uint64_t dispatch_bytes, reply_bytes, messages;
    double stage[ST_PROTO_STAGES]; /* seconds this step, per stage */
    double t_step;                 /* when this step's micro-batches began */
    /* a large pack's rows by the engine's copy engine (zrun_plan): runs of consecutive tokens */
    int zrun_first[ZRUN_MAX], zrun_count[ZRUN_MAX], zrun_n;
    void *zrun_dst[ZRUN_MAX];
    double t_plan[MAX_MB];         /* when each micro-batch's last plan was sent: its replies' deadline
                                    * runs from there, not from when the wait begins (so a micro-batch
                                    * waited for after another's timeout is released in time) */
    st_mbtune_t mbt;               /* micro-batches per step, by measurement */
    /* channels of servers that are gone, freed by the compute thread between steps (the engine may
     * still read replies in them until the step's end); under mu */
    struct dead_chan { st_xfer_chan_t *ch; bool read; } *chan_dead;
    int n_dead, cap_dead;
    int n_attach; /* channel_attach threads running (under mu; the teardown waits for them) */
    st_engine_stats_t est;         /* engine stats at the step's start */
    int reports_inflight;        /* loop thread */
};

/* ================================================================ request checks (pure) */

st_status_t st_aw_check_request(const st_config_t *c, const st_aw_limits_t *lim, const st_proto_generate_req_t *r,
                                int *n_prompt, int *max_tokens) {
    /* NOTE: each field is compared in its own width (size_t, uint32_t, float) against limits that
     * fit an int; only a value that passed is cast. */
    if (c->vocab <= 0 || lim->max_ctx < 2 || lim->max_prompt < 1 || lim->max_stop < 0)
        return ST_FAIL(ST_ERR_INTERNAL, "worker limits: vocab %d, max_ctx %d, max_prompt %d", c->vocab, lim->max_ctx,
                       lim->max_prompt);
    size_t cap = (size_t)ST_MIN(lim->max_prompt, lim->max_ctx - 1); /* leaves room for one token */
    uint32_t vocab = (uint32_t)c->vocab;
    size_t n;
    if (r->n_prompt_tokens) {
        n = r->n_prompt_tokens;
        if (!r->prompt_tokens) return ST_REJECT(ST_ERR_INVALID_ARG, "prompt_tokens: %zu announced, none given", n);
        if (n > cap)
            return ST_REJECT(ST_ERR_OUT_OF_RANGE, "prompt of %zu tokens exceeds this worker's limit of %zu", n, cap);
        for (size_t i = 0; i < n; i++)
            if (r->prompt_tokens[i] >= vocab)
                return ST_REJECT(ST_ERR_OUT_OF_RANGE, "prompt token %u (position %zu) outside the vocabulary 0..%u",
                                 r->prompt_tokens[i], i, vocab - 1);
    } else {
        n = r->prompt ? strnlen(r->prompt, cap + 1) : 0; /* bounded: never scans a huge prompt */
        if (n > cap)
            return ST_REJECT(ST_ERR_OUT_OF_RANGE,
                             "prompt of more than %zu bytes exceeds this worker's limit of %zu tokens", cap, cap);
        for (size_t i = 0; i < n; i++) /* text is one token per byte */
            if ((uint8_t)r->prompt[i] >= vocab)
                return ST_REJECT(ST_ERR_OUT_OF_RANGE, "prompt byte %u outside the vocabulary 0..%u",
                                 (unsigned)(uint8_t)r->prompt[i], vocab - 1);
    }
    if (n == 0) return ST_REJECT(ST_ERR_INVALID_ARG, "empty prompt");
    uint32_t room = (uint32_t)((size_t)lim->max_ctx - n); /* >= 1 */
    uint32_t mt = r->max_tokens ? r->max_tokens : ST_MIN((uint32_t)ST_AW_DEFAULT_MAX_TOKENS, room);
    if (mt > room)
        return ST_REJECT(ST_ERR_OUT_OF_RANGE, "prompt %zu + max_tokens %u exceeds the context limit %d", n,
                         r->max_tokens, lim->max_ctx);
    if (!(r->temperature >= 0.0f && r->temperature <= 100.0f)) /* NaN fails both */
        return ST_REJECT(ST_ERR_INVALID_ARG, "temperature %g outside 0..100", (double)r->temperature);
    if (!(r->top_p >= 0.0f && r->top_p <= 1.0f))
        return ST_REJECT(ST_ERR_INVALID_ARG, "top_p %g outside 0..1", (double)r->top_p);
    if (r->top_k > vocab)
        return ST_REJECT(ST_ERR_OUT_OF_RANGE, "top_k %u exceeds the vocabulary (%u)", r->top_k, vocab);
    if (r->n_stop_ids > (size_t)lim->max_stop)
        return ST_REJECT(ST_ERR_OUT_OF_RANGE, "%zu stop ids (at most %d)", r->n_stop_ids, lim->max_stop);
    if (r->n_stop_ids && !r->stop_ids)
        return ST_REJECT(ST_ERR_INVALID_ARG, "stop_ids: %zu announced, none given", r->n_stop_ids);
    for (size_t i = 0; i < r->n_stop_ids; i++)
        if (r->stop_ids[i] >= vocab)
            return ST_REJECT(ST_ERR_OUT_OF_RANGE, "stop id %u outside the vocabulary 0..%u", r->stop_ids[i], vocab - 1);
    if (!(fabsf(r->presence_penalty) <= 2.0f) || !(fabsf(r->frequency_penalty) <= 2.0f)) /* NaN fails */
        return ST_REJECT(ST_ERR_OUT_OF_RANGE, "presence/frequency penalty outside -2..2");
    if (r->n_logit_bias > ST_AW_MAX_LOGIT_BIAS || (r->n_logit_bias && (!r->logit_bias_ids || !r->logit_bias_values)))
        return ST_REJECT(ST_ERR_INVALID_ARG, "%zu logit_bias entries (at most %d)", r->n_logit_bias, ST_AW_MAX_LOGIT_BIAS);
    for (size_t i = 0; i < r->n_logit_bias; i++)
        if (r->logit_bias_ids[i] >= vocab || !(fabsf(r->logit_bias_values[i]) <= 100.0f))
            return ST_REJECT(ST_ERR_OUT_OF_RANGE, "logit_bias %u: %g (ids below %u, values -100..100)",
                             r->logit_bias_ids[i], (double)r->logit_bias_values[i], vocab);
    if (r->top_logprobs > ST_SAMPLE_MAX_TOP || (r->top_logprobs && !r->logprobs))
        return ST_REJECT(ST_ERR_OUT_OF_RANGE, "top_logprobs %u (at most %d, with logprobs)", r->top_logprobs, ST_SAMPLE_MAX_TOP);
    if (r->request_id && strnlen(r->request_id, 257) > 256)
        return ST_REJECT(ST_ERR_INVALID_ARG, "request_id over 256 bytes");
    *n_prompt = (int)n;
    *max_tokens = (int)mt;
    return ST_OK;
}

/* ================================================================ compute thread */

/* Take an event record; waits (bounded by the loop's progress) when all are in flight. */
static ev_t *ev_get(aw_t *aw) {
    pthread_mutex_lock(&aw->mu);
    while (!aw->ev_free) pthread_cond_wait(&aw->cv_ev, &aw->mu);
    ev_t *ev = aw->ev_free;
    aw->ev_free = ev->next;
    pthread_mutex_unlock(&aw->mu);
    ev->next = NULL;
    ev->heap = ev->rep = 0;
    ev->bytes = NULL;
    ev->len = 0;
    ev->finish = 0;
    return ev;
}

static void ev_put(aw_t *aw, ev_t *ev) {
    if (ev->heap) free(ev->bytes);
    pthread_mutex_lock(&aw->mu);
    if (ev->kind == EV_REPORT) aw->rep_busy[ev->rep] = 0;
    ev->next = aw->ev_free;
    aw->ev_free = ev;
    pthread_cond_signal(&aw->cv_ev);
    pthread_mutex_unlock(&aw->mu);
}

/* Wakes the compute thread wherever it waits: a turn of dloop ends (dwake), or, at the teardown, cv.
 * Under mu. */
static void wake_compute(aw_t *aw) {
    if (!aw->dl_closed) uv_async_send(&aw->dwake);
    pthread_cond_broadcast(&aw->cv);
}

static void on_dtimer(uv_timer_t *t) { (void)t; }

/* Compute thread: UCX progressed and its callbacks delivered now (no sleep); nonzero when something
 * moved. NOTE: never with mu held (the callbacks take it), here and in dl_turn / dl_sleep. */
static int dl_poll(aw_t *aw) {
    int did = st_tp_poll(aw->tp);
    aw->t_polled = st_time_sec();
    return did;
}

/* Compute thread: one turn of its data loop without sleeping (UCX, the server table's timer, dwake). */
static void dl_turn(aw_t *aw) {
    uv_run(&aw->dloop, UV_RUN_NOWAIT);
    aw->t_polled = st_time_sec();
}

/* Compute thread: one turn of its data loop, asleep until something comes or, with until >= 0, at
 * most until then (monotonic seconds). */
static void dl_sleep(aw_t *aw, double until) {
    if (until >= 0) {
        double left = until - st_time_sec();
        if (left <= 0) {
            dl_turn(aw);
            return;
        }
        uv_update_time(&aw->dloop);
        uv_timer_start(&aw->dtimer, on_dtimer, (uint64_t)ceil(left * 1e3), 0);
    }
    aw->dl_asleep = 1;
    uv_run(&aw->dloop, UV_RUN_ONCE);
    aw->dl_asleep = 0;
    aw->t_polled = st_time_sec();
    uv_timer_stop(&aw->dtimer);
}

static void post_event(aw_t *aw, ev_t *ev) {
    pthread_mutex_lock(&aw->mu);
    if (aw->ev_tail) aw->ev_tail->next = ev;
    else aw->ev_head = ev;
    aw->ev_tail = ev;
    pthread_mutex_unlock(&aw->mu);
    uv_async_send(&aw->async);
}

_Static_assert(ST_SAMPLE_MAX_TOP == ST_PROTO_MAX_TOP_LOGPROBS, "a chunk holds every top logprob the engine gives");

/* One chunk to the client: a token (finish NONE) or the end (finish set, token may ride along).
 * A token of a logprobs request carries the engine's values (q->lp, q->top_*); the logits row
 * (vocab × 4 bytes) travels only when the request asked for it (dump_logits). */
static void emit(aw_t *aw, seq_t *q, int has_token, int token, const float *logits, st_proto_finish_t fin,
                 const char *err) {
    ev_t *ev = ev_get(aw);
    char text[8] = {0};
    if (has_token) st_tok_decode(&token, 1, text, sizeof text - 1);
    st_proto_generate_chunk_t ch = {.index = (uint32_t)(q->n_gen - (has_token ? 1 : 0)), .token_id = has_token ? (uint32_t)token : 0,
                                    .text = text, .finish = fin, .error = (char *)(err ? err : "")};
    if (logits && q->dump) {
        ch.logits = (uint8_t *)logits;
        ch.logits_len = (size_t)aw->c->vocab * sizeof(float);
    }
    if (has_token && q->sp.n_top >= 0) {
        ch.has_logprob = 1;
        ch.logprob = q->lp;
        ch.n_top = (size_t)ST_MIN(q->sp.n_top, aw->c->vocab);
        for (size_t i = 0; i < ch.n_top; i++) {
            ch.top_ids[i] = (uint32_t)q->top_ids[i];
            ch.top_logprobs[i] = q->top_lp[i];
        }
    }
    ev->kind = EV_CHUNK;
    ev->req = q->req;
    ev->gen = q->gen;
    ev->finish = fin != ST_PROTO_FINISH_NONE;
    ev->bytes = ev->inl;
    /* a chunk with a logits row (vocab × 4 bytes: logprobs, --dump-logits) never fits the inline buffer */
    if (ch.logits || st_proto_generate_chunk_encode_into(&ch, ev->inl, sizeof ev->inl, &ev->len) != ST_OK) {
        ev->heap = 1;
        if (st_proto_generate_chunk_encode(&ch, &ev->bytes, &ev->len) != ST_OK) {
            ev->heap = 0;
            ev_put(aw, ev);
            return;
        }
    }
    post_event(aw, ev);
}

/* End a request that has sent no chunk with a status (a client's mistake, capacity, shutdown): the
 * coordinator sees a gRPC code before any token and can answer 400 or send the request elsewhere. */
static void end_call(aw_t *aw, int req, uint64_t gen, st_status_t st, const char *why) {
    ev_t *ev = ev_get(aw);
    ev->kind = EV_END;
    ev->req = req;
    ev->gen = gen;
    ev->finish = 1;
    ev->status = st;
    ev->bytes = ev->inl;
    ev->len = (size_t)snprintf((char *)ev->inl, sizeof ev->inl, "%s", why ? why : st_status_str(st));
    if (ev->len >= sizeof ev->inl) ev->len = sizeof ev->inl - 1;
    post_event(aw, ev);
    pthread_mutex_lock(&aw->mu);
    aw->active--;
    pthread_mutex_unlock(&aw->mu);
}

static void seq_free_bufs(seq_t *q) {
    free(q->toks);
    free(q->bias);
    q->toks = NULL;
    q->bias = NULL;
}

static void seq_end(aw_t *aw, seq_t *q) {
    st_engine_seq_close(aw->e, q->slot);
    seq_free_bufs(q);
    q->used = 0;
    pthread_mutex_lock(&aw->mu);
    aw->active--;
    pthread_mutex_unlock(&aw->mu);
}

static void seq_fail(aw_t *aw, seq_t *q, st_proto_finish_t fin, const char *err) {
    emit(aw, q, 0, 0, NULL, fin, err);
    seq_end(aw, q);
}

/* A sequence that has sent nothing yet ends with a status instead of a chunk (see end_call). */
static void seq_abort(aw_t *aw, seq_t *q, st_status_t st, const char *why) {
    st_engine_seq_close(aw->e, q->slot);
    seq_free_bufs(q);
    q->used = 0;
    end_call(aw, q->req, q->gen, st, why);
}

/* Admit a request into a free sequence slot; 0 when none is free (it waits), 1 when handled. The
 * request was range-checked on arrival (st_aw_check_request): n_prompt and max_tokens are sane. */
static int admit(aw_t *aw, in_msg_t *m) {
    st_proto_generate_req_t *r = &m->r;
    int free_i = -1;
    for (int i = 0; i < aw->o.max_seqs; i++)
        if (!aw->seqs[i].used) { free_i = i; break; }
    if (free_i < 0) return 0;
    int n = m->n_prompt, max_tokens = m->max_tokens;
    int *toks = malloc(sizeof(int) * ((size_t)n + (size_t)max_tokens + 1));
    /* [n_logit_bias] ids, then [n_logit_bias] values */
    void *bias = r->n_logit_bias ? malloc(r->n_logit_bias * (sizeof(uint32_t) + sizeof(float))) : NULL;
    if (!toks || (r->n_logit_bias && !bias)) {
        free(toks);
        free(bias);
        end_call(aw, m->req, m->gen, ST_ERR_NO_MEMORY, "attention worker: out of memory for a sequence");
        return 1;
    }
    if (r->n_prompt_tokens)
        for (int i = 0; i < n; i++)
            toks[i] = (int)r->prompt_tokens[i];
    else
        n = st_tok_encode(r->prompt, toks, n);
    int slot = -1;
    st_status_t st = st_engine_seq_open(aw->e, &slot);
    if (st != ST_OK) {
        free(toks);
        free(bias);
        end_call(aw, m->req, m->gen, st, st_err_last());
        return 1;
    }
    seq_t *q = &aw->seqs[free_i];
    *q = (seq_t){.used = 1, .req = m->req, .gen = m->gen, .slot = slot, .toks = toks, .n_prompt = n,
                 .max_tokens = max_tokens, .dump = r->dump_logits, .ignore_eos = r->ignore_eos};
    q->sp = (st_sample_params_t){.temperature = r->temperature, .top_k = (int)r->top_k,
                                 .top_p = (r->top_p > 0 && r->top_p < 1) ? r->top_p : 1.0f,
                                 .presence = r->presence_penalty, .frequency = r->frequency_penalty,
                                 .seed = r->has_seed ? r->seed : (uint64_t)st_time_ns(),
                                 .n_top = r->logprobs ? (int)r->top_logprobs : -1};
    q->n_stop = (int)ST_MIN(r->n_stop_ids, (size_t)MAX_STOP);
    for (int i = 0; i < q->n_stop; i++) q->stop[i] = r->stop_ids[i];
    if (bias) {
        size_t nb = r->n_logit_bias;
        memcpy(bias, r->logit_bias_ids, nb * sizeof(uint32_t));
        memcpy((uint32_t *)bias + nb, r->logit_bias_values, nb * sizeof(float));
        q->bias = bias;
        q->sp.n_bias = (int)nb;
        q->sp.bias_ids = bias;
        q->sp.bias_values = (const float *)((uint32_t *)bias + nb);
    }
    return 1;
}

/* New requests join the waiting line; cancellations reach waiting and running ones; then the
 * line is admitted in order while sequence slots are free (continuous batching) unless stopping. */
static void drain_inbox(aw_t *aw, int admit_ok) {
    pthread_mutex_lock(&aw->mu);
    in_msg_t *m = aw->in_head;
    aw->in_head = aw->in_tail = NULL;
    pthread_mutex_unlock(&aw->mu);
    while (m) {
        in_msg_t *next = m->next;
        m->next = NULL;
        if (m->kind == IN_NEW) {
            if (aw->wait_tail) aw->wait_tail->next = m;
            else aw->wait_head = m;
            aw->wait_tail = m;
        } else {
            for (int i = 0; i < aw->o.max_seqs; i++)
                if (aw->seqs[i].used && aw->seqs[i].req == m->req && aw->seqs[i].gen == m->gen) aw->seqs[i].cancelled = 1;
            for (in_msg_t **pp = &aw->wait_head; *pp; pp = &(*pp)->next)
                if ((*pp)->req == m->req && (*pp)->gen == m->gen) {
                    in_msg_t *w = *pp;
                    seq_t tmp = {.req = w->req, .gen = w->gen};
                    emit(aw, &tmp, 0, 0, NULL, ST_PROTO_FINISH_CANCELLED, "cancelled");
                    pthread_mutex_lock(&aw->mu);
                    aw->active--;
                    pthread_mutex_unlock(&aw->mu);
                    *pp = w->next;
                    if (aw->wait_tail == w) {
                        aw->wait_tail = NULL;
                        for (in_msg_t *t = aw->wait_head; t; t = t->next) aw->wait_tail = t;
                    }
                    st_proto_generate_req_cleanup(&w->r);
                    free(w);
                    break;
                }
            free(m);
        }
        m = next;
    }
    while (admit_ok && aw->wait_head && admit(aw, aw->wait_head)) {
        in_msg_t *w = aw->wait_head;
        aw->wait_head = w->next;
        if (!aw->wait_head) aw->wait_tail = NULL;
        st_proto_generate_req_cleanup(&w->r);
        free(w);
    }
}

/* Copy the newest placement (server indices) for the compute thread, at a step boundary. NOTE: once
 * place_applied reaches a slot's retired_gen, no step can name that slot again: the table may reuse it. */
static void sync_placement(aw_t *aw) {
    pthread_mutex_lock(&aw->mu);
    if (aw->place_gen != aw->place_applied) {
        memcpy(aw->hl, aw->holders, sizeof(int) * (size_t)aw->c->n_layers * aw->c->n_experts * aw->R);
        aw->place_applied = aw->place_gen;
    }
    pthread_mutex_unlock(&aw->mu);
}

/* server_of for a layer: the first live holder (skipping `avoid`), else NONE. */
static void choose_servers(aw_t *aw, int layer, int *server_of, const int *avoid_mask) {
    int E = aw->c->n_experts, R = aw->R;
    pthread_mutex_lock(&aw->mu);
    for (int e = 0; e < E; e++) {
        server_of[e] = ST_DISPATCH_NONE;
        const int *h = aw->hl + ((size_t)layer * E + e) * R;
        for (int r = 0; r < R; r++)
            if (h[r] >= 0 && aw->srv[h[r]].alive && !(avoid_mask && avoid_mask[h[r]])) {
                server_of[e] = h[r];
                break;
            }
    }
    pthread_mutex_unlock(&aw->mu);
}

/* Whether server s's distinct rows (ascending tokens) are large enough and few enough runs for the copy
 * engine (ZRUN_*); fills aw->zrun_* with the runs into rows. */
static bool zrun_plan(aw_t *aw, const st_dispatch_plan_t *p, int s, const st_moe_work_t *w, uint8_t *rows) {
    size_t rb = sizeof(uint16_t) * (size_t)w->ew;
    int nu = p->n_uniq[s], n = 0;
    if ((size_t)nu * rb < ZRUN_MIN_BYTES) return false;
    const int *ut = p->utok + (size_t)s * p->max_rows;
    for (int u = 0; u < nu; u++) {
        if (n && ut[u] == aw->zrun_first[n - 1] + aw->zrun_count[n - 1]) {
            aw->zrun_count[n - 1]++;
            continue;
        }
        if (n == ZRUN_MAX) return false;
        aw->zrun_first[n] = ut[u], aw->zrun_count[n] = 1, aw->zrun_dst[n] = rows + (size_t)u * rb;
        n++;
    }
    aw->zrun_n = n;
    return true;
}

static void do_send(aw_t *aw, int mb, int s);

/* Pack and post the dispatches of plan p for micro-batch mb. peer_ok: a same-host server that opened
 * the micro-batch's device memory reads the rows there and writes its output rows into its reply
 * region (one after another, from row 0; a retry round goes through the channels: the first round's
 * rows stay where they are). */
static void send_plan(aw_t *aw, int mb, st_dispatch_plan_t *p, const st_moe_work_t *w, bool peer_ok) {
    double t0 = st_time_sec();
    aw->t_plan[mb] = t0;
    uint32_t reply_row = 0;
    for (int s = 0; s < aw->n_srv && s < p->n_servers; s++) {
        if (!p->n_rows[s]) continue;
        pend_t *pd = &aw->pend[mb][s];
        if (aw->srv[s].capacity && (uint32_t)p->n_rows[s] > aw->srv[s].capacity) {
            pthread_mutex_lock(&aw->mu);
            pd->state = P_FAILED;
            pd->soft = 1;
            snprintf(pd->err, sizeof pd->err, "expert server %s takes %u rows per dispatch, this step needs %d (lower --max-batch-tokens)",
                     aw->srv[s].name, aw->srv[s].capacity, p->n_rows[s]);
            pthread_mutex_unlock(&aw->mu);
            continue;
        }
        /* same host: packed straight into the server's request slot, claimed first (srv_reap frees a
         * channel only while no dispatch names it) */
        pthread_mutex_lock(&aw->mu);
        st_xfer_chan_t *ch = aw->srv[s].alive ? aw->srv[s].chan : NULL;
        pd->chan = ch;
        pd->rview = NULL;
        pd->rcopy = ch ? !aw->srv[s].chan_read : !pd->rbuf_read;
        bool mapped = ch && aw->srv[s].chan_read; /* the engine's device reaches the channel */
        bool peer = peer_ok && !aw->peer_off && ch && w->zb && (aw->srv[s].chan_peer >> mb & 1u) &&
                    reply_row + (uint32_t)p->n_out[s] <= aw->peer[mb].reply_rows;
        if (ch) pd->state = P_QUEUED;
        pthread_mutex_unlock(&aw->mu);
        const int *ut = p->utok + (size_t)s * p->max_rows;
        uint8_t *buf = ch ? st_xfer_chan_req_buf(ch, (uint32_t)mb) : pd->sbuf;
        /* each distinct token once (wire.h ST_WIRE_FLAG_UNIQUE_ROWS): the server expands them */
        st_wire_info_t info = {.kind = ST_WIRE_KIND_DISPATCH, .step = aw->step, .layer = (uint32_t)w->layer,
                               .micro_batch = (uint16_t)mb, .source_id = (uint32_t)st_member_id(aw->mem),
                               .token_count = (uint32_t)p->n_rows[s], .expert_count = (uint32_t)p->n_exp[s],
                               .row_width = (uint32_t)w->ew, .seq = ++aw->next_seq, .unique = (uint32_t)p->n_uniq[s],
                               .slots = (uint32_t)w->T * (uint32_t)w->kc, /* the batch's shape (wire.h) */
                               .bf16_rows = w->zb != NULL};
        if (peer) /* the rows its sources span: tokens ascending */
            info.peer = true, info.reply_row = reply_row, info.unique = (uint32_t)ut[p->n_uniq[s] - 1] + 1;
        info.payload_bytes = peer ? st_wire_dispatch_peer_bytes(info.token_count, info.expert_count, info.unique)
                                  : st_wire_dispatch_bytes(info.token_count, info.expert_count, info.row_width,
                                                           info.unique, info.bf16_rows);
        pd->peer = peer, pd->reply_row = reply_row;
        reply_row += peer ? (uint32_t)p->n_out[s] : 0;
        st_wire_dispatch_t v;
        st_wire_dispatch_encode(buf, &info, p->exp_ids + (size_t)s * p->n_experts,
                                p->offsets + (size_t)s * (p->n_experts + 1), &v);
        bool dma = !peer && mapped && w->zb && zrun_plan(aw, p, s, w, (uint8_t *)v.rows);
        st_dispatch_pack(p, s, w, peer ? NULL : (uint32_t *)v.src, (uint32_t *)v.orow, (float *)v.wts,
                         dma || peer ? NULL : (void *)v.rows);
        if (peer) st_dispatch_src_tokens(p, s, (uint32_t *)v.src);
        if (dma &&
            st_engine_mb_copy_z(aw->mbs[mb], aw->zrun_first, aw->zrun_count, aw->zrun_dst, aw->zrun_n) != ST_OK) {
            st_log_every(ST_LOG_WARN, 10.0, "worker %s: rows by the copy engine: %s (packed on the host)", aw->o.name,
                         st_err_last());
            st_dispatch_pack(p, s, w, (uint32_t *)v.src, (uint32_t *)v.orow, (float *)v.wts, (void *)v.rows);
        }
        st_wire_header_encode(&info, &pd->hdr);
        aw->dispatch_bytes += info.payload_bytes + sizeof pd->hdr;
        aw->messages++;
        if (ch) {
            st_status_t rc = st_xfer_chan_post(ch, (uint32_t)mb, &pd->hdr, sizeof pd->hdr, info.payload_bytes);
            pthread_mutex_lock(&aw->mu);
            pd->seq = info.seq;
            pd->slen = info.payload_bytes;
            pd->soft = 0;
            pd->err[0] = 0;
            if (pd->state == P_QUEUED) { /* not failed meanwhile by the server's loss */
                pd->state = rc == ST_OK ? P_SENT : P_FAILED;
                pd->t_sent = st_time_sec();
                if (rc != ST_OK)
                    snprintf(pd->err, sizeof pd->err, "expert server %s (%s): %s", aw->srv[s].name, aw->srv[s].endpoint,
                             st_err_last());
            }
            pthread_mutex_unlock(&aw->mu);
            continue;
        }
        pthread_mutex_lock(&aw->mu);
        pd->seq = info.seq;
        pd->slen = info.payload_bytes;
        pd->state = P_QUEUED;
        pd->soft = 0;
        pd->err[0] = 0;
        pthread_mutex_unlock(&aw->mu);
        do_send(aw, mb, s); /* this thread owns UCX: posted now, no hand-off */
    }
    aw->stage[ST_PROTO_STAGE_DISPATCH] += st_time_sec() - t0;
}

/* Waits (until the monotonic time `until`) for the reply to pd, a dispatch sent through a same-host
 * channel, and settles pd like am_done / on_srv_lost / a timeout do for UCX. Compute thread. */
static void shm_wait(aw_t *aw, pend_t *pd, st_xfer_chan_t *ch, double until) {
    const srv_t *sv = &aw->srv[pd->s];
    double t_wait = st_time_sec(); /* this thread looks for this reply from now on */
    double left = (until - t_wait) * 1e3;
    st_xfer_msg_t m;
    st_wire_info_t info;
    st_status_t rc = st_xfer_chan_wait_reply(ch, (uint32_t)pd->mb, left < 1 ? 1 : (int)left, &m);
    int hdr_ok = rc == ST_OK && m.hdr_len == sizeof(st_wire_header_t) &&
                 st_wire_header_decode(m.hdr, m.hdr_len, m.len, &info) == ST_OK && info.seq == pd->seq;
    pthread_mutex_lock(&aw->mu);
    if (pd->state == P_SENT) { /* else failed meanwhile by the server's loss (on_srv_lost) */
        pd->state = P_FAILED;
        if (hdr_ok && info.kind == ST_WIRE_KIND_ERROR) {
            pd->soft = 1;
            int n = (int)ST_MIN(m.len, sizeof pd->err - 40);
            snprintf(pd->err, sizeof pd->err, "expert server %s: %.*s", sv->name, n, (const char *)m.payload);
        } else if (hdr_ok) {
            memcpy(pd->recv.hdr, m.hdr, m.hdr_len);
            pd->recv.hdr_len = m.hdr_len;
            pd->rview = m.payload;
            pd->rlen = m.len;
            /* received when answered if this thread was busy elsewhere then (computing, or waiting for
             * another server's reply: not the transport's), else when it saw the answer (its wake-up is
             * the transport's) */
            double sent = (double)m.sent_ns * 1e-9;
            pd->t_recv = sent < t_wait ? sent : st_time_sec();
            pd->state = P_DONE;
        } else if (rc == ST_OK) {
            snprintf(pd->err, sizeof pd->err, "expert server %s: bad reply", sv->name);
        } else if (rc == ST_ERR_TIMEOUT) {
            snprintf(pd->err, sizeof pd->err, "expert server %s (%s) did not answer within %u ms", sv->name, sv->endpoint,
                     aw->o.expert_timeout_ms);
        } else {
            snprintf(pd->err, sizeof pd->err, "lost expert server %s (%s): %s", sv->name, sv->endpoint, st_err_last());
        }
    }
    pthread_mutex_unlock(&aw->mu);
}

/* Wait (bounded) for every dispatch of plan p; unpack the good ones (node values, pointed to in w->at),
 * return a mask of failed servers (count in *n_failed) and their errors in pend[].err. */
static void wait_plan(aw_t *aw, int mb, st_dispatch_plan_t *p, const st_moe_work_t *w, int *failed_mask, int *n_failed) {
    double t_wait = st_time_sec(), slowest_net = 0, until = aw->t_plan[mb] + aw->o.expert_timeout_ms * 1e-3;
    uint32_t slowest_us = 0;
    *n_failed = 0;
    /* same-host servers first: this thread waits on their reply flags itself */
    for (int s = 0; s < aw->n_srv; s++) {
        pend_t *pd = &aw->pend[mb][s];
        if (!p->n_rows[s]) continue;
        pthread_mutex_lock(&aw->mu);
        st_xfer_chan_t *ch = pd->state == P_SENT ? pd->chan : NULL; /* srv_reap frees none a sent pend names */
        pthread_mutex_unlock(&aw->mu);
        if (ch) shm_wait(aw, pd, ch, until);
    }
    /* the others over UCX: this thread runs its data loop, whose callbacks settle their records
     * (am_done, on_srv_lost), polling until the data path's spin passes with nothing moving (a large
     * message's rendezvous moves only while both sides progress), then asleep until the deadline */
    const uint64_t spin = st_xfer_spin_ns();
    uint64_t t_poll = st_time_ns();
    for (;;) {
        int waiting = 0;
        pthread_mutex_lock(&aw->mu);
        for (int s = 0; s < aw->n_srv; s++)
            if (p->n_rows[s] && (aw->pend[mb][s].state == P_QUEUED || aw->pend[mb][s].state == P_SENT)) waiting = 1;
        if (waiting && st_time_sec() >= until) {
            for (int s = 0; s < aw->n_srv; s++) {
                pend_t *pd = &aw->pend[mb][s];
                if (p->n_rows[s] && (pd->state == P_QUEUED || pd->state == P_SENT)) {
                    pd->state = P_FAILED;
                    snprintf(pd->err, sizeof pd->err, "expert server %s (%s) did not answer within %u ms",
                             aw->srv[s].name, aw->srv[s].endpoint, aw->o.expert_timeout_ms);
                }
            }
            waiting = 0;
        }
        pthread_mutex_unlock(&aw->mu);
        if (!waiting) break;
        if (st_time_ns() - t_poll >= spin) dl_sleep(aw, until);
        else if (dl_poll(aw)) t_poll = st_time_ns();
    }
    aw->ucx_out[mb] = 0; /* each has its answer, or failed */
    double t_unpack = st_time_sec();
    for (int s = 0; s < aw->n_srv; s++) {
        if (!p->n_rows[s]) continue;
        pend_t *pd = &aw->pend[mb][s];
        if (pd->state == P_DONE) {
            /* the reply must answer what we sent: its seq, one row per output row we planned */
            st_wire_info_t info;
            int ok = st_wire_header_decode(&pd->recv.hdr, pd->recv.hdr_len, pd->rlen, &info) == ST_OK &&
                     info.kind == ST_WIRE_KIND_COMBINE && info.seq == pd->seq &&
                     info.token_count == (uint32_t)p->n_out[s] && info.row_width == (uint32_t)w->ew;
            if (ok) {
                if (pd->peer) /* written into the engine's device memory: pointed to there */
                    st_dispatch_unpack(p, s, w, aw->peer[mb].reply + (size_t)pd->reply_row * (size_t)w->ew, false);
                else
                    st_dispatch_unpack(p, s, w, (const float *)(pd->rview ? pd->rview : pd->rbuf), pd->rcopy);
                pd->state = P_IDLE;
                aw->reply_bytes += pd->rlen + sizeof(st_wire_header_t);
                slowest_us = info.compute_us > slowest_us ? info.compute_us : slowest_us;
                double net = pd->t_recv - pd->t_sent - info.compute_us * 1e-6;
                slowest_net = net > slowest_net ? net : slowest_net;
                continue;
            }
            snprintf(pd->err, sizeof pd->err, "expert server %s sent a reply that does not match the dispatch", aw->srv[s].name);
            pd->state = P_FAILED;
            pd->soft = 1;
        }
        failed_mask[s] = 1;
        (*n_failed)++;
        st_log_every(ST_LOG_WARN, 5.0, "worker %s: %s", aw->o.name, pd->err); /* every layer of every step */
    }
    aw->stage[ST_PROTO_STAGE_EXPERT] += slowest_us * 1e-6;
    aw->stage[ST_PROTO_STAGE_NETWORK] += slowest_net;
    aw->stage[ST_PROTO_STAGE_WAIT] += t_unpack - t_wait;
    aw->stage[ST_PROTO_STAGE_UNPACK] += st_time_sec() - t_unpack;
}

/* Page-locks plan[mb]'s rows of its first n servers (once each): the device plan's copies back then
 * go straight into them (st_engine_mb_plan), not through the driver's pageable staging. */
static void plan_pin(aw_t *aw, int mb, int n) {
    st_dispatch_plan_t *p = &aw->plan[mb];
    for (int s = aw->plan_pinned[mb]; s >= 0 && s < n && s < p->n_servers; s++) {
        void *at[ST_DISPATCH_TABLES];
        size_t bytes[ST_DISPATCH_TABLES];
        int k = st_dispatch_plan_rows(p, s, at, bytes), i = 0;
        while (i < k && st_engine_host_map(aw->e, at[i], bytes[i]) == ST_OK)
            i++;
        if (i < k) {
            st_log_warn(
                "worker %s: page-locking the dispatch plan: %s (its copies from the device go through pageable memory)",
                aw->o.name, st_err_last());
            while (i-- > 0)
                st_engine_host_unmap(aw->e, at[i]);
            aw->plan_pinned[mb] = -1 - s; /* servers below s stay mapped (unpinned at the end) */
            return;
        }
        aw->plan_pinned[mb] = s + 1;
    }
}

static void plan_unpin(aw_t *aw, int mb) {
    int n = aw->plan_pinned[mb] < 0 ? -1 - aw->plan_pinned[mb] : aw->plan_pinned[mb];
    for (int s = 0; s < n; s++) {
        void *at[ST_DISPATCH_TABLES];
        size_t bytes[ST_DISPATCH_TABLES];
        for (int i = 0, k = st_dispatch_plan_rows(&aw->plan[mb], s, at, bytes); i < k; i++)
            st_engine_host_unmap(aw->e, at[i]);
    }
    aw->plan_pinned[mb] = 0;
}

/* Send one work item to the expert servers (the wait comes later, after the other micro-batches'
 * attention has run: ping-pong). Tokens whose experts have no live holder are flagged now. */
static void remote_dispatch(aw_t *aw, int mb, st_moe_work_t *w, char *why, size_t why_len) {
    double t0 = st_time_sec();
    int *so = aw->server_of[mb];
    choose_servers(aw, w->layer, so, NULL);
    bool dev = false;
    if ((long)w->T * w->kc >= PLAN_DEV_MIN_SLOTS && st_engine_async(aw->e)) {
        plan_pin(aw, mb, ST_MAX(aw->n_srv, 1));
        st_moe_plan_t v = st_dispatch_plan_view(&aw->plan[mb]);
        dev = st_engine_mb_plan(aw->mbs[mb], &v, ST_MAX(aw->n_srv, 1), so, aw->tok_failed[mb]) == ST_OK;
        aw->plan[mb].wts_set = dev;
        if (!dev)
            st_log_every(ST_LOG_WARN, 10.0, "worker %s: the dispatch plan on the device: %s (planned on the host)",
                         aw->o.name, st_err_last());
    }
    if (!dev) st_dispatch_plan_build(&aw->plan[mb], w, so, aw->tok_failed[mb]);
    for (int e = 0; e < aw->c->n_experts && !why[0]; e++) /* name the lost holder of a stranded expert */
        if (so[e] == ST_DISPATCH_NONE) {
            int used = 0;
            for (int t = 0; t < w->T && !used; t++)
                for (int i = 0; i < w->cnt[t]; i++) used |= w->ids[(size_t)t * w->kc + i] == e;
            int h = aw->hl[((size_t)w->layer * aw->c->n_experts + e) * aw->R];
            if (!used) continue;
            if (h >= 0) {
                snprintf(why, why_len, "expert %d of layer %d has no live server (lost: %s at %s)", e, w->layer,
                         aw->srv[h].name, aw->srv[h].endpoint);
            } else {
                char full[sizeof aw->srv_full];
                pthread_mutex_lock(&aw->mu);
                memcpy(full, aw->srv_full, sizeof full);
                pthread_mutex_unlock(&aw->mu);
                snprintf(why, why_len, "expert %d of layer %d has no live server (%s)", e, w->layer,
                         full[0] ? full : "none placed");
            }
        }
    aw->stage[ST_PROTO_STAGE_PLAN] += st_time_sec() - t0;
    send_plan(aw, mb, &aw->plan[mb], w, true);
}

/* Wait (bounded) for a work item's replies; one retry round on replicas for the experts of
 * failed servers. Tokens left without an answer are flagged. */
static void remote_finish(aw_t *aw, int mb, st_moe_work_t *w, char *why, size_t why_len) {
    int failed[MAX_SERVERS] = {0}, nf = 0;
    wait_plan(aw, mb, &aw->plan[mb], w, failed, &nf);
    if (nf == 0) return;
    /* the retry round reuses the reply buffers the node values lie in (not the device's: it sends
     * through the channels) */
    const float *dev = aw->peer[mb].reply;
    st_dispatch_settle_except(w, dev, dev ? dev + (size_t)aw->peer[mb].reply_rows * (size_t)w->ew : NULL);
    for (int s = 0; s < aw->n_srv; s++)
        if (failed[s]) {
            snprintf(why, why_len, "%s", aw->pend[mb][s].err);
            pthread_mutex_lock(&aw->mu);
            if (!aw->pend[mb][s].soft) aw->srv[s].alive = 0; /* gone: until the coordinator's next map */
            aw->pend[mb][s].state = P_IDLE;
            pthread_mutex_unlock(&aw->mu);
            /* NOTE: a server that did not answer may still be running and write its rows into the
             * reply region later, where another server's rows of a later layer would lie: from now on
             * no micro-batch shares its device memory (replies come through the channels) */
            if (aw->pend[mb][s].peer && !aw->pend[mb][s].soft && !aw->peer_off) {
                aw->peer_off = true;
                st_log_warn("worker %s: %s: replies now come through the channels, not this engine's device memory",
                            aw->o.name, aw->pend[mb][s].err);
            }
        }
    /* retry: only experts that were on failed servers, on another live holder. The failed nodes
     * are cut again for their new servers and their values join the good ones: any cut into tree
     * nodes finishes to the same sum (docs/architecture.md, "Bit-exact expert results") */
    double t0 = st_time_sec();
    choose_servers(aw, w->layer, aw->server_of2, failed);
    for (int e = 0; e < aw->c->n_experts; e++) {
        int s0 = aw->server_of[mb][e];
        if (s0 < 0 || !failed[s0]) aw->server_of2[e] = ST_DISPATCH_SKIP;
    }
    st_dispatch_plan_build(&aw->plan2, w, aw->server_of2, aw->tok_failed[mb]);
    aw->stage[ST_PROTO_STAGE_PLAN] += st_time_sec() - t0;
    send_plan(aw, mb, &aw->plan2, w, false);
    int failed2[MAX_SERVERS] = {0}, nf2 = 0;
    wait_plan(aw, mb, &aw->plan2, w, failed2, &nf2);
    for (int s = 0; s < aw->n_srv; s++) {
        if (!failed2[s]) continue;
        snprintf(why, why_len, "%s", aw->pend[mb][s].err);
        pthread_mutex_lock(&aw->mu);
        if (!aw->pend[mb][s].soft) aw->srv[s].alive = 0;
        aw->pend[mb][s].state = P_IDLE;
        pthread_mutex_unlock(&aw->mu);
        for (int r = 0; r < aw->plan2.n_rows[s]; r++) aw->tok_failed[mb][aw->plan2.pair[(size_t)s * aw->plan2.max_rows + r] / w->kc] = true;
    }
}

/* Whether every reply of micro-batch mb's dispatch has arrived or failed (no wait). */
static bool replies_in(aw_t *aw, int mb) {
    st_dispatch_plan_t *p = &aw->plan[mb];
    bool in = true;
    pthread_mutex_lock(&aw->mu);
    for (int s = 0; s < aw->n_srv && in; s++) {
        const pend_t *pd = &aw->pend[mb][s];
        if (p->n_rows[s] && (pd->state == P_QUEUED ||
                             (pd->state == P_SENT && !(pd->chan && st_xfer_chan_reply_in(pd->chan, (uint32_t)mb)))))
            in = false;
    }
    pthread_mutex_unlock(&aw->mu);
    return in;
}

/* Micro-batch mb's replies → its work item's node values (failed tokens none: +0), then its next
 * layers launched (st_engine_mb_launch releases the hand-off, then walks to the next one);
 * the engine finishes each token's tree reading the rows where they lie. */
static void mb_resume(aw_t *aw, int mb, st_moe_work_t *w, char (*why)[256]) {
    remote_finish(aw, mb, &w[mb], why[mb], sizeof why[mb]);
    double t0 = st_time_sec();
    st_dispatch_drop_failed(&w[mb], aw->tok_failed[mb]);
    aw->hook_mb = mb;
    double t1 = st_time_sec();
    st_engine_mb_launch(aw->mbs[mb]);
    aw->stage[ST_PROTO_STAGE_UNPACK] += t1 - t0;
    aw->stage[ST_PROTO_STAGE_LAUNCH] += st_time_sec() - t1;
}

/* Collect micro-batch mb (waits for its device work) and dispatch its hand-off; returns 1 when its
 * step is done. */
static int mb_collect(aw_t *aw, int mb, st_moe_work_t *w, char (*why)[256], int *live) {
    aw->hook_mb = mb;
    /* the worker's own layers: less the hooks' summaries, which count as thresholds */
    double t0 = st_time_sec(), thr0 = aw->stage[ST_PROTO_STAGE_THRESHOLDS];
    int more = st_engine_mb_collect(aw->mbs[mb], &w[mb]);
    aw->stage[ST_PROTO_STAGE_ATTENTION] += st_time_sec() - t0 - (aw->stage[ST_PROTO_STAGE_THRESHOLDS] - thr0);
    if (more) {
        remote_dispatch(aw, mb, &w[mb], why[mb], sizeof why[mb]);
        /* NOTE: the next layers are launched at mb_resume, after the replies, not queued here behind
         * a device wait for the release (st_engine_mb_launch_early): on the H200 that was no faster at
         * batch 1 and 32, and at batch 256 a step hit the release timeout (inferred: the other
         * micro-batch's first launch of a lazily loaded kernel waited for this release on the thread
         * that gives it; docs/perf.md) */
        live[mb] = MB_AT_EXPERTS;
        return 0;
    }
    live[mb] = MB_DONE;
    return 1;
}

/* Every MoE layer of every micro-batch: count the load, add the scores to the step's summary (only
 * for layers without a threshold: the others come with their counts, count_hook). */
static void route_hook(void *ctx, int layer, int T, int n, const float *scores, const int *ids, const int *cnt, int kmax) {
    aw_t *aw = ctx;
    uint32_t *ld = aw->load + (size_t)layer * n;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < cnt[t]; i++) ld[ids[(size_t)t * kmax + i]]++;
    if (aw->o.routing != ST_ROUTE_QUANTILE || !scores) return;
    double t0 = st_time_sec();
    if (st_qsum_add_layer(aw->qsum[aw->hook_mb], (uint32_t)(layer - aw->c->first_k_dense), scores, (uint32_t)T) != ST_OK)
        st_log_every(ST_LOG_WARN, 10.0, "worker %s: score summary of layer %d dropped: %s", aw->o.name, layer,
                     st_err_last());
    aw->stage[ST_PROTO_STAGE_THRESHOLDS] += st_time_sec() - t0;
}

/* Every MoE layer routed by its thresholds: the engine's counts (on the GPU, the router's epilogue)
 * into the step's summary. */
static void count_hook(void *ctx, int layer, int T, int n, const uint32_t *cnt, const uint32_t *band) {
    aw_t *aw = ctx;
    (void)n;
    double t0 = st_time_sec();
    if (st_qsum_add_layer_counts(aw->qsum[aw->hook_mb], (uint32_t)(layer - aw->c->first_k_dense), (uint32_t)T, cnt,
                                 band) != ST_OK)
        st_log_every(ST_LOG_WARN, 10.0, "worker %s: threshold counts of layer %d dropped: %s", aw->o.name, layer,
                     st_err_last());
    aw->stage[ST_PROTO_STAGE_THRESHOLDS] += st_time_sec() - t0;
}

/* Newest thresholds → the engine and the summary builder, at a step boundary. */
static void sync_thresholds(aw_t *aw) {
    const st_config_t *c = aw->c;
    size_t cells = (size_t)c->n_layers * c->n_experts;
    pthread_mutex_lock(&aw->mu);
    int fresh = aw->tau_in_version != aw->tau_cur_version;
    if (fresh) {
        memcpy(aw->tau_cur, aw->tau_in, sizeof(float) * cells);
        memcpy(aw->rho_cur, aw->rho_in, sizeof(float) * cells);
        aw->tau_cur_version = aw->tau_in_version;
    }
    pthread_mutex_unlock(&aw->mu);
    if (!fresh) return;
    st_engine_set_probes(aw->e, aw->rho_cur);
    st_engine_set_thresholds(aw->e, aw->tau_cur, aw->tau_cur_version);
    size_t off = (size_t)c->first_k_dense * c->n_experts;
    aw->qtab = (st_qtable_t){.version = aw->tau_cur_version, .n_layers = (uint32_t)(c->n_layers - c->first_k_dense),
                             .n_experts = (uint32_t)c->n_experts, .tau = aw->tau_cur + off, .rho = aw->rho_cur + off};
}

static size_t varint_bytes(uint32_t v) { return v < (1u << 7) ? 1 : v < (1u << 14) ? 2 : v < (1u << 21) ? 3 : v < (1u << 28) ? 4 : 5; }

/* The loads this report carries: whole MoE layers from aw->load_next on, while they fit `room`
 * bytes (packed varints); the next report continues after them (wrapping to the first MoE layer). */
static void pick_load_layers(aw_t *aw, size_t room, st_proto_scores_t *r) {
    const st_config_t *c = aw->c;
    int first = aw->load_next >= c->first_k_dense && aw->load_next < c->n_layers ? aw->load_next : c->first_k_dense, l;
    size_t used = 0;
    for (l = first; l < c->n_layers; l++) {
        const uint32_t *ld = aw->load + (size_t)l * c->n_experts;
        size_t b = 0;
        for (int e = 0; e < c->n_experts; e++) b += varint_bytes(ld[e]);
        if (used + b > room) break;
        used += b;
    }
    aw->load_next = l >= c->n_layers ? c->first_k_dense : l;
    if (l == first) return;
    r->load_first_layer = (uint32_t)first;
    r->load = aw->load + (size_t)first * c->n_experts;
    r->n_load = (size_t)(l - first) * c->n_experts;
}

/* After a step: one ReportScores (loads, bytes, and the micro-batches' summaries) to the loop,
 * within REPORT_BUDGET bytes: the summaries first, then as many layers of loads as fit. */
static void post_report(aw_t *aw, int nmb) {
    const st_config_t *c = aw->c;
    st_proto_scores_t r = {.worker_id = st_member_id(aw->mem), .step = aw->step, .threshold_version = aw->tau_cur_version,
                           .n_layers = (uint32_t)c->n_layers, .n_experts = (uint32_t)c->n_experts,
                           .dispatch_bytes = aw->dispatch_bytes};
    const uint8_t *sums[MAX_MB];
    size_t lens[MAX_MB];
    double t0 = st_time_sec();
    if (aw->o.routing == ST_ROUTE_QUANTILE)
        for (int m = 0; m < nmb; m++) {
            if (st_qsum_finish(aw->qsum[m], &lens[r.n_summaries]) != ST_OK) continue;
            sums[r.n_summaries++] = aw->qbuf[m];
        }
    aw->stage[ST_PROTO_STAGE_THRESHOLDS] += st_time_sec() - t0;
    size_t room = REPORT_BUDGET - REPORT_FIXED;
    for (size_t k = 0; k < r.n_summaries; k++) room = room > lens[k] + 4 ? room - lens[k] - 4 : 0;
    pick_load_layers(aw, room, &r);
    st_engine_stats_t now;
    st_engine_get_stats(aw->e, &now);
    /* the CPU engine combines inside collect: that part of attention is the combine */
    double comb = now.combine - aw->est.combine, *st = aw->stage;
    st[ST_PROTO_STAGE_COMBINE] = comb;
    st[ST_PROTO_STAGE_ATTENTION] = st[ST_PROTO_STAGE_ATTENTION] > comb ? st[ST_PROTO_STAGE_ATTENTION] - comb : 0;
    /* the rest of the step's wall time. Not the engine's per-micro-batch times: overlapped
     * micro-batches each span the step. */
    double other = st_time_sec() - aw->t_step;
    for (int k = 0; k < ST_PROTO_STAGE_OTHER; k++)
        if (st_proto_stage_in_step(k)) other -= st[k];
    st[ST_PROTO_STAGE_OTHER] = other > 0 ? other : 0;
    r.summaries = sums;
    r.summary_lens = lens;
    r.reply_bytes = aw->reply_bytes;
    r.messages = aw->messages;
    memcpy(r.stage_s, aw->stage, sizeof r.stage_s);
    aw->dispatch_bytes = aw->reply_bytes = aw->messages = 0;
    /* never wait on the coordinator: with both report buffers still in flight, skip this one */
    pthread_mutex_lock(&aw->mu);
    int b = !aw->rep_busy[0] ? 0 : !aw->rep_busy[1] ? 1 : -1;
    if (b >= 0) aw->rep_busy[b] = 1;
    pthread_mutex_unlock(&aw->mu);
    if (b < 0 || r.worker_id == 0) {
        if (b >= 0) aw->rep_busy[b] = 0;
        return;
    }
    ev_t *ev = ev_get(aw);
    ev->kind = EV_REPORT;
    ev->rep = b;
    ev->gen = aw->step; /* the loop also reports it in heartbeats */
    ev->bytes = aw->rep_buf[b];
    if (st_proto_scores_encode_into(&r, aw->rep_buf[b], aw->rep_cap, &ev->len) != ST_OK) {
        ev_put(aw, ev);
        return;
    }
    post_event(aw, ev);
}

static int is_stop(const aw_t *aw, const seq_t *q, int tok) {
    if (tok == aw->c->eos_id && !q->ignore_eos) return 1;
    for (int i = 0; i < q->n_stop; i++)
        if ((uint32_t)tok == q->stop[i]) return 1;
    return 0;
}

/* Spin (up to the data path's spin, running the data loop) until a micro-batch at the experts has its
 * replies or one on the device is done; false when neither happened. */
static bool poll_either(aw_t *aw, int nmb, const int *live) {
    uint64_t t0 = st_time_ns(), spin = st_xfer_spin_ns();
    bool ucx = false;
    for (int m = 0; m < nmb; m++) ucx |= live[m] == MB_AT_EXPERTS && aw->ucx_out[m];
    do {
        if (ucx) dl_poll(aw); /* UCX replies land */
        for (int m = 0; m < nmb; m++)
            if ((live[m] == MB_AT_EXPERTS && replies_in(aw, m)) || (live[m] == MB_LAUNCHED && st_engine_mb_ready(aw->mbs[m])))
                return true;
    } while (st_time_ns() - t0 < spin);
    return false;
}

/* A size class's fastest micro-batch count changed: say so, with what was measured. */
static void mbt_log(const aw_t *aw, int tokens, int best) {
    int c = st_mbtune_class(tokens), lo, hi, k = 0;
    const st_mbt_class_t *m = &aw->mbt.cls[c];
    char costs[160];
    costs[0] = 0;
    for (int i = 1; i <= ST_MBT_MAX; i++)
        if (m->n[i] && k < (int)sizeof costs)
            k += snprintf(costs + k, sizeof costs - (size_t)k, "%s%d: %.1f us", k ? ", " : "", i, 1e6 * m->cost[i]);
    st_mbtune_class_range(c, &lo, &hi);
    st_log_info("worker %s: steps of %d-%d tokens now run as %d micro-batch%s (measured per token: %s)", aw->o.name, lo, hi, best,
                best > 1 ? "es" : "", costs);
}

/* One scheduler step over every admitted sequence. */
static void step(aw_t *aw) {
    int ns = 0, budget = aw->o.max_batch_tokens;
    int idx[256];
    st_seq_chunk_t ch[256];
    /* cancelled sequences leave first */
    for (int i = 0; i < aw->o.max_seqs; i++)
        if (aw->seqs[i].used && aw->seqs[i].cancelled) seq_fail(aw, &aw->seqs[i], ST_PROTO_FINISH_CANCELLED, "cancelled");
    /* chunked prefill: a prompt takes what is left of the step's token budget after one token for
     * every decoding sequence (reserved), the rest of it at later steps */
    int reserve = 0;
    for (int i = 0; i < aw->o.max_seqs; i++) reserve += aw->seqs[i].used && aw->seqs[i].prefilled;
    for (int i = 0; i < aw->o.max_seqs && ns < 256; i++) {
        seq_t *q = &aw->seqs[i];
        if (!q->used) continue;
        if (q->prefilled) reserve--;
        int n = q->prefilled ? 1 : ST_MIN(q->n_prompt - q->n_fed, budget - reserve);
        if (n <= 0 || n > budget) continue; /* joins at a later step boundary */
        budget -= n;
        idx[ns] = i;
        /* the engine samples a row that ends the prompt or decodes; the token comes back, with its
         * logprobs when the client asked (values, not the row), and the processed logits row only
         * with dump_logits */
        bool samp = q->prefilled || q->n_fed + n == q->n_prompt;
        q->sp.pos = (uint32_t)q->n_gen;
        ch[ns++] = (st_seq_chunk_t){.slot = q->slot, .n_tokens = n,
                                    .tokens = q->prefilled ? &q->toks[q->n_prompt + q->n_gen - 1] : q->toks + q->n_fed,
                                    .sample = samp ? &q->sp : NULL, .keep_logits = samp && q->dump,
                                    .token = &q->tok, .logprob = &q->lp, .top_ids = q->top_ids, .top_logprobs = q->top_lp};
    }
    if (ns == 0) return;
    /* micro-batches: contiguous groups of about equal tokens, as many as the measurement says are
     * fastest for a step of this size (mbtune.h), each of at least --min-mb-tokens */
    int total = aw->o.max_batch_tokens - budget, best = 0, nmb = st_mbtune_pick(&aw->mbt, total, ns, &best);
    if (best) mbt_log(aw, total, best);
    int first[MAX_MB] = {0}, count[MAX_MB] = {0}, live[MAX_MB] = {0};
    for (int m = 0, j = 0, acc = 0; m < nmb; m++) {
        first[m] = j;
        int goal = (int)((long)total * (m + 1) / nmb);
        /* at least one entry each, and leave one for every later group */
        do {
            acc += ch[j].n_tokens;
            j++;
        } while (j < ns - (nmb - 1 - m) && (m == nmb - 1 || acc + ch[j].n_tokens <= goal));
        count[m] = j - first[m];
    }
    st_moe_work_t w[MAX_MB];
    char why[MAX_MB][256] = {{0}};
    aw->step++;
    st_log_debug("worker %s: step %llu: %d sequences, %d tokens, %d micro-batches", aw->o.name, (unsigned long long)aw->step,
                 ns, total, nmb);
    memset(aw->load, 0, sizeof(uint32_t) * (size_t)aw->c->n_layers * aw->c->n_experts);
    memset(aw->stage, 0, sizeof aw->stage);
    memset(aw->ucx_out, 0, sizeof aw->ucx_out);
    st_engine_get_stats(aw->e, &aw->est);
    aw->t_step = st_time_sec();
    for (int m = 0; m < nmb; m++) {
        if (aw->o.routing == ST_ROUTE_QUANTILE) {
            /* the step's summaries share one budget; a share below one section is refused (the
             * builder keeps its previous budget: at most one section over) */
            (void)st_qsum_set_budget(aw->qsum[m], ST_QSUM_DEFAULT_BUDGET / (size_t)nmb);
            st_qsum_begin(aw->qsum[m], aw->qbuf[m], aw->qcap, (uint32_t)st_member_id(aw->mem), aw->step,
                          aw->qtab.version ? &aw->qtab : NULL);
        }
        aw->hook_mb = m;
        memset(aw->tok_failed[m], 0, sizeof(bool) * (size_t)aw->o.max_batch_tokens);
        if (st_engine_mb_begin(aw->mbs[m], ch + first[m], count[m], aw->logits[m]) != ST_OK) {
            /* validated at admission; reaching here is our bug: fail these sequences cleanly */
            for (int j = 0; j < count[m]; j++) seq_fail(aw, &aw->seqs[idx[first[m] + j]], ST_PROTO_FINISH_ERROR, st_err_last());
            count[m] = 0;
            continue;
        }
        double t0 = st_time_sec();
        st_engine_mb_launch(aw->mbs[m]);
        aw->stage[ST_PROTO_STAGE_LAUNCH] += st_time_sec() - t0;
        live[m] = MB_LAUNCHED;
    }
    /* ping-pong, event-driven: a micro-batch's tokens are at the experts while the others' layers run.
     * Whichever comes first: a micro-batch whose device work is done (st_engine_mb_ready: always on
     * the CPU engine, whose work happens in collect) is collected and dispatched; one whose replies
     * are all in is unpacked and launched again (the GPU engine queues its layers and returns). So
     * the device always has the next layers queued, the expert servers get each hand-off as soon as
     * it exists, and the host's packing, unpacking and the PCIe copies overlap the device. */
    int left = 0, rr = 0;
    for (int m = 0; m < nmb; m++) left += live[m] != MB_DONE;
    while (left > 0) {
        bool moved = false, gpu_busy = false, ucx = false;
        for (int m = 0; m < nmb; m++) ucx |= live[m] == MB_AT_EXPERTS && aw->ucx_out[m];
        if (ucx) dl_poll(aw); /* UCX replies land (replies_in) */
        for (int m = 0; m < nmb; m++) {
            if (live[m] == MB_AT_EXPERTS && replies_in(aw, m)) {
                mb_resume(aw, m, w, why);
                live[m] = MB_LAUNCHED;
                moved = true;
            }
            if (live[m] == MB_LAUNCHED && (aw->sync_mb || st_engine_mb_ready(aw->mbs[m]))) {
                left -= mb_collect(aw, m, w, why, live);
                moved = true;
            }
            gpu_busy |= live[m] == MB_LAUNCHED;
        }
        if (moved) continue;
        int m = rr;
        for (int i = 0; i < nmb; i++, m = (m + 1) % nmb)
            if (live[m] == MB_AT_EXPERTS) break;
        if (live[m] != MB_AT_EXPERTS) { /* only device work outstanding: wait for the first */
            for (m = 0; live[m] != MB_LAUNCHED; m++) {}
            left -= mb_collect(aw, m, w, why, live);
        } else if (gpu_busy) { /* both kinds outstanding: poll both for the spin the data path's waits
                                * use (a role driving a GPU has a core for it), then every 20 µs
                                * (neither a device's work nor a same-host reply wakes an fd) */
            if (poll_either(aw, nmb, live)) continue;
            struct timespec nap = {0, 20000};
            nanosleep(&nap, NULL);
        } else { /* only replies outstanding: wait (bounded) for the oldest dispatch */
            mb_resume(aw, m, w, why);
            live[m] = MB_LAUNCHED;
            rr = (m + 1) % nmb;
        }
    }
    st_mbtune_done(&aw->mbt, total, nmb, st_time_sec() - aw->t_step);
    post_report(aw, nmb);
    /* sample, stream, finish */
    for (int m = 0; m < nmb; m++) {
        /* per-sequence failure: any of its tokens failed at any MoE layer, or the device step failed */
        st_status_t es = count[m] ? st_engine_mb_status(aw->mbs[m]) : ST_OK;
        if (es != ST_OK) {
            snprintf(why[m], sizeof why[m], "worker %s: the device step failed (%s)", aw->o.name, st_status_str(es));
            st_log_every(ST_LOG_ERROR, 5.0, "%s", why[m]);
        }
        int off = 0;
        for (int j = 0; j < count[m]; j++) {
            seq_t *q = &aw->seqs[idx[first[m] + j]];
            int n = ch[first[m] + j].n_tokens, bad = es != ST_OK;
            for (int t = 0; t < n; t++) bad |= aw->tok_failed[m][off + t];
            off += n;
            float *lg = aw->logits[m] + (size_t)j * aw->c->vocab;
            if (bad) {
                seq_fail(aw, q, ST_PROTO_FINISH_ERROR, why[m][0] ? why[m] : "an expert of this request has no live server");
                continue;
            }
            if (!q->prefilled) { /* a prompt piece: sampling starts after the prompt's last one */
                q->n_fed += n;
                if (q->n_fed < q->n_prompt) continue;
            }
            q->prefilled = 1;
            int tok = q->tok;
            q->toks[q->n_prompt + q->n_gen++] = tok;
            st_proto_finish_t fin = is_stop(aw, q, tok) ? ST_PROTO_FINISH_STOP
                                    : q->n_gen >= q->max_tokens ? ST_PROTO_FINISH_LENGTH
                                                                : ST_PROTO_FINISH_NONE;
            emit(aw, q, 1, tok, lg, fin, NULL);
            if (fin != ST_PROTO_FINISH_NONE) seq_end(aw, q);
        }
    }
}

/* No expert map yet (the worker just registered): hold the requests a bounded time for it.
 * Returns 1 when a map arrived; on the deadline fails the admitted sequences and returns 0. */
static int placement_wait(aw_t *aw) {
    if (aw->map_wait_since == 0) aw->map_wait_since = st_time_sec();
    if (aw->place_gen == 0) dl_sleep(aw, st_time_sec() + 0.02); /* a map arrives through dwake */
    int have = aw->place_gen != 0;
    if (have) {
        sync_placement(aw);
        return 1;
    }
    if (st_time_sec() - aw->map_wait_since > aw->o.expert_timeout_ms / 1000.0) {
        for (int i = 0; i < aw->o.max_seqs; i++) /* nothing sent yet: UNAVAILABLE, the coordinator may retry */
            if (aw->seqs[i].used)
                seq_abort(aw, &aw->seqs[i], ST_ERR_PEER, "no expert placement from the coordinator yet");
        aw->map_wait_since = 0;
    }
    return 0;
}

static void chan_bury(aw_t *aw);

/* The data loop's own handles closed and the loop run until they are (UCX destroyed before). */
static void dl_close(aw_t *aw) {
    uv_close((uv_handle_t *)&aw->dwake, NULL);
    uv_close((uv_handle_t *)&aw->dtimer, NULL);
    uv_close((uv_handle_t *)&aw->retry_timer, NULL);
    uv_run(&aw->dloop, UV_RUN_DEFAULT);
}

static void *compute_main(void *arg) {
    aw_t *aw = arg;
    st_cpu_data_thread("st-compute");
    for (;;) {
        /* the data loop's news first (a placement, a lost server), then idle until work, a stop, or a
         * new map (copied at once: retired server slots are reused only after that) */
        dl_turn(aw);
        pthread_mutex_lock(&aw->mu);
        int idle = !aw->stop && !aw->draining && !aw->in_head && aw->active == 0 &&
                   aw->place_gen == aw->place_applied && aw->n_dead == 0;
        /* draining: stop once the requests in flight are done or the grace period is over */
        int stop = aw->stop || (aw->draining && (aw->active == 0 || st_time_sec() >= aw->drain_deadline));
        pthread_mutex_unlock(&aw->mu);
        if (idle) {
            dl_sleep(aw, -1);
            continue;
        }
        chan_bury(aw);
        if (stop) break;
        drain_inbox(aw, 1);
        sync_placement(aw);
        sync_thresholds(aw);
        if (!aw->place_applied && !placement_wait(aw)) continue;
        step(aw);
    }
    /* what is left: a request that has sent nothing ends UNAVAILABLE (the coordinator may send it
     * elsewhere), one that has streamed tokens ends "cancelled" */
    drain_inbox(aw, 0);
    char why[128];
    snprintf(why, sizeof why, "attention worker %s is shutting down", aw->o.name);
    for (int i = 0; i < aw->o.max_seqs; i++) {
        seq_t *q = &aw->seqs[i];
        if (!q->used) continue;
        if (q->n_gen == 0)
            seq_abort(aw, q, ST_ERR_PEER, why);
        else
            seq_fail(aw, q, ST_PROTO_FINISH_CANCELLED, why);
    }
    while (aw->wait_head) {
        in_msg_t *w = aw->wait_head;
        aw->wait_head = w->next;
        end_call(aw, w->req, w->gen, ST_ERR_PEER, why);
        st_proto_generate_req_cleanup(&w->r);
        free(w);
    }
    aw->wait_tail = NULL;
    /* the data plane goes with this thread: UCX closed (what is in flight completes with an error),
     * the channels released, then the data loop's handles */
    st_tp_destroy(aw->tp);
    aw->tp = NULL;
    pthread_mutex_lock(&aw->mu);
    for (int s = 0; s < aw->n_srv; s++)
        if (aw->srv[s].chan) st_xfer_chan_abort(aw->srv[s].chan, "the attention worker is stopping");
    aw->dl_closed = 1;
    pthread_mutex_unlock(&aw->mu);
    dl_close(aw);
    pthread_mutex_lock(&aw->mu);
    aw->compute_done = 1;
    pthread_mutex_unlock(&aw->mu);
    uv_async_send(&aw->async);
    return NULL;
}

/* ================================================================ data plane (compute thread, on dloop) */

static st_status_t alloc_pend(aw_t *aw, int s);
static void on_table_timer(uv_timer_t *t);

static void on_sent(st_tp_send_req_t *req, st_status_t st) {
    pend_t *pd = req->user;
    pd->send_busy = 0;
    if (st == ST_OK) return;
    aw_t *aw = pd->aw;
    pthread_mutex_lock(&aw->mu);
    if (pd->state == P_SENT || pd->state == P_QUEUED) {
        pd->state = P_FAILED;
        snprintf(pd->err, sizeof pd->err, "expert server %s (%s): send failed: %s", aw->srv[pd->s].name,
                 aw->srv[pd->s].endpoint, st_status_str(st));
    }
    pthread_mutex_unlock(&aw->mu);
}

static void do_send(aw_t *aw, int mb, int s) {
    pend_t *pd = &aw->pend[mb][s];
    st_status_t st = ST_ERR_PEER;
    pthread_mutex_lock(&aw->mu);
    /* NOTE: a previous send still held by UCX (slow peer after a timeout) blocks reuse of the record */
    int ok = pd->state == P_QUEUED && aw->srv[s].ep && aw->srv[s].alive && !pd->send_busy;
    if (ok) pd->state = P_SENT;
    pthread_mutex_unlock(&aw->mu);
    if (ok) {
        pd->send.cb = on_sent;
        pd->send.user = pd;
        pd->send_busy = 1;
        pd->t_sent = st_time_sec();
        st = st_tp_send(aw->srv[s].ep, ST_WIRE_AM_DISPATCH, &pd->hdr, sizeof pd->hdr, pd->sbuf, pd->slen, &pd->send);
        if (st != ST_OK) pd->send_busy = 0;
        else aw->ucx_out[mb]++;
    }
    if (st != ST_OK) {
        pthread_mutex_lock(&aw->mu);
        if (pd->state == P_SENT || pd->state == P_QUEUED) {
            pd->state = P_FAILED;
            const srv_t *sv = &aw->srv[s];
            char e[sizeof pd->err];
            snprintf(e, sizeof e, "expert server %s (%s) is not reachable", sv->name, sv->endpoint);
            memcpy(pd->err, e, sizeof e);
        }
        pthread_mutex_unlock(&aw->mu);
    }
}

static st_tp_recv_t *am_begin(void *arg, st_tp_ep_t *ep, const void *hdr, size_t hdr_len, size_t len) {
    aw_t *aw = arg;
    st_wire_info_t info;
    if (st_wire_header_decode(hdr, hdr_len, len, &info) != ST_OK || info.micro_batch >= aw->o.micro_batches) return NULL;
    srv_t *sv = ep ? st_tp_ep_user(ep) : NULL;
    if (!sv) return NULL;
    int s = (int)(sv - aw->srv);
    pend_t *pd = &aw->pend[info.micro_batch][s];
    st_tp_recv_t *r = NULL;
    pthread_mutex_lock(&aw->mu);
    if (pd->state == P_SENT && pd->seq == info.seq && len <= pd->cap) {
        /* it came after this thread's previous poll: now, when the thread was polling or asleep
         * waiting for it (the wake-up is the transport's); when it was busy elsewhere (computing),
         * the earliest it can have come, as shm_wait takes it (that wait is not the transport's).
         * A large reply's data follows (rendezvous): am_done adds the time that takes. */
        double now = st_time_sec();
        pd->t_seen = now;
        pd->t_recv = aw->dl_asleep || now - aw->t_polled < 20e-6
                         ? now
                         : ST_MIN(now, ST_MAX(aw->t_polled, pd->t_sent + info.compute_us * 1e-6));
        pd->recv.buf = pd->rbuf;
        pd->recv.cap = pd->cap;
        pd->recv.user = pd;
        pd->recv_busy = 1;
        r = &pd->recv;
    }
    pthread_mutex_unlock(&aw->mu);
    return r; /* a late reply to a timed-out dispatch is dropped */
}

static void am_done(void *arg, st_tp_recv_t *r) {
    aw_t *aw = arg;
    pend_t *pd = r->user;
    st_wire_info_t info;
    pd->recv_busy = 0;
    pthread_mutex_lock(&aw->mu);
    if (pd->state == P_SENT) {
        if (r->status != ST_OK || st_wire_header_decode(r->hdr, r->hdr_len, r->len, &info) != ST_OK) {
            pd->state = P_FAILED;
            snprintf(pd->err, sizeof pd->err, "expert server %s: bad reply (%s)", aw->srv[pd->s].name, st_status_str(r->status));
        } else if (info.kind == ST_WIRE_KIND_ERROR) {
            pd->state = P_FAILED;
            pd->soft = 1;
            int n = (int)ST_MIN(r->len, sizeof pd->err - 40);
            snprintf(pd->err, sizeof pd->err, "expert server %s: %.*s", aw->srv[pd->s].name, n, (const char *)pd->rbuf);
        } else {
            pd->rlen = r->len;
            pd->t_recv += st_time_sec() - pd->t_seen; /* the arrival (am_begin) + the data's transfer */
            pd->state = P_DONE;
        }
    }
    pthread_mutex_unlock(&aw->mu);
}

static void on_srv_lost(st_tp_ep_t *ep, st_status_t why, void *arg) {
    aw_t *aw = arg;
    srv_t *sv = st_tp_ep_user(ep);
    if (!sv) return;
    st_log_every(ST_LOG_WARN, 1.0, "worker %s: lost expert server %s (%s): %s", aw->o.name, sv->name, sv->endpoint,
                 st_status_str(why));
    pthread_mutex_lock(&aw->mu);
    sv->ep = NULL;
    sv->alive = 0;
    if (sv->chan) { /* the compute thread's wait on it ends now (freed by srv_reap once unused) */
        char e[200];
        snprintf(e, sizeof e, "connection lost (%s)", st_status_str(why));
        st_xfer_chan_abort(sv->chan, e);
    }
    int s = (int)(sv - aw->srv);
    for (int m = 0; m < MAX_MB; m++) {
        pend_t *pd = &aw->pend[m][s];
        if (pd->state == P_SENT || pd->state == P_QUEUED) {
            pd->state = P_FAILED;
            snprintf(pd->err, sizeof pd->err, "lost expert server %s (%s): %s", sv->name, sv->endpoint, st_status_str(why));
        }
    }
    pthread_mutex_unlock(&aw->mu);
}

/* "host:port" (port 0..65535, range-checked: a map's endpoint comes from the network) */
static int split_hostport(const char *s, char *host, size_t hn, uint16_t *port) {
    const char *c = strrchr(s, ':');
    if (!c || c == s || (size_t)(c - s) >= hn) return -1;
    char *end;
    long p = strtol(c + 1, &end, 10);
    if (end == c + 1 || *end || p < 0 || p > 65535) return -1;
    memcpy(host, s, (size_t)(c - s));
    host[c - s] = 0;
    *port = (uint16_t)p;
    return 0;
}

/* ---- the expert-server table (slot fields that the loop thread or channel_attach read change under mu) */

/* Whether retired slot s can be closed and freed: the compute thread has copied a map without it
 * (so no step can name it again) and UCX holds none of its buffers. Under mu. */
static int slot_idle(const aw_t *aw, int s) {
    const srv_t *sv = &aw->srv[s];
    if (sv->state != SRV_RETIRED || aw->place_applied < sv->retired_gen || sv->hello_busy || sv->offer_busy) return 0;
    for (int m = 0; m < MAX_MB; m++) {
        const pend_t *pd = &aw->pend[m][s];
        if (pd->send_busy || pd->recv_busy || pd->state == P_QUEUED || pd->state == P_SENT) return 0;
    }
    return 1;
}

/* A server left the placement (map `gen` no longer names it). It stays connected while a step
 * that began on an older map may still use it; srv_reap closes it afterwards. */
static void srv_retire(aw_t *aw, int s, uint64_t gen, const char *why) {
    srv_t *sv = &aw->srv[s];
    pthread_mutex_lock(&aw->mu);
    sv->state = SRV_RETIRED;
    sv->retired_gen = gen;
    pthread_mutex_unlock(&aw->mu);
    st_log_debug("worker %s: expert server %s (%s) %s", aw->o.name, sv->name, sv->endpoint, why);
}

/* A channel's region unmapped for the engine's device and freed. */
static void chan_free(aw_t *aw, st_xfer_chan_t *ch, bool read) {
    if (!ch) return;
    if (read) {
        void *mem;
        size_t bytes;
        st_xfer_chan_memory(ch, &mem, &bytes);
        st_engine_host_unmap(aw->e, mem);
    }
    st_xfer_chan_destroy(ch);
}

/* A channel no dispatch names any more, for the compute thread to free between steps (the engine may
 * read a reply in it until its step ends). Here at once when it cannot be queued. */
static void chan_retire(aw_t *aw, st_xfer_chan_t *ch, bool read) {
    pthread_mutex_lock(&aw->mu);
    if (aw->n_dead == aw->cap_dead) {
        int cap = aw->cap_dead ? 2 * aw->cap_dead : 8;
        void *p = realloc(aw->chan_dead, sizeof *aw->chan_dead * (size_t)cap);
        if (p) aw->chan_dead = p, aw->cap_dead = cap;
    }
    bool queued = aw->n_dead < aw->cap_dead;
    if (queued) aw->chan_dead[aw->n_dead++] = (struct dead_chan){ch, read};
    wake_compute(aw);
    pthread_mutex_unlock(&aw->mu);
    if (!queued) chan_free(aw, ch, read); /* out of memory for the list: now */
}

/* Compute thread, between steps (and at the end): free the retired channels. */
static void chan_bury(aw_t *aw) {
    for (;;) {
        pthread_mutex_lock(&aw->mu);
        struct dead_chan d = aw->n_dead ? aw->chan_dead[--aw->n_dead] : (struct dead_chan){0};
        pthread_mutex_unlock(&aw->mu);
        if (!d.ch) return;
        chan_free(aw, d.ch, d.read);
    }
}

/* Whether server s's channel can be freed: the slot is being freed or its connection was lost (a
 * server that only timed out keeps it for when it is back), and no dispatch names the channel. Under mu. */
static int chan_unused(const aw_t *aw, int s, int idle) {
    const srv_t *sv = &aw->srv[s];
    if (!sv->chan || (!idle && sv->ep)) return 0;
    for (int m = 0; m < MAX_MB; m++) {
        const pend_t *pd = &aw->pend[m][s];
        if (pd->chan == sv->chan && (pd->state == P_QUEUED || pd->state == P_SENT)) return 0;
    }
    return 1;
}

/* Close the retired servers no step can use any more and free their slots, and the channels of
 * servers that are gone; returns how many retired ones are still waiting. */
static int srv_reap(aw_t *aw) {
    int waiting = 0, closed = 0;
    for (int s = 0; s < aw->n_srv; s++) {
        srv_t *sv = &aw->srv[s];
        pthread_mutex_lock(&aw->mu);
        int idle = slot_idle(aw, s);
        st_xfer_chan_t *ch = chan_unused(aw, s, idle) ? sv->chan : NULL;
        if (ch) {
            sv->chan = NULL;
            for (int m = 0; m < MAX_MB; m++)
                if (aw->pend[m][s].chan == ch) aw->pend[m][s].chan = NULL;
        }
        waiting += sv->state == SRV_RETIRED && !idle;
        st_tp_ep_t *ep = idle ? sv->ep : NULL;
        if (idle) {
            sv->ep = NULL;
            sv->alive = 0;
            sv->state = SRV_FREE;
        }
        pthread_mutex_unlock(&aw->mu);
        if (ch) { /* a dead or departed server's region: freed by the compute thread between steps */
            st_log_info("worker %s: shared-memory channel of expert server %s freed", aw->o.name, sv->name);
            chan_retire(aw, ch, sv->chan_read);
        }
        if (!idle) continue;
        if (ep) st_tp_ep_close(ep); /* NOTE: outside mu (nothing is in flight on it: slot_idle) */
        st_log_debug("worker %s: expert server %s (%s) closed; slot %d free", aw->o.name, sv->name, sv->endpoint, s);
        closed++;
    }
    if (closed)
        st_log_info("worker %s: closed %d expert servers that left the placement; their slots are free", aw->o.name,
                    closed);
    return waiting;
}

/* ---- the same-host path: hello → offer → channel (channel_attach, its own thread) */

static void hello_sent(st_tp_send_req_t *req, st_status_t st) {
    srv_t *sv = req->user;
    sv->hello_busy = 0;
}

/* Ask a newly connected server for a channel; it answers only when it runs on this host. */
static void send_hello(aw_t *aw, srv_t *sv) {
    st_xfer_hello_t h;
    if (!st_tun_int(ST_TUN_XFER_SHM) || sv->hello_busy || sv->chan || /* XFER_SHM=0: over UCX, as across hosts */
        st_xfer_hello_init(&h, (uint32_t)aw->o.micro_batches, aw->pay_cap) != ST_OK)
        return;
    sv->hello.cb = hello_sent;
    sv->hello.user = sv;
    sv->hello_busy = 1;
    if (st_tp_send(sv->ep, ST_WIRE_AM_SHM_HELLO, &h, sizeof h, NULL, 0, &sv->hello) != ST_OK) sv->hello_busy = 0;
}

static st_tp_recv_t *offer_begin(void *arg, st_tp_ep_t *ep, const void *hdr, size_t hdr_len, size_t len) {
    srv_t *sv = ep ? st_tp_ep_user(ep) : NULL;
    if (!sv || sv->offer_busy || len != ST_XFER_HANDLE_BYTES) return NULL;
    sv->offer_busy = 1;
    sv->offer.buf = sv->offer_buf;
    sv->offer.cap = sizeof sv->offer_buf;
    sv->offer.user = sv;
    return &sv->offer;
}

/* A server's offered channel, opened, checked and mapped for the engine's device by a thread of its
 * own: page-locking hundreds of MB takes about a second, which neither the loop thread (its
 * heartbeats would stop) nor the compute thread (a step would stall) can spend. */
typedef struct {
    aw_t *aw;
    int s;
    uint64_t conn;
    uint32_t capacity;
    char name[64], label[sizeof ((srv_t *)0)->name + sizeof ((srv_t *)0)->endpoint + 32];
    uint8_t handle[ST_XFER_HANDLE_BYTES];
} attach_t;

/* The engine's device memory offered to a same-host server, micro-batch by micro-batch through the
 * channel's slots (before any dispatch uses it): the slots it opened, as bits. A server that cannot
 * (on the CPU, another device without peer access, an older build) answers with an error, and those
 * micro-batches' rows go through the channel. */
static uint32_t channel_peer(aw_t *aw, st_xfer_chan_t *ch, const char *name) {
    uint32_t ok = 0;
    for (int m = 0; m < aw->o.micro_batches; m++) {
        const st_engine_peer_mem_t *pm = &aw->peer[m];
        if (!pm->reply) continue;
        st_wire_peer_t w = {.in_off = pm->in_off,
                            .reply_off = pm->reply_off,
                            .in_rows = pm->in_rows,
                            .reply_rows = pm->reply_rows,
                            .row_width = (uint32_t)st_config_expert_width(aw->c)};
        memcpy(w.handle, pm->handle, sizeof w.handle);
        st_wire_info_t info = st_wire_peer_info((1ull << 63) | __atomic_add_fetch(&aw->peer_seq, 1, __ATOMIC_RELAXED));
        st_wire_header_t h;
        st_xfer_msg_t r;
        st_wire_info_t ri;
        memcpy(st_xfer_chan_req_buf(ch, (uint32_t)m), &w, sizeof w);
        st_status_t rc = st_wire_header_encode(&info, &h);
        if (rc == ST_OK) rc = st_xfer_chan_post(ch, (uint32_t)m, &h, sizeof h, sizeof w);
        if (rc == ST_OK) rc = st_xfer_chan_wait_reply(ch, (uint32_t)m, 10000, &r);
        if (rc == ST_OK) rc = st_wire_header_decode(r.hdr, r.hdr_len, r.len, &ri);
        if (rc == ST_OK && ri.kind == ST_WIRE_KIND_COMBINE && ri.seq == info.seq && ri.token_count == 0) {
            ok |= 1u << m;
            continue;
        }
        if (rc == ST_OK && ri.kind == ST_WIRE_KIND_ERROR)
            st_log_info("worker %s: expert server %s reads micro-batch %d's rows through the channel: %.*s", aw->o.name,
                        name, m, (int)ST_MIN(r.len, 200), (const char *)r.payload);
        else
            st_log_warn("worker %s: expert server %s: micro-batch %d's device memory not shared: %s", aw->o.name, name,
                        m, rc == ST_OK ? "unexpected answer" : st_err_last());
        if (rc != ST_OK) break; /* the channel itself failed: its first dispatch will say so */
    }
    if (ok)
        st_log_info("worker %s: expert server %s reads rows and writes results in this engine's device memory",
                    aw->o.name, name);
    return ok;
}

static void *channel_attach(void *arg) {
    attach_t *at = arg;
    aw_t *aw = at->aw;
    srv_t *sv = &aw->srv[at->s];
    st_xfer_chan_t *ch = NULL;
    bool read = false, ok = false;
    if (st_xfer_chan_open(at->handle, sizeof at->handle, &ch) != ST_OK) {
        st_log_info("worker %s: expert server %s stays on UCX: %s", aw->o.name, at->name, st_err_last());
        goto out;
    }
    /* our largest dispatch to it: within our buffers and its --max-rows (send_plan refuses more) */
    size_t need = aw->pay_cap;
    if (at->capacity)
        need = ST_MIN(need, st_wire_dispatch_bytes(at->capacity, (uint32_t)aw->c->n_experts,
                                                   (uint32_t)st_config_expert_width(aw->c), at->capacity, false));
    if (st_xfer_chan_slots(ch) < (uint32_t)aw->o.micro_batches || st_xfer_chan_req_cap(ch) < need) {
        st_log_warn("worker %s: expert server %s offered a channel too small (%u slots of %zu bytes); it stays on UCX",
                    aw->o.name, at->name, st_xfer_chan_slots(ch), st_xfer_chan_req_cap(ch));
        st_xfer_chan_destroy(ch);
        goto out;
    }
    st_xfer_chan_label(ch, at->label);
    uint32_t peer = channel_peer(aw, ch, at->name);
    /* replies read in place by the engine's device (else copied into the work's rows) */
    void *mem;
    size_t bytes;
    st_xfer_chan_memory(ch, &mem, &bytes);
    read = st_engine_host_map(aw->e, mem, bytes) == ST_OK;
    if (!read) st_log_info("worker %s: replies of %s are copied once more: %s", aw->o.name, at->name, st_err_last());
    pthread_mutex_lock(&aw->mu);
    ok = sv->conn == at->conn && sv->alive && !sv->chan;
    if (ok) sv->chan = ch, sv->chan_read = read, sv->chan_peer = peer;
    pthread_mutex_unlock(&aw->mu);
    if (ok)
        st_log_info("worker %s: expert server %s is on this host: dispatches go through shared memory", aw->o.name,
                    at->name);
    else
        chan_retire(aw, ch, read); /* the connection it was for is gone: freed between steps */
out:
    free(at);
    pthread_mutex_lock(&aw->mu);
    aw->n_attach--;
    pthread_cond_broadcast(&aw->cv);
    pthread_mutex_unlock(&aw->mu);
    return NULL;
}

static void offer_done(void *arg, st_tp_recv_t *r) {
    aw_t *aw = arg;
    srv_t *sv = r->user;
    uint32_t magic = 0;
    sv->offer_busy = 0;
    if (r->hdr_len == sizeof magic) memcpy(&magic, r->hdr, sizeof magic);
    if (r->status != ST_OK || r->len != ST_XFER_HANDLE_BYTES || magic != ST_XFER_HELLO_MAGIC || !r->ep || r->ep != sv->ep)
        return;
    attach_t *at = malloc(sizeof *at);
    if (!at) return; /* it stays on UCX */
    at->aw = aw;
    at->s = (int)(sv - aw->srv);
    at->capacity = sv->capacity;
    snprintf(at->name, sizeof at->name, "%s", sv->name);
    snprintf(at->label, sizeof at->label, "expert server %s (%s)", sv->name, sv->endpoint);
    memcpy(at->handle, sv->offer_buf, sizeof at->handle);
    pthread_mutex_lock(&aw->mu);
    at->conn = sv->conn;
    pthread_t th;
    int ok = pthread_create(&th, NULL, channel_attach, at) == 0;
    if (ok) {
        pthread_detach(th);
        aw->n_attach++;
    }
    pthread_mutex_unlock(&aw->mu);
    if (!ok) free(at);
}

/* Connect free slot s to member mm. ST_OK: the slot is in use. */
static st_status_t srv_connect(aw_t *aw, int s, const st_proto_member_t *mm) {
    if (alloc_pend(aw, s) != ST_OK) return ST_ERR_NO_MEMORY; /* membership change, not the token path */
    srv_t *sv = &aw->srv[s];
    char name[sizeof sv->name], endpoint[sizeof sv->endpoint], host[128];
    uint16_t port;
    snprintf(name, sizeof name, "%s", mm->name ? mm->name : "?");
    snprintf(endpoint, sizeof endpoint, "%s", mm->data_endpoint ? mm->data_endpoint : "");
    st_tp_ep_t *ep = NULL;
    if (split_hostport(endpoint, host, sizeof host, &port) != 0 || port == 0) {
        st_log_every(ST_LOG_WARN, 10.0, "worker %s: expert server %s has no usable endpoint '%s'", aw->o.name, name,
                     endpoint);
        return ST_ERR_INVALID_ARG;
    }
    if (st_tp_connect(aw->tp, host, port, &ep) != ST_OK) return ST_ERR_PEER;
    pthread_mutex_lock(&aw->mu);
    memcpy(sv->name, name, sizeof name);
    memcpy(sv->endpoint, endpoint, sizeof endpoint);
    sv->id = mm->member_id;
    sv->capacity = mm->capacity;
    sv->ep = ep;
    sv->alive = 1;
    sv->state = SRV_USED;
    sv->conn++;
    for (int m = 0; m < MAX_MB; m++)
        aw->pend[m][s].state = P_IDLE;
    if (s == aw->n_srv) aw->n_srv++;
    pthread_mutex_unlock(&aw->mu);
    st_tp_ep_set_user(ep, sv);
    st_tp_ep_on_lost(ep, on_srv_lost, aw);
    st_log_info("worker %s: connected to expert server %s at %s (slot %d)", aw->o.name, sv->name, sv->endpoint, s);
    send_hello(aw, sv);
    return ST_OK;
}

typedef struct {
    uint64_t id;
    int mi;   /* index in placement.members */
    int held; /* among the first R holders of some expert */
    int slot; /* -1: not connected */
} holder_t;

static int holder_cmp(const void *a, const void *b) {
    uint64_t x = ((const holder_t *)a)->id, y = ((const holder_t *)b)->id;
    return x < y ? -1 : x > y;
}

static holder_t *holder_find(holder_t *hs, size_t n, uint64_t id) {
    holder_t key = {.id = id};
    return bsearch(&key, hs, n, sizeof *hs, holder_cmp);
}

/* Apply a map: retire the servers that hold nothing in it, give every new holder a free slot and
 * connect, rebuild the holder table. Returns how many holders got no slot (the table is full, or
 * its retired slots are not free yet: on_table_timer tries again), -1 when out of memory. */
static int apply_placement(aw_t *aw, const st_proto_placement_t *p) {
    const st_config_t *c = aw->c;
    size_t cells = (size_t)c->n_layers * c->n_experts;
    holder_t *hs = malloc(sizeof *hs * (p->n_members ? p->n_members : 1));
    if (!hs) return -1;
    size_t nh = 0;
    for (size_t i = 0; i < p->n_members; i++)
        if (p->members[i].role == ST_PROTO_ROLE_EXPERT && p->members[i].alive)
            hs[nh++] = (holder_t){.id = p->members[i].member_id, .mi = (int)i, .slot = -1};
    qsort(hs, nh, sizeof *hs, holder_cmp);
    /* only servers this worker would dispatch to take a slot: the first R holders of each expert */
    for (size_t i = 0; i < cells; i++)
        for (uint32_t k = p->offsets[i], r = 0; k < p->offsets[i + 1] && k < p->n_member_ids && r < (uint32_t)aw->R;
             k++) {
            holder_t *h = holder_find(hs, nh, p->member_ids[k]);
            if (h) h->held = 1, r++;
        }
    uint64_t gen = aw->place_gen + 1;
    srv_reap(aw);
    for (int s = 0; s < aw->n_srv; s++) {
        srv_t *sv = &aw->srv[s];
        if (sv->state == SRV_FREE) continue;
        holder_t *h = holder_find(hs, nh, sv->id);
        if (h && h->held && h->slot < 0) { /* stays (or, retired but not closed yet, comes back) */
            h->slot = s;
            if (sv->state == SRV_RETIRED) {
                pthread_mutex_lock(&aw->mu);
                sv->state = SRV_USED;
                pthread_mutex_unlock(&aw->mu);
            }
        } else if (sv->state == SRV_USED) {
            srv_retire(aw, s, gen, h ? "holds no expert in the new placement" : "left the placement");
        }
    }
    int missing = 0;
    const st_proto_member_t *first_missing = NULL;
    for (size_t i = 0; i < nh; i++) {
        holder_t *h = &hs[i];
        if (!h->held || h->slot >= 0) continue;
        int s = -1;
        pthread_mutex_lock(&aw->mu);
        for (int k = 0; k < aw->n_srv && s < 0; k++)
            if (aw->srv[k].state == SRV_FREE) s = k;
        if (s < 0 && aw->n_srv < MAX_SERVERS) s = aw->n_srv;
        pthread_mutex_unlock(&aw->mu);
        if (s < 0) {
            if (!missing++) first_missing = &p->members[h->mi];
            continue;
        }
        if (srv_connect(aw, s, &p->members[h->mi]) == ST_OK) h->slot = s;
    }
    pthread_mutex_lock(&aw->mu);
    for (size_t i = 0; i < cells * (size_t)aw->R; i++)
        aw->holders[i] = -1;
    for (size_t i = 0; i < cells; i++) {
        int r = 0;
        for (uint32_t k = p->offsets[i]; k < p->offsets[i + 1] && k < p->n_member_ids && r < aw->R; k++) {
            holder_t *h = holder_find(hs, nh, p->member_ids[k]);
            if (h && h->slot >= 0) aw->holders[i * aw->R + r++] = h->slot;
        }
    }
    /* a held server is usable while we hold an endpoint to it (a lost one stays out until the
     * coordinator drops it from the map) */
    for (size_t i = 0; i < nh; i++)
        if (hs[i].slot >= 0) aw->srv[hs[i].slot].alive = aw->srv[hs[i].slot].ep != NULL;
    if (missing)
        snprintf(aw->srv_full, sizeof aw->srv_full,
                 "the worker's expert-server table is full (%d slots): expert server %.48s (%.64s)%s not connected",
                 MAX_SERVERS, first_missing->name ? first_missing->name : "?",
                 first_missing->data_endpoint ? first_missing->data_endpoint : "", missing > 1 ? " and others" : "");
    else
        aw->srv_full[0] = 0;
    aw->place_gen = gen;
    aw->place_version = p->version;
    pthread_mutex_unlock(&aw->mu);
    free(hs);
    if (missing)
        st_log_every(ST_LOG_WARN, 10.0, "worker %s: placement v%llu: %d expert servers have no slot: %s", aw->o.name,
                     (unsigned long long)p->version, missing, aw->srv_full);
    return missing;
}

/* Table upkeep: while retired servers wait to be closed, or holders of the newest map wait for a
 * slot, a timer (50 ms, backing off to 2 s) reaps and re-applies that map. p: a new map (kept,
 * encoded, when some holders had no slot). */
static void table_upkeep(aw_t *aw, const st_proto_placement_t *p, int missing, int retired) {
    if (p) {
        free(aw->place_copy);
        aw->place_copy = NULL;
        if (missing > 0 && st_proto_placement_encode(p, &aw->place_copy, &aw->place_copy_len) != ST_OK)
            aw->place_copy = NULL;
        aw->retry_ms = 50;
    } else {
        if (missing <= 0) {
            free(aw->place_copy);
            aw->place_copy = NULL;
        }
        aw->retry_ms = ST_MIN(aw->retry_ms * 2, 2000u);
    }
    if ((aw->place_copy || retired > 0) && !aw->compute_done)
        uv_timer_start(&aw->retry_timer, on_table_timer, aw->retry_ms, 0);
    else
        uv_timer_stop(&aw->retry_timer);
}

static void on_table_timer(uv_timer_t *t) {
    aw_t *aw = t->data;
    if (aw->compute_done) return;
    int missing = 0;
    if (aw->place_copy) {
        st_proto_placement_t p;
        if (st_proto_placement_decode(aw->place_copy, aw->place_copy_len, &p) == ST_OK) {
            missing = apply_placement(aw, &p); /* reaps first */
            st_proto_placement_cleanup(&p);
        }
    }
    table_upkeep(aw, NULL, missing, srv_reap(aw));
}

/* New map (compute thread): follow the expert servers it names, rebuild the holder table. */
static void placement_follow(aw_t *aw, const st_proto_placement_t *p) {
    int missing = apply_placement(aw, p);
    if (missing < 0) {
        st_log_every(ST_LOG_ERROR, 10.0, "worker %s: placement v%llu: out of memory; kept the previous map", aw->o.name,
                     (unsigned long long)p->version);
        return;
    }
    table_upkeep(aw, p, missing, srv_reap(aw));
    int n = 0;
    for (int s = 0; s < aw->n_srv; s++)
        n += aw->srv[s].state == SRV_USED;
    st_log_info("worker %s: placement v%llu applied (%d expert servers%s)", aw->o.name, (unsigned long long)p->version,
                n, missing ? ", some without a slot" : "");
}

/* dwake: the newest map the loop thread handed over, if any (the wake-up itself ends a turn of dloop). */
static void on_dwake(uv_async_t *a) {
    aw_t *aw = a->data;
    pthread_mutex_lock(&aw->mu);
    uint8_t *buf = aw->place_in;
    size_t len = aw->place_in_len;
    aw->place_in = NULL;
    pthread_mutex_unlock(&aw->mu);
    if (!buf) return;
    st_proto_placement_t p;
    if (st_proto_placement_decode(buf, len, &p) == ST_OK) {
        placement_follow(aw, &p);
        st_proto_placement_cleanup(&p);
    } else {
        st_log_every(ST_LOG_ERROR, 10.0, "worker %s: placement hand-over: %s", aw->o.name, st_err_last());
    }
    free(buf);
}

/* ================================================================ loop thread */

/* New map (membership, loop thread): checked, then handed to the compute thread, which owns the
 * server table (a newer map replaces one it has not applied yet). */
static void on_placement(void *arg, const st_proto_placement_t *p) {
    aw_t *aw = arg;
    const st_config_t *c = aw->c;
    if ((int)p->n_layers != c->n_layers || (int)p->n_experts != c->n_experts || !p->offsets) {
        st_log_every(ST_LOG_ERROR, 10.0, "worker %s: placement is %u×%u, model has %d×%d layers×experts; ignored",
                     aw->o.name, p->n_layers, p->n_experts, c->n_layers, c->n_experts);
        return;
    }
    uint8_t *buf = NULL;
    size_t len = 0;
    if (st_proto_placement_encode(p, &buf, &len) != ST_OK) {
        st_log_every(ST_LOG_ERROR, 10.0, "worker %s: placement v%llu: %s; kept the previous map", aw->o.name,
                     (unsigned long long)p->version, st_err_last());
        return;
    }
    pthread_mutex_lock(&aw->mu);
    free(aw->place_in);
    aw->place_in = buf;
    aw->place_in_len = len;
    wake_compute(aw);
    pthread_mutex_unlock(&aw->mu);
}

/* The coordinator knows this worker: from now on only its member token opens Worker/Generate. */
static void on_registered(void *arg, uint64_t member_id, const char *member_token) {
    aw_t *aw = arg;
    if (!aw->secure) return; /* --insecure: the port is open (loopback experiments) */
    if (member_token && member_token[0]) {
        st_rpc_server_set_token(aw->rpc, member_token);
        st_log_info("worker %s: registered as %llu; Worker/Generate takes the coordinator's token", aw->o.name,
                    (unsigned long long)member_id);
    } else {
        st_log_every(ST_LOG_WARN, 60.0,
                     "worker %s: the coordinator sent no member token: Worker/Generate stays closed "
                     "(is the coordinator running without the cluster secret?)",
                     aw->o.name);
    }
}

/* loop → compute: append to the inbox and wake the compute thread */
static void inbox_push(aw_t *aw, in_msg_t *m) {
    pthread_mutex_lock(&aw->mu);
    if (aw->in_tail) aw->in_tail->next = m;
    else aw->in_head = m;
    aw->in_tail = m;
    wake_compute(aw);
    pthread_mutex_unlock(&aw->mu);
}

static void on_call_cancel(st_rpc_call_t *call, void *arg) {
    req_t *rq = arg;
    if (rq->call != call) return;
    rq->call = NULL; /* compute side learns through the inbox (the next chunk's write) */
    st_rpc_call_finish(call, ST_ERR_CANCELLED, "cancelled"); /* releases the call now */
}

static void handle_generate(st_rpc_call_t *call, const uint8_t *req, size_t len, void *arg) {
    aw_t *aw = arg;
    in_msg_t *m = calloc(1, sizeof *m);
    if (!m) {
        st_rpc_call_finish(call, ST_ERR_NO_MEMORY, "out of memory");
        return;
    }
    if (st_proto_generate_req_decode(req, len, &m->r) != ST_OK) {
        st_rpc_call_finish(call, ST_ERR_INVALID_ARG, st_err_last());
        free(m);
        return;
    }
    /* a client's mistake ends here, before anything is sized from the request */
    char why[256] = "";
    st_status_t st = st_aw_check_request(aw->c, &aw->lim, &m->r, &m->n_prompt, &m->max_tokens);
    if (st != ST_OK) snprintf(why, sizeof why, "%s", st_err_last());
    int slot = -1;
    for (int i = 0; i < aw->n_reqs && st == ST_OK; i++)
        if (!aw->reqs[i].used) { slot = i; break; }
    if (st == ST_OK) {
        /* full or draining: RESOURCE_EXHAUSTED before any chunk, so the coordinator queues or
         * sends it elsewhere */
        pthread_mutex_lock(&aw->mu);
        if (aw->stop || aw->draining) {
            st = ST_ERR_CAPACITY;
            snprintf(why, sizeof why, "attention worker %s is draining (shutting down)", aw->o.name);
        } else if (slot < 0 || aw->active >= (uint32_t)aw->o.max_seqs) {
            st = ST_ERR_CAPACITY;
            snprintf(why, sizeof why, "attention worker %s is full (%d sequences)", aw->o.name, aw->o.max_seqs);
        } else {
            aw->active++;
        }
        pthread_mutex_unlock(&aw->mu);
    }
    if (st != ST_OK) {
        st_proto_generate_req_cleanup(&m->r);
        free(m);
        st_rpc_call_finish(call, st, why);
        return;
    }
    req_t *rq = &aw->reqs[slot];
    rq->used = 1;
    rq->gen++;
    rq->call = call;
    st_rpc_call_on_cancel(call, on_call_cancel, rq);
    m->kind = IN_NEW;
    m->req = slot;
    m->gen = rq->gen;
    inbox_push(aw, m);
}

static void cancel_to_compute(aw_t *aw, int req, uint64_t gen) {
    in_msg_t *m = calloc(1, sizeof *m);
    if (!m) return;
    m->kind = IN_CANCEL;
    m->req = req;
    m->gen = gen;
    inbox_push(aw, m);
}

static void on_rpc_closed(void *arg) {
    aw_t *aw = arg; /* the compute thread has left, with UCX (compute_main) */
    st_rpc_cleanup();
    uv_close((uv_handle_t *)&aw->async, NULL);
    uv_close((uv_handle_t *)&aw->sig_int, NULL);
    uv_close((uv_handle_t *)&aw->sig_term, NULL);
    uv_close((uv_handle_t *)&aw->flush_timer, NULL);
}

static void on_member_stopped(void *arg) {
    aw_t *aw = arg;
    st_rpc_server_close(aw->rpc, on_rpc_closed, aw);
}

/* After a drain: the last chunks and statuses have been handed to gRPC; give them a moment to leave
 * before closing the server cancels whatever is still queued. */
static void on_flushed(uv_timer_t *t) {
    aw_t *aw = t->data;
    st_member_stop(aw->mem, on_member_stopped, aw);
}

static void on_reported(st_status_t st, const uint8_t *reply, size_t len, const char *detail, void *arg) {
    aw_t *aw = arg;
    aw->reports_inflight--;
    if (st != ST_OK) st_log_debug("worker %s: ReportScores: %s (%s)", aw->o.name, st_status_str(st), detail ? detail : "");
}

static void on_thresholds(void *arg, const st_proto_thresholds_t *t) {
    aw_t *aw = arg;
    size_t cells = (size_t)aw->c->n_layers * aw->c->n_experts;
    /* rho: every row, or (format 2) only the probed layers' rows; decode checked the layer list */
    if (t->n_layers != (uint32_t)aw->c->n_layers || t->n_experts != (uint32_t)aw->c->n_experts || !t->tau ||
        (t->n_rho_layers ? t->n_rho != t->n_rho_layers * t->n_experts : t->n_rho != cells)) {
        st_log_every(ST_LOG_ERROR, 10.0, "worker %s: thresholds of the wrong shape; ignored", aw->o.name);
        return;
    }
    pthread_mutex_lock(&aw->mu);
    memcpy(aw->tau_in, t->tau, sizeof(float) * cells);
    if (t->n_rho_layers) {
        for (size_t i = 0; i < cells; i++) aw->rho_in[i] = NAN;
        for (size_t i = 0; i < t->n_rho_layers; i++)
            memcpy(aw->rho_in + (size_t)t->rho_layers[i] * t->n_experts, t->rho + i * t->n_experts, sizeof(float) * t->n_experts);
    } else {
        memcpy(aw->rho_in, t->rho, sizeof(float) * cells);
    }
    aw->tau_in_version = t->version;
    pthread_mutex_unlock(&aw->mu);
}

static void on_async(uv_async_t *a) {
    aw_t *aw = a->data;
    pthread_mutex_lock(&aw->mu);
    ev_t *ev = aw->ev_head;
    aw->ev_head = aw->ev_tail = NULL;
    int done = aw->compute_done, drained = aw->draining && !aw->stop;
    pthread_mutex_unlock(&aw->mu);
    while (ev) {
        ev_t *next = ev->next;
        if (ev->kind == EV_REPORT) {
            st_member_set_step(aw->mem, ev->gen); /* the member is the loop's */
            /* never wait on the coordinator: with two reports still in flight, drop this one */
            if (aw->reports_inflight < 2 &&
                st_member_report_scores(aw->mem, ev->bytes, ev->len, 2000, on_reported, aw) == ST_OK) /* NOTE: the request bytes are copied: the buffer is free again */
                aw->reports_inflight++;
        } else if (ev->kind == EV_END) { /* no chunk was sent: end with a status */
            req_t *rq = &aw->reqs[ev->req];
            if (rq->used && rq->gen == ev->gen) {
                if (rq->call) st_rpc_call_finish(rq->call, ev->status, (const char *)ev->inl);
                rq->used = 0;
                rq->call = NULL;
            }
        } else {
            req_t *rq = &aw->reqs[ev->req];
            if (rq->used && rq->gen == ev->gen) {
                if (rq->call) {
                    if (st_rpc_call_write(rq->call, ev->bytes, ev->len) != ST_OK && !ev->finish) {
                        /* the client is gone: stop generating for it */
                        cancel_to_compute(aw, ev->req, ev->gen);
                    }
                    if (ev->finish) st_rpc_call_finish(rq->call, ST_OK, NULL);
                } else if (!ev->finish) {
                    cancel_to_compute(aw, ev->req, ev->gen);
                }
                if (ev->finish) {
                    rq->used = 0;
                    rq->call = NULL;
                }
            }
        }
        ev_put(aw, ev);
        ev = next;
    }
    if (done && aw->compute_done != 2) {
        aw->compute_done = 2;
        if (drained) {
            st_log_info("worker %s: drained; exiting", aw->o.name);
            uv_timer_start(&aw->flush_timer, on_flushed, 200, 0);
        } else {
            st_member_stop(aw->mem, on_member_stopped, aw);
        }
    }
}

/* SIGTERM drains (new requests refused, those in flight finish within --drain-timeout-s); SIGINT,
 * or a second signal, stops at once. */
static void on_signal(uv_signal_t *h, int sig) {
    aw_t *aw = h->data;
    pthread_mutex_lock(&aw->mu);
    int already = aw->stop, drain = sig == SIGTERM && !aw->draining && !aw->stop;
    uint32_t n = aw->active;
    if (drain) {
        aw->draining = 1;
        aw->drain_deadline = st_time_sec() + aw->o.drain_timeout_s;
    } else {
        aw->stop = 1;
    }
    wake_compute(aw);
    pthread_mutex_unlock(&aw->mu);
    if (drain)
        st_log_info("worker %s: SIGTERM: draining %u requests in flight (at most %d s); new requests are refused",
                    aw->o.name, n, aw->o.drain_timeout_s);
    else if (!already)
        st_log_info("worker %s: signal %d, stopping now (%u requests in flight)", aw->o.name, sig, n);
}

/* Reported in heartbeats: a draining worker shows itself full, so the coordinator sends it nothing. */
static uint32_t inflight(void *arg) {
    aw_t *aw = arg;
    pthread_mutex_lock(&aw->mu);
    uint32_t n = aw->active;
    if (aw->draining || aw->stop) n = ST_MAX(n, (uint32_t)aw->o.max_seqs);
    pthread_mutex_unlock(&aw->mu);
    return n;
}

/* ================================================================ start-up */

static st_status_t alloc_buffers(aw_t *aw) {
    const st_config_t *c = aw->c;
    int kc = ST_MAX(c->top_k, aw->o.routing == ST_ROUTE_QUANTILE ? (aw->o.k_max > 0 ? aw->o.k_max : 2 * c->top_k) : 0);
    int rows = aw->o.max_batch_tokens * kc, ew = st_config_expert_width(c);
    /* the largest message either way: a distinct-row dispatch with every row distinct (≥ plain rows),
     * fp32 (≥ bf16) */
    aw->pay_cap = st_wire_dispatch_bytes((uint32_t)rows, (uint32_t)c->n_experts, (uint32_t)ew, (uint32_t)rows, false);
    aw->R = 8;
    size_t cells = (size_t)c->n_layers * c->n_experts * aw->R;
    aw->holders = malloc(sizeof(int) * cells);
    aw->hl = malloc(sizeof(int) * cells);
    for (int m = 0; m < MAX_MB; m++)
        if (!(aw->server_of[m] = malloc(sizeof(int) * (size_t)c->n_experts))) return ST_FAIL(ST_ERR_NO_MEMORY, "worker tables");
    aw->server_of2 = malloc(sizeof(int) * (size_t)c->n_experts);
    aw->seqs = calloc((size_t)aw->o.max_seqs, sizeof(seq_t));
    aw->n_reqs = aw->o.max_seqs * 2;
    aw->reqs = calloc((size_t)aw->n_reqs, sizeof(req_t));
    if (!aw->holders || !aw->hl || !aw->server_of2 || !aw->seqs || !aw->reqs)
        return ST_FAIL(ST_ERR_NO_MEMORY, "worker tables");
    for (size_t i = 0; i < cells; i++) aw->holders[i] = aw->hl[i] = -1;
    size_t tc = (size_t)c->n_layers * c->n_experts;
    aw->tau_in = malloc(sizeof(float) * tc);
    aw->rho_in = malloc(sizeof(float) * tc);
    aw->tau_cur = malloc(sizeof(float) * tc);
    aw->rho_cur = malloc(sizeof(float) * tc);
    aw->load = calloc(tc, sizeof(uint32_t));
    if (!aw->tau_in || !aw->rho_in || !aw->tau_cur || !aw->rho_cur || !aw->load) return ST_FAIL(ST_ERR_NO_MEMORY, "worker tables");
    int n_ev = aw->o.max_seqs * 4 + MAX_MB * MAX_SERVERS * 2 + 16;
    aw->ev_pool = calloc((size_t)n_ev, sizeof(ev_t));
    if (!aw->ev_pool) return ST_FAIL(ST_ERR_NO_MEMORY, "worker event pool");
    for (int i = 0; i < n_ev; i++) {
        aw->ev_pool[i].next = aw->ev_free;
        aw->ev_free = &aw->ev_pool[i];
    }
    uint32_t n_moe = (uint32_t)(c->n_layers - c->first_k_dense);
    aw->qcap = st_qsum_max_bytes(n_moe, (uint32_t)c->n_experts, (uint32_t)c->top_k, (uint32_t)aw->o.max_batch_tokens);
    for (int m = 0; m < aw->o.micro_batches && aw->o.routing == ST_ROUTE_QUANTILE; m++) {
        aw->qbuf[m] = malloc(aw->qcap);
        if (!aw->qbuf[m] || st_qsum_create(n_moe, (uint32_t)c->n_experts, (uint32_t)c->top_k,
                                           (uint32_t)aw->o.max_batch_tokens, &aw->qsum[m]) != ST_OK)
            return ST_FAIL(ST_ERR_NO_MEMORY, "score summaries");
    }
    /* a report: the summaries plus loads (5 bytes a cell at most) and small fields; the budget
     * keeps it far below this */
    aw->rep_cap = (aw->o.routing == ST_ROUTE_QUANTILE ? (size_t)aw->o.micro_batches * aw->qcap : 0) + tc * 6 + REPORT_FIXED;
    for (int i = 0; i < 2; i++)
        if (!(aw->rep_buf[i] = malloc(aw->rep_cap))) return ST_FAIL(ST_ERR_NO_MEMORY, "report buffers");
    if (st_dispatch_plan_init(&aw->plan2, MAX_SERVERS, c->n_experts, rows) != ST_OK) return ST_ERR_NO_MEMORY;
    for (int m = 0; m < aw->o.micro_batches; m++) {
        if (st_engine_mb_create(aw->e, &aw->mbs[m]) != ST_OK) return ST_ERR_NO_MEMORY;
        /* a GPU engine's device memory, for same-host servers to read rows from and write results into */
        if (st_engine_mb_peer_mem(aw->mbs[m], &aw->peer[m]) != ST_OK) memset(&aw->peer[m], 0, sizeof aw->peer[m]);
        if (st_dispatch_plan_init(&aw->plan[m], MAX_SERVERS, c->n_experts, rows) != ST_OK) return ST_ERR_NO_MEMORY;
        aw->tok_failed[m] = calloc((size_t)aw->o.max_batch_tokens, sizeof(bool));
        /* logits rows of the entries (the CPU engine processes its sampled rows here; copied to the
         * host by the GPU engine only for dump_logits requests) */
        aw->logits[m] = malloc(sizeof(float) * (size_t)aw->o.max_seqs * c->vocab);
        if (!aw->tok_failed[m] || !aw->logits[m]) return ST_FAIL(ST_ERR_NO_MEMORY, "worker buffers");
    }
    return ST_OK;
}

static st_status_t alloc_pend(aw_t *aw, int s) {
    for (int m = 0; m < aw->o.micro_batches; m++) {
        pend_t *pd = &aw->pend[m][s];
        if (pd->sbuf) continue;
        pd->aw = aw;
        pd->mb = m;
        pd->s = s;
        pd->cap = aw->pay_cap + ST_WIRE_MAX_ERROR_TEXT;
        pd->sbuf = malloc(aw->pay_cap);
        /* replies land where the engine's device reads them (else each row is copied once more) */
        pd->rbuf = st_engine_host_alloc(aw->e, pd->cap);
        pd->rbuf_read = pd->rbuf != NULL;
        if (!pd->rbuf) pd->rbuf = malloc(pd->cap);
        if (!pd->sbuf || !pd->rbuf) return ST_FAIL(ST_ERR_NO_MEMORY, "dispatch buffers");
    }
    return ST_OK;
}

int st_aw_run(const st_aw_opts_t *opts) {
    st_engine_process_init(); /* before CUDA starts: our kernels load at start-up, not mid-step */
    aw_t *aw = calloc(1, sizeof *aw);
    if (!aw) return 1;
    aw->o = *opts;
    if (!aw->o.name) aw->o.name = "attn";
    if (!aw->o.listen) aw->o.listen = "127.0.0.1:0";
    if (aw->o.max_seqs <= 0) aw->o.max_seqs = 16;
    if (aw->o.max_seqs > 256) aw->o.max_seqs = 256;
    if (aw->o.max_batch_tokens <= 0) aw->o.max_batch_tokens = 2048;
    if (aw->o.max_ctx <= 0) aw->o.max_ctx = 4096;
    if (aw->o.max_ctx < 2) aw->o.max_ctx = 2; /* a prompt token and a generated one */
    if (aw->o.micro_batches <= 0) aw->o.micro_batches = 2;
    if (aw->o.micro_batches > MAX_MB) aw->o.micro_batches = MAX_MB;
    if (aw->o.min_mb_tokens <= 0) aw->o.min_mb_tokens = 16;
    st_mbtune_init(&aw->mbt, aw->o.micro_batches, aw->o.min_mb_tokens);
    aw->sync_mb = st_tun_int(ST_TUN_WORKER_SYNC) != 0;
    if (!aw->o.expert_timeout_ms) aw->o.expert_timeout_ms = 5000;
    if (aw->o.drain_timeout_s < 0) aw->o.drain_timeout_s = 30;
    const st_sec_opts_t *sec = aw->o.sec;
    aw->secure = sec && sec->have_secret;
    int rc = 1;
    if (st_ckpt_open(&aw->ck, aw->o.ckpt) != ST_OK) goto out;
    aw->c = st_ckpt_config(aw->ck);
    if (aw->c->n_experts <= 0 || aw->c->n_experts > 4096) {
        ST_FAIL(ST_ERR_CONFIG, "%s: the distributed worker needs 1..4096 routed experts", aw->o.ckpt);
        goto out_ck;
    }
    st_engine_opts_t eo;
    st_engine_opts_default(&eo);
    eo.max_seqs = aw->o.max_seqs;
    eo.max_batch_tokens = aw->o.max_batch_tokens;
    eo.max_ctx = aw->o.max_ctx;
    eo.routing = aw->o.routing;
    eo.k_max = aw->o.k_max;
    eo.remote_experts = true;
    eo.device = aw->o.device;
    /* the host releases every hand-off within a plan's wait and its retry round */
    eo.handoff_timeout_ms = (int)ST_MIN(2ull * aw->o.expert_timeout_ms + 5000u, (unsigned long long)INT_MAX);
    st_xfer_set_spin(aw->o.device >= 0);
    if (st_engine_create(&aw->e, aw->ck, &eo) != ST_OK) goto out_ck;
    if (alloc_buffers(aw) != ST_OK) goto out_engine;
    /* a prompt longer than a step's budget is prefilled over several steps; prompt + generated
     * tokens fit the context */
    aw->lim = (st_aw_limits_t){.max_ctx = aw->o.max_ctx, .max_prompt = aw->o.max_ctx - 1, .max_stop = MAX_STOP};
    /* until the coordinator gives its member token, Worker/Generate requires a random one: nobody
     * gets in before registration */
    st_rpc_sec_t ssec = {0};
    if (aw->secure) {
        uint8_t rnd[32];
        if (st_random_bytes(rnd, sizeof rnd) != ST_OK) goto out_engine;
        st_hex(rnd, sizeof rnd, aw->boot_token);
        ssec.token = aw->boot_token;
    }
    if (sec) {
        ssec.tls_cert = sec->tls_cert;
        ssec.tls_key = sec->tls_key;
        aw->member_sec = (st_rpc_sec_t){.token = aw->secure ? sec->grpc_token : NULL,
                                        .tls = sec->tls || sec->tls_cert,
                                        .tls_cert = sec->tls_cert,
                                        .tls_key = sec->tls_key,
                                        .tls_ca = sec->tls_ca};
    }
    /* the engine's kernel threads exist: this thread and the libraries' threads to the control CPUs */
    char who[96];
    snprintf(who, sizeof who, "worker %s", aw->o.name);
    st_cpu_control(who);
    uv_loop_init(&aw->loop);
    pthread_mutex_init(&aw->mu, NULL);
    pthread_cond_init(&aw->cv, NULL);
    pthread_cond_init(&aw->cv_ev, NULL);
    uv_async_init(&aw->loop, &aw->async, on_async);
    aw->async.data = aw;
    uv_timer_init(&aw->loop, &aw->flush_timer);
    /* the data loop: made and set up here, run by the compute thread once it starts */
    uv_loop_init(&aw->dloop);
    uv_async_init(&aw->dloop, &aw->dwake, on_dwake);
    uv_timer_init(&aw->dloop, &aw->dtimer);
    uv_timer_init(&aw->dloop, &aw->retry_timer);
    aw->retry_timer.data = aw->flush_timer.data = aw->dwake.data = aw;
    if (st_rpc_init(&aw->loop) != ST_OK) goto out_loop;
    if (st_tp_create(&aw->dloop, &aw->tp) != ST_OK) goto out_rpc;
    if (aw->secure) st_tp_set_secret(aw->tp, &sec->secret); /* before any connection */
    {
        char lh[128];
        uint16_t lp;
        if (split_hostport(aw->o.listen, lh, sizeof lh, &lp) == 0) st_tp_set_local_host(aw->tp, lh);
    }
    if (st_tp_set_am_handler(aw->tp, ST_WIRE_AM_REPLY, am_begin, am_done, aw) != ST_OK ||
        st_tp_set_am_handler(aw->tp, ST_WIRE_AM_SHM_OFFER, offer_begin, offer_done, aw) != ST_OK)
        goto out_tp;
    if (st_rpc_server_create_ex(aw->o.listen, &ssec, &aw->rpc) != ST_OK ||
        st_rpc_server_add_method(aw->rpc, ST_PROTO_METHOD_WORKER_GENERATE, handle_generate, aw) != ST_OK ||
        st_rpc_server_start(aw->rpc, &aw->rpc_port) != ST_OK)
        goto out_tp;
    char host[128], endpoint[200];
    uint16_t p0;
    if (split_hostport(aw->o.listen, host, sizeof host, &p0) != 0) snprintf(host, sizeof host, "127.0.0.1");
    snprintf(endpoint, sizeof endpoint, "%s:%d", host, aw->rpc_port);
    st_member_opts_t mo = {.role = ST_PROTO_ROLE_ATTENTION,
                           .name = aw->o.name,
                           .data_endpoint = endpoint,
                           .capacity = (uint32_t)aw->o.max_seqs,
                           .coordinator = aw->o.coordinator,
                           .coordinator_file = aw->o.coordinator_file,
                           .on_placement = on_placement,
                           .inflight = inflight,
                           .arg = aw,
                           .on_thresholds = aw->o.routing == ST_ROUTE_QUANTILE ? on_thresholds : NULL,
                           .on_registered = on_registered,
                           .sec = sec ? &aw->member_sec : NULL};
    /* the scores only for threshold summaries (top-k: the sets are enough) */
    st_engine_set_route_observer(aw->e, route_hook, aw, aw->o.routing == ST_ROUTE_QUANTILE);
    if (aw->o.routing == ST_ROUTE_QUANTILE) st_engine_set_count_observer(aw->e, count_hook, aw);
    if (st_member_start(&aw->loop, &mo, &aw->mem) != ST_OK) goto out_tp;
    pthread_create(&aw->th, NULL, compute_main, aw);
    st_log_info("worker %s: serving %s on %s (%d seqs, %d tokens/step, %d ctx, %s routing, %d micro-batches)", aw->o.name,
                aw->o.ckpt, endpoint, aw->o.max_seqs, aw->o.max_batch_tokens, aw->o.max_ctx,
                aw->o.routing == ST_ROUTE_QUANTILE ? "quantile" : "top-k", aw->o.micro_batches);
    st_member_serve(&aw->loop, &aw->sig_int, &aw->sig_term, on_signal, aw, aw->th, "worker", aw->o.name, endpoint);
    rc = 0;
    goto out_closed;
out_tp:
    st_tp_destroy(aw->tp);
out_rpc:
    st_rpc_cleanup();
out_loop:
    uv_close((uv_handle_t *)&aw->async, NULL);
    uv_close((uv_handle_t *)&aw->flush_timer, NULL);
    uv_run(&aw->loop, UV_RUN_DEFAULT);
    aw->dl_closed = 1; /* the compute thread never ran */
    dl_close(aw);
out_closed:
    pthread_mutex_lock(&aw->mu); /* channel_attach threads end within their open and map */
    while (aw->n_attach > 0) pthread_cond_wait(&aw->cv, &aw->mu);
    pthread_mutex_unlock(&aw->mu);
    uv_loop_close(&aw->dloop);
    uv_loop_close(&aw->loop);
out_engine:
    for (int m = 0; m < MAX_MB; m++) {
        st_engine_mb_destroy(aw->mbs[m]);
        plan_unpin(aw, m);
        st_dispatch_plan_cleanup(&aw->plan[m]);
        free(aw->tok_failed[m]);
        free(aw->logits[m]);
    }
    st_dispatch_plan_cleanup(&aw->plan2);
    for (int m = 0; m < MAX_MB; m++) {
        st_qsum_destroy(aw->qsum[m]);
        free(aw->qbuf[m]);
    }
    free(aw->tau_in); free(aw->rho_in); free(aw->tau_cur); free(aw->rho_cur); free(aw->load);
    for (int m = 0; m < MAX_MB; m++)
        for (int s = 0; s < MAX_SERVERS; s++) {
            pend_t *pd = &aw->pend[m][s];
            free(pd->sbuf);
            if (pd->rbuf_read) st_engine_host_free(aw->e, pd->rbuf);
            else free(pd->rbuf);
        }
    for (int s = 0; s < MAX_SERVERS; s++) chan_free(aw, aw->srv[s].chan, aw->srv[s].chan_read); /* the compute thread is gone */
    chan_bury(aw);
    free(aw->chan_dead);
    st_engine_destroy(aw->e);
out_ck:
    st_ckpt_close(aw->ck);
out:
    if (rc) fprintf(stderr, "strata-attn: %s\n", st_err_last());
    free(aw->ev_pool);
    free(aw->rep_buf[0]);
    free(aw->rep_buf[1]);
    free(aw->holders);
    free(aw->hl);
    for (int m = 0; m < MAX_MB; m++) free(aw->server_of[m]);
    free(aw->server_of2);
    free(aw->seqs);
    free(aw->reqs);
    free(aw->place_copy);
    free(aw->place_in);
    free(aw);
    return rc;
}
