/* server/server_store.c - where kvtier-server keeps values: one tier, or a
 * cache tier (DRAM) in front of a tier that holds everything (NVMe), with
 * its own index, tenant namespaces and LRU eviction.
 *
 * Why not kvt_cache: the cache parses every value as a kvtier payload and
 * refuses the rest (KVT_EFORMAT, KVT_EFOREIGN), while the server stores
 * opaque bytes for its clients (whose own cache checks payloads at their end);
 * and it has no notion of tenants. So the server drives kvt_tier directly.
 *
 * Namespaces. A value of tenant T under key K is stored under the internal
 * key XXH3-128("kvts" | tag(T) | K), tag(T) = XXH3-64 of T's name, so equal
 * keys of two tenants never meet. Each record starts with a 32-byte header
 * (magic "KVTR", version, tag, K) that is checked on every read: a record
 * that does not belong to the asking tenant and key is never served.
 *
 * Placement. With two tiers, every PUT is written through to the second
 * (the NVMe tier's PUT completes once durable), and a copy goes to the first
 * when it fits after dropping colder copies there; a GET is served from the
 * first tier when it has a copy, else from the second, and promoted. A store
 * that is full drops its least recently used values (evict_lru), or refuses
 * the PUT with -ENOSPC.
 *
 * Reserved PUTs. When the tier a record would be copied into is a dram tier
 * (the only tier, or the first of two), a PUT can instead reserve its block
 * there (kvt_tier_reserve) so the network side's RMA lands in it, and commit
 * it later: written through to the second tier from the block, then
 * published. Nothing about the key changes until commit: the old value is
 * served meanwhile and stays if the PUT is aborted; the room is made (and
 * held) at reserve time, dropping values as a PUT would, never the key's own.
 * Reservations hold at most half of the tier: beyond that a PUT takes the
 * copying path, whose put_with_room can then still drop enough values (PUTs
 * in flight cannot be dropped) for any value up to that half.
 *
 * Restart. The bottom tier's contents are indexed at open (its own list);
 * whom a record belongs to is read from its header the first time a LIST or
 * STATS needs it (one read of every record, once per start: a persistent
 * owner index would avoid that and is not done yet). GET, EXISTS and DEL
 * need no owner: they derive the internal key.
 *
 * Index: the library's key index (core/key_index.h) from the internal key
 * to an entry on the context's heap; entries are allocated and freed under
 * the store's lock.
 *
 * Concurrency: one mutex over the index; tier I/O runs outside it. An entry
 * has readers (GETs copying it) and at most one writer (PUT, DEL, eviction,
 * a reserved PUT's commit), which waits for the readers to finish. A
 * reservation is not a writer: two of one key may be in flight at once, and
 * the last to commit wins, as with two PUTs. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "key_index.h"
#include "kvt_internal.h"
#include "server_internal.h"
#include "tier_internal.h"

#define REC_MAGIC 0x5254564Bu /* "KVTR" */
#define REC_VERSION 1u
#define UNRESOLVED (-1)
#define ORPHAN (-2) /* a record of a tenant no longer configured */

typedef struct entry {
  kvt_key ikey, key;
  uint64_t len; /* payload bytes */
  uint64_t seq; /* list order */
  int tenant;
  uint32_t readers;
  uint8_t busy, live, in_top, in_bottom;
  struct entry *lru_prev, *lru_next; /* head: most recent */
  struct entry *t_prev, *t_next;     /* the tenant's keys in seq order */
} entry;

/* A tenant's keys in seq order. LIST pages resume at a cursor (a seq): the
 * hint remembers where the last page stopped (the first entry whose seq is
 * at least hint_cursor; NULL: none), kept so through removals and appends,
 * so paging through N keys costs O(N), not a walk from the head per page.
 * Anything else that moves entries (a replaced value put back in order,
 * owners resolved after a restart) drops the hint: the next page walks. */
typedef struct tlist {
  entry *head, *tail;
  uint64_t items, bytes;
  entry *hint;
  uint64_t hint_cursor;
  int hint_valid;
} tlist;

struct kvt_srv_store {
  kvt_ctx *ctx;
  kvt_tier *top, *bottom;      /* top == NULL with one tier */
  kvt_tier *res_tier;          /* where PUTs may reserve their block: a dram top or only tier */
  uint64_t res_bytes, res_cap; /* reserved now; at most half of res_tier ("Reserved PUTs") */
  int evict;
  const kvt_srv_tenant *tenants;
  int n_tenants;
  pthread_mutex_t mu;
  pthread_cond_t cv; /* an entry's busy or readers went down */
  kvt_index ix;      /* internal key -> entry (ref); every entry, live or being written */
  entry *lru_head, *lru_tail;
  tlist *tl; /* per tenant */
  uint64_t next_seq;
  size_t unresolved;
  uint64_t puts, gets, hits, misses, dels, exists, errors, bytes_in, bytes_out, evictions;
};

