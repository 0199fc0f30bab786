/* cache/cache_ops.c - the cache's public calls (kvtier/cache.h): open and
 * close, put, get with promotion, prefix lookup, delete and stats. The
 * machinery they share is in cache/cache.c. */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>

#include "cache_internal.h"
#include "kvtier/payload.h"
#include "tier_internal.h"

#define IDX_MIN 192u /* entries the index holds before it first grows (256 slots) */
#define GET_TRIES 4   /* a get that raced a move looks again */
#define LOOKUP_BATCH 64

/* ---- open and close ------------------------------------------------------- */

typedef struct restore_ctx {
  kvt_cache *c;
  int t;
  int err;
} restore_ctx;

/* One payload found in a persistent tier at open. */
static int restore_one(void *opaque, const kvt_key *key, uint64_t len) {
  restore_ctx *rc = opaque;
  kvt_cache *c = rc->c;
  centry *e = cache_find(c, key);
  if (e && (e->len != len || HAS(e, rc->t))) {
    char hex[KVT_KEY_HEX_LEN + 1];
    kvt_logf(c->ctx, KVT_LOG_WARN, "cache: %s held twice with %llu and %llu bytes; keeping one",
             kvt_key_hex(key, hex), (unsigned long long)e->len, (unsigned long long)len);
    return 0;
  }
  if (!e) {
    e = kvt_alloc(c->ctx, sizeof(*e), _Alignof(centry));
    if (!e || (memset(e, 0, sizeof(*e)), e->key = *key, cache_index_add(c, e))) {
      kvt_dealloc(c->ctx, e);
      rc->err = -ENOMEM;
      return 1;
    }
    e->len = len;
    e->state = E_LIVE;
  }
  cache_add_copy(c, e, rc->t, 0);
  c->t[rc->t].used += cache_cost(c, rc->t, len);
  return 0;
}

/* Whether s starts a tier spec: a scheme (letters, digits, '+') then ':' or
 * '@'. The ';' inside a fault decorator's rules ("op=get,nth=3") is followed
 * by a field name and '=', so it does not split the list. */
