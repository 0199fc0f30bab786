/* transport/kvt_proto.h - the kvtier-server control protocol, shared by the
 * server (server/) and its client, the fabric tier
 * (tiers/tier_fabric.c).
 *
 * Control messages are small (at most KVT_PROTO_MSG_MAX bytes) and travel as
 * libfabric messages; payload bytes never do. A PUT names a buffer the client
 * registered for remote read (address, key): the server fi_read()s the bytes
 * and replies. A GET names a buffer registered for remote write: the server
 * fi_write()s the value into it and then replies (the reply is sent only once
 * the write completed, so a reply means the bytes are there).
 *
 * Every message starts with a 32-byte little-endian header:
 *   0  u32 magic    "KVTF" (KVT_PROTO_MAGIC)
 *   4  u16 version  KVT_PROTO_VERSION; a peer refuses any other
 *   6  u16 opcode   enum kvt_proto_op, | KVT_PROTO_REPLY in replies
 *   8  i32 status   replies: 0, -errno or a KVT_E* code; requests: 0
 *  12  u32 body     bytes of body after the header
 *  16  u64 req_id   chosen by the client, echoed in the reply; the fabric tier
 *                  draws it at random (HELLO included) and believes only a
 *                  reply naming one of its own: anyone may send to its endpoint
 *  24  u64 session  0 in HELLO; the server's session id (tenant binding) after
 * Bodies (all little-endian, fixed layout per opcode, lengths checked):
 *   HELLO    u16 addr_len, addr[addr_len] (the client endpoint's fi_getname),
 *            u8 tenant_len, tenant, u8 token_len, token
 *   HELLO r  u64 max_request, u64 max_inflight, u32 msg_max, u32 list_max
 *   PUT      key[16], u64 len, u64 rma_addr, u64 rma_key
 *   GET      key[16], u64 cap, u64 rma_addr, u64 rma_key
 *   GET r / EXISTS r   u64 len (the value's length: also with KVT_ENOBUFS)
 *   EXISTS / DEL       key[16]
 *   STATS r  u32 n, n x u64 (enum kvt_proto_stat order; later versions append)
 *   LIST     u64 cursor, u32 max
 *   LIST r   u64 next_cursor (0: done), u32 n, n x (key[16], u64 len)
 * PUT r, DEL r and BYE carry no body. A request with an unknown or expired
 * session is dropped unanswered (the server has no address for it): the
 * client times out and says HELLO again (a client also takes -ENOTCONN so).
 * A request over its session's share of the server's request slots is
 * answered -EBUSY (docs/SERVER.md, Limits). */
#ifndef KVT_PROTO_H
#define KVT_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier/key.h"

#define KVT_PROTO_MAGIC 0x4654564Bu /* "KVTF" as little-endian bytes */
#define KVT_PROTO_VERSION 1u
#define KVT_PROTO_HDR 32u
#define KVT_PROTO_MSG_MAX 8192u /* every control message fits in this */
#define KVT_PROTO_REPLY 0x8000u
#define KVT_PROTO_ADDR_MAX 128u /* fi_getname() sizes: sockaddr_in6 is 28 */
#define KVT_PROTO_TENANT_MAX 64u
#define KVT_PROTO_TOKEN_MAX 128u
#define KVT_PROTO_LIST_ENTRY 24u
/* LIST entries that fit in one reply. */
#define KVT_PROTO_LIST_MAX ((KVT_PROTO_MSG_MAX - KVT_PROTO_HDR - 12u) / KVT_PROTO_LIST_ENTRY)

enum kvt_proto_op {
  KVT_PROTO_HELLO = 1,
  KVT_PROTO_PUT = 2,
  KVT_PROTO_GET = 3,
  KVT_PROTO_EXISTS = 4,
  KVT_PROTO_DEL = 5,
  KVT_PROTO_STATS = 6,
  KVT_PROTO_LIST = 7,
  KVT_PROTO_BYE = 8 /* the client goes away: the server drops its session (no reply) */
};

