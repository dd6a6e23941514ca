/* The checkpoint's tokenizer: loading tiktoken.model + tokenizer_config.json (+ config.json,
 * generation_config.json) from a folder, the byte tokenizer for checkpoints that ship none,
 * decoding and UTF-8-safe streaming. Splitting and BPE live in tiktoken.c. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "model_impl.h"
#include "tokenizer_impl.h"

/* ---- the byte tokenizer of the presets (legacy entry points) ---- */

int st_tok_encode(const char *text, int *ids, int max_ids) {
    int n = 0;
    if (!text) return 0;
    for (const unsigned char *p = (const unsigned char *)text; *p && n < max_ids; p++) ids[n++] = *p;
    return n;
}

int st_tok_decode(const int *ids, int n, char *out, int max_out) {
    int o = 0;
    for (int i = 0; i < n && o < max_out; i++)
        if (ids[i] >= 0 && ids[i] < 256) out[o++] = (char)ids[i];
    return o;
}

/* ---- id lists ---- */

st_status_t st_tok_ids_reserve(st_tok_ids_t *v, size_t extra) {
    if (v->n + extra <= v->cap) return ST_OK;
    size_t cap = v->cap ? v->cap : 64;
    while (cap < v->n + extra) {
        if (cap > SIZE_MAX / 4 / sizeof *v->ids) return ST_FAIL(ST_ERR_NO_MEMORY, "tokenizer: id list too long");
        cap *= 2;
    }
    int32_t *ids = realloc(v->ids, cap * sizeof *ids);
    if (!ids) return ST_FAIL(ST_ERR_NO_MEMORY, "tokenizer: no memory for %zu ids", cap);
    v->ids = ids;
    v->cap = cap;
    return ST_OK;
}

void st_tok_ids_free(st_tok_ids_t *v) {
    free(v->ids);
    v->ids = NULL;
    v->n = v->cap = 0;
}

/* ---- UTF-8: maximal ill-formed subsequences (Unicode §3.9, as Python's errors="replace") ---- */

/* At s[i]: > 0 the length of a valid character; < 0 minus the length of an ill-formed subsequence
 * (one U+FFFD); 0 a valid but unfinished prefix that reaches the end of s (its length in *pre). */
static int utf8_seq(const uint8_t *s, size_t n, size_t i, int *pre) {
    uint8_t b = s[i];
    if (b < 0x80) return 1;
    int need;
    uint8_t lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) need = 1;
    else if (b == 0xE0) need = 2, lo = 0xA0;
    else if (b == 0xED) need = 2, hi = 0x9F;
    else if (b >= 0xE1 && b <= 0xEF) need = 2;
    else if (b == 0xF0) need = 3, lo = 0x90;
    else if (b == 0xF4) need = 3, hi = 0x8F;
    else if (b >= 0xF1 && b <= 0xF3) need = 3;
    else return -1;
    int k = 1;
    for (int t = 0; t < need; t++, k++) {
        if (i + (size_t)k >= n) {
            *pre = k;
            return 0;
        }
        uint8_t c = s[i + (size_t)k];
        if (c < (t ? 0x80 : lo) || c > (t ? 0xBF : hi)) return -k;
    }
    return k;
}

static const char REPL[3] = {(char)0xEF, (char)0xBF, (char)0xBD}; /* U+FFFD */

/* Repair s[0, n) into out (capacity 3n): returns the bytes written. With keep_tail, a valid but
 * unfinished last character is left out and its length stored in *tail. */
static size_t utf8_repair(const uint8_t *s, size_t n, char *out, bool keep_tail, int *tail) {
    size_t o = 0;
    if (tail) *tail = 0;
    for (size_t i = 0; i < n;) {
        if (s[i] < 0x80) {
            out[o++] = (char)s[i++];
            continue;
        }
        int pre = 0, l = utf8_seq(s, n, i, &pre);
        if (l > 0) {
            memmove(out + o, s + i, (size_t)l); /* may overlap s (streams repair in place) */
            o += (size_t)l;
            i += (size_t)l;
        } else if (l == 0 && keep_tail) {
            *tail = pre;
            break;
        } else {
            memcpy(out + o, REPL, 3);
            o += 3;
            i += (size_t)(l ? -l : pre);
        }
    }
    return o;
}

