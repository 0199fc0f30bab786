/* tiers/tier_dram.c - the "dram" tier (dram:SIZE): capacity-bounded host
 * memory, operations completed inline in submit.
 *
 * Payloads live in slabs of min(64 MiB, capacity), allocated lazily through
 * the context's allocator and all released on close, so the allocator sees a
 * handful of large requests instead of one per payload. Each slab is carved
 * first-fit from an address-ordered array of free extents that coalesce on
 * free, at 256-byte granularity. A hash index maps a key to its block.
 * There is no eviction: a PUT that does not fit fails with -ENOSPC and the
 * cache manager above decides what to drop.
 *
 * Payload bytes are copied outside the lock, so the lock is held for a hash
 * lookup and a few stores however large the payload: a PUT reserves a block
 * under the lock, fills it unlocked and then publishes it; a GET pins the
 * block, copies unlocked and unpins. A block deleted or replaced while pinned
 * is freed by its last reader.
 *
 * Pinning (pin=auto, the default): with CUDA built and a device present,
 * every slab is page-locked and mapped for the GPU (kvt_gpu_host_register)
 * when it is allocated and unregistered before it is freed, so DMA and the
 * load kernel read payloads at full speed; never per payload, and nothing is
 * pinned for a lookup. pin=on refuses to open without a device; pin=off
 * never calls CUDA (a process that forks after opening wants that). A slab
 * that fails to pin stays ordinary memory, with a warning.
 *
 * The hbm tier (tiers/tier_hbm.c) is this allocator over device memory: its
 * slabs and copies come from the kvt_dram_mem it hands over. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

#include "kvtier/gpu.h"
#include "key_index.h"
#include "tier_dram.h"
#include "tier_internal.h"

/* Builds with AddressSanitizer poison every free byte of a slab, so a copy
 * from a block that was freed under a reader's feet is reported, even though
 * the memory stays inside a live slab. */
#if defined(__SANITIZE_ADDRESS__)
#define DRAM_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DRAM_ASAN 1
#endif
#endif
#ifdef DRAM_ASAN
#include <sanitizer/asan_interface.h>
#define POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (size_t)(n))
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (size_t)(n))
#else
#define POISON(p, n) ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

#define GRANULE 256u          /* allocation unit: keeps blocks cache-line and DMA aligned */
#define SLAB_MAX (64ull << 20)
#define SLAB_ALIGN 4096u      /* page aligned, as cudaHostRegister will want */
#define NO_SLAB UINT32_MAX    /* a zero-length value: no storage */
#define NPINS 64              /* blocks pinned at once; beyond that GETs copy under the lock */
#define EXT_MIN 64u

typedef struct extent {
  uint64_t off, len;
} extent;

typedef struct slab {
  uint8_t *base;     /* NULL: a released slot, reusable */
  uint64_t size;     /* a multiple of GRANULE */
  uint64_t max_free; /* upper bound on the largest free extent: lets a PUT skip full slabs */
  uint64_t blocks;   /* allocated blocks, pending and pinned-dead ones included */
  uint64_t n_ext, cap_ext;
  extent *ext; /* free extents by address, never adjacent (coalesced) */
  int pinned;  /* registered with CUDA */
} slab;

/* Index entries (key_index.h) use off and slab for the block, and pin:
 * 1 + index of its pin record, 0 when no reader holds it. */
typedef kvt_index_entry entry;

typedef struct pin {
  kvt_key key;
  uint64_t off, size;
  uint32_t slab;
  uint32_t readers;
  int dead; /* deleted or replaced while read: the last reader frees it */
} pin;

typedef struct kvt_dram dram;

struct kvt_dram {
  kvt_ctx *ctx;
  kvt_tier *tier;
  /* Guards everything below; never held across a payload copy. Also
   * serialises this tier's calls to the context's allocator hooks, which
   * core.h promises are called from one thread at a time. */
  pthread_mutex_t mu;
  uint64_t capacity, slab_size;
  uint64_t slab_bytes; /* held in slabs, at most capacity */
  uint64_t used;       /* allocated block bytes, at most slab_bytes */
  slab *slabs;
  uint32_t n_slabs, cap_slabs;
  kvt_index ix;
  uint64_t pending; /* PUTs holding a reserved index slot, not yet published */
  pin pins[NPINS];
  uint8_t free_pins[NPINS];
  unsigned n_free_pins;
  int hbm;               /* the hbm tier: slabs are device memory on device `dev` */
  const kvt_dram_mem *mem; /* hbm: where device slabs come from */
  int dev;
  int pin_slabs;         /* register new slabs with CUDA */
  int pin_warned;        /* a registration failed once: said so */
  uint64_t pinned_bytes; /* slab bytes registered */
};

