/* Block AttnRes, two-phase form, on the GPU (SPEC §5), fp32: phase 1 scores the completed blocks
 * for all Q sublayer queries of a block set at once (online-softmax state per token and query),
 * phase 2 merges the current partial for one sublayer. The product's forms (one block per token, or
 * per token and query at decode sizes; rows held in registers): phase 1 over a strided block list with
 * the block push folded in, and phase 2 fused with the RMSNorm that follows it. The general phase 1
 * (a cluster of 8 blocks per token at decode sizes, cuBLAS score GEMMs + one block per token with many
 * tokens) is file-local: phase 1 with the push falls back to it where its own kernel does not apply
 * (no blocks, unaligned rows, large m·Q). CPU reference: st_attnres_phase1 / st_attnres_phase2
 * (kernels/attnres.c), st_rmsnorm (kernels/norm.c). */
#include <cooperative_groups.h>
#include <cublas_v2.h>

#include "cuda_common.cuh"

namespace cg = cooperative_groups;

#define AR_MMAX 64
#define AR_QMAX 64
#define AR_THREADS 256
#define AR_QC 8 /* queries per pass over a row */
#define AR_CL 8 /* blocks per token (a thread-block cluster): each owns a slice of d */

struct ArBlocks {
    const float *p[AR_MMAX];
};

/* Sum AR_QC+1 per-thread values over the block; red: (AR_QC+1)·8 floats; result in out[0..AR_QC]. */
__device__ __forceinline__ void ar_reduce(float v[AR_QC + 1], float *red, float *out) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
#pragma unroll
    for (int j = 0; j <= AR_QC; j++) {
        float x = st_warp_sum(v[j]);
        if (lane == 0) red[j * 8 + wid] = x;
    }
    __syncthreads();
    if (threadIdx.x <= AR_QC) {
        float x = 0.f;
        for (int w = 0; w < AR_THREADS / 32; w++) x += red[threadIdx.x * 8 + w];
        out[threadIdx.x] = x;
    }
    __syncthreads();
}

/* acc rows of token t (acc [T, Q, d]), columns c0 + tid, c0 + tid + AR_THREADS, … < c1: acc_q = Σ_i e[i·ew + q]·V_i
 * (e: the softmax numerators, in shared memory). blk is a __grid_constant__ kernel parameter (no copy). */
__device__ __forceinline__ void ar_mix(float *acc, const ArBlocks &blk, const float *e, int ew, int m, int Q,
                                       size_t t, int d, int c0, int c1) {
    for (int q0 = 0; q0 < Q; q0 += AR_QC)
        for (int c = c0 + (int)threadIdx.x; c < c1; c += AR_THREADS) {
            float a[AR_QC];
#pragma unroll
            for (int j = 0; j < AR_QC; j++) a[j] = 0.f;
            for (int i = 0; i < m; i++) {
                float v = blk.p[i][t * d + c];
#pragma unroll
                for (int j = 0; j < AR_QC; j++)
                    if (q0 + j < Q) a[j] += e[i * ew + q0 + j] * v;
            }
#pragma unroll
            for (int j = 0; j < AR_QC; j++)
                if (q0 + j < Q) acc[(t * Q + q0 + j) * d + c] = a[j];
        }
}

/* Phase 1. NOTE: a cluster of AR_CL blocks per token splits d into slices; each block reduces
 * its slice's Σ V_i² and Σ V_i·w_q for every (i, q) into shared memory, the cluster then sums the
 * AR_CL partials through distributed shared memory in rank order (deterministic), and each block
 * writes acc for its own slice. One block per token left too few blocks at decode (T = 32).
 * grid (AR_CL, T), AR_THREADS threads. */
