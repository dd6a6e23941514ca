/* The threshold counts the router's epilogue makes (issue 16 item 1) against the scores path of the
 * summaries: st_route_count (kernels/, the C twin of the CUDA epilogue st_cuda_router_quantile_count) gives
 * st_qsum_count_layer's integers (ties exactly at τ, NaN τ, NaN and infinite scores, ρ on both
 * sides, odd n, T up to 4096); and through the CPU engine (tiny preset, quantile routing, one layer
 * unset, layers probed below and above τ), a summary built from the count observer's counts is
 * byte-identical to the one built from the route observer's scores. The CUDA kernel against the
 * twin: tests/gpu/test_gpu_route_count. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "strata/engine.h"
#include "strata/kernels.h"
#include "strata/quantile.h"

/* ---------------- the C twin vs the quantile module's reference ---------------- */
static void test_twin(void) {
    st_rng_t r = {5};
    const int shapes[][2] = {{1, 1}, {7, 37}, {256, 896}, {4096, 896}, {3, 9}, {0, 5}};
    int bad = 0, nonzero = 0;
    for (size_t si = 0; si < ST_ARRAY_LEN(shapes); si++) {
        int T = shapes[si][0], n = shapes[si][1];
        size_t tn = (size_t)T * n;
        float *s = malloc(sizeof(float) * (tn + 1)), *tau = malloc(sizeof(float) * n), *rho = malloc(sizeof(float) * n);
        uint32_t *c0 = malloc(4 * n), *b0 = malloc(4 * n), *c1 = malloc(4 * n), *b1 = malloc(4 * n);
        for (size_t i = 0; i < tn; i++) {
            uint64_t v = st_rng_next(&r) % 64;
            s[i] = v == 0 ? NAN : v == 1 ? INFINITY : v == 2 ? -INFINITY : (float)(v % 16) / 16.0f; /* many ties */
        }
        for (int j = 0; j < n; j++) {
            int kind = j % 9;
            tau[j] = kind == 3 ? NAN : kind == 5 ? -1.0f /* all above */ : kind == 6 ? 2.0f /* none above */
                                                 : (float)(st_rng_next(&r) % 16) / 16.0f; /* on score values */
            rho[j] = kind == 7 ? NAN : tau[j] + (j % 2 ? 0.125f : -0.1875f);
        }
        for (int mode = 0; mode < 2; mode++) { /* with and without the band */
            const float *rh = mode ? NULL : rho;
            memset(c1, 0xab, 4 * n), memset(b1, 0xab, 4 * n);
            st_qsum_count_layer(s, (uint32_t)T, (uint32_t)n, tau, rh, c0, rh ? b0 : NULL);
            st_route_count(c1, rh ? b1 : NULL, s, tau, rh, T, n);
            for (int j = 0; j < n; j++) {
                bad += c0[j] != c1[j] || (rh && b0[j] != b1[j]);
                nonzero += c1[j] > 0 && c1[j] < (uint32_t)T;
            }
        }
        free(s); free(tau); free(rho); free(c0); free(b0); free(c1); free(b1);
    }
    CHECK(bad == 0, "st_route_count = st_qsum_count_layer: %d mismatches", bad);
    CHECK(nonzero > 1000, "counts strictly between 0 and T exercised (%d)", nonzero);
}

/* ---------------- the engine: counts path vs scores path ---------------- */
static st_ckpt_t *ck;
static const st_config_t *cfg;

typedef struct {
    st_qsum_t *b;
    int first;
    int scored, null_scores, counted, banded, bad, inner; /* inner: counts strictly in (0, T) */
    float *cal;  /* calibration pass: [L][T][n] scores */
    int T;
} obs_t;

