/* st_cuda_sample against st_sample_rows (kernels/sample.c) on random logits, every option: greedy
 * (planted ties), temperature, top-k (planted boundary ties), top-p, both, penalties from counts,
 * logit_bias lists (repeated ids), logprobs with 0..20 top entries, vocab sizes from 1 to K3's.
 * Tokens, top ids, processed logits and counts exactly; logprobs to 1e-5 (the rule's NOTE: CPU and GPU
 * agree except within double rounding, which random logits do not reach). */
#include <math.h>

#include "gpu_test.h"
#include "strata/kernels.h"

static void sample_case(int n, int V, uint64_t seed) {
    st_rng_t r = {seed};
    size_t N = (size_t)n * V, S = (size_t)n * ST_SAMPLE_MAX_TOP;
    int nb_max = 8 * n;
    float *x = gt_xmalloc(4 * N), *x_ref = gt_xmalloc(4 * N), *x_got = gt_xmalloc(4 * N);
    st_sample_row_t *rows = gt_xmalloc(sizeof *rows * n);
    uint32_t *bias_ids = gt_xmalloc(4 * (size_t)nb_max);
    float *bias_v = gt_xmalloc(4 * (size_t)nb_max);
    int *counts = gt_xmalloc(4 * N), *counts_got = gt_xmalloc(4 * N);
    int *id_ref = gt_xmalloc(4 * n), *id_got = gt_xmalloc(4 * n), *tid_ref = gt_xmalloc(4 * S),
        *tid_got = gt_xmalloc(4 * S);
    float *lp_ref = gt_xmalloc(4 * n), *lp_got = gt_xmalloc(4 * n), *tlp_ref = gt_xmalloc(4 * S),
          *tlp_got = gt_xmalloc(4 * S);
    for (size_t i = 0; i < N; i++)
        x[i] = 3.f * st_rng_normal(&r);
    for (size_t i = 0; i < N; i++)
        counts[i] = st_rng_uniform(&r) < 0.05 ? 1 + (int)(4 * st_rng_uniform(&r)) : 0;
    int nb = 0;
    for (int i = 0; i < n; i++) {
        int kind = i % 8;
        st_sample_row_t *p = &rows[i];
        *p = (st_sample_row_t){.temperature = kind == 0 ? 0.f : (float)(0.3 + 1.5 * st_rng_uniform(&r)),
                               .top_p = 1.f,
                               .n_top = -1,
                               .row = n - 1 - i,
                               .count_row = -1,
                               .seed = st_rng_next(&r),
                               .pos = (uint32_t)(st_rng_next(&r) % 4096)};
        if (kind == 2 || kind == 4 || kind == 7) p->top_k = 1 + (int)(st_rng_uniform(&r) * ST_MIN(V, 64));
        if (kind == 3 || kind == 4 || kind == 7) p->top_p = (float)(0.05 + 0.9 * st_rng_uniform(&r));
        if (kind == 5 || kind == 7) {
            p->presence = (float)(4 * st_rng_uniform(&r) - 2), p->frequency = (float)(4 * st_rng_uniform(&r) - 2);
            p->count_row = (i * 7) % n; /* some other row of counts, distinct per row */
        } else if (i & 1) {
            p->count_row = (i * 7) % n; /* counted, no penalties */
        }
        if (kind == 6 || kind == 7 || (kind == 0 && (i & 8))) {
            p->bias_off = nb;
            p->n_bias = 1 + (int)(st_rng_uniform(&r) * 7);
            for (int j = 0; j < p->n_bias; j++, nb++) {
                bias_ids[nb] =
                    j == 3 ? bias_ids[nb - 1] : (uint32_t)(st_rng_next(&r) % (uint64_t)(V + 2)); /* ≥ V ignored */
                bias_v[nb] = (float)(200 * st_rng_uniform(&r) - 100);
            }
        }
        float *row = x + (size_t)p->row * V;
        if (i % 3 == 0) p->n_top = (int)(st_rng_next(&r) % (ST_SAMPLE_MAX_TOP + 1));
        if (i % 5 == 1 && V > 4) row[V / 2] = row[V - 1] = 50.f; /* a tie at the max */
        if (kind == 2 && V > 8)                                  /* a tie at the top-k boundary: many equal values */
            for (int j = 0; j < V; j += 3)
                row[j] = 7.0f; /* ~1% of 3·N(0,1) lie above */
    }
    memcpy(x_ref, x, 4 * N);
    float *d_x = gt_up(x, 4 * N), *d_bv = gt_up(bias_v, 4 * (size_t)(nb ? nb : 1));
    uint32_t *d_bi = gt_up(bias_ids, 4 * (size_t)(nb ? nb : 1));
    st_sample_row_t *d_rows = gt_up(rows, sizeof *rows * n);
    int *d_cnt = gt_up(counts, 4 * N), *d_id = gt_dev(4 * n), *d_tid = gt_dev(4 * S);
    float *d_lp = gt_dev(4 * n), *d_tlp = gt_dev(4 * S);
    memset(tid_ref, 0xff, 4 * S), memset(tlp_ref, 0xff, 4 * S), memset(lp_ref, 0xff, 4 * (size_t)n);
    st_sample_rows(id_ref, lp_ref, tid_ref, tlp_ref, x_ref, n, V, rows, bias_ids, bias_v, counts);
    GT_OK(st_cuda_sample(&gt_stream, d_id, d_lp, d_tid, d_tlp, d_x, n, V, d_rows, d_bi, d_bv, d_cnt));
    gt_down(id_got, d_id, 4 * n);
    gt_down(x_got, d_x, 4 * N);
    gt_down(counts_got, d_cnt, 4 * N);
    gt_down(lp_got, d_lp, 4 * n);
    gt_down(tid_got, d_tid, 4 * S);
    gt_down(tlp_got, d_tlp, 4 * S);
    int bad_id = 0, bad_x = 0, bad_top = 0, first = -1;
    double lp_err = 0;
    for (int i = 0; i < n; i++) {
        if (id_got[i] != id_ref[i] && first < 0) first = i;
        bad_id += id_got[i] != id_ref[i];
        if (rows[i].n_top < 0) continue;
        lp_err = fmax(lp_err, fabs((double)lp_got[i] - lp_ref[i]));
        for (int j = 0; j < ST_MIN(rows[i].n_top, V); j++) {
            size_t o = (size_t)i * ST_SAMPLE_MAX_TOP + j;
            bad_top += tid_got[o] != tid_ref[o];
            lp_err = fmax(lp_err, fabs((double)tlp_got[o] - tlp_ref[o]));
        }
    }
    for (size_t i = 0; i < N; i++)
        bad_x += memcmp(&x_got[i], &x_ref[i], 4) != 0;
    CHECK(bad_id == 0, "sample n=%d V=%d: %d tokens differ (first row %d: got %d want %d)", n, V, bad_id, first,
          first >= 0 ? id_got[first] : 0, first >= 0 ? id_ref[first] : 0);
    CHECK(bad_x == 0, "sample n=%d V=%d: %d processed logits differ", n, V, bad_x);
    CHECK(memcmp(counts_got, counts, 4 * N) == 0, "sample n=%d V=%d: counts differ", n, V);
    CHECK(bad_top == 0 && lp_err <= 1e-5, "sample n=%d V=%d: %d top ids differ, logprob max error %.2e", n, V, bad_top,
          lp_err);
    st_gpu_free(d_x), st_gpu_free(d_bv), st_gpu_free(d_bi), st_gpu_free(d_rows), st_gpu_free(d_cnt), st_gpu_free(d_id);
    st_gpu_free(d_tid), st_gpu_free(d_lp), st_gpu_free(d_tlp);
    free(x), free(x_ref), free(x_got), free(rows), free(bias_ids), free(bias_v), free(counts), free(counts_got);
    free(id_ref), free(id_got), free(tid_ref), free(tid_got), free(lp_ref), free(lp_got), free(tlp_ref), free(tlp_got);
}

int main(void) {
    gt_init_or_skip("test_gpu_sample");
    sample_case(1, 1, 1);
    sample_case(8, 7, 2);
    sample_case(16, 1000, 3);
    sample_case(64, 1027, 4); /* odd vocab, every kind of row 8 times */
    sample_case(40, 32000, 5);
    sample_case(24, 163840, 6); /* K3's vocab */
    sample_case(256, 258, 7);   /* the byte tokenizer's vocab at batch 256 */
    return st_test_done();
}
