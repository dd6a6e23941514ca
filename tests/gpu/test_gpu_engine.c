/* GPU engine vs CPU engine end to end (SPEC §8): the same prompt and the same 16 greedy decode
 * steps (fed the CPU's tokens) on both; relative L2 of the logits per step ≤ 2e-2 and no greedy
 * token differs. A first pass runs the GPU's own routing (reported); the checked pass forces the
 * GPU to the CPU's expert choices through the route hook, as SPEC §8 allows, and counts the
 * positions whose choice flipped. Also: the micro-batch hand-off (experts computed on the host),
 * two micro-batches overlapped on their own streams with routing on the device, the tiny preset, and k3-mini when STRATA_GPU_K3MINI=1. Exit 77 without a GPU. */
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
    if (c->T != T || c->kc != kmax) return;
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
            for (size_t j = 0; j < n; j++) {
                double c = reset ? e->x[j] : (double)e->x[j] - p->x[j];
                cd += c * c;
            }
            int sl = pt == ST_TRACE_PARTIAL_MID ? 0 : 1, ci = pl < 32 ? pl : 32;
            r->cnum[ci][sl][ph] += num, r->cden[ci][sl][ph] += cd;
        }
    }
    if (r->teacher && (pt == ST_TRACE_PARTIAL_IN || pt == ST_TRACE_PARTIAL_MID)) memcpy(x, e->x, n * sizeof(float));
}

