/* MoE-side ops on the GPU: sigmoid router with biased top-k selection (SPEC §7) and greedy argmax
 * sampling (SPEC §9), the dispatch (group, gather, an expert server's row expansion) and the combine (SPEC §6).
 * CPU references: st_router_sigmoid + st_route_topk, st_argmax, st_moe_* (kernels/moe.c).
 * (The GLU activation runs inside the expert FFN kernels: kernels/moe_ffn.cu.) */
#include "cuda_common.cuh"
#include "strata/moe_tree.h"

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

/* ------------------------------------------------------------------ dispatch and combine (SPEC §6)
 * routing → expert-grouped rows, gather of z into that order, combine by the summation tree.
 * CPU: st_moe_group, st_moe_gather, st_moe_combine, st_moe_leaf_table, st_moe_tree_reduce (kernels/moe.c). */
/* one block: counts per expert, exclusive scan, then rows. NOTE: rows within an expert are placed
 * by atomics (order may vary run to run); every row is computed on its own and the combine reads
 * them back in slot order, so the results do not depend on it. */
__global__ void moe_group_kernel(int *offsets, int *row_of, const int *ids, const int *cnt, int T, int kc, int E) {
    extern __shared__ int cur[]; /* [E+1] */
    for (int e = threadIdx.x; e <= E; e += blockDim.x) cur[e] = 0;
    __syncthreads();
    for (int p = threadIdx.x; p < T * kc; p += blockDim.x) {
        int t = p / kc, i = p % kc;
        if (i < cnt[t]) atomicAdd(&cur[ids[p] + 1], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0)
        for (int e = 0; e < E; e++) cur[e + 1] += cur[e];
    __syncthreads();
    for (int e = threadIdx.x; e <= E; e += blockDim.x) offsets[e] = cur[e];
    __syncthreads();
    for (int p = threadIdx.x; p < T * kc; p += blockDim.x) {
        int t = p / kc, i = p % kc;
        row_of[p] = i < cnt[t] ? atomicAdd(&cur[ids[p]], 1) : -1;
    }
}
extern "C" st_status_t st_cuda_moe_group(const st_gpu_stream_t *s, int *offsets, int *row_of, const int *ids, const int *cnt,
                                    int T, int kc, int E) {
    if (T <= 0) return ST_OK;
    moe_group_kernel<<<1, 1024, (size_t)(E + 1) * sizeof(int), ST_STREAM(s)>>>(offsets, row_of, ids, cnt, T, kc, E);
    return ST_LAUNCH_OK("moe_group_kernel");
}

__global__ void moe_gather_kernel(st_bf16_t *xg, const st_bf16_t *z, const int *row_of, const int *cnt, int kc, int l) {
    int t = blockIdx.x, i = blockIdx.y;
    if (i >= cnt[t]) return;
    int r = row_of[(size_t)t * kc + i];
    const uint32_t *src = reinterpret_cast<const uint32_t *>(z + (size_t)t * l);
    uint32_t *dst = reinterpret_cast<uint32_t *>(xg + (size_t)r * l);
    for (int c = threadIdx.x; c < l / 2; c += blockDim.x) dst[c] = src[c];
}
extern "C" st_status_t st_cuda_moe_gather(const st_gpu_stream_t *s, st_bf16_t *xg, const st_bf16_t *z, const int *row_of,
                                     const int *cnt, int T, int kc, int l) {
    if (T <= 0) return ST_OK;
    if (l % 2) return ST_FAIL(ST_ERR_INVALID_ARG, "moe_gather: odd width %d", l);
    moe_gather_kernel<<<dim3(T, kc), 128, 0, ST_STREAM(s)>>>(xg, z, row_of, cnt, kc, l);
    return ST_LAUNCH_OK("moe_gather_kernel");
}

/* grid (ceil(w / 1024), n rows), 256 threads × 4 columns */
/* one thread per 4 columns of a row: 4 fp32 rounded, or 4 bf16 copied */
__device__ __forceinline__ uint2 expand4(const float4 *rows, size_t i) {
    const float4 v = rows[i];
    __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
    return make_uint2(*reinterpret_cast<uint32_t *>(&lo), *reinterpret_cast<uint32_t *>(&hi));
}
__device__ __forceinline__ uint2 expand4(const uint2 *rows, size_t i) { return rows[i]; }
template <typename R>
__global__ void moe_expand_kernel(uint2 *dst, const R *rows, const uint32_t *src, int n_in, int w4) {
    const int r = blockIdx.y, c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= w4) return;
    const uint32_t k = src[r];
    dst[(size_t)r * w4 + c] = k < (uint32_t)n_in ? expand4(rows, (size_t)k * w4 + c) : make_uint2(0u, 0u);
}
extern "C" st_status_t st_cuda_moe_expand(const st_gpu_stream_t *s, st_bf16_t *dst, const void *rows, bool bf16,
                                          const uint32_t *src, int n, int n_in, int w) {
    if (n <= 0) return ST_OK;
    if (w % 4 || n > 65535 * 64)
        return ST_FAIL(ST_ERR_INVALID_ARG, "moe_expand: width %d (multiple of 4), %d rows", w, n);
    const int w4 = w / 4;
    for (int r0 = 0; r0 < n; r0 += 65535) { /* gridDim.y ≤ 65535 */
        const int nr = n - r0 < 65535 ? n - r0 : 65535;
        uint2 *d = reinterpret_cast<uint2 *>(dst) + (size_t)r0 * w4;
        dim3 grid((w4 + 255) / 256, nr);
        if (bf16)
            moe_expand_kernel<<<grid, 256, 0, ST_STREAM(s)>>>(d, static_cast<const uint2 *>(rows), src + r0, n_in, w4);
        else
            moe_expand_kernel<<<grid, 256, 0, ST_STREAM(s)>>>(d, static_cast<const float4 *>(rows), src + r0, n_in, w4);
        st_status_t rc = ST_LAUNCH_OK("moe_expand_kernel");
        if (rc) return rc;
    }
    return ST_OK;
}

