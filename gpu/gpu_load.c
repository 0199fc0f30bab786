/* gpu/gpu_load.c - the GPU load path (kvtier/gpu.h): payloads back into the
 * engine's paged cache, one (kvt_gpu_load) or a batch of one geometry
 * (kvt_gpu_load_batch). The host parses and checks each header, table and
 * expectation (and, where the GPU does not, the section checksums); the
 * load kernels read the payload in place or from the handle's staging
 * slots, the checksum kernels verifying each staged piece first where a
 * verdict asks for it (kvt_gpu_verdict_check reads the outcome).
 * Without CUDA every call returns KVT_ENOTSUP. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "gpu_api_internal.h"

#ifndef KVT_HAVE_CUDA

int kvt_gpu_load(kvt_gpu_layout *layout, const void *payload, size_t len,
                 const kvt_gpu_load_params *p, void *stream) {
  (void)layout, (void)payload, (void)len, (void)p, (void)stream;
  return KVT_ENOTSUP;
}
int kvt_gpu_load_batch(kvt_gpu_layout *layout, const kvt_gpu_load_item *items, uint32_t n,
                       const kvt_gpu_load_params *p, void *stream) {
  (void)layout, (void)items, (void)n, (void)p, (void)stream;
  return KVT_ENOTSUP;
}
int kvt_gpu_verdict_check(kvt_gpu_layout *layout, const kvt_gpu_verdict *verdict) {
  (void)layout, (void)verdict;
  return KVT_ENOTSUP;
}

#else

/* Loads from pinned host memory smaller than this read it from the kernel
 * (zero copy). On an H200 (PCIe 5) staging reached 0.88-0.97x of cudaMemcpy
 * at 10-32 MiB and 0.96-0.99x beyond, zero copy 0.88-0.93x at every size;
 * at 1 MiB both are launch-bound and neither wins. */
#define STAGE_MIN_BYTES (4ull << 20)

/* The header and table of a payload as host bytes: the payload itself when
 * it is host memory, else a copy of its first header_size bytes. */
static int load_header(kvt_ctx *ctx, const uint8_t *payload, size_t len, int kind, uint8_t **copy,
                       const uint8_t **hdr) {
  *copy = NULL;
  if (kind == KVT_GPU_MEM_PINNED) {
    *hdr = payload;
    return 0;
  }
  uint8_t fixed[HDR_FIXED];
  if (len < HDR_FIXED)
    return kvt_fail(ctx, KVT_ETRUNC, "payload of %zu bytes is shorter than the %d-byte header",
                    len, HDR_FIXED);
  int e = kvt_gpurt_copy_d2h(fixed, payload, HDR_FIXED);
  if (e)
    return cuda_fail(ctx, e, "cudaMemcpy of the payload header");
  kvt_payload_info h;
  kvt_header_get(fixed, &h);
  const uint32_t nsec = h.sections;
  uint64_t hsize = h.header_size;
  if (nsec == 0 || nsec % 2 || nsec > 2 * KVT_MAX_LAYERS || hsize != kvt_header_size(nsec) ||
      hsize > len)
    hsize = HDR_FIXED; /* let the parser name what is wrong */
  if (!(*copy = kvt_alloc(ctx, hsize, 64)))
    return kvt_fail(ctx, -ENOMEM, "payload header copy");
  if ((e = kvt_gpurt_copy_d2h(*copy, payload, hsize)) != 0) {
    kvt_dealloc(ctx, *copy);
    *copy = NULL;
    return cuda_fail(ctx, e, "cudaMemcpy of the payload header");
  }
  *hdr = *copy;
  return 0;
}

static int load_expect(kvt_ctx *ctx, const kvt_payload_info *in, const kvt_gpu_load_params *p) {
  char a[33], b[33];
  if (p->expect_key && memcmp(p->expect_key, &in->key, 16) != 0)
    return kvt_fail(ctx, KVT_EFOREIGN, "payload key %s, expected %s", kvt_key_hex(&in->key, a),
                    kvt_key_hex(p->expect_key, b));
  if (p->expect_fingerprint && memcmp(p->expect_fingerprint, &in->fingerprint, 16) != 0)
    return kvt_fail(ctx, KVT_EFOREIGN, "payload model fingerprint %s, expected %s",
                    kvt_key_hex(&in->fingerprint, a), kvt_key_hex(p->expect_fingerprint, b));
  return 0;
}

/* Every loaded section: plain (no lossless stage), where the kernel expects
 * it, and - for host payloads - its checksum. */
