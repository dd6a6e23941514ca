/* The expert server's GPU compute (expert_server/compute_gpu.c) against its CPU compute
 * (st_es_compute_run) on the same grouped dispatches of a tiny checkpoint, bf16 and MXFP4 experts:
 * empty experts, one-row experts, ids out of order, every expert, the largest dispatch; outputs
 * NaN-poisoned before each run; one output row per pair (weight 1: the FFN rows themselves) and
 * weighted tree sums of several experts per output row; the same rows sent as distinct rows with
 * sources; plus the error paths (unbound expert, too many rows, fewer slots than rows). And the rule
 * of docs/architecture.md ("Bit-exact expert results"): for a micro-batch of T tokens routed kc ways,
 * the combined rows u that the engine finishes from the servers' tree-node rows (the dispatch plan,
 * the wire, st_es_gpu_run, st_moe_finish_nodes) equal bit for bit the summation tree over what the
 * worker's own GPU engine computes for those slots (the per-slot kernel or the grouped FFN, as
 * st_cuda_moe_ffn_slots_pick says for T·kc), with every expert on one server or the experts split
 * over two. And decode-size dispatches replayed as CUDA graphs give the same bits (graph_case). */
#include <math.h>
#include <unistd.h>

#include "compute.h"
#include "compute_gpu.h"
#include "dispatch.h"
#include "gpu_test.h"

#define MAX_ROWS 300
#define SLOTS_GROUPED (1u << 20) /* a micro-batch of this many slots runs the grouped FFN */

/* a dispatch's view over caller arrays (what st_wire_dispatch_decode gives a server) */
static st_wire_dispatch_t view(const uint32_t *ids, const uint32_t *off, const float *x, const uint32_t *src,
                               const uint32_t *orow, const float *wts, uint32_t n_out) {
    return (st_wire_dispatch_t){.expert_ids = ids, .offsets = off, .src = src, .orow = orow, .wts = wts, .rows = x,
                                .n_out = n_out};
}

static void run_case(const char *tag, st_es_compute_t *cx, st_es_gpu_t *g, int layer, uint32_t n_exp,
                     const uint32_t *ids, const uint32_t *cnt, int ew, st_rng_t *r, double tol) {
    uint32_t off[65];
    off[0] = 0;
    for (uint32_t k = 0; k < n_exp; k++) off[k + 1] = off[k] + cnt[k];
    uint32_t rows = off[n_exp];
    size_t n = (size_t)rows * ew;
    float *x = gt_xmalloc(n * sizeof(float) + 1), *ref = gt_xmalloc(n * sizeof(float) + 1),
          *y = gt_xmalloc(n * sizeof(float) + 1), *one = gt_xmalloc(sizeof(float) * (rows + 1)),
          *wts = gt_xmalloc(sizeof(float) * (rows + 1));
    uint32_t *ident = gt_xmalloc(sizeof(uint32_t) * (rows + 1)), *orow = gt_xmalloc(sizeof(uint32_t) * (rows + 1));
    for (size_t i = 0; i < n; i++) x[i] = st_rng_normal(r); /* fp32: the GPU path rounds to bf16 itself */
    for (size_t i = 0; i < n; i++) ref[i] = y[i] = NAN;
    for (uint32_t q = 0; q < rows; q++) ident[q] = q, one[q] = 1.0f, wts[q] = 0.25f + st_rng_uniform(r);
    for (uint32_t k = 0; k < n_exp; k++) {
        GT_OK(st_es_compute_bind(cx, layer, (int)ids[k]));
        GT_OK(st_es_gpu_bind(g, layer, (int)ids[k]));
    }
    /* one output row per pair, weight 1: the FFN rows */
    st_wire_dispatch_t d = view(ids, off, x, NULL, ident, one, rows);
    GT_OK(st_es_compute_run(cx, layer, n_exp, &d, ref));
    GT_OK(st_es_gpu_run(g, layer, n_exp, &d, rows, SLOTS_GROUPED, y));
    char what[160];
    snprintf(what, sizeof what, "%s layer %d, %u experts, %u rows", tag, layer, n_exp, rows);
    st_t_close(what, y, ref, n, tol, 0);
    /* the same rows from a micro-batch of as many slots: per row where that size picks it */
    const st_config_t *c = st_ckpt_config(cx->ck);
    if (st_cuda_moe_ffn_slots_pick((int)rows, c->n_experts, ew, c->moe_inter)) {
        for (size_t i = 0; i < n; i++) y[i] = NAN;
        GT_OK(st_es_gpu_run(g, layer, n_exp, &d, rows, rows, y));
        snprintf(what, sizeof what, "%s layer %d, %u experts, %u rows, per row", tag, layer, n_exp, rows);
        st_t_close(what, y, ref, n, tol, 0);
    }
    /* weighted tree sums: the q-th pair of every expert into output row q (ids ascending: a tree node
     * per row, as a worker's plan makes them) */
    bool asc = true;
    uint32_t n_out = 0;
    for (uint32_t k = 1; k < n_exp; k++) asc &= ids[k] > ids[k - 1];
    for (uint32_t k = 0; k < n_exp; k++)
        for (uint32_t q = off[k]; q < off[k + 1]; q++) orow[q] = q - off[k], n_out = ST_MAX(n_out, q - off[k] + 1);
    if (asc && rows) {
        d = view(ids, off, x, NULL, orow, wts, n_out);
        for (size_t i = 0; i < n; i++) ref[i] = y[i] = NAN;
        GT_OK(st_es_compute_run(cx, layer, n_exp, &d, ref));
        GT_OK(st_es_gpu_run(g, layer, n_exp, &d, rows, SLOTS_GROUPED, y));
        snprintf(what, sizeof what, "%s layer %d, %u experts, %u rows into %u weighted output rows", tag, layer, n_exp,
                 rows, n_out);
        st_t_close(what, y, ref, (size_t)n_out * ew, tol, 0);
    }
    /* distinct rows with sources (wire.h ST_WIRE_FLAG_UNIQUE_ROWS): row r = x[src[r]] of nu rows */
    uint32_t nu = rows / 3 + 1, *src = gt_xmalloc((rows + 1) * sizeof(uint32_t));
    for (uint32_t q = 0; q < rows; q++) src[q] = (q * 7u) % nu;
    for (uint32_t q = 0; q < rows; q++) memcpy(ref + (size_t)q * ew, x + (size_t)src[q] * ew, sizeof(float) * ew);
    for (size_t i = 0; i < n; i++) y[i] = NAN;
    d = view(ids, off, x, src, ident, one, rows); /* x's first nu rows are the distinct ones */
    GT_OK(st_es_gpu_run(g, layer, n_exp, &d, nu, SLOTS_GROUPED, y));
    float *ref2 = gt_xmalloc(n * sizeof(float) + 1);
    d = view(ids, off, ref, NULL, ident, one, rows);
    GT_OK(st_es_compute_run(cx, layer, n_exp, &d, ref2));
    snprintf(what, sizeof what, "%s layer %d, %u experts, %u rows from %u distinct", tag, layer, n_exp, rows, nu);
    st_t_close(what, y, ref2, n, tol, 0);
    free(ref2), free(src), free(x), free(ref), free(y), free(one), free(wts), free(ident), free(orow);
}

