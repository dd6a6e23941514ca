/* Latent-MoE path and MLA prefill on the GPU: grouped expert FFN TFLOP/s at the torch._grouped_mm
 * peer shapes (bench/gpu/peers.py prints the peer in the same run), grouping / gather / combine /
 * quantile router times, MLA causal prefill TFLOP/s; next to the copy and GEMM ceilings. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"

/* argv[1]: mask of the hosted path's cuBLAS variants to time (bit v: st_moe_cublas_variant_t v; default
 * all); argv[2]: the variant of
 * the "default" hosted lines (default: what st_cuda_moe_ffn_hosted uses) */
static int b_vmask = 0xe, b_dvar = -1;
/* st_cuda_moe_ffn_use_wgmma modes */
static const char *b_kname[] = {"mma.sync", "wgmma-auto", "wgmma-cooperative", "?", "?", "wgmma-pingpong-fused"};
#define B_NMODES 6
/* argv[3]: which of those modes to time (bit m: mode m; also filters the variants and table sections) */
static int b_kmask = 0x27;
/* argv[4]: sections (bit 0: the FFN paths as before, 1: the wgmma variants (PDL, 16- vs 4/8-byte
 * epilogue stores, ping-pong), 2: the table mode (st_cuda_moe_ffn_table_f32out) on wgmma vs before,
 * 3: dispatch and MLA prefill, 4: for profilers (ncu): one untimed call of st_cuda_moe_ffn per mode of
 * argv[3], 5: decode-sized routed FFN, per slot vs grouped) */
static int b_smask = 0x2f;
/* argv[5]: which of the three FFN shapes (bit i: shape i; default all) */
static int b_shmask = 0x7;

/* a wgmma variant (the environment st_cuda_moe_ffn_use_wgmma reads); "" → the default */
static int wg_variant(int mode, const char *pdl, const char *table) {
    setenv("STRATA_FFN_PDL", pdl, 1), setenv("STRATA_FFN_WG_TABLE", table, 1);
    setenv("STRATA_FFN_VEC", "", 1);
    return st_cuda_moe_ffn_use_wgmma(mode);
}

/* the buffers of one FFN shape: x, y [E·tpe, l] bf16 (x uniform in ±1), stacked w1, w3 [E, w, l] and
 * w2 [E, l, w] (±0.03), equal row counts (hoff on the host, off on the device), the grouped
 * workspace */
typedef struct {
    st_bf16_t *x, *y, *w1, *w3, *w2;
    int *hoff, *off;
    void *ws;
    size_t wsb;
} ffn_bufs_t;

static void ffn_bufs_init(ffn_bufs_t *b, int E, int tpe, int l, int w) {
    int N = E * tpe;
    b->x = bdev((size_t)N * l * 2), b->y = bdev((size_t)N * l * 2);
    b->w1 = bdev((size_t)E * w * l * 2), b->w3 = bdev((size_t)E * w * l * 2), b->w2 = bdev((size_t)E * l * w * 2);
    BK(st_cuda_fill_uniform(&bs, b->x, true, (size_t)N * l, -1.f, 1.f, 1));
    BK(st_cuda_fill_uniform(&bs, b->w1, true, (size_t)E * w * l, -0.03f, 0.03f, 2));
    BK(st_cuda_fill_uniform(&bs, b->w3, true, (size_t)E * w * l, -0.03f, 0.03f, 3));
    BK(st_cuda_fill_uniform(&bs, b->w2, true, (size_t)E * w * l, -0.03f, 0.03f, 4));
    b->hoff = malloc(sizeof(int) * (E + 1));
    for (int e = 0; e <= E; e++) b->hoff[e] = e * tpe;
    b->off = bdev(sizeof(int) * (E + 1));
    BK(st_gpu_memcpy_h2d(b->off, b->hoff, sizeof(int) * (E + 1)));
    b->wsb = st_cuda_moe_ffn_ws_bytes(N, w);
    b->ws = bdev(b->wsb);
}

static void ffn_bufs_free(ffn_bufs_t *b) {
    st_gpu_free(b->x), st_gpu_free(b->y), st_gpu_free(b->w1), st_gpu_free(b->w3), st_gpu_free(b->w2);
    st_gpu_free(b->off), st_gpu_free(b->ws);
    free(b->hoff);
}

