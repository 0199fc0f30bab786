/* model/model.c - the bandwidth model's formulas (kvtier/model.h): bytes per
 * token asked of the codec, decode traffic and shortfall, longest context a
 * link feeds, Amdahl bound, prefill FLOPs and placement advice. (The curve
 * fits of `kvtier project fit` are the CLI's own: bench/curve_fit.c.) */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kvt_internal.h"
#include "kvtier/model.h"
#include "kvtier/payload.h"

static int arch_has_window(const kvt_model_arch *m, uint32_t l) {
  return m->window && ((m->window_layers[l / 64] >> (l % 64)) & 1);
}

static uint32_t v_dim_of(const kvt_model_arch *m) { return m->v_dim ? m->v_dim : m->k_dim; }

int kvt_model_validate(kvt_ctx *ctx, const kvt_model_arch *m) {
  if (!m || m->struct_size < sizeof(kvt_model_arch))
    return kvt_fail(ctx, KVT_ESHAPE, "no model, or struct_size too small");
  if (!m->layers || m->layers > KVT_ARCH_MAX_LAYERS)
    return kvt_fail(ctx, KVT_ESHAPE, "layers %u: must be 1..%u", m->layers,
                    KVT_ARCH_MAX_LAYERS);
  if (!m->kv_heads || m->kv_heads > KVT_MAX_HEADS)
    return kvt_fail(ctx, KVT_ESHAPE, "KV heads %u: must be 1..%u", m->kv_heads, KVT_MAX_HEADS);
  if (!m->k_dim || m->k_dim > KVT_MAX_HEAD_DIM || v_dim_of(m) > KVT_MAX_HEAD_DIM)
    return kvt_fail(ctx, KVT_ESHAPE, "head dims %u/%u: must be 1..%u", m->k_dim, m->v_dim,
                    KVT_MAX_HEAD_DIM);
  for (uint32_t w = m->layers; w < KVT_ARCH_MAX_LAYERS; w++)
    if ((m->window_layers[w / 64] >> (w % 64)) & 1)
      return kvt_fail(ctx, KVT_ESHAPE, "windowed layer %u beyond the model's %u layers", w,
                      m->layers);
  if (!(m->params >= 0) || !(m->active_params >= 0) || !isfinite(m->params) ||
      !isfinite(m->active_params))
    return kvt_fail(ctx, KVT_ESHAPE, "parameter counts must be finite and >= 0");
  return 0;
}

double kvt_model_weight_bytes(const kvt_model_arch *m) {
  const double active = m->active_params > 0 ? m->active_params : m->params;
  return active * (m->weight_bits ? m->weight_bits : 16) / 8.0;
}

static uint64_t gcd64(uint64_t a, uint64_t b) {
  while (b) {
    const uint64_t t = a % b;
    a = b;
    b = t;
  }
  return a;
}

static uint64_t lcm64(uint64_t a, uint64_t b) { return a / gcd64(a, b) * b; }

/* Tokens per measured chunk: section sizes are linear in tokens (no partial
 * group, block or 16-byte scale alignment, sections end on 64 bytes) when
 * the chunk is a multiple of 256, 16 x group (i4) and 16 x block. */
static uint32_t chunk_for(const kvt_codec_spec *s) {
  const int i4 = s->k_fmt == KVT_FMT_I4 || s->v_fmt == KVT_FMT_I4;
  const int scaled = s->k_fmt == KVT_FMT_E4M3 || s->v_fmt == KVT_FMT_E4M3 ||
                     s->k_fmt == KVT_FMT_I8 || s->v_fmt == KVT_FMT_I8;
  uint64_t c = 256;
  if (i4)
    c = lcm64(c, 16ull * s->group);
  if (scaled && s->scale == KVT_SCALE_BLOCK)
    c = lcm64(c, 16ull * s->block);
  const uint64_t cap = 1u << 18;
  return (uint32_t)(c > cap ? cap : c);
}

/* Bytes that tokens C..2C-1 add to a one-layer, one-head payload: the K and
 * V sections of C tokens, header excluded. */
static int marginal(kvt_ctx *ctx, const kvt_codec_spec *s, uint32_t layer, uint32_t dim,
                    uint32_t c, double *out) {
  uint64_t a, b;
  int rc = kvt_encode_bound(ctx, s, layer, 1, c, 1, dim, &a);
  if (rc == 0)
    rc = kvt_encode_bound(ctx, s, layer, 1, 2 * c, 1, dim, &b);
  if (rc)
    return rc;
  *out = (double)(b - a);
  return 0;
}

