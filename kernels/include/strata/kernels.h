/* Strata compute ops, CPU versions (kernels/<op>.c). Each op is a plain function over fp32
 * activations; the *_ref variants are loop-by-loop transcriptions of SPEC.md that tests (and the
 * CUDA kernels) are checked against. Kernels never allocate: callers pass workspace.
 * Layout: activations row-major [T, width] fp32 unless a comment says otherwise. */
#ifndef STRATA_KERNELS_H
#define STRATA_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "strata/base.h"
#include "strata/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------- linear algebra ---------------- */
/* y [T, W->rows] = x [T, W->cols] · Wᵀ. BLAS (sgemm) on fp32 panels; non-F32 weights are decoded
 * panel by panel into ws. ws: st_linear_ws_floats(W) floats.
 * NOTE: each output row depends only on its own input row (no batch-dependent reduction order), so
 * a token gets bit-identical results whatever else is in the batch. */
size_t st_linear_ws_floats(const st_weight_t *W);
void st_linear(float *y, const float *x, const st_weight_t *W, int T, float *ws);
void st_linear_ref(float *y, const float *x, const st_weight_t *W, int T); /* plain loops */
/* C [M,N] = A [M,K] · Bᵀ (B [N,K]), all fp32 row-major; BLAS. */
void st_gemm_nt(float *C, const float *A, const float *B, int M, int N, int K);
/* y [T, N] (row stride ldy) = x [T, K] (ldx) · Wᵀ, W [N, K]; plain loops (st_cuda_sgemm's twin). */
void st_sgemm(float *y, int ldy, const float *x, int ldx, const float *W, int T, int N, int K);
/* Per head h < H: y_h = x_h · op(W_h), y_h [T, N] at y + h·sy (row stride ldy), x_h [T, K] at x + h·sx
 * (ldx), W_h at W + h·sw: trans_w false: [K, N] (ldw N), true: [N, K] (ldw K). Plain loops
 * (st_cuda_linear_heads' twin). */
void st_linear_heads(float *y, int ldy, long long sy, const float *x, int ldx, long long sx, const float *W, int ldw,
                     long long sw, bool trans_w, int T, int N, int K, int H);
/* partial [T, d] = E[tok[t]] (E [V, d]; SPEC §2). */
void st_embed(float *partial, const float *E, const int *tok, int T, int d);

/* ---------------- norms & activations ---------------- */
/* y [T,n] = x / sqrt(mean(x²)+eps) ⊙ w  (w NULL: no weight). y may alias x. */
void st_rmsnorm(float *y, const float *x, const float *w, int T, int n, float eps);
/* in place, per head: x [T, H, dh] ← x / sqrt(Σx² + eps) */
void st_l2norm_heads(float *x, int T, int H, int dh, float eps);
float st_silu(float x);
float st_sigmoid(float x);
/* h [T,n] = act(gate [T,n], up [T,n]); SiTU: (b1·tanh(a/b1)·σ(a))·(b2·tanh(u/b2)); SiLU: silu(a)·u.
 * gate/up may be rows of one [T, 2n] buffer: pass ld (row stride in floats) for both inputs. */
void st_glu(float *h, const float *gate, const float *up, int T, int n, int ld_in, st_act_t act,
            float b1, float b2);
/* y [n] = x ⊙ σ(gate) */
void st_mul_sigmoid(float *y, const float *x, const float *gate, size_t n);

/* ---------------- KDA (SPEC §3) ---------------- */
/* Depthwise causal conv, kernel K, then SiLU. x [T, C]; w [C, K] fp32 (tap K-1 = newest);
 * state [K-1, C] holds the previous K-1 inputs, oldest first (zeros at sequence start); updated in
 * place to the last K-1 inputs. y [T, C] must not alias x. */
