/* `strata`: one command for users — checkpoints (init, inspect) and the one-process engine (run). */
#include <stdlib.h>

#include "cli.h"

const char *st_cli_opt(int argc, char **argv, int *i, const char *name) {
    if (strcmp(argv[*i], name) != 0) return NULL;
    if (*i + 1 >= argc) {
        fprintf(stderr, "strata: %s needs a value\n", name);
        exit(2);
    }
    return argv[++*i];
}

int st_cli_parse_ids(const char *s, int *ids, int max) {
    int n = 0;
    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 0 || v > 0x7fffffff || n >= max) return -1;
        ids[n++] = (int)v;
        s = end;
        if (*s == ',') s++;
        else if (*s) return -1;
    }
    return n;
}

static void usage(void) {
    fprintf(stderr,
            "usage: strata <command> [options]\n"
            "  ckpt init --preset tiny|small|k3-mini --out DIR [--seed N] [--dtype bf16|f32]\n"
            "            [--skew-router X] [--mxfp4 | --no-mxfp4]\n"
            "  ckpt inspect DIR\n"
            "  tokenize --ckpt DIR (TEXT | --file F | --decode 1,2,3) [--no-special] [--skip-special] [--info]\n"
            "  run --ckpt DIR (--prompt TEXT | --prompt-tokens 1,2,3 | --batch-file FILE) --max-tokens N\n"
            "      [--temperature T] [--top-p P] [--top-k K] [--seed S] [--dump-logits FILE.npy]\n"
            "      [--routing topk|quantile] [--ignore-eos] [--print-tokens] [--device cpu|cuda:N]\n"
            "      [--routing-out FILE] [--routing-in FILE]   (write / replay the expert ids chosen per MoE layer\n"
            "       and position: text, version 1, format in README.md)\n"
            "  eval --ckpt DIR --text FILE [--ctx N (512)] [--batch WINDOWS (8)] [--device cpu|cuda:N] [--routing topk|quantile] [--json]\n"
            "      (held-out loss: nats/token, bits/byte, next-token accuracy; teacher-forced, tools/train's protocol)\n"
            "  up [--preset tiny|small|k3-mini | --ckpt DIR] [--experts N] [--workers M] [--routing topk|quantile]\n"
            "     [--replicas R] [--skew-router X] [--max-seqs N] [--max-batch-tokens N] [--micro-batches N] [--min-mb-tokens N] [--state DIR]\n"
            "     [--attn-device cpu|cuda:N] [--expert-device cpu|cuda:N]   (passed to strata-attn / strata-expert as --device)\n"
            "     [--cpu-split auto|on|off]   (each CPU role on its own CPUs, its threads and waits to match: on with a CPU\n"
            "      per role, auto (default) with one but not two)\n"
            "     (--micro-batches: at most this many per step, 2; the worker measures which count is fastest)\n"
            "     [--api-key KEY] [--max-queue N]   (a fresh cluster secret is written to the state directory)\n"
            "     [--coordinator-arg ARG]...   (appended to strata-coordinator's flags, e.g. --http localhost:PORT)\n"
            "  generate (--prompt TEXT | --prompt-tokens 1,2,3) [--max-tokens N] [--temperature T] [--top-p P]\n"
            "     [--top-k K] [--seed S] [--stream] [--print-tokens] [--ignore-eos] [--dump-logits FILE.npy]\n"
            "     [--coordinator HOST:PORT] [--api-key KEY (or $STRATA_API_KEY)]\n"
            "  status [--json] [--http HOST:PORT]\n"
            "  down [--state DIR]\n"
            "  config   every setting of the configuration table: value, where it came from, default, meaning\n"
            "every command also takes --set NAME=VALUE (a table entry; overrides $STRATA_NAME)\n");
}

/* `strata config`: the configuration table as this command line and environment make it */
static int cmd_config(int argc, char **argv) {
    (void)argv;
    if (argc > 0) {
        fprintf(stderr, "usage: strata config [--set NAME=VALUE ...]\n");
        return 2;
    }
    st_tun_print(stdout);
    return 0;
}

/* Applies and removes every --set NAME=VALUE of argv (any position after the command); -1 on error. */
static int take_set_flags(int *argc, char **argv) {
    int n = 0;
    for (int i = 0; i < *argc; i++) {
        int k = st_tun_parse_flag(*argc, argv, &i);
        if (k < 0) return -1;
        if (k == 0) argv[n++] = argv[i];
    }
    *argc = n;
    return 0;
}

/* `strata CMD --help`: the usage lines of CMD (its block of the usage text), on stdout. */
static int usage_of(const char *cmd) {
    static char text[4096];
    FILE *f = fmemopen(text, sizeof text - 1, "w");
    if (!f) return 2;
    FILE *save = stderr;
    stderr = f;
    usage();
    stderr = save;
    fclose(f);
    int in = 0, any = 0;
    size_t cl = strlen(cmd);
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        if (!strncmp(line, "usage:", 6)) continue;
        if (line[0] == ' ' && line[1] == ' ' && line[2] != ' ') /* a command's first line */
            in = !strncmp(line + 2, cmd, cl) && (line[2 + cl] == ' ' || !line[2 + cl]);
        if (in) {
            printf("%s%s\n", any ? "" : "usage: strata", any ? line : line + 1);
            any = 1;
        }
    }
    return any ? 0 : 2;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage();
        return 2;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-V")) {
        printf("strata %s\n", STRATA_VERSION);
        return 0;
    }
    for (int i = 2; i < argc; i++) /* every command's --help: before it parses (and refuses) anything */
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            if (!strcmp(argv[1], "tokenize")) break; /* its own, longer help */
            int rc = usage_of(argv[1]);
            if (rc) fprintf(stderr, "strata: unknown command '%s'\n", argv[1]);
            return rc;
        }
    st_log_set_tag("strata");
    int sub_argc = argc - 2;
    if (take_set_flags(&sub_argc, argv + 2) != 0) return 2;
    argc = sub_argc + 2;
    if (st_tun_load() != ST_OK) return 2; /* logged, naming the variable */
    if (!strcmp(argv[1], "config")) return cmd_config(argc - 2, argv + 2);
    if (!strcmp(argv[1], "ckpt")) return st_cmd_ckpt(argc - 2, argv + 2);
    if (!strcmp(argv[1], "run")) return st_cmd_run(argc - 2, argv + 2);
    if (!strcmp(argv[1], "eval")) return st_cmd_eval(argc - 2, argv + 2);
    if (!strcmp(argv[1], "tokenize")) return st_cmd_tokenize(argc - 2, argv + 2);
#ifdef STRATA_WITH_CLUSTER
    if (!strcmp(argv[1], "up")) return st_cmd_up(argc - 2, argv + 2);
    if (!strcmp(argv[1], "down")) return st_cmd_down(argc - 2, argv + 2);
    if (!strcmp(argv[1], "status")) return st_cmd_status(argc - 2, argv + 2);
    if (!strcmp(argv[1], "generate")) return st_cmd_generate(argc - 2, argv + 2);
#endif
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage();
        printf("strata %s: strata COMMAND --help shows one command's options\n", STRATA_VERSION);
        return 0;
    }
    fprintf(stderr, "strata: unknown command '%s'\n", argv[1]);
    usage();
    return 2;
}
