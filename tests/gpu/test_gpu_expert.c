/* The expert server's GPU compute (expert_server/compute_gpu.c) against its CPU compute
 * (st_es_compute_run) on the same grouped dispatches of a tiny checkpoint, bf16 and MXFP4 experts:
 * empty experts, one-row experts, ids out of order, every expert, the largest dispatch; outputs
 * NaN-poisoned before each run; the same rows sent as distinct rows with sources; plus the error
 * paths (unbound expert, too many rows). */
#include <math.h>
#include <unistd.h>

#include "compute.h"
#include "compute_gpu.h"
#include "gpu_test.h"

#define MAX_ROWS 300

static void run_case(const char *tag, st_es_compute_t *cx, st_es_gpu_t *g, int layer, uint32_t n_exp,
                     const uint32_t *ids, const uint32_t *cnt, int ew, st_rng_t *r, double tol) {
    uint32_t off[65];
    off[0] = 0;
    for (uint32_t k = 0; k < n_exp; k++) off[k + 1] = off[k] + cnt[k];
    size_t n = (size_t)off[n_exp] * ew;
    float *x = gt_xmalloc(n * sizeof(float)), *ref = gt_xmalloc(n * sizeof(float)), *y = gt_xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = st_rng_normal(r); /* fp32: the GPU path rounds to bf16 itself */
    for (size_t i = 0; i < n; i++) ref[i] = y[i] = NAN;
    for (uint32_t k = 0; k < n_exp; k++) {
        GT_OK(st_es_compute_bind(cx, layer, (int)ids[k]));
        GT_OK(st_es_gpu_bind(g, layer, (int)ids[k]));
    }
    GT_OK(st_es_compute_run(cx, layer, n_exp, ids, off, x, NULL, ref));
    GT_OK(st_es_gpu_run(g, layer, n_exp, ids, off, x, off[n_exp], NULL, false, y));
    char what[160];
    snprintf(what, sizeof what, "%s layer %d, %u experts, %u rows", tag, layer, n_exp, off[n_exp]);
    st_t_close(what, y, ref, n, tol, 0);
    /* the same rows per row (wire.h ST_WIRE_FLAG_PER_ROW: the worker's GPU engine would run them so) */
    for (size_t i = 0; i < n; i++) y[i] = NAN;
    GT_OK(st_es_gpu_run(g, layer, n_exp, ids, off, x, off[n_exp], NULL, true, y));
    snprintf(what, sizeof what, "%s layer %d, %u experts, %u rows, per row", tag, layer, n_exp, off[n_exp]);
    st_t_close(what, y, ref, n, tol, 0);
    /* distinct rows with sources (wire.h ST_WIRE_FLAG_UNIQUE_ROWS): row r = x[src[r]] of nu rows */
    uint32_t rows = off[n_exp], nu = rows / 3 + 1, *src = gt_xmalloc((rows + 1) * sizeof(uint32_t));
    for (uint32_t q = 0; q < rows; q++) src[q] = (q * 7u) % nu;
    for (uint32_t q = 0; q < rows; q++) memcpy(ref + (size_t)q * ew, x + (size_t)src[q] * ew, sizeof(float) * ew);
    for (size_t i = 0; i < n; i++) y[i] = NAN;
    GT_OK(st_es_gpu_run(g, layer, n_exp, ids, off, x, nu, src, false, y)); /* x's first nu rows are the distinct ones */
    float *ref2 = gt_xmalloc(n * sizeof(float) + 1);
    GT_OK(st_es_compute_run(cx, layer, n_exp, ids, off, ref, NULL, ref2));
    snprintf(what, sizeof what, "%s layer %d, %u experts, %u rows from %u distinct", tag, layer, n_exp, rows, nu);
    st_t_close(what, y, ref2, n, tol, 0);
    free(ref2);
    free(src);
    free(x);
    free(ref);
    free(y);
}

