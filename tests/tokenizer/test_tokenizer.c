/* Unit tests of the checkpoint tokenizer on small vocabularies written here: heap BPE against
 * tiktoken's own quadratic merge loop, the ASCII fast path against PCRE2, special tokens allowed
 * and as text, ids without an embedding row, bos/eos/pad from the three JSON files, the reference's
 * cuts, UTF-8 repair, streaming decode, the byte fallback, malformed files, and threads.
 * (Identity with OpenAI's tiktoken on real vocabularies: test_tokenizer_oracle.) */
#include <pthread.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../common/model/tokenizer_impl.h"
#include "harness.h"
#include "strata/model.h"

static char g_root[4096];

/* ---- files ---- */

static void write_file(const char *dir, const char *name, const char *data, size_t len) {
    char p[4400];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    if (!f || fwrite(data, 1, len, f) != len) {
        fprintf(stderr, "cannot write %s\n", p);
        exit(1);
    }
    fclose(f);
}
static void write_str(const char *dir, const char *name, const char *s) { write_file(dir, name, s, strlen(s)); }

static const char *mkdir_case(const char *name) {
    static char p[4400];
    snprintf(p, sizeof p, "%s/%s", g_root, name);
    mkdir(p, 0755);
    return p;
}

static void b64(const uint8_t *in, size_t n, char *out) {
    static const char a[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t w = (uint32_t)in[i] << 16 | (i + 1 < n ? (uint32_t)in[i + 1] << 8 : 0) | (i + 2 < n ? in[i + 2] : 0);
        out[o++] = a[w >> 18 & 63];
        out[o++] = a[w >> 12 & 63];
        out[o++] = i + 1 < n ? a[w >> 6 & 63] : '=';
        out[o++] = i + 2 < n ? a[w & 63] : '=';
    }
    out[o] = 0;
}

/* A vocabulary: the 256 bytes (rank = byte value) then the given tokens in rank order. */
typedef struct {
    char *text;
    size_t len, cap;
} sbuf_t;
static void sb_add(sbuf_t *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        b->cap = (b->len + n + 1) * 2;
        b->text = realloc(b->text, b->cap);
    }
    memcpy(b->text + b->len, s, n);
    b->len += n;
    b->text[b->len] = 0;
}
static void vocab_line(sbuf_t *b, const uint8_t *tok, size_t n, int rank) {
    char enc[512], line[600];
    b64(tok, n, enc);
    int l = snprintf(line, sizeof line, "%s %d\n", enc, rank);
    sb_add(b, line, (size_t)l);
}
static int write_vocab(const char *dir, const char *const *merges, int n_merges) {
    sbuf_t b = {0};
    for (int c = 0; c < 256; c++) {
        uint8_t ch = (uint8_t)c;
        vocab_line(&b, &ch, 1, c);
    }
    for (int i = 0; i < n_merges; i++) vocab_line(&b, (const uint8_t *)merges[i], strlen(merges[i]), 256 + i);
    write_file(dir, "tiktoken.model", b.text, b.len);
    free(b.text);
    return 256 + n_merges;
}

static st_tokenizer_t *load(const char *dir, const st_tokenizer_opts_t *o) {
    st_tokenizer_t *tk = NULL;
    st_status_t s = st_tokenizer_load(&tk, dir, o);
    CHECK(s == ST_OK, "load %s: %s", dir, st_err_last());
    return tk;
}

static size_t enc(const st_tokenizer_t *tk, const char *text, size_t len, unsigned flags, int32_t *ids, size_t max) {
    st_tok_ids_t v = {0};
    st_status_t s = st_tokenizer_encode(tk, text, len, flags, &v);
    CHECK(s == ST_OK, "encode: %s", st_err_last());
    size_t n = v.n;
    if (ids) memcpy(ids, v.ids, (n < max ? n : max) * sizeof *ids);
    st_tok_ids_free(&v);
    return n;
}

static bool ids_eq(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
    return na == nb && (na == 0 || !memcmp(a, b, na * sizeof *a));
}

static uint64_t g_rng = 0x12345678abcdefull;
static uint32_t rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 11);
}

/* ---- tiktoken's merge loop, as written in its Rust core (_byte_pair_merge): a linear scan for the
 * lowest rank each step, leftmost on ties. The reference the heap must agree with. ---- */
