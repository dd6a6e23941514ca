/* Glue kernels of the GPU engine (declared in engine_gpu.h): strided cuBLAS calls, embedding,
 * AttnRes two-phase fused with the following RMSNorm, KDA prep / output gate / generic recurrence,
 * MLA cache write and absorbed causal attention over the paged cache, routing tail, expert
 * grouping, gather and combine. Plain loops over bf16 data with fp32 math; the heavy work (GEMMs,
 * KDA chunked/decode, MLA split-KV decode, grouped expert FFN) lives in kernels/. */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>

#include "engine_gpu.h"

#include "cuda_common.cuh" /* kernels/: bf16 conversions, warp/block reductions */

__device__ __forceinline__ float eg_ld(st_bf16_t h) { return st_bf(h); }
__device__ __forceinline__ float eg_ld(float f) { return f; }
__device__ __forceinline__ void eg_st(st_bf16_t *p, float f) { *p = st_tobf(f); }
__device__ __forceinline__ void eg_st(float *p, float f) { *p = f; }
__device__ __forceinline__ float eg_sig(float x) { return 1.f / (1.f + expf(-x)); }
/* v as bf16 hi (returned) and, when lo != NULL, the bf16 of the remainder v − hi into *lo */
__device__ __forceinline__ st_bf16_t eg_split(float v, st_bf16_t *lo) {
    st_bf16_t h = st_tobf(v);
    if (lo) *lo = st_tobf(v - st_bf(h));
    return h;
}

/* ------------------------------------------------------------------ cuBLAS */
extern "C" st_status_t eg_sgemm(const st_gpu_stream_t *s, float *y, int ldy, const float *x, int ldx, const float *W,
                                int T, int N, int K) {
    if (T <= 0) return ST_OK;
    const float one = 1.f, zero = 0.f;
    return ST_CUBLAS_CHECK(cublasSgemm((cublasHandle_t)s->cublas, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &one, W, K, x, ldx,
                                       &zero, y, ldy));
}

/* the KDA decay gate of u = f + dt_bias (SPEC §3.3): lower-bounded sigmoid or −a·softplus */
__device__ __forceinline__ float eg_kda_gate(float u, float a, int bounded, float lb) {
    return bounded ? lb / (1.f + expf(-a * u)) : -a * (u > 20.f ? u : log1pf(expf(u)));
}
__global__ void kda_gate32_kernel(float *g, const float *A_log, const float *dt_bias, size_t n, int H, int dk,
                                  int bounded, float lb) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int hc = (int)(i % ((size_t)H * dk));
    float a = expf(A_log[hc / dk]), u = g[i] + dt_bias[hc];
    g[i] = eg_kda_gate(u, a, bounded, lb);
}
extern "C" st_status_t eg_kda_gate32(const st_gpu_stream_t *s, float *g, const float *A_log, const float *dt_bias, int T,
                                     int H, int dk, bool bounded, float lb) {
    size_t n = (size_t)T * H * dk;
    if (!n) return ST_OK;
    kda_gate32_kernel<<<(unsigned)((n + 255) / 256), 256, 0, ST_STREAM(s)>>>(g, A_log, dt_bias, n, H, dk, bounded, lb);
    return ST_LAUNCH_OK("kda_gate32_kernel");
}

