/* `strata up|down|status`: a whole local cluster (coordinator, expert servers, attention workers) as
 * processes on loopback, with its state (pids, endpoints, logs) in one folder. */
#define _GNU_SOURCE /* sched_setaffinity, CPU_SET */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <arpa/inet.h>
#include <unistd.h>

#include "cli.h"
#include "strata/model.h"

#define MAX_PROCS 80

const char *st_cli_state_dir(const char *given) {
    static char buf[512];
    if (given) return given;
    const char *e = st_tun_str(ST_TUN_STATE);
    if (*e) return e;
    snprintf(buf, sizeof buf, "/tmp/strata-%d", (int)getuid());
    return buf;
}

/* "key=value" lines of state/cluster.env */
int st_cli_state_get(const char *state, const char *key, char *out, size_t n) {
    char path[600], *txt;
    snprintf(path, sizeof path, "%s/cluster.env", state);
    if (access(path, R_OK) != 0 || st_file_read_all(path, &txt, NULL) != ST_OK) return -1; /* no cluster recorded */
    size_t kl = strlen(key);
    int rc = -1;
    for (char *line = txt; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        if (!strncmp(line, key, kl) && line[kl] == '=') {
            snprintf(out, n, "%s", line + kl + 1);
            rc = 0;
            break;
        }
        line = nl ? nl + 1 : NULL;
    }
    free(txt);
    return rc;
}

/* Blocking HTTP/1.1 request to 127.0.0.1-style host:port; returns status, body malloc'd. */
int st_cli_http(const char *hostport, const char *method, const char *path, const char *body, char **out) {
    char host[128];
    const char *c = strrchr(hostport, ':');
    if (!c || (size_t)(c - hostport) >= sizeof host) return -1;
    memcpy(host, hostport, (size_t)(c - hostport));
    host[c - hostport] = 0;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(c + 1))};
    if (inet_pton(AF_INET, host, &a.sin_addr) != 1) return -1;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct timeval tv = {.tv_sec = 30};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    char hdr[512];
    size_t bl = body ? strlen(body) : 0;
    int hl = snprintf(hdr, sizeof hdr, "%s %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\nContent-Type: application/json\r\n"
                                       "Content-Length: %zu\r\n\r\n", method, path, hostport, bl);
    if (write(fd, hdr, (size_t)hl) != hl || (bl && write(fd, body, bl) != (ssize_t)bl)) {
        close(fd);
        return -1;
    }
    size_t cap = 65536, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (n + 4096 > cap) buf = realloc(buf, cap *= 2);
        ssize_t k = read(fd, buf + n, cap - n - 1);
        if (k <= 0) break;
        n += (size_t)k;
    }
    close(fd);
    buf[n] = 0;
    int status = -1;
    sscanf(buf, "HTTP/1.%*d %d", &status);
    char *b = strstr(buf, "\r\n\r\n");
    if (out) *out = strdup(b ? b + 4 : "");
    free(buf);
    return status;
}

static void self_dir(char *out, size_t n) {
    char p[PATH_MAX];
    ssize_t k = readlink("/proc/self/exe", p, sizeof p - 1);
    if (k <= 0) {
        snprintf(out, n, ".");
        return;
    }
    p[k] = 0;
    char *sl = strrchr(p, '/');
    if (sl) *sl = 0;
    size_t len = strlen(p);
    if (len >= n) len = n - 1;
    memcpy(out, p, len);
    out[len] = 0;
}

#define SPLIT_SPIN_US "50000" /* a role on its own cores spins 50 ms before it sleeps */

/* A role's own cores (strata up's core split): its affinity, and the settings that go with it. */
typedef struct {
    cpu_set_t cpus;
    char threads[16]; /* STRATA_THREADS, "" when the user set it */
    bool spin;        /* STRATA_XFER_SPIN_US=SPLIT_SPIN_US (the user did not set it) */
    const char *control; /* STRATA_CONTROL_CPUS: the coordinator's text; NULL when the user set it, or for it */
    char text[64];    /* "2-3", for strata up's summary */
} role_cores_t;

/* Start argv[0] detached (own session), output to log, on its own cores when rc is given; returns
 * pid or -1. */
