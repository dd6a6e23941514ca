/* safetensors reader: mmap one file read-only and validate its header (length, JSON, dtypes,
 * shapes, offsets inside the payload, sizes = dtype × shape, no overlaps). Knows nothing of
 * indexes or tensor names; see ckpt.c. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model_impl.h"

const char *st_dtype_name(st_dtype_t t) {
    switch (t) {
    case ST_DT_F32: return "F32";
    case ST_DT_BF16: return "BF16";
    case ST_DT_F16: return "F16";
    case ST_DT_U8: return "U8";
    case ST_DT_MXFP4: return "MXFP4";
    }
    return "?";
}

size_t st_dtype_size(st_dtype_t t) {
    switch (t) {
    case ST_DT_F32: return 4;
    case ST_DT_BF16: return 2;
    case ST_DT_F16: return 2;
    case ST_DT_U8: return 1;
    case ST_DT_MXFP4: return 0;
    }
    return 0;
}

bool st_st_dtype_parse(const char *s, st_dtype_t *out) {
    static const struct { const char *n; st_dtype_t t; } k[] = {
        {"BF16", ST_DT_BF16}, {"F16", ST_DT_F16}, {"F32", ST_DT_F32}, {"U8", ST_DT_U8}};
    for (size_t i = 0; i < ST_ARRAY_LEN(k); i++)
        if (strcmp(s, k[i].n) == 0) {
            *out = k[i].t;
            return true;
        }
    return false;
}

void st_st_entries_free(st_st_entry_t *ents, size_t n) {
    for (size_t i = 0; i < n; i++) free(ents[i].name);
    free(ents);
}

void st_st_close(st_st_file_t *f) {
    if (!f) return;
    st_st_entries_free(f->ents, f->n);
    if (f->map) munmap(f->map, f->size);
    free(f->path);
    memset(f, 0, sizeof *f);
}

/* Non-negative integer JSON value that fits in u64 (jansson integers are signed 64-bit). */
static bool json_u64(json_t *v, uint64_t *out) {
    if (!json_is_integer(v)) return false;
    json_int_t x = json_integer_value(v);
    if (x < 0) return false;
    *out = (uint64_t)x;
    return true;
}

static int cmp_off(const void *a, const void *b) {
    const st_st_entry_t *x = *(const st_st_entry_t *const *)a, *y = *(const st_st_entry_t *const *)b;
    if (x->b != y->b) return x->b < y->b ? -1 : 1;
    if (x->e != y->e) return x->e < y->e ? -1 : 1;
    return 0;
}

/* Parse and validate the JSON header into ents. `payload` = bytes after the header. */
static st_status_t parse_header(const char *path, const char *hdr, size_t hlen, uint64_t payload,
                                const uint8_t *pdata, st_st_entry_t **out, size_t *n_out) {
    json_error_t jerr;
    json_t *root = json_loadb(hdr, hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) return ST_FAIL(ST_ERR_CHECKPOINT, "%s: header is not valid JSON (%s)", path, jerr.text);
    st_status_t s = ST_OK;
    st_st_entry_t *ents = NULL, **sorted = NULL;
    size_t n = 0;
    if (!json_is_object(root)) {
        s = ST_FAIL(ST_ERR_CHECKPOINT, "%s: header is not a JSON object", path);
        goto err_root;
    }
    size_t cap = json_object_size(root);
    ents = calloc(cap ? cap : 1, sizeof *ents);
    if (!ents) {
        s = ST_FAIL(ST_ERR_NO_MEMORY, "%s: %zu header entries", path, cap);
        goto err_root;
    }
    const char *name;
    json_t *v;
    json_object_foreach(root, name, v) {
        if (strcmp(name, "__metadata__") == 0) continue;
        if (!json_is_object(v)) {
            s = ST_FAIL(ST_ERR_CHECKPOINT, "%s: tensor '%s': header entry is not an object", path, name);
            goto err_ents;
        }
        json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"),
               *jo = json_object_get(v, "data_offsets");
        st_st_entry_t *en = &ents[n];
        if (!json_is_string(jd)) {
            s = ST_FAIL(ST_ERR_CHECKPOINT, "%s: tensor '%s': missing dtype", path, name);
            goto err_ents;
        }
        if (!st_st_dtype_parse(json_string_value(jd), &en->t.dtype)) {
            s = ST_FAIL(ST_ERR_CHECKPOINT, "%s: tensor '%s': unsupported dtype %s (BF16, F16, F32, U8)", path, name,
                        json_string_value(jd));
            goto err_ents;
        }
        if (!json_is_array(js) || json_array_size(js) > 4) {
            s = ST_FAIL(ST_ERR_CHECKPOINT, "%s: tensor '%s': shape must be a list of at most 4 dims", path, name);
            goto err_ents;
        }
        en->t.ndim = (int)json_array_size(js);
        uint64_t numel = 1;
        bool ovf = false;
        for (int d = 0; d < en->t.ndim; d++) {
            uint64_t dim;
            if (!json_u64(json_array_get(js, (size_t)d), &dim) || dim > (1ull << 40)) {
                s = ST_FAIL(ST_ERR_CHECKPOINT, "%s: tensor '%s': shape dim %d is not a non-negative integer", path,
                            name, d);
                goto err_ents;
            }
            en->t.shape[d] = (int64_t)dim;
            if (dim && numel > UINT64_MAX / dim) ovf = true;
            numel *= dim;
        }
        uint64_t esz = st_dtype_size(en->t.dtype);
        if (ovf || numel > UINT64_MAX / esz) {
            s = ST_FAIL(ST_ERR_CHECKPOINT, "%s: tensor '%s': shape too large", path, name);
            goto err_ents;
        }
        if (!json_is_array(jo) || json_array_size(jo) != 2 || !json_u64(json_array_get(jo, 0), &en->b) ||
            !json_u64(json_array_get(jo, 1), &en->e)) {
            s = ST_FAIL(ST_ERR_CHECKPOINT, "%s: tensor '%s': data_offsets must be [begin, end]", path, name);
            goto err_ents;
        }
        if (en->b > en->e || en->e > payload) {
            s = ST_FAIL(ST_ERR_CHECKPOINT,
                        "%s: tensor '%s': data_offsets [%llu, %llu] outside the payload of %llu bytes", path, name,
                        (unsigned long long)en->b, (unsigned long long)en->e, (unsigned long long)payload);
            goto err_ents;
        }
        if (en->e - en->b != numel * esz) {
            s = ST_FAIL(ST_ERR_CHECKPOINT, "%s: tensor '%s': %llu bytes stored but %s × %llu elements needs %llu",
                        path, name, (unsigned long long)(en->e - en->b), st_dtype_name(en->t.dtype),
                        (unsigned long long)numel, (unsigned long long)(numel * esz));
            goto err_ents;
        }
        en->name = strdup(name);
        if (!en->name) {
            s = ST_FAIL(ST_ERR_NO_MEMORY, "%s: tensor name", path);
            goto err_ents;
        }
        en->t.data = pdata + en->b;
        en->t.nbytes = (size_t)(en->e - en->b);
        n++;
    }
    /* NOTE: overlap check by sorting a pointer copy, so ents keep header order. */
    if (n > 1) {
        sorted = malloc(n * sizeof *sorted);
        if (!sorted) {
            s = ST_FAIL(ST_ERR_NO_MEMORY, "%s: sorting %zu tensors", path, n);
            goto err_ents;
        }
        for (size_t i = 0; i < n; i++) sorted[i] = &ents[i];
        qsort(sorted, n, sizeof *sorted, cmp_off);
        for (size_t i = 1; i < n; i++)
            if (sorted[i]->b < sorted[i - 1]->e) {
                s = ST_FAIL(ST_ERR_CHECKPOINT, "%s: tensors '%s' [%llu, %llu] and '%s' [%llu, %llu] overlap", path,
                            sorted[i - 1]->name, (unsigned long long)sorted[i - 1]->b,
                            (unsigned long long)sorted[i - 1]->e, sorted[i]->name, (unsigned long long)sorted[i]->b,
                            (unsigned long long)sorted[i]->e);
                goto err_sorted;
            }
        free(sorted);
    }
    json_decref(root);
    *out = ents;
    *n_out = n;
    return ST_OK;

err_sorted:
    free(sorted);
err_ents:
    st_st_entries_free(ents, n);
err_root:
    json_decref(root);
    return s;
}

