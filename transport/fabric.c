/* transport/fabric.c - the libfabric endpoint of kvt_transport.h: provider
 * selection by fi_getinfo hints, fabric/domain/endpoint/CQ/AV setup, memory
 * registration under the provider's MR mode, posting, and completion polling
 * with a wait that also watches an eventfd (so a thread blocked on the CQ
 * wakes when another thread hands it work). libfabric itself is loaded by
 * the first open (fabric_lib.c). */
#include <errno.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_rma.h>

#include "fabric_lib.h"
#include "kvt_transport.h"
#include "kvtier/error.h"

#define FAB_API FI_VERSION(1, 10)
#define STASH 256 /* completions read while a post waited for queue room */

struct kvt_fab {
  const kvt_fi_lib *fi; /* libfabric's functions, loaded by the first open */
  struct fi_info *info;
  struct fid_fabric *fabric;
  struct fid_domain *domain;
  struct fid_ep *ep;
  struct fid_cq *cq;
  struct fid_av *av;
  int wait_fd;      /* the CQ's wait fd, or -1 (then kvt_fab_wait naps) */
  uint64_t mr_mode; /* as the provider returned it */
  atomic_uint_fast64_t next_key; /* keys we choose when the provider does not (no FI_MR_PROV_KEY) */
  char prov[64], fab_name[128];
  char err[256];
  kvt_fab_comp stash[STASH];
  unsigned stash_head, stash_n;
  int post_tries; /* see kvt_fab_config.no_post_wait */
};

static int fab_fail(kvt_fab *f, int rc, const char *what) {
  if (rc > 0)
    rc = -rc;
  snprintf(f->err, sizeof(f->err), "%s: %s", what, f->fi->errstr(-rc));
  return rc == -FI_ENODATA ? -ENODATA : rc;
}

const char *kvt_fab_provider(const kvt_fab *f) { return f->prov; }
const char *kvt_fab_error(const kvt_fab *f) { return f->err; }

uint64_t kvt_fab_max_rma(const kvt_fab *f) {
  const uint64_t m = f->info->ep_attr->max_msg_size;
  return m ? m : (1ull << 30);
}

static struct fi_info *fab_hints(const kvt_fi_lib *fi, const char *provider) {
  struct fi_info *h = fi->dupinfo(NULL); /* fi_allocinfo() */
  if (!h)
    return NULL;
  h->ep_attr->type = FI_EP_RDM;
  h->caps = FI_MSG | FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE | FI_SEND |
            FI_RECV;
  h->mode = FI_CONTEXT | FI_CONTEXT2; /* every operation carries a kvt_fab_ctx */
  h->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
  h->domain_attr->threading = FI_THREAD_SAFE;
  h->domain_attr->control_progress = FI_PROGRESS_UNSPEC;
  h->domain_attr->data_progress = FI_PROGRESS_UNSPEC;
  h->fabric_attr->prov_name = strdup(provider);
  if (!h->fabric_attr->prov_name) {
    fi->freeinfo(h);
    return NULL;
  }
  return h;
}

static int open_cq(kvt_fab *f, uint32_t depth) {
  struct fi_cq_attr a;
  memset(&a, 0, sizeof(a));
  a.size = depth;
  a.format = FI_CQ_FORMAT_MSG;
  a.wait_obj = FI_WAIT_FD;
  int rc = fi_cq_open(f->domain, &a, &f->cq, NULL);
  if (rc == 0 && fi_control(&f->cq->fid, FI_GETWAIT, &f->wait_fd) != 0)
    f->wait_fd = -1;
  if (rc != 0) { /* a provider without wait fds: poll and nap */
    a.wait_obj = FI_WAIT_NONE;
    f->wait_fd = -1;
    rc = fi_cq_open(f->domain, &a, &f->cq, NULL);
  }
  return rc ? fab_fail(f, rc, "fi_cq_open") : 0;
}