/* expert e's gate / up / down of layer l as bf16, at dst + e·[w·ℓ] (gate, up) or e·[ℓ·w] (down) */
static void stack_expert(const st_ckpt_t *ck, int layer, int e, uint16_t *w1, uint16_t *w3, uint16_t *w2) {
    st_expert_weights_t x;
    GT_OK(st_ckpt_expert(ck, layer, e, &x));
    const st_weight_t *m[3] = {&x.gate, &x.up, &x.down};
    uint16_t *dst[3] = {w1, w3, w2};
    for (int k = 0; k < 3; k++) {
        size_t n = (size_t)m[k]->rows * m[k]->cols, o = (size_t)e * n;
        float *f = gt_xmalloc(n * sizeof(float));
        st_weight_rows_f32(m[k], 0, m[k]->rows, f);
        for (size_t i = 0; i < n; i++) dst[k][o + i] = st_f32_to_bf16(f[i]); /* exact: bf16 or MXFP4 */
        free(f);
    }
}

/* One micro-batch of T tokens, kc = top_k slots each (cnt[t] of them used), through the worker's GPU
 * engine's expert path (its kernels and arguments: experts_local in the engine) and through this
 * server, every expert here or the experts split by parity over two servers; rows compared bitwise. */
/* Server sv's dispatch of plan p through device memory (ST_WIRE_FLAG_PEER): its sources as rows of
 * the work's bf16 rows on the device (d_z [T, ew]), its output rows written into a device reply region
 * from row 3; they equal the rows of the same dispatch with its rows in the message (ref), bit for
 * bit. A reply region one row short, and a dispatch without the peer memory, are refused. */
