/* The CPU backend of the engine: fp32 host memory, the plain-C kernels of kernels/ (SPEC §2–9
 * loop by loop). It owns the KDA state pools, the paged MLA latent-cache pool and the step buffers;
 * the frontend (engine.c) owns the bookkeeping and the layer walk. Synchronous: each op computes
 * before it returns. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_impl.h"

#define MLA_NORM_EPS 1e-6f /* q_a_layernorm / kv_a_layernorm (checkpoint-layout §5.4) */
#define L2_EPS 1e-6f

typedef struct {
    float *kda_S;    /* [max_seqs][n_kda][H*dk*dv] */
    float *kda_conv; /* [max_seqs][n_kda][3][(K-1)*P] */
    size_t S_per, conv_per;
    int R;                /* latent-cache row: kv_lora_rank + qk_rope */
    float *kv_pool;       /* [n_pages][page_size][R] */
    float **seq_pageptr;  /* [max_seqs][n_mla][pps]: the rows of e->seq_pageid's pages */
    size_t lin_ws;
    int *counts;          /* [max_seqs][vocab]: tokens sampled per sequence (the penalties) */
} cpu_t;

static size_t lin_ws_max(const st_engine_w_t *W, const st_config_t *c) {
    size_t m = 0;
#define LW(w) do { if ((w).rows > 0) { size_t s_ = st_linear_ws_floats(&(w)); if (s_ > m) m = s_; } } while (0)
    LW(W->lm_head);
    for (int l = 0; l < c->n_layers; l++) {
        const st_layer_w_t *L = &W->layers[l];
        LW(L->q); LW(L->k); LW(L->v); LW(L->f_a); LW(L->f_b); LW(L->b); LW(L->g_a); LW(L->g); LW(L->o);
        LW(L->q_a); LW(L->kv_a); LW(L->kv_b); LW(L->router); LW(L->lat_down); LW(L->lat_up);
    }
#undef LW
    return m;
}

/* step buffers, carved from the arena; with base NULL only the size is computed */
typedef struct {
    float *partial, *h, *xn, *a, *final;
    float **blocks;
    float *ar_stats, *ar_acc;
    float *q, *k, *v, *qc, *kc, *vc, *fa, *g, *beta, *gate, *ga, *o; /* KDA + shared with MLA */
    float *cq, *ckv, *qabs, *olat, *cctx, *kvfull, *K, *V, *attn_ws, *kda_ws;
    float *scores, *wts, *z, *zin, *eout, *u, *ffn_ws, *sh;
    int *ids, *ids_tmp, *cnt, *grp_off, *grp_tok, *tok_ent;
    const float **at;       /* [T, kc] remote experts: the node values (st_moe_work_t.at) */
    uint32_t *qcnt, *qband; /* [n] threshold counts (count observer) */
    float *lin;
} st_bufs_t;

typedef struct {
    st_arena_t arena;
    st_bufs_t b;
} cpu_mb_t;

#define CPU(e) ((cpu_t *)(e)->bk)
#define MB(mb) ((cpu_mb_t *)(mb)->bk)

static void *carve(uint8_t *base, size_t *off, size_t bytes) {
    size_t o = (*off + 63) & ~(size_t)63;
    *off = o + bytes;
    return base ? base + o : NULL;
}

