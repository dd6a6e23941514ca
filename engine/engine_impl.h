/* Internal header of the engine: bound weights, the frontend's state (sequence slots, page tables,
 * routing, micro-batch bookkeeping) and the backend table the frontend calls. Backends read the
 * frontend's state through these structs; they own their memory (weights, state pools, buffers). */
#ifndef STRATA_ENGINE_IMPL_H
#define STRATA_ENGINE_IMPL_H

#include "strata/engine.h"

typedef struct {
    st_weight_t gate, up, down; /* [w, d], [w, d], [d, w] */
} st_ffn_w_t;

typedef struct {
    float *in_norm, *post_norm;   /* [d] */
    float *attn_res, *mlp_res;    /* [d] w_eff = γ ⊙ w, NULL without AttnRes */
    /* KDA */
    st_weight_t q, k, v;          /* [H*dk, d]; MLA: q = q_b_proj [H*dqk, q_lora] or q_proj */
    float *conv_q, *conv_k, *conv_v; /* [C, K] */
    st_weight_t f_a, f_b;         /* [r, d], [H*dk, r] */
    float *A_log, *dt_bias;       /* [H], [H*dk] */
    st_weight_t b;                /* [H, d] */
    float *o_norm;                /* [dv] */
    st_weight_t g_a, g;           /* output gate: g [H*dv, d] (full rank) or g_b [H*dv, r] after g_a */
    st_weight_t o;                /* [d, H*dv] */
    /* MLA */
    st_weight_t q_a;              /* [q_lora, d] */
    float *q_a_norm;              /* [q_lora] */
    st_weight_t kv_a;             /* [kv_lora + rope, d] */
    float *kv_a_norm;             /* [kv_lora] */
    st_weight_t kv_b;             /* [H*(nope+v), kv_lora] */
    float *kv_b_f32;              /* same, fp32, for the absorbed form */
    /* FFN */
    st_ffn_w_t dense;
    st_weight_t router;           /* [n, d] */
    float *router_bias;           /* [n] or NULL */
    st_weight_t lat_down, lat_up; /* [ℓ, d], [d, ℓ] */
    float *lat_norm;              /* [ℓ] or NULL */
    st_ffn_w_t shared;
    st_expert_weights_t *experts; /* [n] when run locally, else NULL */
} st_layer_w_t;

typedef struct {
    int n_layers;
    st_weight_t embed, lm_head;   /* [V, d] */
    float *final_norm, *out_res;  /* [d] */
    st_layer_w_t *layers;
} st_engine_w_t;

st_status_t st_engine_bind(st_engine_w_t *W, const st_ckpt_t *ck, bool local_experts);
void st_engine_unbind(st_engine_w_t *W);

/* ------------------------------------------------------------------ the frontend's state */

typedef struct {
    int slot, n, off; /* sequence slot, new tokens, first row in the step */
    int pos0;         /* tokens before this step */
} st_ent_t;

typedef struct {
    /* per block b: Q_b AttnRes queries (w_eff rows) that see the completed blocks 0..b */
    int Q;
    float *w; /* host [Q, d] */
} st_block_q_t;

typedef struct st_engine_backend st_engine_backend_t;

struct st_engine {
    const st_engine_backend_t *be;
    void *bk; /* the backend's context */
    st_config_t c;
    const st_ckpt_t *ck;
    st_engine_opts_t o;
    st_engine_w_t W; /* bound weights (mmap views, fp32 vectors); unbound after init unless be->keep_weights */
    int kcap;        /* routing stride per token: max(k, k_max) */
    bool early;      /* the backend may queue work behind a host release (st_engine_mb_launch_early) */
    bool *walked;    /* [max_batch_tokens + 1]: a step of this many tokens finished without error */
    int n_kda, n_mla, *layer_slot; /* index of a layer among its kind */
    /* AttnRes bookkeeping (SPEC §5) */
    int n_blocks, Qmax;
    st_block_q_t *bq;
    int *q_attn, *q_mlp, q_out; /* query index of each sublayer within its block set */
    /* sequence slots */
    bool *seq_used, *seq_busy; /* busy: the slot is in a micro-batch in flight */
    int *seq_len;
    /* paged MLA latent cache: page ids (the backend owns the pool [n_pages][page_size][R]) */
    int page_size, n_pages, pps, n_free, *free_pages;
    int *seq_npages; /* [max_seqs][n_mla] */
    int *seq_pageid; /* [max_seqs][n_mla][pps] */
    /* routing */
    float *tau; /* host [L][n] */
    bool tau_set;
    uint64_t tau_version;
    st_route_hook_t hook;
    void *hook_ctx;
    st_route_observer_t obs;
    void *obs_ctx;
    bool obs_scores; /* the route observer reads the scores */
    float *rho; /* host [L][n]: probe thresholds for the band counts */
    bool rho_set;
    st_count_observer_t cobs;
    void *cobs_ctx;
    st_trace_hook_t trace; /* test-only (engine.h) */
    void *trace_ctx;
    struct st_engine_mb *mb; /* st_engine_step's (local experts only) */
    st_engine_stats_t stats;
};

