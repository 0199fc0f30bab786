/* tiers/tier_nvme.c - the "nvme" tier (nvme:DIR:SIZE[,qd=N][,engine=pread]):
 * one file per payload under DIR, written and read with O_DIRECT through
 * io_uring, surviving restarts.
 *
 * Layout: DIR/<first key byte, 2 hex>/<key, 32 hex>. A file is a 4096-byte
 * header block (magic, version, key, payload length, XXH3-64 of the payload,
 * XXH3-64 of the header fields) followed by the payload padded to 4096, so
 * every transfer is O_DIRECT-aligned. A PUT writes a temporary name in the
 * same subdirectory, fdatasyncs it and renames it over the final name: a
 * crash leaves the old value, the new one, or a stray temporary that the
 * next open removes, never a torn final file. A GET verifies everything it
 * read; any mismatch is treated as a torn or rotten file: it is deleted and
 * the GET is a miss.
 *
 * Each PUT and GET is a small state machine driven by completions: the data
 * reads, writes and the fdatasync go through io_uring (many in flight, up to
 * qd SQEs, the rest queued here); the rare metadata calls (open, rename,
 * unlink, close) are done synchronously on the thread that drives the step.
 * Completions are reaped by whichever thread calls progress(), which is the
 * generic layer's waiters. Without io_uring (not built, refused by the
 * kernel or seccomp, KVT_NVME_FORCE_PREAD=1, or engine=pread) the same
 * state machine runs its I/O with pread/pwrite inside submit. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef KVT_HAVE_URING
#include <liburing.h>
#endif

#include "tier_internal.h"

#define BLK 4096u
#define MAGIC 0x454d564e54564b31ull /* "1KVTNVME" little-endian */
#define VERSION 1u
#define HDR_FIELDS 48u /* bytes covered by the header checksum */
#define QD_DEFAULT 64u
#define IO_MAX (1u << 30) /* one SQE moves at most this much (its length is 32-bit) */
#define IDX_MIN 256u
#define PATH_LEN 4200

enum { IO_READ = 1, IO_WRITE, IO_FSYNC };
enum { S_PUT_WRITE = 1, S_PUT_SYNC, S_GET_READ };

typedef struct nentry {
  kvt_key key;
  uint64_t len, disk; /* payload bytes; header + padded payload on disk */
  int live;
} nentry;

typedef struct nvme nvme;

/* One PUT or GET in progress. */
typedef struct nreq {
  nvme *n;
  kvt_tier_op *op;
  int stage, fd, io, retried;
  uint8_t *buf;           /* 4096-aligned bounce: header block + padded payload */
  uint64_t size, done;    /* bytes the current I/O moves, bytes moved so far */
  uint64_t disk;          /* PUT: bytes reserved against the capacity */
  struct nreq *next;      /* waiting for an SQE */
  char tmp[PATH_LEN];     /* PUT: the temporary name */
} nreq;

struct nvme {
  kvt_ctx *ctx;
  kvt_tier *tier;
  char dir[PATH_LEN - 80];
  uint64_t capacity, used, items, pending, corrupt;
  uint64_t counter; /* temporary names */
  int direct;       /* O_DIRECT accepted by the file system (probed on open) */
  pthread_mutex_t mu; /* the index, used/pending and every rename or unlink of a final name */
  nentry *idx;
  uint64_t idx_cap;
  int uring;        /* 1: io_uring; 0: pread/pwrite in submit */
  unsigned qd;
#ifdef KVT_HAVE_URING
  pthread_mutex_t rmu; /* the ring's SQ and CQ, sq_busy and the wait queue */
  struct io_uring ring;
  unsigned sq_busy;    /* SQEs submitted, not yet reaped */
  nreq *wait_head, *wait_tail;
#endif
};

/* ---- paths and header ------------------------------------------------------ */

static void key_hex(const kvt_key *k, char out[33]) {
  for (int i = 0; i < 16; i++)
    snprintf(out + 2 * i, 3, "%02x", k->bytes[i]);
}

