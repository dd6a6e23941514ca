/* The expert server's compute: one dispatch's rows, grouped by expert, through each expert's
 * SiTU-GLU FFN (SPEC §6) into reply rows in the same order. No I/O. */
#ifndef STRATA_ES_COMPUTE_H
#define STRATA_ES_COMPUTE_H

#include <stdint.h>

#include "strata/kernels.h"
#include "strata/model.h"

typedef struct {
    const st_ckpt_t *ck;
    const st_config_t *c;
    int n_layers, n_experts;
    st_expert_weights_t *w; /* [n_layers][n_experts]; bound on demand (mmap views) */
    uint8_t *bound;         /* [n_layers][n_experts] */
    int max_rows;
    float *ws;              /* FFN workspace for max_rows */
    float *xin;             /* [max_rows, ℓ]: one expert's rows gathered from distinct rows */
} st_es_compute_t;

st_status_t st_es_compute_init(st_es_compute_t *x, const st_ckpt_t *ck, int max_rows);
void st_es_compute_cleanup(st_es_compute_t *x);
/* Make expert e of layer l available (no-op when bound). Errors name the tensor. */
st_status_t st_es_compute_bind(st_es_compute_t *x, int layer, int e);
/* rows [n, ew] grouped by expert_ids/offsets → out [n, ew]; with src, row r is rows[src[r]]
 * (distinct rows, wire.h ST_WIRE_FLAG_UNIQUE_ROWS; indices checked by the wire decoder). Experts
 * must be bound. */
st_status_t st_es_compute_run(st_es_compute_t *x, int layer, uint32_t n_exp, const uint32_t *expert_ids,
                              const uint32_t *offsets, const float *rows, const uint32_t *src, float *out);

#endif
