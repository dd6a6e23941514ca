/* Micro-batch count by measurement (mbtune.h). */
#include "mbtune.h"

#include <string.h>

void st_mbtune_init(st_mbtune_t *t, int max_mb, int min_tokens) {
    memset(t, 0, sizeof *t);
    t->max_mb = max_mb < 1 ? 1 : max_mb > ST_MBT_MAX ? ST_MBT_MAX : max_mb;
    t->min_tokens = min_tokens < 1 ? 1 : min_tokens;
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

static int trial(st_mbt_class_t *k, int m) {
    k->run_m = (uint8_t)m, k->run_left = ST_MBT_RUN - 1, k->run_n = 0;
    return m;
}

/* the median of v [n ≥ 1] (the upper one of an even count) */
static float median(const float *v, int n) {
    float s[ST_MBT_RUN > ST_MBT_KEEP ? ST_MBT_RUN : ST_MBT_KEEP];
    for (int i = 0; i < n; i++) {
        int j = i;
        for (; j > 0 && s[j - 1] > v[i]; j--)
            s[j] = s[j - 1];
        s[j] = v[i];
    }
    return s[n / 2];
}

/* Class k's trial is over: a challenger that beat the current count takes over. */
static int conclude(st_mbt_class_t *k) {
    int m = k->run_m, b = k->best;
    k->run_m = 0;
    if (!b || m == b || k->run_n == 0) return 0;
    if (median(k->run, k->run_n) >= k->cost[b] * (1.0f - ST_MBT_MARGIN)) return 0;
    k->best = (uint8_t)m;
    return m;
}

int st_mbtune_pick(st_mbtune_t *t, int tokens, int n_seqs, int *changed) {
    int a = st_mbtune_allowed(t, tokens, n_seqs);
    *changed = 0;
    if (a == 1) return 1;
    st_mbt_class_t *k = &t->cls[st_mbtune_class(tokens)];
    if (k->run_m && k->run_m <= a) {
        if (k->run_left > 0) {
            k->run_left--;
            return k->run_m;
        }
        *changed = conclude(k);
    }
    k->run_m = 0;
    for (int m = 1; m <= a; m++) /* every count first */
        if (k->n[m] < ST_MBT_SAMPLES) return trial(k, m);
    if (!k->best) *changed = k->best = (uint8_t)fastest(k, a);
    int b = k->best;
    if (b > a) return fastest(k, a); /* fewer sequences than usual: the best the step allows */
    if (++k->steps < (k->confirms < a - 1 ? ST_MBT_CONFIRM : ST_MBT_EXPLORE)) return b;
    k->steps = 0;
    if (k->confirms < ST_MBT_MAX) k->confirms++;
    int m = k->next_try;
    do m = m % a + 1; while (m == b);
    k->next_try = (uint8_t)m;
    return trial(k, m);
}

void st_mbtune_done(st_mbtune_t *t, int tokens, int m, double seconds) {
    t->same = m == t->last_m ? t->same + 1 : 1;
    t->last_m = m;
    if (t->same <= ST_MBT_SKIP || m < 1 || m > ST_MBT_MAX || tokens < 1 || !(seconds >= 0)) return;
    st_mbt_class_t *k = &t->cls[st_mbtune_class(tokens)];
    float v = (float)(seconds / tokens);
    k->kept[m][k->at[m]] = v;
    k->at[m] = (uint8_t)((k->at[m] + 1) % ST_MBT_KEEP);
    if (k->n[m] < UINT16_MAX) k->n[m]++;
    k->cost[m] = median(k->kept[m], k->n[m] < ST_MBT_KEEP ? k->n[m] : ST_MBT_KEEP);
    if (k->run_m == m && k->run_n < ST_MBT_RUN) k->run[k->run_n++] = v;
}
