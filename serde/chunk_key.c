/* serde/chunk_key.c - model fingerprints and prefix-chained chunk keys. The
 * bytes hashed are fixed by serde/FORMAT.md section 6; changing them changes
 * every key, so they change only with the format version. */
#include <errno.h>
#include <stdio.h>

#include "serde_internal.h"

static const char FP_DOMAIN[16] = "kvtier-fprint-1";
static const char CK_DOMAIN[16] = "kvtier-chunk-1";
#define CK_ONESHOT_TOKENS 1024 /* chunks up to this many tokens hash from a stack copy */

int kvt_fingerprint(const kvt_model_desc *m, const kvt_codec_spec *spec, kvt_key *out) {
  if (!m || m->struct_size < sizeof(kvt_model_desc) || !m->model_id || !out)
    return -EINVAL;
  if ((m->dtype != KVT_DTYPE_BF16 && m->dtype != KVT_DTYPE_F16) || !m->layers ||
      !m->kv_heads || !m->head_dim || !m->tp_size || m->tp_rank >= m->tp_size)
    return -EINVAL;
  char codec[KVT_CODEC_SPEC_TEXT_MAX];
  if (kvt_codec_format(spec, codec, sizeof(codec)) != 0)
    return KVT_ESPEC;
  size_t id_len = strlen(m->model_id), codec_len = strlen(codec);
  uint8_t fields[4 * 8];
  kvt_st32(fields + 0, (uint32_t)id_len);
  kvt_st32(fields + 4, (uint32_t)m->dtype);
  kvt_st32(fields + 8, m->layers);
  kvt_st32(fields + 12, m->kv_heads);
  kvt_st32(fields + 16, m->head_dim);
  kvt_st32(fields + 20, m->tp_rank);
  kvt_st32(fields + 24, m->tp_size);
  kvt_st32(fields + 28, (uint32_t)codec_len);
  kvt_hash128_stream s;
  kvt_hash128_begin(&s);
  kvt_hash128_update(&s, FP_DOMAIN, sizeof(FP_DOMAIN));
  kvt_hash128_update(&s, fields, sizeof(fields));
  kvt_hash128_update(&s, m->model_id, id_len);
  kvt_hash128_update(&s, codec, codec_len);
  kvt_hash128_end(&s, out->bytes);
  return 0;
}

int kvt_chunk_key(const kvt_key *fp, const kvt_key *prev, const uint32_t *tokens, size_t n,
                  kvt_key *out) {
  if (!fp || !tokens || !n || !out || n > UINT32_MAX)
    return -EINVAL;
  static const kvt_key none = {{0}};
  if (n <= CK_ONESHOT_TOKENS) {
    /* The same bytes as below, joined on the stack and hashed in one call:
     * several times faster than the streaming state for one chunk. */
    uint8_t buf[52 + 4 * CK_ONESHOT_TOKENS];
    memcpy(buf, CK_DOMAIN, 16);
    memcpy(buf + 16, fp->bytes, 16);
    memcpy(buf + 32, (prev ? prev : &none)->bytes, 16);
    kvt_st32(buf + 48, (uint32_t)n);
    memcpy(buf + 52, tokens, n * sizeof(uint32_t));
    kvt_hash128(buf, 52 + n * sizeof(uint32_t), out->bytes);
    return 0;
  }
  uint8_t count[4];
  kvt_st32(count, (uint32_t)n);
  kvt_hash128_stream s;
  kvt_hash128_begin(&s);
  kvt_hash128_update(&s, CK_DOMAIN, sizeof(CK_DOMAIN));
  kvt_hash128_update(&s, fp->bytes, 16);
  kvt_hash128_update(&s, (prev ? prev : &none)->bytes, 16);
  kvt_hash128_update(&s, count, 4);
  /* Token ids hash as little-endian u32; this host is little-endian
   * (kvt_internal.h refuses others), so the array is hashed in place. */
  kvt_hash128_update(&s, tokens, n * sizeof(uint32_t));
  kvt_hash128_end(&s, out->bytes);
  return 0;
}

int kvt_chunk_keys(const kvt_key *fp, const uint32_t *tokens, size_t n, uint32_t chunk,
                   kvt_key *out, size_t max_keys, size_t *n_keys) {
  if (!fp || (!tokens && n) || !chunk || (!out && max_keys) || !n_keys)
    return -EINVAL;
  size_t k = n / chunk;
  if (k > max_keys)
    k = max_keys;
  for (size_t i = 0; i < k; i++) {
    int rc = kvt_chunk_key(fp, i ? &out[i - 1] : NULL, tokens + i * chunk, chunk, &out[i]);
    if (rc)
      return rc;
  }
  *n_keys = k;
  return 0;
}

char *kvt_key_hex(const kvt_key *key, char *buf) {
  static const char hex[] = "0123456789abcdef";
  for (int i = 0; i < 16; i++) {
    buf[2 * i] = hex[key->bytes[i] >> 4];
    buf[2 * i + 1] = hex[key->bytes[i] & 15];
  }
  buf[32] = '\0';
  return buf;
}

static int nibble(char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

int kvt_key_from_hex(const char *hex, kvt_key *out) {
  if (!hex || !out || strlen(hex) != 32)
    return -EINVAL;
  kvt_key k;
  for (int i = 0; i < 16; i++) {
    int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0)
      return -EINVAL;
    k.bytes[i] = (uint8_t)(hi << 4 | lo);
  }
  *out = k;
  return 0;
}
