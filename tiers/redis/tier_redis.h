/* tiers/redis/tier_redis.h - what the redis tier's files share: the tier state,
 * connections with their own RESP reader for the data path (tier_redis_conn.c),
 * the cluster slot map (tier_redis_conn.c) and the workers that run batches
 * of operations (tier_redis_ops.c). tier_redis.c parses the spec and holds
 * the backend tables. */
#ifndef KVT_TIER_REDIS_H
#define KVT_TIER_REDIS_H

#include <pthread.h>
#include <stdint.h>
#include <sys/uio.h>

#include <hiredis/hiredis.h>

#include "tier_internal.h"

#define RD_SLOTS 16384
#define RD_MAX_NODES 64
#define RD_NO_NODE 0xFFu
#define RD_FORMAT 2u  /* the value format (tier_redis_format.c) */
#define RD_HDR 64u    /* the value key's header */
#define RD_PHDR 32u   /* a part key's header */
#define RD_HDR_V1 32u /* format 1's value header (kvtier 0.3.0) */
/* What one value costs in `used` beyond its length: its header and an
 * estimate of what Redis spends on a key (the key's name, dict and expiry
 * entries, object headers: about 190 bytes measured on Redis 7 with
 * jemalloc). Constant, so that item_overhead + len is exactly a value's cost;
 * the few extra keys of a value in parts are not counted. */
#define RD_ITEM_OVERHEAD (RD_HDR + 192u)
#define RD_MAX_WORKERS 64
#define RD_RBUF (64u * 1024u)
#define RD_ARENA (64u * 1024u)
#define RD_IOV 512
#define RD_MAX_REDIRECTS 5
/* A value is split into at most this many parts (larger parts than part=
 * where needed): bounds the commands one PUT pipelines and the script's
 * check of its parts. */
#define RD_MAX_PARTS 1024u

typedef struct rd_node {
  char host[256];
  int port;
  uint64_t next_try_ms; /* no connect attempt before (backoff after a failure) */
  uint32_t backoff_ms;  /* 0: healthy */
  int last_err;         /* what a connect last failed with */
} rd_node;

/* One connection: hiredis connects it and runs control commands; the data
 * path writes with sendmsg (MSG_NOSIGNAL) and reads with its own reader,
 * straight into the caller's buffers. */
typedef struct rd_conn {
  redisContext *rc; /* NULL: not connected */
  int fd;
  uint8_t *rbuf;
  size_t rpos, rlen;
  /* The pending write: iovecs into callers' buffers and into arena. */
  struct iovec *iov; /* RD_IOV of them, allocated with the buffers on connect */
  int niov;
  uint8_t *arena;
  size_t arena_used;
  /* Every wait for the socket ends here (rd_now_ms() clock); 0: none (the
   * socket's own timeouts only). Armed per write and per reply. */
  uint64_t deadline_ms;
  int timeout_ms; /* a write that makes progress has this much more */
} rd_conn;

typedef struct rd_state rd_state;

typedef struct rd_worker {
  rd_state *st;
  pthread_t thread;
  rd_conn conn[RD_MAX_NODES];
  struct rd_job *jobs; /* pipeline entries */
  uint8_t scratch[4096];
} rd_worker;

struct rd_state {
  kvt_ctx *ctx;
  kvt_tier *tier;
  int cluster;
  /* spec */
  char user[128], pass[256], ns[128];
  int db;
  uint64_t ttl_ms, capacity, part;
  int timeout_ms;
  uint32_t conns, pipeline;
  char prefix[160]; /* "kvt:NS:" */
  size_t prefix_len;
  /* nodes and the slot map (cluster), under map_mu */
  pthread_mutex_t map_mu;
  rd_node nodes[RD_MAX_NODES];
  int nnodes, nseeds;
  uint8_t slot_node[RD_SLOTS];
  int map_stale;
  uint64_t next_refresh_ms;
  pthread_mutex_t refresh_mu;
  /* the queue, under q_mu */
  pthread_mutex_t q_mu;
  pthread_cond_t q_cv;
  kvt_tier_op *q_head, *q_tail;
  int stop;
  rd_worker *workers;
  uint32_t nworkers;
  /* what this handle knows of the namespace, under acct_mu */
  pthread_mutex_t acct_mu;
  int64_t used, items;
  int64_t pending; /* cost reserved by PUTs not completed yet */
  uint64_t server_capacity; /* without capacity=: used + the servers' free memory */
  uint64_t learned_ms;      /* when capacity was last learned */
  uint64_t next_recount_ms; /* ttl= with capacity=: the next recount, not before */
  pthread_mutex_t learn_mu; /* one capacity learner or recounter at a time */
  unsigned long long corrupt; /* values a GET found failing a check (atomic) */
};

