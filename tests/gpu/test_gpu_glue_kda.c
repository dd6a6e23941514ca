/* The engine's KDA kernels vs their C twins: st_cuda_kda_gate (st_kda_gate, in place, both gate forms),
 * st_cuda_kda_gate_fb (st_kda_gate_fb; the warp form below 8 tokens and the tiled form from 8 on give
 * the same bits, checked token by token), st_cuda_kda_prep (st_kda_prep, with and without the bf16
 * copies), st_cuda_kda_out_gate (st_kda_out_gate, gate row stride wider than the row, split output) and
 * st_cuda_kda_recurrent (st_kda_recurrent per sequence: variable lengths with an empty sequence, state
 * slots out of order, head widths 32 / 64 / 128). fp32 outputs: rel L2 1e-5 (recurrence: 1e-4 over
 * long sequences); bf16 outputs: 1e-2. */
#include <math.h>
#include <string.h>

#include "glue_test.h"
#include "strata/kernels.h"

static void gate_case(int T, int H, int dk, bool bounded, uint64_t seed) {
    st_rng_t r = {seed};
    size_t n = (size_t)T * H * dk;
    float *f = gl_randn(n + 1, 2.f, &r), *A = gl_randn(H, 0.5f, &r), *dt = gl_randn((size_t)H * dk, 1.f, &r);
    float *ref = gt_xmalloc(4 * (n + 1));
    st_kda_gate(ref, f, A, dt, T, H, dk, bounded, -5.f);
    float *dg = gt_up(f, 4 * (n + 1)), *dA = gt_up(A, 4 * H), *ddt = gt_up(dt, 4 * (size_t)H * dk);
    GT_OK(st_cuda_kda_gate(&gt_stream, dg, dA, ddt, T, H, dk, bounded, -5.f));
    char what[96];
    snprintf(what, sizeof what, "kda_gate T=%d H=%d dk=%d %s", T, H, dk, bounded ? "bounded" : "unbounded");
    if (n) {
        float *got = gl_down_f32(dg, n);
        st_t_close(what, got, ref, n, 1e-5, 1e-5);
        free(got);
    }
    st_gpu_free(dg), st_gpu_free(dA), st_gpu_free(ddt);
    free(f), free(A), free(dt), free(ref);
}

static void gate_fb_case(int T, int H, int dk, int R, bool bounded, uint64_t seed) {
    st_rng_t r = {seed};
    int P = H * dk, naux = R + 7;
    size_t n = (size_t)T * P;
    float *aux = gl_randn((size_t)T * naux + 1, 1.f, &r), *w = gl_randn((size_t)P * R, 1.f / sqrtf((float)R), &r),
          *A = gl_randn(H, 0.5f, &r), *dt = gl_randn(P, 1.f, &r), *ref = gt_xmalloc(4 * (n + 1));
    st_kda_gate_fb(ref, aux, naux, w, R, A, dt, T, H, dk, bounded, -5.f);
    float *daux = gt_up(aux, 4 * ((size_t)T * naux + 1)), *dw = gt_up(w, 4 * (size_t)P * R), *dA = gt_up(A, 4 * H),
          *ddt = gt_up(dt, 4 * (size_t)P), *dg = gt_dev(4 * (n + 1)), *dg1 = gt_dev(4 * (n + 1));
    GT_OK(st_cuda_kda_gate_fb(&gt_stream, dg, daux, naux, dw, R, dA, ddt, T, H, dk, bounded, -5.f));
    float *got = gl_down_f32(dg, n);
    char what[96];
    snprintf(what, sizeof what, "kda_gate_fb T=%d H=%d dk=%d R=%d %s", T, H, dk, R, bounded ? "bounded" : "unbounded");
    st_t_close(what, got, ref, n, 1e-5, 1e-5);
    if (T >= 8) { /* the tiled form against the warp form, one token at a time: the same bits */
        for (int t = 0; t < T; t++)
            GT_OK(st_cuda_kda_gate_fb(&gt_stream, dg1 + (size_t)t * P, daux + (size_t)t * naux, naux, dw, R, dA, ddt, 1,
                                      H, dk, bounded, -5.f));
        float *one = gl_down_f32(dg1, n);
        CHECK(memcmp(one, got, 4 * n) == 0, "kda_gate_fb T=%d R=%d: the tiled and the per-token forms differ", T, R);
        free(one);
    }
    CHECK(st_cuda_kda_gate_fb(&gt_stream, dg, daux, naux, dw, 257, dA, ddt, T, H, dk, bounded, -5.f) ==
              ST_ERR_INVALID_ARG, "kda_gate_fb: R = 257 accepted");
    st_gpu_free(daux), st_gpu_free(dw), st_gpu_free(dA), st_gpu_free(ddt), st_gpu_free(dg), st_gpu_free(dg1);
    free(aux), free(w), free(A), free(dt), free(ref), free(got);
}

