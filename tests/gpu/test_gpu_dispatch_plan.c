/* The dispatch plan on the GPU (st_cuda_moe_dispatch_plan) against its C version (st_moe_dispatch_plan):
 * every table equal over its valid prefix, every count exact, the failed-token flags equal; launched
 * directly and replayed from a CUDA graph, outputs and workspace poisoned before each. Over T 1, 7,
 * 256, 4096, 8195; kc 1, 8, 16 (cnt[t] anywhere in 0..kc, ids distinct and ascending, some tokens'
 * ids packed into a narrow window so that tree nodes hold several leaves); E 8, 64, 896; S 1, 3, 64;
 * contiguous and scattered placements, with and without NONE and SKIP experts, some tokens flagged
 * before; then the largest shape (T 16384, kc 16, E 1024, S 64), T = 0, and a wrong-argument call.
 * The comparison itself is checked to catch one changed entry. */
#include <stdbool.h>
#include <string.h>

#include "gpu_test.h"
#include "strata/kernels.h"

enum { PL_CONTIG, PL_CONTIG_MARKED, PL_SCATTER_MARKED, PL_N };
static const char *pl_name[] = {"contiguous", "contiguous+none/skip", "scattered+none/skip"};

/* host or device copies of one plan's tables (with the C scratch for 16 slots a token), one block */
static st_moe_plan_t plan_alloc(int S, int E, int M, bool dev) {
    size_t b = st_moe_plan_bytes(S, E, M, 16);
    st_moe_plan_t p;
    st_moe_plan_carve(&p, S, E, M, 16, dev ? gt_dev(b) : aligned_alloc(256, (b + 255) / 256 * 256));
    CHECK(p.n_rows != NULL, "plan tables of %zu bytes", b);
    return p;
}
static void plan_free(st_moe_plan_t *p, bool dev) { dev ? st_gpu_free(p->n_rows) : free(p->n_rows); }
/* every table to 0xff (the host's ref and the device's both: nothing past a valid prefix is compared) */
static void plan_poison(const st_moe_plan_t *p, bool dev) {
    size_t b = st_moe_plan_bytes(p->n_servers, p->n_experts, p->max_rows, 16);
    dev ? gt_poison(p->n_rows, b) : (void)memset(p->n_rows, 0xff, b);
}

/* the device tables' valid prefixes (by the device's own counts, bounded) into h */
static void plan_download(st_moe_plan_t *h, const st_moe_plan_t *d) {
    int S = d->n_servers, E = d->n_experts, M = d->max_rows;
    gt_down(h->n_rows, d->n_rows, 4 * (size_t)S), gt_down(h->n_exp, d->n_exp, 4 * (size_t)S);
    gt_down(h->n_out, d->n_out, 4 * (size_t)S), gt_down(h->n_uniq, d->n_uniq, 4 * (size_t)S);
    for (int s = 0; s < S; s++) {
        size_t b = (size_t)s * M, nr = h->n_rows[s] >= 0 && h->n_rows[s] <= M ? (size_t)h->n_rows[s] : 0;
        size_t nx = h->n_exp[s] >= 0 && h->n_exp[s] <= E ? (size_t)h->n_exp[s] : 0;
        size_t no = h->n_out[s] >= 0 && h->n_out[s] <= M ? (size_t)h->n_out[s] : 0;
        size_t nu = h->n_uniq[s] >= 0 && h->n_uniq[s] <= M ? (size_t)h->n_uniq[s] : 0;
        gt_down(h->exp_ids + (size_t)s * E, d->exp_ids + (size_t)s * E, 4 * nx);
        gt_down(h->offsets + (size_t)s * (E + 1), d->offsets + (size_t)s * (E + 1), 4 * (nx + 1));
        gt_down(h->pair + b, d->pair + b, 4 * nr), gt_down(h->orow + b, d->orow + b, 4 * nr);
        gt_down(h->src + b, d->src + b, 4 * nr), gt_down(h->wts + b, d->wts + b, 4 * nr);
        gt_down(h->node + b, d->node + b, 4 * no), gt_down(h->utok + b, d->utok + b, 4 * nu);
    }
}

