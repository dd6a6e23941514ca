/* `strata run`: the one-process engine — prefill one prompt or a batch of prompts in one step, then
 * decode all of them together, printing text (or tokens) and tokens/s. Tokens are sampled by the
 * engine (st_seq_chunk_t.sample), as the server's workers do: for one seed, `strata run` and a
 * request to the server pick the same tokens (prompt i of a batch samples with seed + i, as the i-th
 * prompt of an OpenAI batch does). It can write the routing it chose (--routing-out) and replay a
 * routing file (--routing-in) on either backend. Text prompts are encoded, and replies decoded, with the
 * checkpoint's tokenizer (its byte tokenizer when the folder ships none), specials allowed in a prompt
 * as the server's completions endpoint allows them; every eos the checkpoint lists stops a sequence. */
#include <errno.h>
#include <stdlib.h>

#include "cli.h"
#include "strata/engine.h"

#define MAX_PROMPTS 64
#define MAX_PROMPT_TOKENS 65536

typedef struct {
    int *toks; /* prompt then generated */
    int n_prompt, n_gen, slot;
    bool done;
    st_npy_t npy;
    bool dumping;
    st_sample_params_t sp; /* the engine's sampling of this sequence (sp.pos set per step) */
    int tok;               /* the engine's sampled token of the step */
} st_run_seq_t;

/* ---- routing files (--routing-out / --routing-in) ----
 * Version 1, text, one line per (sequence, position, MoE layer):
 *   strata-routing 1
 *   layers L experts N
 *   # seq pos token layer n id...
 *   0 0 5 1 4 3 17 22 40
 * seq: the prompt's index (0 alone, else its line in --batch-file); pos: the token's position in its
 * sequence (prompt from 0, then the generated tokens that are fed back); token: the id fed there;
 * layer: the MoE layer's index in the model; n: how many experts; then n expert ids, ascending and
 * distinct. Lines starting with '#' are comments. Written in the engine's order (step, layer,
 * token); read in any order. A replayed run overwrites the engine's choice at every MoE layer and
 * position through st_engine_set_route_hook (weights are recomputed from the scores over the
 * replayed sets, SPEC §7), so replaying a run's own routing gives its logits bit for bit. */
#define ST_ROUTING_VERSION 1

typedef struct {
    int tok, cnt;
    size_t off; /* into ids; SIZE_MAX = no line for this (seq, pos, layer) */
} st_rt_ent_t;

typedef struct {
    const char *path_in;
    FILE *out;
    st_rt_ent_t *ent; /* [sum over seqs of npos[s]][n_moe] */
    int *ids;
    size_t *base; /* [ns] first entry of each sequence */
    int *npos;    /* [ns] positions that can be fed: prompt + max_tokens - 1 */
    int ns, n_moe, first_moe;
    /* the step being run: entries (sequence, first position, tokens) in the engine's order */
    const st_run_seq_t *seqs;
    int nc, who[MAX_PROMPTS], pos0[MAX_PROMPTS], ntok[MAX_PROMPTS];
    char err[512]; /* first failure inside the hook; the step's caller reports it */
} st_rt_t;

static st_rt_ent_t *rt_at(st_rt_t *r, int s, int p, int l) {
    return &r->ent[r->base[s] + (size_t)p * r->n_moe + (size_t)(l - r->first_moe)];
}

/* Parses a routing file into r's table; checks it against the model (layers, experts, at most kcap
 * ids per token) and the prompts (sequences, positions, prompt tokens). Returns false with a
 * message on stderr. */
