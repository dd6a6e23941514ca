/* Latent-MoE path on the GPU vs the CPU (grouping, gather and combine: test_gpu_glue_moe.c): grouped
 * expert FFN vs st_ffn per expert (bf16 and MXFP4 weights, empty experts, partial tiles, captured into
 * a graph; the weight-table path with its big experts through cuBLAS, y and ws poisoned first), the
 * per-slot FFN for decode sizes vs st_ffn per slot, MXFP4 → bf16 vs st_weight_rows_f32 (exactly),
 * quantile router vs st_route_quantile (ids and counts exactly). */
#include <cuda_runtime_api.h>
#include <math.h>
#include <string.h>

#include "gpu_test.h"
#include "strata/kernels.h"

/* ---------------- routing and grouping for the FFN cases ---------------- */
/* CPU grouping: rows by expert, (t, i) ascending within an expert. */
static void cpu_group(int *offsets, int *row_of, int *src_of, const int *ids, const int *cnt, int T, int kmax, int E) {
    memset(offsets, 0, sizeof(int) * (E + 1));
    for (int t = 0; t < T; t++)
        for (int i = 0; i < cnt[t]; i++) offsets[ids[t * kmax + i] + 1]++;
    for (int e = 0; e < E; e++) offsets[e + 1] += offsets[e];
    int *fill = gt_xmalloc(sizeof(int) * E);
    memcpy(fill, offsets, sizeof(int) * E);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < kmax; i++) {
            if (i >= cnt[t]) {
                row_of[t * kmax + i] = -1;
                continue;
            }
            int r = fill[ids[t * kmax + i]]++;
            row_of[t * kmax + i] = r;
            src_of[r] = t;
        }
    free(fill);
}

/* random routing: cnt[t] in 0..kmax (or kmax when full), ids distinct ascending in 0..E-1 */
static void random_routing(int *ids, int *cnt, float *p, int T, int kmax, int E, bool full, st_rng_t *r) {
    for (int t = 0; t < T; t++) {
        int c = full ? kmax : (int)(st_rng_uniform(r) * (kmax + 1));
        if (c > kmax) c = kmax;
        if (c > E) c = E;
        cnt[t] = c;
        int n = 0;
        for (int e = 0; e < E && n < c; e++) /* selection sampling: c of E, ascending */
            if (st_rng_uniform(r) * (E - e) < (c - n)) ids[t * kmax + n++] = e;
        for (int i = 0; i < kmax; i++) {
            if (i >= c) ids[t * kmax + i] = -1;
            p[t * kmax + i] = i < c ? (float)st_rng_uniform(r) : 0.f;
        }
    }
}

/* ---------------- MXFP4 ---------------- */
static void random_mxfp4(uint8_t *codes, uint8_t *scale, int rows, int cols, st_rng_t *r) {
    for (size_t i = 0; i < (size_t)rows * cols / 2; i++) codes[i] = (uint8_t)(st_rng_uniform(r) * 256);
    for (size_t i = 0; i < (size_t)rows * cols / 32; i++) scale[i] = (uint8_t)(118 + st_rng_uniform(r) * 8);
}

