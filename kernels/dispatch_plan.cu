/* The MoE dispatch plan on the GPU: the tables of st_moe_dispatch_plan (kernels/dispatch_plan.c, the
 * reference it equals table for table) from routing in device memory, in three launches and no host
 * sync. Not the pack of the rows themselves (the transport's). */
#include "cuda_common.cuh"
#include "strata/kernels.h"

/* NOTE: limits that the packed slot word and the shared tables below rely on (checked at launch) */
#define PLAN_CHT 128 /* tokens per chunk: one block of plan_tokens_kernel, one row of the chunk histogram */
#define PLAN_NW (PLAN_CHT / 32)
#define PLAN_MAXK 16   /* leaves per token: kept in registers, split fully unrolled */
#define PLAN_MAXE 1024 /* experts: one thread each in the expert block of plan_scan_kernel */
#define PLAN_MAXS 255  /* servers: 8 bits of the slot word */
#define PLAN_SCAN 1024 /* threads of plan_scan_kernel */
#define PLAN_PER 4     /* tokens per thread per tile of a server's scan: one 4-byte load */

/* Workspace (each part 256-byte aligned):
 *   slot  [T·kc] int32: −1 when the slot sends nothing, else s | ln << 8 | first << 13 | rank << 16,
 *         s its server, ln its node's index among the token's nodes at s (left to right), first: the
 *         slot is its node's first leaf, rank: sent slots of its expert before it in its chunk (< 128)
 *   ncnt  [S, Tp] uint8 (Tp = T rounded up to 4): token t's nodes at server s (≤ kc)
 *   nbase [S, T] int2: where token t sends to s: (its first node's row, its index in utok)
 *   hist  [nch, E] int32 (nch = ⌈T/128⌉): sent pairs of expert e in chunk c, then (scanned in
 *         place) those in earlier chunks
 *   estart [E] int32: expert e's first row at its server */
typedef struct {
    int *slot;
    uint8_t *ncnt;
    int2 *nbase;
    int *hist;
    int *estart;
} plan_ws_t;

static __host__ __device__ size_t plan_align(size_t b) {
    return (b + 255) & ~(size_t)255;
}
static __host__ __device__ int plan_tp(int T) {
    return (T + PLAN_PER - 1) / PLAN_PER * PLAN_PER;
}
static __host__ __device__ int plan_nch(int T) {
    return (T + PLAN_CHT - 1) / PLAN_CHT;
}

/* the parts' offsets in order; w NULL: only the total */
static size_t plan_ws_layout(int T, int kc, int E, int S, char *base, plan_ws_t *w) {
    size_t sz[5] = {sizeof(int) * (size_t)T * kc, (size_t)S * plan_tp(T), sizeof(int2) * (size_t)S * T,
                    sizeof(int) * (size_t)plan_nch(T) * E, sizeof(int) * (size_t)E};
    size_t off[5], at = 0;
    for (int i = 0; i < 5; i++)
        off[i] = at, at += plan_align(sz[i]);
    if (w) {
        w->slot = (int *)(base + off[0]);
        w->ncnt = (uint8_t *)(base + off[1]);
        w->nbase = (int2 *)(base + off[2]);
        w->hist = (int *)(base + off[3]);
        w->estart = (int *)(base + off[4]);
    }
    return at;
}

/* One block per chunk of PLAN_CHT tokens. First one thread per token: its leaves' servers, a NONE leaf
 * flags it, and its leaves cut into nodes. NOTE: st_moe_dispatch_plan's split keeps a tree node whole
 * when all its leaves have one server and else halves it, from the smallest node holding them all; so
 * adjacent leaves i-1 and i end in one node exactly when the smallest tree node holding both (ids that
 * agree with id[i] above bit L, L the bit length of id[i-1] ^ id[i]) has leaves of one server only:
 * if it has, the split reaches it or a one-server ancestor; if not, every node holding both is cut.
 * Then the stable rank of each sent pair among its expert's sent pairs in the chunk (slot order =
 * token order): each warp walks a quarter of the chunk's slots, 32 at a time in order, lanes of one
 * expert ranked by __match_any_sync, counts per warp in shared memory, then the warps' counts scanned
 * per expert (the chunk histogram, hist). */