static void bench_ffn_variants(int E, int tpe, int l, int w) {
    int N = E * tpe;
    ffn_bufs_t b;
    ffn_bufs_init(&b, E, tpe, l, w);
    st_bf16_t *x = b.x, *y = b.y, *w1 = b.w1, *w3 = b.w3, *w2 = b.w2;
    int *off = b.off;
    size_t wsb = b.wsb;
    void *ws = b.ws;
    double ms, fl = 6.0 * N * l * w;
    static const struct {
        int mode;
        const char *pdl, *vec, *what;
    } v[] = {
        {2, "", "0", "cooperative, 4/8-byte stores (round 2)"},
        {2, "", "", "cooperative"},
        {2, "1", "", "cooperative+pdl"},
        {5, "", "0", "pingpong-fused, 4/8-byte stores"},
        {5, "", "", "pingpong-fused"},
        {1, "", "", "auto"},
        {2, "", "0", "cooperative, 4/8-byte stores (again)"},
        {2, "", "", "cooperative (again)"},
        {5, "", "", "pingpong-fused (again)"},
        {1, "", "", "auto (again)"},
    };
    for (int i = 0; i < (int)(sizeof v / sizeof v[0]); i++) {
        if (!(b_kmask >> v[i].mode & 1) || wg_variant(v[i].mode, v[i].pdl, "") != v[i].mode) continue;
        setenv("STRATA_FFN_VEC", v[i].vec, 1);
        st_cuda_moe_ffn_use_wgmma(v[i].mode); /* reads STRATA_FFN_VEC */
        BTIME(ms, 20, st_cuda_moe_ffn(&bs, y, x, off, E, N, tpe, w1, w3, w2, l, w, true, 4.f, 25.f, ws, wsb));
        printf("RESULT moe_ffn E=%d x %d l=%d w=%d variant %s: %.3f ms, %.1f TFLOP/s\n", E, tpe, l, w, v[i].what, ms,
               fl / (ms * 1e9));
    }
    wg_variant(-1, "", "");
    ffn_bufs_free(&b);
}

/* the table mode (the expert server's call): the stacked weights through a pointer table, fp32 y,
 * default rule; per-expert tensor maps on wgmma vs mma.sync + cuBLAS (before); even and uneven counts */
static void bench_ffn_table(int E, int tpe, int l, int w) {
    int N = E * tpe * 3 / 2;
    st_bf16_t *x = bdev((size_t)N * l * 2);
    float *y = bdev((size_t)N * l * 4);
    st_bf16_t *w1 = bdev((size_t)E * w * l * 2), *w3 = bdev((size_t)E * w * l * 2), *w2 = bdev((size_t)E * l * w * 2);
    BK(st_cuda_fill_uniform(&bs, x, true, (size_t)N * l, -1.f, 1.f, 1));
    BK(st_cuda_fill_uniform(&bs, w1, true, (size_t)E * w * l, -0.03f, 0.03f, 2));
    BK(st_cuda_fill_uniform(&bs, w3, true, (size_t)E * w * l, -0.03f, 0.03f, 3));
    BK(st_cuda_fill_uniform(&bs, w2, true, (size_t)E * w * l, -0.03f, 0.03f, 4));
    const st_bf16_t **tab = malloc(sizeof *tab * 3 * E);
    for (int e = 0; e < E; e++)
        tab[3 * e] = w1 + (size_t)e * w * l, tab[3 * e + 1] = w3 + (size_t)e * w * l,
                tab[3 * e + 2] = w2 + (size_t)e * l * w;
    const st_bf16_t **d_tab = bdev(sizeof *tab * 3 * E);
    BK(st_gpu_memcpy_h2d((void *)d_tab, tab, sizeof *tab * 3 * E));
    int *hoff = malloc(sizeof(int) * (E + 1));
    int *off = bdev(sizeof(int) * (E + 1));
    size_t wsb = st_cuda_moe_ffn_hosted_ws_bytes(N, w);
    void *ws = bdev(wsb);
    for (int uneven = 0; uneven < 2; uneven++) {
        hoff[0] = 0;
        for (int e = 0; e < E; e++) hoff[e + 1] = hoff[e] + (uneven ? tpe * (int[]){2, 6, 3, 5}[e % 4] / 4 : tpe);
        BK(st_gpu_memcpy_h2d(off, hoff, sizeof(int) * (E + 1)));
        double fl = 6.0 * hoff[E] * l * w, ms;
        /* per-expert tensor maps on each wgmma mode; the default; before (mma.sync + cuBLAS) */
        static const int vm[] = {2, 5, -1, -1};
        static const char *vn[] = {"wgmma cooperative", "wgmma ping-pong fused", "wgmma default",
                                   "before (mma.sync + cuBLAS by the default rule)"};
        for (int on = 0; on < 4; on++) {
            if (vm[on] >= 0 && !(b_kmask >> vm[on] & 1)) continue;
            if (wg_variant(vm[on], "", on < 3 ? "1" : "0") != vm[on] && vm[on] >= 0) continue;
            st_status_t rc =
                st_cuda_moe_ffn_table_f32out(&bs, y, x, off, hoff, E, 0, d_tab, l, w, true, 4.f, 25.f, ws, wsb);
            if (rc == ST_OK) rc = st_gpu_stream_sync(&bs);
            if (rc != ST_OK) {
                printf("RESULT moe_ffn_table FAILED: %s\n", st_err_last());
                continue;
            }
            BTIME(ms, 20,
                  st_cuda_moe_ffn_table_f32out(&bs, y, x, off, hoff, E, 0, d_tab, l, w, true, 4.f, 25.f, ws, wsb));
            printf("RESULT moe_ffn_table_f32out E=%d x %d l=%d w=%d%s, %s: %.3f ms, %.1f TFLOP/s\n", E, tpe, l, w,
                   uneven ? " uneven (0.5/1.5/0.75/1.25x)" : "", vn[on], ms, fl / (ms * 1e9));
        }
    }
    wg_variant(-1, "", "");
    st_gpu_free(x), st_gpu_free(y), st_gpu_free(w1), st_gpu_free(w3), st_gpu_free(w2), st_gpu_free(off),
        st_gpu_free(ws), st_gpu_free((void *)d_tab);
    free(hoff), free(tab);
}

