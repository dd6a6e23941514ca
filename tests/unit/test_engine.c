/* Engine behaviour on the tiny preset: prefill-then-decode equals one longer prefill, prompt pieces
 * equal one prefill, batching invariance (bit for bit), errors leave state untouched, capacity
 * limits, quantile routing with thresholds. The golden numerical check is test_golden. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "strata/engine.h"

static st_ckpt_t *ck;
static const st_config_t *cfg;
static int V;

static st_engine_t *mk(int max_seqs, int max_batch, int max_ctx, st_route_mode_t mode) {
    st_engine_opts_t o;
    st_engine_opts_default(&o);
    o.max_seqs = max_seqs;
    o.max_batch_tokens = max_batch;
    o.max_ctx = max_ctx;
    o.kv_page_size = 8; /* small pages: a prompt spans several */
    o.routing = mode;
    st_engine_t *e = NULL;
    st_status_t s = st_engine_create(&e, ck, &o);
    CHECK(s == ST_OK, "engine create: %s", st_err_last());
    return e;
}

static void prompt(int *t, int n, int seed) {
    for (int i = 0; i < n; i++) t[i] = (int)((unsigned)(seed * 7919 + i * 104729 + (i * i) * 31) % (unsigned)V);
}

/* Run one sequence: pieces[] token counts, all logits; returns rows written. */
static int run_seq(st_engine_t *e, const int *toks, const int *pieces, int np, float *out) {
    int slot, off = 0, rows = 0;
    if (st_engine_seq_open(e, &slot) != ST_OK) return -1;
    for (int p = 0; p < np; p++) {
        st_seq_chunk_t c = {.slot = slot, .n_tokens = pieces[p], .tokens = toks + off, .all_logits = true};
        if (st_engine_step(e, &c, 1, out + (size_t)rows * V) != ST_OK) return -1;
        off += pieces[p];
        rows += pieces[p];
    }
    st_engine_seq_close(e, slot);
    return rows;
}

static void test_pieces(void) {
    enum { N = 40 };
    int toks[N];
    prompt(toks, N, 3);
    st_engine_t *e = mk(2, 64, 64, ST_ROUTE_TOPK);
    if (!e) return;
    float *one = malloc(sizeof(float) * N * V), *split = malloc(sizeof(float) * N * V), *dec = malloc(sizeof(float) * N * V);
    int whole[] = {N}, pieces[] = {7, 16, 1, 16}, decode[N];
    int pd[] = {30};
    for (int i = 0; i < N; i++) decode[i] = 1;
    memcpy(decode, pd, sizeof pd); /* prefill 30 then 10 single-token decode steps */
    CHECK(run_seq(e, toks, whole, 1, one) == N, "one prefill");
    CHECK(run_seq(e, toks, pieces, 4, split) == N, "pieces");
    CHECK(run_seq(e, toks, decode, 11, dec) == N, "prefill + decode");
    /* chunked vs recurrent KDA and direct vs absorbed MLA differ by rounding only */
    st_t_close("prompt in pieces vs one prefill (logits)", split, one, (size_t)N * V, 1e-4, 1e-4);
    st_t_close("prefill then decode vs one longer prefill (logits)", dec, one, (size_t)N * V, 1e-4, 1e-4);
    /* same greedy tokens at every position */
    int agree = 0;
    for (int t = 0; t < N; t++) {
        int a = 0, b = 0;
        for (int v = 1; v < V; v++) {
            if (one[(size_t)t * V + v] > one[(size_t)t * V + a]) a = v;
            if (dec[(size_t)t * V + v] > dec[(size_t)t * V + b]) b = v;
        }
        agree += a == b;
    }
    CHECK(agree == N, "greedy tokens agree at %d of %d positions", agree, N);
    free(one); free(split); free(dec);
    st_engine_destroy(e);
}

