/* The one-process engine: walks SPEC §2 over a batch of sequences. State pools and step buffers are
 * sized at creation; st_engine_step validates everything first and then cannot fail, so a bad
 * request leaves every sequence untouched. Not the scheduler (see the worker) nor the kernels. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "engine_impl.h"
#ifdef STRATA_WITH_CUDA
#include "engine_gpu.h"
#endif

#define MLA_NORM_EPS 1e-6f /* q_a_layernorm / kv_a_layernorm (checkpoint-layout §5.4) */
#define L2_EPS 1e-6f

typedef struct {
    /* per block b: Q_b AttnRes queries (w_eff rows) that see the completed blocks 0..b */
    int Q;
    float *w; /* [Q, d] */
} st_block_q_t;

struct st_engine {
    struct st_egpu *gpu; /* the GPU engine (opts.device >= 0); everything else unused then */
    st_config_t c;
    const st_ckpt_t *ck;
    st_engine_opts_t o;
    st_engine_w_t W;
    int kcap; /* routing stride per token: max(k, k_max) */
    int n_kda, n_mla, *layer_slot; /* index of a layer among its kind */
    /* AttnRes bookkeeping */
    int n_blocks, Qmax;
    st_block_q_t *bq;
    int *q_attn, *q_mlp, q_out; /* query index of each sublayer within its block set */
    /* sequences */
    bool *seq_used;
    int *seq_len;
    float *kda_S;    /* [max_seqs][n_kda][H*dk*dv] */
    float *kda_conv; /* [max_seqs][n_kda][3][(K-1)*P] */
    size_t S_per, conv_per;
    /* paged MLA latent cache */
    int R, page_size, n_pages, pages_per_seq, n_free;
    float *kv_pool; /* [n_pages][page_size][R] */
    int *free_pages;
    int *seq_npages;     /* [max_seqs][n_mla] */
    float **seq_pageptr; /* [max_seqs][n_mla][pages_per_seq] */
    int *seq_pageid;     /* [max_seqs][n_mla][pages_per_seq] */
    /* routing */
    float *tau; /* [L][n] */
    bool tau_set;
    uint64_t tau_version;
    st_route_hook_t hook;
    void *hook_ctx;
    st_route_observer_t obs;
    void *obs_ctx;
    st_trace_hook_t trace; /* test-only (engine.h) */
    void *trace_ctx;
    /* step */
    struct st_engine_mb *mb; /* the micro-batch st_engine_step uses (local experts only) */
    bool *seq_busy;          /* slot is in a micro-batch in flight */
    size_t lin_ws;
    st_engine_stats_t stats;
};

/* ------------------------------------------------------------------ sizing helpers */

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
    float *lin;
} st_bufs_t;

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
    CF(lin, e->lin_ws);
#undef CF
#undef CI
    return off + 64;
}

/* ------------------------------------------------------------------ create / destroy */

void st_engine_opts_default(st_engine_opts_t *o) {
    memset(o, 0, sizeof *o);
    o->max_seqs = 8;
    o->max_batch_tokens = 512;
    o->max_ctx = 2048;
    o->kv_page_size = 64;
    o->routing = ST_ROUTE_TOPK;
    o->device = -1;
}

static st_status_t build_attnres_queries(st_engine_t *e) {
    const st_config_t *c = &e->c;
    int B = c->attn_res_block, L = c->n_layers;
    e->q_attn = calloc((size_t)L, sizeof(int));
    e->q_mlp = calloc((size_t)L, sizeof(int));
    if (!e->q_attn || !e->q_mlp) return ST_FAIL(ST_ERR_NO_MEMORY, "attnres tables");
    if (B <= 0) return ST_OK;
    e->n_blocks = (L + B - 1) / B;
    e->bq = calloc((size_t)e->n_blocks, sizeof(st_block_q_t));
    if (!e->bq) return ST_FAIL(ST_ERR_NO_MEMORY, "attnres tables");
    for (int b = 0; b < e->n_blocks; b++) {
        int l0 = b * B, l1 = ST_MIN(l0 + B, L);
        /* queries that see blocks 0..b: mlp side of l0..l1-1, attention side of l0+1..l1-1, and
         * the attention side of l1 (before its push) or the output when this block is last */
        int Q = 2 * (l1 - l0);
        st_block_q_t *bq = &e->bq[b];
        bq->Q = Q;
        bq->w = malloc((size_t)Q * (size_t)c->d * sizeof(float));
        if (!bq->w) return ST_FAIL(ST_ERR_NO_MEMORY, "attnres queries");
        int q = 0;
        for (int l = l0; l < l1; l++) {
            if (l > l0) {
                e->q_attn[l] = q;
                memcpy(bq->w + (size_t)q++ * c->d, e->W.layers[l].attn_res, (size_t)c->d * sizeof(float));
            }
            e->q_mlp[l] = q;
            memcpy(bq->w + (size_t)q++ * c->d, e->W.layers[l].mlp_res, (size_t)c->d * sizeof(float));
        }
        const float *last = l1 < L ? e->W.layers[l1].attn_res : e->W.out_res;
        if (l1 < L) e->q_attn[l1] = q;
        else e->q_out = q;
        memcpy(bq->w + (size_t)q++ * c->d, last, (size_t)c->d * sizeof(float));
        if (Q > e->Qmax) e->Qmax = Q;
    }
    return ST_OK;
}

