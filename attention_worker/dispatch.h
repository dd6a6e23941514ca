/* Dispatch / combine bookkeeping of one MoE work item: which (token, expert) pairs go to which
 * expert server (grouped by expert, experts ascending, tokens ascending within an expert), the
 * distinct tokens each server gets, ascending (a token routed to several of its experts travels once: wire.h
 * ST_WIRE_FLAG_UNIQUE_ROWS), and the summation tree split between the servers: each token's experts
 * cut into the largest nodes of the tree over expert ids that one server holds entirely
 * (docs/architecture.md, "Bit-exact expert results"), each such node one output row of that server,
 * whose value the engine reads where the reply lies (st_moe_work_t.at) to finish each token's tree.
 * Pure logic over preallocated tables; the transport moves the bytes. */
#ifndef STRATA_AW_DISPATCH_H
#define STRATA_AW_DISPATCH_H

#include <stdbool.h>
#include <stdint.h>

#include "strata/engine.h"

typedef struct {
    /* max_rows: pairs of the largest work item (T·kc), rounded up to whole pages of 4-byte entries:
     * the per-server tables (pair, orow, src, wts, node, utok) are page-aligned, each server's rows whole
     * pages of them (st_dispatch_plan_rows) */
    int n_servers, n_experts, max_rows;
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
    float *wts;        /* [S][max_rows] pair → its routing weight, when wts_set (a plan built on the device) */
    int *utok;         /* [S][max_rows] distinct token index → token t, ascending */
    int *last;         /* [S] scratch: each server's last token */
    int *slot_row;     /* [max_rows] scratch: slot → its output row in this build, −1 when not sent */
    int *tag;          /* [max_rows] scratch: a token's leaves' servers */
    int *ecur;         /* [n_experts] scratch: pairs per expert, then each expert's next row */
    uint32_t *tid;     /* [max_rows] scratch: a token's expert ids */
    size_t table_bytes; /* of each per-server table */
    bool wts_set;       /* wts holds this plan's weights (else st_dispatch_pack gathers them) */
} st_dispatch_plan_t;

st_status_t st_dispatch_plan_init(st_dispatch_plan_t *p, int n_servers, int n_experts, int max_rows);
void st_dispatch_plan_cleanup(st_dispatch_plan_t *p);
/* Server s's rows of the per-server tables: at[i], bytes[i] for the 6 of them (page-aligned, whole
 * pages: to page-lock them for the device's copies, st_engine_host_map); returns 6. */
#define ST_DISPATCH_TABLES 6
int st_dispatch_plan_rows(const st_dispatch_plan_t *p, int s, void *at[ST_DISPATCH_TABLES],
                          size_t bytes[ST_DISPATCH_TABLES]);
/* server_of[e]: server slot that runs expert e for this layer; ST_DISPATCH_NONE when no live server
 * holds it (a token routed to it is flagged in tok_failed [T]: set true, never cleared here, and
 * sends nothing); ST_DISPATCH_SKIP to leave its pairs out (a retry round that re-sends only the
 * experts of failed servers: a skipped leaf bounds the nodes like another server's). Tokens already
 * flagged send nothing. Clears p->head. */
#define ST_DISPATCH_NONE (-1)
#define ST_DISPATCH_SKIP (-2)
void st_dispatch_plan_build(st_dispatch_plan_t *p, const st_moe_work_t *w, const int *server_of, bool *tok_failed);
/* p's tables as the kernels' plan descriptor (st_moe_dispatch_plan, st_engine_mb_plan: the GPU
 * engine builds the same tables on the device, the pair weights included: set p->wts_set then); a plan
 * built on the host leaves the weights to st_dispatch_pack, which gathers them straight into the
 * message. */
st_moe_plan_t st_dispatch_plan_view(st_dispatch_plan_t *p);
/* server s's parts of its dispatch: row sources → src [n_rows[s]], each pair's output row → orow and
 * weight → wts [n_rows[s]], its distinct token rows → rows [n_uniq[s], ew], in the work's type (bf16
 * when w->zb, else fp32: the dispatch's ST_WIRE_FLAG_BF16_ROWS); rows NULL: the caller copies them;
 * src NULL: the caller writes them (st_dispatch_src_tokens) */
void st_dispatch_pack(const st_dispatch_plan_t *p, int s, const st_moe_work_t *w, uint32_t *src, uint32_t *orow,
                      float *wts, void *rows);
/* Server s's reply rows [n_out[s], ew] → w->at [T*kc]: slot i of token t points at the row of the node
 * whose first leaf it is (also for a retry plan's replies: a retried node replaces one that never
 * arrived, so the slots never clash). Pointers, not copies, unless copy (rows in memory the engine's
 * device cannot read): then each row goes to w->out's row of its slot and is pointed to there. Rows
 * pointed to must stay as they are until the engine has read them (engine.h), or be settled first. */
void st_dispatch_unpack(const st_dispatch_plan_t *p, int s, const st_moe_work_t *w, const float *rows, bool copy);
/* The node rows w->at points to, copied into w->out (row t*kc + i) and pointed to there: before the
 * reply buffers they lie in are reused (a retry round sends on the same channels). */
void st_dispatch_settle(const st_moe_work_t *w);
/* The same, leaving the rows in [keep_lo, keep_hi) where they are (rows in the engine's device memory,
 * which a retry round does not reuse and the host cannot read). */
void st_dispatch_settle_except(const st_moe_work_t *w, const float *keep_lo, const float *keep_hi);
/* Server s's pair sources as rows of the work (tokens: utok[src[r]]) instead of distinct rows, into src
 * [n_rows[s]] (st_dispatch_pack given src NULL): a dispatch that reads the work's rows where they lie
 * (wire.h ST_WIRE_FLAG_PEER). */
void st_dispatch_src_tokens(const st_dispatch_plan_t *p, int s, uint32_t *src);
/* A flagged token's node values dropped: the engine gives it +0 rows. */
void st_dispatch_drop_failed(const st_moe_work_t *w, const bool *tok_failed);

#endif
