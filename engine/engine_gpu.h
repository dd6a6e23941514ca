/* The glue kernels of attention_worker/engine_gpu_kernels.cu (eg_*), which the CUDA backend
 * (engine/backend_cuda.c) launches until they move into kernels/. Internal header. */
#ifndef STRATA_ENGINE_GPU_H
#define STRATA_ENGINE_GPU_H

#include <stdbool.h>
#include <stddef.h>

#include "strata/engine.h"
#include "strata/gpu.h"
#include "strata/kernels_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- glue kernels (engine_gpu_kernels.cu); asynchronous on s, device pointers unless noted ---- */
/* y [T, N] (ldy) = x [T, K] (ldx) · Wᵀ, all fp32 (W [N, K] row-major); plain fp32 math. */
st_status_t eg_sgemm(const st_gpu_stream_t *s, float *y, int ldy, const float *x, int ldx, const float *W, int T, int N,
                     int K);
/* KDA decay gate in place on fp32 f [T, H*dk] (st_kda_gate). */
st_status_t eg_kda_gate32(const st_gpu_stream_t *s, float *g, const float *A_log, const float *dt_bias, int T, int H,
                          int dk, bool bounded, float lb);
/* Decode form: g [T, H*dk] = gate(aux[:, :R] (row stride naux) · w_fbᵀ + dt_bias), w_fb [H*dk, R]
 * fp32, R ≤ 256: eg_sgemm and eg_kda_gate32 in one launch. */
st_status_t eg_kda_gate_fb32(const st_gpu_stream_t *s, float *g, const float *aux, int naux, const float *w_fb, int R,
                             const float *A_log, const float *dt_bias, int T, int H, int dk, bool bounded, float lb);
/* Per head h < H: y_h [T, N] (at y + h·sy, row stride ldy) = x_h [T, K] (x + h·sx, ldx) · op(W_h),
 * W_h at W + h·sw: trans_w false: W_h [K, N] row-major (ldw N); true: W_h [N, K] row-major (ldw K). bf16 in,
 * y bf16 or fp32 (y_f32). */
st_status_t eg_linear_heads(const st_gpu_stream_t *s, void *y, bool y_f32, int ldy, long long sy, const st_bf16_t *x,
                            int ldx, long long sx, const st_bf16_t *W, int ldw, long long sw, bool trans_w, int T,
                            int N, int K, int H);
/* y (fp32) += the same product (beta 1): the second pass of a split bf16 input */
st_status_t eg_linear_heads_add(const st_gpu_stream_t *s, float *y, int ldy, long long sy, const st_bf16_t *x, int ldx,
                                long long sx, const st_bf16_t *W, int ldw, long long sw, bool trans_w, int T, int N,
                                int K, int H);
/* The same with everything fp32 (plain fp32 math): the MLA query absorption. */
st_status_t eg_sgemm_heads(const st_gpu_stream_t *s, float *y, int ldy, long long sy, const float *x, int ldx,
                           long long sx, const float *W, int ldw, long long sw, bool trans_w, int T, int N, int K, int H);
st_status_t eg_memcpy_async(const st_gpu_stream_t *s, void *dst, const void *src, size_t bytes, int kind /* 0 d2d, 1 h2d, 2 d2h */);
st_status_t eg_memset_async(const st_gpu_stream_t *s, void *dst, int byte, size_t bytes);
/* partial [T, d] fp32 = E[tok[t]] (E [V, d] bf16) */
st_status_t eg_embed(const st_gpu_stream_t *s, float *partial, const st_bf16_t *E, const int *tok, int T, int d);
/* AttnRes phase 1 over m blocks (block i at blocks + i·bstride, [T, d] fp32) for Q queries w [Q, d]
 * fp32 → stats [T, Q, 2], acc [T, Q, d] (st_attnres_phase1). The first version (one block per token,
 * one block reduction per (block, query)); the engine runs st_cuda_attnres_phase1_push unless
 * the engine no longer launches it (kernels/dev material). */
st_status_t eg_attnres_phase1(const st_gpu_stream_t *s, float *stats, float *acc, const float *blocks, size_t bstride,
                              int m, const float *w, int Q, int T, int d, float eps);
/* xn [n_rows, d] bf16 = RMSNorm(h; norm_w, norm_eps), h = partial row r (rows[i], or i when rows is
 * NULL), merged with the phase-1 state of query q first when stats != NULL (st_attnres_phase2).
 * Split bf16 (xlo != NULL): xlo = bf16(v − xn), so xn + xlo carries v to ~16 bits; the same optional
 * `lo` outputs below. A GEMM then reads both (two passes, fp32 output accumulated).
 * st_cuda_attnres_phase2_rmsnorm (kernels/attnres.cu); eg_resnorm_v1 is the first version (h staged in
 * shared memory, partial read twice); no longer launched by the engine. */
