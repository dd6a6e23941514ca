/* Shared by the libFuzzer harnesses (fuzz/fuzz_*.c): FUZZ_REQUIRE checks an invariant beyond "no
 * crash" and, when it fails, reports through the sanitizer runtime (scripts/fuzz.sh runs with
 * -close_fd_mask=2, so the process's own stderr goes nowhere) and aborts, which makes libFuzzer
 * write the input as a crash artifact. */
#ifndef STRATA_FUZZ_H
#define STRATA_FUZZ_H

#include <sanitizer/common_interface_defs.h>
#include <stdio.h>
#include <stdlib.h>

#define FUZZ_REQUIRE(cond)                                                                            \
    do {                                                                                              \
        if (!(cond)) {                                                                                \
            char fuzz_msg_[512];                                                                      \
            snprintf(fuzz_msg_, sizeof fuzz_msg_, "invariant failed at %s:%d: %s", __FILE__, __LINE__, \
                     #cond);                                                                          \
            __sanitizer_report_error_summary(fuzz_msg_);                                              \
            abort();                                                                                  \
        }                                                                                             \
    } while (0)

#endif
