/* transport/proto.c - encoder and validating decoder of the kvtier-server
 * control protocol (kvt_proto.h). The decoder treats every byte as hostile:
 * each length is checked against what is left before it is used, and a body
 * must be exactly the size its opcode says. No allocation. */
#include <errno.h>
#include <string.h>

#include "kvt_internal.h"
#include "kvt_proto.h"
#include "kvtier/error.h"

static const char *const stat_names[KVT_STAT_COUNT] = {
    "capacity_bytes",  "used_bytes",      "items",          "tenant_items",
    "tenant_bytes",    "puts_total",      "gets_total",     "hits_total",
    "misses_total",    "dels_total",      "exists_total",   "errors_total",
    "bytes_in_total",  "bytes_out_total", "evictions_total", "sessions",
    "auth_refused_total", "too_big_total", "deferred_total", "dram_used_bytes",
    "dram_capacity_bytes", "uptime_seconds",
};

const char *kvt_proto_stat_name(int i) {
  return i >= 0 && i < KVT_STAT_COUNT ? stat_names[i] : "unknown";
}

void kvt_proto_init(kvt_proto_msg *m, uint16_t opcode, uint64_t req_id, uint64_t session) {
  memset(m, 0, sizeof(*m));
  m->h.magic = KVT_PROTO_MAGIC;
  m->h.version = KVT_PROTO_VERSION;
  m->h.opcode = opcode;
  m->h.req_id = req_id;
  m->h.session = session;
}

void kvt_proto_init_reply(kvt_proto_msg *m, const kvt_proto_msg *req, int32_t status) {
  kvt_proto_init(m, (uint16_t)(req->h.opcode | KVT_PROTO_REPLY), req->h.req_id, req->h.session);
  m->h.status = status;
}

int kvt_proto_tenant_valid(const char *name) {
  const size_t n = name ? strlen(name) : 0;
  if (n == 0 || n > KVT_PROTO_TENANT_MAX)
    return 0;
  for (size_t i = 0; i < n; i++) {
    const char c = name[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
          c == '.' || c == '_' || c == '-'))
      return 0;
  }
  return 1;
}

/* ---- encoding ---- */

typedef struct wbuf {
  uint8_t *p;
  size_t cap, len;
  int overflow;
} wbuf;

static void put_bytes(wbuf *w, const void *src, size_t n) {
  if (w->overflow || n > w->cap - w->len) {
    w->overflow = 1;
    return;
  }
  if (n)
    memcpy(w->p + w->len, src, n);
  w->len += n;
}
static void put8(wbuf *w, uint8_t v) { put_bytes(w, &v, 1); }
static void put16(wbuf *w, uint16_t v) {
  uint8_t b[2];
  kvt_st16(b, v);
  put_bytes(w, b, 2);
}
static void put32(wbuf *w, uint32_t v) {
  uint8_t b[4];
  kvt_st32(b, v);
  put_bytes(w, b, 4);
}
static void put64(wbuf *w, uint64_t v) {
  uint8_t b[8];
  kvt_st64(b, v);
  put_bytes(w, b, 8);
}

