/* tiers/nvme/tier_nvme.h - what the nvme tier's files share: tier_nvme.c (the
 * operations and their state machines), tier_nvme_ring.c (the io_uring
 * engine) and tier_nvme_open.c (spec, directory scan, buffers, close).
 * See tier_nvme.c for the on-disk layout and the durability argument. */
#ifndef KVT_TIER_NVME_H
#define KVT_TIER_NVME_H

#include <pthread.h>
#include <sys/uio.h>

#ifdef KVT_HAVE_URING
#include <liburing.h>
#endif

#include "key_index.h"
#include "tier_internal.h"

#define NVME_BLK 4096u
#define NVME_MAGIC 0x454d564e54564b31ull /* "1KVTNVME" little-endian */
#define NVME_VERSION 1u
#define NVME_HDR_FIELDS 48u /* bytes covered by the header checksum */
#define NVME_QD_DEFAULT 64u
#define NVME_SUBDIRS 256u
#define NVME_NAME 80     /* a file name inside a subdirectory */
#define NVME_PATH 4096
/* The buffer pool serves callers whose buffers O_DIRECT cannot use as they
 * are (not 4096-aligned, or a GET buffer smaller than the padded payload).
 * Sized for one 1 MiB payload per buffer; a larger such payload takes the
 * slow path: a bounce buffer allocated for that operation. Registered with
 * io_uring when RLIMIT_MEMLOCK allows (READ_FIXED/WRITE_FIXED). */
#define NVME_POOL_BUFS 8u
#define NVME_POOL_BYTES ((1u << 20) + NVME_BLK)

/* Files of deleted values are kept (renamed .free-SEQ) and overwritten by
 * later PUTs of the same size: no inode to create, no blocks to allocate,
 * and an fdatasync with no metadata to commit. At most this many. */
#define NVME_SPARES 256u

typedef struct nvme nvme;

typedef struct nspare {
  uint64_t disk, seq; /* its size; its name is .free-SEQ */
  uint16_t sub;       /* the subdirectory it lies in */
  uint8_t ready;      /* no GET that may hold it open is still running */
} nspare;

/* One PUT or GET in flight. Preallocated at open (qd of them); its index is
 * its io_uring file slot and its 2-block scratch area (header, tail). */
typedef struct nreq {
  nvme *n;
  kvt_tier_op *op;
  uint32_t id;
  int stage;
  int fd;          /* pread engine and slow paths: a plain descriptor */
  int err;         /* the first error seen in the current chain */
  int64_t moved;   /* bytes the chain's transfer moved */
  unsigned cqes;   /* io_uring: CQEs still expected for the current chain */
  int short_io;    /* io_uring PUT: the write fell short (the CQE says how far, not why) */
  uint8_t *hdr;    /* NVME_BLK: the header block */
  uint8_t *tail;   /* NVME_BLK: PUT: the payload's last partial block, padded */
  int pool;        /* pool buffer index, or -1 */
  uint8_t *bounce; /* slow path: a buffer allocated for this operation */
  uint8_t *data;   /* the buffer the transfer uses: pool, bounce or NULL (iovecs) */
  uint64_t len;    /* payload bytes (GET: as the index said) */
  uint64_t disk;   /* header + padded payload */
  uint64_t reserved; /* PUT: bytes reserved against the capacity */
  struct iovec iov[3];
  unsigned niov;
  unsigned sub;    /* subdirectory: the key's first byte */
  unsigned tsub;   /* PUT: the subdirectory of the file it writes (a spare's) */
  int spare;       /* PUT: overwriting a spare, not creating a file */
  int retried;     /* GET: reads again at the length the header gave */
  int rerun;       /* chains run again after their owning thread exited */
  char name[NVME_NAME]; /* PUT: the temporary name inside subdirectory tsub */
  struct nreq *next;    /* free list, or a subdirectory's sync lists */
} nreq;

/* A subdirectory: its descriptor, and the PUTs renamed into it waiting for
 * the directory fsync that makes their names durable. */
typedef struct nsub {
  int fd;
  int syncing;               /* an fsync of this directory is in flight */
  nreq *pending, *in_sync;   /* renamed, waiting for the next / the current fsync */
} nsub;