/* one block per token; smem: the token's node-row pointers [kc] (node mode), u [l] fp32, then its
 * weights, source rows and leaf ids [kc] each (read once, so the rows' loads do not wait on them slot
 * by slot). Each thread sums its columns by the tree (strata/moe_tree.h; its stack lives in local
 * memory, ≤ 33 entries). Node rows and their pointers may lie in mapped host memory written by the
 * host just before this kernel (behind a flag wait): read with ld.cv, never from a stale cache line. */
__global__ void moe_combine_kernel(st_bf16_t *un, st_bf16_t *ulo, float *partial, const float *yg, const float *yf,
                                   const float *const *at, const int *row_of, const float *p, const int *ids,
                                   const int *cnt, const float *nw, int kc, int l, float eps) {
    st_pdl_trigger(); /* the GEMM that reads this output may start loading its weights */
    extern __shared__ __align__(16) unsigned char sm[];
    __shared__ float red[32];
    const float **ap = reinterpret_cast<const float **>(sm);
    float *u = reinterpret_cast<float *>(ap + kc);
    float *ps = u + l;
    int *rs = reinterpret_cast<int *>(ps + kc);
    uint32_t *is = reinterpret_cast<uint32_t *>(rs + kc);
    const int t = blockIdx.x, c_ = p || at ? cnt[t] : 0;
    const float *Y = yg ? yg : yf;
    for (int i = threadIdx.x; i < c_; i += blockDim.x) {
        const size_t k = (size_t)t * kc + i;
        if (p) ps[i] = p[k], rs[i] = yg ? row_of[k] : (int)k;
        else ap[i] = reinterpret_cast<const float *>(__ldcv(reinterpret_cast<const unsigned long long *>(at + k)));
        is[i] = (uint32_t)ids[k];
    }
    __syncthreads();
    if (p) {
        st_moe_tree_t st;
        for (int c = threadIdx.x; c < l; c += blockDim.x) {
            st_moe_tree_init(&st);
            for (int i = 0; i < c_; i++) st_moe_tree_push(&st, is[i], __fadd_rn(__fmul_rn(ps[i], Y[(size_t)rs[i] * l + c]), 0.f));
            u[c] = st_moe_tree_end(&st);
        }
    } else if (at) { /* node values: the servers' partial trees */
        st_moe_tree_t st;
        for (int c = threadIdx.x; c < l; c += blockDim.x) {
            st_moe_tree_init(&st);
            for (int i = 0; i < c_; i++)
                if (ap[i]) st_moe_tree_push(&st, is[i], __ldcv(ap[i] + c));
            u[c] = st_moe_tree_end(&st);
        }
    } else { /* u combined elsewhere */
        for (int c = threadIdx.x; c < l; c += blockDim.x) u[c] = yf[(size_t)t * l + c];
    }
    __syncthreads();
    if (!un) {
        for (int c = threadIdx.x; c < l; c += blockDim.x) partial[(size_t)t * l + c] += u[c];
        return;
    }
    float r = 1.f;
    if (nw) {
        float ss = 0.f;
        for (int c = threadIdx.x; c < l; c += blockDim.x) ss += u[c] * u[c];
        ss = st_block_sum(ss, red);
        r = 1.f / sqrtf(ss / (float)l + eps);
    }
    for (int c = threadIdx.x; c < l; c += blockDim.x)
        un[(size_t)t * l + c] = st_split_bf(nw ? u[c] * r * nw[c] : u[c], ulo ? ulo + (size_t)t * l + c : NULL);
}
extern "C" st_status_t st_cuda_moe_combine(const st_gpu_stream_t *s, st_bf16_t *un, st_bf16_t *ulo, float *partial, const float *yg,
                                      const float *yf, const float *const *at, const int *row_of, const float *p, const int *ids,
                                      const int *cnt, const float *norm_w, int T, int kc, int l, float eps) {
    if (T <= 0) return ST_OK;
    const size_t smem = (size_t)kc * sizeof(float *) + ((size_t)l + 3 * (size_t)kc) * sizeof(float);
    moe_combine_kernel<<<T, 256, smem, ST_STREAM(s)>>>(un, ulo, partial, yg, yf, at, row_of, p, ids, cnt, norm_w, kc, l, eps);
    return ST_LAUNCH_OK("moe_combine_kernel");
}

