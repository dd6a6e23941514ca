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

/* ---------------- linear ---------------- */
/* y [T, N] (row stride ldy) = beta·y + x [T, K] (row stride ldx) · Wᵀ, W [N, K] bf16 row-major (beta 0:
 * y is not read); fp32 accumulation; y bf16 (y_f32 false) or fp32 (y_f32 true). Up to 32 tokens with W
 * up to 4M elements (where it was measured faster; kernels/linear.cu) runs a skinny kernel that streams
 * W once (tensor cores, K split over the warps of a block and summed in a fixed order: deterministic;
 * needs K and ldx multiples of 8, x and W 16-byte aligned), anything else cuBLAS (s's handle). */
st_status_t st_cuda_linear(const st_gpu_stream_t *s, void *y, int ldy, bool y_f32, float beta, const st_bf16_t *x,
                           int ldx, const st_bf16_t *W, int T, int N, int K);
/* Several linear layers that read the same x [T, K] (row stride ldx): y_i (stride ldy_i, fp32 or bf16)
 * = beta_i·y_i + x · W_iᵀ, W_i [N_i, K]. Where the skinny kernel applies to every one, one launch
 * runs them all; else each runs as st_cuda_linear. */
#define ST_CUDA_LINEAR_MAX_SEG 4
typedef struct {
    const st_bf16_t *W;
    void *y;
    int N, ldy;
    bool y_f32;
    float beta;
} st_linear_seg_t;
st_status_t st_cuda_linear_multi(const st_gpu_stream_t *s, const st_bf16_t *x, int ldx, int T, int K,
                                 const st_linear_seg_t *seg, int n);

/* ---------------- KDA (SPEC §3) ---------------- */
/* Depthwise causal conv (kernel K ≤ 4) + SiLU over a variable-length batch (SiLU with the accurate exp).
 * x [T_tot, C] fp32; cu_seqlens [B+1] int32 (token offsets); w [C, K] fp32 (tap K-1 = newest);
 * state pool [n_slots, K-1, C] fp32, oldest first; slots [B] int32 (NULL: slot b = b), updated in
 * place to each sequence's last K-1 inputs. y [T_tot, C] fp32, must not alias x.
 * Decode = every sequence of length 1. */
st_status_t st_cuda_conv_silu(const st_gpu_stream_t *s, float *y, const float *x, float *state, const int *slots,
                              const float *w, const int *cu_seqlens, int B, int T_tot, int C, int K);
/* Element conversions, as st_f32_to_bf16 (round to nearest even) / st_bf16_to_f32. */
st_status_t st_cuda_f32_to_bf16(const st_gpu_stream_t *s, st_bf16_t *dst, const float *src, size_t n);
st_status_t st_cuda_bf16_to_f32(const st_gpu_stream_t *s, float *dst, const st_bf16_t *src, size_t n);
/* Chunked KDA prefill (SPEC §3.3) over a variable-length batch, K = V = 128.
 * q, k [T_tot, H, 128] bf16 (already L2-normed; the tensor-core tile inputs); v [T_tot, H, 128] bf16;
 * g [T_tot, H, 128] fp32 (log-decay, ≤ 0); beta [T_tot, H] fp32; cu_seqlens [B+1] int32; state pool
 * S [n_slots, H, 128, 128] fp32 ([key channel, value channel]); slots [B] (NULL: b), read and updated
 * in place; o [T_tot, H, 128] fp32 (not rounded). Tiles of 16 tokens; the diagonal tile's A_kk / A_qk
 * are dense tensor-core products when the tile's decay stays within e^80 (always so for a bounded
 * gate), otherwise that tile takes the per-pair form. */
st_status_t st_cuda_kda_chunked(const st_gpu_stream_t *s, float *o, const st_bf16_t *q, const st_bf16_t *k,
                                const st_bf16_t *v, const float *g, const float *beta, float *S, const int *slots,
                                const int *cu_seqlens, int B, int H, float scale);
/* Recurrent KDA decode (SPEC §3.2), one token for each of N sequences, state in place.
 * q, k, v [N, H, 128] fp32; g [N, H, 128] fp32; beta [N, H] fp32; S pool [n_slots, H, 128, 128]
 * fp32; slots [N] int32 (NULL: n); o [N, H, 128] fp32. */
st_status_t st_cuda_kda_decode(const st_gpu_stream_t *s, float *o, const float *q, const float *k, const float *v,
                               const float *g, const float *beta, float *S, const int *slots, int N, int H,
                               float scale);

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
/* scores [T, n] fp32: router logits in, σ(logits) out (in place). ids [T, ld] int32 (ld ≥ k; the
 * first k of each row, ascending), w [T, ld] fp32 (zeros past k): top-k of σ + bias (bias [n] or
 * NULL; ties → lower id), weights from the unbiased scores, renormalised if renorm, times scale;
 * cnt [T] (or NULL) ← k. k ≤ 32. */
