/* tests/campaign/campaign_hostile.c - hostile clients of kvtier-server, each
 * step in a child of its own while a well-behaved client keeps working (the
 * parent watches it): garbage and half-open TCP connections to the
 * provider's port, wrong tokens, and a hostile libfabric client built on
 * transport/ that forges HELLO addresses and session ids, names other
 * tenants' keys, hands the server out-of-range and foreign RMA descriptors,
 * aims RMA at the server itself, and starts transfers it never completes. */
#include <errno.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "campaign.h"

#ifdef KVT_HAVE_FABRIC
#include "kvt_proto.h"
#include "kvt_transport.h"

#define MSG KVT_PROTO_MSG_MAX
#define RQ 32

static int srv_port(void) { return __atomic_load_n(&ck->srv_port, __ATOMIC_SEQ_CST); }

/* ---- a raw endpoint: messages by hand ---- */

typedef struct raw {
  kvt_fab *f;
  uint64_t to;
  uint8_t *buf; /* send half, then receive half; registered */
  kvt_fab_mr mr;
  kvt_fab_ctx rctx, sctx;
  kvt_proto_hdr rq[RQ]; /* replies received and not yet taken */
  uint64_t rq_len[RQ];  /* their u.len.len (GET, EXISTS) */
  int nrq, sent_done, sent_err;
  uint64_t next_id;
} raw;

static void raw_post_recv(raw *r) {
  for (int i = 0; i < 100; i++) {
    if (kvt_fab_recv(r->f, r->buf + MSG, MSG, r->mr.desc, &r->rctx) != -EAGAIN)
      return;
    kvt_fab_progress(r->f);
  }
}

static int raw_open(raw *r) {
  memset(r, 0, sizeof(*r));
  char err[256], port[16];
  snprintf(port, sizeof(port), "%d", srv_port());
  kvt_fab_config fc = {.provider = KVT_FAB_DEFAULT_PROVIDER,
                       .peer_node = "127.0.0.1",
                       .peer_service = port,
                       .no_post_wait = 1};
  int rc = kvt_fab_open(&fc, &r->f, err, sizeof(err));
  if (rc == 0)
    rc = kvt_fab_av_insert_host(r->f, "127.0.0.1", port, &r->to);
  r->buf = rc == 0 ? aligned_alloc(4096, 2 * MSG) : NULL;
  if (rc == 0 && !r->buf)
    rc = -ENOMEM;
  if (rc == 0)
    rc = kvt_fab_mr_reg(r->f, r->buf, 2 * MSG, KVT_FAB_LOCAL, &r->mr);
  if (rc) {
    ck_note("hostile: a raw endpoint did not open: %s", err);
    return rc;
  }
  r->next_id = ck_rand() | 1;
  raw_post_recv(r);
  return 0;
}

static void raw_close(raw *r) {
  kvt_fab_mr_dereg(&r->mr);
  kvt_fab_close(r->f);
  free(r->buf);
  memset(r, 0, sizeof(*r));
}

static void raw_take(raw *r, const kvt_fab_comp *c) {
  if (c->ctx == &r->rctx) {
    kvt_proto_msg m;
    if (c->err == 0 && kvt_proto_decode(r->buf + MSG, c->len, &m) == 0 && r->nrq < RQ) {
      r->rq[r->nrq] = m.h;
      r->rq_len[r->nrq++] = m.u.len.len;
    }
    if (c->err != -ECANCELED)
      raw_post_recv(r);
  } else if (c->ctx == &r->sctx) {
    r->sent_done = 1;
    r->sent_err = c->err;
  }
}

static void raw_drive(raw *r, int ms) {
  const int64_t end = ck_now_ms() + ms;
  do {
    kvt_fab_comp c[16];
    const int n = kvt_fab_poll(r->f, c, 16);
    for (int i = 0; i < n; i++)
      raw_take(r, &c[i]);
    if (n <= 0)
      kvt_fab_wait(r->f, -1, 1);
  } while (ck_now_ms() < end);
}

