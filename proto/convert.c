/* Conversion between generated protobuf-c messages (strata.pb-c.h) and the plain structs of
 * <strata/proto.h>. The only file that includes generated types. Decode validates array shapes so
 * callers can index without re-checking; it does not judge values (ids, versions). */
#include "strata/proto.h"

#include <stdlib.h>
#include <string.h>

#include "strata.pb-c.h"

const char *const st_proto_stage_names[ST_PROTO_STAGES] = {"attention", "dispatch", "wait",   "expert",
                                                           "combine",   "thresholds", "network", "launch",
                                                           "plan",      "unpack",   "other"};

/* ---- helpers ---- */

/* A singular proto3 float or double equal to zero is not encoded, so −0 travels as +0: decoded, such a
 * field is the value a round trip keeps (found by fuzz_proto: a temperature of −0). */
static double zero_canon(double v) { return v == 0 ? 0 : v; }

static st_status_t pack_msg(const ProtobufCMessage *m, const char *what, uint8_t **out, size_t *len) {
    size_t n = protobuf_c_message_get_packed_size(m);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf) return ST_FAIL(ST_ERR_NO_MEMORY, "proto: %s: cannot allocate %zu bytes", what, n);
    size_t w = protobuf_c_message_pack(m, buf);
    if (w != n) {
        free(buf);
        return ST_FAIL(ST_ERR_INTERNAL, "proto: %s: packed %zu of %zu bytes", what, w, n);
    }
    *out = buf;
    *len = n;
    return ST_OK;
}

/* Pack into a caller's buffer (the per-token and per-step messages: no allocation). */
static st_status_t pack_into(const ProtobufCMessage *m, const char *what, uint8_t *buf, size_t cap, size_t *len) {
    size_t n = protobuf_c_message_get_packed_size(m);
    if (n > cap) return ST_FAIL(ST_ERR_CAPACITY, "proto: %s of %zu bytes exceeds the %zu-byte buffer", what, n, cap);
    size_t w = protobuf_c_message_pack(m, buf);
    if (w != n) return ST_FAIL(ST_ERR_INTERNAL, "proto: %s: packed %zu of %zu bytes", what, w, n);
    *len = n;
    return ST_OK;
}

static ProtobufCMessage *unpack_msg(const ProtobufCMessageDescriptor *d, const uint8_t *buf, size_t len) {
    ProtobufCMessage *m = protobuf_c_message_unpack(d, NULL, len, buf);
    if (!m) ST_REJECT(ST_ERR_PROTOCOL, "proto: malformed %s (%zu bytes)", d->name, len);
    return m;
}

static char *str_in(const char *s) { return (char *)(s ? s : ""); } /* protobuf-c wants char* */

/* Copy n elements of size sz; *dst = NULL when n == 0. Returns 0 on OOM. */
static int dup_arr(void **dst, const void *src, size_t n, size_t sz) {
    *dst = NULL;
    if (n == 0) return 1;
    *dst = malloc(n * sz);
    if (!*dst) return 0;
    memcpy(*dst, src, n * sz);
    return 1;
}

static int dup_str(char **dst, const char *src) {
    size_t n = strlen(src ? src : "") + 1;
    *dst = malloc(n);
    if (!*dst) return 0;
    memcpy(*dst, src ? src : "", n);
    return 1;
}

static int dup_bytes(uint8_t **dst, size_t *dlen, const ProtobufCBinaryData *b) {
    *dlen = 0;
    if (!dup_arr((void **)dst, b->data, b->len, 1)) return 0;
    *dlen = b->len;
    return 1;
}

/* A member token from the wire into a fixed buffer; 0 when it is too long. */
static int tok_copy(char dst[ST_PROTO_TOKEN_MAX + 1], const char *src) {
    size_t n = strlen(src ? src : "");
    if (n > ST_PROTO_TOKEN_MAX) return 0;
    if (n) memcpy(dst, src, n);
    dst[n] = 0;
    return 1;
}

/* n_layers * n_experts within bounds; *cells set on success. */
static int cells_ok(uint32_t n_layers, uint32_t n_experts, size_t *cells) {
    if (n_layers > ST_PROTO_MAX_LAYERS || n_experts > ST_PROTO_MAX_EXPERTS) return 0;
    uint64_t c = (uint64_t)n_layers * n_experts;
    if (c > ST_PROTO_MAX_CELLS) return 0;
    *cells = (size_t)c;
    return 1;
}

/* offsets[0] = 0, non-decreasing, last == total. */
static int offsets_ok(const uint32_t *off, size_t n_off, size_t total) {
    if (n_off == 0 || off[0] != 0) return 0;
    for (size_t i = 1; i < n_off; i++)
        if (off[i] < off[i - 1]) return 0;
    return off[n_off - 1] == total;
}

#define NOMEM(what) ST_FAIL(ST_ERR_NO_MEMORY, "proto: %s: out of memory decoding", what)

/* ---- members (shared by placement and status) ---- */

static void member_to_pb(const st_proto_member_t *s, Strata__V1__MemberInfo *d) {
    strata__v1__member_info__init(d);
    d->member_id = s->member_id;
    d->role = (Strata__V1__Role)s->role;
    d->name = str_in(s->name);
    d->data_endpoint = str_in(s->data_endpoint);
    d->ucx_address.data = s->ucx_address;
    d->ucx_address.len = s->ucx_address_len;
    d->capacity = s->capacity;
    d->alive = s->alive != 0;
}

static int member_from_pb(const Strata__V1__MemberInfo *s, st_proto_member_t *d) {
    memset(d, 0, sizeof *d);
    d->member_id = s->member_id;
    d->role = (st_proto_role_t)s->role;
    d->capacity = s->capacity;
    d->alive = s->alive != 0;
    return dup_str(&d->name, s->name) && dup_str(&d->data_endpoint, s->data_endpoint) &&
           dup_bytes(&d->ucx_address, &d->ucx_address_len, &s->ucx_address);
}