static bool rt_load(st_rt_t *r, const st_config_t *c, int kcap) {
    char *text;
    if (st_file_read_all(r->path_in, &text, NULL) != ST_OK) {
        fprintf(stderr, "strata run: --routing-in: %s\n", st_err_last());
        return false;
    }
    size_t n_ent = r->base[r->ns - 1] + (size_t)r->npos[r->ns - 1] * r->n_moe, n_ids = 0, cap = 1024;
    r->ent = malloc(n_ent * sizeof *r->ent);
    r->ids = malloc(cap * sizeof(int));
    for (size_t i = 0; i < n_ent; i++)
        r->ent[i] = (st_rt_ent_t){.off = SIZE_MAX};
    bool ok = false;
    int lineno = 0, v[5], *id = malloc((size_t)c->n_experts * sizeof(int));
    char *line = text, *next;
    for (; line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        lineno++;
        if (lineno == 1) {
            int ver, k = 0;
            if (sscanf(line, "strata-routing %d%n", &ver, &k) != 1 || line[k]) {
                fprintf(stderr,
                        "strata run: %s is not a strata routing file (first line must be \"strata-routing %d\")\n",
                        r->path_in, ST_ROUTING_VERSION);
                goto out;
            }
            if (ver != ST_ROUTING_VERSION) {
                fprintf(stderr, "strata run: %s: routing file version %d, this strata reads version %d\n", r->path_in,
                        ver, ST_ROUTING_VERSION);
                goto out;
            }
            continue;
        }
        if (lineno == 2) {
            int k = 0;
            if (sscanf(line, "layers %d experts %d%n", &v[0], &v[1], &k) != 2 || line[k]) {
                fprintf(stderr, "strata run: %s line 2: expected \"layers L experts N\"\n", r->path_in);
                goto out;
            }
            if (v[0] != c->n_layers || v[1] != c->n_experts) {
                fprintf(stderr,
                        "strata run: %s was recorded on a model with %d layers and %d experts; this checkpoint has %d "
                        "and %d\n",
                        r->path_in, v[0], v[1], c->n_layers, c->n_experts);
                goto out;
            }
            continue;
        }
        if (!*line || *line == '#') continue;
        char *p = line, *end;
        int nv = 0;
        for (; nv < 5; nv++) {
            errno = 0;
            long x = strtol(p, &end, 10);
            if (end == p || errno || x < 0 || x > 0x7fffffff) break;
            v[nv] = (int)x, p = end;
        }
        if (nv < 5) {
            fprintf(stderr, "strata run: %s line %d: expected \"seq pos token layer n id...\"\n", r->path_in, lineno);
            goto out;
        }
        int s = v[0], pos = v[1], tok = v[2], l = v[3], cnt = v[4];
        if (s >= r->ns) {
            fprintf(stderr, "strata run: %s line %d: sequence %d, but this run has %d prompt%s\n", r->path_in, lineno,
                    s, r->ns, r->ns > 1 ? "s" : "");
            goto out;
        }
        if (pos >= r->npos[s]) {
            fprintf(stderr,
                    "strata run: %s line %d: position %d of sequence %d is beyond this run (prompt %d + max-tokens %d "
                    "- 1)\n",
                    r->path_in, lineno, pos, s, r->seqs[s].n_prompt, r->npos[s] - r->seqs[s].n_prompt + 1);
            goto out;
        }
        if (!st_config_is_moe_layer(c, l) || l >= c->n_layers) {
            fprintf(stderr, "strata run: %s line %d: layer %d is not a MoE layer of this model (MoE layers %d..%d)\n",
                    r->path_in, lineno, l, r->first_moe, c->n_layers - 1);
            goto out;
        }
        if (tok >= c->vocab || (pos < r->seqs[s].n_prompt && tok != r->seqs[s].toks[pos])) {
            fprintf(stderr,
                    "strata run: %s line %d: position %d of sequence %d was recorded for token %d; the prompt has %d "
                    "there\n",
                    r->path_in, lineno, pos, s, tok, pos < r->seqs[s].n_prompt ? r->seqs[s].toks[pos] : -1);
            goto out;
        }
        if (cnt > kcap) {
            fprintf(stderr, "strata run: %s line %d: %d experts for one token; this engine routes at most %d\n",
                    r->path_in, lineno, cnt, kcap);
            goto out;
        }
        for (int i = 0; i < cnt; i++) {
            errno = 0;
            long x = strtol(p, &end, 10);
            if (end == p || errno) {
                fprintf(stderr, "strata run: %s line %d: %d expert ids announced, %d given\n", r->path_in, lineno, cnt,
                        i);
                goto out;
            }
            if (x < 0 || x >= c->n_experts || (i > 0 && x <= id[i - 1])) {
                fprintf(stderr,
                        "strata run: %s line %d: expert id %ld: ids must be in [0, %d), ascending and distinct\n",
                        r->path_in, lineno, x, c->n_experts);
                goto out;
            }
            id[i] = (int)x, p = end;
        }
        if (p[strspn(p, " \t\r")]) {
            fprintf(stderr, "strata run: %s line %d: more than the %d expert ids announced\n", r->path_in, lineno, cnt);
            goto out;
        }
        st_rt_ent_t *e = rt_at(r, s, pos, l);
        if (e->off != SIZE_MAX) {
            fprintf(stderr, "strata run: %s line %d: sequence %d position %d layer %d given twice\n", r->path_in,
                    lineno, s, pos, l);
            goto out;
        }
        if (n_ids + (size_t)cnt > cap) {
            cap = 2 * cap + (size_t)cnt;
            r->ids = realloc(r->ids, cap * sizeof(int));
        }
        memcpy(r->ids + n_ids, id, (size_t)cnt * sizeof(int));
        *e = (st_rt_ent_t){.tok = tok, .cnt = cnt, .off = n_ids};
        n_ids += (size_t)cnt;
    }
    if (lineno < 2) {
        fprintf(stderr, "strata run: %s: no \"layers L experts N\" line\n", r->path_in);
        goto out;
    }
    ok = true;
out:
    free(id);
    free(text);
    return ok;
}

