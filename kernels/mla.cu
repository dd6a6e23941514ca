/* MLA absorbed decode on the GPU (SPEC §4): MQA of H query heads over a paged latent cache of rows
 * [c̃ (512) ; k_pe (64)] bf16, split-KV (FlashMLA-like): each block takes one split of one sequence
 * for up to 64 heads (the cache is read once per 64 heads; H > 64 runs ceil(H/64) head groups, fewer
 * heads are zero-padded), 64-token tiles, QKᵀ and P·C̃ on Hopper wgmma (sm_90a), online softmax in
 * registers; a second kernel merges the splits. The kernel is v6, warp-specialised: a producer
 * warpgroup issues every load (TMA boxes of 32 rows, cp.async where a page or the split's end cuts a
 * group) into the two K buffers through full/empty mbarriers, two consumer warpgroups run v2's tensor
 * work and softmax (described below), a persistent grid walks all (split, sequence, head group) items.
 * v2 itself (one block per split, gathers by the compute warps) lost to v6 and was deleted with the
 * variant switch (docs/kernels.md).
 * Removed after measuring (2026-11-30, see docs/perf/history.md): v3 (v2 + L2 prefetch from the compute warps)
 * and v4 (TMA boxes of 8 rows), slower than v2 everywhere; v5 (v2 + 32-row TMA boxes from warp 0) and
 * v8 (FlashMLA's seesaw: one warpgroup scores a 64-token tile with m64n64, P shared through shared
 * memory), slower than v6 everywhere; v7 (v6 + an L2 bulk prefetch of a later tile from the producer
 * + the combine as a programmatic dependent), no faster than v6 at every H = 64 shape; v15 (v6 with Q
 * in the consumers' registers, split by dims between the two warpgroups that swap partial scores
 * through shared memory, and a ring of five 32-row slots), slower than v6 at 32K, level at 4K.
 * CPU reference: st_mla_attn_absorbed (kernels/mla.c). */
#include <cuda.h> /* CUtensorMap types only: the encoder comes through cudaGetDriverEntryPointByVersion */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_common.cuh"

#define DR 576 /* key width: kv_lora 512 + rope 64 */
#define DVL 512
#define SPLIT_ALIGN 32 /* the caller's split_len must be a multiple of this (API) */


/* ---------------- 64 heads per block, 64-token tiles, softmax in registers ----------------
 * 8 warps (2 warpgroups); warp w owns the 16 heads hg = w & 3 and the half h = w >> 2 (its warpgroup).
 * QKᵀ: warpgroup h scores tokens [32h, 32h+32) of the tile for all 64 heads with a chain of wgmma
 * m64n32k16 (Q and K from shared memory), so warp (hg, h) holds S for its 16 heads × 32 tokens in the
 * mma.sync accumulator layout. The two warps of a head group swap row maxima and bf16 P halves through
 * shared memory; then warpgroup h accumulates P·C̃ for dims [256h, 256h+256) with wgmma m64n256k16
 * (P from registers, C̃ = the same K tile read N-major). Q and the K tiles sit in shared memory in the
 * wgmma 128-byte-swizzle layout: 9 column blocks of 64 elements, each [64 rows][128 B] with the
 * 16-byte chunk index XORed with row % 8 (conflict-free for the ldmatrix fallback too). Two K buffers:
 * tile t+1's paged rows (cp.async) are gathered behind tile t's QKᵀ wgmmas, and tile t's P·C̃ is left in
 * flight until tile t+1's QKᵀ is queued behind it.
 * Measured on the H200 (bench_gpu_mla, 2026-11-30), B=64 ctx=32K H=64: all mma.sync 218 TFLOP/s;
 * wgmma QKᵀ 280; wgmma QKᵀ + P·C̃ 340; + overlaps above 360 (70% of copy). Same shape, later run:
 * 0.787 ms (72.3% of copy); the gathers alone 0.604 ms (94%), the tensor work alone 0.579 ms (98%):
 * each half is near the copy time, and what is lost is their overlap (see docs/perf/history.md). */
#define TK2 64
#define NH2 64                /* heads per block */
#define NCH (DR / 8)          /* 16-byte chunks per row */
#define CB_BYTES (64 * 128)   /* one column block of a 64-row operand */
#define OPND_BYTES (DR * 2 * 64) /* a 64-row operand: 73728 B */
#define LDP2 72               /* P row stride (bf16), padded: conflict-free stores and ldmatrix */

/* wgmma needs the sm_90a target (kernels/CMakeLists.txt builds 90a) */
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MLA_WGMMA 1
#else
#define MLA_WGMMA 0
#endif

/* byte offset of (row r, 16-byte chunk c) in a 64-row operand */
__device__ __forceinline__ unsigned mla_swz(int r, int c) {
    return (unsigned)((c >> 3) * CB_BYTES + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}
__device__ __forceinline__ void mla_pair_bar(int id) { asm volatile("bar.sync %0, 64;\n" ::"r"(id) : "memory"); }

/* The online softmax of one 64-token tile (base 2) for a warp's 16 heads × 32 tokens s (tokens from
 * tok0; those ≥ s1 masked): the pair's row maxima through sm.red, running max m and sum l of rows gq
 * and gq + 8 updated, acc rescaled when a maximum moved, and P as this warp's A fragments pa (k-steps
 * 2·half, 2·half + 1) and into sm.Ps for the partner warp (the caller's pair barrier publishes it).
 * (v2, deleted, shared it with v6.) */
template <class Smem>
__device__ __forceinline__ void mla_tile_softmax(float (&s)[4][4], float (&acc)[32][4], uint32_t (&pa)[2][4],
                                                 float &m0, float &m1, float &l0, float &l1, Smem &sm, int tok0,
                                                 int s1, float scale_log2, int w, int hg, int half, int gq, int tq) {
    const bool full = tok0 + 32 <= s1;
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < 4; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const bool ok = full || tok0 + nt * 8 + tq * 2 + (e & 1) < s1;
            s[nt][e] = ok ? s[nt][e] * scale_log2 : -INFINITY;
            if (e < 2) mx0 = fmaxf(mx0, s[nt][e]);
            else mx1 = fmaxf(mx1, s[nt][e]);
        }
#pragma unroll
    for (int o = 1; o <= 2; o <<= 1) {
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, o));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, o));
    }
    if (tq == 0) sm.red[w][gq] = mx0, sm.red[w][gq + 8] = mx1;
    mla_pair_bar(1 + hg);
    mx0 = fmaxf(mx0, sm.red[w ^ 4][gq]);
    mx1 = fmaxf(mx1, sm.red[w ^ 4][gq + 8]);
    const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1); /* finite: every tile holds a row */
    const float al0 = exp2f(m0 - mn0), al1 = exp2f(m1 - mn1);
    m0 = mn0, m1 = mn1;
    float ps0 = 0.f, ps1 = 0.f;
