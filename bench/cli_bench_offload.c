/* bench/cli_bench_offload.c - `kvtier bench offload`: the whole offload path
 * an engine sees on one GPU, paged bf16 cache -> GPU store -> sealed payload
 * in the dram tier -> nvme tier, and back into other blocks of the cache
 * through a verified GPU load, as GB/s of restored bf16 KV per codec against
 * cudaMemcpyAsync of the same bf16 blocks in the same run (issue 20, part 4). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cli_bench_gpu.h"
#include "cli_util.h"
#include "kvtier/gpu.h"
#include "kvtier/tier.h"
#include "synth.h"

int cli_bench_offload_main(int argc, char **argv);

static const char offload_help[] =
    "Usage: kvtier bench offload [--quick] [--iters N] [--tokens T]\n"
    "                            [--chunk 256|1024] [--codecs LIST] [--nvme DIR|off]\n"
    "\n"
    "On the first CUDA device, a Llama-3.1-8B shaped cache (32 layers, 8 KV heads,\n"
    "head_dim 128, bf16, legacy vLLM flash-attn layout, 16-token blocks, 2 x T\n"
    "slots, blocks in shuffled order) holds a context of T tokens (32768: 4 GiB of\n"
    "K+V), offloaded in chunks of 256 and 1024 tokens (one payload of every layer\n"
    "per chunk). Per codec, each phase is the wall time (clock_gettime) of the\n"
    "whole context, from the first call to the last stream synchronize:\n"
    "  store     per chunk: kvt_tier_reserve of the exact payload size in a dram\n"
    "            tier (its slabs page-locked for the GPU), kvt_gpu_store_async of\n"
    "            the chunk's blocks straight into the reserved block,\n"
    "            (written in the layout's staging slots, sealed there by the GPU,\n"
    "            moved by the copy engine), kvt_gpu_store_finish (waits, writes\n"
    "            the header checksum), kvt_tier_publish (zero copy: no put)\n"
    "  ->nvme    the write-through: every payload lent by the dram tier\n"
    "            (kvt_tier_borrow) and put into an nvme tier (O_DIRECT, durable\n"
    "            before it completes), 8 puts in flight\n"
    "  load      per chunk: kvt_tier_borrow from the dram tier (zero copy: the\n"
    "            payload's own pinned bytes, no get into a buffer), kvt_gpu_load\n"
    "            into the blocks of other, shuffled slots, no TRUST flag, with a\n"
    "            verdict: header and key checked on the host, every section\n"
    "            checksum on the GPU as the payload is staged; the verdict read\n"
    "            and the loan returned once the stream passed the load (32 loans\n"
    "            out at most)\n"
    "  batch     the same loans, 16 at a time loaded by one kvt_gpu_load_batch\n"
    "            (launches of a layer range of many chunks, each chunk verified on\n"
    "            the GPU with its own verdict), two batches in flight\n"
    "  trusted   the same as load with KVT_GPU_LOAD_TRUST_HOST: no checksums, a\n"
    "            partial figure shown beside the verified one, never instead\n"
    "  nvme ld   per chunk: a get from the nvme tier (which checks its file's\n"
    "            header, key and XXH3) into one of 8 pinned 4 KiB-aligned buffers,\n"
    "            8 gets in flight, then the verified kvt_gpu_load as above\n"
    "Baselines, same run, same blocks, between the cache and pinned host memory:\n"
    "  block     one cudaMemcpyAsync per 32 KiB K or V block of each layer, as\n"
    "            vLLM's native offload copies pages, D2H (from the context's\n"
    "            blocks) and H2D (into the load's blocks)\n"
    "  batch     the same page copies as one cudaMemcpyBatchAsync (vLLM 0.33's\n"
    "            swap_blocks_batch; CUDA 13 builds)\n"
    "  contig    one cudaMemcpyAsync per layer of the same bytes: the ceiling\n"
    "GB/s are of bf16 K+V: the bytes of 16-bit K and V the payloads stand for\n"
    "(restored by a load, read by a store) over the phase's wall time; x blk and\n"
    "x ctg are ratios to the block and contig baselines of the same direction.\n"
    "Medians of N iterations after one warm-up; each iteration deletes its\n"
    "payloads from both tiers at the end. Correctness, same run: after each load\n"
    "phase (and the block H2D baseline), the first and last chunk's restored\n"
    "blocks, poisoned before, equal the source blocks bit for bit (raw) or\n"
    "kvt_decode of the payload on the CPU (every other codec); a mismatch fails\n"
    "the run.\n"
    "\n"
    "Options:\n"
    "  --quick         --tokens 8192 --chunk 256 --iters 2 (each unless given)\n"
    "  --iters N       timed iterations per measurement (3), after one warm-up\n"
    "  --tokens T      context tokens, a multiple of 1024 up to 65536 (32768)\n"
    "  --chunk C       only chunks of C tokens: 256 or 1024 (both)\n"
    "  --codecs LIST   comma-separated presets (raw,k16v8,fp8,int8,int4)\n"
    "  --nvme DIR|off  the nvme tier's directory (default: a new one under\n"
    "                  /var/tmp, removed at exit); off: no nvme phases\n"
    "\n"
    "Exit status: 0 done, 2 bad command line, 4 no CUDA device, a CUDA or tier\n"
    "error, or a restored block that differs from its reference.\n";

#ifndef KVT_HAVE_CUDA

int cli_bench_offload_main(int argc, char **argv) {
  return cli_without_cuda("bench offload", argc, argv, offload_help);
}

#else
#include <ftw.h>
#include <stdio.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

/* The flags of every verified load ("load" and "nvme ld"), in one place.
 * 0: no TRUST flag; with a verdict (load_one) kvt_gpu_load checks the
 * header and key on the host and every loaded section's checksum on the
 * GPU as the payload is staged. The help text says what this means. */
#define OFFLOAD_LOAD_FLAGS 0u

#define LAYERS 32
#define HEADS 8
#define HDIM 128
#define BS 16
#define ROW ((size_t)HEADS * HDIM * 2) /* bytes of one token's K (or V) in one layer */
#define BLK ((size_t)BS * ROW)         /* bytes of one K (or V) block: 32 KiB */
#define MAX_ITERS 50
#define MAX_TOKENS 65536
#define MAX_CODECS 16
#define LOANS 32  /* dram loans out at once (the tier lends 64) */
#define NVME_QD 8 /* nvme puts and gets in flight; pinned get buffers */

