/* The engine's GEMM wrappers and embedding vs their C twins: st_cuda_sgemm (st_sgemm), the per-head
 * strided GEMM st_cuda_linear_heads (st_linear_heads: bf16 and fp32 outputs, both weight layouts, row
 * strides wider than the rows), st_cuda_embed (st_embed, exact). Odd sizes, one token, T = 0. */
#include <math.h>
#include <string.h>

#include "glue_test.h"
#include "strata/kernels.h"

static void sgemm_case(int T, int N, int K, uint64_t seed) {
    st_rng_t r = {seed};
    int ldx = K + 3, ldy = N + 1;
    float *x = gl_randn((size_t)T * ldx + 1, 1.f, &r), *W = gl_randn((size_t)N * K, 1.f / sqrtf((float)K), &r);
    float *ref = gt_xmalloc(4 * ((size_t)T * ldy + 1));
    for (size_t i = 0; i < (size_t)T * ldy; i++) ref[i] = NAN;
    st_sgemm(ref, ldy, x, ldx, W, T, N, K);
    float *dx = gt_up(x, 4 * ((size_t)T * ldx + 1)), *dW = gt_up(W, 4 * (size_t)N * K), *dy = gt_dev(4 * ((size_t)T * ldy + 1));
    GT_OK(st_cuda_sgemm(&gt_stream, dy, ldy, dx, ldx, dW, T, N, K));
    float *got = gl_down_f32(dy, (size_t)T * ldy);
    /* only the rows' first N columns are written: compare those (the pad stays NaN-poisoned) */
    float *g2 = gt_xmalloc(4 * ((size_t)T * N + 1)), *r2 = gt_xmalloc(4 * ((size_t)T * N + 1));
    for (int t = 0; t < T; t++)
        memcpy(g2 + (size_t)t * N, got + (size_t)t * ldy, 4 * (size_t)N), memcpy(r2 + (size_t)t * N, ref + (size_t)t * ldy, 4 * (size_t)N);
    char w[96];
    snprintf(w, sizeof w, "sgemm T=%d N=%d K=%d", T, N, K);
    if (T) st_t_close(w, g2, r2, (size_t)T * N, 1e-5, 1e-5);
    else CHECK(1, "T=0");
    st_gpu_free(dx), st_gpu_free(dW), st_gpu_free(dy);
    free(x), free(W), free(ref), free(got), free(g2), free(r2);
}

/* bf16 in, bf16 out (y_f32 false) or fp32 out (y_f32 true) */
static void heads_case(bool y_f32, bool trans_w, int T, int N, int K, int H, uint64_t seed) {
    st_rng_t r = {seed};
    int ldx = H * K + 2, ldy = H * N + 1, ldw = trans_w ? K : N; /* heads side by side in a row */
    long long sx = K, sy = N, sw = (long long)N * K;
    size_t nx = (size_t)T * ldx, ny = (size_t)T * ldy, nw = (size_t)H * N * K;
    float *x = gl_randn(nx + 1, 1.f, &r), *W = gl_randn(nw, 1.f / sqrtf((float)K), &r);
    uint16_t *xb = gt_xmalloc(2 * nx + 2), *Wb = gt_xmalloc(2 * nw);
    gt_to_bf(xb, x, nx), gt_to_bf(Wb, W, nw);
    float *ref = gt_xmalloc(4 * (ny + 1));
    memset(ref, 0, 4 * (ny + 1));
    st_linear_heads(ref, ldy, sy, x, ldx, sx, W, ldw, sw, trans_w, T, N, K, H);
    void *dy = gt_dev(4 * (ny + 1));
    GT_OK(st_gpu_memset(dy, 0, 4 * (ny + 1))); /* the columns between heads' rows are not written */
    uint16_t *dx = gt_up(xb, 2 * nx), *dW = gt_up(Wb, 2 * nw);
    GT_OK(st_cuda_linear_heads(&gt_stream, dy, y_f32, ldy, sy, dx, ldx, sx, dW, ldw, sw, trans_w, T, N, K, H));
    float *got;
    if (!y_f32) {
        got = gt_xmalloc(4 * (ny + 1));
        float *h = gl_down_bf(dy, ny); /* bf16 output: ldy is in elements, dy holds 2-byte rows */
        memcpy(got, h, 4 * ny), free(h);
        for (int t = 0; t < T; t++) /* bf16 rows: columns past H·N stay 0 in both */
            for (int c = H * N; c < ldy; c++) got[(size_t)t * ldy + c] = ref[(size_t)t * ldy + c];
    } else {
        got = gl_down_f32(dy, ny);
    }
    char w[128];
    snprintf(w, sizeof w, "linear_heads %s trans_w=%d T=%d N=%d K=%d H=%d", y_f32 ? "f32" : "bf16", trans_w, T, N, K,
             H);
    st_t_close(w, got, ref, ny, y_f32 ? 1e-5 : 1e-2, y_f32 ? 1e-4 : 1e-2);
    st_gpu_free(dy), st_gpu_free(dx), st_gpu_free(dW);
    free(x), free(W), free(xb), free(Wb), free(ref), free(got);
}

static void embed_case(int T, int V, int d, uint64_t seed) {
    st_rng_t r = {seed};
    float *E = gt_xmalloc(4 * (size_t)V * d);
    uint16_t *Eb = gt_xmalloc(2 * (size_t)V * d);
    gt_randn_bf(E, Eb, (size_t)V * d, 1.f, &r);
    int *tok = gt_xmalloc(sizeof(int) * (T + 1));
    for (int t = 0; t < T; t++) tok[t] = t == 0 ? V - 1 : (int)(st_rng_next(&r) % (uint64_t)V);
    float *ref = gt_xmalloc(4 * ((size_t)T * d + 1));
    st_embed(ref, E, tok, T, d);
    uint16_t *dE = gt_up(Eb, 2 * (size_t)V * d);
    int *dt = gt_up(tok, sizeof(int) * (T + 1));
    float *dp = gt_dev(4 * ((size_t)T * d + 1));
    GT_OK(st_cuda_embed(&gt_stream, dp, dE, dt, T, d));
    float *got = gl_down_f32(dp, (size_t)T * d);
    CHECK(memcmp(got, ref, 4 * (size_t)T * d) == 0, "embed T=%d V=%d d=%d: not exact", T, V, d);
    st_gpu_free(dE), st_gpu_free(dt), st_gpu_free(dp);
    free(E), free(Eb), free(tok), free(ref), free(got);
}

int main(void) {
    gt_init_or_skip("test_gpu_glue_linear");
    sgemm_case(1, 37, 129, 1);
    sgemm_case(65, 256, 64, 2);
    sgemm_case(300, 33, 17, 3);
    sgemm_case(0, 8, 8, 4);
    for (int tw = 0; tw < 2; tw++)
        for (int f32 = 0; f32 < 2; f32++) {
            heads_case(f32, tw, 1, 64, 128, 3, 10 + f32);
            heads_case(f32, tw, 37, 33, 65, 5, 20 + f32);
            heads_case(f32, tw, 130, 128, 192, 2, 30 + f32);
        }
    embed_case(1, 7, 5, 1);
    embed_case(333, 1000, 257, 2);
    embed_case(8192, 4096, 64, 3);
    embed_case(0, 3, 8, 4);
    return st_test_done();
}
