/* Strata control-plane messages as plain C structs, and their conversion to/from protobuf bytes
 * (proto/strata.proto, package strata.v1). The only public face of the schema: nothing outside
 * proto/convert.c sees generated protobuf-c types.
 *
 * Per message X: st_proto_X_encode() packs into a malloc'd buffer (caller free()s); _decode()
 * parses, validates array shapes and fills *out (written only on success) with malloc'd strings and
 * arrays; _cleanup() frees exactly what _decode allocated — never call it on a struct you filled by
 * hand. Encode reads NULL strings as "". StatusRequest is empty: send zero bytes. Malformed input is
 * the sender's mistake: decode records why (st_err_last) and logs it at DEBUG only; the caller
 * replies or logs (rate-limited). Decode checks shapes and lengths, not values (ranges, NaN): the
 * receiver range-checks every field before use. */
#ifndef STRATA_PROTO_H
#define STRATA_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "strata/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Method paths for st_rpc (gRPC "/package.Service/Method"). */
#define ST_PROTO_METHOD_REGISTER "/strata.v1.Coordinator/RegisterMember"
#define ST_PROTO_METHOD_HEARTBEAT "/strata.v1.Coordinator/Heartbeat"
#define ST_PROTO_METHOD_PLACEMENT "/strata.v1.Coordinator/GetPlacement"
#define ST_PROTO_METHOD_REPORT_SCORES "/strata.v1.Coordinator/ReportScores"
#define ST_PROTO_METHOD_THRESHOLDS "/strata.v1.Coordinator/GetThresholds"
#define ST_PROTO_METHOD_GENERATE "/strata.v1.Coordinator/Generate" /* server-streaming */
#define ST_PROTO_METHOD_STATUS "/strata.v1.Coordinator/Status"
/* Served by attention workers; the coordinator forwards client requests there. */
#define ST_PROTO_METHOD_WORKER_GENERATE "/strata.v1.Worker/Generate" /* server-streaming */

/* Bounds enforced by decode (a K3 map is 92 x 896). */
#define ST_PROTO_MAX_LAYERS 4096u
#define ST_PROTO_MAX_EXPERTS 65536u
#define ST_PROTO_MAX_CELLS (1u << 24) /* n_layers * n_experts */
/* member_token: 32 hex digits as issued; decode refuses longer ones (ST_ERR_PROTOCOL). */
#define ST_PROTO_TOKEN_LEN 32u
#define ST_PROTO_TOKEN_MAX 64u
/* top_logprobs of a Generate request and chunk (OpenAI's limit; the engine's ST_SAMPLE_MAX_TOP) */
#define ST_PROTO_MAX_TOP_LOGPROBS 20u

typedef enum {
    ST_PROTO_ROLE_UNSPECIFIED = 0,
    ST_PROTO_ROLE_ATTENTION = 1,
    ST_PROTO_ROLE_EXPERT = 2,
} st_proto_role_t;

typedef enum {
    ST_PROTO_FINISH_NONE = 0, /* more chunks follow */
    ST_PROTO_FINISH_STOP = 1,
    ST_PROTO_FINISH_LENGTH = 2,
    ST_PROTO_FINISH_ERROR = 3,
    ST_PROTO_FINISH_CANCELLED = 4,
} st_proto_finish_t;

typedef struct {
    uint32_t layer;
    size_t n_experts;
    uint32_t *experts; /* [n_experts] ascending */
} st_proto_layer_experts_t;

typedef struct {
    st_proto_role_t role;
    char *name;
    char *data_endpoint; /* "host:port" of the member's UCX listener */
    uint8_t *ucx_address;
    size_t ucx_address_len;
    uint32_t capacity;
    size_t n_layers;
    st_proto_layer_experts_t *layers; /* [n_layers] */
} st_proto_register_req_t;

typedef struct {
    uint64_t member_id;
    uint32_t heartbeat_interval_ms;
    uint64_t placement_version, threshold_version;
    char member_token[ST_PROTO_TOKEN_MAX + 1]; /* NUL-terminated; "" = none */
} st_proto_register_reply_t;

typedef struct {
    uint64_t member_id, step;
    uint32_t inflight;
    char member_token[ST_PROTO_TOKEN_MAX + 1]; /* the registration's token */
} st_proto_heartbeat_req_t;

typedef struct {
    int known;
    uint64_t placement_version, threshold_version;
} st_proto_heartbeat_reply_t;

/* GetPlacementRequest and GetThresholdsRequest share this shape. */
typedef struct {
    uint64_t known_version;
} st_proto_version_req_t;