#pragma unroll
    for (int nt = 0; nt < 4; nt++) {
        const float p0 = exp2f(s[nt][0] - mn0), p1 = exp2f(s[nt][1] - mn0);
        const float p2 = exp2f(s[nt][2] - mn1), p3 = exp2f(s[nt][3] - mn1);
        ps0 += p0 + p1, ps1 += p2 + p3;
        const uint32_t lo = st_pack_bf2(p0, p1), hi = st_pack_bf2(p2, p3);
        pa[nt >> 1][(nt & 1) * 2 + 0] = lo;
        pa[nt >> 1][(nt & 1) * 2 + 1] = hi;
        st_bf16_t *pr = sm.Ps[hg] + gq * LDP2 + half * 32 + nt * 8 + tq * 2;
        *reinterpret_cast<uint32_t *>(pr) = lo;
        *reinterpret_cast<uint32_t *>(pr + 8 * LDP2) = hi;
    }
    l0 = l0 * al0 + ps0, l1 = l1 * al1 + ps1;
    if (__any_sync(0xffffffffu, al0 != 1.f || al1 != 1.f)) { /* skipped when no row max of the warp moved */
#pragma unroll
        for (int i = 0; i < 32; i++) acc[i][0] *= al0, acc[i][1] *= al0, acc[i][2] *= al1, acc[i][3] *= al1;
    }
}

#if MLA_WGMMA
/* smem matrix descriptor, 128-byte swizzle: K-major operands use lbo 16 (unused), sbo 1024 (8-row
 * groups); N-major ones lbo = the 64-column block stride, sbo 1024 (8-row groups along K) */
__device__ __forceinline__ uint64_t mla_desc(unsigned addr, unsigned lbo, unsigned sbo) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32) |
           ((uint64_t)1 << 62);
}
__device__ __forceinline__ void mla_wgmma_n32(float d[4][4], uint64_t da, uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),
          "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),
          "+f"(d[3][2]), "+f"(d[3][3])
        : "l"(da), "l"(db), "r"(1));
}
/* S (16 heads × 32 tokens per warp) += Q Kᵀ of this warp's token half of the tile at kb: the wgmmas
 * queued and committed as one group (v2 and v6) */
