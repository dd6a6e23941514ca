/* KDA: chunked vs recurrent (both gates, nonzero incoming state, pieces carried across calls),
 * recurrent vs an fp64 recurrence, gate vs fp64, conv pieces vs one pass and vs fp64, out-gate. */
#include "harness.h"
#include "strata/kernels.h"

static float urand(st_rng_t *r, float a) { return (float)(a * (2.0 * st_rng_uniform(r) - 1.0)); }
static double sig64(double x) { return 1.0 / (1.0 + exp(-x)); }
static double softplus64(double x) { return x > 0 ? x + log1p(exp(-x)) : log1p(exp(x)); }

/* fp64 recurrence (SPEC §3.2) from the same fp32 inputs */
static void kda_rec64(double *o, const float *q, const float *k, const float *v, const float *g,
                      const float *beta, double *S, int T, int H, int dk, int dv, double scale) {
    double *e = malloc(sizeof(double) * dv);
    for (int h = 0; h < H; h++) {
        double *Sh = S + (size_t)h * dk * dv;
        for (int t = 0; t < T; t++) {
            size_t row = (size_t)t * H + h;
            for (int c = 0; c < dk; c++)
                for (int j = 0; j < dv; j++) Sh[c * dv + j] *= exp((double)g[row * dk + c]);
            for (int j = 0; j < dv; j++) {
                double sk = 0;
                for (int c = 0; c < dk; c++) sk += Sh[c * dv + j] * k[row * dk + c];
                e[j] = beta[row] * (v[row * dv + j] - sk);
            }
            for (int c = 0; c < dk; c++)
                for (int j = 0; j < dv; j++) Sh[c * dv + j] += k[row * dk + c] * e[j];
            for (int j = 0; j < dv; j++) {
                double acc = 0;
                for (int c = 0; c < dk; c++) acc += Sh[c * dv + j] * scale * q[row * dk + c];
                o[row * dv + j] = acc;
            }
        }
    }
    free(e);
}

static float *to_f32(const double *a, size_t n) {
    float *f = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) f[i] = (float)a[i];
    return f;
}

/* gate for H heads from random f; bounded with lb, or unbounded softplus. Also checks vs fp64. */
static void make_gate(float *g, int T, int H, int dk, bool bounded, st_rng_t *r) {
    size_t n = (size_t)T * H * dk;
    float *f = malloc(n * sizeof(float)), *A = malloc(H * sizeof(float)), *dt = malloc(H * dk * sizeof(float));
    float *g64 = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) f[i] = urand(r, 6.0f) + 2.0f; /* many gates near the bound */
    for (int h = 0; h < H; h++) A[h] = urand(r, 1.5f) + (bounded ? 0.0f : 1.0f); /* unbounded: down to ~-30/token */
    for (int i = 0; i < H * dk; i++) dt[i] = urand(r, 1.0f);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++)
            for (int c = 0; c < dk; c++) {
                size_t i = ((size_t)t * H + h) * dk + c;
                double z = (double)f[i] + dt[h * dk + c], a = exp((double)A[h]);
                g64[i] = (float)(bounded ? -5.0 * sig64(a * z) : -a * softplus64(z));
            }
    st_kda_gate(g, f, A, dt, T, H, dk, bounded, -5.0f);
    char what[64];
    snprintf(what, sizeof what, "gate %s T=%d H=%d dk=%d", bounded ? "bounded" : "unbounded", T, H, dk);
    st_t_close(what, g, g64, n, 1e-6, 1e-6);
    if (bounded) {
        float mn = 0;
        for (size_t i = 0; i < n; i++) mn = fminf(mn, g[i]);
        CHECK(mn >= -5.0f, "bounded gate below the bound: %g", mn);
    }
    free(f), free(A), free(dt), free(g64);
}