/* The leaf table (st_moe_leaf_table) in four launches and a memset: each row's leaves counted
 * (atomics), one block scans the counts into off and cursors, each pair placed at its row's cursor
 * (atomics: any order within the row), then one thread per row sorts its leaves into pair order and
 * checks their ids. NOTE: a row's leaves name distinct experts, at most kc of a token in practice, so
 * the per-row insertion sort is short; a hostile dispatch can make it long, never wrong. */
__global__ void leaf_count_kernel(uint32_t *cnt, const uint32_t *orow, int n, int n_out) {
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r < n && orow[r] < (uint32_t)n_out) atomicAdd(&cnt[orow[r]], 1u);
}
/* one block of 1024: each thread scans a contiguous chunk; cnt becomes each row's cursor */
__global__ void leaf_scan_kernel(uint32_t *off, uint32_t *cnt, int n_out, uint32_t *err) {
    __shared__ uint32_t part[1024];
    const int t = threadIdx.x, per = (n_out + 1023) / 1024, a = min(t * per, n_out), b = min(a + per, n_out);
    uint32_t sum = 0;
    for (int o = a; o < b; o++) sum += cnt[o];
    part[t] = sum;
    __syncthreads();
    for (int d = 1; d < 1024; d <<= 1) { /* inclusive scan of the chunk sums (Hillis-Steele) */
        const uint32_t v = t >= d ? part[t - d] : 0u;
        __syncthreads();
        part[t] += v;
        __syncthreads();
    }
    uint32_t acc = part[t] - sum;
    for (int o = a; o < b; o++) {
        const uint32_t c = cnt[o];
        off[o] = acc, cnt[o] = acc;
        acc += c;
    }
    if (t == 1023) off[n_out] = part[1023], *err = 0xffffffffu;
}
__global__ void leaf_fill_kernel(uint32_t *row, uint32_t *id, float *lp, uint32_t *cur, const uint32_t *orow,
                                 const float *p, const int *offsets, const uint32_t *expert_ids, int n_exp, int n,
                                 int n_out) {
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= n || orow[r] >= (uint32_t)n_out) return;
    int lo = 0, hi = n_exp - 1; /* the expert k with offsets[k] ≤ r < offsets[k + 1] (the last such) */
    while (lo < hi) {
        const int m = (lo + hi + 1) / 2;
        if (offsets[m] <= r) lo = m;
        else hi = m - 1;
    }
    const uint32_t at = atomicAdd(&cur[orow[r]], 1u);
    row[at] = (uint32_t)r, id[at] = expert_ids[lo], lp[at] = p[r];
}
__global__ void leaf_sort_kernel(uint32_t *row, uint32_t *id, float *lp, const uint32_t *off, int n_out,
                                 uint32_t *err) {
    const int o = blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= n_out) return;
    const uint32_t a = off[o], b = off[o + 1];
    for (uint32_t k = a + 1; k < b; k++) {
        const uint32_t rk = row[k], ik = id[k];
        const float pk = lp[k];
        uint32_t j = k;
        for (; j > a && row[j - 1] > rk; j--) row[j] = row[j - 1], id[j] = id[j - 1], lp[j] = lp[j - 1];
        row[j] = rk, id[j] = ik, lp[j] = pk;
    }
    for (uint32_t k = a + 1; k < b; k++)
        if (id[k] == id[k - 1]) {
            atomicMin(err, (uint32_t)o);
            break;
        }
}
extern "C" size_t st_cuda_moe_leaf_table_ws_bytes(int n_out) { return sizeof(uint32_t) * ((size_t)n_out + 1); }
extern "C" st_status_t st_cuda_moe_leaf_table(const st_gpu_stream_t *s, uint32_t *off, uint32_t *row, uint32_t *id,
                                              float *lp, uint32_t *err, const uint32_t *orow, const float *p,
                                              const int *offsets, const uint32_t *expert_ids, int n_exp, int n,
                                              int n_out, void *ws) {
    if (n < 0 || n_out < 0 || n_exp < 0 || (n > 0 && n_exp == 0))
        return ST_FAIL(ST_ERR_INVALID_ARG, "moe_leaf_table: %d pairs of %d experts, %d rows", n, n_exp, n_out);
    uint32_t *cnt = static_cast<uint32_t *>(ws);
    st_status_t rc = ST_CUDA_CHECK(cudaMemsetAsync(cnt, 0, sizeof(uint32_t) * ((size_t)n_out + 1), ST_STREAM(s)));
    if (rc) return rc;
    if (n > 0) {
        leaf_count_kernel<<<(n + 255) / 256, 256, 0, ST_STREAM(s)>>>(cnt, orow, n, n_out);
        if ((rc = ST_LAUNCH_OK("leaf_count_kernel"))) return rc;
    }
    leaf_scan_kernel<<<1, 1024, 0, ST_STREAM(s)>>>(off, cnt, n_out, err);
    if ((rc = ST_LAUNCH_OK("leaf_scan_kernel"))) return rc;
    if (n > 0) {
        leaf_fill_kernel<<<(n + 255) / 256, 256, 0, ST_STREAM(s)>>>(row, id, lp, cnt, orow, p, offsets, expert_ids,
                                                                    n_exp, n, n_out);
        if ((rc = ST_LAUNCH_OK("leaf_fill_kernel"))) return rc;
    }
    if (n_out > 0) {
        leaf_sort_kernel<<<(n_out + 127) / 128, 128, 0, ST_STREAM(s)>>>(row, id, lp, off, n_out, err);
        if ((rc = ST_LAUNCH_OK("leaf_sort_kernel"))) return rc;
    }
    return ST_OK;
}

