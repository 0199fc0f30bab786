/* tiers/nvme/tier_nvme.c - the "nvme" tier
 * (nvme:DIR:SIZE[,qd=N][,engine=pread][,readonly=1]): one file per payload
 * under DIR, written and read with O_DIRECT through io_uring, surviving
 * restarts; one writer per DIR (a lock), and readers beside it that change
 * nothing. This file: the layout, the operations and their state machines;
 * tier_nvme_ring.c drives io_uring, tier_nvme_open.c opens (spec, lock,
 * directory scan, preallocated requests and buffers).
 *
 * Layout: DIR/<first key byte, 2 hex>/<key, 32 hex>. A file is a 4096-byte
 * header block (magic, version, key, payload length, XXH3-64 of the payload,
 * XXH3-64 of the header fields) followed by the payload padded to 4096, so
 * every transfer is O_DIRECT-aligned.
 *
 * Durability. A PUT writes a new temporary name in the key's subdirectory,
 * fdatasyncs it, closes it, renames it over the final name and fsyncs the
 * subdirectory; it is acknowledged only after that fsync, so an
 * acknowledged value has durable bytes and a durable name, and a power loss
 * cannot bring back the value it replaced. A crash before the rename leaves
 * the old value and a stray temporary (removed by the next writer's open);
 * the final name only ever points at a file whose bytes were synced, so a
 * torn file can only come from the disk itself, and a GET verifies every byte it
 * returns (header checksum, length, payload XXH3): a file that does not
 * verify is deleted and the GET is a miss. Renames and index updates happen
 * in one order under the index lock, so the index describes the file that
 * won. A DEL unlinks without a directory fsync: after a power loss a deleted
 * value may come back (whole and verified, never torn).
 *
 * Data path. Requests (qd of them) and their header blocks are preallocated
 * at open; operations beyond qd wait in a backlog. With io_uring, a PUT is
 * one hard-linked chain of SQEs - openat into the request's fixed-file slot,
 * fallocate, write, fdatasync, close - and a GET is openat, read, close, so
 * no metadata call runs on the submitting thread; the rename (a short,
 * in-memory journal update that must be ordered with the index) runs on the
 * thread that reaps the chain, and the directory fsyncs are batched: one in
 * flight per subdirectory, covering every rename before it. SQEs reach the
 * kernel in batches, from progress() (the generic layer's waiters) or when a
 * batch fills up. A 4096-aligned caller buffer is written and read in place
 * (writev/readv with the header block, no copy; a GET then also writes the
 * zero padding up to the next 4096 bytes, within the buffer's capacity);
 * others go through a pool of preallocated, registered buffers
 * (tier_nvme.h). Without io_uring (not built, refused by the kernel,
 * KVT_NVME_FORCE_PREAD=1, or engine=pread) the same steps run with
 * pread/pwrite inside submit.
 *
 * Spares. A DEL renames the file to .free-SEQ instead of unlinking it, and
 * a later PUT of the same on-disk size overwrites it (then renames it to its
 * final name, as above): an overwrite allocates nothing, so its fdatasync
 * has no metadata to commit and the write needs no io-wq worker. This is
 * what a full cache does all day (evict, then store). A spare is reused only
 * once no GET that could have it open is running; spares are unlinked when
 * a PUT needs their room, on close, and (as leftovers) on open. A file
 * system found full before the capacity (-ENOSPC from the file system, not
 * the accounting) unlinks them all and the PUT is tried once more: evicting
 * (deleting) values would otherwise never free a block. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "tier_nvme.h"

#define IO_MAX (1ull << 30) /* an io_uring chain moves at most this much per SQE */

enum { S_PUT = 1, S_GET };

/* ---- layout -------------------------------------------------------------- */

void nvme_key_hex(const kvt_key *k, char out[33]) {
  static const char digits[] = "0123456789abcdef";
  for (int i = 0; i < 16; i++) {
    out[2 * i] = digits[k->bytes[i] >> 4];
    out[2 * i + 1] = digits[k->bytes[i] & 15];
  }
  out[32] = '\0';
}

int nvme_hex_key(const char *s, kvt_key *k) {
  for (int i = 0; i < 32; i++) {
    const char c = s[i];
    const int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (v < 0)
      return -1;
    k->bytes[i / 2] = (uint8_t)(i % 2 ? (k->bytes[i / 2] | v) : (v << 4));
  }
  return s[32] == '\0' ? 0 : -1;
}

