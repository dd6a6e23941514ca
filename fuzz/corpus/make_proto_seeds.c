/* Writes the seed corpus of fuzz/fuzz_proto.c: one valid message of each kind the coordinator and
 * workers decode (plus a few edge shapes), each file = [kind byte][protobuf bytes]. The kind byte
 * is the index into fuzz_proto.c's table.
 *   cc -Iproto/include -Icommon/base/include fuzz/corpus/make_proto_seeds.c -Lbuild/proto \
 *      -Lbuild/common -lstrata_proto -lstrata_proto_gen -lstrata_base -lprotobuf-c -lm \
 *      -o /tmp/mkseeds && /tmp/mkseeds fuzz/corpus/proto */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "strata/proto.h"

enum { K_REG_REQ, K_REG_REPLY, K_HB_REQ, K_HB_REPLY, K_VERSION, K_PLACEMENT, K_SCORES, K_SCORES_REPLY, K_THRESHOLDS,
       K_GEN_REQ, K_GEN_CHUNK, K_STATUS };

static const char *dir;

static void put(int kind, const char *name, st_status_t s, uint8_t *buf, size_t len) {
    if (s != ST_OK) {
        fprintf(stderr, "%s: %s\n", name, st_err_last());
        exit(1);
    }
    char path[512];
    snprintf(path, sizeof path, "%s/%02d_%s.bin", dir, kind, name);
    FILE *f = fopen(path, "wb");
    uint8_t k = (uint8_t)kind;
    if (!f || fwrite(&k, 1, 1, f) != 1 || (len && fwrite(buf, 1, len, f) != len)) exit(1);
    fclose(f);
    free(buf);
}

#define PUT(kind, name, x, msg)                                                                      \
    do {                                                                                             \
        uint8_t *b_ = NULL;                                                                          \
        size_t n_ = 0;                                                                               \
        st_status_t s_ = st_proto_##x##_encode(msg, &b_, &n_);                                       \
        put(kind, name, s_, b_, n_);                                                                 \
    } while (0)

