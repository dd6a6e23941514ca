/* MoE dispatch and combine on the GPU (SPEC §6): routing → expert-grouped rows (a stable counting
 * sort), gather of the latent z rows into that order, and the weighted combine in ascending expert
 * order. CPU reference: the loops of attention_worker/engine.c (moe_begin grouping, moe_finish
 * combine), transcribed in tests/gpu/test_gpu_moe_ffn.c. */
#include "cuda_common.cuh"

#define GRP_CHUNK 256 /* (token, slot) entries per block in the counting sort */

static int grp_chunks(int T, int kmax) { return (int)(((long)T * kmax + GRP_CHUNK - 1) / GRP_CHUNK); }

extern "C" size_t st_cuda_moe_group_ws_bytes(int T, int kmax, int E) {
    return (size_t)grp_chunks(T, kmax) * (size_t)E * sizeof(int);
}

__device__ __forceinline__ int grp_expert(const int *ids, const int *cnt, int kmax, int f) {
    int t = f / kmax, i = f % kmax;
    return (!cnt || i < cnt[t]) ? ids[f] : -1;
}

/* hist [chunks, E]: entries of each chunk per expert. grid chunks, GRP_CHUNK threads, E ints smem. */
__global__ void grp_hist_kernel(int *hist, const int *ids, const int *cnt, int T, int kmax, int E) {
    extern __shared__ int h[];
    for (int e = threadIdx.x; e < E; e += blockDim.x) h[e] = 0;
    __syncthreads();
    int f = blockIdx.x * GRP_CHUNK + threadIdx.x;
    if (f < T * kmax) {
        int e = grp_expert(ids, cnt, kmax, f);
        if (e >= 0 && e < E) atomicAdd(&h[e], 1);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) hist[(size_t)blockIdx.x * E + e] = h[e];
}

/* One block of 1024: per expert, hist[c][e] → rows of earlier chunks (exclusive, within e);
 * offsets = exclusive scan of the totals over e. */
__global__ void grp_scan_kernel(int *offsets, int *hist, int chunks, int E) {
    __shared__ int wsum[32];
    __shared__ int carry;
    if (threadIdx.x == 0) carry = 0;
    __syncthreads();
    for (int e0 = 0; e0 < E; e0 += 1024) {
        int e = e0 + threadIdx.x, tot = 0;
        if (e < E)
            for (int c = 0; c < chunks; c++) {
                int v = hist[(size_t)c * E + e];
                hist[(size_t)c * E + e] = tot;
                tot += v;
            }
        int incl = st_block_scan_incl(tot, wsum);
        if (e < E) offsets[e] = carry + incl - tot;
        __syncthreads();
        if (threadIdx.x == 0) carry += wsum[31];
        __syncthreads();
    }
    if (threadIdx.x == 0) offsets[E] = carry;
}

/* row of each entry = offsets[e] + entries of e in earlier chunks + earlier entries of e in this
 * chunk (stable: (t, i) ascending within an expert). */
__global__ void grp_place_kernel(int *row_of, int *src_of, const int *offsets, const int *hist, const int *ids,
                                 const int *cnt, int T, int kmax, int E) {
    __shared__ int ex[GRP_CHUNK];
    int f = blockIdx.x * GRP_CHUNK + threadIdx.x;
    int e = f < T * kmax ? grp_expert(ids, cnt, kmax, f) : -1;
    if (e >= E) e = -1;
    ex[threadIdx.x] = e;
    __syncthreads();
    if (f >= T * kmax) return;
    if (e < 0) {
        row_of[f] = -1;
        return;
    }
    int rank = 0;
    for (int j = 0; j < (int)threadIdx.x; j++) rank += ex[j] == e;
    int row = offsets[e] + hist[(size_t)blockIdx.x * E + e] + rank;
    row_of[f] = row;
    if (src_of) src_of[row] = f / kmax;
}

extern "C" st_status_t st_cuda_moe_group(const st_gpu_stream_t *s, int *offsets, int *row_of, int *src_of,
                                         const int *ids, const int *cnt, int T, int kmax, int E, void *ws,
                                         size_t ws_bytes) {
    if (T < 0 || kmax <= 0 || E <= 0 || E > 12288 || ws_bytes < st_cuda_moe_group_ws_bytes(T, kmax, E))
        return ST_FAIL(ST_ERR_INVALID_ARG, "moe_group: T=%d kmax=%d E=%d ws=%zu", T, kmax, E, ws_bytes);
    cudaStream_t cs = ST_STREAM(s);
    int chunks = grp_chunks(T, kmax);
    int *hist = (int *)ws;
    st_status_t rc;
    if (chunks) {
        grp_hist_kernel<<<chunks, GRP_CHUNK, E * sizeof(int), cs>>>(hist, ids, cnt, T, kmax, E);
        if ((rc = ST_LAUNCH_OK("grp_hist_kernel"))) return rc;
    }
    grp_scan_kernel<<<1, 1024, 0, cs>>>(offsets, hist, chunks, E);
    if ((rc = ST_LAUNCH_OK("grp_scan_kernel"))) return rc;
    if (!chunks) return ST_OK;
    grp_place_kernel<<<chunks, GRP_CHUNK, 0, cs>>>(row_of, src_of, offsets, hist, ids, cnt, T, kmax, E);
    return ST_LAUNCH_OK("grp_place_kernel");
}