static void peer_same(const char *tag, st_es_gpu_t *g, int layer, st_dispatch_plan_t *p, int sv, const st_moe_work_t *w,
                      const uint16_t *d_z, const float *ref) {
    const int E = p->n_experts, l = w->ew;
    const int *ut = p->utok + (size_t)sv * p->max_rows;
    st_wire_info_t info = {.kind = ST_WIRE_KIND_DISPATCH,
                           .token_count = (uint32_t)p->n_rows[sv],
                           .expert_count = (uint32_t)p->n_exp[sv],
                           .row_width = (uint32_t)l,
                           .unique = (uint32_t)ut[p->n_uniq[sv] - 1] + 1,
                           .slots = (uint32_t)(w->T * w->kc),
                           .bf16_rows = true,
                           .peer = true,
                           .reply_row = 3};
    info.payload_bytes = st_wire_dispatch_peer_bytes(info.token_count, info.expert_count, info.unique);
    uint8_t *msg = aligned_alloc(16, (info.payload_bytes + 15) / 16 * 16);
    st_wire_dispatch_t v, d;
    GT_OK(st_wire_dispatch_encode(msg, &info, p->exp_ids + (size_t)sv * E, p->offsets + (size_t)sv * (E + 1), &v));
    st_dispatch_pack(p, sv, w, NULL, (uint32_t *)v.orow, (float *)v.wts, NULL);
    st_dispatch_src_tokens(p, sv, (uint32_t *)v.src);
    GT_OK(st_wire_dispatch_decode(msg, &info, &d));
    CHECK(d.peer && d.reply_row == 3 && !d.rows, "%s: a peer dispatch decodes as one (reply row %u)", tag, d.reply_row);
    size_t no = d.n_out, rb = sizeof(float) * (size_t)l;
    float *d_rep = gt_dev(rb * (no + 3)), *got = gt_xmalloc(rb * (no + 1));
    gt_poison(d_rep, rb * (no + 3));
    st_es_gpu_peer_t pe = {
        .base = d_rep, .in = d_z, .reply = d_rep, .in_rows = (uint32_t)w->T, .reply_rows = (uint32_t)no + 3};
    GT_OK(st_es_gpu_run_peer(g, layer, info.expert_count, &d, info.unique, info.slots, NULL, &pe));
    gt_down(got, d_rep + 3 * (size_t)l, rb * no);
    CHECK(!memcmp(got, ref, rb * no), "%s layer %d T=%d server %d: the rows through device memory equal the message's",
          tag, layer, w->T, sv);
    pe.reply_rows = (uint32_t)no + 2;
    CHECK(st_es_gpu_run_peer(g, layer, info.expert_count, &d, info.unique, info.slots, NULL, &pe) == ST_ERR_INVALID_ARG,
          "%s: output rows past the reply region are refused", tag);
    CHECK(st_es_gpu_run(g, layer, info.expert_count, &d, info.unique, info.slots, NULL) == ST_ERR_INVALID_ARG,
          "%s: a peer dispatch without the peer memory is refused", tag);
    st_gpu_free(d_rep), free(got), free(msg);
}

