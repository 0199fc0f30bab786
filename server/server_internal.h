/* server/server_internal.h - what kvtier-server's parts share: the store
 * (server_store.c: tiers, index, tenant namespaces, eviction), the network
 * side (server_net.c: libfabric endpoint, sessions, requests; server_work.c:
 * the workers; their private state in server_net.h) and main
 * (kvtier_server.c: options, signals, --stats). */
#ifndef KVT_SERVER_INTERNAL_H
#define KVT_SERVER_INTERNAL_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "kvt_proto.h"
#include "kvtier.h"

#define SRV_REC_HDR 32u        /* record header in front of every stored payload */
#define SRV_MAX_TENANTS 256

typedef struct srv_tenant {
  char name[KVT_PROTO_TENANT_MAX + 1];
  char token[KVT_PROTO_TOKEN_MAX + 1];
  uint64_t tag; /* kvt_hash64 of the name: stored in each record's header */
} srv_tenant;

/* ---- the store ---- */

typedef struct srv_store srv_store;

/* Opens the tiers of spec ("dram:4GiB;nvme:/var/lib/kvtier:100GiB": one
 * tier, or a cache tier then the tier that holds everything) and indexes
 * what the last one holds from before. evict_lru: a full store drops its
 * least recently used values (else a PUT that does not fit is -ENOSPC).
 * Returns 0 or an error with detail in err. */
int srv_store_open(kvt_ctx *ctx, const char *spec, int evict_lru, const srv_tenant *tenants,
                   int n_tenants, srv_store **out, char *err, size_t err_cap);
void srv_store_close(srv_store *st);

/* PUT: rec holds SRV_REC_HDR free bytes then len payload bytes; the header
 * is written here. Returns 0, -ENOSPC, or a tier's error. */
int srv_store_put(srv_store *st, int tenant, const kvt_key *key, uint8_t *rec, uint64_t len);

/* PUT without a copy: the record's block reserved in the tier srv_store_put
 * would copy it into (a dram tier: the only one, or the first of two), for
 * the caller to fill in place (the RMA read lands there), then committed.
 * reserve: SRV_REC_HDR + len bytes for (tenant, key), the header written,
 * *rec the record; room is made as a PUT would (dropping values, or copies
 * with two tiers), never by dropping the key's own value. It never waits
 * for other requests (the network thread calls it). The old value is served
 * until commit and kept by abort. Returns 0, KVT_ENOTSUP (no such tier: use
 * srv_store_put), -ENOSPC or an error.
 * commit: makes the filled record the key's value as srv_store_put would
 * (written through to the second tier from the block first, then published
 * and indexed); afterwards, successful or not, nothing is reserved. may_wait
 * 0: returns -EWOULDBLOCK having changed nothing when it would block (the key
 * is being read or written, or there is a second tier to write); call it
 * again with 1 where blocking is fine. Returns 0 or srv_store_put's errors.
 * abort: gives the block back (a no-op when nothing is reserved). */
typedef struct srv_put {
  kvt_tier *tier; /* NULL: nothing reserved */
  kvt_tier_reservation res;
  kvt_key ikey, key;
  int tenant;
  uint64_t len;
} srv_put;
int srv_store_put_reserve(srv_store *st, int tenant, const kvt_key *key, uint64_t len,
                          srv_put *p, uint8_t **rec);
int srv_store_put_commit(srv_store *st, srv_put *p, int may_wait);
void srv_store_put_abort(srv_store *st, srv_put *p);

/* GET in three steps, so the caller can size its buffer: begin takes a
 * read reference (the value cannot change or go until end) and says its
 * length; read copies the record into rec (SRV_REC_HDR + len bytes) and checks
 * its header. Returns 0, KVT_ENOTFOUND, or an error. */
typedef struct srv_get {
  void *entry;
  uint64_t len;
  int tenant;
  kvt_key key;
  kvt_tier *lender; /* srv_store_get_lend: the tier lending loan */
  kvt_tier_loan loan;
} srv_get;
int srv_store_get_begin(srv_store *st, int tenant, const kvt_key *key, srv_get *g);
int srv_store_get_read(srv_store *st, srv_get *g, uint8_t *rec);
/* Instead of get_read: the record (SRV_REC_HDR + len bytes, header checked)
 * lent in place by a memory tier holding it, in *rec, until get_unlend (then
 * get_end). Returns 0, or KVT_ENOTSUP / -EAGAIN / an error: use get_read. */
int srv_store_get_lend(srv_store *st, srv_get *g, const uint8_t **rec);
void srv_store_get_unlend(srv_store *st, srv_get *g);
/* hit: 1 counts a hit (the value was served), 0 an error, -1 nothing (the
 * client's buffer was too small). */
void srv_store_get_end(srv_store *st, srv_get *g, int hit);

int srv_store_exists(srv_store *st, int tenant, const kvt_key *key, uint64_t *len);
int srv_store_del(srv_store *st, int tenant, const kvt_key *key);

/* Up to max of the tenant's keys from cursor on (0: the start); *next is
 * the cursor of the next page, 0 when this one ended the walk. */
int srv_store_list(srv_store *st, int tenant, uint64_t cursor, kvt_proto_list_entry *out,
                   uint32_t max, uint32_t *n, uint64_t *next);

/* Fills the store's counters of v (KVT_STAT_*); tenant -1 for none. */
void srv_store_stats(srv_store *st, int tenant, uint64_t v[KVT_STAT_COUNT]);

/* ---- the network side ---- */

typedef struct srv_config {
  const char *host, *port; /* listen address */
  const char *provider;
  uint64_t max_request;    /* largest value, bytes */
  uint64_t max_inflight;   /* payload bytes in flight per session */
  int workers;
  const srv_tenant *tenants;
  int n_tenants;
  int quiet;
} srv_config;

/* Serves until *stop becomes non-zero (a signal handler sets it and writes
 * the eventfd *wake_fd), then drains requests in progress and returns 0, or
 * an error at startup (detail printed). */
int srv_net_run(const srv_config *cfg, srv_store *st, volatile sig_atomic_t *stop, int wake_fd);

#endif
