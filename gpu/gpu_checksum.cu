/* gpu/gpu_checksum.cu - section checksums of payloads in device memory:
 * sealing a payload the store kernel wrote (section checksums into the
 * table, then the header checksum) and verifying the loaded sections before
 * the load kernel trusts a device payload.
 *
 * Format 2 (serde/FORMAT.md section 3): every 4 KiB piece of every section is
 * hashed by its own group of 4 lanes (pieces_kernel), then a segment of 8
 * lanes or a warp per section hashes the section's digests (the pieces
 * kernel's last CTA, or combine_kernel). Format 1 (reading old payloads):
 * one group of 8 lanes per section, sequential within it, as XXH3 of the
 * whole section must be (50-110 GB/s on an H200). */
#include <stdint.h>

#include <cuda_runtime.h>

#include "gpu_xxh3.cuh"
#include "kvt_gpu_layout.h"
#include "payload_layout.h" /* where the checksums are */

/* ---- checksums of payloads in device memory ---- */

/* XXH3-64 of in[0..len) by a group of 8 lanes; every lane gets it. */
__device__ uint64_t group_hash(const uint8_t *in, uint64_t len, int lane, unsigned gmask) {
  if (len > 240)
    return kvt_xxh3::hash_long(in, len, lane, gmask);
  uint64_t h = lane == 0 ? kvt_xxh3::hash_short(in, len) : 0;
  return __shfl_sync(gmask, h, 0, 8);
}

/* Whether section entry (off, n) lies in [lo, hi) and, for format 2,
 * within `per` pieces (per 0: no limit). The host checked its own copy of
 * the header; the table the kernels read may differ (a caller-supplied
 * header copy, a flip after the copy, host memory written since): such a
 * section is not read, and verify reports it as a mismatch. */
__device__ __forceinline__ bool section_fits(uint64_t off, uint64_t n, uint64_t lo, uint64_t hi,
                                             uint64_t per) {
  return lo <= off && off <= hi && n <= hi - off && (per == 0 || n <= per * KVT_PL_CHECKSUM_BLOCK);
}

/* A verify's mismatch: the gate (the load kernels after it write nothing)
 * and the caller's verdict, if any. */
__device__ __forceinline__ void mismatch(uint32_t i, uint32_t *gate, uint32_t *verdict) {
  if (gate)
    atomicMin(gate, i);
  if (verdict) {
    *reinterpret_cast<volatile uint32_t *>(verdict + KVT_GPU_VERDICT_BAD) = i;
    __threadfence_system();
  }
}

/* Format 1: one group of 8 lanes per section: write (seal) or compare. */
__global__ void sections_hash_kernel(uint8_t *table, const uint8_t *body, uint64_t lo,
                                     uint64_t hi, uint32_t first, uint32_t count, int write,
                                     uint32_t *gate, uint32_t *verdict, int check_header,
                                     uint64_t expect_header) {
  const uint32_t g = (blockIdx.x * blockDim.x + threadIdx.x) / 8;
  const int lane = threadIdx.x & 7;
  const unsigned gmask = 0xFFu << (threadIdx.x & 24);
  if (g == 0 && lane == 0 && check_header &&
      kvt_xxh3::rd64(table + KVT_PL_HEADER_CHECKSUM) != expect_header)
    mismatch(KVT_GPU_BAD_HEADER, gate, verdict);
  if (g >= count) /* the group's 8 lanes leave together */
    return;
  const uint32_t i = first + g;
  uint8_t *e = table + HDR_FIXED + SEC_ENTRY * (uint64_t)i;
  const uint64_t off = kvt_xxh3::rd64(e + KVT_PL_ENTRY_OFFSET);
  const uint64_t n = kvt_xxh3::rd64(e + KVT_PL_ENTRY_STORED);
  if (!section_fits(off, n, lo, hi, 0)) {
    if (lane == 0 && !write)
      mismatch(i, gate, verdict);
    return;
  }
  const uint64_t h = group_hash(body + off, n, lane, gmask);
  if (lane != 0)
    return;
  if (write)
    *reinterpret_cast<uint64_t *>(e + KVT_PL_ENTRY_CHECKSUM) = h; /* entries are 16-aligned */
  else if (kvt_xxh3::rd64(e + KVT_PL_ENTRY_CHECKSUM) != h)
    mismatch(i, gate, verdict);
}