static int encode_body(const kvt_proto_msg *m, wbuf *w) {
  const int reply = (m->h.opcode & KVT_PROTO_REPLY) != 0;
  switch (m->h.opcode & ~KVT_PROTO_REPLY) {
  case KVT_PROTO_HELLO:
    if (reply) {
      put64(w, m->u.hello_reply.max_request);
      put64(w, m->u.hello_reply.max_inflight);
      put32(w, m->u.hello_reply.msg_max);
      put32(w, m->u.hello_reply.list_max);
      return 0;
    } else {
      const size_t tl = strlen(m->u.hello.tenant), kl = strlen(m->u.hello.token);
      if (m->u.hello.addr_len > KVT_PROTO_ADDR_MAX || tl > KVT_PROTO_TENANT_MAX ||
          kl > KVT_PROTO_TOKEN_MAX || (m->u.hello.addr_len && !m->u.hello.addr))
        return -EINVAL;
      put16(w, m->u.hello.addr_len);
      put_bytes(w, m->u.hello.addr, m->u.hello.addr_len);
      put8(w, (uint8_t)tl);
      put_bytes(w, m->u.hello.tenant, tl);
      put8(w, (uint8_t)kl);
      put_bytes(w, m->u.hello.token, kl);
      return 0;
    }
  case KVT_PROTO_PUT:
  case KVT_PROTO_GET:
    if (reply) {
      if ((m->h.opcode & ~KVT_PROTO_REPLY) == KVT_PROTO_GET)
        put64(w, m->u.len.len);
      return 0;
    }
    put_bytes(w, m->u.data.key.bytes, 16);
    put64(w, m->u.data.len);
    put64(w, m->u.data.rma_addr);
    put64(w, m->u.data.rma_key);
    return 0;
  case KVT_PROTO_EXISTS:
  case KVT_PROTO_DEL:
    if (reply) {
      if ((m->h.opcode & ~KVT_PROTO_REPLY) == KVT_PROTO_EXISTS)
        put64(w, m->u.len.len);
      return 0;
    }
    put_bytes(w, m->u.key.key.bytes, 16);
    return 0;
  case KVT_PROTO_STATS:
    if (reply) {
      const uint32_t n = m->u.stats.n > KVT_STAT_COUNT ? KVT_STAT_COUNT : m->u.stats.n;
      put32(w, n);
      for (uint32_t i = 0; i < n; i++)
        put64(w, m->u.stats.v[i]);
    }
    return 0;
  case KVT_PROTO_LIST:
    if (reply) {
      if (m->u.list_reply.n > KVT_PROTO_LIST_MAX || (m->u.list_reply.n && !m->u.list_reply.entries))
        return -EINVAL;
      put64(w, m->u.list_reply.next);
      put32(w, m->u.list_reply.n);
      for (uint32_t i = 0; i < m->u.list_reply.n; i++) {
        put_bytes(w, m->u.list_reply.entries[i].key.bytes, 16);
        put64(w, m->u.list_reply.entries[i].len);
      }
      return 0;
    }
    put64(w, m->u.list.cursor);
    put32(w, m->u.list.max);
    return 0;
  case KVT_PROTO_BYE:
    return reply ? -EINVAL : 0;
  default:
    return -EINVAL;
  }
}

int kvt_proto_encode(const kvt_proto_msg *m, void *buf, size_t cap, size_t *len) {
  if (!m || !buf || !len)
    return -EINVAL;
  wbuf w = {buf, cap, KVT_PROTO_HDR, cap < KVT_PROTO_HDR};
  if (w.overflow)
    return KVT_ENOBUFS;
  const int rc = encode_body(m, &w);
  if (rc)
    return rc;
  if (w.overflow)
    return KVT_ENOBUFS;
  uint8_t *p = buf;
  kvt_st32(p, KVT_PROTO_MAGIC);
  kvt_st16(p + 4, (uint16_t)KVT_PROTO_VERSION);
  kvt_st16(p + 6, m->h.opcode);
  kvt_st32(p + 8, (uint32_t)m->h.status);
  kvt_st32(p + 12, (uint32_t)(w.len - KVT_PROTO_HDR));
  kvt_st64(p + 16, m->h.req_id);
  kvt_st64(p + 24, m->h.session);
  *len = w.len;
  return 0;
}

/* ---- decoding ---- */

typedef struct rbuf {
  const uint8_t *p;
  size_t len, off;
  int bad;
} rbuf;

static const uint8_t *take(rbuf *r, size_t n) {
  if (r->bad || n > r->len - r->off) {
    r->bad = 1;
    return NULL;
  }
  const uint8_t *at = r->p + r->off;
  r->off += n;
  return at;
}
static uint8_t get8(rbuf *r) {
  const uint8_t *b = take(r, 1);
  return b ? b[0] : 0;
}
static uint16_t get16(rbuf *r) {
  const uint8_t *b = take(r, 2);
  return b ? kvt_ld16(b) : 0;
}
static uint32_t get32(rbuf *r) {
  const uint8_t *b = take(r, 4);
  return b ? kvt_ld32(b) : 0;
}
static uint64_t get64(rbuf *r) {
  const uint8_t *b = take(r, 8);
  return b ? kvt_ld64(b) : 0;
}
static void get_key(rbuf *r, kvt_key *k) {
  const uint8_t *b = take(r, 16);
  if (b)
    memcpy(k->bytes, b, 16);
}

/* A length-prefixed (u8) string into dst (cap max + 1); tenant names are
 * checked for their alphabet, tokens for NUL bytes. */
static void get_str(rbuf *r, char *dst, size_t max, int tenant) {
  const uint8_t n = get8(r);
  const uint8_t *b = n ? take(r, n) : NULL;
  if (r->bad || n > max) {
    r->bad = 1;
    return;
  }
  if (n)
    memcpy(dst, b, n);
  dst[n] = '\0';
  if (memchr(dst, '\0', n) || (tenant && n && !kvt_proto_tenant_valid(dst)))
    r->bad = 1;
}

