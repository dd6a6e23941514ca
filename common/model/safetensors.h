/* Internal: one mmapped safetensors file with its validated header. Not a public interface;
 * ckpt.c builds the checkpoint-wide name table from these. */
#ifndef STRATA_SAFETENSORS_H
#define STRATA_SAFETENSORS_H

#include "strata/model.h"

#define ST_SAFETENSORS_MAX_HEADER (100u * 1024u * 1024u) /* 100 MB: larger is rejected */

typedef struct {
    char *name;    /* full name as stored (owned) */
    st_tensor_t t; /* view into the mapping */
    uint64_t b, e; /* payload offsets */
} st_st_entry_t;

typedef struct {
    char *path;          /* owned */
    void *map;           /* whole file, read-only */
    size_t size;         /* file size */
    size_t payload_off;  /* 8 + N */
    st_st_entry_t *ents; /* n entries, in header order */
    size_t n;
} st_st_file_t;

/* Map and validate one file (errors name the file and tensor). On failure *f is left zeroed.
 * NOTE: a FIFO, directory or device is refused without blocking (opened O_NONBLOCK, then fstat). */
st_status_t st_st_open(st_st_file_t *f, const char *path);
/* Validate a whole safetensors image of size bytes at p (as mapped from a file; errors name `path`)
 * and build its entries, whose views point into p. Outputs written only on success; free the
 * entries with st_st_entries_free. This is what st_st_open runs on the mapping (and fuzz/ on
 * arbitrary bytes). */
st_status_t st_st_parse(const char *path, const uint8_t *p, size_t size, size_t *payload_off, st_st_entry_t **ents,
                        size_t *n);
void st_st_entries_free(st_st_entry_t *ents, size_t n);
void st_st_close(st_st_file_t *f);
/* Parse a dtype name ("BF16", "F16", "F32", "U8"); false when unknown. */
bool st_st_dtype_parse(const char *s, st_dtype_t *out);

#endif
