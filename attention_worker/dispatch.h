/* Dispatch / combine bookkeeping of one MoE work item: which rows go to which expert server (grouped
 * by expert, experts ascending, tokens ascending within an expert), the distinct tokens each server
 * gets (a token routed to several of its experts travels once: wire.h ST_WIRE_FLAG_UNIQUE_ROWS) and
 * where each reply row lands. Pure logic over preallocated tables; the transport moves the bytes. */
#ifndef STRATA_AW_DISPATCH_H
#define STRATA_AW_DISPATCH_H

#include <stdbool.h>
#include <stdint.h>

#include "strata/engine.h"

typedef struct {
    int n_servers, n_experts, max_rows;
    int *n_rows;       /* [S] rows for server s */
    int *n_exp;        /* [S] experts for server s */
    uint32_t *exp_ids; /* [S][n_experts] ascending */
    uint32_t *offsets; /* [S][n_experts + 1] row offsets per expert */
    int *pair;         /* [S][max_rows] row → t*kc + i of the work item */
    int *n_uniq;       /* [S] distinct tokens for server s */
    uint32_t *src;     /* [S][max_rows] row → its distinct token's index */
    int *utok;         /* [S][max_rows] distinct token index → token t */
    int *mark;         /* [max_rows] scratch (−1 between builds) */
} st_dispatch_plan_t;

st_status_t st_dispatch_plan_init(st_dispatch_plan_t *p, int n_servers, int n_experts, int max_rows);
void st_dispatch_plan_cleanup(st_dispatch_plan_t *p);
/* server_of[e]: server slot that runs expert e for this layer; ST_DISPATCH_NONE when no live server
 * holds it (tokens routed to it are flagged in tok_failed [T]: set true, never cleared here);
 * ST_DISPATCH_SKIP to leave its pairs out (a retry round that only re-sends some experts). */
#define ST_DISPATCH_NONE (-1)
#define ST_DISPATCH_SKIP (-2)
void st_dispatch_plan_build(st_dispatch_plan_t *p, const st_moe_work_t *w, const int *server_of, bool *tok_failed);
/* server s's row sources → src [n_rows[s]] and its distinct token rows → dst [n_uniq[s], ew] */
void st_dispatch_pack(const st_dispatch_plan_t *p, int s, const st_moe_work_t *w, uint32_t *src, float *dst);
/* reply rows of server s (same order) → w->out */
void st_dispatch_unpack(const st_dispatch_plan_t *p, int s, const st_moe_work_t *w, const float *rows);

#endif