uint64_t nvme_disk_size(uint64_t len) { return NVME_BLK + kvt_align_up(len, NVME_BLK); }

void nvme_header_write(uint8_t *h, const kvt_key *k, uint64_t sum, uint64_t len) {
  memset(h, 0, NVME_BLK);
  kvt_st64(h, NVME_MAGIC);
  kvt_st32(h + 8, NVME_VERSION);
  memcpy(h + 16, k->bytes, 16);
  kvt_st64(h + 32, len);
  kvt_st64(h + 40, sum);
  kvt_st64(h + NVME_HDR_FIELDS, kvt_hash64(h, NVME_HDR_FIELDS));
}

/* Checks the header block alone; *len gets the payload length it claims. */
int nvme_header_ok(const uint8_t *h, const kvt_key *k, uint64_t *len) {
  if (kvt_ld64(h) != NVME_MAGIC || kvt_ld32(h + 8) != NVME_VERSION ||
      kvt_ld64(h + NVME_HDR_FIELDS) != kvt_hash64(h, NVME_HDR_FIELDS) ||
      memcmp(h + 16, k->bytes, 16) != 0)
    return 0;
  *len = kvt_ld64(h + 32);
  return *len <= UINT64_MAX - 2 * NVME_BLK;
}

static int aligned(const void *p) { return ((uintptr_t)p & (NVME_BLK - 1)) == 0; }

static int open_flags(const nvme *n) { return O_CLOEXEC | (n->direct ? O_DIRECT : 0); }

/* ---- spares (mu held) ------------------------------------------------------------ */

static void spare_name(char out[NVME_NAME], uint64_t seq) {
  snprintf(out, NVME_NAME, ".free-%llu", (unsigned long long)seq);
}

static void spare_unlink(nvme *n, unsigned i) {
  const nspare sp = n->spares[i];
  char name[NVME_NAME];
  spare_name(name, sp.seq);
  unlinkat(n->subs[sp.sub].fd, name, 0);
  n->spares[i] = n->spares[--n->n_spares];
  n->used -= sp.disk;
  n->spare_bytes -= sp.disk;
}

/* Keeps a deleted value's file (named hex in subdirectory sub) as a spare,
 * in place of the oldest when there are NVME_SPARES (recent sizes are the
 * likely next ones). 0, or -1 when it should be unlinked instead. */
static int spare_keep(nvme *n, unsigned sub, const char *hex, uint64_t disk) {
  if (n->n_spares == NVME_SPARES) {
    unsigned oldest = 0;
    for (unsigned i = 1; i < n->n_spares; i++)
      if (n->spares[i].seq < n->spares[oldest].seq)
        oldest = i;
    spare_unlink(n, oldest);
  }
  const uint64_t seq = ++n->counter;
  char name[NVME_NAME];
  spare_name(name, seq);
  if (renameat(n->subs[sub].fd, hex, n->subs[sub].fd, name) != 0)
    return -1;
  /* A GET running now may have the file open: it must not be overwritten
   * until every such GET is over (req_end marks it ready then). */
  n->spares[n->n_spares++] = (nspare){disk, seq, (uint16_t)sub, n->gets_running == 0};
  n->spare_bytes += disk;
  return 0;
}

/* Takes a ready spare of exactly disk bytes, so the overwrite changes
 * neither the file's size nor its blocks. */
static int spare_take(nvme *n, uint64_t disk, nspare *out) {
  for (unsigned i = n->n_spares; i-- > 0;)
    if (n->spares[i].disk == disk && n->spares[i].ready) {
      *out = n->spares[i];
      n->spares[i] = n->spares[--n->n_spares];
      n->spare_bytes -= disk;
      return 1;
    }
  return 0;
}

/* Unlinks spares until need more bytes fit in the capacity (or none is
 * left). Unlinking a file a GET has open is safe: it is not overwritten. */
static void spare_drop(nvme *n, uint64_t need) {
  while (n->n_spares && n->used + need > n->capacity)
    spare_unlink(n, n->n_spares - 1);
}

