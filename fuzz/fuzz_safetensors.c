/* libFuzzer harness: the safetensors file format and model.safetensors.index.json, parsed from
 * memory by the same code st_ckpt_open runs on the mmapped shards. The first byte picks the parser
 * (even: a whole .safetensors image, odd: an index). Beyond "no crash": an accepted image has every
 * tensor inside the payload, sized dtype × shape, sorted offsets that do not overlap, and every byte
 * of every tensor is read (ASan sees any view outside the input); an accepted index names only
 * plain, distinct shard files and maps each tensor to one of them. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz/fuzz.h"
#include "common/model/model_impl.h"

static int cmp_begin(const void *a, const void *b) {
    const st_st_entry_t *x = *(const st_st_entry_t *const *)a, *y = *(const st_st_entry_t *const *)b;
    return x->b < y->b ? -1 : x->b > y->b ? 1 : (x->e > y->e) - (x->e < y->e);
}

static void fuzz_image(const uint8_t *p, size_t size) {
    /* an exact-size heap copy, so a view one byte past the input is an ASan report */
    uint8_t *img = malloc(size ? size : 1);
    if (!img) return;
    memcpy(img, p, size);
    size_t off = 0xdead, n = 0xdead;
    st_st_entry_t *ents = (st_st_entry_t *)(uintptr_t)0x1;
    st_status_t s = st_st_parse("fuzz.safetensors", img, size, &off, &ents, &n);
    if (s != ST_OK) {
        FUZZ_REQUIRE(s == ST_ERR_CHECKPOINT || s == ST_ERR_NO_MEMORY);
        FUZZ_REQUIRE(off == 0xdead && n == 0xdead && ents == (st_st_entry_t *)(uintptr_t)0x1);
        free(img);
        return;
    }
    FUZZ_REQUIRE(off >= 9 && off <= size);
    const st_st_entry_t **sorted = malloc((n ? n : 1) * sizeof *sorted);
    FUZZ_REQUIRE(sorted);
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < n; i++) {
        const st_st_entry_t *e = &ents[i];
        FUZZ_REQUIRE(e->name && strcmp(e->name, "__metadata__") != 0);
        FUZZ_REQUIRE(e->t.ndim >= 0 && e->t.ndim <= 4);
        uint64_t numel = 1;
        for (int d = 0; d < e->t.ndim; d++) {
            FUZZ_REQUIRE(e->t.shape[d] >= 0);
            numel *= (uint64_t)e->t.shape[d];
        }
        FUZZ_REQUIRE(e->b <= e->e && e->e <= size - off);
        FUZZ_REQUIRE(e->t.nbytes == e->e - e->b && e->t.nbytes == numel * st_dtype_size(e->t.dtype));
        FUZZ_REQUIRE((const uint8_t *)e->t.data == img + off + e->b);
        for (size_t k = 0; k < e->t.nbytes; k++) sink ^= ((const uint8_t *)e->t.data)[k];
        sorted[i] = e;
    }
    qsort(sorted, n, sizeof *sorted, cmp_begin);
    for (size_t i = 1; i < n; i++) FUZZ_REQUIRE(sorted[i]->b >= sorted[i - 1]->e);
    (void)sink;
    free(sorted);
    st_st_entries_free(ents, n);
    free(img);
}

static void fuzz_index(const uint8_t *p, size_t size) {
    st_st_index_t ix;
    memset(&ix, 0x5a, sizeof ix);
    st_st_index_t before = ix;
    st_status_t s = st_st_index_parse(&ix, "fuzz.index.json", (const char *)p, size);
    if (s != ST_OK) {
        FUZZ_REQUIRE(s == ST_ERR_CHECKPOINT || s == ST_ERR_NO_MEMORY);
        FUZZ_REQUIRE(memcmp(&ix, &before, sizeof ix) == 0);
        return;
    }
    FUZZ_REQUIRE(ix.n_shards >= 1 && ix.n_tensors >= ix.n_shards);
    for (size_t i = 0; i < ix.n_shards; i++) {
        const char *f = ix.shards[i];
        FUZZ_REQUIRE(*f && !strchr(f, '/') && strcmp(f, ".") != 0 && strcmp(f, "..") != 0);
        for (size_t j = 0; j < i; j++) FUZZ_REQUIRE(strcmp(ix.shards[j], f) != 0);
    }
    for (size_t i = 0; i < ix.n_tensors; i++) FUZZ_REQUIRE(ix.tensors[i] && ix.shard_of[i] < ix.n_shards);
    st_st_index_free(&ix);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    if (data[0] & 1)
        fuzz_index(data + 1, size - 1);
    else
        fuzz_image(data + 1, size - 1);
    return 0;
}
