/* bench/synth.c - synthetic KV; see synth.h. */
#include "synth.h"

#include <math.h>

#include "kvtier/codec.h"

uint64_t kvt_rng_next(kvt_rng *r) {
  uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double kvt_rng_uniform(kvt_rng *r) { return (double)(kvt_rng_next(r) >> 11) * 0x1p-53; }

double kvt_rng_normal(kvt_rng *r) {
  double u = kvt_rng_uniform(r), v = kvt_rng_uniform(r);
  if (u < 1e-300)
    u = 1e-300;
  return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

static uint16_t to16(float x, int dtype) {
  return dtype == KVT_DTYPE_BF16 ? kvt_f32_to_bf16(x) : kvt_f32_to_f16(x);
}

void kvt_synth_kv(const kvt_synth_shape *s, uint64_t seed, uint16_t *k, uint16_t *v) {
  const uint32_t L = s->layers, T = s->tokens, H = s->heads, D = s->head_dim;
  uint32_t n_out = s->outlier_channels ? s->outlier_channels : 4;
  float big = s->outlier_scale > 0 ? s->outlier_scale : 20.0f;
  if (n_out > D)
    n_out = D;
  kvt_rng r = {seed};
  /* Per (layer, head, dim) channel: a gain and an offset; outlier channels
   * get large ones, like the fixed massive channels of real keys. */
  for (uint32_t l = 0; l < L; l++)
    for (uint32_t h = 0; h < H; h++) {
      float gain[1024], offset[1024];
      for (uint32_t d = 0; d < D && d < 1024; d++) {
        gain[d] = (float)(0.5 + kvt_rng_uniform(&r));
        offset[d] = (float)(0.2 * kvt_rng_normal(&r));
      }
      for (uint32_t i = 0; i < n_out; i++) {
        uint32_t d = (uint32_t)(kvt_rng_next(&r) % D);
        gain[d] = big * (float)(0.5 + 0.5 * kvt_rng_uniform(&r));
        offset[d] = big * (float)(kvt_rng_uniform(&r) - 0.5);
      }
      for (uint32_t t = 0; t < T; t++) {
        size_t base = (((size_t)l * T + t) * H + h) * D;
        for (uint32_t d = 0; d < D; d++) {
          k[base + d] = to16(offset[d] + gain[d] * (float)kvt_rng_normal(&r), s->dtype);
          v[base + d] = to16((float)kvt_rng_normal(&r), s->dtype);
        }
      }
    }
}
