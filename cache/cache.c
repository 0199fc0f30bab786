/* cache/cache.c - the cache manager's machinery: the key index, the prefix
 * tree, per-tier LRU lists, the choice of victims, and moving payloads down
 * (demotion, eviction) and into a tier. The public calls are in
 * cache/cache_ops.c; cache_internal.h says what the lock guards. */
#include <errno.h>

#include "cache_internal.h"

#define SCAN_MAX 1024     /* LRU candidates looked at for one victim */
#define ANCESTOR_MAX 65536 /* chunks walked up a prefix chain (16M tokens of 256) */
#define VICTIMS_MAX 16    /* victims taken per round under the lock */
#define PLACE_RETRIES 8   /* a tier said -ENOSPC although the accounting had room */

/* ---- index ---------------------------------------------------------------- */

centry *cache_find(kvt_cache *c, const kvt_key *key) {
  const kvt_index_entry *x = kvt_index_find(&c->index, key);
  return x ? x->ref : NULL;
}

int cache_index_add(kvt_cache *c, centry *e) {
  if (kvt_index_reserve(&c->index, c->index.items + 1))
    return -ENOMEM;
  int fresh;
  kvt_index_entry *x = kvt_index_upsert(&c->index, &e->key, &fresh);
  x->ref = e;
  return 0;
}

void cache_link_parent(centry *e, centry *p) {
  e->parent = p;
  e->sib_prev = NULL;
  e->sib_next = p->kids;
  if (p->kids)
    p->kids->sib_prev = e;
  p->kids = e;
}

static void unlink_family(centry *e) {
  if (e->parent) {
    if (e->sib_prev)
      e->sib_prev->sib_next = e->sib_next;
    else
      e->parent->kids = e->sib_next;
    if (e->sib_next)
      e->sib_next->sib_prev = e->sib_prev;
    e->parent = NULL;
  }
  for (centry *k = e->kids, *next; k; k = next) {
    next = k->sib_next;
    k->parent = k->sib_prev = k->sib_next = NULL;
  }
  e->kids = NULL;
}

void cache_entry_free(kvt_cache *c, centry *e) {
  kvt_index_remove(&c->index, kvt_index_find(&c->index, &e->key));
  unlink_family(e);
  kvt_dealloc(c->ctx, e);
  pthread_cond_broadcast(&c->cv);
}

void cache_maybe_free(kvt_cache *c, centry *e) {
  if (e->state == E_LIVE && !e->mask && !e->busy && !e->moving)
    cache_entry_free(c, e);
}

void cache_unpin(kvt_cache *c, centry *e) {
  e->busy--;
  if (e->state == E_DOOMED) {
    pthread_cond_broadcast(&c->cv);
    if (e->busy || e->moving)
      return; /* a delete waiting for its turn, or a mover, finishes it */
    e->busy = 1; /* ours while the copies go */
    cache_remove_copies(c, e);
    e->busy = 0;
    if (e->mask) { /* a tier would not let go: keep it, visible again */
      e->state = E_LIVE;
      pthread_cond_broadcast(&c->cv);
    } else {
      cache_entry_free(c, e);
    }
    return;
  }
  cache_maybe_free(c, e);
}

int cache_remove_copies(kvt_cache *c, centry *e) {
  const uint32_t mask = e->mask;
  pthread_mutex_unlock(&c->mu);
  uint32_t failed = 0;
  int err = 0;
  for (int t = 0; t < c->ntiers; t++) {
    const int r = (mask & TBIT(t)) ? kvt_tier_del(c->t[t].tier, &e->key) : 0;
    if (r && r != KVT_ENOTFOUND) {
      failed |= TBIT(t);
      err = err ? err : r;
    }
  }
  pthread_mutex_lock(&c->mu);
  for (int t = 0; t < c->ntiers; t++) {
    if (failed & TBIT(t)) {
      c->t[t].n.errors++;
    } else if (mask & TBIT(t)) {
      c->t[t].used -= cache_cost(c, t, e->len);
      cache_forget_copy(c, e, t);
    }
  }
  return err;
}