/* Sends m and drives r until the send completed; 0 or an error. */
static int raw_send(raw *r, const kvt_proto_msg *m) {
  size_t len = 0;
  int rc = kvt_proto_encode(m, r->buf, MSG, &len);
  if (rc)
    return rc;
  r->sent_done = 0;
  const int64_t end = ck_now_ms() + 3000;
  rc = -EAGAIN;
  while (rc == -EAGAIN && ck_now_ms() < end) {
    rc = kvt_fab_send(r->f, r->to, r->buf, len, r->mr.desc, &r->sctx);
    if (rc == -EAGAIN)
      raw_drive(r, 1);
  }
  while (rc == 0 && !r->sent_done && ck_now_ms() < end) {
    kvt_fab_comp c[16];
    const int n = kvt_fab_poll(r->f, c, 16);
    for (int i = 0; i < n; i++)
      raw_take(r, &c[i]);
    if (n <= 0)
      kvt_fab_wait(r->f, -1, 1);
  }
  return rc ? rc : r->sent_done ? r->sent_err : -ETIMEDOUT;
}

/* The reply to request id: 1 (its header in *h, its length field in *len)
 * or 0 when none came within timeout_ms. */
static int raw_reply(raw *r, uint64_t id, kvt_proto_hdr *h, uint64_t *len, int timeout_ms) {
  const int64_t end = ck_now_ms() + timeout_ms;
  for (;;) {
    for (int i = 0; i < r->nrq; i++)
      if (r->rq[i].req_id == id) {
        *h = r->rq[i];
        if (len)
          *len = r->rq_len[i];
        r->rq[i] = r->rq[--r->nrq];
        r->rq_len[i] = r->rq_len[r->nrq];
        return 1;
      }
    if (ck_now_ms() > end)
      return 0;
    raw_drive(r, 2);
  }
}

/* A HELLO from r naming addr (NULL: r's own address); the session, or 0
 * (a refusal's status in *status, -ETIMEDOUT when no reply came to r). */
static uint64_t raw_hello(raw *r, const char *tenant, const char *token, const uint8_t *addr,
                          size_t alen, int wait_ms, int *status) {
  uint8_t own[KVT_PROTO_ADDR_MAX];
  size_t olen = sizeof(own);
  if (!addr) {
    if (kvt_fab_getname(r->f, own, &olen) != 0)
      return 0;
    addr = own;
    alen = olen;
  }
  kvt_proto_msg m;
  const uint64_t id = r->next_id++;
  kvt_proto_init(&m, KVT_PROTO_HELLO, id, 0);
  m.u.hello.addr = addr;
  m.u.hello.addr_len = (uint16_t)alen;
  snprintf(m.u.hello.tenant, sizeof(m.u.hello.tenant), "%s", tenant);
  snprintf(m.u.hello.token, sizeof(m.u.hello.token), "%s", token);
  int rc = raw_send(r, &m);
  kvt_proto_hdr h;
  if (rc == 0 && wait_ms > 0)
    rc = raw_reply(r, id, &h, NULL, wait_ms) ? h.status : -ETIMEDOUT;
  if (status)
    *status = rc;
  return rc == 0 && wait_ms > 0 ? h.session : 0;
}

/* A data request (PUT or GET) naming a region; its reply's status, or
 * -ETIMEDOUT. */
static int raw_data(raw *r, uint64_t session, int op, const kvt_key *k, uint64_t len, uint64_t addr,
                    uint64_t key, uint64_t *out_len, int wait_ms) {
  kvt_proto_msg m;
  const uint64_t id = r->next_id++;
  kvt_proto_init(&m, (uint16_t)op, id, session);
  m.u.data.key = *k;
  m.u.data.len = len;
  m.u.data.rma_addr = addr;
  m.u.data.rma_key = key;
  int rc = raw_send(r, &m);
  kvt_proto_hdr h;
  if (rc == 0 && wait_ms > 0)
    rc = raw_reply(r, id, &h, out_len, wait_ms) ? h.status : -ETIMEDOUT;
  return rc;
}

static kvt_key mallory_key(uint32_t i) { return ck_key_of(CK_FABRIC, 3, CK_KEYS - 1 - i); }

/* ---- TCP ---- */

static int tcp_connect(void) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)srv_port())};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const struct timeval tv = {2, 0};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0)
    return fd;
  if (fd >= 0)
    close(fd);
  return -1;
}

