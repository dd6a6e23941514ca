/* Kimi Delta Attention on the GPU (SPEC §3): short conv + SiLU, decay gate, chunked prefill and
 * recurrent decode over a state pool. K = V = 128. CPU references: st_conv_silu, st_kda_gate,
 * st_kda_recurrent / st_kda_chunked (kernels/kda.c). Derivation of the tile form: SPEC §3.3. */
#include <stdlib.h>

#include "cuda_common.cuh"

#define KD 128 /* key = value head dim */

/* ------------------------------------------------------------------ conv + SiLU */

/* Loads and stores of the kernels below in their element type (bf16 or fp32 activations). */
__device__ __forceinline__ float kd_ld(st_bf16_t h) { return st_bf(h); }
__device__ __forceinline__ float kd_ld(float f) { return f; }
__device__ __forceinline__ void kd_st(st_bf16_t *p, float f) { *p = st_tobf(f); }
__device__ __forceinline__ void kd_st(float *p, float f) { *p = f; }
/* SiLU of the conv output: bf16 out with the fast exp, fp32 out (the GPU engine's fp32
 * activations) with the accurate one */
__device__ __forceinline__ void kd_silu_st(st_bf16_t *p, float a) { *p = st_tobf(a / (1.f + __expf(-a))); }
__device__ __forceinline__ void kd_silu_st(float *p, float a) { *p = a / (1.f + expf(-a)); }

/* grid (T_tot, ceil(C / 256)), 256 threads: block (t, cb) does channels [256·cb, +256) of token t (its
 * sequence looked up once per block); reads the old conv state, never writes it */
template <typename T>
__global__ void conv_silu_kernel(T *y, const T *x, const float *state, const int *slots, const float *w, const int *cu,
                                 int B, int T_tot, int C, int K) {
    __shared__ int sb;
    const int t = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    if (threadIdx.x == 0) sb = st_seq_of(cu, B, T_tot, t);
    __syncthreads();
    if (c >= C) return;
    const int b = sb, pos = t - cu[b];
    const float *st = state + (size_t)(slots ? slots[b] : b) * (K - 1) * C;
    float xv[8], wv[8];
#pragma unroll
    for (int j = 0; j < 8; j++) { /* every load issued before the sum */
        if (j >= K) break;
        const int p = pos - (K - 1) + j;
        xv[j] = p >= 0 ? kd_ld(x[(size_t)(t - (K - 1) + j) * C + c]) : st[(size_t)(K - 1 + p) * C + c];
        wv[j] = w[c * K + j];
    }
    float acc = 0.f;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        if (j >= K) break;
        acc += wv[j] * xv[j];
    }
    kd_silu_st(y + (size_t)t * C + c, acc);
}

/* one thread per (sequence, channel): state ← last K-1 inputs; every value is read before any is
 * written (in place: the new slot j may hold an old value that a later slot still needs) */
template <typename T>
__global__ void conv_state_kernel(float *state, const int *slots, const T *x, const int *cu, int B, int C, int K) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= B * C) return;
    int b = i / C, c = i % C;
    int bos = cu[b], L = cu[b + 1] - bos;
    float *st = state + (size_t)(slots ? slots[b] : b) * (K - 1) * C;
    float v[7];
#pragma unroll
    for (int j = 0; j < 7; j++) {
        if (j >= K - 1) break;
        int p = L - (K - 1) + j;
        v[j] = p >= 0 ? kd_ld(x[(size_t)(bos + p) * C + c]) : st[(size_t)(K - 1 + p) * C + c];
    }
#pragma unroll
    for (int j = 0; j < 7; j++) {
        if (j >= K - 1) break;
        st[(size_t)j * C + c] = v[j];
    }
}

template <typename T>
static st_status_t conv_silu_any(const st_gpu_stream_t *s, T *y, const T *x, float *state, const int *slots,
                                 const float *w, const int *cu_seqlens, int B, int T_tot, int C, int K) {
    if (B < 0 || T_tot < 0 || C <= 0 || K < 1 || K > 8)
        return ST_FAIL(ST_ERR_INVALID_ARG, "conv_silu: B=%d T=%d C=%d K=%d", B, T_tot, C, K);
    if (B == 0) return ST_OK;
    if (T_tot > 0)
        conv_silu_kernel<T><<<dim3((unsigned)T_tot, (unsigned)((C + 255) / 256)), 256, 0, ST_STREAM(s)>>>(
            y, x, state, slots, w, cu_seqlens, B, T_tot, C, K);
    if (K > 1) conv_state_kernel<T><<<(B * C + 255) / 256, 256, 0, ST_STREAM(s)>>>(state, slots, x, cu_seqlens, B, C, K);
    return ST_LAUNCH_OK("conv_silu_kernel");
}

extern "C" st_status_t st_cuda_conv_silu(const st_gpu_stream_t *s, float *y, const float *x, float *state,
                                         const int *slots, const float *w, const int *cu_seqlens, int B, int T_tot,
                                         int C, int K) {
    return conv_silu_any(s, y, x, state, slots, w, cu_seqlens, B, T_tot, C, K);
}

