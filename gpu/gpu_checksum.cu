/* gpu/gpu_checksum.cu - XXH3-64 checksums of payloads in device memory:
 * sealing a payload the store kernel wrote (section checksums into the
 * table, then the header checksum) and verifying the loaded sections before
 * the load kernel trusts a device payload. One group of 8 lanes per section:
 * XXH3 is sequential within a section, so these run at 50-110 GB/s on an
 * H200, far below the load and store kernels (gpu_kernels.cu). */
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

/* One group of 8 lanes per section: write (seal) or compare (verify). */
__global__ void sections_hash_kernel(uint8_t *payload, uint32_t first, uint32_t count, int write,
                                     kvt_gpu_status *st) {
  const uint32_t g = (blockIdx.x * blockDim.x + threadIdx.x) / 8;
  const int lane = threadIdx.x & 7;
  const unsigned gmask = 0xFFu << (threadIdx.x & 24);
  if (g >= count) /* the group's 8 lanes leave together */
    return;
  const uint32_t i = first + g;
  uint8_t *e = payload + HDR_FIXED + SEC_ENTRY * (uint64_t)i;
  const uint64_t off = kvt_xxh3::rd64(e + KVT_PL_ENTRY_OFFSET);
  const uint64_t n = kvt_xxh3::rd64(e + KVT_PL_ENTRY_STORED);
  const uint64_t h = group_hash(payload + off, n, lane, gmask);
  if (lane != 0)
    return;
  if (write)
    *reinterpret_cast<uint64_t *>(e + KVT_PL_ENTRY_CHECKSUM) = h; /* entries are 16-aligned */
  else if (kvt_xxh3::rd64(e + KVT_PL_ENTRY_CHECKSUM) != h)
    atomicMin(&st->bad_section, i);
}

/* The header checksum, after the section checksums are in the table. */
__global__ void header_hash_kernel(uint8_t *payload, uint64_t header_size) {
  const int lane = threadIdx.x & 7;
  const uint64_t h = group_hash(payload, header_size, lane, 0xFFu);
  if (lane == 0)
    *reinterpret_cast<uint64_t *>(payload + KVT_PL_HEADER_CHECKSUM) = h;
}

extern "C" int kvt_gpurt_seal(uint8_t *payload, uint32_t sections, uint64_t header_size,
                              void *stream) {
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  const unsigned blocks = (sections * 8 + 127) / 128;
  sections_hash_kernel<<<blocks, 128, 0, st>>>(payload, 0, sections, 1, nullptr);
  header_hash_kernel<<<1, 8, 0, st>>>(payload, header_size);
  return (int)cudaGetLastError();
}

extern "C" int kvt_gpurt_verify(const uint8_t *payload, uint32_t first, uint32_t count,
                                kvt_gpu_status *status, void *stream) {
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  cudaError_t e = cudaMemsetAsync(&status->bad_section, 0xFF, sizeof(uint32_t), st);
  if (e != cudaSuccess)
    return (int)e;
  const unsigned blocks = (count * 8 + 127) / 128;
  sections_hash_kernel<<<blocks, 128, 0, st>>>(const_cast<uint8_t *>(payload), first, count, 0,
                                               status);
  return (int)cudaGetLastError();
}
