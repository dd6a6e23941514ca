/* Strata data-plane wire format: the fixed 64-byte header of every UCX active message between
 * attention workers and expert servers, and the per-expert offsets table that starts a dispatch or
 * payload and the per-pair weights and output rows after it. Pure byte layout and validation; no
 * I/O, no allocation.
 *
 * Header byte map (little-endian, no padding; carried as the UCX AM header):
 *   off size field
 *     0   4  magic          ST_WIRE_MAGIC ("STRW" in memory)
 *     4   2  version        ST_WIRE_VERSION
 *     6   2  kind           st_wire_kind_t
 *     8   8  step           decode step of the sender
 *    16   4  layer          MoE layer index (0-based)
 *    20   2  micro_batch    micro-batch of the step
 *    22   2  flags          DISPATCH: ST_WIRE_FLAG_UNIQUE_ROWS, ST_WIRE_FLAG_BF16_ROWS, ST_WIRE_FLAG_PEER or 0;
 *                            COMBINE: ST_WIRE_FLAG_PEER or 0; otherwise 0
 *    24   4  source_id      sender's member id (low 32 bits of the coordinator id)
 *    28   4  token_count    DISPATCH: (token, expert) pairs in the payload (sum over experts);
 *                            COMBINE: output rows in the payload
 *    32   4  expert_count   experts in the offsets table (COMBINE: 0, no table)
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
 * Payload of DISPATCH (N = token_count pairs, E = expert_count):
 *   [E]     uint32 expert ids, strictly ascending
 *   [E + 1] uint32 row offsets: pairs of expert_ids[i] are [off[i], off[i+1]),
 *           off[0] = 0, non-decreasing, off[E] = N
 *   zero padding up to a multiple of 16 bytes (ST_WIRE_ALIGN)
 *   with ST_WIRE_FLAG_UNIQUE_ROWS (a token routed to several experts of one server travels once, as
 *   DeepEP dispatches one copy per rank):
 *     [N] uint32 sources: pair r's input row is distinct row src[r] (< unique); zero padding to 16
 *   [N] uint32 output row of each pair (< N; the reply has 1 + the largest of them rows)
 *   [N] fp32 routing weight p of each pair
 *   zero padding up to a multiple of 16 bytes
 *   [unique or N, row_width] row-major input rows (distinct rows, or one per pair grouped by expert
 *   in table order): fp32, or bf16 with ST_WIRE_FLAG_BF16_ROWS (a GPU worker's latent rows as its
 *   engine holds them: half the bytes, and exact, since every server computes from bf16 or widens
 *   bf16 exactly); zero padding up to a multiple of 16 bytes.
 *   With ST_WIRE_FLAG_PEER (UNIQUE_ROWS and BF16_ROWS too; a same-host worker whose device memory
 *   the server opened through a PEER message): no input rows; src[r] is the row of the worker's input
 *   region (its micro-batch's latent rows) that pair r reads, < unique, the rows it spans (may exceed
 *   N); instead of the rows, 16 bytes: uint32 reply_row, the first row of the worker's reply region
 *   that the output rows go to, then 12 zero bytes.
 * Payload of COMBINE: [token_count, row_width] fp32 row-major output rows (with ST_WIRE_FLAG_PEER
 *   none: they were written into the worker's reply region from the dispatch's reply_row): row o = the summation
 *   tree (docs/architecture.md, "Bit-exact expert results") over the pairs r with output row o of
 *   fl(p_r · E_{expert of r}(input of r)) + 0; a row without pairs is +0. The sender's plan makes
 *   each output row one node of the tree over a token's experts, so the worker finishes the tree.
 * Payload of ERROR: payload_bytes of UTF-8 text (not NUL-terminated); token/expert counts are 0.
 * Payload of PEER (a same-host worker's device memory for one channel slot, once; counts 0; the
 *   answer is a COMBINE of 0 rows, or an ERROR: that slot stays on copies), 96 bytes:
 *     0  64  CUDA IPC handle of the allocation holding both regions
 *    64   8  input region: byte offset in it (bf16 rows [in_rows, row_width])
 *    72   8  reply region: byte offset in it (fp32 rows [reply_rows, row_width])
 *    80   4  in_rows     84   4  reply_rows     88   4  row_width     92   4  zero
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
 * dispatch carries its micro-batch's slots at byte 56 instead (the data, not a kernel choice);
 * 5: the server combines: a dispatch carries each pair's weight and output row, a reply its output
 * rows without a table; 6: ST_WIRE_FLAG_BF16_ROWS, input rows padded to 16 bytes */
