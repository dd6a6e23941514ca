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
