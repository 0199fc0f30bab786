/* serde/payload_read.c - the validating parser and the decoder. Every field
 * of a payload is hostile until checked: lengths and offsets are compared
 * with the buffer before use, the header checksum is verified before any
 * field past the header size is trusted, and each section's checksum before
 * any of its bytes are decoded. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>

#include "serde_internal.h"

typedef struct parsed {
  const uint8_t *b;
  kvt_payload_info info;
  uint64_t raw_bitmap[KVT_MAX_RAW_LAYER / 64];
} parsed;

static int parse_header(kvt_ctx *ctx, const uint8_t *b, size_t len, parsed *p) {
  if (len < 8 || memcmp(b, KVT_MAGIC, 8) != 0) {
    if (len < 8 && memcmp(b, KVT_MAGIC, len) == 0)
      return kvt_fail(ctx, KVT_ETRUNC, "payload of %zu bytes is shorter than its magic", len);
    return kvt_fail(ctx, KVT_EFORMAT, "bytes 0..7 are not the kvtier payload magic");
  }
  if (len < HDR_FIXED)
    return kvt_fail(ctx, KVT_ETRUNC, "payload of %zu bytes is shorter than the %d-byte header",
                    len, HDR_FIXED);
  kvt_payload_info *in = &p->info;
  kvt_header_get(b, in);
  const uint16_t major = in->version_major, minor = in->version_minor;
  if (major < KVT_FORMAT_OLDEST || major > KVT_FORMAT_VERSION)
    return kvt_fail(ctx, KVT_EVERSION,
                    "format version %u.%u at offset 8; this library reads %d.x to %d.x", major,
                    minor, KVT_FORMAT_OLDEST, KVT_FORMAT_VERSION);
  const uint32_t nsec = in->sections, hsize = in->header_size;
  if (nsec == 0 || nsec % 2 || nsec > 2 * KVT_MAX_LAYERS)
    return kvt_fail(ctx, KVT_ECORRUPT, "section count %u at offset %d: must be even, 2..%d",
                    nsec, H_NSEC, 2 * KVT_MAX_LAYERS);
  if (hsize != kvt_header_size(nsec))
    return kvt_fail(ctx, KVT_ECORRUPT, "header size %u at offset %d does not fit %u sections",
                    hsize, H_HDRSIZE, nsec);
  if (hsize > len)
    return kvt_fail(ctx, KVT_ETRUNC, "payload of %zu bytes ends inside its %u-byte header", len,
                    hsize);
  uint64_t want = kvt_header_stored_checksum(b), got = kvt_header_checksum(b, hsize);
  if (want != got)
    return kvt_fail(ctx, KVT_ECHECKSUM,
                    "header checksum at offset %d: stored %016" PRIx64 ", computed %016" PRIx64,
                    H_CHECKSUM, want, got);
  const uint64_t size = in->size;
  if (size > KVT_PAYLOAD_MAX)
    return kvt_fail(ctx, KVT_ETOOBIG, "payload size %" PRIu64 " at offset %d exceeds %" PRIu64,
                    size, H_SIZE, (uint64_t)KVT_PAYLOAD_MAX);
  if (len < size)
    return kvt_fail(ctx, KVT_ETRUNC, "payload is %zu bytes; its header says %" PRIu64, len, size);
  if (len > size)
    return kvt_fail(ctx, KVT_ECORRUPT, "%zu bytes follow the payload's %" PRIu64 " bytes",
                    len - (size_t)size, size);
  p->b = b;
  return 0;
}

static int all_zero(const uint8_t *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (p[i])
      return 0;
  return 1;
}

static int check_fields(kvt_ctx *ctx, const parsed *p) {
  const kvt_payload_info *in = &p->info;
  const uint8_t *b = p->b;
  if (in->flags & ~KVT_FLAG_LOSSLESS)
    return kvt_fail(ctx, KVT_ECORRUPT, "unknown flags %#x at offset %d", in->flags, H_FLAGS);
  if (in->version_minor == KVT_FORMAT_MINOR &&
      (!all_zero(b + H_RSV0, 3) || !all_zero(b + H_RSV1, 16)))
    return kvt_fail(ctx, KVT_ECORRUPT, "reserved header bytes (offsets %d, %d) are not zero",
                    H_RSV0, H_RSV1);
  size_t table_end = HDR_FIXED + (size_t)SEC_ENTRY * in->sections;
  if (!all_zero(b + table_end, in->header_size - table_end))
    return kvt_fail(ctx, KVT_ECORRUPT, "header padding (offsets %zu..%u) is not zero", table_end,
                    in->header_size);
  if (kvt_codec_validate(ctx, &in->spec)) {
    char why[KVT_ERR_DETAIL_MAX] = "invalid"; /* kvt_fail rewrites ctx->err */
    if (ctx)
      snprintf(why, sizeof(why), "%s", ctx->err);
    return kvt_fail(ctx, KVT_ECORRUPT, "codec spec at offset %d: %s", H_KFMT, why);
  }
  if (in->dtype != KVT_DTYPE_BF16 && in->dtype != KVT_DTYPE_F16)
    return kvt_fail(ctx, KVT_ECORRUPT, "dtype %d at offset %d", in->dtype, H_DTYPE);
  if (in->layers != in->sections / 2)
    return kvt_fail(ctx, KVT_ECORRUPT, "layer count %u at offset %d does not match %u sections",
                    in->layers, H_LCOUNT, in->sections);
  if (in->model_layers > KVT_MAX_LAYERS ||
      (uint64_t)in->layer_begin + in->layers > in->model_layers)
    return kvt_fail(ctx, KVT_ECORRUPT, "layers %u+%u of a %u-layer model (offset %d)",
                    in->layer_begin, in->layers, in->model_layers, H_MLAYERS);
  if (!in->tokens || in->tokens > KVT_MAX_TOKENS || !in->heads || in->heads > KVT_MAX_HEADS ||
      !in->head_dim || in->head_dim > KVT_MAX_HEAD_DIM)
    return kvt_fail(ctx, KVT_ECORRUPT, "shape tokens %u heads %u head_dim %u (offset %d)",
                    in->tokens, in->heads, in->head_dim, H_TOKENS);
  int i4 = in->spec.k_fmt == KVT_FMT_I4 || in->spec.v_fmt == KVT_FMT_I4;
  int dim_groups = in->spec.v_fmt == KVT_FMT_I4 ||
                   (in->spec.k_fmt == KVT_FMT_I4 && in->spec.k_axis == KVT_AXIS_DIM);
  if ((i4 && in->head_dim % 2) || (dim_groups && in->head_dim % in->spec.group))
    return kvt_fail(ctx, KVT_ECORRUPT, "i4 group %u does not fit head_dim %u (offset %d)",
                    in->spec.group, in->head_dim, H_GROUP);
  return 0;
}