static void engine_case(const char *tag, st_es_gpu_t *g, const st_ckpt_t *ck, int layer, int T, st_rng_t *r) {
    const st_config_t *c = st_ckpt_config(ck);
    const int E = c->n_experts, kc = c->top_k, l = st_config_expert_width(c), w = c->moe_inter, S = T * kc;
    if (E > 64) {
        CHECK(E <= 64, "engine_case: %d experts (at most 64 here)", E);
        return;
    }
    const bool situ = c->act == ST_ACT_SITU;
    const size_t me = (size_t)w * l;
    int *ids = gt_xmalloc(sizeof(int) * S), *cnt = gt_xmalloc(sizeof(int) * T);
    int perm[64];
    for (int t = 0; t < T; t++) { /* kc distinct experts, ascending; cnt 1..kc, and all kc on token 0 */
        for (int e = 0; e < E; e++) perm[e] = e;
        for (int i = 0; i < kc; i++) { /* a partial shuffle picks them, insertion keeps them sorted */
            int j = i + (int)(st_rng_uniform(r) * (E - i)) % (E - i), v = perm[j], k = i;
            perm[j] = perm[i];
            for (; k > 0 && ids[t * kc + k - 1] > v; k--) ids[t * kc + k] = ids[t * kc + k - 1];
            ids[t * kc + k] = v;
        }
        cnt[t] = t == 0 ? kc : 1 + (int)(st_rng_uniform(r) * kc) % kc;
    }
    float *zf = gt_xmalloc(sizeof(float) * (size_t)T * l);
    uint16_t *zb = gt_xmalloc(2 * (size_t)T * l);
    gt_randn_bf(zf, zb, (size_t)T * l, 1.f, r); /* bf16 values: the server's conversion is exact */
    uint16_t *w1 = gt_xmalloc(2 * E * me), *w3 = gt_xmalloc(2 * E * me), *w2 = gt_xmalloc(2 * E * me);
    for (int e = 0; e < E; e++) {
        stack_expert(ck, layer, e, w1, w3, w2);
        GT_OK(st_es_gpu_bind(g, layer, e));
    }
    uint16_t *d_w1 = gt_up(w1, 2 * E * me), *d_w3 = gt_up(w3, 2 * E * me), *d_w2 = gt_up(w2, 2 * E * me);
    uint16_t *d_z = gt_up(zb, 2 * (size_t)T * l);
    /* engine: grouped rows as its st_cuda_moe_group makes them (within an expert, (t, i) ascending) */
    int *off = gt_xmalloc(sizeof(int) * (E + 1)), *row_of = gt_xmalloc(sizeof(int) * S);
    uint32_t *src_of = gt_xmalloc(sizeof(uint32_t) * (S + 1));
    memset(off, 0, sizeof(int) * (E + 1));
    for (int t = 0; t < T; t++)
        for (int i = 0; i < cnt[t]; i++) off[ids[t * kc + i] + 1]++;
    for (int e = 0; e < E; e++) off[e + 1] += off[e];
    int *fill = gt_xmalloc(sizeof(int) * E), N = off[E];
    memcpy(fill, off, sizeof(int) * E);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < kc; i++) {
            row_of[t * kc + i] = i < cnt[t] ? fill[ids[t * kc + i]]++ : -1;
            if (i < cnt[t]) src_of[row_of[t * kc + i]] = (uint32_t)t;
        }
    float *eng = gt_xmalloc(sizeof(float) * ((size_t)N * l + 1)); /* grouped order */
    const bool slots = st_cuda_moe_ffn_slots_pick(S, E, l, w);
    if (slots) {
        int *d_ids = gt_up(ids, sizeof(int) * S), *d_cnt = gt_up(cnt, sizeof(int) * T);
        float *d_y = gt_dev(sizeof(float) * (size_t)S * l), *y = gt_xmalloc(sizeof(float) * (size_t)S * l);
        uint16_t *d_h = gt_dev(2 * (size_t)S * w);
        GT_OK(st_cuda_moe_ffn_slots(&gt_stream, d_y, d_h, d_z, d_ids, d_cnt, T, kc, d_w1, d_w3, d_w2, l, w, situ,
                                    c->situ_beta1, c->situ_beta2));
        gt_down(y, d_y, sizeof(float) * (size_t)S * l);
        for (int p = 0; p < S; p++)
            if (row_of[p] >= 0) memcpy(eng + (size_t)row_of[p] * l, y + (size_t)p * l, sizeof(float) * l);
        st_gpu_free(d_ids), st_gpu_free(d_cnt), st_gpu_free(d_y), st_gpu_free(d_h);
        free(y);
    } else {
        uint16_t *xg = calloc((size_t)S * l + 1, 2);
        if (!xg) exit(1);
        for (int q = 0; q < N; q++) memcpy(xg + (size_t)q * l, zb + (size_t)src_of[q] * l, 2 * (size_t)l);
        uint16_t *d_xg = gt_up(xg, 2 * ((size_t)S * l + 1));
        int *d_off = gt_up(off, sizeof(int) * (E + 1));
        size_t wsb = st_cuda_moe_ffn_ws_bytes(S, w);
        void *d_ws = gt_dev(wsb);
        float *d_y = gt_dev(sizeof(float) * ((size_t)S * l + 1));
        GT_OK(st_cuda_moe_ffn(&gt_stream, d_y, d_xg, d_off, E, S, T, d_w1, d_w3, d_w2, l, w, situ,
                                     c->situ_beta1, c->situ_beta2, d_ws, wsb));
        gt_down(eng, d_y, sizeof(float) * (size_t)N * l);
        st_gpu_free(d_xg), st_gpu_free(d_off), st_gpu_free(d_ws), st_gpu_free(d_y);
        free(xg);
    }
    /* the one-process combine over the engine's rows: the summation tree of fl(p·y) + 0 per token
     * (st_cuda_moe_combine == its C twin: test_gpu_glue_moe) */
    float *p = gt_xmalloc(sizeof(float) * S), *uref = gt_xmalloc(sizeof(float) * (size_t)T * l),
          *lv = gt_xmalloc(sizeof(float) * (size_t)kc * l);
    uint32_t tid[64];
    for (int q = 0; q < S; q++) p[q] = q % kc < cnt[q / kc] ? (float)st_rng_uniform(r) : 0.f;
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < cnt[t]; i++) {
            const float *y = eng + (size_t)row_of[t * kc + i] * l;
            for (int q = 0; q < l; q++) lv[(size_t)i * l + q] = p[t * kc + i] * y[q] + 0.0f;
            tid[i] = (uint32_t)ids[t * kc + i];
        }
        st_moe_tree_rows(lv, tid, cnt[t], l);
        memcpy(uref + (size_t)t * l, lv, sizeof(float) * l); /* cnt ≥ 1 here */
    }
    /* servers: all experts on one (n_srv 1), then the even and the odd experts apart (2): the plan,
     * the wire, each server's tree-node rows, the worker's finish */
    float *wout = gt_xmalloc(sizeof(float) * (size_t)S * l), *u = gt_xmalloc(sizeof(float) * (size_t)T * l);
    const float **at = calloc((size_t)S, sizeof *at);
    bool *failed = calloc((size_t)T, sizeof(bool));
    st_moe_work_t wk = {.layer = layer, .T = T, .kc = kc, .ew = l, .z = zf, .ids = ids, .cnt = cnt, .wts = p,
                        .out = wout, .at = at};
    /* fp32 rows (a CPU worker), then bf16 rows (a GPU worker's hand-off: ST_WIRE_FLAG_BF16_ROWS) */
    for (int run = 0; run < 4; run++) {
        int n_srv = 1 + run % 2;
        bool bf = run >= 2;
        wk.z = bf ? NULL : zf, wk.zb = bf ? zb : NULL;
        int server_of[64];
        for (int e = 0; e < E; e++) server_of[e] = n_srv == 1 ? 0 : e % 2;
        st_dispatch_plan_t plan;
        GT_OK(st_dispatch_plan_init(&plan, n_srv, E, S));
        st_dispatch_plan_build(&plan, &wk, server_of, failed);
        memset(at, 0, sizeof *at * (size_t)S);
        int sent = 0;
        for (int sv = 0; sv < n_srv; sv++) {
            if (!plan.n_rows[sv]) continue;
            st_wire_info_t info = {.kind = ST_WIRE_KIND_DISPATCH, .token_count = (uint32_t)plan.n_rows[sv],
                                   .expert_count = (uint32_t)plan.n_exp[sv], .row_width = (uint32_t)l,
                                   .unique = (uint32_t)plan.n_uniq[sv], .slots = (uint32_t)S};
            info.bf16_rows = bf;
            info.payload_bytes =
                st_wire_dispatch_bytes(info.token_count, info.expert_count, info.row_width, info.unique, bf);
            uint8_t *msg = aligned_alloc(16, (info.payload_bytes + 15) / 16 * 16);
            st_wire_dispatch_t v, d;
            GT_OK(st_wire_dispatch_encode(msg, &info, plan.exp_ids + (size_t)sv * E, plan.offsets + (size_t)sv * (E + 1),
                                          &v));
            st_dispatch_pack(&plan, sv, &wk, (uint32_t *)v.src, (uint32_t *)v.orow, (float *)v.wts, (void *)v.rows);
            GT_OK(st_wire_dispatch_decode(msg, &info, &d));
            float *rows = gt_xmalloc(sizeof(float) * ((size_t)d.n_out * l + 1));
            for (size_t i = 0; i < (size_t)d.n_out * l; i++) rows[i] = NAN;
            GT_OK(st_es_gpu_run(g, layer, info.expert_count, &d, info.unique, (uint32_t)S, rows));
            if (bf) peer_same(tag, g, layer, &plan, sv, &wk, d_z, rows);
            st_dispatch_unpack(&plan, sv, &wk, rows, false);
            st_dispatch_settle(&wk); /* rows is freed next */
            sent += plan.n_rows[sv];
            free(rows), free(msg);
        }
        st_moe_finish_nodes(u, at, ids, cnt, T, kc, l, wout, tid); /* the CPU engine's finish */
        size_t differ = 0;
        for (int t = 0; t < T; t++) differ += memcmp(u + (size_t)t * l, uref + (size_t)t * l, sizeof(float) * l) != 0;
        CHECK(differ == 0 && sent == N, "%s layer %d T=%d (%d slots, %s, %s rows): %zu of %d combined rows differ "
              "from the engine's (%s)", tag, layer, T, S, slots ? "per row" : "grouped", bf ? "bf16" : "fp32", differ, T,
              n_srv == 1 ? "one server" : "even and odd experts on two");
        st_dispatch_plan_cleanup(&plan);
    }
    free(p), free(uref), free(lv), free(wout), free(u), free(at), free(failed);
    printf("ok   %s layer %d T=%d: %d slots, %s, %d pairs: the combined rows equal the engine's bit for bit on 1 and "
           "2 servers, fp32 and bf16 rows\n", tag, layer, T, S, slots ? "per row" : "grouped", N);
    st_gpu_free(d_w1), st_gpu_free(d_w3), st_gpu_free(d_w2), st_gpu_free(d_z);
    free(ids), free(cnt), free(zf), free(zb), free(w1), free(w3), free(w2), free(off), free(row_of), free(src_of),
        free(fill), free(eng);
}