static int hex_key(const char *s, kvt_key *k) {
  for (int i = 0; i < 32; i++) {
    const char c = s[i];
    const int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (v < 0)
      return -1;
    k->bytes[i / 2] = (uint8_t)(i % 2 ? (k->bytes[i / 2] | v) : (v << 4));
  }
  return s[32] == '\0' ? 0 : -1;
}

static void final_path(const nvme *n, const kvt_key *k, char *out) {
  char hex[33];
  key_hex(k, hex);
  snprintf(out, PATH_LEN, "%s/%.2s/%s", n->dir, hex, hex);
}

static uint64_t disk_size(uint64_t len) { return BLK + kvt_align_up(len, BLK); }

static void header_write(uint8_t *h, const kvt_key *k, const void *payload, uint64_t len) {
  memset(h, 0, BLK);
  kvt_st64(h, MAGIC);
  kvt_st32(h + 8, VERSION);
  memcpy(h + 16, k->bytes, 16);
  kvt_st64(h + 32, len);
  kvt_st64(h + 40, len ? kvt_hash64(payload, (size_t)len) : kvt_hash64("", 0));
  kvt_st64(h + HDR_FIELDS, kvt_hash64(h, HDR_FIELDS));
}

/* Checks the header block alone; *len gets the payload length it claims. */
static int header_ok(const uint8_t *h, const kvt_key *k, uint64_t *len) {
  if (kvt_ld64(h) != MAGIC || kvt_ld32(h + 8) != VERSION ||
      kvt_ld64(h + HDR_FIELDS) != kvt_hash64(h, HDR_FIELDS) || memcmp(h + 16, k->bytes, 16) != 0)
    return 0;
  *len = kvt_ld64(h + 32);
  return *len <= UINT64_MAX - 2 * BLK;
}

/* With O_DIRECT unless the file system refused it at open (tmpfs does). */
static int open_file(const nvme *n, const char *path, int flags) {
  const int fd = open(path, flags | O_CLOEXEC | (n->direct ? O_DIRECT : 0), 0644);
  return fd < 0 ? -errno : fd;
}

/* ---- index (open addressing, backward-shift deletion) ----------------------- */

static uint64_t key_hash(const kvt_key *k) {
  uint64_t h = kvt_ld64(k->bytes) ^ (kvt_ld64(k->bytes + 8) * 0x9E3779B97F4A7C15ull);
  h ^= h >> 31;
  h *= 0xD6E8FEB86659FD93ull;
  return h ^ (h >> 32);
}

static nentry *idx_find(const nvme *n, const kvt_key *k) {
  if (!n->idx_cap)
    return NULL;
  const uint64_t mask = n->idx_cap - 1;
  for (uint64_t i = key_hash(k) & mask;; i = (i + 1) & mask) {
    nentry *e = &n->idx[i];
    if (!e->live)
      return NULL;
    if (memcmp(e->key.bytes, k->bytes, 16) == 0)
      return e;
  }
}

static nentry *idx_slot(const nvme *n, const kvt_key *k) {
  const uint64_t mask = n->idx_cap - 1;
  uint64_t i = key_hash(k) & mask;
  while (n->idx[i].live)
    i = (i + 1) & mask;
  return &n->idx[i];
}

/* Room for `want` entries, so publishing a PUT after its rename cannot fail. */
static int idx_reserve(nvme *n, uint64_t want) {
  if (want * 4 <= n->idx_cap * 3)
    return 0;
  uint64_t cap = n->idx_cap ? n->idx_cap * 2 : IDX_MIN;
  while (want * 4 > cap * 3)
    cap *= 2;
  nentry *t = kvt_alloc(n->ctx, cap * sizeof(*t), 64);
  if (!t)
    return -ENOMEM;
  memset(t, 0, cap * sizeof(*t));
  nentry *old = n->idx;
  const uint64_t old_cap = n->idx_cap;
  n->idx = t;
  n->idx_cap = cap;
  for (uint64_t i = 0; i < old_cap; i++)
    if (old[i].live)
      *idx_slot(n, &old[i].key) = old[i];
  kvt_dealloc(n->ctx, old);
  return 0;
}

