/* tests/test_cache_user_tiers.c - a cache over tiers the application opened
 * itself (kvt_cache_config.tier_handles): an application's backend is
 * treated by its traits like a built-in tier (a persistent one is indexed
 * at open, a shared one is asked about keys the index misses), the cache
 * owns the handles once its open succeeded and never before.
 *
 * The backend here keeps its values in a store that outlives its tiers (a
 * restart, or a second process, opens another tier on the same store). */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "cache_test_util.h"

#define MEM_MAX 64

typedef struct mem_store {
  pthread_mutex_t mu;
  struct {
    kvt_key key;
    uint8_t *val;
    uint64_t len;
  } items[MEM_MAX];
  size_t n;
  atomic_int opens, closes;
  atomic_long queries; /* QUERY operations received */
} mem_store;

typedef struct mem_tier {
  mem_store *s;
  kvt_tier *tier;
} mem_tier;

static int mem_open(kvt_ctx *ctx, const char *args, kvt_tier *tier, void **state) {
  (void)ctx;
  void *p = NULL;
  mem_tier *m = malloc(sizeof(*m));
  if (!m || sscanf(args, "%p", &p) != 1) {
    free(m);
    return -EINVAL;
  }
  m->s = p;
  m->tier = tier;
  atomic_fetch_add(&m->s->opens, 1);
  *state = m;
  return 0;
}

static void mem_close(void *state) {
  mem_tier *m = state;
  atomic_fetch_add(&m->s->closes, 1);
  free(m);
}

static long find_item(const mem_store *s, const kvt_key *k) {
  for (size_t i = 0; i < s->n; i++)
    if (!memcmp(s->items[i].key.bytes, k->bytes, sizeof(k->bytes)))
      return (long)i;
  return -1;
}

/* PUT, GET, DEL and QUERY, each completed before submit returns. */
static int mem_submit(void *state, kvt_tier_op *op) {
  mem_tier *m = state;
  mem_store *s = m->s;
  pthread_mutex_lock(&s->mu);
  const long i = find_item(s, &op->key);
  op->result = i < 0 && op->opcode != KVT_TIER_PUT ? KVT_ENOTFOUND : 0;
  if (op->opcode == KVT_TIER_QUERY)
    atomic_fetch_add(&s->queries, 1);
  if (i >= 0 && (op->opcode == KVT_TIER_GET || op->opcode == KVT_TIER_QUERY)) {
    op->out_len = s->items[i].len;
    if (op->opcode == KVT_TIER_GET && op->len < s->items[i].len)
      op->result = KVT_ENOBUFS;
    else if (op->opcode == KVT_TIER_GET)
      memcpy(op->buf, s->items[i].val, s->items[i].len);
  } else if (i >= 0 && op->opcode == KVT_TIER_DEL) {
    free(s->items[i].val);
    s->items[i] = s->items[--s->n];
  } else if (op->opcode == KVT_TIER_PUT) {
    uint8_t *v = malloc(op->len ? op->len : 1);
    const size_t at = i >= 0 ? (size_t)i : s->n;
    if (!v || at == MEM_MAX) {
      free(v);
      op->result = -ENOSPC;
    } else {
      memcpy(v, op->buf, op->len);
      if (i >= 0)
        free(s->items[at].val);
      else
        s->n++;
      s->items[at].key = op->key;
      s->items[at].val = v;
      s->items[at].len = op->len;
    }
  }
  pthread_mutex_unlock(&s->mu);
  kvt_tier_complete(m->tier, op);
  return 0;
}

static int mem_stats(void *state, kvt_tier_stats *out) {
  mem_store *s = ((mem_tier *)state)->s;
  pthread_mutex_lock(&s->mu);
  out->capacity = 64u << 20;
  out->items = s->n;
  out->used = 0;
  for (size_t i = 0; i < s->n; i++)
    out->used += s->items[i].len;
  pthread_mutex_unlock(&s->mu);
  return 0;
}

