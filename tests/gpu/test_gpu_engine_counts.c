/* The GPU engine's threshold counts (the count observer, engine.h): at every MoE layer routed by its
 * thresholds the counts made on the device after routing equal, per expert, the number of tokens
 * whose quantile set holds it (k_max = n, so every expert at or above τ is in the set: cnt is the
 * set count exactly), for st_engine_step, for micro-batches (hand-off path) and for a step routed on the
 * host (an identity route hook: the counts there come from the C twin over the σ scores); band counts arrive
 * exactly on the probed layers, within [0, T]; the route observer's scores are NULL on counted
 * layers and present on the unset one (top-k, its first threshold). tiny preset; exit 77 without
 * a GPU. The kernel itself: test_gpu_route_count; the summary bytes: tests/quantile/test_qengine. */
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "strata/engine.h"
#include "strata/gpu.h"

enum { T = 24 };
static const st_config_t *cfg;

typedef struct {
    int first, n;
    float *cal;                       /* [L][T][n] scores of the calibration pass */
    uint32_t *cnt;                    /* [L][n] counts of the pass */
    int counted, banded, bad_band, scored, null_scores, bad_sets;
} obs_t;

static void on_route(void *ctx, int layer, int T_, int n, const float *s, const int *ids, const int *cnt, int kmax) {
    obs_t *o = ctx;
    if (!s) o->null_scores++;
    else o->scored++;
    if (s && o->cal) memcpy(o->cal + (size_t)layer * T_ * n, s, sizeof(float) * T_ * n);
    if (!o->cnt || s) return;
    /* a counted layer: the counts must equal the set counts */
    uint32_t *want = calloc((size_t)n, sizeof(uint32_t));
    for (int t = 0; t < T_; t++)
        for (int i = 0; i < cnt[t]; i++) want[ids[(size_t)t * kmax + i]]++;
    for (int j = 0; j < n; j++) o->bad_sets += want[j] != o->cnt[(size_t)layer * n + j];
    free(want);
}
static void same_sets(void *ctx, int layer, int T_, int n, const float *s, int *ids, int *cnt, int kmax) {
    (void)ctx, (void)layer, (void)T_, (void)n, (void)s, (void)ids, (void)cnt, (void)kmax;
}
static void on_count(void *ctx, int layer, int T_, int n, const uint32_t *cnt, const uint32_t *band) {
    obs_t *o = ctx;
    o->counted++;
    o->banded += band != NULL;
    memcpy(o->cnt + (size_t)layer * n, cnt, sizeof(uint32_t) * n);
    for (int j = 0; band && j < n; j++) o->bad_band += band[j] > (uint32_t)T_;
}

