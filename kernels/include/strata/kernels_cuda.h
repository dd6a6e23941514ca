/* Strata compute ops, CUDA versions (kernels/<op>.cu). Same math as strata/kernels.h (the CPU
 * versions are the references their tests compare against); activations and weights are bf16
 * (uint16_t bit patterns here, __nv_bfloat16 inside the kernels) with fp32 accumulation, and
 * recurrent state is fp32. Every pointer is device memory unless marked host. Launchers are
 * asynchronous on s->stream, never allocate (callers pass workspace), and return ST_OK or
 * ST_ERR_INVALID_ARG / ST_ERR_DEVICE (logged once). Layouts are row-major unless noted. */
#ifndef STRATA_KERNELS_CUDA_H
#define STRATA_KERNELS_CUDA_H

#include <stdbool.h>
#include <stdint.h>

#include "strata/base.h"
#include "strata/gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef uint16_t st_bf16_t; /* bf16 bit pattern */

/* ---------------- norms ---------------- */
/* y [T, n] bf16 = x [T, n] bf16 / sqrt(mean(x²)+eps) ⊙ w [n] fp32 (w NULL: no weight). y may alias x. */
st_status_t st_cuda_rmsnorm(const st_gpu_stream_t *s, st_bf16_t *y, const st_bf16_t *x, const float *w,
                            int T, int n, float eps);
/* in place, per head: x [T, H, dh] bf16 ← x / sqrt(Σx² + eps) */
st_status_t st_cuda_l2norm_heads(const st_gpu_stream_t *s, st_bf16_t *x, int T, int H, int dh, float eps);

/* ---------------- linear (cuBLAS) ---------------- */
/* y [T, N] = x [T, K] · Wᵀ, W [N, K] bf16 row-major; fp32 accumulation. y bf16 (y_f32 false) or
 * fp32 (y_f32 true). Uses s's cuBLAS handle and workspace. */
st_status_t st_cuda_linear(const st_gpu_stream_t *s, void *y, bool y_f32, const st_bf16_t *x,
                           const st_bf16_t *W, int T, int N, int K);

/* ---------------- KDA (SPEC §3) ---------------- */
/* Depthwise causal conv (kernel K ≤ 4) + SiLU over a variable-length batch.
 * x [T_tot, C] bf16; cu_seqlens [B+1] int32 (token offsets); w [C, K] fp32 (tap K-1 = newest);
 * state pool [n_slots, K-1, C] fp32, oldest first; slots [B] int32 (NULL: slot b = b), updated in
 * place to each sequence's last K-1 inputs. y [T_tot, C] bf16, must not alias x.
 * Decode = every sequence of length 1. */
st_status_t st_cuda_conv_silu(const st_gpu_stream_t *s, st_bf16_t *y, const st_bf16_t *x, float *state,
                              const int *slots, const float *w, const int *cu_seqlens, int B, int T_tot,
                              int C, int K);
/* Gate: f [T, H*dk] bf16 → g [T, H*dk] fp32. bounded: g = lb·σ(exp(A_log[h])·(f+dt_bias));
 * unbounded: g = −exp(A_log[h])·softplus(f+dt_bias). A_log [H], dt_bias [H*dk] fp32. */
st_status_t st_cuda_kda_gate(const st_gpu_stream_t *s, float *g, const st_bf16_t *f, const float *A_log,
                             const float *dt_bias, int T, int H, int dk, bool bounded, float lb);
/* Chunked KDA prefill (SPEC §3.3) over a variable-length batch, K = V = 128.
 * q, k [T_tot, H, 128] bf16 (already L2-normed); v [T_tot, H, 128] bf16; g [T_tot, H, 128] fp32
 * (log-decay, ≤ 0); beta [T_tot, H] fp32; cu_seqlens [B+1] int32; state pool S [n_slots, H, 128,
 * 128] fp32 ([key channel, value channel]); slots [B] (NULL: b), read and updated in place;
 * o [T_tot, H, 128] bf16. Tiles of 16 tokens; the diagonal tile's A_kk / A_qk are dense
 * tensor-core products when the tile's decay stays within e^80 (always so for a bounded gate),
 * otherwise that tile takes the per-pair form. */