void st_conv_silu(float *y, const float *x, float *state, const float *w, int T, int C, int K);
/* Decay gate. f [T, H*dk] (= W_fb W_fa x) → g [T, H*dk] (may alias f).
 * bounded:   g = lb · σ(exp(A_log[h]) · (f + dt_bias))
 * unbounded: g = −exp(A_log[h]) · softplus(f + dt_bias) */
void st_kda_gate(float *g, const float *f, const float *A_log, const float *dt_bias, int T, int H,
                 int dk, bool bounded, float lb);
/* Recurrent KDA (the definition, §3.2), one sequence.
 * q,k,g [T, H, dk]; v [T, H, dv]; beta [T, H]; S [H, dk, dv] fp32 in/out; o [T, H, dv]. */
void st_kda_recurrent(float *o, const float *q, const float *k, const float *v, const float *g,
                      const float *beta, float *S, int T, int H, int dk, int dv, float scale);
/* Chunked KDA (§3.3), one sequence, 16-token tiles. bounded = the gate has a lower bound, so the
 * diagonal tile uses the dense (Q⊙Γ)(K/Γ)ᵀ form; otherwise a per-pair exponent form.
 * Same arguments and result (to rounding) as st_kda_recurrent. ws: st_kda_chunked_ws_floats. */
size_t st_kda_chunked_ws_floats(int H, int dk, int dv);
void st_kda_chunked(float *o, const float *q, const float *k, const float *v, const float *g,
                    const float *beta, float *S, int T, int H, int dk, int dv, float scale,
                    bool bounded, float *ws);
/* Output norm and gate: o [T, H, dv] ← RMSNorm(o_h; w_norm [dv], eps) ⊙ σ(gate [T, H*dv]) */
void st_kda_out_gate(float *o, const float *gate, const float *w_norm, int T, int H, int dv, float eps);
/* The low-rank f_b product and the gate: g [T, H*dk] = gate(aux[t, :R] (row stride naux) · w_fbᵀ)
 * (w_fb [H*dk, R]; gate as st_kda_gate). */
void st_kda_gate_fb(float *g, const float *aux, int naux, const float *w_fb, int R, const float *A_log,
                    const float *dt_bias, int T, int H, int dk, bool bounded, float lb);
/* After the fused q|k|v conv: qkv [T, 3·H·dk] → q, k (L2-normed per head, l2eps), v [T, H·dk];
 * beta [T, H] = σ(aux[t, boff + h]) (aux row stride ldaux). */
void st_kda_prep(float *q, float *k, float *v, float *beta, const float *qkv, const float *aux, int ldaux, int boff,
                 int T, int H, int dk, float l2eps);

/* ---------------- MLA (SPEC §4) ---------------- */
/* Paged latent cache of one sequence and layer: rows of width R = kv_lora + rope, fp32,
 * page_size rows per page; pages[i] points at page i. Owns nothing. */
typedef struct {
    float *const *pages;
    int page_size;
    int R;
    int n; /* rows valid */
} st_kv_view_t;
static inline float *st_kv_row(const st_kv_view_t *kv, int i) {
    return kv->pages[i / kv->page_size] + (size_t)(i % kv->page_size) * (size_t)kv->R;
}
/* Direct (prefill) form: T queries at positions n_ctx-T .. n_ctx-1 over keys 0..n_ctx-1, causal.
 * q [T, H, dqk]; k [n_ctx, H, dqk]; v [n_ctx, H, dv]; o [T, H, dv]. ws: n_ctx floats. */
void st_mla_attn_direct(float *o, const float *q, const float *k, const float *v, int T, int n_ctx,
                        int H, int dqk, int dv, float scale, float *ws);
/* Absorbed (decode) form: MQA over the latent cache. q_abs [T, H, R] (= [W_UKᵀ q_nope ; q_pe]);
 * query t sits at position kv->n - T + t and sees rows 0..that position.
 * o_lat [T, H, kv_lora] = Σ_s p_s c̃_s. ws: kv->n floats. */
void st_mla_attn_absorbed(float *o_lat, const float *q_abs, const st_kv_view_t *kv, int T, int H,
                          int kv_lora, float scale, float *ws);
