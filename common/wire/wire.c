/* Encode and validate the data-plane header and offsets table (byte map in strata/wire.h). Every
 * field of an arriving header is checked before anyone indexes with it. */
#include "strata/wire.h"

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "strata wire format is little-endian; add byte swaps for this host"
#endif

_Static_assert(sizeof(st_wire_header_t) == ST_WIRE_HEADER_BYTES, "wire header must be 64 bytes");
_Static_assert(offsetof(st_wire_header_t, step) == 8, "byte map: step");
_Static_assert(offsetof(st_wire_header_t, layer) == 16, "byte map: layer");
_Static_assert(offsetof(st_wire_header_t, micro_batch) == 20, "byte map: micro_batch");
_Static_assert(offsetof(st_wire_header_t, source_id) == 24, "byte map: source_id");
_Static_assert(offsetof(st_wire_header_t, token_count) == 28, "byte map: token_count");
_Static_assert(offsetof(st_wire_header_t, expert_count) == 32, "byte map: expert_count");
_Static_assert(offsetof(st_wire_header_t, row_width) == 36, "byte map: row_width");
_Static_assert(offsetof(st_wire_header_t, seq) == 40, "byte map: seq");
_Static_assert(offsetof(st_wire_header_t, payload_bytes) == 48, "byte map: payload_bytes");
_Static_assert(offsetof(st_wire_header_t, status) == 56 && offsetof(st_wire_header_t, slots) == 56, "byte map: status/slots");
_Static_assert(offsetof(st_wire_header_t, aux) == 60, "byte map: aux");

size_t st_wire_table_bytes(uint32_t expert_count) {
    size_t b = ((size_t)expert_count * 2 + 1) * sizeof(uint32_t);
    return (b + ST_WIRE_ALIGN - 1) / ST_WIRE_ALIGN * ST_WIRE_ALIGN;
}

static int shape_ok(uint32_t tokens, uint32_t experts, uint32_t width) {
    return tokens <= ST_WIRE_MAX_TOKENS && experts <= ST_WIRE_MAX_EXPERTS && width <= ST_WIRE_MAX_ROW_WIDTH;
}

static size_t pad16(size_t b) { return (b + ST_WIRE_ALIGN - 1) / ST_WIRE_ALIGN * ST_WIRE_ALIGN; }
static size_t src_bytes(uint32_t tokens) { return pad16((size_t)tokens * sizeof(uint32_t)); }
/* output rows and weights of the pairs, padded together */
static size_t pair_bytes(uint32_t tokens) { return pad16((size_t)tokens * 2 * sizeof(uint32_t)); }

/* the input rows (distinct ones, or one per pair) without their padding */
static size_t rows_used(uint32_t tokens, uint32_t unique, uint32_t width, bool bf16) {
    return (size_t)(unique ? unique : tokens) * width * (bf16 ? sizeof(uint16_t) : sizeof(float));
}
#define PEER_BLOCK 16u /* a peer dispatch's reply_row and its padding, instead of the rows */
/* NOTE: the bounds keep tokens * width * 4 below 2^40, so no overflow on 64-bit size_t. */
static size_t dispatch_of(uint32_t tokens, uint32_t experts, uint32_t width, uint32_t unique, bool bf16) {
    size_t b = st_wire_table_bytes(experts) + pair_bytes(tokens) + pad16(rows_used(tokens, unique, width, bf16));
    return unique ? b + src_bytes(tokens) : b;
}
static size_t peer_of(uint32_t tokens, uint32_t experts) {
    return st_wire_table_bytes(experts) + src_bytes(tokens) + pair_bytes(tokens) + PEER_BLOCK;
}
static size_t info_dispatch_of(const st_wire_info_t *in) {
    return in->peer ? peer_of(in->token_count, in->expert_count)
                    : dispatch_of(in->token_count, in->expert_count, in->row_width, in->unique, in->bf16_rows);
}
static size_t combine_of(uint32_t rows, uint32_t width) { return (size_t)rows * width * sizeof(float); }

size_t st_wire_dispatch_bytes(uint32_t token_count, uint32_t expert_count, uint32_t row_width, uint32_t unique,
                              bool bf16_rows) {
    if (!shape_ok(token_count, expert_count, row_width) || unique > token_count) {
        ST_FAIL(ST_ERR_INVALID_ARG, "wire: shape %u tokens (%u distinct) x %u experts x %u width exceeds limits",
                token_count, unique, expert_count, row_width);
        return 0;
    }
    return dispatch_of(token_count, expert_count, row_width, unique, bf16_rows);
}