static int load_sections(kvt_ctx *ctx, const uint8_t *hdr, const uint8_t *body, unsigned major,
                         const kvt_gpu_kparams *kp) {
  for (uint32_t l = kp->first; l < kp->first + kp->count; l++)
    for (int kind = 0; kind < 2; kind++) {
      const uint32_t i = 2 * l + (uint32_t)kind;
      kvt_section_info s;
      kvt_section_entry_get(hdr, i, &s);
      const uint64_t off = s.offset, n = s.stored_size;
      if (s.comp != KVT_COMP_NONE)
        return kvt_fail(ctx, KVT_ENOTSUP, "section %u (layer %u %s) uses the lossless stage: "
                        "the GPU load reads plain sections only", i, kp->layer_begin + l,
                        kind ? "V" : "K");
      if (off != kvt_gpu_sec_offset(kp, l, kind) ||
          n != kvt_gpu_sec_size(kp, kp->layer_begin + l, kind))
        return kvt_fail(ctx, KVT_ECORRUPT, "section %u at %" PRIu64 "+%" PRIu64 " is not where "
                        "its shape puts it", i, off, n);
      if (body) {
        const uint64_t want = s.checksum, got = kvt_section_checksum(major, body + off, n);
        if (want != got)
          return kvt_fail(ctx, KVT_ECHECKSUM, "section %u (layer %u %s) at offset %" PRIu64
                          ": stored checksum %016" PRIx64 ", computed %016" PRIx64, i,
                          kp->layer_begin + l, kind ? "V" : "K", off, want, got);
      }
    }
  return 0;
}

static int load_check(kvt_gpu_layout *L, const kvt_payload_info *in,
                      const kvt_gpu_load_params *p, uint32_t *count) {
  kvt_ctx *ctx = L->ctx;
  int rc = load_expect(ctx, in, p);
  if (rc)
    return rc;
  *count = p->layer_count ? p->layer_count
                          : (p->layer_first < in->layers ? in->layers - p->layer_first : 0);
  if (p->layer_first >= in->layers || *count > in->layers - p->layer_first)
    return kvt_fail(ctx, -EINVAL, "layers %u+%u requested from a payload of %u", p->layer_first,
                    *count, in->layers);
  if (in->dtype != L->d.dtype || in->heads != L->d.heads || in->head_dim != L->d.head_dim ||
      in->tokens != p->tokens)
    return kvt_fail(ctx, KVT_ESHAPE, "payload %s %u tokens x %u heads x %u dim; layout %s "
                    "%u slots x %u heads x %u dim", kvt_dtype_name(in->dtype), in->tokens,
                    in->heads, in->head_dim, kvt_dtype_name(L->d.dtype), p->tokens, L->d.heads,
                    L->d.head_dim);
  return 0;
}

/* The detail of a verify's mismatch `bad` on the GPU (a section, or
 * KVT_GPU_BAD_HEADER) in ctx: KVT_ECHECKSUM or KVT_EFOREIGN. */
static int gpu_mismatch(kvt_ctx *ctx, uint32_t bad, uint32_t layer_begin) {
  if (bad == KVT_GPU_BAD_HEADER)
    return kvt_fail(ctx, KVT_EFOREIGN, "the device payload's header checksum is not that of "
                    "the header copy passed with it (another payload, or a damaged header); "
                    "nothing was loaded");
  return kvt_fail(ctx, KVT_ECHECKSUM, "section %u (layer %u %s) of the payload: checksum "
                  "mismatch (computed on the GPU); its layers were not loaded, treat the chunk "
                  "as a miss", bad, layer_begin + bad / 2, bad % 2 ? "V" : "K");
}

/* The loaded sections' checksums of a device payload, on the GPU; waits. */
static int verify_on_gpu(kvt_gpu_layout *L, const uint8_t *dev, size_t len, unsigned major,
                         const kvt_gpu_kparams *kp, const uint64_t *expect_header,
                         void *stream) {
  kvt_gpu_status *st = (kvt_gpu_status *)L->dev_aux, host;
  uint64_t *dig = NULL;
  int e = major >= 2 ? gpu_digests_for(L, 2 * kp->count, kp, &dig) : 0;
  if (e == 0)
    e = kvt_gpurt_verify(dev, len, 2 * kp->first, 2 * kp->count, major, max_section(kp), dig,
                         st, expect_header, stream);
  if (e == 0)
    e = kvt_gpurt_sync(stream);
  if (e == 0)
    e = kvt_gpurt_status(st, &host);
  if (e)
    return cuda_fail(L->ctx, e, "checksum kernel");
  if (host.bad_section != UINT32_MAX)
    return gpu_mismatch(L->ctx, host.bad_section, kp->layer_begin);
  return 0;
}

