/* Linear layers y = x·Wᵀ on the CPU: OpenBLAS sgemm over fp32 weight panels (non-F32 weights decoded
 * panel by panel into the caller's workspace), plus the plain-loop reference. */
#include <cblas.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "strata/kernels.h"

/* NOTE: batch invariance. OpenBLAS 0.3.21 does not give a row the same bits for different T: M=1
 * goes through a gemv-like path and, on the Haswell/Zen kernels, rows in a 16-row call land in
 * different micro-kernel edge paths depending on their position. Every sgemm here therefore gets
 * exactly LIN_TB token rows (the last block zero-padded), so a row's arithmetic is the same
 * whatever T is. LIN_TB = 8 was measured position-invariant on the Haswell, Zen, SkylakeX,
 * Cooperlake and Sandybridge kernels, 1 and 2 threads; 16 was not (Haswell/Zen). test_linear
 * checks it bitwise. */
#define LIN_TB 8

/* Weight rows per panel: a fixed function of the weight's width (never of T), so the panel
 * geometry cannot make results batch-dependent. Aim at ~256 KiB of fp32 per panel. */
static int lin_panel_rows(const st_weight_t *W) {
    int p = (int)((256u * 1024u / sizeof(float)) / (size_t)(W->cols > 0 ? W->cols : 1));
    p = p / 16 * 16;
    if (p < 16) p = 16;
    if (p > 256) p = 256;
    if (p > W->rows) p = W->rows;
    return p > 0 ? p : 1;
}

/* ---- panel-parallel threads ----
 * Weight panels are independent, so st_linear hands whole panels to a small pool of threads fixed
 * at first use (STRATA_THREADS, default: online CPUs, at most 16). Every panel is still computed by
 * exactly the same sgemm calls whatever thread runs it, so results are bit-identical to one thread.
 * OpenBLAS is set to one thread when the pool has several (nested threading only oversubscribes).
 * NOTE: the pool serves one st_linear at a time; a concurrent caller runs its panels alone. */
#define LIN_MAX_THREADS 16

typedef struct {
    float *y;
    const float *x;
    const st_weight_t *W;
    int T;
    float *ws;
    size_t ws_per;
    int next_panel, n_panels, pending;
} lin_job_t;

static struct {
    pthread_once_t once;
    int n; /* threads in all, the caller included */
    pthread_mutex_t mu, busy;
    pthread_cond_t go, done;
    uint64_t gen;
    lin_job_t job;
} g_lin = {.once = PTHREAD_ONCE_INIT};

static size_t ws_one(const st_weight_t *W) {
    size_t P = (size_t)lin_panel_rows(W), K = (size_t)W->cols;
    size_t n = LIN_TB * K + LIN_TB * P; /* padded x block, padded y block */
    if (W->dtype != ST_DT_F32) n += P * K; /* decoded panel */
    return (n + 15) / 16 * 16;
}

/* panel r0..r0+n of y = x·Wᵀ with this thread's workspace */
static void lin_panel(float *y, const float *x, const st_weight_t *W, int T, int r0, float *ws) {
    const int N = W->rows, K = W->cols, P = lin_panel_rows(W), n = ST_MIN(P, N - r0);
    float *xb = ws;                      /* [LIN_TB, K] */
    float *yb = xb + (size_t)LIN_TB * K; /* [LIN_TB, P] */
    float *wp = yb + (size_t)LIN_TB * P; /* [P, K], non-F32 only */
    int t_full = T / LIN_TB * LIN_TB, t_rem = T - t_full;
    const float *Wp;
    if (W->dtype == ST_DT_F32) {
        Wp = (const float *)W->data + (size_t)r0 * K;
    } else {
        st_weight_rows_f32(W, r0, n, wp);
        Wp = wp;
    }
    for (int t0 = 0; t0 < t_full; t0 += LIN_TB)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, LIN_TB, n, K, 1.0f, x + (size_t)t0 * K, K, Wp, K, 0.0f,
                    y + (size_t)t0 * N + r0, N);
    if (t_rem) {
        memcpy(xb, x + (size_t)t_full * K, (size_t)t_rem * K * sizeof(float));
        memset(xb + (size_t)t_rem * K, 0, (size_t)(LIN_TB - t_rem) * K * sizeof(float));
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, LIN_TB, n, K, 1.0f, xb, K, Wp, K, 0.0f, yb, n);
        for (int t = 0; t < t_rem; t++)
            memcpy(y + (size_t)(t_full + t) * N + r0, yb + (size_t)t * n, (size_t)n * sizeof(float));
    }
}

/* take panels until none is left; thread `me` uses workspace slice `me` */
static void lin_work(lin_job_t *j, int me) {
    int P = lin_panel_rows(j->W);
    for (;;) {
        pthread_mutex_lock(&g_lin.mu);
        int p = j->next_panel < j->n_panels ? j->next_panel++ : -1;
        pthread_mutex_unlock(&g_lin.mu);
        if (p < 0) return;
        lin_panel(j->y, j->x, j->W, j->T, p * P, j->ws + (size_t)me * j->ws_per);
    }
}

static void *lin_thread(void *arg) {
    int me = (int)(intptr_t)arg;
    uint64_t seen = 0;
    st_cpu_data_thread("st-linear");
    pthread_mutex_lock(&g_lin.mu);
    for (;;) {
        while (g_lin.gen == seen) pthread_cond_wait(&g_lin.go, &g_lin.mu);
        seen = g_lin.gen;
        pthread_mutex_unlock(&g_lin.mu);
        lin_work(&g_lin.job, me);
        pthread_mutex_lock(&g_lin.mu);
        if (--g_lin.job.pending == 0) pthread_cond_signal(&g_lin.done);
    }
    return NULL;
}

