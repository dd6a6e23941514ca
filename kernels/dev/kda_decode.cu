/* KDA recurrent decode (SPEC §3.2), the block-width and cache-hint variants, self-contained in the style
 * of llm.c's dev/cuda: a CPU reference, every variant checked against it, then timed. The product
 * kernel (kernels/kda.cu) is variant 2; the others lost the comparison (docs/kernels.md).
 *
 *   nvcc -O3 -arch=sm_90a kernels/dev/kda_decode.cu -o kda_decode     (or: cmake -DSTRATA_KERNELS_DEV=ON)
 *   ./kda_decode [variant] [N] [H]      variant 1..6 (default 2), N sequences (64), H heads (32)
 *
 * variant: 1 NC 32, 2 NC 64 (the product's), 3 NC 128 value columns per block; 4, 5, 6 the same with
 * streaming cache hints (ld/st .cs) on the state. One token per sequence; q, k, v, o fp32 [N, H, 128],
 * g fp32 [N, H, 128] (log-decay), beta fp32 [N, H], state S fp32 [N, H, 128, 128] updated in place. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KD 128

#define CK(x)                                                                                     \
    do {                                                                                          \
        cudaError_t e_ = (x);                                                                     \
        if (e_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));   \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

/* ---- CPU reference: S ← diag(e^g) S; e = β (v − Sᵀk); S ← S + k eᵀ; o = Sᵀ (scale·q) ---- */
static void decode_cpu(float *o, const float *q, const float *k, const float *v, const float *g, const float *beta,
                       float *S, int N, int H, float scale) {
    for (int t = 0; t < N * H; t++) {
        float *St = S + (size_t)t * KD * KD;
        const float *qt = q + (size_t)t * KD, *kt = k + (size_t)t * KD, *vt = v + (size_t)t * KD,
                    *gt = g + (size_t)t * KD;
        for (int c = 0; c < KD; c++)
            for (int j = 0; j < KD; j++) St[c * KD + j] *= expf(gt[c]);
        for (int j = 0; j < KD; j++) {
            double a = 0;
            for (int c = 0; c < KD; c++) a += (double)kt[c] * St[c * KD + j];
            float e = beta[t] * (vt[j] - (float)a);
            for (int c = 0; c < KD; c++) St[c * KD + j] += kt[c] * e;
        }
        for (int j = 0; j < KD; j++) {
            double a = 0;
            for (int c = 0; c < KD; c++) a += (double)qt[c] * scale * St[c * KD + j];
            o[(size_t)t * KD + j] = (float)a;
        }
    }
}

/* ---- the kernel (kernels/kda.cu's, fp32 in and out): grid (KD/NC, H, N), 4·NC threads; a block owns NC
 * value columns of one state; thread = row group rg (rows rg + 16 i) × column quad ---- */
template <int NC, bool CS>
__global__ void __launch_bounds__(4 * NC) decode_kernel(float *o, const float *q, const float *k, const float *v,
                                                        const float *g, const float *beta, float *S, int H,
                                                        float scale) {
    constexpr int NQ = NC / 4;
    __shared__ float qs[KD], ks[KD], ds[KD];
    __shared__ float red[16][NC + 1];
    __shared__ float es[NC];
    const int n = blockIdx.z, h = blockIdx.y, v0 = blockIdx.x * NC, tid = threadIdx.x;
    const int rg = tid / NQ, cq = (tid % NQ) * 4;
    const size_t tok = (size_t)n * H + h;
    float *Sp = S + tok * KD * KD + v0 + cq;
    float4 sr[8];
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const float4 *p = reinterpret_cast<const float4 *>(Sp + (size_t)(rg + 16 * i) * KD);
        sr[i] = CS ? __ldcs(p) : *p;
    }
    if (tid < KD) {
        qs[tid] = q[tok * KD + tid] * scale;
        ks[tid] = k[tok * KD + tid];
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
        es[tid] = beta[tok] * (v[tok * KD + v0 + tid] - a);
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
    __syncthreads();
    red[rg][cq] = p0, red[rg][cq + 1] = p1, red[rg][cq + 2] = p2, red[rg][cq + 3] = p3;
    __syncthreads();
    if (tid < NC) {
        float a = 0;
#pragma unroll
        for (int r = 0; r < 16; r++) a += red[r][tid];
        o[tok * KD + v0 + tid] = a;
    }
}

template <int NC, bool CS>
static void run(float *o, const float *q, const float *k, const float *v, const float *g, const float *beta,
                float *S, int N, int H, float scale) {
    decode_kernel<NC, CS><<<dim3(KD / NC, H, N), 4 * NC>>>(o, q, k, v, g, beta, S, H, scale);
}

