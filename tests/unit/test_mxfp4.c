/* MXFP4 decode against the real-checkpoint test vectors of checkpoint-layout §6, through both
 * st_mxfp4_value and st_weight_rows_f32 (nibble order, sign bit, E8M0 scale, group indexing). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"
#include "strata/model.h"

/* OCP E2M1, written out here independently of mxfp4.c */
static float e2m1_ref(uint8_t code, int scale) {
    static const float mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    float v = mag[code & 7] * (float)pow(2.0, scale - 127);
    return (code & 8) ? -v : v;
}

int main(void) {
    /* vector 1: layer 4, expert 0, w1, row 0, group 0 */
    const uint8_t b1[16] = {0xAB, 0x4C, 0x18, 0x65, 0x2C, 0x91, 0x04, 0x39,
                            0x48, 0x94, 0x58, 0x33, 0x94, 0xB5, 0x5B, 0x30};
    const uint8_t s1 = 0x79;
    const uint16_t bf16_prefix[6] = {0xBCC0, 0xBC80, 0xBD00, 0x3D00, 0x8000, 0x3C00};
    float want[32], got_v[32], got_rows[32];
    for (int j = 0; j < 16; j++) {
        want[2 * j] = e2m1_ref(b1[j] & 15, s1);      /* low nibble = even column */
        want[2 * j + 1] = e2m1_ref(b1[j] >> 4, s1);  /* high nibble = odd column */
        got_v[2 * j] = st_mxfp4_value(b1[j] & 15, s1);
        got_v[2 * j + 1] = st_mxfp4_value(b1[j] >> 4, s1);
    }
    int bad = 0;
    for (int i = 0; i < 6; i++) bad += st_f32_to_bf16(want[i]) != bf16_prefix[i];
    CHECK(bad == 0, "expected values disagree with the listed bf16 prefix");
    bad = 0;
    for (int i = 0; i < 6; i++) bad += st_f32_to_bf16(got_v[i]) != bf16_prefix[i];
    CHECK(bad == 0, "st_mxfp4_value: bf16 prefix BCC0 BC80 BD00 3D00 8000 3C00");
    CHECK(memcmp(got_v, want, sizeof want) == 0, "st_mxfp4_value: all 32 values");
    CHECK(signbit(got_v[4]) && got_v[4] == 0.0f, "code 8 is -0");
    st_weight_t w = {ST_DT_MXFP4, 1, 32, b1, &s1};
    st_weight_rows_f32(&w, 0, 1, got_rows);
    CHECK(memcmp(got_rows, want, sizeof want) == 0, "st_weight_rows_f32: all 32 values");
    bad = 0;
    for (int i = 0; i < 6; i++) bad += st_f32_to_bf16(got_rows[i]) != bf16_prefix[i];
    CHECK(bad == 0, "st_weight_rows_f32: bf16 prefix");

    /* vector 2: layer 1, expert 0, w1: bytes [22,185,206,35], scale 121 */
    const float v2[8] = {0.0625f, 0.0078125f, -0.0078125f, -0.0234375f, -0.0625f, -0.03125f, 0.0234375f, 0.015625f};
    const uint8_t codes2[8] = {6, 1, 9, 11, 14, 12, 3, 2};
    const uint8_t b2[4] = {22, 185, 206, 35};
    bad = 0;
    for (int j = 0; j < 4; j++) {
        bad += (b2[j] & 15) != codes2[2 * j] || (b2[j] >> 4) != codes2[2 * j + 1];
        bad += st_mxfp4_value(b2[j] & 15, 121) != v2[2 * j];
        bad += st_mxfp4_value(b2[j] >> 4, 121) != v2[2 * j + 1];
    }
    CHECK(bad == 0, "vector 2 exact");

    /* a packed 2 × 64 matrix: row 1 = [vector 2 bytes, zeros | vector 1 bytes], scales [121, 0x79+2];
     * decode row 1 alone (r0 = 1) to check row and group offsets */
    uint8_t packed[2][32], scales[2][2] = {{127, 127}, {121, 0x79 + 2}};
    memset(packed, 0x77, sizeof packed); /* row 0: all 6.0 */
    memset(packed[1], 0, 16);
    memcpy(packed[1], b2, 4);
    memcpy(packed[1] + 16, b1, 16);
    st_weight_t m = {ST_DT_MXFP4, 2, 64, packed, &scales[0][0]};
    float row[64];
    st_weight_rows_f32(&m, 1, 1, row);
    bad = 0;
    for (int i = 0; i < 8; i++) bad += row[i] != v2[i];
    for (int i = 8; i < 32; i++) bad += row[i] != 0.0f;
    for (int i = 0; i < 32; i++) bad += row[32 + i] != want[i] * 4.0f;
    CHECK(bad == 0, "packed row 1: %d mismatches", bad);
    float both[128];
    st_weight_rows_f32(&m, 0, 2, both);
    CHECK(both[0] == 6.0f && both[63] == 6.0f && memcmp(both + 64, row, sizeof row) == 0, "two rows at once");

    /* E8M0 extremes: the reference has no clamp */
    CHECK(isinf(st_mxfp4_value(2, 0xFF)) && st_mxfp4_value(2, 0xFF) > 0, "scale 0xFF → +inf");
    CHECK(st_mxfp4_value(2, 0) == ldexpf(1.0f, -127), "scale 0 → 2^-127");
    CHECK(st_mxfp4_value(15, 127) == -6.0f && st_mxfp4_value(7, 127) == 6.0f, "±6");
    return st_test_done();
}
