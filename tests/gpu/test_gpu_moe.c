/* Sigmoid router with biased top-k and greedy argmax on the GPU vs the CPU ops.
 * (GLU: test_gpu_glue_act.c). Routing sets must match exactly (ids ascending), weights to 1e-5; argmax ids exactly, with ties. */
#include <math.h>

#include "gpu_test.h"
#include "strata/kernels.h"

/* ld > k: rows of ld with the weights past k zeroed and the counts written (the engine's layout) */
static void router_case(int T, int n, int k, bool renorm, bool with_bias, uint64_t seed) {
    st_rng_t r = {seed};
    size_t N = (size_t)T * n;
    float *s = gt_xmalloc(4 * N), *bias = gt_xmalloc(4 * n), *w_ref = gt_xmalloc(4 * (size_t)T * k),
          *w_got = gt_xmalloc(4 * (size_t)T * k), *s_got = gt_xmalloc(4 * N);
    int *id_ref = gt_xmalloc(sizeof(int) * T * k), *id_got = gt_xmalloc(sizeof(int) * T * k);
    for (size_t i = 0; i < N; i++) s[i] = 2.f * st_rng_normal(&r);
    for (int i = 0; i < n; i++) bias[i] = 0.1f * st_rng_normal(&r);
    int ld = k + (int)(seed % 3); /* seeds 1, 4, 7 run ld = k + 1 */
    float *d_s = gt_up(s, 4 * N), *d_b = gt_up(bias, 4 * n), *d_w = gt_dev(4 * (size_t)T * ld);
    int *d_id = gt_dev(sizeof(int) * T * ld), *d_cnt = gt_dev(sizeof(int) * T);
    float *w_row = gt_xmalloc(4 * (size_t)T * ld);
    int *id_row = gt_xmalloc(sizeof(int) * T * ld), *cnt = gt_xmalloc(sizeof(int) * T);
    st_router_sigmoid(s, T, n);
    st_route_topk(id_ref, w_ref, s, with_bias ? bias : NULL, T, n, k, renorm, 2.5f);
    GT_OK(st_cuda_router_topk(&gt_stream, d_id, d_w, ld, d_cnt, d_s, with_bias ? d_b : NULL, T, n, k, renorm, 2.5f));
    gt_down(id_row, d_id, sizeof(int) * T * ld);
    gt_down(w_row, d_w, 4 * (size_t)T * ld);
    gt_down(cnt, d_cnt, sizeof(int) * T);
    gt_down(s_got, d_s, 4 * N);
    int diff = 0, badcnt = 0, badpad = 0;
    for (int t = 0; t < T; t++) {
        memcpy(id_got + (size_t)t * k, id_row + (size_t)t * ld, sizeof(int) * k);
        memcpy(w_got + (size_t)t * k, w_row + (size_t)t * ld, 4 * (size_t)k);
        badcnt += cnt[t] != k;
        for (int i = k; i < ld; i++) badpad += w_row[(size_t)t * ld + i] != 0.f;
    }
    CHECK(badcnt == 0 && badpad == 0, "router_topk T=%d n=%d k=%d ld=%d: %d counts wrong, %d pad weights not 0", T, n,
          k, ld, badcnt, badpad);
    for (int i = 0; i < T * k; i++) diff += id_got[i] != id_ref[i];
    CHECK(diff == 0, "router_topk T=%d n=%d k=%d: %d ids differ", T, n, k, diff);
    char what[96];
    snprintf(what, sizeof what, "router_topk T=%d n=%d k=%d renorm=%d bias=%d: w", T, n, k, renorm, with_bias);
    st_t_close(what, w_got, w_ref, (size_t)T * k, 1e-5, 1e-6);
    snprintf(what, sizeof what, "router_sigmoid T=%d n=%d", T, n);
    st_t_close(what, s_got, s, N, 1e-5, 1e-6);
    st_gpu_free(d_s), st_gpu_free(d_b), st_gpu_free(d_w), st_gpu_free(d_id), st_gpu_free(d_cnt);
    free(s), free(bias), free(w_ref), free(w_got), free(s_got), free(id_ref), free(id_got), free(w_row), free(id_row),
        free(cnt);
}

static void argmax_case(int T, int V, uint64_t seed) {
    st_rng_t r = {seed};
    float *x = gt_xmalloc(4 * (size_t)T * V);
    int *got = gt_xmalloc(sizeof(int) * T);
    for (size_t i = 0; i < (size_t)T * V; i++) x[i] = st_rng_normal(&r);
    for (int t = 0; t < T; t++) { /* plant a tie at the maximum in every other row */
        float *row = x + (size_t)t * V;
        if (t & 1 && V > 2) row[V - 1] = row[V / 3] = 10.f;
    }
    float *d_x = gt_up(x, 4 * (size_t)T * V);
    int *d_id = gt_dev(sizeof(int) * T);
    GT_OK(st_cuda_argmax(&gt_stream, d_id, d_x, T, V));
    gt_down(got, d_id, sizeof(int) * T);
    int diff = 0;
    for (int t = 0; t < T; t++) diff += got[t] != st_argmax(x + (size_t)t * V, V);
    CHECK(diff == 0, "argmax T=%d V=%d: %d rows differ", T, V, diff);
    st_gpu_free(d_x), st_gpu_free(d_id);
    free(x), free(got);
}

int main(void) {
    gt_init_or_skip("test_gpu_moe");
    router_case(1, 8, 1, true, false, 1);
    router_case(17, 64, 2, true, true, 2);
    router_case(100, 896, 8, true, true, 3);
    router_case(33, 384, 8, false, true, 4);
    router_case(5, 1500, 8, true, true, 5);   /* n > 1024: the kernel re-reads the scores each round */
    router_case(64, 200, 16, true, false, 6);
    router_case(3, 33, 32, false, true, 7);   /* k = 32: every lane holds a choice */
    argmax_case(1, 1, 1);
    argmax_case(4, 1000, 2);
    argmax_case(3, 163840, 3);
    return st_test_done();
}
