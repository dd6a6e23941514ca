/* The engine (engine/): the whole model of SPEC §2–9 over batches of sequences, with
 * per-sequence state pools (KDA state + conv windows, paged MLA latent cache) sized at creation.
 * In one process it also runs the routed experts locally; the distributed worker replaces that part
 * through st_engine_set_experts. Not thread-safe: one thread drives an engine. */
#ifndef STRATA_ENGINE_H
#define STRATA_ENGINE_H

#include <stdbool.h>

#include "strata/base.h"
#include "strata/kernels.h"
#include "strata/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct st_engine st_engine_t;

typedef enum { ST_ROUTE_TOPK = 0, ST_ROUTE_QUANTILE = 1 } st_route_mode_t;

typedef struct {
    int max_seqs;         /* sequence slots in the state pools */
    int max_batch_tokens; /* new tokens per step, summed over sequences */
    int max_ctx;          /* tokens per sequence (prompt + generated) */
    int kv_page_size;     /* MLA latent-cache rows per page (0 = 64) */
    int kv_pages;         /* pages in the pool (0 = enough for max_seqs × max_ctx) */
    st_route_mode_t routing;
    int k_max;            /* quantile mode: most experts per token (0 = 2k) */
    bool remote_experts;  /* routed experts run elsewhere (micro-batch API); none are bound here */
    int device;           /* -1 = the CPU backend (default); N = the CUDA backend on cuda:N (built with CUDA) */
    /* CUDA backend choices (the CPU backend ignores them) */
    bool cuda_graphs;     /* decode steps of st_engine_step replayed as CUDA graphs (default: the table's CUDA_GRAPHS) */
    bool host_route;      /* quantile routing on the host (one sync per MoE layer) instead of the device
                           * (default: HOST_ROUTE; the sets are the same) */
    int handoff_timeout_ms; /* how long an early-launched micro-batch's device work waits for its
                             * release (st_engine_mb_launch_early) before it fails (0 = 60000) */
} st_engine_opts_t;

void st_engine_opts_default(st_engine_opts_t *o);
st_status_t st_engine_create(st_engine_t **out, const st_ckpt_t *ck, const st_engine_opts_t *opts);
void st_engine_destroy(st_engine_t *e);
const st_config_t *st_engine_config(const st_engine_t *e);

/* Sequence slots: open gives a slot with empty state; close returns it. */
st_status_t st_engine_seq_open(st_engine_t *e, int *slot);
void st_engine_seq_close(st_engine_t *e, int slot);
int st_engine_seq_len(const st_engine_t *e, int slot); /* tokens consumed so far */

/* Sampling parameters of one entry (the rule of st_sample_rows, strata/kernels.h): the engine
 * samples the entry's last row where its logits are (the GPU engine on the device) and returns the
 * id, with logprobs when asked. Penalties count the tokens the engine has sampled for the sequence
 * since its slot opened (OpenAI's: generated tokens only). */
#define ST_ENGINE_MAX_BIAS 1024 /* logit_bias entries of one entry */
typedef struct {
    float temperature; /* ≤ 0: greedy */
    int top_k;         /* ≤ 0: off */
    float top_p;       /* ≥ 1: off */
    float presence, frequency;
    uint64_t seed;     /* the sequence's stream: the draw is a function of (seed, pos, token) */
    uint32_t pos;      /* the token's index among the sequence's generated tokens */
    int n_top;         /* −1: no logprobs; 0..ST_SAMPLE_MAX_TOP: the chosen token's and this many top ones */
    int n_bias;        /* ≤ ST_ENGINE_MAX_BIAS */
    const uint32_t *bias_ids;
    const float *bias_values;
} st_sample_params_t;