typedef struct {
    uint64_t member_id;
    st_proto_role_t role;
    char *name;
    char *data_endpoint;
    uint8_t *ucx_address;
    size_t ucx_address_len;
    uint32_t capacity;
    int alive;
} st_proto_member_t;

/* Members holding expert e of layer l: member_ids[offsets[i] .. offsets[i+1]), i = l*n_experts + e.
 * unchanged: the requester's version is current and no map is carried (arrays NULL, counts 0). */
typedef struct {
    uint64_t version;
    int unchanged;
    uint32_t n_layers, n_experts;
    uint32_t *offsets; /* [n_layers * n_experts + 1], offsets[0] = 0, non-decreasing */
    size_t n_member_ids;
    uint64_t *member_ids; /* [offsets[last]] */
    size_t n_members;
    st_proto_member_t *members;
} st_proto_placement_t;

/* Worker step stages (seconds), each host time of the step's driving thread unless said:
 *   attention   the worker's own layers: its wait for the device's walks (GPU) or their computation (CPU)
 *   dispatch    pack + post of the dispatches
 *   wait        blocked on replies (after the other micro-batches' layers overlapped them)
 *   expert      time at the servers, queue + compute, slowest server per layer (part of the round trip)
 *   combine     the CPU engine's combine of the expert rows
 *   thresholds  quantile summaries and counts
 *   network     per layer, the slowest server's round trip minus its time at the server (the transport
 *               both ways; part of the round trip)
 *   launch      queueing the next layers' walks (GPU: kernel and graph launches)
 *   plan        the dispatch plan: which rows go to which server, the tree cut
 *   unpack      reply rows to where the combine reads them
 *   other       the rest of the step: scheduling, polling, sampling bookkeeping
 * The step is the sum of all but expert and network. Appended in this order: a report from an older
 * worker lacks the last ones (0). */
enum { ST_PROTO_STAGE_ATTENTION = 0, ST_PROTO_STAGE_DISPATCH, ST_PROTO_STAGE_WAIT, ST_PROTO_STAGE_EXPERT,
       ST_PROTO_STAGE_COMBINE, ST_PROTO_STAGE_THRESHOLDS, ST_PROTO_STAGE_NETWORK, ST_PROTO_STAGE_LAUNCH,
       ST_PROTO_STAGE_PLAN, ST_PROTO_STAGE_UNPACK, ST_PROTO_STAGE_OTHER, ST_PROTO_STAGES };
/* their names in /status and /metrics */
extern const char *const st_proto_stage_names[ST_PROTO_STAGES];
/* whether stage k adds to the step (expert and network are parts of wait) */
static inline int st_proto_stage_in_step(int k) { return k != ST_PROTO_STAGE_EXPERT && k != ST_PROTO_STAGE_NETWORK; }

/* One worker's step (see strata.proto ScoreSummary): score summaries in common/quantile's byte
 * format (one per micro-batch), and per-expert loads of whole layers from load_first_layer on:
 * load[(l - load_first_layer)*n_experts + e]; n_load a multiple of n_experts (0: none), the
 * layers inside n_layers. */
typedef struct {
    uint64_t worker_id, step, threshold_version;
    uint32_t n_layers, n_experts;
    size_t n_summaries;
    const uint8_t **summaries; /* [n_summaries]; decode allocates */
    size_t *summary_lens;      /* [n_summaries] */
    uint32_t load_first_layer;
    size_t n_load;
    uint32_t *load;
    uint64_t dispatch_bytes, reply_bytes, messages;
    double stage_s[ST_PROTO_STAGES]; /* see ST_PROTO_STAGE_* */
    char member_token[ST_PROTO_TOKEN_MAX + 1]; /* worker_id's registration token */
} st_proto_scores_t;

/* τ[l][e] = tau[l*n_experts + e] (NaN = unset layer); unchanged: requester is current, tau NULL.
 * rho, the probe thresholds: with n_rho_layers > 0 only the rows of those layers (ascending, each
 * < n_layers): rho[i*n_experts + e] is layer rho_layers[i]'s, n_rho = n_rho_layers * n_experts, every
 * other layer NaN; with n_rho_layers 0, n_rho is 0 or n_layers * n_experts (every row). */
typedef struct {
    uint64_t version;
    int unchanged;
    uint64_t step;
    uint32_t n_layers, n_experts;
    float *tau;   /* [n_layers * n_experts] */
    size_t n_rho; /* see above */
    float *rho;
    size_t n_rho_layers;
    uint32_t *rho_layers; /* [n_rho_layers] */
} st_proto_thresholds_t;

/* thresholds: the coordinator's newest table when it is newer than the one the report routed with
 * (NULL: the report routed with the newest). Encode reads the caller's; decode allocates it and
 * cleanup frees it. */
