/* Block AttnRes two-phase (fp32) and MLA causal prefill (bf16, flash form) on the GPU vs the CPU:
 * phase 1 with the block push (stats/acc vs st_attnres_phase1 to 1e-4 relative, m = 0 gives (−inf, 0)
 * exactly, the pushed block bit-exact, the other list slots untouched; with the block-start norm too:
 * stats/acc bit-identical, the norm vs st_attnres_phase1 + st_attnres_phase2 + st_rmsnorm), its own
 * kernel and the general form it falls back to (unaligned block stride, m = 0, large m·Q); phase 2 +
 * RMSNorm vs st_attnres_phase2 + st_rmsnorm (bf16 output to 8e-3, hi + lo to 1e-4); st_mla_attn_direct
 * on bf16-rounded inputs (2e-2 relative L2). */
#include <math.h>
#include <string.h>

#include "gpu_test.h"
#include "strata/kernels.h"

/* st_cuda_attnres_phase1_push: m − 1 blocks in a strided list (bstride floats apart), the newest
 * one (when push) read from its own buffer and written to list slot m − 1; qpb queries per thread
 * block (0: the launcher's choice). */
static void attnres_push_case(int T, int d, int m, int Q, size_t pad, bool push, int qpb, uint64_t seed) {
    st_rng_t r = {seed};
    size_t bstride = (size_t)T * d + pad, nl = (size_t)(m > 0 ? m : 1) * bstride, no = (size_t)T * d;
    float *list = gt_xmalloc(4 * nl), *nw = gt_xmalloc(4 * no), *w = gt_xmalloc(4 * (size_t)Q * d);
    for (size_t j = 0; j < nl; j++) list[j] = 1.5f * st_rng_normal(&r);
    for (size_t j = 0; j < no; j++) nw[j] = 2.f * st_rng_normal(&r);
    for (size_t j = 0; j < (size_t)Q * d; j++) w[j] = 0.05f * st_rng_normal(&r);
    const float **blk = gt_xmalloc(sizeof(float *) * (m + 1));
    for (int i = 0; i < m; i++) blk[i] = (push && i == m - 1) ? nw : list + (size_t)i * bstride;
    size_t ns = (size_t)T * Q * 2, na = (size_t)T * Q * d;
    float *st = gt_xmalloc(4 * ns), *acc = gt_xmalloc(4 * na), *g_st = gt_xmalloc(4 * ns), *g_acc = gt_xmalloc(4 * na),
          *g_list = gt_xmalloc(4 * nl);
    st_attnres_phase1(st, acc, blk, m, w, Q, T, d, 1e-5f);
    float *d_list = gt_up(list, 4 * nl), *d_nw = gt_up(nw, 4 * no), *d_w = gt_up(w, 4 * (size_t)Q * d),
          *d_st = gt_dev(4 * ns), *d_acc = gt_dev(4 * na);
    GT_OK(st_cuda_attnres_phase1_push(&gt_stream, d_st, d_acc, d_list, bstride, push ? d_nw : NULL, m, d_w, Q, T, d,
                                      1e-5f, qpb, NULL));
    gt_down(g_st, d_st, 4 * ns);
    gt_down(g_acc, d_acc, 4 * na);
    gt_down(g_list, d_list, 4 * nl);
    char what[160];
    snprintf(what, sizeof what, "attnres_phase1_push T=%d d=%d m=%d Q=%d pad=%zu push=%d qpb=%d", T, d, m, Q, pad, push,
             qpb);
    if (m == 0) {
        int bad = 0;
        for (size_t i = 0; i < ns; i += 2) bad += !(g_st[i] == -INFINITY && g_st[i + 1] == 0.f);
        for (size_t i = 0; i < na; i++) bad += g_acc[i] != 0.f;
        CHECK(bad == 0, "%s: %d values not (−inf, 0) / 0", what, bad);
    } else {
        char w2[200];
        snprintf(w2, sizeof w2, "%s: stats", what);
        st_t_close(w2, g_st, st, ns, 1e-4, 1e-5);
        snprintf(w2, sizeof w2, "%s: acc", what);
        st_t_close(w2, g_acc, acc, na, 1e-4, 1e-5);
    }
    /* the list: slot m − 1 rows = newest (push), everything else as uploaded */
    size_t bad = 0;
    for (size_t j = 0; j < nl; j++) {
        size_t slot = j / bstride, off = j % bstride;
        float want = (push && (int)slot == m - 1 && off < no) ? nw[off] : list[j];
        bad += memcmp(&g_list[j], &want, 4) != 0;
    }
    CHECK(bad == 0, "%s: %zu block-list values not as expected", what, bad);
    if (m > 0) { /* again with the block-start norm in the same launch */
        float *wx = gt_xmalloc(4 * (size_t)d), *nrm = gt_xmalloc(4 * (size_t)d), *h = gt_xmalloc(4 * no),
              *want = gt_xmalloc(4 * no), *got = gt_xmalloc(4 * no), *got2 = gt_xmalloc(4 * no),
              *st1 = gt_xmalloc(8 * (size_t)T), *acc1 = gt_xmalloc(4 * no), *g_st2 = gt_xmalloc(4 * ns),
              *g_acc2 = gt_xmalloc(4 * na);
        for (int j = 0; j < d; j++) wx[j] = 0.05f * st_rng_normal(&r), nrm[j] = 1.f + 0.2f * st_rng_normal(&r);
        if (m > 1) {
            st_attnres_phase1(st1, acc1, blk, m - 1, wx, 1, T, d, 1e-5f);
            st_attnres_phase2(h, blk[m - 1], st1, acc1, wx, 0, 1, T, d, 1e-5f);
        } else {
            memcpy(h, blk[0], 4 * no);
        }
        for (int t = 0; t < T; t++) st_rmsnorm(want + (size_t)t * d, h + (size_t)t * d, nrm, 1, d, 1e-6f);
        float *d_wx = gt_up(wx, 4 * (size_t)d), *d_nrm = gt_up(nrm, 4 * (size_t)d);
        uint16_t *d_xn = gt_dev(2 * no), *d_lo = gt_dev(2 * no), *xn = gt_xmalloc(2 * no), *lo = gt_xmalloc(2 * no);
        gt_poison(d_xn, 2 * no), gt_poison(d_lo, 2 * no), gt_poison(d_st, 4 * ns), gt_poison(d_acc, 4 * na);
        st_attnres_xnorm_t x = {d_wx, d_nrm, 1e-6f, d_xn, d_lo};
        GT_OK(st_cuda_attnres_phase1_push(&gt_stream, d_st, d_acc, d_list, bstride, push ? d_nw : NULL, m, d_w, Q, T,
                                          d, 1e-5f, qpb, &x));
        gt_down(g_st2, d_st, 4 * ns);
        gt_down(g_acc2, d_acc, 4 * na);
        gt_down(xn, d_xn, 2 * no);
        gt_down(lo, d_lo, 2 * no);
        gt_from_bf(got, xn, no);
        gt_from_bf(got2, lo, no);
        for (size_t j = 0; j < no; j++) got2[j] += got[j];
        CHECK(memcmp(g_st2, g_st, 4 * ns) == 0 && memcmp(g_acc2, g_acc, 4 * na) == 0,
              "%s: stats/acc differ with the block-start norm", what);
        char w2[200];
        snprintf(w2, sizeof w2, "%s: block-start norm, bf16", what);
        st_t_close(w2, got, want, no, 8e-3, 1e-3);
        snprintf(w2, sizeof w2, "%s: block-start norm, hi+lo", what);
        st_t_close(w2, got2, want, no, 1e-4, 1e-4);
        st_gpu_free(d_wx), st_gpu_free(d_nrm), st_gpu_free(d_xn), st_gpu_free(d_lo);
        free(wx), free(nrm), free(h), free(want), free(got), free(got2), free(st1), free(acc1), free(g_st2),
            free(g_acc2), free(xn), free(lo);
    }
    st_gpu_free(d_list), st_gpu_free(d_nw), st_gpu_free(d_w), st_gpu_free(d_st), st_gpu_free(d_acc);
    free(list), free(nw), free(w), free(blk), free(st), free(acc), free(g_st), free(g_acc), free(g_list);
}

