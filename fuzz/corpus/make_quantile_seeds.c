/* Writes the seed corpus of fuzz/fuzz_quantile.c (format 2): merge-mode inputs (byte 0 even) that are
 * real summaries against the harness's primed table (COUNT sections with band planes, INIT sections,
 * a truncation, none at all), and build-mode inputs (byte 0 odd) with and without the table.
 *   cc -Icommon/quantile/include -Icommon/base/include fuzz/corpus/make_quantile_seeds.c \
 *      -Lbuild/common/quantile -Lbuild/common -lstrata_quantile -lstrata_base -lm -o /tmp/mkq && /tmp/mkq fuzz/corpus/quantile
 * NOTE: the shape, options and prime must match fuzz_quantile.c's (L 3, N 8, K 2, MAX_T 32, lambda
 * 0.5, history 4, prime = seed 100 with 32 tokens). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/quantile.h"

enum { L = 3, N = 8, K = 2, MAX_T = 32 };
static const char *dir;

static void put(const char *name, uint8_t mode, const void *p, size_t n) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(&mode, 1, 1, f) != 1 || (n && fwrite(p, 1, n, f) != n)) {
        fprintf(stderr, "%s: write failed\n", path);
        exit(1);
    }
    fclose(f);
}

static size_t build(uint8_t *buf, size_t cap, const st_qtable_t *th, uint64_t seed, uint32_t T) {
    st_qsum_t *b;
    if (st_qsum_create(L, N, K, MAX_T, &b) != ST_OK || st_qsum_begin(b, buf, cap, 1, seed, th) != ST_OK) exit(1);
    float sc[MAX_T * N];
    for (uint32_t l = 0; l < L; l++) {
        st_rng_t r = {seed * 31 + l};
        for (uint32_t i = 0; i < T * N; i++) sc[i] = (float)st_rng_uniform(&r);
        if (st_qsum_add_layer(b, l, sc, T) != ST_OK) exit(1);
    }
    size_t len;
    if (st_qsum_finish(b, &len) != ST_OK) exit(1);
    st_qsum_destroy(b);
    return len;
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    dir = argv[1];
    st_qstate_opts_t o;
    st_qstate_opts_default(&o);
    o.history = 4;
    size_t cap = st_qsum_max_bytes(L, N, K, MAX_T);
    uint8_t *buf = malloc(cap), *prime = malloc(cap);
    st_qstate_t *q;
    if (!buf || !prime || st_qstate_create(L, N, K, 0.5, &o, &q) != ST_OK) return 1;
    size_t np = build(prime, cap, NULL, 100, MAX_T);
    st_qtable_t th;
    if (st_qstate_merge(q, prime, np) != ST_OK || st_qstate_end_step(q, &th) != ST_OK) return 1;
    size_t n = build(buf, cap, &th, 5, 17);
    put("count_probed_T17", 0, buf, n);
    put("count_truncated", 0, buf, n - 5);
    n = build(buf, cap, &th, 6, 1);
    put("count_T1", 0, buf, n);
    n = build(buf, cap, NULL, 8, 9);
    put("init_T9", 0, buf, n);
    n = build(buf, cap, NULL, 9, 1);
    put("init_T1", 0, buf, n);
    put("header_only", 0, buf, ST_QSUM_HEADER_BYTES);
    uint8_t b1[3 + 2 * MAX_T * N * L];
    for (size_t i = 0; i < sizeof b1; i++) b1[i] = (uint8_t)(i * 37 + 11);
    b1[0] = 31, b1[1] = 0x87, b1[2] = 0; /* T 32, all layers, on the table, default budget */
    put("build_table_T32", 1, b1, sizeof b1);
    b1[0] = 0, b1[1] = 0x07, b1[2] = 0; /* T 1, all layers, no table */
    put("build_init_T1", 1, b1, 3 + 2 * N * L);
    b1[0] = 15, b1[1] = 0x85, b1[2] = 12; /* T 16, layers 0 and 2, tight budget */
    put("build_budget", 1, b1, 3 + 2 * 16 * N * L);
    st_qstate_destroy(q);
    free(buf);
    free(prime);
    return 0;
}
