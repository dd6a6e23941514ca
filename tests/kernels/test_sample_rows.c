/* st_sample_rows, the engine's sampling op (CPU twin of st_cuda_sample): greedy and its ties, the
 * distributions of temperature / top-k / top-p against the softmax written out, the top-k tie rule,
 * penalties from the counts and their update, logit_bias, logprobs, and the seeded draw as a pure
 * function of (seed, position): the same token whatever the row's place in the batch. */
#include "harness.h"
#include "strata/kernels.h"

static st_sample_row_t row(float t, int k, float p) {
    return (st_sample_row_t){.temperature = t, .top_k = k, .top_p = p, .n_top = -1, .count_row = -1};
}

/* empirical frequencies over positions 0..n-1 of one seed */
static void freqs(const float *lg, int V, st_sample_row_t r, int n, double *f) {
    float x[64];
    for (int i = 0; i < V; i++)
        f[i] = 0;
    for (int i = 0; i < n; i++) {
        memcpy(x, lg, sizeof(float) * (size_t)V);
        r.pos = (uint32_t)i;
        int id;
        st_sample_rows(&id, NULL, NULL, NULL, x, 1, V, &r, NULL, NULL, NULL);
        f[id] += 1.0 / n;
    }
}

static int one(const float *lg, int V, st_sample_row_t r) {
    float x[1024];
    memcpy(x, lg, sizeof(float) * (size_t)V);
    int id;
    st_sample_rows(&id, NULL, NULL, NULL, x, 1, V, &r, NULL, NULL, NULL);
    return id;
}