static int mem_list(void *state, kvt_tier_list_fn fn, void *opaque) {
  mem_store *s = ((mem_tier *)state)->s;
  kvt_key keys[MEM_MAX];
  uint64_t lens[MEM_MAX];
  pthread_mutex_lock(&s->mu);
  const size_t n = s->n;
  for (size_t i = 0; i < n; i++) {
    keys[i] = s->items[i].key;
    lens[i] = s->items[i].len;
  }
  pthread_mutex_unlock(&s->mu);
  for (size_t i = 0; i < n; i++) {
    const int r = fn(opaque, &keys[i], lens[i]);
    if (r)
      return r;
  }
  return 0;
}

#define MEM_BACKEND(name, tr)                                                                  \
  {.abi_version = KVT_TIER_ABI_VERSION,                                                        \
   .struct_size = sizeof(kvt_tier_backend),                                                    \
   .scheme = name,                                                                             \
   .open = mem_open,                                                                           \
   .close = mem_close,                                                                         \
   .submit = mem_submit,                                                                       \
   .stats = mem_stats,                                                                         \
   .list = mem_list,                                                                           \
   .traits = (tr)}

static const kvt_tier_backend mem_plain = MEM_BACKEND("mem", 0);
static const kvt_tier_backend mem_persistent = MEM_BACKEND("mem-persistent", KVT_TIER_PERSISTENT);
static const kvt_tier_backend mem_shared = MEM_BACKEND("mem-shared", KVT_TIER_SHARED);

/* ---- fixture ---- */

static cache_fx *fx;
static long live_base;
static mem_store store;

static int setup(void **state) {
  (void)state;
  fx = cache_fx_new();
  if (!fx)
    return -1;
  memset(&store, 0, sizeof(store));
  pthread_mutex_init(&store.mu, NULL);
  live_base = atomic_load(&fx->live);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  for (size_t i = 0; i < store.n; i++)
    free(store.items[i].val);
  pthread_mutex_destroy(&store.mu);
  assert_int_equal(atomic_load(&fx->live), live_base);
  cache_fx_free(fx);
  fx = NULL;
  return 0;
}

static kvt_tier *mem_tier_open(const kvt_tier_backend *be) {
  char args[32];
  snprintf(args, sizeof(args), "%p", (void *)&store);
  kvt_tier *t = NULL;
  assert_int_equal(kvt_tier_open_backend(fx->ctx, be, args, &t), 0);
  return t;
}

/* A cache over the tiers of specs (or NULL) and then the handle h. */
static int open_with(const char *specs, kvt_tier *h, uint32_t flags, kvt_cache **c) {
  kvt_cache_config cfg = KVT_CACHE_CONFIG_INIT;
  cfg.tiers = specs;
  cfg.fingerprint = &fx->fp;
  cfg.chunk_tokens = CT_TOKENS;
  cfg.flags = flags;
  cfg.tier_handles = &h;
  cfg.n_tier_handles = 1;
  return kvt_cache_open(fx->ctx, &cfg, c);
}

static void put_chain(kvt_cache *c, const kvt_key *keys, uint32_t n) {
  for (uint32_t i = 0; i < n; i++) {
    uint64_t len = 0;
    uint8_t *p = payload_of(fx->ctx, &fx->fp, &keys[i], CT_TOKENS, &len);
    assert_int_equal(kvt_cache_put(c, &keys[i], i ? &keys[i - 1] : NULL, p, len), 0);
    free(p);
  }
}

/* Every chunk of keys[0..n) is a hit of a lookup and a get with its bytes. */
static void assert_chain_held(kvt_cache *c, uint32_t seq, const kvt_key *keys, uint32_t n) {
  uint32_t *tok = seq_tokens(seq, n);
  size_t cached = 0;
  assert_int_equal(kvt_cache_lookup(c, tok, (size_t)n * CT_TOKENS, &cached), 0);
  assert_int_equal(cached, (size_t)n * CT_TOKENS);
  free(tok);
  for (uint32_t i = 0; i < n; i++) {
    uint64_t len = 0, got = 0;
    uint8_t *want = payload_of(fx->ctx, &fx->fp, &keys[i], CT_TOKENS, &len);
    uint8_t *buf = malloc(len);
    assert_int_equal(kvt_cache_get(c, &keys[i], buf, len, &got, NULL), 0);
    assert_int_equal(got, len);
    assert_memory_equal(buf, want, len);
    free(want);
    free(buf);
  }
}

