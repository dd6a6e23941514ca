/* Unit tests of the counting estimator (common/quantile format 2): the CPU count reference, the
 * bit-packed planes end to end (builder -> coordinator counts, exactly), the byte budget and
 * layer rotation, malformed summaries (rejected, state unchanged; random bit flips never crash),
 * merge-order independence, table-version lag, and convergence to the (1 - k/n) quantile on
 * stationary loads (uniform, skewed, hot, ties; decode T = 1; lambda = 0). The K3 balance check
 * against the exact estimator is test_qbalance. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "strata/base.h"
#include "strata/quantile.h"

static float sigm(double x) { return (float)(1.0 / (1.0 + exp(-x))); }

/* ---------------- count reference vs the naive loop ---------------- */
static void test_count_layer(void) {
    st_rng_t r = {11};
    const uint32_t shapes[][2] = {{1, 1}, {3, 37}, {256, 896}, {17, 8}, {5, 9}};
    int bad = 0;
    for (size_t si = 0; si < ST_ARRAY_LEN(shapes); si++) {
        uint32_t T = shapes[si][0], n = shapes[si][1];
        float *s = malloc(sizeof(float) * T * n), *tau = malloc(sizeof(float) * n), *rho = malloc(sizeof(float) * n);
        uint32_t *c = malloc(4 * n), *b = malloc(4 * n);
        for (size_t i = 0; i < (size_t)T * n; i++) s[i] = (float)(st_rng_next(&r) % 16) / 16.0f; /* many ties */
        for (uint32_t j = 0; j < n; j++) {
            tau[j] = j % 7 == 3 ? NAN : (float)(st_rng_next(&r) % 16) / 16.0f; /* exactly on score values */
            rho[j] = tau[j] + (j % 2 ? 0.125f : -0.125f);
        }
        st_qsum_count_layer(s, T, n, tau, rho, c, b);
        for (uint32_t j = 0; j < n; j++) {
            uint32_t wc = 0, wb = 0;
            for (uint32_t t = 0; t < T; t++) {
                float v = s[(size_t)t * n + j];
                wc += v >= tau[j];
                float lo = fminf(tau[j], rho[j]), hi = fmaxf(tau[j], rho[j]);
                wb += tau[j] == tau[j] && v >= lo && v < hi;
            }
            bad += c[j] != wc || b[j] != wb;
        }
        st_qsum_count_layer(s, T, n, tau, NULL, c, NULL); /* no probe */
        for (uint32_t j = 0; j < n; j++) {
            uint32_t wc = 0;
            for (uint32_t t = 0; t < T; t++) wc += s[(size_t)t * n + j] >= tau[j];
            bad += c[j] != wc;
        }
        free(s); free(tau); free(rho); free(c); free(b);
    }
    CHECK(bad == 0, "count reference vs naive: %d mismatches", bad);
}

/* ---------------- helpers: a coordinator with thresholds set for every layer ---------------- */
typedef struct {
    uint32_t L, n, k, T;
    st_qstate_t *q;
    st_qsum_t *b;
    uint8_t *buf;
    size_t cap;
    float *sc; /* [L][T][n] */
} rig_t;

static void gen(float *s, uint32_t T, uint32_t n, int dist, st_rng_t *r, uint32_t layer) {
    for (uint32_t t = 0; t < T; t++) {
        double g = st_rng_normal(r);
        for (uint32_t j = 0; j < n; j++) {
            double u = st_rng_uniform(r), v;
            switch (dist) {
            case 0: v = u; break;                                                                    /* uniform */
            case 1: v = (j % 2) ? pow(u, 4.0) : 1.0 - pow(u, 0.25) * 0.5; break;                     /* beta-skewed */
            case 2: v = sigm(0.3 * g + st_rng_normal(r) + (j < 2 ? 1.5 : -0.2 * (double)(j % 5)) + 0.1 * layer); break; /* hot */
            default: v = floor(u * 6.0) / 6.0; break;                                                /* six values: ties */
            }
            s[(size_t)t * n + j] = (float)v;
        }
    }
}

