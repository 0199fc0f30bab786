/* kvtier/gpu.h - fused GPU store and load between an engine's paged KV cache
 * and kvtier payloads.
 *
 * Store reads the engine's K/V blocks, quantizes them in registers and writes
 * the payload's section bytes; load reads a payload, dequantizes in registers
 * and writes the values straight into the engine's slots. Neither goes
 * through a temporary 16-bit buffer. The bytes are those of the CPU reference
 * codec: a GPU-stored payload equals kvt_encode()'s output byte for byte, and
 * a GPU load writes the same bits into the slots as kvt_decode() writes into
 * a dense view (serde/FORMAT.md section 4 fixes the arithmetic).
 *
 * The engine's cache is described once by a kvt_gpu_layout_desc (per-layer
 * base pointers and element strides) and registered with
 * kvt_gpu_layout_create(); a chunk's tokens are given as a slot mapping
 * (token t of the chunk lives in slot slots[t], block slots[t] / block_size,
 * offset slots[t] % block_size), as vLLM's slot_mapping.
 *
 * Streams are passed as `void *` (a cudaStream_t; NULL is the legacy default
 * stream): this header includes no CUDA header and compiles as C and C++.
 * CUDA failures return KVT_ECUDA with the failing call, CUDA's error string
 * and number in kvt_ctx_last_error(). Nothing here aborts or exits.
 *
 * Built without CUDA, every function below exists and returns KVT_ENOTSUP
 * (the kvt_gpu_layout_desc_* fillers work in both builds).
 *
 * Thread-safety: a layout handle may be used by one thread at a time, and
 * one store per handle may be in flight at a time (the handle holds the
 * store's device status word, which a checked load of a device-memory
 * payload uses too); loads on one handle may run on several streams at once.
 * Its context's last-error detail is written by calls on it. */
#ifndef KVTIER_GPU_H
#define KVTIER_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier/payload.h"