template <int K> /* PLAN_MAXK or less: kc rounded up to a power of 2 (the split's loops are K × K) */
__global__ void __launch_bounds__(PLAN_CHT)
    plan_tokens_kernel(const int *ids, const int *cnt, const int *server_of, uint8_t *tok_failed, int T, int kc, int E,
                       int S, plan_ws_t ws) {
    extern __shared__ int sh[];
    int *sinf = sh;                  /* [PLAN_CHT · kc] the chunk's slot words, rank not yet in */
    int *srk = sinf + PLAN_CHT * kc; /* [PLAN_CHT · kc] rank among the warp's earlier slots */
    int *wh = srk + PLAN_CHT * kc;   /* [PLAN_NW, E] per warp: pairs per expert, then the warps' prefix */
    const int t0 = blockIdx.x * PLAN_CHT, nt = min(PLAN_CHT, T - t0), nsl = nt * kc;
    const size_t Tp = (size_t)plan_tp(T);
    st_pdl_trigger(); /* ≤ 128 blocks here: the scan's S + 1 waiting blocks take SMs this grid leaves free */
    for (int j = threadIdx.x; j < PLAN_NW * E; j += blockDim.x)
        wh[j] = 0;

    if ((int)threadIdx.x < nt) {
        const int t = t0 + threadIdx.x;
        int c = min(max(cnt[t], 0), kc);
        bool go = c > 0 && !tok_failed[t];
        uint32_t id[K];
        int tg[K];
        bool none = false;
#pragma unroll
        for (int i = 0; i < K; i++) {
            id[i] = 0, tg[i] = ST_MOE_PLAN_SKIP;
            if (go && i < c) {
                int e = ids[(size_t)t * kc + i];
                /* out-of-range input stays in bounds: an unknown expert as one without a holder, an
                 * unknown server as left out (the C version's precondition; it would not) */
                int s = e >= 0 && e < E ? server_of[e] : ST_MOE_PLAN_NONE;
                if (s >= S || s < ST_MOE_PLAN_SKIP) s = ST_MOE_PLAN_SKIP;
                id[i] = (uint32_t)e, tg[i] = s;
                none |= s == ST_MOE_PLAN_NONE;
            }
        }
        if (go && none) tok_failed[t] = 1, go = false;
        for (int s = 0; s < S; s++)
            ws.ncnt[(size_t)s * Tp + t] = 0;
        bool first[K];
#pragma unroll
        for (int i = 0; i < K; i++) {
            bool f = i == 0;
            if (i > 0 && i < c) {
                const int L = 32 - __clz(id[i - 1] ^ id[i]); /* ≤ 10: ids < 1024 */
                const uint32_t pre = id[i] >> L;
#pragma unroll
                for (int j = 0; j < K; j++)
                    f |= j < c && (id[j] >> L) == pre && tg[j] != tg[i];
            }
            first[i] = f;
        }
        int cur = -1, ln = 0;
#pragma unroll
        for (int i = 0; i < K; i++) {
            int v = -1;
            if (go && i < c) {
                if (first[i]) {
                    cur = tg[i], ln = 0;
#pragma unroll
                    for (int j = 0; j < i; j++)
                        ln += first[j] && tg[j] == cur;
                    /* NOTE: a later node of the same server stores a larger count: the last store is the total */
                    if (cur >= 0) ws.ncnt[(size_t)cur * Tp + t] = (uint8_t)(ln + 1);
                }
                if (cur >= 0) v = cur | ln << 8 | (first[i] ? 1 << 13 : 0);
            }
            if (i < kc) sinf[threadIdx.x * kc + i] = v;
        }
    }
    __syncthreads();

    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, q = (nsl + PLAN_NW - 1) / PLAN_NW;
    const int a = w * q, b = min(a + q, nsl);
    const int *cid = ids + (size_t)t0 * kc;
    int *h = wh + w * E;
    for (int j0 = a; j0 < b; j0 += 32) { /* uniform over the warp */
        const int j = j0 + lane;
        const int e = j < b && sinf[j] >= 0 ? cid[j] : -1;
        const unsigned m = __match_any_sync(0xffffffffu, e);
        if (e >= 0) srk[j] = h[e] + __popc(m & ((1u << lane) - 1u));
        __syncwarp();
        if (e >= 0 && lane == 31 - __clz(m)) h[e] += __popc(m); /* the group's last lane */
        __syncwarp();
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int run = 0;
        for (int v = 0; v < PLAN_NW; v++) {
            int x = wh[v * E + e];
            wh[v * E + e] = run;
            run += x;
        }
        ws.hist[(size_t)blockIdx.x * E + e] = run;
    }
    __syncthreads();
    for (int j = threadIdx.x; j < nsl; j += blockDim.x) {
        int v = sinf[j];
        if (v >= 0) v |= (wh[(j / q) * E + cid[j]] + srk[j]) << 16;
        ws.slot[(size_t)t0 * kc + j] = v;
    }
}

