/* Token sampling (SPEC §9). st_sample_rows: the engine's op, the plain twin of st_cuda_sample (kernels/sample.cu), loop by
 * loop in the order of the rule in strata/kernels.h; the passes over the row are the kernel's. */
#include <math.h>
#include <stdlib.h>

#include "sample_rule.h"
#include "strata/kernels.h"

int st_argmax(const float *x, int V) {
    int best = 0;
    for (int i = 1; i < V; i++)
        if (x[i] > x[best]) best = i; /* strict: ties keep the lower id */
    return best;
}

/* ---- st_sample_rows ---- */

/* The kept set of a row (rule step 3): top-k keeps key > kk, and key == kk with id < kj; top-p
 * keeps key ≥ kp. */
typedef struct {
    uint32_t kk, kj, kp;
} keep_t;

static int kept(const keep_t *k, uint32_t key, int v) {
    return (key > k->kk || (key == k->kk && (uint32_t)v < k->kj)) && key >= k->kp;
}

/* top-k boundary: the largest key t with #{key ≥ t} ≥ k (an actual key), then among the ties at it
 * the largest id bound j with #{tie, id < j} ≤ k − #{key > t} (the lowest ids). */
static void topk_bounds(keep_t *kp, const float *x, int V, int k) {
    uint32_t cur = 0;
    for (int b = 31; b >= 0; b--) {
        uint32_t t = cur | (1u << b);
        int n = 0;
        for (int v = 0; v < V; v++) n += st_sr_key(x[v]) >= t;
        if (n >= k) cur = t;
    }
    int gt = 0, ties = 0;
    for (int v = 0; v < V; v++) {
        uint32_t key = st_sr_key(x[v]);
        gt += key > cur;
        ties += key == cur;
    }
    int r = k - gt;
    kp->kk = cur;
    kp->kj = 0xFFFFFFFFu;
    if (ties <= r) return;
    uint32_t j = 0;
    for (int b = 30; b >= 0; b--) {
        uint32_t t = j | (1u << b);
        int n = 0;
        for (int v = 0; v < V && (uint32_t)v < t; v++) n += st_sr_key(x[v]) == cur;
        if (n <= r) j = t;
    }
    kp->kj = j;
}

/* top-p boundary: the largest key t with Σ_{kept, key ≥ t} e^{s} ≥ target (doubles, id order). */
static uint32_t topp_bound(const keep_t *kp, const float *x, int V, float m, float temp, double target) {
    uint32_t cur = 0;
    keep_t k = *kp;
    for (int b = 31; b >= 0; b--) {
        uint32_t t = cur | (1u << b);
        k.kp = t;
        double mass = 0;
        for (int v = 0; v < V; v++)
            if (kept(&k, st_sr_key(x[v]), v)) mass += exp((double)((x[v] - m) / temp));
        if (mass >= target) cur = t;
    }
    return cur;
}

static void sample_row(int *id, float *lp, int *top_ids, float *top_lp, float *x, int V, const st_sample_row_t *p,
                       const uint32_t *bias_ids, const float *bias_values, int *cnt) {
    if (cnt && (p->presence != 0.0f || p->frequency != 0.0f))
        for (int v = 0; v < V; v++)
            if (cnt[v] > 0) x[v] -= p->frequency * (float)cnt[v] + p->presence;
    for (int i = p->bias_off; i < p->bias_off + p->n_bias; i++)
        if (bias_ids[i] < (uint32_t)V) x[bias_ids[i]] += bias_values[i];
    int am = st_argmax(x, V), c = am;
    float m = x[am];
    if (p->temperature > 0.0f && p->top_k != 1) {
        keep_t k = {0, 0xFFFFFFFFu, 0};
        if (p->top_k > 0 && p->top_k < V) topk_bounds(&k, x, V, p->top_k);
        if (p->top_p < 1.0f) {
            double z = 0;
            for (int v = 0; v < V; v++)
                if (kept(&k, st_sr_key(x[v]), v)) z += exp((double)((x[v] - m) / p->temperature));
            k.kp = topp_bound(&k, x, V, m, p->temperature, fmax((double)p->top_p * z, 1.0));
        }
        double best = -INFINITY;
        c = -1;
        for (int v = 0; v < V; v++) {
            if (!kept(&k, st_sr_key(x[v]), v)) continue;
            double g = st_sr_gumbel((x[v] - m) / p->temperature, p->seed, p->pos, (uint32_t)v);
            if (c < 0 || g > best) best = g, c = v; /* strict: ties keep the lower id */
        }
    }
    *id = c;
    if (cnt) cnt[c]++;
    if (p->n_top < 0) return;
    double z1 = 0;
    for (int v = 0; v < V; v++) z1 += exp((double)x[v] - (double)m);
    double lz = log(z1);
    *lp = (float)((double)x[c] - (double)m - lz);
    /* the n_top most likely, each the largest (key, then lowest id) after the previous one */
    uint32_t pk = 0xFFFFFFFFu;
    int pid = -1, n = p->n_top < V ? p->n_top : V;
    for (int j = 0; j < n && j < ST_SAMPLE_MAX_TOP; j++) {
        int b = -1;
        uint32_t bk = 0;
        for (int v = 0; v < V; v++) {
            uint32_t key = st_sr_key(x[v]);
            if (key > pk || (key == pk && v <= pid)) continue; /* taken already */
            if (b < 0 || key > bk) b = v, bk = key;
        }
        top_ids[j] = b;
        top_lp[j] = (float)((double)x[b] - (double)m - lz);
        pk = bk, pid = b;
    }
}

void st_sample_rows(int *ids, float *lp, int *top_ids, float *top_lp, float *logits, int n, int V,
                    const st_sample_row_t *rows, const uint32_t *bias_ids, const float *bias_values, int *counts) {
    for (int r = 0; r < n; r++) {
        const st_sample_row_t *p = &rows[r];
        int *cnt = counts && p->count_row >= 0 ? counts + (size_t)p->count_row * V : NULL;
        sample_row(&ids[r], p->n_top >= 0 ? &lp[r] : NULL, p->n_top >= 0 ? top_ids + (size_t)r * ST_SAMPLE_MAX_TOP : NULL,
                   p->n_top >= 0 ? top_lp + (size_t)r * ST_SAMPLE_MAX_TOP : NULL, logits + (size_t)p->row * V, V, p,
                   bias_ids, bias_values, cnt);
    }
}
