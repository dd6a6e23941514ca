/* `strata ckpt init`: writes a random checkpoint of a preset in the exact K3 layout
 * (notes/checkpoint-layout.md §3): config.json with text_config, one shard per decoder layer plus
 * one for the globals, and model.safetensors.index.json. Tensors are generated row by row and
 * streamed to disk; nothing holds a whole checkpoint (k3-mini is ~7 GB) in memory.
 * Every tensor has its own RNG stream seeded from (seed, name), so the output is deterministic; the
 * shards are written by up to one thread per core. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "strata/model.h"

#define PFX "language_model."
#define RES_PROJ_SCALE 1.0f  /* AttnRes pseudo-query: N(0,1)/sqrt(d) × this (scores O(1)) */
#define SKEW_SHARED 3.0f     /* shared embedding component along u when skewing the router */

typedef enum {
    K_MATRIX,   /* N(0,1)/sqrt(cols) */
    K_EMBED,    /* N(0,1) (+ SKEW_SHARED·u with skew) */
    K_GATE,     /* router: N(0,1)/sqrt(d) (+ skew·u/γ on hot rows) */
    K_NORM,     /* 1 + 0.1 N */
    K_RES_PROJ, /* N(0,1)/sqrt(d) · RES_PROJ_SCALE */
    K_ALOG,     /* log(U(1,16)) for the first H entries, 0 padding */
    K_DT_BIAS,  /* 0.1 N */
    K_CONV,     /* 0.5 N (fan-in 4) */
    K_EBIAS,    /* 0.01 N */
} kind_t;

typedef struct {
    char name[192];     /* full stored name, with the language_model. prefix */
    st_dtype_t dtype;   /* stored dtype: F32, BF16 or U8 */
    int ndim;
    int64_t shape[4];
    kind_t kind;
    int layer;          /* -1 for globals */
    int mx;             /* 0 plain; 1 MXFP4 packed codes; 2 MXFP4 scales (follows its packed part) */
    int64_t rows, cols; /* generated matrix: rows × cols values */
    uint64_t off;       /* payload offset */
    uint64_t nbytes;
} tspec_t;

typedef struct {
    tspec_t *v;
    size_t n, cap;
} tlist_t;

typedef struct {
    const st_config_t *c;
    const st_ckpt_init_opts_t *o;
    const float *u;  /* [d] unit direction of the router skew, or NULL */
    float *row;      /* [max cols] scratch */
    void *out_row;   /* [max cols * 4] scratch */
    uint8_t *scales; /* pending MXFP4 scales of the last packed tensor */
    size_t scales_len;
    float *gamma;    /* [d] for K_GATE */
    bool *hot;       /* [n_experts] for K_GATE */
} gen_t;

/* ---- deterministic random streams ---- */

typedef struct {
    st_rng_t r;
    bool has;
    float spare;
} nrng_t;