/* The engine's paged cache, pool [pages, page_size, R] (page ids in btab [n_ent, pps] / bt):
 * kv_store: row tok_pos[t] of entry tok_ent[t] = [RMSNorm(ckv[t, :kvr]; w, eps) ; ckv[t, kvr:R]];
 * qpe: qabs[t, h, kvr:kvr+rope] = q[t, h, nope:nope+rope] (qabs [T, H, kvr+rope]);
 * gather: c [n, R] = rows 0..n-1 of one sequence; kv_split: K [n, H, nope+rope] = [Y[:, h, :nope] ;
 * c[:, kvr:kvr+rope]], V [n, H, dv] = Y[:, h, nope:] (Y [n, H, nope+dv]). */
void st_mla_kv_store(float *pool, const float *ckv, const float *w, const int *tok_ent, const int *tok_pos,
                     const int *btab, int pps, int page_size, int T, int kvr, int R, float eps);
void st_mla_qpe(float *qabs, const float *q, int T, int H, int nope, int rope, int kvr);
void st_mla_gather(float *c, const float *pool, const int *bt, int page_size, int n, int R);
void st_mla_kv_split(float *K, float *V, const float *Y, const float *c, int n, int H, int nope, int rope, int dv,
                     int R, int kvr);

/* ---------------- Block AttnRes (SPEC §5) ---------------- */
/* Direct form for one token: out [d] = Σ_i softmax(s)_i V_i over sources src[0..n_src) (each [d]),
 * s_i = Σ_c V_i[c]/sqrt(mean(V_i²)+eps) · w_eff[c], w_eff = γ ⊙ w. */
void st_attnres_direct(float *out, const float *const *src, int n_src, const float *w_eff, int d,
                       float eps);
/* Two-phase form.
 * Phase 1 (once per completed-block set, for Q queries): blocks [m][T, d] (m completed blocks, each
 * a [T,d] array), w_eff [Q, d] → stats [T, Q, 2] (running max, sum of exp) and acc [T, Q, d]
 * (Σ exp(s_i − max) V_i), i.e. the online-softmax state over the completed blocks.
 * Phase 2 (per sublayer q): merge the current partial [T, d] and write out [T, d]. m may be 0. */
void st_attnres_phase1(float *stats, float *acc, const float *const *blocks, int m, const float *w_eff,
                       int Q, int T, int d, float eps);
void st_attnres_phase2(float *out, const float *partial, const float *stats, const float *acc,
                       const float *w_eff_q, int q, int Q, int T, int d, float eps);

/* ---------------- router (SPEC §7) ---------------- */
/* s [T, n] = σ(logits) in place. */
void st_router_sigmoid(float *s, int T, int n);
/* top-k: ids [T, k] (ascending expert id within a token), w [T, k]; select by s + bias (bias may
 * be NULL), ties → lower id; weights from unbiased s, renormalised if renorm, times scale. */
void st_route_topk(int *ids, float *w, const float *s, const float *bias, int T, int n, int k,
                   bool renorm, float scale);
/* quantile: expert j active iff s_j >= tau[j]; keep at most kmax with the largest s_j − tau_j
 * (ties → lower id); ids [T, kmax] ascending within a token, cnt [T] (may be 0). */
void st_route_quantile(int *ids, float *w, int *cnt, const float *s, const float *tau, int T, int n,
                       int kmax, bool renorm, float scale);
/* Weights of given sets: w [T, kc] from s [T, n] over ids[t, 0..cnt[t]) (renorm: s / (Σ s + 1e-20)),
 * times scale; 0 past cnt. Σ in slot order. */
void st_route_finish(const int *ids, float *w, const int *cnt, const float *s, int T, int n, int kc, bool renorm,
                     float scale);