static void tcp_garbage(int n) {
  static uint8_t junk[4096];
  int refused = 0;
  for (int i = 0; i < n; i++) {
    const int fd = tcp_connect();
    if (fd < 0) {
      refused++;
      continue;
    }
    const size_t len = 1 + (size_t)ck_rand_below(sizeof(junk));
    for (size_t j = 0; j < len; j++)
      junk[j] = (uint8_t)ck_rand();
    if (i % 4 == 0) /* something shaped like our protocol, over the wrong framing */
      memcpy(junk, "KVTF\x01\x00\x01\x00", 8);
    ssize_t w = send(fd, junk, len, MSG_NOSIGNAL);
    (void)w;
    if (i % 3 == 0) { /* reset, not a clean close */
      const struct linger l = {1, 0};
      setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
    }
    close(fd);
    CK_ADD(hostile[H_TCP_GARBAGE], 1);
  }
  if (refused)
    ck_note("hostile: %d of %d garbage connections were refused", refused, n);
}

static void tcp_half_open(int n, int hold_ms) {
  int fds[256], k = 0;
  for (int i = 0; i < n && i < 256; i++) {
    const int fd = tcp_connect();
    if (fd < 0)
      continue;
    if (i % 2) { /* half of a message, then silence */
      uint8_t part[40];
      for (size_t j = 0; j < sizeof(part); j++)
        part[j] = (uint8_t)ck_rand();
      ssize_t w = send(fd, part, 1 + (size_t)ck_rand_below(sizeof(part)), MSG_NOSIGNAL);
      (void)w;
    }
    fds[k++] = fd;
    CK_ADD(hostile[H_TCP_HALF_OPEN], 1);
  }
  ck_sleep_ms(hold_ms);
  for (int i = 0; i < k; i++)
    close(fds[i]);
}

/* ---- tokens ---- */

static void wrong_tokens(int rounds) {
  char spec[600], longer[200];
  snprintf(longer, sizeof(longer), "%sx", ck_token[0]);
  const char *tries[][2] = {{"alice", "not-the-token"},
                            {"alice", ""},
                            {"alice", ck_token[1]},
                            {"alice", longer},
                            {"nobody", "x"},
                            {"bob", ck_token[0]},
                            {"alice", "alice-token-7f3a9"}};
  const int n = (int)(sizeof(tries) / sizeof(tries[0]));
  for (int r = 0; r < rounds; r++)
    for (int i = 0; i < n; i++) {
      kvt_ctx *ctx = NULL;
      kvt_tier *t = NULL;
      if (kvt_ctx_create(NULL, &ctx) != 0)
        continue;
      snprintf(spec, sizeof(spec), "fabric://127.0.0.1:%d?tenant=%s&token=%s&timeout_ms=3000",
               srv_port(), tries[i][0], tries[i][1]);
      const int rc = kvt_tier_open(ctx, spec, &t);
      CK_ADD(hostile[H_WRONG_TOKEN], 1);
      ck_check_result("a wrong or empty token is refused with KVT_EAUTH", rc == KVT_EAUTH,
                      "tenant %s token \"%s\": %s", tries[i][0], tries[i][1], kvt_err_name(rc));
      kvt_tier_close(t);
      kvt_ctx_destroy(ctx);
    }
}

/* ---- forged HELLO addresses ---- */

static int closed_port(void) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t l = sizeof(a);
  int port = 1;
  if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
      getsockname(fd, (struct sockaddr *)&a, &l) == 0)
    port = ntohs(a.sin_port);
  if (fd >= 0)
    close(fd);
  return port;
}

