/* gpu/codec_device.cuh - the codec's quantization arithmetic on the device
 * (serde/FORMAT.md section 4): scales, e4m3, i8 and i4 codes, i4 group
 * parameters. The one place its rounding rules live on the GPU, used by the
 * store kernels (gpu_kernels.cu) and the attention cache writer
 * (attn_append.cuh). Written with explicit round-to-nearest intrinsics
 * (__fmul_rn, __fsub_rn, __fdiv_rn) so nvcc can neither contract into FMA
 * nor approximate a division: each value equals the CPU reference codec's
 * (codec/codec_internal.h) bit for bit. Internal: not installed. */
#ifndef KVT_CODEC_DEVICE_CUH
#define KVT_CODEC_DEVICE_CUH

#include <stdint.h>

#include <cuda_fp16.h>
#include <cuda_fp8.h>

/* Below this amax a row or block quantizes to zero with scale 0 (the same
 * definition as codec_internal.h's, so the two may meet in one unit). */
#define KVT_TINY_AMAX 7.8886090522101181e-31f /* 2^-100 */

/* scale = amax / qmax and its inverse, both 0 for an amax below
 * KVT_TINY_AMAX (or NaN). */
__device__ __forceinline__ void scale_for(float amax, float qmax, float *scale, float *inv) {
  if (!(amax >= KVT_TINY_AMAX)) {
    *scale = 0.0f;
    *inv = 0.0f;
    return;
  }
  *scale = __fdiv_rn(amax, qmax);
  *inv = __fdiv_rn(1.0f, *scale);
}

/* e4m3: x * inv rounded to nearest even, saturating at 448. */
__device__ __forceinline__ uint8_t q_e4m3(float x, float inv) {
  return (uint8_t)__nv_cvt_float_to_fp8(__fmul_rn(x, inv), __NV_SATFINITE, __NV_E4M3);
}

/* i8: x * inv rounded to nearest even, clamped to [-127, 127]. */
__device__ __forceinline__ uint8_t q_i8(float x, float inv) {
  float r = rintf(__fmul_rn(x, inv));
  r = r > 127.0f ? 127.0f : r;
  r = r < -127.0f ? -127.0f : r;
  return (uint8_t)(int8_t)r;
}

/* i4: (x - zero) * inv rounded to nearest even, clamped to [0, 15]. */
__device__ __forceinline__ uint8_t q_i4(float x, float zero, float inv) {
  float r = rintf(__fmul_rn(__fsub_rn(x, zero), inv));
  r = r > 15.0f ? 15.0f : r;
  r = r < 0.0f ? 0.0f : r;
  return (uint8_t)r;
}

/* i4 group parameters from the group's min and max: zero is mn rounded down
 * to fp16, scale (mx - zero) / 15 rounded up to fp16, packed as scale bits
 * | zero bits << 16. CHECK: false when zero or scale does not fit fp16 (the
 * store reports it). Without CHECK (the attention append) such a group gets
 * unspecified codes and the result is always true. */
template <bool CHECK>
__device__ __forceinline__ bool i4_params(float mn, float mx, uint32_t *packed, float *zero,
                                          float *inv) {
  mn = __fadd_rn(mn, 0.0f); /* a zero extreme is +0 whatever its sign */
  mx = __fadd_rn(mx, 0.0f);
  const __half zh = __float2half_rd(mn);
  const float z = __half2float(zh);
  if (CHECK && !isfinite(z))
    return false;
  const __half sh = __float2half_ru(__fdiv_rn(__fsub_rn(mx, z), 15.0f));
  const float s = __half2float(sh);
  if (CHECK && !isfinite(s))
    return false;
  *packed = (uint32_t)__half_as_ushort(sh) | ((uint32_t)__half_as_ushort(zh) << 16);
  *zero = z;
  *inv = s > 0.0f ? __fdiv_rn(1.0f, s) : 0.0f;
  return true;
}

#endif
