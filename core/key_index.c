/* core/key_index.c - the key index (key_index.h). */
#include <errno.h>

#include "key_index.h"

#define INDEX_MIN 256u

void kvt_index_init(kvt_index *ix, kvt_ctx *ctx) {
  memset(ix, 0, sizeof(*ix));
  ix->ctx = ctx;
}

void kvt_index_free(kvt_index *ix) {
  kvt_dealloc(ix->ctx, ix->slots);
  ix->slots = NULL;
  ix->cap = ix->items = 0;
}

/* An empty slot for a key known to be absent; room was reserved. */
static kvt_index_entry *empty_slot(const kvt_index *ix, const kvt_key *k) {
  const uint64_t mask = ix->cap - 1;
  uint64_t i = kvt_index_hash(k) & mask;
  while (ix->slots[i].live)
    i = (i + 1) & mask;
  return &ix->slots[i];
}

int kvt_index_reserve(kvt_index *ix, uint64_t want) {
  if (want * 4 <= ix->cap * 3)
    return 0;
  uint64_t cap = ix->cap ? ix->cap * 2 : INDEX_MIN;
  while (want * 4 > cap * 3)
    cap *= 2;
  kvt_index_entry *slots = kvt_alloc(ix->ctx, cap * sizeof(*slots), 64);
  if (!slots)
    return -ENOMEM;
  memset(slots, 0, cap * sizeof(*slots));
  kvt_index_entry *old = ix->slots;
  const uint64_t old_cap = ix->cap;
  ix->slots = slots;
  ix->cap = cap;
  for (uint64_t i = 0; i < old_cap; i++)
    if (old[i].live)
      *empty_slot(ix, &old[i].key) = old[i];
  kvt_dealloc(ix->ctx, old);
  return 0;
}

kvt_index_entry *kvt_index_upsert(kvt_index *ix, const kvt_key *k, int *fresh) {
  kvt_index_entry *e = kvt_index_find(ix, k);
  *fresh = !e;
  if (e)
    return e;
  e = empty_slot(ix, k);
  memset(e, 0, sizeof(*e));
  e->key = *k;
  e->live = 1;
  ix->items++;
  return e;
}

/* Backward-shift deletion: no tombstones, so probe chains stay short under
 * churn without periodic rehashing. */
void kvt_index_remove(kvt_index *ix, kvt_index_entry *e) {
  const uint64_t mask = ix->cap - 1;
  uint64_t hole = (uint64_t)(e - ix->slots);
  for (uint64_t j = (hole + 1) & mask; ix->slots[j].live; j = (j + 1) & mask) {
    const uint64_t home = kvt_index_hash(&ix->slots[j].key) & mask;
    if (((j - home) & mask) >= ((j - hole) & mask)) {
      ix->slots[hole] = ix->slots[j];
      hole = j;
    }
  }
  ix->slots[hole].live = 0;
  ix->items--;
}

uint64_t kvt_index_snapshot(const kvt_index *ix, kvt_index_item *out, uint64_t max) {
  uint64_t k = 0;
  for (uint64_t i = 0; i < ix->cap && k < max; i++)
    if (ix->slots[i].live)
      out[k++] = (kvt_index_item){ix->slots[i].key, ix->slots[i].len};
  return k;
}