st_status_t st_cuda_router_topk(const st_gpu_stream_t *s, int *ids, float *w, int ld, int *cnt, float *scores,
                                const float *bias, int T, int n, int k, bool renorm, float scale);
/* Greedy sampling: ids [T] int32 = argmax of logits [T, V] fp32 (ties → lower id). */
st_status_t st_cuda_argmax(const st_gpu_stream_t *s, int *ids, const float *logits, int T, int V);

/* ---------------- latent expert FFN, grouped (SPEC §6; kernels/moe_ffn.cu) ----------
 * Rows of the expert batch are grouped by expert: rows offsets[e] .. offsets[e+1]-1 of x belong to
 * expert e (offsets [E+1] int32, device, offsets[0] = 0, non-decreasing; empty experts allowed). */

/* MXFP4 weight → bf16, once at load. codes [rows, cols/2] U8 (low nibble = even column, OCP E2M1),
 * scale [rows, cols/32] U8 (E8M0, value = E2M1[code]·2^(s−127)); out [rows, cols] bf16 row-major.
 * cols % 32 == 0. (Exact: every E2M1 value times a power of two is a bf16 unless it overflows,
 * which gives ±inf as on the CPU.) */
st_status_t st_cuda_mxfp4_to_bf16(const st_gpu_stream_t *s, st_bf16_t *out, const uint8_t *codes,
                                  const uint8_t *scale, int rows, int cols);
/* Grouped expert FFN: for every expert e and its rows r (offsets above),
 *   y[r] = w2_e · act(w1_e x[r], w3_e x[r])        (act: SiTU(b1, b2) if situ, else SiLU-GLU)
 * x [N, l] bf16 (N = offsets[E] rows used); w1, w3 [E, w, l] bf16 (gate, up; row-major per expert,
 * experts contiguous); w2 [E, l, w] bf16; y [N, l] fp32 (the down GEMM's accumulators, not rounded). fp32 accumulation; the activation is
 * applied in fp32 to the fp32 gate/up accumulators (fused epilogue) and h is stored bf16 in ws (the
 * down GEMM's input). On sm_90 the GEMMs run on Hopper wgmma + TMA kernels (kernels/moe_ffn.cu picks
 * the cooperative or the ping-pong form per call), elsewhere on mma.sync.
 * offsets: device [E+1] int32; max_rows_per_expert ≥ max_e (offsets[e+1]-offsets[e]) bounds the
 * grid (pass N if unknown). l % 8 == 0, w % 8 == 0.
 * ws: st_cuda_moe_ffn_ws_bytes(N, w) bytes (h [N, w] bf16). */
size_t st_cuda_moe_ffn_ws_bytes(int N, int w);
st_status_t st_cuda_moe_ffn(const st_gpu_stream_t *s, float *y, const st_bf16_t *x, const int *offsets, int E, int N,
                            int max_rows_per_expert, const st_bf16_t *w1, const st_bf16_t *w3, const st_bf16_t *w2,
                            int l, int w, bool situ, float b1, float b2, void *ws, size_t ws_bytes);

/* Per routed slot, for decode-sized batches: for token t < T and slot i < cnt[t] with expert
 * e = ids[t·kc + i], y [t·kc + i, l] fp32 = w2_e · act(w1_e z_t, w3_e z_t) (z [T, l] bf16; h rounded to
 * bf16 as in st_cuda_moe_ffn, into h_ws [T·kc, w] bf16 scratch). Slots i ≥ cnt[t] are not written.
 * No grouping: each slot streams its expert's weights (a shared expert is read again, mostly from L2).
 * l, w multiples of 8; z, h_ws and the weights 16-byte aligned. CPU reference: st_ffn per slot. */
st_status_t st_cuda_moe_ffn_slots(const st_gpu_stream_t *s, float *y, st_bf16_t *h_ws, const st_bf16_t *z,
                                  const int *ids, const int *cnt, int T, int kc, const st_bf16_t *w1,
                                  const st_bf16_t *w3, const st_bf16_t *w2, int l, int w, bool situ, float b1,
                                  float b2);
