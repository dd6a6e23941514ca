/* Internal hooks of common/http for fuzzing and tests: a server without a listener, and a fake
 * connection fed from memory whose output goes to a callback. Not part of the public API. */
#ifndef STRATA_HTTP_FUZZ_H
#define STRATA_HTTP_FUZZ_H

#include "strata/http.h"

#ifdef __cplusplus
extern "C" {
#endif

struct uv_loop_s;

typedef void (*st_http_sink_fn)(void *arg, const void *data, size_t len);

/* Like st_http_server_create without listening (no TLS). in_cap: the per-connection input buffer
 * in bytes (0: the default, 64 KiB + max_header; small values exercise the full-buffer paths).
 * Close with st_http_server_close. */
st_status_t st_http_server_create_detached(struct uv_loop_s *loop, const st_http_opts_t *opts, size_t in_cap,
                                           st_http_server_t **out);

/* Runs one fake connection of srv to its end: data arrives as socket reads of at most chunk bytes
 * (the connection's input cap still applies: while it does not read, loop iterations run with
 * uv_run(UV_RUN_NOWAIT) until it does); then, if expire, its current deadline fires; then the
 * client's EOF; then the loop runs until the connection is freed. Every byte the server writes goes
 * to sink, in order. Returns 0, or -1 when the connection stopped making progress (a stall). */
int st_http_fuzz_run(st_http_server_t *srv, const void *data, size_t len, size_t chunk, int expire,
                     st_http_sink_fn sink, void *arg);

#ifdef __cplusplus
}
#endif
#endif
