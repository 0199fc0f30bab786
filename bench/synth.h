/* bench/synth.h - deterministic synthetic KV for the demo, benchmarks and
 * tests: keys with a few large outlier channels (as real models' keys have,
 * fixed per layer and head), values near-Gaussian. Not part of the library. */
#ifndef KVT_SYNTH_H
#define KVT_SYNTH_H

#include <stddef.h>
#include <stdint.h>

/* splitmix64: a small, seedable, portable generator. */
typedef struct kvt_rng {
  uint64_t s;
} kvt_rng;

uint64_t kvt_rng_next(kvt_rng *r);
/* Uniform in [0, 1). */
double kvt_rng_uniform(kvt_rng *r);
/* Standard normal (Box-Muller). */
double kvt_rng_normal(kvt_rng *r);

typedef struct kvt_synth_shape {
  uint32_t layers, tokens, heads, head_dim;
  int dtype;                /* enum kvt_dtype */
  uint32_t outlier_channels;/* per (layer, head) of keys; default 4 */
  float outlier_scale;      /* outlier channel magnitude vs the bulk; default 20 */
} kvt_synth_shape;

/* Fills dense [layer][token][head][dim] K and V (16-bit elements of dtype)
 * from seed. Keys: N(0, 1) per channel plus, in outlier channels, a
 * per-channel offset and scale up to outlier_scale. Values: N(0, 1). */
void kvt_synth_kv(const kvt_synth_shape *s, uint64_t seed, uint16_t *k, uint16_t *v);

#endif
