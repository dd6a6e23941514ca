/* The combine's summation tree (docs/architecture.md, "Bit-exact expert results", rule 1) split
 * between expert servers: random tokens (0 to kc experts, weights and rows with ±0, cancellations
 * and wide magnitudes) over random placements on 1–5 servers (scattered experts, replicas picked at
 * random, a retry round after a lost server) give, after the plan, the wire, each server's output
 * rows and the engine's finish from the node values (read where the replies lie, copied at the unpack,
 * or settled into the work's rows first; both C forms of the finish), the one-process combine's u bit
 * for bit. Also: the rule as written
 * (a recursion over the complete binary tree) == st_moe_tree_rows == the per-column stack form of
 * strata/moe_tree.h == st_moe_combine; a malformed output row is refused. No checkpoint needed: an
 * expert's "output" for a token is a fixed random row. */
#include <math.h>
#include <stdlib.h>

#include "compute.h"
#include "dispatch.h"
#include "harness.h"
#include "strata/moe_tree.h"

enum { MAXT = 40, MAXK = 12, MAXE = 300, MAXW = 7, MAXS = 5 };

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}
static int rint_(int n) { return (int)(rnd() % (uint32_t)n); }

/* values that make the order matter: ±0, exact cancellations, 2^±20 spreads */
static float rval(void) {
    switch (rint_(8)) {
    case 0: return 0.0f;
    case 1: return -0.0f;
    case 2: return 1.0f;
    case 3: return -1.0f;
    default: return ldexpf((float)(int)(rnd() % 2000001) / 1e6f - 1.0f, rint_(41) - 20);
    }
}

/* The rule as written: the node of level h holding ids [base, base + 2^h). */
static float rule(const uint32_t *id, const float *v, int n, uint32_t base, int h, int *has) {
    if (h == 0) {
        for (int i = 0; i < n; i++)
            if (id[i] == base) return *has = 1, v[i];
        return *has = 0, 0.0f;
    }
    uint32_t half = 1u << (h - 1);
    int hl, hr;
    float l = rule(id, v, n, base, h - 1, &hl), r = rule(id, v, n, base + half, h - 1, &hr);
    *has = hl || hr;
    return hl && hr ? l + r : hl ? l : hr ? r : 0.0f;
}

static int n_tok, kc, E, ew;
static int ids[MAXT * MAXK], cnt[MAXT];
static float wts[MAXT * MAXK], z[MAXT * MAXW], out[MAXT * MAXK * MAXW], u[MAXT * MAXW], ref[MAXT * MAXW];
static float ytab[MAXT][MAXE][MAXW]; /* "E_e(z_t)" */
static bool failed[MAXT];

/* One expert server's side: the dispatch through the wire, its output rows by the rows form
 * (the CPU server) and by st_moe_tree_reduce (the GPU kernel's C twin), both checked equal. */
static int serve(const st_dispatch_plan_t *p, int s, const st_moe_work_t *w, float *rows_out, uint8_t *buf) {
    st_wire_info_t info = {.kind = ST_WIRE_KIND_DISPATCH, .token_count = (uint32_t)p->n_rows[s],
                           .expert_count = (uint32_t)p->n_exp[s], .row_width = (uint32_t)ew,
                           .unique = (uint32_t)p->n_uniq[s], .slots = (uint32_t)(n_tok * kc)};
    info.payload_bytes = st_wire_dispatch_bytes(info.token_count, info.expert_count, info.row_width, info.unique, false);
    st_wire_dispatch_t v, d;
    if (st_wire_dispatch_encode(buf, &info, p->exp_ids + (size_t)s * p->n_experts,
                                p->offsets + (size_t)s * (p->n_experts + 1), &v) != ST_OK)
        return 0;
    st_dispatch_pack(p, s, w, (uint32_t *)v.src, (uint32_t *)v.orow, (float *)v.wts, (void *)v.rows);
    if (st_wire_dispatch_decode(buf, &info, &d) != ST_OK || d.n_out != (uint32_t)p->n_out[s]) return 0;
    static uint32_t loff[MAXT * MAXK + 1], lrow[MAXT * MAXK], lid[MAXT * MAXK];
    static float lp[MAXT * MAXK], y[MAXT * MAXK * MAXW], v2[MAXT * MAXK * MAXW], twin[MAXT * MAXK * MAXW];
    if (st_es_leaf_table(&d, info.expert_count, loff, lrow, lid, lp) != ST_OK) return 0;
    for (uint32_t k = 0; k < info.expert_count; k++) /* the "FFN": the token is z's first column */
        for (uint32_t r = d.offsets[k]; r < d.offsets[k + 1]; r++)
            memcpy(y + (size_t)r * ew, ytab[(int)((const float *)d.rows)[(size_t)d.src[r] * ew]][d.expert_ids[k]], sizeof(float) * ew);
    st_moe_tree_reduce(twin, y, loff, lrow, lid, lp, (int)d.n_out, ew);
    for (uint32_t o = 0; o < d.n_out; o++) {
        int m = (int)(loff[o + 1] - loff[o]);
        for (int k = 0; k < m; k++)
            for (int c = 0; c < ew; c++)
                v2[(size_t)k * ew + c] = lp[loff[o] + k] * y[(size_t)lrow[loff[o] + k] * ew + c] + 0.0f;
        st_moe_tree_rows(v2, lid + loff[o], m, ew);
        memcpy(rows_out + (size_t)o * ew, v2, sizeof(float) * ew);
    }
    return !memcmp(rows_out, twin, sizeof(float) * d.n_out * ew);
}