static uint64_t fnv(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

static void nrng_seed(nrng_t *g, uint64_t seed, const char *name) {
    g->r.s = seed ^ fnv(name);
    (void)st_rng_next(&g->r);
    g->has = false;
}

/* Marsaglia polar method: two normals per accepted pair, no trig (k3-mini draws ~4e9 values). */
static float nrng_normal(nrng_t *g) {
    if (g->has) {
        g->has = false;
        return g->spare;
    }
    double a, b, s;
    do {
        a = 2.0 * st_rng_uniform(&g->r) - 1.0;
        b = 2.0 * st_rng_uniform(&g->r) - 1.0;
        s = a * a + b * b;
    } while (s >= 1.0 || s == 0.0);
    double m = sqrt(-2.0 * log(s) / s);
    g->spare = (float)(b * m);
    g->has = true;
    return (float)(a * m);
}

/* ---- tensor list ---- */

static st_status_t add(tlist_t *L, const char *name, st_dtype_t dt, kind_t kind, int layer, int ndim,
                       const int64_t *shape) {
    if (L->n == L->cap) {
        size_t nc = L->cap ? 2 * L->cap : 64;
        tspec_t *nv = realloc(L->v, nc * sizeof *nv);
        if (!nv) return ST_FAIL(ST_ERR_NO_MEMORY, "ckpt init: tensor list");
        L->v = nv;
        L->cap = nc;
    }
    tspec_t *t = &L->v[L->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = dt;
    t->kind = kind;
    t->layer = layer;
    t->ndim = ndim;
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        t->shape[i] = shape[i];
        numel *= shape[i];
    }
    /* generated as rows × cols: 2-D as is, [C,1,4] as C × 4, vectors as one row */
    t->cols = ndim >= 1 ? shape[ndim - 1] : 1;
    t->rows = numel / (t->cols ? t->cols : 1);
    if (ndim == 1) t->rows = 1;
    t->nbytes = (uint64_t)numel * st_dtype_size(dt);
    return ST_OK;
}

#define ADD(L, dt, kind, layer, ...)                                                                       \
    do {                                                                                                   \
        int64_t sh_[] = {__VA_ARGS__};                                                                     \
        st_status_t s_ = add((L), nm, (dt), (kind), (layer), (int)ST_ARRAY_LEN(sh_), sh_);                 \
        if (s_) return s_;                                                                                 \
    } while (0)

/* Matrix [rows, cols]: plain `<stem>.weight`, or MXFP4 `<stem>.weight_packed` + `.weight_scale`. */
static st_status_t add_matrix(tlist_t *L, const char *stem, st_dtype_t dt, bool mx, int layer, int64_t rows,
                              int64_t cols) {
    char nm[192];
    if (!mx) {
        snprintf(nm, sizeof nm, "%s.weight", stem);
        ADD(L, dt, K_MATRIX, layer, rows, cols);
        return ST_OK;
    }
    snprintf(nm, sizeof nm, "%s.weight_packed", stem);
    ADD(L, ST_DT_U8, K_MATRIX, layer, rows, cols / 2);
    L->v[L->n - 1].mx = 1, L->v[L->n - 1].rows = rows, L->v[L->n - 1].cols = cols;
    snprintf(nm, sizeof nm, "%s.weight_scale", stem);
    ADD(L, ST_DT_U8, K_MATRIX, layer, rows, cols / 32);
    L->v[L->n - 1].mx = 2, L->v[L->n - 1].rows = rows, L->v[L->n - 1].cols = cols;
    return ST_OK;
}

static st_status_t layer_specs(const st_config_t *c, st_dtype_t dt, int l, tlist_t *L) {
    char nm[192], stem[192], pre[96];
    st_status_t s;
    int64_t d = c->d;
    snprintf(pre, sizeof pre, PFX "model.layers.%d.", l);
#define NM(fmt) snprintf(nm, sizeof nm, "%s" fmt, pre)
#define STEM(...) (snprintf(stem, sizeof stem, __VA_ARGS__), stem)
#define MAT(suffix, r, cc)                                                                    \
    do {                                                                                      \
        if ((s = add_matrix(L, STEM("%s%s", pre, suffix), dt, false, l, (r), (cc)))) return s; \
    } while (0)
    NM("input_layernorm.weight");
    ADD(L, dt, K_NORM, l, d);
    NM("post_attention_layernorm.weight");
    ADD(L, dt, K_NORM, l, d);
    if (c->attn_res_block > 0) {
        NM("self_attention_res_norm.weight");
        ADD(L, dt, K_NORM, l, d);
        NM("self_attention_res_proj.weight");
        ADD(L, dt, K_RES_PROJ, l, 1, d);
        NM("mlp_res_norm.weight");
        ADD(L, dt, K_NORM, l, d);
        NM("mlp_res_proj.weight");
        ADD(L, dt, K_RES_PROJ, l, 1, d);
    }
    if (!c->is_mla[l]) {
        int64_t H = c->kda_heads, P = (int64_t)c->kda_heads * c->kda_head_dim;
        MAT("self_attn.q_proj", P, d);
        MAT("self_attn.k_proj", P, d);
        MAT("self_attn.v_proj", P, d);
        NM("self_attn.q_conv1d.weight");
        ADD(L, ST_DT_F32, K_CONV, l, P, 1, c->conv_k);
        NM("self_attn.k_conv1d.weight");
        ADD(L, ST_DT_F32, K_CONV, l, P, 1, c->conv_k);
        NM("self_attn.v_conv1d.weight");
        ADD(L, ST_DT_F32, K_CONV, l, P, 1, c->conv_k);
        MAT("self_attn.f_a_proj", c->f_rank, d);
        MAT("self_attn.f_b_proj", P, c->f_rank);
        NM("self_attn.A_log");
        ADD(L, ST_DT_F32, K_ALOG, l, (H + 127) / 128 * 128);
        NM("self_attn.dt_bias");
        ADD(L, ST_DT_F32, K_DT_BIAS, l, P);
        MAT("self_attn.b_proj", H, d);
        NM("self_attn.o_norm.weight");
        ADD(L, ST_DT_F32, K_NORM, l, c->kda_head_dim);
        if (c->full_rank_gate) {
            MAT("self_attn.g_proj", P, d);
        } else {
            MAT("self_attn.g_a_proj", c->g_rank, d);
            MAT("self_attn.g_b_proj", P, c->g_rank);
        }
        MAT("self_attn.o_proj", d, P);
    } else {
        int64_t H = c->mla_heads, qk = c->qk_nope + c->qk_rope;
        if (c->q_lora_rank > 0) {
            MAT("self_attn.q_a_proj", c->q_lora_rank, d);
            NM("self_attn.q_a_layernorm.weight");
            ADD(L, dt, K_NORM, l, c->q_lora_rank);
            MAT("self_attn.q_b_proj", H * qk, c->q_lora_rank);
        } else {
            MAT("self_attn.q_proj", H * qk, d);
        }
        MAT("self_attn.kv_a_proj_with_mqa", c->kv_lora_rank + c->qk_rope, d);
        NM("self_attn.kv_a_layernorm.weight");
        ADD(L, dt, K_NORM, l, c->kv_lora_rank);
        MAT("self_attn.kv_b_proj", H * (c->qk_nope + c->v_head_dim), c->kv_lora_rank);
        if (c->mla_output_gate) MAT("self_attn.g_proj", H * c->v_head_dim, d);
        MAT("self_attn.o_proj", d, H * c->v_head_dim);
    }
    if (!st_config_is_moe_layer(c, l)) {
        MAT("mlp.gate_proj", c->intermediate, d);
        MAT("mlp.up_proj", c->intermediate, d);
        MAT("mlp.down_proj", d, c->intermediate);
        return ST_OK;
    }
    int64_t W = st_config_expert_width(c), sh = (int64_t)c->n_shared * c->moe_inter;
    NM("block_sparse_moe.gate.weight");
    ADD(L, dt, K_GATE, l, c->n_experts, d);
    NM("block_sparse_moe.gate.e_score_correction_bias");
    ADD(L, ST_DT_F32, K_EBIAS, l, c->n_experts);
    if (c->latent > 0) {
        MAT("block_sparse_moe.routed_expert_down_proj", c->latent, d);
        if (c->latent_norm) {
            NM("block_sparse_moe.routed_expert_norm.weight");
            ADD(L, dt, K_NORM, l, c->latent);
        }
        MAT("block_sparse_moe.routed_expert_up_proj", d, c->latent);
    }
    if (sh > 0) {
        MAT("block_sparse_moe.shared_experts.gate_proj", sh, d);
        MAT("block_sparse_moe.shared_experts.up_proj", sh, d);
        MAT("block_sparse_moe.shared_experts.down_proj", d, sh);
    }
    for (int j = 0; j < c->n_experts; j++) {
        bool mx = c->experts_mxfp4;
        if ((s = add_matrix(L, STEM("%sblock_sparse_moe.experts.%d.w1", pre, j), dt, mx, l, c->moe_inter, W))) return s;
        if ((s = add_matrix(L, STEM("%sblock_sparse_moe.experts.%d.w2", pre, j), dt, mx, l, W, c->moe_inter))) return s;
        if ((s = add_matrix(L, STEM("%sblock_sparse_moe.experts.%d.w3", pre, j), dt, mx, l, c->moe_inter, W))) return s;
    }
    return ST_OK;
#undef NM
#undef STEM
#undef MAT
}

static st_status_t global_specs(const st_config_t *c, st_dtype_t dt, tlist_t *L) {
    char nm[192];
    int64_t d = c->d;
    snprintf(nm, sizeof nm, PFX "model.embed_tokens.weight");
    ADD(L, dt, K_EMBED, -1, c->vocab, d);
    snprintf(nm, sizeof nm, PFX "lm_head.weight");
    ADD(L, dt, K_MATRIX, -1, c->vocab, d);
    snprintf(nm, sizeof nm, PFX "model.norm.weight");
    ADD(L, dt, K_NORM, -1, d);
    if (c->attn_res_block > 0) {
        snprintf(nm, sizeof nm, PFX "model.output_attn_res_norm.weight");
        ADD(L, dt, K_NORM, -1, d);
        snprintf(nm, sizeof nm, PFX "model.output_attn_res_proj.weight");
        ADD(L, dt, K_RES_PROJ, -1, 1, d);
    }
    return ST_OK;
}

/* ---- value generation ---- */

/* One row of a tensor into g->row (cols values). */
static void gen_row(gen_t *g, const tspec_t *t, nrng_t *r, int64_t row) {
    const st_config_t *c = g->c;
    float *v = g->row;
    int64_t n = t->cols;
    switch (t->kind) {
    case K_MATRIX: {
        float sc = 1.0f / sqrtf((float)n);
        for (int64_t i = 0; i < n; i++) v[i] = nrng_normal(r) * sc;
        break;
    }
    case K_EMBED:
        for (int64_t i = 0; i < n; i++) v[i] = nrng_normal(r) + (g->u ? SKEW_SHARED * g->u[i] : 0.0f);
        break;
    case K_GATE: {
        float sc = 1.0f / sqrtf((float)n);
        bool hot = g->u && g->hot[row];
        for (int64_t i = 0; i < n; i++) {
            v[i] = nrng_normal(r) * sc;
            /* NOTE: u/γ so that the post-attention RMSNorm weight γ cancels: row·x̂ gains skew·(u·e)/rms(e) */
            if (hot) v[i] += g->o->skew_router * g->u[i] / g->gamma[i];
        }
        break;
    }
    case K_NORM:
        for (int64_t i = 0; i < n; i++) v[i] = 1.0f + 0.1f * nrng_normal(r);
        break;
    case K_RES_PROJ: {
        float sc = RES_PROJ_SCALE / sqrtf((float)n);
        for (int64_t i = 0; i < n; i++) v[i] = nrng_normal(r) * sc;
        break;
    }
    case K_ALOG:
        for (int64_t i = 0; i < n; i++)
            v[i] = i < c->kda_heads ? (float)log(1.0 + 15.0 * st_rng_uniform(&r->r)) : 0.0f;
        break;
    case K_DT_BIAS:
        for (int64_t i = 0; i < n; i++) v[i] = 0.1f * nrng_normal(r);
        break;
    case K_CONV:
        for (int64_t i = 0; i < n; i++) v[i] = 0.5f * nrng_normal(r);
        break;
    case K_EBIAS:
        for (int64_t i = 0; i < n; i++) v[i] = 0.01f * nrng_normal(r);
        break;
    }
}

static float round_to(st_dtype_t dt, float x) { return dt == ST_DT_BF16 ? st_bf16_to_f32(st_f32_to_bf16(x)) : x; }

/* OCP E2M1 code nearest to x (x already divided by the group scale); ties go to the smaller
 * magnitude. Midpoints of {0, .5, 1, 1.5, 2, 3, 4, 6}. */
static uint8_t e2m1_code(float x) {
    static const float mid[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    float a = fabsf(x);
    int c = 0;
    while (c < 7 && a > mid[c]) c++;
    return (uint8_t)(c | (x < 0 && c ? 8 : 0));
}

/* Quantize one row of cols values: codes [cols/2], scales [cols/32]. */
static void mxfp4_row(const float *v, int64_t cols, uint8_t *codes, uint8_t *scales) {
    for (int64_t g = 0; g < cols / 32; g++) {
        const float *x = v + g * 32;
        float amax = 0;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[i]));
        int e = 0; /* smallest e with amax <= 6·2^e */
        if (amax > 0) {
            e = (int)ceil(log2((double)amax / 6.0));
            if (e < -127) e = -127;
            if (e > 127) e = 127;
        }
        scales[g] = (uint8_t)(e + 127);
        float inv = ldexpf(1.0f, -e); /* exact power of two */
        for (int i = 0; i < 16; i++) {
            uint8_t lo = e2m1_code(x[2 * i] * inv), hi = e2m1_code(x[2 * i + 1] * inv);
            codes[g * 16 + i] = (uint8_t)(lo | (hi << 4));
        }
    }
}

