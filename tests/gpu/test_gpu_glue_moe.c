/* The engine's routing tail, dispatch and combine vs their C twins: st_cuda_route_finish
 * (st_route_finish; counts 0 .. kc, with and without renormalisation), st_cuda_moe_group (st_moe_group:
 * offsets exactly, row_of as sets — each slot's row inside its expert's range, every row used once, −1 past
 * cnt — since rows within an expert are placed by atomics), st_cuda_moe_gather (st_moe_gather through the
 * GPU's own row_of, exact) and st_cuda_moe_combine in its three modes (st_moe_combine: partial += u
 * bit-exact, as the summation tree over expert ids and rounded mul/add promise; u as bf16; RMSNorm'd u
 * with the split output), reading grouped rows (yg), slot-order rows (yf) or u combined elsewhere
 * (p NULL: the worker's rows from its expert servers). Empty experts, tokens with no expert, one token,
 * the largest batch (8192 tokens × 8 slots). st_cuda_moe_expand (st_moe_expand, bit-exact: an expert
 * server's distinct-rows dispatch expanded to its grouped order), across the 65535-row launch split.
 * st_cuda_moe_tree_reduce (st_moe_tree_reduce, bit-exact: an expert server's output rows), with ±0,
 * empty rows, many leaves and ids spread over 2^20, across the 65535-row launch split;
 * st_cuda_moe_leaf_table (st_moe_leaf_table, exactly: its input). */
#include <math.h>
#include <string.h>

#include "glue_test.h"
#include "strata/kernels.h"

/* ids [T, kc]: cnt[t] distinct experts ascending (experts ≥ E/2 + 1 never chosen: empty experts) */
static void make_routing(int *ids, int *cnt, int T, int kc, int E, st_rng_t *r) {
    int lim = E / 2 + 1 < kc ? E : E / 2 + 1;
    for (int t = 0; t < T; t++) {
        cnt[t] = t == 0 ? kc : (int)(st_rng_next(r) % (uint64_t)(kc + 1));
        int n = 0;
        for (int e = 0; e < lim && n < cnt[t]; e++) /* pick cnt[t] of lim, ascending */
            if (st_rng_next(r) % (uint64_t)(lim - e) < (uint64_t)(cnt[t] - n)) ids[(size_t)t * kc + n++] = e;
        for (int i = n; i < kc; i++) ids[(size_t)t * kc + i] = -1;
    }
}

static void route_finish_case(int T, int n, int kc, bool renorm, uint64_t seed) {
    st_rng_t r = {seed};
    int *ids = gt_xmalloc(sizeof(int) * T * kc + 4), *cnt = gt_xmalloc(sizeof(int) * T + 4);
    make_routing(ids, cnt, T, kc, n, &r);
    float *s = gl_randn((size_t)T * n + 1, 2.f, &r), *w = gt_xmalloc(4 * ((size_t)T * kc + 1));
    st_router_sigmoid(s, T, n);
    st_route_finish(ids, w, cnt, s, T, n, kc, renorm, 2.5f);
    int *did = gt_up(ids, sizeof(int) * T * kc + 4), *dcnt = gt_up(cnt, sizeof(int) * T + 4);
    float *ds = gt_up(s, 4 * ((size_t)T * n + 1)), *dw = gt_dev(4 * ((size_t)T * kc + 1));
    GT_OK(st_cuda_route_finish(&gt_stream, did, dw, dcnt, ds, T, n, kc, renorm, 2.5f));
    char what[96];
    snprintf(what, sizeof what, "route_finish T=%d n=%d kc=%d renorm=%d", T, n, kc, renorm);
    if (T) {
        float *got = gl_down_f32(dw, (size_t)T * kc);
        st_t_close(what, got, w, (size_t)T * kc, 1e-6, 1e-7);
        free(got);
    }
    st_gpu_free(did), st_gpu_free(dcnt), st_gpu_free(ds), st_gpu_free(dw);
    free(ids), free(cnt), free(s), free(w);
}

