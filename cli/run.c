/* `strata run`: the one-process engine — prefill one prompt or a batch of prompts in one step, then
 * decode all of them together, printing text (or tokens) and tokens/s. */
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
    int amax; /* the engine's argmax (greedy without --dump-logits: no logits row to the host) */
} st_run_seq_t;

/* A batch file: one prompt per line, text, or "tokens: 1,2,3". */
static int read_batch(const char *path, st_run_seq_t *seqs, int max_new) {
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
        int *ids = malloc((strlen(line) + 1 + (size_t)max_new) * sizeof(int));
        int k = !strncmp(line, "tokens:", 7) ? st_cli_parse_ids(line + 7 + strspn(line + 7, " "), ids, (int)strlen(line))
                                             : st_tok_encode(line, ids, (int)strlen(line));
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
    const char *ckdir = NULL, *prompt = NULL, *ptoks = NULL, *dump = NULL, *batch = NULL;
    int max_tokens = 16;
    bool ignore_eos = false, print_tokens = false;
    st_sampling_t sp = {.temperature = 0, .top_k = 0, .top_p = 1};
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
    static st_run_seq_t seqs[MAX_PROMPTS];
    int ns = 1;
    if (batch) {
        ns = read_batch(batch, seqs, max_tokens);
        if (ns <= 0) return 1;
    } else {
        size_t cap = (prompt ? strlen(prompt) : strlen(ptoks)) + 1;
        seqs[0].toks = malloc((cap + (size_t)max_tokens) * sizeof(int));
        seqs[0].n_prompt = prompt ? st_tok_encode(prompt, seqs[0].toks, (int)cap) : st_cli_parse_ids(ptoks, seqs[0].toks, (int)cap);
        if (seqs[0].n_prompt <= 0) {
            fprintf(stderr, "strata run: empty or malformed prompt\n");
            return 2;
        }
    }
    st_ckpt_t *ck;
    if (st_ckpt_open(&ck, ckdir) != ST_OK) {
        fprintf(stderr, "strata run: %s\n", st_err_last());
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
    st_engine_t *e;
    int rc = 1;
    float *logits = NULL, *ws = NULL;
    if (st_engine_create(&e, ck, &eo) != ST_OK) {
        fprintf(stderr, "strata run: %s\n", st_err_last());
        goto out_ckpt;
    }
    int V = c->vocab;
    logits = malloc((size_t)eo.max_batch_tokens * (size_t)V * sizeof(float));
    ws = malloc(2 * (size_t)V * sizeof(float));
    st_seq_chunk_t *chunks = calloc((size_t)ns, sizeof *chunks);
    st_rng_t rng = {seed};
    for (int i = 0; i < ns; i++) {
        if (st_engine_seq_open(e, &seqs[i].slot) != ST_OK) goto out_engine;
        if (dump) {
            char path[4096];
            if (ns == 1) snprintf(path, sizeof path, "%s", dump);
            else snprintf(path, sizeof path, "%.*s.%d.npy", (int)(strlen(dump) > 4 && !strcmp(dump + strlen(dump) - 4, ".npy") ? strlen(dump) - 4 : strlen(dump)), dump, i);
            if (st_npy_open(&seqs[i].npy, path, V) != ST_OK) goto out_engine;
            seqs[i].dumping = true;
        }
    }
    /* prefill: every prompt in one step */
    for (int i = 0; i < ns; i++)
        chunks[i] = (st_seq_chunk_t){.slot = seqs[i].slot, .n_tokens = seqs[i].n_prompt, .tokens = seqs[i].toks, .all_logits = dump != NULL};
    double t0 = st_time_sec();
    if (st_engine_step(e, chunks, ns, logits) != ST_OK) {
        fprintf(stderr, "strata run: prefill failed: %s\n", st_err_last());
        goto out_engine;
    }
    double t_prefill = st_time_sec() - t0;
    const float *row = logits;
    for (int i = 0; i < ns; i++) {
        int nrows = dump ? seqs[i].n_prompt : 1;
        if (seqs[i].dumping) st_npy_append(&seqs[i].npy, row, nrows);
        row += (size_t)(nrows - 1) * V;
        int tok = st_sample(row, V, &sp, &rng, ws);
        row += V;
        seqs[i].toks[seqs[i].n_prompt + seqs[i].n_gen++] = tok;
        seqs[i].done = seqs[i].n_gen >= max_tokens || (!ignore_eos && tok == c->eos_id);
    }
    /* decode: all unfinished sequences together, one token each per step; greedy without a dump
     * takes the engine's argmax (st_sample's greedy rule) instead of a logits row */
    bool greedy = sp.temperature <= 0.0f && !dump;
    double t1 = st_time_sec();
    int decoded = 0;
    for (;;) {
        int nc = 0, who[MAX_PROMPTS];
        for (int i = 0; i < ns; i++) {
            if (seqs[i].done) continue;
            who[nc] = i;
            chunks[nc++] = (st_seq_chunk_t){.slot = seqs[i].slot, .n_tokens = 1,
                                            .tokens = &seqs[i].toks[seqs[i].n_prompt + seqs[i].n_gen - 1],
                                            .argmax = greedy ? &seqs[i].amax : NULL};
        }
        if (nc == 0) break;
        if (st_engine_step(e, chunks, nc, logits) != ST_OK) {
            fprintf(stderr, "strata run: decode failed: %s\n", st_err_last());
            goto out_engine;
        }
        decoded += nc;
        for (int j = 0; j < nc; j++) {
            st_run_seq_t *q = &seqs[who[j]];
            const float *lr = logits + (size_t)j * V;
            if (q->dumping) st_npy_append(&q->npy, lr, 1);
            int tok = greedy ? q->amax : st_sample(lr, V, &sp, &rng, ws);
            q->toks[q->n_prompt + q->n_gen++] = tok;
            q->done = q->n_gen >= max_tokens || (!ignore_eos && tok == c->eos_id);
        }
    }
    double t_decode = st_time_sec() - t1;
    for (int i = 0; i < ns; i++) {
        if (ns > 1) printf("[%d] ", i);
        if (print_tokens) {
            for (int t = 0; t < seqs[i].n_gen; t++) printf("%s%d", t ? "," : "", seqs[i].toks[seqs[i].n_prompt + t]);
        } else {
            char *txt = malloc((size_t)seqs[i].n_gen + 1);
            int nb = st_tok_decode(seqs[i].toks + seqs[i].n_prompt, seqs[i].n_gen, txt, seqs[i].n_gen + 1);
            fwrite(txt, 1, (size_t)nb, stdout);
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
    free(logits);
    free(ws);
    for (int i = 0; i < ns; i++) free(seqs[i].toks);
    st_ckpt_close(ck);
    return rc;
}
