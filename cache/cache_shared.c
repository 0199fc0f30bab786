/* cache/cache_shared.c - tiers that other processes write too (redis://,
 * redis+cluster://, fabric://): a prefill node puts chunks into Redis or a
 * kvtier-server and a decode node, or another engine host, must find them.
 * The index knows what the tier held when the cache opened (it lists every
 * persistent tier) and what this process put since; a key the index misses
 * is therefore asked of the shared tiers (QUERY, all keys of a batch in
 * flight at once) before it counts as a miss, and what they hold is indexed.
 * Lookups and gets call this; kvt_cache_query and kvt_cache_where answer
 * from the index alone. */
#include <errno.h>
#include <string.h>

#include "cache_internal.h"

#define DISCOVER_BATCH 64

/* Indexes tier t's copy of key (len bytes) unless the index knows better
 * (mu held). Returns 0 or -ENOMEM. */
static int adopt(kvt_cache *c, const kvt_key *key, uint64_t len, int t) {
  centry *e = cache_find(c, key);
  if (!e) {
    e = kvt_alloc(c->ctx, sizeof(*e), _Alignof(centry));
    if (!e)
      return -ENOMEM;
    memset(e, 0, sizeof(*e));
    e->key = *key;
    if (cache_index_add(c, e)) {
      kvt_dealloc(c->ctx, e);
      return -ENOMEM;
    }
    e->len = len;
    e->state = E_LIVE;
  }
  /* A put, delete or move of it in progress here decides; a copy of another
   * length is someone else's replacement that this cache does not track. */
  if (e->state != E_LIVE || e->moving || HAS(e, t) || e->len != len)
    return 0;
  cache_add_copy(c, e, t, 0);
  c->t[t].used += cache_cost(c, t, len);
  return 0;
}

/* One batch of at most DISCOVER_BATCH keys. */
static size_t discover_batch(kvt_cache *c, const kvt_key *keys, size_t n) {
  size_t want[DISCOVER_BATCH], m = 0, added = 0;
  pthread_mutex_lock(&c->mu);
  for (size_t i = 0; i < n; i++) {
    const centry *e = cache_find(c, &keys[i]);
    if (!e || (e->state == E_LIVE && !e->mask && !e->moving))
      want[m++] = i;
  }
  pthread_mutex_unlock(&c->mu);
  kvt_tier_op ops[DISCOVER_BATCH], *pops[DISCOVER_BATCH];
  for (int t = 0; t < c->ntiers && m; t++) {
    if (!c->t[t].shared)
      continue;
    for (size_t j = 0; j < m; j++) {
      kvt_tier_op_init(&ops[j], KVT_TIER_QUERY, &keys[want[j]], NULL, 0, 0);
      pops[j] = &ops[j];
    }
    size_t sent = 0;
    while (sent < m) {
      const int r = kvt_tier_submit_owned(c->t[t].tier, pops + sent, m - sent);
      if (r <= 0)
        break; /* a dead server: nothing found there now */
      sent += (size_t)r;
    }
    for (size_t j = 0; j < sent; j++)
      (void)kvt_tier_wait(c->t[t].tier, &ops[j], -1);
    size_t left = 0;
    pthread_mutex_lock(&c->mu);
    for (size_t j = 0; j < m; j++) {
      if (j < sent && ops[j].result == 0) {
        if (adopt(c, &keys[want[j]], ops[j].out_len, t) == 0)
          added++;
      } else {
        want[left++] = want[j]; /* ask the next shared tier */
      }
    }
    pthread_mutex_unlock(&c->mu);
    m = left;
  }
  return added;
}

size_t cache_discover(kvt_cache *c, const kvt_key *keys, size_t n) {
  if (!c->nshared)
    return 0;
  size_t added = 0;
  for (size_t i = 0; i < n; i += DISCOVER_BATCH)
    added += discover_batch(c, keys + i, n - i < DISCOVER_BATCH ? n - i : DISCOVER_BATCH);
  return added;
}