/* The header checksum, after the section checksums are in the table. */
__global__ void header_hash_kernel(uint8_t *payload, uint64_t header_size) {
  const int lane = threadIdx.x & 7;
  const uint64_t h = group_hash(payload, header_size, lane, 0xFFu);
  if (lane == 0)
    *reinterpret_cast<uint64_t *>(payload + KVT_PL_HEADER_CHECKSUM) = h;
}

/* Word w (bytes 8w..8w+8) of the secret: an aligned load, where sec64's
 * any-alignment read costs a test and a branch per word. */
__device__ __forceinline__ uint64_t sec_word(int w) {
  return reinterpret_cast<const uint64_t *>(kvt_xxh3::kSecret)[w];
}

/* 16 bytes at p: one load where A16 (p 16-aligned), else any alignment. */
template <bool A16> __device__ __forceinline__ void rd128(const uint8_t *p, uint64_t &lo,
                                                         uint64_t &hi) {
  if constexpr (A16) {
    const uint4 v = *reinterpret_cast<const uint4 *>(p);
    lo = (uint64_t)v.x | (uint64_t)v.y << 32;
    hi = (uint64_t)v.z | (uint64_t)v.w << 32;
  } else {
    lo = kvt_xxh3::rd64(p);
    hi = kvt_xxh3::rd64(p + 8);
  }
}

/* One stripe's words 2q and 2q + 1 into accumulators 2q and 2q + 1 (XXH3's
 * accumulate_512: acc[i ^ 1] += data[i], acc[i] += lo32(k) * hi32(k) with
 * k = data[i] ^ secret[i]): a lane holding both words of a pair needs no
 * shuffle. */
__device__ __forceinline__ void stripe_pair(uint64_t &a0, uint64_t &a1, uint64_t d0, uint64_t d1,
                                            uint64_t s0, uint64_t s1) {
  const uint64_t k0 = d0 ^ s0, k1 = d1 ^ s1;
  a0 += d1 + (uint64_t)(uint32_t)k0 * (uint64_t)(uint32_t)(k0 >> 32);
  a1 += d0 + (uint64_t)(uint32_t)k1 * (uint64_t)(uint32_t)(k1 >> 32);
}

__device__ __forceinline__ void scramble_one(uint64_t &a, int i) {
  a ^= a >> 47;
  a ^= sec_word(16 + i); /* secret bytes 128 + 8i: the last 64 */
  a *= kvt_xxh3::P32_1;
}

/* XXH3-64 (len > 240) of in[0..len) by a group of 4 lanes (q: the lane's
 * index in the group, gmask: the group's lanes); every lane gets it. Lane q
 * holds accumulators 2q and 2q + 1 and reads 16 bytes of each 64-byte
 * stripe, so no shuffle is needed until the merge; one 1 KiB block per loop
 * trip, 16 reads in flight per lane. A16: in is 16-aligned (a section's
 * pieces are), one load per read. */
template <bool A16>
__device__ uint64_t quad_hash_long(const uint8_t *in, uint64_t len, int q, unsigned gmask) {
  using namespace kvt_xxh3;
  uint64_t a0 = init_acc(2 * q), a1 = init_acc(2 * q + 1);
  const uint64_t nblocks = (len - 1) / 1024;
  const uint8_t *base = in + 16 * q;
#pragma unroll 1
  for (uint64_t b = 0; b < nblocks; b++) {
    uint64_t lo[16], hi[16];
#pragma unroll
    for (int n = 0; n < 16; n++)
      rd128<A16>(base + 1024 * b + 64 * n, lo[n], hi[n]);
#pragma unroll
    for (int n = 0; n < 16; n++)
      stripe_pair(a0, a1, lo[n], hi[n], sec_word(n + 2 * q), sec_word(n + 2 * q + 1));
    scramble_one(a0, 2 * q);
    scramble_one(a1, 2 * q + 1);
  }
  const int stripes = (int)(((len - 1) - 1024 * nblocks) / 64);
  const uint8_t *tail = base + 1024 * nblocks;
  uint64_t lo[15], hi[15], llo, lhi;
#pragma unroll
  for (int n = 0; n < 15; n++) {
    lo[n] = hi[n] = 0;
    if (n < stripes)
      rd128<A16>(tail + 64 * n, lo[n], hi[n]);
  }
  rd128<false>(in + len - 64 + 16 * q, llo, lhi);
#pragma unroll
  for (int n = 0; n < 15; n++)
    if (n < stripes)
      stripe_pair(a0, a1, lo[n], hi[n], sec_word(n + 2 * q), sec_word(n + 2 * q + 1));
  stripe_pair(a0, a1, llo, lhi, sec64(192 - 64 - 7 + 16 * q), sec64(192 - 64 - 7 + 16 * q + 8));
  /* merge: pair q is (2q, 2q + 1) */
  uint64_t r = fold64(a0 ^ sec64(11 + 16 * q), a1 ^ sec64(11 + 16 * q + 8));
  r += __shfl_xor_sync(gmask, r, 1, 4);
  r += __shfl_xor_sync(gmask, r, 2, 4);
  return avalanche(len * P64_1 + r);
}