static int starts_spec(const char *s) {
  size_t i = 0;
  while ((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '+')
    i++;
  return i > 0 && (s[i] == ':' || s[i] == '@');
}

/* Takes tier as the next one down: what a payload costs there from its
 * stats, what it is from its traits. */
static void add_tier(kvt_cache *c, kvt_tier *tier, int owned) {
  ctier *T = &c->t[c->ntiers++];
  T->tier = tier;
  T->owned = owned;
  kvt_tier_stats s;
  memset(&s, 0, sizeof(s));
  s.struct_size = sizeof(s);
  kvt_tier_stats_get(T->tier, &s);
  T->capacity = s.capacity;
  T->overhead = s.item_overhead;
  T->granule = s.granule;
  const uint32_t traits = kvt_tier_traits(T->tier);
  T->persistent = (traits & KVT_TIER_PERSISTENT) != 0;
  T->shared = (traits & KVT_TIER_SHARED) != 0;
  c->nshared += T->shared;
}

/* The list of specs as messages show it: secrets as "***". */
static const char *list_shown(const char *list, char *buf, size_t cap) {
  kvt_spec_redact(buf, cap, list);
  return buf;
}

static int open_one(kvt_cache *c, const char *spec, const char *list) {
  char shown[512];
  if (c->ntiers == KVT_CACHE_MAX_TIERS)
    return kvt_fail(c->ctx, -EINVAL, "cache: more than %d tiers in \"%s\"", KVT_CACHE_MAX_TIERS,
                    list_shown(list, shown, sizeof(shown)));
  kvt_tier *tier;
  int r = kvt_tier_open(c->ctx, spec, &tier);
  if (r)
    return r;
  add_tier(c, tier, 1);
  return 0;
}

/* Takes the config's tier handles after the tiers of its specs, not yet
 * owned: kvt_cache_open owns them once it succeeds. */
static int add_handles(kvt_cache *c, kvt_tier *const *h, uint32_t n) {
  if (n && !h)
    return kvt_fail(c->ctx, -EINVAL, "cache: n_tier_handles %u with no tier_handles", n);
  if (n > (uint32_t)(KVT_CACHE_MAX_TIERS - c->ntiers))
    return kvt_fail(c->ctx, -EINVAL, "cache: more than %d tiers (%d from specs, %u handles)",
                    KVT_CACHE_MAX_TIERS, c->ntiers, n);
  for (uint32_t i = 0; i < n; i++) {
    if (!h[i])
      return kvt_fail(c->ctx, -EINVAL, "cache: tier handle %u is NULL", i);
    for (uint32_t j = 0; j < i; j++)
      if (h[j] == h[i])
        return kvt_fail(c->ctx, -EINVAL, "cache: tier handle %u repeats handle %u", i, j);
  }
  for (uint32_t i = 0; i < n; i++)
    add_tier(c, h[i], 0);
  return 0;
}

/* Opens the tiers of "SPEC;SPEC;...", hottest first. */
static int open_tiers(kvt_cache *c, const char *list) {
  size_t n = strlen(list);
  char *copy = kvt_alloc(c->ctx, n + 1, 1);
  if (!copy)
    return kvt_fail(c->ctx, -ENOMEM, "cache: out of memory");
  memcpy(copy, list, n + 1);
  int r = 0;
  char *spec = copy, shown[512];
  for (char *p = copy; !r; p++) {
    if (*p && !(*p == ';' && (starts_spec(p + 1) || p[1] == ';' || !p[1])))
      continue;
    int end = !*p;
    *p = 0;
    r = *spec ? open_one(c, spec, list)
              : kvt_fail(c->ctx, -EINVAL, "cache: empty tier spec in \"%s\"",
                         list_shown(list, shown, sizeof(shown)));
    spec = p + 1;
    if (end)
      break;
  }
  kvt_dealloc(c->ctx, copy);
  return r;
}

void kvt_cache_close(kvt_cache *c) {
  if (!c)
    return;
  cache_mover_stop(c);
  for (int t = 0; t < c->ntiers; t++)
    if (c->t[t].owned)
      kvt_tier_close(c->t[t].tier);
  for (uint64_t i = 0; i < c->index.cap; i++)
    if (c->index.slots[i].live)
      kvt_dealloc(c->ctx, c->index.slots[i].ref);
  kvt_index_free(&c->index);
  cache_spares_free(c);
  pthread_cond_destroy(&c->mover_cv);
  pthread_cond_destroy(&c->cv);
  pthread_mutex_destroy(&c->mu);
  kvt_dealloc(c->ctx, c);
}

int kvt_cache_open(kvt_ctx *ctx, const kvt_cache_config *cfg, kvt_cache **out) {
  /* Fields are only appended: a config of an older, shorter size opens with
   * the later fields at their defaults. */
  if (!ctx || !cfg || !out || cfg->struct_size < offsetof(kvt_cache_config, headroom_pct))
    return kvt_fail(ctx, -EINVAL, "cache: need a context, a config with tiers and an out pointer");
  kvt_cache_config full = KVT_CACHE_CONFIG_INIT;
  memcpy(&full, cfg, cfg->struct_size < sizeof(full) ? cfg->struct_size : sizeof(full));
  cfg = &full;
  if (!cfg->tiers && !cfg->n_tier_handles)
    return kvt_fail(ctx, -EINVAL, "cache: need a context, a config with tiers and an out pointer");
  if (cfg->flags & ~(uint32_t)(KVT_CACHE_WRITE_THROUGH | KVT_CACHE_NO_PROMOTE | KVT_CACHE_VERIFY |
                               KVT_CACHE_BACKGROUND))
    return kvt_fail(ctx, -EINVAL, "cache: unknown flags %#x", cfg->flags);
  if (cfg->headroom_pct > 90)
    return kvt_fail(ctx, -EINVAL, "cache: headroom_pct %u: at most 90", cfg->headroom_pct);
  kvt_clear_error(ctx);
  kvt_cache *c = kvt_alloc(ctx, sizeof(*c), _Alignof(kvt_cache));
  if (!c)
    return kvt_fail(ctx, -ENOMEM, "cache: out of memory");
  memset(c, 0, sizeof(*c));
  c->ctx = ctx;
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, NULL);
  pthread_cond_init(&c->mover_cv, NULL);
  c->chunk_tokens = cfg->chunk_tokens ? cfg->chunk_tokens : 256;
  c->flags = cfg->flags;
  c->headroom_pct = cfg->headroom_pct ? cfg->headroom_pct : 10;
  if (cfg->fingerprint) {
    c->has_fp = 1;
    c->fp = *cfg->fingerprint;
  }
  for (int t = 0; t < KVT_CACHE_MAX_TIERS; t++)
    c->t[t].lru.prev = c->t[t].lru.next = &c->t[t].lru;
  kvt_index_init(&c->index, ctx);
  int r = kvt_index_reserve(&c->index, IDX_MIN) ? kvt_fail(ctx, -ENOMEM, "cache: out of memory")
                                                : cfg->tiers ? open_tiers(c, cfg->tiers) : 0;
  if (!r)
    r = add_handles(c, cfg->tier_handles, cfg->n_tier_handles);
  for (int t = 0; !r && t < c->ntiers; t++) {
    if (!c->t[t].persistent)
      continue;
    restore_ctx rc = {c, t, 0};
    int lr = kvt_tier_list(c->t[t].tier, restore_one, &rc);
    if (rc.err)
      r = kvt_fail(ctx, rc.err, "cache: out of memory indexing %s", kvt_tier_spec(c->t[t].tier));
    else if (lr && lr != KVT_ENOTSUP)
      r = kvt_fail(ctx, lr, "cache: listing %s failed", kvt_tier_spec(c->t[t].tier));
  }
  if (!r)
    r = cache_links_set(c, cfg->links);
  if (!r && (r = cache_mover_start(c)) != 0)
    kvt_fail(ctx, r, "cache: cannot start the background mover thread");
  if (r) {
    kvt_cache_close(c); /* the handles stay the caller's */
    return r;
  }
  for (int t = 0; t < c->ntiers; t++)
    c->t[t].owned = 1;
  *out = c;
  return 0;
}

