/* bench/micro/racecheck_named_bar.cu - not a benchmark: the smallest kernel
 * that shows compute-sanitizer racecheck reporting hazards that are not
 * there, in the pattern of the INT4 decode kernel (gpu/attn_int4.cuh).
 *
 * Two pairs of warps each hand a double-buffered stage over with a named
 * barrier (bar.sync 1 or 2, 64 threads), the copies by cp.async or plain
 * stores; then __syncthreads() and the stages are reused for an epilogue.
 * Every shared access is ordered. With both pairs running the same number
 * of hand-offs racecheck reports nothing; when one pair runs 3 fewer (as
 * INT4 pairs do when their tile counts differ) it reports the epilogue's
 * writes and reads after __syncthreads() (H200, CUDA 13, 2026-11-21:
 * "RACECHECK SUMMARY: 2 hazards", lines of the epilogue).
 *
 *   nvcc -arch=sm_90 -O3 -lineinfo -o racecheck_named_bar racecheck_named_bar.cu
 *   compute-sanitizer --tool racecheck ./racecheck_named_bar
 */
#include <cstdio>
#include <cstdint>
__device__ __forceinline__ void bar_pair(int pair) {
  if (pair == 0) asm volatile("bar.sync 1, 64;\n" ::: "memory");
  else asm volatile("bar.sync 2, 64;\n" ::: "memory");
}
template <bool CPASYNC, bool UNEVEN>
__global__ void k(const uint4 *src, float *out, int iters0) {
  __shared__ __align__(16) uint4 st[2][2][2][32]; // [pair][stage][half][lane]
  __shared__ float epi[128];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int pair = warp % 2, hw = warp / 2;
  float acc = 0;
  /* UNEVEN: the two pairs run different numbers of hand-offs, as the decode
   * kernel's pairs do when their tile counts differ */
  const int iters = UNEVEN && pair == 1 ? iters0 - 3 : iters0;
  auto issue = [&](int stage, int i) {
    const uint4 *g = src + (size_t)(i * 2 + hw) * 32 + lane;
    if (CPASYNC) {
      unsigned s = (unsigned)__cvta_generic_to_shared(&st[pair][stage][hw][lane]);
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(g) : "memory");
    } else st[pair][stage][hw][lane] = *g;
  };
  issue(0, 0);
  asm volatile("cp.async.commit_group;\n" ::: "memory");
  for (int i = 0; i < iters; i++) {
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    bar_pair(pair);
    if (i + 1 < iters) issue((i + 1) & 1, i + 1);
    asm volatile("cp.async.commit_group;\n" ::: "memory");
    // both warps read both halves of stage i & 1
    for (int h = 0; h < 2; h++) acc += (float)st[pair][i & 1][h][(lane + 7) % 32].x;
  }
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
  __syncthreads();
  reinterpret_cast<float *>(st)[threadIdx.x] = acc; // reuse the stages
  __syncthreads();
  epi[threadIdx.x] = reinterpret_cast<float *>(st)[127 - threadIdx.x];
  __syncthreads();
  out[blockIdx.x * 128 + threadIdx.x] = epi[(threadIdx.x + 1) % 128];
}
int main() {
  uint4 *src; float *out;
  cudaMalloc(&src, 64 * 2 * 32 * 16); cudaMemset(src, 1, 64 * 2 * 32 * 16);
  cudaMalloc(&out, 4 * 128 * 4);
  k<false, false><<<4, 128>>>(src, out, 64);
  printf("plain st.shared: %s\n", cudaGetErrorString(cudaDeviceSynchronize()));
  k<true, false><<<4, 128>>>(src, out, 64);
  printf("cp.async: %s\n", cudaGetErrorString(cudaDeviceSynchronize()));
  k<true, true><<<4, 128>>>(src, out, 64);
  printf("cp.async, pairs of uneven length: %s\n",
         cudaGetErrorString(cudaDeviceSynchronize()));
  return 0;
}
