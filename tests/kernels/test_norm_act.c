/* rmsnorm, per-head l2norm, sigmoid/SiLU and the GLU activations (SiTU, SiLU) vs fp64. */
#include "harness.h"
#include "strata/kernels.h"

static float urand(st_rng_t *r, float a) { return (float)(a * (2.0 * st_rng_uniform(r) - 1.0)); }
static double sig64(double x) { return 1.0 / (1.0 + exp(-x)); }

int main(void) {
    st_rng_t r = {7};
    enum { T = 5, n = 67, H = 3, dh = 19 };
    float x[T * n], w[n], y[T * n], y64[T * n], ya[T * n];
    for (int i = 0; i < T * n; i++) x[i] = urand(&r, 3.0f);
    for (int i = 0; i < n; i++) w[i] = urand(&r, 2.0f);
    for (int pass = 0; pass < 2; pass++) {
        const float *wp = pass ? w : NULL;
        st_rmsnorm(y, x, wp, T, n, 1e-5f);
        for (int t = 0; t < T; t++) {
            double ss = 0;
            for (int c = 0; c < n; c++) ss += (double)x[t * n + c] * x[t * n + c];
            double inv = 1.0 / sqrt(ss / n + 1e-5);
            for (int c = 0; c < n; c++) y64[t * n + c] = (float)(x[t * n + c] * inv * (wp ? wp[c] : 1.0));
        }
        st_t_close(pass ? "rmsnorm weighted" : "rmsnorm no weight", y, y64, T * n, 1e-6, 1e-6);
    }
    memcpy(ya, x, sizeof x);
    st_rmsnorm(ya, ya, w, T, n, 1e-5f); /* aliased */
    st_rmsnorm(y, x, w, T, n, 1e-5f);
    CHECK(memcmp(ya, y, sizeof y) == 0, "rmsnorm in place differs from out of place");

    /* l2norm per head */
    float u[T * H * dh], u64[T * H * dh];
    for (int i = 0; i < T * H * dh; i++) u[i] = urand(&r, 2.0f);
    for (int i = 0; i < T * H; i++) {
        double ss = 0;
        for (int c = 0; c < dh; c++) ss += (double)u[i * dh + c] * u[i * dh + c];
        for (int c = 0; c < dh; c++) u64[i * dh + c] = (float)(u[i * dh + c] / sqrt(ss + 1e-6));
    }
    st_l2norm_heads(u, T, H, dh, 1e-6f);
    st_t_close("l2norm_heads", u, u64, T * H * dh, 1e-6, 1e-7);

    /* sigmoid / silu incl. extremes */
    float xs[] = {-200.f, -90.f, -20.f, -1.f, 0.f, 0.5f, 20.f, 90.f, 200.f};
    float s32[9], s64[9], l32[9], l64[9];
    for (int i = 0; i < 9; i++) {
        s32[i] = st_sigmoid(xs[i]);
        s64[i] = (float)sig64(xs[i]);
        l32[i] = st_silu(xs[i]);
        l64[i] = (float)(xs[i] * sig64(xs[i]));
    }
    st_t_close("sigmoid", s32, s64, 9, 1e-6, 1e-7);
    st_t_close("silu", l32, l64, 9, 1e-6, 1e-6);

    /* GLU over rows of one [T, 2n] buffer (gate | up) */
    float gu[T * 2 * n], h[T * n], h64[T * n];
    for (int i = 0; i < T * 2 * n; i++) gu[i] = urand(&r, 40.0f); /* past both tanh knees */
    for (int act = 0; act < 2; act++) {
        double b1 = 4, b2 = 25;
        st_glu(h, gu, gu + n, T, n, 2 * n, act ? ST_ACT_SILU : ST_ACT_SITU, (float)b1, (float)b2);
        for (int t = 0; t < T; t++)
            for (int c = 0; c < n; c++) {
                double a = gu[t * 2 * n + c], up = gu[t * 2 * n + n + c];
                h64[t * n + c] = act ? (float)(a * sig64(a) * up)
                                     : (float)((b1 * tanh(a / b1) * sig64(a)) * (b2 * tanh(up / b2)));
            }
        st_t_close(act ? "glu silu" : "glu situ", h, h64, T * n, 1e-6, 1e-5);
    }
    return st_test_done();
}