static void trace_reset(trec_t *r, bool teacher) {
    r->record = false, r->teacher = teacher, r->pos = 0, r->mismatch = 0;
    memset(r->num, 0, sizeof r->num), memset(r->den, 0, sizeof r->den);
    memset(r->cnum, 0, sizeof r->cnum), memset(r->cden, 0, sizeof r->cden);
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
    printf(" attention %.2e (L%d), ffn %.2e (L%d)\n", wa, la, wf, lf);
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
        double e = (double)a[i] - ref[i];
        num += e * e;
        den += (double)ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

/* One sequence: prefill prompt [np], then steps decode tokens (toks[np + i] when given, else
 * greedy from this engine's own logits, written to toks). logits [(steps+1), V]. Returns seconds
 * of prefill and of decode in *tp, *td. */
/* Each sublayer's own error, teacher-forced (SPEC §8 "compare layers individually"): its chain of
 * bf16 roundings gives 3–6e-3 on these checkpoints (docs/perf.md); 1.5e-2 leaves room for the
 * rounding spread, not for a wrong kernel (an unwritten or mis-indexed output is O(1)). */
#define SUBLAYER_TOL 1.5e-2
static int prompt_chunk; /* > 0: run_seq feeds the prompt in chunks of this many tokens (chunked prefill) */
static int *argmax_out;  /* set: run_seq asks for the argmax of each step's row (st_seq_chunk_t.argmax) */
static st_status_t run_seq(st_engine_t *e, int *toks, int np, int steps, bool feed, float *logits, int V, double *tp,
                           double *td) {
    int slot;
    st_status_t s = st_engine_seq_open(e, &slot);
    if (s != ST_OK) return s;
    double t0 = st_time_sec();
    st_seq_chunk_t ch;
    for (int p0 = 0; s == ST_OK && p0 < np; p0 += prompt_chunk > 0 ? prompt_chunk : np) {
        int n = prompt_chunk > 0 && np - p0 > prompt_chunk ? prompt_chunk : np - p0;
        ch = (st_seq_chunk_t){.slot = slot, .n_tokens = n, .tokens = toks + p0, .argmax = argmax_out};
        s = st_engine_step(e, &ch, 1, logits);
    }
    double t1 = st_time_sec();
    for (int i = 0; s == ST_OK && i < steps; i++) {
        if (!feed) toks[np + i] = argmax(logits + (size_t)i * V, V);
        ch = (st_seq_chunk_t){.slot = slot, .n_tokens = 1, .tokens = &toks[np + i],
                              .argmax = argmax_out ? argmax_out + i + 1 : NULL};
        s = st_engine_step(e, &ch, 1, logits + (size_t)(i + 1) * V);
    }
    double t2 = st_time_sec();
    st_engine_seq_close(e, slot);
    *tp = t1 - t0, *td = t2 - t1;
    return s;
}

/* A greedy token that differs where the CPU's own top two logits are within NEAR_TIE times the step's
 * RMS logit error is a near-tie: any rounding may flip it (random checkpoints have flat logits; at the
 * SPEC's 2e-2 relative L2, ~5% of steps of Gaussian logits flip, docs/perf.md). A flip at a wider gap
 * is not explained by the measured error and fails on its own. */
#define NEAR_TIE 4.0
static bool compare(const char *what, const float *gpu, const float *cpu, int steps, int V, double tol, bool check) {
    int mism = 0, nonfin = 0, wide = 0;
    double worst = 0;
    printf("%s: rel L2 per step:", what);
    for (int i = 0; i <= steps; i++) {
        double r = rel_l2(gpu + (size_t)i * V, cpu + (size_t)i * V, V, &nonfin);
        printf(" %.2e", r);
        if (r > worst) worst = r;
        int ag = argmax(gpu + (size_t)i * V, V), ac = argmax(cpu + (size_t)i * V, V);
        if (ag != ac) { /* how close the CPU's top two were (a near-tie flips on any rounding) */
            const float *cr = cpu + (size_t)i * V, *gr = gpu + (size_t)i * V;
            double se = 0;
            for (int v = 0; v < V; v++) se += ((double)gr[v] - cr[v]) * ((double)gr[v] - cr[v]);
            se = sqrt(se / V);
            double gap = (double)cr[ac] - cr[ag];
            wide += gap > NEAR_TIE * se;
            printf(" [step %d: cpu top %d %.5f, gpu top %d %.5f; cpu logit of gpu's top %.5f, gpu logit of cpu's top %.5f;"
                   " cpu gap %.2e = %.2f x the RMS logit error %.2e]",
                   i, ac, cr[ac], ag, gr[ag], cr[ag], gr[ac], gap, gap / (se > 0 ? se : 1), se);
        }
        mism += ag != ac;
    }
    printf("\n%s: worst rel L2 %.3e (tolerance %.0e), greedy tokens differing %d of %d (%d beyond near-ties of %.0f x "
           "the RMS logit error), non-finite %d\n", what, worst, tol, mism, steps + 1, wide, NEAR_TIE, nonfin);
    if (check) {
        CHECK(worst <= tol, "%s: rel L2 %.3e > %.0e", what, worst, tol);
        CHECK(mism == 0, "%s: %d greedy tokens differ", what, mism);
        CHECK(wide == 0, "%s: %d greedy tokens differ beyond a near-tie", what, wide);
        CHECK(nonfin == 0, "%s: %d non-finite logits", what, nonfin);
    }
    return worst <= tol && mism == 0 && nonfin == 0;
}

/* The micro-batch hand-off on the GPU: experts computed on the host from work->z, written to
 * work->out (the remote path), against st_engine_step on the same engine. */
static void test_handoff(st_engine_t *eg, const st_ckpt_t *ck, const int *toks, int np, int V) {
    const st_config_t *c = st_ckpt_config(ck);
    /* reference: the same prompt through st_engine_step (experts on the device, own routing,
     * recorded); the hand-off run replays that routing, since host fp32 experts against device
     * bf16 ones flip near-tie choices downstream (SPEC §8) */
    static rrec_t hr;
    memset(&hr, 0, sizeof hr);
    float *ref = malloc((size_t)V * sizeof(float));
    int rs;
    CHECK(st_engine_seq_open(eg, &rs) == ST_OK, "seq open");
    st_seq_chunk_t rch = {.slot = rs, .n_tokens = np, .tokens = toks};
    st_engine_set_route_hook(eg, rec_hook, &hr);
    CHECK(st_engine_step(eg, &rch, 1, ref) == ST_OK, "reference step: %s", st_err_last());
    st_engine_seq_close(eg, rs);
    hr.force = true;
    st_engine_set_route_hook(eg, force_hook, &hr);
    st_engine_mb_t *mb;
    CHECK(st_engine_mb_create(eg, &mb) == ST_OK, "mb create: %s", st_err_last());
    int slot;
    CHECK(st_engine_seq_open(eg, &slot) == ST_OK, "seq open");
    float *lg = malloc((size_t)V * sizeof(float));
    st_seq_chunk_t ch = {.slot = slot, .n_tokens = np, .tokens = toks};
    CHECK(st_engine_mb_begin(mb, &ch, 1, lg) == ST_OK, "mb begin: %s", st_err_last());
    st_moe_work_t w;
    int rounds = 0;
    float *ws = NULL;
    while (st_engine_mb_advance(mb, &w)) {
        rounds++;
        for (int t = 0; t < w.T; t++)
            for (int i = 0; i < w.cnt[t]; i++) {
                st_expert_weights_t x;
                if (st_ckpt_expert(ck, w.layer, w.ids[(size_t)t * w.kc + i], &x) != ST_OK) continue;
                if (!ws) ws = malloc(st_ffn_ws_floats(1, &x.gate, &x.up, &x.down) * sizeof(float));
                st_ffn(w.out + ((size_t)t * w.kc + i) * w.ew, w.z + (size_t)t * w.ew, 1, &x.gate, &x.up, &x.down,
                       c->act, c->situ_beta1, c->situ_beta2, ws);
            }
    }
    CHECK(rounds == c->n_layers - c->first_k_dense, "one hand-off per MoE layer (%d)", rounds);
    CHECK(st_engine_seq_len(eg, slot) == np, "length advanced");
    int nf = 0;
    double r = rel_l2(lg, ref, V, &nf);
    printf("hand-off (host experts) vs device experts: rel L2 %.3e (routing flips %ld of %ld)\n", r, hr.flips,
           hr.tokens);
    st_engine_set_route_hook(eg, NULL, NULL);
    for (int i = 0; i < hr.n; i++) free(hr.calls[i].ids), free(hr.calls[i].cnt);
    CHECK(r <= 2e-2 && nf == 0, "hand-off rel L2 %.3e", r);
    st_engine_seq_close(eg, slot);
    st_engine_mb_destroy(mb);
    free(ws);
    free(lg);
    free(ref);
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
    st_engine_set_route_observer(e, ov_obs, &r);
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

/* One GPU pass with the CPU's routing forced and the trace compared (teacher: partial sums forced
 * too). Prints the logits comparison and the per-layer table; returns whether the logits pass.
 * sub_tol > 0 (teacher passes): every sublayer's own error must be within it (SPEC §8: layers
 * compared individually). */
static bool traced_pass(st_engine_t *eg, rrec_t *rec, trec_t *tr, bool teacher, int *toks, int np, int steps,
                        float *lg, const float *lc, int V, const st_config_t *c, const char *what, bool check,
                        double sub_tol) {
    double gp, gd;
    rec->pos = 0, rec->flips = 0, rec->tokens = 0, rec->force = true;
    st_engine_set_route_hook(eg, force_hook, rec);
    trace_reset(tr, teacher);
    st_engine_set_trace_hook(eg, trace_hook, tr);
    CHECK(run_seq(eg, toks, np, steps, true, lg, V, &gp, &gd) == ST_OK, "%s: %s", what, st_err_last());
    st_engine_set_trace_hook(eg, NULL, NULL);
    st_engine_set_route_hook(eg, NULL, NULL);
    CHECK(rec->pos == rec->n, "%s: hook calls %d of %d", what, rec->pos, rec->n);
    CHECK(tr->mismatch == 0 && tr->pos == tr->n, "%s: trace points %d of %d, %d mismatched", what, tr->pos, tr->n,
          tr->mismatch);
    bool ok = compare(what, lg, lc, steps, V, 2e-2, check);
    double sub = trace_report(tr, c, what);
    if (sub_tol > 0) CHECK(sub <= sub_tol, "%s: worst sublayer error %.3e > %.1e", what, sub, sub_tol);
    return ok;
}

static void run_preset(const char *preset, int np, int steps, bool cpu_ref) {
    const char *tmp = getenv("STRATA_TEST_TMP");
    char dir[512];
    snprintf(dir, sizeof dir, "%s/gpu-engine-%s-%d", tmp ? tmp : "/tmp", preset, (int)getpid());
    st_config_t pc;
    st_config_preset(&pc, preset);
    st_ckpt_init_opts_t io = {.preset = preset, .out_dir = dir, .seed = 11, .dtype = ST_DT_BF16,
                              .mxfp4_experts = pc.experts_mxfp4};
    double t0 = st_time_sec();
    st_ckpt_t *ck = NULL;
    if (st_ckpt_init(&io) != ST_OK || st_ckpt_open(&ck, dir) != ST_OK) {
        CHECK(0, "cannot make %s checkpoint: %s", preset, st_err_last());
        return;
    }
    printf("== %s: checkpoint written in %.1f s\n", preset, st_time_sec() - t0);
    const st_config_t *c = st_ckpt_config(ck);
    int V = c->vocab;
    int *toks = malloc((size_t)(np + steps) * sizeof(int));
    st_rng_t rng = {.s = 1234};
    for (int i = 0; i < np + steps; i++) toks[i] = (int)(st_rng_next(&rng) % 256);
    size_t LB = (size_t)(steps + 1) * V * sizeof(float);
    float *lc = malloc(LB), *lg = malloc(LB);
    st_engine_opts_t o;
    st_engine_opts_default(&o);
    o.max_seqs = 2;
    o.max_batch_tokens = np;
    o.max_ctx = np + steps + 8;
    static rrec_t rec;
    memset(&rec, 0, sizeof rec);
    static trec_t tr;
    memset(&tr, 0, sizeof tr);
    tr.record = true, tr.L = c->n_layers, tr.B = c->attn_res_block;
    double cp = 0, cd = 0, gp, gd, gp2, gd2;
    if (cpu_ref) {
        st_engine_t *ec;
        CHECK(st_engine_create(&ec, ck, &o) == ST_OK, "cpu engine: %s", st_err_last());
        st_engine_set_route_hook(ec, rec_hook, &rec);
        st_engine_set_trace_hook(ec, trace_hook, &tr);
        CHECK(run_seq(ec, toks, np, steps, false, lc, V, &cp, &cd) == ST_OK, "cpu run: %s", st_err_last());
        st_engine_destroy(ec);
    }
    o.device = 0;
    st_engine_t *eg;
    t0 = st_time_sec();
    if (st_engine_create(&eg, ck, &o) != ST_OK) {
        CHECK(0, "gpu engine: %s", st_err_last());
        goto out;
    }
    printf("%s: gpu engine created in %.1f s\n", preset, st_time_sec() - t0);
    /* warm-up (module load, cuBLAS heuristics), then the timed unforced pass */
    CHECK(run_seq(eg, toks, np, 2, true, lg, V, &gp, &gd) == ST_OK, "gpu warm-up: %s", st_err_last());
    CHECK(run_seq(eg, toks, np, steps, cpu_ref, lg, V, &gp, &gd) == ST_OK, "gpu run: %s", st_err_last());
    {
        /* greedy rows through the device argmax (no logits copied): the ids equal the argmax of the
         * logits rows of the run above (same tokens fed, same engine) */
        int *am = malloc(sizeof(int) * (steps + 1)), bad = 0;
        float *lg2 = malloc(LB);
        for (int i = 0; i <= steps; i++) am[i] = -1;
        argmax_out = am;
        CHECK(run_seq(eg, toks, np, steps, true, lg2, V, &gp2, &gd2) == ST_OK, "gpu argmax run: %s", st_err_last());
        argmax_out = NULL;
        for (int i = 0; i <= steps; i++) bad += am[i] != argmax(lg + (size_t)i * V, V);
        CHECK(bad == 0, "%s: device argmax differs from the logits' argmax at %d of %d steps", preset, bad, steps + 1);
        printf("RESULT %s_gpu_decode_tok_s_argmax %.1f (batch 1, no logits copied)\n", preset, steps / gd2);
        free(am), free(lg2);
    }
    {
        /* decode steps replayed as CUDA graphs (the default) against plain launches: bit-identical */
        st_engine_opts_t og = o;
        og.cuda_graphs = false;
        st_engine_t *en;
        double gp3, gd3;
        float *lg3 = malloc(LB);
        if (st_engine_create(&en, ck, &og) == ST_OK) {
            CHECK(run_seq(en, toks, np, steps, true, lg3, V, &gp3, &gd3) == ST_OK, "gpu run without graphs: %s",
                  st_err_last());
            CHECK(!memcmp(lg3, lg, LB), "%s: logits with decode graphs differ from plain launches", preset);
            printf("RESULT %s_gpu_decode_tok_s_no_graphs %.1f (batch 1; with graphs %.1f)\n", preset, steps / gd3,
                   steps / gd);
            st_engine_destroy(en);
        } else {
            CHECK(0, "gpu engine without graphs: %s", st_err_last());
        }
        free(lg3);
    }
    printf("RESULT %s_cpu_prefill_tok_s %.1f (prompt %d)\n", preset, cp > 0 ? np / cp : 0, np);
    printf("RESULT %s_cpu_decode_tok_s %.1f\n", preset, cd > 0 ? steps / cd : 0);
    printf("RESULT %s_gpu_prefill_tok_s %.1f (prompt %d)\n", preset, np / gp, np);
    printf("RESULT %s_gpu_decode_tok_s %.1f (batch 1)\n", preset, steps / gd);
    if (cpu_ref) {
        bool own = compare("own routing", lg, lc, steps, V, 2e-2, false);
        /* the checked pass: CPU's expert choices forced, flips counted; the trace shows how the error
         * grows layer by layer */
        char what[96];
        snprintf(what, sizeof what, "%s forced routing", preset);
        traced_pass(eg, &rec, &tr, false, toks, np, steps, lg, lc, V, c, what, true, 0);
        printf("%s: routing flips (GPU's own choice ≠ CPU's) %ld of %ld token-layer positions\n", preset, rec.flips,
               rec.tokens);
        printf("RESULT %s_route_flips %ld of %ld (own routing %s)\n", preset, rec.flips, rec.tokens,
               own ? "passes too" : "fails: flips");
        /* teacher forcing: every sublayer starts from the CPU's partial sums, so each row of the
         * table is that sublayer's own error (reported, not checked) */
        snprintf(what, sizeof what, "%s teacher-forced", preset);
        traced_pass(eg, &rec, &tr, true, toks, np, steps, lg, lc, V, c, what, false, SUBLAYER_TOL);
        test_handoff(eg, ck, toks, np, V);
        test_overlap(ck, toks, np, steps, V);
        /* chunked prefill (the prompt in chunks of np/2 + 3 tokens: the second chunk's queries sit
         * after cached rows, through KDA's carried state and MLA's direct form over the paged cache),
         * CPU recorded the same way; every sublayer checked teacher-forced, the logits reported */
        prompt_chunk = np / 2 + 3;
        for (int i = 0; i < rec.n; i++) free(rec.calls[i].ids), free(rec.calls[i].cnt);
        for (int i = 0; i < tr.n; i++) free(tr.e[i].x);
        memset(&rec, 0, sizeof rec);
        free(tr.e);
        memset(&tr, 0, sizeof tr);
        tr.record = true, tr.L = c->n_layers, tr.B = c->attn_res_block;
        st_engine_t *ec;
        st_engine_opts_t oc = o;
        oc.device = -1; /* the CPU reference (o is the GPU engine's by now) */
        CHECK(st_engine_create(&ec, ck, &oc) == ST_OK, "cpu engine: %s", st_err_last());
        st_engine_set_route_hook(ec, rec_hook, &rec);
        st_engine_set_trace_hook(ec, trace_hook, &tr);
        double cp2, cd2;
        CHECK(run_seq(ec, toks, np, steps, true, lc, V, &cp2, &cd2) == ST_OK, "cpu chunked run: %s", st_err_last());
        st_engine_destroy(ec);
        snprintf(what, sizeof what, "%s chunked prompt, forced routing", preset);
        traced_pass(eg, &rec, &tr, false, toks, np, steps, lg, lc, V, c, what, false, 0);
        snprintf(what, sizeof what, "%s chunked prompt, teacher-forced", preset);
        traced_pass(eg, &rec, &tr, true, toks, np, steps, lg, lc, V, c, what, false, SUBLAYER_TOL);
        prompt_chunk = 0;
    } else {
        int nf = 0;
        for (size_t i = 0; i < (size_t)(steps + 1) * V; i++) nf += !isfinite(lg[i]);
        CHECK(nf == 0, "%s: %d non-finite logits", preset, nf);
    }
    st_engine_destroy(eg);
out:
    for (int i = 0; i < rec.n; i++) free(rec.calls[i].ids), free(rec.calls[i].cnt);
    for (int i = 0; i < tr.n; i++) free(tr.e[i].x);
    free(tr.e);
    free(lc), free(lg), free(toks);
    st_ckpt_close(ck);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

int main(void) {
    if (st_gpu_device_count() <= 0) {
        printf("test_gpu_engine: no CUDA device, skipped\n");
        return 77;
    }
    run_preset("tiny", 24, 16, true);
    run_preset("small", 64, 16, true);
    if (getenv("STRATA_GPU_K3MINI")) run_preset("k3-mini", 32, 4, false);
    return st_test_done();
}