static void test_batch_invariance(void) {
    enum { NS = 3 };
    int lens[NS] = {5, 17, 33}, total = 5 + 17 + 33;
    int toks[NS][33];
    for (int i = 0; i < NS; i++) prompt(toks[i], lens[i], 10 + i);
    st_engine_t *e = mk(4, 64, 64, ST_ROUTE_TOPK);
    if (!e) return;
    float *alone = malloc(sizeof(float) * (size_t)total * V), *batch = malloc(sizeof(float) * (size_t)total * V);
    float *dec_alone = malloc(sizeof(float) * NS * 4 * V), *dec_batch = malloc(sizeof(float) * NS * 4 * V);
    /* alone: prefill then 4 decode tokens each */
    int row = 0;
    for (int i = 0; i < NS; i++) {
        int slot;
        st_engine_seq_open(e, &slot);
        st_seq_chunk_t c = {.slot = slot, .n_tokens = lens[i], .tokens = toks[i], .all_logits = true};
        CHECK(st_engine_step(e, &c, 1, alone + (size_t)row * V) == ST_OK, "alone prefill");
        row += lens[i];
        for (int s = 0; s < 4; s++) {
            int tk = (i * 13 + s * 5) % V;
            st_seq_chunk_t d = {.slot = slot, .n_tokens = 1, .tokens = &tk};
            CHECK(st_engine_step(e, &d, 1, dec_alone + (size_t)(s * NS + i) * V) == ST_OK, "alone decode");
        }
        st_engine_seq_close(e, slot);
    }
    /* batched: all prompts in one step, then all decodes together */
    int slots[NS];
    st_seq_chunk_t cs[NS];
    for (int i = 0; i < NS; i++) {
        st_engine_seq_open(e, &slots[i]);
        cs[i] = (st_seq_chunk_t){.slot = slots[i], .n_tokens = lens[i], .tokens = toks[i], .all_logits = true};
    }
    CHECK(st_engine_step(e, cs, NS, batch) == ST_OK, "batched prefill");
    for (int s = 0; s < 4; s++) {
        int tk[NS];
        for (int i = 0; i < NS; i++) {
            tk[i] = (i * 13 + s * 5) % V;
            cs[i] = (st_seq_chunk_t){.slot = slots[i], .n_tokens = 1, .tokens = &tk[i]};
        }
        CHECK(st_engine_step(e, cs, NS, dec_batch + (size_t)s * NS * V) == ST_OK, "batched decode");
    }
    CHECK(memcmp(alone, batch, sizeof(float) * (size_t)total * V) == 0, "batched prefill logits differ from alone");
    CHECK(memcmp(dec_alone, dec_batch, sizeof(float) * NS * 4 * V) == 0, "batched decode logits differ from alone");
    for (int i = 0; i < NS; i++) st_engine_seq_close(e, slots[i]);
    free(alone); free(batch); free(dec_alone); free(dec_batch);
    st_engine_destroy(e);
}

