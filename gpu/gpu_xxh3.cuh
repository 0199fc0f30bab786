/* gpu/gpu_xxh3.cuh - XXH3-64 (no seed, default secret) on the GPU, for the
 * payload checksums of payloads in device memory (serde/FORMAT.md: section
 * and header checksums). A port of xxHash 0.8's scalar XXH3_64bits: the
 * short-input paths run on one thread; long inputs on a group of 8 lanes,
 * lane i holding accumulator i (the 8 accumulators of a stripe are
 * independent but for the swap of adjacent lanes' data, done by a shuffle).
 * Checked against the host's XXH3 by tests/test_gpu_loadstore.c (payloads
 * stored into device memory must verify on the host). Internal. */
#ifndef KVT_GPU_XXH3_CUH
#define KVT_GPU_XXH3_CUH

#include <stdint.h>

namespace kvt_xxh3 {

constexpr uint64_t P32_1 = 0x9E3779B1U, P32_2 = 0x85EBCA77U, P32_3 = 0xC2B2AE3DU;
constexpr uint64_t P64_1 = 0x9E3779B185EBCA87ULL, P64_2 = 0xC2B2AE3D27D4EB4FULL,
                   P64_3 = 0x165667B19E3779F9ULL, P64_4 = 0x85EBCA77C2B2AE63ULL,
                   P64_5 = 0x27D4EB2F165667C5ULL;

/* In global memory: lanes read different bytes, which constant memory serialises. */
__device__ __align__(16) const uint8_t kSecret[192] = {
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
    0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
    0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
    0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
};

/* Little-endian reads at any alignment (one load when aligned). */
__device__ __forceinline__ uint64_t rd64(const uint8_t *p) {
  if (((uintptr_t)p & 7) == 0)
    return *reinterpret_cast<const uint64_t *>(p);
  uint64_t v = 0;
#pragma unroll
  for (int i = 7; i >= 0; i--)
    v = (v << 8) | p[i];
  return v;
}
__device__ __forceinline__ uint64_t bswap64(uint64_t v) {
  const uint32_t lo = __byte_perm((uint32_t)v, 0, 0x0123);
  const uint32_t hi = __byte_perm((uint32_t)(v >> 32), 0, 0x0123);
  return ((uint64_t)lo << 32) | hi;
}
__device__ __forceinline__ uint32_t rd32(const uint8_t *p) {
  return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
__device__ __forceinline__ uint64_t sec64(int off) { return rd64(kSecret + off); }
__device__ __forceinline__ uint32_t sec32(int off) { return rd32(kSecret + off); }

__device__ __forceinline__ uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
__device__ __forceinline__ uint64_t fold64(uint64_t a, uint64_t b) {
  return a * b ^ __umul64hi(a, b);
}
__device__ __forceinline__ uint64_t xxh64_avalanche(uint64_t h) {
  h ^= h >> 33;
  h *= P64_2;
  h ^= h >> 29;
  h *= P64_3;
  return h ^ (h >> 32);
}
__device__ __forceinline__ uint64_t avalanche(uint64_t h) {
  h ^= h >> 37;
  h *= 0x165667919E3779F9ULL;
  return h ^ (h >> 32);
}
__device__ __forceinline__ uint64_t rrmxmx(uint64_t h, uint64_t len) {
  h ^= rotl64(h, 49) ^ rotl64(h, 24);
  h *= 0x9FB21C651E98DF25ULL;
  h ^= (h >> 35) + len;
  h *= 0x9FB21C651E98DF25ULL;
  return h ^ (h >> 28);
}
__device__ __forceinline__ uint64_t mix16(const uint8_t *in, int s) {
  return fold64(rd64(in) ^ sec64(s), rd64(in + 8) ^ sec64(s + 8));
}

/* len <= 240, one thread. */
__device__ uint64_t hash_short(const uint8_t *in, uint64_t len) {
  if (len <= 16) {
    if (len > 8) {
      const uint64_t lo = rd64(in) ^ (sec64(24) ^ sec64(32));
      const uint64_t hi = rd64(in + len - 8) ^ (sec64(40) ^ sec64(48));
      return avalanche(len + bswap64(lo) + hi + fold64(lo, hi));
    }
    if (len >= 4) {
      const uint64_t in64 = rd32(in + len - 4) + ((uint64_t)rd32(in) << 32);
      return rrmxmx(in64 ^ (sec64(8) ^ sec64(16)), len);
    }
    if (len) {
      const uint32_t c = ((uint32_t)in[0] << 16) | ((uint32_t)in[len >> 1] << 24) |
                         (uint32_t)in[len - 1] | ((uint32_t)len << 8);
      return xxh64_avalanche((uint64_t)c ^ (uint64_t)(sec32(0) ^ sec32(4)));
    }
    return xxh64_avalanche(sec64(56) ^ sec64(64));
  }
  uint64_t acc = len * P64_1;
  if (len <= 128) {
    if (len > 32) {
      if (len > 64) {
        if (len > 96) {
          acc += mix16(in + 48, 96);
          acc += mix16(in + len - 64, 112);
        }
        acc += mix16(in + 32, 64);
        acc += mix16(in + len - 48, 80);
      }
      acc += mix16(in + 16, 32);
      acc += mix16(in + len - 32, 48);
    }
    acc += mix16(in, 0);
    acc += mix16(in + len - 16, 16);
    return avalanche(acc);
  }
  for (int i = 0; i < 8; i++)
    acc += mix16(in + 16 * i, 16 * i);
  acc = avalanche(acc);
  const int rounds = (int)len / 16;
  for (int i = 8; i < rounds; i++)
    acc += mix16(in + 16 * i, 16 * (i - 8) + 3);
  acc += mix16(in + len - 16, 136 - 17);
  return avalanche(acc);
}

/* One stripe's word v (this lane's 8 bytes) into accumulator `lane` (0..7)
 * of a group of 8 lanes that call this together; `gmask` names them. */
__device__ __forceinline__ void stripe_word(uint64_t &acc, uint64_t v, int soff, int lane,
                                            unsigned gmask) {
  const uint64_t k = v ^ sec64(soff + 8 * lane);
  const uint64_t other = __shfl_xor_sync(gmask, v, 1, 8);
  acc += other + (uint64_t)(uint32_t)k * (uint64_t)(uint32_t)(k >> 32);
}

__device__ __forceinline__ void scramble(uint64_t &acc, int lane) {
  acc ^= acc >> 47;
  acc ^= sec64(192 - 64 + 8 * lane);
  acc *= P32_1;
}

/* Blocks of 16 stripes (1 KiB) are read B at a time, every word of them
 * loaded before any is used: the reads of a section are one dependent chain
 * otherwise, and latency-bound. */
template <int B> __device__ __forceinline__ void blocks(uint64_t &acc, const uint8_t *p, int lane,
                                                       unsigned gmask) {
  uint64_t v[B][16];
#pragma unroll
  for (int b = 0; b < B; b++)
#pragma unroll
    for (int n = 0; n < 16; n++)
      v[b][n] = rd64(p + 1024 * b + 64 * n + 8 * lane);
#pragma unroll
  for (int b = 0; b < B; b++) {
#pragma unroll
    for (int n = 0; n < 16; n++)
      stripe_word(acc, v[b][n], 8 * n, lane, gmask);
    scramble(acc, lane);
  }
}

/* Accumulator `lane`'s initial value (of P32_3, P64_1, P64_2, P64_3, P64_4,
 * P32_2, P64_5, P32_1), without indexing a local array, which would put
 * the array on the stack. */
__device__ __forceinline__ uint64_t init_acc(int lane) {
  const uint64_t a = lane & 1 ? P64_1 : P32_3, b = lane & 1 ? P64_3 : P64_2;
  const uint64_t c = lane & 1 ? P32_2 : P64_4, d = lane & 1 ? P32_1 : P64_5;
  const uint64_t lo = lane & 2 ? b : a, hi = lane & 2 ? d : c;
  return lane & 4 ? hi : lo;
}

/* The end of a long hash: the 8 accumulators merged into the hash, which
 * every lane of the group gets. */
__device__ __forceinline__ uint64_t finish_long(uint64_t acc, uint64_t len, int lane,
                                                unsigned gmask) {
  /* merge: pairs (2i, 2i+1) */
  const uint64_t partner = __shfl_xor_sync(gmask, acc, 1, 8);
  uint64_t r = 0;
  if ((lane & 1) == 0)
    r = fold64(acc ^ sec64(11 + 8 * lane), partner ^ sec64(11 + 8 * lane + 8));
  r += __shfl_xor_sync(gmask, r, 2, 8);
  r += __shfl_xor_sync(gmask, r, 4, 8);
  r = __shfl_sync(gmask, r, 0, 8);
  return avalanche(len * P64_1 + r);
}

/* len > 240: a group of 8 lanes (lane = its index in the group); every lane
 * gets the hash. */
__device__ uint64_t hash_long(const uint8_t *in, uint64_t len, int lane, unsigned gmask) {
  uint64_t acc = init_acc(lane);
  const uint64_t block_len = 1024, nblocks = (len - 1) / block_len;
  uint64_t b = 0;
  for (; b + 4 <= nblocks; b += 4)
    blocks<4>(acc, in + b * block_len, lane, gmask);
  /* The rest in one round of reads (a 4 KiB checksum piece has 3). */
  if (nblocks - b == 3)
    blocks<3>(acc, in + b * block_len, lane, gmask);
  else if (nblocks - b == 2)
    blocks<2>(acc, in + b * block_len, lane, gmask);
  else if (nblocks - b == 1)
    blocks<1>(acc, in + b * block_len, lane, gmask);
  /* The last partial block's stripes (at most 15) and the last stripe:
   * every word loaded before any is used, as in blocks(). */
  const int stripes = (int)(((len - 1) - block_len * nblocks) / 64);
  const uint8_t *tail = in + nblocks * block_len + 8 * lane;
  uint64_t t[15];
#pragma unroll
  for (int n = 0; n < 15; n++)
    t[n] = n < stripes ? rd64(tail + 64 * n) : 0;
  const uint64_t last = rd64(in + len - 64 + 8 * lane);
#pragma unroll
  for (int n = 0; n < 15; n++)
    if (n < stripes)
      stripe_word(acc, t[n], 8 * n, lane, gmask);
  stripe_word(acc, last, 192 - 64 - 7, lane, gmask);
  return finish_long(acc, len, lane, gmask);
}

} // namespace kvt_xxh3
#endif