/* Regenerate a layer's post-attention norm (as stored) and hot-expert set for its router. */
static void prepare_gate(gen_t *g, int l) {
    const st_config_t *c = g->c;
    char nm[192];
    snprintf(nm, sizeof nm, PFX "model.layers.%d.post_attention_layernorm.weight", l);
    tspec_t t;
    memset(&t, 0, sizeof t);
    t.kind = K_NORM;
    t.rows = 1;
    t.cols = c->d;
    nrng_t r;
    nrng_seed(&r, g->o->seed, nm);
    gen_row(g, &t, &r, 0);
    for (int i = 0; i < c->d; i++) {
        float gm = round_to(g->o->dtype, g->row[i]);
        if (fabsf(gm) < 0.25f) gm = gm < 0 ? -0.25f : 0.25f; /* γ = 1 + 0.1N: practically never */
        g->gamma[i] = gm;
    }
    /* hot experts: n/8 (at least 1) distinct ids per layer */
    int n = c->n_experts, n_hot = ST_MAX(1, n / 8);
    int *perm = (int *)g->out_row; /* scratch, >= n ints */
    snprintf(nm, sizeof nm, "hot-experts.%d", l);
    st_rng_t hr = {g->o->seed ^ fnv(nm)};
    for (int j = 0; j < n; j++) perm[j] = j, g->hot[j] = false;
    for (int j = 0; j < n_hot; j++) {
        int k = j + (int)(st_rng_next(&hr) % (uint64_t)(n - j));
        int tmp = perm[j];
        perm[j] = perm[k];
        perm[k] = tmp;
        g->hot[perm[j]] = true;
    }
}

