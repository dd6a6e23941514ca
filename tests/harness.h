/* Minimal test harness: CHECK macros count passes and failures; st_test_done() prints the
 * closing line "N passed, N failed" and returns the exit code (0 only when nothing failed and at
 * least one check ran). Comparison helpers report relative L2, max error and NaN/Inf positions. */
#ifndef STRATA_TEST_HARNESS_H
#define STRATA_TEST_HARNESS_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int st_t_pass, st_t_fail;

#define CHECK(cond, ...)                                                            \
    do {                                                                            \
        if (cond) {                                                                 \
            st_t_pass++;                                                            \
        } else {                                                                    \
            st_t_fail++;                                                            \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);         \
            fprintf(stderr, __VA_ARGS__);                                           \
            fprintf(stderr, "\n");                                                  \
        }                                                                           \
    } while (0)

/* Compare two float arrays. Pass iff NaN/Inf positions agree, rel L2 <= rel_tol and
 * max|a-b| <= abs_tol + rel_tol*max|b|. Prints a line either way. */
static inline int st_t_close(const char *what, const float *a, const float *b, size_t n, double rel_tol,
                             double abs_tol) {
    double num = 0, den = 0, maxe = 0, maxb = 0;
    size_t bad_nan = 0, worst = 0;
    for (size_t i = 0; i < n; i++) {
        int fa = isfinite(a[i]), fb = isfinite(b[i]);
        if (fa != fb) { bad_nan++; continue; }
        if (!fa) { bad_nan++; continue; } /* a NaN/Inf anywhere is a failure (SPEC §8) */
        double e = fabs((double)a[i] - (double)b[i]);
        num += e * e;
        den += (double)b[i] * (double)b[i];
        if (e > maxe) { maxe = e; worst = i; }
        if (fabs(b[i]) > maxb) maxb = fabs(b[i]);
    }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    int ok = bad_nan == 0 && rel <= rel_tol && maxe <= abs_tol + rel_tol * maxb;
    if (ok) st_t_pass++; else st_t_fail++;
    fprintf(ok ? stdout : stderr, "%s %s: n=%zu relL2=%.3e maxerr=%.3e (at %zu) max|ref|=%.3e nonfinite=%zu\n",
            ok ? "ok  " : "FAIL", what, n, rel, maxe, worst, maxb, bad_nan);
    return ok;
}

static inline int st_test_done(void) {
    printf("%d passed, %d failed\n", st_t_pass, st_t_fail);
    return (st_t_fail == 0 && st_t_pass > 0) ? 0 : 1;
}

#endif
