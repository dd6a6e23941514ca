/* libFuzzer harness: the data-plane wire format (strata/wire.h) as an expert server or attention
 * worker receives it: bytes [0, 64) are the UCX AM header, the rest the payload. Beyond "no crash":
 * a decoded header is within every ST_WIRE_MAX_* bound with payload_bytes equal to what arrived,
 * and encodes back to the same 64 bytes; a decoded dispatch has ascending expert ids, offsets that
 * partition [0, token_count), sources below `unique`, output rows below token_count with n_out one
 * past the largest, its rows (fp32, or bf16 with the flag) end within 16 bytes of the payload's end,
 * which zero padding fills (every weight and row byte is read, so ASan sees any view past it); a
 * failed decode writes nothing; a reply is exactly its output rows. A dispatch through the worker's
 * device memory (ST_WIRE_FLAG_PEER) has sources and bf16 rows, no rows in its payload, which ends
 * with its reply row and 12 zero bytes; its reply carries no rows; a PEER message is 96 bytes that
 * st_wire_peer_check accepts only with its reserved bytes zero. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz/fuzz.h"
#include "strata/wire.h"

static void check_dispatch(const st_wire_info_t *in, const uint8_t *pl) {
    st_wire_dispatch_t d;
    memset(&d, 0x5a, sizeof d);
    st_wire_dispatch_t before = d;
    st_status_t s = st_wire_dispatch_decode(pl, in, &d);
    if (s != ST_OK) {
        FUZZ_REQUIRE(s == ST_ERR_PROTOCOL);
        FUZZ_REQUIRE(memcmp(&d, &before, sizeof d) == 0);
        return;
    }
    const uint32_t *ids = d.expert_ids, *off = d.offsets;
    FUZZ_REQUIRE((const uint8_t *)ids == pl && off == ids + in->expert_count);
    for (uint32_t i = 1; i < in->expert_count; i++) FUZZ_REQUIRE(ids[i] > ids[i - 1]);
    FUZZ_REQUIRE(off[0] == 0 && off[in->expert_count] == in->token_count);
    for (uint32_t i = 0; i < in->expert_count; i++) FUZZ_REQUIRE(off[i] <= off[i + 1]);
    uint64_t n_rows = in->token_count;
    if (in->unique) {
        FUZZ_REQUIRE(d.src != NULL && (const uint8_t *)d.src == pl + st_wire_table_bytes(in->expert_count));
        for (uint32_t r = 0; r < in->token_count; r++) FUZZ_REQUIRE(d.src[r] < in->unique);
        n_rows = in->unique;
    } else {
        FUZZ_REQUIRE(d.src == NULL);
    }
    uint32_t top = 0;
    for (uint32_t r = 0; r < in->token_count; r++) {
        FUZZ_REQUIRE(d.orow[r] < in->token_count);
        top = d.orow[r] + 1 > top ? d.orow[r] + 1 : top;
    }
    FUZZ_REQUIRE(d.n_out == top && d.wts == (const float *)(d.orow + in->token_count));
    volatile float fs = 0;
    for (uint32_t r = 0; r < in->token_count; r++) fs += d.wts[r];
    FUZZ_REQUIRE(d.bf16 == in->bf16_rows && d.peer == in->peer);
    if (in->peer) { /* no rows: the reply row and 12 zero bytes end the payload */
        const uint8_t *blk = (const uint8_t *)(d.orow + 2 * (size_t)in->token_count);
        blk = pl + (((size_t)(blk - pl) + ST_WIRE_ALIGN - 1) / ST_WIRE_ALIGN * ST_WIRE_ALIGN);
        FUZZ_REQUIRE(d.rows == NULL && blk + 16 == pl + in->payload_bytes && in->bf16_rows && in->unique > 0);
        for (int i = 4; i < 16; i++) FUZZ_REQUIRE(blk[i] == 0);
        FUZZ_REQUIRE(memcmp(&d.reply_row, blk, 4) == 0);
        (void)fs;
        return;
    }
    const uint8_t *end = (const uint8_t *)d.rows + n_rows * in->row_width * (d.bf16 ? 2u : 4u);
    const uint8_t *pend = pl + in->payload_bytes;
    FUZZ_REQUIRE(end <= pend && pend - end < ST_WIRE_ALIGN && (size_t)(pend - pl) % ST_WIRE_ALIGN == 0);
    for (const uint8_t *q = end; q < pend; q++) FUZZ_REQUIRE(*q == 0);
    volatile uint8_t sink = 0;
    for (const uint8_t *q = (const uint8_t *)d.rows; q < end; q++) sink ^= *q;
    (void)sink;
    (void)fs;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    st_wire_info_t in;
    memset(&in, 0x5a, sizeof in);
    st_wire_info_t before = in;
    size_t hl = size < ST_WIRE_HEADER_BYTES ? size : ST_WIRE_HEADER_BYTES;
    size_t plen = size - hl;
    st_status_t s = st_wire_header_decode(data, hl, plen, &in);
    if (s != ST_OK) {
        FUZZ_REQUIRE(s == ST_ERR_PROTOCOL);
        FUZZ_REQUIRE(memcmp(&in, &before, sizeof in) == 0);
        return 0;
    }
    FUZZ_REQUIRE(hl == ST_WIRE_HEADER_BYTES && in.payload_bytes == plen);
    /* the header as the sender would have written it */
    st_wire_header_t h;
    FUZZ_REQUIRE(st_wire_header_encode(&in, &h) == ST_OK);
    FUZZ_REQUIRE(memcmp(&h, data, ST_WIRE_HEADER_BYTES) == 0);
    switch (in.kind) {
    case ST_WIRE_KIND_DISPATCH: {
        FUZZ_REQUIRE(in.token_count <= ST_WIRE_MAX_TOKENS && in.expert_count <= ST_WIRE_MAX_EXPERTS &&
                in.row_width <= ST_WIRE_MAX_ROW_WIDTH && (in.peer || in.unique <= in.token_count) &&
                in.status == ST_OK && in.slots >= in.token_count);
        FUZZ_REQUIRE(in.payload_bytes ==
                (in.peer ? st_wire_dispatch_peer_bytes(in.token_count, in.expert_count, in.unique)
                         : st_wire_dispatch_bytes(in.token_count, in.expert_count, in.row_width, in.unique,
                                                  in.bf16_rows)));
        /* an exact-size, 16-byte aligned copy of the payload (UCX hands the receiver such a buffer) */
        uint8_t *pl = aligned_alloc(16, (plen + 15) / 16 * 16 + 16);
        FUZZ_REQUIRE(pl);
        memcpy(pl, data + ST_WIRE_HEADER_BYTES, plen);
        check_dispatch(&in, pl);
        free(pl);
        break;
    }
    case ST_WIRE_KIND_COMBINE:
        FUZZ_REQUIRE(in.token_count <= ST_WIRE_MAX_TOKENS && in.expert_count == 0 && in.unique == 0 && in.slots == 0 &&
                !in.bf16_rows &&
                in.row_width <= ST_WIRE_MAX_ROW_WIDTH && in.status == ST_OK &&
                in.payload_bytes == (in.peer ? 0 : st_wire_combine_bytes(in.token_count, in.row_width)));
        break;
    case ST_WIRE_KIND_PEER: {
        FUZZ_REQUIRE(in.token_count == 0 && in.expert_count == 0 && in.row_width == 0 && !in.peer &&
                in.payload_bytes == sizeof(st_wire_peer_t));
        st_wire_peer_t w, before_w;
        memset(&w, 0x5a, sizeof w);
        before_w = w;
        if (st_wire_peer_check(data + ST_WIRE_HEADER_BYTES, plen, &w) == ST_OK)
            FUZZ_REQUIRE(w.zero == 0 && w.in_rows > 0 && w.reply_rows > 0 && w.in_off % 16 == 0);
        else FUZZ_REQUIRE(memcmp(&w, &before_w, sizeof w) == 0);
        break;
    }
    case ST_WIRE_KIND_ERROR:
        FUZZ_REQUIRE(in.status < 0 && in.payload_bytes <= ST_WIRE_MAX_ERROR_TEXT && in.token_count == 0 &&
                in.expert_count == 0 && in.row_width == 0 && in.unique == 0);
        break;
    default:
        FUZZ_REQUIRE(!"unknown kind decoded");
    }
    return 0;
}
