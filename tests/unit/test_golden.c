/* End-to-end golden test: the engine (CPU, fp32) against an fp64 evaluation of SPEC §2–7 written
 * here, straight from the SPEC, on the random `tiny` preset checkpoint (f32 and bf16 weights).
 *
 * The reference below calls nothing from kernels/ or the engine: it reads weights through the
 * checkpoint API (st_ckpt_weight + st_weight_rows_f32, st_ckpt_vec_f32), converts them to double
 * and evaluates the model loop by loop. Routing is discrete (SPEC §8), so the engine's expert sets
 * are forced to the reference's through the route hook, which also counts the positions where the
 * engine's own choice differed ("flips") and records the deviation of the engine's router scores
 * per MoE layer (a per-layer probe of the hidden state: it tells which layer a divergence starts in).
 *
 * Phases, each compared row by row against the reference (max|Δlogit| ≤ 1e-4·max|logit|, no
 * NaN/Inf, same argmax):
 *   1. one prefill step of a 37-token prompt (all logits), then 8 greedy decode steps;
 *   2. the same prompt in three pieces (5 + 16 + 16), then the same 8 decode steps;
 *   3. three sequences of different lengths in one step, then mixed prefill/decode steps;
 *   4. a reused slot (close + open) must start from empty state.
 * Checkpoints: tiny with f32 weights, with bf16 weights, with bf16 + MXFP4 routed experts, and a
 * config variant of the f32 one (config.json edited, same tensors) that takes the other SPEC paths:
 * unbounded softplus decay gate (§3.3 fallback), plain residuals (§5.4), SiLU-GLU, no MLA output
 * gate, router weights without renormalisation and scaled by 2.446.
 * Set STRATA_GOLDEN_VERBOSE=1 for per-layer router-score deviations of every phase. */
#define _GNU_SOURCE
#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "harness.h"
#include "strata/engine.h"
#include "strata/model.h"

#define TOL_REL 1e-4      /* SPEC §8: max|Δlogit| ≤ 1e-4 · max|logit| */
#define N_PROMPT 37
#define N_DECODE 8
#define CKPT_SEED 20250611ull
#define MAX_STEP_TOKENS 64

static int g_verbose;

/* ======================================================================================
 * fp64 reference model (SPEC §2–7)
 * ====================================================================================== */

typedef struct {
    double *w; /* [rows, cols] row-major, y = W x */
    int rows, cols;
} dmat_t;

typedef struct {
    dmat_t w1, w3, w2; /* gate, up, down */
} rexpert_t;

typedef struct {
    double *in_norm, *post_norm;
    double *w_attn_res, *w_mlp_res; /* w_eff = res_norm ⊙ res_proj; NULL when unused */
    bool mla, moe;
    /* KDA */
    dmat_t q, k, v, fa, fb, b, g, ga, gb, o;
    double *convq, *convk, *convv; /* [C, K] */
    double *A_log, *dt_bias, *o_norm;
    /* MLA (g and o shared with the fields above) */
    dmat_t qa, qb, qp, kva, kvb;
    double *qa_norm, *kva_norm;
    /* dense FFN */
    dmat_t gate, up, down;
    /* MoE */
    dmat_t router, lat_down, lat_up, sh_gate, sh_up, sh_down;
    double *router_bias, *lat_norm;
    rexpert_t *ex;
} rlayer_t;

typedef struct {
    st_config_t c;
    dmat_t embed, lm_head;
    bool lm_tied;
    double *final_norm, *w_out_res;
    rlayer_t *L;
} rmodel_t;

/* Output of one reference pass over a token sequence. */
typedef struct {
    int T, V, L, E, k;
    double *logits;  /* [T, V] */
    int *rid;        /* [L, T, k] chosen experts, ascending */
    int *rcnt;       /* [L, T] */
    double *rscore;  /* [L, T, E] σ(router) */
    double *rmargin; /* [L, T] (k-th biased score) − ((k+1)-th): distance to a routing tie */
} rout_t;

static int g_load_err;

static void *xcalloc(size_t n, size_t sz) {
    void *p = calloc(n ? n : 1, sz);
    if (!p) {
        fprintf(stderr, "golden: out of memory (%zu x %zu)\n", n, sz);
        exit(1);
    }
    return p;
}