/* XXH3-64 of a 4 KiB checksum piece (or a section's last, shorter one) by
 * a group of 4 lanes; every lane gets it. Kept compact (few registers,
 * little code, no secret read at an unknown alignment in the loop): with
 * kvt_xxh3::hash_long's unrolled 4 KiB reads the pieces kernel ran at 12%
 * occupancy, stalled on instruction fetch, and with hash_long inlined for
 * the combine it took 210 registers and hashed at about 1 TB/s on an H200. */
__device__ uint64_t piece_hash(const uint8_t *in, uint64_t len, int q, unsigned gmask) {
  if (len <= 240) {
    uint64_t h = q == 0 ? kvt_xxh3::hash_short(in, len) : 0;
    return __shfl_sync(gmask, h, 0, 4);
  }
  return ((uintptr_t)in & 15) == 0 ? quad_hash_long<true>(in, len, q, gmask)
                                   : quad_hash_long<false>(in, len, q, gmask);
}

/* XXH3-64 of the n words at w (a section's piece digests, little-endian)
 * by S segments of 8 lanes (S 1 or 4: a segment or a warp per section);
 * every lane gets it. XXH3's accumulators only add within a 1 KiB block,
 * so the segments sum S blocks at once (lane i of segment r: block r's sum
 * for accumulator i, the swapped word by a shuffle), and every lane then
 * applies them in order: acc = scramble(acc + sum). The sequential part is
 * a scramble per block, not a read: a section of 20 MiB has 40 blocks of
 * digests, which one group read block by block in 150 us on an H200. */
template <int S> __device__ uint64_t digest_hash(const uint64_t *w, uint64_t n) {
  using namespace kvt_xxh3;
  const uint8_t *in = reinterpret_cast<const uint8_t *>(w);
  const uint64_t len = 8 * n;
  const int lane = threadIdx.x & 31, i = lane & 7, r = (lane >> 3) % S;
  const int first = lane & ~(8 * S - 1); /* the group's first lane */
  const unsigned seg = 0xFFu << (lane & 24);
  const unsigned group = S == 4 ? 0xFFFFFFFFu : seg;
  if (len <= 240) {
    const uint64_t h = lane == first ? hash_short(in, len) : 0;
    return __shfl_sync(group, h, first);
  }
  uint64_t acc = init_acc(i);
  const uint64_t nblocks = (len - 1) / 1024;
#pragma unroll 1
  for (uint64_t b0 = 0; b0 < nblocks; b0 += S) {
    uint64_t sum = 0;
    if (b0 + r < nblocks) { /* the same for the segment's 8 lanes */
      const uint64_t *blk = w + 128 * (b0 + r) + i;
      uint64_t v[16];
#pragma unroll
      for (int s = 0; s < 16; s++)
        v[s] = blk[8 * s];
#pragma unroll
      for (int s = 0; s < 16; s++) {
        const uint64_t k = v[s] ^ sec_word(s + i);
        sum += __shfl_xor_sync(seg, v[s], 1, 8) +
               (uint64_t)(uint32_t)k * (uint64_t)(uint32_t)(k >> 32);
      }
    }
#pragma unroll
    for (int rr = 0; rr < S; rr++) {
      const uint64_t part = S == 1 ? sum : __shfl_sync(group, sum, first + 8 * rr + i);
      if (b0 + rr < nblocks) {
        acc += part;
        scramble_one(acc, i);
      }
    }
  }
  /* The last partial block's stripes and the last stripe, by every segment
   * alike (the same words). */
  const int stripes = (int)(((len - 1) - 1024 * nblocks) / 64);
  const uint64_t *tail = w + 128 * nblocks + i;
#pragma unroll 1
  for (int s = 0; s < stripes; s++)
    stripe_word(acc, tail[8 * s], 8 * s, i, seg);
  stripe_word(acc, w[n - 8 + i], 192 - 64 - 7, i, seg);
  return finish_long(acc, len, i, seg);
}