static void members_free(st_proto_member_t *m, size_t n) {
    for (size_t i = 0; m && i < n; i++) {
        free(m[i].name);
        free(m[i].data_endpoint);
        free(m[i].ucx_address);
    }
    free(m);
}

/* Builds an array of n MemberInfo (plus pointer array) for packing; free both after. */
static st_status_t members_pb(const st_proto_member_t *src, size_t n, Strata__V1__MemberInfo **store,
                              Strata__V1__MemberInfo ***ptrs) {
    *store = NULL;
    *ptrs = NULL;
    if (n == 0) return ST_OK;
    *store = calloc(n, sizeof **store);
    *ptrs = calloc(n, sizeof **ptrs);
    if (!*store || !*ptrs) {
        free(*store);
        free(*ptrs);
        return ST_FAIL(ST_ERR_NO_MEMORY, "proto: cannot allocate %zu members", n);
    }
    for (size_t i = 0; i < n; i++) {
        member_to_pb(&src[i], &(*store)[i]);
        (*ptrs)[i] = &(*store)[i];
    }
    return ST_OK;
}

/* Pack a message whose repeated MemberInfo field (*n_field, *field) is filled from src for the call. */
static st_status_t pack_with_members(ProtobufCMessage *pb, size_t *n_field, Strata__V1__MemberInfo ***field,
                                     const st_proto_member_t *src, size_t n, const char *what, uint8_t **out,
                                     size_t *len) {
    Strata__V1__MemberInfo *store, **ptrs;
    st_status_t st = members_pb(src, n, &store, &ptrs);
    if (st) return st;
    *n_field = n;
    *field = ptrs;
    st = pack_msg(pb, what, out, len);
    free(store);
    free(ptrs);
    return st;
}

static st_status_t members_from_pb(Strata__V1__MemberInfo **src, size_t n, st_proto_member_t **out) {
    *out = NULL;
    if (n == 0) return ST_OK;
    st_proto_member_t *m = calloc(n, sizeof *m);
    if (!m) return NOMEM("members");
    for (size_t i = 0; i < n; i++) {
        if (!member_from_pb(src[i], &m[i])) {
            members_free(m, i + 1);
            return NOMEM("members");
        }
    }
    *out = m;
    return ST_OK;
}

/* ---- RegisterMemberRequest ---- */

st_status_t st_proto_register_req_encode(const st_proto_register_req_t *m, uint8_t **out, size_t *len) {
    Strata__V1__RegisterMemberRequest pb;
    strata__v1__register_member_request__init(&pb);
    pb.role = (Strata__V1__Role)m->role;
    pb.name = str_in(m->name);
    pb.data_endpoint = str_in(m->data_endpoint);
    pb.ucx_address.data = m->ucx_address;
    pb.ucx_address.len = m->ucx_address_len;
    pb.capacity = m->capacity;
    Strata__V1__LayerExperts *le = NULL, **lp = NULL;
    if (m->n_layers) {
        le = calloc(m->n_layers, sizeof *le);
        lp = calloc(m->n_layers, sizeof *lp);
        if (!le || !lp) {
            free(le);
            free(lp);
            return ST_FAIL(ST_ERR_NO_MEMORY, "proto: register: cannot allocate %zu layers", m->n_layers);
        }
        for (size_t i = 0; i < m->n_layers; i++) {
            strata__v1__layer_experts__init(&le[i]);
            le[i].layer = m->layers[i].layer;
            le[i].n_experts = m->layers[i].n_experts;
            le[i].experts = m->layers[i].experts;
            lp[i] = &le[i];
        }
    }
    pb.n_experts = m->n_layers;
    pb.experts = lp;
    st_status_t st = pack_msg(&pb.base, "RegisterMemberRequest", out, len);
    free(le);
    free(lp);
    return st;
}

void st_proto_register_req_cleanup(st_proto_register_req_t *m) {
    free(m->name);
    free(m->data_endpoint);
    free(m->ucx_address);
    for (size_t i = 0; m->layers && i < m->n_layers; i++) free(m->layers[i].experts);
    free(m->layers);
    memset(m, 0, sizeof *m);
}

st_status_t st_proto_register_req_decode(const uint8_t *buf, size_t len, st_proto_register_req_t *out) {
    Strata__V1__RegisterMemberRequest *pb =
        (void *)unpack_msg(&strata__v1__register_member_request__descriptor, buf, len);
    if (!pb) return ST_ERR_PROTOCOL;
    st_status_t st = ST_OK;
    st_proto_register_req_t r = {0};
    if (pb->n_experts > ST_PROTO_MAX_LAYERS) {
        st = ST_REJECT(ST_ERR_PROTOCOL, "proto: register: %zu layers > %u", pb->n_experts, ST_PROTO_MAX_LAYERS);
        goto err_unpacked;
    }
    r.role = (st_proto_role_t)pb->role;
    r.capacity = pb->capacity;
    if (!dup_str(&r.name, pb->name) || !dup_str(&r.data_endpoint, pb->data_endpoint) ||
        !dup_bytes(&r.ucx_address, &r.ucx_address_len, &pb->ucx_address))
        goto err_nomem;
    if (pb->n_experts) {
        r.layers = calloc(pb->n_experts, sizeof *r.layers);
        if (!r.layers) goto err_nomem;
        r.n_layers = pb->n_experts;
        for (size_t i = 0; i < pb->n_experts; i++) {
            const Strata__V1__LayerExperts *le = pb->experts[i];
            if (le->n_experts > ST_PROTO_MAX_EXPERTS) {
                st = ST_REJECT(ST_ERR_PROTOCOL, "proto: register: layer %u lists %zu experts > %u", le->layer,
                             le->n_experts, ST_PROTO_MAX_EXPERTS);
                st_proto_register_req_cleanup(&r);
                goto err_unpacked;
            }
            r.layers[i].layer = le->layer;
            if (!dup_arr((void **)&r.layers[i].experts, le->experts, le->n_experts, sizeof(uint32_t)))
                goto err_nomem;
            r.layers[i].n_experts = le->n_experts;
        }
    }
    protobuf_c_message_free_unpacked(&pb->base, NULL);
    *out = r;
    return ST_OK;
err_nomem:
    st = NOMEM("RegisterMemberRequest");
    st_proto_register_req_cleanup(&r);
err_unpacked:
    protobuf_c_message_free_unpacked(&pb->base, NULL);
    return st;
}

