/* gpu/kvt_gpu_layout.h - what the host side (gpu_layout.c, gpu_store.c,
 * gpu_load.c: C) hands the store and load kernels (CUDA): the engine
 * layout, the payload geometry and the device status word, in plain
 * fixed-size structs shared by both compilers, with their sizes asserted so
 * the two never disagree. Also the payload section-offset arithmetic both
 * sides use. Internal: not installed. */
#ifndef KVT_GPU_LAYOUT_H
#define KVT_GPU_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
#define KVT_HD __host__ __device__ __forceinline__
#else
#define KVT_HD static inline
#endif

#ifdef __cplusplus
#define KVT_GPU_STATIC_ASSERT(c, m) static_assert(c, m)
#else
#define KVT_GPU_STATIC_ASSERT(c, m) _Static_assert(c, m)
#endif

/* Division of 32-bit numbers by a divisor fixed per launch, as a multiply
 * and a shift (Granlund and Montgomery, "Division by invariant integers
 * using multiplication", 1994, section 4): the kernels' index arithmetic
 * (row = i / chunks_per_row, slot / block_size, row / heads) would otherwise
 * be 64-bit divisions, which cost the load kernel a third of its speed.
 * Exact for every n < 2^32 and divisor 1 <= d <= 2^31 (tests/test_gpu_fdiv.c
 * checks it on the CPU). */
typedef struct kvt_gpu_fdiv {
  uint32_t div, mul, shift;
} kvt_gpu_fdiv;

/* Host side: the multiplier and shift of d (1 <= d <= 2^31). */
KVT_HD kvt_gpu_fdiv kvt_gpu_fdiv_make(uint32_t d) {
  kvt_gpu_fdiv f;
  uint32_t l = 0;
  while (l < 31 && (1ull << l) < d)
    l++;
  f.div = d;
  f.shift = l;
  f.mul = (uint32_t)(((1ull << 32) * ((1ull << l) - d)) / d + 1);
  return f;
}

KVT_HD uint32_t kvt_gpu_fdiv_q(kvt_gpu_fdiv f, uint32_t n) {
#ifdef __CUDA_ARCH__
  const uint32_t hi = __umulhi(n, f.mul);
#else
  const uint32_t hi = (uint32_t)(((uint64_t)n * f.mul) >> 32);
#endif
  return (uint32_t)(((uint64_t)hi + n) >> f.shift);
}

/* The store kernel's verdict, in device memory, reset before each store. */
typedef struct kvt_gpu_status {
  int32_t code; /* 0, KVT_ENONFINITE or KVT_ERANGE: the first to set it wins */
  uint32_t layer, kind, token, head, dim;
  uint32_t bad_section; /* verify: the lowest section whose checksum differs, or ~0 */
  uint32_t item;        /* a batched store: the payload (its index in the batch) */
} kvt_gpu_status;
KVT_GPU_STATIC_ASSERT(sizeof(kvt_gpu_status) == 32, "kvt_gpu_status is 32 bytes");

/* kvt_gpu_kparams.flags: a store launch that continues an earlier one of
 * the same payload (a staged store's later pieces) keeps its status word. */
#define KVT_GPU_KP_KEEP_STATUS 1u

/* One store or load launch. Element addresses: ptrs[l] (K, then V at
 * ptrs[layout_layers + l]) points at (block 0, offset 0, head 0, dim 0) of
 * layout layer l, offsets already applied; strides in elements. */
