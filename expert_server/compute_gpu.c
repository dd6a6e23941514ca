/* Expert server GPU compute (see compute_gpu.h): expert weights resident on the device as bf16,
 * one dispatch = two H2D copies (the message's sources, pairs and distinct rows as one span, as
 * they lie in the wire layout; the host-built offsets, weight table and leaf table as one pinned
 * block) → rows expanded on the device → bf16 → one
 * st_cuda_moe_ffn_table over all its experts (a device table of the experts' weight blocks;
 * big experts through cuBLAS) → the tree sums into output rows (st_cuda_moe_tree_reduce) → fp32
 * rows D2H straight into the caller's reply buffer (the server pins its slot buffers, so neither
 * side is staged through another host copy); a per-row dispatch (decode sizes) in mapped memory
 * copies only its tables: its kernels read the request's rows and write the reply where they lie. A dispatch
 * whose shape and buffers repeat replays those copies and launches as one CUDA graph
 * (ST_TUN_CUDA_GRAPHS): per-row FFNs, and grouped ones whose launches the key fixes
 * (st_cuda_moe_ffn_table_fixed). No I/O. */
#include "compute.h"
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "compute_gpu.h"
#include "strata/gpu.h"
#include "strata/kernels_cuda.h"

/* What a dispatch's queued copies and launches depend on besides the pinned tables' contents: a
 * graph captured for one key replays for any dispatch with that key. */
typedef struct {
    uint32_t n, n_exp, n_in, n_out;
    uint32_t pairs_at;              /* gpu_leaf, peer: the byte offset of the pairs' orow from the sources */
    uint32_t tiles;                 /* grouped FFN: ⌈largest expert's rows / 128⌉ (its tile map); per row: 0 */
    bool bf16, span, rows_ffn;      /* bf16 rows; the wire span copied as one; the per-row FFN */
    bool direct;                    /* no copies: the kernels read and write the host memory itself */
    bool peer;                      /* rows and output rows in the worker's device memory (rows, out) */
    bool gpu_leaf;                  /* the leaf table built on the device (from the span's pairs) */
    const void *src, *rows, *out;   /* the host memory the copies (direct: the kernels) read and write */
} gkey_t;
#define ES_GRAPHS 16 /* a server's decode shapes × its request slots */
#define ES_SEEN 8    /* recent keys: a key among them is captured when it comes again */
#define ES_CLASSES 4 /* dispatch sizes in the split: ≤ 64 pairs, ≤ 1024, ≤ 4096, more */
/* pairs above which the leaf table is built on the device: a prefill's O(pairs) scatter costs the
 * host ~10 ns a pair (0.35 ms at 32K), the device's five steps ~20 µs whatever the size */
#define ES_LEAF_GPU_MIN 4096
static const uint32_t es_class_max[ES_CLASSES - 1] = {64, 1024, 4096};

struct st_es_gpu {
    const st_ckpt_t *ck;
    const st_config_t *c;
    int dev, n_layers, n_experts, ew, mi, max_rows;
    st_gpu_stream_t s;
    void *done_ev;                 /* a dispatch's end on s, polled while wait_fn runs */
    void (*wait_fn)(void *);       /* st_es_gpu_set_wait */
    void *wait_arg;
    /* per (layer, expert): one device block [gate (mi×ew) ; up (mi×ew) ; down (ew×mi)] bf16, NULL
     * until bound. Allocated at bind time (start-up / placement), never per dispatch. */
    st_bf16_t **w;
    size_t w_bytes;
    /* dispatch buffers, sized for max_rows at create */
    uint8_t *d_pay;    // device: a dispatch's span src | orow, wts | rows as the wire lays it out
    size_t pay_bytes;
    float *d_in;       // [max_rows, ew] fp32, device: the rows as carried (distinct rows or all), separate copies
    st_bf16_t *d_in_bf;// [max_rows, ew] bf16, device (the launcher's input, grouped order)
    float *d_out;      // [max_rows, ew] fp32, device: the FFN rows (one per pair)
    /* d_meta mirrors the pinned block (h_off | h_tab | h_eid | h_leaf, each 256-aligned): one copy up */
    uint8_t *d_meta;
    size_t meta_tab, meta_eid, meta_leaf; /* byte offsets of the table, the ids, the leaf table in both */
    uint32_t *d_leaf;  // [5 (max_rows + 1)] device: the leaf table loff | lrow | lid | lp (fp32 bits), packed,
                       // then (a peer dispatch with the table built on the host) the pairs' sources
    uint32_t *d_src;   // [max_rows + 1] device: the sources of a distinct-rows dispatch, separate copies; or
                       // (a span) the leaf table's counts on the device
    int *d_off;        // [n_experts + 1] int32, device: the dispatch's row offsets
    const st_bf16_t **d_tab; // [n_experts, 3] device: {gate, up, down} of each dispatched expert
    void *d_ws;        // FFN workspace, st_cuda_moe_ffn_table_ws_bytes(max_rows, mi)
    size_t ws_bytes;
    st_gpu_arena_t pinned; /* host staging: offsets, the weight table and the leaf table */
    int *h_off;
    const st_bf16_t **h_tab;
    uint32_t *h_eid;   // [n_experts] pinned host: the dispatch's expert ids (for the leaf table on the device)
    uint32_t *h_leaf;  // as d_leaf, pinned host
    uint32_t *h_err;   // pinned host (mapped): the device leaf table's verdict (st_cuda_moe_leaf_table err)
    uint32_t *m_err;   // h_err's device address; NULL: no leaf table on the device
    /* MXFP4 staging for bind: codes [rows, cols/2] + scales [rows, cols/32] of the largest matrix */
    uint8_t *d_mx;
    size_t mx_bytes;
    /* dispatch graphs: a key among the ES_SEEN most recent ones is captured when it comes again (a
     * worker's micro-batches alternate between request slots); the least recently used graph goes */
    bool graphs;
    struct {
        gkey_t k;
        void *exec;
        uint64_t used;
    } gr[ES_GRAPHS];
    gkey_t seen[ES_SEEN];
    int seen_at;
    uint64_t tick;
    st_es_gpu_counts_t n_served; /* st_es_gpu_counts (atomics) */
    /* where a dispatch's time goes, per size class (st_es_gpu_split): seconds and counts */
    double t_prep[ES_CLASSES], t_launch[ES_CLASSES], t_dev[ES_CLASSES], prep_max[ES_CLASSES];
    double t_served[ES_CLASSES]; /* st_es_gpu_note_served: arrival to the reply, the wire checks included */
    uint64_t n_cls[ES_CLASSES];
};