struct nvme {
  kvt_ctx *ctx;
  kvt_tier *tier;
  char dir[NVME_PATH - 2 * NVME_NAME];
  int readonly;       /* readonly=1: no lock; nothing created, renamed or deleted */
  int lock_fd;        /* DIR, flock()ed exclusively until close (writers) */
  int direct;         /* O_DIRECT accepted by the file system (probed on open) */
  int falloc;         /* fallocate accepted by the file system (probed on open) */
  /* mu: the index, used/pending/corrupt/counter, and every rename or unlink
   * of a final name (so the index describes the file that won). */
  pthread_mutex_t mu;
  kvt_index ix;
  uint64_t capacity, used, pending, corrupt, counter;
  nspare spares[NVME_SPARES]; /* counted in used, not in the stats' used */
  unsigned n_spares;
  uint64_t spare_bytes, gets_running;
  /* qmu: request and pool buffer free lists, the admission backlog. */
  pthread_mutex_t qmu;
  nreq *reqs, *free_reqs;
  uint8_t *scratch;   /* 2 blocks per request */
  uint8_t *pool_mem;  /* NVME_POOL_BUFS x NVME_POOL_BYTES */
  int free_pool[NVME_POOL_BUFS];
  unsigned n_free_pool;
  kvt_tier_op *backlog_head, *backlog_tail; /* waiting for a request (op->internal[1]) */
  int admitting;      /* a thread is draining the backlog */
  pthread_cond_t idle; /* pread engine: broadcast when a request ends */
  unsigned qd;        /* requests: operations in flight at once */
  nsub subs[NVME_SUBDIRS];
  int uring;          /* 1: io_uring; 0: pread/pwrite in submit */
#ifdef KVT_HAVE_URING
  /* rmu: the ring (SQ and CQ), and the subdirectories' sync lists. */
  pthread_mutex_t rmu;
  struct io_uring ring;
  int fixed_bufs;     /* the pool is registered */
  unsigned unsubmitted; /* SQEs queued, not yet given to the kernel */
  unsigned waiters;   /* threads blocked in poll() on the ring */
  unsigned chains;    /* chains and directory fsyncs in flight */
#endif
};

/* tier_nvme.c */
void nvme_header_write(uint8_t *h, const kvt_key *k, uint64_t sum, uint64_t len);
int nvme_header_ok(const uint8_t *h, const kvt_key *k, uint64_t *len);
uint64_t nvme_disk_size(uint64_t len);
int nvme_hex_key(const char *s, kvt_key *k);
void nvme_key_hex(const kvt_key *k, char out[33]);
int nvme_submit(void *state, kvt_tier_op *op);
/* Unlinks every spare (close, and a file system found full); how many. */
unsigned nvme_spares_free(nvme *n);
/* The pread engine's progress: operations complete on the threads that run
 * them (a backlogged one on whichever thread frees a request), so a waiter
 * just sleeps until a request ends, 1 ms at most. */
int nvme_idle_wait(nvme *n, int timeout_ms);
/* io_uring completions: a chain of r's ended (with its first error in
 * r->err), or the fsync of a subdirectory ended. */
void nvme_chain_done(nreq *r);
int nvme_owner_gone(int err); /* an error from the exit of the thread owning the request */
void nvme_dir_synced(nreq *list, int res);

/* tier_nvme_ring.c */
int nvme_ring_init(nvme *n, char *why, size_t why_cap); /* after the pool exists */
void nvme_ring_exit(nvme *n);
void nvme_ring_put(nreq *r);  /* queues open, fallocate, write, fdatasync, close */
void nvme_ring_get(nreq *r);  /* queues open, read, close */
/* r's value is renamed into subs[sub]: acknowledge it once an fsync of the
 * subdirectory that started after the rename has completed. */
void nvme_ring_dir_sync(nvme *n, unsigned sub, nreq *r);
int nvme_progress(void *state, int timeout_ms);

/* tier_nvme_open.c */
int nvme_open(kvt_ctx *ctx, const char *args, kvt_tier *tier, void **state);
void nvme_close(void *state);
int nvme_stats(void *state, kvt_tier_stats *out);
int nvme_list(void *state, kvt_tier_list_fn fn, void *opaque);

#endif
