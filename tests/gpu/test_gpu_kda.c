/* KDA on the GPU vs the CPU recurrence (SPEC §3): chunked prefill over varlen batches (bounded gate,
 * the e^80 edge, the unbounded gate's per-pair fallback, carried state, slot indirection), decode
 * on a state pool, short conv + SiLU with state (the gate: test_gpu_glue_kda.c). Tolerance: SPEC §8 (rel L2 2e-2). */
#include <math.h>

#include "gpu_test.h"
#include "strata/kernels.h"

#define D 128

typedef enum { G_BOUNDED, G_EDGE, G_UNBOUNDED } gate_kind_t;

static void make_qk(float *x, uint16_t *bf, size_t rows, st_rng_t *r) { /* L2-normed heads, bf16 */
    for (size_t i = 0; i < rows; i++) {
        float *p = x + i * D;
        double ss = 0;
        for (int c = 0; c < D; c++) { p[c] = st_rng_normal(r); ss += p[c] * p[c]; }
        for (int c = 0; c < D; c++) p[c] = (float)(p[c] / sqrt(ss + 1e-6));
        gt_to_bf(bf + i * D, p, D);
    }
}

static void make_g(float *g, size_t n, gate_kind_t kind, st_rng_t *r) {
    for (size_t i = 0; i < n; i++) {
        float u = st_rng_normal(r);
        if (kind == G_BOUNDED) g[i] = -5.f / (1.f + expf(-(u - 2.f))); /* mostly mild decay */
        else if (kind == G_EDGE) g[i] = -4.995f + 0.004f * (float)st_rng_uniform(r); /* tile decay ≈ e^-80 */
        else g[i] = -expf(u) * log1pf(expf(u + 2.f)); /* unbounded: some tokens decay by e^-20 and more */
    }
}

