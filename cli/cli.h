/* The `strata` command: subcommand entry points and small shared helpers. */
#ifndef STRATA_CLI_H
#define STRATA_CLI_H

#include <stdio.h>

#include "strata/base.h"

typedef struct {
    FILE *f;
    int rows, cols;
} st_npy_t;
st_status_t st_npy_open(st_npy_t *n, const char *path, int cols);
st_status_t st_npy_append(st_npy_t *n, const float *rows, int count);
st_status_t st_npy_close(st_npy_t *n);

/* option parsing: returns the value of --name (argv[i+1]) and advances i, or NULL */
const char *st_cli_opt(int argc, char **argv, int *i, const char *name);
/* "1,2,3" → ids; returns count or -1 on a malformed list */
int st_cli_parse_ids(const char *s, int *ids, int max);

int st_cmd_ckpt(int argc, char **argv);
int st_cmd_run(int argc, char **argv);
int st_cmd_tokenize(int argc, char **argv); /* tokenize.c */
int st_cmd_eval(int argc, char **argv);     /* eval.c */
/* local cluster (cluster.c) and its client (generate.c) */
int st_cmd_up(int argc, char **argv);
int st_cmd_down(int argc, char **argv);
int st_cmd_status(int argc, char **argv);
int st_cmd_generate(int argc, char **argv);
const char *st_cli_state_dir(const char *given);
int st_cli_state_get(const char *state, const char *key, char *out, size_t n);
int st_cli_http(const char *hostport, const char *method, const char *path, const char *body, char **out);

#endif
