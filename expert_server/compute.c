/* Expert server compute (see compute.h). */
#include <stdlib.h>

#include "compute.h"

st_status_t st_es_compute_init(st_es_compute_t *x, const st_ckpt_t *ck, int max_rows) {
    memset(x, 0, sizeof *x);
    x->ck = ck;
    x->c = st_ckpt_config(ck);
    x->n_layers = x->c->n_layers;
    x->n_experts = x->c->n_experts;
    x->max_rows = max_rows;
    size_t n = (size_t)x->n_layers * (size_t)x->n_experts;
    x->w = calloc(n + 1, sizeof *x->w);
    x->bound = calloc(n + 1, 1);
    /* workspace for the widest expert at max_rows: every expert of a checkpoint has the same shape */
    st_weight_t g = {.rows = x->c->moe_inter, .cols = st_config_expert_width(x->c), .dtype = ST_DT_MXFP4};
    st_weight_t d = {.rows = st_config_expert_width(x->c), .cols = x->c->moe_inter, .dtype = ST_DT_MXFP4};
    x->ws = malloc(sizeof(float) * st_ffn_ws_floats(max_rows, &g, &g, &d));
    size_t M = (size_t)max_rows;
    x->xin = malloc(sizeof(float) * M * (size_t)st_config_expert_width(x->c));
    x->y = malloc(sizeof(float) * M * (size_t)st_config_expert_width(x->c));
    x->loff = malloc(sizeof(uint32_t) * (M + 1));
    x->lrow = malloc(sizeof(uint32_t) * M);
    x->lid = malloc(sizeof(uint32_t) * M);
    x->lp = malloc(sizeof(float) * M);
    if (!x->w || !x->bound || !x->ws || !x->xin || !x->y || !x->loff || !x->lrow || !x->lid || !x->lp) {
        st_es_compute_cleanup(x);
        return ST_FAIL(ST_ERR_NO_MEMORY, "expert server compute for %d rows", max_rows);
    }
    return ST_OK;
}

void st_es_compute_cleanup(st_es_compute_t *x) {
    free(x->w);
    free(x->bound);
    free(x->ws);
    free(x->xin);
    free(x->y);
    free(x->loff);
    free(x->lrow);
    free(x->lid);
    free(x->lp);
    memset(x, 0, sizeof *x);
}

st_status_t st_es_compute_bind(st_es_compute_t *x, int layer, int e) {
    if (layer < 0 || layer >= x->n_layers || e < 0 || e >= x->n_experts || !st_config_is_moe_layer(x->c, layer))
        return ST_FAIL(ST_ERR_INVALID_ARG, "expert %d of layer %d does not exist", e, layer);
    size_t i = (size_t)layer * x->n_experts + (size_t)e;
    if (x->bound[i]) return ST_OK;
    st_status_t s = st_ckpt_expert(x->ck, layer, e, &x->w[i]);
    if (s == ST_OK) x->bound[i] = 1;
    return s;
}

st_status_t st_es_leaf_table(const st_wire_dispatch_t *d, uint32_t n_exp, uint32_t *loff, uint32_t *lrow, uint32_t *lid,
                             float *lp) {
    int o =
        st_moe_leaf_table(loff, lrow, lid, lp, d->orow, d->wts, d->offsets, d->expert_ids, (int)n_exp, (int)d->n_out);
    if (o < 0) return ST_OK;
    uint32_t k = loff[o] + 1;
    while (lid[k] != lid[k - 1])
        k++;
    return ST_FAIL(ST_ERR_INVALID_ARG, "output row %d names expert %u twice", o, lid[k]);
}

st_status_t st_es_compute_run(st_es_compute_t *x, int layer, uint32_t n_exp, const st_wire_dispatch_t *d, float *out) {
    const st_config_t *c = x->c;
    int ew = st_config_expert_width(c);
    const uint32_t *expert_ids = d->expert_ids, *offsets = d->offsets;
    if (layer < 0 || layer >= x->n_layers) return ST_FAIL(ST_ERR_INVALID_ARG, "layer %d out of range", layer);
    if (offsets[n_exp] > (uint32_t)x->max_rows || d->n_out > (uint32_t)x->max_rows)
        return ST_FAIL(ST_ERR_CAPACITY, "dispatch of %u rows exceeds this server's %d", offsets[n_exp], x->max_rows);
    for (uint32_t k = 0; k < n_exp; k++) {
        size_t i = (size_t)layer * x->n_experts + expert_ids[k];
        if (expert_ids[k] >= (uint32_t)x->n_experts || !x->bound[i])
            return ST_FAIL(ST_ERR_INVALID_ARG, "expert %u of layer %d is not held here", expert_ids[k], layer);
    }
    st_status_t s = st_es_leaf_table(d, n_exp, x->loff, x->lrow, x->lid, x->lp);
    if (s != ST_OK) return s;
    const float *rf = d->rows;
    const uint16_t *rb = d->rows;
    for (uint32_t k = 0; k < n_exp; k++) {
        int n = (int)(offsets[k + 1] - offsets[k]);
        if (n == 0) continue;
        const st_expert_weights_t *w = &x->w[(size_t)layer * x->n_experts + expert_ids[k]];
        bool gather = d->src || d->bf16; /* from the distinct rows, or widened from bf16 (exact) */
        const float *in = gather ? x->xin : rf + (size_t)offsets[k] * ew;
        for (int r = 0; gather && r < n; r++) {
            size_t i = (size_t)(d->src ? d->src[offsets[k] + r] : offsets[k] + (uint32_t)r) * ew;
            float *dst = x->xin + (size_t)r * ew;
            if (d->bf16)
                for (int q = 0; q < ew; q++) dst[q] = st_bf16_to_f32(rb[i + (size_t)q]);
            else memcpy(dst, rf + i, sizeof(float) * (size_t)ew);
        }
        st_ffn(x->y + (size_t)offsets[k] * ew, in, n, &w->gate, &w->up, &w->down, c->act, c->situ_beta1, c->situ_beta2,
               x->ws);
    }
    /* each output row: its leaves fl(p·y) + 0, then the tree */
    for (uint32_t o = 0; o < d->n_out; o++) {
        int m = (int)(x->loff[o + 1] - x->loff[o]);
        uint32_t *ids = x->lid + x->loff[o];
        for (int k = 0; k < m; k++) {
            const float *y = x->y + (size_t)x->lrow[x->loff[o] + k] * ew;
            float p = x->lp[x->loff[o] + k], *v = x->xin + (size_t)k * ew;
            for (int q = 0; q < ew; q++) v[q] = p * y[q] + 0.0f;
        }
        st_moe_tree_rows(x->xin, ids, m, ew); /* NOTE: overwrites the row's ids in the table (used once) */
        if (m) memcpy(out + (size_t)o * ew, x->xin, sizeof(float) * (size_t)ew);
        else memset(out + (size_t)o * ew, 0, sizeof(float) * (size_t)ew);
    }
    return ST_OK;
}