static size_t carve_bufs(st_engine_t *e, uint8_t *base, st_bufs_t *b) {
    const st_config_t *c = &e->c;
    size_t off = 0, T = (size_t)e->o.max_batch_tokens, d = (size_t)c->d, F = sizeof(float);
    size_t ctx = (size_t)e->o.max_ctx;
#define CF(field, n) b->field = carve(base, &off, (size_t)(n) * F)
#define CI(field, n) b->field = carve(base, &off, (size_t)(n) * sizeof(int))
    CF(partial, T * d); CF(h, T * d); CF(xn, T * d); CF(a, T * d); CF(final, T * d);
    b->blocks = carve(base, &off, (size_t)(e->n_blocks + 1) * sizeof(float *));
    if (b->blocks)
        for (int i = 0; i < e->n_blocks; i++) b->blocks[i] = carve(base, &off, T * d * F);
    else
        for (int i = 0; i < e->n_blocks; i++) carve(base, &off, T * d * F);
    CF(ar_stats, T * (size_t)e->Qmax * 2); CF(ar_acc, T * (size_t)e->Qmax * d);
    size_t P = (size_t)c->kda_heads * (size_t)c->kda_head_dim;
    size_t Pm = (size_t)c->mla_heads * (size_t)(c->qk_nope + c->qk_rope);
    size_t Vm = (size_t)c->mla_heads * (size_t)c->v_head_dim;
    size_t wide = ST_MAX(ST_MAX(P, Pm), Vm);
    CF(q, T * wide); CF(k, T * P); CF(v, T * P); CF(qc, T * P); CF(kc, T * P); CF(vc, T * P);
    CF(fa, T * (size_t)ST_MAX(c->f_rank, 1)); CF(g, T * P); CF(beta, T * (size_t)c->kda_heads);
    CF(gate, T * wide); CF(ga, T * (size_t)ST_MAX(c->g_rank, 1)); CF(o, T * wide);
    CF(kda_ws, st_kda_chunked_ws_floats(c->kda_heads, c->kda_head_dim, c->kda_head_dim));
    size_t R = (size_t)(c->kv_lora_rank + c->qk_rope);
    CF(cq, T * (size_t)ST_MAX(c->q_lora_rank, 1)); CF(ckv, T * R);
    CF(qabs, T * (size_t)c->mla_heads * R); CF(olat, T * (size_t)c->mla_heads * (size_t)c->kv_lora_rank);
    size_t kvw = (size_t)c->mla_heads * (size_t)(c->qk_nope + c->v_head_dim);
    if (e->n_mla > 0) {
        CF(cctx, ctx * (size_t)c->kv_lora_rank); CF(kvfull, ctx * kvw); CF(K, ctx * Pm); CF(V, ctx * Vm);
    }
    CF(attn_ws, ctx + 64);
    size_t n = (size_t)ST_MAX(c->n_experts, 1), kc = (size_t)e->kcap, ew = (size_t)st_config_expert_width(c);
    CF(scores, T * n); CF(wts, T * kc); CI(ids, T * kc); CI(ids_tmp, T * kc); CI(cnt, T);
    CI(grp_off, n + 1); CI(grp_tok, T * kc); CI(tok_ent, T);
    b->at = carve(base, &off, T * kc * sizeof *b->at);
    b->qcnt = carve(base, &off, n * sizeof(uint32_t)); b->qband = carve(base, &off, n * sizeof(uint32_t));
    CF(z, T * ew); CF(zin, 2 * T * ew); CF(eout, T * kc * ew); CF(u, T * ew); CF(sh, T * d);
    /* FFN workspace: the largest of dense, shared and expert FFNs at T (experts: T·kcap rows max) */
    size_t fw = 0;
    for (int l = 0; l < c->n_layers; l++) {
        const st_layer_w_t *L = &e->W.layers[l];
        if (L->dense.gate.rows) fw = ST_MAX(fw, st_ffn_ws_floats((int)T, &L->dense.gate, &L->dense.up, &L->dense.down));
        if (L->shared.gate.rows) fw = ST_MAX(fw, st_ffn_ws_floats((int)T, &L->shared.gate, &L->shared.up, &L->shared.down));
        if (L->experts)
            for (int j = 0; j < c->n_experts; j++)
                fw = ST_MAX(fw, st_ffn_ws_floats((int)T, &L->experts[j].gate, &L->experts[j].up, &L->experts[j].down));
    }
    CF(ffn_ws, fw);
    CF(lin, CPU(e)->lin_ws);
#undef CF
#undef CI
    return off + 64;
}

