/* st_linear: vs the plain-loop reference and an fp64 oracle for every weight dtype and odd shapes,
 * and batch invariance: a row's output is bit-identical whatever T and position it comes with. */
#include <cblas.h>

#include "harness.h"
#include "strata/kernels.h"

static float urand(st_rng_t *r) { return (float)(2.0 * st_rng_uniform(r) - 1.0); }

typedef struct {
    st_weight_t w;
    void *data;
    uint8_t *scale;
    double *dense; /* [rows, cols] decoded values, fp64 */
} wbuf_t;

static void make_weight(wbuf_t *b, st_dtype_t dt, int rows, int cols, st_rng_t *r) {
    size_t n = (size_t)rows * cols;
    b->dense = malloc(n * sizeof(double));
    b->scale = NULL;
    b->w = (st_weight_t){.dtype = dt, .rows = rows, .cols = cols};
    if (dt == ST_DT_F32) {
        float *d = malloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++) b->dense[i] = d[i] = urand(r);
        b->data = d;
    } else if (dt == ST_DT_BF16 || dt == ST_DT_F16) {
        uint16_t *d = malloc(n * sizeof(uint16_t));
        for (size_t i = 0; i < n; i++) {
            float f = urand(r);
            d[i] = dt == ST_DT_BF16 ? st_f32_to_bf16(f) : st_f32_to_f16(f);
            b->dense[i] = dt == ST_DT_BF16 ? st_bf16_to_f32(d[i]) : st_f16_to_f32(d[i]);
        }
        b->data = d;
    } else { /* MXFP4: cols % 32 == 0 */
        uint8_t *codes = malloc(n / 2), *sc = malloc(n / 32);
        for (size_t i = 0; i < n / 2; i++) codes[i] = (uint8_t)(st_rng_next(r) & 0xff);
        for (size_t i = 0; i < n / 32; i++) sc[i] = (uint8_t)(122 + st_rng_next(r) % 6);
        b->data = codes;
        b->scale = sc;
        for (int i = 0; i < rows; i++)
            for (int c = 0; c < cols; c++) {
                uint8_t byte = codes[((size_t)i * cols + c) / 2];
                uint8_t nib = (c & 1) ? byte >> 4 : byte & 15;
                static const double e2m1[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
                double v = e2m1[nib & 7] * ldexp(1.0, sc[(size_t)i * (cols / 32) + c / 32] - 127);
                b->dense[(size_t)i * cols + c] = (nib & 8) ? -v : v;
            }
    }
    b->w.data = b->data;
    b->w.scale = b->scale;
}

static void free_weight(wbuf_t *b) {
    free(b->data);
    free(b->scale);
    free(b->dense);
}

static float *alloc_ws(const st_weight_t *w) { /* exact size (ASan sees overruns), NaN-poisoned */
    size_t n = st_linear_ws_floats(w);
    float *ws = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) ws[i] = NAN;
    return ws;
}

