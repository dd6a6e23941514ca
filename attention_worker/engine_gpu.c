/* The GPU engine: SPEC §2–9 over a batch of sequences on one CUDA device, the same layer walk and
 * AttnRes two-phase bookkeeping as engine.c, with bf16 weights/activations (fp32 accumulation),
 * an fp32 residual stream and AttnRes sources, fp32 KDA state and a paged bf16 MLA latent cache.
 * Every device buffer is sized at creation; a step allocates nothing. Routed experts run on the
 * device (grouped by expert), or are handed off through pinned host buffers (micro-batch API).
 * Not the kernels (kernels/ and engine_gpu_kernels.cu) nor the scheduler. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_gpu.h"
#include "engine_impl.h"

#define MLA_NORM_EPS 1e-6f /* q_a_layernorm / kv_a_layernorm (checkpoint-layout §5.4) */
#define L2_EPS 1e-6f
#define MLA_SPLIT 512     /* split-KV length of the absorbed decode kernel */
#define MLA_DIRECT_MIN 16 /* prompt chunks of at least this many tokens take the MLA direct form (mla_direct) */
#define LOGIT_ROWS 256    /* lm_head rows per chunk */
#define EGPU_PROF_EVENTS 4096 /* timing events per profiled step (STRATA_EGPU_PROF) */
#define EGPU_GATE_NS 200000000LL /* the profiling gate lets go by itself after 200 ms */
#define EGPU_GRAPHS 32 /* decode step graphs kept (engine_gpu.c graph_step) */
#define EG_AR_FOLD_T 128 /* block-start norm folded into the AttnRes phase-1 launch up to this many tokens */
#define EG_SLOTS_CAP 256 /* routed slots the per-slot expert FFN may take (its h scratch) */

typedef struct {
    float *in_norm, *post_norm; /* [d] */
    /* KDA: one GEMM for q|k|v, one with fp32 output for f_a | b (aux), one for the output gate.
     * NOTE: the decay gate is exponentiated and compounds over the sequence, so f stays fp32
     * (f_a fp32, W_fb fp32, fp32 GEMM): a bf16 f moved the logits by several 1e-2. */
    st_bf16_t *w_qkv;           /* [3P, d] */
    st_bf16_t *w_aux;           /* [f_rank + H, d] */
    st_bf16_t *w_g;             /* [H*dv, d] full-rank gate, or g_a [g_rank, d] */
    int naux, off_b, ng;        /* aux width, b's column in aux; rows of w_g */
    float *w_fb;                /* [P, f_rank] fp32 */
    st_bf16_t *w_gb;            /* [H*dv, g_rank] or NULL (full-rank gate inside aux) */
    float *conv_w;              /* [3P, K] */
    float *A_log, *dt_bias, *o_norm;
    st_bf16_t *w_o;             /* [d, H*dv] (KDA and MLA) */
    /* MLA */
    st_bf16_t *w_qa, *w_q;      /* [q_lora, d], [H*dqk, q_lora or d] */
    float *qa_norm, *kva_norm;
    st_bf16_t *w_kva, *w_kvb;   /* [R, d], [H*(nope+dv), kv_lora] */
    float *w_kvb32;             /* the same, fp32 (query absorption in fp32; mla32 only) */
    st_bf16_t *w_mg;            /* [H*dv, d] output gate or NULL */
    /* FFN */
    st_bf16_t *dense_gu, *dense_down; /* [2w, d], [d, w] */
    st_bf16_t *router;          /* [n, d] */
    float *router_bias;         /* [n] or NULL */
    st_bf16_t *lat_down, *lat_up; /* [ℓ, d], [d, ℓ] */
    float *lat_norm;            /* [ℓ] or NULL */
    st_bf16_t *sh_gu, *sh_down; /* [2w, d], [d, w] */
    st_bf16_t *ex_w1, *ex_w3, *ex_w2; /* [E, mi, ew], [E, mi, ew], [E, ew, mi]; NULL with remote experts */
} gl_t;

typedef struct {
    int Q;
    float *w; /* device [Q, d] */
} gbq_t;

struct st_egpu {
    st_config_t c;
    st_engine_opts_t o;
    int kcap, P, n_kda, n_mla, *layer_slot, R;
    st_gpu_stream_t s;
    void **allocs;
    int n_allocs, cap_allocs;
    /* weights */
    st_bf16_t *embed, *lm_head;
    float *final_norm, *out_res;
    gl_t *L;
    int naux_max, ffn_w_max;
    /* AttnRes */
    int n_blocks, Qmax, *q_attn, *q_mlp, q_out;
    gbq_t *bq;
    /* sequences */
    bool *seq_used, *seq_busy;
    int *seq_len;
    float *kda_S, *kda_conv; /* device [n_kda][M][S_per], [n_kda][M][conv_per] */
    size_t S_per, conv_per;
    int page_size, n_pages, pps, n_free, *free_pages, *seq_npages, *seq_pageid;
    void *kv_pool; /* device [n_pages][page_size][R], fp32 when mla32, else bf16 */
    bool mla32;    /* STRATA_EGPU_MLA32=1: fp32 query absorption and latent cache (see NOTE in mla_layer) */
    bool kda_rec;  /* STRATA_EGPU_KDA_REC=1: prompts through the recurrent glue kernel (comparisons) */
    int xsplit;    /* STRATA_EGPU_XSPLIT=1: GEMM inputs as bf16 hi + lo, two passes (see lin2); 2: also the
                    * MLA q_a / ō inputs, fp32 MLA (mla32) and the fp32 recurrence for prompts (kda_rec) */
    bool ar_v1;    /* STRATA_EGPU_AR_V1=1: the first AttnRes kernels (copy + st_cuda_attnres_phase1_strided, st_cuda_attnres_phase2_rmsnorm_v1) */
    bool host_route; /* STRATA_EGPU_HOST_ROUTE=1: quantile routing on the host (one sync per MoE layer; comparisons) */
    /* STRATA_EGPU_PROF=1 (engine_gpu.h): events [EGPU_PROF_EVENTS] and the group each one opens,
     * pinned gate words [2]; pf_step: the step in flight is profiled */
    bool prof, prof_paused, pf_step, pf_gate_held;
    void **pf_ev;
    unsigned char *pf_grp;
    int pf_n, pf_cur, *pf_gate;
    double pf_t0;
    st_egpu_prof_t pf;
    st_trace_hook_t trace; /* test-only (engine.h) */
    void *trace_ctx;
    float *tr_f;    /* host [max_batch_tokens, tr_w] */
    void *tr_raw;   /* host, same bytes */
    size_t tr_w;
    void *mla_ws;
    size_t mla_ws_bytes;
    /* MLA direct form for prompt chunks of ≥ mla_dmin tokens (mla_layer; 0: off, STRATA_EGPU_MLA_DIRECT=0):
     * one sequence at a time — its cache rows c [max_ctx, R], decompressed Y [max_ctx, H, nope+dv],
     * K [max_ctx, H, dqk], V [max_ctx, H, dv], output od [max_batch_tokens, H, dv], all bf16 */
    int mla_dmin;
    st_bf16_t *dc, *dY, *dK, *dV, *dod;
    /* routing */
    float *tau;   /* host [L][n] */
    float *tau_d; /* device copy (quantile routing on the device) */
    bool tau_set;
    uint64_t tau_version;
    st_route_hook_t hook;
    void *hook_ctx;
    st_route_observer_t obs;
    void *obs_ctx;
    /* ordering across micro-batch streams: seq_open's state resets on s (open_ev); the compute of
     * the micro-batches in launch order (chain_ev, see chain_wait), so that an early micro-batch's
     * hand-off is ready early and the copies run beside the next one's compute */
    void *open_ev, *chain_ev;
    /* decode steps of st_engine_step as CUDA graphs (STRATA_EGPU_GRAPHS=0: off): one per (tokens,
     * MLA split bound), captured at its first step, least recently used replaced; host state of the
     * micro-batch after the layers (restored on replay) */
    bool graphs;
    struct {
        int T, lb, l, nb, pend;
        bool local_done, slot_order;
        void *exec;
        uint64_t used;
    } gr[EGPU_GRAPHS];
    uint64_t gr_clock;
    bool grouped;     /* routed experts through st_cuda_moe_ffn (else per-expert cuBLAS) */
    st_egpu_mb_t *mb; /* st_engine_step's */
    st_engine_stats_t stats;
};

typedef struct {
    int slot, n, off, pos0;
} gent_t;

struct st_egpu_mb {
    st_egpu_t *g;
    bool internal; /* st_engine_step's: experts run inline, no hand-off buffers */
    /* its stream: the engine's for the internal one, else its own (own), so that micro-batches
     * overlap; ev marks the end of what launch queued (hand-off copies) */
    const st_gpu_stream_t *s;
    st_gpu_stream_t own;
    void *ev;
    int pend; /* launched, not collected: 0 none, 1 a hand-off, 2 the step's end (the layers; the head
               * runs in collect) */
    st_moe_work_t work; /* the hand-off launch queued */
    st_gpu_arena_t dev, pin;
    /* device step buffers */
    float *aux, *partial, *blocks, *stats, *acc, *gf, *beta, *scores, *wts, *zf, *eout, *lg;
    st_bf16_t *xn, *q, *k, *v, *f, *o, *cq, *qm, *olat, *hh, *z, *xg, *he, *hs, *un, *xf;
    /* fp32 activations between kernels (rounded to bf16 only where a GEMM reads them): GEMM
     * outputs qkv / gate / cq32 / h2 / h2e / o32 (MLA, gated), conv output cqkv, KDA q32 / k32 / v32
     * and output o32, expert outputs yg */
    float *qkv, *cqkv, *q32, *k32, *v32, *o32, *gate, *cq32, *h2, *h2e, *yg;
    /* xsplit only: the bf16 remainders of xn, xf, o, un, hh; z before rounding */
    st_bf16_t *xn_lo, *xf_lo, *o_lo, *un_lo, *hh_lo, *cq_lo, *olat_lo;
    float *z32;
    float *qm32, *ckv; /* MLA query [T, H*dqk] and latent row [T, R], fp32 GEMM outputs */
    void *qabs;        /* [T, H, R] fp32 when mla32, else bf16 */
    int *ids, *cnt, *offsets, *row_of, *meta_d, *amax_d;
    int *amax_h;          /* pinned [max_batch_tokens]: device argmax of each logits row */
    unsigned char *need;  /* host [max_batch_tokens]: logits row r goes to the caller (else argmax only) */
    void *ffn_ws;
    size_t ffn_ws_bytes;
    /* pinned host */
    int *meta_h, *ids_h, *cnt_h, *offsets_h;
    float *z_h, *out_h, *scores_h, *wq_h; /* wq_h: the host quantile routing's weights (discarded) */
    /* step */
    gent_t *ents;
    const st_seq_chunk_t *seqs;
    int n_seqs, T, n_rows;
    int *d_tok, *d_tok_ent, *d_tok_pos, *d_rows, *d_cu, *d_slot, *d_len, *d_btab; /* into meta_d */
    bool all_decode;
    int max_len; /* longest sequence of the step (context after it), for the MLA decode split */
    size_t words; /* step metadata words (meta_h → meta_d) */
    bool fresh;   /* begun, metadata not yet queued (queue_begin) */
    float *logits;
    int l, nb;
    bool waiting, busy, local_done;
    bool slot_order; /* local_done by st_cuda_moe_ffn_slots: yg in slot order, not grouped */
    st_status_t err;
    double t0;
};

#define TRY(x)                                                                                    \
    do {                                                                                          \
        st_status_t s_ = (x);                                                                     \
        if (s_ != ST_OK) return s_;                                                               \
    } while (0)
/* NOTE: launches inside a step record the first error and keep going (the walk cannot stop half
 * way through its bookkeeping); the step reports it at the end. */
#define CK(x)                                                                                     \
    do {                                                                                          \
        st_status_t s_ = (x);                                                                     \
        if (s_ != ST_OK && mb->err == ST_OK) mb->err = s_;                                        \
    } while (0)

static st_status_t mb_create(st_egpu_t *g, st_egpu_mb_t **out, bool internal);
static inline void prof_release(st_egpu_t *g);

/* ------------------------------------------------------------------ uploads */

static st_status_t galloc(st_egpu_t *g, void **p, size_t bytes) {
    if (g->n_allocs == g->cap_allocs) {
        int nc = g->cap_allocs ? 2 * g->cap_allocs : 256;
        void **na = realloc(g->allocs, (size_t)nc * sizeof(void *));
        if (!na) return ST_FAIL(ST_ERR_NO_MEMORY, "gpu engine: allocation table");
        g->allocs = na;
        g->cap_allocs = nc;
    }
    TRY(st_gpu_malloc(p, bytes ? bytes : 256));
    g->allocs[g->n_allocs++] = *p;
    return ST_OK;
}

static st_status_t up_vec(st_egpu_t *g, float **dst, const float *src, int n) {
    if (!src) {
        *dst = NULL;
        return ST_OK;
    }
    TRY(galloc(g, (void **)dst, (size_t)n * sizeof(float)));
    return st_gpu_memcpy_h2d(*dst, src, (size_t)n * sizeof(float));
}

