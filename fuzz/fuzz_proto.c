/* libFuzzer harness: every control-plane message the coordinator and the workers decode
 * (proto/convert.c). The first byte picks the message type, the rest is the protobuf payload.
 * Whatever decodes must encode again, and decode to the same struct (encode -> decode -> equal,
 * floats compared bit for bit); the no-allocation encoders must produce the same bytes and refuse a
 * buffer one byte short; a ScoreSummary stamped with an id and token decodes to the same report
 * with that id and token. Any break is an abort(). Seeds: fuzz/corpus/proto/ (make_proto_seeds.c).
 *
 * Standalone build (no CMake):
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -Iproto/include -Icommon/base/include \
 *     -Ibuild/proto/gen fuzz/fuzz_proto.c proto/convert.c build/proto/gen/strata.pb-c.c \
 *     common/base/base.c common/base/secret.c -lprotobuf-c -lm -o fuzz_proto
 *   ./fuzz_proto -max_total_time=120 fuzz/corpus/proto */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/proto.h"

#define NEED(c)                                                                                      \
    do {                                                                                             \
        if (!(c)) {                                                                                  \
            fprintf(stderr, "fuzz_proto: invariant broken at line %d: %s (%s)\n", __LINE__, #c, st_err_last()); \
            abort();                                                                                 \
        }                                                                                            \
    } while (0)

static int str_eq(const char *a, const char *b) { return !strcmp(a ? a : "", b ? b : ""); }
static int mem_eq(const void *a, const void *b, size_t n) { return n == 0 || (a && b && !memcmp(a, b, n)); }

/* ---- equality per message ---- */

static int eq_register_req(const st_proto_register_req_t *a, const st_proto_register_req_t *b) {
    if (a->role != b->role || !str_eq(a->name, b->name) || !str_eq(a->data_endpoint, b->data_endpoint) ||
        a->ucx_address_len != b->ucx_address_len || !mem_eq(a->ucx_address, b->ucx_address, a->ucx_address_len) ||
        a->capacity != b->capacity || a->n_layers != b->n_layers)
        return 0;
    for (size_t i = 0; i < a->n_layers; i++)
        if (a->layers[i].layer != b->layers[i].layer || a->layers[i].n_experts != b->layers[i].n_experts ||
            !mem_eq(a->layers[i].experts, b->layers[i].experts, a->layers[i].n_experts * sizeof(uint32_t)))
            return 0;
    return 1;
}

static int eq_register_reply(const st_proto_register_reply_t *a, const st_proto_register_reply_t *b) {
    return a->member_id == b->member_id && a->heartbeat_interval_ms == b->heartbeat_interval_ms &&
           a->placement_version == b->placement_version && a->threshold_version == b->threshold_version &&
           !strcmp(a->member_token, b->member_token);
}

static int eq_heartbeat_req(const st_proto_heartbeat_req_t *a, const st_proto_heartbeat_req_t *b) {
    return a->member_id == b->member_id && a->step == b->step && a->inflight == b->inflight &&
           !strcmp(a->member_token, b->member_token);
}

static int eq_heartbeat_reply(const st_proto_heartbeat_reply_t *a, const st_proto_heartbeat_reply_t *b) {
    return a->known == b->known && a->placement_version == b->placement_version && a->threshold_version == b->threshold_version;
}

static int eq_version_req(const st_proto_version_req_t *a, const st_proto_version_req_t *b) {
    return a->known_version == b->known_version;
}

static int eq_members(const st_proto_member_t *a, const st_proto_member_t *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (a[i].member_id != b[i].member_id || a[i].role != b[i].role || !str_eq(a[i].name, b[i].name) ||
            !str_eq(a[i].data_endpoint, b[i].data_endpoint) || a[i].ucx_address_len != b[i].ucx_address_len ||
            !mem_eq(a[i].ucx_address, b[i].ucx_address, a[i].ucx_address_len) || a[i].capacity != b[i].capacity ||
            a[i].alive != b[i].alive)
            return 0;
    return 1;
}

static int eq_placement(const st_proto_placement_t *a, const st_proto_placement_t *b) {
    if (a->version != b->version || a->unchanged != b->unchanged || a->n_layers != b->n_layers ||
        a->n_experts != b->n_experts || a->n_member_ids != b->n_member_ids || a->n_members != b->n_members ||
        (a->offsets == NULL) != (b->offsets == NULL))
        return 0;
    size_t n_off = a->unchanged ? 0 : (size_t)a->n_layers * a->n_experts + 1;
    return mem_eq(a->offsets, b->offsets, n_off * sizeof(uint32_t)) &&
           mem_eq(a->member_ids, b->member_ids, a->n_member_ids * sizeof(uint64_t)) && eq_members(a->members, b->members, a->n_members);
}

static int scores_eq(const st_proto_scores_t *a, const st_proto_scores_t *b, int same_id) {
    if ((same_id && (a->worker_id != b->worker_id || strcmp(a->member_token, b->member_token) != 0)) || a->step != b->step ||
        a->threshold_version != b->threshold_version || a->n_layers != b->n_layers || a->n_experts != b->n_experts ||
        a->n_summaries != b->n_summaries || a->n_load != b->n_load || a->dispatch_bytes != b->dispatch_bytes ||
        a->reply_bytes != b->reply_bytes || a->messages != b->messages || memcmp(a->stage_s, b->stage_s, sizeof a->stage_s) != 0 ||
        a->load_first_layer != b->load_first_layer || !mem_eq(a->load, b->load, a->n_load * sizeof(uint32_t)))
        return 0;
    for (size_t i = 0; i < a->n_summaries; i++)
        if (a->summary_lens[i] != b->summary_lens[i] || !mem_eq(a->summaries[i], b->summaries[i], a->summary_lens[i])) return 0;
    return 1;
}

static int eq_scores(const st_proto_scores_t *a, const st_proto_scores_t *b) { return scores_eq(a, b, 1); }

static int eq_thresholds(const st_proto_thresholds_t *a, const st_proto_thresholds_t *b) {
    size_t n_tau = a->unchanged ? 0 : (size_t)a->n_layers * a->n_experts;
    return a->version == b->version && a->unchanged == b->unchanged && a->step == b->step && a->n_layers == b->n_layers &&
           a->n_experts == b->n_experts && (a->tau == NULL) == (b->tau == NULL) && mem_eq(a->tau, b->tau, n_tau * sizeof(float)) &&
           a->n_rho == b->n_rho && mem_eq(a->rho, b->rho, a->n_rho * sizeof(float)) && a->n_rho_layers == b->n_rho_layers &&
           mem_eq(a->rho_layers, b->rho_layers, a->n_rho_layers * sizeof(uint32_t));
}

static int eq_scores_reply(const st_proto_scores_reply_t *a, const st_proto_scores_reply_t *b) {
    return a->threshold_version == b->threshold_version && (a->thresholds == NULL) == (b->thresholds == NULL) &&
           (!a->thresholds || eq_thresholds(a->thresholds, b->thresholds));
}

static int eq_generate_req(const st_proto_generate_req_t *a, const st_proto_generate_req_t *b) {
    return str_eq(a->request_id, b->request_id) && str_eq(a->prompt, b->prompt) && a->n_prompt_tokens == b->n_prompt_tokens &&
           mem_eq(a->prompt_tokens, b->prompt_tokens, a->n_prompt_tokens * sizeof(uint32_t)) && a->max_tokens == b->max_tokens &&
           !memcmp(&a->temperature, &b->temperature, sizeof(float)) && !memcmp(&a->top_p, &b->top_p, sizeof(float)) &&
           a->top_k == b->top_k && a->seed == b->seed && a->has_seed == b->has_seed && a->n_stop_ids == b->n_stop_ids &&
           mem_eq(a->stop_ids, b->stop_ids, a->n_stop_ids * sizeof(uint32_t)) && a->dump_logits == b->dump_logits &&
           a->ignore_eos == b->ignore_eos && !memcmp(&a->presence_penalty, &b->presence_penalty, sizeof(float)) &&
           !memcmp(&a->frequency_penalty, &b->frequency_penalty, sizeof(float)) && a->n_logit_bias == b->n_logit_bias &&
           mem_eq(a->logit_bias_ids, b->logit_bias_ids, a->n_logit_bias * sizeof(uint32_t)) &&
           mem_eq(a->logit_bias_values, b->logit_bias_values, a->n_logit_bias * sizeof(float)) &&
           a->logprobs == b->logprobs && a->top_logprobs == b->top_logprobs;
}

static int eq_generate_chunk(const st_proto_generate_chunk_t *a, const st_proto_generate_chunk_t *b) {
    return a->index == b->index && a->token_id == b->token_id && str_eq(a->text, b->text) && a->logits_len == b->logits_len &&
           mem_eq(a->logits, b->logits, a->logits_len) && a->finish == b->finish && str_eq(a->error, b->error) &&
           a->has_logprob == b->has_logprob && !memcmp(&a->logprob, &b->logprob, sizeof(float)) && a->n_top == b->n_top &&
           a->n_top <= ST_PROTO_MAX_TOP_LOGPROBS && !memcmp(a->top_ids, b->top_ids, a->n_top * sizeof(uint32_t)) &&
           !memcmp(a->top_logprobs, b->top_logprobs, a->n_top * sizeof(float));
}

static int eq_status_reply(const st_proto_status_reply_t *a, const st_proto_status_reply_t *b) {
    return str_eq(a->version, b->version) && !memcmp(&a->uptime_s, &b->uptime_s, sizeof(double)) &&
           a->placement_version == b->placement_version && a->threshold_version == b->threshold_version && a->step == b->step &&
           a->n_members == b->n_members && eq_members(a->members, b->members, a->n_members) &&
           str_eq(a->detail_json, b->detail_json);
}

/* decode -> encode -> decode -> equal; the encoded bytes are left in *enc (caller frees). */
#define ROUND_TRIP(x, data, size, a, enc, enc_len)                                                   \
    do {                                                                                             \
        st_proto_##x##_t b_;                                                                         \
        NEED(st_proto_##x##_encode(&a, &enc, &enc_len) == ST_OK);                                    \
        NEED(st_proto_##x##_decode(enc, enc_len, &b_) == ST_OK);                                     \
        NEED(eq_##x(&a, &b_));                                                                       \
        st_proto_##x##_cleanup(&b_);                                                                 \
    } while (0)

#define SIMPLE(x)                                                                                    \
    static void fuzz_##x(const uint8_t *d, size_t n) {                                               \
        st_proto_##x##_t a;                                                                          \
        if (st_proto_##x##_decode(d, n, &a) != ST_OK) return;                                        \
        uint8_t *enc;                                                                                \
        size_t len;                                                                                  \
        ROUND_TRIP(x, d, n, a, enc, len);                                                            \
        free(enc);                                                                                   \
        st_proto_##x##_cleanup(&a);                                                                  \
    }

SIMPLE(register_req)
SIMPLE(register_reply)
SIMPLE(heartbeat_req)
SIMPLE(heartbeat_reply)
SIMPLE(version_req)
SIMPLE(placement)
SIMPLE(scores_reply)
SIMPLE(thresholds)
SIMPLE(generate_req)
SIMPLE(status_reply)

static void fuzz_generate_chunk(const uint8_t *d, size_t n) {
    st_proto_generate_chunk_t a;
    if (st_proto_generate_chunk_decode(d, n, &a) != ST_OK) return;
    uint8_t *enc;
    size_t len;
    ROUND_TRIP(generate_chunk, d, n, a, enc, len);
    /* the per-token encoder: same bytes, and a buffer one byte short is refused */
    uint8_t *into = malloc(len + 1);
    size_t len2 = 0;
    NEED(into && st_proto_generate_chunk_encode_into(&a, into, len, &len2) == ST_OK && len2 == len && !memcmp(into, enc, len));
    if (len) NEED(st_proto_generate_chunk_encode_into(&a, into, len - 1, &len2) == ST_ERR_CAPACITY);
    free(into);
    free(enc);
    st_proto_generate_chunk_cleanup(&a);
}

static void fuzz_scores(const uint8_t *d, size_t n) {
    st_proto_scores_t a;
    if (st_proto_scores_decode(d, n, &a) != ST_OK) return;
    uint8_t *enc;
    size_t len;
    ROUND_TRIP(scores, d, n, a, enc, len);
    uint8_t *into = malloc(len + 1);
    size_t len2 = 0;
    NEED(into && st_proto_scores_encode_into(&a, into, len, &len2) == ST_OK && len2 == len && !memcmp(into, enc, len));
    if (len) NEED(st_proto_scores_encode_into(&a, into, len - 1, &len2) == ST_ERR_CAPACITY);
    free(into);
    /* stamped with another id and token: the same report under that registration */
    static const char tok[] = "0123456789abcdef0123456789abcdef";
    uint8_t *st;
    size_t st_len;
    st_proto_scores_t b;
    NEED(st_proto_scores_stamp(enc, len, 0x8000000000000123ull, tok, &st, &st_len) == ST_OK);
    NEED(st_proto_scores_decode(st, st_len, &b) == ST_OK);
    NEED(b.worker_id == 0x8000000000000123ull && !strcmp(b.member_token, tok) && scores_eq(&a, &b, 0));
    st_proto_scores_cleanup(&b);
    free(st);
    free(enc);
    st_proto_scores_cleanup(&a);
}

/* NOTE: the order is the seed files' first byte (fuzz/corpus/make_proto_seeds.c): append only. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static void (*const fns[])(const uint8_t *, size_t) = {
        fuzz_register_req, fuzz_register_reply, fuzz_heartbeat_req, fuzz_heartbeat_reply, fuzz_version_req,
        fuzz_placement,    fuzz_scores,         fuzz_scores_reply,  fuzz_thresholds,      fuzz_generate_req,
        fuzz_generate_chunk, fuzz_status_reply,
    };
    if (size < 1) return 0;
    fns[data[0] % (sizeof fns / sizeof fns[0])](data + 1, size - 1);
    return 0;
}