static size_t ref_bpe(const st_tokenizer_t *tk, const uint8_t *s, size_t n, int32_t *out) {
    int32_t r = st_tt_rank(tk, s, n);
    if (r >= 0) {
        out[0] = r;
        return 1;
    }
    size_t *start = malloc((n + 1) * sizeof *start), m = n + 1;
    int32_t *rank = malloc((n + 1) * sizeof *rank);
    for (size_t i = 0; i <= n; i++) start[i] = i;
    for (;;) {
        for (size_t i = 0; i + 2 < m; i++) rank[i] = st_tt_rank(tk, s + start[i], start[i + 2] - start[i]);
        int32_t best = -1;
        size_t at = 0;
        for (size_t i = 0; i + 2 < m; i++)
            if (rank[i] >= 0 && (best < 0 || rank[i] < best)) best = rank[i], at = i;
        if (best < 0) break;
        memmove(start + at + 1, start + at + 2, (m - at - 2) * sizeof *start);
        m--;
    }
    size_t k = 0;
    for (size_t i = 0; i + 1 < m; i++) out[k++] = st_tt_rank(tk, s + start[i], start[i + 1] - start[i]);
    free(start);
    free(rank);
    return k;
}

static void test_bpe_against_scan(void) {
    const char *dir = mkdir_case("bpe");
    /* random merges over a small alphabet: each new token joins two existing ones */
    char *toks[700];
    int n = 0;
    const char alpha[] = "abcd";
    char *pool[800];
    int np = 0;
    for (int i = 0; i < 4; i++) {
        pool[np] = malloc(2);
        pool[np][0] = alpha[i];
        pool[np++][1] = 0;
    }
    while (n < 600) {
        const char *x = pool[rnd() % np], *y = pool[rnd() % np];
        size_t lx = strlen(x), ly = strlen(y);
        if (lx + ly > 24) continue;
        char *t = malloc(lx + ly + 1);
        memcpy(t, x, lx);
        memcpy(t + lx, y, ly + 1);
        bool dup = strlen(t) == 1;
        for (int k = 0; k < n && !dup; k++) dup = !strcmp(toks[k], t);
        if (dup) {
            free(t);
            continue;
        }
        toks[n++] = t;
        pool[np++] = t;
    }
    write_vocab(dir, (const char *const *)toks, n);
    st_tokenizer_t *tk = load(dir, NULL);
    if (!tk) return;
    int32_t *a = malloc(30000 * sizeof *a), *b = malloc(30000 * sizeof *b);
    char *s = malloc(30001);
    int bad = 0, runs = 0;
    for (int t = 0; t < 400; t++) {
        size_t len = t < 390 ? 1 + rnd() % 60 : 2000 + rnd() % 3000; /* one piece: letters only */
        for (size_t i = 0; i < len; i++) s[i] = alpha[rnd() % (t % 3 ? 4 : 2)];
        size_t na = enc(tk, s, len, 0, a, 30000), nb = ref_bpe(tk, (const uint8_t *)s, len, b);
        bad += !ids_eq(a, na, b, nb);
        runs++;
    }
    CHECK(bad == 0, "heap BPE differs from tiktoken's scan on %d of %d pieces", bad, runs);
    /* a 25,000-byte piece (the longest the cuts allow) still agrees */
    for (size_t i = 0; i < 25000; i++) s[i] = alpha[i % 3 == 2 ? 2 : rnd() % 2];
    size_t na = enc(tk, s, 25000, 0, a, 30000), nb = ref_bpe(tk, (const uint8_t *)s, 25000, b);
    CHECK(ids_eq(a, na, b, nb), "heap BPE differs from the scan on a 25,000-byte piece");
    free(a);
    free(b);
    free(s);
    st_tokenizer_destroy(tk);
    for (int i = 0; i < np; i++) free(pool[i]);
}