static void decode_hello(rbuf *r, kvt_proto_msg *m) {
  m->u.hello.addr_len = get16(r);
  if (m->u.hello.addr_len > KVT_PROTO_ADDR_MAX) {
    r->bad = 1;
    return;
  }
  m->u.hello.addr = take(r, m->u.hello.addr_len);
  get_str(r, m->u.hello.tenant, KVT_PROTO_TENANT_MAX, 1);
  get_str(r, m->u.hello.token, KVT_PROTO_TOKEN_MAX, 0);
}

static void decode_body(rbuf *r, kvt_proto_msg *m) {
  const int reply = (m->h.opcode & KVT_PROTO_REPLY) != 0;
  const uint16_t op = m->h.opcode & ~KVT_PROTO_REPLY;
  switch (op) {
  case KVT_PROTO_HELLO:
    if (!reply) {
      decode_hello(r, m);
    } else if (m->h.body) { /* a refusal carries no body */
      m->u.hello_reply.max_request = get64(r);
      m->u.hello_reply.max_inflight = get64(r);
      m->u.hello_reply.msg_max = get32(r);
      m->u.hello_reply.list_max = get32(r);
    }
    break;
  case KVT_PROTO_PUT:
  case KVT_PROTO_GET:
    if (reply) {
      if (op == KVT_PROTO_GET)
        m->u.len.len = get64(r);
      break;
    }
    get_key(r, &m->u.data.key);
    m->u.data.len = get64(r);
    m->u.data.rma_addr = get64(r);
    m->u.data.rma_key = get64(r);
    break;
  case KVT_PROTO_EXISTS:
  case KVT_PROTO_DEL:
    if (reply) {
      if (op == KVT_PROTO_EXISTS)
        m->u.len.len = get64(r);
    } else {
      get_key(r, &m->u.key.key);
    }
    break;
  case KVT_PROTO_STATS:
    if (reply && m->h.body) {
      const uint32_t n = get32(r);
      if ((uint64_t)n * 8 != (uint64_t)(r->len - r->off)) {
        r->bad = 1;
        break;
      }
      m->u.stats.n = n < KVT_STAT_COUNT ? n : KVT_STAT_COUNT;
      for (uint32_t i = 0; i < n; i++) {
        const uint64_t v = get64(r);
        if (i < KVT_STAT_COUNT)
          m->u.stats.v[i] = v;
      }
    }
    break;
  case KVT_PROTO_LIST:
    if (reply && m->h.body) {
      m->u.list_reply.next = get64(r);
      m->u.list_reply.n = get32(r);
      if (m->u.list_reply.n > KVT_PROTO_LIST_MAX) {
        r->bad = 1;
        break;
      }
      m->u.list_reply.raw = take(r, (size_t)m->u.list_reply.n * KVT_PROTO_LIST_ENTRY);
    } else if (!reply) {
      m->u.list.cursor = get64(r);
      m->u.list.max = get32(r);
    }
    break;
  case KVT_PROTO_BYE:
    if (reply)
      r->bad = 1;
    break;
  default:
    r->bad = 1;
  }
}

int kvt_proto_decode(const void *buf, size_t len, kvt_proto_msg *m) {
  if (!buf || !m)
    return -EINVAL;
  memset(m, 0, sizeof(*m));
  if (len < KVT_PROTO_HDR || len > KVT_PROTO_MSG_MAX)
    return KVT_EPROTO;
  const uint8_t *p = buf;
  m->h.magic = kvt_ld32(p);
  m->h.version = kvt_ld16(p + 4);
  m->h.opcode = kvt_ld16(p + 6);
  m->h.status = (int32_t)kvt_ld32(p + 8);
  m->h.body = kvt_ld32(p + 12);
  m->h.req_id = kvt_ld64(p + 16);
  m->h.session = kvt_ld64(p + 24);
  if (m->h.magic != KVT_PROTO_MAGIC)
    return KVT_EPROTO;
  if (m->h.version != KVT_PROTO_VERSION)
    return KVT_EVERSION;
  if ((uint64_t)m->h.body != (uint64_t)(len - KVT_PROTO_HDR))
    return KVT_EPROTO;
  rbuf r = {p, len, KVT_PROTO_HDR, 0};
  decode_body(&r, m);
  if (r.bad || r.off != r.len) /* short, or trailing bytes */
    return KVT_EPROTO;
  return 0;
}

void kvt_proto_list_entry_at(const kvt_proto_msg *m, uint32_t i, kvt_proto_list_entry *out) {
  const uint8_t *e = m->u.list_reply.raw + (size_t)i * KVT_PROTO_LIST_ENTRY;
  memcpy(out->key.bytes, e, 16);
  out->len = kvt_ld64(e + 16);
}
