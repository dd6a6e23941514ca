/* `strata generate`: a gRPC client of the coordinator's Generate (server-streaming). */
#include <errno.h>
#include <stdlib.h>
#include <uv.h>

#include "cli.h"
#include "strata/proto.h"
#include "strata/rpc.h"

typedef struct {
    int stream, print_tokens, n, done, rc;
    st_npy_t npy;
    int dumping;
    char *text;
    size_t len, cap;
    char tokens[65536];
    size_t tlen;
    double t0, t_first;
} gen_cli_t;

static void on_msg(const uint8_t *msg, size_t len, void *arg) {
    gen_cli_t *g = arg;
    st_proto_generate_chunk_t ch;
    if (st_proto_generate_chunk_decode(msg, len, &ch) != ST_OK) return;
    int has_token = ch.finish == ST_PROTO_FINISH_NONE || ch.finish == ST_PROTO_FINISH_STOP || ch.finish == ST_PROTO_FINISH_LENGTH;
    if (ch.finish == ST_PROTO_FINISH_ERROR || ch.finish == ST_PROTO_FINISH_CANCELLED) {
        fprintf(stderr, "strata generate: %s\n", ch.error && ch.error[0] ? ch.error : "request failed");
        g->rc = 1;
        has_token = 0;
    }
    if (has_token) {
        if (!g->n) g->t_first = st_time_sec();
        g->n++;
        if (g->dumping && ch.logits_len) {
            if (!g->npy.cols) g->npy.cols = (int)(ch.logits_len / sizeof(float));
            if ((size_t)g->npy.cols * sizeof(float) == ch.logits_len) st_npy_append(&g->npy, (const float *)ch.logits, 1);
        }
        if (g->print_tokens)
            g->tlen += (size_t)snprintf(g->tokens + g->tlen, sizeof g->tokens - g->tlen, "%s%u", g->n > 1 ? "," : "", ch.token_id);
        else if (g->stream) {
            fputs(ch.text ? ch.text : "", stdout);
            fflush(stdout);
        } else if (ch.text) {
            size_t k = strlen(ch.text);
            if (g->len + k + 1 > g->cap) g->text = realloc(g->text, g->cap = (g->cap + k + 1) * 2);
            memcpy(g->text + g->len, ch.text, k + 1);
            g->len += k;
        }
    }
    st_proto_generate_chunk_cleanup(&ch);
}

static void on_done(st_status_t st, const char *detail, void *arg) {
    gen_cli_t *g = arg;
    if (st != ST_OK) {
        fprintf(stderr, "strata generate: %s%s%s\n", st_status_str(st), detail && *detail ? ": " : "", detail ? detail : "");
        g->rc = 1;
    }
    g->done = 1;
}

/* An unsigned integer flag in 1..hi, checked before any cast. */
static int u32_arg(const char *flag, const char *v, unsigned long hi, uint32_t *out) {
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || end == v || *end || v[0] == '-' || x < 1 || x > hi) {
        fprintf(stderr, "strata generate: %s takes an integer 1..%lu (got '%s')\n", flag, hi, v);
        return -1;
    }
    *out = (uint32_t)x;
    return 0;
}