/* One step: each entry feeds n_tokens new tokens of one open sequence (a prompt, a prompt piece, or
 * one decode token). Logits are written in entry order: all n_tokens rows when all_logits, else
 * only the last row; each row is vocab floats. argmax (greedy callers; ignored with all_logits):
 * receives the argmax of the entry's row (ties → the lower id, as st_argmax), and
 * the engine may leave that row of logits unwritten — the GPU engine does, so greedy rows cost no
 * copy to the host. sample (not with all_logits or argmax): the row is processed (penalties, bias)
 * and sampled, token receives the id and, with sample->n_top ≥ 0, logprob and top_ids /
 * top_logprobs [ST_SAMPLE_MAX_TOP] the logprobs; the processed row reaches logits only with
 * keep_logits (the GPU engine copies nothing else). Errors (bad slot, token id, sampling
 * parameters, capacity) leave every sequence's state unchanged. */
typedef struct {
    int slot;
    int n_tokens;
    const int *tokens;
    bool all_logits;
    int *argmax;
    const st_sample_params_t *sample;
    bool keep_logits;
    int *token;
    float *logprob;
    int *top_ids;
    float *top_logprobs;
} st_seq_chunk_t;
st_status_t st_engine_step(st_engine_t *e, const st_seq_chunk_t *seqs, int n_seqs, float *logits);

/* Quantile thresholds τ [n_layers][n_experts] (rows of non-MoE layers ignored; a layer whose row
 * starts with NaN is unset and routes top-k); NULL = back to top-k until the next set. Copied. */
void st_engine_set_thresholds(st_engine_t *e, const float *tau, uint64_t version);

/* Routing hook, called at every MoE layer after routing and before the experts run, with the
 * step's tokens in entry order. It may read the scores (e.g. for threshold summaries) and may
 * overwrite the chosen sets (tests force the reference's choices this way); weights are then
 * recomputed from the scores over the final sets. ids [T, kmax] ascending per token, cnt [T]. */
typedef void (*st_route_hook_t)(void *ctx, int layer, int T, int n_experts, const float *scores,
                                int *ids, int *cnt, int kmax);
void st_engine_set_route_hook(st_engine_t *e, st_route_hook_t fn, void *ctx);
/* Routing observer: read-only, for every MoE layer, with the final sets (after any hook). It lets
 * the GPU engine route on the device without a host round trip: there the observer of a
 * micro-batch's layer runs inside st_engine_mb_collect, once the hand-off copies have landed (the
 * scores come back with them); st_engine_step calls it right after routing. The worker counts
 * expert load and builds its threshold summaries this way. scores is NULL when the observer was set
 * without them (want_scores false: a GPU engine then copies only the sets back, T × n_experts fp32
 * less per layer) and on a layer the count observer (below) received counts for: those scores are
 * not copied back. */
typedef void (*st_route_observer_t)(void *ctx, int layer, int T, int n_experts, const float *scores,
                                    const int *ids, const int *cnt, int kmax);
void st_engine_set_route_observer(st_engine_t *e, st_route_observer_t fn, void *ctx, bool want_scores);
/* Threshold counts (the router's epilogue; docs/quantile.md, the counting estimator): with a count
 * observer set, at every MoE layer that routes by its thresholds (quantile mode, τ row set), the
 * engine counts over the layer's σ scores cnt[j] = #{t : s_tj ≥ τ_j} and, when the layer's probe row
 * ρ is set (st_engine_set_probes), band[j] = #{t : exactly one of s_tj ≥ ρ_j, s_tj ≥ τ_j} (band NULL
 * otherwise): st_route_count's integers, which st_qsum_add_layer_counts takes. The GPU engine counts
 * in the router's pass (on the host for layers routed there) and copies back only these 2n integers. Called where the route
 * observer is, just before it; cnt/band [n_experts] valid during the call. */
typedef void (*st_count_observer_t)(void *ctx, int layer, int T, int n_experts, const uint32_t *cnt,
                                    const uint32_t *band);
void st_engine_set_count_observer(st_engine_t *e, st_count_observer_t fn, void *ctx);
/* Probe thresholds ρ [n_layers][n_experts] for the band counts (a row starting with NaN: that
 * layer is not probed); NULL = none. Copied; set between steps with the τ they belong to. */
