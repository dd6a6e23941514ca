/* The data path without the network: a step whose MoE work is split by the dispatch plan over
 * three "expert servers" (each its own st_es_compute over the same checkpoint), packed through the
 * wire format (each server's distinct tokens once, with the row sources, each pair's weight and
 * output row), computed into the servers' tree-node rows, unpacked and finished at the worker,
 * gives bit-for-bit the logits of the one-process engine; the server's result from distinct rows
 * equals the one from the expanded rows, and bf16 rows (a GPU worker's ST_WIRE_FLAG_BF16_ROWS
 * dispatch, packed from a work's zb) give the server's result from the same values in fp32
 * bit-for-bit in half the row bytes. Every pair's input row is its token's (round trip), the
 * replies carry fewer rows than pairs, and a missing expert flags exactly its tokens. */
#include <stdlib.h>
#include <unistd.h>

#include "compute.h"
#include "dispatch.h"
#include "harness.h"

enum { S = 3 };

int main(void) {
    const char *tmp = getenv("STRATA_TEST_TMP");
    char dir[512];
    snprintf(dir, sizeof dir, "%s/dispatch-tiny-%d", tmp ? tmp : "/tmp", (int)getpid());
    st_ckpt_init_opts_t io = {.preset = "tiny", .out_dir = dir, .seed = 11, .dtype = ST_DT_BF16};
    st_ckpt_t *ck;
    if (st_ckpt_init(&io) != ST_OK || st_ckpt_open(&ck, dir) != ST_OK) {
        fprintf(stderr, "checkpoint: %s\n", st_err_last());
        return 1;
    }
    const st_config_t *c = st_ckpt_config(ck);
    int V = c->vocab, n = c->n_experts, ew = st_config_expert_width(c);
    enum { N0 = 13, N1 = 6 };
    int t0[N0], t1[N1];
    for (int i = 0; i < N0; i++) t0[i] = (i * 37 + 5) % V;
    for (int i = 0; i < N1; i++) t1[i] = (i * 91 + 2) % V;

    st_engine_opts_t o;
    st_engine_opts_default(&o);
    o.max_seqs = 4;
    o.max_batch_tokens = 32;
    o.max_ctx = 32;
    st_engine_t *local, *remote;
    CHECK(st_engine_create(&local, ck, &o) == ST_OK, "local engine");
    o.remote_experts = true;
    CHECK(st_engine_create(&remote, ck, &o) == ST_OK, "remote-experts engine");
    float *ref = malloc(sizeof(float) * (N0 + N1) * V), *got = malloc(sizeof(float) * (N0 + N1) * V);
    int a, b;
    st_engine_seq_open(local, &a);
    st_engine_seq_open(local, &b);
    st_seq_chunk_t ch[2] = {{.slot = a, .n_tokens = N0, .tokens = t0, .all_logits = true},
                            {.slot = b, .n_tokens = N1, .tokens = t1, .all_logits = true}};
    CHECK(st_engine_step(local, ch, 2, ref) == ST_OK, "local step");
    CHECK(st_engine_step(remote, ch, 2, got) != ST_OK, "st_engine_step refuses without local experts");

    int PR = o.max_batch_tokens * c->top_k; /* pairs of the largest work item (top-k routing) */
    st_es_compute_t srv[S];
    for (int s = 0; s < S; s++) CHECK(st_es_compute_init(&srv[s], ck, PR) == ST_OK, "server %d", s);
    int server_of[64];
    for (int e = 0; e < n; e++) server_of[e] = (e * 7) % S; /* scattered placement */
    for (int l = 0; l < c->n_layers; l++)
        if (st_config_is_moe_layer(c, l))
            for (int e = 0; e < n; e++) CHECK(st_es_compute_bind(&srv[server_of[e]], l, e) == ST_OK, "bind");
    st_dispatch_plan_t plan;
    CHECK(st_dispatch_plan_init(&plan, S, n, PR) == ST_OK, "plan");
    size_t cap = st_wire_dispatch_bytes((uint32_t)PR, (uint32_t)n, (uint32_t)ew, (uint32_t)PR, false);
    uint8_t *msg = aligned_alloc(16, cap), *msg2 = aligned_alloc(16, cap), *msg3 = aligned_alloc(16, cap);
    float *rep = malloc(sizeof(float) * PR * ew), *rep2 = malloc(sizeof(float) * PR * ew);
    float *rep3 = malloc(sizeof(float) * PR * ew), *rep4 = malloc(sizeof(float) * PR * ew);
    uint16_t *zb = malloc(sizeof(uint16_t) * o.max_batch_tokens * ew);
    float *zr = malloc(sizeof(float) * o.max_batch_tokens * ew); /* zb widened */
    int distinct_ok = 1, shared = 0, pairs = 0, out_rows = 0, bf16_ok = 1, wts_ok = 1, pages_ok = 1, tokens_ok = 1;
    size_t bytes32 = 0, bytes16 = 0;

    int ra, rb;
    st_engine_seq_open(remote, &ra);
    st_engine_seq_open(remote, &rb);
    ch[0].slot = ra;
    ch[1].slot = rb;
    st_engine_mb_t *mb;
    CHECK(st_engine_mb_create(remote, &mb) == ST_OK, "mb");
    CHECK(st_engine_mb_begin(mb, ch, 2, got) == ST_OK, "begin");
    st_moe_work_t w;
    int layers = 0, round_trip_ok = 1;
    bool failed[32] = {false};
    /* driven as the worker drives it: the next launch queued before the rows are in, then released */
    for (int more = st_engine_mb_advance(mb, &w); more; more = st_engine_mb_collect(mb, &w)) {
        st_engine_mb_launch_early(mb);
        layers++;
        st_dispatch_plan_build(&plan, &w, server_of, failed);
        for (size_t i = 0; i < (size_t)w.T * ew; i++) zb[i] = st_f32_to_bf16(w.z[i]), zr[i] = st_bf16_to_f32(zb[i]);
        st_moe_work_t wb = w, wr = w;
        wb.z = NULL, wb.zb = zb, wr.z = zr;
        for (int s = 0; s < S; s++) {
            if (!plan.n_rows[s]) continue;
            uint32_t N = (uint32_t)plan.n_rows[s], nx = (uint32_t)plan.n_exp[s], nu = (uint32_t)plan.n_uniq[s];
            const uint32_t *ids = plan.exp_ids + (size_t)s * n, *off = plan.offsets + (size_t)s * (n + 1);
            st_wire_info_t info = {.kind = ST_WIRE_KIND_DISPATCH, .token_count = N, .expert_count = nx,
                                   .row_width = (uint32_t)ew, .unique = nu, .slots = (uint32_t)(w.T * w.kc)};
            info.payload_bytes = st_wire_dispatch_bytes(N, nx, (uint32_t)ew, nu, false);
            st_wire_dispatch_t v, d, v2, d2;
            CHECK(st_wire_dispatch_encode(msg, &info, ids, off, &v) == ST_OK, "encode");
            st_dispatch_pack(&plan, s, &w, (uint32_t *)v.src, (uint32_t *)v.orow, (float *)v.wts, (void *)v.rows);
            CHECK(st_wire_dispatch_decode(msg, &info, &d) == ST_OK && d.n_out == (uint32_t)plan.n_out[s], "decode");
            { /* the plan with its pair weights written (as one built on the device comes back): the pack copies
               * them, and the message is the one the gathered weights made; each server's rows whole pages */
                bool f2[32];
                memcpy(f2, failed, sizeof f2);
                st_moe_plan_t pv = st_dispatch_plan_view(&plan);
                st_moe_dispatch_plan(&pv, w.ids, w.cnt, w.wts, server_of, f2, w.T, w.kc);
                plan.wts_set = true;
                st_wire_dispatch_t vw;
                CHECK(st_wire_dispatch_encode(msg2, &info, ids, off, &vw) == ST_OK, "encode (weights set)");
                st_dispatch_pack(&plan, s, &w, (uint32_t *)vw.src, (uint32_t *)vw.orow, (float *)vw.wts,
                                 (void *)vw.rows);
                wts_ok &= !memcmp(msg, msg2, info.payload_bytes);
                plan.wts_set = false;
                /* sources as the work's token rows (a dispatch through the worker's device memory) */
                uint32_t *tok = malloc(sizeof(uint32_t) * N);
                st_dispatch_src_tokens(&plan, s, tok);
                for (uint32_t r = 0; r < N; r++)
                    tokens_ok &= (int)tok[r] == plan.pair[s * plan.max_rows + r] / w.kc;
                free(tok);
                void *at[ST_DISPATCH_TABLES];
                size_t tb[ST_DISPATCH_TABLES];
                for (int i = 0, k = st_dispatch_plan_rows(&plan, s, at, tb); i < k; i++)
                    pages_ok &= (uintptr_t)at[i] % 4096 == 0 && tb[i] % 4096 == 0 && tb[i] >= 4 * (size_t)PR;
            }
            /* distinct tokens: each once, and every pair's input is its own token's row */
            shared += (int)(N - nu);
            pairs += (int)N;
            out_rows += plan.n_out[s];
            for (uint32_t u = 0; u < nu; u++)
                for (uint32_t q = 0; q < u; q++)
                    distinct_ok &= memcmp((const float *)d.rows + (size_t)u * ew, (const float *)d.rows + (size_t)q * ew,
                                          sizeof(float) * ew) != 0;
            /* the same dispatch with one row per pair (no sources) */
            st_wire_info_t info2 = info;
            info2.unique = 0;
            info2.payload_bytes = st_wire_dispatch_bytes(N, nx, (uint32_t)ew, 0, false);
            CHECK(st_wire_dispatch_encode(msg2, &info2, ids, off, &v2) == ST_OK, "encode plain");
            memcpy((uint32_t *)v2.orow, d.orow, sizeof(uint32_t) * N);
            memcpy((float *)v2.wts, d.wts, sizeof(float) * N);
            for (uint32_t r = 0; r < N; r++) {
                int pr = plan.pair[s * plan.max_rows + r];
                distinct_ok &= d.src[r] < nu;
                const float *row = (const float *)d.rows + (size_t)d.src[r] * ew;
                round_trip_ok &= !memcmp(row, w.z + (size_t)(pr / w.kc) * ew, sizeof(float) * ew);
                round_trip_ok &= d.wts[r] == w.wts[pr];
                memcpy((float *)v2.rows + (size_t)r * ew, row, sizeof(float) * ew);
            }
            CHECK(st_wire_dispatch_decode(msg2, &info2, &d2) == ST_OK && d2.src == NULL, "decode plain");
            CHECK(st_es_compute_run(&srv[s], w.layer, nx, &d, rep) == ST_OK, "run");
            CHECK(st_es_compute_run(&srv[s], w.layer, nx, &d2, rep2) == ST_OK, "run, expanded rows");
            CHECK(!memcmp(rep, rep2, sizeof(float) * d.n_out * ew), "distinct rows == expanded rows");
            /* bf16 rows (wb: the work as a GPU engine hands it over) against fp32 rows of the same values (wr) */
            for (int plain = 0; plain < 2; plain++) {
                st_wire_info_t i3 = info;
                i3.bf16_rows = !plain;
                i3.payload_bytes = st_wire_dispatch_bytes(N, nx, (uint32_t)ew, nu, i3.bf16_rows);
                (plain ? &bytes32 : &bytes16)[0] += i3.payload_bytes;
                CHECK(st_wire_dispatch_encode(msg3, &i3, ids, off, &v) == ST_OK, "encode bf16");
                st_dispatch_pack(&plan, s, plain ? &wr : &wb, (uint32_t *)v.src, (uint32_t *)v.orow, (float *)v.wts,
                                 (void *)v.rows);
                CHECK(st_wire_dispatch_decode(msg3, &i3, &d) == ST_OK && d.bf16 == !plain, "decode bf16");
                CHECK(st_es_compute_run(&srv[s], w.layer, nx, &d, plain ? rep4 : rep3) == ST_OK, "run bf16");
            }
            bf16_ok &= !memcmp(rep3, rep4, sizeof(float) * d.n_out * ew);
            /* rep is the next server's too: every other server copied (as a worker does for rows the
             * engine cannot read where they lie), the rest settled before rep is reused */
            st_dispatch_unpack(&plan, s, &w, rep, s % 2 == 1);
            st_dispatch_settle(&w);
        }
        st_dispatch_drop_failed(&w, failed);
        st_engine_mb_release(mb);
    }
    CHECK(st_engine_mb_status(mb) == ST_OK, "the step's status: %s", st_status_str(st_engine_mb_status(mb)));
    int anyfail = 0;
    for (int t = 0; t < N0 + N1; t++) anyfail |= failed[t];
    CHECK(!anyfail, "no token failed");
    CHECK(round_trip_ok, "every pair carries its token's row and weight");
    CHECK(bf16_ok, "bf16 rows == fp32 rows of the same values (bitwise)");
    CHECK(wts_ok, "a plan that wrote its pair weights packs the same messages as one whose weights the pack gathers");
    CHECK(pages_ok, "each server's rows of the per-server tables are whole pages, page-aligned");
    CHECK(tokens_ok, "sources as token rows name each pair's own token");
    CHECK(bytes16 < bytes32, "bf16 dispatches are smaller (%zu vs %zu bytes)", bytes16, bytes32);
    CHECK(distinct_ok, "each server's distinct rows are distinct and every source is in range");
    CHECK(shared > 0, "tokens with several experts on one server travel once (%d rows saved)", shared);
    CHECK(out_rows < pairs, "servers return %d tree-node rows for %d pairs", out_rows, pairs);
    CHECK(layers == c->n_layers - c->first_k_dense, "one work item per MoE layer");
    CHECK(memcmp(ref, got, sizeof(float) * (N0 + N1) * V) == 0, "split over 3 servers == one-process engine (bitwise)");

    /* a hole in the placement flags exactly the tokens routed to that expert */
    st_engine_mb_t *mb2;
    st_engine_mb_create(remote, &mb2);
    int t2[4] = {1, 2, 3, 4}, s2;
    st_engine_seq_open(remote, &s2);
    st_seq_chunk_t c2 = {.slot = s2, .n_tokens = 4, .tokens = t2};
    st_engine_mb_begin(mb2, &c2, 1, got);
    CHECK(st_engine_mb_advance(mb2, &w) == 1, "first MoE layer");
    int hole = w.ids[0];
    int so[64];
    memcpy(so, server_of, sizeof so);
    so[hole] = -1;
    bool f2[4] = {false};
    st_dispatch_plan_build(&plan, &w, so, f2);
    int right = 1;
    for (int t = 0; t < 4; t++) {
        bool uses = false;
        for (int i = 0; i < w.cnt[t]; i++) uses |= w.ids[t * w.kc + i] == hole;
        right &= uses == f2[t];
    }
    CHECK(right && f2[0], "tokens of a missing expert are flagged, others not");
    uint32_t bad_ids[1] = {(uint32_t)n + 3}, bad_off[2] = {0, 1}, bad_orow[1] = {0};
    float bad_w[1] = {1.0f};
    st_wire_dispatch_t bad = {.expert_ids = bad_ids, .offsets = bad_off, .orow = bad_orow, .wts = bad_w,
                              .rows = rep, .n_out = 1};
    CHECK(st_es_compute_run(&srv[0], 1, 1, &bad, rep2) == ST_ERR_INVALID_ARG, "unknown expert rejected");

    st_engine_mb_destroy(mb);
    st_engine_mb_destroy(mb2);
    st_dispatch_plan_cleanup(&plan);
    for (int s = 0; s < S; s++) st_es_compute_cleanup(&srv[s]);
    free(msg); free(msg2); free(msg3); free(rep); free(rep2); free(rep3); free(rep4); free(zb); free(zr); free(ref); free(got);
    st_engine_destroy(local);
    st_engine_destroy(remote);
    st_ckpt_close(ck);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "cleanup failed\n");
    return st_test_done();
}