unsigned nvme_spares_free(nvme *n) {
  pthread_mutex_lock(&n->mu);
  const unsigned had = n->n_spares;
  spare_drop(n, UINT64_MAX - n->used);
  pthread_mutex_unlock(&n->mu);
  return had;
}

/* ---- requests and the backlog ------------------------------------------------ */

static void drain(nvme *n);

/* Gives back a failed PUT's reservation. */
static void put_unreserve(nvme *n, uint64_t disk) {
  pthread_mutex_lock(&n->mu);
  n->used -= disk;
  n->pending--;
  pthread_mutex_unlock(&n->mu);
}

static void req_end(nreq *r, int result) {
  nvme *n = r->n;
  kvt_tier_op *op = r->op;
  if (r->fd >= 0)
    close(r->fd);
  r->fd = -1;
  if (op->opcode == KVT_TIER_PUT && result != 0) {
    if (r->name[0]) /* the temporary, or a spare partly overwritten */
      unlinkat(n->subs[r->tsub].fd, r->name, 0);
    if (r->reserved)
      put_unreserve(n, r->reserved);
  } else if (op->opcode == KVT_TIER_GET) {
    pthread_mutex_lock(&n->mu);
    if (--n->gets_running == 0)
      for (unsigned i = 0; i < n->n_spares; i++)
        n->spares[i].ready = 1;
    pthread_mutex_unlock(&n->mu);
  }
  kvt_dealloc(n->ctx, r->bounce); /* the slow path only */
  r->bounce = NULL;
  op->result = result;
  pthread_mutex_lock(&n->qmu);
  if (r->pool >= 0)
    n->free_pool[n->n_free_pool++] = r->pool;
  r->pool = -1;
  r->op = NULL;
  r->next = n->free_reqs;
  n->free_reqs = r;
  if (!n->uring)
    pthread_cond_broadcast(&n->idle);
  pthread_mutex_unlock(&n->qmu);
  kvt_tier_complete(n->tier, op); /* last touch of op: a blocking caller may return */
  drain(n);
}

int nvme_idle_wait(nvme *n, int timeout_ms) {
  if (timeout_ms == 0)
    return 0;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  ts.tv_nsec += 1000000L;
  ts.tv_sec += ts.tv_nsec / 1000000000L;
  ts.tv_nsec %= 1000000000L;
  pthread_mutex_lock(&n->qmu);
  pthread_cond_timedwait(&n->idle, &n->qmu, &ts);
  pthread_mutex_unlock(&n->qmu);
  return 0;
}

/* Whether op cannot use its own buffer for O_DIRECT and fits a pool buffer.
 * A GET's length comes from the index and may change before it starts. */
static int wants_pool(nvme *n, const kvt_tier_op *op) {
  uint64_t len = op->len;
  if (op->opcode == KVT_TIER_GET) {
    pthread_mutex_lock(&n->mu);
    const kvt_index_entry *e = kvt_index_find(&n->ix, &op->key);
    len = e ? e->len : 0;
    pthread_mutex_unlock(&n->mu);
    if (aligned(op->buf) && op->len >= kvt_align_up(len, NVME_BLK))
      return 0;
  } else if (aligned(op->buf)) {
    return 0;
  }
  return nvme_disk_size(len) <= NVME_POOL_BYTES;
}

static void req_start(nreq *r);

/* Starts backlogged operations while requests (and pool buffers, for those
 * that want one) are free, in order. One thread drains at a time: with the
 * pread engine an operation completes inside req_start and its req_end
 * calls back in here, which must not recurse. */
static void drain(nvme *n) {
  pthread_mutex_lock(&n->qmu);
  if (n->admitting) {
    pthread_mutex_unlock(&n->qmu);
    return;
  }
  n->admitting = 1;
  for (;;) {
    kvt_tier_op *op = n->backlog_head;
    const int pool = op && op->internal[0] != NULL;
    if (!op || !n->free_reqs || (pool && !n->n_free_pool))
      break;
    n->backlog_head = op->internal[1];
    if (!n->backlog_head)
      n->backlog_tail = NULL;
    nreq *r = n->free_reqs;
    n->free_reqs = r->next;
    r->pool = pool ? n->free_pool[--n->n_free_pool] : -1;
    r->op = op;
    op->internal[0] = op->internal[1] = NULL;
    pthread_mutex_unlock(&n->qmu);
    req_start(r);
    pthread_mutex_lock(&n->qmu);
  }
  n->admitting = 0;
  pthread_mutex_unlock(&n->qmu);
}

