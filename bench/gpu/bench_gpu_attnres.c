/* Block AttnRes two-phase cost per layer on the GPU, standalone, against a LOWER BOUND of the layer:
 * the cuBLAS GEMMs of the layer's trunk projections (KDA q/k/v/f/g/β, o; router; latent down/up;
 * shared expert), measured here, without routed experts, attention core or norms — so the shares
 * printed are UPPER bounds ("of trunk GEMMs"). The real share inside the GPU engine is measured by
 * bench_gpu_e2e. The engine's forms: phase 2 is fused into the next RMSNorm, so its cost is that
 * kernel's time over a plain RMSNorm of the same rows (st_cuda_attnres_phase2_rmsnorm with and without
 * the AttnRes state), twice per layer, plus phase 1 with the block push folded in
 * (st_cuda_attnres_phase1_push; m completed blocks, Q = 2B queries) amortised over the B layers of a block. */
#include <math.h>

#include "bench_common.h"

typedef struct {
    int d, kda_w, f_rank, H, n_exp, latent, shared_w; /* shared_w: shared expert width (gate = up) */
} layer_t;

static st_bf16_t *gx, *gw, *gy;

/* trunk GEMMs of one KDA + MoE layer at T tokens: (in, out) pairs through st_cuda_linear */
static double layer_gemm_ms(const layer_t *L, int T) {
    int gemms[][2] = {
        {L->d, 3 * L->kda_w + 2 * L->f_rank + L->H}, /* q, k, v, f_a, g_a, β */
        {L->f_rank, L->kda_w},                       /* f_b */
        {L->f_rank, L->kda_w},                       /* g_b */
        {L->kda_w, L->d},                            /* o */
        {L->d, L->n_exp + L->latent},                /* router + latent down */
        {L->latent, L->d},                           /* latent up */
        {L->d, 2 * L->shared_w},                     /* shared gate/up */
        {L->shared_w, L->d},                         /* shared down */
    };
    double tot = 0;
    for (size_t i = 0; i < sizeof gemms / sizeof gemms[0]; i++) {
        double ms;
        BTIME(ms, 10, st_cuda_linear(&bs, gy, gemms[i][1], false, 0.f, gx, gemms[i][0], gw, T, gemms[i][1], gemms[i][0]));
        tot += ms;
    }
    return tot;
}

static void bench(const layer_t *L, int T, int B, int m) {
    int d = L->d, Q = 2 * B;
    float *w = bdev(4 * (size_t)Q * d), *part = bdev(4 * (size_t)T * d), *st = bdev(8 * (size_t)T * Q),
          *acc = bdev(4 * (size_t)T * Q * d), *nw = bdev(4 * (size_t)d), *list = bdev(4 * (size_t)m * T * d);
    st_bf16_t *ob = bdev(2 * (size_t)T * d);
    BK(st_cuda_fill_uniform(&bs, w, false, (size_t)Q * d, -0.05f, 0.05f, 1));
    BK(st_cuda_fill_uniform(&bs, part, false, (size_t)T * d, -1.f, 1.f, 2));
    BK(st_cuda_fill_uniform(&bs, nw, false, (size_t)d, 0.5f, 1.5f, 3));
    BK(st_cuda_fill_uniform(&bs, list, false, (size_t)m * T * d, -1.f, 1.f, 4));
    double pp, ppx, nar, npl;
    int it = T >= 4096 ? 5 : 50;
    /* the newest block (part) pushed into list slot m − 1 */
    BTIME(pp, it, st_cuda_attnres_phase1_push(&bs, st, acc, list, (size_t)T * d, part, m, w, Q, T, d, 1e-5f, 0, NULL));
    st_attnres_xnorm_t x = {w, nw, 1e-5f, ob, NULL};
    BTIME(ppx, it, st_cuda_attnres_phase1_push(&bs, st, acc, list, (size_t)T * d, part, m, w, Q, T, d, 1e-5f, 0, &x));
    BTIME(nar, it, st_cuda_attnres_phase2_rmsnorm(&bs, ob, NULL, part, st, acc, w, 0, Q, nw, NULL, T, d, 1e-5f, 1e-5f));
    BTIME(npl, it, st_cuda_attnres_phase2_rmsnorm(&bs, ob, NULL, part, NULL, NULL, NULL, 0, Q, nw, NULL, T, d, 1e-5f,
                                                  1e-5f));
    double lay = layer_gemm_ms(L, T), eng_layer = 2 * (nar - npl) + pp / B;
    double bp = (double)T * d * 4 * (m + 1 + Q);
    printf("RESULT attnres_engine d=%d T=%d m=%d Q=%d: phase1+push %.1f us (%.0f GB/s), fused norm %.1f us vs plain "
           "RMSNorm %.1f us (extra %.1f us); per layer %.1f us; layer trunk GEMMs (lower bound of the layer) %.1f us; "
           "share of trunk GEMMs (upper bound) %.2f%%\n",
           d, T, m, Q, pp * 1e3, bp / (pp * 1e6), nar * 1e3, npl * 1e3, (nar - npl) * 1e3, eng_layer * 1e3, lay * 1e3,
           100.0 * eng_layer / (lay + eng_layer));
    printf("RESULT attnres_engine_fold d=%d T=%d m=%d Q=%d: phase1+push with the block-start norm %.1f us vs "
           "phase1+push %.1f + fused norm %.1f us (AttnRes over a plain RMSNorm per block start: %.1f vs %.1f us)\n",
           d, T, m, Q, ppx * 1e3, pp * 1e3, nar * 1e3, (ppx - npl) * 1e3, (pp + nar - npl) * 1e3);
    st_gpu_free(w), st_gpu_free(part), st_gpu_free(st), st_gpu_free(acc), st_gpu_free(ob), st_gpu_free(nw),
        st_gpu_free(list);
}

int main(void) {
    bench_init("bench_gpu_attnres", 1);
    /* K3-like trunk (d 7168, KDA 96 heads × 128, 896 experts, latent 3584 = k3-mini, shared 2 × 3072)
     * and the small preset (d 1024, 8 × 128, 64 experts, latent 512, shared 2 × 768) */
    layer_t big = {7168, 12288, 128, 96, 896, 3584, 6144}, small = {1024, 1024, 128, 8, 64, 512, 1536};
    size_t xb = (size_t)8192 * 12288 * 2, wb = (size_t)7168 * (3 * 12288 + 256 + 96) * 2;
    gx = bdev(xb), gw = bdev(wb), gy = bdev((size_t)8192 * (3 * 12288 + 256 + 96) * 2);
    BK(st_cuda_fill_uniform(&bs, gx, true, xb / 2, -1.f, 1.f, 1));
    BK(st_cuda_fill_uniform(&bs, gw, true, wb / 2, -0.02f, 0.02f, 2));
    static const int Ts[] = {1, 32, 64, 128, 256, 8192};
    for (int i = 0; i < 6; i++) bench(&big, Ts[i], 4, 12);
    for (int i = 0; i < 6; i++) bench(&small, Ts[i], 4, 3);
    return 0;
}