static void idx_remove(nvme *n, nentry *e) {
  const uint64_t mask = n->idx_cap - 1;
  uint64_t hole = (uint64_t)(e - n->idx);
  n->used -= e->disk;
  for (uint64_t j = (hole + 1) & mask; n->idx[j].live; j = (j + 1) & mask) {
    const uint64_t home = key_hash(&n->idx[j].key) & mask;
    if (((j - home) & mask) >= ((j - hole) & mask)) {
      n->idx[hole] = n->idx[j];
      hole = j;
    }
  }
  n->idx[hole].live = 0;
  n->items--;
}

/* Publishes a stored value (mu held; room reserved). */
static void idx_put(nvme *n, const kvt_key *k, uint64_t len, uint64_t disk) {
  nentry *e = idx_find(n, k);
  if (e) {
    n->used -= e->disk;
  } else {
    e = idx_slot(n, k);
    n->items++;
  }
  *e = (nentry){*k, len, disk, 1};
}

/* ---- I/O engines ------------------------------------------------------------- */

static void step(nreq *r, int64_t res);

/* Runs r's current I/O to the end synchronously (the pread/pwrite engine). */
static int64_t io_sync(nreq *r) {
  if (r->io == IO_FSYNC)
    return fdatasync(r->fd) ? -errno : 0;
  while (r->done < r->size) {
    const size_t chunk = (size_t)(r->size - r->done < IO_MAX ? r->size - r->done : IO_MAX);
    const ssize_t got = r->io == IO_READ ? pread(r->fd, r->buf + r->done, chunk, (off_t)r->done)
                                         : pwrite(r->fd, r->buf + r->done, chunk, (off_t)r->done);
    if (got < 0 && errno == EINTR)
      continue;
    if (got < 0)
      return -errno;
    if (got == 0)
      break; /* end of file: the caller sees done < size */
    r->done += (uint64_t)got;
  }
  return 0;
}

#ifdef KVT_HAVE_URING
static void sqe_prep(nvme *n, nreq *r) {
  struct io_uring_sqe *sqe = io_uring_get_sqe(&n->ring); /* the callers checked for room */
  const uint64_t left = r->size - r->done;
  const unsigned chunk = (unsigned)(left < IO_MAX ? left : IO_MAX);
  if (r->io == IO_READ)
    io_uring_prep_read(sqe, r->fd, r->buf + r->done, chunk, r->done);
  else if (r->io == IO_WRITE)
    io_uring_prep_write(sqe, r->fd, r->buf + r->done, chunk, r->done);
  else
    io_uring_prep_fsync(sqe, r->fd, IORING_FSYNC_DATASYNC);
  io_uring_sqe_set_data(sqe, r);
  n->sq_busy++;
}

/* Queues r's next transfer: onto the ring if an SQE is free, else behind
 * the others, so callers can submit far more than qd operations. */
static void io_ring(nvme *n, nreq *r) {
  pthread_mutex_lock(&n->rmu);
  if (n->sq_busy < n->qd && !n->wait_head && io_uring_sq_space_left(&n->ring)) {
    sqe_prep(n, r);
    io_uring_submit(&n->ring);
  } else {
    r->next = NULL;
    if (n->wait_tail)
      n->wait_tail->next = r;
    else
      n->wait_head = r;
    n->wait_tail = r;
  }
  pthread_mutex_unlock(&n->rmu);
}
#endif

/* Runs (the rest of) r's current I/O; calls step when it ends. */
static void io_go(nreq *r) {
#ifdef KVT_HAVE_URING
  if (r->n->uring) {
    io_ring(r->n, r);
    return;
  }
#endif
  step(r, io_sync(r));
}

static void io_start(nreq *r, int io, uint64_t size) {
  r->io = io;
  r->size = size;
  r->done = 0;
  io_go(r);
}

/* ---- state machines ----------------------------------------------------------- */

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
  if (op->opcode == KVT_TIER_PUT && result != 0) {
    if (r->tmp[0])
      unlink(r->tmp);
    put_unreserve(n, r->disk);
  }
  kvt_dealloc(n->ctx, r->buf);
  kvt_dealloc(n->ctx, r);
  op->result = result;
  kvt_tier_complete(n->tier, op); /* last touch: a blocking caller may return at once */
}