static void test_errors(void) {
    st_engine_t *e = mk(2, 16, 20, ST_ROUTE_TOPK);
    if (!e) return;
    float *lg = malloc(sizeof(float) * 16 * V), *ref = malloc(sizeof(float) * V);
    int toks[16];
    prompt(toks, 16, 5);
    int a, b, c2;
    CHECK(st_engine_seq_open(e, &a) == ST_OK, "open a");
    CHECK(st_engine_seq_open(e, &b) == ST_OK, "open b");
    CHECK(st_engine_seq_open(e, &c2) == ST_ERR_CAPACITY, "third slot must be refused");
    st_seq_chunk_t ch = {.slot = a, .n_tokens = 8, .tokens = toks};
    CHECK(st_engine_step(e, &ch, 1, lg) == ST_OK, "prefill a");
    memcpy(ref, lg, sizeof(float) * V);
    /* a bad token in a batch with a good sequence: nothing moves */
    int bad[2] = {1, V + 5};
    st_seq_chunk_t two[2] = {{.slot = b, .n_tokens = 4, .tokens = toks}, {.slot = a, .n_tokens = 2, .tokens = bad}};
    CHECK(st_engine_step(e, two, 2, lg) == ST_ERR_OUT_OF_RANGE, "bad token id rejected");
    CHECK(strstr(st_err_last(), "vocabulary") != NULL, "error names the vocabulary: %s", st_err_last());
    CHECK(st_engine_seq_len(e, a) == 8 && st_engine_seq_len(e, b) == 0, "state untouched after error");
    st_seq_chunk_t closed = {.slot = 7, .n_tokens = 1, .tokens = toks};
    CHECK(st_engine_step(e, &closed, 1, lg) == ST_ERR_INVALID_ARG, "unknown slot rejected");
    st_seq_chunk_t big = {.slot = b, .n_tokens = 17, .tokens = toks};
    int many[17] = {0};
    big.tokens = many;
    CHECK(st_engine_step(e, &big, 1, lg) == ST_ERR_CAPACITY, "step budget enforced");
    st_seq_chunk_t longer = {.slot = a, .n_tokens = 16, .tokens = toks + 0};
    CHECK(st_engine_step(e, &longer, 1, lg) == ST_ERR_CAPACITY, "context limit enforced (8 + 16 > 20)");
    /* the sequence still continues exactly as if nothing happened: compare with a fresh run */
    int nxt = 3;
    st_seq_chunk_t d = {.slot = a, .n_tokens = 1, .tokens = &nxt};
    CHECK(st_engine_step(e, &d, 1, lg) == ST_OK, "decode after errors");
    st_engine_seq_close(e, a);
    st_engine_seq_close(e, b);
    float *fresh = malloc(sizeof(float) * V);
    int s2;
    st_engine_seq_open(e, &s2);
    st_seq_chunk_t p2 = {.slot = s2, .n_tokens = 8, .tokens = toks};
    st_engine_step(e, &p2, 1, fresh);
    CHECK(memcmp(fresh, ref, sizeof(float) * V) == 0, "reopened slot starts from empty state");
    st_seq_chunk_t d2 = {.slot = s2, .n_tokens = 1, .tokens = &nxt};
    st_engine_step(e, &d2, 1, fresh);
    CHECK(memcmp(fresh, lg, sizeof(float) * V) == 0, "decode after rejected steps equals a clean run");
    free(fresh); free(lg); free(ref);
    st_engine_destroy(e);
}

/* Hook that empties every routed set: the MoE output must then be the shared path only, which is
 * what quantile routing gives when every threshold is above every score. */
static int hook_calls;
static void hook_empty(void *ctx, int layer, int T, int n, const float *s, int *ids, int *cnt, int kmax) {
    hook_calls++;
    for (int t = 0; t < T; t++) cnt[t] = 0;
}
static void hook_count(void *ctx, int layer, int T, int n, const float *s, int *ids, int *cnt, int kmax) {
    int *tot = ctx;
    for (int t = 0; t < T; t++) {
        tot[0] += cnt[t];
        CHECK(cnt[t] <= kmax, "cnt within kmax");
        for (int i = 1; i < cnt[t]; i++) CHECK(ids[t * kmax + i - 1] < ids[t * kmax + i], "ids ascending");
        for (int i = 0; i < cnt[t]; i++) tot[1] += s[(size_t)t * n + ids[t * kmax + i]] < 0.5f;
    }
}

