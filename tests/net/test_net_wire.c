/* Wire header and dispatch payload (version 6): encode → decode round trip, then every corrupted
 * field rejected; the same for a distinct-row dispatch (ST_WIRE_FLAG_UNIQUE_ROWS) and for bf16 rows
 * (ST_WIRE_FLAG_BF16_ROWS: half the bytes, rows padded to 16, the padding checked); a dispatch's
 * slots (byte 56) round trip, are checked against its pairs and are refused on replies; each pair's
 * output row and weight sit after the table (and the sources), the reply's output row count is
 * 1 + the largest, and a reply is its output rows with no table. A dispatch through the worker's
 * device memory (ST_WIRE_FLAG_PEER) carries sources (spanning more rows than pairs), pairs and its
 * reply row instead of rows, its reply no rows; the PEER message's fields and payload are checked. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "strata/wire.h"

static st_wire_info_t dispatch_info(void) {
    st_wire_info_t in = {.kind = ST_WIRE_KIND_DISPATCH, .step = 123456789012ull, .layer = 91, .micro_batch = 1,
                         .source_id = 17, .token_count = 10, .expert_count = 3, .row_width = 8, .seq = 99,
                         .slots = 24};
    in.payload_bytes = st_wire_dispatch_bytes(in.token_count, in.expert_count, in.row_width, 0, false);
    return in;
}

/* Corrupt the field at byte offset off (size sz) to value v; decoding must fail. */
static void expect_reject(const st_wire_header_t *good, size_t payload, size_t off, size_t sz, uint64_t v,
                          const char *what) {
    uint8_t b[64];
    memcpy(b, good, 64);
    memcpy(b + off, &v, sz);
    st_wire_info_t out = {.seq = 0xdead};
    st_status_t st = st_wire_header_decode(b, 64, payload, &out);
    CHECK(st == ST_ERR_PROTOCOL, "%s: accepted (status %d)", what, st);
    CHECK(out.seq == 0xdead, "%s: output written on failure", what);
}

