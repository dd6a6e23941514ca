/* Routing tail on the GPU (SPEC §7): the weights of chosen expert sets (from the host or the top-k
 * kernels) from the sigmoid scores. CPU: st_route_finish (kernels/router.c). */
#include "cuda_common.cuh"

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
extern "C" st_status_t st_cuda_route_finish(const st_gpu_stream_t *s, const int *ids, float *w, const int *cnt,
                                       const float *scores, int T, int n, int kc, bool renorm, float scale) {
    if (T <= 0) return ST_OK;
    route_finish_kernel<<<(T + 127) / 128, 128, 0, ST_STREAM(s)>>>(ids, w, cnt, scores, T, n, kc, renorm, scale);
    return ST_LAUNCH_OK("route_finish_kernel");
}


/* Threshold counts: thread j of a block counts expert j over one chunk of RC_CHUNK tokens (a warp
 * reads 32 consecutive experts of a row: coalesced), then adds its chunk's count once. Integer
 * atomics: the totals do not depend on the order. */
#define RC_THREADS 128
#define RC_CHUNK 32
__global__ void route_count_kernel(uint32_t *cnt, uint32_t *band, const float *scores, const float *tau,
                                   const float *rho, int T, int n) {
    int j = blockIdx.x * RC_THREADS + threadIdx.x;
    if (j >= n) return;
    int t0 = blockIdx.y * RC_CHUNK, t1 = min(T, t0 + RC_CHUNK);
    float tj = tau[j], rj = band ? rho[j] : 0.f;
    uint32_t c = 0, b = 0;
    for (int t = t0; t < t1; t++) {
        float sv = scores[(size_t)t * n + j];
        bool at_tau = sv >= tj; /* NOTE: false for NaN, as the C twin */
        c += at_tau;
        if (band) b += (sv >= rj) != at_tau;
    }
    if (c) atomicAdd(cnt + j, c);
    if (band && b) atomicAdd(band + j, b);
}
extern "C" st_status_t st_cuda_route_count(const st_gpu_stream_t *s, uint32_t *cnt, uint32_t *band,
                                           const float *scores, const float *tau, const float *rho, int T, int n) {
    if (T < 0 || n <= 0 || T / RC_CHUNK >= 65535)
        return ST_FAIL(ST_ERR_INVALID_ARG, "route_count: T=%d n=%d", T, n);
    if (!rho) band = NULL;
    cudaStream_t st = ST_STREAM(s);
    if (cudaMemsetAsync(cnt, 0, (size_t)n * sizeof(uint32_t), st) != cudaSuccess ||
        (band && cudaMemsetAsync(band, 0, (size_t)n * sizeof(uint32_t), st) != cudaSuccess))
        return ST_LAUNCH_OK("route_count memset");
    if (!T) return ST_OK;
    dim3 grid((n + RC_THREADS - 1) / RC_THREADS, (T + RC_CHUNK - 1) / RC_CHUNK);
    route_count_kernel<<<grid, RC_THREADS, 0, st>>>(cnt, band, scores, tau, rho, T, n);
    return ST_LAUNCH_OK("route_count_kernel");
}