static void mxfp4_case(int rows, int cols, uint64_t seed) {
    st_rng_t r = {seed};
    uint8_t *codes = gt_xmalloc((size_t)rows * cols / 2), *scale = gt_xmalloc((size_t)rows * cols / 32);
    random_mxfp4(codes, scale, rows, cols, &r);
    if (rows * cols >= 64) scale[0] = 0, scale[1] = 254; /* extremes: 2^-127 (subnormal) and 2^127 */
    st_weight_t W = {.dtype = ST_DT_MXFP4, .rows = rows, .cols = cols, .data = codes, .scale = scale};
    float *ref = gt_xmalloc(4 * (size_t)rows * cols);
    st_weight_rows_f32(&W, 0, rows, ref);
    uint8_t *d_c = gt_up(codes, (size_t)rows * cols / 2), *d_s = gt_up(scale, (size_t)rows * cols / 32);
    uint16_t *d_o = gt_dev(2 * (size_t)rows * cols), *got = gt_xmalloc(2 * (size_t)rows * cols);
    GT_OK(st_cuda_mxfp4_to_bf16(&gt_stream, d_o, d_c, d_s, rows, cols));
    gt_down(got, d_o, 2 * (size_t)rows * cols);
    size_t diff = 0;
    for (size_t i = 0; i < (size_t)rows * cols; i++) {
        float g = st_bf16_to_f32(got[i]);
        diff += memcmp(&g, &ref[i], 4) != 0 && !(g == 0.f && ref[i] == 0.f);
    }
    CHECK(diff == 0, "mxfp4_to_bf16 %dx%d: %zu values differ", rows, cols, diff);
    printf("info mxfp4_to_bf16 %dx%d exact\n", rows, cols);
    st_gpu_free(d_c), st_gpu_free(d_s), st_gpu_free(d_o);
    free(codes), free(scale), free(ref), free(got);
}