/* Queues op behind the others; op->internal[] are the library's while the
 * operation is in flight (tier.c links completed operations through [0]). */
static void admit(nvme *n, kvt_tier_op *op) {
  op->internal[0] = wants_pool(n, op) ? (void *)op : NULL;
  op->internal[1] = NULL;
  pthread_mutex_lock(&n->qmu);
  if (n->backlog_tail)
    n->backlog_tail->internal[1] = op;
  else
    n->backlog_head = op;
  n->backlog_tail = op;
  pthread_mutex_unlock(&n->qmu);
  drain(n);
}

/* ---- synchronous I/O (the pread engine, and the slow paths) -------------------- */

/* Moves all of r's transfer (its buffer or its iovecs) at offset 0; returns
 * the bytes moved (short at end of file) or -errno. */
static int64_t xfer_sync(nreq *r, int write) {
  struct iovec iov[3];
  unsigned cnt = r->niov;
  if (r->data) {
    iov[0] = (struct iovec){r->data, (size_t)r->disk};
    cnt = 1;
  } else {
    memcpy(iov, r->iov, sizeof(iov));
  }
  struct iovec *v = iov;
  uint64_t done = 0;
  while (cnt) {
    const ssize_t got =
        write ? pwritev(r->fd, v, (int)cnt, (off_t)done) : preadv(r->fd, v, (int)cnt, (off_t)done);
    if (got < 0 && errno == EINTR)
      continue;
    if (got < 0)
      return -errno;
    if (got == 0)
      break;
    done += (uint64_t)got;
    size_t left = (size_t)got;
    while (cnt && left >= v->iov_len) {
      left -= v->iov_len;
      v++;
      cnt--;
    }
    if (cnt && left) { /* stopped inside a segment */
      v->iov_base = (uint8_t *)v->iov_base + left;
      v->iov_len -= left;
    }
  }
  return (int64_t)done;
}

/* ---- PUT ------------------------------------------------------------------------ */

/* The temporary is durable and closed: give it the final name and publish
 * it. 0, or the rename's error. */
static int put_commit(nreq *r) {
  nvme *n = r->n;
  const kvt_tier_op *op = r->op;
  char hex[33];
  nvme_key_hex(&op->key, hex);
  pthread_mutex_lock(&n->mu);
  if (renameat(n->subs[r->tsub].fd, r->name, n->subs[r->sub].fd, hex) != 0) {
    const int err = -errno;
    pthread_mutex_unlock(&n->mu);
    return err;
  }
  n->pending--;
  int fresh;
  kvt_index_entry *e = kvt_index_upsert(&n->ix, &op->key, &fresh);
  if (!fresh)
    n->used -= e->off;
  e->len = op->len;
  e->off = r->reserved; /* the bytes on disk, counted in used since the reservation */
  pthread_mutex_unlock(&n->mu);
  r->name[0] = '\0';
  r->reserved = 0;
  return 0;
}

/* Gives a PUT that starts over a new temporary name, removing the file of
 * the old one if it was created. */
static void put_rename(nreq *r) {
  nvme *n = r->n;
  if (r->name[0])
    unlinkat(n->subs[r->tsub].fd, r->name, 0);
  char hex[33];
  nvme_key_hex(&r->op->key, hex);
  pthread_mutex_lock(&n->mu);
  const unsigned long long seq = ++n->counter;
  pthread_mutex_unlock(&n->mu);
  snprintf(r->name, sizeof(r->name), ".tmp-%s-%llu", hex, seq);
}

/* One attempt with plain calls: 0, or -errno with r->fd and r->name left
 * for req_end (or a retry) to close and remove. */
