/* MLA attention cores (SPEC §4): the direct multi-head form over materialised k, v (prefill) and
 * the absorbed MQA form over the paged latent cache [c̃ ; k_pe] (decode). No projections here. */
#include <math.h>

#include "strata/kernels.h"

/* p[0..n) ← softmax(p); returns nothing; fp32 with the max subtracted */
static void softmax_inplace(float *p, int n) {
    float mx = -INFINITY;
    for (int s = 0; s < n; s++) mx = fmaxf(mx, p[s]);
    float sum = 0.0f;
    for (int s = 0; s < n; s++) {
        p[s] = expf(p[s] - mx);
        sum += p[s];
    }
    float inv = 1.0f / sum;
    for (int s = 0; s < n; s++) p[s] *= inv;
}

void st_mla_attn_direct(float *o, const float *q, const float *k, const float *v, int T, int n_ctx,
                        int H, int dqk, int dv, float scale, float *ws) {
    for (int t = 0; t < T; t++) {
        int n = n_ctx - T + t + 1; /* keys 0..pos */
        for (int h = 0; h < H; h++) {
            const float *qt = q + ((size_t)t * H + h) * dqk;
            for (int s = 0; s < n; s++) {
                const float *ks = k + ((size_t)s * H + h) * dqk;
                float acc = 0.0f;
                for (int c = 0; c < dqk; c++) acc += qt[c] * ks[c];
                ws[s] = acc * scale;
            }
            softmax_inplace(ws, n);
            float *ot = o + ((size_t)t * H + h) * dv;
            for (int j = 0; j < dv; j++) ot[j] = 0.0f;
            for (int s = 0; s < n; s++) {
                const float *vs = v + ((size_t)s * H + h) * dv;
                for (int j = 0; j < dv; j++) ot[j] += ws[s] * vs[j];
            }
        }
    }
}

void st_mla_attn_absorbed(float *o_lat, const float *q_abs, const st_kv_view_t *kv, int T, int H,
                          int kv_lora, float scale, float *ws) {
    const int R = kv->R;
    for (int t = 0; t < T; t++) {
        int n = kv->n - T + t + 1; /* rows 0..pos */
        for (int h = 0; h < H; h++) {
            const float *qt = q_abs + ((size_t)t * H + h) * R;
            for (int s = 0; s < n; s++) {
                const float *row = st_kv_row(kv, s); /* [c̃ (kv_lora) ; k_pe] */
                float acc = 0.0f;
                for (int c = 0; c < R; c++) acc += qt[c] * row[c];
                ws[s] = acc * scale;
            }
            softmax_inplace(ws, n);
            float *ot = o_lat + ((size_t)t * H + h) * kv_lora;
            for (int j = 0; j < kv_lora; j++) ot[j] = 0.0f;
            for (int s = 0; s < n; s++) {
                const float *row = st_kv_row(kv, s);
                for (int j = 0; j < kv_lora; j++) ot[j] += ws[s] * row[j];
            }
        }
    }
}

/* ---- paged-cache plumbing of the engine's MLA layer (pool [pages, page_size, R] fp32) ---- */
void st_mla_kv_store(float *pool, const float *ckv, const float *w, const int *tok_ent, const int *tok_pos,
                     const int *btab, int pps, int page_size, int T, int kvr, int R, float eps) {
    for (int t = 0; t < T; t++) {
        int pos = tok_pos[t], page = btab[(size_t)tok_ent[t] * pps + pos / page_size];
        float *dst = pool + ((size_t)page * page_size + pos % page_size) * R;
        st_rmsnorm(dst, ckv + (size_t)t * R, w, 1, kvr, eps);
        for (int c = kvr; c < R; c++) dst[c] = ckv[(size_t)t * R + c];
    }
}

void st_mla_qpe(float *qabs, const float *q, int T, int H, int nope, int rope, int kvr) {
    for (size_t th = 0; th < (size_t)T * H; th++)
        for (int c = 0; c < rope; c++) qabs[th * (kvr + rope) + kvr + c] = q[th * (nope + rope) + nope + c];
}

void st_mla_gather(float *c, const float *pool, const int *bt, int page_size, int n, int R) {
    for (int j = 0; j < n; j++)
        for (int x = 0; x < R; x++)
            c[(size_t)j * R + x] = pool[((size_t)bt[j / page_size] * page_size + j % page_size) * R + x];
}

void st_mla_kv_split(float *K, float *V, const float *Y, const float *c, int n, int H, int nope, int rope, int dv,
                     int R, int kvr) {
    int dqk = nope + rope;
    for (int j = 0; j < n; j++)
        for (int h = 0; h < H; h++) {
            const float *y = Y + ((size_t)j * H + h) * (nope + dv);
            float *k = K + ((size_t)j * H + h) * dqk, *v = V + ((size_t)j * H + h) * dv;
            for (int x = 0; x < nope; x++) k[x] = y[x];
            for (int x = 0; x < rope; x++) k[nope + x] = c[(size_t)j * R + kvr + x];
            for (int x = 0; x < dv; x++) v[x] = y[nope + x];
        }
}