typedef struct kvt_gpu_kparams {
  const uint64_t *ptrs;    /* device [2 * layout_layers] */
  const int64_t *slots;    /* device [tokens] */
  uint8_t *payload;        /* device-accessible address of payload byte 0 */
  kvt_gpu_status *status;  /* device; store only */
  float *amax;             /* device [items][2 * count]: layer-scale maxima; store only */
  int64_t stride_block, stride_token, stride_head;
  uint64_t slot_limit;     /* num_blocks * block_size */
  uint64_t header_size;
  uint64_t sec_bytes[2];   /* K and V section bytes of a layer that is not raw */
  uint64_t raw_bytes;      /* bytes of an n16 section */
  uint64_t raw_layers[4];  /* bit l: absolute layer l is raw */
  uint32_t block_size, layout_layers, layout_begin;
  uint32_t tokens, heads, head_dim, dtype;
  uint32_t layer_begin;    /* the payload's first absolute layer */
  uint32_t payload_layers; /* layers in the payload */
  uint32_t first, count;   /* payload-relative layers of this launch */
  uint32_t group, block;   /* i4 group size; tokens per scale block */
  uint8_t fmt[2];          /* the spec's K and V formats (enum kvt_fmt) */
  uint8_t scale, k_axis;   /* enum kvt_scale, enum kvt_axis */
  uint32_t chunk;          /* elements per lane step: 1, 2, 8, 16 or 32 */
  uint32_t part;           /* i4 token-grouped loads: tokens per thread (0: the kernel's choice) */
  /* Divisors of the index arithmetic (kvt_gpu_fdiv); every numerator is
   * below 2^32 (gpu_layout.c refuses larger shapes). */
  kvt_gpu_fdiv fd_heads, fd_block_size, fd_block, fd_cpr, fd_cpr8, fd_cpr16, fd_groups;
  kvt_gpu_fdiv fd_group;
  uint32_t flags;          /* KVT_GPU_KP_*: */
  /* Loads: NULL, or a device word the checksum kernels before the load set
   * to the failed section: the load writes nothing unless it reads ~0. */
  const uint32_t *gate;
} kvt_gpu_kparams;
KVT_GPU_STATIC_ASSERT(sizeof(kvt_gpu_kparams) == 312, "kvt_gpu_kparams layout");
KVT_GPU_STATIC_ASSERT(offsetof(kvt_gpu_kparams, gate) == 304, "kvt_gpu_kparams layout");
KVT_GPU_STATIC_ASSERT(offsetof(kvt_gpu_kparams, stride_block) == 40, "kvt_gpu_kparams layout");
KVT_GPU_STATIC_ASSERT(offsetof(kvt_gpu_kparams, block_size) == 136, "kvt_gpu_kparams layout");
KVT_GPU_STATIC_ASSERT(offsetof(kvt_gpu_kparams, fmt) == 188, "kvt_gpu_kparams layout");

/* A batched launch (kvt_gpu_load_batch): the payloads of one geometry
 * (spec, layers, tokens) whose layers a launch loads, one per blockIdx.z,
 * passed by value in the kernel's parameters (no device array to upload
 * and guard). Per item: the device-accessible address of payload byte 0
 * (a staged copy: slot - begin, as kvt_gpu_kparams.payload), its slots and
 * its gate (NULL: ungated). kvt_gpu_kparams' payload, slots and gate are
 * then unused. */
#define KVT_GPU_BATCH_MAX 64
typedef struct kvt_gpu_item {
  uint8_t *payload;
  const int64_t *slots;
  const uint32_t *gate;
} kvt_gpu_item;
typedef struct kvt_gpu_items {
  uint32_t n;
  uint32_t base;   /* the batch's index of it[0] (a store's status names the item) */
  uint32_t *codes; /* a batched store: device [batch], each payload's first error, or NULL */
  kvt_gpu_item it[KVT_GPU_BATCH_MAX];
} kvt_gpu_items;
KVT_GPU_STATIC_ASSERT(sizeof(kvt_gpu_item) == 24, "kvt_gpu_item layout");

KVT_HD uint64_t kvt_gpu_align(uint64_t x, uint64_t a) { return (x + a - 1) & ~(a - 1); }

KVT_HD int kvt_gpu_layer_raw(const kvt_gpu_kparams *p, uint32_t layer) {
  return layer < 256 && ((p->raw_layers[layer / 64] >> (layer % 64)) & 1);
}

/* The format of section kind (0 K, 1 V) of an absolute layer. */
KVT_HD int kvt_gpu_sec_fmt(const kvt_gpu_kparams *p, uint32_t layer, int kind) {
  return kvt_gpu_layer_raw(p, layer) ? 0 : p->fmt[kind];
}

KVT_HD uint64_t kvt_gpu_sec_size(const kvt_gpu_kparams *p, uint32_t layer, int kind) {
  return kvt_gpu_layer_raw(p, layer) ? p->raw_bytes : p->sec_bytes[kind];
}

