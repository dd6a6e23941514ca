/* Dispatch / combine bookkeeping (see dispatch.h). */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "dispatch.h"
#include "strata/kernels.h"

#define PAGE_WORDS 1024 /* 4-byte entries in a 4 KiB page */

/* a per-server table: page-aligned, zeroed pages that take memory once written (an anonymous
 * mapping: S·max_rows entries is far more than one plan fills) */
static void *table(size_t bytes) {
    void *t = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return t == MAP_FAILED ? NULL : t;
}
static void table_free(void *t, size_t bytes) {
    if (t) munmap(t, bytes);
}

st_status_t st_dispatch_plan_init(st_dispatch_plan_t *p, int n_servers, int n_experts, int max_rows) {
    memset(p, 0, sizeof *p);
    p->n_servers = n_servers;
    p->n_experts = n_experts;
    size_t S = (size_t)n_servers, M = ((size_t)max_rows + PAGE_WORDS - 1) / PAGE_WORDS * PAGE_WORDS;
    p->max_rows = (int)M;
    p->table_bytes = 4 * (S ? S : 1) * M;
    p->n_rows = calloc(S, sizeof(int));
    p->n_exp = calloc(S, sizeof(int));
    p->exp_ids = calloc(S * (size_t)n_experts, sizeof(uint32_t));
    p->offsets = calloc(S * (size_t)(n_experts + 1), sizeof(uint32_t));
    p->pair = table(p->table_bytes);
    p->orow = table(p->table_bytes);
    p->n_out = calloc(S, sizeof(int));
    p->node = table(p->table_bytes);
    p->n_uniq = calloc(S, sizeof(int));
    p->src = table(p->table_bytes);
    p->wts = table(p->table_bytes);
    p->utok = table(p->table_bytes);
    p->last = malloc((size_t)(n_servers > 0 ? n_servers : 1) * sizeof(int));
    p->slot_row = malloc(M * sizeof(int));
    p->tag = malloc(M * sizeof(int));
    p->tid = malloc(M * sizeof(uint32_t));
    p->ecur = malloc((size_t)(n_experts > 0 ? n_experts : 1) * sizeof(int));
    if (!p->ecur || !p->n_rows || !p->n_exp || !p->exp_ids || !p->offsets || !p->pair || !p->orow || !p->n_out ||
        !p->node || !p->n_uniq || !p->src || !p->wts || !p->utok || !p->last || !p->slot_row || !p->tag || !p->tid) {
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
    table_free(p->pair, p->table_bytes);
    table_free(p->orow, p->table_bytes);
    free(p->n_out);
    table_free(p->node, p->table_bytes);
    free(p->n_uniq);
    table_free(p->src, p->table_bytes);
    table_free(p->wts, p->table_bytes);
    table_free(p->utok, p->table_bytes);
    free(p->last);
    free(p->slot_row);
    free(p->tag);
    free(p->tid);
    free(p->ecur);
    memset(p, 0, sizeof *p);
}

int st_dispatch_plan_rows(const st_dispatch_plan_t *p, int s, void *at[ST_DISPATCH_TABLES],
                          size_t bytes[ST_DISPATCH_TABLES]) {
    size_t o = (size_t)s * (size_t)p->max_rows;
    void *t[ST_DISPATCH_TABLES] = {p->pair + o, p->orow + o, p->src + o, p->wts + o, p->node + o, p->utok + o};
    for (int i = 0; i < ST_DISPATCH_TABLES; i++)
        at[i] = t[i], bytes[i] = 4 * (size_t)p->max_rows;
    return ST_DISPATCH_TABLES;
}

/* NOTE: the worker's markers are the kernel's (server_of is handed through as it is) */
_Static_assert(ST_DISPATCH_NONE == ST_MOE_PLAN_NONE && ST_DISPATCH_SKIP == ST_MOE_PLAN_SKIP, "server_of markers");

st_moe_plan_t st_dispatch_plan_view(st_dispatch_plan_t *p) {
    return (st_moe_plan_t){.n_servers = p->n_servers, .n_experts = p->n_experts, .max_rows = p->max_rows,
                           .n_rows = p->n_rows, .n_exp = p->n_exp, .exp_ids = p->exp_ids, .offsets = p->offsets,
                           .pair = p->pair, .orow = p->orow, .src = p->src, .wts = p->wts, .n_out = p->n_out,
                           .node = p->node, .n_uniq = p->n_uniq, .utok = p->utok, .slot_row = p->slot_row,
                           .last = p->last, .ecur = p->ecur, .tag = p->tag, .tid = p->tid};
}

/* The plan is kernels/dispatch_plan.c's (the reference of the GPU's); p's tables are its tables. */
void st_dispatch_plan_build(st_dispatch_plan_t *p, const st_moe_work_t *w, const int *server_of, bool *tok_failed) {
    st_moe_plan_t v = st_dispatch_plan_view(p);
    st_moe_dispatch_plan(&v, w->ids, w->cnt, NULL, server_of, tok_failed, w->T, w->kc); /* no weights */
    p->wts_set = false;
}

void st_dispatch_pack(const st_dispatch_plan_t *p, int s, const st_moe_work_t *w, uint32_t *src, uint32_t *orow,
                      float *wts, void *rows) {
    size_t base = (size_t)s * p->max_rows;
    const int *ut = p->utok + base;
    if (src) memcpy(src, p->src + base, sizeof(uint32_t) * (size_t)p->n_rows[s]);
    memcpy(orow, p->orow + base, sizeof(uint32_t) * (size_t)p->n_rows[s]);
    if (p->wts_set)
        memcpy(wts, p->wts + base, sizeof(float) * (size_t)p->n_rows[s]);
    else
        for (int r = 0; r < p->n_rows[s]; r++)
            wts[r] = w->wts[p->pair[base + r]];
    size_t rb = (w->zb ? sizeof *w->zb : sizeof *w->z) * (size_t)w->ew; /* a row's bytes, as the engine holds it */
    const uint8_t *z = w->zb ? (const uint8_t *)w->zb : (const uint8_t *)w->z;
    if (rows)
        for (int u = 0; u < p->n_uniq[s]; u++) memcpy((uint8_t *)rows + (size_t)u * rb, z + (size_t)ut[u] * rb, rb);
}

void st_dispatch_src_tokens(const st_dispatch_plan_t *p, int s, uint32_t *src) {
    size_t base = (size_t)s * p->max_rows;
    const int *ut = p->utok + base;
    const uint32_t *ps = p->src + base;
    for (int r = 0; r < p->n_rows[s]; r++)
        src[r] = (uint32_t)ut[ps[r]];
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

void st_dispatch_settle(const st_moe_work_t *w) { st_dispatch_settle_except(w, NULL, NULL); }

void st_dispatch_settle_except(const st_moe_work_t *w, const float *keep_lo, const float *keep_hi) {
    for (int k = 0; k < w->T * w->kc; k++) {
        float *v = w->out + (size_t)k * w->ew;
        uintptr_t a = (uintptr_t)w->at[k];
        if (!w->at[k] || w->at[k] == v || (a >= (uintptr_t)keep_lo && a < (uintptr_t)keep_hi)) continue;
        memcpy(v, w->at[k], sizeof(float) * (size_t)w->ew);
        w->at[k] = v;
    }
}

void st_dispatch_drop_failed(const st_moe_work_t *w, const bool *tok_failed) {
    for (int t = 0; t < w->T; t++)
        if (tok_failed[t]) memset(w->at + (size_t)t * w->kc, 0, sizeof *w->at * (size_t)w->kc);
}
