// bench/micro/read_cpasync.cu - a read-pattern microbenchmark behind docs/ATTENTION.md
// (not built by CMake). Run on the GPU machine:
//   nvcc -arch=sm_90 -O3 -o read_cpasync bench/micro/read_cpasync.cu && ./read_cpasync
// Is cp.async the limit? Each warp streams tiles of 16 rows x 128 B (rows
// R bytes apart, column h of the CTA) through NS shared-memory stages, as
// the INT4 decode does, and touches one word per stage. MODE 0: cp.async.cg
// 16 B per lane; 1: ld.global.nc 16 B per lane into registers, then st.shared;
// 2: ld.global.nc only (no shared memory).
#include "micro_common.cuh"
#define NS 4
__device__ __forceinline__ void cpa(void *s, const void *g) {
  unsigned sa = (unsigned)__cvta_generic_to_shared(s);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(sa), "l"(g) : "memory");
}
template <int MODE>
__global__ void __launch_bounds__(128, 4) stream(const unsigned char *base, long tiles_per_col, int R, int C, int tiles_per_cta, unsigned *sink) {
  __shared__ __align__(16) unsigned char sm[4][NS][16 * 128];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int h = blockIdx.y;
  const long t0 = (long)blockIdx.x * tiles_per_cta;
  unsigned acc = 0;
  const int nt = tiles_per_cta / 4; // tiles of this warp: t0 + warp + 4k
  auto src = [&](int k, int i) { // chunk i (0..3) of this lane in tile k
    long tile = t0 + warp + 4L * k;
    int r = lane / 8 + 4 * i, c = lane % 8;
    return base + (tile * 16 + r) * (long)R + h * C + c * 16;
  };
  auto dst = [&](int s, int i) { int r = lane / 8 + 4 * i, c = lane % 8; return &sm[warp][s][r * 128 + c * 16]; };
  if (MODE == 0) {
    for (int k = 0; k < NS - 1; k++) { if (k < nt) for (int i = 0; i < 4; i++) cpa(dst(k, i), src(k, i)); asm volatile("cp.async.commit_group;\n" ::: "memory"); }
    for (int k = 0; k < nt; k++) {
      int kn = k + NS - 1;
      if (kn < nt) for (int i = 0; i < 4; i++) cpa(dst(kn % NS, i), src(kn, i));
      asm volatile("cp.async.commit_group;\n" ::: "memory");
      asm volatile("cp.async.wait_group %0;\n" ::"n"(NS - 1) : "memory");
      __syncwarp();
      acc ^= *(volatile unsigned *)&sm[warp][k % NS][lane * 4];
      __syncwarp();
    }
  } else if (MODE == 1) {
    uint4 v[NS - 1][4];
    for (int k = 0; k < NS - 1; k++) if (k < nt) for (int i = 0; i < 4; i++) v[k][i] = __ldg((const uint4 *)src(k, i));
    for (int k = 0; k < nt; k += NS - 1) {
#pragma unroll
      for (int j = 0; j < NS - 1; j++) {
        if (k + j < nt) {
          for (int i = 0; i < 4; i++) *(uint4 *)dst(j, i) = v[j][i];
          int kn = k + j + NS - 1;
          if (kn < nt) for (int i = 0; i < 4; i++) v[j][i] = __ldg((const uint4 *)src(kn, i));
          __syncwarp();
          acc ^= *(volatile unsigned *)&sm[warp][j][lane * 4];
          __syncwarp();
        }
      }
    }
  } else {
    uint4 v[NS - 1][4];
    for (int k = 0; k < NS - 1; k++) if (k < nt) for (int i = 0; i < 4; i++) v[k][i] = __ldg((const uint4 *)src(k, i));
    for (int k = 0; k < nt; k += NS - 1) {
#pragma unroll
      for (int j = 0; j < NS - 1; j++) {
        if (k + j < nt) {
          for (int i = 0; i < 4; i++) acc ^= v[j][i].x ^ v[j][i].w;
          int kn = k + j + NS - 1;
          if (kn < nt) for (int i = 0; i < 4; i++) v[j][i] = __ldg((const uint4 *)src(kn, i));
        }
      }
    }
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
  for (int R : {128, 512, 1024}) {
    const int C = 128, cols = R / C;
    const long rows = bytes / R, tiles = rows / 16;
    // CTAs: 4 per SM
    long ctas_per_col = std::max(1L, (long)sms * 4 / cols);
    int tpc = (int)(tiles / ctas_per_col) / 4 * 4;
    dim3 grid(ctas_per_col, cols);
    for (int mode = 0; mode < 3; mode++) {
      const float ms = micro_median_ms<true>(m, [&] {
        if (mode == 0) stream<0><<<grid, 128>>>(buf, tiles, R, C, tpc, sink);
        else if (mode == 1) stream<1><<<grid, 128>>>(buf, tiles, R, C, tpc, sink);
        else stream<2><<<grid, 128>>>(buf, tiles, R, C, tpc, sink);
      });
      const double rd = (double)ctas_per_col * cols * tpc * 16 * 128;
      const double bw = rd / (ms * 1e-3) / 1e9;
      printf("rows of %4d B, 128 B each, %s: %.1f GB/s = %.2f of copy\n", R, mode == 0 ? "cp.async.cg      " : mode == 1 ? "ldg + st.shared  " : "ldg to registers ", bw, bw / copy);
    }
  }
  printf("%s\n", cudaGetErrorString(cudaGetLastError()));
}