/* One chunked case: B sequences of lens[], H heads, state carried through `splits` calls. */
static void chunked_case(const char *name, const int *lens, int B, int H, gate_kind_t gk, int splits,
                         uint64_t seed) {
    st_rng_t r = {seed};
    int T = 0;
    int *cu = gt_xmalloc(sizeof(int) * (B + 1));
    cu[0] = 0;
    for (int b = 0; b < B; b++) cu[b + 1] = cu[b] + lens[b];
    T = cu[B];
    size_t nq = (size_t)T * H * D;
    float *q = gt_xmalloc(4 * nq), *k = gt_xmalloc(4 * nq), *v = gt_xmalloc(4 * nq), *g = gt_xmalloc(4 * nq);
    uint16_t *qb = gt_xmalloc(2 * nq), *kb = gt_xmalloc(2 * nq), *vb = gt_xmalloc(2 * nq);
    float *beta = gt_xmalloc(4 * (size_t)T * H), *o_ref = gt_xmalloc(4 * nq);
    make_qk(q, qb, (size_t)T * H, &r);
    make_qk(k, kb, (size_t)T * H, &r);
    gt_randn_bf(v, vb, nq, 1.f, &r);
    make_g(g, nq, gk, &r);
    for (int i = 0; i < T * H; i++) beta[i] = 1.f / (1.f + expf(-st_rng_normal(&r)));
    /* state pool with 2 spare slots, sequences in reverse slot order */
    int n_slots = B + 2;
    size_t ss = (size_t)H * D * D;
    float *S0 = gt_xmalloc(4 * ss * n_slots), *S_ref = gt_xmalloc(4 * ss * n_slots), *S_gpu = gt_xmalloc(4 * ss * n_slots);
    for (size_t i = 0; i < ss * n_slots; i++) S0[i] = 0.05f * st_rng_normal(&r);
    memcpy(S_ref, S0, 4 * ss * n_slots);
    int *slots = gt_xmalloc(sizeof(int) * B);
    for (int b = 0; b < B; b++) slots[b] = n_slots - 1 - b;
    const float scale = 1.f / sqrtf((float)D);
    /* CPU reference: the recurrence, per sequence */
    for (int b = 0; b < B; b++) {
        size_t o0 = (size_t)cu[b] * H * D;
        st_kda_recurrent(o_ref + o0, q + o0, k + o0, v + o0, g + o0, beta + (size_t)cu[b] * H,
                         S_ref + ss * slots[b], lens[b], H, D, D, scale);
    }
    /* GPU, in `splits` pieces per sequence (piece p covers [p·len/splits, (p+1)·len/splits)) */
    uint16_t *d_q = gt_up(qb, 2 * nq), *d_k = gt_up(kb, 2 * nq), *d_v = gt_up(vb, 2 * nq);
    float *d_g = gt_up(g, 4 * nq), *d_beta = gt_up(beta, 4 * (size_t)T * H), *d_S = gt_up(S0, 4 * ss * n_slots);
    int *d_slots = gt_up(slots, sizeof(int) * B);
    int *pcu = gt_xmalloc(sizeof(int) * (B + 1));
    float *o32 = gt_xmalloc(4 * nq + 4); /* o fp32, as the pieces come back */
    for (int p = 0; p < splits; p++) {
        /* each piece is its own varlen batch: gather it into contiguous buffers */
        int Tp = 0;
        pcu[0] = 0;
        for (int b = 0; b < B; b++) {
            int a = (int)((long)lens[b] * p / splits), e = (int)((long)lens[b] * (p + 1) / splits);
            pcu[b + 1] = pcu[b] + (e - a);
        }
        Tp = pcu[B];
        size_t np = (size_t)Tp * H * D;
        uint16_t *pq = gt_xmalloc(2 * np + 2), *pk = gt_xmalloc(2 * np + 2), *pv = gt_xmalloc(2 * np + 2);
        float *pg = gt_xmalloc(4 * np + 4), *pb = gt_xmalloc(4 * (size_t)Tp * H + 4);
        for (int b = 0; b < B; b++) {
            int a = (int)((long)lens[b] * p / splits), n = pcu[b + 1] - pcu[b];
            size_t src = (size_t)(cu[b] + a) * H * D, dst = (size_t)pcu[b] * H * D, cnt = (size_t)n * H * D;
            memcpy(pq + dst, qb + src, 2 * cnt), memcpy(pk + dst, kb + src, 2 * cnt), memcpy(pv + dst, vb + src, 2 * cnt);
            memcpy(pg + dst, g + src, 4 * cnt);
            memcpy(pb + (size_t)pcu[b] * H, beta + (size_t)(cu[b] + a) * H, 4 * (size_t)n * H);
        }
        uint16_t *dq = gt_up(pq, 2 * np + 2), *dk = gt_up(pk, 2 * np + 2), *dv = gt_up(pv, 2 * np + 2);
        float *dg = gt_up(pg, 4 * np + 4), *db = gt_up(pb, 4 * (size_t)Tp * H + 4);
        int *dcu = gt_up(pcu, sizeof(int) * (B + 1));
        float *dout32 = gt_dev(4 * np + 4), *po32 = gt_xmalloc(4 * np + 4);
        GT_OK(st_cuda_kda_chunked(&gt_stream, dout32, dq, dk, dv, dg, db, d_S, d_slots, dcu, B, H, scale));
        gt_down(po32, dout32, 4 * np);
        for (int b = 0; b < B; b++) {
            int a = (int)((long)lens[b] * p / splits), n = pcu[b + 1] - pcu[b];
            memcpy(o32 + (size_t)(cu[b] + a) * H * D, po32 + (size_t)pcu[b] * H * D, 4 * (size_t)n * H * D);
        }
        free(po32), st_gpu_free(dout32);
        free(pq), free(pk), free(pv), free(pg), free(pb);
        st_gpu_free(dq), st_gpu_free(dk), st_gpu_free(dv), st_gpu_free(dg), st_gpu_free(db), st_gpu_free(dcu);
    }
    gt_down(S_gpu, d_S, 4 * ss * n_slots);
    char what[160];
    snprintf(what, sizeof what, "kda_chunked %s H=%d B=%d T=%d splits=%d: o", name, H, B, T, splits);
    st_t_close(what, o32, o_ref, nq, 2e-2, 1e-3);
    snprintf(what, sizeof what, "kda_chunked %s H=%d B=%d T=%d splits=%d: S", name, H, B, T, splits);
    st_t_close(what, S_gpu, S_ref, ss * n_slots, 2e-2, 1e-3);
    free(o32);
    st_gpu_free(d_q), st_gpu_free(d_k), st_gpu_free(d_v), st_gpu_free(d_g), st_gpu_free(d_beta), st_gpu_free(d_S),
        st_gpu_free(d_slots);
    free(q), free(k), free(v), free(g), free(qb), free(kb), free(vb), free(beta), free(o_ref);
    free(S0), free(S_ref), free(S_gpu), free(slots), free(cu), free(pcu);
}