st_status_t st_engine_create(st_engine_t **out, const st_ckpt_t *ck, const st_engine_opts_t *opts) {
    st_status_t s;
    st_engine_t *e = calloc(1, sizeof *e);
    if (!e) return ST_FAIL(ST_ERR_NO_MEMORY, "engine");
    if (opts->device >= 0) {
#ifdef STRATA_WITH_CUDA
        e->c = *st_ckpt_config(ck);
        e->o = *opts;
        s = st_egpu_create(&e->gpu, ck, opts);
        if (s != ST_OK) { free(e); return s; }
        *out = e;
        return ST_OK;
#else
        free(e);
        return ST_FAIL(ST_ERR_INVALID_ARG, "engine: device cuda:%d asked for, but Strata was built without CUDA", opts->device);
#endif
    }
    e->c = *st_ckpt_config(ck);
    e->ck = ck;
    e->o = *opts;
    const st_config_t *c = &e->c;
    if (e->o.kv_page_size <= 0) e->o.kv_page_size = 64;
    if (e->o.max_seqs <= 0 || e->o.max_batch_tokens <= 0 || e->o.max_ctx <= 0) {
        s = ST_FAIL(ST_ERR_INVALID_ARG, "engine: max_seqs, max_batch_tokens and max_ctx must be positive");
        goto err_free;
    }
    if (c->kda_heads > 0 && c->kda_head_dim <= 0) {
        s = ST_FAIL(ST_ERR_CONFIG, "engine: KDA head_dim must be positive");
        goto err_free;
    }
    int kmax = e->o.k_max > 0 ? e->o.k_max : 2 * c->top_k;
    e->o.k_max = ST_MIN(kmax, ST_MAX(c->n_experts, 1));
    e->kcap = ST_MAX(c->top_k, e->o.routing == ST_ROUTE_QUANTILE ? e->o.k_max : 0);
    if (e->kcap <= 0) e->kcap = 1;
    s = st_engine_bind(&e->W, ck, !e->o.remote_experts);
    if (s != ST_OK) goto err_unbind;
    e->layer_slot = calloc((size_t)c->n_layers, sizeof(int));
    if (!e->layer_slot) { s = ST_FAIL(ST_ERR_NO_MEMORY, "engine tables"); goto err_unbind; }
    for (int l = 0; l < c->n_layers; l++) e->layer_slot[l] = c->is_mla[l] ? e->n_mla++ : e->n_kda++;
    s = build_attnres_queries(e);
    if (s != ST_OK) goto err_tables;

    /* sequence state pools */
    int M = e->o.max_seqs, H = c->kda_heads, dk = c->kda_head_dim;
    size_t P = (size_t)H * (size_t)dk;
    e->S_per = (size_t)H * (size_t)dk * (size_t)dk;
    e->conv_per = 3 * (size_t)(c->conv_k - 1) * P;
    e->seq_used = calloc((size_t)M, sizeof(bool));
    e->seq_len = calloc((size_t)M, sizeof(int));
    e->kda_S = calloc((size_t)M * (size_t)e->n_kda * e->S_per + 1, sizeof(float));
    e->kda_conv = calloc((size_t)M * (size_t)e->n_kda * e->conv_per + 1, sizeof(float));
    e->R = c->kv_lora_rank + c->qk_rope;
    e->page_size = e->o.kv_page_size;
    e->pages_per_seq = (e->o.max_ctx + e->page_size - 1) / e->page_size;
    e->n_pages = e->o.kv_pages > 0 ? e->o.kv_pages : M * e->n_mla * e->pages_per_seq;
    e->kv_pool = malloc((size_t)e->n_pages * (size_t)e->page_size * (size_t)e->R * sizeof(float) + 64);
    e->free_pages = malloc((size_t)e->n_pages * sizeof(int) + 4);
    size_t npt = (size_t)M * (size_t)e->n_mla * (size_t)e->pages_per_seq + 1;
    e->seq_npages = calloc((size_t)M * (size_t)e->n_mla + 1, sizeof(int));
    e->seq_pageptr = calloc(npt, sizeof(float *));
    e->seq_pageid = calloc(npt, sizeof(int));
    e->tau = calloc((size_t)c->n_layers * (size_t)ST_MAX(c->n_experts, 1), sizeof(float));
    if (!e->seq_used || !e->seq_len || !e->kda_S || !e->kda_conv || !e->kv_pool || !e->free_pages ||
        !e->seq_npages || !e->seq_pageptr || !e->seq_pageid || !e->tau) {
        s = ST_FAIL(ST_ERR_NO_MEMORY, "engine state pools for %d sequences × %d tokens", M, e->o.max_ctx);
        goto err_pools;
    }
    for (int i = 0; i < e->n_pages; i++) e->free_pages[i] = e->n_pages - 1 - i;
    e->n_free = e->n_pages;

    e->seq_busy = calloc((size_t)M, sizeof(bool));
    if (!e->seq_busy) { s = ST_FAIL(ST_ERR_NO_MEMORY, "engine tables"); goto err_pools; }
    e->lin_ws = lin_ws_max(&e->W, c);
    st_bufs_t dry;
    size_t need = carve_bufs(e, NULL, &dry);
    if (!e->o.remote_experts) {
        s = st_engine_mb_create(e, &e->mb);
        if (s != ST_OK) goto err_pools;
    }
    st_log_info("engine: %d layers (%d KDA, %d MLA), %d seqs × %d ctx, %d tokens/step, step buffers %.1f MiB, "
                "%d cache pages of %d rows",
                c->n_layers, e->n_kda, e->n_mla, M, e->o.max_ctx, e->o.max_batch_tokens,
                (double)need / (1 << 20), e->n_pages, e->page_size);
    *out = e;
    return ST_OK;

err_pools:
    free(e->seq_busy);
    free(e->seq_used); free(e->seq_len); free(e->kda_S); free(e->kda_conv); free(e->kv_pool);
    free(e->free_pages); free(e->seq_npages); free(e->seq_pageptr); free(e->seq_pageid); free(e->tau);
err_tables:
    if (e->bq)
        for (int b = 0; b < e->n_blocks; b++) free(e->bq[b].w);
    free(e->bq); free(e->q_attn); free(e->q_mlp); free(e->layer_slot);
err_unbind:
    st_engine_unbind(&e->W);
err_free:
    free(e);
    return s;
}

