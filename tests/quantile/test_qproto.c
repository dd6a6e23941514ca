/* proto: the quantile messages at format 2 (issue 16). Thresholds carry rho only for the probed
 * layers (rho_layers) and still accept the whole-table form; ScoreSummary carries loads for a window
 * of whole layers (load_first_layer). Round trips, and every malformed shape refused at encode and
 * decode with the output untouched. */
#include <math.h>
#include <stdlib.h>

#include "harness.h"
#include "strata/proto.h"

enum { L = 4, E = 3 };

/* A Thresholds message as the wire would carry it, bypassing encode's checks: tau full, rho rows
 * for `layers` (n_rho values), all hand-made (field 6 tau, 7 rho, 8 rho_layers; packed). */
static size_t raw_thresholds(uint8_t *b, const uint32_t *layers, size_t nl, size_t n_rho) {
    size_t n = 0;
    b[n++] = 0x08, b[n++] = 3;             /* version 3 */
    b[n++] = 0x20, b[n++] = L;             /* n_layers */
    b[n++] = 0x28, b[n++] = E;             /* n_experts */
    b[n++] = (6 << 3) | 2, b[n++] = L * E * 4; /* tau */
    memset(b + n, 0, L * E * 4), n += L * E * 4;
    if (n_rho) {
        b[n++] = (7 << 3) | 2, b[n++] = (uint8_t)(n_rho * 4);
        memset(b + n, 0, n_rho * 4), n += n_rho * 4;
    }
    if (nl) {
        b[n++] = (8 << 3) | 2, b[n++] = (uint8_t)nl;
        for (size_t i = 0; i < nl; i++) b[n++] = (uint8_t)layers[i];
    }
    return n;
}

