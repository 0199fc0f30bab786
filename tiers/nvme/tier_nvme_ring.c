/* tiers/nvme/tier_nvme_ring.c - the nvme tier's io_uring engine: one ring per
 * tier, shared by every thread under a lock; each request owns a fixed-file
 * slot, so a whole PUT (openat, fallocate, write, fdatasync, close) or GET
 * (openat, read, close) is one hard-linked chain submitted at once. The
 * openat and a PUT's write post a CQE only when they fail or fall short
 * (IOSQE_CQE_SKIP_SUCCESS); fallocate and fsync always post one, because
 * kernels do not mark their failures as failures (io_fallocate and io_fsync
 * only set the result), so with the skip flag a full disk or a failed
 * fdatasync would post nothing at all. SQEs are queued by the
 * submitting threads and given to the kernel in batches: by progress(),
 * when BATCH_SQES are waiting, or at once when a thread is blocked on the
 * ring (it would not submit them before it wakes). The directory fsyncs
 * that make renamed names durable are batched per subdirectory. */
#ifdef KVT_HAVE_URING
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>

#include "tier_nvme.h"

#define BATCH_SQES 32u
#define REAP_MAX 128u

/* user_data: a request's address (at least 8-aligned) or a subdirectory
 * number shifted up, and what the SQE did in the low bits. */
enum { T_OPEN = 1, T_ALLOC, T_XFER, T_SYNC, T_CLOSE, T_DIR };
#define TAG_MASK 7u

static void sqe_tag(struct io_uring_sqe *s, uint64_t who, unsigned tag, unsigned flags) {
  io_uring_sqe_set_data64(s, who | tag);
  io_uring_sqe_set_flags(s, flags);
}

/* Gives queued SQEs to the kernel (rmu held). Whatever it refuses (-EAGAIN,
 * -EBUSY) stays queued for the next call. */
static void flush(nvme *n) {
  if (!n->unsubmitted)
    return;
  io_uring_submit(&n->ring);
  n->unsubmitted = io_uring_sq_ready(&n->ring);
}

static struct io_uring_sqe *sqe_next(nvme *n) {
  struct io_uring_sqe *s = io_uring_get_sqe(&n->ring);
  if (!s) { /* not expected: the ring holds every request's chain (ring_init) */
    flush(n);
    s = io_uring_get_sqe(&n->ring);
  }
  n->unsubmitted++;
  return s;
}

static void kick(nvme *n) {
  if (n->waiters || n->unsubmitted >= BATCH_SQES)
    flush(n);
}

/* The transfer of r's file, on its fixed-file slot. */
static void xfer_prep(nvme *n, struct io_uring_sqe *s, nreq *r, int write) {
  const int slot = (int)r->id;
  if (!r->data) {
    if (write)
      io_uring_prep_writev(s, slot, r->iov, r->niov, 0);
    else
      io_uring_prep_readv(s, slot, r->iov, r->niov, 0);
  } else if (n->fixed_bufs && !r->bounce && r->pool >= 0) {
    if (write)
      io_uring_prep_write_fixed(s, slot, r->data, (unsigned)r->disk, 0, r->pool);
    else
      io_uring_prep_read_fixed(s, slot, r->data, (unsigned)r->disk, 0, r->pool);
  } else if (write) {
    io_uring_prep_write(s, slot, r->data, (unsigned)r->disk, 0);
  } else {
    io_uring_prep_read(s, slot, r->data, (unsigned)r->disk, 0);
  }
}

void nvme_ring_put(nreq *r) {
  nvme *n = r->n;
  const uint64_t who = (uint64_t)(uintptr_t)r;
  const unsigned link = IOSQE_IO_HARDLINK | IOSQE_CQE_SKIP_SUCCESS;
  pthread_mutex_lock(&n->rmu);
  r->err = 0;
  r->short_io = 0;
  r->cqes = 2; /* the fdatasync and the close; the fallocate's below */
  n->chains++;
  struct io_uring_sqe *s = sqe_next(n);
  /* Direct descriptors take no O_CLOEXEC (they are not in the fd table). */
  io_uring_prep_openat_direct(s, n->subs[r->tsub].fd, r->name,
                              O_WRONLY | (r->spare ? 0 : O_CREAT | O_EXCL) |
                                  (n->direct ? O_DIRECT : 0),
                              0644, r->id);
  sqe_tag(s, who, T_OPEN, link);
  if (n->falloc && !r->spare) { /* blocks allocated up front: the write does not extend the file */
    s = sqe_next(n);
    io_uring_prep_fallocate(s, (int)r->id, 0, 0, (off_t)r->disk);
    sqe_tag(s, who, T_ALLOC, IOSQE_IO_HARDLINK | IOSQE_FIXED_FILE);
    r->cqes++;
  }
  s = sqe_next(n);
  xfer_prep(n, s, r, 1);
  sqe_tag(s, who, T_XFER, link | IOSQE_FIXED_FILE);
  s = sqe_next(n);
  io_uring_prep_fsync(s, (int)r->id, IORING_FSYNC_DATASYNC);
  sqe_tag(s, who, T_SYNC, IOSQE_IO_HARDLINK | IOSQE_FIXED_FILE);
  s = sqe_next(n);
  io_uring_prep_close_direct(s, r->id);
  sqe_tag(s, who, T_CLOSE, 0);
  kick(n);
  pthread_mutex_unlock(&n->rmu);
}