static void dispatch_case(int T, int kc, int E, int l, uint64_t seed) {
    st_rng_t r = {seed};
    size_t S = (size_t)T * kc;
    int *ids = gt_xmalloc(sizeof(int) * S + 4), *cnt = gt_xmalloc(sizeof(int) * T + 4);
    make_routing(ids, cnt, T, kc, E, &r);
    int *off = gt_xmalloc(sizeof(int) * (E + 1)), *row = gt_xmalloc(sizeof(int) * S + 4);
    st_moe_group(off, row, ids, cnt, T, kc, E);
    int *did = gt_up(ids, sizeof(int) * S + 4), *dcnt = gt_up(cnt, sizeof(int) * T + 4),
        *doff = gt_dev(sizeof(int) * (E + 1)), *drow = gt_dev(sizeof(int) * S + 4);
    GT_OK(st_cuda_moe_group(&gt_stream, doff, drow, did, dcnt, T, kc, E));
    int *goff = gt_xmalloc(sizeof(int) * (E + 1)), *grow = gt_xmalloc(sizeof(int) * S + 4);
    gt_down(goff, doff, sizeof(int) * (E + 1));
    gt_down(grow, drow, sizeof(int) * S);
    /* T = 0: nothing is launched, nothing written (the engine never groups an empty batch) */
    if (T) CHECK(memcmp(goff, off, sizeof(int) * (E + 1)) == 0, "moe_group T=%d kc=%d E=%d: offsets differ", T, kc, E);
    int N = off[E], bad = 0;
    char *used = gt_xmalloc((size_t)N + 1);
    memset(used, 0, (size_t)N + 1);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < kc; i++) {
            int g = grow[(size_t)t * kc + i];
            if (i >= cnt[t]) { bad += g != -1; continue; }
            int e = ids[(size_t)t * kc + i];
            if (g < off[e] || g >= off[e + 1] || used[g]) bad++;
            else used[g] = 1;
        }
    CHECK(bad == 0, "moe_group T=%d kc=%d E=%d: %d slots with a row outside their expert, reused, or not −1", T, kc, E, bad);
    /* gather through the GPU's rows: exact */
    float *z = gt_xmalloc(4 * ((size_t)T * l + 1)), *xg = gt_xmalloc(4 * ((size_t)N * l + 1));
    uint16_t *zb = gt_xmalloc(2 * (size_t)T * l + 2);
    gt_randn_bf(z, zb, (size_t)T * l, 1.f, &r);
    st_moe_gather(xg, z, grow, cnt, T, kc, l);
    uint16_t *dz = gt_up(zb, 2 * (size_t)T * l + 2), *dxg = gt_dev(2 * (size_t)N * l + 2);
    GT_OK(st_cuda_moe_gather(&gt_stream, dxg, dz, drow, dcnt, T, kc, l));
    if (N) {
        float *gxg = gl_down_bf(dxg, (size_t)N * l);
        CHECK(memcmp(gxg, xg, 4 * (size_t)N * l) == 0, "moe_gather T=%d kc=%d l=%d: not exact", T, kc, l);
        free(gxg);
    }
    if (T) /* (T = 0 returns before the width is checked) */
        CHECK(st_cuda_moe_gather(&gt_stream, dxg, dz, drow, dcnt, T, kc, l + 1) == ST_ERR_INVALID_ARG,
              "moe_gather: odd width accepted");
    /* combine: yg grouped rows [N, l] and yf slot-order rows [T·kc, l] hold the same values */
    float *yg = gl_randn((size_t)N * l + 1, 1.f, &r), *yf = gt_xmalloc(4 * (S * l + 1)),
          *p = gl_randn(S + 1, 0.5f, &r), *nw = gl_randn(l, 0.2f, &r), *part0 = gl_randn((size_t)T * l + 1, 1.f, &r);
    for (int i = 0; i < l; i++) nw[i] += 1.f;
    for (size_t i = 0; i < S * l; i++) yf[i] = NAN; /* slots past cnt are never read */
    for (int t = 0; t < T; t++)
        for (int i = 0; i < cnt[t]; i++)
            memcpy(yf + ((size_t)t * kc + i) * l, yg + (size_t)grow[(size_t)t * kc + i] * l, 4 * (size_t)l);
    float *dyg = gt_up(yg, 4 * ((size_t)N * l + 1)), *dyf = gt_up(yf, 4 * (S * l + 1)), *dp = gt_up(p, 4 * (S + 1)),
          *dnw = gt_up(nw, 4 * (size_t)l), *dpart = gt_up(part0, 4 * ((size_t)T * l + 1));
    uint16_t *dun = gt_dev(2 * (size_t)T * l + 2), *dulo = gt_dev(2 * (size_t)T * l + 2);
    float *u = gt_xmalloc(4 * ((size_t)T * l + 1)), *part = gt_xmalloc(4 * ((size_t)T * l + 1));
    char what[128];
    for (int src = 0; src < 2; src++) {
        const float *dYg = src ? NULL : dyg, *dYf = src ? dyf : NULL;
        /* partial += u: bit-exact */
        memcpy(part, part0, 4 * (size_t)T * l);
        st_moe_combine(NULL, part, src ? NULL : yg, src ? yf : NULL, NULL, grow, p, ids, cnt, NULL, T, kc, l, 1e-5f);
        GT_OK(st_gpu_memcpy_h2d(dpart, part0, 4 * (size_t)T * l));
        GT_OK(st_cuda_moe_combine(&gt_stream, NULL, NULL, dpart, dYg, dYf, NULL, drow, dp, did, dcnt, NULL, T, kc, l, 1e-5f));
        if (T) {
            float *gp = gl_down_f32(dpart, (size_t)T * l);
            CHECK(memcmp(gp, part, 4 * (size_t)T * l) == 0, "moe_combine partial += u T=%d kc=%d l=%d %s: not bit-exact", T,
                  kc, l, src ? "yf" : "yg");
            free(gp);
        }
        /* u as bf16, then RMSNorm'd u split */
        for (int norm = 0; norm < 2; norm++) {
            st_moe_combine(u, NULL, src ? NULL : yg, src ? yf : NULL, NULL, grow, p, ids, cnt, norm ? nw : NULL, T, kc, l, 1e-5f);
            GT_OK(st_cuda_moe_combine(&gt_stream, dun, norm ? dulo : NULL, NULL, dYg, dYf, NULL, drow, dp, did, dcnt,
                                      norm ? dnw : NULL, T, kc, l, 1e-5f));
            snprintf(what, sizeof what, "moe_combine T=%d kc=%d l=%d %s%s", T, kc, l, src ? "yf" : "yg",
                     norm ? " rmsnorm" : "");
            if (T) gl_check_split(what, dun, norm ? dulo : NULL, u, (size_t)T * l);
        }
    }
    /* u combined elsewhere (p NULL): yf [T, l] is u; partial += u exactly, and the normed split */
    if (T) {
        float *uin = gl_randn((size_t)T * l, 1.f, &r), *duin = gt_up(uin, 4 * (size_t)T * l);
        memcpy(part, part0, 4 * (size_t)T * l);
        st_moe_combine(NULL, part, NULL, uin, NULL, NULL, NULL, ids, cnt, NULL, T, kc, l, 1e-5f);
        GT_OK(st_gpu_memcpy_h2d(dpart, part0, 4 * (size_t)T * l));
        GT_OK(st_cuda_moe_combine(&gt_stream, NULL, NULL, dpart, NULL, duin, NULL, NULL, NULL, did, dcnt, NULL, T, kc, l, 1e-5f));
        float *gp = gl_down_f32(dpart, (size_t)T * l);
        CHECK(memcmp(gp, part, 4 * (size_t)T * l) == 0, "moe_combine u given T=%d l=%d: partial += u not bit-exact", T, l);
        st_moe_combine(u, NULL, NULL, uin, NULL, NULL, NULL, ids, cnt, nw, T, kc, l, 1e-5f);
        GT_OK(st_cuda_moe_combine(&gt_stream, dun, dulo, NULL, NULL, duin, NULL, NULL, NULL, did, dcnt, dnw, T, kc, l, 1e-5f));
        snprintf(what, sizeof what, "moe_combine T=%d l=%d u given, rmsnorm", T, l);
        gl_check_split(what, dun, dulo, u, (size_t)T * l);
        st_gpu_free(duin);
        free(uin), free(gp);
    }
    /* node values (an attention worker's finish): the rows and their pointer table in pinned host
     * memory, some slots starting no node; partial += u bit-exact against both C forms */
    if (T) {
        float *nodes = NULL, *fin = gt_xmalloc(4 * (size_t)T * l), *scr = gt_xmalloc(4 * S * l + 4);
        const float **at = NULL;
        uint32_t tid[64];
        GT_OK(st_gpu_host_alloc((void **)&nodes, 4 * S * l + 4));
        GT_OK(st_gpu_host_alloc((void **)&at, sizeof *at * S + 8));
        for (size_t i = 0; i < S * l; i++) nodes[i] = (float)st_rng_normal(&r);
        for (size_t k = 0; k < S; k++) at[k] = st_rng_next(&r) % 3 ? nodes + (st_rng_next(&r) % S) * l : NULL;
        memcpy(part, part0, 4 * (size_t)T * l);
        st_moe_combine(NULL, part, NULL, NULL, at, NULL, NULL, ids, cnt, NULL, T, kc, l, 1e-5f);
        st_moe_finish_nodes(fin, at, ids, cnt, T, kc, l, scr, tid);
        int rows_ok = 1;
        for (size_t i = 0; i < (size_t)T * l; i++) rows_ok &= part[i] == part0[i] + fin[i];
        CHECK(kc <= 64 && rows_ok, "moe_combine node values T=%d kc=%d l=%d: the stack form != the rows form", T, kc, l);
        GT_OK(st_gpu_memcpy_h2d(dpart, part0, 4 * (size_t)T * l));
        GT_OK(st_cuda_moe_combine(&gt_stream, NULL, NULL, dpart, NULL, NULL, at, NULL, NULL, did, dcnt, NULL, T, kc, l, 1e-5f));
        float *gp = gl_down_f32(dpart, (size_t)T * l);
        CHECK(memcmp(gp, part, 4 * (size_t)T * l) == 0, "moe_combine node values from host memory T=%d kc=%d l=%d: not bit-exact",
              T, kc, l);
        st_gpu_host_free(nodes), st_gpu_host_free((void *)at);
        free(gp), free(fin), free(scr);
    }
    st_gpu_free(did), st_gpu_free(dcnt), st_gpu_free(doff), st_gpu_free(drow), st_gpu_free(dz), st_gpu_free(dxg),
        st_gpu_free(dyg), st_gpu_free(dyf), st_gpu_free(dp), st_gpu_free(dnw), st_gpu_free(dpart), st_gpu_free(dun),
        st_gpu_free(dulo);
    free(ids), free(cnt), free(off), free(row), free(goff), free(grow), free(used), free(z), free(xg), free(zb),
        free(yg), free(yf), free(p), free(nw), free(part0), free(u), free(part);
}

