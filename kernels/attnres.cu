/* Block AttnRes, two-phase form, on the GPU (SPEC §5), fp32: phase 1 scores the completed blocks
 * for all Q sublayer queries of a block set at once (online-softmax state per token and query),
 * phase 2 merges the current partial for one sublayer. Memory-bound; a cluster of 8 blocks per token
 * at decode sizes, one block per token (and cuBLAS score GEMMs for phase 1) with many tokens.
 * CPU reference: st_attnres_phase1 / st_attnres_phase2 (kernels/attnres.c). */
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

/* Phase 1. NOTE: a cluster of AR_CL blocks per token splits d into slices; each block reduces
 * its slice's Σ V_i² and Σ V_i·w_q for every (i, q) into shared memory, the cluster then sums the
 * AR_CL partials through distributed shared memory in rank order (deterministic), and each block
 * writes acc for its own slice. One block per token left too few blocks at decode (T = 32).
 * grid (AR_CL, T), AR_THREADS threads. */
__global__ void __cluster_dims__(AR_CL, 1, 1) __launch_bounds__(AR_THREADS)
    attnres_phase1_cl_kernel(float *stats, float *acc, ArBlocks blk, int m, const float *w_eff, int Q, int d,
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
    for (int q0 = 0; q0 < Q; q0 += AR_QC)
        for (int c = c0 + tid; c < c1; c += AR_THREADS) {
            float a[AR_QC];
#pragma unroll
            for (int j = 0; j < AR_QC; j++) a[j] = 0.f;
            for (int i = 0; i < m; i++) {
                float v = blk.p[i][(size_t)t * d + c];
#pragma unroll
                for (int j = 0; j < AR_QC; j++)
                    if (q0 + j < Q) a[j] += part[i * QW + q0 + j] * v;
            }
#pragma unroll
            for (int j = 0; j < AR_QC; j++)
                if (q0 + j < Q) acc[((size_t)t * Q + q0 + j) * d + c] = a[j];
        }
}

/* Phase 1 for many tokens. NOTE: the raw scores Σ_c V_i[t,c]·w_q[c] come from m fp32 cuBLAS
 * GEMMs written into acc itself, at acc[t, 0, i·Q + q] (m·Q ≤ d floats of token t's first acc
 * row); this kernel, one block per token, reads them into shared memory before its barrier and only
 * then overwrites that row, and no other block touches token t, so the scratch is race-free.
 * Σ V_i² by one warp per block i. grid T, AR_THREADS threads. */
__global__ void __launch_bounds__(AR_THREADS) attnres_phase1_tok_kernel(float *stats, float *acc, ArBlocks blk, int m,
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
    for (int q0 = 0; q0 < Q; q0 += AR_QC)
        for (int c = tid; c < d; c += AR_THREADS) {
            float a[AR_QC];
#pragma unroll
            for (int j = 0; j < AR_QC; j++) a[j] = 0.f;
            for (int i = 0; i < m; i++) {
                float v = blk.p[i][(size_t)t * d + c];
#pragma unroll
                for (int j = 0; j < AR_QC; j++)
                    if (q0 + j < Q) a[j] += sc[i * Q + q0 + j] * v;
            }
#pragma unroll
            for (int j = 0; j < AR_QC; j++)
                if (q0 + j < Q) accT[(size_t)(q0 + j) * d + c] = a[j];
        }
}

/* Which form: the cluster kernels fill the GPU at decode sizes; with many tokens one block per token
 * has enough blocks and the score GEMMs reuse w_eff across tokens (measured, docs/perf.md). */
static bool ar_cluster_p1(int T, int d) { return T <= 64 || (d >= 4096 && T <= 512); }
static bool ar_cluster_p2(int T, int d) { return d >= 4096 && T <= 64; }