static bool rt_open(st_rt_t *r, const char *path_out, const st_run_seq_t *seqs, int ns, int max_tokens,
                    const st_config_t *c, int kcap) {
    r->seqs = seqs, r->ns = ns;
    r->first_moe = c->first_k_dense, r->n_moe = ST_MAX(c->n_layers - c->first_k_dense, 0);
    if (c->n_experts <= 0 || r->n_moe == 0) {
        fprintf(stderr, "strata run: --routing-in/--routing-out: this model has no MoE layer\n");
        return false;
    }
    r->base = malloc((size_t)ns * sizeof *r->base);
    r->npos = malloc((size_t)ns * sizeof *r->npos);
    for (int s = 0; s < ns; s++) {
        r->npos[s] = seqs[s].n_prompt + max_tokens - 1;
        r->base[s] = s ? r->base[s - 1] + (size_t)r->npos[s - 1] * r->n_moe : 0;
    }
    if (r->path_in && !rt_load(r, c, kcap)) return false;
    if (path_out) {
        if (!(r->out = fopen(path_out, "w"))) {
            fprintf(stderr, "strata run: --routing-out %s: %s\n", path_out, strerror(errno));
            return false;
        }
        fprintf(r->out, "strata-routing %d\nlayers %d experts %d\n# seq pos token layer n id...\n", ST_ROUTING_VERSION,
                c->n_layers, c->n_experts);
    }
    return true;
}

/* Closes the output (reporting a failed write); frees the table. */
static bool rt_close(st_rt_t *r, const char *path_out) {
    bool ok = true;
    if (r->out && (ferror(r->out) | fclose(r->out))) {
        fprintf(stderr, "strata run: --routing-out %s: write failed\n", path_out);
        ok = false;
    }
    free(r->ent), free(r->ids), free(r->base), free(r->npos);
    return ok;
}