static size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

static int es_class(size_t pairs) {
    int c = 0;
    while (c < ES_CLASSES - 1 && pairs > es_class_max[c])
        c++;
    return c;
}

void st_es_gpu_note_served(st_es_gpu_t *g, uint32_t pairs, double seconds) {
    g->t_served[es_class(pairs)] += seconds;
}

st_status_t st_es_gpu_create(st_es_gpu_t **out, const st_ckpt_t *ck, int dev, int max_rows) {
    int n_dev = st_gpu_device_count();
    if (dev < 0 || dev >= n_dev)
        return ST_FAIL(ST_ERR_INVALID_ARG, "expert gpu: no CUDA device %d (%d found)", dev, n_dev);
    st_es_gpu_t *g = calloc(1, sizeof *g);
    if (!g) return ST_FAIL(ST_ERR_NO_MEMORY, "expert gpu");
    g->ck = ck;
    g->c = st_ckpt_config(ck);
    g->dev = dev;
    g->n_layers = g->c->n_layers;
    g->n_experts = g->c->n_experts;
    g->ew = st_config_expert_width(g->c);
    g->mi = g->c->moe_inter;
    g->max_rows = max_rows;
    g->graphs = st_tun_int(ST_TUN_CUDA_GRAPHS) != 0;
    st_status_t s;
    if (g->ew % 32 || g->mi % 32 || g->n_experts <= 0) {
        s = ST_FAIL(ST_ERR_CONFIG, "expert gpu: expert width %d and moe_inter %d must be multiples of 32", g->ew, g->mi);
        free(g);
        return s;
    }
    if ((s = st_gpu_init(dev)) != ST_OK || (s = st_gpu_stream_create(&g->s)) != ST_OK) {
        free(g);
        return s;
    }
    if ((s = st_gpu_event_create(&g->done_ev)) != ST_OK) goto err;
    size_t nw = (size_t)g->n_layers * (size_t)g->n_experts;
    g->w = calloc(nw + 1, sizeof *g->w);
    if (!g->w) {
        s = ST_FAIL(ST_ERR_NO_MEMORY, "expert gpu weight table");
        goto err;
    }
    size_t rows_f32 = (size_t)max_rows * g->ew * sizeof(float);
    /* the leaf table (4 (max_rows + 1) words) and, for a dispatch through the worker's memory, its sources */
    size_t leaf_bytes = 5 * ((size_t)max_rows + 1) * sizeof(uint32_t);
    g->ws_bytes = st_cuda_moe_ffn_table_ws_bytes(max_rows, g->mi);
    size_t me = (size_t)g->mi * g->ew;
    g->mx_bytes = me / 2 + me / 32;
    size_t off_bytes = ((size_t)g->n_experts + 1) * sizeof(int), tab_bytes = (size_t)g->n_experts * 3 * sizeof(void *);
    g->meta_tab = align256(off_bytes);
    g->meta_eid = g->meta_tab + align256(tab_bytes);
    g->meta_leaf = g->meta_eid + align256((size_t)g->n_experts * sizeof(uint32_t));
    /* the wire's src and pair arrays, each padded to 16 bytes (wire.c), before the rows */
    g->pay_bytes = 12 * (size_t)max_rows + 32 + rows_f32;
    if ((s = st_gpu_malloc((void **)&g->d_pay, g->pay_bytes)) != ST_OK ||
        (s = st_gpu_malloc((void **)&g->d_in, rows_f32)) != ST_OK ||
        (s = st_gpu_malloc((void **)&g->d_in_bf, rows_f32 / 2)) != ST_OK ||
        (s = st_gpu_malloc((void **)&g->d_out, rows_f32)) != ST_OK ||
        (s = st_gpu_malloc((void **)&g->d_src, ((size_t)max_rows + 1) * sizeof(uint32_t))) != ST_OK ||
        (s = st_gpu_malloc((void **)&g->d_meta, g->meta_leaf + leaf_bytes)) != ST_OK ||
        (s = st_gpu_malloc(&g->d_ws, g->ws_bytes ? g->ws_bytes : 256)) != ST_OK ||
        (s = st_gpu_malloc((void **)&g->d_mx, g->mx_bytes)) != ST_OK)
        goto err;
    g->d_off = (int *)g->d_meta;
    g->d_tab = (const st_bf16_t **)(g->d_meta + g->meta_tab);
    g->d_leaf = (uint32_t *)(g->d_meta + g->meta_leaf);
    if ((s = st_gpu_arena_init(&g->pinned, g->meta_leaf + align256(leaf_bytes) + 256, 1)) != ST_OK) goto err;
    g->h_off = st_gpu_arena_alloc(&g->pinned, off_bytes);
    g->h_tab = st_gpu_arena_alloc(&g->pinned, tab_bytes);
    g->h_eid = st_gpu_arena_alloc(&g->pinned, (size_t)g->n_experts * sizeof(uint32_t));
    g->h_leaf = st_gpu_arena_alloc(&g->pinned, leaf_bytes);
    g->h_err = st_gpu_arena_alloc(&g->pinned, sizeof(uint32_t));
    uint8_t *base = (uint8_t *)g->h_off;
    if ((uint8_t *)g->h_tab != base + g->meta_tab || (uint8_t *)g->h_eid != base + g->meta_eid ||
        (uint8_t *)g->h_leaf != base + g->meta_leaf || !g->h_err) {
        s = ST_FAIL(ST_ERR_INTERNAL, "expert gpu: pinned staging is not laid out as its device mirror");
        goto err;
    }
    g->m_err = st_gpu_host_dev(g->h_err);
    *out = g;
    return ST_OK;
err:
    st_es_gpu_destroy(g);
    return s;
}

