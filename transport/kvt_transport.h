/* transport/kvt_transport.h - a libfabric reliable-datagram (FI_EP_RDM)
 * endpoint with what kvtier-server and the fabric tier need: one completion
 * queue, an address vector, memory registration, two-sided messages for
 * control and one-sided RMA (read, write) for payload bytes.
 *
 * The provider is chosen by fi_getinfo() hints: FI_EP_RDM, FI_MSG | FI_RMA,
 * the provider name asked for ("tcp;ofi_rxm" by default, "verbs;ofi_rxm",
 * "efa", "sockets"). Memory-registration modes are handled as the provider
 * asks: FI_MR_LOCAL (local buffers carry a descriptor), FI_MR_VIRT_ADDR
 * (RMA addresses are virtual addresses, else offsets into the region),
 * FI_MR_PROV_KEY (the provider picks keys, else we hand out unique ones) and
 * FI_MR_ALLOCATED (we only register allocated memory anyway). Providers that
 * need FI_MR_RAW keys, FI_MR_ENDPOINT binding or a message prefix are not
 * offered those modes and so are not chosen.
 *
 * Threading: the endpoint is opened FI_THREAD_SAFE, so registration may
 * happen on any thread; posting and polling are meant for one thread (the
 * server's network thread, the fabric tier's worker).
 *
 * Completions carry the kvt_fab_ctx the operation was posted with; embed one
 * in the request it belongs to. Errors are -errno (from libfabric's FI_E*,
 * which are errno values) or KVT_EBACKEND, with detail in kvt_fab_error(). */
#ifndef KVT_TRANSPORT_H
#define KVT_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#define KVT_FAB_DEFAULT_PROVIDER "tcp;ofi_rxm"
#define KVT_FAB_ADDR_NONE UINT64_MAX

typedef struct kvt_fab kvt_fab;

/* Posted with every operation, returned with its completion. The first
 * member is the provider's (FI_CONTEXT2: eight pointers it may use until the
 * operation completes). */
typedef struct kvt_fab_ctx {
  void *provider[8];
  void *owner; /* the caller's */
  int kind;    /* the caller's */
} kvt_fab_ctx;

typedef struct kvt_fab_config {
  const char *provider; /* NULL: KVT_FAB_DEFAULT_PROVIDER; "auto": the first of efa,
                           verbs;ofi_rxm, tcp;ofi_rxm that opens */
  /* Listening side (the server): bind node:service. A client leaves both
   * NULL, or names the peer it will talk to in peer_node/peer_service so the
   * provider picks the interface that reaches it. */
  const char *node, *service;
  const char *peer_node, *peer_service;
  uint32_t cq_depth; /* 0: 1024 */
  /* 0: a post that finds the provider's queue full drives progress and tries
   * again for up to about a second (clients). 1: it returns -EAGAIN after one
   * more try, so one thread serving many peers is never held up by one that
   * does not keep up (the server queues the post and tries again later). */
  int no_post_wait;
} kvt_fab_config;

/* Loads libfabric.so.1 (once per process, thread-safe; libkvtier does not
 * link it: transport/fabric_lib.c). Returns 0, or KVT_EBACKEND with the
 * reason in err ("libfabric.so.1 not found: ..."): built with libfabric,
 * run without it. kvt_fab_open calls it; the server calls it before it
 * opens its tiers. */
int kvt_fab_load(char *err, size_t err_cap);

/* Opens fabric, domain, endpoint, CQ and AV. Returns 0, KVT_EBACKEND when
 * libfabric cannot be loaded (kvt_fab_load), -ENODATA when no provider
 * matches the hints (tests skip then), or another -errno, with detail in
 * err (always NUL-terminated). */
int kvt_fab_open(const kvt_fab_config *cfg, kvt_fab **out, char *err, size_t err_cap);
void kvt_fab_close(kvt_fab *f);