/* The same per-row kernels over an expert server's dispatch: x [N, l] bf16 rows grouped by expert
 * (offsets [n_exp + 1] device, as st_cuda_moe_ffn_table), expert k's weights through tab
 * (device) [n_exp][3] = {w1, w3, w2}; y [N, l] fp32, h_ws [N, w] bf16 scratch (the first bytes of the
 * table ws will do). Each row's arithmetic is that of st_cuda_moe_ffn_slots, bit for bit, so a
 * server running the rows a worker flags per-row (ST_WIRE_FLAG_PER_ROW) returns what the worker's own
 * GPU engine would compute. N ≤ 65535; l, w multiples of 8; x, h_ws and the weights 16-byte aligned. */
st_status_t st_cuda_moe_ffn_rows_table(const st_gpu_stream_t *s, float *y, st_bf16_t *h_ws, const st_bf16_t *x,
                                       const int *offsets, int n_exp, int N, const st_bf16_t *const *tab, int l, int w,
                                       bool situ, float b1, float b2);
/* Whether st_cuda_moe_ffn_slots should run `slots` routed slots (T·kc) over E experts of these widths
 * rather than the grouped path: up to 64 slots and E/2 (kernels/moe_ffn.cu says why). */
bool st_cuda_moe_ffn_slots_pick(int slots, int E, int l, int w);

/* The grouped FFN for an expert server: each expert's weights anywhere on the device, through tab
 * (device) [E][3] = {w1 [w, l], w3 [w, l], w2 [l, w]} of expert e (the server binds experts one by
 * one), and the row counts also on the host: offsets_host [E+1] host memory, equal to offsets
 * (device), offsets_host[0] = 0, E ≤ 4096. y [N, l] fp32 as st_cuda_moe_ffn. One call for a whole
 * dispatch. Routing rule: min_rows_cublas 0 (what the server passes) runs every expert on the grouped
 * kernels where the Hopper wgmma kernels run (sm_90; one small kernel first builds a TMA tensor map per
 * expert weight from tab inside ws, so each tab pointer must be 16-byte aligned: the kernel traps
 * otherwise), elsewhere sends experts with rows·l·w ≥ 2^30 to cuBLAS; min_rows_cublas > 0 sends the
 * experts with at least that many rows to cuBLAS (gate and up GEMMs into a [rows, 2w] bf16 buffer, one
 * cublasGemmBatchedEx per run of adjacent experts with equal rows, ONE GLU kernel over all their rows,
 * the down GEMMs the same; same result to rounding: gate/up are rounded to bf16 before the activation
 * there). No host sync, no allocation: the pointer arrays cuBLAS reads are written into ws by a kernel.
 * ws: st_cuda_moe_ffn_table_ws_bytes(N, w), N = offsets_host[E], 256-byte aligned. */
size_t st_cuda_moe_ffn_table_ws_bytes(int N, int w);
/* Whether st_cuda_moe_ffn_table's queued work for experts of at most max_rows rows each depends on
 * nothing but E, N, ⌈max_rows / 128⌉ and the pointers (no expert through cuBLAS, whose calls follow
 * each expert's rows): a CUDA graph captured from one such call replays for another with those. */
bool st_cuda_moe_ffn_table_fixed(int max_rows, int min_rows_cublas, int l, int w);
st_status_t st_cuda_moe_ffn_table(const st_gpu_stream_t *s, float *y, const st_bf16_t *x, const int *offsets,
                                  const int *offsets_host, int E, int min_rows_cublas, const st_bf16_t *const *tab,
                                  int l, int w, bool situ, float b1, float b2, void *ws, size_t ws_bytes);

/* ---------------- router, quantile mode (SPEC §7; kernels/router_q.cu) ---------------- */
/* scores [T, n] fp32: router logits in, σ(logits) out (in place). Expert j active iff s_j ≥ tau[j]
 * (tau [n] fp32); keep at most kmax with the largest s_j − tau_j (ties → lower id); ids [T, kmax]
 * int32 ascending within a token, −1 past cnt; w [T, kmax] fp32 from the unbiased s (renormalised
 * over the active set if renorm, times scale), 0 past cnt; cnt [T] int32 (may be 0). kmax ≤ 64,
 * n ≤ 8192. */
st_status_t st_cuda_router_quantile(const st_gpu_stream_t *s, int *ids, float *w, int *cnt, float *scores,
                                    const float *tau, int T, int n, int kmax, bool renorm, float scale);
/* The same routing (bit for bit) with the threshold counts of the quantile summaries made in the same
 * pass (SPEC §7; docs/quantile.md): qc [n] uint32 device, qc[j] = #{t : s_tj ≥ tau_j}, and with rho
 * ([n] fp32 probe thresholds, or NULL) qc [2n]: qc[n + j] = #{t : exactly one of s_tj ≥ rho_j,
 * s_tj ≥ tau_j}; s the σ scores written back. Exactly st_route_count's integers (a NaN score or
 * threshold compares false). Zeroes qc itself (an async memset); T = 0: qc zeroed, nothing else. */