__global__ void __cluster_dims__(AR_CL, 1, 1) __launch_bounds__(AR_THREADS)
    attnres_phase1_cl_kernel(float *stats, float *acc, const __grid_constant__ ArBlocks blk, int m, const float *w_eff, int Q, int d,
                          float eps) {
    __shared__ float part[AR_MMAX * (AR_QMAX + 1)]; /* [i][q], q = Q: Σ V² ; then totals, then weights */
    __shared__ float tot_s[AR_MMAX * (AR_QMAX + 1)];
    __shared__ float red[(AR_QC + 1) * 8];
    __shared__ float tot[AR_QC + 1];
    cg::cluster_group cl = cg::this_cluster();
    const int rank = (int)cl.block_rank(), t = blockIdx.y, tid = threadIdx.x;
    const int slice = ((d + AR_CL - 1) / AR_CL + 3) & ~3, c0 = rank * slice, c1 = min(d, c0 + slice);
    const int QW = Q + 1;
    for (int i = 0; i < m; i++) {
        const float *V = blk.p[i] + (size_t)t * d;
        for (int q0 = 0; q0 < Q; q0 += AR_QC) {
            float a[AR_QC + 1];
#pragma unroll
            for (int j = 0; j <= AR_QC; j++) a[j] = 0.f;
            for (int c = c0 + tid; c < c1; c += AR_THREADS) {
                float v = V[c];
                a[AR_QC] += v * v;
#pragma unroll
                for (int j = 0; j < AR_QC; j++)
                    if (q0 + j < Q) a[j] += v * w_eff[(size_t)(q0 + j) * d + c];
            }
            ar_reduce(a, red, tot);
            if (tid < AR_QC && q0 + tid < Q) part[i * QW + q0 + tid] = tot[tid];
            if (tid == AR_QC && q0 == 0) part[i * QW + Q] = tot[AR_QC];
        }
    }
    cl.sync();
    for (int k = tid; k < m * QW; k += AR_THREADS) {
        float x = 0.f;
        for (int r = 0; r < AR_CL; r++) x += cl.map_shared_rank(part, r)[k];
        tot_s[k] = x;
    }
    cl.sync(); /* every block has read every other block's partials */
    __syncthreads();
    if (tid < Q) {
        float mx = -INFINITY, sum = 0.f;
        for (int i = 0; i < m; i++) {
            float sc = tot_s[i * QW + tid] * rsqrtf(tot_s[i * QW + Q] / (float)d + eps);
            part[i * QW + tid] = sc;
            mx = fmaxf(mx, sc);
        }
        for (int i = 0; i < m; i++) {
            float e = expf(part[i * QW + tid] - mx);
            part[i * QW + tid] = e;
            sum += e;
        }
        if (rank == 0) {
            stats[((size_t)t * Q + tid) * 2] = mx;
            stats[((size_t)t * Q + tid) * 2 + 1] = sum;
        }
    }
    __syncthreads();
    ar_mix(acc, blk, part, QW, m, Q, t, d, c0, c1);
}

/* Phase 1 for many tokens. NOTE: the raw scores Σ_c V_i[t,c]·w_q[c] come from m fp32 cuBLAS
 * GEMMs written into acc itself, at acc[t, 0, i·Q + q] (m·Q ≤ d floats of token t's first acc
 * row); this kernel, one block per token, reads them into shared memory before its barrier and only
 * then overwrites that row, and no other block touches token t, so the scratch is race-free.
 * Σ V_i² by one warp per block i. grid T, AR_THREADS threads. */
__global__ void __launch_bounds__(AR_THREADS) attnres_phase1_tok_kernel(float *stats, float *acc,
                                                                         const __grid_constant__ ArBlocks blk, int m,
                                                                         int Q, int d, float eps) {
    __shared__ float sc[AR_MMAX * AR_QMAX];
    __shared__ float ss[AR_MMAX];
    const int t = blockIdx.x, tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
    float *accT = acc + (size_t)t * Q * d;
    for (int k = tid; k < m * Q; k += AR_THREADS) sc[k] = accT[k];
    for (int i = wid; i < m; i += AR_THREADS / 32) {
        const float *V = blk.p[i] + (size_t)t * d;
        float a = 0.f;
        for (int c = lane; c < d; c += 32) a += V[c] * V[c];
        a = st_warp_sum(a);
        if (lane == 0) ss[i] = a;
    }
    __syncthreads();
    if (tid < Q) {
        float mx = -INFINITY, sum = 0.f;
        for (int i = 0; i < m; i++) {
            float x = sc[i * Q + tid] * rsqrtf(ss[i] / (float)d + eps);
            sc[i * Q + tid] = x;
            mx = fmaxf(mx, x);
        }
        for (int i = 0; i < m; i++) {
            float e = expf(sc[i * Q + tid] - mx);
            sc[i * Q + tid] = e;
            sum += e;
        }
        stats[((size_t)t * Q + tid) * 2] = mx;
        stats[((size_t)t * Q + tid) * 2 + 1] = sum;
    }
    __syncthreads();
    ar_mix(acc, blk, sc, Q, m, Q, t, d, 0, d);
}

/* Which form: the cluster kernel fills the GPU at decode sizes; with many tokens one block per token
 * has enough blocks and the score GEMMs reuse w_eff across tokens (measured, docs/perf/history.md). */
static bool ar_cluster_p1(int T, int d) { return T <= 64 || (d >= 4096 && T <= 512); }