static int rig_init(rig_t *g, uint32_t L, uint32_t n, uint32_t k, uint32_t T, double lambda, const st_qstate_opts_t *o) {
    memset(g, 0, sizeof *g);
    g->L = L; g->n = n; g->k = k; g->T = T;
    g->cap = st_qsum_max_bytes(L, n, k, T);
    g->buf = malloc(g->cap);
    g->sc = malloc(sizeof(float) * L * T * n);
    return st_qstate_create(L, n, k, lambda, o, &g->q) == ST_OK && st_qsum_create(L, n, k, T, &g->b) == ST_OK;
}
static void rig_free(rig_t *g) {
    st_qstate_destroy(g->q);
    st_qsum_destroy(g->b);
    free(g->buf); free(g->sc);
}
/* One worker summary of the rig's scores on table th; returns its length (0 on error). */
static size_t rig_summary(rig_t *g, uint32_t worker, uint64_t step, const st_qtable_t *th) {
    size_t len = 0;
    if (st_qsum_begin(g->b, g->buf, g->cap, worker, step, th) != ST_OK) return 0;
    for (uint32_t l = 0; l < g->L; l++)
        if (st_qsum_add_layer(g->b, l, g->sc + (size_t)l * g->T * g->n, g->T) != ST_OK) return 0;
    return st_qsum_finish(g->b, &len) == ST_OK ? len : 0;
}

/* ---------------- planes end to end: builder -> coordinator counts, exactly ---------------- */
static void test_roundtrip(void) {
    /* T up to 70000: counts need 17 bits; 1 token: width 0 planes */
    const uint32_t Ts[] = {1, 7, 256, 70000};
    for (size_t ti = 0; ti < ST_ARRAY_LEN(Ts); ti++) {
        rig_t g;
        uint32_t T = Ts[ti], n = 37, L = 3, k = 5;
        st_qstate_opts_t o;
        st_qstate_opts_default(&o);
        o.probe_every = 2;
        o.min_tokens = 1;
        CHECK(rig_init(&g, L, n, k, T, 0.9, &o), "rig");
        st_rng_t r = {100 + T};
        st_qtable_t th;
        int bad = 0;
        for (int step = 0; step < 6; step++) {
            for (uint32_t l = 0; l < L; l++) gen(g.sc + (size_t)l * T * n, T, n, 2, &r, l);
            if (step == 3) /* an outlier: one expert's scores all huge (exceptions in the plane) */
                for (uint32_t t = 0; t < T; t++) g.sc[(size_t)t * n + 5] = 100.0f;
            st_qstate_table(g.q, &th);
            size_t len = rig_summary(&g, 1, (uint64_t)step, &th);
            CHECK(len > 0 && len <= g.cap, "T=%u step %d: summary of %zu bytes (cap %zu)", T, step, len, g.cap);
            CHECK(st_qstate_merge(g.q, g.buf, len) == ST_OK, "T=%u step %d: merge: %s", T, step, st_err_last());
            if (th.version && st_qtau_is_set(th.tau[0])) {
                /* the same summary from counts made elsewhere (the GPU epilogue's path): same bytes */
                uint8_t *again = malloc(g.cap);
                uint32_t c2[64], b2[64];
                size_t len2 = 0;
                st_qsum_begin(g.b, again, g.cap, 1, (uint64_t)step, &th);
                for (uint32_t l = 0; l < L; l++) {
                    const float *tau = th.tau + (size_t)l * n, *rho = th.rho + (size_t)l * n;
                    st_qsum_count_layer(g.sc + (size_t)l * T * n, T, n, tau, st_qtau_is_set(rho[0]) ? rho : NULL, c2, b2);
                    CHECK(st_qsum_add_layer_counts(g.b, l, T, c2, st_qtau_is_set(rho[0]) ? b2 : NULL) == ST_OK, "add counts: %s", st_err_last());
                }
                st_qsum_finish(g.b, &len2);
                CHECK(len2 == len && memcmp(again, g.buf, len) == 0, "T=%u step %d: summary from counts differs (%zu vs %zu B)", T, step, len2, len);
                free(again);
            }
            for (uint32_t l = 0; th.version && l < L; l++) {
                uint32_t c[64], b[64], wc[64], wb[64];
                uint64_t N = 0;
                const float *tau = th.tau + (size_t)l * n, *rho = th.rho + (size_t)l * n;
                if (!st_qtau_is_set(tau[0])) continue;
                st_qsum_count_layer(g.sc + (size_t)l * T * n, T, n, tau, st_qtau_is_set(rho[0]) ? rho : NULL, wc, wb);
                st_qstate_step_counts(g.q, l, c, b, &N);
                bad += N != T;
                for (uint32_t j = 0; j < n; j++) bad += c[j] != wc[j] || (st_qtau_is_set(rho[0]) && b[j] != wb[j]);
            }
            st_qstate_end_step(g.q, NULL);
        }
        st_qstate_table(g.q, &th);
        CHECK(bad == 0, "T=%u: %d counts differ between builder and coordinator", T, bad);
        CHECK(th.version == 6 && st_qtau_is_set(th.tau[0]), "T=%u: thresholds set after init", T);
        rig_free(&g);
    }
}