/* first difference of a 32-bit table over n entries, printed; returns the number that differ */
static int diff32(const char *what, const char *tab, int s, const void *got, const void *want, size_t n) {
    const uint32_t *g = got, *w = want;
    int bad = 0;
    for (size_t i = 0; i < n; i++)
        if (g[i] != w[i] && bad++ == 0)
            fprintf(stderr, "  %s: %s[s=%d][%zu] = %d (0x%08x), reference %d (0x%08x)\n", what, tab, s, i, (int)g[i],
                    g[i], (int)w[i], w[i]);
    return bad;
}

/* every table of got against ref over ref's valid prefixes; flags too. Returns the entries that differ. */
static int plan_compare(const char *what, const st_moe_plan_t *got, const st_moe_plan_t *ref, const uint8_t *fgot,
                        const bool *fref, int T) {
    int S = ref->n_servers, E = ref->n_experts, M = ref->max_rows, bad = 0;
    for (int t = 0; t < T; t++)
        if ((fgot[t] != 0) != fref[t] && bad++ == 0)
            fprintf(stderr, "  %s: tok_failed[%d] = %d, reference %d\n", what, t, fgot[t], fref[t]);
    bad += diff32(what, "n_rows", -1, got->n_rows, ref->n_rows, (size_t)S);
    bad += diff32(what, "n_exp", -1, got->n_exp, ref->n_exp, (size_t)S);
    bad += diff32(what, "n_out", -1, got->n_out, ref->n_out, (size_t)S);
    bad += diff32(what, "n_uniq", -1, got->n_uniq, ref->n_uniq, (size_t)S);
    if (bad) return bad; /* the prefixes below are the counts' */
    for (int s = 0; s < S; s++) {
        size_t b = (size_t)s * M, nr = (size_t)ref->n_rows[s], nx = (size_t)ref->n_exp[s];
        bad += diff32(what, "exp_ids", s, got->exp_ids + (size_t)s * E, ref->exp_ids + (size_t)s * E, nx);
        bad +=
            diff32(what, "offsets", s, got->offsets + (size_t)s * (E + 1), ref->offsets + (size_t)s * (E + 1), nx + 1);
        bad += diff32(what, "pair", s, got->pair + b, ref->pair + b, nr);
        bad += diff32(what, "orow", s, got->orow + b, ref->orow + b, nr);
        bad += diff32(what, "src", s, got->src + b, ref->src + b, nr);
        bad += diff32(what, "wts", s, got->wts + b, ref->wts + b, nr); /* bit patterns */
        bad += diff32(what, "node", s, got->node + b, ref->node + b, (size_t)ref->n_out[s]);
        bad += diff32(what, "utok", s, got->utok + b, ref->utok + b, (size_t)ref->n_uniq[s]);
    }
    return bad;
}

/* what a case exercised, summed over the sweep (the sweep must reach each) */
static long long tot_pairs, tot_nodes, tot_fail_none, tot_multi_server_tokens;