int main(void) {
    enum { V = 1000 };
    static float lg[V];
    st_rng_t g = {3};
    for (int i = 0; i < V; i++)
        lg[i] = (float)(4.0 * st_rng_uniform(&g));
    lg[417] = 9.0f;
    lg[733] = 9.0f; /* tie: the lower id wins */

    /* greedy: temperature 0, or top-k 1 at any temperature */
    CHECK(one(lg, V, row(0, 0, 1)) == 417, "greedy argmax with a tie");
    int ok = 1;
    for (uint32_t s = 0; s < 50; s++) {
        st_sample_row_t r = row(1.5f, 1, 0.9f);
        r.seed = s;
        ok &= one(lg, V, r) == 417;
    }
    CHECK(ok, "top-k 1 is greedy");

    /* distributions on 4 tokens, p = .1 .2 .3 .4 */
    float l4[4];
    const double p[4] = {0.1, 0.2, 0.3, 0.4};
    for (int i = 0; i < 4; i++)
        l4[i] = (float)log(p[i]);
    double f[4], e[4];
    const int n = 100000;
    freqs(l4, 4, row(1, 0, 1), n, f);
    for (int i = 0; i < 4; i++)
        CHECK(fabs(f[i] - p[i]) < 0.006, "temp 1: f[%d]=%.4f want %.2f", i, f[i], p[i]);
    freqs(l4, 4, row(0.5f, 0, 1), n, f); /* ∝ p² */
    for (int i = 0; i < 4; i++)
        e[i] = p[i] * p[i] / 0.3;
    for (int i = 0; i < 4; i++)
        CHECK(fabs(f[i] - e[i]) < 0.006, "temp .5: f[%d]=%.4f want %.4f", i, f[i], e[i]);
    freqs(l4, 4, row(2.0f, 0, 1), n, f); /* ∝ √p */
    double zs = 0;
    for (int i = 0; i < 4; i++)
        zs += sqrt(p[i]);
    for (int i = 0; i < 4; i++)
        CHECK(fabs(f[i] - sqrt(p[i]) / zs) < 0.006, "temp 2: f[%d]=%.4f", i, f[i]);
    freqs(l4, 4, row(1, 2, 1), n, f); /* {3,2} renormalised */
    CHECK(f[0] == 0 && f[1] == 0 && fabs(f[3] - 4.0 / 7) < 0.006 && fabs(f[2] - 3.0 / 7) < 0.006,
          "top-k 2: %.4f %.4f %.4f %.4f", f[0], f[1], f[2], f[3]);
    freqs(l4, 4, row(1, 0, 0.5f), n, f); /* .4 < .5 ≤ .7 → {3,2} */
    CHECK(f[0] == 0 && f[1] == 0 && fabs(f[3] - 4.0 / 7) < 0.006, "top-p .5: %.4f %.4f %.4f %.4f", f[0], f[1], f[2],
          f[3]);
    freqs(l4, 4, row(1, 0, 0.35f), n, f); /* .4 ≥ .35 → {3} */
    CHECK(f[3] == 1.0 || fabs(f[3] - 1.0) < 1e-9, "top-p .35 keeps only the top token: %.4f", f[3]);
    freqs(l4, 4, row(1, 0, 0.75f), n, f); /* .7 < .75 ≤ .9 → {3,2,1} */
    CHECK(f[0] == 0 && fabs(f[1] - 2.0 / 9) < 0.006 && fabs(f[3] - 4.0 / 9) < 0.006, "top-p .75: %.4f %.4f %.4f %.4f",
          f[0], f[1], f[2], f[3]);
    freqs(l4, 4, row(1, 3, 0.6f), n, f); /* top-3 {3,2,1} mass .9; .6·.9 = .54 → {3,2} */
    CHECK(f[0] == 0 && f[1] == 0 && fabs(f[3] - 4.0 / 7) < 0.006, "top-k 3 + top-p .6: %.4f %.4f", f[1], f[3]);
    freqs(l4, 4, row(0.5f, 0, 0.5f), n, f); /* at T .5 p' = .033 .133 .3 .533: .533 ≥ .5 → {3} */
    CHECK(f[3] > 0.999999, "top-p after temperature: %.4f", f[3]);
    /* top-k ties at the boundary: the lowest ids */
    float tie[6] = {0.5f, 1.0f, 1.0f, 2.0f, 1.0f, 1.0f};
    double ft[6];
    freqs(tie, 6, row(1, 3, 1), n, ft); /* {3} ∪ the two lowest ids of the four 1.0s: {1, 2} */
    CHECK(ft[0] == 0 && ft[4] == 0 && ft[5] == 0 && ft[1] > 0.1 && ft[2] > 0.1 && ft[3] > 0.4,
          "top-k tie rule: %.3f %.3f %.3f %.3f %.3f %.3f", ft[0], ft[1], ft[2], ft[3], ft[4], ft[5]);

    /* seeded draws: a pure function of (seed, position, logits) — any batch, any row order */
    {
        enum { R = 5 };
        static float x[R * V];
        st_sample_row_t rs[R];
        const st_sample_row_t cfg[R] = {row(1, 0, 1), row(0.7f, 50, 1), row(1.3f, 0, 0.9f), row(1, 20, 0.8f),
                                        row(0, 0, 1)};
        int same = 1, diff = 0, ids[R], ids2[R];
        for (uint32_t pos = 0; pos < 40; pos++) {
            for (int i = 0; i < R; i++) {
                rs[i] = cfg[i];
                rs[i].seed = 1000 + (uint64_t)i;
                rs[i].pos = pos;
                rs[i].row = i;
                memcpy(x + (size_t)i * V, lg, sizeof lg);
            }
            st_sample_rows(ids, NULL, NULL, NULL, x, R, V, rs, NULL, NULL, NULL);
            for (int i = 0; i < R; i++) { /* each alone, in reverse order */
                int j = R - 1 - i;
                st_sample_row_t o = rs[j];
                o.row = 0;
                same &= one(lg, V, o) == ids[j];
                o.seed++;
                diff += one(lg, V, o) != ids[j];
            }
            for (int i = 0; i < R; i++)
                memcpy(x + (size_t)i * V, lg, sizeof lg);
            st_sample_rows(ids2, NULL, NULL, NULL, x, R, V, rs, NULL, NULL, NULL);
            for (int i = 0; i < R; i++)
                same &= ids2[i] == ids[i];
            for (int i = 1; i < 4; i++) { /* top-k: among the k largest */
                int above = 0;
                for (int v = 0; v < V; v++)
                    above += lg[v] > lg[ids[i]];
                if (cfg[i].top_k) CHECK(above < cfg[i].top_k, "row %d: id %d has %d larger logits", i, ids[i], above);
            }
        }
        CHECK(same, "the same (seed, position) gives the same token in a batch, alone, again");
        CHECK(diff > 40, "another seed gives other tokens (%d of 160 differ)", diff);
    }

    /* penalties from the counts, the bias list, the counts' update, the processed row */
    {
        enum { W = 50 };
        float a[W], want[W];
        int counts[3 * W] = {0}, *cnt = counts + W; /* count row 1 */
        cnt[3] = 3, cnt[7] = 2, cnt[49] = 1;
        const uint32_t bias_ids[] = {99, 0, 7, 99, 0};
        const float bias_v[] = {7.0f, 6.0f, -100.0f, 1.0f, 0.5f};
        for (int i = 0; i < W; i++)
            a[i] = want[i] = (float)(i % 7) - 3.0f;
        const float pres = 0.5f, freq = 0.25f;
        for (int t = 0; t < W; t++)
            if (cnt[t]) want[t] -= freq * (float)cnt[t] + pres;
        want[0] += 6.0f; /* entries 1..4 of the list: bias_off 1 */
        want[7] -= 100.0f;
        want[0] += 0.5f;
        st_sample_row_t r = row(0, 0, 1);
        r.presence = pres, r.frequency = freq, r.count_row = 1, r.bias_off = 1, r.n_bias = 4;
        int id;
        st_sample_rows(&id, NULL, NULL, NULL, a, 1, W, &r, bias_ids, bias_v, counts);
        int same = 1;
        for (int t = 0; t < W; t++)
            same &= a[t] == want[t];
        CHECK(same, "penalties + bias: token 3 %.3f (want %.3f), 7 %.3f (want %.3f)", a[3], want[3], a[7], want[7]);
        CHECK(id == 0, "the bias +6.5 makes token 0 the argmax (got %d)", id);
        CHECK(cnt[0] == 1 && cnt[3] == 3 && counts[0] == 0 && counts[2 * W] == 0,
              "the chosen token counted in its row only");
        /* no penalties: the counts are not read, the row stays as it was */
        for (int i = 0; i < W; i++)
            a[i] = want[i] = (float)(i % 7) - 3.0f;
        r.presence = r.frequency = 0, r.n_bias = 0;
        st_sample_rows(&id, NULL, NULL, NULL, a, 1, W, &r, bias_ids, bias_v, counts);
        same = 1;
        for (int t = 0; t < W; t++)
            same &= a[t] == want[t];
        CHECK(same && id == 6 && cnt[6] == 1, "without penalties the logits are untouched; the count still kept");
        /* sampled: two +100 tokens share everything */
        float l2[8] = {0, 3, 1, 2, 0.5f, 0.5f, 2, 3};
        const uint32_t two[] = {4, 5};
        const float hund[] = {100, 100};
        int seen[8] = {0};
        for (uint32_t pos = 0; pos < 200; pos++) {
            float y[8];
            memcpy(y, l2, sizeof y);
            st_sample_row_t s = row(1, 0, 1);
            s.n_bias = 2, s.pos = pos, s.seed = 9;
            st_sample_rows(&id, NULL, NULL, NULL, y, 1, 8, &s, two, hund, NULL);
            seen[id]++;
        }
        CHECK(seen[4] + seen[5] == 200 && seen[4] > 50 && seen[5] > 50, "sampled between two +100 tokens: %d %d",
              seen[4], seen[5]);
    }

    /* logprobs: the chosen token's and the top n under softmax of the processed row */
    {
        float y[6] = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f, 0.0f};
        double z = 0;
        for (int i = 0; i < 6; i++)
            z += exp((double)y[i] - 3.0);
        st_sample_row_t r = row(0, 0, 1);
        r.n_top = 4;
        int id, tids[ST_SAMPLE_MAX_TOP];
        float lp, tlp[ST_SAMPLE_MAX_TOP];
        st_sample_rows(&id, &lp, tids, tlp, y, 1, 6, &r, NULL, NULL, NULL);
        CHECK(id == 1 && fabs(lp - (0.0 - log(z))) < 1e-6, "greedy logprob %g", lp);
        CHECK(tids[0] == 1 && tids[1] == 3 && tids[2] == 2 && tids[3] == 0,
              "top 4 in order, ties → lower id: %d %d %d %d", tids[0], tids[1], tids[2], tids[3]);
        CHECK(fabs(tlp[2] - (-1.0 - log(z))) < 1e-6 && tlp[0] == tlp[1] && tlp[3] < tlp[2], "top logprobs");
        r.n_top = 0;
        r.temperature = 1, r.seed = 4;
        lp = 1;
        st_sample_rows(&id, &lp, tids, tlp, y, 1, 6, &r, NULL, NULL, NULL);
        CHECK(fabs(lp - ((double)y[id] - 3.0 - log(z))) < 1e-6, "a sampled token's logprob (id %d: %g)", id, lp);
        r.n_top = 20; /* more than V: V entries */
        tids[6] = -7;
        st_sample_rows(&id, &lp, tids, tlp, y, 1, 6, &r, NULL, NULL, NULL);
        double mass = 0;
        for (int i = 0; i < 6; i++)
            mass += exp(tlp[i]);
        CHECK(tids[5] == 4 && tids[6] == -7 && fabs(mass - 1) < 1e-5, "n_top > V: all V, mass %g", mass);
    }
    return st_test_done();
}
