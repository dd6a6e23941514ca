/* Expert placement: which live expert servers hold each expert of each MoE layer. Pure logic, no
 * I/O. A new map keeps every still-valid assignment (servers hold their experts as long as they
 * live) and fills holes with the least-loaded live server, so a lost server moves only its own
 * experts. Balance: within every layer the servers' counts differ by at most one, and so do their
 * totals (moves only where needed: a joining server takes its share). Replicas of one expert are on
 * distinct servers and, when there are at least R hosts, on distinct hosts. O(cells x R x log n)
 * plus O(holes x n): K3 (82,432 experts x 2 over 64 servers) in tens of ms (docs/quantile.md). */
#ifndef STRATA_COORD_PLACEMENT_H
#define STRATA_COORD_PLACEMENT_H

#include <stdbool.h>
#include <stdint.h>

#include "strata/base.h"

#define ST_PLACE_MAX_REPLICAS 8

typedef struct {
    int n_layers, n_experts, replicas;   /* MoE layers × experts; R */
    uint64_t version;
    /* holder[(l*n_experts + e)*replicas + r] = server member id, 0 = none */
    uint64_t *holder;
} st_placement_t;

typedef struct {
    uint64_t id;       /* member id, never 0 */
    uint32_t capacity; /* most experts (summed over layers) it may hold; 0 = unlimited */
    uint32_t host;     /* servers with the same nonzero host share a machine; 0 = its own */
} st_place_server_t;

st_status_t st_placement_init(st_placement_t *p, int n_layers, int n_experts, int replicas);
void st_placement_cleanup(st_placement_t *p);
/* Recompute over the live servers (any order; the result does not depend on it). Returns ST_OK
 * when every expert has min(R, n_live) holders, ST_ERR_CAPACITY when capacities are too small
 * (the map is filled as far as possible). version bumps when anything changed. */
st_status_t st_placement_update(st_placement_t *p, const st_place_server_t *live, int n_live);
/* Holders of expert e of MoE layer l (up to replicas; zeros mean none). */
static inline const uint64_t *st_placement_holders(const st_placement_t *p, int l, int e) {
    return p->holder + ((size_t)l * (size_t)p->n_experts + (size_t)e) * (size_t)p->replicas;
}
/* A server re-registered under a new id (same name and endpoint): it keeps the experts it held.
 * Returns the number of assignments moved; version bumps when any did. */
int st_placement_rename(st_placement_t *p, uint64_t from, uint64_t to);
/* Experts held by one server, in total. */
int st_placement_count(const st_placement_t *p, uint64_t server);
/* The same for n servers in one pass over the map: out[i] for ids[i] (ids in any order). */
void st_placement_counts(const st_placement_t *p, const uint64_t *ids, int n, int *out);
/* Every expert has at least one holder. */
bool st_placement_complete(const st_placement_t *p);

#endif
