/* The engine's MLA kernels vs their C twins over a paged cache (page ids shuffled, entries of different
 * lengths): st_cuda_mla_kv_store (st_mla_kv_store; fp32 and bf16 pools, rows no token names untouched),
 * st_cuda_mla_qpe (st_mla_qpe), st_cuda_mla_attn (st_mla_attn_absorbed per query: K3 widths R 576 / kvr 512
 * and small odd ones, fp32 and bf16, a single query, and the cu/dmin skip of long chunks), and the direct
 * form's st_cuda_mla_gather / st_cuda_mla_kv_split (st_mla_gather / st_mla_kv_split, exact copies). */
#include <math.h>
#include <string.h>

#include "glue_test.h"
#include "strata/kernels.h"

typedef struct {
    int n_ent, pps, ps, pages;
    int *btab; /* [n_ent, pps] host */
} cache_t;

/* page ids: a shuffled permutation of 0 .. pages-1 */
static void cache_init(cache_t *c, int n_ent, int pps, int ps, st_rng_t *r) {
    c->n_ent = n_ent, c->pps = pps, c->ps = ps, c->pages = n_ent * pps;
    c->btab = gt_xmalloc(sizeof(int) * c->pages);
    for (int i = 0; i < c->pages; i++) c->btab[i] = i;
    for (int i = c->pages - 1; i > 0; i--) {
        int j = (int)(st_rng_next(r) % (uint64_t)(i + 1)), x = c->btab[i];
        c->btab[i] = c->btab[j], c->btab[j] = x;
    }
}

/* values stored bf16 (f32 false) go through bf16 on the host too */
static void *up_vals(float *x, size_t n, bool f32) {
    if (f32) return gt_up(x, 4 * n);
    uint16_t *b = gt_xmalloc(2 * n + 2);
    gt_to_bf(b, x, n);
    void *d = gt_up(b, 2 * n);
    free(b);
    return d;
}
static float *down_vals(const void *d, size_t n, bool f32) { return f32 ? gl_down_f32(d, n) : gl_down_bf(d, n); }

static void kv_store_case(int T, int kvr, int R, int ps, bool f32, uint64_t seed) {
    st_rng_t r = {seed};
    cache_t c;
    cache_init(&c, 3, 4, ps, &r);
    size_t pn = (size_t)c.pages * ps * R;
    float *ckv = gl_randn((size_t)T * R + 1, 2.f, &r), *w = gl_randn(kvr, 0.2f, &r), *pool = gt_xmalloc(4 * pn);
    for (int i = 0; i < kvr; i++) w[i] += 1.f;
    memset(pool, 0, 4 * pn);
    int *ent = gt_xmalloc(sizeof(int) * (T + 1)), *pos = gt_xmalloc(sizeof(int) * (T + 1));
    for (int t = 0; t < T; t++) ent[t] = t % 3, pos[t] = (t / 3 * 7 + t % 3) % (4 * ps); /* distinct rows */
    st_mla_kv_store(pool, ckv, w, ent, pos, c.btab, c.pps, ps, T, kvr, R, 1e-6f);
    void *dpool = gt_dev(pn * (f32 ? 4 : 2));
    GT_OK(st_gpu_memset(dpool, 0, pn * (f32 ? 4 : 2)));
    float *dckv = gt_up(ckv, 4 * ((size_t)T * R + 1)), *dw = gt_up(w, 4 * (size_t)kvr);
    int *dent = gt_up(ent, sizeof(int) * (T + 1)), *dpos = gt_up(pos, sizeof(int) * (T + 1)),
        *dbt = gt_up(c.btab, sizeof(int) * c.pages);
    GT_OK(st_cuda_mla_kv_store(&gt_stream, dpool, f32, dckv, dw, dent, dpos, dbt, c.pps, ps, T, kvr, R, 1e-6f));
    float *got = down_vals(dpool, pn, f32);
    char what[96];
    snprintf(what, sizeof what, "mla_kv_store T=%d kvr=%d R=%d ps=%d %s", T, kvr, R, ps, f32 ? "f32" : "bf16");
    st_t_close(what, got, pool, pn, f32 ? 1e-6 : 1e-2, f32 ? 1e-6 : 1e-2);
    st_gpu_free(dpool), st_gpu_free(dckv), st_gpu_free(dw), st_gpu_free(dent), st_gpu_free(dpos), st_gpu_free(dbt);
    free(c.btab), free(ckv), free(w), free(pool), free(ent), free(pos), free(got);
}