static void test_quantile(void) {
    enum { N = 12 };
    int toks[N];
    prompt(toks, N, 9);
    float *a = malloc(sizeof(float) * N * V), *b = malloc(sizeof(float) * N * V);
    st_engine_t *e = mk(1, N, N, ST_ROUTE_TOPK);
    st_engine_t *q = mk(1, N, N, ST_ROUTE_QUANTILE);
    if (!e || !q) return;
    int whole[] = {N};
    st_engine_set_route_hook(e, hook_empty, NULL);
    run_seq(e, toks, whole, 1, a);
    CHECK(hook_calls == cfg->n_layers - cfg->first_k_dense, "hook called once per MoE layer (%d)", hook_calls);
    size_t nt = (size_t)cfg->n_layers * cfg->n_experts;
    float *tau = malloc(sizeof(float) * nt);
    for (size_t i = 0; i < nt; i++) tau[i] = 2.0f; /* above any sigmoid score */
    st_engine_set_thresholds(q, tau, 1);
    run_seq(q, toks, whole, 1, b);
    CHECK(memcmp(a, b, sizeof(float) * N * V) == 0, "quantile with unreachable thresholds = shared path only");
    /* thresholds at 0.5: every active expert has s >= 0.5, at most k_max = 2k per token */
    for (size_t i = 0; i < nt; i++) tau[i] = 0.5f;
    st_engine_set_thresholds(q, tau, 2);
    int tot[2] = {0, 0};
    st_engine_set_route_hook(q, hook_count, tot);
    run_seq(q, toks, whole, 1, b);
    CHECK(tot[0] > 0 && tot[1] == 0, "quantile sets respect thresholds (%d chosen, %d below τ)", tot[0], tot[1]);
    free(tau); free(a); free(b);
    st_engine_destroy(e);
    st_engine_destroy(q);
}

/* Two micro-batches in flight at once, advanced alternately (ping-pong) with the experts run
 * between, give exactly what one st_engine_step per sequence gives. */
static void test_microbatch(void) {
    enum { N0 = 9, N1 = 23 };
    int t0[N0], t1[N1];
    prompt(t0, N0, 21);
    prompt(t1, N1, 22);
    st_engine_t *e = mk(4, 64, 64, ST_ROUTE_TOPK);
    if (!e) return;
    float *ref = malloc(sizeof(float) * (N0 + N1) * V), *got = malloc(sizeof(float) * (N0 + N1) * V);
    int s0, s1;
    st_engine_seq_open(e, &s0);
    st_engine_seq_open(e, &s1);
    st_seq_chunk_t c0 = {.slot = s0, .n_tokens = N0, .tokens = t0, .all_logits = true};
    st_seq_chunk_t c1 = {.slot = s1, .n_tokens = N1, .tokens = t1, .all_logits = true};
    CHECK(st_engine_step(e, &c0, 1, ref) == ST_OK, "ref 0");
    CHECK(st_engine_step(e, &c1, 1, ref + (size_t)N0 * V) == ST_OK, "ref 1");
    st_engine_seq_close(e, s0);
    st_engine_seq_close(e, s1);
    st_engine_seq_open(e, &s0);
    st_engine_seq_open(e, &s1);
    c0.slot = s0;
    c1.slot = s1;
    st_engine_mb_t *m0 = NULL, *m1 = NULL;
    CHECK(st_engine_mb_create(e, &m0) == ST_OK && st_engine_mb_create(e, &m1) == ST_OK, "mb create");
    CHECK(st_engine_mb_begin(m0, &c0, 1, got) == ST_OK, "mb0 begin");
    CHECK(st_engine_mb_begin(m1, &c1, 1, got + (size_t)N0 * V) == ST_OK, "mb1 begin");
    CHECK(st_engine_mb_begin(m1, &c0, 1, got) != ST_OK, "a micro-batch in flight cannot begin again");
    st_moe_work_t w0, w1;
    int r0 = st_engine_mb_advance(m0, &w0), r1 = st_engine_mb_advance(m1, &w1), rounds = 0;
    while (r0 || r1) {
        if (r0) { st_engine_mb_run_local(m0, &w0); r0 = st_engine_mb_advance(m0, &w0); }
        if (r1) { st_engine_mb_run_local(m1, &w1); r1 = st_engine_mb_advance(m1, &w1); }
        rounds++;
    }
    CHECK(rounds == cfg->n_layers - cfg->first_k_dense, "one round per MoE layer (%d)", rounds);
    CHECK(memcmp(ref, got, sizeof(float) * (N0 + N1) * V) == 0, "ping-pong micro-batches == one step each");
    CHECK(st_engine_seq_len(e, s0) == N0 && st_engine_seq_len(e, s1) == N1, "lengths advanced");
    st_engine_mb_destroy(m0);
    st_engine_mb_destroy(m1);
    free(ref);
    free(got);
    st_engine_destroy(e);
}