/* ---- the ASCII fast path splits exactly as PCRE2 does ---- */
static void test_fast_path(void) {
    const char *dir = mkdir_case("fast");
    write_vocab(dir, NULL, 0);
    st_tokenizer_t *fast = load(dir, NULL);
    st_tokenizer_opts_t o = {.no_fast_path = true};
    st_tokenizer_t *slow = load(dir, &o);
    if (!fast || !slow) return;
    static const char *const pool[] = {"a", "b", "Z", "Q", "s", "S", "t", "T", "r", "R", "e", "E", "v", "V", "m", "M",
                                       "l", "L", "d", "D", "x", "0", "7", "9", "'", "'", "'", " ", " ", " ", "\t", "\n",
                                       "\r", "\v", "\f", "\x1c", "\x1f", "\x7f", "\x01", ".", ",", "!", "-", "(", "\"",
                                       "é", "ſ", "中", "\xc2\xa0", "\xe3\x80\x80", "\xc2\x85", "½", "²", "Ⅻ", "\xcc\x81",
                                       "😀", "\xe1\xa0\x8e", "Ω", "ǅ", "ß", "\xe2\x80\xa8", "٣"};
    char s[512];
    size_t ea[600], eb[600], ca, cb;
    int bad = 0;
    for (int t = 0; t < 20000; t++) {
        size_t len = 0, k = 1 + rnd() % 24;
        bool ascii = t % 2;
        for (size_t i = 0; i < k; i++) {
            const char *c = pool[rnd() % (ascii ? 45 : ST_ARRAY_LEN(pool))];
            size_t l = strlen(c);
            memcpy(s + len, c, l);
            len += l;
        }
        st_tt_split(fast, (const uint8_t *)s, len, ea, 600, &ca);
        st_tt_split(slow, (const uint8_t *)s, len, eb, 600, &cb);
        bool same = ca == cb && !memcmp(ea, eb, ca * sizeof *ea);
        if (!same && bad++ < 3) {
            fprintf(stderr, "fast path split differs on \"");
            for (size_t i = 0; i < len; i++) fprintf(stderr, "\\x%02x", (uint8_t)s[i]);
            fprintf(stderr, "\"\n");
        }
    }
    CHECK(bad == 0, "the ASCII fast path splits %d of 20,000 strings differently from PCRE2", bad);
    /* and the split is Kimi's: camelCase, contractions, numbers in threes, whitespace runs */
    const char *txt = "getUserName I'M they've 1234567 x  \n\n  y ...\n";
    size_t want[] = {3, 7, 11, 15, 23, 24, 27, 30, 31, 33, 37, 38, 40, 45};
    st_tt_split(fast, (const uint8_t *)txt, strlen(txt), ea, 600, &ca);
    bool same = ca == ST_ARRAY_LEN(want);
    for (size_t i = 0; same && i < ca; i++) same = ea[i] == want[i];
    CHECK(same, "Kimi's split of a sample line (%zu pieces)", ca);
    st_tokenizer_destroy(fast);
    st_tokenizer_destroy(slow);
}

/* ---- specials, embedding rows, bos/eos/pad ---- */
static const char TOKCFG[] =
    "{\"added_tokens_decoder\": {"
    "\"300\": {\"content\": \"[BOS]\", \"special\": true},"
    "\"301\": {\"content\": \"[EOS]\", \"special\": true},"
    "\"302\": {\"content\": \"<|im_end|>\", \"special\": true},"
    "\"303\": {\"content\": \"<|open|>\", \"special\": false},"
    "\"304\": {\"content\": \"<a>\", \"special\": true},"
    "\"305\": {\"content\": \"<a>b\", \"special\": true},"
    "\"556\": {\"content\": \"[UNK]\", \"special\": true},"
    "\"557\": {\"content\": \"[PAD]\", \"special\": true}},"
    "\"bos_token\": \"[BOS]\", \"eos_token\": {\"content\": \"[EOS]\", \"__type\": \"AddedToken\"},"
    "\"pad_token\": \"[PAD]\"}";