/* one block per token: copy z[t] to each of its rows, 16 bytes per thread step when aligned */
__global__ void moe_gather_kernel(st_bf16_t *xg, const st_bf16_t *z, const int *row_of, int kmax, int l) {
    int t = blockIdx.x;
    const st_bf16_t *src = z + (size_t)t * l;
    for (int i = 0; i < kmax; i++) {
        int r = row_of[(size_t)t * kmax + i];
        if (r < 0) continue;
        st_bf16_t *dst = xg + (size_t)r * l;
        if ((l & 7) == 0) {
            for (int c = threadIdx.x; c < l / 8; c += blockDim.x)
                reinterpret_cast<uint4 *>(dst)[c] = reinterpret_cast<const uint4 *>(src)[c];
        } else {
            for (int c = threadIdx.x; c < l; c += blockDim.x) dst[c] = src[c];
        }
    }
}

extern "C" st_status_t st_cuda_moe_gather(const st_gpu_stream_t *s, st_bf16_t *xg, const st_bf16_t *z,
                                          const int *row_of, int T, int kmax, int l) {
    if (T < 0 || kmax <= 0 || l <= 0) return ST_FAIL(ST_ERR_INVALID_ARG, "moe_gather: T=%d kmax=%d l=%d", T, kmax, l);
    if (!T) return ST_OK;
    moe_gather_kernel<<<T, 128, 0, ST_STREAM(s)>>>(xg, z, row_of, kmax, l);
    return ST_LAUNCH_OK("moe_gather_kernel");
}

/* grid (T, ceil(l / 1024)), 256 threads, 4 consecutive columns each (8-byte bf16 loads, 16-byte
 * stores) when l % 4 == 0, else strided scalars; the token's rows and weights staged in shared
 * memory. NOTE: u = 0, then u += p·y slot by slot, with explicit round-to-nearest mul and add so no
 * FMA contraction changes the CPU's rounding. */
#define CMB_KMAX 64
__global__ void moe_combine_kernel(float *u, const st_bf16_t *y, const float *p, const int *row_of, const int *cnt,
                                   int kmax, int l) {
    __shared__ int rs[CMB_KMAX];
    __shared__ float ps[CMB_KMAX];
    const int t = blockIdx.x;
    const int n = min(cnt ? cnt[t] : kmax, CMB_KMAX);
    if ((int)threadIdx.x < n) {
        rs[threadIdx.x] = row_of[(size_t)t * kmax + threadIdx.x];
        ps[threadIdx.x] = p[(size_t)t * kmax + threadIdx.x];
    }
    __syncthreads();
    const int cbeg = blockIdx.y * 1024, cend = min(l, cbeg + 1024);
    if ((l & 3) == 0) {
        int c = cbeg + 4 * threadIdx.x;
        if (c >= cend) return;
        float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
        for (int i = 0; i < n; i++) {
            uint2 v = *reinterpret_cast<const uint2 *>(y + (size_t)rs[i] * l + c);
            float pp = ps[i];
            a0 = __fadd_rn(a0, __fmul_rn(pp, __uint_as_float(v.x << 16)));
            a1 = __fadd_rn(a1, __fmul_rn(pp, __uint_as_float(v.x & 0xffff0000u)));
            a2 = __fadd_rn(a2, __fmul_rn(pp, __uint_as_float(v.y << 16)));
            a3 = __fadd_rn(a3, __fmul_rn(pp, __uint_as_float(v.y & 0xffff0000u)));
        }
        *reinterpret_cast<float4 *>(u + (size_t)t * l + c) = make_float4(a0, a1, a2, a3);
    } else {
        for (int c = cbeg + threadIdx.x; c < cend; c += blockDim.x) {
            float a = 0.f;
            for (int i = 0; i < n; i++) a = __fadd_rn(a, __fmul_rn(ps[i], st_bf(y[(size_t)rs[i] * l + c])));
            u[(size_t)t * l + c] = a;
        }
    }
}

extern "C" st_status_t st_cuda_moe_combine(const st_gpu_stream_t *s, float *u, const st_bf16_t *y, const float *p,
                                           const int *row_of, const int *cnt, int T, int kmax, int l) {
    if (T < 0 || kmax <= 0 || kmax > CMB_KMAX || l <= 0)
        return ST_FAIL(ST_ERR_INVALID_ARG, "moe_combine: T=%d kmax=%d (≤ %d) l=%d", T, kmax, CMB_KMAX, l);
    if (!T) return ST_OK;
    moe_combine_kernel<<<dim3(T, (l + 1023) / 1024), 256, 0, ST_STREAM(s)>>>(u, y, p, row_of, cnt, kmax, l);
    return ST_LAUNCH_OK("moe_combine_kernel");
}
