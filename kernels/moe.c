/* MoE dispatch and combine (SPEC §6): routed slots grouped by expert, the latent rows gathered into
 * that order, and the weighted combine of the expert outputs by the summation tree over expert ids. */
#include <math.h>
#include <string.h>

#include "strata/kernels.h"
#include "strata/moe_tree.h"

void st_moe_group(int *offsets, int *row_of, const int *ids, const int *cnt, int T, int kc, int E) {
    memset(offsets, 0, (size_t)(E + 1) * sizeof(int));
    for (int t = 0; t < T; t++)
        for (int i = 0; i < cnt[t]; i++) offsets[ids[(size_t)t * kc + i] + 1]++;
    for (int e = 0; e < E; e++) offsets[e + 1] += offsets[e];
    for (int e = 0; e < E; e++) /* rows of expert e in (t, i) order */
        for (int t = 0, r = offsets[e]; t < T; t++)
            for (int i = 0; i < cnt[t]; i++)
                if (ids[(size_t)t * kc + i] == e) row_of[(size_t)t * kc + i] = r++;
    for (int t = 0; t < T; t++)
        for (int i = cnt[t]; i < kc; i++) row_of[(size_t)t * kc + i] = -1;
}

void st_moe_gather(float *xg, const float *z, const int *row_of, const int *cnt, int T, int kc, int l) {
    for (int t = 0; t < T; t++)
        for (int i = 0; i < cnt[t]; i++)
            memcpy(xg + (size_t)row_of[(size_t)t * kc + i] * l, z + (size_t)t * l, (size_t)l * sizeof(float));
}

void st_moe_expand(uint16_t *dst, const void *rows, bool bf16, const uint32_t *src, int n, int n_in, int w) {
    const float *rf = rows;
    const uint16_t *rb = rows;
    for (int r = 0; r < n; r++)
        for (int c = 0; c < w; c++) {
            size_t i = (size_t)src[r] * w + c;
            dst[(size_t)r * w + c] = src[r] >= (uint32_t)n_in ? 0 : bf16 ? rb[i] : st_f32_to_bf16(rf[i]);
        }
}

void st_moe_tree_rows(float *v, uint32_t *ids, int n, int l) {
    for (int h = 0; n > 1; h++) { /* n > 1 ends by h = 31: ids < 2^32 all agree above bit 31 */
        int m = 0;
        for (int i = 0; i < n; m++) {
            float *dst = v + (size_t)m * l;
            if (i + 1 < n && ids[i] >> h >> 1 == ids[i + 1] >> h >> 1) { /* siblings at level h + 1 */
                const float *a = v + (size_t)i * l, *b = v + (size_t)(i + 1) * l;
                for (int c = 0; c < l; c++) dst[c] = a[c] + b[c];
                ids[m] = ids[i];
                i += 2;
            } else { /* alone in its node: passes up unchanged */
                if (m != i) memcpy(dst, v + (size_t)i * l, (size_t)l * sizeof(float));
                ids[m] = ids[i];
                i++;
            }
        }
        n = m;
    }
}

int st_moe_leaf_table(uint32_t *off, uint32_t *row, uint32_t *id, float *lp, const uint32_t *orow, const float *p,
                      const uint32_t *offsets, const uint32_t *expert_ids, int n_exp, int n_out) {
    uint32_t n = offsets[n_exp];
    memset(off, 0, sizeof(uint32_t) * ((size_t)n_out + 1));
    for (uint32_t r = 0; r < n; r++) off[orow[r] + 1]++;
    for (int o = 0; o < n_out; o++) off[o + 1] += off[o];
    /* pairs in grouped order, so each row's leaves come out in pair order; row o's cursor is off[o],
     * shifted back afterwards */
    for (int k = 0; k < n_exp; k++)
        for (uint32_t r = offsets[k]; r < offsets[k + 1]; r++) {
            uint32_t at = off[orow[r]]++;
            row[at] = r, id[at] = expert_ids[k], lp[at] = p[r];
        }
    for (int o = n_out; o > 0; o--) off[o] = off[o - 1];
    off[0] = 0;
    for (int o = 0; o < n_out; o++)
        for (uint32_t k = off[o] + 1; k < off[o + 1]; k++)
            if (id[k] == id[k - 1]) return o;
    return -1;
}