/* The temporary is durable: give it the final name and publish it. */
static void put_commit(nreq *r) {
  nvme *n = r->n;
  char path[PATH_LEN];
  final_path(n, &r->op->key, path);
  close(r->fd);
  r->fd = -1;
  /* Renames and index updates in one order, so the index describes the
   * file that won. No fsync of the directory: a power loss may undo the
   * rename, which leaves the old value (the contract allows that). */
  pthread_mutex_lock(&n->mu);
  if (rename(r->tmp, path) != 0) {
    const int err = -errno;
    pthread_mutex_unlock(&n->mu);
    req_end(r, err);
    return;
  }
  n->pending--;
  idx_put(n, &r->op->key, r->op->len, r->disk);
  pthread_mutex_unlock(&n->mu);
  r->tmp[0] = '\0';
  r->disk = 0;
  req_end(r, 0);
}

/* A GET found a file that does not verify: delete it (if it is still the
 * file at that name) and report a miss. */
static void get_corrupt(nreq *r, const char *why) {
  nvme *n = r->n;
  char path[PATH_LEN];
  struct stat a, b;
  final_path(n, &r->op->key, path);
  pthread_mutex_lock(&n->mu);
  const int same = fstat(r->fd, &a) == 0 && stat(path, &b) == 0 && a.st_ino == b.st_ino &&
                   a.st_dev == b.st_dev;
  if (same) {
    unlink(path);
    nentry *e = idx_find(n, &r->op->key);
    if (e)
      idx_remove(n, e);
  }
  const unsigned long long count = ++n->corrupt;
  pthread_mutex_unlock(&n->mu);
  kvt_logf(n->ctx, KVT_LOG_WARN, "nvme tier: %s: %s; deleted, a miss (corrupt files: %llu)",
           path, why, count);
  req_end(r, KVT_ENOTFOUND);
}

/* The whole file is read (or as much as there was): verify and copy out. */
static void get_verify(nreq *r) {
  kvt_tier_op *op = r->op;
  uint64_t len;
  if (r->done < BLK || !header_ok(r->buf, &op->key, &len)) {
    get_corrupt(r, "bad header");
    return;
  }
  if (disk_size(len) != r->size) {
    /* The index guessed another length (a replace raced this GET): this
     * inode's header is authoritative, and a file is never changed after
     * its rename, so one more read at its size must match. */
    if (len > op->len) {
      op->out_len = len;
      req_end(r, KVT_ENOBUFS);
    } else if (r->retried++) {
      get_corrupt(r, "length does not match the file size");
    } else {
      kvt_dealloc(r->n->ctx, r->buf);
      r->buf = kvt_alloc(r->n->ctx, (size_t)disk_size(len), BLK);
      if (r->buf)
        io_start(r, IO_READ, disk_size(len));
      else
        req_end(r, -ENOMEM);
    }
    return;
  }
  if (r->done < r->size) {
    get_corrupt(r, "payload truncated");
    return;
  }
  /* Payload checksums are verified here, lazily, not when the index is
   * rebuilt: open reads only header blocks, so restart time does not grow
   * with the bytes stored. */
  if (kvt_hash64(r->buf + BLK, (size_t)len) != kvt_ld64(r->buf + 40)) {
    get_corrupt(r, "payload checksum mismatch");
    return;
  }
  op->out_len = len;
  if (len)
    memcpy(op->buf, r->buf + BLK, (size_t)len);
  req_end(r, 0);
}

static void step(nreq *r, int64_t res) {
  if (res < 0) {
    req_end(r, (int)res);
    return;
  }
  if (r->io != IO_FSYNC) {
    r->done += (uint64_t)res;
    if (res > 0 && r->done < r->size) { /* short transfer: continue it */
      io_go(r);
      return;
    }
  }
  if (r->stage == S_PUT_WRITE && r->done < r->size) {
    req_end(r, -EIO); /* a write that moved nothing and reported no error */
  } else if (r->stage == S_PUT_WRITE) {
    r->stage = S_PUT_SYNC;
    io_start(r, IO_FSYNC, 0);
  } else if (r->stage == S_PUT_SYNC) {
    put_commit(r);
  } else {
    get_verify(r);
  }
}