/* ---------------- grouped expert FFN ---------------- */
static void ffn_case(int E, const int *counts, int l, int w, bool situ, bool mxfp4, uint64_t seed) {
    st_rng_t r = {seed};
    int *off = gt_xmalloc(sizeof(int) * (E + 1)), maxc = 0;
    off[0] = 0;
    for (int e = 0; e < E; e++) {
        off[e + 1] = off[e] + counts[e];
        if (counts[e] > maxc) maxc = counts[e];
    }
    int N = off[E];
    size_t n13 = (size_t)E * w * l, n2 = (size_t)E * l * w;
    float *x = gt_xmalloc(4 * ((size_t)N * l + 1)), *w1f = gt_xmalloc(4 * n13), *w3f = gt_xmalloc(4 * n13),
          *w2f = gt_xmalloc(4 * n2);
    uint16_t *xb = gt_xmalloc(2 * ((size_t)N * l + 1)), *w1b = gt_xmalloc(2 * n13), *w3b = gt_xmalloc(2 * n13),
             *w2b = gt_xmalloc(2 * n2);
    gt_randn_bf(x, xb, (size_t)N * l, 1.f, &r);
    uint16_t *d_w1, *d_w3, *d_w2;
    uint8_t *c1 = NULL, *c3 = NULL, *c2 = NULL, *s1 = NULL, *s3 = NULL, *s2 = NULL;
    if (!mxfp4) {
        gt_randn_bf(w1f, w1b, n13, 1.f / sqrtf((float)l), &r);
        gt_randn_bf(w3f, w3b, n13, 1.f / sqrtf((float)l), &r);
        gt_randn_bf(w2f, w2b, n2, 1.f / sqrtf((float)w), &r);
        d_w1 = gt_up(w1b, 2 * n13), d_w3 = gt_up(w3b, 2 * n13), d_w2 = gt_up(w2b, 2 * n2);
    } else { /* per expert MXFP4, converted on the device into the stacked bf16 weights */
        c1 = gt_xmalloc(n13 / 2), c3 = gt_xmalloc(n13 / 2), c2 = gt_xmalloc(n2 / 2);
        s1 = gt_xmalloc(n13 / 32), s3 = gt_xmalloc(n13 / 32), s2 = gt_xmalloc(n2 / 32);
        random_mxfp4(c1, s1, E * w, l, &r), random_mxfp4(c3, s3, E * w, l, &r), random_mxfp4(c2, s2, E * l, w, &r);
        d_w1 = gt_dev(2 * n13), d_w3 = gt_dev(2 * n13), d_w2 = gt_dev(2 * n2);
        uint8_t *dc = gt_up(c1, n13 / 2), *ds = gt_up(s1, n13 / 32);
        GT_OK(st_cuda_mxfp4_to_bf16(&gt_stream, d_w1, dc, ds, E * w, l));
        GT_OK(st_gpu_stream_sync(&gt_stream));
        st_gpu_free(dc), st_gpu_free(ds);
        dc = gt_up(c3, n13 / 2), ds = gt_up(s3, n13 / 32);
        GT_OK(st_cuda_mxfp4_to_bf16(&gt_stream, d_w3, dc, ds, E * w, l));
        GT_OK(st_gpu_stream_sync(&gt_stream));
        st_gpu_free(dc), st_gpu_free(ds);
        dc = gt_up(c2, n2 / 2), ds = gt_up(s2, n2 / 32);
        GT_OK(st_cuda_mxfp4_to_bf16(&gt_stream, d_w2, dc, ds, E * l, w));
        GT_OK(st_gpu_stream_sync(&gt_stream));
        st_gpu_free(dc), st_gpu_free(ds);
    }
    float *yref = gt_xmalloc(4 * ((size_t)N * l + 1)), *got = gt_xmalloc(4 * ((size_t)N * l + 1));
    float *ws = gt_xmalloc(4 * st_ffn_ws_floats(maxc > 0 ? maxc : 1,
                                                &(st_weight_t){.dtype = ST_DT_BF16, .rows = w, .cols = l},
                                                &(st_weight_t){.dtype = ST_DT_BF16, .rows = w, .cols = l},
                                                &(st_weight_t){.dtype = ST_DT_BF16, .rows = l, .cols = w}));
    for (int e = 0; e < E; e++) {
        if (!counts[e]) continue;
        st_weight_t g, u, d;
        if (!mxfp4) {
            g = (st_weight_t){.dtype = ST_DT_BF16, .rows = w, .cols = l, .data = w1b + (size_t)e * w * l};
            u = (st_weight_t){.dtype = ST_DT_BF16, .rows = w, .cols = l, .data = w3b + (size_t)e * w * l};
            d = (st_weight_t){.dtype = ST_DT_BF16, .rows = l, .cols = w, .data = w2b + (size_t)e * l * w};
        } else {
            g = (st_weight_t){ST_DT_MXFP4, w, l, c1 + (size_t)e * w * l / 2, s1 + (size_t)e * w * l / 32};
            u = (st_weight_t){ST_DT_MXFP4, w, l, c3 + (size_t)e * w * l / 2, s3 + (size_t)e * w * l / 32};
            d = (st_weight_t){ST_DT_MXFP4, l, w, c2 + (size_t)e * l * w / 2, s2 + (size_t)e * l * w / 32};
        }
        st_ffn(yref + (size_t)off[e] * l, x + (size_t)off[e] * l, counts[e], &g, &u, &d,
               situ ? ST_ACT_SITU : ST_ACT_SILU, 4.f, 25.f, ws);
    }
    int *d_off = gt_up(off, sizeof(int) * (E + 1));
    uint16_t *d_x = gt_up(xb, 2 * ((size_t)N * l + 1));
    float *d_y = gt_dev(4 * ((size_t)N * l + 1));
    size_t wsb = st_cuda_moe_ffn_ws_bytes(N, w);
    void *d_ws = gt_dev(wsb);
    gt_poison(d_y, 4 * ((size_t)N * l + 1));
    GT_OK(st_cuda_moe_ffn(&gt_stream, d_y, d_x, d_off, E, N, maxc, d_w1, d_w3, d_w2, l, w, situ, 4.f, 25.f, d_ws, wsb));
    gt_down(got, d_y, 4 * (size_t)N * l);
    char what[200];
    snprintf(what, sizeof what, "moe_ffn E=%d N=%d l=%d w=%d %s %s", E, N, l, w, situ ? "situ" : "silu",
             mxfp4 ? "mxfp4" : "bf16");
    if (N) st_t_close(what, got, yref, (size_t)N * l, 1.5e-2, 1e-3);
    /* the same captured into a CUDA graph (as the engine's decode steps run it), replayed twice */
    if (N) {
        gt_poison(d_y, 4 * ((size_t)N * l + 1));
        cudaStream_t cs = (cudaStream_t)gt_stream.stream;
        cudaGraph_t g = NULL;
        cudaGraphExec_t ge = NULL;
        cudaError_t ce = cudaStreamBeginCapture(cs, cudaStreamCaptureModeRelaxed);
        st_status_t rc = ce == cudaSuccess ? st_cuda_moe_ffn(&gt_stream, d_y, d_x, d_off, E, N, maxc, d_w1, d_w3,
                                                             d_w2, l, w, situ, 4.f, 25.f, d_ws, wsb)
                                           : ST_OK;
        cudaError_t ce2 = ce == cudaSuccess ? cudaStreamEndCapture(cs, &g) : ce;
        if (ce == cudaSuccess && ce2 == cudaSuccess && rc == ST_OK) ce2 = cudaGraphInstantiate(&ge, g, 0);
        for (int r = 0; r < 2 && ce2 == cudaSuccess && rc == ST_OK; r++) ce2 = cudaGraphLaunch(ge, cs);
        if (ce2 == cudaSuccess && rc == ST_OK) ce2 = cudaStreamSynchronize(cs);
        CHECK(ce == cudaSuccess && ce2 == cudaSuccess && rc == ST_OK, "moe_ffn graph E=%d N=%d: %s / %s", E, N,
              cudaGetErrorString(ce2), rc == ST_OK ? "ok" : st_err_last());
        if (ge) cudaGraphExecDestroy(ge);
        if (g) cudaGraphDestroy(g);
        gt_down(got, d_y, 4 * (size_t)N * l);
        snprintf(what, sizeof what, "moe_ffn (graph) E=%d N=%d l=%d w=%d", E, N, l, w);
        st_t_close(what, got, yref, (size_t)N * l, 1.5e-2, 1e-3);
    }
    /* weight-table path (the expert server: experts bound one by one): each expert's {w1, w3, w2}
     * block placed in reverse expert order in one buffer, pointers in a device table. Experts with
     * >= min_rows through cuBLAS (gate/up, one GLU over their rows, down), the rest grouped: all via
     * cuBLAS, a mix, and the default rule (on the H200: every expert on the wgmma kernels); y and the
     * workspace NaN-poisoned first */
    size_t wsh = st_cuda_moe_ffn_table_ws_bytes(N, w);
    void *d_wsh = gt_dev(wsh);
    {
        static const int mins[] = {1, 100, 0};
        size_t me = (size_t)w * l, blk = 3 * me;
        uint16_t *hw = gt_xmalloc(2 * (n13 + n13 + n2)), *hb = gt_xmalloc(2 * blk * E);
        gt_down(hw, d_w1, 2 * n13), gt_down(hw + n13, d_w3, 2 * n13), gt_down(hw + 2 * n13, d_w2, 2 * n2);
        for (int e = 0; e < E; e++) {
            uint16_t *b = hb + (size_t)(E - 1 - e) * blk;
            memcpy(b, hw + (size_t)e * me, 2 * me);
            memcpy(b + me, hw + n13 + (size_t)e * me, 2 * me);
            memcpy(b + 2 * me, hw + 2 * n13 + (size_t)e * me, 2 * me);
        }
        uint16_t *d_blk = gt_up(hb, 2 * blk * E);
        const st_bf16_t **tab = gt_xmalloc(sizeof *tab * 3 * E);
        for (int e = 0; e < E; e++)
            for (int k = 0; k < 3; k++) tab[3 * e + k] = (const st_bf16_t *)(d_blk + (size_t)(E - 1 - e) * blk + k * me);
        const st_bf16_t **d_tab = gt_up(tab, sizeof *tab * 3 * E);
        for (int mi = 0; mi < 3; mi++) {
            gt_poison(d_y, 4 * ((size_t)N * l + 1));
            gt_poison(d_wsh, wsh);
            int nbig = 0;
            for (int e = 0; e < E; e++) nbig += mins[mi] && counts[e] > 0 && counts[e] >= mins[mi];
            GT_OK(st_cuda_moe_ffn_table(&gt_stream, d_y, d_x, d_off, off, E, mins[mi], d_tab, l, w, situ, 4.f, 25.f,
                                        d_wsh, wsh));
            gt_down(got, d_y, 4 * (size_t)N * l);
            snprintf(what, sizeof what, "moe_ffn_table E=%d N=%d l=%d w=%d %s %s, cuBLAS >= %d rows (%d experts)", E,
                     N, l, w, situ ? "situ" : "silu", mxfp4 ? "mxfp4" : "bf16", mins[mi], nbig);
            if (N) st_t_close(what, got, yref, (size_t)N * l, 1.5e-2, 1e-3);
        }
        st_gpu_free(d_blk), st_gpu_free(d_tab);
        free(hw), free(hb), free(tab);
    }
    st_gpu_free(d_wsh);
    st_gpu_free(d_off), st_gpu_free(d_x), st_gpu_free(d_y), st_gpu_free(d_ws);
    st_gpu_free(d_w1), st_gpu_free(d_w3), st_gpu_free(d_w2);
    free(off), free(x), free(w1f), free(w3f), free(w2f), free(xb), free(w1b), free(w3b), free(w2b);
    free(c1), free(c3), free(c2), free(s1), free(s3), free(s2), free(yref), free(got), free(ws);
}