static void shape_of(const kvt_payload_info *in, const kvt_section_info *s,
                     kvt_section_shape *sh) {
  sh->fmt = s->fmt;
  sh->dtype = in->dtype;
  sh->is_value = s->is_value;
  sh->layer = s->layer;
  sh->tokens = in->tokens;
  sh->heads = in->heads;
  sh->head_dim = in->head_dim;
}

/* A layer is raw when both its sections are n16 though the spec says otherwise. */
static int check_layer_fmts(kvt_ctx *ctx, parsed *p, uint32_t i, const kvt_section_info *k,
                            const kvt_section_info *v) {
  const kvt_codec_spec *sp = &p->info.spec;
  int raw = k->fmt == KVT_FMT_N16 && v->fmt == KVT_FMT_N16 &&
            (sp->k_fmt != KVT_FMT_N16 || sp->v_fmt != KVT_FMT_N16);
  int want_k = raw ? KVT_FMT_N16 : sp->k_fmt, want_v = raw ? KVT_FMT_N16 : sp->v_fmt;
  if (k->fmt != want_k || v->fmt != want_v)
    return kvt_fail(ctx, KVT_ECORRUPT, "sections %u-%u (layer %u): formats %u/%u, spec says %s/%s",
                    i, i + 1, k->layer, k->fmt, v->fmt, kvt_fmt_name(sp->k_fmt),
                    kvt_fmt_name(sp->v_fmt));
  if (raw) {
    if (k->layer >= KVT_MAX_RAW_LAYER)
      return kvt_fail(ctx, KVT_ECORRUPT, "layer %u is raw but raw layers must be below %d",
                      k->layer, KVT_MAX_RAW_LAYER);
    p->raw_bitmap[k->layer / 64] |= 1ull << (k->layer % 64);
  }
  return 0;
}

