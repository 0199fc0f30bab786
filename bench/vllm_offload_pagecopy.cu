/* bench/vllm_offload_pagecopy.cu - the copy vLLM 0.33's CPU offload makes,
 * as a baseline for bench/vllm_offload_bench.py: ops.swap_blocks_batch, one
 * descriptor per (layer, block) page in a single cudaMemcpyBatchAsync
 * (CUDA 12.8+), source access in stream order for GPU -> CPU and "any" for
 * CPU -> GPU (vllm/v1/kv_offload/cpu/gpu_worker.py transfer_async). Built by
 * the script: nvcc -shared -Xcompiler -fPIC -cudart static. */
#include <cuda_runtime.h>

extern "C" int kvtb_copy_batch(void *const *dst, const void *const *src, const size_t *sizes,
                               size_t n, int src_access_any, void *stream) {
  cudaMemcpyAttributes attr = {};
  attr.srcAccessOrder =
      src_access_any ? cudaMemcpySrcAccessOrderAny : cudaMemcpySrcAccessOrderStream;
  size_t idx = 0;
  return (int)cudaMemcpyBatchAsync(dst, src, sizes, n, &attr, &idx, 1, (cudaStream_t)stream);
}
