/* Strata's tokenizer against OpenAI's tiktoken core (npm tiktoken; ids written by oracle.mjs):
 * identical ids on realistic strings, random Unicode (code points PCRE2's tables know) and the
 * reference's cuts, over four official vocabularies, special tokens allowed and not, with the
 * ASCII fast path and with PCRE2 alone. Negative controls: each of the three known traps of
 * Kimi's pattern under PCRE2, translated naively, must make some string differ — so the corpus
 * can catch them.
 *   test_tokenizer_oracle --ranges FILE   write the code point ranges PCRE2 assigns (for oracle.mjs)
 *   test_tokenizer_oracle DIR             compare with DIR/expected-*.bin */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdint.h>

#include "harness.h"
#include "strata/model.h"

/* ---- naive translations of Kimi's pattern: one trap each ---- */
#define WS "\\t-\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
#define UPPERISH "[^\\p{Ll}\\p{N}\\p{P}\\p{S}\\p{Z}\\p{C}\\p{sc:Han}]"
#define LOWERISH "[^\\p{Lu}\\p{Lt}\\p{N}\\p{P}\\p{S}\\p{Z}\\p{C}\\p{sc:Han}]"
#define CONTR "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
#define TAIL_WS "|\\p{N}{1,3}| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*|[" WS "]*[\\r\\n]+|[" WS "]+(?![^" WS "])|[" WS "]+"
/* 1: \p{Han} as PCRE2 reads it (Script_Extensions) */
static const char NAIVE_SCX[] = "\\p{Han}+"
                                "|[^\\r\\n\\p{L}\\p{N}]?" UPPERISH "*" LOWERISH "+" CONTR
                                "|[^\\r\\n\\p{L}\\p{N}]?" UPPERISH "+" LOWERISH "*" CONTR TAIL_WS;
/* 2: && dropped (Han left in the letter classes) */
static const char NAIVE_AND[] = "\\p{sc:Han}+"
                                "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+" CONTR
                                "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*" CONTR TAIL_WS;
/* 3: PCRE2's own \s (UCP) instead of Unicode White_Space */
static const char NAIVE_WS[] = "\\p{sc:Han}+"
                               "|[^\\r\\n\\p{L}\\p{N}]?" UPPERISH "*" LOWERISH "+" CONTR
                               "|[^\\r\\n\\p{L}\\p{N}]?" UPPERISH "+" LOWERISH "*" CONTR
                               "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static int write_ranges(const char *path) {
    int err;
    PCRE2_SIZE at;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR) "^\\P{Cn}$", PCRE2_ZERO_TERMINATED, PCRE2_UTF, &err, &at, NULL);
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    FILE *f = fopen(path, "w");
    if (!re || !md || !f) return 1;
    long lo = -1;
    for (long c = 0; c <= 0x110000; c++) {
        bool ok = false;
        if (c < 0x110000 && (c < 0xD800 || c > 0xDFFF)) {
            uint8_t u[4];
            size_t n;
            if (c < 0x80) u[0] = (uint8_t)c, n = 1;
            else if (c < 0x800) u[0] = (uint8_t)(0xC0 | c >> 6), u[1] = (uint8_t)(0x80 | (c & 63)), n = 2;
            else if (c < 0x10000)
                u[0] = (uint8_t)(0xE0 | c >> 12), u[1] = (uint8_t)(0x80 | (c >> 6 & 63)), u[2] = (uint8_t)(0x80 | (c & 63)),
                n = 3;
            else
                u[0] = (uint8_t)(0xF0 | c >> 18), u[1] = (uint8_t)(0x80 | (c >> 12 & 63)),
                u[2] = (uint8_t)(0x80 | (c >> 6 & 63)), u[3] = (uint8_t)(0x80 | (c & 63)), n = 4;
            ok = pcre2_match(re, u, n, 0, 0, md, NULL) >= 0;
        }
        if (ok && lo < 0) lo = c;
        if (!ok && lo >= 0) {
            fprintf(f, "%lx %lx\n", lo, c - 1);
            lo = -1;
        }
    }
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    return fclose(f) != 0;
}

typedef struct {
    uint8_t *data;
    size_t len;
} blob_t;

static blob_t read_blob(const char *path) {
    blob_t b = {0};
    FILE *f = fopen(path, "rb");
    if (!f) return b;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    b.data = malloc((size_t)n + 1);
    if (b.data && fread(b.data, 1, (size_t)n, f) == (size_t)n) b.len = (size_t)n;
    fclose(f);
    return b;
}