typedef struct obench {
  kvt_ctx *ctx;
  cudaStream_t st;
  cudaEvent_t ev[LOANS];
  int n_ev;
  void *layers[LAYERS];
  uint32_t tokens;   /* of the context */
  uint32_t nblocks;  /* of the cache: 2 x tokens / BS */
  int64_t *slots;    /* device [2 x tokens]: the context's slots, then the loads' */
  int64_t *hslots;   /* the same, on the host */
  kvt_gpu_layout *L;
  kvt_tier *dram, *nvme;
  char dram_spec[64], nvme_spec[512];
  char nvme_dir[400];
  int nvme_made;     /* nvme_dir was made here: removed at the end */
  uint8_t *hkv;      /* pinned: the context's bf16 K+V, the baselines' host side */
  uint8_t *pin;      /* pinned: NVME_QD buffers of `each` bytes for nvme gets */
  kvt_gpu_verdict *verdicts; /* pinned: one per loan or get buffer in flight */
  size_t each;
  uint32_t iters;
  /* cudaMemcpyBatchAsync descriptors of the block pages, per direction */
  void **bdst[2];
  const void **bsrc[2];
  size_t *bsize;
} obench;

static int cu(cudaError_t e, const char *what) {
  if (e == cudaSuccess)
    return 0;
  cli_error("bench offload: %s: %s", what, cudaGetErrorString(e));
  return CLI_EFAIL;
}

static int kv_fail(const obench *b, const char *what, int rc) {
  cli_error("bench offload: %s: %s: %s", what, kvt_err_name(rc), kvt_ctx_last_error(b->ctx));
  return CLI_EFAIL;
}

/* Tier data-path calls leave no detail in the context: the code says it. */
static int tier_fail(const char *what, int rc) {
  cli_error("bench offload: %s: %s (%s)", what, kvt_err_name(rc), kvt_strerror(rc));
  return CLI_EFAIL;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *t, uint32_t n) {
  qsort(t, n, sizeof(double), cmp_d);
  return n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
}

static uint64_t kv_bytes(uint64_t tokens) { return tokens * LAYERS * 2 * ROW; }

/* Chunk j of the context (chunk tokens each): its key, the same in both tiers. */
static kvt_key key_of(uint32_t chunk, uint32_t j) {
  kvt_key k;
  memset(&k, 0, sizeof(k));
  memcpy(k.bytes, "offload", 7);
  memcpy(k.bytes + 8, &chunk, 4);
  memcpy(k.bytes + 12, &j, 4);
  return k;
}

/* Device address of block blk's K (kv 0) or V (kv 1) in layer l: the legacy
 * vLLM layout [2, nblocks, BS, HEADS, HDIM]. */
static uint8_t *block_at(const obench *b, uint32_t l, int kv, int64_t blk) {
  return (uint8_t *)b->layers[l] + ((size_t)kv * b->nblocks + (size_t)blk) * BLK;
}

/* The cache block holding tokens [16i, 16i + 16) of the context (dst 0) or
 * of the loads' destination (dst 1). */
static int64_t block_of(const obench *b, int dst, uint32_t i) {
  return b->hslots[(size_t)dst * b->tokens + (size_t)i * BS] / BS;
}

/* ---- setup ------------------------------------------------------------------- */

/* A sequence's tokens fill its blocks in order; the blocks are scattered
 * over the cache (vLLM's block table after a while of serving). */