static void kda_layer(st_engine_mb_t *mb, int l) {
    st_engine_t *e = mb->e;
    cpu_t *k = CPU(e);
    const st_layer_w_t *L = &e->W.layers[l];
    const st_ent_t *ents = mb->ents;
    int ne = mb->n_seqs, T = mb->T;
    st_bufs_t *b = &MB(mb)->b;
    const st_config_t *c = &e->c;
    int H = c->kda_heads, dk = c->kda_head_dim, dv = dk, P = H * dk, K = c->conv_k;
    st_linear(b->q, b->xn, &L->q, T, b->lin);
    st_linear(b->k, b->xn, &L->k, T, b->lin);
    st_linear(b->v, b->xn, &L->v, T, b->lin);
    st_linear(b->fa, b->xn, &L->f_a, T, b->lin);
    st_linear(b->g, b->fa, &L->f_b, T, b->lin);
    st_kda_gate(b->g, b->g, L->A_log, L->dt_bias, T, H, dk, c->gate_bounded, c->gate_lower_bound);
    st_linear(b->beta, b->xn, &L->b, T, b->lin);
    for (size_t i = 0; i < (size_t)T * H; i++) b->beta[i] = st_sigmoid(b->beta[i]);
    int ks = e->layer_slot[l];
    float scale = 1.0f / sqrtf((float)dk);
    /* NOTE: the dense diagonal-tile form needs exp(-G) over a 16-token tile inside fp32
     * (16·|g_min| < ~88); a lower bound below that takes the per-pair path (SPEC §3.3) */
    bool dense_diag = c->gate_bounded && c->gate_lower_bound * 16.0f > -85.0f;
    for (int i = 0; i < ne; i++) {
        const st_ent_t *en = &ents[i];
        size_t r = (size_t)en->off;
        float *conv = k->kda_conv + ((size_t)en->slot * e->n_kda + ks) * k->conv_per;
        size_t cs = (size_t)(K - 1) * P;
        st_conv_silu(b->qc + r * P, b->q + r * P, conv, L->conv_q, en->n, P, K);
        st_conv_silu(b->kc + r * P, b->k + r * P, conv + cs, L->conv_k, en->n, P, K);
        st_conv_silu(b->vc + r * P, b->v + r * P, conv + 2 * cs, L->conv_v, en->n, H * dv, K);
        st_l2norm_heads(b->qc + r * P, en->n, H, dk, L2_EPS);
        st_l2norm_heads(b->kc + r * P, en->n, H, dk, L2_EPS);
        float *S = k->kda_S + ((size_t)en->slot * e->n_kda + ks) * k->S_per;
        /* NOTE: decode runs the recurrence itself (SPEC §3.2); prompts run the chunked form */
        if (en->n == 1)
            st_kda_recurrent(b->o + r * P, b->qc + r * P, b->kc + r * P, b->vc + r * P, b->g + r * P,
                             b->beta + r * H, S, en->n, H, dk, dv, scale);
        else
            st_kda_chunked(b->o + r * P, b->qc + r * P, b->kc + r * P, b->vc + r * P, b->g + r * P,
                           b->beta + r * H, S, en->n, H, dk, dv, scale, dense_diag, b->kda_ws);
    }
    ST_ENGINE_TRACE(e, l, ST_TRACE_KDA_Q, b->qc, T, P);
    ST_ENGINE_TRACE(e, l, ST_TRACE_KDA_K, b->kc, T, P);
    ST_ENGINE_TRACE(e, l, ST_TRACE_KDA_V, b->vc, T, H * dv);
    ST_ENGINE_TRACE(e, l, ST_TRACE_KDA_G, b->g, T, P);
    ST_ENGINE_TRACE(e, l, ST_TRACE_KDA_O, b->o, T, H * dv);
    if (c->full_rank_gate) {
        st_linear(b->gate, b->xn, &L->g, T, b->lin);
    } else {
        st_linear(b->ga, b->xn, &L->g_a, T, b->lin);
        st_linear(b->gate, b->ga, &L->g, T, b->lin);
    }
    st_kda_out_gate(b->o, b->gate, L->o_norm, T, H, dv, c->rms_eps);
    ST_ENGINE_TRACE(e, l, ST_TRACE_ATTN_O, b->o, T, H * dv);
}

static st_kv_view_t kv_view(st_engine_t *e, int slot, int m, int n) {
    st_kv_view_t kv = {
        .pages = CPU(e)->seq_pageptr + ((size_t)slot * e->n_mla + m) * e->pps,
        .page_size = e->page_size,
        .R = CPU(e)->R,
        .n = n,
    };
    return kv;
}