/* Rows of w (any stored dtype) → bf16 at dst (device, [rows, cols]). */
static st_status_t up_rows(st_bf16_t *dst, const st_weight_t *w) {
    size_t rows = (size_t)w->rows, cols = (size_t)w->cols;
    if (w->dtype == ST_DT_BF16) return st_gpu_memcpy_h2d(dst, w->data, rows * cols * 2);
    size_t chunk = ST_MAX((size_t)1, ((size_t)8 << 20) / cols);
    float *tf = malloc(chunk * cols * sizeof(float));
    uint16_t *tb = malloc(chunk * cols * sizeof(uint16_t));
    st_status_t s = (tf && tb) ? ST_OK : ST_FAIL(ST_ERR_NO_MEMORY, "weight staging");
    for (size_t r = 0; s == ST_OK && r < rows; r += chunk) {
        size_t n = ST_MIN(chunk, rows - r);
        st_weight_rows_f32(w, (int)r, (int)n, tf);
        for (size_t i = 0; i < n * cols; i++) tb[i] = st_f32_to_bf16(tf[i]);
        s = st_gpu_memcpy_h2d(dst + r * cols, tb, n * cols * 2);
    }
    free(tf);
    free(tb);
    return s;
}

/* Several weights with the same cols stacked by rows into one device matrix. */
static st_status_t up_stack(st_egpu_t *g, st_bf16_t **dst, const st_weight_t *const *ws, int n) {
    size_t rows = 0, cols = (size_t)ws[0]->cols;
    for (int i = 0; i < n; i++) rows += (size_t)ws[i]->rows;
    TRY(galloc(g, (void **)dst, rows * cols * 2));
    size_t r = 0;
    for (int i = 0; i < n; i++) {
        TRY(up_rows(*dst + r * cols, ws[i]));
        r += (size_t)ws[i]->rows;
    }
    return ST_OK;
}
static st_status_t up_w(st_egpu_t *g, st_bf16_t **dst, const st_weight_t *w) {
    if (w->rows <= 0) {
        *dst = NULL;
        return ST_OK;
    }
    const st_weight_t *ws[1] = {w};
    return up_stack(g, dst, ws, 1);
}

static st_status_t upload(st_egpu_t *g, const st_engine_w_t *W) {
    const st_config_t *c = &g->c;
    int d = c->d, H = c->kda_heads, dk = c->kda_head_dim, P = g->P, K = c->conv_k;
    TRY(up_w(g, &g->embed, &W->embed));
    if (c->tie_embeddings) g->lm_head = g->embed;
    else TRY(up_w(g, &g->lm_head, &W->lm_head));
    TRY(up_vec(g, &g->final_norm, W->final_norm, d));
    TRY(up_vec(g, &g->out_res, W->out_res, d));
    float *convh = malloc((size_t)3 * P * K * sizeof(float) + 4);
    if (!convh) return ST_FAIL(ST_ERR_NO_MEMORY, "conv staging");
    st_status_t s = ST_OK;
    for (int l = 0; s == ST_OK && l < c->n_layers; l++) {
        const st_layer_w_t *L = &W->layers[l];
        gl_t *G = &g->L[l];
#define S_(x) do { s = (x); if (s != ST_OK) break; } while (0)
        do {
            S_(up_vec(g, &G->in_norm, L->in_norm, d));
            S_(up_vec(g, &G->post_norm, L->post_norm, d));
            S_(up_w(g, &G->w_o, &L->o));
            if (!c->is_mla[l]) {
                const st_weight_t *qkv[3] = {&L->q, &L->k, &L->v};
                S_(up_stack(g, &G->w_qkv, qkv, 3));
                const st_weight_t *aux[2] = {&L->f_a, &L->b};
                S_(up_stack(g, &G->w_aux, aux, 2));
                G->off_b = L->f_a.rows;
                G->naux = L->f_a.rows + L->b.rows;
                S_(up_w(g, &G->w_g, c->full_rank_gate ? &L->g : &L->g_a));
                G->ng = c->full_rank_gate ? L->g.rows : L->g_a.rows;
                if (!c->full_rank_gate) S_(up_w(g, &G->w_gb, &L->g));
                {
                    float *fb = malloc((size_t)L->f_b.rows * L->f_b.cols * sizeof(float));
                    if (!fb) { s = ST_FAIL(ST_ERR_NO_MEMORY, "f_b staging"); break; }
                    st_weight_rows_f32(&L->f_b, 0, L->f_b.rows, fb);
                    s = up_vec(g, &G->w_fb, fb, L->f_b.rows * L->f_b.cols);
                    free(fb);
                    if (s != ST_OK) break;
                }
                memcpy(convh, L->conv_q, (size_t)P * K * sizeof(float));
                memcpy(convh + (size_t)P * K, L->conv_k, (size_t)P * K * sizeof(float));
                memcpy(convh + (size_t)2 * P * K, L->conv_v, (size_t)P * K * sizeof(float));
                S_(up_vec(g, &G->conv_w, convh, 3 * P * K));
                S_(up_vec(g, &G->A_log, L->A_log, H));
                S_(up_vec(g, &G->dt_bias, L->dt_bias, P));
                S_(up_vec(g, &G->o_norm, L->o_norm, dk));
                g->naux_max = ST_MAX(g->naux_max, G->naux);
            } else {
                if (c->q_lora_rank > 0) {
                    S_(up_w(g, &G->w_qa, &L->q_a));
                    S_(up_vec(g, &G->qa_norm, L->q_a_norm, c->q_lora_rank));
                }
                S_(up_w(g, &G->w_q, &L->q));
                S_(up_w(g, &G->w_kva, &L->kv_a));
                S_(up_vec(g, &G->kva_norm, L->kv_a_norm, c->kv_lora_rank));
                S_(up_w(g, &G->w_kvb, &L->kv_b));
                if (g->mla32) S_(up_vec(g, &G->w_kvb32, L->kv_b_f32, L->kv_b.rows * L->kv_b.cols));
                if (c->mla_output_gate) S_(up_w(g, &G->w_mg, &L->g));
            }
            if (st_config_is_moe_layer(c, l)) {
                int n = c->n_experts, ew = st_config_expert_width(c), mi = c->moe_inter;
                S_(up_w(g, &G->router, &L->router));
                S_(up_vec(g, &G->router_bias, L->router_bias, n));
                if (c->latent > 0) {
                    S_(up_w(g, &G->lat_down, &L->lat_down));
                    S_(up_w(g, &G->lat_up, &L->lat_up));
                    S_(up_vec(g, &G->lat_norm, L->lat_norm, c->latent));
                }
                if (c->n_shared > 0) {
                    const st_weight_t *gu[2] = {&L->shared.gate, &L->shared.up};
                    S_(up_stack(g, &G->sh_gu, gu, 2));
                    S_(up_w(g, &G->sh_down, &L->shared.down));
                    g->ffn_w_max = ST_MAX(g->ffn_w_max, L->shared.gate.rows);
                }
                if (L->experts) {
                    size_t es = (size_t)mi * ew;
                    S_(galloc(g, (void **)&G->ex_w1, (size_t)n * es * 2));
                    S_(galloc(g, (void **)&G->ex_w3, (size_t)n * es * 2));
                    S_(galloc(g, (void **)&G->ex_w2, (size_t)n * es * 2));
                    for (int j = 0; s == ST_OK && j < n; j++) {
                        S_(up_rows(G->ex_w1 + (size_t)j * es, &L->experts[j].gate));
                        S_(up_rows(G->ex_w3 + (size_t)j * es, &L->experts[j].up));
                        S_(up_rows(G->ex_w2 + (size_t)j * es, &L->experts[j].down));
                    }
                }
            } else {
                const st_weight_t *gu[2] = {&L->dense.gate, &L->dense.up};
                S_(up_stack(g, &G->dense_gu, gu, 2));
                S_(up_w(g, &G->dense_down, &L->dense.down));
                g->ffn_w_max = ST_MAX(g->ffn_w_max, L->dense.gate.rows);
            }
        } while (0);
#undef S_
    }
    free(convh);
    return s;
}

/* ------------------------------------------------------------------ create / destroy */

static st_status_t build_attnres(st_egpu_t *g, const st_engine_w_t *W) {
    const st_config_t *c = &g->c;
    int B = c->attn_res_block, L = c->n_layers, d = c->d;
    g->q_attn = calloc((size_t)L, sizeof(int));
    g->q_mlp = calloc((size_t)L, sizeof(int));
    if (!g->q_attn || !g->q_mlp) return ST_FAIL(ST_ERR_NO_MEMORY, "attnres tables");
    if (B <= 0) return ST_OK;
    g->n_blocks = (L + B - 1) / B;
    g->bq = calloc((size_t)g->n_blocks, sizeof(gbq_t));
    float *hw = malloc((size_t)2 * (B + 1) * d * sizeof(float));
    if (!g->bq || !hw) {
        free(hw);
        return ST_FAIL(ST_ERR_NO_MEMORY, "attnres tables");
    }
    st_status_t s = ST_OK;
    /* NOTE: the same query order as engine.c build_attnres_queries */
    for (int b = 0; s == ST_OK && b < g->n_blocks; b++) {
        int l0 = b * B, l1 = ST_MIN(l0 + B, L), q = 0;
        for (int l = l0; l < l1; l++) {
            if (l > l0) {
                g->q_attn[l] = q;
                memcpy(hw + (size_t)q++ * d, W->layers[l].attn_res, (size_t)d * sizeof(float));
            }
            g->q_mlp[l] = q;
            memcpy(hw + (size_t)q++ * d, W->layers[l].mlp_res, (size_t)d * sizeof(float));
        }
        const float *last = l1 < L ? W->layers[l1].attn_res : W->out_res;
        if (l1 < L) g->q_attn[l1] = q;
        else g->q_out = q;
        memcpy(hw + (size_t)q++ * d, last, (size_t)d * sizeof(float));
        g->bq[b].Q = q;
        g->Qmax = ST_MAX(g->Qmax, q);
        s = up_vec(g, &g->bq[b].w, hw, q * d);
    }
    free(hw);
    return s;
}

static st_egpu_t *prof_engine; /* the engine created with STRATA_EGPU_PROF (one per process) */

void st_egpu_destroy(st_egpu_t *g) {
    if (!g) return;
    st_egpu_mb_destroy(g->mb);
    if (g->pf_ev) eg_events_destroy(g->pf_ev, EGPU_PROF_EVENTS);
    free(g->pf_ev), free(g->pf_grp);
    eg_host_free(g->pf_gate);
    if (prof_engine == g) prof_engine = NULL;
    for (int i = 0; i < g->n_allocs; i++) st_gpu_free(g->allocs[i]);
    free(g->allocs);
    for (int i = 0; i < EGPU_GRAPHS; i++) st_gpu_graph_destroy(g->gr[i].exec);
    eg_events_destroy(&g->open_ev, 1);
    eg_events_destroy(&g->chain_ev, 1);
    if (g->s.stream) st_gpu_stream_destroy(&g->s);
    free(g->L); free(g->layer_slot); free(g->q_attn); free(g->q_mlp); free(g->bq);
    free(g->seq_used); free(g->seq_busy); free(g->seq_len); free(g->free_pages); free(g->seq_npages);
    free(g->seq_pageid); free(g->tau); free(g->tr_f); free(g->tr_raw);
    free(g);
}