size_t st_wire_dispatch_peer_bytes(uint32_t token_count, uint32_t expert_count, uint32_t unique) {
    if (!shape_ok(token_count, expert_count, 0) || unique > ST_WIRE_MAX_TOKENS) {
        ST_FAIL(ST_ERR_INVALID_ARG, "wire: peer shape %u tokens (%u rows) x %u experts exceeds limits", token_count,
                unique, expert_count);
        return 0;
    }
    return peer_of(token_count, expert_count);
}

size_t st_wire_combine_bytes(uint32_t rows, uint32_t row_width) {
    if (!shape_ok(rows, 0, row_width)) {
        ST_FAIL(ST_ERR_INVALID_ARG, "wire: reply of %u rows x %u width exceeds limits", rows, row_width);
        return 0;
    }
    return combine_of(rows, row_width);
}

/* Shared checks of encode and decode; returns a static reason or NULL. */
static const char *info_problem(const st_wire_info_t *in) {
    switch (in->kind) {
    case ST_WIRE_KIND_DISPATCH:
        if (!shape_ok(in->token_count, in->expert_count, in->row_width)) return "counts exceed limits";
        if (in->token_count > 0 && in->expert_count == 0) return "tokens without experts";
        if (in->row_width == 0 && in->token_count > 0) return "zero row width";
        if (in->peer && (!in->unique || !in->bf16_rows)) return "peer rows without sources or not bf16";
        if (in->peer ? in->unique > ST_WIRE_MAX_TOKENS : in->unique > in->token_count)
            return "more distinct rows than pairs";
        if (in->payload_bytes != info_dispatch_of(in)) return "payload_bytes disagrees with counts";
        if (in->status != ST_OK) return "status set on a data message";
        if (in->slots < in->token_count) return "slots below the pairs of a dispatch";
        return NULL;
    case ST_WIRE_KIND_COMBINE:
        if (!shape_ok(in->token_count, 0, in->row_width)) return "counts exceed limits";
        if (in->expert_count || in->unique || in->slots || in->bf16_rows)
            return "expert table, distinct rows, bf16 rows or slots on a reply";
        if (in->row_width == 0 && in->token_count > 0) return "zero row width";
        if (in->payload_bytes != (in->peer ? 0 : combine_of(in->token_count, in->row_width)))
            return "payload_bytes disagrees with counts";
        if (in->status != ST_OK) return "status set on a data message";
        return NULL;
    case ST_WIRE_KIND_PEER:
        if (in->token_count || in->expert_count || in->row_width || in->unique || in->slots || in->bf16_rows ||
            in->peer)
            return "peer memory with counts";
        if (in->payload_bytes != sizeof(st_wire_peer_t)) return "peer memory of another size";
        if (in->status != ST_OK) return "status set on a peer message";
        return NULL;
    case ST_WIRE_KIND_ERROR:
        if (in->token_count || in->expert_count || in->row_width || in->unique || in->slots || in->bf16_rows)
            return "error reply with counts";
        if (in->payload_bytes > ST_WIRE_MAX_ERROR_TEXT) return "error text too long";
        if (in->status >= 0) return "error reply without a negative status";
        return NULL;
    }
    return "unknown kind";
}

st_wire_info_t st_wire_reply_info(const st_wire_info_t *req, st_status_t status, uint32_t rows, size_t text_len) {
    st_wire_info_t r = {.step = req->step, .layer = req->layer, .micro_batch = req->micro_batch,
                        .source_id = req->source_id, .seq = req->seq, .status = status};
    if (status == ST_OK) {
        r.kind = ST_WIRE_KIND_COMBINE;
        r.token_count = rows;
        r.row_width = req->row_width;
        r.peer = req->kind == ST_WIRE_KIND_DISPATCH && req->peer;
        r.payload_bytes = r.peer ? 0 : st_wire_combine_bytes(rows, req->row_width);
    } else {
        r.kind = ST_WIRE_KIND_ERROR;
        r.payload_bytes = text_len;
    }
    return r;
}

