/* Strata base: status codes, logging, small numeric helpers shared by every module.
 * Wraps no outside library. */
#ifndef STRATA_BASE_H
#define STRATA_BASE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
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
    ST_ERR_AUTH = -6,           /* missing or wrong credentials: refuse, keep serving */
    ST_ERR_NOT_FOUND = -7,      /* no such named thing (service, route, sequence) */
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
/* Lines on stderr, dated in UTC to the millisecond. text (the default):
 *   2026-12-02T06:35:01.123Z INFO  [coord] coord.c:812 message
 * json (LOG_FORMAT=json in the configuration table), one object a line:
 *   {"time":"2026-12-02T06:35:01.123Z","level":"info","role":"coord","src":"coord.c:812","msg":"message"} */
typedef enum { ST_LOG_TEXT = 0, ST_LOG_JSON = 1 } st_log_format_t;
void st_log_set_format(st_log_format_t f);
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
/* A client's mistake: record the text like ST_FAIL but log it only at DEBUG (the reply carries it). */
st_status_t st_reject(st_status_t s, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define ST_REJECT(s, ...) st_reject((s), __FILE__, __LINE__, __VA_ARGS__)

/* Rate-limited logging: at most one line per interval_s per call site; the next line printed says
 * how many were suppressed. Thread-safe. */
typedef struct {
    uint64_t next_ns;    /* accessed with atomic builtins only */
    uint64_t suppressed;
} st_log_rl_t;
int st_log_rl_pass(st_log_rl_t *rl, double interval_s, uint64_t *suppressed);
#define st_log_every(lvl, interval_s, fmt, ...)                                                                      \
    do {                                                                                                             \
        static st_log_rl_t st__rl_;                                                                                  \
        uint64_t st__sup_;                                                                                           \
        if (st_log_rl_pass(&st__rl_, (interval_s), &st__sup_))                                                      \
            st_log_msg((lvl), __FILE__, __LINE__, fmt " [%llu similar suppressed]", ##__VA_ARGS__,                   \
                       (unsigned long long)st__sup_);                                                                \
    } while (0)

/* ---- tunables: the one configuration table (common/base/tunables.c, printed by `strata config`) ----
 * Every setting that is not a flag of one command is declared once there: name, type, default, unit
 * and a one-line meaning. Each value comes from, first that applies: a flag (`--set NAME=VALUE`,
 * which every role and every strata command takes, or a command's own flag for it, such as
 * --api-key), the environment variable STRATA_<NAME>, the default. The environment is read once, at
 * the first st_tun_* call or log line; nothing else in Strata calls getenv. Two entries belong to
 * UCX (UCX_TLS, UCX_NET_DEVICES): UCX reads them itself; the table shows them, lets Strata see
 * whether they are set, and refuses to set them. Not the model config (config.json, st_config_t). */
typedef enum {
    ST_TUN_LOG,                 /* enum error|warn|info|debug: log level */
    ST_TUN_LOG_FORMAT,          /* enum text|json: log line format */
    ST_TUN_THREADS,             /* int: CPU kernel threads, 0 = one per online CPU */
    ST_TUN_STATE,               /* string: strata up/down/status/generate state directory */
    ST_TUN_API_KEY,             /* string, secret: client API key */
    ST_TUN_CLUSTER_SECRET_FILE, /* string: cluster secret file */
    ST_TUN_WORKER_SYNC,         /* bool: attention worker without micro-batch overlap */
    ST_TUN_CUDA_GRAPHS,         /* bool: GPU roles replay decode steps / dispatches as CUDA graphs */
    ST_TUN_HOST_ROUTE,          /* bool: GPU engine routes on the host (quantile mode) */
    ST_TUN_XFER_SPIN_US,        /* int: same-host data path spin before sleeping, −1 = by device */
    ST_TUN_XFER_SHM,            /* bool: the worker asks same-host servers for a shared-memory channel */
    ST_TUN_CONTROL_CPUS,        /* CPU list: a CPU role's control threads (st_cpu_control) */
    ST_TUN_UCX_TLS,             /* UCX's, read only */
    ST_TUN_UCX_NET_DEVICES,     /* UCX's, read only */
    ST_TUN_COUNT
} st_tun_id_t;
typedef enum { ST_TUN_FROM_DEFAULT, ST_TUN_FROM_ENV, ST_TUN_FROM_FLAG } st_tun_src_t;
/* Reads the environment (once) and fails, naming each, when a STRATA_ variable does not parse (the
 * default is used meanwhile). Roles and commands call it at start, after their flags. */
st_status_t st_tun_load(void);
void st_tun_ensure(void); /* the same, without the check: what every accessor calls first */
/* A flag: NAME (with or without STRATA_) = value, checked against the entry's type. Errors are
 * recorded (st_err_last), not logged: the caller shows them. */
st_status_t st_tun_set(const char *name, const char *value);
/* If argv[*i] is `--set NAME=VALUE`, apply it and return 1; 0 if not ours; -1 (after printing why)
 * when it is malformed or refused. */
int st_tun_parse_flag(int argc, char **argv, int *i);
/* Writes every entry set by a flag into the environment (STRATA_<NAME>), for the child processes
 * that `strata up` starts. */
void st_tun_export(void);
long st_tun_int(st_tun_id_t id);        /* int, bool (0/1) and enum (index) entries */
const char *st_tun_str(st_tun_id_t id); /* the text; "" when unset */
st_tun_src_t st_tun_source(st_tun_id_t id);
void st_tun_print(FILE *out);           /* every entry: variable, value, source, type, default, meaning */
void st_tun_log(const char *role);      /* the same at INFO, one line each (secrets by length only) */

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

/* ---- process limits ---- */
/* Raise the soft RLIMIT_NOFILE to the hard limit (servers hold one descriptor per client) and log
 * the result at INFO. Roles call it once at start, before creating their servers. */
void st_fd_limit_raise(void);

/* A command-line number: the whole of v is a decimal integer in lo..hi; else says so on stderr
 * (naming flag) and returns -1 with *out untouched. */
int st_parse_long(const char *flag, const char *v, long lo, long hi, long *out);
/* Whether host is "localhost" or a name under it (RFC 6761 §6.3, any case, optional final dot):
 * those are the IPv4 loopback 127.0.0.1 without asking the resolver, as gRPC and curl treat them, so
 * that a machine without /etc/hosts (a minimal container) takes them too. */
int st_host_is_localhost(const char *host);
/* A role's --help / -h (usage on stdout) and --version ("prog VERSION"), which win over every other
 * flag: 1 when one was given and answered (the caller exits 0), else 0. */
int st_help_version(int argc, char **argv, const char *prog, void (*usage_to)(FILE *out));
/* Command-line string flags: if argv[*i] is names[j] (j < n), store its value in *dst[j], step *i past
 * it and return 1; 0 when argv[*i] is none of them; -1 (after saying so on stderr) when the value is
 * missing. */
int st_parse_str_flag(const char *const *names, const char **const *dst, size_t n, int argc, char **argv, int *i);

/* ---- small file helpers ---- */
/* Reads exactly n bytes (EINTR retried): 0, or -1 at an error or an end of file before them. */
int st_fd_read_full(int fd, void *buf, size_t n);
/* Writes all n bytes (EINTR retried): 0, or -1 on an error. */
int st_fd_write_full(int fd, const void *buf, size_t n);
st_status_t st_file_read_all(const char *path, char **out, size_t *len); /* NUL-terminated, caller frees */
st_status_t st_file_write_all(const char *path, const void *data, size_t len);

/* ---- secrets (no outside library): the cluster secret, HMAC-SHA256, OS randomness ---- */
#define ST_SECRET_MAX 256
typedef struct {
    uint8_t key[ST_SECRET_MAX];
    size_t len;
} st_secret_t;
/* A regular file of 32..256 bytes (trailing whitespace ignored; `strata up` writes 64 hex digits).
 * Refuses a file others may write; warns when others may read it. */
st_status_t st_secret_load(const char *path, st_secret_t *out);
/* Writes 64 random hex digits to path, mode 0600 (replacing it atomically). */
st_status_t st_secret_generate_file(const char *path);
void st_sha256(const void *msg, size_t len, uint8_t out[32]);
void st_hmac_sha256(const void *key, size_t klen, const void *msg, size_t mlen, uint8_t out[32]);
/* hex(HMAC(secret, purpose)): a 64-digit token derived for one use (e.g. "grpc"), so the secret
 * itself never travels. out: 65 bytes. */
void st_secret_token(const st_secret_t *s, const char *purpose, char out[65]);
st_status_t st_random_bytes(void *buf, size_t n); /* getrandom(2) */
int st_ct_equal(const void *a, const void *b, size_t n); /* 1 if equal; time independent of content */
void st_hex(const void *in, size_t n, char *out);   /* out: 2n + 1 bytes */

/* The flags every role takes (docs/security.md), parsed in one place: --set NAME=VALUE (the
 * configuration table above) and the security flags:
 *   --cluster-secret-file F   the cluster secret (or $STRATA_CLUSTER_SECRET_FILE); required unless
 *   --insecure                no cluster authentication (a WARN at start; loopback experiments only)
 *   --tls-cert F --tls-key F  gRPC TLS: this process's certificate and key (PEM)
 *   --tls-ca F                the CA that peers' certificates must chain to
 *   --tls                     use TLS toward the coordinator even without a client certificate */
typedef struct {
    const char *secret_file;
    int insecure, tls;
    const char *tls_cert, *tls_key, *tls_ca;
    /* filled by st_sec_opts_finish */
    int have_secret;
    st_secret_t secret;
    char grpc_token[65]; /* st_secret_token(secret, "strata-grpc-v1"): what members send the coordinator */
} st_sec_opts_t;
/* If argv[*i] is one of the flags above, consume it (and its value) and return 1; 0 if not ours;
 * -1 (after printing why) when its value is missing. */
int st_sec_opts_parse(st_sec_opts_t *o, int argc, char **argv, int *i);
/* Every role's start: loads the configuration table (st_tun_load) and logs it (st_tun_log), then
 * loads the secret (flag, else CLUSTER_SECRET_FILE of the table) and derives the tokens; fails when
 * a STRATA_ variable does not parse, when there is no secret and --insecure was not given, or a TLS
 * file is given without its pair. */
st_status_t st_sec_opts_finish(st_sec_opts_t *o, const char *role);
#define ST_SEC_USAGE \
    "[--cluster-secret-file F | --insecure] [--tls --tls-cert F --tls-key F --tls-ca F] [--set NAME=VALUE ...]"

/* ---- CPUs: a role's control threads apart from its data path (common/base/cpu.c) ----
 * CONTROL_CPUS (the table) names the CPUs of a role's control threads: its event loop and the threads
 * the libraries start (gRPC, UCX, libuv's pool). Its data-path threads (the worker's compute thread,
 * the expert server's data and link threads, the kernels' threads) keep the process's other CPUs, so
 * a thread that spins on its peer is not taken off its CPU by the control plane's per-step work. */
#define ST_CPU_MAX 1024
/* A CPU list ("3", "0-3,8": ascending ranges of CPUs below ST_CPU_MAX, no blanks): 0 when it parses
 * (and, when mask is given, its CPUs as bits of ST_CPU_MAX / 64 words), -1 when it does not. */
int st_cpu_list_parse(const char *list, uint64_t *mask);
/* The role's main thread, after it made its kernels' threads and before any library starts its own:
 * with CONTROL_CPUS set, the process's CPUs less those become the data-path threads' (all of them
 * when that leaves none) and the calling thread moves to CONTROL_CPUS, so the threads it starts
 * from now on follow it. Logs what it did; a CPU list the kernel refuses is a warning (every thread
 * stays where it is), never an error. */
void st_cpu_control(const char *role);
/* A data-path thread's first call: names it (top -H, /proc/PID/task/TID/comm; at most 15 characters)
 * and moves it to the data-path CPUs when st_cpu_control set them. */
void st_cpu_data_thread(const char *name);

#define ST_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define ST_MIN(a, b) ((a) < (b) ? (a) : (b))
#define ST_MAX(a, b) ((a) > (b) ? (a) : (b))

#ifdef __cplusplus
}
#endif
#endif