static bool utf8_valid(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        /* NOTE: eight ASCII bytes at a time; most prompts are mostly ASCII */
        if (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (!(w & 0x8080808080808080ull)) {
                i += 8;
                continue;
            }
        }
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        int pre, l = utf8_seq(s, n, i, &pre);
        if (l <= 0) return false;
        i += (size_t)l;
    }
    return true;
}

/* ---- loading ---- */

#define TOK_MAX_RANKS_FILE (512u * 1024u * 1024u)
#define TOK_MAX_SPECIALS 65536 /* ids past the ranks that tokenizer_config.json may name */
#define TOK_RESERVED 258       /* tokenization_kimi.py: num_reserved_special_tokens + 2 */

static st_status_t read_json(const char *path, json_t **out) {
    char *text = NULL;
    size_t len = 0;
    st_status_t s = st_model_read_file(path, ST_MODEL_MAX_JSON, ST_ERR_CONFIG, &text, &len);
    if (s) return s;
    json_error_t e;
    json_t *j = json_loadb(text, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &e);
    free(text);
    if (!j) return ST_FAIL(ST_ERR_PARSE, "%s:%d: %s", path, e.line, e.text);
    if (!json_is_object(j)) {
        json_decref(j);
        return ST_FAIL(ST_ERR_PARSE, "%s: not a JSON object", path);
    }
    *out = j;
    return ST_OK;
}

static bool file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* An integer id key: absent/null → *present false. */
static st_status_t json_id(json_t *v, const char *path, const char *key, int64_t *id, bool *present) {
    *present = false;
    if (!v || json_is_null(v)) return ST_OK;
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
        return ST_FAIL(ST_ERR_CONFIG, "%s: '%s' must be a non-negative integer id", path, key);
    *id = json_integer_value(v);
    *present = true;
    return ST_OK;
}

static st_status_t add_eos(st_tokenizer_t *tk, int64_t id, const char *path, const char *key) {
    if (id >= tk->n_embed)
        return ST_FAIL(ST_ERR_CONFIG, "%s: %s %lld has no embedding row (vocabulary of %d)", path, key, (long long)id,
                       tk->n_embed);
    for (int i = 0; i < tk->n_eos; i++)
        if (tk->eos[i] == id) return ST_OK;
    if (tk->n_eos == ST_TOK_MAX_EOS) return ST_FAIL(ST_ERR_CONFIG, "%s: more than %d eos ids", path, ST_TOK_MAX_EOS);
    tk->eos[tk->n_eos++] = (int32_t)id;
    return ST_OK;
}

/* eos_token_id: an integer or a list of integers */
static st_status_t read_eos_ids(st_tokenizer_t *tk, json_t *obj, const char *path) {
    json_t *v = json_object_get(obj, "eos_token_id");
    if (json_is_array(v)) {
        size_t i;
        json_t *e;
        json_array_foreach(v, i, e) {
            int64_t id;
            bool present;
            st_status_t s = json_id(e, path, "eos_token_id", &id, &present);
            if (s) return s;
            if (present && (s = add_eos(tk, id, path, "eos_token_id"))) return s;
        }
        return ST_OK;
    }
    int64_t id;
    bool present;
    st_status_t s = json_id(v, path, "eos_token_id", &id, &present);
    if (s) return s;
    return present ? add_eos(tk, id, path, "eos_token_id") : ST_OK;
}

static st_status_t read_single_id(json_t *obj, const char *path, const char *key, int32_t limit, int32_t *out) {
    int64_t id;
    bool present;
    st_status_t s = json_id(json_object_get(obj, key), path, key, &id, &present);
    if (s || !present) return s;
    if (id >= limit)
        return ST_FAIL(ST_ERR_CONFIG, "%s: %s %lld has no embedding row (vocabulary of %d)", path, key, (long long)id,
                       limit);
    if (*out < 0) *out = (int32_t)id;
    return ST_OK;
}

