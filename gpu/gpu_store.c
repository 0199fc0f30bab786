/* gpu/gpu_store.c - the GPU store path (kvtier/gpu.h): a chunk's KV from the
 * engine's paged cache into a payload, one chunk (kvt_gpu_store_async /
 * _finish) or a batch of one geometry (kvt_gpu_store_batch_async /
 * _finish). The host writes each header and section table, the store
 * kernels write the sections, the checksum kernels seal them (staged
 * through the handle's slots into pinned memory, or in place in device
 * memory) and finish checks the kernels' status and seals the headers.
 * Without CUDA every call returns KVT_ENOTSUP. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "gpu_api_internal.h"

#ifndef KVT_HAVE_CUDA

int kvt_gpu_store_bound(kvt_gpu_layout *layout, const kvt_gpu_store_params *p, uint64_t *out) {
  (void)layout, (void)p, (void)out;
  return KVT_ENOTSUP;
}
int kvt_gpu_store_async(kvt_gpu_layout *layout, const kvt_gpu_store_params *p, void *dst,
                        size_t cap, size_t *len, void *stream) {
  (void)layout, (void)p, (void)dst, (void)cap, (void)len, (void)stream;
  return KVT_ENOTSUP;
}
int kvt_gpu_store_finish(kvt_gpu_layout *layout, void *dst, size_t len, void *stream) {
  (void)layout, (void)dst, (void)len, (void)stream;
  return KVT_ENOTSUP;
}
int kvt_gpu_store(kvt_gpu_layout *layout, const kvt_gpu_store_params *p, void *dst, size_t cap,
                  size_t *len, void *stream) {
  (void)layout, (void)p, (void)dst, (void)cap, (void)len, (void)stream;
  return KVT_ENOTSUP;
}
int kvt_gpu_store_batch_async(kvt_gpu_layout *layout, kvt_gpu_store_item *items, uint32_t n,
                              void *stream) {
  (void)layout, (void)items, (void)n, (void)stream;
  return KVT_ENOTSUP;
}
int kvt_gpu_store_batch_finish(kvt_gpu_layout *layout, kvt_gpu_store_item *items, uint32_t n,
                               void *stream) {
  (void)layout, (void)items, (void)n, (void)stream;
  return KVT_ENOTSUP;
}

#else

static int store_check(kvt_gpu_layout *L, const kvt_gpu_store_params *p, kvt_codec_spec *spec,
                       uint32_t *model_layers, uint64_t *size) {
  kvt_ctx *ctx = L->ctx;
  if (!p || p->struct_size < sizeof(*p) || !p->encode ||
      p->encode->struct_size < sizeof(kvt_encode_params))
    return kvt_fail(ctx, -EINVAL, "kvt_gpu_store: missing or old params");
  if (!p->slots || !p->tokens || !p->layer_count)
    return kvt_fail(ctx, -EINVAL, "kvt_gpu_store: no slots, tokens or layers");
  if (p->encode->zstd_level)
    return kvt_fail(ctx, KVT_ENOTSUP, "the GPU store has no lossless stage (zstd level %d)",
                    p->encode->zstd_level);
  *spec = p->encode->spec;
  kvt_codec_normalise(spec);
  int rc = kvt_codec_validate(ctx, spec);
  if (rc)
    return rc;
  const uint32_t lb = p->encode->layer_begin;
  *model_layers = p->encode->model_layers ? p->encode->model_layers : p->layer_count;
  if (*model_layers > KVT_MAX_LAYERS || (uint64_t)lb + p->layer_count > *model_layers)
    return kvt_fail(ctx, KVT_ESHAPE, "layers %u..%u do not fit a model of %u layers (max %u)",
                    lb, lb + p->layer_count, *model_layers, KVT_MAX_LAYERS);
  return kvt_encode_bound(ctx, spec, lb, p->layer_count, p->tokens, L->d.heads, L->d.head_dim,
                          size);
}

int kvt_gpu_store_bound(kvt_gpu_layout *L, const kvt_gpu_store_params *p, uint64_t *out) {
  if (!L || !out)
    return -EINVAL;
  kvt_clear_error(L->ctx);
  kvt_codec_spec spec;
  uint32_t model_layers = 0;
  return store_check(L, p, &spec, &model_layers, out);
}

/* The header and section table with zero checksums (sealed by finish). */
static void put_header(const kvt_gpu_store_params *p, const kvt_codec_spec *spec, int dtype,
                       uint32_t heads, uint32_t head_dim, uint32_t model_layers,
                       const kvt_gpu_kparams *kp, uint64_t size, uint8_t *dst) {
  kvt_payload_info h;
  memset(&h, 0, sizeof(h));
  h.size = size;
  h.header_size = (uint32_t)kp->header_size;
  h.sections = 2 * p->layer_count;
  h.key = p->encode->key;
  h.fingerprint = p->encode->fingerprint;
  h.spec = *spec;
  h.dtype = dtype;
  h.model_layers = model_layers;
  h.layer_begin = p->encode->layer_begin;
  h.layers = p->layer_count;
  h.tokens = p->tokens;
  h.heads = heads;
  h.head_dim = head_dim;
  h.token_begin = p->encode->token_begin;
  kvt_header_put(dst, &h);
  for (uint32_t i = 0; i < h.sections; i++) {
    const uint32_t layer = p->encode->layer_begin + i / 2;
    const int kind = (int)(i % 2);
    const uint64_t raw = kvt_gpu_sec_size(kp, layer, kind);
    const kvt_section_info e = {layer, kind, kvt_gpu_sec_fmt(kp, layer, kind), KVT_COMP_NONE,
                                kvt_gpu_sec_offset(kp, i / 2, kind), raw, raw, 0, {0, 0}};
    kvt_section_entry_put(dst, i, &e);
  }
}