/* ---- keys and records ---- */

static void internal_key(const kvt_srv_store *st, int tenant, const kvt_key *key, kvt_key *out) {
  uint8_t b[4 + 8 + 16];
  memcpy(b, "kvts", 4);
  kvt_st64(b + 4, st->tenants[tenant].tag);
  memcpy(b + 12, key->bytes, 16);
  kvt_hash128(b, sizeof(b), out->bytes);
}

static void rec_header(uint8_t *rec, uint64_t tag, const kvt_key *key) {
  kvt_st32(rec, REC_MAGIC);
  kvt_st16(rec + 4, REC_VERSION);
  kvt_st16(rec + 6, 0);
  kvt_st64(rec + 8, tag);
  memcpy(rec + 16, key->bytes, 16);
}

static int rec_valid(const uint8_t *rec) {
  return kvt_ld32(rec) == REC_MAGIC && kvt_ld16(rec + 4) == REC_VERSION;
}

/* ---- index ---- */

/* Entries live on the context's heap (allocated under the store's lock);
 * the index maps an internal key to its entry. */
static entry *find(kvt_srv_store *st, const kvt_key *ikey) {
  const kvt_index_entry *x = kvt_index_find(&st->ix, ikey);
  return x ? x->ref : NULL;
}

/* A new entry for ikey (absent), indexed; NULL when out of memory. */
static entry *insert(kvt_srv_store *st, const kvt_key *ikey) {
  if (kvt_index_reserve(&st->ix, st->ix.items + 1) != 0)
    return NULL;
  entry *e = kvt_alloc(st->ctx, sizeof(*e), _Alignof(entry));
  if (!e)
    return NULL;
  memset(e, 0, sizeof(*e));
  e->ikey = *ikey;
  e->tenant = UNRESOLVED;
  int fresh = 0;
  kvt_index_upsert(&st->ix, ikey, &fresh)->ref = e;
  return e;
}

static void lru_unlink(kvt_srv_store *st, entry *e) {
  if (e->lru_prev)
    e->lru_prev->lru_next = e->lru_next;
  else if (st->lru_head == e)
    st->lru_head = e->lru_next;
  if (e->lru_next)
    e->lru_next->lru_prev = e->lru_prev;
  else if (st->lru_tail == e)
    st->lru_tail = e->lru_prev;
  e->lru_prev = e->lru_next = NULL;
}

static void lru_touch(kvt_srv_store *st, entry *e) {
  lru_unlink(st, e);
  e->lru_next = st->lru_head;
  if (st->lru_head)
    st->lru_head->lru_prev = e;
  st->lru_head = e;
  if (!st->lru_tail)
    st->lru_tail = e;
}

static void tenant_link(kvt_srv_store *st, entry *e) {
  if (e->tenant < 0)
    return;
  tlist *t = &st->tl[e->tenant];
  if (t->hint_valid) {
    if (t->tail && t->tail->seq > e->seq)
      t->hint_valid = 0; /* out of order until put back: see kvt_srv_store_put */
    else if (!t->hint && e->seq >= t->hint_cursor)
      t->hint = e;
  }
  e->t_prev = t->tail;
  e->t_next = NULL;
  if (t->tail)
    t->tail->t_next = e;
  else
    t->head = e;
  t->tail = e;
  t->items++;
  t->bytes += e->len;
}

static void tenant_unlink(kvt_srv_store *st, entry *e) {
  if (e->tenant < 0)
    return;
  tlist *t = &st->tl[e->tenant];
  if (t->hint == e)
    t->hint = e->t_next; /* the next in seq order is now the first >= cursor */
  if (e->t_prev)
    e->t_prev->t_next = e->t_next;
  else
    t->head = e->t_next;
  if (e->t_next)
    e->t_next->t_prev = e->t_prev;
  else
    t->tail = e->t_prev;
  e->t_prev = e->t_next = NULL;
  t->items--;
  t->bytes -= e->len;
}

static void remove_entry(kvt_srv_store *st, entry *e) {
  kvt_index_remove(&st->ix, kvt_index_find(&st->ix, &e->ikey));
  lru_unlink(st, e);
  if (e->live)
    tenant_unlink(st, e);
  if (e->tenant == UNRESOLVED && e->live)
    st->unresolved--;
  kvt_dealloc(st->ctx, e);
}

