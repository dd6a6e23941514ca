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

    /* Regression (issue 13, UBSan "misaligned load" at mxfp4.c:20): a safetensors payload offset need
     * not be a multiple of the element size, so BF16/F16/F32 rows may start at an odd address. The
     * decode must give the same values there (and, under UBSan, not load a misaligned uint16_t). */
    {
        enum { R = 3, C = 37 }; /* odd width: the vector loop's tail too */
        uint8_t raw[1 + 4 * R * C];
        float ref[R * C], got[R * C];
        st_rng_t rng = {5};
        for (int i = 0; i < R * C; i++) ref[i] = st_bf16_to_f32(st_f32_to_bf16(st_rng_normal(&rng)));
        for (int i = 0; i < R * C; i++) {
            uint16_t h = st_f32_to_bf16(ref[i]);
            memcpy(raw + 1 + 2 * i, &h, 2);
        }
        st_weight_t wb = {ST_DT_BF16, R, C, raw + 1, NULL};
        st_weight_rows_f32(&wb, 0, R, got);
        CHECK(memcmp(got, ref, sizeof ref) == 0, "BF16 rows at an odd address");
        st_weight_rows_f32(&wb, 2, 1, got);
        CHECK(memcmp(got, ref + 2 * C, C * sizeof(float)) == 0, "BF16 row 2 at an odd address");
        for (int i = 0; i < R * C; i++) {
            ref[i] = st_f16_to_f32(st_f32_to_f16(ref[i]));
            uint16_t h = st_f32_to_f16(ref[i]);
            memcpy(raw + 1 + 2 * i, &h, 2);
        }
        st_weight_t wh = {ST_DT_F16, R, C, raw + 1, NULL};
        st_weight_rows_f32(&wh, 0, R, got);
        CHECK(memcmp(got, ref, sizeof ref) == 0, "F16 rows at an odd address");
        memcpy(raw + 1, ref, sizeof ref);
        st_weight_t wf = {ST_DT_F32, R, C, raw + 1, NULL};
        st_weight_rows_f32(&wf, 1, 2, got);
        CHECK(memcmp(got, ref + C, 2 * C * sizeof(float)) == 0, "F32 rows at an odd address");
    }

    /* E8M0 extremes: the reference has no clamp */
    CHECK(isinf(st_mxfp4_value(2, 0xFF)) && st_mxfp4_value(2, 0xFF) > 0, "scale 0xFF → +inf");
    CHECK(st_mxfp4_value(2, 0) == ldexpf(1.0f, -127), "scale 0 → 2^-127");
    CHECK(st_mxfp4_value(15, 127) == -6.0f && st_mxfp4_value(7, 127) == 6.0f, "±6");
    return st_test_done();
}