/* Launches the load of kp's layers (of the payloads of items, or NULL: of
 * kp's one): one kernel, or with events one per layer, recording
 * events[ev0 + i] after layer kp->first + i. */
static int launch_layers(kvt_gpu_layout *L, const kvt_gpu_kparams *kp, const kvt_gpu_items *items,
                         void *const *events, uint32_t ev0, void *stream) {
  if (!events) {
    const int e = kvt_gpurt_load_batch(kp, items, stream);
    return e ? cuda_fail(L->ctx, e, "load kernel launch") : 0;
  }
  kvt_gpu_kparams one = *kp;
  for (uint32_t i = 0; i < kp->count; i++) {
    one.first = kp->first + i;
    one.count = 1;
    int e = kvt_gpurt_load_batch(&one, items, stream);
    if (e)
      return cuda_fail(L->ctx, e, "load kernel launch");
    if ((e = kvt_gpurt_event_record(events[ev0 + i], stream)) != 0)
      return cuda_fail(L->ctx, e, "cudaEventRecord after a layer");
  }
  return 0;
}

/* Bytes [*begin, *end) of payload-relative layer i: its K and V sections. */
static void layer_span(const kvt_gpu_kparams *kp, uint32_t i, uint64_t *begin, uint64_t *end) {
  *begin = kvt_gpu_sec_offset(kp, i, 0);
  *end = kvt_gpu_sec_offset(kp, i, 1) + kvt_gpu_sec_size(kp, kp->layer_begin + i, 1);
}

/* layer_span as a span_fn (a load moves the sections only). */
static void load_span(const kvt_gpu_kparams *kp, uint32_t i, uint64_t size, uint64_t *begin,
                      uint64_t *end) {
  (void)size;
  layer_span(kp, i, begin, end);
}

/* Bytes of the loaded layers' sections. */
static uint64_t loaded_bytes(const kvt_gpu_kparams *kp) {
  uint64_t b0, e0, b1, e1;
  layer_span(kp, kp->first, &b0, &e0);
  layer_span(kp, kp->first + kp->count - 1, &b1, &e1);
  return e1 - b0;
}

/* Whether every loaded layer fits one staging slot. */
static int stageable(const kvt_gpu_layout *L, const kvt_gpu_kparams *kp) {
  for (uint32_t i = kp->first; i < kp->first + kp->count; i++) {
    uint64_t b, e;
    layer_span(kp, i, &b, &e);
    if (e - b > L->slot_bytes)
      return 0;
  }
  return 1;
}

/* What the checksum kernels of a load verified on the GPU need: the
 * payload's table (device-accessible), its format and the verdict's device
 * address. */
typedef struct gpu_check {
  uint8_t *table;
  unsigned major;
  uint32_t *verdict;
  int check_header;       /* a device payload loaded with a caller's header copy: */
  uint64_t expect_header; /* the copy's header checksum */
} gpu_check;

/* Queues the checks of piece's layers (payload bytes [lo, hi) at body + lo;
 * with items, of items->n payloads, each with its own table, body, gate
 * and verdict) on stream, gating piece's load kernels on slot's gates. */
static int check_piece(kvt_gpu_layout *L, const gpu_check *chk, uint32_t slot,
                       kvt_gpu_kparams *piece, const uint8_t *body, uint64_t lo, uint64_t hi,
                       int last, const kvt_gpu_sec_items *items, void *stream) {
  uint64_t *dig = NULL;
  int e = chk->major >= 2 ? gpu_slot_digests(L, slot, piece, items ? items->n : 1, &dig) : 0;
  if (e)
    return cuda_fail(L->ctx, e, "cudaMalloc of the checksum scratch");
  const kvt_gpu_sections sec = {chk->table,          body,
                                lo,                  hi,
                                2 * piece->first,    2 * piece->count,
                                chk->major,          0,
                                max_section(piece),  dig,
                                slot_gate(L, slot, 0), chk->verdict,
                                last,                slot_counter(L, slot),
                                chk->check_header,   chk->expect_header};
  if ((e = kvt_gpurt_sections_batch(&sec, items, stream)) != 0)
    return cuda_fail(L->ctx, e, "checksum kernel launch");
  piece->gate = slot_gate(L, slot, 0);
  return 0;
}

/* One payload of a staged load: where the copies read it, its slots, the
 * device address of its byte 0 (its table, for a load verified on the GPU)
 * and of its verdict. */
typedef struct staged_item {
  const uint8_t *host;
  const int64_t *slots;
  uint8_t *table;
  uint32_t *verdict;
} staged_item;

