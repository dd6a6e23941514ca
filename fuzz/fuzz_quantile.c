/* libFuzzer harness: the quantile summary byte format 2 (the counting estimator, docs/quantile.md),
 * both halves. The first byte picks the mode:
 *   even: the rest is a summary as the coordinator receives it; st_qstate_merge into a state that has
 *         published a table (tau set, every layer probed: COUNT sections with band planes are valid
 *         against it, INIT sections against version 0). Rejected: ST_ERR_PROTOCOL (or
 *         ST_ERR_OUT_OF_RANGE: a table version older than the history) and the state unchanged (a reference summary merged after it gives the reference table bit for bit).
 *         Accepted: end_step publishes a sane table, and merging it and the reference summary in
 *         either order gives the same table bit for bit.
 *   odd:  the rest chooses a table (or none), token count, byte budget, layers and finite scores; a
 *         worker builds a summary with st_qsum_* and the coordinator must accept it and publish a
 *         sane table; on a table, the same summary built from st_qsum_count_layer's counts
 *         (st_qsum_add_layer_counts, the GPU epilogue's path) is byte-identical.
 * "Sane": per layer tau is NaN for every expert or for none and finite where set; rho likewise per
 * layer, only where tau is set; the uncertainty is >= 0 or NaN. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz/fuzz.h"
#include "strata/quantile.h"

enum { L = 3, N = 8, K = 2, MAX_T = 32 };

static st_qstate_opts_t g_opts;
static uint8_t *g_ref; /* reference summary, built on the primed table (version 1) */
static size_t g_ref_len;
static float g_ref_tau[L * N], g_ref_rho[L * N]; /* primed state + g_ref, end_step */
static uint8_t *g_buf, *g_buf2;
static size_t g_cap;
static uint8_t *g_prime; /* the summary that primes a state (built once) */
static size_t g_prime_len;

static void fill_scores(float *s, int n, uint64_t seed) {
    st_rng_t r = {seed};
    for (int i = 0; i < n; i++) s[i] = (float)st_rng_uniform(&r);
}

/* A summary of T tokens for every layer, built on table th (may be NULL), into buf. */
static size_t build(uint8_t *buf, size_t cap, const st_qtable_t *th, uint64_t seed, uint32_t T) {
    st_qsum_t *b;
    FUZZ_REQUIRE(st_qsum_create(L, N, K, MAX_T, &b) == ST_OK);
    FUZZ_REQUIRE(st_qsum_begin(b, buf, cap, 1, seed, th) == ST_OK);
    float sc[MAX_T * N];
    for (uint32_t l = 0; l < L; l++) {
        fill_scores(sc, (int)(T * N), seed * 31 + l);
        FUZZ_REQUIRE(st_qsum_add_layer(b, l, sc, T) == ST_OK);
    }
    size_t len;
    FUZZ_REQUIRE(st_qsum_finish(b, &len) == ST_OK);
    st_qsum_destroy(b);
    return len;
}

/* A state that has published version 1 with tau set on every layer (the prime carries enough init
 * tokens) and every layer probed (young layers are). */
static st_qstate_t *primed(void) {
    st_qstate_t *q;
    FUZZ_REQUIRE(st_qstate_create(L, N, K, 0.5, &g_opts, &q) == ST_OK);
    st_qtable_t th;
    FUZZ_REQUIRE(st_qstate_merge(q, g_prime, g_prime_len) == ST_OK);
    FUZZ_REQUIRE(st_qstate_end_step(q, &th) == ST_OK && th.version == 1);
    return q;
}