void st_engine_destroy(st_engine_t *e) {
    if (!e) return;
#ifdef STRATA_WITH_CUDA
    if (e->gpu) { st_egpu_destroy(e->gpu); free(e); return; }
#endif
    st_engine_mb_destroy(e->mb);
    free(e->seq_busy);
    free(e->seq_used); free(e->seq_len); free(e->kda_S); free(e->kda_conv); free(e->kv_pool);
    free(e->free_pages); free(e->seq_npages); free(e->seq_pageptr); free(e->seq_pageid); free(e->tau);
    if (e->bq)
        for (int b = 0; b < e->n_blocks; b++) free(e->bq[b].w);
    free(e->bq); free(e->q_attn); free(e->q_mlp); free(e->layer_slot);
    st_engine_unbind(&e->W);
    free(e);
}

const st_config_t *st_engine_config(const st_engine_t *e) { return &e->c; }

/* ------------------------------------------------------------------ sequences */

st_status_t st_engine_seq_open(st_engine_t *e, int *slot) {
#ifdef STRATA_WITH_CUDA
    if (e->gpu) return st_egpu_seq_open(e->gpu, slot);
#endif
    for (int i = 0; i < e->o.max_seqs; i++) {
        if (e->seq_used[i]) continue;
        e->seq_used[i] = true;
        e->seq_len[i] = 0;
        memset(e->kda_S + (size_t)i * e->n_kda * e->S_per, 0, (size_t)e->n_kda * e->S_per * sizeof(float));
        memset(e->kda_conv + (size_t)i * e->n_kda * e->conv_per, 0, (size_t)e->n_kda * e->conv_per * sizeof(float));
        *slot = i;
        return ST_OK;
    }
    return ST_FAIL(ST_ERR_CAPACITY, "all %d sequence slots are in use", e->o.max_seqs);
}

void st_engine_seq_close(st_engine_t *e, int slot) {
#ifdef STRATA_WITH_CUDA
    if (e->gpu) { st_egpu_seq_close(e->gpu, slot); return; }
#endif
    if (slot < 0 || slot >= e->o.max_seqs || !e->seq_used[slot]) return;
    if (e->seq_busy[slot]) { /* our own invariant: the scheduler closes sequences between steps */
        st_log_error("engine: slot %d closed while its micro-batch is in flight; ignored", slot);
        return;
    }
    for (int m = 0; m < e->n_mla; m++) {
        int *np = &e->seq_npages[slot * e->n_mla + m];
        int *ids = &e->seq_pageid[((size_t)slot * e->n_mla + m) * e->pages_per_seq];
        for (int p = 0; p < *np; p++) e->free_pages[e->n_free++] = ids[p];
        *np = 0;
    }
    e->seq_used[slot] = false;
    e->seq_len[slot] = 0;
}