void st_es_gpu_forget(st_es_gpu_t *g) {
    for (int i = 0; i < ES_GRAPHS; i++) {
        st_gpu_graph_destroy(g->gr[i].exec);
        memset(&g->gr[i], 0, sizeof g->gr[i]);
    }
    memset(g->seen, 0, sizeof g->seen);
}

void st_es_gpu_counts(const st_es_gpu_t *g, st_es_gpu_counts_t *out) {
    out->replays = __atomic_load_n(&g->n_served.replays, __ATOMIC_RELAXED);
    out->direct = __atomic_load_n(&g->n_served.direct, __ATOMIC_RELAXED);
    out->leaf_dev = __atomic_load_n(&g->n_served.leaf_dev, __ATOMIC_RELAXED);
}

void st_es_gpu_split(const st_es_gpu_t *g, char *buf, size_t cap) {
    size_t k = 0;
    buf[0] = 0;
    for (int c = 0; c < ES_CLASSES && k < cap; c++) {
        if (!g->n_cls[c]) continue;
        double n = (double)g->n_cls[c];
        uint32_t lo = c ? es_class_max[c - 1] + 1 : 1;
        char hi[16] = "";
        if (c < ES_CLASSES - 1) snprintf(hi, sizeof hi, "%u", es_class_max[c]);
        int w =
            snprintf(buf + k, cap - k, "%s%u-%s pairs (%llu): %.1f (max %.0f) / %.1f / %.1f / %.1f us", k ? "; " : "",
                     lo, hi, (unsigned long long)g->n_cls[c], 1e6 * g->t_prep[c] / n, 1e6 * g->prep_max[c],
                     1e6 * g->t_launch[c] / n, 1e6 * g->t_dev[c] / n, 1e6 * g->t_served[c] / n);
        if (w < 0) break;
        k += (size_t)w;
    }
}