/* Route hook: replays the file's sets (when reading one), then writes the final sets (when writing). */
static void rt_hook(void *ctx, int layer, int T, int n_experts, const float *scores, int *ids, int *cnt, int kmax) {
    st_rt_t *r = ctx;
    (void)n_experts, (void)scores;
    if (r->err[0]) return;
    if (layer < r->first_moe || layer >= r->first_moe + r->n_moe) {
        snprintf(r->err, sizeof r->err, "the engine routed layer %d, not a MoE layer", layer);
        return;
    }
    int t = 0;
    for (int j = 0; j < r->nc; j++) {
        const st_run_seq_t *q = &r->seqs[r->who[j]];
        for (int i = 0; i < r->ntok[j] && t < T; i++, t++) {
            int s = r->who[j], pos = r->pos0[j] + i, tok = q->toks[pos];
            int *id = ids + (size_t)t * kmax;
            if (r->path_in) {
                const st_rt_ent_t *e = rt_at(r, s, pos, layer);
                if (e->off == SIZE_MAX) {
                    snprintf(r->err, sizeof r->err, "%s has no line for sequence %d position %d layer %d", r->path_in,
                             s, pos, layer);
                    return;
                }
                if (e->tok != tok) {
                    snprintf(r->err, sizeof r->err,
                             "%s: position %d of sequence %d was recorded for token %d; this run feeds %d", r->path_in,
                             pos, s, e->tok, tok);
                    return;
                }
                if (e->cnt > kmax) {
                    snprintf(r->err, sizeof r->err,
                             "%s: %d experts at sequence %d position %d; the engine routes at most %d", r->path_in,
                             e->cnt, s, pos, kmax);
                    return;
                }
                memcpy(id, r->ids + e->off, (size_t)e->cnt * sizeof(int));
                cnt[t] = e->cnt;
            }
            if (r->out) {
                fprintf(r->out, "%d %d %d %d %d", s, pos, tok, layer, cnt[t]);
                for (int k = 0; k < cnt[t]; k++)
                    fprintf(r->out, " %d", id[k]);
                fputc('\n', r->out);
            }
        }
    }
    if (t != T) snprintf(r->err, sizeof r->err, "the engine routed %d tokens in a step of %d", T, t);
}

/* The ids of a text prompt, in a buffer with room for max_new more; 0 when empty or on error. */
static int encode_prompt(const st_tokenizer_t *tk, const char *text, int max_new, int **out) {
    st_tok_ids_t v = {0};
    if (st_tokenizer_encode(tk, text, strlen(text), ST_TOK_ALLOW_SPECIAL, &v) != ST_OK || !v.n ||
        !(*out = malloc((v.n + (size_t)max_new) * sizeof(int)))) {
        st_tok_ids_free(&v);
        return 0;
    }
    for (size_t i = 0; i < v.n; i++) (*out)[i] = v.ids[i];
    int n = (int)v.n;
    st_tok_ids_free(&v);
    return n;
}

/* A batch file: one prompt per line, text, or "tokens: 1,2,3". */
static int read_batch(const char *path, const st_tokenizer_t *tk, st_run_seq_t *seqs, int max_new) {
    char *text;
    if (st_file_read_all(path, &text, NULL) != ST_OK) return -1;
    int n = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (!*line) continue;
        if (n == MAX_PROMPTS) {
            fprintf(stderr, "strata run: more than %d prompts in %s\n", MAX_PROMPTS, path);
            free(text);
            return -1;
        }
        int *ids = NULL, k;
        if (!strncmp(line, "tokens:", 7)) {
            ids = malloc((strlen(line) + 1 + (size_t)max_new) * sizeof(int));
            k = ids ? st_cli_parse_ids(line + 7 + strspn(line + 7, " "), ids, (int)strlen(line)) : 0;
        } else {
            k = encode_prompt(tk, line, max_new, &ids);
        }
        if (k <= 0) {
            fprintf(stderr, "strata run: %s: bad prompt on line %d\n", path, n + 1);
            free(ids);
            free(text);
            return -1;
        }
        seqs[n++] = (st_run_seq_t){.toks = ids, .n_prompt = k};
    }
    free(text);
    return n;
}

