/* The engine's frontend: one copy of the bookkeeping of SPEC §2–9 over batches of sequences —
 * sequence slots, state-pool slots, the paged MLA cache's page tables, step validation, the layer
 * walk of micro-batches (begin / launch / collect / advance), routing (thresholds, hook, observer)
 * and stats. The compute and the memory belong to a backend (engine_impl.h: st_engine_backend_t):
 * backend_cpu.c, or backend_cuda.c on a GPU. A step validates everything first and then cannot
 * fail, so a bad request leaves every sequence untouched. Not the scheduler (see the worker). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine_impl.h"
#ifdef STRATA_WITH_CUDA
#include "strata/gpu.h"
#endif

/* ------------------------------------------------------------------ create / destroy */

void st_engine_opts_default(st_engine_opts_t *o) {
    memset(o, 0, sizeof *o);
    o->max_seqs = 8;
    o->max_batch_tokens = 512;
    o->max_ctx = 2048;
    o->kv_page_size = 64;
    o->routing = ST_ROUTE_TOPK;
    o->device = -1;
    o->cuda_graphs = st_tun_int(ST_TUN_CUDA_GRAPHS) != 0; /* defaults live in the configuration table */
    o->host_route = st_tun_int(ST_TUN_HOST_ROUTE) != 0;
}

static st_status_t mb_create(st_engine_t *e, st_engine_mb_t **out, bool internal);