st_status_t st_cuda_router_quantile_count(const st_gpu_stream_t *s, int *ids, float *w, int *cnt, float *scores,
                                          const float *tau, int T, int n, int kmax, bool renorm, float scale,
                                          uint32_t *qc, const float *rho);

/* ---------------- Block AttnRes, two-phase (SPEC §5; kernels/attnres.cu) ---------------- */
/* Phase 1 (once per completed-block set) with the block push folded in: block i < m−1 at blocks + i·bstride
 * ([T, d] fp32 rows, bstride in floats ≥ T·d), the newest block read from newest [T, d] fp32 and written to
 * blocks + (m−1)·bstride by the same loads (newest NULL: all m blocks are in the list, nothing written);
 * w_eff [Q, d] fp32 (γ ⊙ w of each of the Q sublayer queries) → stats [T, Q, 2] fp32 (max score,
 * Σ exp(s_i − max)) and acc [T, Q, d] fp32 (Σ exp(s_i − max) V_i). m may be 0 (stats = (−inf, 0),
 * acc = 0); m ≤ 64, Q ≤ 64. Same as copying newest into its slot, then st_attnres_phase1 over the m
 * list blocks. One block per token (and query group); where that kernel does not apply (m = 0, rows
 * not 16-byte aligned, large m·Q) the general two-kernel form runs, T ≤ 65535 there. qpb: queries per
 * thread block (0: chosen by size; tests and benchmarks force 1 … Q).
 * x (may be NULL; m ≥ 1): the block-start norm in the same launch: xn [T, d] bf16 (and xlo, the bf16
 * remainder, when not NULL) = RMSNorm (norm_w [d] fp32, eps) of the m blocks mixed for the one more
 * query w_q [d] (not stored in stats/acc). Same as st_attnres_phase1 over blocks 0 … m − 2 and
 * st_attnres_phase2 with block m − 1 as the partial (AttnRes eps: the call's eps), then st_rmsnorm. */
typedef struct {
    const float *w_q, *norm_w;
    float eps;
    st_bf16_t *xn, *xlo;
} st_attnres_xnorm_t;
st_status_t st_cuda_attnres_phase1_push(const st_gpu_stream_t *s, float *stats, float *acc, float *blocks,
                                        size_t bstride, const float *newest, int m, const float *w_eff, int Q, int T,
                                        int d, float eps, int qpb, const st_attnres_xnorm_t *x);
/* Phase 2 (per sublayer q < Q) fused with the RMSNorm that follows it: for output row i < n_rows (source
 * row r = rows[i], or i when rows is NULL), h = st_attnres_phase2 of partial row r [d] fp32 (scored with
 * w_eff_q [d] fp32) with query q's phase-1 state stats/acc (stats NULL: h = partial row r, a plain RMSNorm),
 * then xn [n_rows, d] bf16 = bf16(st_rmsnorm(h; norm_w [d] fp32, norm_eps)); xlo (may be NULL) = bf16 of
 * the remainder v − xn. */
st_status_t st_cuda_attnres_phase2_rmsnorm(const st_gpu_stream_t *s, st_bf16_t *xn, st_bf16_t *xlo,
                                           const float *partial, const float *stats, const float *acc,
                                           const float *w_eff_q, int q, int Q, const float *norm_w, const int *rows,
                                           int n_rows, int d, float ar_eps, float norm_eps);

/* ---------------- MLA causal prefill, direct form, NoPE (SPEC §4; kernels/mla_prefill.cu) ------- */
/* One sequence: T queries at positions n−T .. n−1 over keys 0..n−1, causal (query t sees keys
 * 0 .. n−T+t). q [T, H, dqk] bf16; k [n, H, dqk] bf16; v [n, H, dv] bf16; o [T, H, dv] bf16.
 * o = softmax(q·kᵀ·scale) v with fp32 scores/softmax/accumulation (flash form, tensor cores).
 * (dqk, dv) ∈ {(192,128), (128,128), (64,64), (48,32)}; 1 ≤ T ≤ n. */
st_status_t st_cuda_mla_prefill(const st_gpu_stream_t *s, st_bf16_t *o, const st_bf16_t *q, const st_bf16_t *k,
                                const st_bf16_t *v, int T, int n, int H, int dqk, int dv, float scale);