st_status_t eg_resnorm(const st_gpu_stream_t *s, st_bf16_t *xn, st_bf16_t *xlo, const float *partial, const float *stats,
                       const float *acc, const float *w_q, int q, int Q, const float *norm_w, const int *rows,
                       int n_rows, int d, float ar_eps, float norm_eps);
st_status_t eg_resnorm_v1(const st_gpu_stream_t *s, st_bf16_t *xn, st_bf16_t *xlo, const float *partial,
                          const float *stats, const float *acc, const float *w_q, int q, int Q, const float *norm_w,
                          const int *rows, int n_rows, int d, float ar_eps, float norm_eps);
/* ---- events, pinned host words and the stream gate (the gate and timing events: unused by the engine) ---- */
st_status_t eg_events_create(void **ev, int n);
void eg_events_destroy(void **ev, int n);
st_status_t eg_event_record(void *ev, const st_gpu_stream_t *s);
/* milliseconds from a to b (both completed), or -1 */
double eg_event_ms(void *a, void *b);
st_status_t eg_host_alloc(void **p, size_t bytes);
/* ordering events (no timing) between the engine's streams: *ev created; s waits for ev's last
 * record (nothing if never recorded); the host waits for it */
st_status_t eg_event_create_sync(void **ev);
st_status_t eg_stream_wait(const st_gpu_stream_t *s, void *ev);
st_status_t eg_event_sync(void *ev);
/* true once ev's last record completed (or on an error, which the next sync reports) */
bool eg_event_done(void *ev);
void eg_host_free(void *p);
/* Hold the stream until gate[0] != 0 (pinned host word, written by the host) or timeout_ns passed;
 * a timeout adds 1 to gate[1]. */
st_status_t eg_gate(const st_gpu_stream_t *s, int *gate, long long timeout_ns);
/* KDA after the fused q|k|v conv: qkv [T, 3P] bf16 → q, k (L2-normed per head), v [T, P] bf16;
 * beta [T, H] fp32 = σ(aux[t, boff + h]) (aux row stride ldaux, fp32). */
st_status_t eg_kda_prep(const st_gpu_stream_t *s, st_bf16_t *q, st_bf16_t *k, st_bf16_t *v, float *beta,
                        const st_bf16_t *qkv, const float *aux, int ldaux, int boff, int T, int H, int dk,
                        float l2eps);
/* o [T, H, dv] bf16 ← RMSNorm(o_h; w [dv], eps) ⊙ σ(gate[t, h·dv + j]) (gate row stride ldg) */
st_status_t eg_kda_out_gate(const st_gpu_stream_t *s, st_bf16_t *o, const st_bf16_t *gate, int ldg, const float *w,
                            int T, int H, int dv, float eps);
/* Recurrent KDA (SPEC §3.2) for any dk = dv ≤ 128 over a variable-length batch (token by token):
 * arguments as st_cuda_kda_chunked, but q, k, v and o fp32. For head widths the tensor-core kernels do not take. */
st_status_t eg_kda_recurrent(const st_gpu_stream_t *s, float *o, const float *q, const float *k, const float *v, const float *g, const float *beta, float *S, const int *slots,
                             const int *cu_seqlens, int B, int H, int dk, float scale);
/* MLA cache write: row of token t = [RMSNorm(ckv[t, :kvr]; w, eps) ; ckv[t, kvr:R]] (ckv [T, R] fp32) into
 * pool [pages, page_size, R] (fp32 if f32, else bf16) at position tok_pos[t] of entry tok_ent[t] (btab [n_ent, pps]). */
st_status_t eg_mla_kv_store(const st_gpu_stream_t *s, void *pool, bool f32, const float *ckv, const float *w,
                            const int *tok_ent, const int *tok_pos, const int *btab, int pps, int page_size, int T,
                            int kvr, int R, float eps);
/* qabs[t, h, kvr:R] = q[t, h, nope:nope+rope] (q fp32; qabs fp32 if f32, else bf16; the W_UK part is
 * written by eg_linear_heads / eg_sgemm_heads) */
st_status_t eg_mla_qpe(const st_gpu_stream_t *s, void *qabs, bool f32, const float *q, int T, int H, int nope,
                       int rope, int kvr);
/* Absorbed MLA attention, causal: query t (qabs [T, H, R]) sees cache rows 0..tok_pos[t] of its
 * entry; olat [T, H, kvr] bf16 = Σ_s softmax(q·k_s·scale) c̃_s. qabs and pool fp32 if f32, else bf16.
 * Any R ≤ 1024, kvr ≤ 512, kvr % 32 == 0. */
st_status_t eg_mla_attn(const st_gpu_stream_t *s, st_bf16_t *olat, st_bf16_t *olo, const void *qabs, const void *pool, bool f32,
                        const int *tok_ent, const int *tok_pos, const int *btab, int pps, int page_size, int T, int H,
                        int R, int kvr, float scale, const int *cu, int dmin);