void nvme_ring_get(nreq *r) {
  nvme *n = r->n;
  const uint64_t who = (uint64_t)(uintptr_t)r;
  char hex[33];
  nvme_key_hex(&r->op->key, hex);
  memcpy(r->name, hex, sizeof(hex)); /* the SQE reads it at submit time */
  pthread_mutex_lock(&n->rmu);
  r->err = 0;
  r->moved = 0;
  r->cqes = 2; /* the read (its byte count) and the close */
  n->chains++;
  struct io_uring_sqe *s = sqe_next(n);
  io_uring_prep_openat_direct(s, n->subs[r->sub].fd, r->name,
                              O_RDONLY | (n->direct ? O_DIRECT : 0), 0, r->id);
  sqe_tag(s, who, T_OPEN, IOSQE_IO_HARDLINK | IOSQE_CQE_SKIP_SUCCESS);
  s = sqe_next(n);
  xfer_prep(n, s, r, 0);
  sqe_tag(s, who, T_XFER, IOSQE_IO_HARDLINK | IOSQE_FIXED_FILE);
  s = sqe_next(n);
  io_uring_prep_close_direct(s, r->id);
  sqe_tag(s, who, T_CLOSE, 0);
  kick(n);
  pthread_mutex_unlock(&n->rmu);
}

/* Starts an fsync of subdirectory sub covering the renames waiting for one,
 * unless one is in flight (rmu held). */
static void dir_start(nvme *n, unsigned sub) {
  nsub *d = &n->subs[sub];
  if (d->syncing || !d->pending)
    return;
  d->in_sync = d->pending;
  d->pending = NULL;
  d->syncing = 1;
  n->chains++;
  struct io_uring_sqe *s = sqe_next(n);
  io_uring_prep_fsync(s, d->fd, 0);
  sqe_tag(s, (uint64_t)sub << 3, T_DIR, 0);
}

void nvme_ring_dir_sync(nvme *n, unsigned sub, nreq *r) {
  pthread_mutex_lock(&n->rmu);
  r->next = n->subs[sub].pending;
  n->subs[sub].pending = r;
  dir_start(n, sub);
  kick(n);
  pthread_mutex_unlock(&n->rmu);
}

/* One CQE (rmu held): a request whose chain ended goes to done[], a
 * finished directory fsync's list to synced[]. */
static void cqe_take(nvme *n, uint64_t ud, int res, nreq **done, unsigned *nd, nreq **synced,
                     int *sres, unsigned *ns) {
  const unsigned tag = (unsigned)(ud & TAG_MASK);
  if (tag == T_DIR) {
    nsub *d = &n->subs[ud >> 3];
    n->chains--;
    d->syncing = 0;
    if (nvme_owner_gone(res)) { /* run it again for the same renames and any since */
      nreq **tail = &d->in_sync;
      while (*tail)
        tail = &(*tail)->next;
      *tail = d->pending;
      d->pending = d->in_sync;
      d->in_sync = NULL;
      dir_start(n, (unsigned)(ud >> 3));
      return;
    }
    synced[*ns] = d->in_sync;
    sres[(*ns)++] = res;
    d->in_sync = NULL;
    dir_start(n, (unsigned)(ud >> 3));
    return;
  }
  nreq *r = (nreq *)(uintptr_t)(ud & ~(uint64_t)TAG_MASK);
  const int put = r->op->opcode == KVT_TIER_PUT;
  if (tag == T_XFER && res >= 0) {
    r->moved = res;
    if (put) /* a write posts a CQE only when it fell short */
      r->short_io = 1;
  } else if (res < 0 && !r->err) {
    r->err = res; /* the first failure of the chain; later SQEs then fail too */
  }
  const int counted = tag == T_CLOSE || tag == T_ALLOC || tag == T_SYNC || (tag == T_XFER && !put);
  if (counted && --r->cqes == 0) {
    done[(*nd)++] = r;
    n->chains--;
  }
}