void st_moe_tree_reduce(float *out, const float *y, const uint32_t *off, const uint32_t *row, const uint32_t *id,
                        const float *p, int n_out, int l) {
    st_moe_tree_t s;
    for (int o = 0; o < n_out; o++)
        for (int c = 0; c < l; c++) {
            st_moe_tree_init(&s);
            for (uint32_t k = off[o]; k < off[o + 1]; k++) st_moe_tree_push(&s, id[k], p[k] * y[(size_t)row[k] * l + c] + 0.0f);
            out[(size_t)o * l + c] = st_moe_tree_end(&s);
        }
}

void st_moe_combine(float *u, float *partial, const float *yg, const float *yf, const float *const *at, const int *row_of,
                    const float *p, const int *ids, const int *cnt, const float *norm_w, int T, int kc, int l, float eps) {
    st_moe_tree_t s;
    for (int t = 0; t < T; t++) {
        float *ut = u ? u + (size_t)t * l : NULL;
        for (int c = 0; c < l; c++) {
            float a;
            if (!p && at) {
                st_moe_tree_init(&s);
                for (int i = 0; i < cnt[t]; i++) {
                    size_t k = (size_t)t * kc + i;
                    if (at[k]) st_moe_tree_push(&s, (uint32_t)ids[k], at[k][c]);
                }
                a = st_moe_tree_end(&s);
            } else if (!p) {
                a = yf[(size_t)t * l + c];
            } else {
                st_moe_tree_init(&s);
                for (int i = 0; i < cnt[t]; i++) {
                    size_t k = (size_t)t * kc + i;
                    const float *y = yg ? yg + (size_t)row_of[k] * l : yf + k * l;
                    st_moe_tree_push(&s, (uint32_t)ids[k], p[k] * y[c] + 0.0f);
                }
                a = st_moe_tree_end(&s);
            }
            if (ut) ut[c] = a;
            else partial[(size_t)t * l + c] += a;
        }
        if (ut && norm_w) st_rmsnorm(ut, ut, norm_w, 1, l, eps);
    }
}

void st_moe_finish_nodes(float *u, const float *const *at, const int *ids, const int *cnt, int T, int kc, int l,
                         float *scratch, uint32_t *tid) {
    size_t rb = sizeof(float) * (size_t)l;
    for (int t = 0; t < T; t++) {
        float *v = scratch + (size_t)t * kc * l, *ut = u + (size_t)t * l;
        const float *const *a = at + (size_t)t * kc;
        int m = 0, first = -1, last = -1;
        for (int i = 0; i < cnt[t]; i++)
            if (a[i]) tid[m++] = (uint32_t)ids[(size_t)t * kc + i], first = first < 0 ? i : first, last = i;
        if (m == 0) {
            memset(ut, 0, rb);
        } else if (m == 1) { /* the tree over one node is that node */
            memcpy(ut, a[last], rb);
        } else if (m == 2) { /* two nodes meet at their lowest common node: one sum */
            const float *x = a[first], *y = a[last];
            for (int c = 0; c < l; c++) ut[c] = x[c] + y[c];
        } else {
            /* packed in leaf order: row j ≤ its slot i, so a row that lies in this token's rows of
             * scratch is read before it is overwritten */
            for (int i = 0, j = 0; i < cnt[t]; i++) {
                if (!a[i]) continue;
                if (a[i] != v + (size_t)j * l) memcpy(v + (size_t)j * l, a[i], rb);
                j++;
            }
            st_moe_tree_rows(v, tid, m, l);
            memcpy(ut, v, rb);
        }
    }
}
