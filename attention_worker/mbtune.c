/* Micro-batch count by measurement (mbtune.h). */
#include "mbtune.h"

#include <string.h>

void st_mbtune_init(st_mbtune_t *t, int max_mb, int min_tokens) {
    memset(t, 0, sizeof *t);
    t->max_mb = max_mb < 1 ? 1 : max_mb > ST_MBT_MAX ? ST_MBT_MAX : max_mb;
    t->min_tokens = min_tokens < 1 ? 1 : min_tokens;
    t->last_cls = -1;
}

int st_mbtune_allowed(const st_mbtune_t *t, int tokens, int n_seqs) {
    int a = t->max_mb;
    if (n_seqs < a) a = n_seqs;
    if (tokens / t->min_tokens < a) a = tokens / t->min_tokens;
    return a < 1 ? 1 : a;
}

int st_mbtune_class(int tokens) {
    if (tokens < 1) return 0;
    int k = 31 - __builtin_clz((unsigned)tokens);
    int c = 4 * k + (int)((((long)tokens - (1L << k)) * 4) >> k);
    return c < ST_MBT_CLASSES ? c : ST_MBT_CLASSES - 1;
}

void st_mbtune_class_range(int cls, int *lo, int *hi) {
    int k = cls / 4, sub = cls % 4;
    long b = 1L << k;
    *lo = (int)(b + (sub * b + 3) / 4);
    *hi = (int)(b + ((sub + 1) * b + 3) / 4 - 1);
}

/* the fastest of counts 1..a measured enough in class k (0: none) */
static int fastest(const st_mbt_class_t *k, int a) {
    int b = 0;
    for (int m = 1; m <= a; m++)
        if (k->n[m] >= ST_MBT_SAMPLES && (!b || k->cost[m] < k->cost[b])) b = m;
    return b;
}

static int trial(st_mbtune_t *t, int c, int m) {
    t->run_cls = c, t->run_m = m, t->run_left = ST_MBT_RUN - 1;
    return m;
}

int st_mbtune_pick(st_mbtune_t *t, int tokens, int n_seqs) {
    int a = st_mbtune_allowed(t, tokens, n_seqs), c = st_mbtune_class(tokens);
    if (a == 1) return 1;
    st_mbt_class_t *k = &t->cls[c];
    if (t->run_left > 0 && t->run_cls == c && t->run_m <= a) {
        t->run_left--;
        return t->run_m;
    }
    t->run_left = 0;
    for (int m = 1; m <= a; m++)
        if (k->n[m] < ST_MBT_SAMPLES) return trial(t, c, m);
    int b = fastest(k, a);
    if (++k->steps < ST_MBT_EXPLORE) return b;
    k->steps = 0;
    int m = k->next_try;
    do m = m % a + 1; while (m == b);
    k->next_try = (uint8_t)m;
    return trial(t, c, m);
}

int st_mbtune_done(st_mbtune_t *t, int tokens, int m, double seconds) {
    int c = st_mbtune_class(tokens);
    int steady = c == t->last_cls && m == t->last_m;
    t->last_cls = c, t->last_m = m;
    if (!steady || m < 1 || m > ST_MBT_MAX || tokens < 1 || !(seconds >= 0)) return 0;
    st_mbt_class_t *k = &t->cls[c];
    float v = (float)(seconds / tokens);
    /* the mean of the first samples, then a running mean over about the last four */
    float w = k->n[m] < 4 ? 1.0f / (float)(k->n[m] + 1) : 0.25f;
    k->cost[m] += w * (v - k->cost[m]);
    if (k->n[m] < UINT16_MAX) k->n[m]++;
    int b = fastest(k, ST_MBT_MAX);
    if (!b || b == k->best) return 0;
    k->best = (uint8_t)b;
    return b;
}
