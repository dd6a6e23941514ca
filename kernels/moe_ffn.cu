/* Latent expert FFN on the GPU, grouped over experts (SPEC §6): y = w2 · act(w1 x, w3 x) for the
 * rows of each expert, as two grouped tensor-core GEMMs (mma.sync m16n8k16 bf16, fp32 accumulate,
 * 4-stage cp.async pipeline, 128×128×32 block tiles) with the SiTU/SiLU-GLU fused into the first
 * GEMM's epilogue; on sm_90 devices (fw_usable) the same two GEMMs
 * on Hopper wgmma fed by TMA (ffn_wg_kernel: cooperative consumers; ffn_wgp_kernel: ping-pong
 * consumers, both GEMMs in one launch, for small experts); plus MXFP4 → bf16 weight conversion at load.
 * CPU reference: st_ffn per expert (kernels/ffn.c), st_weight_rows_f32 for MXFP4. */
#include <cublas_v2.h>
#include <cuda.h> /* CUtensorMap types only: the encoder comes through cudaGetDriverEntryPointByVersion */
#include <stdio.h>
#include <stdlib.h>

#include "cuda_common.cuh"

#define FB_M 128
#define FB_N 128 /* B-tile rows: 128 output columns, or 64 gate + 64 up columns in the GLU GEMM */
#define FB_K 32
#define FB_LD (FB_K + 8) /* 80-byte smem rows: ldmatrix rows land on distinct banks */
#define FB_ST 4
#define FB_THREADS 256
#define FB_SMEM (FB_ST * (FB_M + FB_N) * FB_LD * 2)


/* Tile table: one entry per (expert, 128-row tile), map [bound, 2] = (expert, first row); entries
 * past the total are (−1, 0) so surplus blocks exit; map[2·bound] = the number of entries; cnt [bound + 1]
 * zeroed (the fused ping-pong kernel's counters). One block of 1024 threads. */
#define FFN_MAP_INTS(N) (2 * ((N + FB_M - 1) / FB_M + 1 + 4096)) /* ints of ws for the map */
__global__ void ffn_tile_map_kernel(int *map, int *cnt, const int *offsets, int E, int bound, int big) {
    __shared__ int wsum[32];
    __shared__ int carry;
    if (threadIdx.x == 0) carry = 0;
    __syncthreads();
    for (int e0 = 0; e0 < E; e0 += 1024) {
        int e = e0 + threadIdx.x;
        int c = e < E ? offsets[e + 1] - offsets[e] : 0;
        int nt = c > 0 && c < big ? (c + FB_M - 1) / FB_M : 0; /* experts ≥ big rows: cuBLAS */
        int base = carry + st_block_scan_incl(nt, wsum) - nt;
        for (int j = 0; j < nt && base + j < bound; j++) {
            map[2 * (base + j)] = e;
            map[2 * (base + j) + 1] = offsets[e] + j * FB_M;
        }
        __syncthreads();
        if (threadIdx.x == 0) carry += wsum[31];
        __syncthreads();
    }
    for (int i = carry + threadIdx.x; i < bound; i += blockDim.x) map[2 * i] = -1, map[2 * i + 1] = 0;
    for (int i = threadIdx.x; i <= bound; i += blockDim.x) cnt[i] = 0;
    if (threadIdx.x == 0) map[2 * bound] = carry < bound ? carry : bound;
}

/* C[rows of expert e, cols] = A[rows, K] · B_eᵀ, A row-major [N, K] bf16, B_e row-major [Nout, K].
 * GLU: B-tile rows 0..63 are w1_e rows n0.., rows 64..127 are w3_e rows n0..; warp wn's n8 tiles
 * 0,1 are gate columns and 2,3 the same up columns, so the epilogue pairs them in registers and
 * writes h = act(gate, up) [N, Nout] bf16. Plain: 128 output columns of w2_e, writes C bf16.
 * grid (tiles bound, ceil(Nout / (GLU ? 64 : 128))), 256 threads = 8 warps as 2 (M) × 4 (N),
 * warp tile 64 × 32. */
__device__ __forceinline__ void fb_st2(st_bf16_t *p, float a, float b) {
    *reinterpret_cast<uint32_t *>(p) = st_pack_bf2(a, b);
}
__device__ __forceinline__ void fb_st2(float *p, float a, float b) { *reinterpret_cast<float2 *>(p) = make_float2(a, b); }

/* SPEC §6 activation on fp32 gate a / up u (the fused epilogue and the table mode's cuBLAS GLU kernel) */
__device__ __forceinline__ float ffn_act(float a, float u, int situ, float b1, float b2) {
    float sg = 1.f / (1.f + __expf(-a));
    return situ ? (b1 * tanhf(a / b1) * sg) * (b2 * tanhf(u / b2)) : a * sg * u;
}

/* TC: the output element (bf16; fp32 for the plain down GEMM of st_cuda_moe_ffn) */
template <bool GLU, typename TC = st_bf16_t>
__global__ void __launch_bounds__(FB_THREADS, 2)
    ffn_gemm_kernel(TC *__restrict__ C, const st_bf16_t *__restrict__ A, const st_bf16_t *__restrict__ B1,
                    const st_bf16_t *__restrict__ B3, const int *__restrict__ offsets, const int *__restrict__ map,
                    int Nout, int K, int situ, float b1, float b2, const st_bf16_t *const *__restrict__ tab,
                    int tab_off) {
    extern __shared__ __align__(16) unsigned char fb_smem[];
    st_bf16_t *As = reinterpret_cast<st_bf16_t *>(fb_smem);
    st_bf16_t *Bs = As + FB_ST * FB_M * FB_LD;
    const int e = map[2 * blockIdx.x];
    if (e < 0) return;
    const int m0 = map[2 * blockIdx.x + 1], m_end = offsets[e + 1];
    const int ncols = GLU ? FB_N / 2 : FB_N;
    const int n0 = blockIdx.y * ncols;
    const size_t bstride = (size_t)Nout * K;
    /* tab: per-expert weight blocks {w1, w3, w2} (st_cuda_moe_ffn_table), else stacked [E, Nout, K] */
    const st_bf16_t *Be1 = tab ? tab[3 * e + tab_off] : B1 + (size_t)e * bstride;
    const st_bf16_t *Be3 = GLU ? (tab ? tab[3 * e + 1] : B3 + (size_t)e * bstride) : nullptr;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wm = warp >> 2, wn = warp & 3;
    const int ktiles = (K + FB_K - 1) / FB_K;

    auto load = [&](int kt, int st) {
        const int k0 = kt * FB_K;
#pragma unroll
        for (int i = 0; i < 2; i++) { /* A: 128 rows × 4 chunks of 8 */
            int idx = tid + i * FB_THREADS, r = idx >> 2, ch = (idx & 3) * 8;
            int row = m0 + r;
            bool ok = row < m_end && k0 + ch < K;
            st_cp_async16(As + (st * FB_M + r) * FB_LD + ch, A + (size_t)(ok ? row : m0) * K + (ok ? k0 + ch : 0), ok);
        }
#pragma unroll
        for (int i = 0; i < 2; i++) { /* B: 128 rows × 4 chunks */
            int idx = tid + i * FB_THREADS, r = idx >> 2, ch = (idx & 3) * 8;
            const st_bf16_t *src;
            int n;
            if (GLU) {
                n = n0 + (r & 63);
                src = r < 64 ? Be1 : Be3;
            } else {
                n = n0 + r;
                src = Be1;
            }
            bool ok = n < Nout && k0 + ch < K;
            st_cp_async16(Bs + (st * FB_N + r) * FB_LD + ch, src + (size_t)(ok ? n : 0) * K + (ok ? k0 + ch : 0), ok);
        }
    };

    float acc[4][4][4];
#pragma unroll
    for (int a = 0; a < 4; a++)
#pragma unroll
        for (int b = 0; b < 4; b++) acc[a][b][0] = acc[a][b][1] = acc[a][b][2] = acc[a][b][3] = 0.f;

#pragma unroll
    for (int s = 0; s < FB_ST - 1; s++) {
        if (s < ktiles) load(s, s);
        asm volatile("cp.async.commit_group;\n" ::);
    }
    /* B rows of this warp's two n16 pairs */
    const int brow0 = GLU ? wn * 16 : wn * 32, brow1 = GLU ? 64 + wn * 16 : wn * 32 + 16;
    for (int kt = 0; kt < ktiles; kt++) {
        asm volatile("cp.async.wait_group %0;\n" ::"n"(FB_ST - 2));
        __syncthreads();
        if (kt + FB_ST - 1 < ktiles) load(kt + FB_ST - 1, (kt + FB_ST - 1) % FB_ST);
        asm volatile("cp.async.commit_group;\n" ::);
        const int st = kt % FB_ST;
        const st_bf16_t *Ast = As + st * FB_M * FB_LD, *Bst = Bs + st * FB_N * FB_LD;
#pragma unroll
        for (int kk = 0; kk < FB_K; kk += 16) {
            uint32_t af[4][4], bf[4][2];
#pragma unroll
            for (int mi = 0; mi < 4; mi++)
                st_ldsm4(af[mi], Ast + (wm * 64 + mi * 16 + (lane & 15)) * FB_LD + kk + (lane >> 4) * 8);
#pragma unroll
            for (int p = 0; p < 2; p++) {
                uint32_t r[4];
                int br = (p ? brow1 : brow0) + (lane & 7) + ((lane >> 4) << 3);
                st_ldsm4(r, Bst + br * FB_LD + kk + ((lane >> 3) & 1) * 8);
                bf[2 * p][0] = r[0], bf[2 * p][1] = r[1], bf[2 * p + 1][0] = r[2], bf[2 * p + 1][1] = r[3];
            }
#pragma unroll
            for (int mi = 0; mi < 4; mi++)
#pragma unroll
                for (int j = 0; j < 4; j++) st_mma16816(acc[mi][j], af[mi], bf[j]);
        }
    }
    asm volatile("cp.async.wait_group 0;\n" ::);

    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int mi = 0; mi < 4; mi++)
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            int row = m0 + wm * 64 + mi * 16 + g + hh * 8;
            if (row >= m_end) continue;
            if (GLU) {
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    int col = n0 + wn * 16 + j * 8 + 2 * t;
                    if (col >= Nout) continue;
                    float o[2];
#pragma unroll
                    for (int q = 0; q < 2; q++) {
                        o[q] = ffn_act(acc[mi][j][hh * 2 + q], acc[mi][j + 2][hh * 2 + q], situ, b1, b2);
                    }
                    /* Nout % 8 == 0 (checked), so col + 1 < Nout */
                    fb_st2(C + (size_t)row * Nout + col, o[0], o[1]);
                }
            } else {
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    int col = n0 + wn * 32 + j * 8 + 2 * t;
                    if (col >= Nout) continue;
                    fb_st2(C + (size_t)row * Nout + col, acc[mi][j][hh * 2], acc[mi][j][hh * 2 + 1]);
                }
            }
        }
}