st_status_t st_egpu_create(st_egpu_t **out, const st_ckpt_t *ck, const st_engine_opts_t *opts) {
    st_status_t s;
    st_egpu_t *g = calloc(1, sizeof *g);
    if (!g) return ST_FAIL(ST_ERR_NO_MEMORY, "gpu engine");
    g->c = *st_ckpt_config(ck);
    g->o = *opts;
    const st_config_t *c = &g->c;
    if (g->o.kv_page_size <= 0) g->o.kv_page_size = 64;
    if (g->o.max_seqs <= 0 || g->o.max_batch_tokens <= 0 || g->o.max_ctx <= 0) {
        free(g);
        return ST_FAIL(ST_ERR_INVALID_ARG, "engine: max_seqs, max_batch_tokens and max_ctx must be positive");
    }
#ifdef ST_EGPU_HAVE_MOE_FFN
    /* STRATA_EGPU_MOE=cublas picks the per-expert cuBLAS path (comparisons, benchmarks) */
    const char *mp = getenv("STRATA_EGPU_MOE");
    g->grouped = !(mp && !strcmp(mp, "cublas"));
#endif
    /* STRATA_EGPU_MLA32=1: fp32 MLA scores (comparisons; no accuracy gain measured, docs/perf.md) */
    const char *ev = getenv("STRATA_EGPU_MLA32");
    g->mla32 = ev && atoi(ev) != 0;
    ev = getenv("STRATA_EGPU_KDA_REC");
    g->kda_rec = ev && atoi(ev) != 0;
    ev = getenv("STRATA_EGPU_XSPLIT");
    g->xsplit = ev ? atoi(ev) : 0;
    if (g->xsplit >= 2) g->mla32 = g->kda_rec = true;
    ev = getenv("STRATA_EGPU_AR_V1");
    g->ar_v1 = ev && atoi(ev) != 0;
    ev = getenv("STRATA_EGPU_GRAPHS");
    g->graphs = !ev || atoi(ev) != 0;
    ev = getenv("STRATA_EGPU_HOST_ROUTE");
    g->host_route = ev && atoi(ev) != 0;
    ev = getenv("STRATA_EGPU_PROF");
    g->prof = ev && atoi(ev) != 0;
    int kmax = g->o.k_max > 0 ? g->o.k_max : 2 * c->top_k;
    g->o.k_max = ST_MIN(kmax, ST_MAX(c->n_experts, 1));
    g->kcap = ST_MAX(c->top_k, g->o.routing == ST_ROUTE_QUANTILE ? g->o.k_max : 0);
    if (g->kcap <= 0) g->kcap = 1;
    g->P = c->kda_heads * c->kda_head_dim;
    g->R = c->kv_lora_rank + c->qk_rope;
    if (c->kda_head_dim > 128 || (c->kv_lora_rank % 32) || c->kv_lora_rank > 512 || g->R > 1024 ||
        c->top_k > 32 || (c->n_experts > 0 && st_config_expert_width(c) % 2)) {
        s = ST_FAIL(ST_ERR_CONFIG, "gpu engine: unsupported widths (KDA head_dim %d ≤ 128, kv_lora_rank %d ≤ 512 and "
                    "a multiple of 32, top_k %d ≤ 32)", c->kda_head_dim, c->kv_lora_rank, c->top_k);
        free(g);
        return s;
    }
    if (st_gpu_device_count() <= opts->device) {
        free(g);
        return ST_FAIL(ST_ERR_INVALID_ARG, "gpu engine: no CUDA device %d (%d found)", opts->device, st_gpu_device_count());
    }
    if ((s = st_gpu_init(opts->device)) != ST_OK || (s = st_gpu_stream_create(&g->s)) != ST_OK) {
        free(g);
        return s;
    }
    st_engine_w_t W;
    s = st_engine_bind(&W, ck, !g->o.remote_experts);
    if (s != ST_OK) {
        st_engine_unbind(&W);
        st_egpu_destroy(g);
        return s;
    }
    double t0 = st_time_sec();
    g->L = calloc((size_t)c->n_layers, sizeof(gl_t));
    g->layer_slot = calloc((size_t)c->n_layers, sizeof(int));
    if (!g->L || !g->layer_slot) s = ST_FAIL(ST_ERR_NO_MEMORY, "gpu engine tables");
    for (int l = 0; s == ST_OK && l < c->n_layers; l++) g->layer_slot[l] = c->is_mla[l] ? g->n_mla++ : g->n_kda++;
    if (s == ST_OK) s = upload(g, &W);
    if (s == ST_OK) s = build_attnres(g, &W);
    st_engine_unbind(&W);
    if (s != ST_OK) goto err;

    /* state pools */
    int M = g->o.max_seqs;
    g->S_per = (size_t)c->kda_heads * c->kda_head_dim * c->kda_head_dim;
    g->conv_per = (size_t)(c->conv_k - 1) * 3 * g->P;
    g->page_size = g->o.kv_page_size;
    g->pps = (g->o.max_ctx + g->page_size - 1) / g->page_size;
    g->n_pages = g->o.kv_pages > 0 ? g->o.kv_pages : M * g->n_mla * g->pps;
    g->seq_used = calloc((size_t)M, sizeof(bool));
    g->seq_busy = calloc((size_t)M, sizeof(bool));
    g->seq_len = calloc((size_t)M, sizeof(int));
    g->free_pages = malloc((size_t)g->n_pages * sizeof(int) + 4);
    g->seq_npages = calloc((size_t)M * g->n_mla + 1, sizeof(int));
    g->seq_pageid = calloc((size_t)M * g->n_mla * g->pps + 1, sizeof(int));
    g->tau = calloc((size_t)c->n_layers * ST_MAX(c->n_experts, 1), sizeof(float));
    if (!g->seq_used || !g->seq_busy || !g->seq_len || !g->free_pages || !g->seq_npages || !g->seq_pageid || !g->tau) {
        s = ST_FAIL(ST_ERR_NO_MEMORY, "gpu engine tables");
        goto err;
    }
    for (int i = 0; i < g->n_pages; i++) g->free_pages[i] = g->n_pages - 1 - i;
    g->n_free = g->n_pages;
    size_t sbytes = (size_t)g->n_kda * M * g->S_per * sizeof(float);
    size_t cbytes = (size_t)g->n_kda * M * g->conv_per * sizeof(float);
    size_t kvbytes = (size_t)g->n_pages * g->page_size * g->R * (g->mla32 ? 4 : 2);
    if ((s = galloc(g, (void **)&g->kda_S, sbytes)) != ST_OK || (s = galloc(g, (void **)&g->kda_conv, cbytes)) != ST_OK ||
        (s = galloc(g, (void **)&g->kv_pool, kvbytes)) != ST_OK)
        goto err;
    g->mla_ws_bytes = st_cuda_mla_decode_ws_bytes(M, ST_MAX(c->mla_heads, 1), g->o.max_ctx, MLA_SPLIT);
    if ((s = galloc(g, &g->mla_ws, g->mla_ws_bytes)) != ST_OK) goto err;
    if ((s = galloc(g, (void **)&g->tau_d, (size_t)c->n_layers * ST_MAX(c->n_experts, 1) * sizeof(float))) != ST_OK ||
        (s = eg_event_create_sync(&g->open_ev)) != ST_OK || (s = eg_event_create_sync(&g->chain_ev)) != ST_OK)
        goto err;
    {
        /* MLA direct form for prompt chunks (mla_direct): the prefill kernel's head shapes, bf16 cache */
        int dqk = c->qk_nope + c->qk_rope, dv = c->v_head_dim, H = c->mla_heads;
        bool shape = (dqk == 192 && dv == 128) || (dqk == 128 && dv == 128) || (dqk == 64 && dv == 64) ||
                     (dqk == 48 && dv == 32);
        ev = getenv("STRATA_EGPU_MLA_DIRECT");
        g->mla_dmin = g->n_mla > 0 && shape && !g->mla32 && g->R % 8 == 0 && !(ev && atoi(ev) == 0) ? MLA_DIRECT_MIN : 0;
        size_t mc = (size_t)g->o.max_ctx;
        if (g->mla_dmin &&
            ((s = galloc(g, (void **)&g->dc, mc * g->R * 2)) != ST_OK ||
             (s = galloc(g, (void **)&g->dY, mc * H * (c->qk_nope + dv) * 2)) != ST_OK ||
             (s = galloc(g, (void **)&g->dK, mc * H * dqk * 2)) != ST_OK ||
             (s = galloc(g, (void **)&g->dV, mc * H * dv * 2)) != ST_OK ||
             (s = galloc(g, (void **)&g->dod, (size_t)g->o.max_batch_tokens * H * dv * 2)) != ST_OK))
            goto err;
    }
    if (!g->o.remote_experts) {
        s = mb_create(g, &g->mb, true);
        if (s != ST_OK) goto err;
    }
    if (g->prof && prof_engine) {
        st_log_error("gpu engine: STRATA_EGPU_PROF: another engine of this process profiles; not this one");
        g->prof = false;
    }
    if (g->prof) {
        g->pf_ev = calloc(EGPU_PROF_EVENTS, sizeof(void *));
        g->pf_grp = calloc(EGPU_PROF_EVENTS, 1);
        if (!g->pf_ev || !g->pf_grp) s = ST_FAIL(ST_ERR_NO_MEMORY, "gpu engine: profiling tables");
        if (s == ST_OK) s = eg_events_create(g->pf_ev, EGPU_PROF_EVENTS);
        if (s == ST_OK) s = eg_host_alloc((void **)&g->pf_gate, 2 * sizeof(int));
        if (s != ST_OK) goto err;
        g->pf_gate[0] = 1, g->pf_gate[1] = 0;
        prof_engine = g;
    }
    char dev[256];
    st_gpu_describe(dev, sizeof dev);
    st_log_info("gpu engine on %s: %d layers (%d KDA, %d MLA), %d seqs × %d ctx, %d tokens/step, state %.1f MiB, "
                "cache %.1f MiB (%d pages of %d rows), experts %s, weights uploaded in %.1f s%s%s",
                dev, c->n_layers, g->n_kda, g->n_mla, M, g->o.max_ctx, g->o.max_batch_tokens,
                (double)(sbytes + cbytes) / (1 << 20), (double)kvbytes / (1 << 20), g->n_pages, g->page_size,
                g->grouped ? "grouped (st_cuda_moe_ffn)" : "per-expert cuBLAS", st_time_sec() - t0,
                g->ar_v1 ? ", AttnRes v1 kernels" : "", g->prof ? ", per-op GPU timing on" : "");
    *out = g;
    return ST_OK;
err:
    st_egpu_destroy(g);
    return s;
}

/* ------------------------------------------------------------------ sequences */

/* NOTE: the CUDA runtime's current device is per thread; the worker drives the engine from its
 * compute thread, so every entry point that touches the device selects it first (cheap). */
#define USE_DEVICE(g) TRY(st_gpu_init((g)->o.device))

st_status_t st_egpu_seq_open(st_egpu_t *g, int *slot) {
    USE_DEVICE(g);
    int M = g->o.max_seqs;
    for (int i = 0; i < M; i++) {
        if (g->seq_used[i]) continue;
        for (int ks = 0; ks < g->n_kda; ks++) {
            TRY(eg_memset_async(&g->s, g->kda_S + ((size_t)ks * M + i) * g->S_per, 0, g->S_per * sizeof(float)));
            TRY(eg_memset_async(&g->s, g->kda_conv + ((size_t)ks * M + i) * g->conv_per, 0, g->conv_per * sizeof(float)));
        }
        g->seq_used[i] = true;
        g->seq_len[i] = 0;
        *slot = i;
        return ST_OK;
    }
    return ST_FAIL(ST_ERR_CAPACITY, "all %d sequence slots are in use", M);
}

void st_egpu_seq_close(st_egpu_t *g, int slot) {
    if (slot < 0 || slot >= g->o.max_seqs || !g->seq_used[slot]) return;
    if (g->seq_busy[slot]) {
        st_log_error("engine: slot %d closed while its micro-batch is in flight; ignored", slot);
        return;
    }
    for (int m = 0; m < g->n_mla; m++) {
        int *np = &g->seq_npages[slot * g->n_mla + m];
        int *ids = &g->seq_pageid[((size_t)slot * g->n_mla + m) * g->pps];
        for (int p = 0; p < *np; p++) g->free_pages[g->n_free++] = ids[p];
        *np = 0;
    }
    g->seq_used[slot] = false;
    g->seq_len[slot] = 0;
}

int st_egpu_seq_len(const st_egpu_t *g, int slot) {
    return (slot >= 0 && slot < g->o.max_seqs && g->seq_used[slot]) ? g->seq_len[slot] : -1;
}

void st_egpu_set_thresholds(st_egpu_t *g, const float *tau, uint64_t version) {
    if (!tau) {
        g->tau_set = false;
        return;
    }
    size_t bytes = (size_t)g->c.n_layers * g->c.n_experts * sizeof(float);
    memcpy(g->tau, tau, bytes);
    /* NOTE: between steps (engine.h), so no micro-batch stream reads tau_d now */
    if (st_gpu_init(g->o.device) != ST_OK || st_gpu_memcpy_h2d(g->tau_d, tau, bytes) != ST_OK) {
        st_log_error("gpu engine: thresholds not uploaded (%s); top-k routing until the next set", st_err_last());
        g->tau_set = false;
        return;
    }
    g->tau_set = true;
    g->tau_version = version;
}

void st_egpu_set_route_hook(st_egpu_t *g, st_route_hook_t fn, void *ctx) {
    g->hook = fn;
    g->hook_ctx = ctx;
}

void st_egpu_set_route_observer(st_egpu_t *g, st_route_observer_t fn, void *ctx) {
    g->obs = fn;
    g->obs_ctx = ctx;
}

void st_egpu_get_stats(const st_egpu_t *g, st_engine_stats_t *out) { *out = g->stats; }

void st_egpu_set_trace_hook(st_egpu_t *g, st_trace_hook_t fn, void *ctx) {
    const st_config_t *c = &g->c;
    if (fn && !g->tr_f) { /* test-only: host staging sized for the widest traced row */
        size_t w = (size_t)ST_MAX(c->d, 3 * g->P);
        w = ST_MAX(w, (size_t)ST_MAX(c->mla_heads, 1) * (c->qk_nope + c->qk_rope + c->v_head_dim));
        w = ST_MAX(w, (size_t)st_config_expert_width(c));
        g->tr_w = w;
        g->tr_f = malloc((size_t)g->o.max_batch_tokens * w * sizeof(float));
        g->tr_raw = malloc((size_t)g->o.max_batch_tokens * w * sizeof(float));
        if (!g->tr_f || !g->tr_raw) {
            free(g->tr_f), free(g->tr_raw);
            g->tr_f = NULL, g->tr_raw = NULL;
            st_log_error("gpu engine: no memory for the trace buffers; trace off");
            fn = NULL;
        }
    }
    g->trace = fn;
    g->trace_ctx = ctx;
}

/* Test-only trace point (engine.h): copy rows [T, w] (row stride ld; bf16 or fp32) to the host,
 * call the hook, and with writable (fp32, ld == w) copy the hook's values back. Synchronises. */