static pid_t spawn(char *const argv[], const char *log, const role_cores_t *rc) {
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        setsid();
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        int nul = open("/dev/null", O_RDONLY);
        if (nul >= 0) dup2(nul, 0);
        if (rc) {
            if (sched_setaffinity(0, sizeof rc->cpus, &rc->cpus) != 0) {
                fprintf(stderr, "strata up: cores %s: %s (the role shares every core)\n", rc->text, strerror(errno));
            } else {
                if (rc->threads[0]) setenv("STRATA_THREADS", rc->threads, 1);
                if (rc->spin) setenv("STRATA_XFER_SPIN_US", SPLIT_SPIN_US, 1);
                if (rc->control) setenv("STRATA_CONTROL_CPUS", rc->control, 1);
            }
        }
        execv(argv[0], argv);
        fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    return pid;
}

/* strata up's core split. A CPU role's kernel threads default to one per online CPU, and a waiting
 * CPU role sleeps on a futex after 30 µs (a kernel wake-up per hand-off, 20-40 µs in a VM) rather than
 * spin on a core another role computes on. Split, each role gets its own contiguous share of strata
 * up's CPUs (workers first take the remainder), its kernel threads sized to it and its waits spinning
 * through a whole layer of its peer's compute (SPLIT_SPIN_US: the cores it spins on are its own, idle
 * while it waits), so no hand-off waits for a wake-up; but a role computes on its share only, where
 * with one micro-batch the roles take turns on every CPU. Measured (docs/perf-cpu.md): on 2 CPUs, a
 * worker and a server, split is as fast or faster (tiny decode +5-10% tokens/s, the data path 10% →
 * 40-120% of ucp_am_bw); on 16, with two servers, sharing is faster (small prefill 128 against 86-101
 * tokens/s). So `auto` splits when there is a CPU per role but fewer than two; `on` whenever there is
 * one per role. The coordinator (rc[workers + experts]) gets the last CPU when one is left over, else
 * shares the last expert server's: on a worker's cores its per-step work (and a local load's) stalls
 * the worker's hand-offs. The roles' own control threads (event loops, gRPC's and UCX's threads) go
 * there too (CONTROL_CPUS, st_cpu_control), so each role's data-path threads have its CPUs to
 * themselves: on 2 CPUs that halved the decode layers a worker's per-step gRPC work stalled
 * (docs/perf-cpu.md). Values the user set are kept. Returns the number of roles given cores (0: no
 * split). */
static int cpu_split(role_cores_t *rc, int workers, int experts, bool always) {
    cpu_set_t all;
    if (sched_getaffinity(0, sizeof all, &all) != 0) return 0;
    int n = CPU_COUNT(&all), roles = workers + experts, at = -1;
    if (n < roles || (!always && n >= 2 * roles)) return 0;
    bool own_threads = st_tun_source(ST_TUN_THREADS) == ST_TUN_FROM_DEFAULT;
    bool own_spin = st_tun_source(ST_TUN_XFER_SPIN_US) == ST_TUN_FROM_DEFAULT;
    bool own_control = st_tun_source(ST_TUN_CONTROL_CPUS) == ST_TUN_FROM_DEFAULT;
    int shared = n > roles ? n - 1 : n; /* the roles' CPUs */
    for (int r = 0; r <= roles; r++) {
        int k = r < roles ? shared / roles + (r < shared % roles) : n - shared, first = -1, last = -1;
        CPU_ZERO(&rc[r].cpus);
        for (int j = 0; j < k; j++) {
            for (at++; at < CPU_SETSIZE && !CPU_ISSET(at, &all); at++) {
            }
            CPU_SET(at, &rc[r].cpus);
            first = first < 0 ? at : first, last = at;
        }
        rc[r].threads[0] = 0;
        if (own_threads && r < roles) snprintf(rc[r].threads, sizeof rc[r].threads, "%d", k);
        rc[r].spin = own_spin && r < roles;
        if (k) {
            snprintf(rc[r].text, sizeof rc[r].text, first == last ? "%d" : "%d-%d", first, last);
        } else { /* the coordinator, no CPU left over: the last server's */
            rc[r].cpus = rc[r - 1].cpus;
            memcpy(rc[r].text, rc[r - 1].text, sizeof rc[r].text);
        }
    }
    for (int r = 0; r <= roles; r++) /* the roles' control threads with the coordinator (st_cpu_control) */
        rc[r].control = own_control && r < roles ? rc[roles].text : NULL;
    return roles;
}