/* The backend registry: the CPU always, the CUDA backend when built with it. */
static st_status_t pick_backend(const st_engine_opts_t *o, const st_engine_backend_t **out) {
    if (o->device < 0) {
        *out = &st_engine_backend_cpu;
        return ST_OK;
    }
#ifdef STRATA_WITH_CUDA
    *out = &st_engine_backend_cuda;
    return ST_OK;
#else
    return ST_FAIL(ST_ERR_INVALID_ARG, "engine: device cuda:%d asked for, but Strata was built without CUDA", o->device);
#endif
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

/* Slot and page tables (the backend sizes its pools from them). */
static st_status_t alloc_tables(st_engine_t *e) {
    const st_config_t *c = &e->c;
    int M = e->o.max_seqs;
    e->page_size = e->o.kv_page_size;
    e->pps = (e->o.max_ctx + e->page_size - 1) / e->page_size;
    e->n_pages = e->o.kv_pages > 0 ? e->o.kv_pages : M * e->n_mla * e->pps;
    e->seq_used = calloc((size_t)M, sizeof(bool));
    e->seq_busy = calloc((size_t)M, sizeof(bool));
    e->walked = calloc((size_t)e->o.max_batch_tokens + 1, sizeof(bool));
    e->seq_len = calloc((size_t)M, sizeof(int));
    e->free_pages = malloc((size_t)e->n_pages * sizeof(int) + 4);
    e->seq_npages = calloc((size_t)M * (size_t)e->n_mla + 1, sizeof(int));
    e->seq_pageid = calloc((size_t)M * (size_t)e->n_mla * (size_t)e->pps + 1, sizeof(int));
    e->tau = calloc((size_t)c->n_layers * (size_t)ST_MAX(c->n_experts, 1), sizeof(float));
    e->rho = calloc((size_t)c->n_layers * (size_t)ST_MAX(c->n_experts, 1), sizeof(float));
    if (!e->seq_used || !e->seq_busy || !e->walked || !e->seq_len || !e->free_pages || !e->seq_npages ||
        !e->seq_pageid || !e->tau || !e->rho)
        return ST_FAIL(ST_ERR_NO_MEMORY, "engine tables for %d sequences × %d tokens", M, e->o.max_ctx);
    for (int i = 0; i < e->n_pages; i++) e->free_pages[i] = e->n_pages - 1 - i;
    e->n_free = e->n_pages;
    return ST_OK;
}

static void free_tables(st_engine_t *e) {
    free(e->walked);
    free(e->seq_used), free(e->seq_busy), free(e->seq_len), free(e->free_pages), free(e->seq_npages);
    free(e->seq_pageid), free(e->tau), free(e->rho);
    if (e->bq)
        for (int b = 0; b < e->n_blocks; b++) free(e->bq[b].w);
    free(e->bq), free(e->q_attn), free(e->q_mlp), free(e->layer_slot);
}

static st_status_t check_opts(st_engine_t *e) {
    const st_config_t *c = &e->c;
    if (e->o.kv_page_size <= 0) e->o.kv_page_size = 64;
    if (e->o.handoff_timeout_ms <= 0) e->o.handoff_timeout_ms = 60000;
    if (e->o.max_seqs <= 0 || e->o.max_batch_tokens <= 0 || e->o.max_ctx <= 0)
        return ST_FAIL(ST_ERR_INVALID_ARG, "engine: max_seqs, max_batch_tokens and max_ctx must be positive");
    if (c->kda_heads > 0 && c->kda_head_dim <= 0) return ST_FAIL(ST_ERR_CONFIG, "engine: KDA head_dim must be positive");
    int kmax = e->o.k_max > 0 ? e->o.k_max : 2 * c->top_k;
    e->o.k_max = ST_MIN(kmax, ST_MAX(c->n_experts, 1));
    e->kcap = ST_MAX(c->top_k, e->o.routing == ST_ROUTE_QUANTILE ? e->o.k_max : 0);
    if (e->kcap <= 0) e->kcap = 1;
    return ST_OK;
}

st_status_t st_engine_create(st_engine_t **out, const st_ckpt_t *ck, const st_engine_opts_t *opts) {
    st_engine_t *e = calloc(1, sizeof *e);
    if (!e) return ST_FAIL(ST_ERR_NO_MEMORY, "engine");
    e->c = *st_ckpt_config(ck);
    e->ck = ck;
    e->o = *opts;
    const st_config_t *c = &e->c;
    st_status_t s = pick_backend(opts, &e->be);
    if (s == ST_OK) s = check_opts(e);
    if (s != ST_OK) {
        free(e);
        return s;
    }
    s = st_engine_bind(&e->W, ck, !e->o.remote_experts);
    if (s != ST_OK) goto err_unbind;
    e->layer_slot = calloc((size_t)c->n_layers, sizeof(int));
    if (!e->layer_slot) {
        s = ST_FAIL(ST_ERR_NO_MEMORY, "engine tables");
        goto err_tables;
    }
    for (int l = 0; l < c->n_layers; l++) e->layer_slot[l] = c->is_mla[l] ? e->n_mla++ : e->n_kda++;
    if ((s = build_attnres_queries(e)) != ST_OK || (s = alloc_tables(e)) != ST_OK) goto err_tables;
    if ((s = e->be->init(e)) != ST_OK) goto err_tables;
    if (!e->be->keep_weights) st_engine_unbind(&e->W);
    if (!e->o.remote_experts && (s = mb_create(e, &e->mb, true)) != ST_OK) goto err_backend;
    *out = e;
    return ST_OK;

err_backend:
    e->be->free(e);
err_tables:
    free_tables(e);
err_unbind:
    st_engine_unbind(&e->W);
    free(e);
    return s;
}

void st_engine_destroy(st_engine_t *e) {
    if (!e) return;
    st_engine_mb_destroy(e->mb);
    e->be->free(e);
    free_tables(e);
    st_engine_unbind(&e->W);
    free(e);
}

const st_config_t *st_engine_config(const st_engine_t *e) { return &e->c; }

/* ------------------------------------------------------------------ sequences */

st_status_t st_engine_seq_open(st_engine_t *e, int *slot) {
    for (int i = 0; i < e->o.max_seqs; i++) {
        if (e->seq_used[i]) continue;
        st_status_t s = e->be->use ? e->be->use(e) : ST_OK;
        if (s == ST_OK) s = e->be->seq_reset(e, i);
        if (s != ST_OK) return s;
        e->seq_used[i] = true;
        e->seq_len[i] = 0;
        *slot = i;
        return ST_OK;
    }
    return ST_FAIL(ST_ERR_CAPACITY, "all %d sequence slots are in use", e->o.max_seqs);
}

void st_engine_seq_close(st_engine_t *e, int slot) {
    if (slot < 0 || slot >= e->o.max_seqs || !e->seq_used[slot]) return;
    if (e->seq_busy[slot]) { /* our own invariant: the scheduler closes sequences between steps */
        st_log_error("engine: slot %d closed while its micro-batch is in flight; ignored", slot);
        return;
    }
    for (int m = 0; m < e->n_mla; m++) {
        int *np = &e->seq_npages[slot * e->n_mla + m];
        int *ids = &e->seq_pageid[((size_t)slot * e->n_mla + m) * e->pps];
        for (int p = 0; p < *np; p++) e->free_pages[e->n_free++] = ids[p];
        *np = 0;
    }
    e->seq_used[slot] = false;
    e->seq_len[slot] = 0;
}

int st_engine_seq_len(const st_engine_t *e, int slot) {
    return (slot >= 0 && slot < e->o.max_seqs && e->seq_used[slot]) ? e->seq_len[slot] : -1;
}

/* ------------------------------------------------------------------ routing */

void st_engine_set_thresholds(st_engine_t *e, const float *tau, uint64_t version) {
    if (!tau) {
        e->tau_set = false;
        return;
    }
    memcpy(e->tau, tau, (size_t)e->c.n_layers * (size_t)e->c.n_experts * sizeof(float));
    /* NOTE: between steps (engine.h), so no micro-batch reads a device copy now */
    if (e->be->set_thresholds && e->be->set_thresholds(e, tau) != ST_OK) {
        st_log_error("engine: thresholds not uploaded (%s); top-k routing until the next set", st_err_last());
        e->tau_set = false;
        return;
    }
    e->tau_set = true;
    e->tau_version = version;
}

void st_engine_set_probes(st_engine_t *e, const float *rho) {
    if (!rho) {
        e->rho_set = false;
        return;
    }
    memcpy(e->rho, rho, (size_t)e->c.n_layers * (size_t)e->c.n_experts * sizeof(float));
    if (e->be->set_probes && e->be->set_probes(e, rho) != ST_OK) {
        st_log_error("engine: probe thresholds not uploaded (%s); no band counts until the next set", st_err_last());
        e->rho_set = false;
        return;
    }
    e->rho_set = true;
}

void st_engine_set_route_hook(st_engine_t *e, st_route_hook_t fn, void *ctx) {
    e->hook = fn;
    e->hook_ctx = ctx;
}

void st_engine_set_route_observer(st_engine_t *e, st_route_observer_t fn, void *ctx, bool want_scores) {
    e->obs = fn;
    e->obs_ctx = ctx;
    e->obs_scores = want_scores;
}

void st_engine_set_count_observer(st_engine_t *e, st_count_observer_t fn, void *ctx) {
    e->cobs = fn;
    e->cobs_ctx = ctx;
}

void st_engine_set_trace_hook(st_engine_t *e, st_trace_hook_t fn, void *ctx) {
    if (fn && e->be->set_trace && e->be->set_trace(e, true) != ST_OK) {
        st_log_error("engine: no memory for the trace buffers; trace off");
        fn = NULL;
    }
    e->trace = fn;
    e->trace_ctx = ctx;
}

/* NOTE: a layer whose thresholds are unset (NaN) routes top-k until the coordinator has data */
bool st_engine_route_quantile(const st_engine_t *e, int l) {
    return e->o.routing == ST_ROUTE_QUANTILE && e->tau_set && !isnan(e->tau[(size_t)l * e->c.n_experts]);
}

bool st_engine_host_routes(const st_engine_t *e) {
    return e->o.routing == ST_ROUTE_QUANTILE && e->tau_set && (e->o.host_route || e->kcap != e->o.k_max);
}

bool st_engine_counted(const st_engine_t *e, int l) { return e->cobs && st_engine_route_quantile(e, l); }

const float *st_engine_probe_row(const st_engine_t *e, int l) {
    const float *r = e->rho + (size_t)l * e->c.n_experts;
    return e->rho_set && !isnan(r[0]) ? r : NULL;
}

void st_engine_route_host(st_engine_t *e, int l, int T, const float *scores, int *ids, int *cnt, float *wq) {
    const st_config_t *c = &e->c;
    int n = c->n_experts, km = e->o.k_max, kc = e->kcap;
    if (st_engine_route_quantile(e, l)) {
        st_route_quantile(ids, wq, cnt, scores, e->tau + (size_t)l * n, T, n, km, c->renormalize, c->routed_scale);
        if (km != kc) /* restride [T, k_max] → [T, kc] */
            for (int t = T - 1; t >= 0; t--) memmove(ids + (size_t)t * kc, ids + (size_t)t * km, (size_t)km * sizeof(int));
    }
    if (e->hook) e->hook(e->hook_ctx, l, T, n, scores, ids, cnt, kc);
}

/* ------------------------------------------------------------------ micro-batches */

static st_status_t mb_create(st_engine_t *e, st_engine_mb_t **out, bool internal) {
    st_status_t s = e->be->use ? e->be->use(e) : ST_OK;
    if (s != ST_OK) return s;
    st_engine_mb_t *mb = calloc(1, sizeof *mb);
    if (!mb) return ST_FAIL(ST_ERR_NO_MEMORY, "micro-batch");
    mb->e = e;
    mb->internal = internal;
    mb->ents = calloc((size_t)e->o.max_seqs, sizeof(st_ent_t));
    s = mb->ents ? e->be->mb_init(mb) : ST_FAIL(ST_ERR_NO_MEMORY, "micro-batch entries");
    if (s != ST_OK) {
        free(mb->ents);
        free(mb);
        return s;
    }
    *out = mb;
    return ST_OK;
}

st_status_t st_engine_mb_create(st_engine_t *e, st_engine_mb_t **out) { return mb_create(e, out, false); }

void st_engine_mb_destroy(st_engine_mb_t *mb) {
    if (!mb) return;
    st_engine_mb_release(mb); /* device work queued behind an unreleased hand-off drains */
    mb->e->be->mb_free(mb);
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
        const st_sample_params_t *sp = s->sample;
        if (sp && (s->all_logits || s->argmax || !s->token || sp->n_bias < 0 || sp->n_bias > ST_ENGINE_MAX_BIAS ||
                   (sp->n_bias && (!sp->bias_ids || !sp->bias_values)) || sp->n_top > ST_SAMPLE_MAX_TOP ||
                   (sp->n_top >= 0 && (!s->logprob || !s->top_ids || !s->top_logprobs)) || !(sp->temperature == sp->temperature)))
            return ST_FAIL(ST_ERR_INVALID_ARG, "step: slot %d: sampling parameters or outputs invalid", s->slot);
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
        size_t base = ((size_t)en->slot * e->n_mla + m) * e->pps;
        while (*np < want) e->seq_pageid[base + (*np)++] = e->free_pages[--e->n_free];
    }
}