/* ---- small fixed messages ---- */

st_status_t st_proto_register_reply_encode(const st_proto_register_reply_t *m, uint8_t **out, size_t *len) {
    Strata__V1__RegisterMemberReply pb;
    strata__v1__register_member_reply__init(&pb);
    pb.member_id = m->member_id;
    pb.heartbeat_interval_ms = m->heartbeat_interval_ms;
    pb.placement_version = m->placement_version;
    pb.threshold_version = m->threshold_version;
    pb.member_token = str_in(m->member_token);
    return pack_msg(&pb.base, "RegisterMemberReply", out, len);
}
st_status_t st_proto_register_reply_decode(const uint8_t *buf, size_t len, st_proto_register_reply_t *out) {
    Strata__V1__RegisterMemberReply *pb =
        (void *)unpack_msg(&strata__v1__register_member_reply__descriptor, buf, len);
    if (!pb) return ST_ERR_PROTOCOL;
    st_proto_register_reply_t r = {.member_id = pb->member_id, .heartbeat_interval_ms = pb->heartbeat_interval_ms,
                                   .placement_version = pb->placement_version, .threshold_version = pb->threshold_version};
    int ok = tok_copy(r.member_token, pb->member_token);
    protobuf_c_message_free_unpacked(&pb->base, NULL);
    if (!ok) return ST_REJECT(ST_ERR_PROTOCOL, "proto: RegisterMemberReply: member_token over %u characters", ST_PROTO_TOKEN_MAX);
    *out = r;
    return ST_OK;
}
void st_proto_register_reply_cleanup(st_proto_register_reply_t *m) { (void)m; }

st_status_t st_proto_heartbeat_req_encode(const st_proto_heartbeat_req_t *m, uint8_t **out, size_t *len) {
    Strata__V1__HeartbeatRequest pb;
    strata__v1__heartbeat_request__init(&pb);
    pb.member_id = m->member_id;
    pb.step = m->step;
    pb.inflight = m->inflight;
    pb.member_token = str_in(m->member_token);
    return pack_msg(&pb.base, "HeartbeatRequest", out, len);
}
st_status_t st_proto_heartbeat_req_decode(const uint8_t *buf, size_t len, st_proto_heartbeat_req_t *out) {
    Strata__V1__HeartbeatRequest *pb = (void *)unpack_msg(&strata__v1__heartbeat_request__descriptor, buf, len);
    if (!pb) return ST_ERR_PROTOCOL;
    st_proto_heartbeat_req_t r = {.member_id = pb->member_id, .step = pb->step, .inflight = pb->inflight};
    int ok = tok_copy(r.member_token, pb->member_token);
    protobuf_c_message_free_unpacked(&pb->base, NULL);
    if (!ok) return ST_REJECT(ST_ERR_PROTOCOL, "proto: HeartbeatRequest: member_token over %u characters", ST_PROTO_TOKEN_MAX);
    *out = r;
    return ST_OK;
}
void st_proto_heartbeat_req_cleanup(st_proto_heartbeat_req_t *m) { (void)m; }

st_status_t st_proto_heartbeat_reply_encode(const st_proto_heartbeat_reply_t *m, uint8_t **out, size_t *len) {
    Strata__V1__HeartbeatReply pb;
    strata__v1__heartbeat_reply__init(&pb);
    pb.known = m->known != 0;
    pb.placement_version = m->placement_version;
    pb.threshold_version = m->threshold_version;
    return pack_msg(&pb.base, "HeartbeatReply", out, len);
}
st_status_t st_proto_heartbeat_reply_decode(const uint8_t *buf, size_t len, st_proto_heartbeat_reply_t *out) {
    Strata__V1__HeartbeatReply *pb = (void *)unpack_msg(&strata__v1__heartbeat_reply__descriptor, buf, len);
    if (!pb) return ST_ERR_PROTOCOL;
    out->known = pb->known != 0;
    out->placement_version = pb->placement_version;
    out->threshold_version = pb->threshold_version;
    protobuf_c_message_free_unpacked(&pb->base, NULL);
    return ST_OK;
}
void st_proto_heartbeat_reply_cleanup(st_proto_heartbeat_reply_t *m) { (void)m; }

/* GetPlacementRequest and GetThresholdsRequest have the same field 1 (uint64 known_version), so one
 * encoding serves both; decode uses the placement descriptor. */
st_status_t st_proto_version_req_encode(const st_proto_version_req_t *m, uint8_t **out, size_t *len) {
    Strata__V1__GetPlacementRequest pb;
    strata__v1__get_placement_request__init(&pb);
    pb.known_version = m->known_version;
    return pack_msg(&pb.base, "GetPlacementRequest", out, len);
}
st_status_t st_proto_version_req_decode(const uint8_t *buf, size_t len, st_proto_version_req_t *out) {
    Strata__V1__GetPlacementRequest *pb =
        (void *)unpack_msg(&strata__v1__get_placement_request__descriptor, buf, len);
    if (!pb) return ST_ERR_PROTOCOL;
    out->known_version = pb->known_version;
    protobuf_c_message_free_unpacked(&pb->base, NULL);
    return ST_OK;
}
void st_proto_version_req_cleanup(st_proto_version_req_t *m) { (void)m; }


/* ---- Placement ---- */