/* A zombie is not alive: in a container whose pid 1 does not reap, killed roles stay zombies. */
static int alive(pid_t p) {
    if (p <= 0 || kill(p, 0) != 0) return 0;
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)p);
    FILE *f = fopen(path, "r");
    if (!f) return 1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *rp = strrchr(buf, ')'); /* "pid (comm) S ..." */
    return !(rp && rp[1] == ' ' && rp[2] == 'Z');
}

static void stop_pids(pid_t *pids, int n, int verbose) {
    for (int i = n - 1; i >= 0; i--)
        if (alive(pids[i])) kill(pids[i], SIGTERM);
    double t0 = st_time_sec();
    for (;;) {
        int left = 0;
        for (int i = 0; i < n; i++) {
            if (pids[i] > 0) waitpid(pids[i], NULL, WNOHANG);
            left += alive(pids[i]);
        }
        if (!left) break;
        if (st_time_sec() - t0 > 10) {
            for (int i = 0; i < n; i++)
                if (alive(pids[i])) {
                    if (verbose) fprintf(stderr, "strata down: pid %d did not stop in 10 s; killing\n", (int)pids[i]);
                    kill(pids[i], SIGKILL);
                }
            break;
        }
        usleep(50000);
    }
}

static int read_pids(const char *state, pid_t *pids) {
    char v[4096];
    if (st_cli_state_get(state, "pids", v, sizeof v) != 0) return -1;
    int n = 0;
    for (char *p = v; *p && n < MAX_PROCS;) {
        pids[n++] = (pid_t)strtol(p, &p, 10);
        if (*p == ',') p++;
        else break;
    }
    return n;
}

static void tail_logs(const char *state) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "for f in '%s'/*.log; do echo \"== $f\"; tail -n 15 \"$f\"; done 1>&2", state);
    if (system(cmd) != 0) fprintf(stderr, "(could not show logs)\n");
}

