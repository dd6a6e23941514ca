/* proto conversion: every message round-trips through bytes, and shape-inconsistent or malformed
 * input is rejected without leaks. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "strata/proto.h"

int main(void) {
    uint8_t *buf;
    size_t n;

    uint32_t e0[] = {0, 3, 5}, e1[] = {1};
    st_proto_layer_experts_t le[] = {{.layer = 0, .n_experts = 3, .experts = e0}, {.layer = 1, .n_experts = 1, .experts = e1}};
    uint8_t addr[] = {1, 2, 3, 0, 255};
    st_proto_register_req_t rr = {.role = ST_PROTO_ROLE_EXPERT, .name = "es-0", .data_endpoint = "127.0.0.1:4000",
                                  .ucx_address = addr, .ucx_address_len = 5, .capacity = 256, .n_layers = 2, .layers = le};
    CHECK(st_proto_register_req_encode(&rr, &buf, &n) == ST_OK, "register encode");
    st_proto_register_req_t rd;
    CHECK(st_proto_register_req_decode(buf, n, &rd) == ST_OK, "register decode");
    CHECK(rd.role == ST_PROTO_ROLE_EXPERT && !strcmp(rd.name, "es-0") && !strcmp(rd.data_endpoint, "127.0.0.1:4000") &&
              rd.ucx_address_len == 5 && !memcmp(rd.ucx_address, addr, 5) && rd.capacity == 256 && rd.n_layers == 2 &&
              rd.layers[0].n_experts == 3 && rd.layers[0].experts[2] == 5 && rd.layers[1].layer == 1,
          "register fields");
    st_proto_register_req_cleanup(&rd);
    /* truncated input is malformed */
    CHECK(st_proto_register_req_decode(buf, n - 1, &rd) == ST_ERR_PROTOCOL, "truncated register");
    free(buf);
    uint8_t junk[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
    CHECK(st_proto_heartbeat_req_decode(junk, sizeof junk, &(st_proto_heartbeat_req_t){0}) == ST_ERR_PROTOCOL, "junk");

    /* placement 2 layers x 3 experts */
    uint32_t off[7] = {0, 1, 3, 3, 4, 5, 6};
    uint64_t ids[6] = {10, 10, 11, 11, 10, 11};
    st_proto_member_t mem[2] = {{.member_id = 10, .role = ST_PROTO_ROLE_EXPERT, .name = "a", .alive = 1},
                                {.member_id = 11, .role = ST_PROTO_ROLE_EXPERT, .data_endpoint = "h:1"}};
    st_proto_placement_t pl = {.version = 3, .n_layers = 2, .n_experts = 3, .offsets = off, .n_member_ids = 6,
                               .member_ids = ids, .n_members = 2, .members = mem};
    CHECK(st_proto_placement_encode(&pl, &buf, &n) == ST_OK, "placement encode");
    st_proto_placement_t pd;
    CHECK(st_proto_placement_decode(buf, n, &pd) == ST_OK, "placement decode");
    CHECK(pd.version == 3 && pd.offsets[6] == 6 && pd.member_ids[2] == 11 && pd.n_members == 2 &&
              pd.members[0].alive == 1 && !strcmp(pd.members[1].data_endpoint, "h:1") && !strcmp(pd.members[1].name, ""),
          "placement fields");
    st_proto_placement_cleanup(&pd);
    free(buf);
    off[3] = 2; /* decreasing offsets */
    CHECK(st_proto_placement_encode(&pl, &buf, &n) == ST_ERR_INVALID_ARG, "placement bad offsets refused");
    off[3] = 3;

    /* scores: 1 layer x 2 experts, two summaries (opaque bytes), loads */
    uint32_t load[2] = {100, 7};
    const uint8_t s0[3] = {1, 2, 3}, s1[1] = {9};
    const uint8_t *sums[2] = {s0, s1};
    size_t slens[2] = {3, 1};
    st_proto_scores_t sc = {.worker_id = 4, .step = 9, .n_layers = 1, .n_experts = 2, .n_summaries = 2,
                            .summaries = sums, .summary_lens = slens, .n_load = 2, .load = load, .dispatch_bytes = 77};
    CHECK(st_proto_scores_encode(&sc, &buf, &n) == ST_OK, "scores encode");
    st_proto_scores_t sd;
    CHECK(st_proto_scores_decode(buf, n, &sd) == ST_OK, "scores decode");
    CHECK(sd.n_summaries == 2 && sd.summary_lens[0] == 3 && sd.summaries[0][2] == 3 && sd.summaries[1][0] == 9 &&
              sd.n_load == 2 && sd.load[1] == 7 && sd.dispatch_bytes == 77,
          "scores fields");
    st_proto_scores_cleanup(&sd);
    free(buf);
    sc.n_load = 3; /* loads that do not match the shape are refused */
    CHECK(st_proto_scores_encode(&sc, &buf, &n) == ST_ERR_INVALID_ARG, "scores with a bad load shape refused");
    sc.n_load = 2;
    float vals[3] = {0.9f, 0.8f, 0.8f}, rho[2] = {0.5f, 0.25f};
    st_proto_thresholds_t th = {.version = 5, .step = 9, .n_layers = 1, .n_experts = 2, .tau = vals, .n_rho = 2, .rho = rho};
    CHECK(st_proto_thresholds_encode(&th, &buf, &n) == ST_OK, "thresholds encode");
    st_proto_thresholds_t td;
    CHECK(st_proto_thresholds_decode(buf, n, &td) == ST_OK && td.tau[1] == 0.8f && td.version == 5 && td.n_rho == 2 &&
              td.rho[1] == 0.25f,
          "thresholds");
    st_proto_thresholds_cleanup(&td);
    free(buf);
    /* Thresholds bytes re-read as Placement with a shape mismatch: fields 4/5 are n_layers/n_experts in
       Thresholds vs n_experts/offsets in Placement, so decode must refuse rather than index */
    th.unchanged = 1;
    CHECK(st_proto_thresholds_encode(&th, &buf, &n) == ST_OK, "thresholds unchanged");
    CHECK(st_proto_thresholds_decode(buf, n, &td) == ST_OK && td.unchanged && td.tau == NULL, "unchanged carries no tau");
    st_proto_thresholds_cleanup(&td);
    free(buf);

    uint32_t toks[3] = {1, 2, 3}, stops[1] = {2};
    st_proto_generate_req_t gr = {.request_id = "r1", .prompt_tokens = toks, .n_prompt_tokens = 3, .max_tokens = 16,
                                  .temperature = 0.7f, .top_p = 0.9f, .top_k = 40, .seed = 1234, .has_seed = 1,
                                  .n_stop_ids = 1, .stop_ids = stops, .dump_logits = 1};
    CHECK(st_proto_generate_req_encode(&gr, &buf, &n) == ST_OK, "generate encode");
    st_proto_generate_req_t gd;
    CHECK(st_proto_generate_req_decode(buf, n, &gd) == ST_OK, "generate decode");
    CHECK(!strcmp(gd.request_id, "r1") && !strcmp(gd.prompt, "") && gd.n_prompt_tokens == 3 && gd.prompt_tokens[2] == 3 &&
              gd.max_tokens == 16 && gd.temperature == 0.7f && gd.top_k == 40 && gd.seed == 1234 && gd.has_seed &&
              gd.stop_ids[0] == 2 && gd.dump_logits,
          "generate fields");
    st_proto_generate_req_cleanup(&gd);
    free(buf);
    /* logit_bias ids and values of different counts (fields 15, 16): refused, the counts named
     * (read before the message is freed: fuzz/corpus/proto/found_logit_bias_uaf.bin under ASan) */
    const uint8_t lb[] = {0x7a, 0x02, 0x05, 0x06, 0x82, 0x01, 0x04, 0x00, 0x00, 0x80, 0x3f};
    CHECK(st_proto_generate_req_decode(lb, sizeof lb, &gd) == ST_ERR_PROTOCOL &&
              strstr(st_err_last(), "2 logit_bias ids, 1 values") != NULL,
          "logit_bias counts differ: %s", st_err_last());

    float lg[4] = {1, 2, 3, 4};
    st_proto_generate_chunk_t ck = {.index = 2, .token_id = 77, .text = "hi", .logits = (uint8_t *)lg, .logits_len = 16,
                                    .finish = ST_PROTO_FINISH_STOP};
    CHECK(st_proto_generate_chunk_encode(&ck, &buf, &n) == ST_OK, "chunk encode");
    st_proto_generate_chunk_t cd;
    CHECK(st_proto_generate_chunk_decode(buf, n, &cd) == ST_OK && cd.logits_len == 16 && cd.finish == ST_PROTO_FINISH_STOP &&
              !strcmp(cd.text, "hi") && !strcmp(cd.error, ""),
          "chunk fields");
    st_proto_generate_chunk_cleanup(&cd);
    free(buf);
    ck.logits_len = 6;
    CHECK(st_proto_generate_chunk_encode(&ck, &buf, &n) == ST_OK, "chunk encode odd logits");
    CHECK(st_proto_generate_chunk_decode(buf, n, &cd) == ST_ERR_PROTOCOL, "logits not fp32 rejected");
    free(buf);

    /* logprobs travel as values (issue 17): the request asks, the chunk carries the token's logprob
     * and the top ones, in a few hundred bytes whatever the vocabulary; no logits row */
    gr = (st_proto_generate_req_t){.request_id = "r2", .prompt = "x", .logprobs = 1, .top_logprobs = 20};
    CHECK(st_proto_generate_req_encode(&gr, &buf, &n) == ST_OK && st_proto_generate_req_decode(buf, n, &gd) == ST_OK &&
              gd.logprobs && gd.top_logprobs == 20 && !gd.dump_logits,
          "request logprobs round trip");
    st_proto_generate_req_cleanup(&gd);
    free(buf);
    gr.top_logprobs = 21;
    CHECK(st_proto_generate_req_encode(&gr, &buf, &n) == ST_OK && st_proto_generate_req_decode(buf, n, &gd) == ST_ERR_PROTOCOL &&
              strstr(st_err_last(), "top_logprobs 21") != NULL,
          "request top_logprobs 21 refused: %s", st_err_last());
    free(buf);
    gr.top_logprobs = 3;
    gr.logprobs = 0;
    CHECK(st_proto_generate_req_encode(&gr, &buf, &n) == ST_OK && st_proto_generate_req_decode(buf, n, &gd) == ST_ERR_PROTOCOL,
          "request top_logprobs without logprobs refused");
    free(buf);
    st_proto_generate_chunk_t lc = {.index = 5, .token_id = 163839, .text = "", .has_logprob = 1, .logprob = -0.25f,
                                    .n_top = ST_PROTO_MAX_TOP_LOGPROBS};
    for (uint32_t i = 0; i < ST_PROTO_MAX_TOP_LOGPROBS; i++) {
        lc.top_ids[i] = 163839 - 7 * i;
        lc.top_logprobs[i] = -0.25f - (float)i;
    }
    uint8_t small[512];
    size_t sn = 0;
    CHECK(st_proto_generate_chunk_encode_into(&lc, small, sizeof small, &sn) == ST_OK && sn < 256,
          "a K3-vocabulary token with 20 top logprobs encodes in %zu bytes (< 256)", sn);
    CHECK(st_proto_generate_chunk_decode(small, sn, &cd) == ST_OK && cd.has_logprob && cd.logprob == -0.25f &&
              cd.n_top == 20 && cd.top_ids[19] == 163839 - 133 && cd.top_logprobs[19] == -19.25f && cd.logits_len == 0 &&
              cd.token_id == 163839,
          "chunk logprobs round trip");
    CHECK(st_proto_generate_chunk_check(&cd, 163840) == ST_OK, "chunk check: in vocabulary");
    CHECK(st_proto_generate_chunk_check(&cd, 163839) == ST_ERR_PROTOCOL && strstr(st_err_last(), "163839") != NULL,
          "chunk check: token past the vocabulary: %s", st_err_last());
    cd.token_id = 1;
    CHECK(st_proto_generate_chunk_check(&cd, 163839) == ST_ERR_PROTOCOL && strstr(st_err_last(), "top 0") != NULL,
          "chunk check: top id past the vocabulary: %s", st_err_last());
    cd.top_ids[0] = 2;
    cd.top_logprobs[7] = NAN;
    CHECK(st_proto_generate_chunk_check(&cd, 163839) == ST_ERR_PROTOCOL, "chunk check: NaN top logprob");
    cd.top_logprobs[7] = -1;
    cd.logprob = 0.5f;
    CHECK(st_proto_generate_chunk_check(&cd, 163839) == ST_ERR_PROTOCOL, "chunk check: logprob above 0");
    cd.logprob = 0;
    CHECK(st_proto_generate_chunk_check(&cd, 163839) == ST_OK, "chunk check: logprob 0 (certain) passes");
    cd.logits_len = 8;
    CHECK(st_proto_generate_chunk_check(&cd, 163839) == ST_ERR_PROTOCOL, "chunk check: logits row of the wrong length");
    cd.logits_len = 0;
    st_proto_generate_chunk_cleanup(&cd);
    lc.n_top = 21;
    CHECK(st_proto_generate_chunk_encode_into(&lc, small, sizeof small, &sn) == ST_ERR_INVALID_ARG, "encode refuses 21 tops");
    lc.n_top = 2;
    lc.has_logprob = 0;
    CHECK(st_proto_generate_chunk_encode_into(&lc, small, sizeof small, &sn) == ST_ERR_INVALID_ARG,
          "encode refuses tops without the token's logprob");
    /* hand-made wire: 3 top ids (field 9) but 1 top logprob (field 10); 21 of each; tops without has_logprob */
    const uint8_t tc[] = {0x38, 0x01, 0x4a, 0x03, 0x01, 0x02, 0x03, 0x52, 0x04, 0x00, 0x00, 0x80, 0xbf};
    CHECK(st_proto_generate_chunk_decode(tc, sizeof tc, &cd) == ST_ERR_PROTOCOL && strstr(st_err_last(), "3 top ids, 1 top") != NULL,
          "decode: top counts differ: %s", st_err_last());
    uint8_t big[2 + 2 + 21 + 2 + 84];
    size_t bn = 0;
    big[bn++] = 0x38, big[bn++] = 0x01; /* has_logprob */
    big[bn++] = 0x4a, big[bn++] = 21;
    for (int i = 0; i < 21; i++) big[bn++] = (uint8_t)i;
    big[bn++] = 0x52, big[bn++] = 84;
    memset(big + bn, 0, 84);
    bn += 84;
    CHECK(st_proto_generate_chunk_decode(big, bn, &cd) == ST_ERR_PROTOCOL && strstr(st_err_last(), "21 top ids") != NULL,
          "decode: 21 tops refused: %s", st_err_last());
    const uint8_t notok[] = {0x4a, 0x01, 0x05, 0x52, 0x04, 0x00, 0x00, 0x80, 0xbf};
    CHECK(st_proto_generate_chunk_decode(notok, sizeof notok, &cd) == ST_ERR_PROTOCOL &&
              strstr(st_err_last(), "without the token's") != NULL,
          "decode: tops without has_logprob refused: %s", st_err_last());

    st_proto_status_reply_t sr = {.version = "0.1", .uptime_s = 1.5, .step = 3, .n_members = 2, .members = mem,
                                  .detail_json = "{}"};
    CHECK(st_proto_status_reply_encode(&sr, &buf, &n) == ST_OK, "status encode");
    st_proto_status_reply_t sd2;
    CHECK(st_proto_status_reply_decode(buf, n, &sd2) == ST_OK && sd2.n_members == 2 && sd2.members[1].member_id == 11 &&
              sd2.uptime_s == 1.5 && !strcmp(sd2.detail_json, "{}"),
          "status fields");
    st_proto_status_reply_cleanup(&sd2);
    free(buf);

    st_proto_version_req_t vr = {.known_version = 77}, vd;
    CHECK(st_proto_version_req_encode(&vr, &buf, &n) == ST_OK && st_proto_version_req_decode(buf, n, &vd) == ST_OK &&
              vd.known_version == 77,
          "version req");
    free(buf);
    st_proto_register_reply_t rp = {.member_id = 5, .heartbeat_interval_ms = 500}, rpd;
    CHECK(st_proto_register_reply_encode(&rp, &buf, &n) == ST_OK && st_proto_register_reply_decode(buf, n, &rpd) == ST_OK &&
              rpd.member_id == 5 && rpd.heartbeat_interval_ms == 500,
          "register reply");
    free(buf);
    st_proto_scores_reply_t srp = {.threshold_version = 8}, srd;
    CHECK(st_proto_scores_reply_encode(&srp, &buf, &n) == ST_OK && st_proto_scores_reply_decode(buf, n, &srd) == ST_OK &&
              srd.threshold_version == 8,
          "scores reply");
    free(buf);
    st_proto_scores_reply_cleanup(&srd);
    /* with the newest table riding along */
    float tau6[6] = {NAN, NAN, NAN, 0.5f, 0.25f, -1.0f}, rho3[3] = {0.4f, 0.2f, 0.1f};
    uint32_t probed[1] = {1};
    st_proto_thresholds_t tt = {.version = 9, .step = 90, .n_layers = 2, .n_experts = 3, .tau = tau6, .n_rho = 3,
                                .rho = rho3, .n_rho_layers = 1, .rho_layers = probed};
    srp.thresholds = &tt;
    CHECK(st_proto_scores_reply_encode(&srp, &buf, &n) == ST_OK && st_proto_scores_reply_decode(buf, n, &srd) == ST_OK &&
              srd.threshold_version == 8 && srd.thresholds && srd.thresholds->version == 9 && srd.thresholds->step == 90 &&
              srd.thresholds->n_layers == 2 && srd.thresholds->n_experts == 3 && !memcmp(srd.thresholds->tau, tau6, sizeof tau6) &&
              srd.thresholds->n_rho == 3 && !memcmp(srd.thresholds->rho, rho3, sizeof rho3) &&
              srd.thresholds->n_rho_layers == 1 && srd.thresholds->rho_layers[0] == 1,
          "scores reply with a table");
    free(buf);
    st_proto_scores_reply_cleanup(&srd);
    CHECK(srd.thresholds == NULL, "scores reply cleanup frees the table");
    /* an embedded table of the wrong shape is refused (encode, and decode of the bytes a peer could send) */
    tt.n_rho_layers = 2;
    CHECK(st_proto_scores_reply_encode(&srp, &buf, &n) != ST_OK, "scores reply with a malformed table: not encoded");
    {
        /* a peer's bytes: a 2 x 3 table whose n_experts reads 2, so tau has 6 values for 4 cells */
        st_proto_thresholds_t bad = {.version = 9, .n_layers = 2, .n_experts = 3, .tau = tau6};
        uint8_t *b3;
        size_t n3;
        srp.thresholds = &bad;
        CHECK(st_proto_scores_reply_encode(&srp, &b3, &n3) == ST_OK, "2 x 3 table encodes");
        /* n_experts is field 5 of Thresholds: tag 0x28, varint 3 */
        size_t hits = 0;
        for (size_t i = 0; i + 1 < n3; i++)
            if (b3[i] == 0x28 && b3[i + 1] == 3) b3[i + 1] = 2, hits++;
        CHECK(hits == 1, "found n_experts in the encoding");
        st_proto_scores_reply_t d3;
        CHECK(st_proto_scores_reply_decode(b3, n3, &d3) == ST_ERR_PROTOCOL, "scores reply whose table has more tau than cells: refused");
        free(b3);
    }
    srp.thresholds = NULL;
    /* empty bytes decode to defaults */
    st_proto_heartbeat_reply_t hr;
    CHECK(st_proto_heartbeat_reply_decode((const uint8_t *)"", 0, &hr) == ST_OK && hr.known == 0, "empty message");
    return st_test_done();
}
