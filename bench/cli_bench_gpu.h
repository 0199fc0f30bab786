/* bench/cli_bench_gpu.h - what the CUDA benches share (bench gpu, bench
 * offload). CUDA builds only. */
#ifndef KVT_CLI_BENCH_GPU_H
#define KVT_CLI_BENCH_GPU_H

#include <stddef.h>
#include <stdint.h>

/* Fills each of the n device buffers layers[l] (layer_bytes each) with
 * synthetic bf16 K/V tiles of 256 tokens x heads x head_dim (K and V
 * alternating), layer l's from seed seed0 + l. Returns 0, or CLI_EFAIL
 * after printing the cause. */
int cli_bench_fill_layers(void *const *layers, uint32_t n, size_t layer_bytes, uint32_t heads,
                          uint32_t head_dim, uint32_t seed0);

#endif