/* ---------------- budget and rotation ---------------- */
static void test_budget(void) {
    rig_t g;
    uint32_t L = 20, n = 64, k = 8, T = 256;
    CHECK(rig_init(&g, L, n, k, T, 0.9, NULL), "rig");
    size_t budget = 48 + 3 * (16 + 8 + 8 * 64) + 8; /* three init sections */
    CHECK(st_qsum_set_budget(g.b, 100) != ST_OK, "a budget below one section is refused");
    CHECK(st_qsum_set_budget(g.b, budget) == ST_OK, "budget: %s", st_err_last());
    st_rng_t r = {5};
    for (uint32_t l = 0; l < L; l++) gen(g.sc + (size_t)l * T * n, T, n, 0, &r, l);
    /* worker 1, then worker 2: different first layers; every layer within ceil(L / 3) summaries */
    uint8_t sent[20] = {0};
    int first1 = -1, first2 = -1, over = 0;
    for (int i = 0; i < 7; i++) {
        size_t len = rig_summary(&g, 1, (uint64_t)i, NULL);
        over += len > budget;
        for (size_t off = 48; off + 16 <= len;) {
            uint32_t l = g.buf[off] | (g.buf[off + 1] << 8), sb = g.buf[off + 12] | (g.buf[off + 13] << 8) | (g.buf[off + 14] << 16);
            if (first1 < 0) first1 = (int)l;
            if (l < L) sent[l] = 1;
            off += sb ? sb : len;
        }
        CHECK(st_qsum_last_sections(g.b) == 3, "summary %d carries %u sections, 3 fit", i, st_qsum_last_sections(g.b));
    }
    st_qsum_t *b2;
    CHECK(st_qsum_create(L, n, k, T, &b2) == ST_OK, "second builder");
    st_qsum_set_budget(b2, budget);
    size_t len;
    st_qsum_begin(b2, g.buf, g.cap, 2, 0, NULL);
    for (uint32_t l = 0; l < L; l++) st_qsum_add_layer(b2, l, g.sc + (size_t)l * T * n, T);
    st_qsum_finish(b2, &len);
    first2 = g.buf[48] | (g.buf[49] << 8);
    st_qsum_destroy(b2);
    int all = 1;
    for (uint32_t l = 0; l < L; l++) all &= sent[l];
    CHECK(over == 0, "%d summaries over the budget", over);
    CHECK(all, "every layer sent within 7 summaries of 3 layers");
    CHECK(first1 != first2, "workers 1 and 2 start at different layers (%d, %d)", first1, first2);
    /* settled decode at the default budget: K3-like n, all layers fit (measured in the bench) */
    rig_free(&g);
}

/* ---------------- malformed summaries ---------------- */
static void put32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static uint32_t get32(const uint8_t *p) { return p[0] | (p[1] << 8) | (p[2] << 16) | ((uint32_t)p[3] << 24); }

static int same_state(st_qstate_t *a, st_qstate_t *b, uint32_t L, uint32_t n) {
    uint32_t ca[64], ba[64], cb[64], bb[64];
    uint64_t na, nb;
    for (uint32_t l = 0; l < L; l++) {
        st_qstate_step_counts(a, l, ca, ba, &na);
        st_qstate_step_counts(b, l, cb, bb, &nb);
        if (na != nb || memcmp(ca, cb, 4 * n) || memcmp(ba, bb, 4 * n)) return 0;
    }
    return 1;
}

