// bench/micro/read_l2hint.cu - a read-pattern microbenchmark behind docs/ATTENTION.md
// (not built by CMake). Run on the GPU machine:
//   nvcc -arch=sm_90 -O3 -o read_l2hint bench/micro/read_l2hint.cu && ./read_l2hint
// Does an L2 fetch-size hint fix reads of half lines? C bytes of every
// R-byte row, one CTA per (row range, column); MODE 0 plain ld.global.nc,
// 1 with .L2::128B, 2 with .L2::256B. SPLIT: a row's C bytes are read by
// C/32 lanes in two instructions (units u and u + C/32), as the decode
// kernel's fp8 loads do.
#include "micro_common.cuh"
template <int MODE>
__device__ __forceinline__ uint4 ld16(const void *p) {
  uint4 v;
  if (MODE == 0)
    asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  else if (MODE == 1)
    asm volatile("ld.global.nc.L2::128B.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  else
    asm volatile("ld.global.nc.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
template <int MODE, bool SPLIT>
__global__ void rd(const unsigned char *base, long rows, int C, int R, long rows_per, unsigned *sink) {
  const int h = blockIdx.y;
  const long r0 = blockIdx.x * rows_per;
  const long r1 = min(rows, r0 + rows_per);
  const int tpr = SPLIT ? C / 32 : C / 16;
  const int rpi = blockDim.x / tpr;
  const int tr = threadIdx.x / tpr, tc = threadIdx.x % tpr;
  unsigned acc = 0;
  for (long r = r0 + tr; r < r1; r += 2 * rpi) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 2; u++) {
      long rr = r + u * rpi;
      if (rr < r1) {
        const unsigned char *row = base + rr * R + h * C;
        if (SPLIT) {
          v[2 * u] = ld16<MODE>(row + tc * 16);
          v[2 * u + 1] = ld16<MODE>(row + (tc + tpr) * 16);
        } else {
          v[2 * u] = ld16<MODE>(row + tc * 16);
          v[2 * u + 1] = make_uint4(0, 0, 0, 0);
        }
      } else v[2 * u] = v[2 * u + 1] = make_uint4(0, 0, 0, 0);
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
  struct cfg { int C, R, mode; bool split; const char *what; } cfgs[] = {
    {64, 512, 0, false, "64 B of 512 B rows, full 64 B per instruction"},
    {64, 512, 1, false, "  same, .L2::128B"},
    {64, 512, 2, false, "  same, .L2::256B"},
    {128, 1024, 0, true, "128 B of 1024 B rows, 64 B halves in 2 instructions (fp8 K)"},
    {128, 1024, 1, true, "  same, .L2::128B"},
    {128, 1024, 2, true, "  same, .L2::256B"},
    {128, 1024, 0, false, "128 B of 1024 B rows, whole lines per instruction"},
    {256, 2048, 0, true, "256 B of 2048 B rows, 128 B halves (k16 K)"},
    {256, 2048, 1, true, "  same, .L2::128B"},
    {256, 2048, 2, true, "  same, .L2::256B"},
  };
  for (auto c : cfgs) {
    const long rows = bytes / c.R;
    const int heads = c.R / c.C;
    long splits = std::max(1L, (long)sms * 4 / heads);
    long rows_per = (rows + splits - 1) / splits;
    dim3 grid(splits, heads);
    const float ms = micro_median_ms<true>(m, [&] {
      if (c.split) {
        if (c.mode == 0) rd<0, true><<<grid, 128>>>(buf, rows, c.C, c.R, rows_per, sink);
        else if (c.mode == 1) rd<1, true><<<grid, 128>>>(buf, rows, c.C, c.R, rows_per, sink);
        else rd<2, true><<<grid, 128>>>(buf, rows, c.C, c.R, rows_per, sink);
      } else {
        if (c.mode == 0) rd<0, false><<<grid, 128>>>(buf, rows, c.C, c.R, rows_per, sink);
        else if (c.mode == 1) rd<1, false><<<grid, 128>>>(buf, rows, c.C, c.R, rows_per, sink);
        else rd<2, false><<<grid, 128>>>(buf, rows, c.C, c.R, rows_per, sink);
      }
    });
    const double bw = bytes / (ms * 1e-3) / 1e9;
    printf("%-64s %7.1f GB/s = %.2f of copy\n", c.what, bw, bw / copy);
  }
  printf("%s\n", cudaGetErrorString(cudaGetLastError()));
}