static void prep_case(int T, int H, int dk, bool with_bf, uint64_t seed) {
    st_rng_t r = {seed};
    int P = H * dk, ldaux = H + 9, boff = 5;
    size_t n = (size_t)T * P;
    float *qkv = gl_randn(3 * n + 1, 1.f, &r), *aux = gl_randn((size_t)T * ldaux + 1, 2.f, &r);
    float *q = gt_xmalloc(4 * (n + 1)), *k = gt_xmalloc(4 * (n + 1)), *v = gt_xmalloc(4 * (n + 1)),
          *beta = gt_xmalloc(4 * ((size_t)T * H + 1));
    const float l2eps = 1e-6f;
    st_kda_prep(q, k, v, beta, qkv, aux, ldaux, boff, T, H, dk, l2eps);
    float *dqkv = gt_up(qkv, 4 * (3 * n + 1)), *daux = gt_up(aux, 4 * ((size_t)T * ldaux + 1)), *dq = gt_dev(4 * n + 4),
          *dk_ = gt_dev(4 * n + 4), *dv = gt_dev(4 * n + 4), *db = gt_dev(4 * (size_t)T * H + 4);
    uint16_t *dqb = gt_dev(2 * n + 2), *dkb = gt_dev(2 * n + 2), *dvb = gt_dev(2 * n + 2);
    GT_OK(st_cuda_kda_prep(&gt_stream, dq, dk_, dv, with_bf ? dqb : NULL, dkb, dvb, db, dqkv, daux, ldaux, boff, T, H,
                           dk, l2eps));
    char what[96];
    if (n) {
        float *gq = gl_down_f32(dq, n), *gk = gl_down_f32(dk_, n), *gv = gl_down_f32(dv, n),
              *gb = gl_down_f32(db, (size_t)T * H);
        snprintf(what, sizeof what, "kda_prep T=%d H=%d dk=%d: q", T, H, dk);
        st_t_close(what, gq, q, n, 1e-5, 1e-6);
        snprintf(what, sizeof what, "kda_prep T=%d H=%d dk=%d: k", T, H, dk);
        st_t_close(what, gk, k, n, 1e-5, 1e-6);
        CHECK(memcmp(gv, v, 4 * n) == 0, "kda_prep T=%d: v not the exact copy", T);
        snprintf(what, sizeof what, "kda_prep T=%d H=%d dk=%d: beta", T, H, dk);
        st_t_close(what, gb, beta, (size_t)T * H, 1e-6, 1e-6);
        float *bq = gl_down_bf(dqb, n), *bk = gl_down_bf(dkb, n), *bv = gl_down_bf(dvb, n);
        if (with_bf) { /* the bf16 copies are the rounding of the fp32 outputs */
            int bad = 0;
            for (size_t i = 0; i < n; i++)
                bad += bq[i] != st_bf16_to_f32(st_f32_to_bf16(gq[i])) || bk[i] != st_bf16_to_f32(st_f32_to_bf16(gk[i])) ||
                       bv[i] != st_bf16_to_f32(st_f32_to_bf16(gv[i]));
            CHECK(bad == 0, "kda_prep T=%d: %d bf16 copies are not the rounding of the fp32 outputs", T, bad);
        } else { /* qb == NULL: none of the copies is written (still NaN-poisoned) */
            int written = 0;
            for (size_t i = 0; i < n; i++) written += !isnan(bk[i]) || !isnan(bv[i]);
            CHECK(written == 0, "kda_prep T=%d qb NULL: %d bf16 copies written", T, written);
        }
        free(gq), free(gk), free(gv), free(gb), free(bq), free(bk), free(bv);
    }
    st_gpu_free(dqkv), st_gpu_free(daux), st_gpu_free(dq), st_gpu_free(dk_), st_gpu_free(dv), st_gpu_free(db),
        st_gpu_free(dqb), st_gpu_free(dkb), st_gpu_free(dvb);
    free(qkv), free(aux), free(q), free(k), free(v), free(beta);
}

