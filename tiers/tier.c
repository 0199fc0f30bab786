/* tiers/tier.c - the generic tier layer: the registry of compiled-in
 * backends, spec parsing, submission, completion delivery (to poll or to a
 * blocking helper's waiter), close with operations in flight, and the
 * counters every tier reports the same way. Backends only store bytes. */
#include <ctype.h>
#include <errno.h>
#include <stddef.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "tier_internal.h"

#define ST_SYNC 1u /* a blocking helper waits for this op: never polled */
#define ST_DONE 2u

struct kvt_tier {
  kvt_ctx *ctx;
  const kvt_tier_backend *be;
  void *state;
  char *spec;
  pthread_mutex_t mu;
  pthread_cond_t cv; /* broadcast on every completion */
  kvt_tier_op *done_head, *done_tail; /* completed, not yet polled (internal[0] links) */
  uint64_t in_flight;
  int closing;
  kvt_tier_stats n; /* the generic counters */
};

static const kvt_tier_backend *const registry[] = {
    &kvt_tier_backend_dram,
#ifdef KVT_HAVE_CUDA
    &kvt_tier_backend_hbm,
#endif
    &kvt_tier_backend_nvme,
#ifdef KVT_HAVE_HIREDIS
    &kvt_tier_backend_redis,
    &kvt_tier_backend_redis_cluster,
#endif
#ifdef KVT_HAVE_FABRIC
    &kvt_tier_backend_fabric,
#endif
    &kvt_tier_backend_fault,
    &kvt_tier_backend_trace,
};

kvt_ctx *kvt_tier_ctx(kvt_tier *t) { return t->ctx; }

/* ---- secrets in specs ---- */

/* The length of a secret option's "NAME=" at s (after '?' or '&'), or 0. */
static size_t secret_option(const char *s) {
  static const char *const names[] = {"password=", "token="};
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
    if (strncmp(s, names[i], strlen(names[i])) == 0)
      return strlen(names[i]);
  return 0;
}

/* Where the userinfo of the authority at s[u] ends: the index of its '@',
 * or 0. As the redis tier reads it: the last '@' before the options. A
 * password with an unescaped '?' makes the spec malformed; its '@' then
 * comes after the '?', and is taken too (unless inside a secret option). */
static size_t userinfo_end(const char *s, size_t u) {
  const size_t q = u + strcspn(s + u, "?#");
  size_t at = 0;
  for (size_t j = u; j < q; j++)
    if (s[j] == '@')
      at = j;
  for (size_t j = q; !at && s[j]; j++) {
    const size_t k = (s[j] == '?' || s[j] == '&') ? secret_option(s + j + 1) : 0;
    if (k)
      j += k + strcspn(s + j + 1 + k, "&");
    else if (s[j] == '@')
      at = j;
  }
  for (size_t j = at + 1; at && s[j]; j++) /* the last '@' of the malformed tail */
    if (s[j] == '@')
      at = j;
  return at;
}

static void put(char *dst, size_t cap, size_t *o, const char *s, size_t n) {
  for (size_t i = 0; i < n; i++, ++*o)
    if (*o + 1 < cap)
      dst[*o] = s[i];
}

size_t kvt_spec_redact(char *dst, size_t cap, const char *spec) {
  size_t o = 0, i = 0, k;
  while (spec[i]) {
    if (spec[i] == '/' && spec[i + 1] == '/' && (i == 0 || spec[i - 1] == ':')) {
      const size_t u = i + 2, at = userinfo_end(spec, u);
      put(dst, cap, &o, "//", 2);
      i = u;
      if (at) { /* USER:PASSWORD@ keeps USER:, PASSWORD@ keeps nothing */
        const char *colon = memchr(spec + u, ':', at - u);
        if (colon)
          put(dst, cap, &o, spec + u, (size_t)(colon - spec) + 1 - u);
        put(dst, cap, &o, "***", 3);
        i = at;
      }
    } else if ((spec[i] == '?' || spec[i] == '&') && (k = secret_option(spec + i + 1)) != 0) {
      put(dst, cap, &o, spec + i, 1 + k);
      put(dst, cap, &o, "***", 3);
      i += 1 + k;
      i += strcspn(spec + i, "&");
    } else {
      put(dst, cap, &o, spec + i++, 1);
    }
  }
  if (cap)
    dst[o < cap ? o : cap - 1] = '\0';
  return o;
}