typedef struct {
    uint64_t threshold_version;
    st_proto_thresholds_t *thresholds;
} st_proto_scores_reply_t;

typedef struct {
    char *request_id;
    char *prompt; /* used when n_prompt_tokens == 0 */
    size_t n_prompt_tokens;
    uint32_t *prompt_tokens;
    uint32_t max_tokens;
    float temperature; /* 0 = greedy */
    float top_p;       /* 0 or 1 = off */
    uint32_t top_k;    /* 0 = off */
    uint64_t seed;
    int has_seed;
    size_t n_stop_ids;
    uint32_t *stop_ids;
    int dump_logits;
    int ignore_eos;
    float presence_penalty, frequency_penalty; /* 0 = off */
    size_t n_logit_bias;
    uint32_t *logit_bias_ids; /* [n_logit_bias] */
    float *logit_bias_values; /* [n_logit_bias] */
    int logprobs;             /* each chunk carries its token's logprob ... */
    uint32_t top_logprobs;    /* ... and this many top ones (≤ ST_PROTO_MAX_TOP_LOGPROBS; 0 without logprobs) */
} st_proto_generate_req_t;

/* A token's logprobs travel as values (has_logprob): logprob, and top_ids / top_logprobs [n_top]
 * most likely first; decode checks n_top ≤ ST_PROTO_MAX_TOP_LOGPROBS, the two lists of equal length
 * and none without has_logprob. Ids are the receiver's to check against its vocabulary
 * (st_proto_generate_chunk_check). */
typedef struct {
    uint32_t index, token_id;
    char *text;
    uint8_t *logits; /* fp32 little-endian [vocab] when dump_logits */
    size_t logits_len;
    st_proto_finish_t finish;
    char *error;
    int has_logprob;
    float logprob;
    size_t n_top;
    uint32_t top_ids[ST_PROTO_MAX_TOP_LOGPROBS];
    float top_logprobs[ST_PROTO_MAX_TOP_LOGPROBS];
} st_proto_generate_chunk_t;

typedef struct {
    char *version;
    double uptime_s;
    uint64_t placement_version, threshold_version, step;
    size_t n_members;
    st_proto_member_t *members;
    char *detail_json;
} st_proto_status_reply_t;

#define ST_PROTO_DECLARE(x)                                                                  \
    st_status_t st_proto_##x##_encode(const st_proto_##x##_t *m, uint8_t **out, size_t *len); \
    st_status_t st_proto_##x##_decode(const uint8_t *buf, size_t len, st_proto_##x##_t *out); \
    void st_proto_##x##_cleanup(st_proto_##x##_t *m);

ST_PROTO_DECLARE(register_req)
ST_PROTO_DECLARE(register_reply)
ST_PROTO_DECLARE(heartbeat_req)
ST_PROTO_DECLARE(heartbeat_reply)
ST_PROTO_DECLARE(version_req)
ST_PROTO_DECLARE(placement)
ST_PROTO_DECLARE(scores)
ST_PROTO_DECLARE(scores_reply)
ST_PROTO_DECLARE(thresholds)
ST_PROTO_DECLARE(generate_req)
ST_PROTO_DECLARE(generate_chunk)
ST_PROTO_DECLARE(status_reply)
#undef ST_PROTO_DECLARE

/* A decoded chunk against the receiver's vocabulary: token_id (when the chunk carries a token)
 * and every top id below vocab, logprobs not NaN and not above 0, a logits row of vocab floats or
 * none. ST_ERR_PROTOCOL with the reason in st_err_last() (logged at DEBUG only). */
st_status_t st_proto_generate_chunk_check(const st_proto_generate_chunk_t *m, uint32_t vocab);

/* Encode into a caller's buffer (no allocation: the per-token and per-step messages).
 * ST_ERR_CAPACITY when it does not fit. */
st_status_t st_proto_generate_chunk_encode_into(const st_proto_generate_chunk_t *m, uint8_t *buf, size_t cap, size_t *len);
st_status_t st_proto_scores_encode_into(const st_proto_scores_t *m, uint8_t *buf, size_t cap, size_t *len);
/* Stamp an encoded ScoreSummary with worker_id and member_token (protobuf merge: appended fields
 * win), so a message encoded on another thread can be sent under the registration current on the
 * member's loop. *out: malloc'd, caller free()s. */
st_status_t st_proto_scores_stamp(const uint8_t *buf, size_t len, uint64_t worker_id, const char *member_token,
                                  uint8_t **out, size_t *out_len);

#ifdef __cplusplus
}
#endif
#endif
