/* MLA causal prefill on the GPU, direct form without positional encoding (SPEC §4): flash
 * attention of T queries (the last T positions) over n keys per head, bf16 in, fp32 scores,
 * online softmax and accumulation, mma.sync m16n8k16 tensor cores. Not the absorbed decode
 * (kernels/mla.cu). CPU reference: st_mla_attn_direct (kernels/mla.c). */
#include "cuda_common.cuh"

#define MP_BM 64 /* queries per block: 4 warps × 16 rows */
#define MP_BN 64 /* keys per tile */


/* grid (ceil(T/64), H), 128 threads. smem: Qs [64][DQK+8], Ks [2][64][DQK+8], Vs [2][64][DV+8].
 * Query row r (0..T-1) sits at position n−T+r and sees keys 0..n−T+r. */
template <int DQK, int DV>
__global__ void __launch_bounds__(128) mla_prefill_kernel(st_bf16_t *__restrict__ o, const st_bf16_t *__restrict__ q,
                                                          const st_bf16_t *__restrict__ k,
                                                          const st_bf16_t *__restrict__ v, int T, int n, int H,
                                                          float scale_log2) {
    constexpr int LQ = DQK + 8, LV = DV + 8;
    extern __shared__ __align__(16) unsigned char mp_smem[];
    st_bf16_t *Qs = reinterpret_cast<st_bf16_t *>(mp_smem);
    st_bf16_t *Ks = Qs + MP_BM * LQ;
    st_bf16_t *Vs = Ks + 2 * MP_BN * LQ;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t4 = lane & 3;
    const int h = blockIdx.y, q0 = blockIdx.x * MP_BM;
    const int off = n - T; /* position of query row 0 */
    for (int i = tid; i < MP_BM * (DQK / 8); i += 128) {
        int r = i / (DQK / 8), ch = (i % (DQK / 8)) * 8;
        bool ok = q0 + r < T;
        st_cp_async16(Qs + r * LQ + ch, q + ((size_t)(ok ? q0 + r : 0) * H + h) * DQK + ch, ok);
    }
    const int kend = min(n, off + q0 + MP_BM); /* keys this block needs */
    const int ntiles = (kend + MP_BN - 1) / MP_BN;
    auto load_kv = [&](int tt, int buf) {
        int k0 = tt * MP_BN;
        for (int i = tid; i < MP_BN * (DQK / 8); i += 128) {
            int r = i / (DQK / 8), ch = (i % (DQK / 8)) * 8;
            bool ok = k0 + r < n;
            st_cp_async16(Ks + (buf * MP_BN + r) * LQ + ch, k + ((size_t)(ok ? k0 + r : 0) * H + h) * DQK + ch, ok);
        }
        for (int i = tid; i < MP_BN * (DV / 8); i += 128) {
            int r = i / (DV / 8), ch = (i % (DV / 8)) * 8;
            bool ok = k0 + r < n;
            st_cp_async16(Vs + (buf * MP_BN + r) * LV + ch, v + ((size_t)(ok ? k0 + r : 0) * H + h) * DV + ch, ok);
        }
        asm volatile("cp.async.commit_group;\n" ::);
    };
    load_kv(0, 0); /* Q rides in the same group */
    uint32_t qf[DQK / 16][4];
    float oacc[DV / 8][4];
#pragma unroll
    for (int j = 0; j < DV / 8; j++) oacc[j][0] = oacc[j][1] = oacc[j][2] = oacc[j][3] = 0.f;
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.f, 0.f};
    const int rbase = q0 + warp * 16 + g;
    const int pos[2] = {off + rbase, off + rbase + 8};

    for (int tt = 0; tt < ntiles; tt++) {
        if (tt + 1 < ntiles) {
            load_kv(tt + 1, (tt + 1) & 1);
            asm volatile("cp.async.wait_group 1;\n" ::);
        } else {
            asm volatile("cp.async.wait_group 0;\n" ::);
        }
        __syncthreads();
        if (tt == 0) {
#pragma unroll
            for (int kk = 0; kk < DQK / 16; kk++) st_frag_a(qf[kk], Qs, LQ, warp * 16, kk * 16);
        }
        const st_bf16_t *Kb = Ks + (tt & 1) * MP_BN * LQ, *Vb = Vs + (tt & 1) * MP_BN * LV;
        const int k0 = tt * MP_BN;
        float sacc[MP_BN / 8][4];
#pragma unroll
        for (int j = 0; j < MP_BN / 8; j++) sacc[j][0] = sacc[j][1] = sacc[j][2] = sacc[j][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < DQK / 16; kk++)
#pragma unroll
            for (int j = 0; j < MP_BN / 8; j++) {
                uint32_t b[2];
                st_frag_b(b, Kb, LQ, j * 8, kk * 16);
                st_mma16816(sacc[j], qf[kk], b);
            }
        /* mask (causal and keys ≥ n), scale into log2 units, online softmax per row */
        float mt[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int j = 0; j < MP_BN / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int key = k0 + j * 8 + 2 * t4 + (e & 1), hr = e >> 1;
                float x = (key <= pos[hr] && key < n) ? sacc[j][e] * scale_log2 : -INFINITY;
                sacc[j][e] = x;
                mt[hr] = fmaxf(mt[hr], x);
            }
        float alpha[2];
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            mt[hr] = fmaxf(mt[hr], __shfl_xor_sync(0xffffffffu, mt[hr], 1));
            mt[hr] = fmaxf(mt[hr], __shfl_xor_sync(0xffffffffu, mt[hr], 2));
            float mn = fmaxf(mrow[hr], mt[hr]);
            alpha[hr] = mn == -INFINITY ? 1.f : exp2f(mrow[hr] - mn);
            mrow[hr] = mn;
        }
        float ls[2] = {0.f, 0.f};
        uint32_t pf[MP_BN / 16][4];