/* ---------------- quantile router ---------------- */
static void quantile_case(int T, int n, int kmax, float tau_lo, float tau_hi, bool renorm, uint64_t seed) {
    st_rng_t r = {seed};
    size_t N = (size_t)T * n;
    float *s = gt_xmalloc(4 * N), *tau = gt_xmalloc(4 * n), *w_ref = gt_xmalloc(4 * (size_t)T * kmax),
          *w_got = gt_xmalloc(4 * (size_t)T * kmax), *s_host = gt_xmalloc(4 * N);
    int *id_ref = gt_xmalloc(sizeof(int) * T * kmax), *id_got = gt_xmalloc(sizeof(int) * T * kmax),
        *c_ref = gt_xmalloc(sizeof(int) * T), *c_got = gt_xmalloc(sizeof(int) * T);
    for (size_t i = 0; i < N; i++) s[i] = 2.f * st_rng_normal(&r);
    for (int j = 0; j < n; j++) tau[j] = tau_lo + (tau_hi - tau_lo) * (float)st_rng_uniform(&r);
    float *d_s = gt_up(s, 4 * N), *d_tau = gt_up(tau, 4 * n), *d_w = gt_dev(4 * (size_t)T * kmax);
    int *d_id = gt_dev(sizeof(int) * T * kmax), *d_c = gt_dev(sizeof(int) * T);
    st_router_sigmoid(s, T, n);
    st_route_quantile(id_ref, w_ref, c_ref, s, tau, T, n, kmax, renorm, 2.5f);
    GT_OK(st_cuda_router_quantile(&gt_stream, d_id, d_w, d_c, d_s, d_tau, T, n, kmax, renorm, 2.5f));
    gt_down(s_host, d_s, 4 * N); /* the scores are σ(logits) in place */
    gt_down(id_got, d_id, sizeof(int) * T * kmax);
    gt_down(w_got, d_w, 4 * (size_t)T * kmax);
    gt_down(c_got, d_c, sizeof(int) * T);
    int did = 0, dc = 0;
    long active = 0;
    for (int i = 0; i < T * kmax; i++) did += id_got[i] != id_ref[i];
    for (int t = 0; t < T; t++) dc += c_got[t] != c_ref[t], active += c_ref[t];
    CHECK(did == 0 && dc == 0, "router_quantile T=%d n=%d kmax=%d: %d ids, %d counts differ", T, n, kmax, did, dc);
    char what[128];
    snprintf(what, sizeof what, "router_quantile T=%d n=%d kmax=%d tau [%.2f,%.2f] (mean cnt %.2f): w", T, n, kmax,
             tau_lo, tau_hi, (double)active / T);
    st_t_close(what, w_got, w_ref, (size_t)T * kmax, 1e-5, 1e-6);
    st_t_close("router_quantile scores to host", s_host, s, N, 1e-5, 1e-6);
    st_gpu_free(d_s), st_gpu_free(d_tau), st_gpu_free(d_w), st_gpu_free(d_id), st_gpu_free(d_c);
    free(s), free(tau), free(w_ref), free(w_got), free(s_host), free(id_ref), free(id_got), free(c_ref), free(c_got);
}