/* Threshold counts (SPEC §7; docs/quantile.md, the counting estimator's worker side) of σ scores
 * s [T, n] fp32 row-major against tau [n] and rho [n] fp32: cnt [n] uint32, cnt[j] = #{t : s_tj ≥ tau_j};
 * band [n] uint32 (only when rho and band are both non-NULL) = #{t : exactly one of s_tj ≥ rho_j,
 * s_tj ≥ tau_j}. A NaN score or threshold compares false (NaN tau counts nothing). The same integers
 * as st_qsum_count_layer (common/quantile); CUDA: st_cuda_router_quantile_count (in the router's pass). */
void st_route_count(uint32_t *cnt, uint32_t *band, const float *s, const float *tau, const float *rho, int T, int n);

/* ---------------- FFN (SPEC §6) ---------------- */
/* GLU feed-forward: y [T, down->rows] = down · act(gate x, up x); x [T, gate->cols].
 * Used for dense layers, shared experts and routed experts. ws: st_ffn_ws_floats(T, ...) floats. */
size_t st_ffn_ws_floats(int T, const st_weight_t *gate, const st_weight_t *up, const st_weight_t *down);
void st_ffn(float *y, const float *x, int T, const st_weight_t *gate, const st_weight_t *up,
            const st_weight_t *down, st_act_t act, float b1, float b2, float *ws);

/* ---------------- MoE dispatch and combine (SPEC §6) ---------------- */
/* Grouping: offsets [E+1] (expert e's rows offsets[e] .. offsets[e+1]-1), row_of [T, kc] (grouped row of
 * slot (t, i), rows of an expert in (t, i) order; −1 for i ≥ cnt[t]). ids [T, kc], cnt [T]. */
void st_moe_group(int *offsets, int *row_of, const int *ids, const int *cnt, int T, int kc, int E);
/* xg[row_of[t, i]] = z[t] for i < cnt[t]; z [T, l]. */
void st_moe_gather(float *xg, const float *z, const int *row_of, const int *cnt, int T, int kc, int l);
/* An expert server's distinct-rows dispatch expanded into its grouped order: dst [n, w] bf16, row r =
 * bf16(rows[src[r]]) (round to nearest even) of rows [n_in, w], fp32 or (bf16) already bf16; a source
 * ≥ n_in gives zeros. */
void st_moe_expand(uint16_t *dst, const void *rows, bool bf16, const uint32_t *src, int n, int n_in, int w);
/* The combine's summation tree (docs/architecture.md, "Bit-exact expert results", rule 1), as the
 * rule reads: n entries, ids [n] strictly ascending (a leaf's expert id, or a tree node's first
 * leaf), rows v [n, l] fp32 (a leaf's row is fl(p·y) + 0). For h = 0, 1, ...: each adjacent pair
 * whose ids agree above bit h merges into the lower one, v = fl(left + right), until one is left.
 * Result in v[0] (n = 0: v untouched, the value is +0); v and ids are overwritten. */
void st_moe_tree_rows(float *v, uint32_t *ids, int n, int l);
/* An expert server's leaf table, the input of st_moe_tree_reduce: its n pairs, grouped (pair r of
 * expert expert_ids[k] when offsets[k] ≤ r < offsets[k + 1], experts ascending; weight p[r], output
 * row orow[r] < n_out), listed by output row: off [n_out + 1], row o's leaves k in [off[o], off[o+1]);
 * row/id/lp [n]: each leaf's pair, expert id and weight, a row's leaves in pair order (so ids
 * ascending). Returns −1, or the lowest output row that names an expert twice (the table is then not
 * to be used). */
int st_moe_leaf_table(uint32_t *off, uint32_t *row, uint32_t *id, float *lp, const uint32_t *orow, const float *p,
                      const uint32_t *offsets, const uint32_t *expert_ids, int n_exp, int n_out);