static void gtrace(st_egpu_mb_t *mb, int l, int pt, void *src, bool bf16, int w, int ld, bool writable) {
    st_egpu_t *g = mb->g;
    if (!g->trace) return;
    int T = mb->T;
    size_t es = bf16 ? 2 : 4, bytes = ((size_t)(T - 1) * ld + w) * es;
    prof_release(g); /* NOTE: before any copy to pageable memory too: such a copy waits for the stream */
    CK(eg_memcpy_async(mb->s, g->tr_raw, src, bytes, 2));
    CK(st_gpu_stream_sync(mb->s));
    for (int t = 0; t < T; t++)
        for (int c = 0; c < w; c++)
            g->tr_f[(size_t)t * w + c] = bf16 ? st_bf16_to_f32(((const st_bf16_t *)g->tr_raw)[(size_t)t * ld + c])
                                              : ((const float *)g->tr_raw)[(size_t)t * ld + c];
    g->trace(g->trace_ctx, l, pt, T, w, g->tr_f);
    if (writable && !bf16 && ld == w) {
        CK(eg_memcpy_async(mb->s, src, g->tr_f, (size_t)T * w * sizeof(float), 1));
        CK(st_gpu_stream_sync(mb->s));
    }
}

/* ------------------------------------------------------------------ per-op GPU timing (STRATA_EGPU_PROF) */

static const char *const prof_names[ST_EGPU_PROF_N] = {"attnres_phase1", "attnres_norm", "ref_norm", "norm",
                                                       "kda_core", "mla_core", "trunk_gemm", "router",
                                                       "experts", "combine", "lm_head", "other",
                                                       "embed"};
const char *st_egpu_prof_name(int group) { return group >= 0 && group < ST_EGPU_PROF_N ? prof_names[group] : "?"; }
st_egpu_t *st_egpu_prof_engine(void) { return prof_engine; }
void st_egpu_prof_pause(st_egpu_t *g, bool paused) {
    if (g) g->prof_paused = paused;
}
void st_egpu_prof_take(st_egpu_t *g, st_egpu_prof_t *out) {
    if (!g) {
        memset(out, 0, sizeof *out);
        return;
    }
    *out = g->pf;
    memset(&g->pf, 0, sizeof g->pf);
}

static void prof_mark_slow(st_egpu_t *g, int grp) {
    if (g->pf_n >= EGPU_PROF_EVENTS - 1) { /* the last event is the step's end */
        g->pf.overflows++;
        return;
    }
    if (eg_event_record(g->pf_ev[g->pf_n], &g->s) != ST_OK) return;
    g->pf_grp[g->pf_n++] = (unsigned char)grp;
    g->pf_cur = grp;
}
/* The ops queued from here on belong to group grp (until the next mark). */
static inline void prof_mark(st_egpu_t *g, int grp) {
    if (g->pf_step && g->pf_cur != grp) prof_mark_slow(g, grp);
}
/* Before any host sync of a profiled step: let the gate go. */
static inline void prof_release(st_egpu_t *g) {
    if (g->pf_gate_held) {
        __atomic_store_n(&g->pf_gate[0], 1, __ATOMIC_SEQ_CST);
        g->pf_gate_held = false;
    }
}
static void prof_begin(st_egpu_mb_t *mb) {
    st_egpu_t *g = mb->g;
    g->pf_step = g->prof && !g->prof_paused && mb->internal;
    if (!g->pf_step) return;
    g->pf_n = 0;
    g->pf_cur = -1;
    g->pf_t0 = st_time_sec();
    __atomic_store_n(&g->pf_gate[0], 0, __ATOMIC_SEQ_CST);
    g->pf_gate_held = eg_gate(&g->s, g->pf_gate, EGPU_GATE_NS) == ST_OK;
    if (!g->pf_gate_held) g->pf_gate[0] = 1;
}
/* After the step's last op is queued: the end event; after the sync: the sums. */
static void prof_end_queue(st_egpu_t *g) {
    if (!g->pf_step) return;
    if (g->pf_n > 0 && eg_event_record(g->pf_ev[g->pf_n], &g->s) != ST_OK) g->pf_n = 0;
    prof_release(g);
}
static void prof_end_sum(st_egpu_mb_t *mb) {
    st_egpu_t *g = mb->g;
    if (!g->pf_step) return;
    for (int i = 0; i < g->pf_n; i++) {
        double ms = eg_event_ms(g->pf_ev[i], g->pf_ev[i + 1]);
        if (ms > 0) g->pf.ms[g->pf_grp[i]] += ms;
    }
    g->pf.wall_ms += (st_time_sec() - g->pf_t0) * 1e3;
    g->pf.steps++;
    g->pf.tokens += mb->T;
    g->pf.gate_timeouts += g->pf_gate[1];
    g->pf_gate[1] = 0;
    g->pf_step = false;
}

/* ------------------------------------------------------------------ micro-batch buffers */

static void *dcarve(st_gpu_arena_t *a, size_t *need, size_t bytes) {
    *need += (bytes + 255) & ~(size_t)255;
    return a->base ? st_gpu_arena_alloc(a, bytes ? bytes : 1) : NULL;
}

static size_t ffn_ws_bytes(const st_egpu_t *g, int N) {
#ifdef ST_EGPU_HAVE_MOE_FFN
    return g->c.n_experts > 0 && g->grouped ? st_cuda_moe_ffn_ws_bytes(N, g->c.moe_inter) : 0;
#else
    (void)g, (void)N;
    return 0;
#endif
}

/* With a.base NULL only counts; returns device and pinned byte totals. */
static void mb_carve(st_egpu_mb_t *mb, size_t *dneed, size_t *pneed) {
    const st_egpu_t *g = mb->g;
    const st_config_t *c = &g->c;
    size_t T = (size_t)g->o.max_batch_tokens, d = (size_t)c->d, P = (size_t)g->P, F = 4, B2 = 2;
    size_t H = (size_t)c->kda_heads, M = (size_t)g->o.max_seqs;
    size_t Hm = (size_t)ST_MAX(c->mla_heads, 1), dqk = (size_t)(c->qk_nope + c->qk_rope), R = (size_t)g->R;
    size_t wide = ST_MAX(P, Hm * (size_t)c->v_head_dim);
    size_t n = (size_t)ST_MAX(c->n_experts, 1), kc = (size_t)g->kcap, ew = (size_t)st_config_expert_width(c);
    size_t fw = (size_t)ST_MAX(g->ffn_w_max, 1);
    size_t nb = (size_t)ST_MAX(g->n_blocks, 1), Q = (size_t)ST_MAX(g->Qmax, 1);
    size_t LR = ST_MIN(T, (size_t)LOGIT_ROWS), V = (size_t)c->vocab;
    st_gpu_arena_t *a = &mb->dev;
    *dneed = 0;
#define DC(f, bytes) mb->f = dcarve(a, dneed, (bytes))
    DC(partial, T * d * F); DC(blocks, nb * T * d * F); DC(stats, T * Q * 2 * F); DC(acc, T * Q * d * F);
    DC(xn, T * d * B2); DC(qkv, T * 3 * P * F); DC(cqkv, T * 3 * P * F); DC(aux, T * (size_t)ST_MAX(g->naux_max, 1) * F);
    DC(q, T * P * B2); DC(k, T * P * B2); DC(v, T * P * B2); DC(f, T * P * B2);
    DC(q32, T * P * F); DC(k32, T * P * F); DC(v32, T * P * F); DC(o32, T * wide * F); DC(gf, T * P * F); DC(beta, T * H * F);
    DC(o, T * wide * B2); DC(gate, T * wide * F);
    DC(cq, T * (size_t)ST_MAX(c->q_lora_rank, 1) * B2); DC(cq32, T * (size_t)ST_MAX(c->q_lora_rank, 1) * F); DC(qm, T * Hm * dqk * B2); DC(qm32, T * Hm * dqk * F);
    DC(ckv, T * R * F); DC(qabs, T * Hm * R * F); DC(olat, T * Hm * (size_t)ST_MAX(c->kv_lora_rank, 1) * B2);
    DC(h2, T * 2 * fw * F); DC(hh, T * fw * B2);
    DC(scores, T * n * F); DC(wts, T * kc * F); DC(ids, T * kc * 4); DC(cnt, T * 4);
    DC(offsets, (n + 1) * 4); DC(row_of, T * kc * 4); DC(z, T * ew * B2); DC(un, T * ew * B2);
    if (c->n_experts > 0 && !g->o.remote_experts) {
        DC(xg, T * kc * ew * B2); DC(yg, T * kc * ew * F);
        DC(hs, ST_MIN(T * kc, (size_t)EG_SLOTS_CAP) * (size_t)ST_MAX(c->moe_inter, 1) * B2);
        if (!g->grouped) {
            size_t mi = (size_t)ST_MAX(c->moe_inter, 1);
            DC(h2e, T * kc * 2 * mi * F); DC(he, T * kc * mi * B2);
        }
        mb->ffn_ws_bytes = ffn_ws_bytes(g, (int)(T * kc));
        DC(ffn_ws, mb->ffn_ws_bytes);
    }
    if (!mb->internal && c->n_experts > 0) {
        DC(zf, T * ew * F); DC(eout, T * kc * ew * F);
    }
    DC(xf, T * d * B2); DC(lg, LR * V * F); DC(amax_d, T * 4);
    if (g->xsplit) {
        DC(xn_lo, T * d * B2); DC(xf_lo, T * d * B2); DC(o_lo, T * wide * B2); DC(un_lo, T * ew * B2);
        DC(hh_lo, T * fw * B2); DC(z32, T * ew * F);
        DC(cq_lo, T * (size_t)ST_MAX(c->q_lora_rank, 1) * B2); DC(olat_lo, T * Hm * (size_t)ST_MAX(c->kv_lora_rank, 1) * B2);
    }
    size_t meta = 4 * T + 3 * M + 1 + (size_t)g->n_mla * M * (size_t)g->pps;
    DC(meta_d, meta * 4);
#undef DC
    a = &mb->pin;
    *pneed = 0;
#define PC(f, bytes) mb->f = dcarve(a, pneed, (bytes))
    PC(meta_h, meta * 4); PC(amax_h, T * 4); PC(ids_h, T * kc * 4); PC(cnt_h, T * 4); PC(offsets_h, (n + 1) * 4); PC(scores_h, T * n * F); PC(wq_h, T * kc * F);
    if (!mb->internal && c->n_experts > 0) {
        PC(z_h, T * ew * F); PC(out_h, T * kc * ew * F);
    }
#undef PC
}

static st_status_t mb_create(st_egpu_t *g, st_egpu_mb_t **out, bool internal) {
    st_egpu_mb_t *mb = calloc(1, sizeof *mb);
    if (!mb) return ST_FAIL(ST_ERR_NO_MEMORY, "micro-batch");
    mb->g = g;
    mb->internal = internal;
    mb->s = &g->s;
    if (!internal) {
        st_status_t se = st_gpu_stream_create(&mb->own);
        if (se == ST_OK && (se = eg_event_create_sync(&mb->ev)) != ST_OK) st_gpu_stream_destroy(&mb->own);
        if (se != ST_OK) {
            free(mb);
            return se;
        }
        mb->s = &mb->own;
    }
    mb->ents = calloc((size_t)g->o.max_seqs, sizeof(gent_t));
    mb->need = calloc((size_t)g->o.max_batch_tokens + 1, 1);
    if (!mb->need) {
        free(mb->ents);
        mb->ents = NULL;
    }
    size_t dn, pn;
    mb_carve(mb, &dn, &pn);
    st_status_t s = mb->ents ? st_gpu_arena_init(&mb->dev, dn + 4096, 0) : ST_FAIL(ST_ERR_NO_MEMORY, "micro-batch");
    if (s == ST_OK) {
        s = st_gpu_arena_init(&mb->pin, pn + 4096, 1);
        if (s != ST_OK) st_gpu_arena_cleanup(&mb->dev);
    }
    if (s != ST_OK) {
        if (!internal) {
            eg_events_destroy(&mb->ev, 1);
            st_gpu_stream_destroy(&mb->own);
        }
        free(mb->ents);
        free(mb->need);
        free(mb);
        return s;
    }
    mb_carve(mb, &dn, &pn);
    *out = mb;
    return ST_OK;
}

st_status_t st_egpu_mb_create(st_egpu_t *g, st_egpu_mb_t **out) {
    USE_DEVICE(g);
    return mb_create(g, out, false);
}

void st_egpu_mb_destroy(st_egpu_mb_t *mb) {
    if (!mb) return;
    st_gpu_stream_sync(mb->s);
    if (!mb->internal) {
        eg_events_destroy(&mb->ev, 1);
        st_gpu_stream_destroy(&mb->own);
    }
    st_gpu_arena_cleanup(&mb->dev);
    st_gpu_arena_cleanup(&mb->pin);
    free(mb->ents);
    free(mb->need);
    free(mb);
}

/* ------------------------------------------------------------------ begin */

