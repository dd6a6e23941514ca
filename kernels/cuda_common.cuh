/* Internal helpers shared by kernels/*.cu: bf16 conversions, warp reductions and the
 * mma.sync m16n8k16 bf16 tensor-core wrapper with its fragment loaders. Not a public header. */
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "strata/kernels_cuda.h"

#define ST_LAUNCH_OK(name) st_gpu_last_launch((name), __FILE__, __LINE__)
#define ST_STREAM(s) ((cudaStream_t)(s)->stream)

__device__ __forceinline__ float st_bf(const st_bf16_t h) { return __uint_as_float((uint32_t)h << 16); }
__device__ __forceinline__ st_bf16_t st_tobf(float f) {
    __nv_bfloat16 b = __float2bfloat16_rn(f);
    return *reinterpret_cast<st_bf16_t *>(&b);
}
/* σ(x) with the accurate expf (the engine's glue kernels and their CPU twins use this form) */
__device__ __forceinline__ float st_sigf(float x) { return 1.f / (1.f + expf(-x)); }
/* v as bf16 hi (returned) and, when lo != NULL, the bf16 of the remainder v − hi into *lo: the split
 * bf16 outputs (hi + lo carries v to ~16 bits) */
__device__ __forceinline__ st_bf16_t st_split_bf(float v, st_bf16_t *lo) {
    st_bf16_t h = st_tobf(v);
    if (lo) *lo = st_tobf(v - st_bf(h));
    return h;
}
__device__ __forceinline__ uint32_t st_pack_bf2(float lo, float hi) {
    return (uint32_t)st_tobf(lo) | ((uint32_t)st_tobf(hi) << 16);
}

/* Programmatic dependent launch (a kernel launched with cudaLaunchAttributeProgrammaticStreamSerialization
 * may start before the previous kernel in its stream finishes): st_pdl_wait blocks until that kernel has
 * finished and its writes are visible (nothing before it may read what the previous kernel writes, or
 * write what it reads); st_pdl_trigger lets the next such kernel start now. Both are no-ops without
 * PDL and below sm_90. */
__device__ __forceinline__ void st_pdl_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void st_pdl_trigger() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

__device__ __forceinline__ float st_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float st_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
/* Block sum for blockDim.x a multiple of 32, ≤ 1024; red: 32 floats of shared memory. */
/* Asynchronous global → shared copies (cp.async): 16 bytes (L2 only) or 4 bytes; valid false
 * zero-fills the destination. Then commit the group and wait for all groups. */
__device__ __forceinline__ void st_cp_async16(void *dst, const void *src, bool valid) {
    unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void st_cp_async4(void *dst, const void *src, bool valid) {
    unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void st_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void st_cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::); }