/* ---- tests ---- */

static void test_persistent_user_tier_is_indexed_at_open(void **state) {
  (void)state;
  kvt_key keys[4];
  chain_keys(&fx->fp, 1, 4, keys);
  kvt_cache *c = NULL;
  assert_int_equal(open_with("dram:1MiB", mem_tier_open(&mem_persistent),
                             KVT_CACHE_WRITE_THROUGH, &c), 0);
  put_chain(c, keys, 4);
  assert_int_equal(kvt_cache_where(c, &keys[0]), 3u); /* dram, and written through */
  kvt_cache_close(c);
  assert_int_equal(atomic_load(&store.closes), 1);
  assert_int_equal(store.n, 4);
  /* A restart: a new process's dram is empty, the store is not. */
  assert_int_equal(open_with("dram:1MiB", mem_tier_open(&mem_persistent), 0, &c), 0);
  for (int i = 0; i < 4; i++)
    assert_int_equal(kvt_cache_where(c, &keys[i]), 2u);
  assert_chain_held(c, 1, keys, 4);
  kvt_cache_close(c);
}

/* The same backend declaring no traits: not listed, so a restart finds
 * nothing (and a put is not written through to it). */
static void test_user_tier_without_traits_is_not_listed_at_open(void **state) {
  (void)state;
  kvt_key keys[2];
  chain_keys(&fx->fp, 2, 2, keys);
  kvt_cache *c = NULL;
  assert_int_equal(open_with(NULL, mem_tier_open(&mem_plain), 0, &c), 0);
  assert_int_equal(kvt_cache_tier_count(c), 1);
  put_chain(c, keys, 2);
  kvt_cache_close(c);
  assert_int_equal(store.n, 2);
  assert_int_equal(open_with(NULL, mem_tier_open(&mem_plain), 0, &c), 0);
  assert_int_equal(kvt_cache_query(c, &keys[0], NULL, NULL), KVT_ENOTFOUND);
  kvt_cache_close(c);
  assert_int_equal(open_with("dram:1MiB", mem_tier_open(&mem_plain), KVT_CACHE_WRITE_THROUGH,
                             &c), 0);
  chain_keys(&fx->fp, 3, 2, keys);
  put_chain(c, keys, 2);
  assert_int_equal(kvt_cache_where(c, &keys[1]), 1u);
  kvt_cache_close(c);
}

/* Two caches on one shared store (two engine hosts on one remote tier):
 * what one puts, the other finds by asking the tier, not its index. */
static void test_shared_user_tier_is_asked_about_keys_the_index_misses(void **state) {
  (void)state;
  kvt_key keys[3];
  chain_keys(&fx->fp, 4, 3, keys);
  kvt_cache *a = NULL, *b = NULL;
  assert_int_equal(open_with(NULL, mem_tier_open(&mem_shared), 0, &a), 0);
  /* No promotion: b's gets leave the shared copies to a (a promotion moves
   * the copy up, deleting it from the shared tier unless written through). */
  assert_int_equal(open_with("dram:1MiB", mem_tier_open(&mem_shared), KVT_CACHE_NO_PROMOTE, &b),
                   0);
  put_chain(a, keys, 3);
  assert_int_equal(kvt_cache_query(b, &keys[0], NULL, NULL), KVT_ENOTFOUND); /* index only */
  const long asked = atomic_load(&store.queries);
  assert_chain_held(b, 4, keys, 3);
  assert_true(atomic_load(&store.queries) >= asked + 3);
  assert_int_equal(kvt_cache_query(b, &keys[2], NULL, NULL), 0); /* indexed now */
  /* A key the index holds is not asked again. */
  const long before = atomic_load(&store.queries);
  size_t hits = 0;
  assert_int_equal(kvt_cache_lookup_keys(a, keys, 3, &hits), 0);
  assert_int_equal(hits, 3);
  assert_int_equal(atomic_load(&store.queries), before);
  kvt_cache_close(a);
  kvt_cache_close(b);
  assert_int_equal(atomic_load(&store.closes), 2);
}