/* ---------------- dtype conversions (CPU versions: st_f32_to_bf16 / st_bf16_to_f32, RNE) ---------------- */
__global__ void f32_to_bf16_kernel(st_bf16_t *d, const float *s, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        d[i] = st_tobf(s[i]);
}
__global__ void bf16_to_f32_kernel(float *d, const st_bf16_t *s, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        d[i] = st_bf(s[i]);
}
static unsigned cvt_blocks(size_t n) { return (unsigned)((n + 255) / 256 < 65536 ? (n + 255) / 256 : 65536); }
extern "C" st_status_t st_cuda_f32_to_bf16(const st_gpu_stream_t *s, st_bf16_t *dst, const float *src, size_t n) {
    if (!n) return ST_OK;
    f32_to_bf16_kernel<<<cvt_blocks(n), 256, 0, ST_STREAM(s)>>>(dst, src, n);
    return ST_LAUNCH_OK("f32_to_bf16_kernel");
}
extern "C" st_status_t st_cuda_bf16_to_f32(const st_gpu_stream_t *s, float *dst, const st_bf16_t *src, size_t n) {
    if (!n) return ST_OK;
    bf16_to_f32_kernel<<<cvt_blocks(n), 256, 0, ST_STREAM(s)>>>(dst, src, n);
    return ST_LAUNCH_OK("bf16_to_f32_kernel");
}

/* ------------------------------------------------------------------ gate */
/* the KDA decay gate of u = f + dt_bias (SPEC §3.3): lower-bounded sigmoid or −a·softplus */
__device__ __forceinline__ float kda_gate_fn(float u, float a, int bounded, float lb) {
    return bounded ? lb / (1.f + expf(-a * u)) : -a * (u > 20.f ? u : log1pf(expf(u)));
}
__global__ void kda_gate32_kernel(float *g, const float *A_log, const float *dt_bias, size_t n, int H, int dk,
                                  int bounded, float lb) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int hc = (int)(i % ((size_t)H * dk));
    float a = expf(A_log[hc / dk]), u = g[i] + dt_bias[hc];
    g[i] = kda_gate_fn(u, a, bounded, lb);
}
extern "C" st_status_t st_cuda_kda_gate(const st_gpu_stream_t *s, float *g, const float *A_log, const float *dt_bias, int T,
                                     int H, int dk, bool bounded, float lb) {
    size_t n = (size_t)T * H * dk;
    if (!n) return ST_OK;
    kda_gate32_kernel<<<(unsigned)((n + 255) / 256), 256, 0, ST_STREAM(s)>>>(g, A_log, dt_bias, n, H, dk, bounded, lb);
    return ST_LAUNCH_OK("kda_gate32_kernel");
}


/* Decode form of f_b + gate: one warp per channel hc holds w_fb's row hc in registers (f_rank ≤ 256)
 * and, for each token, g[t, hc] = gate(aux[t, :f_rank] · w_fb[hc] + dt_bias[hc]): the low-rank
 * GEMM and the gate in one launch (fp32 throughout, like st_cuda_sgemm + kda_gate32_kernel). */
#define GATE_FB_MAXR 256
__global__ void kda_gate_fb32_kernel(float *g, const float *aux, int naux, const float *w_fb, int R,
                                     const float *A_log, const float *dt_bias, int T, int P, int dk, int bounded,
                                     float lb) {
    int hc = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (hc >= P) return;
    float wv[GATE_FB_MAXR / 32];
#pragma unroll
    for (int i = 0; i < GATE_FB_MAXR / 32; i++) {
        int k = lane + 32 * i;
        wv[i] = k < R ? w_fb[(size_t)hc * R + k] : 0.f;
    }
    float a = expf(A_log[hc / dk]), bias = dt_bias[hc];
    for (int t = 0; t < T; t++) {
        const float *x = aux + (size_t)t * naux;
        float sum = 0.f;
#pragma unroll
        for (int i = 0; i < GATE_FB_MAXR / 32; i++) {
            int k = lane + 32 * i;
            if (k < R) sum = fmaf(x[k], wv[i], sum); /* explicit: the batched kernel repeats this order */
        }
        sum = st_warp_sum(sum);
        if (lane == 0) {
            float u = sum + bias;
            g[(size_t)t * P + hc] = kda_gate_fn(u, a, bounded, lb);
        }
    }
}
/* The same for a batch of tokens (T ≥ GATE_FB_BATCH_T), tiled: a block computes 32 channels × 8 tokens
 * (thread: channel tid % 32, token tid / 32) from 64-wide k slices of aux and w_fb in shared memory
 * (rows padded to 65 floats: the channel-strided reads hit distinct banks, the token reads are
 * broadcasts); stores coalesced over channels. NOTE: each thread adds in the warp kernel's order (32
 * chains over k = l + 32 i, then st_warp_sum's butterfly as seen from lane 0), so both kernels give the
 * same bits: the engine's results do not depend on which one a step size picks. The warp kernel reduces
 * each token in turn: 15.6 µs at T = 32 on `small` (ncu). */