/* The general phase 1: blocks = host array of m device pointers, each [T, d] fp32; w_eff [Q, d] fp32 → stats
 * [T, Q, 2] fp32 (max score, Σ exp(s_i − max)) and acc [T, Q, d] fp32 (Σ exp(s_i − max) V_i); m may be 0
 * (stats = (−inf, 0), acc = 0). m ≤ 64, Q ≤ 64, T ≤ 65535. Same as st_attnres_phase1. */
static st_status_t ar_phase1(const st_gpu_stream_t *s, float *stats, float *acc, const float *const *blocks, int m,
                             const float *w_eff, int Q, int T, int d, float eps) {
    if (m < 0 || m > AR_MMAX || Q <= 0 || Q > AR_QMAX || T < 0 || T > 65535 || d <= 0 || (m > 0 && !blocks))
        return ST_FAIL(ST_ERR_INVALID_ARG, "attnres_phase1: m=%d (≤ %d) Q=%d (≤ %d) T=%d d=%d", m, AR_MMAX, Q,
                       AR_QMAX, T, d);
    if (!T) return ST_OK;
    ArBlocks b;
    for (int i = 0; i < AR_MMAX; i++) b.p[i] = i < m ? blocks[i] : nullptr;
    if (ar_cluster_p1(T, d) || m * Q > d) {
        attnres_phase1_cl_kernel<<<dim3(AR_CL, T), AR_THREADS, 0, ST_STREAM(s)>>>(stats, acc, b, m, w_eff, Q, d, eps);
        return ST_LAUNCH_OK("attnres_phase1_cl_kernel");
    }
    cublasHandle_t hd = (cublasHandle_t)s->cublas;
    const float one = 1.f, zero = 0.f;
    for (int i = 0; i < m; i++) { /* column-major C [Q, T] at acc + i·Q, ldc Q·d: C = w_effᵀ-rows · V_iᵀ */
        st_status_t rc = ST_CUBLAS_CHECK(cublasSgemm(hd, CUBLAS_OP_T, CUBLAS_OP_N, Q, T, d, &one, w_eff, d, blocks[i],
                                                     d, &zero, acc + (size_t)i * Q, Q * d));
        if (rc) return rc;
    }
    attnres_phase1_tok_kernel<<<T, AR_THREADS, 0, ST_STREAM(s)>>>(stats, acc, b, m, Q, d, eps);
    return ST_LAUNCH_OK("attnres_phase1_tok_kernel");
}

/* ------------------------------------------------------------------ the product's fused forms */
#define ARF_THREADS 256
#define ARF_IB 4 /* source blocks per pass over a row (scores) */

__device__ __forceinline__ float4 ar_ld4(const float *p) { return *reinterpret_cast<const float4 *>(p); }
__device__ __forceinline__ float ar_dot4(float4 a, float4 b) { return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w; }

/* Four values as bf16 to o (8 bytes) and, when lo is not NULL, the bf16 remainders v − bf16(v) to lo. */
__device__ __forceinline__ void ar_store_bf4(st_bf16_t *o, st_bf16_t *lo, float v0, float v1, float v2, float v3) {
    const float v[4] = {v0, v1, v2, v3};
    uint32_t hi2[2], lo2[2];
#pragma unroll
    for (int u = 0; u < 2; u++) {
        st_bf16_t b0 = st_tobf(v[2 * u]), b1 = st_tobf(v[2 * u + 1]);
        hi2[u] = (uint32_t)b0 | ((uint32_t)b1 << 16);
        lo2[u] = st_pack_bf2(v[2 * u] - st_bf(b0), v[2 * u + 1] - st_bf(b1));
    }
    *reinterpret_cast<uint2 *>(o) = make_uint2(hi2[0], hi2[1]);
    if (lo) *reinterpret_cast<uint2 *>(lo) = make_uint2(lo2[0], lo2[1]);
}

/* Block sum of four values; red: 4·32 floats (not reused before the next barrier). */
__device__ __forceinline__ float4 ar_block_sum4(float a, float b, float c, float d, float *red) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    a = st_warp_sum(a), b = st_warp_sum(b), c = st_warp_sum(c), d = st_warp_sum(d);
    if (lane == 0) red[wid] = a, red[32 + wid] = b, red[64 + wid] = c, red[96 + wid] = d;
    __syncthreads();
    float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int w = 0; w < nw; w++) s.x += red[w], s.y += red[32 + w], s.z += red[64 + w], s.w += red[96 + w];
    return s;
}

/* Block sum of two values; red: 2·32 floats (not reused before the next barrier). */
__device__ __forceinline__ float2 ar_block_sum2(float a, float b, float *red) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    a = st_warp_sum(a), b = st_warp_sum(b);
    if (lane == 0) red[wid] = a, red[32 + wid] = b;
    __syncthreads();
    float x = 0.f, y = 0.f;
    for (int w = 0; w < nw; w++) x += red[w], y += red[32 + w];
    return make_float2(x, y);
}