int st_cmd_up(int argc, char **argv) {
    const char *preset = NULL, *ckpt = NULL, *state_arg = NULL, *routing = "topk";
    const char *attn_dev = NULL, *expert_dev = NULL; /* passed through as --device (cpu|cuda:N) */
    int experts = 2, workers = 1, replicas = 1, max_seqs = 16, max_batch = 2048, max_ctx = 4096, mbs = 2;
    uint64_t seed = 1;
    float skew = 0;
    const char *heartbeat = "300", *timeout_ms = "5000", *min_mb = "16";
    const char *api_key = NULL, *max_queue = NULL, *split = "auto";
    enum { MAX_COORD_ARGS = 32 };
    char *coord_args[MAX_COORD_ARGS]; /* --coordinator-arg: passed on to strata-coordinator as they are */
    int n_coord_args = 0;
    for (int i = 0; i < argc; i++) {
        const char *v;
        if ((v = st_cli_opt(argc, argv, &i, "--preset"))) preset = v;
        else if ((v = st_cli_opt(argc, argv, &i, "--ckpt"))) ckpt = v;
        else if ((v = st_cli_opt(argc, argv, &i, "--state"))) state_arg = v;
        else if ((v = st_cli_opt(argc, argv, &i, "--experts"))) experts = atoi(v);
        else if ((v = st_cli_opt(argc, argv, &i, "--workers"))) workers = atoi(v);
        else if ((v = st_cli_opt(argc, argv, &i, "--replicas"))) replicas = atoi(v);
        else if ((v = st_cli_opt(argc, argv, &i, "--routing"))) routing = v;
        else if ((v = st_cli_opt(argc, argv, &i, "--seed"))) seed = strtoull(v, NULL, 10);
        else if ((v = st_cli_opt(argc, argv, &i, "--skew-router"))) skew = strtof(v, NULL);
        else if ((v = st_cli_opt(argc, argv, &i, "--max-seqs"))) max_seqs = atoi(v);
        else if ((v = st_cli_opt(argc, argv, &i, "--max-batch-tokens"))) max_batch = atoi(v);
        else if ((v = st_cli_opt(argc, argv, &i, "--max-ctx"))) max_ctx = atoi(v);
        else if ((v = st_cli_opt(argc, argv, &i, "--micro-batches"))) mbs = atoi(v);
        else if ((v = st_cli_opt(argc, argv, &i, "--min-mb-tokens"))) min_mb = v;
        else if ((v = st_cli_opt(argc, argv, &i, "--heartbeat-ms"))) heartbeat = v;
        else if ((v = st_cli_opt(argc, argv, &i, "--expert-timeout-ms"))) timeout_ms = v;
        else if ((v = st_cli_opt(argc, argv, &i, "--attn-device"))) attn_dev = v;
        else if ((v = st_cli_opt(argc, argv, &i, "--expert-device"))) expert_dev = v;
        else if ((v = st_cli_opt(argc, argv, &i, "--api-key"))) api_key = v;
        else if ((v = st_cli_opt(argc, argv, &i, "--max-queue"))) max_queue = v;
        else if ((v = st_cli_opt(argc, argv, &i, "--cpu-split"))) split = v;
        else if ((v = st_cli_opt(argc, argv, &i, "--coordinator-arg"))) {
            if (n_coord_args == MAX_COORD_ARGS) {
                fprintf(stderr, "strata up: at most %d --coordinator-arg\n", MAX_COORD_ARGS);
                return 2;
            }
            coord_args[n_coord_args++] = (char *)v;
        }
        else { fprintf(stderr, "strata up: unknown option %s\n", argv[i]); return 2; }
    }
    if (!preset && !ckpt) preset = "tiny";
    if ((preset && ckpt) || experts < 1 || experts > 32 || workers < 1 || workers > 32 || replicas < 1 ||
        replicas > 8 || (strcmp(routing, "topk") && strcmp(routing, "quantile")) ||
        (strcmp(split, "auto") && strcmp(split, "on") && strcmp(split, "off"))) {
        fprintf(stderr,
                "strata up: one of --preset/--ckpt; --experts 1..32, --workers 1..32, --replicas 1..8, --routing "
                "topk|quantile, --cpu-split auto|on|off\n");
        return 2;
    }
    const char *state = st_cli_state_dir(state_arg);
    mkdir(state, 0700); /* the cluster secret lives here */
    pid_t old[MAX_PROCS];
    int nold = read_pids(state, old);
    for (int i = 0; i < nold; i++)
        if (alive(old[i])) {
            fprintf(stderr, "strata up: a cluster is already running from %s (pid %d); run strata down first\n", state, (int)old[i]);
            return 1;
        }
    char ck[600];
    if (preset) {
        snprintf(ck, sizeof ck, "%s/ckpt-%s%s", state, preset, skew > 0 ? "-skew" : "");
        char cfg[700];
        snprintf(cfg, sizeof cfg, "%s/config.json", ck);
        struct stat st;
        if (stat(cfg, &st) != 0) {
            st_ckpt_init_opts_t io = {.preset = preset, .out_dir = ck, .seed = seed, .dtype = ST_DT_BF16, .skew_router = skew,
                                      .mxfp4_experts = !strcmp(preset, "k3-mini")};
            if (st_ckpt_init(&io) != ST_OK) {
                fprintf(stderr, "strata up: %s\n", st_err_last());
                return 1;
            }
        }
    } else {
        snprintf(ck, sizeof ck, "%s", ckpt);
    }
    /* a fresh cluster secret per cluster, inherited by every role through the environment */
    char secret[700];
    snprintf(secret, sizeof secret, "%s/cluster.secret", state);
    if (st_secret_generate_file(secret) != ST_OK) {
        fprintf(stderr, "strata up: %s\n", st_err_last());
        return 1;
    }
    setenv("STRATA_CLUSTER_SECRET_FILE", secret, 1);
    if (api_key) setenv("STRATA_API_KEY", api_key, 1); /* the environment, not argv: ps shows argv */
    /* the children read STRATA_ and UCX variables through their own tables; --set flags reach them too */
    st_tun_export();
    if (!*st_tun_str(ST_TUN_UCX_TLS)) setenv("UCX_TLS", "tcp", 1); /* loopback everywhere, containers included */
    setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 0);
    /* cores per role: the workers' shares, the servers', the coordinator's */
    static role_cores_t rcs[MAX_PROCS]; /* workers + experts + 1 ≤ 65 */
    bool cpu_roles = (!attn_dev || !strcmp(attn_dev, "cpu")) && (!expert_dev || !strcmp(expert_dev, "cpu"));
    int n_split = strcmp(split, "off") && cpu_roles ? cpu_split(rcs, workers, experts, !strcmp(split, "on")) : 0;
    if (!n_split && !strcmp(split, "on"))
        fprintf(stderr, "strata up: --cpu-split on: %s; every role runs on every CPU\n",
                cpu_roles ? "fewer CPUs than roles" : "a role runs on a GPU");
    char bin[PATH_MAX - 64], exe[PATH_MAX], ready[700], log[700];
    self_dir(bin, sizeof bin);
    pid_t pids[MAX_PROCS];
    int np = 0;
    snprintf(ready, sizeof ready, "%s/coordinator.ready", state);
    unlink(ready);
    snprintf(exe, sizeof exe, "%s/strata-coordinator", bin);
    snprintf(log, sizeof log, "%s/coordinator.log", state);
    char s_rep[16], s_w[16], s_x[16];
    snprintf(s_rep, sizeof s_rep, "%d", replicas);
    snprintf(s_w, sizeof s_w, "%d", workers);
    snprintf(s_x, sizeof s_x, "%d", experts);
    char *cargv[21 + MAX_COORD_ARGS + 1] = {exe, "--ckpt", ck, "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0",
                                            "--replicas", s_rep, "--routing", (char *)routing, "--heartbeat-ms",
                                            (char *)heartbeat, "--expect-workers", s_w, "--expect-experts", s_x,
                                            "--ready-file", ready};
    int nc = 19;
    if (max_queue) cargv[nc++] = "--max-queue", cargv[nc++] = (char *)max_queue;
    /* NOTE: after strata up's own: a flag given twice takes its last value (--http HOST:PORT, say) */
    for (int k = 0; k < n_coord_args; k++) cargv[nc++] = coord_args[k];
    cargv[nc] = NULL;
    pids[np++] = spawn(cargv, log, n_split ? &rcs[workers + experts] : NULL);
    char grpc[160] = "", http[160] = "";
    double t0 = st_time_sec();
    while (st_time_sec() - t0 < 15) {
        char *txt;
        if (access(ready, R_OK) == 0 && st_file_read_all(ready, &txt, NULL) == ST_OK) {
            sscanf(strstr(txt, "grpc=") ? strstr(txt, "grpc=") + 5 : "", "%159s", grpc);
            sscanf(strstr(txt, "http=") ? strstr(txt, "http=") + 5 : "", "%159s", http);
            free(txt);
            break;
        }
        if (!alive(pids[0])) break;
        usleep(50000);
    }
    if (!grpc[0]) {
        fprintf(stderr, "strata up: the coordinator did not start\n");
        tail_logs(state);
        stop_pids(pids, np, 0);
        return 1;
    }
    /* an expert server takes a whole micro-batch's rows for one worker: max_batch × k_max (2k) */
    st_config_t cfgm;
    char cfgp[700];
    snprintf(cfgp, sizeof cfgp, "%s/config.json", ck);
    if (st_config_load(&cfgm, cfgp) != ST_OK) {
        fprintf(stderr, "strata up: %s\n", st_err_last());
        stop_pids(pids, np, 0);
        return 1;
    }
    char s_rows[32], s_slots[16];
    snprintf(s_rows, sizeof s_rows, "%d", max_batch * 2 * ST_MAX(cfgm.top_k, 1));
    snprintf(s_slots, sizeof s_slots, "%d", ST_MIN(4 * workers, 32));
    snprintf(exe, sizeof exe, "%s/strata-expert", bin);
    for (int i = 0; i < experts; i++) {
        char name[32];
        snprintf(name, sizeof name, "expert-%d", i);
        snprintf(log, sizeof log, "%s/%s.log", state, name);
        char *eargv[] = {exe, "--coordinator", grpc, "--ckpt", ck, "--listen", "127.0.0.1:0", "--name", name,
                         "--max-rows", s_rows, "--slots", s_slots, "--coordinator-file", ready, NULL, NULL, NULL};
        if (expert_dev) eargv[15] = "--device", eargv[16] = (char *)expert_dev;
        pids[np++] = spawn(eargv, log, n_split ? &rcs[workers + i] : NULL);
    }
    snprintf(exe, sizeof exe, "%s/strata-attn", bin);
    char s_seqs[16], s_batch[16], s_ctx[16], s_mb[16];
    snprintf(s_seqs, sizeof s_seqs, "%d", max_seqs);
    snprintf(s_batch, sizeof s_batch, "%d", max_batch);
    snprintf(s_ctx, sizeof s_ctx, "%d", max_ctx);
    snprintf(s_mb, sizeof s_mb, "%d", mbs);
    for (int i = 0; i < workers; i++) {
        char name[32];
        snprintf(name, sizeof name, "attn-%d", i);
        snprintf(log, sizeof log, "%s/%s.log", state, name);
        char *wargv[] = {exe, "--coordinator", grpc, "--ckpt", ck, "--listen", "127.0.0.1:0", "--name", name,
                         "--max-seqs", s_seqs, "--max-batch-tokens", s_batch, "--max-ctx", s_ctx, "--routing", (char *)routing,
                         "--micro-batches", s_mb, "--min-mb-tokens", (char *)min_mb, "--expert-timeout-ms", (char *)timeout_ms,
                         "--coordinator-file", ready, NULL, NULL, NULL};
        if (attn_dev) wargv[25] = "--device", wargv[26] = (char *)attn_dev;
        pids[np++] = spawn(wargv, log, n_split ? &rcs[i] : NULL);
    }
    /* state file first, so `strata down` can clean up even if readiness never comes */
    char env[8192];
    int k = snprintf(env, sizeof env, "grpc=%s\nhttp=%s\nckpt=%s\npids=", grpc, http, ck);
    for (int i = 0; i < np; i++) k += snprintf(env + k, sizeof env - (size_t)k, "%s%d", i ? "," : "", (int)pids[i]);
    k += snprintf(env + k, sizeof env - (size_t)k, "\n");
    char envp[700];
    snprintf(envp, sizeof envp, "%s/cluster.env", state);
    st_file_write_all(envp, env, (size_t)k);
    int ready_ok = 0;
    while (st_time_sec() - t0 < 120) {
        if (st_cli_http(http, "GET", "/readyz", NULL, NULL) == 200) {
            ready_ok = 1;
            break;
        }
        int dead = 0;
        for (int i = 0; i < np; i++) dead |= !alive(pids[i]) && waitpid(pids[i], NULL, WNOHANG) >= 0;
        if (dead) break;
        usleep(100000);
    }
    if (!ready_ok) {
        fprintf(stderr, "strata up: the cluster did not become ready\n");
        tail_logs(state);
        stop_pids(pids, np, 0);
        unlink(envp);
        return 1;
    }
    printf("strata cluster up (%d expert server%s, %d attention worker%s, %s routing, replicas %d) in %.1f s\n", experts,
           experts > 1 ? "s" : "", workers, workers > 1 ? "s" : "", routing, replicas, st_time_sec() - t0);
    printf("  model        %s\n  gRPC         %s   (strata generate --prompt ...)\n", ck, grpc);
    printf("  HTTP         http://%s   (/v1/completions, /v1/models, /status, /metrics, /healthz, /readyz)\n", http);
    printf("  state, logs  %s\n", state);
    if (n_split) {
        printf("  cores        ");
        for (int i = 0; i < workers + experts; i++)
            printf("%s%s-%d %s", i ? ", " : "", i < workers ? "attn" : "expert", i < workers ? i : i - workers,
                   rcs[i].text);
        printf(", coordinator %s%s   (--cpu-split off: every role on every core)\n", rcs[workers + experts].text,
               rcs[0].control ? " with every role's control threads" : "");
    }
    return 0;
}