/* every FFN case; run once per grouped-GEMM implementation (mma.sync, then Hopper wgmma where usable) */
/* st_cuda_moe_ffn_slots vs st_ffn per routed slot: T tokens, kc slots each (cnt[t] used, ids ascending,
 * some tokens with none), y poisoned first: used slots close to the CPU, unused slots left as poisoned. */
static void slots_case(int T, int kc, int E, int l, int w, bool situ, uint64_t seed) {
    st_rng_t r = {seed};
    size_t n13 = (size_t)E * w * l, n2 = (size_t)E * l * w, ny = (size_t)T * kc * l;
    int *ids = gt_xmalloc(sizeof(int) * T * kc), *cnt = gt_xmalloc(sizeof(int) * T);
    float *p = gt_xmalloc(sizeof(float) * T * kc);
    random_routing(ids, cnt, p, T, kc, E, false, &r);
    float *z = gt_xmalloc(4 * (size_t)T * l), *w1f = gt_xmalloc(4 * n13), *w3f = gt_xmalloc(4 * n13),
          *w2f = gt_xmalloc(4 * n2), *yref = gt_xmalloc(4 * ny), *got = gt_xmalloc(4 * ny);
    uint16_t *zb = gt_xmalloc(2 * (size_t)T * l), *w1b = gt_xmalloc(2 * n13), *w3b = gt_xmalloc(2 * n13),
             *w2b = gt_xmalloc(2 * n2);
    gt_randn_bf(z, zb, (size_t)T * l, 1.f, &r);
    gt_randn_bf(w1f, w1b, n13, 1.f / sqrtf((float)l), &r);
    gt_randn_bf(w3f, w3b, n13, 1.f / sqrtf((float)l), &r);
    gt_randn_bf(w2f, w2b, n2, 1.f / sqrtf((float)w), &r);
    st_weight_t wt = {.dtype = ST_DT_BF16, .rows = w, .cols = l}, wd = {.dtype = ST_DT_BF16, .rows = l, .cols = w};
    float *ws = gt_xmalloc(4 * st_ffn_ws_floats(1, &wt, &wt, &wd));
    int used = 0;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < cnt[t]; i++, used++) {
            int e = ids[t * kc + i];
            st_weight_t g = wt, u = wt, d = wd;
            g.data = w1b + (size_t)e * w * l, u.data = w3b + (size_t)e * w * l, d.data = w2b + (size_t)e * l * w;
            st_ffn(yref + ((size_t)t * kc + i) * l, z + (size_t)t * l, 1, &g, &u, &d, situ ? ST_ACT_SITU : ST_ACT_SILU,
                   4.f, 25.f, ws);
        }
    uint16_t *d_z = gt_up(zb, 2 * (size_t)T * l), *d_w1 = gt_up(w1b, 2 * n13), *d_w3 = gt_up(w3b, 2 * n13),
             *d_w2 = gt_up(w2b, 2 * n2), *d_h = gt_dev(2 * (size_t)T * kc * w);
    int *d_ids = gt_up(ids, sizeof(int) * T * kc), *d_cnt = gt_up(cnt, sizeof(int) * T);
    float *d_y = gt_dev(4 * ny);
    gt_poison(d_y, 4 * ny), gt_poison(d_h, 2 * (size_t)T * kc * w);
    GT_OK(st_cuda_moe_ffn_slots(&gt_stream, d_y, d_h, d_z, d_ids, d_cnt, T, kc, d_w1, d_w3, d_w2, l, w, situ, 4.f,
                                25.f));
    gt_down(got, d_y, 4 * ny);
    /* the used slots packed, compared as one vector; the unused ones still 0xff… */
    float *gu = gt_xmalloc(4 * ny + 4), *ru = gt_xmalloc(4 * ny + 4);
    size_t k = 0, untouched_bad = 0;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < kc; i++) {
            const float *gp = got + ((size_t)t * kc + i) * l, *rp = yref + ((size_t)t * kc + i) * l;
            if (i < cnt[t]) {
                memcpy(gu + k, gp, 4 * (size_t)l), memcpy(ru + k, rp, 4 * (size_t)l);
                k += (size_t)l;
            } else {
                for (int c = 0; c < l; c++) {
                    uint32_t b;
                    memcpy(&b, gp + c, 4);
                    untouched_bad += b != 0xffffffffu;
                }
            }
        }
    char what[160];
    snprintf(what, sizeof what, "moe_ffn_slots T=%d kc=%d E=%d l=%d w=%d %s (%d slots)", T, kc, E, l, w,
             situ ? "situ" : "silu", used);
    if (k) st_t_close(what, gu, ru, k, 1.5e-2, 1e-3);
    CHECK(untouched_bad == 0, "%s: %zu values of unused slots written", what, untouched_bad);
    /* an expert server's view of the same slots: rows grouped by expert, weights through a table;
     * every row bit-identical to its slot */
    int *off = gt_xmalloc(sizeof(int) * (E + 1)), *row_of = gt_xmalloc(sizeof(int) * T * kc),
        *src_of = gt_xmalloc(sizeof(int) * (T * kc + 1));
    cpu_group(off, row_of, src_of, ids, cnt, T, kc, E);
    int N = off[E];
    uint16_t *xg = gt_xmalloc(2 * ((size_t)N * l + 1));
    for (int r = 0; r < N; r++) memcpy(xg + (size_t)r * l, zb + (size_t)src_of[r] * l, 2 * (size_t)l);
    const uint16_t **tab = gt_xmalloc(sizeof(void *) * 3 * (size_t)E);
    for (int e = 0; e < E; e++)
        tab[3 * e] = d_w1 + (size_t)e * w * l, tab[3 * e + 1] = d_w3 + (size_t)e * w * l,
                tab[3 * e + 2] = d_w2 + (size_t)e * l * w;
    uint16_t *d_xg = gt_up(xg, 2 * ((size_t)N * l + 1)), *d_hr = gt_dev(2 * ((size_t)N * w + 8));
    int *d_off = gt_up(off, sizeof(int) * (E + 1));
    void *d_tab = gt_up(tab, sizeof(void *) * 3 * (size_t)E);
    float *d_yr = gt_dev(4 * ((size_t)N * l + 1)), *yr = gt_xmalloc(4 * ((size_t)N * l + 1));
    GT_OK(st_cuda_moe_ffn_rows_table(&gt_stream, d_yr, d_hr, d_xg, d_off, E, N, d_tab, l, w, situ, 4.f, 25.f));
    gt_down(yr, d_yr, 4 * (size_t)N * l);
    size_t differ = 0;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < cnt[t]; i++)
            differ += memcmp(yr + (size_t)row_of[t * kc + i] * l, got + ((size_t)t * kc + i) * l, 4 * (size_t)l) != 0;
    CHECK(differ == 0, "%s: %zu of %d rows of the table form differ from their slots", what, differ, used);
    st_gpu_free(d_xg), st_gpu_free(d_hr), st_gpu_free(d_off), st_gpu_free(d_tab), st_gpu_free(d_yr);
    free(off), free(row_of), free(src_of), free(xg), free(tab), free(yr);
    st_gpu_free(d_z), st_gpu_free(d_w1), st_gpu_free(d_w3), st_gpu_free(d_w2), st_gpu_free(d_h), st_gpu_free(d_ids),
        st_gpu_free(d_cnt), st_gpu_free(d_y);
    free(ids), free(cnt), free(p), free(z), free(w1f), free(w3f), free(w2f), free(yref), free(got), free(zb), free(w1b),
        free(w3b), free(w2b), free(ws), free(gu), free(ru);
}