/* ---------------- Hopper path: wgmma + TMA, warp-specialised, persistent ----------------
 * The same two grouped GEMMs on sm_90a: block tile 128 rows × 256 B rows × 64 k, 4-stage ring of
 * TMA-loaded (128-byte swizzle) A and B tiles guarded by mbarriers; 3 warpgroups: WG 0 the producer
 * (one thread issues the TMA loads, setmaxnreg 40), WGs 1 and 2 the consumers (setmaxnreg 232), each
 * 64 rows × 256 columns with wgmma m64n256k16 (fp32 accumulators in registers, 128 per thread).
 * Blocks are persistent: block b takes tiles b, b + grid, … of (tile-map entry × column tile), so the
 * producer prefetches the next tile while the consumers run the epilogue. GLU: B rows 0..127 = w1_e
 * rows n0.., 128..255 = w3_e rows n0.. (n0 = 128·column tile): accumulator n8 block j (gate) pairs
 * with block j + 16 (up) in the same thread; h = act(gate, up) bf16. Down: 256 output columns of
 * w2_e. Rows of a 128-row tile past the expert's end are computed (next expert's or TMA zero rows) and
 * not stored; B rows past Nout likewise; k past K is zero-filled by TMA.
 * (Clusters of two blocks sharing B tiles by TMA multicast, and the GLU on tanh.approx.f16x2, were
 * variants here until round 3: never faster at the peer shapes (H200, 2026-11-30), so removed.)
 * Weights stacked [E·Nout, K] (one tensor map each, expert e's rows at e·Nout), or the table mode
 * (tmt != nullptr: arbitrary per-expert pointers): per-expert tensor maps [Nout, K] in global memory,
 * built on the device by ffn_tmap_kernel each call, acquired by the producer at each expert change.
 * Optional (flags): programmatic dependent launch between the two GEMMs (not measured faster,
 * 2026-11-30: off by default). */
#define FW_BM 128
#define FW_BN 256
#define FW_BK 64
#define FW_ST 4
#define FW_THREADS 384
#define FW_A_BYTES (FW_BM * FW_BK * 2) /* 16 KB */
#define FW_B_BYTES (FW_BN * FW_BK * 2) /* 32 KB */
#define FW_SMEM (1024 + FW_ST * (FW_A_BYTES + FW_B_BYTES) + 2 * FW_ST * 8)

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FW_ARCH 1
#else
#define FW_ARCH 0
#endif

#if FW_ARCH
__device__ __forceinline__ uint64_t fw_desc(unsigned addr) { /* K-major, 128B swizzle, 8-row groups 1 KB apart */
    return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) |
           ((uint64_t)1 << 62);
}
__device__ __forceinline__ void fw_bar_arrive(unsigned bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
/* wait for the phase of parity par to complete; traps (an error, not a hang) after ~seconds */
__device__ __forceinline__ void fw_bar_wait(unsigned bar, unsigned par) {
    for (unsigned n = 0;; n++) {
        unsigned ok;
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(ok)
            : "r"(bar), "r"(par)
            : "memory");
        if (ok) return;
        if (n > (1u << 24)) __trap();
    }
}
__device__ __forceinline__ float fw_tanh(float x) {
    float y;
    asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
/* SPEC §6 activation with the MUFU tanh (rel. error ~2^-11, below h's bf16 rounding); σ(a) = ½ + ½·tanh(a/2) */
__device__ __forceinline__ float fw_act(float a, float u, int situ, float b1, float b2, float ib1, float ib2) {
    float sg = fmaf(0.5f, fw_tanh(0.5f * a), 0.5f);
    return situ ? (b1 * fw_tanh(a * ib1) * sg) * (b2 * fw_tanh(u * ib2)) : a * sg * u;
}
/* Epilogue stores with 16-byte vectors. In the wgmma accumulator layout lane tq of a quad holds 2
 * columns (8j + 2tq, +1) of each n8 block j of its row, so a plain store writes 4 (or 8) bytes and a
 * warp's store touches 8 rows × 16 bytes. fw_quad_t transposes 4 consecutive blocks within the quad:
 * afterwards lane tq holds all 8 columns of block tq (w[k]: lane k's pair), written with one 16-byte
 * store (two for fp32): a quarter of the store instructions, each writing whole 32-byte sectors.
 * All 32 lanes must call these (shuffles); ok: this lane's row and block are stored. */
__device__ __forceinline__ void fw_quad_t(const uint32_t v[4], uint32_t w[4], int tq) {
#pragma unroll
    for (int r = 0; r < 4; r++) {
        /* round r: lane t reads v_s[t] from lane s = (t + r) & 3, i.e. lane s sends v[(s − r) & 3] */
        const int ks = (tq - r) & 3, s = (tq + r) & 3;
        uint32_t send = v[0];
        send = ks == 1 ? v[1] : send;
        send = ks == 2 ? v[2] : send;
        send = ks == 3 ? v[3] : send;
        const uint32_t got = r ? __shfl_sync(0xffffffffu, send, (int)((threadIdx.x & 28) | s)) : send;
#pragma unroll
        for (int k = 0; k < 4; k++) w[k] = s == k ? got : w[k];
    }
}
__device__ __forceinline__ void fw_st_quad(st_bf16_t *p, const float a[4], const float b[4], bool ok, int tq) {
    uint32_t v[4], w[4] = {0, 0, 0, 0};
#pragma unroll
    for (int k = 0; k < 4; k++) v[k] = st_pack_bf2(a[k], b[k]);
    fw_quad_t(v, w, tq);
    if (ok) *reinterpret_cast<uint4 *>(p) = make_uint4(w[0], w[1], w[2], w[3]);
}
__device__ __forceinline__ void fw_st_quad(float *p, const float a[4], const float b[4], bool ok, int tq) {
    uint32_t va[4], vb[4], wa[4] = {0, 0, 0, 0}, wb[4] = {0, 0, 0, 0};
#pragma unroll
    for (int k = 0; k < 4; k++) va[k] = __float_as_uint(a[k]), vb[k] = __float_as_uint(b[k]);
    fw_quad_t(va, wa, tq);
    fw_quad_t(vb, wb, tq);
    if (ok) {
        float4 *q = reinterpret_cast<float4 *>(p);
        q[0] = make_float4(__uint_as_float(wa[0]), __uint_as_float(wb[0]), __uint_as_float(wa[1]),
                           __uint_as_float(wb[1]));
        q[1] = make_float4(__uint_as_float(wa[2]), __uint_as_float(wb[2]), __uint_as_float(wa[3]),
                           __uint_as_float(wb[3]));
    }
}
/* The epilogue of a warpgroup's accumulators a[NH · HS][4] (HS = GLU ? 2·NJ : NJ rows a half):
 * half hf holds rows m0 + 64(h0 + hf) + 16·warp + g + 8·(r >> 1) and columns CW·ct + 8j + 2·tq + (r & 1) of
 * a[hf·HS + j][r], j < NJ (CW = 8·NJ); GLU stores act(a[j], a[j + NJ]), else a[j]. Rows ≥ m_end and
 * columns ≥ ld are not stored. vec: 16-byte stores (fw_st_quad; all lanes take part). */
template <bool GLU, int NH, int NJ, typename TC>
__device__ __forceinline__ void fw_epilogue(TC *__restrict__ C, const float (*a)[4], int m0, int h0, int m_end,
                                            int ct, int ld, bool vec, int warp, int g, int tq, int situ, float b1,
                                            float b2, float ib1, float ib2) {
    constexpr int HS = GLU ? 2 * NJ : NJ, CW = 8 * NJ;
    if (vec) {
#pragma unroll
        for (int hf = 0; hf < NH; hf++)
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                const int row = m0 + (h0 + hf) * 64 + warp * 16 + g + hh * 8;
#pragma unroll
                for (int jg = 0; jg < NJ / 4; jg++) {
                    float o0[4], o1[4];
#pragma unroll
                    for (int k = 0; k < 4; k++) {
                        const float *x = a[hf * HS + 4 * jg + k];
                        if (GLU) {
                            const float *u = a[hf * HS + 4 * jg + k + NJ];
                            o0[k] = fw_act(x[2 * hh], u[2 * hh], situ, b1, b2, ib1, ib2);
                            o1[k] = fw_act(x[2 * hh + 1], u[2 * hh + 1], situ, b1, b2, ib1, ib2);
                        } else {
                            o0[k] = x[2 * hh], o1[k] = x[2 * hh + 1];
                        }
                    }
                    const int col = ct * CW + 32 * jg + 8 * tq;
                    fw_st_quad(C + (size_t)row * ld + col, o0, o1, row < m_end && col < ld, tq);
                }
            }
        return;
    }
#pragma unroll
    for (int hf = 0; hf < NH; hf++)
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            const int row = m0 + (h0 + hf) * 64 + warp * 16 + g + hh * 8;
            if (row >= m_end) continue;
#pragma unroll
            for (int j = 0; j < NJ; j++) {
                const int col = ct * CW + j * 8 + 2 * tq;
                if (col >= ld) continue;
                const float *x = a[hf * HS + j];
                if (GLU) {
                    const float *u = a[hf * HS + j + NJ];
                    const float o0 = fw_act(x[2 * hh], u[2 * hh], situ, b1, b2, ib1, ib2);
                    const float o1 = fw_act(x[2 * hh + 1], u[2 * hh + 1], situ, b1, b2, ib1, ib2);
                    fb_st2(C + (size_t)row * ld + col, o0, o1);
                } else {
                    fb_st2(C + (size_t)row * ld + col, x[2 * hh], x[2 * hh + 1]);
                }
            }
        }
}
/* a tensor map in global memory written by another kernel (the table mode's per-expert maps): make it
 * visible to the TMA unit before the first copy through it */
__device__ __forceinline__ void fw_tmap_acquire(const CUtensorMap *m) {
    asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;\n" ::"l"((uint64_t)m) : "memory");
}
/* d[64 × 256] += A[64 × 16] · B[16 × 256], both K-major in 128-byte-swizzled shared memory */
__device__ __forceinline__ void fw_wgmma_n256(float d[32][4], uint64_t da, uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
        ST_WG_D256_LIST
        "}, %128, %129, p, 1, 1, 0, 0;\n}\n"
        : ST_WG_D256_OPS(d)
        : "l"(da), "l"(db), "r"(1));
}
#endif

/* grid: min(tiles bound · column tiles, SMs) blocks of FW_THREADS threads, FW_SMEM bytes. tmA: A [N, K];
 * tmB1 (GLU: w1, else w2) and tmB3 (GLU: w3, else unused) [E·Nout, K]; boxes 64 × 128. */
