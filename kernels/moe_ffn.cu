/* Latent expert FFN on the GPU, grouped over experts (SPEC §6): y = w2 · act(w1 x, w3 x) for the
 * rows of each expert, as two grouped tensor-core GEMMs (mma.sync m16n8k16 bf16, fp32 accumulate,
 * 4-stage cp.async pipeline, 128×128×32 block tiles) with the SiTU/SiLU-GLU fused into the first
 * GEMM's epilogue; plus MXFP4 → bf16 weight conversion at load. Not wgmma (see docs/perf.md).
 * CPU reference: st_ffn per expert (kernels/ffn.c), st_weight_rows_f32 for MXFP4. */
#include <cublas_v2.h>

#include "cuda_common.cuh"

#define FB_M 128
#define FB_N 128 /* B-tile rows: 128 output columns, or 64 gate + 64 up columns in the GLU GEMM */
#define FB_K 32
#define FB_LD (FB_K + 8) /* 80-byte smem rows: ldmatrix rows land on distinct banks */
#define FB_ST 4
#define FB_THREADS 256
#define FB_SMEM (FB_ST * (FB_M + FB_N) * FB_LD * 2)


/* Tile table: one entry per (expert, 128-row tile), map [bound, 2] = (expert, first row); entries
 * past the total are (−1, 0) so surplus blocks exit. One block of 1024 threads. */
__global__ void ffn_tile_map_kernel(int *map, const int *offsets, int E, int bound, int big) {
    __shared__ int wsum[32];
    __shared__ int carry;
    if (threadIdx.x == 0) carry = 0;
    __syncthreads();
    for (int e0 = 0; e0 < E; e0 += 1024) {
        int e = e0 + threadIdx.x;
        int c = e < E ? offsets[e + 1] - offsets[e] : 0;
        int nt = c > 0 && c < big ? (c + FB_M - 1) / FB_M : 0; /* experts ≥ big rows: cuBLAS */
        int base = carry + st_block_scan_incl(nt, wsum) - nt;
        for (int j = 0; j < nt && base + j < bound; j++) {
            map[2 * (base + j)] = e;
            map[2 * (base + j) + 1] = offsets[e] + j * FB_M;
        }
        __syncthreads();
        if (threadIdx.x == 0) carry += wsum[31];
        __syncthreads();
    }
    for (int i = carry + threadIdx.x; i < bound; i += blockDim.x) map[2 * i] = -1, map[2 * i + 1] = 0;
}

/* C[rows of expert e, cols] = A[rows, K] · B_eᵀ, A row-major [N, K] bf16, B_e row-major [Nout, K].
 * GLU: B-tile rows 0..63 are w1_e rows n0.., rows 64..127 are w3_e rows n0..; warp wn's n8 tiles
 * 0,1 are gate columns and 2,3 the same up columns, so the epilogue pairs them in registers and
 * writes h = act(gate, up) [N, Nout] bf16. Plain: 128 output columns of w2_e, writes C bf16.
 * grid (tiles bound, ceil(Nout / (GLU ? 64 : 128))), 256 threads = 8 warps as 2 (M) × 4 (N),
 * warp tile 64 × 32. */
__device__ __forceinline__ void fb_st2(st_bf16_t *p, float a, float b) {
    *reinterpret_cast<uint32_t *>(p) = st_pack_bf2(a, b);
}
__device__ __forceinline__ void fb_st2(float *p, float a, float b) { *reinterpret_cast<float2 *>(p) = make_float2(a, b); }

/* SPEC §6 activation on fp32 gate a / up u (the fused epilogue and the hosted path's GLU kernel) */
__device__ __forceinline__ float ffn_act(float a, float u, int situ, float b1, float b2) {
    float sg = 1.f / (1.f + __expf(-a));
    return situ ? (b1 * tanhf(a / b1) * sg) * (b2 * tanhf(u / b2)) : a * sg * u;
}