/* ---- memory: host, or device for the hbm tier (kvt_dram_mem) ---------------- */

/* Copies len bytes: memcpy for host slabs, the device memory's copy for device slabs.
 * Returns 0 or -EIO (a CUDA error). */
static int mem_copy(dram *d, void *dst, const void *src, uint64_t len) {
  if (!len)
    return 0;
  if (!d->hbm) {
    memcpy(dst, src, (size_t)len);
    return 0;
  }
  return d->mem->copy(d->dev, dst, src, len);
}

/* ---- slab allocator --------------------------------------------------------- */

/* Keeps room for one more extent than blocks + 1: a slab with B blocks has at
 * most B + 1 free extents, so freeing never needs memory and cannot fail. */
static int ext_reserve(dram *d, slab *s, uint64_t want) {
  if (s->cap_ext >= want)
    return 0;
  uint64_t cap = s->cap_ext ? s->cap_ext * 2 : EXT_MIN;
  while (cap < want)
    cap *= 2;
  extent *e = kvt_alloc(d->ctx, cap * sizeof(*e), 64);
  if (!e)
    return -ENOMEM;
  if (s->n_ext)
    memcpy(e, s->ext, s->n_ext * sizeof(*e));
  kvt_dealloc(d->ctx, s->ext);
  s->ext = e;
  s->cap_ext = cap;
  return 0;
}

static void slab_release(dram *d, slab *s) {
  if (s->pinned) {
    kvt_gpu_host_unregister(NULL, s->base);
    d->pinned_bytes -= s->size;
  }
  if (d->hbm) {
    d->mem->free(d->dev, s->base);
  } else {
    UNPOISON(s->base, s->size);
    kvt_dealloc(d->ctx, s->base);
  }
  kvt_dealloc(d->ctx, s->ext);
  d->slab_bytes -= s->size;
  memset(s, 0, sizeof(*s));
}

/* Empty slabs stay for reuse; they are given back only when a slab of
 * another size needs their share of the capacity (a payload larger than a
 * standard slab, or the capacity's odd remainder). */
static void release_empty_slabs(dram *d) {
  for (uint32_t i = 0; i < d->n_slabs; i++)
    if (d->slabs[i].base && d->slabs[i].blocks == 0)
      slab_release(d, &d->slabs[i]);
}

static int slab_slot(dram *d, uint32_t *out) {
  for (uint32_t i = 0; i < d->n_slabs; i++)
    if (!d->slabs[i].base) {
      *out = i;
      return 0;
    }
  if (d->n_slabs == d->cap_slabs) {
    const uint32_t cap = d->cap_slabs ? d->cap_slabs * 2 : 8;
    slab *n = kvt_alloc(d->ctx, (size_t)cap * sizeof(*n), 64);
    if (!n)
      return -ENOMEM;
    memset(n, 0, (size_t)cap * sizeof(*n));
    if (d->n_slabs)
      memcpy(n, d->slabs, d->n_slabs * sizeof(*n));
    kvt_dealloc(d->ctx, d->slabs);
    d->slabs = n;
    d->cap_slabs = cap;
  }
  *out = d->n_slabs++;
  return 0;
}

/* Adds a slab able to hold `need` bytes: a standard one, one sized to the
 * payload when it is larger, or the smaller remainder of the capacity. */
