/* programs/cli_demo_cache.h - the cache section of `kvtier demo`
 * (cli_demo_cache.c): the demo's context put through a DRAM+NVMe cache whose
 * DRAM tier is too small for it, looked up and read back. */
#ifndef KVT_CLI_DEMO_CACHE_H
#define KVT_CLI_DEMO_CACHE_H

#include <stdint.h>

#include "kvtier.h"

#define DEMO_CACHE_RANGES 16

typedef struct demo_cache_in {
  const uint16_t *k, *v; /* [layer][token][head][dim] */
  uint32_t layers, tokens, heads, head_dim, chunk;
  int dtype;
  const char *dir; /* parent of the nvme tier's temporary directory */
} demo_cache_in;

typedef struct demo_cache_tier {
  char spec[300];
  uint64_t capacity, used, items, demotions, promotions, evictions;
  uint64_t read_bytes;
  double read_s;
} demo_cache_tier;

/* The GPU part (cli_demo_gpu.c). */
typedef struct demo_gpu_result {
  int ran;                /* 0: skipped or failed; see why */
  int mismatch;           /* the kernel wrote something other than the CPU decode */
  char why[300];
  char device[128];
  uint64_t payload_bytes, kv_bytes;
  double load_s;          /* kernel time, CUDA events */
  uint32_t verified;      /* chunks whose every element equals the CPU decode */
} demo_gpu_result;

typedef struct demo_cache_result {
  int ran;                 /* 0: skipped (no room for the nvme tier, ...); see why */
  char why[300];
  char codec[64];
  uint32_t chunks;
  uint64_t payload_bytes;  /* all chunks */
  double put_s, lookup_us;
  size_t cached_tokens;
  int ntiers;
  demo_cache_tier t[2];
  /* Where the chunks were read from, as runs of consecutive chunks. */
  uint32_t nranges, r_first[DEMO_CACHE_RANGES], r_last[DEMO_CACHE_RANGES];
  int r_tier[DEMO_CACHE_RANGES];
  uint32_t verified;       /* chunks read back byte-identical to what was put */
  kvt_cache_plan plan;     /* restore vs recompute of the cached prefix */
  demo_gpu_result gpu;
  int plan_model;          /* 1: recompute estimated with the llama-3.1-8b preset */
} demo_cache_result;

/* Runs the section; returns 0, or a CLI exit code after printing why. A
 * machine where it cannot run (no writable directory) gives 0 with
 * out->ran = 0 and out->why. */
int demo_cache_run(const demo_cache_in *in, demo_cache_result *out);
/* Loads payloads[0..chunks) into a paged cache on the GPU and checks them
 * against the CPU decode. Returns 0 (out->ran says whether it ran) or
 * CLI_EFAIL when the GPU wrote something other than the CPU decode. */
int demo_gpu_run(const demo_cache_in *in, uint8_t *const *payloads, const uint64_t *lens,
                 uint32_t chunks, demo_gpu_result *out);
void demo_cache_print_text(const demo_cache_result *r);
/* Prints `,\n "cache": {...}` for the demo's JSON document. */
void demo_cache_print_json(const demo_cache_result *r);

#endif