static void test_specials(void) {
    const char *dir = mkdir_case("specials");
    static const char *const merges[] = {"he", "ll", "hell", "hello", " w", "or", " wor", " world", "<|", "|>"};
    int n_ranks = write_vocab(dir, merges, 10);
    CHECK(n_ranks == 266, "vocabulary size");
    /* 300..: named ones; ids from len(ranks) = 266, so 300 is the 35th special */
    write_str(dir, "tokenizer_config.json", TOKCFG);
    st_tokenizer_t *tk = load(dir, NULL);
    if (!tk) return;
    CHECK(st_tokenizer_kind(tk) == ST_TOKENIZER_TIKTOKEN, "tiktoken kind");
    CHECK(st_tokenizer_n_ids(tk) == 266 + 258 + 34, "ids: ranks + 258 reserved, past 557 (%d)", st_tokenizer_n_ids(tk));
    CHECK(st_tokenizer_bos(tk) == 300 && st_tokenizer_pad(tk) == 557, "bos/pad from tokenizer_config.json");
    CHECK(st_tokenizer_is_eos(tk, 301) && !st_tokenizer_is_eos(tk, 302), "eos from tokenizer_config.json");
    CHECK(st_tokenizer_special_id(tk, "<|im_end|>") == 302, "special by text");
    CHECK(st_tokenizer_special_id(tk, "<|reserved_token_266|>") == 266, "unnamed ids are <|reserved_token_ID|>");
    CHECK(st_tokenizer_special_id(tk, "hello") == -1, "ordinary text is no special");
    CHECK(st_tokenizer_is_special(tk, 302) && !st_tokenizer_is_special(tk, 265), "is_special");

    int32_t ids[64];
    const char *t = "hello<|im_end|> world";
    size_t n = enc(tk, t, strlen(t), ST_TOK_ALLOW_SPECIAL, ids, 64);
    int32_t want[] = {259, 302, 263};
    CHECK(ids_eq(ids, n, want, 3), "specials allowed: template markup becomes its id (%zu ids)", n);
    n = enc(tk, t, strlen(t), 0, ids, 64);
    bool has302 = false;
    for (size_t i = 0; i < n; i++) has302 |= ids[i] == 302;
    CHECK(!has302 && n > 3, "specials as text: a user typing <|im_end|> cannot end a turn");
    /* plain mode gives what the text's own bytes give */
    int32_t ids2[64];
    size_t n2 = enc(tk, "<|im_end|>", 10, 0, ids2, 64);
    CHECK(n2 >= 2 && ids2[0] == 264, "<|im_end|> as text starts with the ordinary token <| (%d)", ids2[0]);
    /* longest special at a position wins; reserved names are recognised */
    n = enc(tk, "<a>b<a>c<|reserved_token_270|>", 30, ST_TOK_ALLOW_SPECIAL, ids, 64);
    int32_t want2[] = {305, 304, 'c', 270};
    CHECK(ids_eq(ids, n, want2, 4), "longest special first, reserved names recognised");
    /* specials split pieces: the whitespace before one ends its piece as at the end of text */
    n = enc(tk, "  <|im_end|>", 12, ST_TOK_ALLOW_SPECIAL, ids, 64);
    CHECK(n == 3 && ids[2] == 302, "text before a special is encoded on its own");

    char *out;
    size_t len;
    int32_t d[] = {259, 302, 303, 263};
    CHECK(st_tokenizer_decode(tk, d, 4, 0, &out, &len) == ST_OK && !strcmp(out, "hello<|im_end|><|open|> world"),
          "decode with specials");
    free(out);
    CHECK(st_tokenizer_decode(tk, d, 4, ST_TOK_SKIP_SPECIAL, &out, &len) == ST_OK && !strcmp(out, "hello<|open|> world"),
          "skip special: \"special\": false tokens (K3 <|open|>) stay as text");
    free(out);
    int32_t bad[] = {259, 558};
    CHECK(st_tokenizer_decode(tk, bad, 2, 0, &out, &len) == ST_ERR_OUT_OF_RANGE, "decode refuses an id past the table");
    int32_t neg[] = {-1};
    CHECK(st_tokenizer_decode(tk, neg, 1, 0, &out, &len) == ST_ERR_OUT_OF_RANGE, "decode refuses a negative id");
    st_tokenizer_destroy(tk);

    /* config.json: vocab_size cuts the table (no embedding row past 400), bos/eos/pad lists */
    write_str(dir, "config.json",
              "{\"vocab_size\": 400, \"bos_token_id\": 300, \"eos_token_id\": [302, 301], \"pad_token_id\": 399}");
    write_str(dir, "generation_config.json", "{\"eos_token_id\": [302, 303], \"temperature\": 1.0}");
    tk = load(dir, NULL);
    if (!tk) return;
    const int32_t *eos;
    int ne = st_tokenizer_eos(tk, &eos);
    CHECK(ne == 3 && eos[0] == 302 && eos[1] == 301 && eos[2] == 303, "every eos listed, once (%d)", ne);
    CHECK(st_tokenizer_pad(tk) == 399 && st_tokenizer_bos(tk) == 300, "bos/pad: config.json before tokenizer_config");
    CHECK(st_tokenizer_n_ids(tk) == 400, "ids past vocab_size have no embedding row (%d)", st_tokenizer_n_ids(tk));
    CHECK(st_tokenizer_special_id(tk, "[PAD]") == -1, "[PAD] 557 has no embedding row: no special");
    n = enc(tk, "[PAD]", 5, ST_TOK_ALLOW_SPECIAL, ids, 64);
    bool high = false;
    for (size_t i = 0; i < n; i++) high |= ids[i] >= 400;
    CHECK(!high && n == 5, "an id without an embedding row is never emitted: [PAD] encodes as text");
    int32_t d2[] = {557};
    CHECK(st_tokenizer_decode(tk, d2, 1, 0, &out, &len) == ST_ERR_OUT_OF_RANGE, "nor accepted by decode");
    st_tok_stream_t st;
    st_tok_stream_init(&st, 0);
    char sb[256];
    size_t sn;
    CHECK(st_tok_stream_put(tk, &st, 557, sb, sizeof sb, &sn) == ST_ERR_OUT_OF_RANGE, "nor by the stream decoder");
    st_tokenizer_destroy(tk);

    /* K3 layout: vocab_size nested in text_config, ids top-level */
    write_str(dir, "config.json",
              "{\"bos_token_id\": 300, \"eos_token_id\": 302, \"text_config\": {\"vocab_size\": 512}}");
    unlink(strcat(strcpy(sb, dir), "/generation_config.json"));
    tk = load(dir, NULL);
    CHECK(tk && st_tokenizer_n_ids(tk) == 512 && st_tokenizer_is_eos(tk, 302) && st_tokenizer_is_eos(tk, 301),
          "text_config.vocab_size; eos from config.json and tokenizer_config.json");
    st_tokenizer_destroy(tk);

    /* errors: an eos without an embedding row, vocab_size below the ranks */
    write_str(dir, "config.json", "{\"vocab_size\": 400, \"eos_token_id\": 450}");
    CHECK(st_tokenizer_load(&tk, dir, NULL) == ST_ERR_CONFIG, "eos past vocab_size is a config error");
    write_str(dir, "config.json", "{\"vocab_size\": 100}");
    CHECK(st_tokenizer_load(&tk, dir, NULL) == ST_ERR_CONFIG, "vocab_size below the rank count is a config error");
    unlink(strcat(strcpy(sb, dir), "/config.json"));
}