const char *kvt_tier_spec(const kvt_tier *t) { return t ? t->spec : ""; }

void kvt_tier_op_init(kvt_tier_op *op, int opcode, const kvt_key *key, void *buf, uint64_t len,
                      uint64_t user_data) {
  memset(op, 0, sizeof(*op));
  op->opcode = (uint32_t)opcode;
  if (key)
    op->key = *key;
  op->buf = buf;
  op->len = len;
  op->user_data = user_data;
}

/* kvt_parse_size, telling a number past 2^64 - 1 (-ERANGE) from text that is
 * no size (-EINVAL). */
static int parse_size(const char *text, uint64_t *out) {
  static const struct {
    const char *unit;
    uint64_t mul;
  } units[] = {{"", 1},         {"b", 1},          {"k", 1ull << 10},   {"kib", 1ull << 10},
               {"kb", 1000},    {"m", 1ull << 20}, {"mib", 1ull << 20}, {"mb", 1000000},
               {"g", 1ull << 30}, {"gib", 1ull << 30}, {"gb", 1000000000ull}, {"t", 1ull << 40},
               {"tib", 1ull << 40}, {"tb", 1000000000000ull}};
  if (!text || !out || !isdigit((unsigned char)*text))
    return -EINVAL;
  errno = 0;
  char *end;
  unsigned long long v = strtoull(text, &end, 10);
  if (errno)
    return errno == ERANGE ? -ERANGE : -EINVAL;
  char unit[8] = {0};
  size_t n = strlen(end);
  if (n >= sizeof(unit))
    return -EINVAL;
  for (size_t i = 0; i < n; i++)
    unit[i] = (char)tolower((unsigned char)end[i]);
  for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++)
    if (strcmp(unit, units[i].unit) == 0) {
      if (v > UINT64_MAX / units[i].mul)
        return -ERANGE;
      *out = v * units[i].mul;
      return 0;
    }
  return -EINVAL;
}

int kvt_parse_size(const char *text, uint64_t *out) {
  const int rc = parse_size(text, out);
  return rc == -ERANGE ? -EINVAL : rc;
}

const char *kvt_size_why(const char *text) {
  uint64_t v;
  return parse_size(text, &v) == -ERANGE ? "is too large (the limit is 2^64 - 1 bytes)"
                                         : "is not a size above zero";
}

static int tier_create(kvt_ctx *ctx, const kvt_tier_backend *be, const char *spec,
                       const char *args, kvt_tier **out) {
  if (be->abi_version != KVT_TIER_ABI_VERSION ||
      be->struct_size < offsetof(kvt_tier_backend, borrow) || /* 0.1 tables end there */
      !be->open || !be->close || !be->submit)
    return kvt_fail(ctx, -EINVAL, "tier backend '%s': ABI %u, size %u, or a required member missing",
                    be->scheme ? be->scheme : "?", be->abi_version, be->struct_size);
  kvt_tier *t = kvt_alloc(ctx, sizeof(*t), 64);
  const size_t shown = kvt_spec_redact(NULL, 0, spec) + 1; /* what kvt_tier_spec shows */
  char *copy = kvt_alloc(ctx, shown, 1);
  if (!t || !copy) {
    kvt_dealloc(ctx, t);
    kvt_dealloc(ctx, copy);
    return kvt_fail(ctx, -ENOMEM, "allocating a tier handle");
  }
  memset(t, 0, sizeof(*t));
  kvt_spec_redact(copy, shown, spec);
  t->ctx = ctx;
  t->be = be;
  t->spec = copy;
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_mutex_init(&t->mu, NULL);
  pthread_cond_init(&t->cv, &ca);
  pthread_condattr_destroy(&ca);
  int rc = be->open(ctx, args, t, &t->state);
  if (rc) {
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->mu);
    kvt_dealloc(ctx, copy);
    kvt_dealloc(ctx, t);
    return rc;
  }
  *out = t;
  return 0;
}