#define GATE_FB_BATCH_T 8
#define GFB_KS 64
__global__ void __launch_bounds__(256) kda_gate_fbt32_kernel(float *g, const float *aux, int naux, const float *w_fb,
                                                             int R, const float *A_log, const float *dt_bias, int T,
                                                             int P, int dk, int bounded, float lb) {
    __shared__ float xs[8][GFB_KS + 1], wsm[32][GFB_KS + 1];
    const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
    const int c0 = blockIdx.x * 32, t0 = blockIdx.y * 8;
    float p[32];
#pragma unroll
    for (int l = 0; l < 32; l++) p[l] = 0.f;
    for (int k0 = 0; k0 < R; k0 += GFB_KS) {
        float v[40 * GFB_KS / 256]; /* every load in flight before the stores */
#pragma unroll
        for (int j = 0; j < 40 * GFB_KS / 256; j++) {
            const int i = threadIdx.x + 256 * j, r = i / GFB_KS, k = i % GFB_KS;
            const bool kok = k0 + k < R;
            v[j] = r < 8 ? (kok && t0 + r < T ? aux[(size_t)(t0 + r) * naux + k0 + k] : 0.f)
                         : (kok && c0 + r - 8 < P ? w_fb[(size_t)(c0 + r - 8) * R + k0 + k] : 0.f);
        }
#pragma unroll
        for (int j = 0; j < 40 * GFB_KS / 256; j++) {
            const int i = threadIdx.x + 256 * j, r = i / GFB_KS, k = i % GFB_KS;
            if (r < 8) xs[r][k] = v[j];
            else wsm[r - 8][k] = v[j];
        }
        __syncthreads();
        const int kn = min(GFB_KS, R - k0); /* terms past R are left out, as in the warp kernel */
#pragma unroll
        for (int i = 0; i < GFB_KS / 32; i++)
#pragma unroll
            for (int l = 0; l < 32; l++)
                if (32 * i + l < kn) p[l] = fmaf(xs[ty][32 * i + l], wsm[tx][32 * i + l], p[l]);
        __syncthreads();
    }
#pragma unroll
    for (int l = 0; l < 16; l++) p[l] = p[l] + p[l + 16];
#pragma unroll
    for (int l = 0; l < 8; l++) p[l] = p[l] + p[l + 8];
#pragma unroll
    for (int l = 0; l < 4; l++) p[l] = p[l] + p[l + 4];
    p[0] = p[0] + p[2], p[1] = p[1] + p[3];
    p[0] = p[0] + p[1];
    const int hc = c0 + tx, t = t0 + ty;
    if (hc >= P || t >= T) return;
    g[(size_t)t * P + hc] = kda_gate_fn(p[0] + dt_bias[hc], expf(A_log[hc / dk]), bounded, lb);
}
extern "C" st_status_t st_cuda_kda_gate_fb(const st_gpu_stream_t *s, float *g, const float *aux, int naux,
                                        const float *w_fb, int R, const float *A_log, const float *dt_bias, int T,
                                        int H, int dk, bool bounded, float lb) {
    int P = H * dk;
    if (T <= 0) return ST_OK;
    if (R > GATE_FB_MAXR) return ST_FAIL(ST_ERR_INVALID_ARG, "kda_gate_fb32: f_rank %d > %d", R, GATE_FB_MAXR);
    if (T >= GATE_FB_BATCH_T) {
        kda_gate_fbt32_kernel<<<dim3((unsigned)((P + 31) / 32), (unsigned)((T + 7) / 8)), 256, 0, ST_STREAM(s)>>>(
            g, aux, naux, w_fb, R, A_log, dt_bias, T, P, dk, bounded, lb);
        return ST_LAUNCH_OK("kda_gate_fbt32_kernel");
    }
    kda_gate_fb32_kernel<<<(unsigned)((P + 7) / 8), 256, 0, ST_STREAM(s)>>>(g, aux, naux, w_fb, R, A_log, dt_bias, T,
                                                                         P, dk, bounded, lb);
    return ST_LAUNCH_OK("kda_gate_fb32_kernel");
}


/* ------------------------------------------------------------------ decode */
/* grid (KD/NC, H, N), 4·NC threads: a block owns NC value columns of one (sequence, head) state;
 * thread = (row group rg = tid/(NC/4) : rows rg + 16·i, i < 8) × (column quad tid%(NC/4)). The
 * state slice (NC/32 · 16 KiB) is read once into registers (all loads issued before use) and written
 * once. NC trades blocks (8192 at N 64, H 32, NC 32) against per-block barrier cost: KD_DEC_NC. */
__device__ __forceinline__ void kd_st2(st_bf16_t *p, float a, float b) {
    *reinterpret_cast<uint32_t *>(p) = st_pack_bf2(a, b);
}
__device__ __forceinline__ void kd_st2(float *p, float a, float b) { *reinterpret_cast<float2 *>(p) = make_float2(a, b); }