static dmat_t ld_mat(const st_ckpt_t *ck, int rows, int cols, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static dmat_t ld_mat(const st_ckpt_t *ck, int rows, int cols, const char *fmt, ...) {
    char stem[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(stem, sizeof stem, fmt, ap);
    va_end(ap);
    dmat_t m = {NULL, rows, cols};
    st_weight_t w;
    st_status_t s = st_ckpt_weight(ck, stem, rows, cols, &w);
    if (s != ST_OK) {
        fprintf(stderr, "golden: cannot load weight %s [%d, %d]: %s: %s\n", stem, rows, cols,
                st_status_str(s), st_err_last());
        g_load_err++;
        return m;
    }
    if (w.rows != rows || w.cols != cols) {
        fprintf(stderr, "golden: weight %s is [%d, %d], expected [%d, %d]\n", stem, w.rows, w.cols, rows,
                cols);
        g_load_err++;
        return m;
    }
    enum { CH = 64 };
    float *tmp = xcalloc((size_t)CH * (size_t)cols, sizeof(float));
    m.w = xcalloc((size_t)rows * (size_t)cols, sizeof(double));
    for (int r0 = 0; r0 < rows; r0 += CH) {
        int n = rows - r0 < CH ? rows - r0 : CH;
        st_weight_rows_f32(&w, r0, n, tmp);
        for (size_t i = 0; i < (size_t)n * (size_t)cols; i++) m.w[(size_t)r0 * (size_t)cols + i] = tmp[i];
    }
    free(tmp);
    return m;
}

static double *ld_vec_v(const st_ckpt_t *ck, int n, bool pad, bool optional, const char *fmt, va_list ap) {
    char name[256];
    vsnprintf(name, sizeof name, fmt, ap);
    double *out = xcalloc((size_t)n, sizeof(double));
    if (optional && !st_ckpt_find(ck, name)) {
        if (g_verbose) printf("golden: optional %s absent: zeros\n", name);
        return out;
    }
    float *tmp = xcalloc((size_t)n, sizeof(float));
    st_status_t s = st_ckpt_vec_f32(ck, name, n, pad, tmp);
    if (s != ST_OK) {
        fprintf(stderr, "golden: cannot load vector %s [%d]: %s: %s\n", name, n, st_status_str(s),
                st_err_last());
        g_load_err++;
    } else {
        for (int i = 0; i < n; i++) out[i] = tmp[i];
    }
    free(tmp);
    return out;
}

static double *ld_vec(const st_ckpt_t *ck, int n, bool pad, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static double *ld_vec(const st_ckpt_t *ck, int n, bool pad, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    double *r = ld_vec_v(ck, n, pad, false, fmt, ap);
    va_end(ap);
    return r;
}

static double *ld_vec_opt(const st_ckpt_t *ck, int n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static double *ld_vec_opt(const st_ckpt_t *ck, int n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    double *r = ld_vec_v(ck, n, false, true, fmt, ap);
    va_end(ap);
    return r;
}

/* AttnRes pseudo-query with the norm folded in: w_eff = res_norm ⊙ res_proj[0,:] (SPEC §5). */
static double *ld_weff(const st_ckpt_t *ck, int d, const char *norm_name, const char *proj_name) {
    double *g = ld_vec(ck, d, false, "%s", norm_name);
    double *w = ld_vec(ck, d, false, "%s", proj_name);
    for (int i = 0; i < d; i++) w[i] *= g[i];
    free(g);
    return w;
}

/* Depthwise conv weight [C, 1, K] (F32 by layout; other float dtypes decoded too). */
static double *ld_conv(const st_ckpt_t *ck, int C, int K, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static double *ld_conv(const st_ckpt_t *ck, int C, int K, const char *fmt, ...) {
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    double *out = xcalloc((size_t)C * (size_t)K, sizeof(double));
    const int64_t shape[3] = {C, 1, K};
    const st_tensor_t *t = NULL;
    st_status_t s = st_ckpt_get(ck, name, 3, shape, &t);
    if (s != ST_OK || !t) {
        fprintf(stderr, "golden: cannot load conv %s [%d, 1, %d]: %s: %s\n", name, C, K, st_status_str(s),
                st_err_last());
        g_load_err++;
        return out;
    }
    const uint8_t *p = t->data;
    for (size_t i = 0; i < (size_t)C * (size_t)K; i++) {
        if (t->dtype == ST_DT_F32) {
            float f;
            memcpy(&f, p + 4 * i, 4);
            out[i] = f;
        } else if (t->dtype == ST_DT_BF16 || t->dtype == ST_DT_F16) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            out[i] = t->dtype == ST_DT_BF16 ? st_bf16_to_f32(h) : st_f16_to_f32(h);
        } else {
            fprintf(stderr, "golden: conv %s has unexpected dtype %s\n", name, st_dtype_name(t->dtype));
            g_load_err++;
            break;
        }
    }
    return out;
}

static void load_model(rmodel_t *M, const st_ckpt_t *ck) {
    memset(M, 0, sizeof *M);
    M->c = *st_ckpt_config(ck);
    const st_config_t *c = &M->c;
    const int d = c->d, V = c->vocab, B = c->attn_res_block;
    M->embed = ld_mat(ck, V, d, "model.embed_tokens");
    if (c->tie_embeddings) {
        M->lm_head = M->embed;
        M->lm_tied = true;
    } else {
        M->lm_head = ld_mat(ck, V, d, "lm_head");
    }
    M->final_norm = ld_vec(ck, d, false, "model.norm.weight");
    if (B > 0)
        M->w_out_res = ld_weff(ck, d, "model.output_attn_res_norm.weight", "model.output_attn_res_proj.weight");
    M->L = xcalloc((size_t)c->n_layers, sizeof(rlayer_t));
    for (int l = 0; l < c->n_layers; l++) {
        rlayer_t *ly = &M->L[l];
        char n1[128], n2[128];
        ly->in_norm = ld_vec(ck, d, false, "model.layers.%d.input_layernorm.weight", l);
        ly->post_norm = ld_vec(ck, d, false, "model.layers.%d.post_attention_layernorm.weight", l);
        if (B > 0) {
            if (l > 0) { /* at layer 0 there are no completed blocks: the attention-side AttnRes is unused */
                snprintf(n1, sizeof n1, "model.layers.%d.self_attention_res_norm.weight", l);
                snprintf(n2, sizeof n2, "model.layers.%d.self_attention_res_proj.weight", l);
                ly->w_attn_res = ld_weff(ck, d, n1, n2);
            }
            snprintf(n1, sizeof n1, "model.layers.%d.mlp_res_norm.weight", l);
            snprintf(n2, sizeof n2, "model.layers.%d.mlp_res_proj.weight", l);
            ly->w_mlp_res = ld_weff(ck, d, n1, n2);
        }
        ly->mla = c->is_mla[l];
        if (!ly->mla) {
            const int H = c->kda_heads, dk = c->kda_head_dim, C = H * dk, K = c->conv_k;
            ly->q = ld_mat(ck, C, d, "model.layers.%d.self_attn.q_proj", l);
            ly->k = ld_mat(ck, C, d, "model.layers.%d.self_attn.k_proj", l);
            ly->v = ld_mat(ck, C, d, "model.layers.%d.self_attn.v_proj", l);
            ly->convq = ld_conv(ck, C, K, "model.layers.%d.self_attn.q_conv1d.weight", l);
            ly->convk = ld_conv(ck, C, K, "model.layers.%d.self_attn.k_conv1d.weight", l);
            ly->convv = ld_conv(ck, C, K, "model.layers.%d.self_attn.v_conv1d.weight", l);
            ly->fa = ld_mat(ck, c->f_rank, d, "model.layers.%d.self_attn.f_a_proj", l);
            ly->fb = ld_mat(ck, C, c->f_rank, "model.layers.%d.self_attn.f_b_proj", l);
            ly->A_log = ld_vec(ck, H, true, "model.layers.%d.self_attn.A_log", l);
            ly->dt_bias = ld_vec(ck, C, false, "model.layers.%d.self_attn.dt_bias", l);
            ly->b = ld_mat(ck, H, d, "model.layers.%d.self_attn.b_proj", l);
            ly->o_norm = ld_vec(ck, dk, false, "model.layers.%d.self_attn.o_norm.weight", l);
            if (c->full_rank_gate) {
                ly->g = ld_mat(ck, C, d, "model.layers.%d.self_attn.g_proj", l);
            } else {
                ly->ga = ld_mat(ck, c->g_rank, d, "model.layers.%d.self_attn.g_a_proj", l);
                ly->gb = ld_mat(ck, C, c->g_rank, "model.layers.%d.self_attn.g_b_proj", l);
            }
            ly->o = ld_mat(ck, d, C, "model.layers.%d.self_attn.o_proj", l);
        } else {
            const int Hm = c->mla_heads, dq = c->qk_nope + c->qk_rope, R = c->kv_lora_rank;
            if (c->q_lora_rank > 0) {
                ly->qa = ld_mat(ck, c->q_lora_rank, d, "model.layers.%d.self_attn.q_a_proj", l);
                ly->qa_norm = ld_vec(ck, c->q_lora_rank, false, "model.layers.%d.self_attn.q_a_layernorm.weight", l);
                ly->qb = ld_mat(ck, Hm * dq, c->q_lora_rank, "model.layers.%d.self_attn.q_b_proj", l);
            } else {
                ly->qp = ld_mat(ck, Hm * dq, d, "model.layers.%d.self_attn.q_proj", l);
            }
            ly->kva = ld_mat(ck, R + c->qk_rope, d, "model.layers.%d.self_attn.kv_a_proj_with_mqa", l);
            ly->kva_norm = ld_vec(ck, R, false, "model.layers.%d.self_attn.kv_a_layernorm.weight", l);
            ly->kvb = ld_mat(ck, Hm * (c->qk_nope + c->v_head_dim), R, "model.layers.%d.self_attn.kv_b_proj", l);
            if (c->mla_output_gate) ly->g = ld_mat(ck, Hm * c->v_head_dim, d, "model.layers.%d.self_attn.g_proj", l);
            ly->o = ld_mat(ck, d, Hm * c->v_head_dim, "model.layers.%d.self_attn.o_proj", l);
        }
        ly->moe = st_config_is_moe_layer(c, l);
        if (!ly->moe) {
            ly->gate = ld_mat(ck, c->intermediate, d, "model.layers.%d.mlp.gate_proj", l);
            ly->up = ld_mat(ck, c->intermediate, d, "model.layers.%d.mlp.up_proj", l);
            ly->down = ld_mat(ck, d, c->intermediate, "model.layers.%d.mlp.down_proj", l);
        } else {
            const int E = c->n_experts, lw = st_config_expert_width(c), I = c->moe_inter;
            ly->router = ld_mat(ck, E, d, "model.layers.%d.block_sparse_moe.gate", l);
            ly->router_bias = ld_vec_opt(ck, E, "model.layers.%d.block_sparse_moe.gate.e_score_correction_bias", l);
            if (c->latent > 0) {
                ly->lat_down = ld_mat(ck, lw, d, "model.layers.%d.block_sparse_moe.routed_expert_down_proj", l);
                ly->lat_up = ld_mat(ck, d, lw, "model.layers.%d.block_sparse_moe.routed_expert_up_proj", l);
                if (c->latent_norm)
                    ly->lat_norm = ld_vec(ck, lw, false, "model.layers.%d.block_sparse_moe.routed_expert_norm.weight", l);
            }
            ly->ex = xcalloc((size_t)E, sizeof(rexpert_t));
            for (int j = 0; j < E; j++) {
                ly->ex[j].w1 = ld_mat(ck, I, lw, "model.layers.%d.block_sparse_moe.experts.%d.w1", l, j);
                ly->ex[j].w3 = ld_mat(ck, I, lw, "model.layers.%d.block_sparse_moe.experts.%d.w3", l, j);
                ly->ex[j].w2 = ld_mat(ck, lw, I, "model.layers.%d.block_sparse_moe.experts.%d.w2", l, j);
            }
            if (c->n_shared > 0) {
                const int S = c->n_shared * I;
                ly->sh_gate = ld_mat(ck, S, d, "model.layers.%d.block_sparse_moe.shared_experts.gate_proj", l);
                ly->sh_up = ld_mat(ck, S, d, "model.layers.%d.block_sparse_moe.shared_experts.up_proj", l);
                ly->sh_down = ld_mat(ck, d, S, "model.layers.%d.block_sparse_moe.shared_experts.down_proj", l);
            }
        }
    }
}

static void free_model(rmodel_t *M) {
    free(M->embed.w);
    if (!M->lm_tied) free(M->lm_head.w);
    free(M->final_norm);
    free(M->w_out_res);
    for (int l = 0; M->L && l < M->c.n_layers; l++) {
        rlayer_t *ly = &M->L[l];
        dmat_t *ms[] = {&ly->q,  &ly->k,   &ly->v,   &ly->fa,       &ly->fb,     &ly->b,       &ly->g,
                        &ly->ga, &ly->gb,  &ly->o,   &ly->qa,       &ly->qb,     &ly->qp,      &ly->kva,
                        &ly->kvb, &ly->gate, &ly->up, &ly->down,    &ly->router, &ly->lat_down, &ly->lat_up,
                        &ly->sh_gate, &ly->sh_up, &ly->sh_down};
        for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) free(ms[i]->w);
        double *vs[] = {ly->in_norm, ly->post_norm, ly->w_attn_res, ly->w_mlp_res, ly->convq, ly->convk,
                        ly->convv,   ly->A_log,     ly->dt_bias,    ly->o_norm,    ly->qa_norm, ly->kva_norm,
                        ly->router_bias, ly->lat_norm};
        for (size_t i = 0; i < sizeof vs / sizeof vs[0]; i++) free(vs[i]);
        if (ly->ex) {
            for (int j = 0; j < M->c.n_experts; j++) {
                free(ly->ex[j].w1.w);
                free(ly->ex[j].w3.w);
                free(ly->ex[j].w2.w);
            }
            free(ly->ex);
        }
    }
    free(M->L);
    memset(M, 0, sizeof *M);
}

static void free_rout(rout_t *r) {
    free(r->logits);
    free(r->rid);
    free(r->rcnt);
    free(r->rscore);
    free(r->rmargin);
    memset(r, 0, sizeof *r);
}

/* ---- fp64 primitives ---- */
static void mv(double *y, const dmat_t *m, const double *x) {
    for (int r = 0; r < m->rows; r++) {
        const double *row = m->w + (size_t)r * (size_t)m->cols;
        double s = 0;
        for (int c = 0; c < m->cols; c++) s += row[c] * x[c];
        y[r] = s;
    }
}
static double sigm(double x) { return 1.0 / (1.0 + exp(-x)); }
static double silu(double x) { return x * sigm(x); }
static double softplus(double x) { return x > 30 ? x : log1p(exp(x)); }
/* y = x / sqrt(mean(x²) + eps) ⊙ w   (y may alias x) */
static void rmsnorm(double *y, const double *x, const double *w, int n, double eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    double r = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) y[i] = x[i] * r * (w ? w[i] : 1.0);
}
static double act(const st_config_t *c, double a, double u) {
    if (c->act == ST_ACT_SITU) {
        double b1 = c->situ_beta1, b2 = c->situ_beta2;
        return (b1 * tanh(a / b1) * sigm(a)) * (b2 * tanh(u / b2));
    }
    return silu(a) * u;
}
/* y [down.rows] = down · act(gate x, up x) */
static void ffn(const st_config_t *c, double *y, const dmat_t *gate, const dmat_t *up, const dmat_t *down,
                const double *x) {
    int I = gate->rows;
    double *a = xcalloc((size_t)I, sizeof(double)), *u = xcalloc((size_t)I, sizeof(double));
    mv(a, gate, x);
    mv(u, up, x);
    for (int i = 0; i < I; i++) a[i] = act(c, a[i], u[i]);
    mv(y, down, a);
    free(a);
    free(u);
}

/* AttnRes direct form (SPEC §5), one token: sources = blocks[0..nb) ++ [partial]. */
static void attnres(double *out, const double *partial, const double *const *blocks, int nb, const double *w,
                    int d, double eps) {
    double s[ST_MAX_LAYERS + 2], mx = -INFINITY;
    for (int i = 0; i <= nb; i++) {
        const double *v = i < nb ? blocks[i] : partial;
        double ss = 0, dot = 0;
        for (int c = 0; c < d; c++) ss += v[c] * v[c];
        double r = 1.0 / sqrt(ss / d + eps);
        for (int c = 0; c < d; c++) dot += v[c] * r * w[c];
        s[i] = dot;
        if (dot > mx) mx = dot;
    }
    double z = 0;
    for (int i = 0; i <= nb; i++) z += (s[i] = exp(s[i] - mx));
    for (int c = 0; c < d; c++) out[c] = 0;
    for (int i = 0; i <= nb; i++) {
        const double *v = i < nb ? blocks[i] : partial;
        double p = s[i] / z;
        for (int c = 0; c < d; c++) out[c] += p * v[c];
    }
}

/* KDA layer (SPEC §3, plain recurrence §3.2) over T tokens: x [T, d] normed input → y [T, d]. */
static void kda_fwd(const rmodel_t *M, const rlayer_t *ly, const double *x, int T, double *y) {
    const st_config_t *c = &M->c;
    const int d = c->d, H = c->kda_heads, dk = c->kda_head_dim, dv = dk, C = H * dk, K = c->conv_k;
    const double scale = 1.0 / sqrt((double)dk);
    const size_t TC = (size_t)T * (size_t)C;
    double *raw[3], *act3[3];
    const dmat_t *proj[3] = {&ly->q, &ly->k, &ly->v};
    const double *cw[3] = {ly->convq, ly->convk, ly->convv};
    for (int i = 0; i < 3; i++) {
        raw[i] = xcalloc(TC, sizeof(double));
        act3[i] = xcalloc(TC, sizeof(double));
        for (int t = 0; t < T; t++) mv(raw[i] + (size_t)t * C, proj[i], x + (size_t)t * d);
        /* depthwise causal conv, tap K-1 = newest, zero history; then SiLU */
        for (int t = 0; t < T; t++)
            for (int ch = 0; ch < C; ch++) {
                double s = 0;
                for (int w = 0; w < K; w++) {
                    int src = t - (K - 1) + w;
                    if (src >= 0) s += cw[i][(size_t)ch * K + w] * raw[i][(size_t)src * C + ch];
                }
                act3[i][(size_t)t * C + ch] = silu(s);
            }
    }
    double *q = act3[0], *k = act3[1], *v = act3[2];
    /* L2Norm per head, eps 1e-6, on q and k */
    for (int i = 0; i < 2; i++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H; h++) {
                double *u = act3[i] + (size_t)t * C + (size_t)h * dk, ss = 0;
                for (int j = 0; j < dk; j++) ss += u[j] * u[j];
                double r = 1.0 / sqrt(ss + 1e-6);
                for (int j = 0; j < dk; j++) u[j] *= r;
            }
    double *g = xcalloc(TC, sizeof(double)), *beta = xcalloc((size_t)T * H, sizeof(double));
    double *gate = xcalloc(TC, sizeof(double));
    double *fr = xcalloc((size_t)(c->f_rank > c->g_rank ? c->f_rank : c->g_rank) + 1, sizeof(double));
    for (int t = 0; t < T; t++) {
        const double *xt = x + (size_t)t * d;
        double *gt = g + (size_t)t * C;
        mv(fr, &ly->fa, xt);
        mv(gt, &ly->fb, fr);
        for (int h = 0; h < H; h++) {
            double A = exp(ly->A_log[h]);
            for (int j = 0; j < dk; j++) {
                double z = gt[h * dk + j] + ly->dt_bias[h * dk + j];
                gt[h * dk + j] = c->gate_bounded ? (double)c->gate_lower_bound * sigm(A * z) : -A * softplus(z);
            }
        }
        mv(beta + (size_t)t * H, &ly->b, xt);
        for (int h = 0; h < H; h++) beta[(size_t)t * H + h] = sigm(beta[(size_t)t * H + h]);
        if (c->full_rank_gate) {
            mv(gate + (size_t)t * C, &ly->g, xt);
        } else {
            mv(fr, &ly->ga, xt);
            mv(gate + (size_t)t * C, &ly->gb, fr);
        }
    }
    /* recurrence per head */
    double *S = xcalloc((size_t)H * dk * dv, sizeof(double));
    double *o = xcalloc(TC, sizeof(double)), *e = xcalloc((size_t)dv, sizeof(double));
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            double *Sh = S + (size_t)h * dk * dv;
            const double *qt = q + (size_t)t * C + h * dk, *kt = k + (size_t)t * C + h * dk;
            const double *vt = v + (size_t)t * C + h * dv, *gt = g + (size_t)t * C + h * dk;
            double bt = beta[(size_t)t * H + h];
            for (int a = 0; a < dk; a++) {
                double dec = exp(gt[a]);
                for (int j = 0; j < dv; j++) Sh[a * dv + j] *= dec;
            }
            for (int j = 0; j < dv; j++) {
                double sk = 0;
                for (int a = 0; a < dk; a++) sk += Sh[a * dv + j] * kt[a];
                e[j] = bt * (vt[j] - sk);
            }
            for (int a = 0; a < dk; a++)
                for (int j = 0; j < dv; j++) Sh[a * dv + j] += kt[a] * e[j];
            double *ot = o + (size_t)t * C + h * dv;
            for (int j = 0; j < dv; j++) {
                double s = 0;
                for (int a = 0; a < dk; a++) s += Sh[a * dv + j] * scale * qt[a];
                ot[j] = s;
            }
            /* output: RMSNorm(o_h; o_norm, rms_eps) ⊙ σ((W_g x)_h) */
            rmsnorm(ot, ot, ly->o_norm, dv, (double)c->rms_eps);
            for (int j = 0; j < dv; j++) ot[j] *= sigm(gate[(size_t)t * C + h * dv + j]);
        }
    for (int t = 0; t < T; t++) mv(y + (size_t)t * d, &ly->o, o + (size_t)t * C);
    for (int i = 0; i < 3; i++) {
        free(raw[i]);
        free(act3[i]);
    }
    free(g);
    free(beta);
    free(gate);
    free(fr);
    free(S);
    free(o);
    free(e);
}

/* Gated MLA, NoPE, direct form (SPEC §4) over T tokens. */
static void mla_fwd(const rmodel_t *M, const rlayer_t *ly, const double *x, int T, double *y) {
    const st_config_t *c = &M->c;
    const int d = c->d, Hm = c->mla_heads, nope = c->qk_nope, rope = c->qk_rope, vd = c->v_head_dim;
    const int dq = nope + rope, R = c->kv_lora_rank, kvw = nope + vd;
    const double scale = 1.0 / sqrt((double)dq);
    double *q = xcalloc((size_t)T * Hm * dq, sizeof(double));
    double *kpe = xcalloc((size_t)T * (rope > 0 ? rope : 1), sizeof(double));
    double *kv = xcalloc((size_t)T * Hm * kvw, sizeof(double));
    double *cq = xcalloc((size_t)(c->q_lora_rank > 0 ? c->q_lora_rank : 1), sizeof(double));
    double *ckv = xcalloc((size_t)(R + rope), sizeof(double));
    for (int t = 0; t < T; t++) {
        const double *xt = x + (size_t)t * d;
        if (c->q_lora_rank > 0) {
            mv(cq, &ly->qa, xt);
            rmsnorm(cq, cq, ly->qa_norm, c->q_lora_rank, 1e-6);
            mv(q + (size_t)t * Hm * dq, &ly->qb, cq);
        } else {
            mv(q + (size_t)t * Hm * dq, &ly->qp, xt);
        }
        mv(ckv, &ly->kva, xt);
        for (int j = 0; j < rope; j++) kpe[(size_t)t * rope + j] = ckv[R + j]; /* k_pe: not normed */
        rmsnorm(ckv, ckv, ly->kva_norm, R, 1e-6);
        mv(kv + (size_t)t * Hm * kvw, &ly->kvb, ckv);
    }
    double *o = xcalloc((size_t)Hm * vd, sizeof(double)), *p = xcalloc((size_t)T, sizeof(double));
    double *gt = xcalloc((size_t)Hm * vd, sizeof(double));
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < Hm; h++) {
            const double *qh = q + ((size_t)t * Hm + h) * dq;
            double mx = -INFINITY;
            for (int s = 0; s <= t; s++) {
                const double *kh = kv + ((size_t)s * Hm + h) * kvw;
                double dot = 0;
                for (int j = 0; j < nope; j++) dot += qh[j] * kh[j];
                for (int j = 0; j < rope; j++) dot += qh[nope + j] * kpe[(size_t)s * rope + j];
                p[s] = dot * scale;
                if (p[s] > mx) mx = p[s];
            }
            double z = 0;
            for (int s = 0; s <= t; s++) z += (p[s] = exp(p[s] - mx));
            double *oh = o + (size_t)h * vd;
            for (int j = 0; j < vd; j++) oh[j] = 0;
            for (int s = 0; s <= t; s++) {
                const double *vh = kv + ((size_t)s * Hm + h) * kvw + nope;
                for (int j = 0; j < vd; j++) oh[j] += p[s] / z * vh[j];
            }
        }
        if (c->mla_output_gate) {
            mv(gt, &ly->g, x + (size_t)t * d);
            for (int i = 0; i < Hm * vd; i++) o[i] *= sigm(gt[i]);
        }
        mv(y + (size_t)t * d, &ly->o, o);
    }
    free(q);
    free(kpe);
    free(kv);
    free(cq);
    free(ckv);
    free(o);
    free(p);
    free(gt);
}