/* TC: the output element (bf16; fp32 for the plain down GEMM of st_cuda_moe_ffn_f32out) */
template <bool GLU, typename TC = st_bf16_t>
__global__ void __launch_bounds__(FB_THREADS, 2)
    ffn_gemm_kernel(TC *__restrict__ C, const st_bf16_t *__restrict__ A, const st_bf16_t *__restrict__ B1,
                    const st_bf16_t *__restrict__ B3, const int *__restrict__ offsets, const int *__restrict__ map,
                    int Nout, int K, int situ, float b1, float b2, const st_bf16_t *const *__restrict__ tab,
                    int tab_off) {
    extern __shared__ __align__(16) unsigned char fb_smem[];
    st_bf16_t *As = reinterpret_cast<st_bf16_t *>(fb_smem);
    st_bf16_t *Bs = As + FB_ST * FB_M * FB_LD;
    const int e = map[2 * blockIdx.x];
    if (e < 0) return;
    const int m0 = map[2 * blockIdx.x + 1], m_end = offsets[e + 1];
    const int ncols = GLU ? FB_N / 2 : FB_N;
    const int n0 = blockIdx.y * ncols;
    const size_t bstride = (size_t)Nout * K;
    /* tab: per-expert weight blocks {w1, w3, w2} (st_cuda_moe_ffn_table_f32out), else stacked [E, Nout, K] */
    const st_bf16_t *Be1 = tab ? tab[3 * e + tab_off] : B1 + (size_t)e * bstride;
    const st_bf16_t *Be3 = GLU ? (tab ? tab[3 * e + 1] : B3 + (size_t)e * bstride) : nullptr;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wm = warp >> 2, wn = warp & 3;
    const int ktiles = (K + FB_K - 1) / FB_K;

    auto load = [&](int kt, int st) {
        const int k0 = kt * FB_K;
#pragma unroll
        for (int i = 0; i < 2; i++) { /* A: 128 rows × 4 chunks of 8 */
            int idx = tid + i * FB_THREADS, r = idx >> 2, ch = (idx & 3) * 8;
            int row = m0 + r;
            bool ok = row < m_end && k0 + ch < K;
            st_cp_async16(As + (st * FB_M + r) * FB_LD + ch, A + (size_t)(ok ? row : m0) * K + (ok ? k0 + ch : 0), ok);
        }
#pragma unroll
        for (int i = 0; i < 2; i++) { /* B: 128 rows × 4 chunks */
            int idx = tid + i * FB_THREADS, r = idx >> 2, ch = (idx & 3) * 8;
            const st_bf16_t *src;
            int n;
            if (GLU) {
                n = n0 + (r & 63);
                src = r < 64 ? Be1 : Be3;
            } else {
                n = n0 + r;
                src = Be1;
            }
            bool ok = n < Nout && k0 + ch < K;
            st_cp_async16(Bs + (st * FB_N + r) * FB_LD + ch, src + (size_t)(ok ? n : 0) * K + (ok ? k0 + ch : 0), ok);
        }
    };

    float acc[4][4][4];
#pragma unroll
    for (int a = 0; a < 4; a++)
#pragma unroll
        for (int b = 0; b < 4; b++) acc[a][b][0] = acc[a][b][1] = acc[a][b][2] = acc[a][b][3] = 0.f;

#pragma unroll
    for (int s = 0; s < FB_ST - 1; s++) {
        if (s < ktiles) load(s, s);
        asm volatile("cp.async.commit_group;\n" ::);
    }
    /* B rows of this warp's two n16 pairs */
    const int brow0 = GLU ? wn * 16 : wn * 32, brow1 = GLU ? 64 + wn * 16 : wn * 32 + 16;
    for (int kt = 0; kt < ktiles; kt++) {
        asm volatile("cp.async.wait_group %0;\n" ::"n"(FB_ST - 2));
        __syncthreads();
        if (kt + FB_ST - 1 < ktiles) load(kt + FB_ST - 1, (kt + FB_ST - 1) % FB_ST);
        asm volatile("cp.async.commit_group;\n" ::);
        const int st = kt % FB_ST;
        const st_bf16_t *Ast = As + st * FB_M * FB_LD, *Bst = Bs + st * FB_N * FB_LD;
#pragma unroll
        for (int kk = 0; kk < FB_K; kk += 16) {
            uint32_t af[4][4], bf[4][2];
#pragma unroll
            for (int mi = 0; mi < 4; mi++)
                st_ldsm4(af[mi], Ast + (wm * 64 + mi * 16 + (lane & 15)) * FB_LD + kk + (lane >> 4) * 8);
#pragma unroll
            for (int p = 0; p < 2; p++) {
                uint32_t r[4];
                int br = (p ? brow1 : brow0) + (lane & 7) + ((lane >> 4) << 3);
                st_ldsm4(r, Bst + br * FB_LD + kk + ((lane >> 3) & 1) * 8);
                bf[2 * p][0] = r[0], bf[2 * p][1] = r[1], bf[2 * p + 1][0] = r[2], bf[2 * p + 1][1] = r[3];
            }
#pragma unroll
            for (int mi = 0; mi < 4; mi++)
#pragma unroll
                for (int j = 0; j < 4; j++) st_mma16816(acc[mi][j], af[mi], bf[j]);
        }
    }
    asm volatile("cp.async.wait_group 0;\n" ::);

    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int mi = 0; mi < 4; mi++)
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            int row = m0 + wm * 64 + mi * 16 + g + hh * 8;
            if (row >= m_end) continue;
            if (GLU) {
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    int col = n0 + wn * 16 + j * 8 + 2 * t;
                    if (col >= Nout) continue;
                    float o[2];
#pragma unroll
                    for (int q = 0; q < 2; q++) {
                        o[q] = ffn_act(acc[mi][j][hh * 2 + q], acc[mi][j + 2][hh * 2 + q], situ, b1, b2);
                    }
                    /* Nout % 8 == 0 (checked), so col + 1 < Nout */
                    fb_st2(C + (size_t)row * Nout + col, o[0], o[1]);
                }
            } else {
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    int col = n0 + wn * 32 + j * 8 + 2 * t;
                    if (col >= Nout) continue;
                    fb_st2(C + (size_t)row * Nout + col, acc[mi][j][hh * 2], acc[mi][j][hh * 2 + 1]);
                }
            }
        }
}