/* Pieces per section up to which a segment of 8 lanes combines a section
 * (digests of at most 2 KiB: 2 blocks), above a warp. */
#define SEGMENT_PIECES 256

#define COMBINE_THREADS 64
#define COMBINE_APART (64u * 1024) /* pieces: 256 MiB */

/* What a checksum launch takes besides a: nothing, or a batch's payloads
 * (kvt_gpu_sec_items), payload k's in blockIdx.z = k. */
template <bool B> struct sec_batch {};
template <> struct sec_batch<true> {
  kvt_gpu_sec_items v;
};

/* a with payload k's table, body, gate and verdict. */
template <bool B>
__device__ __forceinline__ kvt_gpu_sections payload_of(const kvt_gpu_sections &a,
                                                       const sec_batch<B> &items, uint32_t k) {
  kvt_gpu_sections r = a;
  if constexpr (B) {
    const kvt_gpu_sec_item &it = items.v.it[k];
    r.table = it.table;
    r.body = it.body;
    r.gate = it.gate;
    r.verdict = it.verdict;
  }
  (void)items;
  (void)k;
  return r;
}

/* Format 2: threads [0, nthreads) of CTA `cta` of `nctas`, a segment of 8
 * lanes or a warp per section (digest_hash), hash the pieces' digests of
 * sections [a.first, a.first + a.count) of each of the `npay` payloads (digests of payload k's
 * section g at (k * a.count + g) * per) into their checksums: written
 * (seal) or compared (verify); CTA 0 checks the header copies. Then, with
 * verdicts and a.done, a single CTA (nctas 1) marks them done: every check
 * of the load is complete (this is its last); with several CTAs,
 * done_kernel does after them. Every thread of the CTA calls it. */
template <bool B>
__device__ void combine_sections(const kvt_gpu_sections &a0, const sec_batch<B> &items,
                                 uint32_t npay, uint64_t per, unsigned nthreads, uint32_t cta,
                                 uint32_t nctas) {
  /* Small sections a segment each, big ones a warp each (digest_hash). */
  const bool wide = per > SEGMENT_PIECES;
  const unsigned unit = wide ? 32 : 8; /* lanes per section */
  const int lane = threadIdx.x % unit;
  if (cta == 0)
    for (uint32_t k = threadIdx.x; k < npay; k += nthreads) {
      const kvt_gpu_sections a = payload_of(a0, items, k);
      if (a.check_header && kvt_xxh3::rd64(a.table + KVT_PL_HEADER_CHECKSUM) != a.expect_header)
        mismatch(KVT_GPU_BAD_HEADER, a.gate, a.verdict);
    }
  const uint64_t all = (uint64_t)npay * a0.count;
  /* Trips are the same for a unit's lanes (shuffles across the unit). */
  for (uint64_t gk = (uint64_t)cta * (nthreads / unit) + threadIdx.x / unit; gk < all;
       gk += (uint64_t)nctas * (nthreads / unit)) {
    const uint32_t k = (uint32_t)(gk / a0.count), g = (uint32_t)(gk % a0.count);
    const kvt_gpu_sections a = payload_of(a0, items, k);
    const uint32_t i = a.first + g;
    uint8_t *e = a.table + HDR_FIXED + SEC_ENTRY * (uint64_t)i;
    const uint64_t n = kvt_xxh3::rd64(e + KVT_PL_ENTRY_STORED);
    if (!section_fits(kvt_xxh3::rd64(e + KVT_PL_ENTRY_OFFSET), n, a.lo, a.hi, per)) {
      if (lane == 0 && !a.write)
        mismatch(i, a.gate, a.verdict);
      continue;
    }
    const uint64_t pieces = n ? (n + KVT_PL_CHECKSUM_BLOCK - 1) / KVT_PL_CHECKSUM_BLOCK : 1;
    const uint64_t h = wide ? digest_hash<4>(a.digests + gk * per, pieces)
                            : digest_hash<1>(a.digests + gk * per, pieces);
    if (lane != 0)
      continue;
    if (a.write)
      *reinterpret_cast<uint64_t *>(e + KVT_PL_ENTRY_CHECKSUM) = h;
    else if (kvt_xxh3::rd64(e + KVT_PL_ENTRY_CHECKSUM) != h)
      mismatch(i, a.gate, a.verdict);
  }
  if (a0.done && nctas == 1) {
    /* Every mismatch written (each fenced by its writer) before the
     * barrier; each done after a fence of its own writer. */
    __syncthreads();
    for (uint32_t k = threadIdx.x; k < npay; k += nthreads) {
      const kvt_gpu_sections a = payload_of(a0, items, k);
      if (a.verdict) {
        __threadfence_system();
        *reinterpret_cast<volatile uint32_t *>(a.verdict + KVT_GPU_VERDICT_DONE) = 1;
      }
    }
  }
}