/* Decode form of f_b + gate: one warp per channel hc holds w_fb's row hc in registers (f_rank ≤ 256)
 * and, for each token, g[t, hc] = gate(aux[t, :f_rank] · w_fb[hc] + dt_bias[hc]): the low-rank
 * GEMM and the gate in one launch (fp32 throughout, like eg_sgemm + kda_gate32_kernel). */
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
            g[(size_t)t * P + hc] = eg_kda_gate(u, a, bounded, lb);
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
    g[(size_t)t * P + hc] = eg_kda_gate(p[0] + dt_bias[hc], expf(A_log[hc / dk]), bounded, lb);
}
extern "C" st_status_t eg_kda_gate_fb32(const st_gpu_stream_t *s, float *g, const float *aux, int naux,
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

extern "C" st_status_t eg_linear_heads(const st_gpu_stream_t *s, void *y, bool y_f32, int ldy, long long sy,
                                       const st_bf16_t *x, int ldx, long long sx, const st_bf16_t *W, int ldw,
                                       long long sw, bool trans_w, int T, int N, int K, int H) {
    if (T <= 0) return ST_OK;
    const float one = 1.f, zero = 0.f;
    // col-major: y_hᵀ (N×T) = op(W_h)ᵀ-view (N×K) · x_hᵀ (K×T). W_h [K,N] row-major is col-major N×K
    // (op N, ld N); W_h [N,K] row-major is col-major K×N (op T, ld K).
    return ST_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        (cublasHandle_t)s->cublas, trans_w ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, N, T, K, &one, W, CUDA_R_16BF,
        ldw, sw, x, CUDA_R_16BF, ldx, sx, &zero, y, y_f32 ? CUDA_R_32F : CUDA_R_16BF, ldy, sy, H, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

extern "C" st_status_t eg_linear_heads_add(const st_gpu_stream_t *s, float *y, int ldy, long long sy, const st_bf16_t *x,
                                           int ldx, long long sx, const st_bf16_t *W, int ldw, long long sw,
                                           bool trans_w, int T, int N, int K, int H) {
    if (T <= 0) return ST_OK;
    const float one = 1.f;
    return ST_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        (cublasHandle_t)s->cublas, trans_w ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, N, T, K, &one, W, CUDA_R_16BF,
        ldw, sw, x, CUDA_R_16BF, ldx, sx, &one, y, CUDA_R_32F, ldy, sy, H, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

extern "C" st_status_t eg_sgemm_heads(const st_gpu_stream_t *s, float *y, int ldy, long long sy, const float *x,
                                      int ldx, long long sx, const float *W, int ldw, long long sw, bool trans_w, int T,
                                      int N, int K, int H) {
    if (T <= 0) return ST_OK;
    const float one = 1.f, zero = 0.f;
    return ST_CUBLAS_CHECK(cublasSgemmStridedBatched((cublasHandle_t)s->cublas, trans_w ? CUBLAS_OP_T : CUBLAS_OP_N,
                                                     CUBLAS_OP_N, N, T, K, &one, W, ldw, sw, x, ldx, sx, &zero, y, ldy,
                                                     sy, H));
}

extern "C" st_status_t eg_memcpy_async(const st_gpu_stream_t *s, void *dst, const void *src, size_t bytes, int kind) {
    if (!bytes) return ST_OK;
    cudaMemcpyKind k = kind == 1 ? cudaMemcpyHostToDevice : kind == 2 ? cudaMemcpyDeviceToHost : cudaMemcpyDeviceToDevice;
    return ST_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, k, ST_STREAM(s)));
}
extern "C" st_status_t eg_memset_async(const st_gpu_stream_t *s, void *dst, int byte, size_t bytes) {
    if (!bytes) return ST_OK;
    return ST_CUDA_CHECK(cudaMemsetAsync(dst, byte, bytes, ST_STREAM(s)));
}

/* ------------------------------------------------------------------ embedding, AttnRes, norms */
__global__ void embed_kernel(float *partial, const st_bf16_t *E, const int *tok, int d) {
    const st_bf16_t *row = E + (size_t)tok[blockIdx.x] * d;
    float *o = partial + (size_t)blockIdx.x * d;
    for (int c = threadIdx.x; c < d; c += blockDim.x) o[c] = st_bf(row[c]);
}
extern "C" st_status_t eg_embed(const st_gpu_stream_t *s, float *partial, const st_bf16_t *E, const int *tok, int T,
                                int d) {
    if (T <= 0) return ST_OK;
    embed_kernel<<<T, 256, 0, ST_STREAM(s)>>>(partial, E, tok, d);
    return ST_LAUNCH_OK("embed_kernel");
}

/* one block per token; smem: sc [m·Q] scores, rinv [m] */
__global__ void attnres_p1_kernel(float *stats, float *acc, const float *blocks, size_t bstride, int m, const float *w,
                                  int Q, int d, float eps) {
    extern __shared__ float sh[];
    __shared__ float red[32];
    float *sc = sh, *rinv = sh + m * Q;
    const int t = blockIdx.x;
    for (int i = 0; i < m; i++) {
        const float *V = blocks + i * bstride + (size_t)t * d;
        float ss = 0.f;
        for (int c = threadIdx.x; c < d; c += blockDim.x) ss += V[c] * V[c];
        ss = st_block_sum(ss, red);
        if (threadIdx.x == 0) rinv[i] = 1.f / sqrtf(ss / (float)d + eps);
        for (int q = 0; q < Q; q++) {
            const float *wq = w + (size_t)q * d;
            float dot = 0.f;
            for (int c = threadIdx.x; c < d; c += blockDim.x) dot += V[c] * wq[c];
            dot = st_block_sum(dot, red);
            if (threadIdx.x == 0) sc[i * Q + q] = dot;
        }
    }
    __syncthreads();
    for (int q = 0; q < Q; q++) {
        float mx = -INFINITY, sum = 0.f;
        for (int i = 0; i < m; i++) mx = fmaxf(mx, sc[i * Q + q] * rinv[i]);
        for (int i = 0; i < m; i++) sum += expf(sc[i * Q + q] * rinv[i] - mx);
        float *a = acc + ((size_t)t * Q + q) * d;
        for (int c = threadIdx.x; c < d; c += blockDim.x) {
            float v = 0.f;
            for (int i = 0; i < m; i++) v += expf(sc[i * Q + q] * rinv[i] - mx) * blocks[i * bstride + (size_t)t * d + c];
            a[c] = v;
        }
        if (threadIdx.x == 0) {
            stats[((size_t)t * Q + q) * 2] = mx;
            stats[((size_t)t * Q + q) * 2 + 1] = sum;
        }
    }
}
extern "C" st_status_t eg_attnres_phase1(const st_gpu_stream_t *s, float *stats, float *acc, const float *blocks,
                                         size_t bstride, int m, const float *w, int Q, int T, int d, float eps) {
    if (T <= 0) return ST_OK;
    attnres_p1_kernel<<<T, 256, (size_t)(m * Q + m + 1) * sizeof(float), ST_STREAM(s)>>>(stats, acc, blocks, bstride, m,
                                                                                         w, Q, d, eps);
    return ST_LAUNCH_OK("attnres_p1_kernel");
}

/* one block per output row; smem h [d] fp32 */
__global__ void resnorm_kernel(st_bf16_t *xn, st_bf16_t *xlo, const float *partial, const float *stats, const float *acc,
                               const float *wq, int q, int Q, const float *nw, const int *rows, int d, float ar_eps,
                               float eps) {
    extern __shared__ float h[];
    __shared__ float red[32];
    const int i = blockIdx.x, r = rows ? rows[i] : i;
    const float *P = partial + (size_t)r * d;
    if (stats) {
        float ss = 0.f, dot = 0.f;
        for (int c = threadIdx.x; c < d; c += blockDim.x) ss += P[c] * P[c], dot += P[c] * wq[c];
        ss = st_block_sum(ss, red);
        dot = st_block_sum(dot, red);
        float sp = dot / sqrtf(ss / (float)d + ar_eps);
        const float *st = stats + ((size_t)r * Q + q) * 2;
        const float *a = acc + ((size_t)r * Q + q) * d;
        float mx = fmaxf(st[0], sp), cb = expf(st[0] - mx), cp = expf(sp - mx);
        float inv = 1.f / (st[1] * cb + cp);
        for (int c = threadIdx.x; c < d; c += blockDim.x) h[c] = (a[c] * cb + cp * P[c]) * inv;
    } else {
        for (int c = threadIdx.x; c < d; c += blockDim.x) h[c] = P[c];
    }
    __syncthreads();
    float ss = 0.f;
    for (int c = threadIdx.x; c < d; c += blockDim.x) ss += h[c] * h[c];
    ss = st_block_sum(ss, red);
    float rs = 1.f / sqrtf(ss / (float)d + eps);
    st_bf16_t *o = xn + (size_t)i * d;
    for (int c = threadIdx.x; c < d; c += blockDim.x) o[c] = eg_split(h[c] * rs * nw[c], xlo ? xlo + (size_t)i * d + c : NULL);
}
extern "C" st_status_t eg_resnorm_v1(const st_gpu_stream_t *s, st_bf16_t *xn, st_bf16_t *xlo, const float *partial,
                                     const float *stats, const float *acc, const float *w_q, int q, int Q,
                                     const float *norm_w, const int *rows, int n_rows, int d, float ar_eps,
                                     float norm_eps) {
    if (n_rows <= 0) return ST_OK;
    resnorm_kernel<<<n_rows, 256, (size_t)d * sizeof(float), ST_STREAM(s)>>>(xn, xlo, partial, stats, acc, w_q, q, Q, norm_w,
                                                                            rows, d, ar_eps, norm_eps);
    return ST_LAUNCH_OK("resnorm_kernel");
}
extern "C" st_status_t eg_resnorm(const st_gpu_stream_t *s, st_bf16_t *xn, st_bf16_t *xlo, const float *partial, const float *stats,
                                  const float *acc, const float *w_q, int q, int Q, const float *norm_w, const int *rows,
                                  int n_rows, int d, float ar_eps, float norm_eps) {
    return st_cuda_attnres_phase2_rmsnorm(s, xn, xlo, partial, stats, acc, w_q, q, Q, norm_w, rows, n_rows, d, ar_eps,
                                          norm_eps);
}

/* ------------------------------------------------------------------ profiling (STRATA_EGPU_PROF) */
extern "C" st_status_t eg_events_create(void **ev, int n) {
    for (int i = 0; i < n; i++) {
        st_status_t rc = ST_CUDA_CHECK(cudaEventCreate((cudaEvent_t *)&ev[i]));
        if (rc != ST_OK) {
            eg_events_destroy(ev, i);
            return rc;
        }
    }
    return ST_OK;
}
extern "C" void eg_events_destroy(void **ev, int n) {
    for (int i = 0; i < n; i++)
        if (ev[i]) cudaEventDestroy((cudaEvent_t)ev[i]), ev[i] = NULL;
}
extern "C" st_status_t eg_event_record(void *ev, const st_gpu_stream_t *s) {
    return ST_CUDA_CHECK(cudaEventRecord((cudaEvent_t)ev, ST_STREAM(s)));
}
extern "C" st_status_t eg_event_create_sync(void **ev) {
    return ST_CUDA_CHECK(cudaEventCreateWithFlags((cudaEvent_t *)ev, cudaEventDisableTiming));
}
extern "C" st_status_t eg_stream_wait(const st_gpu_stream_t *s, void *ev) {
    return ST_CUDA_CHECK(cudaStreamWaitEvent(ST_STREAM(s), (cudaEvent_t)ev, 0));
}
extern "C" st_status_t eg_event_sync(void *ev) { return ST_CUDA_CHECK(cudaEventSynchronize((cudaEvent_t)ev)); }
extern "C" bool eg_event_done(void *ev) {
    cudaError_t e = cudaEventQuery((cudaEvent_t)ev);
    if (e == cudaErrorNotReady) return false;
    if (e != cudaSuccess) cudaGetLastError(); /* reported by the sync that follows */
    return true;
}
extern "C" double eg_event_ms(void *a, void *b) {
    float ms = -1.f;
    return cudaEventElapsedTime(&ms, (cudaEvent_t)a, (cudaEvent_t)b) == cudaSuccess ? (double)ms : -1.0;
}
extern "C" st_status_t eg_host_alloc(void **p, size_t bytes) {
    return ST_CUDA_CHECK(cudaHostAlloc(p, bytes, cudaHostAllocMapped));
}
extern "C" void eg_host_free(void *p) {
    if (p) cudaFreeHost(p);
}
__device__ __forceinline__ long long eg_globaltimer() {
    long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__global__ void gate_kernel(volatile int *gate, long long timeout_ns) {
    long long t0 = eg_globaltimer();
    while (gate[0] == 0) {
        if (eg_globaltimer() - t0 > timeout_ns) {
            gate[1] = gate[1] + 1;
            break;
        }
        __nanosleep(2000);
    }
}
extern "C" st_status_t eg_gate(const st_gpu_stream_t *s, int *gate, long long timeout_ns) {
    int *dg = NULL;
    st_status_t rc = ST_CUDA_CHECK(cudaHostGetDevicePointer((void **)&dg, gate, 0));
    if (rc != ST_OK) return rc;
    gate_kernel<<<1, 1, 0, ST_STREAM(s)>>>(dg, timeout_ns);
    return ST_LAUNCH_OK("gate_kernel");
}

/* ------------------------------------------------------------------ KDA glue */
/* one warp per (token, head) */
__global__ void kda_prep_kernel(st_bf16_t *q, st_bf16_t *k, st_bf16_t *v, float *beta, const st_bf16_t *qkv,
                                const float *aux, int ldaux, int boff, int T, int H, int dk, float l2eps) {
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), l = threadIdx.x & 31;
    if (row >= T * H) return;
    int t = row / H, h = row % H, P = H * dk;
    const st_bf16_t *src = qkv + (size_t)t * 3 * P + (size_t)h * dk;
    float sq = 0.f, sk = 0.f;
    for (int c = l; c < dk; c += 32) {
        float a = st_bf(src[c]), b = st_bf(src[P + c]);
        sq += a * a, sk += b * b;
    }
    sq = st_warp_sum(sq), sk = st_warp_sum(sk);
    float rq = 1.f / sqrtf(sq + l2eps), rk = 1.f / sqrtf(sk + l2eps);
    size_t o = (size_t)t * P + (size_t)h * dk;
    for (int c = l; c < dk; c += 32) {
        q[o + c] = st_tobf(st_bf(src[c]) * rq);
        k[o + c] = st_tobf(st_bf(src[P + c]) * rk);
        v[o + c] = src[2 * P + c];
    }
    if (l == 0) beta[(size_t)t * H + h] = eg_sig(aux[(size_t)t * ldaux + boff + h]);
}
extern "C" st_status_t eg_kda_prep(const st_gpu_stream_t *s, st_bf16_t *q, st_bf16_t *k, st_bf16_t *v, float *beta,
                                   const st_bf16_t *qkv, const float *aux, int ldaux, int boff, int T, int H, int dk,
                                   float l2eps) {
    int rows = T * H;
    if (rows <= 0) return ST_OK;
    kda_prep_kernel<<<(rows + 7) / 8, 256, 0, ST_STREAM(s)>>>(q, k, v, beta, qkv, aux, ldaux, boff, T, H, dk, l2eps);
    return ST_LAUNCH_OK("kda_prep_kernel");
}

__global__ void kda_out_gate_kernel(st_bf16_t *o, const st_bf16_t *gate, int ldg, const float *w, int T, int H, int dv,
                                    float eps) {
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), l = threadIdx.x & 31;
    if (row >= T * H) return;
    int t = row / H, h = row % H;
    st_bf16_t *p = o + (size_t)row * dv;
    const st_bf16_t *g = gate + (size_t)t * ldg + (size_t)h * dv;
    float ss = 0.f;
    for (int c = l; c < dv; c += 32) {
        float a = st_bf(p[c]);
        ss += a * a;
    }
    ss = st_warp_sum(ss);
    float r = 1.f / sqrtf(ss / (float)dv + eps);
    for (int c = l; c < dv; c += 32) p[c] = st_tobf(st_bf(p[c]) * r * w[c] * eg_sig(st_bf(g[c])));
}
extern "C" st_status_t eg_kda_out_gate(const st_gpu_stream_t *s, st_bf16_t *o, const st_bf16_t *gate, int ldg,
                                       const float *w, int T, int H, int dv, float eps) {
    int rows = T * H;
    if (rows <= 0) return ST_OK;
    kda_out_gate_kernel<<<(rows + 7) / 8, 256, 0, ST_STREAM(s)>>>(o, gate, ldg, w, T, H, dv, eps);
    return ST_LAUNCH_OK("kda_out_gate_kernel");
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
extern "C" st_status_t eg_kda_recurrent(const st_gpu_stream_t *s, float *o, const float *q, const float *k,
                                        const float *v, const float *g, const float *beta, float *S,
                                        const int *slots, const int *cu_seqlens, int B, int H, int dk, float scale) {
    if (dk <= 0 || dk > 128) return ST_FAIL(ST_ERR_INVALID_ARG, "eg_kda_recurrent: dk=%d (≤ 128)", dk);
    if (B <= 0) return ST_OK;
    kda_rec_kernel<<<dim3(H, B), dk, 0, ST_STREAM(s)>>>(o, q, k, v, g, beta, S, slots, cu_seqlens, H, dk, scale);
    return ST_LAUNCH_OK("kda_rec_kernel");
}

/* ------------------------------------------------------------------ MLA glue */
template <typename TC>
__global__ void mla_kv_store_kernel(TC *pool, const float *ckv, const float *w, const int *tok_ent,
                                    const int *tok_pos, const int *btab, int pps, int ps, int kvr, int R, float eps) {
    __shared__ float red[32];
    const int t = blockIdx.x;
    const float *x = ckv + (size_t)t * R;
    float ss = 0.f;
    for (int c = threadIdx.x; c < kvr; c += blockDim.x) ss += x[c] * x[c];
    ss = st_block_sum(ss, red);
    float r = 1.f / sqrtf(ss / (float)kvr + eps);
    int pos = tok_pos[t], page = btab[(size_t)tok_ent[t] * pps + pos / ps];
    TC *dst = pool + ((size_t)page * ps + pos % ps) * R;
    for (int c = threadIdx.x; c < R; c += blockDim.x) eg_st(dst + c, c < kvr ? x[c] * r * w[c] : x[c]);
}
extern "C" st_status_t eg_mla_kv_store(const st_gpu_stream_t *s, void *pool, bool f32, const float *ckv, const float *w,
                                       const int *tok_ent, const int *tok_pos, const int *btab, int pps, int page_size,
                                       int T, int kvr, int R, float eps) {
    if (T <= 0) return ST_OK;
    if (f32)
        mla_kv_store_kernel<float><<<T, 128, 0, ST_STREAM(s)>>>((float *)pool, ckv, w, tok_ent, tok_pos, btab, pps,
                                                                page_size, kvr, R, eps);
    else
        mla_kv_store_kernel<st_bf16_t><<<T, 128, 0, ST_STREAM(s)>>>((st_bf16_t *)pool, ckv, w, tok_ent, tok_pos, btab,
                                                                    pps, page_size, kvr, R, eps);
    return ST_LAUNCH_OK("mla_kv_store_kernel");
}

template <typename TQ>
__global__ void mla_qpe_kernel(TQ *qabs, const float *q, int H, int nope, int rope, int kvr) {
    int th = blockIdx.x, R = kvr + rope; /* (t, h) */
    for (int c = threadIdx.x; c < rope; c += blockDim.x)
        eg_st(qabs + (size_t)th * R + kvr + c, q[(size_t)th * (nope + rope) + nope + c]);
}
extern "C" st_status_t eg_mla_qpe(const st_gpu_stream_t *s, void *qabs, bool f32, const float *q, int T, int H, int nope,
                                  int rope, int kvr) {
    if (T <= 0 || rope <= 0) return ST_OK;
    if (f32) mla_qpe_kernel<float><<<T * H, 64, 0, ST_STREAM(s)>>>((float *)qabs, q, H, nope, rope, kvr);
    else mla_qpe_kernel<st_bf16_t><<<T * H, 64, 0, ST_STREAM(s)>>>((st_bf16_t *)qabs, q, H, nope, rope, kvr);
    return ST_LAUNCH_OK("mla_qpe_kernel");
}

/* grid (T, ceil(H/8)), 256 threads: warp w = head h0+w of query token t. Key tiles of 32 rows go
 * to shared memory (row stride R+2 bf16: an odd word count, so lane j reading row j is
 * conflict-free); lane j scores key j, then the warp updates its online softmax and the lane-strided
 * accumulator (kvr/32 ≤ 16 values per lane). */
#define MLA_TK 32
template <typename TC>
__global__ void __launch_bounds__(256) mla_attn_kernel(st_bf16_t *olat, st_bf16_t *olo, const TC *qabs, const TC *pool,
                                                       const int *tok_ent, const int *tok_pos, const int *btab, int pps,
                                                       int ps, int H, int R, int kvr, float scale, const int *cu,
                                                       int dmin) {
    /* rows of sequences whose chunk has ≥ dmin tokens go through the direct form (eg_mla_gather …) */
    if (cu && cu[tok_ent[blockIdx.x] + 1] - cu[tok_ent[blockIdx.x]] >= dmin) return;
    extern __shared__ __align__(16) unsigned char smraw[];
    const int LD = sizeof(TC) == 2 ? R + 2 : R + 1;
    TC *Ks = reinterpret_cast<TC *>(smraw);           /* [TK][LD] */
    float *qs = reinterpret_cast<float *>(smraw + (size_t)MLA_TK * LD * sizeof(TC) + 16); /* [8][R] */
    const int t = blockIdx.x, w = threadIdx.x >> 5, lane = threadIdx.x & 31, h = blockIdx.y * 8 + w;
    const bool active = h < H;
    const int n = tok_pos[t] + 1;
    const int *bt = btab + (size_t)tok_ent[t] * pps;
    for (int c = lane; c < R; c += 32) qs[w * R + c] = active ? eg_ld(qabs[((size_t)t * H + h) * R + c]) * scale : 0.f;
    float acc[16];
#pragma unroll
    for (int i = 0; i < 16; i++) acc[i] = 0.f;
    float m = -INFINITY, lsum = 0.f;
    const int nacc = kvr / 32;
    for (int s0 = 0; s0 < n; s0 += MLA_TK) {
        __syncthreads();
        for (int i = threadIdx.x; i < MLA_TK * R; i += blockDim.x) {
            int r = i / R, c = i % R, j = s0 + r;
            TC val = 0;
            if (j < n) val = pool[((size_t)bt[j / ps] * ps + j % ps) * R + c];
            Ks[r * LD + c] = val;
        }
        __syncthreads();
        if (!active) continue;
        float sc = -INFINITY;
        if (s0 + lane < n) {
            const TC *kr = Ks + lane * LD;
            const float *qw = qs + w * R;
            float a = 0.f;
            for (int c = 0; c < R; c++) a += qw[c] * eg_ld(kr[c]);
            sc = a;
        }
        float mt = st_warp_max(sc), mn = fmaxf(m, mt);
        float alpha = expf(m - mn), p = s0 + lane < n ? expf(sc - mn) : 0.f;
        lsum = lsum * alpha + st_warp_sum(p);
        m = mn;
#pragma unroll
        for (int i = 0; i < 16; i++) acc[i] *= alpha;
        for (int j = 0; j < MLA_TK && s0 + j < n; j++) {
            float pj = __shfl_sync(0xffffffffu, p, j);
            const TC *kr = Ks + j * LD;
#pragma unroll
            for (int i = 0; i < 16; i++)
                if (i < nacc) acc[i] += pj * eg_ld(kr[lane + 32 * i]);
        }
    }
    if (!active) return;
    float inv = lsum > 0.f ? 1.f / lsum : 0.f;
#pragma unroll
    for (int i = 0; i < 16; i++)
        if (i < nacc) {
            size_t j = ((size_t)t * H + h) * kvr + lane + 32 * i;
            olat[j] = eg_split(acc[i] * inv, olo ? olo + j : NULL);
        }
}
template <typename TC>
static st_status_t mla_attn_launch(const st_gpu_stream_t *s, st_bf16_t *olat, st_bf16_t *olo, const void *qabs, const void *pool,
                                   const int *tok_ent, const int *tok_pos, const int *btab, int pps, int page_size,
                                   int T, int H, int R, int kvr, float scale, const int *cu, int dmin) {
    int LD = sizeof(TC) == 2 ? R + 2 : R + 1;
    size_t smem = (size_t)MLA_TK * LD * sizeof(TC) + 16 + (size_t)8 * R * sizeof(float);
    st_status_t rc = ST_CUDA_CHECK(
        cudaFuncSetAttribute(mla_attn_kernel<TC>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    if (rc) return rc;
    mla_attn_kernel<TC><<<dim3(T, (H + 7) / 8), 256, smem, ST_STREAM(s)>>>(
        olat, olo, (const TC *)qabs, (const TC *)pool, tok_ent, tok_pos, btab, pps, page_size, H, R, kvr, scale, cu, dmin);
    return ST_LAUNCH_OK("mla_attn_kernel");
}
extern "C" st_status_t eg_mla_attn(const st_gpu_stream_t *s, st_bf16_t *olat, st_bf16_t *olo, const void *qabs, const void *pool,
                                   bool f32, const int *tok_ent, const int *tok_pos, const int *btab, int pps,
                                   int page_size, int T, int H, int R, int kvr, float scale, const int *cu, int dmin) {
    if (R > 1024 || kvr > 512 || kvr % 32 || kvr > R)
        return ST_FAIL(ST_ERR_INVALID_ARG, "eg_mla_attn: R=%d kvr=%d (R ≤ 1024, kvr ≤ 512, kvr %% 32 = 0)", R, kvr);
    if (T <= 0) return ST_OK;
    return f32 ? mla_attn_launch<float>(s, olat, olo, qabs, pool, tok_ent, tok_pos, btab, pps, page_size, T, H, R, kvr, scale,
                                        cu, dmin)
               : mla_attn_launch<st_bf16_t>(s, olat, olo, qabs, pool, tok_ent, tok_pos, btab, pps, page_size, T, H, R, kvr,
                                            scale, cu, dmin);
}

/* ---- MLA direct form for long prompt chunks (SPEC §4: o_h = softmax(q_h·k_hᵀ) v_h with
 * k_h = [W_UK,h c̃ ; k_pe], v_h = W_UV,h c̃): one sequence's n latent rows are gathered from the paged
 * cache, decompressed by one GEMM and split into per-head K and V for st_cuda_mla_prefill. */
/* c [n, R] bf16 = the sequence's cache rows 0..n-1 (pages bt); 8 bf16 per thread */
__global__ void mla_gather_kernel(st_bf16_t *c, const st_bf16_t *pool, const int *bt, int ps, int n, int R8) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)n * R8) return;
    int j = (int)(i / R8), q = (int)(i % R8);
    const uint4 *src = reinterpret_cast<const uint4 *>(pool + ((size_t)bt[j / ps] * ps + j % ps) * (R8 * 8)) + q;
    reinterpret_cast<uint4 *>(c)[i] = *src;
}
extern "C" st_status_t eg_mla_gather(const st_gpu_stream_t *s, st_bf16_t *c, const st_bf16_t *pool, const int *bt,
                                     int page_size, int n, int R) {
    if (R % 8) return ST_FAIL(ST_ERR_INVALID_ARG, "eg_mla_gather: R=%d (multiple of 8)", R);
    if (n <= 0) return ST_OK;
    size_t items = (size_t)n * (R / 8);
    mla_gather_kernel<<<(unsigned)((items + 255) / 256), 256, 0, ST_STREAM(s)>>>(c, pool, bt, page_size, n, R / 8);
    return ST_LAUNCH_OK("mla_gather_kernel");
}
/* K [n, H, nope+rope] = [Y[n, h, 0:nope] ; c[n, kvr:kvr+rope]], V [n, H, dv] = Y[n, h, nope:nope+dv];
 * Y [n, H, nope+dv] bf16, c [n, R] bf16 (the gathered rows) */