/* ---------------- sampling (SPEC §9; kernels/sample.cu) ---------------- */
/* st_sample_rows (strata/kernels.h) on the device, one launch for n rows: the same rule, the same
 * token except within double rounding (see there). rows [n] (device) params; logits [*, V] fp32, the
 * rows named by rows[i].row processed in place; counts [*, V] int32 (NULL: none; one launch row per
 * counts row); bias_ids / bias_values: the rows' entries (device). Out (device): ids [n]; lp [n],
 * top_ids / top_lp [n, ST_SAMPLE_MAX_TOP] for rows with n_top ≥ 0 (NULL allowed when none has).
 * One block of 1024 threads per row; each top-k / top-p boundary costs 32 passes over its row. */
struct st_sample_row;
st_status_t st_cuda_sample(const st_gpu_stream_t *s, int *ids, float *lp, int *top_ids, float *top_lp, float *logits,
                           int n, int V, const struct st_sample_row *rows, const uint32_t *bias_ids,
                           const float *bias_values, int *counts);

/* ================ the GPU engine's kernels (moved from attention_worker/engine_gpu_kernels.cu) ================
 * fp32 activations between kernels; bf16 only where a tensor-core GEMM (or the chunked KDA tiles) reads
 * them. Optional `lo` outputs (may be NULL): the split bf16 form, lo = bf16(v − hi) next to hi = bf16(v),
 * so hi + lo carries v to ~16 bits (a GEMM then reads both and accumulates in fp32). Each launcher has
 * its plain C twin in strata/kernels.h (named in its comment); tests/gpu/test_gpu_glue_*.c compare them. */

/* ---- linear (kernels/linear.cu; cuBLAS on s's handle) ---- */
/* y [T, N] (row stride ldy) = x [T, K] (ldx) · Wᵀ, all fp32 (W [N, K] row-major); plain fp32 math.
 * C: st_sgemm. */
st_status_t st_cuda_sgemm(const st_gpu_stream_t *s, float *y, int ldy, const float *x, int ldx, const float *W, int T,
                          int N, int K);
/* Per head h < H: y_h [T, N] (at y + h·sy, row stride ldy) = x_h [T, K] (x + h·sx, ldx) · op(W_h),
 * W_h at W + h·sw: trans_w false: W_h [K, N] row-major (ldw N); true: W_h [N, K] row-major (ldw K). bf16 in,
 * y bf16 or fp32 (y_f32), fp32 accumulation. C: st_linear_heads. */
st_status_t st_cuda_linear_heads(const st_gpu_stream_t *s, void *y, bool y_f32, int ldy, long long sy,
                                 const st_bf16_t *x, int ldx, long long sx, const st_bf16_t *W, int ldw, long long sw,
                                 bool trans_w, int T, int N, int K, int H);

/* ---- embedding (kernels/embed.cu) ---- */
/* partial [T, d] fp32 = E[tok[t]] (E [V, d] bf16; tok [T] int32). C: st_embed. */
st_status_t st_cuda_embed(const st_gpu_stream_t *s, float *partial, const st_bf16_t *E, const int *tok, int T, int d);

/* ---- norms and activations (kernels/norm.cu, act.cu) ---- */
/* y [T, n] bf16 (+ lo) = RMSNorm(x [T, n] fp32; w [n] fp32 or NULL, eps); y must not alias x.
 * C: st_rmsnorm. */
st_status_t st_cuda_rmsnorm(const st_gpu_stream_t *s, st_bf16_t *y, st_bf16_t *lo, const float *x, const float *w,
                            int T, int n, float eps);
/* h [T, n] bf16 (+ lo) = act(gate [T, n], up [T, n]) fp32 with row stride ld_in (both may be halves of
 * one [T, 2n] buffer); situ: (b1·tanh(a/b1)·σ(a))·(b2·tanh(u/b2)), else SiLU(a)·u. C: st_glu. */
st_status_t st_cuda_glu(const st_gpu_stream_t *s, st_bf16_t *h, st_bf16_t *lo, const float *gate, const float *up,
                        int T, int n, int ld_in, bool situ, float b1, float b2);
/* y [n] bf16 (+ lo) = x ⊙ σ(gate), x and gate [n] fp32. C: st_mul_sigmoid. */
st_status_t st_cuda_mul_sigmoid(const st_gpu_stream_t *s, st_bf16_t *y, st_bf16_t *lo, const float *x,
                                const float *gate, size_t n);

/* ---- KDA (kernels/kda.cu; SPEC §3) ---- */
/* Decay gate in place on fp32 f → g [T, H*dk]: bounded: g = lb·σ(exp(A_log[h])·(f+dt_bias));
 * unbounded: g = −exp(A_log[h])·softplus(f+dt_bias). A_log [H], dt_bias [H*dk] fp32. C: st_kda_gate. */
