/* Strata data-plane wire format: the fixed 64-byte header of every UCX active message between
 * attention workers and expert servers, and the per-expert offsets table that starts a dispatch or
 * combine payload. Pure byte layout and validation; no I/O, no allocation.
 *
 * Header byte map (little-endian, no padding; carried as the UCX AM header):
 *   off size field
 *     0   4  magic          ST_WIRE_MAGIC ("STRW" in memory)
 *     4   2  version        ST_WIRE_VERSION
 *     6   2  kind           st_wire_kind_t
 *     8   8  step           decode step of the sender
 *    16   4  layer          MoE layer index (0-based)
 *    20   2  micro_batch    micro-batch of the step
 *    22   2  flags          DISPATCH: ST_WIRE_FLAG_UNIQUE_ROWS or 0; otherwise 0
 *    24   4  source_id      sender's member id (low 32 bits of the coordinator id)
 *    28   4  token_count    rows in the payload (sum over experts)
 *    32   4  expert_count   experts in the offsets table
 *    36   4  row_width      floats per row (ℓ, the latent width)
 *    40   8  seq            sender's sequence number; a reply echoes the dispatch's
 *    48   8  payload_bytes  exact length of the AM payload
 *    56   4  status/slots   ERROR: st_status_t (negative). DISPATCH: slots, the routed (token, expert)
 *                            slots of the sender's micro-batch at this layer, all servers together
 *                            (tokens × routing stride, ≥ token_count): the batch's shape, which the
 *                            expert arithmetic may depend on (docs/architecture.md, "Bit-exact expert
 *                            results"). COMBINE: 0
 *    60   4  aux            COMBINE: time the dispatch spent at the expert server (queued +
 *                            computed), µs; DISPATCH with ST_WIRE_FLAG_UNIQUE_ROWS: the number of
 *                            distinct rows carried (1 ≤ unique ≤ token_count); otherwise 0
 *
 * Payload of DISPATCH and COMBINE (offsets table, then rows):
 *   [expert_count]     uint32 expert ids, strictly ascending
 *   [expert_count + 1] uint32 row offsets: rows of expert_ids[i] are [off[i], off[i+1]),
 *                      off[0] = 0, non-decreasing, off[expert_count] = token_count
 *   zero padding up to a multiple of 16 bytes (ST_WIRE_ALIGN)
 *   [token_count, row_width] fp32 row-major, grouped by expert in table order.
 *   A dispatch carries input rows; the combine reply carries, in the same order, one output row per
 *   (token, expert) pair: weighting and the sum over experts happen at the attention worker.
 * DISPATCH with ST_WIRE_FLAG_UNIQUE_ROWS (a token routed to several experts of one server travels
 * once, as DeepEP dispatches one copy per rank): after the table,
 *   [token_count]      uint32 sources: grouped row r is distinct row src[r] (< unique)
 *   zero padding up to a multiple of 16 bytes
 *   [unique, row_width] fp32 row-major distinct rows.
 *   The reply is the same COMBINE as above (token_count rows).
 * Payload of ERROR: payload_bytes of UTF-8 text (not NUL-terminated); token/expert counts are 0.
 */
#ifndef STRATA_WIRE_H
#define STRATA_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "strata/base.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ST_WIRE_MAGIC 0x57525453u /* "STRW" little-endian */
/* 2: ST_WIRE_FLAG_UNIQUE_ROWS dispatches; 3: a per-row kernel flag (0x2); 4: that flag gone, a
 * dispatch carries its micro-batch's slots at byte 56 instead (the data, not a kernel choice) */
#define ST_WIRE_VERSION 4u
#define ST_WIRE_FLAG_UNIQUE_ROWS 0x1u
#define ST_WIRE_HEADER_BYTES 64u
#define ST_WIRE_ALIGN 16u
#define ST_WIRE_MAX_TOKENS (1u << 20)
#define ST_WIRE_MAX_EXPERTS 4096u
#define ST_WIRE_MAX_ROW_WIDTH 65536u
#define ST_WIRE_MAX_ERROR_TEXT 4096u

/* UCX active-message ids of the data plane */
#define ST_WIRE_AM_DISPATCH 1u /* attention worker -> expert server */
#define ST_WIRE_AM_REPLY 2u    /* expert server -> attention worker (COMBINE or ERROR) */
/* the same-host data path (common/xfer): the worker's st_xfer_hello_t in the header (no payload), the
 * server's answer: its channel's handle (ST_XFER_HANDLE_BYTES of payload, the hello's magic as header) */
#define ST_WIRE_AM_SHM_HELLO 3u /* attention worker -> expert server */
#define ST_WIRE_AM_SHM_OFFER 4u /* expert server -> attention worker */