static void forged_addresses(int rounds) {
  raw r;
  if (raw_open(&r) != 0)
    return;
  const size_t alen = kvt_fab_addr_len(r.f);
  uint8_t a[KVT_PROTO_ADDR_MAX];
  for (int round = 0; round < rounds; round++)
    for (int v = 0; v < 8; v++) {
      memset(a, 0, sizeof(a));
      size_t len = alen;
      struct sockaddr_in *in = (struct sockaddr_in *)a;
      struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)a;
      switch (v) {
      case 0:
        len = 0;
        break;
      case 1:
        len = 1;
        break;
      case 2:
        for (size_t i = 0; i < alen; i++)
          a[i] = (uint8_t)ck_rand();
        break;
      case 3: /* nobody listens there */
        in->sin_family = AF_INET;
        in->sin_port = htons((uint16_t)closed_port());
        in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        break;
      case 4: /* the server itself: its replies go to its own endpoint */
        in->sin_family = AF_INET;
        in->sin_port = htons((uint16_t)srv_port());
        in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        break;
      case 5:
        if (alen < sizeof(*in6))
          continue;
        in6->sin6_family = AF_INET6;
        in6->sin6_port = htons((uint16_t)closed_port());
        in6->sin6_addr = in6addr_loopback;
        break;
      case 6:
        a[0] = 0xFF, a[1] = 0xFF;
        break;
      default: /* longer than the provider's addresses */
        len = KVT_PROTO_ADDR_MAX;
        for (size_t i = 0; i < len; i++)
          a[i] = (uint8_t)ck_rand();
      }
      const int ok = round % 2 == 0;
      raw_hello(&r, "mallory", ok ? ck_token[3] : "wrong", a, len, 0, NULL);
      CK_ADD(hostile[H_FORGED_ADDR], 1);
    }
  raw_drive(&r, 200);
  int st = 0;
  const uint64_t s = raw_hello(&r, "mallory", ck_token[3], NULL, 0, 8000, &st);
  ck_check_result("the server answers a HELLO after forged HELLO addresses", s != 0, "HELLO: %s",
                  kvt_err_name(st));
  raw_close(&r);
}

/* ---- forged session ids ---- */

static void forged_sessions(int n) {
  raw r;
  if (raw_open(&r) != 0)
    return;
  int st = 0;
  const uint64_t s = raw_hello(&r, "mallory", ck_token[3], NULL, 0, 8000, &st);
  if (!s) {
    ck_check_result("the server answers a HELLO after forged HELLO addresses", 0,
                    "mallory's HELLO: %s", kvt_err_name(st));
    raw_close(&r);
    return;
  }
  static const int ops[] = {KVT_PROTO_DEL,    KVT_PROTO_GET,  KVT_PROTO_PUT,
                            KVT_PROTO_EXISTS, KVT_PROTO_LIST, KVT_PROTO_BYE};
  for (int i = 0; i < n; i++) {
    uint64_t forged;
    const uint64_t pick = ck_rand_below(3);
    if (pick == 0)
      forged = s ^ (1ull << (10 + ck_rand_below(54))); /* a neighbour of a real id */
    else if (pick == 1)
      forged = ck_rand_below(1024); /* slot bits only */
    else
      forged = ck_rand();
    if (forged == s)
      continue;
    const int op = ops[ck_rand_below(sizeof(ops) / sizeof(ops[0]))];
    kvt_proto_msg m;
    kvt_proto_init(&m, (uint16_t)op, r.next_id++, forged);
    /* The well-behaved tenants' keys: a forged session must not reach them. */
    const kvt_key k =
        ck_key_of(CK_FABRIC, (int)(ck_rand_below(2) * 2), (uint32_t)ck_rand_below(ck->nkeys));
    if (op == KVT_PROTO_DEL || op == KVT_PROTO_EXISTS) {
      m.u.key.key = k;
    } else if (op == KVT_PROTO_LIST) {
      m.u.list.max = 100;
    } else if (op != KVT_PROTO_BYE) {
      m.u.data.key = k;
      m.u.data.len = 4096;
      m.u.data.rma_addr = 0x10000;
      m.u.data.rma_key = ck_rand_below(8);
    }
    raw_send(&r, &m);
    CK_ADD(hostile[H_FORGED_SESSION], 1);
  }
  raw_drive(&r, 200);
  /* Mallory's own session still works. */
  const kvt_key k = mallory_key(0);
  kvt_proto_msg m;
  const uint64_t id = r.next_id++;
  kvt_proto_init(&m, KVT_PROTO_EXISTS, id, s);
  m.u.key.key = k;
  kvt_proto_hdr h;
  const int got = raw_send(&r, &m) == 0 && raw_reply(&r, id, &h, NULL, 8000);
  ck_check_result("forged session ids leave the real session working", got,
                  "an EXISTS on the real session got no reply");
  raw_close(&r);
}

/* ---- tenants naming each other's keys ---- */

static kvt_tier *tier_as(kvt_ctx *ctx, int slot, int *rc) {
  char spec[600];
  snprintf(spec, sizeof(spec), "fabric://127.0.0.1:%d?tenant=%s&token=%s&timeout_ms=3000",
           srv_port(), ck_tenant[slot], ck_token[slot]);
  kvt_tier *t = NULL;
  *rc = kvt_tier_open(ctx, spec, &t);
  return *rc ? NULL : t;
}

