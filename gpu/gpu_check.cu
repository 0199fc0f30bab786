/* gpu/gpu_check.cu - CUDA's element conversions over bit-pattern ranges, for
 * the CPU-versus-GPU agreement test (tests/test_gpu_convert.c). Never aborts:
 * CUDA errors come back as -EIO with the CUDA error string. */
#include <errno.h>
#include <stdio.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "kvt_gpu_check.h"

struct kvt_gpu_check {
  size_t batch;
  void *dev_out;
  cudaStream_t stream;
};

static int cuda_fail(cudaError_t e, const char *what, char *err, size_t errlen) {
  if (err && errlen)
    snprintf(err, errlen, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
  return e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver ? -ENODEV : -EIO;
}

__global__ void conv_kernel(int conv, uint32_t first, size_t n, void *out) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (; i < n; i += stride) {
    float x = __uint_as_float(first + (uint32_t)i);
    switch (conv) {
    case KVT_GPU_CONV_E4M3:
      ((uint8_t *)out)[i] = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
      break;
    case KVT_GPU_CONV_BF16_RN:
      ((uint16_t *)out)[i] = __bfloat16_as_ushort(__float2bfloat16_rn(x));
      break;
    case KVT_GPU_CONV_F16_RN:
      ((uint16_t *)out)[i] = __half_as_ushort(__float2half_rn(x));
      break;
    case KVT_GPU_CONV_F16_RD:
      ((uint16_t *)out)[i] = __half_as_ushort(__float2half_rd(x));
      break;
    default:
      ((uint16_t *)out)[i] = __half_as_ushort(__float2half_ru(x));
      break;
    }
  }
}

__global__ void e4m3_decode_kernel(float *out) {
  int i = threadIdx.x;
  __nv_fp8_e4m3 v;
  v.__x = (__nv_fp8_storage_t)i;
  out[i] = (float)v;
}

extern "C" int kvt_gpu_check_create(size_t batch, kvt_gpu_check **out, char *err,
                                    size_t errlen) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    if (err && errlen)
      snprintf(err, errlen, "no CUDA device: %s", e ? cudaGetErrorString(e) : "count is 0");
    return -ENODEV;
  }
  kvt_gpu_check *g = (kvt_gpu_check *)calloc(1, sizeof(*g));
  if (!g)
    return -ENOMEM;
  g->batch = batch;
  if ((e = cudaMalloc(&g->dev_out, batch * 2)) != cudaSuccess) {
    free(g);
    return cuda_fail(e, "cudaMalloc", err, errlen);
  }
  if ((e = cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking)) != cudaSuccess) {
    cudaFree(g->dev_out);
    free(g);
    return cuda_fail(e, "cudaStreamCreate", err, errlen);
  }
  *out = g;
  return 0;
}

extern "C" void kvt_gpu_check_destroy(kvt_gpu_check *g) {
  if (!g)
    return;
  cudaStreamDestroy(g->stream);
  cudaFree(g->dev_out);
  free(g);
}

extern "C" int kvt_gpu_check_run(kvt_gpu_check *g, int conv, uint32_t first, size_t n,
                                 void *out, char *err, size_t errlen) {
  if (n > g->batch)
    return -EINVAL;
  size_t bytes = n * (conv == KVT_GPU_CONV_E4M3 ? 1 : 2);
  conv_kernel<<<1024, 256, 0, g->stream>>>(conv, first, n, g->dev_out);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    return cuda_fail(e, "conv_kernel launch", err, errlen);
  if ((e = cudaMemcpyAsync(out, g->dev_out, bytes, cudaMemcpyDeviceToHost, g->stream)) !=
      cudaSuccess)
    return cuda_fail(e, "cudaMemcpyAsync", err, errlen);
  if ((e = cudaStreamSynchronize(g->stream)) != cudaSuccess)
    return cuda_fail(e, "cudaStreamSynchronize", err, errlen);
  return 0;
}

extern "C" int kvt_gpu_check_e4m3_decode(kvt_gpu_check *g, float out[256], char *err,
                                         size_t errlen) {
  e4m3_decode_kernel<<<1, 256, 0, g->stream>>>((float *)g->dev_out);
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(out, g->dev_out, 256 * sizeof(float), cudaMemcpyDeviceToHost, g->stream);
  if (e == cudaSuccess)
    e = cudaStreamSynchronize(g->stream);
  return e == cudaSuccess ? 0 : cuda_fail(e, "e4m3 decode", err, errlen);
}