/* the hosted path at one configuration: v < 0 → the public wrappers (default variant) */
typedef struct {
    const st_bf16_t *x, *w1, *w3, *w2;
    const int *off;
    int E, l, w;
    void *ws;
    size_t wsb;
} hosted_ctx_t;
static st_status_t hosted_call(const hosted_ctx_t *c, void *y, bool f32, const int *hoff, int minr, int v) {
    if (v >= 0)
        return st_cuda_moe_ffn_hosted_ex(&bs, y, f32, c->x, c->off, hoff, c->E, minr, c->w1, c->w3, c->w2, c->l, c->w,
                                         true, 4.f, 25.f, v, c->ws, c->wsb);
    if (f32)
        return st_cuda_moe_ffn_hosted_f32out(&bs, y, c->x, c->off, hoff, c->E, minr, c->w1, c->w3, c->w2, c->l, c->w,
                                             true, 4.f, 25.f, c->ws, c->wsb);
    return st_cuda_moe_ffn_hosted(&bs, y, c->x, c->off, hoff, c->E, minr, c->w1, c->w3, c->w2, c->l, c->w, true, 4.f,
                                  25.f, c->ws, c->wsb);
}
/* ms per call, or −1 after printing why it failed (one failing variant must not end the run) */
static double time_hosted(const hosted_ctx_t *c, void *y, bool f32, const int *hoff, int minr, int v) {
    st_status_t rc = hosted_call(c, y, f32, hoff, minr, v);
    if (rc == ST_OK) rc = st_gpu_stream_sync(&bs);
    if (rc != ST_OK) {
        printf("RESULT moe_ffn_hosted variant %d min_rows %d: FAILED: %s\n", v, minr, st_err_last());
        return -1;
    }
    double ms;
    BTIME(ms, 20, hosted_call(c, y, f32, hoff, minr, v));
    return ms;
}

