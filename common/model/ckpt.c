/* Checkpoint directory: config.json + model.safetensors.index.json (or one model.safetensors),
 * every shard mmapped and validated, one hash table of names (`language_model.` stripped), and
 * shape-checked views. Reads only; the writer is ckpt_init.c. */
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "model_impl.h"

#define K3_PREFIX "language_model."

typedef struct {
    const char *key;        /* stripped name, points into a file entry's name */
    const st_tensor_t *t;
    uint32_t file;
} slot_t;

struct st_ckpt {
    char *dir;
    st_config_t cfg;
    st_st_file_t *files;
    size_t n_files;
    slot_t *tab; /* open addressing, cap a power of two, load <= 1/2 */
    size_t cap, n;
};

static const char *strip(const char *name) {
    return strncmp(name, K3_PREFIX, sizeof K3_PREFIX - 1) == 0 ? name + sizeof K3_PREFIX - 1 : name;
}

static uint64_t hash_str(const char *s) { /* FNV-1a */
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

static const slot_t *tab_find(const st_ckpt_t *ck, const char *key) {
    if (!ck->cap) return NULL;
    size_t m = ck->cap - 1;
    for (size_t i = hash_str(key) & m;; i = (i + 1) & m) {
        if (!ck->tab[i].key) return NULL;
        if (strcmp(ck->tab[i].key, key) == 0) return &ck->tab[i];
    }
}

static st_status_t tab_build(st_ckpt_t *ck) {
    size_t total = 0;
    for (size_t f = 0; f < ck->n_files; f++) total += ck->files[f].n;
    size_t cap = 16;
    while (cap < 2 * total) cap <<= 1;
    ck->tab = calloc(cap, sizeof *ck->tab);
    if (!ck->tab) return ST_FAIL(ST_ERR_NO_MEMORY, "%s: name table for %zu tensors", ck->dir, total);
    ck->cap = cap;
    for (size_t f = 0; f < ck->n_files; f++)
        for (size_t i = 0; i < ck->files[f].n; i++) {
            const st_st_entry_t *en = &ck->files[f].ents[i];
            const char *key = strip(en->name);
            size_t j = hash_str(key) & (cap - 1);
            for (; ck->tab[j].key; j = (j + 1) & (cap - 1))
                if (strcmp(ck->tab[j].key, key) == 0)
                    return ST_FAIL(ST_ERR_CHECKPOINT, "%s: tensor '%s' is stored twice (%s and %s)", ck->dir,
                                   en->name, ck->files[ck->tab[j].file].path, ck->files[f].path);
            ck->tab[j] = (slot_t){key, &en->t, (uint32_t)f};
            ck->n++;
        }
    return ST_OK;
}

static char *path_join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static bool file_exists(const char *path) {
    struct stat s;
    return stat(path, &s) == 0;
}

static st_status_t add_file(st_ckpt_t *ck, const char *name) {
    char *path = path_join(ck->dir, name);
    if (!path) return ST_FAIL(ST_ERR_NO_MEMORY, "path");
    st_status_t s;
    if (!file_exists(path)) {
        s = ST_FAIL(ST_ERR_CHECKPOINT, "%s: shard '%s' is named by the index but missing", ck->dir, name);
        free(path);
        return s;
    }
    s = st_st_open(&ck->files[ck->n_files], path);
    free(path);
    if (s) return s;
    ck->n_files++;
    return ST_OK;
}

void st_st_index_free(st_st_index_t *ix) {
    if (!ix) return;
    for (size_t i = 0; i < ix->n_shards; i++) free(ix->shards[i]);
    for (size_t i = 0; i < ix->n_tensors; i++) free(ix->tensors[i]);
    free(ix->shards);
    free(ix->tensors);
    free(ix->shard_of);
    memset(ix, 0, sizeof *ix);
}

st_status_t st_st_index_parse(st_st_index_t *out, const char *path, const char *text, size_t len) {
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) return ST_FAIL(ST_ERR_CHECKPOINT, "%s: invalid JSON (line %d: %s)", path, jerr.line, jerr.text);
    st_status_t s = ST_OK;
    st_st_index_t ix;
    memset(&ix, 0, sizeof ix);
    json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(wm)) {
        s = ST_FAIL(ST_ERR_CHECKPOINT, "%s: key 'weight_map' missing or not an object", path);
        goto err;
    }
    size_t nt = json_object_size(wm);
    if (nt == 0) {
        s = ST_FAIL(ST_ERR_CHECKPOINT, "%s: weight_map is empty", path);
        goto err;
    }
    ix.tensors = calloc(nt, sizeof *ix.tensors);
    ix.shard_of = calloc(nt, sizeof *ix.shard_of);
    if (!ix.tensors || !ix.shard_of) {
        s = ST_FAIL(ST_ERR_NO_MEMORY, "%s: %zu index entries", path, nt);
        goto err;
    }
    const char *tname;
    json_t *v;
    size_t last = 0;
    json_object_foreach(wm, tname, v) {
        if (!json_is_string(v)) {
            s = ST_FAIL(ST_ERR_CHECKPOINT, "%s: weight_map['%s'] is not a file name", path, tname);
            goto err;
        }
        const char *fn = json_string_value(v);
        if (!*fn || strchr(fn, '/') || strcmp(fn, ".") == 0 || strcmp(fn, "..") == 0) {
            s = ST_FAIL(ST_ERR_CHECKPOINT, "%s: weight_map['%s'] = '%s' is not a plain file name", path, tname, fn);
            goto err;
        }
        size_t i = last;
        if (!ix.n_shards || strcmp(ix.shards[last], fn) != 0) {
            for (i = 0; i < ix.n_shards; i++)
                if (strcmp(ix.shards[i], fn) == 0) break;
            if (i == ix.n_shards) {
                char **nn = realloc(ix.shards, (ix.n_shards + 1) * sizeof *nn);
                if (!nn) {
                    s = ST_FAIL(ST_ERR_NO_MEMORY, "%s: shard list", path);
                    goto err;
                }
                ix.shards = nn;
                if (!(ix.shards[ix.n_shards] = strdup(fn))) {
                    s = ST_FAIL(ST_ERR_NO_MEMORY, "%s: shard list", path);
                    goto err;
                }
                ix.n_shards++;
            }
        }
        last = i;
        if (!(ix.tensors[ix.n_tensors] = strdup(tname))) {
            s = ST_FAIL(ST_ERR_NO_MEMORY, "%s: tensor names", path);
            goto err;
        }
        ix.shard_of[ix.n_tensors++] = (uint32_t)i;
    }
    json_decref(root);
    *out = ix;
    return ST_OK;

