/* Strata quantile: the global quantile-threshold estimator of SPEC §7 (quantile routing).
 * Worker side builds a small per-step summary of its router scores (st_qsum_*); coordinator side
 * merges the summaries of a step and publishes versioned thresholds (st_qstate_*). The estimator
 * is the counting one (format 2): per (layer, expert) the count of tokens at or above the
 * threshold, a probe count for the local density, and a stochastic-approximation (Newton) update
 * of the decayed quantile. The exact estimator (format 1, exact top tails; st_qx*) is kept as the
 * reference it is tested against. No networking here: bytes in, bytes out. Math, byte maps and
 * measured balance/cost: docs/quantile.md. */
#ifndef STRATA_QUANTILE_H
#define STRATA_QUANTILE_H

#include <stddef.h>
#include <stdint.h>

#include "strata/base.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ST_QSUM_MAGIC 0x53515453u /* "STQS" little-endian; both formats */
#define ST_QSUM_FORMAT 2u         /* counting estimator (st_qsum/st_qstate) */
#define ST_QXSUM_FORMAT 1u        /* exact reference estimator (st_qxsum/st_qxstate) */
#define ST_QSUM_HEADER_BYTES 48u
#define ST_QSUM_SECTION_BYTES 16u
#define ST_QSUM_MAX_EXPERTS 32767u /* expert id fits 15 bits */
#define ST_QSUM_DEFAULT_BUDGET 61440u /* bytes per summary: a worker's step stays under 64 KB */

/* Published thresholds (a view; owned by the st_qstate_t/st_qxstate_t that produced it, valid for
 * history-1 further end_step calls; summaries built on any of the newest history-1 tables are
 * accepted). Both arrays are [n_layers, n_experts] fp32 row-major.
 *   tau[l][j]: expert j of MoE layer l is active for a token iff s_j >= tau. NaN = UNSET: the
 *              whole layer is unset together (SPEC §7 "until the first tau exists"): the worker
 *              routes that layer top-k.
 *   rho[l][j]: counting estimator: the PROBE threshold (a whole layer is probed or NaN); the
 *              worker also counts the tokens between rho and tau, which gives the density.
 *              Exact estimator: the report cut (the worker lists every score >= rho).
 * Workers pass the whole table back into st_qsum_begin / st_qxsum_begin. */
typedef struct {
    uint64_t version; /* 1, 2, ...; 0 = no table */
    uint32_t n_layers, n_experts;
    const float *tau; /* [n_layers, n_experts] */
    const float *rho; /* [n_layers, n_experts] */
} st_qtable_t;

static inline int st_qtau_is_set(float tau) { return tau == tau; /* NaN = unset */ }

/* ================= counting estimator (format 2): the one the roles use ================= */

/* ---------------- worker side ---------------- */
typedef struct st_qsum st_qsum_t;

/* CPU reference of the per-layer count (the GPU router epilogue computes the same numbers):
 * scores [T, n] fp32 row-major; tau, rho [n] (rho may be NULL). cnt[j] = #{t : s[t][j] >= tau[j]};
 * band[j] (when rho and band are non-NULL) = #{t : s[t][j] >= rho[j]} - cnt[j] when rho < tau,
 * cnt[j] - #{t : s[t][j] >= rho[j]} when rho > tau (always >= 0). NaN tau counts nothing. */
void st_qsum_count_layer(const float *scores, uint32_t T, uint32_t n, const float *tau, const float *rho,
                         uint32_t *cnt, uint32_t *band);

/* Buffer size for one summary under the default budget (the builder never writes more than
 * min(budget, cap)); size the send buffer once with it. 0 on invalid shapes. */
size_t st_qsum_max_bytes(uint32_t n_layers, uint32_t n_experts, uint32_t k, uint32_t max_tokens);

st_status_t st_qsum_create(uint32_t n_layers, uint32_t n_experts, uint32_t k, uint32_t max_tokens,
                           st_qsum_t **out);