/* Bytes [*begin, *end) a store writes for payload-relative layer i: its K
 * and V sections and the padding after them (none after the last). */
static void store_span(const kvt_gpu_kparams *kp, uint32_t i, uint64_t size, uint64_t *begin,
                       uint64_t *end) {
  *begin = kvt_gpu_sec_offset(kp, i, 0);
  *end = i + 1 < kp->payload_layers ? kvt_gpu_sec_offset(kp, i + 1, 0) : size;
}

/* Whether every layer of a store fits one staging slot. */
static int store_stageable(const kvt_gpu_layout *L, const kvt_gpu_kparams *kp, uint64_t size) {
  if (!L->staging)
    return 0;
  for (uint32_t i = 0; i < kp->payload_layers; i++) {
    uint64_t b, e;
    store_span(kp, i, size, &b, &e);
    if (e - b > L->slot_bytes)
      return 0;
  }
  return 1;
}

/* Where a staged store writes one payload: its pinned memory (host and
 * device addresses) and the slots it stores. */
typedef struct store_target {
  uint8_t *dst, *dst_dev;
  const int64_t *slots;
} store_target;

/* A store of n payloads of kp's shape (size bytes each; headers written)
 * into pinned memory through the staging slots, in pieces of whole layers
 * of up to KVT_GPU_BATCH_MAX payloads (as load_staged): the store kernel
 * writes a piece into a slot, the checksum kernels seal its sections there
 * (checksums into each dst's table, through its device address), and the
 * copy stream moves each payload's part to its dst while the next piece is
 * stored. The caller's stream waits for the last copy. */
