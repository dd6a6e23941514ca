/* The MoE dispatch plan of one work item, plain C: which (token, expert) pairs go to which expert
 * server, in what order, and the summation tree's split into per-server output rows (strata/kernels.h,
 * st_moe_dispatch_plan). The reference of st_cuda_moe_dispatch_plan (kernels/dispatch_plan.cu); the
 * attention worker's st_dispatch_plan_build is this. No allocation, no I/O. */
#include <string.h>

#include "strata/kernels.h"

/* Leaves [a, b) of one token (expert ids id ascending, servers tg), all inside one node of the tree
 * at level h (2^h ids): the node is one output row when they share a server, else its two halves
 * are cut the same way. A half without leaves adds nothing; a node of skipped leaves is not sent. */
static void split(const st_moe_plan_t *p, const uint32_t *id, const int *tg, int a, int b, int h, int slot0) {
    int i = a + 1;
    while (i < b && tg[i] == tg[a])
        i++;
    if (i == b) {
        int s = tg[a];
        if (s < 0) return;
        int o = p->n_out[s]++;
        p->node[(size_t)s * p->max_rows + o] = slot0 + a;
        for (int k = a; k < b; k++)
            p->slot_row[slot0 + k] = o;
        return;
    }
    /* NOTE: distinct ids differ below h, so h > 0 here */
    int m = a;
    while (m < b && !((id[m] >> (h - 1)) & 1u))
        m++;
    if (m > a) split(p, id, tg, a, m, h - 1, slot0);
    if (m < b) split(p, id, tg, m, b, h - 1, slot0);
}

/* the tables' sizes in 4-byte words, in carving order; returns how many */
static int plan_words(int S, int E, int M, int kc, size_t *w) {
    size_t s = (size_t)S, sm = s * (size_t)M;
    size_t v[] = {s, s, s, s, s * (size_t)E, s * ((size_t)E + 1), /* the counts block */
                  sm, sm, sm, sm, sm, sm,                             /* pair orow src wts node utok */
                  (size_t)M, s, (size_t)E, (size_t)kc, (size_t)kc};    /* slot_row last ecur tag tid */
    memcpy(w, v, sizeof v);
    return (int)(sizeof v / sizeof *v);
}
static size_t up256(size_t b) { return (b + 255) & ~(size_t)255; }

size_t st_moe_plan_counts_bytes(int S, int E) {
    size_t w[17], b = 0;
    plan_words(S, E, 1, 1, w);
    for (int i = 0; i < 6; i++) b += up256(4 * w[i]);
    return b;
}

size_t st_moe_plan_bytes(int S, int E, int M, int kc) {
    size_t w[17], b = 0;
    for (int i = 0, n = plan_words(S, E, M, kc, w); i < n; i++) b += up256(4 * w[i]);
    return b;
}

void st_moe_plan_carve(st_moe_plan_t *p, int S, int E, int M, int kc, void *base) {
    size_t w[17];
    int n = plan_words(S, E, M, kc, w);
    void *t[17];
    uint8_t *at = base;
    for (int i = 0; i < n; i++) t[i] = at, at += up256(4 * w[i]);
    *p = (st_moe_plan_t){.n_servers = S, .n_experts = E, .max_rows = M, .n_rows = t[0], .n_exp = t[1], .n_out = t[2],
                         .n_uniq = t[3], .exp_ids = t[4], .offsets = t[5], .pair = t[6], .orow = t[7], .src = t[8],
                         .wts = t[9], .node = t[10], .utok = t[11], .slot_row = t[12], .last = t[13], .ecur = t[14],
                         .tag = t[15], .tid = t[16]};
}

void st_moe_dispatch_plan(const st_moe_plan_t *p, const int *ids, const int *cnt, const float *wts,
                          const int *server_of, bool *tok_failed, int T, int kc) {
    int S = p->n_servers, n = p->n_experts;
    memset(p->n_rows, 0, sizeof(int) * (size_t)S);
    memset(p->n_exp, 0, sizeof(int) * (size_t)S);
    memset(p->n_out, 0, sizeof(int) * (size_t)S);
    for (int s = 0; s < S; s++)
        p->offsets[(size_t)s * (n + 1)] = 0; /* a server without experts too */
    for (int k = 0; k < T * kc; k++)
        p->slot_row[k] = -1;
    /* each token's leaves cut into the largest tree nodes one server holds: its output rows */
    uint32_t *id = p->tid;
    for (int t = 0; t < T; t++) {
        int c = cnt[t];
        if (tok_failed[t] || c == 0) continue;
        bool none = false;
        for (int i = 0; i < c; i++) {
            id[i] = (uint32_t)ids[(size_t)t * kc + i];
            p->tag[i] = server_of[id[i]];
            none |= p->tag[i] == ST_MOE_PLAN_NONE;
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
    for (int t = 0; t < T; t++)
        for (int i = 0; i < cnt[t]; i++) {
            int k = t * kc + i;
            if (p->slot_row[k] >= 0) ec[ids[k]]++; /* a sent leaf's server is ≥ 0 */
        }
    for (int e = 0; e < n; e++) {
        int s = server_of[e], c = ec[e];
        if (s < 0 || c == 0) continue;
        int start = p->n_rows[s], k = p->n_exp[s]++;
        p->exp_ids[(size_t)s * n + k] = (uint32_t)e;
        p->offsets[(size_t)s * (n + 1) + k + 1] = (uint32_t)(start + c);
        p->n_rows[s] = start + c;
        ec[e] = start; /* now the expert's next row */
    }
    /* each pair into its expert's next row; each server's distinct tokens in ascending order (the
     * tokens come in order: a token is new to a server when it is not the server's last one) */
    int *last = p->last, *nu = p->n_uniq;
    for (int s = 0; s < S; s++)
        last[s] = -1, nu[s] = 0;
    /* NOTE: the tables in locals: stores through them cannot alias p, so it is not reloaded each pair */
    int *restrict pair = p->pair, *restrict utok = p->utok;
    uint32_t *restrict orow = p->orow, *restrict src = p->src;
    float *restrict wo = wts ? p->wts : NULL;
    const int *slot_row = p->slot_row;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < cnt[t]; i++) {
            int k = t * kc + i, e = ids[k], s;
            if (slot_row[k] < 0 || (s = server_of[e]) < 0) continue;
            size_t base = (size_t)s * p->max_rows, r = base + (size_t)ec[e]++;
            if (last[s] != t) last[s] = t, utok[base + (size_t)nu[s]++] = t;
            pair[r] = k;
            orow[r] = (uint32_t)slot_row[k];
            src[r] = (uint32_t)(nu[s] - 1);
            if (wo) wo[r] = wts[k];
        }
}