static void cross_tenant(int n) {
  kvt_ctx *ctx = NULL;
  int rc = kvt_ctx_create(NULL, &ctx);
  kvt_tier *t = rc == 0 ? tier_as(ctx, 3, &rc) : NULL;
  if (!t) {
    ck_note("hostile: mallory's tier did not open: %s", kvt_err_name(rc));
    kvt_ctx_destroy(ctx);
    return;
  }
  /* Mallory gets, deletes and puts alice's key names: each in its own
   * namespace. A get returns nothing or mallory's own bytes, never
   * alice's; alice's values are checked by alice's writers afterwards. */
  static uint8_t buf[CK_VALUE_MAX + 4096], mine[512];
  memset(mine, 0x6D, sizeof(mine));
  for (int i = 0; i < n; i++) {
    const kvt_key k =
        ck_key_of(CK_FABRIC, (int)(ck_rand_below(2) * 2), (uint32_t)ck_rand_below(ck->nkeys));
    uint64_t len = 0;
    rc = kvt_tier_get(t, &k, buf, sizeof(buf), &len);
    const int own = rc == 0 && len == sizeof(mine) && memcmp(buf, mine, sizeof(mine)) == 0;
    ck_check_result("a tenant never reads another tenant's value", rc == KVT_ENOTFOUND || own,
                    "mallory's get of alice's key: %s (%llu bytes, not mallory's)",
                    kvt_err_name(rc), (unsigned long long)len);
    if (ck_rand_below(2))
      rc = kvt_tier_del(t, &k);
    else
      rc = kvt_tier_put(t, &k, mine, sizeof(mine));
    CK_ADD(hostile[H_CROSS_TENANT], 1);
  }
  kvt_tier_close(t);
  kvt_ctx_destroy(ctx);
}

/* ---- out-of-range and foreign RMA descriptors ---- */

#define REG (64u << 10)
#define GUARD (64u << 10)

typedef struct region {
  uint8_t *mem; /* GUARD | REG | GUARD */
  kvt_fab_mr mr;
} region;

static int region_open(kvt_fab *f, region *g, unsigned access, uint64_t seed) {
  g->mem = aligned_alloc(4096, 2 * GUARD + REG);
  if (!g->mem)
    return -ENOMEM;
  for (size_t i = 0; i < 2 * GUARD + REG; i++)
    g->mem[i] = (uint8_t)ck_mix(seed, i);
  return kvt_fab_mr_reg(f, g->mem + GUARD, REG, access, &g->mr);
}

static int guards_intact(const region *g, uint64_t seed) {
  for (size_t i = 0; i < GUARD; i++)
    if (g->mem[i] != (uint8_t)ck_mix(seed, i) ||
        g->mem[GUARD + REG + i] != (uint8_t)ck_mix(seed, GUARD + REG + i))
      return 0;
  return 1;
}

static void region_close(region *g) {
  kvt_fab_mr_dereg(&g->mr);
  free(g->mem);
}

/* One request with a bad descriptor, from a fresh endpoint with a fresh
 * session (the provider drops a connection whose peer refused an RMA, and
 * the session with it). The endpoint is closed before the caller looks at
 * the value, which revokes its registrations: nothing lands later. Returns
 * the reply's status, or -ETIMEDOUT for none. */
typedef struct bad_desc {
  const char *what;
  int op, kind; /* kind: how the descriptor is wrong (below) */
  uint64_t len;
} bad_desc;

enum { B_LONGER, B_BEFORE, B_PAST, B_WRAP, B_WRONG_KEY, B_LOCAL, B_FOREIGN };