/* Weighted tree sums into output rows (an expert server's reply): out [n_out, l] fp32, row o = the
 * tree over leaves k in [off[o], off[o+1]) of fl(p[k] · y[row[k]]) + 0 with ids id[k] (strictly
 * ascending within a row); y [*, l] fp32; off [n_out + 1], row/id/p [off[n_out]]. An empty row is
 * +0. Per column, the stack form of strata/moe_tree.h (same bits as st_moe_tree_rows). */
void st_moe_tree_reduce(float *out, const float *y, const uint32_t *off, const uint32_t *row, const uint32_t *id,
                        const float *p, int n_out, int l);
/* u_t = the tree over token t's slots i < cnt[t] (leaf id ids[t, i], ascending) of fl(p[t, i] · y_i) + 0,
 * y_i = yg[row_of[t, i]] (yg != NULL) or yf[t·kc + i]. p == NULL: the expert servers combined (an
 * attention worker's): with at (p, yg, yf NULL), u_t = the tree over the node values at[t·kc + i]
 * (rows [l] fp32; a slot whose pointer is NULL starts no node) with ids ids[t, i] (+0 without any),
 * else yf [T, l] is u already; only the epilogue runs. u != NULL: u [T, l] = u_t, RMSNorm'd (norm_w,
 * eps) when norm_w != NULL; else partial [T, l] += u_t. */
void st_moe_combine(float *u, float *partial, const float *yg, const float *yf, const float *const *at, const int *row_of,
                    const float *p, const int *ids, const int *cnt, const float *norm_w, int T, int kc, int l, float eps);
/* st_moe_combine's node-value mode in the rows form (the CPU engine's: whole rows, a node copied, two
 * added): u [T, l] = each token's tree over its node values at[t·kc + i] (ids ids[t, i]), the same
 * bits. scratch [T·kc, l]: token t's node rows are gathered into its rows t·kc... when it has three
 * or more; at may point into those rows of the same token (read before they are overwritten). tid
 * [kc] scratch. */
void st_moe_finish_nodes(float *u, const float *const *at, const int *ids, const int *cnt, int T, int kc, int l,
                         float *scratch, uint32_t *tid);

/* ---------------- MoE dispatch plan (kernels/dispatch_plan.c; CUDA: st_cuda_moe_dispatch_plan) ----------------
 * One work item's bookkeeping for the expert servers: which (token, expert) pairs go to which server
 * (grouped by expert, experts ascending, tokens ascending within an expert), the distinct tokens each
 * server gets (ascending), and the summation tree split between the servers: each token's leaves cut
 * into the largest nodes of the binary tree over expert ids that one server holds entirely
 * (docs/architecture.md, "Bit-exact expert results"), each node one output row of its server,
 * numbered per server in token order, then left to right. A descriptor: it owns nothing; whoever
 * fills the pointers frees them. S = n_servers, E = n_experts, M = max_rows (≥ T·kc, the row stride
 * of the per-server tables). Each table is valid only over the prefix its count names; the rest is
 * left as it was. */