/* config.json: vocab_size (nested text_config first, as in K3), then the ids. */
static st_status_t read_config_vocab(const char *path, json_t *cfg, int64_t *vocab) {
    json_t *tc = json_object_get(cfg, "text_config");
    json_t *v = json_is_object(tc) && json_object_get(tc, "vocab_size") ? json_object_get(tc, "vocab_size")
                                                                          : json_object_get(cfg, "vocab_size");
    *vocab = -1;
    if (!v) return ST_OK;
    if (!json_is_integer(v) || json_integer_value(v) <= 0 || json_integer_value(v) > INT32_MAX)
        return ST_FAIL(ST_ERR_CONFIG, "%s: 'vocab_size' must be a positive integer", path);
    *vocab = json_integer_value(v);
    return ST_OK;
}

static st_status_t read_config_ids(st_tokenizer_t *tk, const char *path, json_t *cfg) {
    json_t *tc = json_object_get(cfg, "text_config");
    json_t *objs[2] = {cfg, json_is_object(tc) ? tc : NULL};
    st_status_t s;
    for (int k = 0; k < 2; k++) {
        if (!objs[k]) continue;
        if ((s = read_single_id(objs[k], path, "bos_token_id", tk->n_embed, &tk->bos))) return s;
        if ((s = read_single_id(objs[k], path, "pad_token_id", tk->n_embed, &tk->pad))) return s;
        if ((s = read_eos_ids(tk, objs[k], path))) return s;
    }
    return ST_OK;
}

/* "bos_token": "[BOS]" or {"content": "[BOS]", ...} → the id of that text, -1 if it names none */
static const char *token_text(json_t *v, size_t *len) {
    if (json_is_object(v)) v = json_object_get(v, "content");
    if (!json_is_string(v)) return NULL;
    *len = json_string_length(v);
    return json_string_value(v);
}

static int32_t id_of_text(const st_tokenizer_t *tk, const char *t, size_t len) {
    for (uint32_t i = tk->n_sp; i-- > 0;) /* the later id wins, as in the reference's dict */
        if (tk->sp[i].len == len && !memcmp(tk->sp[i].text, t, len)) return tk->sp[i].id;
    if (tk->kind == ST_TOKENIZER_TIKTOKEN && len) return st_tt_rank(tk, (const uint8_t *)t, len);
    return -1;
}

static st_status_t read_tokenizer_config(st_tokenizer_t *tk, const char *path, json_t *tc, json_t **decoder) {
    json_t *d = json_object_get(tc, "added_tokens_decoder");
    *decoder = NULL;
    if (!d || json_is_null(d)) return ST_OK;
    if (!json_is_object(d)) return ST_FAIL(ST_ERR_CONFIG, "%s: 'added_tokens_decoder' must be an object", path);
    const char *key;
    json_t *v;
    json_object_foreach(d, key, v) {
        char *end;
        errno = 0;
        long long id = strtoll(key, &end, 10);
        if (!*key || *end || errno || id < 0)
            return ST_FAIL(ST_ERR_CONFIG, "%s: added_tokens_decoder key '%s' is not an id", path, key);
        size_t len;
        if (!json_is_object(v) || !token_text(v, &len))
            return ST_FAIL(ST_ERR_CONFIG, "%s: added_tokens_decoder[%s] needs a string 'content'", path, key);
        json_t *sp = json_object_get(v, "special");
        if (sp && !json_is_boolean(sp))
            return ST_FAIL(ST_ERR_CONFIG, "%s: added_tokens_decoder[%s].special must be true or false", path, key);
        if (id >= (long long)tk->n_ranks + TOK_MAX_SPECIALS)
            return ST_FAIL(ST_ERR_CONFIG, "%s: added token id %lld is far past the %u ranks", path, id, tk->n_ranks);
    }
    *decoder = d;
    return ST_OK;
}

/* Specials: ids n_ranks .. n_ranks + 257 as tokenization_kimi.py, plus any later id the config
 * names; unnamed ones are "<|reserved_token_ID|>". */