/* Phase 1 with the push: block (t, g) handles token t and queries [g·qpb, g·qpb + qpb) ∩ [0, Q)
 * (qpb < Q only with few tokens: more blocks and fewer reductions per block at decode sizes; each
 * group reads the source rows again, from L2). Thread j owns float4 columns j, j + nthreads, ...
 * Scores: for up to ARF_IB blocks and AR_QC queries at a time each thread sums V·w_q and V² over
 * its columns (w_q read once per group of blocks), warps reduce by shuffles into sred
 * [nwarps][m·(nq+1)], one barrier, then the per-warp sums are added in warp order (deterministic).
 * The newest block is read from `newest` and, by group 0, written to its list slot by the same
 * loads. smem: sred [nwarps·m·(qpb+1)], tot [m·(qpb+1)], e [m·qpb]. grid (T, ⌈Q/qpb⌉ (+ 1 with x)).
 * With x (st_attnres_xnorm_t), the last group mixes the m blocks for the one query x.w_q and writes
 * RMSNorm of the mix to x.xn (x.xlo) instead of stats/acc: the block-start norm in the same launch. */
__global__ void __launch_bounds__(ARF_THREADS) attnres_phase1_push_kernel(float *stats, float *acc, float *blocks,
                                                                          size_t bstride, const float *newest, int m,
                                                                          const float *w, int Q, int qpb, int d,
                                                                          float eps, st_attnres_xnorm_t x) {
    st_pdl_trigger(); /* the GEMM that reads xn may start loading its weights (skinny_kernel) */
    extern __shared__ float sh[];
    __shared__ float xsum, red[64];
    const bool xg = x.w_q && blockIdx.y == gridDim.y - 1; /* the block-start norm's group */
    const int qa = xg ? 0 : blockIdx.y * qpb, nql = xg ? 1 : min(qpb, Q - qa), QW = nql + 1;
    const float *wb = xg ? x.w_q : w + (size_t)qa * d;
    const int nw = blockDim.x >> 5, lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    float *sred = sh, *tot = sh + (size_t)nw * m * QW, *e = tot + m * QW;
    const size_t t = blockIdx.x, d4 = (size_t)d >> 2;
    const int nnew = newest ? m - 1 : m; /* blocks read from the list */
    const bool pusher = newest && blockIdx.y == 0;
    for (int i0 = 0; i0 < m; i0 += ARF_IB) {
        const int nb = min(ARF_IB, m - i0);
        const float *V[ARF_IB];
#pragma unroll
        for (int b = 0; b < ARF_IB; b++) {
            int i = i0 + (b < nb ? b : 0);
            V[b] = (i < nnew ? blocks + (size_t)i * bstride : newest) + t * d;
        }
        for (int q0 = 0; q0 < nql; q0 += AR_QC) { /* local query index */
            const int nq = min(AR_QC, nql - q0);
            float a[ARF_IB][AR_QC + 1];
#pragma unroll
            for (int b = 0; b < ARF_IB; b++)
#pragma unroll
                for (int j = 0; j <= AR_QC; j++) a[b][j] = 0.f;
            for (size_t c4 = threadIdx.x; c4 < d4; c4 += blockDim.x) {
                float4 wq[AR_QC];
#pragma unroll
                for (int j = 0; j < AR_QC; j++)
                    wq[j] = j < nq ? ar_ld4(wb + (size_t)(q0 + j) * d + 4 * c4) : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
                for (int b = 0; b < ARF_IB; b++) {
                    if (b >= nb) break;
                    float4 v = ar_ld4(V[b] + 4 * c4);
                    if (pusher && q0 == 0 && i0 + b >= nnew) /* the push: newest → its list slot */
                        *reinterpret_cast<float4 *>(blocks + (size_t)(m - 1) * bstride + t * d + 4 * c4) = v;
                    a[b][AR_QC] += ar_dot4(v, v);
#pragma unroll
                    for (int j = 0; j < AR_QC; j++) a[b][j] += ar_dot4(v, wq[j]);
                }
            }
#pragma unroll
            for (int b = 0; b < ARF_IB; b++) {
                if (b >= nb) break;
#pragma unroll
                for (int j = 0; j <= AR_QC; j++) {
                    /* NOTE: every sum unconditionally, so the compiler interleaves the independent
                     * shuffle chains; skipping the unused ones serialised them (measured: +25% at
                     * T = 8192, docs/perf/history.md) */
                    float x = st_warp_sum(a[b][j]);
                    if (lane == 0 && (j < nq || (j == AR_QC && q0 == 0)))
                        sred[((size_t)wid * m + i0 + b) * QW + (j == AR_QC ? nql : q0 + j)] = x;
                }
            }
        }
    }
    __syncthreads();
    for (int k = threadIdx.x; k < m * QW; k += blockDim.x) {
        float x = 0.f;
        for (int r = 0; r < nw; r++) x += sred[(size_t)r * m * QW + k];
        tot[k] = x;
    }
    __syncthreads();
    for (int ql = threadIdx.x; ql < nql; ql += blockDim.x) { /* NOTE: as st_attnres_phase1: max, then Σ exp */
        float mx = -INFINITY, sum = 0.f;
        for (int i = 0; i < m; i++) {
            float sc = tot[i * QW + ql] / sqrtf(tot[i * QW + nql] / (float)d + eps);
            e[i * nql + ql] = sc;
            mx = fmaxf(mx, sc);
        }
        for (int i = 0; i < m; i++) {
            float x = expf(e[i * nql + ql] - mx);
            e[i * nql + ql] = x;
            sum += x;
        }
        if (xg) {
            xsum = sum;
        } else {
            stats[(t * Q + qa + ql) * 2] = mx;
            stats[(t * Q + qa + ql) * 2 + 1] = sum;
        }
    }
    __syncthreads();
    if (xg) { /* h = Σ e_i V_i / Σ e_i, then RMSNorm: two passes over the (cached) rows */
        const float inv = 1.f / xsum;
        float ss = 0.f;
        for (int pass = 0; pass < 2; pass++) {
            const float rs = pass ? 1.f / sqrtf(ss / (float)d + x.eps) : 0.f;
            for (size_t c4 = threadIdx.x; c4 < d4; c4 += blockDim.x) {
                float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
                for (int i = 0; i < m; i++) {
                    float4 v = ar_ld4((i < nnew ? blocks + (size_t)i * bstride : newest) + t * d + 4 * c4);
                    float ei = e[i];
                    o.x += ei * v.x, o.y += ei * v.y, o.z += ei * v.z, o.w += ei * v.w;
                }
                o.x *= inv, o.y *= inv, o.z *= inv, o.w *= inv;
                if (!pass) {
                    ss += ar_dot4(o, o);
                    continue;
                }
                const float4 w4 = ar_ld4(x.norm_w + 4 * c4);
                ar_store_bf4(x.xn + t * d + 4 * c4, x.xlo ? x.xlo + t * d + 4 * c4 : nullptr, o.x * rs * w4.x,
                             o.y * rs * w4.y, o.z * rs * w4.z, o.w * rs * w4.w);
            }
            if (!pass) ss = ar_block_sum2(ss, 0.f, red).x;
        }
        return;
    }
    float *accT = acc + (t * Q + qa) * d;
    for (int q0 = 0; q0 < nql; q0 += AR_QC) {
        const int nq = min(AR_QC, nql - q0);
        for (size_t c4 = threadIdx.x; c4 < d4; c4 += blockDim.x) {
            float4 o[AR_QC];
#pragma unroll
            for (int j = 0; j < AR_QC; j++) o[j] = make_float4(0.f, 0.f, 0.f, 0.f);
            for (int i = 0; i < m; i++) {
                float4 v = ar_ld4((i < nnew ? blocks + (size_t)i * bstride : newest) + t * d + 4 * c4);
#pragma unroll
                for (int j = 0; j < AR_QC; j++) {
                    float x = j < nq ? e[i * nql + q0 + j] : 0.f;
                    o[j].x += x * v.x, o[j].y += x * v.y, o[j].z += x * v.z, o[j].w += x * v.w;
                }
            }
#pragma unroll
            for (int j = 0; j < AR_QC; j++)
                if (j < nq) *reinterpret_cast<float4 *>(accT + (size_t)(q0 + j) * d + 4 * c4) = o[j];
        }
    }
}

