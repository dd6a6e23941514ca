/* Internal to common/model: the tokenizer object shared by tokenizer.c (loading the checkpoint's
 * JSON files, the byte tokenizer, decoding, streams) and tiktoken.c (rank table, PCRE2 split, BPE).
 * Not a public interface. */
#ifndef STRATA_TOKENIZER_IMPL_H
#define STRATA_TOKENIZER_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "strata/model.h"

/* One special (added) token: ids n_ranks.. of tiktoken.model's vocabulary. */
typedef struct {
    char *text;     /* owned, NUL-terminated */
    uint32_t len;
    int32_t id;
    bool special;   /* tokenizer_config "special": skipped by ST_TOK_SKIP_SPECIAL */
    bool encodable; /* has an embedding row (id < n_embed) and a unique, non-empty text */
} st_tok_special_t;

struct st_tokenizer {
    st_tokenizer_kind_t kind;
    int32_t n_ids;   /* ids the tokenizer defines: ranks then specials (256 for bytes) */
    int32_t n_embed; /* ids with an embedding row: config.json vocab_size, else n_ids */
    int32_t bos, pad;
    int32_t eos[ST_TOK_MAX_EOS];
    int n_eos;
    size_t max_token_len; /* longest token text in bytes */

    /* ---- tiktoken (kind == ST_TOKENIZER_TIKTOKEN) ---- */
    uint8_t *blob;      /* every rank's bytes back to back */
    uint32_t *off;      /* [n_ranks + 1]: rank r is blob[off[r], off[r+1]) */
    uint32_t n_ranks;   /* len(ranks): the first special id */
    uint64_t *slots;    /* open-addressing table: (hash tag << 32) | (rank + 1); 0 = empty */
    uint64_t slot_mask;
    int32_t byte_rank[256];
    st_tok_special_t *sp; /* [n_sp] sorted by id */
    uint32_t n_sp;
    int32_t *sp_of_id;    /* [n_ids - n_ranks]: index into sp, -1 when none */
    uint32_t *sp_by_byte; /* encodable specials ordered by first byte, longest first */
    uint32_t sp_first[257];
    void *re;             /* pcre2_code_8 *: the pre-tokenisation pattern */
    bool jit;             /* JIT-compiled: matched with pcre2_jit_match */
    bool fast_ascii;      /* ASCII pieces split by hand (the pattern is Kimi's) */
};

/* tiktoken.c */
st_status_t st_tt_load_ranks(st_tokenizer_t *tk, const char *path, const char *text, size_t len);
st_status_t st_tt_compile(st_tokenizer_t *tk, const char *pattern, bool fast_ascii);
st_status_t st_tt_index_specials(st_tokenizer_t *tk);
int32_t st_tt_rank(const st_tokenizer_t *tk, const uint8_t *p, size_t n);
/* Encode valid UTF-8 (the caller repaired it) with the reference's cuts. */
st_status_t st_tt_encode(const st_tokenizer_t *tk, const uint8_t *s, size_t n, bool allow_special,
                         st_tok_ids_t *out);
void st_tt_free(st_tokenizer_t *tk);
/* Tests: the end offsets of the pre-tokenisation pieces of s[0, n) (no specials, no cuts). */
st_status_t st_tt_split(const st_tokenizer_t *tk, const uint8_t *s, size_t n, size_t *ends, size_t max,
                        size_t *count);

/* tokenizer.c */
st_status_t st_tok_ids_reserve(st_tok_ids_t *v, size_t extra);
/* Unicode code point at s[i] of valid UTF-8; *len gets its byte count. */
static inline uint32_t st_utf8_next(const uint8_t *s, size_t i, int *len) {
    uint8_t b = s[i];
    if (b < 0x80) { *len = 1; return b; }
    if (b < 0xE0) { *len = 2; return ((uint32_t)(b & 0x1F) << 6) | (s[i + 1] & 0x3F); }
    if (b < 0xF0) {
        *len = 3;
        return ((uint32_t)(b & 0x0F) << 12) | ((uint32_t)(s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F);
    }
    *len = 4;
    return ((uint32_t)(b & 0x07) << 18) | ((uint32_t)(s[i + 1] & 0x3F) << 12) | ((uint32_t)(s[i + 2] & 0x3F) << 6) |
           (s[i + 3] & 0x3F);
}

#endif