static void release_write(kvt_srv_store *st, entry *e) {
  e->busy = 0;
  pthread_cond_broadcast(&st->cv);
}

/* ---- eviction ---- */

/* Makes room in `which` (the top tier: drop a copy kept below; the bottom,
 * or the only tier: drop the value) by dropping the coldest value or copy
 * that nobody uses, never the one of `keep` (the key being put: a PUT that
 * fails must leave its old value). Returns 1 when something was dropped. */
static int evict_one(kvt_srv_store *st, kvt_tier *which, const kvt_key *keep) {
  const int top = which == st->top;
  pthread_mutex_lock(&st->mu);
  entry *v = st->lru_tail;
  for (; v; v = v->lru_prev)
    if (v->live && !v->busy && !v->readers && (top ? v->in_top : 1) &&
        memcmp(v->ikey.bytes, keep->bytes, 16) != 0)
      break;
  if (!v) {
    pthread_mutex_unlock(&st->mu);
    return 0;
  }
  v->busy = 1;
  const kvt_key ik = v->ikey;
  const int drop_all = !top, had_top = v->in_top;
  pthread_mutex_unlock(&st->mu);
  if (had_top)
    kvt_tier_del(st->top, &ik);
  if (drop_all)
    kvt_tier_del(st->bottom, &ik);
  pthread_mutex_lock(&st->mu);
  v->in_top = 0;
  if (drop_all) {
    st->evictions++;
    release_write(st, v);
    remove_entry(st, v);
  } else {
    release_write(st, v);
  }
  pthread_mutex_unlock(&st->mu);
  return 1;
}

/* Puts into tier t, dropping colder values or copies while it is full. */
static int put_with_room(kvt_srv_store *st, kvt_tier *t, const entry *e, const uint8_t *rec,
                         uint64_t n, int may_evict) {
  for (int tries = 0;; tries++) {
    const int rc = kvt_tier_put(t, &e->ikey, rec, n);
    if (rc != -ENOSPC || !may_evict || tries > 4096 || !evict_one(st, t, &e->ikey))
      return rc;
  }
}

/* ---- operations ---- */

/* Takes the entry of ik for writing once nobody else uses it; NULL when it
 * is absent (or went away while we waited: a failed PUT of a new key, a DEL
 * or an eviction frees it, so it is looked up again after every wait). */
static entry *take_existing(kvt_srv_store *st, const kvt_key *ik) {
  for (;;) {
    entry *e = find(st, ik);
    if (!e)
      return NULL;
    if (!e->busy && !e->readers) {
      e->busy = 1;
      return e;
    }
    pthread_cond_wait(&st->cv, &st->mu);
  }
}

/* Finds or creates the entry for (tenant, key) and takes it for writing. */
static entry *write_entry(kvt_srv_store *st, const kvt_key *ik) {
  entry *e = take_existing(st, ik);
  if (!e && (e = insert(st, ik)) != NULL)
    e->busy = 1;
  return e;
}

/* Indexes the outcome of a PUT of e (taken for writing): rc 0, the value
 * in the bottom tier and, top_ok, a copy in the top one; else e as it was
 * (or gone, when it was new). Releases e. Called under the lock. */
static void put_done(kvt_srv_store *st, entry *e, int tenant, const kvt_key *key, uint64_t len,
                     int rc, int top_ok) {
  st->puts++;
  if (rc) {
    st->errors += rc != -ENOSPC;
    release_write(st, e);
    if (!e->live)
      remove_entry(st, e);
    return;
  }
  if (e->live)
    tenant_unlink(st, e);
  if (e->live && e->tenant == UNRESOLVED)
    st->unresolved--;
  e->key = *key;
  e->tenant = tenant;
  e->len = len;
  if (!e->live)
    e->seq = ++st->next_seq; /* a replaced value keeps its place in listings */
  e->live = 1;
  e->in_bottom = 1;
  e->in_top = (uint8_t)top_ok;
  tenant_link(st, e);
  if (e->t_prev && e->t_prev->seq > e->seq) { /* keep seq order for replaced values */
    tenant_unlink(st, e);
    tlist *t = &st->tl[tenant];
    entry *at = t->head;
    while (at && at->seq < e->seq)
      at = at->t_next;
    e->t_next = at;
    e->t_prev = at ? at->t_prev : t->tail;
    if (e->t_prev)
      e->t_prev->t_next = e;
    else
      t->head = e;
    if (at)
      at->t_prev = e;
    else
      t->tail = e;
    t->items++;
    t->bytes += e->len;
  }
  lru_touch(st, e);
  st->bytes_in += len;
  release_write(st, e);
}