static void test_malformed(void) {
    rig_t g;
    uint32_t L = 3, n = 40, k = 4, T = 100;
    st_qstate_opts_t o;
    st_qstate_opts_default(&o);
    o.probe_every = 1; /* every layer probed: band planes present */
    o.min_tokens = 1;
    CHECK(rig_init(&g, L, n, k, T, 0.9, &o), "rig");
    st_qstate_t *ref;
    st_qstate_create(L, n, k, 0.9, &o, &ref);
    st_rng_t r = {77};
    for (uint32_t l = 0; l < L; l++) gen(g.sc + (size_t)l * T * n, T, n, 2, &r, l);
    /* init both from the same summary, so a count summary on table 1 is valid for both */
    size_t len0 = rig_summary(&g, 1, 0, NULL);
    uint8_t *init = malloc(len0);
    memcpy(init, g.buf, len0);
    CHECK(st_qstate_merge(g.q, init, len0) == ST_OK && st_qstate_merge(ref, init, len0) == ST_OK, "init merge");
    st_qtable_t th, thr;
    st_qstate_end_step(g.q, &th);
    st_qstate_end_step(ref, &thr);
    size_t len = rig_summary(&g, 1, 1, &th);
    uint8_t *good = malloc(len), *bad = malloc((len > len0 ? len : len0) + 8);
    memcpy(good, g.buf, len);
    CHECK(len > 48 && good[48 + 8] == 1 && good[48 + 10] == 1, "count section with a band plane (kind %u flags %u)", good[56], good[58]);
    /* every truncation */
    int acc = 0;
    for (size_t cut = 0; cut < len; cut++) acc += st_qstate_merge(g.q, good, cut) == ST_OK;
    CHECK(acc == 0, "%d truncations accepted", acc);
    CHECK(same_state(g.q, ref, L, n), "truncations left the state unchanged");
    /* targeted corruptions: (offset, new value, width) */
    size_t s0 = 48, p0 = s0 + 16; /* first section; its count plane */
    uint32_t w0 = good[p0 + 4];
    struct { const char *what; size_t off; uint32_t val; int w; } cases[] = {
        {"magic", 0, 0x12345678, 4}, {"format 1", 4, 1, 2}, {"format 3", 4, 3, 2}, {"header size", 6, 40, 2},
        {"length", 8, (uint32_t)len + 1, 4}, {"layers", 12, L + 1, 4}, {"experts", 16, n - 1, 4}, {"k", 20, k + 1, 4},
        {"unknown version", 24, 99, 4}, {"version 0 with counts", 24, 0, 4}, {"sections", 36, L + 1, 4},
        {"layer out of range", s0, L, 4}, {"zero tokens", s0 + 4, 0, 4}, {"kind", s0 + 8, 7, 2}, {"flags", s0 + 10, 3, 2},
        {"no band flag", s0 + 10, 0, 2}, {"section size", s0 + 12, 17, 4}, {"section size big", s0 + 12, (uint32_t)len, 4},
        {"plane width 33", p0 + 4, 33, 1}, {"plane pad", p0 + 5, 1, 1}, {"plane exceptions", p0 + 6, 2000, 2},
        {"base over T", p0, T + 1, 4}, {"tokens below counts", s0 + 4, 1, 4},
    };
    for (size_t i = 0; i < ST_ARRAY_LEN(cases); i++) {
        memcpy(bad, good, len);
        if (cases[i].w == 4) put32(bad + cases[i].off, cases[i].val);
        else if (cases[i].w == 2) put16(bad + cases[i].off, (uint16_t)cases[i].val);
        else bad[cases[i].off] = (uint8_t)cases[i].val;
        st_status_t s = st_qstate_merge(g.q, bad, len);
        CHECK(s == ST_ERR_PROTOCOL, "%s: accepted or wrong status (%d)", cases[i].what, s);
    }
    /* a repeated layer: the first section written twice */
    uint32_t sb = get32(good + s0 + 12);
    uint8_t *rep = malloc(48 + 2 * sb);
    memcpy(rep, good, 48 + sb);
    memcpy(rep + 48 + sb, good + 48, sb);
    put32(rep + 8, 48 + 2 * sb);
    put32(rep + 36, 2);
    CHECK(st_qstate_merge(g.q, rep, 48 + 2 * sb) == ST_ERR_PROTOCOL, "repeated layer accepted");
    /* stray bytes at the end */
    memcpy(bad, good, len);
    bad[len] = 0;
    put32(bad + 8, (uint32_t)len + 1);
    CHECK(st_qstate_merge(g.q, bad, len + 1) == ST_ERR_PROTOCOL, "stray byte accepted");
    /* a count over T via the packed bits: all ones in the first value (width > 0 needed) */
    if (w0 > 0) {
        memcpy(bad, good, len);
        put32(bad + p0, T); /* base = T: any nonzero packed value exceeds T */
        bad[p0 + 8] |= 1;
        CHECK(st_qstate_merge(g.q, bad, len) == ST_ERR_PROTOCOL, "count over T accepted");
    }
    /* an init section on a malformed rank pair */
    memcpy(bad, init, len0);
    put32(bad + 48 + 16, 0);
    CHECK(st_qstate_merge(g.q, bad, len0) == ST_ERR_PROTOCOL, "init rank 0 accepted");
    memcpy(bad, init, len0);
    put32(bad + 48 + 16 + 8, 0x7fc00000u); /* NaN score */
    CHECK(st_qstate_merge(g.q, bad, len0) == ST_ERR_PROTOCOL, "init NaN accepted");
    CHECK(same_state(g.q, ref, L, n), "rejected summaries left the state unchanged");
    /* random bit flips: never a crash (sanitizers watch), and a flip that is accepted still
     * leaves a state that publishes finite-or-NaN thresholds */
    st_rng_t fr = {3};
    int accepted = 0;
    for (int i = 0; i < 400; i++) {
        memcpy(bad, good, len);
        int flips = 1 + (int)(st_rng_next(&fr) % 3);
        for (int f = 0; f < flips; f++) {
            size_t at = st_rng_next(&fr) % len;
            bad[at] ^= (uint8_t)(1u << (st_rng_next(&fr) % 8));
        }
        accepted += st_qstate_merge(g.q, bad, len) == ST_OK;
    }
    printf("malformed: %zu truncations and %zu corruptions rejected; %d of 400 random bit flips accepted (valid counts)\n", len,
           ST_ARRAY_LEN(cases) + 6, accepted);
    st_qstate_end_step(g.q, &th);
    int nonfinite = 0;
    for (size_t i = 0; i < (size_t)L * n; i++) nonfinite += isinf(th.tau[i]);
    CHECK(nonfinite == 0, "infinite thresholds after fuzzing");
    /* the good one is accepted by the reference */
    CHECK(st_qstate_merge(ref, good, len) == ST_OK, "good summary: %s", st_err_last());
    free(init); free(good); free(bad); free(rep);
    st_qstate_destroy(ref);
    rig_free(&g);
}