static st_status_t validate(st_egpu_t *g, const st_seq_chunk_t *seqs, int n_seqs, gent_t *ents, int *T_out) {
    const st_config_t *c = &g->c;
    if (n_seqs <= 0 || n_seqs > g->o.max_seqs)
        return ST_FAIL(ST_ERR_INVALID_ARG, "step: %d sequences (1..%d allowed)", n_seqs, g->o.max_seqs);
    int T = 0, pages = 0;
    for (int i = 0; i < n_seqs; i++) {
        const st_seq_chunk_t *s = &seqs[i];
        if (s->slot < 0 || s->slot >= g->o.max_seqs || !g->seq_used[s->slot])
            return ST_FAIL(ST_ERR_INVALID_ARG, "step: sequence slot %d is not open", s->slot);
        if (g->seq_busy[s->slot]) return ST_FAIL(ST_ERR_INVALID_ARG, "step: slot %d is already in a micro-batch", s->slot);
        for (int j = 0; j < i; j++)
            if (seqs[j].slot == s->slot) return ST_FAIL(ST_ERR_INVALID_ARG, "step: slot %d given twice", s->slot);
        if (s->n_tokens <= 0 || !s->tokens) return ST_FAIL(ST_ERR_INVALID_ARG, "step: slot %d has no tokens", s->slot);
        for (int t = 0; t < s->n_tokens; t++)
            if (s->tokens[t] < 0 || s->tokens[t] >= c->vocab)
                return ST_FAIL(ST_ERR_OUT_OF_RANGE, "step: token id %d outside vocabulary 0..%d", s->tokens[t], c->vocab - 1);
        int len = g->seq_len[s->slot];
        if (len + s->n_tokens > g->o.max_ctx)
            return ST_FAIL(ST_ERR_CAPACITY, "step: sequence would reach %d tokens, limit %d", len + s->n_tokens, g->o.max_ctx);
        int have = (len + g->page_size - 1) / g->page_size;
        int want = (len + s->n_tokens + g->page_size - 1) / g->page_size;
        pages += (want - have) * g->n_mla;
        ents[i] = (gent_t){.slot = s->slot, .n = s->n_tokens, .off = T, .pos0 = len};
        T += s->n_tokens;
    }
    if (T > g->o.max_batch_tokens)
        return ST_FAIL(ST_ERR_CAPACITY, "step: %d tokens exceed the %d-token step budget", T, g->o.max_batch_tokens);
    if (pages > g->n_free)
        return ST_FAIL(ST_ERR_CAPACITY, "step: latent cache full (%d pages needed, %d free)", pages, g->n_free);
    *T_out = T;
    return ST_OK;
}

static void grow_pages(st_egpu_t *g, const gent_t *en) {
    int want = (en->pos0 + en->n + g->page_size - 1) / g->page_size;
    for (int m = 0; m < g->n_mla; m++) {
        int *np = &g->seq_npages[en->slot * g->n_mla + m];
        size_t base = ((size_t)en->slot * g->n_mla + m) * g->pps;
        while (*np < want) g->seq_pageid[base + (*np)++] = g->free_pages[--g->n_free];
    }
}

st_status_t st_egpu_mb_begin(st_egpu_mb_t *mb, const st_seq_chunk_t *seqs, int n_seqs, float *logits) {
    st_egpu_t *g = mb->g;
    if (mb->busy) return ST_FAIL(ST_ERR_INVALID_ARG, "micro-batch is still in flight");
    USE_DEVICE(g);
    int T = 0;
    TRY(validate(g, seqs, n_seqs, mb->ents, &T));
    /* step metadata, packed: tok, tok_ent, tok_pos, rows [T]; cu [n+1]; slot, len [n]; btab [n_mla][n][pps] */
    int n = n_seqs, pps = g->pps, *h = mb->meta_h;
    int *tok = h, *tent = h + T, *tpos = h + 2 * T, *rows = h + 3 * T, *cu = h + 4 * T, *slot = cu + n + 1,
        *len = slot + n, *bt = len + n;
    int nr = 0;
    mb->all_decode = true;
    for (int i = 0; i < n; i++) {
        gent_t *en = &mb->ents[i];
        grow_pages(g, en);
        g->seq_busy[en->slot] = true;
        cu[i] = en->off;
        slot[i] = en->slot;
        len[i] = en->pos0 + en->n;
        if (en->n != 1) mb->all_decode = false;
        mb->max_len = i == 0 || len[i] > mb->max_len ? len[i] : mb->max_len;
        for (int t = 0; t < en->n; t++) {
            tok[en->off + t] = seqs[i].tokens[t];
            tent[en->off + t] = i;
            tpos[en->off + t] = en->pos0 + t;
        }
        for (int t = seqs[i].all_logits ? 0 : en->n - 1; t < en->n; t++) rows[nr++] = en->off + t;
        for (int m = 0; m < g->n_mla; m++)
            memcpy(bt + ((size_t)m * n + i) * pps, g->seq_pageid + ((size_t)en->slot * g->n_mla + m) * pps,
                   (size_t)pps * sizeof(int));
    }
    cu[n] = T;
    size_t words = (size_t)(bt - h) + (size_t)g->n_mla * n * pps;
    int *d = mb->meta_d;
    mb->d_tok = d, mb->d_tok_ent = d + T, mb->d_tok_pos = d + 2 * T, mb->d_rows = d + 3 * T, mb->d_cu = d + 4 * T;
    mb->d_slot = mb->d_cu + n + 1, mb->d_len = mb->d_slot + n, mb->d_btab = mb->d_len + n;
    mb->seqs = seqs;
    mb->n_seqs = n;
    mb->T = T;
    mb->n_rows = nr;
    mb->logits = logits;
    mb->l = 0;
    mb->nb = 0;
    mb->waiting = false;
    mb->busy = true;
    mb->pend = 0;
    mb->err = ST_OK;
    mb->t0 = st_time_sec();
    mb->words = words;
    mb->fresh = true;
    /* decode: the MLA split bound rounded up to a power of two, so a captured step (graph) serves
     * every context length of its bucket; the kernel reads the real lengths */
    if (mb->all_decode) {
        int b = 512;
        while (b < mb->max_len && b < g->o.max_ctx) b *= 2;
        mb->max_len = ST_MIN(b, g->o.max_ctx);
    }
    prof_begin(mb);
    return ST_OK;
}

/* Micro-batches (not st_engine_step's) run their compute one after another in launch order: each
 * launch's compute starts after the previous launch's (chain_wait, after its host-to-device
 * copies are queued) and ends with chain_record (before its device-to-host copies are queued).
 * Concurrent chunks would finish together and reach the expert servers together, leaving both
 * sides idle in turn; in order, the first hand-off is ready after one chunk, and each micro-batch's
 * copies overlap the next one's compute. It also keeps the engine-wide MLA scratch (mla_ws, the
 * direct-form buffers) to one micro-batch at a time. */
static void chain_wait(st_egpu_mb_t *mb) {
    if (!mb->internal) CK(eg_stream_wait(mb->s, mb->g->chain_ev));
}
static void chain_record(st_egpu_mb_t *mb) {
    if (!mb->internal) CK(eg_event_record(mb->g->chain_ev, mb->s));
}

/* The start of a step's device work (in launch, so that a graph captures it): metadata up, embed. */
static void queue_begin(st_egpu_mb_t *mb) {
    st_egpu_t *g = mb->g;
    prof_mark(g, ST_EGPU_PROF_EMBED);
    if (mb->s != &g->s) { /* after the state resets of st_egpu_seq_open */
        CK(eg_event_record(g->open_ev, &g->s));
        CK(eg_stream_wait(mb->s, g->open_ev));
    }
    CK(eg_memcpy_async(mb->s, mb->meta_d, mb->meta_h, mb->words * sizeof(int), 1));
    chain_wait(mb);
    CK(st_cuda_embed(mb->s, mb->partial, g->embed, mb->d_tok, mb->T, g->c.d));
    mb->fresh = false;
}

/* ------------------------------------------------------------------ layers */

/* y [T, N] fp32 (ldy) = beta·y + x·Wᵀ; with a remainder xlo (xsplit) a second pass adds xlo·Wᵀ, so
 * the GEMM reads x to ~16 bits instead of bf16's 8 (2× the GEMM work; comparisons only). */
static st_status_t lin2(st_egpu_mb_t *mb, float *y, int ldy, float beta, const st_bf16_t *x, const st_bf16_t *xlo,
                        int ldx, const st_bf16_t *W, int T, int N, int K) {
    st_status_t r = st_cuda_linear_ex(mb->s, y, ldy, true, beta, x, ldx, W, T, N, K);
    if (r == ST_OK && xlo) r = st_cuda_linear_ex(mb->s, y, ldy, true, 1.f, xlo, ldx, W, T, N, K);
    return r;
}
#define XLO(mb) ((mb)->g->xsplit ? (mb)->xn_lo : NULL)
#define LO(mb, f) ((mb)->g->xsplit ? (mb)->f : NULL)

/* xn [n_rows, d] = RMSNorm(h; norm_w), h = the partial merged with AttnRes query q of the current
 * block set (mb->nb > 0), else the partial (first layer, no AttnRes). Profiled: the fused kernel is
 * timed as AR_NORM and followed by a plain RMSNorm of the same rows into xf (REF_NORM; xf is free
 * until finish_step), so that the fused kernel's AttnRes part = AR_NORM − REF_NORM. */
static void resnorm(st_egpu_mb_t *mb, st_bf16_t *xn, st_bf16_t *xlo, int q, const float *norm_w, const int *rows,
                    int n_rows, bool head) {
    st_egpu_t *g = mb->g;
    const st_config_t *c = &g->c;
    const st_gpu_stream_t *s = mb->s;
    int d = c->d;
    st_status_t (*fn)(const st_gpu_stream_t *, st_bf16_t *, st_bf16_t *, const float *, const float *, const float *,
                      const float *, int, int, const float *, const int *, int, int, float, float) =
        g->ar_v1 ? st_cuda_attnres_phase2_rmsnorm_v1 : st_cuda_attnres_phase2_rmsnorm;
    if (c->attn_res_block <= 0 || mb->nb == 0) {
        if (!head) prof_mark(g, ST_EGPU_PROF_NORM);
        CK(fn(s, xn, xlo, mb->partial, NULL, NULL, NULL, 0, 1, norm_w, rows, n_rows, d, c->rms_eps, c->rms_eps));
        return;
    }
    const gbq_t *bq = &g->bq[mb->nb - 1];
    if (!head) prof_mark(g, ST_EGPU_PROF_AR_NORM);
    CK(fn(s, xn, xlo, mb->partial, mb->stats, mb->acc, bq->w + (size_t)q * d, q, bq->Q, norm_w, rows, n_rows, d,
          c->rms_eps, c->rms_eps));
    if (g->pf_step && !head) {
        prof_mark(g, ST_EGPU_PROF_REF_NORM);
        CK(fn(s, mb->xf, NULL, mb->partial, NULL, NULL, NULL, 0, 1, norm_w, rows, n_rows, d, c->rms_eps, c->rms_eps));
    }
}

static void kda_layer(st_egpu_mb_t *mb, const gl_t *G, int l) {
    st_egpu_t *g = mb->g;
    const st_config_t *c = &g->c;
    const st_gpu_stream_t *s = mb->s;
    int T = mb->T, d = c->d, H = c->kda_heads, dk = c->kda_head_dim, P = g->P, M = g->o.max_seqs;
    int ks = g->layer_slot[l];
    prof_mark(g, ST_EGPU_PROF_GEMM);
    /* q|k|v, the low-rank / β projections and the output gate's first GEMM all read xn: one call
     * (one launch for decode-sized T, st_cuda_linear_multi) */
    if (!g->xsplit) {
        st_linear_seg_t sg[3] = {{G->w_qkv, mb->qkv, 3 * P, 3 * P, true, 0.f},
                                 {G->w_aux, mb->aux, G->naux, G->naux, true, 0.f},
                                 G->w_gb ? (st_linear_seg_t){G->w_g, mb->f, G->ng, G->ng, false, 0.f}
                                         : (st_linear_seg_t){G->w_g, mb->gate, P, P, true, 0.f}};
        CK(st_cuda_linear_multi(s, mb->xn, d, T, d, sg, 3));
    } else {
        CK(lin2(mb, mb->qkv, 3 * P, 0.f, mb->xn, XLO(mb), d, G->w_qkv, T, 3 * P, d));
        CK(lin2(mb, mb->aux, G->naux, 0.f, mb->xn, XLO(mb), d, G->w_aux, T, G->naux, d));
    }
    if (T <= 64 && c->f_rank <= 256) { /* decode: the low-rank f_b product and the gate in one kernel */
        prof_mark(g, ST_EGPU_PROF_KDA);
        CK(st_cuda_kda_gate_fb(s, mb->gf, mb->aux, G->naux, G->w_fb, c->f_rank, G->A_log, G->dt_bias, T, H, dk,
                            c->gate_bounded, c->gate_lower_bound));
    } else {
        CK(st_cuda_sgemm(s, mb->gf, P, mb->aux, G->naux, G->w_fb, T, P, c->f_rank));
        prof_mark(g, ST_EGPU_PROF_KDA);
        CK(st_cuda_kda_gate(s, mb->gf, G->A_log, G->dt_bias, T, H, dk, c->gate_bounded, c->gate_lower_bound));
    }
    float *conv = g->kda_conv + (size_t)ks * M * g->conv_per;
    CK(st_cuda_conv_silu_f32(s, mb->cqkv, mb->qkv, conv, mb->d_slot, G->conv_w, mb->d_cu, mb->n_seqs, T, 3 * P, c->conv_k));
    /* NOTE: q, k, v stay fp32 (recurrent and decode kernels read fp32); the chunked kernel's
     * tensor-core tiles take them rounded to bf16 once, here */
    bool rec = dk != 128 || g->kda_rec, chunked = !rec && !mb->all_decode;
    CK(st_cuda_kda_prep(s, mb->q32, mb->k32, mb->v32, chunked ? mb->q : NULL, mb->k, mb->v, mb->beta, mb->cqkv, mb->aux,
                     G->naux, G->off_b, T, H, dk, L2_EPS));
    float *S = g->kda_S + (size_t)ks * M * g->S_per;
    float scale = 1.0f / sqrtf((float)dk);
    gtrace(mb, l, ST_TRACE_KDA_Q, mb->q32, false, P, P, false);
    gtrace(mb, l, ST_TRACE_KDA_K, mb->k32, false, P, P, false);
    gtrace(mb, l, ST_TRACE_KDA_V, mb->v32, false, P, P, false);
    gtrace(mb, l, ST_TRACE_KDA_G, mb->gf, false, P, P, false);
    if (rec)
        CK(st_cuda_kda_recurrent(s, mb->o32, mb->q32, mb->k32, mb->v32, mb->gf, mb->beta, S, mb->d_slot, mb->d_cu,
                            mb->n_seqs, H, dk, scale));
    else if (mb->all_decode) /* NOTE: decode runs the recurrence itself (SPEC §3.2), like the CPU */
        CK(st_cuda_kda_decode_f32(s, mb->o32, mb->q32, mb->k32, mb->v32, mb->gf, mb->beta, S, mb->d_slot, mb->n_seqs,
                                  H, scale));
    else
        CK(st_cuda_kda_chunked_f32o(s, mb->o32, mb->q, mb->k, mb->v, mb->gf, mb->beta, S, mb->d_slot, mb->d_cu,
                                    mb->n_seqs, H, scale));
    gtrace(mb, l, ST_TRACE_KDA_O, mb->o32, false, P, P, false);
    prof_mark(g, ST_EGPU_PROF_GEMM);
    if (G->w_gb) { /* low rank: g_b (g_a x); g_a x (with q|k|v above, unless xsplit) is a GEMM input, so bf16 */
        if (g->xsplit) CK(st_cuda_linear_ex(s, mb->f, G->ng, false, 0.f, mb->xn, d, G->w_g, T, G->ng, d));
        CK(st_cuda_linear_ex(s, mb->gate, P, true, 0.f, mb->f, G->ng, G->w_gb, T, P, G->ng));
    } else if (g->xsplit) {
        CK(lin2(mb, mb->gate, P, 0.f, mb->xn, XLO(mb), d, G->w_g, T, P, d));
    }
    prof_mark(g, ST_EGPU_PROF_KDA);
    CK(st_cuda_kda_out_gate(s, mb->o, LO(mb, o_lo), mb->o32, mb->gate, P, G->o_norm, T, H, dk, c->rms_eps));
    gtrace(mb, l, ST_TRACE_ATTN_O, mb->o, true, P, P, false);
}

