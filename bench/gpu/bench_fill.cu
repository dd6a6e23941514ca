/* Device-side fills for the GPU benchmarks: uniform random values (a counter hash, so a seed gives the
 * same data on every run) into bf16 or fp32 buffers. Benchmark data, not model math: it lives here, not
 * in kernels/ (bench_common.h declares it). */
#include "cuda_common.cuh"

__device__ __forceinline__ float hash_unit(uint64_t i, uint64_t seed) {
    uint64_t z = i * 0x9E3779B97F4A7C15ull + seed;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)(z >> 40) * (1.f / 16777216.f);
}
__global__ void fill_kernel(void *p, int bf16, size_t n, float lo, float hi, uint64_t seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float v = lo + (hi - lo) * hash_unit(i, seed);
        if (bf16) ((st_bf16_t *)p)[i] = st_tobf(v);
        else ((float *)p)[i] = v;
    }
}
extern "C" st_status_t st_cuda_fill_uniform(const st_gpu_stream_t *s, void *p, bool bf16, size_t n, float lo,
                                            float hi, uint64_t seed) {
    if (!n) return ST_OK;
    fill_kernel<<<1024, 256, 0, ST_STREAM(s)>>>(p, bf16, n, lo, hi, seed);
    return ST_LAUNCH_OK("fill_kernel");
}