static int store_staged(kvt_gpu_layout *L, const kvt_gpu_kparams *kp, const store_target *t,
                        uint32_t n, uint64_t size, void *stream) {
  const uint32_t stop = kp->payload_layers;
  uint64_t left = (size - kvt_gpu_sec_offset(kp, 0, 0)) * n;
  int e = 0;
  for (uint32_t a = 0; e == 0 && a < stop;) {
    uint64_t begin, end, stride;
    uint32_t nl, per, ni;
    gpu_plan_piece(L, kp, store_span, size, a, stop, n, left, 0, &nl, &begin, &end, &stride,
                   &per);
    for (uint32_t i0 = 0; e == 0 && i0 < n; i0 += ni) {
      ni = n - i0 < per ? n - i0 : per;
      const uint32_t slot = take_slot(L);
      uint8_t *buf = L->staging + (uint64_t)slot * L->slot_bytes;
      kvt_gpu_kparams piece = *kp;
      piece.payload = (uint8_t *)((uintptr_t)buf - begin); /* section offsets stay the payload's */
      piece.slots = t[i0].slots;
      piece.first = a;
      piece.count = nl;
      if (a > 0 || i0 > 0)
        piece.flags |= KVT_GPU_KP_KEEP_STATUS; /* the first piece's launch reset it */
      uint64_t *dig = NULL; /* allocated before the slot is touched */
      if ((e = gpu_slot_digests(L, slot, &piece, ni, &dig)) != 0) {
        if (a > 0 || i0 > 0) /* earlier pieces' copies into dst are queued */
          gpu_staged_abandon(L, NSLOT, stream);
        return cuda_fail(L->ctx, e, "cudaMalloc of the checksum scratch");
      }
      /* One payload: kp's own fields (no item array to pass). A batch
       * passes its items whatever their number, so that a store's status
       * names the item (items.base). */
      const int batched = n > 1;
      kvt_gpu_items items;
      kvt_gpu_sec_items seals;
      items.n = seals.n = ni;
      items.base = i0;
      items.codes = batched ? L->item_codes : NULL;
      seals.reserved = 0;
      for (uint32_t k = 0; k < ni && batched; k++) {
        uint8_t *body = (uint8_t *)((uintptr_t)(buf + k * stride) - begin);
        const kvt_gpu_item one = {body, t[i0 + k].slots, NULL};
        const kvt_gpu_sec_item c = {t[i0 + k].dst_dev, body, NULL, NULL};
        items.it[k] = one;
        seals.it[k] = c;
      }
      const char *what = "staged store (copy stream, events)";
      if ((e = kvt_gpurt_stream_wait(stream, L->ev_free[slot])) != 0)
        break;
      const kvt_gpu_sections sec = {t[i0].dst_dev, piece.payload, begin, end, 2 * a, 2 * nl,
                                    KVT_FORMAT_VERSION, 1, max_section(&piece), dig,
                                    NULL, NULL, 0, slot_counter(L, slot), 0, 0};
      if ((e = kvt_gpurt_store_batch(&piece, batched ? &items : NULL, stream)) != 0)
        what = "store kernel launch";
      else if ((e = kvt_gpurt_sections_batch(&sec, batched ? &seals : NULL, stream)) != 0)
        what = "checksum kernel launch";
      else if ((e = kvt_gpurt_event_record(L->ev_copied[slot], stream)) == 0 &&
               (e = kvt_gpurt_stream_wait(L->copy_stream, L->ev_copied[slot])) == 0) {
        for (uint32_t k = 0; e == 0 && k < ni; k++)
          e = kvt_gpurt_copy_d2h_async(t[i0 + k].dst + begin, buf + k * stride, end - begin,
                                       L->copy_stream);
        if (e == 0)
          e = kvt_gpurt_event_record(L->ev_free[slot], L->copy_stream);
      }
      if (e) {
        gpu_staged_abandon(L, slot, stream);
        return cuda_fail(L->ctx, e, what);
      }
      const uint64_t moved = (uint64_t)ni * (end - begin);
      left -= left < moved ? left : moved;
    }
    a += nl;
  }
  if (e == 0 && (e = kvt_gpurt_event_record(L->ev_start, L->copy_stream)) == 0)
    e = kvt_gpurt_stream_wait(stream, L->ev_start);
  if (e) {
    gpu_staged_abandon(L, NSLOT, stream);
    return cuda_fail(L->ctx, e, "staged store (copy stream, events)");
  }
  return 0;
}