st_status_t st_engine_mb_begin(st_engine_mb_t *mb, const st_seq_chunk_t *seqs, int n_seqs, float *logits) {
    st_engine_t *e = mb->e;
    if (mb->busy) return ST_FAIL(ST_ERR_INVALID_ARG, "micro-batch is still in flight");
    st_engine_mb_release(mb);
    st_status_t s = e->be->use ? e->be->use(e) : ST_OK;
    int T = 0;
    if (s == ST_OK) s = validate(e, seqs, n_seqs, mb->ents, &T);
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
    mb->pend = 0;
    mb->err = ST_OK;
    mb->t0 = mb->ts = st_time_sec();
    e->be->begin(mb);
    return ST_OK;
}

/* Synchronous backends: the seconds since the last stage end go to *stat. (An asynchronous
 * backend's launches return before the device is done: whole steps only, see finish.) */
static void stage(st_engine_mb_t *mb, double *stat) {
    if (mb->e->be->async) return;
    double t = st_time_sec();
    *stat += t - mb->ts;
    mb->ts = t;
}

/* The layer walk up to the next MoE hand-off (pend 1) or the end of the layers (pend 2). With the
 * internal micro-batch the bound experts run in the walk, so a step is one launch. */
static void walk(st_engine_mb_t *mb) {
    st_engine_t *e = mb->e;
    const st_engine_backend_t *be = e->be;
    const st_config_t *c = &e->c;
    int B = c->attn_res_block;
    if (!mb->busy || mb->pend) return;
    if (be->segment && be->segment(mb, ST_SEG_REPLAY)) return;
    int l0 = mb->l, nb0 = mb->nb;
    bool waiting0 = mb->waiting, cap = be->segment && be->segment(mb, ST_SEG_CAPTURE);
again:
    if (!be->async) mb->ts = st_time_sec(); /* since the hand-off: the executor's time, not a stage's */
    if (be->launch_begin) be->launch_begin(mb);
    if (mb->waiting) { /* the experts of layer l are back */
        be->moe_finish(mb, mb->l);
        mb->waiting = false;
        mb->l++;
        stage(mb, &e->stats.combine);
    }
    for (; mb->l < c->n_layers; mb->l++) {
        int l = mb->l;
        bool push = B > 0 && l % B == 0;
        be->attn_norm(mb, l, push);
        mb->nb += push;
        if (c->is_mla[l]) be->mla(mb, l);
        else be->kda(mb, l);
        be->attn_out(mb, l, push);
        be->mlp_norm(mb, l);
        stage(mb, &e->stats.attention);
        if (!st_config_is_moe_layer(c, l)) {
            be->dense_ffn(mb, l);
            stage(mb, &e->stats.attention);
            continue;
        }
        be->moe_begin(mb, l, &mb->work);
        stage(mb, &e->stats.route);
        if (mb->internal) {
            be->experts(mb, &mb->work);
            stage(mb, &e->stats.experts);
            be->moe_finish(mb, l);
            stage(mb, &e->stats.combine);
            continue;
        }
        if (be->handoff) be->handoff(mb, l, &mb->work);
        mb->waiting = true;
        mb->pend = 1;
        break;
    }
    if (!mb->pend) {
        if (be->launch_end) be->launch_end(mb);
        mb->pend = 2;
    }
    if (cap && !be->segment(mb, ST_SEG_END)) { /* nothing ran: the same walk, launched plainly */
        cap = false;
        mb->l = l0, mb->nb = nb0, mb->waiting = waiting0, mb->pend = 0;
        goto again;
    }
}