/* ---- the reference's cuts ---- */
static void test_cuts(void) {
    const char *dir = mkdir_case("cuts");
    static const char *const merges[] = {"aa", "aaa"};
    write_vocab(dir, merges, 2);
    st_tokenizer_t *tk = load(dir, NULL);
    if (!tk) return;
    /* "b" + 25,001 × "a": a non-space run of 25,002 is cut after 25,000 characters */
    size_t n = 1 + 25001;
    char *s = malloc(500000);
    s[0] = 'b';
    memset(s + 1, 'a', 25001);
    int32_t *ids = malloc(400000 * sizeof *ids);
    size_t k = enc(tk, s, n, 0, ids, 400000);
    /* every "aa" (rank 256) merges before "aaa" (257), leftmost first, then the odd tail a joins the
     * last aa. Without the cut: b, aa × 12,499, aaa (ends in 257). With it: "b" + 24,999 a → b,
     * aa × 12,498, aaa; then "aa" → aa: ends in 257, 256. */
    CHECK(k == 12501 && ids[k - 1] == 256 && ids[k - 2] == 257, "a 25,002-character run is cut after 25,000 (%zu)", k);
    /* a whitespace run: 25,001 spaces → 25,000 + 1 (each space its own token here) */
    memset(s, ' ', 25001);
    k = enc(tk, s, 25001, 0, ids, 400000);
    CHECK(k == 25001, "whitespace run");
    /* 400,000-code-point slices: "x" + 100,000 × " aaa" = 400,001 code points; the slice ends inside
     * the last word: " aa" then "a" */
    s[0] = 'x';
    for (int i = 0; i < 100000; i++) memcpy(s + 1 + 4 * i, " aaa", 4);
    k = enc(tk, s, 400001, 0, ids, 400000);
    /* per word " aaa": ' ' then "aaa" (merges: aa then aaa) → 2 ids; last word " aa" + "a" → 3 */
    CHECK(k == 1 + 2 * 99999 + 3 && ids[k - 1] == 'a' && ids[k - 2] == 256, "400,000-code-point slices (%zu)", k);
    /* the same with multibyte code points: slices count code points, not bytes */
    char *u = malloc(1300000);
    size_t ul = 0;
    for (int i = 0; i < 400001; i++) {
        memcpy(u + ul, i % 2 ? "a" : "\xc3\xa9", i % 2 ? 1 : 2); /* é a é a ... */
        ul += i % 2 ? 1 : 2;
    }
    st_tok_ids_t whole = {0}, a = {0};
    st_tokenizer_encode(tk, u, ul, 0, &whole);
    /* the reference: text[:400000] then text[400000:] — but also runs of <= 25,000 non-space */
    size_t cut = 0, cps = 0, seg = 0, run = 0;
    for (size_t i = 0; i < ul && cps < 400000; cps++) {
        if (++run > 25000) {
            st_tokenizer_encode(tk, u + seg, i - seg, 0, &a);
            seg = i;
            run = 1;
        }
        i += (uint8_t)u[i] >= 0x80 ? 2 : 1;
        cut = i;
    }
    st_tokenizer_encode(tk, u + seg, cut - seg, 0, &a);
    st_tokenizer_encode(tk, u + cut, ul - cut, 0, &a);
    CHECK(ids_eq(whole.ids, whole.n, a.ids, a.n), "cuts count code points (%zu vs %zu ids)", whole.n, a.n);
    st_tok_ids_free(&whole);
    st_tok_ids_free(&a);
    free(u);
    free(s);
    free(ids);
    st_tokenizer_destroy(tk);
}