static void run_case(int H, int dk, int dv, int T, bool bounded, st_rng_t *r) {
    size_t nq = (size_t)T * H * dk, nv = (size_t)T * H * dv, nS = (size_t)H * dk * dv;
    float *q = malloc(nq * 4), *k = malloc(nq * 4), *g = malloc(nq * 4), *v = malloc(nv * 4);
    float *beta = malloc((size_t)T * H * 4), *S0 = malloc(nS * 4), *Sr = malloc(nS * 4), *Sc = malloc(nS * 4);
    float *Sp = malloc(nS * 4), *orec = malloc(nv * 4), *och = malloc(nv * 4), *opc = malloc(nv * 4);
    double *o64 = malloc(nv * 8), *S64 = malloc(nS * 8);
    for (size_t i = 0; i < nq; i++) q[i] = urand(r, 1.0f), k[i] = urand(r, 1.0f);
    st_l2norm_heads(q, T, H, dk, 1e-6f);
    st_l2norm_heads(k, T, H, dk, 1e-6f);
    for (size_t i = 0; i < nv; i++) v[i] = urand(r, 1.0f);
    for (int i = 0; i < T * H; i++) beta[i] = (float)st_rng_uniform(r);
    for (size_t i = 0; i < nS; i++) S0[i] = urand(r, 0.5f);
    make_gate(g, T, H, dk, bounded, r);
    float scale = 1.0f / sqrtf((float)dk);

    size_t wsn = st_kda_chunked_ws_floats(H, dk, dv);
    float *ws = malloc(wsn * 4);
    for (size_t i = 0; i < wsn; i++) ws[i] = NAN;

    memcpy(Sr, S0, nS * 4);
    st_kda_recurrent(orec, q, k, v, g, beta, Sr, T, H, dk, dv, scale);
    memcpy(Sc, S0, nS * 4);
    st_kda_chunked(och, q, k, v, g, beta, Sc, T, H, dk, dv, scale, bounded, ws);
    /* pieces of different lengths, state carried across calls */
    static const int pieces[] = {7, 16, 1, 20, 3, 33};
    memcpy(Sp, S0, nS * 4);
    for (int t0 = 0, pi = 0; t0 < T; pi++) {
        int n = ST_MIN(pieces[pi % 6], T - t0);
        st_kda_chunked(opc + (size_t)t0 * H * dv, q + (size_t)t0 * H * dk, k + (size_t)t0 * H * dk,
                       v + (size_t)t0 * H * dv, g + (size_t)t0 * H * dk, beta + (size_t)t0 * H, Sp, n, H,
                       dk, dv, scale, bounded, ws);
        t0 += n;
    }
    for (size_t i = 0; i < nS; i++) S64[i] = S0[i];
    kda_rec64(o64, q, k, v, g, beta, S64, T, H, dk, dv, scale);
    float *o64f = to_f32(o64, nv), *S64f = to_f32(S64, nS);

    char what[128];
    const char *gn = bounded ? "bounded" : "unbounded";
#define CASE(s) (snprintf(what, sizeof what, "%s %s H=%d d=%d T=%d", s, gn, H, dk, T), what)
    st_t_close(CASE("chunked vs recurrent o"), och, orec, nv, 1e-5, 0);
    st_t_close(CASE("chunked vs recurrent S"), Sc, Sr, nS, 1e-5, 0);
    st_t_close(CASE("pieces vs recurrent o"), opc, orec, nv, 1e-5, 0);
    st_t_close(CASE("pieces vs recurrent S"), Sp, Sr, nS, 1e-5, 0);
    st_t_close(CASE("recurrent vs fp64 o"), orec, o64f, nv, 1e-5, 0);
    st_t_close(CASE("recurrent vs fp64 S"), Sr, S64f, nS, 1e-5, 0);
    st_t_close(CASE("chunked vs fp64 o"), och, o64f, nv, 1e-5, 0);
#undef CASE
    free(q), free(k), free(g), free(v), free(beta), free(S0), free(Sr), free(Sc), free(Sp);
    free(orec), free(och), free(opc), free(o64), free(S64), free(o64f), free(S64f), free(ws);
}

