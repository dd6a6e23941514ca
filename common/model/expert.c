/* Routed-expert weight lookup (K3 names: block_sparse_moe.experts.J.w1/w3/w2), shared by the
 * attention worker's local path and the expert server. */
#include <stdio.h>

#include "strata/model.h"

st_status_t st_ckpt_expert(const st_ckpt_t *ck, int layer, int j, st_expert_weights_t *out) {
    const st_config_t *c = st_ckpt_config(ck);
    if (layer < 0 || layer >= c->n_layers || !st_config_is_moe_layer(c, layer) || j < 0 || j >= c->n_experts)
        return ST_FAIL(ST_ERR_INVALID_ARG, "expert %d of layer %d does not exist", j, layer);
    int ew = st_config_expert_width(c), mi = c->moe_inter;
    char stem[160];
    st_expert_weights_t w;
    st_status_t s;
    snprintf(stem, sizeof stem, "model.layers.%d.block_sparse_moe.experts.%d.w1", layer, j);
    if ((s = st_ckpt_weight(ck, stem, mi, ew, &w.gate)) != ST_OK) return s;
    snprintf(stem, sizeof stem, "model.layers.%d.block_sparse_moe.experts.%d.w3", layer, j);
    if ((s = st_ckpt_weight(ck, stem, mi, ew, &w.up)) != ST_OK) return s;
    snprintf(stem, sizeof stem, "model.layers.%d.block_sparse_moe.experts.%d.w2", layer, j);
    if ((s = st_ckpt_weight(ck, stem, ew, mi, &w.down)) != ST_OK) return s;
    *out = w;
    return ST_OK;
}