int kvt_srv_store_put(kvt_srv_store *st, int tenant, const kvt_key *key, uint8_t *rec,
                      uint64_t len) {
  kvt_key ik;
  internal_key(st, tenant, key, &ik);
  rec_header(rec, st->tenants[tenant].tag, key);
  pthread_mutex_lock(&st->mu);
  entry *e = write_entry(st, &ik);
  if (!e) {
    st->errors++;
    pthread_mutex_unlock(&st->mu);
    return -ENOMEM;
  }
  const int had_top = e->in_top;
  pthread_mutex_unlock(&st->mu);
  const uint64_t n = SRV_REC_HDR + len;
  int rc = put_with_room(st, st->bottom, e, rec, n, st->evict);
  int top_ok = 0;
  if (rc == 0 && st->top) {
    top_ok = put_with_room(st, st->top, e, rec, n, 1) == 0; /* copies may always go */
    if (!top_ok && had_top)
      kvt_tier_del(st->top, &ik); /* the old copy is stale now */
  }
  pthread_mutex_lock(&st->mu);
  put_done(st, e, tenant, key, len, rc, top_ok);
  pthread_mutex_unlock(&st->mu);
  return rc;
}

/* ---- reserved PUTs ---- */

int kvt_srv_store_put_reserve(kvt_srv_store *st, int tenant, const kvt_key *key, uint64_t len,
                              kvt_srv_put *p, uint8_t **rec) {
  p->tier = NULL;
  if (!st->res_tier)
    return KVT_ENOTSUP;
  if (len > UINT64_MAX - SRV_REC_HDR)
    return -EINVAL;
  const uint64_t n = SRV_REC_HDR + len;
  pthread_mutex_lock(&st->mu);
  const int over = n > st->res_cap || st->res_bytes > st->res_cap - n;
  if (!over)
    st->res_bytes += n;
  pthread_mutex_unlock(&st->mu);
  if (over)
    return -ENOSPC;
  internal_key(st, tenant, key, &p->ikey);
  /* Copies in the top tier may always go; values only as a PUT may drop them. */
  const int may_evict = st->top ? 1 : st->evict;
  int rc;
  for (int tries = 0;; tries++) {
    rc = kvt_tier_reserve(st->res_tier, &p->ikey, n, &p->res);
    if (rc != -ENOSPC || !may_evict || tries > 4096 || !evict_one(st, st->res_tier, &p->ikey))
      break;
  }
  if (rc) {
    pthread_mutex_lock(&st->mu);
    st->res_bytes -= n;
    pthread_mutex_unlock(&st->mu);
    return rc;
  }
  p->tier = st->res_tier;
  p->key = *key;
  p->tenant = tenant;
  p->len = len;
  rec_header(p->res.data, st->tenants[tenant].tag, key);
  *rec = p->res.data;
  return 0;
}

/* Takes the entry of ik for writing if nobody uses it now (creating it when
 * absent); NULL with *busy set when that would wait. Called under the lock. */
static entry *try_write_entry(kvt_srv_store *st, const kvt_key *ik, int *busy) {
  entry *e = find(st, ik);
  *busy = e && (e->busy || e->readers);
  if (*busy)
    return NULL;
  if (!e)
    e = insert(st, ik);
  if (e)
    e->busy = 1;
  return e;
}

int kvt_srv_store_put_commit(kvt_srv_store *st, kvt_srv_put *p, int may_wait) {
  if (!p->tier)
    return -EINVAL;
  if (st->top && !may_wait)
    return -EWOULDBLOCK; /* the write-through to the bottom tier blocks */
  pthread_mutex_lock(&st->mu);
  int busy = 0;
  entry *e = may_wait ? write_entry(st, &p->ikey) : try_write_entry(st, &p->ikey, &busy);
  if (!e) {
    st->errors += !busy;
    pthread_mutex_unlock(&st->mu);
    if (busy)
      return -EWOULDBLOCK;
    kvt_srv_store_put_abort(st, p);
    return -ENOMEM;
  }
  const int had_top = e->in_top;
  pthread_mutex_unlock(&st->mu);
  int rc = 0, top_ok = 0;
  if (st->top) /* durable below before it is visible above */
    rc = put_with_room(st, st->bottom, e, p->res.data, SRV_REC_HDR + p->len, st->evict);
  if (rc == 0) {
    const int prc = kvt_tier_publish(p->tier, &p->res);
    if (!st->top)
      rc = prc;
    else if (!(top_ok = prc == 0) && had_top)
      kvt_tier_del(st->top, &p->ikey); /* the old copy is stale now */
  } else {
    kvt_tier_abort(p->tier, &p->res); /* the bottom tier kept the old value */
  }
  p->tier = NULL;
  pthread_mutex_lock(&st->mu);
  st->res_bytes -= SRV_REC_HDR + p->len;
  put_done(st, e, p->tenant, &p->key, p->len, rc, top_ok);
  pthread_mutex_unlock(&st->mu);
  return rc;
}