/* tier_redis_format.c: what a value header says. */
typedef struct rd_hdr {
  uint64_t gen, total, psz;
  uint64_t hash; /* XXH3-64 of the data after the header */
  uint32_t nparts;
} rd_hdr;

/* What rd_hdr_check found. */
enum { RD_HDR_OK, RD_HDR_FOREIGN, RD_HDR_FORMAT1, RD_HDR_CORRUPT, RD_HDR_OTHER_KEY };

static inline uint32_t rd_parts_of(uint64_t total, uint64_t psz) {
  return total == 0 ? 1u : (uint32_t)((total + psz - 1) / psz);
}
void rd_hdr_make(uint8_t h[RD_HDR], const kvt_key *k, const rd_hdr *v);
/* The first n bytes of a value key, for key k: RD_HDR_OK (v filled in),
 * RD_HDR_FORMAT1 (v filled in but hash: an old value, whose parts a PUT or
 * DEL may remove), or why not. */
int rd_hdr_check(const uint8_t *h, size_t n, const kvt_key *k, rd_hdr *v);
void rd_part_make(uint8_t ph[RD_PHDR], const kvt_key *k, uint64_t total, uint64_t gen,
                  uint32_t index, uint64_t hash);
/* Part index of generation gen of k's value of total bytes: RD_HDR_OK and
 * the data's hash, or why not. */
int rd_part_check(const uint8_t *ph, size_t n, const kvt_key *k, uint64_t total, uint64_t gen,
                  uint32_t index, uint64_t *hash);
const char *rd_hdr_why(int status);

/* tier_redis.c */
/* Learns capacity again unless it was learned less than min_age_ms ago. */
void rd_learn_capacity(rd_state *st, uint64_t min_age_ms);

/* tier_redis_conn.c */
uint64_t rd_now_ms(void);
void rd_arm(const rd_state *st, rd_conn *c); /* deadline = now + timeout_ms */
int rd_conn_alive(rd_conn *c); /* 0: the server closed it (or sent unasked bytes) */
uint16_t rd_crc16(const char *buf, size_t len);
int rd_conn_open(rd_state *st, int node, rd_conn *c, int for_open);
int rd_conn_connect(rd_state *st, const char *host, int port, rd_conn *c, int for_open);
void rd_conn_close(rd_state *st, rd_conn *c);
void rd_conn_free(rd_state *st, rd_conn *c); /* and its buffers */
int rd_ctl(rd_state *st, rd_conn *c, int argc, const char **argv, const size_t *argvlen,
           redisReply **out);
int rd_ctl_send(rd_conn *c, int argc, const char **argv, const size_t *argvlen);
int rd_ctl_read(rd_conn *c, redisReply **out);
int rd_refresh_map(rd_state *st, int for_open);
int rd_node_of_slot(rd_state *st, unsigned slot);
int rd_node_add(rd_state *st, const char *host, int port);
int rd_reply_error(const char *msg, size_t len);
/* data path I/O */
int rd_put_raw(rd_conn *c, const void *p, size_t n); /* copied into the arena */
int rd_put_ref(rd_conn *c, const void *p, size_t n); /* referenced until flush */
int rd_flush(rd_conn *c);
int rd_read_line(rd_conn *c, char *type, int64_t *num, char *text, size_t cap);
int rd_read_exact(rd_conn *c, void *dst, size_t n); /* dst NULL: discard */

/* tier_redis_ops.c */
void *rd_worker_main(void *arg);
int rd_worker_init(rd_state *st, rd_worker *w);
void rd_worker_fini(rd_worker *w);

/* tier_redis_list.c */
int rd_list(void *state, kvt_tier_list_fn fn, void *opaque);
/* The namespace's values and their cost, from the servers. */
int rd_recount(rd_state *st, uint64_t *used, uint64_t *items);

#endif