/* Format 2: the XXH3-64 of piece b of section a.first + blockIdx.y of
 * payload blockIdx.z into a.digests[(blockIdx.z * a.count + blockIdx.y) *
 * per + b]; 32 groups of 4 lanes per CTA, one piece each. Verify: block
 * (0, 0) of each payload first resets its gate. With a.counter, the last
 * CTA to finish then combines every section (threadFenceReduction's
 * pattern: the digests are fenced before the count) and zeroes the counter:
 * one launch instead of two per piece of a staged transfer. */
template <bool B>
__global__ void __launch_bounds__(128, 4)
    pieces_kernel(const kvt_gpu_sections a0, const sec_batch<B> items, uint64_t per) {
  const kvt_gpu_sections a = payload_of(a0, items, blockIdx.z);
  if (!a.write && a.gate && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0)
    *a.gate = ~0u;
  const uint64_t b = (uint64_t)blockIdx.x * 32 + threadIdx.x / 4;
  const int q = threadIdx.x & 3;
  const unsigned gmask = 0xFu << (threadIdx.x & 28);
  const uint8_t *e = a.table + HDR_FIXED + SEC_ENTRY * (uint64_t)(a.first + blockIdx.y);
  const uint64_t off = kvt_xxh3::rd64(e + KVT_PL_ENTRY_OFFSET);
  const uint64_t n = kvt_xxh3::rd64(e + KVT_PL_ENTRY_STORED);
  const uint64_t start = b * KVT_PL_CHECKSUM_BLOCK;
  /* the same for the group's 4 lanes */
  if (b < per && (b == 0 || start < n) && section_fits(off, n, a.lo, a.hi, per)) {
    const uint64_t take =
        n - start < KVT_PL_CHECKSUM_BLOCK ? n - start : KVT_PL_CHECKSUM_BLOCK;
    const uint64_t h = piece_hash(a.body + off + start, take, q, gmask);
    if (q == 0) /* little-endian, as the format's */
      a.digests[((uint64_t)blockIdx.z * a.count + blockIdx.y) * per + b] = h;
  }
  if (!a.counter)
    return;
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0)
    last = atomicAdd(a.counter, 1u) == gridDim.x * gridDim.y * gridDim.z - 1;
  __syncthreads();
  if (!last)
    return;
  __threadfence();
  combine_sections(a0, items, gridDim.z, per, blockDim.x, 0, 1);
  if (threadIdx.x == 0)
    *a.counter = 0;
}

/* Format 2, without a counter: the CTAs of the grid combine
 * (combine_sections), a segment of 8 lanes or a warp per section. */
template <bool B>
__global__ void __launch_bounds__(COMBINE_THREADS)
    combine_kernel(const kvt_gpu_sections a, const sec_batch<B> items, uint32_t npay,
                   uint64_t per) {
  combine_sections(a, items, npay, per, COMBINE_THREADS, blockIdx.x, gridDim.x);
}

/* After a combine of several CTAs: every payload's verdict done. */
template <bool B>
__global__ void done_kernel(const kvt_gpu_sections a0, const sec_batch<B> items,
                            uint32_t npay) {
  for (uint32_t k = threadIdx.x; k < npay; k += blockDim.x) {
    const kvt_gpu_sections a = payload_of(a0, items, k);
    if (a.verdict) {
      __threadfence_system();
      *reinterpret_cast<volatile uint32_t *>(a.verdict + KVT_GPU_VERDICT_DONE) = 1;
    }
  }
}

/* Pieces per section for sections of at most max_stored bytes. */
static uint64_t pieces_per(uint64_t max_stored) {
  return max_stored ? (max_stored + KVT_PL_CHECKSUM_BLOCK - 1) / KVT_PL_CHECKSUM_BLOCK : 1;
}

extern "C" uint64_t kvt_gpurt_digest_words(uint32_t count, uint64_t max_stored) {
  return (uint64_t)count * pieces_per(max_stored);
}

/* Marks a verdict done (format 1: its checks have no single last kernel). */
__global__ void verdict_done_kernel(uint32_t *verdict) {
  __threadfence_system();
  *reinterpret_cast<volatile uint32_t *>(verdict + KVT_GPU_VERDICT_DONE) = 1;
}

