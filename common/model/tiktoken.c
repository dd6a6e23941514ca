/* tiktoken BPE for Kimi checkpoints: the tiktoken.model rank table, Kimi's pre-tokenisation pattern
 * through PCRE2 (JIT) with a hand-written ASCII fast path, lowest-rank-pair merging with a heap,
 * special tokens, and the reference's cuts. Loading the JSON files and decoding live in
 * tokenizer.c. Compared id for id with OpenAI's tiktoken core in tests/tokenizer/. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer_impl.h"

/* ---- Kimi's pattern (tokenization_kimi.py pat_str, identical in K2, Kimi Linear and K3) ----
 *   [\p{Han}]+
 *   |[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?
 *   |[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?
 *   |\p{N}{1,3}
 *   | ?[^\s\p{L}\p{N}]+[\r\n]*
 *   |\s*[\r\n]+
 *   |\s+(?!\S)
 *   |\s+
 * written for Rust's regex (tiktoken), translated for PCRE2 10.42:
 * - `\p{Han}` is Script_Extensions in PCRE2 >= 10.40 (it would glue "。" to Chinese words): `\p{sc:Han}`.
 * - no `&&` intersection: every code point has one general category, so
 *   [Lu Lt Lm Lo M && not Han] = [^ Ll N P S Z C Han] and [Ll Lm Lo M && not Han] = [^ Lu Lt N P S Z C Han].
 *   NOTE: single-character classes (not a lookahead group per character) keep the repeats simple,
 *   so JIT needs no stack per character of a 25,000-character word.
 * - `\s` under PCRE2 is not Unicode White_Space (Rust's \s): the set is spelled out. */
#define WS "\\t-\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
#define UPPERISH "[^\\p{Ll}\\p{N}\\p{P}\\p{S}\\p{Z}\\p{C}\\p{sc:Han}]"
#define LOWERISH "[^\\p{Lu}\\p{Lt}\\p{N}\\p{P}\\p{S}\\p{Z}\\p{C}\\p{sc:Han}]"
#define CONTRACTION "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
static const char KIMI_PATTERN[] = "\\p{sc:Han}+"
                                   "|[^\\r\\n\\p{L}\\p{N}]?" UPPERISH "*" LOWERISH "+" CONTRACTION
                                   "|[^\\r\\n\\p{L}\\p{N}]?" UPPERISH "+" LOWERISH "*" CONTRACTION
                                   "|\\p{N}{1,3}"
                                   "| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*"
                                   "|[" WS "]*[\\r\\n]+"
                                   "|[" WS "]+(?![^" WS "])"
                                   "|[" WS "]+";

/* ---- rank table ---- */

/* NOTE: pieces are short (English averages under 5 bytes), so the hash reads them with a few
 * overlapping loads instead of a byte loop or a variable-length memcpy, and a 64x64->128 multiply
 * mixes (the technique of wyhash). */
static inline uint64_t rd64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}
static inline uint64_t rd32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static inline uint64_t mum(uint64_t a, uint64_t b) {
    __uint128_t r = (__uint128_t)a * b;
    return (uint64_t)r ^ (uint64_t)(r >> 64);
}
#define H0 0xa0761d6478bd642full
#define H1 0xe7037ed1a0b428dbull
#define H2 0x8ebc6af09c88c6e3ull

static inline uint64_t tt_hash(const uint8_t *p, size_t n) {
    uint64_t a, b, seed = H0;
    if (n <= 16) {
        if (n >= 4) {
            size_t m = (n >> 3) << 2;
            a = rd32(p) << 32 | rd32(p + m);
            b = rd32(p + n - 4) << 32 | rd32(p + n - 4 - m);
        } else {
            a = (uint64_t)p[0] << 16 | (uint64_t)p[n >> 1] << 8 | p[n - 1];
            b = 0;
        }
    } else {
        size_t i = n;
        const uint8_t *q = p;
        while (i > 16) {
            seed = mum(rd64(q) ^ H1, rd64(q + 8) ^ seed);
            q += 16;
            i -= 16;
        }
        a = rd64(p + n - 16);
        b = rd64(p + n - 8);
    }
    return mum(H1 ^ n, mum(a ^ H1, b ^ seed ^ H2));
}

