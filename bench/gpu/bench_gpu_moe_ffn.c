/* Latent-MoE path and MLA prefill on the GPU: grouped expert FFN TFLOP/s at the torch._grouped_mm
 * peer shapes (bench/gpu/peers.py prints the peer in the same run), grouping / gather / combine /
 * quantile router times, MLA causal prefill TFLOP/s; next to the copy and GEMM ceilings. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"

/* argv[1]: sections (bit 0: the grouped FFN and the table mode, 1: decode-sized routed FFN, per slot vs
 * grouped, 2: dispatch and MLA prefill, 3: an expert server's dispatch node by node; default all);
 * argv[2]: which of the four FFN shapes (bit i: shape i; default all). Kernel variants are not switched
 * here: they are compared in kernels/dev programs (docs/kernels.md). */
static int b_smask = 0xf, b_shmask = 0xf;

/* E experts' weights w1, w3 [w, l] and w2 [l, w] bf16, uniform in ±0.03, and their device pointer
 * table [E][3] (the table mode's); freed with experts_free. */
typedef struct {
    st_bf16_t *w1, *w3, *w2;
    const st_bf16_t **d_tab;
} experts_t;
static experts_t experts_make(int E, int l, int w) {
    experts_t x = {bdev((size_t)E * w * l * 2), bdev((size_t)E * w * l * 2), bdev((size_t)E * l * w * 2), NULL};
    BK(st_cuda_fill_uniform(&bs, x.w1, true, (size_t)E * w * l, -0.03f, 0.03f, 2));
    BK(st_cuda_fill_uniform(&bs, x.w3, true, (size_t)E * w * l, -0.03f, 0.03f, 3));
    BK(st_cuda_fill_uniform(&bs, x.w2, true, (size_t)E * w * l, -0.03f, 0.03f, 4));
    const st_bf16_t **tab = malloc(sizeof *tab * 3 * E);
    for (int e = 0; e < E; e++)
        tab[3 * e] = x.w1 + (size_t)e * w * l, tab[3 * e + 1] = x.w3 + (size_t)e * w * l,
                tab[3 * e + 2] = x.w2 + (size_t)e * l * w;
    x.d_tab = bdev(sizeof *tab * 3 * E);
    BK(st_gpu_memcpy_h2d((void *)x.d_tab, tab, sizeof *tab * 3 * E));
    free(tab);
    return x;
}
static void experts_free(experts_t *x) {
    st_gpu_free(x->w1), st_gpu_free(x->w3), st_gpu_free(x->w2), st_gpu_free((void *)x->d_tab);
}

/* The grouped FFN as the engine runs it (stacked weights, st_cuda_moe_ffn) and the table mode as the
 * expert server runs it (a pointer table, st_cuda_moe_ffn_table: the default rule, and every expert
 * through cuBLAS for comparison), equal and uneven row counts; x uniform in ±1, weights ±0.03. */
