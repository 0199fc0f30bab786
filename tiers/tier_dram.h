/* tiers/tier_dram.h - the dram tier's slab allocator and table members,
 * shared with the hbm tier (tiers/tier_hbm.c), which runs the same allocator
 * over device memory it provides. */
#ifndef KVT_TIER_DRAM_H
#define KVT_TIER_DRAM_H

#include <stdint.h>

#include "kvt_internal.h"
#include "kvtier/tier.h"

typedef struct kvt_dram kvt_dram;

/* Device memory for slabs: alloc (NULL on failure), free, and copy, whose
 * direction comes from the pointers (unified addressing), so host or device
 * buffers may be passed (0 or -EIO). dev: the device the tier was opened on. */
typedef struct kvt_dram_mem {
  void *(*alloc)(int dev, uint64_t size);
  void (*free)(int dev, void *p);
  int (*copy)(int dev, void *dst, const void *src, uint64_t len);
} kvt_dram_mem;

/* A dram tier's state of capacity cap, slabs of host memory (NULL: -ENOMEM).
 * kvt_dram_use_device switches it to mem's memory of device dev before
 * anything is stored (the hbm tier); mem must outlive it. */
kvt_dram *kvt_dram_new(kvt_ctx *ctx, kvt_tier *tier, uint64_t cap);
void kvt_dram_use_device(kvt_dram *d, const kvt_dram_mem *mem, int dev);
uint64_t kvt_dram_slab_size(const kvt_dram *d);

/* The dram backend's members (kvt_tier_backend), for the hbm table. */
void kvt_dram_close(void *state);
int kvt_dram_submit(void *state, kvt_tier_op *op);
int kvt_dram_stats(void *state, kvt_tier_stats *out);
int kvt_dram_list(void *state, kvt_tier_list_fn fn, void *opaque);
int kvt_dram_borrow(void *state, const kvt_key *key, kvt_tier_loan *loan);
void kvt_dram_unborrow(void *state, kvt_tier_loan *loan);
int kvt_dram_reserve(void *state, const kvt_key *key, uint64_t len, kvt_tier_reservation *res);
int kvt_dram_publish(void *state, kvt_tier_reservation *res);
void kvt_dram_abort(void *state, kvt_tier_reservation *res);

#endif
