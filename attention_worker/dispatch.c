/* Dispatch / combine bookkeeping (see dispatch.h). */
#include <stdlib.h>

#include "dispatch.h"

st_status_t st_dispatch_plan_init(st_dispatch_plan_t *p, int n_servers, int n_experts, int max_rows) {
    memset(p, 0, sizeof *p);
    p->n_servers = n_servers;
    p->n_experts = n_experts;
    p->max_rows = max_rows;
    size_t S = (size_t)n_servers;
    p->n_rows = calloc(S, sizeof(int));
    p->n_exp = calloc(S, sizeof(int));
    p->exp_ids = calloc(S * (size_t)n_experts, sizeof(uint32_t));
    p->offsets = calloc(S * (size_t)(n_experts + 1), sizeof(uint32_t));
    p->pair = calloc(S * (size_t)max_rows, sizeof(int));
    if (!p->n_rows || !p->n_exp || !p->exp_ids || !p->offsets || !p->pair) {
        st_dispatch_plan_cleanup(p);
        return ST_FAIL(ST_ERR_NO_MEMORY, "dispatch plan for %d servers × %d rows", n_servers, max_rows);
    }
    return ST_OK;
}

void st_dispatch_plan_cleanup(st_dispatch_plan_t *p) {
    free(p->n_rows);
    free(p->n_exp);
    free(p->exp_ids);
    free(p->offsets);
    free(p->pair);
    memset(p, 0, sizeof *p);
}

void st_dispatch_plan_build(st_dispatch_plan_t *p, const st_moe_work_t *w, const int *server_of, bool *tok_failed) {
    int S = p->n_servers, n = p->n_experts, kc = w->kc;
    memset(p->n_rows, 0, sizeof(int) * (size_t)S);
    memset(p->n_exp, 0, sizeof(int) * (size_t)S);
    /* experts ascending; for each expert its tokens ascending: one pass per expert keeps it simple
     * and the order canonical (n × T·kc is small next to the expert FFNs) */
    for (int e = 0; e < n; e++) {
        int s = server_of[e];
        if (s == ST_DISPATCH_SKIP) continue;
        int start = s >= 0 ? p->n_rows[s] : 0;
        for (int t = 0; t < w->T; t++)
            for (int i = 0; i < w->cnt[t]; i++) {
                if (w->ids[(size_t)t * kc + i] != e) continue;
                if (s < 0) {
                    tok_failed[t] = true;
                    continue;
                }
                p->pair[(size_t)s * p->max_rows + p->n_rows[s]++] = t * kc + i;
            }
        if (s >= 0 && p->n_rows[s] > start) {
            int k = p->n_exp[s]++;
            p->exp_ids[(size_t)s * n + k] = (uint32_t)e;
            p->offsets[(size_t)s * (n + 1) + k] = (uint32_t)start;
            p->offsets[(size_t)s * (n + 1) + k + 1] = (uint32_t)p->n_rows[s];
        }
    }
}

void st_dispatch_pack(const st_dispatch_plan_t *p, int s, const st_moe_work_t *w, float *dst) {
    const int *pr = p->pair + (size_t)s * p->max_rows;
    for (int r = 0; r < p->n_rows[s]; r++)
        memcpy(dst + (size_t)r * w->ew, w->z + (size_t)(pr[r] / w->kc) * w->ew, sizeof(float) * (size_t)w->ew);
}

void st_dispatch_unpack(const st_dispatch_plan_t *p, int s, const st_moe_work_t *w, const float *rows) {
    const int *pr = p->pair + (size_t)s * p->max_rows;
    for (int r = 0; r < p->n_rows[s]; r++)
        memcpy(w->out + (size_t)pr[r] * w->ew, rows + (size_t)r * w->ew, sizeof(float) * (size_t)w->ew);
}