void st_es_gpu_destroy(st_es_gpu_t *g) {
    if (!g) return;
    st_gpu_init(g->dev);
    st_es_gpu_forget(g);
    size_t nw = (size_t)g->n_layers * (size_t)g->n_experts;
    for (size_t i = 0; g->w && i < nw; i++) st_gpu_free(g->w[i]);
    free(g->w);
    st_gpu_free(g->d_pay);
    st_gpu_free(g->d_in);
    st_gpu_free(g->d_in_bf);
    st_gpu_free(g->d_out);
    st_gpu_free(g->d_src);
    st_gpu_free(g->d_meta);
    st_gpu_free(g->d_ws);
    st_gpu_free(g->d_mx);
    if (g->pinned.base) st_gpu_arena_cleanup(&g->pinned);
    if (g->done_ev) st_gpu_events_destroy(&g->done_ev, 1);
    if (g->s.stream) st_gpu_stream_destroy(&g->s);
    free(g);
}

void st_es_gpu_set_wait(st_es_gpu_t *g, void (*fn)(void *), void *arg) {
    g->wait_fn = fn;
    g->wait_arg = arg;
}

/* W [rows, cols] (any stored dtype) → dst [rows, cols] bf16 on the device; synchronous. */
static st_status_t upload_bf16(st_es_gpu_t *g, st_bf16_t *dst, const st_weight_t *w) {
    size_t rows = (size_t)w->rows, cols = (size_t)w->cols, n = rows * cols;
    if (w->dtype == ST_DT_BF16) return st_gpu_memcpy_h2d(dst, w->data, n * 2);
    if (w->dtype == ST_DT_MXFP4) {
        /* NOTE: MXFP4 → bf16 is exact (kernels_cuda.h), so the device copy equals the CPU's decode */
        if (cols % 32 || n / 2 + n / 32 > g->mx_bytes)
            return ST_FAIL(ST_ERR_CONFIG, "expert gpu: MXFP4 weight [%zu, %zu] does not fit the staging", rows, cols);
        uint8_t *codes = g->d_mx, *scale = g->d_mx + n / 2;
        st_status_t s;
        if ((s = st_gpu_memcpy_h2d(codes, w->data, n / 2)) != ST_OK ||
            (s = st_gpu_memcpy_h2d(scale, w->scale, n / 32)) != ST_OK ||
            (s = st_cuda_mxfp4_to_bf16(&g->s, dst, codes, scale, (int)rows, (int)cols)) != ST_OK)
            return s;
        return st_gpu_stream_sync(&g->s); /* the staging is reused by the next matrix */
    }
    /* F32 / F16: decode on the host (bind path only) */
    float *tf = malloc(cols * sizeof(float));
    uint16_t *tb = malloc(n * sizeof(uint16_t));
    st_status_t s = (tf && tb) ? ST_OK : ST_FAIL(ST_ERR_NO_MEMORY, "expert gpu: weight staging");
    for (size_t r = 0; s == ST_OK && r < rows; r++) {
        st_weight_rows_f32(w, (int)r, 1, tf);
        for (size_t i = 0; i < cols; i++) tb[r * cols + i] = st_f32_to_bf16(tf[i]);
    }
    if (s == ST_OK) s = st_gpu_memcpy_h2d(dst, tb, n * 2);
    free(tf);
    free(tb);
    return s;
}

st_status_t st_es_gpu_bind(st_es_gpu_t *g, int layer, int e) {
    if (layer < 0 || layer >= g->n_layers || e < 0 || e >= g->n_experts || !st_config_is_moe_layer(g->c, layer))
        return ST_FAIL(ST_ERR_INVALID_ARG, "expert %d of layer %d does not exist", e, layer);
    size_t i = (size_t)layer * g->n_experts + (size_t)e;
    if (g->w[i]) return ST_OK;
    st_expert_weights_t w;
    st_status_t s = st_ckpt_expert(g->ck, layer, e, &w);
    if (s != ST_OK) return s;
    if ((s = st_gpu_init(g->dev)) != ST_OK) return s;
    size_t me = (size_t)g->mi * g->ew, bytes = 3 * me * sizeof(st_bf16_t);
    st_bf16_t *d = NULL;
    if ((s = st_gpu_malloc((void **)&d, bytes)) != ST_OK) return s;
    if ((s = upload_bf16(g, d, &w.gate)) != ST_OK || (s = upload_bf16(g, d + me, &w.up)) != ST_OK ||
        (s = upload_bf16(g, d + 2 * me, &w.down)) != ST_OK) {
        st_gpu_free(d);
        return s;
    }
    g->w[i] = d;
    g->w_bytes += bytes;
    return ST_OK;
}

size_t st_es_gpu_weight_bytes(const st_es_gpu_t *g) { return g->w_bytes; }

#define CK(call)                                                                                                       \
    do {                                                                                                               \
        if ((s = (call)) != ST_OK) return s;                                                                           \
    } while (0)