static int put_sync_once(nreq *r) {
  nvme *n = r->n;
  r->fd = openat(n->subs[r->tsub].fd, r->name,
                 O_WRONLY | (r->spare ? 0 : O_CREAT | O_EXCL) | open_flags(n), 0644);
  if (r->fd < 0) {
    const int err = -errno;
    if (!r->spare)
      r->name[0] = '\0'; /* not created; a spare is unlinked */
    return err;
  }
  int64_t rc = xfer_sync(r, 1);
  if (rc >= 0 && (uint64_t)rc != r->disk)
    rc = -EIO; /* a write that moved nothing and reported no error */
  if (rc >= 0 && fdatasync(r->fd) != 0)
    rc = -errno;
  if (rc >= 0) {
    close(r->fd);
    r->fd = -1;
    rc = put_commit(r);
  }
  if (rc >= 0 && fsync(n->subs[r->sub].fd) != 0) /* the new name is durable */
    rc = -errno;
  return (int)rc;
}

/* The file system is full although the capacity had room. The spares' blocks
 * are in neither the file system's free space nor what the caller can evict
 * (a DEL keeps its file as a spare), so a caller making room by deleting
 * would never get it: give them back, and try once more. */
static void put_sync(nreq *r) {
  int rc = put_sync_once(r);
  if (rc == -ENOSPC && !r->spare && nvme_spares_free(r->n)) {
    if (r->fd >= 0)
      close(r->fd);
    r->fd = -1;
    put_rename(r);
    rc = put_sync_once(r);
  }
  req_end(r, rc);
}

/* Fills the header block and points the transfer at the payload: in place
 * for an aligned caller buffer, else copied into a pool or bounce buffer. */
static int put_prepare(nreq *r) {
  nvme *n = r->n;
  const kvt_tier_op *op = r->op;
  const uint64_t len = op->len;
  const uint64_t sum = kvt_hash64(len ? op->buf : "", (size_t)len);
  r->disk = nvme_disk_size(len);
  nvme_header_write(r->hdr, &op->key, sum, len);
  if (aligned(op->buf) || !len) {
    const uint64_t body = len & ~(uint64_t)(NVME_BLK - 1), rest = len - body;
    r->iov[0] = (struct iovec){r->hdr, NVME_BLK};
    r->niov = 1;
    if (body)
      r->iov[r->niov++] = (struct iovec){op->buf, (size_t)body};
    if (rest) {
      memcpy(r->tail, (const uint8_t *)op->buf + body, (size_t)rest);
      memset(r->tail + rest, 0, (size_t)(NVME_BLK - rest));
      r->iov[r->niov++] = (struct iovec){r->tail, NVME_BLK};
    }
    r->data = NULL;
    return 0;
  }
  if (r->pool >= 0 && r->disk <= NVME_POOL_BYTES) {
    r->data = n->pool_mem + (size_t)r->pool * NVME_POOL_BYTES;
  } else { /* slow path: unaligned and larger than a pool buffer */
    r->bounce = kvt_alloc(n->ctx, (size_t)r->disk, NVME_BLK);
    if (!r->bounce)
      return -ENOMEM;
    r->data = r->bounce;
  }
  memcpy(r->data, r->hdr, NVME_BLK);
  memcpy(r->data + NVME_BLK, op->buf, (size_t)len);
  memset(r->data + NVME_BLK + len, 0, (size_t)(r->disk - NVME_BLK - len));
  return 0;
}

static void put_start(nreq *r) {
  nvme *n = r->n;
  const kvt_tier_op *op = r->op;
  char hex[33];
  nvme_key_hex(&op->key, hex);
  r->sub = r->tsub = op->key.bytes[0];
  nspare sp = {0, 0, 0, 0};
  pthread_mutex_lock(&n->mu);
  r->spare = spare_take(n, r->reserved, &sp);
  if (r->spare) /* its bytes, already in used, replace the fresh reservation */
    n->used -= r->reserved;
  const unsigned long long seq = ++n->counter;
  pthread_mutex_unlock(&n->mu);
  if (r->spare) {
    r->tsub = sp.sub;
    spare_name(r->name, sp.seq);
  } else {
    snprintf(r->name, sizeof(r->name), ".tmp-%s-%llu", hex, seq);
  }
  const int rc = put_prepare(r);
  if (rc) {
    if (!r->spare)
      r->name[0] = '\0';
    req_end(r, rc);
    return;
  }
#ifdef KVT_HAVE_URING
  if (n->uring && r->disk <= IO_MAX) {
    nvme_ring_put(r);
    return;
  }
#endif
  put_sync(r); /* also io_uring's slow path for payloads above IO_MAX */
}

/* ---- GET ------------------------------------------------------------------------ */