struct st_engine_mb {
    st_engine_t *e;
    void *bk;      /* the backend's micro-batch */
    bool internal; /* st_engine_step's: local experts run inside the walk, no hand-off */
    st_ent_t *ents; /* [max_seqs] */
    const st_seq_chunk_t *seqs;
    int n_seqs, T;
    float *logits;
    int l, nb;          /* next layer; completed AttnRes blocks */
    bool waiting, busy; /* waiting: the experts of layer l are outstanding */
    bool held;          /* a collected hand-off not released yet (st_engine_mb_release) */
    int pend;           /* launched, not collected: 0 none, 1 a hand-off, 2 the layers (the head runs in collect) */
    st_moe_work_t work; /* the hand-off launch queued */
    st_status_t err;    /* the first error of an asynchronous backend's step (reported at its end) */
    double t0, ts;      /* step start; stage clock (synchronous backends' per-stage times) */
};

/* Routing shared by the backends (SPEC §7): whether layer l routes by its quantile thresholds; the
 * host part of routing over σ'd scores [T, n]: the quantile sets (ids [T, kcap], cnt [T], weights
 * into the scratch wq [T, k_max]) when the thresholds apply, else ids/cnt as given (top-k); then
 * the route hook, which may rewrite the sets. */
bool st_engine_route_quantile(const st_engine_t *e, int l);
/* quantile routing on the host (opts.host_route, or a routing stride other than k_max): a device
 * backend then reads the scores back in the walk, one sync per MoE layer */
bool st_engine_host_routes(const st_engine_t *e);
/* Whether layer l's threshold counts go to the count observer (engine.h), and its probe row (ρ of
 * layer l, or NULL: no band counts). */
bool st_engine_counted(const st_engine_t *e, int l);
const float *st_engine_probe_row(const st_engine_t *e, int l);
void st_engine_route_host(st_engine_t *e, int l, int T, const float *scores, int *ids, int *cnt, float *wq);

/* ------------------------------------------------------------------ the backend table
 * Modelled on ggml's ggml_backend_i: one struct of function pointers per backend; a NULL member is
 * an operation the backend does not need. The frontend (engine.c) owns every piece of bookkeeping
 * and walks the layers; a backend owns its memory and runs the per-layer operations. Ops of a step
 * cannot fail (validation happens before): an asynchronous backend records its first error in
 * mb->err. Layer ops read the step's rows from the backend's micro-batch buffers: `partial` (the
 * residual stream) and `xn` (the normed sublayer input). */