/* ---------------- merge order, version lag ---------------- */
static void test_order_and_lag(void) {
    uint32_t L = 2, n = 32, k = 4, T = 64, W = 5;
    st_qstate_t *a, *b;
    st_qsum_t *bl;
    st_qstate_opts_t o;
    st_qstate_opts_default(&o);
    o.history = 4;
    CHECK(st_qstate_create(L, n, k, 0.9, &o, &a) == ST_OK && st_qstate_create(L, n, k, 0.9, &o, &b) == ST_OK, "create");
    CHECK(st_qsum_create(L, n, k, T, &bl) == ST_OK, "qsum");
    size_t cap = st_qsum_max_bytes(L, n, k, T);
    uint8_t *bufs = malloc(cap * W);
    size_t lens[8];
    float *sc = malloc(sizeof(float) * L * T * n);
    st_rng_t r = {9};
    st_qtable_t ta, tb, t1 = {0}, t2 = {0}; /* t1, t2: the tables one and two steps back */
    int differ = 0;
    for (int step = 0; step < 12; step++) {
        st_qstate_table(a, &ta);
        for (uint32_t w = 0; w < W; w++) {
            for (uint32_t l = 0; l < L; l++) gen(sc + (size_t)l * T * n, T, n, 1, &r, l);
            /* worker 4 lags: it routes with the table of two steps ago (still held: history 4) */
            const st_qtable_t *th = w == 4 && t2.version ? &t2 : &ta;
            st_qsum_begin(bl, bufs + w * cap, cap, w, (uint64_t)step, th->version ? th : NULL);
            for (uint32_t l = 0; l < L; l++) st_qsum_add_layer(bl, l, sc + (size_t)l * T * n, T);
            st_qsum_finish(bl, &lens[w]);
        }
        /* init summaries in the same order for both (the first tau is an fp average); counts reversed */
        for (uint32_t w = 0; w < W; w++) {
            uint32_t wb = step == 0 ? w : W - 1 - w;
            CHECK(st_qstate_merge(a, bufs + w * cap, lens[w]) == ST_OK, "merge a: %s", st_err_last());
            CHECK(st_qstate_merge(b, bufs + wb * cap, lens[wb]) == ST_OK, "merge b: %s", st_err_last());
        }
        t2 = t1;
        t1 = ta;
        st_qstate_end_step(a, &ta);
        st_qstate_end_step(b, &tb);
        differ += memcmp(ta.tau, tb.tau, sizeof(float) * L * n) != 0 || memcmp(ta.rho, tb.rho, sizeof(float) * L * n) != 0;
    }
    CHECK(differ == 0, "merge order changed the tables in %d steps", differ);
    /* a summary on a table older than history - 1 versions is refused */
    st_qstate_table(a, &ta);
    st_qtable_t stale = ta;
    size_t len;
    for (int i = 0; i < 3; i++) st_qstate_end_step(a, NULL);
    st_qsum_begin(bl, bufs, cap, 0, 99, &stale);
    for (uint32_t l = 0; l < L; l++) st_qsum_add_layer(bl, l, sc + (size_t)l * T * n, T);
    st_qsum_finish(bl, &len);
    /* NOTE: stale's arrays were overwritten by the ring; the version number is what matters */
    st_qstate_stats_t sa0, sa1;
    st_qstate_stats(a, &sa0);
    CHECK(st_qstate_merge(a, bufs, len) == ST_ERR_OUT_OF_RANGE, "a summary on a table %d versions old: not refused as stale", 3);
    st_qstate_stats(a, &sa1);
    CHECK(sa1.summaries == sa0.summaries && sa1.sections == sa0.sections, "a stale summary left the state unchanged");
    free(bufs); free(sc);
    st_qsum_destroy(bl);
    st_qstate_destroy(a);
    st_qstate_destroy(b);
}

