/* Strata transfer layer: put / signal / wait over memory regions that a process owns and exposes to
 * one peer on the same host (NVSHMEM / StepMesh style: a region, a handle that travels over an
 * existing control connection, puts into the peer's region, a flag signal with release semantics, a
 * bounded wait with acquire semantics). Backends, chosen per region at run time:
 *   ST_XFER_HOST   POSIX shared memory. CPU puts/signals/waits (spin, then futex) in every build; in
 *                  the CUDA build also the pinned host ring a GPU reaches without peer access
 *                  (st_xfer_region_gpu_map, then the stream operations below).
 *   ST_XFER_DEVICE device memory shared through CUDA IPC (CUDA build; two GPUs of one host, or two
 *                  processes on one GPU); stream operations only.
 * Peers on other hosts use common/transport (UCX active messages), which this module does not wrap.
 *
 * Flags. A flag is an 8-byte slot (ST_XFER_FLAG_BYTES, 8-byte aligned offset) inside a region's user
 * bytes: a 32-bit sequence word that only grows (compared modulo 2^32, kernels' st_flag_*) and, for
 * host waiters, a 32-bit count of sleepers. A wait for seq is met once the word reaches seq; regions
 * start zeroed, so sequences start at 1.
 *
 * Threads: a region may be used from any thread; a flag has one signaller at a time. Every wait is
 * bounded; st_xfer_region_abort (any thread, e.g. a transport's loss callback) releases waiters.
 * Errors: ST_ERR_TIMEOUT (deadline), ST_ERR_PEER (peer process exited, or the region was aborted),
 * with the region's label in the text. Regions are created and opened at connection time, never on
 * the per-token path. */
#ifndef STRATA_XFER_H
#define STRATA_XFER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "strata/base.h"
#ifdef STRATA_XFER_GPU /* defined for strata_xfer's users in the CUDA build */
#include "strata/gpu.h"
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { ST_XFER_HOST = 1, ST_XFER_DEVICE = 2 } st_xfer_kind_t;

typedef struct st_xfer_region st_xfer_region_t;

#define ST_XFER_HANDLE_BYTES 128 /* an exported region: byte map in xfer.c */
#define ST_XFER_FLAG_BYTES 8
#define ST_XFER_MAX_BYTES ((size_t)1 << 36) /* 64 GiB: larger sizes in a handle are refused */

/* A new zeroed region of `bytes` user bytes, owned by this process. HOST: a shared-memory object with
 * a random name, mode 0600 (unlinked once the peer opened it, at the latest at destroy). DEVICE: a
 * cudaMalloc on the current device (ST_ERR_UNSUPPORTED in the CPU build). */
st_status_t st_xfer_region_create(st_xfer_kind_t kind, size_t bytes, st_xfer_region_t **out);
/* The handle of an owned region for its (single) peer: ST_XFER_HANDLE_BYTES into handle. */
st_status_t st_xfer_region_export(const st_xfer_region_t *r, uint8_t handle[ST_XFER_HANDLE_BYTES]);
/* The peer's region from its handle (len must be ST_XFER_HANDLE_BYTES), mapped into this process.
 * Refused: a short, malformed or foreign handle (ST_ERR_PROTOCOL / ST_ERR_INVALID_ARG), a region
 * smaller than min_bytes, one owned by another user or open to others, one already opened, or one
 * that no longer exists (ST_ERR_PEER). */
st_status_t st_xfer_region_open(const uint8_t *handle, size_t len, size_t min_bytes, st_xfer_region_t **out);
/* Unmaps (and, for an owned region, frees and unlinks) the region; NULL is fine. Waiters must be gone. */
void st_xfer_region_destroy(st_xfer_region_t *r);
/* A name for error texts ("expert server es1"); copied, truncated to 63 bytes. */
void st_xfer_region_label(st_xfer_region_t *r, const char *label);
/* The user bytes: a host address (HOST, page-aligned) or a device address (DEVICE, 256-byte aligned). */
void *st_xfer_region_ptr(const st_xfer_region_t *r);
size_t st_xfer_region_bytes(const st_xfer_region_t *r);
st_xfer_kind_t st_xfer_region_kind(const st_xfer_region_t *r);
/* Releases every present and future wait on r with ST_ERR_PEER and `why` (within ~1 ms for a
 * sleeping host waiter). Thread-safe; the first reason sticks. */
void st_xfer_region_abort(st_xfer_region_t *r, const char *why);

