/* tests/fuzz/fuzz_payload.c - libFuzzer target for the payload parser and
 * decoder: kvt_payload_parse, kvt_payload_verify, kvt_payload_section for
 * every section, and kvt_decode into a view sized from the parsed header.
 *
 * Each input runs twice: as given, and with its checksums recomputed
 * (header, and every section whose offset and size lie inside the input).
 * Mutated bytes almost never keep an XXH3 checksum valid, so without the
 * second run the fuzzer would stop at the header checksum and never reach
 * the field checks, the section walk, zstd or the codecs.
 *
 * Beyond "no crash, no sanitizer report", it checks what the API promises:
 * errors are pinned codes, an accepted payload's sections lie inside it,
 * verify accepts no more than parse, and decode of a verified payload fails
 * only for a reason a verified payload can still have (a bad zstd stream). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "kvtier.h"
#include "serde_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Decodes are skipped above this many bytes of K+V. */
#define FUZZ_VIEW_MAX ((uint64_t)64 << 20)

static void check(int ok, const char *what, int rc) {
  if (!ok) {
    fprintf(stderr, "fuzz_payload: %s (rc %d %s)\n", what, rc, kvt_err_name(rc));
    abort();
  }
}

static int payload_error(int rc) {
  return rc == KVT_EFORMAT || rc == KVT_EVERSION || rc == KVT_ETRUNC || rc == KVT_ECORRUPT ||
         rc == KVT_ECHECKSUM || rc == KVT_ETOOBIG;
}

static void decode_all(kvt_ctx *ctx, const uint8_t *b, size_t n, const kvt_payload_info *in,
                       int verified) {
  uint64_t elems = (uint64_t)in->layers * in->tokens * in->heads * in->head_dim;
  if (4 * elems > FUZZ_VIEW_MAX)
    return;
  uint16_t *kv = malloc(4 * elems);
  if (!kv)
    return;
  kvt_kv_view view;
  kvt_kv_view_dense(&view, kv, kv + elems, in->dtype, in->layers, in->tokens, in->heads,
                    in->head_dim);
  int rc = kvt_decode(ctx, b, n, NULL, &view);
  if (verified)
    check(rc == 0 || rc == KVT_ECORRUPT || rc == KVT_ENOTSUP || rc == -ENOMEM,
          "decode of a verified payload failed", rc);
  else
    check(rc == 0 || payload_error(rc) || rc == KVT_ENOTSUP || rc == -ENOMEM,
          "decode returned an unexpected code", rc);
  /* The last layer alone, through the subset path. */
  kvt_decode_params dp = KVT_DECODE_PARAMS_INIT;
  dp.layer_first = in->layers - 1;
  dp.layer_count = 1;
  view.layers = 1;
  rc = kvt_decode(ctx, b, n, &dp, &view);
  check(rc == 0 || payload_error(rc) || rc == KVT_ENOTSUP || rc == -ENOMEM,
        "subset decode returned an unexpected code", rc);
  free(kv);
}

static void run_one(kvt_ctx *ctx, const uint8_t *b, size_t n) {
  kvt_payload_info in;
  int rc = kvt_payload_parse(ctx, b, n, &in);
  check(rc == 0 || payload_error(rc), "parse returned an unexpected code", rc);
  int vrc = kvt_payload_verify(ctx, b, n, NULL);
  check(vrc == 0 || payload_error(vrc), "verify returned an unexpected code", vrc);
  check(rc == 0 || vrc != 0, "verify accepted what parse rejected", vrc);
  if (rc != 0)
    return;
  check(in.size == n && in.sections == 2 * in.layers && in.header_size <= n,
        "parsed header disagrees with the buffer", 0);
  uint64_t end = in.header_size;
  for (uint32_t i = 0; i < in.sections; i++) {
    kvt_section_info s;
    rc = kvt_payload_section(ctx, b, n, i, &s);
    check(rc == 0, "payload_section failed on a parsed payload", rc);
    check(s.offset >= end && s.offset % SEC_ALIGN == 0 && s.stored_size <= n - s.offset &&
              s.layer == in.layer_begin + i / 2 && s.is_value == (int)(i % 2),
          "accepted section lies outside its payload or out of order", 0);
    end = s.offset + s.stored_size;
  }
  kvt_section_info s;
  check(kvt_payload_section(ctx, b, n, in.sections, &s) == -EINVAL, "section past the end", 0);
  decode_all(ctx, b, n, &in, vrc == 0);
}

/* Makes a copy's checksums agree with its bytes, wherever the header and
 * table say they are and that lies inside the copy. */
static void reseal(uint8_t *b, size_t n) {
  if (n < HDR_FIXED)
    return;
  uint32_t hsize = kvt_ld32(b + H_HDRSIZE), nsec = kvt_ld32(b + H_NSEC);
  if (hsize < HDR_FIXED || hsize > n)
    return;
  for (uint32_t i = 0; i < nsec && HDR_FIXED + (uint64_t)SEC_ENTRY * (i + 1) <= hsize; i++) {
    uint8_t *e = b + HDR_FIXED + (size_t)SEC_ENTRY * i;
    uint64_t off = kvt_ld64(e + S_OFFSET), len = kvt_ld64(e + S_STORED);
    if (off <= n && len <= n - off)
      kvt_st64(e + S_CHECKSUM, kvt_section_checksum(kvt_ld16(b + H_VMAJOR), b + off, len));
  }
  kvt_st64(b + H_CHECKSUM, kvt_header_checksum(b, hsize));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static kvt_ctx *ctx; /* kept: its scratch buffers are reused like a server's */
  if (!ctx && kvt_ctx_create(NULL, &ctx) != 0)
    return 0;
  /* Exact-size copies, so a read one byte past the payload is caught. */
  uint8_t *b = malloc(size ? size : 1);
  if (!b)
    return 0;
  memcpy(b, data, size);
  run_one(ctx, b, size);
  reseal(b, size);
  run_one(ctx, b, size);
  free(b);
  return 0;
}