static void bench_ffn(int E, int tpe, int l, int w) {
    int Nmax = E * tpe * 3 / 2;
    st_bf16_t *x = bdev((size_t)Nmax * l * 2);
    float *y = bdev((size_t)Nmax * l * 4);
    BK(st_cuda_fill_uniform(&bs, x, true, (size_t)Nmax * l, -1.f, 1.f, 1));
    experts_t X = experts_make(E, l, w);
    st_bf16_t *w1 = X.w1, *w3 = X.w3, *w2 = X.w2;
    const st_bf16_t **d_tab = X.d_tab;
    int *hoff = malloc(sizeof(int) * (E + 1)), *off = bdev(sizeof(int) * (E + 1));
    size_t wsb = st_cuda_moe_ffn_ws_bytes(Nmax, w), wsh = st_cuda_moe_ffn_table_ws_bytes(Nmax, w);
    void *ws = bdev(wsb), *wst = bdev(wsh);
    for (int uneven = 0; uneven < 2; uneven++) {
        hoff[0] = 0;
        int maxc = 0;
        for (int e = 0; e < E; e++) {
            int c = uneven ? tpe * (int[]){2, 6, 3, 5}[e % 4] / 4 : tpe;
            hoff[e + 1] = hoff[e] + c, maxc = c > maxc ? c : maxc;
        }
        BK(st_gpu_memcpy_h2d(off, hoff, sizeof(int) * (E + 1)));
        const int N = hoff[E];
        const double fl = 6.0 * N * l * w;
        const char *sh = uneven ? " uneven (0.5/1.5/0.75/1.25x)" : "";
        double ms;
        BTIME(ms, 20, st_cuda_moe_ffn(&bs, y, x, off, E, N, maxc, w1, w3, w2, l, w, true, 4.f, 25.f, ws, wsb));
        printf("RESULT moe_ffn E=%d x %d l=%d w=%d%s (SiTU fused): %.3f ms, %.1f TFLOP/s = %.1f%% of GEMM\n", E, tpe, l,
               w, sh, ms, fl / (ms * 1e9), 100.0 * fl / (ms * 1e9) / b_gemm_tflops);
        double wb = 6.0 * E * l * w; /* every expert's weights once, bytes */
        printf("RESULT moe_ffn_floor E=%d x %d l=%d w=%d%s: max(weights %.0f MB / copy, FLOP / GEMM) %.3f ms\n", E, tpe,
               l, w, sh, wb / 1e6, fmax(wb / (b_copy_gbs * 1e6), fl / (b_gemm_tflops * 1e9)));
        for (int minr = 0; minr < 2; minr++) { /* 0: the server's default rule; 1: every expert via cuBLAS */
            BTIME(ms, 20, st_cuda_moe_ffn_table(&bs, y, x, off, hoff, E, minr, d_tab, l, w, true, 4.f, 25.f, wst, wsh));
            printf("RESULT moe_ffn_table E=%d x %d l=%d w=%d%s, %s: %.3f ms, %.1f TFLOP/s\n", E, tpe, l, w, sh,
                   minr ? "all experts via cuBLAS" : "default rule", ms, fl / (ms * 1e9));
        }
    }
    st_gpu_free(x), st_gpu_free(y), st_gpu_free(off), st_gpu_free(ws), st_gpu_free(wst);
    experts_free(&X);
    free(hoff);
}

/* An expert server's dispatch as expert_server/compute_gpu.c queues it for T tokens routed to k of E
 * experts each (token t to (t + i·E/k) mod E, i < k): the tables up from pinned memory (one copy), the T distinct
 * bf16 rows expanded into the grouped order, the FFN in table mode, the summation tree into T output
 * rows. Each node alone (back to back), the four as one graph (back to back: the device's time), and
 * one replay from launch to the host's sync (what the server waits for a dispatch). */