static int slab_add(dram *d, uint64_t need, uint32_t *out) {
  uint64_t size = need > d->slab_size ? need : d->slab_size;
  if (size > d->capacity - d->slab_bytes)
    release_empty_slabs(d);
  if (size > d->capacity - d->slab_bytes)
    size = (d->capacity - d->slab_bytes) & ~(uint64_t)(GRANULE - 1);
  if (size < need || (uint64_t)(size_t)size != size)
    return -ENOSPC;
  uint32_t i;
  int rc = slab_slot(d, &i);
  if (rc)
    return rc;
  slab *s = &d->slabs[i];
  s->base = d->hbm ? d->mem->alloc(d->dev, size) : kvt_alloc(d->ctx, (size_t)size, SLAB_ALIGN);
  if (!s->base || ext_reserve(d, s, 2) != 0) {
    if (d->hbm)
      d->mem->free(d->dev, s->base);
    else
      kvt_dealloc(d->ctx, s->base);
    kvt_dealloc(d->ctx, s->ext);
    memset(s, 0, sizeof(*s));
    return -ENOMEM;
  }
  if (d->pin_slabs) {
    const int pr = kvt_gpu_host_register(NULL, s->base, (size_t)size);
    s->pinned = pr == 0;
    if (pr == 0)
      d->pinned_bytes += size;
    else if (!d->pin_warned) {
      d->pin_warned = 1;
      kvt_logf(d->ctx, KVT_LOG_WARN,
               "dram tier: a %llu-byte slab could not be pinned (%s); it stays ordinary memory",
               (unsigned long long)size, kvt_strerror(pr));
    }
  }
  if (!d->hbm)
    POISON(s->base, size);
  s->size = s->max_free = size;
  s->ext[0] = (extent){0, size};
  s->n_ext = 1;
  d->slab_bytes += size;
  *out = i;
  return 0;
}

/* First fit within one slab; a miss tightens the max_free bound. */
static int64_t slab_fit(slab *s, uint64_t need) {
  uint64_t best = 0;
  for (uint64_t i = 0; i < s->n_ext; i++) {
    if (s->ext[i].len >= need)
      return (int64_t)i;
    if (s->ext[i].len > best)
      best = s->ext[i].len;
  }
  s->max_free = best;
  return -1;
}

static int slab_take(dram *d, uint32_t si, uint64_t k, uint64_t need, uint64_t *off) {
  slab *s = &d->slabs[si];
  int rc = ext_reserve(d, s, s->blocks + 2);
  if (rc)
    return rc;
  extent *e = &s->ext[k];
  *off = e->off;
  e->off += need;
  e->len -= need;
  if (e->len == 0) {
    memmove(e, e + 1, (s->n_ext - k - 1) * sizeof(*e));
    s->n_ext--;
  }
  s->blocks++;
  d->used += need;
  return 0;
}

/* Reserves `need` bytes (a multiple of GRANULE). With free extents split
 * across slabs or between blocks, a PUT can get -ENOSPC while `used` is below
 * the capacity: there is no compaction, as blocks may be pinned by readers
 * (and later registered for DMA). Deleting neighbours coalesces the space. */
static int block_alloc(dram *d, uint64_t need, uint32_t *si, uint64_t *off) {
  if (need > d->capacity - d->used)
    return -ENOSPC;
  for (uint32_t i = 0; i < d->n_slabs; i++) {
    slab *s = &d->slabs[i];
    if (!s->base || s->max_free < need)
      continue;
    const int64_t k = slab_fit(s, need);
    if (k >= 0) {
      *si = i;
      return slab_take(d, i, (uint64_t)k, need, off);
    }
  }
  int rc = slab_add(d, need, si);
  return rc ? rc : slab_take(d, *si, 0, need, off);
}

static void block_free(dram *d, uint32_t si, uint64_t off, uint64_t size) {
  slab *s = &d->slabs[si];
  if (!d->hbm)
    POISON(s->base + off, size);
  uint64_t lo = 0, hi = s->n_ext; /* first extent above off */
  while (lo < hi) {
    const uint64_t mid = lo + (hi - lo) / 2;
    if (s->ext[mid].off < off)
      lo = mid + 1;
    else
      hi = mid;
  }
  extent *prev = lo > 0 ? &s->ext[lo - 1] : NULL;
  extent *next = lo < s->n_ext ? &s->ext[lo] : NULL;
  const int join_prev = prev && prev->off + prev->len == off;
  const int join_next = next && off + size == next->off;
  extent *grown;
  if (join_prev && join_next) {
    prev->len += size + next->len;
    memmove(next, next + 1, (s->n_ext - lo - 1) * sizeof(*next));
    s->n_ext--;
    grown = prev;
  } else if (join_prev) {
    prev->len += size;
    grown = prev;
  } else if (join_next) {
    next->off = off;
    next->len += size;
    grown = next;
  } else { /* room guaranteed by ext_reserve */
    memmove(&s->ext[lo + 1], &s->ext[lo], (s->n_ext - lo) * sizeof(extent));
    s->ext[lo] = (extent){off, size};
    s->n_ext++;
    grown = &s->ext[lo];
  }
  if (grown->len > s->max_free)
    s->max_free = grown->len;
  s->blocks--;
  d->used -= size;
}

