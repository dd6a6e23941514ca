/* `strata eval`: teacher-forced held-out loss of a checkpoint on a text file — nats/token,
 * bits/byte and next-token accuracy — on the CPU engine or, built with CUDA, the GPU engine.
 * The protocol is tools/train/train.py's (heldout()): the text's ids (the checkpoint's tokenizer,
 * specials off) are cut into windows of --ctx ids; a window is fed as BOS + its ids but the last,
 * from a fresh sequence, and predicts its ids, so every id is predicted once. Windows run --batch
 * at a time as separate sequences of one engine step. Not a benchmark: it reads every logit.
 * --routing quantile (SPEC §7) evaluates the text twice on one engine: top-k, recording every router
 * score, then with each MoE layer's thresholds τ_j set to the exact (1 − k/n) quantile of expert j's
 * scores over that pass (settled thresholds, calibrated on the text itself), and prints both losses,
 * their difference and the per-expert loads of both passes against (k/n)·N. The scores are kept in
 * memory: tokens × MoE layers × experts floats. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include "cli.h"
#include "strata/engine.h"

typedef struct {
    double nll;          /* Σ −log p(target) */
    long long n, correct;
} eval_acc_t;

/* One row: −log softmax(row)[target] in double, and whether target is the row's argmax (ties: the
 * lower id, as the training code's argmax). -1 (nothing added) when a logit is NaN or Inf. */
static int score_row(const float *row, int V, int target, eval_acc_t *a) {
    int am = 0;
    float mx = row[0];
    for (int v = 0; v < V; v++) {
        if (!isfinite(row[v])) return -1;
        if (row[v] > mx) mx = row[v], am = v;
    }
    double sum = 0;
    for (int v = 0; v < V; v++) sum += exp((double)row[v] - (double)mx);
    a->nll += log(sum) - ((double)row[target] - (double)mx);
    a->correct += am == target;
    a->n++;
    return 0;
}

/* Route observer: per-(layer, expert) token counts; while recording, every token's scores. */
typedef struct {
    const st_config_t *c;
    uint64_t *load;  /* [n_layers][n] */
    float *scores;   /* [n_layers][cap][n] while recording, else NULL */
    size_t *n_rec;   /* [n_layers] rows recorded */
    size_t cap;
} eval_obs_t;

static void observe(void *ctx, int layer, int T, int n, const float *scores, const int *ids, const int *cnt,
                    int kmax) {
    eval_obs_t *o = ctx;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < cnt[t]; i++) o->load[(size_t)layer * n + (size_t)ids[(size_t)t * kmax + i]]++;
    if (!o->scores || !scores) return;
    size_t r = o->n_rec[layer], take = ST_MIN((size_t)T, o->cap - r);
    memcpy(o->scores + ((size_t)layer * o->cap + r) * (size_t)n, scores, take * (size_t)n * sizeof(float));
    o->n_rec[layer] = r + take;
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* τ[l][j] = the score of rank ceil((1 − k/n)·N) (1-based, ascending) of expert j at layer l: about
 * (k/n)·N of the pass's tokens score at least τ. Rows of dense layers are NaN (top-k, unused). */
static void calibrate(const eval_obs_t *o, float *tau, float *col) {
    const st_config_t *c = o->c;
    int n = c->n_experts;
    for (int l = 0; l < c->n_layers; l++) {
        size_t N = o->n_rec[l];
        for (int j = 0; j < n; j++) {
            if (!st_config_is_moe_layer(c, l) || N == 0) {
                tau[(size_t)l * n + j] = NAN;
                continue;
            }
            for (size_t t = 0; t < N; t++) col[t] = o->scores[((size_t)l * o->cap + t) * (size_t)n + (size_t)j];
            qsort(col, N, sizeof(float), cmp_float);
            size_t r = (size_t)ceil((1.0 - (double)c->top_k / n) * (double)N);
            tau[(size_t)l * n + j] = col[r > 0 ? r - 1 : 0];
        }
    }
}