/* Direct form (SPEC §4) for the sequences whose chunk has ≥ g->mla_dmin tokens (the glue kernel
 * skipped their rows): per sequence, its n cache rows are gathered, decompressed by one GEMM with
 * W_kvb into per-head K = [W_UK c̃ ; k_pe] and V = W_UV c̃, and st_cuda_mla_prefill (flash form,
 * tensor cores) attends the chunk's queries causally. The value-space output replaces the rows'
 * W_UV·ō: o32 (fp32, when set) or o (bf16). The absorbed glue kernel re-reads the whole cache per
 * query token, which made an 8K prompt's MLA layers ~88% of prefill time (docs/perf.md). */
static void mla_direct(st_egpu_mb_t *mb, const gl_t *G, int l, float *o32, st_bf16_t *o, float scale) {
    st_egpu_t *g = mb->g;
    const st_config_t *c = &g->c;
    const st_gpu_stream_t *s = mb->s;
    if (!g->mla_dmin || mb->all_decode) return;
    int H = c->mla_heads, nope = c->qk_nope, rope = c->qk_rope, dqk = nope + rope, dv = c->v_head_dim;
    int kvr = c->kv_lora_rank, R = g->R, kvw = nope + dv, m = g->layer_slot[l];
    prof_mark(g, ST_EGPU_PROF_MLA);
    for (int i = 0; i < mb->n_seqs; i++) {
        const gent_t *en = &mb->ents[i];
        if (en->n < g->mla_dmin) continue;
        int n = en->pos0 + en->n;
        const int *bt = mb->d_btab + ((size_t)m * mb->n_seqs + i) * g->pps;
        CK(st_cuda_mla_gather(s, g->dc, g->kv_pool, bt, g->page_size, n, R));
        CK(st_cuda_linear_ex(s, g->dY, H * kvw, false, 0.f, g->dc, R, G->w_kvb, n, H * kvw, kvr));
        CK(st_cuda_mla_kv_split(s, g->dK, g->dV, g->dY, g->dc, n, H, nope, rope, dv, R, kvr));
        CK(st_cuda_mla_prefill(s, g->dod, mb->qm + (size_t)en->off * H * dqk, g->dK, g->dV, en->n, n, H, dqk, dv,
                               scale));
        size_t rows = (size_t)en->n * H * dv, r0 = (size_t)en->off * H * dv;
        if (o32) CK(st_cuda_bf16_to_f32(s, o32 + r0, g->dod, rows));
        else CK(eg_memcpy_async(s, o + r0, g->dod, rows * sizeof(st_bf16_t), 0));
    }
}

static void mla_layer(st_egpu_mb_t *mb, const gl_t *G, int l) {
    st_egpu_t *g = mb->g;
    const st_config_t *c = &g->c;
    const st_gpu_stream_t *s = mb->s;
    int T = mb->T, d = c->d, H = c->mla_heads, nope = c->qk_nope, rope = c->qk_rope, dqk = nope + rope;
    int dv = c->v_head_dim, kvr = c->kv_lora_rank, R = g->R, kvw = nope + dv, m = g->layer_slot[l];
    prof_mark(g, ST_EGPU_PROF_GEMM);
    if (c->q_lora_rank > 0) {
        CK(lin2(mb, mb->cq32, c->q_lora_rank, 0.f, mb->xn, XLO(mb), d, G->w_qa, T, c->q_lora_rank, d));
        st_bf16_t *cqlo = g->xsplit >= 2 ? mb->cq_lo : NULL;
        prof_mark(g, ST_EGPU_PROF_NORM);
        CK(st_cuda_rmsnorm(s, mb->cq, cqlo, mb->cq32, G->qa_norm, T, c->q_lora_rank, MLA_NORM_EPS));
        prof_mark(g, ST_EGPU_PROF_GEMM);
        CK(lin2(mb, mb->qm32, H * dqk, 0.f, mb->cq, cqlo, c->q_lora_rank, G->w_q, T, H * dqk, c->q_lora_rank));
    } else {
        CK(lin2(mb, mb->qm32, H * dqk, 0.f, mb->xn, XLO(mb), d, G->w_q, T, H * dqk, d));
    }
    gtrace(mb, l, ST_TRACE_MLA_Q, mb->qm32, false, H * dqk, H * dqk, false);
    CK(lin2(mb, mb->ckv, R, 0.f, mb->xn, XLO(mb), d, G->w_kva, T, R, d));
    const int *bt = mb->d_btab + (size_t)m * mb->n_seqs * g->pps;
    prof_mark(g, ST_EGPU_PROF_MLA);
    CK(st_cuda_mla_kv_store(s, g->kv_pool, g->mla32, mb->ckv, G->kva_norm, mb->d_tok_ent, mb->d_tok_pos, bt, g->pps,
                       g->page_size, T, kvr, R, MLA_NORM_EPS));
    /* absorbed form for every query (SPEC §4): q' = [W_UK,hᵀ q_nope ; q_pe], o_h = W_UV,h ō_h.
     * With mla32 the absorption (fp32 W_UK), q' and the cache stay fp32 and only ō is rounded to
     * bf16; measured on `small` it changes neither the sublayer error (4e-3) nor the end-to-end one,
     * so the bf16 cache and the tuned decode kernel stay the default (docs/perf.md). */
    float scale = 1.0f / sqrtf((float)dqk);
    if (g->mla32) {
        CK(st_cuda_sgemm_heads(s, mb->qabs, H * R, R, mb->qm32, H * dqk, dqk, G->w_kvb32, kvr, (long long)kvw * kvr, false,
                          T, kvr, nope, H));
        CK(st_cuda_mla_qpe(s, mb->qabs, true, mb->qm32, T, H, nope, rope, kvr));
        CK(st_cuda_mla_attn(s, mb->olat, g->xsplit >= 2 ? mb->olat_lo : NULL, mb->qabs, g->kv_pool, true, mb->d_tok_ent, mb->d_tok_pos, bt, g->pps,
                       g->page_size, T, H, R, kvr, scale, NULL, 0));
    } else {
        CK(st_cuda_f32_to_bf16(s, mb->qm, mb->qm32, (size_t)T * H * dqk));
        CK(st_cuda_linear_heads(s, mb->qabs, false, H * R, R, mb->qm, H * dqk, dqk, G->w_kvb, kvr, (long long)kvw * kvr,
                           false, T, kvr, nope, H));
        CK(st_cuda_mla_qpe(s, mb->qabs, false, mb->qm32, T, H, nope, rope, kvr));
        if (mb->all_decode && R == 576 && kvr == 512)
            CK(st_cuda_mla_decode(s, mb->olat, mb->qabs, g->kv_pool, bt, mb->d_len, mb->n_seqs, H, g->page_size,
                                  g->pps, mb->max_len, MLA_SPLIT, scale, g->mla_ws, g->mla_ws_bytes));
        else
            CK(st_cuda_mla_attn(s, mb->olat, NULL, mb->qabs, g->kv_pool, false, mb->d_tok_ent, mb->d_tok_pos, bt, g->pps,
                           g->page_size, T, H, R, kvr, scale, g->mla_dmin ? mb->d_cu : NULL, g->mla_dmin));
    }
    const st_bf16_t *w_uv = G->w_kvb + (size_t)nope * kvr;
    if (c->mla_output_gate || g->xsplit) { /* o = W_UV ō in fp32, then ⊙ σ(gate) or split; rounded once */
        CK(st_cuda_linear_heads(s, mb->o32, true, H * dv, dv, mb->olat, H * kvr, kvr, w_uv, kvr, (long long)kvw * kvr, true,
                           T, dv, kvr, H));
        if (g->xsplit >= 2)
            CK(st_cuda_linear_heads_add(s, mb->o32, H * dv, dv, mb->olat_lo, H * kvr, kvr, w_uv, kvr, (long long)kvw * kvr,
                                   true, T, dv, kvr, H));
        mla_direct(mb, G, l, mb->o32, NULL, scale);
        if (c->mla_output_gate) {
            prof_mark(g, ST_EGPU_PROF_GEMM);
            CK(lin2(mb, mb->gate, H * dv, 0.f, mb->xn, XLO(mb), d, G->w_mg, T, H * dv, d));
            prof_mark(g, ST_EGPU_PROF_MLA);
            CK(st_cuda_mul_sigmoid(s, mb->o, LO(mb, o_lo), mb->o32, mb->gate, (size_t)T * H * dv));
        } else {
            CK(st_cuda_split_bf16(s, mb->o, mb->o_lo, mb->o32, (size_t)T * H * dv));
        }
    } else {
        CK(st_cuda_linear_heads(s, mb->o, false, H * dv, dv, mb->olat, H * kvr, kvr, w_uv, kvr, (long long)kvw * kvr, true, T,
                           dv, kvr, H));
        mla_direct(mb, G, l, NULL, mb->o, scale);
    }
    gtrace(mb, l, ST_TRACE_ATTN_O, mb->o, true, H * dv, H * dv, false);
}

/* partial += down · GLU(xn · guᵀ); h2 = xn · guᵀ is there already when gu_done (moe_pre) */
static void ffn_add(st_egpu_mb_t *mb, const st_bf16_t *gu, const st_bf16_t *down, int w, bool gu_done) {
    st_egpu_t *g = mb->g;
    const st_config_t *c = &g->c;
    int T = mb->T, d = c->d;
    prof_mark(g, ST_EGPU_PROF_GEMM);
    if (!gu_done) CK(lin2(mb, mb->h2, 2 * w, 0.f, mb->xn, XLO(mb), d, gu, T, 2 * w, d));
    prof_mark(g, ST_EGPU_PROF_OTHER);
    CK(st_cuda_glu(mb->s, mb->hh, LO(mb, hh_lo), mb->h2, mb->h2 + w, T, w, 2 * w, c->act == ST_ACT_SITU, c->situ_beta1,
                c->situ_beta2));
    prof_mark(g, ST_EGPU_PROF_GEMM);
    CK(lin2(mb, mb->partial, d, 1.f, mb->hh, LO(mb, hh_lo), w, down, T, d, w));
}

/* The route observer (engine.h): the scores come back with the hand-off and the observer runs in
 * collect (micro-batches); st_engine_step's walk copies and calls it here. */
static void observe(st_egpu_mb_t *mb, int l) {
    st_egpu_t *g = mb->g;
    int T = mb->T, n = g->c.n_experts, kc = g->kcap;
    if (!g->obs) return;
    CK(eg_memcpy_async(mb->s, mb->scores_h, mb->scores, (size_t)T * n * sizeof(float), 2));
    if (!mb->internal) return;
    CK(eg_memcpy_async(mb->s, mb->ids_h, mb->ids, (size_t)T * kc * sizeof(int), 2));
    CK(eg_memcpy_async(mb->s, mb->cnt_h, mb->cnt, (size_t)T * sizeof(int), 2));
    prof_release(g);
    CK(st_gpu_stream_sync(mb->s));
    g->obs(g->obs_ctx, l, T, n, mb->scores_h, mb->ids_h, mb->cnt_h, kc);
}