/* ---- put ------------------------------------------------------------------ */

/* The header checks of a put and a get (no lock): parse, key, fingerprint,
 * and with KVT_CACHE_VERIFY (gets) every section checksum. */
static int check_payload(kvt_cache *c, const kvt_key *key, const void *buf, uint64_t len,
                         int full, const char *what) {
  kvt_payload_info info;
  int r = full ? kvt_payload_verify(NULL, buf, (size_t)len, &info)
               : kvt_payload_parse(NULL, buf, (size_t)len, &info);
  const char *why = "";
  if (!r && memcmp(info.key.bytes, key->bytes, sizeof(key->bytes))) {
    r = KVT_EFOREIGN;
    why = ": the header names another chunk key";
  } else if (!r && c->has_fp && memcmp(info.fingerprint.bytes, c->fp.bytes, sizeof(c->fp.bytes))) {
    r = KVT_EFOREIGN;
    why = ": the header names another model fingerprint";
  }
  if (r) {
    char hex[KVT_KEY_HEX_LEN + 1];
    kvt_logf(c->ctx, KVT_LOG_WARN, "cache: %s %s refused: %s%s", what, kvt_key_hex(key, hex),
             kvt_strerror(r), why);
  }
  return r;
}

/* Whether a is an ancestor of e, looking up to a bounded depth (mu held). */
static int is_ancestor(const centry *a, const centry *e) {
  int depth = 0;
  for (const centry *p = e->parent; p && depth < 4096; p = p->parent, depth++)
    if (p == a)
      return 1;
  return 0;
}

/* Gives e the parent named by prev when it has none (a payload found after a
 * restart, or put before its prefix came back), unless that would close a
 * cycle (mu held). */
static void relink(kvt_cache *c, centry *e, const kvt_key *prev) {
  if (!prev || e->parent)
    return;
  centry *p = cache_find(c, prev);
  if (p && p != e && p->state != E_DOOMED && !is_ancestor(e, p)) {
    cache_link_parent(e, p);
    e->orphan = 0;
  }
}