__global__ void mla_kv_split_kernel(st_bf16_t *K, st_bf16_t *V, const st_bf16_t *Y, const st_bf16_t *c, int n, int H,
                                    int nope, int rope, int dv, int R, int kvr) {
    const int dqk = nope + rope, kvw = nope + dv, width = dqk + dv;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)n * H * width) return;
    int x = (int)(i % width);
    size_t jh = i / width; /* j·H + h */
    size_t j = jh / H;
    const st_bf16_t *y = Y + jh * kvw;
    if (x < nope) K[jh * dqk + x] = y[x];
    else if (x < dqk) K[jh * dqk + x] = c[j * R + kvr + (x - nope)];
    else V[jh * dv + (x - dqk)] = y[nope + (x - dqk)];
}
extern "C" st_status_t eg_mla_kv_split(const st_gpu_stream_t *s, st_bf16_t *K, st_bf16_t *V, const st_bf16_t *Y,
                                       const st_bf16_t *c, int n, int H, int nope, int rope, int dv, int R, int kvr) {
    if (n <= 0) return ST_OK;
    size_t items = (size_t)n * H * (nope + rope + dv);
    mla_kv_split_kernel<<<(unsigned)((items + 255) / 256), 256, 0, ST_STREAM(s)>>>(K, V, Y, c, n, H, nope, rope, dv, R,
                                                                                   kvr);
    return ST_LAUNCH_OK("mla_kv_split_kernel");
}