st_status_t st_proto_placement_encode(const st_proto_placement_t *m, uint8_t **out, size_t *len) {
    Strata__V1__Placement pb;
    strata__v1__placement__init(&pb);
    pb.version = m->version;
    pb.unchanged = m->unchanged != 0;
    pb.n_layers = m->n_layers;
    pb.n_experts = m->n_experts;
    if (!m->unchanged) {
        size_t cells;
        if (!cells_ok(m->n_layers, m->n_experts, &cells) || !m->offsets ||
            !offsets_ok(m->offsets, cells + 1, m->n_member_ids))
            return ST_FAIL(ST_ERR_INVALID_ARG, "proto: placement %u x %u: bad shape or offsets", m->n_layers,
                           m->n_experts);
        pb.n_offsets = cells + 1;
        pb.offsets = m->offsets;
        pb.n_member_ids = m->n_member_ids;
        pb.member_ids = m->member_ids;
    }
    return pack_with_members(&pb.base, &pb.n_members, &pb.members, m->members, m->n_members, "Placement", out, len);
}

void st_proto_placement_cleanup(st_proto_placement_t *m) {
    free(m->offsets);
    free(m->member_ids);
    members_free(m->members, m->n_members);
    memset(m, 0, sizeof *m);
}

st_status_t st_proto_placement_decode(const uint8_t *buf, size_t len, st_proto_placement_t *out) {
    Strata__V1__Placement *pb = (void *)unpack_msg(&strata__v1__placement__descriptor, buf, len);
    if (!pb) return ST_ERR_PROTOCOL;
    st_status_t st;
    st_proto_placement_t r = {0};
    r.version = pb->version;
    r.unchanged = pb->unchanged != 0;
    r.n_layers = pb->n_layers;
    r.n_experts = pb->n_experts;
    if (!r.unchanged) {
        size_t cells;
        if (!cells_ok(pb->n_layers, pb->n_experts, &cells) || pb->n_offsets != cells + 1 ||
            !offsets_ok(pb->offsets, pb->n_offsets, pb->n_member_ids)) {
            st = ST_REJECT(ST_ERR_PROTOCOL, "proto: placement %u x %u: %zu offsets / %zu ids inconsistent",
                         pb->n_layers, pb->n_experts, pb->n_offsets, pb->n_member_ids);
            goto err_unpacked;
        }
        if (!dup_arr((void **)&r.offsets, pb->offsets, pb->n_offsets, sizeof(uint32_t)) ||
            !dup_arr((void **)&r.member_ids, pb->member_ids, pb->n_member_ids, sizeof(uint64_t)))
            goto err_nomem;
        r.n_member_ids = pb->n_member_ids;
    } else if (pb->n_offsets || pb->n_member_ids) {
        st = ST_REJECT(ST_ERR_PROTOCOL, "proto: placement marked unchanged but carries a map");
        goto err_unpacked;
    }
    st = members_from_pb(pb->members, pb->n_members, &r.members);
    if (st) goto err_result;
    r.n_members = pb->n_members;
    protobuf_c_message_free_unpacked(&pb->base, NULL);
    *out = r;
    return ST_OK;
err_nomem:
    st = NOMEM("Placement");
err_result:
    st_proto_placement_cleanup(&r);
err_unpacked:
    protobuf_c_message_free_unpacked(&pb->base, NULL);
    return st;
}

/* ---- ScoreSummary ---- */

/* load: whole layers from `first`, inside n_layers (cells_ok checked the shape). */
static int load_ok(uint32_t n_layers, uint32_t n_experts, uint32_t first, size_t n_load) {
    if (!n_load) return 1;
    if (!n_experts || n_load % n_experts) return 0;
    return first < n_layers && n_load / n_experts <= (size_t)(n_layers - first);
}

/* bins: n_summaries entries of the caller's. */
static st_status_t scores_fill(Strata__V1__ScoreSummary *pb, ProtobufCBinaryData *bins, const st_proto_scores_t *m) {
    size_t cells;
    if (!cells_ok(m->n_layers, m->n_experts, &cells) || !load_ok(m->n_layers, m->n_experts, m->load_first_layer, m->n_load) ||
        (m->n_load && !m->load) || (m->n_summaries && (!m->summaries || !m->summary_lens)))
        return ST_FAIL(ST_ERR_INVALID_ARG, "proto: scores %u x %u: bad shape", m->n_layers, m->n_experts);
    if (m->n_summaries > 8) return ST_FAIL(ST_ERR_INVALID_ARG, "proto: at most 8 score summaries per step");
    strata__v1__score_summary__init(pb);
    for (size_t i = 0; i < m->n_summaries; i++) bins[i] = (ProtobufCBinaryData){.len = m->summary_lens[i], .data = (uint8_t *)m->summaries[i]};
    pb->worker_id = m->worker_id;
    pb->step = m->step;
    pb->threshold_version = m->threshold_version;
    pb->n_layers = m->n_layers;
    pb->n_experts = m->n_experts;
    pb->n_summaries = m->n_summaries;
    pb->summaries = bins;
    pb->load_first_layer = m->load_first_layer;
    pb->n_load = m->n_load;
    pb->load = m->load;
    pb->dispatch_bytes = m->dispatch_bytes;
    pb->reply_bytes = m->reply_bytes;
    pb->messages = m->messages;
    pb->n_stage_s = ST_PROTO_STAGES;
    pb->stage_s = (double *)m->stage_s;
    pb->member_token = str_in(m->member_token);
    return ST_OK;
}

st_status_t st_proto_scores_encode(const st_proto_scores_t *m, uint8_t **out, size_t *len) {
    Strata__V1__ScoreSummary pb;
    ProtobufCBinaryData bins[8];
    st_status_t s = scores_fill(&pb, bins, m);
    return s == ST_OK ? pack_msg(&pb.base, "ScoreSummary", out, len) : s;
}

st_status_t st_proto_scores_encode_into(const st_proto_scores_t *m, uint8_t *buf, size_t cap, size_t *len) {
    Strata__V1__ScoreSummary pb;
    ProtobufCBinaryData bins[8];
    st_status_t s = scores_fill(&pb, bins, m);
    return s == ST_OK ? pack_into(&pb.base, "ScoreSummary", buf, cap, len) : s;
}

