/* Dispatch / combine bookkeeping of one MoE work item: which (token, expert) pairs go to which
 * expert server (grouped by expert, experts ascending, tokens ascending within an expert), the
 * distinct tokens each server gets (a token routed to several of its experts travels once: wire.h
 * ST_WIRE_FLAG_UNIQUE_ROWS), and the summation tree split between the servers: each token's experts
 * cut into the largest nodes of the tree over expert ids that one server holds entirely
 * (docs/architecture.md, "Bit-exact expert results"), each such node one output row of that server,
 * and the worker finishing each token's tree from the node values. Pure logic over preallocated
 * tables; the transport moves the bytes. */
#ifndef STRATA_AW_DISPATCH_H
#define STRATA_AW_DISPATCH_H

#include <stdbool.h>
#include <stdint.h>

#include "strata/engine.h"

typedef struct {
    int n_servers, n_experts, max_rows; /* max_rows: pairs of the largest work item (T·kc) */
    int *n_rows;       /* [S] pairs for server s */
    int *n_exp;        /* [S] experts for server s */
    uint32_t *exp_ids; /* [S][n_experts] ascending */
    uint32_t *offsets; /* [S][n_experts + 1] pair offsets per expert */
    int *pair;         /* [S][max_rows] pair r → t*kc + i of the work item */
    uint32_t *orow;    /* [S][max_rows] pair r → its output row at server s */
    int *n_out;        /* [S] output rows of server s (tree nodes) */
    int *node;         /* [S][max_rows] output row → slot t*kc + i of its node's first leaf */
    int *n_uniq;       /* [S] distinct tokens for server s */
    uint32_t *src;     /* [S][max_rows] pair → its distinct token's index */
    int *utok;         /* [S][max_rows] distinct token index → token t */
    int *mark;         /* [max_rows] scratch (−1 between builds) */
    int *slot_row;     /* [max_rows] scratch: slot → its output row in this build, −1 when not sent */
    int *tag;          /* [max_rows] scratch: a token's leaves' servers */
    int *ecur;         /* [n_experts] scratch: pairs per expert, then each expert's next row */
    const float **at;  /* [max_rows] slot → its node value (st_dispatch_unpack), NULL when none */
    uint32_t *tid;     /* [max_rows] scratch of st_dispatch_finish */
} st_dispatch_plan_t;

st_status_t st_dispatch_plan_init(st_dispatch_plan_t *p, int n_servers, int n_experts, int max_rows);
void st_dispatch_plan_cleanup(st_dispatch_plan_t *p);
/* server_of[e]: server slot that runs expert e for this layer; ST_DISPATCH_NONE when no live server
 * holds it (a token routed to it is flagged in tok_failed [T]: set true, never cleared here, and
 * sends nothing); ST_DISPATCH_SKIP to leave its pairs out (a retry round that re-sends only the
 * experts of failed servers: a skipped leaf bounds the nodes like another server's). Tokens already
 * flagged send nothing. Clears p->head. */
#define ST_DISPATCH_NONE (-1)
#define ST_DISPATCH_SKIP (-2)
void st_dispatch_plan_build(st_dispatch_plan_t *p, const st_moe_work_t *w, const int *server_of, bool *tok_failed);
/* server s's parts of its dispatch: row sources → src [n_rows[s]], each pair's output row → orow and
 * weight → wts [n_rows[s]], its distinct token rows → rows [n_uniq[s], ew], in the work's type (bf16
 * when w->zb, else fp32: the dispatch's ST_WIRE_FLAG_BF16_ROWS) */
void st_dispatch_pack(const st_dispatch_plan_t *p, int s, const st_moe_work_t *w, uint32_t *src, uint32_t *orow,
                      float *wts, void *rows);
/* Server s's reply rows [n_out[s], ew] → at [T*kc]: slot i of token t points at the row of the node
 * whose first leaf it is (the first plan's at, also for its retry plan's replies: a retried node
 * replaces one that never arrived, so the slots never clash). Pointers, not copies: rows must stay
 * as they are until st_dispatch_finish, or st_dispatch_settle before they are reused. */
void st_dispatch_unpack(const st_dispatch_plan_t *p, int s, const st_moe_work_t *w, const float *rows, const float **at);
/* The node rows at points to, copied into w->out (row t*kc + i) and pointed to there: before the reply
 * buffers they lie in are reused (a retry round sends on the same channels). */
void st_dispatch_settle(const st_moe_work_t *w, const float **at);
/* Each token's tree finished from its node values (at, ascending by first leaf) → w->u [T, ew]: one
 * node is copied, two are added, more are gathered into the token's rows of w->out (scratch) and
 * summed by the tree; a flagged token, or one without experts, gets +0 rows. */
void st_dispatch_finish(const st_dispatch_plan_t *p, const st_moe_work_t *w, const float **at, const bool *tok_failed);

#endif