void st_qsum_destroy(st_qsum_t *b);
/* Byte budget of one summary (default ST_QSUM_DEFAULT_BUDGET; at least one section of any kind
 * must fit). Layers that do not fit wait: each summary sends the layers sent longest ago first. */
st_status_t st_qsum_set_budget(st_qsum_t *b, size_t bytes);

/* Start one step's summary into buf[cap]. th: the table the worker routed this step with (NULL or
 * version 0: none); it must stay valid until st_qsum_finish. */
st_status_t st_qsum_begin(st_qsum_t *b, void *buf, size_t cap, uint32_t worker_id, uint64_t step,
                          const st_qtable_t *th);
/* Layer `layer`'s scores: [n_tokens, n_experts] fp32 row-major, finite. Each layer at most once
 * per summary; n_tokens == 0 adds nothing. A layer this summary does not carry (budget) returns
 * ST_OK at once. Does not allocate. */
st_status_t st_qsum_add_layer(st_qsum_t *b, uint32_t layer, const float *scores, uint32_t n_tokens);
/* The same from counts made elsewhere (the GPU router epilogue): cnt, band [n] as defined by
 * st_qsum_count_layer with this summary's table; band is required when the table probes the
 * layer (rho row set) and ignored otherwise. Only for layers whose tau is set: a layer without
 * one needs its scores (st_qsum_add_layer), for its first threshold. */
st_status_t st_qsum_add_layer_counts(st_qsum_t *b, uint32_t layer, uint32_t n_tokens, const uint32_t *cnt,
                                     const uint32_t *band);
/* Close the summary; *out_bytes = its length. */
st_status_t st_qsum_finish(st_qsum_t *b, size_t *out_bytes);
/* Layers carried by the last finished summary (for benchmarks and tests). */
uint32_t st_qsum_last_sections(const st_qsum_t *b);

/* ---------------- coordinator side ---------------- */
typedef struct st_qstate st_qstate_t;

typedef struct {
    uint32_t history;     /* published tables kept for summaries built on older ones (default 16) */
    uint32_t probe_every; /* a layer is probed in 1 table of probe_every (default 4; 1 = always) */
    double probe_rate;    /* the probe band holds probe_rate*(k/n) of the tokens (default 0.5) */
    double slope_decay;   /* decay of the density estimate per probe (default 0.7) */
    double trend_gain;    /* drift (velocity) term: 1 = critically damped, 0 = off (default 1) */
    double lead;          /* steps from a step's counts to the step routed with the table they
                             update (report, end_step, fetch); tau is published that far ahead
                             along the drift (default 2) */
    double min_tokens;    /* a layer's first tau waits for this many init tokens (default 2n/k) */
} st_qstate_opts_t;

typedef struct {
    uint64_t version;        /* last published */
    uint64_t n_set;          /* (l, j) with tau set */
    uint64_t n_exact;        /* unused by the counting estimator (0) */
    double max_rel_uncert;   /* max over set (l, j) of |smoothed observed rate at tau - k/n| / (k/n) */
    uint64_t summaries;      /* merged since create */
    uint64_t sections;       /* layer sections merged since create */
    uint64_t layers_updated; /* layer updates since create */
    double last_tokens;      /* tokens counted in the last end_step, summed over layers */
    size_t state_bytes;      /* memory held by the state */
} st_qstate_stats_t;

void st_qstate_opts_default(st_qstate_opts_t *o);
/* lambda in [0, 1): D <- lambda*D + new each step (0: this step only). opts NULL: defaults. */
st_status_t st_qstate_create(uint32_t n_layers, uint32_t n_experts, uint32_t k, double lambda,
                             const st_qstate_opts_t *opts, st_qstate_t **out);
void st_qstate_destroy(st_qstate_t *q);

/* Validate one worker summary and add it to the current step. On any error nothing changes:
 * ST_ERR_PROTOCOL for a malformed one (truncated, wrong format/shape, a table version never
 * published, counts out of range), ST_ERR_OUT_OF_RANGE for a well-formed one built on a table no
 * longer among the last history-1 (a lagging worker: drop it, it is not the sender's fault).
 * The bytes are not kept: they may be freed when this returns. */