st_status_t st_proto_scores_stamp(const uint8_t *buf, size_t len, uint64_t worker_id, const char *member_token,
                                  uint8_t **out, size_t *out_len) {
    if (member_token && strlen(member_token) > ST_PROTO_TOKEN_MAX)
        return ST_FAIL(ST_ERR_INVALID_ARG, "proto: scores stamp: member_token over %u characters", ST_PROTO_TOKEN_MAX);
    Strata__V1__ScoreSummary pb;
    strata__v1__score_summary__init(&pb);
    pb.worker_id = worker_id;
    pb.member_token = str_in(member_token);
    size_t n = protobuf_c_message_get_packed_size(&pb.base);
    uint8_t *b = malloc(len + n + 1);
    if (!b) return ST_FAIL(ST_ERR_NO_MEMORY, "proto: scores stamp: cannot allocate %zu bytes", len + n);
    if (len) memcpy(b, buf, len);
    if (protobuf_c_message_pack(&pb.base, b + len) != n) {
        free(b);
        return ST_FAIL(ST_ERR_INTERNAL, "proto: scores stamp: short pack");
    }
    *out = b;
    *out_len = len + n;
    return ST_OK;
}

void st_proto_scores_cleanup(st_proto_scores_t *m) {
    for (size_t i = 0; i < m->n_summaries; i++) free((void *)m->summaries[i]);
    free((void *)m->summaries);
    free(m->summary_lens);
    free(m->load);
    memset(m, 0, sizeof *m);
}

st_status_t st_proto_scores_decode(const uint8_t *buf, size_t len, st_proto_scores_t *out) {
    Strata__V1__ScoreSummary *pb = (void *)unpack_msg(&strata__v1__score_summary__descriptor, buf, len);
    if (!pb) return ST_ERR_PROTOCOL;
    st_status_t st;
    st_proto_scores_t r = {0};
    size_t cells;
    if (!cells_ok(pb->n_layers, pb->n_experts, &cells) || !load_ok(pb->n_layers, pb->n_experts, pb->load_first_layer, pb->n_load) ||
        pb->n_summaries > 8) {
        st = ST_REJECT(ST_ERR_PROTOCOL, "proto: scores from worker %llu step %llu: %u x %u with %zu loads from layer %u, %zu summaries",
                     (unsigned long long)pb->worker_id, (unsigned long long)pb->step, pb->n_layers, pb->n_experts,
                     pb->n_load, pb->load_first_layer, pb->n_summaries);
        goto err_unpacked;
    }
    r.worker_id = pb->worker_id;
    r.step = pb->step;
    r.threshold_version = pb->threshold_version;
    r.n_layers = pb->n_layers;
    r.n_experts = pb->n_experts;
    r.dispatch_bytes = pb->dispatch_bytes;
    r.reply_bytes = pb->reply_bytes;
    r.messages = pb->messages;
    for (size_t i = 0; i < pb->n_stage_s && i < ST_PROTO_STAGES; i++) r.stage_s[i] = pb->stage_s[i];
    if (!tok_copy(r.member_token, pb->member_token)) {
        st = ST_REJECT(ST_ERR_PROTOCOL, "proto: scores: member_token over %u characters", ST_PROTO_TOKEN_MAX);
        goto err_unpacked;
    }
    r.summaries = calloc(pb->n_summaries + 1, sizeof(uint8_t *));
    r.summary_lens = calloc(pb->n_summaries + 1, sizeof(size_t));
    int okm = r.summaries && r.summary_lens && dup_arr((void **)&r.load, pb->load, pb->n_load, sizeof(uint32_t));
    for (size_t i = 0; okm && i < pb->n_summaries; i++) {
        uint8_t *d = malloc(pb->summaries[i].len + 1);
        if (!d) okm = 0;
        else {
            /* NOTE: an empty bytes field unpacks as data NULL, len 0: memcpy(d, NULL, 0) is UB */
            if (pb->summaries[i].len) memcpy(d, pb->summaries[i].data, pb->summaries[i].len);
            r.summaries[i] = d;
            r.summary_lens[i] = pb->summaries[i].len;
            r.n_summaries = i + 1;
        }
    }
    if (!okm) {
        st = NOMEM("ScoreSummary");
        st_proto_scores_cleanup(&r);
        goto err_unpacked;
    }
    r.n_load = pb->n_load;
    r.load_first_layer = pb->n_load ? pb->load_first_layer : 0;
    protobuf_c_message_free_unpacked(&pb->base, NULL);
    *out = r;
    return ST_OK;
err_unpacked:
    protobuf_c_message_free_unpacked(&pb->base, NULL);
    return st;
}

/* ---- Thresholds ---- */

/* rho: every row (no layer list), or the rows of ascending layers < n_layers. */
static int rho_ok(uint32_t n_layers, uint32_t n_experts, size_t n_rho, const uint32_t *layers, size_t n_layers_rho) {
    if (!n_layers_rho) return n_rho == 0 || n_rho == (size_t)n_layers * n_experts;
    if (!layers || n_layers_rho > n_layers || n_rho != n_layers_rho * n_experts) return 0;
    for (size_t i = 0; i < n_layers_rho; i++)
        if (layers[i] >= n_layers || (i && layers[i] <= layers[i - 1])) return 0;
    return 1;
}