static void ffn_cases(void) {
    static const int c1[] = {0, 1, 130, 17};
    ffn_case(4, c1, 64, 32, true, false, 1);
    static const int c2[] = {5, 0, 0, 300, 128, 129, 1, 64};
    ffn_case(8, c2, 256, 128, false, false, 2);
    static const int c3[] = {300, 0, 129};
    ffn_case(3, c3, 72, 40, true, false, 3);
    static const int c4[] = {0, 0};
    ffn_case(2, c4, 64, 64, true, false, 4); /* every expert empty */
    static const int c5[] = {33, 0, 200, 7};
    ffn_case(4, c5, 128, 96, true, true, 5); /* MXFP4 weights dequantised on the device */
    int c6[16];
    for (int e = 0; e < 16; e++) c6[e] = e == 3 ? 0 : 64 + 29 * e;
    ffn_case(16, c6, 1024, 512, true, false, 6);
    /* table runs: adjacent equal big experts (merged into one cuBLAS batch), an empty and a small one
     * between big ones, and a last one-row expert */
    static const int c7[] = {300, 300, 0, 300, 40, 300, 300, 1, 257, 256};
    ffn_case(10, c7, 256, 128, false, false, 7);
    int c8[80]; /* 80 distinct counts: more than one chunk of cuBLAS groups (64) when all go to cuBLAS */
    for (int e = 0; e < 80; e++) c8[e] = e % 7 == 3 ? 0 : 1 + e * 4;
    ffn_case(80, c8, 64, 32, true, false, 8);
    /* partial tiles everywhere: K not a multiple of the 64-wide k step, Nout not a multiple of the
     * 128/256-column tiles, an exactly-128-row expert, a 1-row one, an empty one, more than 128 rows */
    static const int c9[] = {128, 1, 0, 257, 64};
    ffn_case(5, c9, 328, 264, false, false, 9);
}