#define ST_WIRE_VERSION 6u
#define ST_WIRE_FLAG_UNIQUE_ROWS 0x1u
#define ST_WIRE_FLAG_BF16_ROWS 0x2u
#define ST_WIRE_FLAG_PEER 0x4u /* rows in, results out through the worker's device memory (see above) */
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
    ST_WIRE_KIND_PEER = 4,     /* attention worker -> expert server (same host): its device memory */
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
    uint32_t token_count; /* DISPATCH: pairs; COMBINE: output rows */
    uint32_t expert_count;
    uint32_t row_width;
    uint64_t seq;
    uint64_t payload_bytes;
    st_status_t status;  /* ERROR only */
    uint32_t compute_us; /* COMBINE only: µs the dispatch spent at the server (queue + compute) */
    uint32_t unique;     /* DISPATCH only: distinct rows (ST_WIRE_FLAG_UNIQUE_ROWS), 0 = plain rows */
    uint32_t slots;      /* DISPATCH only: routed slots of the sender's micro-batch at this layer over all
                          * servers (T × routing stride), ≥ token_count; 0 on other kinds */
    bool bf16_rows;      /* DISPATCH only: input rows are bf16 (ST_WIRE_FLAG_BF16_ROWS), else fp32 */
    bool peer;           /* DISPATCH, COMBINE: rows through the worker's device memory (ST_WIRE_FLAG_PEER) */
    uint32_t reply_row;  /* peer DISPATCH, to encode (st_wire_dispatch_encode writes it into the payload;
                          * decoding leaves it 0: st_wire_dispatch_decode reads it) */
} st_wire_info_t;
/* PEER's payload (byte map above). */
typedef struct {
    uint8_t handle[64];
    uint64_t in_off, reply_off;
    uint32_t in_rows, reply_rows, row_width, zero;
} st_wire_peer_t;

/* Bytes of the offsets table incl. padding, for expert_count experts. */
size_t st_wire_table_bytes(uint32_t expert_count);

/* Exact payload bytes of a DISPATCH of this shape (unique distinct rows, ST_WIRE_FLAG_UNIQUE_ROWS;
 * 0 = one row per pair; bf16 rows or fp32); 0 with ST_FAIL when a count exceeds its ST_WIRE_MAX_*
 * bound. */
size_t st_wire_dispatch_bytes(uint32_t token_count, uint32_t expert_count, uint32_t row_width, uint32_t unique,
                              bool bf16_rows);
/* The same for a ST_WIRE_FLAG_PEER dispatch (unique: the input rows its sources span). */
size_t st_wire_dispatch_peer_bytes(uint32_t token_count, uint32_t expert_count, uint32_t unique);
/* The same for a COMBINE of `rows` output rows. */
size_t st_wire_combine_bytes(uint32_t rows, uint32_t row_width);

/* The header fields of the reply to the request `req`: its step, layer, micro-batch, source, seq and
 * row width; a COMBINE of `rows` output rows (status ST_OK) or, with status < 0, an ERROR carrying
 * `text_len` bytes of text. Nothing of the request's shape (expert table, distinct rows, bf16 rows,
 * slots) is carried over: those describe a dispatch. */
st_wire_info_t st_wire_reply_info(const st_wire_info_t *req, st_status_t status, uint32_t rows, size_t text_len);
/* A PEER message's fields (its payload: sizeof(st_wire_peer_t) bytes); check: the payload's. */
st_wire_info_t st_wire_peer_info(uint64_t seq);
st_status_t st_wire_peer_check(const void *payload, size_t len, st_wire_peer_t *out);

/* Fill *out from info (payload_bytes included). Checks kind and bounds, and for DISPATCH/COMBINE
 * that payload_bytes equals st_wire_dispatch_bytes() / st_wire_combine_bytes(). */
st_status_t st_wire_header_encode(const st_wire_info_t *info, st_wire_header_t *out);

/* Validate an arrived header of hdr_len bytes against the real payload length: magic, version,
 * kind, reserved fields, counts within bounds, payload_bytes == payload_len and consistent with the
 * counts. *out written only on success. Errors are ST_ERR_PROTOCOL. */
st_status_t st_wire_header_decode(const void *hdr, size_t hdr_len, size_t payload_len, st_wire_info_t *out);

/* Where a DISPATCH's parts lie in its payload (views, own nothing). */
typedef struct {
    const uint32_t *expert_ids; /* [expert_count] */
    const uint32_t *offsets;    /* [expert_count + 1] */
    const uint32_t *src;        /* [token_count] sources (each < unique), NULL for one row per pair */
    const uint32_t *orow;       /* [token_count] output row of each pair, each < token_count */
    const float *wts;           /* [token_count] routing weight of each pair */
    const void *rows;           /* [unique or token_count, row_width] input rows: fp32, or bf16 (uint16
                                 * bit patterns) when bf16; NULL with peer */
    bool peer;                  /* the rows and the output rows through the worker's device memory */
    uint32_t reply_row;         /* peer: the first row of the worker's reply region the output rows take */
    bool bf16;
    uint32_t n_out;             /* output rows of the reply: 1 + the largest orow (0 without pairs) */
} st_wire_dispatch_t;

/* Write a DISPATCH's table and zero its paddings in payload (info->payload_bytes long, as
 * st_wire_header_encode checked it): the shape is info's (expert_count, token_count, unique,
 * row_width, bf16_rows); expert_ids and offsets are checked like on decode. The caller then fills
 * the parts it gets back (writable views; src NULL unless unique > 0; n_out 0, the caller's to know;
 * with info->peer, info->reply_row written, and no rows). */
st_status_t st_wire_dispatch_encode(void *payload, const st_wire_info_t *info, const uint32_t *expert_ids,
                                    const uint32_t *offsets, st_wire_dispatch_t *out);

/* Validate a decoded DISPATCH's payload (4-byte aligned): table, paddings, sources < unique,
 * output rows < token_count; *out written only on success. Weights are any fp32. */
st_status_t st_wire_dispatch_decode(const void *payload, const st_wire_info_t *info, st_wire_dispatch_t *out);

#ifdef __cplusplus
}
#endif
#endif
