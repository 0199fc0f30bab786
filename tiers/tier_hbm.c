/* tiers/tier_hbm.c - the "hbm" tier (hbm:DEV:SIZE): payloads kept in device
 * memory of one CUDA device, by the dram tier's slab allocator (tier_dram.h)
 * over slabs from cudaMalloc. Without CUDA this file is empty and the
 * registry has no hbm. */
#include <errno.h>
#include <stdlib.h>

#include "tier_dram.h"
#include "tier_internal.h"

#ifdef KVT_HAVE_CUDA
#include "kvt_gpu_layout.h" /* kvt_gpurt_*: the CUDA runtime, behind C wrappers */

static void *hbm_alloc(int dev, uint64_t size) {
  void *p = NULL;
  if (kvt_gpurt_set_device(dev) || kvt_gpurt_malloc(&p, (size_t)size))
    return NULL;
  return p;
}

static void hbm_free(int dev, void *p) {
  if (p && !kvt_gpurt_set_device(dev))
    kvt_gpurt_free(p);
}

static int hbm_copy(int dev, void *dst, const void *src, uint64_t len) {
  return kvt_gpurt_set_device(dev) || kvt_gpurt_copy_default(dst, src, (size_t)len) ? -EIO : 0;
}

static const kvt_dram_mem hbm_mem = {hbm_alloc, hbm_free, hbm_copy};

/* hbm:DEV:SIZE - the dram allocator over device memory of CUDA device DEV. */
static int hbm_open(kvt_ctx *ctx, const char *args, kvt_tier *tier, void **state) {
  char *end = NULL;
  const char *colon = args ? strchr(args, ':') : NULL;
  const long dev = colon ? strtol(args, &end, 10) : -1;
  uint64_t cap = 0;
  if (!colon || end != colon || dev < 0 || dev > 1023 || kvt_parse_size(colon + 1, &cap) != 0 ||
      cap == 0)
    return kvt_fail(ctx, -EINVAL,
                    "hbm tier: '%s': expected DEV:SIZE, e.g. hbm:0:20GiB (CUDA device, capacity)",
                    args ? args : "");
  int n = 0;
  if (kvt_gpurt_device_count(&n) || dev >= n)
    return kvt_fail(ctx, KVT_ENOTSUP, "hbm tier: no CUDA device %ld (%d present)", dev, n);
  kvt_dram *d = kvt_dram_new(ctx, tier, cap);
  if (!d)
    return kvt_fail(ctx, -ENOMEM, "hbm tier: allocating its state");
  kvt_dram_use_device(d, &hbm_mem, (int)dev);
  kvt_logf(ctx, KVT_LOG_INFO, "hbm tier: %llu bytes of device %ld in slabs of %llu",
           (unsigned long long)cap, dev, (unsigned long long)kvt_dram_slab_size(d));
  *state = d;
  return 0;
}

const kvt_tier_backend kvt_tier_backend_hbm = {
    .abi_version = KVT_TIER_ABI_VERSION,
    .struct_size = sizeof(kvt_tier_backend),
    .scheme = "hbm",
    .open = hbm_open,
    .close = kvt_dram_close,
    .submit = kvt_dram_submit,
    .stats = kvt_dram_stats,
    .list = kvt_dram_list,
    .borrow = kvt_dram_borrow,
    .unborrow = kvt_dram_unborrow,
    .reserve = kvt_dram_reserve,
    .publish = kvt_dram_publish,
    .abort = kvt_dram_abort,
    .traits = KVT_TIER_DEVICE,
};

#endif