err:
    st_st_index_free(&ix);
    json_decref(root);
    return s;
}

/* Index: open every shard it names, then check each named tensor is in its shard. */
static st_status_t load_index(st_ckpt_t *ck, const char *index_path) {
    char *text = NULL;
    size_t len = 0;
    st_status_t s = st_model_read_file(index_path, ST_MODEL_MAX_JSON, ST_ERR_CHECKPOINT, &text, &len);
    if (s) return s;
    st_st_index_t ix;
    s = st_st_index_parse(&ix, index_path, text, len);
    free(text);
    if (s) return s;
    ck->files = calloc(ix.n_shards, sizeof *ck->files);
    if (!ck->files) {
        s = ST_FAIL(ST_ERR_NO_MEMORY, "%s: %zu shards", index_path, ix.n_shards);
        goto out;
    }
    for (size_t i = 0; i < ix.n_shards; i++)
        if ((s = add_file(ck, ix.shards[i]))) goto out;
    if ((s = tab_build(ck))) goto out;
    for (size_t i = 0; i < ix.n_tensors; i++) {
        const slot_t *sl = tab_find(ck, strip(ix.tensors[i]));
        const char *fn = ix.shards[ix.shard_of[i]];
        const char *got = sl ? strrchr(ck->files[sl->file].path, '/') + 1 : NULL;
        if (!sl || strcmp(got, fn) != 0) {
            s = ST_FAIL(ST_ERR_CHECKPOINT, "%s: tensor '%s' is named by the index in shard '%s' but %s%s", ck->dir,
                        ix.tensors[i], fn, sl ? "found in " : "no shard holds it", sl ? got : "");
            goto out;
        }
    }
out:
    st_st_index_free(&ix);
    return s;
}