st_status_t st_st_parse(const char *path, const uint8_t *p, size_t size, size_t *payload_off, st_st_entry_t **ents,
                        size_t *n) {
    if (size < 8) return ST_FAIL(ST_ERR_CHECKPOINT, "%s: truncated (%zu bytes, no header length)", path, size);
    uint64_t hn = 0;
    for (int i = 7; i >= 0; i--) hn = (hn << 8) | p[i]; /* little-endian */
    if (hn == 0) return ST_FAIL(ST_ERR_CHECKPOINT, "%s: header length is 0", path);
    if (hn > size - 8)
        return ST_FAIL(ST_ERR_CHECKPOINT, "%s: header length %llu exceeds the file (%zu bytes)", path,
                       (unsigned long long)hn, size);
    if (hn > ST_SAFETENSORS_MAX_HEADER)
        return ST_FAIL(ST_ERR_CHECKPOINT, "%s: header length %llu exceeds the 100 MB limit", path,
                       (unsigned long long)hn);
    /* trailing padding (spaces by the format; NULs seen from some writers) */
    size_t hlen = (size_t)hn;
    while (hlen > 0 && (p[8 + hlen - 1] == ' ' || p[8 + hlen - 1] == 0)) hlen--;
    size_t off = 8 + (size_t)hn;
    st_status_t s = parse_header(path, (const char *)p + 8, hlen, size - off, p + off, ents, n);
    if (s) return s;
    *payload_off = off;
    return ST_OK;
}

st_status_t st_st_open(st_st_file_t *f, const char *path) {
    memset(f, 0, sizeof *f);
    int fd;
    struct stat stt;
    st_status_t s = st_model_open_regular(path, ST_ERR_CHECKPOINT, &fd, &stt);
    if (s) return s;
    size_t size = (size_t)stt.st_size;
    if (size < 8) {
        s = ST_FAIL(ST_ERR_CHECKPOINT, "%s: truncated (%zu bytes, no header length)", path, size);
        goto err_fd;
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        s = ST_FAIL(ST_ERR_IO, "cannot mmap %s: %s", path, strerror(errno));
        goto err_fd;
    }
    close(fd);
    fd = -1;
    f->path = strdup(path);
    if (!f->path) {
        s = ST_FAIL(ST_ERR_NO_MEMORY, "%s", path);
        goto err_map;
    }
    s = st_st_parse(path, map, size, &f->payload_off, &f->ents, &f->n);
    if (s) goto err_path;
    f->map = map;
    f->size = size;
    return ST_OK;

err_path:
    free(f->path);
err_map:
    munmap(map, size);
err_fd:
    if (fd >= 0) close(fd);
    memset(f, 0, sizeof *f);
    return s;
}