int kvt_tier_scheme_known(const char *name, size_t len) {
  for (size_t i = 0; i < sizeof(registry) / sizeof(registry[0]); i++)
    if (strlen(registry[i]->scheme) == len && strncmp(registry[i]->scheme, name, len) == 0)
      return 1;
  return 0;
}

int kvt_tier_open(kvt_ctx *ctx, const char *spec, kvt_tier **out) {
  if (!ctx || !spec || !out)
    return -EINVAL;
  kvt_clear_error(ctx);
  size_t n = strcspn(spec, ":@");
  char shown[512];
  kvt_spec_redact(shown, sizeof(shown), spec);
  if (n == 0 || !spec[n])
    return kvt_fail(ctx, KVT_ESPEC, "tier spec '%s': expected SCHEME:ARGS or SCHEME@SPEC", shown);
  for (size_t i = 0; i < sizeof(registry) / sizeof(registry[0]); i++)
    if (strlen(registry[i]->scheme) == n && strncmp(registry[i]->scheme, spec, n) == 0)
      return tier_create(ctx, registry[i], spec, spec + n + 1, out);
  char names[128] = "";
  for (size_t i = 0; i < sizeof(registry) / sizeof(registry[0]); i++)
    snprintf(names + strlen(names), sizeof(names) - strlen(names), "%s%s", i ? ", " : "",
             registry[i]->scheme);
  return kvt_fail(ctx, KVT_ENOTSUP, "tier spec '%s': scheme '%.*s' is not built in (built in: %s)",
                  shown, (int)n, spec, names);
}

int kvt_tier_open_backend(kvt_ctx *ctx, const kvt_tier_backend *be, const char *args,
                          kvt_tier **out) {
  if (!ctx || !be || !out)
    return -EINVAL;
  kvt_clear_error(ctx);
  return tier_create(ctx, be, be->scheme ? be->scheme : "custom", args ? args : "", out);
}

/* Waits (mu held) for cond to change: drives the backend when it needs the
 * caller's thread, else sleeps on the condition variable. */
static void wait_step(kvt_tier *t, int timeout_ms) {
  if (t->be->progress) {
    pthread_mutex_unlock(&t->mu);
    t->be->progress(t->state, timeout_ms < 0 || timeout_ms > 10 ? 10 : timeout_ms);
    pthread_mutex_lock(&t->mu);
    return;
  }
  if (timeout_ms < 0) {
    pthread_cond_wait(&t->cv, &t->mu);
    return;
  }
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
  ts.tv_sec += timeout_ms / 1000 + ts.tv_nsec / 1000000000L;
  ts.tv_nsec %= 1000000000L;
  pthread_cond_timedwait(&t->cv, &t->mu, &ts);
}

void kvt_tier_close(kvt_tier *t) {
  if (!t)
    return;
  pthread_mutex_lock(&t->mu);
  t->closing = 1;
  while (t->in_flight > 0)
    wait_step(t, -1);
  pthread_mutex_unlock(&t->mu);
  t->be->close(t->state);
  pthread_cond_destroy(&t->cv);
  pthread_mutex_destroy(&t->mu);
  kvt_ctx *ctx = t->ctx;
  kvt_dealloc(ctx, t->spec);
  kvt_dealloc(ctx, t);
}

static void count(kvt_tier_stats *n, const kvt_tier_op *op) {
  switch (op->opcode) {
  case KVT_TIER_PUT:
    n->puts++;
    n->bytes_in += op->result == 0 ? op->len : 0;
    break;
  case KVT_TIER_GET:
    n->gets++;
    n->hits += op->result == 0;
    n->misses += op->result == KVT_ENOTFOUND;
    n->bytes_out += op->result == 0 ? op->out_len : 0;
    break;
  case KVT_TIER_DEL:
    n->dels++;
    break;
  default:
    n->queries++;
    break;
  }
  if (op->result != 0 && op->result != KVT_ENOTFOUND && op->result != KVT_ENOBUFS)
    n->errors++;
}

