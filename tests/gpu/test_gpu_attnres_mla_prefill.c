/* Block AttnRes two-phase (fp32) and MLA causal prefill (bf16, flash form) on the GPU vs the CPU:
 * st_attnres_phase1/phase2 (stats, acc, out to 1e-4 relative; m = 0 gives (−inf, 0) exactly) and
 * st_mla_attn_direct on bf16-rounded inputs (2e-2 relative L2). */
#include <math.h>
#include <string.h>

#include "gpu_test.h"
#include "strata/kernels.h"

static void attnres_case(int T, int d, int m, int Q, uint64_t seed) {
    st_rng_t r = {seed};
    float **blk = gt_xmalloc(sizeof(float *) * (m + 1)), **d_blk = gt_xmalloc(sizeof(float *) * (m + 1));
    for (int i = 0; i < m; i++) {
        blk[i] = gt_xmalloc(4 * (size_t)T * d);
        for (size_t j = 0; j < (size_t)T * d; j++) blk[i][j] = (1.f + i) * st_rng_normal(&r);
        d_blk[i] = gt_up(blk[i], 4 * (size_t)T * d);
    }
    float *w = gt_xmalloc(4 * (size_t)Q * d), *part = gt_xmalloc(4 * (size_t)T * d);
    for (size_t j = 0; j < (size_t)Q * d; j++) w[j] = 0.05f * st_rng_normal(&r);
    for (size_t j = 0; j < (size_t)T * d; j++) part[j] = 2.f * st_rng_normal(&r);
    size_t ns = (size_t)T * Q * 2, na = (size_t)T * Q * d, no = (size_t)T * d;
    float *st = gt_xmalloc(4 * ns), *acc = gt_xmalloc(4 * na), *out = gt_xmalloc(4 * no);
    float *g_st = gt_xmalloc(4 * ns), *g_acc = gt_xmalloc(4 * na), *g_out = gt_xmalloc(4 * no),
          *g_outb = gt_xmalloc(4 * no);
    uint16_t *ob = gt_xmalloc(2 * no);
    st_attnres_phase1(st, acc, (const float *const *)blk, m, w, Q, T, d, 1e-5f);
    float *d_w = gt_up(w, 4 * (size_t)Q * d), *d_part = gt_up(part, 4 * no), *d_st = gt_dev(4 * ns),
          *d_acc = gt_dev(4 * na), *d_out = gt_dev(4 * no);
    uint16_t *d_ob = gt_dev(2 * no);
    GT_OK(st_cuda_attnres_phase1(&gt_stream, d_st, d_acc, (const float *const *)d_blk, m, d_w, Q, T, d, 1e-5f));
    gt_down(g_st, d_st, 4 * ns);
    gt_down(g_acc, d_acc, 4 * na);
    char what[128];
    if (m == 0) {
        int bad = 0;
        for (size_t i = 0; i < ns; i += 2) bad += !(g_st[i] == -INFINITY && g_st[i + 1] == 0.f);
        for (size_t i = 0; i < na; i++) bad += g_acc[i] != 0.f;
        CHECK(bad == 0, "attnres_phase1 m=0 T=%d d=%d Q=%d: %d values not (−inf, 0) / 0", T, d, Q, bad);
    } else {
        snprintf(what, sizeof what, "attnres_phase1 T=%d d=%d m=%d Q=%d: stats", T, d, m, Q);
        st_t_close(what, g_st, st, ns, 1e-4, 1e-5);
        snprintf(what, sizeof what, "attnres_phase1 T=%d d=%d m=%d Q=%d: acc", T, d, m, Q);
        st_t_close(what, g_acc, acc, na, 1e-4, 1e-5);
    }
    for (int q = 0; q < Q; q += (Q > 1 ? Q - 1 : 1)) {
        st_attnres_phase2(out, part, st, acc, w + (size_t)q * d, q, Q, T, d, 1e-5f);
        gt_poison(d_out, 4 * no), gt_poison(d_ob, 2 * no);
        GT_OK(st_cuda_attnres_phase2(&gt_stream, d_out, d_ob, d_part, d_st, d_acc, d_w + (size_t)q * d, q, Q, T, d,
                                     1e-5f));
        gt_down(g_out, d_out, 4 * no);
        gt_down(ob, d_ob, 2 * no);
        gt_from_bf(g_outb, ob, no);
        snprintf(what, sizeof what, "attnres_phase2 T=%d d=%d m=%d Q=%d q=%d: out", T, d, m, Q, q);
        st_t_close(what, g_out, out, no, 1e-4, 1e-5);
        snprintf(what, sizeof what, "attnres_phase2 T=%d d=%d m=%d Q=%d q=%d: out bf16", T, d, m, Q, q);
        st_t_close(what, g_outb, out, no, 8e-3, 1e-3);
        if (Q == 1) break;
    }
    for (int i = 0; i < m; i++) free(blk[i]), st_gpu_free(d_blk[i]);
    st_gpu_free(d_w), st_gpu_free(d_part), st_gpu_free(d_st), st_gpu_free(d_acc), st_gpu_free(d_out),
        st_gpu_free(d_ob);
    free(blk), free(d_blk), free(w), free(part), free(st), free(acc), free(out), free(g_st), free(g_acc), free(g_out),
        free(g_outb), free(ob);
}