/* NOTE: pb points into m's arrays */
static st_status_t thresholds_to_pb(const st_proto_thresholds_t *m, Strata__V1__Thresholds *pb) {
    size_t cells;
    if (!cells_ok(m->n_layers, m->n_experts, &cells) || (!m->unchanged && cells && !m->tau))
        return ST_FAIL(ST_ERR_INVALID_ARG, "proto: thresholds %u x %u: bad shape", m->n_layers, m->n_experts);
    strata__v1__thresholds__init(pb);
    pb->version = m->version;
    pb->unchanged = m->unchanged != 0;
    pb->step = m->step;
    pb->n_layers = m->n_layers;
    pb->n_experts = m->n_experts;
    if (!m->unchanged) {
        pb->n_tau = cells;
        pb->tau = m->tau;
        if (!rho_ok(m->n_layers, m->n_experts, m->n_rho, m->rho_layers, m->n_rho_layers) || (m->n_rho && !m->rho))
            return ST_FAIL(ST_ERR_INVALID_ARG, "proto: thresholds: rho of %zu values over %zu layers", m->n_rho, m->n_rho_layers);
        pb->n_rho = m->n_rho;
        pb->rho = m->rho;
        pb->n_rho_layers = m->n_rho_layers;
        pb->rho_layers = m->rho_layers;
    }
    return ST_OK;
}

st_status_t st_proto_thresholds_encode(const st_proto_thresholds_t *m, uint8_t **out, size_t *len) {
    Strata__V1__Thresholds pb;
    st_status_t st = thresholds_to_pb(m, &pb);
    return st != ST_OK ? st : pack_msg(&pb.base, "Thresholds", out, len);
}

void st_proto_thresholds_cleanup(st_proto_thresholds_t *m) {
    free(m->tau);
    free(m->rho);
    free(m->rho_layers);
    memset(m, 0, sizeof *m);
}

static st_status_t thresholds_from_pb(const Strata__V1__Thresholds *pb, st_proto_thresholds_t *out) {
    size_t cells;
    st_proto_thresholds_t r = {0};
    /* NOTE: "unchanged" carries no table at all (tau nor rho): what encode writes for it */
    if (!cells_ok(pb->n_layers, pb->n_experts, &cells) || pb->n_tau != (pb->unchanged ? 0 : cells) ||
        ((pb->n_rho || pb->n_rho_layers) && pb->unchanged) ||
        !rho_ok(pb->n_layers, pb->n_experts, pb->n_rho, pb->rho_layers, pb->n_rho_layers))
        return ST_REJECT(ST_ERR_PROTOCOL, "proto: thresholds %u x %u%s with %zu tau, %zu rho over %zu layers", pb->n_layers,
                         pb->n_experts, pb->unchanged ? " (unchanged)" : "", pb->n_tau, pb->n_rho, pb->n_rho_layers);
    r.version = pb->version;
    r.unchanged = pb->unchanged != 0;
    r.step = pb->step;
    r.n_layers = pb->n_layers;
    r.n_experts = pb->n_experts;
    r.n_rho = pb->n_rho;
    r.n_rho_layers = pb->n_rho_layers;
    if (!dup_arr((void **)&r.tau, pb->tau, pb->n_tau, sizeof(float)) ||
        !dup_arr((void **)&r.rho, pb->rho, pb->n_rho, sizeof(float)) ||
        !dup_arr((void **)&r.rho_layers, pb->rho_layers, pb->n_rho_layers, sizeof(uint32_t))) {
        free(r.tau);
        free(r.rho);
        return NOMEM("Thresholds");
    }
    *out = r;
    return ST_OK;
}

st_status_t st_proto_thresholds_decode(const uint8_t *buf, size_t len, st_proto_thresholds_t *out) {
    Strata__V1__Thresholds *pb = (void *)unpack_msg(&strata__v1__thresholds__descriptor, buf, len);
    if (!pb) return ST_ERR_PROTOCOL;
    st_status_t st = thresholds_from_pb(pb, out);
    protobuf_c_message_free_unpacked(&pb->base, NULL);
    return st;
}

st_status_t st_proto_scores_reply_encode(const st_proto_scores_reply_t *m, uint8_t **out, size_t *len) {
    Strata__V1__ReportScoresReply pb;
    Strata__V1__Thresholds th;
    strata__v1__report_scores_reply__init(&pb);
    pb.threshold_version = m->threshold_version;
    if (m->thresholds) {
        st_status_t st = thresholds_to_pb(m->thresholds, &th);
        if (st != ST_OK) return st;
        pb.thresholds = &th;
    }
    return pack_msg(&pb.base, "ReportScoresReply", out, len);
}
st_status_t st_proto_scores_reply_decode(const uint8_t *buf, size_t len, st_proto_scores_reply_t *out) {
    Strata__V1__ReportScoresReply *pb = (void *)unpack_msg(&strata__v1__report_scores_reply__descriptor, buf, len);
    if (!pb) return ST_ERR_PROTOCOL;
    st_proto_scores_reply_t r = {.threshold_version = pb->threshold_version};
    st_status_t st = ST_OK;
    if (pb->thresholds) {
        if (!(r.thresholds = calloc(1, sizeof *r.thresholds)))
            st = NOMEM("ReportScoresReply");
        else if ((st = thresholds_from_pb(pb->thresholds, r.thresholds)) != ST_OK)
            free(r.thresholds);
    }
    protobuf_c_message_free_unpacked(&pb->base, NULL);
    if (st == ST_OK) *out = r;
    return st;
}
void st_proto_scores_reply_cleanup(st_proto_scores_reply_t *m) {
    if (m->thresholds) st_proto_thresholds_cleanup(m->thresholds);
    free(m->thresholds);
    m->thresholds = NULL;
}

/* ---- Generate ---- */

st_status_t st_proto_generate_req_encode(const st_proto_generate_req_t *m, uint8_t **out, size_t *len) {
    Strata__V1__GenerateRequest pb;
    strata__v1__generate_request__init(&pb);
    pb.request_id = str_in(m->request_id);
    pb.prompt = str_in(m->prompt);
    pb.n_prompt_tokens = m->n_prompt_tokens;
    pb.prompt_tokens = m->prompt_tokens;
    pb.max_tokens = m->max_tokens;
    pb.temperature = m->temperature;
    pb.top_p = m->top_p;
    pb.top_k = m->top_k;
    pb.seed = m->seed;
    pb.has_seed = m->has_seed != 0;
    pb.n_stop_ids = m->n_stop_ids;
    pb.stop_ids = m->stop_ids;
    pb.dump_logits = m->dump_logits != 0;
    pb.ignore_eos = m->ignore_eos != 0;
    pb.presence_penalty = m->presence_penalty;
    pb.frequency_penalty = m->frequency_penalty;
    pb.n_logit_bias_ids = pb.n_logit_bias_values = m->n_logit_bias;
    pb.logit_bias_ids = m->logit_bias_ids;
    pb.logit_bias_values = m->logit_bias_values;
    pb.logprobs = m->logprobs != 0;
    pb.top_logprobs = m->top_logprobs;
    return pack_msg(&pb.base, "GenerateRequest", out, len);
}

