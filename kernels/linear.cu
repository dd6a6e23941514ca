/* Linear layer on the GPU: y = x·Wᵀ, bf16 in, fp32 accumulate. cuBLAS, and for decode-sized T
 * (≤ SK_MAX_T tokens) a skinny kernel that streams W once at close to the copy
 * bandwidth. CPU: kernels/linear.c. */
#include <cublas_v2.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_common.cuh"

/* ------------------------------------------------------------------ skinny (decode) linear
 * One block per 16 rows of W (the mma's M), SK_WARPS warps splitting K in 32-wide steps, all of a
 * warp's W loads issued before its MMAs. Tokens are the mma's N (8 per n-tile, NT tiles).
 * NOTE: k is permuted consistently in A and B, so both load 16 contiguous bytes per thread: thread
 * (g = lane/4, c = lane%4) loads W rows n0+g and n0+g+8 and x row t at k = kb + 8c .. kb + 8c + 7;
 * elements 0–3 feed the first m16n8k16 (slots 2c, 2c+1 and 2c+8, 2c+9), elements 4–7 the second.
 * The warps' partial sums meet in shared memory and are added in warp order: deterministic. */
#define SK_WARPS 8
/* NOTE: where the skinny kernel is faster (bench_gpu_linear, graph replays on the H200): 1 token on the
 * small trunk's shapes (cuBLAS picks 7–10 µs kernels for some: 1.6–1.9× there, even on the rest); 16
 * tokens 1.3–1.8×; 32 tokens 0.8–1.2× alone, but the engine's decode step at batch 32 is 1.05× faster
 * with it (session 6, in-process A/B: one launch for several layers, weights prefetched under PDL); at
 * 64 tokens, and for large W (LM head, K3 widths) at any T, cuBLAS wins. So: up to SK_MAX_T tokens and
 * W up to SK_MAX_W elements. Launched with programmatic dependent launch (its first weight loads overlap
 * the end of the kernel before it when that kernel triggers early, st_pdl_trigger). */
#define SK_MAX_T 32
#define SK_MAX_W ((size_t)4 << 20)