/* A graph case's pairs: expert k of n_exp takes the n_in tokens ascending, less those gc_absent()
 * names (grouped shapes: alt moves pairs between experts, the totals unchanged); each token its own
 * output row. Returns the pairs. */
static bool gc_absent(int shape, bool alt, uint32_t k, uint32_t t) {
    if (shape < 4) return false;
    if (!alt) return t == k;                                     /* 4 × 20 of 21 tokens */
    return (k == 1 && (t == 1 || t == 2)) || (k >= 2 && t == k); /* 21, 19, 20, 20 */
}
static uint32_t gc_fill(int shape, bool alt, uint32_t n_exp, uint32_t n_in, uint32_t *off, uint32_t *src,
                        uint32_t *orow, float *wts) {
    uint32_t n = 0;
    off[0] = 0;
    for (uint32_t k = 0; k < n_exp; k++) {
        for (uint32_t t = 0; t < n_in; t++)
            if (!gc_absent(shape, alt, k, t)) src[n] = t, orow[n] = t, wts[n] = 0.125f + 0.25f * (float)(n % 3), n++;
        off[k + 1] = n;
    }
    return n;
}

/* Dispatches replayed as CUDA graphs (compute_gpu.c): a wire-layout dispatch in pinned memory (one
 * token on 4 experts, 2 tokens sharing 3: the per-row FFN; 21 tokens over 4 experts: the grouped
 * one), fp32 and bf16 rows, served 10 times; from the second sighting on a graph serves it
 * (st_es_gpu_counts), and every result equals bit for bit the same dispatch from pageable
 * memory (never graphed); the same shape on another layer, new row values in place and (grouped)
 * other counts per expert with the same totals replay with the new tables and rows; st_es_gpu_forget
 * drops the graphs (no replay on the next sighting, one again after). The per-row shapes in pinned
 * memory run without copies (the kernels read and write it where it lies), the pageable ones with. */
