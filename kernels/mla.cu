/* MLA absorbed decode on the GPU (SPEC §4): MQA of H query heads over a paged latent cache of rows
 * [c̃ (512) ; k_pe (64)] bf16, split-KV (FlashMLA-like): each block scores one split of one
 * sequence for 16 heads on tensor cores, keeps an online softmax, and a second kernel merges the
 * splits. CPU reference: st_mla_attn_absorbed (kernels/mla.c). */
#include "cuda_common.cuh"

#define DR 576 /* key width: kv_lora 512 + rope 64 */
#define DVL 512
#define TK 32 /* tokens per tile */
#define LDR (DR + 8)
#define LDP (TK + 8)

struct MlaSmem {
    st_bf16_t Qs[16 * LDR];
    st_bf16_t Ks[2][TK * LDR];
    float Ss[16][TK + 1];
    st_bf16_t Ps[16 * LDP];
    float alpha[16], m[16], l[16];
};

__device__ __forceinline__ void mla_cp16(void *dst, const void *src, bool valid) {
    unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 16 : 0));
}

/* grid (n_splits, B, ceil(H/16)), 128 threads. ws_acc [B, H, n_splits, 512] fp32 (unnormalised
 * Σ p·c̃), ws_ml [B, H, n_splits, 2] (running max, Σ p). */
__global__ void __launch_bounds__(128) mla_decode_split_kernel(const st_bf16_t *__restrict__ q,
                                                               const st_bf16_t *__restrict__ pool,
                                                               const int *__restrict__ block_table,
                                                               const int *__restrict__ seqlens, int H, int page_size,
                                                               int max_pages, int split_len, int n_splits, float scale,
                                                               float *ws_acc, float *ws_ml) {
    extern __shared__ __align__(16) unsigned char smraw[];
    MlaSmem &sm = *reinterpret_cast<MlaSmem *>(smraw);
    const int split = blockIdx.x, b = blockIdx.y, h0 = blockIdx.z * 16;
    const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31, gq = lane >> 2, tq = lane & 3;
    const int n = seqlens[b];
    const int s0 = split * split_len, s1 = min(n, s0 + split_len);
    const int *bt = block_table + (size_t)b * max_pages;
    for (int i = tid; i < 16 * (DR / 8); i += 128) {
        int r = i / (DR / 8), ch = (i % (DR / 8)) * 8;
        bool ok = h0 + r < H;
        mla_cp16(sm.Qs + r * LDR + ch, q + ((size_t)b * H + (ok ? h0 + r : 0)) * DR + ch, ok);
    }
    if (tid < 16) sm.m[tid] = -INFINITY, sm.l[tid] = 0.f;
    const int ntiles = s1 > s0 ? (s1 - s0 + TK - 1) / TK : 0;
    auto load_tile = [&](int tt, int buf) {
        for (int i = tid; i < TK * (DR / 8); i += 128) {
            int r = i / (DR / 8), ch = (i % (DR / 8)) * 8, j = s0 + tt * TK + r;
            bool ok = j < s1;
            int jj = ok ? j : s0;
            const st_bf16_t *row = pool + ((size_t)bt[jj / page_size] * page_size + jj % page_size) * DR;
            mla_cp16(sm.Ks[buf] + r * LDR + ch, row + ch, ok);
        }
        asm volatile("cp.async.commit_group;\n" ::);
    };
    float acc[16][4];
#pragma unroll
    for (int i = 0; i < 16; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
    if (ntiles > 0) load_tile(0, 0);
    else asm volatile("cp.async.commit_group;\n" ::);
    for (int tt = 0; tt < ntiles; tt++) {
        const int buf = tt & 1;
        if (tt + 1 < ntiles) {
            load_tile(tt + 1, buf ^ 1);
            asm volatile("cp.async.wait_group 1;\n" ::);
        } else {
            asm volatile("cp.async.wait_group 0;\n" ::);
        }
        __syncthreads();
        /* scores: warp w → tokens [8w, 8w+8) of the tile, 16 heads */
        {
            float c4[4] = {0, 0, 0, 0};
#pragma unroll 4
            for (int kk = 0; kk < DR / 16; kk++) {
                uint32_t a[4], bb[2];
                st_frag_a(a, sm.Qs, LDR, 0, kk * 16);
                st_frag_b(bb, sm.Ks[buf], LDR, w * 8, kk * 16);
                st_mma16816(c4, a, bb);
            }
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int r = gq + (i >> 1) * 8, col = w * 8 + tq * 2 + (i & 1);
                sm.Ss[r][col] = s0 + tt * TK + col < s1 ? c4[i] * scale : -INFINITY;
            }
        }
        __syncthreads();
        /* online softmax: 8 threads per head row, 4 tokens each */
        {
            const int r = tid >> 3, sub = tid & 7;
            float mx = -INFINITY;
#pragma unroll
            for (int j = 0; j < 4; j++) mx = fmaxf(mx, sm.Ss[r][sub * 4 + j]);
#pragma unroll
            for (int o = 4; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            const float m_old = sm.m[r], m_new = fmaxf(m_old, mx);
            float sum = 0.f;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                float p = __expf(sm.Ss[r][sub * 4 + j] - m_new);
                sum += p;
                sm.Ps[r * LDP + sub * 4 + j] = st_tobf(p);
            }
#pragma unroll
            for (int o = 4; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
            __syncwarp();
            if (sub == 0) {
                float al = __expf(m_old - m_new);
                sm.alpha[r] = al;
                sm.l[r] = sm.l[r] * al + sum;
                sm.m[r] = m_new;
            }
        }
        __syncthreads();
        /* acc (16 heads × dims [128w, 128w+128)) = α·acc + P·C̃ */
        {
            const float a0 = sm.alpha[gq], a1 = sm.alpha[gq + 8];
#pragma unroll
            for (int i = 0; i < 16; i++) acc[i][0] *= a0, acc[i][1] *= a0, acc[i][2] *= a1, acc[i][3] *= a1;
#pragma unroll
            for (int ks = 0; ks < TK / 16; ks++) {
                uint32_t a[4];
                st_frag_a(a, sm.Ps, LDP, 0, ks * 16);
#pragma unroll
                for (int nt = 0; nt < 16; nt++) {
                    uint32_t bb[2];
                    const st_bf16_t *p = sm.Ks[buf] + (ks * 16 + (lane & 15)) * LDR + w * 128 + nt * 8;
                    unsigned addr = (unsigned)__cvta_generic_to_shared(p);
                    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
                                 : "=r"(bb[0]), "=r"(bb[1])
                                 : "r"(addr));
                    st_mma16816(acc[nt], a, bb);
                }
            }
        }
        __syncthreads(); /* Ks[buf] free for the load two tiles on */
    }
    __syncthreads();
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int r = gq + hf * 8, h = h0 + r;
        if (h >= H) continue;
        float *dst = ws_acc + (((size_t)b * H + h) * n_splits + split) * DVL + w * 128;
#pragma unroll
        for (int nt = 0; nt < 16; nt++)
            *reinterpret_cast<float2 *>(dst + nt * 8 + tq * 2) = make_float2(acc[nt][hf * 2], acc[nt][hf * 2 + 1]);
    }
    if (tid < 16 && h0 + tid < H) {
        float *ml = ws_ml + (((size_t)b * H + h0 + tid) * n_splits + split) * 2;
        ml[0] = sm.m[tid];
        ml[1] = sm.l[tid];
    }
}

