/* tests/campaign/campaign_store.c - the stores the campaign writes (the
 * cache over dram and nvme, an nvme tier, a redis tier, a fabric tier on the
 * campaign's server) behind one put/get/del, and the writer processes that
 * drive them and check every get against the acknowledgement log. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "campaign.h"

const char *const ck_tenant[CK_SLOTS] = {"alice", "bob", "alice", "mallory"};
const char *const ck_token[CK_SLOTS] = {"alice-token-7f3a91", "bob-token-c42d08",
                                        "alice-token-7f3a91", "mallory-token-5be6d2"};

static void log_line(void *opaque, int level, const char *msg) {
  (void)opaque;
  if (ck_opt.verbose)
    fprintf(stderr, "campaign: [pid %d] library (%d): %s\n", (int)getpid(), level, msg);
}

int ck_store_durable(int sub) {
  (void)sub;
  return 1; /* every store is sized so that nothing is evicted */
}

int ck_store_open(ck_store *s, int sub, int slot) {
  memset(s, 0, sizeof(*s));
  s->sub = sub;
  s->slot = slot;
  kvt_ctx_config cc = KVT_CTX_CONFIG_INIT;
  cc.log = log_line;
  cc.log_level = KVT_LOG_WARN;
  int rc = kvt_ctx_create(&cc, &s->ctx);
  if (rc)
    return rc;
  char spec[600];
  switch (sub) {
  case CK_CACHE: {
    /* A small DRAM tier, so values move down and back up; written through
     * to NVMe, so every acknowledged put survives a kill. */
    snprintf(spec, sizeof(spec), "dram:96KiB;nvme:%s:%s", ck_e.dir[sub][slot], ck_e.nvme_size);
    kvt_cache_config cfg = KVT_CACHE_CONFIG_INIT;
    cfg.tiers = spec;
    cfg.fingerprint = ck_fingerprint();
    cfg.flags = KVT_CACHE_WRITE_THROUGH;
    rc = kvt_cache_open(s->ctx, &cfg, &s->cache);
    break;
  }
  case CK_NVME: /* odd slots on the pread engine */
    snprintf(spec, sizeof(spec), "nvme:%s:%s%s", ck_e.dir[sub][slot], ck_e.nvme_size,
             slot % 2 ? ",engine=pread" : "");
    rc = kvt_tier_open(s->ctx, spec, &s->tier);
    break;
  case CK_REDIS:
    snprintf(spec, sizeof(spec), "redis://127.0.0.1:%d?ns=campaign&timeout_ms=3000",
             ck_e.redis_port);
    rc = kvt_tier_open(s->ctx, spec, &s->tier);
    break;
  default:
    snprintf(spec, sizeof(spec), "fabric://127.0.0.1:%d?tenant=%s&token=%s&timeout_ms=3000",
             __atomic_load_n(&ck->srv_port, __ATOMIC_SEQ_CST), ck_tenant[slot], ck_token[slot]);
    rc = kvt_tier_open(s->ctx, spec, &s->tier);
  }
  if (rc) {
    if (ck_opt.verbose)
      fprintf(stderr, "campaign: [pid %d] open %s: %s (%s)\n", (int)getpid(), spec,
              kvt_err_name(rc), kvt_ctx_last_error(s->ctx));
    kvt_ctx_destroy(s->ctx);
    s->ctx = NULL;
  }
  return rc;
}

void ck_store_close(ck_store *s) {
  kvt_cache_close(s->cache);
  kvt_tier_close(s->tier);
  kvt_ctx_destroy(s->ctx);
  memset(s, 0, sizeof(*s));
}

int ck_store_put(ck_store *s, uint32_t idx, const void *buf, uint64_t len) {
  const kvt_key k = ck_key_of(s->sub, s->slot, idx);
  return s->cache ? kvt_cache_put(s->cache, &k, NULL, buf, len)
                  : kvt_tier_put(s->tier, &k, buf, len);
}

int ck_store_get(ck_store *s, uint32_t idx, void *buf, uint64_t cap, uint64_t *len) {
  const kvt_key k = ck_key_of(s->sub, s->slot, idx);
  *len = 0;
  return s->cache ? kvt_cache_get(s->cache, &k, buf, cap, len, NULL)
                  : kvt_tier_get(s->tier, &k, buf, cap, len);
}

int ck_store_del(ck_store *s, uint32_t idx) {
  const kvt_key k = ck_key_of(s->sub, s->slot, idx);
  return s->cache ? kvt_cache_del(s->cache, &k) : kvt_tier_del(s->tier, &k);
}

/* ---- the writer ---- */

typedef struct writer {
  const ck_writer_arg *a;
  ck_store s;
  uint8_t *buf, *val, *scratch;
  uint64_t cap;
  int notes; /* unexpected failures noted so far (a few) */
} writer;

static void progress(const writer *w) {
  const int sub = w->a->sub, slot = w->a->slot;
  const int64_t now = ck_now_ms();
  const int64_t last = __atomic_load_n(&ck->last_ok_ms[sub][slot], __ATOMIC_SEQ_CST);
  if (last && now - last > ck->max_gap_ms[sub][slot])
    __atomic_store_n(&ck->max_gap_ms[sub][slot], now - last, __ATOMIC_SEQ_CST);
  __atomic_store_n(&ck->last_ok_ms[sub][slot], now, __ATOMIC_SEQ_CST);
  __atomic_fetch_add(&ck->ok_ops[sub][slot], 1, __ATOMIC_SEQ_CST);
}