static void get_sync(nreq *r);

/* Points the transfer at r->len bytes of payload: straight into the caller's
 * buffer when it is aligned and holds the padded payload, else a pool or
 * bounce buffer that get_verify copies out of. */
static int get_prepare(nreq *r) {
  nvme *n = r->n;
  const kvt_tier_op *op = r->op;
  r->disk = nvme_disk_size(r->len);
  kvt_dealloc(n->ctx, r->bounce);
  r->bounce = NULL;
  if (aligned(op->buf) && op->len >= kvt_align_up(r->len, NVME_BLK)) {
    r->iov[0] = (struct iovec){r->hdr, NVME_BLK};
    r->niov = 1;
    if (r->len)
      r->iov[r->niov++] = (struct iovec){op->buf, (size_t)(r->disk - NVME_BLK)};
    r->data = NULL;
  } else if (r->pool >= 0 && r->disk <= NVME_POOL_BYTES) {
    r->data = n->pool_mem + (size_t)r->pool * NVME_POOL_BYTES;
  } else { /* slow path: see tier_nvme.h */
    r->bounce = kvt_alloc(n->ctx, (size_t)r->disk, NVME_BLK);
    if (!r->bounce)
      return -ENOMEM;
    r->data = r->bounce;
  }
  return 0;
}

/* Runs (again) the transfer of a GET whose buffers are prepared. */
static void get_go(nreq *r) {
#ifdef KVT_HAVE_URING
  if (r->n->uring && r->fd < 0 && r->disk <= IO_MAX) {
    nvme_ring_get(r);
    return;
  }
#endif
  get_sync(r);
}

/* A GET found a file that does not verify, read through a plain descriptor:
 * delete it (if it is still the file at that name) and report a miss. */
static void get_corrupt(nreq *r, const char *why) {
  nvme *n = r->n;
  char hex[33];
  nvme_key_hex(&r->op->key, hex);
  struct stat a, b;
  const int dfd = n->subs[r->sub].fd;
  pthread_mutex_lock(&n->mu);
  const int same = fstat(r->fd, &a) == 0 && fstatat(dfd, hex, &b, 0) == 0 && a.st_ino == b.st_ino &&
                   a.st_dev == b.st_dev;
  if (same) {
    if (!n->readonly) /* a reader forgets it; the writer may be replacing it */
      unlinkat(dfd, hex, 0);
    kvt_index_entry *e = kvt_index_find(&n->ix, &r->op->key);
    if (e) {
      n->used -= e->off;
      kvt_index_remove(&n->ix, e);
    }
  }
  const unsigned long long count = ++n->corrupt;
  pthread_mutex_unlock(&n->mu);
  kvt_logf(n->ctx, KVT_LOG_WARN, "nvme tier: %s/%02x/%s: %s; %s, a miss (corrupt files: %llu)",
           n->dir, r->sub, hex, why, n->readonly ? "left in place (read-only)" : "deleted", count);
  req_end(r, KVT_ENOTFOUND);
}

/* What io_uring read does not verify: it may be a file replaced between the
 * index lookup and the open, so read it once more through a plain
 * descriptor (which identifies the inode) before calling it corrupt. */
static void get_bad(nreq *r, const char *why) {
  if (r->fd < 0) {
    get_sync(r);
    return;
  }
  get_corrupt(r, why);
}

/* The file is read (or as much as there was): verify and copy out. */
static void get_verify(nreq *r) {
  kvt_tier_op *op = r->op;
  const uint8_t *h = r->data ? r->data : r->hdr;
  uint64_t len;
  if (r->moved < NVME_BLK || !nvme_header_ok(h, &op->key, &len)) {
    get_bad(r, "bad header");
    return;
  }
  if (len != r->len) {
    /* The index guessed another length (a replace raced this GET): this
     * inode's header is authoritative, and a file is never changed after
     * its rename, so a read of the same inode at its size must match. A
     * plain descriptor holds the inode; io_uring's chain reopens the name,
     * which may keep changing, so its second miss goes to a plain one. */
    int rc;
    if (len > op->len) {
      op->out_len = len;
      req_end(r, KVT_ENOBUFS);
    } else if (r->len = len, (rc = get_prepare(r)) != 0) {
      req_end(r, rc);
    } else if (r->fd < 0 && r->retried++) {
      get_sync(r);
    } else {
      get_go(r);
    }
    return;
  }
  if ((uint64_t)r->moved < r->disk) {
    get_bad(r, "payload truncated");
    return;
  }
  /* Payload checksums are verified here, lazily, not when the index is
   * rebuilt: open reads only header blocks, so restart time does not grow
   * with the bytes stored. */
  const uint8_t *payload = r->data ? r->data + NVME_BLK : op->buf;
  if (kvt_hash64(len ? payload : (const uint8_t *)"", (size_t)len) != kvt_ld64(h + 40)) {
    get_bad(r, "payload checksum mismatch");
    return;
  }
  op->out_len = len;
  if (r->data && len)
    memcpy(op->buf, r->data + NVME_BLK, (size_t)len);
  req_end(r, 0);
}

