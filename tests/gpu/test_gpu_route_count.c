/* The router epilogue's threshold counts on the GPU (st_cuda_route_count) vs the C twin
 * (st_route_count, itself tested against st_qsum_count_layer in tests/quantile/test_qengine):
 * counts exactly equal over T 1, 7, 256, 4096 and n up to 896 (odd n), with ties exactly at τ,
 * NaN/±inf scores, NaN τ columns and whole NaN-τ rows (unset layers), all-above and none-above τ,
 * ρ below and above τ and NaN ρ; with and without the band; output buffers poisoned first. */
#include <math.h>
#include <string.h>

#include "gpu_test.h"
#include "strata/kernels.h"

enum { TAU_MIXED, TAU_ALL_NAN, TAU_ALL_ABOVE, TAU_NONE_ABOVE };

static void count_case(int T, int n, int tau_kind, uint64_t seed) {
    st_rng_t r = {seed};
    size_t N = (size_t)T * n;
    float *s = gt_xmalloc(4 * N), *tau = gt_xmalloc(4 * (size_t)n), *rho = gt_xmalloc(4 * (size_t)n);
    uint32_t *c_ref = gt_xmalloc(4 * (size_t)n), *b_ref = gt_xmalloc(4 * (size_t)n);
    uint32_t *c_got = gt_xmalloc(4 * (size_t)n), *b_got = gt_xmalloc(4 * (size_t)n);
    for (size_t i = 0; i < N; i++) {
        uint64_t v = st_rng_next(&r) % 256;
        s[i] = v == 0 ? NAN : v == 1 ? INFINITY : v == 2 ? -INFINITY : (float)(v % 32) / 32.0f; /* many ties */
    }
    for (int j = 0; j < n; j++) {
        tau[j] = tau_kind == TAU_ALL_NAN ? NAN : tau_kind == TAU_ALL_ABOVE ? -2.0f : tau_kind == TAU_NONE_ABOVE ? 2.0f
               : j % 11 == 4 ? NAN : (float)(st_rng_next(&r) % 32) / 32.0f; /* exactly on score values */
        rho[j] = j % 13 == 6 ? NAN : tau[j] + (j % 2 ? 0.0625f : -0.09375f);
    }
    float *d_s = gt_up(s, 4 * N), *d_tau = gt_up(tau, 4 * (size_t)n), *d_rho = gt_up(rho, 4 * (size_t)n);
    uint32_t *d_c = gt_dev(4 * (size_t)n), *d_b = gt_dev(4 * (size_t)n);
    for (int band = 1; band >= 0; band--) {
        gt_poison(d_c, 4 * (size_t)n), gt_poison(d_b, 4 * (size_t)n);
        st_route_count(c_ref, band ? b_ref : NULL, s, tau, band ? rho : NULL, T, n);
        GT_OK(st_cuda_route_count(&gt_stream, d_c, band ? d_b : NULL, d_s, d_tau, band ? d_rho : NULL, T, n));
        gt_down(c_got, d_c, 4 * (size_t)n);
        gt_down(b_got, d_b, 4 * (size_t)n);
        int bad = 0, inner = 0;
        for (int j = 0; j < n; j++) {
            bad += c_got[j] != c_ref[j] || (band && b_got[j] != b_ref[j]);
            inner += c_ref[j] > 0 && c_ref[j] < (uint32_t)T;
        }
        CHECK(bad == 0, "route_count T=%d n=%d tau=%d band=%d: %d experts differ", T, n, tau_kind, band, bad);
        if (tau_kind == TAU_MIXED && T >= 7 && band)
            CHECK(inner >= n / 2, "route_count T=%d n=%d: counts strictly inside (0, T) exercised (%d)", T, n, inner);
        if (!band) CHECK(b_got[0] == 0xffffffffu, "route_count: band untouched without rho");
    }
    st_gpu_free(d_s), st_gpu_free(d_tau), st_gpu_free(d_rho), st_gpu_free(d_c), st_gpu_free(d_b);
    free(s), free(tau), free(rho), free(c_ref), free(b_ref), free(c_got), free(b_got);
}

int main(void) {
    gt_init_or_skip("test_gpu_route_count");
    const int Ts[] = {1, 7, 256, 4096}, ns[] = {1, 16, 37, 129, 896};
    uint64_t seed = 1;
    for (size_t a = 0; a < ST_ARRAY_LEN(Ts); a++)
        for (size_t b = 0; b < ST_ARRAY_LEN(ns); b++) count_case(Ts[a], ns[b], TAU_MIXED, seed++);
    for (int kind = TAU_ALL_NAN; kind <= TAU_NONE_ABOVE; kind++) {
        count_case(256, 896, kind, seed++);
        count_case(1, 896, kind, seed++);
    }
    /* T = 0: counts zeroed */
    uint32_t *d_c = gt_dev(4 * 896), c[896];
    float *d_t = gt_dev(4 * 896);
    GT_OK(st_cuda_route_count(&gt_stream, d_c, NULL, NULL, d_t, NULL, 0, 896));
    gt_down(c, d_c, sizeof c);
    int nz = 0;
    for (int j = 0; j < 896; j++) nz += c[j] != 0;
    CHECK(nz == 0, "route_count T=0: counts zeroed (%d not)", nz);
    st_gpu_free(d_c), st_gpu_free(d_t);
    return st_test_done();
}