/* ---- HOST regions, from the CPU ---- */
/* dst[off .. off+bytes) = src (bounds checked; writing into st_xfer_region_ptr directly is the same). */
st_status_t st_xfer_put_host(st_xfer_region_t *r, size_t off, const void *src, size_t bytes);
/* Stores seq into the flag at flag_off (after every write before it: release) and wakes sleepers. */
st_status_t st_xfer_signal_host(st_xfer_region_t *r, size_t flag_off, uint32_t seq);
/* Returns ST_OK once the flag at flag_off reached seq (acquire: the signaller's writes are visible),
 * spinning first (st_xfer_set_spin) and then sleeping on a futex; ST_ERR_TIMEOUT after timeout_ms (> 0),
 * ST_ERR_PEER once the peer process exited or the region was aborted. */
st_status_t st_xfer_wait_host(st_xfer_region_t *r, size_t flag_off, uint32_t seq, int timeout_ms);
/* How long every host wait of this process spins before it sleeps on a futex: the tunable
 * XFER_SPIN_US, by default 2 ms in a role that drives a GPU (its host has a core to spare: it spins
 * through the gap between two layers, so a hand-off costs no kernel wake-up) and 30 µs otherwise
 * (also before any call). Called once at a role's start, before its threads. */
void st_xfer_set_spin(bool gpu_role);
/* That spin, in ns: for a caller that polls several things at once (the worker's ping-pong). */
uint64_t st_xfer_spin_ns(void);
/* Non-blocking: true when the flag at flag_off reached seq now. */
bool st_xfer_test_host(const st_xfer_region_t *r, size_t flag_off, uint32_t seq);

/* ---- channels: request/reply slots in one HOST region (the same-host data path) ----
 * The serving side (an expert server) creates a channel of n_slots slots, each holding one request
 * (a header of up to ST_XFER_MSG_HDR bytes + up to req_cap payload bytes) and its reply (header +
 * up to rep_cap bytes), plus a doorbell; the client (an attention worker) opens it from the handle.
 * The client writes a request's payload straight into st_xfer_chan_req_buf and posts it; the
 * server's thread waits on the doorbell (st_xfer_chan_next), reads the request in place, writes the
 * reply straight into st_xfer_chan_rep_buf and answers; the client waits on that slot's reply. No
 * copy besides the two headers, no thread hand-off. One posting thread and one serving thread per
 * channel; a slot is posted again only after its reply was taken (or the channel is dropped).
 * Lengths written by the peer are checked against the caps before a view is returned; views stay
 * valid until the slot is posted (request) or answered (reply) again. */
#define ST_XFER_MSG_HDR 128u
#define ST_XFER_CHAN_MAX_SLOTS 1024u
typedef struct st_xfer_chan st_xfer_chan_t;
typedef struct {
    const void *hdr;
    size_t hdr_len;
    const void *payload;
    size_t len;
    uint64_t sent_ns; /* when the peer posted or answered it (st_time_ns: one clock on one host) */
} st_xfer_msg_t;
st_status_t st_xfer_chan_create(uint32_t n_slots, size_t req_cap, size_t rep_cap, st_xfer_chan_t **out);
st_status_t st_xfer_chan_export(const st_xfer_chan_t *c, uint8_t handle[ST_XFER_HANDLE_BYTES]);
/* Refuses what st_xfer_region_open refuses, and a region whose channel layout does not fit it. */
st_status_t st_xfer_chan_open(const uint8_t *handle, size_t len, st_xfer_chan_t **out);
void st_xfer_chan_destroy(st_xfer_chan_t *c); /* NULL is fine; no wait may be running */
void st_xfer_chan_label(st_xfer_chan_t *c, const char *label);
/* Any thread (a transport's loss callback, a stop): present and future waits end with ST_ERR_PEER. */
void st_xfer_chan_abort(st_xfer_chan_t *c, const char *why);
/* The channel's whole mapping in this process (page-aligned), e.g. for a device to read replies in place. */
void st_xfer_chan_memory(const st_xfer_chan_t *c, void **p, size_t *n);
uint32_t st_xfer_chan_slots(const st_xfer_chan_t *c);
size_t st_xfer_chan_req_cap(const st_xfer_chan_t *c);
size_t st_xfer_chan_rep_cap(const st_xfer_chan_t *c);
/* client */
void *st_xfer_chan_req_buf(st_xfer_chan_t *c, uint32_t slot);
st_status_t st_xfer_chan_post(st_xfer_chan_t *c, uint32_t slot, const void *hdr, size_t hdr_len, size_t len);
/* ST_OK with the reply in *m; ST_ERR_TIMEOUT / ST_ERR_PEER as st_xfer_wait_host; ST_ERR_PROTOCOL when
 * the reply's lengths exceed the caps. The slot is free again whatever the outcome. */