static void variant(const char *name, bool mxfp4) {
    char dir[512];
    const char *tmp = getenv("STRATA_TEST_TMP");
    snprintf(dir, sizeof dir, "%s/gpu-expert-%s-%d", tmp ? tmp : "/tmp", name, (int)getpid());
    st_ckpt_init_opts_t io = {.preset = "tiny", .out_dir = dir, .seed = 11, .dtype = ST_DT_BF16, .mxfp4_experts = mxfp4};
    st_ckpt_t *ck = NULL;
    GT_OK(st_ckpt_init(&io));
    GT_OK(st_ckpt_open(&ck, dir));
    const st_config_t *c = st_ckpt_config(ck);
    int ew = st_config_expert_width(c), E = c->n_experts;
    st_es_compute_t cx;
    st_es_gpu_t *g = NULL;
    GT_OK(st_es_compute_init(&cx, ck, MAX_ROWS));
    GT_OK(st_es_gpu_create(&g, ck, 0, MAX_ROWS));
    st_rng_t r = {.s = 3};
    const double tol = 2e-2;
    int l0 = c->first_k_dense, l1 = c->n_layers - 1;

    uint32_t ids_a[] = {1, 3, 4, 7, 15}, cnt_a[] = {5, 0, 1, 37, 130};
    run_case(name, &cx, g, l0, 5, ids_a, cnt_a, ew, &r, tol);
    uint32_t ids_b[] = {9, 2, 12}, cnt_b[] = {17, 3, 64}; /* ids not ascending */
    run_case(name, &cx, g, l1, 3, ids_b, cnt_b, ew, &r, tol);
    uint32_t ids_c[64] = {0}, cnt_c[64] = {0}, tot = 0;
    for (int e = 0; e < E && e < 64; e++) {
        ids_c[e] = (uint32_t)e;
        cnt_c[e] = (uint32_t)((e * 7) % 13); /* includes 0 */
        tot += cnt_c[e];
    }
    run_case(name, &cx, g, l1, (uint32_t)ST_MIN(E, 64), ids_c, cnt_c, ew, &r, tol);
    uint32_t ids_d[] = {0}, cnt_d[] = {MAX_ROWS}; /* the largest dispatch, one expert */
    run_case(name, &cx, g, l0, 1, ids_d, cnt_d, ew, &r, tol);
    uint32_t ids_e[] = {5}, cnt_e[] = {1}; /* one token */
    run_case(name, &cx, g, l0, 1, ids_e, cnt_e, ew, &r, tol);
    CHECK(tot > 0, "all-experts case has rows");

    /* error paths: an expert never bound, a dispatch over max_rows; the path keeps working after */
    float x1[64 * 4] = {0}, y1[64 * 4];
    uint32_t off1[2] = {0, 1}, bad_id[1] = {(uint32_t)(E - 2)}; /* not among ids_a, ids_d, ids_e */
    CHECK(st_es_gpu_run(g, l0, 1, bad_id, off1, x1, 1, NULL, false, y1) == ST_ERR_INVALID_ARG, "unbound expert must fail");
    uint32_t off2[2] = {0, MAX_ROWS + 1};
    CHECK(st_es_gpu_run(g, l0, 1, ids_d, off2, x1, MAX_ROWS + 1, NULL, false, y1) == ST_ERR_CAPACITY, "too many rows must fail with CAPACITY");
    uint32_t off0[2] = {0, 0};
    CHECK(st_es_gpu_run(g, l0, 1, ids_d, off0, x1, 0, NULL, false, y1) == ST_OK, "empty dispatch");
    run_case(name, &cx, g, l0, 5, ids_a, cnt_a, ew, &r, tol);
    printf("%s: %.2f MiB of expert weights on the device\n", name, (double)st_es_gpu_weight_bytes(g) / (1 << 20));

    st_es_gpu_destroy(g);
    st_es_compute_cleanup(&cx);
    st_ckpt_close(ck);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

int main(void) {
    gt_init_or_skip("test_gpu_expert");
    variant("bf16", false);
    variant("mxfp4", true);
    return st_test_done();
}