/* A dispatch through the worker's memory with its leaf table built on the host: its sources go up in
 * the pinned block, after the leaf table (one copy, not two: at decode sizes a copy's latency, not its
 * bytes, is what it costs). */
static bool src_in_meta(const gkey_t *k) {
    return k->peer && !k->direct && !k->gpu_leaf;
}

/* Queue one dispatch's copies and launches on g->s (the host tables filled; plain or captured): the
 * pinned block up (offsets, weight table, and the leaf table or the ids it is built from), the input
 * (below), the expansion into bf16 grouped rows, the FFN (per row when rows_ffn), the tree into
 * output rows and those rows where they go. The input and the output:
 *   - copies: the rows as carried (with the sources in the same copy when k->span) up, the output rows
 *     down into k->out;
 *   - k->direct (a per-row dispatch of distinct rows in mapped memory): the expansion reads the sources
 *     and rows where they lie and the tree writes k->out there; NOTE: at decode sizes a copy costs more
 *     than the few rows it moves (each DMA has its own latency, and a graph's copy nodes launch slower
 *     than its kernels); the tables stay copied: read from mapped memory they measured slower still (a
 *     chain of dependent host reads in every block: 52 µs a dispatch against 33 with all copies, H200,
 *     2026-12-03);
 *   - k->peer (wire.h ST_WIRE_FLAG_PEER): the rows are read from, and the output rows written into, the
 *     worker's device memory (k->rows, k->out: device addresses); the sources copied up in the pinned
 *     block (src_in_meta), or with the pairs when the device builds the leaf table from them, or (direct)
 *     read where they lie. */
static st_status_t enqueue(st_es_gpu_t *g, const gkey_t *k, bool rows_ffn) {
    const st_config_t *c = g->c;
    size_t n = k->n, ew = (size_t)g->ew, no = k->n_out;
    size_t rows_bytes = (size_t)k->n_in * ew * (k->bf16 ? sizeof(st_bf16_t) : sizeof(float));
    st_status_t s;
    size_t meta = k->gpu_leaf ? g->meta_eid + k->n_exp * sizeof(uint32_t) : g->meta_leaf + (no + 1 + 3 * n) * 4;
    bool src_meta = src_in_meta(k); /* the sources ride in the pinned block's copy */
    if (src_meta) meta += n * 4;
    CK(st_gpu_memcpy_async(&g->s, g->d_meta, g->h_off, meta, ST_GPU_COPY_H2D));
    const void *d_rows = g->d_in;
    const uint32_t *d_srcs = g->d_src;
    float *d_outrows = g->d_in; /* the output rows into d_in (free by then: the FFN read the bf16 copy) */
    if (k->direct) {
        d_srcs = st_gpu_host_dev(k->src);
        d_rows = k->peer ? k->rows : st_gpu_host_dev(k->rows);
        d_outrows = k->peer ? (float *)k->out : st_gpu_host_dev(k->out);
        if (!d_srcs || !d_rows || !d_outrows)
            return ST_FAIL(ST_ERR_INTERNAL, "expert gpu: direct dispatch buffers not mapped");
    } else if (src_meta) {
        d_srcs = g->d_leaf + no + 1 + 3 * n;
        d_rows = k->rows, d_outrows = (float *)k->out;
    } else if (k->peer) { /* sources, then output rows and weights (the device's leaf table reads them) */
        CK(st_gpu_memcpy_async(&g->s, g->d_pay, k->src, k->pairs_at + 8 * n, ST_GPU_COPY_H2D));
        d_srcs = (const uint32_t *)g->d_pay;
        d_rows = k->rows, d_outrows = (float *)k->out;
    } else if (k->span) {
        size_t lead = (size_t)((const uint8_t *)k->rows - (const uint8_t *)k->src);
        CK(st_gpu_memcpy_async(&g->s, g->d_pay, k->src, lead + rows_bytes, ST_GPU_COPY_H2D));
        d_srcs = (const uint32_t *)g->d_pay;
        d_rows = g->d_pay + lead;
    } else {
        /* bf16 rows without sources are the FFN's input as they are */
        CK(st_gpu_memcpy_async(&g->s, !k->src && k->bf16 ? (void *)g->d_in_bf : (void *)g->d_in, k->rows, rows_bytes,
                               ST_GPU_COPY_H2D));
        if (k->src) CK(st_gpu_memcpy_async(&g->s, g->d_src, k->src, n * sizeof(uint32_t), ST_GPU_COPY_H2D));
    }
    if (k->gpu_leaf) { /* from the copied pairs: orow [n] then wts [n] after the padded sources */
        const uint32_t *d_orow = (const uint32_t *)(g->d_pay + k->pairs_at);
        uint32_t *dl = g->d_leaf;
        CK(st_cuda_moe_leaf_table(&g->s, dl, dl + no + 1, dl + no + 1 + n, (float *)(dl + no + 1 + 2 * n), g->m_err,
                                  d_orow, (const float *)(d_orow + n), g->d_off,
                                  (const uint32_t *)(g->d_meta + g->meta_eid), (int)k->n_exp, (int)n, (int)no,
                                  g->d_src));
    }
    if (k->src) CK(st_cuda_moe_expand(&g->s, g->d_in_bf, d_rows, k->bf16, d_srcs, (int)n, (int)k->n_in, g->ew));
    else if (!k->bf16) CK(st_cuda_f32_to_bf16(&g->s, g->d_in_bf, g->d_in, n * ew));
    bool situ = c->act == ST_ACT_SITU;
    if (rows_ffn) /* h in the first bytes of the FFN workspace (its h [max_rows, mi] region) */
        CK(st_cuda_moe_ffn_rows_table(&g->s, g->d_out, (st_bf16_t *)g->d_ws, g->d_in_bf, g->d_off, (int)k->n_exp,
                                      (int)n, g->d_tab, g->ew, g->mi, situ, c->situ_beta1, c->situ_beta2));
    else
        CK(st_cuda_moe_ffn_table(&g->s, g->d_out, g->d_in_bf, g->d_off, g->h_off, (int)k->n_exp, 0, g->d_tab, g->ew,
                                 g->mi, situ, c->situ_beta1, c->situ_beta2, g->d_ws, g->ws_bytes));
    const uint32_t *dl = g->d_leaf;
    CK(st_cuda_moe_tree_reduce(&g->s, d_outrows, g->d_out, dl, dl + no + 1, dl + no + 1 + n,
                               (const float *)(dl + no + 1 + 2 * n), (int)no, g->ew));
    if (!k->direct && !k->peer)
        CK(st_gpu_memcpy_async(&g->s, (void *)k->out, g->d_in, no * ew * sizeof(float), ST_GPU_COPY_D2H));
    return ST_OK;
}