/* p[0, n) == q[0, n) for n >= 1, without a call for short n */
static inline bool same_bytes(const uint8_t *p, const uint8_t *q, size_t n) {
    if (n >= 8) {
        if (rd64(p) != rd64(q) || rd64(p + n - 8) != rd64(q + n - 8)) return false;
        return n <= 16 || !memcmp(p + 8, q + 8, n - 16);
    }
    if (n >= 4) return rd32(p) == rd32(q) && rd32(p + n - 4) == rd32(q + n - 4);
    return p[0] == q[0] && p[n >> 1] == q[n >> 1] && p[n - 1] == q[n - 1];
}

/* NOTE: inlined into the encoder's loops; a call's register saves cost a third of a lookup */
static inline __attribute__((always_inline)) int32_t tt_rank(const st_tokenizer_t *tk, const uint8_t *p, size_t n) {
    if (n == 1) return tk->byte_rank[p[0]];
    uint64_t h = tt_hash(p, n), tag = h >> 32;
    for (uint64_t i = h & tk->slot_mask;; i = (i + 1) & tk->slot_mask) {
        uint64_t e = tk->slots[i];
        if (!e) return -1;
        if ((e >> 32) != tag) continue;
        uint32_t r = (uint32_t)e - 1;
        if (tk->off[r + 1] - tk->off[r] == n && same_bytes(tk->blob + tk->off[r], p, n)) return (int32_t)r;
    }
}

int32_t st_tt_rank(const st_tokenizer_t *tk, const uint8_t *p, size_t n) { return tt_rank(tk, p, n); }

