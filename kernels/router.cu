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
