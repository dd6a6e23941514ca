/* Status strings, logging, last-error text, time, f16, RNG, arenas and file helpers. */
#include "strata/base.h"

#include <errno.h>
#include <unistd.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <time.h>

const char *st_status_str(st_status_t s) {
    switch (s) {
    case ST_OK: return "ok";
    case ST_ERR_INVALID_ARG: return "invalid argument";
    case ST_ERR_OUT_OF_RANGE: return "out of range";
    case ST_ERR_CAPACITY: return "capacity exhausted";
    case ST_ERR_TIMEOUT: return "timed out";
    case ST_ERR_CANCELLED: return "cancelled";
    case ST_ERR_AUTH: return "unauthenticated";
    case ST_ERR_NOT_FOUND: return "not found";
    case ST_ERR_CONFIG: return "bad config";
    case ST_ERR_CHECKPOINT: return "bad checkpoint";
    case ST_ERR_IO: return "I/O error";
    case ST_ERR_PARSE: return "parse error";
    case ST_ERR_PEER: return "peer failure";
    case ST_ERR_PROTOCOL: return "protocol error";
    case ST_ERR_NO_MEMORY: return "out of memory";
    case ST_ERR_DEVICE: return "device error";
    case ST_ERR_UNSUPPORTED: return "unsupported";
    case ST_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}

static st_log_level_t g_level = ST_LOG_INFO;
static st_log_format_t g_format = ST_LOG_TEXT;
static const char *g_tag = "strata";
static int g_level_read = 0, g_format_read = 0; /* NOTE: a race only reads the table twice */

void st_log_set_level(st_log_level_t lvl) {
    g_level = lvl;
    g_level_read = 1; /* an explicit level wins over the table's */
}
void st_log_set_format(st_log_format_t f) {
    g_format = f;
    g_format_read = 1;
}
void st_log_set_tag(const char *tag) { g_tag = tag; }

/* the level and format of the configuration table's LOG and LOG_FORMAT entries, at the first line */
static void log_level_once(void) {
    if (!g_level_read) {
        g_level = (st_log_level_t)st_tun_int(ST_TUN_LOG);
        g_level_read = 1;
    }
    if (!g_format_read) {
        g_format = (st_log_format_t)st_tun_int(ST_TUN_LOG_FORMAT);
        g_format_read = 1;
    }
}

/* the length of the well-formed UTF-8 sequence at s (Unicode table 3-7), 0 if there is none */
static size_t utf8_seq(const unsigned char *s) {
    unsigned char c = s[0];
    size_t n = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    if (!n) return 0;
    unsigned char lo = c == 0xe0 ? 0xa0 : c == 0xf0 ? 0x90 : 0x80, hi = c == 0xed ? 0x9f : c == 0xf4 ? 0x8f : 0xbf;
    if (s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < n; i++)
        if (s[i] < 0x80 || s[i] > 0xbf) return 0;
    return n;
}

/* s as the inside of a JSON string: " \ and control characters escaped, bytes that are not UTF-8
 * as U+FFFD, so every line parses */
static size_t json_esc(char *out, size_t cap, const char *s) {
    size_t n = 0;
    for (; *s && n + 7 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if (c >= 0x80) {
            size_t k = utf8_seq((const unsigned char *)s);
            if (!k) {
                n += (size_t)snprintf(out + n, cap - n, "\\ufffd");
            } else {
                memcpy(out + n, s, k);
                n += k;
                s += k - 1;
            }
        } else if (c == '"' || c == '\\') {
            out[n++] = '\\';
            out[n++] = (char)c;
        } else if (c == '\n') {
            out[n++] = '\\';
            out[n++] = 'n';
        } else if (c == '\t') {
            out[n++] = '\\';
            out[n++] = 't';
        } else if (c < 0x20 || c == 0x7f) {
            n += (size_t)snprintf(out + n, cap - n, "\\u%04x", c);
        } else {
            out[n++] = (char)c;
        }
    }
    out[n] = 0;
    return n;
}

static void log_v(st_log_level_t lvl, const char *file, int line, const char *fmt, va_list ap) {
    static const char *names[] = {"ERROR", "WARN", "INFO", "DEBUG"}, *lower[] = {"error", "warn", "info", "debug"};
    char msg[2048];
    vsnprintf(msg, sizeof msg, fmt, ap);
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char when[80];
    snprintf(when, sizeof when, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
             tm.tm_hour, tm.tm_min, tm.tm_sec, (long)(ts.tv_nsec / 1000000) % 1000);
    if (g_format == ST_LOG_JSON) {
        char em[6 * sizeof msg + 8], et[256], ef[256];
        json_esc(em, sizeof em, msg);
        json_esc(et, sizeof et, g_tag);
        json_esc(ef, sizeof ef, base);
        fprintf(stderr, "{\"time\":\"%s\",\"level\":\"%s\",\"role\":\"%s\",\"src\":\"%s:%d\",\"msg\":\"%s\"}\n", when,
                lower[lvl], et, ef, line, em);
        return;
    }
    fprintf(stderr, "%s %-5s [%s] %s:%d %s\n", when, names[lvl], g_tag, base, line, msg);
}

void st_log_msg(st_log_level_t lvl, const char *file, int line, const char *fmt, ...) {
    log_level_once();
    if (lvl > g_level) return;
    va_list ap;
    va_start(ap, fmt);
    log_v(lvl, file, line, fmt, ap);
    va_end(ap);
}

static _Thread_local char g_err[1024];

void st_err_set(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_err, sizeof g_err, fmt, ap);
    va_end(ap);
}

