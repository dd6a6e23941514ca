/* Minimal .npy (v1.0) writer for float32 C-order 2-D arrays, streamed row block by row block. */
#include <stdio.h>

#include "cli.h"

st_status_t st_npy_open(st_npy_t *n, const char *path, int cols) {
    n->f = fopen(path, "wb+");
    if (!n->f) return ST_FAIL(ST_ERR_IO, "cannot create %s", path);
    n->rows = 0;
    n->cols = cols;
    /* header written with a placeholder row count; fixed up at close (padded to 128 bytes) */
    char hdr[128];
    memset(hdr, ' ', sizeof hdr);
    memcpy(hdr, "\x93NUMPY\x01\x00", 8);
    hdr[8] = 118; hdr[9] = 0; /* header length = 128 - 10 */
    hdr[127] = '\n';
    if (fwrite(hdr, 1, sizeof hdr, n->f) != sizeof hdr) return ST_FAIL(ST_ERR_IO, "write %s", path);
    return ST_OK;
}

st_status_t st_npy_append(st_npy_t *n, const float *rows, int count) {
    if (fwrite(rows, sizeof(float), (size_t)count * (size_t)n->cols, n->f) != (size_t)count * (size_t)n->cols)
        return ST_FAIL(ST_ERR_IO, "short write of logits");
    n->rows += count;
    return ST_OK;
}

st_status_t st_npy_close(st_npy_t *n) {
    char dict[118];
    memset(dict, ' ', sizeof dict);
    int k = snprintf(dict, sizeof dict, "{'descr': '<f4', 'fortran_order': False, 'shape': (%d, %d), }", n->rows, n->cols);
    dict[k] = ' ';
    dict[117] = '\n';
    st_status_t s = ST_OK;
    if (fseek(n->f, 10, SEEK_SET) != 0 || fwrite(dict, 1, sizeof dict, n->f) != sizeof dict)
        s = ST_FAIL(ST_ERR_IO, "cannot finish .npy header");
    if (fclose(n->f) != 0 && s == ST_OK) s = ST_FAIL(ST_ERR_IO, "close .npy");
    n->f = NULL;
    return s;
}
