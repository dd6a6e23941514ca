/* The quantile router's threshold counts, made in the router's own pass (st_cuda_router_quantile_count),
 * against the C twin (st_route_count over the σ scores the kernel wrote, itself tested against
 * st_qsum_count_layer in tests/quantile/test_qengine): counts exactly equal, and the routing (σ, ids,
 * weights, set sizes) bit for bit that of st_cuda_router_quantile without counts, with ids and set
 * sizes equal to st_route_quantile's. Over T 1, 7, 256, 4096 (blocks counting several tokens) and
 * 20000 (many per block), n up to 896 (odd n), 2000 and 8192 (histograms past the 48 KB default,
 * more than RQ_CAP active); ties exactly at τ (τ taken from the kernel's own σ), NaN/±inf logits,
 * NaN τ columns and whole NaN-τ rows, all-above and none-above τ, ρ below and above τ and NaN ρ;
 * with and without the band (then qc[n..2n) untouched); output buffers poisoned first; T = 0 zeroes
 * the counts; no count buffer is refused. */
#include <math.h>
#include <string.h>

#include "gpu_test.h"
#include "strata/kernels.h"

enum { TAU_MIXED, TAU_ALL_NAN, TAU_ALL_ABOVE, TAU_NONE_ABOVE };

/* the plain router on the logits lg (uploaded fresh): σ, ids, w, cnt back to the host */
static void route_plain(float *sg, int *id, float *w, int *c, const float *lg, const float *d_tau, int T, int n,
                        int kmax) {
    size_t N = (size_t)T * n, K = (size_t)T * kmax;
    float *d_s = gt_up(lg, 4 * N), *d_w = gt_dev(4 * K);
    int *d_id = gt_dev(4 * K), *d_c = gt_dev(4 * (size_t)T);
    GT_OK(st_cuda_router_quantile(&gt_stream, d_id, d_w, d_c, d_s, d_tau, T, n, kmax, true, 2.5f));
    gt_down(sg, d_s, 4 * N), gt_down(id, d_id, 4 * K), gt_down(w, d_w, 4 * K), gt_down(c, d_c, 4 * (size_t)T);
    st_gpu_free(d_s), st_gpu_free(d_w), st_gpu_free(d_id), st_gpu_free(d_c);
}

static void count_case(int T, int n, int kmax, int tau_kind, uint64_t seed) {
    st_rng_t r = {seed};
    size_t N = (size_t)T * n, K = (size_t)T * kmax;
    float *lg = gt_xmalloc(4 * N), *sp = gt_xmalloc(4 * N), *sc = gt_xmalloc(4 * N);
    float *tau = gt_xmalloc(4 * (size_t)n), *rho = gt_xmalloc(4 * (size_t)n);
    float *wp = gt_xmalloc(4 * K), *wc = gt_xmalloc(4 * K), *wr = gt_xmalloc(4 * K);
    int *idp = gt_xmalloc(4 * K), *idc = gt_xmalloc(4 * K), *idr = gt_xmalloc(4 * K);
    int *cp = gt_xmalloc(4 * (size_t)T), *cc = gt_xmalloc(4 * (size_t)T), *cr = gt_xmalloc(4 * (size_t)T);
    uint32_t *q_ref = gt_xmalloc(8 * (size_t)n), *q_got = gt_xmalloc(8 * (size_t)n);
    for (size_t i = 0; i < N; i++) {
        uint64_t v = st_rng_next(&r) % 256;
        lg[i] = v == 0 ? NAN : v == 1 ? INFINITY : v == 2 ? -INFINITY : ((float)(v % 32) - 16.0f) / 4.0f; /* ties */
    }
    /* the kernel's own σ first (τ does not change it), so that τ can sit exactly on score values */
    for (int j = 0; j < n; j++) tau[j] = 0.5f;
    float *d_tau = gt_up(tau, 4 * (size_t)n);
    route_plain(sp, idp, wp, cp, lg, d_tau, T, n, kmax);
    for (int j = 0; j < n; j++) {
        tau[j] = tau_kind == TAU_ALL_NAN ? NAN : tau_kind == TAU_ALL_ABOVE ? -2.0f : tau_kind == TAU_NONE_ABOVE ? 2.0f
               : j % 11 == 4 ? NAN : sp[(size_t)(st_rng_next(&r) % (uint64_t)T) * n + j]; /* ties; some NaN */
        rho[j] = j % 13 == 6 ? NAN : tau[j] + (j % 2 ? 0.0625f : -0.09375f);
    }
    GT_OK(st_gpu_memcpy_h2d(d_tau, tau, 4 * (size_t)n));
    route_plain(sp, idp, wp, cp, lg, d_tau, T, n, kmax);
    float *d_rho = gt_up(rho, 4 * (size_t)n), *d_s = gt_dev(4 * N), *d_w = gt_dev(4 * K);
    int *d_id = gt_dev(4 * K), *d_c = gt_dev(4 * (size_t)T);
    uint32_t *d_q = gt_dev(8 * (size_t)n);
    for (int band = 1; band >= 0; band--) {
        GT_OK(st_gpu_memcpy_h2d(d_s, lg, 4 * N));
        gt_poison(d_q, 8 * (size_t)n), gt_poison(d_id, 4 * K), gt_poison(d_w, 4 * K), gt_poison(d_c, 4 * (size_t)T);
        GT_OK(st_cuda_router_quantile_count(&gt_stream, d_id, d_w, d_c, d_s, d_tau, T, n, kmax, true, 2.5f, d_q,
                                            band ? d_rho : NULL));
        gt_down(sc, d_s, 4 * N), gt_down(idc, d_id, 4 * K), gt_down(wc, d_w, 4 * K), gt_down(cc, d_c, 4 * (size_t)T);
        gt_down(q_got, d_q, 8 * (size_t)n);
        /* the routing: bit for bit the plain router's */
        int bad_route = memcmp(sc, sp, 4 * N) != 0 || memcmp(idc, idp, 4 * K) != 0 || memcmp(wc, wp, 4 * K) != 0 ||
                        memcmp(cc, cp, 4 * (size_t)T) != 0;
        CHECK(!bad_route, "router_quantile_count T=%d n=%d kmax=%d tau=%d band=%d: routing differs from the plain router",
              T, n, kmax, tau_kind, band);
        /* the counts: the C twin's over the kernel's σ */
        memset(q_ref, 0xff, 8 * (size_t)n);
        st_route_count(q_ref, band ? q_ref + n : NULL, sc, tau, band ? rho : NULL, T, n);
        int bad = 0, inner = 0;
        for (int j = 0; j < (band ? 2 : 1) * n; j++) bad += q_got[j] != q_ref[j];
        for (int j = 0; j < n; j++) inner += q_ref[j] > 0 && q_ref[j] < (uint32_t)T;
        CHECK(bad == 0, "router_quantile_count T=%d n=%d kmax=%d tau=%d band=%d: %d counts differ", T, n, kmax,
              tau_kind, band, bad);
        if (tau_kind == TAU_MIXED && band && n >= 16 && T > 1 && (T >= 256 || n >= 129)) /* many std. dev. of margin */
            CHECK(inner >= n / 2, "router_quantile_count T=%d n=%d: counts strictly inside (0, T) exercised (%d)", T, n,
                  inner);
        if (!band) {
            int touched = 0;
            for (int j = n; j < 2 * n; j++) touched += q_got[j] != 0xffffffffu;
            CHECK(touched == 0, "router_quantile_count T=%d n=%d: band bins untouched without rho (%d written)", T, n,
                  touched);
        }
    }
    /* the sets: st_route_quantile's over the same σ */
    st_route_quantile(idr, wr, cr, sc, tau, T, n, kmax, true, 2.5f);
    CHECK(memcmp(idc, idr, 4 * K) == 0 && memcmp(cc, cr, 4 * (size_t)T) == 0,
          "router_quantile_count T=%d n=%d kmax=%d tau=%d: ids / set sizes = st_route_quantile's", T, n, kmax, tau_kind);
    st_gpu_free(d_tau), st_gpu_free(d_rho), st_gpu_free(d_s), st_gpu_free(d_w), st_gpu_free(d_id), st_gpu_free(d_c);
    st_gpu_free(d_q);
    free(lg), free(sp), free(sc), free(tau), free(rho), free(wp), free(wc), free(wr), free(idp), free(idc), free(idr);
    free(cp), free(cc), free(cr), free(q_ref), free(q_got);
}