void kvt_tier_complete(kvt_tier *t, kvt_tier_op *op) {
  pthread_mutex_lock(&t->mu);
  count(&t->n, op);
  t->in_flight--;
  if (op->status & ST_SYNC) {
    op->status |= ST_DONE;
  } else {
    op->internal[0] = NULL;
    if (t->done_tail)
      t->done_tail->internal[0] = op;
    else
      t->done_head = op;
    t->done_tail = op;
  }
  pthread_cond_broadcast(&t->cv);
  pthread_mutex_unlock(&t->mu);
}

static int valid_op(const kvt_tier_op *op) {
  if (!op || op->opcode < KVT_TIER_PUT || op->opcode > KVT_TIER_QUERY || op->flags ||
      op->reserved[0] || op->reserved[1])
    return 0;
  if ((op->opcode == KVT_TIER_PUT || op->opcode == KVT_TIER_GET) && op->len && !op->buf)
    return 0;
  return 1;
}

static int submit(kvt_tier *t, kvt_tier_op *const *ops, size_t n, uint32_t status) {
  if (!t || (!ops && n))
    return -EINVAL;
  /* No detail on the context here: the data path runs on many threads, and
   * the context's last-error buffer is for one (tier.h). */
  for (size_t i = 0; i < n; i++)
    if (!valid_op(ops[i]))
      return -EINVAL;
  for (size_t i = 0; i < n; i++) {
    kvt_tier_op *op = ops[i];
    op->status = status;
    op->result = 0;
    op->out_len = 0;
    op->internal[0] = op->internal[1] = NULL;
    pthread_mutex_lock(&t->mu);
    if (t->closing) {
      pthread_mutex_unlock(&t->mu);
      return i ? (int)i : -ESHUTDOWN;
    }
    t->in_flight++;
    pthread_mutex_unlock(&t->mu);
    int rc = t->be->submit(t->state, op);
    if (rc < 0) {
      pthread_mutex_lock(&t->mu);
      t->in_flight--;
      pthread_cond_broadcast(&t->cv);
      pthread_mutex_unlock(&t->mu);
      return i ? (int)i : rc;
    }
  }
  return (int)n;
}

int kvt_tier_submit(kvt_tier *t, kvt_tier_op *const *ops, size_t n) {
  return submit(t, ops, n > INT32_MAX ? INT32_MAX : n, 0);
}

int kvt_tier_poll(kvt_tier *t, kvt_tier_op **done, size_t max, int timeout_ms) {
  if (!t || (!done && max))
    return -EINVAL;
  struct timespec start;
  clock_gettime(CLOCK_MONOTONIC, &start);
  pthread_mutex_lock(&t->mu);
  size_t got = 0;
  int turned = 0;
  for (;;) {
    while (got < max && t->done_head) {
      kvt_tier_op *op = t->done_head;
      t->done_head = op->internal[0];
      if (!t->done_head)
        t->done_tail = NULL;
      op->internal[0] = NULL;
      done[got++] = op;
    }
    if (timeout_ms == 0 && !got && max && t->in_flight && t->be->progress && !turned) {
      /* A backend completing on the caller's thread (io_uring) gets one
       * non-blocking turn, so polling with timeout 0 makes progress. */
      pthread_mutex_unlock(&t->mu);
      t->be->progress(t->state, 0);
      pthread_mutex_lock(&t->mu);
      turned = 1; /* what it completed is collected above, then we return */
      continue;
    }
    if (got || max == 0 || timeout_ms == 0 || t->in_flight == 0)
      break; /* nothing in flight: nothing could arrive but a later submit's */
    int left = -1;
    if (timeout_ms > 0) {
      struct timespec now;
      clock_gettime(CLOCK_MONOTONIC, &now);
      long ms = (now.tv_sec - start.tv_sec) * 1000L + (now.tv_nsec - start.tv_nsec) / 1000000L;
      if (ms >= timeout_ms)
        break;
      left = (int)(timeout_ms - ms);
    }
    wait_step(t, left);
  }
  pthread_mutex_unlock(&t->mu);
  return (int)got;
}

int kvt_tier_submit_owned(kvt_tier *t, kvt_tier_op *const *ops, size_t n) {
  return submit(t, ops, n > INT32_MAX ? INT32_MAX : n, ST_SYNC);
}