static int ffn_tile_bound(int E, int N, int max_rows) {
    long a = (long)(N + FB_M - 1) / FB_M + E;
    long b = (long)E * ((max_rows + FB_M - 1) / FB_M);
    return (int)(a < b ? a : b);
}

extern "C" size_t st_cuda_moe_ffn_ws_bytes(int N, int w) {
    /* h [N, w] bf16, then the tile map (bound ≤ N/128 + 1 + E entries; E unknown here, so the
     * map is carved with room for N/128 + 1 + 4096 experts) */
    size_t h = ((size_t)N * w * 2 + 255) & ~(size_t)255;
    return h + (size_t)2 * sizeof(int) * ((size_t)(N + FB_M - 1) / FB_M + 1 + 4096);
}

static st_status_t ffn_set_attrs(void) {
    static bool attr_done = false; /* NOTE: idempotent; a race only repeats the calls */
    if (attr_done) return ST_OK;
    st_status_t rc = ST_CUDA_CHECK(
        cudaFuncSetAttribute(ffn_gemm_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, FB_SMEM));
    if (!rc)
        rc = ST_CUDA_CHECK(
            cudaFuncSetAttribute(ffn_gemm_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, FB_SMEM));
    if (!rc)
        rc = ST_CUDA_CHECK(cudaFuncSetAttribute(ffn_gemm_kernel<false, float>,
                                                cudaFuncAttributeMaxDynamicSharedMemorySize, FB_SMEM));
    if (!rc) attr_done = true;
    return rc;
}

/* The grouped mma.sync path over the experts with 1 ≤ rows < big (big = INT_MAX: all of them);
 * max_rows bounds those experts' rows. h: ws's first region, map: the tile map after it. */
template <typename TY>
static st_status_t ffn_grouped_launch(cudaStream_t cs, TY *y, st_bf16_t *h, int *map, const st_bf16_t *x,
                                      const int *offsets, int E, int N, int max_rows, int big, const st_bf16_t *w1,
                                      const st_bf16_t *w3, const st_bf16_t *w2, int l, int w, bool situ, float b1,
                                      float b2, const st_bf16_t *const *tab = nullptr) {
    st_status_t rc = ffn_set_attrs();
    if (rc) return rc;
    int bound = ffn_tile_bound(E, N, max_rows);
    ffn_tile_map_kernel<<<1, 1024, 0, cs>>>(map, offsets, E, bound, big);
    if ((rc = ST_LAUNCH_OK("ffn_tile_map_kernel"))) return rc;
    ffn_gemm_kernel<true><<<dim3(bound, (w + 63) / 64), FB_THREADS, FB_SMEM, cs>>>(h, x, w1, w3, offsets, map, w, l,
                                                                                   situ, b1, b2, tab, 0);
    if ((rc = ST_LAUNCH_OK("ffn_gemm_kernel<glu>"))) return rc;
    ffn_gemm_kernel<false, TY><<<dim3(bound, (l + 127) / 128), FB_THREADS, FB_SMEM, cs>>>(y, h, w2, nullptr, offsets,
                                                                                          map, l, w, 0, 0.f, 0.f, tab, 2);
    return ST_LAUNCH_OK("ffn_gemm_kernel<down>");
}