/* A new entry for key, in the index (mu held); NULL when out of memory. */
static centry *new_entry(kvt_cache *c, const kvt_key *key, const kvt_key *prev, uint64_t len) {
  centry *e = kvt_alloc(c->ctx, sizeof(*e), _Alignof(centry));
  if (!e)
    return NULL;
  memset(e, 0, sizeof(*e));
  e->key = *key;
  e->len = len;
  e->state = E_PUTTING;
  e->busy = 1;
  e->moving = 1;
  if (cache_index_add(c, e)) {
    kvt_dealloc(c->ctx, e);
    return NULL;
  }
  centry *p = prev ? cache_find(c, prev) : NULL;
  if (p && p != e && p->state != E_DOOMED)
    cache_link_parent(e, p);
  else if (prev)
    e->orphan = 1;
  return e;
}

/* Starts a put of key: waits for another thread's put, delete or move of it
 * to end, then creates its entry (moving, pinned). Returns 1 when the key is
 * held already (nothing to do; counted as a duplicate), 0 with *out set, or
 * -ENOMEM. */
static int put_begin(kvt_cache *c, const kvt_key *key, const kvt_key *prev, uint64_t len,
                     centry **out) {
  pthread_mutex_lock(&c->mu);
  centry *e;
  /* A key being put, deleted or moved by another thread: wait for the
   * outcome, so that 0 always means "held now" (a put that fails, or a move
   * that evicts it, leaves this put to store it). */
  while ((e = cache_find(c, key)) &&
         (e->state != E_LIVE || e->moving || !e->mask))
    pthread_cond_wait(&c->cv, &c->mu);
  if (e) {
    c->total.duplicates++;
    relink(c, e, prev);
    cache_touch(c, e);
    pthread_mutex_unlock(&c->mu);
    return 1;
  }
  e = new_entry(c, key, prev, len);
  pthread_mutex_unlock(&c->mu);
  *out = e;
  return e ? 0 : -ENOMEM;
}

/* Ends the put of e, placed in tier placed (-1: nowhere): writes payload
 * through to the persistent tiers below when asked, then makes e live, or
 * forgets it. */
static void put_end(kvt_cache *c, centry *e, int placed, const void *payload, uint64_t len) {
  for (int u = placed + 1; placed >= 0 && u < c->ntiers; u++) {
    if ((c->flags & KVT_CACHE_WRITE_THROUGH) && c->t[u].persistent) {
      int w = cache_place(c, e, u, payload, len, e);
      if (w) {
        char hex[KVT_KEY_HEX_LEN + 1];
        kvt_logf(c->ctx, KVT_LOG_WARN, "cache: write-through of %s to %s failed: %s",
                 kvt_key_hex(&e->key, hex), kvt_tier_spec(c->t[u].tier), kvt_strerror(w));
      }
    }
  }
  pthread_mutex_lock(&c->mu);
  e->moving = 0;
  e->busy--;
  pthread_cond_broadcast(&c->cv); /* puts of the same key wait for this one */
  if (placed >= 0) {
    e->state = E_LIVE;
  } else {
    for (int t = 0; t < c->ntiers; t++)
      cache_forget_copy(c, e, t);
    cache_entry_free(c, e);
  }
  pthread_mutex_unlock(&c->mu);
}

static void count_refused(kvt_cache *c) {
  pthread_mutex_lock(&c->mu);
  c->total.refused++;
  pthread_mutex_unlock(&c->mu);
}

int kvt_cache_put(kvt_cache *c, const kvt_key *key, const kvt_key *prev, const void *payload,
                  uint64_t len) {
  if (!c || !key || (!payload && len))
    return -EINVAL;
  int r = check_payload(c, key, payload, len, 0, "put of");
  if (r) {
    count_refused(c);
    return r;
  }
  centry *e = NULL;
  if ((r = put_begin(c, key, prev, len, &e)) != 0)
    return r > 0 ? 0 : r;
  r = -ENOSPC;
  int placed = -1;
  for (int u = 0; u < c->ntiers && placed < 0; u++) {
    r = cache_place(c, e, u, payload, len, e);
    if (!r)
      placed = u;
  }
  put_end(c, e, placed, payload, len);
  return placed >= 0 ? 0 : r;
}

