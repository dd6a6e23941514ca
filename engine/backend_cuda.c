/* The CUDA backend of the engine: SPEC §2–9 on one CUDA device, with bf16 weights/activations
 * (fp32 accumulation), an fp32 residual stream and AttnRes sources, fp32 KDA state and a paged bf16
 * MLA latent cache. Every device buffer is sized at creation; a step allocates nothing. Each
 * micro-batch runs on a stream of its own (st_engine_step's on the engine's), decode steps of
 * st_engine_step replay as CUDA graphs (st_engine_opts_t.cuda_graphs), routed experts run on the
 * device (grouped by expert) or are handed off through pinned host buffers. The frontend
 * (engine.c) owns the bookkeeping and the layer walk; this file the memory and the launches. Not
 * the kernels (kernels/) nor the CUDA plumbing (common/gpu). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_cuda.h"
#include "strata/gpu.h"
#include "strata/kernels_cuda.h"
#include "engine_impl.h"

#define MLA_NORM_EPS 1e-6f /* q_a_layernorm / kv_a_layernorm (checkpoint-layout §5.4) */
#define L2_EPS 1e-6f
#define MLA_SPLIT 512     /* split-KV length of the absorbed decode kernel */
#define MLA_DIRECT_MIN 16 /* prompt chunks of at least this many tokens take the MLA direct form (mla_direct) */
#define LOGIT_ROWS 256    /* lm_head rows per chunk */
#define EGPU_GRAPHS 32 /* decode step graphs kept (graph_step) */
#define EGPU_SEGS 512  /* micro-batch launch graphs kept (segment) */
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

typedef struct {
    st_engine_t *e;
    int P, R;
    st_gpu_stream_t s;
    void **allocs;
    int n_allocs, cap_allocs;
    /* weights */
    st_bf16_t *embed, *lm_head;
    float *final_norm, *out_res;
    gl_t *L;
    int naux_max, ffn_w_max;
    gbq_t *bq; /* AttnRes queries of e->bq, on the device */
    /* state pools */
    float *kda_S, *kda_conv; /* device [n_kda][M][S_per], [n_kda][M][conv_per] */
    size_t S_per, conv_per;
    st_bf16_t *kv_pool; /* device [n_pages][page_size][R] */
    float *tr_f;    /* test-only trace staging: host [max_batch_tokens, tr_w] */
    void *tr_raw;   /* host, same bytes */
    size_t tr_w;
    void *mla_ws;
    size_t mla_ws_bytes;
    /* MLA direct form for prompt chunks of ≥ mla_dmin tokens (mla_layer; 0: the head shapes do not
     * fit the prefill kernel): one sequence at a time — its cache rows c [max_ctx, R], decompressed
     * Y [max_ctx, H, nope+dv], K [max_ctx, H, dqk], V [max_ctx, H, dv], output od [max_batch_tokens, H, dv], all bf16 */
    int mla_dmin;
    st_bf16_t *dc, *dY, *dK, *dV, *dod;
    float *tau_d; /* device copy of e->tau (quantile routing on the device) */
    float *rho_d; /* device copy of e->rho (the band counts) */
    int *counts_d; /* [max_seqs][vocab]: tokens sampled per sequence (the penalties) */
    /* ordering across micro-batch streams: seq_open's state resets on s (open_ev); the compute of
     * the micro-batches in launch order (chain_ev, see chain_wait), so that an early micro-batch's
     * hand-off is ready early and the copies run beside the next one's compute */
    void *open_ev, *chain_ev;
    /* decode steps of st_engine_step as CUDA graphs (opts.cuda_graphs): one per (tokens, MLA split
     * bound), captured at its first step, least recently used replaced; host state of the
     * micro-batch after the layers (restored on replay) */
    bool graphs;
    struct {
        int T, lb, l, nb, pend;
        bool local_done, slot_order;
        void *exec;
        uint64_t used;
    } gr[EGPU_GRAPHS];
    uint64_t gr_clock;
    /* a micro-batch's launches (segment): its walk from a layer to the next hand-off, one graph per
     * (micro-batch, start, tokens, MLA split bound), captured once the micro-batch ran the same shape
     * twice in a row; the state after the walk, restored on replay */
    struct {
        const void *mb;
        int l0, T, lb, nb0;
        bool wait0, fresh0, ld0, so0; /* ld0, so0: the local experts' output at the start (moe_finish reads it) */
        int l_end;        /* the layer whose routing the graph holds (-1: none) */
        unsigned sig;     /* route_sig of l_end at capture */
        int l, nb, pend;
        bool waiting, local_done, slot_order, counted, banded;
        st_moe_work_t work;
        void *exec;
        uint64_t used;
    } seg[EGPU_SEGS];
    uint64_t seg_clock;
} cu_t;

typedef struct {
    st_engine_mb_t *fm; /* the frontend's micro-batch */
    cu_t *g;
    /* its stream: the engine's for the internal one, else its own (own), so that micro-batches
     * overlap; ev marks the end of what launch queued (hand-off copies) */
    const st_gpu_stream_t *s;
    st_gpu_stream_t own;
    void *ev;
    st_gpu_arena_t dev, pin;
    /* device step buffers */
    float *aux, *partial, *blocks, *stats, *acc, *gf, *beta, *scores, *wts, *eout, *lg;
    st_bf16_t *xn, *q, *k, *v, *f, *o, *cq, *qm, *olat, *hh, *z, *xg, *hs, *un, *xf;
    /* fp32 activations between kernels (rounded to bf16 only where a GEMM reads them): GEMM
     * outputs qkv / gate / cq32 / h2 / o32 (MLA, gated), conv output cqkv, KDA q32 / k32 / v32
     * and output o32, expert outputs yg */
    float *qkv, *cqkv, *q32, *k32, *v32, *o32, *gate, *cq32, *h2, *yg;
    float *qm32, *ckv; /* MLA query [T, H*dqk] and latent row [T, R], fp32 GEMM outputs */
    st_bf16_t *qabs;   /* [T, H, R] */
    int *ids, *cnt, *offsets, *row_of, *meta_d, *amax_d;
    int *amax_h;          /* pinned [max_batch_tokens]: device argmax of each logits row */
    unsigned char *need;  /* host [max_batch_tokens]: logits row r goes to the caller (else argmax only) */
    /* sampling (st_seq_chunk_t.sample): the rows' parameters and bias lists, pinned and on the
     * device; outputs sid [T] | slp [T] | stid [T, 20] | stlp [T, 20], on the device and pinned */
    st_sample_row_t *srow_h, *srow_d;
    uint32_t *sbid_h, *sbid_d;
    float *sbv_h, *sbv_d;
    int *sid_d, *sid_h, *stid_d, *stid_h;
    float *slp_d, *slp_h, *stlp_d, *stlp_h;
    void *ffn_ws;
    size_t ffn_ws_bytes;
    /* pinned host */
    int *meta_h, *ids_h, *cnt_h;
    st_bf16_t *zb_h; /* hand-off: z [T, ew] out */
    float *out_h, *scores_h, *wq_h; /* wq_h: the host quantile routing's weights (discarded) */
    float *wts_h; /* hand-off: the routing weights [T, kc] out */
    const float **at_h; /* hand-off, remote experts: the node values' pointers [T, kc] back (read in place) */
    /* threshold counts (count observer): cnt | band, [2, n] uint32 on the device and pinned; counted:
     * the layer in flight was counted, banded: with the band */
    uint32_t *qc, *qc_h;
    bool counted, banded;
    /* the release of hand-offs (engine.h, st_engine_mb_launch_early), mapped pinned words: [0] the last
     * released hand-off (host), [1] the one the next combine waits for (host, at collect), [2] the
     * wait's watchdog error (device); hand: hand-offs collected */
    uint32_t *rel;
    uint32_t hand;
    /* the hand-off's dispatch plan on the device (st_engine_mb_plan), for up to pl.n_servers servers:
     * pl's tables in pl_dev (st_moe_plan_carve: the counts block first), then server_of [E] |
     * tok_failed [T] bytes; pl_h pinned: the counts block down, then server_of | tok_failed up */
    st_moe_plan_t pl;
    void *pl_dev, *pl_ws;
    size_t pl_ws_bytes, pl_counts, pl_tables; /* bytes: the counts block, all tables (st_moe_plan_bytes) */
    int pl_kc;                    /* the slots per token the workspace is sized for */
    int *pl_h;
    /* step */
    int n_rows;
    int *d_tok, *d_tok_ent, *d_tok_pos, *d_rows, *d_cu, *d_slot, *d_len, *d_btab; /* into meta_d */
    bool all_decode;
    int max_len; /* longest sequence of the step (context after it), for the MLA decode split */
    size_t words; /* step metadata words (meta_h → meta_d) */
    bool fresh;   /* begun, metadata not yet queued (queue_begin) */
    bool local_done;
    bool slot_order; /* local_done by st_cuda_moe_ffn_slots: yg in slot order, not grouped */
    /* segment graphs: the previous step's shape; stable: this step has it too; capturing: a walk
     * is being captured (its event records and cross-stream waits are queued around the graph) */
    int prev_T, prev_lb;
    bool stable, capturing;
    struct {
        int l, nb;
        bool waiting, fresh, local_done, slot_order;
        st_status_t err; /* the step's first error before the capture */
    } cap0;
} cmb_t;

#define CU(e) ((cu_t *)(e)->bk)
#define CMB(m) ((cmb_t *)(m)->bk)

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
        if (s_ != ST_OK && mb->fm->err == ST_OK) mb->fm->err = s_;                                \
    } while (0)


/* ------------------------------------------------------------------ uploads */

