/* codec/spec.c - codec spec text: presets, the general k=,v= form, options,
 * validation and the canonical form that fingerprints hash. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "codec_internal.h"
#include "kvt_internal.h"

#define DEFAULT_GROUP 32
#define DEFAULT_BLOCK 16
/* i4 keys group along tokens (KIVI) by default: on keys with outlier
 * channels it measured more accurate than groups along head dim (README,
 * "Choosing the int4 key grouping"; `kvtier demo` prints both). */
#define DEFAULT_K_AXIS KVT_AXIS_TOKEN

typedef struct preset {
  const char *name;
  uint8_t k, v;
} preset;

static const preset presets[] = {
    {"raw", KVT_FMT_N16, KVT_FMT_N16},   {"k16v8", KVT_FMT_N16, KVT_FMT_E4M3},
    {"fp8", KVT_FMT_E4M3, KVT_FMT_E4M3}, {"int8", KVT_FMT_I8, KVT_FMT_I8},
    {"k16v4", KVT_FMT_N16, KVT_FMT_I4},  {"k8v4", KVT_FMT_I8, KVT_FMT_I4},
    {"int4", KVT_FMT_I4, KVT_FMT_I4},
};

static const char *const fmt_names[] = {"n16", "e4m3", "i8", "i4"};
static const char *const scale_names[] = {"token", "block", "layer"};
static const char *const axis_names[] = {"dim", "token"};

const char *kvt_fmt_name(int fmt) {
  return fmt >= 0 && fmt < 4 ? fmt_names[fmt] : "?";
}

const char *kvt_dtype_name(int dtype) {
  return dtype == KVT_DTYPE_BF16 ? "bf16" : dtype == KVT_DTYPE_F16 ? "fp16" : "?";
}

static int uses(const kvt_codec_spec *s, int fmt) { return s->k_fmt == fmt || s->v_fmt == fmt; }

/* Resets fields that the formats in use ignore, so equal encodings have equal
 * specs (and equal canonical text). */
void kvt_codec_normalise(kvt_codec_spec *s) {
  if (!uses(s, KVT_FMT_I4))
    s->group = DEFAULT_GROUP;
  if (s->k_fmt != KVT_FMT_I4)
    s->k_axis = DEFAULT_K_AXIS;
  if (!uses(s, KVT_FMT_E4M3) && !uses(s, KVT_FMT_I8))
    s->scale = KVT_SCALE_TOKEN;
  if (s->scale != KVT_SCALE_BLOCK)
    s->block = DEFAULT_BLOCK;
}

int kvt_codec_validate(kvt_ctx *ctx, const kvt_codec_spec *s) {
  if (!s)
    return kvt_fail(ctx, KVT_ESPEC, "no spec");
  if (s->k_fmt > KVT_FMT_I4 || s->v_fmt > KVT_FMT_I4)
    return kvt_fail(ctx, KVT_ESPEC, "unknown format (k=%u, v=%u)", s->k_fmt, s->v_fmt);
  if (s->scale > KVT_SCALE_LAYER)
    return kvt_fail(ctx, KVT_ESPEC, "unknown scale granularity %u", s->scale);
  if (s->k_axis > KVT_AXIS_TOKEN)
    return kvt_fail(ctx, KVT_ESPEC, "unknown key group axis %u", s->k_axis);
  if (s->group < 2 || s->group % 2 || s->group > KVT_MAX_HEAD_DIM_INTERNAL)
    return kvt_fail(ctx, KVT_ESPEC, "group %u: must be even, 2..%u", s->group,
                    KVT_MAX_HEAD_DIM_INTERNAL);
  if (s->block < 1)
    return kvt_fail(ctx, KVT_ESPEC, "block must be at least 1 token");
  if (s->reserved[0] || s->reserved[1])
    return kvt_fail(ctx, KVT_ESPEC, "reserved fields must be zero");
  return 0;
}

int kvt_codec_layer_fmt(const kvt_codec_spec *s, uint32_t layer, int is_value) {
  if (layer < KVT_MAX_RAW_LAYER && (s->raw_layers[layer / 64] >> (layer % 64)) & 1)
    return KVT_FMT_N16;
  return is_value ? s->v_fmt : s->k_fmt;
}

static int lookup(const char *const *names, int n, const char *w) {
  for (int i = 0; i < n; i++)
    if (strcmp(names[i], w) == 0)
      return i;
  return -1;
}