static st_status_t write_tensor(gen_t *g, FILE *f, const tspec_t *t, const char *path) {
    if (t->mx == 2) { /* scales were produced with the packed codes just before */
        if (fwrite(g->scales, 1, g->scales_len, f) != g->scales_len) goto err_io;
        return ST_OK;
    }
    nrng_t r;
    char seedname[192];
    snprintf(seedname, sizeof seedname, "%s", t->name);
    if (t->mx == 1) *strrchr(seedname, '_') = 0; /* stem.weight: packed and scale share one stream */
    nrng_seed(&r, g->o->seed, seedname);
    if (t->kind == K_GATE && g->u) prepare_gate(g, t->layer);
    if (t->mx == 1) {
        size_t sl = (size_t)(t->rows * (t->cols / 32));
        uint8_t *ns = realloc(g->scales, sl ? sl : 1);
        if (!ns) return ST_FAIL(ST_ERR_NO_MEMORY, "ckpt init: MXFP4 scales of %s", t->name);
        g->scales = ns;
        g->scales_len = sl;
    }
    for (int64_t row = 0; row < t->rows; row++) {
        gen_row(g, t, &r, row);
        size_t n = (size_t)t->cols, bytes;
        if (t->mx == 1) {
            mxfp4_row(g->row, t->cols, g->out_row, g->scales + row * (t->cols / 32));
            bytes = n / 2;
        } else if (t->dtype == ST_DT_BF16) {
            uint16_t *o = g->out_row;
            for (size_t i = 0; i < n; i++) o[i] = st_f32_to_bf16(g->row[i]);
            bytes = 2 * n;
        } else {
            memcpy(g->out_row, g->row, 4 * n);
            bytes = 4 * n;
        }
        if (fwrite(g->out_row, 1, bytes, f) != bytes) goto err_io;
    }
    return ST_OK;
err_io:
    return ST_FAIL(ST_ERR_IO, "ckpt init: writing %s to %s: %s", t->name, path, strerror(errno));
}