static void plan_case(int T, int kc, int E, int S, int pl, uint64_t seed, bool check_compare) {
    st_rng_t r = {seed};
    const int M = T * kc + 5; /* a row stride that is not T·kc */
    const size_t N = (size_t)T * kc;
    int *ids = gt_xmalloc(4 * (N ? N : 1)), *cnt = gt_xmalloc(4 * (size_t)(T ? T : 1)), *so = gt_xmalloc(4 * (size_t)E);
    float *wts = gt_xmalloc(4 * (N ? N : 1));
    bool *fref = gt_xmalloc((size_t)(T ? T : 1)), *pre = gt_xmalloc((size_t)(T ? T : 1));
    uint8_t *fgot = gt_xmalloc((size_t)(T ? T : 1)), *f8 = gt_xmalloc((size_t)(T ? T : 1));
    for (int e = 0; e < E; e++) {
        so[e] = pl == PL_SCATTER_MARKED ? (int)(st_rng_next(&r) % (uint64_t)S) : (int)((long long)e * S / E);
        if (pl != PL_CONTIG) {
            uint64_t v = st_rng_next(&r) % 64;
            if (v < 2)
                so[e] = ST_MOE_PLAN_NONE; /* ~3 % */
            else if (v < 6)
                so[e] = ST_MOE_PLAN_SKIP; /* ~6 % */
        }
    }
    for (int t = 0; t < T; t++) {
        int kmax = kc < E ? kc : E, c = (int)(st_rng_next(&r) % (uint64_t)(kmax + 1));
        int win = st_rng_next(&r) % 2 ? E : (2 * kc < E ? 2 * kc : E); /* a narrow window: leaves share nodes */
        int lo = (int)(st_rng_next(&r) % (uint64_t)(E - win + 1));
        bool used[1024] = {false};
        for (int i = 0; i < c;) { /* c distinct ids in [lo, lo + win) (c ≤ win), then ascending */
            int e = lo + (int)(st_rng_next(&r) % (uint64_t)win);
            if (!used[e]) used[e] = true, i++;
        }
        int i = 0;
        for (int e = 0; e < E; e++)
            if (used[e]) ids[(size_t)t * kc + i++] = e;
        for (; i < kc; i++)
            ids[(size_t)t * kc + i] = (int)(st_rng_next(&r) % (uint64_t)E); /* past cnt: ignored */
        for (i = 0; i < kc; i++)
            wts[(size_t)t * kc + i] = (float)st_rng_uniform(&r);
        cnt[t] = c;
        pre[t] = st_rng_next(&r) % 20 == 0;
        f8[t] = pre[t] ? (uint8_t)(1 + st_rng_next(&r) % 255) : 0; /* any nonzero byte is a flag */
    }
    /* the reference */
    st_moe_plan_t ref = plan_alloc(S, E, M, false), got = plan_alloc(S, E, M, false);
    plan_poison(&ref, false);
    memcpy(fref, pre, (size_t)T);
    st_moe_dispatch_plan(&ref, ids, cnt, wts, so, fref, T, kc);
    for (int s = 0; s < S; s++)
        tot_pairs += ref.n_rows[s], tot_nodes += ref.n_out[s];
    for (int t = 0; t < T; t++) {
        tot_fail_none += fref[t] && !pre[t];
        int srv = -3, multi = 0;
        for (int i = 0; i < cnt[t]; i++) {
            int s = so[ids[(size_t)t * kc + i]];
            if (s >= 0 && srv != -3 && s != srv) multi = 1;
            if (s >= 0) srv = s;
        }
        tot_multi_server_tokens += multi && !fref[t];
    }

    /* the device */
    st_moe_plan_t d = plan_alloc(S, E, M, true);
    int *d_ids = gt_up(ids, 4 * (N ? N : 1)), *d_cnt = gt_up(cnt, 4 * (size_t)(T ? T : 1)),
        *d_so = gt_up(so, 4 * (size_t)E);
    float *d_wts = gt_up(wts, 4 * (N ? N : 1));
    uint8_t *d_f = gt_dev((size_t)(T ? T : 1));
    size_t wsb = st_cuda_moe_dispatch_plan_ws_bytes(T, kc, E, S);
    void *d_ws = gt_dev(wsb ? wsb : 1);
    for (int graph = 0; graph < 2; graph++) {
        plan_poison(&d, true), gt_poison(d_ws, wsb ? wsb : 1);
        if (T) GT_OK(st_gpu_memcpy_h2d(d_f, f8, (size_t)T));
        void *ge = NULL;
        if (graph) GT_OK(st_gpu_capture_begin(&gt_stream));
        GT_OK(st_cuda_moe_dispatch_plan(&gt_stream, &d, d_ids, d_cnt, d_wts, d_so, d_f, T, kc, d_ws, wsb));
        if (graph) {
            GT_OK(st_gpu_capture_end(&gt_stream, &ge));
            /* twice: the second run reads the flags the first set, which changes nothing */
            for (int k = 0; k < 2; k++)
                GT_OK(st_gpu_graph_launch(ge, &gt_stream));
            GT_OK(st_gpu_stream_sync(&gt_stream));
            st_gpu_graph_destroy(ge);
        }
        plan_poison(&got, false);
        plan_download(&got, &d);
        if (T) gt_down(fgot, d_f, (size_t)T);
        char what[160];
        snprintf(what, sizeof what, "dispatch_plan%s T=%d kc=%d E=%d S=%d %s", graph ? " (graph)" : "", T, kc, E, S,
                 pl_name[pl]);
        int bad = plan_compare(what, &got, &ref, fgot, fref, T);
        CHECK(bad == 0, "%s: %d entries differ", what, bad);
        for (int t = 0; t < T; t++) /* a flag set before stays as it was (not cleared, not rewritten) */
            bad += pre[t] && fgot[t] != f8[t];
        CHECK(bad == 0, "%s: flags set before are kept", what);
        if (check_compare && !graph) { /* the comparison catches one changed entry of each kind */
            int s = 0;
            while (s < S && ref.n_rows[s] == 0)
                s++;
            CHECK(s < S, "%s: some pairs sent", what);
            if (s < S) {
                size_t b = (size_t)s * M + (size_t)ref.n_rows[s] - 1;
                got.orow[b] ^= 1;
                CHECK(plan_compare("(expected to differ)", &got, &ref, fgot, fref, T) == 1, "a changed orow is caught");
                got.orow[b] ^= 1, got.utok[(size_t)s * M] ^= 1;
                CHECK(plan_compare("(expected to differ)", &got, &ref, fgot, fref, T) == 1, "a changed utok is caught");
                got.utok[(size_t)s * M] ^= 1, got.n_out[s]++;
                CHECK(plan_compare("(expected to differ)", &got, &ref, fgot, fref, T) >= 1,
                      "a changed count is caught");
                got.n_out[s]--;
                CHECK(plan_compare(what, &got, &ref, fgot, fref, T) == 0, "restored: equal again");
            }
        }
    }
    plan_free(&d, true), plan_free(&ref, false), plan_free(&got, false);
    st_gpu_free(d_ids), st_gpu_free(d_cnt), st_gpu_free(d_so), st_gpu_free(d_wts), st_gpu_free(d_f), st_gpu_free(d_ws);
    free(ids), free(cnt), free(so), free(wts), free(fref), free(pre), free(fgot), free(f8);
}