/* st_seq_chunk_t.argmax: the argmax of the entry's row (st_argmax's rule), ignored with
 * all_logits; logits of the other entries unchanged. */
static void test_argmax(void) {
    st_engine_t *e = mk(3, 64, 64, ST_ROUTE_TOPK);
    int slots[3], toks[3][9], am[3] = {-7, -7, -7};
    float *lg = malloc(sizeof(float) * 12 * V), *ref = malloc(sizeof(float) * 12 * V);
    for (int i = 0; i < 3; i++) {
        CHECK(st_engine_seq_open(e, &slots[i]) == ST_OK, "open");
        prompt(toks[i], 9, 40 + i);
    }
    /* reference: the same step without argmax (state is rebuilt in fresh slots below) */
    st_seq_chunk_t c[3] = {{.slot = slots[0], .n_tokens = 9, .tokens = toks[0]},
                           {.slot = slots[1], .n_tokens = 9, .tokens = toks[1], .all_logits = true},
                           {.slot = slots[2], .n_tokens = 9, .tokens = toks[2]}};
    CHECK(st_engine_step(e, c, 3, ref) == ST_OK, "reference step: %s", st_err_last());
    for (int i = 0; i < 3; i++) {
        st_engine_seq_close(e, slots[i]);
        CHECK(st_engine_seq_open(e, &slots[i]) == ST_OK, "reopen");
        c[i].slot = slots[i];
        c[i].argmax = &am[i];
    }
    CHECK(st_engine_step(e, c, 3, lg) == ST_OK, "argmax step: %s", st_err_last());
    CHECK(am[0] == st_argmax(ref, V), "entry 0: argmax %d, expected %d", am[0], st_argmax(ref, V));
    CHECK(am[1] == -7, "entry 1 (all_logits): argmax written (%d)", am[1]);
    CHECK(am[2] == st_argmax(ref + (size_t)10 * V, V), "entry 2: argmax %d, expected %d", am[2],
          st_argmax(ref + (size_t)10 * V, V));
    CHECK(memcmp(lg + V, ref + V, sizeof(float) * 9 * V) == 0, "all_logits rows unchanged");
    for (int i = 0; i < 3; i++) st_engine_seq_close(e, slots[i]);
    free(lg), free(ref);
    st_engine_destroy(e);
}

/* st_seq_chunk_t.sample: the engine's sampling op against st_sample_rows over the raw logits of a
 * twin sequence fed the same tokens in the same steps (no sampling there), with the penalties'
 * counts kept here by hand: the same token, processed row, logprobs; counts start over at a slot's
 * open; bad sampling parameters are refused with nothing changed. */