/* The head and the step's bookkeeping. */
static void finish(st_engine_mb_t *mb) {
    st_engine_t *e = mb->e;
    e->be->head(mb);
    if (e->be->sample) e->be->sample(mb);
    for (int i = 0; i < mb->n_seqs; i++) {
        e->seq_len[mb->ents[i].slot] += mb->ents[i].n;
        e->seq_busy[mb->ents[i].slot] = false;
    }
    e->stats.steps++;
    e->stats.tokens += (uint64_t)mb->T;
    if (mb->err == ST_OK) e->walked[mb->T] = true;
    if (e->be->async) e->stats.attention += st_time_sec() - mb->t0; /* NOTE: device work is asynchronous */
    else stage(mb, &e->stats.head);
    mb->busy = false;
}

bool st_engine_async(const st_engine_t *e) { return e->be->async; }

st_status_t st_engine_mb_copy_z(st_engine_mb_t *mb, const int *first, const int *count, void *const *dst, int n_runs) {
    if (!mb->e->be->copy_z) return ST_FAIL(ST_ERR_UNSUPPORTED, "engine %s hands over fp32 rows", mb->e->be->name);
    if (!mb->held || mb->pend) return ST_FAIL(ST_ERR_INVALID_ARG, "engine: no collected hand-off to copy rows from");
    for (int i = 0; i < n_runs; i++)
        if (first[i] < 0 || count[i] < 0 || first[i] > mb->T - count[i])
            return ST_FAIL(ST_ERR_INVALID_ARG, "engine: rows %d..%d of a %d-token hand-off", first[i],
                           first[i] + count[i], mb->T);
    return mb->e->be->copy_z(mb, first, count, dst, n_runs);
}