/* ---- reservations ------------------------------------------------------------ */

int kvt_cache_reserve(kvt_cache *c, const kvt_key *key, const kvt_key *prev, uint64_t len,
                      kvt_cache_reservation *res) {
  if (!c || !key || !res || !len)
    return -EINVAL;
  memset(res, 0, sizeof(*res));
  res->tier = -1;
  if (c->ntiers == 0)
    return -ENOSPC;
  /* Host memory only (publish checks the header on the host), and a tier
   * that can reserve at all: known before anything is evicted for it. */
  const uint32_t traits = kvt_tier_traits(c->t[0].tier);
  if (traits & (KVT_TIER_DEVICE | KVT_TIER_SHARED) || !(traits & KVT_TIER_HOST_MEMORY) ||
      !kvt_tier_can_reserve(c->t[0].tier))
    return KVT_ENOTSUP;
  centry *e = NULL;
  int r = put_begin(c, key, prev, len, &e);
  if (r)
    return r > 0 ? -EEXIST : r;
  kvt_tier_reservation tr;
  r = cache_place_or_reserve(c, e, 0, NULL, len, e, &tr);
  if (r) {
    put_end(c, e, -1, NULL, 0);
    return r;
  }
  res->data = tr.data;
  res->len = len;
  res->key = *key;
  res->tier = 0;
  res->internal[0] = e;
  memcpy(&res->internal[1], tr.internal, sizeof(tr.internal));
  return 0;
}

/* The tier reservation res stands for. */
static kvt_tier_reservation tier_res(const kvt_cache_reservation *res) {
  kvt_tier_reservation tr;
  memset(&tr, 0, sizeof(tr));
  tr.data = res->data;
  tr.len = res->len;
  tr.key = res->key;
  memcpy(tr.internal, &res->internal[1], sizeof(tr.internal));
  return tr;
}

/* Gives back the room of a reservation that is not published (e pinned). */
static void reserve_undo(kvt_cache *c, kvt_cache_reservation *res) {
  centry *e = res->internal[0];
  kvt_tier_reservation tr = tier_res(res);
  kvt_tier_abort(c->t[0].tier, &tr);
  pthread_mutex_lock(&c->mu);
  c->t[0].used -= cache_cost(c, 0, res->len);
  pthread_mutex_unlock(&c->mu);
  put_end(c, e, -1, NULL, 0);
  memset(res, 0, sizeof(*res));
  res->tier = -1;
}

/* Whether res is an open reservation of c: its entry is c's entry for its
 * key, still being put (a cleared or foreign reservation is not). */
static int reservation_of(kvt_cache *c, const kvt_cache_reservation *res) {
  if (!res->internal[0] || res->tier != 0)
    return 0;
  pthread_mutex_lock(&c->mu);
  const centry *e = cache_find(c, &res->key);
  const int ok = e == res->internal[0] && e->state == E_PUTTING;
  pthread_mutex_unlock(&c->mu);
  return ok;
}

int kvt_cache_publish(kvt_cache *c, kvt_cache_reservation *res) {
  if (!c || !res || !reservation_of(c, res))
    return -EINVAL;
  centry *e = res->internal[0];
  int r = check_payload(c, &res->key, res->data, res->len, 0, "publish of");
  if (r) {
    count_refused(c);
    reserve_undo(c, res);
    return r;
  }
  kvt_tier_reservation tr = tier_res(res);
  if ((r = kvt_tier_publish(c->t[0].tier, &tr)) != 0) {
    reserve_undo(c, res);
    return r;
  }
  pthread_mutex_lock(&c->mu);
  cache_add_copy(c, e, 0, 0);
  c->t[0].n.puts++;
  c->t[0].n.bytes_in += res->len;
  cache_mover_poke(c, 0);
  pthread_mutex_unlock(&c->mu);
  /* Published: the block is the tier's now, held in place while e is
   * moving, so the write-through reads it there. */
  put_end(c, e, 0, res->data, res->len);
  memset(res, 0, sizeof(*res));
  res->tier = -1;
  return 0;
}

void kvt_cache_abort(kvt_cache *c, kvt_cache_reservation *res) {
  if (c && res && reservation_of(c, res))
    reserve_undo(c, res);
}

