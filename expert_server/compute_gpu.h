/* The expert server's GPU compute (--device cuda:N): the same dispatch → reply rows as
 * st_es_compute_run (compute.h), run by the grouped expert FFN launcher on one CUDA device.
 * Built only with CUDA (STRATA_WITH_CUDA); this header is plain C and CUDA-free. */
#ifndef STRATA_ES_COMPUTE_GPU_H
#define STRATA_ES_COMPUTE_GPU_H

#include <stdint.h>

#include "strata/base.h"
#include "strata/model.h"
#include "strata/wire.h"

typedef struct st_es_gpu st_es_gpu_t;

/* Start-up: select device dev, create the stream, and allocate everything the dispatch path uses:
 * device rows in (fp32 and bf16) and out (fp32) for max_rows × ℓ, the FFN workspace, a per-expert
 * offsets table, a pinned host staging area, and a device staging buffer for one MXFP4 matrix.
 * Expert weights are not uploaded here (st_es_gpu_bind). */
st_status_t st_es_gpu_create(st_es_gpu_t **out, const st_ckpt_t *ck, int dev, int max_rows);
void st_es_gpu_destroy(st_es_gpu_t *g);
/* Make expert e of layer l resident on the device as bf16 (no-op when already bound): allocates
 * its gate/up/down (cudaMalloc) and converts MXFP4 on the device (st_cuda_mxfp4_to_bf16), bf16 as
 * is, other dtypes through the host. NOTE: this is the start-up / placement path (it allocates and
 * synchronises); the server calls it when a layer's experts are first needed, never per dispatch
 * once bound. Any thread; the device is selected on each call. */
st_status_t st_es_gpu_bind(st_es_gpu_t *g, int layer, int e);
/* A decoded dispatch d (wire.h) of n_exp experts → out [d->n_out, ew] fp32 (host): the same output
 * rows as st_es_compute_run (compute.h), the FFN rows weighted and summed by the summation tree on
 * the device (st_cuda_moe_tree_reduce). n = offsets[n_exp] ≤ max_rows pairs; with d->src, d->rows
 * holds n_in distinct rows and pair r's input is rows[src[r]], without it n_in = n. The rows, sources
 * and out are copied to / from the device directly: pinned host memory makes those copies DMA (the
 * server pins its slot buffers), pageable memory works, staged by the driver. Every expert must be
 * bound. slots: the routed slots of the sender's micro-batch at this layer (wire.h; ≥ n). The
 * arithmetic of each FFN row is the one the rule in docs/architecture.md ("Bit-exact expert
 * results") gives for a micro-batch of that many slots, which is what the worker's own GPU engine
 * computes: per row (st_cuda_moe_ffn_rows_table) when st_cuda_moe_ffn_slots_pick(slots, n_experts,
 * ℓ, w), else the grouped GEMMs. Synchronous: returns after the results are in out. Device errors
 * come back as ST_ERR_DEVICE with the CUDA text in st_err_last(). */
st_status_t st_es_gpu_run(st_es_gpu_t *g, int layer, uint32_t n_exp, const st_wire_dispatch_t *d, uint32_t n_in,
                          uint32_t slots, float *out);
/* A same-host worker's device memory for one channel slot (wire.h ST_WIRE_KIND_PEER), opened through
 * CUDA IPC on this server's device: its micro-batch's latent rows (in, bf16 [in_rows, ew]) and the
 * rows its engine reads the results from (reply, fp32 [reply_rows, ew]). close: after st_es_gpu_forget
 * (graphs name the addresses); a zeroed one is fine. Not concurrently with st_es_gpu_run. */
typedef struct {
    void *base;
    const uint16_t *in; /* bf16 */
    float *reply;
    uint32_t in_rows, reply_rows;
} st_es_gpu_peer_t;
st_status_t st_es_gpu_peer_open(st_es_gpu_t *g, const st_wire_peer_t *w, st_es_gpu_peer_t *out);
void st_es_gpu_peer_close(st_es_gpu_t *g, st_es_gpu_peer_t *p);
/* st_es_gpu_run for a dispatch that may come through peer memory (d->peer: ST_WIRE_FLAG_PEER; its
 * rows read from peer->in, its output rows written to peer->reply from d->reply_row, out unused;
 * sources, row spans and output rows checked against the peer's sizes). */
st_status_t st_es_gpu_run_peer(st_es_gpu_t *g, int layer, uint32_t n_exp, const st_wire_dispatch_t *d, uint32_t n_in,
                               uint32_t slots, float *out, const st_es_gpu_peer_t *peer);
/* Dispatches replay their copies and launches as a CUDA graph once their shape and host buffers (the
 * key: pairs, experts, rows, output rows, row type, the FFN's path and, grouped, its tile count per
 * expert; the request's and the reply's addresses) repeat, buffers pinned, ST_TUN_CUDA_GRAPHS on, and
 * the grouped FFN's launches fixed by that key (st_cuda_moe_ffn_table_fixed). The graphs name those host
 * addresses: st_es_gpu_forget drops them all before such memory is unmapped or unpinned (a
 * same-host channel closing). Not concurrently with st_es_gpu_run. */
void st_es_gpu_forget(st_es_gpu_t *g);
/* While st_es_gpu_run waits for the device, call fn(arg) again and again (the data thread polls its
 * transport there: the next dispatch lands while this one computes); NULL: a plain wait. Set by the
 * thread that computes, for its own calls. */
void st_es_gpu_set_wait(st_es_gpu_t *g, void (*fn)(void *), void *arg);
/* Dispatches served so far (tests, the server's log; any thread): by a graph replay; without copying
 * rows (per-row dispatches, ≤ 64 slots, of distinct rows whose request and reply lie in mapped pinned
 * memory, read and written there by the kernels); with the leaf table built on the device (a large
 * dispatch whose sources, pairs and rows are one span). */
typedef struct {
    uint64_t replays, direct, leaf_dev;
} st_es_gpu_counts_t;
void st_es_gpu_counts(const st_es_gpu_t *g, st_es_gpu_counts_t *out);
/* Where the dispatches' time went so far, per size class of pairs: the host tables (leaf table,
 * offsets, checks; the mean and the largest), queueing the copies and launches (or finding,
 * capturing and launching a graph), the wait for the device (its copies and kernels), and the whole
 * time at the server (st_es_gpu_note_served), in µs, into buf (empty when none ran). Not concurrently
 * with st_es_gpu_run (the server's stop line). */
void st_es_gpu_split(const st_es_gpu_t *g, char *buf, size_t cap);
/* A dispatch of `pairs` that st_es_gpu_run served took `seconds` at the server, from its arrival to
 * its reply (the message's checks included). Same thread rules as st_es_gpu_run. */
void st_es_gpu_note_served(st_es_gpu_t *g, uint32_t pairs, double seconds);
/* Device bytes held by bound expert weights (for the start-up / placement log). */
size_t st_es_gpu_weight_bytes(const st_es_gpu_t *g);

#endif