static size_t ar_push_smem(int m, int qpb) {
    return ((size_t)(ARF_THREADS / 32) * m * (qpb + 1) + (size_t)m * (qpb + 1) + (size_t)m * qpb) * 4;
}
/* Queries per block when the caller leaves it to us. NOTE: measured on an H200 (docs/perf/history.md): a
 * block is latency-bound (~5 µs), so one query per block pays only while all T·Q blocks run in one
 * wave (2 blocks per SM) — at T = 1 (d 1024: 7.2 → 6.7 µs; d 7168, m 12: 49.6 → 45.5 µs) and at
 * T = 32 with short rows (d 1024: 7.4 → 7.0 µs) — and costs a second wave beyond (T 64–256: 6–8 →
 * 11–13 µs at d 1024) or re-reads of long rows (d 7168, T 32: 50.7 → 55.8 µs). */
static int ar_push_qpb(int T, int Q, int m, int d) {
    long blocks = (long)T * Q;
    bool split = blocks <= 132 || (blocks <= 264 && (long)m * d <= 16384);
    return split ? 1 : Q;
}

extern "C" st_status_t st_cuda_attnres_phase1_push(const st_gpu_stream_t *s, float *stats, float *acc, float *blocks,
                                                   size_t bstride, const float *newest, int m, const float *w_eff,
                                                   int Q, int T, int d, float eps, int qpb,
                                                   const st_attnres_xnorm_t *x) {
    if (m < 0 || m > AR_MMAX || Q <= 0 || Q > AR_QMAX || T < 0 || d <= 0 || (newest && m == 0) ||
        (m > 0 && !blocks) || ((m > 1 || (m == 1 && !newest)) && bstride < (size_t)T * d) || qpb < 0)
        return ST_FAIL(ST_ERR_INVALID_ARG, "attnres_phase1_push: m=%d (≤ %d) Q=%d (≤ %d) T=%d d=%d bstride=%zu qpb=%d",
                       m, AR_MMAX, Q, AR_QMAX, T, d, bstride, qpb);
    if (x && (!x->w_q || !x->norm_w || !x->xn || m == 0))
        return ST_FAIL(ST_ERR_INVALID_ARG, "attnres_phase1_push: the block-start norm needs w_q, norm_w, xn and m ≥ 1 "
                       "(m=%d)", m);
    if (!T) return ST_OK;
    qpb = qpb == 0 ? ar_push_qpb(T, Q + (x ? 1 : 0), m, d) : ST_MIN(qpb, Q);
    size_t sm = ar_push_smem(m, qpb);
    bool vec = d % 4 == 0 && ((uintptr_t)blocks | (uintptr_t)newest | (uintptr_t)w_eff | (uintptr_t)acc) % 16 == 0 &&
               bstride % 4 == 0 &&
               (!x || ((uintptr_t)x->w_q | (uintptr_t)x->norm_w | (uintptr_t)x->xn | (uintptr_t)x->xlo) % 16 == 0);
    if (m == 0 || !vec || sm > 48 * 1024) { /* the general launchers, the push as a copy first */
        const float *bp[AR_MMAX];
        for (int i = 0; i < m; i++) bp[i] = blocks + (size_t)i * bstride;
        if (newest) {
            st_status_t rc = ST_CUDA_CHECK(cudaMemcpyAsync(blocks + (size_t)(m - 1) * bstride, newest,
                                                           (size_t)T * d * sizeof(float), cudaMemcpyDeviceToDevice,
                                                           ST_STREAM(s)));
            if (rc) return rc;
        }
        if (x) { /* the norm first, stats/acc as its scratch: blocks 0 … m − 2 mixed with block m − 1 as the partial */
            st_status_t rc = m > 1 ? ar_phase1(s, stats, acc, bp, m - 1, x->w_q, 1, T, d, eps) : ST_OK;
            if (!rc)
                rc = st_cuda_attnres_phase2_rmsnorm(s, x->xn, x->xlo, bp[m - 1], m > 1 ? stats : NULL, acc, x->w_q, 0,
                                                    1, x->norm_w, NULL, T, d, eps, x->eps);
            if (rc) return rc;
        }
        return ar_phase1(s, stats, acc, bp, m, w_eff, Q, T, d, eps);
    }
    int th = (int)ST_MIN((size_t)ARF_THREADS, ((size_t)d / 4 + 31) / 32 * 32);
    const st_attnres_xnorm_t none = {0};
    dim3 grid(T, (Q + qpb - 1) / qpb + (x ? 1 : 0));
    attnres_phase1_push_kernel<<<grid, th, sm, ST_STREAM(s)>>>(stats, acc, blocks, bstride, newest, m, w_eff, Q, qpb, d,
                                                              eps, x ? *x : none);
    return ST_LAUNCH_OK("attnres_phase1_push_kernel");
}

