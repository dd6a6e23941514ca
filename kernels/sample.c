/* Token sampling (SPEC §9): greedy, temperature, top-k, top-p. Deterministic given the rng state:
 * one uniform draw per sampled token, candidates walked in a fixed order. */
#include <math.h>
#include <stdlib.h>

#include "strata/kernels.h"

typedef struct {
    float p;  /* logit, then probability weight */
    float id; /* token id; exact in fp32 up to 2^24 */
} cand_t;

/* descending p, then ascending id */
static int cand_cmp(const void *a, const void *b) {
    const cand_t *x = a, *y = b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static int int_cmp(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

void st_sample_adjust(float *logits, int V, const int *gen, int n_gen, float presence, float frequency,
                      const uint32_t *bias_ids, const float *bias_values, int n_bias, int *ws) {
    if ((presence != 0.0f || frequency != 0.0f) && n_gen > 0) {
        for (int i = 0; i < n_gen; i++) ws[i] = gen[i];
        qsort(ws, (size_t)n_gen, sizeof(int), int_cmp);
        for (int i = 0; i < n_gen;) { /* one run of equal ids: count it */
            int j = i;
            while (j < n_gen && ws[j] == ws[i]) j++;
            if (ws[i] >= 0 && ws[i] < V) logits[ws[i]] -= frequency * (float)(j - i) + presence;
            i = j;
        }
    }
    for (int i = 0; i < n_bias; i++)
        if (bias_ids[i] < (uint32_t)V) logits[bias_ids[i]] += bias_values[i];
}

int st_argmax(const float *x, int V) {
    int best = 0;
    for (int i = 1; i < V; i++)
        if (x[i] > x[best]) best = i; /* strict: ties keep the lower id */
    return best;
}

int st_sample(const float *logits, int V, const st_sampling_t *sp, st_rng_t *rng, float *ws) {
    if (sp->temperature <= 0.0f || sp->top_k == 1) {
        /* top-k = 1 keeps only the argmax; no draw needed (rng untouched only when greedy) */
        if (sp->temperature > 0.0f) (void)st_rng_uniform(rng);
        return st_argmax(logits, V);
    }
    cand_t *c = (cand_t *)ws; /* V pairs = 2V floats */
    float mx = logits[st_argmax(logits, V)];
    for (int i = 0; i < V; i++) {
        c[i].p = (logits[i] - mx) / sp->temperature;
        c[i].id = (float)i;
    }
    int n = V;
    bool filter = (sp->top_k > 0 && sp->top_k < V) || sp->top_p < 1.0f;
    if (filter) qsort(c, (size_t)V, sizeof(cand_t), cand_cmp); /* order kept by exp below */
    if (sp->top_k > 0 && sp->top_k < n) n = sp->top_k;
    float sum = 0.0f;
    for (int i = 0; i < n; i++) {
        c[i].p = expf(c[i].p);
        sum += c[i].p;
    }
    if (sp->top_p < 1.0f) { /* smallest prefix whose mass reaches top_p (at least one token) */
        float cum = 0.0f, target = sp->top_p * sum;
        int keep = n;
        for (int i = 0; i < n; i++) {
            cum += c[i].p;
            if (cum >= target) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
        sum = 0.0f;
        for (int i = 0; i < n; i++) sum += c[i].p;
    }
    float u = (float)st_rng_uniform(rng) * sum, cum = 0.0f;
    for (int i = 0; i < n; i++) {
        cum += c[i].p;
        if (u < cum) return (int)c[i].id;
    }
    return (int)c[n - 1].id; /* u rounded up to the total */
}