static void out_gate_case(int T, int H, int dv, bool split, uint64_t seed) {
    st_rng_t r = {seed};
    int ldg = H * dv + 3;
    size_t n = (size_t)T * H * dv;
    float *o = gl_randn(n + 1, 1.f, &r), *gate = gl_randn((size_t)T * ldg + 1, 2.f, &r), *w = gl_randn(dv, 0.2f, &r);
    for (int i = 0; i < dv; i++) w[i] += 1.f;
    float *ref = gt_xmalloc(4 * (n + 1)), *gc = gt_xmalloc(4 * (n + 1));
    memcpy(ref, o, 4 * n);
    for (int t = 0; t < T; t++) memcpy(gc + (size_t)t * H * dv, gate + (size_t)t * ldg, 4 * (size_t)H * dv);
    st_kda_out_gate(ref, gc, w, T, H, dv, 1e-5f);
    float *dO = gt_up(o, 4 * (n + 1)), *dG = gt_up(gate, 4 * ((size_t)T * ldg + 1)), *dw = gt_up(w, 4 * (size_t)dv);
    uint16_t *dout = gt_dev(2 * n + 2), *dlo = gt_dev(2 * n + 2);
    GT_OK(st_cuda_kda_out_gate(&gt_stream, dout, split ? dlo : NULL, dO, dG, ldg, dw, T, H, dv, 1e-5f));
    char what[96];
    snprintf(what, sizeof what, "kda_out_gate T=%d H=%d dv=%d", T, H, dv);
    if (n) gl_check_split(what, dout, split ? dlo : NULL, ref, n);
    st_gpu_free(dO), st_gpu_free(dG), st_gpu_free(dw), st_gpu_free(dout), st_gpu_free(dlo);
    free(o), free(gate), free(w), free(ref), free(gc);
}