int st_engine_seq_len(const st_engine_t *e, int slot) {
#ifdef STRATA_WITH_CUDA
    if (e->gpu) return st_egpu_seq_len(e->gpu, slot);
#endif
    return (slot >= 0 && slot < e->o.max_seqs && e->seq_used[slot]) ? e->seq_len[slot] : -1;
}

void st_engine_set_thresholds(st_engine_t *e, const float *tau, uint64_t version) {
#ifdef STRATA_WITH_CUDA
    if (e->gpu) { st_egpu_set_thresholds(e->gpu, tau, version); return; }
#endif
    if (!tau) {
        e->tau_set = false;
        return;
    }
    memcpy(e->tau, tau, (size_t)e->c.n_layers * (size_t)e->c.n_experts * sizeof(float));
    e->tau_set = true;
    e->tau_version = version;
}

void st_engine_set_trace_hook(st_engine_t *e, st_trace_hook_t fn, void *ctx) {
#ifdef STRATA_WITH_CUDA
    if (e->gpu) { st_egpu_set_trace_hook(e->gpu, fn, ctx); return; }
#endif
    e->trace = fn;
    e->trace_ctx = ctx;
}

#define TRACE(l, pt, x, T, w) \
    do { if (e->trace) e->trace(e->trace_ctx, (l), (pt), (T), (w), (x)); } while (0)

void st_engine_set_route_hook(st_engine_t *e, st_route_hook_t fn, void *ctx) {
#ifdef STRATA_WITH_CUDA
    if (e->gpu) { st_egpu_set_route_hook(e->gpu, fn, ctx); return; }
#endif
    e->hook = fn;
    e->hook_ctx = ctx;
}

void st_engine_set_route_observer(st_engine_t *e, st_route_observer_t fn, void *ctx) {
#ifdef STRATA_WITH_CUDA
    if (e->gpu) { st_egpu_set_route_observer(e->gpu, fn, ctx); return; }
#endif
    e->obs = fn;
    e->obs_ctx = ctx;
}

/* ------------------------------------------------------------------ layers */

typedef struct {
    int slot, n, off; /* sequence slot, new tokens, first row in the step */
    int pos0;         /* tokens before this step */
} st_ent_t;

static void kda_layer(st_engine_t *e, const st_layer_w_t *L, int l, const st_ent_t *ents, int ne,
                      int T, st_bufs_t *b) {
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
        float *conv = e->kda_conv + ((size_t)en->slot * e->n_kda + ks) * e->conv_per;
        size_t cs = (size_t)(K - 1) * P;
        st_conv_silu(b->qc + r * P, b->q + r * P, conv, L->conv_q, en->n, P, K);
        st_conv_silu(b->kc + r * P, b->k + r * P, conv + cs, L->conv_k, en->n, P, K);
        st_conv_silu(b->vc + r * P, b->v + r * P, conv + 2 * cs, L->conv_v, en->n, H * dv, K);
        st_l2norm_heads(b->qc + r * P, en->n, H, dk, L2_EPS);
        st_l2norm_heads(b->kc + r * P, en->n, H, dk, L2_EPS);
        float *S = e->kda_S + ((size_t)en->slot * e->n_kda + ks) * e->S_per;
        /* NOTE: decode runs the recurrence itself (SPEC §3.2); prompts run the chunked form */
        if (en->n == 1)
            st_kda_recurrent(b->o + r * P, b->qc + r * P, b->kc + r * P, b->vc + r * P, b->g + r * P,
                             b->beta + r * H, S, en->n, H, dk, dv, scale);
        else
            st_kda_chunked(b->o + r * P, b->qc + r * P, b->kc + r * P, b->vc + r * P, b->g + r * P,
                           b->beta + r * H, S, en->n, H, dk, dv, scale, dense_diag, b->kda_ws);
    }
    TRACE(l, ST_TRACE_KDA_Q, b->qc, T, P);
    TRACE(l, ST_TRACE_KDA_K, b->kc, T, P);
    TRACE(l, ST_TRACE_KDA_V, b->vc, T, H * dv);
    TRACE(l, ST_TRACE_KDA_G, b->g, T, P);
    TRACE(l, ST_TRACE_KDA_O, b->o, T, H * dv);
    if (c->full_rank_gate) {
        st_linear(b->gate, b->xn, &L->g, T, b->lin);
    } else {
        st_linear(b->ga, b->xn, &L->g_a, T, b->lin);
        st_linear(b->gate, b->ga, &L->g, T, b->lin);
    }
    st_kda_out_gate(b->o, b->gate, L->o_norm, T, H, dv, c->rms_eps);
    TRACE(l, ST_TRACE_ATTN_O, b->o, T, H * dv);
    st_linear(b->a, b->o, &L->o, T, b->lin);
}

