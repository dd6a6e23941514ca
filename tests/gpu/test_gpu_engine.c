/* GPU engine vs CPU engine (SPEC §8 as written), on the presets named on the command line (default
 * small, where §8's bounds were set; ctest runs k3-mini as its own entry). With the CPU's routing
 * forced on the GPU through the route hook and the positions whose choice flipped counted:
 *  - every sublayer fed the CPU's input (teacher forcing through the trace hook): relative L2 ≤ 2e-2;
 *  - end to end: relative L2 of the logits ≤ 5e-2 at the worst position and ≤ 3e-2 on average over
 *    the positions whose logits a run returns (each prompt's last position and every decode step) of
 *    several prompts; every prompt position's figure is printed too (all_logits), not checked;
 *  - greedy decoding (16 decode steps, several prompts): vLLM's check_logprobs_close rule with the
 *    SPEC's near-tie condition — where the tokens first differ, each side's token is in the other's
 *    top 5 and the CPU's top-two gap is ≤ 4× that step's RMS logit error; later steps not compared;
 *  - a NaN or Inf anywhere fails.
 * Also: the device argmax, decode steps as CUDA graphs vs plain launches (bit for bit), the
 * micro-batch hand-off (experts computed on the host), two micro-batches overlapped on their own
 * streams with routing on the device, and a chunked prompt. Exit 77 without a GPU. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "strata/engine.h"
#include "strata/gpu.h"
#include "strata/kernels.h"
#include "strata/model.h"

#define MAX_CALLS 4096

/* routing record of the CPU run: one entry per hook call (step × MoE layer), in call order */
typedef struct {
    int T, kc;
    int *ids, *cnt;
} rcall_t;
typedef struct {
    rcall_t calls[MAX_CALLS];
    int n, pos;         /* recorded calls; replay cursor */
    int bad;            /* replayed calls whose shape (T, kmax) did not match the recording */
    bool force;         /* replay overwrites the GPU's choice */
    long flips, tokens; /* token-layer positions whose expert set differed */
} rrec_t;

static void rec_hook(void *ctx, int layer, int T, int n, const float *scores, int *ids, int *cnt, int kmax) {
    rrec_t *r = ctx;
    (void)layer, (void)n, (void)scores;
    if (r->n == MAX_CALLS) return;
    rcall_t *c = &r->calls[r->n++];
    c->T = T, c->kc = kmax;
    c->ids = malloc((size_t)T * kmax * sizeof(int));
    c->cnt = malloc((size_t)T * sizeof(int));
    memcpy(c->ids, ids, (size_t)T * kmax * sizeof(int));
    memcpy(c->cnt, cnt, (size_t)T * sizeof(int));
}

static void force_hook(void *ctx, int layer, int T, int n, const float *scores, int *ids, int *cnt, int kmax) {
    rrec_t *r = ctx;
    (void)layer, (void)n, (void)scores;
    if (r->pos >= r->n) return;
    rcall_t *c = &r->calls[r->pos++];
    if (c->T != T || c->kc != kmax) {
        r->bad++;
        return;
    }
    for (int t = 0; t < T; t++) {
        bool same = cnt[t] == c->cnt[t];
        for (int i = 0; same && i < cnt[t]; i++) same = ids[(size_t)t * kmax + i] == c->ids[(size_t)t * kmax + i];
        r->flips += !same;
        r->tokens++;
    }
    if (r->force) {
        memcpy(ids, c->ids, (size_t)T * kmax * sizeof(int));
        memcpy(cnt, c->cnt, (size_t)T * sizeof(int));
    }
}

/* ---- per-sublayer trace (engine.h ST_TRACE_*): the CPU run records every point in call order; a
 * GPU run compares point by point (relative L2 per layer and point, prompt and decode apart) and,
 * in teacher mode, overwrites its partial sums with the CPU's so each sublayer's error is its own. */
typedef struct {
    int l, pt, T, w;
    float *x;
} tent_t;
typedef struct {
    tent_t *e;
    int n, cap, pos;
    bool record, teacher;
    int L, B;
    double num[33][ST_TRACE_N][2], den[33][ST_TRACE_N][2];
    double cnum[33][2][2], cden[33][2][2]; /* sublayer contribution: [l][0 attn, 1 ffn][prompt, decode] */
    int mismatch;
    /* the worst single token's sublayer error: value, layer, sublayer (0 attn, 1 ffn), token index
     * in its step, step kind (0 prompt, 1 decode) */
    double tmax;
    int tmax_l, tmax_sl, tmax_t, tmax_ph;
} trec_t;

static const char *tp_name[ST_TRACE_N] = {"in", "xn_a", "kda_q", "kda_k", "kda_v", "kda_g", "kda_o", "mla_q",
                                          "attn_o", "mid", "xn_f", "moe_z", "moe_u"};

static void trace_hook(void *ctx, int l, int pt, int T, int w, float *x) {
    trec_t *r = ctx;
    if (r->record) {
        if (r->n == r->cap) {
            r->cap = r->cap ? 2 * r->cap : 1024;
            r->e = realloc(r->e, (size_t)r->cap * sizeof(tent_t));
        }
        tent_t *e = &r->e[r->n++];
        *e = (tent_t){.l = l, .pt = pt, .T = T, .w = w, .x = malloc((size_t)T * w * sizeof(float))};
        memcpy(e->x, x, (size_t)T * w * sizeof(float));
        return;
    }
    if (r->pos >= r->n) { r->mismatch++; return; }
    int i = r->pos++;
    const tent_t *e = &r->e[i];
    if (e->l != l || e->pt != pt || e->T != T || e->w != w) { r->mismatch++; return; }
    int ph = T > 1 ? 0 : 1, li = l < 32 ? l : 32;
    size_t n = (size_t)T * w;
    double num = 0, den = 0;
    for (size_t j = 0; j < n; j++) {
        double dd = (double)x[j] - e->x[j];
        num += dd * dd, den += (double)e->x[j] * e->x[j];
    }
    r->num[li][pt][ph] += num, r->den[li][pt][ph] += den;
    /* the sublayer's own contribution: attention at "mid" (layer l), FFN at "in" of layer l+1 */
    int want = pt == ST_TRACE_PARTIAL_MID ? ST_TRACE_PARTIAL_IN : pt == ST_TRACE_PARTIAL_IN && l > 0 ? ST_TRACE_PARTIAL_MID : -1;
    if (want >= 0) {
        int pl = pt == ST_TRACE_PARTIAL_MID ? l : l - 1;
        bool reset = pt == ST_TRACE_PARTIAL_MID && r->B > 0 && l % r->B == 0; /* block start: partial = a */
        const tent_t *p = NULL;
        for (int k = i - 1; k >= 0 && !p; k--)
            if (r->e[k].pt == want && r->e[k].l == pl) p = &r->e[k];
        if (p) {
            double cd = 0;
            int sl = pt == ST_TRACE_PARTIAL_MID ? 0 : 1, ci = pl < 32 ? pl : 32;
            for (int t = 0; t < T; t++) {
                double nt = 0, dt = 0;
                for (int j = t * w; j < (t + 1) * w; j++) {
                    double c = reset ? e->x[j] : (double)e->x[j] - p->x[j], dd = (double)x[j] - e->x[j];
                    nt += dd * dd, dt += c * c;
                }
                cd += dt;
                if (dt > 0 && sqrt(nt / dt) > r->tmax)
                    r->tmax = sqrt(nt / dt), r->tmax_l = pl, r->tmax_sl = sl, r->tmax_t = t, r->tmax_ph = ph;
            }
            r->cnum[ci][sl][ph] += num, r->cden[ci][sl][ph] += cd;
        }
    }
    if (r->teacher && (pt == ST_TRACE_PARTIAL_IN || pt == ST_TRACE_PARTIAL_MID)) memcpy(x, e->x, n * sizeof(float));
}