/* Latent MoE (SPEC §6–7, top-k mode) for one token; records the routing of (layer l, position t). */
static void moe_fwd(const rmodel_t *M, const rlayer_t *ly, int l, int t, const double *x, double *y, rout_t *out) {
    const st_config_t *c = &M->c;
    const int d = c->d, E = c->n_experts, k = c->top_k, lw = st_config_expert_width(c);
    double *s = out->rscore + ((size_t)l * out->T + t) * E;
    mv(s, &ly->router, x);
    for (int j = 0; j < E; j++) s[j] = sigm(s[j]);
    /* top-k of s + b, ties to the lower id (strict > while scanning ascending ids) */
    bool *chosen = xcalloc((size_t)E, sizeof(bool));
    double kth = INFINITY;
    for (int r = 0; r < k && r < E; r++) {
        int best = -1;
        for (int j = 0; j < E; j++)
            if (!chosen[j] && (best < 0 || s[j] + ly->router_bias[j] > s[best] + ly->router_bias[best])) best = j;
        chosen[best] = true;
        kth = s[best] + ly->router_bias[best];
    }
    double next = -INFINITY;
    for (int j = 0; j < E; j++)
        if (!chosen[j] && s[j] + ly->router_bias[j] > next) next = s[j] + ly->router_bias[j];
    out->rmargin[(size_t)l * out->T + t] = kth - next;
    int *ids = out->rid + ((size_t)l * out->T + t) * k, n = 0;
    double sum = 0;
    for (int j = 0; j < E; j++)
        if (chosen[j]) {
            ids[n++] = j;
            sum += s[j];
        }
    out->rcnt[(size_t)l * out->T + t] = n;
    free(chosen);

    const double *z = x;
    double *zbuf = NULL;
    if (c->latent > 0) {
        zbuf = xcalloc((size_t)lw, sizeof(double));
        mv(zbuf, &ly->lat_down, x); /* once per token, before dispatch */
        z = zbuf;
    }
    double *u = xcalloc((size_t)lw, sizeof(double)), *eo = xcalloc((size_t)lw, sizeof(double));
    for (int i = 0; i < n; i++) { /* ascending expert id */
        int j = ids[i];
        double p = c->renormalize ? s[j] / (sum + 1e-20) * c->routed_scale : s[j] * c->routed_scale;
        ffn(c, eo, &ly->ex[j].w1, &ly->ex[j].w3, &ly->ex[j].w2, z);
        for (int a = 0; a < lw; a++) u[a] += p * eo[a];
    }
    if (c->latent > 0) {
        if (c->latent_norm) rmsnorm(u, u, ly->lat_norm, lw, (double)c->rms_eps);
        mv(y, &ly->lat_up, u);
    } else {
        for (int a = 0; a < d; a++) y[a] = u[a];
    }
    if (c->n_shared > 0) {
        double *sh = xcalloc((size_t)d, sizeof(double));
        ffn(c, sh, &ly->sh_gate, &ly->sh_up, &ly->sh_down, x);
        for (int a = 0; a < d; a++) y[a] += sh[a];
        free(sh);
    }
    free(zbuf);
    free(u);
    free(eo);
}