int kvt_gpu_store_async(kvt_gpu_layout *L, const kvt_gpu_store_params *p, void *dst, size_t cap,
                        size_t *len, void *stream) {
  if (!L)
    return -EINVAL;
  kvt_ctx *ctx = L->ctx;
  kvt_clear_error(ctx);
  if (!dst || !len)
    return kvt_fail(ctx, -EINVAL, "kvt_gpu_store: NULL destination or length");
  kvt_codec_spec spec;
  uint32_t model_layers = 0;
  uint64_t size;
  int rc = store_check(L, p, &spec, &model_layers, &size);
  if (rc)
    return rc;
  if (size > cap)
    return kvt_fail(ctx, KVT_ENOBUFS, "payload needs %" PRIu64 " bytes, %zu given", size, cap);
  int kind = 0;
  uint8_t *dev = NULL;
  if ((rc = gpu_payload_addr(ctx, dst, &kind, &dev)) != 0)
    return rc;
  kvt_gpu_kparams kp;
  if ((rc = gpu_fill_kparams(L, &spec, p->tokens, p->encode->layer_begin, p->layer_count, 0,
                             p->layer_count, p->slots, dev, 0, &kp)) != 0)
    return rc;
  int e;
  L->sealed_dst = NULL;
  L->batch_dst = NULL;
  if (kind == KVT_GPU_MEM_PINNED) {
    put_header(p, &spec, L->d.dtype, L->d.heads, L->d.head_dim, model_layers, &kp, size, dst);
    if (store_stageable(L, &kp, size)) {
      const store_target one = {dst, dev, p->slots};
      if ((rc = store_staged(L, &kp, &one, 1, size, stream)) != 0)
        return rc;
      L->sealed_dst = dst;
      *len = (size_t)size;
      return 0;
    }
  } else { /* device memory: the header goes over in stream order */
    uint8_t *hdr = kvt_alloc(ctx, kp.header_size, 64);
    if (!hdr)
      return kvt_fail(ctx, -ENOMEM, "kvt_gpu_store: header staging");
    put_header(p, &spec, L->d.dtype, L->d.heads, L->d.head_dim, model_layers, &kp, size, hdr);
    /* From pageable memory the copy has taken the bytes when it returns. */
    e = kvt_gpurt_copy_h2d_async(dev, hdr, kp.header_size, stream);
    kvt_dealloc(ctx, hdr);
    if (e)
      return cuda_fail(ctx, e, "cudaMemcpyAsync of the payload header");
  }
  if ((e = kvt_gpurt_store(&kp, stream)) != 0)
    return cuda_fail(ctx, e, "store kernel launch");
  if (kind == KVT_GPU_MEM_DEVICE) {
    uint64_t *dig = NULL;
    if ((e = gpu_digests_for(L, 2 * p->layer_count, &kp, &dig)) != 0)
      return cuda_fail(ctx, e, "cudaMalloc of the checksum scratch");
    if ((e = kvt_gpurt_seal(dev, size, 2 * p->layer_count, kp.header_size, KVT_FORMAT_VERSION,
                            max_section(&kp), dig, stream)) != 0)
      return cuda_fail(ctx, e, "checksum kernel launch");
  }
  *len = (size_t)size;
  return 0;
}

/* The store kernels' verdict, after the stream: 0, or KVT_ENONFINITE /
 * KVT_ERANGE naming where (and, for a batch, which item). */
static int store_status(kvt_gpu_layout *L, int batch) {
  kvt_gpu_status st;
  int e = kvt_gpurt_status((const kvt_gpu_status *)L->dev_aux, &st);
  if (e)
    return cuda_fail(L->ctx, e, "reading the store status");
  char item[32] = "";
  if (batch)
    snprintf(item, sizeof(item), "item %u: ", st.item);
  if (st.code == KVT_ENONFINITE)
    return kvt_fail(L->ctx, KVT_ENONFINITE, "%s%s layer %u token %u head %u dim %u is NaN or "
                    "Inf", item, st.kind ? "V" : "K", st.layer, st.token, st.head, st.dim);
  if (st.code)
    return kvt_fail(L->ctx, KVT_ERANGE, "%s%s layer %u token %u head %u (dim %u): the i4 range "
                    "does not fit the fp16 scale and zero", item, st.kind ? "V" : "K", st.layer,
                    st.token, st.head, st.dim);
  return 0;
}