void st_engine_set_probes(st_engine_t *e, const float *rho);

/* ---- test-only trace: per-sublayer comparison of backends (SPEC §8) ----
 * Called at fixed points of the layer walk, in the same order on every backend, with an fp32 host
 * copy x [T, w] (the GPU engine copies device data back and synchronises: slow, tests only). At the
 * two partial-sum points the hook may overwrite x and the walk continues from the new values
 * (teacher forcing: each sublayer then starts from the reference's input); elsewhere x is read-only. */
typedef enum {
    ST_TRACE_PARTIAL_IN = 0, /* [T, d] partial sum at the start of layer l (l = n_layers: before the output AttnRes); writable */
    ST_TRACE_XN_ATTN,        /* [T, d] normed attention input */
    ST_TRACE_KDA_Q,          /* [T, H*dk] after conv, SiLU, L2 norm */
    ST_TRACE_KDA_K,          /* [T, H*dk] */
    ST_TRACE_KDA_V,          /* [T, H*dv] after conv, SiLU */
    ST_TRACE_KDA_G,          /* [T, H*dk] decay gate */
    ST_TRACE_KDA_O,          /* [T, H*dv] recurrence output, before the output gate */
    ST_TRACE_MLA_Q,          /* [T, H*(nope+rope)] */
    ST_TRACE_ATTN_O,         /* [T, H*dv] attention output before o_proj (gated) */
    ST_TRACE_PARTIAL_MID,    /* [T, d] after the attention add; writable */
    ST_TRACE_XN_MLP,         /* [T, d] normed FFN input */
    ST_TRACE_MOE_Z,          /* [T, ew] latent expert input */
    ST_TRACE_MOE_U,          /* [T, ew] combined latent (normed when the layer has the norm) */
    ST_TRACE_N
} st_trace_point_t;
typedef void (*st_trace_hook_t)(void *ctx, int layer, int point, int T, int w, float *x);
void st_engine_set_trace_hook(st_engine_t *e, st_trace_hook_t fn, void *ctx);

/* ---- micro-batches: the distributed worker drives the layer walk itself ----
 * A micro-batch steps a set of sequences through the layers and stops at every MoE layer to hand
 * its routed tokens to an executor (local experts, or expert servers over the network). Several
 * micro-batches with disjoint sequences may be in flight at once (ping-pong): while one waits for
 * its experts, another advances. Each owns step buffers sized for max_batch_tokens. */
typedef struct st_engine_mb st_engine_mb_t;

typedef struct {
    int layer;          /* MoE layer index */
    int T;              /* tokens */
    int kc;             /* routing stride per token */
    int ew;             /* expert width ℓ */
    const float *z;     /* [T, ew] latent inputs, fp32; NULL when the engine hands them over as zb */
    const uint16_t *zb; /* [T, ew] the same as bf16 bit patterns (the GPU engine: its activations are
                         * bf16, so they travel as they are); NULL when z is set */
    const int *ids;     /* [T, kc] chosen experts, ascending within a token */
    const int *cnt;     /* [T] experts per token (0 = shared path only) */
    const float *wts;   /* [T, kc] routing weights p (SPEC §7), 0 past cnt */
    const int *tok_ent; /* [T] index of the step entry each token belongs to */
    /* What the executor writes depends on the engine (docs/architecture.md, "Bit-exact expert
     * results"; either way the arithmetic of each row E_j(z_t) follows that section for a
     * micro-batch of T*kc slots, as the engine's own experts do):
     * - local experts (st_engine_mb_run_local, or a test standing in for it): out, row t*kc+i =
     *   E_{ids[t*kc+i]}(z_t); the engine combines them by the summation tree;
     * - remote_experts: at. Token t's experts cut into tree nodes (that section, rule 1), at[t*kc+i]
     *   points at the value [ew] fp32 of the node whose first leaf is slot i (the tree over its
     *   leaves of fl(p·E_j(z_t)) + 0), NULL where no node starts; the engine finishes each token's
     *   tree from them (+0 for a token without any). at comes all NULL. The rows stay where they
     *   are, unchanged, until the micro-batch's next collect returns, in memory the engine's device
     *   reads: out's rows (the executor's scratch then), st_engine_host_alloc'd or _map'ped memory. */
    float *out;         /* [T*kc, ew] */
    const float **at;   /* [T*kc] */
} st_moe_work_t;