static st_status_t build_specials(st_tokenizer_t *tk, const char *path, json_t *decoder) {
    int64_t last = (int64_t)tk->n_ranks + TOK_RESERVED - 1;
    const char *key;
    json_t *v;
    if (decoder) json_object_foreach(decoder, key, v) {
            long long id = strtoll(key, NULL, 10);
            if (id > last) last = id;
        }
    tk->n_sp = (uint32_t)(last + 1 - tk->n_ranks);
    tk->sp = calloc(tk->n_sp, sizeof *tk->sp);
    tk->sp_of_id = malloc(tk->n_sp * sizeof *tk->sp_of_id);
    if (!tk->sp || !tk->sp_of_id) return ST_FAIL(ST_ERR_NO_MEMORY, "tokenizer: no memory");
    for (uint32_t i = 0; i < tk->n_sp; i++) {
        int32_t id = (int32_t)(tk->n_ranks + i);
        char idk[24];
        snprintf(idk, sizeof idk, "%d", id);
        json_t *e = decoder ? json_object_get(decoder, idk) : NULL;
        st_tok_special_t *sp = &tk->sp[i];
        sp->id = id;
        tk->sp_of_id[i] = (int32_t)i;
        if (e) {
            size_t len;
            const char *t = token_text(e, &len);
            json_t *spf = json_object_get(e, "special");
            sp->special = !spf || json_is_true(spf);
            sp->text = malloc(len + 1);
            if (!sp->text) return ST_FAIL(ST_ERR_NO_MEMORY, "tokenizer: no memory");
            memcpy(sp->text, t, len);
            sp->text[len] = 0;
            sp->len = (uint32_t)len;
        } else {
            char buf[48];
            int len = snprintf(buf, sizeof buf, "<|reserved_token_%d|>", id);
            sp->special = true;
            sp->text = strdup(buf);
            if (!sp->text) return ST_FAIL(ST_ERR_NO_MEMORY, "tokenizer: no memory");
            sp->len = (uint32_t)len;
        }
        sp->encodable = id < tk->n_embed && sp->len > 0;
        if (sp->len > tk->max_token_len) tk->max_token_len = sp->len;
    }
    /* the same text twice: the later id wins (the reference builds a dict in id order) */
    for (uint32_t i = 0; i < tk->n_sp; i++)
        for (uint32_t j = i + 1; j < tk->n_sp && tk->sp[i].encodable; j++)
            if (tk->sp[j].encodable && tk->sp[j].len == tk->sp[i].len &&
                !memcmp(tk->sp[j].text, tk->sp[i].text, tk->sp[i].len)) {
                st_log_warn("%s: special text '%s' is given to ids %d and %d; encoding uses %d", path, tk->sp[i].text,
                            tk->sp[i].id, tk->sp[j].id, tk->sp[j].id);
                tk->sp[i].encodable = false;
            }
    return st_tt_index_specials(tk);
}

static st_status_t load_ranks_file(st_tokenizer_t *tk, const char *path) {
    char *text = NULL;
    size_t len = 0;
    st_status_t s = st_model_read_file(path, TOK_MAX_RANKS_FILE, ST_ERR_PARSE, &text, &len);
    if (s) return s;
    s = st_tt_load_ranks(tk, path, text, len);
    free(text);
    return s;
}