void st_ckpt_close(st_ckpt_t *ck) {
    if (!ck) return;
    free(ck->tab);
    for (size_t i = 0; i < ck->n_files; i++) st_st_close(&ck->files[i]);
    free(ck->files);
    free(ck->dir);
    free(ck);
}

static st_status_t fill_ranks(st_ckpt_t *ck) {
    st_config_t *c = &ck->cfg;
    for (int l = 0; l < c->n_layers; l++) {
        if (c->is_mla[l]) continue;
        char name[128];
        const st_tensor_t *t;
        snprintf(name, sizeof name, "model.layers.%d.self_attn.f_a_proj.weight", l);
        t = st_ckpt_find(ck, name);
        if (!t) return ST_FAIL(ST_ERR_CHECKPOINT, "%s: tensor '%s' is missing", ck->dir, name);
        if (t->ndim != 2 || t->shape[1] != c->d || t->shape[0] <= 0 || t->shape[0] > INT_MAX)
            return ST_FAIL(ST_ERR_CHECKPOINT, "%s: tensor '%s' has %d dims / %lld cols, expected [rank, %d]", ck->dir,
                           name, t->ndim, (long long)(t->ndim == 2 ? t->shape[1] : -1), c->d);
        c->f_rank = (int)t->shape[0];
        if (!c->full_rank_gate) {
            snprintf(name, sizeof name, "model.layers.%d.self_attn.g_a_proj.weight", l);
            t = st_ckpt_find(ck, name);
            if (!t) return ST_FAIL(ST_ERR_CHECKPOINT, "%s: tensor '%s' is missing", ck->dir, name);
            if (t->ndim != 2 || t->shape[1] != c->d || t->shape[0] <= 0 || t->shape[0] > INT_MAX)
                return ST_FAIL(ST_ERR_CHECKPOINT, "%s: tensor '%s' is not [rank, %d]", ck->dir, name, c->d);
            c->g_rank = (int)t->shape[0];
        }
        break;
    }
    return ST_OK;
}

st_status_t st_ckpt_open(st_ckpt_t **out, const char *dir) {
    st_status_t s;
    st_ckpt_t *ck = calloc(1, sizeof *ck);
    if (!ck) return ST_FAIL(ST_ERR_NO_MEMORY, "checkpoint");
    ck->dir = strdup(dir);
    char *cfg_path = path_join(dir, "config.json"), *idx_path = path_join(dir, "model.safetensors.index.json");
    if (!ck->dir || !cfg_path || !idx_path) {
        s = ST_FAIL(ST_ERR_NO_MEMORY, "checkpoint paths");
        goto err_ck;
    }
    if ((s = st_config_load(&ck->cfg, cfg_path))) goto err_ck;
    if (file_exists(idx_path)) {
        if ((s = load_index(ck, idx_path))) goto err_ck;
    } else {
        char *single = path_join(dir, "model.safetensors");
        if (!single) {
            s = ST_FAIL(ST_ERR_NO_MEMORY, "checkpoint paths");
            goto err_ck;
        }
        bool ok = file_exists(single);
        free(single);
        if (!ok) {
            s = ST_FAIL(ST_ERR_CHECKPOINT, "%s: neither model.safetensors.index.json nor model.safetensors exists",
                        dir);
            goto err_ck;
        }
        ck->files = calloc(1, sizeof *ck->files);
        if (!ck->files) {
            s = ST_FAIL(ST_ERR_NO_MEMORY, "checkpoint");
            goto err_ck;
        }
        if ((s = add_file(ck, "model.safetensors"))) goto err_ck;
        if ((s = tab_build(ck))) goto err_ck;
    }
    if ((s = fill_ranks(ck))) goto err_ck;
    free(cfg_path);
    free(idx_path);
    *out = ck;
    return ST_OK;

err_ck:
    free(cfg_path);
    free(idx_path);
    st_ckpt_close(ck);
    return s;
}

const st_config_t *st_ckpt_config(const st_ckpt_t *ck) { return &ck->cfg; }
const char *st_ckpt_dir(const st_ckpt_t *ck) { return ck->dir; }