int kvt_gpu_store_finish(kvt_gpu_layout *L, void *dst_, size_t len, void *stream) {
  if (!L)
    return -EINVAL;
  kvt_ctx *ctx = L->ctx;
  kvt_clear_error(ctx);
  uint8_t *dst = dst_;
  /* Whether kvt_gpu_store_async sealed this payload on the GPU; forgotten on
   * every return, so a later store into the same memory is not mistaken. */
  const int gpu_sealed = dst && L->sealed_dst == dst;
  L->sealed_dst = NULL;
  int e = kvt_gpurt_sync(stream);
  if (e)
    return cuda_fail(ctx, e, "cudaStreamSynchronize after the store kernel");
  if ((e = store_status(L, 0)) != 0)
    return e;
  if (!dst || len < HDR_FIXED)
    return kvt_fail(ctx, -EINVAL, "kvt_gpu_store_finish: no payload");
  int kind = 0, rc;
  uint8_t *dev;
  if ((rc = gpu_payload_addr(ctx, dst, &kind, &dev)) != 0)
    return rc;
  if (kind == KVT_GPU_MEM_DEVICE)
    return 0; /* sealed on the GPU by the checksum kernels */
  kvt_payload_info h;
  kvt_header_get(dst, &h);
  if (h.header_size != kvt_header_size(h.sections) || h.header_size > len || h.size != len)
    return kvt_fail(ctx, -EINVAL, "kvt_gpu_store_finish: not the payload kvt_gpu_store_async "
                    "wrote (length %zu)", len);
  for (uint32_t i = 0; i < h.sections && !gpu_sealed; i++) {
    kvt_section_info s;
    kvt_section_entry_get(dst, i, &s);
    if (s.offset + s.stored_size > len)
      return kvt_fail(ctx, -EINVAL, "kvt_gpu_store_finish: section %u outside the payload", i);
    kvt_section_entry_set_checksum(
        dst, i, kvt_section_checksum(h.version_major, dst + s.offset, s.stored_size));
  }
  kvt_header_seal(dst);
  return 0;
}

int kvt_gpu_store(kvt_gpu_layout *L, const kvt_gpu_store_params *p, void *dst, size_t cap,
                  size_t *len, void *stream) {
  int rc = kvt_gpu_store_async(L, p, dst, cap, len, stream);
  return rc ? rc : kvt_gpu_store_finish(L, dst, *len, stream);
}

/* A batch's item k failed its checks: the detail prefixed with the item. */
static int store_item_fail(kvt_ctx *ctx, uint32_t k, int rc) {
  char why[256];
  snprintf(why, sizeof(why), "%s", kvt_ctx_last_error(ctx));
  return kvt_fail(ctx, rc, "kvt_gpu_store_batch_async: item %u: %s", k, why);
}

/* Item k of an array whose items are items[0].struct_size bytes apart. */
static kvt_gpu_store_item *store_item(kvt_gpu_store_item *items, uint32_t k) {
  return (kvt_gpu_store_item *)(void *)((char *)items + (size_t)k * items->struct_size);
}

/* A batch's destinations in one word (FNV-1a over their addresses), so that
 * finish knows the items it is given for those of the batch in flight. */
static uint64_t batch_tag(kvt_gpu_store_item *items, uint32_t n) {
  uint64_t h = 14695981039346656037ull;
  for (uint32_t k = 0; k < n; k++) {
    h ^= (uint64_t)(uintptr_t)store_item(items, k)->dst;
    h *= 1099511628211ull;
  }
  return h;
}