st_wire_info_t st_wire_peer_info(uint64_t seq) {
    return (st_wire_info_t){.kind = ST_WIRE_KIND_PEER, .seq = seq, .payload_bytes = sizeof(st_wire_peer_t)};
}

_Static_assert(sizeof(st_wire_peer_t) == 96 && offsetof(st_wire_peer_t, in_off) == 64 &&
                   offsetof(st_wire_peer_t, in_rows) == 80 && offsetof(st_wire_peer_t, zero) == 92,
               "byte map: peer");
st_status_t st_wire_peer_check(const void *payload, size_t len, st_wire_peer_t *out) {
    st_wire_peer_t p;
    if (len != sizeof p) return ST_FAIL(ST_ERR_PROTOCOL, "wire: peer memory of %zu bytes", len);
    memcpy(&p, payload, sizeof p);
    if (p.zero || !p.in_rows || !p.reply_rows || !p.row_width || p.in_rows > ST_WIRE_MAX_TOKENS ||
        p.reply_rows > ST_WIRE_MAX_TOKENS * 64u || p.row_width > ST_WIRE_MAX_ROW_WIDTH || p.in_off % 16 ||
        p.reply_off % 16)
        return ST_FAIL(ST_ERR_PROTOCOL, "wire: peer memory of %u input and %u reply rows of width %u is malformed",
                       p.in_rows, p.reply_rows, p.row_width);
    *out = p;
    return ST_OK;
}

st_status_t st_wire_header_encode(const st_wire_info_t *info, st_wire_header_t *out) {
    const char *why = info_problem(info);
    if (why)
        return ST_FAIL(ST_ERR_INVALID_ARG, "wire: encode kind %d seq %llu: %s", (int)info->kind,
                       (unsigned long long)info->seq, why);
    st_wire_header_t h = {
        .magic = ST_WIRE_MAGIC,
        .version = ST_WIRE_VERSION,
        .kind = (uint16_t)info->kind,
        .step = info->step,
        .layer = info->layer,
        .micro_batch = info->micro_batch,
        .flags = (uint16_t)((info->unique ? ST_WIRE_FLAG_UNIQUE_ROWS : 0) |
                            (info->bf16_rows ? ST_WIRE_FLAG_BF16_ROWS : 0) | (info->peer ? ST_WIRE_FLAG_PEER : 0)),
        .source_id = info->source_id,
        .token_count = info->token_count,
        .expert_count = info->expert_count,
        .row_width = info->row_width,
        .seq = info->seq,
        .payload_bytes = info->payload_bytes,
        .aux = info->kind == ST_WIRE_KIND_COMBINE ? info->compute_us : info->unique,
    };
    if (info->kind == ST_WIRE_KIND_DISPATCH) h.slots = info->slots;
    else h.status = (int32_t)info->status;
    *out = h;
    return ST_OK;
}