/* ldmatrix x4 of bf16 8×8 tiles from a shared address (or a shared pointer), plain or transposed */
__device__ __forceinline__ void st_ldsm4(uint32_t r[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void st_ldsm4t(uint32_t r[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void st_ldsm4(uint32_t r[4], const st_bf16_t *p) {
    st_ldsm4(r, (unsigned)__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void st_ldsm4t(uint32_t r[4], const st_bf16_t *p) {
    st_ldsm4t(r, (unsigned)__cvta_generic_to_shared(p));
}

/* Inclusive prefix sum of x over the block (≤ 1024 threads); wsum: __shared__ int[32]. Every
 * thread must call it; afterwards (until wsum is reused) wsum[31] holds the block's total. */
__device__ __forceinline__ int st_block_scan_incl(int x, int *wsum) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    for (int o = 1; o < 32; o <<= 1) {
        int y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) wsum[wid] = x;
    __syncthreads();
    if (wid == 0) {
        int v = lane < (int)(blockDim.x >> 5) ? wsum[lane] : 0;
        for (int o = 1; o < 32; o <<= 1) {
            int y = __shfl_up_sync(0xffffffffu, v, o);
            if (lane >= o) v += y;
        }
        wsum[lane] = v;
    }
    __syncthreads();
    return x + (wid ? wsum[wid - 1] : 0);
}

__device__ __forceinline__ float st_block_sum(float v, float *red) {
    int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
    v = st_warp_sum(v);
    __syncthreads();
    if (l == 0) red[w] = v;
    __syncthreads();
    float t = l < nw ? red[l] : 0.f;
    return st_warp_sum(t);
}

/* D += A·B, m16n8k16, bf16 in, fp32 accumulate.
 * Fragments (g = lane>>2, t = lane&3): a[0]=A[g][2t..], a[1]=A[g+8][2t..], a[2]=A[g][2t+8..],
 * a[3]=A[g+8][2t+8..]; b[0]=B[2t..][g], b[1]=B[2t+8..][g]; c[0..1]=C[g][2t..], c[2..3]=C[g+8][2t..]. */
__device__ __forceinline__ void st_mma16816(float c[4], const uint32_t a[4], const uint32_t b[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
/* A fragment from row-major bf16 smem M (leading dim ld elements), rows r0.., cols k0.. */
__device__ __forceinline__ void st_frag_a(uint32_t a[4], const st_bf16_t *M, int ld, int r0, int k0) {
    int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
    const st_bf16_t *p = M + (size_t)(r0 + g) * ld + k0 + 2 * t;
    a[0] = *(const uint32_t *)p;
    a[1] = *(const uint32_t *)(p + 8 * ld);
    a[2] = *(const uint32_t *)(p + 8);
    a[3] = *(const uint32_t *)(p + 8 * ld + 8);
}
/* B fragment where B[k][n] = Bt[n][k] (Bt row-major, leading dim ld): cols n0.., rows k0.. */
__device__ __forceinline__ void st_frag_b(uint32_t b[2], const st_bf16_t *Bt, int ld, int n0, int k0) {
    int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
    const st_bf16_t *p = Bt + (size_t)(n0 + g) * ld + k0 + 2 * t;
    b[0] = *(const uint32_t *)p;
    b[1] = *(const uint32_t *)(p + 8);
}

/* varlen batches: the sequence of token t, i.e. the largest b with cu[b] <= t (cu_seqlens style; T =
 * cu[B] tokens). First the guess of equal lengths (a decode step: exact), checked with two loads; the
 * binary search (log2 B dependent loads) only when it misses. */
__device__ __forceinline__ int st_seq_of(const int *cu, int B, int T, int t) {
    const int g = T > 0 ? (int)((long long)t * B / T) : 0;
    if (g < B && cu[g] <= t && t < cu[g + 1]) return g; /* later b start at cu[g + 1] > t */
    int lo = 0, hi = B - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (cu[mid] <= t) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* Hopper mbarrier and TMA (sm_90; only the kernels compiled for it call these): init with an arrival
 * count; one arrival that also expects `bytes` of transactions; a 2-D tensor-map copy into shared
 * memory completing on bar */
__device__ __forceinline__ void st_mbar_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void st_mbar_expect(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void st_tma2d(unsigned dst, const void *tm, int c0, int c1, unsigned bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
            dst),
        "l"((uint64_t)tm), "r"(c0), "r"(c1), "r"(bar)
        : "memory");
}

/* wgmma m64n128 / m64n256 (fp32 accumulators d[16][4] / d[32][4], 64 / 128 per thread): the
 * accumulator list %0..%63 / %0..%127 of the instruction text and the matching asm operands, shared by
 * the callers' wrappers */
#define ST_WG_D128_LIST \
    "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15," \
    "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31," \
    "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47," \
    "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
#define ST_WG_D256_LIST \
    ST_WG_D128_LIST "," \
    "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79," \
    "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95," \
    "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111," \
    "%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127"
/* operands of accumulator rows j .. j + 3 (16 floats) */
#define ST_WG_OPS1(d, j) "+f"((d)[j][0]), "+f"((d)[j][1]), "+f"((d)[j][2]), "+f"((d)[j][3])
#define ST_WG_OPS4(d, j) ST_WG_OPS1(d, j), ST_WG_OPS1(d, (j) + 1), ST_WG_OPS1(d, (j) + 2), ST_WG_OPS1(d, (j) + 3)
#define ST_WG_D128_OPS(d) ST_WG_OPS4(d, 0), ST_WG_OPS4(d, 4), ST_WG_OPS4(d, 8), ST_WG_OPS4(d, 12)
#define ST_WG_D256_OPS(d) ST_WG_D128_OPS(d), ST_WG_OPS4(d, 16), ST_WG_OPS4(d, 20), ST_WG_OPS4(d, 24), ST_WG_OPS4(d, 28)