/* Bytes of C tokens of one head of layer l: K at k_dim, V at v_dim. With
 * equal dims the codec is asked directly; otherwise each part is measured
 * against a 16-bit partner of the same dim, whose half is subtracted. */
static int layer_bytes(kvt_ctx *ctx, const kvt_model_arch *m, const kvt_codec_spec *spec,
                       uint32_t l, uint32_t c, double *out) {
  const uint32_t dk = m->k_dim, dv = v_dim_of(m);
  if (dk == dv)
    return marginal(ctx, spec, l, dk, c, out);
  kvt_codec_spec ks = *spec, vs = *spec, raw = *spec;
  ks.v_fmt = KVT_FMT_N16;
  vs.k_fmt = KVT_FMT_N16;
  raw.k_fmt = raw.v_fmt = KVT_FMT_N16;
  double k, v, rk, rv;
  int rc;
  if ((rc = marginal(ctx, &ks, l, dk, c, &k)) || (rc = marginal(ctx, &raw, l, dk, c, &rk)) ||
      (rc = marginal(ctx, &vs, l, dv, c, &v)) || (rc = marginal(ctx, &raw, l, dv, c, &rv)))
    return rc;
  *out = (k - rk / 2) + (v - rv / 2);
  return 0;
}

int kvt_model_kv_rate_get(kvt_ctx *ctx, const kvt_model_arch *m, const kvt_codec_spec *spec,
                          kvt_model_kv_rate *out) {
  if (!spec || !out || out->struct_size < sizeof(kvt_model_kv_rate))
    return kvt_fail(ctx, -EINVAL, "kvt_model_kv_rate_get: missing spec, or output struct_size");
  int rc = kvt_model_validate(ctx, m);
  if (rc || (rc = kvt_codec_validate(ctx, spec)) != 0)
    return rc;
  const uint32_t c = chunk_for(spec);
  double full = 0, win = 0;
  for (uint32_t l = 0; l < m->layers; l++) {
    double b;
    if ((rc = layer_bytes(ctx, m, spec, l, c, &b)) != 0) {
      char why[256]; /* the codec's detail, before it is overwritten */
      const char *d = ctx ? kvt_ctx_last_error(ctx) : NULL;
      snprintf(why, sizeof(why), "%s", d && *d ? d : kvt_strerror(rc));
      return kvt_fail(ctx, rc,
                      "the codec cannot encode layer %u of %s (%u KV heads, dims %u/%u): %s", l,
                      m->name[0] ? m->name : "the model", m->kv_heads, m->k_dim, v_dim_of(m),
                      why);
    }
    b = b * m->kv_heads / c;
    if (arch_has_window(m, l))
      win += b;
    else
      full += b;
  }
  out->full_bytes = full;
  out->window_bytes = win;
  out->window = m->window;
  out->chunk_tokens = c;
  out->elements = (double)m->layers * m->kv_heads * (m->k_dim + v_dim_of(m));
  return 0;
}

double kvt_model_seq_bytes(const kvt_model_kv_rate *r, double tokens) {
  const double w = r->window && tokens > r->window ? r->window : tokens;
  return r->full_bytes * tokens + r->window_bytes * w;
}

double kvt_model_bytes_per_element(const kvt_model_kv_rate *r) {
  return r->elements > 0 ? (r->full_bytes + r->window_bytes) / r->elements : NAN;
}

static int config_ok(const kvt_model_projection_config *c) {
  return c && c->struct_size >= sizeof(kvt_model_projection_config) && isfinite(c->batch) &&
         c->batch > 0 && isfinite(c->step_ms) && c->step_ms > 0 && isfinite(c->spec_k) &&
         c->spec_k >= 0;
}

static double spec_k_of(const kvt_model_projection_config *c) {
  return c->spec_k > 1 ? c->spec_k : 1;
}

int kvt_model_project(kvt_ctx *ctx, const kvt_model_kv_rate *r,
                      const kvt_model_projection_config *c, kvt_model_projection *out) {
  if (!r || !out || !config_ok(c) || !isfinite(c->context) || c->context <= 0)
    return kvt_fail(ctx, -EINVAL, "kvt_model_project: batch, context and step must be > 0");
  memset(out, 0, sizeof(*out));
  out->seq_bytes = kvt_model_seq_bytes(r, c->context);
  out->bytes_per_token = out->seq_bytes / c->context;
  out->step_bytes = c->batch * out->seq_bytes;
  out->required_Bps = out->step_bytes / (c->step_ms * 1e-3 * spec_k_of(c));
  return 0;
}

double kvt_model_shortfall(double required_Bps, double link_Bps) { return required_Bps / link_Bps; }

