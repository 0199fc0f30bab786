/* tests/golden/golden_common.c - how a golden payload is made
 * (golden_common.h): shared by tests/golden/make_golden.c and the tests
 * that check its files. */
#include "golden/golden_common.h"

const char *golden_dtype_name(int dtype) {
  return dtype == KVT_DTYPE_F16 ? "fp16" : "bf16";
}

int golden_write_line(FILE *f, const golden_case *c) {
  return fprintf(f, GOLDEN_LINE_FMT "\n", c->name, c->spec, golden_dtype_name(c->dtype),
                 c->zstd_level, c->seed, c->layers, c->tokens, c->heads, c->head_dim,
                 c->layer_begin, c->model_layers, c->token_begin, c->input_hash, c->payload_hash,
                 c->k_hash, c->v_hash, c->zstd_version) < 0
             ? -1
             : 0;
}

/* Parses one MANIFEST line; returns 0, or -1 for a malformed line. */
int golden_parse_line(const char *line, golden_case *c) {
  char dtype[8];
  memset(c, 0, sizeof(*c));
  int n = sscanf(line, "%63s %127s %7s %d %llu %u %u %u %u %u %u %u %llx %llx %llx %llx %u",
                 c->name, c->spec, dtype, &c->zstd_level, &c->seed, &c->layers, &c->tokens,
                 &c->heads, &c->head_dim, &c->layer_begin, &c->model_layers, &c->token_begin,
                 &c->input_hash, &c->payload_hash, &c->k_hash, &c->v_hash, &c->zstd_version);
  if (n != 17)
    return -1;
  if (strcmp(dtype, "bf16") == 0)
    c->dtype = KVT_DTYPE_BF16;
  else if (strcmp(dtype, "fp16") == 0)
    c->dtype = KVT_DTYPE_F16;
  else
    return -1;
  return 0;
}

size_t golden_elems(const golden_case *c) {
  return (size_t)c->layers * c->tokens * c->heads * c->head_dim;
}

/* The synthetic K and V of a case (dense, golden_elems() each). */
void golden_input(const golden_case *c, uint16_t *k, uint16_t *v) {
  kvt_synth_shape sh = {c->layers, c->tokens, c->heads, c->head_dim, c->dtype, 0, 0};
  kvt_synth_kv(&sh, c->seed, k, v);
}

/* Encode parameters: spec, and a fingerprint and first-chunk key over fixed
 * token ids, all derived from the case alone. */
int golden_params(kvt_ctx *ctx, const golden_case *c, kvt_encode_params *p) {
  kvt_encode_params init = KVT_ENCODE_PARAMS_INIT;
  *p = init;
  int rc = kvt_codec_parse(ctx, c->spec, &p->spec);
  if (rc)
    return rc;
  kvt_model_desc m = KVT_MODEL_DESC_INIT;
  m.model_id = GOLDEN_MODEL_ID;
  m.dtype = c->dtype;
  m.layers = c->model_layers;
  m.kv_heads = c->heads;
  m.head_dim = c->head_dim;
  if ((rc = kvt_fingerprint(&m, &p->spec, &p->fingerprint)) != 0)
    return rc;
  uint32_t ids[256];
  uint32_t n = c->tokens < 256 ? c->tokens : 256;
  for (uint32_t i = 0; i < n; i++)
    ids[i] = 1000u + 37u * (c->token_begin + i);
  if ((rc = kvt_chunk_key(&p->fingerprint, NULL, ids, n, &p->key)) != 0)
    return rc;
  p->model_layers = c->model_layers;
  p->layer_begin = c->layer_begin;
  p->token_begin = c->token_begin;
  p->zstd_level = c->zstd_level;
  return 0;
}

/* Encodes the case's synthetic input into a malloc'd buffer (*out, *len). */
int golden_encode(kvt_ctx *ctx, const golden_case *c, const uint16_t *k, const uint16_t *v,
                  uint8_t **out, size_t *len) {
  kvt_encode_params p;
  int rc = golden_params(ctx, c, &p);
  if (rc)
    return rc;
  uint64_t bound;
  if ((rc = kvt_encode_bound(ctx, &p.spec, p.layer_begin, c->layers, c->tokens, c->heads,
                             c->head_dim, &bound)))
    return rc;
  uint8_t *buf = malloc(bound);
  if (!buf)
    return -1;
  kvt_kv_view view;
  kvt_kv_view_dense(&view, (void *)k, (void *)v, c->dtype, c->layers, c->tokens, c->heads,
                    c->head_dim);
  if ((rc = kvt_encode(ctx, &p, &view, buf, bound, len)) != 0) {
    free(buf);
    return rc;
  }
  *out = buf;
  return 0;
}