/* ---- get ------------------------------------------------------------------ */

/* Copies e (pinned, found in tier t with the payload now in buf) up to the
 * hottest tier that can hold it, and drops the lower copy unless
 * write-through keeps it there. */
static void promote(kvt_cache *c, centry *e, int t, const void *buf) {
  pthread_mutex_lock(&c->mu);
  int go = e->state == E_LIVE && !e->moving && HAS(e, t) && !(e->mask & (TBIT(t) - 1));
  if (go)
    e->moving = 1;
  pthread_mutex_unlock(&c->mu);
  if (!go)
    return;
  for (int u = 0; u < t; u++) {
    if (cache_place(c, e, u, buf, e->len, e))
      continue;
    pthread_mutex_lock(&c->mu);
    c->t[u].n.promotions++;
    int keep = (c->flags & KVT_CACHE_WRITE_THROUGH) && c->t[t].persistent;
    if (!keep)
      c->t[t].used -= cache_cost(c, t, e->len);
    pthread_mutex_unlock(&c->mu);
    if (!keep)
      cache_drop_copy(c, e, t, 0);
    break;
  }
  pthread_mutex_lock(&c->mu);
  e->moving = 0;
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
}

int cache_read_copy(kvt_cache *c, centry *e, void *buf, uint64_t cap, uint64_t *len,
                    int *tier_out) {
  int r = KVT_ENOTFOUND;
  for (int tries = 0; tries < GET_TRIES + c->ntiers; tries++) {
    pthread_mutex_lock(&c->mu);
    uint32_t mask = e->mask;
    int moving = e->moving;
    pthread_mutex_unlock(&c->mu);
    if (!mask)
      return KVT_ENOTFOUND;
    int t = __builtin_ctz(mask);
    *tier_out = t;
    r = kvt_tier_get(c->t[t].tier, &e->key, buf, cap, len);
    if (r != KVT_ENOTFOUND)
      return r;
    pthread_mutex_lock(&c->mu);
    if (e->mask == mask && !moving && !e->moving && HAS(e, t)) {
      char hex[KVT_KEY_HEX_LEN + 1];
      kvt_logf(c->ctx, KVT_LOG_WARN, "cache: %s lost %s; forgetting that copy",
               kvt_tier_spec(c->t[t].tier), kvt_key_hex(&e->key, hex));
      c->t[t].used -= cache_cost(c, t, e->len);
      c->t[t].n.errors++;
      cache_forget_copy(c, e, t);
    }
    pthread_mutex_unlock(&c->mu);
  }
  return r;
}

centry *cache_get_begin(kvt_cache *c, const kvt_key *key) {
  pthread_mutex_lock(&c->mu);
  c->total.gets++;
  centry *e = cache_find(c, key);
  if (!e || e->state != E_LIVE || !e->mask) {
    for (int i = 0; i < c->ntiers; i++)
      c->t[i].n.misses++;
    c->total.misses++;
    pthread_mutex_unlock(&c->mu);
    return NULL;
  }
  e->busy++;
  cache_touch(c, e);
  pthread_mutex_unlock(&c->mu);
  return e;
}

int cache_get_end(kvt_cache *c, centry *e, void *buf, uint64_t got, int t, int r, int promote_ok) {
  int refused = 0;
  if (r == 0) {
    r = check_payload(c, &e->key, buf, got, (c->flags & KVT_CACHE_VERIFY) != 0, "get of");
    refused = r != 0;
  }
  pthread_mutex_lock(&c->mu);
  if (r == 0) {
    c->t[t].n.hits++;
    c->t[t].n.bytes_out += got;
    c->total.hits++;
    c->total.bytes_out += got;
    for (int i = 0; i < t; i++)
      c->t[i].n.misses++;
  } else if (r == KVT_ENOTFOUND) {
    for (int i = 0; i < c->ntiers; i++)
      c->t[i].n.misses++;
    c->total.misses++;
  } else if (refused) {
    /* Deleted once nobody else reads or moves it (the last pin does it), so
     * a batch holding the same key twice, or another reader, never waits
     * on this thread. */
    c->total.refused++;
    if (e->state == E_LIVE)
      e->state = E_DOOMED;
  } else if (r != KVT_ENOBUFS) {
    c->t[t].n.errors++;
  }
  pthread_mutex_unlock(&c->mu);
  if (r == 0 && t > 0 && promote_ok && !(c->flags & KVT_CACHE_NO_PROMOTE))
    promote(c, e, t, buf);
  pthread_mutex_lock(&c->mu);
  cache_unpin(c, e);
  pthread_mutex_unlock(&c->mu);
  return r;
}