/* ---- operations --------------------------------------------------------------- */

static nreq *req_new(nvme *n, kvt_tier_op *op, uint64_t bytes) {
  nreq *r = kvt_alloc(n->ctx, sizeof(*r), 64);
  uint8_t *buf = kvt_alloc(n->ctx, (size_t)bytes, BLK);
  if (!r || !buf) {
    kvt_dealloc(n->ctx, r);
    kvt_dealloc(n->ctx, buf);
    return NULL;
  }
  memset(r, 0, offsetof(nreq, tmp) + 1);
  r->n = n;
  r->op = op;
  r->fd = -1;
  r->buf = buf;
  return r;
}

static int op_put(nvme *n, kvt_tier_op *op) {
  const uint64_t len = op->len;
  if (len > n->capacity || disk_size(len) > SIZE_MAX)
    return -ENOSPC;
  const uint64_t disk = disk_size(len);
  pthread_mutex_lock(&n->mu);
  int rc = n->used + disk > n->capacity ? -ENOSPC : idx_reserve(n, n->items + n->pending + 1);
  const uint64_t seq = ++n->counter;
  if (!rc) {
    n->used += disk; /* reserved now, so concurrent PUTs cannot overcommit */
    n->pending++;
  }
  pthread_mutex_unlock(&n->mu);
  if (rc)
    return rc;
  nreq *r = req_new(n, op, disk);
  if (!r) {
    put_unreserve(n, disk);
    return -ENOMEM;
  }
  r->disk = disk;
  char hex[33];
  key_hex(&op->key, hex);
  snprintf(r->tmp, PATH_LEN, "%s/%.2s/.tmp-%s-%llu", n->dir, hex, hex, (unsigned long long)seq);
  header_write(r->buf, &op->key, op->buf, len);
  if (len)
    memcpy(r->buf + BLK, op->buf, (size_t)len);
  memset(r->buf + BLK + len, 0, (size_t)(disk - BLK - len));
  r->fd = open_file(n, r->tmp, O_WRONLY | O_CREAT | O_EXCL);
  if (r->fd < 0) {
    const int err = r->fd;
    r->tmp[0] = '\0';
    req_end(r, err);
    return 0;
  }
  r->stage = S_PUT_WRITE;
  io_start(r, IO_WRITE, disk);
  return 0;
}

static int op_get(nvme *n, kvt_tier_op *op) {
  pthread_mutex_lock(&n->mu);
  const nentry *e = idx_find(n, &op->key);
  const uint64_t len = e ? e->len : 0;
  pthread_mutex_unlock(&n->mu);
  if (!e || len > op->len) {
    op->out_len = len;
    op->result = e ? KVT_ENOBUFS : KVT_ENOTFOUND;
    kvt_tier_complete(n->tier, op);
    return 0;
  }
  nreq *r = req_new(n, op, disk_size(len));
  if (!r)
    return -ENOMEM;
  char path[PATH_LEN];
  final_path(n, &op->key, path);
  r->fd = open_file(n, path, O_RDONLY);
  if (r->fd < 0) { /* deleted since the lookup: a miss */
    req_end(r, r->fd == -ENOENT ? KVT_ENOTFOUND : r->fd);
    return 0;
  }
  r->stage = S_GET_READ;
  io_start(r, IO_READ, disk_size(len));
  return 0;
}

/* DEL and QUERY need no I/O but an unlink: done inline. */
static int op_meta(nvme *n, kvt_tier_op *op) {
  pthread_mutex_lock(&n->mu);
  nentry *e = idx_find(n, &op->key);
  if (e && op->opcode == KVT_TIER_QUERY) {
    op->out_len = e->len;
  } else if (e) {
    char path[PATH_LEN];
    final_path(n, &op->key, path);
    unlink(path);
    idx_remove(n, e);
  }
  pthread_mutex_unlock(&n->mu);
  op->result = e ? 0 : KVT_ENOTFOUND;
  kvt_tier_complete(n->tier, op);
  return 0;
}

