/* serde/payload_write.c - kvt_encode: a strided K/V view in, one payload out.
 * Sections are encoded straight into the destination; only the lossless
 * stage stages a section in scratch first. */
#include <errno.h>

#include "serde_internal.h"

static int check_view(kvt_ctx *ctx, const kvt_codec_spec *spec, const kvt_kv_view *v,
                      uint32_t layer_begin, uint32_t model_layers) {
  if (v && v->struct_size < sizeof(kvt_kv_view))
    return kvt_fail(ctx, -EINVAL, "kvt_kv_view.struct_size too small");
  if (!v || !v->k || !v->v)
    return kvt_fail(ctx, KVT_ESHAPE, "view has no K or V pointer");
  if (v->dtype != KVT_DTYPE_BF16 && v->dtype != KVT_DTYPE_F16)
    return kvt_fail(ctx, KVT_ESHAPE, "dtype %d: must be bf16 or fp16", v->dtype);
  if (!v->layers || !v->tokens || !v->heads || !v->head_dim)
    return kvt_fail(ctx, KVT_ESHAPE, "shape %ux%ux%ux%u has a zero dimension", v->layers,
                    v->tokens, v->heads, v->head_dim);
  if (v->tokens > KVT_MAX_TOKENS || v->heads > KVT_MAX_HEADS ||
      v->head_dim > KVT_MAX_HEAD_DIM)
    return kvt_fail(ctx, KVT_ETOOBIG, "tokens %u, heads %u, head_dim %u: limits are %u, %u, %u",
                    v->tokens, v->heads, v->head_dim, KVT_MAX_TOKENS, KVT_MAX_HEADS,
                    KVT_MAX_HEAD_DIM);
  if (model_layers > KVT_MAX_LAYERS || (uint64_t)layer_begin + v->layers > model_layers)
    return kvt_fail(ctx, KVT_ESHAPE, "layers %u..%u do not fit a model of %u layers (max %u)",
                    layer_begin, layer_begin + v->layers, model_layers, KVT_MAX_LAYERS);
  int i4 = spec->k_fmt == KVT_FMT_I4 || spec->v_fmt == KVT_FMT_I4;
  if (i4 && v->head_dim % 2)
    return kvt_fail(ctx, KVT_ESHAPE, "i4 needs an even head_dim, not %u", v->head_dim);
  int dim_groups = spec->v_fmt == KVT_FMT_I4 ||
                   (spec->k_fmt == KVT_FMT_I4 && spec->k_axis == KVT_AXIS_DIM);
  if (dim_groups && v->head_dim % spec->group)
    return kvt_fail(ctx, KVT_ESHAPE, "i4 group %u does not divide head_dim %u", spec->group,
                    v->head_dim);
  return 0;
}

static void section_shape(const kvt_codec_spec *spec, const kvt_kv_view *v, uint32_t layer,
                          int is_value, kvt_section_shape *s) {
  s->fmt = kvt_codec_layer_fmt(spec, layer, is_value);
  s->dtype = v->dtype;
  s->is_value = is_value;
  s->layer = layer;
  s->tokens = v->tokens;
  s->heads = v->heads;
  s->head_dim = v->head_dim;
}

int kvt_encode_bound(kvt_ctx *ctx, const kvt_codec_spec *spec, uint32_t layer_begin,
                     uint32_t layers, uint32_t tokens, uint32_t heads, uint32_t head_dim,
                     uint64_t *out) {
  kvt_clear_error(ctx);
  if (!spec || !out)
    return kvt_fail(ctx, -EINVAL, "kvt_encode_bound: missing spec or output");
  kvt_codec_spec norm = *spec;
  kvt_codec_normalise(&norm);
  spec = &norm;
  int rc = kvt_codec_validate(ctx, spec);
  if (rc)
    return rc;
  kvt_kv_view v;
  static uint16_t dummy;
  kvt_kv_view_dense(&v, &dummy, &dummy, KVT_DTYPE_BF16, layers, tokens, heads, head_dim);
  if ((rc = check_view(ctx, spec, &v, layer_begin, layer_begin + layers)) != 0)
    return rc;
  uint64_t total = kvt_header_size(2 * layers);
  for (uint32_t l = 0; l < layers; l++)
    for (int kv = 0; kv < 2; kv++) {
      kvt_section_shape s;
      section_shape(spec, &v, layer_begin + l, kv, &s);
      total = kvt_align_up(total, SEC_ALIGN) + kvt_section_bytes(spec, &s);
    }
  if (total > KVT_PAYLOAD_MAX)
    return kvt_fail(ctx, KVT_ETOOBIG, "payload of %llu bytes exceeds the %llu limit",
                    (unsigned long long)total, (unsigned long long)KVT_PAYLOAD_MAX);
  *out = total;
  return 0;
}

/* Encodes section i at the next aligned offset and writes its table entry;
 * *comp gets the compression it ended up with. */