int kvt_tier_wait(kvt_tier *t, kvt_tier_op *op, int timeout_ms) {
  if (!t || !op)
    return -EINVAL;
  struct timespec start;
  clock_gettime(CLOCK_MONOTONIC, &start);
  pthread_mutex_lock(&t->mu); /* the completing thread writes status under it */
  if (!(op->status & ST_SYNC)) {
    pthread_mutex_unlock(&t->mu);
    return -EINVAL;
  }
  if (!(op->status & ST_DONE) && timeout_ms == 0 && t->be->progress) {
    pthread_mutex_unlock(&t->mu); /* one non-blocking turn, as kvt_tier_poll */
    t->be->progress(t->state, 0);
    pthread_mutex_lock(&t->mu);
  }
  while (!(op->status & ST_DONE) && timeout_ms != 0) {
    int left = -1;
    if (timeout_ms > 0) {
      struct timespec now;
      clock_gettime(CLOCK_MONOTONIC, &now);
      long ms = (now.tv_sec - start.tv_sec) * 1000L + (now.tv_nsec - start.tv_nsec) / 1000000L;
      if (ms >= timeout_ms)
        break;
      left = (int)(timeout_ms - ms);
    }
    wait_step(t, left);
  }
  const int done = (op->status & ST_DONE) != 0;
  pthread_mutex_unlock(&t->mu);
  return done ? op->result : -ETIMEDOUT;
}

static int run_sync(kvt_tier *t, kvt_tier_op *op) {
  kvt_tier_op *one[1] = {op};
  int rc = submit(t, one, 1, ST_SYNC);
  if (rc < 0)
    return rc;
  return kvt_tier_wait(t, op, -1);
}

int kvt_tier_put(kvt_tier *t, const kvt_key *key, const void *buf, uint64_t len) {
  kvt_tier_op op;
  kvt_tier_op_init(&op, KVT_TIER_PUT, key, (void *)buf, len, 0);
  return key ? run_sync(t, &op) : -EINVAL;
}

int kvt_tier_get(kvt_tier *t, const kvt_key *key, void *buf, uint64_t cap, uint64_t *len) {
  kvt_tier_op op;
  kvt_tier_op_init(&op, KVT_TIER_GET, key, buf, cap, 0);
  int rc = key ? run_sync(t, &op) : -EINVAL;
  if (len && (rc == 0 || rc == KVT_ENOBUFS))
    *len = op.out_len;
  return rc;
}

int kvt_tier_del(kvt_tier *t, const kvt_key *key) {
  kvt_tier_op op;
  kvt_tier_op_init(&op, KVT_TIER_DEL, key, NULL, 0, 0);
  return key ? run_sync(t, &op) : -EINVAL;
}

int kvt_tier_query(kvt_tier *t, const kvt_key *key, uint64_t *len) {
  kvt_tier_op op;
  kvt_tier_op_init(&op, KVT_TIER_QUERY, key, NULL, 0, 0);
  int rc = key ? run_sync(t, &op) : -EINVAL;
  if (len && rc == 0)
    *len = op.out_len;
  return rc;
}

void kvt_tier_forward(kvt_tier *inner, kvt_tier_op *op, const void *put_buf, uint64_t put_len) {
  uint64_t len = 0;
  switch (op->opcode) {
  case KVT_TIER_PUT:
    op->result = kvt_tier_put(inner, &op->key, put_buf, put_len);
    break;
  case KVT_TIER_GET:
    op->result = kvt_tier_get(inner, &op->key, op->buf, op->len, &len);
    break;
  case KVT_TIER_DEL:
    op->result = kvt_tier_del(inner, &op->key);
    break;
  default:
    op->result = kvt_tier_query(inner, &op->key, &len);
    break;
  }
  op->out_len = len;
}

int kvt_tier_inner_stats(kvt_tier *inner, kvt_tier_stats *out) {
  kvt_tier_stats in;
  memset(&in, 0, sizeof(in));
  in.struct_size = sizeof(in);
  int rc = kvt_tier_stats_get(inner, &in);
  if (rc)
    return rc;
  out->capacity = in.capacity;
  out->used = in.used;
  out->items = in.items;
  out->item_overhead = in.item_overhead;
  out->granule = in.granule;
  out->pinned_bytes = in.pinned_bytes;
  return 0;
}

