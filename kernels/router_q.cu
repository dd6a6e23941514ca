/* Quantile routing on the GPU (SPEC §7): σ(logits), experts with s ≥ τ, at most kmax of them by
 * the largest s − τ (ties → lower id), ids ascending, weights renormalised over the active set; with
 * the threshold counts of the quantile summaries (docs/quantile.md) made in the same pass.
 * CPU reference: st_router_sigmoid + st_route_quantile, st_route_count (kernels/router.c). */
#include "cuda_common.cuh"

#define RQ_KMAX 64
/* one warp per token. Pass 1 writes σ and compacts the active experts (s ≥ τ) in ascending id
 * order into a per-warp list (ballot + popc); usually ≤ kmax are active and the list is the answer.
 * Otherwise rounds of warp argmax of s − τ pick kmax (ties → lower id): over the list when it fit
 * (RQ_CAP), else over all n with a taken-bitmask.
 * COUNT: pass 1 also counts, while σ is in a register, the tokens at or above τ (and, with rho, in
 * the probe band) into the block's histogram in shared memory; the warps walk the tokens with a grid
 * stride, so a block counts several tokens, then adds each nonzero bin once into qc. Integer adds:
 * the totals do not depend on the order (the same integers as st_route_count). */
#define RQ_WARPS 4
#define RQ_NMAX 8192
#define RQ_CAP 1024
template <bool COUNT>
__global__ void router_quantile_kernel(int *ids, float *w, int *cnt, float *s, const float *tau, int T, int n, int kmax,
                                       int renorm, float scale, uint32_t *qc, const float *rho) {
    __shared__ unsigned taken_all[RQ_WARPS][RQ_NMAX / 32];
    __shared__ int sel_all[RQ_WARPS][RQ_KMAX];
    __shared__ int lid_all[RQ_WARPS][RQ_CAP];
    __shared__ float lkey_all[RQ_WARPS][RQ_CAP];
    extern __shared__ uint32_t hist[]; /* COUNT: [n] at τ, then [n] in the band (with rho) */
    const int wid = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (COUNT) {
        for (int j = threadIdx.x; j < (rho ? 2 * n : n); j += blockDim.x) hist[j] = 0u;
        __syncthreads();
    }
    unsigned *taken = taken_all[wid];
    int *sel = sel_all[wid], *lid = lid_all[wid];
    float *lkey = lkey_all[wid];
    /* NOTE: the trip count is warp-uniform (t depends on the warp only); no __syncthreads inside */
    for (int t = blockIdx.x * RQ_WARPS + wid; t < T; t += gridDim.x * RQ_WARPS) {
        float *st = s + (size_t)t * n;
        int A = 0; /* active count (warp-uniform) */
        for (int j0 = 0; j0 < n; j0 += 32) {
            int j = j0 + lane;
            bool act = false;
            float key = 0.f;
            if (j < n) {
                float sg = 1.f / (1.f + expf(-st[j])), tj = tau[j];
                st[j] = sg;
                act = sg >= tj; /* NOTE: false for a NaN score or τ, as the C twin */
                key = sg - tj;
                if (COUNT) { /* lanes hold distinct j: no conflict within the warp */
                    if (act) atomicAdd(hist + j, 1u);
                    if (rho && (sg >= rho[j]) != act) atomicAdd(hist + n + j, 1u);
                }
            }
            unsigned m = __ballot_sync(0xffffffffu, act);
            int pos = A + __popc(m & ((1u << lane) - 1u));
            if (act && pos < RQ_CAP) lid[pos] = j, lkey[pos] = key;
            A += __popc(m);
        }
        __syncwarp();
        int len = 0;
        if (A <= kmax) {
            for (int i = lane; i < A; i += 32) sel[i] = lid[i];
            len = A;
        } else if (A <= RQ_CAP) {
            for (; len < kmax; len++) {
                float best = -INFINITY;
                int bi = 0x7fffffff;
                for (int i = lane; i < A; i += 32) {
                    float kk = lkey[i];
                    if (kk > best) best = kk, bi = i; /* taken entries hold −inf; ascending i: first max kept */
                }
                for (int o = 16; o > 0; o >>= 1) {
                    float ob = __shfl_xor_sync(0xffffffffu, best, o);
                    int oi = __shfl_xor_sync(0xffffffffu, bi, o);
                    if (ob > best || (ob == best && oi < bi)) best = ob, bi = oi;
                }
                if (lane == 0) {
                    sel[len] = lid[bi];
                    lkey[bi] = -INFINITY;
                }
                __syncwarp();
            }
        } else {
            for (int j = lane; j < (n + 31) / 32; j += 32) taken[j] = 0u;
            __syncwarp();
            for (; len < kmax; len++) {
                float best = -INFINITY;
                int bid = 0x7fffffff;
                for (int j = lane; j < n; j += 32) {
                    float sj = st[j], tj = tau[j];
                    if (!(sj >= tj) || (taken[j >> 5] >> (j & 31)) & 1u) continue;
                    float key = sj - tj;
                    if (bid == 0x7fffffff || key > best) best = key, bid = j; /* ascending j: first max kept */
                }
                for (int o = 16; o > 0; o >>= 1) {
                    float ob = __shfl_xor_sync(0xffffffffu, best, o);
                    int oi = __shfl_xor_sync(0xffffffffu, bid, o);
                    if (oi != 0x7fffffff && (bid == 0x7fffffff || ob > best || (ob == best && oi < bid)))
                        best = ob, bid = oi;
                }
                if (bid == 0x7fffffff) break;
                if (lane == 0) {
                    sel[len] = bid;
                    taken[bid >> 5] |= 1u << (bid & 31);
                }
                __syncwarp();
            }
        }
        __syncwarp();
        if (lane == 0) {
            for (int a = 1; a < len; a++) /* insertion sort, ascending id */
                for (int b = a; b > 0 && sel[b - 1] > sel[b]; b--) {
                    int x = sel[b];
                    sel[b] = sel[b - 1];
                    sel[b - 1] = x;
                }
            float sum = 0.f; /* ascending id order, as the CPU */
            for (int i = 0; i < len; i++) sum += st[sel[i]];
            for (int i = 0; i < kmax; i++) {
                ids[(size_t)t * kmax + i] = i < len ? sel[i] : -1;
                w[(size_t)t * kmax + i] = i < len ? (renorm ? st[sel[i]] / (sum + 1e-20f) * scale : st[sel[i]] * scale) : 0.f;
            }
            cnt[t] = len;
        }
        __syncwarp(); /* lane 0 is done with sel and st before the warp's next token */
    }
    if (COUNT) {
        __syncthreads();
        for (int j = threadIdx.x; j < (rho ? 2 * n : n); j += blockDim.x) {
            uint32_t c = hist[j];
            if (c) atomicAdd(qc + j, c);
        }
    }
}

