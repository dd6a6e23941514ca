/* `strata tokenize`: the checkpoint's tokenizer from the command line — text (or a file's bytes)
 * to ids on one comma-separated line, or ids back to text. Needs only the tokenizer files. */
#include <stdlib.h>

#include "cli.h"
#include "strata/model.h"

static void usage_to(FILE *out) {
    fprintf(out, "usage: strata tokenize --ckpt DIR (TEXT | --file F | --decode 1,2,3) [options]\n"
                    "  DIR holds tiktoken.model + tokenizer_config.json (config.json, generation_config.json\n"
                    "  optional); without tiktoken.model the byte tokenizer is used\n"
                    "  --file F         encode the bytes of F as they are ('-' = standard input)\n"
                    "  --decode IDS     print the text of comma-separated ids\n"
                    "  --no-special     encode special-token text as plain text (as user content is);\n"
                    "                   the default recognises it, as the reference's encode() does\n"
                    "  --skip-special   leave special tokens out when decoding\n"
                    "  --info           print the vocabulary size and the bos/eos/pad ids to stderr\n");
}
static void usage(void) { usage_to(stderr); }

/* whole stream (a file or a pipe) */
static int read_stream(FILE *f, char **out, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    if (!buf) return -1;
    for (;;) {
        if (n == cap) {
            char *b = realloc(buf, cap *= 2);
            if (!b) {
                free(buf);
                return -1;
            }
            buf = b;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    if (ferror(f)) {
        free(buf);
        return -1;
    }
    *out = buf;
    *len = n;
    return 0;
}

static int print_ids(const st_tok_ids_t *v) {
    for (size_t i = 0; i < v->n; i++) printf(i ? ",%d" : "%d", v->ids[i]);
    printf("\n");
    return fflush(stdout) == 0 ? 0 : 1;
}

int st_cmd_tokenize(int argc, char **argv) {
    const char *dir = NULL, *file = NULL, *ids_arg = NULL, *text = NULL;
    unsigned enc_flags = ST_TOK_ALLOW_SPECIAL, dec_flags = 0;
    int info = 0;
    for (int i = 0; i < argc; i++) {
        const char *v;
        if ((v = st_cli_opt(argc, argv, &i, "--ckpt"))) dir = v;
        else if ((v = st_cli_opt(argc, argv, &i, "--file"))) file = v;
        else if ((v = st_cli_opt(argc, argv, &i, "--decode"))) ids_arg = v;
        else if (!strcmp(argv[i], "--no-special")) enc_flags &= ~ST_TOK_ALLOW_SPECIAL;
        else if (!strcmp(argv[i], "--skip-special")) dec_flags |= ST_TOK_SKIP_SPECIAL;
        else if (!strcmp(argv[i], "--info")) info = 1;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage_to(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--")) {
            if (i + 2 != argc || text) {
                usage();
                return 2;
            }
            text = argv[++i];
        } else if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "strata tokenize: unknown option %s\n", argv[i]);
            usage();
            return 2;
        } else if (!text) text = argv[i];
        else {
            fprintf(stderr, "strata tokenize: one TEXT only (quote it)\n");
            return 2;
        }
    }
    if (!dir || (!!text + !!file + !!ids_arg) != 1) {
        usage();
        return 2;
    }
    st_tokenizer_t *tk;
    if (st_tokenizer_load(&tk, dir, NULL) != ST_OK) {
        fprintf(stderr, "strata tokenize: %s\n", st_err_last());
        return 1;
    }
    if (info) {
        const int32_t *eos;
        int n_eos = st_tokenizer_eos(tk, &eos);
        fprintf(stderr, "%s tokenizer: %d ids, bos %d, pad %d, eos", st_tokenizer_kind(tk) ? "tiktoken" : "byte",
                st_tokenizer_n_ids(tk), st_tokenizer_bos(tk), st_tokenizer_pad(tk));
        for (int i = 0; i < n_eos; i++) fprintf(stderr, "%s%d", i ? "," : " ", eos[i]);
        fprintf(stderr, "\n");
    }
    int rc = 0;
    if (ids_arg) {
        size_t max = 1;
        for (const char *p = ids_arg; *p; p++) max += *p == ',';
        int *ids = malloc(max * sizeof *ids);
        int32_t *ids32 = malloc(max * sizeof *ids32);
        int n = ids && ids32 ? st_cli_parse_ids(ids_arg, ids, (int)max) : -1;
        char *out = NULL;
        size_t len = 0;
        if (n < 0) {
            fprintf(stderr, "strata tokenize: --decode wants comma-separated non-negative ids\n");
            rc = 2;
        } else {
            for (int i = 0; i < n; i++) ids32[i] = ids[i];
            if (st_tokenizer_decode(tk, ids32, (size_t)n, dec_flags, &out, &len) != ST_OK) {
                fprintf(stderr, "strata tokenize: %s\n", st_err_last());
                rc = 1;
            } else {
                fwrite(out, 1, len, stdout);
                printf("\n");
                rc = fflush(stdout) == 0 ? 0 : 1;
            }
        }
        free(out);
        free(ids);
        free(ids32);
    } else {
        char *buf = NULL;
        size_t len = 0;
        if (file) {
            FILE *f = strcmp(file, "-") ? fopen(file, "rb") : stdin;
            if (!f || read_stream(f, &buf, &len)) {
                fprintf(stderr, "strata tokenize: cannot read %s\n", file);
                rc = 1;
            }
            if (f && f != stdin) fclose(f);
        }
        if (!rc) {
            st_tok_ids_t v = {0};
            if (st_tokenizer_encode(tk, file ? buf : text, file ? len : strlen(text), enc_flags, &v) != ST_OK) {
                fprintf(stderr, "strata tokenize: %s\n", st_err_last());
                rc = 1;
            } else {
                rc = print_ids(&v);
            }
            st_tok_ids_free(&v);
        }
        free(buf);
    }
    st_tokenizer_destroy(tk);
    return rc;
}