/* ---- LRU -----------------------------------------------------------------
 * Each tier's list runs hottest to coldest. A payload touched goes to the hot
 * end, unless its parent is in the same tier and was touched after it last
 * was: then right behind the parent. A chain walked head first therefore
 * lies head-hottest, tail-coldest, whichever order its chunks were put. */

static centry *entry_of(cnode *n, int t) {
  return (centry *)((char *)n - offsetof(centry, lru) - (size_t)t * sizeof(cnode));
}

static void node_unlink(cnode *n) {
  n->prev->next = n->next;
  n->next->prev = n->prev;
  n->prev = n->next = NULL;
}

static void node_insert_after(cnode *at, cnode *n) {
  n->prev = at;
  n->next = at->next;
  at->next->prev = n;
  at->next = n;
}

static void place_in_lru(kvt_cache *c, centry *e, int t, uint64_t old_stamp) {
  const centry *p = e->parent;
  cnode *at = &c->t[t].lru;
  if (p && HAS(p, t) && p->stamp > old_stamp)
    at = (cnode *)&p->lru[t];
  else if (e->orphan)
    at = at->prev; /* the cold end */
  node_insert_after(at, &e->lru[t]);
}

void cache_touch(kvt_cache *c, centry *e) {
  uint64_t old = e->stamp;
  e->stamp = ++c->clock;
  for (int t = 0; t < c->ntiers; t++) {
    if (HAS(e, t)) {
      node_unlink(&e->lru[t]);
      place_in_lru(c, e, t, old);
    }
  }
}

void cache_add_copy(kvt_cache *c, centry *e, int t, uint64_t old_stamp) {
  e->mask |= TBIT(t);
  c->t[t].items++;
  place_in_lru(c, e, t, old_stamp);
}

void cache_forget_copy(kvt_cache *c, centry *e, int t) {
  if (!HAS(e, t))
    return;
  e->mask &= ~TBIT(t);
  c->t[t].items--;
  node_unlink(&e->lru[t]);
}

/* ---- victims -------------------------------------------------------------- */

/* Whether a child of v has a copy in tier t or a hotter one, or is being
 * put (a reservation being written has no copy yet): then v is the head of
 * a chain that still lives at this level and must stay. */
static int has_near_child(const centry *v, int t) {
  uint32_t near = (TBIT(t) << 1) - 1;
  for (const centry *k = v->kids; k; k = k->sib_next)
    if ((k->mask & near) || k->state == E_PUTTING)
      return 1;
  return 0;
}

#define REFUSE ((centry *)1)

/* The coldest unpinned payload of tier t that may go (mu held): one whose
 * chain has no tail at this level. REFUSE when the scan reaches an ancestor
 * of the payload being placed first: that payload would rank behind it, so
 * it is the coldest and must not displace its own prefix. NULL when nothing
 * can go. Past SCAN_MAX candidates the coldest unpinned one goes. */
static centry *pick_victim(kvt_cache *c, int t) {
  centry *fallback = NULL;
  cnode *head = &c->t[t].lru;
  int scanned = 0;
  for (cnode *n = head->prev; n != head && scanned < SCAN_MAX; n = n->prev, scanned++) {
    centry *v = entry_of(n, t);
    if (v->mark == c->mark_gen)
      return REFUSE;
    if (v->busy || v->moving || v->skip == c->mark_gen)
      continue;
    if (!has_near_child(v, t))
      return v;
    if (!fallback)
      fallback = v;
  }
  return fallback;
}

/* A new generation of marks (mu held): e's ancestors refuse (e must not
 * displace them), guard and its ancestors are skipped (the placement that
 * started this cascade must not lose them either). */
static void mark_ancestors(kvt_cache *c, const centry *e, const centry *guard) {
  c->mark_gen++;
  int depth = 0;
  for (centry *p = e->parent; p && depth < ANCESTOR_MAX; p = p->parent, depth++)
    p->mark = c->mark_gen;
  if (!guard || guard == e)
    return;
  ((centry *)guard)->skip = c->mark_gen;
  depth = 0;
  for (centry *p = guard->parent; p && depth < ANCESTOR_MAX; p = p->parent, depth++)
    p->skip = c->mark_gen;
}