static void mla_layer(st_engine_mb_t *mb, int l) {
    st_engine_t *e = mb->e;
    const st_layer_w_t *L = &e->W.layers[l];
    const st_ent_t *ents = mb->ents;
    int ne = mb->n_seqs, T = mb->T;
    st_bufs_t *b = &MB(mb)->b;
    const st_config_t *c = &e->c;
    int H = c->mla_heads, nope = c->qk_nope, rope = c->qk_rope, dqk = nope + rope, dv = c->v_head_dim;
    int kvr = c->kv_lora_rank, R = CPU(e)->R, kvw = nope + dv;
    if (c->q_lora_rank > 0) {
        st_linear(b->cq, b->xn, &L->q_a, T, b->lin);
        st_rmsnorm(b->cq, b->cq, L->q_a_norm, T, c->q_lora_rank, MLA_NORM_EPS);
        st_linear(b->q, b->cq, &L->q, T, b->lin);
    } else {
        st_linear(b->q, b->xn, &L->q, T, b->lin);
    }
    ST_ENGINE_TRACE(e, l, ST_TRACE_MLA_Q, b->q, T, H * dqk);
    st_linear(b->ckv, b->xn, &L->kv_a, T, b->lin);
    for (int t = 0; t < T; t++) st_rmsnorm(b->ckv + (size_t)t * R, b->ckv + (size_t)t * R, L->kv_a_norm, 1, kvr, MLA_NORM_EPS);
    int m = e->layer_slot[l];
    float scale = 1.0f / sqrtf((float)dqk);
    for (int i = 0; i < ne; i++) {
        const st_ent_t *en = &ents[i];
        int n_ctx = en->pos0 + en->n;
        st_kv_view_t kv = kv_view(e, en->slot, m, n_ctx);
        for (int t = 0; t < en->n; t++)
            memcpy(st_kv_row(&kv, en->pos0 + t), b->ckv + (size_t)(en->off + t) * R, (size_t)R * sizeof(float));
        const float *q = b->q + (size_t)en->off * H * dqk;
        float *o = b->o + (size_t)en->off * H * dv;
        if (en->n == 1) {
            /* absorbed decode: q' = [W_UK,hᵀ q_nope ; q_pe], MQA over [c̃ ; k_pe], o_h = W_UV,h ō_h */
            for (int h = 0; h < H; h++) {
                float *qa = b->qabs + (size_t)h * R;
                const float *qn = q + (size_t)h * dqk;
                memset(qa, 0, (size_t)kvr * sizeof(float));
                for (int i2 = 0; i2 < nope; i2++) {
                    const float *wr = L->kv_b_f32 + ((size_t)h * kvw + i2) * kvr;
                    for (int j = 0; j < kvr; j++) qa[j] += wr[j] * qn[i2];
                }
                memcpy(qa + kvr, qn + nope, (size_t)rope * sizeof(float));
            }
            st_mla_attn_absorbed(b->olat, b->qabs, &kv, 1, H, kvr, scale, b->attn_ws);
            for (int h = 0; h < H; h++)
                for (int i2 = 0; i2 < dv; i2++) {
                    const float *wr = L->kv_b_f32 + ((size_t)h * kvw + nope + i2) * kvr;
                    const float *ol = b->olat + (size_t)h * kvr;
                    float acc = 0;
                    for (int j = 0; j < kvr; j++) acc += wr[j] * ol[j];
                    o[(size_t)h * dv + i2] = acc;
                }
        } else {
            /* direct prefill: materialise per-head keys and values of the whole context */
            for (int s = 0; s < n_ctx; s++)
                memcpy(b->cctx + (size_t)s * kvr, st_kv_row(&kv, s), (size_t)kvr * sizeof(float));
            st_linear(b->kvfull, b->cctx, &L->kv_b, n_ctx, b->lin);
            for (int s = 0; s < n_ctx; s++) {
                const float *kp = st_kv_row(&kv, s) + kvr;
                for (int h = 0; h < H; h++) {
                    const float *src = b->kvfull + ((size_t)s * H + h) * kvw;
                    float *kd = b->K + ((size_t)s * H + h) * dqk;
                    memcpy(kd, src, (size_t)nope * sizeof(float));
                    memcpy(kd + nope, kp, (size_t)rope * sizeof(float));
                    memcpy(b->V + ((size_t)s * H + h) * dv, src + nope, (size_t)dv * sizeof(float));
                }
            }
            st_mla_attn_direct(o, q, b->K, b->V, en->n, n_ctx, H, dqk, dv, scale, b->attn_ws);
        }
    }
    if (c->mla_output_gate) {
        st_linear(b->gate, b->xn, &L->g, T, b->lin);
        for (size_t i = 0; i < (size_t)T * H * dv; i++) b->o[i] *= st_sigmoid(b->gate[i]);
    }
    ST_ENGINE_TRACE(e, l, ST_TRACE_ATTN_O, b->o, T, H * dv);
}

static void route(st_engine_t *e, const st_layer_w_t *L, int l, int T, st_bufs_t *b) {
    const st_config_t *c = &e->c;
    int n = c->n_experts, k = c->top_k, kc = e->kcap;
    st_linear(b->scores, b->xn, &L->router, T, b->lin);
    st_router_sigmoid(b->scores, T, n);
    if (!st_engine_route_quantile(e, l)) {
        st_route_topk(b->ids_tmp, b->wts, b->scores, L->router_bias, T, n, k, c->renormalize, c->routed_scale);
        for (int t = 0; t < T; t++) {
            memcpy(b->ids + (size_t)t * kc, b->ids_tmp + (size_t)t * k, (size_t)k * sizeof(int));
            b->cnt[t] = k;
        }
    }
    st_engine_route_host(e, l, T, b->scores, b->ids, b->cnt, b->wts); /* quantile sets, the hook */
    bool counted = st_engine_counted(e, l);
    if (counted) {
        const float *rho = st_engine_probe_row(e, l);
        st_route_count(b->qcnt, b->qband, b->scores, e->tau + (size_t)l * n, rho, T, n);
        e->cobs(e->cobs_ctx, l, T, n, b->qcnt, rho ? b->qband : NULL);
    }
    if (e->obs) e->obs(e->obs_ctx, l, T, n, counted || !e->obs_scores ? NULL : b->scores, b->ids, b->cnt, kc);
    /* weights from the unbiased scores over the final sets (SPEC §7) */
    for (int t = 0; t < T; t++) {
        const float *s = b->scores + (size_t)t * n;
        const int *id = b->ids + (size_t)t * kc;
        float *w = b->wts + (size_t)t * kc;
        float sum = 0;
        for (int i = 0; i < b->cnt[t]; i++) sum += s[id[i]];
        for (int i = 0; i < b->cnt[t]; i++)
            w[i] = c->renormalize ? s[id[i]] / (sum + 1e-20f) * c->routed_scale : s[id[i]] * c->routed_scale;
    }
}

