/* tiers/redis/tier_redis_list.c - the redis tier's list: SCAN over the namespace
 * on every master (the cluster's, from the slot map), the length of each
 * value from its header (only headers of ours for the key they are under,
 * checksum and all: what a GET could find), keys reported once even when
 * SCAN repeats one (it may, while the server rehashes). Runs on the caller's thread over its
 * own connections. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "tier_redis.h"

/* A set of 16-byte keys (open addressing), for SCAN's repeats. */
typedef struct keyset {
  kvt_ctx *ctx;
  kvt_key *slot;
  uint8_t *used;
  size_t cap, n;
} keyset;

static int keyset_grow(keyset *s) {
  const size_t cap = s->cap ? s->cap * 2 : 1024;
  kvt_key *slot = kvt_alloc(s->ctx, cap * sizeof(kvt_key), 64);
  uint8_t *used = kvt_alloc(s->ctx, cap, 64);
  if (!slot || !used) {
    kvt_dealloc(s->ctx, slot);
    kvt_dealloc(s->ctx, used);
    return -ENOMEM;
  }
  memset(used, 0, cap);
  for (size_t i = 0; i < s->cap; i++)
    if (s->used[i]) {
      size_t h = kvt_ld64(s->slot[i].bytes) & (cap - 1);
      while (used[h])
        h = (h + 1) & (cap - 1);
      used[h] = 1;
      slot[h] = s->slot[i];
    }
  kvt_dealloc(s->ctx, s->slot);
  kvt_dealloc(s->ctx, s->used);
  s->slot = slot, s->used = used, s->cap = cap;
  return 0;
}

/* 1 when k is new (and now in the set), 0 when seen, or -ENOMEM. */
static int keyset_add(keyset *s, const kvt_key *k) {
  if ((s->n + 1) * 2 > s->cap && keyset_grow(s))
    return -ENOMEM;
  size_t h = kvt_ld64(k->bytes) & (s->cap - 1);
  while (s->used[h]) {
    if (memcmp(s->slot[h].bytes, k->bytes, 16) == 0)
      return 0;
    h = (h + 1) & (s->cap - 1);
  }
  s->used[h] = 1;
  s->slot[h] = *k;
  s->n++;
  return 1;
}

static int unhex(const char *p, kvt_key *k) {
  for (int i = 0; i < 32; i++) {
    const char ch = p[i];
    const int v = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
    if (v < 0)
      return -1;
    k->bytes[i / 2] = (uint8_t)(i % 2 ? (k->bytes[i / 2] | v) : v << 4);
  }
  return 0;
}

/* The lengths of one SCAN page's keys (GETRANGE of each header, pipelined),
 * then the callbacks. */
static int list_page(rd_state *st, rd_conn *c, const redisReply *keys, keyset *seen,
                     kvt_tier_list_fn fn, void *opaque) {
  int rc = 0;
  rd_arm(st, c);
  for (size_t i = 0; i < keys->elements && !rc; i++) {
    const char *argv[4] = {"GETRANGE", keys->element[i]->str, "0", "63"};
    const size_t lens[4] = {8, keys->element[i]->len, 1, 2};
    rc = rd_ctl_send(c, 4, argv, lens);
  }
  for (size_t i = 0; i < keys->elements && rc == 0; i++) {
    redisReply *r = NULL;
    rc = rd_ctl_read(c, &r);
    if (rc)
      break;
    const redisReply *k = keys->element[i];
    kvt_key key;
    rd_hdr v;
    if (r->type == REDIS_REPLY_STRING && k->len == st->prefix_len + 34 &&
        unhex(k->str + st->prefix_len + 1, &key) == 0 &&
        rd_hdr_check((const uint8_t *)r->str, r->len, &key, &v) == RD_HDR_OK) {
      const int fresh = keyset_add(seen, &key);
      if (fresh < 0)
        rc = fresh;
      else if (fresh)
        rc = fn(opaque, &key, v.total);
    }
    freeReplyObject(r);
  }
  return rc;
}

static int list_node(rd_state *st, int node, keyset *seen, kvt_tier_list_fn fn, void *opaque) {
  rd_conn c;
  memset(&c, 0, sizeof(c));
  c.fd = -1;
  int rc = rd_conn_open(st, node, &c, 0);
  char pattern[256], cursor[32] = "0";
  snprintf(pattern, sizeof(pattern), "%s{????????????????????????????????}", st->prefix);
  while (rc == 0) {
    const char *argv[6] = {"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"};
    const size_t lens[6] = {4, strlen(cursor), 5, strlen(pattern), 5, 4};
    redisReply *r = NULL;
    rc = rd_ctl(st, &c, 6, argv, lens, &r);
    if (rc)
      break;
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_ARRAY ||
        r->element[0]->len >= sizeof(cursor)) {
      rc = r->type == REDIS_REPLY_ERROR ? rd_reply_error(r->str, r->len) : KVT_EPROTO;
      freeReplyObject(r);
      break;
    }
    snprintf(cursor, sizeof(cursor), "%s", r->element[0]->str);
    rc = list_page(st, &c, r->element[1], seen, fn, opaque);
    freeReplyObject(r);
    if (strcmp(cursor, "0") == 0)
      break;
  }
  rd_conn_free(st, &c);
  return rc;
}

int rd_list(void *state, kvt_tier_list_fn fn, void *opaque) {
  rd_state *st = state;
  if (st->cluster)
    rd_refresh_map(st, 1);
  int masters[RD_MAX_NODES], n = 0, seen_node[RD_MAX_NODES] = {0};
  pthread_mutex_lock(&st->map_mu);
  for (int s = 0; s < RD_SLOTS && (st->cluster || n == 0); s++) {
    const int node = st->cluster ? st->slot_node[s] : 0;
    if (node != RD_NO_NODE && !seen_node[node]) {
      seen_node[node] = 1;
      masters[n++] = node;
    }
  }
  pthread_mutex_unlock(&st->map_mu);
  keyset seen = {.ctx = st->ctx};
  int rc = 0;
  for (int i = 0; i < n && rc == 0; i++)
    rc = list_node(st, masters[i], &seen, fn, opaque);
  kvt_dealloc(st->ctx, seen.slot);
  kvt_dealloc(st->ctx, seen.used);
  return rc;
}

typedef struct tally {
  uint64_t used, items;
} tally;

static int tally_one(void *opaque, const kvt_key *key, uint64_t len) {
  tally *t = opaque;
  (void)key;
  t->used += len + RD_ITEM_OVERHEAD;
  t->items++;
  return 0;
}

int rd_recount(rd_state *st, uint64_t *used, uint64_t *items) {
  tally t = {0, 0};
  const int rc = rd_list(st, tally_one, &t);
  if (rc == 0)
    *used = t.used, *items = t.items;
  return rc;
}