static void graph_case(const char *tag, st_es_gpu_t *g, const st_ckpt_t *ck, st_rng_t *r) {
    const st_config_t *c = st_ckpt_config(ck);
    const int ew = st_config_expert_width(c), l0 = c->first_k_dense, l1 = c->n_layers - 1;
    for (int shape = 0; shape < 6; shape++) {
        bool bf = shape % 2 == 1, grouped = shape >= 4;
        /* shape 0/1: token 0 on experts 1 3 6 9 (one output row); 2/3: tokens 0, 1 on 2 5 11; 4/5: 21
         * tokens on 1 3 6 9 */
        uint32_t ids0[] = {1, 3, 6, 9}, ids1[] = {2, 5, 11};
        uint32_t n_exp = shape / 2 == 1 ? 3 : 4, *ids = shape / 2 == 1 ? ids1 : ids0;
        uint32_t n_in = grouped ? 21 : shape / 2 == 1 ? 2 : 1;
        uint32_t off[5], src[96], orow[96];
        float wts[96];
        uint32_t n = gc_fill(shape, false, n_exp, n_in, off, src, orow, wts);
        CHECK(st_cuda_moe_ffn_slots_pick((int)n, c->n_experts, ew, c->moe_inter) == !grouped,
              "%s: %u slots pick the %s FFN", tag, n, grouped ? "grouped" : "per-row");
        st_wire_info_t info = {.kind = ST_WIRE_KIND_DISPATCH, .token_count = n, .expert_count = n_exp,
                               .row_width = (uint32_t)ew, .unique = n_in, .slots = n, .bf16_rows = bf};
        info.payload_bytes = st_wire_dispatch_bytes(n, n_exp, (uint32_t)ew, n_in, bf);
        uint8_t *pin = NULL, *page = gt_xmalloc(info.payload_bytes + 16);
        float *out_pin = NULL, *out_ref = gt_xmalloc(sizeof(float) * n_in * ew);
        GT_OK(st_gpu_host_alloc((void **)&pin, info.payload_bytes));
        GT_OK(st_gpu_host_alloc((void **)&out_pin, sizeof(float) * n_in * ew));
        st_wire_dispatch_t v, dp, dg;
        GT_OK(st_wire_dispatch_encode(pin, &info, ids, off, &v));
        memcpy((uint32_t *)v.src, src, 4 * n), memcpy((uint32_t *)v.orow, orow, 4 * n), memcpy((float *)v.wts, wts, 4 * n);
        for (int layer = l0; layer <= l1; layer += l1 - l0 ? l1 - l0 : 1)
            for (uint32_t k = 0; k < n_exp; k++) GT_OK(st_es_gpu_bind(g, layer, (int)ids[k]));
        st_es_gpu_counts_t n0, n1;
        st_es_gpu_counts(g, &n0);
        int runs = 0, same = 0;
        for (int round = 0; round < 10; round++) {
            int layer = round >= 6 && round < 8 ? l1 : l0;
            if (grouped && (round == 4 || round == 6)) { /* other counts per expert, the same key */
                gc_fill(shape, round == 4, n_exp, n_in, off, src, orow, wts);
                GT_OK(st_wire_dispatch_encode(pin, &info, ids, off, &v));
                memcpy((uint32_t *)v.src, src, 4 * n), memcpy((uint32_t *)v.orow, orow, 4 * n);
                memcpy((float *)v.wts, wts, 4 * n);
            }
            if (round == 0 || round == 4) /* new row values in place */
                for (size_t i = 0; i < (size_t)n_in * ew; i++) {
                    float x = st_rng_normal(r);
                    if (bf) ((uint16_t *)v.rows)[i] = st_f32_to_bf16(x);
                    else ((float *)v.rows)[i] = x;
                }
            if (round == 8) st_es_gpu_forget(g);
            memcpy(page, pin, info.payload_bytes);
            GT_OK(st_wire_dispatch_decode(pin, &info, &dg));
            GT_OK(st_wire_dispatch_decode(page, &info, &dp));
            for (size_t i = 0; i < (size_t)n_in * ew; i++) out_ref[i] = out_pin[i] = NAN;
            GT_OK(st_es_gpu_run(g, layer, n_exp, &dp, n_in, n, out_ref));
            st_es_gpu_counts(g, &n1);
            uint64_t r0 = n1.replays;
            GT_OK(st_es_gpu_run(g, layer, n_exp, &dg, n_in, n, out_pin));
            st_es_gpu_counts(g, &n1);
            bool replayed = n1.replays > r0;
            /* round 0 is the first sighting; after forget (round 8) the next one is a first sighting again */
            CHECK(replayed == (round != 0 && round != 8), "%s shape %d round %d: %s", tag, shape, round,
                  replayed ? "replayed where it should not" : "not replayed");
            runs++;
            same += !memcmp(out_ref, out_pin, sizeof(float) * n_in * ew);
        }
        CHECK(same == runs, "%s shape %d (%s rows): %d of %d graph results equal the plain ones bit for bit", tag, shape,
              bf ? "bf16" : "fp32", same, runs);
        st_es_gpu_counts(g, &n1);
        CHECK(n1.replays - n0.replays == 8, "%s shape %d: 8 replays (%llu)", tag, shape,
              (unsigned long long)(n1.replays - n0.replays));
        /* the per-row shapes from pinned memory ran without copies (plain and replayed); the grouped
         * ones, and the pageable references, with them */
        CHECK(n1.direct - n0.direct == (grouped ? 0u : 10u), "%s shape %d: %llu direct runs", tag, shape,
              (unsigned long long)(n1.direct - n0.direct));
        st_gpu_host_free(pin), st_gpu_host_free(out_pin), free(page), free(out_ref);
    }
}