static int open_objects(kvt_fab *f, const kvt_fab_config *cfg) {
  int rc = f->fi->fabric(f->info->fabric_attr, &f->fabric, NULL);
  if (rc)
    return fab_fail(f, rc, "fi_fabric");
  rc = fi_domain(f->fabric, f->info, &f->domain, NULL);
  if (rc)
    return fab_fail(f, rc, "fi_domain");
  rc = open_cq(f, cfg->cq_depth ? cfg->cq_depth : 1024);
  if (rc)
    return rc;
  struct fi_av_attr av;
  memset(&av, 0, sizeof(av));
  av.type = f->info->domain_attr->av_type != FI_AV_UNSPEC ? f->info->domain_attr->av_type
                                                           : FI_AV_MAP;
  rc = fi_av_open(f->domain, &av, &f->av, NULL);
  if (rc)
    return fab_fail(f, rc, "fi_av_open");
  rc = fi_endpoint(f->domain, f->info, &f->ep, NULL);
  if (rc)
    return fab_fail(f, rc, "fi_endpoint");
  if ((rc = fi_ep_bind(f->ep, &f->av->fid, 0)) != 0)
    return fab_fail(f, rc, "fi_ep_bind(av)");
  if ((rc = fi_ep_bind(f->ep, &f->cq->fid, FI_TRANSMIT | FI_RECV)) != 0)
    return fab_fail(f, rc, "fi_ep_bind(cq)");
  if ((rc = fi_enable(f->ep)) != 0)
    return fab_fail(f, rc, "fi_enable");
  return 0;
}

static int fab_open_one(const kvt_fab_config *cfg, kvt_fab **out, char *err, size_t err_cap);

/* "auto": the first of these that opens, fastest first. Both sides of a
 * connection must end up on the same provider, so use auto on both. */
static const char *const auto_order[] = {"efa", "verbs;ofi_rxm", "tcp;ofi_rxm"};

int kvt_fab_load(char *err, size_t err_cap) {
  return kvt_fi_lib_get(err, err_cap) ? 0 : KVT_EBACKEND;
}

int kvt_fab_open(const kvt_fab_config *cfg, kvt_fab **out, char *err, size_t err_cap) {
  const int rc0 = kvt_fab_load(err, err_cap);
  if (rc0)
    return rc0;
  if (!cfg->provider || strcmp(cfg->provider, "auto") != 0)
    return fab_open_one(cfg, out, err, err_cap);
  int rc = -ENODATA;
  for (size_t i = 0; i < sizeof(auto_order) / sizeof(auto_order[0]); i++) {
    kvt_fab_config c = *cfg;
    c.provider = auto_order[i];
    if ((rc = fab_open_one(&c, out, err, err_cap)) == 0)
      return 0;
  }
  return rc;
}

static int fab_open_one(const kvt_fab_config *cfg, kvt_fab **out, char *err, size_t err_cap) {
  kvt_fab *f = calloc(1, sizeof(*f));
  if (!f) {
    snprintf(err, err_cap, "out of memory");
    return -ENOMEM;
  }
  f->fi = kvt_fi_lib_get(NULL, 0); /* loaded by kvt_fab_open */
  f->wait_fd = -1;
  f->post_tries = cfg->no_post_wait ? 1 : 20000;
  atomic_init(&f->next_key, 1);
  const char *prov = cfg->provider && *cfg->provider ? cfg->provider : KVT_FAB_DEFAULT_PROVIDER;
  struct fi_info *hints = fab_hints(f->fi, prov);
  int rc = -ENOMEM;
  if (hints) {
    if (cfg->node || cfg->service)
      rc = f->fi->getinfo(FAB_API, cfg->node, cfg->service, FI_SOURCE, hints, &f->info);
    else
      rc = f->fi->getinfo(FAB_API, cfg->peer_node, cfg->peer_service, 0, hints, &f->info);
    f->fi->freeinfo(hints);
    if (rc)
      rc = fab_fail(f, rc, "fi_getinfo");
  }
  if (!rc && f->info) {
    f->mr_mode = f->info->domain_attr->mr_mode;
    snprintf(f->prov, sizeof(f->prov), "%s", f->info->fabric_attr->prov_name);
    snprintf(f->fab_name, sizeof(f->fab_name), "%s", f->info->fabric_attr->name);
    rc = open_objects(f, cfg);
  }
  if (rc) {
    snprintf(err, err_cap, "provider '%s'%s%s%s%s: %s", prov, cfg->node ? " at " : "",
             cfg->node ? cfg->node : "", cfg->service ? ":" : "", cfg->service ? cfg->service : "",
             f->err[0] ? f->err : "failed");
    kvt_fab_close(f);
    return rc;
  }
  *out = f;
  return 0;
}

