/* The MoE combine's summation tree (docs/architecture.md, "Bit-exact expert results", rule 1), one
 * column at a time: a stack form of the pairwise sum along the complete binary tree over expert ids,
 * for the CUDA kernels (one thread per column) and their C twins. Header-only, plain C, no state.
 * The row form that reads like the rule is st_moe_tree_rows (kernels.h); tests/unit/test_tree.c
 * checks that both give the same bits. */
#ifndef STRATA_MOE_TREE_H
#define STRATA_MOE_TREE_H

#include <stdint.h>

#ifdef __CUDACC__
#define ST_TREE_FN __host__ __device__ static inline
#else
#define ST_TREE_FN static inline
#endif

/* NOTE: the stack holds entries whose neighbours' tree levels (highest differing bit) strictly
 * decrease towards the top, so ids strictly ascending in [0, 2^32) need at most 33 entries. */
#define ST_MOE_TREE_DEPTH 33

typedef struct {
    float v[ST_MOE_TREE_DEPTH];
    uint32_t id[ST_MOE_TREE_DEPTH];
    int top;
} st_moe_tree_t;

/* highest set bit of a below that of b (a, b not both 0) */
ST_TREE_FN int st_moe_tree_below(uint32_t a, uint32_t b) { return a < b && a < (a ^ b); }

/* fp32 sum rounded once: no contraction with a product computed before it */
ST_TREE_FN float st_moe_tree_add(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}

ST_TREE_FN void st_moe_tree_merge(st_moe_tree_t *s) {
    s->v[s->top - 2] = st_moe_tree_add(s->v[s->top - 2], s->v[s->top - 1]); /* left first */
    s->top--;
}

ST_TREE_FN void st_moe_tree_init(st_moe_tree_t *s) { s->top = 0; }

/* Entry id (a leaf's expert id, or a tree node's first leaf) with value v; ids strictly ascending
 * over the pushes. Two neighbours whose common node lies below the one they share with the new
 * entry are complete: they merge first. (Ids out of order give some sum, never an overflow.) */
ST_TREE_FN void st_moe_tree_push(st_moe_tree_t *s, uint32_t id, float v) {
    while (s->top >= 2 && st_moe_tree_below(s->id[s->top - 2] ^ s->id[s->top - 1], s->id[s->top - 1] ^ id))
        st_moe_tree_merge(s);
    if (s->top == ST_MOE_TREE_DEPTH) st_moe_tree_merge(s);
    s->id[s->top] = id;
    s->v[s->top++] = v;
}

/* The tree's value: what is left merges from the top down; +0 without entries. */
ST_TREE_FN float st_moe_tree_end(st_moe_tree_t *s) {
    while (s->top >= 2) st_moe_tree_merge(s);
    return s->top ? s->v[0] : 0.0f;
}

#endif