template <typename TY>
static st_status_t moe_ffn_any(const st_gpu_stream_t *s, TY *y, const st_bf16_t *x, const int *offsets, int E, int N,
                               int max_rows_per_expert, const st_bf16_t *w1, const st_bf16_t *w3, const st_bf16_t *w2,
                               int l, int w, bool situ, float b1, float b2, void *ws, size_t ws_bytes) {
    if (E <= 0 || E > 4096 || N < 0 || max_rows_per_expert < 0 || l <= 0 || w <= 0 || l % 8 || w % 8 ||
        ws_bytes < st_cuda_moe_ffn_ws_bytes(N, w))
        return ST_FAIL(ST_ERR_INVALID_ARG, "moe_ffn: E=%d N=%d max_rows=%d l=%d w=%d ws=%zu (need %zu)", E, N,
                       max_rows_per_expert, l, w, ws_bytes, st_cuda_moe_ffn_ws_bytes(N, w));
    if (!N || !max_rows_per_expert) return ST_OK;
    st_bf16_t *h = (st_bf16_t *)ws;
    int *map = (int *)((uint8_t *)ws + (((size_t)N * w * 2 + 255) & ~(size_t)255));
    return ffn_grouped_launch<TY>(ST_STREAM(s), y, h, map, x, offsets, E, N, max_rows_per_expert, 0x7fffffff, w1, w3,
                                  w2, l, w, situ, b1, b2);
}

extern "C" st_status_t st_cuda_moe_ffn(const st_gpu_stream_t *s, st_bf16_t *y, const st_bf16_t *x, const int *offsets,
                                       int E, int N, int max_rows_per_expert, const st_bf16_t *w1,
                                       const st_bf16_t *w3, const st_bf16_t *w2, int l, int w, bool situ, float b1,
                                       float b2, void *ws, size_t ws_bytes) {
    return moe_ffn_any<st_bf16_t>(s, y, x, offsets, E, N, max_rows_per_expert, w1, w3, w2, l, w, situ, b1, b2, ws,
                                  ws_bytes);
}

extern "C" st_status_t st_cuda_moe_ffn_f32out(const st_gpu_stream_t *s, float *y, const st_bf16_t *x,
                                              const int *offsets, int E, int N, int max_rows_per_expert,
                                              const st_bf16_t *w1, const st_bf16_t *w3, const st_bf16_t *w2, int l,
                                              int w, bool situ, float b1, float b2, void *ws, size_t ws_bytes) {
    return moe_ffn_any<float>(s, y, x, offsets, E, N, max_rows_per_expert, w1, w3, w2, l, w, situ, b1, b2, ws,
                              ws_bytes);
}

/* ---------------- hosted: big experts through cuBLAS ----------------
 * Routing rule (st_cuda_moe_ffn_hosted*; the row counts are on the host): an expert with
 * rows ≥ big goes to cuBLAS, every other non-empty expert to the grouped mma.sync kernels above
 * (their tile map skips the big ones; the two write disjoint rows of h and y). big = min_rows_cublas
 * if > 0, else st_cuda_moe_ffn_cublas_min_rows(ℓ, w), the smallest row count with rows·ℓ·w ≥ 2^30.
 * NOTE: why (H200, bench_gpu_moe_ffn): a cuBLAS call costs ~7 µs however small (64 experts × 2 calls
 * of 128 rows: 0.89 ms), and the calls go per run of adjacent experts with equal rows, so with uneven
 * counts each cuBLAS expert costs ~14 µs; under 6·2^30 FLOPs (~12 µs at ~550 TFLOP/s) its GEMMs take
 * less than that and the grouped kernels win.
 * The big experts run together, in three steps:
 *   (1) gate/up: per big expert e two GEMMs, gu[rows_e, 0:w] = x_e·w1_eᵀ and gu[rows_e, w:2w] =
 *       x_e·w3_eᵀ (bf16, row pitch 2w);
 *   (2) ONE GLU kernel over the rows of all big experts: h = act(gate, up) (bf16);
 *   (3) down: y_e = h_e·w2_eᵀ (bf16 or fp32).
 * How (1) and (3) are issued (variant): BATCHED (default): one cublasGemmBatchedEx per run of adjacent
 * big experts with equal rows (gate and up of all of them in one batch); STRIDED:
 * cublasGemmStridedBatchedEx per run (gate and up separately; no pointer arrays); PER_EXPERT: one
 * batched call per expert (gate+up as a batch of 2, then down). (cublasGemmGroupedBatchedEx was tried:
 * cuBLAS 13.1 runs it with sm80 warp-MMA kernels at ~280 TFLOP/s, refuses fp32 C, and compute-sanitizer
 * flags invalid writes inside it; so it is not used.)
 * The device pointer arrays and the big experts' row ranges live in ws and are written by one small
 * kernel from the device offsets (no host→device copy, no allocation). */
#define FH_MAXE 4096
#define FH_ALIGN(b) (((size_t)(b) + 255) & ~(size_t)255)
#define FH_VARIANT_DEFAULT ST_MOE_FFN_CUBLAS_VARIANT

extern "C" int st_cuda_moe_ffn_cublas_min_rows(int l, int w) {
    long lw = (long)(l > 0 ? l : 1) * (w > 0 ? w : 1);
    return (int)(((1L << 30) + lw - 1) / lw);
}