void kvt_fab_close(kvt_fab *f) {
  if (!f)
    return;
  if (f->ep)
    fi_close(&f->ep->fid);
  if (f->av)
    fi_close(&f->av->fid);
  if (f->cq)
    fi_close(&f->cq->fid);
  if (f->domain)
    fi_close(&f->domain->fid);
  if (f->fabric)
    fi_close(&f->fabric->fid);
  if (f->info)
    f->fi->freeinfo(f->info);
  free(f);
}

int kvt_fab_getname(kvt_fab *f, void *addr, size_t *len) {
  const int rc = fi_getname(&f->ep->fid, addr, len);
  return rc ? fab_fail(f, rc, "fi_getname") : 0;
}

/* Whether a peer's address (as a HELLO names it) is one this provider can
 * use. Socket-address providers (tcp, and rxm over it) are given an
 * unknown address family as it comes, and an endpoint that tried to reach
 * one stopped answering anyone: refused here, before the address vector. */
static int addr_usable(const kvt_fab *f, const void *addr) {
  const uint32_t fmt = f->info->addr_format;
  if (fmt != FI_SOCKADDR && fmt != FI_SOCKADDR_IN && fmt != FI_SOCKADDR_IN6)
    return 1; /* provider formats (verbs, efa) are checked by the provider */
  sa_family_t family;
  memcpy(&family, (const char *)addr + offsetof(struct sockaddr, sa_family), sizeof(family));
  if (family == AF_INET)
    return fmt != FI_SOCKADDR_IN6 && f->info->src_addrlen >= sizeof(struct sockaddr_in);
  if (family == AF_INET6)
    return fmt != FI_SOCKADDR_IN && f->info->src_addrlen >= sizeof(struct sockaddr_in6);
  return 0;
}

int kvt_fab_av_insert(kvt_fab *f, const void *addr, uint64_t *fi_addr) {
  if (!addr_usable(f, addr))
    return fab_fail(f, -FI_EINVAL, "fi_av_insert: not an address of this provider's family");
  fi_addr_t a = FI_ADDR_NOTAVAIL;
  const int n = fi_av_insert(f->av, addr, 1, &a, 0, NULL);
  if (n != 1)
    return fab_fail(f, n < 0 ? n : -FI_EINVAL, "fi_av_insert");
  *fi_addr = a;
  return 0;
}

int kvt_fab_av_insert_host(kvt_fab *f, const char *node, const char *service, uint64_t *fi_addr) {
  fi_addr_t a = FI_ADDR_NOTAVAIL;
  const int n = fi_av_insertsvc(f->av, node, service, &a, 0, NULL);
  if (n != 1)
    return fab_fail(f, n < 0 ? n : -FI_EINVAL, "fi_av_insertsvc");
  *fi_addr = a;
  return 0;
}

void kvt_fab_av_remove(kvt_fab *f, uint64_t fi_addr) {
  fi_addr_t a = fi_addr;
  fi_av_remove(f->av, &a, 1, 0);
}

/* ---- memory registration ---- */

/* A key of ours, for providers that take the registrant's (no
 * FI_MR_PROV_KEY; tcp;ofi_rxm is one, with RMA addresses that are offsets
 * from 0). The key is all that stands between a registered buffer and any
 * peer that can reach this endpoint, so it is random, as wide as the
 * provider's keys go, never a counter a peer could walk. */
