/* tiers/redis/tier_redis_format.c - the redis tier's value format: the value
 * key's header and the part headers, how they are made and checked. A value
 * is bound to its key and its bytes are checked, as the nvme tier's are:
 *
 *   value header (RD_HDR = 64 bytes), before bytes [0, min(L, P)):
 *     0 "KVTR"  4 format (2)  5 zero[3]  8 generation  16 length L
 *     24 part count  28 part size P  32 the key (16 bytes)
 *     48 XXH3-64 of the data that follows  56 XXH3-64 of bytes [0, 56)
 *   part header (RD_PHDR = 32 bytes), before bytes [i*P, min(L, (i+1)*P)):
 *     0 "KVTP"  4 index i  8 generation  16 XXH3-64 of the data that follows
 *     24 XXH3-64 of bytes [0, 24), the key and L
 *
 * So a value copied under another key's name, a part of another value,
 * generation, index or length, and a bit flipped anywhere in a header or in
 * the data all fail a check. XXH3 finds accidents and misplaced values; it
 * is not a MAC: whoever may write to the Redis server may also write values
 * that pass. Format 1 (kvtier 0.3.0: a 32-byte header without the key or
 * checksums, 16-byte part headers) is recognised so that a PUT or DEL that
 * replaces such a value removes its parts, and a GET of one is a miss. */
#include "tier_redis.h"

void rd_hdr_make(uint8_t h[RD_HDR], const kvt_key *k, const rd_hdr *v) {
  memcpy(h, "KVTR", 4);
  h[4] = RD_FORMAT;
  h[5] = h[6] = h[7] = 0;
  kvt_st64(h + 8, v->gen);
  kvt_st64(h + 16, v->total);
  kvt_st32(h + 24, v->nparts);
  kvt_st32(h + 28, (uint32_t)v->psz);
  memcpy(h + 32, k->bytes, 16);
  kvt_st64(h + 48, v->hash);
  kvt_st64(h + 56, kvt_hash64(h, 56));
}

static int shape_ok(const rd_hdr *v) {
  return v->psz > 0 && v->nparts <= RD_MAX_PARTS && v->nparts == rd_parts_of(v->total, v->psz);
}

int rd_hdr_check(const uint8_t *h, size_t n, const kvt_key *k, rd_hdr *v) {
  memset(v, 0, sizeof(*v));
  if (n < 5 || memcmp(h, "KVTR", 4) != 0)
    return RD_HDR_FOREIGN;
  if (h[4] == 1) { /* 0.3.0's: gen, total, nparts and psz where ours are */
    if (n < RD_HDR_V1)
      return RD_HDR_FOREIGN;
    v->gen = kvt_ld64(h + 8);
    v->total = kvt_ld64(h + 16);
    v->nparts = kvt_ld32(h + 24);
    v->psz = kvt_ld32(h + 28);
    return shape_ok(v) ? RD_HDR_FORMAT1 : RD_HDR_FOREIGN;
  }
  if (h[4] != RD_FORMAT || n < RD_HDR)
    return RD_HDR_FOREIGN;
  if (kvt_ld64(h + 56) != kvt_hash64(h, 56))
    return RD_HDR_CORRUPT;
  v->gen = kvt_ld64(h + 8);
  v->total = kvt_ld64(h + 16);
  v->nparts = kvt_ld32(h + 24);
  v->psz = kvt_ld32(h + 28);
  v->hash = kvt_ld64(h + 48);
  if (memcmp(h + 32, k->bytes, 16) != 0)
    return RD_HDR_OTHER_KEY;
  return shape_ok(v) ? RD_HDR_OK : RD_HDR_CORRUPT;
}

/* XXH3-64 of the part header's first 24 bytes, the key and the length. */
static uint64_t part_binding(const uint8_t *ph, const kvt_key *k, uint64_t total) {
  uint8_t b[24 + 16 + 8];
  memcpy(b, ph, 24);
  memcpy(b + 24, k->bytes, 16);
  kvt_st64(b + 40, total);
  return kvt_hash64(b, sizeof(b));
}

void rd_part_make(uint8_t ph[RD_PHDR], const kvt_key *k, uint64_t total, uint64_t gen,
                  uint32_t index, uint64_t hash) {
  memcpy(ph, "KVTP", 4);
  kvt_st32(ph + 4, index);
  kvt_st64(ph + 8, gen);
  kvt_st64(ph + 16, hash);
  kvt_st64(ph + 24, part_binding(ph, k, total));
}

int rd_part_check(const uint8_t *ph, size_t n, const kvt_key *k, uint64_t total, uint64_t gen,
                  uint32_t index, uint64_t *hash) {
  if (n < RD_PHDR || memcmp(ph, "KVTP", 4) != 0 || kvt_ld64(ph + 24) != part_binding(ph, k, total))
    return RD_HDR_CORRUPT;
  if (kvt_ld32(ph + 4) != index || kvt_ld64(ph + 8) != gen)
    return RD_HDR_OTHER_KEY; /* whole, but another part's or generation's */
  *hash = kvt_ld64(ph + 16);
  return RD_HDR_OK;
}

const char *rd_hdr_why(int status) {
  switch (status) {
  case RD_HDR_FOREIGN:
    return "not a kvtier value";
  case RD_HDR_FORMAT1:
    return "a value in format 1 (kvtier 0.3.0), which carries no checksums: not read, the next "
           "PUT replaces it";
  case RD_HDR_CORRUPT:
    return "header checksum mismatch";
  case RD_HDR_OTHER_KEY:
    return "another key's value";
  default:
    return "ok";
  }
}