st_status_t st_tokenizer_load_files(st_tokenizer_t **out, const char *ranks_path, const char *tokcfg_path,
                                    const char *cfg_path, const char *gen_path, const st_tokenizer_opts_t *opts) {
    st_tokenizer_opts_t o = opts ? *opts : (st_tokenizer_opts_t){0};
    st_tokenizer_t *tk = calloc(1, sizeof *tk);
    if (!tk) return ST_FAIL(ST_ERR_NO_MEMORY, "tokenizer: no memory");
    tk->bos = tk->pad = -1;
    json_t *cfg = NULL, *gen = NULL, *tcfg = NULL, *decoder = NULL;
    st_status_t s = ST_OK;
    int64_t vocab = -1;
    if (cfg_path && (s = read_json(cfg_path, &cfg))) goto err;
    if (cfg && (s = read_config_vocab(cfg_path, cfg, &vocab))) goto err;
    if (gen_path && (s = read_json(gen_path, &gen))) goto err;
    if (ranks_path) {
        tk->kind = ST_TOKENIZER_TIKTOKEN;
        if ((s = load_ranks_file(tk, ranks_path))) goto err;
        if (tokcfg_path && (s = read_json(tokcfg_path, &tcfg))) goto err;
        if (tcfg && (s = read_tokenizer_config(tk, tokcfg_path, tcfg, &decoder))) goto err;
        if (vocab >= 0 && vocab < (int64_t)tk->n_ranks) {
            s = ST_FAIL(ST_ERR_CONFIG, "%s: vocab_size %lld is below the %u tokens of %s", cfg_path, (long long)vocab,
                        tk->n_ranks, ranks_path);
            goto err;
        }
        tk->n_embed = vocab >= 0 ? (int32_t)vocab : INT32_MAX; /* fixed below once specials are known */
        if ((s = build_specials(tk, tokcfg_path ? tokcfg_path : ranks_path, decoder))) goto err;
        tk->n_ids = (int32_t)(tk->n_ranks + tk->n_sp);
        if (vocab < 0) tk->n_embed = tk->n_ids;
        if ((s = st_tt_compile(tk, o.pattern, !o.no_fast_path))) goto err;
    } else {
        tk->kind = ST_TOKENIZER_BYTES;
        tk->n_ids = vocab > 256 ? (int32_t)vocab : 256;
        tk->n_embed = vocab >= 0 ? (int32_t)vocab : tk->n_ids;
        tk->max_token_len = 1;
        if (!(tk->blob = malloc(256))) {
            s = ST_FAIL(ST_ERR_NO_MEMORY, "tokenizer: no memory");
            goto err;
        }
        for (int b = 0; b < 256; b++) tk->blob[b] = (uint8_t)b;
    }
    if (cfg && (s = read_config_ids(tk, cfg_path, cfg))) goto err;
    if (gen) {
        if ((s = read_single_id(gen, gen_path, "bos_token_id", tk->n_embed, &tk->bos))) goto err;
        if ((s = read_single_id(gen, gen_path, "pad_token_id", tk->n_embed, &tk->pad))) goto err;
        if ((s = read_eos_ids(tk, gen, gen_path))) goto err;
    }
    if (tcfg) { /* the tokenizer's own bos/eos/pad names: bos/pad only when the configs gave none */
        static const char *const keys[3] = {"bos_token", "eos_token", "pad_token"};
        for (int k = 0; k < 3; k++) {
            size_t len;
            const char *t = token_text(json_object_get(tcfg, keys[k]), &len);
            if (!t) continue;
            int32_t id = id_of_text(tk, t, len);
            if (id < 0 || id >= tk->n_embed) {
                st_log_warn("%s: %s '%s' is no token with an embedding row; ignored", tokcfg_path, keys[k], t);
                continue;
            }
            if (k == 0 && tk->bos < 0) tk->bos = id;
            if (k == 2 && tk->pad < 0) tk->pad = id;
            if (k == 1 && (s = add_eos(tk, id, tokcfg_path, keys[k]))) goto err;
        }
    }
    if (tk->max_token_len < 1) tk->max_token_len = 1;
    json_decref(cfg);
    json_decref(gen);
    json_decref(tcfg);
    *out = tk;
    return ST_OK;
err:
    json_decref(cfg);
    json_decref(gen);
    json_decref(tcfg);
    st_tokenizer_destroy(tk);
    return s;
}

st_status_t st_tokenizer_load(st_tokenizer_t **out, const char *dir, const st_tokenizer_opts_t *opts) {
    static const char *const names[4] = {"tiktoken.model", "tokenizer_config.json", "config.json",
                                         "generation_config.json"};
    char *p[4] = {0};
    st_status_t s = ST_OK;
    for (int i = 0; i < 4; i++) {
        size_t n = strlen(dir) + strlen(names[i]) + 2;
        char *q = malloc(n);
        if (!q) {
            s = ST_FAIL(ST_ERR_NO_MEMORY, "tokenizer: no memory");
            goto out;
        }
        snprintf(q, n, "%s/%s", dir, names[i]);
        if (file_exists(q)) p[i] = q;
        else free(q);
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        s = ST_FAIL(ST_ERR_IO, "%s: not a folder", dir);
        goto out;
    }
    if (!p[0] && !(opts && opts->quiet))
        st_log_warn("%s has no tiktoken.model: using the byte tokenizer (one id per byte), right for the random "
                    "presets only; a real checkpoint needs its tokenizer files",
                    dir);
    if (p[0] && !p[1]) st_log_warn("%s has no tokenizer_config.json: special tokens are unnamed", dir);
    s = st_tokenizer_load_files(out, p[0], p[1], p[2], p[3], opts);
out:
    for (int i = 0; i < 4; i++) free(p[i]);
    return s;
}