#define ST_MOE_PLAN_NONE (-1) /* server_of: no live server holds the expert (its tokens fail) */
#define ST_MOE_PLAN_SKIP (-2) /* server_of: leave the expert's pairs out (a retry round) */
typedef struct st_moe_plan {
    int n_servers, n_experts, max_rows; /* S, E, M */
    int *n_rows;                        /* [S] int32: pairs sent to server s */
    int *n_exp;                         /* [S] int32: experts of server s with ≥ 1 pair */
    uint32_t *exp_ids;                  /* [S, E] uint32, row s valid over n_exp[s]: those experts, ascending */
    /* [S, E + 1] uint32, row s valid over n_exp[s] + 1: expert k's pairs are rows offsets[k] ..
     * offsets[k+1]-1 (offsets[0] = 0, also for a server without pairs) */
    uint32_t *offsets;
    int *pair;      /* [S, M] int32, row s valid over n_rows[s]: pair r → its slot t·kc + i */
    uint32_t *orow; /* [S, M] uint32, valid over n_rows[s]: pair r → its output row (tree node) */
    uint32_t *src;  /* [S, M] uint32, valid over n_rows[s]: pair r → its token's index in utok */
    /* [S, M] fp32, valid over n_rows[s]: pair r's routing weight wts[pair]; NULL: not written (the C
     * version also leaves it when its wts argument is NULL) */
    float *wts;
    int *n_out;  /* [S] int32: output rows (tree nodes) of server s */
    int *node;   /* [S, M] int32, valid over n_out[s]: output row → slot t·kc + i of its node's first leaf */
    int *n_uniq; /* [S] int32: distinct tokens of server s */
    int *utok;   /* [S, M] int32, valid over n_uniq[s]: distinct token index → token t, ascending */
    /* scratch of the C version only (st_cuda_moe_dispatch_plan takes a workspace and ignores these) */
    int *slot_row; /* [M] int32: slot → its output row, −1 when not sent */
    int *last;     /* [S] int32: each server's last token */
    int *ecur;     /* [E] int32: pairs per expert, then each expert's next row */
    int *tag;      /* [kc] int32: a token's leaves' servers */
    uint32_t *tid; /* [kc] uint32: a token's expert ids */
} st_moe_plan_t;
/* Fills p's tables from one work item's routing: per token t < T, cnt[t] ≤ kc experts ids[t·kc + i]
 * (int32 in [0, E), distinct, ascending within a token; ids/wts [T, kc], cnt [T]), routing weights wts
 * [T, kc] fp32 (may be NULL when p->wts is), server_of [E] int32 (a server in [0, S), ST_MOE_PLAN_NONE
 * or ST_MOE_PLAN_SKIP). A token with a NONE leaf is flagged in tok_failed [T] (set, never cleared) and
 * sends nothing; tokens already flagged, or with cnt 0, send nothing. A skipped leaf bounds the nodes
 * like another server's, and a node of skipped leaves is not sent. */
void st_moe_dispatch_plan(const st_moe_plan_t *p, const int *ids, const int *cnt, const float *wts,
                          const int *server_of, bool *tok_failed, int T, int kc);
/* All of a plan's tables (for S servers, E experts, M rows; the C scratch for kc slots a token) laid
 * out in one block of st_moe_plan_bytes bytes at base (host or device memory, 256-byte aligned; each
 * table 256-byte aligned), in the order of the struct: the counts n_rows | n_exp | n_out | n_uniq,
 * exp_ids and offsets first (st_moe_plan_counts_bytes of them: one copy moves them all). */
size_t st_moe_plan_bytes(int S, int E, int M, int kc);
size_t st_moe_plan_counts_bytes(int S, int E);
void st_moe_plan_carve(st_moe_plan_t *p, int S, int E, int M, int kc, void *base);

/* ---------------- sampling (SPEC §9) ---------------- */
/* Index of the largest of x[0..V) (ties → the lower index: greedy decoding). */
int st_argmax(const float *x, int V);

/* ---------------- sampling of a batch of rows, the engine's op (SPEC §9; kernels/sample.c,
 * CUDA twin st_cuda_sample in kernels/sample.cu). One row's rule, in order:
 *  1. processing, in place: x_v -= frequency · count_v + presence for count_v > 0 (the row's counts of
 *     its sequence's generated tokens, OpenAI's penalties), then x[bias_ids[i]] += bias_values[i] in
 *     list order (ids ≥ V ignored). The processed row is what logprobs and a caller's logits see.
 *  2. greedy (temperature ≤ 0 or top_k = 1): the argmax, ties → the lower id.
 *  3. otherwise s_v = (x_v − m) / temperature (float, m the row's max) and the kept set:
 *     top-k (0 < k < V): the k largest x, ties at the boundary → the lower ids;
 *     top-p (< 1): within that, every token whose x is ≥ the largest value τ for which
 *     Σ_{kept, x ≥ τ} e^{s} ≥ max(top_p · Σ_kept e^{s}, 1) (the smallest head of the kept set, in x
 *     order, that holds top_p of its mass; ties at τ are kept whole; the max is always kept).
 *     The token is the argmax over the kept set of s_v − log(−log u_v) (Gumbel-max, ties → the lower
 *     id), u_v the uniform of (seed, pos, v) (kernels/sample_rule.h): a pure function of the stream's
 *     seed, the token's position and the logits, whatever the batch or the backend.
 *  4. count_v of the chosen token += 1 (when the row has a counts row).
 *  5. n_top ≥ 0: the chosen token's log-probability under softmax(x) (temperature 1, processed) and
 *     the n_top most likely (x descending, ties → lower id) with theirs.
 * NOTE: CPU and GPU pick the same token except where two perturbed scores, or a top-p head's mass and
 * its target, are within double rounding (the masses and logs run in double; every comparison that
 * decides membership or the argmax is on bit-identical floats otherwise). Logprobs agree to float
 * rounding. */