static int parse_uint(const char *w, unsigned long max, unsigned long *out) {
  if (!isdigit((unsigned char)*w))
    return -1;
  errno = 0;
  char *end;
  unsigned long v = strtoul(w, &end, 10);
  if (errno || *end || v > max)
    return -1;
  *out = v;
  return 0;
}

/* "A" or "A-B" into the raw-layer bitmap. */
static int parse_layers(kvt_codec_spec *s, const char *w) {
  char a[16], *dash = strchr(w, '-');
  unsigned long lo, hi;
  if (dash) {
    size_t n = (size_t)(dash - w);
    if (n == 0 || n >= sizeof(a))
      return -1;
    memcpy(a, w, n);
    a[n] = '\0';
    if (parse_uint(a, KVT_MAX_RAW_LAYER - 1, &lo) ||
        parse_uint(dash + 1, KVT_MAX_RAW_LAYER - 1, &hi) || hi < lo)
      return -1;
  } else {
    if (parse_uint(w, KVT_MAX_RAW_LAYER - 1, &lo))
      return -1;
    hi = lo;
  }
  for (unsigned long l = lo; l <= hi; l++)
    s->raw_layers[l / 64] |= 1ull << (l % 64);
  return 0;
}

static int parse_option(kvt_ctx *ctx, kvt_codec_spec *s, char *w, int *in_raw) {
  char *eq = strchr(w, '=');
  if (!eq) {
    if (*in_raw && parse_layers(s, w) == 0)
      return 0;
    return kvt_fail(ctx, KVT_ESPEC, "'%s': expected a preset or key=value", w);
  }
  *eq = '\0';
  const char *key = w, *val = eq + 1;
  unsigned long n;
  int i;
  *in_raw = 0;
  if (strcmp(key, "k") == 0 || strcmp(key, "v") == 0) {
    if ((i = lookup(fmt_names, 4, val)) < 0)
      return kvt_fail(ctx, KVT_ESPEC, "%s=%s: format must be n16, e4m3, i8 or i4", key, val);
    *(key[0] == 'k' ? &s->k_fmt : &s->v_fmt) = (uint8_t)i;
  } else if (strcmp(key, "group") == 0) {
    if (parse_uint(val, KVT_MAX_HEAD_DIM_INTERNAL, &n) || n < 2 || n % 2)
      return kvt_fail(ctx, KVT_ESPEC, "group=%s: must be an even number, 2..%d", val,
                      KVT_MAX_HEAD_DIM_INTERNAL);
    s->group = (uint16_t)n;
  } else if (strcmp(key, "scale") == 0) {
    if ((i = lookup(scale_names, 3, val)) < 0)
      return kvt_fail(ctx, KVT_ESPEC, "scale=%s: must be token, block or layer", val);
    s->scale = (uint8_t)i;
  } else if (strcmp(key, "block") == 0) {
    if (parse_uint(val, 65535, &n) || n < 1)
      return kvt_fail(ctx, KVT_ESPEC, "block=%s: must be 1..65535 tokens", val);
    s->block = (uint16_t)n;
  } else if (strcmp(key, "kgroup") == 0) {
    if ((i = lookup(axis_names, 2, val)) < 0)
      return kvt_fail(ctx, KVT_ESPEC, "kgroup=%s: must be dim or token", val);
    s->k_axis = (uint8_t)i;
  } else if (strcmp(key, "raw") == 0) {
    if (parse_layers(s, val))
      return kvt_fail(ctx, KVT_ESPEC, "raw=%s: expected layer indices or ranges below %d",
                      val, KVT_MAX_RAW_LAYER);
    *in_raw = 1;
  } else {
    return kvt_fail(ctx, KVT_ESPEC, "unknown option '%s'", key);
  }
  return 0;
}