/* st_cuda_moe_expand vs st_moe_expand, bit-exact: n rows picked from n_in distinct rows (every 7th
 * source out of range: zeros), values that round up, to ±inf, subnormals and −0 among them */
static void expand_case(int n, int n_in, int w, uint64_t seed) {
    st_rng_t r = {seed};
    size_t nr = (size_t)n_in * w, nd = (size_t)n * w;
    float *rows = gl_randn(nr, 3.f, &r);
    static const float special[] = {0x1.01p0f, -0x1.fff8p127f, 3.0e38f, 1e-41f, -0.f, -0x1.0101p-3f};
    for (size_t i = 0; i < nr && i < 6; i++) rows[i] = special[i];
    uint32_t *src = gt_xmalloc(4 * ((size_t)n + 1));
    for (int i = 0; i < n; i++)
        src[i] = i == 0 ? (uint32_t)n_in - 1 : i % 7 == 3 ? (uint32_t)n_in + (uint32_t)i : (uint32_t)(st_rng_next(&r) % (uint64_t)n_in);
    uint16_t *ref = gt_xmalloc(2 * nd + 2), *rb = gt_xmalloc(2 * nr + 2), *refb = gt_xmalloc(2 * nd + 2);
    st_moe_expand(ref, rows, false, src, n, n_in, w);
    /* bf16 sources (ST_WIRE_FLAG_BF16_ROWS): the same rows rounded first give the same result */
    for (size_t i = 0; i < nr; i++) rb[i] = st_f32_to_bf16(rows[i]);
    st_moe_expand(refb, rb, true, src, n, n_in, w);
    CHECK(memcmp(refb, ref, 2 * nd) == 0, "st_moe_expand n=%d w=%d: bf16 sources differ from fp32 ones", n, w);
    float *drows = gt_up(rows, 4 * nr);
    uint16_t *drb = gt_up(rb, 2 * nr);
    uint32_t *dsrc = gt_up(src, 4 * ((size_t)n + 1));
    uint16_t *ddst = gt_dev(2 * nd + 2), *got = gt_xmalloc(2 * nd + 2);
    for (int bf = 0; bf < 2; bf++) {
        gt_poison(ddst, 2 * nd + 2);
        GT_OK(st_cuda_moe_expand(&gt_stream, ddst, bf ? (const void *)drb : drows, bf, dsrc, n, n_in, w));
        gt_down(got, ddst, 2 * nd);
        CHECK(memcmp(got, ref, 2 * nd) == 0, "moe_expand n=%d n_in=%d w=%d %s rows: not bit-exact", n, n_in, w,
              bf ? "bf16" : "fp32");
    }
    CHECK(st_cuda_moe_expand(&gt_stream, ddst, drows, false, dsrc, n ? n : 1, n_in, w + 2) == ST_ERR_INVALID_ARG,
          "moe_expand: width %d (not a multiple of 4) accepted", w + 2);
    st_gpu_free(drows), st_gpu_free(drb), st_gpu_free(dsrc), st_gpu_free(ddst);
    free(rows), free(src), free(ref), free(rb), free(refb), free(got);
}