const char *st_err_last(void) { return g_err; }

/* record the text as the last error and log it at lvl */
static st_status_t err_record(st_log_level_t lvl, const char *prefix, st_status_t s, const char *file, int line,
                              const char *fmt, va_list ap) {
    vsnprintf(g_err, sizeof g_err, fmt, ap);
    st_log_msg(lvl, file, line, "%s%s (%s)", prefix, g_err, st_status_str(s));
    return s;
}

st_status_t st_fail(st_status_t s, const char *file, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    err_record(ST_LOG_ERROR, "", s, file, line, fmt, ap);
    va_end(ap);
    return s;
}

st_status_t st_reject(st_status_t s, const char *file, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    err_record(ST_LOG_DEBUG, "rejected: ", s, file, line, fmt, ap);
    va_end(ap);
    return s;
}

int st_help_version(int argc, char **argv, const char *prog, void (*usage_to)(FILE *out)) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage_to(stdout);
            return 1;
        }
        if (!strcmp(argv[i], "--version")) {
            printf("%s %s\n", prog, STRATA_VERSION);
            return 1;
        }
    }
    return 0;
}

int st_host_is_localhost(const char *host) {
    size_t n = strlen(host), k = strlen("localhost");
    if (n && host[n - 1] == '.') n--;
    return n >= k && !strncasecmp(host + n - k, "localhost", k) && (n == k || host[n - k - 1] == '.');
}

int st_parse_long(const char *flag, const char *v, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) {
        fprintf(stderr, "%s takes an integer in %ld..%ld (got '%s')\n", flag, lo, hi, v);
        return -1;
    }
    *out = x;
    return 0;
}

int st_parse_str_flag(const char *const *names, const char **const *dst, size_t n, int argc, char **argv, int *i) {
    for (size_t j = 0; j < n; j++) {
        if (strcmp(argv[*i], names[j]) != 0) continue;
        if (*i + 1 >= argc) {
            fprintf(stderr, "%s needs a value\n", names[j]);
            return -1;
        }
        *dst[j] = argv[++*i];
        return 1;
    }
    return 0;
}

int st_log_rl_pass(st_log_rl_t *rl, double interval_s, uint64_t *suppressed) {
    uint64_t now = st_time_ns(), next = __atomic_load_n(&rl->next_ns, __ATOMIC_RELAXED);
    if (now < next || !__atomic_compare_exchange_n(&rl->next_ns, &next, now + (uint64_t)(interval_s * 1e9), 0,
                                                   __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
        __atomic_fetch_add(&rl->suppressed, 1, __ATOMIC_RELAXED);
        return 0;
    }
    *suppressed = __atomic_exchange_n(&rl->suppressed, 0, __ATOMIC_RELAXED);
    return 1;
}

double st_time_sec(void) { return (double)st_time_ns() * 1e-9; }

uint64_t st_time_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

float st_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    float f;
    if (exp == 0) {
        f = ldexpf((float)man, -24);
        return sign ? -f : f;
    }
    if (exp == 31) {
        uint32_t u = sign | 0x7f800000u | (man << 13);
        memcpy(&f, &u, 4);
        return f;
    }
    uint32_t u = sign | ((exp + 112) << 23) | (man << 13);
    memcpy(&f, &u, 4);
    return f;
}