/* ---- pins ------------------------------------------------------------------- */

/* Pins e's block for a reader. Returns the pin record, or -1 when all are
 * taken (the caller then copies under the lock). */
static int pin_take(dram *d, entry *e) {
  if (e->pin) {
    d->pins[e->pin - 1].readers++;
    return e->pin - 1;
  }
  if (!d->n_free_pins)
    return -1;
  const int p = d->free_pins[--d->n_free_pins];
  d->pins[p] = (pin){e->key, e->off, kvt_align_up(e->len, GRANULE), e->slab, 1, 0};
  e->pin = (uint16_t)(p + 1);
  return p;
}

static void pin_drop(dram *d, int p) {
  pin *r = &d->pins[p];
  if (--r->readers)
    return;
  if (r->dead) {
    block_free(d, r->slab, r->off, r->size);
  } else { /* not dead: still indexed, and by this very block */
    entry *e = kvt_index_find(&d->ix, &r->key);
    if (e)
      e->pin = 0;
  }
  d->free_pins[d->n_free_pins++] = (uint8_t)p;
}

/* Drops e's block from the index's view: freed now, or by its last reader. */
static void entry_release(dram *d, const entry *e) {
  if (e->slab == NO_SLAB)
    return;
  if (e->pin)
    d->pins[e->pin - 1].dead = 1;
  else
    block_free(d, e->slab, e->off, kvt_align_up(e->len, GRANULE));
}

/* ---- operations ---------------------------------------------------------------- */

/* A PUT in three steps, which kvt_tier_reserve/publish/abort expose: a
 * private block (and an index slot) reserved, filled outside the lock, then
 * published. The old value is released only once the new one is published,
 * so a PUT that fails leaves it in place; it also means replacing needs room
 * for both. */
static int put_reserve(dram *d, uint64_t len, uint32_t *si, uint64_t *off, uint8_t **dst) {
  if (len > d->capacity || len > SIZE_MAX - GRANULE)
    return -ENOSPC;
  const uint64_t size = kvt_align_up(len, GRANULE);
  *si = NO_SLAB;
  *off = 0;
  *dst = NULL;
  pthread_mutex_lock(&d->mu);
  int rc = kvt_index_reserve(&d->ix, d->ix.items + d->pending + 1);
  if (!rc && size)
    rc = block_alloc(d, size, si, off);
  if (rc) {
    pthread_mutex_unlock(&d->mu);
    return rc;
  }
  if (size) {
    *dst = d->slabs[*si].base + *off; /* read under the lock: the slab array may move */
    if (!d->hbm)
      UNPOISON(*dst, len);
  }
  d->pending++;
  pthread_mutex_unlock(&d->mu);
  return 0;
}

static void put_abort(dram *d, uint64_t len, uint32_t si, uint64_t off) {
  pthread_mutex_lock(&d->mu);
  d->pending--;
  if (si != NO_SLAB)
    block_free(d, si, off, kvt_align_up(len, GRANULE));
  pthread_mutex_unlock(&d->mu);
}

static void put_publish(dram *d, const kvt_key *key, uint64_t len, uint32_t si, uint64_t off) {
  pthread_mutex_lock(&d->mu);
  d->pending--;
  int fresh;
  entry *e = kvt_index_upsert(&d->ix, key, &fresh); /* the slot was reserved */
  if (!fresh)
    entry_release(d, e);
  e->off = off;
  e->len = len;
  e->slab = si;
  e->pin = 0;
  pthread_mutex_unlock(&d->mu);
}

static int op_put(dram *d, const kvt_tier_op *op) {
  uint32_t si;
  uint64_t off;
  uint8_t *dst;
  int rc = put_reserve(d, op->len, &si, &off, &dst);
  if (rc)
    return rc;
  if (op->len)
    rc = mem_copy(d, dst, op->buf, op->len); /* the block is private until published */
  if (rc) { /* the copy failed (hbm: a CUDA error): the block goes back */
    put_abort(d, op->len, si, off);
    return rc;
  }
  put_publish(d, &op->key, op->len, si, off);
  return 0;
}