/* The three GEMMs of a latent MoE layer that read xn: router scores (fp32), z = xn · lat_downᵀ (bf16)
 * and the shared experts' gate|up (fp32, for ffn_add after the routed experts): one call, so decode
 * steps launch them once (st_cuda_linear_multi). Not with xsplit (comparisons) or other layouts;
 * a property of the engine, so graph replays (which run no host code) agree with it. */
static bool moe_fused(const st_egpu_t *g) { return !g->xsplit && g->c.latent > 0 && g->c.n_shared > 0; }
static void moe_pre(st_egpu_mb_t *mb, const gl_t *G) {
    st_egpu_t *g = mb->g;
    const st_config_t *c = &g->c;
    int n = c->n_experts, ew = st_config_expert_width(c), w = c->n_shared * c->moe_inter;
    if (!moe_fused(g)) return;
    st_linear_seg_t sg[3] = {{G->router, mb->scores, n, n, true, 0.f},
                             {G->lat_down, mb->z, ew, ew, false, 0.f},
                             {G->sh_gu, mb->h2, 2 * w, 2 * w, true, 0.f}};
    prof_mark(g, ST_EGPU_PROF_GEMM);
    CK(st_cuda_linear_multi(mb->s, mb->xn, c->d, mb->T, c->d, sg, 3));
}

static void route(st_egpu_mb_t *mb, const gl_t *G, int l) {
    st_egpu_t *g = mb->g;
    const st_config_t *c = &g->c;
    const st_gpu_stream_t *s = mb->s;
    int T = mb->T, n = c->n_experts, k = c->top_k, kc = g->kcap;
    prof_mark(g, ST_EGPU_PROF_ROUTER);
    if (!moe_fused(g)) CK(lin2(mb, mb->scores, n, 0.f, mb->xn, XLO(mb), c->d, G->router, T, n, c->d));
    /* quantile thresholds set for this layer and no hook that may rewrite the sets: on the device
     * (σ in place, the sets and weights), no host round trip */
    if (g->o.routing == ST_ROUTE_QUANTILE && g->tau_set && !g->hook && !g->host_route && kc == g->o.k_max &&
        !isnan(g->tau[(size_t)l * n])) {
        CK(st_cuda_router_quantile(s, mb->ids, mb->wts, mb->cnt, mb->scores, g->tau_d + (size_t)l * n, T, n, kc,
                                   c->renormalize, c->routed_scale));
        observe(mb, l);
        return;
    }
    /* a layer whose thresholds are unset (NaN) routes top-k, as the CPU engine */
    bool quantile = g->o.routing == ST_ROUTE_QUANTILE && g->tau_set && !isnan(g->tau[(size_t)l * n]);
    /* σ in place and the top-k sets, weights and counts: one kernel (the sets the hook sees, or the
     * scores the host's quantile routing reads) */
    CK(st_cuda_router_topk(s, mb->ids, mb->wts, kc, mb->cnt, mb->scores, G->router_bias, T, n, k, c->renormalize,
                           c->routed_scale));
    if (!quantile && !g->hook) {
        observe(mb, l);
        return;
    }
    CK(eg_memcpy_async(s, mb->scores_h, mb->scores, (size_t)T * n * sizeof(float), 2));
    CK(eg_memcpy_async(s, mb->ids_h, mb->ids, (size_t)T * kc * sizeof(int), 2));
    CK(eg_memcpy_async(s, mb->cnt_h, mb->cnt, (size_t)T * sizeof(int), 2));
    prof_release(g); /* pinned copies: asynchronous */
    CK(st_gpu_stream_sync(s));
    if (quantile) {
        int km = g->o.k_max;
        /* ids [T, k_max] then restrided to [T, kc]; the weights are recomputed on the device */
        st_route_quantile(mb->ids_h, mb->wq_h, mb->cnt_h, mb->scores_h, g->tau + (size_t)l * n, T, n, km,
                          c->renormalize, c->routed_scale);
        if (km != kc)
            for (int t = T - 1; t >= 0; t--) memmove(mb->ids_h + (size_t)t * kc, mb->ids_h + (size_t)t * km, (size_t)km * sizeof(int));
    }
    if (g->hook) g->hook(g->hook_ctx, l, T, n, mb->scores_h, mb->ids_h, mb->cnt_h, kc);
    CK(eg_memcpy_async(s, mb->ids, mb->ids_h, (size_t)T * kc * sizeof(int), 1));
    CK(eg_memcpy_async(s, mb->cnt, mb->cnt_h, (size_t)T * sizeof(int), 1));
    CK(st_cuda_route_finish(s, mb->ids, mb->wts, mb->cnt, mb->scores, T, n, kc, c->renormalize, c->routed_scale));
    observe(mb, l);
}

/* Whether the routed experts of a T-token step run per slot (st_cuda_moe_ffn_slots) here, and so per
 * row on a GPU expert server (st_moe_work_t.per_row) */
static bool slots_path(const st_egpu_t *g, int T) {
    const st_config_t *c = &g->c;
    long S = (long)T * g->kcap;
#ifdef ST_EGPU_HAVE_MOE_FFN
    return g->grouped && S <= EG_SLOTS_CAP &&
           st_cuda_moe_ffn_slots_pick((int)S, c->n_experts, st_config_expert_width(c), c->moe_inter);
#else
    (void)c, (void)S;
    return false;
#endif
}

/* Routed experts on the device: per slot at decode sizes (yg in slot order), else group by expert,
 * gather, grouped FFN → yg (grouped rows). */
static void experts_local(st_egpu_mb_t *mb, const gl_t *G) {
    st_egpu_t *g = mb->g;
    const st_config_t *c = &g->c;
    const st_gpu_stream_t *s = mb->s;
    int T = mb->T, kc = g->kcap, E = c->n_experts, ew = st_config_expert_width(c), mi = c->moe_inter;
    bool situ = c->act == ST_ACT_SITU;
    prof_mark(g, ST_EGPU_PROF_EXPERTS);
    mb->slot_order = false;
#ifdef ST_EGPU_HAVE_MOE_FFN
    if (slots_path(g, T)) { /* decode sizes */
        CK(st_cuda_moe_ffn_slots(s, mb->yg, mb->hs, mb->z, mb->ids, mb->cnt, T, kc, G->ex_w1, G->ex_w3, G->ex_w2, ew,
                                 mi, situ, c->situ_beta1, c->situ_beta2));
        mb->local_done = mb->slot_order = true;
        return;
    }
#endif
    CK(st_cuda_moe_group(s, mb->offsets, mb->row_of, mb->ids, mb->cnt, T, kc, E));
    CK(st_cuda_moe_gather(s, mb->xg, mb->z, mb->row_of, mb->cnt, T, kc, ew));
#ifdef ST_EGPU_HAVE_MOE_FFN
    if (g->grouped) {
        CK(st_cuda_moe_ffn_f32out(s, mb->yg, mb->xg, mb->offsets, E, T * kc, T, G->ex_w1, G->ex_w3, G->ex_w2, ew, mi, situ,
                           c->situ_beta1, c->situ_beta2, mb->ffn_ws, mb->ffn_ws_bytes));
        mb->local_done = true;
        return;
    }
#endif
    {
    /* NOTE: per-expert cuBLAS calls need the group sizes on the host: one sync per MoE layer */
    CK(eg_memcpy_async(s, mb->offsets_h, mb->offsets, (size_t)(E + 1) * sizeof(int), 2));
    prof_release(g);
    CK(st_gpu_stream_sync(s));
    size_t es = (size_t)mi * ew;
    int N = mb->offsets_h[E];
    for (int e = 0; e < E; e++) {
        int r0 = mb->offsets_h[e], cj = mb->offsets_h[e + 1] - r0;
        if (cj <= 0) continue;
        CK(st_cuda_linear_ex(s, mb->h2e + (size_t)r0 * 2 * mi, 2 * mi, true, 0.f, mb->xg + (size_t)r0 * ew, ew,
                     G->ex_w1 + e * es, cj, mi, ew));
        CK(st_cuda_linear_ex(s, mb->h2e + (size_t)r0 * 2 * mi + mi, 2 * mi, true, 0.f, mb->xg + (size_t)r0 * ew, ew,
                     G->ex_w3 + e * es, cj, mi, ew));
    }
    if (N > 0) CK(st_cuda_glu(s, mb->he, NULL, mb->h2e, mb->h2e + mi, N, mi, 2 * mi, situ, c->situ_beta1, c->situ_beta2));
    for (int e = 0; e < E; e++) {
        int r0 = mb->offsets_h[e], cj = mb->offsets_h[e + 1] - r0;
        if (cj <= 0) continue;
        CK(st_cuda_linear_ex(s, mb->yg + (size_t)r0 * ew, ew, true, 0.f, mb->he + (size_t)r0 * mi, mi, G->ex_w2 + e * es, cj,
                     ew, mi));
    }
    }
    mb->local_done = true;
}

/* Combine (latent width, slot order), norm, up-projection and shared experts into partial. */
static void moe_finish(st_egpu_mb_t *mb, const gl_t *G, int l) {
    st_egpu_t *g = mb->g;
    const st_config_t *c = &g->c;
    const st_gpu_stream_t *s = mb->s;
    int T = mb->T, kc = g->kcap, ew = st_config_expert_width(c), d = c->d;
    /* the combine reads expert rows through row_of (grouped), or in slot order (remote, or slots) */
    const float *yg = mb->local_done && !mb->slot_order ? mb->yg : NULL;
    const float *yf = !mb->local_done ? mb->eout : mb->slot_order ? mb->yg : NULL;
    prof_mark(g, ST_EGPU_PROF_COMBINE);
    if (!mb->local_done) CK(eg_memcpy_async(s, mb->eout, mb->out_h, (size_t)T * kc * ew * sizeof(float), 1));
    chain_wait(mb);
    if (c->latent > 0) {
        CK(st_cuda_moe_combine(s, mb->un, LO(mb, un_lo), NULL, yg, yf, mb->row_of, mb->wts, mb->cnt, G->lat_norm, T, kc, ew,
                          c->rms_eps));
        gtrace(mb, l, ST_TRACE_MOE_U, mb->un, true, ew, ew, false);
        prof_mark(g, ST_EGPU_PROF_GEMM);
        CK(lin2(mb, mb->partial, d, 1.f, mb->un, LO(mb, un_lo), ew, G->lat_up, T, d, ew));
    } else {
        CK(st_cuda_moe_combine(s, NULL, NULL, mb->partial, yg, yf, mb->row_of, mb->wts, mb->cnt, NULL, T, kc, ew, c->rms_eps));
    }
    if (c->n_shared > 0) ffn_add(mb, G->sh_gu, G->sh_down, c->n_shared * c->moe_inter, moe_fused(g));
}

static void finish_step(st_egpu_mb_t *mb) {
    st_egpu_t *g = mb->g;
    const st_config_t *c = &g->c;
    const st_gpu_stream_t *s = mb->s;
    int d = c->d, V = c->vocab, nr = mb->n_rows;
    prof_mark(g, ST_EGPU_PROF_HEAD);
    resnorm(mb, mb->xf, LO(mb, xf_lo), g->q_out, g->final_norm, mb->d_rows, nr, true);
    /* rows of entries that want only the argmax (st_seq_chunk_t.argmax) are not copied to the host */
    bool amax = false;
    for (int i = 0, r = 0; i < mb->n_seqs; i++) {
        const st_seq_chunk_t *q = &mb->seqs[i];
        bool only = q->argmax && !q->all_logits;
        amax |= only;
        for (int t = q->all_logits ? 0 : q->n_tokens - 1; t < q->n_tokens; t++) mb->need[r++] = !only;
    }
    int LR = ST_MIN(mb->T, LOGIT_ROWS);
    for (int r0 = 0; r0 < nr; r0 += LR) {
        int rows = ST_MIN(LR, nr - r0);
        CK(lin2(mb, mb->lg, V, 0.f, mb->xf + (size_t)r0 * d, g->xsplit ? mb->xf_lo + (size_t)r0 * d : NULL, d,
                g->lm_head, rows, V, d));
        if (amax) CK(st_cuda_argmax(s, mb->amax_d + r0, mb->lg, rows, V));
        prof_release(g); /* the copy to the caller's pageable buffer waits for the stream */
        bool copied = false;
        for (int a = 0, b; a < rows; a = b) { /* runs of rows the caller wants */
            for (b = a; b < rows && mb->need[r0 + b] == mb->need[r0 + a]; b++) {}
            if (!mb->need[r0 + a]) continue;
            CK(eg_memcpy_async(s, mb->logits + (size_t)(r0 + a) * V, mb->lg + (size_t)a * V,
                               (size_t)(b - a) * V * sizeof(float), 2));
            copied = true;
        }
        if (copied) CK(st_gpu_stream_sync(s)); /* the caller's buffer is pageable */
    }
    if (amax) CK(eg_memcpy_async(s, mb->amax_h, mb->amax_d, (size_t)nr * sizeof(int), 2));
    prof_end_queue(g);
    CK(st_gpu_stream_sync(s));
    for (int i = 0, r = 0; i < mb->n_seqs; i++) {
        const st_seq_chunk_t *q = &mb->seqs[i];
        r += q->all_logits ? q->n_tokens : 1;
        if (q->argmax && !q->all_logits) *q->argmax = mb->amax_h[r - 1];
    }
    prof_end_sum(mb);
    for (int i = 0; i < mb->n_seqs; i++) {
        g->seq_len[mb->ents[i].slot] += mb->ents[i].n;
        g->seq_busy[mb->ents[i].slot] = false;
    }
    g->stats.steps++;
    g->stats.tokens += (uint64_t)mb->T;
    g->stats.attention += st_time_sec() - mb->t0; /* NOTE: device work is asynchronous: whole steps only */
    mb->busy = false;
}