static void moe_begin(st_engine_t *e, const st_layer_w_t *L, int l, int T, st_bufs_t *b, st_moe_work_t *w) {
    const st_config_t *c = &e->c;
    route(e, L, l, T, b);
    const float *z = b->xn;
    if (c->latent > 0) {
        st_linear(b->z, b->xn, &L->lat_down, T, b->lin);
        z = b->z;
    }
    ST_ENGINE_TRACE(e, l, ST_TRACE_MOE_Z, (float *)z, T, st_config_expert_width(c));
    *w = (st_moe_work_t){.layer = l, .T = T, .kc = e->kcap, .ew = st_config_expert_width(c), .z = z,
                         .ids = b->ids, .cnt = b->cnt, .wts = b->wts, .tok_ent = b->tok_ent, .out = b->eout,
                         .at = b->at};
}

static void moe_finish(st_engine_t *e, const st_layer_w_t *L, int l, int T, st_bufs_t *b) {
    const st_config_t *c = &e->c;
    int kc = e->kcap, ew = st_config_expert_width(c), d = c->d;
    /* the tree combine (docs/architecture.md, "Bit-exact expert results"), each token's leaves
     * fl(p·y) + 0 weighted in place; remote experts: finished from the executor's node values */
    uint32_t *tid = (uint32_t *)b->ids_tmp;
    if (e->o.remote_experts) st_moe_finish_nodes(b->u, b->at, b->ids, b->cnt, T, kc, ew, b->eout, tid);
    for (int t = 0; t < T && !e->o.remote_experts; t++) {
        float *u = b->u + (size_t)t * ew, *y = b->eout + (size_t)t * kc * ew;
        for (int i = 0; i < b->cnt[t]; i++) {
            float p = b->wts[(size_t)t * kc + i];
            for (int q = 0; q < ew; q++) y[(size_t)i * ew + q] = p * y[(size_t)i * ew + q] + 0.0f;
            tid[i] = (uint32_t)b->ids[(size_t)t * kc + i];
        }
        st_moe_tree_rows(y, tid, b->cnt[t], ew);
        if (b->cnt[t]) memcpy(u, y, (size_t)ew * sizeof(float));
        else memset(u, 0, (size_t)ew * sizeof(float));
    }
    if (c->latent > 0) {
        if (L->lat_norm) st_rmsnorm(b->u, b->u, L->lat_norm, T, ew, c->rms_eps);
        ST_ENGINE_TRACE(e, l, ST_TRACE_MOE_U, b->u, T, ew);
        st_linear(b->a, b->u, &L->lat_up, T, b->lin);
    } else {
        memcpy(b->a, b->u, (size_t)T * d * sizeof(float));
    }
    if (c->n_shared > 0) {
        st_ffn(b->sh, b->xn, T, &L->shared.gate, &L->shared.up, &L->shared.down, c->act, c->situ_beta1,
               c->situ_beta2, b->ffn_ws);
        for (size_t i = 0; i < (size_t)T * d; i++) b->a[i] += b->sh[i];
    }
}

/* ------------------------------------------------------------------ the walk's ops */

static void begin(st_engine_mb_t *mb) {
    st_engine_t *e = mb->e;
    cpu_t *k = CPU(e);
    st_bufs_t *b = &MB(mb)->b;
    int d = e->c.d;
    for (int i = 0; i < mb->n_seqs; i++) {
        const st_ent_t *en = &mb->ents[i];
        for (int m = 0; m < e->n_mla; m++) { /* the rows of the pages the frontend reserved */
            size_t base = ((size_t)en->slot * e->n_mla + m) * e->pps;
            for (int p = 0; p < e->seq_npages[en->slot * e->n_mla + m]; p++)
                k->seq_pageptr[base + p] = k->kv_pool + (size_t)e->seq_pageid[base + p] * e->page_size * k->R;
        }
        for (int t = 0; t < en->n; t++) {
            int r = en->off + t;
            b->tok_ent[r] = i;
            st_weight_rows_f32(&e->W.embed, mb->seqs[i].tokens[t], 1, b->partial + (size_t)r * d);
        }
    }
}