static int op_get(dram *d, kvt_tier_op *op) {
  pthread_mutex_lock(&d->mu);
  entry *e = kvt_index_find(&d->ix, &op->key);
  if (!e) {
    pthread_mutex_unlock(&d->mu);
    return KVT_ENOTFOUND;
  }
  const uint64_t len = e->len;
  op->out_len = len;
  if (len > op->len || len == 0) {
    pthread_mutex_unlock(&d->mu);
    return len ? KVT_ENOBUFS : 0;
  }
  const uint8_t *src = d->slabs[e->slab].base + e->off;
  const int p = pin_take(d, e);
  if (p < 0) { /* more concurrent readers than pin records: rare, stay correct */
    const int rc = mem_copy(d, op->buf, src, len);
    pthread_mutex_unlock(&d->mu);
    return rc;
  }
  pthread_mutex_unlock(&d->mu);
  const int rc = mem_copy(d, op->buf, src, len);
  pthread_mutex_lock(&d->mu);
  pin_drop(d, p);
  pthread_mutex_unlock(&d->mu);
  return rc;
}

static int op_del(dram *d, const kvt_tier_op *op) {
  pthread_mutex_lock(&d->mu);
  entry *e = kvt_index_find(&d->ix, &op->key);
  if (e) {
    entry_release(d, e);
    kvt_index_remove(&d->ix, e);
  }
  pthread_mutex_unlock(&d->mu);
  return e ? 0 : KVT_ENOTFOUND;
}

static int op_query(dram *d, kvt_tier_op *op) {
  pthread_mutex_lock(&d->mu);
  const entry *e = kvt_index_find(&d->ix, &op->key);
  if (e)
    op->out_len = e->len;
  pthread_mutex_unlock(&d->mu);
  return e ? 0 : KVT_ENOTFOUND;
}

/* ---- backend table ------------------------------------------------------------ */

int kvt_dram_submit(void *state, kvt_tier_op *op) {
  dram *d = state;
  int rc;
  switch (op->opcode) {
  case KVT_TIER_PUT:
    rc = op_put(d, op);
    break;
  case KVT_TIER_GET:
    rc = op_get(d, op);
    break;
  case KVT_TIER_DEL:
    rc = op_del(d, op);
    break;
  case KVT_TIER_QUERY:
    rc = op_query(d, op);
    break;
  default:
    return -EINVAL;
  }
  op->result = rc;
  kvt_tier_complete(d->tier, op); /* last touch: a blocking caller may return at once */
  return 0;
}

/* pin=auto|on|off after the size. Returns 0, 1 (auto), 2 (on) via *mode. */
static int parse_dram_args(kvt_ctx *ctx, const char *args, uint64_t *cap, int *mode) {
  char size[64];
  const char *comma = args ? strchr(args, ',') : NULL;
  const size_t n = comma ? (size_t)(comma - args) : (args ? strlen(args) : 0);
  *mode = 1;
  if (n >= sizeof(size))
    return kvt_fail(ctx, -EINVAL, "dram tier: '%s': size too long", args);
  memcpy(size, args ? args : "", n);
  size[n] = 0;
  if (kvt_parse_size(size, cap) != 0 || *cap == 0)
    return kvt_fail(ctx, -EINVAL, "dram tier: capacity '%s' %s; e.g. dram:8GiB", size,
                    kvt_size_why(size));
  if (!comma)
    return 0;
  if (!strcmp(comma + 1, "pin=auto"))
    *mode = 1;
  else if (!strcmp(comma + 1, "pin=on"))
    *mode = 2;
  else if (!strcmp(comma + 1, "pin=off"))
    *mode = 0;
  else
    return kvt_fail(ctx, -EINVAL, "dram tier: option '%s': expected pin=auto, pin=on or pin=off",
                    comma + 1);
  return 0;
}

/* Whether slabs can be pinned here: a page registered and unregistered.
 * Returns 0 or why not (KVT_ENOTSUP: no CUDA or no device; KVT_ECUDA). */