static st_status_t router_quantile_launch(const st_gpu_stream_t *s, int *ids, float *w, int *cnt, float *scores,
                                          const float *tau, int T, int n, int kmax, bool renorm, float scale,
                                          uint32_t *qc, const float *rho) {
    if (T < 0 || n <= 0 || n > RQ_NMAX || kmax <= 0 || kmax > RQ_KMAX)
        return ST_FAIL(ST_ERR_INVALID_ARG, "router_quantile: T=%d n=%d (≤ %d) kmax=%d (≤ %d)", T, n, RQ_NMAX, kmax,
                       RQ_KMAX);
    cudaStream_t st = ST_STREAM(s);
    const int quads = (T + RQ_WARPS - 1) / RQ_WARPS;
    if (!qc) {
        if (!T) return ST_OK;
        router_quantile_kernel<false><<<quads, RQ_WARPS * 32, 0, st>>>(ids, w, cnt, scores, tau, T, n, kmax, renorm,
                                                                       scale, NULL, NULL);
        return ST_LAUNCH_OK("router_quantile_kernel");
    }
    const size_t bins = (size_t)(rho ? 2 : 1) * n, smem = bins * sizeof(uint32_t);
    if (cudaMemsetAsync(qc, 0, smem, st) != cudaSuccess) return ST_LAUNCH_OK("router_quantile counts memset");
    if (!T) return ST_OK;
    /* NOTE: every launch sets the attribute (the histogram passes the 48 KB default at n > 1408) */
    st_status_t rc = ST_CUDA_CHECK(
        cudaFuncSetAttribute(router_quantile_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    if (rc) return rc;
    /* one wave of resident blocks at most, so that each block counts as many tokens as it can (one
     * flush of n or 2n bins per block); one token per warp while the tokens fit on the SMs anyway */
    int grid = quads, dev = 0, nsm = 0, bps = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || nsm <= 0) {
        (void)cudaGetLastError();
        nsm = 132;
    }
    if (quads > nsm) {
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&bps, router_quantile_kernel<true>, RQ_WARPS * 32, smem) !=
                cudaSuccess ||
            bps <= 0) {
            (void)cudaGetLastError();
            bps = 1;
        }
        if ((long)nsm * bps < grid) grid = nsm * bps;
    }
    router_quantile_kernel<true><<<grid, RQ_WARPS * 32, smem, st>>>(ids, w, cnt, scores, tau, T, n, kmax, renorm,
                                                                    scale, qc, rho);
    return ST_LAUNCH_OK("router_quantile_kernel<count>");
}

extern "C" st_status_t st_cuda_router_quantile(const st_gpu_stream_t *s, int *ids, float *w, int *cnt, float *scores,
                                               const float *tau, int T, int n, int kmax, bool renorm, float scale) {
    return router_quantile_launch(s, ids, w, cnt, scores, tau, T, n, kmax, renorm, scale, NULL, NULL);
}

extern "C" st_status_t st_cuda_router_quantile_count(const st_gpu_stream_t *s, int *ids, float *w, int *cnt,
                                                     float *scores, const float *tau, int T, int n, int kmax,
                                                     bool renorm, float scale, uint32_t *qc, const float *rho) {
    if (!qc) return ST_FAIL(ST_ERR_INVALID_ARG, "router_quantile_count: no count buffer");
    return router_quantile_launch(s, ids, w, cnt, scores, tau, T, n, kmax, renorm, scale, qc, rho);
}