static void launch(int variant, float *o, const float *q, const float *k, const float *v, const float *g,
                   const float *beta, float *S, int N, int H, float scale) {
    switch (variant) {
    case 1: run<32, false>(o, q, k, v, g, beta, S, N, H, scale); break;
    case 2: run<64, false>(o, q, k, v, g, beta, S, N, H, scale); break;
    case 3: run<128, false>(o, q, k, v, g, beta, S, N, H, scale); break;
    case 4: run<32, true>(o, q, k, v, g, beta, S, N, H, scale); break;
    case 5: run<64, true>(o, q, k, v, g, beta, S, N, H, scale); break;
    default: run<128, true>(o, q, k, v, g, beta, S, N, H, scale); break;
    }
    CK(cudaGetLastError());
}

static float urand(unsigned long long *s) { /* splitmix64 → [0, 1) */
    unsigned long long z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (float)((z ^ (z >> 31)) >> 40) / 16777216.f;
}

static float *dup_dev(const float *h, size_t n) {
    float *d;
    CK(cudaMalloc(&d, n * 4));
    CK(cudaMemcpy(d, h, n * 4, cudaMemcpyHostToDevice));
    return d;
}

int main(int argc, char **argv) {
    const int variant = argc > 1 ? atoi(argv[1]) : 2, N = argc > 2 ? atoi(argv[2]) : 64, H = argc > 3 ? atoi(argv[3]) : 32;
    if (variant < 1 || variant > 6 || N < 1 || H < 1) {
        fprintf(stderr, "usage: %s [variant 1..6] [N] [H]\n", argv[0]);
        return 2;
    }
    const size_t n = (size_t)N * H * KD, ss = n * KD;
    const float scale = 1.f / sqrtf((float)KD);
    float *q = (float *)malloc(n * 4), *k = (float *)malloc(n * 4), *v = (float *)malloc(n * 4),
          *g = (float *)malloc(n * 4), *beta = (float *)malloc((size_t)N * H * 4), *S = (float *)malloc(ss * 4),
          *o_ref = (float *)malloc(n * 4), *o = (float *)malloc(n * 4), *S_got = (float *)malloc(ss * 4);
    unsigned long long seed = 1;
    for (size_t i = 0; i < n; i++) {
        q[i] = urand(&seed) - 0.5f, k[i] = (urand(&seed) - 0.5f) * 0.2f, v[i] = urand(&seed) * 2 - 1;
        g[i] = -0.5f * urand(&seed) - 0.01f;
    }
    for (int i = 0; i < N * H; i++) beta[i] = 0.1f + 0.8f * urand(&seed);
    for (size_t i = 0; i < ss; i++) S[i] = (urand(&seed) - 0.5f) * 0.2f;
    float *dq = dup_dev(q, n), *dk = dup_dev(k, n), *dv = dup_dev(v, n), *dg = dup_dev(g, n),
          *db = dup_dev(beta, (size_t)N * H), *dS = dup_dev(S, ss), *dS0 = dup_dev(S, ss), *dout;
    CK(cudaMalloc(&dout, n * 4));
    /* check: one step against the CPU */
    launch(variant, dout, dq, dk, dv, dg, db, dS, N, H, scale);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(o, dout, n * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(S_got, dS, ss * 4, cudaMemcpyDeviceToHost));
    decode_cpu(o_ref, q, k, v, g, beta, S, N, H, scale);
    double eo = 0, no = 0, es = 0, ns = 0;
    for (size_t i = 0; i < n; i++) eo += (o[i] - o_ref[i]) * (double)(o[i] - o_ref[i]), no += o_ref[i] * (double)o_ref[i];
    for (size_t i = 0; i < ss; i++) es += (S_got[i] - S[i]) * (double)(S_got[i] - S[i]), ns += S[i] * (double)S[i];
    const double ro = sqrt(eo / no), rs = sqrt(es / ns);
    const int ok = ro < 1e-4 && rs < 1e-5;
    printf("variant %d N=%d H=%d: rel L2 o %.2e, S %.2e: %s\n", variant, N, H, ro, rs, ok ? "ok" : "MISMATCH");
    /* time: repeated steps on the same state (its values drift; the traffic does not) */
    CK(cudaMemcpy(dS, dS0, ss * 4, cudaMemcpyDeviceToDevice));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (int r = 0; r < 5; r++) launch(variant, dout, dq, dk, dv, dg, db, dS, N, H, scale);
    const int it = 100;
    CK(cudaEventRecord(a));
    for (int r = 0; r < it; r++) launch(variant, dout, dq, dk, dv, dg, db, dS, N, H, scale);
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    ms /= it;
    const double bytes = 2.0 * 4 * ss + n * (4 * 4 + 4) + 4.0 * N * H; /* S read + written; q, k, v, g, o; β */
    printf("variant %d N=%d H=%d: %.2f us, %.0f GB/s\n", variant, N, H, ms * 1e3, bytes / (ms * 1e6));
    return ok ? 0 : 1;
}
