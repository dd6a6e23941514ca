/* The micro-batch count chosen by measurement (attention_worker/mbtune.h), against synthetic steps
 * whose cost per count is known: it settles on the fastest count of each size class, keeps the
 * classes apart, follows a change of which count is fastest, spends few steps on the others, never
 * picks a count the step does not allow, ignores the first two steps of a new shape, and does not flip
 * back and forth while every count's cost drifts the same way (contexts growing), and corrects a first
 * choice made on cold steps, and is not swayed by a few slow steps. */
#include "harness.h"
#include "mbtune.h"

/* seconds of a step of `tokens` run as m micro-batches: per-token cost cost[m] (+ noise) */
static uint64_t rng = 12345;
static double noise(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return 1.0 + 0.05 * ((double)(rng >> 40) / (double)(1ull << 24) - 0.5); /* ±2.5% */
}

static int changes; /* best counts announced */

/* run n steps, every count's cost growing by `drift` per step; returns how many ran with `want` */
static int run_drift(st_mbtune_t *t, int n, int tokens, int seqs, const double *cost, int want, double drift) {
    int hits = 0, ch;
    for (int i = 0; i < n; i++) {
        int m = st_mbtune_pick(t, tokens, seqs, &ch);
        changes += ch != 0;
        hits += m == want;
        st_mbtune_done(t, tokens, m, tokens * cost[m] * noise() * (1.0 + drift * i));
    }
    return hits;
}
static int run(st_mbtune_t *t, int n, int tokens, int seqs, const double *cost, int want) {
    return run_drift(t, n, tokens, seqs, cost, want, 0);
}

