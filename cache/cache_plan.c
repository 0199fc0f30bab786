/* cache/cache_plan.c - kvt_cache_plan_restore(): where a cached prefix lies
 * and what restoring it costs against recomputing it, with the bandwidth
 * model's own functions (kvtier/model.h: kvt_model_link_find, kvt_model_restore_seconds,
 * kvt_model_prefill_seconds), so the library and `kvtier project` never disagree. */
#include <errno.h>
#include <stdlib.h>

#include "cache_internal.h"

#define PLAN_BATCH 64

/* The default link of a tier, by what it is. */
static const char *default_link(const kvt_tier *tier) {
  const uint32_t tr = kvt_tier_traits(tier);
  if (tr & KVT_TIER_DEVICE)
    return "hbm3-h100"; /* already on the GPU: the load kernel reads HBM */
  if (tr & KVT_TIER_HOST_MEMORY)
    return "pcie5-x16";
  if ((tr & KVT_TIER_PERSISTENT) && !(tr & KVT_TIER_REMOTE))
    return "nvme-gen4";
  return "rdma-200g";
}

/* One entry of config.links: a preset name or GB/s. */
static int parse_link(kvt_cache *c, int t, const char *text, size_t len) {
  char buf[64];
  if (len >= sizeof(buf))
    return kvt_fail(c->ctx, -EINVAL, "cache: link '%.*s' of tier %d: too long", (int)len, text, t);
  memcpy(buf, text, len);
  buf[len] = 0;
  const char *name = len ? buf : default_link(c->t[t].tier);
  const kvt_model_link *l = kvt_model_link_find(name);
  if (l) {
    c->t[t].link_Bps = l->GBps * 1e9;
    return 0;
  }
  char *end = NULL;
  const double gbps = strtod(name, &end);
  if (end == name || *end || !(gbps > 0) || gbps > 1e6)
    return kvt_fail(c->ctx, -EINVAL,
                    "cache: link '%s' of tier %d: not a link preset (kvtier project --help "
                    "lists them) nor GB/s",
                    name, t);
  c->t[t].link_Bps = gbps * 1e9;
  return 0;
}

int cache_links_set(kvt_cache *c, const char *links) {
  const char *p = links ? links : "";
  for (int t = 0; t < c->ntiers; t++) {
    const char *end = strchr(p, ';');
    const size_t len = end ? (size_t)(end - p) : strlen(p);
    int r = parse_link(c, t, p, len);
    if (r)
      return r;
    p = end ? end + 1 : p + len;
  }
  if (*p)
    return kvt_fail(c->ctx, -EINVAL, "cache: links \"%s\": more entries than the %d tiers",
                    links, c->ntiers);
  return 0;
}

/* Adds the leading held chunks of keys[0..m) to *out (mu held); returns how
 * many were held. */
static size_t tally(kvt_cache *c, const kvt_key *keys, size_t m, kvt_cache_plan *out) {
  size_t i = 0;
  for (; i < m; i++) {
    const centry *e = cache_find(c, &keys[i]);
    if (!e || e->state != E_LIVE || !e->mask)
      break;
    out->tier_bytes[__builtin_ctz(e->mask)] += e->len;
  }
  return i;
}

int kvt_cache_plan_restore(kvt_cache *c, const uint32_t *tokens, size_t n,
                           const kvt_model_arch *model, double tflops, double mfu,
                           kvt_cache_plan *out) {
  if (!c || (!tokens && n) || !out || out->struct_size < sizeof(size_t) || !c->has_fp)
    return -EINVAL;
  /* Filled in full here and copied out up to the caller's struct_size, so a
   * caller built against an older, shorter struct gets what it knows of. */
  const size_t want = out->struct_size < sizeof(*out) ? out->struct_size : sizeof(*out);
  kvt_cache_plan full;
  kvt_cache_plan *const user = out;
  out = &full;
  memset(out, 0, sizeof(*out));
  out->struct_size = want;
  const size_t chunks = n / c->chunk_tokens;
  size_t done = 0;
  kvt_key keys[PLAN_BATCH], last;
  while (done < chunks) {
    const size_t m = chunks - done < PLAN_BATCH ? chunks - done : PLAN_BATCH;
    for (size_t i = 0; i < m; i++) {
      const kvt_key *prev = i ? &keys[i - 1] : (done ? &last : NULL);
      int r = kvt_chunk_key(&c->fp, prev, tokens + (done + i) * c->chunk_tokens,
                            c->chunk_tokens, &keys[i]);
      if (r)
        return r;
    }
    last = keys[m - 1];
    pthread_mutex_lock(&c->mu);
    const size_t hit = tally(c, keys, m, out);
    pthread_mutex_unlock(&c->mu);
    done += hit;
    if (hit < m)
      break;
  }
  out->cached_tokens = done * c->chunk_tokens;
  for (int t = 0; t < c->ntiers; t++) {
    out->link_GBps[t] = c->t[t].link_Bps / 1e9;
    if (out->tier_bytes[t])
      out->restore_s +=
          kvt_model_restore_seconds((double)out->tier_bytes[t], c->t[t].link_Bps, 1.0);
  }
  if (model && out->cached_tokens) {
    out->recompute_s = kvt_model_prefill_seconds(model, (double)out->cached_tokens, tflops, mfu);
    out->restore_pays = out->restore_s < out->recompute_s;
  }
  memcpy(user, out, want);
  return 0;
}