/* The cached graph of key k (marked used), or NULL. */
static void *graph_find(st_es_gpu_t *g, const gkey_t *k) {
    for (int i = 0; i < ES_GRAPHS; i++)
        if (g->gr[i].exec && !memcmp(&g->gr[i].k, k, sizeof *k)) {
            g->gr[i].used = ++g->tick;
            return g->gr[i].exec;
        }
    return NULL;
}

/* Capture k's dispatch into the least recently used entry; NULL when capture failed (graphs are then
 * off for this server, with a warning: the dispatch runs plainly). */
static void *graph_capture(st_es_gpu_t *g, const gkey_t *k) {
    void *exec = NULL;
    st_status_t s = st_gpu_capture_begin(&g->s);
    if (s == ST_OK) {
        st_status_t q = enqueue(g, k, k->rows_ffn);
        s = st_gpu_capture_end(&g->s, &exec);
        if (s == ST_OK) s = q;
    }
    if (s != ST_OK) {
        st_gpu_graph_destroy(exec);
        g->graphs = false;
        st_log_warn("expert gpu: dispatch graphs switched off, a capture failed: %s", st_err_last());
        return NULL;
    }
    int v = 0;
    for (int i = 1; i < ES_GRAPHS; i++)
        if (g->gr[i].used < g->gr[v].used) v = i;
    st_gpu_graph_destroy(g->gr[v].exec);
    g->gr[v].k = *k;
    g->gr[v].exec = exec;
    g->gr[v].used = ++g->tick;
    return exec;
}

st_status_t st_es_gpu_run(st_es_gpu_t *g, int layer, uint32_t n_exp, const st_wire_dispatch_t *d, uint32_t n_in,
                          uint32_t slots, float *out) {
    return st_es_gpu_run_peer(g, layer, n_exp, d, n_in, slots, out, NULL);
}

st_status_t st_es_gpu_peer_open(st_es_gpu_t *g, const st_wire_peer_t *w, st_es_gpu_peer_t *out) {
    if (w->row_width != (uint32_t)g->ew)
        return ST_FAIL(ST_ERR_INVALID_ARG, "peer memory of rows %u wide, this model's experts work at %d", w->row_width,
                       g->ew);
    void *base = NULL;
    st_status_t s = st_gpu_init(g->dev);
    if (s == ST_OK) s = st_gpu_ipc_open(w->handle, &base);
    if (s != ST_OK) return s;
    *out = (st_es_gpu_peer_t){.base = base,
                              .in = (const uint16_t *)((const uint8_t *)base + w->in_off),
                              .reply = (float *)((uint8_t *)base + w->reply_off),
                              .in_rows = w->in_rows,
                              .reply_rows = w->reply_rows};
    return ST_OK;
}