st_status_t st_engine_mb_create(st_engine_t *e, st_engine_mb_t **out);
void st_engine_mb_destroy(st_engine_mb_t *mb);
/* Validate the entries and reserve cache pages (nothing changes on error), embed the tokens.
 * logits: where the final rows go (as st_engine_step). */
st_status_t st_engine_mb_begin(st_engine_mb_t *mb, const st_seq_chunk_t *seqs, int n_seqs, float *logits);
/* Returns 1 with *work filled when a MoE layer needs its experts (fill work->out, call again), or 0
 * when the step is finished and the logits are written. Same as launch then collect. */
int st_engine_mb_advance(st_engine_mb_t *mb, st_moe_work_t *work);
/* The two halves of advance, so that a driver can overlap micro-batches: launch queues the walk up
 * to the next MoE hand-off (its device-to-host copies included) or to the step's end, and returns
 * without waiting for the device (the GPU engine runs each micro-batch on its own stream); collect
 * waits for what launch queued and returns as advance. The CPU engine computes inside collect
 * (launch does nothing): st_engine_async says which kind the engine is. Between launch and
 * collect the micro-batch's work buffers (z, ids, cnt, out) are not to be touched. A collect
 * without a launch launches first. */
void st_engine_mb_launch(st_engine_mb_t *mb);
int st_engine_mb_collect(st_engine_mb_t *mb, st_moe_work_t *work);
/* Early launch: after a collect that returned work, queue the next launch before the executor has
 * written work->out / u, so the device has it queued when they arrive; the device work waits on the
 * host (the GPU engine: a flag in pinned memory, polled by one thread on the device) until
 * st_engine_mb_release says they are written. A plain launch releases first, so callers that fill
 * the work before launching need neither. Every hand-off must be released (st_engine_mb_destroy and
 * the next begin release an abandoned one); one not released within opts.handoff_timeout_ms fails
 * the step (st_engine_mb_status ST_ERR_TIMEOUT) instead of hanging the device. The work buffers stay
 * the caller's until the release. A walk that synchronises on the host (route hook, trace, quantile
 * routing on the host) is not launched early, nor is one of a token count no step of this engine has
 * finished with (its library kernels may not be loaded; a first launch waits for the release): the
 * collect after the release launches it. The CPU
 * engine computes in collect: both are no-ops there. */
void st_engine_mb_launch_early(st_engine_mb_t *mb);
void st_engine_mb_release(st_engine_mb_t *mb);
/* The collected hand-off's latent rows (bf16, as work->zb holds them) copied straight from the
 * device: run i = rows [first[i], first[i] + count[i]) into dst[i], and returns once they are there.
 * For packing large dispatches without the host copying each row: with dst in host memory the engine
 * registered (st_engine_host_alloc / _map) the device's copy engine writes it. Only between a collect
 * that returned work and the next launch (nothing queued behind the hand-off yet). ST_ERR_UNSUPPORTED
 * on an engine that hands over fp32 rows (the CPU one: copy work->z); device errors as
 * st_engine_mb_status's. */
st_status_t st_engine_mb_copy_z(st_engine_mb_t *mb, const int *first, const int *count, void *const *dst, int n_runs);
/* The collected hand-off's dispatch plan built on the device (st_cuda_moe_dispatch_plan, over the
 * router's ids, counts and weights where they lie) and copied into p's host tables: each table's
 * valid prefix exactly as st_moe_dispatch_plan fills it for server_of [E] (server indices below
 * n_servers ≤ p->n_servers; p's servers from n_servers on get no pairs) and tok_failed [T] (in and
 * out: flagged tokens send nothing; one with an expert no server holds gets flagged); p->wts written
 * when not NULL. For large hand-offs, where the host's O(pairs) plan costs more than two round trips
 * to the device. Only between a collect that returned work and the next launch. ST_ERR_UNSUPPORTED
 * on an engine without it (the CPU one: plan on the host); device errors as st_engine_mb_status's.
 * NOTE: the device tables for a count of servers are allocated the first time it is seen, not per
 * step. */