static void get_sync(nreq *r) {
  nvme *n = r->n;
  if (r->fd < 0) {
    char hex[33];
    nvme_key_hex(&r->op->key, hex);
    /* Not following a link, not waiting on a FIFO put there since the open:
     * what is no regular file is a miss, left in place. */
    r->fd = openat(n->subs[r->sub].fd, hex, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | open_flags(n));
    struct stat st;
    const int err = errno; /* (O_DIRECT on a FIFO is EINVAL) */
    if (r->fd >= 0 ? fstat(r->fd, &st) != 0 || !S_ISREG(st.st_mode)
                   : fstatat(n->subs[r->sub].fd, hex, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
                         !S_ISREG(st.st_mode)) {
      kvt_logf(n->ctx, KVT_LOG_WARN, "nvme tier: GET %s: not a regular file; a miss, left in place",
               hex);
      if (r->fd >= 0)
        close(r->fd);
      r->fd = -1;
      req_end(r, KVT_ENOTFOUND);
      return;
    }
    if (r->fd < 0) { /* deleted since the lookup: a miss */
      req_end(r, err == ENOENT ? KVT_ENOTFOUND : -err);
      return;
    }
  }
  r->moved = xfer_sync(r, 0);
  if (r->moved < 0)
    req_end(r, (int)r->moved);
  else
    get_verify(r);
}

static void get_start(nreq *r) {
  nvme *n = r->n;
  kvt_tier_op *op = r->op;
  r->sub = op->key.bytes[0];
  pthread_mutex_lock(&n->mu);
  n->gets_running++; /* from before its open until req_end: see spare_keep */
  const kvt_index_entry *e = kvt_index_find(&n->ix, &op->key);
  const uint64_t len = e ? e->len : 0;
  pthread_mutex_unlock(&n->mu);
  if (!e || len > op->len) {
    op->out_len = len;
    req_end(r, e ? KVT_ENOBUFS : KVT_ENOTFOUND);
    return;
  }
  r->len = len;
  const int rc = get_prepare(r);
  if (rc)
    req_end(r, rc);
  else
    get_go(r);
}

static void req_start(nreq *r) {
  r->fd = -1;
  r->err = 0;
  r->moved = 0;
  r->retried = 0;
  r->rerun = 0;
  r->reserved = r->op->opcode == KVT_TIER_PUT ? nvme_disk_size(r->op->len) : 0;
  r->name[0] = '\0';
  r->data = NULL;
  if (r->op->opcode == KVT_TIER_PUT) {
    r->stage = S_PUT;
    put_start(r);
  } else {
    r->stage = S_GET;
    get_start(r);
  }
}

/* ---- io_uring completions ---------------------------------------------------------- */

#ifdef KVT_HAVE_URING

/* Requests belong to the thread that entered the kernel with them, which
 * with batching may be any thread using the tier; when that thread exits,
 * the kernel cancels them (-ECANCELED, -EINTR) or fails their task work
 * (-EFAULT). Such a chain is run again, a few times at most. */
int nvme_owner_gone(int err) { return err == -ECANCELED || err == -EINTR || err == -EFAULT; }

static void chain_again(nreq *r) {
  r->err = 0;
  r->moved = 0;
  if (r->stage == S_GET) {
    nvme_ring_get(r);
    return;
  }
  if (!r->spare) /* the temporary may exist: start over under a new name */
    put_rename(r);
  nvme_ring_put(r);
}

void nvme_chain_done(nreq *r) {
  if (nvme_owner_gone(r->err) && r->rerun++ < 4) {
    chain_again(r);
    return;
  }
  if (r->stage == S_GET) {
    if (r->err == -ENOENT) /* deleted since the lookup: a miss */
      req_end(r, KVT_ENOTFOUND);
    else if (r->err < 0)
      req_end(r, r->err);
    else
      get_verify(r);
    return;
  }
  int rc = r->err;
  if ((rc == 0 && r->short_io) || (rc == -ENOSPC && !r->spare && nvme_spares_free(r->n))) {
    /* A write that fell short says how far it got, not why (a full file
     * system, a quota, a file size limit); plain calls say it, and retry
     * once a full file system got the spares' blocks back (put_sync). */
    r->err = 0;
    r->moved = 0;
    if (!r->spare)
      put_rename(r);
    put_sync(r);
    return;
  }
  if (rc == 0)
    rc = put_commit(r);
  if (rc == 0)
    nvme_ring_dir_sync(r->n, r->sub, r); /* acknowledged once the name is durable */
  else
    req_end(r, rc);
}

void nvme_dir_synced(nreq *list, int res) {
  while (list) {
    nreq *r = list;
    list = r->next;
    req_end(r, res < 0 ? res : 0);
  }
}
#endif

/* ---- operations ------------------------------------------------------------------ */

static int op_put(nvme *n, kvt_tier_op *op) {
  const uint64_t len = op->len;
  if (len > n->capacity || nvme_disk_size(len) > SIZE_MAX)
    return -ENOSPC;
  const uint64_t disk = nvme_disk_size(len);
  pthread_mutex_lock(&n->mu);
  spare_drop(n, disk);
  int rc = n->used + disk > n->capacity ? -ENOSPC
                                        : kvt_index_reserve(&n->ix, n->ix.items + n->pending + 1);
  if (!rc) {
    n->used += disk; /* reserved now, so concurrent PUTs cannot overcommit */
    n->pending++;
  }
  pthread_mutex_unlock(&n->mu);
  if (!rc)
    admit(n, op);
  return rc;
}

/* DEL and QUERY need no I/O but an unlink: done inline. */
static int op_meta(nvme *n, kvt_tier_op *op) {
  pthread_mutex_lock(&n->mu);
  kvt_index_entry *e = kvt_index_find(&n->ix, &op->key);
  if (e && op->opcode == KVT_TIER_QUERY) {
    op->out_len = e->len;
  } else if (e) {
    char hex[33];
    nvme_key_hex(&op->key, hex);
    if (spare_keep(n, op->key.bytes[0], hex, e->off) != 0) {
      unlinkat(n->subs[op->key.bytes[0]].fd, hex, 0);
      n->used -= e->off;
    }
    kvt_index_remove(&n->ix, e);
  }
  pthread_mutex_unlock(&n->mu);
  op->result = e ? 0 : KVT_ENOTFOUND;
  kvt_tier_complete(n->tier, op);
  return 0;
}

int nvme_submit(void *state, kvt_tier_op *op) {
  nvme *n = state;
  if (n->readonly && (op->opcode == KVT_TIER_PUT || op->opcode == KVT_TIER_DEL)) {
    op->result = -EROFS; /* readonly=1: nothing is written, renamed or deleted */
    kvt_tier_complete(n->tier, op);
    return 0;
  }
  switch (op->opcode) {
  case KVT_TIER_PUT:
    return op_put(n, op);
  case KVT_TIER_GET:
    admit(n, op);
    return 0;
  case KVT_TIER_DEL:
  case KVT_TIER_QUERY:
    return op_meta(n, op);
  default:
    return -EINVAL;
  }
}

#ifndef KVT_HAVE_URING
#define nvme_progress NULL /* operations complete inside submit */
#endif

const kvt_tier_backend kvt_tier_backend_nvme = {
    .abi_version = KVT_TIER_ABI_VERSION,
    .struct_size = sizeof(kvt_tier_backend),
    .scheme = "nvme",
    .open = nvme_open,
    .close = nvme_close,
    .submit = nvme_submit,
    .progress = nvme_progress,
    .stats = nvme_stats,
    .list = nvme_list,
    .traits = KVT_TIER_PERSISTENT,
};