static int b64_val(uint8_t c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

/* Standard base64 with padding; returns the decoded length or -1. */
static long b64_decode(const uint8_t *in, size_t n, uint8_t *out) {
    if (n == 0 || n % 4) return -1;
    size_t o = 0;
    for (size_t i = 0; i < n; i += 4) {
        int v[4];
        int pad = 0;
        for (int k = 0; k < 4; k++) {
            if (in[i + k] == '=' && i + 4 == n && k >= 2) {
                v[k] = 0;
                pad++;
            } else {
                if (pad) return -1; /* data after '=' */
                v[k] = b64_val(in[i + k]);
                if (v[k] < 0) return -1;
            }
        }
        uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
        out[o++] = (uint8_t)(w >> 16);
        if (pad < 2) out[o++] = (uint8_t)(w >> 8);
        if (pad < 1) out[o++] = (uint8_t)w;
    }
    return (long)o;
}

#define RANKS_FAIL(...) ST_FAIL(ST_ERR_PARSE, __VA_ARGS__)

st_status_t st_tt_load_ranks(st_tokenizer_t *tk, const char *path, const char *text, size_t len) {
    /* count lines (empty lines are skipped, as tiktoken's loader does) */
    size_t n_lines = 0;
    for (size_t i = 0; i < len;) {
        const char *nl = memchr(text + i, '\n', len - i);
        size_t e = nl ? (size_t)(nl - text) : len;
        if (e > i && !(e == i + 1 && text[i] == '\r')) n_lines++;
        i = e + 1;
    }
    if (n_lines == 0) return RANKS_FAIL("%s: no tokens", path);
    if (n_lines > (1u << 30)) return RANKS_FAIL("%s: too many tokens (%zu)", path, n_lines);
    uint32_t n = (uint32_t)n_lines;
    /* every rank's bytes are shorter than its base64 text, so len bounds the blob */
    tk->blob = malloc(len + 8);
    tk->off = malloc(((size_t)n + 1) * sizeof *tk->off);
    uint32_t *start = malloc((size_t)n * sizeof *start), *tlen = malloc((size_t)n * sizeof *tlen);
    uint64_t cap = 16;
    while (cap < (uint64_t)n * 2) cap <<= 1;
    tk->slots = calloc(cap, sizeof *tk->slots);
    tk->slot_mask = cap - 1;
    st_status_t s = ST_OK;
    if (!tk->blob || !tk->off || !start || !tlen || !tk->slots) {
        s = ST_FAIL(ST_ERR_NO_MEMORY, "%s: no memory for %u tokens", path, n);
        goto out;
    }
    for (uint32_t r = 0; r < n; r++) start[r] = UINT32_MAX;
    size_t bl = 0, line = 0;
    for (size_t i = 0; i < len;) {
        const char *nl = memchr(text + i, '\n', len - i);
        size_t e = nl ? (size_t)(nl - text) : len, le = e;
        line++;
        if (le > i && text[le - 1] == '\r') le--;
        if (le == i) {
            i = e + 1;
            continue;
        }
        const char *sp = memchr(text + i, ' ', le - i);
        if (!sp) {
            s = RANKS_FAIL("%s:%zu: expected \"<base64> <rank>\"", path, line);
            goto out;
        }
        size_t tb = (size_t)(sp - text);
        long tl = b64_decode((const uint8_t *)text + i, tb - i, tk->blob + bl);
        if (tl <= 0) {
            s = RANKS_FAIL("%s:%zu: token is not base64 of at least one byte", path, line);
            goto out;
        }
        uint64_t rank = 0;
        size_t k = tb + 1;
        if (k >= le) {
            s = RANKS_FAIL("%s:%zu: missing rank", path, line);
            goto out;
        }
        for (; k < le; k++) {
            if (text[k] < '0' || text[k] > '9' || rank > n) {
                s = RANKS_FAIL("%s:%zu: rank is not a number below the token count %u", path, line, n);
                goto out;
            }
            rank = rank * 10 + (uint64_t)(text[k] - '0');
        }
        if (rank >= n) {
            s = RANKS_FAIL("%s:%zu: rank %llu is not below the token count %u (ranks are the ids 0..N-1)", path,
                           line, (unsigned long long)rank, n);
            goto out;
        }
        if (start[rank] != UINT32_MAX) {
            s = RANKS_FAIL("%s:%zu: rank %llu appears twice", path, line, (unsigned long long)rank);
            goto out;
        }
        start[rank] = (uint32_t)bl;
        tlen[rank] = (uint32_t)tl;
        bl += (size_t)tl;
        i = e + 1;
    }
    /* lay the blob out by rank (the file need not be sorted) so off[] is monotone */
    uint8_t *sorted = malloc(bl + 8);
    if (!sorted) {
        s = ST_FAIL(ST_ERR_NO_MEMORY, "%s: no memory", path);
        goto out;
    }
    size_t o = 0;
    tk->max_token_len = 0;
    for (uint32_t r = 0; r < n; r++) { /* every rank 0..n-1 was seen: n lines, distinct, all < n */
        tk->off[r] = (uint32_t)o;
        memcpy(sorted + o, tk->blob + start[r], tlen[r]);
        o += tlen[r];
        if (tlen[r] > tk->max_token_len) tk->max_token_len = tlen[r];
    }
    tk->off[n] = (uint32_t)o;
    free(tk->blob);
    tk->blob = sorted;
    tk->n_ranks = n;
    for (int b = 0; b < 256; b++) tk->byte_rank[b] = -1;
    for (uint32_t r = 0; r < n; r++) {
        const uint8_t *p = tk->blob + tk->off[r];
        size_t tl = tk->off[r + 1] - tk->off[r];
        if (tl == 1 ? tk->byte_rank[p[0]] >= 0 : tt_rank(tk, p, tl) >= 0) {
            s = RANKS_FAIL("%s: the token of rank %u appears twice", path, r);
            goto out;
        }
        if (tl == 1) tk->byte_rank[p[0]] = (int32_t)r;
        uint64_t h = tt_hash(p, tl);
        uint64_t i = h & tk->slot_mask;
        while (tk->slots[i]) i = (i + 1) & tk->slot_mask;
        tk->slots[i] = (h >> 32) << 32 | ((uint64_t)r + 1);
    }
    for (int b = 0; b < 256; b++)
        if (tk->byte_rank[b] < 0) {
            /* tiktoken's byte fallback needs every byte: without one, some text cannot be encoded */
            s = RANKS_FAIL("%s: no token for the single byte 0x%02x (every byte must be a token)", path, b);
            goto out;
        }
out:
    free(start);
    free(tlen);
    return s;
}

/* ---- pattern ---- */

static pthread_once_t g_cls_once = PTHREAD_ONCE_INIT;
static void init_cls(void);

st_status_t st_tt_compile(st_tokenizer_t *tk, const char *pattern, bool fast_ascii) {
    int err;
    PCRE2_SIZE at;
    const char *pat = pattern ? pattern : KIMI_PATTERN;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &err, &at, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return ST_FAIL(ST_ERR_INVALID_ARG, "pre-tokenisation pattern: %s at offset %zu", (char *)msg, (size_t)at);
    }
    pthread_once(&g_cls_once, init_cls);
    tk->jit = pcre2_jit_compile(re, PCRE2_JIT_COMPLETE) == 0;
    if (!tk->jit) st_log_warn("tokenizer: PCRE2 JIT unavailable, matching with the interpreter (slower)");
    tk->re = re;
    tk->fast_ascii = fast_ascii && !pattern;
    return ST_OK;
}

