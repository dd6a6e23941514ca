/* Strata base: status codes, logging, small numeric helpers shared by every module.
 * Wraps no outside library. */
#ifndef STRATA_BASE_H
#define STRATA_BASE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Errors are negative and grouped by what must be torn down: the request, the peer, the process. */
typedef enum {
    ST_OK = 0,
    /* request-level: fail this request, keep serving */
    ST_ERR_INVALID_ARG = -1,    /* malformed argument or request */
    ST_ERR_OUT_OF_RANGE = -2,   /* token id, position or count outside limits */
    ST_ERR_CAPACITY = -3,       /* a pool (sequences, cache pages, batch slots) is full */
    ST_ERR_TIMEOUT = -4,        /* a bounded wait expired */
    ST_ERR_CANCELLED = -5,
    /* input files: fail the load, keep the process */
    ST_ERR_CONFIG = -20,        /* config.json missing, malformed or inconsistent */
    ST_ERR_CHECKPOINT = -21,    /* safetensors / index malformed or disagreeing with config */
    ST_ERR_IO = -22,            /* open/read/mmap/write failed */
    ST_ERR_PARSE = -23,         /* JSON or text parse error */
    /* peer-level: drop the peer, fail what depended on it */
    ST_ERR_PEER = -40,          /* peer dead, unreachable or speaking a bad protocol */
    ST_ERR_PROTOCOL = -41,      /* bad header / version / message */
    /* process-level */
    ST_ERR_NO_MEMORY = -60,
    ST_ERR_DEVICE = -61,        /* CUDA / cuBLAS failure */
    ST_ERR_UNSUPPORTED = -62,   /* feature not built in or not available on this machine */
    ST_ERR_INTERNAL = -63,
} st_status_t;

const char *st_status_str(st_status_t s);

/* ---- logging: the place that detects an error logs it once, with context ---- */
typedef enum { ST_LOG_ERROR = 0, ST_LOG_WARN = 1, ST_LOG_INFO = 2, ST_LOG_DEBUG = 3 } st_log_level_t;
void st_log_set_level(st_log_level_t lvl);
void st_log_set_tag(const char *tag); /* process role shown in every line, e.g. "attn" */
void st_log_msg(st_log_level_t lvl, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define st_log_error(...) st_log_msg(ST_LOG_ERROR, __FILE__, __LINE__, __VA_ARGS__)
#define st_log_warn(...) st_log_msg(ST_LOG_WARN, __FILE__, __LINE__, __VA_ARGS__)
#define st_log_info(...) st_log_msg(ST_LOG_INFO, __FILE__, __LINE__, __VA_ARGS__)
#define st_log_debug(...) st_log_msg(ST_LOG_DEBUG, __FILE__, __LINE__, __VA_ARGS__)

/* Last error text of this thread: detectors write it (and log it) so callers, CLIs and replies can
 * show the exact reason without re-logging. */
void st_err_set(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *st_err_last(void);
/* log at ERROR and record as last error, return status s */
st_status_t st_fail(st_status_t s, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define ST_FAIL(s, ...) st_fail((s), __FILE__, __LINE__, __VA_ARGS__)

/* ---- time ---- */
double st_time_sec(void);   /* monotonic seconds */
uint64_t st_time_ns(void);  /* monotonic ns */

/* ---- bf16 / f16 ---- */
static inline float st_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint16_t st_f32_to_bf16(float f) { /* round to nearest even; NaN kept quiet */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
float st_f16_to_f32(uint16_t h);
uint16_t st_f32_to_f16(float f);

/* ---- deterministic RNG (splitmix64 / xoshiro-style), reproducible across machines ---- */
typedef struct { uint64_t s; } st_rng_t;
static inline uint64_t st_rng_next(st_rng_t *r) {
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static inline double st_rng_uniform(st_rng_t *r) { return (double)(st_rng_next(r) >> 11) * (1.0 / 9007199254740992.0); }
float st_rng_normal(st_rng_t *r);

/* ---- arenas: sized once at start-up, bump-allocated, reset per step ---- */
typedef struct {
    uint8_t *base;
    size_t cap, used, high; /* high: high-water mark, for sizing reports */
} st_arena_t;
st_status_t st_arena_init(st_arena_t *a, size_t cap);
void st_arena_cleanup(st_arena_t *a);
void *st_arena_alloc(st_arena_t *a, size_t bytes); /* 64-byte aligned; NULL (no log) when full */
static inline void st_arena_reset(st_arena_t *a) { a->used = 0; }

/* ---- small file helpers ---- */
st_status_t st_file_read_all(const char *path, char **out, size_t *len); /* NUL-terminated, caller frees */
st_status_t st_file_write_all(const char *path, const void *data, size_t len);

#define ST_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define ST_MIN(a, b) ((a) < (b) ? (a) : (b))
#define ST_MAX(a, b) ((a) > (b) ? (a) : (b))

#ifdef __cplusplus
}
#endif
#endif
