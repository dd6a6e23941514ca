/* Coordinator internals shared by coord.c (gRPC, membership, thresholds, Generate) and rest.c (HTTP). */
#ifndef STRATA_COORD_IMPL_H
#define STRATA_COORD_IMPL_H

#include <jansson.h>
#include <unistd.h>
#include <uv.h>

#include "coord.h"
#include "openai.h"
#include "placement.h"
#include "strata/http.h"
#include "strata/model.h"
#include "strata/proto.h"
#include "strata/quantile.h"
#include "strata/rpc.h"

#define MAX_MEMBERS 256
/* A dead member's entry is removed MEMBER_FORGET_BEATS heartbeat intervals after it died, except
 * the MEMBER_KEEP_DEAD most recently dead, which stay listed (in /status) up to MEMBER_KEEP_DEAD_S. */
#define MEMBER_FORGET_BEATS 10
#define MEMBER_KEEP_DEAD 16
#define MEMBER_KEEP_DEAD_S 120.0
#define HIST_BUCKETS 14

typedef struct {
    double le[HIST_BUCKETS]; /* upper bounds, seconds */
    uint64_t count[HIST_BUCKETS + 1];
    double sum;
    uint64_t n;
} st_hist_t;
void st_hist_init(st_hist_t *h);
void st_hist_add(st_hist_t *h, double v);

typedef struct {
    uint64_t id;
    st_proto_role_t role;
    char name[64], endpoint[128];
    uint32_t capacity, inflight;
    int alive, active, reported; /* active: proxied requests now */
    double last_seen, registered_at;
    uint64_t step, load_step;
    uint64_t tau_used; /* attention workers: the threshold version their last reported step routed with (0: top-k) */
    uint32_t *load; /* [n_layers][n_experts] tokens per expert, each layer as last reported (reports
                       carry the layers that fit the worker's byte budget, in rotation) */
    st_rpc_channel_t *ch; /* attention workers: their Worker service */
    /* security (docs/security.md): heartbeats and reports must carry the token and arrive on the
     * connection that registered */
    char token[ST_PROTO_TOKEN_LEN + 1]; /* 32 hex digits, 128 random bits */
    uint8_t peer_hash[32];              /* SHA-256 of st_rpc_call_peer() at registration */
    double dead_at;                     /* when dropped (see MEMBER_FORGET_BEATS) */
    /* front door (gen.c) */
    double busy_until;    /* refused a request (full, draining, unreachable): not picked before this */
} member_t;

typedef struct coord coord_t;

/* One client request at the front door (gen.c): waiting in the queue, then proxied to a worker. */
typedef enum { ST_GEN_WAITING = 1, ST_GEN_RUNNING = 2 } st_gen_state_t;
typedef struct gen gen_t;
struct gen {
    coord_t *co;
    gen_t *prev, *next;   /* in co->q_head (waiting) or co->run_head (running) */
    st_gen_state_t state;
    uint64_t worker_id;
    char worker[64];      /* its name, for errors */
    st_rpc_call_t *call;  /* gRPC client, or */
    st_http_res_t *res;   /* HTTP client; both NULL once the client has been answered (detached) */
    int stream, http_gone, detached, err_in_chunk;
    st_rpc_stream_t *up;  /* to the worker */
    uint8_t *req;         /* the encoded Worker/Generate request, kept for a re-dispatch */
    size_t req_len;
    double t_enq, t0, t_last; /* t_last: the worker's last chunk (or the dispatch) */
    int retries, chunks;
    int n_tokens, prompt_tokens;
    st_proto_finish_t finish;
    st_status_t status;   /* what the client is told: ST_OK, or the error's class */
    char err[256];
    char id[48];
    st_tok_stream_t dec;            /* the worker's token ids → text (UTF-8 safe across tokens) */
    /* HTTP (rest.c): one choice of an OpenAI response */
    struct hreq *parent;            /* the HTTP request this is a choice of */
    int index, role_sent, stop_hit;
    char *echo;                     /* completions' echo: the prompt (owned) */
    int lp_k;                       /* logprobs: -1 none, else top-k per token */
    json_t *lp;                     /* logprobs entries of the tokens so far (chat's shape) */
    size_t *lp_off, lp_sent;        /* each entry's offset in text; entries streamed already */
    char *text;                     /* raw bytes of the completion so far */
    size_t text_len, text_cap, emitted; /* emitted: bytes already streamed */
};