st_status_t st_cuda_kda_gate(const st_gpu_stream_t *s, float *g, const float *A_log, const float *dt_bias, int T,
                             int H, int dk, bool bounded, float lb);
/* The low-rank f_b product and the gate in one launch: g [T, H*dk] = gate(aux[:, :R] (row stride naux)
 * · w_fbᵀ + dt_bias), w_fb [H*dk, R] fp32, R ≤ 256. The same bits for every T (the warp form below 8
 * tokens, a tiled form from 8 on, adding in the same order). C: st_kda_gate_fb. */
st_status_t st_cuda_kda_gate_fb(const st_gpu_stream_t *s, float *g, const float *aux, int naux, const float *w_fb,
                                int R, const float *A_log, const float *dt_bias, int T, int H, int dk, bool bounded,
                                float lb);
/* After the fused q|k|v conv: qkv [T, 3P] fp32 (P = H·dk) → q, k (L2-normed per head, l2eps), v [T, P]
 * fp32, and the same rounded to bf16 into qb, kb, vb unless qb == NULL; beta [T, H] fp32 =
 * σ(aux[t, boff + h]) (aux row stride ldaux). C: st_kda_prep. */
st_status_t st_cuda_kda_prep(const st_gpu_stream_t *s, float *q, float *k, float *v, st_bf16_t *qb, st_bf16_t *kb,
                             st_bf16_t *vb, float *beta, const float *qkv, const float *aux, int ldaux, int boff, int T,
                             int H, int dk, float l2eps);
/* out [T, H, dv] bf16 (+ lo) = RMSNorm(o_h; w [dv], eps) ⊙ σ(gate) with o [T, H, dv] fp32 and gate
 * [T, H·dv] fp32 (row stride ldg). C: st_kda_out_gate. */
st_status_t st_cuda_kda_out_gate(const st_gpu_stream_t *s, st_bf16_t *out, st_bf16_t *lo, const float *o,
                                 const float *gate, int ldg, const float *w, int T, int H, int dv, float eps);
/* Recurrent KDA (SPEC §3.2) for any dk = dv ≤ 128 over a variable-length batch, token by token:
 * arguments as st_cuda_kda_chunked, but q, k, v and o fp32. For head widths the tensor-core kernels do
 * not take. C: st_kda_recurrent per sequence. */
st_status_t st_cuda_kda_recurrent(const st_gpu_stream_t *s, float *o, const float *q, const float *k, const float *v,
                                  const float *g, const float *beta, float *S, const int *slots,
                                  const int *cu_seqlens, int B, int H, int dk, float scale);

/* ---- MLA (kernels/mla.cu; SPEC §4) ---- */
/* Cache write: row of token t = [RMSNorm(ckv[t, :kvr]; w, eps) ; ckv[t, kvr:R]] (ckv [T, R] fp32) into
 * pool [pages, page_size, R] (fp32 if f32, else bf16) at position tok_pos[t] of entry tok_ent[t]
 * (btab [n_ent, pps] page ids). C: st_mla_kv_store. */
st_status_t st_cuda_mla_kv_store(const st_gpu_stream_t *s, void *pool, bool f32, const float *ckv, const float *w,
                                 const int *tok_ent, const int *tok_pos, const int *btab, int pps, int page_size,
                                 int T, int kvr, int R, float eps);
/* qabs[t, h, kvr:R] = q[t, h, nope:nope+rope] (q [T, H, nope+rope] fp32; qabs [T, H, R] fp32 if f32,
 * else bf16; the W_UK part is written by st_cuda_linear_heads). C: st_mla_qpe. */
st_status_t st_cuda_mla_qpe(const st_gpu_stream_t *s, void *qabs, bool f32, const float *q, int T, int H, int nope,
                            int rope, int kvr);
/* Absorbed attention, causal: query t (qabs [T, H, R]) sees cache rows 0..tok_pos[t] of entry
 * tok_ent[t]; olat [T, H, kvr] bf16 (+ olo) = Σ_s softmax(q·k_s·scale) c̃_s. qabs and pool fp32 if f32,
 * else bf16. Any R ≤ 1024, kvr ≤ 512, kvr % 32 == 0. cu (may be NULL) [n_ent+1]: tokens of an entry
 * whose chunk has ≥ dmin tokens are skipped (the direct form takes them). C: st_mla_attn_absorbed. */
st_status_t st_cuda_mla_attn(const st_gpu_stream_t *s, st_bf16_t *olat, st_bf16_t *olo, const void *qabs,
                             const void *pool, bool f32, const int *tok_ent, const int *tok_pos, const int *btab,
                             int pps, int page_size, int T, int H, int R, int kvr, float scale, const int *cu,
                             int dmin);