void kvt_srv_store_put_abort(kvt_srv_store *st, kvt_srv_put *p) {
  if (!p->tier)
    return;
  kvt_tier_abort(p->tier, &p->res);
  p->tier = NULL;
  pthread_mutex_lock(&st->mu);
  st->res_bytes -= SRV_REC_HDR + p->len;
  pthread_mutex_unlock(&st->mu);
}

int kvt_srv_store_get_begin(kvt_srv_store *st, int tenant, const kvt_key *key, kvt_srv_get *g) {
  kvt_key ik;
  internal_key(st, tenant, key, &ik);
  pthread_mutex_lock(&st->mu);
  entry *e = find(st, &ik);
  while (e && e->busy) {
    pthread_cond_wait(&st->cv, &st->mu);
    e = find(st, &ik); /* it may have gone meanwhile */
  }
  st->gets++;
  if (!e || !e->live) {
    st->misses++;
    pthread_mutex_unlock(&st->mu);
    return KVT_ENOTFOUND;
  }
  e->readers++;
  lru_touch(st, e);
  g->entry = e;
  g->len = e->len;
  g->tenant = tenant;
  g->key = *key;
  g->lender = NULL;
  pthread_mutex_unlock(&st->mu);
  return 0;
}

/* Reads the record of e (len payload bytes) into rec and checks its header. */
static int read_record(kvt_srv_store *st, entry *e, int from_top, uint8_t *rec, uint64_t len) {
  uint64_t got = 0;
  const int rc =
      kvt_tier_get(from_top ? st->top : st->bottom, &e->ikey, rec, SRV_REC_HDR + len, &got);
  if (rc)
    return rc;
  if (got != SRV_REC_HDR + len || !rec_valid(rec))
    return KVT_ECORRUPT;
  return 0;
}

int kvt_srv_store_get_read(kvt_srv_store *st, kvt_srv_get *g, uint8_t *rec) {
  entry *e = g->entry;
  pthread_mutex_lock(&st->mu);
  const int from_top = e->in_top;
  pthread_mutex_unlock(&st->mu);
  int rc = read_record(st, e, from_top, rec, g->len);
  if (rc && from_top) /* a copy that went bad: the bottom tier has the value */
    rc = read_record(st, e, 0, rec, g->len);
  if (rc == 0 &&
      (kvt_ld64(rec + 8) != st->tenants[g->tenant].tag || memcmp(rec + 16, g->key.bytes, 16) != 0))
    rc = KVT_EFOREIGN; /* never serve what is not the asker's */
  if (rc == 0 && st->top && !from_top &&
      put_with_room(st, st->top, e, rec, SRV_REC_HDR + g->len, 1) == 0) {
    pthread_mutex_lock(&st->mu);
    e->in_top = 1;
    pthread_mutex_unlock(&st->mu);
  }
  return rc;
}

int kvt_srv_store_get_lend(kvt_srv_store *st, kvt_srv_get *g, const uint8_t **rec) {
  entry *e = g->entry;
  pthread_mutex_lock(&st->mu);
  kvt_tier *t = e->in_top ? st->top : st->top ? NULL : st->bottom;
  pthread_mutex_unlock(&st->mu);
  if (!t)
    return KVT_ENOTSUP; /* only the bottom tier has it, and there is a top: nvme */
  int rc = kvt_tier_borrow(t, &e->ikey, &g->loan);
  if (rc)
    return rc;
  const uint8_t *r = g->loan.data;
  if (g->loan.len != SRV_REC_HDR + g->len || !r || !rec_valid(r) ||
      kvt_ld64(r + 8) != st->tenants[g->tenant].tag || memcmp(r + 16, g->key.bytes, 16) != 0) {
    kvt_tier_return(t, &g->loan);
    return KVT_ECORRUPT; /* get_read then reads it again and says what is wrong */
  }
  g->lender = t;
  *rec = r;
  return 0;
}

