/* gpu/gpu_checksum.cu - section checksums of payloads in device memory:
 * sealing a payload the store kernel wrote (section checksums into the
 * table, then the header checksum) and verifying the loaded sections before
 * the load kernel trusts a device payload.
 *
 * Format 2 (serde/FORMAT.md section 3): every 4 KiB piece of every section is
 * hashed by its own group of 8 lanes (pieces_kernel), then one group per
 * section hashes the section's digests (combine_kernel). Format 1 (reading
 * old payloads): one group of 8 lanes per section, sequential within it, as
 * XXH3 of the whole section must be (50-110 GB/s on an H200). */
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

/* XXH3-64 of one checksum piece (len <= KVT_PL_CHECKSUM_BLOCK) by a group of
 * 8 lanes: kvt_xxh3::hash_long's arithmetic in a compact form (one 1 KiB
 * block per loop trip, 16 reads in flight per lane), so the kernel keeps
 * few registers and little code: with hash_long's unrolled 4 KiB reads it
 * ran at 12% occupancy, stalled on instruction fetch. */
__device__ uint64_t piece_hash(const uint8_t *in, uint64_t len, int lane, unsigned gmask) {
  using namespace kvt_xxh3;
  if (len <= 240) {
    uint64_t h = lane == 0 ? hash_short(in, len) : 0;
    return __shfl_sync(gmask, h, 0, 8);
  }
  const uint64_t init[8] = {P32_3, P64_1, P64_2, P64_3, P64_4, P32_2, P64_5, P32_1};
  uint64_t acc = init[lane];
  const int nblocks = (int)((len - 1) / 1024); /* 0..3 */
#pragma unroll 1
  for (int b = 0; b < nblocks; b++) {
    uint64_t v[16];
#pragma unroll
    for (int n = 0; n < 16; n++)
      v[n] = rd64(in + 1024 * b + 64 * n + 8 * lane);
#pragma unroll
    for (int n = 0; n < 16; n++)
      stripe_word(acc, v[n], 8 * n, lane, gmask);
    scramble(acc, lane);
  }
  const int stripes = (int)(((len - 1) - 1024 * (uint64_t)nblocks) / 64);
  const uint8_t *tail = in + 1024 * nblocks + 8 * lane;
  uint64_t v[16];
#pragma unroll
  for (int n = 0; n < 15; n++)
    v[n] = n < stripes ? rd64(tail + 64 * n) : 0;
  v[15] = rd64(in + len - 64 + 8 * lane);
#pragma unroll
  for (int n = 0; n < 15; n++)
    if (n < stripes)
      stripe_word(acc, v[n], 8 * n, lane, gmask);
  stripe_word(acc, v[15], 192 - 64 - 7, lane, gmask);
  return finish_long(acc, len, lane, gmask);
}

#define COMBINE_THREADS 256

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

/* Format 2: threads [0, nthreads) of a CTA, a group of 8 lanes per
 * section, hash the pieces' digests of sections [a.first, a.first +
 * a.count) of each of the `npay` payloads (digests of payload k's section
 * g at (k * a.count + g) * per) into their checksums: written (seal) or
 * compared (verify). Then, with verdicts and a.done, mark them done: every
 * check of the load is complete (this is its last). Every thread of the CTA
 * calls it. */
template <bool B>
__device__ void combine_sections(const kvt_gpu_sections &a0, const sec_batch<B> &items,
                                 uint32_t npay, uint64_t per, unsigned nthreads) {
  const int lane = threadIdx.x & 7;
  const unsigned gmask = 0xFFu << (threadIdx.x & 24);
  for (uint32_t k = threadIdx.x; k < npay; k += nthreads) {
    const kvt_gpu_sections a = payload_of(a0, items, k);
    if (a.check_header && kvt_xxh3::rd64(a.table + KVT_PL_HEADER_CHECKSUM) != a.expect_header)
      mismatch(KVT_GPU_BAD_HEADER, a.gate, a.verdict);
  }
  const uint64_t all = (uint64_t)npay * a0.count;
  for (uint64_t gk = threadIdx.x / 8; gk < all; gk += nthreads / 8) {
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
    const uint64_t h = group_hash(reinterpret_cast<const uint8_t *>(a.digests + gk * per),
                                  8 * pieces, lane, gmask);
    if (lane != 0)
      continue;
    if (a.write)
      *reinterpret_cast<uint64_t *>(e + KVT_PL_ENTRY_CHECKSUM) = h;
    else if (kvt_xxh3::rd64(e + KVT_PL_ENTRY_CHECKSUM) != h)
      mismatch(i, a.gate, a.verdict);
  }
  if (a0.done) {
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
 * per + b]; 16 groups of 8 lanes per CTA, one piece each. Verify: block
 * (0, 0) of each payload first resets its gate. With a.counter, the last
 * CTA to finish then combines every section (threadFenceReduction's
 * pattern: the digests are fenced before the count) and zeroes the counter:
 * one launch instead of two per piece of a staged transfer. */
template <bool B>
__global__ void __launch_bounds__(128)
    pieces_kernel(const kvt_gpu_sections a0, const sec_batch<B> items, uint64_t per) {
  const kvt_gpu_sections a = payload_of(a0, items, blockIdx.z);
  if (!a.write && a.gate && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0)
    *a.gate = ~0u;
  const uint64_t b = (uint64_t)blockIdx.x * 16 + threadIdx.x / 8;
  const int lane = threadIdx.x & 7;
  const unsigned gmask = 0xFFu << (threadIdx.x & 24);
  const uint8_t *e = a.table + HDR_FIXED + SEC_ENTRY * (uint64_t)(a.first + blockIdx.y);
  const uint64_t off = kvt_xxh3::rd64(e + KVT_PL_ENTRY_OFFSET);
  const uint64_t n = kvt_xxh3::rd64(e + KVT_PL_ENTRY_STORED);
  const uint64_t start = b * KVT_PL_CHECKSUM_BLOCK;
  /* the same for the group's 8 lanes */
  if (b < per && (b == 0 || start < n) && section_fits(off, n, a.lo, a.hi, per)) {
    const uint64_t take =
        n - start < KVT_PL_CHECKSUM_BLOCK ? n - start : KVT_PL_CHECKSUM_BLOCK;
    const uint64_t h = piece_hash(a.body + off + start, take, lane, gmask);
    if (lane == 0) /* little-endian, as the format's */
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
  combine_sections(a0, items, gridDim.z, per, blockDim.x);
  if (threadIdx.x == 0)
    *a.counter = 0;
}

/* Format 2, without a counter: one CTA combines (combine_sections). */
template <bool B>
__global__ void __launch_bounds__(COMBINE_THREADS)
    combine_kernel(const kvt_gpu_sections a, const sec_batch<B> items, uint32_t npay,
                   uint64_t per) {
  combine_sections(a, items, npay, per, COMBINE_THREADS);
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
  const dim3 grid((unsigned)((per + 15) / 16), a->count, npay);
  pieces_kernel<B><<<grid, 128, 0, s>>>(*a, items, per);
  if (!a->counter)
    combine_kernel<B><<<1, COMBINE_THREADS, 0, s>>>(*a, items, npay, per);
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
