/* Dispatch / combine bookkeeping (see dispatch.h). */
#include <stdlib.h>
#include <string.h>

#include "dispatch.h"

st_status_t st_dispatch_plan_init(st_dispatch_plan_t *p, int n_servers, int n_experts, int max_rows) {
    memset(p, 0, sizeof *p);
    p->n_servers = n_servers;
    p->n_experts = n_experts;
    p->max_rows = max_rows;
    size_t S = (size_t)n_servers, M = (size_t)max_rows;
    p->n_rows = calloc(S, sizeof(int));
    p->n_exp = calloc(S, sizeof(int));
    p->exp_ids = calloc(S * (size_t)n_experts, sizeof(uint32_t));
    p->offsets = calloc(S * (size_t)(n_experts + 1), sizeof(uint32_t));
    p->pair = calloc(S * M, sizeof(int));
    p->orow = calloc(S * M, sizeof(uint32_t));
    p->n_out = calloc(S, sizeof(int));
    p->node = calloc(S * M, sizeof(int));
    p->n_uniq = calloc(S, sizeof(int));
    p->src = calloc(S * M, sizeof(uint32_t));
    p->utok = calloc(S * M, sizeof(int));
    p->last = malloc((size_t)(n_servers > 0 ? n_servers : 1) * sizeof(int));
    p->slot_row = malloc(M * sizeof(int));
    p->tag = malloc(M * sizeof(int));
    p->tid = malloc(M * sizeof(uint32_t));
    p->ecur = malloc((size_t)(n_experts > 0 ? n_experts : 1) * sizeof(int));
    if (!p->ecur || !p->n_rows || !p->n_exp || !p->exp_ids || !p->offsets || !p->pair || !p->orow || !p->n_out || !p->node ||
        !p->n_uniq || !p->src || !p->utok || !p->last || !p->slot_row || !p->tag || !p->tid) {
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
    free(p->orow);
    free(p->n_out);
    free(p->node);
    free(p->n_uniq);
    free(p->src);
    free(p->utok);
    free(p->last);
    free(p->slot_row);
    free(p->tag);
    free(p->tid);
    free(p->ecur);
    memset(p, 0, sizeof *p);
}

/* Leaves [a, b) of one token (expert ids id ascending, servers tg), all inside one node of the tree
 * at level h (2^h ids): the node is one output row when they share a server, else its two halves
 * are cut the same way. A half without leaves adds nothing; a node of skipped leaves is not sent. */
static void split(st_dispatch_plan_t *p, const uint32_t *id, const int *tg, int a, int b, int h, int slot0) {
    int i = a + 1;
    while (i < b && tg[i] == tg[a]) i++;
    if (i == b) {
        int s = tg[a];
        if (s < 0) return;
        int o = p->n_out[s]++;
        p->node[(size_t)s * p->max_rows + o] = slot0 + a;
        for (int k = a; k < b; k++) p->slot_row[slot0 + k] = o;
        return;
    }
    /* NOTE: distinct ids differ below h, so h > 0 here */
    int m = a;
    while (m < b && !((id[m] >> (h - 1)) & 1u)) m++;
    if (m > a) split(p, id, tg, a, m, h - 1, slot0);
    if (m < b) split(p, id, tg, m, b, h - 1, slot0);
}

void st_dispatch_plan_build(st_dispatch_plan_t *p, const st_moe_work_t *w, const int *server_of, bool *tok_failed) {
    int S = p->n_servers, n = p->n_experts, kc = w->kc;
    memset(p->n_rows, 0, sizeof(int) * (size_t)S);
    memset(p->n_exp, 0, sizeof(int) * (size_t)S);
    memset(p->n_out, 0, sizeof(int) * (size_t)S);
    for (int k = 0; k < w->T * kc; k++) p->slot_row[k] = -1;
    /* each token's leaves cut into the largest tree nodes one server holds: its output rows */
    uint32_t *id = p->tid;
    for (int t = 0; t < w->T; t++) {
        int c = w->cnt[t];
        if (tok_failed[t] || c == 0) continue;
        bool none = false;
        for (int i = 0; i < c; i++) {
            id[i] = (uint32_t)w->ids[(size_t)t * kc + i];
            p->tag[i] = server_of[id[i]];
            none |= p->tag[i] == ST_DISPATCH_NONE;
        }
        if (none) {
            tok_failed[t] = true;
            continue;
        }
        /* from the smallest node holding them all: the bit length of where the first and last differ */
        uint32_t x = id[0] ^ id[c - 1];
        split(p, id, p->tag, 0, c, x ? 32 - __builtin_clz(x) : 0, t * kc);
    }
    /* experts ascending; for each expert its tokens ascending: a counting sort of the sent leaves
     * by expert (stable in slot order, which is token order) */
    int *ec = p->ecur;
    memset(ec, 0, sizeof(int) * (size_t)n);
    for (int t = 0; t < w->T; t++)
        for (int i = 0; i < w->cnt[t]; i++) {
            int k = t * kc + i;
            if (p->slot_row[k] >= 0 && server_of[w->ids[k]] >= 0) ec[w->ids[k]]++;
        }
    for (int e = 0; e < n; e++) {
        int s = server_of[e], c = ec[e];
        if (s < 0 || c == 0) continue;
        int start = p->n_rows[s], k = p->n_exp[s]++;
        p->exp_ids[(size_t)s * n + k] = (uint32_t)e;
        p->offsets[(size_t)s * (n + 1) + k] = (uint32_t)start;
        p->offsets[(size_t)s * (n + 1) + k + 1] = (uint32_t)(start + c);
        p->n_rows[s] = start + c;
        ec[e] = start; /* now the expert's next row */
    }
    /* each pair into its expert's next row; each server's distinct tokens in ascending order (the
     * tokens come in order: a token is new to a server when it is not the server's last one) */
    int *last = p->last, *nu = p->n_uniq;
    for (int s = 0; s < S; s++) last[s] = -1, nu[s] = 0;
    /* NOTE: the tables in locals: stores through them cannot alias p, so it is not reloaded each pair */
    int *restrict pair = p->pair, *restrict utok = p->utok;
    uint32_t *restrict orow = p->orow, *restrict src = p->src;
    const int *slot_row = p->slot_row, *ids = w->ids;
    for (int t = 0; t < w->T; t++)
        for (int i = 0; i < w->cnt[t]; i++) {
            int k = t * kc + i, e = ids[k], s;
            if (slot_row[k] < 0 || (s = server_of[e]) < 0) continue;
            size_t base = (size_t)s * p->max_rows, r = base + (size_t)ec[e]++;
            if (last[s] != t) last[s] = t, utok[base + (size_t)nu[s]++] = t;
            pair[r] = k;
            orow[r] = (uint32_t)slot_row[k];
            src[r] = (uint32_t)(nu[s] - 1);
        }
}

void st_dispatch_pack(const st_dispatch_plan_t *p, int s, const st_moe_work_t *w, uint32_t *src, uint32_t *orow,
                      float *wts, void *rows) {
    size_t base = (size_t)s * p->max_rows;
    const int *ut = p->utok + base;
    memcpy(src, p->src + base, sizeof(uint32_t) * (size_t)p->n_rows[s]);
    memcpy(orow, p->orow + base, sizeof(uint32_t) * (size_t)p->n_rows[s]);
    for (int r = 0; r < p->n_rows[s]; r++) wts[r] = w->wts[p->pair[base + r]];
    size_t rb = (w->zb ? sizeof *w->zb : sizeof *w->z) * (size_t)w->ew; /* a row's bytes, as the engine holds it */
    const uint8_t *z = w->zb ? (const uint8_t *)w->zb : (const uint8_t *)w->z;
    if (rows)
        for (int u = 0; u < p->n_uniq[s]; u++) memcpy((uint8_t *)rows + (size_t)u * rb, z + (size_t)ut[u] * rb, rb);
}

void st_dispatch_unpack(const st_dispatch_plan_t *p, int s, const st_moe_work_t *w, const float *rows, bool copy) {
    const int *nd = p->node + (size_t)s * p->max_rows;
    size_t ew = (size_t)w->ew;
    for (int o = 0; o < p->n_out[s]; o++) {
        const float *r = rows + (size_t)o * ew;
        if (copy) r = memcpy(w->out + (size_t)nd[o] * ew, r, sizeof(float) * ew);
        w->at[nd[o]] = r;
    }
}

void st_dispatch_settle(const st_moe_work_t *w) {
    for (int k = 0; k < w->T * w->kc; k++) {
        float *v = w->out + (size_t)k * w->ew;
        if (!w->at[k] || w->at[k] == v) continue;
        memcpy(v, w->at[k], sizeof(float) * (size_t)w->ew);
        w->at[k] = v;
    }
}

void st_dispatch_drop_failed(const st_moe_work_t *w, const bool *tok_failed) {
    for (int t = 0; t < w->T; t++)
        if (tok_failed[t]) memset(w->at + (size_t)t * w->kc, 0, sizeof *w->at * (size_t)w->kc);
}