static void bench_ffn(int E, int tpe, int l, int w) {
    int N = E * tpe;
    ffn_bufs_t b;
    ffn_bufs_init(&b, E, tpe, l, w);
    st_bf16_t *x = b.x, *y = b.y, *w1 = b.w1, *w3 = b.w3, *w2 = b.w2;
    int *hoff = b.hoff, *off = b.off;
    size_t wsb = b.wsb;
    void *ws = b.ws;
    double ms;
    double fl = 6.0 * N * l * w;
    /* the grouped path on each implementation of its GEMMs (then back to the default for the rest) */
    const int dflt = st_cuda_moe_ffn_use_wgmma(-1);
    for (int mode = 0; mode < B_NMODES; mode++) {
        if (!(b_kmask >> mode & 1) || st_cuda_moe_ffn_use_wgmma(mode) != mode) continue;
        BTIME(ms, 20, st_cuda_moe_ffn(&bs, y, x, off, E, N, tpe, w1, w3, w2, l, w, true, 4.f, 25.f, ws, wsb));
        printf("RESULT moe_ffn E=%d x %d l=%d w=%d (SiTU fused) kernels=%s: %.3f ms, %.1f TFLOP/s\n", E, tpe, l, w,
               b_kname[mode], ms, fl / (ms * 1e9));
    }
    st_cuda_moe_ffn_use_wgmma(-1);
    printf("RESULT moe_ffn grouped kernels by default: %s\n", b_kname[dflt]);
    BTIME(ms, 20, st_cuda_moe_ffn(&bs, y, x, off, E, N, tpe, w1, w3, w2, l, w, true, 4.f, 25.f, ws, wsb));
    printf("RESULT moe_ffn E=%d x %d l=%d w=%d (SiTU fused): %.3f ms, %.1f TFLOP/s = %.1f%% of GEMM ceiling\n", E, tpe,
           l, w, ms, fl / (ms * 1e9), 100.0 * fl / (ms * 1e9) / b_gemm_tflops);
    /* the hosted path (row counts on the host): the default (experts with rows·l·w >= 2^30 via cuBLAS),
     * then every cuBLAS variant with all experts via cuBLAS, bf16 and fp32 y */
    static const char *vname[] = {"?", "batched", "strided", "per-expert"};
    size_t wsh = st_cuda_moe_ffn_hosted_ws_bytes(N, w);
    void *wsh_p = bdev(wsh);
    float *y32 = bdev((size_t)N * l * 4);
    hosted_ctx_t hc = {x, w1, w3, w2, off, E, l, w, wsh_p, wsh};
    const int dmin = st_cuda_moe_ffn_cublas_min_rows(l, w);
    if ((ms = time_hosted(&hc, y, false, hoff, 0, b_dvar)) > 0)
        printf("RESULT moe_ffn_hosted E=%d x %d l=%d w=%d (default rule: cuBLAS for experts >= %d rows%s): %.3f ms, "
               "%.1f TFLOP/s = %.1f%% of GEMM ceiling\n",
               E, tpe, l, w, dmin, dflt ? ", but none on wgmma" : tpe >= dmin ? ": all" : ": none", ms, fl / (ms * 1e9),
               100.0 * fl / (ms * 1e9) / b_gemm_tflops);
    if ((ms = time_hosted(&hc, y32, true, hoff, 0, b_dvar)) > 0)
        printf("RESULT moe_ffn_hosted_f32out E=%d x %d l=%d w=%d (default): %.3f ms, %.1f TFLOP/s\n", E, tpe, l, w, ms,
               fl / (ms * 1e9));
    for (int v = ST_MOE_CUBLAS_BATCHED; v <= ST_MOE_CUBLAS_PER_EXPERT; v++)
        for (int f32 = 0; f32 < 2; f32++) {
            if (!(b_vmask >> v & 1)) continue;
            if ((ms = time_hosted(&hc, f32 ? (void *)y32 : (void *)y, f32, hoff, 1, v)) > 0)
                printf("RESULT moe_ffn_hosted E=%d x %d l=%d w=%d (all experts via cuBLAS, %s, y %s): %.3f ms, %.1f "
                       "TFLOP/s\n",
                       E, tpe, l, w, vname[v], f32 ? "fp32" : "bf16", ms, fl / (ms * 1e9));
        }
    /* uneven counts (0.5, 1.5, 0.75, 1.25 × tpe in turn): the default paths, thresholds, all via cuBLAS */
    for (int e = 0; e < E; e++) hoff[e + 1] = hoff[e] + tpe * (int[]){2, 6, 3, 5}[e % 4] / 4;
    BK(st_gpu_memcpy_h2d(off, hoff, sizeof(int) * (E + 1)));
    double fu = 6.0 * hoff[E] * l * w;
    for (int mode = 0; mode < B_NMODES; mode++) {
        if (!(b_kmask >> mode & 1) || st_cuda_moe_ffn_use_wgmma(mode) != mode) continue;
        BTIME(ms, 20,
              st_cuda_moe_ffn(&bs, y, x, off, E, hoff[E], tpe * 3 / 2, w1, w3, w2, l, w, true, 4.f, 25.f, ws, wsb));
        printf("RESULT moe_ffn E=%d x %d l=%d w=%d uneven (0.5/1.5/0.75/1.25x) kernels=%s: %.3f ms, %.1f TFLOP/s\n",
               E, tpe, l, w, b_kname[mode], ms, fu / (ms * 1e9));
    }
    st_cuda_moe_ffn_use_wgmma(-1);
    for (int minr = 0; minr <= 1024; minr = minr ? 2 * minr : 32) /* 0: the default rule */
        if ((ms = time_hosted(&hc, y, false, hoff, minr, b_dvar)) > 0)
            printf("RESULT moe_ffn_hosted E=%d x %d l=%d w=%d uneven, cuBLAS for experts >= %d rows%s: %.3f ms, %.1f "
                   "TFLOP/s\n",
                   E, tpe, l, w, minr ? minr : dmin, minr ? "" : dflt ? " (default rule: none on wgmma)" : " (default)", ms,
                   fu / (ms * 1e9));
    for (int v = ST_MOE_CUBLAS_BATCHED; v <= ST_MOE_CUBLAS_PER_EXPERT; v++) {
        if (!(b_vmask >> v & 1)) continue;
        if ((ms = time_hosted(&hc, y, false, hoff, 1, v)) > 0)
            printf("RESULT moe_ffn_hosted E=%d x %d l=%d w=%d uneven, all via cuBLAS, %s: %.3f ms, %.1f TFLOP/s\n", E,
                   tpe, l, w, vname[v], ms, fu / (ms * 1e9));
    }
    for (int e = 0; e <= E; e++) hoff[e] = e * tpe;
    BK(st_gpu_memcpy_h2d(off, hoff, sizeof(int) * (E + 1)));
    if (tpe >= 1024) { /* the hosted path's pieces, one expert: where its time goes */
        double mg, ma;
        float *gu = bdev((size_t)tpe * 2 * w * 4); /* fp32 gate|up, as the engine's cuBLAS path */
        st_bf16_t *hh = bdev((size_t)tpe * w * 2);
        BTIME(mg, 20, st_cuda_linear(&bs, gu, true, x, w1, tpe, 2 * w, l));
        BTIME(ma, 20, st_cuda_glu(&bs, hh, NULL, gu, gu + w, tpe, w, 2 * w, true, 4.f, 25.f));
        printf("RESULT moe_ffn pieces: cuBLAS %dx%dx%d (gate+up of one expert) %.1f us = %.1f TFLOP/s; GLU %dx%d %.1f us\n",
               tpe, 2 * w, l, mg * 1e3, 2.0 * tpe * 2 * w * l / (mg * 1e9), tpe, w, ma * 1e3);
        st_gpu_free(gu), st_gpu_free(hh);
    }
    /* skewed load: half the experts empty, the other half double */
    for (int e = 0; e <= E; e++) hoff[e] = 2 * tpe * ((e + 1) / 2);
    BK(st_gpu_memcpy_h2d(off, hoff, sizeof(int) * (E + 1)));
    BTIME(ms, 20, st_cuda_moe_ffn(&bs, y, x, off, E, N, 2 * tpe, w1, w3, w2, l, w, true, 4.f, 25.f, ws, wsb));
    printf("RESULT moe_ffn E=%d x %d l=%d w=%d, odd experts empty (2x on the rest): %.3f ms, %.1f TFLOP/s\n", E, tpe, l,
           w, ms, fl / (ms * 1e9));
    if ((ms = time_hosted(&hc, y, false, hoff, 0, b_dvar)) > 0)
        printf("RESULT moe_ffn_hosted E=%d x %d l=%d w=%d, odd experts empty (2x on the rest), default: %.3f ms, %.1f "
               "TFLOP/s\n",
               E, tpe, l, w, ms, fl / (ms * 1e9));
    st_gpu_free(wsh_p), st_gpu_free(y32);
    ffn_bufs_free(&b);
}