/* st_cuda_attnres_phase2_rmsnorm vs st_attnres_phase2 (or the partial itself) + st_rmsnorm, over
 * n_rows rows picked by a row list (reversed, every other row) or all T rows. */
static void attnres_p2norm_case(int T, int d, int m, int Q, bool ar, bool use_rows, uint64_t seed) {
    st_rng_t r = {seed};
    size_t no = (size_t)T * d, ns = (size_t)T * Q * 2, na = (size_t)T * Q * d;
    float **blk = gt_xmalloc(sizeof(float *) * (m + 1));
    for (int i = 0; i < m; i++) {
        blk[i] = gt_xmalloc(4 * no);
        for (size_t j = 0; j < no; j++) blk[i][j] = (1.f + i) * st_rng_normal(&r);
    }
    float *w = gt_xmalloc(4 * (size_t)Q * d), *part = gt_xmalloc(4 * no), *nw = gt_xmalloc(4 * (size_t)d);
    for (size_t j = 0; j < (size_t)Q * d; j++) w[j] = 0.05f * st_rng_normal(&r);
    for (size_t j = 0; j < no; j++) part[j] = 2.f * st_rng_normal(&r);
    for (int j = 0; j < d; j++) nw[j] = 1.f + 0.2f * st_rng_normal(&r);
    float *st = gt_xmalloc(4 * ns), *acc = gt_xmalloc(4 * na), *h = gt_xmalloc(4 * no), *y = gt_xmalloc(4 * no);
    st_attnres_phase1(st, acc, (const float *const *)blk, m, w, Q, T, d, 1e-5f);
    int q = Q - 1, nr = use_rows ? (T + 1) / 2 : T, *rows = gt_xmalloc(sizeof(int) * (size_t)(nr + 1));
    for (int i = 0; i < nr; i++) rows[i] = use_rows ? T - 1 - 2 * i : i;
    if (ar) st_attnres_phase2(h, part, st, acc, w + (size_t)q * d, q, Q, T, d, 1e-5f);
    else memcpy(h, part, 4 * no);
    float *want = gt_xmalloc(4 * (size_t)nr * d), *got = gt_xmalloc(4 * (size_t)nr * d),
          *got2 = gt_xmalloc(4 * (size_t)nr * d);
    for (int i = 0; i < nr; i++) st_rmsnorm(want + (size_t)i * d, h + (size_t)rows[i] * d, nw, 1, d, 1e-5f);
    float *d_part = gt_up(part, 4 * no), *d_st = gt_up(st, 4 * ns), *d_acc = gt_up(acc, 4 * na),
          *d_w = gt_up(w, 4 * (size_t)Q * d), *d_nw = gt_up(nw, 4 * (size_t)d);
    int *d_rows = use_rows ? gt_up(rows, sizeof(int) * (size_t)nr) : NULL;
    uint16_t *d_xn = gt_dev(2 * (size_t)nr * d), *d_lo = gt_dev(2 * (size_t)nr * d);
    uint16_t *xn = gt_xmalloc(2 * (size_t)nr * d), *lo = gt_xmalloc(2 * (size_t)nr * d);
    GT_OK(st_cuda_attnres_phase2_rmsnorm(&gt_stream, d_xn, d_lo, d_part, ar ? d_st : NULL, d_acc, d_w + (size_t)q * d,
                                         q, Q, d_nw, d_rows, nr, d, 1e-5f, 1e-5f));
    gt_down(xn, d_xn, 2 * (size_t)nr * d);
    gt_down(lo, d_lo, 2 * (size_t)nr * d);
    gt_from_bf(got, xn, (size_t)nr * d);
    gt_from_bf(got2, lo, (size_t)nr * d);
    for (size_t j = 0; j < (size_t)nr * d; j++) got2[j] += got[j];
    char what[160];
    snprintf(what, sizeof what, "attnres_phase2_rmsnorm T=%d d=%d m=%d Q=%d ar=%d rows=%d: bf16", T, d, m, Q, ar,
             use_rows);
    st_t_close(what, got, want, (size_t)nr * d, 8e-3, 1e-3);
    snprintf(what, sizeof what, "attnres_phase2_rmsnorm T=%d d=%d m=%d Q=%d ar=%d rows=%d: hi+lo", T, d, m, Q, ar,
             use_rows);
    st_t_close(what, got2, want, (size_t)nr * d, 1e-4, 1e-4);
    /* without lo: the same xn */
    gt_poison(d_xn, 2 * (size_t)nr * d);
    GT_OK(st_cuda_attnres_phase2_rmsnorm(&gt_stream, d_xn, NULL, d_part, ar ? d_st : NULL, d_acc, d_w + (size_t)q * d,
                                         q, Q, d_nw, d_rows, nr, d, 1e-5f, 1e-5f));
    uint16_t *xn2 = gt_xmalloc(2 * (size_t)nr * d);
    gt_down(xn2, d_xn, 2 * (size_t)nr * d);
    CHECK(memcmp(xn, xn2, 2 * (size_t)nr * d) == 0, "%s: xn differs without lo", what);
    for (int i = 0; i < m; i++) free(blk[i]);
    st_gpu_free(d_part), st_gpu_free(d_st), st_gpu_free(d_acc), st_gpu_free(d_w), st_gpu_free(d_nw);
    if (d_rows) st_gpu_free(d_rows);
    st_gpu_free(d_xn), st_gpu_free(d_lo);
    free(blk), free(w), free(part), free(nw), free(st), free(acc), free(h), free(y), free(rows), free(want), free(got),
        free(got2), free(xn), free(lo), free(xn2);
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
    /* the general phase 1 (the push's fallback): a block stride not a multiple of 4 floats (pad 1), no
     * blocks (m = 0), or more shared memory than the push kernel takes (m·Q large) */
    attnres_push_case(1, 64, 0, 1, 1, false, 0, 1);
    attnres_push_case(7, 1000, 1, 5, 1, true, 0, 2);
    attnres_push_case(33, 7168, 3, 9, 1, true, 0, 3); /* cluster phase 1 */
    attnres_push_case(5, 1024, 12, 17, 1, true, 0, 4);
    attnres_push_case(3, 130, 0, 4, 1, false, 0, 5);
    attnres_push_case(64, 1024, 24, 8, 1, true, 0, 6);
    attnres_push_case(600, 1024, 5, 8, 1, true, 0, 7); /* many tokens: cuBLAS score GEMMs + per-token kernel */
    attnres_push_case(100, 7168, 3, 9, 1, true, 0, 8); /* cluster phase 1 at d ≥ 4096 */
    attnres_push_case(700, 4096, 2, 3, 1, false, 0, 9);
    attnres_push_case(300, 512, 0, 6, 0, false, 0, 10);
    attnres_push_case(40, 1024, 24, 64, 0, true, 0, 28); /* aligned, m·Q too large for the push kernel */
    /* the engine's forms: decode sizes (T 1, 32, 256) and prefill-like T at the small preset's d
     * 1024 / m ≤ 3 / Q 8 and K3's d 7168 / m 12; Q > 8 and m > 4 (query and block chunks), 1, 2, 4,
     * 8 and all queries per block, d not a multiple of 4 and a stride not a multiple of 4 (general
     * path), m = 0, no push */
    attnres_push_case(1, 1024, 1, 8, 0, true, 1, 11);
    attnres_push_case(1, 1024, 3, 8, 64, true, 1, 12);
    attnres_push_case(32, 1024, 2, 8, 0, true, 1, 13);
    attnres_push_case(256, 1024, 3, 8, 1024, true, 4, 14);
    attnres_push_case(1500, 1024, 3, 8, 0, true, 8, 15);
    attnres_push_case(40, 7168, 12, 8, 4, true, 1, 16);
    attnres_push_case(9, 64, 6, 17, 8, true, 1, 17);
    attnres_push_case(5, 1000, 9, 3, 0, true, 1, 18);
    attnres_push_case(7, 130, 3, 4, 2, true, 0, 19);
    attnres_push_case(6, 256, 2, 5, 3, true, 0, 20);
    attnres_push_case(4, 512, 0, 4, 0, false, 0, 21);
    attnres_push_case(12, 512, 3, 8, 16, false, 1, 22);
    attnres_push_case(130, 512, 5, 8, 0, true, 2, 23);
    attnres_push_case(256, 256, 2, 9, 0, true, 8, 24); /* a last group of 1 */
    attnres_push_case(100, 1024, 3, 8, 0, true, 2, 25);
    attnres_push_case(1, 1024, 3, 8, 0, true, 0, 26);  /* the launcher's choice: 1 per block */
    attnres_push_case(64, 1024, 3, 8, 0, true, 0, 27); /* the launcher's choice: all 8 */
    attnres_p2norm_case(1, 1024, 3, 8, true, false, 31);
    attnres_p2norm_case(33, 1024, 2, 8, true, true, 32);
    attnres_p2norm_case(300, 1024, 1, 8, false, false, 33);
    attnres_p2norm_case(17, 7168, 4, 8, true, false, 34);
    attnres_p2norm_case(9, 2048, 2, 5, true, true, 35);
    attnres_p2norm_case(5, 100, 2, 3, true, false, 36);
    attnres_p2norm_case(5, 130, 2, 3, true, true, 37);
    attnres_p2norm_case(3, 9000, 2, 2, true, false, 38);
    attnres_p2norm_case(600, 1024, 2, 8, true, true, 40); /* many rows: no prefetch */
    attnres_p2norm_case(200, 7168, 3, 8, true, false, 41);
    attnres_p2norm_case(4, 9000, 0, 2, false, true, 39);

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
