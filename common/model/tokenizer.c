/* Byte-level tokenizer of the presets: token id = byte value; ids >= 256 (bos/eos/specials)
 * decode to nothing. Not the K3 tiktoken BPE. */
#include "strata/model.h"

int st_tok_encode(const char *text, int *ids, int max_ids) {
    int n = 0;
    if (!text) return 0;
    for (const unsigned char *p = (const unsigned char *)text; *p && n < max_ids; p++) ids[n++] = *p;
    return n;
}

int st_tok_decode(const int *ids, int n, char *out, int max_out) {
    int o = 0;
    for (int i = 0; i < n && o < max_out; i++)
        if (ids[i] >= 0 && ids[i] < 256) out[o++] = (char)ids[i];
    return o;
}