/* for profilers: one call of the grouped FFN per mode of b_kmask, no timing */
static void profile_ffn(int E, int tpe, int l, int w) {
    ffn_bufs_t b;
    ffn_bufs_init(&b, E, tpe, l, w);
    for (int mode = 0; mode < B_NMODES; mode++) {
        if (!(b_kmask >> mode & 1) || st_cuda_moe_ffn_use_wgmma(mode) != mode) continue;
        BK(st_cuda_moe_ffn(&bs, b.y, b.x, b.off, E, E * tpe, tpe, b.w1, b.w3, b.w2, l, w, true, 4.f, 25.f, b.ws,
                           b.wsb));
        BK(st_gpu_stream_sync(&bs));
        printf("RESULT profile_ffn E=%d x %d l=%d w=%d kernels=%s: 1 call\n", E, tpe, l, w, b_kname[mode]);
    }
    st_cuda_moe_ffn_use_wgmma(-1);
    ffn_bufs_free(&b);
}

static void bench_dispatch(int T, int k, int E, int l) {
    int *ids = bdev(sizeof(int) * T * k), *off = bdev(sizeof(int) * (E + 1)), *row = bdev(sizeof(int) * T * k),
        *cnt = bdev(sizeof(int) * T);
    float *scores = bdev(4 * (size_t)T * E), *sc0 = bdev(4 * (size_t)T * E), *tau = bdev(4 * (size_t)E),
          *p = bdev(4 * (size_t)T * k), *u = bdev(4 * (size_t)T * l), *yg = bdev(4 * (size_t)T * k * l);
    st_bf16_t *z = bdev((size_t)T * l * 2), *xg = bdev((size_t)T * k * l * 2);
    BK(st_cuda_fill_uniform(&bs, sc0, false, (size_t)T * E, -3.f, 3.f, 5));
    BK(st_cuda_fill_uniform(&bs, tau, false, (size_t)E, 0.949f, 0.951f, 6));
    BK(st_cuda_fill_uniform(&bs, z, true, (size_t)T * l, -1.f, 1.f, 7));
    BK(st_cuda_fill_uniform(&bs, xg, true, (size_t)T * k * l, -1.f, 1.f, 8));
    BK(st_cuda_fill_uniform(&bs, yg, false, (size_t)T * k * l, -1.f, 1.f, 9));
    BK(st_cuda_fill_uniform(&bs, u, false, (size_t)T * l, -1.f, 1.f, 10));
    double ms;
    /* the router applies σ in place: refill the logits before each call and subtract the fill */
    double ms_fill;
    BTIME(ms_fill, 10, st_cuda_fill_uniform(&bs, scores, false, (size_t)T * E, -3.f, 3.f, 5));
    BTIME(ms, 10, (st_cuda_fill_uniform(&bs, scores, false, (size_t)T * E, -3.f, 3.f, 5),
                   st_cuda_router_quantile(&bs, ids, p, cnt, scores, tau, T, E, k, true, 2.5f)));
    printf("RESULT router_quantile T=%d n=%d kmax=%d: %.1f us\n", T, E, k, (ms - ms_fill) * 1e3);
    BTIME(ms, 10, st_cuda_moe_group(&bs, off, row, ids, cnt, T, k, E));
    printf("RESULT moe_group T=%d k=%d E=%d: %.1f us\n", T, k, E, ms * 1e3);
    BTIME(ms, 10, st_cuda_moe_gather(&bs, xg, z, row, cnt, T, k, l));
    int *hc = malloc(sizeof(int) * T);
    BK(st_gpu_stream_sync(&bs));
    BK(st_gpu_memcpy_d2h(hc, cnt, sizeof(int) * T));
    long rows = 0;
    for (int t = 0; t < T; t++) rows += hc[t];
    double gb = (double)(rows + T) * l * 2;
    printf("RESULT moe_gather T=%d l=%d (%ld rows): %.1f us, %.0f GB/s\n", T, l, rows, ms * 1e3, gb / (ms * 1e6));
    /* the full-width form: partial (u) += Σ p·y over fp32 grouped rows */
    BTIME(ms, 10, st_cuda_moe_combine(&bs, NULL, NULL, u, yg, NULL, row, p, cnt, NULL, T, k, l, 1e-5f));
    gb = (double)rows * l * 4 + (double)T * l * 8;
    printf("RESULT moe_combine T=%d l=%d (%ld rows): %.1f us, %.0f GB/s\n", T, l, rows, ms * 1e3, gb / (ms * 1e6));
    free(hc);
    st_gpu_free(ids), st_gpu_free(off), st_gpu_free(row), st_gpu_free(cnt), st_gpu_free(scores),
        st_gpu_free(sc0), st_gpu_free(tau), st_gpu_free(p), st_gpu_free(u), st_gpu_free(z), st_gpu_free(xg),
        st_gpu_free(yg);
}