int kvt_gpu_store_batch_async(kvt_gpu_layout *L, kvt_gpu_store_item *items_, uint32_t n,
                              void *stream) {
  if (!L)
    return -EINVAL;
  kvt_ctx *ctx = L->ctx;
  kvt_clear_error(ctx);
  if (!items_ || !n)
    return kvt_fail(ctx, -EINVAL, "kvt_gpu_store_batch_async: no items");
  if (items_->struct_size < sizeof(*items_) ||
      items_->struct_size % _Alignof(kvt_gpu_store_item))
    return kvt_fail(ctx, -EINVAL, "kvt_gpu_store_batch_async: items[0].struct_size %zu, at "
                    "least %zu and a multiple of %zu (KVT_GPU_STORE_ITEM_INIT)",
                    items_->struct_size, sizeof(*items_), _Alignof(kvt_gpu_store_item));
  store_target *t = kvt_alloc(ctx, (size_t)n * sizeof(*t), 64);
  if (!t)
    return kvt_fail(ctx, -ENOMEM, "kvt_gpu_store_batch_async: %u items", n);
  const kvt_gpu_store_params *p0 = items_->params; /* item 0's: the batch's geometry */
  kvt_codec_spec spec0;
  uint32_t ml0 = 0;
  uint64_t size0 = 0;
  kvt_gpu_kparams kp;
  int rc = 0;
  uint32_t k = 0;
  for (; k < n && rc == 0; k++) {
    const kvt_gpu_store_item *it = store_item(items_, k);
    const kvt_gpu_store_params *p = it->params;
    kvt_codec_spec spec;
    uint32_t ml = 0;
    uint64_t size = 0;
    int kind = 0;
    uint8_t *dev = NULL;
    if (!p) {
      rc = kvt_fail(ctx, -EINVAL, "NULL params");
      break;
    }
    if ((rc = store_check(L, p, &spec, &ml, &size)) != 0)
      break;
    if (k == 0) {
      spec0 = spec;
      ml0 = ml;
      size0 = size;
    } else if (memcmp(&spec, &spec0, sizeof(spec)) != 0 || ml != ml0 ||
               p->encode->layer_begin != p0->encode->layer_begin ||
               p->layer_count != p0->layer_count || p->tokens != p0->tokens) {
      rc = kvt_fail(ctx, KVT_ESHAPE, "its spec, layers %u+%u of %u or %u tokens differ from "
                    "item 0's (%u+%u of %u, %u tokens): a batch's chunks share one geometry",
                    p->encode->layer_begin, p->layer_count, ml, p->tokens,
                    p0->encode->layer_begin, p0->layer_count, ml0, p0->tokens);
      break;
    }
    if (!it->dst) {
      rc = kvt_fail(ctx, -EINVAL, "NULL destination");
      break;
    }
    if (size > it->cap) {
      rc = kvt_fail(ctx, KVT_ENOBUFS, "payload needs %" PRIu64 " bytes, %zu given", size,
                    it->cap);
      break;
    }
    if ((rc = gpu_payload_addr(ctx, it->dst, &kind, &dev)) != 0)
      break;
    if (kind != KVT_GPU_MEM_PINNED) {
      rc = kvt_fail(ctx, KVT_ENOTSUP, "the destination at %p is device memory: a batch "
                    "stores into pinned host memory (use kvt_gpu_store_async)", it->dst);
      break;
    }
    if (k == 0 && (rc = gpu_fill_kparams(L, &spec, p->tokens, p->encode->layer_begin,
                                         p->layer_count, 0, p->layer_count, p->slots, dev, 0,
                                         &kp)) != 0)
      break;
    const store_target one = {it->dst, dev, p->slots};
    t[k] = one;
  }
  if (rc) /* k: the item that failed */
    rc = store_item_fail(ctx, k, rc);
  else if (!store_stageable(L, &kp, size0))
    rc = kvt_fail(ctx, KVT_ENOTSUP, "kvt_gpu_store_batch_async: the handle has no staging "
                  "memory, or a layer of the chunk is larger than a staging slot (%" PRIu64
                  " bytes): use kvt_gpu_store_async", L->slot_bytes);
  else
    rc = gpu_distinct_ranges(ctx, items_, items_->struct_size, offsetof(kvt_gpu_store_item, dst),
                             size0, n, "kvt_gpu_store_batch_async", "destination");
  if (rc) { /* nothing launched: a store or batch in flight keeps its finish */
    kvt_dealloc(ctx, t);
    return rc;
  }
  int e = 0;
  if (n > L->item_words) { /* grown once per new largest batch (cudaFree waits) */
    kvt_gpurt_free(L->item_codes);
    L->item_codes = NULL;
    L->item_words = 0;
    if ((e = kvt_gpurt_malloc((void **)&L->item_codes, (size_t)n * sizeof(uint32_t))) == 0)
      L->item_words = n;
  }
  if (e == 0)
    e = kvt_gpurt_zero_async(L->item_codes, (size_t)n * sizeof(uint32_t), stream);
  if (e) {
    kvt_dealloc(ctx, t);
    return cuda_fail(ctx, e, "the batch's error codes (cudaMalloc, cudaMemsetAsync)");
  }
  L->sealed_dst = NULL;
  L->batch_dst = NULL;
  for (k = 0; k < n; k++) {
    kvt_gpu_store_item *it = store_item(items_, k);
    put_header(it->params, &spec0, L->d.dtype, L->d.heads, L->d.head_dim, ml0, &kp, size0,
               it->dst);
  }
  if ((rc = store_staged(L, &kp, t, n, size0, stream)) == 0) {
    for (k = 0; k < n; k++)
      store_item(items_, k)->len = (size_t)size0;
    L->batch_dst = items_->dst;
    L->batch_n = n;
    L->batch_tag = batch_tag(items_, n);
  }
  kvt_dealloc(ctx, t);
  return rc;
}