/* ---------------- convergence on stationary loads ---------------- */
typedef struct { const char *name; uint32_t n, k, L, W, T, steps; double lambda; int dist; double tol; } conv_t;

/* True tail rate of tau for (layer, expert) from a large fresh sample of the same distribution. */
static void test_convergence(const conv_t *c) {
    uint32_t n = c->n, L = c->L, W = c->W, T = c->T;
    st_qstate_t *q;
    st_qsum_t *b;
    CHECK(st_qstate_create(L, n, c->k, c->lambda, NULL, &q) == ST_OK && st_qsum_create(L, n, c->k, T, &b) == ST_OK, "create");
    size_t cap = st_qsum_max_bytes(L, n, c->k, T), len;
    uint8_t *buf = malloc(cap);
    float *sc = malloc(sizeof(float) * (size_t)L * T * n);
    st_rng_t r = {1234 + c->dist};
    st_qtable_t th = {0};
    double p = (double)c->k / n;
    /* measured load: over the second half of the run, routing with the table of each step */
    double *load = calloc((size_t)L * n, sizeof(double)), tok = 0;
    for (uint32_t step = 0; step < c->steps; step++) {
        for (uint32_t w = 0; w < W; w++) {
            for (uint32_t l = 0; l < L; l++) gen(sc + (size_t)l * T * n, T, n, c->dist, &r, l);
            if (step >= c->steps / 2 && th.version)
                for (uint32_t l = 0; l < L; l++)
                    for (uint32_t t = 0; t < T; t++)
                        for (uint32_t j = 0; j < n; j++)
                            load[(size_t)l * n + j] += sc[((size_t)l * T + t) * n + j] >= th.tau[(size_t)l * n + j];
            if (step >= c->steps / 2) tok += T;
            st_qsum_begin(b, buf, cap, w, step, th.version ? &th : NULL);
            for (uint32_t l = 0; l < L; l++) st_qsum_add_layer(b, l, sc + (size_t)l * T * n, T);
            st_qsum_finish(b, &len);
            CHECK(st_qstate_merge(q, buf, len) == ST_OK, "%s: merge: %s", c->name, st_err_last());
        }
        st_qstate_end_step(q, &th);
    }

    int finite = 1;
    for (size_t i = 0; i < (size_t)L * n; i++) finite &= isfinite(th.tau[i]);
    double worst = 0;
    for (size_t i = 0; i < (size_t)L * n; i++) worst = fmax(worst, fabs(load[i] / (tok * p) - 1));
    double noise = sqrt((1 - p) / (tok * p));
    printf("convergence %-12s n=%u k=%u W=%u T=%u lambda=%.1f: %u steps, rate at tau over the 2nd half: max |rate/(k/n)-1| = %.2f%% "
           "(noise 1 sd %.2f%%)\n",
           c->name, n, c->k, W, T, c->lambda, c->steps, 100 * worst, 100 * noise);
    CHECK(finite, "%s: non-finite thresholds", c->name);
    CHECK(worst <= c->tol, "%s: rate off by %.3f > %.3f", c->name, worst, c->tol);
    free(load); free(buf); free(sc);
    st_qsum_destroy(b);
    st_qstate_destroy(q);
}