/* Decode-sized routed FFN (smask bit 32): the per-slot kernels (st_cuda_moe_ffn_slots) against the
 * grouped path (group + gather + st_cuda_moe_ffn_f32out, as the engine runs it) for T tokens of kc
 * slots. Every call routes to other experts (E experts, ≥ 256 MB of weights: from HBM); the calls are
 * replayed from one CUDA graph (as decode steps run). GB/s counts the distinct experts' weights. */
static double graph_call_us(int calls, int which, int T, int kc, int E, int l, int w, int **ids, int *cnt,
                            st_bf16_t *z, st_bf16_t *h, st_bf16_t *xg, float *y, int *off, int *row, void *fws, size_t fwsb, st_bf16_t *w1, st_bf16_t *w3, st_bf16_t *w2) {
    void *exec;
    BK(st_gpu_capture_begin(&bs));
    for (int c = 0; c < calls; c++) {
        if (which == 0) {
            BK(st_cuda_moe_ffn_slots(&bs, y, h, z, ids[c], cnt, T, kc, w1, w3, w2, l, w, true, 4.f, 25.f));
        } else {
            BK(st_cuda_moe_group(&bs, off, row, ids[c], cnt, T, kc, E));
            BK(st_cuda_moe_gather(&bs, xg, z, row, cnt, T, kc, l));
            BK(st_cuda_moe_ffn_f32out(&bs, y, xg, off, E, T * kc, T, w1, w3, w2, l, w, true, 4.f, 25.f, fws, fwsb));
        }
    }
    BK(st_gpu_capture_end(&bs, &exec));
    double ms;
    BTIME(ms, 1, st_gpu_graph_launch(exec, &bs));
    st_gpu_graph_destroy(exec);
    return ms * 1e3 / calls;
}