static int check_entry(kvt_ctx *ctx, const parsed *p, uint32_t i, const kvt_section_info *s,
                       uint64_t expect_off) {
  const kvt_payload_info *in = &p->info;
  const uint8_t *e = p->b + HDR_FIXED + (size_t)SEC_ENTRY * i;
  size_t eo = HDR_FIXED + (size_t)SEC_ENTRY * i;
  if (s->layer != in->layer_begin + i / 2 || s->is_value != (int)(i % 2))
    return kvt_fail(ctx, KVT_ECORRUPT, "section %u (offset %zu) is layer %u kind %d; expected %u %d",
                    i, eo, s->layer, s->is_value, in->layer_begin + i / 2, i % 2);
  if (in->version_minor == KVT_FORMAT_MINOR && (e[S_RSV0] || !all_zero(e + S_RSV1, 8)))
    return kvt_fail(ctx, KVT_ECORRUPT, "section %u (offset %zu): reserved bytes not zero", i, eo);
  if (s->comp > KVT_COMP_ZSTD_SHUFFLE16 || (s->comp && !(in->flags & KVT_FLAG_LOSSLESS)) ||
      (s->comp == KVT_COMP_ZSTD_SHUFFLE16 && s->fmt != KVT_FMT_N16))
    return kvt_fail(ctx, KVT_ECORRUPT, "section %u (offset %zu): compression %d", i, eo, s->comp);
  kvt_section_shape sh;
  shape_of(in, s, &sh);
  uint64_t raw = kvt_section_bytes(&in->spec, &sh);
  if (raw == 0 || s->raw_size != raw)
    return kvt_fail(ctx, KVT_ECORRUPT, "section %u (offset %zu): size %" PRIu64 ", shape needs %" PRIu64,
                    i, eo + S_RAW, s->raw_size, raw);
  if (s->comp == KVT_COMP_NONE ? s->stored_size != raw
                               : (s->stored_size == 0 || s->stored_size >= raw))
    return kvt_fail(ctx, KVT_ECORRUPT, "section %u (offset %zu): stored size %" PRIu64, i,
                    eo + S_STORED, s->stored_size);
  if (s->offset != expect_off || s->offset + s->stored_size > in->size)
    return kvt_fail(ctx, KVT_ECORRUPT,
                    "section %u (offset %zu): at %" PRIu64 "+%" PRIu64 ", expected at %" PRIu64
                    " within %" PRIu64 " bytes",
                    i, eo + S_OFFSET, s->offset, s->stored_size, expect_off, in->size);
  return 0;
}

static int parse(kvt_ctx *ctx, const void *buf, size_t len, parsed *p) {
  kvt_clear_error(ctx);
  if (!buf && len)
    return kvt_fail(ctx, -EINVAL, "NULL payload");
  static const uint8_t empty[1];
  int rc = parse_header(ctx, buf ? buf : empty, len, p);
  if (rc == 0)
    rc = check_fields(ctx, p);
  if (rc)
    return rc;
  memset(p->raw_bitmap, 0, sizeof(p->raw_bitmap));
  uint64_t off = p->info.header_size, lossless = 0;
  for (uint32_t i = 0; i < p->info.sections; i += 2) {
    kvt_section_info s[2];
    for (uint32_t j = 0; j < 2; j++) {
      kvt_section_entry_get(p->b, i + j, &s[j]);
      if ((rc = check_entry(ctx, p, i + j, &s[j], kvt_align_up(off, SEC_ALIGN))) != 0)
        return rc;
      off = s[j].offset + s[j].stored_size;
      lossless |= s[j].comp != KVT_COMP_NONE;
    }
    if ((rc = check_layer_fmts(ctx, p, i, &s[0], &s[1])) != 0)
      return rc;
  }
  if (off != p->info.size)
    return kvt_fail(ctx, KVT_ECORRUPT, "sections end at %" PRIu64 ", payload at %" PRIu64, off,
                    p->info.size);
  if (!lossless && (p->info.flags & KVT_FLAG_LOSSLESS))
    return kvt_fail(ctx, KVT_ECORRUPT, "lossless flag set but no section is compressed");
  memcpy(p->info.spec.raw_layers, p->raw_bitmap, sizeof(p->raw_bitmap));
  return 0;
}

int kvt_payload_parse(kvt_ctx *ctx, const void *buf, size_t len, kvt_payload_info *info) {
  parsed p;
  int rc = parse(ctx, buf, len, &p);
  if (rc == 0 && info)
    *info = p.info;
  return rc;
}

static int verify_section(kvt_ctx *ctx, const parsed *p, uint32_t i, kvt_section_info *s) {
  kvt_section_entry_get(p->b, i, s);
  uint64_t got = kvt_section_checksum(p->info.version_major, p->b + s->offset, s->stored_size);
  if (got != s->checksum)
    return kvt_fail(ctx, KVT_ECHECKSUM,
                    "section %u (layer %u %s) at offset %" PRIu64 ": stored checksum %016" PRIx64
                    ", computed %016" PRIx64,
                    i, s->layer, s->is_value ? "V" : "K", s->offset, s->checksum, got);
  return 0;
}

int kvt_payload_verify(kvt_ctx *ctx, const void *buf, size_t len, kvt_payload_info *info) {
  parsed p;
  int rc = parse(ctx, buf, len, &p);
  if (rc)
    return rc;
  uint64_t end = p.info.header_size;
  for (uint32_t i = 0; i < p.info.sections; i++) {
    kvt_section_info s;
    if ((rc = verify_section(ctx, &p, i, &s)) != 0)
      return rc;
    if (!all_zero(p.b + end, s.offset - end))
      return kvt_fail(ctx, KVT_ECORRUPT, "padding before section %u (offsets %" PRIu64 "..%" PRIu64
                      ") is not zero", i, end, s.offset);
    end = s.offset + s.stored_size;
  }
  if (info)
    *info = p.info;
  return 0;
}