const st_tensor_t *st_ckpt_find(const st_ckpt_t *ck, const char *name) {
    const slot_t *s = tab_find(ck, strip(name));
    return s ? s->t : NULL;
}

static void shape_str(char *buf, size_t n, int ndim, const int64_t *shape) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, n - o, "[");
    for (int i = 0; i < ndim && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
}

static st_status_t shape_err(const st_ckpt_t *ck, const char *name, const st_tensor_t *t, int ndim,
                             const int64_t *want) {
    char a[96], b[96];
    shape_str(a, sizeof a, t->ndim, t->shape);
    shape_str(b, sizeof b, ndim, want);
    return ST_FAIL(ST_ERR_CHECKPOINT, "%s: tensor '%s' has shape %s, expected %s", ck->dir, name, a, b);
}

static bool shape_eq(const st_tensor_t *t, int ndim, const int64_t *shape) {
    if (t->ndim != ndim) return false;
    for (int i = 0; i < ndim; i++)
        if (t->shape[i] != shape[i]) return false;
    return true;
}

st_status_t st_ckpt_get(const st_ckpt_t *ck, const char *name, int ndim, const int64_t *shape,
                        const st_tensor_t **out) {
    const st_tensor_t *t = st_ckpt_find(ck, name);
    if (!t) return ST_FAIL(ST_ERR_CHECKPOINT, "%s: tensor '%s' is missing", ck->dir, name);
    if (!shape_eq(t, ndim, shape)) return shape_err(ck, name, t, ndim, shape);
    *out = t;
    return ST_OK;
}

st_status_t st_ckpt_weight(const st_ckpt_t *ck, const char *stem, int rows, int cols, st_weight_t *out) {
    char name[512];
    if (rows <= 0 || cols <= 0) return ST_FAIL(ST_ERR_INVALID_ARG, "weight '%s': bad shape [%d, %d]", stem, rows, cols);
    snprintf(name, sizeof name, "%s.weight_packed", stem);
    const st_tensor_t *pk = st_ckpt_find(ck, name);
    if (pk) {
        if (cols % 32 != 0)
            return ST_FAIL(ST_ERR_CHECKPOINT, "%s: tensor '%s' is MXFP4 but cols %d is not a multiple of 32", ck->dir,
                           name, cols);
        int64_t want_p[2] = {rows, cols / 2}, want_s[2] = {rows, cols / 32};
        if (pk->dtype != ST_DT_U8)
            return ST_FAIL(ST_ERR_CHECKPOINT, "%s: tensor '%s' is %s, expected U8", ck->dir, name,
                           st_dtype_name(pk->dtype));
        if (!shape_eq(pk, 2, want_p)) return shape_err(ck, name, pk, 2, want_p);
        snprintf(name, sizeof name, "%s.weight_scale", stem);
        const st_tensor_t *sc = st_ckpt_find(ck, name);
        if (!sc) return ST_FAIL(ST_ERR_CHECKPOINT, "%s: tensor '%s' is missing (MXFP4 scales)", ck->dir, name);
        if (sc->dtype != ST_DT_U8)
            return ST_FAIL(ST_ERR_CHECKPOINT, "%s: tensor '%s' is %s, expected U8", ck->dir, name,
                           st_dtype_name(sc->dtype));
        if (!shape_eq(sc, 2, want_s)) return shape_err(ck, name, sc, 2, want_s);
        *out = (st_weight_t){ST_DT_MXFP4, rows, cols, pk->data, sc->data};
        return ST_OK;
    }
    snprintf(name, sizeof name, "%s.weight", stem);
    const st_tensor_t *t = st_ckpt_find(ck, name);
    if (!t) return ST_FAIL(ST_ERR_CHECKPOINT, "%s: tensor '%s' is missing", ck->dir, name);
    int64_t want[2] = {rows, cols};
    if (!shape_eq(t, 2, want)) return shape_err(ck, name, t, 2, want);
    if (t->dtype != ST_DT_F32 && t->dtype != ST_DT_BF16 && t->dtype != ST_DT_F16)
        return ST_FAIL(ST_ERR_CHECKPOINT, "%s: tensor '%s' has dtype %s, expected F32, BF16 or F16", ck->dir, name,
                       st_dtype_name(t->dtype));
    *out = (st_weight_t){t->dtype, rows, cols, t->data, NULL};
    return ST_OK;
}