st_status_t st_engine_mb_peer_mem(st_engine_mb_t *mb, st_engine_peer_mem_t *out) {
    if (!mb->e->be->peer_mem || !mb->e->o.remote_experts)
        return ST_FAIL(ST_ERR_UNSUPPORTED, "engine %s shares no device memory", mb->e->be->name);
    return mb->e->be->peer_mem(mb, out);
}

st_status_t st_engine_mb_plan(st_engine_mb_t *mb, const st_moe_plan_t *p, int n_servers, const int *server_of,
                              bool *tok_failed) {
    if (!mb->e->be->plan) return ST_FAIL(ST_ERR_UNSUPPORTED, "engine %s plans no dispatch", mb->e->be->name);
    if (!mb->held || mb->pend) return ST_FAIL(ST_ERR_INVALID_ARG, "engine: no collected hand-off to plan");
    if (n_servers < 1 || n_servers > p->n_servers || p->n_experts != mb->e->c.n_experts ||
        (long long)mb->T * mb->work.kc > p->max_rows)
        return ST_FAIL(ST_ERR_INVALID_ARG, "engine: a plan of %d of %d servers, %d experts, %d rows for %d tokens",
                       n_servers, p->n_servers, p->n_experts, p->max_rows, mb->T);
    return mb->e->be->plan(mb, p, n_servers, server_of, tok_failed);
}

void st_engine_mb_release(st_engine_mb_t *mb) {
    if (!mb->held) return;
    mb->held = false;
    if (mb->e->be->release) mb->e->be->release(mb);
}