static void bench_slots(int kc, int l, int w) {
    double eb = 3.0 * l * w * 2; /* one expert's weights, bytes */
    int E = (int)((256.0 * (1 << 20)) / eb) + 1;
    if (E < 2 * kc) E = 2 * kc;
    st_bf16_t *w1 = bdev((size_t)E * w * l * 2), *w3 = bdev((size_t)E * w * l * 2), *w2 = bdev((size_t)E * l * w * 2);
    BK(st_cuda_fill_uniform(&bs, w1, true, (size_t)E * w * l, -0.03f, 0.03f, 2));
    BK(st_cuda_fill_uniform(&bs, w3, true, (size_t)E * w * l, -0.03f, 0.03f, 3));
    BK(st_cuda_fill_uniform(&bs, w2, true, (size_t)E * w * l, -0.03f, 0.03f, 4));
    static const int Ts[] = {1, 2, 4, 8, 16, 32};
    const int TM = 32;
    st_bf16_t *z = bdev((size_t)TM * l * 2), *h = bdev((size_t)TM * kc * w * 2), *xg = bdev((size_t)TM * kc * l * 2);
    float *y = bdev((size_t)TM * kc * l * 4);
    int *off = bdev(sizeof(int) * (E + 1)), *row = bdev(sizeof(int) * TM * kc), *cnt = bdev(sizeof(int) * TM);
    BK(st_cuda_fill_uniform(&bs, z, true, (size_t)TM * l, -1.f, 1.f, 1));
    size_t fwsb = st_cuda_moe_ffn_ws_bytes(TM * kc, w);
    void *fws = bdev(fwsb);
    int hc[32], *hid = malloc(sizeof(int) * TM * kc);
    for (int t = 0; t < TM; t++) hc[t] = kc;
    BK(st_gpu_memcpy_h2d(cnt, hc, sizeof hc));
    for (size_t j = 0; j < sizeof Ts / sizeof Ts[0]; j++) {
        int T = Ts[j], S = T * kc, calls = E / ST_MIN(S, E);
        if (calls < 2) calls = 2;
        int **ids = malloc(sizeof(int *) * calls);
        long distinct = 0;
        for (int c = 0; c < calls; c++) { /* token t takes kc consecutive experts from a rotating start */
            for (int t = 0; t < T; t++)
                for (int i = 0; i < kc; i++) hid[t * kc + i] = (c * S + ((t * kc) % E) + i) % E;
            for (int t = 0; t < T; t++) /* ascending within the token */
                for (int a = 1; a < kc; a++)
                    for (int b = a; b > 0 && hid[t * kc + b - 1] > hid[t * kc + b]; b--) {
                        int x = hid[t * kc + b];
                        hid[t * kc + b] = hid[t * kc + b - 1], hid[t * kc + b - 1] = x;
                    }
            ids[c] = bdev(sizeof(int) * S);
            BK(st_gpu_memcpy_h2d(ids[c], hid, sizeof(int) * S));
        }
        distinct = ST_MIN(S, E);
        double us_s = graph_call_us(calls, 0, T, kc, E, l, w, ids, cnt, z, h, xg, y, off, row, fws, fwsb,
                                    w1, w3, w2);
        double us_g = graph_call_us(calls, 1, T, kc, E, l, w, ids, cnt, z, h, xg, y, off, row, fws, fwsb,
                                    w1, w3, w2);
        double gbs = distinct * eb / 1e3;
        printf("RESULT moe_ffn_slots T=%d kc=%d l=%d w=%d (%d slots, %ld experts): slots %.1f us (%.0f GB/s, %.0f%% of "
               "copy), grouped %.1f us (%.0f GB/s): %.2fx%s\n",
               T, kc, l, w, S, distinct, us_s, gbs / us_s, 100.0 * gbs / us_s / b_copy_gbs, us_g, gbs / us_g,
               us_g / us_s, st_cuda_moe_ffn_slots_pick(S, E, l, w) ? " (picked)" : "");
        for (int c = 0; c < calls; c++) st_gpu_free(ids[c]);
        free(ids);
    }
    free(hid);
    st_gpu_free(w1), st_gpu_free(w3), st_gpu_free(w2), st_gpu_free(z), st_gpu_free(h), st_gpu_free(xg), st_gpu_free(y),
        st_gpu_free(off), st_gpu_free(row), st_gpu_free(cnt), st_gpu_free(fws);
}