extern "C" st_status_t st_cuda_attnres_phase1(const st_gpu_stream_t *s, float *stats, float *acc,
                                              const float *const *blocks, int m, const float *w_eff, int Q, int T,
                                              int d, float eps) {
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

/* Phase 2: a cluster of AR_CL blocks per token (d in slices, as phase 1) scores the partial
 * (Σ P·w_q and Σ P² summed over the cluster in rank order), rescales the block state and writes
 * out / out_bf for its slice. grid (AR_CL, T), AR_THREADS threads. */
__global__ void __cluster_dims__(AR_CL, 1, 1) __launch_bounds__(AR_THREADS)
    attnres_phase2_cl_kernel(float *out, st_bf16_t *out_bf, const float *partial, const float *stats, const float *acc,
                          const float *wq, int q, int Q, int d, float eps) {
    __shared__ float red[(AR_QC + 1) * 8];
    __shared__ float tot[AR_QC + 1];
    __shared__ float part[2];
    cg::cluster_group cl = cg::this_cluster();
    const int rank = (int)cl.block_rank(), t = blockIdx.y, tid = threadIdx.x;
    const int slice = ((d + AR_CL - 1) / AR_CL + 3) & ~3, c0 = rank * slice, c1 = min(d, c0 + slice);
    const float *P = partial + (size_t)t * d;
    float a[AR_QC + 1];
#pragma unroll
    for (int j = 0; j <= AR_QC; j++) a[j] = 0.f;
    for (int c = c0 + tid; c < c1; c += AR_THREADS) {
        float v = P[c];
        a[0] += v * wq[c];
        a[1] += v * v;
    }
    ar_reduce(a, red, tot);
    if (tid < 2) part[tid] = tot[tid];
    cl.sync();
    float dot = 0.f, ss = 0.f;
    for (int r = 0; r < AR_CL; r++) {
        const float *pr = cl.map_shared_rank(part, r);
        dot += pr[0];
        ss += pr[1];
    }
    cl.sync();
    float sp = dot * rsqrtf(ss / (float)d + eps);
    const float *st = stats + ((size_t)t * Q + q) * 2;
    float mx = fmaxf(st[0], sp);
    float cb = expf(st[0] - mx), cp = expf(sp - mx);
    float inv = 1.f / (st[1] * cb + cp);
    const float *A = acc + ((size_t)t * Q + q) * d;
    for (int c = c0 + tid; c < c1; c += AR_THREADS) {
        float o = (A[c] * cb + cp * P[c]) * inv;
        if (out) out[(size_t)t * d + c] = o;
        if (out_bf) out_bf[(size_t)t * d + c] = st_tobf(o);
    }
}

/* Phase 2, one block per token (many tokens). grid T, AR_THREADS threads. */
__global__ void __launch_bounds__(AR_THREADS) attnres_phase2_tok_kernel(float *out, st_bf16_t *out_bf,
                                                                         const float *partial, const float *stats,
                                                                         const float *acc, const float *wq, int q,
                                                                         int Q, int d, float eps) {
    __shared__ float red[(AR_QC + 1) * 8];
    __shared__ float tot[AR_QC + 1];
    const int t = blockIdx.x, tid = threadIdx.x;
    const float *P = partial + (size_t)t * d;
    float a[AR_QC + 1];
#pragma unroll
    for (int j = 0; j <= AR_QC; j++) a[j] = 0.f;
    for (int c = tid; c < d; c += AR_THREADS) {
        float v = P[c];
        a[0] += v * wq[c];
        a[1] += v * v;
    }
    ar_reduce(a, red, tot);
    float sp = tot[0] * rsqrtf(tot[1] / (float)d + eps);
    const float *st = stats + ((size_t)t * Q + q) * 2;
    float mx = fmaxf(st[0], sp);
    float cb = expf(st[0] - mx), cp = expf(sp - mx);
    float inv = 1.f / (st[1] * cb + cp);
    const float *A = acc + ((size_t)t * Q + q) * d;
    for (int c = tid; c < d; c += AR_THREADS) {
        float o = (A[c] * cb + cp * P[c]) * inv;
        if (out) out[(size_t)t * d + c] = o;
        if (out_bf) out_bf[(size_t)t * d + c] = st_tobf(o);
    }
}

extern "C" st_status_t st_cuda_attnres_phase2(const st_gpu_stream_t *s, float *out, st_bf16_t *out_bf,
                                              const float *partial, const float *stats, const float *acc,
                                              const float *w_eff_q, int q, int Q, int T, int d, float eps) {
    if (q < 0 || q >= Q || T < 0 || T > 65535 || d <= 0 || (!out && !out_bf))
        return ST_FAIL(ST_ERR_INVALID_ARG, "attnres_phase2: q=%d Q=%d T=%d d=%d", q, Q, T, d);
    if (!T) return ST_OK;
    if (ar_cluster_p2(T, d)) {
        attnres_phase2_cl_kernel<<<dim3(AR_CL, T), AR_THREADS, 0, ST_STREAM(s)>>>(out, out_bf, partial, stats, acc,
                                                                                  w_eff_q, q, Q, d, eps);
        return ST_LAUNCH_OK("attnres_phase2_cl_kernel");
    }
    attnres_phase2_tok_kernel<<<T, AR_THREADS, 0, ST_STREAM(s)>>>(out, out_bf, partial, stats, acc, w_eff_q, q, Q, d,
                                                                  eps);
    return ST_LAUNCH_OK("attnres_phase2_tok_kernel");
}