static st_kv_view_t kv_view(st_engine_t *e, int slot, int m, int n) {
    st_kv_view_t kv = {
        .pages = e->seq_pageptr + ((size_t)slot * e->n_mla + m) * e->pages_per_seq,
        .page_size = e->page_size,
        .R = e->R,
        .n = n,
    };
    return kv;
}

static void mla_layer(st_engine_t *e, const st_layer_w_t *L, int l, const st_ent_t *ents, int ne,
                      int T, st_bufs_t *b) {
    const st_config_t *c = &e->c;
    int H = c->mla_heads, nope = c->qk_nope, rope = c->qk_rope, dqk = nope + rope, dv = c->v_head_dim;
    int kvr = c->kv_lora_rank, R = e->R, kvw = nope + dv;
    if (c->q_lora_rank > 0) {
        st_linear(b->cq, b->xn, &L->q_a, T, b->lin);
        st_rmsnorm(b->cq, b->cq, L->q_a_norm, T, c->q_lora_rank, MLA_NORM_EPS);
        st_linear(b->q, b->cq, &L->q, T, b->lin);
    } else {
        st_linear(b->q, b->xn, &L->q, T, b->lin);
    }
    TRACE(l, ST_TRACE_MLA_Q, b->q, T, H * dqk);
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
    TRACE(l, ST_TRACE_ATTN_O, b->o, T, H * dv);
    st_linear(b->a, b->o, &L->o, T, b->lin);
}

