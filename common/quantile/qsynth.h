/* Synthetic K3-shaped router load for the quantile tests and benchmarks (not used by the roles):
 * sigmoid router scores with a static per-expert skew, a per-token shift (correlated experts, so
 * some tokens hit k_max), and hot experts whose heat drifts over time. Parameters and what they
 * mean for top-k: docs/quantile.md "Synthetic load". */
#ifndef STRATA_QSYNTH_H
#define STRATA_QSYNTH_H

#include <stdint.h>

#include "strata/base.h"

typedef struct {
    uint32_t n_layers, n_experts;
    double skew_sd;   /* static per-(layer, expert) logit offset, sd (default 0.1) */
    double token_sd;  /* per-token logit shift shared by all experts, sd (default 0.1) */
    double hot_amp;   /* logit offset of a hot expert at the top of its bump (default 0.5) */
    double hot_frac;  /* share of experts inside their bump at any time (default 0.1) */
    double period;    /* steps for the hot set to rotate once; a bump lasts hot_frac*period (default 6000) */
    uint64_t seed;
} st_qsynth_opts_t;

typedef struct st_qsynth st_qsynth_t;

void st_qsynth_opts_default(st_qsynth_opts_t *o, uint32_t n_layers, uint32_t n_experts);
st_status_t st_qsynth_create(const st_qsynth_opts_t *o, st_qsynth_t **out);
void st_qsynth_destroy(st_qsynth_t *sy);
/* scores [T, n] fp32 row-major of layer `layer` at step `step` (time may be fractional), drawn from
 * rng. */
void st_qsynth_scores(const st_qsynth_t *sy, uint32_t layer, double step, float *scores, uint32_t T, st_rng_t *rng);
/* The expert's logit offset (static skew + heat) at that step, for reports. */
double st_qsynth_offset(const st_qsynth_t *sy, uint32_t layer, uint32_t expert, double step);

#endif