/* Pieces of whole layers, so the copy of one overlaps the kernel of the one
 * before and only the last piece's kernel is left after the copies end.
 * Each piece costs host calls and cross-stream waits, so there are few. A
 * piece holds a layer range of up to KVT_GPU_BATCH_MAX payloads (one copy
 * each), checked and loaded by one launch each. chk: NULL, or the check on
 * the GPU (its table and verdict are the items'). events: recorded after
 * each layer of every payload. */
static int load_staged(kvt_gpu_layout *L, const staged_item *it, uint32_t n,
                       const kvt_gpu_kparams *kp, const gpu_check *chk, void *const *events,
                       void *stream) {
  const uint32_t stop = kp->first + kp->count;
  uint64_t left = loaded_bytes(kp) * n;
  int e = kvt_gpurt_event_record(L->ev_start, stream);
  if (e == 0)
    e = kvt_gpurt_stream_wait(L->copy_stream, L->ev_start);
  for (uint32_t a = kp->first; e == 0 && a < stop;) {
    uint64_t begin, end, stride;
    uint32_t nl, per, ni;
    gpu_plan_piece(L, kp, load_span, 0, a, stop, n, left, events && n > 1 && a == kp->first, &nl,
                   &begin, &end, &stride, &per);
    for (uint32_t i0 = 0; e == 0 && i0 < n; i0 += ni) {
      ni = n - i0 < per ? n - i0 : per;
      const uint32_t slot = take_slot(L);
      uint8_t *buf = L->staging + (uint64_t)slot * L->slot_bytes;
      if ((e = kvt_gpurt_stream_wait(L->copy_stream, L->ev_free[slot])) != 0)
        break;
      for (uint32_t k = 0; e == 0 && k < ni; k++)
        e = kvt_gpurt_copy_h2d_async(buf + k * stride, it[i0 + k].host + begin, end - begin,
                                     L->copy_stream);
      if (e || (e = kvt_gpurt_event_record(L->ev_copied[slot], L->copy_stream)) != 0 ||
          (e = kvt_gpurt_stream_wait(stream, L->ev_copied[slot])) != 0)
        break;
      kvt_gpu_kparams piece = *kp;
      piece.payload = (uint8_t *)((uintptr_t)buf - begin); /* section offsets stay the payload's */
      piece.slots = it[i0].slots;
      piece.first = a;
      piece.count = nl;
      /* One payload: kp's own fields (no item array to pass). */
      kvt_gpu_items items;
      kvt_gpu_sec_items checks;
      items.n = checks.n = ni;
      items.base = i0;
      items.codes = NULL;
      checks.reserved = 0;
      for (uint32_t k = 0; k < ni && ni > 1; k++) {
        uint8_t *body = (uint8_t *)((uintptr_t)(buf + k * stride) - begin);
        const kvt_gpu_item one = {body, it[i0 + k].slots, chk ? slot_gate(L, slot, k) : NULL};
        const kvt_gpu_sec_item c = {it[i0 + k].table, body, slot_gate(L, slot, k),
                                    it[i0 + k].verdict};
        items.it[k] = one;
        checks.it[k] = c;
      }
      int rc = 0;
      if (chk) {
        const gpu_check c1 = {it[i0].table, chk->major, it[i0].verdict, 0, 0};
        rc = check_piece(L, &c1, slot, &piece, piece.payload, begin, end, a + nl == stop,
                         ni > 1 ? &checks : NULL, stream);
      }
      /* Layer events go after the last payloads' launches (stream order:
       * the earlier ones' layers are loaded by then). */
      if (rc == 0)
        rc = launch_layers(L, &piece, ni > 1 ? &items : NULL, i0 + ni == n ? events : NULL,
                           a - kp->first, stream);
      if (rc) {
        gpu_staged_abandon(L, slot, stream);
        return rc;
      }
      if ((e = kvt_gpurt_event_record(L->ev_free[slot], stream)) != 0)
        break;
      const uint64_t moved = (uint64_t)ni * (end - begin);
      left -= left < moved ? left : moved;
    }
    a += nl;
  }
  if (e) {
    gpu_staged_abandon(L, NSLOT, stream);
    return cuda_fail(L->ctx, e, "staged load (copy stream, events)");
  }
  return 0;
}

/* A device payload verified on the GPU: the checksum kernels of every
 * loaded section, then the load gated on their verdict, all in stream
 * order; a slot's gate and digest scratch, ordered by its events as a
 * staged load's. (Hashing 8 MiB of layers before each one's load, for L2
 * hits, measured 4x slower on an H200: the small launches do not fill the
 * GPU.) */