st_status_t st_wire_header_decode(const void *hdr, size_t hdr_len, size_t payload_len, st_wire_info_t *out) {
    if (!hdr || hdr_len != ST_WIRE_HEADER_BYTES)
        return ST_FAIL(ST_ERR_PROTOCOL, "wire: header of %zu bytes, expected %u", hdr_len, ST_WIRE_HEADER_BYTES);
    st_wire_header_t h;
    memcpy(&h, hdr, sizeof h); /* NOTE: the AM header may be unaligned */
    if (h.magic != ST_WIRE_MAGIC) return ST_FAIL(ST_ERR_PROTOCOL, "wire: bad magic 0x%08x", h.magic);
    if (h.version != ST_WIRE_VERSION)
        return ST_FAIL(ST_ERR_PROTOCOL, "wire: version %u, this build speaks %u", h.version, ST_WIRE_VERSION);
    bool disp = h.kind == ST_WIRE_KIND_DISPATCH;
    bool uniq = disp && (h.flags & ST_WIRE_FLAG_UNIQUE_ROWS);
    uint16_t known = disp ? (uint16_t)(ST_WIRE_FLAG_UNIQUE_ROWS | ST_WIRE_FLAG_BF16_ROWS | ST_WIRE_FLAG_PEER)
                     : h.kind == ST_WIRE_KIND_COMBINE ? (uint16_t)ST_WIRE_FLAG_PEER
                                                      : 0;
    if ((h.flags & ~known) || (uniq && h.aux == 0) || (h.aux != 0 && !uniq && h.kind != ST_WIRE_KIND_COMBINE))
        return ST_FAIL(ST_ERR_PROTOCOL, "wire: reserved fields set (flags 0x%x, aux %u on kind %u)", h.flags, h.aux,
                       h.kind);
    if (h.payload_bytes != payload_len)
        return ST_FAIL(ST_ERR_PROTOCOL, "wire: seq %llu says %llu payload bytes, %zu arrived",
                       (unsigned long long)h.seq, (unsigned long long)h.payload_bytes, payload_len);
    st_wire_info_t in = {
        .kind = (st_wire_kind_t)h.kind,
        .step = h.step,
        .layer = h.layer,
        .micro_batch = h.micro_batch,
        .source_id = h.source_id,
        .token_count = h.token_count,
        .expert_count = h.expert_count,
        .row_width = h.row_width,
        .seq = h.seq,
        .payload_bytes = h.payload_bytes,
        .status = disp ? ST_OK : (st_status_t)h.status,
        .compute_us = h.kind == ST_WIRE_KIND_COMBINE ? h.aux : 0,
        .unique = uniq ? h.aux : 0,
        .slots = disp ? h.slots : 0,
        .bf16_rows = disp && (h.flags & ST_WIRE_FLAG_BF16_ROWS),
        .peer = (h.flags & ST_WIRE_FLAG_PEER) != 0,
    };
    const char *why = info_problem(&in);
    if (why)
        return ST_FAIL(ST_ERR_PROTOCOL, "wire: kind %u seq %llu from %u: %s (tokens %u experts %u width %u bytes %llu)",
                       h.kind, (unsigned long long)h.seq, h.source_id, why, h.token_count, h.expert_count,
                       h.row_width, (unsigned long long)h.payload_bytes);
    *out = in;
    return ST_OK;
}

static const char *table_problem(uint32_t n, const uint32_t *ids, const uint32_t *off, uint32_t tokens) {
    if (n > ST_WIRE_MAX_EXPERTS) return "too many experts";
    for (uint32_t i = 1; i < n; i++)
        if (ids[i] <= ids[i - 1]) return "expert ids not strictly ascending";
    if (off[0] != 0) return "first offset not 0";
    for (uint32_t i = 0; i < n; i++)
        if (off[i + 1] < off[i]) return "offsets decrease";
    if (off[n] != tokens) return "last offset is not the token count";
    return NULL;
}

st_status_t st_wire_dispatch_encode(void *payload, const st_wire_info_t *info, const uint32_t *expert_ids,
                                    const uint32_t *offsets, st_wire_dispatch_t *out) {
    uint32_t expert_count = info->expert_count, token_count = info->token_count, unique = info->unique;
    const char *why = info->kind != ST_WIRE_KIND_DISPATCH ? "not a dispatch" : info_problem(info);
    if (!why) why = table_problem(expert_count, expert_ids, offsets, token_count);
    if (why) return ST_FAIL(ST_ERR_INVALID_ARG, "wire: dispatch of %u experts: %s", expert_count, why);
    uint8_t *p = payload;
    size_t tb = st_wire_table_bytes(expert_count);
    memcpy(p, expert_ids, (size_t)expert_count * 4);
    memcpy(p + (size_t)expert_count * 4, offsets, ((size_t)expert_count + 1) * 4);
    size_t used = ((size_t)expert_count * 2 + 1) * 4;
    memset(p + used, 0, tb - used);
    p += tb;
    st_wire_dispatch_t v = {.expert_ids = payload, .offsets = (const uint32_t *)payload + expert_count};
    if (unique) {
        memset(p + (size_t)token_count * 4, 0, src_bytes(token_count) - (size_t)token_count * 4);
        v.src = (const uint32_t *)p;
        p += src_bytes(token_count);
    }
    memset(p + (size_t)token_count * 8, 0, pair_bytes(token_count) - (size_t)token_count * 8);
    v.orow = (const uint32_t *)p;
    v.wts = (const float *)(p + (size_t)token_count * 4);
    p += pair_bytes(token_count);
    v.bf16 = info->bf16_rows;
    if (info->peer) {
        memset(p, 0, PEER_BLOCK);
        memcpy(p, &info->reply_row, sizeof info->reply_row);
        v.peer = true, v.reply_row = info->reply_row;
        *out = v;
        return ST_OK;
    }
    used = rows_used(token_count, unique, info->row_width, info->bf16_rows);
    memset(p + used, 0, pad16(used) - used);
    v.rows = p;
    *out = v;
    return ST_OK;
}

