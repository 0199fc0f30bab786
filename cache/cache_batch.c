/* cache/cache_batch.c - the get variants beside kvt_cache_get:
 * kvt_cache_get_many() (many gets with several reads in flight per tier, the
 * checks and counters of one get each, promotions afterwards) and
 * kvt_cache_borrow() (a payload lent in place by a memory tier). The shared
 * get path is in cache/cache_ops.c. */
#include <errno.h>

#include "cache_internal.h"
#include "kvtier/gpu.h"

#define WINDOW_MAX 64 /* reads in flight per tier */

typedef struct pending {
  centry *e;     /* pinned; NULL: a miss at begin, or finished */
  int tier;      /* the tier read from */
  int read_rc;   /* the read's result */
} pending;

/* Reads the requests in idx[0..m) (all held by tier t) with up to w in
 * flight, through operations only this call waits for (other threads may be
 * polling or reading the same tier). Waits for the oldest first: reads of
 * similar sizes finish roughly in order, and the rest keep the device busy. */
static void read_tier(kvt_cache *c, int t, kvt_cache_get_req *reqs, pending *p,
                      const size_t *idx, size_t m, uint32_t w) {
  kvt_tier *tier = c->t[t].tier;
  kvt_tier_op ops[WINDOW_MAX];
  size_t head = 0, next = 0; /* ring of ops: [head, next) in flight, slot = i % w */
  while (head < m) {
    while (next < m && next - head < w) {
      kvt_tier_op *op = &ops[next % w];
      kvt_cache_get_req *r = &reqs[idx[next]];
      kvt_tier_op_init(op, KVT_TIER_GET, &r->key, r->buf, r->cap, idx[next]);
      if (kvt_tier_submit_owned(tier, &op, 1) != 1)
        break; /* queue full or closing: wait for what is in flight first */
      next++;
    }
    if (head == next) { /* nothing could be submitted: the slow path reads it */
      p[idx[head]].read_rc = KVT_ENOTFOUND;
      head++;
      next = head;
      continue;
    }
    kvt_tier_op *op = &ops[head % w];
    const size_t j = idx[head];
    p[j].read_rc = kvt_tier_wait(tier, op, -1);
    reqs[j].len = op->out_len;
    head++;
  }
}

int kvt_cache_get_many(kvt_cache *c, kvt_cache_get_req *reqs, size_t n, uint32_t max_in_flight) {
  if (!c || (!reqs && n))
    return -EINVAL;
  for (size_t i = 0; i < n; i++)
    if ((!reqs[i].buf && reqs[i].cap) || reqs[i].reserved[0] || reqs[i].reserved[1])
      return -EINVAL;
  const uint32_t w = max_in_flight == 0 ? 32 : max_in_flight > WINDOW_MAX ? WINDOW_MAX
                                                                           : max_in_flight;
  pending *p = kvt_alloc(c->ctx, n * sizeof(*p) + 1, _Alignof(pending));
  size_t *idx = kvt_alloc(c->ctx, n * sizeof(*idx) + 1, _Alignof(size_t));
  if (!p || !idx) {
    kvt_dealloc(c->ctx, p);
    kvt_dealloc(c->ctx, idx);
    return -ENOMEM;
  }
  /* What shared tiers hold that the index misses (cache/cache_shared.c). */
  if (c->nshared) {
    kvt_key ks[64];
    for (size_t i = 0; i < n; i += 64) {
      const size_t m = n - i < 64 ? n - i : 64;
      for (size_t j = 0; j < m; j++)
        ks[j] = reqs[i + j].key;
      cache_discover(c, ks, m);
    }
  }
  /* Pin every entry and note its hottest tier. */
  for (size_t i = 0; i < n; i++) {
    reqs[i].len = 0;
    reqs[i].tier = -1;
    p[i].e = cache_get_begin(c, &reqs[i].key);
    p[i].tier = -1;
    p[i].read_rc = KVT_ENOTFOUND;
    if (p[i].e) {
      pthread_mutex_lock(&c->mu);
      uint32_t mask = p[i].e->mask;
      pthread_mutex_unlock(&c->mu);
      p[i].tier = mask ? __builtin_ctz(mask) : -1;
    }
  }
  /* Read, tier by tier. */
  for (int t = 0; t < c->ntiers; t++) {
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
      if (p[i].e && p[i].tier == t)
        idx[m++] = i;
    if (m)
      read_tier(c, t, reqs, p, idx, m, w);
  }
  /* A read that raced a move (or found its copy gone) looks again the slow
   * way; then each result is checked and counted. Promotions come last. */
  for (int pass = 0; pass < 2; pass++) {
    for (size_t i = 0; i < n; i++) {
      if (!p[i].e) {
        if (pass == 0 && p[i].tier < 0)
          reqs[i].result = KVT_ENOTFOUND;
        continue;
      }
      if (pass == 0 && p[i].read_rc == KVT_ENOTFOUND) {
        int t = -1;
        p[i].read_rc = cache_read_copy(c, p[i].e, reqs[i].buf, reqs[i].cap, &reqs[i].len, &t);
        p[i].tier = t;
      }
      int promote_now = pass == 1;
      if (pass == 0 && p[i].read_rc == 0 && p[i].tier > 0 &&
          !(c->flags & KVT_CACHE_NO_PROMOTE))
        continue; /* finished in pass 1, after every read */
      reqs[i].result = cache_get_end(c, p[i].e, reqs[i].buf, reqs[i].len, p[i].tier,
                                     p[i].read_rc, promote_now);
      reqs[i].tier = reqs[i].result == 0 || reqs[i].result == KVT_ENOBUFS ? p[i].tier : -1;
      p[i].e = NULL;
    }
  }
  kvt_dealloc(c->ctx, p);
  kvt_dealloc(c->ctx, idx);
  return 0;
}