/* FW_F_*: the flags argument */
#define FW_F_PDL_WAIT 1 /* launched as a programmatic dependent: wait for the previous grid before reading */
#define FW_F_PDL_TRIG 2 /* let the next grid (launched as a programmatic dependent) start early */
#define FW_F_VEC 4      /* epilogue stores of 16 bytes (fw_st_quad; C 16-byte aligned) */
template <bool GLU, typename TC>
__global__ void __launch_bounds__(FW_THREADS, 1)
    ffn_wg_kernel(const __grid_constant__ CUtensorMap tmA, const __grid_constant__ CUtensorMap tmB1,
                  const __grid_constant__ CUtensorMap tmB3, TC *__restrict__ C, const int *__restrict__ offsets,
                  const int *__restrict__ map, int bound, int Nout, int K, int situ, float b1, float b2,
                  const CUtensorMap *__restrict__ tmt, int flags) {
#if FW_ARCH
    extern __shared__ __align__(1024) unsigned char fw_raw[];
    const unsigned base0 = (unsigned)__cvta_generic_to_shared(fw_raw);
    const unsigned sbase = (base0 + 1023) & ~1023u; /* the swizzle repeats every 1024 B */
    const unsigned sA = sbase, sB = sbase + FW_ST * FW_A_BYTES, sbar = sB + FW_ST * FW_B_BYTES;
    /* full[s] at sbar + 8s, empty[s] at sbar + 8(FW_ST + s) */
    const int ncolt = GLU ? (Nout + 127) / 128 : (Nout + 255) / 256;
    const int ktiles = (K + FW_BK - 1) / FW_BK;
    const int wg = threadIdx.x >> 7;
    if (threadIdx.x == 0) {
        for (int s = 0; s < FW_ST; s++) {
            st_mbar_init(sbar + 8 * s, 1);
            st_mbar_init(sbar + 8 * (FW_ST + s), 8); /* lane 0 of each consumer warp */
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if (flags & FW_F_PDL_TRIG) st_pdl_trigger();
    if (flags & FW_F_PDL_WAIT) st_pdl_wait(); /* h (the A operand) is the previous grid's output */
    /* work unit u (block b takes b, b + grid, …) → (tile-map entry, column tile, its expert); false past
     * the last one */
    auto unit = [&](unsigned u, int &ent, int &ct, int &e) -> bool {
        const int q = (int)(u / (unsigned)ncolt);
        ct = (int)(u - (unsigned)q * ncolt);
        if (q >= bound) return false;
        ent = q, e = map[2 * q];
        return e >= 0;
    };
    if (wg == 0) { /* producer */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (threadIdx.x == 0) {
            int it = 0, ent, ct, e, e_prev = -1;
            const CUtensorMap *pB1 = &tmB1, *pB3 = GLU ? &tmB3 : &tmB1;
            for (unsigned u = blockIdx.x; unit(u, ent, ct, e); u += gridDim.x) {
                const int m0 = map[2 * ent + 1];
                /* stacked weights: expert e's rows start at e·Nout; table mode: its own maps [Nout, K] */
                const int rb = tmt ? 0 : e * Nout;
                if (tmt && e != e_prev) {
                    pB1 = tmt + 3 * e + (GLU ? 0 : 2), pB3 = GLU ? tmt + 3 * e + 1 : pB1;
                    fw_tmap_acquire(pB1);
                    if (GLU) fw_tmap_acquire(pB3);
                    e_prev = e;
                }
                int r1, r3;
                if (GLU) r1 = r3 = rb + ct * 128;
                else r1 = rb + ct * 256, r3 = r1 + 128;
                for (int kt = 0; kt < ktiles; kt++, it++) {
                    const int s = it % FW_ST;
                    const unsigned ph = (unsigned)(it / FW_ST) & 1;
                    fw_bar_wait(sbar + 8 * (FW_ST + s), ph ^ 1);
                    const unsigned full = sbar + 8 * s;
                    st_mbar_expect(full, FW_A_BYTES + FW_B_BYTES);
                    const int k0 = kt * FW_BK;
                    st_tma2d(sA + s * FW_A_BYTES, &tmA, k0, m0, full);
                    st_tma2d(sB + s * FW_B_BYTES, pB1, k0, r1, full);
                    st_tma2d(sB + s * FW_B_BYTES + FW_B_BYTES / 2, pB3, k0, r3, full);
                }
            }
        }
        return;
    }
    /* consumers */
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    const int c = wg - 1, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    const float ib1 = 1.f / b1, ib2 = 1.f / b2;
    int it = 0, ent, ct, e;
    float acc[32][4];
    for (unsigned u = blockIdx.x; unit(u, ent, ct, e); u += gridDim.x) {
        const int m0 = map[2 * ent + 1], m_end = offsets[e + 1];
#pragma unroll
        for (int j = 0; j < 32; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
        for (int kt = 0; kt < ktiles; kt++, it++) {
            const int s = it % FW_ST;
            fw_bar_wait(sbar + 8 * s, (unsigned)(it / FW_ST) & 1);
            asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
            const unsigned a = sA + s * FW_A_BYTES + c * (64 * 128), b = sB + s * FW_B_BYTES;
#pragma unroll
            for (int kk = 0; kk < FW_BK / 16; kk++) fw_wgmma_n256(acc, fw_desc(a + kk * 32), fw_desc(b + kk * 32));
            asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
            if (kt > 0) {
                asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
                if (lane == 0) fw_bar_arrive(sbar + 8 * (FW_ST + (it - 1) % FW_ST));
            }
        }
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        if (lane == 0) fw_bar_arrive(sbar + 8 * (FW_ST + (it - 1) % FW_ST));
        /* epilogue: row of acc[j][q] = 16·warp + g + 8·(q >> 1), column 8j + 2·tq + (q & 1) */
        fw_epilogue<GLU, 1, GLU ? 16 : 32>(C, acc, m0, c, m_end, ct, Nout, flags & FW_F_VEC, warp, g, tq, situ,
                                           b1, b2, ib1, ib2);
    }
#else
    (void)offsets, (void)map, (void)bound, (void)Nout, (void)K, (void)situ, (void)b1, (void)b2, (void)C, (void)tmt,
        (void)flags;
    __trap(); /* never launched: the host checks the device before choosing this path */
#endif
}

/* ---------------- ping-pong consumers, both GEMMs in one launch (mode 5, ffn_wgp_kernel) ----------------
 * The same GEMMs with the CUTLASS "ping-pong" schedule: each consumer warpgroup owns a whole
 * 128 × 128 tile (two wgmma m64n128k16 per k16: rows 0..63 and 64..127 of A against the same B; 128
 * fp32 accumulators per thread as before), and the two warpgroups take the block's tiles in turn
 * (tile i of the block → warpgroup i % 2). The producer fills the ring in tile order, so while one
 * warpgroup runs its epilogue (GLU + stores) the other's MMAs keep the tensor cores busy, and the ring
 * never drains at a tile switch. A pair of mbarriers (turn[c], one arrival) orders the warpgroups:
 * warpgroup c starts waiting on tile i's stages only after the other has seen every stage of tile
 * i − 1 full (after issuing its last MMAs), so no consumer ever waits on a stage two phases ahead
 * (parity waits cannot tell those apart). 6-stage ring of 32 KB (A 128 × 64, B 128 × 64). GLU: B
 * rows 0..63 = w1_e rows n0.., 64..127 = w3_e rows n0.. (n0 = 64·column tile; boxes 64 × 64):
 * accumulator n8 block j (gate) pairs with j + 8 (up); h = act(gate, up) bf16, 64 columns a tile.
 * Down: 128 output columns of w2_e. Both GEMMs run in one persistent launch: every GLU tile first,
 * then every down tile; a down tile's producer waits until all GLU tiles of its tile-map entry are
 * stored (cnt[entry] == GLU column tiles; the GLU epilogue counts with a release after its stores).
 * The blocks claim tiles in that order from one counter (the producer, one atomic a tile; it queues
 * each claimed tile for the consumers in shared memory), so a down tile waits only on GLU tiles that
 * running blocks hold: the launch needs no co-residency and finishes on whatever SMs it gets (another
 * process's kernels under MPS, a walk waiting on the host: a grid that waited on blocks not yet
 * resident could wait forever).
 * Everything else (tile map, rows past the expert's end, table mode's per-expert tensor maps) as
 * ffn_wg_kernel. (Round 3 also measured these kernels as two launches, and a hybrid of gate/up on
 * ffn_wg_kernel + down on these, in two launches or fused: none won anywhere, so removed.) */
#define FP_ST 6
#define FP_A_BYTES (128 * FW_BK * 2) /* 16 KB */
#define FP_B_BYTES (128 * FW_BK * 2) /* 16 KB */
#define FP_Q 16 /* the claimed-tile queue (entries > FP_ST + 1: the ring's waits keep its reuse safe) */
#define FP_SMEM (1024 + FP_ST * (FP_A_BYTES + FP_B_BYTES) + (2 * FP_ST + 2 + FP_Q) * 8 + FP_Q * 8)
#if FW_ARCH
/* d[64 × 128] += A[64 × 16] · B[16 × 128], both K-major in 128-byte-swizzled shared memory */
__device__ __forceinline__ void fw_wgmma_n128(float d[16][4], uint64_t da, uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
        ST_WG_D128_LIST
        "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
        : ST_WG_D128_OPS(d)
        : "l"(da), "l"(db), "r"(1));
}
#endif

/* Arguments of ffn_wgp_kernel besides the tensor maps: h = act(x·w1ᵀ, x·w3ᵀ), y = h·w2ᵀ */
struct fwp_args {
    st_bf16_t *h;      /* [N, w] bf16: GLU output, down input */
    void *y;           /* [N, l] TC: down output */
    const int *offsets, *map; /* map[2·bound]: the number of entries */
    int *cnt;          /* [bound + 1] zeroed by ffn_tile_map_kernel: per-entry GLU tiles stored, the tile claims */
    int bound, l, w, situ;
    float b1, b2;
    const CUtensorMap *tmt; /* table mode: per-expert maps [E][3] (w1_e, w3_e, w2_e) */
    int flags;
};

/* grid: min(tiles, SMs) blocks of FW_THREADS threads, FP_SMEM bytes; any number of them resident at a
 * time (tiles are claimed in order: see above). tmX: x [N, l], tmH: h [N, w]
 * (boxes 64 × 128); tmW1, tmW3: w1, w3 [E·w, l] (boxes 64 × 64); tmW2: w2 [E·l, w] (box 64 × 128). */
template <typename TC>
__global__ void __launch_bounds__(FW_THREADS, 1)
    ffn_wgp_kernel(const __grid_constant__ CUtensorMap tmX, const __grid_constant__ CUtensorMap tmW1,
                   const __grid_constant__ CUtensorMap tmW3, const __grid_constant__ CUtensorMap tmH,
                   const __grid_constant__ CUtensorMap tmW2, const fwp_args P) {
#if FW_ARCH
    extern __shared__ __align__(1024) unsigned char fw_raw[];
    const unsigned base0 = (unsigned)__cvta_generic_to_shared(fw_raw);
    const unsigned sbase = (base0 + 1023) & ~1023u; /* the swizzle repeats every 1024 B */
    const unsigned sA = sbase, sB = sbase + FP_ST * FP_A_BYTES, sbar = sB + FP_ST * FP_B_BYTES;
    /* full[s] at sbar + 8s, empty[s] at sbar + 8(FP_ST + s), turn[c] at sbar + 8(2·FP_ST + c), the queue's
     * qfull[j] at qbar + 8j and its entries (unit, first ring step; unit −1: no more) after them */
    const unsigned qbar = sbar + 8 * (2 * FP_ST + 2);
    int2 *const qent = reinterpret_cast<int2 *>(fw_raw + (qbar + 8 * FP_Q - base0));
    const int l = P.l, w = P.w, bound = P.bound;
    const int nct1 = (w + 63) / 64, nct2 = (l + 127) / 128; /* column tiles: GLU (64 h columns), down */
    const int kt1 = (l + FW_BK - 1) / FW_BK, kt2 = (w + FW_BK - 1) / FW_BK;
    const int *__restrict__ map = P.map;
    const CUtensorMap *__restrict__ tmt = P.tmt;
    const int wg = threadIdx.x >> 7;
    if (threadIdx.x == 0) {
        for (int s = 0; s < FP_ST; s++) {
            st_mbar_init(sbar + 8 * s, 1);
            st_mbar_init(sbar + 8 * (FP_ST + s), 4); /* lane 0 of each warp of the consuming warpgroup */
        }
        st_mbar_init(sbar + 8 * (2 * FP_ST), 1);
        st_mbar_init(sbar + 8 * (2 * FP_ST + 1), 1);
        for (int j = 0; j < FP_Q; j++) st_mbar_init(qbar + 8 * j, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    /* (the launcher passes FW_F_VEC only: the PDL flags are inert here) */
    if (P.flags & FW_F_PDL_TRIG) st_pdl_trigger();
    if (P.flags & FW_F_PDL_WAIT) st_pdl_wait(); /* h (the A operand) is the previous grid's output */
    /* units [0, nglu) GLU tiles (entry-major), [nglu, ntot) down tiles, claimed in that order */
    unsigned nglu = 0, ntot = 0;
    {
        const unsigned nent = (unsigned)map[2 * bound];
        nglu = nent * (unsigned)nct1, ntot = nglu + nent * (unsigned)nct2;
    }
    /* unit u → (entry q, column tile ct, expert e, GLU or down); false where no expert is */
    auto unit = [&](unsigned u, int &q, int &ct, int &e, bool &glu) -> bool {
        glu = u < nglu;
        if (!glu) u -= nglu;
        const int nct = glu ? nct1 : nct2;
        q = (int)(u / (unsigned)nct);
        ct = (int)(u - (unsigned)q * nct);
        if (q >= bound) return false;
        e = map[2 * q];
        return e >= 0;
    };
    if (wg == 0) { /* producer */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (threadIdx.x == 0) {
            int it = 0, q = 0, ct = 0, e = 0, key_prev = -1, q_ready = -1;
            bool glu = false;
            const CUtensorMap *pB1 = nullptr, *pB3 = nullptr;
            unsigned *const claim = reinterpret_cast<unsigned *>(P.cnt + bound);
            for (unsigned i = 0;; i++) {
                unsigned u;
                do
                    u = atomicAdd(claim, 1u);
                while (u < ntot && !unit(u, q, ct, e, glu));
                /* NOTE: entry i's slot was read: the ring waits below saw tile i − FP_ST − 1 started */
                if (u >= ntot) { /* no more: both warpgroups' next entries say so */
                    qent[i % FP_Q] = make_int2(-1, 0), fw_bar_arrive(qbar + 8 * (i % FP_Q));
                    qent[(i + 1) % FP_Q] = make_int2(-1, 0), fw_bar_arrive(qbar + 8 * ((i + 1) % FP_Q));
                    break;
                }
                qent[i % FP_Q] = make_int2((int)u, it), fw_bar_arrive(qbar + 8 * (i % FP_Q));
                const int m0 = map[2 * q + 1];
                if (tmt) { /* table mode: the expert's own maps [Nout, K] */
                    if (2 * e + (int)glu != key_prev) {
                        pB1 = tmt + 3 * e + (glu ? 0 : 2), pB3 = glu ? tmt + 3 * e + 1 : pB1;
                        fw_tmap_acquire(pB1);
                        if (glu) fw_tmap_acquire(pB3);
                        key_prev = 2 * e + (int)glu;
                    }
                } else {
                    pB1 = glu ? &tmW1 : &tmW2, pB3 = &tmW3;
                }
                const int rb = tmt ? 0 : e * (glu ? w : l); /* stacked: expert e's rows start at e·Nout */
                const int r1 = rb + ct * (glu ? 64 : 128);
                if (!glu && q > q_ready) { /* h rows of entry q: all its GLU tiles stored */
                    const int *cp = P.cnt + q;
                    for (unsigned n = 0;; n++) {
                        int v;
                        asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(cp) : "memory");
                        if (v >= nct1) break;
                        if (n > (1u << 26)) __trap();
                        __nanosleep(32);
                    }
                    /* the generic-proxy stores (other blocks' epilogues) before this block's TMA reads */
                    asm volatile("fence.proxy.async.global;\n" ::: "memory");
                    q_ready = q;
                }
                const CUtensorMap *pA = glu ? &tmX : &tmH;
                const int kts = glu ? kt1 : kt2;
                for (int kt = 0; kt < kts; kt++, it++) {
                    const int s = it % FP_ST;
                    fw_bar_wait(sbar + 8 * (FP_ST + s), ((unsigned)(it / FP_ST) & 1) ^ 1);
                    const unsigned full = sbar + 8 * s;
                    st_mbar_expect(full, FP_A_BYTES + FP_B_BYTES);
                    const int k0 = kt * FW_BK;
                    st_tma2d(sA + s * FP_A_BYTES, pA, k0, m0, full);
                    st_tma2d(sB + s * FP_B_BYTES, pB1, k0, r1, full);
                    if (glu) st_tma2d(sB + s * FP_B_BYTES + FP_B_BYTES / 2, pB3, k0, r1, full);
                }
            }
        }
        return;
    }
    /* consumers: warpgroup c takes the block's tiles c, c + 2, c + 4, … */
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    const int c = wg - 1, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    const unsigned turn_me = sbar + 8 * (2 * FP_ST + c), turn_other = sbar + 8 * (2 * FP_ST + (c ^ 1));
    const int situ = P.situ;
    const float b1 = P.b1, b2 = P.b2, ib1 = 1.f / b1, ib2 = 1.f / b2;
    int q = 0, ct = 0, e = 0;
    bool glu = false;
    float acc[32][4]; /* rows 16hf + jj: half hf of the 128-row tile */
    for (unsigned i = (unsigned)c, j = 0;; i += 2, j++) {
        fw_bar_wait(qbar + 8 * (i % FP_Q), (i / FP_Q) & 1);
        const volatile int *qv = reinterpret_cast<volatile int *>(&qent[i % FP_Q]);
        const int2 ent = make_int2(qv[0], qv[1]);
        if (ent.x < 0) break;
        unit((unsigned)ent.x, q, ct, e, glu);
        const int m0 = map[2 * q + 1], m_end = P.offsets[e + 1];
        /* my turn: the other warpgroup has seen every stage of tile i − 1 full (its j-th or (j−1)-th
         * signal: warpgroup 0 waits for tile 2j − 1, warpgroup 1 for tile 2j) */
        if (i > 0) fw_bar_wait(turn_me, c ? (j & 1) : ((j - 1) & 1));
#pragma unroll
        for (int jj = 0; jj < 32; jj++) acc[jj][0] = acc[jj][1] = acc[jj][2] = acc[jj][3] = 0.f;
        int it = ent.y;
        const int kts = glu ? kt1 : kt2;
        for (int kt = 0; kt < kts; kt++, it++) {
            const int s = it % FP_ST;
            fw_bar_wait(sbar + 8 * s, (unsigned)(it / FP_ST) & 1);
            asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
            const unsigned a = sA + s * FP_A_BYTES, b = sB + s * FP_B_BYTES;
#pragma unroll
            for (int kk = 0; kk < FW_BK / 16; kk++) {
                fw_wgmma_n128(acc, fw_desc(a + kk * 32), fw_desc(b + kk * 32));
                fw_wgmma_n128(acc + 16, fw_desc(a + 64 * 128 + kk * 32), fw_desc(b + kk * 32));
            }
            asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
            if (kt > 0) {
                asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
                if (lane == 0) fw_bar_arrive(sbar + 8 * (FP_ST + (it - 1) % FP_ST));
            }
        }
        /* every stage of tile i seen full and its MMAs issued: the other warpgroup may start tile i + 1 */
        if ((threadIdx.x & 127) == 0) fw_bar_arrive(turn_other);
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        if (lane == 0) fw_bar_arrive(sbar + 8 * (FP_ST + (it - 1) % FP_ST));
        /* epilogue: row of acc[16hf + jj][r] = 64hf + 16·warp + g + 8·(r >> 1), column 8jj + 2·tq + (r & 1) */
        const bool vec = (P.flags & FW_F_VEC) != 0;
        if (glu) {
            fw_epilogue<true, 2, 8>(P.h, acc, m0, 0, m_end, ct, w, vec, warp, g, tq, situ, b1, b2, ib1, ib2);
            { /* this warpgroup's stores, then one release-add on the entry's counter */
                asm volatile("bar.sync %0, 128;\n" ::"r"(1 + c) : "memory");
                if ((threadIdx.x & 127) == 0) {
                    __threadfence();
                    asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(P.cnt + q) : "memory");
                }
            }
        } else {
            fw_epilogue<false, 2, 16>(reinterpret_cast<TC *>(P.y), acc, m0, 0, m_end, ct, l, vec, warp, g, tq, situ,
                                      b1, b2, ib1, ib2);
        }
    }
#else
    (void)P;
    __trap(); /* never launched: the host checks the device before choosing this path */
#endif
}

static int ffn_tile_bound(int E, int N, int max_rows) {
    long a = (long)(N + FB_M - 1) / FB_M + E;
    long b = (long)E * ((max_rows + FB_M - 1) / FB_M);
    return (int)(a < b ? a : b);
}

/* ---------------- choosing the grouped kernels; the Hopper path's host side ---------------- */
/* The grouped GEMMs run on mma.sync where the Hopper path cannot (fw_usable: not sm_90, or no tensor-map
 * encoder); on sm_90 they run on ffn_wg_kernel (cooperative consumers, 128 × 256 tiles, two launches:
 * "mode 2") or both in one launch of ffn_wgp_kernel (ping-pong consumers, 128 × 128 tiles: "mode 5"),
 * chosen per call: 5 when the experts average fewer than FW_AUTO_FUSED_MAX rows (N < FW_AUTO_FUSED_MAX · E)
 * and are small (ℓ · w ≤ FW_AUTO_FUSED_LW), else 2. Removed in round 3 (measured, never best): 3 clusters
 * of two blocks, 4 ping-pong in two launches, 6 gate/up cooperative + down ping-pong, 7 the same fused in
 * one launch (docs/kernels.md). The mode switch, its environment variables and the setter are gone
 * (issue 14): the choices below are constants, each with its measurement.
 * NOTE: why (H200, 2026-11-30, round 3, TFLOP/s at E=64 × 128 / 64 × 512 / 16 × 2048, bench_gpu_moe_ffn
 * variants, two processes): 2 — 291-319 / 477-532 / 550-581; 5 — 345-355 / 428-455 / 491-506; 4 —
 * 317-327 / 420-443 / 481-494; 6 — 307-319 / 450-468 / 533-561; 7 — 334-338 / 460-472 / 524-569.
 * The ping-pong consumers hide the epilogue under the other warpgroup's MMAs, but their 128 × 128 tiles
 * need 1.25× the shared-memory bandwidth per FLOP of 128 × 256 (each m64n128 wgmma reads B again; with
 * the TMA writes ~160 B/clk/SM against 128 at the tensor peak, vs ~128 for 128 × 256), so they only win
 * where tiles are few and short (small experts: fewer, shorter tiles, and the fused launch removes the
 * kernel boundary). What made ffn_wg_kernel faster in round 3 is its epilogue: 16-byte stores after a
 * quad transpose (fw_st_quad) instead of 4-byte ones over 8 rows (ncu at E=16 × 2048: down GEMM 23%
 * fewer cycles, tensor pipe 61% → 78% active; gate/up 4% fewer, 81% → 85%): FW_VEC. */
#define FW_AUTO_FUSED_MAX 256
#define FW_VEC 1 /* 16-byte epilogue stores (the measurement just above) */
/* NOTE: at K3's expert widths (ℓ 3584, w 3072) decode steps (~10 rows per expert) ran faster on mode 2:
 * k3-mini greedy decode in one process, mode 2 vs the fused kernel: batch 32 0.924× the step time,
 * batch 1 0.983×, batch 256 0.996× (H200, session 5, bench_gpu_e2e STRATA_BENCH_AB); at ℓ 1024 × w 512
 * the fused kernel wins (+10%, above). Many tiles per expert, so the launch it saves matters less. */
#define FW_AUTO_FUSED_LW (4L << 20)
/* table mode, default rule (min_rows_cublas 0), wgmma kernels on: 1 → every expert grouped */
#define FW_HOSTED_GROUPED 1
/* st_cuda_moe_ffn_slots_pick: up to this many routed slots (docs/perf/history.md, "per-slot decode FFN") */
#define FS_MAX_SLOTS 64
/* FW_PDL: programmatic dependent launch between mode 2's two launches. NOTE: passes the test but
 * measured no faster (H200, 2026-11-30: single blocks 264/461/551 TFLOP/s; + PDL 270/444/533): off.
 * FW_TABLE: the table mode (per-expert tensor maps built on the device each call) on the wgmma kernels;
 * passed test_gpu_moe_ffn on the H200 (2026-11-30, every wgmma mode), and is what the expert server runs. */
#define FW_PDL 0
#define FW_TABLE 1
typedef CUresult (*fw_encode_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                 const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
static int fw_sms = 0; /* persistent blocks per GEMM (one per SM; set by fw_usable) */
static fw_encode_fn fw_enc = nullptr;

template <typename K>
static bool fw_attr(K kern, int bytes) {
    return cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) == cudaSuccess;
}

/* can the wgmma path run here (compute capability 9.0, the tensor-map encoder, the smem opt-in)? */
static bool fw_usable(void) {
    static int ok = -1; /* NOTE: idempotent; a race only repeats the queries */
    if (ok >= 0) return ok;
    int dev = 0, major = 0, minor = 0;
    bool good = cudaGetDevice(&dev) == cudaSuccess &&
                cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
                cudaDeviceGetAttribute(&fw_sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess && major == 9 &&
                minor == 0 && fw_sms > 0;
    if (good) {
        void *fn = nullptr;
        cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
        good = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) ==
                   cudaSuccess &&
               q == cudaDriverEntryPointSuccess && fn;
        fw_enc = good ? (fw_encode_fn)fn : nullptr;
    }
    if (good)
        good = fw_attr(ffn_wg_kernel<true, st_bf16_t>, FW_SMEM) && fw_attr(ffn_wg_kernel<false, float>, FW_SMEM) &&
               fw_attr(ffn_wgp_kernel<float>, FP_SMEM);
    (void)cudaGetLastError(); /* a failed query leaves no error behind */
    ok = good;
    return good;
}

/* 2-D bf16 tensor map over rows × cols (row-major, cols % 8 == 0), box 64 cols × box_rows rows (128, or
 * 64 for the ping-pong kernel's GLU weights), 128B swizzle */
static bool fw_map(CUtensorMap *m, const void *p, size_t rows, int cols, unsigned box_rows = 128) {
    const cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)cols * 2};
    const cuuint32_t box[2] = {FW_BK, box_rows}, es[2] = {1, 1};
    return fw_enc(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void *>(p), dims, strides, box, es,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

/* one GEMM on ffn_wg_kernel, one block per SM at most; FW_F_PDL_WAIT: launched as a programmatic
 * dependent of the previous kernel in the stream (the kernel waits for it before reading anything) */
template <bool GLU, typename TC>
static st_status_t fw_gemm(cudaStream_t cs, const CUtensorMap &tA, const CUtensorMap &tB1, const CUtensorMap &tB3,
                           TC *C, const int *offsets, const int *map, int bound, int Nout, int K, int situ, float b1,
                           float b2, const CUtensorMap *tmt, int flags) {
    const long t = (long)bound * (GLU ? (Nout + 127) / 128 : (Nout + 255) / 256);
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1];
    int na = 0;
    if (flags & FW_F_PDL_WAIT) {
        at[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[na].val.programmaticStreamSerializationAllowed = 1;
        na++;
    }
    cfg.gridDim = dim3((unsigned)(t < fw_sms ? t : fw_sms));
    cfg.blockDim = dim3(FW_THREADS), cfg.dynamicSmemBytes = FW_SMEM;
    cfg.stream = cs, cfg.attrs = at, cfg.numAttrs = (unsigned)na;
    st_status_t rc = ST_CUDA_CHECK(cudaLaunchKernelEx(&cfg, ffn_wg_kernel<GLU, TC>, tA, tB1, tB3, C, offsets, map,
                                                      bound, Nout, K, situ, b1, b2, tmt, flags));
    if (rc) return rc;
    return ST_LAUNCH_OK(GLU ? "ffn_wg_kernel<glu>" : "ffn_wg_kernel<down>");
}

/* both GEMMs on the fused ping-pong kernel: min(tiles, SMs) persistent blocks (tiles claimed in order:
 * no co-residency needed) */
template <typename TC>
static st_status_t fw_gemm_pp(cudaStream_t cs, const CUtensorMap &tX, const CUtensorMap &tW1, const CUtensorMap &tW3,
                              const CUtensorMap &tH, const CUtensorMap &tW2, const fwp_args &P) {
    const long t = (long)P.bound * ((P.w + 63) / 64 + (P.l + 127) / 128);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)(t < fw_sms ? t : fw_sms));
    cfg.blockDim = dim3(FW_THREADS), cfg.dynamicSmemBytes = FP_SMEM;
    cfg.stream = cs;
    st_status_t rc = ST_CUDA_CHECK(cudaLaunchKernelEx(&cfg, ffn_wgp_kernel<TC>, tX, tW1, tW3, tH, tW2, P));
    if (rc) return rc;
    return ST_LAUNCH_OK("ffn_wgp_kernel");
}