static void test_sample(void) {
    st_engine_t *e = mk(2, 64, 64, ST_ROUTE_TOPK);
    int sa, sb, toks[8], cur, tok = -1, tids[ST_SAMPLE_MAX_TOP];
    float *lg = malloc(sizeof(float) * 2 * V), *raw = malloc(sizeof(float) * V), lp = 0, tlp[ST_SAMPLE_MAX_TOP];
    int *cnt = calloc((size_t)V, sizeof(int));
    const uint32_t bias_ids[2] = {5, 9};
    const float bias_v[2] = {3.0f, -2.0f};
    st_sample_params_t sp = {.temperature = 0.9f, .top_k = 40, .top_p = 0.9f, .presence = 1.0f, .frequency = 0.5f,
                             .seed = 77, .n_top = 5, .n_bias = 2, .bias_ids = bias_ids, .bias_values = bias_v};
    prompt(toks, 8, 3);
    for (int round = 0; round < 2; round++) { /* round 1: the slots reopened, the counts start over */
        CHECK(st_engine_seq_open(e, &sa) == ST_OK && st_engine_seq_open(e, &sb) == ST_OK, "open");
        memset(cnt, 0, sizeof(int) * (size_t)V);
        int same_tok = 1, same_row = 1, same_lp = 1, diff_tok = 0;
        const int *in = toks;
        int n = 8;
        for (int step = 0; step < 12; step++) {
            sp.pos = (uint32_t)step;
            st_seq_chunk_t c[2] = {{.slot = sa, .n_tokens = n, .tokens = in, .sample = &sp, .keep_logits = true,
                                    .token = &tok, .logprob = &lp, .top_ids = tids, .top_logprobs = tlp},
                                   {.slot = sb, .n_tokens = n, .tokens = in}};
            if (st_engine_step(e, c, 2, lg) != ST_OK) {
                CHECK(0, "sampling step: %s", st_err_last());
                break;
            }
            memcpy(raw, lg + V, sizeof(float) * (size_t)V); /* the twin's row: the raw logits */
            st_sample_row_t r = {.temperature = sp.temperature, .top_p = sp.top_p, .presence = sp.presence,
                                 .frequency = sp.frequency, .top_k = sp.top_k, .n_top = 5, .n_bias = 2, .pos = sp.pos,
                                 .seed = sp.seed, .count_row = 0};
            int want, wt[ST_SAMPLE_MAX_TOP];
            float wlp, wtl[ST_SAMPLE_MAX_TOP];
            st_sample_rows(&want, &wlp, wt, wtl, raw, 1, V, &r, bias_ids, bias_v, cnt); /* then cnt[want]++ */
            same_tok &= tok == want;
            same_row &= memcmp(lg, raw, sizeof(float) * (size_t)V) == 0;
            same_lp &= lp == wlp && memcmp(tids, wt, sizeof(int) * 5) == 0 && memcmp(tlp, wtl, sizeof(float) * 5) == 0;
            diff_tok += step > 0 && tok != cur;
            cur = tok;
            in = &cur;
            n = 1;
        }
        CHECK(same_tok, "round %d: the engine's tokens are st_sample_rows' over the twin's logits", round);
        CHECK(same_row, "round %d: the processed row (penalties from the sampled tokens, bias)", round);
        CHECK(same_lp, "round %d: logprobs and the top 5", round);
        CHECK(diff_tok > 0, "round %d: sampling moves (%d changes in 12 tokens)", round, diff_tok);
        st_engine_seq_close(e, sa);
        st_engine_seq_close(e, sb);
    }
    /* refused: with all_logits, with argmax, without token, too many top logprobs or biases */
    CHECK(st_engine_seq_open(e, &sa) == ST_OK, "open");
    st_seq_chunk_t bad = {.slot = sa, .n_tokens = 8, .tokens = toks, .sample = &sp, .token = &tok, .logprob = &lp,
                          .top_ids = tids, .top_logprobs = tlp};
    st_seq_chunk_t b1 = bad, b2 = bad, b3 = bad, b4 = bad, b5 = bad;
    st_sample_params_t p21 = sp, pbias = sp;
    p21.n_top = ST_SAMPLE_MAX_TOP + 1;
    pbias.n_bias = ST_ENGINE_MAX_BIAS + 1;
    b1.all_logits = true, b2.argmax = &tok, b3.token = NULL, b4.sample = &p21, b5.sample = &pbias;
    const st_seq_chunk_t *bads[] = {&b1, &b2, &b3, &b4, &b5};
    int refused = 0;
    for (int i = 0; i < 5; i++) refused += st_engine_step(e, bads[i], 1, lg) == ST_ERR_INVALID_ARG;
    CHECK(refused == 5 && st_engine_seq_len(e, sa) == 0, "bad sampling parameters refused (%d of 5), nothing consumed",
          refused);
    st_engine_seq_close(e, sa);
    free(lg), free(raw), free(cnt);
    st_engine_destroy(e);
}

