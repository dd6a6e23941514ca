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
    p->n_uniq = calloc(S, sizeof(int));
    p->src = calloc(S * (size_t)max_rows, sizeof(uint32_t));
    p->utok = calloc(S * (size_t)max_rows, sizeof(int));
    p->mark = malloc((size_t)max_rows * sizeof(int));
    if (!p->n_rows || !p->n_exp || !p->exp_ids || !p->offsets || !p->pair || !p->n_uniq || !p->src || !p->utok ||
        !p->mark) {
        st_dispatch_plan_cleanup(p);
        return ST_FAIL(ST_ERR_NO_MEMORY, "dispatch plan for %d servers × %d rows", n_servers, max_rows);
    }
    for (int i = 0; i < max_rows; i++) p->mark[i] = -1;
    return ST_OK;
}

void st_dispatch_plan_cleanup(st_dispatch_plan_t *p) {
    free(p->n_rows);
    free(p->n_exp);
    free(p->exp_ids);
    free(p->offsets);
    free(p->pair);
    free(p->n_uniq);
    free(p->src);
    free(p->utok);
    free(p->mark);
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
    /* each server's distinct tokens, in order of first use */
    for (int s = 0; s < S; s++) {
        const int *pr = p->pair + (size_t)s * p->max_rows;
        uint32_t *src = p->src + (size_t)s * p->max_rows;
        int *ut = p->utok + (size_t)s * p->max_rows, u = 0;
        for (int r = 0; r < p->n_rows[s]; r++) {
            int t = pr[r] / kc;
            if (p->mark[t] < 0) p->mark[t] = u, ut[u++] = t;
            src[r] = (uint32_t)p->mark[t];
        }
        for (int i = 0; i < u; i++) p->mark[ut[i]] = -1;
        p->n_uniq[s] = u;
    }
}

void st_dispatch_pack(const st_dispatch_plan_t *p, int s, const st_moe_work_t *w, uint32_t *src, float *dst) {
    const int *ut = p->utok + (size_t)s * p->max_rows;
    memcpy(src, p->src + (size_t)s * p->max_rows, sizeof(uint32_t) * (size_t)p->n_rows[s]);
    for (int u = 0; u < p->n_uniq[s]; u++)
        memcpy(dst + (size_t)u * w->ew, w->z + (size_t)ut[u] * w->ew, sizeof(float) * (size_t)w->ew);
}

void st_dispatch_unpack(const st_dispatch_plan_t *p, int s, const st_moe_work_t *w, const float *rows) {
    const int *pr = p->pair + (size_t)s * p->max_rows;
    for (int r = 0; r < p->n_rows[s]; r++)
        memcpy(w->out + (size_t)pr[r] * w->ew, rows + (size_t)r * w->ew, sizeof(float) * (size_t)w->ew);
}
