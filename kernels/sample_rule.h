/* The arithmetic that st_sample_rows (sample.c) and st_cuda_sample (sample.cu) share, written once
 * so that the two compile the same expressions: the order key of a logit, the seeded uniform of
 * (seed, position, token) and the Gumbel perturbation. Internal header of kernels/. */
#ifndef STRATA_SAMPLE_RULE_H
#define STRATA_SAMPLE_RULE_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define ST_SR_FN __host__ __device__ static inline
#else
#define ST_SR_FN static inline
#endif

/* A float's bits as an unsigned key in the float's order (−0 below +0; NaN sorts outside the finite
 * values and is never produced by the model): a > b ⇔ key(a) > key(b) for distinct finite floats. */
ST_SR_FN uint32_t st_sr_key(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

ST_SR_FN uint64_t st_sr_mix(uint64_t z) { /* splitmix64's finaliser */
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* The uniform in (0, 1) of token v at generated position pos of the stream seed: integer hashing
 * only, so every backend draws the same 53 bits. */
ST_SR_FN double st_sr_uniform(uint64_t seed, uint32_t pos, uint32_t v) {
    uint64_t h = st_sr_mix(st_sr_mix(seed ^ st_sr_mix(0x9E3779B97F4A7C15ull * ((uint64_t)pos + 1))) + (uint64_t)v);
    return ((double)(h >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

/* Gumbel-max: argmax over the kept tokens of s_v + G_v, G_v = −log(−log u_v), samples v with
 * probability exp(s_v) / Σ exp(s) over the kept set. s_v is the float (x_v − max) / T, identical on
 * every backend; the logs run in double, so two backends' scores differ by a few 1e-16 relative. */
ST_SR_FN double st_sr_gumbel(float s, uint64_t seed, uint32_t pos, uint32_t v) {
    return (double)s - log(-log(st_sr_uniform(seed, pos, v)));
}

#endif
