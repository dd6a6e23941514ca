/* Conversions and the linear (skinny kernel / cuBLAS) vs their CPU versions (RMSNorm: test_gpu_glue_act.c) over odd shapes
 * (one token, odd widths, K3 widths). Tolerance: bf16 output rounding (rel L2 1e-2). */
#include <math.h>
#include <string.h>

#include "gpu_test.h"
#include "strata/kernels.h"

static void linear_case(int T, int N, int K, bool f32out, uint64_t seed) {
    st_rng_t r = {seed};
    float *x = gt_xmalloc(4 * (size_t)T * K), *W = gt_xmalloc(4 * (size_t)N * K), *ref = gt_xmalloc(4 * (size_t)T * N),
          *got = gt_xmalloc(4 * (size_t)T * N);
    uint16_t *xb = gt_xmalloc(2 * (size_t)T * K), *Wb = gt_xmalloc(2 * (size_t)N * K), *yb = gt_xmalloc(2 * (size_t)T * N);
    gt_randn_bf(x, xb, (size_t)T * K, 1.f, &r);
    gt_randn_bf(W, Wb, (size_t)N * K, 1.f / sqrtf((float)K), &r);
    st_weight_t w = {.dtype = ST_DT_F32, .rows = N, .cols = K, .data = W};
    st_linear_ref(ref, x, &w, T);
    uint16_t *dx = gt_up(xb, 2 * (size_t)T * K), *dW = gt_up(Wb, 2 * (size_t)N * K);
    void *dy = gt_dev(4 * (size_t)T * N);
    GT_OK(st_cuda_linear(&gt_stream, dy, N, f32out, 0.f, dx, K, dW, T, N, K));
    if (f32out) gt_down(got, dy, 4 * (size_t)T * N);
    else {
        gt_down(yb, dy, 2 * (size_t)T * N);
        gt_from_bf(got, yb, (size_t)T * N);
    }
    char what[96];
    snprintf(what, sizeof what, "linear T=%d N=%d K=%d out=%s", T, N, K, f32out ? "f32" : "bf16");
    st_t_close(what, got, ref, (size_t)T * N, f32out ? 1e-4 : 1e-2, 1e-3);
    st_gpu_free(dx), st_gpu_free(dW), st_gpu_free(dy);
    free(x), free(W), free(ref), free(got), free(xb), free(Wb), free(yb);
}

/* st_cuda_linear with strides and accumulate, on the skinny (decode) kernel where it picks it (up to 32
 * tokens, small W, K and ldx multiples of 8) and cuBLAS elsewhere: y (row stride ldy) = beta·y + x (row
 * stride ldx) · Wᵀ vs the CPU, fp32 or bf16 out; the pad between rows stays untouched. */
static void skinny_case(int T, int N, int K, bool f32out, float beta, int padx, int pady, uint64_t seed) {
    st_rng_t r = {seed};
    int ldx = K + padx, ldy = N + pady;
    size_t ny = (size_t)T * ldy;
    float *x = gt_xmalloc(4 * (size_t)T * K), *W = gt_xmalloc(4 * (size_t)N * K), *ref = gt_xmalloc(4 * (size_t)T * N),
          *y0 = gt_xmalloc(4 * ny), *got = gt_xmalloc(4 * ny), *gotc = gt_xmalloc(4 * (size_t)T * N);
    uint16_t *xb = gt_xmalloc(2 * (size_t)T * ldx), *Wb = gt_xmalloc(2 * (size_t)N * K), *yb = gt_xmalloc(2 * ny);
    float *xt = gt_xmalloc(4 * (size_t)T * ldx);
    gt_randn_bf(xt, xb, (size_t)T * ldx, 1.f, &r);
    for (int t = 0; t < T; t++) memcpy(x + (size_t)t * K, xt + (size_t)t * ldx, 4 * (size_t)K);
    gt_randn_bf(W, Wb, (size_t)N * K, 1.f / sqrtf((float)K), &r);
    for (size_t i = 0; i < ny; i++) { /* y before: bf16-exact values (beta = 1 adds to them) */
        uint16_t h = st_f32_to_bf16((float)st_rng_normal(&r));
        y0[i] = st_bf16_to_f32(h), yb[i] = h;
    }
    st_weight_t w = {.dtype = ST_DT_F32, .rows = N, .cols = K, .data = W};
    st_linear_ref(ref, x, &w, T);
    for (int t = 0; t < T; t++)
        for (int n = 0; n < N; n++) ref[(size_t)t * N + n] += beta * y0[(size_t)t * ldy + n];
    uint16_t *dx = gt_up(xb, 2 * (size_t)T * ldx), *dW = gt_up(Wb, 2 * (size_t)N * K);
    void *dy = f32out ? gt_up(y0, 4 * ny) : gt_up(yb, 2 * ny);
    GT_OK(st_cuda_linear(&gt_stream, dy, ldy, f32out, beta, dx, ldx, dW, T, N, K));
    if (f32out) gt_down(got, dy, 4 * ny);
    else {
        gt_down(yb, dy, 2 * ny);
        gt_from_bf(got, yb, ny);
    }
    size_t moved = 0; /* the pad columns between rows keep their values */
    for (int t = 0; t < T; t++)
        for (int n = N; n < ldy; n++) moved += memcmp(&got[(size_t)t * ldy + n], &y0[(size_t)t * ldy + n], 4) != 0;
    for (int t = 0; t < T; t++) memcpy(gotc + (size_t)t * N, got + (size_t)t * ldy, 4 * (size_t)N);
    char what[128];
    snprintf(what, sizeof what, "strided linear T=%d N=%d K=%d out=%s beta=%g ldx=%d ldy=%d", T, N, K,
             f32out ? "f32" : "bf16", beta, ldx, ldy);
    CHECK(moved == 0, "%s: %zu pad elements written", what, moved);
    st_t_close(what, gotc, ref, (size_t)T * N, f32out ? 1e-4 : 1e-2, 1e-3);
    st_gpu_free(dx), st_gpu_free(dW), st_gpu_free(dy);
    free(x), free(xt), free(W), free(ref), free(y0), free(got), free(gotc), free(xb), free(Wb), free(yb);
}