int main(void) {
    st_mbtune_t t;
    /* classes: four per octave, ranges cover every size once */
    int prev_hi = 0, ok_ranges = 1;
    for (int c = 0; c < 4 * 13; c++) {
        int lo, hi;
        st_mbtune_class_range(c, &lo, &hi);
        if (hi < lo) continue; /* empty (below 4 tokens) */
        ok_ranges &= lo == prev_hi + 1 && st_mbtune_class(lo) == c && st_mbtune_class(hi) == c;
        prev_hi = hi;
    }
    CHECK(ok_ranges && prev_hi == 8191, "size classes tile 1..8191 (up to %d)", prev_hi);
    CHECK(st_mbtune_class(32) != st_mbtune_class(256) && st_mbtune_class(32) == st_mbtune_class(33), "32 vs 256 tokens");

    /* what a step may take */
    st_mbtune_init(&t, 2, 16);
    int ch;
    CHECK(st_mbtune_allowed(&t, 1, 1) == 1 && st_mbtune_pick(&t, 1, 1, &ch) == 1, "batch 1: one micro-batch");
    CHECK(st_mbtune_allowed(&t, 31, 31) == 1, "31 tokens with a floor of 16: one");
    CHECK(st_mbtune_allowed(&t, 32, 32) == 2 && st_mbtune_allowed(&t, 256, 1) == 1, "32 tokens: two; one sequence: one");
    st_mbtune_init(&t, 9, 1);
    CHECK(t.max_mb == ST_MBT_MAX && st_mbtune_allowed(&t, 3, 3) == 3, "the maximum is clamped to %d", ST_MBT_MAX);

    /* two is faster: settles on two, the other count gets a few percent of the steps */
    const double two_wins[ST_MBT_MAX + 1] = {0, 10e-6, 7e-6, 9e-6, 12e-6};
    st_mbtune_init(&t, 4, 8);
    run(&t, 100, 256, 64, two_wins, 2);
    int hits = run(&t, 1000, 256, 64, two_wins, 2);
    CHECK(hits >= 900, "two micro-batches faster: picked in %d of 1000 steps", hits);
    CHECK(hits < 1000, "and the others are still tried now and then (%d of 1000)", hits);
    CHECK(t.cls[st_mbtune_class(256)].best == 2, "the class's best is 2 (%d)", t.cls[st_mbtune_class(256)].best);
    CHECK(changes == 1, "one choice announced (%d)", changes);

    /* one is faster in another class, at the same time: the classes do not mix */
    const double one_wins[ST_MBT_MAX + 1] = {0, 5e-6, 8e-6, 9e-6, 12e-6};
    run(&t, 100, 32, 32, one_wins, 1);
    hits = run(&t, 500, 32, 32, one_wins, 1);
    CHECK(hits >= 450, "one micro-batch faster at 32 tokens: %d of 500", hits);
    hits = run(&t, 500, 256, 64, two_wins, 2);
    CHECK(hits >= 450, "and 256 tokens still runs two: %d of 500", hits);

    /* the fastest changes (a neighbour takes the GPU): follows within a few exploration periods */
    const double three_wins[ST_MBT_MAX + 1] = {0, 10e-6, 9e-6, 6e-6, 12e-6};
    run(&t, 4 * ST_MBT_EXPLORE * 3, 256, 64, three_wins, 3);
    hits = run(&t, 500, 256, 64, three_wins, 3);
    CHECK(hits >= 450, "after the change three is picked: %d of 500", hits);

    /* every count's cost grows 0.1% a step (a stale measurement of another count looks better than a
     * fresh one of the current): the choice stays */
    const double close[ST_MBT_MAX + 1] = {0, 10e-6, 9.5e-6, 11e-6, 12e-6};
    st_mbtune_init(&t, 3, 8);
    changes = 0;
    hits = run_drift(&t, 2000, 128, 32, close, 2, 1e-3);
    CHECK(hits >= 1800 && changes == 1, "drifting costs: 2 in %d of 2000 steps, %d changes announced", hits, changes);

    /* the batch moves across a class boundary every step (31, 32, 31, ... tokens): both classes still
     * settle on the fastest */
    st_mbtune_init(&t, 2, 8);
    hits = 0;
    for (int i = 0; i < 1000; i++) {
        int tok = 31 + i % 2, m = st_mbtune_pick(&t, tok, tok, &ch);
        hits += i >= 200 && m == 2;
        st_mbtune_done(&t, tok, m, tok * two_wins[m] * noise());
    }
    CHECK(hits >= 720, "alternating classes: two in %d of the last 800 steps", hits);

    /* never more than the step allows, whatever was learnt */
    int over = 0;
    for (int i = 0; i < 300; i++) {
        int seqs = 1 + i % 3, m = st_mbtune_pick(&t, 256, seqs, &ch);
        over += m > seqs;
        st_mbtune_done(&t, 256, m, 256 * three_wins[m]);
    }
    CHECK(over == 0, "counts beyond the sequences: %d", over);

    /* a cold start (the first steps of the class pay for loading and capturing: one micro-batch, tried
     * first, measures 3× its cost for its first 6 steps): two is chosen first, one takes over at the
     * trial that confirms the choice, within 25 steps */
    st_mbtune_init(&t, 2, 8);
    int first_one = -1;
    for (int i = 0; i < 60; i++) {
        int m = st_mbtune_pick(&t, 32, 32, &ch);
        if (first_one < 0 && i >= 8 && t.cls[st_mbtune_class(32)].best == 1) first_one = i;
        st_mbtune_done(&t, 32, m, 32 * one_wins[m] * noise() * (i < 6 ? 3.0 : 1.0));
    }
    CHECK(first_one >= 0 && first_one <= 25 && t.cls[st_mbtune_class(32)].best == 1,
          "after a cold start one micro-batch is chosen from step %d", first_one);

    /* one step in four of one micro-batch costs six times the others (a graph captured at a server, a
     * neighbour's burst): a mean would make it 2.25× and pick two; the median keeps one */
    st_mbtune_init(&t, 2, 8);
    hits = 0;
    for (int i = 0, ones = 0; i < 600; i++) {
        int m = st_mbtune_pick(&t, 32, 32, &ch);
        hits += i >= 200 && m == 1;
        double spike = m == 1 && ++ones % 4 == 0 ? 6.0 : 1.0;
        st_mbtune_done(&t, 32, m, 32 * one_wins[m] * noise() * spike);
    }
    CHECK(hits >= 360, "outlier steps: one micro-batch in %d of the last 400 steps", hits);

    /* the first two steps of a shape (run plainly, then captured as CUDA graphs) are not measured */
    st_mbtune_init(&t, 2, 1);
    st_mbtune_done(&t, 64, 1, 1.0); /* first: plain launches, slow */
    st_mbtune_done(&t, 64, 1, 1.0); /* second: the capture, slow */
    int c = st_mbtune_class(64);
    CHECK(t.cls[c].n[1] == 0, "the two steps after another shape are not measured (%d)", t.cls[c].n[1]);
    st_mbtune_done(&t, 64, 1, 64e-6);
    CHECK(t.cls[c].n[1] == 1 && t.cls[c].cost[1] < 2e-6f, "the next one is (%d, %g)", t.cls[c].n[1], t.cls[c].cost[1]);
    st_mbtune_done(&t, 64, 1, -1.0);
    CHECK(t.cls[c].n[1] == 1, "a negative time is ignored");
    return st_test_done();
}