static void decode_case(int N, int H, int steps, uint64_t seed) {
    st_rng_t r = {seed};
    int n_slots = N + 3;
    size_t ss = (size_t)H * D * D, nq = (size_t)N * H * D;
    float *S0 = gt_xmalloc(4 * ss * n_slots), *S_ref = gt_xmalloc(4 * ss * n_slots), *S_gpu = gt_xmalloc(4 * ss * n_slots);
    for (size_t i = 0; i < ss * n_slots; i++) S0[i] = 0.1f * st_rng_normal(&r);
    memcpy(S_ref, S0, 4 * ss * n_slots);
    int *slots = gt_xmalloc(sizeof(int) * N);
    for (int n = 0; n < N; n++) slots[n] = (n * 7 + 2) % n_slots; /* distinct when gcd(7, n_slots) = 1 */
    float *d_S32 = gt_up(S0, 4 * ss * n_slots);
    int *d_slots = gt_up(slots, sizeof(int) * N);
    float *d_q32 = gt_dev(4 * nq), *d_k32 = gt_dev(4 * nq), *d_v32 = gt_dev(4 * nq), *d_o32 = gt_dev(4 * nq);
    float *q = gt_xmalloc(4 * nq), *k = gt_xmalloc(4 * nq), *v = gt_xmalloc(4 * nq), *g = gt_xmalloc(4 * nq);
    uint16_t *qb = gt_xmalloc(2 * nq), *kb = gt_xmalloc(2 * nq), *vb = gt_xmalloc(2 * nq);
    float *beta = gt_xmalloc(4 * (size_t)N * H), *o_ref = gt_xmalloc(4 * nq), *o_gpu = gt_xmalloc(4 * nq);
    float *d_g = gt_dev(4 * nq), *d_b = gt_dev(4 * (size_t)N * H);
    const float scale = 1.f / sqrtf((float)D);
    for (int step = 0; step < steps; step++) {
        make_qk(q, qb, (size_t)N * H, &r);
        make_qk(k, kb, (size_t)N * H, &r);
        gt_randn_bf(v, vb, nq, 1.f, &r);
        make_g(g, nq, G_BOUNDED, &r);
        for (int i = 0; i < N * H; i++) beta[i] = 1.f / (1.f + expf(-st_rng_normal(&r)));
        for (int n = 0; n < N; n++)
            st_kda_recurrent(o_ref + (size_t)n * H * D, q + (size_t)n * H * D, k + (size_t)n * H * D,
                             v + (size_t)n * H * D, g + (size_t)n * H * D, beta + (size_t)n * H,
                             S_ref + ss * slots[n], 1, H, D, D, scale);
        GT_OK(st_gpu_memcpy_h2d(d_g, g, 4 * nq));
        GT_OK(st_gpu_memcpy_h2d(d_b, beta, 4 * (size_t)N * H));
        /* q, k, v, o fp32 (q, k, v bf16-exact values): only the state's own rounding differs from the
         * reference */
        GT_OK(st_gpu_memcpy_h2d(d_q32, q, 4 * nq));
        GT_OK(st_gpu_memcpy_h2d(d_k32, k, 4 * nq));
        GT_OK(st_gpu_memcpy_h2d(d_v32, v, 4 * nq));
        gt_poison(d_o32, 4 * nq);
        GT_OK(st_cuda_kda_decode(&gt_stream, d_o32, d_q32, d_k32, d_v32, d_g, d_b, d_S32, d_slots, N, H, scale));
        gt_down(o_gpu, d_o32, 4 * nq);
        char what[128];
        snprintf(what, sizeof what, "kda_decode N=%d H=%d step %d: o", N, H, step);
        st_t_close(what, o_gpu, o_ref, nq, 1e-3, 1e-4);
    }
    gt_down(S_gpu, d_S32, 4 * ss * n_slots);
    char what[128];
    snprintf(what, sizeof what, "kda_decode N=%d H=%d after %d steps: state pool", N, H, steps);
    st_t_close(what, S_gpu, S_ref, ss * n_slots, 1e-4, 1e-5);
    st_gpu_free(d_S32), st_gpu_free(d_q32), st_gpu_free(d_k32), st_gpu_free(d_v32), st_gpu_free(d_o32);
    st_gpu_free(d_slots), st_gpu_free(d_g), st_gpu_free(d_b);
    free(S0), free(S_ref), free(S_gpu), free(slots), free(q), free(k), free(v), free(g), free(qb), free(kb), free(vb),
        free(beta), free(o_ref), free(o_gpu);
}

