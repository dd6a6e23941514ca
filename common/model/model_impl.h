/* Internal to common/model: whole-file reads of the checkpoint's JSON files that never block or
 * over-allocate, and the parsers the fuzz harnesses (fuzz/) drive from memory. Not a public
 * interface. */
#ifndef STRATA_MODEL_IMPL_H
#define STRATA_MODEL_IMPL_H

#include <sys/stat.h>

#include "safetensors.h"

#define ST_MODEL_MAX_JSON (64u * 1024u * 1024u) /* config.json, index: larger is rejected */

/* Open path read-only if it is a regular file: *fd (caller closes) and *st on success.
 * NOTE: O_NONBLOCK so that opening a FIFO returns at once and fstat can refuse it (a blocking open
 * waits forever for a writer); it changes nothing for a regular file. A directory, FIFO or device
 * gets `bad_kind` ("not a regular file"); open/fstat failures are ST_ERR_IO. */
st_status_t st_model_open_regular(const char *path, st_status_t bad_kind, int *fd, struct stat *st);

/* Read a whole regular file of at most max bytes; *out is NUL-terminated (caller frees).
 * NOTE: opened with O_NONBLOCK and checked with fstat before any read, so a directory, FIFO or
 * device is refused at once (`bad_kind` status, message "not a regular file") instead of blocking
 * or sizing a buffer from a meaningless length. Open/read failures are ST_ERR_IO. */
st_status_t st_model_read_file(const char *path, size_t max, st_status_t bad_kind, char **out, size_t *len);

/* model.safetensors.index.json, parsed: the distinct shard names (plain file names: no '/', not
 * "." or "..") in first-seen order, and for each tensor the shard that holds it. Owns its strings. */
typedef struct {
    char **shards;
    size_t n_shards;
    char **tensors;     /* [n_tensors] names as written in the index */
    uint32_t *shard_of; /* [n_tensors] index into shards */
    size_t n_tensors;
} st_st_index_t;

/* Parse index text of len bytes (need not be NUL-terminated). Errors are ST_ERR_CHECKPOINT naming
 * `path`; *ix written only on success. */
st_status_t st_st_index_parse(st_st_index_t *ix, const char *path, const char *text, size_t len);
void st_st_index_free(st_st_index_t *ix);

#endif