static void bench_server(int T, int k, int E, int l, int w) {
    int n = T * k;
    st_bf16_t *rows = bdev((size_t)T * l * 2), *x = bdev((size_t)n * l * 2);
    float *y = bdev((size_t)n * l * 4), *out = bdev((size_t)T * l * 4);
    BK(st_cuda_fill_uniform(&bs, rows, true, (size_t)T * l, -1.f, 1.f, 1));
    experts_t X = experts_make(E, l, w);
    const st_bf16_t **d_tab = X.d_tab;
    /* grouped rows by expert, tokens ascending; the pinned block as the server lays it out:
     * offsets [E + 1] | loff [T + 1] | lrow [n] | lid [n] | lp [n] | src [n] */
    size_t words = (size_t)E + 1 + T + 1 + 4 * (size_t)n;
    uint32_t *h = NULL;
    BK(st_gpu_host_alloc((void **)&h, words * 4));
    uint32_t *hoff = h, *loff = hoff + E + 1, *lrow = loff + T + 1, *lid = lrow + n, *src = lid + 2 * (size_t)n;
    float *lp = (float *)(lid + n);
    int *hoff_i = calloc((size_t)E + 1, sizeof(int)), *fill = calloc((size_t)E, sizeof(int));
    for (int t = 0; t < T; t++)
        for (int i = 0; i < k; i++)
            hoff_i[(t + i * (E / k)) % E + 1]++;
    for (int e = 0; e < E; e++)
        hoff_i[e + 1] += hoff_i[e];
    for (int e = 0; e <= E; e++)
        hoff[e] = (uint32_t)hoff_i[e];
    for (int t = 0; t < T; t++) {
        loff[t] = (uint32_t)(t * k);
        int ex[64];
        for (int i = 0; i < k; i++)
            ex[i] = (t + i * (E / k)) % E;
        for (int a = 1; a < k; a++) /* ascending ids (the tree's leaf order) */
            for (int b = a; b > 0 && ex[b - 1] > ex[b]; b--) {
                int v = ex[b];
                ex[b] = ex[b - 1];
                ex[b - 1] = v;
            }
        for (int i = 0; i < k; i++) {
            int r = hoff_i[ex[i]] + fill[ex[i]]++;
            lrow[t * k + i] = (uint32_t)r, lid[t * k + i] = (uint32_t)ex[i], lp[t * k + i] = 1.f / (float)k;
            src[r] = (uint32_t)t;
        }
    }
    loff[T] = (uint32_t)n;
    uint32_t *d = bdev(words * 4);
    const uint32_t *d_loff = d + E + 1, *d_lrow = d_loff + T + 1, *d_lid = d_lrow + n, *d_src = d_lid + 2 * (size_t)n;
    const float *d_lp = (const float *)(d_lid + n);
    const int *d_off = (const int *)d;
    size_t wsh = st_cuda_moe_ffn_table_ws_bytes(n, w);
    void *ws = bdev(wsh);
    BK(st_gpu_memcpy_h2d(d, h, words * 4));
    bool rows_ffn = st_cuda_moe_ffn_slots_pick(n, E, l, w); /* the server's choice for n routed slots */
#define FFN()                                                                                                          \
    (rows_ffn ? st_cuda_moe_ffn_rows_table(&bs, y, (st_bf16_t *)ws, x, d_off, E, n, d_tab, l, w, true, 4.f, 25.f)      \
              : st_cuda_moe_ffn_table(&bs, y, x, d_off, hoff_i, E, 0, d_tab, l, w, true, 4.f, 25.f, ws, wsh))
    double ms[5], sum = 0;
    const char *what[5] = {"tables up", "expand", rows_ffn ? "FFN (per row)" : "FFN (table)", "tree",
                           "graph of the four"};
    BTIME(ms[0], 20, st_gpu_memcpy_async(&bs, d, h, words * 4, ST_GPU_COPY_H2D));
    BTIME(ms[1], 20, st_cuda_moe_expand(&bs, x, rows, true, d_src, n, T, l));
    BTIME(ms[2], 20, FFN());
    BTIME(ms[3], 20, st_cuda_moe_tree_reduce(&bs, out, y, d_loff, d_lrow, d_lid, d_lp, T, l));
    void *exec = NULL;
    BK(st_gpu_capture_begin(&bs));
    BK(st_gpu_memcpy_async(&bs, d, h, words * 4, ST_GPU_COPY_H2D));
    BK(st_cuda_moe_expand(&bs, x, rows, true, d_src, n, T, l));
    BK(FFN());
#undef FFN
    BK(st_cuda_moe_tree_reduce(&bs, out, y, d_loff, d_lrow, d_lid, d_lp, T, l));
    BK(st_gpu_capture_end(&bs, &exec));
    BTIME(ms[4], 20, st_gpu_graph_launch(exec, &bs));
    for (int i = 0; i < 4; i++)
        sum += ms[i];
    double lat[51];
    for (int r = 0; r < 51; r++) { /* one replay: launch, then the host's sync */
        double t0 = st_time_sec();
        BK(st_gpu_graph_launch(exec, &bs));
        BK(st_gpu_stream_sync(&bs));
        lat[r] = (st_time_sec() - t0) * 1e3;
    }
    b_sort(lat, 51);
    printf("server dispatch T=%d k=%d E=%d l=%d w=%d (%d pairs, %zu table bytes):", T, k, E, l, w, n, words * 4);
    for (int i = 0; i < 5; i++)
        printf(" %s %.1f us%s", what[i], ms[i] * 1e3, i < 4 ? "," : "");
    printf(
        "\nRESULT es_dispatch T=%d k=%d E=%d: graph %.1f us (nodes alone %.1f us), launch to sync %.1f us (median of "
        "51), FFN alone %.1f us\n",
        T, k, E, ms[4] * 1e3, sum * 1e3, lat[25] * 1e3, ms[2] * 1e3);
    st_gpu_graph_destroy(exec);
    st_gpu_free(rows), st_gpu_free(x), st_gpu_free(y), st_gpu_free(out), st_gpu_free(d), st_gpu_free(ws);
    experts_free(&X);
    st_gpu_host_free(h);
    free(hoff_i), free(fill);
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
    /* the full-width form: partial (u) += the tree of p·y over fp32 grouped rows */
    BTIME(ms, 10, st_cuda_moe_combine(&bs, NULL, NULL, u, yg, NULL, NULL, row, p, ids, cnt, NULL, T, k, l, 1e-5f));
    gb = (double)rows * l * 4 + (double)T * l * 8;
    printf("RESULT moe_combine T=%d l=%d (%ld rows): %.1f us, %.0f GB/s\n", T, l, rows, ms * 1e3, gb / (ms * 1e6));
    free(hc);
    st_gpu_free(ids), st_gpu_free(off), st_gpu_free(row), st_gpu_free(cnt), st_gpu_free(scores),
        st_gpu_free(sc0), st_gpu_free(tau), st_gpu_free(p), st_gpu_free(u), st_gpu_free(z), st_gpu_free(xg),
        st_gpu_free(yg);
}