static const char *dt_json(st_dtype_t t) { return st_dtype_name(t); }

static st_status_t write_shard(gen_t *g, const char *path, tspec_t *v, size_t n, uint64_t *payload_out) {
    st_status_t s = ST_OK;
    json_t *hdr = json_object();
    json_t *meta = json_object();
    if (!hdr || !meta) {
        json_decref(hdr);
        json_decref(meta);
        return ST_FAIL(ST_ERR_NO_MEMORY, "ckpt init: header");
    }
    json_object_set_new(meta, "format", json_string("pt"));
    json_object_set_new(hdr, "__metadata__", meta);
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        tspec_t *t = &v[i];
        t->off = off;
        off += t->nbytes;
        json_t *shape = json_array(), *ofs = json_array(), *e = json_object();
        for (int k = 0; k < t->ndim; k++) json_array_append_new(shape, json_integer(t->shape[k]));
        json_array_append_new(ofs, json_integer((json_int_t)t->off));
        json_array_append_new(ofs, json_integer((json_int_t)(t->off + t->nbytes)));
        json_object_set_new(e, "dtype", json_string(dt_json(t->dtype)));
        json_object_set_new(e, "shape", shape);
        json_object_set_new(e, "data_offsets", ofs);
        json_object_set_new(hdr, t->name, e);
    }
    char *text = json_dumps(hdr, JSON_COMPACT);
    json_decref(hdr);
    if (!text) return ST_FAIL(ST_ERR_NO_MEMORY, "ckpt init: header text");
    size_t hl = strlen(text), padded = (hl + 7) & ~(size_t)7; /* payload 8-byte aligned */
    FILE *f = fopen(path, "wb");
    if (!f) {
        s = ST_FAIL(ST_ERR_IO, "ckpt init: cannot create %s: %s", path, strerror(errno));
        goto err_text;
    }
    setvbuf(f, NULL, _IOFBF, 1 << 22);
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    if (fwrite(len8, 1, 8, f) != 8 || fwrite(text, 1, hl, f) != hl) goto err_io;
    for (size_t i = hl; i < padded; i++)
        if (fputc(' ', f) == EOF) goto err_io;
    for (size_t i = 0; i < n; i++)
        if ((s = write_tensor(g, f, &v[i], path))) goto err_file;
    if (fclose(f) != 0) {
        f = NULL;
        goto err_io;
    }
    free(text);
    *payload_out = off;
    return ST_OK;
err_io:
    s = ST_FAIL(ST_ERR_IO, "ckpt init: writing %s: %s", path, strerror(errno));
err_file:
    if (f) fclose(f);
err_text:
    free(text);
    return s;
}

/* ---- config.json ---- */

static json_t *jreal(float x) { /* shortest decimal that reads back as the same float */
    char buf[32];
    for (int p = 1; p <= 9; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, (double)x);
        if ((float)strtod(buf, NULL) == x) break;
    }
    return json_real(strtod(buf, NULL));
}