/* Prefill-sized dispatches (above ES_LEAF_GPU_MIN pairs, their sources, pairs and rows one span) build
 * the leaf table on the device: a micro-batch of 2 000 tokens equals the engine's combined rows bit for
 * bit (engine_case: on one server the dispatch takes ~5 000 pairs, on two ~2 500 each, the host's
 * table); an output row naming expert 0 twice is refused as on the host, and the server goes on. */
static void leaf_dev_case(const char *tag, const st_ckpt_t *ck, int layer, st_rng_t *r) {
    enum { T = 2000, N = 5000 };
    const int ew = st_config_expert_width(st_ckpt_config(ck));
    st_es_gpu_t *g = NULL;
    st_es_gpu_counts_t n0, n1;
    GT_OK(st_es_gpu_create(&g, ck, 0, 8192));
    st_es_gpu_counts(g, &n0);
    engine_case(tag, g, ck, layer, T, r);
    st_es_gpu_counts(g, &n1);
    CHECK(n1.leaf_dev - n0.leaf_dev == 3,
          "%s: %llu of the one-server dispatches built their leaf table on the device "
          "(3: fp32, bf16 and bf16 through device memory)",
          tag, (unsigned long long)(n1.leaf_dev - n0.leaf_dev));
    uint32_t ids[1] = {0}, off[2] = {0, N};
    st_wire_info_t info = {.kind = ST_WIRE_KIND_DISPATCH,
                           .token_count = N,
                           .expert_count = 1,
                           .row_width = (uint32_t)ew,
                           .unique = 1,
                           .slots = N,
                           .bf16_rows = true};
    info.payload_bytes = st_wire_dispatch_bytes(N, 1, (uint32_t)ew, 1, true);
    uint8_t *msg = aligned_alloc(16, (info.payload_bytes + 15) / 16 * 16);
    float *out = gt_xmalloc(sizeof(float) * (size_t)N * ew);
    st_wire_dispatch_t v, d;
    GT_OK(st_wire_dispatch_encode(msg, &info, ids, off, &v));
    for (uint32_t i = 0; i < N; i++)
        ((uint32_t *)v.src)[i] = 0, ((uint32_t *)v.orow)[i] = i / 2, ((float *)v.wts)[i] = 0.5f;
    memset((void *)v.rows, 0, sizeof(uint16_t) * (size_t)ew);
    GT_OK(st_wire_dispatch_decode(msg, &info, &d));
    CHECK(st_es_gpu_run(g, layer, 1, &d, 1, N, out) == ST_ERR_INVALID_ARG,
          "%s: %d pairs, each output row naming expert 0 twice, must fail", tag, N);
    st_es_gpu_counts(g, &n0);
    CHECK(n0.leaf_dev - n1.leaf_dev == 1, "%s: the duplicate was found on the device", tag);
    engine_case(tag, g, ck, layer, T, r);
    free(msg), free(out);
    st_es_gpu_destroy(g);
}

