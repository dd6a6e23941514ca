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
    x->xin = malloc(sizeof(float) * (size_t)max_rows * (size_t)st_config_expert_width(x->c));
    if (!x->w || !x->bound || !x->ws || !x->xin) {
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

st_status_t st_es_compute_run(st_es_compute_t *x, int layer, uint32_t n_exp, const uint32_t *expert_ids,
                              const uint32_t *offsets, const float *rows, const uint32_t *src, float *out) {
    const st_config_t *c = x->c;
    int ew = st_config_expert_width(c);
    if (layer < 0 || layer >= x->n_layers) return ST_FAIL(ST_ERR_INVALID_ARG, "layer %d out of range", layer);
    if (offsets[n_exp] > (uint32_t)x->max_rows)
        return ST_FAIL(ST_ERR_CAPACITY, "dispatch of %u rows exceeds this server's %d", offsets[n_exp], x->max_rows);
    for (uint32_t k = 0; k < n_exp; k++) {
        size_t i = (size_t)layer * x->n_experts + expert_ids[k];
        if (expert_ids[k] >= (uint32_t)x->n_experts || !x->bound[i])
            return ST_FAIL(ST_ERR_INVALID_ARG, "expert %u of layer %d is not held here", expert_ids[k], layer);
    }
    for (uint32_t k = 0; k < n_exp; k++) {
        int n = (int)(offsets[k + 1] - offsets[k]);
        if (n == 0) continue;
        const st_expert_weights_t *w = &x->w[(size_t)layer * x->n_experts + expert_ids[k]];
        const float *in = rows + (size_t)offsets[k] * ew;
        if (src) { /* this expert's rows from the distinct ones */
            for (int r = 0; r < n; r++)
                memcpy(x->xin + (size_t)r * ew, rows + (size_t)src[offsets[k] + r] * ew, sizeof(float) * (size_t)ew);
            in = x->xin;
        }
        st_ffn(out + (size_t)offsets[k] * ew, in, n, &w->gate, &w->up, &w->down, c->act, c->situ_beta1, c->situ_beta2,
               x->ws);
    }
    return ST_OK;
}