static const char *k_quant_config =
    "{\"config_groups\":{\"group_0\":{\"format\":\"mxfp4-pack-quantized\",\"input_activations\":null,"
    "\"output_activations\":null,\"targets\":[\"Linear\"],"
    "\"weights\":{\"actorder\":null,\"block_structure\":null,\"dynamic\":false,\"group_size\":32,\"num_bits\":4,"
    "\"observer\":\"minmax\",\"observer_kwargs\":{},\"scale_dtype\":\"torch.uint8\",\"strategy\":\"group\","
    "\"symmetric\":true,\"type\":\"float\",\"zp_dtype\":null}}},"
    "\"format\":\"mxfp4-pack-quantized\",\"global_compression_ratio\":null,"
    "\"ignore\":[\"re:.*self_attn.*\",\"re:.*shared_experts.*\",\"re:.*mlp\\\\.(gate|up|gate_up|down)_proj.*\","
    "\"re:.*lm_head.*\",\"re:.*vision_tower.*\",\"re:.*mm_projector.*\"],"
    "\"kv_cache_scheme\":null,\"quant_method\":\"compressed-tensors\",\"quantization_status\":\"compressed\"}";

static char *config_text(const st_config_t *c, st_dtype_t dt) {
    json_t *tc = json_object(), *lac = json_object(), *full = json_array(), *kda = json_array();
    json_t *top = json_object();
#define SI(o, k, v) json_object_set_new((o), (k), json_integer(v))
#define SB(o, k, v) json_object_set_new((o), (k), json_boolean(v))
#define SS(o, k, v) json_object_set_new((o), (k), json_string(v))
#define SR(o, k, v) json_object_set_new((o), (k), jreal(v))
    json_t *arch = json_array();
    json_array_append_new(arch, json_string("KimiLinearForCausalLM"));
    json_object_set_new(tc, "architectures", arch);
    SS(tc, "model_type", "kimi_linear");
    SS(tc, "dtype", dt == ST_DT_F32 ? "float32" : "bfloat16");
    SI(tc, "hidden_size", c->d);
    SI(tc, "num_hidden_layers", c->n_layers);
    SI(tc, "vocab_size", c->vocab);
    SI(tc, "intermediate_size", c->intermediate);
    SR(tc, "rms_norm_eps", c->rms_eps);
    SB(tc, "tie_word_embeddings", c->tie_embeddings);
    SS(tc, "hidden_act", c->act == ST_ACT_SITU ? "situ" : "silu");
    SR(tc, "activation_situ_beta", c->situ_beta1);
    SR(tc, "activation_situ_linear_beta", c->situ_beta2);
    if (c->attn_res_block > 0) SI(tc, "attn_res_block_size", c->attn_res_block);
    SI(tc, "num_attention_heads", c->mla_heads);
    SI(tc, "num_key_value_heads", c->mla_heads);
    if (c->q_lora_rank > 0)
        SI(tc, "q_lora_rank", c->q_lora_rank);
    else
        json_object_set_new(tc, "q_lora_rank", json_null());
    SI(tc, "kv_lora_rank", c->kv_lora_rank);
    SI(tc, "qk_nope_head_dim", c->qk_nope);
    SI(tc, "qk_rope_head_dim", c->qk_rope);
    SI(tc, "v_head_dim", c->v_head_dim);
    SB(tc, "mla_use_nope", true);
    SB(tc, "mla_use_output_gate", c->mla_output_gate);
    SI(tc, "first_k_dense_replace", c->first_k_dense);
    SI(tc, "moe_layer_freq", 1);
    SI(tc, "num_experts", c->n_experts);
    SI(tc, "num_experts_per_token", c->top_k);
    SI(tc, "num_shared_experts", c->n_shared);
    SI(tc, "moe_intermediate_size", c->moe_inter);
    if (c->latent > 0) SI(tc, "routed_expert_hidden_size", c->latent);
    SB(tc, "latent_moe_use_norm", c->latent_norm);
    SS(tc, "moe_router_activation_func", "sigmoid");
    SS(tc, "topk_method", "noaux_tc");
    SB(tc, "use_grouped_topk", true);
    SI(tc, "num_expert_group", 1);
    SI(tc, "topk_group", 1);
    SB(tc, "moe_renormalize", c->renormalize);
    SR(tc, "routed_scaling_factor", c->routed_scale);
    SI(tc, "num_nextn_predict_layers", 0);
    if (c->bos_id >= 0) SI(tc, "bos_token_id", c->bos_id);
    if (c->eos_id >= 0) SI(tc, "eos_token_id", c->eos_id);
    SI(lac, "num_heads", c->kda_heads);
    SI(lac, "head_dim", c->kda_head_dim);
    SI(lac, "short_conv_kernel_size", c->conv_k);
    if (c->gate_bounded) SR(lac, "gate_lower_bound", c->gate_lower_bound);
    SB(lac, "use_full_rank_gate", c->full_rank_gate);
    for (int l = 0; l < c->n_layers; l++) json_array_append_new(c->is_mla[l] ? full : kda, json_integer(l + 1));
    json_object_set_new(lac, "full_attn_layers", full);
    json_object_set_new(lac, "kda_layers", kda);
    json_object_set_new(tc, "linear_attn_config", lac);
    if (c->experts_mxfp4) json_object_set_new(tc, "quantization_config", json_loads(k_quant_config, 0, NULL));

    arch = json_array();
    json_array_append_new(arch, json_string("KimiK3ForConditionalGeneration"));
    json_object_set_new(top, "architectures", arch);
    SS(top, "model_type", "kimi_k3");
    SS(top, "dtype", dt == ST_DT_F32 ? "float32" : "bfloat16");
    if (c->bos_id >= 0) SI(top, "bos_token_id", c->bos_id);
    if (c->eos_id >= 0) SI(top, "eos_token_id", c->eos_id);
    SB(top, "tie_word_embeddings", c->tie_embeddings);
    SS(top, "strata_note", "random weights written by `strata ckpt init`");
    json_object_set_new(top, "text_config", tc);
#undef SI
#undef SB
#undef SS
#undef SR
    char *text = json_dumps(top, JSON_INDENT(2) | JSON_REAL_PRECISION(9));
    json_decref(top);
    return text;
}