struct ffn_ptrs {
    const void **a13, **b13; /* [2·nb]: problem 2j = gate of big expert j, 2j+1 = up */
    void **c13;
    const void **a2, **b2; /* [nb]: down */
    void **c2;
    int *rr; /* [nb, 2]: rows r0, r1 of big expert j */
};

static ffn_ptrs ffn_ptrs_carve(void *p) {
    ffn_ptrs P;
    void **q = (void **)p;
    P.a13 = (const void **)q, P.b13 = (const void **)(q + 2 * FH_MAXE), P.c13 = q + 4 * FH_MAXE;
    P.a2 = (const void **)(q + 6 * FH_MAXE), P.b2 = (const void **)(q + 7 * FH_MAXE), P.c2 = q + 8 * FH_MAXE;
    P.rr = (int *)(q + 9 * FH_MAXE);
    return P;
}
#define FH_PTR_BYTES ((size_t)9 * FH_MAXE * sizeof(void *) + (size_t)2 * FH_MAXE * sizeof(int))

/* big expert j = expert e, rows r0 .. r0+c-1: its problems' pointers and its row range */
__host__ __device__ inline void ffn_ptrs_put(const ffn_ptrs &P, int j, int e, int r0, int c, const st_bf16_t *x,
                                             const st_bf16_t *w1, const st_bf16_t *w3, const st_bf16_t *w2,
                                             st_bf16_t *gu, st_bf16_t *h, unsigned char *y, int y_elt, int l, int w,
                                             const st_bf16_t *const *tab = nullptr) {
    const st_bf16_t *xe = x + (size_t)r0 * l;
    P.a13[2 * j] = tab ? tab[3 * e] : w1 + (size_t)e * w * l;
    P.a13[2 * j + 1] = tab ? tab[3 * e + 1] : w3 + (size_t)e * w * l;
    P.b13[2 * j] = xe, P.b13[2 * j + 1] = xe;
    P.c13[2 * j] = gu + (size_t)r0 * 2 * w, P.c13[2 * j + 1] = gu + (size_t)r0 * 2 * w + w;
    P.a2[j] = tab ? tab[3 * e + 2] : w2 + (size_t)e * l * w, P.b2[j] = h + (size_t)r0 * w;
    P.c2[j] = y + (size_t)r0 * l * y_elt;
    P.rr[2 * j] = r0, P.rr[2 * j + 1] = r0 + c;
}

/* One block of 1024 threads: rank j of each expert with rows ≥ big among those (expert order), then
 * its pointers. y_elt: bytes per y element (2 or 4). */
__global__ void ffn_cublas_ptrs_kernel(ffn_ptrs P, const int *offsets, int E, int big, const st_bf16_t *x,
                                       const st_bf16_t *w1, const st_bf16_t *w3, const st_bf16_t *w2, st_bf16_t *gu,
                                       st_bf16_t *h, unsigned char *y, int y_elt, int l, int w,
                                       const st_bf16_t *const *tab) {
    __shared__ int wsum[32];
    __shared__ int carry;
    if (threadIdx.x == 0) carry = 0;
    __syncthreads();
    for (int e0 = 0; e0 < E; e0 += 1024) {
        int e = e0 + threadIdx.x;
        int r0 = e < E ? offsets[e] : 0, c = e < E ? offsets[e + 1] - r0 : 0;
        int f = c > 0 && c >= big;
        int j = carry + st_block_scan_incl(f, wsum) - 1;
        if (f) ffn_ptrs_put(P, j, e, r0, c, x, w1, w3, w2, gu, h, y, y_elt, l, w, tab);
        __syncthreads();
        if (threadIdx.x == 0) carry += wsum[31];
        __syncthreads();
    }
}

/* h [rows, w] = act(gu[:, 0:w], gu[:, w:2w]) for the rows of big expert blockIdx.y; 8 columns a
 * thread (16-byte loads and stores; w % 8 == 0). */
__global__ void ffn_glu_rows_kernel(st_bf16_t *__restrict__ h, const st_bf16_t *__restrict__ gu,
                                    const int *__restrict__ rr, int w, int situ, float b1, float b2) {
    const int r0 = rr[2 * blockIdx.y], r1 = rr[2 * blockIdx.y + 1], w8 = w >> 3;
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    const long row = r0 + i / w8;
    if (row >= r1) return;
    const int c = (int)(i % w8) * 8;
    const uint4 ga = *reinterpret_cast<const uint4 *>(gu + row * 2 * w + c);
    const uint4 ua = *reinterpret_cast<const uint4 *>(gu + row * 2 * w + w + c);
    const uint32_t gv[4] = {ga.x, ga.y, ga.z, ga.w}, uv[4] = {ua.x, ua.y, ua.z, ua.w};
    uint32_t o[4];
#pragma unroll
    for (int q = 0; q < 4; q++) {
        float a0 = __uint_as_float(gv[q] << 16), a1 = __uint_as_float(gv[q] & 0xffff0000u);
        float u0 = __uint_as_float(uv[q] << 16), u1 = __uint_as_float(uv[q] & 0xffff0000u);
        o[q] = st_pack_bf2(ffn_act(a0, u0, situ, b1, b2), ffn_act(a1, u1, situ, b1, b2));
    }
    *reinterpret_cast<uint4 *>(h + row * w + c) = make_uint4(o[0], o[1], o[2], o[3]);
}