static st_status_t galloc(cu_t *g, void **p, size_t bytes) {
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

static st_status_t up_vec(cu_t *g, float **dst, const float *src, int n) {
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
static st_status_t up_stack(cu_t *g, st_bf16_t **dst, const st_weight_t *const *ws, int n) {
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
static st_status_t up_w(cu_t *g, st_bf16_t **dst, const st_weight_t *w) {
    if (w->rows <= 0) {
        *dst = NULL;
        return ST_OK;
    }
    const st_weight_t *ws[1] = {w};
    return up_stack(g, dst, ws, 1);
}

static st_status_t upload(cu_t *g, const st_engine_w_t *W) {
    const st_config_t *c = &g->e->c;
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

/* The AttnRes queries of every block set (e->bq, the frontend's query order) on the device. */
static st_status_t upload_attnres(cu_t *g) {
    st_engine_t *e = g->e;
    if (e->n_blocks <= 0) return ST_OK;
    g->bq = calloc((size_t)e->n_blocks, sizeof(gbq_t));
    if (!g->bq) return ST_FAIL(ST_ERR_NO_MEMORY, "attnres tables");
    for (int b = 0; b < e->n_blocks; b++) {
        g->bq[b].Q = e->bq[b].Q;
        TRY(up_vec(g, &g->bq[b].w, e->bq[b].w, e->bq[b].Q * e->c.d));
    }
    return ST_OK;
}

static void cu_free(st_engine_t *e) {
    cu_t *g = CU(e);
    if (!g) return;
    for (int i = 0; i < g->n_allocs; i++) st_gpu_free(g->allocs[i]);
    free(g->allocs);
    for (int i = 0; i < EGPU_GRAPHS; i++) st_gpu_graph_destroy(g->gr[i].exec);
    for (int i = 0; i < EGPU_SEGS; i++) st_gpu_graph_destroy(g->seg[i].exec);
    st_gpu_events_destroy(&g->open_ev, 1);
    st_gpu_events_destroy(&g->chain_ev, 1);
    if (g->s.stream) st_gpu_stream_destroy(&g->s);
    free(g->L), free(g->bq), free(g->tr_f), free(g->tr_raw);
    free(g);
    e->bk = NULL;
}

/* The widths the kernels take. */
static st_status_t check_widths(const st_engine_t *e) {
    const st_config_t *c = &e->c;
    int R = c->kv_lora_rank + c->qk_rope;
    if (c->kda_head_dim > 128 || (c->kv_lora_rank % 32) || c->kv_lora_rank > 512 || R > 1024 || c->top_k > 32 ||
        (c->n_experts > 0 && st_config_expert_width(c) % 2))
        return ST_FAIL(ST_ERR_CONFIG, "gpu engine: unsupported widths (KDA head_dim %d ≤ 128, kv_lora_rank %d ≤ 512 and "
                       "a multiple of 32, top_k %d ≤ 32)", c->kda_head_dim, c->kv_lora_rank, c->top_k);
    if (st_gpu_device_count() <= e->o.device)
        return ST_FAIL(ST_ERR_INVALID_ARG, "gpu engine: no CUDA device %d (%d found)", e->o.device, st_gpu_device_count());
    return ST_OK;
}

/* KDA state, conv windows, the latent-cache pool, the MLA workspaces, τ; sizes in *sb, *cb, *kvb. */
static st_status_t alloc_pools(cu_t *g, size_t *sb, size_t *cb, size_t *kvb) {
    st_engine_t *e = g->e;
    const st_config_t *c = &e->c;
    int M = e->o.max_seqs;
    g->S_per = (size_t)c->kda_heads * c->kda_head_dim * c->kda_head_dim;
    g->conv_per = (size_t)(c->conv_k - 1) * 3 * g->P;
    *sb = (size_t)e->n_kda * M * g->S_per * sizeof(float);
    *cb = (size_t)e->n_kda * M * g->conv_per * sizeof(float);
    *kvb = (size_t)e->n_pages * e->page_size * g->R * 2;
    TRY(galloc(g, (void **)&g->kda_S, *sb));
    TRY(galloc(g, (void **)&g->kda_conv, *cb));
    TRY(galloc(g, (void **)&g->kv_pool, *kvb));
    g->mla_ws_bytes = st_cuda_mla_decode_ws_bytes(M, ST_MAX(c->mla_heads, 1), e->o.max_ctx, MLA_SPLIT);
    TRY(galloc(g, &g->mla_ws, g->mla_ws_bytes));
    TRY(galloc(g, (void **)&g->tau_d, (size_t)c->n_layers * ST_MAX(c->n_experts, 1) * sizeof(float)));
    TRY(galloc(g, (void **)&g->rho_d, (size_t)c->n_layers * ST_MAX(c->n_experts, 1) * sizeof(float)));
    TRY(galloc(g, (void **)&g->counts_d, (size_t)M * c->vocab * sizeof(int)));
    TRY(st_gpu_memset(g->counts_d, 0, (size_t)M * c->vocab * sizeof(int)));
    TRY(st_gpu_event_create(&g->open_ev));
    TRY(st_gpu_event_create(&g->chain_ev));
    /* MLA direct form for prompt chunks (mla_direct): the prefill kernel's head shapes */
    int dqk = c->qk_nope + c->qk_rope, dv = c->v_head_dim, H = c->mla_heads;
    bool shape = (dqk == 192 && dv == 128) || (dqk == 128 && dv == 128) || (dqk == 64 && dv == 64) ||
                 (dqk == 48 && dv == 32);
    g->mla_dmin = e->n_mla > 0 && shape && g->R % 8 == 0 ? MLA_DIRECT_MIN : 0;
    size_t mc = (size_t)e->o.max_ctx;
    if (g->mla_dmin) {
        TRY(galloc(g, (void **)&g->dc, mc * g->R * 2));
        TRY(galloc(g, (void **)&g->dY, mc * H * (c->qk_nope + dv) * 2));
        TRY(galloc(g, (void **)&g->dK, mc * H * dqk * 2));
        TRY(galloc(g, (void **)&g->dV, mc * H * dv * 2));
        TRY(galloc(g, (void **)&g->dod, (size_t)e->o.max_batch_tokens * H * dv * 2));
    }
    return ST_OK;
}

static st_status_t cu_init(st_engine_t *e) {
    const st_config_t *c = &e->c;
    st_status_t s = check_widths(e);
    if (s == ST_OK) s = st_gpu_init(e->o.device);
    if (s != ST_OK) return s;
    cu_t *g = calloc(1, sizeof *g);
    if (!g) return ST_FAIL(ST_ERR_NO_MEMORY, "gpu engine");
    e->bk = g;
    g->e = e;
    g->graphs = e->o.cuda_graphs;
    g->P = c->kda_heads * c->kda_head_dim;
    g->R = c->kv_lora_rank + c->qk_rope;
    double t0 = st_time_sec();
    size_t sb = 0, cb = 0, kvb = 0;
    g->L = calloc((size_t)c->n_layers, sizeof(gl_t));
    if ((s = st_gpu_stream_create(&g->s)) == ST_OK && !g->L) s = ST_FAIL(ST_ERR_NO_MEMORY, "gpu engine tables");
    if (s == ST_OK) s = upload(g, &e->W);
    if (s == ST_OK) s = upload_attnres(g);
    if (s == ST_OK) s = alloc_pools(g, &sb, &cb, &kvb);
    if (s != ST_OK) {
        cu_free(e);
        return s;
    }
    /* early launch queues walks behind a host release: with lazily loaded kernels a launch would wait
     * for that release (st_gpu_loads_eagerly) */
    e->early = st_gpu_loads_eagerly();
    if (!e->early && e->o.remote_experts)
        st_log_info("gpu engine: kernels load lazily (CUDA_MODULE_LOADING): no early launches; a process that "
                    "hands off to remote experts calls st_engine_process_init before CUDA starts");
    char dev[256];
    st_gpu_describe(dev, sizeof dev);
    st_log_info("gpu engine on %s: %d layers (%d KDA, %d MLA), %d seqs × %d ctx, %d tokens/step, state %.1f MiB, "
                "cache %.1f MiB (%d pages of %d rows), weights uploaded in %.1f s, decode graphs %s",
                dev, c->n_layers, e->n_kda, e->n_mla, e->o.max_seqs, e->o.max_ctx, e->o.max_batch_tokens,
                (double)(sb + cb) / (1 << 20), (double)kvb / (1 << 20), e->n_pages, e->page_size,
                st_time_sec() - t0, g->graphs ? "on" : "off");
    return ST_OK;
}

/* NOTE: the CUDA runtime's current device is per thread; the worker drives the engine from its
 * compute thread, so every entry point that touches the device selects it first (cheap). */
static st_status_t cu_use(st_engine_t *e) { return st_gpu_init(e->o.device); }

/* Host memory the device reads in place: page-locked and mapped, at the same address (unified
 * addressing, x86-64 Linux); elsewhere the caller copies into the hand-off's pinned rows. */
static void *host_alloc(st_engine_t *e, size_t n) {
    void *p = NULL;
    return st_gpu_init(e->o.device) == ST_OK && st_gpu_host_alloc(&p, n) == ST_OK ? p : NULL;
}
static void host_free(st_engine_t *e, void *p) { st_gpu_host_free(p); }
static st_status_t host_map(st_engine_t *e, void *p, size_t n) {
    void *dev = NULL;
    TRY(st_gpu_init(e->o.device));
    TRY(st_gpu_host_register(p, n, &dev));
    if (dev == p) return ST_OK;
    st_gpu_host_unregister(p);
    return ST_FAIL(ST_ERR_UNSUPPORTED, "engine: registered host memory has another address on the device");
}
static void host_unmap(st_engine_t *e, void *p) {
    if (st_gpu_init(e->o.device) == ST_OK) st_gpu_host_unregister(p);
}

static st_status_t seq_reset(st_engine_t *e, int i) {
    cu_t *g = CU(e);
    int M = e->o.max_seqs;
    for (int ks = 0; ks < e->n_kda; ks++) {
        TRY(st_gpu_memset_async(&g->s, g->kda_S + ((size_t)ks * M + i) * g->S_per, 0, g->S_per * sizeof(float)));
        TRY(st_gpu_memset_async(&g->s, g->kda_conv + ((size_t)ks * M + i) * g->conv_per, 0, g->conv_per * sizeof(float)));
    }
    return st_gpu_memset_async(&g->s, g->counts_d + (size_t)i * e->c.vocab, 0, (size_t)e->c.vocab * sizeof(int));
}

static st_status_t set_thresholds(st_engine_t *e, const float *tau) {
    TRY(st_gpu_init(e->o.device));
    return st_gpu_memcpy_h2d(CU(e)->tau_d, tau, (size_t)e->c.n_layers * e->c.n_experts * sizeof(float));
}

static st_status_t set_probes(st_engine_t *e, const float *rho) {
    TRY(st_gpu_init(e->o.device));
    return st_gpu_memcpy_h2d(CU(e)->rho_d, rho, (size_t)e->c.n_layers * e->c.n_experts * sizeof(float));
}

static st_status_t set_trace(st_engine_t *e, bool on) {
    cu_t *g = CU(e);
    const st_config_t *c = &e->c;
    if (!on || g->tr_f) return ST_OK;
    /* test-only: host staging sized for the widest traced row */
    size_t w = (size_t)ST_MAX(c->d, 3 * g->P);
    w = ST_MAX(w, (size_t)ST_MAX(c->mla_heads, 1) * (c->qk_nope + c->qk_rope + c->v_head_dim));
    w = ST_MAX(w, (size_t)st_config_expert_width(c));
    g->tr_w = w;
    g->tr_f = malloc((size_t)e->o.max_batch_tokens * w * sizeof(float));
    g->tr_raw = malloc((size_t)e->o.max_batch_tokens * w * sizeof(float));
    if (g->tr_f && g->tr_raw) return ST_OK;
    free(g->tr_f), free(g->tr_raw);
    g->tr_f = NULL, g->tr_raw = NULL;
    return ST_FAIL(ST_ERR_NO_MEMORY, "trace staging");
}

/* Test-only trace point (engine.h): copy rows [T, w] (row stride ld; bf16 or fp32) to the host,
 * call the hook, and with writable (fp32, ld == w) copy the hook's values back. Synchronises. */
static void gtrace(cmb_t *mb, int l, int pt, void *src, bool bf16, int w, int ld, bool writable) {
    cu_t *g = mb->g;
    st_engine_t *e = g->e;
    if (!e->trace) return;
    int T = mb->fm->T;
    size_t es = bf16 ? 2 : 4, bytes = ((size_t)(T - 1) * ld + w) * es;
    CK(st_gpu_memcpy_async(mb->s, g->tr_raw, src, bytes, ST_GPU_COPY_D2H));
    CK(st_gpu_stream_sync(mb->s));
    for (int t = 0; t < T; t++)
        for (int c = 0; c < w; c++)
            g->tr_f[(size_t)t * w + c] = bf16 ? st_bf16_to_f32(((const st_bf16_t *)g->tr_raw)[(size_t)t * ld + c])
                                              : ((const float *)g->tr_raw)[(size_t)t * ld + c];
    e->trace(e->trace_ctx, l, pt, T, w, g->tr_f);
    if (writable && !bf16 && ld == w) {
        CK(st_gpu_memcpy_async(mb->s, src, g->tr_f, (size_t)T * w * sizeof(float), ST_GPU_COPY_H2D));
        CK(st_gpu_stream_sync(mb->s));
    }
}

/* ------------------------------------------------------------------ micro-batch buffers */

static void *dcarve(st_gpu_arena_t *a, size_t *need, size_t bytes) {
    *need += (bytes + 255) & ~(size_t)255;
    return a->base ? st_gpu_arena_alloc(a, bytes ? bytes : 1) : NULL;
}

/* With a.base NULL only counts; returns device and pinned byte totals. */
static void mb_carve(cmb_t *mb, size_t *dneed, size_t *pneed) {
    const cu_t *g = mb->g;
    const st_config_t *c = &g->e->c;
    size_t T = (size_t)g->e->o.max_batch_tokens, d = (size_t)c->d, P = (size_t)g->P, F = 4, B2 = 2;
    size_t H = (size_t)c->kda_heads, M = (size_t)g->e->o.max_seqs;
    size_t Hm = (size_t)ST_MAX(c->mla_heads, 1), dqk = (size_t)(c->qk_nope + c->qk_rope), R = (size_t)g->R;
    size_t wide = ST_MAX(P, Hm * (size_t)c->v_head_dim);
    size_t n = (size_t)ST_MAX(c->n_experts, 1), kc = (size_t)g->e->kcap, ew = (size_t)st_config_expert_width(c);
    size_t fw = (size_t)ST_MAX(g->ffn_w_max, 1);
    size_t nb = (size_t)ST_MAX(g->e->n_blocks, 1), Q = (size_t)ST_MAX(g->e->Qmax, 1);
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
    DC(ckv, T * R * F); DC(qabs, T * Hm * R * B2); DC(olat, T * Hm * (size_t)ST_MAX(c->kv_lora_rank, 1) * B2);
    DC(h2, T * 2 * fw * F); DC(hh, T * fw * B2);
    DC(scores, T * n * F); DC(wts, T * kc * F); DC(ids, T * kc * 4); DC(cnt, T * 4); DC(qc, 2 * n * 4);
    DC(offsets, (n + 1) * 4); DC(row_of, T * kc * 4); DC(z, T * ew * B2); DC(un, T * ew * B2);
    if (c->n_experts > 0 && !g->e->o.remote_experts) {
        DC(xg, T * kc * ew * B2); DC(yg, T * kc * ew * F);
        DC(hs, ST_MIN(T * kc, (size_t)EG_SLOTS_CAP) * (size_t)ST_MAX(c->moe_inter, 1) * B2);
        mb->ffn_ws_bytes = st_cuda_moe_ffn_ws_bytes((int)(T * kc), c->moe_inter);
        DC(ffn_ws, mb->ffn_ws_bytes);
    }
    if (!mb->fm->internal && c->n_experts > 0) {
        DC(eout, T * kc * ew * F);
    }
    DC(xf, T * d * B2); DC(lg, LR * V * F); DC(amax_d, T * 4);
    size_t SB = M * ST_ENGINE_MAX_BIAS, ST = T * ST_SAMPLE_MAX_TOP;
    DC(srow_d, T * sizeof(st_sample_row_t)); DC(sbid_d, SB * 4); DC(sbv_d, SB * F);
    DC(sid_d, T * 4); DC(slp_d, T * F); DC(stid_d, ST * 4); DC(stlp_d, ST * F);
    size_t meta = 4 * T + 3 * M + 1 + (size_t)g->e->n_mla * M * (size_t)g->e->pps;
    DC(meta_d, meta * 4);
#undef DC
    a = &mb->pin;
    *pneed = 0;
#define PC(f, bytes) mb->f = dcarve(a, pneed, (bytes))
    PC(meta_h, meta * 4); PC(amax_h, T * 4); PC(ids_h, T * kc * 4); PC(cnt_h, T * 4); PC(scores_h, T * n * F); PC(wq_h, T * kc * F);
    PC(qc_h, 2 * n * 4);
    PC(srow_h, T * sizeof(st_sample_row_t)); PC(sbid_h, SB * 4); PC(sbv_h, SB * F);
    PC(sid_h, T * 4); PC(slp_h, T * F); PC(stid_h, ST * 4); PC(stlp_h, ST * F);
    if (!mb->fm->internal && c->n_experts > 0) {
        PC(zb_h, T * ew * B2); PC(out_h, T * kc * ew * F); PC(wts_h, T * kc * F); PC(at_h, T * kc * sizeof(float *));
    }
#undef PC
}

static void mb_free(st_engine_mb_t *fm) {
    cmb_t *mb = CMB(fm);
    if (!mb) return;
    st_gpu_stream_sync(mb->s);
    if (!fm->internal) {
        st_gpu_events_destroy(&mb->ev, 1);
        st_gpu_stream_destroy(&mb->own);
        st_gpu_host_free(mb->rel);
    }
    st_gpu_arena_cleanup(&mb->dev);
    st_gpu_arena_cleanup(&mb->pin);
    st_gpu_free(mb->pl_dev), st_gpu_free(mb->pl_ws), st_gpu_host_free(mb->pl_h);
    free(mb->need);
    free(mb);
    fm->bk = NULL;
}

static st_status_t mb_init(st_engine_mb_t *fm) {
    cu_t *g = CU(fm->e);
    cmb_t *mb = calloc(1, sizeof *mb);
    if (!mb) return ST_FAIL(ST_ERR_NO_MEMORY, "micro-batch");
    fm->bk = mb;
    mb->fm = fm;
    mb->g = g;
    mb->s = &g->s;
    st_status_t s = ST_OK;
    if (!fm->internal) {
        s = st_gpu_stream_create(&mb->own);
        if (s == ST_OK && (s = st_gpu_event_create(&mb->ev)) != ST_OK) st_gpu_stream_destroy(&mb->own);
        if (s == ST_OK && (s = st_gpu_host_alloc((void **)&mb->rel, 64)) != ST_OK) {
            st_gpu_events_destroy(&mb->ev, 1);
            st_gpu_stream_destroy(&mb->own);
        }
        if (s != ST_OK) {
            free(mb);
            fm->bk = NULL;
            return s;
        }
        memset(mb->rel, 0, 64);
        mb->s = &mb->own;
    }
    mb->need = calloc((size_t)g->e->o.max_batch_tokens + 1, 1);
    size_t dn, pn;
    mb_carve(mb, &dn, &pn);
    s = mb->need ? st_gpu_arena_init(&mb->dev, dn + 4096, 0) : ST_FAIL(ST_ERR_NO_MEMORY, "micro-batch");
    if (s == ST_OK && (s = st_gpu_arena_init(&mb->pin, pn + 4096, 1)) != ST_OK) st_gpu_arena_cleanup(&mb->dev);
    if (s != ST_OK) {
        if (!fm->internal) {
            st_gpu_events_destroy(&mb->ev, 1);
            st_gpu_stream_destroy(&mb->own);
            st_gpu_host_free(mb->rel);
        }
        free(mb->need);
        free(mb);
        fm->bk = NULL;
        return s;
    }
    mb_carve(mb, &dn, &pn);
    return ST_OK;
}

/* ------------------------------------------------------------------ begin */

/* Step metadata, packed into the pinned meta_h (queued to the device by queue_begin): tok, tok_ent,
 * tok_pos, rows [T]; cu [n+1]; slot, len [n]; btab [n_mla][n][pps]. */
static void begin(st_engine_mb_t *fm) {
    cmb_t *mb = CMB(fm);
    st_engine_t *e = fm->e;
    int T = fm->T, n = fm->n_seqs, pps = e->pps, *h = mb->meta_h;
    int *tok = h, *tent = h + T, *tpos = h + 2 * T, *rows = h + 3 * T, *cu = h + 4 * T, *slot = cu + n + 1,
        *len = slot + n, *bt = len + n;
    int nr = 0;
    mb->all_decode = true;
    for (int i = 0; i < n; i++) {
        const st_ent_t *en = &fm->ents[i];
        cu[i] = en->off;
        slot[i] = en->slot;
        len[i] = en->pos0 + en->n;
        if (en->n != 1) mb->all_decode = false;
        mb->max_len = i == 0 || len[i] > mb->max_len ? len[i] : mb->max_len;
        for (int t = 0; t < en->n; t++) {
            tok[en->off + t] = fm->seqs[i].tokens[t];
            tent[en->off + t] = i;
            tpos[en->off + t] = en->pos0 + t;
        }
        for (int t = fm->seqs[i].all_logits ? 0 : en->n - 1; t < en->n; t++) rows[nr++] = en->off + t;
        for (int m = 0; m < e->n_mla; m++)
            memcpy(bt + ((size_t)m * n + i) * pps, e->seq_pageid + ((size_t)en->slot * e->n_mla + m) * pps,
                   (size_t)pps * sizeof(int));
    }
    cu[n] = T;
    int *d = mb->meta_d;
    mb->d_tok = d, mb->d_tok_ent = d + T, mb->d_tok_pos = d + 2 * T, mb->d_rows = d + 3 * T, mb->d_cu = d + 4 * T;
    mb->d_slot = mb->d_cu + n + 1, mb->d_len = mb->d_slot + n, mb->d_btab = mb->d_len + n;
    mb->n_rows = nr;
    mb->words = (size_t)(bt - h) + (size_t)e->n_mla * n * pps;
    mb->fresh = true;
    /* decode: the MLA split bound rounded up to a power of two, so a captured step (graph) serves
     * every context length of its bucket; the kernel reads the real lengths */
    if (mb->all_decode) {
        int b = 512;
        while (b < mb->max_len && b < e->o.max_ctx) b *= 2;
        mb->max_len = ST_MIN(b, e->o.max_ctx);
    }
    mb->stable = mb->all_decode && T == mb->prev_T && mb->max_len == mb->prev_lb;
    mb->prev_T = mb->all_decode ? T : -1, mb->prev_lb = mb->max_len;
}

/* Micro-batches (not st_engine_step's) run their compute one after another in launch order: each
 * launch's compute starts after the previous launch's (chain_wait, after its host-to-device
 * copies are queued) and ends with chain_record (before its device-to-host copies are queued).
 * Concurrent chunks would finish together and reach the expert servers together, leaving both
 * sides idle in turn; in order, the first hand-off is ready after one chunk, and each micro-batch's
 * copies overlap the next one's compute. It also keeps the engine-wide MLA scratch (mla_ws, the
 * direct-form buffers) to one micro-batch at a time. */
static void chain_wait(cmb_t *mb) {
    if (!mb->fm->internal && !mb->capturing) CK(st_gpu_stream_wait(mb->s, mb->g->chain_ev));
}
static void chain_record(cmb_t *mb) {
    if (!mb->fm->internal && !mb->capturing) CK(st_gpu_event_record(mb->g->chain_ev, mb->s));
}

/* A micro-batch's stream waits for the state resets of seq_reset (queued on the engine's stream). */
static void wait_open(cmb_t *mb) {
    cu_t *g = mb->g;
    if (mb->s == &g->s) return;
    CK(st_gpu_event_record(g->open_ev, &g->s));
    CK(st_gpu_stream_wait(mb->s, g->open_ev));
}

/* The start of a step's device work (in launch, so that a graph captures it): metadata up, embed. */
static void queue_begin(cmb_t *mb) {
    cu_t *g = mb->g;
    if (!mb->capturing) wait_open(mb);
    CK(st_gpu_memcpy_async(mb->s, mb->meta_d, mb->meta_h, mb->words * sizeof(int), ST_GPU_COPY_H2D));
    chain_wait(mb);
    CK(st_cuda_embed(mb->s, mb->partial, g->embed, mb->d_tok, mb->fm->T, g->e->c.d));
    mb->fresh = false;
}

/* ------------------------------------------------------------------ layers */

/* y [T, N] fp32 (ldy) = beta·y + x·Wᵀ (x bf16 [T, K], row stride ldx) */
static st_status_t lin(cmb_t *mb, float *y, int ldy, float beta, const st_bf16_t *x, int ldx, const st_bf16_t *W,
                       int T, int N, int K) {
    return st_cuda_linear(mb->s, y, ldy, true, beta, x, ldx, W, T, N, K);
}

/* xn [n_rows, d] = RMSNorm(h; norm_w), h = the partial merged with AttnRes query q of the current
 * block set (mb->fm->nb > 0), else the partial (first layer, no AttnRes). */
static void resnorm(cmb_t *mb, st_bf16_t *xn, int q, const float *norm_w, const int *rows, int n_rows) {
    cu_t *g = mb->g;
    const st_config_t *c = &g->e->c;
    const st_gpu_stream_t *s = mb->s;
    int d = c->d;
    if (c->attn_res_block <= 0 || mb->fm->nb == 0) {
        CK(st_cuda_attnres_phase2_rmsnorm(s, xn, NULL, mb->partial, NULL, NULL, NULL, 0, 1, norm_w, rows, n_rows, d, c->rms_eps, c->rms_eps));
        return;
    }
    const gbq_t *bq = &g->bq[mb->fm->nb - 1];
    CK(st_cuda_attnres_phase2_rmsnorm(s, xn, NULL, mb->partial, mb->stats, mb->acc, bq->w + (size_t)q * d, q, bq->Q, norm_w, rows, n_rows,
                  d, c->rms_eps, c->rms_eps));
}

static void kda_layer(cmb_t *mb, const gl_t *G, int l) {
    cu_t *g = mb->g;
    const st_config_t *c = &g->e->c;
    const st_gpu_stream_t *s = mb->s;
    int T = mb->fm->T, d = c->d, H = c->kda_heads, dk = c->kda_head_dim, P = g->P, M = g->e->o.max_seqs;
    int ks = g->e->layer_slot[l];
    /* q|k|v, the low-rank / β projections and the output gate's first GEMM all read xn: one call
     * (one launch for decode-sized T, st_cuda_linear_multi) */
    st_linear_seg_t sg[3] = {{G->w_qkv, mb->qkv, 3 * P, 3 * P, true, 0.f},
                             {G->w_aux, mb->aux, G->naux, G->naux, true, 0.f},
                             G->w_gb ? (st_linear_seg_t){G->w_g, mb->f, G->ng, G->ng, false, 0.f}
                                     : (st_linear_seg_t){G->w_g, mb->gate, P, P, true, 0.f}};
    CK(st_cuda_linear_multi(s, mb->xn, d, T, d, sg, 3));
    if (T <= 64 && c->f_rank <= 256) { /* decode: the low-rank f_b product and the gate in one kernel */
        CK(st_cuda_kda_gate_fb(s, mb->gf, mb->aux, G->naux, G->w_fb, c->f_rank, G->A_log, G->dt_bias, T, H, dk,
                            c->gate_bounded, c->gate_lower_bound));
    } else {
        CK(st_cuda_sgemm(s, mb->gf, P, mb->aux, G->naux, G->w_fb, T, P, c->f_rank));
        CK(st_cuda_kda_gate(s, mb->gf, G->A_log, G->dt_bias, T, H, dk, c->gate_bounded, c->gate_lower_bound));
    }
    float *conv = g->kda_conv + (size_t)ks * M * g->conv_per;
    CK(st_cuda_conv_silu(s, mb->cqkv, mb->qkv, conv, mb->d_slot, G->conv_w, mb->d_cu, mb->fm->n_seqs, T, 3 * P, c->conv_k));
    /* NOTE: q, k, v stay fp32 (recurrent and decode kernels read fp32); the chunked kernel's
     * tensor-core tiles take them rounded to bf16 once, here */
    bool rec = dk != 128, chunked = !rec && !mb->all_decode;
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
                            mb->fm->n_seqs, H, dk, scale));
    else if (mb->all_decode) /* NOTE: decode runs the recurrence itself (SPEC §3.2), like the CPU */
        CK(st_cuda_kda_decode(s, mb->o32, mb->q32, mb->k32, mb->v32, mb->gf, mb->beta, S, mb->d_slot, mb->fm->n_seqs,
                                  H, scale));
    else
        CK(st_cuda_kda_chunked(s, mb->o32, mb->q, mb->k, mb->v, mb->gf, mb->beta, S, mb->d_slot, mb->d_cu,
                                    mb->fm->n_seqs, H, scale));
    gtrace(mb, l, ST_TRACE_KDA_O, mb->o32, false, P, P, false);
    if (G->w_gb) /* low rank: g_b (g_a x); g_a x (with q|k|v above) is a GEMM input, so bf16 */
        CK(st_cuda_linear(s, mb->gate, P, true, 0.f, mb->f, G->ng, G->w_gb, T, P, G->ng));
    CK(st_cuda_kda_out_gate(s, mb->o, NULL, mb->o32, mb->gate, P, G->o_norm, T, H, dk, c->rms_eps));
    gtrace(mb, l, ST_TRACE_ATTN_O, mb->o, true, P, P, false);
}

/* Direct form (SPEC §4) for the sequences whose chunk has ≥ g->mla_dmin tokens (the glue kernel
 * skipped their rows): per sequence, its n cache rows are gathered, decompressed by one GEMM with
 * W_kvb into per-head K = [W_UK c̃ ; k_pe] and V = W_UV c̃, and st_cuda_mla_prefill (flash form,
 * tensor cores) attends the chunk's queries causally. The value-space output replaces the rows'
 * W_UV·ō: o32 (fp32, when set) or o (bf16). The absorbed glue kernel re-reads the whole cache per
 * query token, which made an 8K prompt's MLA layers ~88% of prefill time (docs/perf/history.md). */
static void mla_direct(cmb_t *mb, const gl_t *G, int l, float *o32, st_bf16_t *o, float scale) {
    cu_t *g = mb->g;
    const st_config_t *c = &g->e->c;
    const st_gpu_stream_t *s = mb->s;
    if (!g->mla_dmin || mb->all_decode) return;
    int H = c->mla_heads, nope = c->qk_nope, rope = c->qk_rope, dqk = nope + rope, dv = c->v_head_dim;
    int kvr = c->kv_lora_rank, R = g->R, kvw = nope + dv, m = g->e->layer_slot[l];
    for (int i = 0; i < mb->fm->n_seqs; i++) {
        const st_ent_t *en = &mb->fm->ents[i];
        if (en->n < g->mla_dmin) continue;
        int n = en->pos0 + en->n;
        const int *bt = mb->d_btab + ((size_t)m * mb->fm->n_seqs + i) * g->e->pps;
        CK(st_cuda_mla_gather(s, g->dc, g->kv_pool, bt, g->e->page_size, n, R));
        CK(st_cuda_linear(s, g->dY, H * kvw, false, 0.f, g->dc, R, G->w_kvb, n, H * kvw, kvr));
        CK(st_cuda_mla_kv_split(s, g->dK, g->dV, g->dY, g->dc, n, H, nope, rope, dv, R, kvr));
        CK(st_cuda_mla_prefill(s, g->dod, mb->qm + (size_t)en->off * H * dqk, g->dK, g->dV, en->n, n, H, dqk, dv,
                               scale));
        size_t rows = (size_t)en->n * H * dv, r0 = (size_t)en->off * H * dv;
        if (o32) CK(st_cuda_bf16_to_f32(s, o32 + r0, g->dod, rows));
        else CK(st_gpu_memcpy_async(s, o + r0, g->dod, rows * sizeof(st_bf16_t), ST_GPU_COPY_D2D));
    }
}

static void mla_layer(cmb_t *mb, const gl_t *G, int l) {
    cu_t *g = mb->g;
    const st_config_t *c = &g->e->c;
    const st_gpu_stream_t *s = mb->s;
    int T = mb->fm->T, d = c->d, H = c->mla_heads, nope = c->qk_nope, rope = c->qk_rope, dqk = nope + rope;
    int dv = c->v_head_dim, kvr = c->kv_lora_rank, R = g->R, kvw = nope + dv, m = g->e->layer_slot[l];
    if (c->q_lora_rank > 0) {
        CK(lin(mb, mb->cq32, c->q_lora_rank, 0.f, mb->xn, d, G->w_qa, T, c->q_lora_rank, d));
        CK(st_cuda_rmsnorm(s, mb->cq, NULL, mb->cq32, G->qa_norm, T, c->q_lora_rank, MLA_NORM_EPS));
        CK(lin(mb, mb->qm32, H * dqk, 0.f, mb->cq, c->q_lora_rank, G->w_q, T, H * dqk, c->q_lora_rank));
    } else {
        CK(lin(mb, mb->qm32, H * dqk, 0.f, mb->xn, d, G->w_q, T, H * dqk, d));
    }
    gtrace(mb, l, ST_TRACE_MLA_Q, mb->qm32, false, H * dqk, H * dqk, false);
    CK(lin(mb, mb->ckv, R, 0.f, mb->xn, d, G->w_kva, T, R, d));
    const int *bt = mb->d_btab + (size_t)m * mb->fm->n_seqs * g->e->pps;
    CK(st_cuda_mla_kv_store(s, g->kv_pool, false, mb->ckv, G->kva_norm, mb->d_tok_ent, mb->d_tok_pos, bt, g->e->pps,
                       g->e->page_size, T, kvr, R, MLA_NORM_EPS));
    /* absorbed form for every query (SPEC §4): q' = [W_UK,hᵀ q_nope ; q_pe], o_h = W_UV,h ō_h, over
     * the bf16 cache (an fp32 absorption and cache changed neither the sublayer nor the end-to-end
     * error on `small`, docs/perf/history.md) */
    float scale = 1.0f / sqrtf((float)dqk);
    CK(st_cuda_f32_to_bf16(s, mb->qm, mb->qm32, (size_t)T * H * dqk));
    CK(st_cuda_linear_heads(s, mb->qabs, false, H * R, R, mb->qm, H * dqk, dqk, G->w_kvb, kvr, (long long)kvw * kvr, false,
                       T, kvr, nope, H));
    CK(st_cuda_mla_qpe(s, mb->qabs, false, mb->qm32, T, H, nope, rope, kvr));
    if (mb->all_decode && R == 576 && kvr == 512)
        CK(st_cuda_mla_decode(s, mb->olat, mb->qabs, g->kv_pool, bt, mb->d_len, mb->fm->n_seqs, H, g->e->page_size,
                              g->e->pps, mb->max_len, MLA_SPLIT, scale, g->mla_ws, g->mla_ws_bytes));
    else
        CK(st_cuda_mla_attn(s, mb->olat, NULL, mb->qabs, g->kv_pool, false, mb->d_tok_ent, mb->d_tok_pos, bt, g->e->pps,
                       g->e->page_size, T, H, R, kvr, scale, g->mla_dmin ? mb->d_cu : NULL, g->mla_dmin));
    const st_bf16_t *w_uv = G->w_kvb + (size_t)nope * kvr;
    if (c->mla_output_gate) { /* o = W_UV ō in fp32, then ⊙ σ(gate); rounded once */
        CK(st_cuda_linear_heads(s, mb->o32, true, H * dv, dv, mb->olat, H * kvr, kvr, w_uv, kvr, (long long)kvw * kvr, true,
                           T, dv, kvr, H));
        mla_direct(mb, G, l, mb->o32, NULL, scale);
        CK(lin(mb, mb->gate, H * dv, 0.f, mb->xn, d, G->w_mg, T, H * dv, d));
        CK(st_cuda_mul_sigmoid(s, mb->o, NULL, mb->o32, mb->gate, (size_t)T * H * dv));
    } else {
        CK(st_cuda_linear_heads(s, mb->o, false, H * dv, dv, mb->olat, H * kvr, kvr, w_uv, kvr, (long long)kvw * kvr, true, T,
                           dv, kvr, H));
        mla_direct(mb, G, l, NULL, mb->o, scale);
    }
    gtrace(mb, l, ST_TRACE_ATTN_O, mb->o, true, H * dv, H * dv, false);
}

/* partial += down · GLU(xn · guᵀ); h2 = xn · guᵀ is there already when gu_done (moe_pre) */
static void ffn_add(cmb_t *mb, const st_bf16_t *gu, const st_bf16_t *down, int w, bool gu_done) {
    cu_t *g = mb->g;
    const st_config_t *c = &g->e->c;
    int T = mb->fm->T, d = c->d;
    if (!gu_done) CK(lin(mb, mb->h2, 2 * w, 0.f, mb->xn, d, gu, T, 2 * w, d));
    CK(st_cuda_glu(mb->s, mb->hh, NULL, mb->h2, mb->h2 + w, T, w, 2 * w, c->act == ST_ACT_SITU, c->situ_beta1,
                c->situ_beta2));
    CK(lin(mb, mb->partial, d, 1.f, mb->hh, w, down, T, d, w));
}

/* The count and route observers of layer l, from the host copies (engine.h). */
static void deliver(cmb_t *mb, int l) {
    st_engine_t *e = mb->g->e;
    int T = mb->fm->T, n = e->c.n_experts;
    if (mb->counted) e->cobs(e->cobs_ctx, l, T, n, mb->qc_h, mb->banded ? mb->qc_h + n : NULL);
    if (e->obs)
        e->obs(e->obs_ctx, l, T, n, mb->counted || !e->obs_scores ? NULL : mb->scores_h, mb->ids_h, mb->cnt_h, e->kcap);
}

/* The route observer (engine.h): the scores come back with the hand-off and the observer runs in
 * collect (micro-batches); st_engine_step's walk copies and calls it here. A counted layer's
 * threshold counts come back instead of the scores: made on the device by the router itself
 * (st_cuda_router_quantile_count, in route), or, on a layer routed on the host (scores_host: its σ
 * scores are in scores_h already), there by the C twin, the same integers. */
static void observe(cmb_t *mb, int l, bool scores_host) {
    cu_t *g = mb->g;
    st_engine_t *e = g->e;
    int T = mb->fm->T, n = e->c.n_experts, kc = e->kcap;
    const float *rho = st_engine_probe_row(e, l);
    mb->counted = st_engine_counted(e, l);
    mb->banded = mb->counted && rho;
    if (mb->counted && scores_host) {
        st_route_count(mb->qc_h, rho ? mb->qc_h + n : NULL, mb->scores_h, e->tau + (size_t)l * n, rho, T, n);
    } else if (mb->counted) {
        CK(st_gpu_memcpy_async(mb->s, mb->qc_h, mb->qc, (size_t)(rho ? 2 : 1) * n * sizeof(uint32_t), ST_GPU_COPY_D2H));
    } else if (e->obs && e->obs_scores) {
        CK(st_gpu_memcpy_async(mb->s, mb->scores_h, mb->scores, (size_t)T * n * sizeof(float), ST_GPU_COPY_D2H));
    }
    if (!mb->fm->internal || (!e->obs && !mb->counted)) return;
    CK(st_gpu_memcpy_async(mb->s, mb->ids_h, mb->ids, (size_t)T * kc * sizeof(int), ST_GPU_COPY_D2H));
    CK(st_gpu_memcpy_async(mb->s, mb->cnt_h, mb->cnt, (size_t)T * sizeof(int), ST_GPU_COPY_D2H));
    CK(st_gpu_stream_sync(mb->s));
    deliver(mb, l);
}

/* The three GEMMs of a latent MoE layer that read xn: router scores (fp32), z = xn · lat_downᵀ (bf16)
 * and the shared experts' gate|up (fp32, for ffn_add after the routed experts): one call, so decode
 * steps launch them once (st_cuda_linear_multi). Not with other layouts; a property of the engine,
 * so graph replays (which run no host code) agree with it. */
static bool moe_fused(const cu_t *g) { return g->e->c.latent > 0 && g->e->c.n_shared > 0; }
static void moe_pre(cmb_t *mb, const gl_t *G) {
    cu_t *g = mb->g;
    const st_config_t *c = &g->e->c;
    int n = c->n_experts, ew = st_config_expert_width(c), w = c->n_shared * c->moe_inter;
    if (!moe_fused(g)) return;
    st_linear_seg_t sg[3] = {{G->router, mb->scores, n, n, true, 0.f},
                             {G->lat_down, mb->z, ew, ew, false, 0.f},
                             {G->sh_gu, mb->h2, 2 * w, 2 * w, true, 0.f}};
    CK(st_cuda_linear_multi(mb->s, mb->xn, c->d, mb->fm->T, c->d, sg, 3));
}

/* Quantile routing on the device: thresholds set for layer l, no hook that may rewrite the sets,
 * not opts.host_route, and the routing stride is k_max. */
static bool device_quantile(const cu_t *g, int l) {
    const st_engine_t *e = g->e;
    return st_engine_route_quantile(e, l) && !e->hook && !st_engine_host_routes(e);
}

static void route(cmb_t *mb, const gl_t *G, int l) {
    cu_t *g = mb->g;
    st_engine_t *e = g->e;
    const st_config_t *c = &e->c;
    const st_gpu_stream_t *s = mb->s;
    int T = mb->fm->T, n = c->n_experts, k = c->top_k, kc = e->kcap;
    if (!moe_fused(g)) CK(lin(mb, mb->scores, n, 0.f, mb->xn, c->d, G->router, T, n, c->d));
    if (device_quantile(g, l)) { /* σ in place, the sets and weights (and counts): no host round trip */
        const float *tau = g->tau_d + (size_t)l * n;
        if (st_engine_counted(e, l)) {
            const float *rho = st_engine_probe_row(e, l) ? g->rho_d + (size_t)l * n : NULL;
            CK(st_cuda_router_quantile_count(s, mb->ids, mb->wts, mb->cnt, mb->scores, tau, T, n, kc, c->renormalize,
                                             c->routed_scale, mb->qc, rho));
        } else {
            CK(st_cuda_router_quantile(s, mb->ids, mb->wts, mb->cnt, mb->scores, tau, T, n, kc, c->renormalize,
                                       c->routed_scale));
        }
        observe(mb, l, false);
        return;
    }
    /* σ in place and the top-k sets, weights and counts: one kernel (the sets the hook sees, or the
     * scores the host's quantile routing reads) */
    CK(st_cuda_router_topk(s, mb->ids, mb->wts, kc, mb->cnt, mb->scores, G->router_bias, T, n, k, c->renormalize,
                           c->routed_scale));
    if (!st_engine_route_quantile(e, l) && !e->hook) {
        observe(mb, l, false);
        return;
    }
    CK(st_gpu_memcpy_async(s, mb->scores_h, mb->scores, (size_t)T * n * sizeof(float), ST_GPU_COPY_D2H));
    CK(st_gpu_memcpy_async(s, mb->ids_h, mb->ids, (size_t)T * kc * sizeof(int), ST_GPU_COPY_D2H));
    CK(st_gpu_memcpy_async(s, mb->cnt_h, mb->cnt, (size_t)T * sizeof(int), ST_GPU_COPY_D2H));
    CK(st_gpu_stream_sync(s));
    st_engine_route_host(e, l, T, mb->scores_h, mb->ids_h, mb->cnt_h, mb->wq_h); /* the weights: on the device */
    CK(st_gpu_memcpy_async(s, mb->ids, mb->ids_h, (size_t)T * kc * sizeof(int), ST_GPU_COPY_H2D));
    CK(st_gpu_memcpy_async(s, mb->cnt, mb->cnt_h, (size_t)T * sizeof(int), ST_GPU_COPY_H2D));
    CK(st_cuda_route_finish(s, mb->ids, mb->wts, mb->cnt, mb->scores, T, n, kc, c->renormalize, c->routed_scale));
    observe(mb, l, true);
}

/* Whether the routed experts of a T-token step run per slot (st_cuda_moe_ffn_slots) here; a GPU expert
 * server applies the same rule to the dispatch's slots (docs/architecture.md, "Bit-exact expert
 * results") */
static bool slots_path(const cu_t *g, int T) {
    const st_config_t *c = &g->e->c;
    long S = (long)T * g->e->kcap;
    return S <= EG_SLOTS_CAP && st_cuda_moe_ffn_slots_pick((int)S, c->n_experts, st_config_expert_width(c), c->moe_inter);
}

/* Routed experts on the device: per slot at decode sizes (yg in slot order), else group by expert,
 * gather, grouped FFN → yg (grouped rows). */
static void experts_local(cmb_t *mb, const gl_t *G) {
    cu_t *g = mb->g;
    const st_config_t *c = &g->e->c;
    const st_gpu_stream_t *s = mb->s;
    int T = mb->fm->T, kc = g->e->kcap, E = c->n_experts, ew = st_config_expert_width(c), mi = c->moe_inter;
    bool situ = c->act == ST_ACT_SITU;
    mb->slot_order = false;
    mb->local_done = true;
    if (slots_path(g, T)) { /* decode sizes */
        CK(st_cuda_moe_ffn_slots(s, mb->yg, mb->hs, mb->z, mb->ids, mb->cnt, T, kc, G->ex_w1, G->ex_w3, G->ex_w2, ew,
                                 mi, situ, c->situ_beta1, c->situ_beta2));
        mb->slot_order = true;
        return;
    }
    CK(st_cuda_moe_group(s, mb->offsets, mb->row_of, mb->ids, mb->cnt, T, kc, E));
    CK(st_cuda_moe_gather(s, mb->xg, mb->z, mb->row_of, mb->cnt, T, kc, ew));
    CK(st_cuda_moe_ffn(s, mb->yg, mb->xg, mb->offsets, E, T * kc, T, G->ex_w1, G->ex_w3, G->ex_w2, ew, mi, situ,
                              c->situ_beta1, c->situ_beta2, mb->ffn_ws, mb->ffn_ws_bytes));
}

/* Hand-off of layer l's routed tokens: z as it is (bf16), ids, counts and weights into the pinned
 * buffers, queued (collect waits for mb->ev). */
static void handoff(st_engine_mb_t *fm, int l, st_moe_work_t *w) {
    cmb_t *mb = CMB(fm);
    cu_t *g = mb->g;
    const st_config_t *c = &g->e->c;
    const st_gpu_stream_t *s = mb->s;
    int T = fm->T, kc = g->e->kcap, ew = st_config_expert_width(c);
    chain_record(mb);
    CK(st_gpu_memcpy_async(s, mb->zb_h, mb->z, (size_t)T * ew * sizeof(st_bf16_t), ST_GPU_COPY_D2H));
    CK(st_gpu_memcpy_async(s, mb->ids_h, mb->ids, (size_t)T * kc * sizeof(int), ST_GPU_COPY_D2H));
    CK(st_gpu_memcpy_async(s, mb->cnt_h, mb->cnt, (size_t)T * sizeof(int), ST_GPU_COPY_D2H));
    CK(st_gpu_memcpy_async(s, mb->wts_h, mb->wts, (size_t)T * kc * sizeof(float), ST_GPU_COPY_D2H));
    if (!mb->capturing) CK(st_gpu_event_record(mb->ev, s)); /* collect waits for this, not for the whole stream */
    *w = (st_moe_work_t){.layer = l, .T = T, .kc = kc, .ew = ew, .zb = mb->zb_h, .ids = mb->ids_h, .cnt = mb->cnt_h,
                         .wts = mb->wts_h, .tok_ent = mb->meta_h + T, .out = mb->out_h, .at = mb->at_h};
}

/* ------------------------------------------------------------------ the walk's ops */

static void launch_begin(st_engine_mb_t *fm) {
    cmb_t *mb = CMB(fm);
    if (mb->fresh) queue_begin(mb);
    if (st_gpu_init(fm->e->o.device) != ST_OK && fm->err == ST_OK) fm->err = ST_ERR_INTERNAL;
}

static void attn_norm(st_engine_mb_t *fm, int l, bool push) {
    cmb_t *mb = CMB(fm);
    cu_t *g = mb->g;
    const st_config_t *c = &g->e->c;
    const gl_t *G = &g->L[l];
    int d = c->d, T = fm->T;
    gtrace(mb, l, ST_TRACE_PARTIAL_IN, mb->partial, false, d, d, true);
    /* NOTE: the block-start norm folded into the phase-1 launch up to EG_AR_FOLD_T tokens: it saves a
     * launch (decode), but its extra thread-block group re-reads every block row, which costs more
     * than the fused norm's one read of the partial beyond (bench_gpu_attnres, H200: d 1024 T 128
     * 7.9 vs 11.4 µs, T 256 12.5 vs 12.6, T 8192 372 vs 237; d 7168 T 128 81 vs 98, T 256 198 vs 119) */
    bool fold = push && T <= EG_AR_FOLD_T;
    if (!fold) resnorm(mb, mb->xn, g->e->q_attn[l], G->in_norm, NULL, T);
    if (push) { /* the partial becomes block nb; phase 1 for the next B layers' queries */
        size_t bs = (size_t)g->e->o.max_batch_tokens * d;
        /* the block-start norm's query: the last one of the previous block set (any query before the
         * first block: one block mixes to itself) */
        const float *wq = fm->nb > 0 ? g->bq[fm->nb - 1].w + (size_t)g->e->q_attn[l] * d : g->bq[0].w;
        const gbq_t *bq = &g->bq[fm->nb];
        /* fold: one launch for the norm of the mixed blocks (= the previous set + the partial) */
        st_attnres_xnorm_t x = {wq, G->in_norm, c->rms_eps, mb->xn, NULL};
        CK(st_cuda_attnres_phase1_push(mb->s, mb->stats, mb->acc, mb->blocks, bs, mb->partial, fm->nb + 1, bq->w, bq->Q,
                                       T, d, c->rms_eps, 0, fold ? &x : NULL));
    }
    gtrace(mb, l, ST_TRACE_XN_ATTN, mb->xn, true, d, d, false);
}

static void kda_op(st_engine_mb_t *fm, int l) { kda_layer(CMB(fm), &CU(fm->e)->L[l], l); }
static void mla_op(st_engine_mb_t *fm, int l) { mla_layer(CMB(fm), &CU(fm->e)->L[l], l); }

/* o-projection straight into the residual stream: partial = a (block start) or += a */
static void attn_out(st_engine_mb_t *fm, int l, bool push) {
    cmb_t *mb = CMB(fm);
    cu_t *g = mb->g;
    const st_config_t *c = &g->e->c;
    int d = c->d, ow = c->is_mla[l] ? c->mla_heads * c->v_head_dim : g->P;
    CK(lin(mb, mb->partial, d, push ? 0.f : 1.f, mb->o, ow, g->L[l].w_o, fm->T, d, ow));
    gtrace(mb, l, ST_TRACE_PARTIAL_MID, mb->partial, false, d, d, true);
}

static void mlp_norm(st_engine_mb_t *fm, int l) {
    cmb_t *mb = CMB(fm);
    cu_t *g = mb->g;
    int d = g->e->c.d;
    resnorm(mb, mb->xn, g->e->q_mlp[l], g->L[l].post_norm, NULL, fm->T);
    gtrace(mb, l, ST_TRACE_XN_MLP, mb->xn, true, d, d, false);
}

static void dense_ffn(st_engine_mb_t *fm, int l) {
    cmb_t *mb = CMB(fm);
    const gl_t *G = &mb->g->L[l];
    ffn_add(mb, G->dense_gu, G->dense_down, mb->g->e->c.intermediate, false);
}

/* Routing and the experts' input z (bf16 [T, ew]); the work item is the hand-off's. */
static void moe_begin(st_engine_mb_t *fm, int l, st_moe_work_t *w) {
    cmb_t *mb = CMB(fm);
    cu_t *g = mb->g;
    const st_config_t *c = &g->e->c;
    const gl_t *G = &g->L[l];
    int d = c->d, ew = st_config_expert_width(c), T = fm->T;
    moe_pre(mb, G);
    route(mb, G, l);
    if (c->latent > 0) { /* (moe_pre computed z already when fused) */
        if (!moe_fused(g)) CK(st_cuda_linear(mb->s, mb->z, ew, false, 0.f, mb->xn, d, G->lat_down, T, ew, d));
    } else {
        CK(st_gpu_memcpy_async(mb->s, mb->z, mb->xn, (size_t)T * d * 2, ST_GPU_COPY_D2D));
    }
    gtrace(mb, l, ST_TRACE_MOE_Z, mb->z, true, ew, ew, false);
    mb->local_done = false;
}

/* NOTE: the experts run on the device from the device copy of z; work->out is not written, the
 * combine reads the device rows (engine.h: local experts only). */
static void experts_op(st_engine_mb_t *fm, const st_moe_work_t *w) { experts_local(CMB(fm), &CU(fm->e)->L[fm->l]); }

/* Combine (latent width, slot order), norm, up-projection and shared experts into partial. */
static void moe_finish(st_engine_mb_t *fm, int l) {
    cmb_t *mb = CMB(fm);
    cu_t *g = mb->g;
    const st_config_t *c = &g->e->c;
    const st_gpu_stream_t *s = mb->s;
    const gl_t *G = &g->L[l];
    int T = fm->T, kc = g->e->kcap, ew = st_config_expert_width(c), d = c->d;
    /* the combine reads expert rows through row_of (grouped), or in slot order (handed-off rows, or
     * slots); remote experts: the executor's node values, where they lie in host memory (engine.h) */
    bool remote = g->e->o.remote_experts;
    const float *yg = mb->local_done && !mb->slot_order ? mb->yg : NULL;
    const float *yf = remote ? NULL : !mb->local_done ? mb->eout : mb->slot_order ? mb->yg : NULL;
    const float *const *at = remote ? mb->at_h : NULL;
    const float *wts = remote ? NULL : mb->wts;
    if ((remote || !mb->local_done) && mb->rel) { /* the executor's rows: once the host released them */
        uint64_t ns = (uint64_t)g->e->o.handoff_timeout_ms * 1000000u;
        CK(st_cuda_flag_wait(s, &mb->rel[0], 0, &mb->rel[1], ns, &mb->rel[2]));
    }
    if (!remote && !mb->local_done)
        CK(st_gpu_memcpy_async(s, mb->eout, mb->out_h, (size_t)T * kc * ew * sizeof(float), ST_GPU_COPY_H2D));
    chain_wait(mb);
    if (c->latent > 0) {
        CK(st_cuda_moe_combine(s, mb->un, NULL, NULL, yg, yf, at, mb->row_of, wts, mb->ids, mb->cnt, G->lat_norm, T, kc,
                               ew, c->rms_eps));
        gtrace(mb, l, ST_TRACE_MOE_U, mb->un, true, ew, ew, false);
        CK(lin(mb, mb->partial, d, 1.f, mb->un, ew, G->lat_up, T, d, ew));
    } else {
        CK(st_cuda_moe_combine(s, NULL, NULL, mb->partial, yg, yf, at, mb->row_of, wts, mb->ids, mb->cnt, NULL, T, kc, ew,
                               c->rms_eps));
    }
    if (c->n_shared > 0) ffn_add(mb, G->sh_gu, G->sh_down, c->n_shared * c->moe_inter, moe_fused(g));
}

static void launch_end(st_engine_mb_t *fm) {
    cmb_t *mb = CMB(fm);
    int d = fm->e->c.d;
    gtrace(mb, fm->e->c.n_layers, ST_TRACE_PARTIAL_IN, mb->partial, false, d, d, true);
    chain_record(mb);
    if (!fm->internal && !mb->capturing) CK(st_gpu_event_record(mb->ev, mb->s));
}

static bool ready(st_engine_mb_t *fm) { return st_gpu_event_done(CMB(fm)->ev); }

/* After the device work up to a sync point: a combine that waited in vain for its release fails the
 * step (its rows were not the executor's). */
static void release_check(cmb_t *mb) {
    if (!mb->rel || !__atomic_load_n(&mb->rel[2], __ATOMIC_ACQUIRE)) return;
    __atomic_store_n(&mb->rel[2], 0u, __ATOMIC_RELEASE);
    st_engine_mb_t *fm = mb->fm;
    st_status_t s = ST_FAIL(ST_ERR_TIMEOUT, "engine: a micro-batch's expert results were not released within %d ms",
                            fm->e->o.handoff_timeout_ms);
    if (fm->err == ST_OK) fm->err = s;
}

/* The hand-off copies landed; the observer reads the scores and sets that came back with them. The
 * next combine waits for this hand-off's release. */
static void handoff_wait(st_engine_mb_t *fm) {
    cmb_t *mb = CMB(fm);
    st_engine_t *e = fm->e;
    if (st_gpu_init(e->o.device) != ST_OK && fm->err == ST_OK) fm->err = ST_ERR_INTERNAL;
    CK(st_gpu_event_sync(mb->ev));
    release_check(mb);
    __atomic_store_n(&mb->rel[1], ++mb->hand, __ATOMIC_RELEASE);
    deliver(mb, fm->l);
}

static void release(st_engine_mb_t *fm) {
    cmb_t *mb = CMB(fm);
    __atomic_store_n(&mb->rel[0], mb->hand, __ATOMIC_RELEASE);
}

/* The hand-off's z rows by the copy engine (nothing is queued behind the hand-off: engine.c checks) */
static st_status_t copy_z(st_engine_mb_t *fm, const int *first, const int *count, void *const *dst, int n) {
    cmb_t *mb = CMB(fm);
    size_t ew = (size_t)st_config_expert_width(&fm->e->c);
    st_status_t s = st_gpu_init(fm->e->o.device);
    for (int i = 0; i < n && s == ST_OK; i++)
        if (count[i])
            s = st_gpu_memcpy_async(mb->s, dst[i], mb->z + (size_t)first[i] * ew,
                                    (size_t)count[i] * ew * sizeof(st_bf16_t), ST_GPU_COPY_D2H);
    if (s == ST_OK) s = st_gpu_stream_sync(mb->s);
    return s;
}

static st_status_t peer_mem(st_engine_mb_t *fm, st_engine_peer_mem_t *out) {
    cmb_t *mb = CMB(fm);
    st_engine_t *e = fm->e;
    if (fm->internal || !mb->eout || !mb->z) return ST_FAIL(ST_ERR_UNSUPPORTED, "engine: no hand-off buffers to share");
    /* NOTE: in remote mode eout (the local hand-off's expert rows) is unused: it takes the replies */
    uint8_t *base = mb->dev.base;
    st_engine_peer_mem_t p = {.reply = mb->eout,
                              .in_off = (size_t)((uint8_t *)mb->z - base),
                              .reply_off = (size_t)((uint8_t *)mb->eout - base),
                              .in_rows = (uint32_t)e->o.max_batch_tokens,
                              .reply_rows = (uint32_t)e->o.max_batch_tokens * (uint32_t)e->kcap};
    _Static_assert(sizeof p.handle == ST_GPU_IPC_HANDLE_BYTES, "IPC handle size");
    st_status_t s = st_gpu_init(e->o.device);
    if (s == ST_OK) s = st_gpu_ipc_export(base, p.handle);
    if (s == ST_OK) *out = p;
    return s;
}

/* The plan's device tables for S servers of E experts and M rows (T tokens of kc slots at most),
 * replacing smaller ones. */
static st_status_t plan_alloc(cmb_t *mb, int S, int E, int M, int T, int kc) {
    st_gpu_free(mb->pl_dev), st_gpu_free(mb->pl_ws), st_gpu_host_free(mb->pl_h);
    mb->pl_dev = mb->pl_ws = NULL, mb->pl_h = NULL;
    memset(&mb->pl, 0, sizeof mb->pl);
    size_t tables = st_moe_plan_bytes(S, E, M, kc), counts = st_moe_plan_counts_bytes(S, E);
    mb->pl_ws_bytes = st_cuda_moe_dispatch_plan_ws_bytes(T, kc, E, S);
    mb->pl_kc = kc;
    st_status_t s;
    if ((s = st_gpu_malloc(&mb->pl_dev, tables + 4 * (size_t)E + (size_t)T)) != ST_OK ||
        (s = st_gpu_malloc(&mb->pl_ws, mb->pl_ws_bytes)) != ST_OK ||
        (s = st_gpu_host_alloc((void **)&mb->pl_h, counts + 4 * (size_t)E + (size_t)T)) != ST_OK)
        return s;
    st_moe_plan_carve(&mb->pl, S, E, M, kc, mb->pl_dev);
    mb->pl_counts = counts, mb->pl_tables = tables;
    return ST_OK;
}

static st_status_t plan(st_engine_mb_t *fm, const st_moe_plan_t *p, int S, const int *server_of, bool *tok_failed) {
    cmb_t *mb = CMB(fm);
    st_engine_t *e = fm->e;
    const int T = fm->T, kc = fm->work.kc, E = p->n_experts, M = p->max_rows;
    st_status_t s = st_gpu_init(e->o.device);
    if (s == ST_OK && (mb->pl.n_servers < S || mb->pl.n_experts != E || mb->pl.max_rows != M || mb->pl_kc < kc))
        s = plan_alloc(mb, S, E, M, e->o.max_batch_tokens, kc);
    if (s != ST_OK) return s;
    /* server_of and the flags up, next to each other on both sides; the device tables keep their
     * allocation's strides (pl.n_servers ≥ S) */
    int *sof_h = (int *)((uint8_t *)mb->pl_h + mb->pl_counts), *sof_d = (int *)((uint8_t *)mb->pl_dev + mb->pl_tables);
    uint8_t *fail_h = (uint8_t *)(sof_h + E), *fail_d = (uint8_t *)(sof_d + E);
    memcpy(sof_h, server_of, sizeof(int) * (size_t)E);
    for (int t = 0; t < T; t++) fail_h[t] = tok_failed[t];
    st_moe_plan_t d = mb->pl;
    d.n_servers = S;
    d.wts = p->wts ? mb->pl.wts : NULL;
    const st_gpu_stream_t *st = mb->s;
    if ((s = st_gpu_memcpy_async(st, sof_d, sof_h, sizeof(int) * (size_t)E + (size_t)T, ST_GPU_COPY_H2D)) != ST_OK ||
        (s = st_cuda_moe_dispatch_plan(st, &d, mb->ids, mb->cnt, mb->wts, sof_d, fail_d, T, kc, mb->pl_ws,
                                       mb->pl_ws_bytes)) != ST_OK ||
        (s = st_gpu_memcpy_async(st, mb->pl_h, mb->pl_dev, mb->pl_counts, ST_GPU_COPY_D2H)) != ST_OK ||
        (s = st_gpu_memcpy_async(st, fail_h, fail_d, (size_t)T, ST_GPU_COPY_D2H)) != ST_OK ||
        (s = st_gpu_stream_sync(st)) != ST_OK)
        return s;
    /* the counts and the expert tables (where the carve put them on the device, in pl_h), then each
     * server's prefixes straight into p */
#define HOST(f) ((const void *)((const uint8_t *)mb->pl_h + ((const uint8_t *)d.f - (const uint8_t *)mb->pl_dev)))
    const int *hr = HOST(n_rows), *hx = HOST(n_exp), *ho = HOST(n_out), *hu = HOST(n_uniq);
    const uint32_t *hid = HOST(exp_ids), *hoff = HOST(offsets);
#undef HOST
    for (int v = 0; v < p->n_servers; v++) {
        bool in = v < S;
        p->n_rows[v] = in ? hr[v] : 0, p->n_exp[v] = in ? hx[v] : 0;
        p->n_out[v] = in ? ho[v] : 0, p->n_uniq[v] = in ? hu[v] : 0;
        uint32_t *off = p->offsets + (size_t)v * (E + 1);
        off[0] = 0;
        if (!in || !p->n_rows[v]) continue;
        memcpy(p->exp_ids + (size_t)v * E, hid + (size_t)v * E, sizeof(uint32_t) * (size_t)p->n_exp[v]);
        memcpy(off, hoff + (size_t)v * (E + 1), sizeof(uint32_t) * ((size_t)p->n_exp[v] + 1));
    }
    for (int t = 0; t < T; t++) tok_failed[t] = fail_h[t] != 0;
    for (int v = 0; v < S && s == ST_OK; v++) {
        size_t n = (size_t)p->n_rows[v], at = (size_t)v * M;
        if (!n) continue;
        struct {
            void *dst;
            const void *src;
            size_t words;
        } cp[] = {{p->pair + at, d.pair + at, n},
                  {p->orow + at, d.orow + at, n},
                  {p->src + at, d.src + at, n},
                  {p->node + at, d.node + at, (size_t)p->n_out[v]},
                  {p->utok + at, d.utok + at, (size_t)p->n_uniq[v]},
                  {p->wts ? p->wts + at : NULL, d.wts ? d.wts + at : NULL, n}};
        for (size_t i = 0; i < ST_ARRAY_LEN(cp) && s == ST_OK; i++)
            if (cp[i].dst) s = st_gpu_memcpy_async(st, cp[i].dst, cp[i].src, 4 * cp[i].words, ST_GPU_COPY_D2H);
    }
    return s == ST_OK ? st_gpu_stream_sync(st) : s;
}

/* The sampling entries' parameters for the head's row chunks of LR rows: list k in head-row order,
 * row relative to its chunk; returns how many, *lp whether any wants logprobs. */
static int sample_rows(cmb_t *mb, int LR, bool *lp) {
    const st_engine_mb_t *fm = mb->fm;
    int ns = 0, nb = 0;
    *lp = false;
    for (int i = 0, r = 0; i < fm->n_seqs; i++) {
        const st_seq_chunk_t *q = &fm->seqs[i];
        r += q->all_logits ? q->n_tokens : 1;
        const st_sample_params_t *p = q->sample;
        if (!p) continue;
        mb->srow_h[ns++] = (st_sample_row_t){.temperature = p->temperature, .top_p = p->top_p, .presence = p->presence,
                                             .frequency = p->frequency, .top_k = p->top_k, .n_top = p->n_top,
                                             .bias_off = nb, .n_bias = p->n_bias, .row = (r - 1) % LR,
                                             .count_row = q->slot, .pos = p->pos, .seed = p->seed};
        memcpy(mb->sbid_h + nb, p->bias_ids, (size_t)p->n_bias * sizeof(uint32_t));
        memcpy(mb->sbv_h + nb, p->bias_values, (size_t)p->n_bias * sizeof(float));
        nb += p->n_bias;
        *lp |= p->n_top >= 0;
    }
    const st_gpu_stream_t *s = mb->s;
    if (ns) CK(st_gpu_memcpy_async(s, mb->srow_d, mb->srow_h, (size_t)ns * sizeof(st_sample_row_t), ST_GPU_COPY_H2D));
    if (nb) {
        CK(st_gpu_memcpy_async(s, mb->sbid_d, mb->sbid_h, (size_t)nb * sizeof(uint32_t), ST_GPU_COPY_H2D));
        CK(st_gpu_memcpy_async(s, mb->sbv_d, mb->sbv_h, (size_t)nb * sizeof(float), ST_GPU_COPY_H2D));
    }
    return ns;
}

/* The head: final norm, lm_head, then per chunk of rows the argmax or sampling of the entries that
 * ask, and the logits the caller wants; synchronises. */
static void head(st_engine_mb_t *fm) {
    cmb_t *mb = CMB(fm);
    cu_t *g = mb->g;
    const st_config_t *c = &g->e->c;
    const st_gpu_stream_t *s = mb->s;
    int d = c->d, V = c->vocab, nr = mb->n_rows;
    resnorm(mb, mb->xf, g->e->q_out, g->final_norm, mb->d_rows, nr);
    /* rows of entries that want only the argmax (st_seq_chunk_t.argmax) or a sampled token without
     * keep_logits are not copied to the host */
    bool amax = false;
    for (int i = 0, r = 0; i < fm->n_seqs; i++) {
        const st_seq_chunk_t *q = &fm->seqs[i];
        bool only = (q->argmax && !q->all_logits) || (q->sample && !q->keep_logits);
        amax |= q->argmax && !q->all_logits;
        for (int t = q->all_logits ? 0 : q->n_tokens - 1; t < q->n_tokens; t++) mb->need[r++] = !only;
    }
    int LR = ST_MIN(fm->T, LOGIT_ROWS);
    bool want_lp;
    int ns = sample_rows(mb, LR, &want_lp), k0 = 0;
    for (int r0 = 0; r0 < nr; r0 += LR) {
        int rows = ST_MIN(LR, nr - r0);
        CK(lin(mb, mb->lg, V, 0.f, mb->xf + (size_t)r0 * d, d, g->lm_head, rows, V, d));
        if (amax) CK(st_cuda_argmax(s, mb->amax_d + r0, mb->lg, rows, V));
        int k1 = k0; /* this chunk's sampled rows: the next ones of the list */
        for (int i = 0, r = 0; i < fm->n_seqs; i++) {
            const st_seq_chunk_t *q = &fm->seqs[i];
            r += q->all_logits ? q->n_tokens : 1;
            k1 += q->sample && r - 1 >= r0 && r - 1 < r0 + rows;
        }
        if (k1 > k0)
            CK(st_cuda_sample(s, mb->sid_d + k0, mb->slp_d + k0, mb->stid_d + (size_t)k0 * ST_SAMPLE_MAX_TOP,
                              mb->stlp_d + (size_t)k0 * ST_SAMPLE_MAX_TOP, mb->lg, k1 - k0, V, mb->srow_d + k0,
                              mb->sbid_d, mb->sbv_d, g->counts_d));
        k0 = k1;
        bool copied = false;
        for (int a = 0, b; a < rows; a = b) { /* runs of rows the caller wants */
            for (b = a; b < rows && mb->need[r0 + b] == mb->need[r0 + a]; b++) {}
            if (!mb->need[r0 + a]) continue;
            CK(st_gpu_memcpy_async(s, fm->logits + (size_t)(r0 + a) * V, mb->lg + (size_t)a * V,
                               (size_t)(b - a) * V * sizeof(float), ST_GPU_COPY_D2H));
            copied = true;
        }
        if (copied) CK(st_gpu_stream_sync(s)); /* the caller's buffer is pageable */
    }
    if (amax) CK(st_gpu_memcpy_async(s, mb->amax_h, mb->amax_d, (size_t)nr * sizeof(int), ST_GPU_COPY_D2H));
    if (ns) CK(st_gpu_memcpy_async(s, mb->sid_h, mb->sid_d, (size_t)ns * sizeof(int), ST_GPU_COPY_D2H));
    if (want_lp) {
        size_t nt = (size_t)ns * ST_SAMPLE_MAX_TOP;
        CK(st_gpu_memcpy_async(s, mb->slp_h, mb->slp_d, (size_t)ns * sizeof(float), ST_GPU_COPY_D2H));
        CK(st_gpu_memcpy_async(s, mb->stid_h, mb->stid_d, nt * sizeof(int), ST_GPU_COPY_D2H));
        CK(st_gpu_memcpy_async(s, mb->stlp_h, mb->stlp_d, nt * sizeof(float), ST_GPU_COPY_D2H));
    }
    CK(st_gpu_stream_sync(s));
    release_check(mb);
    for (int i = 0, r = 0, k = 0; i < fm->n_seqs; i++) {
        const st_seq_chunk_t *q = &fm->seqs[i];
        r += q->all_logits ? q->n_tokens : 1;
        if (q->argmax && !q->all_logits) *q->argmax = mb->amax_h[r - 1];
        if (!q->sample) continue;
        *q->token = mb->sid_h[k];
        if (q->sample->n_top >= 0) {
            int nt = ST_MIN(q->sample->n_top, V);
            *q->logprob = mb->slp_h[k];
            memcpy(q->top_ids, mb->stid_h + (size_t)k * ST_SAMPLE_MAX_TOP, (size_t)nt * sizeof(int));
            memcpy(q->top_logprobs, mb->stlp_h + (size_t)k * ST_SAMPLE_MAX_TOP, (size_t)nt * sizeof(float));
        }
        k++;
    }
}

/* ------------------------------------------------------------------ decode steps as CUDA graphs */

void st_engine_cuda_set_graphs(st_engine_t *e, bool on) {
    cu_t *g = e->be == &st_engine_backend_cuda ? CU(e) : NULL;
    if (!g) return;
    g->graphs = on;
    for (int i = 0; i < EGPU_GRAPHS; i++) { /* the next steps capture again, with the kernels chosen then */
        st_gpu_graph_destroy(g->gr[i].exec);
        g->gr[i].exec = NULL;
    }
    for (int i = 0; i < EGPU_SEGS; i++) {
        st_gpu_graph_destroy(g->seg[i].exec);
        g->seg[i].exec = NULL;
    }
}

/* A decode step's layers as a CUDA graph: the same launches (metadata copy from the pinned buffer,
 * embedding, every layer with its local experts: the frontend's walk, st_engine_mb_launch), which
 * read the step's tokens, slots, lengths and block tables from device memory, so one capture serves
 * every step with the same token count and MLA split bound; the head runs after it as usual. Steps
 * with host round trips (a hook, an observer of either kind, the trace, host routing) are not captured. Queues
 * nothing when the step does not qualify or the capture failed (graphs are then switched off with
 * a warning). */
static void graph_step(st_engine_mb_t *fm) {
    cmb_t *mb = CMB(fm);
    cu_t *g = mb->g;
    st_engine_t *e = g->e;
    if (!g->graphs || !mb->all_decode || e->hook || e->obs || e->cobs || e->trace || st_engine_host_routes(e)) return;
    int hit = -1, victim = 0;
    for (int i = 0; i < EGPU_GRAPHS; i++) {
        if (g->gr[i].exec && g->gr[i].T == fm->T && g->gr[i].lb == mb->max_len) hit = i;
        if (g->gr[i].used < g->gr[victim].used) victim = i;
    }
    if (hit < 0) {
        void *exec = NULL;
        if (st_gpu_capture_begin(mb->s) != ST_OK) {
            g->graphs = false;
            return;
        }
        st_engine_mb_launch(fm);
        st_status_t se = st_gpu_capture_end(mb->s, &exec);
        if (se != ST_OK || fm->err != ST_OK || fm->pend != 2) {
            st_log_warn("gpu engine: decode step graph capture failed (%s); graphs off", st_err_last());
            st_gpu_graph_destroy(exec);
            g->graphs = false;
            /* nothing ran: the walk starts over */
            fm->err = ST_OK, fm->l = 0, fm->nb = 0, fm->pend = 0, fm->waiting = false, mb->fresh = true;
            return;
        }
        hit = victim;
        st_gpu_graph_destroy(g->gr[hit].exec);
        g->gr[hit].exec = exec;
        g->gr[hit].T = fm->T, g->gr[hit].lb = mb->max_len;
        g->gr[hit].l = fm->l, g->gr[hit].nb = fm->nb, g->gr[hit].pend = fm->pend;
        g->gr[hit].local_done = mb->local_done, g->gr[hit].slot_order = mb->slot_order;
    }
    g->gr[hit].used = ++g->gr_clock;
    CK(st_gpu_graph_launch(g->gr[hit].exec, mb->s));
    fm->l = g->gr[hit].l, fm->nb = g->gr[hit].nb, fm->pend = g->gr[hit].pend, mb->local_done = g->gr[hit].local_done;
    mb->slot_order = g->gr[hit].slot_order;
    fm->waiting = false, mb->fresh = false;
}

/* ------------------------------------------------------------------ micro-batch launches as CUDA graphs */

/* What a graph of a walk ending at MoE layer l holds of the routing: route's branch (quantile or
 * top-k, on the device or the host) and observe's copies (counted, banded). */
static unsigned route_sig(const cu_t *g, int l) {
    const st_engine_t *e = g->e;
    if (l < 0) return 0;
    return (unsigned)st_engine_route_quantile(e, l) | (unsigned)device_quantile(g, l) << 1 |
           (unsigned)st_engine_counted(e, l) << 2 | (unsigned)(st_engine_probe_row(e, l) != NULL) << 3;
}

/* The MoE layer where a walk from (l, waiting) hands off, or -1 when it runs to the end. */
static int seg_end_layer(const st_engine_mb_t *fm) {
    const st_config_t *c = &fm->e->c;
    for (int l = fm->l + (fm->waiting ? 1 : 0); l < c->n_layers; l++)
        if (st_config_is_moe_layer(c, l)) return l;
    return -1;
}

static int seg_find(const cu_t *g, const cmb_t *mb) {
    const st_engine_mb_t *fm = mb->fm;
    for (int i = 0; i < EGPU_SEGS; i++)
        if (g->seg[i].exec && g->seg[i].mb == mb && g->seg[i].l0 == fm->l && g->seg[i].wait0 == fm->waiting &&
            g->seg[i].fresh0 == mb->fresh && g->seg[i].T == fm->T && g->seg[i].lb == mb->max_len &&
            g->seg[i].nb0 == fm->nb && g->seg[i].ld0 == mb->local_done && g->seg[i].so0 == mb->slot_order &&
            g->seg[i].sig == route_sig(g, g->seg[i].l_end))
            return i;
    return -1;
}

/* What a micro-batch's graph cannot hold, queued around it on the stream: the wait for seq_reset's
 * state resets (first launch of a step) and for the previous micro-batch's compute (chain_wait)
 * before; the chain and the collect event after. */
static void seg_before(cmb_t *mb, bool fresh) {
    if (fresh) wait_open(mb);
    chain_wait(mb);
}
static void seg_after(cmb_t *mb) {
    chain_record(mb);
    CK(st_gpu_event_record(mb->ev, mb->s));
}

/* A micro-batch's launch (the frontend's walk to its next hand-off) replayed as a CUDA graph
 * (engine_impl.h, segment): decode micro-batches of a shape seen at the previous step too (a batch
 * whose size changes every step would capture at every step), with no host round trip inside the
 * walk (route hook, trace, routing on the host). The graph reads the step's metadata, tokens and
 * the hand-off's pinned buffers at fixed addresses; thresholds are read from the device, so new
 * values need no new capture, only a change of a layer's routing branch does (route_sig). */
static bool segment(st_engine_mb_t *fm, int op) {
    cmb_t *mb = CMB(fm);
    cu_t *g = mb->g;
    st_engine_t *e = g->e;
    if (op == ST_SEG_REPLAY || op == ST_SEG_CAPTURE) {
        if (!g->graphs || fm->internal || !mb->all_decode || !mb->stable || e->hook || e->trace) return false;
        if (op == ST_SEG_REPLAY) {
            int i = seg_find(g, mb);
            if (i < 0) return false;
            if (st_gpu_init(e->o.device) != ST_OK && fm->err == ST_OK) fm->err = ST_ERR_INTERNAL;
            seg_before(mb, mb->fresh);
            CK(st_gpu_graph_launch(g->seg[i].exec, mb->s));
            seg_after(mb);
            g->seg[i].used = ++g->seg_clock;
            fm->l = g->seg[i].l, fm->nb = g->seg[i].nb, fm->pend = g->seg[i].pend, fm->waiting = g->seg[i].waiting;
            fm->work = g->seg[i].work;
            mb->local_done = g->seg[i].local_done, mb->slot_order = g->seg[i].slot_order;
            mb->counted = g->seg[i].counted, mb->banded = g->seg[i].banded;
            mb->fresh = false;
            return true;
        }
        int le = seg_end_layer(fm);
        unsigned sig = route_sig(g, le);
        if ((sig & 1u) && !(sig & 2u)) return false; /* routed on the host: a sync inside the walk */
        if (st_gpu_init(e->o.device) != ST_OK) return false;
        mb->cap0.l = fm->l, mb->cap0.nb = fm->nb, mb->cap0.waiting = fm->waiting, mb->cap0.fresh = mb->fresh;
        mb->cap0.local_done = mb->local_done, mb->cap0.slot_order = mb->slot_order;
        seg_before(mb, mb->fresh);
        mb->cap0.err = fm->err;
        if (st_gpu_capture_begin(mb->s) != ST_OK) {
            g->graphs = false;
            st_log_warn("gpu engine: micro-batch graph capture failed (%s); graphs off", st_err_last());
            return false;
        }
        mb->capturing = true;
        return true;
    }
    /* ST_SEG_END */
    void *exec = NULL;
    st_status_t se = st_gpu_capture_end(mb->s, &exec);
    mb->capturing = false;
    if (se != ST_OK || fm->err != mb->cap0.err) {
        st_log_warn("gpu engine: micro-batch graph capture failed (%s); graphs off", st_err_last());
        st_gpu_graph_destroy(exec);
        g->graphs = false;
        fm->err = mb->cap0.err; /* nothing ran: the walk runs again, plainly (its own errors count) */
        mb->fresh = mb->cap0.fresh, mb->local_done = mb->cap0.local_done, mb->slot_order = mb->cap0.slot_order;
        return false;
    }
    int v = 0;
    for (int i = 1; i < EGPU_SEGS; i++)
        if (!g->seg[i].exec || (g->seg[v].exec && g->seg[i].used < g->seg[v].used)) v = i;
    st_gpu_graph_destroy(g->seg[v].exec);
    int le = fm->pend == 1 ? fm->l : -1;
    g->seg[v].mb = mb, g->seg[v].l0 = mb->cap0.l, g->seg[v].nb0 = mb->cap0.nb, g->seg[v].wait0 = mb->cap0.waiting;
    g->seg[v].fresh0 = mb->cap0.fresh, g->seg[v].T = fm->T, g->seg[v].lb = mb->max_len;
    g->seg[v].ld0 = mb->cap0.local_done, g->seg[v].so0 = mb->cap0.slot_order;
    g->seg[v].l_end = le, g->seg[v].sig = route_sig(g, le);
    g->seg[v].l = fm->l, g->seg[v].nb = fm->nb, g->seg[v].pend = fm->pend, g->seg[v].waiting = fm->waiting;
    g->seg[v].work = fm->work;
    g->seg[v].local_done = mb->local_done, g->seg[v].slot_order = mb->slot_order;
    g->seg[v].counted = mb->counted, g->seg[v].banded = mb->banded;
    g->seg[v].exec = exec;
    g->seg[v].used = ++g->seg_clock;
    CK(st_gpu_graph_launch(exec, mb->s));
    seg_after(mb);
    return true;
}

const st_engine_backend_t st_engine_backend_cuda = {
    .name = "cuda",
    .async = true,
    .keep_weights = false,
    .init = cu_init,
    .free = cu_free,
    .use = cu_use,
    .mb_init = mb_init,
    .mb_free = mb_free,
    .seq_reset = seq_reset,
    .set_thresholds = set_thresholds,
    .set_probes = set_probes,
    .set_trace = set_trace,
    .host_alloc = host_alloc,
    .host_free = host_free,
    .host_map = host_map,
    .host_unmap = host_unmap,
    .begin = begin,
    .launch_begin = launch_begin,
    .attn_norm = attn_norm,
    .kda = kda_op,
    .mla = mla_op,
    .attn_out = attn_out,
    .mlp_norm = mlp_norm,
    .dense_ffn = dense_ffn,
    .moe_begin = moe_begin,
    .experts = experts_op,
    .handoff = handoff,
    .moe_finish = moe_finish,
    .launch_end = launch_end,
    .wait = handoff_wait,
    .release = release,
    .copy_z = copy_z,
    .plan = plan,
    .peer_mem = peer_mem,
    .ready = ready,
    .head = head,
    .step = graph_step,
    .segment = segment,
};