/* Direct form for long prompt chunks: c [n, R] bf16 = one sequence's cache rows 0..n-1 (pool [pages,
 * page_size, R] bf16, page ids bt); R % 8 == 0. C: st_mla_gather. */
st_status_t st_cuda_mla_gather(const st_gpu_stream_t *s, st_bf16_t *c, const st_bf16_t *pool, const int *bt,
                               int page_size, int n, int R);
/* K [n, H, nope+rope] = [Y[n, h, :nope] ; c[n, kvr:kvr+rope]], V [n, H, dv] = Y[n, h, nope:nope+dv];
 * Y [n, H, nope+dv] bf16 (= c[:, :kvr] · W_kvbᵀ), c [n, R] bf16. C: st_mla_kv_split. */
st_status_t st_cuda_mla_kv_split(const st_gpu_stream_t *s, st_bf16_t *K, st_bf16_t *V, const st_bf16_t *Y,
                                 const st_bf16_t *c, int n, int H, int nope, int rope, int dv, int R, int kvr);

/* ---- routing tail, dispatch and combine (kernels/router.cu, moe.cu; SPEC §6, §7) ---- */
/* w [T, kc] fp32 from scores [T, n] (σ) over ids[t, 0..cnt[t]) (ids [T, kc] int32, chosen elsewhere):
 * renorm: s / (Σ s + 1e-20) · scale, else s · scale; 0 past cnt. Σ in slot order. C: st_route_finish. */
st_status_t st_cuda_route_finish(const st_gpu_stream_t *s, const int *ids, float *w, const int *cnt,
                                 const float *scores, int T, int n, int kc, bool renorm, float scale);
/* Grouping by expert (one block; E + 1 ints of shared memory): offsets [E+1] int32 (expert e's rows are
 * offsets[e] .. offsets[e+1]-1), row_of [T, kc] int32 (grouped row of slot (t, i), −1 for i ≥ cnt[t]).
 * NOTE: the order of rows within an expert may vary run to run (atomics); every consumer reads rows
 * through row_of, so no result depends on it. T = 0: nothing written. C: st_moe_group (one such order). */
st_status_t st_cuda_moe_group(const st_gpu_stream_t *s, int *offsets, int *row_of, const int *ids, const int *cnt,
                              int T, int kc, int E);
/* xg[row_of[t, i]] = z[t] for i < cnt[t] (bf16, width l, l even). C: st_moe_gather. */
st_status_t st_cuda_moe_gather(const st_gpu_stream_t *s, st_bf16_t *xg, const st_bf16_t *z, const int *row_of,
                               const int *cnt, int T, int kc, int l);
/* An expert server's distinct-rows dispatch expanded into its grouped order: dst [n, w] bf16, row r =
 * bf16(rows[src[r]]) of rows [n_in, w], fp32 (round to nearest even) or (bf16) already bf16; a source
 * ≥ n_in gives zeros (the wire decoder rejects those first); src [n] uint32. w % 4 == 0,
 * n ≤ 65535·64. C: st_moe_expand. */
st_status_t st_cuda_moe_expand(const st_gpu_stream_t *s, st_bf16_t *dst, const void *rows, bool bf16,
                               const uint32_t *src, int n, int n_in, int w);
/* Combine by the summation tree (docs/architecture.md, "Bit-exact expert results", rule 1; one
 * thread per column, strata/moe_tree.h), fp32, no FMA contraction: u = the tree over slots
 * i < cnt[t] (leaf id ids[t, i], ascending; ids/p [T, kc]) of fl(p[t, i] · y_i) + 0, with y_i =
 * yg[row_of[t, i]] (fp32 [rows, l], grouped) when yg != NULL, else yf[t·kc + i] (fp32 [T·kc, l], slot
 * order). p == NULL: the expert servers combined: with at (yg, yf NULL; the pointer table [T·kc] and
 * the rows it names may be mapped host memory, read uncached), u = the tree over the node values
 * at[t·kc + i] (fp32 [l]; NULL: no node starts at that slot) with ids ids[t, i]; else yf [T, l] fp32 is
 * u already; only the epilogue runs. Then: norm_w != NULL → un [T, l] bf16 (+ ulo) = RMSNorm(u;
 * norm_w, eps); un == NULL → partial [T, l] fp32 += u; otherwise un = u as bf16. C: st_moe_combine. */
st_status_t st_cuda_moe_combine(const st_gpu_stream_t *s, st_bf16_t *un, st_bf16_t *ulo, float *partial,
                                const float *yg, const float *yf, const float *const *at, const int *row_of,
                                const float *p, const int *ids, const int *cnt, const float *norm_w, int T, int kc,
                                int l, float eps);