/* ---- loans ------------------------------------------------------------------ */

int kvt_cache_borrow(kvt_cache *c, const kvt_key *key, kvt_cache_loan *loan) {
  if (!c || !key || !loan)
    return -EINVAL;
  memset(loan, 0, sizeof(*loan));
  loan->tier = -1;
  centry *e = cache_get_begin(c, key); /* pinned: neither moved nor freed now */
  if (!e)
    return KVT_ENOTFOUND;
  pthread_mutex_lock(&c->mu);
  const uint32_t mask = e->mask;
  pthread_mutex_unlock(&c->mu);
  const int t = mask ? __builtin_ctz(mask) : -1;
  kvt_tier_loan tl;
  int r = t < 0 ? KVT_ENOTFOUND : kvt_tier_borrow(c->t[t].tier, key, &tl);
  if (r) {
    /* Not lent: undo the get's pin; a miss or a refusal counts as a get's. */
    cache_get_end(c, e, NULL, 0, t < 0 ? 0 : t, r == KVT_ENOTFOUND ? KVT_ENOTFOUND : KVT_ENOBUFS,
                  0);
    return r;
  }
  /* The header checks of a get, on host bytes only (device bytes are checked
   * by the load kernel's own verification). */
  int kind = KVT_GPU_MEM_PAGEABLE;
  if (kvt_tier_traits(c->t[t].tier) & KVT_TIER_DEVICE)
    kind = KVT_GPU_MEM_DEVICE;
  if (kind != KVT_GPU_MEM_DEVICE) {
    pthread_mutex_lock(&c->mu);
    e->busy++; /* the loan's own pin, taken before the get's is dropped */
    pthread_mutex_unlock(&c->mu);
    r = cache_get_end(c, e, (void *)(uintptr_t)tl.data, tl.len, t, 0, 0);
    if (r) { /* refused: the entry is doomed; our pin's release removes it */
      kvt_tier_return(c->t[t].tier, &tl);
      pthread_mutex_lock(&c->mu);
      cache_unpin(c, e);
      pthread_mutex_unlock(&c->mu);
      return r;
    }
  }
  loan->data = tl.data;
  loan->len = tl.len;
  loan->tier = t;
  loan->internal[0] = e;
  loan->internal[1] = tl.internal;
  return 0;
}

void kvt_cache_return(kvt_cache *c, kvt_cache_loan *loan) {
  if (!c || !loan || !loan->internal[0])
    return;
  centry *e = loan->internal[0];
  kvt_tier_loan tl = {loan->data, loan->len, loan->internal[1], {0, 0}};
  kvt_tier_return(c->t[loan->tier].tier, &tl);
  pthread_mutex_lock(&c->mu);
  cache_unpin(c, e);
  pthread_mutex_unlock(&c->mu);
  memset(loan, 0, sizeof(*loan));
  loan->tier = -1;
}