static void on_route(void *ctx, int layer, int T, int n, const float *s, const int *ids, const int *cnt, int kmax) {
    obs_t *o = ctx;
    (void)ids, (void)cnt, (void)kmax;
    if (!s) {
        o->null_scores++;
        return;
    }
    o->scored++;
    if (o->cal) memcpy(o->cal + (size_t)layer * T * n, s, sizeof(float) * T * n);
    if (o->b && st_qsum_add_layer(o->b, (uint32_t)(layer - o->first), s, (uint32_t)T) != ST_OK) o->bad++;
}
static void on_count(void *ctx, int layer, int T, int n, const uint32_t *cnt, const uint32_t *band) {
    obs_t *o = ctx;
    o->counted++;
    o->banded += band != NULL;
    for (int j = 0; j < n; j++) o->inner += cnt[j] > 0 && cnt[j] < (uint32_t)T;
    if (st_qsum_add_layer_counts(o->b, (uint32_t)(layer - o->first), (uint32_t)T, cnt, band) != ST_OK) o->bad++;
}

static void run(st_engine_t *e, const int *toks, int T) {
    int slot;
    CHECK(st_engine_seq_open(e, &slot) == ST_OK, "slot");
    float *lg = malloc(sizeof(float) * cfg->vocab);
    st_seq_chunk_t c = {.slot = slot, .n_tokens = T, .tokens = toks};
    CHECK(st_engine_step(e, &c, 1, lg) == ST_OK, "step: %s", st_err_last());
    st_engine_seq_close(e, slot);
    free(lg);
}