template <typename TI, typename TO, int NC, bool CS>
__global__ void __launch_bounds__(4 * NC) kda_decode_kernel(TO *o, const TI *q, const TI *k, const TI *v,
                                                            const float *g, const float *beta, float *S,
                                                            const int *slots, int H, float scale) {
    constexpr int NQ = NC / 4; /* column quads */
    __shared__ float qs[KD], ks[KD], ds[KD];
    __shared__ float red[16][NC + 1];
    __shared__ float es[NC];
    const int n = blockIdx.z, h = blockIdx.y, v0 = blockIdx.x * NC, tid = threadIdx.x;
    const int rg = tid / NQ, cq = (tid % NQ) * 4;
    const size_t tok = (size_t)n * H + h;
    float *Sp = S + ((size_t)(slots ? slots[n] : n) * H + h) * KD * KD + v0 + cq;
    float4 sr[8];
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const float4 *p = reinterpret_cast<const float4 *>(Sp + (size_t)(rg + 16 * i) * KD);
        sr[i] = CS ? __ldcs(p) : *p;
    }
    if (tid < KD) {
        qs[tid] = kd_ld(q[tok * KD + tid]) * scale;
        ks[tid] = kd_ld(k[tok * KD + tid]);
        ds[tid] = __expf(g[tok * KD + tid]);
    }
    __syncthreads();
    float p0 = 0, p1 = 0, p2 = 0, p3 = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        int c = rg + 16 * i;
        float d = ds[c], kc = ks[c];
        sr[i].x *= d, sr[i].y *= d, sr[i].z *= d, sr[i].w *= d;
        p0 += kc * sr[i].x, p1 += kc * sr[i].y, p2 += kc * sr[i].z, p3 += kc * sr[i].w;
    }
    red[rg][cq] = p0, red[rg][cq + 1] = p1, red[rg][cq + 2] = p2, red[rg][cq + 3] = p3;
    __syncthreads();
    if (tid < NC) {
        float a = 0;
#pragma unroll
        for (int r = 0; r < 16; r++) a += red[r][tid];
        es[tid] = beta[tok] * (kd_ld(v[tok * KD + v0 + tid]) - a);
    }
    __syncthreads();
    float e0 = es[cq], e1 = es[cq + 1], e2 = es[cq + 2], e3 = es[cq + 3];
    p0 = p1 = p2 = p3 = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        int c = rg + 16 * i;
        float kc = ks[c], qc = qs[c];
        sr[i].x += kc * e0, sr[i].y += kc * e1, sr[i].z += kc * e2, sr[i].w += kc * e3;
        p0 += qc * sr[i].x, p1 += qc * sr[i].y, p2 += qc * sr[i].z, p3 += qc * sr[i].w;
        float4 *p = reinterpret_cast<float4 *>(Sp + (size_t)c * KD);
        if (CS) __stcs(p, sr[i]);
        else *p = sr[i];
    }
    __syncthreads(); /* red reused */
    red[rg][cq] = p0, red[rg][cq + 1] = p1, red[rg][cq + 2] = p2, red[rg][cq + 3] = p3;
    __syncthreads();
    if (tid < NC) {
        float a = 0;
#pragma unroll
        for (int r = 0; r < 16; r++) a += red[r][tid];
        kd_st(o + tok * KD + v0 + tid, a);
    }
}

/* NOTE: value columns per block and streaming cache hints (ld/st .cs): the measured best (H200, H 32,
 * docs/perf/history.md "KDA decode"): NC 64 is the best plain variant at N 64 (91.5% of copy vs 89.0 / 90.3% for
 * NC 32 / 128) and N 256 (96.4% vs 92.8 / 95.9%); the streaming hints help at N 64 only (93.0%), not at
 * N 256: off. (The template parameters stay: they size the block; the other values lost.) */
#define KD_DEC_NC 64
#define KD_DEC_CS false

template <typename TI, typename TO>
static st_status_t kd_decode_launch(const st_gpu_stream_t *s, TO *o, const TI *q, const TI *k, const TI *v,
                                    const float *g, const float *beta, float *S, const int *slots, int N, int H,
                                    float scale) {
    if (N < 0 || H <= 0 || H > 65535 || N > 65535) return ST_FAIL(ST_ERR_INVALID_ARG, "kda_decode: N=%d H=%d", N, H);
    if (N == 0) return ST_OK;
    kda_decode_kernel<TI, TO, KD_DEC_NC, KD_DEC_CS><<<dim3(KD / KD_DEC_NC, H, N), 4 * KD_DEC_NC, 0, ST_STREAM(s)>>>(
        o, q, k, v, g, beta, S, slots, H, scale);
    return ST_LAUNCH_OK("kda_decode_kernel");
}

extern "C" st_status_t st_cuda_kda_decode(const st_gpu_stream_t *s, float *o, const float *q, const float *k,
                                          const float *v, const float *g, const float *beta, float *S,
                                          const int *slots, int N, int H, float scale) {
    return kd_decode_launch(s, o, q, k, v, g, beta, S, slots, N, H, scale);
}

/* ------------------------------------------------------------------ chunked prefill */
/* grid (KD/BV, H, B), NW warps, BV = 16·NW value columns per block. Each block scans its
 * sequence's 16-token tiles in order. Warp w owns value columns [16w, 16w+16) of the block's state
 * slice S[0..128, v0+16w ..] in mma accumulator registers (8 m-tiles × 2 n-tiles × 4 fp32), so
 * everything after the shared A_kk / A_qk / (I+A_kk)^{-1} is warp-local. Per tile (G = cumsum g
 * from the tile start, Γ = exp G, C = last token):
 *   Qs = scale·Q⊙Γ, Kp = K⊙Γ, Kn = K⊙Γ⁻¹ (≤ e^80 when the tile's decay allows, else per-pair),
 *   Kd = K⊙Γ_C/Γ; A_kk = β·tril₋(Kp Knᵀ), A_qk = tril(Qs Knᵀ);
 *   X = β⊙(V − Kp S); E = (I+A_kk)⁻¹ X; O = Qs S + A_qk E; S ← Γ_C⊙S + Kdᵀ E.
 * NOTE: S enters the two products with Kp and Qs as bf16 (St); the state itself stays fp32. */
