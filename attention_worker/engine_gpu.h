/* The GPU engine (attention_worker/engine_gpu.c): the same walk of SPEC §2–9 as engine.c, with
 * bf16 weights and activations on one CUDA device (fp32 accumulation, fp32 residual stream, KDA
 * state and AttnRes sources), a paged bf16 MLA latent cache, and every buffer sized at creation.
 * engine.c forwards here when st_engine_opts_t.device >= 0. Internal header; also declares the
 * CUDA plumbing of engine_gpu_kernels.cu (eg_*). Not thread-safe, like the CPU engine. */
#ifndef STRATA_ENGINE_GPU_H
#define STRATA_ENGINE_GPU_H

#include <stdbool.h>
#include <stddef.h>

#include "strata/engine.h"
#include "strata/gpu.h"
#include "strata/kernels_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct st_egpu st_egpu_t;
typedef struct st_egpu_mb st_egpu_mb_t;

st_status_t st_egpu_create(st_egpu_t **out, const st_ckpt_t *ck, const st_engine_opts_t *opts);
void st_egpu_destroy(st_egpu_t *g);
st_status_t st_egpu_seq_open(st_egpu_t *g, int *slot);
void st_egpu_seq_close(st_egpu_t *g, int slot);
int st_egpu_seq_len(const st_egpu_t *g, int slot);
st_status_t st_egpu_step(st_egpu_t *g, const st_seq_chunk_t *seqs, int n_seqs, float *logits);
void st_egpu_set_thresholds(st_egpu_t *g, const float *tau, uint64_t version);
void st_egpu_set_route_hook(st_egpu_t *g, st_route_hook_t fn, void *ctx);
void st_egpu_set_trace_hook(st_egpu_t *g, st_trace_hook_t fn, void *ctx);
void st_egpu_get_stats(const st_egpu_t *g, st_engine_stats_t *out);
st_status_t st_egpu_mb_create(st_egpu_t *g, st_egpu_mb_t **out);
void st_egpu_mb_destroy(st_egpu_mb_t *mb);
st_status_t st_egpu_mb_begin(st_egpu_mb_t *mb, const st_seq_chunk_t *seqs, int n_seqs, float *logits);
int st_egpu_mb_advance(st_egpu_mb_t *mb, st_moe_work_t *work);
void st_egpu_mb_launch(st_egpu_mb_t *mb);
int st_egpu_mb_collect(st_egpu_mb_t *mb, st_moe_work_t *work);
bool st_egpu_mb_ready(st_egpu_mb_t *mb);
void st_egpu_set_route_observer(st_egpu_t *g, st_route_observer_t fn, void *ctx);
void st_egpu_mb_run_local(st_egpu_mb_t *mb, const st_moe_work_t *work);

/* ---- opt-in per-op GPU timing: STRATA_EGPU_PROF=1 when the engine is created ----
 * Events around groups of consecutive ops of st_engine_step's walk (created at engine creation,
 * EGPU_PROF_EVENTS per step; nothing recorded, launched or allocated per step when off; the
 * micro-batch API is not profiled). So that the events time the GPU's work and not the host's
 * launch gaps, each profiled step first queues a gate kernel that holds the stream until the host
 * has queued the step (released before the step's first host sync, bounded by a timeout, counted).
 * Each RMSNorm fused with AttnRes phase 2 is followed by a plain RMSNorm of the same rows into
 * scratch (REF_NORM, not part of the step's result): AttnRes's cost in the fused norms is
 * AR_NORM − REF_NORM (docs/perf.md). One profiling engine per process (st_egpu_prof_engine). */
typedef enum {
    ST_EGPU_PROF_AR_P1,    /* AttnRes phase 1 with the block push */
    ST_EGPU_PROF_AR_NORM,  /* RMSNorms fused with AttnRes phase 2 (the whole kernels) */
    ST_EGPU_PROF_REF_NORM, /* a plain RMSNorm of the same rows (reference; not a step op) */
    ST_EGPU_PROF_NORM,     /* other RMSNorms of the walk (first layer, MLA q_a) */
    ST_EGPU_PROF_KDA,      /* KDA core: gate, conv, prep, recurrence / chunked / decode, output norm and gate */
    ST_EGPU_PROF_MLA,      /* MLA core: cache write, absorption, attention, W_UV, output gate */
    ST_EGPU_PROF_GEMM,     /* trunk GEMMs: projections, o, dense / shared FFN, latent down and up */
    ST_EGPU_PROF_ROUTER,   /* router GEMM, top-k, weights */
    ST_EGPU_PROF_EXPERTS,  /* grouping, gather, routed expert FFN */
    ST_EGPU_PROF_COMBINE,  /* combine (+ latent norm) */
    ST_EGPU_PROF_HEAD,     /* output AttnRes + final norm, lm_head, logits to the host */
    ST_EGPU_PROF_OTHER,    /* FFN GLU */
    ST_EGPU_PROF_EMBED,    /* metadata upload, embedding */
    ST_EGPU_PROF_N
} st_egpu_prof_group_t;
typedef struct {
    double ms[ST_EGPU_PROF_N]; /* GPU milliseconds per group, summed over the steps */
    double wall_ms;            /* host wall time of the same steps (gated: launch time + GPU time) */
    long steps, tokens, gate_timeouts, overflows;
} st_egpu_prof_t;
const char *st_egpu_prof_name(int group);
st_egpu_t *st_egpu_prof_engine(void);
void st_egpu_prof_pause(st_egpu_t *g, bool paused);
/* decode-step graphs on or off (benchmarks; the default is on unless STRATA_EGPU_GRAPHS=0); drops the
 * captured graphs, so the next steps capture the kernels chosen then */
void st_egpu_set_graphs(st_egpu_t *g, bool on);
/* the sums since the last take (then reset) */
void st_egpu_prof_take(st_egpu_t *g, st_egpu_prof_t *out);

/* ---- CUDA plumbing (engine_gpu_kernels.cu); the engine's compute kernels are in kernels/
 * (strata/kernels_cuda.h). Asynchronous on s, device pointers unless noted ---- */
st_status_t eg_memcpy_async(const st_gpu_stream_t *s, void *dst, const void *src, size_t bytes, int kind /* 0 d2d, 1 h2d, 2 d2h */);
st_status_t eg_memset_async(const st_gpu_stream_t *s, void *dst, int byte, size_t bytes);
/* ---- profiling helpers (STRATA_EGPU_PROF): n timing events, pinned host words, the stream gate ---- */
st_status_t eg_events_create(void **ev, int n);
void eg_events_destroy(void **ev, int n);
st_status_t eg_event_record(void *ev, const st_gpu_stream_t *s);
/* milliseconds from a to b (both completed), or -1 */
double eg_event_ms(void *a, void *b);
st_status_t eg_host_alloc(void **p, size_t bytes);
/* ordering events (no timing) between the engine's streams: *ev created; s waits for ev's last
 * record (nothing if never recorded); the host waits for it */
st_status_t eg_event_create_sync(void **ev);
st_status_t eg_stream_wait(const st_gpu_stream_t *s, void *ev);
st_status_t eg_event_sync(void *ev);
/* true once ev's last record completed (or on an error, which the next sync reports) */
bool eg_event_done(void *ev);
void eg_host_free(void *p);
/* Hold the stream until gate[0] != 0 (pinned host word, written by the host) or timeout_ns passed;
 * a timeout adds 1 to gate[1]. */
st_status_t eg_gate(const st_gpu_stream_t *s, int *gate, long long timeout_ns);

#ifdef __cplusplus
}
#endif
#endif