int st_cmd_run(int argc, char **argv) {
    const char *ckdir = NULL, *prompt = NULL, *ptoks = NULL, *dump = NULL, *batch = NULL, *rt_out = NULL;
    st_rt_t rt = {0};
    int max_tokens = 16;
    bool ignore_eos = false, print_tokens = false;
    st_sample_params_t sp = {.temperature = 0, .top_k = 0, .top_p = 1, .n_top = -1};
    uint64_t seed = 0;
    st_engine_opts_t eo;
    st_engine_opts_default(&eo);
    for (int i = 0; i < argc; i++) {
        const char *v;
        if ((v = st_cli_opt(argc, argv, &i, "--ckpt"))) ckdir = v;
        else if ((v = st_cli_opt(argc, argv, &i, "--prompt"))) prompt = v;
        else if ((v = st_cli_opt(argc, argv, &i, "--prompt-tokens"))) ptoks = v;
        else if ((v = st_cli_opt(argc, argv, &i, "--batch-file"))) batch = v;
        else if ((v = st_cli_opt(argc, argv, &i, "--max-tokens"))) max_tokens = atoi(v);
        else if ((v = st_cli_opt(argc, argv, &i, "--temperature"))) sp.temperature = strtof(v, NULL);
        else if ((v = st_cli_opt(argc, argv, &i, "--top-p"))) sp.top_p = strtof(v, NULL);
        else if ((v = st_cli_opt(argc, argv, &i, "--top-k"))) sp.top_k = atoi(v);
        else if ((v = st_cli_opt(argc, argv, &i, "--seed"))) seed = strtoull(v, NULL, 10);
        else if ((v = st_cli_opt(argc, argv, &i, "--dump-logits"))) dump = v;
        else if ((v = st_cli_opt(argc, argv, &i, "--routing-out"))) rt_out = v;
        else if ((v = st_cli_opt(argc, argv, &i, "--routing-in"))) rt.path_in = v;
        else if ((v = st_cli_opt(argc, argv, &i, "--device"))) {
            char *end = NULL;
            if (!strcmp(v, "cpu")) eo.device = -1;
            else if (!strncmp(v, "cuda:", 5) && (eo.device = (int)strtol(v + 5, &end, 10)) >= 0 && end != v + 5 && !*end) {}
            else { fprintf(stderr, "strata run: --device must be cpu or cuda:N\n"); return 2; }
        }
        else if ((v = st_cli_opt(argc, argv, &i, "--routing"))) {
            if (!strcmp(v, "topk")) eo.routing = ST_ROUTE_TOPK;
            else if (!strcmp(v, "quantile")) eo.routing = ST_ROUTE_QUANTILE;
            else { fprintf(stderr, "strata run: --routing must be topk or quantile\n"); return 2; }
        } else if (!strcmp(argv[i], "--ignore-eos")) ignore_eos = true;
        else if (!strcmp(argv[i], "--print-tokens")) print_tokens = true;
        else { fprintf(stderr, "strata run: unknown option %s\n", argv[i]); return 2; }
    }
    if (!ckdir || (!!prompt + !!ptoks + !!batch) != 1 || max_tokens < 1) {
        fprintf(stderr, "strata run: need --ckpt, exactly one of --prompt/--prompt-tokens/--batch-file, and --max-tokens >= 1\n");
        return 2;
    }
    if (!(sp.temperature >= 0.0f && sp.temperature <= 100.0f)) { /* the worker's range; NaN fails */
        fprintf(stderr, "strata run: --temperature must be 0..100 (0 = greedy)\n");
        return 2;
    }
    if (!(sp.top_p > 0.0f && sp.top_p < 1.0f)) sp.top_p = 1.0f; /* as the worker reads a request's: 0 or 1 = off */
    st_tokenizer_t *tk;
    if (st_tokenizer_load(&tk, ckdir, &(st_tokenizer_opts_t){.quiet = true}) != ST_OK) {
        fprintf(stderr, "strata run: %s\n", st_err_last());
        return 1;
    }
    static st_run_seq_t seqs[MAX_PROMPTS];
    int ns = 1;
    if (batch) {
        ns = read_batch(batch, tk, seqs, max_tokens);
        if (ns <= 0) {
            st_tokenizer_destroy(tk);
            return 1;
        }
    } else if (prompt) {
        seqs[0].n_prompt = encode_prompt(tk, prompt, max_tokens, &seqs[0].toks);
    } else {
        size_t cap = strlen(ptoks) + 1;
        seqs[0].toks = malloc((cap + (size_t)max_tokens) * sizeof(int));
        seqs[0].n_prompt = seqs[0].toks ? st_cli_parse_ids(ptoks, seqs[0].toks, (int)cap) : 0;
    }
    if (!batch && seqs[0].n_prompt <= 0) {
        fprintf(stderr, "strata run: empty or malformed prompt\n");
        free(seqs[0].toks);
        st_tokenizer_destroy(tk);
        return 2;
    }
    st_ckpt_t *ck;
    if (st_ckpt_open(&ck, ckdir) != ST_OK) {
        fprintf(stderr, "strata run: %s\n", st_err_last());
        for (int i = 0; i < ns; i++) free(seqs[i].toks);
        st_tokenizer_destroy(tk);
        return 1;
    }
    const st_config_t *c = st_ckpt_config(ck);
    int total_prompt = 0, longest = 0;
    for (int i = 0; i < ns; i++) {
        total_prompt += seqs[i].n_prompt;
        longest = ST_MAX(longest, seqs[i].n_prompt);
    }
    eo.max_seqs = ns;
    eo.max_ctx = longest + max_tokens;
    eo.max_batch_tokens = ST_MAX(total_prompt, ns);
    st_engine_t *e = NULL;
    int rc = 1;
    float *logits = NULL;
    bool routing = rt.path_in || rt_out;
    if (routing) {
        /* the engine's routing stride (engine.c: k, or max(k, k_max) in quantile mode) bounds a token's set */
        int km = ST_MIN(2 * c->top_k, ST_MAX(c->n_experts, 1));
        if (!rt_open(&rt, rt_out, seqs, ns, max_tokens, c, ST_MAX(c->top_k, eo.routing == ST_ROUTE_QUANTILE ? km : 0)))
            goto out_ckpt;
    }
    if (st_engine_create(&e, ck, &eo) != ST_OK) {
        fprintf(stderr, "strata run: %s\n", st_err_last());
        goto out_ckpt;
    }
    if (routing) st_engine_set_route_hook(e, rt_hook, &rt);
    int V = c->vocab;
    logits = malloc((size_t)eo.max_batch_tokens * (size_t)V * sizeof(float));
    st_seq_chunk_t *chunks = calloc((size_t)ns, sizeof *chunks);
    for (int i = 0; i < ns; i++) {
        if (st_engine_seq_open(e, &seqs[i].slot) != ST_OK) goto out_engine;
        seqs[i].sp = sp;
        seqs[i].sp.seed = seed + (uint64_t)i;
        if (dump) {
            char path[4096];
            if (ns == 1) snprintf(path, sizeof path, "%s", dump);
            else snprintf(path, sizeof path, "%.*s.%d.npy", (int)(strlen(dump) > 4 && !strcmp(dump + strlen(dump) - 4, ".npy") ? strlen(dump) - 4 : strlen(dump)), dump, i);
            if (st_npy_open(&seqs[i].npy, path, V) != ST_OK) goto out_engine;
            seqs[i].dumping = true;
        }
    }
    /* prefill: every prompt in one step; the engine samples each prompt's first token, except with
     * --dump-logits, where every prompt row comes back (all_logits, which the engine does not sample)
     * and the first token is drawn here by the engine's own rule (st_sample_rows: the same function of
     * seed, position and row; no penalties or bias in a run, so the row needs no processing) */
    for (int i = 0; i < ns; i++) {
        seqs[i].sp.pos = 0;
        chunks[i] = (st_seq_chunk_t){.slot = seqs[i].slot, .n_tokens = seqs[i].n_prompt, .tokens = seqs[i].toks,
                                     .all_logits = dump != NULL, .sample = dump ? NULL : &seqs[i].sp, .token = &seqs[i].tok};
        rt.who[i] = i, rt.pos0[i] = 0, rt.ntok[i] = seqs[i].n_prompt;
    }
    rt.nc = ns;
    double t0 = st_time_sec();
    if (st_engine_step(e, chunks, ns, logits) != ST_OK || rt.err[0]) {
        fprintf(stderr, "strata run: prefill failed: %s\n", rt.err[0] ? rt.err : st_err_last());
        goto out_engine;
    }
    double t_prefill = st_time_sec() - t0;
    size_t row = 0; /* --dump-logits: the first row of prompt i */
    for (int i = 0; i < ns; i++) {
        st_run_seq_t *q = &seqs[i];
        if (q->dumping) {
            st_npy_append(&q->npy, logits + row * V, q->n_prompt);
            row += (size_t)q->n_prompt;
            st_sample_row_t sr = {.temperature = q->sp.temperature, .top_p = q->sp.top_p, .top_k = q->sp.top_k, .n_top = -1,
                                  .row = (int)row - 1, .count_row = -1, .pos = 0, .seed = q->sp.seed};
            st_sample_rows(&q->tok, NULL, NULL, NULL, logits, 1, V, &sr, NULL, NULL, NULL);
        }
        q->toks[q->n_prompt + q->n_gen++] = q->tok;
        q->done = q->n_gen >= max_tokens || (!ignore_eos && (q->tok == c->eos_id || st_tokenizer_is_eos(tk, q->tok)));
    }
    /* decode: all unfinished sequences together, one token each per step, sampled by the engine;
     * the (processed: no penalties or bias here, so the model's) row comes back only to be dumped */
    double t1 = st_time_sec();
    int decoded = 0;
    for (;;) {
        int nc = 0, who[MAX_PROMPTS];
        for (int i = 0; i < ns; i++) {
            if (seqs[i].done) continue;
            who[nc] = rt.who[nc] = i;
            rt.pos0[nc] = seqs[i].n_prompt + seqs[i].n_gen - 1, rt.ntok[nc] = 1;
            seqs[i].sp.pos = (uint32_t)seqs[i].n_gen;
            chunks[nc++] = (st_seq_chunk_t){.slot = seqs[i].slot, .n_tokens = 1,
                                            .tokens = &seqs[i].toks[seqs[i].n_prompt + seqs[i].n_gen - 1],
                                            .sample = &seqs[i].sp, .keep_logits = seqs[i].dumping, .token = &seqs[i].tok};
        }
        if (nc == 0) break;
        rt.nc = nc;
        if (st_engine_step(e, chunks, nc, logits) != ST_OK || rt.err[0]) {
            fprintf(stderr, "strata run: decode failed: %s\n", rt.err[0] ? rt.err : st_err_last());
            goto out_engine;
        }
        decoded += nc;
        for (int j = 0; j < nc; j++) {
            st_run_seq_t *q = &seqs[who[j]];
            if (q->dumping) st_npy_append(&q->npy, logits + (size_t)j * V, 1);
            q->toks[q->n_prompt + q->n_gen++] = q->tok;
            q->done = q->n_gen >= max_tokens || (!ignore_eos && (q->tok == c->eos_id || st_tokenizer_is_eos(tk, q->tok)));
        }
    }
    double t_decode = st_time_sec() - t1;
    for (int i = 0; i < ns; i++) {
        if (ns > 1) printf("[%d] ", i);
        if (print_tokens) {
            for (int t = 0; t < seqs[i].n_gen; t++) printf("%s%d", t ? "," : "", seqs[i].toks[seqs[i].n_prompt + t]);
        } else {
            char *txt = NULL;
            size_t nb = 0;
            if (st_tokenizer_decode(tk, (const int32_t *)(seqs[i].toks + seqs[i].n_prompt), (size_t)seqs[i].n_gen,
                                    ST_TOK_SKIP_SPECIAL, &txt, &nb) != ST_OK) {
                fprintf(stderr, "strata run: decoding the reply: %s\n", st_err_last());
                rc = 1;
                goto out_engine;
            }
            fwrite(txt, 1, nb, stdout);
            free(txt);
        }
        printf("\n");
    }
    fprintf(stderr, "prefill: %d tokens in %.3f s (%.1f tokens/s); decode: %d tokens in %.3f s (%.1f tokens/s, batch %d)\n",
            total_prompt, t_prefill, total_prompt / t_prefill, decoded, t_decode, decoded > 0 ? decoded / t_decode : 0.0, ns);
    rc = 0;
out_engine:
    for (int i = 0; i < ns; i++)
        if (seqs[i].dumping && st_npy_close(&seqs[i].npy) != ST_OK) rc = 1;
    free(chunks);
    st_engine_destroy(e);
out_ckpt:
    if (routing && !rt_close(&rt, rt_out)) rc = 1;
    free(logits);
    for (int i = 0; i < ns; i++) free(seqs[i].toks);
    st_ckpt_close(ck);
    st_tokenizer_destroy(tk);
    return rc;
}