int st_cmd_generate(int argc, char **argv) {
    const char *state_arg = NULL, *coord = NULL, *prompt = NULL, *ptoks = NULL, *dump = NULL;
    const char *api_key = *st_tun_str(ST_TUN_API_KEY) ? st_tun_str(ST_TUN_API_KEY) : NULL;
    st_proto_generate_req_t r = {.max_tokens = 16, .top_p = 1.0f};
    gen_cli_t g = {0};
    uint32_t *ids = NULL;
    for (int i = 0; i < argc; i++) {
        const char *v;
        if ((v = st_cli_opt(argc, argv, &i, "--state"))) state_arg = v;
        else if ((v = st_cli_opt(argc, argv, &i, "--coordinator"))) coord = v;
        else if ((v = st_cli_opt(argc, argv, &i, "--prompt"))) prompt = v;
        else if ((v = st_cli_opt(argc, argv, &i, "--prompt-tokens"))) ptoks = v;
        else if ((v = st_cli_opt(argc, argv, &i, "--max-tokens"))) { if (u32_arg("--max-tokens", v, 1000000, &r.max_tokens)) return 2; }
        else if ((v = st_cli_opt(argc, argv, &i, "--api-key"))) api_key = v;
        else if ((v = st_cli_opt(argc, argv, &i, "--temperature"))) r.temperature = strtof(v, NULL);
        else if ((v = st_cli_opt(argc, argv, &i, "--top-p"))) r.top_p = strtof(v, NULL);
        else if ((v = st_cli_opt(argc, argv, &i, "--top-k"))) { if (u32_arg("--top-k", v, 1000000, &r.top_k)) return 2; }
        else if ((v = st_cli_opt(argc, argv, &i, "--seed"))) { r.seed = strtoull(v, NULL, 10); r.has_seed = 1; }
        else if ((v = st_cli_opt(argc, argv, &i, "--dump-logits"))) dump = v;
        else if (!strcmp(argv[i], "--stream")) g.stream = 1;
        else if (!strcmp(argv[i], "--print-tokens")) g.print_tokens = 1;
        else if (!strcmp(argv[i], "--ignore-eos")) r.ignore_eos = 1;
        else { fprintf(stderr, "strata generate: unknown option %s\n", argv[i]); return 2; }
    }
    if ((!prompt) == (!ptoks)) {
        fprintf(stderr, "strata generate: exactly one of --prompt / --prompt-tokens\n");
        return 2;
    }
    char c[200];
    if (!coord) {
        if (st_cli_state_get(st_cli_state_dir(state_arg), "grpc", c, sizeof c) != 0) {
            fprintf(stderr, "strata generate: no cluster recorded (strata up, or --coordinator HOST:PORT)\n");
            return 1;
        }
        coord = c;
    }
    if (ptoks) {
        int cap = (int)strlen(ptoks) + 1, *tmp = malloc(sizeof(int) * (size_t)cap);
        int n = st_cli_parse_ids(ptoks, tmp, cap);
        if (n <= 0) {
            fprintf(stderr, "strata generate: malformed --prompt-tokens\n");
            free(tmp);
            return 2;
        }
        ids = malloc(sizeof(uint32_t) * (size_t)n);
        for (int i = 0; i < n; i++) ids[i] = (uint32_t)tmp[i];
        free(tmp);
        r.prompt_tokens = ids;
        r.n_prompt_tokens = (size_t)n;
    } else {
        r.prompt = (char *)prompt;
    }
    r.dump_logits = dump != NULL;
    uint8_t *buf;
    size_t len;
    if (st_proto_generate_req_encode(&r, &buf, &len) != ST_OK) return 1;
    free(ids);
    uv_loop_t loop;
    uv_loop_init(&loop);
    st_rpc_channel_t *ch = NULL;
    /* the coordinator's client API key, when it has one, rides as "authorization: Bearer" */
    st_rpc_sec_t sec = {.bearer = api_key && api_key[0] ? api_key : NULL};
    if (st_rpc_init(&loop) != ST_OK || st_rpc_channel_create_ex(coord, &sec, &ch) != ST_OK) {
        fprintf(stderr, "strata generate: %s\n", st_err_last());
        return 1;
    }
    g.t0 = st_time_sec();
    g.rc = 0;
    if (st_rpc_stream_open(ch, ST_PROTO_METHOD_GENERATE, buf, len, 600000, on_msg, on_done, &g, NULL) != ST_OK) {
        fprintf(stderr, "strata generate: %s\n", st_err_last());
        free(buf);
        return 1;
    }
    free(buf);
    /* the row width (vocabulary) comes with the first chunk's logits */
    if (dump && st_npy_open(&g.npy, dump, 0) == ST_OK) g.dumping = 1;
    while (!g.done) uv_run(&loop, UV_RUN_ONCE);
    st_rpc_channel_destroy(ch);
    st_rpc_cleanup();
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    if (g.dumping) st_npy_close(&g.npy);
    if (g.print_tokens) printf("%s\n", g.tokens);
    else if (!g.stream && g.text) printf("%s\n", g.text);
    else if (g.stream) printf("\n");
    free(g.text);
    double dt = st_time_sec() - g.t0;
    fprintf(stderr, "%d tokens in %.3f s (first after %.3f s, %.1f tokens/s)\n", g.n, dt, g.n ? g.t_first - g.t0 : 0.0,
            dt > 0 ? g.n / dt : 0.0);
    return g.rc;
}