static void test_api_errors(void) {
    st_qstate_t *q = NULL;
    st_qsum_t *b = NULL;
    CHECK(st_qstate_create(0, 8, 2, 0.9, NULL, &q) != ST_OK, "zero layers");
    CHECK(st_qstate_create(2, 8, 8, 0.9, NULL, &q) != ST_OK, "k = n");
    CHECK(st_qstate_create(2, 8, 2, 1.0, NULL, &q) != ST_OK, "lambda 1");
    CHECK(st_qsum_create(2, 8, 2, 0, &b) != ST_OK, "max_tokens 0");
    CHECK(st_qsum_create(2, 40000, 2, 4, &b) != ST_OK, "too many experts");
    CHECK(st_qsum_create(2, 8, 2, 4, &b) == ST_OK, "qsum");
    float s[8 * 5] = {0};
    uint8_t buf[4096];
    size_t len;
    CHECK(st_qsum_add_layer(b, 0, s, 1) != ST_OK, "add before begin");
    CHECK(st_qsum_begin(b, buf, 10, 0, 0, NULL) == ST_ERR_CAPACITY, "tiny buffer");
    CHECK(st_qsum_begin(b, buf, sizeof buf, 0, 0, NULL) == ST_OK, "begin");
    CHECK(st_qsum_add_layer(b, 2, s, 1) != ST_OK, "layer out of range");
    CHECK(st_qsum_add_layer(b, 0, s, 5) != ST_OK, "more tokens than max");
    s[3] = NAN;
    CHECK(st_qsum_add_layer(b, 0, s, 1) != ST_OK, "non-finite score");
    s[3] = 0;
    CHECK(st_qsum_add_layer(b, 1, s, 2) == ST_OK, "add");
    CHECK(st_qsum_add_layer(b, 1, s, 2) != ST_OK, "layer twice");
    uint32_t cnt[8] = {0};
    CHECK(st_qsum_add_layer_counts(b, 0, 1, cnt, NULL) != ST_OK, "counts for a layer without a threshold");
    CHECK(st_qsum_finish(b, &len) == ST_OK && len > 48, "finish");
    st_qsum_destroy(b);
}

int main(void) {
    test_count_layer();
    test_roundtrip();
    test_budget();
    test_malformed();
    test_order_and_lag();
    test_api_errors();
    const conv_t cs[] = {
        {"uniform", 64, 8, 2, 4, 256, 60, 0.9, 0, 0.05},
        {"beta-skewed", 64, 8, 2, 4, 256, 60, 0.9, 1, 0.05},
        {"hot", 16, 4, 3, 1, 2000, 60, 0.9, 2, 0.05},     /* the integration test's shape: tiny, one worker */
        {"hot-lambda0", 64, 8, 1, 1, 4096, 40, 0.0, 2, 0.06}, /* this step only */
        {"hot-decode", 16, 4, 1, 1, 1, 3000, 0.9, 2, 0.15}, /* one token per step */
        {"ties", 64, 8, 1, 4, 256, 60, 0.9, 3, 1.0},     /* six values only: no blow-up; the rate at tau jumps by 4/3 k/n */
    };
    for (size_t i = 0; i < ST_ARRAY_LEN(cs); i++) test_convergence(&cs[i]);
    return st_test_done();
}