static void mla_prefill_case(int T, int n, int H, int dqk, int dv, uint64_t seed) {
    st_rng_t r = {seed};
    size_t nq = (size_t)T * H * dqk, nk = (size_t)n * H * dqk, nv = (size_t)n * H * dv, no = (size_t)T * H * dv;
    float *q = gt_xmalloc(4 * nq), *k = gt_xmalloc(4 * nk), *v = gt_xmalloc(4 * nv), *o = gt_xmalloc(4 * no),
          *got = gt_xmalloc(4 * no), *ws = gt_xmalloc(4 * (size_t)n);
    uint16_t *qb = gt_xmalloc(2 * nq), *kb = gt_xmalloc(2 * nk), *vb = gt_xmalloc(2 * nv), *ob = gt_xmalloc(2 * no);
    gt_randn_bf(q, qb, nq, 1.f, &r);
    gt_randn_bf(k, kb, nk, 1.f, &r);
    gt_randn_bf(v, vb, nv, 1.f, &r);
    float scale = 1.f / sqrtf((float)dqk);
    st_mla_attn_direct(o, q, k, v, T, n, H, dqk, dv, scale, ws);
    uint16_t *d_q = gt_up(qb, 2 * nq), *d_k = gt_up(kb, 2 * nk), *d_v = gt_up(vb, 2 * nv), *d_o = gt_dev(2 * no);
    GT_OK(st_cuda_mla_prefill(&gt_stream, d_o, d_q, d_k, d_v, T, n, H, dqk, dv, scale));
    gt_down(ob, d_o, 2 * no);
    gt_from_bf(got, ob, no);
    char what[96];
    snprintf(what, sizeof what, "mla_prefill T=%d n=%d H=%d dqk=%d dv=%d", T, n, H, dqk, dv);
    st_t_close(what, got, o, no, 2e-2, 2e-2);
    st_gpu_free(d_q), st_gpu_free(d_k), st_gpu_free(d_v), st_gpu_free(d_o);
    free(q), free(k), free(v), free(o), free(got), free(ws), free(qb), free(kb), free(vb), free(ob);
}

int main(void) {
    gt_init_or_skip("test_gpu_attnres_mla_prefill");
    attnres_case(1, 64, 0, 1, 1);
    attnres_case(7, 1000, 1, 5, 2);
    attnres_case(33, 7168, 3, 9, 3);
    attnres_case(5, 1024, 12, 17, 4);
    attnres_case(3, 130, 0, 4, 5);
    attnres_case(64, 1024, 24, 8, 6);
    attnres_case(600, 1024, 5, 8, 7);  /* many tokens: cuBLAS score GEMMs + per-token kernels */
    attnres_case(100, 7168, 3, 9, 8);  /* cluster phase 1, per-token phase 2 */
    attnres_case(700, 4096, 2, 3, 9);
    attnres_case(300, 512, 0, 6, 10);

    mla_prefill_case(1, 1, 1, 192, 128, 1);
    mla_prefill_case(5, 70, 3, 192, 128, 2);
    mla_prefill_case(130, 130, 2, 192, 128, 3);
    mla_prefill_case(64, 300, 2, 192, 128, 4);
    mla_prefill_case(200, 1000, 2, 192, 128, 5);
    mla_prefill_case(17, 40, 4, 48, 32, 6);
    mla_prefill_case(100, 100, 3, 64, 64, 7);
    mla_prefill_case(65, 129, 2, 128, 128, 8);
    return st_test_done();
}