/* ---- specials: the encodable ones by first byte, longest first ---- */

st_status_t st_tt_index_specials(st_tokenizer_t *tk) {
    uint32_t m = 0;
    tk->sp_by_byte = malloc((tk->n_sp ? tk->n_sp : 1) * sizeof *tk->sp_by_byte);
    if (!tk->sp_by_byte) return ST_FAIL(ST_ERR_NO_MEMORY, "tokenizer: no memory");
    for (uint32_t i = 0; i < tk->n_sp; i++)
        if (tk->sp[i].encodable) tk->sp_by_byte[m++] = i;
    /* insertion sort (qsort has no context argument): by first byte, longest first, then id */
    for (uint32_t i = 1; i < m; i++) {
        uint32_t v = tk->sp_by_byte[i], j = i;
        const st_tok_special_t *x = &tk->sp[v];
        while (j > 0) {
            const st_tok_special_t *y = &tk->sp[tk->sp_by_byte[j - 1]];
            uint8_t fx = (uint8_t)x->text[0], fy = (uint8_t)y->text[0];
            bool before = fx != fy ? fx < fy : x->len != y->len ? x->len > y->len : x->id < y->id;
            if (!before) break;
            tk->sp_by_byte[j] = tk->sp_by_byte[j - 1];
            j--;
        }
        tk->sp_by_byte[j] = v;
    }
    for (int b = 0; b <= 256; b++) tk->sp_first[b] = m;
    for (uint32_t i = m; i-- > 0;) tk->sp_first[(uint8_t)tk->sp[tk->sp_by_byte[i]].text[0]] = i;
    /* sp_first[b] = first index with first byte b; fill the gaps so [sp_first[b], sp_first[b+1]) works */
    for (int b = 255; b >= 0; b--)
        if (tk->sp_first[b] == m || (m && (uint8_t)tk->sp[tk->sp_by_byte[tk->sp_first[b]]].text[0] != b))
            tk->sp_first[b] = tk->sp_first[b + 1];
    return ST_OK;
}

/* The leftmost special in s[a, b) (longest at that position): returns its start or b. */
static size_t find_special(const st_tokenizer_t *tk, const uint8_t *s, size_t a, size_t b, uint32_t *which) {
    if (tk->sp_first[0] == tk->sp_first[256]) return b; /* none encodable */
    for (size_t i = a; i < b; i++) {
        uint8_t c = s[i];
        for (uint32_t k = tk->sp_first[c]; k < tk->sp_first[c + 1]; k++) {
            const st_tok_special_t *sp = &tk->sp[tk->sp_by_byte[k]];
            if (sp->len <= b - i && !memcmp(s + i, sp->text, sp->len)) {
                *which = tk->sp_by_byte[k];
                return i;
            }
        }
    }
    return b;
}

/* ---- ASCII fast path ----
 * For a piece that starts with an ASCII character, the pattern's choice is decided by hand as long
 * as every character it has to look at is ASCII; the moment it would look at a byte >= 0x80 the
 * piece goes to PCRE2 instead (return 0). NOTE: the pattern has no lookbehind and every character
 * starts some alternative, so a match found from position p starts at p, by hand or by PCRE2. */