__global__ void mul_sigmoid_kernel(st_bf16_t *x, const st_bf16_t *g, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = st_tobf(st_bf(x[i]) * eg_sig(st_bf(g[i])));
}
extern "C" st_status_t eg_mul_sigmoid(const st_gpu_stream_t *s, st_bf16_t *x, const st_bf16_t *gate, size_t n) {
    if (!n) return ST_OK;
    mul_sigmoid_kernel<<<(unsigned)((n + 255) / 256), 256, 0, ST_STREAM(s)>>>(x, gate, n);
    return ST_LAUNCH_OK("mul_sigmoid_kernel");
}

/* ------------------------------------------------------------------ MoE glue */
__global__ void route_finish_kernel(const int *ids, float *w, const int *cnt, const float *scores, int T, int n, int kc,
                                    int renorm, float scale) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= T) return;
    const int *id = ids + (size_t)t * kc;
    const float *s = scores + (size_t)t * n;
    int c = cnt[t];
    float sum = 0.f;
    for (int i = 0; i < c; i++) sum += s[id[i]];
    for (int i = 0; i < kc; i++)
        w[(size_t)t * kc + i] = i < c ? (renorm ? s[id[i]] / (sum + 1e-20f) * scale : s[id[i]] * scale) : 0.f;
}
extern "C" st_status_t eg_route_finish(const st_gpu_stream_t *s, const int *ids, float *w, const int *cnt,
                                       const float *scores, int T, int n, int kc, bool renorm, float scale) {
    if (T <= 0) return ST_OK;
    route_finish_kernel<<<(T + 127) / 128, 128, 0, ST_STREAM(s)>>>(ids, w, cnt, scores, T, n, kc, renorm, scale);
    return ST_LAUNCH_OK("route_finish_kernel");
}

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
extern "C" st_status_t eg_moe_group(const st_gpu_stream_t *s, int *offsets, int *row_of, const int *ids, const int *cnt,
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
extern "C" st_status_t eg_moe_gather(const st_gpu_stream_t *s, st_bf16_t *xg, const st_bf16_t *z, const int *row_of,
                                     const int *cnt, int T, int kc, int l) {
    if (T <= 0) return ST_OK;
    if (l % 2) return ST_FAIL(ST_ERR_INVALID_ARG, "eg_moe_gather: odd width %d", l);
    moe_gather_kernel<<<dim3(T, kc), 128, 0, ST_STREAM(s)>>>(xg, z, row_of, cnt, kc, l);
    return ST_LAUNCH_OK("moe_gather_kernel");
}

/* one block per token; smem u [l] fp32, then the token's weights and source rows [kc] each (read
 * once, so the rows' loads do not wait on them slot by slot) */
__global__ void moe_combine_kernel(st_bf16_t *un, st_bf16_t *ulo, float *partial, const float *yg, const float *yf, const int *row_of,
                                   const float *p, const int *cnt, const float *nw, int kc, int l, float eps) {
    st_pdl_trigger(); /* the GEMM that reads this output may start loading its weights */
    extern __shared__ float u[];
    __shared__ float red[32];
    float *ps = u + l;
    int *rs = reinterpret_cast<int *>(ps + kc);
    const int t = blockIdx.x, c_ = cnt[t];
    const float *Y = yg ? yg : yf;
    for (int i = threadIdx.x; i < c_; i += blockDim.x) {
        ps[i] = p[(size_t)t * kc + i];
        rs[i] = yg ? row_of[(size_t)t * kc + i] : t * kc + i;
    }
    __syncthreads();
    for (int c = threadIdx.x; c < l; c += blockDim.x) {
        float a = 0.f;
#pragma unroll 8
        for (int i = 0; i < c_; i++) a = __fadd_rn(a, __fmul_rn(ps[i], Y[(size_t)rs[i] * l + c]));
        u[c] = a;
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
        un[(size_t)t * l + c] = eg_split(nw ? u[c] * r * nw[c] : u[c], ulo ? ulo + (size_t)t * l + c : NULL);
}
extern "C" st_status_t eg_moe_combine(const st_gpu_stream_t *s, st_bf16_t *un, st_bf16_t *ulo, float *partial, const float *yg,
                                      const float *yf, const int *row_of, const float *p, const int *cnt,
                                      const float *norm_w, int T, int kc, int l, float eps) {
    if (T <= 0) return ST_OK;
    moe_combine_kernel<<<T, 256, ((size_t)l + 2 * (size_t)kc) * sizeof(float), ST_STREAM(s)>>>(
        un, ulo, partial, yg, yf, row_of, p, cnt, norm_w, kc, l, eps);
    return ST_LAUNCH_OK("moe_combine_kernel");
}

/* ------------------------------------------------------------------ fp32-activation glue
 * The engine keeps activations fp32 between kernels and rounds to bf16 only where a tensor-core
 * GEMM (or the chunked KDA kernel's tiles) consumes them; these are the fp32-input glue kernels. */
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
    if (l == 0) beta[(size_t)t * H + h] = eg_sig(aux[(size_t)t * ldaux + boff + h]);
}
extern "C" st_status_t eg_kda_prep32(const st_gpu_stream_t *s, float *q, float *k, float *v, st_bf16_t *qb,
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
        out[(size_t)row * dv + c] = eg_split(p[c] * r * w[c] * eg_sig(g[c]), lo ? lo + (size_t)row * dv + c : NULL);
}
extern "C" st_status_t eg_kda_out_gate32(const st_gpu_stream_t *s, st_bf16_t *out, st_bf16_t *lo, const float *o, const float *gate,
                                         int ldg, const float *w, int T, int H, int dv, float eps) {
    int rows = T * H;
    if (rows <= 0) return ST_OK;
    kda_out_gate32_kernel<<<(rows + 7) / 8, 256, 0, ST_STREAM(s)>>>(out, lo, o, gate, ldg, w, T, H, dv, eps);
    return ST_LAUNCH_OK("kda_out_gate32_kernel");
}

__global__ void glu32_kernel(st_bf16_t *h, st_bf16_t *lo, const float *gate, const float *up, int T, int n, int ld, int situ, float b1,
                             float b2) {
    st_pdl_trigger(); /* the GEMM that reads this output may start loading its weights */
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)T * n) return;
    size_t t = i / n, c = i % n;
    float a = gate[t * ld + c], u = up[t * ld + c];
    float sg = 1.f / (1.f + expf(-a));
    h[i] = eg_split(situ ? (b1 * tanhf(a / b1) * sg) * (b2 * tanhf(u / b2)) : a * sg * u, lo ? lo + i : NULL);
}
extern "C" st_status_t eg_glu32(const st_gpu_stream_t *s, st_bf16_t *h, st_bf16_t *lo, const float *gate, const float *up, int T, int n,
                                int ld_in, bool situ, float b1, float b2) {
    if (T < 0 || n <= 0 || ld_in < n) return ST_FAIL(ST_ERR_INVALID_ARG, "eg_glu32: T=%d n=%d ld=%d", T, n, ld_in);
    size_t N = (size_t)T * n;
    if (!N) return ST_OK;
    glu32_kernel<<<(unsigned)((N + 255) / 256), 256, 0, ST_STREAM(s)>>>(h, lo, gate, up, T, n, ld_in, situ, b1, b2);
    return ST_LAUNCH_OK("glu32_kernel");
}

