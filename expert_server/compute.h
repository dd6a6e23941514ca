/* The expert server's compute: one dispatch's rows, grouped by expert, through each expert's
 * SiTU-GLU FFN (SPEC §6), weighted and summed by the summation tree into the dispatch's output rows
 * (docs/architecture.md, "Bit-exact expert results"; wire.h). No I/O. */
#ifndef STRATA_ES_COMPUTE_H
#define STRATA_ES_COMPUTE_H

#include <stdint.h>

#include "strata/kernels.h"
#include "strata/model.h"
#include "strata/wire.h"

typedef struct {
    const st_ckpt_t *ck;
    const st_config_t *c;
    int n_layers, n_experts;
    st_expert_weights_t *w; /* [n_layers][n_experts]; bound on demand (mmap views) */
    uint8_t *bound;         /* [n_layers][n_experts] */
    int max_rows;
    float *ws;              /* FFN workspace for max_rows */
    float *xin;             /* [max_rows, ℓ]: one expert's rows gathered from distinct rows; an output
                             * row's weighted leaves */
    float *y;               /* [max_rows, ℓ]: the FFN rows, one per pair */
    uint32_t *loff, *lrow, *lid; /* the leaf table (st_es_leaf_table) */
    float *lp;
} st_es_compute_t;

/* The leaves of a dispatch's output rows: loff [n_out + 1], and for leaf k: lrow[k] its pair (row
 * of the grouped order), lid[k] its expert, lp[k] its weight [offsets[n_exp]]; leaves of a row in
 * ascending expert order. A pair naming an output row twice for one expert (not a tree node) is
 * refused (ST_ERR_INVALID_ARG). CPU and GPU compute share it. */
st_status_t st_es_leaf_table(const st_wire_dispatch_t *d, uint32_t n_exp, uint32_t *loff, uint32_t *lrow, uint32_t *lid,
                             float *lp);

st_status_t st_es_compute_init(st_es_compute_t *x, const st_ckpt_t *ck, int max_rows);
void st_es_compute_cleanup(st_es_compute_t *x);
/* Make expert e of layer l available (no-op when bound). Errors name the tensor. */
st_status_t st_es_compute_bind(st_es_compute_t *x, int layer, int e);
/* A decoded dispatch d of n_exp experts (wire.h: its pairs grouped by expert; with d->src, pair r's
 * input is d->rows[src[r]], else d->rows[r]) → out [d->n_out, ew]: row o = the tree over the pairs
 * with output row o of fl(p · E(input)) + 0 (kernels.h st_moe_tree_rows). Experts must be bound. */
st_status_t st_es_compute_run(st_es_compute_t *x, int layer, uint32_t n_exp, const st_wire_dispatch_t *d, float *out);

#endif