/* Blocks 0..S-1: server s's exclusive scans over tokens of its node counts and of whether the token
 * goes to it (nbase, n_out, n_uniq). Block S: the chunk histograms scanned per expert (hist in place,
 * each expert's chunks split between 1024 / E' threads, E' = E rounded up to a power of 2), then per
 * server its experts ascending (one warp per server, 32 experts a step): exp_ids, offsets, n_exp,
 * n_rows and each expert's first row. */
__global__ void __launch_bounds__(PLAN_SCAN)
    plan_scan_kernel(st_moe_plan_t p, const int *server_of, int T, int nch, plan_ws_t ws) {
    const int S = p.n_servers, E = p.n_experts, lane = threadIdx.x & 31;
    st_pdl_wait(); /* plan_tokens_kernel's tables (a programmatic dependent: its launch overlaps that tail) */
    st_pdl_trigger();
    if ((int)blockIdx.x < S) {
        __shared__ int wx[32], wy[32];
        __shared__ int2 stage[PLAN_SCAN * PLAN_PER]; /* the tile's (row, utok index), (−1, −1): not sent */
        const int s = blockIdx.x;
        const uint8_t *nc = ws.ncnt + (size_t)s * plan_tp(T);
        int2 carry = make_int2(0, 0);
        for (int t0 = 0; t0 < T; t0 += PLAN_SCAN * PLAN_PER) {
            const int ta = t0 + threadIdx.x * PLAN_PER;
            /* NOTE: ncnt's rows are padded to 4 bytes; the padding is masked below */
            const uint32_t raw = ta < T ? *reinterpret_cast<const uint32_t *>(nc + ta) : 0u;
            int c[PLAN_PER], x = 0, y = 0;
#pragma unroll
            for (int i = 0; i < PLAN_PER; i++) {
                c[i] = ta + i < T ? (int)(raw >> (8 * i) & 255u) : 0;
                x += c[i], y += c[i] > 0;
            }
            int2 r = make_int2(carry.x + st_block_scan_incl(x, wx) - x, carry.y + st_block_scan_incl(y, wy) - y);
            carry.x += wx[31], carry.y += wy[31];
#pragma unroll
            for (int i = 0; i < PLAN_PER; i++) {
                stage[threadIdx.x * PLAN_PER + i] = c[i] ? r : make_int2(-1, -1);
                r.x += c[i], r.y += c[i] > 0;
            }
            __syncthreads();
            /* the stores from the staging, token by token across the threads: coalesced (a thread's own
             * tokens, PLAN_PER · 8 bytes apart across a warp, were several times the sectors) */
            for (int j = threadIdx.x; j < PLAN_SCAN * PLAN_PER && t0 + j < T; j += PLAN_SCAN)
                if (stage[j].x >= 0) ws.nbase[(size_t)s * T + t0 + j] = stage[j];
            __syncthreads(); /* wx, wy, stage read before the next tile writes them */
        }
        if (threadIdx.x == 0) p.n_out[s] = carry.x, p.n_uniq[s] = carry.y;
        return;
    }
    __shared__ int sv[PLAN_MAXE], ecnt[PLAN_MAXE], part[PLAN_SCAN];
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int s = server_of[e];
        sv[e] = s < S ? s : ST_MOE_PLAN_SKIP; /* as plan_tokens_kernel reads it */
    }
    int Ep = 32;
    while (Ep < E)
        Ep <<= 1;
    const int P = PLAN_SCAN / Ep, e = threadIdx.x % Ep, pr = threadIdx.x / Ep;
    const int ca = pr * nch / P, cb = (pr + 1) * nch / P;
    int sum = 0;
    if (e < E)
