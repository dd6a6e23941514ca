/* Strata quantile: the global quantile-threshold estimator of SPEC §7 (quantile routing).
 * Worker side builds a compact per-step score summary (st_qsum_*); coordinator side merges the
 * summaries of a step into a decayed distribution and publishes versioned thresholds (st_qstate_*).
 * No networking here: bytes in, bytes out. Design, byte map and error bound: docs/quantile.md. */
#ifndef STRATA_QUANTILE_H
#define STRATA_QUANTILE_H

#include <stddef.h>
#include <stdint.h>

#include "strata/base.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ST_QSUM_MAGIC 0x53515453u /* "STQS" little-endian */
#define ST_QSUM_FORMAT 1u         /* byte-map version; bumped on any layout change */
#define ST_QSUM_HEADER_BYTES 48u
#define ST_QSUM_SECTION_BYTES 16u
#define ST_QSUM_MAX_EXPERTS 32767u /* expert id is 15 bits in a record */

/* Published thresholds (a view; owned by the st_qstate_t that produced it, valid for history-1
 * further end_step calls; summaries built on any of the newest history-1 tables are accepted). Both arrays are [n_layers, n_experts] fp32 row-major.
 *   tau[l][j]: expert j of MoE layer l is active for a token iff s_j >= tau. NaN = UNSET: the
 *              whole layer is unset together (too little data, SPEC §7 "until the first tau
 *              exists"): the worker routes that layer top-k.
 *   rho[l][j]: report cut: the worker's summary lists every score >= rho (rho <= tau; the value
 *              at rank 1.5x the target count, plus a noise margin, of the decayed distribution).
 *              May be set while tau is unset. NaN (always with lambda = 0, where old data
 *              cannot back up a cut): the worker sends a rank quota for that expert instead. Workers pass the whole table back into st_qsum_begin. */
typedef struct {
    uint64_t version; /* 1, 2, ...; 0 = no table */
    uint32_t n_layers, n_experts;
    const float *tau; /* [n_layers, n_experts] */
    const float *rho; /* [n_layers, n_experts] */
} st_qtable_t;

static inline int st_qtau_is_set(float tau) { return tau == tau; /* NaN = unset */ }

/* ---------------- worker side ---------------- */
typedef struct st_qsum st_qsum_t;

/* Upper bound of one summary's size (all n_layers sections, each with up to max_tokens tokens);
 * size the send buffer once with it. 0 on invalid shapes. */
size_t st_qsum_max_bytes(uint32_t n_layers, uint32_t n_experts, uint32_t k, uint32_t max_tokens);

st_status_t st_qsum_create(uint32_t n_layers, uint32_t n_experts, uint32_t k, uint32_t max_tokens,
                           st_qsum_t **out);
void st_qsum_destroy(st_qsum_t *b);

/* Start one step's summary into buf[cap]. th: the table the worker routed this step with (NULL or
 * version 0: none); it must stay valid until st_qsum_finish. */
st_status_t st_qsum_begin(st_qsum_t *b, void *buf, size_t cap, uint32_t worker_id, uint64_t step,
                          const st_qtable_t *th);
/* Append layer `layer`'s scores: [n_tokens, n_experts] fp32 row-major, finite. Each layer at most
 * once per summary; n_tokens == 0 adds nothing. Does not allocate. */
st_status_t st_qsum_add_layer(st_qsum_t *b, uint32_t layer, const float *scores, uint32_t n_tokens);
/* Close the summary; *out_bytes = its length. */
st_status_t st_qsum_finish(st_qsum_t *b, size_t *out_bytes);

/* ---------------- coordinator side ---------------- */
typedef struct st_qstate st_qstate_t;

typedef struct {
    double min_target;       /* a layer is unset while (k/n)*W < min_target (default 1.0) */
    uint32_t max_entries;    /* stored entries per (layer, expert) (default 1024; 16 B each) */
    uint32_t max_summaries;  /* summaries merged per step (default 256) */
    uint32_t max_step_entries; /* gathered entries per (layer, expert) per step (default 1<<16) */
    uint32_t history;        /* published tables kept for summaries built on older ones (default 16) */
} st_qstate_opts_t;

typedef struct {
    uint64_t version;        /* last published */
    uint64_t n_set;          /* (l, j) with tau set */
    uint64_t n_exact;        /* of those, tau certified exact (zero rank uncertainty) */
    double max_rel_uncert;   /* max over set (l, j) of certified rank uncertainty / target */
    uint64_t entries;        /* stored entries now, all (l, j) */
    uint64_t compactions;    /* (l, j) compactions so far */
    size_t state_bytes;      /* memory held by the state */
} st_qstate_stats_t;

void st_qstate_opts_default(st_qstate_opts_t *o);
/* lambda in [0, 1): D <- lambda*D + new each step (0: this step only). opts NULL: defaults. */
st_status_t st_qstate_create(uint32_t n_layers, uint32_t n_experts, uint32_t k, double lambda,
                             const st_qstate_opts_t *opts, st_qstate_t **out);
void st_qstate_destroy(st_qstate_t *q);

/* Validate one worker summary and stage it for the current step. On any error (malformed,
 * truncated, wrong format/shape, unknown table version, capacity) nothing changes.
 * NOTE: zero-copy: `bytes` must stay valid and unmodified until st_qstate_end_step returns. */
st_status_t st_qstate_merge(st_qstate_t *q, const void *bytes, size_t len);
/* Close the step: decay, merge the staged summaries (the result does not depend on the order they
 * were merged in, bit for bit), compute tau and rho for every (l, j), publish version+1. *out: the
 * new table (may be NULL). Does not allocate. */
st_status_t st_qstate_end_step(st_qstate_t *q, st_qtable_t *out);
/* The newest table (version 0 before the first end_step). */
void st_qstate_table(const st_qstate_t *q, st_qtable_t *out);
void st_qstate_stats(const st_qstate_t *q, st_qstate_stats_t *out);
/* Certified rank uncertainty of the newest tau[layer][expert], as a fraction of the target count
 * m = (k/n)*W: the true weight of scores >= tau is within this of what the estimator counted.
 * 0: exact. NaN: no data. */
float st_qstate_uncertainty(const st_qstate_t *q, uint32_t layer, uint32_t expert);

#ifdef __cplusplus
}
#endif
#endif