static void test_conv(st_rng_t *r) {
    enum { T = 23, C = 11, K = 4 };
    float x[T * C], w[C * K], st0[(K - 1) * C], st1[(K - 1) * C], st2[(K - 1) * C];
    float y1[T * C], y2[T * C], y64[T * C];
    for (int i = 0; i < T * C; i++) x[i] = urand(r, 2.0f);
    for (int i = 0; i < C * K; i++) w[i] = urand(r, 1.0f);
    for (int i = 0; i < (K - 1) * C; i++) st0[i] = urand(r, 2.0f);
    memcpy(st1, st0, sizeof st0);
    memcpy(st2, st0, sizeof st0);
    /* fp64: window = st0 ++ x */
    for (int t = 0; t < T; t++)
        for (int c = 0; c < C; c++) {
            double acc = 0;
            for (int j = 0; j < K; j++) {
                int s = t - (K - 1) + j;
                acc += (double)w[c * K + j] * (s >= 0 ? x[s * C + c] : st0[(K - 1 + s) * C + c]);
            }
            y64[t * C + c] = (float)(acc * sig64(acc));
        }
    st_conv_silu(y1, x, st1, w, T, C, K);
    static const int pieces[] = {1, 2, 5, 1, 14}; /* includes pieces shorter than K-1 */
    for (int t0 = 0, pi = 0; t0 < T; pi++) {
        st_conv_silu(y2 + t0 * C, x + t0 * C, st2, w, pieces[pi], C, K);
        t0 += pieces[pi];
    }
    st_t_close("conv one pass vs fp64", y1, y64, T * C, 1e-6, 1e-6);
    CHECK(memcmp(y1, y2, sizeof y1) == 0, "conv in pieces differs from one pass");
    CHECK(memcmp(st1, st2, sizeof st1) == 0, "conv state after pieces differs");
    CHECK(memcmp(st1, x + (T - (K - 1)) * C, sizeof st1) == 0, "conv state is not the last K-1 inputs");
}

static void test_out_gate(st_rng_t *r) {
    enum { T = 3, H = 2, dv = 24 };
    float o[T * H * dv], gate[T * H * dv], w[dv], ref[T * H * dv];
    for (int i = 0; i < T * H * dv; i++) o[i] = urand(r, 2.0f), gate[i] = urand(r, 4.0f);
    for (int i = 0; i < dv; i++) w[i] = urand(r, 1.5f);
    for (int i = 0; i < T * H; i++) {
        double ss = 0;
        for (int j = 0; j < dv; j++) ss += (double)o[i * dv + j] * o[i * dv + j];
        double inv = 1.0 / sqrt(ss / dv + 1e-5);
        for (int j = 0; j < dv; j++)
            ref[i * dv + j] = (float)(o[i * dv + j] * inv * w[j] * sig64(gate[i * dv + j]));
    }
    st_kda_out_gate(o, gate, w, T, H, dv, 1e-5f);
    st_t_close("kda out gate vs fp64", o, ref, T * H * dv, 1e-6, 1e-6);
}

int main(void) {
    st_rng_t r = {2024};
    const int ds[] = {16, 32, 64}, Ts[] = {1, 5, 16, 17, 40, 100};
    int H = 2;
    for (int bounded = 1; bounded >= 0; bounded--)
        for (int di = 0; di < 3; di++)
            for (int ti = 0; ti < 6; ti++) {
                run_case(H, ds[di], ds[di], Ts[ti], bounded, &r);
                H = H == 4 ? 2 : H + 1;
            }
    run_case(3, 32, 16, 37, true, &r); /* dk != dv also works */
    run_case(3, 16, 32, 37, false, &r);
    test_conv(&r);
    test_out_gate(&r);
    return st_test_done();
}