/* grid (ceil(l / 256), output rows), one thread per column; the row's leaves are read by every
 * thread of the block (a handful, from L1) */
__global__ void moe_tree_reduce_kernel(float *out, const float *y, const uint32_t *off, const uint32_t *row,
                                       const uint32_t *id, const float *p, int l) {
    const int o = blockIdx.y, c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= l) return;
    st_moe_tree_t st;
    st_moe_tree_init(&st);
    for (uint32_t k = off[o]; k < off[o + 1]; k++)
        st_moe_tree_push(&st, id[k], __fadd_rn(__fmul_rn(p[k], y[(size_t)row[k] * l + c]), 0.f));
    out[(size_t)o * l + c] = st_moe_tree_end(&st);
}
extern "C" st_status_t st_cuda_moe_tree_reduce(const st_gpu_stream_t *s, float *out, const float *y, const uint32_t *off,
                                               const uint32_t *row, const uint32_t *id, const float *p, int n_out, int l) {
    if (n_out <= 0 || l <= 0) return ST_OK;
    if (n_out > 65535 * 64) return ST_FAIL(ST_ERR_INVALID_ARG, "moe_tree_reduce: %d rows", n_out);
    for (int o0 = 0; o0 < n_out; o0 += 65535) { /* gridDim.y ≤ 65535 */
        const int no = n_out - o0 < 65535 ? n_out - o0 : 65535;
        moe_tree_reduce_kernel<<<dim3((l + 255) / 256, no), 256, 0, ST_STREAM(s)>>>(out + (size_t)o0 * l, y, off + o0,
                                                                                     row, id, p, l);
        st_status_t rc = ST_LAUNCH_OK("moe_tree_reduce_kernel");
        if (rc) return rc;
    }
    return ST_OK;
}