/* Phase 2 + RMSNorm, one block per output row, NV float4 columns per thread held in registers:
 * one read of the partial and acc rows, one block reduction (Σ P², Σ P·w_q, Σ a², Σ a·P; Σ h² follows;
 * a plain RMSNorm: Σ h²). NOTE: with PF every load (the phase-1 stats and the norm weights too) is
 * issued before the reduction, so the AttnRes part adds no reduction and no dependent memory latency
 * to a plain RMSNorm — for few
 * rows (latency-bound); the registers it takes cost occupancy with many rows (bandwidth-bound), so
 * there the stats and weights are read where they are used (measured, docs/perf/history.md). */
template <int NV, bool PF>
__global__ void __launch_bounds__(ARF_THREADS) attnres_p2norm_kernel(st_bf16_t *xn, st_bf16_t *xlo,
                                                                     const float *partial, const float *stats,
                                                                     const float *acc, const float *wq, int q, int Q,
                                                                     const float *nw, const int *rows, int d,
                                                                     float ar_eps, float eps) {
    st_pdl_trigger(); /* the GEMM that reads xn may start loading its weights (skinny_kernel) */
    __shared__ float red1[128], red2[64];
    const size_t i = blockIdx.x, r = rows ? (size_t)rows[i] : i;
    const int d4 = d >> 2;
    const float *P = partial + r * d;
    const float4 z4 = make_float4(0.f, 0.f, 0.f, 0.f);
    float4 h[NV], nw4[NV];
#pragma unroll
    for (int k = 0; k < NV; k++) {
        int c4 = threadIdx.x + k * blockDim.x;
        h[k] = c4 < d4 ? ar_ld4(P + 4 * c4) : z4;
        if (PF) nw4[k] = c4 < d4 ? ar_ld4(nw + 4 * c4) : z4;
    }
    float rs;
    if (stats) {
        const float *A = acc + (r * Q + q) * d;
        float2 st = make_float2(0.f, 0.f);
        if (PF) st = *reinterpret_cast<const float2 *>(stats + (r * Q + q) * 2);
        float4 a[NV];
        float pp = 0.f, pw = 0.f, aa = 0.f, ap = 0.f;
#pragma unroll
        for (int k = 0; k < NV; k++) {
            int c4 = threadIdx.x + k * blockDim.x;
            float4 w4 = c4 < d4 ? ar_ld4(wq + 4 * c4) : z4;
            a[k] = c4 < d4 ? ar_ld4(A + 4 * c4) : z4;
            pp += ar_dot4(h[k], h[k]);
            pw += ar_dot4(h[k], w4);
            aa += ar_dot4(a[k], a[k]);
            ap += ar_dot4(a[k], h[k]);
        }
        /* NOTE: one block reduction: h = α·a + β·P, so Σh² = α²Σa² + 2αβΣa·P + β²ΣP² comes from the
         * same four sums as the score (α, β ≥ 0 softmax weights; the mix of residual-stream blocks does
         * not cancel to near zero, so no precision is lost); the second reduction was ~0.25 µs of
         * latency per norm at decode */
        float4 sd = ar_block_sum4(pp, pw, aa, ap, red1);
        float sp = sd.y / sqrtf(sd.x / (float)d + ar_eps);
        if (!PF) st = make_float2(stats[(r * Q + q) * 2], stats[(r * Q + q) * 2 + 1]);
        float mx = fmaxf(st.x, sp), cb = expf(st.x - mx), cp = expf(sp - mx);
        float inv = 1.f / (st.y * cb + cp), al = cb * inv, be = cp * inv;
#pragma unroll
        for (int k = 0; k < NV; k++) {
            h[k].x = (a[k].x * cb + cp * h[k].x) * inv, h[k].y = (a[k].y * cb + cp * h[k].y) * inv;
            h[k].z = (a[k].z * cb + cp * h[k].z) * inv, h[k].w = (a[k].w * cb + cp * h[k].w) * inv;
        }
        float hh = fmaxf(al * al * sd.z + 2.f * al * be * sd.w + be * be * sd.x, 0.f);
        rs = 1.f / sqrtf(hh / (float)d + eps);
    } else {
        float ss = 0.f;
#pragma unroll
        for (int k = 0; k < NV; k++) ss += ar_dot4(h[k], h[k]);
        rs = 1.f / sqrtf(ar_block_sum2(ss, 0.f, red2).x / (float)d + eps);
    }
    st_bf16_t *o = xn + i * d, *lo = xlo ? xlo + i * d : nullptr;
#pragma unroll
    for (int k = 0; k < NV; k++) {
        int c4 = threadIdx.x + k * blockDim.x;
        if (c4 >= d4) break;
        const float4 w4 = PF ? nw4[k] : ar_ld4(nw + 4 * c4);
        ar_store_bf4(o + 4 * c4, lo ? lo + 4 * c4 : nullptr, h[k].x * rs * w4.x, h[k].y * rs * w4.y,
                     h[k].z * rs * w4.z, h[k].w * rs * w4.w);
    }
}