/* st_cuda_moe_leaf_table vs st_moe_leaf_table, exactly (off, and each row's leaves: pair, id, weight
 * bits; the lowest row naming an expert twice): n_out rows of 0 .. kmax distinct experts of n_exp,
 * the pairs grouped by expert in a shuffled row order within each expert (the wire allows any);
 * dup: some rows name one of their experts twice */
static void leaf_table_case(int n_exp, int n_out, int kmax, bool dup, uint64_t seed) {
    st_rng_t r = {seed};
    size_t cap = (size_t)n_out * (kmax + 1) + 1;
    uint32_t *ro = gt_xmalloc(4 * cap), *re = gt_xmalloc(4 * cap); /* the pairs before grouping: row, expert */
    size_t n = 0;
    for (int o = 0; o < n_out; o++) {
        int m = (int)(st_rng_next(&r) % (uint64_t)(kmax + 1)), e0 = (int)(st_rng_next(&r) % (uint64_t)n_exp);
        for (int i = 0; i < m && i < n_exp; i++)
            ro[n] = (uint32_t)o, re[n++] = (uint32_t)((e0 + i * 7) % n_exp);
        if (dup && m > 0 && o % 97 == 13) ro[n] = (uint32_t)o, re[n++] = (uint32_t)e0;
    }
    for (size_t i = n; i > 1; i--) { /* shuffle, then a stable grouping by expert */
        size_t j = st_rng_next(&r) % i;
        uint32_t a = ro[i - 1], b = re[i - 1];
        ro[i - 1] = ro[j], re[i - 1] = re[j], ro[j] = a, re[j] = b;
    }
    uint32_t *offsets = gt_xmalloc(4 * ((size_t)n_exp + 1)), *eid = gt_xmalloc(4 * ((size_t)n_exp + 1));
    uint32_t *orow = gt_xmalloc(4 * (n + 1));
    float *p = gt_xmalloc(4 * (n + 1));
    int *ioff = gt_xmalloc(sizeof(int) * ((size_t)n_exp + 1)), ne = 0;
    size_t at = 0;
    for (int e = 0; e < n_exp; e++) {
        size_t before = at;
        for (size_t i = 0; i < n; i++)
            if (re[i] == (uint32_t)e) orow[at] = ro[i], p[at++] = st_rng_normal(&r);
        if (at == before && e % 3) continue; /* most experts without pairs are not named */
        eid[ne] = (uint32_t)e, offsets[ne] = (uint32_t)before, ioff[ne++] = (int)before;
    }
    offsets[ne] = (uint32_t)n, ioff[ne] = (int)n;
    size_t no = (size_t)n_out;
    uint32_t *off = gt_xmalloc(4 * (no + 1)), *row = gt_xmalloc(4 * (n + 1)), *id = gt_xmalloc(4 * (n + 1));
    float *lp = gt_xmalloc(4 * (n + 1));
    int bad = st_moe_leaf_table(off, row, id, lp, orow, p, offsets, eid, ne, n_out);
    uint32_t *d_off = gt_dev(4 * (no + 1)), *d_row = gt_dev(4 * (n + 1)), *d_id = gt_dev(4 * (n + 1)),
             *d_err = gt_dev(4);
    float *d_lp = gt_dev(4 * (n + 1));
    uint32_t *d_orow = gt_up(orow, 4 * (n + 1)), *d_eid = gt_up(eid, 4 * ((size_t)ne + 1));
    float *d_p = gt_up(p, 4 * (n + 1));
    int *d_ioff = gt_up(ioff, sizeof(int) * ((size_t)ne + 1));
    void *ws = gt_dev(st_cuda_moe_leaf_table_ws_bytes(n_out));
    gt_poison(d_off, 4 * (no + 1)), gt_poison(d_row, 4 * (n + 1)), gt_poison(d_id, 4 * (n + 1));
    gt_poison(d_lp, 4 * (n + 1)), gt_poison(d_err, 4);
    GT_OK(st_cuda_moe_leaf_table(&gt_stream, d_off, d_row, d_id, d_lp, d_err, d_orow, d_p, d_ioff, d_eid, ne, (int)n,
                                 n_out, ws));
    uint32_t *g_off = gt_xmalloc(4 * (no + 1)), *g_row = gt_xmalloc(4 * (n + 1)), *g_id = gt_xmalloc(4 * (n + 1)), err;
    float *g_lp = gt_xmalloc(4 * (n + 1));
    gt_down(g_off, d_off, 4 * (no + 1)), gt_down(g_row, d_row, 4 * n), gt_down(g_id, d_id, 4 * n);
    gt_down(g_lp, d_lp, 4 * n), gt_down(&err, d_err, 4);
    CHECK(dup == (bad >= 0), "leaf_table %d rows: a duplicate %s", n_out, dup ? "not found" : "found where none is");
    CHECK(err == (bad >= 0 ? (uint32_t)bad : 0xffffffffu), "leaf_table %d rows: err %u, the C reference's %d", n_out,
          err, bad);
    CHECK(!memcmp(g_off, off, 4 * (no + 1)), "leaf_table %d rows (%zu pairs, %d experts): off differs", n_out, n, ne);
    CHECK(!memcmp(g_row, row, 4 * n) && !memcmp(g_id, id, 4 * n) && !memcmp(g_lp, lp, 4 * n),
          "leaf_table %d rows (%zu pairs, %d experts): the leaves differ", n_out, n, ne);
    st_gpu_free(d_off), st_gpu_free(d_row), st_gpu_free(d_id), st_gpu_free(d_err), st_gpu_free(d_lp);
    st_gpu_free(d_orow), st_gpu_free(d_eid), st_gpu_free(d_p), st_gpu_free(d_ioff), st_gpu_free(ws);
    free(ro), free(re), free(offsets), free(eid), free(orow), free(p), free(ioff), free(off), free(row), free(id);
    free(lp), free(g_off), free(g_row), free(g_id), free(g_lp);
}