struct coord {
    st_coord_opts_t o;
    st_config_t cfg;
    st_tokenizer_t *tok;  /* the checkpoint's tokenizer (byte tokenizer when it ships none) */
    st_chat_format_t chat_format; /* K3's format when config.json says K3, else K2's */
    char *piece;          /* one decoded token and a flush (the loop thread's) */
    size_t piece_cap;
    char model[128];
    uv_loop_t loop;
    uv_timer_t sweep, tau_timer, tick;
    double sweep_last, listening_since; /* on_sweep: its last run; since when the loop has run on time */
    uv_signal_t sig_int, sig_term;
    st_rpc_server_t *rpc;
    st_http_server_t *http;
    char grpc_host[128], http_host[128];
    int grpc_port, stopping, was_ready;
    member_t members[MAX_MEMBERS];
    int n_members;
    uint64_t next_id;
    st_placement_t place;
    double place_s_last, place_s_max; /* placement updates: the last one's time, the slowest */
    st_qstate_t *q;
    uint64_t tau_version, tau_steps;
    float *tau_all, *rho_all; /* [n_layers][n_experts] for the wire (rho_all: the probed rows, packed) */
    uint32_t *rho_layers;     /* [n_layers] the probed layers of the reply */
    uint32_t n_rho_layers;    /* how many: tau_all, rho_all and rho_layers are built once per version */
    int tau_data;             /* summaries merged since the last end_step */
    uint64_t stale_summaries; /* dropped: built on a table older than the estimator's history */
    /* metrics */
    double t_start, tick_at, tokens_per_s;
    int64_t t_wall_start;                   /* Unix time of the start (/v1/models "created") */
    uint64_t requests_total, requests_ok, requests_err, tokens_total, tokens_window, steps_total, dispatch_bytes, gen_seq;
    int active_requests;
    st_hist_t ttft, tpot, e2e;
    uint64_t prompt_tokens_total, finished_stop, finished_length;
    double stage_s[ST_PROTO_STAGES];        /* summed over reported steps */
    uint64_t stage_steps, reply_bytes, messages;
    uint64_t stream_bytes; /* bytes of the Generate chunks received from attention workers */
    double merge_s;                         /* coordinator: threshold merges + publishes */
    uint64_t merges;
    /* front door (gen.c, rest.c): client auth, the request queue, stream watchdogs, loop stalls */
    gen_t *q_head, *q_tail, *run_head;      /* waiting (FIFO) and running requests */
    int n_waiting, pumping;
    uint64_t rejected_full, rejected_timeout, idle_timeouts, workers_lost_cancelled, requeued;
    uv_timer_t front_timer;                 /* stall probe every tick; sweeps every few */
    int front_started, front_ticks;
    double front_last;                      /* when the probe last ran (real time) */
    double stall_max, stall_sec_max[60];    /* longest loop stall since start; per second, last 60 s */
    int64_t stall_sec_at[60];
};

int st_coord_ready(coord_t *co); /* can serve (see coord.c) */
member_t *st_coord_member_find(coord_t *co, uint64_t id);
/* gen.c: the front door */
void st_coord_h_generate(st_rpc_call_t *call, const uint8_t *req, size_t len, void *arg); /* Coordinator/Generate */
void st_coord_worker_lost(coord_t *co, uint64_t worker_id); /* membership dropped it: end its requests */
void st_coord_queue_pump(coord_t *co); /* capacity may have appeared: start queued requests */
/* A client's gRPC call carries "authorization: Bearer <api key>" (or no key is set): ST_OK. Else
 * the call is finished UNAUTHENTICATED and ST_ERR_AUTH returned (for Coordinator/Status too). */
st_status_t st_coord_rpc_authorized(coord_t *co, st_rpc_call_t *call);
/* Check r and queue it for the client already attached to g (g->call or g->res, g->stream):
 * ST_OK: the front door owns g and answers the client (g may already be gone: do not touch it).
 * Otherwise nothing was kept (free g and answer): ST_ERR_INVALID_ARG / ST_ERR_OUT_OF_RANGE a
 * client's mistake, ST_ERR_CAPACITY the queue is full, ST_ERR_PEER no attention worker at all. */
st_status_t st_coord_gen_submit(coord_t *co, gen_t *g, const st_proto_generate_req_t *r);
void st_coord_gen_client_gone(gen_t *g); /* the client went away: leave the queue, or cancel upstream */
/* A stop string ended a running request: the client is answered now (finish "stop"), the
 * worker's stream is cancelled and released when it ends. */
void st_coord_gen_stop(gen_t *g);
void st_coord_gen_free(gen_t *g); /* a gen_t the front door never took (st_coord_gen_submit failed) */
int st_coord_queue_cap(const coord_t *co);
double st_coord_stall_max_60s(const coord_t *co);
void st_coord_front_start(coord_t *co); /* timers; stops itself once co->stopping */
char *st_coord_status_json(coord_t *co); /* malloc'd */
char *st_coord_metrics_text(coord_t *co, size_t *len); /* malloc'd Prometheus text */
void st_coord_http_routes(coord_t *co);
void st_coord_http_chunk(gen_t *g, const st_proto_generate_chunk_t *ch);
void st_coord_http_done(gen_t *g);

#endif