__device__ __forceinline__ void mla_qk_issue(float (&s)[4][4], unsigned q_base, unsigned kb, int half) {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int kk = 0; kk < DR / 16; kk++) {
        const unsigned off = (kk >> 2) * CB_BYTES + (kk & 3) * 32;
        mla_wgmma_n32(s, mla_desc(q_base + off, 16, 1024), mla_desc(kb + off + half * 32 * 128, 16, 1024));
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
/* d[64 × 256] += A[64 × 16] · B[16 × 256]: A from registers (per warp the mma.sync A fragment of its
 * 16 rows), B in shared memory N-major (128-byte swizzle: 64-column blocks LBO apart, 8-row groups SBO
 * apart) */
__device__ __forceinline__ void mla_wgmma_n256_rs(float d[32][4], const uint32_t a[4], uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
        ST_WG_D256_LIST
        "}, {%128,%129,%130,%131}, %132, p, 1, 1, 1;\n}\n"
        : ST_WG_D256_OPS(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
#endif

#if MLA_WGMMA
/* mbarrier wait (v6's gathers; init, expect-tx and the TMA copy: cuda_common.cuh) */
/* wait for the phase of parity par to complete. The retry loop lives inside the asm (as CUTLASS does):
 * a C loop around try_wait is a divergent path to ptxas, which then serialises every wgmma (C7518).
 * Where the wait sits between wgmmas in flight (v6's consumers) even this loop does: use mla_bar_wait_u. */
__device__ __forceinline__ void mla_bar_wait(unsigned bar, unsigned par) {
    asm volatile(
        "{\n.reg .pred p;\nMLA_WAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
        "@!p bra MLA_WAIT_%=;\n}\n" ::"r"(bar),
        "r"(par)
        : "memory");
}
#endif

/* ---------------- v6: warp-specialised, producer warpgroup + two consumer warpgroups ----------------
 * 384 threads. Warpgroup 0 (the producer, setmaxnreg.dec 40) issues every global load: Q once, then
 * each 64-token tile's cache rows with cp.async into one of the two K buffers, completing per half
 * tile (32 rows) on full[buf][half] through cp.async.mbarrier.arrive.noinc; before refilling a buffer
 * it waits on empty[buf]. It reads the page table for a tile before that wait, so the lookups overlap
 * the consumers' work. Warpgroups 1–2 (the consumers, setmaxnreg.inc 232) run v2's tensor work and
 * softmax unchanged (consumer warpgroup h scores tokens [32h, 32h+32) with wgmma m64n32, the pair of
 * warps of a head group swaps maxima and P through shared memory, then warpgroup h accumulates P·C̃ for
 * dims [256h, 256h+256) with wgmma m64n256): they only wait on "full" (their own half before QKᵀ, the
 * other half before P·C̃) and arrive on "empty" (one arrive per warp, once the buffer's P·C̃ is done),
 * so no load or page-table read sits in their issue stream. Two 64-token buffers are the most that fit
 * beside Q (3 × 73.7 KB of the 227 KB).
 * (v2's comment above describes the tensor work; the v2 kernel itself lost to v6 and was deleted:
 * docs/kernels.md.) */
#define NT6 384
struct MlaSmem6 {
    unsigned char Qs[OPND_BYTES];
    unsigned char Ks[2][OPND_BYTES];
    st_bf16_t Ps[4][16 * LDP2];
    float red[8][16];
    unsigned long long full[2][2], empty[2], qfull, qempty;
};

#if MLA_WGMMA
__device__ __forceinline__ void mla_bar_arrive(unsigned bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
/* arrive on bar where p holds, predicated (no branch around it: a divergent path near the wgmmas makes
 * ptxas serialise them, C7518) */
__device__ __forceinline__ void mla_bar_arrive_if(unsigned bar, bool p) {
    asm volatile("{\n.reg .pred q;\nsetp.ne.b32 q, %1, 0;\n@q mbarrier.arrive.shared::cta.b64 _, [%0];\n}\n" ::"r"(bar),
                 "r"((int)p)
                 : "memory");
}
/* wait as mla_bar_wait, for code between wgmmas: the retry loop's condition is a warp vote, so ptxas sees a
 * warp-uniform branch (a per-thread one, even inside the asm, serialises every wgmma of the kernel: C7518) */
__device__ __forceinline__ void mla_bar_wait_u(unsigned bar, unsigned par) {
    uint32_t ok;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(ok)
                     : "r"(bar), "r"(par)
                     : "memory");
    } while (!__all_sync(0xffffffffu, ok));
}
/* predicated global store of two floats (branch-free, as mla_bar_arrive_if) */
__device__ __forceinline__ void mla_st2_if(float *p, float a, float b, bool ok) {
    asm volatile("{\n.reg .pred q;\nsetp.ne.b32 q, %3, 0;\n@q st.global.v2.f32 [%0], {%1, %2};\n}\n" ::"l"(p), "f"(a),
                 "f"(b), "r"((int)ok)
                 : "memory");
}
/* one arrive on bar when all of this thread's earlier cp.async have landed (count not incremented) */
__device__ __forceinline__ void mla_cp_arrive(unsigned bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
/* the same, with the pending count incremented first (a barrier whose count does not include us) */
__device__ __forceinline__ void mla_cp_arrive_inc(unsigned bar) {
    asm volatile("cp.async.mbarrier.arrive.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
#endif

/* grid: any number of CTAs (persistent: ≤ one per SM), 384 threads; CTA c takes the work items
 * c, c + gridDim.x, … of the B × n_splits × G items (head group fastest: the head groups of one split
 * read its rows close in time, from L2 for the second); items whose split holds no rows
 * are skipped by every warp alike. The tile counter gt and the item counter it run on across items, so
 * the producer loads the next item's Q (once the consumers' last QKᵀ of the item is done: qempty) and
 * first tiles while the consumers finish the item's last P·C̃ and write its partials. */
__global__ void __launch_bounds__(NT6, 1)
    mla_decode_ws_kernel(const st_bf16_t *__restrict__ q, const st_bf16_t *__restrict__ pool,
                         const int *__restrict__ block_table, const int *__restrict__ seqlens, int B, int H,
                         int page_size, int max_pages, int split_len, int n_splits, float scale_log2, float *ws_acc,
                         float *ws_ml, const __grid_constant__ CUtensorMap tm, int use_tma) {
#if MLA_WGMMA
    extern __shared__ __align__(1024) unsigned char smraw[];
    unsigned char *smal = smraw + ((1024 - ((unsigned)__cvta_generic_to_shared(smraw) & 1023)) & 1023);
    MlaSmem6 &sm = *reinterpret_cast<MlaSmem6 *>(smal);
    st_pdl_trigger(); /* the combine (launched with PDL) may be scheduled; it waits for this grid */
    const int G = (H + NH2 - 1) / NH2, nitems = n_splits * B * G;
    const unsigned q_base = (unsigned)__cvta_generic_to_shared(sm.Qs);
    const unsigned k_base0 = (unsigned)__cvta_generic_to_shared(sm.Ks[0]);
    const unsigned full0 = (unsigned)__cvta_generic_to_shared(&sm.full[0][0]); /* full[buf][h]: + 16 buf + 8 h */
    const unsigned empty0 = (unsigned)__cvta_generic_to_shared(&sm.empty[0]);  /* empty[buf]: + 8 buf */
    const unsigned qfull = (unsigned)__cvta_generic_to_shared(&sm.qfull);
    const unsigned qempty = (unsigned)__cvta_generic_to_shared(&sm.qempty);
    const int tid = threadIdx.x;
    if (tid == 0) {
        for (int i = 0; i < 4; i++) st_mbar_init(full0 + 8 * i, 1); /* the TMA issuer, or thread 0 after all */
        st_mbar_init(empty0, 8), st_mbar_init(empty0 + 8, 8);         /* one per consumer warp */
        st_mbar_init(qfull, 128), st_mbar_init(qempty, 8);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    /* the warpgroup index, broadcast so that ptxas knows it is warp-uniform (else the consumers' code is a
     * divergent path and every wgmma is serialised, C7518) */
    const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0);
    if (wg == 0) { /* ---- producer ---- */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        const int lr = tid >> 2, lc = tid & 3; /* tiles: rows lr and lr + 32 (one per half), chunks lc + 4i */
        int gt = 0, it = 0;
        for (int idx = blockIdx.x; idx < nitems; idx += gridDim.x) {
            const int h0 = idx % G * NH2, split = idx / G % n_splits, b = idx / (G * n_splits);
            const int s0 = split * split_len, s1 = min(seqlens[b], s0 + split_len);
            if (s0 >= s1) continue;
            const int ntiles = (s1 - s0 + TK2 - 1) / TK2;
            const int *bt = block_table + (size_t)b * max_pages;
            if (it > 0) mla_bar_wait(qempty, (it - 1) & 1); /* the previous item's QKᵀ is done */
            { /* Q: row tid >> 1, chunks (tid & 1) + 2i */
                const int r = tid >> 1;
                const bool ok = h0 + r < H;
                const st_bf16_t *src = q + ((size_t)b * H + (ok ? h0 + r : 0)) * DR;
#pragma unroll 4
                for (int c = tid & 1; c < NCH; c += 2) st_cp_async16(sm.Qs + mla_swz(r, c), src + c * 8, ok);
                mla_cp_arrive(qfull);
            }
            for (int tt = 0; tt < ntiles; tt++, gt++) {
                const int buf = gt & 1;
                const int t0 = s0 + tt * TK2;
                const int j0 = t0 + lr, j1 = j0 + 32;
                const bool ok0 = j0 < s1, ok1 = j1 < s1;
                const int jj0 = ok0 ? j0 : s0, jj1 = ok1 ? j1 : s0;
                /* page-table reads before the wait, so they overlap it */
                const int prow0 = bt[jj0 / page_size] * page_size + jj0 % page_size;
                const int prow1 = bt[jj1 / page_size] * page_size + jj1 % page_size;
                if (gt >= 2) mla_bar_wait(empty0 + 8 * buf, ((gt >> 1) + 1) & 1); /* tile gt − 2 released */
                const unsigned kb = k_base0 + buf * OPND_BYTES;
#pragma unroll 1
                for (int hh = 0; hh < 2; hh++) {
                    const unsigned fb = full0 + 16 * buf + 8 * hh;
                    const int th = t0 + 32 * hh;
                    if (th >= s1) { /* nothing of this half: zeros (P·C̃ reads them with p = 0) */
                        for (int i = 0; i < NCH / 4; i++)
                            st_cp_async16(sm.Ks[buf] + mla_swz(lr + 32 * hh, lc + 4 * i), pool, false);
                        mla_cp_arrive_inc(fb);
                        asm volatile("bar.sync 6, 128;\n" ::: "memory");
                        mla_bar_arrive_if(fb, tid == 0);
                    } else if (use_tma && th + 32 <= s1) { /* 32 rows of one page: 9 TMA boxes */
                        if (tid == 0) {
                            const int pr = bt[th / page_size] * page_size + th % page_size;
                            st_mbar_expect(fb, 32 * DR * 2);
                            const unsigned dst = kb + 32 * hh * 128;
#pragma unroll
                            for (int cb = 0; cb < DR / 64; cb++) st_tma2d(dst + cb * CB_BYTES, &tm, cb * 64, pr, fb);
                        }
                    } else { /* cp.async, zero fill past s1 */
                        const st_bf16_t *row = pool + (size_t)(hh ? prow1 : prow0) * DR;
                        const bool ok = hh ? ok1 : ok0;
#pragma unroll 6
                        for (int i = 0; i < NCH / 4; i++)
                            st_cp_async16(sm.Ks[buf] + mla_swz(lr + 32 * hh, lc + 4 * i), row + (lc + 4 * i) * 8, ok);
                        mla_cp_arrive_inc(fb);
                        asm volatile("bar.sync 6, 128;\n" ::: "memory"); /* every increment before the arrive */
                        mla_bar_arrive_if(fb, tid == 0);
                    }
                }
                /* keep the producer warps within one tile of each other: in the TMA path only thread 0
                 * works, and a warp that fell 2 phases behind would wait on an aliased parity of
                 * empty[buf] forever (2026-11-30: g v6 hung at 128 × 32K without this) */
                asm volatile("bar.sync 6, 128;\n" ::: "memory");
            }
            it++;
        }
        asm volatile("cp.async.wait_all;\n" ::: "memory");
        return;
    }

    /* ---- consumers: warp w (0..7) owns heads hg = w & 3 (16 each) and the half h = w >> 2 ---- */
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    const int ct = tid - 128, w = ct >> 5, lane = ct & 31, gq = lane >> 2, tq = lane & 3;
    const int hg = w & 3, half = w >> 2;
    const unsigned p_base = (unsigned)__cvta_generic_to_shared(sm.Ps[hg]);
    const int p_row = (lane & 7) + ((lane >> 3) & 1) * 8, p_col = (lane >> 4) * 8; /* P, A operand */
    int gt = 0, it = 0;
    for (int idx = blockIdx.x; idx < nitems; idx += gridDim.x) {
        const int h0 = idx % G * NH2, split = idx / G % n_splits, b = idx / (G * n_splits);
        /* broadcast: ptxas must see the tile loop's bounds as warp-uniform (C7518, as above) */
        const int s0 = split * split_len, s1 = min(__shfl_sync(0xffffffffu, seqlens[b], 0), s0 + split_len);
        if (s0 >= s1) continue;
        const int ntiles = (s1 - s0 + TK2 - 1) / TK2;
        float acc[32][4];
#pragma unroll
        for (int i = 0; i < 32; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
        float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f; /* rows gq, gq+8; m in log2 units */
        mla_bar_wait_u(qfull, it & 1);
        for (int tt = 0; tt < ntiles; tt++, gt++) {
            const int buf = gt & 1;
            const unsigned par = (gt >> 1) & 1;
            mla_bar_wait_u(full0 + 16 * buf + 8 * half, par);
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); /* cp.async data → wgmma */
            const unsigned kb = k_base0 + buf * OPND_BYTES;
            float s[4][4];
#pragma unroll
            for (int i = 0; i < 4; i++) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
            mla_qk_issue(s, q_base, kb, half);
            if (tt > 0) { /* P·C̃ of the previous tile done in this warp: release its buffer */
                asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
                __syncwarp();
                mla_bar_arrive_if(empty0 + 8 * (buf ^ 1), lane == 0);
            }
            asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
            mla_bar_arrive_if(qempty, lane == 0 && tt == ntiles - 1); /* the item's last read of Q is done */
            uint32_t pa[2][4];
            mla_tile_softmax(s, acc, pa, m0, m1, l0, l1, sm, s0 + tt * TK2 + half * 32, s1, scale_log2, w, hg, half, gq,
                             tq);
            mla_pair_bar(1 + hg);
            uint32_t pb[2][4];
#pragma unroll
            for (int j = 0; j < 2; j++)
                st_ldsm4(pb[j], p_base + (unsigned)((p_row * LDP2 + ((1 - half) * 2 + j) * 16 + p_col) * 2));
            uint32_t a[4][4];
#pragma unroll
            for (int ks = 0; ks < 4; ks++)
#pragma unroll
                for (int i = 0; i < 4; i++) a[ks][i] = (ks >> 1) == half ? pa[ks & 1][i] : pb[ks & 1][i];
            mla_bar_wait_u(full0 + 16 * buf + 8 * (half ^ 1), par); /* the partner half's rows */
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
            for (int ks = 0; ks < 4; ks++)
                mla_wgmma_n256_rs(acc, a[ks], mla_desc(kb + half * 4 * CB_BYTES + ks * 16 * 128, CB_BYTES, 1024));
            asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); /* waited for in the next tile */
        }
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        __syncwarp();
        mla_bar_arrive_if(empty0 + 8 * ((gt - 1) & 1), lane == 0); /* the item's last tile */
#pragma unroll
        for (int o = 1; o <= 2; o <<= 1) {
            l0 += __shfl_xor_sync(0xffffffffu, l0, o);
            l1 += __shfl_xor_sync(0xffffffffu, l1, o);
        }
        asm volatile("bar.sync 5, 256;\n" ::: "memory"); /* the consumers only: red is free */
        if (tq == 0) sm.red[w][gq] = l0, sm.red[w][gq + 8] = l1;
        asm volatile("bar.sync 5, 256;\n" ::: "memory");
        const float LN2 = 0.69314718055994531f;
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int r = gq + hf * 8, h = h0 + hg * 16 + r;
            const bool hok = h < H; /* padded heads: predicated stores, no branch near the accumulators */
            float *dst = ws_acc + (((size_t)b * H + (hok ? h : 0)) * n_splits + split) * DVL + half * 256;
#pragma unroll
            for (int nt = 0; nt < 32; nt++) mla_st2_if(dst + nt * 8 + tq * 2, acc[nt][hf * 2], acc[nt][hf * 2 + 1], hok);
            if (hok && half == 0 && tq == 0) {
                float *ml = ws_ml + (((size_t)b * H + h) * n_splits + split) * 2;
                ml[0] = (hf ? m1 : m0) * LN2;
                ml[1] = sm.red[w][r] + sm.red[w ^ 4][r];
            }
        }
        asm volatile("bar.sync 5, 256;\n" ::: "memory"); /* red read by the partner before the next item */
        it++;
    }
#else
    (void)q, (void)pool, (void)block_table, (void)seqlens, (void)B, (void)H, (void)page_size, (void)max_pages;
    (void)split_len, (void)n_splits, (void)scale_log2, (void)ws_acc, (void)ws_ml, (void)tm, (void)use_tma;
    __trap(); /* built for sm_90a only (kernels/CMakeLists.txt) */
#endif
}

/* grid (H, B), 128 threads × 4 dims: o = Σ_s e^{m_s−M} acc_s / Σ_s e^{m_s−M} l_s */
__global__ void mla_decode_combine_kernel(st_bf16_t *o, const float *ws_acc, const float *ws_ml, const int *seqlens,
                                          int H, int split_len, int n_splits) {
    st_pdl_wait(); /* after v6 it is a programmatic dependent: the partials must be written */
    const int h = blockIdx.x, b = blockIdx.y;
    const int ns = min(n_splits, (seqlens[b] + split_len - 1) / split_len);
    const float *ml = ws_ml + ((size_t)b * H + h) * n_splits * 2;
    float M = -INFINITY;
    for (int s = 0; s < ns; s++) M = fmaxf(M, ml[2 * s]);
    float L = 0.f;
    float4 a = make_float4(0, 0, 0, 0);
    for (int s = 0; s < ns; s++) {
        float f = __expf(ml[2 * s] - M);
        L += f * ml[2 * s + 1];
        float4 x = *reinterpret_cast<const float4 *>(ws_acc + (((size_t)b * H + h) * n_splits + s) * DVL + threadIdx.x * 4);
        a.x += f * x.x, a.y += f * x.y, a.z += f * x.z, a.w += f * x.w;
    }
    float inv = L > 0.f ? 1.f / L : 0.f;
    st_bf16_t *dst = o + ((size_t)b * H + h) * DVL + threadIdx.x * 4;
    *reinterpret_cast<uint2 *>(dst) = make_uint2(st_pack_bf2(a.x * inv, a.y * inv), st_pack_bf2(a.z * inv, a.w * inv));
}

extern "C" size_t st_cuda_mla_decode_ws_bytes(int B, int H, int max_ctx, int split_len) {
    int ns = (max_ctx + split_len - 1) / split_len;
    if (ns < 1) ns = 1;
    return (size_t)B * H * ns * (DVL + 2) * sizeof(float) + 256;
}

/* Split length for the all-heads kernel: a multiple of the caller's split_len (so the workspace sized
 * for split_len suffices), at most cap unless split_len is larger, minimising
 * waves × (tiles per block + a per-block overhead of ~3 tiles: Q load, workspace write, combine)
 * for sequences of max_ctx rows. */
static int mla_pick_split(int B, int G, int max_ctx, int split_len, int nsm, int cap) {
    int best = split_len;
    long best_cost = -1;
    for (long sl = split_len; sl == split_len || sl <= cap; sl += split_len) {
        long ns = (max_ctx + sl - 1) / sl;
        if (ns < 1) ns = 1;
        long waves = ((long)B * G * ns + nsm - 1) / nsm;
        long tiles = ((sl < max_ctx ? sl : max_ctx) + TK2 - 1) / TK2;
        long cost = waves * (tiles + 3);
        if (best_cost < 0 || cost <= best_cost) best_cost = cost, best = (int)sl;
        if (sl >= max_ctx) break;
    }
    return best;
}

/* Longest split the launcher makes (tokens); see mla_pick_split. */
#define MLA_SPLIT_CAP 8192

/* v6 is the kernel: H200, 2026-11-30, round 2's final code (% of copy, v2 / v6): 64×32K H64 71.8 / 75.6,
 * 128×32K H64 69.5 / 75.5, 64×32K H16 74.0 / 81.9, 64×4K H64 59.9 / 65.5, 64×32K H128 35.0 / 41.7
 * (428 TFLOP/s); round 3 (v7, v8: no faster than v6 at every H = 64 shape; removed): docs/perf/history.md. v2 and
 * the benchmark diagnostics (gathers or tensor work alone) were deleted with the variant switch
 * (issue 14; docs/kernels.md). */

/* the tensor-map encoder (driver entry point), looked up once; null where unavailable */
typedef CUresult (*mla_encode_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                  const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                  CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
static mla_encode_fn mla_encoder(void) {
    static int looked = 0; /* NOTE: idempotent; a race only repeats the query */
    static mla_encode_fn enc = nullptr;
    if (!looked) {
        void *fn = nullptr;
        cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) ==
                cudaSuccess &&
            q == cudaDriverEntryPointSuccess && fn)
            enc = (mla_encode_fn)fn;
        else
            (void)cudaGetLastError();
        looked = 1;
    }
    return enc;
}

/* v6's tensor map: the pool as [rows, 576] bf16 (row stride 1152 B), box_rows × 64 columns, 128-byte
 * swizzle. The row count is not known here; the kernel addresses only rows of pages in the block
 * table, so the extent is set to 2^31 rows (no bounds check is relied on). */
static bool mla_pool_map(CUtensorMap *m, const void *pool, int box_rows) {
    mla_encode_fn enc = mla_encoder();
    if (!enc) return false;
    const cuuint64_t dims[2] = {(cuuint64_t)DR, (cuuint64_t)1 << 31}, strides[1] = {(cuuint64_t)DR * 2};
    const cuuint32_t box[2] = {64, (cuuint32_t)box_rows}, es[2] = {1, 1};
    return enc(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void *>(pool), dims, strides, box, es,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

extern "C" st_status_t st_cuda_mla_decode(const st_gpu_stream_t *s, st_bf16_t *o_lat, const st_bf16_t *q_abs,
                                          const st_bf16_t *pool, const int *block_table, const int *seqlens, int B,
                                          int H, int page_size, int max_pages, int max_ctx, int split_len, float scale,
                                          void *ws, size_t ws_bytes) {
    if (B < 0 || H <= 0 || page_size <= 0 || split_len <= 0 || split_len % SPLIT_ALIGN || max_ctx < 0 || B > 65535)
        return ST_FAIL(ST_ERR_INVALID_ARG, "mla_decode: B=%d H=%d page=%d split=%d (multiple of %d)", B, H, page_size,
                       split_len, SPLIT_ALIGN);
    if (B == 0) return ST_OK;
    if (ws_bytes < st_cuda_mla_decode_ws_bytes(B, H, max_ctx, split_len))
        return ST_FAIL(ST_ERR_INVALID_ARG, "mla_decode: workspace %zu < %zu bytes", ws_bytes,
                       st_cuda_mla_decode_ws_bytes(B, H, max_ctx, split_len));
    const int G = (H + NH2 - 1) / NH2;
    int dev = 0, nsm = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || nsm <= 0) {
        (void)cudaGetLastError();
        nsm = 132;
    }
    const int sl = mla_pick_split(B, G, max_ctx, split_len, nsm, MLA_SPLIT_CAP);
    int ns = (max_ctx + sl - 1) / sl;
    if (ns < 1) ns = 1;
    float *ws_acc = (float *)ws, *ws_ml = ws_acc + (size_t)B * H * ns * DVL;
    typedef void (*kern6_t)(const st_bf16_t *, const st_bf16_t *, const int *, const int *, int, int, int, int, int,
                            int, float, float *, float *, const CUtensorMap, int);
    const kern6_t k6 = mla_decode_ws_kernel;
    const size_t smem6 = sizeof(MlaSmem6) + 1024; /* + slack for the 1024-byte alignment */
    st_status_t rc = ST_CUDA_CHECK(cudaFuncSetAttribute(k6, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem6));
    if (rc) return rc;
    /* persistent: one CTA per SM over all items */
    const long nitems = (long)ns * B * G;
    const int grid = (int)(nsm < nitems ? nsm : nitems);
    /* TMA boxes of 32 rows where pages hold a multiple of 32 rows (else, and for the partial last 32 rows
     * of a split, cp.async from the producer warpgroup) */
    CUtensorMap tm;
    memset(&tm, 0, sizeof tm);
    const int tma6 = page_size % 32 == 0 && mla_pool_map(&tm, pool, 32);
    static int told = 0; /* NOTE: once per process, diagnostics only */
    if (page_size % 32 == 0 && !tma6 && !told) {
        told = 1;
        fprintf(stderr, "mla_decode: tensor map unavailable (encoder %s), gathers with cp.async\n",
                mla_encoder() ? "failed" : "not found");
    }
    k6<<<grid, NT6, smem6, ST_STREAM(s)>>>(q_abs, pool, block_table, seqlens, B, H, page_size, max_pages, sl, ns,
                                           scale * 1.4426950408889634f, ws_acc, ws_ml, tm, tma6);
    rc = ST_LAUNCH_OK("mla_decode_ws_kernel");
    if (rc) return rc;
    /* NOTE: the combine is a programmatic dependent of v6: its launch overlaps v6's tail (it cannot share
     * an SM with v6's persistent CTAs: they hold the register file). H200, 2026-11-30, bench_gpu_mla, same
     * process: +0.2 … +1.8 points of copy at H ≤ 64 (the combine alone is 6.6 µs of the 109 µs at 64 × 4K,
     * H = 64). */
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(H, B), cfg.blockDim = dim3(128), cfg.stream = ST_STREAM(s);
    cfg.attrs = at, cfg.numAttrs = 1;
    rc = ST_CUDA_CHECK(cudaLaunchKernelEx(&cfg, mla_decode_combine_kernel, o_lat, (const float *)ws_acc,
                                          (const float *)ws_ml, seqlens, H, sl, ns));
    return rc ? rc : ST_LAUNCH_OK("mla_decode_combine_kernel");
}

/* ------------------------------------------------------------------ the engine's MLA glue: cache write, q_pe
 * copy, absorbed causal attention over the paged cache (any width), direct-form gather and K/V split.
 * CPU: st_mla_kv_store, st_mla_qpe, st_mla_attn_absorbed, st_mla_gather, st_mla_kv_split (kernels/mla.c). */
__device__ __forceinline__ float mla_ld(st_bf16_t h) { return st_bf(h); }
__device__ __forceinline__ float mla_ld(float f) { return f; }
__device__ __forceinline__ void mla_st(st_bf16_t *p, float f) { *p = st_tobf(f); }
__device__ __forceinline__ void mla_st(float *p, float f) { *p = f; }

template <typename TC>
__global__ void mla_kv_store_kernel(TC *pool, const float *ckv, const float *w, const int *tok_ent,
                                    const int *tok_pos, const int *btab, int pps, int ps, int kvr, int R, float eps) {
    __shared__ float red[32];
    const int t = blockIdx.x;
    const float *x = ckv + (size_t)t * R;
    float ss = 0.f;
    for (int c = threadIdx.x; c < kvr; c += blockDim.x) ss += x[c] * x[c];
    ss = st_block_sum(ss, red);
    float r = 1.f / sqrtf(ss / (float)kvr + eps);
    int pos = tok_pos[t], page = btab[(size_t)tok_ent[t] * pps + pos / ps];
    TC *dst = pool + ((size_t)page * ps + pos % ps) * R;
    for (int c = threadIdx.x; c < R; c += blockDim.x) mla_st(dst + c, c < kvr ? x[c] * r * w[c] : x[c]);
}
extern "C" st_status_t st_cuda_mla_kv_store(const st_gpu_stream_t *s, void *pool, bool f32, const float *ckv, const float *w,
                                       const int *tok_ent, const int *tok_pos, const int *btab, int pps, int page_size,
                                       int T, int kvr, int R, float eps) {
    if (T <= 0) return ST_OK;
    if (f32)
        mla_kv_store_kernel<float><<<T, 128, 0, ST_STREAM(s)>>>((float *)pool, ckv, w, tok_ent, tok_pos, btab, pps,
                                                                page_size, kvr, R, eps);
    else
        mla_kv_store_kernel<st_bf16_t><<<T, 128, 0, ST_STREAM(s)>>>((st_bf16_t *)pool, ckv, w, tok_ent, tok_pos, btab,
                                                                    pps, page_size, kvr, R, eps);
    return ST_LAUNCH_OK("mla_kv_store_kernel");
}

template <typename TQ>
__global__ void mla_qpe_kernel(TQ *qabs, const float *q, int H, int nope, int rope, int kvr) {
    int th = blockIdx.x, R = kvr + rope; /* (t, h) */
    for (int c = threadIdx.x; c < rope; c += blockDim.x)
        mla_st(qabs + (size_t)th * R + kvr + c, q[(size_t)th * (nope + rope) + nope + c]);
}
extern "C" st_status_t st_cuda_mla_qpe(const st_gpu_stream_t *s, void *qabs, bool f32, const float *q, int T, int H, int nope,
                                  int rope, int kvr) {
    if (T <= 0 || rope <= 0) return ST_OK;
    if (f32) mla_qpe_kernel<float><<<T * H, 64, 0, ST_STREAM(s)>>>((float *)qabs, q, H, nope, rope, kvr);
    else mla_qpe_kernel<st_bf16_t><<<T * H, 64, 0, ST_STREAM(s)>>>((st_bf16_t *)qabs, q, H, nope, rope, kvr);
    return ST_LAUNCH_OK("mla_qpe_kernel");
}

/* grid (T, ceil(H/8)), 256 threads: warp w = head h0+w of query token t. Key tiles of 32 rows go
 * to shared memory (row stride R+2 bf16: an odd word count, so lane j reading row j is
 * conflict-free); lane j scores key j, then the warp updates its online softmax and the lane-strided
 * accumulator (kvr/32 ≤ 16 values per lane). */
#define MLA_TK 32
template <typename TC>
__global__ void __launch_bounds__(256) mla_attn_kernel(st_bf16_t *olat, st_bf16_t *olo, const TC *qabs, const TC *pool,
                                                       const int *tok_ent, const int *tok_pos, const int *btab, int pps,
                                                       int ps, int H, int R, int kvr, float scale, const int *cu,
                                                       int dmin) {
    /* rows of sequences whose chunk has ≥ dmin tokens go through the direct form (st_cuda_mla_gather …) */
    if (cu && cu[tok_ent[blockIdx.x] + 1] - cu[tok_ent[blockIdx.x]] >= dmin) return;
    extern __shared__ __align__(16) unsigned char smraw[];
    const int LD = sizeof(TC) == 2 ? R + 2 : R + 1;
    TC *Ks = reinterpret_cast<TC *>(smraw);           /* [TK][LD] */
    float *qs = reinterpret_cast<float *>(smraw + (size_t)MLA_TK * LD * sizeof(TC) + 16); /* [8][R] */
    const int t = blockIdx.x, w = threadIdx.x >> 5, lane = threadIdx.x & 31, h = blockIdx.y * 8 + w;
    const bool active = h < H;
    const int n = tok_pos[t] + 1;
    const int *bt = btab + (size_t)tok_ent[t] * pps;
    for (int c = lane; c < R; c += 32) qs[w * R + c] = active ? mla_ld(qabs[((size_t)t * H + h) * R + c]) * scale : 0.f;
    float acc[16];
#pragma unroll
    for (int i = 0; i < 16; i++) acc[i] = 0.f;
    float m = -INFINITY, lsum = 0.f;
    const int nacc = kvr / 32;
    for (int s0 = 0; s0 < n; s0 += MLA_TK) {
        __syncthreads();
        for (int i = threadIdx.x; i < MLA_TK * R; i += blockDim.x) {
            int r = i / R, c = i % R, j = s0 + r;
            TC val = 0;
            if (j < n) val = pool[((size_t)bt[j / ps] * ps + j % ps) * R + c];
            Ks[r * LD + c] = val;
        }
        __syncthreads();
        if (!active) continue;
        float sc = -INFINITY;
        if (s0 + lane < n) {
            const TC *kr = Ks + lane * LD;
            const float *qw = qs + w * R;
            float a = 0.f;
            for (int c = 0; c < R; c++) a += qw[c] * mla_ld(kr[c]);
            sc = a;
        }
        float mt = st_warp_max(sc), mn = fmaxf(m, mt);
        float alpha = expf(m - mn), p = s0 + lane < n ? expf(sc - mn) : 0.f;
        lsum = lsum * alpha + st_warp_sum(p);
        m = mn;
#pragma unroll
        for (int i = 0; i < 16; i++) acc[i] *= alpha;
        for (int j = 0; j < MLA_TK && s0 + j < n; j++) {
            float pj = __shfl_sync(0xffffffffu, p, j);
            const TC *kr = Ks + j * LD;
#pragma unroll
            for (int i = 0; i < 16; i++)
                if (i < nacc) acc[i] += pj * mla_ld(kr[lane + 32 * i]);
        }
    }
    if (!active) return;
    float inv = lsum > 0.f ? 1.f / lsum : 0.f;
#pragma unroll
    for (int i = 0; i < 16; i++)
        if (i < nacc) {
            size_t j = ((size_t)t * H + h) * kvr + lane + 32 * i;
            olat[j] = st_split_bf(acc[i] * inv, olo ? olo + j : NULL);
        }
}
template <typename TC>
static st_status_t mla_attn_launch(const st_gpu_stream_t *s, st_bf16_t *olat, st_bf16_t *olo, const void *qabs, const void *pool,
                                   const int *tok_ent, const int *tok_pos, const int *btab, int pps, int page_size,
                                   int T, int H, int R, int kvr, float scale, const int *cu, int dmin) {
    int LD = sizeof(TC) == 2 ? R + 2 : R + 1;
    size_t smem = (size_t)MLA_TK * LD * sizeof(TC) + 16 + (size_t)8 * R * sizeof(float);
    st_status_t rc = ST_CUDA_CHECK(
        cudaFuncSetAttribute(mla_attn_kernel<TC>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    if (rc) return rc;
    mla_attn_kernel<TC><<<dim3(T, (H + 7) / 8), 256, smem, ST_STREAM(s)>>>(
        olat, olo, (const TC *)qabs, (const TC *)pool, tok_ent, tok_pos, btab, pps, page_size, H, R, kvr, scale, cu, dmin);
    return ST_LAUNCH_OK("mla_attn_kernel");
}
extern "C" st_status_t st_cuda_mla_attn(const st_gpu_stream_t *s, st_bf16_t *olat, st_bf16_t *olo, const void *qabs, const void *pool,
                                   bool f32, const int *tok_ent, const int *tok_pos, const int *btab, int pps,
                                   int page_size, int T, int H, int R, int kvr, float scale, const int *cu, int dmin) {
    if (R > 1024 || kvr > 512 || kvr % 32 || kvr > R)
        return ST_FAIL(ST_ERR_INVALID_ARG, "mla_attn: R=%d kvr=%d (R ≤ 1024, kvr ≤ 512, kvr %% 32 = 0)", R, kvr);
    if (T <= 0) return ST_OK;
    return f32 ? mla_attn_launch<float>(s, olat, olo, qabs, pool, tok_ent, tok_pos, btab, pps, page_size, T, H, R, kvr, scale,
                                        cu, dmin)
               : mla_attn_launch<st_bf16_t>(s, olat, olo, qabs, pool, tok_ent, tok_pos, btab, pps, page_size, T, H, R, kvr,
                                            scale, cu, dmin);
}

/* ---- MLA direct form for long prompt chunks (SPEC §4: o_h = softmax(q_h·k_hᵀ) v_h with
 * k_h = [W_UK,h c̃ ; k_pe], v_h = W_UV,h c̃): one sequence's n latent rows are gathered from the paged
 * cache, decompressed by one GEMM and split into per-head K and V for st_cuda_mla_prefill. */
/* c [n, R] bf16 = the sequence's cache rows 0..n-1 (pages bt); 8 bf16 per thread */
__global__ void mla_gather_kernel(st_bf16_t *c, const st_bf16_t *pool, const int *bt, int ps, int n, int R8) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)n * R8) return;
    int j = (int)(i / R8), q = (int)(i % R8);
    const uint4 *src = reinterpret_cast<const uint4 *>(pool + ((size_t)bt[j / ps] * ps + j % ps) * (R8 * 8)) + q;
    reinterpret_cast<uint4 *>(c)[i] = *src;
}
extern "C" st_status_t st_cuda_mla_gather(const st_gpu_stream_t *s, st_bf16_t *c, const st_bf16_t *pool, const int *bt,
                                     int page_size, int n, int R) {
    if (R % 8) return ST_FAIL(ST_ERR_INVALID_ARG, "mla_gather: R=%d (multiple of 8)", R);
    if (n <= 0) return ST_OK;
    size_t items = (size_t)n * (R / 8);
    mla_gather_kernel<<<(unsigned)((items + 255) / 256), 256, 0, ST_STREAM(s)>>>(c, pool, bt, page_size, n, R / 8);
    return ST_LAUNCH_OK("mla_gather_kernel");
}
/* K [n, H, nope+rope] = [Y[n, h, 0:nope] ; c[n, kvr:kvr+rope]], V [n, H, dv] = Y[n, h, nope:nope+dv];
 * Y [n, H, nope+dv] bf16, c [n, R] bf16 (the gathered rows) */
__global__ void mla_kv_split_kernel(st_bf16_t *K, st_bf16_t *V, const st_bf16_t *Y, const st_bf16_t *c, int n, int H,
                                    int nope, int rope, int dv, int R, int kvr) {
    const int dqk = nope + rope, kvw = nope + dv, width = dqk + dv;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)n * H * width) return;
    int x = (int)(i % width);
    size_t jh = i / width; /* j·H + h */
    size_t j = jh / H;
    const st_bf16_t *y = Y + jh * kvw;
    if (x < nope) K[jh * dqk + x] = y[x];
    else if (x < dqk) K[jh * dqk + x] = c[j * R + kvr + (x - nope)];
    else V[jh * dv + (x - dqk)] = y[nope + (x - dqk)];
}
extern "C" st_status_t st_cuda_mla_kv_split(const st_gpu_stream_t *s, st_bf16_t *K, st_bf16_t *V, const st_bf16_t *Y,
                                       const st_bf16_t *c, int n, int H, int nope, int rope, int dv, int R, int kvr) {
    if (n <= 0) return ST_OK;
    size_t items = (size_t)n * H * (nope + rope + dv);
    mla_kv_split_kernel<<<(unsigned)((items + 255) / 256), 256, 0, ST_STREAM(s)>>>(K, V, Y, c, n, H, nope, rope, dv, R,
                                                                                   kvr);
    return ST_LAUNCH_OK("mla_kv_split_kernel");
}