int main(void) {
    float tau[L * E], rho[2 * E];
    for (int i = 0; i < L * E; i++) tau[i] = i < E ? NAN : 0.1f * (float)i;
    for (int i = 0; i < 2 * E; i++) rho[i] = 0.05f * (float)(i + 1);
    uint32_t layers[2] = {1, 3};
    st_proto_thresholds_t t = {.version = 7, .step = 7, .n_layers = L, .n_experts = E, .tau = tau, .n_rho = 2 * E,
                               .rho = rho, .n_rho_layers = 2, .rho_layers = layers}, d;
    uint8_t *b;
    size_t n, n_full;
    CHECK(st_proto_thresholds_encode(&t, &b, &n) == ST_OK, "encode thresholds with rho for layers 1 and 3");
    CHECK(st_proto_thresholds_decode(b, n, &d) == ST_OK && d.version == 7 && d.n_rho_layers == 2 && d.rho_layers[0] == 1 &&
              d.rho_layers[1] == 3 && d.n_rho == 2 * E && d.rho[4] == rho[4] && isnan(d.tau[0]) && d.tau[5] == tau[5],
          "sparse rho round trips");
    st_proto_thresholds_cleanup(&d);
    free(b);
    float rho_full[L * E];
    for (int i = 0; i < L * E; i++) rho_full[i] = NAN;
    st_proto_thresholds_t tf = t;
    tf.rho = rho_full, tf.n_rho = L * E, tf.n_rho_layers = 0, tf.rho_layers = NULL;
    CHECK(st_proto_thresholds_encode(&tf, &b, &n_full) == ST_OK && st_proto_thresholds_decode(b, n_full, &d) == ST_OK &&
              d.n_rho == L * E && d.n_rho_layers == 0,
          "the whole-table rho form still round trips");
    st_proto_thresholds_cleanup(&d);
    free(b);
    CHECK(n_full > n, "the sparse form is smaller (%zu < %zu bytes)", n, n_full);
    /* encode refuses bad layer lists */
    uint32_t bad_order[2] = {3, 1}, bad_range[2] = {1, L};
    t.rho_layers = bad_order;
    CHECK(st_proto_thresholds_encode(&t, &b, &n) == ST_ERR_INVALID_ARG, "encode: layers out of order refused");
    t.rho_layers = bad_range;
    CHECK(st_proto_thresholds_encode(&t, &b, &n) == ST_ERR_INVALID_ARG, "encode: a layer out of range refused");
    t.rho_layers = layers, t.n_rho = E;
    CHECK(st_proto_thresholds_encode(&t, &b, &n) == ST_ERR_INVALID_ARG, "encode: rho not rows x layers refused");
    /* decode refuses them too (hand-made bytes), output untouched */
    uint8_t raw[256];
    memset(&d, 0x5a, sizeof d);
    n = raw_thresholds(raw, layers, 2, 2 * E);
    CHECK(st_proto_thresholds_decode(raw, n, &d) == ST_OK && d.n_rho_layers == 2, "hand-made sparse thresholds decode");
    st_proto_thresholds_cleanup(&d);
    memset(&d, 0x5a, sizeof d);
    n = raw_thresholds(raw, bad_order, 2, 2 * E);
    CHECK(st_proto_thresholds_decode(raw, n, &d) == ST_ERR_PROTOCOL && d.version == 0x5a5a5a5a5a5a5a5aull, "decode: order");
    n = raw_thresholds(raw, bad_range, 2, 2 * E);
    CHECK(st_proto_thresholds_decode(raw, n, &d) == ST_ERR_PROTOCOL, "decode: range");
    n = raw_thresholds(raw, layers, 2, E);
    CHECK(st_proto_thresholds_decode(raw, n, &d) == ST_ERR_PROTOCOL, "decode: rho of one row for two layers");
    n = raw_thresholds(raw, layers, 2, 0);
    CHECK(st_proto_thresholds_decode(raw, n, &d) == ST_ERR_PROTOCOL, "decode: layers without rho");
    n = raw_thresholds(raw, layers, 0, 2 * E);
    CHECK(st_proto_thresholds_decode(raw, n, &d) == ST_ERR_PROTOCOL, "decode: partial rho without its layers");

    /* ScoreSummary: loads of layers 2..3 */
    uint32_t load[2 * E] = {1, 2, 3, 4, 5, 600000};
    st_proto_scores_t s = {.worker_id = 9, .step = 4, .n_layers = L, .n_experts = E, .load_first_layer = 2,
                           .n_load = 2 * E, .load = load}, sd;
    CHECK(st_proto_scores_encode(&s, &b, &n) == ST_OK && st_proto_scores_decode(b, n, &sd) == ST_OK &&
              sd.load_first_layer == 2 && sd.n_load == 2 * E && sd.load[5] == 600000,
          "a load window round trips");
    st_proto_scores_cleanup(&sd);
    free(b);
    s.load_first_layer = 3;
    CHECK(st_proto_scores_encode(&s, &b, &n) == ST_ERR_INVALID_ARG, "encode: a window past the last layer refused");
    s.load_first_layer = 0, s.n_load = E + 1;
    CHECK(st_proto_scores_encode(&s, &b, &n) == ST_ERR_INVALID_ARG, "encode: a partial layer refused");
    /* decode: encode a legal window over 4 layers, then claim it starts at layer 1 (appended field wins) */
    uint32_t load4[L * E] = {0};
    s.load = load4, s.n_load = L * E, s.load_first_layer = 0;
    CHECK(st_proto_scores_encode(&s, &b, &n) == ST_OK, "encode all layers");
    uint8_t *b2 = malloc(n + 2);
    memcpy(b2, b, n);
    b2[n] = 13 << 3, b2[n + 1] = 1; /* load_first_layer = 1 */
    memset(&sd, 0x5a, sizeof sd);
    CHECK(st_proto_scores_decode(b2, n + 2, &sd) == ST_ERR_PROTOCOL && sd.step == 0x5a5a5a5a5a5a5a5aull,
          "decode: a window past the last layer refused, output untouched");
    free(b2);
    free(b);
    return st_test_done();
}
