/* Token embedding (SPEC §2): the first residual-stream rows are rows of the embedding table. */
#include <string.h>

#include "strata/kernels.h"

void st_embed(float *partial, const float *E, const int *tok, int T, int d) {
    for (int t = 0; t < T; t++) memcpy(partial + (size_t)t * d, E + (size_t)tok[t] * d, (size_t)d * sizeof(float));
}
