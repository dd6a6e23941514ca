/* Sampling on the device (SPEC §9): st_cuda_sample, one block per row, the rule of st_sample_rows
 * (strata/kernels.h) pass for pass. Boundaries (top-k, top-p) are found by bit-by-bit searches over
 * the order keys of kernels/sample_rule.h, each step one block reduction over the row (no sort, no
 * workspace); integer counts and float comparisons are exact, masses and logs run in double.
 * CPU twin: kernels/sample.c. */
#include <math.h>

#include "cuda_common.cuh"
#include "sample_rule.h"
#include "strata/kernels.h"

#define SNT 1024 /* threads per row */

/* NOTE: every block reduction below combines the warps in a fixed order, so a row's result is the
 * same from run to run; sh is 32 slots of shared memory, reused after the trailing barrier. */
template <typename V> __device__ V bsum(V v, V *sh) {
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    __syncthreads();
    if (l == 0) sh[w] = v;
    __syncthreads();
    V t = 0;
    for (int i = 0; i < (int)(blockDim.x >> 5); i++)
        t += sh[i];
    return t;
}

/* the largest a (a double, or a float widened exactly), ties → the lower id; id −1 = none */
__device__ void bmax(double &a, int &id, double *sh, int *shi) {
    for (int o = 16; o > 0; o >>= 1) {
        double oa = __shfl_xor_sync(0xffffffffu, a, o);
        int oi = __shfl_xor_sync(0xffffffffu, id, o);
        if (oi >= 0 && (id < 0 || oa > a || (oa == a && oi < id))) a = oa, id = oi;
    }
    int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    __syncthreads();
    if (l == 0) sh[w] = a, shi[w] = id;
    __syncthreads();
    a = -INFINITY, id = -1;
    for (int i = 0; i < (int)(blockDim.x >> 5); i++)
        if (shi[i] >= 0 && (id < 0 || sh[i] > a || (sh[i] == a && shi[i] < id))) a = sh[i], id = shi[i];
}

/* the largest key, ties → the lower id, among keys ordered below (pk, pid) */
__device__ void bmax_key(uint32_t &k, int &id, uint32_t *shk, int *shi) {
    for (int o = 16; o > 0; o >>= 1) {
        uint32_t ok = __shfl_xor_sync(0xffffffffu, k, o);
        int oi = __shfl_xor_sync(0xffffffffu, id, o);
        if (oi >= 0 && (id < 0 || ok > k || (ok == k && oi < id))) k = ok, id = oi;
    }
    int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    __syncthreads();
    if (l == 0) shk[w] = k, shi[w] = id;
    __syncthreads();
    k = 0, id = -1;
    for (int i = 0; i < (int)(blockDim.x >> 5); i++)
        if (shi[i] >= 0 && (id < 0 || shk[i] > k || (shk[i] == k && shi[i] < id))) k = shk[i], id = shi[i];
}

__device__ __forceinline__ bool kept(uint32_t key, int v, uint32_t kk, uint32_t kj, uint32_t kp) {
    return (key > kk || (key == kk && (uint32_t)v < kj)) && key >= kp;
}

__device__ __forceinline__ float scaled(float x, float m, float t) {
    return __fdiv_rn(__fsub_rn(x, m), t);
}