st_status_t st_xfer_chan_wait_reply(st_xfer_chan_t *c, uint32_t slot, int timeout_ms, st_xfer_msg_t *m);
/* Non-blocking: true once the reply to the request pending in slot has arrived (then wait_reply
 * returns at once), or when nothing is pending there. */
bool st_xfer_chan_reply_in(const st_xfer_chan_t *c, uint32_t slot);
/* server: the next posted request (*slot, *m), waiting up to timeout_ms (spinning only until the data
 * path's spin has passed since the last request: an idle server sleeps); a timeout here is an idle
 * poll (ST_ERR_TIMEOUT), and an abort or the client's exit ends it (ST_ERR_PEER): recorded in
 * st_err_last, logged at DEBUG only (the caller says why its link ended). */
st_status_t st_xfer_chan_next(st_xfer_chan_t *c, int timeout_ms, uint32_t *slot, st_xfer_msg_t *m);
void *st_xfer_chan_rep_buf(st_xfer_chan_t *c, uint32_t slot);
st_status_t st_xfer_chan_reply(st_xfer_chan_t *c, uint32_t slot, const void *hdr, size_t hdr_len, size_t len);
/* Same host? This machine's boot id (/proc/sys/kernel/random/boot_id): two processes whose ids differ
 * cannot share memory; equal ids still need st_xfer_chan_open to succeed (containers may not share
 * /dev/shm), else the peer stays on the network path. out: 37 bytes (36 + NUL). */
st_status_t st_xfer_host_id(char out[37]);
/* The client's request for a channel, sent over the existing (authenticated) control connection;
 * the server answers with the channel's handle. Byte map (56 bytes, little-endian): 0 u32 magic
 * ST_XFER_HELLO_MAGIC, 4 u32 slots wanted, 8 u64 largest request payload, 16 boot id (36 chars + NUL),
 * 53 3 zero bytes. */
#define ST_XFER_HELLO_MAGIC 0x48585453u /* "STXH" */
typedef struct {
    uint32_t magic;
    uint32_t n_slots;
    uint64_t req_bytes;
    char host[37];
    uint8_t pad[3];
} st_xfer_hello_t;
st_status_t st_xfer_hello_init(st_xfer_hello_t *h, uint32_t n_slots, uint64_t req_bytes);
/* ST_OK with *out when msg (len bytes) is a well-formed hello from a process of this host;
 * ST_ERR_UNSUPPORTED (not logged) from another host; ST_ERR_PROTOCOL when malformed. */
st_status_t st_xfer_hello_check(const void *msg, size_t len, st_xfer_hello_t *out);

/* ---- stream-ordered operations (CUDA build; capturable in a CUDA graph) ----
 * HOST regions must be st_xfer_region_gpu_map'ped first.
 * epoch (optional, device or mapped memory): added to seq at run time, so a replayed graph uses new
 * sequence numbers. err (device or mapped memory): the watchdog's error word (kernels' st_cuda_flag_wait). */
#ifdef STRATA_XFER_GPU
/* Page-locks and maps a HOST region into the devices' address space (once; undone at destroy). */
st_status_t st_xfer_region_gpu_map(st_xfer_region_t *r);
/* The same for a channel's region: its slots become DMA-able for copies to and from a device. */
st_status_t st_xfer_chan_gpu_map(st_xfer_chan_t *c);
/* The user bytes as a device address (DEVICE: the region; HOST: its mapping), NULL if not mapped. */
void *st_xfer_region_dev_ptr(const st_xfer_region_t *r);
/* dst[off .. off+bytes) = src (device memory) on s: D2D into a DEVICE region, D2H into a HOST one. */
st_status_t st_xfer_put(const st_gpu_stream_t *s, st_xfer_region_t *dst, size_t off, const void *src, size_t bytes);
/* After the work queued before it on s, the flag at flag_off becomes seq (+ *epoch). A host thread
 * asleep in st_xfer_wait_host (past its spin) sees a GPU's signal at its next 1 ms slice. */
st_status_t st_xfer_signal(const st_gpu_stream_t *s, st_xfer_region_t *r, size_t flag_off, uint32_t seq, const uint32_t *epoch);
/* The work queued after it on s starts once the flag at flag_off reached seq (+ *epoch), or once
 * timeout_ms passed: then *err = ST_FLAG_ERR_TIMEOUT (checked by the caller after the work). */
st_status_t st_xfer_wait(const st_gpu_stream_t *s, st_xfer_region_t *r, size_t flag_off, uint32_t seq, const uint32_t *epoch,
                         int timeout_ms, uint32_t *err);
#endif

#ifdef __cplusplus
}
#endif
#endif