void kvt_srv_store_get_unlend(kvt_srv_store *st, kvt_srv_get *g) {
  (void)st;
  if (g->lender) {
    kvt_tier_return(g->lender, &g->loan);
    g->lender = NULL;
  }
}

void kvt_srv_store_get_end(kvt_srv_store *st, kvt_srv_get *g, int hit) {
  entry *e = g->entry;
  pthread_mutex_lock(&st->mu);
  e->readers--;
  if (hit > 0) {
    st->hits++;
    st->bytes_out += g->len;
  } else if (hit == 0) {
    st->errors++;
  }
  pthread_cond_broadcast(&st->cv);
  pthread_mutex_unlock(&st->mu);
  g->entry = NULL;
}

int kvt_srv_store_exists(kvt_srv_store *st, int tenant, const kvt_key *key, uint64_t *len) {
  kvt_key ik;
  internal_key(st, tenant, key, &ik);
  pthread_mutex_lock(&st->mu);
  const entry *e = find(st, &ik);
  st->exists++;
  const int rc = e && e->live ? 0 : KVT_ENOTFOUND;
  if (rc == 0)
    *len = e->len;
  pthread_mutex_unlock(&st->mu);
  return rc;
}

int kvt_srv_store_del(kvt_srv_store *st, int tenant, const kvt_key *key) {
  kvt_key ik;
  internal_key(st, tenant, key, &ik);
  pthread_mutex_lock(&st->mu);
  st->dels++;
  entry *e = take_existing(st, &ik);
  if (e && !e->live) { /* a PUT of a new key that failed meanwhile */
    release_write(st, e);
    e = NULL;
  }
  if (!e) {
    pthread_mutex_unlock(&st->mu);
    return KVT_ENOTFOUND;
  }
  const int had_top = e->in_top;
  pthread_mutex_unlock(&st->mu);
  int rc = 0;
  if (had_top)
    kvt_tier_del(st->top, &ik);
  rc = kvt_tier_del(st->bottom, &ik);
  if (rc == KVT_ENOTFOUND)
    rc = 0; /* already gone below: the index was the last to know */
  pthread_mutex_lock(&st->mu);
  release_write(st, e);
  if (rc == 0)
    remove_entry(st, e);
  else
    st->errors++;
  pthread_mutex_unlock(&st->mu);
  return rc;
}

/* ---- owners after a restart ---- */

static int tenant_of_tag(const kvt_srv_store *st, uint64_t tag) {
  for (int i = 0; i < st->n_tenants; i++)
    if (st->tenants[i].tag == tag)
      return i;
  return ORPHAN;
}

/* Reads the header of every record indexed at open whose owner is not yet
 * known. Called by LIST and STATS; a no-op once done. */
static void resolve_owners(kvt_srv_store *st) {
  uint8_t *buf = NULL;
  size_t cap = 0;
  for (;;) {
    pthread_mutex_lock(&st->mu);
    if (!st->unresolved) {
      pthread_mutex_unlock(&st->mu);
      break;
    }
    entry *e = NULL;
    int in_use = 0;
    /* Every live entry is on the LRU list; those indexed at open, and not
     * used since, at its cold end. */
    for (entry *x = st->lru_tail; x && !e; x = x->lru_prev)
      if (x->live && x->tenant == UNRESOLVED) {
        if (!x->busy && !x->readers)
          e = x;
        else
          in_use = 1;
      }
    if (!e) {
      if (in_use) /* being read or written: wait for it, then look again */
        pthread_cond_wait(&st->cv, &st->mu);
      pthread_mutex_unlock(&st->mu);
      if (in_use)
        continue;
      break;
    }
    e->busy = 1;
    const uint64_t len = e->len;
    pthread_mutex_unlock(&st->mu);
    if (cap < SRV_REC_HDR + len) {
      kvt_dealloc(st->ctx, buf);
      cap = SRV_REC_HDR + len;
      buf = kvt_alloc(st->ctx, cap, 64);
    }
    const int rc = buf ? read_record(st, e, 0, buf, len) : -ENOMEM;
    pthread_mutex_lock(&st->mu);
    st->unresolved--;
    if (rc == 0) {
      e->tenant = tenant_of_tag(st, kvt_ld64(buf + 8));
      memcpy(e->key.bytes, buf + 16, 16);
      tenant_link(st, e);
    } else {
      e->tenant = ORPHAN; /* unreadable: kept out of every listing */
    }
    release_write(st, e);
    pthread_mutex_unlock(&st->mu);
  }
  kvt_dealloc(st->ctx, buf);
}

