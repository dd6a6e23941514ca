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
    uint8_t *head;     /* [max_rows] slot holds a node value in w->out (st_dispatch_unpack) */
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
/* Server s's reply rows [n_out[s], ew] → the node values in w->out (row t*kc + i: the node whose first
 * leaf is slot i), marked in head [T*kc] (the first plan's head, also for its retry plan's replies:
 * a retried node replaces one that never arrived, so the slots never clash). */
void st_dispatch_unpack(const st_dispatch_plan_t *p, int s, const st_moe_work_t *w, const float *rows, uint8_t *head);
/* Each token's tree finished from its node values (w->out rows marked in head, ascending by first
 * leaf) → w->u [T, ew]; a flagged token, or one without experts, gets +0 rows. w->out is scratch. */
void st_dispatch_finish(const st_dispatch_plan_t *p, const st_moe_work_t *w, const uint8_t *head, const bool *tok_failed);

#endif
