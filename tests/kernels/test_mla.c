/* MLA: absorbed (latent MQA over a paged cache) vs direct (materialised per-head k, v), and the
 * direct form vs fp64; page sizes 1, 3, 64; one query and several causal queries. */
#include "harness.h"
#include "strata/kernels.h"

static float urand(st_rng_t *r, float a) { return (float)(a * (2.0 * st_rng_uniform(r) - 1.0)); }

enum { H = 3, NOPE = 16, ROPE = 8, DV = 12, LORA = 32, R = LORA + ROPE, DQK = NOPE + ROPE };

static void run(int n, int T, int page_size, st_rng_t *r) {
    /* W_UKV [H*(NOPE+DV), LORA]: per head NOPE rows of W_UK then DV rows of W_UV */
    float *Wukv = malloc(sizeof(float) * H * (NOPE + DV) * LORA);
    for (int i = 0; i < H * (NOPE + DV) * LORA; i++) Wukv[i] = urand(r, 0.3f);
    int n_pages = (n + page_size - 1) / page_size;
    float **pages = malloc(sizeof(float *) * n_pages);
    for (int p = 0; p < n_pages; p++) {
        pages[p] = malloc(sizeof(float) * page_size * R);
        for (int i = 0; i < page_size * R; i++) pages[p][i] = NAN; /* rows past n must not be read */
    }
    st_kv_view_t kv = {.pages = pages, .page_size = page_size, .R = R, .n = n};
    for (int s = 0; s < n; s++) {
        float *row = st_kv_row(&kv, s);
        for (int c = 0; c < R; c++) row[c] = urand(r, 1.0f);
    }
    float *q = malloc(sizeof(float) * T * H * DQK);
    for (int i = 0; i < T * H * DQK; i++) q[i] = urand(r, 1.0f);
    float scale = 1.0f / sqrtf((float)DQK);

    /* direct: k_h,s = [W_UK,h c̃_s ; k_pe_s], v_h,s = W_UV,h c̃_s */
    float *k = malloc(sizeof(float) * n * H * DQK), *v = malloc(sizeof(float) * n * H * DV);
    for (int s = 0; s < n; s++) {
        const float *row = st_kv_row(&kv, s);
        for (int h = 0; h < H; h++) {
            for (int i = 0; i < NOPE + DV; i++) {
                const float *w = Wukv + (size_t)(h * (NOPE + DV) + i) * LORA;
                float acc = 0;
                for (int c = 0; c < LORA; c++) acc += w[c] * row[c];
                if (i < NOPE) k[(s * H + h) * DQK + i] = acc;
                else v[(s * H + h) * DV + i - NOPE] = acc;
            }
            for (int c = 0; c < ROPE; c++) k[(s * H + h) * DQK + NOPE + c] = row[LORA + c];
        }
    }
    float *od = malloc(sizeof(float) * T * H * DV), *ws = malloc(sizeof(float) * n);
    for (int i = 0; i < n; i++) ws[i] = NAN;
    st_mla_attn_direct(od, q, k, v, T, n, H, DQK, DV, scale, ws);

    /* fp64 of the direct form */
    float *o64 = malloc(sizeof(float) * T * H * DV);
    double *p = malloc(sizeof(double) * n);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            int m = n - T + t + 1;
            double mx = -INFINITY, sum = 0;
            for (int s = 0; s < m; s++) {
                double acc = 0;
                for (int c = 0; c < DQK; c++) acc += (double)q[(t * H + h) * DQK + c] * k[(s * H + h) * DQK + c];
                p[s] = acc * scale;
                if (p[s] > mx) mx = p[s];
            }
            for (int s = 0; s < m; s++) sum += (p[s] = exp(p[s] - mx));
            for (int j = 0; j < DV; j++) {
                double acc = 0;
                for (int s = 0; s < m; s++) acc += p[s] * v[(s * H + h) * DV + j];
                o64[(t * H + h) * DV + j] = (float)(acc / sum);
            }
        }

    /* absorbed: q_abs = [W_UK,hᵀ q_nope ; q_pe], then o_h = W_UV,h ō_h */
    float *qa = malloc(sizeof(float) * T * H * R), *olat = malloc(sizeof(float) * T * H * LORA);
    float *oa = malloc(sizeof(float) * T * H * DV);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            float *dst = qa + (t * H + h) * R;
            const float *qn = q + (t * H + h) * DQK;
            for (int c = 0; c < LORA; c++) {
                float acc = 0;
                for (int i = 0; i < NOPE; i++) acc += Wukv[(size_t)(h * (NOPE + DV) + i) * LORA + c] * qn[i];
                dst[c] = acc;
            }
            for (int c = 0; c < ROPE; c++) dst[LORA + c] = qn[NOPE + c];
        }
    for (int i = 0; i < n; i++) ws[i] = NAN;
    st_mla_attn_absorbed(olat, qa, &kv, T, H, LORA, scale, ws);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++)
            for (int j = 0; j < DV; j++) {
                const float *w = Wukv + (size_t)(h * (NOPE + DV) + NOPE + j) * LORA;
                float acc = 0;
                for (int c = 0; c < LORA; c++) acc += w[c] * olat[(t * H + h) * LORA + c];
                oa[(t * H + h) * DV + j] = acc;
            }
    char what[96];
    snprintf(what, sizeof what, "absorbed vs direct n=%d T=%d page=%d", n, T, page_size);
    st_t_close(what, oa, od, (size_t)T * H * DV, 1e-5, 0);
    snprintf(what, sizeof what, "direct vs fp64 n=%d T=%d page=%d", n, T, page_size);
    st_t_close(what, od, o64, (size_t)T * H * DV, 1e-5, 0);

    for (int pg = 0; pg < n_pages; pg++) free(pages[pg]);
    free(pages), free(Wukv), free(q), free(k), free(v), free(od), free(ws), free(o64), free(p);
    free(qa), free(olat), free(oa);
}

int main(void) {
    st_rng_t r = {99};
    const int pages[] = {1, 3, 64}, ns[] = {1, 5, 70, 130};
    for (int pi = 0; pi < 3; pi++)
        for (int ni = 0; ni < 4; ni++) {
            run(ns[ni], 1, pages[pi], &r);
            if (ns[ni] > 1) run(ns[ni], ST_MIN(ns[ni], 7), pages[pi], &r);
            run(ns[ni], ns[ni], pages[pi], &r); /* whole prefill */
        }
    return st_test_done();
}