/* Reserves len bytes in tier u for e (mu held), choosing victims until the
 * accounting has room, plus `force` more. The victims are pinned, marked
 * moving and their bytes released from used; the caller moves them out.
 * Returns 0 with the reservation made, -EAGAIN when *nv reached VICTIMS_MAX
 * (move those and call again; nothing reserved), or -ENOSPC (nothing
 * reserved, and no victim taken). */
static int make_room(kvt_cache *c, centry *e, const centry *guard, int u, uint64_t len,
                     int force, centry **victims, int *nv) {
  ctier *T = &c->t[u];
  uint64_t need = cache_cost(c, u, len);
  if (T->shared) {
    /* Other hosts' chunks live there too: the server (maxmemory, TTL, its
     * own LRU) decides what goes, never this cache. A tier that still says
     * it is full fails the placement. */
    if (force > 0)
      return -ENOSPC;
    T->used += need;
    return 0;
  }
  mark_ancestors(c, e, guard);
  const int first = *nv;
  while (T->used + need > T->capacity || force > 0) {
    if (*nv == VICTIMS_MAX)
      return -EAGAIN;
    centry *v = e->orphan ? NULL : pick_victim(c, u);
    if (!v || v == REFUSE) {
      /* Refused: the victims of this call go back untouched, so a put that
       * does not happen costs nobody their place. */
      while (*nv > first) {
        centry *g = victims[--*nv];
        T->used += cache_cost(c, u, g->len);
        g->moving = 0;
        g->busy--;
      }
      pthread_cond_broadcast(&c->cv);
      return -ENOSPC;
    }
    v->busy++;
    v->moving = 1;
    T->used -= cache_cost(c, u, v->len);
    victims[(*nv)++] = v;
    force--;
  }
  T->used += need;
  return 0;
}

/* ---- moving --------------------------------------------------------------- */

/* A 4096-aligned buffer of at least len bytes: the smallest spare that fits,
 * else a new one. *cap is its size. */
static void *buf_take(kvt_cache *c, uint64_t len, uint64_t *cap) {
  int best = -1;
  pthread_mutex_lock(&c->mu);
  for (int i = 0; i < CACHE_SPARE_BUFS; i++)
    if (c->spare[i] && c->spare_cap[i] >= len && (best < 0 || c->spare_cap[i] < c->spare_cap[best]))
      best = i;
  void *p = NULL;
  if (best >= 0) {
    p = c->spare[best];
    *cap = c->spare_cap[best];
    c->spare[best] = NULL;
  }
  pthread_mutex_unlock(&c->mu);
  if (p)
    return p;
  *cap = (len + 4095) / 4096 * 4096;
  return kvt_alloc(c->ctx, *cap ? *cap : 4096, 4096);
}

/* Keeps buf as a spare, replacing the smallest when all slots are taken. */
static void buf_give(kvt_cache *c, void *buf, uint64_t cap) {
  if (!buf)
    return;
  int slot = -1;
  pthread_mutex_lock(&c->mu);
  for (int i = 0; i < CACHE_SPARE_BUFS && slot < 0; i++)
    if (!c->spare[i])
      slot = i;
  if (slot < 0) { /* all taken: replace the smallest if it is smaller */
    slot = 0;
    for (int i = 1; i < CACHE_SPARE_BUFS; i++)
      if (c->spare_cap[i] < c->spare_cap[slot])
        slot = i;
    if (c->spare_cap[slot] >= cap)
      slot = -1;
  }
  void *drop = buf;
  if (slot >= 0) {
    drop = c->spare[slot];
    c->spare[slot] = buf;
    c->spare_cap[slot] = cap;
  }
  pthread_mutex_unlock(&c->mu);
  if (drop)
    kvt_dealloc(c->ctx, drop);
}

void cache_spares_free(kvt_cache *c) {
  for (int i = 0; i < CACHE_SPARE_BUFS; i++) {
    if (c->spare[i])
      kvt_dealloc(c->ctx, c->spare[i]);
    c->spare[i] = NULL;
  }
}