int main(void) {
    gt_init_or_skip("test_gpu_dispatch_plan");
    static const int Ts[] = {1, 7, 256, 4096, 8192 + 3}, kcs[] = {1, 8, 16}, Es[] = {8, 64, 896}, Ss[] = {1, 3, 64};
    uint64_t seed = 1;
    for (size_t a = 0; a < sizeof Ts / sizeof *Ts; a++)
        for (size_t b = 0; b < sizeof kcs / sizeof *kcs; b++)
            for (size_t c = 0; c < sizeof Es / sizeof *Es; c++)
                for (size_t d = 0; d < sizeof Ss / sizeof *Ss; d++)
                    for (int pl = 0; pl < PL_N; pl++) {
                        bool probe = Ts[a] == 256 && kcs[b] == 8 && Es[c] == 64 && Ss[d] == 3 && pl == PL_CONTIG;
                        plan_case(Ts[a], kcs[b], Es[c], Ss[d], pl, seed++, probe);
                    }
    plan_case(16384, 16, 1024, 64, PL_SCATTER_MARKED, 999, true); /* the largest supported shape */
    plan_case(16384, 16, 1024, 1, PL_CONTIG_MARKED, 998, false);
    plan_case(0, 8, 64, 3, PL_CONTIG, 997, false); /* no tokens: counts 0, offsets[0] 0 */
    printf("swept: %lld pairs, %lld nodes, %lld tokens failed by a NONE expert, %lld tokens over several servers\n",
           tot_pairs, tot_nodes, tot_fail_none, tot_multi_server_tokens);
    CHECK(tot_nodes < tot_pairs && tot_fail_none > 0 && tot_multi_server_tokens > 0,
          "the sweep exercises merged nodes, NONE experts and tokens split between servers");
    /* refused: kc past 16, a workspace too small */
    st_moe_plan_t d = plan_alloc(3, 64, 64, true);
    CHECK(st_cuda_moe_dispatch_plan(&gt_stream, &d, d.pair, d.pair, NULL, d.pair, (uint8_t *)d.node, 2, 17, d.utok,
                                    1 << 20) == ST_ERR_INVALID_ARG,
          "kc 17 refused");
    CHECK(st_cuda_moe_dispatch_plan(&gt_stream, &d, d.pair, d.pair, NULL, d.pair, (uint8_t *)d.node, 2, 8, d.utok,
                                    st_cuda_moe_dispatch_plan_ws_bytes(2, 8, 64, 3) - 1) == ST_ERR_INVALID_ARG,
          "a short workspace refused");
    plan_free(&d, true);
    return st_test_done();
}
