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

__device__ __forceinline__ void fb_cp16(void *dst, const void *src, bool valid) {
    unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void fb_ldsm4(uint32_t r[4], const st_bf16_t *p) {
    unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

/* Tile table: one entry per (expert, 128-row tile), map [bound, 2] = (expert, first row); entries
 * past the total are (−1, 0) so surplus blocks exit. One block of 1024 threads. */
__global__ void ffn_tile_map_kernel(int *map, const int *offsets, int E, int bound, int big) {
    __shared__ int wsum[32];
    __shared__ int carry;
    if (threadIdx.x == 0) carry = 0;
    __syncthreads();
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    for (int e0 = 0; e0 < E; e0 += 1024) {
        int e = e0 + threadIdx.x;
        int c = e < E ? offsets[e + 1] - offsets[e] : 0;
        int nt = c > 0 && c < big ? (c + FB_M - 1) / FB_M : 0; /* experts ≥ big rows: cuBLAS */
        int x = nt; /* inclusive warp scan */
        for (int o = 1; o < 32; o <<= 1) {
            int y = __shfl_up_sync(0xffffffffu, x, o);
            if (lane >= o) x += y;
        }
        if (lane == 31) wsum[wid] = x;
        __syncthreads();
        if (wid == 0) {
            int v = wsum[lane];
            for (int o = 1; o < 32; o <<= 1) {
                int y = __shfl_up_sync(0xffffffffu, v, o);
                if (lane >= o) v += y;
            }
            wsum[lane] = v;
        }
        __syncthreads();
        int base = carry + x - nt + (wid ? wsum[wid - 1] : 0);
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

/* TC: the output element (bf16; fp32 for the plain down GEMM of st_cuda_moe_ffn_f32out) */
template <bool GLU, typename TC = st_bf16_t>
__global__ void __launch_bounds__(FB_THREADS, 2)
    ffn_gemm_kernel(TC *__restrict__ C, const st_bf16_t *__restrict__ A, const st_bf16_t *__restrict__ B1,
                    const st_bf16_t *__restrict__ B3, const int *__restrict__ offsets, const int *__restrict__ map,
                    int Nout, int K, int situ, float b1, float b2) {
    extern __shared__ __align__(16) unsigned char fb_smem[];
    st_bf16_t *As = reinterpret_cast<st_bf16_t *>(fb_smem);
    st_bf16_t *Bs = As + FB_ST * FB_M * FB_LD;
    const int e = map[2 * blockIdx.x];
    if (e < 0) return;
    const int m0 = map[2 * blockIdx.x + 1], m_end = offsets[e + 1];
    const int ncols = GLU ? FB_N / 2 : FB_N;
    const int n0 = blockIdx.y * ncols;
    const size_t bstride = (size_t)Nout * K;
    const st_bf16_t *Be1 = B1 + (size_t)e * bstride;
    const st_bf16_t *Be3 = GLU ? B3 + (size_t)e * bstride : nullptr;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wm = warp >> 2, wn = warp & 3;
    const int ktiles = (K + FB_K - 1) / FB_K;

    auto load = [&](int kt, int st) {
        const int k0 = kt * FB_K;
#pragma unroll
        for (int i = 0; i < 2; i++) { /* A: 128 rows × 4 chunks of 8 */
            int idx = tid + i * FB_THREADS, r = idx >> 2, ch = (idx & 3) * 8;
            int row = m0 + r;
            bool ok = row < m_end && k0 + ch < K;
            fb_cp16(As + (st * FB_M + r) * FB_LD + ch, A + (size_t)(ok ? row : m0) * K + (ok ? k0 + ch : 0), ok);
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
            fb_cp16(Bs + (st * FB_N + r) * FB_LD + ch, src + (size_t)(ok ? n : 0) * K + (ok ? k0 + ch : 0), ok);
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
                fb_ldsm4(af[mi], Ast + (wm * 64 + mi * 16 + (lane & 15)) * FB_LD + kk + (lane >> 4) * 8);
#pragma unroll
            for (int p = 0; p < 2; p++) {
                uint32_t r[4];
                int br = (p ? brow1 : brow0) + (lane & 7) + ((lane >> 4) << 3);
                fb_ldsm4(r, Bst + br * FB_LD + kk + ((lane >> 3) & 1) * 8);
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
                        float a = acc[mi][j][hh * 2 + q], u = acc[mi][j + 2][hh * 2 + q];
                        float sg = 1.f / (1.f + __expf(-a));
                        o[q] = situ ? (b1 * tanhf(a / b1) * sg) * (b2 * tanhf(u / b2)) : a * sg * u;
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

template <typename TY>
static st_status_t moe_ffn_any(const st_gpu_stream_t *s, TY *y, const st_bf16_t *x, const int *offsets, int E, int N,
                               int max_rows_per_expert, const st_bf16_t *w1, const st_bf16_t *w3, const st_bf16_t *w2,
                               int l, int w, bool situ, float b1, float b2, void *ws, size_t ws_bytes) {
    if (E <= 0 || E > 4096 || N < 0 || max_rows_per_expert < 0 || l <= 0 || w <= 0 || l % 8 || w % 8 ||
        ws_bytes < st_cuda_moe_ffn_ws_bytes(N, w))
        return ST_FAIL(ST_ERR_INVALID_ARG, "moe_ffn: E=%d N=%d max_rows=%d l=%d w=%d ws=%zu (need %zu)", E, N,
                       max_rows_per_expert, l, w, ws_bytes, st_cuda_moe_ffn_ws_bytes(N, w));
    if (!N || !max_rows_per_expert) return ST_OK;
    static bool attr_done = false; /* NOTE: idempotent; a race only repeats the call */
    if (!attr_done) {
        st_status_t rc = ST_CUDA_CHECK(
            cudaFuncSetAttribute(ffn_gemm_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, FB_SMEM));
        if (!rc)
            rc = ST_CUDA_CHECK(
                cudaFuncSetAttribute(ffn_gemm_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, FB_SMEM));
        if (!rc)
            rc = ST_CUDA_CHECK(cudaFuncSetAttribute(ffn_gemm_kernel<false, float>,
                                                    cudaFuncAttributeMaxDynamicSharedMemorySize, FB_SMEM));
        if (rc) return rc;
        attr_done = true;
    }
    st_bf16_t *h = (st_bf16_t *)ws;
    int *map = (int *)((uint8_t *)ws + (((size_t)N * w * 2 + 255) & ~(size_t)255));
    int bound = ffn_tile_bound(E, N, max_rows_per_expert);
    cudaStream_t cs = ST_STREAM(s);
    ffn_tile_map_kernel<<<1, 1024, 0, cs>>>(map, offsets, E, bound, 0x7fffffff);
    st_status_t rc = ST_LAUNCH_OK("ffn_tile_map_kernel");
    if (rc) return rc;
    ffn_gemm_kernel<true><<<dim3(bound, (w + 63) / 64), FB_THREADS, FB_SMEM, cs>>>(h, x, w1, w3, offsets, map, w, l,
                                                                                   situ, b1, b2);
    if ((rc = ST_LAUNCH_OK("ffn_gemm_kernel<glu>"))) return rc;
    ffn_gemm_kernel<false, TY><<<dim3(bound, (l + 127) / 128), FB_THREADS, FB_SMEM, cs>>>(y, h, w2, nullptr, offsets,
                                                                                          map, l, w, 0, 0.f, 0.f);
    return ST_LAUNCH_OK("ffn_gemm_kernel<down>");
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

/* Hosted variant: experts with ≥ big rows run as cuBLAS GEMMs (gate and up into gu [rows, 2w],
 * st_cuda_glu, down), the rest through the grouped kernels (their tile map skips the big ones);
 * the two write disjoint rows of h and y. */
extern "C" size_t st_cuda_moe_ffn_hosted_ws_bytes(int N, int w) {
    return st_cuda_moe_ffn_ws_bytes(N, w) + (((size_t)N * 2 * w * 2 + 255) & ~(size_t)255);
}

extern "C" st_status_t st_cuda_moe_ffn_hosted(const st_gpu_stream_t *s, st_bf16_t *y, const st_bf16_t *x,
                                              const int *offsets, const int *offsets_host, int E, int min_rows_cublas,
                                              const st_bf16_t *w1, const st_bf16_t *w3, const st_bf16_t *w2, int l,
                                              int w, bool situ, float b1, float b2, void *ws, size_t ws_bytes) {
    if (E <= 0 || E > 4096 || !offsets_host || l <= 0 || w <= 0 || l % 8 || w % 8)
        return ST_FAIL(ST_ERR_INVALID_ARG, "moe_ffn_hosted: E=%d l=%d w=%d", E, l, w);
    int N = offsets_host[E], big = min_rows_cublas > 0 ? min_rows_cublas : 1024, max_small = 0, n_big = 0;
    if (ws_bytes < st_cuda_moe_ffn_hosted_ws_bytes(N, w))
        return ST_FAIL(ST_ERR_INVALID_ARG, "moe_ffn_hosted: ws=%zu (need %zu)", ws_bytes,
                       st_cuda_moe_ffn_hosted_ws_bytes(N, w));
    for (int e = 0; e < E; e++) {
        int c = offsets_host[e + 1] - offsets_host[e];
        if (c < 0) return ST_FAIL(ST_ERR_INVALID_ARG, "moe_ffn_hosted: offsets decrease at expert %d", e);
        if (c >= big) n_big++;
        else if (c > max_small) max_small = c;
    }
    if (!N) return ST_OK;
    st_bf16_t *h = (st_bf16_t *)ws;
    size_t hb = ((size_t)N * w * 2 + 255) & ~(size_t)255;
    int *map = (int *)((uint8_t *)ws + hb);
    st_bf16_t *gu = (st_bf16_t *)((uint8_t *)ws + st_cuda_moe_ffn_ws_bytes(N, w));
    cudaStream_t cs = ST_STREAM(s);
    st_status_t rc;
    if (max_small > 0) {
        static bool attr_done = false; /* NOTE: idempotent; a race only repeats the call */
        if (!attr_done) {
            rc = ST_CUDA_CHECK(
                cudaFuncSetAttribute(ffn_gemm_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, FB_SMEM));
            if (!rc)
                rc = ST_CUDA_CHECK(cudaFuncSetAttribute(ffn_gemm_kernel<false>,
                                                        cudaFuncAttributeMaxDynamicSharedMemorySize, FB_SMEM));
            if (rc) return rc;
            attr_done = true;
        }
        int bound = ffn_tile_bound(E, N, max_small);
        ffn_tile_map_kernel<<<1, 1024, 0, cs>>>(map, offsets, E, bound, big);
        if ((rc = ST_LAUNCH_OK("ffn_tile_map_kernel"))) return rc;
        ffn_gemm_kernel<true><<<dim3(bound, (w + 63) / 64), FB_THREADS, FB_SMEM, cs>>>(h, x, w1, w3, offsets, map, w,
                                                                                       l, situ, b1, b2);
        if ((rc = ST_LAUNCH_OK("ffn_gemm_kernel<glu>"))) return rc;
        ffn_gemm_kernel<false><<<dim3(bound, (l + 127) / 128), FB_THREADS, FB_SMEM, cs>>>(y, h, w2, nullptr, offsets,
                                                                                          map, l, w, 0, 0.f, 0.f);
        if ((rc = ST_LAUNCH_OK("ffn_gemm_kernel<down>"))) return rc;
    }
    if (!n_big) return ST_OK;
    cublasHandle_t hd = (cublasHandle_t)s->cublas;
    const float one = 1.f, zero = 0.f;
    for (int e = 0; e < E; e++) {
        int r0 = offsets_host[e], M = offsets_host[e + 1] - r0;
        if (M < big) continue;
        const st_bf16_t *xe = x + (size_t)r0 * l;
        st_bf16_t *gue = gu + (size_t)r0 * 2 * w, *he = h + (size_t)r0 * w;
        /* row-major Y[M, n] = X[M, k] · W[n, k]ᵀ is column-major Yᵀ = W_cmᵀ · X_cm */
        if ((rc = ST_CUBLAS_CHECK(cublasGemmEx(hd, CUBLAS_OP_T, CUBLAS_OP_N, w, M, l, &one, w1 + (size_t)e * w * l,
                                               CUDA_R_16BF, l, xe, CUDA_R_16BF, l, &zero, gue, CUDA_R_16BF, 2 * w,
                                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT))))
            return rc;
        if ((rc = ST_CUBLAS_CHECK(cublasGemmEx(hd, CUBLAS_OP_T, CUBLAS_OP_N, w, M, l, &one, w3 + (size_t)e * w * l,
                                               CUDA_R_16BF, l, xe, CUDA_R_16BF, l, &zero, gue + w, CUDA_R_16BF, 2 * w,
                                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT))))
            return rc;
        if ((rc = st_cuda_glu(s, he, gue, gue + w, M, w, 2 * w, situ, b1, b2))) return rc;
        if ((rc = ST_CUBLAS_CHECK(cublasGemmEx(hd, CUBLAS_OP_T, CUBLAS_OP_N, l, M, w, &one, w2 + (size_t)e * l * w,
                                               CUDA_R_16BF, w, he, CUDA_R_16BF, w, &zero, y + (size_t)r0 * l,
                                               CUDA_R_16BF, l, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT))))
            return rc;
    }
    return ST_OK;
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