st_status_t st_engine_mb_plan(st_engine_mb_t *mb, const st_moe_plan_t *p, int n_servers, const int *server_of,
                              bool *tok_failed);
/* A micro-batch's device memory that a same-host executor reads and writes in place (the expert
 * server, through CUDA IPC: wire.h ST_WIRE_FLAG_PEER): handle, the CUDA IPC handle of the allocation
 * holding both regions; in, its hand-offs' latent rows (bf16 [in_rows, ew], row t = token t of the hand-off, as
 * st_engine_mb_copy_z copies them), valid between a collect that returned work and the next launch;
 * reply, rows the executor may write (fp32 [reply_rows, ew], device address reply) and st_moe_work_t.at
 * may point to. ST_ERR_UNSUPPORTED on an engine without device memory (the CPU one) or one with its
 * experts local. Fixed for the micro-batch's life. */
typedef struct {
    uint8_t handle[64];
    float *reply;
    size_t in_off, reply_off;
    uint32_t in_rows, reply_rows;
} st_engine_peer_mem_t;
st_status_t st_engine_mb_peer_mem(st_engine_mb_t *mb, st_engine_peer_mem_t *out);
/* Whether st_engine_mb_launch_early queues anything on this engine: a GPU engine whose context loads
 * kernels eagerly. A lazily loaded kernel's first launch waits for all the process's device work,
 * a walk waiting for its release included, and the release would never come: call
 * st_engine_process_init first thing in a process that launches early (before any CUDA call). */
bool st_engine_launches_early(const st_engine_t *e);
void st_engine_process_init(void);
/* The first error of the micro-batch's current (or last finished) step: ST_OK, or a device error /
 * a release timeout of the GPU engine (whose launches cannot fail on the spot). Read it after the
 * collect that finishes the step: the logits of a failed step are not to be used. */
st_status_t st_engine_mb_status(const st_engine_mb_t *mb);
bool st_engine_async(const st_engine_t *e);
/* Whether collect would return without waiting for the device (a poll; always true on the CPU). */
bool st_engine_mb_ready(st_engine_mb_t *mb);
/* Host memory the engine's device reads where it lies (st_moe_work_t.at's rows). alloc: page-aligned,
 * page-locked and mapped into the device at the same address on a GPU engine, plain on the CPU; NULL
 * when that fails. map: the same for [p, p + n) allocated elsewhere (page-aligned, e.g. a shared
 * mapping); an error means rows there must be copied into work->out instead. unmap before the memory
 * goes; free takes what alloc gave (NULL is fine). Any thread; on a GPU engine unmap and free wait for
 * all device work queued (CUDA's page-locked frees do): not on the thread that releases a hand-off
 * launched early, while it is not released. */
void *st_engine_host_alloc(st_engine_t *e, size_t n);
void st_engine_host_free(st_engine_t *e, void *p);
st_status_t st_engine_host_map(st_engine_t *e, void *p, size_t n);
void st_engine_host_unmap(st_engine_t *e, void *p);
/* Run one work item on the locally bound experts (not with remote_experts). */
void st_engine_mb_run_local(st_engine_mb_t *mb, const st_moe_work_t *work);

/* Seconds spent per stage since creation (for benchmarks). */
typedef struct {
    double attention, route, experts, combine, head;
    uint64_t steps, tokens;
} st_engine_stats_t;
void st_engine_get_stats(const st_engine_t *e, st_engine_stats_t *out);

#ifdef __cplusplus
}
#endif
#endif