/* Whole model (SPEC §2) over tokens [0, T): every position's logits and routing. */
static void ref_forward(const rmodel_t *M, const int *tok, int T, rout_t *out) {
    const st_config_t *c = &M->c;
    const int d = c->d, L = c->n_layers, V = c->vocab, B = c->attn_res_block;
    const double eps = c->rms_eps;
    const size_t Td = (size_t)T * (size_t)d;
    memset(out, 0, sizeof *out);
    out->T = T;
    out->V = V;
    out->L = L;
    out->E = c->n_experts > 0 ? c->n_experts : 1;
    out->k = c->top_k > 0 ? c->top_k : 1;
    out->logits = xcalloc((size_t)T * V, sizeof(double));
    out->rid = xcalloc((size_t)L * T * out->k, sizeof(int));
    out->rcnt = xcalloc((size_t)L * T, sizeof(int));
    out->rscore = xcalloc((size_t)L * T * out->E, sizeof(double));
    out->rmargin = xcalloc((size_t)L * T, sizeof(double));

    double *partial = xcalloc(Td, sizeof(double)), *h = xcalloc(Td, sizeof(double));
    double *xn = xcalloc(Td, sizeof(double)), *a = xcalloc(Td, sizeof(double)), *m = xcalloc(Td, sizeof(double));
    const int nbmax = B > 0 ? L / B + 1 : 1;
    double *blocks = xcalloc((size_t)nbmax * Td, sizeof(double));
    const double *src[ST_MAX_LAYERS + 2];
    int nb = 0;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < d; i++) partial[(size_t)t * d + i] = M->embed.w[(size_t)tok[t] * d + i];
    for (int l = 0; l < L; l++) {
        const rlayer_t *ly = &M->L[l];
        bool have_partial = true;
        /* attention side */
        for (int t = 0; t < T; t++) {
            double *ht = h + (size_t)t * d, *pt = partial + (size_t)t * d;
            if (nb == 0) {
                memcpy(ht, pt, sizeof(double) * d);
            } else {
                for (int i = 0; i < nb; i++) src[i] = blocks + i * Td + (size_t)t * d;
                attnres(ht, pt, src, nb, ly->w_attn_res, d, eps);
            }
        }
        if (B > 0 && l % B == 0) { /* push before the attention */
            memcpy(blocks + nb * Td, partial, sizeof(double) * Td);
            nb++;
            have_partial = false;
        }
        for (int t = 0; t < T; t++) rmsnorm(xn + (size_t)t * d, h + (size_t)t * d, ly->in_norm, d, eps);
        if (ly->mla)
            mla_fwd(M, ly, xn, T, a);
        else
            kda_fwd(M, ly, xn, T, a);
        for (size_t i = 0; i < Td; i++) partial[i] = have_partial ? partial[i] + a[i] : a[i];
        /* MLP side */
        for (int t = 0; t < T; t++) {
            double *ht = h + (size_t)t * d, *pt = partial + (size_t)t * d;
            if (B > 0) {
                for (int i = 0; i < nb; i++) src[i] = blocks + i * Td + (size_t)t * d;
                attnres(ht, pt, src, nb, ly->w_mlp_res, d, eps);
            } else {
                memcpy(ht, pt, sizeof(double) * d);
            }
            rmsnorm(xn + (size_t)t * d, ht, ly->post_norm, d, eps);
            if (ly->moe)
                moe_fwd(M, ly, l, t, xn + (size_t)t * d, m + (size_t)t * d, out);
            else
                ffn(c, m + (size_t)t * d, &ly->gate, &ly->up, &ly->down, xn + (size_t)t * d);
        }
        for (size_t i = 0; i < Td; i++) partial[i] += m[i];
    }
    for (int t = 0; t < T; t++) {
        double *ht = h + (size_t)t * d, *pt = partial + (size_t)t * d;
        if (B > 0) {
            for (int i = 0; i < nb; i++) src[i] = blocks + i * Td + (size_t)t * d;
            attnres(ht, pt, src, nb, M->w_out_res, d, eps);
        } else {
            memcpy(ht, pt, sizeof(double) * d);
        }
        rmsnorm(xn + (size_t)t * d, ht, M->final_norm, d, eps);
        mv(out->logits + (size_t)t * V, &M->lm_head, xn + (size_t)t * d);
    }
    free(partial);
    free(h);
    free(xn);
    free(a);
    free(m);
    free(blocks);
}