int st_cmd_down(int argc, char **argv) {
    const char *state_arg = NULL;
    for (int i = 0; i < argc; i++) {
        const char *v;
        if ((v = st_cli_opt(argc, argv, &i, "--state"))) state_arg = v;
        else { fprintf(stderr, "strata down: unknown option %s\n", argv[i]); return 2; }
    }
    const char *state = st_cli_state_dir(state_arg);
    pid_t pids[MAX_PROCS];
    int n = read_pids(state, pids);
    if (n <= 0) {
        fprintf(stderr, "strata down: no cluster recorded in %s\n", state);
        return 1;
    }
    stop_pids(pids, n, 1);
    char envp[700];
    snprintf(envp, sizeof envp, "%s/cluster.env", state);
    unlink(envp);
    printf("strata cluster in %s stopped (%d processes)\n", state, n);
    return 0;
}

int st_cmd_status(int argc, char **argv) {
    const char *state_arg = NULL, *http_arg = NULL;
    int raw = 0;
    for (int i = 0; i < argc; i++) {
        const char *v;
        if ((v = st_cli_opt(argc, argv, &i, "--state"))) state_arg = v;
        else if ((v = st_cli_opt(argc, argv, &i, "--http"))) http_arg = v;
        else if (!strcmp(argv[i], "--json")) raw = 1;
        else { fprintf(stderr, "strata status: unknown option %s\n", argv[i]); return 2; }
    }
    char http[200];
    if (http_arg) snprintf(http, sizeof http, "%s", http_arg);
    else if (st_cli_state_get(st_cli_state_dir(state_arg), "http", http, sizeof http) != 0) {
        fprintf(stderr, "strata status: no cluster recorded (use --http HOST:PORT)\n");
        return 1;
    }
    char *body = NULL;
    int code = st_cli_http(http, "GET", "/status", NULL, &body);
    if (code != 200) {
        fprintf(stderr, "strata status: GET http://%s/status failed (%d)\n", http, code);
        free(body);
        return 1;
    }
    if (raw) {
        printf("%s\n", body);
        free(body);
        return 0;
    }
    json_error_t je;
    json_t *j = json_loads(body, 0, &je);
    free(body);
    if (!j) {
        fprintf(stderr, "strata status: bad JSON: %s\n", je.text);
        return 1;
    }
    json_t *pl = json_object_get(j, "placement"), *th = json_object_get(j, "thresholds"), *tp = json_object_get(j, "throughput");
    printf("model %s — %s, routing %s, up %.0f s\n", json_string_value(json_object_get(j, "model")),
           json_is_true(json_object_get(j, "ready")) ? "READY" : "NOT READY", json_string_value(json_object_get(j, "routing")),
           json_number_value(json_object_get(j, "uptime_s")));
    printf("placement v%lld (replicas %lld, %s); thresholds v%lld\n", (long long)json_integer_value(json_object_get(pl, "version")),
           (long long)json_integer_value(json_object_get(pl, "replicas")),
           json_is_true(json_object_get(pl, "complete")) ? "complete" : "INCOMPLETE",
           (long long)json_integer_value(json_object_get(th, "version")));
    printf("requests %lld (ok %lld, error %lld, active %lld); tokens %lld, %.1f tokens/s; expert load max/mean %.2f\n",
           (long long)json_integer_value(json_object_get(tp, "requests_total")), (long long)json_integer_value(json_object_get(tp, "requests_ok")),
           (long long)json_integer_value(json_object_get(tp, "requests_error")), (long long)json_integer_value(json_object_get(tp, "active_requests")),
           (long long)json_integer_value(json_object_get(tp, "tokens_total")), json_number_value(json_object_get(tp, "tokens_per_s")),
           json_number_value(json_object_get(j, "expert_load_max_over_mean")));
    printf("%-6s %-10s %-12s %-22s %-6s %s\n", "id", "role", "name", "endpoint", "alive", "detail");
    size_t i;
    json_t *m;
    json_array_foreach(json_object_get(j, "members"), i, m) {
        char detail[64] = "";
        if (!strcmp(json_string_value(json_object_get(m, "role")), "expert"))
            snprintf(detail, sizeof detail, "%lld experts held", (long long)json_integer_value(json_object_get(m, "experts_held")));
        else
            snprintf(detail, sizeof detail, "step %lld, %lld in flight", (long long)json_integer_value(json_object_get(m, "step")),
                     (long long)json_integer_value(json_object_get(m, "inflight")));
        printf("%-6lld %-10s %-12s %-22s %-6s %s\n", (long long)json_integer_value(json_object_get(m, "id")),
               json_string_value(json_object_get(m, "role")), json_string_value(json_object_get(m, "name")),
               json_string_value(json_object_get(m, "endpoint")), json_is_true(json_object_get(m, "alive")) ? "yes" : "no", detail);
    }
    json_decref(j);
    return 0;
}