st_status_t st_cuda_kda_chunked(const st_gpu_stream_t *s, st_bf16_t *o, const st_bf16_t *q,
                                const st_bf16_t *k, const st_bf16_t *v, const float *g, const float *beta,
                                float *S, const int *slots, const int *cu_seqlens, int B, int H,
                                float scale);
/* Recurrent KDA decode (SPEC §3.2), one token for each of N sequences, state in place.
 * q, k, v [N, H, 128] bf16; g [N, H, 128] fp32; beta [N, H] fp32; S pool [n_slots, H, 128, 128]
 * fp32; slots [N] int32 (NULL: n); o [N, H, 128] bf16. */
st_status_t st_cuda_kda_decode(const st_gpu_stream_t *s, st_bf16_t *o, const st_bf16_t *q,
                               const st_bf16_t *k, const st_bf16_t *v, const float *g, const float *beta,
                               float *S, const int *slots, int N, int H, float scale);

/* ---------------- MLA (SPEC §4) ---------------- */
/* Absorbed decode: one query per sequence, MQA over its paged latent cache.
 * q_abs [B, H, 576] bf16 (= [W_UKᵀ q_nope ; q_pe]); pool [n_pages, page_size, 576] bf16 rows
 * [c̃ (512) ; k_pe (64)]; block_table [B, max_pages] int32 (page ids); seqlens [B] int32 (rows valid,
 * the query sees all of them, 0 allowed → zeros); o_lat [B, H, 512] bf16 = Σ_s softmax(q·k_s·scale) c̃_s.
 * Split-KV: split_len tokens per block (multiple of 32; e.g. 1024); max_ctx ≥ every seqlens[b].
 * ws: st_cuda_mla_decode_ws_bytes(B, H, max_ctx, split_len) bytes of device memory. */
size_t st_cuda_mla_decode_ws_bytes(int B, int H, int max_ctx, int split_len);
st_status_t st_cuda_mla_decode(const st_gpu_stream_t *s, st_bf16_t *o_lat, const st_bf16_t *q_abs,
                               const st_bf16_t *pool, const int *block_table, const int *seqlens, int B, int H,
                               int page_size, int max_pages, int max_ctx, int split_len, float scale, void *ws,
                               size_t ws_bytes);

/* ---------------- MoE side (SPEC §6, §7) and sampling (§9) ---------------- */
/* h [T, n] bf16 = act(gate [T, n], up [T, n]) with row stride ld_in (both may be halves of one
 * [T, 2n] buffer); situ: (b1·tanh(a/b1)·σ(a))·(b2·tanh(u/b2)), else SiLU(a)·u. fp32 math. */
st_status_t st_cuda_glu(const st_gpu_stream_t *s, st_bf16_t *h, const st_bf16_t *gate, const st_bf16_t *up, int T,
                        int n, int ld_in, bool situ, float b1, float b2);
/* scores [T, n] fp32: router logits in, σ(logits) out (in place). ids [T, k] int32 ascending per
 * token, w [T, k] fp32: top-k of σ + bias (bias [n] or NULL; ties → lower id), weights from the
 * unbiased scores, renormalised if renorm, times scale. k ≤ 32. */
st_status_t st_cuda_router_topk(const st_gpu_stream_t *s, int *ids, float *w, float *scores, const float *bias,
                                int T, int n, int k, bool renorm, float scale);
/* Greedy sampling: ids [T] int32 = argmax of logits [T, V] fp32 (ties → lower id). */
st_status_t st_cuda_argmax(const st_gpu_stream_t *s, int *ids, const float *logits, int T, int V);

/* ---------------- benchmark / test data ---------------- */
/* p [n] (bf16 if bf16 else fp32) = uniform [lo, hi) from a counter hash of (index, seed). */
st_status_t st_cuda_fill_uniform(const st_gpu_stream_t *s, void *p, bool bf16, size_t n, float lo, float hi,
                                 uint64_t seed);

#ifdef __cplusplus
}
#endif
#endif