/* a run: big experts e0 .. e0+n-1 (adjacent expert ids, so their weights and rows are adjacent too),
 * ranks j0 .. j0+n-1, all with M rows */
struct ffn_run {
    int M, j0, n, e0;
};
/* Next run from expert *e on (rank *j); merge: adjacent big experts with equal rows form one run. */
static bool ffn_next_run(const int *oh, int E, int big, bool merge, int *e, int *j, ffn_run *r) {
    while (*e < E && (oh[*e + 1] - oh[*e] < big || oh[*e + 1] == oh[*e])) (*e)++;
    if (*e >= E) return false;
    r->M = oh[*e + 1] - oh[*e], r->j0 = *j, r->n = 0, r->e0 = *e;
    while (*e < E) {
        int c = oh[*e + 1] - oh[*e];
        if (c != r->M || (r->n && !merge)) break; /* c == M ≥ big ≥ 1: a big expert */
        r->n++, (*j)++, (*e)++;
    }
    return true;
}

/* One GEMM phase over all big experts. phase 0: gate/up (2 problems per expert), 1: down. */
static st_status_t ffn_cublas_phase(cublasHandle_t hd, int variant, int phase, const ffn_ptrs &P, const int *oh, int E,
                                    int big, const st_bf16_t *x, const st_bf16_t *w1, const st_bf16_t *w3,
                                    const st_bf16_t *w2, st_bf16_t *gu, st_bf16_t *h, void *y, bool y_f32, int l,
                                    int w) {
    const float one = 1.f, zero = 0.f;
    const int m = phase ? l : w, k = phase ? w : l, ldc = phase ? l : 2 * w, per = phase ? 1 : 2;
    const cudaDataType_t ct = phase && y_f32 ? CUDA_R_32F : CUDA_R_16BF;
    const size_t ye = y_f32 ? 4 : 2;
    const void **A = phase ? P.a2 : P.a13, **B = phase ? P.b2 : P.b13;
    void **C = phase ? P.c2 : P.c13;
    const bool merge = variant != ST_MOE_CUBLAS_PER_EXPERT;
    int e = 0, j = 0;
    ffn_run r;
    st_status_t rc;
    while (ffn_next_run(oh, E, big, merge, &e, &j, &r)) {
        if (variant == ST_MOE_CUBLAS_STRIDED) {
            const size_t r0 = (size_t)oh[r.e0];
            const long long sx = (long long)r.M * k; /* x_e or h_e: the run's experts are M rows apart */
            if (!phase) {
                for (int half = 0; half < 2; half++)
                    if ((rc = ST_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
                             hd, CUBLAS_OP_T, CUBLAS_OP_N, w, r.M, l, &one, (half ? w3 : w1) + (size_t)r.e0 * w * l,
                             CUDA_R_16BF, l, (long long)w * l, x + r0 * l, CUDA_R_16BF, l, sx, &zero,
                             gu + r0 * 2 * w + half * w, CUDA_R_16BF, 2 * w, (long long)r.M * 2 * w, r.n,
                             CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT))))
                        return rc;
            } else if ((rc = ST_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
                            hd, CUBLAS_OP_T, CUBLAS_OP_N, l, r.M, w, &one, w2 + (size_t)r.e0 * l * w, CUDA_R_16BF, w,
                            (long long)l * w, h + r0 * w, CUDA_R_16BF, w, sx, &zero, (char *)y + r0 * l * ye, ct, l,
                            (long long)r.M * l, r.n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT))))
                return rc;
            continue;
        }
        const int p0 = r.j0 * per;
        if ((rc = ST_CUBLAS_CHECK(cublasGemmBatchedEx(hd, CUBLAS_OP_T, CUBLAS_OP_N, m, r.M, k, &one, A + p0,
                                                      CUDA_R_16BF, k, B + p0, CUDA_R_16BF, k, &zero, C + p0, ct, ldc,
                                                      r.n * per, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT))))
            return rc;
    }
    return ST_OK;
}