/* 16 bytes through the read-only path, zeros where !ok (a predicated load, no branch) */
__device__ __forceinline__ uint4 sk_ld(const void *p, bool ok) {
    uint4 v;
    asm volatile("{\n .reg .pred q;\n setp.ne.b32 q, %5, 0;\n mov.b32 %0, 0;\n mov.b32 %1, 0;\n mov.b32 %2, 0;\n"
                 " mov.b32 %3, 0;\n @q ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n}\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p), "r"((int)ok));
    return v;
}

/* Up to ST_CUDA_LINEAR_MAX_SEG GEMMs that share x in one launch: segment i owns blocks blk[i] ..
 * blk[i+1]-1 (16 rows of its W each). */
struct sk_segs {
    const st_bf16_t *W[ST_CUDA_LINEAR_MAX_SEG];
    void *y[ST_CUDA_LINEAR_MAX_SEG];
    int N[ST_CUDA_LINEAR_MAX_SEG], ldy[ST_CUDA_LINEAR_MAX_SEG], f32[ST_CUDA_LINEAR_MAX_SEG];
    float beta[ST_CUDA_LINEAR_MAX_SEG];
    int blk[ST_CUDA_LINEAR_MAX_SEG + 1], n;
};

/* NOTE: all loads of a group of U k-steps (W and x) are written before its MMAs, so a group costs
 * about one memory round trip; U·(2 + NT) 16-byte registers per thread bound U. Measured: blocks of
 * 2–4 row blocks sharing x through L1, with K split over a cluster and reduced through distributed
 * shared memory, were no faster at 16–64 tokens (the time there is not x's L2 traffic). */
template <int NT>
__global__ void __launch_bounds__(32 * SK_WARPS) skinny_kernel(const __grid_constant__ sk_segs S, const st_bf16_t *x,
                                                               int ldx, int T, int K) {
    constexpr int U = NT >= 8 ? 2 : 4;
    __shared__ float red[SK_WARPS][16][NT * 8];
    int q = 0;
    while (q + 1 < S.n && (int)blockIdx.x >= S.blk[q + 1]) q++;
    const st_bf16_t *W = S.W[q];
    const int N = S.N[q];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int nw = blockDim.x >> 5, n0 = ((int)blockIdx.x - S.blk[q]) * 16;
    const int steps = (K + 31) >> 5, s0 = warp * steps / nw, s1 = (warp + 1) * steps / nw;
    /* rows past N read row N-1 (their sums are not stored); tokens past T read zeros */
    const uint4 *w0 = (const uint4 *)(W + (size_t)min(n0 + g, N - 1) * K);
    const uint4 *w1 = (const uint4 *)(W + (size_t)min(n0 + g + 8, N - 1) * K);
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    uint4 a0[U], a1[U];
    /* the first group's weights before the PDL wait: W is no earlier kernel's output, so these loads run
     * while the kernel that writes x finishes (launched with PDL, see skinny_run) */
#pragma unroll
    for (int u = 0; u < U; u++) {
        int k = (s0 + u) * 32 + 8 * c;
        bool ok = s0 + u < s1 && k < K;
        a0[u] = sk_ld(w0 + (ok ? k >> 3 : 0), ok);
        a1[u] = sk_ld(w1 + (ok ? k >> 3 : 0), ok);
    }
    st_pdl_trigger(); /* the next PDL kernel may start its own weight loads */
    st_pdl_wait();
    for (int st = s0; st < s1; st += U) {
        uint4 b[U][NT];
#pragma unroll
        for (int u = 0; u < U; u++) {
            int k = (st + u) * 32 + 8 * c;
            bool ok = st + u < s1 && k < K;
            if (st != s0) {
                a0[u] = sk_ld(w0 + (ok ? k >> 3 : 0), ok);
                a1[u] = sk_ld(w1 + (ok ? k >> 3 : 0), ok);
            }
#pragma unroll
            for (int j = 0; j < NT; j++) {
                int t = j * 8 + g;
                b[u][j] = sk_ld(x + (ok && t < T ? (size_t)t * ldx + k : 0), ok && t < T);
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            uint32_t A0[4] = {a0[u].x, a1[u].x, a0[u].y, a1[u].y}, A1[4] = {a0[u].z, a1[u].z, a0[u].w, a1[u].w};
#pragma unroll
            for (int j = 0; j < NT; j++) {
                uint32_t B0[2] = {b[u][j].x, b[u][j].y}, B1[2] = {b[u][j].z, b[u][j].w};
                st_mma16816(acc[j], A0, B0);
                st_mma16816(acc[j], A1, B1);
            }
        }
    }
    /* c[0..1] = C[row g][tokens 2c, 2c+1], c[2..3] = C[row g+8][same tokens] */
#pragma unroll
    for (int j = 0; j < NT; j++) {
        red[warp][g][j * 8 + 2 * c] = acc[j][0];
        red[warp][g][j * 8 + 2 * c + 1] = acc[j][1];
        red[warp][g + 8][j * 8 + 2 * c] = acc[j][2];
        red[warp][g + 8][j * 8 + 2 * c + 1] = acc[j][3];
    }
    __syncthreads();
    const float beta = S.beta[q];
    for (int i = threadIdx.x; i < 16 * NT * 8; i += blockDim.x) {
        int r = i & 15, t = i >> 4, n = n0 + r;
        if (t >= T || n >= N) continue;
        float v = 0.f;
        for (int w = 0; w < nw; w++) v += red[w][r][t];
        size_t o = (size_t)t * S.ldy[q] + n;
        if (S.f32[q]) {
            float *yp = (float *)S.y[q];
            yp[o] = beta != 0.f ? beta * yp[o] + v : v;
        } else {
            st_bf16_t *yp = (st_bf16_t *)S.y[q];
            yp[o] = st_tobf(beta != 0.f ? beta * st_bf(yp[o]) + v : v);
        }
    }
}

/* can the skinny kernel run this product (shape and alignment)? */
static bool skinny_ok(const void *x, int ldx, const void *W, int T, int N, int K) {
    return T >= 1 && T <= SK_MAX_T && N >= 1 && K >= 8 && K % 8 == 0 && ldx % 8 == 0 && ldx >= K &&
           ((uintptr_t)x & 15) == 0 && ((uintptr_t)W & 15) == 0;
}

/* Launched with programmatic dependent launch: the kernel's blocks may start once the previous kernel
 * in the stream has triggered (st_pdl_trigger, at the start of the engine's glue kernels) and load their
 * first weights while it finishes. */
static st_status_t skinny_run(const st_gpu_stream_t *s, const sk_segs &S, const st_bf16_t *x, int ldx, int T, int K) {
    int steps = (K + 31) / 32, nw = steps < SK_WARPS ? steps : SK_WARPS;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)S.blk[S.n]), cfg.blockDim = dim3(32 * nw), cfg.stream = ST_STREAM(s);
    cfg.attrs = at, cfg.numAttrs = 1;
    cudaError_t e = T <= 8    ? cudaLaunchKernelEx(&cfg, skinny_kernel<1>, S, x, ldx, T, K)
                    : T <= 16 ? cudaLaunchKernelEx(&cfg, skinny_kernel<2>, S, x, ldx, T, K)
                              : cudaLaunchKernelEx(&cfg, skinny_kernel<4>, S, x, ldx, T, K); /* T ≤ SK_MAX_T */
    st_status_t rc = ST_CUDA_CHECK(e);
    return rc ? rc : ST_LAUNCH_OK("skinny_kernel");
}

/* NOTE: when the skinny kernel runs a linear layer (SK_MAX_T, SK_MAX_W above) */
static bool skinny_pick(const void *x, int ldx, const void *W, int T, int N, int K) {
    return (size_t)N * K <= SK_MAX_W && skinny_ok(x, ldx, W, T, N, K);
}