static void qpe_case(int T, int H, int nope, int rope, int kvr, bool f32, uint64_t seed) {
    st_rng_t r = {seed};
    int R = kvr + rope;
    size_t nq = (size_t)T * H * (nope + rope), na = (size_t)T * H * R;
    float *q = gl_randn(nq + 1, 1.f, &r), *qabs = gt_xmalloc(4 * (na + 1));
    memset(qabs, 0, 4 * (na + 1));
    st_mla_qpe(qabs, q, T, H, nope, rope, kvr);
    uint16_t *tmp = gt_xmalloc(2 * na + 2);
    if (!f32) gt_to_bf(tmp, qabs, na); /* rounds the reference in place */
    free(tmp);
    float *dq = gt_up(q, 4 * (nq + 1));
    void *da = gt_dev((na + 1) * (f32 ? 4 : 2));
    GT_OK(st_gpu_memset(da, 0, (na + 1) * (f32 ? 4 : 2)));
    GT_OK(st_cuda_mla_qpe(&gt_stream, da, f32, dq, T, H, nope, rope, kvr));
    float *got = down_vals(da, na, f32);
    CHECK(memcmp(got, qabs, 4 * na) == 0, "mla_qpe T=%d H=%d nope=%d rope=%d kvr=%d %s: not exact", T, H, nope, rope, kvr,
          f32 ? "f32" : "bf16");
    st_gpu_free(dq), st_gpu_free(da);
    free(q), free(qabs), free(got);
}

/* T queries over 3 entries (lengths up to 4·ps); skip: entry 1's chunk is long (cu/dmin), its rows untouched */
static void attn_case(int T, int H, int R, int kvr, int ps, bool f32, bool skip, bool split, uint64_t seed) {
    st_rng_t r = {seed};
    cache_t c;
    cache_init(&c, 3, 4, ps, &r);
    size_t pn = (size_t)c.pages * ps * R, nq = (size_t)T * H * R, no = (size_t)T * H * kvr;
    float *pool = gl_randn(pn, 1.f, &r), *q = gl_randn(nq + 1, 0.1f, &r);
    void *dpool = up_vals(pool, pn, f32), *dq = up_vals(q, nq + 1, f32); /* rounds pool and q when bf16 */
    int *ent = gt_xmalloc(sizeof(int) * (T + 1)), *pos = gt_xmalloc(sizeof(int) * (T + 1)), cu[4] = {0, 0, 0, 0};
    for (int t = 0; t < T; t++) {
        ent[t] = skip && t < T / 2 ? 1 : t % 3; /* skip: entry 1 holds the longest chunk */
        pos[t] = (int)(st_rng_next(&r) % (uint64_t)(4 * ps));
        cu[ent[t] + 1]++;
    }
    for (int e = 0; e < 3; e++) cu[e + 1] += cu[e];
    int dmin = skip ? cu[2] - cu[1] : 0; /* entry 1's chunk has exactly dmin tokens (the others fewer): skipped */
    if (skip && dmin == 0) skip = false;
    float *ref = gt_xmalloc(4 * (no + 1)), *ws = gt_xmalloc(4 * (size_t)4 * ps);
    float **pages = gt_xmalloc(sizeof(float *) * c.pps);
    for (int t = 0; t < T; t++) {
        if (skip && ent[t] == 1) continue;
        for (int i = 0; i < c.pps; i++) pages[i] = pool + (size_t)c.btab[ent[t] * c.pps + i] * ps * R;
        st_kv_view_t kv = {pages, ps, R, pos[t] + 1};
        st_mla_attn_absorbed(ref + (size_t)t * H * kvr, q + (size_t)t * H * R, &kv, 1, H, kvr, 0.07f, ws);
    }
    int *dent = gt_up(ent, sizeof(int) * (T + 1)), *dpos = gt_up(pos, sizeof(int) * (T + 1)),
        *dbt = gt_up(c.btab, sizeof(int) * c.pages), *dcu = gt_up(cu, sizeof cu);
    uint16_t *dol = gt_dev(2 * no + 2), *dlo = gt_dev(2 * no + 2);
    GT_OK(st_cuda_mla_attn(&gt_stream, dol, split ? dlo : NULL, dq, dpool, f32, dent, dpos, dbt, c.pps, ps, T, H, R, kvr,
                           0.07f, skip ? dcu : NULL, dmin));
    char what[128];
    snprintf(what, sizeof what, "mla_attn T=%d H=%d R=%d kvr=%d ps=%d %s%s", T, H, R, kvr, ps, f32 ? "f32" : "bf16",
             skip ? " skip" : "");
    if (!skip) {
        gl_check_split(what, dol, split ? dlo : NULL, ref, no);
    } else { /* the computed rows against the reference, the skipped ones still NaN-poisoned */
        float *got = gl_down_bf(dol, no), *g2 = gt_xmalloc(4 * no), *r2 = gt_xmalloc(4 * no);
        size_t m = 0;
        int touched = 0;
        for (int t = 0; t < T; t++)
            for (int i = 0; i < H * kvr; i++) {
                float x = got[(size_t)t * H * kvr + i];
                if (ent[t] == 1) touched += !isnan(x);
                else g2[m] = x, r2[m++] = ref[(size_t)t * H * kvr + i];
            }
        CHECK(touched == 0, "%s: %d outputs of skipped queries written", what, touched);
        st_t_close(what, g2, r2, m, 1e-2, 1e-2);
        free(got), free(g2), free(r2);
    }
    st_gpu_free(dpool), st_gpu_free(dq), st_gpu_free(dent), st_gpu_free(dpos), st_gpu_free(dbt), st_gpu_free(dcu),
        st_gpu_free(dol), st_gpu_free(dlo);
    free(c.btab), free(pool), free(q), free(ent), free(pos), free(ref), free(ws), free(pages);
}