int cache_drop_copy(kvt_cache *c, centry *e, int t, int kind) {
  int r = kvt_tier_del(c->t[t].tier, &e->key);
  if (r == KVT_ENOTFOUND)
    r = 0;
  pthread_mutex_lock(&c->mu);
  if (r) {
    c->t[t].n.errors++;
    c->t[t].used += cache_cost(c, t, e->len); /* still there: still counted */
  } else {
    cache_forget_copy(c, e, t);
    if (kind == 1)
      c->t[t].n.demotions++;
    else if (kind == 2)
      c->t[t].n.evictions++;
  }
  pthread_mutex_unlock(&c->mu);
  if (r) {
    char hex[KVT_KEY_HEX_LEN + 1];
    kvt_logf(c->ctx, KVT_LOG_WARN, "cache: deleting %s from %s failed (%s); it stays there",
             kvt_key_hex(&e->key, hex), kvt_tier_spec(c->t[t].tier), kvt_strerror(r));
  }
  return r;
}

/* Moves victim v (pinned, moving, its bytes released from tier t's used) out
 * of tier t: to the first lower tier that takes it, else it is dropped when
 * may_evict (a put needs the room), or kept (the background mover only works
 * ahead of need). A copy already held below (write-through) makes the move a
 * delete. Returns whether v left tier t. */
static int demote(kvt_cache *c, centry *v, int t, const centry *guard, int may_evict) {
  pthread_mutex_lock(&c->mu);
  uint32_t below = v->mask & ~((TBIT(t) << 1) - 1);
  pthread_mutex_unlock(&c->mu);
  int kind = 2;
  if (below) {
    kind = 1;
  } else if (t + 1 < c->ntiers) {
    uint64_t cap = 0, got = 0;
    void *buf = buf_take(c, v->len, &cap);
    int r = buf ? kvt_tier_get(c->t[t].tier, &v->key, buf, v->len, &got) : -ENOMEM;
    if (r == 0 && got != v->len)
      r = KVT_ECORRUPT;
    for (int u = t + 1; r == 0 && u < c->ntiers; u++) {
      if (cache_place(c, v, u, buf, v->len, guard) == 0) {
        kind = 1;
        break;
      }
    }
    if (r && r != KVT_ENOTFOUND) {
      pthread_mutex_lock(&c->mu);
      c->t[t].n.errors++;
      pthread_mutex_unlock(&c->mu);
    }
    buf_give(c, buf, cap);
  }
  int left = 0;
  if (kind == 2 && !may_evict) {
    pthread_mutex_lock(&c->mu); /* nowhere to go: it stays, counted again */
    c->t[t].used += cache_cost(c, t, v->len);
    pthread_mutex_unlock(&c->mu);
  } else {
    left = cache_drop_copy(c, v, t, kind) == 0;
  }
  pthread_mutex_lock(&c->mu);
  v->moving = 0;
  pthread_cond_broadcast(&c->cv); /* puts of this key wait for the move */
  cache_unpin(c, v);
  pthread_mutex_unlock(&c->mu);
  return left;
}

int cache_place(kvt_cache *c, centry *e, int u, const void *buf, uint64_t len,
                const centry *guard) {
  return cache_place_or_reserve(c, e, u, buf, len, guard, NULL);
}

int cache_place_or_reserve(kvt_cache *c, centry *e, int u, const void *buf, uint64_t len,
                           const centry *guard, kvt_tier_reservation *res) {
  ctier *T = &c->t[u];
  if (cache_cost(c, u, len) > T->capacity)
    return -ENOSPC;
  int force = 0;
  for (int attempt = 0;; attempt++) {
    centry *victims[VICTIMS_MAX];
    int nv = 0;
    pthread_mutex_lock(&c->mu);
    int r = make_room(c, e, guard, u, len, force, victims, &nv);
    pthread_mutex_unlock(&c->mu);
    for (int i = 0; i < nv; i++)
      demote(c, victims[i], u, guard, 1);
    if (r == -EAGAIN) {
      force = 0;
      continue;
    }
    if (r)
      return r;
    r = res ? kvt_tier_reserve(T->tier, &e->key, len, res) : kvt_tier_put(T->tier, &e->key, buf, len);
    pthread_mutex_lock(&c->mu);
    if (r == 0 && res) { /* room taken; the copy counts once published */
      pthread_mutex_unlock(&c->mu);
      return 0;
    }
    if (r == 0) {
      /* Ranked as new: right behind its parent when that is here, so a
       * chain promoted or demoted in order keeps its head hottest. */
      cache_add_copy(c, e, u, 0);
      T->n.puts++;
      T->n.bytes_in += len;
      cache_mover_poke(c, u);
      pthread_mutex_unlock(&c->mu);
      return 0;
    }
    T->used -= cache_cost(c, u, len);
    if (r != -ENOSPC && r != KVT_ENOTSUP) /* ENOTSUP: a tier that cannot reserve */
      T->n.errors++;
    pthread_mutex_unlock(&c->mu);
    /* The tier is fuller than the accounting (its own overhead, or free
     * space in pieces): make room for one more payload and try again. */
    if (r != -ENOSPC || attempt + 1 >= PLACE_RETRIES)
      return r;
    force = attempt + 1;
  }
}