static const char *TOK = "0123456789abcdef0123456789abcdef";

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    dir = argv[1];
    uint32_t ex0[] = {0, 3, 5}, ex1[] = {1, 2};
    st_proto_layer_experts_t le[2] = {{.layer = 1, .n_experts = 3, .experts = ex0}, {.layer = 2, .n_experts = 2, .experts = ex1}};
    uint8_t ucx[] = {1, 2, 3, 4, 5, 6, 7, 8};
    st_proto_register_req_t rq = {.role = ST_PROTO_ROLE_EXPERT, .name = "expert-0", .data_endpoint = "127.0.0.1:7001",
                                  .ucx_address = ucx, .ucx_address_len = sizeof ucx, .capacity = 512, .n_layers = 2, .layers = le};
    PUT(K_REG_REQ, "expert", register_req, &rq);
    st_proto_register_req_t rw = {.role = ST_PROTO_ROLE_ATTENTION, .name = "attn-0", .data_endpoint = "[::1]:7100", .capacity = 16};
    PUT(K_REG_REQ, "worker", register_req, &rw);
    st_proto_register_reply_t rr = {.member_id = 0x9e3779b97f4a7c15ull, .heartbeat_interval_ms = 500, .placement_version = 3,
                                    .threshold_version = 7};
    snprintf(rr.member_token, sizeof rr.member_token, "%s", TOK);
    PUT(K_REG_REPLY, "reply", register_reply, &rr);
    st_proto_heartbeat_req_t hq = {.member_id = 0x9e3779b97f4a7c15ull, .step = 1234, .inflight = 3};
    snprintf(hq.member_token, sizeof hq.member_token, "%s", TOK);
    PUT(K_HB_REQ, "hb", heartbeat_req, &hq);
    st_proto_heartbeat_reply_t hr = {.known = 1, .placement_version = 3, .threshold_version = 7};
    PUT(K_HB_REPLY, "known", heartbeat_reply, &hr);
    st_proto_version_req_t vq = {.known_version = 41};
    PUT(K_VERSION, "v41", version_req, &vq);
    /* placement 2 layers x 3 experts, R=2 on layer 1 */
    uint32_t off[7] = {0, 0, 0, 0, 2, 4, 6};
    uint64_t ids[6] = {11, 12, 12, 11, 11, 12};
    st_proto_member_t mem[2] = {
        {.member_id = 11, .role = ST_PROTO_ROLE_EXPERT, .name = "e0", .data_endpoint = "127.0.0.1:1", .capacity = 8, .alive = 1},
        {.member_id = 12, .role = ST_PROTO_ROLE_EXPERT, .name = "e1", .data_endpoint = "127.0.0.1:2", .ucx_address = ucx,
         .ucx_address_len = 4, .alive = 1}};
    st_proto_placement_t pl = {.version = 5, .n_layers = 2, .n_experts = 3, .offsets = off, .n_member_ids = 6, .member_ids = ids,
                               .n_members = 2, .members = mem};
    PUT(K_PLACEMENT, "map", placement, &pl);
    st_proto_placement_t pu = {.version = 5, .unchanged = 1};
    PUT(K_PLACEMENT, "unchanged", placement, &pu);
    /* scores: two summaries (one empty), loads */
    uint32_t load[6] = {0, 0, 0, 9, 1, 30};
    uint8_t sum0[60] = {0x53, 0x54, 0x51, 0x53, 1, 0, 48, 0, 60};
    const uint8_t *sums[2] = {sum0, sum0};
    size_t lens[2] = {sizeof sum0, 0};
    st_proto_scores_t sc = {.worker_id = 0x9e3779b97f4a7c15ull, .step = 99, .threshold_version = 4, .n_layers = 2, .n_experts = 3,
                            .n_summaries = 2, .summaries = sums, .summary_lens = lens, .n_load = 6, .load = load,
                            .dispatch_bytes = 1 << 20, .reply_bytes = 1 << 19, .messages = 12,
                            .stage_s = {0.001, 0.002, 0.0, 0.004, 0.0005, 0.0001, 0.003}};
    snprintf(sc.member_token, sizeof sc.member_token, "%s", TOK);
    PUT(K_SCORES, "step", scores, &sc);
    st_proto_scores_t sn = sc;
    sn.stage_s[0] = NAN;
    sn.stage_s[1] = -INFINITY;
    sn.n_load = 0;
    sn.load = NULL;
    PUT(K_SCORES, "nan", scores, &sn);
    /* a load window (load_first_layer: the layers of one step only) with the network stage */
    st_proto_scores_t sw = sc;
    sw.load_first_layer = 1;
    sw.n_load = 3;
    sw.load = load + 3;
    sw.stage_s[ST_PROTO_STAGE_NETWORK] = 0.0025;
    PUT(K_SCORES, "window", scores, &sw);
    st_proto_scores_reply_t sr = {.threshold_version = 8};
    PUT(K_SCORES_REPLY, "reply", scores_reply, &sr);
    float tau[6] = {NAN, NAN, NAN, 0.5f, 0.25f, 0.125f}, rho[6] = {NAN, NAN, NAN, 0.4f, 0.2f, 0.1f};
    st_proto_thresholds_t th = {.version = 8, .step = 80, .n_layers = 2, .n_experts = 3, .tau = tau, .n_rho = 6, .rho = rho};
    PUT(K_THRESHOLDS, "table", thresholds, &th);
    st_proto_scores_reply_t srt = {.threshold_version = 8, .thresholds = &th};
    PUT(K_SCORES_REPLY, "reply_table", scores_reply, &srt);
    st_proto_thresholds_t tu = {.version = 8, .unchanged = 1, .n_layers = 2, .n_experts = 3};
    PUT(K_THRESHOLDS, "unchanged", thresholds, &tu);
    /* rho of the probed layers only (rho_layers) */
    uint32_t probed[1] = {1};
    st_proto_thresholds_t tp = {.version = 9, .step = 81, .n_layers = 2, .n_experts = 3, .tau = tau, .n_rho = 3, .rho = rho + 3,
                                .n_rho_layers = 1, .rho_layers = probed};
    PUT(K_THRESHOLDS, "probed", thresholds, &tp);
    uint32_t ptok[4] = {1, 2, 3, 4}, stop[2] = {257, 0};
    st_proto_generate_req_t gq = {.request_id = "req-1", .prompt = "", .n_prompt_tokens = 4, .prompt_tokens = ptok,
                                  .max_tokens = 16, .temperature = 0.7f, .top_p = 0.9f, .top_k = 40, .seed = 42, .has_seed = 1,
                                  .n_stop_ids = 2, .stop_ids = stop, .dump_logits = 1, .ignore_eos = 1};
    PUT(K_GEN_REQ, "tokens", generate_req, &gq);
    st_proto_generate_req_t gt = {.request_id = "req-2", .prompt = "Hello, world", .max_tokens = 4294967295u};
    PUT(K_GEN_REQ, "text", generate_req, &gt);
    /* OpenAI's penalties and logit_bias (fields 13-16) */
    uint32_t bias_ids[3] = {5, 257, 0};
    float bias_v[3] = {-100.0f, 2.5f, 0.0f};
    st_proto_generate_req_t gp = {.request_id = "req-3", .prompt = "", .n_prompt_tokens = 4, .prompt_tokens = ptok,
                                  .max_tokens = 8, .temperature = 1.0f, .presence_penalty = 0.5f, .frequency_penalty = -1.25f,
                                  .n_logit_bias = 3, .logit_bias_ids = bias_ids, .logit_bias_values = bias_v};
    PUT(K_GEN_REQ, "penalties", generate_req, &gp);
    /* logprobs (fields 17-18) */
    st_proto_generate_req_t gl = {.request_id = "req-4", .prompt = "abc", .max_tokens = 4, .logprobs = 1, .top_logprobs = 20};
    PUT(K_GEN_REQ, "logprobs", generate_req, &gl);
    float lg[3] = {0.5f, -1.0f, 2.0f};
    st_proto_generate_chunk_t gc = {.index = 3, .token_id = 65, .text = "A", .logits = (uint8_t *)lg, .logits_len = sizeof lg};
    PUT(K_GEN_CHUNK, "token", generate_chunk, &gc);
    /* a logprobs token (fields 7-10): the values, no logits row */
    st_proto_generate_chunk_t gl2 = {.index = 1, .token_id = 66, .text = "B", .has_logprob = 1, .logprob = -0.5f, .n_top = 3,
                                     .top_ids = {66, 65, 300}, .top_logprobs = {-0.5f, -1.5f, -4.0f}};
    PUT(K_GEN_CHUNK, "logprobs", generate_chunk, &gl2);
    st_proto_generate_chunk_t ge = {.index = 4, .finish = ST_PROTO_FINISH_ERROR, .error = "expert server e1 lost"};
    PUT(K_GEN_CHUNK, "error", generate_chunk, &ge);
    st_proto_status_reply_t st = {.version = "0.1.0", .uptime_s = 12.5, .placement_version = 5, .threshold_version = 8, .step = 80,
                                  .n_members = 2, .members = mem, .detail_json = "{\"ready\":true}"};
    PUT(K_STATUS, "status", status_reply, &st);
    return 0;
}