static int pin_probe(kvt_ctx *ctx) {
  void *page = kvt_alloc(ctx, 4096, 4096);
  if (!page)
    return -ENOMEM;
  int r = kvt_gpu_host_register(ctx, page, 4096);
  if (r == 0)
    r = kvt_gpu_host_unregister(ctx, page);
  kvt_dealloc(ctx, page);
  return r;
}

dram *kvt_dram_new(kvt_ctx *ctx, kvt_tier *tier, uint64_t cap) {
  dram *d = kvt_alloc(ctx, sizeof(*d), 64);
  if (!d)
    return NULL;
  memset(d, 0, sizeof(*d));
  if (pthread_mutex_init(&d->mu, NULL) != 0) {
    kvt_dealloc(ctx, d);
    return NULL;
  }
  d->ctx = ctx;
  d->tier = tier;
  kvt_index_init(&d->ix, ctx);
  d->capacity = cap;
  d->slab_size = (cap < SLAB_MAX ? cap : SLAB_MAX) & ~(uint64_t)(GRANULE - 1);
  for (unsigned i = 0; i < NPINS; i++)
    d->free_pins[i] = (uint8_t)(NPINS - 1 - i);
  d->n_free_pins = NPINS;
  return d;
}

void kvt_dram_use_device(dram *d, const kvt_dram_mem *mem, int dev) {
  d->hbm = 1;
  d->mem = mem;
  d->dev = dev;
  /* Device slabs of up to 256 MiB: fewer cudaMalloc calls, all freed on close. */
  d->slab_size = (d->capacity < 4 * SLAB_MAX ? d->capacity : 4 * SLAB_MAX) & ~(uint64_t)(GRANULE - 1);
}

uint64_t kvt_dram_slab_size(const dram *d) {
  return d->slab_size;
}

static int dram_open(kvt_ctx *ctx, const char *args, kvt_tier *tier, void **state) {
  uint64_t cap = 0;
  int mode = 1;
  int rc = parse_dram_args(ctx, args, &cap, &mode);
  if (rc)
    return rc;
  const int pr = mode ? pin_probe(ctx) : KVT_ENOTSUP;
  if (mode == 2 && pr)
    return kvt_fail(ctx, pr, "dram tier: pin=on, but host memory cannot be pinned: %s",
                    kvt_ctx_last_error(ctx)[0] ? kvt_ctx_last_error(ctx) : kvt_strerror(pr));
  dram *d = kvt_dram_new(ctx, tier, cap);
  if (!d)
    return kvt_fail(ctx, -ENOMEM, "dram tier: allocating its state");
  d->pin_slabs = mode && pr == 0;
  kvt_logf(ctx, KVT_LOG_INFO,
           "dram tier: capacity %llu bytes in slabs of %llu allocated on demand; %s",
           (unsigned long long)cap, (unsigned long long)d->slab_size,
           d->pin_slabs ? "slabs are pinned for the GPU"
                        : mode ? "slabs are not pinned (no CUDA device)" : "pin=off");
  kvt_clear_error(ctx);
  *state = d;
  return 0;
}

void kvt_dram_close(void *state) {
  dram *d = state;
  kvt_ctx *ctx = d->ctx;
  if (d->n_free_pins != NPINS) /* tier.h: every loan is returned before close */
    kvt_logf(ctx, KVT_LOG_ERROR,
             "%s tier: closed with %u loans outstanding; their memory is freed now",
             d->hbm ? "hbm" : "dram", NPINS - d->n_free_pins);
  for (uint32_t i = 0; i < d->n_slabs; i++)
    if (d->slabs[i].base)
      slab_release(d, &d->slabs[i]);
  kvt_dealloc(ctx, d->slabs);
  kvt_index_free(&d->ix);
  pthread_mutex_destroy(&d->mu);
  kvt_dealloc(ctx, d);
}

int kvt_dram_stats(void *state, kvt_tier_stats *out) {
  dram *d = state;
  pthread_mutex_lock(&d->mu);
  out->capacity = d->capacity;
  out->used = d->used;
  out->items = d->ix.items;
  out->pinned_bytes = d->pinned_bytes;
  pthread_mutex_unlock(&d->mu);
  out->item_overhead = 0;
  out->granule = GRANULE;
  return 0;
}

/* fn runs on a copy taken under the lock, so it may call back into the tier
 * (GET what it is shown, DEL it) without deadlocking or invalidating the walk. */