/* The provider's and fabric's names ("tcp;ofi_rxm", "127.0.0.1/32"). */
const char *kvt_fab_provider(const kvt_fab *f);
const char *kvt_fab_error(const kvt_fab *f); /* detail of the last failure */
/* Largest single RMA transfer (larger ones are split by the caller). */
uint64_t kvt_fab_max_rma(const kvt_fab *f);

/* This endpoint's address (fi_getname): what a peer inserts. */
int kvt_fab_getname(kvt_fab *f, void *addr, size_t *len);
/* Bytes of this endpoint's provider's addresses (a peer's getname size). */
size_t kvt_fab_addr_len(const kvt_fab *f);
/* Inserts a raw address (from a peer's getname, kvt_fab_addr_len bytes) or
 * host:port. */
int kvt_fab_av_insert(kvt_fab *f, const void *addr, uint64_t *fi_addr);
int kvt_fab_av_insert_host(kvt_fab *f, const char *node, const char *service, uint64_t *fi_addr);
void kvt_fab_av_remove(kvt_fab *f, uint64_t fi_addr);

/* A registered region. desc goes with local operations on it; a peer
 * addresses it with (rma_addr(offset), key). */
typedef struct kvt_fab_mr {
  void *fid;   /* struct fid_mr *, NULL when not registered */
  void *desc;
  uint64_t key;
  uint64_t base; /* what RMA address 0 of the region is: its address under FI_MR_VIRT_ADDR */
} kvt_fab_mr;

enum kvt_fab_access {
  KVT_FAB_LOCAL = 1,        /* source or target of this side's sends, receives, RMA */
  KVT_FAB_REMOTE_READ = 2,  /* a peer may fi_read it */
  KVT_FAB_REMOTE_WRITE = 4  /* a peer may fi_write it */
};

/* Registers buf[0..len) (len may be 0: nothing registered, desc NULL).
 * Where the provider takes our keys (no FI_MR_PROV_KEY), each key is drawn
 * at random (getrandom): a peer that can reach the endpoint cannot guess
 * one. Returns 0 or -errno. Thread-safe. */
int kvt_fab_mr_reg(kvt_fab *f, const void *buf, size_t len, unsigned access, kvt_fab_mr *mr);
void kvt_fab_mr_dereg(kvt_fab_mr *mr);
/* The RMA address a peer uses for buf + off of a region. */
uint64_t kvt_fab_mr_addr(const kvt_fab_mr *mr, const void *buf, size_t off);

/* Posting. Return 0, -EAGAIN (queue full: poll, then post again; see
 * no_post_wait) or -errno. */
int kvt_fab_send(kvt_fab *f, uint64_t dest, const void *buf, size_t len, void *desc,
                 kvt_fab_ctx *ctx);
int kvt_fab_recv(kvt_fab *f, void *buf, size_t len, void *desc, kvt_fab_ctx *ctx);
int kvt_fab_read(kvt_fab *f, uint64_t peer, void *buf, size_t len, void *desc, uint64_t raddr,
                 uint64_t rkey, kvt_fab_ctx *ctx);
int kvt_fab_write(kvt_fab *f, uint64_t peer, const void *buf, size_t len, void *desc,
                  uint64_t raddr, uint64_t rkey, kvt_fab_ctx *ctx);

typedef struct kvt_fab_comp {
  kvt_fab_ctx *ctx;
  int err;    /* 0 or -errno of a failed operation */
  size_t len; /* receives: bytes received */
} kvt_fab_comp;

/* Takes up to max completions without waiting (this also drives progress
 * for providers that need the caller to). Returns the count or -errno. */
int kvt_fab_poll(kvt_fab *f, kvt_fab_comp *out, int max);

/* Drives the provider's progress without taking completions: what
 * completes is kept for the next kvt_fab_poll(). For one thread driving two
 * endpoints (tests): with manual progress a peer must be driven for a
 * connection or a transfer to move. */
void kvt_fab_progress(kvt_fab *f);

/* Waits until a completion may be ready, wake_fd (an eventfd, or -1) is
 * readable, or timeout_ms passed. Returns 0 (check both), or -errno. */
int kvt_fab_wait(kvt_fab *f, int wake_fd, int timeout_ms);

#endif