static int make_slots(obench *b) {
  const size_t n = (size_t)2 * b->tokens;
  uint32_t *perm = malloc(sizeof(uint32_t) * b->nblocks);
  b->hslots = malloc(sizeof(int64_t) * n);
  if (!perm || !b->hslots) {
    free(perm);
    cli_error("bench offload: out of memory");
    return CLI_EFAIL;
  }
  kvt_rng r = {42};
  for (uint32_t i = 0; i < b->nblocks; i++)
    perm[i] = i;
  for (uint32_t i = b->nblocks - 1; i > 0; i--) {
    uint32_t j = (uint32_t)(kvt_rng_next(&r) % (i + 1)), t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
  for (size_t t = 0; t < n; t++)
    b->hslots[t] = (int64_t)perm[t / BS] * BS + (int64_t)(t % BS);
  free(perm);
  int rc = cu(cudaMalloc((void **)&b->slots, sizeof(int64_t) * n), "cudaMalloc slots");
  if (!rc)
    rc = cu(cudaMemcpy(b->slots, b->hslots, sizeof(int64_t) * n, cudaMemcpyHostToDevice),
            "copy slots");
  return rc;
}

static int setup_cache(obench *b) {
  int rc;
  if ((rc = cu(cudaStreamCreateWithFlags(&b->st, cudaStreamNonBlocking), "stream")))
    return rc;
  for (; b->n_ev < LOANS; b->n_ev++)
    if ((rc = cu(cudaEventCreateWithFlags(&b->ev[b->n_ev], cudaEventDisableTiming), "event")))
      return rc;
  const size_t layer_bytes = (size_t)2 * b->nblocks * BLK;
  for (uint32_t l = 0; l < LAYERS; l++)
    if ((rc = cu(cudaMalloc(&b->layers[l], layer_bytes), "cudaMalloc cache")))
      return rc;
  if ((rc = cli_bench_fill_layers(b->layers, LAYERS, layer_bytes, HEADS, HDIM, 2000)) ||
      (rc = make_slots(b)))
    return rc;
  kvt_gpu_layout_desc d;
  kvt_gpu_layout_desc_vllm(&d, KVT_DTYPE_BF16, LAYERS, b->layers, b->nblocks, BS, HEADS, HDIM);
  if ((rc = kvt_gpu_layout_create(b->ctx, &d, &b->L)))
    return kv_fail(b, "layout", rc);
  if ((rc = cu(cudaHostAlloc((void **)&b->verdicts, LOANS * sizeof(kvt_gpu_verdict),
                             cudaHostAllocMapped), "cudaHostAlloc of the verdicts")))
    return rc;
  return cu(cudaHostAlloc((void **)&b->hkv, kv_bytes(b->tokens), cudaHostAllocPortable),
            "cudaHostAlloc of the baselines' host buffer");
}

/* The tiers: dram pinned (pin=on: without pinned slabs, no run), room for
 * the context's raw payloads twice over (a 64 MiB slab holds one 32 MiB raw
 * payload and its header); nvme likewise, in --nvme DIR or a new directory. */
static int setup_tiers(obench *b, const char *nvme_opt, uint32_t max_chunk) {
  kvt_codec_spec raw = KVT_CODEC_SPEC_INIT;
  uint64_t bound;
  int rc = kvt_encode_bound(b->ctx, &raw, 0, LAYERS, max_chunk, HEADS, HDIM, &bound);
  if (rc)
    return kv_fail(b, "bound", rc);
  b->each = (size_t)((bound + 4095) & ~(uint64_t)4095);
  const uint64_t room = 2 * kv_bytes(b->tokens) + (512ull << 20);
  snprintf(b->dram_spec, sizeof(b->dram_spec), "dram:%llu,pin=on", (unsigned long long)room);
  if ((rc = kvt_tier_open(b->ctx, b->dram_spec, &b->dram)))
    return kv_fail(b, b->dram_spec, rc);
  if (nvme_opt && strcmp(nvme_opt, "off") == 0)
    return 0;
  if ((rc = cu(cudaHostAlloc((void **)&b->pin, NVME_QD * b->each, cudaHostAllocMapped),
               "cudaHostAlloc of the nvme get buffers")))
    return rc;
  if (nvme_opt) {
    snprintf(b->nvme_dir, sizeof(b->nvme_dir), "%s", nvme_opt);
  } else {
    snprintf(b->nvme_dir, sizeof(b->nvme_dir), "/var/tmp/kvtier-offload-XXXXXX");
    if (!mkdtemp(b->nvme_dir)) {
      cli_error("bench offload: mkdtemp %s: %s", b->nvme_dir, strerror(errno));
      return CLI_EFAIL;
    }
    b->nvme_made = 1;
  }
  snprintf(b->nvme_spec, sizeof(b->nvme_spec), "nvme:%s:%llu", b->nvme_dir,
           (unsigned long long)room);
  if ((rc = kvt_tier_open(b->ctx, b->nvme_spec, &b->nvme)))
    return kv_fail(b, b->nvme_spec, rc);
  return 0;
}

/* ---- correctness ------------------------------------------------------------ */

/* Copies the bf16 K and V of tokens [first, first + tokens) of the slot table
 * out of the cache into dense [layer][token][head][dim] arrays. */
static int gather(obench *b, size_t first, uint32_t tokens, uint8_t *k, uint8_t *v) {
  for (uint32_t l = 0; l < LAYERS; l++)
    for (uint32_t i = 0; i < tokens / BS; i++) {
      const int64_t blk = b->hslots[first + (size_t)i * BS] / BS;
      const size_t at = ((size_t)l * tokens + (size_t)i * BS) * ROW;
      int rc = cu(cudaMemcpy(k + at, block_at(b, l, 0, blk), BLK, cudaMemcpyDeviceToHost),
                  "gather K");
      if (!rc)
        rc = cu(cudaMemcpy(v + at, block_at(b, l, 1, blk), BLK, cudaMemcpyDeviceToHost),
                "gather V");
      if (rc)
        return rc;
    }
  return 0;
}

/* The chunks every check looks at: the first and the last. */
static uint32_t sample(uint32_t n, int s) { return s ? n - 1 : 0; }

/* Sets the destination blocks of the sampled chunks to 0xff bytes (bf16
 * NaN), so a load that writes nothing cannot pass the check. */
static int poison_samples(obench *b, uint32_t chunk) {
  const uint32_t n = b->tokens / chunk;
  for (int s = 0; s < 2; s++)
    for (uint32_t l = 0; l < LAYERS; l++)
      for (uint32_t i = 0; i < chunk / BS; i++) {
        const int64_t blk = block_of(b, 1, sample(n, s) * (chunk / BS) + i);
        for (int kv = 0; kv < 2; kv++) {
          const int rc =
              cu(cudaMemsetAsync(block_at(b, l, kv, blk), 0xff, BLK, b->st), "poison");
          if (rc)
            return rc;
        }
      }
  return cu(cudaStreamSynchronize(b->st), "poison");
}

/* The reference of chunk j for a lossy codec: kvt_decode, on the CPU, of its
 * payload as the dram tier lends it. */
static int ref_decode(obench *b, uint32_t chunk, uint32_t j, uint8_t *k, uint8_t *v) {
  const kvt_key key = key_of(chunk, j);
  kvt_tier_loan loan;
  int rc = kvt_tier_borrow(b->dram, &key, &loan);
  if (rc)
    return tier_fail("borrow for the reference decode", rc);
  kvt_kv_view view;
  kvt_kv_view_dense(&view, k, v, KVT_DTYPE_BF16, LAYERS, chunk, HEADS, HDIM);
  rc = kvt_decode(b->ctx, loan.data, (size_t)loan.len, NULL, &view);
  kvt_tier_return(b->dram, &loan);
  return rc ? kv_fail(b, "CPU decode of a payload", rc) : 0;
}

static int compare(const uint8_t *ref, const uint8_t *got, uint32_t chunk, uint32_t j,
                   const char *what) {
  for (int kv = 0; kv < 2; kv++)
    for (uint32_t l = 0; l < LAYERS; l++)
      for (uint32_t t = 0; t < chunk; t++) {
        const size_t at = (((size_t)kv * LAYERS + l) * chunk + t) * ROW;
        if (memcmp(ref + at, got + at, ROW) != 0) {
          cli_error("bench offload: %s: chunk %u, layer %u, token %u: restored %s differs "
                    "from its reference", what, j, l, t, kv ? "V" : "K");
          return CLI_EFAIL;
        }
      }
  return 0;
}

/* Checks the loads' destination blocks of the sampled chunks against the
 * context's own blocks (decode 0: raw, every bit) or the CPU decode of each
 * chunk's payload (decode 1). */
static int check_samples(obench *b, uint32_t chunk, int decode, const char *what) {
  const size_t half = (size_t)LAYERS * chunk * ROW;
  const uint32_t n = b->tokens / chunk;
  uint8_t *ref = malloc(2 * half), *got = malloc(2 * half);
  int rc = 0;
  if (!ref || !got) {
    cli_error("bench offload: out of memory for the check");
    rc = CLI_EFAIL;
  }
  for (int s = 0; s < 2 && !rc && (s == 0 || n > 1); s++) {
    const uint32_t j = sample(n, s);
    rc = gather(b, (size_t)b->tokens + (size_t)j * chunk, chunk, got, got + half);
    if (!rc)
      rc = decode ? ref_decode(b, chunk, j, ref, ref + half)
                  : gather(b, (size_t)j * chunk, chunk, ref, ref + half);
    if (!rc)
      rc = compare(ref, got, chunk, j, what);
  }
  free(ref);
  free(got);
  return rc;
}

/* ---- baselines --------------------------------------------------------------- */

/* Page (layer l, block i of the context, K or V) of the host buffer. */
static uint8_t *host_page(const obench *b, uint32_t l, uint32_t i, int kv) {
  return b->hkv + (((size_t)l * (b->tokens / BS) + i) * 2 + (size_t)kv) * BLK;
}

static size_t n_pages(const obench *b) { return (size_t)LAYERS * (b->tokens / BS) * 2; }

/* One cudaMemcpyAsync per page: from the context's blocks, or into the loads'. */
static int copy_blocks(obench *b, int h2d) {
  for (uint32_t l = 0; l < LAYERS; l++)
    for (uint32_t i = 0; i < b->tokens / BS; i++)
      for (int kv = 0; kv < 2; kv++) {
        uint8_t *dev = block_at(b, l, kv, block_of(b, h2d, i)), *host = host_page(b, l, i, kv);
        const cudaError_t e =
            h2d ? cudaMemcpyAsync(dev, host, BLK, cudaMemcpyHostToDevice, b->st)
                : cudaMemcpyAsync(host, dev, BLK, cudaMemcpyDeviceToHost, b->st);
        if (e != cudaSuccess)
          return cu(e, "cudaMemcpyAsync of a block");
      }
  return 0;
}

/* One cudaMemcpyAsync per layer of as many bytes: the K half of each layer
 * tensor. H2D writes back the bytes D2H read just before (it runs right
 * after it), so the cache is unchanged. */
static int copy_contig(obench *b, int h2d) {
  const size_t n = kv_bytes(b->tokens) / LAYERS;
  for (uint32_t l = 0; l < LAYERS; l++) {
    uint8_t *host = b->hkv + (size_t)l * n;
    const cudaError_t e =
        h2d ? cudaMemcpyAsync(b->layers[l], host, n, cudaMemcpyHostToDevice, b->st)
            : cudaMemcpyAsync(host, b->layers[l], n, cudaMemcpyDeviceToHost, b->st);
    if (e != cudaSuccess)
      return cu(e, "cudaMemcpyAsync of a layer");
  }
  return 0;
}

#if CUDART_VERSION >= 13000
#define HAVE_BATCH 1
/* The block baseline's pages as cudaMemcpyBatchAsync descriptors (built
 * once, outside the timing). */
static int batch_prepare(obench *b) {
  const size_t n = n_pages(b);
  for (int d = 0; d < 2; d++) {
    b->bdst[d] = malloc(n * sizeof(void *));
    b->bsrc[d] = malloc(n * sizeof(void *));
  }
  b->bsize = malloc(n * sizeof(size_t));
  if (!b->bdst[0] || !b->bdst[1] || !b->bsrc[0] || !b->bsrc[1] || !b->bsize) {
    cli_error("bench offload: out of memory");
    return CLI_EFAIL;
  }
  size_t p = 0;
  for (uint32_t l = 0; l < LAYERS; l++)
    for (uint32_t i = 0; i < b->tokens / BS; i++)
      for (int kv = 0; kv < 2; kv++, p++) {
        b->bsize[p] = BLK;
        b->bdst[0][p] = host_page(b, l, i, kv);
        b->bsrc[0][p] = block_at(b, l, kv, block_of(b, 0, i));
        b->bdst[1][p] = block_at(b, l, kv, block_of(b, 1, i));
        b->bsrc[1][p] = host_page(b, l, i, kv);
      }
  return 0;
}

/* vLLM 0.33's swap_blocks_batch: source access in stream order for D2H,
 * "any" for H2D (vllm/v1/kv_offload/cpu/gpu_worker.py). */
static int copy_batch(obench *b, int h2d) {
  struct cudaMemcpyAttributes attr;
  memset(&attr, 0, sizeof(attr));
  attr.srcAccessOrder = h2d ? cudaMemcpySrcAccessOrderAny : cudaMemcpySrcAccessOrderStream;
  size_t idx = 0;
  return cu(cudaMemcpyBatchAsync(b->bdst[h2d], b->bsrc[h2d], b->bsize, n_pages(b), &attr, &idx,
                                 1, b->st), "cudaMemcpyBatchAsync");
}
#else
#define HAVE_BATCH 0
static int batch_prepare(obench *b) {
  (void)b;
  return 0;
}
static int copy_batch(obench *b, int h2d) {
  (void)b, (void)h2d;
  cli_error("bench offload: cudaMemcpyBatchAsync needs CUDA 13 headers");
  return CLI_EFAIL;
}
#endif

typedef int (*copy_fn)(obench *b, int h2d);

/* Wall time of one baseline, queued and synchronized. */
static int time_copy(obench *b, copy_fn fn, int h2d, double *secs) {
  int rc = cu(cudaStreamSynchronize(b->st), "sync");
  const double t0 = cli_now();
  if (!rc)
    rc = fn(b, h2d);
  const int r = cu(cudaStreamSynchronize(b->st), "memcpy baseline");
  *secs = cli_now() - t0;
  return rc ? rc : r;
}

typedef struct obase {
  double t[6]; /* block, batch, contig; D2H then H2D; medians, seconds */
  int batch;   /* the batch baseline ran */
} obase;

static int run_baselines(obench *b, obase *out) {
  static const copy_fn fns[3] = {copy_blocks, copy_batch, copy_contig};
  double t[MAX_ITERS + 1][6], col[MAX_ITERS];
  int rc = 0;
  memset(t, 0, sizeof(t));
  out->batch = HAVE_BATCH;
  for (uint32_t it = 0; it <= b->iters && !rc; it++)
    for (int k = 0; k < 6 && !rc; k++) {
      const int last = it == b->iters;
      if (k / 2 == 1 && !out->batch)
        continue;
      if (k == 1 && last)
        rc = poison_samples(b, 256);
      if (!rc)
        rc = time_copy(b, fns[k / 2], k % 2, &t[it][k]);
      if (rc && k / 2 == 1) { /* a batch API that fails is no reason to stop */
        cli_error("bench offload: the batch baseline is left out");
        cudaGetLastError();
        out->batch = 0;
        rc = 0;
      }
      if (!rc && k == 1 && last)
        rc = check_samples(b, 256, 0, "block H2D baseline");
    }
  for (int k = 0; k < 6 && !rc; k++) {
    for (uint32_t it = 1; it <= b->iters; it++)
      col[it - 1] = t[it][k];
    out->t[k] = median(col, b->iters);
  }
  return rc;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *f) {
  (void)st, (void)flag, (void)f;
  if (remove(path) != 0)
    cli_error("bench offload: remove %s: %s", path, strerror(errno));
  return 0;
}

static void teardown(obench *b) {
  kvt_tier_close(b->nvme);
  kvt_tier_close(b->dram);
  if (b->nvme_made)
    nftw(b->nvme_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
  kvt_gpu_layout_destroy(b->L);
  for (uint32_t l = 0; l < LAYERS; l++)
    cudaFree(b->layers[l]);
  cudaFree(b->slots);
  cudaFreeHost(b->hkv);
  cudaFreeHost(b->pin);
  cudaFreeHost(b->verdicts);
  free(b->hslots);
  for (int d = 0; d < 2; d++) {
    free(b->bdst[d]);
    free((void *)b->bsrc[d]);
  }
  free(b->bsize);
  for (int i = 0; i < b->n_ev; i++)
    cudaEventDestroy(b->ev[i]);
  if (b->st)
    cudaStreamDestroy(b->st);
  kvt_ctx_destroy(b->ctx);
}

/* ---- the offload phases -------------------------------------------------------- */

/* store: per chunk, the exact payload size reserved in the dram tier, the
 * store kernel writing the reserved block, finish sealing it, publish. */
static int phase_store(obench *b, const kvt_codec_spec *spec, uint32_t chunk,
                       uint64_t *payload_bytes, double *secs) {
  const uint32_t n = b->tokens / chunk;
  uint64_t total = 0;
  const double t0 = cli_now();
  for (uint32_t j = 0; j < n; j++) {
    kvt_encode_params ep = KVT_ENCODE_PARAMS_INIT;
    ep.spec = *spec;
    ep.key = key_of(chunk, j);
    ep.model_layers = LAYERS;
    ep.token_begin = j * chunk;
    kvt_gpu_store_params sp = KVT_GPU_STORE_PARAMS_INIT;
    sp.encode = &ep;
    sp.layer_count = LAYERS;
    sp.tokens = chunk;
    sp.slots = b->slots + (size_t)j * chunk;
    uint64_t bound;
    int rc = kvt_gpu_store_bound(b->L, &sp, &bound);
    if (rc)
      return kv_fail(b, "store bound", rc);
    kvt_tier_reservation res;
    if ((rc = kvt_tier_reserve(b->dram, &ep.key, bound, &res)))
      return tier_fail("reserve in the dram tier", rc);
    size_t len = 0;
    rc = kvt_gpu_store_async(b->L, &sp, res.data, (size_t)res.len, &len, b->st);
    if (!rc)
      rc = kvt_gpu_store_finish(b->L, res.data, len, b->st);
    if (rc || len != res.len) {
      cudaStreamSynchronize(b->st); /* nothing may write the block once it is given back */
      kvt_tier_abort(b->dram, &res);
      if (rc)
        return kv_fail(b, "GPU store into the dram tier", rc);
      cli_error("bench offload: the store wrote %zu bytes, its bound said %llu", len,
                (unsigned long long)bound);
      return CLI_EFAIL;
    }
    if ((rc = kvt_tier_publish(b->dram, &res)))
      return tier_fail("publish in the dram tier", rc);
    total += len;
  }
  *secs = cli_now() - t0;
  *payload_bytes = total;
  return 0;
}

static int put_done(obench *b, kvt_tier_op *op, kvt_tier_loan *loan, int *busy) {
  const int rc = kvt_tier_wait(b->nvme, op, -1);
  kvt_tier_return(b->dram, loan);
  *busy = 0;
  return rc ? tier_fail("put into the nvme tier", rc) : 0;
}

/* ->nvme: every payload lent by the dram tier and put into the nvme tier,
 * NVME_QD puts in flight. */
static int phase_nvme_put(obench *b, uint32_t chunk, double *secs) {
  const uint32_t n = b->tokens / chunk;
  kvt_tier_op ops[NVME_QD];
  kvt_tier_loan loans[NVME_QD];
  int busy[NVME_QD] = {0}, rc = 0;
  const double t0 = cli_now();
  for (uint32_t j = 0; j < n && !rc; j++) {
    const uint32_t s = j % NVME_QD;
    if (busy[s] && (rc = put_done(b, &ops[s], &loans[s], &busy[s])))
      break;
    const kvt_key key = key_of(chunk, j);
    if ((rc = kvt_tier_borrow(b->dram, &key, &loans[s]))) {
      rc = tier_fail("borrow from the dram tier", rc);
      break;
    }
    kvt_tier_op_init(&ops[s], KVT_TIER_PUT, &key, (void *)loans[s].data, loans[s].len, j);
    kvt_tier_op *op = &ops[s];
    const int sub = kvt_tier_submit_owned(b->nvme, &op, 1);
    if (sub != 1) {
      kvt_tier_return(b->dram, &loans[s]);
      rc = tier_fail("submit a put to the nvme tier", sub < 0 ? sub : -EAGAIN);
      break;
    }
    busy[s] = 1;
  }
  for (uint32_t s = 0; s < NVME_QD; s++)
    if (busy[s]) {
      const int r = put_done(b, &ops[s], &loans[s], &busy[s]);
      rc = rc ? rc : r;
    }
  *secs = cli_now() - t0;
  return rc;
}

/* Launches the load of chunk j's payload p into the loads' slots of chunk j;
 * verified ones (no TRUST flag) with verdict b->verdicts[s]. */
static int load_one(obench *b, uint32_t chunk, uint32_t j, const kvt_key *key, const void *p,
                    uint64_t len, uint32_t flags, uint32_t s) {
  kvt_gpu_load_params lp = KVT_GPU_LOAD_PARAMS_INIT;
  lp.expect_key = key;
  lp.tokens = chunk;
  lp.slots = b->slots + b->tokens + (size_t)j * chunk;
  lp.flags = flags;
  lp.verdict = flags & KVT_GPU_LOAD_TRUST_HOST ? NULL : &b->verdicts[s];
  const int rc = kvt_gpu_load(b->L, p, (size_t)len, &lp, b->st);
  return rc ? kv_fail(b, "GPU load", rc) : 0;
}

/* The verdict of verified load slot s, once the stream passed it. */
static int verdict_of(obench *b, uint32_t flags, uint32_t s) {
  if (flags & KVT_GPU_LOAD_TRUST_HOST)
    return 0;
  const int rc = kvt_gpu_verdict_check(b->L, &b->verdicts[s]);
  return rc ? kv_fail(b, "verified load", rc) : 0;
}

/* load: per chunk, a loan from the dram tier loaded in place; each loan is
 * returned once the stream passed its load (LOANS out at most). */
static int phase_load_dram(obench *b, uint32_t chunk, uint32_t flags, double *secs) {
  const uint32_t n = b->tokens / chunk;
  kvt_tier_loan loans[LOANS];
  int out[LOANS] = {0}, rc = 0;
  const double t0 = cli_now();
  for (uint32_t j = 0; j < n && !rc; j++) {
    const uint32_t s = j % LOANS;
    if (out[s]) {
      rc = cu(cudaEventSynchronize(b->ev[s]), "load event");
      if (!rc)
        rc = verdict_of(b, flags, s);
      kvt_tier_return(b->dram, &loans[s]);
      out[s] = 0;
      if (rc)
        break;
    }
    const kvt_key key = key_of(chunk, j);
    if ((rc = kvt_tier_borrow(b->dram, &key, &loans[s]))) {
      rc = tier_fail("borrow from the dram tier", rc);
      break;
    }
    out[s] = 1;
    if (!(rc = load_one(b, chunk, j, &key, loans[s].data, loans[s].len, flags, s)))
      rc = cu(cudaEventRecord(b->ev[s], b->st), "event record");
  }
  int r = cu(cudaStreamSynchronize(b->st), "load");
  for (uint32_t s = 0; s < LOANS; s++)
    if (out[s]) {
      if (!r && !rc)
        r = verdict_of(b, flags, s);
      kvt_tier_return(b->dram, &loans[s]);
    }
  *secs = cli_now() - t0;
  return rc ? rc : r;
}

/* load, batched: the same loans, LOANS / 2 at a time loaded by one
 * kvt_gpu_load_batch (verified on the GPU, a verdict each), two batches in
 * flight; a batch's loans are returned once the stream passed it. */
static int phase_load_dram_batched(obench *b, uint32_t chunk, double *secs) {
  enum { HALF = LOANS / 2 };
  const uint32_t n = b->tokens / chunk;
  kvt_tier_loan loans[LOANS];
  kvt_key keys[LOANS];
  kvt_gpu_load_item items[HALF];
  uint32_t out[2] = {0, 0};
  int rc = 0;
  const double t0 = cli_now();
  for (uint32_t j = 0, g = 0; j < n && !rc; g ^= 1) {
    const uint32_t base = g * HALF;
    if (out[g]) { /* this half's previous batch: wait, check, give back */
      rc = cu(cudaEventSynchronize(b->ev[g]), "load event");
      for (uint32_t k = 0; k < out[g]; k++) {
        if (!rc)
          rc = verdict_of(b, OFFLOAD_LOAD_FLAGS, base + k);
        kvt_tier_return(b->dram, &loans[base + k]);
      }
      out[g] = 0;
      if (rc)
        break;
    }
    const uint32_t cnt = n - j < HALF ? n - j : HALF;
    for (uint32_t k = 0; k < cnt && !rc; k++) {
      keys[base + k] = key_of(chunk, j + k);
      if ((rc = kvt_tier_borrow(b->dram, &keys[base + k], &loans[base + k]))) {
        rc = tier_fail("borrow from the dram tier", rc);
        break;
      }
      out[g]++;
      const kvt_gpu_load_item it = {sizeof(it), loans[base + k].data, (size_t)loans[base + k].len,
                                    b->slots + b->tokens + (size_t)(j + k) * chunk,
                                    &keys[base + k], &b->verdicts[base + k]};
      items[k] = it;
    }
    if (rc)
      break;
    kvt_gpu_load_params lp = KVT_GPU_LOAD_PARAMS_INIT;
    lp.tokens = chunk;
    lp.flags = OFFLOAD_LOAD_FLAGS;
    if ((rc = kvt_gpu_load_batch(b->L, items, cnt, &lp, b->st)) != 0)
      rc = kv_fail(b, "batched GPU load", rc);
    else
      rc = cu(cudaEventRecord(b->ev[g], b->st), "event record");
    j += cnt;
  }
  int r = cu(cudaStreamSynchronize(b->st), "load");
  for (uint32_t g = 0; g < 2; g++)
    for (uint32_t k = 0; k < out[g]; k++) {
      if (!r && !rc)
        r = verdict_of(b, OFFLOAD_LOAD_FLAGS, g * HALF + k);
      kvt_tier_return(b->dram, &loans[g * HALF + k]);
    }
  *secs = cli_now() - t0;
  return rc ? rc : r;
}

static int get_submit(obench *b, uint32_t chunk, uint32_t j, kvt_tier_op *op, int *busy) {
  const kvt_key key = key_of(chunk, j);
  kvt_tier_op_init(op, KVT_TIER_GET, &key, b->pin + (size_t)(j % NVME_QD) * b->each, b->each,
                   j);
  const int sub = kvt_tier_submit_owned(b->nvme, &op, 1);
  if (sub != 1)
    return tier_fail("submit a get to the nvme tier", sub < 0 ? sub : -EAGAIN);
  *busy = 1;
  return 0;
}

/* nvme ld: gets into NVME_QD pinned buffers, each loaded as it lands; a
 * buffer takes its next get once the stream passed its load. */
static int phase_load_nvme(obench *b, uint32_t chunk, double *secs) {
  const uint32_t n = b->tokens / chunk;
  kvt_tier_op ops[NVME_QD];
  int busy[NVME_QD] = {0}, rc = 0;
  const double t0 = cli_now();
  for (uint32_t j = 0; j < n && j < NVME_QD && !rc; j++)
    rc = get_submit(b, chunk, j, &ops[j], &busy[j]);
  for (uint32_t j = 0; j < n && !rc; j++) {
    const uint32_t s = j % NVME_QD;
    const int r = kvt_tier_wait(b->nvme, &ops[s], -1);
    busy[s] = 0;
    if (r) {
      rc = tier_fail("get from the nvme tier", r);
      break;
    }
    rc = load_one(b, chunk, j, &ops[s].key, b->pin + (size_t)s * b->each, ops[s].out_len,
                  OFFLOAD_LOAD_FLAGS, s);
    if (!rc)
      rc = cu(cudaEventRecord(b->ev[s], b->st), "event record");
    if (!rc && j >= 1) { /* the previous buffer's load: its verdict, then a refill */
      const uint32_t p = (j - 1) % NVME_QD;
      if (!(rc = cu(cudaEventSynchronize(b->ev[p]), "load event")))
        rc = verdict_of(b, OFFLOAD_LOAD_FLAGS, p);
      if (!rc && j - 1 + NVME_QD < n)
        rc = get_submit(b, chunk, j - 1 + NVME_QD, &ops[p], &busy[p]);
    }
  }
  for (uint32_t s = 0; s < NVME_QD; s++)
    if (busy[s])
      kvt_tier_wait(b->nvme, &ops[s], -1);
  int r = cu(cudaStreamSynchronize(b->st), "nvme load");
  if (!r && !rc && n > 0)
    r = verdict_of(b, OFFLOAD_LOAD_FLAGS, (n - 1) % NVME_QD);
  *secs = cli_now() - t0;
  return rc ? rc : r;
}

static int delete_all(obench *b, uint32_t chunk) {
  kvt_tier *const t[2] = {b->dram, b->nvme};
  int rc = 0;
  for (uint32_t j = 0; j < b->tokens / chunk; j++) {
    const kvt_key key = key_of(chunk, j);
    for (int i = 0; i < 2; i++) {
      const int r = t[i] ? kvt_tier_del(t[i], &key) : 0;
      if (r && r != KVT_ENOTFOUND && !rc)
        rc = tier_fail(i ? "delete from the nvme tier" : "delete from the dram tier", r);
    }
  }
  return rc;
}

typedef struct orow {
  uint64_t payload; /* bytes of the context's payloads */
  double t[6];      /* medians, seconds: store, ->nvme, load, trusted, nvme ld, batched */
} orow;

/* One iteration of every phase of one codec; the last one also checks. */
static int iterate(obench *b, const kvt_codec_spec *spec, int decode, uint32_t chunk, int last,
                   uint64_t *payload, double *t) {
  int rc = phase_store(b, spec, chunk, payload, &t[0]);
  if (!rc && b->nvme)
    rc = phase_nvme_put(b, chunk, &t[1]);
  if (!rc)
    rc = phase_load_dram(b, chunk, KVT_GPU_LOAD_TRUST_HOST, &t[3]);
  if (!rc && last)
    rc = poison_samples(b, chunk);
  if (!rc)
    rc = phase_load_dram(b, chunk, OFFLOAD_LOAD_FLAGS, &t[2]);
  if (!rc && last)
    rc = check_samples(b, chunk, decode, "load from dram");
  if (!rc && last)
    rc = poison_samples(b, chunk);
  if (!rc)
    rc = phase_load_dram_batched(b, chunk, &t[5]);
  if (!rc && last)
    rc = check_samples(b, chunk, decode, "batched load from dram");
  if (!rc && b->nvme && last)
    rc = poison_samples(b, chunk);
  if (!rc && b->nvme)
    rc = phase_load_nvme(b, chunk, &t[4]);
  if (!rc && b->nvme && last)
    rc = check_samples(b, chunk, decode, "load from nvme");
  const int r = delete_all(b, chunk);
  return rc ? rc : r;
}

static int run_codec(obench *b, const char *name, uint32_t chunk, orow *out) {
  kvt_codec_spec spec;
  int rc = kvt_codec_parse(b->ctx, name, &spec);
  if (rc)
    return kv_fail(b, name, rc);
  double t[MAX_ITERS + 1][6], col[MAX_ITERS];
  memset(t, 0, sizeof(t));
  for (uint32_t it = 0; it <= b->iters && !rc; it++)
    rc = iterate(b, &spec, strcmp(name, "raw") != 0, chunk, it == b->iters, &out->payload,
                 t[it]);
  for (int k = 0; k < 6 && !rc; k++) {
    for (uint32_t it = 1; it <= b->iters; it++)
      col[it - 1] = t[it][k];
    out->t[k] = median(col, b->iters);
  }
  return rc;
}

/* ---- report ------------------------------------------------------------------ */

static void print_baselines(const obench *b, const obase *o) {
  static const char *const names[3] = {"block", "batch", "contig"};
  const double kv = (double)kv_bytes(b->tokens) / 1e9;
  printf("\nbaselines: the context's bf16 K+V between its blocks and pinned host memory\n");
  printf("%-8s %8s %8s\n", "copy", "D2H", "H2D");
  printf("%-8s %8s %8s\n", "", "GB/s", "GB/s");
  for (int k = 0; k < 3; k++) {
    if (k == 1 && !o->batch)
      printf("%-8s %8s %8s\n", names[k], "-", "-");
    else
      printf("%-8s %8.1f %8.1f\n", names[k], kv / o->t[2 * k], kv / o->t[2 * k + 1]);
  }
}

static void print_header(const obench *b, uint32_t chunk) {
  printf("\nchunks of %u tokens (%u payloads of 32 layers); GB/s of bf16 K+V; x: ratio to "
         "the baseline\n", chunk, b->tokens / chunk);
  printf("%-8s %8s %6s %7s %6s %7s %7s %6s %6s %7s %6s %8s %8s %6s\n", "codec", "payload",
         "ratio", "store", "x blk", "->nvme", "load", "x blk", "x ctg", "batch", "x ctg",
         "trusted", "nvme ld", "x blk");
  printf("%-8s %8s %6s %7s %6s %7s %7s %6s %6s %7s %6s %8s %8s %6s\n", "", "MiB", "", "GB/s",
         "D2H", "GB/s", "GB/s", "H2D", "H2D", "GB/s", "H2D", "GB/s", "GB/s", "H2D");
}

static void print_row(const obench *b, const char *name, const orow *r, const obase *o) {
  const double kv = (double)kv_bytes(b->tokens) / 1e9;
  const double d2h = kv / o->t[0], h2d = kv / o->t[1], ctg = kv / o->t[5];
  const double st = kv / r->t[0], ld = kv / r->t[2];
  printf("%-8s %8.1f %6.2f %7.1f %6.2f ", name, (double)r->payload / (1 << 20),
         (double)kv_bytes(b->tokens) / (double)r->payload, st, st / d2h);
  if (b->nvme)
    printf("%7.1f ", kv / r->t[1]);
  else
    printf("%7s ", "-");
  printf("%7.1f %6.2f %6.2f %7.1f %6.2f %8.1f ", ld, ld / h2d, ld / ctg, kv / r->t[5],
         kv / r->t[5] / ctg, kv / r->t[3]);
  if (b->nvme)
    printf("%8.1f %6.2f\n", kv / r->t[4], (kv / r->t[4]) / h2d);
  else
    printf("%8s %6s\n", "-", "-");
}

/* ---- command line ------------------------------------------------------------- */

/* Splits --codecs into names, each checked by the codec parser. */
static int parse_codecs(kvt_ctx *ctx, char *list, const char **names, size_t *n) {
  *n = 0;
  for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok;
       tok = strtok_r(NULL, ",", &save)) {
    kvt_codec_spec spec;
    if (*n == MAX_CODECS)
      return cli_usage_error("bench offload", "--codecs: at most %d", MAX_CODECS);
    if (kvt_codec_parse(ctx, tok, &spec) != 0)
      return cli_usage_error("bench offload", "--codecs: '%s': %s", tok,
                             kvt_ctx_last_error(ctx));
    names[(*n)++] = tok;
  }
  if (*n == 0)
    return cli_usage_error("bench offload", "--codecs: no codec");
  return 0;
}

static int run_all(obench *b, const char *const *codecs, size_t n_codecs,
                   const uint32_t *chunks, size_t n_chunks) {
  obase base;
  int rc = batch_prepare(b);
  if (!rc)
    rc = run_baselines(b, &base);
  if (rc)
    return rc;
  print_baselines(b, &base);
  for (size_t c = 0; c < n_chunks && !rc; c++) {
    print_header(b, chunks[c]);
    for (size_t i = 0; i < n_codecs && !rc; i++) {
      orow r;
      if ((rc = run_codec(b, codecs[i], chunks[c], &r)) == 0)
        print_row(b, codecs[i], &r, &base);
      fflush(stdout);
    }
  }
  if (!rc)
    printf("\ncheck: the first and last chunk's blocks restored exactly (raw: every bit; "
           "others: as the CPU decode) after every load phase and the block H2D baseline\n");
  return rc;
}

int cli_bench_offload_main(int argc, char **argv) {
  uint32_t iters = 0, tokens = 0, chunk = 0;
  int quick = 0;
  const char *codecs_s = "raw,k16v8,fp8,int8,int4", *nvme_s = NULL;
  const cli_opt opts[] = {
      {"--quick", NULL, CLI_FLAG, &quick, 0, 0},
      {"--iters", NULL, CLI_U32, &iters, 1, MAX_ITERS},
      {"--tokens", NULL, CLI_U32, &tokens, 1024, MAX_TOKENS},
      {"--chunk", NULL, CLI_U32, &chunk, 256, 1024},
      {"--codecs", NULL, CLI_STR, &codecs_s, 0, 0},
      {"--nvme", NULL, CLI_STR, &nvme_s, 0, 0},
  };
  size_t npos = 0;
  int rc = cli_parse("bench offload", argc, argv, opts, sizeof(opts) / sizeof(opts[0]), NULL, 0,
                     &npos);
  if (rc == CLI_HELP) {
    fputs(offload_help, stdout);
    return CLI_OK;
  }
  if (rc)
    return rc;
  if (tokens % 1024)
    return cli_usage_error("bench offload", "--tokens: a multiple of 1024, got %u", tokens);
  if (chunk && chunk != 256 && chunk != 1024)
    return cli_usage_error("bench offload", "--chunk: 256 or 1024, got %u", chunk);
  if (nvme_s && !*nvme_s)
    return cli_usage_error("bench offload", "--nvme: a directory or 'off'");
  iters = iters ? iters : quick ? 2 : 3;
  tokens = tokens ? tokens : quick ? 8192 : 32768;
  chunk = chunk ? chunk : quick ? 256 : 0;
  static const uint32_t all_chunks[2] = {256, 1024};
  const uint32_t *chunks = chunk ? &chunk : all_chunks;
  const size_t n_chunks = chunk ? 1 : 2;

  obench b;
  memset(&b, 0, sizeof(b));
  b.iters = iters;
  b.tokens = tokens;
  b.nblocks = 2 * tokens / BS;
  const char *codecs[MAX_CODECS];
  size_t n_codecs = 0;
  char *list = strdup(codecs_s);
  if (!list) {
    cli_error("bench offload: out of memory");
    return CLI_EFAIL;
  }
  if ((rc = kvt_ctx_create(NULL, &b.ctx)) != 0) {
    free(list);
    cli_error("bench offload: context: %s", kvt_strerror(rc));
    return CLI_EFAIL;
  }
  if ((rc = parse_codecs(b.ctx, list, codecs, &n_codecs)) == 0) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
      cli_error("bench offload: no CUDA device");
      rc = CLI_EFAIL;
    }
  }
  if (rc == 0) {
    struct cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    printf("kvtier bench offload: %s (%d SMs), kvtier %s\n", prop.name,
           prop.multiProcessorCount, kvt_version_string());
    printf("command: kvtier bench offload --iters %u --tokens %u%s --codecs %s --nvme %s\n",
           iters, tokens, chunk == 256 ? " --chunk 256" : chunk == 1024 ? " --chunk 1024" : "",
           codecs_s, nvme_s ? nvme_s : "(a new directory under /var/tmp)");
    rc = setup_cache(&b);
    if (!rc)
      rc = setup_tiers(&b, nvme_s, chunk ? chunk : 1024);
  }
  if (rc == 0) {
    printf("cache: Llama-3.1-8B shape (32 layers, 8 KV heads, dim 128), bf16, legacy vLLM "
           "layout, 16-token blocks, %u slots, shuffled; context %u tokens = %.2f GiB of "
           "bf16 K+V\n", 2 * tokens, tokens, (double)kv_bytes(tokens) / (1u << 30));
    printf("tiers: %s; %s\n", kvt_tier_spec(b.dram),
           b.nvme ? kvt_tier_spec(b.nvme) : "no nvme");
    printf("verified loads: OFFLOAD_LOAD_FLAGS = 0x%x%s\n", OFFLOAD_LOAD_FLAGS,
           OFFLOAD_LOAD_FLAGS == 0 ? " (with verdicts: section checksums verified on the GPU)"
                                   : "");
    printf("wall times, medians of %u iterations after 1 warm-up; GB = 1e9 bytes\n", iters);
    fflush(stdout);
    rc = run_all(&b, codecs, n_codecs, chunks, n_chunks);
  }
  teardown(&b);
  free(list);
  return rc == CLI_EUSAGE ? CLI_EUSAGE : rc ? CLI_EFAIL : CLI_OK;
}
#endif
