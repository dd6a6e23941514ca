/* MoE-side ops on the GPU: sigmoid router with biased top-k selection (SPEC §7) and greedy argmax
 * sampling (SPEC §9). CPU references: st_router_sigmoid + st_route_topk, st_sample with temperature 0.
 * (The GLU activation runs inside the expert FFN kernels: kernels/moe_ffn.cu.) */
#include "cuda_common.cuh"

/* One warp per token. Each lane keeps its experts' biased scores (j = lane + 32 i, i < NPL) in
 * registers; k rounds of warp argmax over the untaken ones (ties → lower id); lane r keeps the r-th
 * choice, and the choices are written in ascending id order by rank. s [T, n] fp32 logits → sigmoid
 * written back. NPL = 0: any n, scores re-read from s each round (n > 1024). */
#define TOPK_MAX 32
template <int NPL>
__global__ void router_topk_kernel(int *ids, float *w, int ld, int *cnt, float *s, const float *bias, int T, int n,
                                   int k, int renorm, float scale) {
    int t = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (t >= T) return;
    float *st = s + (size_t)t * n;
    constexpr int R = NPL ? NPL : 1;
    float v[R];
#pragma unroll
    for (int i = 0; i < R; i++) v[i] = -INFINITY;
    if (NPL) {
#pragma unroll
        for (int i = 0; i < R; i++) {
            int j = lane + 32 * i;
            if (j < n) {
                float x = 1.f / (1.f + expf(-st[j]));
                st[j] = x;
                v[i] = x + (bias ? bias[j] : 0.f);
            }
        }
    } else {
        for (int j = lane; j < n; j += 32) st[j] = 1.f / (1.f + expf(-st[j]));
    }
    __syncwarp();
    uint32_t taken = 0; /* NPL: bit i = expert lane + 32 i chosen */
    int mine = 0x7fffffff;
    for (int r = 0; r < k; r++) {
        float best = -INFINITY;
        int bid = 0x7fffffff;
        if (NPL) {
#pragma unroll
            for (int i = 0; i < R; i++) {
                int j = lane + 32 * i;
                if (j < n && !(taken >> i & 1) && (bid == 0x7fffffff || v[i] > best)) best = v[i], bid = j;
            }
        } else {
            for (int j0 = 0; j0 < n; j0 += 32) { /* the same trip count in every lane (shuffles) */
                int j = j0 + lane;
                bool tk = j >= n;
                for (int q = 0; q < r; q++) tk |= __shfl_sync(0xffffffffu, mine, q) == j;
                float x = tk ? 0.f : st[j] + (bias ? bias[j] : 0.f);
                if (!tk && (bid == 0x7fffffff || x > best)) best = x, bid = j;
            }
        }
        for (int o = 16; o > 0; o >>= 1) {
            float ob = __shfl_xor_sync(0xffffffffu, best, o);
            int oi = __shfl_xor_sync(0xffffffffu, bid, o);
            if (oi != 0x7fffffff && (bid == 0x7fffffff || ob > best || (ob == best && oi < bid))) best = ob, bid = oi;
        }
        if (NPL && (bid & 31) == lane) taken |= 1u << (bid >> 5);
        if (lane == r) mine = bid;
    }
    int rank = 0;
    for (int q = 0; q < k; q++) rank += __shfl_sync(0xffffffffu, mine, q) < mine;
    int *row = ids + (size_t)t * ld;
    if (lane < k) row[rank] = mine;
    __syncwarp();
    /* NOTE: the sum in ascending id order, one after another, as the engine's route_finish (the
     * weights after a routing hook): bit-identical weights on both paths */
    float sum = 0.f;
    if (lane == 0)
        for (int i = 0; i < k; i++) sum += st[row[i]];
    sum = __shfl_sync(0xffffffffu, sum, 0);
    if (lane < k) {
        float ms = st[mine];
        w[(size_t)t * ld + rank] = (renorm ? ms / (sum + 1e-20f) : ms) * scale;
    }
    for (int i = k + lane; i < ld; i += 32) w[(size_t)t * ld + i] = 0.f;
    if (cnt && lane == 0) cnt[t] = k;
}

extern "C" st_status_t st_cuda_router_topk(const st_gpu_stream_t *s, int *ids, float *w, int ld, int *cnt,
                                           float *scores, const float *bias, int T, int n, int k, bool renorm,
                                           float scale) {
    if (T < 0 || n <= 0 || k <= 0 || k > TOPK_MAX || k > n || ld < k)
        return ST_FAIL(ST_ERR_INVALID_ARG, "router_topk: T=%d n=%d k=%d ld=%d (k ≤ %d, k ≤ ld)", T, n, k, ld, TOPK_MAX);
    if (!T) return ST_OK;
    dim3 grid((T + 3) / 4), block(128);
    if (n <= 64) router_topk_kernel<2><<<grid, block, 0, ST_STREAM(s)>>>(ids, w, ld, cnt, scores, bias, T, n, k, renorm, scale);
    else if (n <= 256) router_topk_kernel<8><<<grid, block, 0, ST_STREAM(s)>>>(ids, w, ld, cnt, scores, bias, T, n, k, renorm, scale);
    else if (n <= 1024) router_topk_kernel<32><<<grid, block, 0, ST_STREAM(s)>>>(ids, w, ld, cnt, scores, bias, T, n, k, renorm, scale);
    else router_topk_kernel<0><<<grid, block, 0, ST_STREAM(s)>>>(ids, w, ld, cnt, scores, bias, T, n, k, renorm, scale);
    return ST_LAUNCH_OK("router_topk_kernel");
}

/* one block per row: first index of the maximum (ties → lower id, like the CPU) */
__global__ void argmax_kernel(int *out, const float *logits, int V) {
    const float *x = logits + (size_t)blockIdx.x * V;
    float best = -INFINITY;
    int bid = 0x7fffffff;
    for (int j = threadIdx.x; j < V; j += blockDim.x)
        if (x[j] > best) best = x[j], bid = j; /* strided ascending: first max per thread */
    for (int o = 16; o > 0; o >>= 1) {
        float ob = __shfl_xor_sync(0xffffffffu, best, o);
        int oi = __shfl_xor_sync(0xffffffffu, bid, o);
        if (ob > best || (ob == best && oi < bid)) best = ob, bid = oi;
    }
    __shared__ float sb[32];
    __shared__ int si[32];
    int wv = threadIdx.x >> 5, l = threadIdx.x & 31;
    if (l == 0) sb[wv] = best, si[wv] = bid;
    __syncthreads();
    if (wv == 0) {
        best = l < (int)(blockDim.x >> 5) ? sb[l] : -INFINITY;
        bid = l < (int)(blockDim.x >> 5) ? si[l] : 0x7fffffff;
        for (int o = 16; o > 0; o >>= 1) {
            float ob = __shfl_xor_sync(0xffffffffu, best, o);
            int oi = __shfl_xor_sync(0xffffffffu, bid, o);
            if (ob > best || (ob == best && oi < bid)) best = ob, bid = oi;
        }
        if (l == 0) out[blockIdx.x] = bid == 0x7fffffff ? 0 : bid;
    }
}

extern "C" st_status_t st_cuda_argmax(const st_gpu_stream_t *s, int *ids, const float *logits, int T, int V) {
    if (T < 0 || V <= 0) return ST_FAIL(ST_ERR_INVALID_ARG, "argmax: T=%d V=%d", T, V);
    if (!T) return ST_OK;
    argmax_kernel<<<T, 512, 0, ST_STREAM(s)>>>(ids, logits, V);
    return ST_LAUNCH_OK("argmax_kernel");
}
