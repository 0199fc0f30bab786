/* gpu/gpu_runtime.cu - the CUDA runtime calls gpu/ needs, behind the C
 * wrappers declared in kvt_gpu_layout.h (kvt_gpurt_*), so C code (the GPU
 * API's host half, the hbm tier) never includes a CUDA header. Each returns a cudaError_t as
 * int. The kernels and their launchers are in gpu_kernels.cu. */
#include <cuda_runtime.h>

#include "kvt_gpu_layout.h"

extern "C" const char *kvt_gpurt_error_string(int err) {
  return cudaGetErrorString(static_cast<cudaError_t>(err));
}

extern "C" int kvt_gpurt_device_count(int *n) {
  *n = 0;
  const cudaError_t e = cudaGetDeviceCount(n);
  if (e != cudaSuccess)
    (void)cudaGetLastError(); /* as clear_failed, below */
  return (int)e;
}

extern "C" int kvt_gpurt_pointer(const void *p, int *kind, void **dev) {
  cudaPointerAttributes a;
  cudaError_t e = cudaPointerGetAttributes(&a, p);
  if (e != cudaSuccess)
    return (int)e;
  *dev = a.devicePointer;
  switch (a.type) {
  case cudaMemoryTypeHost:
    *kind = 1; /* KVT_GPU_MEM_PINNED */
    break;
  case cudaMemoryTypeDevice:
  case cudaMemoryTypeManaged:
    *kind = 2; /* KVT_GPU_MEM_DEVICE */
    break;
  default:
    *kind = 0;
    *dev = nullptr;
    break;
  }
  return 0;
}

/* A failed call leaves its error as the thread's last error, which a later
 * launcher's cudaGetLastError() would report as its own: clear it. */
static int clear_failed(cudaError_t e) {
  if (e != cudaSuccess)
    (void)cudaGetLastError();
  return (int)e;
}

extern "C" int kvt_gpurt_host_register(void *p, size_t n) {
  return clear_failed(cudaHostRegister(p, n, cudaHostRegisterPortable | cudaHostRegisterMapped));
}
extern "C" int kvt_gpurt_host_unregister(void *p) { return clear_failed(cudaHostUnregister(p)); }
extern "C" int kvt_gpurt_set_device(int dev) { return clear_failed(cudaSetDevice(dev)); }
extern "C" int kvt_gpurt_copy_default(void *dst, const void *src, size_t n) {
  return (int)cudaMemcpy(dst, src, n, cudaMemcpyDefault);
}

extern "C" int kvt_gpurt_malloc(void **p, size_t n) { return (int)cudaMalloc(p, n); }
extern "C" void kvt_gpurt_free(void *p) { cudaFree(p); }
extern "C" int kvt_gpurt_zero(void *p, size_t n) { return (int)cudaMemset(p, 0, n); }
extern "C" int kvt_gpurt_zero_async(void *p, size_t n, void *stream) {
  return (int)cudaMemsetAsync(p, 0, n, static_cast<cudaStream_t>(stream));
}

extern "C" int kvt_gpurt_copy_h2d(void *dst, const void *src, size_t n) {
  return (int)cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice);
}

extern "C" int kvt_gpurt_copy_d2h(void *dst, const void *src, size_t n) {
  return (int)cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost);
}

extern "C" int kvt_gpurt_sync(void *stream) {
  return (int)cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
}

extern "C" int kvt_gpurt_event_record(void *event, void *stream) {
  return (int)cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream));
}

extern "C" int kvt_gpurt_copy_h2d_async(void *dst, const void *src, size_t n, void *stream) {
  return (int)cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice,
                              static_cast<cudaStream_t>(stream));
}

extern "C" int kvt_gpurt_copy_d2h_async(void *dst, const void *src, size_t n, void *stream) {
  return (int)cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost,
                              static_cast<cudaStream_t>(stream));
}

extern "C" int kvt_gpurt_stream_create(void **stream) {
  cudaStream_t st = nullptr;
  const cudaError_t e = cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
  *stream = st;
  return clear_failed(e);
}

extern "C" void kvt_gpurt_stream_destroy(void *stream) {
  if (stream)
    cudaStreamDestroy(static_cast<cudaStream_t>(stream));
}

extern "C" int kvt_gpurt_event_create(void **event) {
  cudaEvent_t ev = nullptr;
  const cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  *event = ev;
  return clear_failed(e);
}

extern "C" void kvt_gpurt_event_destroy(void *event) {
  if (event)
    cudaEventDestroy(static_cast<cudaEvent_t>(event));
}

extern "C" int kvt_gpurt_stream_wait(void *stream, void *event) {
  return (int)cudaStreamWaitEvent(static_cast<cudaStream_t>(stream),
                                  static_cast<cudaEvent_t>(event), 0);
}

extern "C" int kvt_gpurt_status(const kvt_gpu_status *dev, kvt_gpu_status *host) {
  return (int)cudaMemcpy(host, dev, sizeof(*host), cudaMemcpyDeviceToHost);
}