template <bool B>
static int launch_sections(const kvt_gpu_sections *a, const sec_batch<B> &items, uint32_t npay,
                           cudaStream_t s) {
  if (a->major < 2) {
    if constexpr (B)
      return (int)cudaErrorInvalidValue; /* format 1 is read one payload at a time */
    cudaError_t e = cudaSuccess;
    if (!a->write && a->gate && (e = cudaMemsetAsync(a->gate, 0xFF, 4, s)) != cudaSuccess)
      return (int)e;
    const unsigned blocks = (a->count * 8 + 127) / 128;
    sections_hash_kernel<<<blocks, 128, 0, s>>>(a->table, a->body, a->lo, a->hi, a->first,
                                                a->count, a->write, a->gate, a->verdict,
                                                a->check_header, a->expect_header);
    if (a->verdict && a->done)
      verdict_done_kernel<<<1, 1, 0, s>>>(a->verdict);
    return (int)cudaGetLastError();
  }
  const uint64_t per = pieces_per(a->max_stored);
  const uint64_t sections = (uint64_t)npay * a->count;
  /* The last CTA's combine takes its 4 warps through the sections in turn:
   * more than 8 sections of over SEGMENT_PIECES pieces (a warp each, 4 at
   * a time), or more than COMBINE_APART pieces in all, are combined by a
   * kernel of their own, 2 (big) or 8 sections a CTA, in parallel. (An
   * int4 payload of 4096 tokens, 64 sections of 640 pieces: verified at
   * 0.42 of a D2D copy with the last CTA's combine on an H200.) */
  kvt_gpu_sections b = *a;
  if (sections * per > COMBINE_APART || (per > SEGMENT_PIECES && sections > 8))
    b.counter = nullptr;
  const dim3 grid((unsigned)((per + 31) / 32), a->count, npay);
  pieces_kernel<B><<<grid, 128, 0, s>>>(b, items, per);
  if (!b.counter) {
    const unsigned per_cta = COMBINE_THREADS / (per > SEGMENT_PIECES ? 32 : 8);
    const unsigned ctas = (unsigned)((sections + per_cta - 1) / per_cta);
    combine_kernel<B><<<ctas, COMBINE_THREADS, 0, s>>>(b, items, npay, per);
    if (ctas > 1 && b.done)
      done_kernel<B><<<1, 64, 0, s>>>(b, items, npay);
  }
  return (int)cudaGetLastError();
}

extern "C" int kvt_gpurt_sections(const kvt_gpu_sections *a, void *stream) {
  const sec_batch<false> none;
  return launch_sections(a, none, 1, static_cast<cudaStream_t>(stream));
}

extern "C" int kvt_gpurt_sections_batch(const kvt_gpu_sections *a,
                                        const kvt_gpu_sec_items *items, void *stream) {
  if (!items)
    return kvt_gpurt_sections(a, stream);
  if (items->n == 0 || items->n > KVT_GPU_BATCH_MAX)
    return (int)cudaErrorInvalidValue;
  sec_batch<true> b;
  b.v = *items;
  return launch_sections(a, b, items->n, static_cast<cudaStream_t>(stream));
}

extern "C" int kvt_gpurt_seal(uint8_t *payload, uint64_t len, uint32_t sections,
                              uint64_t header_size, unsigned major, uint64_t max_stored,
                              uint64_t *digests, void *stream) {
  const kvt_gpu_sections a = {payload, payload, 0,       len,     0,       sections, major, 1,
                              max_stored, digests, nullptr, nullptr, 0, nullptr, 0, 0};
  int e = kvt_gpurt_sections(&a, stream);
  if (e)
    return e;
  header_hash_kernel<<<1, 8, 0, static_cast<cudaStream_t>(stream)>>>(payload, header_size);
  return (int)cudaGetLastError();
}

extern "C" int kvt_gpurt_verify(const uint8_t *payload, uint64_t len, uint32_t first,
                                uint32_t count, unsigned major, uint64_t max_stored,
                                uint64_t *digests, kvt_gpu_status *status,
                                const uint64_t *expect_header, void *stream) {
  const kvt_gpu_sections a = {const_cast<uint8_t *>(payload),
                              payload,
                              0,
                              len,
                              first,
                              count,
                              major,
                              0,
                              max_stored,
                              digests,
                              &status->bad_section,
                              nullptr,
                              0,
                              nullptr,
                              expect_header != nullptr,
                              expect_header ? *expect_header : 0};
  return kvt_gpurt_sections(&a, stream);
}