void st_tokenizer_destroy(st_tokenizer_t *tk) {
    if (!tk) return;
    st_tt_free(tk);
    for (uint32_t i = 0; i < tk->n_sp; i++) free(tk->sp[i].text);
    free(tk->sp);
    free(tk->sp_of_id);
    free(tk);
}

/* ---- queries ---- */

st_tokenizer_kind_t st_tokenizer_kind(const st_tokenizer_t *tk) { return tk->kind; }
int32_t st_tokenizer_n_ids(const st_tokenizer_t *tk) { return tk->n_ids < tk->n_embed ? tk->n_ids : tk->n_embed; }
int32_t st_tokenizer_bos(const st_tokenizer_t *tk) { return tk->bos; }
int32_t st_tokenizer_pad(const st_tokenizer_t *tk) { return tk->pad; }
int st_tokenizer_eos(const st_tokenizer_t *tk, const int32_t **ids) {
    *ids = tk->eos;
    return tk->n_eos;
}
bool st_tokenizer_is_eos(const st_tokenizer_t *tk, int32_t id) {
    for (int i = 0; i < tk->n_eos; i++)
        if (tk->eos[i] == id) return true;
    return false;
}
size_t st_tokenizer_max_token_bytes(const st_tokenizer_t *tk) { return tk->max_token_len; }

int32_t st_tokenizer_special_id(const st_tokenizer_t *tk, const char *text) {
    size_t len = strlen(text);
    for (uint32_t i = tk->n_sp; i-- > 0;)
        if (tk->sp[i].encodable && tk->sp[i].len == len && !memcmp(tk->sp[i].text, text, len)) return tk->sp[i].id;
    return -1;
}

bool st_tokenizer_is_special(const st_tokenizer_t *tk, int32_t id) {
    if (tk->kind == ST_TOKENIZER_BYTES) return id >= 256 && id < tk->n_ids;
    return id >= (int32_t)tk->n_ranks && id < tk->n_ids;
}

/* id → bytes; -1 marks an id that is refused */
static int token_of(const st_tokenizer_t *tk, int32_t id, const uint8_t **p, size_t *len, bool *special) {
    if (id < 0 || id >= tk->n_ids || id >= tk->n_embed) return -1;
    if (tk->kind == ST_TOKENIZER_BYTES) {
        *special = id >= 256;
        *p = tk->blob + (id < 256 ? id : 0);
        *len = id < 256 ? 1 : 0;
        return 0;
    }
    if ((uint32_t)id < tk->n_ranks) {
        *p = tk->blob + tk->off[id];
        *len = tk->off[id + 1] - tk->off[id];
        *special = false;
        return 0;
    }
    const st_tok_special_t *sp = &tk->sp[tk->sp_of_id[(uint32_t)id - tk->n_ranks]];
    *p = (const uint8_t *)sp->text;
    *len = sp->len;
    *special = sp->special;
    return 0;
}

st_status_t st_tokenizer_token_bytes(const st_tokenizer_t *tk, int32_t id, const char **bytes, size_t *len) {
    const uint8_t *p;
    size_t l;
    bool sp;
    if (token_of(tk, id, &p, &l, &sp)) return ST_REJECT(ST_ERR_OUT_OF_RANGE, "token id %d is out of range", id);
    *bytes = (const char *)p;
    *len = l;
    return ST_OK;
}

/* ---- encode / decode ---- */

