/* server/server_internal.h - what the server engine's parts share: the store
 * (server_store.c: tiers, index, tenant namespaces, eviction) and what the
 * network side (server_net.c: libfabric endpoint, sessions, requests;
 * server_work.c: the workers; their private state in server_net.h) is
 * configured with. The public face is include/kvtier/server.h (server.c). */
#ifndef KVT_SERVER_INTERNAL_H
#define KVT_SERVER_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "kvt_proto.h"
#include "kvtier.h"
#include "kvtier/server.h"

#define SRV_REC_HDR 32u /* record header in front of every stored payload */
#define SRV_MAX_TENANTS KVT_SERVER_MAX_TENANTS

typedef struct kvt_srv_tenant {
  char name[KVT_PROTO_TENANT_MAX + 1];
  char token[KVT_PROTO_TOKEN_MAX + 1];
  uint64_t tag; /* kvt_hash64 of the name: stored in each record's header */
} kvt_srv_tenant;

/* ---- the store ---- */

typedef struct kvt_srv_store kvt_srv_store;

/* Opens the tiers of spec ("dram:4GiB;nvme:/var/lib/kvtier:100GiB": one
 * tier, or a cache tier then the tier that holds everything) and indexes
 * what the last one holds from before. evict_lru: a full store drops its
 * least recently used values (else a PUT that does not fit is -ENOSPC).
 * Returns 0 or an error with detail in err. */
int kvt_srv_store_open(kvt_ctx *ctx, const char *spec, int evict_lru, const kvt_srv_tenant *tenants,
                       int n_tenants, kvt_srv_store **out, char *err, size_t err_cap);
void kvt_srv_store_close(kvt_srv_store *st);

/* PUT: rec holds SRV_REC_HDR free bytes then len payload bytes; the header
 * is written here. Returns 0, -ENOSPC, or a tier's error. */
int kvt_srv_store_put(kvt_srv_store *st, int tenant, const kvt_key *key, uint8_t *rec,
                      uint64_t len);

/* PUT without a copy: the record's block reserved in the tier kvt_srv_store_put
 * would copy it into (a dram tier: the only one, or the first of two), for
 * the caller to fill in place (the RMA read lands there), then committed.
 * reserve: SRV_REC_HDR + len bytes for (tenant, key), the header written,
 * *rec the record; room is made as a PUT would (dropping values, or copies
 * with two tiers), never by dropping the key's own value. It never waits
 * for other requests (the network thread calls it). The old value is served
 * until commit and kept by abort. Returns 0, KVT_ENOTSUP (no such tier: use
 * kvt_srv_store_put), -ENOSPC or an error.
 * commit: makes the filled record the key's value as kvt_srv_store_put would
 * (written through to the second tier from the block first, then published
 * and indexed); afterwards, successful or not, nothing is reserved. may_wait
 * 0: returns -EWOULDBLOCK having changed nothing when it would block (the key
 * is being read or written, or there is a second tier to write); call it
 * again with 1 where blocking is fine. Returns 0 or kvt_srv_store_put's errors.
 * abort: gives the block back (a no-op when nothing is reserved). */
typedef struct kvt_srv_put {
  kvt_tier *tier; /* NULL: nothing reserved */
  kvt_tier_reservation res;
  kvt_key ikey, key;
  int tenant;
  uint64_t len;
} kvt_srv_put;
int kvt_srv_store_put_reserve(kvt_srv_store *st, int tenant, const kvt_key *key, uint64_t len,
                              kvt_srv_put *p, uint8_t **rec);
int kvt_srv_store_put_commit(kvt_srv_store *st, kvt_srv_put *p, int may_wait);
void kvt_srv_store_put_abort(kvt_srv_store *st, kvt_srv_put *p);

/* GET in three steps, so the caller can size its buffer: begin takes a
 * read reference (the value cannot change or go until end) and says its
 * length; read copies the record into rec (SRV_REC_HDR + len bytes) and checks
 * its header. Returns 0, KVT_ENOTFOUND, or an error. */
typedef struct kvt_srv_get {
  void *entry;
  uint64_t len;
  int tenant;
  kvt_key key;
  kvt_tier *lender; /* kvt_srv_store_get_lend: the tier lending loan */
  kvt_tier_loan loan;
} kvt_srv_get;
int kvt_srv_store_get_begin(kvt_srv_store *st, int tenant, const kvt_key *key, kvt_srv_get *g);
int kvt_srv_store_get_read(kvt_srv_store *st, kvt_srv_get *g, uint8_t *rec);
/* Instead of get_read: the record (SRV_REC_HDR + len bytes, header checked)
 * lent in place by a memory tier holding it, in *rec, until get_unlend (then
 * get_end). Returns 0, or KVT_ENOTSUP / -EAGAIN / an error: use get_read. */
int kvt_srv_store_get_lend(kvt_srv_store *st, kvt_srv_get *g, const uint8_t **rec);
void kvt_srv_store_get_unlend(kvt_srv_store *st, kvt_srv_get *g);
/* hit: 1 counts a hit (the value was served), 0 an error, -1 nothing (the
 * client's buffer was too small). */
void kvt_srv_store_get_end(kvt_srv_store *st, kvt_srv_get *g, int hit);

int kvt_srv_store_exists(kvt_srv_store *st, int tenant, const kvt_key *key, uint64_t *len);
int kvt_srv_store_del(kvt_srv_store *st, int tenant, const kvt_key *key);

/* Up to max of the tenant's keys from cursor on (0: the start); *next is
 * the cursor of the next page, 0 when this one ended the walk. */
int kvt_srv_store_list(kvt_srv_store *st, int tenant, uint64_t cursor, kvt_proto_list_entry *out,
                       uint32_t max, uint32_t *n, uint64_t *next);

/* Fills the store's counters of v (KVT_STAT_*); tenant -1 for none. */
void kvt_srv_store_stats(kvt_srv_store *st, int tenant, uint64_t v[KVT_STAT_COUNT]);

/* ---- the network side ---- */

typedef struct kvt_srv_config {
  const char *host, *port; /* listen address */
  const char *provider;
  uint64_t max_request;  /* largest value, bytes */
  uint64_t max_inflight; /* payload bytes in flight per session */
  int workers;
  const kvt_srv_tenant *tenants;
  int n_tenants;
} kvt_srv_config;

#endif
