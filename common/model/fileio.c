/* Whole-file reads of the checkpoint's JSON files (config.json, the safetensors index): regular
 * files only, bounded size, never blocking on a FIFO. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model_impl.h"

st_status_t st_model_open_regular(const char *path, st_status_t bad_kind, int *fd_out, struct stat *st) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return ST_FAIL(ST_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    st_status_t s;
    if (fstat(fd, st) != 0)
        s = ST_FAIL(ST_ERR_IO, "cannot stat %s: %s", path, strerror(errno));
    else if (!S_ISREG(st->st_mode))
        s = ST_FAIL(bad_kind, "%s: not a regular file", path);
    else {
        *fd_out = fd;
        return ST_OK;
    }
    close(fd);
    return s;
}

st_status_t st_model_read_file(const char *path, size_t max, st_status_t bad_kind, char **out, size_t *len) {
    int fd;
    struct stat st;
    st_status_t s = st_model_open_regular(path, bad_kind, &fd, &st);
    if (s) return s;
    if (st.st_size < 0 || (uint64_t)st.st_size > max) {
        s = ST_FAIL(bad_kind, "%s: %lld bytes exceeds the limit of %zu", path, (long long)st.st_size, max);
        goto err_fd;
    }
    size_t n = (size_t)st.st_size;
    char *buf = malloc(n + 1);
    if (!buf) {
        s = ST_FAIL(ST_ERR_NO_MEMORY, "reading %s (%zu bytes)", path, n);
        goto err_fd;
    }
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            s = ST_FAIL(ST_ERR_IO, "short read on %s (%zu of %zu bytes)%s%s", path, got, n, r < 0 ? ": " : "",
                        r < 0 ? strerror(errno) : "");
            free(buf);
            goto err_fd;
        }
        got += (size_t)r;
    }
    close(fd);
    buf[n] = 0;
    *out = buf;
    if (len) *len = n;
    return ST_OK;

err_fd:
    close(fd);
    return s;
}