template <int NW> struct KdaSmem {
    static constexpr int BV = 16 * NW, LDK = KD + 8, LDT = 24;
    st_bf16_t Qs[16 * LDK], Kp[16 * LDK], Kn[16 * LDK];
    st_bf16_t KdT[KD * LDT]; /* [c][t] */
    st_bf16_t St[BV * LDK];  /* [v][c] bf16 copy of the state slice */
    st_bf16_t XT[BV * LDT];  /* [v][t] β⊙(V − Kp S) */
    st_bf16_t ET[BV * LDT];  /* [v][t] E */
    st_bf16_t Vs[16 * BV];   /* [t][v] */
    st_bf16_t Aqk[16 * LDT], Tinv[16 * LDT];
    float Akk[16 * 17];
    float Gs[16 * KD]; /* [t][c] cumulative log decay, for the per-pair path */
    float gC[KD];
    float bs[16];
    /* raw next-tile inputs, filled by cp.async while the current tile computes */
    st_bf16_t Rq[16 * KD], Rk[16 * KD];
    float Rg[16 * KD];
    st_bf16_t Rv[16 * BV];
    float Rb[16];
};


template <int NW, typename TO>
__global__ void __launch_bounds__(NW * 32) kda_chunked_kernel(TO *__restrict__ o, const st_bf16_t *__restrict__ q,
                                                              const st_bf16_t *__restrict__ k,
                                                              const st_bf16_t *__restrict__ v, const float *__restrict__ g,
                                                              const float *__restrict__ beta, float *S, const int *slots,
                                                              const int *cu, int H, float scale) {
    using Sm = KdaSmem<NW>;
    constexpr int BV = Sm::BV, LDK = Sm::LDK, LDT = Sm::LDT, NT = NW * 32;
    extern __shared__ __align__(16) unsigned char smraw[];
    Sm &sm = *reinterpret_cast<Sm *>(smraw);
    const int b = blockIdx.z, h = blockIdx.y, v0 = blockIdx.x * BV;
    const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31, gq = lane >> 2, tq = lane & 3;
    const int bos = cu[b], L = cu[b + 1] - bos;
    const size_t HK = (size_t)H * KD;
    float *Sg = S + ((size_t)(slots ? slots[b] : b) * H + h) * KD * KD + v0;
    const int wv = 16 * w; /* warp's first local value column */

    float Sr[8][2][4];
#pragma unroll
    for (int mt = 0; mt < 8; mt++)
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int c = mt * 16 + gq + (i >> 1) * 8, vv = wv + j * 8 + tq * 2 + (i & 1);
                Sr[mt][j][i] = Sg[(size_t)c * KD + vv];
            }
    auto write_St = [&]() {
#pragma unroll
        for (int mt = 0; mt < 8; mt++)
#pragma unroll
            for (int j = 0; j < 2; j++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    int c = mt * 16 + gq + (i >> 1) * 8, vv = wv + j * 8 + tq * 2 + (i & 1);
                    sm.St[vv * LDK + c] = st_tobf(Sr[mt][j][i]);
                }
    };
    write_St();

    /* rows past the sequence end are zero-filled (src size 0), so padded tokens contribute nothing */
    auto prefetch = [&](int t0) {
        const int n = min(16, L - t0);
        const size_t tok0 = (size_t)(bos + t0);
        for (int i = tid; i < 16 * 16; i += NT) {
            int t = i >> 4, ch = (i & 15) * 8;
            size_t src = (tok0 + (t < n ? t : 0)) * HK + (size_t)h * KD + ch;
            st_cp_async16(sm.Rq + t * KD + ch, q + src, t < n);
            st_cp_async16(sm.Rk + t * KD + ch, k + src, t < n);
        }
        for (int i = tid; i < 16 * 32; i += NT) {
            int t = i >> 5, ch = (i & 31) * 4;
            st_cp_async16(sm.Rg + t * KD + ch, g + (tok0 + (t < n ? t : 0)) * HK + (size_t)h * KD + ch, t < n);
        }
        for (int i = tid; i < 16 * (BV / 8); i += NT) {
            int t = i / (BV / 8), ch = (i % (BV / 8)) * 8;
            st_cp_async16(sm.Rv + t * BV + ch, v + (tok0 + (t < n ? t : 0)) * HK + (size_t)h * KD + v0 + ch, t < n);
        }
        if (tid < 16) st_cp_async4(sm.Rb + tid, beta + (tok0 + (tid < n ? tid : 0)) * H + h, tid < n);
        st_cp_async_commit();
    };
    if (L > 0) prefetch(0);

    for (int t0 = 0; t0 < L; t0 += 16) {
        const int n = min(16, L - t0);
        const size_t tok0 = (size_t)(bos + t0);
        st_cp_async_wait_all();
        __syncthreads(); /* previous tile's shared data fully used; this tile's raw inputs landed */
        /* ---- load: per channel cumulative decay and the scaled q / k copies ---- */
        int far = 0;
        for (int c = tid; c < KD; c += NT) {
            float G[16];
            float acc = 0.f;
#pragma unroll
            for (int t = 0; t < 16; t++) {
                acc += sm.Rg[t * KD + c];
                G[t] = acc;
            }
            const float GC = G[15];
            far |= GC < -80.f;
            sm.gC[c] = __expf(GC);
#pragma unroll
            for (int t = 0; t < 16; t++) {
                const float qv = st_bf(sm.Rq[t * KD + c]), kv = st_bf(sm.Rk[t * KD + c]);
                float e = __expf(G[t]);
                sm.Qs[t * LDK + c] = st_tobf(qv * e * scale);
                sm.Kp[t * LDK + c] = st_tobf(kv * e);
                sm.Kn[t * LDK + c] = st_tobf(kv * __expf(-G[t]));
                sm.KdT[c * LDT + t] = st_tobf(kv * __expf(GC - G[t]));
                sm.Gs[t * KD + c] = G[t];
            }
        }
        for (int i = tid; i < 16 * BV / 2; i += NT) ((uint32_t *)sm.Vs)[i] = ((const uint32_t *)sm.Rv)[i];
        if (tid < 16) sm.bs[tid] = sm.Rb[tid];
        const int pair = __syncthreads_or(far);
        if (t0 + 16 < L) prefetch(t0 + 16); /* raw buffers are free again: overlap the next tile's loads */

        /* ---- A_kk, A_qk (shared) ---- */
        if (!pair) {
            for (int job = w; job < 4; job += NW) {
                const st_bf16_t *Am = job < 2 ? sm.Kp : sm.Qs;
                const int n0 = (job & 1) * 8;
                float c4[4] = {0, 0, 0, 0};
#pragma unroll
                for (int kk = 0; kk < KD / 16; kk++) {
                    uint32_t a[4], bb[2];
                    st_frag_a(a, Am, LDK, 0, kk * 16);
                    st_frag_b(bb, sm.Kn, LDK, n0, kk * 16);
                    st_mma16816(c4, a, bb);
                }
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    int r = gq + (i >> 1) * 8, j = n0 + tq * 2 + (i & 1);
                    if (job < 2) sm.Akk[r * 17 + j] = j < r ? sm.bs[r] * c4[i] : 0.f;
                    else sm.Aqk[r * LDT + j] = st_tobf(j <= r ? c4[i] : 0.f);
                }
            }
        } else {
            /* per-pair form: exp(G_r − G_j) ≤ 1 for j ≤ r, never overflows */
            for (int p = tid; p < 256; p += NT) {
                int r = p >> 4, j = p & 15;
                float skk = 0.f, sqk = 0.f;
                if (j <= r && r < n) {
                    for (int c = 0; c < KD; c++) {
                        float kj = st_bf(k[(tok0 + j) * HK + (size_t)h * KD + c]);
                        float e = __expf(sm.Gs[r * KD + c] - sm.Gs[j * KD + c]) * kj;
                        skk += st_bf(k[(tok0 + r) * HK + (size_t)h * KD + c]) * e;
                        sqk += st_bf(q[(tok0 + r) * HK + (size_t)h * KD + c]) * e;
                    }
                }
                sm.Akk[r * 17 + j] = j < r ? sm.bs[r] * skk : 0.f;
                sm.Aqk[r * LDT + j] = st_tobf(j <= r ? scale * sqk : 0.f);
            }
        }

        /* ---- X = β(V − Kp S) and Qs S for the warp's 16 columns ---- */
        float X[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}}, O[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
#pragma unroll
        for (int kk = 0; kk < KD / 16; kk++) {
            uint32_t ak[4], aq[4];
            st_frag_a(ak, sm.Kp, LDK, 0, kk * 16);
            st_frag_a(aq, sm.Qs, LDK, 0, kk * 16);
#pragma unroll
            for (int j = 0; j < 2; j++) {
                uint32_t bb[2];
                st_frag_b(bb, sm.St, LDK, wv + j * 8, kk * 16);
                st_mma16816(X[j], ak, bb);
                st_mma16816(O[j], aq, bb);
            }
        }
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int t = gq + (i >> 1) * 8, vv = wv + j * 8 + tq * 2 + (i & 1);
                sm.XT[vv * LDT + t] = st_tobf(sm.bs[t] * (st_bf(sm.Vs[t * BV + vv]) - X[j][i]));
            }
        __syncthreads();

        /* ---- (I + A_kk)^{-1}: forward substitution, lane j solves column j ---- */
        if (w == 0 && lane < 16) {
            const int j = lane;
            float x[16];
#pragma unroll
            for (int r = 0; r < 16; r++) {
                float a = r == j ? 1.f : 0.f;
#pragma unroll
                for (int i = 0; i < r; i++) a -= sm.Akk[r * 17 + i] * x[i];
                x[r] = r < j ? 0.f : a;
            }
#pragma unroll
            for (int r = 0; r < 16; r++) sm.Tinv[r * LDT + j] = st_tobf(x[r]);
        }
        __syncthreads();

        /* ---- E, O, S (warp-local) ---- */
        uint32_t at[4];
        st_frag_a(at, sm.Tinv, LDT, 0, 0);
