/* gpu/kvt_gpu_check.h - GPU-side element conversions, run to prove the CPU
 * reference codec (codec/convert.c) gives the same bytes as CUDA's own
 * conversions. The fused store/load kernels of later work build on exactly
 * these intrinsics, so this agreement is what makes them bit-exact with the
 * CPU codec. Internal: not installed. Plain C interface; no CUDA types. */
#ifndef KVT_GPU_CHECK_H
#define KVT_GPU_CHECK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Which conversion to run over consecutive fp32 bit patterns. */
enum kvt_gpu_conv {
  KVT_GPU_CONV_E4M3 = 0,    /* __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) */
  KVT_GPU_CONV_BF16_RN = 1, /* __float2bfloat16_rn */
  KVT_GPU_CONV_F16_RN = 2,  /* __float2half_rn */
  KVT_GPU_CONV_F16_RD = 3,  /* __float2half_rd */
  KVT_GPU_CONV_F16_RU = 4   /* __float2half_ru */
};

/* Opaque GPU session: device buffers and a stream. */
typedef struct kvt_gpu_check kvt_gpu_check;

/* Creates a session for batches of up to `batch` inputs. Returns 0, -ENODEV
 * when no CUDA device is usable, or -EIO with the CUDA error in err. */
int kvt_gpu_check_create(size_t batch, kvt_gpu_check **out, char *err, size_t errlen);
void kvt_gpu_check_destroy(kvt_gpu_check *g);

/* Converts the fp32 values whose bit patterns are first, first+1, ...,
 * first+n-1 (n <= batch) on the GPU and copies the results to host `out`
 * (n bytes for E4M3, n uint16 for the others). Returns 0 or -EIO. */
int kvt_gpu_check_run(kvt_gpu_check *g, int conv, uint32_t first, size_t n, void *out,
                      char *err, size_t errlen);

/* Decodes all 256 e4m3 codes to fp32 with CUDA's conversion. */
int kvt_gpu_check_e4m3_decode(kvt_gpu_check *g, float out[256], char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