/* st_cuda_moe_tree_reduce vs st_moe_tree_reduce, bit-exact: n_out rows of 0 .. kmax leaves each (ids
 * ascending, spread up to 2^20), rows picked from y [n_y, l] with ±0 and wide magnitudes */
static void tree_reduce_case(int n_out, int kmax, int n_y, int l, uint64_t seed) {
    st_rng_t r = {seed};
    uint32_t *off = gt_xmalloc(4 * ((size_t)n_out + 1));
    off[0] = 0;
    for (int o = 0; o < n_out; o++) off[o + 1] = off[o] + (uint32_t)(o == 0 ? (uint64_t)kmax : st_rng_next(&r) % (uint64_t)(kmax + 1));
    size_t nl = off[n_out];
    uint32_t *row = gt_xmalloc(4 * (nl + 1)), *id = gt_xmalloc(4 * (nl + 1));
    float *p = gl_randn(nl + 1, 0.5f, &r), *y = gl_randn((size_t)n_y * l, 1.f, &r);
    for (size_t i = 0; i < (size_t)n_y * l; i += 7) y[i] = i % 2 ? -0.f : ldexpf(y[i], (int)(st_rng_next(&r) % 41) - 20);
    for (size_t k = 0; k < nl; k += 5) p[k] = 0.f;
    for (int o = 0; o < n_out; o++) {
        uint32_t e = (uint32_t)(st_rng_next(&r) % 8);
        for (uint32_t k = off[o]; k < off[o + 1]; k++) {
            id[k] = e;
            e += 1 + (uint32_t)(st_rng_next(&r) % (k % 3 ? 3 : 70000));
            row[k] = (uint32_t)(st_rng_next(&r) % (uint64_t)n_y);
        }
    }
    size_t no = (size_t)n_out * l;
    float *ref = gt_xmalloc(4 * (no + 1)), *got = gt_xmalloc(4 * (no + 1));
    st_moe_tree_reduce(ref, y, off, row, id, p, n_out, l);
    uint32_t *doff = gt_up(off, 4 * ((size_t)n_out + 1)), *drow = gt_up(row, 4 * (nl + 1)), *did = gt_up(id, 4 * (nl + 1));
    float *dp = gt_up(p, 4 * (nl + 1)), *dy = gt_up(y, 4 * (size_t)n_y * l), *dout = gt_dev(4 * (no + 1));
    gt_poison(dout, 4 * (no + 1));
    GT_OK(st_cuda_moe_tree_reduce(&gt_stream, dout, dy, doff, drow, did, dp, n_out, l));
    gt_down(got, dout, 4 * no);
    CHECK(memcmp(got, ref, 4 * no) == 0, "moe_tree_reduce n_out=%d kmax=%d l=%d: not bit-exact", n_out, kmax, l);
    st_gpu_free(doff), st_gpu_free(drow), st_gpu_free(did), st_gpu_free(dp), st_gpu_free(dy), st_gpu_free(dout);
    free(off), free(row), free(id), free(p), free(y), free(ref), free(got);
}