int kvt_cache_get(kvt_cache *c, const kvt_key *key, void *buf, uint64_t cap, uint64_t *len,
                  int *tier) {
  uint64_t got = 0;
  int t = -1;
  if (len)
    *len = 0;
  if (tier)
    *tier = -1;
  if (!c || !key || (!buf && cap))
    return -EINVAL;
  cache_discover(c, key, 1);
  centry *e = cache_get_begin(c, key);
  if (!e)
    return KVT_ENOTFOUND;
  int r = cache_read_copy(c, e, buf, cap, &got, &t);
  r = cache_get_end(c, e, buf, got, t, r, 1);
  if (len)
    *len = got;
  if (tier && (r == 0 || r == KVT_ENOBUFS))
    *tier = t;
  return r;
}

/* ---- lookup, query, delete ------------------------------------------------ */

/* Walks keys[0..n) under the lock: counts leading hits, touches them head
 * first and relinks parents that a restart lost. prev is the entry before
 * keys[0] (NULL at the start). Returns the hits; *last is the last entry hit. */
static size_t walk(kvt_cache *c, const kvt_key *keys, size_t n, centry *prev, centry **last) {
  size_t i = 0;
  for (; i < n; i++) {
    centry *e = cache_find(c, &keys[i]);
    if (!e || e->state != E_LIVE || !e->mask)
      break;
    if (prev && !e->parent && prev != e && !is_ancestor(e, prev)) {
      cache_link_parent(e, prev);
      e->orphan = 0;
    }
    cache_touch(c, e);
    prev = e;
  }
  *last = prev;
  return i;
}

int kvt_cache_lookup_keys(kvt_cache *c, const kvt_key *keys, size_t n, size_t *hits) {
  if (!c || (!keys && n) || !hits)
    return -EINVAL;
  centry *last;
  cache_discover(c, keys, n);
  pthread_mutex_lock(&c->mu);
  c->total.lookups++;
  *hits = walk(c, keys, n, NULL, &last);
  pthread_mutex_unlock(&c->mu);
  return 0;
}

int kvt_cache_lookup(kvt_cache *c, const uint32_t *tokens, size_t n, size_t *cached_tokens) {
  if (!c || (!tokens && n) || !cached_tokens || !c->has_fp)
    return -EINVAL;
  *cached_tokens = 0;
  size_t chunks = n / c->chunk_tokens, done = 0;
  kvt_key keys[LOOKUP_BATCH];
  kvt_key prev_key;
  centry *prev = NULL;
  pthread_mutex_lock(&c->mu);
  c->total.lookups++;
  pthread_mutex_unlock(&c->mu);
  /* Batches grow from 4 keys to LOOKUP_BATCH, so a miss near the head costs
   * few hashes and a long hit takes the lock a few times only. */
  for (size_t batch = 4; done < chunks; batch = batch < LOOKUP_BATCH / 2 ? 2 * batch : LOOKUP_BATCH) {
    size_t m = chunks - done < batch ? chunks - done : batch;
    for (size_t i = 0; i < m; i++) {
      const kvt_key *pk = i ? &keys[i - 1] : (done ? &prev_key : NULL);
      int r = kvt_chunk_key(&c->fp, pk, tokens + (done + i) * c->chunk_tokens, c->chunk_tokens,
                            &keys[i]);
      if (r)
        return r;
    }
    cache_discover(c, keys, m);
    pthread_mutex_lock(&c->mu);
    /* prev may have been evicted since the last batch: look it up again. */
    prev = done ? cache_find(c, &prev_key) : NULL;
    size_t hit = walk(c, keys, m, prev, &prev);
    pthread_mutex_unlock(&c->mu);
    done += hit;
    if (hit < m)
      break;
    prev_key = keys[m - 1];
  }
  *cached_tokens = done * c->chunk_tokens;
  pthread_mutex_lock(&c->mu);
  c->total.lookup_hit_tokens += *cached_tokens;
  pthread_mutex_unlock(&c->mu);
  return 0;
}