/* Raw layers among absolute layers [0, x). */
KVT_HD uint32_t kvt_gpu_raw_below(const kvt_gpu_kparams *p, uint32_t x) {
  uint32_t n = 0;
  x = x < 256 ? x : 256;
  for (uint32_t w = 0; w < 4; w++) {
    if (x <= 64 * w)
      break;
    uint64_t m = p->raw_layers[w];
    if (x < 64 * (w + 1))
      m &= (1ull << (x - 64 * w)) - 1;
    while (m) { /* popcount without intrinsics: few bits are ever set */
      m &= m - 1;
      n++;
    }
  }
  return n;
}

/* Byte offset of section kind of payload-relative layer i (FORMAT.md 1:
 * each section starts at align64 of the previous one's end). */
KVT_HD uint64_t kvt_gpu_sec_offset(const kvt_gpu_kparams *p, uint32_t i, int kind) {
  const uint32_t nraw =
      kvt_gpu_raw_below(p, p->layer_begin + i) - kvt_gpu_raw_below(p, p->layer_begin);
  const uint64_t plain = kvt_gpu_align(p->sec_bytes[0], 64) + kvt_gpu_align(p->sec_bytes[1], 64);
  const uint64_t raw = 2 * kvt_gpu_align(p->raw_bytes, 64);
  uint64_t off = p->header_size + (uint64_t)(i - nraw) * plain + (uint64_t)nraw * raw;
  if (kind)
    off += kvt_gpu_align(kvt_gpu_sec_size(p, p->layer_begin + i, 0), 64);
  return off;
}