/* The frontend over the CPU backend: the documented option defaults, a synchronous engine (collect
 * computes, a micro-batch is always ready), and a remote-experts engine that has no st_engine_step
 * and whose micro-batches stop at every MoE layer with a work item naming it. */
static void test_frontend(void) {
    st_engine_opts_t o;
    st_engine_opts_default(&o);
    CHECK(o.device == -1 && o.cuda_graphs && !o.host_route, "option defaults: CPU, graphs on, device routing");
    o.max_seqs = 1, o.max_batch_tokens = 8, o.max_ctx = 16, o.remote_experts = true;
    st_engine_t *e;
    CHECK(st_engine_create(&e, ck, &o) == ST_OK, "remote-experts engine: %s", st_err_last());
    if (!e) return;
    CHECK(!st_engine_async(e), "the CPU backend is synchronous");
    int slot, tok[3] = {1, 2, 3};
    float *lg = malloc(sizeof(float) * (size_t)V);
    CHECK(st_engine_seq_open(e, &slot) == ST_OK, "open");
    st_seq_chunk_t c = {.slot = slot, .n_tokens = 3, .tokens = tok};
    CHECK(st_engine_step(e, &c, 1, lg) == ST_ERR_INVALID_ARG, "st_engine_step needs local experts");
    st_engine_mb_t *mb;
    CHECK(st_engine_mb_create(e, &mb) == ST_OK, "mb create");
    CHECK(st_engine_mb_begin(mb, &c, 1, lg) == ST_OK, "mb begin");
    CHECK(st_engine_mb_ready(mb), "a CPU micro-batch is always ready");
    st_moe_work_t w;
    int layers = 0, moe = 0, last = -1;
    for (int l = 0; l < cfg->n_layers; l++) moe += st_config_is_moe_layer(cfg, l);
    int none = 1;
    while (st_engine_mb_advance(mb, &w)) { /* no node values: +0 rows, the shared path only */
        CHECK(w.layer > last && st_config_is_moe_layer(cfg, w.layer) && w.T == 3, "work item of MoE layer %d (T %d)",
              w.layer, w.T);
        last = w.layer;
        for (int k = 0; k < w.T * w.kc; k++) none &= w.at[k] == NULL;
        layers++;
    }
    CHECK(none, "the node-value table comes all NULL");
    CHECK(moe > 0 && layers == moe, "one hand-off per MoE layer (%d of %d)", layers, moe);
    CHECK(st_engine_seq_len(e, slot) == 3, "length advanced after the step");
    st_engine_mb_destroy(mb);
    st_engine_destroy(e);
    free(lg);
}

int main(void) {
    const char *tmp = getenv("STRATA_TEST_TMP");
    char dir[512];
    snprintf(dir, sizeof dir, "%s/engine-tiny-%d", tmp ? tmp : "/tmp", (int)getpid());
    st_ckpt_init_opts_t io = {.preset = "tiny", .out_dir = dir, .seed = 7, .dtype = ST_DT_BF16};
    if (st_ckpt_init(&io) != ST_OK || st_ckpt_open(&ck, dir) != ST_OK) {
        fprintf(stderr, "cannot make tiny checkpoint: %s\n", st_err_last());
        return 1;
    }
    cfg = st_ckpt_config(ck);
    V = cfg->vocab;
    test_pieces();
    test_batch_invariance();
    test_errors();
    test_quantile();
    test_microbatch();
    test_argmax();
    test_sample();
    test_frontend();
    st_ckpt_close(ck);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return st_test_done();
}