static void route(st_engine_t *e, const st_layer_w_t *L, int l, int T, st_bufs_t *b) {
    const st_config_t *c = &e->c;
    int n = c->n_experts, k = c->top_k, kc = e->kcap;
    st_linear(b->scores, b->xn, &L->router, T, b->lin);
    st_router_sigmoid(b->scores, T, n);
    /* NOTE: a layer whose thresholds are unset (NaN) routes top-k until the coordinator has data */
    if (e->o.routing == ST_ROUTE_QUANTILE && e->tau_set && !isnan(e->tau[(size_t)l * n])) {
        st_route_quantile(b->ids, b->wts, b->cnt, b->scores, e->tau + (size_t)l * n, T, n, e->o.k_max,
                          c->renormalize, c->routed_scale);
        if (e->o.k_max != kc) /* restride [T, k_max] → [T, kc] */
            for (int t = T - 1; t >= 0; t--)
                memmove(b->ids + (size_t)t * kc, b->ids + (size_t)t * e->o.k_max, (size_t)e->o.k_max * sizeof(int));
    } else {
        st_route_topk(b->ids_tmp, b->wts, b->scores, L->router_bias, T, n, k, c->renormalize, c->routed_scale);
        for (int t = 0; t < T; t++) {
            memcpy(b->ids + (size_t)t * kc, b->ids_tmp + (size_t)t * k, (size_t)k * sizeof(int));
            b->cnt[t] = k;
        }
    }
    if (e->hook) e->hook(e->hook_ctx, l, T, n, b->scores, b->ids, b->cnt, kc);
    if (e->obs) e->obs(e->obs_ctx, l, T, n, b->scores, b->ids, b->cnt, kc);
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

/* Latent inputs and the work item of one MoE layer (before the experts run). */
static void moe_begin(st_engine_t *e, const st_layer_w_t *L, int l, int T, st_bufs_t *b, st_moe_work_t *w) {
    const st_config_t *c = &e->c;
    route(e, L, l, T, b);
    const float *z = b->xn;
    if (c->latent > 0) {
        st_linear(b->z, b->xn, &L->lat_down, T, b->lin);
        z = b->z;
    }
    TRACE(l, ST_TRACE_MOE_Z, (float *)z, T, st_config_expert_width(c));
    *w = (st_moe_work_t){.layer = l, .T = T, .kc = e->kcap, .ew = st_config_expert_width(c), .z = z,
                         .ids = b->ids, .cnt = b->cnt, .tok_ent = b->tok_ent, .out = b->eout};
}

/* Combine in latent width (ascending expert id), norm, up-projection, shared experts → b->a. */
static void moe_finish(st_engine_t *e, const st_layer_w_t *L, int l, int T, st_bufs_t *b) {
    const st_config_t *c = &e->c;
    int kc = e->kcap, ew = st_config_expert_width(c), d = c->d;
    for (int t = 0; t < T; t++) {
        float *u = b->u + (size_t)t * ew;
        memset(u, 0, (size_t)ew * sizeof(float));
        for (int i = 0; i < b->cnt[t]; i++) {
            float p = b->wts[(size_t)t * kc + i];
            const float *y = b->eout + ((size_t)t * kc + i) * ew;
            for (int q = 0; q < ew; q++) u[q] += p * y[q];
        }
    }
    if (c->latent > 0) {
        if (L->lat_norm) st_rmsnorm(b->u, b->u, L->lat_norm, T, ew, c->rms_eps);
        TRACE(l, ST_TRACE_MOE_U, b->u, T, ew);
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

/* ------------------------------------------------------------------ micro-batches */

struct st_engine_mb {
    st_engine_t *e;
    struct st_egpu_mb *gpu; /* the GPU engine's micro-batch (e->gpu set) */
    st_arena_t arena;
    st_bufs_t b;
    st_ent_t *ents;
    const st_seq_chunk_t *seqs;
    int n_seqs, T;
    float *logits;
    int l, nb;          /* next layer; completed AttnRes blocks */
    bool waiting, busy; /* waiting: experts of layer l outstanding */
};

st_status_t st_engine_mb_create(st_engine_t *e, st_engine_mb_t **out) {
#ifdef STRATA_WITH_CUDA
    if (e->gpu) {
        st_engine_mb_t *g = calloc(1, sizeof *g);
        if (!g) return ST_FAIL(ST_ERR_NO_MEMORY, "micro-batch");
        g->e = e;
        st_status_t sg = st_egpu_mb_create(e->gpu, &g->gpu);
        if (sg != ST_OK) { free(g); return sg; }
        *out = g;
        return ST_OK;
    }
#endif
    st_engine_mb_t *mb = calloc(1, sizeof *mb);
    if (!mb) return ST_FAIL(ST_ERR_NO_MEMORY, "micro-batch");
    mb->e = e;
    mb->ents = calloc((size_t)e->o.max_seqs, sizeof(st_ent_t));
    st_bufs_t dry;
    st_status_t s = mb->ents ? st_arena_init(&mb->arena, carve_bufs(e, NULL, &dry))
                             : ST_FAIL(ST_ERR_NO_MEMORY, "micro-batch entries");
    if (s != ST_OK) {
        free(mb->ents);
        free(mb);
        return s;
    }
    carve_bufs(e, mb->arena.base, &mb->b);
    *out = mb;
    return ST_OK;
}

void st_engine_mb_destroy(st_engine_mb_t *mb) {
    if (!mb) return;
#ifdef STRATA_WITH_CUDA
    if (mb->gpu) { st_egpu_mb_destroy(mb->gpu); free(mb); return; }
#endif
    st_arena_cleanup(&mb->arena);
    free(mb->ents);
    free(mb);
}

static st_status_t validate(st_engine_t *e, const st_seq_chunk_t *seqs, int n_seqs, st_ent_t *ents, int *T_out) {
    const st_config_t *c = &e->c;
    if (n_seqs <= 0 || n_seqs > e->o.max_seqs)
        return ST_FAIL(ST_ERR_INVALID_ARG, "step: %d sequences (1..%d allowed)", n_seqs, e->o.max_seqs);
    int T = 0, pages = 0;
    for (int i = 0; i < n_seqs; i++) {
        const st_seq_chunk_t *s = &seqs[i];
        if (s->slot < 0 || s->slot >= e->o.max_seqs || !e->seq_used[s->slot])
            return ST_FAIL(ST_ERR_INVALID_ARG, "step: sequence slot %d is not open", s->slot);
        if (e->seq_busy[s->slot]) return ST_FAIL(ST_ERR_INVALID_ARG, "step: slot %d is already in a micro-batch", s->slot);
        for (int j = 0; j < i; j++)
            if (seqs[j].slot == s->slot) return ST_FAIL(ST_ERR_INVALID_ARG, "step: slot %d given twice", s->slot);
        if (s->n_tokens <= 0 || !s->tokens)
            return ST_FAIL(ST_ERR_INVALID_ARG, "step: slot %d has no tokens", s->slot);
        for (int t = 0; t < s->n_tokens; t++)
            if (s->tokens[t] < 0 || s->tokens[t] >= c->vocab)
                return ST_FAIL(ST_ERR_OUT_OF_RANGE, "step: token id %d outside vocabulary 0..%d", s->tokens[t], c->vocab - 1);
        int len = e->seq_len[s->slot];
        if (len + s->n_tokens > e->o.max_ctx)
            return ST_FAIL(ST_ERR_CAPACITY, "step: sequence would reach %d tokens, limit %d", len + s->n_tokens, e->o.max_ctx);
        int have = (len + e->page_size - 1) / e->page_size;
        int want = (len + s->n_tokens + e->page_size - 1) / e->page_size;
        pages += (want - have) * e->n_mla;
        ents[i] = (st_ent_t){.slot = s->slot, .n = s->n_tokens, .off = T, .pos0 = len};
        T += s->n_tokens;
    }
    if (T > e->o.max_batch_tokens)
        return ST_FAIL(ST_ERR_CAPACITY, "step: %d tokens exceed the %d-token step budget", T, e->o.max_batch_tokens);
    if (pages > e->n_free)
        return ST_FAIL(ST_ERR_CAPACITY, "step: latent cache full (%d pages needed, %d free)", pages, e->n_free);
    *T_out = T;
    return ST_OK;
}

static void grow_pages(st_engine_t *e, const st_ent_t *en) {
    int want = (en->pos0 + en->n + e->page_size - 1) / e->page_size;
    for (int m = 0; m < e->n_mla; m++) {
        int *np = &e->seq_npages[en->slot * e->n_mla + m];
        size_t base = ((size_t)en->slot * e->n_mla + m) * e->pages_per_seq;
        while (*np < want) {
            int p = e->free_pages[--e->n_free];
            e->seq_pageid[base + *np] = p;
            e->seq_pageptr[base + *np] = e->kv_pool + (size_t)p * e->page_size * e->R;
            (*np)++;
        }
    }
}

st_status_t st_engine_mb_begin(st_engine_mb_t *mb, const st_seq_chunk_t *seqs, int n_seqs, float *logits) {
#ifdef STRATA_WITH_CUDA
    if (mb->gpu) return st_egpu_mb_begin(mb->gpu, seqs, n_seqs, logits);
#endif
    st_engine_t *e = mb->e;
    if (mb->busy) return ST_FAIL(ST_ERR_INVALID_ARG, "micro-batch is still in flight");
    int T = 0;
    st_status_t s = validate(e, seqs, n_seqs, mb->ents, &T);
    if (s != ST_OK) return s;
    for (int i = 0; i < n_seqs; i++) {
        grow_pages(e, &mb->ents[i]);
        e->seq_busy[seqs[i].slot] = true;
    }
    mb->seqs = seqs;
    mb->n_seqs = n_seqs;
    mb->T = T;
    mb->logits = logits;
    mb->l = 0;
    mb->nb = 0;
    mb->waiting = false;
    mb->busy = true;
    st_bufs_t *b = &mb->b;
    int d = e->c.d;
    for (int i = 0; i < n_seqs; i++)
        for (int t = 0; t < seqs[i].n_tokens; t++) {
            int r = mb->ents[i].off + t;
            b->tok_ent[r] = i;
            st_weight_rows_f32(&e->W.embed, seqs[i].tokens[t], 1, b->partial + (size_t)r * d);
        }
    return ST_OK;
}

static void finish_step(st_engine_mb_t *mb) {
    st_engine_t *e = mb->e;
    const st_config_t *c = &e->c;
    st_bufs_t *b = &mb->b;
    int d = c->d, T = mb->T;
    const float *fin = b->partial;
    if (c->attn_res_block > 0) {
        st_block_q_t *bq = &e->bq[mb->nb - 1];
        st_attnres_phase2(b->h, b->partial, b->ar_stats, b->ar_acc, e->W.out_res, e->q_out, bq->Q, T, d, c->rms_eps);
        fin = b->h;
    }
    /* logits only for the rows asked for */
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
    for (int i = 0; i < mb->n_seqs; i++) {
        e->seq_len[mb->ents[i].slot] += mb->ents[i].n;
        e->seq_busy[mb->ents[i].slot] = false;
    }
    e->stats.steps++;
    e->stats.tokens += (uint64_t)T;
    mb->busy = false;
}

static int advance_cpu(st_engine_mb_t *mb, st_moe_work_t *work);

bool st_engine_async(const st_engine_t *e) {
#ifdef STRATA_WITH_CUDA
    return e->gpu != NULL;
#else
    (void)e;
    return false;
#endif
}

void st_engine_mb_launch(st_engine_mb_t *mb) {
#ifdef STRATA_WITH_CUDA
    if (mb->gpu) st_egpu_mb_launch(mb->gpu);
#else
    (void)mb;
#endif
}

bool st_engine_mb_ready(st_engine_mb_t *mb) {
#ifdef STRATA_WITH_CUDA
    if (mb->gpu) return st_egpu_mb_ready(mb->gpu);
#endif
    (void)mb;
    return true;
}

int st_engine_mb_collect(st_engine_mb_t *mb, st_moe_work_t *work) {
#ifdef STRATA_WITH_CUDA
    if (mb->gpu) return st_egpu_mb_collect(mb->gpu, work);
#endif
    return advance_cpu(mb, work);
}

int st_engine_mb_advance(st_engine_mb_t *mb, st_moe_work_t *work) {
    st_engine_mb_launch(mb);
    return st_engine_mb_collect(mb, work);
}

static int advance_cpu(st_engine_mb_t *mb, st_moe_work_t *work) {
    st_engine_t *e = mb->e;
    const st_config_t *c = &e->c;
    st_bufs_t *b = &mb->b;
    int d = c->d, B = c->attn_res_block, T = mb->T;
    size_t Td = (size_t)T * d;
    double t0 = st_time_sec();
    if (mb->waiting) { /* the experts of layer l are back */
        moe_finish(e, &e->W.layers[mb->l], mb->l, T, b);
        for (size_t i = 0; i < Td; i++) b->partial[i] += b->a[i];
        mb->waiting = false;
        mb->l++;
        double t1 = st_time_sec();
        e->stats.combine += t1 - t0;
        t0 = t1;
    }
    for (; mb->l < c->n_layers; mb->l++) {
        int l = mb->l;
        const st_layer_w_t *L = &e->W.layers[l];
        TRACE(l, ST_TRACE_PARTIAL_IN, b->partial, T, d);
        /* attention side */
        const float *h = b->partial;
        if (B > 0 && mb->nb > 0) {
            st_block_q_t *bq = &e->bq[mb->nb - 1];
            st_attnres_phase2(b->h, b->partial, b->ar_stats, b->ar_acc, L->attn_res, e->q_attn[l], bq->Q, T, d, c->rms_eps);
            h = b->h;
        }
        st_rmsnorm(b->xn, h, L->in_norm, T, d, c->rms_eps);
        TRACE(l, ST_TRACE_XN_ATTN, b->xn, T, d);
        bool pushed = B > 0 && l % B == 0;
        if (pushed) {
            memcpy(b->blocks[mb->nb++], b->partial, Td * sizeof(float));
            st_block_q_t *bq = &e->bq[mb->nb - 1];
            st_attnres_phase1(b->ar_stats, b->ar_acc, (const float *const *)b->blocks, mb->nb, bq->w, bq->Q, T, d, c->rms_eps);
        }
        if (c->is_mla[l]) mla_layer(e, L, l, mb->ents, mb->n_seqs, T, b);
        else kda_layer(e, L, l, mb->ents, mb->n_seqs, T, b);
        if (pushed) memcpy(b->partial, b->a, Td * sizeof(float));
        else for (size_t i = 0; i < Td; i++) b->partial[i] += b->a[i];
        TRACE(l, ST_TRACE_PARTIAL_MID, b->partial, T, d);
        /* MLP side */
        h = b->partial;
        if (B > 0) {
            st_block_q_t *bq = &e->bq[mb->nb - 1];
            st_attnres_phase2(b->h, b->partial, b->ar_stats, b->ar_acc, L->mlp_res, e->q_mlp[l], bq->Q, T, d, c->rms_eps);
            h = b->h;
        }
        st_rmsnorm(b->xn, h, L->post_norm, T, d, c->rms_eps);
        TRACE(l, ST_TRACE_XN_MLP, b->xn, T, d);
        double t1 = st_time_sec();
        e->stats.attention += t1 - t0;
        t0 = t1;
        if (st_config_is_moe_layer(c, l)) {
            moe_begin(e, L, l, T, b, work);
            e->stats.route += st_time_sec() - t0;
            mb->waiting = true;
            return 1;
        }
        st_ffn(b->a, b->xn, T, &L->dense.gate, &L->dense.up, &L->dense.down, c->act, c->situ_beta1, c->situ_beta2,
               b->ffn_ws);
        for (size_t i = 0; i < Td; i++) b->partial[i] += b->a[i];
        t1 = st_time_sec();
        e->stats.attention += t1 - t0;
        t0 = t1;
    }
    TRACE(c->n_layers, ST_TRACE_PARTIAL_IN, b->partial, T, d);
    finish_step(mb);
    e->stats.head += st_time_sec() - t0;
    return 0;
}

void st_engine_mb_run_local(st_engine_mb_t *mb, const st_moe_work_t *w) {
#ifdef STRATA_WITH_CUDA
    if (mb->gpu) { st_egpu_mb_run_local(mb->gpu, w); return; }
#endif
    st_engine_t *e = mb->e;
    const st_config_t *c = &e->c;
    st_bufs_t *b = &mb->b;
    const st_layer_w_t *L = &e->W.layers[w->layer];
    int n = c->n_experts, kc = w->kc, ew = w->ew, T = w->T;
    double t0 = st_time_sec();
    /* group (token, slot) pairs by expert: a counting sort keeps tokens ascending within an expert */
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
    e->stats.experts += st_time_sec() - t0;
}

st_status_t st_engine_step(st_engine_t *e, const st_seq_chunk_t *seqs, int n_seqs, float *logits) {
#ifdef STRATA_WITH_CUDA
    if (e->gpu) return st_egpu_step(e->gpu, seqs, n_seqs, logits);
#endif
    if (!e->mb) return ST_FAIL(ST_ERR_INVALID_ARG, "engine: st_engine_step needs local experts");
    st_status_t s = st_engine_mb_begin(e->mb, seqs, n_seqs, logits);
    if (s != ST_OK) return s;
    st_moe_work_t w;
    while (st_engine_mb_advance(e->mb, &w)) st_engine_mb_run_local(e->mb, &w);
    return ST_OK;
}

void st_engine_get_stats(const st_engine_t *e, st_engine_stats_t *out) {
#ifdef STRATA_WITH_CUDA
    if (e->gpu) { st_egpu_get_stats(e->gpu, out); return; }
#endif
    *out = e->stats;
}
