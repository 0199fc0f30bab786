/* server/server_net.h - what the server's network side shares between its
 * network thread (server_net.c: endpoint, sessions, requests, the loop), its
 * workers (server_work.c: the store calls requests need) and the public
 * functions (server.c): the request slots, the session table, the staging
 * buffers and the server (kvt_server) they belong to. */
#ifndef KVT_SERVER_NET_H
#define KVT_SERVER_NET_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "kvt_internal.h"
#include "kvt_transport.h"
#include "server_internal.h"

#define NREQ 256
#define MAX_SESS 1024 /* a power of two: the low bits of a session id are its slot */
#define BUF_MIN_SHIFT 12
#define BUF_CLASSES 48

enum { K_RECV = 1, K_SEND, K_RMA };
enum { P_NONE, P_RECV, P_SEND, P_RMA }; /* a post waiting for room */
enum { RS_POSTED, RS_DEFERRED, RS_RMA, RS_WORK, RS_REPLY, RS_IDLE };

typedef struct sbuf {
  struct sbuf *next;
  uint8_t *p;
  size_t cap;
  int cls;
  kvt_fab_mr mr;
} sbuf;

typedef struct sreq sreq;

typedef struct sess {
  uint64_t id, addr;
  int tenant; /* -1: stats only */
  int used, dead;
  uint64_t inflight;
  uint32_t outstanding;
  int64_t last;
  sreq *def_head, *def_tail;
} sess;

struct sreq {
  kvt_fab_ctx rctx, sctx, actx;
  uint8_t *rbuf, *msg;
  int state;
  kvt_proto_msg req;
  sess *s;
  sbuf *stage;
  kvt_srv_put put;  /* a PUT into its block in the DRAM tier: held while put.tier is set */
  uint8_t *put_rec; /* that block: the record, its payload after SRV_REC_HDR */
  kvt_fab_mr put_mr;
  uint64_t rma_off, rma_len; /* the transfer, in chunks of max_rma */
  int32_t status;
  uint64_t out_len, charge;
  uint64_t temp_addr; /* a refused HELLO's peer, removed after the reply: or KVT_FAB_ADDR_NONE */
  uint64_t new_session;
  kvt_srv_get g; /* a GET served from a lent record (lent): held until finish */
  int lent;
  const uint8_t *src; /* the lent payload */
  kvt_fab_mr lend_mr;
  kvt_proto_list_entry *list; /* LIST replies, allocated on first use */
  uint32_t list_n;
  uint64_t list_next;
  uint64_t stats[KVT_STAT_COUNT];
  sreq *next;
  int pending; /* P_*: what waits in the server's retry queue */
  int hello_q; /* a HELLO reply counted in hello_pending */
  size_t send_len;
  int64_t pending_since;
  sreq *pnext;
};

struct kvt_server {
  kvt_ctx *ctx;
  const kvt_srv_config *cfg; /* &config */
  kvt_srv_config config;
  char host[256], port[16], provider[256]; /* config's strings */
  kvt_srv_tenant *tenants;
  kvt_log_fn log;
  void *log_opaque;
  int log_level;
  atomic_int stop; /* kvt_server_stop: async-signal-safe (lock-free) */
  atomic_int ran;  /* kvt_server_run was called (once: a second, even a concurrent one, gets -EINVAL) */
  int net_open;    /* kvt_srv_net_open succeeded in part: kvt_srv_net_close undoes it */
  kvt_srv_store *st;
  kvt_fab *fab;
  uint8_t *pool;
  kvt_fab_mr pool_mr;
  sreq req[NREQ];
  sess sess[MAX_SESS];
  /* Per tenant, index tenant + 1 (0: stats-only sessions). */
  uint32_t tenant_sess[SRV_MAX_TENANTS + 1], tenant_reqs[SRV_MAX_TENANTS + 1];
  uint64_t salt;
  int draining;
  int wake_fd;
  sreq *retry_head, *retry_tail; /* posts that found no room */
  int hello_pending;
  /* Workers. */
  pthread_t *threads;
  int n_threads;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  sreq *job_head, *job_tail;   /* for the workers */
  sreq *done_head, *done_tail; /* back to the network thread */
  int stop_workers;
  /* Staging buffers. */
  pthread_mutex_t buf_mu;
  sbuf *free_bufs[BUF_CLASSES];
  uint64_t cached_bytes;
  /* Counters read by STATS (from workers): atomics. */
  atomic_uint_fast64_t n_sessions, auth_refused, too_big, deferred;
  int64_t started;
};

/* ---- from server.c ---- */

/* A line for the config's log callback at level (dropped above log_level).
 * Network thread only. */
void kvt_srv_log(kvt_server *sv, int level, const char *fmt, ...) KVT_PRINTF(3, 4);

/* ---- from server_net.c ---- */

/* Opens the endpoint on sv->cfg's address, posts the receives and starts the
 * workers (sv->ctx, cfg, st and wake_fd set, the rest zero). Returns 0 or
 * an error with detail in sv->ctx; kvt_srv_net_close undoes what was done
 * either way. */
int kvt_srv_net_open(kvt_server *sv);
/* The network loop: serves until sv->stop, then drains. */
void kvt_srv_net_serve(kvt_server *sv);
/* Joins the workers, closes the endpoint, gives back reservations and
 * staging buffers (before the store closes). */
void kvt_srv_net_close(kvt_server *sv);

/* Seconds on the monotonic clock. */
int64_t kvt_srv_now_s(void);

/* A registered staging buffer of at least n bytes, or NULL. Thread-safe;
 * the buffer goes back to the cache when its request finishes (r->stage). */
sbuf *kvt_srv_buf_get(kvt_server *sv, size_t n);

/* ---- from server_work.c ---- */

/* A worker thread (arg: the server): takes requests from the job queue,
 * does their store calls and hands them back to the network thread. */
void *kvt_srv_worker_main(void *arg);

#endif