static int bad_request(const kvt_key *k, const bad_desc *b, int wait_ms, int *guards_ok) {
  raw r, other;
  region g, foreign;
  const uint64_t seed = ck_rand(), fseed = ck_rand();
  if (raw_open(&r) != 0)
    return -ENOTCONN;
  if (raw_open(&other) != 0) {
    raw_close(&r);
    return -ENOTCONN;
  }
  int rc = -ENOTCONN, st = 0;
  const uint64_t s = raw_hello(&r, "mallory", ck_token[3], NULL, 0, 8000, &st);
  if (s && region_open(r.f, &g, KVT_FAB_REMOTE_READ | KVT_FAB_REMOTE_WRITE, seed) == 0 &&
      region_open(other.f, &foreign, KVT_FAB_REMOTE_READ | KVT_FAB_REMOTE_WRITE, fseed) == 0) {
    const uint64_t a0 = kvt_fab_mr_addr(&g.mr, g.mem + GUARD, 0);
    uint64_t addr = a0, key = g.mr.key;
    switch (b->kind) {
    case B_BEFORE:
      addr = a0 - 4096;
      break;
    case B_PAST:
      addr = a0 + REG;
      break;
    case B_WRAP:
      addr = UINT64_MAX - 100;
      break;
    case B_WRONG_KEY:
      key ^= 0x5A5A5A5Aull;
      break;
    case B_LOCAL:
      addr = kvt_fab_mr_addr(&r.mr, r.buf, 0), key = r.mr.key;
      break;
    case B_FOREIGN:
      addr = kvt_fab_mr_addr(&foreign.mr, foreign.mem + GUARD, 0), key = foreign.mr.key;
      break;
    default:
      break;
    }
    rc = raw_data(&r, s, b->op, k, b->len, addr, key, NULL, wait_ms);
    raw_drive(&r, 50);
    *guards_ok = guards_intact(&g, seed) && guards_intact(&foreign, fseed);
    region_close(&g);
    region_close(&foreign);
  } else if (!s) {
    ck_note("hostile: the RMA client's HELLO failed: %s", kvt_err_name(st));
  }
  raw_close(&r);
  raw_close(&other);
  return rc;
}

static void bad_rma(void) {
  kvt_ctx *ctx = NULL;
  int rc = kvt_ctx_create(NULL, &ctx);
  kvt_tier *t = rc == 0 ? tier_as(ctx, 3, &rc) : NULL;
  const kvt_key k = mallory_key(1);
  static uint8_t want[4096], got[8192];
  for (size_t i = 0; i < sizeof(want); i++)
    want[i] = (uint8_t)ck_rand();
  if (t)
    rc = kvt_tier_put(t, &k, want, sizeof(want));
  if (rc) {
    ck_note("hostile: mallory's first PUT failed: %s", kvt_err_name(rc));
    kvt_tier_close(t);
    kvt_ctx_destroy(ctx);
    return;
  }
  static const bad_desc bad[] = {
      {"a PUT longer than its region", KVT_PROTO_PUT, B_LONGER, REG + 4096},
      {"a PUT before its region", KVT_PROTO_PUT, B_BEFORE, 4096},
      {"a PUT past its region", KVT_PROTO_PUT, B_PAST, 4096},
      {"a PUT at an address that wraps", KVT_PROTO_PUT, B_WRAP, 4096},
      {"a PUT with a wrong key", KVT_PROTO_PUT, B_WRONG_KEY, 4096},
      {"a PUT naming a local-only region", KVT_PROTO_PUT, B_LOCAL, 4096},
      {"a PUT naming another endpoint's region", KVT_PROTO_PUT, B_FOREIGN, 4096},
      {"a GET past its region", KVT_PROTO_GET, B_PAST, 4096},
      {"a GET with a wrong key", KVT_PROTO_GET, B_WRONG_KEY, 4096},
      {"a GET naming another endpoint's region", KVT_PROTO_GET, B_FOREIGN, 4096},
  };
  /* Most get no reply: the provider drops a connection after a refused RMA. */
  const int wait_ms = ck_opt.mode == CK_LONG ? 1000 : 200;
  int guards = 1;
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    int g = 1;
    if (i && (rc = kvt_tier_put(t, &k, want, sizeof(want))) != 0)
      ck_note("hostile: mallory's PUT failed: %s", kvt_err_name(rc));
    const int status = bad_request(&k, &bad[i], wait_ms, &g);
    guards &= g;
    CK_ADD(hostile[H_BAD_RMA], 1);
    uint64_t len = 0;
    rc = kvt_tier_get(t, &k, got, sizeof(got), &len);
    if (bad[i].kind == B_LOCAL)
      continue; /* tcp;ofi_rxm does not check access flags: the bytes are the client's own */
    const int held = rc == 0 && len == sizeof(want) && memcmp(got, want, sizeof(want)) == 0;
    ck_check_result("RMA outside a client's registered region, or under a foreign key, fails "
                    "and leaves the old value",
                    (status != 0 || bad[i].op == KVT_PROTO_GET) && held,
                    "%s: status %s; the old value %s (get: %s)", bad[i].what, kvt_err_name(status),
                    held ? "is kept" : "is not", kvt_err_name(rc));
  }
  /* A value larger than any limit is refused before any transfer. */
  static const bad_desc huge = {"a PUT of 1 TiB", KVT_PROTO_PUT, B_LONGER, 1ull << 40};
  int g = 1;
  rc = bad_request(&k, &huge, 8000, &g);
  CK_ADD(hostile[H_BAD_RMA], 1);
  ck_check_result("a PUT larger than --max-request is refused with KVT_ETOOBIG", rc == KVT_ETOOBIG,
                  "status %s", kvt_err_name(rc));
  ck_check_result("no RMA of the server lands outside a client's registered region", guards,
                  "bytes around a registered region changed");
  kvt_tier_close(t);
  kvt_ctx_destroy(ctx);
}