extern "C" size_t st_cuda_moe_ffn_hosted_ws_bytes(int N, int w) {
    /* [h + tile map: st_cuda_moe_ffn_ws_bytes][gu [N, 2w] bf16][pointer arrays, row ranges], each
     * region 256-byte aligned (NOTE: the GLU kernel reads gu with 16-byte loads) */
    return FH_ALIGN(st_cuda_moe_ffn_ws_bytes(N, w)) + FH_ALIGN((size_t)N * 2 * w * 2) + FH_PTR_BYTES;
}

static st_status_t ffn_hosted_impl(const st_gpu_stream_t *s, void *y, bool y_f32, const st_bf16_t *x,
                                   const int *offsets, const int *offsets_host, int E, int min_rows_cublas,
                                   const st_bf16_t *w1, const st_bf16_t *w3, const st_bf16_t *w2,
                                   const st_bf16_t *const *tab, int l, int w, bool situ, float b1, float b2,
                                   int variant, void *ws, size_t ws_bytes) {
    if (E <= 0 || E > FH_MAXE || !offsets_host || offsets_host[0] != 0 || l <= 0 || w <= 0 || l % 8 || w % 8 ||
        variant < ST_MOE_CUBLAS_BATCHED || variant > ST_MOE_CUBLAS_PER_EXPERT || min_rows_cublas < 0 ||
        (tab && variant == ST_MOE_CUBLAS_STRIDED))
        return ST_FAIL(ST_ERR_INVALID_ARG, "moe_ffn_hosted: E=%d l=%d w=%d variant=%d min_rows=%d offsets_host[0]=%d",
                       E, l, w, variant, min_rows_cublas, offsets_host ? offsets_host[0] : -1);
    int N = offsets_host[E], big = min_rows_cublas > 0 ? min_rows_cublas : st_cuda_moe_ffn_cublas_min_rows(l, w);
    int max_small = 0, nb = 0, max_big = 0;
    for (int e = 0; e < E; e++) {
        int c = offsets_host[e + 1] - offsets_host[e];
        if (c < 0) return ST_FAIL(ST_ERR_INVALID_ARG, "moe_ffn_hosted: offsets decrease at expert %d", e);
        if (c >= big) nb++, max_big = c > max_big ? c : max_big;
        else if (c > max_small) max_small = c;
    }
    if (ws_bytes < st_cuda_moe_ffn_hosted_ws_bytes(N, w) || ((uintptr_t)ws & 255))
        return ST_FAIL(ST_ERR_INVALID_ARG, "moe_ffn_hosted: ws=%p, %zu bytes (need %zu, 256-byte aligned)", ws,
                       ws_bytes, st_cuda_moe_ffn_hosted_ws_bytes(N, w));
    if (!N) return ST_OK;
    st_bf16_t *h = (st_bf16_t *)ws;
    int *map = (int *)((uint8_t *)ws + (((size_t)N * w * 2 + 255) & ~(size_t)255));
    st_bf16_t *gu = (st_bf16_t *)((uint8_t *)ws + FH_ALIGN(st_cuda_moe_ffn_ws_bytes(N, w)));
    ffn_ptrs P = ffn_ptrs_carve((uint8_t *)gu + FH_ALIGN((size_t)N * 2 * w * 2));
    cudaStream_t cs = ST_STREAM(s);
    st_status_t rc;
    if (max_small > 0) {
        rc = y_f32 ? ffn_grouped_launch<float>(cs, (float *)y, h, map, x, offsets, E, N, max_small, big, w1, w3, w2, l,
                                               w, situ, b1, b2, tab)
                   : ffn_grouped_launch<st_bf16_t>(cs, (st_bf16_t *)y, h, map, x, offsets, E, N, max_small, big, w1,
                                                   w3, w2, l, w, situ, b1, b2, tab);
        if (rc) return rc;
    }
    if (!nb) return ST_OK;
    /* every variant: the GLU reads the row ranges */
    ffn_cublas_ptrs_kernel<<<1, 1024, 0, cs>>>(P, offsets, E, big, x, w1, w3, w2, gu, h, (unsigned char *)y,
                                               y_f32 ? 4 : 2, l, w, tab);
    if ((rc = ST_LAUNCH_OK("ffn_cublas_ptrs_kernel"))) return rc;
    cublasHandle_t hd = (cublasHandle_t)s->cublas;
    if ((rc = ffn_cublas_phase(hd, variant, 0, P, offsets_host, E, big, x, w1, w3, w2, gu, h, y, y_f32, l, w)))
        return rc;
    const long items = (long)max_big * (w / 8);
    ffn_glu_rows_kernel<<<dim3((unsigned)((items + 255) / 256), nb), 256, 0, cs>>>(h, gu, P.rr, w, situ, b1, b2);
    if ((rc = ST_LAUNCH_OK("ffn_glu_rows_kernel"))) return rc;
    return ffn_cublas_phase(hd, variant, 1, P, offsets_host, E, big, x, w1, w3, w2, gu, h, y, y_f32, l, w);
}