static void direct_case(int n, int H, int nope, int rope, int dv, int kvr, int ps, uint64_t seed) {
    st_rng_t r = {seed};
    int R = kvr + rope;
    cache_t c;
    cache_init(&c, 1, (n + ps - 1) / ps + 1, ps, &r);
    size_t pn = (size_t)c.pages * ps * R, ny = (size_t)n * H * (nope + dv);
    float *pool = gl_randn(pn, 1.f, &r), *Y = gl_randn(ny + 1, 1.f, &r);
    void *dpool = up_vals(pool, pn, false), *dY = up_vals(Y, ny + 1, false);
    float *cref = gt_xmalloc(4 * ((size_t)n * R + 1)), *K = gt_xmalloc(4 * ((size_t)n * H * (nope + rope) + 1)),
          *V = gt_xmalloc(4 * ((size_t)n * H * dv + 1));
    st_mla_gather(cref, pool, c.btab, ps, n, R);
    st_mla_kv_split(K, V, Y, cref, n, H, nope, rope, dv, R, kvr);
    int *dbt = gt_up(c.btab, sizeof(int) * c.pages);
    uint16_t *dc = gt_dev(2 * (size_t)n * R + 2), *dK = gt_dev(2 * (size_t)n * H * (nope + rope) + 2),
             *dV = gt_dev(2 * (size_t)n * H * dv + 2);
    GT_OK(st_cuda_mla_gather(&gt_stream, dc, dpool, dbt, ps, n, R));
    GT_OK(st_cuda_mla_kv_split(&gt_stream, dK, dV, dY, dc, n, H, nope, rope, dv, R, kvr));
    float *gc = gl_down_bf(dc, (size_t)n * R), *gK = gl_down_bf(dK, (size_t)n * H * (nope + rope)),
          *gV = gl_down_bf(dV, (size_t)n * H * dv);
    CHECK(memcmp(gc, cref, 4 * (size_t)n * R) == 0, "mla_gather n=%d R=%d ps=%d: not exact", n, R, ps);
    CHECK(memcmp(gK, K, 4 * (size_t)n * H * (nope + rope)) == 0 && memcmp(gV, V, 4 * (size_t)n * H * dv) == 0,
          "mla_kv_split n=%d H=%d nope=%d rope=%d dv=%d: not exact", n, H, nope, rope, dv);
    CHECK(st_cuda_mla_gather(&gt_stream, dc, dpool, dbt, ps, n, R + 1) == ST_ERR_INVALID_ARG,
          "mla_gather: R %% 8 != 0 accepted");
    st_gpu_free(dpool), st_gpu_free(dY), st_gpu_free(dbt), st_gpu_free(dc), st_gpu_free(dK), st_gpu_free(dV);
    free(c.btab), free(pool), free(Y), free(cref), free(K), free(V), free(gc), free(gK), free(gV);
}

int main(void) {
    gt_init_or_skip("test_gpu_glue_mla");
    uint64_t seed = 1;
    for (int f = 0; f < 2; f++) {
        kv_store_case(1, 512, 576, 64, f, seed++);
        kv_store_case(37, 64, 96, 16, f, seed++);
        kv_store_case(0, 64, 96, 16, f, seed++);
        qpe_case(1, 1, 128, 64, 512, f, seed++);
        qpe_case(33, 5, 32, 16, 64, f, seed++);
        attn_case(1, 1, 576, 512, 64, f, false, true, seed++);
        attn_case(37, 3, 576, 512, 16, f, false, f, seed++);
        attn_case(20, 8, 96, 64, 16, f, false, true, seed++);
        attn_case(30, 5, 80, 32, 8, f, true, true, seed++);
    }
    direct_case(1, 1, 128, 64, 128, 512, 64, seed++);
    direct_case(300, 4, 32, 16, 32, 64, 16, seed++);
    direct_case(1000, 2, 128, 64, 128, 512, 64, seed++);
    return st_test_done();
}