static st_status_t write_text(const char *dir, const char *name, const char *text) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return st_file_write_all(path, text, strlen(text)); /* logs its own failure */
}

/* ---- shards, written in parallel ---- */

typedef struct {
    const st_config_t *c;
    const st_ckpt_init_opts_t *o;
    const float *u;     /* router skew direction or NULL (shared, read-only) */
    int64_t maxc;       /* widest generated row */
    int n_shards;
    tlist_t *lists;     /* [n_shards] tensor lists (filled by the writers) */
    uint64_t *payload;  /* [n_shards] */
    pthread_mutex_t mu;
    int next;           /* next shard to take */
    st_status_t status; /* first failure */
} shards_t;

static void shard_name(char *fname, size_t n, int sh, int n_shards) {
    snprintf(fname, n, "model-%05d-of-%06d.safetensors", sh + 1, n_shards);
}

static void *shard_writer(void *arg) {
    shards_t *S = arg;
    const st_config_t *c = S->c;
    gen_t g = {.c = c, .o = S->o, .u = S->u};
    g.row = malloc((size_t)S->maxc * sizeof(float));
    g.out_row = malloc((size_t)S->maxc * sizeof(float));
    g.gamma = malloc((size_t)c->d * sizeof(float));
    g.hot = calloc((size_t)c->n_experts + 1, sizeof(bool));
    st_status_t s = g.row && g.out_row && g.gamma && g.hot ? ST_OK : ST_FAIL(ST_ERR_NO_MEMORY, "ckpt init: buffers");
    for (;;) {
        pthread_mutex_lock(&S->mu);
        if (s && !S->status) S->status = s;
        int sh = S->status ? S->n_shards : S->next++;
        pthread_mutex_unlock(&S->mu);
        if (sh >= S->n_shards) break;
        char fname[64], path[4096];
        shard_name(fname, sizeof fname, sh, S->n_shards);
        snprintf(path, sizeof path, "%s/%s", S->o->out_dir, fname);
        tlist_t *L = &S->lists[sh];
        s = sh < c->n_layers ? layer_specs(c, S->o->dtype, sh, L) : global_specs(c, S->o->dtype, L);
        if (!s) s = write_shard(&g, path, L->v, L->n, &S->payload[sh]);
    }
    free(g.scales);
    free(g.hot);
    free(g.gamma);
    free(g.out_row);
    free(g.row);
    return NULL;
}