#define ST_SAMPLE_MAX_TOP 20
typedef struct st_sample_row {
    float temperature;         /* ≤ 0: greedy */
    float top_p;               /* ≥ 1: off */
    float presence, frequency; /* penalties; 0 = off */
    int top_k;                 /* ≤ 0 or ≥ V: off */
    int n_top;                 /* −1: no logprobs; else the chosen token's and the n_top (≤ 20) most likely */
    int bias_off, n_bias;      /* the row's logit_bias: bias_ids / bias_values [bias_off, bias_off + n_bias) */
    int row;                   /* the row of logits it samples */
    int count_row;             /* the row's row of counts (its sequence slot); −1: none (penalties off) */
    uint32_t pos;              /* the token's index in its sequence's generated tokens */
    uint64_t seed;             /* the stream's seed (one per sequence) */
} st_sample_row_t;
/* rows [n] params (host); logits [*, V] fp32, the rows named by rows[i].row processed in place;
 * counts [*, V] int32 (NULL: no row has one; a counts row belongs to at most one row of a call);
 * bias_ids / bias_values: the rows' entries. Out: ids [n]; lp [n] and top_ids / top_lp
 * [n, ST_SAMPLE_MAX_TOP] for rows with n_top ≥ 0 (may be NULL when none has). */
void st_sample_rows(int *ids, float *lp, int *top_ids, float *top_lp, float *logits, int n, int V,
                    const st_sample_row_t *rows, const uint32_t *bias_ids, const float *bias_values, int *counts);

/* ---------------- flags (the transfer layer's signal / wait; CUDA: st_cuda_flag_*) ---------------- */
/* A flag is a 32-bit sequence word that only grows (mod 2^32); a wait for seq is met once
 * (int32_t)(*flag - target) >= 0 with target = seq + (epoch ? *epoch : 0) (the epoch lets one captured
 * CUDA graph use new sequence numbers at every replay). NOTE: signal is a release store, the wait's
 * load an acquire load: what the signaller wrote before the signal is visible after the wait.
 * Error word err (optional): 0 = fine; the wait sets ST_FLAG_ERR_TIMEOUT when its deadline passes and
 * returns at once while *err != 0, so a chain of waits drains after the first timeout. */
#define ST_FLAG_ERR_TIMEOUT 1u
void st_flag_signal(uint32_t *flag, uint32_t seq, const uint32_t *epoch);
/* true when flag met seq (+epoch) now */
bool st_flag_met(const uint32_t *flag, uint32_t seq, const uint32_t *epoch);
/* Spins (with a pause instruction) until flag meets seq: returns true; or until *err != 0 or
 * timeout_ns have passed (on CLOCK_MONOTONIC): returns false, and a timeout also stores
 * ST_FLAG_ERR_TIMEOUT into *err (err may be NULL: then a timeout just returns false). */
bool st_flag_wait(const uint32_t *flag, uint32_t seq, const uint32_t *epoch, uint64_t timeout_ns, uint32_t *err);

#ifdef __cplusplus
}
#endif
#endif
