// bench/micro/read_strided.cu - a read-pattern microbenchmark behind docs/ATTENTION.md
// (not built by CMake). Run on the GPU machine:
//   nvcc -arch=sm_90 -O3 -o read_strided bench/micro/read_strided.cu && ./read_strided
// Microbenchmark: read C bytes of every R-byte row (column h of R/C), one
// CTA per (row range, column), as the decode kernel's CTAs read one kv head.
#include "micro_common.cuh"
__global__ void rd(const unsigned char *base, long rows, int C, int R, long rows_per,
                   unsigned *sink) {
  const int h = blockIdx.y;
  const long r0 = blockIdx.x * rows_per;
  const long r1 = min(rows, r0 + rows_per);
  const int tpr = C / 16;                 // threads per row
  const int rpi = blockDim.x / tpr;       // rows per pass
  const int tr = threadIdx.x / tpr, tc = threadIdx.x % tpr;
  unsigned acc = 0;
  for (long r = r0 + tr; r < r1; r += 4 * rpi) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; u++) {
      long rr = r + u * rpi;
      if (rr < r1)
        v[u] = __ldg(reinterpret_cast<const uint4 *>(base + rr * R + h * C + tc * 16));
      else
        v[u] = make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < 4; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x12345678u) sink[0] = acc;
}
int main() {
  micro m = micro_init();
  const size_t bytes = m.bytes;
  const unsigned char *buf = m.buf;
  unsigned *sink = m.sink;
  const int sms = m.sms;
  const double copy = m.copy / 1e9; // GB/s
  struct cfg { int C, R, threads; } cfgs[] = {{64, 512, 128}, {128, 1024, 128}, {256, 2048, 128}, {512, 512, 128}, {64, 64, 128}, {64, 512, 256}, {128, 256, 128}};
  for (auto c : cfgs) {
    const long rows = bytes / c.R;
    const int heads = c.R / c.C;
    // CTAs: about 4 per SM, as the decode kernel
    long splits = std::max(1L, (long)sms * 4 / heads);
    long rows_per = (rows + splits - 1) / splits;
    dim3 grid(splits, heads);
    const float ms = micro_median_ms<true>(m, [&] {
      rd<<<grid, c.threads>>>(buf, rows, c.C, c.R, rows_per, sink);
    });
    const double bw = bytes / (ms * 1e-3) / 1e9;
    printf("chunk %4d B of %5d B rows, %3d threads, grid %ldx%d: %.1f GB/s = %.2f of copy\n", c.C, c.R, c.threads, splits, heads, bw, bw / copy);
  }
  printf("%s\n", cudaGetErrorString(cudaGetLastError()));
}