static uint64_t mr_key(kvt_fab *f) {
  uint64_t k = 0;
  if (getrandom(&k, sizeof(k), 0) != (ssize_t)sizeof(k)) {
    /* No entropy source: a counter through splitmix64, seeded by time. */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    k = atomic_fetch_add(&f->next_key, 1) + (uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ull;
    k = (k ^ (k >> 30)) * 0xBF58476D1CE4E5B9ull;
    k = (k ^ (k >> 27)) * 0x94D049BB133111EBull;
    k ^= k >> 31;
  }
  const size_t bytes = f->info->domain_attr->mr_key_size;
  if (bytes && bytes < 8)
    k &= (1ull << (8 * bytes)) - 1;
  return k ? k : 1;
}

/* Bytes of this provider's endpoint names (what a peer's HELLO must carry). */
size_t kvt_fab_addr_len(const kvt_fab *f) {
  return f->info->src_addrlen;
}

int kvt_fab_mr_reg(kvt_fab *f, const void *buf, size_t len, unsigned access, kvt_fab_mr *mr) {
  memset(mr, 0, sizeof(*mr));
  if (len == 0)
    return 0;
  uint64_t acc = 0;
  if (access & KVT_FAB_LOCAL)
    acc |= FI_SEND | FI_RECV | FI_READ | FI_WRITE;
  if (access & KVT_FAB_REMOTE_READ)
    acc |= FI_REMOTE_READ;
  if (access & KVT_FAB_REMOTE_WRITE)
    acc |= FI_REMOTE_WRITE;
  struct fid_mr *m = NULL;
  int rc;
  for (int try = 0;; try++) {
    const uint64_t want = (f->mr_mode & FI_MR_PROV_KEY) ? 0 : mr_key(f);
    rc = fi_mr_reg(f->domain, buf, len, acc, 0, want, 0, &m, NULL);
    if ((rc != -FI_ENOKEY && rc != -EEXIST) || (f->mr_mode & FI_MR_PROV_KEY) || try >= 8)
      break; /* a key in use: draw another */
  }
  if (rc)
    return fab_fail(f, rc, "fi_mr_reg");
  mr->fid = m;
  mr->desc = fi_mr_desc(m);
  mr->key = fi_mr_key(m);
  mr->base = (f->mr_mode & FI_MR_VIRT_ADDR) ? (uint64_t)(uintptr_t)buf : 0;
  return 0;
}

void kvt_fab_mr_dereg(kvt_fab_mr *mr) {
  if (mr && mr->fid) {
    fi_close(&((struct fid_mr *)mr->fid)->fid);
    mr->fid = NULL;
    mr->desc = NULL;
  }
}

uint64_t kvt_fab_mr_addr(const kvt_fab_mr *mr, const void *buf, size_t off) {
  (void)buf;
  return mr->base + off; /* base is buf's address or 0, so this is right in both modes */
}

/* ---- completions ---- */

/* Reads one batch from the CQ into out; an error entry becomes a completion
 * with err set. Returns the count, 0 when empty, or -errno. */
static int cq_read(kvt_fab *f, kvt_fab_comp *out, int max) {
  struct fi_cq_msg_entry e[32];
  if (max > 32)
    max = 32;
  const ssize_t n = fi_cq_read(f->cq, e, (size_t)max);
  if (n > 0) {
    for (ssize_t i = 0; i < n; i++) {
      out[i].ctx = e[i].op_context;
      out[i].err = 0;
      out[i].len = e[i].len;
    }
    return (int)n;
  }
  if (n == -FI_EAGAIN)
    return 0;
  if (n == -FI_EAVAIL) {
    struct fi_cq_err_entry ee;
    memset(&ee, 0, sizeof(ee));
    if (fi_cq_readerr(f->cq, &ee, 0) != 1)
      return 0;
    out[0].ctx = ee.op_context;
    out[0].err = ee.err ? -ee.err : -EIO;
    out[0].len = 0;
    snprintf(f->err, sizeof(f->err), "completion error: %s (%s)", f->fi->errstr(ee.err),
             fi_cq_strerror(f->cq, ee.prov_errno, ee.err_data, NULL, 0));
    return 1;
  }
  return fab_fail(f, (int)n, "fi_cq_read");
}

int kvt_fab_poll(kvt_fab *f, kvt_fab_comp *out, int max) {
  int got = 0;
  while (got < max && f->stash_n) {
    out[got++] = f->stash[f->stash_head];
    f->stash_head = (f->stash_head + 1) % STASH;
    f->stash_n--;
  }
  if (got == max)
    return got;
  const int n = cq_read(f, out + got, max - got);
  return n < 0 ? (got ? got : n) : got + n;
}

/* Drives progress while a post waits for room, keeping what completes. */
static void stash_progress(kvt_fab *f) {
  kvt_fab_comp c[32];
  const unsigned room = STASH - f->stash_n;
  if (room == 0)
    return;
  const int n = cq_read(f, c, room < 32 ? (int)room : 32);
  for (int i = 0; i < n; i++) {
    f->stash[(f->stash_head + f->stash_n) % STASH] = c[i];
    f->stash_n++;
  }
}

void kvt_fab_progress(kvt_fab *f) { stash_progress(f); }

int kvt_fab_wait(kvt_fab *f, int wake_fd, int timeout_ms) {
  if (f->stash_n)
    return 0;
  struct pollfd p[2];
  int np = 0;
  if (wake_fd >= 0)
    p[np++] = (struct pollfd){.fd = wake_fd, .events = POLLIN};
  if (f->wait_fd >= 0) {
    struct fid *fids[1] = {&f->cq->fid};
    if (fi_trywait(f->fabric, fids, 1) != FI_SUCCESS)
      return 0; /* something to read (or progress to make) now */
    p[np++] = (struct pollfd){.fd = f->wait_fd, .events = POLLIN};
    return poll(p, (nfds_t)np, timeout_ms) < 0 && errno != EINTR ? -errno : 0;
  }
  /* No wait object: nap briefly, the caller polls again. */
  const int nap = timeout_ms < 0 || timeout_ms > 1 ? 1 : timeout_ms;
  return poll(p, (nfds_t)np, nap) < 0 && errno != EINTR ? -errno : 0;
}

/* ---- posting ---- */

static int64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Retries a post that found the queue full for up to 1 s, driving progress
 * between tries (once only with no_post_wait). The bound is time, not tries:
 * a try can cost far more than the 50 us nap (tcp;ofi_rxm posting to a peer
 * that refuses starts a new connect() each time: 20000 tries took 3.5 s). */
#define POST_RETRY(f, what, call)                                              \
  do {                                                                         \
    ssize_t rc_;                                                               \
    int64_t until_ = 0;                                                        \
    for (int try_ = 0;; try_++) {                                              \
      rc_ = (call);                                                            \
      if (rc_ != -FI_EAGAIN || try_ >= (f)->post_tries)                        \
        break;                                                                 \
      stash_progress(f);                                                       \
      if (try_ > 100) {                                                        \
        const int64_t now_ = mono_ns();                                        \
        if (!until_)                                                           \
          until_ = now_ + 1000000000LL;                                        \
        else if (now_ >= until_)                                               \
          break;                                                               \
        struct timespec ts_ = {0, 50000};                                      \
        nanosleep(&ts_, NULL);                                                 \
      }                                                                        \
    }                                                                          \
    if (rc_ == -FI_EAGAIN)                                                     \
      return -EAGAIN;                                                          \
    return rc_ ? fab_fail(f, (int)rc_, what) : 0;                              \
  } while (0)

int kvt_fab_send(kvt_fab *f, uint64_t dest, const void *buf, size_t len, void *desc,
                 kvt_fab_ctx *ctx) {
  POST_RETRY(f, "fi_send", fi_send(f->ep, buf, len, desc, dest, ctx));
}

int kvt_fab_recv(kvt_fab *f, void *buf, size_t len, void *desc, kvt_fab_ctx *ctx) {
  POST_RETRY(f, "fi_recv", fi_recv(f->ep, buf, len, desc, FI_ADDR_UNSPEC, ctx));
}

int kvt_fab_read(kvt_fab *f, uint64_t peer, void *buf, size_t len, void *desc, uint64_t raddr,
                 uint64_t rkey, kvt_fab_ctx *ctx) {
  POST_RETRY(f, "fi_read", fi_read(f->ep, buf, len, desc, peer, raddr, rkey, ctx));
}

int kvt_fab_write(kvt_fab *f, uint64_t peer, const void *buf, size_t len, void *desc,
                  uint64_t raddr, uint64_t rkey, kvt_fab_ctx *ctx) {
  POST_RETRY(f, "fi_write", fi_write(f->ep, buf, len, desc, peer, raddr, rkey, ctx));
}