static int load_device_checked(kvt_gpu_layout *L, const uint8_t *dev, size_t len,
                               kvt_gpu_kparams *kp, const gpu_check *chk, void *const *events,
                               void *stream) {
  const uint32_t slot = take_slot(L);
  int e = kvt_gpurt_stream_wait(stream, L->ev_free[slot]);
  if (e)
    return cuda_fail(L->ctx, e, "cudaStreamWaitEvent");
  int rc = check_piece(L, chk, slot, kp, dev, 0, len, 1, NULL, stream);
  if (rc == 0)
    rc = launch_layers(L, kp, NULL, events, 0, stream);
  if (rc) {
    gpu_staged_abandon(L, slot, stream);
    return rc;
  }
  if ((e = kvt_gpurt_event_record(L->ev_free[slot], stream)) != 0) {
    gpu_staged_abandon(L, NSLOT, stream);
    return cuda_fail(L->ctx, e, "cudaEventRecord");
  }
  return 0;
}

int kvt_gpu_verdict_check(kvt_gpu_layout *L, const kvt_gpu_verdict *v) {
  if (!L)
    return -EINVAL;
  kvt_clear_error(L->ctx);
  if (!v)
    return kvt_fail(L->ctx, -EINVAL, "kvt_gpu_verdict_check: NULL verdict");
  /* Acquire: bad_section is written before done (a system fence between). */
  if (!__atomic_load_n(&v->done, __ATOMIC_ACQUIRE))
    return kvt_fail(L->ctx, -EAGAIN, "the load's checks have not run yet: wait for its stream "
                    "before reading the verdict");
  const uint32_t bad = __atomic_load_n(&v->bad_section, __ATOMIC_RELAXED);
  return bad == UINT32_MAX ? 0 : gpu_mismatch(L->ctx, bad, v->layer_begin);
}

KVT_GPU_STATIC_ASSERT(offsetof(kvt_gpu_verdict, done) == 4 * KVT_GPU_VERDICT_DONE,
                      "verdict words");
KVT_GPU_STATIC_ASSERT(offsetof(kvt_gpu_verdict, bad_section) == 4 * KVT_GPU_VERDICT_BAD,
                      "verdict words");

/* A load's verdict before the launch: no mismatch, and done unless the GPU
 * checks the load (else every check has run). */
static void verdict_reset(kvt_gpu_verdict *v, uint32_t layer_begin, uint32_t count,
                          int gpu_checked) {
  memset(v, 0, sizeof(*v));
  v->bad_section = UINT32_MAX;
  v->layer_begin = layer_begin;
  v->sections = 2 * count;
  v->done = gpu_checked ? 0 : 1;
}