static void test_engine_paths(void) {
    enum { T = 24 };
    int L = cfg->n_layers, n = cfg->n_experts, first = cfg->first_k_dense, n_moe = L - first;
    st_engine_opts_t eo;
    st_engine_opts_default(&eo);
    eo.max_seqs = 1, eo.max_batch_tokens = T, eo.max_ctx = T, eo.routing = ST_ROUTE_QUANTILE;
    st_engine_t *e = NULL;
    CHECK(st_engine_create(&e, ck, &eo) == ST_OK, "engine: %s", st_err_last());
    if (!e) return;
    int toks[T];
    for (int i = 0; i < T; i++) toks[i] = (i * 7919 + 13) % cfg->vocab;
    /* calibration (no thresholds: top-k): τ_j = the score of token 5 (ties exactly at τ) */
    size_t cells = (size_t)L * n;
    float *tau = malloc(sizeof(float) * cells), *rho = malloc(sizeof(float) * cells);
    obs_t cal = {.first = first, .T = T, .cal = calloc(cells * T, sizeof(float))};
    st_engine_set_route_observer(e, on_route, &cal, true);
    run(e, toks, T);
    CHECK(cal.scored == n_moe, "calibration saw every MoE layer (%d)", cal.scored);
    obs_t lean = {.first = first}; /* an observer set without scores (the worker in top-k mode) */
    st_engine_set_route_observer(e, on_route, &lean, false);
    run(e, toks, T);
    CHECK(lean.null_scores == n_moe && lean.scored == 0, "an observer without scores gets NULL at every layer (%d)",
          lean.null_scores);
    st_engine_set_route_observer(e, on_route, &cal, true);
    for (int l = 0; l < L; l++)
        for (int j = 0; j < n; j++) {
            size_t i = (size_t)l * n + j;
            tau[i] = cal.cal[((size_t)l * T + 5) * n + j];
            int m = l - first;
            /* layer first+1 unset (top-k, INIT section); probes below τ on even MoE layers from 2,
             * above on layer first+3 */
            if (m == 1) tau[i] = NAN;
            rho[i] = m >= 2 && m % 2 == 0 ? tau[i] - 0.05f : m == 3 ? tau[i] + 0.02f : NAN;
        }
    st_engine_set_thresholds(e, tau, 1);
    st_engine_set_probes(e, rho);
    st_qtable_t tab = {.version = 1, .n_layers = (uint32_t)n_moe, .n_experts = (uint32_t)n,
                       .tau = tau + (size_t)first * n, .rho = rho + (size_t)first * n};
    st_qsum_t *b[2] = {NULL, NULL};
    size_t cap = st_qsum_max_bytes((uint32_t)n_moe, (uint32_t)n, (uint32_t)cfg->top_k, T), len[2] = {0, 0};
    uint8_t *buf[2] = {malloc(cap), malloc(cap)};
    obs_t o[2] = {{.first = first}, {.first = first}};
    for (int p = 0; p < 2; p++) { /* 0: scores path (route observer only); 1: the count observer too */
        CHECK(st_qsum_create((uint32_t)n_moe, (uint32_t)n, (uint32_t)cfg->top_k, T, &b[p]) == ST_OK, "qsum create");
        CHECK(st_qsum_begin(b[p], buf[p], cap, 3, 1, &tab) == ST_OK, "qsum begin");
        o[p].b = b[p];
        st_engine_set_route_observer(e, on_route, &o[p], true);
        st_engine_set_count_observer(e, p ? on_count : NULL, &o[p]);
        run(e, toks, T);
        CHECK(st_qsum_finish(b[p], &len[p]) == ST_OK, "qsum finish");
        CHECK(o[p].bad == 0, "path %d: every layer added (%d refused: %s)", p, o[p].bad, st_err_last());
    }
    int probed = 0;
    for (int m = 0; m < n_moe; m++) probed += m != 1 && m >= 2 && (m % 2 == 0 || m == 3);
    CHECK(o[0].scored == n_moe && o[0].null_scores == 0 && o[0].counted == 0, "scores path: scores at every layer");
    CHECK(o[1].counted == n_moe - 1 && o[1].null_scores == n_moe - 1 && o[1].scored == 1,
          "counts path: counts at the %d set layers (%d), scores only at the unset one (%d), none beside counts (%d)",
          n_moe - 1, o[1].counted, o[1].scored, o[1].null_scores);
    CHECK(o[1].banded == probed, "band counts at the %d probed layers (%d)", probed, o[1].banded);
    CHECK(o[1].inner > n, "counts strictly between 0 and T (%d experts x layers)", o[1].inner);
    CHECK(st_qsum_last_sections(b[0]) == (uint32_t)n_moe && st_qsum_last_sections(b[1]) == (uint32_t)n_moe,
          "every layer in both summaries");
    CHECK(len[0] == len[1] && len[0] > 0 && memcmp(buf[0], buf[1], len[0]) == 0,
          "summary from counts byte-identical to the one from scores (%zu vs %zu bytes)", len[1], len[0]);
    /* probes cleared: the count observer gets no band, and the summary still matches for unprobed tables */
    st_engine_set_probes(e, NULL);
    obs_t q = {.first = first};
    float *nan_rho = malloc(sizeof(float) * cells);
    for (size_t i = 0; i < cells; i++) nan_rho[i] = NAN;
    tab.rho = nan_rho + (size_t)first * n;
    CHECK(st_qsum_begin(b[1], buf[1], cap, 3, 2, &tab) == ST_OK, "qsum begin");
    q.b = b[1];
    st_engine_set_route_observer(e, on_route, &q, true);
    st_engine_set_count_observer(e, on_count, &q);
    run(e, toks, T);
    CHECK(st_qsum_finish(b[1], &len[1]) == ST_OK && q.bad == 0 && q.banded == 0 && q.counted == n_moe - 1,
          "no probes: counts without band (%d banded, %d refused)", q.banded, q.bad);
    for (int p = 0; p < 2; p++) st_qsum_destroy(b[p]), free(buf[p]);
    free(nan_rho), free(tau), free(rho), free(cal.cal);
    st_engine_destroy(e);
}

int main(void) {
    test_twin();
    const char *tmp = getenv("STRATA_TEST_TMP");
    char dir[512];
    snprintf(dir, sizeof dir, "%s/qengine-tiny-%d", tmp ? tmp : "/tmp", (int)getpid());
    st_ckpt_init_opts_t io = {.preset = "tiny", .out_dir = dir, .seed = 7, .dtype = ST_DT_BF16};
    if (st_ckpt_init(&io) != ST_OK || st_ckpt_open(&ck, dir) != ST_OK) {
        fprintf(stderr, "cannot make tiny checkpoint: %s\n", st_err_last());
        return 1;
    }
    cfg = st_ckpt_config(ck);
    test_engine_paths();
    st_ckpt_close(ck);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return st_test_done();
}