int kvt_cache_query(kvt_cache *c, const kvt_key *key, uint64_t *len, int *tier) {
  if (!c || !key)
    return -EINVAL;
  pthread_mutex_lock(&c->mu);
  centry *e = cache_find(c, key);
  int found = e && e->state == E_LIVE && e->mask;
  if (found && len)
    *len = e->len;
  if (found && tier)
    *tier = __builtin_ctz(e->mask);
  pthread_mutex_unlock(&c->mu);
  return found ? 0 : KVT_ENOTFOUND;
}

uint32_t kvt_cache_where(kvt_cache *c, const kvt_key *key) {
  if (!c || !key)
    return 0;
  pthread_mutex_lock(&c->mu);
  centry *e = cache_find(c, key);
  uint32_t mask = e && e->state == E_LIVE ? e->mask : 0;
  pthread_mutex_unlock(&c->mu);
  return mask;
}

int kvt_cache_del(kvt_cache *c, const kvt_key *key) {
  if (!c || !key)
    return -EINVAL;
  pthread_mutex_lock(&c->mu);
  centry *e = cache_find(c, key);
  if (!e || e->state != E_LIVE || !e->mask) {
    pthread_mutex_unlock(&c->mu);
    return KVT_ENOTFOUND;
  }
  /* Invisible from now on; wait for readers and movers to let go (they do
   * not wait on anything this thread holds). */
  e->state = E_DOOMED;
  e->busy++;
  while (e->busy > 1 || e->moving)
    pthread_cond_wait(&c->cv, &c->mu);
  const int r = cache_remove_copies(c, e);
  e->busy--;
  if (e->mask) { /* a tier would not delete its copy: it stays, and says so */
    e->state = E_LIVE;
    pthread_cond_broadcast(&c->cv);
  } else {
    cache_entry_free(c, e);
  }
  pthread_mutex_unlock(&c->mu);
  return r;
}

/* ---- stats ---------------------------------------------------------------- */

int kvt_cache_tier_count(const kvt_cache *c) {
  return c ? c->ntiers : 0;
}

kvt_tier *kvt_cache_tier(kvt_cache *c, int i) {
  return c && i >= 0 && i < c->ntiers ? c->t[i].tier : NULL;
}

int kvt_cache_stats_get(kvt_cache *c, int i, kvt_cache_stats *out) {
  if (!c || !out || i < -1 || i >= c->ntiers)
    return -EINVAL;
  size_t want = out->struct_size && out->struct_size < sizeof(*out) ? out->struct_size
                                                                     : sizeof(*out);
  kvt_cache_stats s;
  memset(&s, 0, sizeof(s));
  pthread_mutex_lock(&c->mu);
  if (i >= 0) {
    s = c->t[i].n;
    s.capacity = c->t[i].capacity;
    s.used = c->t[i].used;
    s.items = c->t[i].items;
  } else {
    s = c->total;
    s.items = 0;
    for (uint64_t j = 0; j < c->index.cap; j++) {
      const centry *e = c->index.slots[j].live ? c->index.slots[j].ref : NULL;
      if (e) {
        s.items += e->state == E_LIVE && e->mask;
        s.pinned += e->busy > 0 || e->moving;
      }
    }
    for (int t = 0; t < c->ntiers; t++) {
      const kvt_cache_stats *n = &c->t[t].n;
      s.capacity += c->t[t].capacity;
      s.used += c->t[t].used;
      s.puts += n->puts;
      s.bytes_in += n->bytes_in;
      s.demotions += n->demotions;
      s.promotions += n->promotions;
      s.evictions += n->evictions;
      s.errors += n->errors;
    }
  }
  pthread_mutex_unlock(&c->mu);
  s.struct_size = want;
  memcpy(out, &s, want);
  return 0;
}