extern "C" st_status_t st_cuda_linear_multi(const st_gpu_stream_t *s, const st_bf16_t *x, int ldx, int T, int K,
                                            const st_linear_seg_t *seg, int n) {
    if (n < 1 || n > ST_CUDA_LINEAR_MAX_SEG || T < 0)
        return ST_FAIL(ST_ERR_INVALID_ARG, "linear_multi: %d segments (1..%d), T=%d", n, ST_CUDA_LINEAR_MAX_SEG, T);
    bool one = T > 0;
    for (int i = 0; i < n && one; i++) one = skinny_pick(x, ldx, seg[i].W, T, seg[i].N, K) && seg[i].ldy >= seg[i].N;
    if (!one) { /* each on its own (cuBLAS, or the skinny kernel where it is picked) */
        for (int i = 0; i < n; i++) {
            st_status_t r = st_cuda_linear(s, seg[i].y, seg[i].ldy, seg[i].y_f32, seg[i].beta, x, ldx, seg[i].W, T,
                                              seg[i].N, K);
            if (r != ST_OK) return r;
        }
        return ST_OK;
    }
    sk_segs S = {};
    S.n = n, S.blk[0] = 0;
    for (int i = 0; i < n; i++) {
        S.W[i] = seg[i].W, S.y[i] = seg[i].y, S.N[i] = seg[i].N, S.ldy[i] = seg[i].ldy, S.f32[i] = seg[i].y_f32;
        S.beta[i] = seg[i].beta, S.blk[i + 1] = S.blk[i] + (seg[i].N + 15) / 16;
    }
    return skinny_run(s, S, x, ldx, T, K);
}

/* ------------------------------------------------------------------ cuBLAS */
extern "C" st_status_t st_cuda_linear(const st_gpu_stream_t *s, void *y, int ldy, bool y_f32, float beta,
                                      const st_bf16_t *x, int ldx, const st_bf16_t *W, int T, int N, int K) {
    if (T < 0 || N <= 0 || K <= 0 || ldx < K || ldy < N)
        return ST_FAIL(ST_ERR_INVALID_ARG, "linear: T=%d N=%d K=%d ldx=%d ldy=%d", T, N, K, ldx, ldy);
    if (T == 0) return ST_OK;
    if (skinny_pick(x, ldx, W, T, N, K) && ldy >= N) {
        sk_segs S = {};
        S.W[0] = W, S.y[0] = y, S.N[0] = N, S.ldy[0] = ldy, S.f32[0] = y_f32, S.beta[0] = beta;
        S.blk[0] = 0, S.blk[1] = (N + 15) / 16, S.n = 1;
        return skinny_run(s, S, x, ldx, T, K);
    }
    const float one = 1.f;
    // NOTE: cuBLAS is column-major. Row-major W [N,K] is col-major Wᵀ (K×N); row-major y [T,N] is
    // col-major yᵀ (N×T) = W · xᵀ, so C(N×T) = op_T(Wbuf) · xbuf with lda = K, ldb = ldx, ldc = ldy.
    return ST_CUBLAS_CHECK(cublasGemmEx((cublasHandle_t)s->cublas, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &one, W,
                                        CUDA_R_16BF, K, x, CUDA_R_16BF, ldx, &beta, y,
                                        y_f32 ? CUDA_R_32F : CUDA_R_16BF, ldy, CUBLAS_COMPUTE_32F,
                                        CUBLAS_GEMM_DEFAULT));
}

/* ------------------------------------------------------------------ fp32 and per-head (strided batched) GEMMs
 * of the GPU engine: plain cuBLAS calls, fp32 compute. CPU: st_sgemm, st_linear_heads (kernels/linear.c). */
extern "C" st_status_t st_cuda_sgemm(const st_gpu_stream_t *s, float *y, int ldy, const float *x, int ldx, const float *W,
                                int T, int N, int K) {
    if (T <= 0) return ST_OK;
    const float one = 1.f, zero = 0.f;
    return ST_CUBLAS_CHECK(cublasSgemm((cublasHandle_t)s->cublas, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &one, W, K, x, ldx,
                                       &zero, y, ldy));
}

extern "C" st_status_t st_cuda_linear_heads(const st_gpu_stream_t *s, void *y, bool y_f32, int ldy, long long sy,
                                       const st_bf16_t *x, int ldx, long long sx, const st_bf16_t *W, int ldw,
                                       long long sw, bool trans_w, int T, int N, int K, int H) {
    if (T <= 0) return ST_OK;
    const float one = 1.f, zero = 0.f;
    // col-major: y_hᵀ (N×T) = op(W_h)ᵀ-view (N×K) · x_hᵀ (K×T). W_h [K,N] row-major is col-major N×K
    // (op N, ld N); W_h [N,K] row-major is col-major K×N (op T, ld K).
    return ST_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        (cublasHandle_t)s->cublas, trans_w ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, N, T, K, &one, W, CUDA_R_16BF,
        ldw, sw, x, CUDA_R_16BF, ldx, sx, &zero, y, y_f32 ? CUDA_R_32F : CUDA_R_16BF, ldy, sy, H, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}
