/* MoE routing (SPEC §7): sigmoid scores, top-k with the frozen correction bias, and quantile
 * (per-expert threshold) routing with a k_max cap. Expert ids come out ascending per token. */
#include <math.h>

#include "strata/kernels.h"

void st_router_sigmoid(float *s, int T, int n) {
    for (size_t i = 0; i < (size_t)T * n; i++) s[i] = st_sigmoid(s[i]);
}

/* Keep the cap best (key, id) of a stream fed in ascending id order. list ids[0..*len) sorted by
 * key descending; a new id enters only if strictly better than the worst kept, so ties keep the
 * lower id. */
static void keep_best(int *ids, float *keys, int *len, int cap, int id, float key) {
    if (cap <= 0) return;
    if (*len == cap && !(key > keys[cap - 1])) return;
    int pos = *len < cap ? (*len)++ : cap - 1;
    while (pos > 0 && key > keys[pos - 1]) {
        ids[pos] = ids[pos - 1];
        keys[pos] = keys[pos - 1];
        pos--;
    }
    ids[pos] = id;
    keys[pos] = key;
}

/* sort ids[0..n) ascending (n is small: insertion sort) */
static void sort_ids(int *ids, int n) {
    for (int i = 1; i < n; i++) {
        int v = ids[i], j = i;
        while (j > 0 && ids[j - 1] > v) {
            ids[j] = ids[j - 1];
            j--;
        }
        ids[j] = v;
    }
}

/* w[j] from the unbiased scores of the chosen ids */
static void route_weights(float *w, const int *ids, int cnt, const float *s, bool renorm, float scale) {
    float sum = 0.0f;
    for (int i = 0; i < cnt; i++) sum += s[ids[i]];
    for (int i = 0; i < cnt; i++)
        w[i] = renorm ? s[ids[i]] / (sum + 1e-20f) * scale : s[ids[i]] * scale;
}

void st_route_topk(int *ids, float *w, const float *s, const float *bias, int T, int n, int k,
                   bool renorm, float scale) {
    for (int t = 0; t < T; t++) {
        const float *st = s + (size_t)t * n;
        int *it = ids + (size_t)t * k;
        float *wt = w + (size_t)t * k; /* holds the selection keys until the weights are written */
        int len = 0;
        for (int j = 0; j < n; j++) keep_best(it, wt, &len, k, j, st[j] + (bias ? bias[j] : 0.0f));
        sort_ids(it, len);
        route_weights(wt, it, len, st, renorm, scale);
        for (int i = len; i < k; i++) { /* only when k > n */
            it[i] = -1;
            wt[i] = 0.0f;
        }
    }
}

void st_route_quantile(int *ids, float *w, int *cnt, const float *s, const float *tau, int T, int n,
                       int kmax, bool renorm, float scale) {
    for (int t = 0; t < T; t++) {
        const float *st = s + (size_t)t * n;
        int *it = ids + (size_t)t * kmax;
        float *wt = w + (size_t)t * kmax;
        int len = 0;
        for (int j = 0; j < n; j++)
            if (st[j] >= tau[j]) keep_best(it, wt, &len, kmax, j, st[j] - tau[j]);
        sort_ids(it, len);
        route_weights(wt, it, len, st, renorm, scale);
        for (int i = len; i < kmax; i++) {
            it[i] = -1;
            wt[i] = 0.0f;
        }
        cnt[t] = len;
    }
}

void st_route_finish(const int *ids, float *w, const int *cnt, const float *s, int T, int n, int kc, bool renorm,
                     float scale) {
    for (int t = 0; t < T; t++) {
        const int *id = ids + (size_t)t * kc;
        const float *st = s + (size_t)t * n;
        float sum = 0.0f;
        for (int i = 0; i < cnt[t]; i++) sum += st[id[i]];
        for (int i = 0; i < kc; i++)
            w[(size_t)t * kc + i] = i >= cnt[t] ? 0.0f : renorm ? st[id[i]] / (sum + 1e-20f) * scale : st[id[i]] * scale;
    }
}

void st_route_count(uint32_t *cnt, uint32_t *band, const float *s, const float *tau, const float *rho, int T, int n) {
    const bool with_band = rho && band;
    for (int j = 0; j < n; j++) {
        cnt[j] = 0;
        if (with_band) band[j] = 0;
    }
    for (int t = 0; t < T; t++) {
        const float *st = s + (size_t)t * n;
        for (int j = 0; j < n; j++) {
            bool at_tau = st[j] >= tau[j]; /* NOTE: false for a NaN score or threshold */
            cnt[j] += at_tau;
            if (with_band) band[j] += (st[j] >= rho[j]) != at_tau; /* in [min, max) of rho, tau */
        }
    }
}