static void bench_mla_prefill(int T, int H) {
    int n = T;
    st_bf16_t *q = bdev((size_t)T * H * 192 * 2), *k = bdev((size_t)n * H * 192 * 2), *v = bdev((size_t)n * H * 128 * 2),
              *o = bdev((size_t)T * H * 128 * 2);
    BK(st_cuda_fill_uniform(&bs, q, true, (size_t)T * H * 192, -1.f, 1.f, 1));
    BK(st_cuda_fill_uniform(&bs, k, true, (size_t)n * H * 192, -1.f, 1.f, 2));
    BK(st_cuda_fill_uniform(&bs, v, true, (size_t)n * H * 128, -1.f, 1.f, 3));
    double ms;
    BTIME(ms, 5, st_cuda_mla_prefill(&bs, o, q, k, v, T, n, H, 192, 128, 1.f / sqrtf(192.f)));
    double fl = 2.0 * H * ((double)T * (T + 1) / 2) * (192 + 128); /* causal pairs */
    printf("RESULT mla_prefill T=n=%d H=%d dqk=192 dv=128: %.3f ms, %.1f TFLOP/s (causal) = %.1f%% of GEMM ceiling\n",
           T, H, ms, fl / (ms * 1e9), 100.0 * fl / (ms * 1e9) / b_gemm_tflops);
    st_gpu_free(q), st_gpu_free(k), st_gpu_free(v), st_gpu_free(o);
}

int main(int argc, char **argv) {
    if (argc > 1) b_vmask = (int)strtol(argv[1], NULL, 0);
    if (argc > 2) b_dvar = atoi(argv[2]);
    if (argc > 3) b_kmask = (int)strtol(argv[3], NULL, 0);
    if (argc > 4) b_smask = (int)strtol(argv[4], NULL, 0);
    if (argc > 5) b_shmask = (int)strtol(argv[5], NULL, 0);
    bench_init("bench_gpu_moe_ffn", (b_smask & ~16) != 0);
    static const int shp[3][4] = {{64, 128, 1024, 512}, {64, 512, 1024, 512}, {16, 2048, 2048, 1024}};
    for (int i = 0; i < 3; i++)
        if ((b_smask & 16) && (b_shmask >> i & 1)) profile_ffn(shp[i][0], shp[i][1], shp[i][2], shp[i][3]);
    for (int i = 0; i < 3; i++)
        if ((b_smask & 1) && (b_shmask >> i & 1)) bench_ffn(shp[i][0], shp[i][1], shp[i][2], shp[i][3]);
    for (int i = 0; i < 3; i++)
        if ((b_smask & 2) && (b_shmask >> i & 1)) bench_ffn_variants(shp[i][0], shp[i][1], shp[i][2], shp[i][3]);
    for (int i = 0; i < 3; i++)
        if ((b_smask & 4) && (b_shmask >> i & 1)) bench_ffn_table(shp[i][0], shp[i][1], shp[i][2], shp[i][3]);
    if (b_smask & 32) {
        bench_slots(8, 512, 768);   /* small */
        bench_slots(4, 3584, 3072); /* k3-mini */
    }
    if (b_smask & 8) {
        bench_dispatch(256, 16, 896, 1024);
        bench_dispatch(8192, 16, 896, 1024);
        bench_mla_prefill(4096, 16);
        bench_mla_prefill(8192, 16);
    }
    return 0;
}