static int put_section(kvt_ctx *ctx, const kvt_encode_params *p, const kvt_section_shape *s,
                       const kvt_section_src *src, uint8_t *dst, size_t cap, uint64_t *off,
                       uint32_t i, int *comp) {
  uint64_t raw = kvt_section_bytes(&p->spec, s);
  uint64_t start = kvt_align_up(*off, SEC_ALIGN);
  if (start + raw > cap)
    return kvt_fail(ctx, KVT_ENOBUFS, "payload needs more than the %zu bytes given", cap);
  memset(dst + *off, 0, start - *off); /* padding is zero, and verified so */
  uint8_t *at = dst + start;
  uint64_t stored = raw;
  int rc;
  *comp = KVT_COMP_NONE;
  if (p->zstd_level > 0) {
    uint8_t *tmp;
    if ((rc = kvt_scratch_get(ctx, 0, raw, &tmp)) != 0 ||
        (rc = kvt_section_encode(ctx, &p->spec, s, src, tmp)) != 0)
      return rc;
    size_t clen = 0, want = raw - raw * 3 / 100; /* must save at least 3% */
    rc = kvt_lossless_compress(ctx, p->zstd_level, s->fmt == KVT_FMT_N16, tmp, raw, at,
                               want, &clen);
    if (rc)
      return rc;
    if (clen > 0 && clen < want) {
      *comp = s->fmt == KVT_FMT_N16 ? KVT_COMP_ZSTD_SHUFFLE16 : KVT_COMP_ZSTD;
      stored = clen;
    } else {
      memcpy(at, tmp, raw);
    }
  } else if ((rc = kvt_section_encode(ctx, &p->spec, s, src, at)) != 0) {
    return rc;
  }
  const kvt_section_info e = {s->layer, s->is_value, s->fmt, *comp, start, stored, raw,
                              kvt_section_checksum(KVT_FORMAT_VERSION, at, stored), {0, 0}};
  kvt_section_entry_put(dst, i, &e);
  *off = start + stored;
  return 0;
}

static void put_header(const kvt_encode_params *p, const kvt_kv_view *v, uint8_t *dst,
                       uint32_t model_layers, uint32_t nsec, uint64_t hsize, uint64_t size,
                       uint32_t flags) {
  kvt_payload_info h;
  memset(&h, 0, sizeof(h));
  h.flags = flags;
  h.size = size;
  h.header_size = (uint32_t)hsize;
  h.sections = nsec;
  h.key = p->key;
  h.fingerprint = p->fingerprint;
  h.spec = p->spec;
  h.dtype = v->dtype;
  h.model_layers = model_layers;
  h.layer_begin = p->layer_begin;
  h.layers = v->layers;
  h.tokens = v->tokens;
  h.heads = v->heads;
  h.head_dim = v->head_dim;
  h.token_begin = p->token_begin;
  kvt_header_put(dst, &h);
  kvt_header_seal(dst);
}

static int encode(kvt_ctx *ctx, const kvt_encode_params *p_in, const kvt_kv_view *v,
                  void *dst_, size_t cap, size_t *len);

int kvt_encode(kvt_ctx *ctx, const kvt_encode_params *p, const kvt_kv_view *v, void *dst,
               size_t cap, size_t *len) {
  kvt_fpenv env;
  kvt_fpenv_enter(&env);
  int rc = encode(ctx, p, v, dst, cap, len);
  kvt_fpenv_leave(&env);
  return rc;
}

static int encode(kvt_ctx *ctx, const kvt_encode_params *p_in, const kvt_kv_view *v,
                  void *dst_, size_t cap, size_t *len) {
  if (!ctx)
    return -EINVAL;
  kvt_clear_error(ctx);
  uint8_t *dst = dst_;
  if (!p_in || p_in->struct_size < sizeof(kvt_encode_params) || !dst || !len)
    return kvt_fail(ctx, -EINVAL, "kvt_encode: missing params, destination or length");
  kvt_encode_params params = *p_in, *p = &params;
  kvt_codec_normalise(&params.spec);
  int rc = kvt_codec_validate(ctx, &p->spec);
  if (rc)
    return rc;
  uint32_t model_layers = p->model_layers ? p->model_layers : (v ? v->layers : 0);
  if ((rc = check_view(ctx, &p->spec, v, p->layer_begin, model_layers)) != 0)
    return rc;
  if (p->zstd_level < 0 || p->zstd_level > 19)
    return kvt_fail(ctx, -EINVAL, "zstd level %d: must be 0 (off) to 19", p->zstd_level);
  uint32_t nsec = 2 * v->layers;
  uint64_t hsize = kvt_header_size(nsec);
  if (hsize > cap)
    return kvt_fail(ctx, KVT_ENOBUFS, "payload needs more than the %zu bytes given", cap);
  uint64_t off = hsize;
  uint32_t flags = 0;
  for (uint32_t l = 0; l < v->layers; l++)
    for (int kv = 0; kv < 2; kv++) {
      kvt_section_shape s;
      section_shape(&p->spec, v, p->layer_begin + l, kv, &s);
      kvt_section_src src;
      src.base = (const uint16_t *)(kv ? v->v : v->k) + (int64_t)l * (kv ? v->v_stride : v->k_stride)[0];
      src.stride_t = (kv ? v->v_stride : v->k_stride)[1];
      src.stride_h = (kv ? v->v_stride : v->k_stride)[2];
      int comp = KVT_COMP_NONE;
      if ((rc = put_section(ctx, p, &s, &src, dst, cap, &off, 2 * l + kv, &comp)) != 0)
        return rc;
      if (comp != KVT_COMP_NONE)
        flags |= KVT_FLAG_LOSSLESS;
    }
  /* The payload ends where the last section ends: no trailing padding. */
  const uint64_t size = off;
  if (size > KVT_PAYLOAD_MAX)
    return kvt_fail(ctx, KVT_ETOOBIG, "payload of %llu bytes exceeds the %llu limit",
                    (unsigned long long)size, (unsigned long long)KVT_PAYLOAD_MAX);
  put_header(p, v, dst, model_layers, nsec, hsize, size, flags);
  *len = (size_t)size;
  return 0;
}