#pragma unroll 8
        for (int c = ca; c < cb; c++)
            sum += ws.hist[(size_t)c * E + e]; /* unrolled: the loads in flight together */
    part[threadIdx.x] = sum;
    __syncthreads();
    if (e < E) {
        int run = 0;
        for (int v = 0; v < pr; v++)
            run += part[v * Ep + e];
#pragma unroll 8
        for (int c = ca; c < cb; c++) {
            int x = ws.hist[(size_t)c * E + e];
            ws.hist[(size_t)c * E + e] = run;
            run += x;
        }
        if (pr == P - 1) ecnt[e] = run;
    }
    __syncthreads();
    for (int s = threadIdx.x >> 5; s < S; s += PLAN_SCAN / 32) {
        int nx = 0, nr = 0;
        uint32_t *xid = p.exp_ids + (size_t)s * E, *off = p.offsets + (size_t)s * (E + 1);
        for (int e0 = 0; e0 < E; e0 += 32) {
            const int x = e0 + lane, c = x < E && sv[x] == s ? ecnt[x] : 0;
            const unsigned in = __ballot_sync(0xffffffffu, c > 0);
            int incl = c;
            for (int o = 1; o < 32; o <<= 1) {
                int y = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o) incl += y;
            }
            if (c > 0) {
                const int k = nx + __popc(in & ((1u << lane) - 1u));
                xid[k] = (uint32_t)x;
                off[k + 1] = (uint32_t)(nr + incl);
                ws.estart[x] = nr + incl - c;
            }
            nx += __popc(in);
            nr += __shfl_sync(0xffffffffu, incl, 31);
        }
        if (lane == 0) p.n_exp[s] = nx, p.n_rows[s] = nr, off[0] = 0;
    }
}

/* One thread per slot: a sent pair into its row (its expert's first row + the expert's pairs in
 * earlier chunks + its rank in its chunk); a node's first leaf names the node's row, a token's first
 * node at a server names the token's place in utok. */
__global__ void plan_scatter_kernel(st_moe_plan_t p, const int *ids, const float *wts, int T, int kc, plan_ws_t ws) {
    const int k = blockIdx.x * blockDim.x + threadIdx.x;
    st_pdl_wait(); /* NOTE: plan_scan_kernel's, and through its own wait plan_tokens_kernel's */
    if (k >= T * kc) return;
    const int v = ws.slot[k];
    if (v < 0) return;
    const int s = v & 255, ln = (v >> 8) & 31, t = k / kc, e = ids[k], E = p.n_experts;
    const int r = ws.estart[e] + ws.hist[(size_t)(t / PLAN_CHT) * E + e] + (v >> 16);
    const int2 nb = ws.nbase[(size_t)s * T + t];
    const size_t base = (size_t)s * p.max_rows;
    p.pair[base + r] = k;
    p.orow[base + r] = (uint32_t)(nb.x + ln);
    p.src[base + r] = (uint32_t)nb.y;
    if (p.wts) p.wts[base + r] = wts[k];
    if (v & (1 << 13)) {
        p.node[base + nb.x + ln] = k;
        if (ln == 0) p.utok[base + nb.y] = t;
    }
}

