/* core/key_index.h - the one key index of the library (the dram and nvme
 * tiers, the cache, the server): a hash table from a chunk key to a small
 * entry, open addressing with linear probing and backward-shift deletion,
 * power-of-two size, load at most 3/4.
 *
 * Not thread-safe: each user guards its index with its own lock. Growth
 * happens only in kvt_index_reserve, so a user reserves room before work it
 * cannot undo (a rename, a copied payload) and publishing never fails. */
#ifndef KVT_KEY_INDEX_H
#define KVT_KEY_INDEX_H

#include <stdint.h>

#include "kvt_internal.h"
#include "kvtier/key.h"

/* 40 bytes. len and off stay 64 bits wide: tiers take values of any length
 * (KVT_PAYLOAD_MAX binds payloads, not what kvt_tier_put or the server
 * store), and a dram slab sized to a large value has offsets past 2^32. */
typedef struct kvt_index_entry {
  kvt_key key;
  uint64_t len; /* payload bytes */
  union {
    uint64_t off; /* the tier's: dram block offset; nvme bytes on disk */
    void *ref;    /* an index over the user's own entries (cache, server): the entry */
  };
  uint32_t slab; /* the tier's: dram slab */
  uint16_t pin;  /* the tier's: dram pin record + 1 */
  uint8_t live;  /* 0: an empty slot */
} kvt_index_entry;

typedef struct kvt_index {
  kvt_ctx *ctx; /* allocates the table */
  kvt_index_entry *slots;
  uint64_t cap, items;
} kvt_index;

/* A (key, length) pair, as kvt_index_snapshot copies them out. */
typedef struct kvt_index_item {
  kvt_key key;
  uint64_t len;
} kvt_index_item;

void kvt_index_init(kvt_index *ix, kvt_ctx *ctx);
void kvt_index_free(kvt_index *ix);

/* The slot where a search for k starts. Keys are XXH3 output in production,
 * but the tier and cache APIs take the caller's keys, which may be
 * structured (a grid of two counters, equal halves), so both halves are
 * mixed by multiplication: a linear fold would send such keys to a few
 * slots. Inline, with find: a cache lookup walks one find per chunk. */
static inline uint64_t kvt_index_hash(const kvt_key *k) {
  uint64_t h = kvt_ld64(k->bytes) ^ (kvt_ld64(k->bytes + 8) * 0x9E3779B97F4A7C15ull);
  h ^= h >> 31;
  h *= 0xD6E8FEB86659FD93ull;
  return h ^ (h >> 32);
}

/* The live entry for k, or NULL. */
static inline kvt_index_entry *kvt_index_find(const kvt_index *ix, const kvt_key *k) {
  if (!ix->cap)
    return NULL;
  const uint64_t mask = ix->cap - 1, lo = kvt_ld64(k->bytes), hi = kvt_ld64(k->bytes + 8);
  for (uint64_t i = kvt_index_hash(k) & mask;; i = (i + 1) & mask) {
    kvt_index_entry *e = &ix->slots[i];
    if (!e->live)
      return NULL;
    if (kvt_ld64(e->key.bytes) == lo && kvt_ld64(e->key.bytes + 8) == hi)
      return e;
  }
}

/* Room for `want` live entries without growing: 0 or -ENOMEM. */
int kvt_index_reserve(kvt_index *ix, uint64_t want);

/* The entry for k: the live one, or a fresh slot marked live with key set
 * and the other fields zero (*fresh = 1). Room must have been reserved. */
kvt_index_entry *kvt_index_upsert(kvt_index *ix, const kvt_key *k, int *fresh);

/* Removes a live entry (a pointer from find/upsert, valid until the next
 * change of the index). */
void kvt_index_remove(kvt_index *ix, kvt_index_entry *e);

/* Copies up to max live (key, len) pairs into out; returns how many. */
uint64_t kvt_index_snapshot(const kvt_index *ix, kvt_index_item *out, uint64_t max);

#endif