int kvt_gpu_load(kvt_gpu_layout *L, const void *payload, size_t len,
                 const kvt_gpu_load_params *p, void *stream) {
  if (!L)
    return -EINVAL;
  kvt_ctx *ctx = L->ctx;
  kvt_clear_error(ctx);
  if (!payload || !p || p->struct_size < offsetof(kvt_gpu_load_params, header) || !p->slots)
    return kvt_fail(ctx, -EINVAL, "kvt_gpu_load: NULL payload, params or slots");
  const int has_header =
      p->struct_size >= offsetof(kvt_gpu_load_params, verdict) && p->header;
  kvt_gpu_verdict *verdict =
      p->struct_size >= sizeof(*p) ? p->verdict : NULL;
  int kind, rc;
  uint8_t *dev = NULL, *copy = NULL;
  const uint8_t *hdr = NULL;
  if ((rc = gpu_payload_addr(ctx, payload, &kind, &dev)) != 0)
    return rc;
  if (kind == KVT_GPU_MEM_DEVICE && has_header) {
    kvt_payload_info h;
    memset(&h, 0, sizeof(h));
    if (p->header_len >= HDR_FIXED)
      kvt_header_get(p->header, &h);
    if (p->header_len < HDR_FIXED || p->header_len > len || h.header_size > p->header_len)
      return kvt_fail(ctx, -EINVAL, "kvt_gpu_load: a header copy of %zu bytes, for a payload "
                      "of %zu whose header says %u", p->header_len, len, h.header_size);
    hdr = p->header;
  } else if ((rc = load_header(ctx, payload, len, kind, &copy, &hdr)) != 0) {
    return rc;
  }
  /* For a device payload only the header bytes are host-side: the parser
   * reads nothing past header_size (it checks len against the header's
   * payload_size and the table's offsets, and reads no section body). */
  kvt_payload_info in;
  uint32_t count = 0;
  kvt_gpu_kparams kp;
  int gpu_checked = 0;
  uint32_t *vdev = NULL;
  if (verdict) {
    int vkind = 0;
    void *vd = NULL;
    int e = kvt_gpurt_pointer(verdict, &vkind, &vd);
    if (e) {
      kvt_dealloc(ctx, copy);
      return cuda_fail(ctx, e, "cudaPointerGetAttributes of the verdict");
    }
    if (vkind != KVT_GPU_MEM_PINNED || !vd || (uintptr_t)verdict % 4) {
      kvt_dealloc(ctx, copy);
      return kvt_fail(ctx, -EINVAL, "kvt_gpu_load: the verdict at %p must be pinned host "
                      "memory mapped into the device (cudaHostAlloc)", (void *)verdict);
    }
    vdev = vd;
  }
  if ((rc = kvt_payload_parse(ctx, hdr, len, &in)) == 0 &&
      (rc = load_check(L, &in, p, &count)) == 0 &&
      (rc = gpu_fill_kparams(L, &in.spec, in.tokens, in.layer_begin, in.layers, p->layer_first,
                             count, p->slots, dev,
                             kind == KVT_GPU_MEM_PINNED ? CHUNK_LOAD_HOST : CHUNK_LOAD_DEVICE,
                             &kp)) == 0) {
    /* With a verdict the GPU verifies where it can: a device payload, or a
     * pinned one it stages (ZERO_COPY asks for neither). */
    const uint32_t trust = kind == KVT_GPU_MEM_PINNED ? KVT_GPU_LOAD_TRUST_HOST
                                                      : KVT_GPU_LOAD_TRUST_DEVICE;
    gpu_checked = verdict && L->staging && !(p->flags & trust) &&
                  (kind == KVT_GPU_MEM_DEVICE ||
                   (!(p->flags & KVT_GPU_LOAD_ZERO_COPY) && stageable(L, &kp)));
    const int host_check =
        kind == KVT_GPU_MEM_PINNED && !(p->flags & KVT_GPU_LOAD_TRUST_HOST) && !gpu_checked;
    rc = load_sections(ctx, hdr, host_check ? payload : NULL, in.version_major, &kp);
  }
  kvt_dealloc(ctx, copy);
  /* A caller's header copy: the device table the kernels read must be the
   * header checked here (its checksum field, which covers the table). */
  const int copy_used = kind == KVT_GPU_MEM_DEVICE && has_header;
  const uint64_t expect_header = copy_used ? kvt_ld64(hdr + KVT_PL_HEADER_CHECKSUM) : 0;
  if (rc == 0 && kind == KVT_GPU_MEM_DEVICE && !(p->flags & KVT_GPU_LOAD_TRUST_DEVICE) &&
      !gpu_checked)
    rc = verify_on_gpu(L, dev, len, in.version_major, &kp, copy_used ? &expect_header : NULL,
                       stream);
  if (rc)
    return rc;
  gpu_check chk = {dev, in.version_major, vdev, copy_used, expect_header};
  if (verdict)
    verdict_reset(verdict, in.layer_begin, count, gpu_checked);
  if (gpu_checked && kind == KVT_GPU_MEM_DEVICE)
    return load_device_checked(L, dev, len, &kp, &chk, p->layer_events, stream);
  if (kind == KVT_GPU_MEM_PINNED && L->staging && !(p->flags & KVT_GPU_LOAD_ZERO_COPY) &&
      stageable(L, &kp) &&
      (gpu_checked || (p->flags & KVT_GPU_LOAD_STAGED) ||
       loaded_bytes(&kp) >= STAGE_MIN_BYTES)) {
    gpu_set_chunk(L, &in.spec, CHUNK_LOAD_DEVICE, 1, &kp); /* the kernel reads the staging slots */
    const staged_item one = {(const uint8_t *)payload, p->slots, dev, vdev};
    return load_staged(L, &one, 1, &kp, gpu_checked ? &chk : NULL, p->layer_events, stream);
  }
  return launch_layers(L, &kp, NULL, p->layer_events, 0, stream);
}

/* ---- batched loads ---- */

/* A batch item's failure: the detail prefixed with the item, rc kept. */
static int item_fail(kvt_ctx *ctx, uint32_t k, int rc) {
  char why[256];
  snprintf(why, sizeof(why), "%s", kvt_ctx_last_error(ctx));
  return kvt_fail(ctx, rc, "kvt_gpu_load_batch: item %u: %s", k, why);
}