static void test_failed_open_leaves_the_handles_to_the_caller(void **state) {
  (void)state;
  kvt_tier *h = mem_tier_open(&mem_persistent);
  kvt_cache *c = (kvt_cache *)&h; /* must stay untouched */
  kvt_cache_config cfg = KVT_CACHE_CONFIG_INIT;
  cfg.fingerprint = &fx->fp;
  kvt_tier *twice[2] = {h, h}, *null_one[2] = {h, NULL};
  cfg.tier_handles = twice;
  cfg.n_tier_handles = 2;
  assert_int_equal(kvt_cache_open(fx->ctx, &cfg, &c), -EINVAL);
  assert_non_null(strstr(kvt_ctx_last_error(fx->ctx), "repeats"));
  cfg.tier_handles = null_one;
  assert_int_equal(kvt_cache_open(fx->ctx, &cfg, &c), -EINVAL);
  cfg.tier_handles = NULL;
  assert_int_equal(kvt_cache_open(fx->ctx, &cfg, &c), -EINVAL);
  cfg.n_tier_handles = 0;
  assert_int_equal(kvt_cache_open(fx->ctx, &cfg, &c), -EINVAL); /* no tiers at all */
  cfg.tiers = "dram:1MiB;dram:1MiB;dram:1MiB;dram:1MiB";
  cfg.tier_handles = twice;
  cfg.n_tier_handles = 1;
  assert_int_equal(kvt_cache_open(fx->ctx, &cfg, &c), -EINVAL); /* five tiers */
  cfg.tiers = "nosuch:1";
  assert_int_equal(kvt_cache_open(fx->ctx, &cfg, &c), KVT_ENOTSUP);
  cfg.tiers = "dram:1MiB";
  cfg.links = "pcie5-x16;no-such-link"; /* fails after the handle was listed */
  assert_int_equal(kvt_cache_open(fx->ctx, &cfg, &c), -EINVAL);
  assert_ptr_equal(c, (kvt_cache *)&h);
  assert_int_equal(atomic_load(&store.closes), 0);
  /* Still open, still the caller's. */
  const kvt_key k = {{7}};
  assert_int_equal(kvt_tier_put(h, &k, "x", 1), 0);
  kvt_tier_close(h);
  assert_int_equal(atomic_load(&store.closes), 1);
}

/* A config of 0.2's size ends before tier_handles: what lies there is not
 * read. */
static void test_config_of_the_older_size_ignores_tier_handles(void **state) {
  (void)state;
  kvt_cache_config cfg = KVT_CACHE_CONFIG_INIT;
  cfg.struct_size = offsetof(kvt_cache_config, tier_handles);
  cfg.tiers = "dram:1MiB";
  cfg.fingerprint = &fx->fp;
  cfg.tier_handles = (kvt_tier *const *)&cfg; /* garbage */
  cfg.n_tier_handles = 3;
  kvt_cache *c = NULL;
  assert_int_equal(kvt_cache_open(fx->ctx, &cfg, &c), 0);
  assert_int_equal(kvt_cache_tier_count(c), 1);
  kvt_cache_close(c);
}

#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)

int main(void) {
  const struct CMUnitTest tests[] = {
      T(test_persistent_user_tier_is_indexed_at_open),
      T(test_user_tier_without_traits_is_not_listed_at_open),
      T(test_shared_user_tier_is_asked_about_keys_the_index_misses),
      T(test_failed_open_leaves_the_handles_to_the_caller),
      T(test_config_of_the_older_size_ignores_tier_handles),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