/* An expert server's leaf table on the device, as st_moe_leaf_table (C) builds it, bit for bit: off
 * [n_out + 1], row/id/lp [n] from orow/p [n] and offsets [n_exp + 1] (int32, n = offsets[n_exp]) /
 * expert_ids [n_exp]; *err (device uint32) = the lowest output row naming an expert twice, or
 * 0xffffffff (the table is good): read it after the work. An orow ≥ n_out is left out (the wire
 * decoder rejects those first). ws: st_cuda_moe_leaf_table_ws_bytes(n_out) device bytes. One memset
 * and up to four launches, capturable. */
size_t st_cuda_moe_leaf_table_ws_bytes(int n_out);
st_status_t st_cuda_moe_leaf_table(const st_gpu_stream_t *s, uint32_t *off, uint32_t *row, uint32_t *id, float *lp,
                                   uint32_t *err, const uint32_t *orow, const float *p, const int *offsets,
                                   const uint32_t *expert_ids, int n_exp, int n, int n_out, void *ws);
/* An expert server's weighted tree sums into its output rows, device or mapped host memory: out
 * [n_out, l] fp32, row o = the tree over leaves k in [off[o], off[o+1]) of fl(p[k] · y[row[k]]) + 0,
 * ids id[k] strictly ascending within a row; y [*, l] fp32; off [n_out + 1], row/id/p [off[n_out]]
 * (uint32, fp32). n_out ≤ 65535·64. C: st_moe_tree_reduce. */
st_status_t st_cuda_moe_tree_reduce(const st_gpu_stream_t *s, float *out, const float *y, const uint32_t *off,
                                    const uint32_t *row, const uint32_t *id, const float *p, int n_out, int l);
/* The dispatch plan of one work item (C: st_moe_dispatch_plan, strata/kernels.h; the same tables, equal
 * over each table's valid prefix): p is a host descriptor whose table pointers (p->wts included, NULL:
 * not written) are device memory, its scratch fields unused; ids [T, kc] int32, cnt [T] int32, wts
 * [T, kc] fp32 (read only for p->wts), server_of [E] int32, tok_failed [T] uint8 (nonzero = flagged;
 * a token with a NONE leaf gets 1 here, on the device) all device memory. ws: device workspace of
 * st_cuda_moe_dispatch_plan_ws_bytes(T, kc, E, S) bytes (overwritten; 256-byte alignment expected).
 * Three launches (one when T = 0), no host sync, capturable. Limits: 1 ≤ kc ≤ 16, E ≤ 1024, S ≤ 255,
 * T ≤ 2^24, T·kc ≤ p->max_rows. Out-of-range ids or servers never take it out of bounds (an id
 * outside [0, E) fails its token; a server ≥ S is left out), where the C version assumes none. */
struct st_moe_plan;
size_t st_cuda_moe_dispatch_plan_ws_bytes(int T, int kc, int E, int S);
st_status_t st_cuda_moe_dispatch_plan(const st_gpu_stream_t *s, const struct st_moe_plan *p, const int *ids,
                                      const int *cnt, const float *wts, const int *server_of, uint8_t *tok_failed,
                                      int T, int kc, void *ws, size_t ws_bytes);

/* ---------------- flags (the transfer layer; C: st_flag_signal / st_flag_wait) ---------------- */
/* One-thread kernels, capturable in a CUDA graph. flag, epoch and err are device memory, another
 * process's memory opened through CUDA IPC, or mapped pinned host memory (all read and written at
 * system scope). signal: after the work queued before it on s (a copy, a kernel), a system-wide fence
 * and a release store of seq + (epoch ? *epoch : 0) into *flag. wait: the work queued after it on s
 * starts once *flag meets that target (acquire), or once timeout_ns (%globaltimer) have passed, which
 * stores ST_FLAG_ERR_TIMEOUT into *err (the watchdog: the stream, or a graph, drains instead of
 * hanging; the caller reads *err after the work and fails it). A wait returns at once while *err != 0.
 * timeout_ns 0 is refused (every wait is bounded). */
#define ST_FLAG_ERR_TIMEOUT 1u /* as in strata/kernels.h */
st_status_t st_cuda_flag_signal(const st_gpu_stream_t *s, uint32_t *flag, uint32_t seq, const uint32_t *epoch);
st_status_t st_cuda_flag_wait(const st_gpu_stream_t *s, const uint32_t *flag, uint32_t seq, const uint32_t *epoch,
                              uint64_t timeout_ns, uint32_t *err);

#ifdef __cplusplus
}
#endif
#endif