int kvt_payload_section(kvt_ctx *ctx, const void *buf, size_t len, uint32_t i,
                        kvt_section_info *out) {
  parsed p;
  int rc = parse(ctx, buf, len, &p);
  if (rc)
    return rc;
  if (i >= p.info.sections || !out)
    return kvt_fail(ctx, -EINVAL, "section %u of %u", i, p.info.sections);
  kvt_section_entry_get(p.b, i, out);
  return 0;
}

static int check_dst(kvt_ctx *ctx, const kvt_payload_info *in, const kvt_decode_params *dp,
                     const kvt_kv_view *d, uint32_t *first, uint32_t *count) {
  if (dp && dp->expect_key && memcmp(dp->expect_key, &in->key, 16) != 0) {
    char a[33], b[33];
    return kvt_fail(ctx, KVT_EFOREIGN, "payload key %s, expected %s", kvt_key_hex(&in->key, a),
                    kvt_key_hex(dp->expect_key, b));
  }
  if (dp && dp->expect_fingerprint && memcmp(dp->expect_fingerprint, &in->fingerprint, 16) != 0) {
    char a[33], b[33];
    return kvt_fail(ctx, KVT_EFOREIGN, "payload model fingerprint %s, expected %s",
                    kvt_key_hex(&in->fingerprint, a), kvt_key_hex(dp->expect_fingerprint, b));
  }
  *first = dp ? dp->layer_first : 0;
  *count = dp && dp->layer_count ? dp->layer_count
                                 : (*first < in->layers ? in->layers - *first : 0);
  if (*first >= in->layers || *count > in->layers - *first)
    return kvt_fail(ctx, -EINVAL, "layers %u+%u requested from a payload of %u", *first, *count,
                    in->layers);
  if (!d || !d->k || !d->v)
    return kvt_fail(ctx, KVT_ESHAPE, "destination view has no K or V pointer");
  if (d->dtype != in->dtype || d->tokens != in->tokens || d->heads != in->heads ||
      d->head_dim != in->head_dim || d->layers != *count)
    return kvt_fail(ctx, KVT_ESHAPE,
                    "view %s %ux%ux%ux%u, payload %s %ux%ux%ux%u (layers x tokens x heads x dim)",
                    kvt_dtype_name(d->dtype), d->layers, d->tokens, d->heads, d->head_dim,
                    kvt_dtype_name(in->dtype), *count, in->tokens, in->heads, in->head_dim);
  return 0;
}

static int decode(kvt_ctx *ctx, const void *buf, size_t len, const kvt_decode_params *dp,
                  const kvt_kv_view *d);

int kvt_decode(kvt_ctx *ctx, const void *buf, size_t len, const kvt_decode_params *dp,
               const kvt_kv_view *d) {
  if (!ctx)
    return -EINVAL;
  kvt_fpenv env;
  kvt_fpenv_enter(&env);
  int rc = decode(ctx, buf, len, dp, d);
  kvt_fpenv_leave(&env);
  return rc;
}

static int decode(kvt_ctx *ctx, const void *buf, size_t len, const kvt_decode_params *dp,
                  const kvt_kv_view *d) {
  if (dp && dp->struct_size < sizeof(kvt_decode_params))
    return kvt_fail(ctx, -EINVAL, "kvt_decode_params.struct_size too small");
  if (d && d->struct_size < sizeof(kvt_kv_view))
    return kvt_fail(ctx, -EINVAL, "kvt_kv_view.struct_size too small");
  parsed p;
  int rc = parse(ctx, buf, len, &p);
  uint32_t first = 0, count = 0;
  if (rc || (rc = check_dst(ctx, &p.info, dp, d, &first, &count)) != 0)
    return rc;
  for (uint32_t l = 0; l < count; l++)
    for (int kv = 0; kv < 2; kv++) {
      kvt_section_info s;
      if ((rc = verify_section(ctx, &p, 2 * (first + l) + kv, &s)) != 0)
        return rc;
      const uint8_t *src = p.b + s.offset;
      if (s.comp != KVT_COMP_NONE &&
          (rc = kvt_lossless_decompress(ctx, s.comp, src, s.stored_size, s.raw_size, &src)))
        return rc;
      kvt_section_shape sh;
      shape_of(&p.info, &s, &sh);
      const int64_t *st = kv ? d->v_stride : d->k_stride;
      uint16_t *base = (uint16_t *)(kv ? d->v : d->k) + (int64_t)l * st[0];
      kvt_section_decode(ctx, &p.info.spec, &sh, src, base, st[1], st[2]);
    }
  return 0;
}