static void check_table(const st_qstate_t *q, const st_qtable_t *t, uint64_t version) {
    FUZZ_REQUIRE(t->version == version && t->n_layers == L && t->n_experts == N);
    for (uint32_t l = 0; l < L; l++) {
        int unset = 0, unprobed = 0;
        for (uint32_t j = 0; j < N; j++) {
            float tau = t->tau[l * N + j], rho = t->rho[l * N + j];
            unset += !st_qtau_is_set(tau);
            unprobed += !st_qtau_is_set(rho);
            FUZZ_REQUIRE(!isinf(tau) && !isinf(rho));
            if (!st_qtau_is_set(tau)) FUZZ_REQUIRE(!st_qtau_is_set(rho));
            float u = st_qstate_uncertainty(q, l, j);
            FUZZ_REQUIRE(u != u || u >= 0);
        }
        FUZZ_REQUIRE(unset == 0 || unset == N);
        FUZZ_REQUIRE(unprobed == 0 || unprobed == N);
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    st_qstate_opts_default(&g_opts);
    g_opts.history = 4;
    g_cap = st_qsum_max_bytes(L, N, K, MAX_T);
    g_buf = malloc(g_cap);
    g_buf2 = malloc(g_cap);
    g_ref = malloc(g_cap);
    g_prime = malloc(g_cap);
    FUZZ_REQUIRE(g_buf && g_buf2 && g_ref && g_prime);
    g_prime_len = build(g_prime, g_cap, NULL, 100, MAX_T);
    st_qstate_t *q = primed();
    st_qtable_t th;
    st_qstate_table(q, &th);
    for (uint32_t i = 0; i < L * N; i++) FUZZ_REQUIRE(st_qtau_is_set(th.tau[i]) && st_qtau_is_set(th.rho[i]));
    g_ref_len = build(g_ref, g_cap, &th, 7, 20);
    FUZZ_REQUIRE(st_qstate_merge(q, g_ref, g_ref_len) == ST_OK);
    FUZZ_REQUIRE(st_qstate_end_step(q, &th) == ST_OK);
    memcpy(g_ref_tau, th.tau, sizeof g_ref_tau);
    memcpy(g_ref_rho, th.rho, sizeof g_ref_rho);
    st_qstate_destroy(q);
    return 0;
}

static int same_table(const st_qtable_t *a, const float *tau, const float *rho) {
    return memcmp(a->tau, tau, sizeof(float) * L * N) == 0 && memcmp(a->rho, rho, sizeof(float) * L * N) == 0;
}

static void fuzz_merge(const uint8_t *p, size_t len) {
    st_qstate_t *q = primed();
    st_status_t s = st_qstate_merge(q, p, len);
    st_qtable_t t1;
    if (s != ST_OK) {
        FUZZ_REQUIRE(s == ST_ERR_PROTOCOL || s == ST_ERR_OUT_OF_RANGE); /* malformed, or on a stale table */
        FUZZ_REQUIRE(st_qstate_merge(q, g_ref, g_ref_len) == ST_OK);
        FUZZ_REQUIRE(st_qstate_end_step(q, &t1) == ST_OK);
        FUZZ_REQUIRE(same_table(&t1, g_ref_tau, g_ref_rho));
        st_qstate_destroy(q);
        return;
    }
    s = st_qstate_merge(q, g_ref, g_ref_len);
    FUZZ_REQUIRE(s == ST_OK);
    FUZZ_REQUIRE(st_qstate_end_step(q, &t1) == ST_OK);
    check_table(q, &t1, 2);
    /* the other order, on a second state with the same history */
    st_qstate_t *q2 = primed();
    st_qtable_t t2;
    FUZZ_REQUIRE(st_qstate_merge(q2, g_ref, g_ref_len) == ST_OK);
    FUZZ_REQUIRE(st_qstate_merge(q2, p, len) == ST_OK);
    FUZZ_REQUIRE(st_qstate_end_step(q2, &t2) == ST_OK);
    FUZZ_REQUIRE(same_table(&t2, t1.tau, t1.rho));
    st_qstate_destroy(q2);
    st_qstate_destroy(q);
}

static void fuzz_build(const uint8_t *p, size_t len) {
    if (len < 3) return;
    st_qstate_t *q = primed();
    st_qtable_t th;
    st_qstate_table(q, &th);
    uint32_t T = 1 + p[0] % MAX_T;
    uint8_t layers = p[1];
    bool use_table = layers & 0x80;
    size_t budget = ST_QSUM_HEADER_BYTES + (size_t)p[2] * 8; /* small ones are refused: default */
    p += 3, len -= 3;
    st_qsum_t *b, *b2;
    FUZZ_REQUIRE(st_qsum_create(L, N, K, MAX_T, &b) == ST_OK && st_qsum_create(L, N, K, MAX_T, &b2) == ST_OK);
    bool budgeted = st_qsum_set_budget(b, budget) == ST_OK;
    if (budgeted) FUZZ_REQUIRE(st_qsum_set_budget(b2, budget) == ST_OK);
    FUZZ_REQUIRE(st_qsum_begin(b, g_buf, g_cap, 3, 9, use_table ? &th : NULL) == ST_OK);
    FUZZ_REQUIRE(st_qsum_begin(b2, g_buf2, g_cap, 3, 9, use_table ? &th : NULL) == ST_OK);
    float sc[MAX_T * N];
    uint32_t cnt[N], band[N];
    size_t at = 0;
    for (uint32_t l = 0; l < L; l++) {
        if (!(layers & (1u << l))) continue;
        /* scores from 16-bit codes: finite, with plenty of ties and both signs */
        for (uint32_t i = 0; i < T * N; i++, at += 2)
            sc[i] = at + 1 < len ? (float)(int16_t)(p[at] | (p[at + 1] << 8)) / 256.0f : 0.0f;
        FUZZ_REQUIRE(st_qsum_add_layer(b, l, sc, T) == ST_OK);
        if (use_table) {
            st_qsum_count_layer(sc, T, N, th.tau + l * N, th.rho + l * N, cnt, band);
            FUZZ_REQUIRE(st_qsum_add_layer_counts(b2, l, T, cnt, band) == ST_OK);
        }
    }
    size_t n, n2;
    FUZZ_REQUIRE(st_qsum_finish(b, &n) == ST_OK && n <= g_cap && (!budgeted || n <= budget));
    FUZZ_REQUIRE(st_qsum_finish(b2, &n2) == ST_OK);
    if (use_table) FUZZ_REQUIRE(n == n2 && memcmp(g_buf, g_buf2, n) == 0);
    st_qsum_destroy(b);
    st_qsum_destroy(b2);
    st_status_t s = st_qstate_merge(q, g_buf, n);
    if (s != ST_OK) fprintf(stderr, "fuzz_quantile: builder output rejected: %s\n", st_err_last());
    FUZZ_REQUIRE(s == ST_OK);
    st_qtable_t t;
    FUZZ_REQUIRE(st_qstate_end_step(q, &t) == ST_OK);
    check_table(q, &t, 2);
    st_qstate_destroy(q);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    if (data[0] & 1)
        fuzz_build(data + 1, size - 1);
    else
        fuzz_merge(data + 1, size - 1);
    return 0;
}