static int zeros(const uint8_t *p, size_t from, size_t to) {
    for (size_t i = from; i < to; i++)
        if (p[i]) return 0;
    return 1;
}

st_status_t st_wire_dispatch_decode(const void *payload, const st_wire_info_t *info, st_wire_dispatch_t *out) {
    unsigned long long seq = (unsigned long long)info->seq;
    if (info->kind != ST_WIRE_KIND_DISPATCH)
        return ST_FAIL(ST_ERR_PROTOCOL, "wire: seq %llu: kind %d is not a dispatch", seq, (int)info->kind);
    if ((uintptr_t)payload % 4 != 0) return ST_FAIL(ST_ERR_PROTOCOL, "wire: seq %llu: payload not 4-byte aligned", seq);
    uint32_t n = info->token_count;
    if (info->payload_bytes != info_dispatch_of(info))
        return ST_FAIL(ST_ERR_PROTOCOL, "wire: seq %llu: payload of %llu bytes does not fit its counts", seq,
                       (unsigned long long)info->payload_bytes);
    const uint32_t *ids = payload;
    const uint32_t *off = ids + info->expert_count;
    const char *why = table_problem(info->expert_count, ids, off, n);
    if (why)
        return ST_FAIL(ST_ERR_PROTOCOL, "wire: seq %llu from %u: table of %u experts: %s", seq, info->source_id,
                       info->expert_count, why);
    const uint8_t *p = payload;
    if (!zeros(p, ((size_t)info->expert_count * 2 + 1) * 4, st_wire_table_bytes(info->expert_count)))
        return ST_FAIL(ST_ERR_PROTOCOL, "wire: seq %llu: nonzero table padding", seq);
    p += st_wire_table_bytes(info->expert_count);
    st_wire_dispatch_t v = {.expert_ids = ids, .offsets = off};
    if (info->unique) {
        const uint32_t *sr = (const uint32_t *)p;
        for (uint32_t r = 0; r < n; r++)
            if (sr[r] >= info->unique)
                return ST_FAIL(ST_ERR_PROTOCOL, "wire: seq %llu from %u: pair %u names distinct row %u of %u", seq,
                               info->source_id, r, sr[r], info->unique);
        if (!zeros(p, (size_t)n * 4, src_bytes(n))) return ST_FAIL(ST_ERR_PROTOCOL, "wire: seq %llu: nonzero padding", seq);
        v.src = sr;
        p += src_bytes(n);
    }
    const uint32_t *orow = (const uint32_t *)p;
    for (uint32_t r = 0; r < n; r++) {
        if (orow[r] >= n)
            return ST_FAIL(ST_ERR_PROTOCOL, "wire: seq %llu from %u: pair %u names output row %u of at most %u", seq,
                           info->source_id, r, orow[r], n);
        if (orow[r] + 1 > v.n_out) v.n_out = orow[r] + 1;
    }
    if (!zeros(p, (size_t)n * 8, pair_bytes(n))) return ST_FAIL(ST_ERR_PROTOCOL, "wire: seq %llu: nonzero padding", seq);
    v.orow = orow;
    v.wts = (const float *)(p + (size_t)n * 4);
    p += pair_bytes(n);
    v.bf16 = info->bf16_rows;
    if (info->peer) {
        if (!zeros(p, sizeof v.reply_row, PEER_BLOCK))
            return ST_FAIL(ST_ERR_PROTOCOL, "wire: seq %llu: nonzero padding", seq);
        memcpy(&v.reply_row, p, sizeof v.reply_row);
        v.peer = true;
        *out = v;
        return ST_OK;
    }
    size_t used = rows_used(n, info->unique, info->row_width, info->bf16_rows);
    if (!zeros(p, used, info->payload_bytes - (size_t)(p - (const uint8_t *)payload)))
        return ST_FAIL(ST_ERR_PROTOCOL, "wire: seq %llu: nonzero padding", seq);
    v.rows = p;
    *out = v;
    return ST_OK;
}