int kvt_srv_store_list(kvt_srv_store *st, int tenant, uint64_t cursor, kvt_proto_list_entry *out,
                       uint32_t max, uint32_t *n, uint64_t *next) {
  resolve_owners(st);
  pthread_mutex_lock(&st->mu);
  tlist *t = &st->tl[tenant];
  uint32_t k = 0;
  entry *e;
  if (cursor && t->hint_valid && t->hint_cursor == cursor) {
    e = t->hint;
  } else {
    e = t->head;
    while (e && e->seq < cursor)
      e = e->t_next;
  }
  for (; e && k < max; e = e->t_next) {
    out[k].key = e->key;
    out[k].len = e->len;
    k++;
  }
  *n = k;
  *next = e ? e->seq : 0;
  t->hint = e;
  t->hint_cursor = *next;
  t->hint_valid = e != NULL;
  pthread_mutex_unlock(&st->mu);
  return 0;
}

static void tier_usage(kvt_tier *t, uint64_t *cap, uint64_t *used) {
  kvt_tier_stats s;
  memset(&s, 0, sizeof(s));
  s.struct_size = sizeof(s);
  if (t && kvt_tier_stats_get(t, &s) == 0) {
    *cap = s.capacity;
    *used = s.used;
  }
}

void kvt_srv_store_stats(kvt_srv_store *st, int tenant, uint64_t v[KVT_STAT_COUNT]) {
  if (tenant >= 0)
    resolve_owners(st);
  tier_usage(st->bottom, &v[KVT_STAT_CAPACITY], &v[KVT_STAT_USED]);
  tier_usage(st->top, &v[KVT_STAT_DRAM_CAPACITY], &v[KVT_STAT_DRAM_USED]);
  pthread_mutex_lock(&st->mu);
  v[KVT_STAT_ITEMS] = st->ix.items;
  if (tenant >= 0) {
    v[KVT_STAT_TENANT_ITEMS] = st->tl[tenant].items;
    v[KVT_STAT_TENANT_BYTES] = st->tl[tenant].bytes;
  }
  v[KVT_STAT_PUTS] = st->puts;
  v[KVT_STAT_GETS] = st->gets;
  v[KVT_STAT_HITS] = st->hits;
  v[KVT_STAT_MISSES] = st->misses;
  v[KVT_STAT_DELS] = st->dels;
  v[KVT_STAT_EXISTS] = st->exists;
  v[KVT_STAT_ERRORS] = st->errors;
  v[KVT_STAT_BYTES_IN] = st->bytes_in;
  v[KVT_STAT_BYTES_OUT] = st->bytes_out;
  v[KVT_STAT_EVICTIONS] = st->evictions;
  pthread_mutex_unlock(&st->mu);
}

/* ---- open and close ---- */

typedef struct rebuild {
  kvt_srv_store *st;
  kvt_key *stale; /* records too short to be ours: deleted after the walk */
  size_t n_stale, cap_stale;
} rebuild;

static int rebuild_one(void *opaque, const kvt_key *key, uint64_t len) {
  rebuild *r = opaque;
  kvt_srv_store *st = r->st;
  if (len < SRV_REC_HDR) {
    if (r->n_stale == r->cap_stale) {
      const size_t cap = r->cap_stale ? r->cap_stale * 2 : 64;
      kvt_key *k = kvt_alloc(st->ctx, cap * sizeof(*k), _Alignof(kvt_key));
      if (!k)
        return 0;
      if (r->n_stale)
        memcpy(k, r->stale, r->n_stale * sizeof(*k));
      kvt_dealloc(st->ctx, r->stale);
      r->stale = k;
      r->cap_stale = cap;
    }
    r->stale[r->n_stale++] = *key;
    return 0;
  }
  entry *e = insert(st, key);
  if (!e)
    return -ENOMEM;
  e->len = len - SRV_REC_HDR;
  e->live = 1;
  e->in_bottom = 1;
  e->seq = ++st->next_seq;
  st->unresolved++;
  lru_touch(st, e);
  return 0;
}

/* Whether s starts a tier spec: a compiled-in scheme, then ':' or '@'. */
static int starts_spec(const char *s) {
  const size_t n = strcspn(s, ":@;");
  return n && (s[n] == ':' || s[n] == '@') && kvt_tier_scheme_known(s, n);
}

/* Splits "A;B" into at most two tier specs (a ';' followed by a scheme: the
 * ';' between a fault decorator's rules stays inside its spec). */