int kvt_codec_parse(kvt_ctx *ctx, const char *text, kvt_codec_spec *out) {
  if (!text || !out)
    return kvt_fail(ctx, KVT_ESPEC, "no spec text");
  char buf[KVT_CODEC_SPEC_TEXT_MAX];
  size_t len = strlen(text);
  if (len == 0 || len >= sizeof(buf))
    return kvt_fail(ctx, KVT_ESPEC, "spec text is empty or too long");
  memcpy(buf, text, len + 1);

  kvt_codec_spec s;
  memset(&s, 0, sizeof(s));
  s.k_fmt = 0xFF;
  s.v_fmt = 0xFF;
  s.group = DEFAULT_GROUP;
  s.block = DEFAULT_BLOCK;
  s.scale = KVT_SCALE_TOKEN;
  s.k_axis = DEFAULT_K_AXIS;
  int in_raw = 0, first = 1;
  for (char *save = NULL, *w = strtok_r(buf, ",", &save); w;
       w = strtok_r(NULL, ",", &save), first = 0) {
    if (first && !strchr(w, '=')) {
      size_t i;
      for (i = 0; i < sizeof(presets) / sizeof(presets[0]); i++)
        if (strcmp(presets[i].name, w) == 0)
          break;
      if (i == sizeof(presets) / sizeof(presets[0]))
        return kvt_fail(ctx, KVT_ESPEC,
                        "unknown preset '%s' (raw, k16v8, fp8, int8, k16v4, k8v4, int4)", w);
      s.k_fmt = presets[i].k;
      s.v_fmt = presets[i].v;
      continue;
    }
    int rc = parse_option(ctx, &s, w, &in_raw);
    if (rc)
      return rc;
  }
  if (s.k_fmt == 0xFF || s.v_fmt == 0xFF)
    return kvt_fail(ctx, KVT_ESPEC, "'%s': name a preset, or both k= and v=", text);
  int rc = kvt_codec_validate(ctx, &s);
  if (rc)
    return rc;
  kvt_codec_normalise(&s);
  *out = s;
  return 0;
}

typedef struct sbuf {
  char *p;
  size_t cap, len;
  int overflow;
} sbuf;

static void put(sbuf *b, const char *fmt, ...) KVT_PRINTF(2, 3);
static void put(sbuf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
  va_end(ap);
  if (n < 0 || (size_t)n >= b->cap - b->len)
    b->overflow = 1;
  else
    b->len += (size_t)n;
}

static void put_raw_layers(sbuf *b, const kvt_codec_spec *s) {
  const char *sep = ",raw=";
  for (uint32_t l = 0; l < KVT_MAX_RAW_LAYER && !b->overflow;) {
    if (!((s->raw_layers[l / 64] >> (l % 64)) & 1)) {
      l++;
      continue;
    }
    uint32_t e = l;
    while (e + 1 < KVT_MAX_RAW_LAYER && ((s->raw_layers[(e + 1) / 64] >> ((e + 1) % 64)) & 1))
      e++;
    if (e == l)
      put(b, "%s%u", sep, l);
    else
      put(b, "%s%u-%u", sep, l, e);
    sep = ",";
    l = e + 1;
  }
}

int kvt_codec_format(const kvt_codec_spec *spec, char *buf, size_t cap) {
  if (!buf || cap == 0 || !spec)
    return KVT_ESPEC;
  kvt_codec_spec s = *spec;
  kvt_codec_normalise(&s);
  if (kvt_codec_validate(NULL, &s))
    return KVT_ESPEC;
  sbuf b = {buf, cap, 0, 0};
  buf[0] = '\0';
  size_t i;
  for (i = 0; i < sizeof(presets) / sizeof(presets[0]); i++)
    if (presets[i].k == s.k_fmt && presets[i].v == s.v_fmt)
      break;
  if (i < sizeof(presets) / sizeof(presets[0]))
    put(&b, "%s", presets[i].name);
  else /* a pair no preset names */
    put(&b, "k=%s,v=%s", fmt_names[s.k_fmt], fmt_names[s.v_fmt]);
  if (uses(&s, KVT_FMT_I4) && s.group != DEFAULT_GROUP)
    put(&b, ",group=%u", s.group);
  if (s.k_fmt == KVT_FMT_I4 && s.k_axis != DEFAULT_K_AXIS)
    put(&b, ",kgroup=%s", axis_names[s.k_axis]);
  if (s.scale != KVT_SCALE_TOKEN)
    put(&b, ",scale=%s", scale_names[s.scale]);
  if (s.scale == KVT_SCALE_BLOCK)
    put(&b, ",block=%u", s.block);
  put_raw_layers(&b, &s);
  return b.overflow ? KVT_ENOBUFS : 0;
}

void kvt_kv_view_dense(kvt_kv_view *v, void *k, void *val, int dtype, uint32_t layers,
                       uint32_t tokens, uint32_t heads, uint32_t head_dim) {
  memset(v, 0, sizeof(*v));
  v->struct_size = sizeof(*v);
  v->k = k;
  v->v = val;
  v->layers = layers;
  v->tokens = tokens;
  v->heads = heads;
  v->head_dim = head_dim;
  v->dtype = dtype;
  int64_t sh = head_dim, st = (int64_t)heads * head_dim, sl = st * tokens;
  v->k_stride[0] = v->v_stride[0] = sl;
  v->k_stride[1] = v->v_stride[1] = st;
  v->k_stride[2] = v->v_stride[2] = sh;
}