static void conv_case(const int *lens, int B, int C, int K, uint64_t seed) {
    st_rng_t r = {seed};
    int *cu = gt_xmalloc(sizeof(int) * (B + 1));
    cu[0] = 0;
    for (int b = 0; b < B; b++) cu[b + 1] = cu[b] + lens[b];
    int T = cu[B];
    size_t n = (size_t)T * C, sn = (size_t)(K - 1) * C;
    float *x = gt_xmalloc(4 * n + 4), *w = gt_xmalloc(4 * (size_t)C * K), *y_ref = gt_xmalloc(4 * n + 4),
          *y_gpu = gt_xmalloc(4 * n + 4);
    uint16_t *xb = gt_xmalloc(2 * n + 2);
    gt_randn_bf(x, xb, n, 1.f, &r);
    for (int i = 0; i < C * K; i++) w[i] = 0.5f * st_rng_normal(&r);
    float *st0 = gt_xmalloc(4 * sn * B + 4), *st_ref = gt_xmalloc(4 * sn * B + 4), *st_gpu = gt_xmalloc(4 * sn * B + 4);
    for (size_t i = 0; i < sn * B; i++) st0[i] = st_rng_normal(&r);
    memcpy(st_ref, st0, 4 * sn * B);
    for (int b = 0; b < B; b++)
        st_conv_silu(y_ref + (size_t)cu[b] * C, x + (size_t)cu[b] * C, st_ref + sn * b, w, lens[b], C, K);
    float *d_x = gt_up(x, 4 * n + 4), *d_y = gt_dev(4 * n + 4);
    float *d_w = gt_up(w, 4 * (size_t)C * K), *d_st = gt_up(st0, 4 * sn * B + 4);
    int *d_cu = gt_up(cu, sizeof(int) * (B + 1));
    GT_OK(st_cuda_conv_silu(&gt_stream, d_y, d_x, d_st, NULL, d_w, d_cu, B, T, C, K));
    gt_down(y_gpu, d_y, 4 * n);
    gt_down(st_gpu, d_st, 4 * sn * B);
    char what[128];
    snprintf(what, sizeof what, "conv_silu B=%d T=%d C=%d K=%d: y", B, T, C, K);
    if (n) st_t_close(what, y_gpu, y_ref, n, 1e-4, 1e-4); /* fp32 in and out: only the order of the taps' sum */
    snprintf(what, sizeof what, "conv_silu B=%d T=%d C=%d K=%d: state", B, T, C, K);
    st_t_close(what, st_gpu, st_ref, sn * B, 1e-6, 1e-6);
    st_gpu_free(d_x), st_gpu_free(d_y), st_gpu_free(d_w), st_gpu_free(d_st), st_gpu_free(d_cu);
    free(cu), free(x), free(w), free(y_ref), free(y_gpu), free(xb), free(st0), free(st_ref), free(st_gpu);
}

int main(void) {
    gt_init_or_skip("test_gpu_kda");
    static const int Ts[] = {1, 15, 16, 17, 100, 1000};
    for (int H = 1; H <= 4; H += 3)
        for (size_t i = 0; i < ST_ARRAY_LEN(Ts); i++) chunked_case("bounded", &Ts[i], 1, H, G_BOUNDED, 1, 100 + i + H);
    static const int var[] = {1, 15, 16, 17, 100, 0, 1000, 33};
    chunked_case("varlen", var, 8, 4, G_BOUNDED, 1, 7);
    chunked_case("varlen-carried", var, 8, 4, G_BOUNDED, 3, 8);
    static const int edge[] = {64, 17};
    chunked_case("edge-e80", edge, 2, 2, G_EDGE, 1, 9);
    static const int unb[] = {17, 100, 1};
    chunked_case("unbounded", unb, 3, 2, G_UNBOUNDED, 1, 10);
    chunked_case("unbounded-carried", unb, 3, 2, G_UNBOUNDED, 2, 11);

    decode_case(1, 1, 2, 20);
    decode_case(5, 4, 3, 21);
    decode_case(64, 3, 2, 22);

    static const int cl[] = {1, 2, 5, 100, 0};
    conv_case(cl, 5, 200, 4, 30);
    static const int one[] = {1, 1, 1, 1, 1, 1, 1};
    conv_case(one, 7, 384, 4, 31);
    return st_test_done();
}
