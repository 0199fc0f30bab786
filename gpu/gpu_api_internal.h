/* gpu/gpu_api_internal.h - what the host half of the GPU API shares between
 * its files: the layout handle (struct kvt_gpu_layout: device pointers,
 * status word, staging slots and their events, checksum scratch, the store
 * in flight), built in gpu_layout.c, and the helpers that the store path
 * (gpu_store.c) and the load path (gpu_load.c) both use: launch parameters,
 * staged pieces, the slots' turns and scratch, CUDA errors. Internal: not
 * installed, plain C, no CUDA headers. */
#ifndef KVT_GPU_API_INTERNAL_H
#define KVT_GPU_API_INTERNAL_H

#include "codec_internal.h"
#include "kvt_gpu_layout.h"
#include "kvtier/gpu.h"
#include "payload_layout.h"

#ifdef KVT_HAVE_CUDA

#define NSLOT 3

struct kvt_gpu_layout {
  kvt_ctx *ctx;
  kvt_gpu_layout_desc d; /* the descriptor, pointer arrays dropped */
  uint64_t *dev_ptrs;    /* [2 * layers]: K bases, then V bases */
  uint8_t *dev_aux;      /* kvt_gpu_status, then the amax floats (AUX_BYTES) */
  int align16, align4;   /* every base and stride allows 16- / 4-byte accesses */
  /* Staged loads (kvt_gpu_load): NSLOT device slots of slot_bytes, a copy
   * stream, and per slot an event after its copy and one after the kernels
   * that read it. */
  uint8_t *staging;
  uint64_t slot_bytes;
  void *copy_stream, *ev_start;
  void *ev_copied[NSLOT], *ev_free[NSLOT];
  uint32_t next_slot;
  /* Per slot, for the checksum kernels of staged stores and of loads
   * verified on the GPU: a gate word per payload of a batched piece (device
   * [NSLOT][KVT_GPU_BATCH_MAX], then a counter per slot: slot_gate,
   * slot_counter) and digest scratch; guarded by the slot's events like its
   * bytes. */
  uint32_t *gates;
  uint64_t *slot_digests[NSLOT];
  uint64_t slot_digest_words[NSLOT];
  /* The pinned payload the last kvt_gpu_store_async sealed on the GPU; the
   * first payload, count and every destination (batch_tag) of the last
   * kvt_gpu_store_batch_async. */
  const void *sealed_dst;
  const void *batch_dst;
  uint32_t batch_n;
  uint64_t batch_tag;
  /* A batched store's per-payload error codes (device [item_words], grown on
   * demand), so that finish seals the payloads that stored cleanly. */
  uint32_t *item_codes;
  uint32_t item_words;
  /* Format 2 checksums of device payloads: the pieces' digests (device
   * scratch, grown on demand; calls on one layout take turns). */
  uint64_t *digests;
  uint64_t digest_words;
};

/* The status word, then the layer-scale maxima of a store launch (of up to
 * KVT_GPU_BATCH_MAX payloads). */
#define AUX_BYTES \
  (sizeof(kvt_gpu_status) + 2 * KVT_MAX_LAYERS * KVT_GPU_BATCH_MAX * sizeof(float))

/* The gate of payload k of slot's piece, and the slot's checksum counter. */
static inline uint32_t *slot_gate(const kvt_gpu_layout *L, uint32_t slot, uint32_t k) {
  return L->gates + (uint64_t)slot * KVT_GPU_BATCH_MAX + k;
}
static inline unsigned *slot_counter(const kvt_gpu_layout *L, uint32_t slot) {
  return L->gates + NSLOT * KVT_GPU_BATCH_MAX + slot;
}

/* The largest section of kp's layers [first, first + count) (stored = raw:
 * the GPU path has no lossless stage): an n16 section only where a raw layer
 * is among them. */
static inline uint64_t max_section(const kvt_gpu_kparams *kp) {
  uint64_t m = kp->sec_bytes[0] > kp->sec_bytes[1] ? kp->sec_bytes[0] : kp->sec_bytes[1];
  const uint32_t lo = kp->layer_begin + kp->first, hi = lo + kp->count;
  if (kvt_gpu_raw_below(kp, hi) > kvt_gpu_raw_below(kp, lo) && kp->raw_bytes > m)
    m = kp->raw_bytes;
  return m;
}

static inline int cuda_fail(kvt_ctx *ctx, int err, const char *what) {
  return kvt_fail(ctx, KVT_ECUDA, "%s: %s (CUDA error %d)", what, kvt_gpurt_error_string(err),
                  err);
}

/* The next staging slot in turn. */
static inline uint32_t take_slot(kvt_gpu_layout *L) {
  const uint32_t slot = L->next_slot;
  L->next_slot = (slot + 1) % NSLOT;
  return slot;
}

/* What a launch reads and writes, for the choice of its chunk. */
enum { CHUNK_STORE = 0, CHUNK_LOAD_DEVICE = 1, CHUNK_LOAD_HOST = 2 };

/* Bytes [*begin, *end) of payload-relative layer i that a transfer moves. */
typedef void (*span_fn)(const kvt_gpu_kparams *kp, uint32_t i, uint64_t size, uint64_t *begin,
                        uint64_t *end);

/* gpu_layout.c: the device address of a payload buffer, with its kind. */
int gpu_payload_addr(kvt_ctx *ctx, const void *p, int *kind, uint8_t **dev);
/* -EINVAL where two items of a batch overlap in what a pointer field of
 * theirs addresses (its comment in gpu_layout.c). */
int gpu_distinct_ranges(kvt_ctx *ctx, const void *items, size_t stride, size_t field,
                        uint64_t len, uint32_t n, const char *fn, const char *what);
/* Digest scratch of the handle (format 2 checksums of device payloads) and
 * of a slot (of a staged piece of `items` payloads), grown on demand. */
int gpu_digests_for(kvt_gpu_layout *L, uint32_t count, const kvt_gpu_kparams *kp,
                    uint64_t **out);
int gpu_slot_digests(kvt_gpu_layout *L, uint32_t slot, const kvt_gpu_kparams *kp,
                     uint32_t items, uint64_t **out);
/* A launch's parameters (fill_kparams) and its chunk for mode (set_chunk). */
void gpu_set_chunk(kvt_gpu_layout *L, const kvt_codec_spec *spec, int mode, uint32_t items,
                   kvt_gpu_kparams *kp);
int gpu_fill_kparams(kvt_gpu_layout *L, const kvt_codec_spec *spec, uint32_t tokens,
                     uint32_t layer_begin, uint32_t payload_layers, uint32_t first,
                     uint32_t count, const int64_t *slots, uint8_t *payload, int load,
                     kvt_gpu_kparams *kp);
/* The next piece of a staged transfer, and the clean-up after a failure
 * midway through one (their comments in gpu_layout.c). */
void gpu_plan_piece(const kvt_gpu_layout *L, const kvt_gpu_kparams *kp, span_fn span,
                    uint64_t size, uint32_t a, uint32_t stop, uint32_t n, uint64_t left,
                    int one_layer, uint32_t *nl, uint64_t *begin, uint64_t *end,
                    uint64_t *stride, uint32_t *per);
void gpu_staged_abandon(kvt_gpu_layout *L, uint32_t slot, void *stream);

#endif /* KVT_HAVE_CUDA */
#endif