int main(void) {
    gt_init_or_skip("test_gpu_glue_moe");
    uint64_t seed = 1;
    for (int rn = 0; rn < 2; rn++) {
        route_finish_case(1, 8, 1, rn, seed++);
        route_finish_case(37, 64, 8, rn, seed++);
        route_finish_case(8192, 384, 8, rn, seed++);
        route_finish_case(0, 8, 2, rn, seed++);
    }
    dispatch_case(1, 1, 4, 2, seed++);
    dispatch_case(1, 8, 64, 1026, seed++);
    dispatch_case(37, 4, 33, 258, seed++);
    dispatch_case(300, 8, 256, 1024, seed++);
    dispatch_case(8192, 8, 384, 512, seed++);
    dispatch_case(0, 8, 16, 64, seed++);
    expand_case(1, 1, 4, seed++);
    expand_case(37, 5, 1028, seed++);
    expand_case(300, 64, 7168, seed++);
    expand_case(70000, 300, 8, seed++); /* more rows than one launch's grid (65535) */
    expand_case(0, 3, 8, seed++);
    tree_reduce_case(1, 1, 1, 1, seed++);
    tree_reduce_case(37, 8, 50, 258, seed++);
    tree_reduce_case(300, 32, 900, 1024, seed++);
    tree_reduce_case(70000, 2, 64, 8, seed++); /* more rows than one launch's grid (65535) */
    tree_reduce_case(0, 4, 1, 8, seed++);
    leaf_table_case(8, 1, 8, false, seed++);
    leaf_table_case(64, 4096, 8, false, seed++); /* an 8K prefill's micro-batch on one server */
    leaf_table_case(64, 5000, 8, true, seed++);
    leaf_table_case(896, 3000, 16, false, seed++); /* K3's experts */
    leaf_table_case(64, 70000, 3, false, seed++);  /* more rows than the scan's 1024 threads × 64 */
    leaf_table_case(16, 0, 4, false, seed++);
    return st_test_done();
}