/* The device address of a verdict (pinned, mapped host memory). */
static int verdict_addr(kvt_ctx *ctx, kvt_gpu_verdict *v, uint32_t **dev) {
  int vkind = 0;
  void *vd = NULL;
  int e = kvt_gpurt_pointer(v, &vkind, &vd);
  if (e)
    return cuda_fail(ctx, e, "cudaPointerGetAttributes of the verdict");
  if (vkind != KVT_GPU_MEM_PINNED || !vd || (uintptr_t)v % 4)
    return kvt_fail(ctx, -EINVAL, "the verdict at %p must be pinned host memory mapped into "
                    "the device (cudaHostAlloc)", (void *)v);
  *dev = vd;
  return 0;
}

/* Checks item k of a batch on the host (kvt_gpu_load's checks) and that it
 * has item 0's geometry (*first, filled from item 0); the staged item's
 * addresses go to *out. host_check: verify the loaded sections' checksums
 * here (no GPU verify); kp: item 0's launch parameters (filled at k 0). */
static int batch_item(kvt_gpu_layout *L, const kvt_gpu_load_item *item, uint32_t k,
                      const kvt_gpu_load_params *p, kvt_payload_info *first,
                      kvt_gpu_kparams *kp, int host_check, staged_item *out) {
  kvt_ctx *ctx = L->ctx;
  int kind = 0, rc;
  uint8_t *dev = NULL;
  if (!item->payload || !item->slots)
    return kvt_fail(ctx, -EINVAL, "NULL payload or slots");
  if ((rc = gpu_payload_addr(ctx, item->payload, &kind, &dev)) != 0)
    return rc;
  if (kind != KVT_GPU_MEM_PINNED)
    return kvt_fail(ctx, KVT_ENOTSUP, "the payload at %p is in device memory: a batch loads "
                    "pinned host payloads (use kvt_gpu_load)", item->payload);
  kvt_gpu_load_params one = *p;
  one.expect_key = item->expect_key;
  kvt_payload_info in;
  memset(&in, 0, sizeof(in));
  uint32_t count = 0;
  if ((rc = kvt_payload_parse(ctx, item->payload, item->len, &in)) != 0 ||
      (rc = load_check(L, &in, &one, &count)) != 0)
    return rc;
  if (k == 0) {
    *first = in;
    if ((rc = gpu_fill_kparams(L, &in.spec, in.tokens, in.layer_begin, in.layers, p->layer_first,
                               count, item->slots, dev, CHUNK_LOAD_HOST, kp)) != 0)
      return rc;
  } else if (memcmp(&in.spec, &first->spec, sizeof(in.spec)) != 0 ||
             in.layer_begin != first->layer_begin || in.layers != first->layers ||
             in.version_major != first->version_major ||
             in.header_size != first->header_size) {
    return kvt_fail(ctx, KVT_ESHAPE, "its spec, layers %u+%u or format %u differ from item "
                    "0's (%u+%u, format %u): a batch's payloads share one geometry",
                    in.layer_begin, in.layers, in.version_major, first->layer_begin,
                    first->layers, first->version_major);
  }
  if ((rc = load_sections(ctx, item->payload, host_check ? item->payload : NULL,
                          in.version_major, kp)) != 0)
    return rc;
  out->host = item->payload;
  out->slots = item->slots;
  out->table = dev;
  out->verdict = NULL;
  if (item->verdict && (rc = verdict_addr(ctx, item->verdict, &out->verdict)) != 0)
    return rc;
  return 0;
}

/* Item k of an array whose items are items[0].struct_size bytes apart. */
static const kvt_gpu_load_item *load_item(const kvt_gpu_load_item *items, uint32_t k) {
  return (const kvt_gpu_load_item *)(const void *)((const char *)items +
                                                   (size_t)k * items->struct_size);
}

/* A batch the kernels read from host memory (zero copy), up to
 * KVT_GPU_BATCH_MAX payloads a launch; layer events after the last group's
 * layers. */
static int load_in_place(kvt_gpu_layout *L, const staged_item *st, uint32_t n,
                         const kvt_gpu_kparams *kp, void *const *events, void *stream) {
  kvt_gpu_items group;
  int rc = 0;
  for (uint32_t i0 = 0; rc == 0 && i0 < n; i0 += group.n) {
    group.n = n - i0 < KVT_GPU_BATCH_MAX ? n - i0 : KVT_GPU_BATCH_MAX;
    group.base = i0;
    group.codes = NULL;
    for (uint32_t k = 0; k < group.n; k++) {
      const kvt_gpu_item one = {st[i0 + k].table, st[i0 + k].slots, NULL};
      group.it[k] = one;
    }
    rc = launch_layers(L, kp, &group, i0 + group.n == n ? events : NULL, 0, stream);
  }
  if (rc) /* earlier groups' kernels may still read the payloads: let them end */
    (void)kvt_gpurt_sync(stream);
  return rc;
}