#ifdef __cplusplus
extern "C" {
#endif

/* An engine's per-layer KV cache. Element (block b, offset o, head h, dim d)
 * of K in layer l lives at
 *   (16-bit *)k_layers[l] + k_offset + b*stride_block + o*stride_token
 *                         + h*stride_head + d
 * and V likewise from v_layers[l] (or k_layers[l] when v_layers is NULL) and
 * v_offset. Strides and offsets are in 16-bit elements. The head_dim elements
 * of one (slot, head) must be contiguous. Pointers are device pointers. The
 * kernels use 16-byte accesses when every row start is 16-byte aligned and
 * narrower ones otherwise; i4 formats need rows at least 4-byte aligned. */
typedef struct kvt_gpu_layout_desc {
  size_t struct_size;          /* sizeof(kvt_gpu_layout_desc) */
  int dtype;                   /* enum kvt_dtype: bf16 or fp16 */
  uint32_t layers;             /* layers described: entries of k_layers */
  uint32_t layer_begin;        /* absolute model layer of k_layers[0] */
  uint32_t heads, head_dim;    /* KV heads (of this rank) and head dim */
  uint32_t block_size;         /* tokens per block (page); 1 for per-token slots */
  uint32_t num_blocks;         /* blocks per layer: slots are < num_blocks*block_size */
  int64_t stride_block, stride_token, stride_head;
  int64_t k_offset, v_offset;
  void *const *k_layers;       /* host array of `layers` device pointers */
  void *const *v_layers;       /* NULL: V is in the k_layers tensors too */
  /* Appended in 0.3 (a descriptor whose struct_size ends before it reads as
   * 0): device memory the handle keeps for staged loads from pinned host
   * payloads (see kvt_gpu_load), for stores into pinned memory sealed on
   * the GPU (kvt_gpu_store_async) and for the checksum scratch of loads
   * verified on the GPU; 0 for none (stores into pinned memory are then
   * sealed on the host, and verdicts are done on return). The fillers below
   * set KVT_GPU_STAGING_DEFAULT. */
  uint64_t staging_bytes;
} kvt_gpu_layout_desc;

/* 64 MiB: three slots of ~21 MiB, each holding whole layers of a payload. */
#define KVT_GPU_STAGING_DEFAULT (64ull << 20)

/* Fillers for the engine layouts, all of one layer tensor per layer
 * (layer_tensors[l]) unless said otherwise. They write every field of *d
 * (layer_begin 0) and keep the pointer arrays by reference: the arrays must
 * live until kvt_gpu_layout_create() returns. */
/* Legacy vLLM flash-attn: [2, num_blocks, block_size, heads, head_dim] per
 * layer, K then V (vLLM before the KVCacheLayout of RFC #42082; current vLLM:
 * kvt_gpu_layout_desc_vllm_v1 below). */
KVT_API void kvt_gpu_layout_desc_vllm(kvt_gpu_layout_desc *d, int dtype, uint32_t layers,
                                      void *const *layer_tensors, uint32_t num_blocks,
                                      uint32_t block_size, uint32_t heads, uint32_t head_dim);
/* FlashInfer NHD: [num_blocks, 2, block_size, heads, head_dim] per layer. */
KVT_API void kvt_gpu_layout_desc_flashinfer_nhd(kvt_gpu_layout_desc *d, int dtype,
                                                uint32_t layers, void *const *layer_tensors,
                                                uint32_t num_blocks, uint32_t block_size,
                                                uint32_t heads, uint32_t head_dim);
/* FlashInfer HND: [num_blocks, 2, heads, block_size, head_dim] per layer. */
KVT_API void kvt_gpu_layout_desc_flashinfer_hnd(kvt_gpu_layout_desc *d, int dtype,
                                                uint32_t layers, void *const *layer_tensors,
                                                uint32_t num_blocks, uint32_t block_size,
                                                uint32_t heads, uint32_t head_dim);
/* Separate K and V buffers indexed by slot (SGLang's MHATokenToKVPool):
 * k_buffers[l] and v_buffers[l] are [num_slots, heads, head_dim]. */
KVT_API void kvt_gpu_layout_desc_separate(kvt_gpu_layout_desc *d, int dtype, uint32_t layers,
                                          void *const *k_buffers, void *const *v_buffers,
                                          uint32_t num_slots, uint32_t heads,
                                          uint32_t head_dim);

/* Current vLLM's KV cache layouts (vLLM 0.33, vllm/v1/kv_cache_layout.py,
 * RFC #42082): the physical order of the logical axes [L, B, H, N, C] =
 * [layers, blocks, heads, tokens of a block, K and V of a head side by side],
 * one enumerator per KVCacheLayout member, in its order. vLLM's default is
 * LBNHC ("NHD"); LBHNC is "HND". */
enum kvt_vllm_layout {
  KVT_VLLM_LBHNC = 0,
  KVT_VLLM_LBNHC = 1,
  KVT_VLLM_LHBNC = 2,
  KVT_VLLM_BLHNC = 3,
  KVT_VLLM_BLNHC = 4,
  KVT_VLLM_BHLNC = 5,
  KVT_VLLM_NHD = KVT_VLLM_LBNHC,
  KVT_VLLM_HND = KVT_VLLM_LBHNC
};

/* Current vLLM (0.33): each attention layer's cache is a view of logical
 * shape [num_blocks, heads, block_size, 2*head_dim] whose last axis holds K
 * in [0, head_dim) and V in [head_dim, 2*head_dim) (flash-attn's
 * kv_cache.transpose(1, 2).split(head_size, -1)); `layout` (enum
 * kvt_vllm_layout) orders the axes in memory. layer_tensors[l] is layer l's
 * view's data_ptr(). The strides are vLLM's compute_layout_strides for a
 * backing tensor of exactly `layers` layers with unpadded pages; where vLLM
 * pads pages or packs other layers into the same blocks, set
 * d->stride_block (and stride_head for LHBNC / BHLNC) to the view's strides
 * afterwards, or derive every stride from the tensors (the Python handle,
 * kvtier.gpu.PagedKV, does). An unknown layout leaves d->layers 0, which
 * kvt_gpu_layout_create refuses (KVT_ESHAPE). Caches vLLM quantizes (fp8 and
 * the other kv_cache_dtype modes) and MLA's single latent are not this
 * layout and cannot be described. */
KVT_API void kvt_gpu_layout_desc_vllm_v1(kvt_gpu_layout_desc *d, int dtype, uint32_t layers,
                                         void *const *layer_tensors, uint32_t num_blocks,
                                         uint32_t block_size, uint32_t heads,
                                         uint32_t head_dim, int layout);

typedef struct kvt_gpu_layout kvt_gpu_layout;

/* Registers a layout on the current CUDA device: checks the descriptor,
 * copies the per-layer pointers into device memory, allocates the handle's
 * small device status buffer and its staging memory (staging_bytes), and
 * creates its copy stream and events. On the data path only the checksum
 * scratch grows (cudaMalloc; cudaFree waits for the device), the first time
 * a payload's sections need more digests than the handle made for its
 * staging slots (a device payload of more than about 50 MiB verified on the
 * GPU, or a very uneven raw-layer shape). *out is written only on success. ctx must outlive the
 * handle. Returns 0, -EINVAL (NULL argument, struct_size too small),
 * KVT_ESHAPE (dtype, zero or oversized dimension, a head_dim row that is not
 * contiguous, a NULL layer pointer), KVT_ECUDA, -ENOMEM, KVT_ENOTSUP. */
KVT_API int kvt_gpu_layout_create(kvt_ctx *ctx, const kvt_gpu_layout_desc *desc,
                                  kvt_gpu_layout **out);
/* Frees the handle's device memory. Accepts NULL. No work using it may be
 * in flight. */
KVT_API void kvt_gpu_layout_destroy(kvt_gpu_layout *layout);

/* Where a payload buffer lives, as CUDA reports it for a pointer. */
enum kvt_gpu_mem {
  KVT_GPU_MEM_PAGEABLE = 0, /* ordinary host memory: the kernels cannot reach it */
  KVT_GPU_MEM_PINNED = 1,   /* page-locked host memory mapped into the device */
  KVT_GPU_MEM_DEVICE = 2    /* device (or managed) memory */
};
/* Which of the above p is. Returns 0 or KVT_ECUDA / KVT_ENOTSUP. */
KVT_API int kvt_gpu_mem_kind(kvt_ctx *ctx, const void *p, int *kind);

/* Page-locks len bytes of host memory at p and maps them into every device
 * (cudaHostRegister, portable and mapped), so DMA and the load kernel read
 * them at full speed; kvt_gpu_host_unregister undoes it (before the memory is
 * freed). The dram tier does this for its slabs. Thread-safe. Returns 0,
 * -EINVAL, KVT_ENOTSUP (built without CUDA, or no CUDA device: the caller
 * keeps ordinary memory) or KVT_ECUDA (detail in ctx when ctx is not NULL;
 * the data path passes NULL). */
KVT_API int kvt_gpu_host_register(kvt_ctx *ctx, void *p, size_t len);
KVT_API int kvt_gpu_host_unregister(kvt_ctx *ctx, void *p);

/* A store of one chunk: `tokens` tokens at slots[0..tokens) (a device array
 * of int64 slots, as vLLM's slot_mapping), layers [layer_begin, layer_begin +
 * layer_count) (absolute; within the layout). */
typedef struct kvt_gpu_store_params {
  size_t struct_size;         /* sizeof(kvt_gpu_store_params) */
  /* Host memory, read during the call only: spec, key, fingerprint,
   * model_layers (0: layer_count, as kvt_encode), layer_begin, token_begin;
   * zstd_level must be 0. The same params kvt_encode() takes, so one
   * kvt_encode_params gives the same payload bytes from the CPU and the GPU.
   * A pointer, not a member, so either struct can grow (docs/API.md). */
  const kvt_encode_params *encode;
  uint32_t layer_count;       /* layers stored */
  uint32_t tokens;            /* chunk tokens: entries of slots */
  const int64_t *slots;       /* device array [tokens]: each in [0, num_blocks*block_size) */
} kvt_gpu_store_params;

#define KVT_GPU_STORE_PARAMS_INIT { sizeof(kvt_gpu_store_params), NULL, 0, 0, NULL }

/* Bytes the payload of a store takes (exact, as kvt_encode_bound()), after
 * the checks kvt_gpu_store_async makes of p. */
KVT_API int kvt_gpu_store_bound(kvt_gpu_layout *layout, const kvt_gpu_store_params *p,
                                uint64_t *out);

/* Stores one chunk into dst[0..cap): pinned host memory mapped into the
 * device (cudaHostAlloc / cudaMallocHost / cudaHostRegister with unified
 * addressing), or device memory. kvt_gpu_store_async writes the header and
 * section table (checksums zero: from the host into pinned memory, or by an
 * asynchronous copy into device memory), launches one kernel on `stream` that
 * writes every section byte (and a small one before it for layer-granular
 * scales), then the checksum kernels that fill the section checksums
 * (format 2: every 4 KiB piece hashed by its own group of lanes,
 * serde/FORMAT.md section 3), sets *len to the payload size and returns
 * without waiting. Into device memory the kernels write the payload in
 * place and seal it (the header checksum too). Into pinned memory on a
 * handle with staging memory (kvt_gpu_layout_desc.staging_bytes) whose
 * layers each fit a slot, the kernel writes pieces of whole layers into the
 * staging slots, the checksum kernels seal each piece there (its section
 * checksums go into dst's table) and the copy engine moves it to dst while
 * the next piece is stored; otherwise the kernel writes dst directly and
 * kvt_gpu_store_finish computes the section checksums on the host.
 * kvt_gpu_store_finish waits for the stream, checks the kernel's status
 * (KVT_ENONFINITE: a NaN/Inf in a tensor to be quantized, named by layer,
 * token, head and dim; not necessarily the first one the CPU encoder would
 * name; KVT_ERANGE: an i4 group out of fp16 range) and, for pinned memory,
 * writes the header checksum (and the section checksums where the GPU did
 * not). Only a finished payload is valid (kvt_payload_verify accepts its
 * bytes); after an error its bytes are garbage. kvt_gpu_store does both.
 * Slots outside [0, num_blocks*block_size) are read as zeros. dst must be
 * 16-byte aligned and not in use by work still queued on the GPU (the header
 * is written from the host at once).
 * Returns 0; -EINVAL (NULL p or p->encode, a struct_size too small);
 * KVT_ESPEC; KVT_ESHAPE (dtype, heads or head_dim differ
 * from the layout's, layers outside it, i4 shape rules); KVT_ETOOBIG;
 * KVT_ENOBUFS; KVT_ENOTSUP (zstd asked for; dst pageable host memory);
 * KVT_ECUDA; and from finish KVT_ENONFINITE, KVT_ERANGE. */
KVT_API int kvt_gpu_store_async(kvt_gpu_layout *layout, const kvt_gpu_store_params *p,
                                void *dst, size_t cap, size_t *len, void *stream);
KVT_API int kvt_gpu_store_finish(kvt_gpu_layout *layout, void *dst, size_t len, void *stream);
KVT_API int kvt_gpu_store(kvt_gpu_layout *layout, const kvt_gpu_store_params *p, void *dst,
                          size_t cap, size_t *len, void *stream);

/* One payload of a batched store (kvt_gpu_store_batch_async). The items
 * of an array are items[0].struct_size bytes apart, so the struct can grow
 * (docs/API.md). */
typedef struct kvt_gpu_store_item {
  size_t struct_size;                 /* sizeof(kvt_gpu_store_item), the same in every item */
  const kvt_gpu_store_params *params; /* its chunk: encode params (key, fingerprint,
                                         token_begin...) and slots */
  void *dst;  /* pinned host memory mapped into the device, 16-byte aligned */
  size_t cap; /* bytes at dst */
  size_t len; /* out: the payload's size */
} kvt_gpu_store_item;

#define KVT_GPU_STORE_ITEM_INIT { sizeof(kvt_gpu_store_item), NULL, NULL, 0, 0 }

/* Added in 0.3.3. Stores n chunks of one geometry - the same spec,
 * model_layers, layer_begin, layer_count and tokens; keys, fingerprints,
 * token_begin and slots their own - each into its pinned dst, with kernels
 * that each store a layer range of up to 64 chunks (kvt_gpu_store_async
 * makes a launch per chunk and piece), through the handle's staging slots:
 * each piece is stored, sealed on the GPU and copied to the chunks' dst by
 * the copy engine (one copy per chunk, at least 4 MiB where the slots
 * allow), as kvt_gpu_store_async does for one. Every item is checked
 * before anything is launched (kvt_gpu_store_async's errors, the detail
 * naming "item k"). Needs staging memory whose slots hold one layer of a
 * chunk (KVT_ENOTSUP otherwise; use kvt_gpu_store_async). Returns without
 * waiting; kvt_gpu_store_batch_finish, with the same items, waits and
 * writes each header checksum. A NaN/Inf or i4 range error is reported as
 * kvt_gpu_store_finish reports it, naming the item (and how many failed):
 * the chunks that stored cleanly are still sealed and valid, each failed
 * one's len is set to 0 (its bytes are garbage). The batch counts as the
 * handle's one store in flight; finish it on the stream it was launched on,
 * with the same items. The destinations must be distinct and not in use by
 * work still queued on the GPU (the headers are written from the host at
 * once; two items whose payloads would overlap are refused). A call refused
 * before the launch leaves an earlier batch's finish intact. Returns 0;
 * -EINVAL (NULL or no items, an items[0].struct_size too small or not a
 * multiple of the item's alignment, NULL params or destination,
 * overlapping destinations; finish: not the items of the batch in flight,
 * every destination compared); -ENOMEM; kvt_gpu_store_async's errors for an item
 * (KVT_ESPEC, KVT_ESHAPE - also for another geometry than item 0's -,
 * KVT_ETOOBIG, KVT_ENOBUFS), named "item k"; KVT_ENOTSUP (a destination
 * in device memory, no staging memory, a layer larger than a slot);
 * KVT_ECUDA; and from finish KVT_ENONFINITE, KVT_ERANGE. */
KVT_API int kvt_gpu_store_batch_async(kvt_gpu_layout *layout, kvt_gpu_store_item *items,
                                      uint32_t n, void *stream);
KVT_API int kvt_gpu_store_batch_finish(kvt_gpu_layout *layout, kvt_gpu_store_item *items,
                                       uint32_t n, void *stream);

/* What a load trusts. */
enum kvt_gpu_load_flags {
  /* For a payload in device memory: skip the section checksums (its header
   * and table are still copied to the host and checked), for payloads this
   * process stored or verified itself (the HBM tier). */
  KVT_GPU_LOAD_TRUST_DEVICE = 1u,
  /* For a payload in pinned host memory: skip the section checksums (the
   * header and table are still parsed and checked), because the caller
   * verified the whole payload already (kvt_payload_verify when its tier
   * returned it) and nothing has written it since. */
  KVT_GPU_LOAD_TRUST_HOST = 2u,
  /* For a payload in pinned host memory on a handle with staging memory:
   * have the load kernel read the host memory itself instead of staging. */
  KVT_GPU_LOAD_ZERO_COPY = 4u,
  /* For a payload in pinned host memory on a handle with staging memory:
   * stage it whatever its size (without either flag, loads of 4 MiB or
   * more are staged and smaller ones read by the kernel). */
  KVT_GPU_LOAD_STAGED = 8u
};

/* The outcome of a load whose section checksums the GPU verifies in stream
 * order (kvt_gpu_load_params.verdict). It lives in pinned host memory mapped
 * into the device (cudaHostAlloc, cudaMallocHost, cudaHostRegister with
 * unified addressing; a pinned torch tensor): kvt_gpu_load writes it from
 * the host, the GPU writes done and bad_section, and kvt_gpu_verdict_check
 * reads it once the stream has passed the load. */
typedef struct kvt_gpu_verdict {
  uint32_t done;        /* 0 until every check of the load has run, then 1 */
  uint32_t bad_section; /* ~0u: every checked section matched; else one that did not
                           (0xFFFFFFFE: the device header is not the caller's copy) */
  uint32_t layer_begin; /* the payload's first absolute layer (for messages) */
  uint32_t sections;    /* sections the load reads */
  uint64_t reserved[2]; /* written 0 by kvt_gpu_load: later outputs */
} kvt_gpu_verdict;

typedef struct kvt_gpu_load_params {
  size_t struct_size;                /* sizeof(kvt_gpu_load_params) */
  const kvt_key *expect_key;         /* NULL, or the key the payload must carry */
  const kvt_key *expect_fingerprint; /* NULL, or the model it must belong to */
  uint32_t layer_first;              /* first layer loaded, relative to the payload */
  uint32_t layer_count;              /* 0: every layer from layer_first on */
  uint32_t tokens;                   /* entries of slots: must equal the payload's */
  const int64_t *slots;              /* device array [tokens]; slots outside
                                        [0, num_blocks*block_size) are skipped */
  uint32_t flags;                    /* enum kvt_gpu_load_flags */
  /* NULL: one kernel for all the layers. Else an array of one cudaEvent_t
   * per layer loaded: the layers are launched one kernel each, in order,
   * and layer_events[i] is recorded on the stream after layer layer_first+i,
   * so an engine can start computing layer l while later layers load. */
  void *const *layer_events;
  /* Appended in 0.3 (older struct sizes read as NULL). For a payload in
   * device memory: NULL, or a host copy of its header and section table
   * (at least its first header_size bytes; kvt_payload_parse reads the
   * size) that the caller keeps, e.g. from when it stored the payload.
   * It is parsed and checked instead of the device bytes, which saves the
   * two synchronous device-to-host copies of the header a load otherwise
   * makes; the caller vouches that it equals the device payload's header
   * (section checksums are then taken from it). Ignored for host payloads. */
  const void *header;
  size_t header_len; /* bytes at header */
  /* Appended in 0.3.2 (older struct sizes read as NULL). NULL: every check
   * is made before the launch, as described at kvt_gpu_load. Else the
   * section checksums are verified on the GPU as the bytes move, and the
   * outcome is written here instead of being returned: see "Verified on the
   * GPU" at kvt_gpu_load. */
  kvt_gpu_verdict *verdict;
} kvt_gpu_load_params;

#define KVT_GPU_LOAD_PARAMS_INIT \
  { sizeof(kvt_gpu_load_params), NULL, NULL, 0, 0, 0, NULL, 0, NULL, NULL, 0, NULL }

/* Loads the chosen layers of payload[0..len) into the layout's slots with
 * one kernel on `stream` (or one per layer, see layer_events), returning
 * once launched (the payload and slots must stay valid until the stream
 * reaches the work). Everything below is checked before the first launch.
 *
 * How a payload in pinned host memory reaches the kernel: when the handle
 * has staging memory (kvt_gpu_layout_desc.staging_bytes; the fillers'
 * default) and the loaded sections are 4 MiB or more (or
 * KVT_GPU_LOAD_STAGED is set; KVT_GPU_LOAD_ZERO_COPY says never), the copy
 * engine (cudaMemcpyAsync on the handle's own stream) copies them into the
 * staging slots in pieces of whole layers that shrink towards the end (half
 * of what is left, at least 8 MiB, at most a slot), and the kernel loads
 * each piece from device memory while the next one copies. The copy moves
 * the payload's compressed bytes only; dequantization still happens in the
 * kernel's registers (measured ratios to cudaMemcpy: README.md, GPU
 * section). Work queued on `stream` before the call runs before the copies
 * read the payload. A load with a layer larger than
 * a staging slot (staging_bytes / 3) is read from host memory by the kernel
 * (zero copy), as is every load on a handle without staging memory. Staged
 * loads on one handle share its slots and are ordered by events, so loads
 * on several streams stay correct but do not overlap each other's copies.
 *
 * What is verified before the launch, on the host (with a verdict, the
 * section checksums are verified on the GPU instead: see below):
 * - payload in mapped pinned host memory: everything kvt_decode checks -
 *   the header checksum, every header field and section-table entry, the
 *   key and fingerprint expectations, and the section checksum of every
 *   section that is loaded (sections not loaded are not read; with
 *   KVT_GPU_LOAD_TRUST_HOST no section checksum);
 * - payload in device memory: the header and section table, copied to the
 *   host synchronously, with their checksum, fields and expectations; then
 *   the checksum of every loaded section, computed by kernels on `stream`
 *   (4 KiB pieces in parallel for format 2 payloads, one section per group
 *   of lanes for format 1; the call waits for the stream), unless
 *   KVT_GPU_LOAD_TRUST_DEVICE says to skip it. The status word of the handle
 *   is used: not while a store on the same handle is in flight.
 *
 * Verified on the GPU (p->verdict set, on a handle with staging memory,
 * neither TRUST flag): the header, table and expectations are still checked
 * on the host before the launch (errors returned as above), but the section
 * checksums are computed on `stream` by the checksum kernels, in stream
 * order and in pieces of whole layers: a payload in pinned host memory is
 * staged whatever its size and each staged piece is hashed in its slot
 * before the load kernel reads it there; a payload in device memory is
 * hashed whole, then loaded. The call returns once everything is launched,
 * without waiting. A piece whose checksum does not match is not loaded
 * (its load kernel writes nothing); other pieces of a staged load are. The
 * verdict says what happened once the stream has passed the load:
 * kvt_gpu_verdict_check. On a mismatch treat
 * the whole chunk as a miss and recompute it: its slots hold a mix of
 * loaded layers and old contents. With a caller's header copy
 * (p->header), the device payload's header checksum must equal the copy's
 * (else nothing is loaded and the verdict is KVT_EFOREIGN: a stale copy;
 * or KVT_ECHECKSUM when a section of the device table fails too).
 * done is 1 once every check has run, which is before the gated load
 * kernels finish; a layer event (layer_events) says a layer's load ran,
 * not that it passed: read the verdict before the result of any loaded
 * layer is kept. A verdict is the load's until its stream has passed it:
 * do not pass it to another load before. Where the GPU does not verify - no
 * staging memory, a layer larger than a slot, a pinned payload with
 * KVT_GPU_LOAD_ZERO_COPY (sections checked before the launch as above), or
 * a TRUST flag (not checked) - the verdict is done on return.
 * Sections stored with the lossless zstd stage are refused (KVT_ENOTSUP):
 * undo it on the host first. The payload's dtype, heads and head_dim must be
 * the layout's and its layers within it (KVT_ESHAPE). Pageable host memory is
 * refused (KVT_ENOTSUP); the payload must be 16-byte aligned (KVT_ESHAPE).
 * Returns 0, -EINVAL, the parse and checksum errors of kvt_decode,
 * KVT_EFOREIGN, KVT_ESHAPE, KVT_ENOTSUP or KVT_ECUDA. */
KVT_API int kvt_gpu_load(kvt_gpu_layout *layout, const void *payload, size_t len,
                         const kvt_gpu_load_params *p, void *stream);

/* One payload of a batched load (kvt_gpu_load_batch). The items of an
 * array are items[0].struct_size bytes apart, so the struct can grow. */
typedef struct kvt_gpu_load_item {
  size_t struct_size;        /* sizeof(kvt_gpu_load_item), the same in every item */
  const void *payload;       /* pinned host memory mapped into the device */
  size_t len;
  const int64_t *slots;      /* device array [tokens], as kvt_gpu_load_params.slots */
  const kvt_key *expect_key; /* NULL, or the key the payload must carry */
  kvt_gpu_verdict *verdict;  /* NULL, or its verdict: as kvt_gpu_load_params.verdict */
} kvt_gpu_load_item;

#define KVT_GPU_LOAD_ITEM_INIT { sizeof(kvt_gpu_load_item), NULL, 0, NULL, NULL, NULL }

/* Added in 0.3.3. Loads the same layers of n payloads of one geometry -
 * the same spec, dtype, layers (layer_begin and count), tokens and format,
 * typically the chunks of a request or of several - into the layout's
 * slots, with kernels that each load a layer range of up to 64 payloads
 * (one launch where kvt_gpu_load makes n), so that layer-sized transfers
 * (a 256-token chunk's layer is 1 MiB of bf16) move at the copy engine's
 * speed. p gives what the payloads share: expect_fingerprint, layer_first,
 * layer_count, tokens, flags and layer_events; its expect_key, slots,
 * header and verdict must be NULL (they are per payload, in items).
 * layer_events[i] is recorded once layer layer_first + i of every payload
 * is loaded: an engine computing layer by layer waits for one event per
 * layer whatever n is. Staged copies move several layers of a payload at
 * once (at least 4 MiB where the slots allow: one copy per layer of a
 * 256-token chunk ran at 0.61-0.83x of cudaMemcpy on an H200, 4 MiB copies
 * at 0.93-0.94x), so after the first layer, which is loaded on its own
 * when there are events, events come in groups of layers.
 *
 * Payloads must be in pinned host memory (KVT_ENOTSUP for device memory:
 * load those with kvt_gpu_load). Each is checked before anything is
 * launched as kvt_gpu_load checks it (header, expectations, shape, and -
 * unless KVT_GPU_LOAD_TRUST_HOST, or the GPU verifies them - every loaded
 * section's checksum on the host); a payload that fails fails the call,
 * with nothing launched and the detail naming it ("item k: ..."): drop it
 * and call again. The batch is staged - layer ranges of several payloads
 * share a staging slot, one copy per payload and piece - when the handle
 * has staging memory, every loaded layer fits a slot, KVT_GPU_LOAD_ZERO_COPY
 * is not set, and the GPU verifies it, KVT_GPU_LOAD_STAGED is set or the
 * loaded sections of all payloads are 4 MiB or more; otherwise the kernels
 * read the payloads in place. Verdicts: every item has one or none does
 * (-EINVAL), and no two items share one (-EINVAL); with them, the section
 * checksums of format 2 payloads are verified on the GPU as for
 * kvt_gpu_load, each payload on its own - a payload that fails is not
 * loaded in the failing piece's layers and its verdict says so, while the
 * others load - and read with kvt_gpu_verdict_check. Where the GPU does
 * not verify - format 1 payloads, no staging memory, a layer larger than a
 * slot, KVT_GPU_LOAD_ZERO_COPY - the sections are checked on the host as
 * without verdicts (unless KVT_GPU_LOAD_TRUST_HOST) and the verdicts are
 * done on return. One thread at a time per handle, as every call on it.
 * Returns once launched: 0; -EINVAL (NULL items or params, old params,
 * an items[0].struct_size too small or not a multiple of the item's
 * alignment, per-payload fields in p, mixed or shared verdicts, a verdict
 * not in mapped pinned memory); -ENOMEM; kvt_gpu_load's errors for the
 * first payload that fails (nothing launched); KVT_ECUDA. */
KVT_API int kvt_gpu_load_batch(kvt_gpu_layout *layout, const kvt_gpu_load_item *items,
                               uint32_t n, const kvt_gpu_load_params *p, void *stream);

/* The verdict of a load verified on the GPU, once its stream has passed it
 * (cudaStreamSynchronize, or an event recorded after the load). Returns 0
 * (every checked section matched), KVT_ECHECKSUM (a section did not: the
 * chunk is a miss; the detail names the section, its layer and K or V),
 * KVT_EFOREIGN (the device payload's header is not the header copy passed
 * with it), -EAGAIN (not done yet: the stream has not reached the load's
 * checks) or -EINVAL (NULL). The detail goes to the layout's context. */
KVT_API int kvt_gpu_verdict_check(kvt_gpu_layout *layout, const kvt_gpu_verdict *verdict);

#ifdef __cplusplus
}
#endif
#endif
