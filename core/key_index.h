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

typedef struct kvt_index_entry {
  kvt_key key;
  uint64_t len;  /* payload bytes */
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

/* The live entry for k, or NULL. */
kvt_index_entry *kvt_index_find(const kvt_index *ix, const kvt_key *k);

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