/* Hand-off of layer l's routed tokens: z as fp32, ids and counts into the pinned buffers, queued
 * (collect waits for mb->ev). */
static void handoff(st_egpu_mb_t *mb, int l, st_moe_work_t *w) {
    st_egpu_t *g = mb->g;
    const st_config_t *c = &g->c;
    const st_gpu_stream_t *s = mb->s;
    int T = mb->T, kc = g->kcap, ew = st_config_expert_width(c);
    chain_record(mb);
    CK(st_cuda_bf16_to_f32(s, mb->zf, mb->z, (size_t)T * ew));
    CK(eg_memcpy_async(s, mb->z_h, mb->zf, (size_t)T * ew * sizeof(float), 2));
    CK(eg_memcpy_async(s, mb->ids_h, mb->ids, (size_t)T * kc * sizeof(int), 2));
    CK(eg_memcpy_async(s, mb->cnt_h, mb->cnt, (size_t)T * sizeof(int), 2));
    CK(eg_event_record(mb->ev, s)); /* collect waits for this, not for the whole stream */
    *w = (st_moe_work_t){.layer = l, .T = T, .kc = kc, .ew = ew, .z = mb->z_h, .ids = mb->ids_h, .cnt = mb->cnt_h,
                         .per_row = slots_path(g, T),
                         .tok_ent = mb->meta_h + T, .out = mb->out_h};
}

void st_egpu_mb_launch(st_egpu_mb_t *mb) {
    st_egpu_t *g = mb->g;
    const st_config_t *c = &g->c;
    const st_gpu_stream_t *s = mb->s;
    int d = c->d, B = c->attn_res_block, T = mb->T;
    size_t Td = (size_t)T * d;
    if (!mb->busy || mb->pend) return;
    if (mb->fresh) queue_begin(mb);
    if (st_gpu_init(g->o.device) != ST_OK && mb->err == ST_OK) mb->err = ST_ERR_INTERNAL;
    if (mb->waiting) { /* the experts of layer l are back */
        moe_finish(mb, &g->L[mb->l], mb->l);
        mb->waiting = false;
        mb->l++;
    }
    for (; mb->l < c->n_layers; mb->l++) {
        int l = mb->l;
        const gl_t *G = &g->L[l];
        gtrace(mb, l, ST_TRACE_PARTIAL_IN, mb->partial, false, d, d, true);
        /* attention side */
        bool pushed = B > 0 && l % B == 0;
        /* NOTE: the block-start norm folded into the phase-1 launch up to EG_AR_FOLD_T tokens: it saves a
         * launch (decode), but its extra thread-block group re-reads every block row, which costs more
         * than the fused norm's one read of the partial beyond (bench_gpu_attnres, H200: d 1024 T 128
         * 7.9 vs 11.4 µs, T 256 12.5 vs 12.6, T 8192 372 vs 237; d 7168 T 128 81 vs 98, T 256 198 vs 119) */
        bool fold = pushed && !g->ar_v1 && T <= EG_AR_FOLD_T;
        if (!fold) resnorm(mb, mb->xn, XLO(mb), g->q_attn[l], G->in_norm, NULL, T, false);
        if (pushed) { /* the partial becomes block nb; phase 1 for the next B layers' queries */
            size_t bs = (size_t)g->o.max_batch_tokens * d;
            /* the block-start norm's query: the last one of the previous block set (any query before the
             * first block: one block mixes to itself) */
            const float *wq = mb->nb > 0 ? g->bq[mb->nb - 1].w + (size_t)g->q_attn[l] * d : g->bq[0].w;
            mb->nb++;
            const gbq_t *bq = &g->bq[mb->nb - 1];
            prof_mark(g, ST_EGPU_PROF_AR_P1);
            if (g->ar_v1) {
                CK(eg_memcpy_async(s, mb->blocks + (mb->nb - 1) * bs, mb->partial, Td * sizeof(float), 0));
                CK(st_cuda_attnres_phase1_strided(s, mb->stats, mb->acc, mb->blocks, bs, mb->nb, bq->w, bq->Q, T, d, c->rms_eps));
            } else { /* fold: one launch for the norm of the mixed blocks (= the previous set + the partial) */
                st_attnres_xnorm_t x = {wq, G->in_norm, c->rms_eps, mb->xn, XLO(mb)};
                CK(st_cuda_attnres_phase1_push(s, mb->stats, mb->acc, mb->blocks, bs, mb->partial, mb->nb, bq->w, bq->Q,
                                               T, d, c->rms_eps, 0, fold ? &x : NULL));
                if (fold && g->pf_step) { /* the plain norm it replaces, for the profile's AttnRes share */
                    prof_mark(g, ST_EGPU_PROF_REF_NORM);
                    CK(st_cuda_attnres_phase2_rmsnorm(s, mb->xf, NULL, mb->partial, NULL, NULL, NULL, 0, 1, G->in_norm, NULL, T, d,
                                  c->rms_eps, c->rms_eps));
                }
            }
        }
        gtrace(mb, l, ST_TRACE_XN_ATTN, mb->xn, true, d, d, false);
        int ow = c->is_mla[l] ? c->mla_heads * c->v_head_dim : g->P;
        if (c->is_mla[l]) mla_layer(mb, G, l);
        else kda_layer(mb, G, l);
        /* o-projection straight into the residual stream: partial = a (block start) or += a */
        prof_mark(g, ST_EGPU_PROF_GEMM);
        CK(lin2(mb, mb->partial, d, pushed ? 0.f : 1.f, mb->o, LO(mb, o_lo), ow, G->w_o, T, d, ow));
        gtrace(mb, l, ST_TRACE_PARTIAL_MID, mb->partial, false, d, d, true);
        /* MLP side */
        resnorm(mb, mb->xn, XLO(mb), g->q_mlp[l], G->post_norm, NULL, T, false);
        gtrace(mb, l, ST_TRACE_XN_MLP, mb->xn, true, d, d, false);
        if (st_config_is_moe_layer(c, l)) {
            int ew = st_config_expert_width(c);
            moe_pre(mb, G);
            route(mb, G, l);
            prof_mark(g, ST_EGPU_PROF_GEMM);
            if (c->latent > 0 && g->xsplit) { /* z is the experts' GEMM input: bf16, from the split x */
                CK(lin2(mb, mb->z32, ew, 0.f, mb->xn, mb->xn_lo, d, G->lat_down, T, ew, d));
                CK(st_cuda_f32_to_bf16(s, mb->z, mb->z32, (size_t)T * ew));
            } else if (c->latent > 0) { /* (moe_pre computed z already when fused) */
                if (!moe_fused(g)) CK(st_cuda_linear_ex(s, mb->z, ew, false, 0.f, mb->xn, d, G->lat_down, T, ew, d));
            } else {
                CK(eg_memcpy_async(s, mb->z, mb->xn, Td * 2, 0));
            }
            gtrace(mb, l, ST_TRACE_MOE_Z, mb->z, true, ew, ew, false);
            mb->local_done = false;
            if (mb->internal) {
                experts_local(mb, G);
                moe_finish(mb, G, l);
                continue;
            }
            handoff(mb, l, &mb->work);
            mb->waiting = true;
            mb->pend = 1;
            return;
        }
        ffn_add(mb, G->dense_gu, G->dense_down, c->intermediate, false);
    }
    gtrace(mb, c->n_layers, ST_TRACE_PARTIAL_IN, mb->partial, false, d, d, true);
    chain_record(mb);
    if (!mb->internal) CK(eg_event_record(mb->ev, s));
    mb->pend = 2;
}

bool st_egpu_mb_ready(st_egpu_mb_t *mb) {
    return !mb->busy || !mb->pend || mb->internal || eg_event_done(mb->ev);
}

int st_egpu_mb_collect(st_egpu_mb_t *mb, st_moe_work_t *work) {
    st_egpu_t *g = mb->g;
    if (!mb->busy) return 0;
    if (!mb->pend) st_egpu_mb_launch(mb);
    int p = mb->pend;
    mb->pend = 0;
    if (p == 2) { /* the head: final norm, lm_head, logits or argmax to the caller; synchronises */
        finish_step(mb);
        return 0;
    }
    if (st_gpu_init(g->o.device) != ST_OK && mb->err == ST_OK) mb->err = ST_ERR_INTERNAL;
    CK(eg_event_sync(mb->ev));
    *work = mb->work;
    if (g->obs) g->obs(g->obs_ctx, mb->l, mb->T, g->c.n_experts, mb->scores_h, mb->ids_h, mb->cnt_h, g->kcap);
    return 1;
}

int st_egpu_mb_advance(st_egpu_mb_t *mb, st_moe_work_t *work) {
    st_egpu_mb_launch(mb);
    return st_egpu_mb_collect(mb, work);
}

void st_egpu_mb_run_local(st_egpu_mb_t *mb, const st_moe_work_t *work) {
    /* NOTE: the experts run on the device from the device copy of z; work->out is not written,
     * the combine reads the device rows (see engine.h: local experts only). */
    (void)work;
    if (mb->g->o.remote_experts || !mb->waiting) return;
    experts_local(mb, &mb->g->L[mb->l]);
}

/* A decode step's layers as a CUDA graph: the same launches (metadata copy from the pinned buffer,
 * embedding, every layer with its local experts), which read the step's tokens, slots, lengths and
 * block tables from device memory, so one capture serves every step with the same token count and
 * MLA split bound; the head (finish_step) runs after it as usual. Steps with host round trips (a
 * hook, an observer, the trace, the profile, host routing, per-expert cuBLAS) are not captured.
 * Returns false (nothing queued) when the step does not qualify or the capture failed (graphs are
 * then switched off with a warning). */
void st_egpu_set_graphs(st_egpu_t *g, bool on) {
    g->graphs = on;
    for (int i = 0; i < EGPU_GRAPHS; i++) { /* the next steps capture again, with the kernels chosen then */
        st_gpu_graph_destroy(g->gr[i].exec);
        g->gr[i].exec = NULL;
    }
}

static bool graph_step(st_egpu_t *g, st_egpu_mb_t *mb) {
    bool host_route = g->o.routing == ST_ROUTE_QUANTILE && g->tau_set && (g->host_route || g->kcap != g->o.k_max);
    if (!g->graphs || !mb->all_decode || g->hook || g->obs || g->trace || g->pf_step || host_route ||
        (g->c.n_experts > 0 && !g->grouped))
        return false;
    int hit = -1, victim = 0;
    for (int i = 0; i < EGPU_GRAPHS; i++) {
        if (g->gr[i].exec && g->gr[i].T == mb->T && g->gr[i].lb == mb->max_len) hit = i;
        if (g->gr[i].used < g->gr[victim].used) victim = i;
    }
    if (hit < 0) {
        void *exec = NULL;
        if (st_gpu_capture_begin(mb->s) != ST_OK) {
            g->graphs = false;
            return false;
        }
        st_egpu_mb_launch(mb);
        st_status_t se = st_gpu_capture_end(mb->s, &exec);
        if (se != ST_OK || mb->err != ST_OK || mb->pend != 2) {
            st_log_warn("gpu engine: decode step graph capture failed (%s); graphs off", st_err_last());
            st_gpu_graph_destroy(exec);
            g->graphs = false;
            /* nothing ran: the walk starts over */
            mb->err = ST_OK, mb->l = 0, mb->nb = 0, mb->pend = 0, mb->waiting = false, mb->fresh = true;
            return false;
        }
        hit = victim;
        st_gpu_graph_destroy(g->gr[hit].exec);
        g->gr[hit].exec = exec;
        g->gr[hit].T = mb->T, g->gr[hit].lb = mb->max_len;
        g->gr[hit].l = mb->l, g->gr[hit].nb = mb->nb, g->gr[hit].pend = mb->pend;
        g->gr[hit].local_done = mb->local_done, g->gr[hit].slot_order = mb->slot_order;
    }
    g->gr[hit].used = ++g->gr_clock;
    CK(st_gpu_graph_launch(g->gr[hit].exec, mb->s));
    mb->l = g->gr[hit].l, mb->nb = g->gr[hit].nb, mb->pend = g->gr[hit].pend, mb->local_done = g->gr[hit].local_done;
    mb->slot_order = g->gr[hit].slot_order;
    mb->waiting = false, mb->fresh = false;
    return true;
}

st_status_t st_egpu_step(st_egpu_t *g, const st_seq_chunk_t *seqs, int n_seqs, float *logits) {
    if (!g->mb) return ST_FAIL(ST_ERR_INVALID_ARG, "engine: st_engine_step needs local experts");
    TRY(st_egpu_mb_begin(g->mb, seqs, n_seqs, logits));
    graph_step(g, g->mb);
    st_moe_work_t w;
    while (st_egpu_mb_advance(g->mb, &w)) st_egpu_mb_run_local(g->mb, &w);
    return g->mb->err;
}