/* Table mode: the per-expert tensor maps tm [E][3] (w1_e, w3_e [w, l]; w2_e [l, w]) from the device
 * pointer table, each a copy of the template of its shape with the global address replaced
 * (tensormap.replace in shared memory, then copied out with the tensormap proxy release; the GEMM
 * kernels acquire each map before their first copy through it). One warp per map; a weight pointer
 * that is not 16-byte aligned (TMA's rule) traps. */
__global__ void __launch_bounds__(128) ffn_tmap_kernel(CUtensorMap *__restrict__ tm,
                                                       const st_bf16_t *const *__restrict__ tab, int E,
                                                       const __grid_constant__ CUtensorMap t13,
                                                       const __grid_constant__ CUtensorMap t2) {
#if FW_ARCH
    __shared__ __align__(128) CUtensorMap sm[4];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, i = blockIdx.x * 4 + warp;
    if (i >= 3 * E) return; /* whole warps */
    const int k = i % 3;
    const uint32_t *src = reinterpret_cast<const uint32_t *>(k == 2 ? &t2 : &t13);
    reinterpret_cast<uint32_t *>(&sm[warp])[lane] = src[lane];
    __syncwarp();
    const uint64_t p = (uint64_t)tab[i];
    if (p & 15) __trap();
    const unsigned sa = (unsigned)__cvta_generic_to_shared(&sm[warp]);
    if (lane == 0)
        asm volatile("tensormap.replace.tile.global_address.shared::cta.b1024.b64 [%0], %1;\n" ::"r"(sa), "l"(p)
                     : "memory");
    __syncwarp();
    asm volatile(
        "tensormap.cp_fenceproxy.global.shared::cta.tensormap::generic.release.gpu.sync.aligned [%0], [%1], 128;\n" ::"l"(
            (uint64_t)(tm + i)),
        "r"(sa)
        : "memory");
#else
    (void)tm, (void)tab, (void)E;
    __trap();
#endif
}