int kvt_model_max_context(kvt_ctx *ctx, const kvt_model_kv_rate *r,
                          const kvt_model_projection_config *c, double link_Bps, double *tokens) {
  if (!r || !tokens || !config_ok(c) || !(link_Bps >= 0) || !isfinite(link_Bps))
    return kvt_fail(ctx, -EINVAL, "kvt_model_max_context: bad config or link bandwidth");
  /* Bytes one sequence may hold so that the batch reads them within tau. */
  const double budget = link_Bps * c->step_ms * 1e-3 * spec_k_of(c) / c->batch;
  const double w = r->window;
  const double at_w = (r->full_bytes + r->window_bytes) * w; /* bytes at T = window */
  double t;
  if (r->full_bytes == 0 && w > 0 && budget >= at_w)
    t = INFINITY; /* every layer windowed, and the windows fit */
  else if (w == 0 || r->window_bytes == 0)
    t = r->full_bytes + r->window_bytes > 0 ? budget / (r->full_bytes + r->window_bytes)
                                            : INFINITY;
  else if (budget <= at_w)
    t = budget / (r->full_bytes + r->window_bytes);
  else if (r->full_bytes > 0)
    t = (budget - r->window_bytes * w) / r->full_bytes;
  else
    t = INFINITY;
  *tokens = isinf(t) ? t : floor(t * (1 + 1e-12)); /* 1e-12: exact budgets land on the token */
  return 0;
}

double kvt_model_amdahl_bound(double f, double r) {
  if (!(f >= 0 && f <= 1 && r >= 0 && r <= 1))
    return NAN;
  return 1.0 / (1.0 - f * (1.0 - r));
}

/* Causal (query, key) pairs of T tokens when each query sees at most w keys
 * (w = 0: all before it). */
static double causal_pairs(double t, double w) {
  if (w <= 0 || t <= w)
    return t * (t + 1) / 2;
  return w * (w + 1) / 2 + (t - w) * w;
}

double kvt_model_prefill_flops(const kvt_model_arch *m, double tokens) {
  const double active = m->active_params > 0 ? m->active_params : m->params;
  const double qh = m->q_heads ? m->q_heads : m->kv_heads;
  const double dqk = m->qk_dim ? m->qk_dim : m->k_dim;
  const double dpv = m->pv_dim ? m->pv_dim : v_dim_of(m);
  double attn = 0;
  for (uint32_t l = 0; l < m->layers && l < KVT_ARCH_MAX_LAYERS; l++)
    attn += causal_pairs(tokens, arch_has_window(m, l) ? m->window : 0);
  return 2 * active * tokens + 2 * attn * qh * (dqk + dpv);
}

int kvt_model_advise(kvt_ctx *ctx, const kvt_model_arch *m, const kvt_model_kv_rate *r,
                     const kvt_model_advice_config *c, kvt_model_advice *out) {
  if (!m || !r || !out || !c || c->struct_size < sizeof(kvt_model_advice_config) ||
      !(c->hbm_free_bytes >= 0) || !(c->context > 0) || !(c->batch > 0) || !isfinite(c->context) ||
      !(c->tflops >= 0) || !(c->mfu >= 0 && c->mfu <= 1))
    return kvt_fail(ctx, -EINVAL,
                    "kvt_model_advise: HBM >= 0, batch and context > 0, mfu in [0, 1]");
  const double tflops = c->tflops > 0 ? c->tflops : 989.0, mfu = c->mfu > 0 ? c->mfu : 0.5;
  memset(out, 0, sizeof(*out));
  out->seq_bytes = kvt_model_seq_bytes(r, c->context);
  out->sequences_fit = out->seq_bytes > 0 ? floor(c->hbm_free_bytes / out->seq_bytes) : INFINITY;
  out->batch_fits = out->sequences_fit >= c->batch;
  out->prefill_flops = kvt_model_prefill_flops(m, c->context);
  out->prefill_s = kvt_model_prefill_seconds(m, c->context, tflops, mfu);
  return 0;
}

double kvt_model_prefill_seconds(const kvt_model_arch *m, double tokens, double tflops,
                                 double mfu) {
  const double t = tflops > 0 ? tflops : 989.0, f = mfu > 0 ? mfu : 0.5;
  return kvt_model_prefill_flops(m, tokens) / (t * 1e12 * f);
}

double kvt_model_restore_seconds(double bytes, double link_Bps, double efficiency) {
  const double e = efficiency > 0 ? efficiency : 1;
  return link_Bps > 0 ? bytes / (link_Bps * e) : INFINITY;
}