void st_es_gpu_peer_close(st_es_gpu_t *g, st_es_gpu_peer_t *p) {
    if (!p->base) return;
    st_es_gpu_forget(g); /* graphs may name its addresses */
    st_gpu_ipc_close(p->base);
    memset(p, 0, sizeof *p);
}

st_status_t st_es_gpu_run_peer(st_es_gpu_t *g, int layer, uint32_t n_exp, const st_wire_dispatch_t *d, uint32_t n_in,
                               uint32_t slots, float *out, const st_es_gpu_peer_t *peer) {
    const uint32_t *expert_ids = d->expert_ids, *offsets = d->offsets, *src = d->src;
    if (layer < 0 || layer >= g->n_layers) return ST_FAIL(ST_ERR_INVALID_ARG, "layer %d out of range", layer);
    if (n_exp > (uint32_t)g->n_experts)
        return ST_FAIL(ST_ERR_INVALID_ARG, "dispatch names %u experts, the model has %d", n_exp, g->n_experts);
    if (d->peer && (!peer || !peer->base))
        return ST_FAIL(ST_ERR_INVALID_ARG, "a dispatch through the worker's device memory, which is not open here");
    if (d->peer && (n_in > peer->in_rows || (uint64_t)d->reply_row + d->n_out > peer->reply_rows || !src || !d->bf16))
        return ST_FAIL(ST_ERR_INVALID_ARG, "a dispatch of %u input rows, output rows %u..%u, of the worker's %u and %u",
                       n_in, d->reply_row, d->reply_row + d->n_out, peer->in_rows, peer->reply_rows);
    if (offsets[n_exp] > (uint32_t)g->max_rows || (!d->peer && n_in > (uint32_t)g->max_rows) ||
        d->n_out > (uint32_t)g->max_rows)
        return ST_FAIL(ST_ERR_CAPACITY, "dispatch of %u rows exceeds this server's %d", offsets[n_exp], g->max_rows);
    if (slots < offsets[n_exp])
        return ST_FAIL(ST_ERR_INVALID_ARG, "dispatch of %u rows from a micro-batch of %u slots", offsets[n_exp], slots);
    if (!src && n_in != offsets[n_exp])
        return ST_FAIL(ST_ERR_INVALID_ARG, "dispatch carries %u rows for %u grouped rows (no sources: equal)", n_in,
                       offsets[n_exp]);
    uint32_t maxc = 0; /* the largest expert's rows */
    for (uint32_t k = 0; k < n_exp; k++) {
        if (expert_ids[k] >= (uint32_t)g->n_experts || !g->w[(size_t)layer * g->n_experts + expert_ids[k]])
            return ST_FAIL(ST_ERR_INVALID_ARG, "expert %u of layer %d is not held here", expert_ids[k], layer);
        if (offsets[k + 1] < offsets[k]) return ST_FAIL(ST_ERR_INVALID_ARG, "dispatch offsets decrease at %u", k);
        maxc = ST_MAX(maxc, offsets[k + 1] - offsets[k]);
    }
    double t0 = st_time_sec();
    size_t n = offsets[n_exp], ew = (size_t)g->ew, me = (size_t)g->mi * g->ew, no = d->n_out;
    /* the rows as carried (fp32, or bf16 as a GPU worker sends them), straight from the caller's buffer
     * (pinned in the server: an async DMA), with the sources in the same copy (the span) when they lie
     * before the rows as the wire lays them out; distinct rows expanded into the grouped order on the
     * device */
    size_t rows_bytes = (size_t)n_in * ew * (d->bf16 ? sizeof(st_bf16_t) : sizeof(float));
    size_t rows_pad = (rows_bytes + ST_WIRE_ALIGN - 1) / ST_WIRE_ALIGN * ST_WIRE_ALIGN;
    size_t lead = src ? (size_t)((const uint8_t *)d->rows - (const uint8_t *)src) : 0;
    bool span = src && (const uint8_t *)d->rows > (const uint8_t *)src &&
                lead + rows_pad == st_wire_dispatch_bytes((uint32_t)n, n_exp, (uint32_t)ew, n_in, d->bf16) -
                                       st_wire_table_bytes(n_exp) &&
                lead + rows_bytes <= g->pay_bytes && lead % 16 == 0;
    /* the leaf table: a large span's on the device (from its pairs, copied with it), else on the host
     * (pinned), packed for one copy up: loff [n_out + 1] | lrow | lid | lp [n] */
    bool gpu_leaf = (span || d->peer) && n > ES_LEAF_GPU_MIN && g->m_err;
    st_status_t s = ST_OK;
    if (!gpu_leaf) {
        uint32_t *loff = g->h_leaf, *lrow = loff + no + 1, *lid = lrow + n;
        s = st_es_leaf_table(d, n_exp, loff, lrow, lid, (float *)(lid + n));
    }
    if (s != ST_OK) return s;
    if (n == 0) return ST_OK;
    if ((s = st_gpu_init(g->dev)) != ST_OK) return s;
    /* NOTE: experts are separate device blocks (bound one by one): the launcher reads them through
     * the table, so the whole dispatch is one call whatever its experts. */
    for (uint32_t k = 0; k <= n_exp; k++)
        g->h_off[k] = (int)offsets[k];
    if (gpu_leaf) memcpy(g->h_eid, expert_ids, sizeof(uint32_t) * n_exp);
    for (uint32_t k = 0; k < n_exp; k++) {
        const st_bf16_t *w = g->w[(size_t)layer * g->n_experts + expert_ids[k]];
        g->h_tab[3 * k] = w, g->h_tab[3 * k + 1] = w + me, g->h_tab[3 * k + 2] = w + 2 * me;
    }
    gkey_t key;
    memset(&key, 0, sizeof key); /* compared with memcmp: the padding too */
    key.n = (uint32_t)n, key.n_exp = n_exp, key.n_in = n_in, key.n_out = (uint32_t)no, key.bf16 = d->bf16;
    key.span = span && !d->peer, key.src = src, key.rows = d->rows, key.out = out, key.gpu_leaf = gpu_leaf;
    key.peer = d->peer;
    if (d->peer) key.rows = peer->in, key.out = peer->reply + (size_t)d->reply_row * ew;
    if (d->peer || gpu_leaf) key.pairs_at = (uint32_t)((const uint8_t *)d->orow - (const uint8_t *)src);
    /* NOTE: the same choice as the worker's engine for a micro-batch of `slots` routed slots, made from
     * the same numbers (docs/architecture.md, "Bit-exact expert results"); n ≤ slots ≤ 64 then */
    bool rows_ffn = st_cuda_moe_ffn_slots_pick((int)ST_MIN(slots, (uint32_t)INT_MAX), g->n_experts, g->ew, g->mi);
    key.rows_ffn = rows_ffn, key.tiles = rows_ffn ? 0 : (maxc + 127) / 128;
    /* NOTE: direct only per row (≤ 64 slots): the grouped FFN reads its offsets on the host to size its
     * launch and rereads rows per tile, where mapped reads would cost more than a copy */
    key.direct =
        rows_ffn && src && st_gpu_host_dev(src) && (d->peer || (st_gpu_host_dev(d->rows) && st_gpu_host_dev(out)));
    if (src_in_meta(&key)) memcpy(g->h_leaf + no + 1 + 3 * n, src, n * sizeof(uint32_t));
    bool fixed = rows_ffn || st_cuda_moe_ffn_table_fixed((int)maxc, 0, g->ew, g->mi);
    double t1 = st_time_sec(); /* the host tables done; then a graph (found or captured) or the launches */
    void *exec = NULL;
    if (fixed && g->graphs) {
        exec = graph_find(g, &key);
        bool again = false; /* seen recently (steady decode), its host buffers pinned (graph copies need that) */
        for (int i = 0; i < ES_SEEN && !exec && !again; i++) again = !memcmp(&g->seen[i], &key, sizeof key);
        if (again && st_gpu_host_pinned(src ? (const void *)src : d->rows) && (d->peer || st_gpu_host_pinned(out)))
            exec = graph_capture(g, &key);
        if (!exec && !again) g->seen[g->seen_at++ % ES_SEEN] = key;
    }
    if (exec) {
        CK(st_gpu_graph_launch(exec, &g->s));
        __atomic_add_fetch(&g->n_served.replays, 1, __ATOMIC_RELAXED);
    } else {
        CK(enqueue(g, &key, rows_ffn));
    }
    if (key.direct) __atomic_add_fetch(&g->n_served.direct, 1, __ATOMIC_RELAXED);
    if (key.gpu_leaf) __atomic_add_fetch(&g->n_served.leaf_dev, 1, __ATOMIC_RELAXED);
    double t2 = st_time_sec();
    if (g->wait_fn) { /* the caller's other work (its transport) while the device computes */
        CK(st_gpu_event_record(g->done_ev, &g->s));
        while (!st_gpu_event_done(g->done_ev)) g->wait_fn(g->wait_arg);
    }
    CK(st_gpu_stream_sync(&g->s));
#undef CK
    if (gpu_leaf && *(volatile uint32_t *)g->h_err != 0xffffffffu)
        return ST_FAIL(ST_ERR_INVALID_ARG, "output row %u names an expert twice", *(volatile uint32_t *)g->h_err);
    int c = es_class(n);
    g->t_prep[c] += t1 - t0, g->t_launch[c] += t2 - t1, g->t_dev[c] += st_time_sec() - t2;
    g->prep_max[c] = ST_MAX(g->prep_max[c], t1 - t0);
    g->n_cls[c]++;
    return ST_OK;
}