static uint32_t rd32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

typedef struct {
    const char *text;
    size_t len;
} case_t;

static void show(const char *what, const case_t *c, const int32_t *a, size_t na, const uint8_t *b, size_t nb) {
    fprintf(stderr, "  %s: text (%zu bytes) \"", what, c->len);
    for (size_t i = 0; i < c->len && i < 120; i++) {
        uint8_t ch = (uint8_t)c->text[i];
        if (ch >= 0x20 && ch < 0x7f && ch != '"' && ch != '\\') fputc(ch, stderr);
        else fprintf(stderr, "\\x%02x", ch);
    }
    fprintf(stderr, "%s\"\n    strata:", c->len > 120 ? "..." : "");
    for (size_t i = 0; i < na && i < 24; i++) fprintf(stderr, " %d", a[i]);
    fprintf(stderr, "%s\n    oracle:", na > 24 ? " ..." : "");
    for (size_t i = 0; i < nb && i < 24; i++) fprintf(stderr, " %u", rd32(b + 4 * i));
    fprintf(stderr, "%s\n", nb > 24 ? " ..." : "");
}

/* Compare every case the oracle checked (a count of 0xFFFFFFFF: not checked with this vocabulary);
 * mism and done count per class (0 realistic, 1 random, 2 long). */
static void compare(const st_tokenizer_t *tk, const case_t *cases, size_t n_cases, const size_t cls_end[3],
                    const blob_t *exp, unsigned flags, const char *label, size_t mism[3], size_t done[3],
                    bool verbose) {
    size_t off = 0, shown = 0;
    st_tok_ids_t v = {0};
    mism[0] = mism[1] = mism[2] = 0;
    done[0] = done[1] = done[2] = 0;
    for (size_t i = 0; i < n_cases; i++) {
        if (off + 4 > exp->len) {
            fprintf(stderr, "%s: expected ids end early\n", label);
            mism[2]++;
            break;
        }
        uint32_t ne = rd32(exp->data + off);
        const uint8_t *e = exp->data + off + 4;
        int cls = i < cls_end[0] ? 0 : i < cls_end[1] ? 1 : 2;
        if (ne == UINT32_MAX) {
            off += 4;
            continue;
        }
        off += 4 + 4 * (size_t)ne;
        if (off > exp->len) {
            fprintf(stderr, "%s: expected ids end early\n", label);
            mism[2]++;
            break;
        }
        done[cls]++;
        v.n = 0;
        st_status_t s = st_tokenizer_encode(tk, cases[i].text, cases[i].len, flags, &v);
        bool same = s == ST_OK && v.n == ne;
        for (size_t k = 0; same && k < ne; k++) same = v.ids[k] == (int32_t)rd32(e + 4 * k);
        if (!same) {
            mism[cls]++;
            if (verbose && shown++ < 5) show(label, &cases[i], v.ids, v.n, e, ne);
        }
    }
    st_tok_ids_free(&v);
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--ranges")) return write_ranges(argv[2]);
    if (argc != 2) {
        fprintf(stderr, "usage: test_tokenizer_oracle DIR | --ranges FILE\n");
        return 2;
    }
    const char *dir = argv[1];
    char path[4096];
    snprintf(path, sizeof path, "%s/manifest.txt", dir);
    FILE *mf = fopen(path, "r");
    CHECK(mf != NULL, "%s: run oracle.mjs first", path);
    if (!mf) return st_test_done();
    size_t n_real = 0, n_rand = 0, n_long = 0;
    char names[8][64];
    int n_vocab = 0;
    char line[256];
    while (fgets(line, sizeof line, mf)) {
        if (sscanf(line, "cases %zu %zu %zu", &n_real, &n_rand, &n_long) == 3) continue;
        if (n_vocab < 8 && sscanf(line, "vocab %63s", names[n_vocab]) == 1) n_vocab++;
    }
    fclose(mf);
    snprintf(path, sizeof path, "%s/cases.bin", dir);
    blob_t cb = read_blob(path);
    CHECK(cb.len >= 4 && rd32(cb.data) == n_real + n_rand + n_long, "cases.bin holds the manifest's count");
    CHECK(n_real >= 1000 && n_rand >= 1000, "at least 1,000 realistic and 1,000 random strings (%zu, %zu)", n_real,
          n_rand);
    CHECK(n_vocab == 4, "four vocabularies (%d)", n_vocab);
    size_t n_cases = n_real + n_rand + n_long;
    case_t *cases = calloc(n_cases, sizeof *cases);
    size_t off = 4;
    for (size_t i = 0; i < n_cases && off + 4 <= cb.len; i++) {
        cases[i].len = rd32(cb.data + off);
        cases[i].text = (const char *)cb.data + off + 4;
        off += 4 + cases[i].len;
    }
    CHECK(off == cb.len, "cases.bin parsed to its end");
    size_t cls_end[3] = {n_real, n_real + n_rand, n_cases};
    static const char *const cls_name[3] = {"realistic", "random Unicode", "long (cuts)"};

    int long_checked = 0;
    for (int vi = 0; vi < n_vocab; vi++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[vi]);
        for (int fast = 1; fast >= 0; fast--) {
            st_tokenizer_opts_t o = {.no_fast_path = !fast};
            st_tokenizer_t *tk = NULL;
            st_status_t s = st_tokenizer_load(&tk, path, &o);
            CHECK(s == ST_OK, "load %s: %s", path, st_err_last());
            if (s) continue;
            for (int allow = 0; allow <= 1; allow++) {
                char ep[4096], label[700];
                snprintf(ep, sizeof ep, "%s/expected-%s-%s.bin", dir, names[vi], allow ? "allow" : "plain");
                snprintf(label, sizeof label, "%s, specials %s, %s", names[vi], allow ? "allowed" : "as text",
                         fast ? "ASCII fast path" : "PCRE2 only");
                blob_t exp = read_blob(ep);
                CHECK(exp.len > 0, "%s: missing", ep);
                size_t mism[3], done[3];
                compare(tk, cases, n_cases, cls_end, &exp, allow ? ST_TOK_ALLOW_SPECIAL : 0, label, mism, done,
                        true);
                for (int c = 0; c < 3; c++) {
                    size_t total = cls_end[c] - (c ? cls_end[c - 1] : 0);
                    if (c < 2) CHECK(done[c] == total, "%s: the oracle checked every %s string", label, cls_name[c]);
                    if (c == 2 && done[c]) long_checked++;
                    if (!done[c]) continue;
                    CHECK(mism[c] == 0, "%s: %zu of %zu %s strings differ from tiktoken", label, mism[c], done[c],
                          cls_name[c]);
                    printf("%s %s: %zu/%zu %s strings identical\n", mism[c] ? "FAIL" : "ok  ", label,
                           done[c] - mism[c], done[c], cls_name[c]);
                }
                free(exp.data);
            }
            st_tokenizer_destroy(tk);
        }
    }

    CHECK(long_checked >= 4, "the long strings were checked on at least two vocabularies (%d runs)", long_checked);

    /* negative controls on cl100k, specials as text: each naive translation must be caught */
    static const struct {
        const char *what, *pat;
    } naive[3] = {{"\\p{Han} as Script_Extensions", NAIVE_SCX},
                  {"&& dropped (Han in the letter runs)", NAIVE_AND},
                  {"PCRE2 \\s instead of White_Space", NAIVE_WS}};
    snprintf(path, sizeof path, "%s/%s", dir, names[0]);
    char ep[4096];
    snprintf(ep, sizeof ep, "%s/expected-%s-plain.bin", dir, names[0]);
    blob_t exp = read_blob(ep);
    for (int k = 0; k < 3; k++) {
        st_tokenizer_opts_t o = {.pattern = naive[k].pat};
        st_tokenizer_t *tk = NULL;
        CHECK(st_tokenizer_load(&tk, path, &o) == ST_OK, "load with a naive pattern: %s", st_err_last());
        if (!tk) continue;
        size_t mism[3], done[3];
        compare(tk, cases, n_cases, cls_end, &exp, 0, naive[k].what, mism, done, false);
        CHECK(mism[0] + mism[1] > 0, "negative control '%s': no string tells it from tiktoken", naive[k].what);
        printf("ok   negative control '%s': %zu realistic + %zu random strings differ\n", naive[k].what, mism[0],
               mism[1]);
        st_tokenizer_destroy(tk);
    }
    free(exp.data);
    free(cases);
    free(cb.data);
    return st_test_done();
}
