/* MLA absorbed decode on the GPU vs st_mla_attn_absorbed over a paged cache (pages shuffled in the
 * pool), head counts that pad the 64-head blocks (1, 7, 16, 20, 48), H = 128 (two 64-head blocks per
 * split), 16-row pages, one-row and empty contexts, a 32K context over many splits, a batch of 128;
 * 12- and 8-row pages (no 32-row TMA groups: v6 uses cp.async); outputs and workspace start
 * NaN-poisoned; every case runs directly and once more captured into a CUDA graph and replayed (as the
 * engine runs it). The batch of 300 has more work items than SMs: CTAs of the persistent grid take
 * several, with empty sequences' items skipped in between. */
#include <math.h>
#include <stdlib.h>

#include "gpu_test.h"
#include "strata/kernels.h"

#define DRW 576
#define DL 512

static void mla_case(const int *lens, int B, int H, int page_size, int split_len, uint64_t seed) {
    st_rng_t r = {seed};
    int max_ctx = 0, max_pages = 0, n_pages = 0;
    for (int b = 0; b < B; b++) {
        int np = (lens[b] + page_size - 1) / page_size;
        if (np > max_pages) max_pages = np;
        if (lens[b] > max_ctx) max_ctx = lens[b];
        n_pages += np;
    }
    n_pages += 1;
    size_t page_el = (size_t)page_size * DRW;
    float *pool = gt_xmalloc(4 * page_el * n_pages);
    uint16_t *poolb = gt_xmalloc(2 * page_el * n_pages);
    gt_randn_bf(pool, poolb, page_el * n_pages, 1.f, &r);
    int *bt = gt_xmalloc(sizeof(int) * B * (max_pages ? max_pages : 1));
    int next = 0;
    for (int b = 0; b < B; b++) /* page ids in reverse order of allocation, so pages interleave */
        for (int p = 0; p < (lens[b] + page_size - 1) / page_size; p++) bt[b * max_pages + p] = n_pages - 1 - (next++);
    size_t nq = (size_t)B * H * DRW;
    float *q = gt_xmalloc(4 * nq), *ref = gt_xmalloc(4 * (size_t)B * H * DL), *got = gt_xmalloc(4 * (size_t)B * H * DL);
    uint16_t *qb = gt_xmalloc(2 * nq), *ob = gt_xmalloc(2 * (size_t)B * H * DL);
    gt_randn_bf(q, qb, nq, 0.1f, &r);
    const float scale = 1.f / sqrtf(192.f);
    float **pages = gt_xmalloc(sizeof(float *) * (max_pages ? max_pages : 1));
    float *ws = gt_xmalloc(4 * (size_t)(max_ctx + 1));
    for (int b = 0; b < B; b++) {
        for (int p = 0; p < max_pages; p++) pages[p] = pool + (size_t)bt[b * max_pages + p] * page_el;
        st_kv_view_t kv = {.pages = pages, .page_size = page_size, .R = DRW, .n = lens[b]};
        st_mla_attn_absorbed(ref + (size_t)b * H * DL, q + (size_t)b * H * DRW, &kv, 1, H, DL, scale, ws);
    }
    uint16_t *d_pool = gt_up(poolb, 2 * page_el * n_pages), *d_q = gt_up(qb, 2 * nq);
    uint16_t *d_o = gt_dev(2 * (size_t)B * H * DL);
    int *d_bt = gt_up(bt, sizeof(int) * B * (max_pages ? max_pages : 1)), *d_len = gt_up(lens, sizeof(int) * B);
    size_t wsb = st_cuda_mla_decode_ws_bytes(B, H, max_ctx, split_len);
    void *d_ws = gt_dev(wsb);
    /* launched directly, then captured into a graph (as the engine runs it) and replayed twice, against
     * the same reference; outputs and workspace re-poisoned in between */
    for (int vi = 0; vi < 2; vi++) {
        gt_poison(d_o, 2 * (size_t)B * H * DL), gt_poison(d_ws, wsb);
        const bool graph = vi == 1;
        void *ge = NULL;
        if (graph) GT_OK(st_gpu_capture_begin(&gt_stream));
        GT_OK(st_cuda_mla_decode(&gt_stream, d_o, d_q, d_pool, d_bt, d_len, B, H, page_size, max_pages, max_ctx,
                                 split_len, scale, d_ws, wsb));
        if (graph) {
            GT_OK(st_gpu_capture_end(&gt_stream, &ge));
            for (int r = 0; r < 2; r++) GT_OK(st_gpu_graph_launch(ge, &gt_stream));
            GT_OK(st_gpu_stream_sync(&gt_stream));
            st_gpu_graph_destroy(ge);
        }
        gt_down(ob, d_o, 2 * (size_t)B * H * DL);
        gt_from_bf(got, ob, (size_t)B * H * DL);
        char what[160];
        snprintf(what, sizeof what, "mla_decode%s B=%d H=%d max_ctx=%d page=%d split=%d", graph ? " (graph)" : "", B,
                 H, max_ctx, page_size, split_len);
        st_t_close(what, got, ref, (size_t)B * H * DL, 2e-2, 1e-2);
    }
    st_gpu_free(d_pool), st_gpu_free(d_q), st_gpu_free(d_o), st_gpu_free(d_bt), st_gpu_free(d_len), st_gpu_free(d_ws);
    free(pool), free(poolb), free(bt), free(q), free(ref), free(got), free(qb), free(ob), free(pages), free(ws);
}

int main(void) {
    gt_init_or_skip("test_gpu_mla");
    static const int l1[] = {1}, l3[] = {1, 33, 1000}, l4[] = {4096, 77, 64, 2};
    mla_case(l1, 1, 1, 64, 64, 1);
    mla_case(l3, 3, 16, 64, 64, 2);
    mla_case(l3, 3, 20, 16, 1024, 3);
    mla_case(l4, 4, 7, 64, 256, 4);
    mla_case(l4, 4, 64, 64, 1024, 5);
    static const int l5[] = {4096, 1000, 1}, l6[] = {32768};
    mla_case(l5, 3, 128, 64, 512, 6);  /* all-heads kernel, 2 head groups */
    mla_case(l5, 3, 48, 16, 96, 7);    /* 64-head block with 16 padded heads, 16-row pages */
    mla_case(l6, 1, 64, 64, 512, 8);   /* 64 splits of one 32K sequence */
    int l7[128];
    for (int b = 0; b < 128; b++) l7[b] = b == 5 ? 0 : 1 + (b * 37) % 700;
    mla_case(l7, 128, 64, 64, 256, 9); /* batch 128, one empty sequence */
    int l9[300];
    for (int b = 0; b < 300; b++) l9[b] = b % 11 == 4 ? 0 : 1 + (b * 13) % 200;
    mla_case(l9, 300, 16, 64, 64, 12); /* 300 work items, more than SMs: several per CTA, empty ones between */
    static const int l8[] = {1000, 5, 77, 0, 640};
    mla_case(l8, 5, 64, 12, 64, 10);  /* 12-row pages: no 8-row groups for the TMA */
    mla_case(l8, 5, 16, 8, 128, 11);  /* 8-row pages: every TMA box from another page */
    return st_test_done();
}
