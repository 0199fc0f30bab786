/* kvtier/key.h - model fingerprints and prefix-chained chunk keys.
 *
 * A request's tokens are cut into chunks of a fixed number of tokens. Chunk
 * i's key is a 128-bit hash (XXH3-128, no seed) of the model fingerprint,
 * chunk i-1's key and the chunk's token ids. Equal prefixes of the same model
 * give equal keys in every process and on every run; a different model, dtype,
 * codec or tensor-parallel rank gives different keys, so one model never
 * reads another's KV. The byte-level definition is in serde/FORMAT.md; golden
 * values are in tests/test_key.c and never change within a format version.
 *
 * All functions here are thread-safe. */
#ifndef KVTIER_KEY_H
#define KVTIER_KEY_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier/codec.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvt_key {
  uint8_t bytes[16]; /* XXH3-128: high 64 bits big-endian first, then low */
} kvt_key;

#define KVT_KEY_HEX_LEN 32

/* Describes the model whose KV is stored. */
typedef struct kvt_model_desc {
  size_t struct_size;   /* sizeof(kvt_model_desc) */
  const char *model_id; /* e.g. "meta-llama/Llama-3.1-8B-Instruct@rev"; not NULL */
  int dtype;            /* enum kvt_dtype of the engine's cache */
  uint32_t layers;      /* all layers of the model */
  uint32_t kv_heads;    /* KV heads held by this rank */
  uint32_t head_dim;
  uint32_t tp_rank;     /* tensor-parallel rank and size (0 and 1 if none) */
  uint32_t tp_size;
} kvt_model_desc;

#define KVT_MODEL_DESC_INIT \
  { sizeof(kvt_model_desc), NULL, KVT_DTYPE_BF16, 0, 0, 0, 0, 1 }

/* Fingerprint of (model, dtype, shape, rank, codec). Returns 0, -EINVAL for
 * a missing model id, zero sizes or tp_rank >= tp_size, or KVT_ESPEC. */
KVT_API int kvt_fingerprint(const kvt_model_desc *model,
                            const kvt_codec_spec *spec, kvt_key *out);

/* Key of one chunk: prev is the previous chunk's key, or NULL for the first
 * chunk of a sequence. tokens holds n token ids (n > 0). */
KVT_API int kvt_chunk_key(const kvt_key *fingerprint, const kvt_key *prev,
                          const uint32_t *tokens, size_t n, kvt_key *out);

/* Keys of every full chunk of chunk_tokens tokens in tokens[0..n): writes
 * min(n / chunk_tokens, max_keys) keys to out and that count to *n_keys. A
 * trailing partial chunk gets no key. */
KVT_API int kvt_chunk_keys(const kvt_key *fingerprint, const uint32_t *tokens,
                           size_t n, uint32_t chunk_tokens, kvt_key *out,
                           size_t max_keys, size_t *n_keys);

/* Lower-case hex of a key into buf (KVT_KEY_HEX_LEN + 1 bytes). Returns buf. */
KVT_API char *kvt_key_hex(const kvt_key *key, char *buf);

/* Parses 32 hex digits. Returns 0 or -EINVAL. */
KVT_API int kvt_key_from_hex(const char *hex, kvt_key *out);

#ifdef __cplusplus
}
#endif
#endif