static int nvme_submit(void *state, kvt_tier_op *op) {
  nvme *n = state;
  switch (op->opcode) {
  case KVT_TIER_PUT:
    return op_put(n, op);
  case KVT_TIER_GET:
    return op_get(n, op);
  case KVT_TIER_DEL:
  case KVT_TIER_QUERY:
    return op_meta(n, op);
  default:
    return -EINVAL;
  }
}

/* Reaps what completed and feeds queued transfers to the freed SQEs; the
 * steps then run outside the ring's lock (they do syscalls and complete). */
#ifdef KVT_HAVE_URING
static int nvme_progress(void *state, int timeout_ms) {
  nvme *n = state;
  if (!n->uring)
    return 0;
  enum { BATCH = 64 };
  nreq *reqs[BATCH];
  int64_t res[BATCH];
  unsigned got = 0;
  struct io_uring_cqe *cqe;
  pthread_mutex_lock(&n->rmu);
  if (io_uring_sq_ready(&n->ring)) /* an earlier io_uring_submit failed (-EAGAIN) */
    io_uring_submit(&n->ring);
  if (n->sq_busy && io_uring_peek_cqe(&n->ring, &cqe) != 0 && timeout_ms != 0) {
    /* Wait on the ring's fd, not in io_uring_enter, so that many threads
     * may wait at once and none consumes another's completion. */
    struct pollfd p = {n->ring.ring_fd, POLLIN, 0};
    pthread_mutex_unlock(&n->rmu);
    poll(&p, 1, timeout_ms);
    pthread_mutex_lock(&n->rmu);
  }
  while (got < BATCH && io_uring_peek_cqe(&n->ring, &cqe) == 0) {
    reqs[got] = io_uring_cqe_get_data(cqe);
    res[got++] = cqe->res;
    io_uring_cqe_seen(&n->ring, cqe);
    n->sq_busy--;
  }
  int fed = 0;
  while (n->wait_head && n->sq_busy < n->qd && io_uring_sq_space_left(&n->ring)) {
    nreq *r = n->wait_head;
    n->wait_head = r->next;
    if (!n->wait_head)
      n->wait_tail = NULL;
    sqe_prep(n, r);
    fed = 1;
  }
  if (fed)
    io_uring_submit(&n->ring);
  pthread_mutex_unlock(&n->rmu);
  for (unsigned i = 0; i < got; i++)
    step(reqs[i], res[i]);
  return (int)got;
}
#else
#define nvme_progress NULL /* operations complete inside submit */
#endif

/* ---- open: directory, index rebuild -------------------------------------------- */

/* Reads one file's header block; whether it names a whole, valid value. */
static int scan_file(const nvme *n, int dfd, const char *name, uint8_t *blk, const kvt_key *k,
                     uint64_t *len) {
  const int fd = openat(dfd, name, O_RDONLY | O_CLOEXEC | (n->direct ? O_DIRECT : 0));
  if (fd < 0)
    return 0;
  struct stat st;
  const int ok = fstat(fd, &st) == 0 && pread(fd, blk, BLK, 0) == (ssize_t)BLK &&
                 header_ok(blk, k, len) && (uint64_t)st.st_size == disk_size(*len);
  close(fd);
  return ok;
}

static int scan_subdir(nvme *n, const char *sub, uint8_t *blk) {
  DIR *d = opendir(sub);
  if (!d)
    return -errno;
  int rc = 0;
  struct dirent *de;
  while (rc == 0 && (de = readdir(d)) != NULL) {
    kvt_key k;
    uint64_t len = 0;
    if (strncmp(de->d_name, ".tmp-", 5) == 0) { /* a PUT that never committed */
      unlinkat(dirfd(d), de->d_name, 0);
    } else if (hex_key(de->d_name, &k) != 0) {
      continue; /* ".", "..", or not ours: left alone */
    } else if (!scan_file(n, dirfd(d), de->d_name, blk, &k, &len)) {
      kvt_logf(n->ctx, KVT_LOG_WARN, "nvme tier: %s/%s: bad header or size (torn); deleted", sub,
               de->d_name);
      unlinkat(dirfd(d), de->d_name, 0);
      n->corrupt++;
    } else if ((rc = idx_reserve(n, n->items + 1)) == 0) {
      idx_put(n, &k, len, disk_size(len));
      n->used += disk_size(len);
    }
  }
  closedir(d);
  return rc;
}