enum { C_UP = 1, C_LO = 2, C_DIG = 4, C_WS = 8, C_NL = 16, C_OTHER = 32, C_PREFIX = 64, C_HI = 128 };
static uint8_t g_cls[256]; /* C_HI alone for bytes >= 0x80: every class test fails there */
static void init_cls(void) {
    for (int c = 128; c < 256; c++) g_cls[c] = C_HI;
    for (int c = 0; c < 128; c++) {
        uint8_t k = 0;
        if (c >= 'A' && c <= 'Z') k = C_UP;
        else if (c >= 'a' && c <= 'z') k = C_LO;
        else if (c >= '0' && c <= '9') k = C_DIG;
        else if ((c >= 0x09 && c <= 0x0D) || c == ' ') k = C_WS;
        else k = C_OTHER; /* not White_Space, letter or number: controls 0x1C-0x1F included */
        if (c == '\r' || c == '\n') k |= C_NL;
        if (!(k & (C_UP | C_LO | C_DIG)) && c != '\r' && c != '\n') k |= C_PREFIX;
        g_cls[c] = k;
    }
}

static inline bool lower_eq(uint8_t c, char want) { return (c | 0x20) == (uint8_t)want; }

/* (?i:'s|'t|'re|'ve|'m|'ll|'d)? at j: returns the end, or 0 to defer to PCRE2 */
static inline size_t contraction(const uint8_t *s, size_t j, size_t end) {
    if (j >= end || s[j] != '\'' || j + 1 >= end) return j;
    uint8_t c1 = s[j + 1];
    if (c1 >= 0x80) return 0; /* U+017F folds to 's' */
    uint8_t l1 = c1 | 0x20;
    if (l1 == 's' || l1 == 't' || l1 == 'm' || l1 == 'd') return j + 2;
    if (j + 2 < end) {
        uint8_t c2 = s[j + 2];
        if ((l1 == 'r' && lower_eq(c2, 'e')) || (l1 == 'v' && lower_eq(c2, 'e')) || (l1 == 'l' && lower_eq(c2, 'l')))
            return j + 3;
    }
    return j;
}

static inline __attribute__((always_inline)) size_t ascii_piece(const uint8_t *s, size_t p, size_t end) {
    uint8_t c = s[p], k = g_cls[c];
    /* alternatives 2 and 3: [^\r\n\p{L}\p{N}]? Upper* Lower+ | ... Upper+ Lower*, then a contraction */
    size_t q = p + ((k & C_PREFIX) ? 1 : 0);
    if (q < end) {
        size_t i = q;
        while (i < end && (g_cls[s[i]] & C_UP)) i++;
        if (i < end && (g_cls[s[i]] & C_HI)) return 0;
        size_t j = i;
        while (j < end && (g_cls[s[j]] & C_LO)) j++;
        if (j < end && (g_cls[s[j]] & C_HI)) return 0;
        if (j > q) return contraction(s, j, end);
    }
    /* alternative 4: \p{N}{1,3} */
    if (k & C_DIG) {
        size_t i = p + 1;
        while (i < end && i < p + 3 && (g_cls[s[i]] & C_DIG)) i++;
        if (i < end && i < p + 3 && (g_cls[s[i]] & C_HI)) return 0;
        return i;
    }
    /* alternative 5: ' '?[^\s\p{L}\p{N}]+[\r\n]* */
    {
        size_t i = p + (c == ' ' ? 1 : 0);
        if (i < end && (g_cls[s[i]] & C_HI)) return 0;
        if (i < end && (g_cls[s[i]] & C_OTHER)) {
            while (i < end && (g_cls[s[i]] & C_OTHER)) i++;
            if (i < end && (g_cls[s[i]] & C_HI)) return 0;
            while (i < end && (g_cls[s[i]] & C_NL)) i++;
            return i;
        }
    }
    /* alternatives 6-8 on a whitespace run: \s*[\r\n]+ | \s+(?!\S) | \s+ */
    if (k & C_WS) {
        size_t i = p, last_nl = 0;
        bool nl = false;
        for (; i < end; i++) {
            uint8_t b = g_cls[s[i]];
            if (b & C_HI) return 0; /* may be non-ASCII White_Space */
            if (!(b & C_WS)) break;
            if (b & C_NL) {
                nl = true;
                last_nl = i;
            }
        }
        if (nl) return last_nl + 1;
        if (i == end) return end;
        return i - p >= 2 ? i - 1 : p + 1;
    }
    return 0; /* not reached for ASCII: every class is covered above */
}