int kvt_tier_stats_get(kvt_tier *t, kvt_tier_stats *out) {
  if (!t || !out)
    return -EINVAL;
  size_t want = out->struct_size && out->struct_size < sizeof(*out) ? out->struct_size
                                                                    : sizeof(*out);
  kvt_tier_stats s, b;
  pthread_mutex_lock(&t->mu);
  s = t->n;
  s.in_flight = t->in_flight;
  pthread_mutex_unlock(&t->mu);
  memset(&b, 0, sizeof(b));
  b.struct_size = sizeof(b);
  if (t->be->stats) {
    int rc = t->be->stats(t->state, &b);
    if (rc)
      return rc;
  }
  s.capacity = b.capacity;
  s.used = b.used;
  s.items = b.items;
  s.item_overhead = b.item_overhead;
  s.granule = b.granule;
  s.pinned_bytes = b.pinned_bytes;
  s.struct_size = want;
  memcpy(out, &s, want);
  return 0;
}

int kvt_tier_list(kvt_tier *t, kvt_tier_list_fn fn, void *opaque) {
  if (!t || !fn)
    return -EINVAL;
  if (!t->be->list)
    return KVT_ENOTSUP;
  return t->be->list(t->state, fn, opaque);
}

/* Members appended after 0.1 exist only in tables that are long enough. */
#define HAS_MEMBER(be, m) \
  ((be)->struct_size >= offsetof(kvt_tier_backend, m) + sizeof((be)->m) && (be)->m)

uint32_t kvt_tier_traits(const kvt_tier *t) {
  if (!t)
    return 0;
  if (HAS_MEMBER(t->be, traits_of))
    return t->be->traits_of(t->state);
  return HAS_MEMBER(t->be, traits) ? t->be->traits : 0;
}

int kvt_tier_borrow(kvt_tier *t, const kvt_key *key, kvt_tier_loan *loan) {
  if (!t || !key || !loan)
    return -EINVAL;
  memset(loan, 0, sizeof(*loan));
  if (!HAS_MEMBER(t->be, borrow) || !HAS_MEMBER(t->be, unborrow))
    return KVT_ENOTSUP;
  const int rc = t->be->borrow(t->state, key, loan);
  pthread_mutex_lock(&t->mu); /* counted as a GET */
  t->n.gets++;
  t->n.hits += rc == 0;
  t->n.misses += rc == KVT_ENOTFOUND;
  t->n.bytes_out += rc == 0 ? loan->len : 0;
  pthread_mutex_unlock(&t->mu);
  return rc;
}

void kvt_tier_return(kvt_tier *t, kvt_tier_loan *loan) {
  if (t && loan && HAS_MEMBER(t->be, unborrow))
    t->be->unborrow(t->state, loan);
}

int kvt_tier_can_reserve(const kvt_tier *t) {
  return t && HAS_MEMBER(t->be, reserve) && HAS_MEMBER(t->be, publish) &&
         HAS_MEMBER(t->be, abort);
}

int kvt_tier_reserve(kvt_tier *t, const kvt_key *key, uint64_t len, kvt_tier_reservation *res) {
  if (!t || !key || !res)
    return -EINVAL;
  memset(res, 0, sizeof(*res));
  if (!kvt_tier_can_reserve(t))
    return KVT_ENOTSUP;
  res->key = *key;
  res->len = len;
  return t->be->reserve(t->state, key, len, res);
}

int kvt_tier_publish(kvt_tier *t, kvt_tier_reservation *res) {
  if (!t || !res || !HAS_MEMBER(t->be, publish))
    return -EINVAL;
  const uint64_t len = res->len;
  const int rc = t->be->publish(t->state, res);
  if (rc == -EINVAL) /* not a reservation: nothing was put */
    return rc;
  pthread_mutex_lock(&t->mu); /* counted as a PUT */
  t->n.puts++;
  t->n.bytes_in += rc == 0 ? len : 0;
  t->n.errors += rc != 0;
  pthread_mutex_unlock(&t->mu);
  return rc;
}

void kvt_tier_abort(kvt_tier *t, kvt_tier_reservation *res) {
  if (t && res && HAS_MEMBER(t->be, abort))
    t->be->abort(t->state, res);
}
