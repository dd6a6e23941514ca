/* Sampling: greedy (ties → lower id), top-k=1 and tiny top-p equal greedy, reproducible with a
 * seed, and the empirical distribution matches temperature / top-k / top-p. */
#include "harness.h"
#include "strata/kernels.h"

static void freqs(const float *lg, int V, st_sampling_t sp, int n, double *f, float *ws) {
    st_rng_t r = {123};
    for (int i = 0; i < V; i++) f[i] = 0;
    for (int i = 0; i < n; i++) f[st_sample(lg, V, &sp, &r, ws)] += 1.0 / n;
}

int main(void) {
    enum { V = 1000 };
    float lg[V], ws[2 * V];
    st_rng_t r = {3};
    for (int i = 0; i < V; i++) lg[i] = (float)(4.0 * st_rng_uniform(&r));
    lg[417] = 9.0f;
    lg[733] = 9.0f; /* tie: the lower id wins */
    st_sampling_t greedy = {0.0f, 0, 1.0f};
    st_rng_t g = {77}, g0 = g;
    CHECK(st_sample(lg, V, &greedy, &g, ws) == 417, "greedy argmax with tie");
    CHECK(g.s == g0.s, "greedy must not advance the rng");

    st_sampling_t k1 = {1.0f, 1, 1.0f}, p0 = {1.0f, 0, 1e-6f};
    int ok_k1 = 1, ok_p0 = 1;
    for (int i = 0; i < 50; i++) {
        ok_k1 &= st_sample(lg, V, &k1, &g, ws) == 417;
        ok_p0 &= st_sample(lg, V, &p0, &g, ws) == 417;
    }
    CHECK(ok_k1, "top-k 1 must equal greedy");
    CHECK(ok_p0, "tiny top-p must equal greedy");

    /* same seed → same sequence; different seed → different */
    st_sampling_t cfgs[] = {{1.0f, 0, 1.0f}, {0.7f, 50, 1.0f}, {1.3f, 0, 0.9f}, {1.0f, 20, 0.8f}};
    for (size_t c = 0; c < ST_ARRAY_LEN(cfgs); c++) {
        st_rng_t a = {555}, b = {555}, d = {556};
        int same = 1, diff = 0;
        for (int i = 0; i < 200; i++) {
            int x = st_sample(lg, V, &cfgs[c], &a, ws), y = st_sample(lg, V, &cfgs[c], &b, ws);
            int z = st_sample(lg, V, &cfgs[c], &d, ws);
            same &= x == y;
            diff += x != z;
            if (cfgs[c].top_k) { /* the sample must be among the top_k logits */
                int above = 0;
                for (int j = 0; j < V; j++) above += lg[j] > lg[x];
                CHECK(above < cfgs[c].top_k, "config %zu: id %d has %d larger logits", c, x, above);
            }
        }
        CHECK(same, "config %zu: same seed gave different sequences", c);
        CHECK(diff > 0, "config %zu: different seeds gave identical sequences", c);
    }

    /* distribution sanity on 4 tokens with p = .1 .2 .3 .4 */
    float l4[4];
    const double p[4] = {0.1, 0.2, 0.3, 0.4};
    for (int i = 0; i < 4; i++) l4[i] = (float)log(p[i]);
    double f[4], e[4];
    const int n = 40000;
    freqs(l4, 4, (st_sampling_t){1.0f, 0, 1.0f}, n, f, ws);
    for (int i = 0; i < 4; i++) CHECK(fabs(f[i] - p[i]) < 0.01, "temp 1: f[%d]=%.4f want %.2f", i, f[i], p[i]);
    freqs(l4, 4, (st_sampling_t){0.5f, 0, 1.0f}, n, f, ws); /* ∝ p² */
    for (int i = 0; i < 4; i++) e[i] = p[i] * p[i] / 0.3;
    for (int i = 0; i < 4; i++) CHECK(fabs(f[i] - e[i]) < 0.01, "temp .5: f[%d]=%.4f want %.4f", i, f[i], e[i]);
    freqs(l4, 4, (st_sampling_t){1.0f, 2, 1.0f}, n, f, ws); /* {3,2} renormalised */
    CHECK(f[0] == 0 && f[1] == 0 && fabs(f[3] - 4.0 / 7) < 0.01 && fabs(f[2] - 3.0 / 7) < 0.01,
          "top-k 2: %.4f %.4f %.4f %.4f", f[0], f[1], f[2], f[3]);
    freqs(l4, 4, (st_sampling_t){1.0f, 0, 0.5f}, n, f, ws); /* .4 < .5 ≤ .7 → {3,2} */
    CHECK(f[0] == 0 && f[1] == 0 && fabs(f[3] - 4.0 / 7) < 0.01, "top-p .5: %.4f %.4f %.4f %.4f", f[0], f[1], f[2], f[3]);
    freqs(l4, 4, (st_sampling_t){1.0f, 0, 0.35f}, n, f, ws); /* .4 ≥ .35 → {3} */
    CHECK(f[0] == 0 && f[1] == 0 && f[2] == 0 && f[3] > 0.999, "top-p .35 keeps only the top token: %.4f", f[3]);
    freqs(l4, 4, (st_sampling_t){1.0f, 3, 0.6f}, n, f, ws); /* top-3 {3,2,1} mass .9; .6·.9=.54 → {3,2} */
    CHECK(f[0] == 0 && f[1] == 0 && fabs(f[3] - 4.0 / 7) < 0.01, "top-k 3 + top-p .6: %.4f %.4f", f[1], f[3]);

    return st_test_done();
}