/* Worst per-expert load against (k/n)·N over the MoE layers: max of max_j, min of min_j. */
static void load_stats(const eval_obs_t *o, long long n_tok, double *mx, double *mn) {
    const st_config_t *c = o->c;
    int n = c->n_experts;
    double target = (double)c->top_k / n * (double)n_tok;
    *mx = 0, *mn = INFINITY;
    for (int l = 0; l < c->n_layers; l++) {
        if (!st_config_is_moe_layer(c, l)) continue;
        for (int j = 0; j < n; j++) {
            double r = (double)o->load[(size_t)l * n + j] / target;
            *mx = fmax(*mx, r), *mn = fmin(*mn, r);
        }
    }
}

/* One teacher-forced pass over the text's windows, `batch` windows per engine step; 0, or -1 with the
 * error printed. toks [batch·ctx], chunks [batch], logits [batch·ctx·V]: the caller's buffers. */
static int run_pass(st_engine_t *e, const st_tok_ids_t *ids, int bos, int ctx, int batch, int V, int *toks,
                    st_seq_chunk_t *chunks, float *logits, eval_acc_t *acc) {
    size_t n_win = (ids->n + (size_t)ctx - 1) / (size_t)ctx;
    *acc = (eval_acc_t){0};
    for (size_t w0 = 0; w0 < n_win; w0 += (size_t)batch) {
        int nb = (int)ST_MIN((size_t)batch, n_win - w0), opened = 0;
        st_status_t s = ST_OK;
        for (int i = 0; i < nb && s == ST_OK; i++) {
            size_t s0 = (w0 + (size_t)i) * (size_t)ctx;
            int n = (int)ST_MIN((size_t)ctx, ids->n - s0);
            int *t = toks + (size_t)i * ctx;
            t[0] = bos;
            for (int j = 1; j < n; j++) t[j] = ids->ids[s0 + (size_t)j - 1];
            chunks[i] = (st_seq_chunk_t){.n_tokens = n, .tokens = t, .all_logits = true};
            if ((s = st_engine_seq_open(e, &chunks[i].slot)) == ST_OK) opened++;
        }
        if (s == ST_OK) s = st_engine_step(e, chunks, nb, logits);
        for (int i = 0; i < opened; i++) st_engine_seq_close(e, chunks[i].slot);
        if (s != ST_OK) {
            fprintf(stderr, "strata eval: %s\n", st_err_last());
            return -1;
        }
        const float *row = logits;
        for (int i = 0; i < nb; i++) {
            size_t base = (w0 + (size_t)i) * (size_t)ctx;
            for (int j = 0; j < chunks[i].n_tokens; j++, row += V) {
                if (score_row(row, V, ids->ids[base + (size_t)j], acc) != 0) {
                    fprintf(stderr, "strata eval: non-finite logits at token %zu\n", base + (size_t)j);
                    return -1;
                }
            }
        }
    }
    return 0;
}

static int pos_int(const char *flag, const char *v, int hi, int *out) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < 1 || x > hi) {
        fprintf(stderr, "strata eval: %s takes an integer 1..%d (got '%s')\n", flag, hi, v);
        return -1;
    }
    *out = (int)x;
    return 0;
}