int nvme_progress(void *state, int timeout_ms) {
  nvme *n = state;
  if (!n->uring)
    return nvme_idle_wait(n, timeout_ms);
  nreq *done[REAP_MAX], *synced[REAP_MAX];
  int sres[REAP_MAX];
  unsigned nd = 0, ns = 0;
  struct io_uring_cqe *cqe;
  pthread_mutex_lock(&n->rmu);
  flush(n);
  if (n->chains && timeout_ms != 0 && io_uring_peek_cqe(&n->ring, &cqe) != 0) {
    /* Wait on the ring's fd, not in io_uring_enter, so that many threads
     * may wait at once and none consumes another's completion. */
    struct pollfd p = {n->ring.ring_fd, POLLIN, 0};
    n->waiters++;
    pthread_mutex_unlock(&n->rmu);
    poll(&p, 1, timeout_ms);
    pthread_mutex_lock(&n->rmu);
    n->waiters--;
  }
  while (nd < REAP_MAX && ns < REAP_MAX && io_uring_peek_cqe(&n->ring, &cqe) == 0) {
    const uint64_t ud = io_uring_cqe_get_data64(cqe);
    const int res = cqe->res;
    io_uring_cqe_seen(&n->ring, cqe);
    cqe_take(n, ud, res, done, &nd, synced, sres, &ns);
  }
  flush(n); /* directory fsyncs started above */
  pthread_mutex_unlock(&n->rmu);
  /* The next steps run unlocked: renames, verification, completions. */
  for (unsigned i = 0; i < nd; i++)
    nvme_chain_done(done[i]);
  for (unsigned i = 0; i < ns; i++)
    nvme_dir_synced(synced[i], sres[i]);
  if (nd) {
    pthread_mutex_lock(&n->rmu);
    flush(n); /* directory fsyncs and backlogged operations the steps queued */
    pthread_mutex_unlock(&n->rmu);
  }
  return (int)(nd + ns);
}

int nvme_ring_init(nvme *n, char *why, size_t why_cap) {
  unsigned entries = 8;
  while (entries < n->qd * 6 + NVME_SUBDIRS) /* every chain and directory fsync at once */
    entries <<= 1;
  struct io_uring_params p;
  memset(&p, 0, sizeof(p));
  p.flags = IORING_SETUP_CQSIZE;
  p.cq_entries = entries * 2;
  int rc = io_uring_queue_init_params(entries, &n->ring, &p);
  if (rc) {
    snprintf(why, why_cap, "io_uring_queue_init: %s", strerror(-rc));
    return rc;
  }
  if (!(p.features & IORING_FEAT_LINKED_FILE) || !(p.features & IORING_FEAT_CQE_SKIP)) {
    snprintf(why, why_cap, "the kernel lacks linked direct descriptors (Linux 6.0)");
    rc = -EOPNOTSUPP;
  } else if ((rc = io_uring_register_files_sparse(&n->ring, n->qd)) != 0) {
    snprintf(why, why_cap, "registering %u file slots: %s", n->qd, strerror(-rc));
  }
  if (rc) {
    io_uring_queue_exit(&n->ring);
    return rc;
  }
  /* PUT chains block in io-wq workers (file creation, allocating writes);
   * the kernel's default of 4 per CPU would cap the queue depth. */
  unsigned workers[2] = {n->qd, 0};
  io_uring_register_iowq_max_workers(&n->ring, workers);
  struct iovec iov[NVME_POOL_BUFS];
  for (unsigned i = 0; i < NVME_POOL_BUFS; i++)
    iov[i] = (struct iovec){n->pool_mem + (size_t)i * NVME_POOL_BYTES, NVME_POOL_BYTES};
  rc = io_uring_register_buffers(&n->ring, iov, NVME_POOL_BUFS);
  n->fixed_bufs = rc == 0;
  if (rc)
    kvt_logf(n->ctx, KVT_LOG_INFO, "nvme tier: pool buffers not registered (%s): plain reads "
             "and writes", strerror(-rc));
  return 0;
}

void nvme_ring_exit(nvme *n) { io_uring_queue_exit(&n->ring); }

#else
typedef int kvt_nvme_ring_unused; /* built without liburing: pread/pwrite only */
#endif