int main(void) {
    gt_init_or_skip("test_gpu_moe_ffn");

    mxfp4_case(3, 32, 1);
    mxfp4_case(64, 1024, 2);

    slots_case(1, 8, 64, 512, 768, true, 1);     /* small's decode step at batch 1 */
    slots_case(2, 8, 16, 1024, 512, false, 2);
    slots_case(5, 4, 4, 3584, 3072, true, 3);    /* K3 widths */
    slots_case(3, 6, 7, 72, 40, true, 4);        /* K not a multiple of 256, Nout not of 16 */
    slots_case(9, 2, 3, 8, 8, false, 5);         /* the smallest widths */
    CHECK(st_cuda_moe_ffn_slots_pick(8, 64, 512, 768) && !st_cuda_moe_ffn_slots_pick(256, 1024, 512, 768) &&
              !st_cuda_moe_ffn_slots_pick(8, 12, 512, 768) && !st_cuda_moe_ffn_slots_pick(8, 64, 512, 770),
          "slots pick: 8 slots of 64 experts taken; 256 slots, 8 of 12 experts or w %% 8 != 0 not");

    /* the grouped GEMMs as the product runs them: on the H200 the wgmma kernels, the ping-pong form for
     * small experts (every case but one) and the cooperative form where the experts average 256 rows or
     * more (c6: 4353 rows over 16 experts); the table mode on the same kernels */
    ffn_cases();

    quantile_case(1, 8, 4, 0.4f, 0.6f, true, 1);
    quantile_case(100, 896, 16, 0.85f, 0.95f, true, 2); /* ~8 active of 896 */
    quantile_case(64, 384, 8, 0.0f, 0.0f, true, 3);     /* all active: capped at kmax by s − τ */
    quantile_case(33, 64, 8, 2.0f, 2.0f, true, 4);      /* none active: cnt 0 */
    quantile_case(257, 256, 64, 0.6f, 0.9f, false, 5);
    quantile_case(500, 896, 16, 0.99f, 0.999f, true, 6); /* a few active, some tokens none */
    return st_test_done();
}