/* The STATS reply's counters, in wire order. Server-wide unless "tenant". */
enum kvt_proto_stat {
  KVT_STAT_CAPACITY,       /* bytes the server may hold (its bottom tier) */
  KVT_STAT_USED,           /* bytes held, record headers and tier overhead included */
  KVT_STAT_ITEMS,          /* values held */
  KVT_STAT_TENANT_ITEMS,   /* values held for the asking tenant */
  KVT_STAT_TENANT_BYTES,   /* payload bytes held for the asking tenant */
  KVT_STAT_PUTS,
  KVT_STAT_GETS,
  KVT_STAT_HITS,
  KVT_STAT_MISSES,
  KVT_STAT_DELS,
  KVT_STAT_EXISTS,
  KVT_STAT_ERRORS,         /* requests that failed otherwise */
  KVT_STAT_BYTES_IN,       /* payload bytes stored by PUT */
  KVT_STAT_BYTES_OUT,      /* payload bytes returned by GET */
  KVT_STAT_EVICTIONS,      /* values dropped to make room (--evict lru) */
  KVT_STAT_SESSIONS,       /* sessions open now */
  KVT_STAT_AUTH_REFUSED,   /* HELLOs refused: unknown tenant or wrong token */
  KVT_STAT_TOO_BIG,        /* requests refused for --max-request */
  KVT_STAT_DEFERRED,       /* requests that waited for --max-inflight */
  KVT_STAT_DRAM_USED,      /* bytes held in the DRAM tier (0 without one) */
  KVT_STAT_DRAM_CAPACITY,
  KVT_STAT_UPTIME_S,
  KVT_STAT_COUNT
};

/* Names of the counters ("capacity_bytes", ...), for Prometheus output. */
const char *kvt_proto_stat_name(int i);

typedef struct kvt_proto_hdr {
  uint32_t magic;
  uint16_t version;
  uint16_t opcode;
  int32_t status;
  uint32_t body;
  uint64_t req_id;
  uint64_t session;
} kvt_proto_hdr;

typedef struct kvt_proto_list_entry {
  kvt_key key;
  uint64_t len;
} kvt_proto_list_entry;

/* A decoded message. Only the member of the opcode is meaningful. Pointers
 * (hello.addr, list_reply.raw) point into the buffer that was decoded. */
typedef struct kvt_proto_msg {
  kvt_proto_hdr h;
  union {
    struct {
      const uint8_t *addr;
      uint16_t addr_len;
      char tenant[KVT_PROTO_TENANT_MAX + 1];
      char token[KVT_PROTO_TOKEN_MAX + 1];
    } hello;
    struct {
      uint64_t max_request, max_inflight;
      uint32_t msg_max, list_max;
    } hello_reply;
    struct {
      kvt_key key;
      uint64_t len; /* PUT: the value's length; GET: capacity of the client's buffer */
      uint64_t rma_addr, rma_key;
    } data;
    struct {
      kvt_key key;
    } key;
    struct {
      uint64_t len;
    } len;
    struct {
      uint32_t n;
      uint64_t v[KVT_STAT_COUNT]; /* fields the peer did not send are 0 */
    } stats;
    struct {
      uint64_t cursor;
      uint32_t max;
    } list;
    struct {
      uint64_t next;
      uint32_t n;
      const uint8_t *raw; /* decode: n entries, read with kvt_proto_list_entry_at() */
      const kvt_proto_list_entry *entries; /* encode: n entries */
    } list_reply;
  } u;
} kvt_proto_msg;

/* Fills m's header for a request (or a reply to req when req is not NULL:
 * same req_id and session, opcode | KVT_PROTO_REPLY). The body is zeroed. */
void kvt_proto_init(kvt_proto_msg *m, uint16_t opcode, uint64_t req_id, uint64_t session);
void kvt_proto_init_reply(kvt_proto_msg *m, const kvt_proto_msg *req, int32_t status);

/* Encodes m into buf[0..cap) and writes its size to *len (h.body is
 * computed). Returns 0, -EINVAL (an opcode without an encoder, a field too
 * long: tenant, token, address, too many list entries) or KVT_ENOBUFS. */
int kvt_proto_encode(const kvt_proto_msg *m, void *buf, size_t cap, size_t *len);

/* Decodes len bytes into *m. Returns 0; KVT_EPROTO for a bad magic, a
 * truncated header or body, a body length that does not match the header
 * or the opcode's layout, an unknown opcode, strings that are too long or
 * contain bytes outside [A-Za-z0-9._-] (tenant) or NUL (token); KVT_EVERSION
 * for another protocol version. Never reads outside buf[0..len). */
int kvt_proto_decode(const void *buf, size_t len, kvt_proto_msg *m);

/* Entry i of a decoded LIST reply. */
void kvt_proto_list_entry_at(const kvt_proto_msg *m, uint32_t i, kvt_proto_list_entry *out);

/* Whether name is a valid tenant name (1..64 bytes of [A-Za-z0-9._-]). */
int kvt_proto_tenant_valid(const char *name);

#endif