int kvt_dram_list(void *state, kvt_tier_list_fn fn, void *opaque) {
  dram *d = state;
  pthread_mutex_lock(&d->mu);
  const uint64_t n = d->ix.items;
  kvt_index_item *all = n ? kvt_alloc(d->ctx, (size_t)n * sizeof(*all), 64) : NULL;
  if (n && !all) {
    pthread_mutex_unlock(&d->mu);
    return -ENOMEM;
  }
  const uint64_t k = kvt_index_snapshot(&d->ix, all, n);
  pthread_mutex_unlock(&d->mu);
  int rc = 0;
  for (uint64_t i = 0; i < k && rc == 0; i++)
    rc = fn(opaque, &all[i].key, all[i].len);
  pthread_mutex_lock(&d->mu); /* allocator hooks are only called under the lock */
  kvt_dealloc(d->ctx, all);
  pthread_mutex_unlock(&d->mu);
  return rc;
}

/* Lends e's bytes in place: the block is pinned (not freed, moved or
 * replaced) until returned, as for a GET's copy. */
int kvt_dram_borrow(void *state, const kvt_key *key, kvt_tier_loan *loan) {
  dram *d = state;
  pthread_mutex_lock(&d->mu);
  entry *e = kvt_index_find(&d->ix, key);
  if (!e) {
    pthread_mutex_unlock(&d->mu);
    return KVT_ENOTFOUND;
  }
  loan->len = e->len;
  loan->data = NULL;
  loan->internal = NULL;
  if (e->slab != NO_SLAB) {
    const int p = pin_take(d, e);
    if (p < 0) {
      pthread_mutex_unlock(&d->mu);
      return -EAGAIN;
    }
    loan->data = d->slabs[e->slab].base + e->off;
    loan->internal = (void *)(uintptr_t)(p + 1);
  }
  pthread_mutex_unlock(&d->mu);
  return 0;
}

void kvt_dram_unborrow(void *state, kvt_tier_loan *loan) {
  dram *d = state;
  if (!loan->internal)
    return;
  pthread_mutex_lock(&d->mu);
  pin_drop(d, (int)((uintptr_t)loan->internal - 1));
  pthread_mutex_unlock(&d->mu);
  loan->internal = NULL;
}

/* kvt_tier_reserve: the first step of op_put, its block lent to the caller;
 * internal[] holds the slab, the offset and a tag naming this tier. */
int kvt_dram_reserve(void *state, const kvt_key *key, uint64_t len,
                     kvt_tier_reservation *res) {
  dram *d = state;
  uint32_t si;
  uint64_t off;
  uint8_t *dst;
  const int rc = put_reserve(d, len, &si, &off, &dst);
  if (rc)
    return rc;
  res->key = *key;
  res->len = len;
  res->data = dst;
  res->internal[0] = ((uint64_t)si << 32) | 1u;
  res->internal[1] = off;
  return 0;
}

int kvt_dram_publish(void *state, kvt_tier_reservation *res) {
  dram *d = state;
  if (!(res->internal[0] & 1u))
    return -EINVAL;
  put_publish(d, &res->key, res->len, (uint32_t)(res->internal[0] >> 32), res->internal[1]);
  memset(res->internal, 0, sizeof(res->internal));
  return 0;
}

void kvt_dram_abort(void *state, kvt_tier_reservation *res) {
  dram *d = state;
  if (!(res->internal[0] & 1u))
    return;
  put_abort(d, res->len, (uint32_t)(res->internal[0] >> 32), res->internal[1]);
  memset(res->internal, 0, sizeof(res->internal));
}

const kvt_tier_backend kvt_tier_backend_dram = {
    .abi_version = KVT_TIER_ABI_VERSION,
    .struct_size = sizeof(kvt_tier_backend),
    .scheme = "dram",
    .open = dram_open,
    .close = kvt_dram_close,
    .submit = kvt_dram_submit,
    .stats = kvt_dram_stats,
    .list = kvt_dram_list,
    .borrow = kvt_dram_borrow,
    .unborrow = kvt_dram_unborrow,
    .reserve = kvt_dram_reserve,
    .publish = kvt_dram_publish,
    .abort = kvt_dram_abort,
    .traits = KVT_TIER_HOST_MEMORY,
};
