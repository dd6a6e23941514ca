/* The data path without the network: a step whose MoE work is split by the dispatch plan over
 * three "expert servers" (each its own st_es_compute over the same checkpoint), packed (each
 * server's distinct tokens once, with the row sources), computed and unpacked, gives bit-for-bit
 * the logits of the one-process engine; the server's result from distinct rows equals the one from
 * the expanded rows. Identity experts give the input back (round trip), and a missing expert flags
 * exactly its tokens. */
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

    st_es_compute_t srv[S];
    for (int s = 0; s < S; s++) CHECK(st_es_compute_init(&srv[s], ck, 64) == ST_OK, "server %d", s);
    int server_of[64];
    for (int e = 0; e < n; e++) server_of[e] = (e * 7) % S; /* scattered placement */
    for (int l = 0; l < c->n_layers; l++)
        if (st_config_is_moe_layer(c, l))
            for (int e = 0; e < n; e++) CHECK(st_es_compute_bind(&srv[server_of[e]], l, e) == ST_OK, "bind");
    st_dispatch_plan_t plan;
    CHECK(st_dispatch_plan_init(&plan, S, n, 64) == ST_OK, "plan");
    float *msg = malloc(sizeof(float) * 64 * ew), *rep = malloc(sizeof(float) * 64 * ew);
    float *flat = malloc(sizeof(float) * 64 * ew), *rep2 = malloc(sizeof(float) * 64 * ew);
    uint32_t src[64];
    int distinct_ok = 1, shared = 0;

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
    while (st_engine_mb_advance(mb, &w)) {
        layers++;
        st_dispatch_plan_build(&plan, &w, server_of, failed);
        for (int s = 0; s < S; s++) {
            if (!plan.n_rows[s]) continue;
            st_dispatch_pack(&plan, s, &w, src, msg);
            /* distinct tokens: each once, and every row's source is its own token */
            int nu = plan.n_uniq[s];
            shared += plan.n_rows[s] - nu;
            for (int u = 0; u < nu; u++)
                for (int v = 0; v < u; v++) distinct_ok &= memcmp(msg + (size_t)u * ew, msg + (size_t)v * ew, sizeof(float) * ew) != 0;
            for (int r = 0; r < plan.n_rows[s]; r++) {
                distinct_ok &= src[r] < (uint32_t)nu;
                memcpy(flat + (size_t)r * ew, msg + (size_t)src[r] * ew, sizeof(float) * ew);
            }
            /* identity round trip first: the rows come back where their tokens are */
            st_dispatch_unpack(&plan, s, &w, flat);
            for (int r = 0; r < plan.n_rows[s]; r++) {
                int pr = plan.pair[s * plan.max_rows + r];
                round_trip_ok &= !memcmp(w.out + (size_t)pr * ew, w.z + (size_t)(pr / w.kc) * ew, sizeof(float) * ew);
            }
            const uint32_t *ids = plan.exp_ids + (size_t)s * n, *off = plan.offsets + (size_t)s * (n + 1);
            CHECK(st_es_compute_run(&srv[s], w.layer, (uint32_t)plan.n_exp[s], ids, off, msg, src, rep) == ST_OK, "run");
            CHECK(st_es_compute_run(&srv[s], w.layer, (uint32_t)plan.n_exp[s], ids, off, flat, NULL, rep2) == ST_OK,
                  "run, expanded rows");
            CHECK(!memcmp(rep, rep2, sizeof(float) * (size_t)plan.n_rows[s] * ew), "distinct rows == expanded rows");
            st_dispatch_unpack(&plan, s, &w, rep);
        }
    }
    int anyfail = 0;
    for (int t = 0; t < N0 + N1; t++) anyfail |= failed[t];
    CHECK(!anyfail, "no token failed");
    CHECK(round_trip_ok, "dispatch → identity → combine gives the input back");
    CHECK(distinct_ok, "each server's distinct rows are distinct and every source is in range");
    CHECK(shared > 0, "tokens with several experts on one server travel once (%d rows saved)", shared);
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
    st_es_compute_t *x = &srv[0];
    uint32_t bad_ids[1] = {(uint32_t)n + 3}, bad_off[2] = {0, 1};
    CHECK(st_es_compute_run(x, 1, 1, bad_ids, bad_off, msg, NULL, rep) == ST_ERR_INVALID_ARG, "unknown expert rejected");

    st_engine_mb_destroy(mb);
    st_engine_mb_destroy(mb2);
    st_dispatch_plan_cleanup(&plan);
    for (int s = 0; s < S; s++) st_es_compute_cleanup(&srv[s]);
    free(msg); free(rep); free(flat); free(rep2); free(ref); free(got);
    st_engine_destroy(local);
    st_engine_destroy(remote);
    st_ckpt_close(ck);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "cleanup failed\n");
    return st_test_done();
}