/* Creates DIR and its 256 subdirectories if needed and rebuilds the index
 * from the header blocks (payloads are verified by GET, see get_verify). */
static int nvme_scan(nvme *n) {
  if (mkdir(n->dir, 0755) != 0 && errno != EEXIST)
    return kvt_fail(n->ctx, -errno, "nvme tier: cannot create directory '%s': %s", n->dir,
                    strerror(errno));
  char probe[PATH_LEN];
  snprintf(probe, sizeof(probe), "%s/.probe-direct", n->dir);
  const int pfd = open(probe, O_WRONLY | O_CREAT | O_CLOEXEC | O_DIRECT, 0644);
  n->direct = pfd >= 0 || errno != EINVAL;
  if (pfd >= 0)
    close(pfd);
  unlink(probe);
  if (!n->direct)
    kvt_logf(n->ctx, KVT_LOG_WARN, "nvme tier: %s refuses O_DIRECT: buffered I/O", n->dir);
  uint8_t *blk = kvt_alloc(n->ctx, BLK, BLK);
  if (!blk)
    return kvt_fail(n->ctx, -ENOMEM, "nvme tier: allocating a header buffer");
  int rc = 0;
  for (unsigned i = 0; i < 256 && rc == 0; i++) {
    char sub[PATH_LEN];
    snprintf(sub, sizeof(sub), "%s/%02x", n->dir, i);
    if (mkdir(sub, 0755) != 0 && errno != EEXIST)
      rc = kvt_fail(n->ctx, -errno, "nvme tier: cannot create directory '%s': %s", sub,
                    strerror(errno));
    else if ((rc = scan_subdir(n, sub, blk)) != 0)
      rc = kvt_fail(n->ctx, rc, "nvme tier: scanning '%s': %s", sub, kvt_strerror(rc));
  }
  kvt_dealloc(n->ctx, blk);
  return rc;
}

/* DIR:SIZE[,qd=N][,engine=pread]; DIR may itself contain ':'. */
static int parse_args(nvme *n, const char *args, int *force_pread) {
  const char *colon = args ? strrchr(args, ':') : NULL;
  if (!colon || colon == args || (size_t)(colon - args) >= sizeof(n->dir))
    return kvt_fail(n->ctx, KVT_ESPEC, "nvme tier: '%s': expected DIR:SIZE (e.g. %s)",
                    args ? args : "", "nvme:/var/cache/kvtier:100GiB");
  memcpy(n->dir, args, (size_t)(colon - args));
  n->dir[colon - args] = '\0';
  char opts[128];
  snprintf(opts, sizeof(opts), "%s", colon + 1);
  char *save = NULL, *tok = strtok_r(opts, ",", &save);
  if (!tok || kvt_parse_size(tok, &n->capacity) != 0 || n->capacity == 0)
    return kvt_fail(n->ctx, KVT_ESPEC, "nvme tier: '%s': the size is not a size above zero", args);
  while ((tok = strtok_r(NULL, ",", &save)) != NULL) {
    char *end = NULL;
    if (strncmp(tok, "qd=", 3) == 0) {
      const unsigned long qd = strtoul(tok + 3, &end, 10);
      if (!*(tok + 3) || *end || qd == 0 || qd > 4096)
        return kvt_fail(n->ctx, KVT_ESPEC, "nvme tier: '%s': qd must be 1..4096", args);
      n->qd = (unsigned)qd;
    } else if (strcmp(tok, "engine=pread") == 0) {
      *force_pread = 1;
    } else {
      return kvt_fail(n->ctx, KVT_ESPEC, "nvme tier: '%s': unknown option '%s'", args, tok);
    }
  }
  return 0;
}