#pragma unroll
        for (int j = 0; j < MP_BN / 8; j++) {
            float p[4];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float mm = mrow[e >> 1];
                p[e] = mm == -INFINITY ? 0.f : exp2f(sacc[j][e] - mm);
                ls[e >> 1] += p[e];
            }
            /* C fragment of key tile j → A fragment of the P·V k16 step j/2 */
            pf[j >> 1][(j & 1) * 2 + 0] = st_pack_bf2(p[0], p[1]);
            pf[j >> 1][(j & 1) * 2 + 1] = st_pack_bf2(p[2], p[3]);
        }
#pragma unroll
        for (int hr = 0; hr < 2; hr++) lrow[hr] = lrow[hr] * alpha[hr] + ls[hr];
#pragma unroll
        for (int j = 0; j < DV / 8; j++) {
            oacc[j][0] *= alpha[0], oacc[j][1] *= alpha[0];
            oacc[j][2] *= alpha[1], oacc[j][3] *= alpha[1];
        }
#pragma unroll
        for (int kk = 0; kk < MP_BN / 16; kk++)
#pragma unroll
            for (int c = 0; c < DV / 16; c++) {
                uint32_t r[4];
                st_ldsm4t(r, Vb + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LV + c * 16 + (lane >> 4) * 8);
                uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
                st_mma16816(oacc[2 * c], pf[kk], b0);
                st_mma16816(oacc[2 * c + 1], pf[kk], b1);
            }
        __syncthreads(); /* this buffer is refilled two tiles on */
    }
    /* row sums: each thread holds part of its rows' l; reduce across the quad */
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        lrow[hr] += __shfl_xor_sync(0xffffffffu, lrow[hr], 1);
        lrow[hr] += __shfl_xor_sync(0xffffffffu, lrow[hr], 2);
    }
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        int row = rbase + hr * 8;
        if (row >= T) continue;
        float inv = 1.f / lrow[hr];
        st_bf16_t *orow = o + ((size_t)row * H + h) * DV;
#pragma unroll
        for (int j = 0; j < DV / 8; j++)
            *reinterpret_cast<uint32_t *>(orow + j * 8 + 2 * t4) =
                st_pack_bf2(oacc[j][hr * 2] * inv, oacc[j][hr * 2 + 1] * inv);
    }
}

template <int DQK, int DV>
static st_status_t mp_launch(const st_gpu_stream_t *s, st_bf16_t *o, const st_bf16_t *q, const st_bf16_t *k,
                             const st_bf16_t *v, int T, int n, int H, float scale) {
    size_t smem = (size_t)(MP_BM * (DQK + 8) + 2 * MP_BN * (DQK + 8) + 2 * MP_BN * (DV + 8)) * 2;
    static bool attr_done = false; /* NOTE: idempotent; a race only repeats the call */
    if (!attr_done) {
        st_status_t rc = ST_CUDA_CHECK(
            cudaFuncSetAttribute(mla_prefill_kernel<DQK, DV>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        if (rc) return rc;
        attr_done = true;
    }
    mla_prefill_kernel<DQK, DV><<<dim3((T + MP_BM - 1) / MP_BM, H), 128, smem, ST_STREAM(s)>>>(
        o, q, k, v, T, n, H, scale * 1.4426950408889634f);
    return ST_LAUNCH_OK("mla_prefill_kernel");
}

extern "C" st_status_t st_cuda_mla_prefill(const st_gpu_stream_t *s, st_bf16_t *o, const st_bf16_t *q,
                                           const st_bf16_t *k, const st_bf16_t *v, int T, int n, int H, int dqk, int dv,
                                           float scale) {
    if (T < 0 || n < T || H <= 0)
        return ST_FAIL(ST_ERR_INVALID_ARG, "mla_prefill: T=%d n=%d H=%d (need 0 ≤ T ≤ n)", T, n, H);
    if (!T) return ST_OK;
    if (dqk == 192 && dv == 128) return mp_launch<192, 128>(s, o, q, k, v, T, n, H, scale);
    if (dqk == 128 && dv == 128) return mp_launch<128, 128>(s, o, q, k, v, T, n, H, scale);
    if (dqk == 64 && dv == 64) return mp_launch<64, 64>(s, o, q, k, v, T, n, H, scale);
    if (dqk == 48 && dv == 32) return mp_launch<48, 32>(s, o, q, k, v, T, n, H, scale);
    return ST_FAIL(ST_ERR_INVALID_ARG, "mla_prefill: (dqk, dv) = (%d, %d) not built (192/128, 128/128, 64/64, 48/32)",
                   dqk, dv);
}