int main(void) {
    static uint8_t buf[1 << 20];
    static float rows_all[MAXS][MAXT * MAXK * MAXW]; /* each server's reply rows, or all in [0] */
    st_dispatch_plan_t plan, plan2;
    CHECK(st_dispatch_plan_init(&plan, MAXS, MAXE, MAXT * MAXK) == ST_OK, "plan");
    CHECK(st_dispatch_plan_init(&plan2, MAXS, MAXE, MAXT * MAXK) == ST_OK, "plan2");
    int rule_ok = 1, stack_ok = 1, twin_ok = 1, nodes_twin_ok = 1, server_ok = 1, split_ok = 1, retry_ok = 1, zero_ok = 1, retries = 0;
    int sizes_ok = 1, nodes_seen = 0, pairs_seen = 0;
    for (int trial = 0; trial < 400; trial++) {
        E = 1 + rint_(trial % 4 == 0 ? MAXE : 20);
        kc = 1 + rint_(MAXK);
        ew = 1 + rint_(MAXW);
        n_tok = 1 + rint_(MAXT);
        for (int t = 0; t < n_tok; t++) {
            int c = rint_((kc < E ? kc : E) + 1); /* 0 .. min(kc, E) experts */
            cnt[t] = c;
            for (int i = 0, picked = 0; i < E && picked < c; i++) /* c distinct ascending ids */
                if ((uint32_t)rint_(E - i) < (uint32_t)(c - picked)) ids[t * kc + picked++] = i;
            for (int i = 0; i < kc; i++) wts[t * kc + i] = i < c ? rval() : 0.0f;
            for (int q = 0; q < ew; q++) z[t * ew + q] = q == 0 ? (float)t : rval();
            for (int e = 0; e < E; e++)
                for (int q = 0; q < ew; q++) ytab[t][e][q] = rval();
        }
        /* the one-process combine: the engine's rows form, checked against the rule, the stack form
         * and the C twin of the GPU combine */
        static float yf[MAXT * MAXK * MAXW], v[MAXK * MAXW], twin[MAXT * MAXW];
        uint32_t tid[MAXK];
        for (int t = 0; t < n_tok; t++) {
            for (int i = 0; i < cnt[t]; i++) {
                tid[i] = (uint32_t)ids[t * kc + i];
                for (int q = 0; q < ew; q++) {
                    yf[((size_t)t * kc + i) * ew + q] = ytab[t][ids[t * kc + i]][q];
                    v[i * ew + q] = wts[t * kc + i] * ytab[t][ids[t * kc + i]][q] + 0.0f;
                }
            }
            for (int q = 0; q < ew; q++) {
                float col[MAXK];
                st_moe_tree_t st;
                st_moe_tree_init(&st);
                for (int i = 0; i < cnt[t]; i++) col[i] = v[i * ew + q], st_moe_tree_push(&st, tid[i], col[i]);
                int has;
                float r = rule(tid, col, cnt[t], 0, 9, &has), sk = st_moe_tree_end(&st);
                float expect = cnt[t] ? r : 0.0f; /* (the rule gives +0 without leaves too) */
                ref[t * ew + q] = expect;
                stack_ok &= memcmp(&sk, &expect, 4) == 0;
            }
            st_moe_tree_rows(v, tid, cnt[t], ew);
            if (cnt[t]) rule_ok &= !memcmp(v, ref + t * ew, sizeof(float) * ew);
            for (int q = 0; q < ew && !cnt[t]; q++) zero_ok &= ref[t * ew + q] == 0.0f && !signbit(ref[t * ew + q]);
        }
        st_moe_combine(twin, NULL, NULL, yf, NULL, NULL, wts, ids, cnt, NULL, n_tok, kc, ew, 0.f);
        twin_ok &= !memcmp(twin, ref, sizeof(float) * n_tok * ew);

        /* the cluster: 1–5 servers, each expert on 1–3 of them (the worker takes one holder) */
        int S = 1 + rint_(MAXS), holders[MAXE][3], nh[MAXE], server_of[MAXE], so2[MAXE];
        for (int e = E; e < MAXE; e++) server_of[e] = so2[e] = ST_DISPATCH_SKIP; /* the plan spans MAXE experts */
        for (int e = 0; e < E; e++) {
            nh[e] = 1 + rint_(S < 3 ? S : 3);
            int first = rint_(S);
            for (int r = 0; r < nh[e]; r++) holders[e][r] = (first + r) % S;
            server_of[e] = holders[e][rint_(nh[e])];
        }
        static const float *at[MAXT * MAXK];
        memset(at, 0, sizeof at);
        st_moe_work_t w = {.layer = 0, .T = n_tok, .kc = kc, .ew = ew, .z = z, .ids = ids, .cnt = cnt, .wts = wts,
                           .out = out, .at = at};
        memset(failed, 0, sizeof failed);
        st_dispatch_plan_build(&plan, &w, server_of, failed);
        /* the cut: every routed leaf in exactly one node of its server, nodes = output rows */
        int covered[MAXT * MAXK] = {0};
        for (int s = 0; s < S; s++) {
            nodes_seen += plan.n_out[s];
            pairs_seen += plan.n_rows[s];
            for (int r = 0; r < plan.n_rows[s]; r++) {
                int k = plan.pair[s * plan.max_rows + r];
                covered[k]++;
                split_ok &= server_of[ids[k]] == s && plan.orow[s * plan.max_rows + r] < (uint32_t)plan.n_out[s];
            }
        }
        for (int t = 0; t < n_tok; t++)
            for (int i = 0; i < cnt[t]; i++) split_ok &= covered[t * kc + i] == 1;
        int lost = S > 1 && trial % 3 == 0 ? rint_(S) : -1; /* a server whose reply never comes */
        /* odd trials: each reply in its own buffer, the node values read from there (pointers); even:
         * one buffer for all, settled after each (as the worker settles before reusing its buffers);
         * every fourth: copied at the unpack (rows the engine's device cannot read where they lie) */
        bool own = trial % 2, copy = trial % 4 == 1;
        for (int s = 0; s < S; s++) {
            if (!plan.n_rows[s] || s == lost) continue;
            float *rows_out = rows_all[own ? s : 0];
            server_ok &= serve(&plan, s, &w, rows_out, buf);
            st_dispatch_unpack(&plan, s, &w, rows_out, copy);
            if (!own) st_dispatch_settle(&w);
        }
        if (lost >= 0 && plan.n_rows[lost]) { /* retry: its experts on another holder, or none */
            retries++;
            for (int e = 0; e < E; e++) {
                so2[e] = ST_DISPATCH_SKIP;
                if (server_of[e] != lost) continue;
                so2[e] = ST_DISPATCH_NONE;
                for (int r = 0; r < nh[e]; r++)
                    if (holders[e][r] != lost) so2[e] = holders[e][r];
            }
            st_dispatch_plan_build(&plan2, &w, so2, failed);
            st_dispatch_settle(&w); /* the retry's replies land in the same buffers */
            for (int s = 0; s < S; s++) {
                if (!plan2.n_rows[s]) continue;
                float *rows_out = rows_all[own ? s : 0];
                server_ok &= serve(&plan2, s, &w, rows_out, buf);
                st_dispatch_unpack(&plan2, s, &w, rows_out, copy);
                if (!own) st_dispatch_settle(&w);
            }
        }
        /* the engine's finish: the stack form (C twin of the GPU combine) first, then the rows form
         * (the CPU engine's, which may overwrite rows settled into out) */
        st_dispatch_drop_failed(&w, failed);
        st_moe_combine(twin, NULL, NULL, NULL, at, NULL, NULL, ids, cnt, NULL, n_tok, kc, ew, 0.f);
        st_moe_finish_nodes(u, at, ids, cnt, n_tok, kc, ew, out, tid);
        nodes_twin_ok &= !memcmp(twin, u, sizeof(float) * n_tok * ew);
        for (int t = 0; t < n_tok; t++) {
            bool stranded = false; /* a leaf of the lost server without another holder */
            for (int i = 0; i < cnt[t] && lost >= 0; i++)
                stranded |= server_of[ids[t * kc + i]] == lost && nh[ids[t * kc + i]] == 1;
            if (stranded) {
                retry_ok &= failed[t];
                for (int q = 0; q < ew; q++) zero_ok &= u[t * ew + q] == 0.0f && !signbit(u[t * ew + q]);
                continue;
            }
            retry_ok &= !failed[t];
            int same = !memcmp(u + t * ew, ref + t * ew, sizeof(float) * ew);
            if (lost >= 0) retry_ok &= same;
            else server_ok &= same;
        }
        /* the reply is at most one row per pair, and with one server one row per token */
        for (int s = 0; s < S; s++) sizes_ok &= plan.n_out[s] <= plan.n_rows[s];
        if (S == 1) {
            int with = 0;
            for (int t = 0; t < n_tok; t++) with += cnt[t] > 0;
            sizes_ok &= plan.n_out[0] == with;
        }
    }
    CHECK(rule_ok, "st_moe_tree_rows == the rule as written (recursion over the complete binary tree)");
    CHECK(stack_ok, "the stack form (strata/moe_tree.h, the CUDA kernels' form) == the rows form, bit for bit");
    CHECK(twin_ok, "st_moe_combine (C twin of st_cuda_moe_combine) == the rows form, bit for bit");
    CHECK(nodes_twin_ok, "the finish from node values: st_moe_combine's node mode == st_moe_finish_nodes, bit for bit");
    CHECK(split_ok, "the plan sends each routed leaf once, to its server, into one of that server's output rows");
    CHECK(server_ok, "node values per server, finished at the worker == the one-process tree (memcmp), over the wire; "
                     "st_moe_tree_reduce == the server's rows form");
    CHECK(retries > 20 && retry_ok, "%d retry rounds after a lost server: same bits, stranded tokens flagged", retries);
    CHECK(zero_ok, "tokens without experts (or failed) give +0 rows");
    CHECK(sizes_ok && nodes_seen < pairs_seen, "output rows ≤ pairs (%d rows for %d pairs), one per token on one server",
          nodes_seen, pairs_seen);

    /* a dispatch whose output row names one expert twice is not a tree node: refused */
    uint32_t eid[1] = {3}, off[2] = {0, 2};
    st_wire_info_t info = {.kind = ST_WIRE_KIND_DISPATCH, .token_count = 2, .expert_count = 1, .row_width = 1, .slots = 2};
    info.payload_bytes = st_wire_dispatch_bytes(2, 1, 1, 0, false);
    st_wire_dispatch_t v, d;
    CHECK(st_wire_dispatch_encode(buf, &info, eid, off, &v) == ST_OK, "encode");
    ((uint32_t *)v.orow)[0] = ((uint32_t *)v.orow)[1] = 0;
    CHECK(st_wire_dispatch_decode(buf, &info, &d) == ST_OK && d.n_out == 1, "decode: 1 output row");
    uint32_t lo[3], lr[2], li[2];
    float lpw[2];
    CHECK(st_es_leaf_table(&d, 1, lo, lr, li, lpw) == ST_ERR_INVALID_ARG, "an output row naming expert 3 twice is refused");
    ((uint32_t *)v.orow)[1] = 2;
    CHECK(st_wire_dispatch_decode(buf, &info, &d) == ST_ERR_PROTOCOL, "an output row ≥ the pairs is refused");
    st_dispatch_plan_cleanup(&plan);
    st_dispatch_plan_cleanup(&plan2);
    return st_test_done();
}