static void engine_init(nvme *n, int force_pread) {
  const char *env = getenv("KVT_NVME_FORCE_PREAD");
  const char *why = "liburing not built in";
  if (force_pread || (env && strcmp(env, "1") == 0)) {
    why = force_pread ? "engine=pread in the spec" : "KVT_NVME_FORCE_PREAD=1";
  } else {
#ifdef KVT_HAVE_URING
    const int err = io_uring_queue_init(n->qd, &n->ring, 0);
    if (err == 0) {
      n->uring = 1;
      return;
    }
    why = strerror(-err);
#endif
  }
  kvt_logf(n->ctx, KVT_LOG_WARN, "nvme tier: io_uring unavailable (%s): using pread/pwrite", why);
}

static void nvme_close(void *state) {
  nvme *n = state;
#ifdef KVT_HAVE_URING
  if (n->uring)
    io_uring_queue_exit(&n->ring);
  pthread_mutex_destroy(&n->rmu);
#endif
  pthread_mutex_destroy(&n->mu);
  kvt_dealloc(n->ctx, n->idx);
  kvt_dealloc(n->ctx, n);
}

static int nvme_open(kvt_ctx *ctx, const char *args, kvt_tier *tier, void **state) {
  nvme *n = kvt_alloc(ctx, sizeof(*n), 64);
  if (!n)
    return kvt_fail(ctx, -ENOMEM, "nvme tier: allocating its state");
  memset(n, 0, sizeof(*n));
  n->ctx = ctx;
  n->tier = tier;
  n->qd = QD_DEFAULT;
  pthread_mutex_init(&n->mu, NULL);
#ifdef KVT_HAVE_URING
  pthread_mutex_init(&n->rmu, NULL);
#endif
  int force_pread = 0;
  int rc = parse_args(n, args, &force_pread);
  if (rc == 0)
    rc = nvme_scan(n);
  if (rc) {
    nvme_close(n);
    return rc;
  }
  engine_init(n, force_pread);
  kvt_logf(ctx, KVT_LOG_INFO,
           "nvme tier: %s: %llu values, %llu of %llu bytes used, %llu torn files removed, %s",
           n->dir, (unsigned long long)n->items, (unsigned long long)n->used,
           (unsigned long long)n->capacity, (unsigned long long)n->corrupt,
           n->uring ? "io_uring" : "pread/pwrite");
  *state = n;
  return 0;
}

static int nvme_stats(void *state, kvt_tier_stats *out) {
  nvme *n = state;
  pthread_mutex_lock(&n->mu);
  out->capacity = n->capacity;
  out->used = n->used;
  out->items = n->items;
  pthread_mutex_unlock(&n->mu);
  out->item_overhead = BLK; /* the file's header block */
  out->granule = BLK;       /* payloads padded for O_DIRECT */
  return 0;
}

/* fn runs on a copy, so it may call back into the tier. */
static int nvme_list(void *state, kvt_tier_list_fn fn, void *opaque) {
  nvme *n = state;
  pthread_mutex_lock(&n->mu);
  const uint64_t cnt = n->items;
  nentry *all = cnt ? kvt_alloc(n->ctx, (size_t)cnt * sizeof(*all), 64) : NULL;
  uint64_t k = 0;
  for (uint64_t i = 0; all && i < n->idx_cap && k < cnt; i++)
    if (n->idx[i].live)
      all[k++] = n->idx[i];
  pthread_mutex_unlock(&n->mu);
  if (cnt && !all)
    return -ENOMEM;
  int rc = 0;
  for (uint64_t i = 0; i < k && rc == 0; i++)
    rc = fn(opaque, &all[i].key, all[i].len);
  kvt_dealloc(n->ctx, all);
  return rc;
}

const kvt_tier_backend kvt_tier_backend_nvme = {
    KVT_TIER_ABI_VERSION, sizeof(kvt_tier_backend), "nvme", nvme_open, nvme_close, nvme_submit,
    nvme_progress, nvme_stats, nvme_list,
};