/* Both GEMMs on the wgmma kernels (tile map already built). *used = false (nothing launched) if a
 * tensor map cannot be encoded: the caller runs the mma.sync kernels instead. Table mode (tab): the
 * per-expert maps go into tmt ([E][3], 128-byte aligned), built by ffn_tmap_kernel first. */
template <typename TY>
static st_status_t ffn_wg_launch(cudaStream_t cs, TY *y, st_bf16_t *h, const int *map, int *cnt, int bound,
                                 const st_bf16_t *x,
                                 const int *offsets, int E, int N, const st_bf16_t *w1, const st_bf16_t *w3,
                                 const st_bf16_t *w2, int l, int w, bool situ, float b1, float b2,
                                 const st_bf16_t *const *tab, CUtensorMap *tmt, bool *used) {
    CUtensorMap mx, m1, m3, mh, m2;
    /* per call, from the average rows and the expert size */
    const int mode = (long)N < (long)FW_AUTO_FUSED_MAX * E && (long)l * w <= FW_AUTO_FUSED_LW ? 5 : 2;
    const unsigned r13 = mode == 5 ? 64 : 128; /* w1/w3 boxes: 64 rows on the ping-pong kernel (NOTE: the
                                                * table mode's w1/w3 template carries this box too) */
    if (tab) /* templates: one expert's shapes at some aligned address (replaced per expert) */
        *used = fw_map(&mx, x, (size_t)N, l) && fw_map(&mh, h, (size_t)N, w) &&
                fw_map(&m1, h, (size_t)w, l, r13) && fw_map(&m2, h, (size_t)l, w);
    else
        *used = fw_map(&mx, x, (size_t)N, l) && fw_map(&m1, w1, (size_t)E * w, l, r13) &&
                fw_map(&m3, w3, (size_t)E * w, l, r13) && fw_map(&mh, h, (size_t)N, w) &&
                fw_map(&m2, w2, (size_t)E * l, w);
    if (!*used) return ST_OK;
    st_status_t rc;
    if (tab) {
        ffn_tmap_kernel<<<(3 * E + 3) / 4, 128, 0, cs>>>(tmt, tab, E, m1, m2);
        if ((rc = ST_LAUNCH_OK("ffn_tmap_kernel"))) return rc;
        m3 = m1;
    } else {
        tmt = nullptr;
    }
    /* 16-byte epilogue stores: h is (its tensor map needs 16-byte alignment), y must be */
    const int vh = FW_VEC ? FW_F_VEC : 0, vy = FW_VEC && !((uintptr_t)y & 15) ? FW_F_VEC : 0;
    if (mode == 5) {
        const fwp_args P = {h, y, offsets, map, cnt, bound, l, w, situ ? 1 : 0, b1, b2, tmt, vh & vy};
        return fw_gemm_pp<TY>(cs, mx, m1, m3, mh, m2, P);
    }
    const int f1 = (FW_PDL ? FW_F_PDL_TRIG : 0) | vh, f2 = (FW_PDL ? FW_F_PDL_WAIT : 0) | vy;
    if ((rc = fw_gemm<true, st_bf16_t>(cs, mx, m1, m3, h, offsets, map, bound, w, l, situ, b1, b2, tmt, f1)))
        return rc;
    return fw_gemm<false, TY>(cs, mh, m2, m2, y, offsets, map, bound, l, w, 0, 1.f, 1.f, tmt, f2);
}