/* Three layers sharing x through st_cuda_linear_multi (one launch up to 32 tokens, else one call each):
 * fp32 out, bf16 out, fp32 accumulate with a row stride, each vs the CPU. */
static void multi_case(int T, int K, uint64_t seed) {
    st_rng_t r = {seed};
    enum { NS = 3 };
    const int Ns[NS] = {100, 40, 1024}, lds[NS] = {100, 48, 1030};
    const bool f32[NS] = {true, false, true};
    const float beta[NS] = {0.f, 0.f, 1.f};
    float *x = gt_xmalloc(4 * (size_t)T * K);
    uint16_t *xb = gt_xmalloc(2 * (size_t)T * K);
    gt_randn_bf(x, xb, (size_t)T * K, 1.f, &r);
    uint16_t *dx = gt_up(xb, 2 * (size_t)T * K);
    st_linear_seg_t seg[NS];
    float *W[NS], *y0[NS], *ref[NS];
    for (int i = 0; i < NS; i++) {
        size_t nw = (size_t)Ns[i] * K, ny = (size_t)T * lds[i];
        W[i] = gt_xmalloc(4 * nw), y0[i] = gt_xmalloc(4 * ny), ref[i] = gt_xmalloc(4 * (size_t)T * Ns[i]);
        uint16_t *Wb = gt_xmalloc(2 * nw), *yb = gt_xmalloc(2 * ny);
        gt_randn_bf(W[i], Wb, nw, 1.f / sqrtf((float)K), &r);
        gt_randn_bf(y0[i], yb, ny, 1.f, &r);
        st_weight_t w = {.dtype = ST_DT_F32, .rows = Ns[i], .cols = K, .data = W[i]};
        st_linear_ref(ref[i], x, &w, T);
        for (int t = 0; t < T; t++)
            for (int n = 0; n < Ns[i]; n++) ref[i][(size_t)t * Ns[i] + n] += beta[i] * y0[i][(size_t)t * lds[i] + n];
        seg[i] = (st_linear_seg_t){.W = gt_up(Wb, 2 * nw), .y = f32[i] ? gt_up(y0[i], 4 * ny) : gt_up(yb, 2 * ny),
                                   .N = Ns[i], .ldy = lds[i], .y_f32 = f32[i], .beta = beta[i]};
        free(Wb), free(yb);
    }
    GT_OK(st_cuda_linear_multi(&gt_stream, dx, K, T, K, seg, NS));
    for (int i = 0; i < NS; i++) {
        size_t ny = (size_t)T * lds[i];
        float *got = gt_xmalloc(4 * ny), *gotc = gt_xmalloc(4 * (size_t)T * Ns[i]);
        if (f32[i]) gt_down(got, seg[i].y, 4 * ny);
        else {
            uint16_t *yb = gt_xmalloc(2 * ny);
            gt_down(yb, seg[i].y, 2 * ny);
            gt_from_bf(got, yb, ny);
            free(yb);
        }
        for (int t = 0; t < T; t++) memcpy(gotc + (size_t)t * Ns[i], got + (size_t)t * lds[i], 4 * (size_t)Ns[i]);
        char what[96];
        snprintf(what, sizeof what, "linear_multi T=%d K=%d segment %d (N=%d %s beta=%g)", T, K, i, Ns[i],
                 f32[i] ? "f32" : "bf16", beta[i]);
        st_t_close(what, gotc, ref[i], (size_t)T * Ns[i], f32[i] ? 1e-4 : 1e-2, 1e-3);
        st_gpu_free((void *)seg[i].W), st_gpu_free(seg[i].y);
        free(got), free(gotc), free(W[i]), free(y0[i]), free(ref[i]);
    }
    CHECK(st_cuda_linear_multi(&gt_stream, dx, K, T, K, seg, 0) == ST_ERR_INVALID_ARG, "linear_multi: 0 segments rejected");
    st_gpu_free(dx);
    free(x), free(xb);
}