/* Any d (no alignment): h staged in shared memory [d]. */
__global__ void __launch_bounds__(ARF_THREADS) attnres_p2norm_any_kernel(st_bf16_t *xn, st_bf16_t *xlo,
                                                                         const float *partial, const float *stats,
                                                                         const float *acc, const float *wq, int q,
                                                                         int Q, const float *nw, const int *rows,
                                                                         int d, float ar_eps, float eps) {
    extern __shared__ float h[];
    __shared__ float red1[64], red2[64];
    const size_t i = blockIdx.x, r = rows ? (size_t)rows[i] : i;
    const float *P = partial + r * d;
    if (stats) {
        float ss = 0.f, dot = 0.f;
        for (int c = threadIdx.x; c < d; c += blockDim.x) ss += P[c] * P[c], dot += P[c] * wq[c];
        float2 sd = ar_block_sum2(ss, dot, red1);
        float sp = sd.y / sqrtf(sd.x / (float)d + ar_eps);
        const float *st = stats + (r * Q + q) * 2;
        const float *a = acc + (r * Q + q) * d;
        float mx = fmaxf(st[0], sp), cb = expf(st[0] - mx), cp = expf(sp - mx);
        float inv = 1.f / (st[1] * cb + cp);
        for (int c = threadIdx.x; c < d; c += blockDim.x) h[c] = (a[c] * cb + cp * P[c]) * inv;
    } else {
        for (int c = threadIdx.x; c < d; c += blockDim.x) h[c] = P[c];
    }
    float ss = 0.f;
    for (int c = threadIdx.x; c < d; c += blockDim.x) ss += h[c] * h[c]; /* own elements only: no barrier needed */
    float rs = 1.f / sqrtf(ar_block_sum2(ss, 0.f, red2).x / (float)d + eps);
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
        float v = h[c] * rs * nw[c];
        st_bf16_t b = st_tobf(v);
        xn[i * d + c] = b;
        if (xlo) xlo[i * d + c] = st_tobf(v - st_bf(b));
    }
}