int main(void) {
    gt_init_or_skip("test_gpu_route_count");
    const int Ts[] = {1, 7, 256, 4096}, ns[] = {1, 16, 37, 129, 896};
    uint64_t seed = 1;
    for (size_t a = 0; a < ST_ARRAY_LEN(Ts); a++)
        for (size_t b = 0; b < ST_ARRAY_LEN(ns); b++) count_case(Ts[a], ns[b], 16, TAU_MIXED, seed++);
    for (int kind = TAU_ALL_NAN; kind <= TAU_NONE_ABOVE; kind++) {
        count_case(256, 896, 16, kind, seed++);
        count_case(1, 896, 16, kind, seed++);
    }
    count_case(20000, 37, 8, TAU_MIXED, seed++);      /* many tokens per block */
    count_case(64, 2000, 64, TAU_ALL_ABOVE, seed++);  /* > RQ_CAP active; 16 KB of bins */
    count_case(64, 2000, 64, TAU_MIXED, seed++);
    count_case(7, 8192, 16, TAU_MIXED, seed++);       /* the largest n: 64 KB of bins */
    /* T = 0: the counts zeroed, nothing else written */
    uint32_t *d_q = gt_dev(8 * 896), q[2 * 896];
    float *d_t = gt_dev(4 * 896);
    int *d_id = gt_dev(4 * 16);
    GT_OK(st_cuda_router_quantile_count(&gt_stream, d_id, NULL, NULL, NULL, d_t, 0, 896, 16, true, 1.f, d_q, d_t));
    gt_down(q, d_q, sizeof q);
    int nz = 0, id0;
    for (int j = 0; j < 2 * 896; j++) nz += q[j] != 0;
    gt_down(&id0, d_id, sizeof id0);
    CHECK(nz == 0 && id0 == -1, "router_quantile_count T=0: counts zeroed (%d not), ids untouched", nz);
    /* no count buffer */
    CHECK(st_cuda_router_quantile_count(&gt_stream, d_id, NULL, NULL, NULL, d_t, 1, 896, 16, true, 1.f, NULL, NULL) ==
              ST_ERR_INVALID_ARG,
          "router_quantile_count: no count buffer refused");
    st_gpu_free(d_q), st_gpu_free(d_t), st_gpu_free(d_id);
    return st_test_done();
}