/* B sequences of lengths lens[], state slots in reverse order (slot of b = B - 1 - b, pool of B + 1) */
static void rec_case(const int *lens, int B, int H, int dk, uint64_t seed) {
    st_rng_t r = {seed};
    int *cu = gt_xmalloc(sizeof(int) * (B + 1)), *slots = gt_xmalloc(sizeof(int) * B);
    cu[0] = 0;
    for (int b = 0; b < B; b++) cu[b + 1] = cu[b] + lens[b], slots[b] = B - 1 - b;
    int T = cu[B];
    size_t n = (size_t)T * H * dk, sn = (size_t)H * dk * dk;
    float *q = gl_randn(n + 1, 1.f, &r), *k = gl_randn(n + 1, 1.f, &r), *v = gl_randn(n + 1, 1.f, &r),
          *g = gl_randn(n + 1, 1.f, &r), *beta = gl_randn((size_t)T * H + 1, 1.f, &r),
          *S = gl_randn(sn * (B + 1), 0.1f, &r);
    st_l2norm_heads(q, T, H, dk, 1e-6f);
    st_l2norm_heads(k, T, H, dk, 1e-6f);
    for (size_t i = 0; i < n; i++) g[i] = -0.3f * fabsf(g[i]);
    for (size_t i = 0; i < (size_t)T * H; i++) beta[i] = st_sigmoid(beta[i]);
    float *dq = gt_up(q, 4 * (n + 1)), *dk_ = gt_up(k, 4 * (n + 1)), *dv = gt_up(v, 4 * (n + 1)),
          *dg = gt_up(g, 4 * (n + 1)), *db = gt_up(beta, 4 * ((size_t)T * H + 1)), *dS = gt_up(S, 4 * sn * (B + 1)),
          *dO = gt_dev(4 * (n + 1));
    int *dcu = gt_up(cu, sizeof(int) * (B + 1)), *dsl = gt_up(slots, sizeof(int) * B);
    const float scale = 1.f / sqrtf((float)dk);
    float *o = gt_xmalloc(4 * (n + 1));
    for (int b = 0; b < B; b++) {
        size_t off = (size_t)cu[b] * H * dk;
        st_kda_recurrent(o + off, q + off, k + off, v + off, g + off, beta + (size_t)cu[b] * H, S + slots[b] * sn,
                         lens[b], H, dk, dk, scale);
    }
    GT_OK(st_cuda_kda_recurrent(&gt_stream, dO, dq, dk_, dv, dg, db, dS, dsl, dcu, B, H, dk, scale));
    char what[96];
    snprintf(what, sizeof what, "kda_recurrent B=%d T=%d H=%d dk=%d: o", B, T, H, dk);
    float *go = gl_down_f32(dO, n), *gS = gl_down_f32(dS, sn * (B + 1));
    st_t_close(what, go, o, n, 1e-4, 1e-4);
    snprintf(what, sizeof what, "kda_recurrent B=%d T=%d H=%d dk=%d: state (the unused slot kept)", B, T, H, dk);
    st_t_close(what, gS, S, sn * (B + 1), 1e-4, 1e-4);
    CHECK(st_cuda_kda_recurrent(&gt_stream, dO, dq, dk_, dv, dg, db, dS, dsl, dcu, B, H, 129, scale) ==
              ST_ERR_INVALID_ARG, "kda_recurrent: dk = 129 accepted");
    st_gpu_free(dq), st_gpu_free(dk_), st_gpu_free(dv), st_gpu_free(dg), st_gpu_free(db), st_gpu_free(dS),
        st_gpu_free(dO), st_gpu_free(dcu), st_gpu_free(dsl);
    free(cu), free(slots), free(q), free(k), free(v), free(g), free(beta), free(S), free(o), free(go), free(gS);
}

int main(void) {
    gt_init_or_skip("test_gpu_glue_kda");
    uint64_t seed = 1;
    for (int b = 0; b < 2; b++) {
        gate_case(1, 1, 32, b, seed++);
        gate_case(37, 3, 64, b, seed++);
        gate_case(8192, 4, 128, b, seed++);
        gate_case(0, 2, 64, b, seed++);
        gate_fb_case(1, 2, 64, 16, b, seed++);
        gate_fb_case(5, 3, 32, 100, b, seed++);
        gate_fb_case(8, 4, 128, 256, b, seed++);
        gate_fb_case(37, 3, 64, 65, b, seed++);
        gate_fb_case(300, 1, 128, 128, b, seed++);
    }
    prep_case(1, 1, 32, true, seed++);
    prep_case(37, 3, 64, false, seed++);
    prep_case(513, 4, 128, true, seed++);
    prep_case(0, 2, 64, true, seed++);
    out_gate_case(1, 1, 32, true, seed++);
    out_gate_case(37, 3, 64, false, seed++);
    out_gate_case(2048, 4, 128, true, seed++);
    static const int l1[] = {1}, l2[] = {5, 0, 17, 1}, l3[] = {64, 3};
    rec_case(l1, 1, 1, 32, seed++);
    rec_case(l2, 4, 3, 64, seed++);
    rec_case(l3, 2, 2, 128, seed++);
    return st_test_done();
}