#pragma unroll
        for (int j = 0; j < 2; j++) {
            float E[4] = {0, 0, 0, 0};
            uint32_t bb[2];
            st_frag_b(bb, sm.XT, LDT, wv + j * 8, 0);
            st_mma16816(E, at, bb);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int t = gq + (i >> 1) * 8, vv = wv + j * 8 + tq * 2 + (i & 1);
                sm.ET[vv * LDT + t] = st_tobf(E[i]);
            }
        }
        __syncwarp();
        uint32_t aa[4], be[2][2];
        st_frag_a(aa, sm.Aqk, LDT, 0, 0);
#pragma unroll
        for (int j = 0; j < 2; j++) {
            st_frag_b(be[j], sm.ET, LDT, wv + j * 8, 0);
            st_mma16816(O[j], aa, be[j]);
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                int t = gq + hf * 8, vv = v0 + wv + j * 8 + tq * 2;
                if (t < n)
                    kd_st2(o + (tok0 + t) * HK + (size_t)h * KD + vv, O[j][hf * 2], O[j][hf * 2 + 1]);
            }
        }
#pragma unroll
        for (int mt = 0; mt < 8; mt++) {
            uint32_t ak[4];
            st_frag_a(ak, sm.KdT, LDT, mt * 16, 0);
            const float d0 = sm.gC[mt * 16 + gq], d1 = sm.gC[mt * 16 + gq + 8];
#pragma unroll
            for (int j = 0; j < 2; j++) {
                Sr[mt][j][0] *= d0, Sr[mt][j][1] *= d0, Sr[mt][j][2] *= d1, Sr[mt][j][3] *= d1;
                st_mma16816(Sr[mt][j], ak, be[j]);
            }
        }
        __syncwarp();
        write_St();
    }
