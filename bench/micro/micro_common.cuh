// bench/micro/micro_common.cuh - what the read-pattern microbenchmarks share:
// a 1 GiB source and a 1 GiB scratch buffer, the device-to-device copy
// bandwidth they are compared with, and the median of 12 timed runs with L2
// flushed (a 256 MiB memset) before each. Header-only: each benchmark is one
// nvcc command.
#ifndef KVT_MICRO_COMMON_CUH
#define KVT_MICRO_COMMON_CUH
#include <algorithm>
#include <cstdio>
#include <cuda_runtime.h>
#include <vector>

struct micro {
  size_t bytes;
  unsigned char *buf, *dst; // the data read; scratch (copy target, L2 flush)
  unsigned *sink;           // keeps the reads from being optimised away
  cudaEvent_t e0, e1;
  int sms;
  double copy; // cudaMemcpy D2D of `bytes`, read + write bytes per second
};

// Median milliseconds of 12 runs of run(); FLUSH: L2 flushed before each.
template <bool FLUSH, class F> float micro_median_ms(micro &m, F run) {
  std::vector<float> t;
  for (int i = 0; i < 12; i++) {
    if (FLUSH)
      cudaMemset(m.dst, 0, 256 << 20);
    cudaEventRecord(m.e0);
    run();
    cudaEventRecord(m.e1);
    cudaEventSynchronize(m.e1);
    float ms;
    cudaEventElapsedTime(&ms, m.e0, m.e1);
    t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  return t[6];
}

// Allocates 1 GiB to read (all bytes 1) and 1 GiB of scratch, measures and
// prints the copy bandwidth.
static micro micro_init() {
  micro m;
  m.bytes = 1ull << 30;
  cudaMalloc(&m.buf, m.bytes);
  cudaMalloc(&m.dst, m.bytes);
  cudaMalloc(&m.sink, 4);
  cudaMemset(m.buf, 1, m.bytes);
  cudaEventCreate(&m.e0);
  cudaEventCreate(&m.e1);
  cudaDeviceGetAttribute(&m.sms, cudaDevAttrMultiProcessorCount, 0);
  const float ms = micro_median_ms<false>(m, [&] {
    cudaMemcpy(m.dst, m.buf, m.bytes, cudaMemcpyDeviceToDevice);
  });
  m.copy = 2.0 * m.bytes / (ms * 1e-3);
  printf("D2D copy: %.1f GB/s (read+write)\n", m.copy / 1e9);
  return m;
}
#endif