__global__ void rmsnorm32_kernel(st_bf16_t *y, st_bf16_t *lo, const float *x, const float *w, int n, float eps) {
    st_pdl_trigger(); /* the GEMM that reads this output may start loading its weights */
    __shared__ float red[32];
    const float *xr = x + (size_t)blockIdx.x * n;
    float ss = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
    ss = st_block_sum(ss, red);
    float r = rsqrtf(ss / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = xr[i] * r;
        y[(size_t)blockIdx.x * n + i] = eg_split(w ? v * w[i] : v, lo ? lo + (size_t)blockIdx.x * n + i : NULL);
    }
}
extern "C" st_status_t eg_rmsnorm32(const st_gpu_stream_t *s, st_bf16_t *y, st_bf16_t *lo, const float *x, const float *w, int T, int n,
                                    float eps) {
    if (T < 0 || n <= 0) return ST_FAIL(ST_ERR_INVALID_ARG, "eg_rmsnorm32: T=%d n=%d", T, n);
    if (T == 0) return ST_OK;
    rmsnorm32_kernel<<<T, 256, 0, ST_STREAM(s)>>>(y, lo, x, w, n, eps);
    return ST_LAUNCH_OK("rmsnorm32_kernel");
}

__global__ void mul_sigmoid32_kernel(st_bf16_t *y, st_bf16_t *lo, const float *x, const float *g, size_t n) {
    st_pdl_trigger(); /* the GEMM that reads this output may start loading its weights */
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = eg_split(x[i] * eg_sig(g[i]), lo ? lo + i : NULL);
}
extern "C" st_status_t eg_mul_sigmoid32(const st_gpu_stream_t *s, st_bf16_t *y, st_bf16_t *lo, const float *x, const float *gate,
                                        size_t n) {
    if (!n) return ST_OK;
    mul_sigmoid32_kernel<<<(unsigned)((n + 255) / 256), 256, 0, ST_STREAM(s)>>>(y, lo, x, gate, n);
    return ST_LAUNCH_OK("mul_sigmoid32_kernel");
}

__global__ void split_bf16_kernel(st_bf16_t *hi, st_bf16_t *lo, const float *x, size_t n) {
    st_pdl_trigger(); /* the GEMM that reads this output may start loading its weights */
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) hi[i] = eg_split(x[i], lo + i);
}
extern "C" st_status_t eg_split_bf16(const st_gpu_stream_t *s, st_bf16_t *hi, st_bf16_t *lo, const float *x, size_t n) {
    if (!n) return ST_OK;
    split_bf16_kernel<<<(unsigned)((n + 255) / 256), 256, 0, ST_STREAM(s)>>>(hi, lo, x, n);
    return ST_LAUNCH_OK("split_bf16_kernel");
}