/* ---- BPE: tiktoken's lowest-rank-pair merge, leftmost on ties, with a heap ----
 * Scratch is sized by the caller for a piece of n bytes: nxt/prv/pair n + 1 each, heap 3n. */
typedef struct {
    uint32_t *nxt, *prv;
    int32_t *pair;  /* rank of the merge of part i with the next part, -1 none */
    uint64_t *heap; /* (rank << 32) | start: the smallest is the lowest rank, then leftmost */
    size_t cap;     /* pieces up to cap bytes fit */
} bpe_scratch_t;

static inline void heap_push(uint64_t *h, size_t *n, uint64_t v) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p] <= v) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static inline uint64_t heap_pop(uint64_t *h, size_t *n) {
    uint64_t top = h[0], v = h[--*n];
    size_t i = 0, m = *n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= m) break;
        if (c + 1 < m && h[c + 1] < h[c]) c++;
        if (h[c] >= v) break;
        h[i] = h[c];
        i = c;
    }
    if (m) h[i] = v;
    return top;
}

static st_status_t bpe_scratch_fit(bpe_scratch_t *b, size_t n) {
    if (n <= b->cap) return ST_OK;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < n) cap *= 2;
    uint32_t *nx = realloc(b->nxt, (cap + 1) * sizeof *nx);
    if (nx) b->nxt = nx;
    uint32_t *pv = realloc(b->prv, (cap + 1) * sizeof *pv);
    if (pv) b->prv = pv;
    int32_t *pr = realloc(b->pair, (cap + 1) * sizeof *pr);
    if (pr) b->pair = pr;
    uint64_t *hp = realloc(b->heap, 3 * (cap + 1) * sizeof *hp);
    if (hp) b->heap = hp;
    if (!nx || !pv || !pr || !hp) return ST_FAIL(ST_ERR_NO_MEMORY, "tokenizer: no memory for a %zu-byte piece", n);
    b->cap = cap;
    return ST_OK;
}

static inline int32_t pair_rank(const st_tokenizer_t *tk, const uint8_t *s, const uint32_t *nxt, size_t n,
                                uint32_t i) {
    uint32_t j = nxt[i];
    if (j >= n) return -1;
    uint32_t e = nxt[j];
    return tt_rank(tk, s + i, e - i);
}

static st_status_t bpe(const st_tokenizer_t *tk, const uint8_t *s, size_t n, bpe_scratch_t *b, st_tok_ids_t *out) {
    st_status_t st = bpe_scratch_fit(b, n);
    if (st) return st;
    if ((st = st_tok_ids_reserve(out, n))) return st;
    uint32_t *nxt = b->nxt, *prv = b->prv;
    int32_t *pair = b->pair;
    uint64_t *h = b->heap;
    size_t hn = 0;
    for (uint32_t i = 0; i < n; i++) {
        nxt[i] = i + 1;
        prv[i] = i ? i - 1 : UINT32_MAX;
    }
    for (uint32_t i = 0; i + 1 < n; i++) {
        pair[i] = pair_rank(tk, s, nxt, n, i);
        if (pair[i] >= 0) h[hn++] = (uint64_t)pair[i] << 32 | i;
    }
    pair[n - 1] = -1;
    /* heapify the initial pairs */
    for (size_t k = hn / 2; k-- > 0;) {
        uint64_t v = h[k];
        size_t i = k;
        for (;;) {
            size_t c = 2 * i + 1;
            if (c >= hn) break;
            if (c + 1 < hn && h[c + 1] < h[c]) c++;
            if (h[c] >= v) break;
            h[i] = h[c];
            i = c;
        }
        h[i] = v;
    }
    while (hn) {
        uint64_t top = heap_pop(h, &hn);
        uint32_t i = (uint32_t)top, r = (uint32_t)(top >> 32);
        /* stale: part i was merged away or its pair changed since (a rank names one byte string, so
         * an unchanged rank means an unchanged pair) */
        if (pair[i] != (int32_t)r) continue;
        uint32_t j = nxt[i];
        nxt[i] = nxt[j];
        if (nxt[j] < n) prv[nxt[j]] = i;
        pair[j] = -1;
        pair[i] = pair_rank(tk, s, nxt, n, i);
        if (pair[i] >= 0) heap_push(h, &hn, (uint64_t)pair[i] << 32 | i);
        uint32_t p = prv[i];
        if (p != UINT32_MAX) {
            pair[p] = pair_rank(tk, s, nxt, n, p);
            if (pair[p] >= 0) heap_push(h, &hn, (uint64_t)pair[p] << 32 | p);
        }
    }
    for (uint32_t i = 0; i < n; i = nxt[i]) {
        int32_t r = tt_rank(tk, s + i, nxt[i] - i);
        if (r < 0) return ST_FAIL(ST_ERR_INTERNAL, "tokenizer: BPE produced a part with no rank");
        out->ids[out->n++] = r;
    }
    return ST_OK;
}