extern "C" st_status_t st_cuda_moe_ffn_hosted_ex(const st_gpu_stream_t *s, void *y, bool y_f32, const st_bf16_t *x,
                                                 const int *offsets, const int *offsets_host, int E,
                                                 int min_rows_cublas, const st_bf16_t *w1, const st_bf16_t *w3,
                                                 const st_bf16_t *w2, int l, int w, bool situ, float b1, float b2,
                                                 int variant, void *ws, size_t ws_bytes) {
    return ffn_hosted_impl(s, y, y_f32, x, offsets, offsets_host, E, min_rows_cublas, w1, w3, w2, nullptr, l, w, situ, b1,
                           b2, variant, ws, ws_bytes);
}

extern "C" st_status_t st_cuda_moe_ffn_table_f32out(const st_gpu_stream_t *s, float *y, const st_bf16_t *x,
                                                    const int *offsets, const int *offsets_host, int E,
                                                    int min_rows_cublas, const st_bf16_t *const *tab, int l, int w,
                                                    bool situ, float b1, float b2, void *ws, size_t ws_bytes) {
    if (!tab) return ST_FAIL(ST_ERR_INVALID_ARG, "moe_ffn_table: no weight table");
    return ffn_hosted_impl(s, y, true, x, offsets, offsets_host, E, min_rows_cublas, nullptr, nullptr, nullptr, tab, l,
                           w, situ, b1, b2, FH_VARIANT_DEFAULT, ws, ws_bytes);
}

extern "C" st_status_t st_cuda_moe_ffn_hosted(const st_gpu_stream_t *s, st_bf16_t *y, const st_bf16_t *x,
                                              const int *offsets, const int *offsets_host, int E, int min_rows_cublas,
                                              const st_bf16_t *w1, const st_bf16_t *w3, const st_bf16_t *w2, int l,
                                              int w, bool situ, float b1, float b2, void *ws, size_t ws_bytes) {
    return st_cuda_moe_ffn_hosted_ex(s, y, false, x, offsets, offsets_host, E, min_rows_cublas, w1, w3, w2, l, w, situ,
                                     b1, b2, FH_VARIANT_DEFAULT, ws, ws_bytes);
}

extern "C" st_status_t st_cuda_moe_ffn_hosted_f32out(const st_gpu_stream_t *s, float *y, const st_bf16_t *x,
                                                     const int *offsets, const int *offsets_host, int E,
                                                     int min_rows_cublas, const st_bf16_t *w1, const st_bf16_t *w3,
                                                     const st_bf16_t *w2, int l, int w, bool situ, float b1, float b2,
                                                     void *ws, size_t ws_bytes) {
    return st_cuda_moe_ffn_hosted_ex(s, y, true, x, offsets, offsets_host, E, min_rows_cublas, w1, w3, w2, l, w, situ,
                                     b1, b2, FH_VARIANT_DEFAULT, ws, ws_bytes);
}

/* ---------------- MXFP4 → bf16 ---------------- */
__constant__ float k_e2m1_dev[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
__global__ void mxfp4_to_bf16_kernel(st_bf16_t *out, const uint8_t *codes, const uint8_t *scale, int rows, int cols) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; /* one code byte = two columns */
    size_t half = (size_t)cols / 2;
    if (i >= (size_t)rows * half) return;
    size_t r = i / half, c = (i % half) * 2;
    uint8_t b = codes[i];
    int sc = (int)scale[r * (cols / 32) + c / 32] - 127;
    float lo = ldexpf(k_e2m1_dev[b & 7], sc), hi = ldexpf(k_e2m1_dev[(b >> 4) & 7], sc);
    if (b & 8) lo = -lo;
    if (b & 0x80) hi = -hi;
    *reinterpret_cast<uint32_t *>(out + r * cols + c) = st_pack_bf2(lo, hi);
}

extern "C" st_status_t st_cuda_mxfp4_to_bf16(const st_gpu_stream_t *s, st_bf16_t *out, const uint8_t *codes,
                                             const uint8_t *scale, int rows, int cols) {
    if (rows < 0 || cols <= 0 || cols % 32)
        return ST_FAIL(ST_ERR_INVALID_ARG, "mxfp4_to_bf16: rows=%d cols=%d (cols %% 32 == 0)", rows, cols);
    size_t n = (size_t)rows * cols / 2;
    if (!n) return ST_OK;
    mxfp4_to_bf16_kernel<<<(unsigned)((n + 255) / 256), 256, 0, ST_STREAM(s)>>>(out, codes, scale, rows, cols);
    return ST_LAUNCH_OK("mxfp4_to_bf16_kernel");
}