extern "C" size_t st_cuda_moe_dispatch_plan_ws_bytes(int T, int kc, int E, int S) {
    if (T < 0 || kc < 1 || E < 1 || S < 1) return 0;
    return plan_ws_layout(T, kc, E, S, NULL, NULL);
}

extern "C" st_status_t st_cuda_moe_dispatch_plan(const st_gpu_stream_t *s, const struct st_moe_plan *p, const int *ids,
                                                 const int *cnt, const float *wts, const int *server_of,
                                                 uint8_t *tok_failed, int T, int kc, void *ws, size_t ws_bytes) {
    const int S = p->n_servers, E = p->n_experts;
    if (T < 0 || T > (1 << 24) || kc < 1 || kc > PLAN_MAXK || E < 1 || E > PLAN_MAXE || S < 1 || S > PLAN_MAXS ||
        (long long)T * kc > p->max_rows)
        return ST_FAIL(ST_ERR_INVALID_ARG, "moe_dispatch_plan: T=%d kc=%d E=%d S=%d max_rows=%d", T, kc, E, S,
                       p->max_rows);
    if (!p->n_rows || !p->n_exp || !p->exp_ids || !p->offsets || !p->pair || !p->orow || !p->src || !p->n_out ||
        !p->node || !p->n_uniq || !p->utok || !server_of || (p->wts && !wts) ||
        (T > 0 && (!ids || !cnt || !tok_failed)))
        return ST_FAIL(ST_ERR_INVALID_ARG, "moe_dispatch_plan: a table or input is NULL");
    size_t need = plan_ws_layout(T, kc, E, S, NULL, NULL);
    if (!ws || ws_bytes < need)
        return ST_FAIL(ST_ERR_INVALID_ARG, "moe_dispatch_plan: workspace %zu bytes, needs %zu", ws_bytes, need);
    plan_ws_t w;
    plan_ws_layout(T, kc, E, S, (char *)ws, &w);
    const int nch = plan_nch(T);
    cudaStream_t st = ST_STREAM(s);
    if (T > 0) {
        const size_t shm = sizeof(int) * (2 * (size_t)PLAN_CHT * kc + (size_t)PLAN_NW * E); /* ≤ 32 KiB */
        if (kc == 1)
            plan_tokens_kernel<1><<<nch, PLAN_CHT, shm, st>>>(ids, cnt, server_of, tok_failed, T, kc, E, S, w);
        else if (kc == 2)
            plan_tokens_kernel<2><<<nch, PLAN_CHT, shm, st>>>(ids, cnt, server_of, tok_failed, T, kc, E, S, w);
        else if (kc <= 4)
            plan_tokens_kernel<4><<<nch, PLAN_CHT, shm, st>>>(ids, cnt, server_of, tok_failed, T, kc, E, S, w);
        else if (kc <= 8)
            plan_tokens_kernel<8><<<nch, PLAN_CHT, shm, st>>>(ids, cnt, server_of, tok_failed, T, kc, E, S, w);
        else
            plan_tokens_kernel<PLAN_MAXK><<<nch, PLAN_CHT, shm, st>>>(ids, cnt, server_of, tok_failed, T, kc, E, S, w);
        st_status_t rc = ST_LAUNCH_OK("plan_tokens_kernel");
        if (rc != ST_OK) return rc;
    }
    /* NOTE: the scan and the scatter are programmatic dependents of the kernel before them (each waits for
     * it first thing): their launches overlap the previous kernel's tail */
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(S + 1), cfg.blockDim = dim3(PLAN_SCAN), cfg.stream = st;
    cfg.attrs = at, cfg.numAttrs = T > 0 ? 1 : 0;
    st_status_t rc = ST_CUDA_CHECK(cudaLaunchKernelEx(&cfg, plan_scan_kernel, *p, server_of, T, nch, w));
    if (rc != ST_OK || T == 0) return rc;
    cfg.gridDim = dim3((T * kc + 255) / 256), cfg.blockDim = dim3(256), cfg.numAttrs = 1;
    return ST_CUDA_CHECK(cudaLaunchKernelEx(&cfg, plan_scatter_kernel, *p, ids, wts, T, kc, w));
}