int main(void) {
    st_rng_t r = {42};
    const st_dtype_t dts[] = {ST_DT_F32, ST_DT_BF16, ST_DT_F16, ST_DT_MXFP4};
    const char *dtn[] = {"f32", "bf16", "f16", "mxfp4"};
    const int shapes[][2] = {{1, 32}, {7, 64}, {33, 96}, {300, 1024}, {17, 37}, {5, 1}, {129, 3}};
    const int Ts[] = {1, 2, 3, 7, 16, 33, 64};
    const int Tmax = 64 + 5;
    for (int di = 0; di < 4; di++)
        for (size_t si = 0; si < ST_ARRAY_LEN(shapes); si++) {
            int N = shapes[si][0], K = shapes[si][1];
            if (dts[di] == ST_DT_MXFP4 && K % 32) continue;
            wbuf_t wb;
            make_weight(&wb, dts[di], N, K, &r);
            float *x = malloc(sizeof(float) * Tmax * K), *y = malloc(sizeof(float) * Tmax * N);
            float *yr = malloc(sizeof(float) * Tmax * N), *alone = malloc(sizeof(float) * Tmax * N);
            float *y64 = malloc(sizeof(float) * Tmax * N);
            for (int i = 0; i < Tmax * K; i++) x[i] = urand(&r);
            float *ws = alloc_ws(&wb.w);
            char what[96];

            /* vs reference and fp64 */
            int T = 33;
            st_linear(y, x, &wb.w, T, ws);
            st_linear_ref(yr, x, &wb.w, T);
            for (int t = 0; t < T; t++)
                for (int n = 0; n < N; n++) {
                    double acc = 0;
                    for (int c = 0; c < K; c++) acc += (double)x[t * K + c] * wb.dense[(size_t)n * K + c];
                    y64[t * N + n] = (float)acc;
                }
            snprintf(what, sizeof what, "linear %s %dx%d vs ref", dtn[di], N, K);
            st_t_close(what, y, yr, (size_t)T * N, 1e-5, 1e-6);
            snprintf(what, sizeof what, "linear %s %dx%d vs fp64", dtn[di], N, K);
            st_t_close(what, y, y64, (size_t)T * N, 1e-5, 1e-6);
            snprintf(what, sizeof what, "linear_ref %s %dx%d vs fp64", dtn[di], N, K);
            st_t_close(what, yr, y64, (size_t)T * N, 1e-5, 1e-6);

            /* batch invariance: every row computed alone, then inside batches at varied offsets */
            for (int t = 0; t < Tmax; t++) st_linear(alone + (size_t)t * N, x + (size_t)t * K, &wb.w, 1, ws);
            for (size_t ti = 0; ti < ST_ARRAY_LEN(Ts); ti++) {
                int TT = Ts[ti], off = (int)(ti % 6);
                st_linear(y, x + (size_t)off * K, &wb.w, TT, ws);
                size_t bad = 0;
                for (size_t i = 0; i < (size_t)TT * N; i++)
                    bad += memcmp(&y[i], &alone[(size_t)off * N + i], sizeof(float)) != 0;
                CHECK(bad == 0, "%s %dx%d T=%d off=%d: %zu values differ bitwise from T=1", dtn[di], N,
                      K, TT, off, bad);
            }
            free(ws);
            free(x), free(y), free(yr), free(alone), free(y64);
            free_weight(&wb);
        }

    /* informational: what plain sgemm does (why st_linear blocks rows) */
    {
        int N = 64, K = 32, T = 7;
        float *W = malloc(sizeof(float) * N * K), *x = malloc(sizeof(float) * T * K);
        float *a = malloc(sizeof(float) * T * N), *b = malloc(sizeof(float) * N);
        for (int i = 0; i < N * K; i++) W[i] = urand(&r);
        for (int i = 0; i < T * K; i++) x[i] = urand(&r);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, N, K, 1.f, x, K, W, K, 0.f, a, N);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, 1, N, K, 1.f, x, K, W, K, 0.f, b, N);
        int diff = 0;
        for (int n = 0; n < N; n++) diff += memcmp(&a[n], &b[n], 4) != 0;
        printf("info: raw sgemm row 0, T=7 vs T=1: %d/%d values differ bitwise\n", diff, N);
        free(W), free(x), free(a), free(b);
    }

    /* st_gemm_nt vs fp64 */
    {
        int M = 13, N = 29, K = 71;
        float *A = malloc(sizeof(float) * M * K), *B = malloc(sizeof(float) * N * K);
        float *C = malloc(sizeof(float) * M * N), *C64 = malloc(sizeof(float) * M * N);
        for (int i = 0; i < M * K; i++) A[i] = urand(&r);
        for (int i = 0; i < N * K; i++) B[i] = urand(&r);
        st_gemm_nt(C, A, B, M, N, K);
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                double acc = 0;
                for (int c = 0; c < K; c++) acc += (double)A[i * K + c] * B[j * K + c];
                C64[i * N + j] = (float)acc;
            }
        st_t_close("gemm_nt vs fp64", C, C64, (size_t)M * N, 1e-5, 1e-6);
        free(A), free(B), free(C), free(C64);
    }
    return st_test_done();
}