extern "C" st_status_t st_cuda_attnres_phase2_rmsnorm(const st_gpu_stream_t *s, st_bf16_t *xn, st_bf16_t *xlo,
                                                      const float *partial, const float *stats, const float *acc,
                                                      const float *w_eff_q, int q, int Q, const float *norm_w,
                                                      const int *rows, int n_rows, int d, float ar_eps,
                                                      float norm_eps) {
    if (n_rows < 0 || d <= 0 || !norm_w || (stats && (!acc || !w_eff_q || q < 0 || q >= Q)))
        return ST_FAIL(ST_ERR_INVALID_ARG, "attnres_phase2_rmsnorm: n_rows=%d d=%d q=%d Q=%d", n_rows, d, q, Q);
    if (!n_rows) return ST_OK;
    bool vec = d % 4 == 0 && ((uintptr_t)xn | (uintptr_t)partial | (uintptr_t)acc | (uintptr_t)w_eff_q |
                              (uintptr_t)norm_w | (uintptr_t)(xlo ? xlo : xn)) % 16 == 0 && (uintptr_t)stats % 8 == 0 &&
               d <= 8 * 4 * ARF_THREADS;
    if (!vec) {
        attnres_p2norm_any_kernel<<<n_rows, ARF_THREADS, (size_t)d * sizeof(float), ST_STREAM(s)>>>(
            xn, xlo, partial, stats, acc, w_eff_q, q, Q, norm_w, rows, d, ar_eps, norm_eps);
        return ST_LAUNCH_OK("attnres_p2norm_any_kernel");
    }
    int d4 = d / 4, th = ST_MIN(ARF_THREADS, (d4 + 31) / 32 * 32), nv = (d4 + th - 1) / th;
    /* prefetch where measured faster on an H200: d 1024 up to 256 rows, d 7168 up to 128 */
    bool pf = n_rows <= (nv <= 2 ? 256 : 128);
#define P2N(N)                                                                                                     \
    do {                                                                                                           \
        if (pf)                                                                                                    \
            attnres_p2norm_kernel<N, true><<<n_rows, th, 0, ST_STREAM(s)>>>(xn, xlo, partial, stats, acc, w_eff_q, \
                                                                            q, Q, norm_w, rows, d, ar_eps, norm_eps); \
        else                                                                                                       \
            attnres_p2norm_kernel<N, false><<<n_rows, th, 0, ST_STREAM(s)>>>(                                     \
                xn, xlo, partial, stats, acc, w_eff_q, q, Q, norm_w, rows, d, ar_eps, norm_eps);                   \
    } while (0)
    if (nv <= 1) P2N(1);
    else if (nv <= 2) P2N(2);
    else if (nv <= 4) P2N(4);
    else P2N(8);
#undef P2N
    return ST_LAUNCH_OK("attnres_p2norm_kernel");
}