struct st_engine_backend {
    const char *name;
    bool async;        /* launch queues device work and returns; collect waits (else collect computes) */
    bool keep_weights; /* the backend reads e->W after init */
    /* ---- memory ---- */
    st_status_t (*init)(st_engine_t *e);  /* e->bk: weights, state pools, cache pool (tables are ready) */
    void (*free)(st_engine_t *e);
    st_status_t (*use)(st_engine_t *e);   /* select the device on this thread (entry points) */
    st_status_t (*mb_init)(st_engine_mb_t *mb); /* mb->bk: step buffers sized for max_batch_tokens */
    void (*mb_free)(st_engine_mb_t *mb);
    st_status_t (*seq_reset)(st_engine_t *e, int slot);   /* zero a slot's KDA state and conv windows */
    st_status_t (*set_thresholds)(st_engine_t *e, const float *tau); /* device copy of τ */
    st_status_t (*set_probes)(st_engine_t *e, const float *rho);     /* device copy of ρ */
    st_status_t (*set_trace)(st_engine_t *e, bool on);    /* trace staging buffers */
    /* host memory the device reads in place (engine.h st_engine_host_*); NULL: plain memory will do */
    void *(*host_alloc)(st_engine_t *e, size_t n);
    void (*host_free)(st_engine_t *e, void *p);
    st_status_t (*host_map)(st_engine_t *e, void *p, size_t n);
    void (*host_unmap)(st_engine_t *e, void *p);
    /* ---- a step ---- */
    void (*begin)(st_engine_mb_t *mb);        /* after validation and page growth: tokens, metadata */
    void (*launch_begin)(st_engine_mb_t *mb); /* each launch: what begin deferred (upload, embedding) */
    void (*attn_norm)(st_engine_mb_t *mb, int l, bool push); /* xn of layer l; push: partial → block nb */
    void (*kda)(st_engine_mb_t *mb, int l);   /* KDA sublayer (SPEC §3) up to its gated output */
    void (*mla)(st_engine_mb_t *mb, int l);   /* MLA sublayer (SPEC §4) up to its gated output */
    void (*attn_out)(st_engine_mb_t *mb, int l, bool push); /* o-projection into partial (= on a push, else +=) */
    void (*mlp_norm)(st_engine_mb_t *mb, int l);
    void (*dense_ffn)(st_engine_mb_t *mb, int l); /* partial += FFN(xn) */
    void (*moe_begin)(st_engine_mb_t *mb, int l, st_moe_work_t *w); /* routing, latent input; w (synchronous) */
    void (*experts)(st_engine_mb_t *mb, const st_moe_work_t *w);    /* the bound routed experts */
    void (*handoff)(st_engine_mb_t *mb, int l, st_moe_work_t *w);   /* queue w's copies for an executor */
    void (*moe_finish)(st_engine_mb_t *mb, int l); /* combine, up-projection, shared experts into partial */
    void (*launch_end)(st_engine_mb_t *mb);   /* after the last layer */
    void (*wait)(st_engine_mb_t *mb);         /* the hand-off landed (then the observer) */
    void (*release)(st_engine_mb_t *mb);      /* the executor wrote the hand-off's results (engine.h) */
    /* the hand-off's z rows, runs of them, into host memory (engine.h st_engine_mb_copy_z); NULL: not
     * a bf16 hand-off */
    st_status_t (*copy_z)(st_engine_mb_t *mb, const int *first, const int *count, void *const *dst, int n);
    /* the hand-off's dispatch plan on the device into p's host tables (engine.h st_engine_mb_plan);
     * NULL: none (the caller plans on the host) */
    st_status_t (*plan)(st_engine_mb_t *mb, const st_moe_plan_t *p, int n_servers, const int *server_of,
                        bool *tok_failed);
    /* the micro-batch's device memory for a same-host executor (engine.h st_engine_mb_peer_mem); NULL: none */
    st_status_t (*peer_mem)(st_engine_mb_t *mb, st_engine_peer_mem_t *out);
    bool (*ready)(st_engine_mb_t *mb);        /* the hand-off or layers are done (a poll) */
    void (*head)(st_engine_mb_t *mb);         /* final norm, lm_head, logits / argmax to the caller */
    /* the entries' sampling (st_seq_chunk_t.sample) over the head's rows; a backend whose head works
     * in row chunks samples each chunk there and leaves this NULL (the CUDA one) */
    void (*sample)(st_engine_mb_t *mb);
    void (*step)(st_engine_mb_t *mb);         /* st_engine_step after begin: e.g. replay a captured step */
    /* a micro-batch's launch (the walk from its state to the next hand-off or the end) as one unit:
     * ST_SEG_REPLAY queues a captured one and sets the state the walk would leave (true), or does
     * nothing (false); ST_SEG_CAPTURE starts capturing the walk that follows (true) or declines;
     * ST_SEG_END ends that capture, keeps it and queues it (true), or returns false when the
     * capture failed: nothing ran, and the walk is to run again from the state before it */
    bool (*segment)(st_engine_mb_t *mb, int op);
};
enum { ST_SEG_REPLAY, ST_SEG_CAPTURE, ST_SEG_END };

extern const st_engine_backend_t st_engine_backend_cpu;  /* backend_cpu.c */
extern const st_engine_backend_t st_engine_backend_cuda; /* backend_cuda.c (built with CUDA) */

/* the test-only trace (engine.h) of a host row block x [T, w] */
#define ST_ENGINE_TRACE(e, l, pt, x, T, w)                                                         \
    do {                                                                                          \
        if ((e)->trace) (e)->trace((e)->trace_ctx, (l), (pt), (T), (w), (x));                     \
    } while (0)

#endif