void st_proto_generate_req_cleanup(st_proto_generate_req_t *m) {
    free(m->request_id);
    free(m->prompt);
    free(m->prompt_tokens);
    free(m->stop_ids);
    free(m->logit_bias_ids);
    free(m->logit_bias_values);
    memset(m, 0, sizeof *m);
}

st_status_t st_proto_generate_req_decode(const uint8_t *buf, size_t len, st_proto_generate_req_t *out) {
    Strata__V1__GenerateRequest *pb = (void *)unpack_msg(&strata__v1__generate_request__descriptor, buf, len);
    if (!pb) return ST_ERR_PROTOCOL;
    st_proto_generate_req_t r = {0};
    r.max_tokens = pb->max_tokens;
    r.temperature = (float)zero_canon(pb->temperature);
    r.top_p = (float)zero_canon(pb->top_p);
    r.top_k = pb->top_k;
    r.seed = pb->seed;
    r.has_seed = pb->has_seed != 0;
    r.dump_logits = pb->dump_logits != 0;
    r.ignore_eos = pb->ignore_eos != 0;
    r.presence_penalty = (float)zero_canon(pb->presence_penalty);
    r.frequency_penalty = (float)zero_canon(pb->frequency_penalty);
    if (pb->n_logit_bias_ids != pb->n_logit_bias_values) {
        size_t ni = pb->n_logit_bias_ids, nv = pb->n_logit_bias_values; /* NOTE: read before pb is freed */
        protobuf_c_message_free_unpacked(&pb->base, NULL);
        return ST_FAIL(ST_ERR_PROTOCOL, "GenerateRequest: %zu logit_bias ids, %zu values", ni, nv);
    }
    if (pb->top_logprobs > ST_PROTO_MAX_TOP_LOGPROBS || (pb->top_logprobs && !pb->logprobs)) {
        st_status_t st = ST_REJECT(ST_ERR_PROTOCOL, "proto: GenerateRequest: top_logprobs %u%s (at most %u, with logprobs)",
                                   pb->top_logprobs, pb->logprobs ? "" : " without logprobs", ST_PROTO_MAX_TOP_LOGPROBS);
        protobuf_c_message_free_unpacked(&pb->base, NULL);
        return st;
    }
    r.logprobs = pb->logprobs != 0;
    r.top_logprobs = pb->top_logprobs;
    if (!dup_str(&r.request_id, pb->request_id) || !dup_str(&r.prompt, pb->prompt) ||
        !dup_arr((void **)&r.logit_bias_ids, pb->logit_bias_ids, pb->n_logit_bias_ids, sizeof(uint32_t)) ||
        !dup_arr((void **)&r.logit_bias_values, pb->logit_bias_values, pb->n_logit_bias_values, sizeof(float)) ||
        !dup_arr((void **)&r.prompt_tokens, pb->prompt_tokens, pb->n_prompt_tokens, sizeof(uint32_t)) ||
        !dup_arr((void **)&r.stop_ids, pb->stop_ids, pb->n_stop_ids, sizeof(uint32_t))) {
        st_proto_generate_req_cleanup(&r);
        protobuf_c_message_free_unpacked(&pb->base, NULL);
        return NOMEM("GenerateRequest");
    }
    r.n_prompt_tokens = pb->n_prompt_tokens;
    r.n_stop_ids = pb->n_stop_ids;
    r.n_logit_bias = pb->n_logit_bias_ids;
    protobuf_c_message_free_unpacked(&pb->base, NULL);
    *out = r;
    return ST_OK;
}

/* NOTE: the top lists point into m (const only in C's eyes: protobuf-c's fields are not) */
static st_status_t chunk_fill(Strata__V1__GenerateChunk *pb, const st_proto_generate_chunk_t *m) {
    if (m->n_top > ST_PROTO_MAX_TOP_LOGPROBS || (m->n_top && !m->has_logprob))
        return ST_FAIL(ST_ERR_INVALID_ARG, "proto: GenerateChunk: %zu top logprobs%s", m->n_top,
                       m->has_logprob ? "" : " without the token's");
    strata__v1__generate_chunk__init(pb);
    pb->index = m->index;
    pb->token_id = m->token_id;
    pb->text = str_in(m->text);
    pb->logits.data = m->logits;
    pb->logits.len = m->logits_len;
    pb->finish_reason = (Strata__V1__FinishReason)m->finish;
    pb->error = str_in(m->error);
    pb->has_logprob = m->has_logprob != 0;
    pb->logprob = m->has_logprob ? m->logprob : 0.0f;
    pb->n_top_ids = pb->n_top_logprobs = m->n_top;
    pb->top_ids = (uint32_t *)m->top_ids;
    pb->top_logprobs = (float *)m->top_logprobs;
    return ST_OK;
}

st_status_t st_proto_generate_chunk_encode_into(const st_proto_generate_chunk_t *m, uint8_t *buf, size_t cap, size_t *len) {
    Strata__V1__GenerateChunk pb;
    st_status_t s = chunk_fill(&pb, m);
    return s == ST_OK ? pack_into(&pb.base, "GenerateChunk", buf, cap, len) : s;
}

st_status_t st_proto_generate_chunk_encode(const st_proto_generate_chunk_t *m, uint8_t **out, size_t *len) {
    Strata__V1__GenerateChunk pb;
    st_status_t s = chunk_fill(&pb, m);
    return s == ST_OK ? pack_msg(&pb.base, "GenerateChunk", out, len) : s;
}