/* MLA direct form for long prompt chunks: c [n, R] = one sequence's cache rows (pages bt); then
 * K [n, H, nope+rope] / V [n, H, dv] from Y [n, H, nope+dv] = c[:, :kvr] · W_kvbᵀ and c's k_pe part. */
st_status_t eg_mla_gather(const st_gpu_stream_t *s, st_bf16_t *c, const st_bf16_t *pool, const int *bt, int page_size,
                          int n, int R);
st_status_t eg_mla_kv_split(const st_gpu_stream_t *s, st_bf16_t *K, st_bf16_t *V, const st_bf16_t *Y, const st_bf16_t *c,
                            int n, int H, int nope, int rope, int dv, int R, int kvr);
/* x [T, n] bf16 ← x ⊙ σ(gate [T, n]) */
st_status_t eg_mul_sigmoid(const st_gpu_stream_t *s, st_bf16_t *x, const st_bf16_t *gate, size_t n);
/* Routing tail (sets from the host): w [T, kc] from scores [T, n] over ids[t, 0..cnt[t]) (SPEC §7),
 * 0 past cnt. */
st_status_t eg_route_finish(const st_gpu_stream_t *s, const int *ids, float *w, const int *cnt, const float *scores,
                            int T, int n, int kc, bool renorm, float scale);
/* Grouping by expert (one block): offsets [E+1], row_of [T, kc] (−1 past cnt). */
st_status_t eg_moe_group(const st_gpu_stream_t *s, int *offsets, int *row_of, const int *ids, const int *cnt, int T,
                         int kc, int E);
/* xg[row_of[t, i]] = z[t] (bf16, width l) */
st_status_t eg_moe_gather(const st_gpu_stream_t *s, st_bf16_t *xg, const st_bf16_t *z, const int *row_of,
                          const int *cnt, int T, int kc, int l);
/* Combine in latent width, slot order (= ascending expert id): u = Σ_i p[t, i] y_i with y_i =
 * yg[row_of[t, i]] (fp32, grouped) when yg != NULL, else yf[t·kc + i] (fp32, the hand-off rows).
 * Then: norm_w != NULL → un [T, l] bf16 = RMSNorm(u; norm_w, eps); un == NULL → partial [T, l] += u
 * (experts at full width); otherwise un = u as bf16. */
st_status_t eg_moe_combine(const st_gpu_stream_t *s, st_bf16_t *un, st_bf16_t *ulo, float *partial, const float *yg,
                           const float *yf, const int *row_of, const float *p, const int *cnt, const float *norm_w,
                           int T, int kc, int l, float eps);
/* ---- fp32-activation glue: fp32 in, bf16 out only where a GEMM (or the chunked KDA tiles) reads it
 * (conv + SiLU and dtype conversions: st_cuda_conv_silu, st_cuda_f32_to_bf16, kernels_cuda.h) ---- */
/* eg_kda_prep from fp32 qkv [T, 3P]: q, k (L2-normed), v [T, P] fp32, and the same rounded to bf16
 * into qb, kb, vb unless qb == NULL; beta as eg_kda_prep. */
st_status_t eg_kda_prep32(const st_gpu_stream_t *s, float *q, float *k, float *v, st_bf16_t *qb, st_bf16_t *kb,
                          st_bf16_t *vb, float *beta, const float *qkv, const float *aux, int ldaux, int boff, int T,
                          int H, int dk, float l2eps);
/* out [T, H, dv] bf16 = RMSNorm(o_h; w, eps) ⊙ σ(gate) with o fp32 [T, H, dv], gate fp32 (row stride ldg) */
st_status_t eg_kda_out_gate32(const st_gpu_stream_t *s, st_bf16_t *out, st_bf16_t *lo, const float *o, const float *gate, int ldg,
                              const float *w, int T, int H, int dv, float eps);
/* st_cuda_glu with fp32 gate / up (row stride ld_in); h bf16 (the down GEMM's input) */
st_status_t eg_glu32(const st_gpu_stream_t *s, st_bf16_t *h, st_bf16_t *lo, const float *gate, const float *up, int T, int n,
                     int ld_in, bool situ, float b1, float b2);
/* st_cuda_rmsnorm with x fp32 [T, n], y bf16 (must not alias) */
st_status_t eg_rmsnorm32(const st_gpu_stream_t *s, st_bf16_t *y, st_bf16_t *lo, const float *x, const float *w, int T, int n,
                         float eps);
/* hi, lo [n] bf16: the split of x [n] fp32 (hi = bf16(x), lo = bf16(x − hi)) */
st_status_t eg_split_bf16(const st_gpu_stream_t *s, st_bf16_t *hi, st_bf16_t *lo, const float *x, size_t n);
/* y [n] bf16 = x ⊙ σ(gate), x and gate fp32 */
st_status_t eg_mul_sigmoid32(const st_gpu_stream_t *s, st_bf16_t *y, st_bf16_t *lo, const float *x, const float *gate, size_t n);

#ifdef __cplusplus
}
#endif
#endif