/* ---- ordinary text: split into pieces, each piece is one token or BPE'd ---- */

typedef struct {
    pcre2_match_data *md;
    bpe_scratch_t bpe;
} enc_ctx_t;

static st_status_t emit_piece(const st_tokenizer_t *tk, enc_ctx_t *cx, const uint8_t *p, size_t n,
                              st_tok_ids_t *out) {
    int32_t r = tt_rank(tk, p, n);
    if (r >= 0) {
        if (out->n == out->cap) {
            st_status_t s = st_tok_ids_reserve(out, 1);
            if (s) return s;
        }
        out->ids[out->n++] = r;
        return ST_OK;
    }
    return bpe(tk, p, n, &cx->bpe, out);
}

/* The next piece of s[0, n) at or after p: [*a, *b). Returns 1, 0 at the end, or a status < 0. */
static inline __attribute__((always_inline)) int next_piece(const st_tokenizer_t *tk, pcre2_match_data *md, const uint8_t *s, size_t n, size_t p,
                      size_t *a, size_t *b) {
    while (p < n) {
        if (tk->fast_ascii && s[p] < 0x80) {
            size_t e = ascii_piece(s, p, n);
            if (e) {
                *a = p;
                *b = e;
                return 1;
            }
        }
        int rc = tk->jit ? pcre2_jit_match(tk->re, s, n, p, 0, md, NULL)
                         : pcre2_match(tk->re, s, n, p, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) return 0; /* as tiktoken: text no alternative matches is dropped */
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return ST_FAIL(ST_ERR_INTERNAL, "tokenizer: PCRE2 match failed: %s", (char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        if (ov[1] > ov[0]) {
            *a = ov[0];
            *b = ov[1];
            return 1;
        }
        /* an empty match (only a custom pattern can give one): step over one character */
        p = ov[0] + 1;
        while (p < n && (s[p] & 0xC0) == 0x80) p++;
    }
    return 0;
}

static st_status_t encode_ordinary(const st_tokenizer_t *tk, enc_ctx_t *cx, const uint8_t *s, size_t n,
                                   st_tok_ids_t *out) {
    size_t p = 0, a = 0, b = 0;
    int rc;
    while ((rc = next_piece(tk, cx->md, s, n, p, &a, &b)) == 1) {
        st_status_t st = emit_piece(tk, cx, s + a, b - a, out);
        if (st) return st;
        p = b;
    }
    return (st_status_t)rc;
}

st_status_t st_tt_split(const st_tokenizer_t *tk, const uint8_t *s, size_t n, size_t *ends, size_t max,
                        size_t *count) {
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    if (!md) return ST_FAIL(ST_ERR_NO_MEMORY, "tokenizer: no memory");
    size_t p = 0, a = 0, b = 0, k = 0;
    int rc;
    while ((rc = next_piece(tk, md, s, n, p, &a, &b)) == 1 && k < max) {
        ends[k++] = b;
        p = b;
    }
    pcre2_match_data_free(md);
    *count = k;
    return rc < 0 ? (st_status_t)rc : ST_OK;
}

static st_status_t encode_segment(const st_tokenizer_t *tk, enc_ctx_t *cx, const uint8_t *s, size_t n,
                                  bool allow_special, st_tok_ids_t *out) {
    if (!allow_special) return encode_ordinary(tk, cx, s, n, out);
    size_t a = 0;
    while (a < n) {
        uint32_t w = 0;
        size_t at = find_special(tk, s, a, n, &w);
        st_status_t st = encode_ordinary(tk, cx, s + a, at - a, out);
        if (st) return st;
        if (at == n) break;
        if ((st = st_tok_ids_reserve(out, 1))) return st;
        out->ids[out->n++] = tk->sp[w].id;
        a = at + tk->sp[w].len;
    }
    return ST_OK;
}

/* ---- the reference's cuts ----
 * tokenization_kimi.py encodes text[i : i + 400000] slices separately, and splits each slice where a
 * run of Python-isspace() or non-isspace code points would exceed 25,000 (tiktoken issue 195). */
#define CUT_SLICE 400000
#define CUT_RUN 25000

/* Python's str.isspace: bidirectional class WS, B or S, or category Zs */
static inline bool py_isspace(uint32_t c) {
    if (c < 0x80) return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20);
    return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
           c == 0x202F || c == 0x205F || c == 0x3000;
}

/* 0x80 in each byte of w (eight ASCII bytes) that Python's isspace() calls space: 0x09-0x0D, 0x1C-0x20.
 * NOTE: with every byte below 0x80 the additions carry into no neighbouring byte. */
static inline uint64_t ascii_space_mask(uint64_t w) {
    const uint64_t k = 0x0101010101010101ull, hi = 0x8080808080808080ull;
    uint64_t a = (w + k * (0x80 - 0x09)) & ~(w + k * (0x7F - 0x0D));
    uint64_t b = (w + k * (0x80 - 0x1C)) & ~(w + k * (0x7F - 0x20));
    return (a | b) & hi;
}

st_status_t st_tt_encode(const st_tokenizer_t *tk, const uint8_t *s, size_t n, bool allow_special,
                         st_tok_ids_t *out) {
    enc_ctx_t cx = {0};
    cx.md = pcre2_match_data_create(1, NULL);
    if (!cx.md) return ST_FAIL(ST_ERR_NO_MEMORY, "tokenizer: no memory");
    st_status_t st = ST_OK;
    size_t pos = 0;
    const uint64_t hi = 0x8080808080808080ull;
    while (pos < n && !st) {
        /* one slice of at most CUT_SLICE code points, split into runs of at most CUT_RUN */
        size_t seg = pos, i = pos, cps = 0, run = 0;
        int l;
        bool cur = py_isspace(st_utf8_next(s, pos, &l));
        while (i < n && cps < CUT_SLICE) {
            /* eight ASCII bytes at once while neither limit is near */
            if (i + 8 <= n && cps + 8 <= CUT_SLICE && run + 8 <= CUT_RUN) {
                uint64_t w = rd64(s + i);
                if (!(w & hi)) {
                    uint64_t m = ascii_space_mask(w);
                    if (m == (cur ? hi : 0)) {
                        run += 8;
                    } else { /* the run now is the last byte's class, back to the first byte unlike it */
                        bool last = m >> 63;
                        uint64_t x = last ? ~m & hi : m;
                        run = x ? (size_t)__builtin_clzll(x) / 8 : 8;
                        cur = last;
                    }
                    i += 8;
                    cps += 8;
                    continue;
                }
            }
            uint32_t c;
            if (s[i] < 0x80) {
                c = s[i];
                l = 1;
            } else {
                c = st_utf8_next(s, i, &l);
            }
            bool sp = py_isspace(c);
            if (sp != cur) {
                run = 1;
                cur = sp;
            } else if (++run > CUT_RUN) {
                if ((st = encode_segment(tk, &cx, s + seg, i - seg, allow_special, out))) break;
                seg = i;
                run = 1;
            }
            i += (size_t)l;
            cps++;
        }
        if (!st) st = encode_segment(tk, &cx, s + seg, i - seg, allow_special, out);
        pos = i;
    }
    pcre2_match_data_free(cx.md);
    free(cx.bpe.nxt);
    free(cx.bpe.prv);
    free(cx.bpe.pair);
    free(cx.bpe.heap);
    return st;
}

void st_tt_free(st_tokenizer_t *tk) {
    if (tk->re) pcre2_code_free(tk->re);
    free(tk->blob);
    free(tk->off);
    free(tk->slots);
    free(tk->sp_by_byte);
    tk->re = NULL;
}