extern "C" size_t st_cuda_moe_ffn_ws_bytes(int N, int w) {
    /* h [N, w] bf16, then the tile map (bound ≤ N/128 + 1 + E entries; E unknown here, so the
     * map is carved with room for N/128 + 1 + 4096 experts; entry `bound` holds the entry count), then
     * one counter per entry (the fused ping-pong kernel) */
    size_t h = ((size_t)N * w * 2 + 255) & ~(size_t)255;
    return h + sizeof(int) * ((size_t)FFN_MAP_INTS(N) + (size_t)(N + FB_M - 1) / FB_M + 1 + 4096);
}

static st_status_t ffn_set_attrs(void) {
    static bool attr_done = false; /* NOTE: idempotent; a race only repeats the calls */
    if (attr_done) return ST_OK;
    st_status_t rc = ST_CUDA_CHECK(
        cudaFuncSetAttribute(ffn_gemm_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, FB_SMEM));
    if (!rc)
        rc = ST_CUDA_CHECK(cudaFuncSetAttribute(ffn_gemm_kernel<false, float>,
                                                cudaFuncAttributeMaxDynamicSharedMemorySize, FB_SMEM));
    if (!rc) attr_done = true;
    return rc;
}

/* The grouped mma.sync path over the experts with 1 ≤ rows < big (big = INT_MAX: all of them);
 * max_rows bounds those experts' rows. h: ws's first region, map: the tile map after it. */
template <typename TY>
static st_status_t ffn_grouped_launch(cudaStream_t cs, TY *y, st_bf16_t *h, int *map, const st_bf16_t *x,
                                      const int *offsets, int E, int N, int max_rows, int big, const st_bf16_t *w1,
                                      const st_bf16_t *w3, const st_bf16_t *w2, int l, int w, bool situ, float b1,
                                      float b2, const st_bf16_t *const *tab = nullptr, CUtensorMap *tmt = nullptr) {
    st_status_t rc = ffn_set_attrs();
    if (rc) return rc;
    int bound = ffn_tile_bound(E, N, max_rows);
    int *cnt = map + FFN_MAP_INTS(N); /* the fused kernel's per-entry counters */
    ffn_tile_map_kernel<<<1, 1024, 0, cs>>>(map, cnt, offsets, E, bound, big);
    if ((rc = ST_LAUNCH_OK("ffn_tile_map_kernel"))) return rc;
    /* the Hopper kernels: stacked weights, or the table mode with room for its tensor maps */
    if (fw_usable() && (!tab || (FW_TABLE && tmt))) {
        bool used = false;
        rc = ffn_wg_launch<TY>(cs, y, h, map, cnt, bound, x, offsets, E, N, w1, w3, w2, l, w, situ, b1, b2, tab,
                               tmt, &used);
        if (rc || used) return rc;
    }
    ffn_gemm_kernel<true><<<dim3(bound, (w + 63) / 64), FB_THREADS, FB_SMEM, cs>>>(h, x, w1, w3, offsets, map, w, l,
                                                                                   situ, b1, b2, tab, 0);
    if ((rc = ST_LAUNCH_OK("ffn_gemm_kernel<glu>"))) return rc;
    ffn_gemm_kernel<false, TY><<<dim3(bound, (l + 127) / 128), FB_THREADS, FB_SMEM, cs>>>(y, h, w2, nullptr, offsets,
                                                                                          map, l, w, 0, 0.f, 0.f, tab, 2);
    return ST_LAUNCH_OK("ffn_gemm_kernel<down>");
}

template <typename TY>
static st_status_t moe_ffn_any(const st_gpu_stream_t *s, TY *y, const st_bf16_t *x, const int *offsets, int E, int N,
                               int max_rows_per_expert, const st_bf16_t *w1, const st_bf16_t *w3, const st_bf16_t *w2,
                               int l, int w, bool situ, float b1, float b2, void *ws, size_t ws_bytes) {
    if (E <= 0 || E > 4096 || N < 0 || max_rows_per_expert < 0 || l <= 0 || w <= 0 || l % 8 || w % 8 ||
        ws_bytes < st_cuda_moe_ffn_ws_bytes(N, w))
        return ST_FAIL(ST_ERR_INVALID_ARG, "moe_ffn: E=%d N=%d max_rows=%d l=%d w=%d ws=%zu (need %zu)", E, N,
                       max_rows_per_expert, l, w, ws_bytes, st_cuda_moe_ffn_ws_bytes(N, w));
    if (!N || !max_rows_per_expert) return ST_OK;
    st_bf16_t *h = (st_bf16_t *)ws;
    int *map = (int *)((uint8_t *)ws + (((size_t)N * w * 2 + 255) & ~(size_t)255));
    return ffn_grouped_launch<TY>(ST_STREAM(s), y, h, map, x, offsets, E, N, max_rows_per_expert, 0x7fffffff, w1, w3,
                                  w2, l, w, situ, b1, b2);
}

extern "C" st_status_t st_cuda_moe_ffn(const st_gpu_stream_t *s, float *y, const st_bf16_t *x, const int *offsets,
                                       int E, int N, int max_rows_per_expert, const st_bf16_t *w1, const st_bf16_t *w3,
                                       const st_bf16_t *w2, int l, int w, bool situ, float b1, float b2, void *ws,
                                       size_t ws_bytes) {
    return moe_ffn_any<float>(s, y, x, offsets, E, N, max_rows_per_expert, w1, w3, w2, l, w, situ, b1, b2, ws,
                              ws_bytes);
}

/* ---------------- table mode (row counts on the host): big experts through cuBLAS ----------------
 * Routing rule (st_cuda_moe_ffn_table): an expert with rows ≥ big goes to cuBLAS, every other non-empty
 * expert to the grouped kernels above (their tile map skips the big ones; the two write disjoint rows of
 * h and y). big = min_rows_cublas if > 0, else (off the wgmma kernels) ffn_cublas_min_rows(ℓ, w), the
 * smallest row count with rows·ℓ·w ≥ 2^30.
 * NOTE: why (H200, bench_gpu_moe_ffn): a cuBLAS call costs ~7 µs however small (64 experts × 2 calls
 * of 128 rows: 0.89 ms), and the calls go per run of adjacent experts with equal rows, so with uneven
 * counts each cuBLAS expert costs ~14 µs; under 6·2^30 FLOPs (~12 µs at ~550 TFLOP/s) its GEMMs take
 * less than that and the grouped kernels win.
 * The big experts run together, in three steps:
 *   (1) gate/up: per big expert e two GEMMs, gu[rows_e, 0:w] = x_e·w1_eᵀ and gu[rows_e, w:2w] =
 *       x_e·w3_eᵀ (bf16, row pitch 2w);
 *   (2) ONE GLU kernel over the rows of all big experts: h = act(gate, up) (bf16);
 *   (3) down: y_e = h_e·w2_eᵀ (bf16 or fp32).
 (1) and (3) are one cublasGemmBatchedEx per run of adjacent big experts with equal rows (gate and up
 * of all of them in one batch). (Two other ways, cublasGemmStridedBatchedEx per run and one batched
 * call per expert, were measured no faster and deleted with the variant switch: docs/kernels.md.
 * cublasGemmGroupedBatchedEx was tried:
 * cuBLAS 13.1 runs it with sm80 warp-MMA kernels at ~280 TFLOP/s, refuses fp32 C, and compute-sanitizer
 * flags invalid writes inside it; so it is not used.)
 * The device pointer arrays and the big experts' row ranges live in ws and are written by one small
 * kernel from the device offsets (no host→device copy, no allocation). */
#define FH_MAXE 4096
#define FH_ALIGN(b) (((size_t)(b) + 255) & ~(size_t)255)

static int ffn_cublas_min_rows(int l, int w) {
    long lw = (long)(l > 0 ? l : 1) * (w > 0 ? w : 1);
    return (int)(((1L << 30) + lw - 1) / lw);
}

struct ffn_ptrs {
    const void **a13, **b13; /* [2·nb]: problem 2j = gate of big expert j, 2j+1 = up */
    void **c13;
    const void **a2, **b2; /* [nb]: down */
    void **c2;
    int *rr; /* [nb, 2]: rows r0, r1 of big expert j */
};

static ffn_ptrs ffn_ptrs_carve(void *p) {
    ffn_ptrs P;
    void **q = (void **)p;
    P.a13 = (const void **)q, P.b13 = (const void **)(q + 2 * FH_MAXE), P.c13 = q + 4 * FH_MAXE;
    P.a2 = (const void **)(q + 6 * FH_MAXE), P.b2 = (const void **)(q + 7 * FH_MAXE), P.c2 = q + 8 * FH_MAXE;
    P.rr = (int *)(q + 9 * FH_MAXE);
    return P;
}
#define FH_PTR_BYTES ((size_t)9 * FH_MAXE * sizeof(void *) + (size_t)2 * FH_MAXE * sizeof(int))
/* the table mode's per-expert tensor maps on the wgmma kernels: [FH_MAXE][3] CUtensorMap */
#define FH_TM_BYTES ((size_t)3 * FH_MAXE * sizeof(CUtensorMap))

