/* serde/payload_layout.c - the header and section table fields to and from
 * their bytes (payload_layout.h): the one place that writes a payload
 * header, for serde's writer and for the GPU store. */
#include "serde_internal.h"

void kvt_header_put(uint8_t *dst, const kvt_payload_info *h) {
  memset(dst, 0, HDR_FIXED);
  memcpy(dst + H_MAGIC, KVT_MAGIC, 8);
  kvt_st16(dst + H_VMAJOR, KVT_FORMAT_VERSION);
  kvt_st16(dst + H_VMINOR, KVT_FORMAT_MINOR);
  kvt_st32(dst + H_HDRSIZE, h->header_size);
  kvt_st64(dst + H_SIZE, h->size);
  kvt_st32(dst + H_FLAGS, h->flags);
  kvt_st32(dst + H_NSEC, h->sections);
  memcpy(dst + H_KEY, h->key.bytes, 16);
  memcpy(dst + H_FPRINT, h->fingerprint.bytes, 16);
  dst[H_KFMT] = h->spec.k_fmt;
  dst[H_VFMT] = h->spec.v_fmt;
  dst[H_SCALE] = h->spec.scale;
  dst[H_KAXIS] = h->spec.k_axis;
  kvt_st16(dst + H_GROUP, h->spec.group);
  kvt_st16(dst + H_BLOCK, h->spec.block);
  dst[H_DTYPE] = (uint8_t)h->dtype;
  kvt_st32(dst + H_MLAYERS, h->model_layers);
  kvt_st32(dst + H_LBEGIN, h->layer_begin);
  kvt_st32(dst + H_LCOUNT, h->layers);
  kvt_st32(dst + H_TOKENS, h->tokens);
  kvt_st32(dst + H_HEADS, h->heads);
  kvt_st32(dst + H_HDIM, h->head_dim);
  kvt_st32(dst + H_TBEGIN, h->token_begin);
  const size_t table_end = HDR_FIXED + (size_t)SEC_ENTRY * h->sections;
  memset(dst + table_end, 0, h->header_size - table_end);
}

uint64_t kvt_header_checksum(const uint8_t *hdr, size_t header_size) {
  /* The fixed part with a zeroed checksum field, then the section table. */
  uint8_t fixed[HDR_FIXED];
  memcpy(fixed, hdr, HDR_FIXED);
  memset(fixed + H_CHECKSUM, 0, 8);
  return kvt_hash64_2(fixed, HDR_FIXED, hdr + HDR_FIXED, header_size - HDR_FIXED);
}

void kvt_header_seal(uint8_t *dst) {
  kvt_st64(dst + H_CHECKSUM, kvt_header_checksum(dst, kvt_ld32(dst + H_HDRSIZE)));
}

void kvt_header_get(const uint8_t *b, kvt_payload_info *h) {
  memset(h, 0, sizeof(*h));
  h->version_major = kvt_ld16(b + H_VMAJOR);
  h->version_minor = kvt_ld16(b + H_VMINOR);
  h->flags = kvt_ld32(b + H_FLAGS);
  h->size = kvt_ld64(b + H_SIZE);
  h->header_size = kvt_ld32(b + H_HDRSIZE);
  h->sections = kvt_ld32(b + H_NSEC);
  memcpy(h->key.bytes, b + H_KEY, 16);
  memcpy(h->fingerprint.bytes, b + H_FPRINT, 16);
  h->spec.k_fmt = b[H_KFMT];
  h->spec.v_fmt = b[H_VFMT];
  h->spec.scale = b[H_SCALE];
  h->spec.k_axis = b[H_KAXIS];
  h->spec.group = kvt_ld16(b + H_GROUP);
  h->spec.block = kvt_ld16(b + H_BLOCK);
  h->dtype = b[H_DTYPE];
  h->model_layers = kvt_ld32(b + H_MLAYERS);
  h->layer_begin = kvt_ld32(b + H_LBEGIN);
  h->layers = kvt_ld32(b + H_LCOUNT);
  h->tokens = kvt_ld32(b + H_TOKENS);
  h->heads = kvt_ld32(b + H_HEADS);
  h->head_dim = kvt_ld32(b + H_HDIM);
  h->token_begin = kvt_ld32(b + H_TBEGIN);
}

uint64_t kvt_header_stored_checksum(const uint8_t *b) { return kvt_ld64(b + H_CHECKSUM); }

void kvt_section_entry_put(uint8_t *hdr, uint32_t i, const kvt_section_info *s) {
  uint8_t *e = hdr + HDR_FIXED + (size_t)SEC_ENTRY * i;
  memset(e, 0, SEC_ENTRY);
  kvt_st32(e + S_LAYER, s->layer);
  e[S_KIND] = (uint8_t)s->is_value;
  e[S_FMT] = (uint8_t)s->fmt;
  e[S_COMP] = (uint8_t)s->comp;
  kvt_st64(e + S_OFFSET, s->offset);
  kvt_st64(e + S_STORED, s->stored_size);
  kvt_st64(e + S_RAW, s->raw_size);
  kvt_st64(e + S_CHECKSUM, s->checksum);
}

void kvt_section_entry_get(const uint8_t *hdr, uint32_t i, kvt_section_info *s) {
  const uint8_t *e = hdr + HDR_FIXED + (size_t)SEC_ENTRY * i;
  memset(s, 0, sizeof(*s)); /* the reserved tail too */
  s->layer = kvt_ld32(e + S_LAYER);
  s->is_value = e[S_KIND];
  s->fmt = e[S_FMT];
  s->comp = e[S_COMP];
  s->offset = kvt_ld64(e + S_OFFSET);
  s->stored_size = kvt_ld64(e + S_STORED);
  s->raw_size = kvt_ld64(e + S_RAW);
  s->checksum = kvt_ld64(e + S_CHECKSUM);
}

uint64_t kvt_section_checksum(unsigned major, const uint8_t *data, size_t len) {
  return major >= 2 ? kvt_hash64_blocks(data, len, KVT_PL_CHECKSUM_BLOCK) : kvt_hash64(data, len);
}

void kvt_section_entry_set_checksum(uint8_t *hdr, uint32_t i, uint64_t checksum) {
  kvt_st64(hdr + HDR_FIXED + (size_t)SEC_ENTRY * i + S_CHECKSUM, checksum);
}
