/* Weight decode: F32/BF16/F16 rows and MXFP4 (OCP E2M1 codes, E8M0 group-32 scales; see
 * notes/checkpoint-layout.md §6) into fp32. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "strata/model.h"

static const float k_e2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

float st_mxfp4_value(uint8_t nibble, uint8_t scale) {
    float v = k_e2m1[nibble & 7];
    if (nibble & 8) v = -v;
    /* NOTE: E8M0 0xFF is +inf in the reference (no clamp); ldexpf(…, 128) gives inf as well. */
    return ldexpf(v, (int)scale - 127);
}

/* NOTE: element loads go through memcpy: a tensor's payload offset in a safetensors file need not be
 * a multiple of its element size, so a uint16_t/float pointer into the mapping may be misaligned
 * (undefined behaviour, and a UBSan report, if dereferenced). The compiler turns these into plain
 * (unaligned) vector loads. */
static inline uint16_t ld16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* bf16 → fp32 is a 16-bit shift; O3 lets GCC vectorise it (SSE4.1 on x86-64-v2) */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("O3")))
#endif
static void bf16_row(float *restrict out, const uint8_t *restrict src, size_t n) {
    for (size_t c = 0; c < n; c++) {
        uint32_t u = (uint32_t)ld16(src + 2 * c) << 16;
        memcpy(&out[c], &u, 4);
    }
}

void st_weight_rows_f32(const st_weight_t *w, int r0, int n, float *dst) {
    size_t cols = (size_t)w->cols;
    for (int r = 0; r < n; r++) {
        size_t row = (size_t)(r0 + r);
        float *out = dst + (size_t)r * cols;
        switch (w->dtype) {
        case ST_DT_F32: {
            memcpy(out, (const uint8_t *)w->data + 4 * row * cols, cols * sizeof(float));
            break;
        }
        case ST_DT_BF16: {
            /* NOTE: written as a 16→32-bit shift so the compiler vectorises it: this decode is
             * most of a CPU decode step (every step re-reads the weights it touches) */
            bf16_row(out, (const uint8_t *)w->data + 2 * row * cols, cols);
            break;
        }
        case ST_DT_F16: {
            const uint8_t *src = (const uint8_t *)w->data + 2 * row * cols;
            for (size_t c = 0; c < cols; c++) out[c] = st_f16_to_f32(ld16(src + 2 * c));
            break;
        }
        case ST_DT_MXFP4: {
            const uint8_t *codes = (const uint8_t *)w->data + row * (cols / 2);
            const uint8_t *sc = w->scale + row * (cols / 32);
            for (size_t g = 0; g < cols / 32; g++) {
                float mul = ldexpf(1.0f, (int)sc[g] - 127);
                for (size_t j = 0; j < 16; j++) {
                    uint8_t b = codes[g * 16 + j];
                    float lo = k_e2m1[b & 7], hi = k_e2m1[(b >> 4) & 7];
                    out[g * 32 + 2 * j] = ((b & 8) ? -lo : lo) * mul;
                    out[g * 32 + 2 * j + 1] = ((b & 0x80) ? -hi : hi) * mul;
                }
            }
            break;
        }
        case ST_DT_U8: {
            const uint8_t *src = (const uint8_t *)w->data + row * cols;
            for (size_t c = 0; c < cols; c++) out[c] = (float)src[c];
            break;
        }
        }
    }
}