/* ---- UTF-8 repair, round trips and streams ---- */

/* valid UTF-8 of whole characters, without U+FFFD (the texts fed in here have none) */
static bool whole_chars(const char *p, size_t n) {
    const uint8_t *s = (const uint8_t *)p;
    for (size_t i = 0; i < n;) {
        int l = s[i] < 0x80 ? 1 : s[i] >= 0xF0 ? 4 : s[i] >= 0xE0 ? 3 : s[i] >= 0xC2 ? 2 : 0;
        if (!l || i + (size_t)l > n) return false;
        for (int k = 1; k < l; k++)
            if ((s[i + (size_t)k] & 0xC0) != 0x80) return false;
        if (l == 3 && !memcmp(s + i, "\xef\xbf\xbd", 3)) return false;
        i += (size_t)l;
    }
    return true;
}
static void test_utf8_and_streams(void) {
    const char *dir = mkdir_case("utf8");
    static const char *const merges[] = {"\xe4\xbd", "\xe4\xbd\xa0", " \xe4", "ab"};
    write_vocab(dir, merges, 4);
    st_tokenizer_t *tk = load(dir, NULL);
    if (!tk) return;
    int32_t a[64], b[64];
    size_t na, nb;
    na = enc(tk, "\xff", 1, 0, a, 64);
    nb = enc(tk, "\xef\xbf\xbd", 3, 0, b, 64);
    CHECK(ids_eq(a, na, b, nb), "an invalid byte encodes as U+FFFD");
    na = enc(tk, "x\xe4\xbd", 3, 0, a, 64);
    nb = enc(tk, "x\xef\xbf\xbd", 4, 0, b, 64);
    CHECK(ids_eq(a, na, b, nb), "a truncated character is one U+FFFD (maximal subpart)");
    na = enc(tk, "\xed\xa0\x80", 3, 0, a, 64);
    nb = enc(tk, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", 9, 0, b, 64);
    CHECK(ids_eq(a, na, b, nb), "an encoded surrogate is three U+FFFD, as Python's errors=replace");

    /* round trip and streaming on random valid text */
    static const char *const pool[] = {"a", "b", " ", "\n", "你", "好", "é", "😀", "ab", "'s", "\xcc\x81", "Ω"};
    char s[400], *out;
    size_t len;
    int bad_rt = 0, bad_stream = 0, held = 0;
    for (int t = 0; t < 2000; t++) {
        size_t sl = 0, k = rnd() % 30;
        for (size_t i = 0; i < k; i++) {
            const char *c = pool[rnd() % ST_ARRAY_LEN(pool)];
            memcpy(s + sl, c, strlen(c));
            sl += strlen(c);
        }
        st_tok_ids_t v = {0};
        st_tokenizer_encode(tk, s, sl, 0, &v);
        if (st_tokenizer_decode(tk, v.ids, v.n, 0, &out, &len) != ST_OK || len != sl || memcmp(out, s, sl)) bad_rt++;
        free(out);
        st_tok_stream_t st;
        st_tok_stream_init(&st, 0);
        char acc[4000], piece[256];
        size_t al = 0, pn;
        for (size_t i = 0; i < v.n; i++) {
            if (st_tok_stream_put(tk, &st, v.ids[i], piece, sizeof piece, &pn) != ST_OK) bad_stream++;
            if (!whole_chars(piece, pn)) bad_stream++; /* every step: whole characters, no U+FFFD */
            if (pn == 0) held++;
            memcpy(acc + al, piece, pn);
            al += pn;
        }
        al += st_tok_stream_flush(&st, acc + al);
        if (al != sl || memcmp(acc, s, sl)) bad_stream++;
        st_tok_ids_free(&v);
    }
    CHECK(bad_rt == 0, "decode(encode(text)) == text (%d bad)", bad_rt);
    CHECK(bad_stream == 0, "streamed text == text, whole characters per step (%d bad)", bad_stream);
    CHECK(held > 0, "the stream held back split characters (%d times)", held);

    /* a character split over byte tokens comes out whole; a dangling start becomes U+FFFD */
    st_tok_stream_t st;
    st_tok_stream_init(&st, 0);
    char buf[256];
    size_t n1, n2, n3;
    st_tok_stream_put(tk, &st, 0xE5, buf, sizeof buf, &n1);
    st_tok_stream_put(tk, &st, 0xA5, buf, sizeof buf, &n2);
    st_tok_stream_put(tk, &st, 0xBD, buf, sizeof buf, &n3);
    CHECK(n1 == 0 && n2 == 0 && n3 == 3 && !memcmp(buf, "\xe5\xa5\xbd", 3), "好 over three tokens");
    st_tok_stream_put(tk, &st, 0xE5, buf, sizeof buf, &n1);
    st_tok_stream_put(tk, &st, 'x', buf, sizeof buf, &n2);
    CHECK(n1 == 0 && n2 == 4 && !memcmp(buf, "\xef\xbf\xbdx", 4), "a broken character becomes U+FFFD at once");
    st_tok_stream_put(tk, &st, 0xF0, buf, sizeof buf, &n1);
    n2 = st_tok_stream_flush(&st, buf);
    CHECK(n1 == 0 && n2 == 3 && !memcmp(buf, "\xef\xbf\xbd", 3), "flush: a dangling start becomes U+FFFD");
    CHECK(st_tok_stream_put(tk, &st, 'x', buf, 4, &n1) == ST_ERR_INVALID_ARG, "a buffer below the bound is refused");
    st_tokenizer_destroy(tk);
}

/* ---- the byte tokenizer for checkpoints that ship none ---- */
static void test_byte_fallback(void) {
    const char *dir = mkdir_case("bytes");
    write_str(dir, "config.json", "{\"vocab_size\": 300, \"bos_token_id\": 256, \"eos_token_id\": 257}");
    st_tokenizer_opts_t o = {.quiet = true};
    st_tokenizer_t *tk = load(dir, &o);
    if (!tk) return;
    CHECK(st_tokenizer_kind(tk) == ST_TOKENIZER_BYTES, "no tiktoken.model: byte tokenizer");
    CHECK(st_tokenizer_bos(tk) == 256 && st_tokenizer_is_eos(tk, 257), "bos/eos from config.json");
    int32_t ids[16];
    size_t n = enc(tk, "h\xc3\xa9", 3, ST_TOK_ALLOW_SPECIAL, ids, 16);
    CHECK(n == 3 && ids[0] == 'h' && ids[1] == 0xC3 && ids[2] == 0xA9, "one id per byte");
    int d[] = {'h', 0xC3, 0xA9, 257};
    int old[4];
    CHECK(st_tok_encode("h\xc3\xa9", old, 4) == 3 && old[1] == 0xC3, "legacy st_tok_encode unchanged");
    char *out, lb[8];
    size_t len;
    int32_t d32[] = {'h', 0xC3, 0xA9, 257};
    CHECK(st_tokenizer_decode(tk, d32, 4, 0, &out, &len) == ST_OK && len == 3 && !memcmp(out, "h\xc3\xa9", 3),
          "specials decode to nothing");
    free(out);
    CHECK(st_tok_decode(d, 4, lb, 8) == 3, "legacy st_tok_decode unchanged");
    int32_t big[] = {300};
    CHECK(st_tokenizer_decode(tk, big, 1, 0, &out, &len) == ST_ERR_OUT_OF_RANGE, "ids past vocab_size refused");
    st_tokenizer_destroy(tk);
}

/* ---- malformed files fail the load with a reason, never crash ---- */
static void test_malformed(void) {
    const char *dir = mkdir_case("bad");
    st_tokenizer_t *tk = NULL;
    static const struct {
        const char *file, *why;
        st_status_t want;
    } cases[] = {
        {"QQ== 0\nQg== 1\n", "missing single bytes", ST_ERR_PARSE},
        {"QQ==0\n", "no space", ST_ERR_PARSE},
        {"Q!== 0\n", "not base64", ST_ERR_PARSE},
        {"QQ== 0\nQg== 0\n", "rank twice", ST_ERR_PARSE},
        {"QQ== 5\n", "rank past the count", ST_ERR_PARSE},
        {"QQ== x\n", "rank not a number", ST_ERR_PARSE},
        {"QQ== 0\nQQ== 1\n", "token twice", ST_ERR_PARSE},
        {"", "empty", ST_ERR_PARSE},
        {"QQ== 99999999999999999999\n", "huge rank", ST_ERR_PARSE},
    };
    for (size_t i = 0; i < ST_ARRAY_LEN(cases); i++) {
        write_str(dir, "tiktoken.model", cases[i].file);
        st_status_t s = st_tokenizer_load(&tk, dir, NULL);
        CHECK(s == cases[i].want, "%s: status %d", cases[i].why, s);
    }
    write_vocab(dir, NULL, 0);
    static const char *const cfgs[] = {"[1]", "{\"added_tokens_decoder\": {\"x\": {\"content\": \"a\"}}}",
                                       "{\"added_tokens_decoder\": {\"300\": {}}}",
                                       "{\"added_tokens_decoder\": {\"300\": {\"content\": \"a\", \"special\": 1}}}",
                                       "{\"added_tokens_decoder\": {\"99999999\": {\"content\": \"a\"}}}", "{"};
    for (size_t i = 0; i < ST_ARRAY_LEN(cfgs); i++) {
        write_str(dir, "tokenizer_config.json", cfgs[i]);
        st_status_t s = st_tokenizer_load(&tk, dir, NULL);
        CHECK(s == ST_ERR_CONFIG || s == ST_ERR_PARSE, "bad tokenizer_config.json #%zu: status %d", i, s);
    }
    char missing[4500];
    snprintf(missing, sizeof missing, "%s/no-such-folder", g_root);
    CHECK(st_tokenizer_load(&tk, missing, NULL) == ST_ERR_IO, "a missing folder is ST_ERR_IO");
    /* a custom pattern that does not compile */
    write_str(dir, "tokenizer_config.json", "{}");
    st_tokenizer_opts_t o = {.pattern = "(unclosed"};
    CHECK(st_tokenizer_load(&tk, dir, &o) == ST_ERR_INVALID_ARG, "a bad pattern is refused");
}

/* ---- a loaded tokenizer is shared by threads ---- */
typedef struct {
    const st_tokenizer_t *tk;
    const char *text;
    size_t n_want;
    int32_t *want;
    int bad;
} thr_t;
static void *thr_main(void *arg) {
    thr_t *t = arg;
    for (int i = 0; i < 200; i++) {
        st_tok_ids_t v = {0};
        st_tokenizer_encode(t->tk, t->text, strlen(t->text), ST_TOK_ALLOW_SPECIAL, &v);
        t->bad += !ids_eq(v.ids, v.n, t->want, t->n_want);
        st_tok_ids_free(&v);
    }
    return NULL;
}
static void test_threads(void) {
    const char *dir = mkdir_case("specials"); /* from test_specials */
    st_tokenizer_t *tk = load(dir, NULL);
    if (!tk) return;
    const char *text = "hello world, 你好 <|im_end|> I'm here\n\n  x";
    int32_t want[256];
    size_t n = enc(tk, text, strlen(text), ST_TOK_ALLOW_SPECIAL, want, 256);
    thr_t t[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        t[i] = (thr_t){tk, text, n, want, 0};
        pthread_create(&th[i], NULL, thr_main, &t[i]);
    }
    int bad = 0;
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        bad += t[i].bad;
    }
    CHECK(bad == 0, "four threads encoding at once agree (%d bad)", bad);
    st_tokenizer_destroy(tk);
}