static void variant(const char *name, bool mxfp4) {
    char dir[512];
    const char *tmp = getenv("STRATA_TEST_TMP");
    snprintf(dir, sizeof dir, "%s/gpu-expert-%s-%d", tmp ? tmp : "/tmp", name, (int)getpid());
    st_ckpt_init_opts_t io = {.preset = "tiny", .out_dir = dir, .seed = 11, .dtype = ST_DT_BF16, .mxfp4_experts = mxfp4};
    st_ckpt_t *ck = NULL;
    GT_OK(st_ckpt_init(&io));
    GT_OK(st_ckpt_open(&ck, dir));
    const st_config_t *c = st_ckpt_config(ck);
    int ew = st_config_expert_width(c), E = c->n_experts;
    st_es_compute_t cx;
    st_es_gpu_t *g = NULL;
    GT_OK(st_es_compute_init(&cx, ck, MAX_ROWS));
    GT_OK(st_es_gpu_create(&g, ck, 0, MAX_ROWS));
    st_rng_t r = {.s = 3};
    const double tol = 2e-2;
    int l0 = c->first_k_dense, l1 = c->n_layers - 1;

    uint32_t ids_a[] = {1, 3, 4, 7, 15}, cnt_a[] = {5, 0, 1, 37, 130};
    run_case(name, &cx, g, l0, 5, ids_a, cnt_a, ew, &r, tol);
    uint32_t ids_b[] = {9, 2, 12}, cnt_b[] = {17, 3, 64}; /* ids not ascending */
    run_case(name, &cx, g, l1, 3, ids_b, cnt_b, ew, &r, tol);
    uint32_t ids_c[64] = {0}, cnt_c[64] = {0}, tot = 0;
    for (int e = 0; e < E && e < 64; e++) {
        ids_c[e] = (uint32_t)e;
        cnt_c[e] = (uint32_t)((e * 7) % 13); /* includes 0 */
        tot += cnt_c[e];
    }
    run_case(name, &cx, g, l1, (uint32_t)ST_MIN(E, 64), ids_c, cnt_c, ew, &r, tol);
    uint32_t ids_d[] = {0}, cnt_d[] = {MAX_ROWS}; /* the largest dispatch, one expert */
    run_case(name, &cx, g, l0, 1, ids_d, cnt_d, ew, &r, tol);
    uint32_t ids_e[] = {5}, cnt_e[] = {1}; /* one token */
    run_case(name, &cx, g, l0, 1, ids_e, cnt_e, ew, &r, tol);
    CHECK(tot > 0, "all-experts case has rows");

    /* error paths: an expert never bound, a dispatch over max_rows, fewer slots than rows, an output
     * row naming one expert twice; the path keeps working after */
    static float x1[(MAX_ROWS + 1) * 64], y1[(MAX_ROWS + 1) * 64];
    static uint32_t orow1[MAX_ROWS + 1];
    static float w1[MAX_ROWS + 1];
    uint32_t off1[2] = {0, 1}, bad_id[1] = {(uint32_t)(E - 2)}; /* not among ids_a, ids_d, ids_e */
    CHECK(ew <= 64, "test buffers fit width %d", ew);
    st_wire_dispatch_t d = view(bad_id, off1, x1, NULL, orow1, w1, 1);
    CHECK(st_es_gpu_run(g, l0, 1, &d, 1, 1, y1) == ST_ERR_INVALID_ARG, "unbound expert must fail");
    uint32_t off2[2] = {0, MAX_ROWS + 1};
    d = view(ids_d, off2, x1, NULL, orow1, w1, 1);
    CHECK(st_es_gpu_run(g, l0, 1, &d, MAX_ROWS + 1, SLOTS_GROUPED, y1) == ST_ERR_CAPACITY,
          "too many rows must fail with CAPACITY");
    uint32_t off3[2] = {0, 2};
    d = view(ids_d, off3, x1, NULL, orow1, w1, 1);
    CHECK(st_es_gpu_run(g, l0, 1, &d, 2, 1, y1) == ST_ERR_INVALID_ARG, "fewer slots than rows must fail");
    CHECK(st_es_gpu_run(g, l0, 1, &d, 2, 2, y1) == ST_ERR_INVALID_ARG, "an output row naming expert 0 twice must fail");
    uint32_t off0[2] = {0, 0};
    d = view(ids_d, off0, x1, NULL, orow1, w1, 0);
    CHECK(st_es_gpu_run(g, l0, 1, &d, 0, 0, y1) == ST_OK, "empty dispatch");
    run_case(name, &cx, g, l0, 5, ids_a, cnt_a, ew, &r, tol);
    /* micro-batches on both sides of st_cuda_moe_ffn_slots_pick (tiny: 16 experts, 4 per token) */
    static const int Ts[] = {1, 2, 3, 17, 70};
    for (size_t i = 0; i < ST_ARRAY_LEN(Ts); i++) engine_case(name, g, ck, i % 2 ? l1 : l0, Ts[i], &r);
    graph_case(name, g, ck, &r);
    leaf_dev_case(name, ck, l0, &r);
    printf("%s: %.2f MiB of expert weights on the device\n", name, (double)st_es_gpu_weight_bytes(g) / (1 << 20));

    st_es_gpu_destroy(g);
    st_es_compute_cleanup(&cx);
    st_ckpt_close(ck);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

int main(void) {
    gt_init_or_skip("test_gpu_expert");
    variant("bf16", false);
    variant("mxfp4", true);
    return st_test_done();
}
