/* Internal to common/quantile: little-endian field access and record flags shared by the builder
 * and the coordinator. Byte map: docs/quantile.md. */
#ifndef STRATA_QUANTILE_INTERNAL_H
#define STRATA_QUANTILE_INTERNAL_H

#include <stdint.h>
#include <string.h>

#include "strata/quantile.h"

#define ST_Q_REC_EXPLICIT 0x8000u /* format 1: record carries its own cut and tie count */

/* Format 2 (counting estimator) sections and planes; byte map in docs/quantile.md. */
enum { ST_QC_KIND_COUNT = 1, ST_QC_KIND_INIT = 2 };
#define ST_QC_FLAG_BAND 0x1u  /* COUNT section: a band plane follows the count plane */
#define ST_QC_PLANE_HDR 8u    /* u32 base, u8 width, u8 0, u16 n_exceptions */
#define ST_QC_EXC_BYTES 6u    /* u16 expert, u32 value */
#define ST_QC_INIT_HDR 8u     /* u32 r1, u32 r2 */

/* Header field offsets (ST_QSUM_HEADER_BYTES = 48). */
enum {
    ST_QH_MAGIC = 0, ST_QH_FORMAT = 4, ST_QH_HDR_BYTES = 6, ST_QH_TOTAL = 8, ST_QH_LAYERS = 12,
    ST_QH_EXPERTS = 16, ST_QH_K = 20, ST_QH_TAU_VERSION = 24, ST_QH_WORKER = 32, ST_QH_SECTIONS = 36,
    ST_QH_STEP = 40,
};

/* Value of rank r (1-based) in descending order of x[0..n); reorders x (qxsum.c: quickselect with a
 * three-way partition, so long runs of ties cost one pass). Both summary builders use it. */
float st_q_select_desc(float *x, uint32_t n, uint32_t r);
/* The checks of a summary's 48-byte header both coordinators' merges make first: length, magic, format,
 * header size, total length, shape [L, n] and k. A client's mistake: ST_ERR_PROTOCOL, logged at DEBUG. */
st_status_t st_q_check_header(const uint8_t *b, size_t len, uint16_t format, uint32_t L, uint32_t n, uint32_t k,
                              const char *who);

static inline void st_q_put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static inline void st_q_put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void st_q_put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void st_q_putf(uint8_t *p, float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    st_q_put32(p, u);
}
static inline uint16_t st_q_get16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t st_q_get32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline uint64_t st_q_get64(const uint8_t *p) { return (uint64_t)st_q_get32(p) | ((uint64_t)st_q_get32(p + 4) << 32); }
static inline float st_q_getf(const uint8_t *p) {
    uint32_t u = st_q_get32(p);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#endif