/* ---- RMA at the server's own endpoint ---- */

static void direct_rma(int n) {
  for (int i = 0; i < n; i++) {
    raw t;
    if (raw_open(&t) != 0)
      return;
    static uint8_t loot[4096];
    kvt_fab_mr mr;
    if (kvt_fab_mr_reg(t.f, loot, sizeof(loot), KVT_FAB_LOCAL, &mr) != 0) {
      raw_close(&t);
      return;
    }
    const uint64_t key = i < 8 ? (uint64_t)i : ck_rand();
    const uint64_t addr = i % 2 ? 0 : 4096 * ck_rand_below(16);
    const int write = i % 3 == 2;
    kvt_fab_ctx cx = {0};
    int rc = -EAGAIN;
    for (const int64_t end = ck_now_ms() + 3000; rc == -EAGAIN && ck_now_ms() < end;) {
      rc = write ? kvt_fab_write(t.f, t.to, loot, 64, mr.desc, addr, key, &cx)
                 : kvt_fab_read(t.f, t.to, loot, 64, mr.desc, addr, key, &cx);
      if (rc == -EAGAIN)
        kvt_fab_progress(t.f);
    }
    for (const int64_t end = ck_now_ms() + 3000; rc == 0 && ck_now_ms() < end;) {
      kvt_fab_comp c[4];
      const int got = kvt_fab_poll(t.f, c, 4);
      int done = 0;
      for (int j = 0; j < got; j++)
        if (c[j].ctx == &cx)
          rc = c[j].err, done = 1;
      if (done)
        break;
      if (ck_now_ms() + 5 > end)
        rc = -ETIMEDOUT;
      kvt_fab_wait(t.f, -1, 1);
    }
    CK_ADD(hostile[H_DIRECT_RMA], 1);
    ck_check_result("RMA at the server's own endpoint with a guessed key fails", rc != 0 || write,
                    "a read of 64 bytes at %#llx with key %llu succeeded", (unsigned long long)addr,
                    (unsigned long long)key);
    kvt_fab_mr_dereg(&mr);
    raw_close(&t);
  }
}

/* ---- transfers that never complete ---- */

/* a sends; b is the HELLO's address, where the server's RMA goes; b is
 * never driven after the HELLO, so every transfer with it stalls. */