st_status_t st_tokenizer_encode(const st_tokenizer_t *tk, const char *text, size_t len, unsigned flags,
                                st_tok_ids_t *out) {
    const uint8_t *s = (const uint8_t *)text;
    size_t n0 = out->n;
    st_status_t st;
    if (tk->kind == ST_TOKENIZER_BYTES) {
        if ((st = st_tok_ids_reserve(out, len))) return st;
        for (size_t i = 0; i < len; i++) out->ids[out->n++] = s[i];
        return ST_OK;
    }
    char *fixed = NULL;
    if (!utf8_valid(s, len)) {
        if (len > SIZE_MAX / 4 || !(fixed = malloc(3 * len + 1)))
            return ST_FAIL(ST_ERR_NO_MEMORY, "tokenizer: no memory to repair %zu bytes of text", len);
        len = utf8_repair(s, len, fixed, false, NULL);
        s = (const uint8_t *)fixed;
    }
    st = st_tt_encode(tk, s, len, (flags & ST_TOK_ALLOW_SPECIAL) != 0, out);
    free(fixed);
    if (st) out->n = n0;
    return st;
}

st_status_t st_tokenizer_decode(const st_tokenizer_t *tk, const int32_t *ids, size_t n, unsigned flags, char **text,
                                size_t *len) {
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *p;
        size_t l;
        bool sp;
        if (token_of(tk, ids[i], &p, &l, &sp))
            return ST_REJECT(ST_ERR_OUT_OF_RANGE, "token id %d is out of range (vocabulary of %d)", ids[i],
                             st_tokenizer_n_ids(tk));
        if (!(sp && (flags & ST_TOK_SKIP_SPECIAL))) total += l;
    }
    uint8_t *raw = malloc(total + 1);
    if (!raw) return ST_FAIL(ST_ERR_NO_MEMORY, "tokenizer: no memory for %zu bytes", total);
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *p;
        size_t l;
        bool sp;
        token_of(tk, ids[i], &p, &l, &sp);
        if (sp && (flags & ST_TOK_SKIP_SPECIAL)) continue;
        memcpy(raw + o, p, l);
        o += l;
    }
    raw[o] = 0;
    if ((flags & ST_TOK_RAW_BYTES) || utf8_valid(raw, o)) {
        *text = (char *)raw;
        *len = o;
        return ST_OK;
    }
    char *fixed = malloc(3 * o + 1);
    if (!fixed) {
        free(raw);
        return ST_FAIL(ST_ERR_NO_MEMORY, "tokenizer: no memory for %zu bytes", 3 * o);
    }
    size_t m = utf8_repair(raw, o, fixed, false, NULL);
    fixed[m] = 0;
    free(raw);
    *text = fixed;
    *len = m;
    return ST_OK;
}

/* ---- streams ---- */

void st_tok_stream_init(st_tok_stream_t *st, unsigned flags) {
    memset(st, 0, sizeof *st);
    st->flags = flags;
}

st_status_t st_tok_stream_put(const st_tokenizer_t *tk, st_tok_stream_t *st, int32_t id, char *out, size_t cap,
                              size_t *n) {
    const uint8_t *p;
    size_t l;
    bool sp;
    if (token_of(tk, id, &p, &l, &sp)) return ST_REJECT(ST_ERR_OUT_OF_RANGE, "token id %d is out of range", id);
    if (cap < 3 * tk->max_token_len + 12)
        return ST_FAIL(ST_ERR_INVALID_ARG, "tokenizer: stream buffer of %zu bytes is below %zu", cap,
                       3 * tk->max_token_len + 12);
    *n = 0;
    if (sp && (st->flags & ST_TOK_SKIP_SPECIAL)) return ST_OK;
    if (l == 0) return ST_OK;
    /* held-back bytes, then the token, staged at the end of out and repaired to the front.
     * NOTE: repair writes at most 3 bytes per byte read, and m <= max_token_len + 3 with
     * cap >= 3 * max_token_len + 12 >= 3m, so the writer never passes the unread bytes. */
    size_t m = (size_t)st->n_pend + l;
    uint8_t *w = (uint8_t *)out + cap - m;
    memmove(w + st->n_pend, p, l);
    memcpy(w, st->pend, (size_t)st->n_pend);
    int tail = 0;
    size_t o = utf8_repair(w, m, out, true, &tail);
    memcpy(st->pend, w + m - (size_t)tail, (size_t)tail);
    st->n_pend = tail;
    *n = o;
    return ST_OK;
}

size_t st_tok_stream_flush(st_tok_stream_t *st, char *out) {
    size_t o = utf8_repair(st->pend, (size_t)st->n_pend, out, false, NULL);
    st->n_pend = 0;
    return o;
}