/* An early launch queues the walk behind the release; a walk that waits for its own device work on
 * the host (a hook or trace reading rows, routing on the host) would wait for that release, which
 * comes after it: such a walk is left to the collect that follows the release. So is a walk of a
 * token count no step has finished with yet: its GEMMs may take library kernels not loaded yet (on
 * the H200 such walks timed out with eager loading on: cuBLAS's kernels still load at first use,
 * inferred, docs/perf.md), and such a first launch waits for all the device's work, the release
 * included. */
void st_engine_mb_launch_early(st_engine_mb_t *mb) {
    const st_engine_t *e = mb->e;
    if (st_engine_launches_early(e) && e->walked[mb->T] && !e->hook && !e->trace && !st_engine_host_routes(e))
        walk(mb);
}

bool st_engine_launches_early(const st_engine_t *e) { return e->be->async && e->early; }

void st_engine_process_init(void) {
#ifdef STRATA_WITH_CUDA
    st_gpu_load_eagerly();
#endif
}

void st_engine_mb_launch(st_engine_mb_t *mb) {
    st_engine_mb_release(mb);
    st_engine_mb_launch_early(mb);
}

st_status_t st_engine_mb_status(const st_engine_mb_t *mb) { return mb->err; }

bool st_engine_mb_ready(st_engine_mb_t *mb) {
    const st_engine_backend_t *be = mb->e->be;
    return !mb->busy || !mb->pend || mb->internal || !be->ready || be->ready(mb);
}

int st_engine_mb_collect(st_engine_mb_t *mb, st_moe_work_t *work) {
    st_engine_t *e = mb->e;
    if (!mb->busy) return 0;
    if (!mb->pend) {
        st_engine_mb_release(mb);
        walk(mb);
    }
    int p = mb->pend;
    mb->pend = 0;
    if (p == 2) {
        finish(mb);
        return 0;
    }
    if (e->be->wait) e->be->wait(mb);
    /* the node-value table is the executor's now: the previous combine has read it (engine.h) */
    if (mb->work.at) memset(mb->work.at, 0, sizeof *mb->work.at * (size_t)mb->work.T * (size_t)mb->work.kc);
    mb->held = true;
    *work = mb->work;
    mb->ts = st_time_sec();
    return 1;
}

int st_engine_mb_advance(st_engine_mb_t *mb, st_moe_work_t *work) {
    st_engine_mb_launch(mb);
    return st_engine_mb_collect(mb, work);
}

void *st_engine_host_alloc(st_engine_t *e, size_t n) {
    if (e->be->host_alloc) return e->be->host_alloc(e, n);
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    void *p = NULL;
    return posix_memalign(&p, pg, (n + pg - 1) / pg * pg) ? NULL : p;
}

void st_engine_host_free(st_engine_t *e, void *p) {
    if (!p) return;
    if (e->be->host_free) e->be->host_free(e, p);
    else free(p);
}

st_status_t st_engine_host_map(st_engine_t *e, void *p, size_t n) {
    return e->be->host_map ? e->be->host_map(e, p, n) : ST_OK;
}

void st_engine_host_unmap(st_engine_t *e, void *p) {
    if (p && e->be->host_unmap) e->be->host_unmap(e, p);
}

void st_engine_mb_run_local(st_engine_mb_t *mb, const st_moe_work_t *w) {
    st_engine_t *e = mb->e;
    if (e->o.remote_experts || !mb->waiting) return;
    double t0 = st_time_sec();
    e->be->experts(mb, w);
    if (!e->be->async) e->stats.experts += st_time_sec() - t0;
    mb->ts = st_time_sec();
}

st_status_t st_engine_step(st_engine_t *e, const st_seq_chunk_t *seqs, int n_seqs, float *logits) {
    if (!e->mb) return ST_FAIL(ST_ERR_INVALID_ARG, "engine: st_engine_step needs local experts");
    st_status_t s = st_engine_mb_begin(e->mb, seqs, n_seqs, logits);
    if (s != ST_OK) return s;
    if (e->be->step) e->be->step(e->mb);
    st_moe_work_t w;
    while (st_engine_mb_advance(e->mb, &w)) st_engine_mb_run_local(e->mb, &w);
    return e->mb->err;
}

void st_engine_get_stats(const st_engine_t *e, st_engine_stats_t *out) { *out = e->stats; }