__global__ void __launch_bounds__(SNT)
    sample_kernel(int *ids, float *lp, int *top_ids, float *top_lp, float *logits, int V, const st_sample_row_t *rows,
                  const uint32_t *bias_ids, const float *bias_values, int *counts) {
    __shared__ double shd[32];
    __shared__ int shi[32];
    __shared__ uint32_t shk[32];
    const int r = blockIdx.x, tid = threadIdx.x;
    const st_sample_row_t p = rows[r];
    float *x = logits + (size_t)p.row * V;
    int *cnt = counts && p.count_row >= 0 ? counts + (size_t)p.count_row * V : NULL;
    /* 1. penalties, then the bias list in order (one thread: repeated ids add up as on the CPU) */
    if (cnt && (p.presence != 0.0f || p.frequency != 0.0f))
        for (int v = tid; v < V; v += SNT) {
            int c = cnt[v];
            if (c > 0) x[v] = __fsub_rn(x[v], __fadd_rn(__fmul_rn(p.frequency, (float)c), p.presence));
        }
    __syncthreads();
    if (tid == 0)
        for (int i = p.bias_off; i < p.bias_off + p.n_bias; i++)
            if (bias_ids[i] < (uint32_t)V) x[bias_ids[i]] = __fadd_rn(x[bias_ids[i]], bias_values[i]);
    __syncthreads();
    /* 2. the max and its lowest id (float comparisons, as st_argmax) */
    double mv = -INFINITY;
    int am = -1;
    for (int v = tid; v < V; v += SNT)
        if (am < 0 || x[v] > (float)mv) mv = x[v], am = v; /* strided ascending: the first max */
    bmax(mv, am, shd, shi);
    const float m = (float)mv;
    int c = am;
    if (p.temperature > 0.0f && p.top_k != 1) {
        const float T = p.temperature;
        uint32_t kk = 0, kj = 0xFFFFFFFFu, kp = 0;
        if (p.top_k > 0 && p.top_k < V) { /* 3a. top-k: the boundary key, then the ties' id bound */
            for (int b = 31; b >= 0; b--) {
                uint32_t t = kk | (1u << b);
                int n = 0;
                for (int v = tid; v < V; v += SNT)
                    n += st_sr_key(x[v]) >= t;
                if (bsum(n, shi) >= p.top_k) kk = t;
            }
            int gt = 0, ties = 0;
            for (int v = tid; v < V; v += SNT) {
                uint32_t key = st_sr_key(x[v]);
                gt += key > kk;
                ties += key == kk;
            }
            int rr = p.top_k - bsum(gt, shi);
            if (bsum(ties, shi) > rr) {
                uint32_t j = 0;
                for (int b = 30; b >= 0; b--) {
                    uint32_t t = j | (1u << b);
                    int n = 0;
                    for (int v = tid; v < V && (uint32_t)v < t; v += SNT)
                        n += st_sr_key(x[v]) == kk;
                    if (bsum(n, shi) <= rr) j = t;
                }
                kj = j;
            }
        }
        if (p.top_p < 1.0f) { /* 3b. top-p within the top-k set */
            double z = 0;
            for (int v = tid; v < V; v += SNT)
                if (kept(st_sr_key(x[v]), v, kk, kj, 0)) z += exp((double)scaled(x[v], m, T));
            double target = fmax((double)p.top_p * bsum(z, shd), 1.0);
            for (int b = 31; b >= 0; b--) {
                uint32_t t = kp | (1u << b);
                double mass = 0;
                for (int v = tid; v < V; v += SNT)
                    if (kept(st_sr_key(x[v]), v, kk, kj, t)) mass += exp((double)scaled(x[v], m, T));
                if (bsum(mass, shd) >= target) kp = t;
            }
        }
        /* 3c. Gumbel-max over the kept set */
        double best = -INFINITY;
        c = -1;
        for (int v = tid; v < V; v += SNT) {
            if (!kept(st_sr_key(x[v]), v, kk, kj, kp)) continue;
            double g = st_sr_gumbel(scaled(x[v], m, T), p.seed, p.pos, (uint32_t)v);
            if (c < 0 || g > best) best = g, c = v;
        }
        bmax(best, c, shd, shi);
    }
    if (tid == 0) {
        ids[r] = c;
        if (cnt) cnt[c]++; /* 4. after every read of this row's counts (the barriers above) */
    }
    if (p.n_top < 0) return;
    /* 5. logprobs under softmax(x) */
    double z1 = 0;
    for (int v = tid; v < V; v += SNT)
        z1 += exp((double)x[v] - (double)m);
    const double lz = log(bsum(z1, shd));
    if (tid == 0) lp[r] = (float)((double)x[c] - (double)m - lz);
    uint32_t pk = 0xFFFFFFFFu;
    int pid = -1, n = p.n_top < V ? p.n_top : V;
    for (int j = 0; j < n && j < ST_SAMPLE_MAX_TOP; j++) {
        uint32_t bk = 0;
        int b = -1;
        for (int v = tid; v < V; v += SNT) {
            uint32_t key = st_sr_key(x[v]);
            if (key > pk || (key == pk && v <= pid)) continue;
            if (b < 0 || key > bk) b = v, bk = key;
        }
        bmax_key(bk, b, shk, shi);
        if (tid == 0) {
            top_ids[(size_t)r * ST_SAMPLE_MAX_TOP + j] = b;
            top_lp[(size_t)r * ST_SAMPLE_MAX_TOP + j] = (float)((double)x[b] - (double)m - lz);
        }
        pk = bk, pid = b;
    }
}

extern "C" st_status_t st_cuda_sample(const st_gpu_stream_t *s, int *ids, float *lp, int *top_ids, float *top_lp,
                                      float *logits, int n, int V, const struct st_sample_row *rows,
                                      const uint32_t *bias_ids, const float *bias_values, int *counts) {
    if (n < 0 || V <= 0) return ST_FAIL(ST_ERR_INVALID_ARG, "sample: n=%d V=%d", n, V);
    if (!n) return ST_OK;
    sample_kernel<<<n, SNT, 0, ST_STREAM(s)>>>(ids, lp, top_ids, top_lp, logits, V, rows, bias_ids, bias_values,
                                               counts);
    return ST_LAUNCH_OK("sample_kernel");
}