static void lin_init(void) {
    long n = st_tun_int(ST_TUN_THREADS); /* 0: one per online CPU */
    if (n == 0) n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) n = 1;
    if (n > LIN_MAX_THREADS) n = LIN_MAX_THREADS;
    pthread_mutex_init(&g_lin.mu, NULL);
    pthread_mutex_init(&g_lin.busy, NULL);
    pthread_cond_init(&g_lin.go, NULL);
    pthread_cond_init(&g_lin.done, NULL);
    g_lin.n = 1;
    for (long i = 1; i < n; i++) {
        pthread_t t;
        pthread_attr_t a;
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&t, &a, lin_thread, (void *)(intptr_t)i) == 0) g_lin.n++;
        pthread_attr_destroy(&a);
    }
    if (g_lin.n > 1) openblas_set_num_threads(1);
}

static int lin_threads(void) {
    pthread_once(&g_lin.once, lin_init);
    return g_lin.n;
}

size_t st_linear_ws_floats(const st_weight_t *W) { return ws_one(W) * (size_t)lin_threads(); }

void st_linear(float *y, const float *x, const st_weight_t *W, int T, float *ws) {
    const int N = W->rows, K = W->cols, P = lin_panel_rows(W);
    if (T <= 0 || N <= 0) return;
    if (K == 0) {
        memset(y, 0, (size_t)T * N * sizeof(float));
        return;
    }
    int n_panels = (N + P - 1) / P, nt = lin_threads();
    /* small products (a decode step's projections) are not worth waking threads for */
    if (nt == 1 || n_panels == 1 || (size_t)T * N * K < (1u << 20) || pthread_mutex_trylock(&g_lin.busy) != 0) {
        for (int p = 0; p < n_panels; p++) lin_panel(y, x, W, T, p * P, ws);
        return;
    }
    pthread_mutex_lock(&g_lin.mu);
    g_lin.job = (lin_job_t){.y = y, .x = x, .W = W, .T = T, .ws = ws, .ws_per = ws_one(W), .n_panels = n_panels,
                            .pending = nt - 1};
    g_lin.gen++;
    pthread_cond_broadcast(&g_lin.go);
    pthread_mutex_unlock(&g_lin.mu);
    lin_work(&g_lin.job, 0);
    pthread_mutex_lock(&g_lin.mu);
    while (g_lin.job.pending > 0) pthread_cond_wait(&g_lin.done, &g_lin.mu);
    pthread_mutex_unlock(&g_lin.mu);
    pthread_mutex_unlock(&g_lin.busy);
}

/* one element of W as fp32 */
static float weight_at(const st_weight_t *W, int r, int c) {
    size_t i = (size_t)r * (size_t)W->cols + (size_t)c;
    switch (W->dtype) {
    /* NOTE: element loads through memcpy: a tensor in a mapped shard may sit at any offset */
    case ST_DT_F32: {
        float f;
        memcpy(&f, (const uint8_t *)W->data + 4 * i, 4);
        return f;
    }
    case ST_DT_BF16:
    case ST_DT_F16: {
        uint16_t h;
        memcpy(&h, (const uint8_t *)W->data + 2 * i, 2);
        return W->dtype == ST_DT_BF16 ? st_bf16_to_f32(h) : st_f16_to_f32(h);
    }
    case ST_DT_U8: return (float)((const uint8_t *)W->data)[i];
    case ST_DT_MXFP4: {
        uint8_t b = ((const uint8_t *)W->data)[i / 2];
        uint8_t nib = (c & 1) ? (uint8_t)(b >> 4) : (uint8_t)(b & 15);
        return st_mxfp4_value(nib, W->scale[(size_t)r * (size_t)(W->cols / 32) + (size_t)c / 32]);
    }
    }
    return 0.0f;
}

void st_linear_ref(float *y, const float *x, const st_weight_t *W, int T) {
    for (int t = 0; t < T; t++)
        for (int r = 0; r < W->rows; r++) {
            float acc = 0.0f;
            for (int c = 0; c < W->cols; c++) acc += x[(size_t)t * W->cols + c] * weight_at(W, r, c);
            y[(size_t)t * W->rows + r] = acc;
        }
}

void st_gemm_nt(float *C, const float *A, const float *B, int M, int N, int K) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        memset(C, 0, (size_t)M * N * sizeof(float));
        return;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, A, K, B, K, 0.0f, C, N);
}

void st_sgemm(float *y, int ldy, const float *x, int ldx, const float *W, int T, int N, int K) {
    for (int t = 0; t < T; t++)
        for (int n = 0; n < N; n++) {
            float a = 0.0f;
            for (int k = 0; k < K; k++) a += x[(size_t)t * ldx + k] * W[(size_t)n * K + k];
            y[(size_t)t * ldy + n] = a;
        }
}

void st_linear_heads(float *y, int ldy, long long sy, const float *x, int ldx, long long sx, const float *W, int ldw,
                     long long sw, bool trans_w, int T, int N, int K, int H) {
    for (int h = 0; h < H; h++)
        for (int t = 0; t < T; t++)
            for (int n = 0; n < N; n++) {
                const float *xr = x + h * sx + (size_t)t * ldx, *Wh = W + h * sw;
                float a = 0.0f;
                for (int k = 0; k < K; k++) a += xr[k] * (trans_w ? Wh[(size_t)n * ldw + k] : Wh[(size_t)k * ldw + n]);
                y[h * sy + (size_t)t * ldy + n] = a;
            }
}