/* h = the partial merged with AttnRes query q of the current block set (phase 2), or the partial. */
static const float *attnres_h(st_engine_mb_t *mb, const float *w, int q) {
    st_engine_t *e = mb->e;
    const st_config_t *c = &e->c;
    st_bufs_t *b = &MB(mb)->b;
    if (c->attn_res_block <= 0 || mb->nb == 0) return b->partial;
    const st_block_q_t *bq = &e->bq[mb->nb - 1];
    st_attnres_phase2(b->h, b->partial, b->ar_stats, b->ar_acc, w, q, bq->Q, mb->T, c->d, c->rms_eps);
    return b->h;
}

static void attn_norm(st_engine_mb_t *mb, int l, bool push) {
    st_engine_t *e = mb->e;
    const st_config_t *c = &e->c;
    st_bufs_t *b = &MB(mb)->b;
    const st_layer_w_t *L = &e->W.layers[l];
    int T = mb->T, d = c->d;
    ST_ENGINE_TRACE(e, l, ST_TRACE_PARTIAL_IN, b->partial, T, d);
    st_rmsnorm(b->xn, attnres_h(mb, L->attn_res, e->q_attn[l]), L->in_norm, T, d, c->rms_eps);
    ST_ENGINE_TRACE(e, l, ST_TRACE_XN_ATTN, b->xn, T, d);
    if (!push) return;
    memcpy(b->blocks[mb->nb], b->partial, (size_t)T * d * sizeof(float));
    const st_block_q_t *bq = &e->bq[mb->nb];
    st_attnres_phase1(b->ar_stats, b->ar_acc, (const float *const *)b->blocks, mb->nb + 1, bq->w, bq->Q, T, d, c->rms_eps);
}

static void attn_out(st_engine_mb_t *mb, int l, bool push) {
    st_engine_t *e = mb->e;
    st_bufs_t *b = &MB(mb)->b;
    size_t Td = (size_t)mb->T * e->c.d;
    st_linear(b->a, b->o, &e->W.layers[l].o, mb->T, b->lin);
    if (push) memcpy(b->partial, b->a, Td * sizeof(float));
    else for (size_t i = 0; i < Td; i++) b->partial[i] += b->a[i];
    ST_ENGINE_TRACE(e, l, ST_TRACE_PARTIAL_MID, b->partial, mb->T, e->c.d);
}

static void mlp_norm(st_engine_mb_t *mb, int l) {
    st_engine_t *e = mb->e;
    const st_config_t *c = &e->c;
    st_bufs_t *b = &MB(mb)->b;
    const st_layer_w_t *L = &e->W.layers[l];
    st_rmsnorm(b->xn, attnres_h(mb, L->mlp_res, e->q_mlp[l]), L->post_norm, mb->T, c->d, c->rms_eps);
    ST_ENGINE_TRACE(e, l, ST_TRACE_XN_MLP, b->xn, mb->T, c->d);
}

static void dense_ffn(st_engine_mb_t *mb, int l) {
    st_engine_t *e = mb->e;
    const st_config_t *c = &e->c;
    st_bufs_t *b = &MB(mb)->b;
    const st_layer_w_t *L = &e->W.layers[l];
    st_ffn(b->a, b->xn, mb->T, &L->dense.gate, &L->dense.up, &L->dense.down, c->act, c->situ_beta1, c->situ_beta2,
           b->ffn_ws);
    for (size_t i = 0; i < (size_t)mb->T * c->d; i++) b->partial[i] += b->a[i];
}

static void moe_begin_op(st_engine_mb_t *mb, int l, st_moe_work_t *w) {
    moe_begin(mb->e, &mb->e->W.layers[l], l, mb->T, &MB(mb)->b, w);
}

static void moe_finish_op(st_engine_mb_t *mb, int l) {
    st_engine_t *e = mb->e;
    st_bufs_t *b = &MB(mb)->b;
    moe_finish(e, &e->W.layers[l], l, mb->T, b);
    for (size_t i = 0; i < (size_t)mb->T * e->c.d; i++) b->partial[i] += b->a[i];
}

/* The bound routed experts on a work item: (token, slot) pairs grouped by expert (a counting sort
 * keeps tokens ascending within an expert), gathered, one FFN per expert, scattered to w->out. */