/* ---- background mover ----------------------------------------------------- */

/* The fill above which tier u is worked on: capacity less the headroom. */
static uint64_t mark_of(const kvt_cache *c, int u) {
  if (c->t[u].shared)
    return UINT64_MAX; /* its server decides what goes (make_room) */
  const uint64_t cap = c->t[u].capacity;
  return cap - cap / 100 * c->headroom_pct;
}

void cache_mover_poke(kvt_cache *c, int u) {
  if (c->mover_on && u + 1 < c->ntiers && c->t[u].used > mark_of(c, u))
    pthread_cond_signal(&c->mover_cv);
}

/* Takes victims from the first upper tier over its mark (mu held); returns
 * the tier, or -1 when every tier is under its mark. */
static int mover_pick(kvt_cache *c, centry **victims, int *nv) {
  for (int u = 0; u + 1 < c->ntiers; u++) {
    ctier *T = &c->t[u];
    c->mark_gen++; /* no payload is being placed: no ancestor to spare */
    while (T->used > mark_of(c, u) && *nv < VICTIMS_MAX) {
      centry *v = pick_victim(c, u);
      if (!v || v == REFUSE)
        break;
      v->busy++;
      v->moving = 1;
      T->used -= cache_cost(c, u, v->len);
      victims[(*nv)++] = v;
    }
    if (*nv)
      return u;
  }
  return -1;
}

static void *mover_main(void *arg) {
  kvt_cache *c = arg;
  pthread_mutex_lock(&c->mu);
  while (!c->mover_stop) {
    centry *victims[VICTIMS_MAX];
    int nv = 0;
    const int u = mover_pick(c, victims, &nv);
    if (u < 0) {
      pthread_cond_wait(&c->mover_cv, &c->mu);
      continue;
    }
    c->mover_runs++;
    pthread_mutex_unlock(&c->mu);
    int moved = 0;
    for (int i = 0; i < nv; i++)
      moved += demote(c, victims[i], u, NULL, 0);
    pthread_mutex_lock(&c->mu);
    /* Nothing could go (the tier below is full or failing, or this tier
     * cannot delete): wait for the next put rather than try again at once. */
    if (!moved && !c->mover_stop)
      pthread_cond_wait(&c->mover_cv, &c->mu);
  }
  pthread_mutex_unlock(&c->mu);
  return NULL;
}

int cache_mover_start(kvt_cache *c) {
  if (!(c->flags & KVT_CACHE_BACKGROUND) || c->ntiers < 2)
    return 0;
  pthread_mutex_lock(&c->mu); /* cache_mover_poke reads it under the lock */
  c->mover_on = 1;
  pthread_mutex_unlock(&c->mu);
  int r = pthread_create(&c->mover, NULL, mover_main, c);
  if (r) {
    pthread_mutex_lock(&c->mu);
    c->mover_on = 0;
    pthread_mutex_unlock(&c->mu);
    return -r;
  }
  return 0;
}

void cache_mover_stop(kvt_cache *c) {
  if (c->mover_on) {
    pthread_mutex_lock(&c->mu);
    c->mover_stop = 1;
    pthread_cond_signal(&c->mover_cv);
    pthread_mutex_unlock(&c->mu);
    pthread_join(c->mover, NULL);
    c->mover_on = 0;
  }
}