st_status_t st_ckpt_init(const st_ckpt_init_opts_t *o) {
    st_config_t c;
    st_status_t s;
    if (!o || !o->out_dir) return ST_FAIL(ST_ERR_INVALID_ARG, "ckpt init: no output directory");
    if (o->dtype != ST_DT_BF16 && o->dtype != ST_DT_F32)
        return ST_FAIL(ST_ERR_INVALID_ARG, "ckpt init: dtype must be bf16 or f32 (got %s)", st_dtype_name(o->dtype));
    if (!(o->skew_router >= 0) || o->skew_router > 1000)
        return ST_FAIL(ST_ERR_INVALID_ARG, "ckpt init: skew_router must be in [0, 1000]");
    if ((s = st_config_preset(&c, o->preset))) return s;
    /* NOTE: opts decide the expert format; the CLI applies k3-mini's MXFP4 default */
    c.experts_mxfp4 = o->mxfp4_experts;
    if (c.experts_mxfp4 && (st_config_expert_width(&c) % 32 || c.moe_inter % 32))
        return ST_FAIL(ST_ERR_INVALID_ARG, "ckpt init: preset '%s' expert widths are not multiples of 32", o->preset);
    if (mkdir(o->out_dir, 0755) != 0 && errno != EEXIST)
        return ST_FAIL(ST_ERR_IO, "ckpt init: cannot create %s: %s", o->out_dir, strerror(errno));

    int n_shards = c.n_layers + 1;
    int64_t maxc = ST_MAX((int64_t)c.d, (int64_t)c.vocab);
    maxc = ST_MAX(maxc, (int64_t)c.intermediate);
    maxc = ST_MAX(maxc, (int64_t)c.n_shared * c.moe_inter);
    maxc = ST_MAX(maxc, (int64_t)c.kda_heads * c.kda_head_dim);
    maxc = ST_MAX(maxc, (int64_t)c.mla_heads * (c.qk_nope + c.v_head_dim));
    maxc = ST_MAX(maxc, (int64_t)c.n_experts + 128);
    maxc = ST_MAX(maxc, (int64_t)c.kda_heads + 128);
    /* NOTE: the JSON objects are created before any thread starts (jansson seeds its hash once) */
    json_t *index = json_object(), *wm = json_object(), *meta = json_object();
    shards_t S = {.c = &c, .o = o, .maxc = maxc, .n_shards = n_shards, .mu = PTHREAD_MUTEX_INITIALIZER};
    char *cfg_text = NULL, *idx_text = NULL;
    float *u = NULL;
    S.lists = calloc((size_t)n_shards, sizeof *S.lists);
    S.payload = calloc((size_t)n_shards, sizeof *S.payload);
    if (!index || !wm || !meta || !S.lists || !S.payload) {
        s = ST_FAIL(ST_ERR_NO_MEMORY, "ckpt init: buffers");
        goto err_mem;
    }
    if (o->skew_router > 0 && c.n_experts > 0) {
        u = malloc((size_t)c.d * sizeof(float));
        if (!u) {
            s = ST_FAIL(ST_ERR_NO_MEMORY, "ckpt init: buffers");
            goto err_mem;
        }
        nrng_t r;
        nrng_seed(&r, o->seed, "router-skew-direction");
        double nn = 0;
        for (int i = 0; i < c.d; i++) u[i] = nrng_normal(&r), nn += (double)u[i] * u[i];
        for (int i = 0; i < c.d; i++) u[i] = (float)(u[i] / sqrt(nn));
    }
    S.u = u;

    cfg_text = config_text(&c, o->dtype);
    if (!cfg_text) {
        s = ST_FAIL(ST_ERR_NO_MEMORY, "ckpt init: config text");
        goto err_mem;
    }
    if ((s = write_text(o->out_dir, "config.json", cfg_text))) goto err_mem;

    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int n_thr = (int)ST_MIN((long)n_shards, ST_MIN(cores > 0 ? cores : 1, 16L)), started = 0;
    pthread_t th[16];
    for (int i = 1; i < n_thr; i++)
        if (pthread_create(&th[started], NULL, shard_writer, &S) == 0) started++;
    shard_writer(&S); /* this thread writes too; the shard queue finishes even if no thread started */
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    if ((s = S.status)) goto err_mem;

    uint64_t total = 0;
    for (int sh = 0; sh < n_shards; sh++) {
        char fname[64];
        shard_name(fname, sizeof fname, sh, n_shards);
        total += S.payload[sh];
        for (size_t i = 0; i < S.lists[sh].n; i++) json_object_set_new(wm, S.lists[sh].v[i].name, json_string(fname));
    }
    json_object_set_new(meta, "total_size", json_integer((json_int_t)total));
    json_object_set_new(index, "metadata", meta);
    meta = NULL;
    json_object_set_new(index, "weight_map", wm);
    wm = NULL;
    idx_text = json_dumps(index, JSON_INDENT(2));
    if (!idx_text) {
        s = ST_FAIL(ST_ERR_NO_MEMORY, "ckpt init: index text");
        goto err_mem;
    }
    if ((s = write_text(o->out_dir, "model.safetensors.index.json", idx_text))) goto err_mem;
    st_log_info("ckpt init: wrote preset '%s' (%d shards, %llu payload bytes, %d threads) to %s", o->preset, n_shards,
                (unsigned long long)total, started + 1, o->out_dir);
    s = ST_OK;

err_mem:
    free(idx_text);
    free(cfg_text);
    for (int sh = 0; S.lists && sh < n_shards; sh++) free(S.lists[sh].v);
    free(S.lists);
    free(S.payload);
    json_decref(meta);
    json_decref(wm);
    json_decref(index);
    free(u);
    return s;
}