#ifdef __cplusplus
extern "C" {
#endif

/* Launchers and runtime wrappers (gpu_kernels.cu). Each returns a
 * cudaError_t as int: 0 or the CUDA error; kvt_gpurt_error_string names it. */
const char *kvt_gpurt_error_string(int err);
int kvt_gpurt_device_count(int *n);
/* kind: enum kvt_gpu_mem; *dev: the device-side address of p (NULL for
 * pageable memory). */
int kvt_gpurt_pointer(const void *p, int *kind, void **dev);
int kvt_gpurt_host_register(void *p, size_t n);
int kvt_gpurt_set_device(int dev);
/* cudaMemcpy with cudaMemcpyDefault: the direction from the pointers. */
int kvt_gpurt_copy_default(void *dst, const void *src, size_t n);
int kvt_gpurt_host_unregister(void *p);
int kvt_gpurt_malloc(void **p, size_t n);
int kvt_gpurt_zero(void *p, size_t n);
int kvt_gpurt_zero_async(void *p, size_t n, void *stream);
void kvt_gpurt_free(void *p);
int kvt_gpurt_copy_h2d(void *dst, const void *src, size_t n);
int kvt_gpurt_copy_d2h(void *dst, const void *src, size_t n);
int kvt_gpurt_sync(void *stream);
int kvt_gpurt_event_record(void *event, void *stream);
int kvt_gpurt_copy_h2d_async(void *dst, const void *src, size_t n, void *stream);
int kvt_gpurt_copy_d2h_async(void *dst, const void *src, size_t n, void *stream);
/* A non-blocking stream, an event without timing, and a wait of stream on
 * event (the staged load's copy pipeline). */
int kvt_gpurt_stream_create(void **stream);
void kvt_gpurt_stream_destroy(void *stream);
int kvt_gpurt_event_create(void **event);
void kvt_gpurt_event_destroy(void *event);
int kvt_gpurt_stream_wait(void *stream, void *event);
/* The section checksums (format `major`, serde/FORMAT.md section 3) of every
 * section of a payload in device memory into its table's checksum fields,
 * then the header checksum (its field zero) into the header. Format 2 needs
 * `digests`: device scratch of kvt_gpurt_digest_words(sections, max_stored)
 * words, max_stored the largest section's stored bytes. */
int kvt_gpurt_seal(uint8_t *payload, uint64_t len, uint32_t sections, uint64_t header_size,
                   unsigned major, uint64_t max_stored, uint64_t *digests, void *stream);
/* Words of a kvt_gpu_verdict (kvtier/gpu.h), as the kernels write them. */
#define KVT_GPU_VERDICT_DONE 0
#define KVT_GPU_VERDICT_BAD 1

/* Section checksums of sections [first, first + count) of one payload: its
 * table is at `table` (device-accessible: the payload's own header in
 * device memory or mapped pinned memory), a section at offset off is read
 * at body + off and must lie in [lo, hi) (a staging slot holding part of
 * the payload: body = slot - lo). write: the checksums go into the table
 * (seal); else they are compared with it: the lowest mismatch goes to *gate
 * (reset to ~0 first; the load kernels after it read it) and one mismatch
 * to verdict's bad word, if any; done: this is the load's last check, so
 * the verdict is then marked done. Format 2 needs `digests`: device scratch
 * of kvt_gpurt_digest_words(count, max_stored) words, max_stored the
 * largest section's stored bytes (larger ones count as mismatches). */
typedef struct kvt_gpu_sections {
  uint8_t *table;
  const uint8_t *body;
  uint64_t lo, hi;
  uint32_t first, count;
  unsigned major;
  int write;
  uint64_t max_stored;
  uint64_t *digests;
  uint32_t *gate;
  uint32_t *verdict;
  int done;
  /* NULL, or a device word that is 0: the pieces kernel's last CTA then
   * combines (one launch) and zeroes it again, unless the launch is too
   * big for one CTA's combine (kvt_gpurt_sections then leaves the word
   * alone and launches a combine kernel). */
  unsigned *counter;
  /* Verify with a caller's header copy: the table's header checksum field
   * must equal expect_header, else KVT_GPU_BAD_HEADER is the mismatch. */
  int check_header;
  uint64_t expect_header;
} kvt_gpu_sections;
/* The per-payload part of a batched checksum launch (kvt_gpurt_sections
 * with items): payload k's table, body (its bytes at body + off), gate and
 * verdict replace a's; a.first, a.count, lo, hi, major and max_stored are
 * the same for every payload (one geometry), and a.digests holds n * count
 * sections' digests. */
typedef struct kvt_gpu_sec_item {
  uint8_t *table;
  const uint8_t *body;
  uint32_t *gate;
  uint32_t *verdict;
} kvt_gpu_sec_item;
typedef struct kvt_gpu_sec_items {
  uint32_t n, reserved;
  kvt_gpu_sec_item it[KVT_GPU_BATCH_MAX];
} kvt_gpu_sec_items;

/* The mismatch a verify reports when the table read on the device is not
 * the header the host checked (check_header). */
#define KVT_GPU_BAD_HEADER 0xFFFFFFFEu
int kvt_gpurt_sections(const kvt_gpu_sections *a, void *stream);
/* The same for items->n payloads of one geometry in one launch (items NULL:
 * kvt_gpurt_sections). */
int kvt_gpurt_sections_batch(const kvt_gpu_sections *a, const kvt_gpu_sec_items *items,
                             void *stream);
/* Compares the checksums of sections [first, first+count) with the table;
 * the lowest mismatching section goes to st->bad_section (~0 if none).
 * digests as for kvt_gpurt_seal, for count sections. A section of the device
 * table outside the payload's len bytes (or over max_stored) is not read and
 * counts as a mismatch. */
int kvt_gpurt_verify(const uint8_t *payload, uint64_t len, uint32_t first, uint32_t count,
                     unsigned major, uint64_t max_stored, uint64_t *digests, kvt_gpu_status *st,
                     const uint64_t *expect_header, void *stream);
/* Words of digest scratch for count sections of at most max_stored bytes. */
uint64_t kvt_gpurt_digest_words(uint32_t count, uint64_t max_stored);
/* Launches the store (with its layer-scale pre-pass when the spec needs one,
 * and the status reset) or the load of p->count layers on stream. p is
 * copied into the launch. */
int kvt_gpurt_store(const kvt_gpu_kparams *p, void *stream);
/* The store of p's layers for items->n payloads of p's geometry, one launch
 * (grid.z over the items); p->amax then holds 2 * p->count floats per item. */
int kvt_gpurt_store_batch(const kvt_gpu_kparams *p, const kvt_gpu_items *items, void *stream);
int kvt_gpurt_load(const kvt_gpu_kparams *p, void *stream);
/* The load of p's layers for items->n payloads of p's geometry, one launch
 * (grid.z over the items). */
int kvt_gpurt_load_batch(const kvt_gpu_kparams *p, const kvt_gpu_items *items, void *stream);
/* Reads the status word back (after the stream is synchronised). */
int kvt_gpurt_status(const kvt_gpu_status *dev, kvt_gpu_status *host);

#ifdef __cplusplus
}
#endif
#endif