/* grid (H, B), 128 threads × 4 dims: o = Σ_s e^{m_s−M} acc_s / Σ_s e^{m_s−M} l_s */
__global__ void mla_decode_combine_kernel(st_bf16_t *o, const float *ws_acc, const float *ws_ml, const int *seqlens,
                                          int H, int split_len, int n_splits) {
    const int h = blockIdx.x, b = blockIdx.y;
    const int ns = min(n_splits, (seqlens[b] + split_len - 1) / split_len);
    const float *ml = ws_ml + ((size_t)b * H + h) * n_splits * 2;
    float M = -INFINITY;
    for (int s = 0; s < ns; s++) M = fmaxf(M, ml[2 * s]);
    float L = 0.f;
    float4 a = make_float4(0, 0, 0, 0);
    for (int s = 0; s < ns; s++) {
        float f = __expf(ml[2 * s] - M);
        L += f * ml[2 * s + 1];
        float4 x = *reinterpret_cast<const float4 *>(ws_acc + (((size_t)b * H + h) * n_splits + s) * DVL + threadIdx.x * 4);
        a.x += f * x.x, a.y += f * x.y, a.z += f * x.z, a.w += f * x.w;
    }
    float inv = L > 0.f ? 1.f / L : 0.f;
    st_bf16_t *dst = o + ((size_t)b * H + h) * DVL + threadIdx.x * 4;
    *reinterpret_cast<uint2 *>(dst) = make_uint2(st_pack_bf2(a.x * inv, a.y * inv), st_pack_bf2(a.z * inv, a.w * inv));
}

extern "C" size_t st_cuda_mla_decode_ws_bytes(int B, int H, int max_ctx, int split_len) {
    int ns = (max_ctx + split_len - 1) / split_len;
    if (ns < 1) ns = 1;
    return (size_t)B * H * ns * (DVL + 2) * sizeof(float) + 256;
}

extern "C" st_status_t st_cuda_mla_decode(const st_gpu_stream_t *s, st_bf16_t *o_lat, const st_bf16_t *q_abs,
                                          const st_bf16_t *pool, const int *block_table, const int *seqlens, int B,
                                          int H, int page_size, int max_pages, int max_ctx, int split_len, float scale,
                                          void *ws, size_t ws_bytes) {
    if (B < 0 || H <= 0 || page_size <= 0 || split_len <= 0 || split_len % TK || max_ctx < 0 || B > 65535)
        return ST_FAIL(ST_ERR_INVALID_ARG, "mla_decode: B=%d H=%d page=%d split=%d (multiple of %d)", B, H, page_size,
                       split_len, TK);
    if (B == 0) return ST_OK;
    int ns = (max_ctx + split_len - 1) / split_len;
    if (ns < 1) ns = 1;
    if (ws_bytes < st_cuda_mla_decode_ws_bytes(B, H, max_ctx, split_len))
        return ST_FAIL(ST_ERR_INVALID_ARG, "mla_decode: workspace %zu < %zu bytes", ws_bytes,
                       st_cuda_mla_decode_ws_bytes(B, H, max_ctx, split_len));
    float *ws_acc = (float *)ws, *ws_ml = ws_acc + (size_t)B * H * ns * DVL;
    size_t smem = sizeof(MlaSmem);
    st_status_t rc = ST_CUDA_CHECK(
        cudaFuncSetAttribute(mla_decode_split_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    if (rc) return rc;
    mla_decode_split_kernel<<<dim3(ns, B, (H + 15) / 16), 128, smem, ST_STREAM(s)>>>(
        q_abs, pool, block_table, seqlens, H, page_size, max_pages, split_len, ns, scale, ws_acc, ws_ml);
    rc = ST_LAUNCH_OK("mla_decode_split_kernel");
    if (rc) return rc;
    mla_decode_combine_kernel<<<dim3(H, B), 128, 0, ST_STREAM(s)>>>(o_lat, ws_acc, ws_ml, seqlens, H, split_len, ns);
    return ST_LAUNCH_OK("mla_decode_combine_kernel");
}