int main(void) {
    CHECK(sizeof(st_wire_header_t) == 64, "header size");
    CHECK(st_wire_table_bytes(0) == 16 && st_wire_table_bytes(1) == 16 && st_wire_table_bytes(2) == 32,
          "table bytes %zu %zu %zu", st_wire_table_bytes(0), st_wire_table_bytes(1), st_wire_table_bytes(2));
    CHECK(st_wire_table_bytes(3) == 32, "table bytes(3) = %zu", st_wire_table_bytes(3));

    st_wire_info_t in = dispatch_info();
    CHECK(in.payload_bytes == 32 + 80 + 10 * 8 * 4, "payload bytes %llu", (unsigned long long)in.payload_bytes);
    st_wire_header_t h;
    CHECK(st_wire_header_encode(&in, &h) == ST_OK, "encode");
    const uint8_t *hb = (const uint8_t *)&h;
    CHECK(memcmp(hb, "STRW", 4) == 0, "magic bytes on the wire");
    st_wire_info_t out;
    CHECK(st_wire_header_decode(&h, 64, in.payload_bytes, &out) == ST_OK, "decode");
    CHECK(out.kind == in.kind && out.step == in.step && out.layer == in.layer && out.micro_batch == in.micro_batch &&
              out.source_id == in.source_id && out.token_count == in.token_count &&
              out.expert_count == in.expert_count && out.row_width == in.row_width && out.seq == in.seq &&
              out.payload_bytes == in.payload_bytes && out.status == in.status && out.slots == 24 &&
              out.unique == 0 && out.compute_us == 0,
          "round trip equal");
    uint32_t w56;
    memcpy(&w56, hb + 56, 4);
    CHECK(w56 == 24, "slots at byte 56 (%u)", w56);

    /* every field corrupted */
    size_t pl = in.payload_bytes;
    expect_reject(&h, pl, 0, 4, 0x57525454, "magic");
    expect_reject(&h, pl, 4, 2, 1, "version 1 (before distinct-row dispatches)");
    expect_reject(&h, pl, 4, 2, 2, "version 2 (before per-row dispatches)");
    expect_reject(&h, pl, 4, 2, 3, "version 3 (a kernel choice in the flags)");
    expect_reject(&h, pl, 4, 2, 4, "version 4 (one reply row per pair)");
    expect_reject(&h, pl, 4, 2, 5, "version 5 (fp32 rows only, unpadded)");
    expect_reject(&h, pl, 4, 2, 7, "version 7");
    expect_reject(&h, pl, 4, 2, 0, "version 0");
    expect_reject(&h, pl, 6, 2, 0, "kind 0");
    expect_reject(&h, pl, 6, 2, ST_WIRE_KIND_PEER, "kind peer with counts");
    expect_reject(&h, pl, 6, 2, 5, "kind 5");
    expect_reject(&h, pl, 6, 2, ST_WIRE_KIND_ERROR, "kind error with counts");
    expect_reject(&h, pl, 22, 2, 1, "flags");
    expect_reject(&h, pl, 22, 2, ST_WIRE_FLAG_BF16_ROWS, "bf16 flag on fp32 rows");
    expect_reject(&h, pl, 22, 2, ST_WIRE_FLAG_PEER, "peer flag on fp32 rows without sources");
    expect_reject(&h, pl, 22, 2, 8, "unknown flag");
    expect_reject(&h, pl, 28, 4, 11, "token_count vs payload");
    expect_reject(&h, pl, 28, 4, ST_WIRE_MAX_TOKENS + 1, "token_count over limit");
    expect_reject(&h, pl, 32, 4, 4, "expert_count vs payload");
    expect_reject(&h, pl, 32, 4, 0, "tokens without experts");
    expect_reject(&h, pl, 32, 4, ST_WIRE_MAX_EXPERTS + 1, "expert_count over limit");
    expect_reject(&h, pl, 36, 4, 9, "row_width vs payload");
    expect_reject(&h, pl, 36, 4, ST_WIRE_MAX_ROW_WIDTH + 1, "row_width over limit");
    expect_reject(&h, pl, 48, 8, pl + 4, "payload_bytes field");
    expect_reject(&h, pl, 56, 4, 9, "slots below the dispatch's rows");
    expect_reject(&h, pl, 56, 4, 0, "dispatch without slots");
    expect_reject(&h, pl, 60, 4, 1, "aux on a plain dispatch");
    CHECK(st_wire_header_decode(&h, 64, pl - 1, &out) == ST_ERR_PROTOCOL, "short payload");
    CHECK(st_wire_header_decode(&h, 64, pl + 1, &out) == ST_ERR_PROTOCOL, "long payload");
    CHECK(st_wire_header_decode(&h, 63, pl, &out) == ST_ERR_PROTOCOL, "short header");
    CHECK(st_wire_header_decode(&h, 65, pl, &out) == ST_ERR_PROTOCOL, "long header");
    CHECK(st_wire_header_decode(NULL, 64, pl, &out) == ST_ERR_PROTOCOL, "null header");
    /* fields that may hold any value decode unchanged */
    uint8_t b[64];
    memcpy(b, &h, 64);
    b[20] = 7; /* micro_batch */
    CHECK(st_wire_header_decode(b, 64, pl, &out) == ST_OK && out.micro_batch == 7, "micro_batch free");
    uint32_t big = 0xfffffff0u; /* slots: anything from the rows up (an error status there on a reply) */
    memcpy(b + 56, &big, 4);
    CHECK(st_wire_header_decode(b, 64, pl, &out) == ST_OK && out.slots == big && out.status == ST_OK, "slots free");
    memcpy(b + 56, &in.token_count, 4);
    CHECK(st_wire_header_decode(b, 64, pl, &out) == ST_OK && out.slots == 10, "slots == rows");

    /* encode refuses bad info */
    st_wire_info_t bad = in;
    bad.payload_bytes++;
    CHECK(st_wire_header_encode(&bad, &h) == ST_ERR_INVALID_ARG, "encode bad payload_bytes");
    bad = in;
    bad.kind = (st_wire_kind_t)9;
    CHECK(st_wire_header_encode(&bad, &h) == ST_ERR_INVALID_ARG, "encode bad kind");
    bad = in;
    bad.slots = 9;
    CHECK(st_wire_header_encode(&bad, &h) == ST_ERR_INVALID_ARG, "encode slots below rows");
    bad = in;
    bad.kind = ST_WIRE_KIND_COMBINE;
    CHECK(st_wire_header_encode(&bad, &h) == ST_ERR_INVALID_ARG, "encode a reply with a table and slots");
    CHECK(st_wire_dispatch_bytes(ST_WIRE_MAX_TOKENS + 1, 1, 1, 0, false) == 0, "dispatch bytes over limit");
    CHECK(st_wire_combine_bytes(ST_WIRE_MAX_TOKENS + 1, 1) == 0, "combine bytes over limit");

    /* error reply */
    st_wire_info_t er = {.kind = ST_WIRE_KIND_ERROR, .seq = 5, .payload_bytes = 12, .status = ST_ERR_CAPACITY};
    CHECK(st_wire_header_encode(&er, &h) == ST_OK, "encode error reply");
    CHECK(st_wire_header_decode(&h, 64, 12, &out) == ST_OK && out.status == ST_ERR_CAPACITY, "decode error reply");
    expect_reject(&h, 12, 56, 4, 0, "error reply without status");
    expect_reject(&h, 12, 28, 4, 1, "error reply with tokens");
    er.slots = 4;
    CHECK(st_wire_header_encode(&er, &h) == ST_ERR_INVALID_ARG, "encode slots on an error reply");
    er.slots = 0;
    er.payload_bytes = ST_WIRE_MAX_ERROR_TEXT + 1;
    CHECK(st_wire_header_encode(&er, &h) == ST_ERR_INVALID_ARG, "error text too long");

    /* plain dispatch payload: table | output rows, weights | rows; every corruption */
    uint32_t ids[3] = {2, 5, 700}, off[4] = {0, 4, 4, 10};
    uint8_t *payload = aligned_alloc(16, pl);
    st_wire_dispatch_t v, d = {.n_out = 77};
    CHECK(st_wire_dispatch_encode(payload, &in, ids, off, &v) == ST_OK, "dispatch encode");
    CHECK((const uint8_t *)v.orow == payload + 32 && (const uint8_t *)v.wts == payload + 72 &&
              (const uint8_t *)v.rows == payload + 112 && v.src == NULL && !v.bf16,
          "layout: table 32, output rows 40, weights 40, rows");
    for (uint32_t r = 0; r < 10; r++) ((uint32_t *)v.orow)[r] = r / 2, ((float *)v.wts)[r] = 0.25f * (float)r;
    for (int i = 0; i < 80; i++) ((float *)v.rows)[i] = (float)i;
    CHECK(st_wire_dispatch_decode(payload, &in, &d) == ST_OK, "dispatch decode");
    CHECK(d.expert_ids[2] == 700 && d.offsets[3] == 10 && ((const float *)d.rows)[79] == 79.0f && d.wts[9] == 2.25f &&
              d.orow[9] == 4 && d.n_out == 5 && d.src == NULL && !d.bf16,
          "dispatch views, 5 output rows");
    uint32_t *t = (uint32_t *)payload;
    struct { int idx; uint32_t v; const char *what; } cases[] = {
        {1, 2, "ids not ascending (equal)"}, {1, 1, "ids descending"}, {3, 1, "first offset"},
        {5, 3, "offsets decrease"}, {6, 9, "last offset != tokens"}, {7, 1, "table padding nonzero"},
        {8 + 3, 10, "output row = pairs"}, {8 + 3, 0xffffffffu, "output row far out"},
    };
    for (size_t i = 0; i < ST_ARRAY_LEN(cases); i++) {
        uint32_t save = t[cases[i].idx];
        t[cases[i].idx] = cases[i].v;
        d.n_out = 77;
        CHECK(st_wire_dispatch_decode(payload, &in, &d) == ST_ERR_PROTOCOL && d.n_out == 77, "dispatch: %s accepted",
              cases[i].what);
        t[cases[i].idx] = save;
    }
    CHECK(st_wire_dispatch_decode(payload, &in, &d) == ST_OK, "dispatch restored");
    CHECK(st_wire_dispatch_decode(payload + 1, &in, &d) == ST_ERR_PROTOCOL, "misaligned");
    uint32_t bad_off[4] = {0, 5, 4, 10};
    CHECK(st_wire_dispatch_encode(payload, &in, ids, bad_off, &v) == ST_ERR_INVALID_ARG, "encode bad offsets");
    CHECK(st_wire_dispatch_encode(payload, &bad, ids, off, &v) == ST_ERR_INVALID_ARG, "encode a dispatch as a reply");
    st_wire_info_t ei = er;
    ei.payload_bytes = 12;
    CHECK(st_wire_dispatch_decode(payload, &ei, &d) == ST_ERR_PROTOCOL, "dispatch view of an error");
    /* empty dispatch: zero pairs, zero experts, no output rows */
    st_wire_info_t empty = {.kind = ST_WIRE_KIND_DISPATCH, .row_width = 8,
                            .payload_bytes = st_wire_dispatch_bytes(0, 0, 8, 0, false)};
    CHECK(st_wire_header_encode(&empty, &h) == ST_OK && st_wire_header_decode(&h, 64, 16, &out) == ST_OK, "empty");
    CHECK(st_wire_dispatch_encode(payload, &empty, ids, off, &v) == ST_OK && st_wire_dispatch_decode(payload, &empty, &d) == ST_OK &&
              d.n_out == 0,
          "empty dispatch: no output rows");
    free(payload);

    /* the reply: output rows only */
    st_wire_info_t rc = {.kind = ST_WIRE_KIND_COMBINE, .token_count = 5, .row_width = 8, .seq = 99, .compute_us = 31};
    rc.payload_bytes = st_wire_combine_bytes(5, 8);
    CHECK(rc.payload_bytes == 5 * 8 * 4, "combine bytes %llu", (unsigned long long)rc.payload_bytes);
    CHECK(st_wire_header_encode(&rc, &h) == ST_OK, "combine encode");
    CHECK(st_wire_header_decode(&h, 64, rc.payload_bytes, &out) == ST_OK && out.token_count == 5 && out.compute_us == 31 &&
              out.expert_count == 0,
          "combine decode");
    expect_reject(&h, rc.payload_bytes, 32, 4, 1, "a table on a reply");
    expect_reject(&h, rc.payload_bytes, 28, 4, 6, "reply rows vs payload");
    expect_reject(&h, rc.payload_bytes, 56, 4, 4, "slots on a reply");
    expect_reject(&h, rc.payload_bytes, 22, 2, ST_WIRE_FLAG_BF16_ROWS, "the bf16 flag on a reply");
    expect_reject(&h, rc.payload_bytes, 22, 2, 1, "the distinct-rows flag on a reply");
    st_wire_info_t ce = {.kind = ST_WIRE_KIND_COMBINE, .row_width = 8, .payload_bytes = 0};
    CHECK(st_wire_header_encode(&ce, &h) == ST_OK && st_wire_header_decode(&h, 64, 0, &out) == ST_OK, "empty reply");

    /* distinct rows: 10 pairs from 4 distinct rows, sources after the table, then output rows and weights */
    st_wire_info_t un = dispatch_info();
    un.unique = 4;
    un.payload_bytes = st_wire_dispatch_bytes(un.token_count, un.expert_count, un.row_width, un.unique, false);
    CHECK(un.payload_bytes == 32 + 48 + 80 + 4 * 8 * 4, "distinct-row payload bytes %llu", (unsigned long long)un.payload_bytes);
    CHECK(st_wire_dispatch_bytes(10, 3, 8, 0, false) == in.payload_bytes, "no distinct rows = plain rows");
    CHECK(st_wire_dispatch_bytes(10, 3, 8, 11, false) == 0, "more distinct rows than pairs refused");
    CHECK(st_wire_header_encode(&un, &h) == ST_OK, "encode distinct");
    CHECK(((const uint8_t *)&h)[22] == ST_WIRE_FLAG_UNIQUE_ROWS, "flag on the wire");
    CHECK(st_wire_header_decode(&h, 64, un.payload_bytes, &out) == ST_OK && out.unique == 4 && out.compute_us == 0,
          "decode distinct");
    size_t upl = un.payload_bytes;
    expect_reject(&h, upl, 60, 4, 0, "distinct flag without a count");
    expect_reject(&h, upl, 60, 4, 11, "more distinct rows than pairs");
    expect_reject(&h, upl, 60, 4, 5, "distinct count vs payload");
    expect_reject(&h, upl, 22, 2, 4 | ST_WIRE_FLAG_UNIQUE_ROWS, "unknown flag");
    expect_reject(&h, upl, 22, 2, ST_WIRE_FLAG_BF16_ROWS | ST_WIRE_FLAG_UNIQUE_ROWS, "bf16 flag on fp32 distinct rows");
    CHECK(st_wire_header_decode(&h, 64, upl, &out) == ST_OK && out.slots == 24 && out.unique == 4,
          "distinct dispatch keeps its slots");
    uint8_t *up = aligned_alloc(16, upl);
    CHECK(st_wire_dispatch_encode(up, &un, ids, off, &v) == ST_OK, "distinct encode");
    CHECK((const uint8_t *)v.src == up + 32 && (const uint8_t *)v.orow == up + 80 && (const uint8_t *)v.rows == up + 160,
          "layout");
    uint32_t *src = (uint32_t *)v.src;
    for (uint32_t r = 0; r < 10; r++) src[r] = r % 4, ((uint32_t *)v.orow)[r] = r, ((float *)v.wts)[r] = 1.0f;
    for (int i = 0; i < 32; i++) ((float *)v.rows)[i] = (float)i;
    CHECK(st_wire_dispatch_decode(up, &un, &d) == ST_OK && d.src[9] == 1 && ((const float *)d.rows)[31] == 31.0f &&
              d.n_out == 10,
          "distinct decode");
    src[3] = 4;
    CHECK(st_wire_dispatch_decode(up, &un, &d) == ST_ERR_PROTOCOL, "source out of range");
    src[3] = 3;
    src[10] = 1; /* padding after the sources */
    CHECK(st_wire_dispatch_decode(up, &un, &d) == ST_ERR_PROTOCOL, "nonzero source padding");
    src[10] = 0;
    CHECK(st_wire_dispatch_decode(up, &un, &d) == ST_OK, "restored");
    free(up);

    /* bf16 rows: 10 pairs from 3 distinct rows of width 5 (30 bytes of rows, padded to 32), and 10
     * plain rows (100 bytes, padded to 112) */
    st_wire_info_t bf = dispatch_info();
    bf.row_width = 5, bf.unique = 3, bf.bf16_rows = true;
    bf.payload_bytes = st_wire_dispatch_bytes(10, 3, 5, 3, true);
    CHECK(bf.payload_bytes == 32 + 48 + 80 + 32, "bf16 distinct payload bytes %llu", (unsigned long long)bf.payload_bytes);
    CHECK(st_wire_dispatch_bytes(10, 3, 5, 0, true) == 32 + 80 + 112, "bf16 plain payload bytes %zu",
          st_wire_dispatch_bytes(10, 3, 5, 0, true));
    CHECK(st_wire_dispatch_bytes(10, 3, 5, 0, false) == 32 + 80 + 208, "fp32 rows padded too (%zu)",
          st_wire_dispatch_bytes(10, 3, 5, 0, false));
    CHECK(st_wire_header_encode(&bf, &h) == ST_OK, "encode bf16");
    CHECK(((const uint8_t *)&h)[22] == (ST_WIRE_FLAG_UNIQUE_ROWS | ST_WIRE_FLAG_BF16_ROWS), "bf16 flag on the wire");
    CHECK(st_wire_header_decode(&h, 64, bf.payload_bytes, &out) == ST_OK && out.bf16_rows && out.unique == 3,
          "decode bf16");
    expect_reject(&h, bf.payload_bytes, 22, 2, ST_WIRE_FLAG_UNIQUE_ROWS, "bf16 payload without the flag");
    uint8_t *bp = aligned_alloc(16, bf.payload_bytes);
    memset(bp, 0xa5, bf.payload_bytes); /* encode zeroes every padding */
    CHECK(st_wire_dispatch_encode(bp, &bf, ids, off, &v) == ST_OK && v.bf16 && (const uint8_t *)v.rows == bp + 160,
          "bf16 encode: rows after the pairs");
    for (uint32_t r = 0; r < 10; r++) ((uint32_t *)v.src)[r] = r % 3, ((uint32_t *)v.orow)[r] = r, ((float *)v.wts)[r] = 1.0f;
    for (int i = 0; i < 15; i++) ((uint16_t *)v.rows)[i] = st_f32_to_bf16((float)i);
    CHECK(st_wire_dispatch_decode(bp, &bf, &d) == ST_OK && d.bf16 && st_bf16_to_f32(((const uint16_t *)d.rows)[14]) == 14.0f,
          "bf16 decode");
    bp[bf.payload_bytes - 1] = 1;
    CHECK(st_wire_dispatch_decode(bp, &bf, &d) == ST_ERR_PROTOCOL, "nonzero row padding");
    bp[bf.payload_bytes - 1] = 0;
    CHECK(st_wire_dispatch_decode(bp, &bf, &d) == ST_OK, "restored");
    free(bp);

    /* the reply to that dispatch (distinct bf16 rows, slots): a COMBINE of its output rows, and an
     * ERROR, both encodable (a reply once kept the request's bf16 flag: every GPU server's reply
     * failed to encode) */
    bf.slots = 12, bf.seq = 99, bf.micro_batch = 1;
    st_wire_info_t ri = st_wire_reply_info(&bf, ST_OK, 4, 0);
    CHECK(st_wire_header_encode(&ri, &h) == ST_OK, "a COMBINE reply to a bf16 distinct-rows dispatch encodes");
    CHECK(st_wire_header_decode(&h, 64, st_wire_combine_bytes(4, 5), &out) == ST_OK && out.kind == ST_WIRE_KIND_COMBINE &&
              out.token_count == 4 && out.row_width == 5 && out.seq == 99 && out.micro_batch == 1 &&
              out.layer == bf.layer && out.step == bf.step && !out.bf16_rows && !out.unique && !out.slots,
          "it carries the request's identity and output rows, none of its shape");
    ri = st_wire_reply_info(&bf, ST_ERR_NOT_FOUND, 0, 7);
    CHECK(st_wire_header_encode(&ri, &h) == ST_OK, "an ERROR reply to it encodes");
    CHECK(st_wire_header_decode(&h, 64, 7, &out) == ST_OK && out.kind == ST_WIRE_KIND_ERROR &&
              out.status == ST_ERR_NOT_FOUND && out.seq == 99,
          "the ERROR reply decodes with its status");

    /* through the worker's device memory: 5 pairs of 2 experts reading rows up to 40 of the worker's */
    st_wire_info_t pi = {.kind = ST_WIRE_KIND_DISPATCH, .token_count = 5, .expert_count = 2, .row_width = 8,
                         .seq = 7, .slots = 80, .unique = 41, .bf16_rows = true, .peer = true, .reply_row = 9};
    pi.payload_bytes = st_wire_dispatch_peer_bytes(5, 2, 41);
    CHECK(pi.payload_bytes == 32 + 32 + 48 + 16, "peer dispatch bytes %llu", (unsigned long long)pi.payload_bytes);
    uint8_t pp[128] __attribute__((aligned(16)));
    uint32_t pid[2] = {3, 6}, poff[3] = {0, 2, 5};
    st_wire_dispatch_t pv, pd;
    CHECK(st_wire_dispatch_encode(pp, &pi, pid, poff, &pv) == ST_OK && pv.peer && !pv.rows, "peer encode");
    for (int r = 0; r < 5; r++) ((uint32_t *)pv.src)[r] = (uint32_t)(8 * r), ((uint32_t *)pv.orow)[r] = (uint32_t)r % 3;
    st_wire_header_t ph;
    st_wire_info_t po;
    CHECK(st_wire_header_encode(&pi, &ph) == ST_OK && st_wire_header_decode(&ph, 64, pi.payload_bytes, &po) == ST_OK &&
              po.peer && po.unique == 41 && po.bf16_rows,
          "peer header round trip");
    CHECK(st_wire_dispatch_decode(pp, &po, &pd) == ST_OK && pd.peer && pd.reply_row == 9 && !pd.rows && pd.n_out == 3,
          "peer dispatch decodes: reply row %u, %u output rows", pd.reply_row, pd.n_out);
    ((uint32_t *)pv.src)[4] = 41;
    CHECK(st_wire_dispatch_decode(pp, &po, &pd) == ST_ERR_PROTOCOL, "a source past the rows it spans is refused");
    ((uint32_t *)pv.src)[4] = 32;
    pp[pi.payload_bytes - 1] = 1;
    CHECK(st_wire_dispatch_decode(pp, &po, &pd) == ST_ERR_PROTOCOL, "nonzero padding after the reply row is refused");
    pp[pi.payload_bytes - 1] = 0;
    expect_reject(&ph, pi.payload_bytes, 22, 2, ST_WIRE_FLAG_UNIQUE_ROWS | ST_WIRE_FLAG_PEER, "peer rows not bf16");
    expect_reject(&ph, pi.payload_bytes + 16, 48, 8, pi.payload_bytes + 16, "peer dispatch with rows' bytes");
    st_wire_info_t pr = st_wire_reply_info(&po, ST_OK, 3, 0);
    CHECK(pr.peer && pr.payload_bytes == 0 && pr.token_count == 3, "the reply to a peer dispatch carries no rows");
    CHECK(st_wire_header_encode(&pr, &ph) == ST_OK && st_wire_header_decode(&ph, 64, 0, &po) == ST_OK && po.peer &&
              po.kind == ST_WIRE_KIND_COMBINE && po.token_count == 3,
          "peer reply round trip");
    expect_reject(&ph, 0, 22, 2, 0, "a reply of 3 rows without rows or the peer flag");
    /* PEER: the memory of one channel slot */
    st_wire_info_t mi = st_wire_peer_info(5);
    CHECK(st_wire_header_encode(&mi, &ph) == ST_OK && st_wire_header_decode(&ph, 64, 96, &po) == ST_OK &&
              po.kind == ST_WIRE_KIND_PEER && po.seq == 5,
          "peer memory header round trip");
    expect_reject(&ph, 96, 28, 4, 1, "peer memory with a token count");
    expect_reject(&ph, 95, 48, 8, 95, "peer memory of 95 bytes");
    st_wire_peer_t wp = {.in_off = 256, .reply_off = 4096, .in_rows = 64, .reply_rows = 512, .row_width = 8}, wq;
    CHECK(st_wire_peer_check(&wp, sizeof wp, &wq) == ST_OK && wq.reply_rows == 512, "peer memory checks");
    CHECK(st_wire_peer_check(&wp, sizeof wp - 1, &wq) == ST_ERR_PROTOCOL, "short peer memory refused");
    wp.in_off = 250;
    CHECK(st_wire_peer_check(&wp, sizeof wp, &wq) == ST_ERR_PROTOCOL, "an unaligned region refused");
    wp.in_off = 256, wp.zero = 1;
    CHECK(st_wire_peer_check(&wp, sizeof wp, &wq) == ST_ERR_PROTOCOL, "nonzero reserved bytes refused");
    wp.zero = 0, wp.in_rows = 0;
    CHECK(st_wire_peer_check(&wp, sizeof wp, &wq) == ST_ERR_PROTOCOL, "an empty input region refused");
    return st_test_done();
}