static void experts(st_engine_mb_t *mb, const st_moe_work_t *w) {
    st_engine_t *e = mb->e;
    const st_config_t *c = &e->c;
    st_bufs_t *b = &MB(mb)->b;
    const st_layer_w_t *L = &e->W.layers[w->layer];
    int n = c->n_experts, kc = w->kc, ew = w->ew, T = w->T;
    memset(b->grp_off, 0, (size_t)(n + 1) * sizeof(int));
    for (int t = 0; t < T; t++)
        for (int i = 0; i < w->cnt[t]; i++) b->grp_off[w->ids[(size_t)t * kc + i] + 1]++;
    for (int j = 0; j < n; j++) b->grp_off[j + 1] += b->grp_off[j];
    int *fill = b->ids_tmp; /* per-expert write cursor */
    memcpy(fill, b->grp_off, (size_t)n * sizeof(int));
    for (int t = 0; t < T; t++)
        for (int i = 0; i < w->cnt[t]; i++) b->grp_tok[fill[w->ids[(size_t)t * kc + i]]++] = t * kc + i;
    for (int j = 0; j < n; j++) {
        int r0 = b->grp_off[j], cj = b->grp_off[j + 1] - r0;
        if (cj == 0) continue;
        for (int r = 0; r < cj; r++)
            memcpy(b->zin + (size_t)r * ew, w->z + (size_t)(b->grp_tok[r0 + r] / kc) * ew, (size_t)ew * sizeof(float));
        const st_expert_weights_t *x = &L->experts[j];
        float *yo = b->zin + (size_t)cj * ew; /* rows after the gathered input */
        st_ffn(yo, b->zin, cj, &x->gate, &x->up, &x->down, c->act, c->situ_beta1, c->situ_beta2, b->ffn_ws);
        for (int r = 0; r < cj; r++)
            memcpy(w->out + (size_t)b->grp_tok[r0 + r] * ew, yo + (size_t)r * ew, (size_t)ew * sizeof(float));
    }
}

static void launch_end(st_engine_mb_t *mb) {
    ST_ENGINE_TRACE(mb->e, mb->e->c.n_layers, ST_TRACE_PARTIAL_IN, MB(mb)->b.partial, mb->T, mb->e->c.d);
}

/* Output AttnRes, final norm and lm_head over the rows asked for; argmax for greedy entries. */
static void head(st_engine_mb_t *mb) {
    st_engine_t *e = mb->e;
    const st_config_t *c = &e->c;
    st_bufs_t *b = &MB(mb)->b;
    int d = c->d;
    const float *fin = attnres_h(mb, e->W.out_res, e->q_out);
    int rows = 0;
    for (int i = 0; i < mb->n_seqs; i++) {
        int first = mb->seqs[i].all_logits ? 0 : mb->seqs[i].n_tokens - 1;
        for (int t = first; t < mb->seqs[i].n_tokens; t++)
            memcpy(b->final + (size_t)rows++ * d, fin + (size_t)(mb->ents[i].off + t) * d, (size_t)d * sizeof(float));
    }
    st_rmsnorm(b->final, b->final, e->W.final_norm, rows, d, c->rms_eps);
    st_linear(mb->logits, b->final, &e->W.lm_head, rows, b->lin);
    for (int i = 0, r = 0; i < mb->n_seqs; i++) {
        const st_seq_chunk_t *q = &mb->seqs[i];
        r += q->all_logits ? q->n_tokens : 1;
        if (q->argmax && !q->all_logits) *q->argmax = st_argmax(mb->logits + (size_t)(r - 1) * c->vocab, c->vocab);
    }
}

/* The sampling entries (st_seq_chunk_t.sample), each its row of the caller's logits in place. */
static void sample(st_engine_mb_t *mb) {
    st_engine_t *e = mb->e;
    int V = e->c.vocab;
    for (int i = 0, r = 0; i < mb->n_seqs; i++) {
        const st_seq_chunk_t *q = &mb->seqs[i];
        r += q->all_logits ? q->n_tokens : 1;
        const st_sample_params_t *p = q->sample;
        if (!p) continue;
        st_sample_row_t row = {.temperature = p->temperature, .top_p = p->top_p, .presence = p->presence,
                               .frequency = p->frequency, .top_k = p->top_k, .n_top = p->n_top, .n_bias = p->n_bias,
                               .row = r - 1, .count_row = q->slot, .pos = p->pos, .seed = p->seed};
        int id, tid[ST_SAMPLE_MAX_TOP];
        float lp, tlp[ST_SAMPLE_MAX_TOP];
        st_sample_rows(&id, &lp, tid, tlp, mb->logits, 1, V, &row, p->bias_ids, p->bias_values, CPU(e)->counts);
        *q->token = id;
        if (p->n_top < 0) continue;
        *q->logprob = lp;
        int nt = ST_MIN(p->n_top, V);
        memcpy(q->top_ids, tid, (size_t)nt * sizeof(int));
        memcpy(q->top_logprobs, tlp, (size_t)nt * sizeof(float));
    }
}