/* Decode-sized routed FFN (argv[1] bit 1): the per-slot kernels (st_cuda_moe_ffn_slots) against the
 * grouped path (group + gather + st_cuda_moe_ffn, as the engine runs it) for T tokens of kc
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
            BK(st_cuda_moe_ffn(&bs, y, xg, off, E, T * kc, T, w1, w3, w2, l, w, true, 4.f, 25.f, fws, fwsb));
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
    if (argc > 1) b_smask = (int)strtol(argv[1], NULL, 0);
    if (argc > 2) b_shmask = (int)strtol(argv[2], NULL, 0);
    bench_init("bench_gpu_moe_ffn", 1);
    /* the torch._grouped_mm peer shapes, then small's routed experts at batch 256 (2 048 pairs over its
     * 64 experts: what the engine runs in one process and an expert server in two, weight-read bound) */
    static const int shp[4][4] = {
        {64, 128, 1024, 512}, {64, 512, 1024, 512}, {16, 2048, 2048, 1024}, {64, 32, 512, 768}};
    for (int i = 0; i < 4; i++)
        if ((b_smask & 1) && (b_shmask >> i & 1)) bench_ffn(shp[i][0], shp[i][1], shp[i][2], shp[i][3]);
    if (b_smask & 2) {
        bench_slots(8, 512, 768);   /* small */
        bench_slots(4, 3584, 3072); /* k3-mini */
    }
    if (b_smask & 4) {
        bench_dispatch(256, 16, 896, 1024);
        bench_dispatch(8192, 16, 896, 1024);
        bench_mla_prefill(4096, 16);
        bench_mla_prefill(8192, 16);
    }
    if (b_smask & 8) { /* small's routed experts at batch 1, 32, 256 */
        bench_server(1, 8, 64, 512, 768);
        bench_server(32, 8, 64, 512, 768);
        bench_server(256, 8, 64, 512, 768);
    }
    return 0;
}
