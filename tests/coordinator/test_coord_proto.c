/* proto: the member-token fields (round trip, over-long tokens refused), stamping an encoded
 * ScoreSummary with id + token, an empty score summary (decode used to memcpy from NULL: UBSan /
 * ASan killed the coordinator), and the per-layer expert-list bound of RegisterMemberRequest. */
#include <stdlib.h>

#include "harness.h"
#include "strata/proto.h"

static const char *TOK = "0123456789abcdef0123456789abcdef";

int main(void) {
    /* tokens round trip */
    st_proto_register_reply_t rr = {.member_id = 0x8000000000000001ull, .heartbeat_interval_ms = 500}, rd;
    snprintf(rr.member_token, sizeof rr.member_token, "%s", TOK);
    uint8_t *b;
    size_t n;
    CHECK(st_proto_register_reply_encode(&rr, &b, &n) == ST_OK, "encode register reply");
    CHECK(st_proto_register_reply_decode(b, n, &rd) == ST_OK && rd.member_id == rr.member_id &&
              !strcmp(rd.member_token, TOK), "register reply carries id and token");
    free(b);
    st_proto_heartbeat_req_t hq = {.member_id = 42, .step = 7, .inflight = 3}, hd;
    snprintf(hq.member_token, sizeof hq.member_token, "%s", TOK);
    CHECK(st_proto_heartbeat_req_encode(&hq, &b, &n) == ST_OK, "encode heartbeat");
    CHECK(st_proto_heartbeat_req_decode(b, n, &hd) == ST_OK && hd.member_id == 42 && hd.step == 7 && hd.inflight == 3 &&
              !strcmp(hd.member_token, TOK), "heartbeat carries id and token");
    free(b);
    /* a token over 64 characters (hand-made: field 4, length 65) is refused, *out untouched */
    uint8_t raw[2 + 65 + 2];
    raw[0] = 0x08; /* member_id = 5 */
    raw[1] = 5;
    raw[2] = (4 << 3) | 2;
    raw[3] = 65;
    memset(raw + 4, 'a', 65);
    memset(&hd, 0x5a, sizeof hd);
    CHECK(st_proto_heartbeat_req_decode(raw, 4 + 65, &hd) == ST_ERR_PROTOCOL && hd.member_id == 0x5a5a5a5a5a5a5a5aull,
          "over-long heartbeat token refused, output untouched");
    raw[3] = 64;
    CHECK(st_proto_heartbeat_req_decode(raw, 4 + 64, &hd) == ST_OK && strlen(hd.member_token) == 64 && hd.member_id == 5,
          "a 64-character token is within bounds");

    /* scores: empty summary, token, stamp */
    enum { L = 2, E = 3 };
    uint32_t load[L * E] = {1, 2, 3, 4, 5, 6};
    static const uint8_t s0[] = {9, 9, 9};
    const uint8_t *sums[2] = {s0, (const uint8_t *)""};
    size_t lens[2] = {sizeof s0, 0};
    st_proto_scores_t sc = {.worker_id = 0, .step = 11, .n_layers = L, .n_experts = E, .n_summaries = 2, .summaries = sums,
                            .summary_lens = lens, .n_load = L * E, .load = load, .dispatch_bytes = 99};
    sc.stage_s[2] = 0.25;
    CHECK(st_proto_scores_encode(&sc, &b, &n) == ST_OK, "encode scores with an empty summary");
    st_proto_scores_t sd;
    CHECK(st_proto_scores_decode(b, n, &sd) == ST_OK && sd.n_summaries == 2 && sd.summary_lens[1] == 0 &&
              sd.summary_lens[0] == 3 && sd.summaries[0][2] == 9 && sd.member_token[0] == 0,
          "an empty summary decodes (no memcpy from NULL)");
    st_proto_scores_cleanup(&sd);
    uint8_t *st;
    size_t sn;
    CHECK(st_proto_scores_stamp(b, n, 0xfeedfacecafebeefull, TOK, &st, &sn) == ST_OK, "stamp");
    CHECK(st_proto_scores_decode(st, sn, &sd) == ST_OK && sd.worker_id == 0xfeedfacecafebeefull &&
              !strcmp(sd.member_token, TOK) && sd.step == 11 && sd.n_load == L * E && sd.load[5] == 6 &&
              sd.n_summaries == 2 && sd.dispatch_bytes == 99 && sd.stage_s[2] == 0.25,
          "stamped report: id and token set, everything else as encoded");
    st_proto_scores_cleanup(&sd);
    free(st);
    /* stamping replaces an id and token already there (the last field wins) */
    sc.worker_id = 5;
    snprintf(sc.member_token, sizeof sc.member_token, "ffffffffffffffffffffffffffffffff");
    free(b);
    CHECK(st_proto_scores_encode(&sc, &b, &n) == ST_OK, "encode scores with id and token");
    CHECK(st_proto_scores_stamp(b, n, 6, TOK, &st, &sn) == ST_OK && st_proto_scores_decode(st, sn, &sd) == ST_OK &&
              sd.worker_id == 6 && !strcmp(sd.member_token, TOK),
          "stamp overrides");
    st_proto_scores_cleanup(&sd);
    free(st);
    free(b);
    char long_tok[80];
    memset(long_tok, 'a', 70);
    long_tok[70] = 0;
    CHECK(st_proto_scores_stamp((const uint8_t *)"", 0, 1, long_tok, &st, &sn) == ST_ERR_INVALID_ARG, "stamp refuses a long token");

    /* RegisterMemberRequest: one layer listing more experts than any model has */
    size_t big = ST_PROTO_MAX_EXPERTS + 1;
    uint32_t *ex = calloc(big, sizeof *ex);
    st_proto_layer_experts_t le = {.layer = 0, .n_experts = big, .experts = ex};
    st_proto_register_req_t rq = {.role = ST_PROTO_ROLE_EXPERT, .name = "x", .data_endpoint = "h:1", .n_layers = 1, .layers = &le};
    st_proto_register_req_t rqd;
    CHECK(st_proto_register_req_encode(&rq, &b, &n) == ST_OK, "encode a big register request");
    CHECK(st_proto_register_req_decode(b, n, &rqd) == ST_ERR_PROTOCOL, "a layer of %zu experts refused", big);
    free(b);
    le.n_experts = 4;
    CHECK(st_proto_register_req_encode(&rq, &b, &n) == ST_OK && st_proto_register_req_decode(b, n, &rqd) == ST_OK &&
              rqd.n_layers == 1 && rqd.layers[0].n_experts == 4,
          "a normal register request decodes");
    st_proto_register_req_cleanup(&rqd);
    free(b);
    free(ex);
    return st_test_done();
}