/* ------------------------------------------------------------------ memory */

static void cpu_free(st_engine_t *e) {
    cpu_t *k = CPU(e);
    if (!k) return;
    free(k->kda_S), free(k->kda_conv), free(k->kv_pool), free(k->seq_pageptr), free(k->counts);
    free(k);
    e->bk = NULL;
}

static st_status_t cpu_init(st_engine_t *e) {
    const st_config_t *c = &e->c;
    cpu_t *k = calloc(1, sizeof *k);
    if (!k) return ST_FAIL(ST_ERR_NO_MEMORY, "cpu backend");
    e->bk = k;
    int M = e->o.max_seqs;
    size_t P = (size_t)c->kda_heads * (size_t)c->kda_head_dim;
    k->S_per = (size_t)c->kda_heads * (size_t)c->kda_head_dim * (size_t)c->kda_head_dim;
    k->conv_per = 3 * (size_t)(c->conv_k - 1) * P;
    k->R = c->kv_lora_rank + c->qk_rope;
    k->kda_S = calloc((size_t)M * (size_t)e->n_kda * k->S_per + 1, sizeof(float));
    k->kda_conv = calloc((size_t)M * (size_t)e->n_kda * k->conv_per + 1, sizeof(float));
    k->kv_pool = malloc((size_t)e->n_pages * (size_t)e->page_size * (size_t)k->R * sizeof(float) + 64);
    k->seq_pageptr = calloc((size_t)M * (size_t)e->n_mla * (size_t)e->pps + 1, sizeof(float *));
    k->counts = calloc((size_t)M * (size_t)c->vocab, sizeof(int));
    if (!k->kda_S || !k->kda_conv || !k->kv_pool || !k->seq_pageptr || !k->counts) {
        cpu_free(e);
        return ST_FAIL(ST_ERR_NO_MEMORY, "engine state pools for %d sequences × %d tokens", M, e->o.max_ctx);
    }
    k->lin_ws = lin_ws_max(&e->W, c);
    st_bufs_t dry;
    size_t need = carve_bufs(e, NULL, &dry);
    st_log_info("engine: %d layers (%d KDA, %d MLA), %d seqs × %d ctx, %d tokens/step, step buffers %.1f MiB, "
                "%d cache pages of %d rows",
                c->n_layers, e->n_kda, e->n_mla, M, e->o.max_ctx, e->o.max_batch_tokens,
                (double)need / (1 << 20), e->n_pages, e->page_size);
    return ST_OK;
}

static st_status_t seq_reset(st_engine_t *e, int i) {
    cpu_t *k = CPU(e);
    memset(k->kda_S + (size_t)i * e->n_kda * k->S_per, 0, (size_t)e->n_kda * k->S_per * sizeof(float));
    memset(k->kda_conv + (size_t)i * e->n_kda * k->conv_per, 0, (size_t)e->n_kda * k->conv_per * sizeof(float));
    memset(k->counts + (size_t)i * e->c.vocab, 0, (size_t)e->c.vocab * sizeof(int));
    return ST_OK;
}

static st_status_t mb_init(st_engine_mb_t *mb) {
    cpu_mb_t *m = calloc(1, sizeof *m);
    if (!m) return ST_FAIL(ST_ERR_NO_MEMORY, "micro-batch");
    st_bufs_t dry;
    st_status_t s = st_arena_init(&m->arena, carve_bufs(mb->e, NULL, &dry));
    if (s != ST_OK) {
        free(m);
        return s;
    }
    carve_bufs(mb->e, m->arena.base, &m->b);
    mb->bk = m;
    return ST_OK;
}

static void mb_free(st_engine_mb_t *mb) {
    cpu_mb_t *m = MB(mb);
    if (!m) return;
    st_arena_cleanup(&m->arena);
    free(m);
}

const st_engine_backend_t st_engine_backend_cpu = {
    .name = "cpu",
    .async = false,
    .keep_weights = true,
    .init = cpu_init,
    .free = cpu_free,
    .mb_init = mb_init,
    .mb_free = mb_free,
    .seq_reset = seq_reset,
    .begin = begin,
    .attn_norm = attn_norm,
    .kda = kda_layer,
    .mla = mla_layer,
    .attn_out = attn_out,
    .mlp_norm = mlp_norm,
    .dense_ffn = dense_ffn,
    .moe_begin = moe_begin_op,
    .experts = experts,
    .moe_finish = moe_finish_op,
    .launch_end = launch_end,
    .head = head,
    .sample = sample,
};