static int split_tiers(const char *spec, char parts[2][1024]) {
  int n = 0;
  const char *p = spec;
  while (*p) {
    const char *semi = p;
    for (;;) {
      semi = strchr(semi, ';');
      if (!semi || starts_spec(semi + 1))
        break;
      semi++;
    }
    const size_t len = semi ? (size_t)(semi - p) : strlen(p);
    if (n == 2 || len == 0 || len >= 1024)
      return -EINVAL;
    memcpy(parts[n], p, len);
    parts[n][len] = 0;
    n++;
    p = semi ? semi + 1 : p + len;
  }
  return n;
}

int kvt_srv_store_open(kvt_ctx *ctx, const char *spec, int evict_lru, const kvt_srv_tenant *tenants,
                       int n_tenants, kvt_srv_store **out, char *err, size_t err_cap) {
  char parts[2][1024], shown[1100]; /* messages show specs with their secrets as *** */
  const int n = split_tiers(spec, parts);
  if (n < 1) {
    kvt_spec_redact(shown, sizeof(shown), spec);
    snprintf(err, err_cap, "--tiers '%s': expected one tier or two separated by ';'", shown);
    return -EINVAL;
  }
  const size_t tl_size = (size_t)(n_tenants ? n_tenants : 1) * sizeof(tlist);
  kvt_srv_store *st = kvt_alloc(ctx, sizeof(*st), 64);
  tlist *tl = kvt_alloc(ctx, tl_size, _Alignof(tlist));
  if (!st || !tl) {
    kvt_dealloc(ctx, st);
    kvt_dealloc(ctx, tl);
    snprintf(err, err_cap, "out of memory");
    return -ENOMEM;
  }
  memset(st, 0, sizeof(*st));
  memset(tl, 0, tl_size);
  st->tl = tl;
  kvt_index_init(&st->ix, ctx);
  st->ctx = ctx;
  st->evict = evict_lru;
  st->tenants = tenants;
  st->n_tenants = n_tenants;
  pthread_mutex_init(&st->mu, NULL);
  pthread_cond_init(&st->cv, NULL);
  kvt_tier *t[2] = {NULL, NULL};
  int rc = 0;
  for (int i = 0; i < n && rc == 0; i++)
    if ((rc = kvt_tier_open(ctx, parts[i], &t[i])) != 0) {
      kvt_spec_redact(shown, sizeof(shown), parts[i]);
      snprintf(err, err_cap, "tier '%s': %s", shown, kvt_ctx_last_error(ctx));
    }
  st->top = n == 2 ? t[0] : NULL;
  st->bottom = n == 2 ? t[1] : t[0];
  /* Host memory only: the network side writes the header and RMAs into it.
   * (A decorated dram tier says host memory too, and refuses to reserve:
   * its PUTs take the staging path, as before.) */
  kvt_tier_stats ts = {.struct_size = sizeof(ts)};
  if (rc == 0 && (kvt_tier_traits(t[0]) & KVT_TIER_HOST_MEMORY) &&
      kvt_tier_stats_get(t[0], &ts) == 0) {
    st->res_tier = t[0];
    st->res_cap = ts.capacity / 2;
  }
  rebuild r = {st, NULL, 0, 0};
  if (rc == 0 && (rc = kvt_tier_list(st->bottom, rebuild_one, &r)) == KVT_ENOTSUP)
    rc = 0; /* a tier that cannot list (none of ours): starts empty */
  for (size_t i = 0; rc == 0 && i < r.n_stale; i++)
    kvt_tier_del(st->bottom, &r.stale[i]);
  kvt_dealloc(ctx, r.stale);
  if (rc) {
    if (!err[0])
      snprintf(err, err_cap, "indexing '%s': %s", kvt_tier_spec(st->bottom), kvt_strerror(rc));
    st->top = t[0];
    st->bottom = t[1];
    kvt_srv_store_close(st);
    return rc;
  }
  *out = st;
  return 0;
}

void kvt_srv_store_close(kvt_srv_store *st) {
  if (!st)
    return;
  kvt_tier_close(st->top);
  kvt_tier_close(st->bottom); /* each PUT was durable when acknowledged */
  for (uint64_t i = 0; i < st->ix.cap; i++)
    if (st->ix.slots[i].live)
      kvt_dealloc(st->ctx, st->ix.slots[i].ref);
  kvt_index_free(&st->ix);
  kvt_dealloc(st->ctx, st->tl);
  pthread_cond_destroy(&st->cv);
  pthread_mutex_destroy(&st->mu);
  kvt_dealloc(st->ctx, st);
}