static void stalled(int puts, int gets, int hold_ms) {
  kvt_ctx *ctx = NULL;
  int rc = kvt_ctx_create(NULL, &ctx);
  kvt_tier *t = rc == 0 ? tier_as(ctx, 3, &rc) : NULL;
  const kvt_key y = mallory_key(2);
  static uint8_t val[8192];
  memset(val, 0x59, sizeof(val));
  if (t)
    rc = kvt_tier_put(t, &y, val, sizeof(val)); /* for the stalled GETs */
  kvt_tier_close(t);
  kvt_ctx_destroy(ctx);
  raw a, b;
  if (rc != 0 || raw_open(&a) != 0) {
    ck_note("hostile: the stalled client did not start: %s", kvt_err_name(rc));
    return;
  }
  if (raw_open(&b) != 0) {
    raw_close(&a);
    return;
  }
  uint8_t addr[KVT_PROTO_ADDR_MAX];
  size_t alen = sizeof(addr);
  kvt_fab_getname(b.f, addr, &alen);
  const uint64_t id = a.next_id++;
  kvt_proto_msg m;
  kvt_proto_init(&m, KVT_PROTO_HELLO, id, 0);
  m.u.hello.addr = addr;
  m.u.hello.addr_len = (uint16_t)alen;
  snprintf(m.u.hello.tenant, sizeof(m.u.hello.tenant), "mallory");
  snprintf(m.u.hello.token, sizeof(m.u.hello.token), "%s", ck_token[3]);
  kvt_proto_hdr h;
  const uint64_t s =
      raw_send(&a, &m) == 0 && raw_reply(&b, id, &h, NULL, 8000) && h.status == 0 ? h.session : 0;
  region g;
  if (!s || region_open(b.f, &g, KVT_FAB_REMOTE_READ | KVT_FAB_REMOTE_WRITE, 7) != 0) {
    ck_note("hostile: the stalled client's HELLO failed");
    raw_close(&a);
    raw_close(&b);
    return;
  }
  const uint64_t a0 = kvt_fab_mr_addr(&g.mr, g.mem + GUARD, 0);
  for (int i = 0; i < puts + gets; i++) {
    const kvt_key k = i < puts ? mallory_key(10 + (uint32_t)i) : y;
    raw_data(&a, s, i < puts ? KVT_PROTO_PUT : KVT_PROTO_GET, &k, i < puts ? REG : sizeof(val), a0,
             g.mr.key, NULL, 0);
    CK_ADD(hostile[H_STALLED], 1);
  }
  __atomic_fetch_add(&ck->stalled_ready, 1, __ATOMIC_SEQ_CST);
  ck_sleep_ms(hold_ms); /* b is not driven: the server's transfers wait */
  region_close(&g);
  raw_close(&b);
  raw_close(&a);
}

/* A new client (mallory's fabric tier: a new session) is served within 15 s. */
static void served_again(const char *after) {
  const int64_t end = ck_now_ms() + 15000;
  int rc = -1;
  char what[120];
  snprintf(what, sizeof(what), "a new client is served after %s", after);
  while (rc != 0 && ck_now_ms() < end) {
    kvt_ctx *ctx = NULL;
    rc = kvt_ctx_create(NULL, &ctx);
    kvt_tier *t = rc == 0 ? tier_as(ctx, 3, &rc) : NULL;
    static uint8_t v[4096], got[4096];
    memset(v, 0x4D, sizeof(v));
    const kvt_key k = mallory_key(3);
    uint64_t len = 0;
    if (t && (rc = kvt_tier_put(t, &k, v, sizeof(v))) == 0 &&
        (rc = kvt_tier_get(t, &k, got, sizeof(got), &len)) == 0 &&
        (len != sizeof(v) || memcmp(got, v, sizeof(v)) != 0))
      rc = -EIO;
    kvt_tier_close(t);
    kvt_ctx_destroy(ctx);
    if (rc)
      ck_sleep_ms(200);
  }
  ck_check_result(what, rc == 0, "still failing after 15 s: %s", kvt_err_name(rc));
}

void ck_hostile_main(void *arg) {
  const int step = *(const int *)arg;
  if (step >= CK_HOSTILE_SERVED) {
    served_again(ck_hostile_name[step - CK_HOSTILE_SERVED]);
    return;
  }
  const int big = ck_opt.mode == CK_LONG;
  switch (step) {
  case H_TCP_GARBAGE:
    tcp_garbage(big ? 400 : 60);
    break;
  case H_TCP_HALF_OPEN:
    tcp_half_open(big ? 200 : 48, big ? 4000 : 1500);
    break;
  case H_WRONG_TOKEN:
    wrong_tokens(big ? 4 : 1);
    break;
  case H_FORGED_ADDR:
    forged_addresses(big ? 40 : 6);
    break;
  case H_FORGED_SESSION:
    forged_sessions(big ? 500 : 100);
    break;
  case H_CROSS_TENANT:
    cross_tenant(big ? 200 : 24);
    break;
  case H_BAD_RMA:
    bad_rma();
    break;
  case H_DIRECT_RMA:
    direct_rma(big ? 24 : 10);
    break;
  case H_STALLED:
    stalled(big ? 150 : 80, 8, big ? 6000 : 1500);
    break;
  default: /* H_STALLED_KILLED: killed -9 by the parent while it holds */
    CK_ADD(hostile[H_STALLED_KILLED], 1);
    stalled(big ? 150 : 80, 8, 3600 * 1000);
  }
}

#else
void ck_hostile_main(void *arg) { (void)arg; }
#endif
