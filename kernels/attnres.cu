/* Block AttnRes, two-phase form, on the GPU (SPEC §5), fp32: phase 1 scores the completed blocks
 * for all Q sublayer queries of a block set at once (online-softmax state per token and query),
 * phase 2 merges the current partial for one sublayer. Memory-bound; one block per token.
 * CPU reference: st_attnres_phase1 / st_attnres_phase2 (kernels/attnres.c). */
#include "cuda_common.cuh"

#define AR_MMAX 64
#define AR_QMAX 64
#define AR_THREADS 256
#define AR_QC 8 /* queries per pass over a row */

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

/* grid T, AR_THREADS threads. */
__global__ void __launch_bounds__(AR_THREADS) attnres_phase1_kernel(float *stats, float *acc, ArBlocks blk, int m,
                                                                     const float *w_eff, int Q, int d, float eps) {
    __shared__ float sc[AR_MMAX * AR_QMAX]; /* scores, then exp(s − max) */
    __shared__ float red[(AR_QC + 1) * 8];
    __shared__ float tot[AR_QC + 1];
    const int t = blockIdx.x, tid = threadIdx.x;
    for (int i = 0; i < m; i++) {
        const float *V = blk.p[i] + (size_t)t * d;
        float rs = 0.f;
        for (int q0 = 0; q0 < Q; q0 += AR_QC) {
            float a[AR_QC + 1];
#pragma unroll
            for (int j = 0; j <= AR_QC; j++) a[j] = 0.f;
            for (int c = tid; c < d; c += AR_THREADS) {
                float v = V[c];
                a[AR_QC] += v * v;
#pragma unroll
                for (int j = 0; j < AR_QC; j++)
                    if (q0 + j < Q) a[j] += v * w_eff[(size_t)(q0 + j) * d + c];
            }
            ar_reduce(a, red, tot);
            if (q0 == 0) rs = rsqrtf(tot[AR_QC] / (float)d + eps);
            if (tid < AR_QC && q0 + tid < Q) sc[i * Q + q0 + tid] = tot[tid] * rs;
        }
    }
    __syncthreads();
    if (tid < Q) {
        float mx = -INFINITY, sum = 0.f;
        for (int i = 0; i < m; i++) mx = fmaxf(mx, sc[i * Q + tid]);
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
                if (q0 + j < Q) acc[((size_t)t * Q + q0 + j) * d + c] = a[j];
        }
}

extern "C" st_status_t st_cuda_attnres_phase1(const st_gpu_stream_t *s, float *stats, float *acc,
                                              const float *const *blocks, int m, const float *w_eff, int Q, int T,
                                              int d, float eps) {
    if (m < 0 || m > AR_MMAX || Q <= 0 || Q > AR_QMAX || T < 0 || d <= 0 || (m > 0 && !blocks))
        return ST_FAIL(ST_ERR_INVALID_ARG, "attnres_phase1: m=%d (≤ %d) Q=%d (≤ %d) T=%d d=%d", m, AR_MMAX, Q,
                       AR_QMAX, T, d);
    if (!T) return ST_OK;
    ArBlocks b;
    for (int i = 0; i < AR_MMAX; i++) b.p[i] = i < m ? blocks[i] : nullptr;
    attnres_phase1_kernel<<<T, AR_THREADS, 0, ST_STREAM(s)>>>(stats, acc, b, m, w_eff, Q, d, eps);
    return ST_LAUNCH_OK("attnres_phase1_kernel");
}

/* grid T, AR_THREADS threads: score the partial, rescale the block state, write out / out_bf. */
__global__ void __launch_bounds__(AR_THREADS) attnres_phase2_kernel(float *out, st_bf16_t *out_bf,
                                                                     const float *partial, const float *stats,
                                                                     const float *acc, const float *wq, int q, int Q,
                                                                     int d, float eps) {
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
    if (q < 0 || q >= Q || T < 0 || d <= 0 || (!out && !out_bf))
        return ST_FAIL(ST_ERR_INVALID_ARG, "attnres_phase2: q=%d Q=%d T=%d d=%d", q, Q, T, d);
    if (!T) return ST_OK;
    attnres_phase2_kernel<<<T, AR_THREADS, 0, ST_STREAM(s)>>>(out, out_bf, partial, stats, acc, w_eff_q, q, Q, d, eps);
    return ST_LAUNCH_OK("attnres_phase2_kernel");
}