static float load_f32(const st_tensor_t *t, size_t i) {
    /* NOTE: memcpy, since a payload offset need not be aligned for the element type */
    const uint8_t *p = (const uint8_t *)t->data;
    if (t->dtype == ST_DT_F32) {
        float f;
        memcpy(&f, p + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    return t->dtype == ST_DT_BF16 ? st_bf16_to_f32(h) : st_f16_to_f32(h);
}

st_status_t st_ckpt_vec_f32(const st_ckpt_t *ck, const char *name, int n, bool allow_pad, float *dst) {
    const st_tensor_t *t = st_ckpt_find(ck, name);
    if (!t) return ST_FAIL(ST_ERR_CHECKPOINT, "%s: tensor '%s' is missing", ck->dir, name);
    if (t->dtype != ST_DT_F32 && t->dtype != ST_DT_BF16 && t->dtype != ST_DT_F16)
        return ST_FAIL(ST_ERR_CHECKPOINT, "%s: tensor '%s' has dtype %s, expected F32, BF16 or F16", ck->dir, name,
                       st_dtype_name(t->dtype));
    int64_t numel = 1;
    int non1 = 0;
    for (int i = 0; i < t->ndim; i++) {
        numel *= t->shape[i];
        non1 += t->shape[i] != 1;
    }
    int64_t want[1] = {n};
    if (non1 > 1 || numel < n || (numel != n && !allow_pad)) return shape_err(ck, name, t, 1, want);
    for (int64_t i = n; i < numel; i++)
        if (load_f32(t, (size_t)i) != 0.0f)
            return ST_FAIL(ST_ERR_CHECKPOINT, "%s: tensor '%s' padding entry %lld (after the first %d) is %g, not 0",
                           ck->dir, name, (long long)i, n, (double)load_f32(t, (size_t)i));
    for (int i = 0; i < n; i++) dst[i] = load_f32(t, (size_t)i);
    return ST_OK;
}

static bool has_suffix(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

st_status_t st_ckpt_sizes(const st_ckpt_t *ck, st_ckpt_sizes_t *out) {
    const st_config_t *c = &ck->cfg;
    int64_t p_trunk = 0, p_routed = 0, b_trunk = 0, b_routed = 0;
    for (size_t i = 0; i < ck->cap; i++) {
        const slot_t *sl = &ck->tab[i];
        if (!sl->key) continue;
        /* the multimodal towers are not part of the text model */
        if (strncmp(sl->key, "vision_tower.", 13) == 0 || strncmp(sl->key, "mm_projector.", 13) == 0) continue;
        int64_t numel = 1;
        for (int d = 0; d < sl->t->ndim; d++) numel *= sl->t->shape[d];
        int64_t params = numel;
        if (sl->t->dtype == ST_DT_U8 && has_suffix(sl->key, ".weight_packed")) params = 2 * numel;
        if (sl->t->dtype == ST_DT_U8 && has_suffix(sl->key, ".weight_scale")) params = 0;
        if (strstr(sl->key, ".experts.")) {
            p_routed += params;
            b_routed += (int64_t)sl->t->nbytes;
        } else {
            p_trunk += params;
            b_trunk += (int64_t)sl->t->nbytes;
        }
    }
    int n_moe = 0;
    for (int l = 0; l < c->n_layers; l++) n_moe += st_config_is_moe_layer(c, l);
    int64_t n_exp = (int64_t)n_moe * c->n_experts;
    st_ckpt_sizes_t z;
    z.params_total = p_trunk + p_routed;
    /* every routed expert has the same shapes, so k of n per MoE layer is k/n of the routed total */
    z.params_active = p_trunk + (n_exp ? p_routed / n_exp * n_moe * c->top_k : 0);
    z.bytes_attention_worker = b_trunk;
    z.bytes_routed_experts = b_routed;
    z.bytes_per_expert_layer = n_exp ? b_routed / n_exp : 0;
    *out = z;
    return ST_OK;
}
