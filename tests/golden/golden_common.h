/* tests/golden/golden_common.h - how a golden payload is made: the synthetic
 * input, model fingerprint, chunk key and encode parameters that
 * make_golden.c used and tests/test_golden.c repeats, so that today's encoder
 * can be checked to write the very same bytes. Every parameter of a golden
 * file is in its MANIFEST line; what is fixed here (model id, token ids)
 * must never change, or every golden file goes stale. */
#ifndef KVT_GOLDEN_COMMON_H
#define KVT_GOLDEN_COMMON_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvtier.h"
#include "synth.h"

#define GOLDEN_MODEL_ID "kvtier-golden/tiny-model@1"
#define GOLDEN_NAME_MAX 64
#define GOLDEN_SPEC_MAX 128

/* One MANIFEST line:
 *   name spec dtype zstd seed layers tokens heads head_dim layer_begin
 *   model_layers token_begin input_xxh3 payload_xxh3 k_xxh3 v_xxh3 zstd_version
 * Hashes are XXH3-64 in hex: of the synthetic K then V input, of the payload
 * file, and of the decoded K and V bytes (dense [layer][token][head][dim]).
 * zstd_version is ZSTD_versionNumber() of the writer, 0 without the stage:
 * zstd's compressed bytes may differ between zstd releases. */
typedef struct golden_case {
  char name[GOLDEN_NAME_MAX];
  char spec[GOLDEN_SPEC_MAX];
  int dtype;
  int zstd_level;
  unsigned long long seed;
  uint32_t layers, tokens, heads, head_dim;
  uint32_t layer_begin, model_layers, token_begin;
  unsigned long long input_hash, payload_hash, k_hash, v_hash;
  unsigned zstd_version;
} golden_case;

#define GOLDEN_LINE_FMT "%s %s %s %d %llu %u %u %u %u %u %u %u %016llx %016llx %016llx %016llx %u"

const char *golden_dtype_name(int dtype);

/* Writes c as one MANIFEST line; returns 0, or -1 on a write error. */
int golden_write_line(FILE *f, const golden_case *c);

/* Parses one MANIFEST line; returns 0, or -1 for a malformed line. */
int golden_parse_line(const char *line, golden_case *c);

size_t golden_elems(const golden_case *c);

/* The synthetic K and V of a case (dense, golden_elems() each). */
void golden_input(const golden_case *c, uint16_t *k, uint16_t *v);

/* Encode parameters: spec, and a fingerprint and first-chunk key over fixed
 * token ids, all derived from the case alone. */
int golden_params(kvt_ctx *ctx, const golden_case *c, kvt_encode_params *p);

/* Encodes the case's synthetic input into a malloc'd buffer (*out, *len). */
int golden_encode(kvt_ctx *ctx, const golden_case *c, const uint16_t *k, const uint16_t *v,
                  uint8_t **out, size_t *len);

#endif