int main(void) {
    if (st_gpu_device_count() <= 0) {
        printf("test_gpu_engine_counts: no CUDA device, skipped\n");
        return 77;
    }
    const char *tmp = getenv("STRATA_TEST_TMP");
    char dir[512];
    snprintf(dir, sizeof dir, "%s/gpu-counts-tiny-%d", tmp ? tmp : "/tmp", (int)getpid());
    st_ckpt_init_opts_t io = {.preset = "tiny", .out_dir = dir, .seed = 7, .dtype = ST_DT_BF16};
    st_ckpt_t *ck = NULL;
    if (st_ckpt_init(&io) != ST_OK || st_ckpt_open(&ck, dir) != ST_OK) {
        fprintf(stderr, "cannot make tiny checkpoint: %s\n", st_err_last());
        return 1;
    }
    cfg = st_ckpt_config(ck);
    int L = cfg->n_layers, n = cfg->n_experts, first = cfg->first_k_dense, n_moe = L - first;
    st_engine_opts_t eo;
    st_engine_opts_default(&eo);
    eo.max_seqs = 1, eo.max_batch_tokens = T, eo.max_ctx = 2 * T, eo.routing = ST_ROUTE_QUANTILE;
    eo.k_max = n, eo.device = 0, eo.cuda_graphs = false;
    st_engine_t *e = NULL;
    CHECK(st_engine_create(&e, ck, &eo) == ST_OK, "GPU engine: %s", st_err_last());
    if (!e) return st_test_done();
    int toks[T];
    for (int i = 0; i < T; i++) toks[i] = (i * 7919 + 13) % cfg->vocab;
    size_t cells = (size_t)L * n;
    float *tau = malloc(sizeof(float) * cells), *rho = malloc(sizeof(float) * cells);
    float *lg = malloc(sizeof(float) * (size_t)cfg->vocab);
    obs_t cal = {.first = first, .n = n, .cal = calloc(cells * T, sizeof(float))};
    st_engine_set_route_observer(e, on_route, &cal, true);
    int slot;
    st_seq_chunk_t ch = {.n_tokens = T, .tokens = toks};
    CHECK(st_engine_seq_open(e, &slot) == ST_OK, "slot");
    ch.slot = slot;
    CHECK(st_engine_step(e, &ch, 1, lg) == ST_OK, "calibration step: %s", st_err_last());
    st_engine_seq_close(e, slot);
    CHECK(cal.scored == n_moe, "calibration: scores at every MoE layer (%d)", cal.scored);
    obs_t lean = {.first = first, .n = n}; /* an observer without scores: none copied back, NULL given */
    st_engine_set_route_observer(e, on_route, &lean, false);
    CHECK(st_engine_seq_open(e, &slot) == ST_OK, "slot");
    ch.slot = slot;
    CHECK(st_engine_step(e, &ch, 1, lg) == ST_OK, "step without scores: %s", st_err_last());
    st_engine_seq_close(e, slot);
    CHECK(lean.null_scores == n_moe && lean.scored == 0, "an observer without scores gets NULL at every layer (%d)",
          lean.null_scores);
    st_engine_set_route_observer(e, on_route, &cal, true);
    for (int l = 0; l < L; l++)
        for (int j = 0; j < n; j++) {
            size_t i = (size_t)l * n + j;
            int m = l - first;
            tau[i] = m == 1 ? NAN : cal.cal[((size_t)l * T + 5) * n + j]; /* ties exactly at τ */
            rho[i] = m >= 2 && m % 2 == 0 ? tau[i] - 0.05f : m == 3 ? tau[i] + 0.02f : NAN;
        }
    int probed = 0;
    for (int m = 0; m < n_moe; m++) probed += m >= 2 && (m % 2 == 0 || m == 3);
    st_engine_set_thresholds(e, tau, 1);
    st_engine_set_probes(e, rho);
    for (int pass = 0; pass < 3; pass++) { /* 0: st_engine_step; 1: a micro-batch (hand-off path); 2: host routing */
        obs_t o = {.first = first, .n = n, .cnt = calloc(cells, sizeof(uint32_t))};
        st_engine_set_route_observer(e, on_route, &o, true);
        st_engine_set_count_observer(e, on_count, &o);
        CHECK(st_engine_seq_open(e, &slot) == ST_OK, "slot");
        ch.slot = slot;
        if (pass != 1) {
            st_engine_set_route_hook(e, pass == 2 ? same_sets : NULL, NULL);
            CHECK(st_engine_step(e, &ch, 1, lg) == ST_OK, "step: %s", st_err_last());
            st_engine_set_route_hook(e, NULL, NULL);
        } else {
            st_engine_mb_t *mb = NULL;
            CHECK(st_engine_mb_create(e, &mb) == ST_OK, "micro-batch: %s", st_err_last());
            if (mb) {
                CHECK(st_engine_mb_begin(mb, &ch, 1, lg) == ST_OK, "mb begin: %s", st_err_last());
                st_moe_work_t w;
                while (st_engine_mb_advance(mb, &w)) st_engine_mb_run_local(mb, &w);
                st_engine_mb_destroy(mb);
            }
        }
        st_engine_seq_close(e, slot);
        CHECK(o.counted == n_moe - 1 && o.null_scores == n_moe - 1 && o.scored == 1,
              "pass %d: counts at the %d set layers (%d), NULL scores beside them (%d), scores at the unset one (%d)",
              pass, n_moe - 1, o.counted, o.null_scores, o.scored);
        CHECK(o.banded == probed && o.bad_band == 0, "pass %d: band at the %d probed layers (%d), within T (%d over)",
              pass, probed, o.banded, o.bad_band);
        CHECK(o.bad_sets == 0, "pass %d: device counts = quantile set counts (%d experts x layers differ)", pass,
              o.bad_sets);
        uint32_t tot = 0;
        for (size_t i = 0; i < cells; i++) tot += o.cnt[i];
        CHECK(tot > 0, "pass %d: some tokens at or above τ (%u)", pass, tot);
        free(o.cnt);
    }
    st_engine_destroy(e);
    st_ckpt_close(ck);
    free(tau), free(rho), free(lg), free(cal.cal);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return st_test_done();
}