static void trace_reset(trec_t *r, bool teacher) {
    r->record = false, r->teacher = teacher, r->pos = 0, r->mismatch = 0;
    memset(r->num, 0, sizeof r->num), memset(r->den, 0, sizeof r->den);
    memset(r->cnum, 0, sizeof r->cnum), memset(r->cden, 0, sizeof r->cden);
    r->tmax = 0;
}

static double rr(double n, double d) { return d > 0 ? sqrt(n / d) : -1; }

/* Prints the table; returns the worst sublayer error (attention or FFN, prompt or decode). */
static double trace_report(const trec_t *r, const st_config_t *c, const char *what) {
    printf("-- %s: relative L2 per layer and point (prompt / decode; sub_a, sub_f = the attention / FFN "
           "sublayer's output error relative to that sublayer's own output)%s\n", what,
           r->mismatch ? " TRACE MISMATCH" : "");
    for (int l = 0; l <= r->L && l < 33; l++) {
        printf("  L%-2d %s", l, l == r->L ? "out" : c->is_mla[l] ? "MLA" : "KDA");
        for (int pt = 0; pt < ST_TRACE_N; pt++) {
            if (r->den[l][pt][0] <= 0 && r->den[l][pt][1] <= 0) continue;
            printf(" %s %.1e/%.1e", tp_name[pt], rr(r->num[l][pt][0], r->den[l][pt][0]), rr(r->num[l][pt][1], r->den[l][pt][1]));
        }
        if (l < r->L)
            printf(" | sub_a %.1e/%.1e sub_f %.1e/%.1e", rr(r->cnum[l][0][0], r->cden[l][0][0]),
                   rr(r->cnum[l][0][1], r->cden[l][0][1]), rr(r->cnum[l][1][0], r->cden[l][1][0]),
                   rr(r->cnum[l][1][1], r->cden[l][1][1]));
        printf("\n");
    }
    printf("RESULT %s: worst sublayer error (prompt/decode):", what);
    double wa = 0, wf = 0;
    int la = -1, lf = -1;
    for (int l = 0; l < r->L && l < 32; l++) {
        double a = fmax(rr(r->cnum[l][0][0], r->cden[l][0][0]), rr(r->cnum[l][0][1], r->cden[l][0][1]));
        double f = fmax(rr(r->cnum[l][1][0], r->cden[l][1][0]), rr(r->cnum[l][1][1], r->cden[l][1][1]));
        if (a > wa) wa = a, la = l;
        if (f > wf) wf = f, lf = l;
    }
    printf(" attention %.2e (L%d), ffn %.2e (L%d); worst single token %.2e (L%d %s, %s token %d)\n", wa, la, wf, lf,
           r->tmax, r->tmax_l, r->tmax_sl ? "ffn" : "attention", r->tmax_ph ? "decode" : "prompt", r->tmax_t);
    return fmax(wa, wf);
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static double rel_l2(const float *a, const float *ref, int n, int *nonfinite) {
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        if (!isfinite(a[i])) (*nonfinite)++;
        if (!isfinite(ref[i])) (*nonfinite)++;
        double e = (double)a[i] - ref[i];
        num += e * e;
        den += (double)ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

/* SPEC §8 bounds, GPU vs CPU */
#define SPEC_SUBLAYER 2e-2  /* every sublayer fed the CPU's input, CPU routing */
#define SPEC_E2E_WORST 5e-2 /* end to end, routing forced: worst position */
#define SPEC_E2E_MEAN 3e-2  /* ... mean over positions */
#define SPEC_TOP 5          /* greedy: each side's token in the other's top 5 where they first differ */
#define SPEC_NEAR_TIE 4.0   /* ... and the CPU's top-two gap ≤ 4× the step's RMS logit error */
#define N_PROMPTS 3         /* "several prompts" */

static int prompt_chunk; /* > 0: run_seq feeds the prompt in chunks of this many tokens (chunked prefill) */
static int *argmax_out;  /* set: run_seq asks for the argmax of each step's row (st_seq_chunk_t.argmax) */
static bool all_rows;    /* run_seq asks for every prompt row: logits [np + steps, V]; else [1 + steps, V] */

/* One sequence: prefill prompt [np], then steps decode tokens (toks[np + i] when feed, else greedy
 * from this engine's own logits, written to toks). Seconds of prefill and decode in *tp, *td. */
static st_status_t run_seq(st_engine_t *e, int *toks, int np, int steps, bool feed, float *logits, int V, double *tp,
                           double *td) {
    int slot;
    st_status_t s = st_engine_seq_open(e, &slot);
    if (s != ST_OK) return s;
    double t0 = st_time_sec();
    st_seq_chunk_t ch;
    float *row = logits;
    for (int p0 = 0; s == ST_OK && p0<np; p0 += prompt_chunk> 0 ? prompt_chunk : np) {
        int n = prompt_chunk > 0 && np - p0 > prompt_chunk ? prompt_chunk : np - p0;
        ch = (st_seq_chunk_t){
            .slot = slot, .n_tokens = n, .tokens = toks + p0, .argmax = argmax_out, .all_logits = all_rows};
        s = st_engine_step(e, &ch, 1, row);
        if (all_rows) row += (size_t)n * V;
    }
    const float *last = all_rows ? row - V : row; /* the prompt's last row */
    double t1 = st_time_sec();
    for (int i = 0; s == ST_OK && i < steps; i++) {
        if (!feed) toks[np + i] = argmax(last + (size_t)i * V, V);
        ch = (st_seq_chunk_t){
            .slot = slot, .n_tokens = 1, .tokens = &toks[np + i], .argmax = argmax_out ? argmax_out + i + 1 : NULL};
        s = st_engine_step(e, &ch, 1, (float *)last + (size_t)(i + 1) * V);
    }
    double t2 = st_time_sec();
    st_engine_seq_close(e, slot);
    *tp = t1 - t0, *td = t2 - t1;
    return s;
}

/* End to end, routing forced: relative L2 of rows [r0, rows) (positions; every row is printed at its
 * position when r0 > 0, the rest summarised); adds them to *sum, *n and the worst to *worst; counts
 * non-finite values in every row. */
static void e2e_rows(const char *what, const float *gpu, const float *cpu, int r0, int rows, int V, double *worst,
                     double *sum, int *n, int *nonfin) {
    double w = 0, m = 0, wa = 0, ma = 0;
    int at = 0, ata = 0;
    for (int i = 0; i < rows; i++) {
        double r = rel_l2(gpu + (size_t)i * V, cpu + (size_t)i * V, V, nonfin);
        if (r > wa) wa = r, ata = i;
        ma += r;
        if (i < r0) continue;
        if (r > w) w = r, at = i;
        m += r;
    }
    *worst = fmax(*worst, w), *sum += m, *n += rows - r0;
    printf("%s: logits rel L2 over %d positions%s: worst %.3e (position %d), mean %.3e", what, rows - r0,
           r0 > 0 ? " (those whose logits a run returns)" : "", w, at, m / (rows - r0));
    if (r0 > 0)
        printf("; over all %d positions (prompt rows too, not checked): worst %.3e (position %d), mean %.3e", rows, wa,
               ata, ma / rows);
    printf("\n");
}

/* Rank of token t in row x (how many logits are strictly larger): in the top k iff rank < k. */
static int rank_of(const float *x, int V, int t) {
    int r = 0;
    for (int v = 0; v < V; v++)
        r += x[v] > x[t];
    return r;
}

/* SPEC §8 greedy rule over rows [0, n) (row i gives greedy token i): vLLM's check_logprobs_close
 * (tests/models/utils.py: at the first differing token each side's token must be in the other
 * side's top-N, N = 5, and the comparison of that sequence stops there), plus the SPEC's near-tie
 * condition: the CPU's top-two gap at that step ≤ 4× the step's RMS logit error. Returns the first
 * differing step, or -1 when all n tokens agree. */
static int greedy_rule(const char *what, const float *gpu, const float *cpu, int n, int V) {
    for (int i = 0; i < n; i++) {
        const float *g = gpu + (size_t)i * V, *c = cpu + (size_t)i * V;
        int ag = argmax(g, V), ac = argmax(c, V);
        if (ag == ac) continue;
        double se = 0, second = -INFINITY;
        for (int v = 0; v < V; v++) {
            se += ((double)g[v] - c[v]) * ((double)g[v] - c[v]);
            if (v != ac && c[v] > second) second = c[v];
        }
        se = sqrt(se / V);
        double gap = (double)c[ac] - second;
        int rg = rank_of(c, V, ag), rc = rank_of(g, V, ac);
        printf("%s: greedy tokens first differ at step %d: cpu %d, gpu %d; gpu's token is #%d in the cpu's row, cpu's "
               "#%d in the gpu's; cpu top-two gap %.3e = %.2f x the RMS logit error %.3e\n",
               what, i, ac, ag, rg + 1, rc + 1, gap, gap / (se > 0 ? se : 1), se);
        CHECK(rg < SPEC_TOP && rc < SPEC_TOP, "%s step %d: a token outside the other side's top %d (#%d, #%d)", what, i,
              SPEC_TOP, rg + 1, rc + 1);
        CHECK(gap <= SPEC_NEAR_TIE * se, "%s step %d: tokens differ beyond a near-tie (gap %.3e > %.0f x %.3e)", what,
              i, gap, SPEC_NEAR_TIE, se);
        return i;
    }
    printf("%s: all %d greedy tokens agree\n", what, n);
    return -1;
}

/* The experts of a hand-off on the host, fp32, from its rows (zb widened into zf [T, ew]) into w->out
 * (row t*kc + i); *ws grows on first use. */
static void host_experts(const st_ckpt_t *ck, const st_moe_work_t *w, float *zf, float **ws) {
    const st_config_t *c = st_ckpt_config(ck);
    const float *z = w->z;
    if (w->zb) {
        for (size_t i = 0; i < (size_t)w->T * w->ew; i++) zf[i] = st_bf16_to_f32(w->zb[i]);
        z = zf;
    }
    for (int t = 0; t < w->T; t++)
        for (int i = 0; i < w->cnt[t]; i++) {
            st_expert_weights_t x;
            if (st_ckpt_expert(ck, w->layer, w->ids[(size_t)t * w->kc + i], &x) != ST_OK) continue;
            if (!*ws) *ws = malloc(st_ffn_ws_floats(1, &x.gate, &x.up, &x.down) * sizeof(float));
            st_ffn(w->out + ((size_t)t * w->kc + i) * w->ew, z + (size_t)t * w->ew, 1, &x.gate, &x.up, &x.down, c->act,
                   c->situ_beta1, c->situ_beta2, *ws);
        }
}

/* st_engine_mb_copy_z at a hand-off: z's rows in two runs (the second half first, into the first
 * half of a registered buffer) equal to work->zb's; a run past the tokens is refused. */
static void copy_z_check(st_engine_t *e, st_engine_mb_t *mb, const st_moe_work_t *w) {
    size_t rb = (size_t)w->ew * sizeof(uint16_t);
    uint8_t *buf = st_engine_host_alloc(e, (size_t)w->T * rb);
    CHECK(buf != NULL, "host alloc for the copied rows");
    if (!buf) return;
    int h = w->T / 2, first[2] = {h, 0}, count[2] = {w->T - h, h};
    void *dst[2] = {buf, buf + (size_t)(w->T - h) * rb};
    CHECK(st_engine_mb_copy_z(mb, first, count, dst, 2) == ST_OK, "copy_z: %s", st_err_last());
    CHECK(!memcmp(buf, (const uint8_t *)w->zb + (size_t)h * rb, (size_t)(w->T - h) * rb) &&
              !memcmp(buf + (size_t)(w->T - h) * rb, w->zb, (size_t)h * rb),
          "copy_z rows equal the hand-off's zb (layer %d, %d tokens)", w->layer, w->T);
    int bad_first = w->T - 1, bad_count = 2;
    void *bad_dst = buf;
    CHECK(st_engine_mb_copy_z(mb, &bad_first, &bad_count, &bad_dst, 1) == ST_ERR_INVALID_ARG,
          "copy_z refuses rows past the hand-off's tokens");
    st_engine_host_free(e, buf);
}

/* Host tables of a plan for S servers (C scratch included), zeroed, one block; free(p.n_rows). */
static st_moe_plan_t plan_new(int S, int E, int M, int kc) {
    st_moe_plan_t p;
    st_moe_plan_carve(&p, S, E, M, kc, calloc(1, st_moe_plan_bytes(S, E, M, kc)));
    return p;
}
/* Whether two plans' tables are equal over their valid prefixes (the GPU one's scratch unused). */
static bool plan_same(const st_moe_plan_t *a, const st_moe_plan_t *b) {
    int E = a->n_experts;
    for (int s = 0; s < a->n_servers; s++) {
        size_t at = (size_t)s * a->max_rows, n = (size_t)a->n_rows[s];
        if (a->n_rows[s] != b->n_rows[s] || a->n_exp[s] != b->n_exp[s] || a->n_out[s] != b->n_out[s] ||
            a->n_uniq[s] != b->n_uniq[s] ||
            memcmp(a->exp_ids + (size_t)s * E, b->exp_ids + (size_t)s * E, 4 * (size_t)a->n_exp[s]) ||
            memcmp(a->offsets + (size_t)s * (E + 1), b->offsets + (size_t)s * (E + 1), 4 * ((size_t)a->n_exp[s] + 1)) ||
            memcmp(a->pair + at, b->pair + at, 4 * n) || memcmp(a->orow + at, b->orow + at, 4 * n) ||
            memcmp(a->src + at, b->src + at, 4 * n) || memcmp(a->wts + at, b->wts + at, 4 * n) ||
            memcmp(a->node + at, b->node + at, 4 * (size_t)a->n_out[s]) ||
            memcmp(a->utok + at, b->utok + at, 4 * (size_t)a->n_uniq[s]))
            return false;
    }
    return true;
}
/* st_engine_mb_plan at a hand-off equals st_moe_dispatch_plan over the work's routing: three servers
 * (experts scattered, one held by none, one skipped; a token flagged before), then one server of a
 * plan for four (the others get no pairs); the flags come back as the host's. */
static void plan_check(st_engine_mb_t *mb, const st_moe_work_t *w, int E) {
    int M = w->T * w->kc, *sof = malloc(sizeof(int) * (size_t)E);
    bool *fh = calloc((size_t)w->T, 1), *fd = calloc((size_t)w->T, 1);
    for (int round = 0; round < 2; round++) {
        int S = round ? 4 : 3, use = round ? 1 : 3;
        for (int e = 0; e < E; e++) sof[e] = round ? 0 : (e * 5 + 1) % 3;
        if (!round) sof[2] = ST_MOE_PLAN_NONE, sof[5] = ST_MOE_PLAN_SKIP;
        memset(fh, 0, (size_t)w->T), memset(fd, 0, (size_t)w->T);
        if (w->T > 1) fh[w->T - 1] = fd[w->T - 1] = true;
        st_moe_plan_t ref = plan_new(S, E, M, w->kc), got = plan_new(S, E, M, w->kc);
        st_moe_dispatch_plan(&ref, w->ids, w->cnt, w->wts, sof, fh, w->T, w->kc);
        st_status_t s = st_engine_mb_plan(mb, &got, use, sof, fd);
        CHECK(s == ST_OK, "mb_plan (layer %d, %d tokens): %s", w->layer, w->T, st_err_last());
        CHECK(s != ST_OK || (plan_same(&ref, &got) && !memcmp(fh, fd, (size_t)w->T)),
              "mb_plan: the device plan equals the host's (layer %d, %d tokens, %d of %d servers)", w->layer, w->T, use,
              S);
        free(ref.n_rows), free(got.n_rows);
    }
    st_moe_plan_t small = plan_new(2, E, M, w->kc);
    CHECK(st_engine_mb_plan(mb, &small, 3, sof, fd) == ST_ERR_INVALID_ARG, "mb_plan refuses more servers than p has");
    free(small.n_rows);
    free(sof), free(fh), free(fd);
}

/* The micro-batch hand-off on the GPU: experts computed on the host from work->zb (the GPU engine
 * hands z over as bf16, as it holds it), written to work->out (the remote path), against
 * st_engine_step on the same engine. */
/* One prompt through micro-batch mb with the host's experts at every hand-off: the next layers
 * launched early (queued at the collect, released after the experts) or plainly (advance). */
static void handoff_run(st_engine_t *e, st_engine_mb_t *mb, const st_ckpt_t *ck, const int *toks, int np, float *lg,
                        bool early, float *zf, float **ws) {
    int slot;
    CHECK(st_engine_seq_open(e, &slot) == ST_OK, "seq open");
    st_seq_chunk_t ch = {.slot = slot, .n_tokens = np, .tokens = toks, .all_logits = true};
    CHECK(st_engine_mb_begin(mb, &ch, 1, lg) == ST_OK, "mb begin: %s", st_err_last());
    st_moe_work_t w;
    for (int more = st_engine_mb_advance(mb, &w); more;) {
        if (!early) copy_z_check(e, mb, &w), plan_check(mb, &w, st_ckpt_config(ck)->n_experts);
        if (early) st_engine_mb_launch_early(mb);
        host_experts(ck, &w, zf, ws);
        if (early) st_engine_mb_release(mb);
        more = early ? st_engine_mb_collect(mb, &w) : st_engine_mb_advance(mb, &w);
    }
    st_engine_seq_close(e, slot);
}

static void test_handoff(st_engine_t *eg, const st_ckpt_t *ck, const int *toks, int np, int V) {
    const st_config_t *c = st_ckpt_config(ck);
    CHECK(st_engine_launches_early(eg), "the GPU engine launches early (kernels load eagerly)");
    /* reference: the same prompt through st_engine_step (experts on the device, own routing,
     * recorded); the hand-off run replays that routing, since host fp32 experts against device
     * bf16 ones flip near-tie choices downstream (SPEC §8) */
    static rrec_t hr;
    memset(&hr, 0, sizeof hr);
    float *ref = malloc((size_t)np * V * sizeof(float));
    int rs;
    CHECK(st_engine_seq_open(eg, &rs) == ST_OK, "seq open");
    st_seq_chunk_t rch = {.slot = rs, .n_tokens = np, .tokens = toks, .all_logits = true};
    st_engine_set_route_hook(eg, rec_hook, &hr);
    CHECK(st_engine_step(eg, &rch, 1, ref) == ST_OK, "reference step: %s", st_err_last());
    st_engine_seq_close(eg, rs);
    hr.force = true;
    st_engine_set_route_hook(eg, force_hook, &hr);
    st_engine_mb_t *mb;
    CHECK(st_engine_mb_create(eg, &mb) == ST_OK, "mb create: %s", st_err_last());
    int slot;
    CHECK(st_engine_seq_open(eg, &slot) == ST_OK, "seq open");
    float *lg = malloc((size_t)np * V * sizeof(float));
    st_seq_chunk_t ch = {.slot = slot, .n_tokens = np, .tokens = toks, .all_logits = true};
    CHECK(st_engine_mb_begin(mb, &ch, 1, lg) == ST_OK, "mb begin: %s", st_err_last());
    st_moe_work_t w;
    int rounds = 0;
    float *ws = NULL;
    float *zf = malloc(sizeof(float) * (size_t)np * st_config_expert_width(c));
    bool bf16_handoff = true;
    while (st_engine_mb_advance(mb, &w)) {
        rounds++;
        bf16_handoff &= w.zb != NULL && w.z == NULL;
        host_experts(ck, &w, zf, &ws);
    }
    CHECK(bf16_handoff, "the GPU engine hands z over as bf16 (zb), not fp32");
    CHECK(rounds == c->n_layers - c->first_k_dense, "one hand-off per MoE layer (%d)", rounds);
    CHECK(st_engine_seq_len(eg, slot) == np, "length advanced");
    CHECK(st_engine_mb_status(mb) == ST_OK, "hand-off step status: %s", st_status_str(st_engine_mb_status(mb)));
    int nf = 0, rows = 0;
    double worst = 0, sum = 0;
    e2e_rows("hand-off (host fp32 experts) vs device bf16 experts", lg, ref, 0, np, V, &worst, &sum, &rows, &nf);
    printf("hand-off: routing flips %ld of %ld\n", hr.flips, hr.tokens);
    /* the same, driven as the worker drives it: the next layers queued at each collect, waiting on the
     * device for the release that follows the host's experts; the same logits bit for bit. With the
     * hook the walk synchronises on the host, so the early launch leaves it to the collect; without
     * it the next layers really wait on the device: against plain launches, both routed on the GPU. */
    float *le = malloc((size_t)np * V * sizeof(float)), *lp = malloc((size_t)np * V * sizeof(float));
    hr.pos = 0; /* the same forced routing again */
    handoff_run(eg, mb, ck, toks, np, le, true, zf, &ws);
    CHECK(st_engine_mb_status(mb) == ST_OK && memcmp(le, lg, (size_t)np * V * sizeof(float)) == 0,
          "early launch (hook: a plain launch) + release: the same logits bit for bit (status %s)",
          st_status_str(st_engine_mb_status(mb)));
    st_engine_set_route_hook(eg, NULL, NULL);
    handoff_run(eg, mb, ck, toks, np, lp, false, zf, &ws);
    CHECK(st_engine_mb_status(mb) == ST_OK, "plain hand-offs, GPU routing: %s", st_status_str(st_engine_mb_status(mb)));
    double t0 = st_time_sec();
    handoff_run(eg, mb, ck, toks, np, le, true, zf, &ws);
    CHECK(st_engine_mb_status(mb) == ST_OK && memcmp(le, lp, (size_t)np * V * sizeof(float)) == 0,
          "early launch + release, GPU routing: the same logits as plain launches, bit for bit, in %.3f s (status %s)",
          st_time_sec() - t0, st_status_str(st_engine_mb_status(mb)));
    free(le), free(lp);
    for (int i = 0; i < hr.n; i++) free(hr.calls[i].ids), free(hr.calls[i].cnt);
    /* the expert sublayer computed on the CPU's side (fp32) and everything else on the GPU: an end to
     * end GPU-vs-CPU difference with routing forced, so SPEC §8's end-to-end bounds (a wrong row or
     * layout in the hand-off is O(1)) */
    CHECK(worst <= SPEC_E2E_WORST && sum / rows <= SPEC_E2E_MEAN && nf == 0,
          "hand-off: rel L2 worst %.3e (≤ %.0e), mean %.3e (≤ %.0e), non-finite %d", worst, SPEC_E2E_WORST, sum / rows,
          SPEC_E2E_MEAN, nf);
    st_engine_seq_close(eg, slot);
    st_engine_mb_destroy(mb);
    free(ws);
    free(zf);
    free(lg);
    free(ref);
}

/* An early launch never released: its device work waits opts.handoff_timeout_ms (300 ms here), then
 * drains; the step fails with ST_ERR_TIMEOUT instead of hanging, and the next step is fine. */
static void test_release_watchdog(const st_ckpt_t *ck, const int *toks, int np, int V) {
    st_engine_opts_t o;
    st_engine_opts_default(&o);
    o.max_seqs = 1, o.max_batch_tokens = np, o.max_ctx = 2 * np + 8, o.device = 0, o.handoff_timeout_ms = 300;
    st_engine_t *e = NULL;
    CHECK(st_engine_create(&e, ck, &o) == ST_OK, "watchdog engine: %s", st_err_last());
    if (!e) return;
    st_engine_mb_t *mb = NULL;
    CHECK(st_engine_mb_create(e, &mb) == ST_OK, "mb create: %s", st_err_last());
    float *lg = malloc((size_t)np * V * sizeof(float));
    int slot;
    CHECK(st_engine_seq_open(e, &slot) == ST_OK, "seq open");
    st_seq_chunk_t ch = {.slot = slot, .n_tokens = np, .tokens = toks, .all_logits = true};
    st_moe_work_t w;
    /* round -1: no step of np tokens ran yet on this engine, so nothing launches early (a kernel of a
     * new shape may load at its first launch, which waits for the release); then round 0 */
    for (int round = -1; round < 2 && mb; round++) {
        CHECK(st_engine_mb_begin(mb, &ch, 1, lg) == ST_OK, "begin: %s", st_err_last());
        int more = st_engine_mb_advance(mb, &w), first = 1;
        double t0 = st_time_sec(), waited = 0;
        if (round == -1 && more) {
            st_engine_mb_launch_early(mb);
            CHECK(st_engine_mb_ready(mb), "a step of a token count not run before is not launched early");
        }
        while (more) {
            memset(w.out, 0, (size_t)w.T * w.kc * w.ew * sizeof(float));
            if (round == 0 && first) { /* launched early, never released: the device waits, then drains */
                st_engine_mb_launch_early(mb);
                t0 = st_time_sec();
                more = st_engine_mb_collect(mb, &w);
                waited = st_time_sec() - t0;
                first = 0;
                continue;
            }
            more = st_engine_mb_advance(mb, &w); /* released by the launch */
        }
        if (round == -1)
            CHECK(st_engine_mb_status(mb) == ST_OK, "the first step, plain: %s", st_status_str(st_engine_mb_status(mb)));
        else if (round == 0)
            CHECK(st_engine_mb_status(mb) == ST_ERR_TIMEOUT && waited >= 0.25 && waited < 10,
                  "an unreleased hand-off fails the step after %.2f s (status %s)", waited,
                  st_status_str(st_engine_mb_status(mb)));
        else
            CHECK(st_engine_mb_status(mb) == ST_OK, "the next step is fine (%s)", st_status_str(st_engine_mb_status(mb)));
        st_engine_seq_close(e, slot);
        CHECK(st_engine_seq_open(e, &slot) == ST_OK, "seq open");
        ch.slot = slot;
    }
    st_engine_mb_destroy(mb);
    st_engine_destroy(e);
    free(lg);
}

/* ---- overlapped micro-batches and routing on the device ----
 * Two sequences as two micro-batches on their own streams, driven in the worker's ping-pong order
 * (launch returns at once; collect waits for the hand-off; experts on the device), with quantile
 * thresholds set (odd MoE layers; even ones NaN = top-k) and no hook, so the routing runs on the
 * device (st_cuda_router_quantile) and the observer sees it after the hand-off lands. Reference:
 * each sequence alone through st_engine_step with a (read-only) hook, i.e. the host routing path.
 * The expert sets must be identical, and the logits equal to rounding (1e-4: same kernels and
 * shapes; a race between the streams or a wrong hand-off shows as O(1)). */
typedef struct {
    int *ids[2][MAX_CALLS / 8];
    int n[2], T, kc, cur, bad;
    bool record;
} ovrec_t;

static void ov_cmp(ovrec_t *r, int T, const int *ids, const int *cnt, int kmax) {
    int q = r->cur, i = r->n[q]++;
    if (i >= MAX_CALLS / 8 || T != 1 || kmax != r->kc) return;
    if (r->record) {
        r->ids[q][i] = malloc(sizeof(int) * (kmax + 1));
        r->ids[q][i][0] = cnt[0];
        memcpy(r->ids[q][i] + 1, ids, sizeof(int) * kmax);
        return;
    }
    if (!r->ids[q][i]) return;
    bool same = r->ids[q][i][0] == cnt[0];
    for (int k = 0; same && k < cnt[0]; k++) same = r->ids[q][i][1 + k] == ids[k];
    r->bad += !same;
}
static void ov_hook(void *ctx, int layer, int T, int n, const float *scores, int *ids, int *cnt, int kmax) {
    (void)layer, (void)n, (void)scores;
    ov_cmp(ctx, T, ids, cnt, kmax);
}
static void ov_obs(void *ctx, int layer, int T, int n, const float *scores, const int *ids, const int *cnt, int kmax) {
    (void)layer, (void)n, (void)scores;
    ov_cmp(ctx, T, ids, cnt, kmax);
}

static void test_overlap(const st_ckpt_t *ck, const int *toks, int np, int steps, int V) {
    const st_config_t *c = st_ckpt_config(ck);
    st_engine_opts_t o;
    st_engine_opts_default(&o);
    o.max_seqs = 4, o.max_batch_tokens = np, o.max_ctx = np + steps + 8, o.device = 0;
    o.routing = ST_ROUTE_QUANTILE, o.k_max = 2 * c->top_k;
    st_engine_t *e;
    if (st_engine_create(&e, ck, &o) != ST_OK) {
        CHECK(0, "overlap: gpu engine: %s", st_err_last());
        return;
    }
    size_t cells = (size_t)c->n_layers * c->n_experts;
    float *tau = malloc(cells * sizeof(float));
    for (int l = 0; l < c->n_layers; l++)
        for (int x = 0; x < c->n_experts; x++) tau[(size_t)l * c->n_experts + x] = (l & 1) ? 0.5f : NAN;
    st_engine_set_thresholds(e, tau, 1);
    int *pr[2] = {malloc(sizeof(int) * (np + steps)), malloc(sizeof(int) * (np + steps))};
    for (int i = 0; i < np + steps; i++) pr[0][i] = toks[i], pr[1][i] = (toks[i] * 7 + 3) % 256;
    size_t LB = (size_t)(steps + 1) * V;
    float *ref[2] = {malloc(LB * sizeof(float)), malloc(LB * sizeof(float))};
    float *got[2] = {malloc(LB * sizeof(float)), malloc(LB * sizeof(float))};
    static ovrec_t r;
    memset(&r, 0, sizeof r);
    r.kc = o.k_max, r.record = true;
    st_engine_set_route_hook(e, ov_hook, &r);
    for (int q = 0; q < 2; q++) { /* reference: alone, host routing (a hook is set), greedy tokens fed */
        int slot;
        CHECK(st_engine_seq_open(e, &slot) == ST_OK, "seq open");
        r.cur = q;
        for (int i = 0; i <= steps; i++) {
            if (i > 0) pr[q][np + i - 1] = argmax(ref[q] + (size_t)(i - 1) * V, V);
            st_seq_chunk_t ch = {.slot = slot, .n_tokens = i ? 1 : np, .tokens = i ? &pr[q][np + i - 1] : pr[q]};
            CHECK(st_engine_step(e, &ch, 1, ref[q] + (size_t)i * V) == ST_OK, "reference step: %s", st_err_last());
        }
        st_engine_seq_close(e, slot);
    }
    st_engine_set_route_hook(e, NULL, NULL);
    st_engine_set_route_observer(e, ov_obs, &r, true);
    r.record = false, r.n[0] = r.n[1] = 0;
    st_engine_mb_t *mb[2];
    int slot[2], rounds = 0;
    CHECK(st_engine_mb_create(e, &mb[0]) == ST_OK && st_engine_mb_create(e, &mb[1]) == ST_OK, "mb create: %s",
          st_err_last());
    CHECK(st_engine_seq_open(e, &slot[0]) == ST_OK && st_engine_seq_open(e, &slot[1]) == ST_OK, "seq open");
    for (int i = 0; i <= steps; i++) {
        st_seq_chunk_t ch[2];
        enum { DONE, LAUNCHED, AT_EXPERTS } st[2];
        st_moe_work_t w[2];
        for (int q = 0; q < 2; q++) {
            ch[q] = (st_seq_chunk_t){.slot = slot[q], .n_tokens = i ? 1 : np, .tokens = i ? &pr[q][np + i - 1] : pr[q]};
            CHECK(st_engine_mb_begin(mb[q], &ch[q], 1, got[q] + (size_t)i * V) == ST_OK, "mb begin: %s", st_err_last());
            st_engine_mb_launch(mb[q]);
            st[q] = LAUNCHED;
        }
        for (int m = 1, left = 2; left > 0; m ^= 1) { /* the worker's order (worker.c step) */
            if (st[m] == AT_EXPERTS) {
                st_engine_mb_run_local(mb[m], &w[m]);
                st_engine_mb_launch(mb[m]);
                st[m] = LAUNCHED;
            }
            int q = m ^ 1;
            if (st[q] != LAUNCHED) continue;
            r.cur = q;
            if (st_engine_mb_collect(mb[q], &w[q])) st[q] = AT_EXPERTS, rounds++;
            else st[q] = DONE, left--;
        }
    }
    int moe = c->n_layers - c->first_k_dense, bad = 0, nf = 0;
    double worst = 0;
    for (int q = 0; q < 2; q++)
        for (int i = 0; i <= steps; i++) {
            double e2 = rel_l2(got[q] + (size_t)i * V, ref[q] + (size_t)i * V, V, &nf);
            worst = e2 > worst ? e2 : worst;
            bad += argmax(got[q] + (size_t)i * V, V) != argmax(ref[q] + (size_t)i * V, V);
        }
    printf("overlapped micro-batches (2 streams, device quantile routing) vs one at a time (host routing): rel L2 "
           "%.2e, greedy tokens differing %d, expert sets differing %d of %d, hand-offs %d\n", worst, bad, r.bad,
           r.n[0] + r.n[1], rounds);
    CHECK(rounds == 2 * (steps + 1) * moe, "one hand-off per MoE layer per micro-batch (%d)", rounds);
    CHECK(r.n[0] == (steps + 1) * moe && r.n[1] == r.n[0], "observer once per MoE layer (%d, %d)", r.n[0], r.n[1]);
    CHECK(r.bad == 0, "device quantile routing differs from the host's at %d positions", r.bad);
    CHECK(worst <= 1e-4 && bad == 0 && nf == 0, "overlapped micro-batches: rel L2 %.2e, %d tokens differ", worst, bad);
    for (int q = 0; q < 2; q++) {
        st_engine_seq_close(e, slot[q]);
        st_engine_mb_destroy(mb[q]);
        free(pr[q]), free(ref[q]), free(got[q]);
        for (int i = 0; i < MAX_CALLS / 8; i++) free(r.ids[q][i]);
    }
    free(tau);
    st_engine_destroy(e);
}

/* One GPU pass over a prompt and its decode steps (the CPU's tokens fed), with the CPU's routing
 * forced through the route hook (flips counted in rec) and, when tr is set, the trace compared
 * (teacher: partial sums forced too, so each sublayer starts from the CPU's input). Returns the
 * worst sublayer error when traced, else 0. */
static double forced_pass(st_engine_t *eg, rrec_t *rec, trec_t *tr, bool teacher, int *toks, int np, int steps,
                          float *lg, int V, const st_config_t *c, const char *what) {
    double gp, gd, sub = 0;
    rec->pos = 0, rec->force = true;
    st_engine_set_route_hook(eg, force_hook, rec);
    if (tr) {
        trace_reset(tr, teacher);
        st_engine_set_trace_hook(eg, trace_hook, tr);
    }
    CHECK(run_seq(eg, toks, np, steps, true, lg, V, &gp, &gd) == ST_OK, "%s: %s", what, st_err_last());
    st_engine_set_trace_hook(eg, NULL, NULL);
    st_engine_set_route_hook(eg, NULL, NULL);
    CHECK(rec->pos == rec->n && rec->bad == 0, "%s: hook calls %d of %d, %d of another shape", what, rec->pos, rec->n,
          rec->bad);
    if (tr) {
        CHECK(tr->mismatch == 0 && tr->pos == tr->n, "%s: trace points %d of %d, %d mismatched", what, tr->pos, tr->n,
              tr->mismatch);
        sub = trace_report(tr, c, what);
    }
    return sub;
}

static void rec_free(rrec_t *r) {
    for (int i = 0; i < r->n; i++)
        free(r->calls[i].ids), free(r->calls[i].cnt);
    memset(r, 0, sizeof *r);
}
static void trace_free(trec_t *t, int L, int B) {
    for (int i = 0; i < t->n; i++)
        free(t->e[i].x);
    free(t->e);
    memset(t, 0, sizeof *t);
    t->record = true, t->L = L, t->B = B;
}

static void run_preset(const char *preset, int np, int steps) {
    const char *tmp = getenv("STRATA_TEST_TMP");
    char dir[512];
    snprintf(dir, sizeof dir, "%s/gpu-engine-%s-%d", tmp ? tmp : "/tmp", preset, (int)getpid());
    st_config_t pc;
    st_config_preset(&pc, preset);
    st_ckpt_init_opts_t io = {
        .preset = preset, .out_dir = dir, .seed = 11, .dtype = ST_DT_BF16, .mxfp4_experts = pc.experts_mxfp4};
    double t0 = st_time_sec();
    st_ckpt_t *ck = NULL;
    if (st_ckpt_init(&io) != ST_OK || st_ckpt_open(&ck, dir) != ST_OK) {
        CHECK(0, "cannot make %s checkpoint: %s", preset, st_err_last());
        return;
    }
    printf("== %s: checkpoint written in %.1f s\n", preset, st_time_sec() - t0);
    const st_config_t *c = st_ckpt_config(ck);
    int V = c->vocab, L = c->n_layers, B = c->attn_res_block;
    int *toks = malloc((size_t)N_PROMPTS * (np + steps) * sizeof(int));
    st_rng_t rng = {.s = 1234};
    for (int i = 0; i < N_PROMPTS * (np + steps); i++)
        toks[i] = (int)(st_rng_next(&rng) % 256);
    size_t LB = (size_t)(np + steps) * V * sizeof(float);
    float *lc = malloc(LB), *lg = malloc(LB), *lg2 = malloc(LB);
    st_engine_opts_t o;
    st_engine_opts_default(&o);
    o.max_seqs = 2;
    o.max_batch_tokens = np;
    o.max_ctx = np + steps + 8;
    static rrec_t rec;
    static trec_t tr;
    rec_free(&rec);
    trace_free(&tr, L, B);
    st_engine_t *ec = NULL, *eg = NULL, *en = NULL;
    CHECK(st_engine_create(&ec, ck, &o) == ST_OK, "cpu engine: %s", st_err_last());
    st_engine_opts_t og = o;
    og.device = 0;
    t0 = st_time_sec();
    CHECK(st_engine_create(&eg, ck, &og) == ST_OK, "gpu engine: %s", st_err_last());
    if (!ec || !eg) goto out;
    printf("%s: gpu engine created in %.1f s\n", preset, st_time_sec() - t0);
    double cp, cd, gp, gd;
    char what[128];

    /* ---- SPEC §8 on N_PROMPTS prompts: the CPU decodes greedily (its routing recorded, prompt 0's
     * trace too); the GPU is fed the CPU's tokens with the CPU's routing forced. The end-to-end
     * bounds and the greedy rule read the rows a run returns (the prompt's last row and each decode
     * step's, which give the greedy tokens); the other prompt rows are printed. */
    double worst = 0, sum = 0;
    int rows = 0, nonfin = 0, diverged = 0;
    long flips = 0, ftokens = 0;
    all_rows = true;
    for (int q = 0; q < N_PROMPTS; q++) {
        int *tq = toks + (size_t)q * (np + steps);
        rec_free(&rec);
        st_engine_set_route_hook(ec, rec_hook, &rec);
        if (q == 0) st_engine_set_trace_hook(ec, trace_hook, &tr);
        CHECK(run_seq(ec, tq, np, steps, false, lc, V, &cp, &cd) == ST_OK, "cpu run: %s", st_err_last());
        st_engine_set_trace_hook(ec, NULL, NULL);
        st_engine_set_route_hook(ec, NULL, NULL);
        snprintf(what, sizeof what, "%s prompt %d, CPU routing forced", preset, q);
        forced_pass(eg, &rec, q == 0 ? &tr : NULL, false, tq, np, steps, lg, V, c, what);
        e2e_rows(what, lg, lc, np - 1, np + steps, V, &worst, &sum, &rows, &nonfin);
        flips += rec.flips, ftokens += rec.tokens;
        diverged += greedy_rule(what, lg + (size_t)(np - 1) * V, lc + (size_t)(np - 1) * V, steps + 1, V) >= 0;
        if (q == 0) {
            /* every sublayer fed the CPU's input (teacher forcing), CPU routing */
            snprintf(what, sizeof what, "%s teacher-forced", preset);
            double sub = forced_pass(eg, &rec, &tr, true, tq, np, steps, lg2, V, c, what);
            CHECK(sub <= SPEC_SUBLAYER, "%s: worst sublayer error %.3e > %.0e", what, sub, SPEC_SUBLAYER);
            CHECK(sub > 0, "%s: no sublayer compared", what);
            /* the GPU's own routing (reported: SPEC §8 asks it of trained checkpoints only) */
            all_rows = false;
            st_engine_set_route_hook(eg, NULL, NULL);
            CHECK(run_seq(eg, tq, np, steps, true, lg2, V, &gp, &gd) == ST_OK, "gpu run: %s", st_err_last());
            int nf2 = 0;
            double own = 0;
            for (int i = 0; i <= steps; i++)
                own = fmax(own, rel_l2(lg2 + (size_t)i * V, lc + (size_t)(np - 1 + i) * V, V, &nf2));
            printf("%s prompt 0, GPU's own routing: worst rel L2 %.3e over the %d greedy rows (not checked)\n", preset,
                   own, steps + 1);
            CHECK(nf2 == 0, "%s own routing: %d non-finite logits", preset, nf2);
            all_rows = true;
        }
    }
    all_rows = false;
    double mean = sum / (rows > 0 ? rows : 1);
    printf("RESULT %s_spec8_e2e_rel_l2 worst %.3e mean %.3e over %d positions of %d prompts (bounds %.0e / %.0e)\n",
           preset, worst, mean, rows, N_PROMPTS, SPEC_E2E_WORST, SPEC_E2E_MEAN);
    printf("RESULT %s_spec8_greedy %d of %d prompts differ within the rule (%d decode steps)\n", preset, diverged,
           N_PROMPTS, steps);
    printf("RESULT %s_route_flips %ld of %ld token-layer positions (GPU's own choice ≠ CPU's, forced)\n", preset, flips,
           ftokens);
    CHECK(worst <= SPEC_E2E_WORST, "%s: end-to-end logits rel L2 %.3e at the worst position > %.0e", preset, worst,
          SPEC_E2E_WORST);
    CHECK(mean <= SPEC_E2E_MEAN, "%s: end-to-end logits rel L2 %.3e on average > %.0e", preset, mean, SPEC_E2E_MEAN);
    CHECK(nonfin == 0, "%s: %d non-finite logits", preset, nonfin);
    CHECK(rows == N_PROMPTS * (steps + 1), "%s: %d positions compared", preset, rows);

    /* ---- the same with the prompt in chunks of np/2 + 3 tokens (the second chunk's queries after
     * cached rows: KDA's carried state, MLA's direct form over the paged cache), CPU chunked too */
    prompt_chunk = np / 2 + 3;
    all_rows = true;
    rec_free(&rec);
    trace_free(&tr, L, B);
    st_engine_set_route_hook(ec, rec_hook, &rec);
    st_engine_set_trace_hook(ec, trace_hook, &tr);
    CHECK(run_seq(ec, toks, np, steps, true, lc, V, &cp, &cd) == ST_OK, "cpu chunked run: %s", st_err_last());
    st_engine_set_trace_hook(ec, NULL, NULL);
    st_engine_set_route_hook(ec, NULL, NULL);
    snprintf(what, sizeof what, "%s chunked prompt, CPU routing forced", preset);
    forced_pass(eg, &rec, &tr, false, toks, np, steps, lg, V, c, what);
    double cw = 0, cs = 0;
    int cr = 0, cnf = 0;
    e2e_rows(what, lg, lc, np - 1, np + steps, V, &cw, &cs, &cr, &cnf);
    CHECK(cw <= SPEC_E2E_WORST && cs / cr <= SPEC_E2E_MEAN && cnf == 0,
          "%s: rel L2 worst %.3e, mean %.3e, non-finite %d", what, cw, cs / cr, cnf);
    snprintf(what, sizeof what, "%s chunked prompt, teacher-forced", preset);
    double sub = forced_pass(eg, &rec, &tr, true, toks, np, steps, lg, V, c, what);
    CHECK(sub > 0 && sub <= SPEC_SUBLAYER, "%s: worst sublayer error %.3e > %.0e", what, sub, SPEC_SUBLAYER);
    prompt_chunk = 0;
    all_rows = false;

    /* ---- the product path's own checks (one prompt, the GPU's own routing, CPU tokens fed) */
    CHECK(run_seq(eg, toks, np, 2, true, lg, V, &gp, &gd) == ST_OK, "gpu warm-up: %s", st_err_last());
    CHECK(run_seq(eg, toks, np, steps, true, lg, V, &gp, &gd) == ST_OK, "gpu run: %s", st_err_last());
    {
        /* greedy rows through the device argmax (no logits copied) equal the argmax of the rows */
        int *am = malloc(sizeof(int) * (steps + 1)), bad = 0;
        double gp2, gd2;
        for (int i = 0; i <= steps; i++)
            am[i] = -1;
        argmax_out = am;
        CHECK(run_seq(eg, toks, np, steps, true, lg2, V, &gp2, &gd2) == ST_OK, "gpu argmax run: %s", st_err_last());
        argmax_out = NULL;
        for (int i = 0; i <= steps; i++)
            bad += am[i] != argmax(lg + (size_t)i * V, V);
        CHECK(bad == 0, "%s: device argmax differs from the logits' argmax at %d of %d steps", preset, bad, steps + 1);
        printf("RESULT %s_gpu_decode_tok_s_argmax %.1f (batch 1, no logits copied)\n", preset, steps / gd2);
        free(am);
    }
    /* decode steps replayed as CUDA graphs (the default) against plain launches: bit for bit */
    st_engine_opts_t ong = og;
    ong.cuda_graphs = false;
    if (st_engine_create(&en, ck, &ong) == ST_OK) {
        double gp3, gd3;
        CHECK(run_seq(en, toks, np, steps, true, lg2, V, &gp3, &gd3) == ST_OK, "gpu run, plain launches: %s",
              st_err_last());
        CHECK(!memcmp(lg2, lg, (size_t)(steps + 1) * V * sizeof(float)),
              "%s: logits with decode graphs differ from plain launches", preset);
        printf("RESULT %s_gpu_decode_tok_s_no_graphs %.1f (batch 1; with graphs %.1f)\n", preset, steps / gd3,
               steps / gd);
        st_engine_destroy(en);
    } else {
        CHECK(0, "second gpu engine: %s", st_err_last());
    }
    printf("RESULT %s_cpu_prefill_tok_s %.1f (prompt %d)\n", preset, np / cp, np);
    printf("RESULT %s_cpu_decode_tok_s %.1f\n", preset, steps / cd);
    printf("RESULT %s_gpu_prefill_tok_s %.1f (prompt %d)\n", preset, np / gp, np);
    printf("RESULT %s_gpu_decode_tok_s %.1f (batch 1)\n", preset, steps / gd);
    test_handoff(eg, ck, toks, np, V);
    test_release_watchdog(ck, toks, np, V);
    test_overlap(ck, toks, np, steps, V);
out:
    st_engine_destroy(eg);
    st_engine_destroy(ec);
    rec_free(&rec);
    trace_free(&tr, L, B);
    free(lc), free(lg), free(lg2), free(toks);
    st_ckpt_close(ck);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

/* Presets on the command line (ctest: small; k3-mini on its own, label slow). NOTE: on tiny (d 128)
 * every sublayer is as close as on small (5e-3, no token over 1.7e-2) but its random layers amplify
 * that to an end-to-end 1.6e-1 worst / 3.2e-2 mean (H200, 2026-12-02), over §8's bounds set on small. */
int main(int argc, char **argv) {
    st_engine_process_init(); /* before any CUDA call: the early launches below need eager loading */
    if (st_gpu_device_count() <= 0) {
        printf("test_gpu_engine: no CUDA device, skipped\n");
        return 77;
    }
    static const char *def[] = {"small"};
    int n = argc > 1 ? argc - 1 : 1;
    for (int i = 0; i < n; i++) {
        const char *p = argc > 1 ? argv[i + 1] : def[i];
        /* prompt 64 tokens (32 at K3 widths) and 16 decode steps */
        run_preset(p, strcmp(p, "k3-mini") ? 64 : 32, 16);
    }
    return st_test_done();
}
