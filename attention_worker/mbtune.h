/* How many ping-pong micro-batches a step is cut into, chosen by measurement (MegaScale-Infer's
 * condition m ≥ 2(1 + T_comm/T_compute) depends on the link, the server, the batch and what shares the
 * device, so it is measured, not assumed). Per size class of the step (its tokens, four classes per
 * octave), the median of the last ST_MBT_KEEP steps' seconds per token for each count (a median: one
 * step that captured a graph, here or at an expert server, or waited on another tenant, costs many
 * times a plain one and would sway a mean for several steps); a class first runs every
 * count it allows for a few steps and takes the fastest, tries each other count once more soon after
 * (ST_MBT_CONFIRM steps apart: the first samples are the coldest, taken while the step's graphs are
 * captured and its kernels loaded), then every ST_MBT_EXPLORE steps runs another
 * count for a few steps and moves to it when the median of its measured steps beat the current count's
 * (measured up to the trial, so both are recent: costs drift as contexts grow) by ST_MBT_MARGIN. The first two steps
 * after a change of count are not measured (their micro-batches have new shapes: the GPU engine runs
 * the first plainly and, unless graphs of that shape are still cached, captures them in the second).
 * Pure logic: the worker feeds it its steps. */
#ifndef STRATA_AW_MBTUNE_H
#define STRATA_AW_MBTUNE_H

#include <stdint.h>

#define ST_MBT_MAX 4       /* micro-batch counts tried: 1..ST_MBT_MAX */
#define ST_MBT_CLASSES 80  /* four per octave of tokens: up to 2^20 */
#define ST_MBT_RUN 5       /* steps of one trial (its first ST_MBT_SKIP are not measured) */
#define ST_MBT_SKIP 2      /* steps after a change of count that are not measured */
#define ST_MBT_SAMPLES 3   /* measured steps a count needs in a class before the class compares */
#define ST_MBT_EXPLORE 100 /* a class's steps between two trials of a count that is not its best */
#define ST_MBT_CONFIRM 8   /* the same for the trials that confirm the first choice */
#define ST_MBT_MARGIN 0.02f /* how much faster a trial must be to take over */
#define ST_MBT_KEEP 5       /* the recent steps a count's median is taken over */

typedef struct {
    float cost[ST_MBT_MAX + 1];              /* median of the kept seconds per token, per count */
    float kept[ST_MBT_MAX + 1][ST_MBT_KEEP]; /* the last measured steps' seconds per token, a ring */
    uint16_t n[ST_MBT_MAX + 1]; /* measured steps, per count (saturates) */
    uint8_t at[ST_MBT_MAX + 1]; /* the ring's next slot, per count */
    uint8_t best;               /* the count the class runs (0: not yet chosen) */
    uint8_t next_try;           /* the count the next trial takes, in rotation */
    uint8_t run_m, run_left;    /* the class's trial (run_m 0: none): its count, steps still to pick */
    uint8_t confirms;           /* trials since the first choice (saturates at ST_MBT_MAX) */
    uint16_t run_n;             /* its measured steps */
    float run[ST_MBT_RUN];      /* their seconds per token */
    uint32_t steps;             /* steps run since the last trial */
} st_mbt_class_t;

typedef struct {
    int max_mb, min_tokens; /* --micro-batches, --min-mb-tokens */
    int last_m, same;       /* the previous step's count, and how many steps in a row ran it */
    st_mbt_class_t cls[ST_MBT_CLASSES];
} st_mbtune_t;

void st_mbtune_init(st_mbtune_t *t, int max_mb, int min_tokens);
/* The counts a step of `tokens` over `n_seqs` sequences may take: 1..this (1 when the step is too
 * small to give each micro-batch min_tokens, or has one sequence). */
int st_mbtune_allowed(const st_mbtune_t *t, int tokens, int n_seqs);
/* The count for the next step. *changed: the class's best count when this call changed it (for a
 * log line), else 0. */
int st_mbtune_pick(st_mbtune_t *t, int tokens, int n_seqs, int *changed);
/* The step picked last ran `m` micro-batches over `tokens` in `seconds`. */
void st_mbtune_done(st_mbtune_t *t, int tokens, int m, double seconds);
/* The size class of a step (for log lines: its tokens are [lo, hi]). */
int st_mbtune_class(int tokens);
void st_mbtune_class_range(int cls, int *lo, int *hi);

#endif