/* dtype conversions vs st_f32_to_bf16 / st_bf16_to_f32, bit for bit: random values, rounding ties,
 * ±0, ±inf, NaN, subnormals, the largest finite values; outputs poisoned (gt_dev) */
static void convert_case(size_t n, uint64_t seed) {
    st_rng_t r = {seed};
    float *x = gt_xmalloc(4 * n), *back = gt_xmalloc(4 * n);
    uint16_t *ref = gt_xmalloc(2 * n), *got = gt_xmalloc(2 * n);
    static const uint32_t special[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0x00000001u,
                                       0x80000003u, 0x007fffffu, 0x7f7fffffu, 0x3f808000u, 0x3f818000u, 0x3f80c000u};
    for (size_t i = 0; i < n; i++) {
        uint32_t u = i < ST_ARRAY_LEN(special) ? special[i] : (uint32_t)st_rng_next(&r);
        memcpy(&x[i], &u, 4);
        ref[i] = st_f32_to_bf16(x[i]);
    }
    float *dx = gt_up(x, 4 * n), *dback = gt_dev(4 * n);
    uint16_t *dy = gt_dev(2 * n);
    GT_OK(st_cuda_f32_to_bf16(&gt_stream, dy, dx, n));
    gt_down(got, dy, 2 * n);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += got[i] != ref[i] && !(isnan(x[i]) && (got[i] & 0x7fff) > 0x7f80);
    CHECK(bad == 0, "f32_to_bf16 n=%zu: %zu of %zu differ from st_f32_to_bf16", n, bad, n);
    GT_OK(st_cuda_bf16_to_f32(&gt_stream, dback, dy, n));
    gt_down(back, dback, 4 * n);
    bad = 0;
    for (size_t i = 0; i < n; i++) {
        float e = st_bf16_to_f32(got[i]);
        bad += memcmp(&e, &back[i], 4) != 0;
    }
    CHECK(bad == 0, "bf16_to_f32 n=%zu: %zu of %zu differ from st_bf16_to_f32", n, bad, n);
    st_gpu_free(dx), st_gpu_free(dback), st_gpu_free(dy);
    free(x), free(back), free(ref), free(got);
}

int main(void) {
    gt_init_or_skip("test_gpu_norm_linear");
    convert_case(12, 1);
    convert_case(1000, 2);
    convert_case((size_t)1 << 25, 3); /* more than the kernels' grid: the grid-stride loop */
    static const int lt[] = {1, 17, 128}, ln[] = {1, 101, 512}, lk[] = {8, 200, 1024};
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++)
            for (int k = 0; k < 3; k++) linear_case(lt[i], ln[j], lk[k], (i + j + k) & 1, 100 + 9 * i + 3 * j + k);
    /* skinny kernel: every token-tile width (1, 2, 4 n-tiles) and its edges, rows not a multiple of
     * 16, K not a multiple of 32 and K split over 1..8 warps, strides, accumulate, bf16 out; T > 32 and
     * the 3000 × 7168 W go to cuBLAS, with the same strides and accumulate */
    static const int st[] = {1, 5, 8, 9, 16, 17, 32, 33, 64, 65};
    static const int sn[][2] = {{1, 8}, {15, 24}, {16, 40}, {100, 1000}, {1024, 1024}, {3000, 7168}};
    int ci = 0;
    for (size_t i = 0; i < ST_ARRAY_LEN(st); i++)
        for (size_t j = 0; j < ST_ARRAY_LEN(sn); j++, ci++)
            skinny_case(st[i], sn[j][0], sn[j][1], ci % 3 != 1, ci % 4 == 2 ? 1.f : 0.f, ci % 5 == 3 ? 8 : 0,
                        ci % 7 == 4 ? 3 : 0, 500 + ci);
    /* the skinny kernel does not apply (K not a multiple of 8): cuBLAS, same result */
    skinny_case(3, 40, 20, true, 0.f, 0, 0, 900);
    {
        void *d = gt_dev(4096);
        CHECK(st_cuda_linear(&gt_stream, d, 2, true, 0.f, d, 12, d, 2, 4, 12) == ST_ERR_INVALID_ARG,
              "linear: ldy < N rejected");
        st_gpu_free(d);
    }
    multi_case(1, 1024, 901);
    multi_case(8, 1000, 902);
    multi_case(20, 1024, 903);
    multi_case(40, 1024, 904); /* past 32 tokens: one call per layer */
    return st_test_done();
}