typedef enum {
    ST_WIRE_KIND_DISPATCH = 1, /* attention worker -> expert server: rows to run */
    ST_WIRE_KIND_COMBINE = 2,  /* expert server -> attention worker: output rows */
    ST_WIRE_KIND_ERROR = 3,    /* expert server -> attention worker: the dispatch `seq` failed */
} st_wire_kind_t;

/* The header as it lies on the wire (see byte map). Use encode/decode, not the fields directly, so
 * validation is never skipped. */
typedef struct {
    uint32_t magic;
    uint16_t version;
    uint16_t kind;
    uint64_t step;
    uint32_t layer;
    uint16_t micro_batch;
    uint16_t flags;
    uint32_t source_id;
    uint32_t token_count;
    uint32_t expert_count;
    uint32_t row_width;
    uint64_t seq;
    uint64_t payload_bytes;
    union {
        int32_t status; /* ERROR */
        uint32_t slots; /* DISPATCH */
    };
    uint32_t aux;
} st_wire_header_t;

/* Decoded header fields. */
typedef struct {
    st_wire_kind_t kind;
    uint64_t step;
    uint32_t layer;
    uint16_t micro_batch;
    uint32_t source_id;
    uint32_t token_count;
    uint32_t expert_count;
    uint32_t row_width;
    uint64_t seq;
    uint64_t payload_bytes;
    st_status_t status;  /* ERROR only */
    uint32_t compute_us; /* COMBINE only: µs the dispatch spent at the server (queue + compute) */
    uint32_t unique;     /* DISPATCH only: distinct rows (ST_WIRE_FLAG_UNIQUE_ROWS), 0 = plain rows */
    uint32_t slots;      /* DISPATCH only: routed slots of the sender's micro-batch at this layer over all
                          * servers (T × routing stride), ≥ token_count; 0 on other kinds */
} st_wire_info_t;

/* Bytes of the offsets table incl. padding, for expert_count experts. */
size_t st_wire_table_bytes(uint32_t expert_count);

/* Exact payload bytes for a DISPATCH/COMBINE of this shape; 0 with ST_FAIL when a count exceeds
 * its ST_WIRE_MAX_* bound. */
size_t st_wire_payload_bytes(uint32_t token_count, uint32_t expert_count, uint32_t row_width);
/* The same for a DISPATCH with unique distinct rows (ST_WIRE_FLAG_UNIQUE_ROWS; 0 = plain rows). */
size_t st_wire_dispatch_bytes(uint32_t token_count, uint32_t expert_count, uint32_t row_width, uint32_t unique);

/* Fill *out from info (payload_bytes included). Checks kind and bounds, and for DISPATCH/COMBINE
 * that payload_bytes equals st_wire_payload_bytes(). */
st_status_t st_wire_header_encode(const st_wire_info_t *info, st_wire_header_t *out);

/* Validate an arrived header of hdr_len bytes against the real payload length: magic, version,
 * kind, reserved fields, counts within bounds, payload_bytes == payload_len and consistent with the
 * counts. *out written only on success. Errors are ST_ERR_PROTOCOL. */
st_status_t st_wire_header_decode(const void *hdr, size_t hdr_len, size_t payload_len, st_wire_info_t *out);

/* Write the offsets table at the start of payload (>= st_wire_table_bytes). expert_ids and offsets
 * are checked like on decode. Returns the pointer to the first row (payload + table bytes). */
st_status_t st_wire_table_encode(void *payload, uint32_t expert_count, const uint32_t *expert_ids,
                                 const uint32_t *offsets, uint32_t token_count, float **rows);
/* The same for a unique-rows DISPATCH: also zeroes the padding after the sources and returns where
 * the caller writes them (*src [token_count]) and the distinct rows (*rows [unique, width]). */
st_status_t st_wire_table_encode_unique(void *payload, uint32_t expert_count, const uint32_t *expert_ids,
                                        const uint32_t *offsets, uint32_t token_count, uint32_t **src, float **rows);

/* Validate the table of a decoded DISPATCH/COMBINE payload (4-byte aligned) and give views into it:
 * expert_ids [expert_count], offsets [expert_count + 1], rows [token_count, row_width]. The views
 * point into payload and own nothing. A unique-rows DISPATCH (info->unique > 0) also gives *src
 * [token_count] (each checked < unique) and rows [unique, row_width]; src NULL refuses such a
 * payload; *src is NULL for plain rows. */
st_status_t st_wire_table_decode(const void *payload, const st_wire_info_t *info, const uint32_t **expert_ids,
                                 const uint32_t **offsets, const uint32_t **src, const float **rows);

#ifdef __cplusplus
}
#endif
#endif