#pragma unroll
    for (int mt = 0; mt < 8; mt++)
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int c = mt * 16 + gq + (i >> 1) * 8, vv = wv + j * 8 + tq * 2 + (i & 1);
                Sg[(size_t)c * KD + vv] = Sr[mt][j][i];
            }
}

template <int NW, typename TO>
static st_status_t launch_chunked(const st_gpu_stream_t *s, TO *o, const st_bf16_t *q, const st_bf16_t *k,
                                  const st_bf16_t *v, const float *g, const float *beta, float *S, const int *slots,
                                  const int *cu, int B, int H, float scale) {
    size_t smem = sizeof(KdaSmem<NW>);
    st_status_t rc = ST_CUDA_CHECK(
        cudaFuncSetAttribute(kda_chunked_kernel<NW, TO>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    if (rc) return rc;
    kda_chunked_kernel<NW, TO><<<dim3(KD / (16 * NW), H, B), NW * 32, smem, ST_STREAM(s)>>>(o, q, k, v, g, beta, S,
                                                                                        slots, cu, H, scale);
    return ST_LAUNCH_OK("kda_chunked_kernel");
}

template <typename TO>
static st_status_t kda_chunked_any(const st_gpu_stream_t *s, TO *o, const st_bf16_t *q, const st_bf16_t *k,
                                   const st_bf16_t *v, const float *g, const float *beta, float *S, const int *slots,
                                   const int *cu_seqlens, int B, int H, float scale) {
    if (B < 0 || B > 65535 || H <= 0 || H > 65535)
        return ST_FAIL(ST_ERR_INVALID_ARG, "kda_chunked: B=%d H=%d", B, H);
    if (B == 0) return ST_OK;
    /* NOTE: warps per block (16 value columns each): 2, 4 or 8, measured on the H200 (docs/perf/history.md, "KDA
     * chunked"): 8 warps win once B·H fills the 132 SMs once over */
    const int nw = (long)B * H >= 128 ? 8 : ((long)B * H >= 64 ? 4 : 2);
    switch (nw) {
    case 2: return launch_chunked<2, TO>(s, o, q, k, v, g, beta, S, slots, cu_seqlens, B, H, scale);
    case 4: return launch_chunked<4, TO>(s, o, q, k, v, g, beta, S, slots, cu_seqlens, B, H, scale);
    default: return launch_chunked<8, TO>(s, o, q, k, v, g, beta, S, slots, cu_seqlens, B, H, scale);
    }
}

extern "C" st_status_t st_cuda_kda_chunked(const st_gpu_stream_t *s, float *o, const st_bf16_t *q,
                                           const st_bf16_t *k, const st_bf16_t *v, const float *g,
                                           const float *beta, float *S, const int *slots, const int *cu_seqlens,
                                           int B, int H, float scale) {
    return kda_chunked_any<float>(s, o, q, k, v, g, beta, S, slots, cu_seqlens, B, H, scale);
}

/* ------------------------------------------------------------------ the engine's KDA glue */
/* one warp per (token, head) */
__global__ void kda_prep32_kernel(float *q, float *k, float *v, st_bf16_t *qb, st_bf16_t *kb, st_bf16_t *vb,
                                  float *beta, const float *qkv, const float *aux, int ldaux, int boff, int T, int H,
                                  int dk, float l2eps) {
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), l = threadIdx.x & 31;
    if (row >= T * H) return;
    int t = row / H, h = row % H, P = H * dk;
    const float *src = qkv + (size_t)t * 3 * P + (size_t)h * dk;
    float sq = 0.f, sk = 0.f;
    for (int c = l; c < dk; c += 32) {
        float a = src[c], b = src[P + c];
        sq += a * a, sk += b * b;
    }
    sq = st_warp_sum(sq), sk = st_warp_sum(sk);
    float rq = 1.f / sqrtf(sq + l2eps), rk = 1.f / sqrtf(sk + l2eps);
    size_t o = (size_t)t * P + (size_t)h * dk;
    for (int c = l; c < dk; c += 32) {
        float a = src[c] * rq, b = src[P + c] * rk, e = src[2 * P + c];
        q[o + c] = a, k[o + c] = b, v[o + c] = e;
        if (qb) qb[o + c] = st_tobf(a), kb[o + c] = st_tobf(b), vb[o + c] = st_tobf(e);
    }
    if (l == 0) beta[(size_t)t * H + h] = st_sigf(aux[(size_t)t * ldaux + boff + h]);
}
extern "C" st_status_t st_cuda_kda_prep(const st_gpu_stream_t *s, float *q, float *k, float *v, st_bf16_t *qb,
                                     st_bf16_t *kb, st_bf16_t *vb, float *beta, const float *qkv, const float *aux,
                                     int ldaux, int boff, int T, int H, int dk, float l2eps) {
    int rows = T * H;
    if (rows <= 0) return ST_OK;
    kda_prep32_kernel<<<(rows + 7) / 8, 256, 0, ST_STREAM(s)>>>(q, k, v, qb, kb, vb, beta, qkv, aux, ldaux, boff, T, H,
                                                                dk, l2eps);
    return ST_LAUNCH_OK("kda_prep32_kernel");
}

__global__ void kda_out_gate32_kernel(st_bf16_t *out, st_bf16_t *lo, const float *o, const float *gate, int ldg, const float *w, int T,
                                      int H, int dv, float eps) {
    st_pdl_trigger(); /* the GEMM that reads this output may start loading its weights */
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), l = threadIdx.x & 31;
    if (row >= T * H) return;
    int t = row / H, h = row % H;
    const float *p = o + (size_t)row * dv;
    const float *g = gate + (size_t)t * ldg + (size_t)h * dv;
    float ss = 0.f;
    for (int c = l; c < dv; c += 32) ss += p[c] * p[c];
    ss = st_warp_sum(ss);
    float r = 1.f / sqrtf(ss / (float)dv + eps);
    for (int c = l; c < dv; c += 32)
        out[(size_t)row * dv + c] = st_split_bf(p[c] * r * w[c] * st_sigf(g[c]), lo ? lo + (size_t)row * dv + c : NULL);
}
extern "C" st_status_t st_cuda_kda_out_gate(const st_gpu_stream_t *s, st_bf16_t *out, st_bf16_t *lo, const float *o, const float *gate,
                                         int ldg, const float *w, int T, int H, int dv, float eps) {
    int rows = T * H;
    if (rows <= 0) return ST_OK;
    kda_out_gate32_kernel<<<(rows + 7) / 8, 256, 0, ST_STREAM(s)>>>(out, lo, o, gate, ldg, w, T, H, dv, eps);
    return ST_LAUNCH_OK("kda_out_gate32_kernel");
}