/* big expert j = expert e, rows r0 .. r0+c-1: its problems' pointers and its row range */
__host__ __device__ inline void ffn_ptrs_put(const ffn_ptrs &P, int j, int e, int r0, int c, const st_bf16_t *x,
                                             const st_bf16_t *w1, const st_bf16_t *w3, const st_bf16_t *w2,
                                             st_bf16_t *gu, st_bf16_t *h, unsigned char *y, int y_elt, int l, int w,
                                             const st_bf16_t *const *tab = nullptr) {
    const st_bf16_t *xe = x + (size_t)r0 * l;
    P.a13[2 * j] = tab ? tab[3 * e] : w1 + (size_t)e * w * l;
    P.a13[2 * j + 1] = tab ? tab[3 * e + 1] : w3 + (size_t)e * w * l;
    P.b13[2 * j] = xe, P.b13[2 * j + 1] = xe;
    P.c13[2 * j] = gu + (size_t)r0 * 2 * w, P.c13[2 * j + 1] = gu + (size_t)r0 * 2 * w + w;
    P.a2[j] = tab ? tab[3 * e + 2] : w2 + (size_t)e * l * w, P.b2[j] = h + (size_t)r0 * w;
    P.c2[j] = y + (size_t)r0 * l * y_elt;
    P.rr[2 * j] = r0, P.rr[2 * j + 1] = r0 + c;
}

/* One block of 1024 threads: rank j of each expert with rows ≥ big among those (expert order), then
 * its pointers. y_elt: bytes per y element (2 or 4). */
__global__ void ffn_cublas_ptrs_kernel(ffn_ptrs P, const int *offsets, int E, int big, const st_bf16_t *x,
                                       const st_bf16_t *w1, const st_bf16_t *w3, const st_bf16_t *w2, st_bf16_t *gu,
                                       st_bf16_t *h, unsigned char *y, int y_elt, int l, int w,
                                       const st_bf16_t *const *tab) {
    __shared__ int wsum[32];
    __shared__ int carry;
    if (threadIdx.x == 0) carry = 0;
    __syncthreads();
    for (int e0 = 0; e0 < E; e0 += 1024) {
        int e = e0 + threadIdx.x;
        int r0 = e < E ? offsets[e] : 0, c = e < E ? offsets[e + 1] - r0 : 0;
        int f = c > 0 && c >= big;
        int j = carry + st_block_scan_incl(f, wsum) - 1;
        if (f) ffn_ptrs_put(P, j, e, r0, c, x, w1, w3, w2, gu, h, y, y_elt, l, w, tab);
        __syncthreads();
        if (threadIdx.x == 0) carry += wsum[31];
        __syncthreads();
    }
}

/* h [rows, w] = act(gu[:, 0:w], gu[:, w:2w]) for the rows of big expert blockIdx.y; 8 columns a
 * thread (16-byte loads and stores; w % 8 == 0). */
__global__ void ffn_glu_rows_kernel(st_bf16_t *__restrict__ h, const st_bf16_t *__restrict__ gu,
                                    const int *__restrict__ rr, int w, int situ, float b1, float b2) {
    const int r0 = rr[2 * blockIdx.y], r1 = rr[2 * blockIdx.y + 1], w8 = w >> 3;
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    const long row = r0 + i / w8;
    if (row >= r1) return;
    const int c = (int)(i % w8) * 8;
    const uint4 ga = *reinterpret_cast<const uint4 *>(gu + row * 2 * w + c);
    const uint4 ua = *reinterpret_cast<const uint4 *>(gu + row * 2 * w + w + c);
    const uint32_t gv[4] = {ga.x, ga.y, ga.z, ga.w}, uv[4] = {ua.x, ua.y, ua.z, ua.w};
    uint32_t o[4];
#pragma unroll
    for (int q = 0; q < 4; q++) {
        float a0 = __uint_as_float(gv[q] << 16), a1 = __uint_as_float(gv[q] & 0xffff0000u);
        float u0 = __uint_as_float(uv[q] << 16), u1 = __uint_as_float(uv[q] & 0xffff0000u);
        o[q] = st_pack_bf2(ffn_act(a0, u0, situ, b1, b2), ffn_act(a1, u1, situ, b1, b2));
    }
    *reinterpret_cast<uint4 *>(h + row * w + c) = make_uint4(o[0], o[1], o[2], o[3]);
}

/* a run: big experts e0 .. e0+n-1 (adjacent expert ids, so their weights and rows are adjacent too),
 * ranks j0 .. j0+n-1, all with M rows */
struct ffn_run {
    int M, j0, n, e0;
};
/* Next run from expert *e on (rank *j): adjacent big experts with equal rows form one run. */
static bool ffn_next_run(const int *oh, int E, int big, int *e, int *j, ffn_run *r) {
    while (*e < E && (oh[*e + 1] - oh[*e] < big || oh[*e + 1] == oh[*e])) (*e)++;
    if (*e >= E) return false;
    r->M = oh[*e + 1] - oh[*e], r->j0 = *j, r->n = 0, r->e0 = *e;
    while (*e < E) {
        int c = oh[*e + 1] - oh[*e];
        if (c != r->M) break; /* c == M ≥ big ≥ 1: a big expert */
        r->n++, (*j)++, (*e)++;
    }
    return true;
}

/* One GEMM phase over all big experts. phase 0: gate/up (2 problems per expert), 1: down (y fp32). */
static st_status_t ffn_cublas_phase(cublasHandle_t hd, int phase, const ffn_ptrs &P, const int *oh, int E, int big,
                                    int l, int w) {
    const float one = 1.f, zero = 0.f;
    const int m = phase ? l : w, k = phase ? w : l, ldc = phase ? l : 2 * w, per = phase ? 1 : 2;
    const cudaDataType_t ct = phase ? CUDA_R_32F : CUDA_R_16BF;
    const void **A = phase ? P.a2 : P.a13, **B = phase ? P.b2 : P.b13;
    void **C = phase ? P.c2 : P.c13;
    int e = 0, j = 0;
    ffn_run r;
    st_status_t rc;
    while (ffn_next_run(oh, E, big, &e, &j, &r)) {
        const int p0 = r.j0 * per;
        if ((rc = ST_CUBLAS_CHECK(cublasGemmBatchedEx(hd, CUBLAS_OP_T, CUBLAS_OP_N, m, r.M, k, &one, A + p0,
                                                      CUDA_R_16BF, k, B + p0, CUDA_R_16BF, k, &zero, C + p0, ct, ldc,
                                                      r.n * per, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT))))
            return rc;
    }
    return ST_OK;
}

extern "C" size_t st_cuda_moe_ffn_table_ws_bytes(int N, int w) {
    /* [h + tile map: st_cuda_moe_ffn_ws_bytes][gu [N, 2w] bf16][pointer arrays, row ranges][table
     * mode's tensor maps], each region 256-byte aligned (NOTE: the GLU kernel reads gu with 16-byte
     * loads; FH_PTR_BYTES is a multiple of 256) */
    return FH_ALIGN(st_cuda_moe_ffn_ws_bytes(N, w)) + FH_ALIGN((size_t)N * 2 * w * 2) + FH_PTR_BYTES + FH_TM_BYTES;
}

/* the rows from which st_cuda_moe_ffn_table sends an expert to cuBLAS (INT_MAX: none) */
static int ffn_table_big(int min_rows_cublas, int l, int w) {
    /* the default rule on the wgmma kernels: no expert via cuBLAS (NOTE: the grouped kernel is at least
     * as fast as cuBLAS there, without its ~7 µs per call) */
    if (!min_rows_cublas && FW_HOSTED_GROUPED && fw_usable() && FW_TABLE) return 0x7fffffff;
    return min_rows_cublas > 0 ? min_rows_cublas : ffn_cublas_min_rows(l, w);
}

extern "C" bool st_cuda_moe_ffn_table_fixed(int max_rows, int min_rows_cublas, int l, int w) {
    return l > 0 && w > 0 && min_rows_cublas >= 0 && max_rows < ffn_table_big(min_rows_cublas, l, w);
}

extern "C" st_status_t st_cuda_moe_ffn_table(const st_gpu_stream_t *s, float *y, const st_bf16_t *x, const int *offsets,
                                             const int *offsets_host, int E, int min_rows_cublas,
                                             const st_bf16_t *const *tab, int l, int w, bool situ, float b1, float b2,
                                             void *ws, size_t ws_bytes) {
    if (!tab || E <= 0 || E > FH_MAXE || !offsets_host || offsets_host[0] != 0 || l <= 0 || w <= 0 || l % 8 || w % 8 ||
        min_rows_cublas < 0)
        return ST_FAIL(ST_ERR_INVALID_ARG, "moe_ffn_table: tab=%p E=%d l=%d w=%d min_rows=%d offsets_host[0]=%d",
                       (const void *)tab, E, l, w, min_rows_cublas, offsets_host ? offsets_host[0] : -1);
    int N = offsets_host[E], big = ffn_table_big(min_rows_cublas, l, w);
    int max_small = 0, nb = 0, max_big = 0;
    for (int e = 0; e < E; e++) {
        int c = offsets_host[e + 1] - offsets_host[e];
        if (c < 0) return ST_FAIL(ST_ERR_INVALID_ARG, "moe_ffn_table: offsets decrease at expert %d", e);
        if (c >= big) nb++, max_big = c > max_big ? c : max_big;
        else if (c > max_small) max_small = c;
    }
    if (ws_bytes < st_cuda_moe_ffn_table_ws_bytes(N, w) || ((uintptr_t)ws & 255))
        return ST_FAIL(ST_ERR_INVALID_ARG, "moe_ffn_table: ws=%p, %zu bytes (need %zu, 256-byte aligned)", ws,
                       ws_bytes, st_cuda_moe_ffn_table_ws_bytes(N, w));
    if (!N) return ST_OK;
    st_bf16_t *h = (st_bf16_t *)ws;
    int *map = (int *)((uint8_t *)ws + (((size_t)N * w * 2 + 255) & ~(size_t)255));
    st_bf16_t *gu = (st_bf16_t *)((uint8_t *)ws + FH_ALIGN(st_cuda_moe_ffn_ws_bytes(N, w)));
    ffn_ptrs P = ffn_ptrs_carve((uint8_t *)gu + FH_ALIGN((size_t)N * 2 * w * 2));
    CUtensorMap *tmt = (CUtensorMap *)((uint8_t *)gu + FH_ALIGN((size_t)N * 2 * w * 2) + FH_PTR_BYTES);
    cudaStream_t cs = ST_STREAM(s);
    st_status_t rc;
    if (max_small > 0) {
        rc = ffn_grouped_launch<float>(cs, y, h, map, x, offsets, E, N, max_small, big, nullptr, nullptr, nullptr, l, w,
                                       situ, b1, b2, tab, tmt);
        if (rc) return rc;
    }
    if (!nb) return ST_OK;
    /* the GLU reads the row ranges */
    ffn_cublas_ptrs_kernel<<<1, 1024, 0, cs>>>(P, offsets, E, big, x, nullptr, nullptr, nullptr, gu, h,
                                               (unsigned char *)y, 4, l, w, tab);
    if ((rc = ST_LAUNCH_OK("ffn_cublas_ptrs_kernel"))) return rc;
    cublasHandle_t hd = (cublasHandle_t)s->cublas;
    if ((rc = ffn_cublas_phase(hd, 0, P, offsets_host, E, big, l, w))) return rc;
    const long items = (long)max_big * (w / 8);
    ffn_glu_rows_kernel<<<dim3((unsigned)((items + 255) / 256), nb), 256, 0, cs>>>(h, gu, P.rr, w, situ, b1, b2);
    if ((rc = ST_LAUNCH_OK("ffn_glu_rows_kernel"))) return rc;
    return ffn_cublas_phase(hd, 1, P, offsets_host, E, big, l, w);
}

