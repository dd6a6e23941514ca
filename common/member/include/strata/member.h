/* Cluster membership, member side: register with the coordinator, heartbeat, and follow the
 * versioned placement map and thresholds. The registration's id and member token go with every
 * heartbeat and score report; a coordinator that no longer knows them (restarted, or this
 * member's connection changed) is registered with again. Used by expert servers and attention workers. Runs on
 * the process's libuv loop thread (over common/rpc); callbacks run there too. Also what both member roles'
 * processes share: their common command-line flags and their serving phase. */
#ifndef STRATA_MEMBER_H
#define STRATA_MEMBER_H

#include <pthread.h>
#include <stdint.h>

#include "strata/base.h"
#include "strata/proto.h"
#include "strata/rpc.h"

struct uv_loop_s;
struct uv_signal_s;

typedef struct st_member st_member_t;

typedef struct {
    st_proto_role_t role;
    const char *name;
    const char *data_endpoint; /* "host:port" where this member serves (UCX or gRPC) */
    uint32_t capacity;
    const char *coordinator;   /* "host:port" of the coordinator's gRPC, or a comma-separated seed
                                * list tried in turn until one answers */
    const char *coordinator_file; /* optional: a file holding the coordinator's current "host:port"
                                   * (the ready file's grpc= line or a bare address); re-read before
                                   * each new registration, so a coordinator restarted elsewhere is
                                   * found again */
    const st_rpc_sec_t *sec;   /* token (the cluster token) and TLS for calls to the coordinator;
                                * NULL: insecure */
    uint32_t rpc_timeout_ms;   /* per call (default 2000) */
    /* called on the loop thread with each new map / threshold set (owned by the caller only
     * during the call) */
    void (*on_placement)(void *arg, const st_proto_placement_t *p);
    void (*on_thresholds)(void *arg, const st_proto_thresholds_t *t); /* NULL: not followed */
    /* member_token: the coordinator's unguessable token for this registration (attention workers
     * require it on their own gRPC port: only the coordinator has it) */
    void (*on_registered)(void *arg, uint64_t member_id, const char *member_token);
    uint32_t (*inflight)(void *arg); /* reported in heartbeats; may be NULL */
    void *arg;
} st_member_opts_t;

/* The command-line flags every member role takes, parsed in one place: those of st_sec_opts_parse
 * (security, --set), and
 *   --coordinator HOST:PORT[,HOST:PORT...]  --coordinator-file F  --ckpt DIR  --name NAME
 * The strings point into argv. */
typedef struct {
    const char *coordinator, *coordinator_file, *ckpt, *name;
    st_sec_opts_t sec;
} st_member_flags_t;
/* If argv[*i] is one of the flags above, consume it (and its value) and return 1; 0 if not ours;
 * -1 (after printing why) when its value is missing. */
int st_member_flags_parse(st_member_flags_t *f, int argc, char **argv, int *i);

st_status_t st_member_start(struct uv_loop_s *loop, const st_member_opts_t *o, st_member_t **out);
/* The serving phase of a member role, once st_member_start has succeeded and its compute thread runs:
 * SIGINT and SIGTERM call on_signal on the loop (sig_int and sig_term are the caller's handles, their
 * data set to arg; the caller's drain closes them), "<what> <name> listening on <endpoint>" goes to
 * stdout (the line launchers and tests wait for), the loop runs until every handle is closed, and then
 * the compute thread is joined. */
void st_member_serve(struct uv_loop_s *loop, struct uv_signal_s *sig_int, struct uv_signal_s *sig_term,
                     void (*on_signal)(struct uv_signal_s *h, int signum), void *arg, pthread_t compute,
                     const char *what, const char *name, const char *endpoint);
/* Stop timers and wait for calls in flight; done(arg) once everything is released. */
void st_member_stop(st_member_t *m, void (*done)(void *arg), void *arg);
uint64_t st_member_id(const st_member_t *m); /* 0 until registered */
/* The current registration's member token ("" until registered); changes on re-registration. */
const char *st_member_token(const st_member_t *m);
/* The channel to the coordinator now (it changes when the coordinator moves: fetch it per call;
 * NULL before any address is known). */
st_rpc_channel_t *st_member_channel(st_member_t *m);
/* Send an encoded ScoreSummary (e.g. made on another thread with st_proto_scores_encode_into)
 * stamped with the current registration's id and member token, which the coordinator requires.
 * Copies bytes. Fails (no callback) when not registered; else cb exactly once. st_member_stop
 * waits for it. */
st_status_t st_member_report_scores(st_member_t *m, const uint8_t *bytes, size_t len, uint32_t timeout_ms,
                                    st_rpc_reply_fn cb, void *arg);
void st_member_set_step(st_member_t *m, uint64_t step);

#endif