int kvt_gpu_load_batch(kvt_gpu_layout *L, const kvt_gpu_load_item *items_, uint32_t n,
                       const kvt_gpu_load_params *p, void *stream) {
  if (!L)
    return -EINVAL;
  kvt_ctx *ctx = L->ctx;
  kvt_clear_error(ctx);
  if (!items_ || !n || !p || p->struct_size < sizeof(*p))
    return kvt_fail(ctx, -EINVAL, "kvt_gpu_load_batch: NULL items or params, or old params");
  if (items_->struct_size < sizeof(*items_) ||
      items_->struct_size % _Alignof(kvt_gpu_load_item))
    return kvt_fail(ctx, -EINVAL, "kvt_gpu_load_batch: items[0].struct_size %zu, at least %zu "
                    "and a multiple of %zu (KVT_GPU_LOAD_ITEM_INIT)", items_->struct_size,
                    sizeof(*items_), _Alignof(kvt_gpu_load_item));
  if (p->expect_key || p->slots || p->header || p->verdict)
    return kvt_fail(ctx, -EINVAL, "kvt_gpu_load_batch: expect_key, slots, header and verdict "
                    "are per payload (kvt_gpu_load_item), not in the shared params");
  const int verdicts = load_item(items_, 0)->verdict != NULL;
  for (uint32_t k = 1; k < n; k++)
    if ((load_item(items_, k)->verdict != NULL) != verdicts)
      return kvt_fail(ctx, -EINVAL, "kvt_gpu_load_batch: item %u %s a verdict and item 0 "
                      "%s: all items have one or none does", k,
                      verdicts ? "lacks" : "has", verdicts ? "has" : "does not");
  int rc = verdicts ? gpu_distinct_ranges(ctx, items_, items_->struct_size,
                                          offsetof(kvt_gpu_load_item, verdict),
                                          sizeof(kvt_gpu_verdict), n, "kvt_gpu_load_batch",
                                          "verdict")
                    : 0;
  if (rc)
    return rc;
  staged_item *st = kvt_alloc(ctx, (size_t)n * sizeof(*st), 64);
  if (!st)
    return kvt_fail(ctx, -ENOMEM, "kvt_gpu_load_batch: %u items", n);
  /* Item 0 first, for the geometry; then whether the GPU verifies, which
   * decides whether the others' sections are hashed here. */
  kvt_payload_info first;
  kvt_gpu_kparams kp;
  rc = batch_item(L, load_item(items_, 0), 0, p, &first, &kp, 0, &st[0]);
  const int gpu_checked = rc == 0 && verdicts && L->staging && first.version_major >= 2 &&
                          !(p->flags & (KVT_GPU_LOAD_TRUST_HOST | KVT_GPU_LOAD_ZERO_COPY)) &&
                          stageable(L, &kp);
  const int host_check = !(p->flags & KVT_GPU_LOAD_TRUST_HOST) && !gpu_checked;
  if (rc == 0 && host_check)
    rc = load_sections(ctx, st[0].host, st[0].host, first.version_major, &kp);
  if (rc) {
    kvt_dealloc(ctx, st);
    return item_fail(ctx, 0, rc);
  }
  for (uint32_t k = 1; k < n; k++)
    if ((rc = batch_item(L, load_item(items_, k), k, p, &first, &kp, host_check, &st[k]))) {
      kvt_dealloc(ctx, st);
      return item_fail(ctx, k, rc);
    }
  for (uint32_t k = 0; k < n && verdicts; k++)
    verdict_reset(load_item(items_, k)->verdict, first.layer_begin, kp.count, gpu_checked);
  const int staged = L->staging && !(p->flags & KVT_GPU_LOAD_ZERO_COPY) && stageable(L, &kp) &&
                     (gpu_checked || (p->flags & KVT_GPU_LOAD_STAGED) ||
                      loaded_bytes(&kp) * n >= STAGE_MIN_BYTES);
  if (staged) {
    const gpu_check chk = {NULL, first.version_major, NULL, 0, 0};
    gpu_set_chunk(L, &first.spec, CHUNK_LOAD_DEVICE, n < KVT_GPU_BATCH_MAX ? n : KVT_GPU_BATCH_MAX,
                  &kp);
    rc = load_staged(L, st, n, &kp, gpu_checked ? &chk : NULL, p->layer_events, stream);
  } else {
    rc = load_in_place(L, st, n, &kp, p->layer_events, stream);
  }
  kvt_dealloc(ctx, st);
  return rc;
}

#endif
