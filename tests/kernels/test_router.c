/* Routing: top-k (ties, bias, renorm on/off) and quantile (thresholds, k_max truncation, empty
 * sets), against hand cases and a sort-based oracle; sets compared exactly. */
#include "harness.h"
#include "strata/kernels.h"

typedef struct { float key; int id; } kv_t;
static int kv_cmp(const void *a, const void *b) {
    const kv_t *x = a, *y = b;
    if (x->key != y->key) return x->key > y->key ? -1 : 1;
    return x->id - y->id;
}
static int int_cmp(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

/* oracle: sort (key desc, id asc), take the first cap eligible, ids ascending; returns count */
static int oracle(int *ids, const float *s, const float *bias, const float *tau, int n, int cap) {
    kv_t *v = malloc(sizeof(kv_t) * n);
    int m = 0;
    for (int j = 0; j < n; j++) {
        if (tau && !(s[j] >= tau[j])) continue;
        v[m].key = tau ? s[j] - tau[j] : s[j] + (bias ? bias[j] : 0.0f);
        v[m++].id = j;
    }
    qsort(v, m, sizeof(kv_t), kv_cmp);
    int c = ST_MIN(m, cap);
    for (int i = 0; i < c; i++) ids[i] = v[i].id;
    qsort(ids, c, sizeof(int), int_cmp);
    free(v);
    return c;
}

int main(void) {
    /* sigmoid */
    float lg[3] = {0.0f, 100.0f, -100.0f};
    st_router_sigmoid(lg, 1, 3);
    CHECK(lg[0] == 0.5f && lg[1] == 1.0f && lg[2] >= 0.0f && lg[2] < 1e-40f, "sigmoid %g %g %g", lg[0], lg[1], lg[2]);

    /* ties → lower id; ascending ids */
    {
        float s[6] = {0.5f, 0.7f, 0.5f, 0.7f, 0.5f, 0.1f};
        int ids[3];
        float w[3];
        st_route_topk(ids, w, s, NULL, 1, 6, 3, false, 2.0f);
        CHECK(ids[0] == 0 && ids[1] == 1 && ids[2] == 3, "ties: got %d %d %d", ids[0], ids[1], ids[2]);
        CHECK(w[0] == 1.0f && w[1] == 1.4f && w[2] == 1.4f, "no renorm weights %g %g %g", w[0], w[1], w[2]);
        st_route_topk(ids, w, s, NULL, 1, 6, 3, true, 2.0f);
        float sum = 0.5f + 0.7f + 0.7f;
        CHECK(w[0] == 0.5f / (sum + 1e-20f) * 2.0f && w[2] == 0.7f / (sum + 1e-20f) * 2.0f, "renorm %g %g", w[0], w[2]);
    }
    /* bias changes the choice, not the weight */
    {
        float s[4] = {0.9f, 0.8f, 0.2f, 0.1f}, b[4] = {0.0f, 0.0f, 1.0f, 0.0f};
        int ids[2];
        float w[2];
        st_route_topk(ids, w, s, b, 1, 4, 2, false, 1.0f);
        CHECK(ids[0] == 0 && ids[1] == 2, "bias: got %d %d", ids[0], ids[1]);
        CHECK(w[0] == 0.9f && w[1] == 0.2f, "bias weights must use unbiased s: %g %g", w[0], w[1]);
    }
    /* quantile: thresholds, truncation by s - tau, empty set, ties in s - tau */
    {
        float s[2 * 5] = {0.9f, 0.6f, 0.55f, 0.3f, 0.8f, /* token 1: nothing passes */ 0.1f, 0.1f, 0.1f, 0.1f, 0.1f};
        float tau[5] = {0.8f, 0.5f, 0.5f, 0.15f, 0.7f};
        int ids[2 * 2], cnt[2];
        float w[2 * 2];
        /* s - tau ≈ 0.1, 0.1, 0.05, 0.15, 0.1: expert 3 plus one of the near-ties (oracle decides in fp32) */
        int want[2];
        int c = oracle(want, s, NULL, tau, 5, 2);
        st_route_quantile(ids, w, cnt, s, tau, 2, 5, 2, true, 1.0f);
        CHECK(cnt[0] == c && ids[0] == want[0] && ids[1] == want[1], "quantile kmax: got %d {%d %d} want {%d %d}",
              cnt[0], ids[0], ids[1], want[0], want[1]);
        CHECK(ids[0] == 3 || ids[1] == 3, "expert 3 (largest s - tau) must be kept");
        CHECK(cnt[1] == 0, "token with no active expert: cnt %d", cnt[1]);
        float sum = s[ids[0]] + s[ids[1]];
        CHECK(w[0] == s[ids[0]] / (sum + 1e-20f) && w[1] == s[ids[1]] / (sum + 1e-20f), "quantile renorm");
        st_route_quantile(ids, w, cnt, s, tau, 2, 5, 2, false, 2.5f);
        CHECK(w[0] == s[ids[0]] * 2.5f, "quantile no renorm");
        /* exact ties in s - tau */
        float s2[4] = {0.5f, 0.5f, 0.5f, 0.5f}, t2[4] = {0.25f, 0.25f, 0.25f, 0.25f};
        st_route_quantile(ids, w, cnt, s2, t2, 1, 4, 2, true, 1.0f);
        CHECK(cnt[0] == 2 && ids[0] == 0 && ids[1] == 1, "quantile ties: %d {%d %d}", cnt[0], ids[0], ids[1]);
    }
    /* random vs oracle, with quantized scores so ties are common */
    st_rng_t r = {11};
    enum { T = 200, N = 64, K = 6, KMAX = 12 };
    float *s = malloc(sizeof(float) * T * N), bias[N], tau[N], w[T * KMAX];
    int ids[T * KMAX], cnt[T], want[KMAX];
    for (int i = 0; i < T * N; i++) s[i] = (float)(st_rng_next(&r) % 16) / 16.0f;
    for (int t = 0; t < T; t += 10) /* every tenth token below every threshold */
        for (int j = 0; j < N; j++) s[t * N + j] *= 0.5f;
    for (int j = 0; j < N; j++) bias[j] = (float)(st_rng_next(&r) % 4) / 16.0f, tau[j] = 0.75f + (float)(st_rng_next(&r) % 4) / 16.0f;
    int bad_topk = 0, bad_q = 0, empty = 0, full = 0;
    st_route_topk(ids, w, s, bias, T, N, K, true, 2.5f);
    for (int t = 0; t < T; t++) {
        int c = oracle(want, s + t * N, bias, NULL, N, K);
        if (c != K || memcmp(want, ids + t * K, sizeof(int) * K)) bad_topk++;
        float sum = 0;
        for (int i = 0; i < K; i++) sum += s[t * N + ids[t * K + i]];
        for (int i = 0; i < K; i++)
            if (w[t * K + i] != s[t * N + ids[t * K + i]] / (sum + 1e-20f) * 2.5f) bad_topk++;
    }
    st_route_quantile(ids, w, cnt, s, tau, T, N, KMAX, true, 1.0f);
    for (int t = 0; t < T; t++) {
        int c = oracle(want, s + t * N, NULL, tau, N, KMAX);
        if (c != cnt[t] || memcmp(want, ids + t * KMAX, sizeof(int) * c)) bad_q++;
        empty += c == 0;
        full += c == KMAX;
    }
    CHECK(bad_topk == 0, "topk vs oracle: %d tokens differ", bad_topk);
    CHECK(bad_q == 0, "quantile vs oracle: %d tokens differ", bad_q);
    printf("random quantile: %d tokens empty, %d truncated at kmax\n", empty, full);
    CHECK(empty > 0 && full > 0, "random case should cover empty and truncated tokens");
    free(s);
    return st_test_done();
}