static int argmax_d(const double *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}
static int argmax_f(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* tok[0, n_prompt) given; appends n_gen greedy tokens (reference argmax) and returns the reference
 * pass over all n_prompt + n_gen tokens. */
static void ref_greedy(const rmodel_t *M, int *tok, int n_prompt, int n_gen, rout_t *out) {
    for (int g = 0; g < n_gen; g++) {
        rout_t r;
        ref_forward(M, tok, n_prompt + g, &r);
        tok[n_prompt + g] = argmax_d(r.logits + (size_t)(n_prompt + g - 1) * r.V, r.V);
        free_rout(&r);
    }
    ref_forward(M, tok, n_prompt + n_gen, out);
}

/* ======================================================================================
 * Engine side: route hook, steps, comparisons
 * ====================================================================================== */

typedef struct {
    const rout_t *ref;
    int pos;
} tokref_t;

typedef struct {
    const st_config_t *c;
    tokref_t map[MAX_STEP_TOKENS];
    int T;           /* tokens in the current step */
    int calls;       /* hook calls in the current step */
    int errors;      /* unexpected layer / T / sizes */
    long flips;      /* (layer, token) pairs where the engine's own set differed */
    long routed;     /* (layer, token) pairs seen */
    double min_flip_margin;
    double score_dev[ST_MAX_LAYERS]; /* max |s_engine − s_ref| per layer, current phase */
    int print_left;
} hook_t;

static int cmp_int(const void *a, const void *b) { return (*(const int *)a > *(const int *)b) - (*(const int *)a < *(const int *)b); }

static void route_hook(void *ctx, int layer, int T, int n_experts, const float *scores, int *ids, int *cnt,
                       int kmax) {
    hook_t *hk = ctx;
    const st_config_t *c = hk->c;
    hk->calls++;
    if (layer < 0 || layer >= c->n_layers || !st_config_is_moe_layer(c, layer) || T != hk->T ||
        n_experts != c->n_experts || kmax < c->top_k || kmax > 4096) {
        hk->errors++;
        if (hk->print_left-- > 0)
            fprintf(stderr,
                    "golden: route hook called with layer %d T %d n_experts %d kmax %d; expected an MoE layer, "
                    "T %d, n_experts %d, kmax >= %d: routing NOT forced\n",
                    layer, T, n_experts, kmax, hk->T, c->n_experts, c->top_k);
        return;
    }
    int tmp[4096];
    for (int i = 0; i < T; i++) {
        const rout_t *r = hk->map[i].ref;
        const int pos = hk->map[i].pos;
        const size_t lt = (size_t)layer * r->T + pos;
        const int *rid = r->rid + lt * r->k;
        const int rc = r->rcnt[lt];
        const double *rs = r->rscore + lt * r->E;
        for (int j = 0; j < n_experts; j++) {
            double dev = fabs((double)scores[(size_t)i * n_experts + j] - rs[j]);
            if (!(dev <= hk->score_dev[layer])) hk->score_dev[layer] = isfinite(dev) ? dev : INFINITY;
        }
        int n = cnt[i];
        bool same = n == rc;
        if (n < 0 || n > kmax) {
            same = false;
            n = 0;
        }
        memcpy(tmp, ids + (size_t)i * kmax, sizeof(int) * (size_t)n);
        qsort(tmp, (size_t)n, sizeof(int), cmp_int);
        for (int j = 0; same && j < n; j++) same = tmp[j] == rid[j];
        hk->routed++;
        if (!same) {
            hk->flips++;
            double mg = r->rmargin[lt];
            if (mg < hk->min_flip_margin) hk->min_flip_margin = mg;
            if (hk->print_left-- > 0) {
                fprintf(stderr, "golden: flip at layer %d position %d (ref margin %.3e): engine {", layer, pos, mg);
                for (int j = 0; j < n; j++) fprintf(stderr, "%s%d", j ? "," : "", tmp[j]);
                fprintf(stderr, "} ref {");
                for (int j = 0; j < rc; j++) fprintf(stderr, "%s%d", j ? "," : "", rid[j]);
                fprintf(stderr, "}\n");
            }
        }
        for (int j = 0; j < rc; j++) ids[(size_t)i * kmax + j] = rid[j];
        for (int j = rc; j < kmax; j++) ids[(size_t)i * kmax + j] = -1;
        cnt[i] = rc;
    }
}

typedef struct {
    const char *name;
    int rows, bad_rows, greedy_bad, near_ties, step_errors;
    double max_rel;
    long flips0, routed0;
} phase_t;

/* One entry of a step: tokens [start, start+n) of a sequence whose reference is ref. */
typedef struct {
    int slot;
    const rout_t *ref;
    const int *toks; /* full token list of the sequence */
    int start, n;
    bool all;
} ent_t;

static void phase_begin(phase_t *ph, hook_t *hk, const char *name) {
    memset(ph, 0, sizeof *ph);
    ph->name = name;
    ph->flips0 = hk->flips;
    ph->routed0 = hk->routed;
    for (int l = 0; l < ST_MAX_LAYERS; l++) hk->score_dev[l] = 0;
}

static void cmp_row(phase_t *ph, const char *tag, const float *eng, const rout_t *r, int pos) {
    const int V = r->V;
    const double *ref = r->logits + (size_t)pos * V;
    double maxref = 0, maxd = 0;
    int nonfin = 0, worst = 0;
    for (int v = 0; v < V; v++) {
        if (fabs(ref[v]) > maxref) maxref = fabs(ref[v]);
        if (!isfinite(eng[v])) {
            nonfin++;
            continue;
        }
        double dd = fabs((double)eng[v] - ref[v]);
        if (dd > maxd) {
            maxd = dd;
            worst = v;
        }
    }
    double rel = maxref > 0 ? maxd / maxref : maxd;
    if (nonfin) rel = INFINITY;
    if (rel > ph->max_rel || rel != rel) ph->max_rel = rel;
    ph->rows++;
    bool ok = nonfin == 0 && rel <= TOL_REL;
    if (!ok) ph->bad_rows++;
    CHECK(ok, "[%s] %s position %d: max|dlogit| %.3e at vocab %d (engine %.6g ref %.6g), max|logit| %.4g, rel %.3e > %.0e, nonfinite %d",
          tag, ph->name, pos, maxd, worst, (double)eng[worst], ref[worst], maxref, rel, TOL_REL, nonfin);
    int ea = argmax_f(eng, V), ra = argmax_d(ref, V);
    if (ea != ra) {
        double gap = ref[ra] - ref[ea];
        if (gap <= 2 * TOL_REL * maxref) {
            ph->near_ties++;
            printf("note [%s] %s position %d: argmax %d vs ref %d within tolerance (gap %.3e)\n", tag, ph->name, pos, ea,
                   ra, gap);
        } else {
            ph->greedy_bad++;
            CHECK(ea == ra, "[%s] %s position %d: engine greedy token %d, reference %d (ref gap %.3e)", tag, ph->name,
                  pos, ea, ra, gap);
        }
    }
}

/* Runs one engine step over entries and compares every returned row with the reference. */
static bool run_step(st_engine_t *e, hook_t *hk, phase_t *ph, const char *tag, const ent_t *en, int ne, float *logits) {
    st_seq_chunk_t ch[8];
    int T = 0;
    for (int i = 0; i < ne; i++) {
        ch[i] = (st_seq_chunk_t){.slot = en[i].slot, .n_tokens = en[i].n, .tokens = en[i].toks + en[i].start,
                                 .all_logits = en[i].all};
        for (int j = 0; j < en[i].n; j++) {
            hk->map[T].ref = en[i].ref;
            hk->map[T].pos = en[i].start + j;
            T++;
        }
    }
    hk->T = T;
    hk->calls = 0;
    int lens0[8];
    for (int i = 0; i < ne; i++) lens0[i] = st_engine_seq_len(e, en[i].slot);
    st_status_t s = st_engine_step(e, ch, ne, logits);
    if (s != ST_OK) {
        ph->step_errors++;
        CHECK(s == ST_OK, "[%s] %s: st_engine_step (%d entries, %d tokens) failed: %s: %s", tag, ph->name, ne, T,
              st_status_str(s), st_err_last());
        return false;
    }
    int n_moe = 0;
    for (int l = 0; l < hk->c->n_layers; l++) n_moe += st_config_is_moe_layer(hk->c, l);
    CHECK(hk->calls == n_moe, "[%s] %s: route hook called %d times in a step, expected %d (one per MoE layer)", tag,
          ph->name, hk->calls, n_moe);
    const float *row = logits;
    for (int i = 0; i < ne; i++) {
        CHECK(st_engine_seq_len(e, en[i].slot) == lens0[i] + en[i].n, "[%s] %s: seq_len %d after step, expected %d",
              tag, ph->name, st_engine_seq_len(e, en[i].slot), lens0[i] + en[i].n);
        int first = en[i].all ? en[i].start : en[i].start + en[i].n - 1;
        for (int p = first; p < en[i].start + en[i].n; p++) {
            cmp_row(ph, tag, row, en[i].ref, p);
            row += en[i].ref->V;
        }
    }
    return true;
}

static void phase_end(phase_t *ph, hook_t *hk, const char *tag) {
    long fl = hk->flips - ph->flips0, ro = hk->routed - ph->routed0;
    printf("golden[%s] %-16s rows %3d  max rel dev %.3e (tol %.0e)  bad rows %d  greedy mismatches %d (near ties %d)  "
           "routing flips %ld of %ld\n",
           tag, ph->name, ph->rows, ph->max_rel, TOL_REL, ph->bad_rows, ph->greedy_bad, ph->near_ties, fl, ro);
    if (g_verbose || ph->bad_rows) {
        printf("golden[%s] %s: router-score max|ds| per MoE layer:", tag, ph->name);
        for (int l = 0; l < hk->c->n_layers; l++)
            if (st_config_is_moe_layer(hk->c, l)) printf(" L%d %.2e", l, hk->score_dev[l]);
        printf("\n");
    }
    CHECK(fl * 100 <= ro || fl <= 2, "[%s] %s: %ld routing flips of %ld (layer,token) pairs: more than near-tie rounding explains",
          tag, ph->name, fl, ro);
}

static void fill_tokens(int *t, int n, int vmax, uint64_t seed) {
    st_rng_t r = {seed};
    for (int i = 0; i < n; i++) t[i] = (int)(st_rng_next(&r) % (uint64_t)vmax);
}

/* The config variant: edit the written config.json (text_config) in place. */
static bool edit_config_variant(const char *dir) {
    char path[1100];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    if (!root) {
        fprintf(stderr, "golden: cannot parse %s: %s\n", path, err.text);
        return false;
    }
    json_t *tc = json_object_get(root, "text_config");
    if (!tc) tc = root;
    json_t *lac = json_object_get(tc, "linear_attn_config");
    bool ok = lac && json_object_get(lac, "gate_lower_bound") && json_object_get(tc, "attn_res_block_size");
    if (ok) {
        json_object_del(lac, "gate_lower_bound");       /* unbounded gate: −exp(A_log)·softplus(f + dt_bias) */
        json_object_del(tc, "attn_res_block_size");     /* plain pre-norm residuals */
        json_object_set_new(tc, "hidden_act", json_string("silu"));
        json_object_set_new(tc, "mla_use_output_gate", json_false());
        json_object_set_new(tc, "moe_renormalize", json_false());
        json_object_set_new(tc, "routed_scaling_factor", json_real(2.446));
        ok = json_dump_file(root, path, JSON_INDENT(2)) == 0;
    } else {
        fprintf(stderr, "golden: %s lacks linear_attn_config.gate_lower_bound or attn_res_block_size\n", path);
    }
    json_decref(root);
    return ok;
}

static void run_case(const char *tmpdir, const char *tag, st_dtype_t dtype, bool mxfp4, bool variant) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tiny-%s", tmpdir, tag);
    double t0 = st_time_sec();
    st_ckpt_init_opts_t io;
    memset(&io, 0, sizeof io);
    io.preset = "tiny";
    io.out_dir = dir;
    io.seed = CKPT_SEED;
    io.dtype = dtype;
    io.skew_router = 0;
    io.mxfp4_experts = mxfp4;
    st_status_t s = st_ckpt_init(&io);
    if (s != ST_OK) { /* in case the writer wants an existing directory */
        mkdir(dir, 0755);
        s = st_ckpt_init(&io);
    }
    CHECK(s == ST_OK, "[%s] st_ckpt_init(preset tiny, %s): %s: %s", tag, dir, st_status_str(s), st_err_last());
    if (s != ST_OK) return;
    if (variant) {
        bool ok = edit_config_variant(dir);
        CHECK(ok, "[%s] could not write the config variant", tag);
        if (!ok) return;
    }
    st_ckpt_t *ck = NULL;
    s = st_ckpt_open(&ck, dir);
    CHECK(s == ST_OK && ck, "[%s] st_ckpt_open(%s): %s: %s", tag, dir, st_status_str(s), st_err_last());
    if (s != ST_OK || !ck) return;
    const st_config_t *c = st_ckpt_config(ck);
    int n_mla = 0, n_moe = 0;
    for (int l = 0; l < c->n_layers; l++) {
        n_mla += c->is_mla[l];
        n_moe += st_config_is_moe_layer(c, l);
    }
    printf("golden[%s] tiny: d %d, %d layers (%d MLA, %d MoE), vocab %d, KDA %dx%d conv %d %s gate%s, MLA %d heads "
           "q_lora %d kv_lora %d nope %d rope %d v %d%s, AttnRes block %d, experts %d top-%d shared %d inter %d latent %d%s%s, "
           "renorm %d scale %g, act %s\n",
           tag, c->d, c->n_layers, n_mla, n_moe, c->vocab, c->kda_heads, c->kda_head_dim, c->conv_k,
           c->gate_bounded ? "bounded" : "softplus", c->full_rank_gate ? " full-rank" : " low-rank", c->mla_heads,
           c->q_lora_rank, c->kv_lora_rank, c->qk_nope, c->qk_rope, c->v_head_dim, c->mla_output_gate ? " gated" : "",
           c->attn_res_block, c->n_experts, c->top_k, c->n_shared, c->moe_inter, c->latent,
           c->latent_norm ? " (normed)" : "", c->experts_mxfp4 ? " mxfp4" : "", (int)c->renormalize,
           (double)c->routed_scale, c->act == ST_ACT_SITU ? "situ" : "silu");
    if (c->n_layers > ST_MAX_LAYERS || c->n_layers <= 0) {
        CHECK(0, "[%s] bad layer count %d", tag, c->n_layers);
        st_ckpt_close(ck);
        return;
    }

    rmodel_t M;
    g_load_err = 0;
    load_model(&M, ck);
    CHECK(g_load_err == 0, "[%s] the reference could not read %d tensors of the tiny checkpoint", tag, g_load_err);
    if (g_load_err) {
        free_model(&M);
        st_ckpt_close(ck);
        return;
    }

    /* ---- reference runs ---- */
    const int vtok = c->vocab < 256 ? c->vocab : 256;
    int seqA[N_PROMPT + N_DECODE];
    fill_tokens(seqA, N_PROMPT, vtok, 7);
    rout_t rA;
    ref_greedy(&M, seqA, N_PROMPT, N_DECODE, &rA);
    enum { NB = 3 };
    const int blen[NB] = {16, 26, 16}; /* full length of each batch sequence */
    int bt[NB][32];
    rout_t rB[NB];
    for (int i = 0; i < NB; i++) {
        fill_tokens(bt[i], blen[i], vtok, 100 + (uint64_t)i);
        ref_forward(&M, bt[i], blen[i], &rB[i]);
    }
    double t_ref = st_time_sec();
    printf("golden[%s] reference ready in %.2f s; greedy continuation:", tag, t_ref - t0);
    for (int i = N_PROMPT; i < N_PROMPT + N_DECODE; i++) printf(" %d", seqA[i]);
    printf("\n");

    /* ---- engine ---- */
    st_engine_opts_t eo;
    st_engine_opts_default(&eo);
    eo.max_seqs = 8;
    eo.max_batch_tokens = MAX_STEP_TOKENS;
    eo.max_ctx = 64;
    eo.kv_page_size = 16;
    eo.kv_pages = 0;
    eo.routing = ST_ROUTE_TOPK;
    st_engine_t *e = NULL;
    s = st_engine_create(&e, ck, &eo);
    if (s != ST_OK || !e) {
        fprintf(stderr, "golden[%s]: FATAL: st_engine_create on the tiny checkpoint failed: %s: %s\n", tag,
                st_status_str(s), st_err_last());
        CHECK(s == ST_OK && e, "[%s] st_engine_create failed (%s)", tag, st_status_str(s));
        goto done_ref;
    }
    hook_t hk;
    memset(&hk, 0, sizeof hk);
    hk.c = c;
    hk.print_left = 20;
    hk.min_flip_margin = INFINITY;
    st_engine_set_route_hook(e, route_hook, &hk);
    float *logits = xcalloc((size_t)MAX_STEP_TOKENS * c->vocab, sizeof(float));
    phase_t ph;

    /* phase 1: one prefill step (all logits), then greedy decode */
    int slotA = -1, slotB = -1;
    phase_begin(&ph, &hk, "prefill+decode");
    s = st_engine_seq_open(e, &slotA);
    CHECK(s == ST_OK, "[%s] seq_open: %s", tag, st_status_str(s));
    if (s == ST_OK) {
        ent_t en = {slotA, &rA, seqA, 0, N_PROMPT, true};
        bool ok = run_step(e, &hk, &ph, tag, &en, 1, logits);
        for (int g = 0; ok && g < N_DECODE; g++) {
            ent_t d1 = {slotA, &rA, seqA, N_PROMPT + g, 1, false};
            ok = run_step(e, &hk, &ph, tag, &d1, 1, logits);
        }
    }
    phase_end(&ph, &hk, tag);

    /* phase 2: the same prompt in three pieces, then the same decode */
    phase_begin(&ph, &hk, "pieces 5+16+16");
    s = st_engine_seq_open(e, &slotB);
    CHECK(s == ST_OK && slotB != slotA, "[%s] second seq_open: %s (slot %d, first %d)", tag, st_status_str(s), slotB,
          slotA);
    if (s == ST_OK) {
        const int piece[3] = {5, 16, 16};
        bool ok = true;
        for (int i = 0, st0 = 0; ok && i < 3; st0 += piece[i], i++) {
            ent_t en = {slotB, &rA, seqA, st0, piece[i], true};
            ok = run_step(e, &hk, &ph, tag, &en, 1, logits);
        }
        for (int g = 0; ok && g < N_DECODE; g++) {
            ent_t d1 = {slotB, &rA, seqA, N_PROMPT + g, 1, true};
            ok = run_step(e, &hk, &ph, tag, &d1, 1, logits);
        }
    }
    phase_end(&ph, &hk, tag);

    /* phase 3: three sequences of different lengths in one step, then mixed steps */
    phase_begin(&ph, &hk, "batch of 3");
    int bs[NB] = {-1, -1, -1};
    bool bok = true;
    for (int i = 0; i < NB; i++) {
        s = st_engine_seq_open(e, &bs[i]);
        CHECK(s == ST_OK, "[%s] batch seq_open %d: %s", tag, i, st_status_str(s));
        bok = bok && s == ST_OK;
    }
    if (bok) {
        /* lengths after each step: seq0 9,14,15,16; seq1 23,24,25,26; seq2 13,14,15,16 */
        ent_t s1[3] = {{bs[0], &rB[0], bt[0], 0, 9, true}, {bs[1], &rB[1], bt[1], 0, 23, true},
                       {bs[2], &rB[2], bt[2], 0, 13, true}};
        ent_t s2[3] = {{bs[1], &rB[1], bt[1], 23, 1, false}, {bs[0], &rB[0], bt[0], 9, 5, true},
                       {bs[2], &rB[2], bt[2], 13, 1, true}};
        ent_t s3[3] = {{bs[0], &rB[0], bt[0], 14, 1, false}, {bs[1], &rB[1], bt[1], 24, 1, false},
                       {bs[2], &rB[2], bt[2], 14, 1, false}};
        ent_t s4[3] = {{bs[2], &rB[2], bt[2], 15, 1, true}, {bs[0], &rB[0], bt[0], 15, 1, true},
                       {bs[1], &rB[1], bt[1], 25, 1, true}};
        bok = run_step(e, &hk, &ph, tag, s1, 3, logits) && run_step(e, &hk, &ph, tag, s2, 3, logits) &&
              run_step(e, &hk, &ph, tag, s3, 3, logits) && run_step(e, &hk, &ph, tag, s4, 3, logits);
    }
    phase_end(&ph, &hk, tag);

    /* phase 4: a reused slot starts from empty state (prompt in one step, last row only, then decode) */
    phase_begin(&ph, &hk, "reused slot");
    if (slotA >= 0) st_engine_seq_close(e, slotA);
    int slotD = -1;
    s = st_engine_seq_open(e, &slotD);
    CHECK(s == ST_OK, "[%s] seq_open after close: %s", tag, st_status_str(s));
    if (s == ST_OK) {
        CHECK(st_engine_seq_len(e, slotD) == 0, "[%s] reopened slot %d has length %d", tag, slotD,
              st_engine_seq_len(e, slotD));
        ent_t en = {slotD, &rA, seqA, 0, N_PROMPT, false};
        bool ok = run_step(e, &hk, &ph, tag, &en, 1, logits);
        ent_t d1 = {slotD, &rA, seqA, N_PROMPT, 1, false};
        if (ok) run_step(e, &hk, &ph, tag, &d1, 1, logits);
    }
    phase_end(&ph, &hk, tag);

    CHECK(hk.errors == 0, "[%s] %d route-hook calls had unexpected arguments (routing not forced there)", tag,
          hk.errors);
    printf("golden[%s] total routing flips %ld of %ld (layer,token) pairs%s", tag, hk.flips, hk.routed,
           hk.flips ? "" : "\n");
    if (hk.flips) printf(", smallest reference margin among them %.3e\n", hk.min_flip_margin);
    printf("golden[%s] done in %.2f s (reference %.2f s)\n", tag, st_time_sec() - t0, t_ref - t0);

    free(logits);
    st_engine_destroy(e);
done_ref:
    free_rout(&rA);
    for (int i = 0; i < NB; i++) free_rout(&rB[i]);
    free_model(&M);
    st_ckpt_close(ck);
}

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *f) { return remove(p); }

static void mkdir_p(const char *path) {
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            mkdir(buf, 0755);
            *p = '/';
        }
    mkdir(buf, 0755);
}

int main(void) {
    const char *v = getenv("STRATA_GOLDEN_VERBOSE");
    g_verbose = v && *v && strcmp(v, "0") != 0;
    const char *base = getenv("STRATA_TEST_TMP");
    if (!base || !*base) base = "/tmp";
    mkdir_p(base);
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s/golden-XXXXXX", base);
    if (!mkdtemp(tmp)) {
        fprintf(stderr, "golden: mkdtemp(%s): %s\n", tmp, strerror(errno));
        CHECK(0, "cannot create a temp dir under %s", base);
        return st_test_done();
    }
    run_case(tmp, "f32", ST_DT_F32, false, false);
    run_case(tmp, "bf16", ST_DT_BF16, false, false);
    run_case(tmp, "bf16-mxfp4", ST_DT_BF16, true, false);
    run_case(tmp, "f32-variant", ST_DT_F32, false, true);
    if (!getenv("STRATA_GOLDEN_KEEP")) nftw(tmp, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    else printf("golden: kept %s\n", tmp);
    return st_test_done();
}