int kvt_gpu_store_batch_finish(kvt_gpu_layout *L, kvt_gpu_store_item *items, uint32_t n,
                               void *stream) {
  if (!L)
    return -EINVAL;
  kvt_ctx *ctx = L->ctx;
  kvt_clear_error(ctx);
  const int ours = items && n && items->struct_size >= sizeof(*items) &&
                   items->struct_size % _Alignof(kvt_gpu_store_item) == 0 && L->batch_dst &&
                   L->batch_dst == items->dst && L->batch_n == n &&
                   L->batch_tag == batch_tag(items, n);
  if (!ours) /* the batch in flight, if any, keeps its finish */
    return kvt_fail(ctx, -EINVAL, "kvt_gpu_store_batch_finish: not the items the last "
                    "kvt_gpu_store_batch_async on this handle stored");
  L->batch_dst = NULL;
  int e = kvt_gpurt_sync(stream);
  if (e)
    return cuda_fail(ctx, e, "cudaStreamSynchronize after the batched store");
  const int rc = store_status(L, 1);
  if (rc == 0) {
    for (uint32_t k = 0; k < n; k++)
      kvt_header_seal(store_item(items, k)->dst);
    return 0;
  }
  /* Seal the payloads that stored cleanly; a failed one's len becomes 0. */
  uint32_t *codes = kvt_alloc(ctx, (size_t)n * sizeof(uint32_t), 64);
  e = codes ? kvt_gpurt_copy_d2h(codes, L->item_codes, (size_t)n * sizeof(uint32_t)) : -ENOMEM;
  if (e) { /* none sealed: every payload counts as failed */
    for (uint32_t k = 0; k < n; k++)
      store_item(items, k)->len = 0;
    kvt_dealloc(ctx, codes);
    return rc;
  }
  char why[256];
  snprintf(why, sizeof(why), "%s", kvt_ctx_last_error(ctx));
  uint32_t failed = 0;
  for (uint32_t k = 0; k < n; k++) {
    kvt_gpu_store_item *it = store_item(items, k);
    if (codes[k]) {
      it->len = 0;
      failed++;
    } else {
      kvt_header_seal(it->dst);
    }
  }
  kvt_dealloc(ctx, codes);
  return kvt_fail(ctx, rc, "%s (%u of %u chunks failed, their len set to 0; the others are "
                  "sealed and valid)", why, failed, n);
}

#endif