void st_proto_generate_chunk_cleanup(st_proto_generate_chunk_t *m) {
    free(m->text);
    free(m->logits);
    free(m->error);
    memset(m, 0, sizeof *m);
}

st_status_t st_proto_generate_chunk_decode(const uint8_t *buf, size_t len, st_proto_generate_chunk_t *out) {
    Strata__V1__GenerateChunk *pb = (void *)unpack_msg(&strata__v1__generate_chunk__descriptor, buf, len);
    if (!pb) return ST_ERR_PROTOCOL;
    st_proto_generate_chunk_t r = {0};
    r.index = pb->index;
    r.token_id = pb->token_id;
    r.finish = (st_proto_finish_t)pb->finish_reason;
    if (pb->logits.len % 4 != 0) {
        st_status_t st = ST_REJECT(ST_ERR_PROTOCOL, "proto: generate chunk: logits of %zu bytes is not fp32", pb->logits.len);
        protobuf_c_message_free_unpacked(&pb->base, NULL);
        return st;
    }
    if (pb->n_top_ids != pb->n_top_logprobs || pb->n_top_ids > ST_PROTO_MAX_TOP_LOGPROBS ||
        (pb->n_top_ids && !pb->has_logprob)) {
        st_status_t st = ST_REJECT(ST_ERR_PROTOCOL, "proto: generate chunk: %zu top ids, %zu top logprobs%s (at most %u)",
                                   pb->n_top_ids, pb->n_top_logprobs, pb->has_logprob ? "" : " without the token's",
                                   ST_PROTO_MAX_TOP_LOGPROBS);
        protobuf_c_message_free_unpacked(&pb->base, NULL);
        return st;
    }
    r.has_logprob = pb->has_logprob != 0;
    r.logprob = pb->has_logprob ? (float)zero_canon(pb->logprob) : 0.0f; /* NOTE: what encode writes back for a value without the flag */
    r.n_top = pb->n_top_ids;
    if (r.n_top) {
        memcpy(r.top_ids, pb->top_ids, r.n_top * sizeof(uint32_t));
        memcpy(r.top_logprobs, pb->top_logprobs, r.n_top * sizeof(float));
    }
    if (!dup_str(&r.text, pb->text) || !dup_str(&r.error, pb->error) ||
        !dup_bytes(&r.logits, &r.logits_len, &pb->logits)) {
        st_proto_generate_chunk_cleanup(&r);
        protobuf_c_message_free_unpacked(&pb->base, NULL);
        return NOMEM("GenerateChunk");
    }
    protobuf_c_message_free_unpacked(&pb->base, NULL);
    *out = r;
    return ST_OK;
}

st_status_t st_proto_generate_chunk_check(const st_proto_generate_chunk_t *m, uint32_t vocab) {
    if (m->token_id >= vocab)
        return ST_REJECT(ST_ERR_PROTOCOL, "proto: generate chunk: token %u outside the vocabulary 0..%u", m->token_id, vocab - 1);
    if (m->logits_len && m->logits_len != (size_t)vocab * sizeof(float))
        return ST_REJECT(ST_ERR_PROTOCOL, "proto: generate chunk: logits of %zu bytes for a vocabulary of %u", m->logits_len, vocab);
    if (m->has_logprob && !(m->logprob <= 0.0f))
        return ST_REJECT(ST_ERR_PROTOCOL, "proto: generate chunk: logprob %g", (double)m->logprob);
    for (size_t i = 0; i < m->n_top && i < ST_PROTO_MAX_TOP_LOGPROBS; i++)
        if (m->top_ids[i] >= vocab || !(m->top_logprobs[i] <= 0.0f))
            return ST_REJECT(ST_ERR_PROTOCOL, "proto: generate chunk: top %zu: token %u (vocabulary 0..%u), logprob %g", i,
                             m->top_ids[i], vocab - 1, (double)m->top_logprobs[i]);
    return ST_OK;
}

/* ---- Status ---- */

st_status_t st_proto_status_reply_encode(const st_proto_status_reply_t *m, uint8_t **out, size_t *len) {
    Strata__V1__StatusReply pb;
    strata__v1__status_reply__init(&pb);
    pb.version = str_in(m->version);
    pb.uptime_s = m->uptime_s;
    pb.placement_version = m->placement_version;
    pb.threshold_version = m->threshold_version;
    pb.step = m->step;
    pb.detail_json = str_in(m->detail_json);
    return pack_with_members(&pb.base, &pb.n_members, &pb.members, m->members, m->n_members, "StatusReply", out, len);
}

void st_proto_status_reply_cleanup(st_proto_status_reply_t *m) {
    free(m->version);
    free(m->detail_json);
    members_free(m->members, m->n_members);
    memset(m, 0, sizeof *m);
}

st_status_t st_proto_status_reply_decode(const uint8_t *buf, size_t len, st_proto_status_reply_t *out) {
    Strata__V1__StatusReply *pb = (void *)unpack_msg(&strata__v1__status_reply__descriptor, buf, len);
    if (!pb) return ST_ERR_PROTOCOL;
    st_proto_status_reply_t r = {0};
    st_status_t st = ST_OK;
    r.uptime_s = zero_canon(pb->uptime_s);
    r.placement_version = pb->placement_version;
    r.threshold_version = pb->threshold_version;
    r.step = pb->step;
    if (!dup_str(&r.version, pb->version) || !dup_str(&r.detail_json, pb->detail_json)) {
        st = NOMEM("StatusReply");
        goto err_result;
    }
    st = members_from_pb(pb->members, pb->n_members, &r.members);
    if (st) goto err_result;
    r.n_members = pb->n_members;
    protobuf_c_message_free_unpacked(&pb->base, NULL);
    *out = r;
    return ST_OK;
err_result:
    st_proto_status_reply_cleanup(&r);
    protobuf_c_message_free_unpacked(&pb->base, NULL);
    return st;
}