uint16_t st_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000;
    float a = fabsf(f);
    if (isnan(f)) return (uint16_t)(sign | 0x7e00);
    if (a >= 65520.0f) return (uint16_t)(sign | 0x7c00);
    if (a < 6.103515625e-05f) { /* subnormal: round to nearest multiple of 2^-24 */
        return (uint16_t)(sign | (uint32_t)lrintf(a * 16777216.0f));
    }
    uint32_t e = ((u >> 23) & 0xff) - 112, m = u & 0x7fffff;
    uint32_t h = (e << 10) | (m >> 13);
    uint32_t rem = m & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
    return (uint16_t)(sign | h);
}

float st_rng_normal(st_rng_t *r) {
    double u1 = st_rng_uniform(r), u2 = st_rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

st_status_t st_arena_init(st_arena_t *a, size_t cap) {
    memset(a, 0, sizeof *a);
    if (cap == 0) return ST_OK;
    if (posix_memalign((void **)&a->base, 64, cap) != 0)
        return ST_FAIL(ST_ERR_NO_MEMORY, "arena of %zu bytes", cap);
    a->cap = cap;
    return ST_OK;
}

void st_arena_cleanup(st_arena_t *a) {
    free(a->base);
    memset(a, 0, sizeof *a);
}

void *st_arena_alloc(st_arena_t *a, size_t bytes) {
    size_t off = (a->used + 63) & ~(size_t)63;
    if (off + bytes > a->cap) return NULL;
    a->used = off + bytes;
    if (a->used > a->high) a->high = a->used;
    return a->base + off;
}

int st_fd_read_full(int fd, void *buf, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t k = read(fd, (char *)buf + got, n - got);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        got += (size_t)k;
    }
    return 0;
}

int st_fd_write_full(int fd, const void *buf, size_t n) {
    size_t put = 0;
    while (put < n) {
        ssize_t k = write(fd, (const char *)buf + put, n - put);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        put += (size_t)k;
    }
    return 0;
}

st_status_t st_file_read_all(const char *path, char **out, size_t *len) {
    /* NOTE: O_NONBLOCK so a FIFO cannot block us; only regular files of at most 256 MiB are read */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return ST_FAIL(ST_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > (256 << 20)) {
        close(fd);
        return ST_FAIL(ST_ERR_IO, "%s: not a regular file of at most 256 MiB", path);
    }
    size_t n = (size_t)st.st_size;
    char *buf = malloc(n + 1);
    if (!buf) {
        close(fd);
        return ST_FAIL(ST_ERR_NO_MEMORY, "reading %s (%zu bytes)", path, n);
    }
    int short_read = st_fd_read_full(fd, buf, n);
    close(fd);
    if (short_read) {
        free(buf);
        return ST_FAIL(ST_ERR_IO, "short read on %s", path);
    }
    buf[n] = 0;
    *out = buf;
    if (len) *len = n;
    return ST_OK;
}

st_status_t st_file_write_all(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) return ST_FAIL(ST_ERR_IO, "cannot create %s: %s", path, strerror(errno));
    if (len && fwrite(data, 1, len, f) != len) {
        fclose(f);
        return ST_FAIL(ST_ERR_IO, "short write on %s", path);
    }
    if (fclose(f) != 0) return ST_FAIL(ST_ERR_IO, "close failed on %s", path);
    return ST_OK;
}

void st_fd_limit_raise(void) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) {
        st_log_warn("fd limit: getrlimit: %s", strerror(errno));
        return;
    }
    unsigned long long was = (unsigned long long)rl.rlim_cur;
    if (rl.rlim_cur != rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
            st_log_warn("fd limit: cannot raise %llu to the hard limit %llu: %s", was,
                        (unsigned long long)rl.rlim_max, strerror(errno));
            return;
        }
    }
    st_log_info("fd limit: %llu open files (was %llu)", (unsigned long long)rl.rlim_cur, was);
}