st_status_t st_qstate_merge(st_qstate_t *q, const void *bytes, size_t len);
/* Close the step: update tau of every layer that got data, publish version+1 (every step, also
 * without data). *out: the new table (may be NULL). Does not allocate. */
st_status_t st_qstate_end_step(st_qstate_t *q, st_qtable_t *out);
/* The newest table (version 0 before the first end_step). */
void st_qstate_table(const st_qstate_t *q, st_qtable_t *out);
void st_qstate_stats(const st_qstate_t *q, st_qstate_stats_t *out);
/* Diagnostics and tests: the counts merged into the current step for `layer` (cnt, band: [n]),
 * summed over summaries and table versions, and the tokens behind the count planes. */
st_status_t st_qstate_step_counts(const st_qstate_t *q, uint32_t layer, uint32_t *cnt, uint32_t *band, uint64_t *tokens);
/* Relative standard error of the rate at the newest tau[layer][expert] (sampling noise of the
 * decayed counts; docs/quantile.md). NaN: unset. */
float st_qstate_uncertainty(const st_qstate_t *q, uint32_t layer, uint32_t expert);

/* ================= exact estimator (format 1): the reference ================= */
typedef struct st_qxsum st_qxsum_t;
size_t st_qxsum_max_bytes(uint32_t n_layers, uint32_t n_experts, uint32_t k, uint32_t max_tokens);
st_status_t st_qxsum_create(uint32_t n_layers, uint32_t n_experts, uint32_t k, uint32_t max_tokens,
                            st_qxsum_t **out);
void st_qxsum_destroy(st_qxsum_t *b);
st_status_t st_qxsum_begin(st_qxsum_t *b, void *buf, size_t cap, uint32_t worker_id, uint64_t step,
                           const st_qtable_t *th);
st_status_t st_qxsum_add_layer(st_qxsum_t *b, uint32_t layer, const float *scores, uint32_t n_tokens);
st_status_t st_qxsum_finish(st_qxsum_t *b, size_t *out_bytes);

typedef struct st_qxstate st_qxstate_t;
typedef struct {
    double min_target;         /* a layer is unset while (k/n)*W < min_target (default 1.0) */
    uint32_t max_entries;      /* stored entries per (layer, expert) (default 1024; 16 B each) */
    uint32_t max_summaries;    /* summaries merged per step (default 256) */
    uint32_t max_step_entries; /* gathered entries per (layer, expert) per step (default 1<<16) */
    uint32_t history;          /* published tables kept (default 16) */
} st_qxstate_opts_t;
typedef struct {
    uint64_t version, n_set, n_exact; /* n_exact: tau certified exact (zero rank uncertainty) */
    double max_rel_uncert;            /* max certified rank uncertainty / target */
    uint64_t entries, compactions;
    size_t state_bytes;
} st_qxstate_stats_t;
void st_qxstate_opts_default(st_qxstate_opts_t *o);
st_status_t st_qxstate_create(uint32_t n_layers, uint32_t n_experts, uint32_t k, double lambda,
                              const st_qxstate_opts_t *opts, st_qxstate_t **out);
void st_qxstate_destroy(st_qxstate_t *q);
/* NOTE: zero-copy: `bytes` must stay valid and unmodified until st_qxstate_end_step returns. */
st_status_t st_qxstate_merge(st_qxstate_t *q, const void *bytes, size_t len);
st_status_t st_qxstate_end_step(st_qxstate_t *q, st_qtable_t *out);
void st_qxstate_table(const st_qxstate_t *q, st_qtable_t *out);
void st_qxstate_stats(const st_qxstate_t *q, st_qxstate_stats_t *out);
float st_qxstate_uncertainty(const st_qxstate_t *q, uint32_t layer, uint32_t expert);

#ifdef __cplusplus
}
#endif
#endif