int st_cmd_eval(int argc, char **argv) {
    const char *ckdir = NULL, *path = NULL;
    int ctx = 512, batch = 8, json = 0, quantile = 0;
    st_engine_opts_t eo;
    st_engine_opts_default(&eo);
    for (int i = 0; i < argc; i++) {
        const char *v;
        if ((v = st_cli_opt(argc, argv, &i, "--ckpt"))) ckdir = v;
        else if ((v = st_cli_opt(argc, argv, &i, "--text"))) path = v;
        else if ((v = st_cli_opt(argc, argv, &i, "--ctx"))) { if (pos_int("--ctx", v, 1 << 20, &ctx)) return 2; }
        else if ((v = st_cli_opt(argc, argv, &i, "--batch"))) { if (pos_int("--batch", v, 4096, &batch)) return 2; }
        else if ((v = st_cli_opt(argc, argv, &i, "--device"))) {
            char *end = NULL;
            if (!strcmp(v, "cpu")) eo.device = -1;
            else if (!strncmp(v, "cuda:", 5) && (eo.device = (int)strtol(v + 5, &end, 10)) >= 0 && end != v + 5 && !*end) {}
            else { fprintf(stderr, "strata eval: --device must be cpu or cuda:N\n"); return 2; }
        } else if ((v = st_cli_opt(argc, argv, &i, "--routing"))) {
            if (!strcmp(v, "topk")) quantile = 0;
            else if (!strcmp(v, "quantile")) quantile = 1;
            else { fprintf(stderr, "strata eval: --routing must be topk or quantile\n"); return 2; }
        } else if (!strcmp(argv[i], "--json")) json = 1;
        else { fprintf(stderr, "strata eval: unknown option %s\n", argv[i]); return 2; }
    }
    if (!ckdir || !path) {
        fprintf(stderr, "strata eval: need --ckpt DIR and --text FILE\n");
        return 2;
    }
    int rc = 1;
    char *text = NULL;
    size_t len = 0;
    st_tok_ids_t ids = {0};
    st_tokenizer_t *tk = NULL;
    st_ckpt_t *ck = NULL;
    st_engine_t *e = NULL;
    float *logits = NULL, *tau = NULL, *col = NULL;
    int *toks = NULL;
    eval_obs_t obs = {0};
    st_seq_chunk_t *chunks = NULL;
    if (st_file_read_all(path, &text, &len) != ST_OK) {
        fprintf(stderr, "strata eval: %s\n", st_err_last());
        return 1;
    }
    st_tokenizer_opts_t to = {.quiet = true};
    if (st_tokenizer_load(&tk, ckdir, &to) != ST_OK || st_tokenizer_encode(tk, text, len, 0, &ids) != ST_OK) {
        fprintf(stderr, "strata eval: %s\n", st_err_last());
        goto out;
    }
    if (ids.n == 0) {
        fprintf(stderr, "strata eval: %s has no tokens\n", path);
        goto out;
    }
    if (st_ckpt_open(&ck, ckdir) != ST_OK) {
        fprintf(stderr, "strata eval: %s\n", st_err_last());
        goto out;
    }
    const st_config_t *c = st_ckpt_config(ck);
    int bos = st_tokenizer_bos(tk) >= 0 ? st_tokenizer_bos(tk) : c->bos_id, V = c->vocab;
    if (bos < 0) {
        fprintf(stderr, "strata eval: %s names no BOS token (config.json bos_token_id)\n", ckdir);
        goto out;
    }
    size_t n_win = (ids.n + (size_t)ctx - 1) / (size_t)ctx;
    if ((size_t)batch > n_win) batch = (int)n_win;
    eo.max_seqs = batch;
    eo.max_ctx = ctx;
    eo.max_batch_tokens = batch * ctx;
    if (quantile && c->n_experts == 0) {
        fprintf(stderr, "strata eval: --routing quantile: %s has no MoE layers\n", ckdir);
        goto out;
    }
    eo.routing = quantile ? ST_ROUTE_QUANTILE : ST_ROUTE_TOPK; /* quantile mode routes top-k until τ is set */
    if (st_engine_create(&e, ck, &eo) != ST_OK) {
        fprintf(stderr, "strata eval: %s\n", st_err_last());
        goto out;
    }
    obs.c = c;
    obs.load = calloc((size_t)c->n_layers * (size_t)ST_MAX(c->n_experts, 1), sizeof *obs.load);
    obs.n_rec = calloc((size_t)c->n_layers, sizeof *obs.n_rec);
    if (quantile) {
        obs.cap = ids.n;
        obs.scores = malloc((size_t)c->n_layers * obs.cap * (size_t)c->n_experts * sizeof(float));
        tau = malloc((size_t)c->n_layers * (size_t)c->n_experts * sizeof(float));
        col = malloc(obs.cap * sizeof(float));
        if (!obs.scores || !tau || !col) {
            fprintf(stderr, "strata eval: no memory for the router scores of %zu tokens\n", ids.n);
            goto out;
        }
    }
    if (!obs.load || !obs.n_rec) {
        fprintf(stderr, "strata eval: no memory\n");
        goto out;
    }
    if (c->n_experts > 0) st_engine_set_route_observer(e, observe, &obs, obs.scores != NULL);
    logits = malloc((size_t)batch * (size_t)ctx * (size_t)V * sizeof(float));
    toks = malloc((size_t)batch * (size_t)ctx * sizeof(int));
    chunks = calloc((size_t)batch, sizeof *chunks);
    if (!logits || !toks || !chunks) {
        fprintf(stderr, "strata eval: no memory for %d windows of %d tokens\n", batch, ctx);
        goto out;
    }
    eval_acc_t res[2] = {{0}};
    double mx[2] = {0}, mn[2] = {0};
    double t0 = st_time_sec();
    for (int pass = 0; pass <= quantile; pass++) {
        if (pass == 1) { /* settled thresholds from pass 0's scores; loads counted afresh */
            calibrate(&obs, tau, col);
            st_engine_set_thresholds(e, tau, 1);
            free(obs.scores);
            obs.scores = NULL;
            memset(obs.load, 0, (size_t)c->n_layers * (size_t)c->n_experts * sizeof *obs.load);
        }
        if (run_pass(e, &ids, bos, ctx, batch, V, toks, chunks, logits, &res[pass]) != 0) goto out;
        if (c->n_experts > 0) load_stats(&obs, res[pass].n, &mx[pass], &mn[pass]);
    }
    eval_acc_t acc = res[quantile];
    double dt = st_time_sec() - t0, npt = acc.nll / (double)acc.n, bpb = acc.nll / log(2.0) / (double)len;
    double accuracy = (double)acc.correct / (double)acc.n, npt0 = res[0].nll / (double)res[0].n;
    if (json) {
        printf("{\"tokens\": %lld, \"bytes\": %zu, \"ctx\": %d, \"nats_per_token\": %.6f, \"bits_per_byte\": %.6f, "
               "\"accuracy\": %.6f",
               acc.n, len, ctx, npt, bpb, accuracy);
        if (c->n_experts > 0)
            printf(", \"routing\": \"%s\", \"load_max_over_target\": %.4f, \"load_min_over_target\": %.4f",
                   quantile ? "quantile" : "topk", mx[quantile], mn[quantile]);
        if (quantile)
            printf(", \"topk_nats_per_token\": %.6f, \"topk_load_max_over_target\": %.4f, "
                   "\"topk_load_min_over_target\": %.4f, \"delta_nats_per_token\": %.6f",
                   npt0, mx[0], mn[0], npt - npt0);
        printf("}\n");
    } else {
        printf("tokens %lld (%zu bytes, %zu windows of %d)\nnats/token %.4f\nbits/byte %.4f\naccuracy %.4f\n", acc.n,
               len, n_win, ctx, npt, bpb, accuracy);
        if (quantile)
            printf("routing quantile (thresholds settled on this text) vs top-k: nats/token %.4f vs %.4f (delta %+.4f)\n"
                   "expert load / (k/n)N over MoE layers: quantile max %.3f min %.3f; top-k max %.3f min %.3f\n",
                   npt, npt0, npt - npt0, mx[1], mn[1], mx[0], mn[0]);
        else if (c->n_experts > 0)
            printf("expert load / (k/n)N over MoE layers (top-k): max %.3f min %.3f\n", mx[0], mn[0]);
    }
    fprintf(stderr, "strata eval: %lld tokens in %.2f s (%.0f tokens/s, %s)\n", acc.n, dt, acc.n / (dt > 0 ? dt : 1),
            eo.device >= 0 ? "GPU" : "CPU");
    rc = 0;
out:
    free(obs.scores);
    free(obs.load);
    free(obs.n_rec);
    free(tau);
    free(col);
    free(chunks);
    free(toks);
    free(logits);
    st_engine_destroy(e);
    st_ckpt_close(ck);
    st_tok_ids_free(&ids);
    st_tokenizer_destroy(tk);
    free(text);
    return rc;
}