/* ---- Kimi's own files, where a machine has them (not fetchable here): the reference ids of the
 * checkpoint-layout notes §8.2. STRATA_KIMI_TOKENIZER_DIR = a folder with Kimi's tiktoken.model +
 * tokenizer_config.json. ---- */
static void test_kimi_if_present(void) {
    const char *dir = getenv("STRATA_KIMI_TOKENIZER_DIR");
    if (!dir || !*dir) {
        printf("skip: STRATA_KIMI_TOKENIZER_DIR not set (Kimi's reference ids)\n");
        return;
    }
    st_tokenizer_t *tk = load(dir, NULL);
    if (!tk) return;
    int32_t ids[16];
    size_t n = enc(tk, "Hello world", 11, 0, ids, 16);
    int32_t w1[] = {19180, 2695}, w2[] = {33845, 2243};
    CHECK(ids_eq(ids, n, w1, 2), "Kimi: \"Hello world\" -> 19180, 2695");
    n = enc(tk, "\xe4\xbd\xa0\xe5\xa5\xbd\xe4\xb8\x96\xe7\x95\x8c", 12, 0, ids, 16);
    CHECK(ids_eq(ids, n, w2, 2), "Kimi: \"你好世界\" -> 33845, 2243");
    CHECK(st_tokenizer_special_id(tk, "[BOS]") == 163584 && st_tokenizer_special_id(tk, "[EOS]") == 163585,
          "Kimi: [BOS] 163584, [EOS] 163585");
    st_tokenizer_destroy(tk);
}

int main(void) {
    const char *tmp = getenv("STRATA_TEST_TMP");
    snprintf(g_root, sizeof g_root, "%s/tokenizer-XXXXXX", tmp ? tmp : "/tmp");
    if (!mkdtemp(g_root)) {
        perror("mkdtemp");
        return 1;
    }
    test_bpe_against_scan();
    test_fast_path();
    test_specials();
    test_cuts();
    test_utf8_and_streams();
    test_byte_fallback();
    test_malformed();
    test_threads();
    test_kimi_if_present();
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_root);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_root);
    return st_test_done();
}