/* grid (H, B), dk threads; thread j owns value column j of S_h (in global memory, [c][j]). */
__global__ void kda_rec_kernel(float *o, const float *q, const float *k, const float *v, const float *g,
                               const float *beta, float *S, const int *slots, const int *cu, int H, int dk, float scale) {
    __shared__ float qs[128], ks[128], es[128];
    const int h = blockIdx.x, b = blockIdx.y, j = threadIdx.x;
    float *Sh = S + ((size_t)(slots ? slots[b] : b) * H + h) * dk * dk;
    for (int t = cu[b]; t < cu[b + 1]; t++) {
        size_t base = ((size_t)t * H + h) * dk;
        __syncthreads();
        qs[j] = q[base + j] * scale;
        ks[j] = k[base + j];
        es[j] = expf(g[base + j]);
        __syncthreads();
        float kv = 0.f;
        for (int c = 0; c < dk; c++) {
            float sv = Sh[(size_t)c * dk + j] * es[c];
            Sh[(size_t)c * dk + j] = sv;
            kv += sv * ks[c];
        }
        float e = beta[(size_t)t * H + h] * (v[base + j] - kv);
        float out = 0.f;
        for (int c = 0; c < dk; c++) {
            float sv = Sh[(size_t)c * dk + j] + ks[c] * e;
            Sh[(size_t)c * dk + j] = sv;
            out += sv * qs[c];
        }
        o[base + j] = out;
    }
}
extern "C" st_status_t st_cuda_kda_recurrent(const st_gpu_stream_t *s, float *o, const float *q, const float *k,
                                        const float *v, const float *g, const float *beta, float *S,
                                        const int *slots, const int *cu_seqlens, int B, int H, int dk, float scale) {
    if (dk <= 0 || dk > 128) return ST_FAIL(ST_ERR_INVALID_ARG, "kda_recurrent: dk=%d (≤ 128)", dk);
    if (B <= 0) return ST_OK;
    kda_rec_kernel<<<dim3(H, B), dk, 0, ST_STREAM(s)>>>(o, q, k, v, g, beta, S, slots, cu_seqlens, H, dk, scale);
    return ST_LAUNCH_OK("kda_rec_kernel");
}