/* Gets key idx and judges it, trying a transient failure again for up to
 * patience_ms. Returns the verdict of ck_judge_get. */
static int check_key(writer *w, uint32_t idx, int64_t patience_ms) {
  const int sub = w->a->sub, slot = w->a->slot;
  const int64_t end = ck_now_ms() + patience_ms;
  for (int tries = 0;; tries++) {
    uint64_t len = 0;
    const int rc = ck_store_get(&w->s, idx, w->buf, w->cap, &len);
    CK_ADD(gets, 1);
    CK_ADD(ops, 1);
    const int verdict =
        ck_judge_get(w->s.ctx, sub, slot, idx, rc, w->buf, len, ck_store_durable(sub), w->scratch);
    ck_trace("%s %d key %u get: %s, %llu bytes: verdict %d", ck_sub_name[sub], slot, idx,
             kvt_err_name(rc), (unsigned long long)len, verdict);
    if (verdict == 0)
      progress(w);
    if (verdict != 1 && verdict != -2)
      return verdict;
    if (ck_now_ms() > end) {
      CK_ADD(unanswered, 1);
      if (w->notes++ < 3 && !__atomic_load_n(&ck->outage, __ATOMIC_SEQ_CST))
        ck_note("%s slot %d key %u: a get failed with %s (%d tries)", ck_sub_name[sub], slot, idx,
                kvt_err_name(rc), tries + 1);
      return verdict;
    }
    ck_sleep_ms(50);
  }
}

static void mutate(writer *w, uint32_t idx) {
  const int sub = w->a->sub, slot = w->a->slot;
  const uint32_t v = ck_log_begin(sub, slot, idx);
  int rc, del = ck_is_del(sub, slot, idx, v);
  if (del) {
    rc = ck_store_del(&w->s, idx);
    if (rc == KVT_ENOTFOUND)
      rc = 0;
    CK_ADD(dels, 1);
  } else {
    uint64_t len = 0;
    rc = ck_value(w->s.ctx, sub, slot, idx, v, w->val, w->cap, &len);
    if (rc == 0)
      rc = ck_store_put(&w->s, idx, w->val, len);
    CK_ADD(puts, 1);
  }
  CK_ADD(ops, 1);
  ck_trace("%s %d key %u %s v%u: %s", ck_sub_name[sub], slot, idx, del ? "del" : "put", v,
           kvt_err_name(rc));
  /* A remote store may have applied what timed out; a local one never
   * applies a failed operation (tier.h: the old value stays). */
  const int uncertain = rc != 0 && (sub == CK_FABRIC || sub == CK_REDIS);
  ck_log_end(sub, slot, idx, v, rc == 0, uncertain);
  if (rc == 0) {
    progress(w);
    return;
  }
  if (ck_is_transient(rc) || __atomic_load_n(&ck->outage, __ATOMIC_SEQ_CST)) {
    CK_ADD(put_failed_expected, 1);
    return;
  }
  CK_ADD(put_failed_unexpected, 1);
  if (w->notes++ < 3)
    ck_note("%s slot %d key %u: a %s failed with %s", ck_sub_name[sub], slot, idx,
            del ? "del" : "put", kvt_err_name(rc));
}

static void check_all(writer *w, int64_t patience_ms) {
  for (uint32_t i = 0; i < ck->nkeys; i++)
    check_key(w, i, patience_ms);
}

void ck_writer_main(void *arg) {
  writer w = {.a = arg};
  const int sub = w.a->sub, slot = w.a->slot;
  w.cap = CK_VALUE_MAX + 4096;
  w.buf = aligned_alloc(4096, w.cap);
  w.val = aligned_alloc(4096, w.cap);
  w.scratch = malloc(w.cap);
  if (!w.buf || !w.val || !w.scratch)
    _exit(4);
  /* A server being restarted, or a directory a killed writer held, may make
   * the first opens fail for a while. */
  const int64_t open_end = ck_now_ms() + 30000;
  int rc;
  while ((rc = ck_store_open(&w.s, sub, slot)) != 0 && ck_now_ms() < open_end)
    ck_sleep_ms(100);
  if (rc) {
    ck_note("%s writer %d could not open its store: %s", ck_sub_name[sub], slot, kvt_err_name(rc));
    _exit(3);
  }
  CK_ADD(writer_starts, 1);
  __atomic_fetch_add(&ck->opened[sub][slot], 1, __ATOMIC_SEQ_CST);
  check_all(&w, 15000);
  if (!w.a->verify_only) {
    const int64_t end = ck_now_ms() + (int64_t)(w.a->run_s * 1000);
    while (ck_now_ms() < end) {
      const uint32_t idx = (uint32_t)ck_rand_below(ck->nkeys);
      if (ck_rand_below(100) < 55)
        mutate(&w, idx);
      else
        check_key(&w, idx, 10000);
    }
    check_all(&w, 15000);
  }
  ck_store_close(&w.s);
  free(w.buf);
  free(w.val);
  free(w.scratch);
}