/* ---------------- MXFP4 → bf16 ---------------- */
__constant__ float k_e2m1_dev[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
__global__ void mxfp4_to_bf16_kernel(st_bf16_t *out, const uint8_t *codes, const uint8_t *scale, int rows, int cols) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; /* one code byte = two columns */
    size_t half = (size_t)cols / 2;
    if (i >= (size_t)rows * half) return;
    size_t r = i / half, c = (i % half) * 2;
    uint8_t b = codes[i];
    int sc = (int)scale[r * (cols / 32) + c / 32] - 127;
    float lo = ldexpf(k_e2m1_dev[b & 7], sc), hi = ldexpf(k_e2m1_dev[(b >> 4) & 7], sc);
    if (b & 8) lo = -lo;
    if (b & 0x80) hi = -hi;
    *reinterpret_cast<uint32_t *>(out + r * cols + c) = st_pack_bf2(lo, hi);
}

extern "C" st_status_t st_cuda_mxfp4_to_bf16(const st_gpu_stream_t *s, st_bf16_t *out, const uint8_t *codes,
                                             const uint8_t *scale, int rows, int cols) {
    if (rows < 0 || cols <= 0 || cols % 32)
        return ST_FAIL(ST_ERR_INVALID_ARG, "mxfp4_to_bf16: rows=%d cols=%d (cols %% 32 == 0)", rows, cols);
    size_t n = (size_t)rows * cols / 2;
    if (!n) return ST_OK;
    mxfp4_to_bf16_kernel<<<(unsigned)((n + 255) / 256), 256, 0, ST_STREAM(s)>>>(out, codes, scale, rows, cols);
    return ST_LAUNCH_OK("mxfp4_to_bf16_kernel");
}

/* ---------------- per-slot expert FFN (decode-sized batches) ----------------
 * One thread block per (slot, 16 output columns), 8 warps × 2 columns; each warp streams its
 * columns' weight rows as 16-byte vectors (lane k takes elements 8k … 8k + 7 of every 256) against
 * the slot's input row, sums its lanes' fp32 partials by a butterfly (fixed order: deterministic),
 * and lane 0 writes the column. No grouping, gather or tile map: at a few rows per expert the
 * grouped GEMMs' 128-row tiles stream the same weights with most of each tile empty, behind three
 * more launches. */
#define FS_WARPS 8
#define FS_CPW 2                    /* columns per warp */
#define FS_CPB (FS_WARPS * FS_CPW) /* columns per block */

__device__ __forceinline__ float fs_dot8(uint4 a, uint4 b, float s) {
    const __nv_bfloat162 *x = reinterpret_cast<const __nv_bfloat162 *>(&a), *y = reinterpret_cast<const __nv_bfloat162 *>(&b);
#pragma unroll
    for (int j = 0; j < 4; j++) {
        float2 fx = __bfloat1622float2(x[j]), fy = __bfloat1622float2(y[j]);
        s = fmaf(fx.x, fy.x, s);
        s = fmaf(fx.y, fy.y, s);
    }
    return s;
}

/* Where slot p's input row and weights are: the engine's routing (ids / cnt over stacked weights), or an
 * expert server's rows grouped by expert (offsets over the dispatched experts, weights through tab). */
struct FsSrc {
    const int *ids, *cnt; /* slots: ids != nullptr */
    int kc;
    const int *off; /* rows: [n_exp + 1] */
    int n_exp;
    const st_bf16_t *const *tab; /* rows: [n_exp][3] = {w1, w3, w2} */
};

template <bool GLU>
__device__ __forceinline__ bool fs_locate(const FsSrc &S, int p, size_t NK, const st_bf16_t *wa, const st_bf16_t *wb,
                                          int &xr, const st_bf16_t *&A, const st_bf16_t *&B) {
    if (S.ids) {
        const int t = p / S.kc, i = p % S.kc;
        if (i >= S.cnt[t]) return false;
        const size_t eo = (size_t)S.ids[p] * NK;
        xr = GLU ? t : p, A = wa + eo, B = GLU ? wb + eo : nullptr;
        return true;
    }
    int lo = 0, hi = S.n_exp - 1; /* the last expert k with off[k] ≤ p (empty experts skipped) */
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (S.off[mid] <= p) lo = mid;
        else hi = mid - 1;
    }
    xr = p, A = S.tab[3 * lo + (GLU ? 0 : 2)], B = GLU ? S.tab[3 * lo + 1] : nullptr;
    return true;
}

/* GLU: h [slot, Nout] bf16 = act(x · Aᵀ, x · Bᵀ) with x = xin row xr (the slot's token, or its row);
 * else y [slot, Nout] fp32 = x · Aᵀ with x = xin row slot. K = the rows' length. The same arithmetic
 * whatever FsSrc says, so an expert server's rows match the engine's slots bit for bit. */
template <bool GLU>
__global__ void __launch_bounds__(FS_WARPS * 32) ffn_slot_kernel(float *y, st_bf16_t *h, const st_bf16_t *xin,
                                                                 const FsSrc S, const st_bf16_t *wa,
                                                                 const st_bf16_t *wb, int K, int Nout, int situ,
                                                                 float b1, float b2) {
    const int p = blockIdx.y;
    int xr;
    const st_bf16_t *A, *B;
    if (!fs_locate<GLU>(S, p, (size_t)Nout * K, wa, wb, xr, A, B)) return;
    const int lane = threadIdx.x & 31, c0 = blockIdx.x * FS_CPB + (threadIdx.x >> 5) * FS_CPW;
    const st_bf16_t *x = xin + (size_t)xr * K;
    float acc[FS_CPW][2];
#pragma unroll
    for (int j = 0; j < FS_CPW; j++) acc[j][0] = acc[j][1] = 0.f;
#pragma unroll 2
    for (int k = lane * 8; k < K; k += 256) {
        const uint4 xv = __ldg(reinterpret_cast<const uint4 *>(x + k));
#pragma unroll
        for (int j = 0; j < FS_CPW; j++) {
            const size_t r = (size_t)min(c0 + j, Nout - 1) * K + k; /* past Nout: a valid row, not written */
            acc[j][0] = fs_dot8(xv, __ldg(reinterpret_cast<const uint4 *>(A + r)), acc[j][0]);
            if (GLU) acc[j][1] = fs_dot8(xv, __ldg(reinterpret_cast<const uint4 *>(B + r)), acc[j][1]);
        }
    }
#pragma unroll
    for (int j = 0; j < FS_CPW; j++) {
        const float a = st_warp_sum(acc[j][0]), u = GLU ? st_warp_sum(acc[j][1]) : 0.f;
        if (lane == 0 && c0 + j < Nout) {
            if (GLU) h[(size_t)p * Nout + c0 + j] = st_tobf(ffn_act(a, u, situ, b1, b2));
            else y[(size_t)p * Nout + c0 + j] = a;
        }
    }
}

static st_status_t fs_launch(const st_gpu_stream_t *s, float *y, st_bf16_t *h, const st_bf16_t *x, const FsSrc &S,
                             int n, const st_bf16_t *w1, const st_bf16_t *w3, const st_bf16_t *w2, int l, int w,
                             bool situ, float b1, float b2) {
    ffn_slot_kernel<true><<<dim3((w + FS_CPB - 1) / FS_CPB, n), FS_WARPS * 32, 0, ST_STREAM(s)>>>(
        nullptr, h, x, S, w1, w3, l, w, situ, b1, b2);
    st_status_t rc = ST_LAUNCH_OK("ffn_slot_kernel<glu>");
    if (rc) return rc;
    ffn_slot_kernel<false><<<dim3((l + FS_CPB - 1) / FS_CPB, n), FS_WARPS * 32, 0, ST_STREAM(s)>>>(
        y, nullptr, h, S, w2, nullptr, w, l, 0, 0.f, 0.f);
    return ST_LAUNCH_OK("ffn_slot_kernel<down>");
}

extern "C" bool st_cuda_moe_ffn_slots_pick(int slots, int E, int l, int w) {
    return slots > 0 && slots <= FS_MAX_SLOTS && 2 * slots <= E && l % 8 == 0 && w % 8 == 0;
}

extern "C" st_status_t st_cuda_moe_ffn_slots(const st_gpu_stream_t *s, float *y, st_bf16_t *h, const st_bf16_t *z,
                                             const int *ids, const int *cnt, int T, int kc, const st_bf16_t *w1,
                                             const st_bf16_t *w3, const st_bf16_t *w2, int l, int w, bool situ,
                                             float b1, float b2) {
    if (T < 0 || kc <= 0 || l <= 0 || w <= 0 || l % 8 || w % 8 || (long)T * kc > 65535 || !y || !h || !z || !ids ||
        !cnt || !w1 || !w3 || !w2 ||
        ((uintptr_t)z | (uintptr_t)h | (uintptr_t)w1 | (uintptr_t)w3 | (uintptr_t)w2) % 16)
        return ST_FAIL(ST_ERR_INVALID_ARG,
                       "moe_ffn_slots: T=%d kc=%d l=%d w=%d (l, w multiples of 8, T·kc ≤ 65535, 16-byte aligned rows)",
                       T, kc, l, w);
    if (!T) return ST_OK;
    const FsSrc S = {ids, cnt, kc, nullptr, 0, nullptr};
    return fs_launch(s, y, h, z, S, T * kc, w1, w3, w2, l, w, situ, b1, b2);
}

extern "C" st_status_t st_cuda_moe_ffn_rows_table(const st_gpu_stream_t *s, float *y, st_bf16_t *h_ws,
                                                         const st_bf16_t *x, const int *offsets, int n_exp, int N,
                                                         const st_bf16_t *const *tab, int l, int w, bool situ,
                                                         float b1, float b2) {
    if (N < 0 || N > 65535 || n_exp < 0 || (N > 0 && n_exp == 0) || l <= 0 || w <= 0 || l % 8 || w % 8 || !y ||
        !h_ws || !x || !offsets || !tab || ((uintptr_t)x | (uintptr_t)h_ws) % 16)
        return ST_FAIL(ST_ERR_INVALID_ARG,
                       "moe_ffn_rows_table: N=%d experts=%d l=%d w=%d (l, w multiples of 8, N ≤ 65535, 16-byte "
                       "aligned rows)", N, n_exp, l, w);
    if (!N) return ST_OK;
    const FsSrc S = {nullptr, nullptr, 1, offsets, n_exp, tab};
    return fs_launch(s, y, h_ws, x, S, N, nullptr, nullptr, nullptr, l, w, situ, b1, b2);
}
