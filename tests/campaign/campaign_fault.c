/* tests/campaign/campaign_fault.c - what the campaign does to stored values
 * behind the stores' backs, always while the process owning them is dead:
 * bit flips, truncations and values planted under another key, in nvme
 * files (the stores' and the server's) and in Redis; junk and FIFOs named
 * like keys; and intruders, second processes opening a live directory. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef KVT_HAVE_HIREDIS
#include <hiredis/hiredis.h>
#endif

#include "campaign.h"

#define NVME_BLOCK 4096u
#define SRV_REC_MAGIC "KVTR"

static void hex_of(const kvt_key *k, char out[33]) {
  static const char digits[] = "0123456789abcdef";
  for (int i = 0; i < 16; i++) {
    out[2 * i] = digits[k->bytes[i] >> 4];
    out[2 * i + 1] = digits[k->bytes[i] & 15];
  }
  out[32] = 0;
}

void ck_nvme_path(const char *dir, const kvt_key *k, char *out, size_t cap) {
  char hex[33];
  hex_of(k, hex);
  snprintf(out, cap, "%s/%02x/%s", dir, k->bytes[0], hex);
}

/* ---- file faults ---- */

static int flip_file(const char *path, uint64_t payload_len) {
  const int fd = open(path, O_RDWR);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0 || st.st_size == 0) {
    if (fd >= 0)
      close(fd);
    return -1;
  }
  const uint64_t size = (uint64_t)st.st_size, r = ck_rand_below(4);
  uint64_t off;
  if (payload_len == 0 && size > NVME_BLOCK)
    payload_len = size - NVME_BLOCK;
  if (r < 2 && size > NVME_BLOCK) /* the payload itself */
    off = NVME_BLOCK +
          ck_rand_below(payload_len < size - NVME_BLOCK ? payload_len : size - NVME_BLOCK);
  else if (r == 2) /* the header's fields */
    off = ck_rand_below(size < 64 ? size : 64);
  else
    off = ck_rand_below(size);
  uint8_t b = 0;
  int rc = -1;
  if (pread(fd, &b, 1, (off_t)off) == 1) {
    b ^= (uint8_t)(1u << ck_rand_below(8));
    rc = pwrite(fd, &b, 1, (off_t)off) == 1 ? 0 : -1;
  }
  close(fd);
  return rc;
}

static int truncate_file(const char *path) {
  struct stat st;
  if (stat(path, &st) != 0 || st.st_size < 2)
    return -1;
  return truncate(path, (off_t)(1 + ck_rand_below((uint64_t)st.st_size - 1)));
}

/* Copies from over to (through a temporary and a rename, as a careless
 * operator's cp would not, so the tier never sees half a copy). */
static int copy_file(const char *from, const char *to) {
  char tmp[400];
  snprintf(tmp, sizeof(tmp), "%s.campaign-copy", to);
  const int in = open(from, O_RDONLY), out = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  int rc = in >= 0 && out >= 0 ? 0 : -1;
  static uint8_t buf[1 << 16];
  ssize_t n;
  while (rc == 0 && (n = read(in, buf, sizeof(buf))) > 0)
    rc = write(out, buf, (size_t)n) == n ? 0 : -1;
  if (in >= 0)
    close(in);
  if (out >= 0)
    close(out);
  if (rc == 0)
    rc = rename(tmp, to);
  if (rc)
    unlink(tmp);
  return rc;
}

/* ---- planting through a tier (a child: the parent opens no tier) ---- */

typedef struct plant_arg {
  char dir[300];
  kvt_key from, to;
} plant_arg;

static void plant_child(void *p) {
  const plant_arg *a = p;
  kvt_ctx *ctx = NULL;
  kvt_tier *t = NULL;
  char spec[400];
  snprintf(spec, sizeof(spec), "nvme:%s:%s", a->dir, ck_e.nvme_size);
  uint8_t *buf = aligned_alloc(4096, CK_VALUE_MAX + 8192);
  uint64_t len = 0;
  int rc = buf ? kvt_ctx_create(NULL, &ctx) : -ENOMEM;
  if (rc == 0)
    rc = kvt_tier_open(ctx, spec, &t);
  if (rc == 0)
    rc = kvt_tier_get(t, &a->from, buf, CK_VALUE_MAX + 8192, &len);
  if (rc == 0)
    rc = kvt_tier_put(t, &a->to, buf, len);
  if (rc)
    ck_note("planting through a tier in %s: %s (%s)", a->dir, kvt_err_name(rc),
            ctx ? kvt_ctx_last_error(ctx) : "");
  kvt_tier_close(t);
  kvt_ctx_destroy(ctx);
  free(buf);
  _exit(rc ? 1 : 0);
}

static int plant_through_tier(const char *dir, const kvt_key *from, const kvt_key *to) {
  plant_arg a;
  snprintf(a.dir, sizeof(a.dir), "%s", dir);
  a.from = *from;
  a.to = *to;
  const pid_t pid = ck_spawn("a planter", 60, plant_child, &a);
  return ck_wait_ok(pid, 60000, "a planter") ? 0 : -1;
}

/* ---- a store's directory ---- */

typedef struct target {
  char path[600];
  int slot;
  uint32_t idx;
  kvt_key tkey; /* the key the file is stored under in its tier */
} target;

/* One fault into t (its log marked first), from a kind fit for the store;
 * other: another present value of the same directory, for plants. */
static void fault_one(int sub, const char *dir, const target *t, const target *other,
                      int tier_plants) {
  const uint64_t r = ck_rand_below(100);
  const uint64_t plen = ck_value_len(sub, t->slot, t->idx, ck_log(sub, t->slot, t->idx)->cur);
  int kind = -1;
  if (other && r < 20)
    kind = copy_file(other->path, t->path) == 0 ? F_PLANT_DISK : -1;
  else if (other && tier_plants && r < 40)
    kind = plant_through_tier(dir, &other->tkey, &t->tkey) == 0 ? F_PLANT_TIER : -1;
  else if (r < 55)
    kind = truncate_file(t->path) == 0 ? F_TRUNC_DISK : -1;
  else
    kind = flip_file(t->path, sub == CK_CACHE ? 0 : plen) == 0 ? F_FLIP_DISK : -1;
  if (kind >= 0) {
    ck_log_fault(sub, t->slot, t->idx); /* the writer is dead: nothing races this */
    CK_ADD(faults[kind], 1);
    ck_trace("fault %s into %s %d key %u (%s)", ck_fault_name[kind], ck_sub_name[sub], t->slot,
             t->idx, t->path);
  }
}

static void inject(int sub, const char *dir, target *ts, int nt, int n, int tier_plants) {
  for (int i = 0; i < n && nt > 0; i++) {
    const int a = (int)ck_rand_below((uint64_t)nt);
    const int b = nt > 1 ? (a + 1 + (int)ck_rand_below((uint64_t)nt - 1)) % nt : -1;
    fault_one(sub, dir, &ts[a], b >= 0 ? &ts[b] : NULL, tier_plants);
    ts[a] = ts[--nt]; /* one fault per value per round */
  }
}

void ck_fault_disk(int sub, int slot, int n) {
  target *ts = calloc(CK_KEYS, sizeof(*ts));
  int nt = 0;
  for (uint32_t i = 0; ts && i < ck->nkeys; i++) {
    if (!ck_log_present(sub, slot, i))
      continue;
    target *t = &ts[nt];
    t->slot = slot;
    t->idx = i;
    t->tkey = ck_key_of(sub, slot, i);
    ck_nvme_path(ck_e.dir[sub][slot], &t->tkey, t->path, sizeof(t->path));
    if (access(t->path, F_OK) == 0)
      nt++;
  }
  inject(sub, ck_e.dir[sub][slot], ts, nt, n, sub == CK_CACHE);
  free(ts);
}

/* The server's records: nvme files whose payload starts with the record
 * header (magic "KVTR", version, tenant tag, the client's key). */
void ck_fault_server_disk(int n) {
  target *ts = calloc(CK_SLOTS * CK_KEYS, sizeof(*ts));
  int nt = 0;
  for (int s = 0; ts && s < 256; s++) {
    char sub[300];
    snprintf(sub, sizeof(sub), "%s/%02x", ck_e.srv_dir, s);
    DIR *d = opendir(sub);
    for (struct dirent *de; d && (de = readdir(d)) != NULL && nt < CK_SLOTS * CK_KEYS;) {
      if (strlen(de->d_name) != 32)
        continue;
      target *t = &ts[nt];
      snprintf(t->path, sizeof(t->path), "%s/%s", sub, de->d_name);
      uint8_t rec[32], hdr[64];
      const int fd = open(t->path, O_RDONLY);
      const int ok = fd >= 0 && pread(fd, hdr, sizeof(hdr), 0) == (ssize_t)sizeof(hdr) &&
                     pread(fd, rec, sizeof(rec), NVME_BLOCK) == (ssize_t)sizeof(rec);
      if (fd >= 0)
        close(fd);
      kvt_key ck_k;
      int ksub;
      if (!ok || memcmp(rec, SRV_REC_MAGIC, 4) != 0)
        continue;
      memcpy(ck_k.bytes, rec + 16, 16);
      if (!ck_key_decode(&ck_k, &ksub, &t->slot, &t->idx) || ksub != CK_FABRIC ||
          !ck_log_present(CK_FABRIC, t->slot, t->idx) ||
          kvt_key_from_hex(de->d_name, &t->tkey) != 0)
        continue;
      nt++;
    }
    if (d)
      closedir(d);
  }
  inject(CK_FABRIC, ck_e.srv_dir, ts, nt, n, 1);
  free(ts);
}

void ck_plant_fifo(int sub, int slot, char *path, size_t cap) {
  kvt_key k;
  const uint64_t a = ck_rand(), b = ck_rand();
  memcpy(k.bytes, &a, 8);
  memcpy(k.bytes + 8, &b, 8);
  char dir[400];
  snprintf(dir, sizeof(dir), "%s/%02x", ck_e.dir[sub][slot], k.bytes[0]);
  mkdir(dir, 0755);
  ck_nvme_path(ck_e.dir[sub][slot], &k, path, cap);
  if (mkfifo(path, 0644) == 0)
    CK_ADD(faults[F_FIFO_DISK], 1);
  else
    path[0] = 0;
}

void ck_plant_junk(int sub, int slot) {
  kvt_key k;
  const uint64_t a = ck_rand(), b = ck_rand();
  memcpy(k.bytes, &a, 8);
  memcpy(k.bytes + 8, &b, 8);
  char dir[400], path[400];
  snprintf(dir, sizeof(dir), "%s/%02x", ck_e.dir[sub][slot], k.bytes[0]);
  mkdir(dir, 0755);
  ck_nvme_path(ck_e.dir[sub][slot], &k, path, sizeof(path));
  const int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0)
    return;
  static uint8_t junk[3 * 4096];
  for (size_t i = 0; i < sizeof(junk); i++)
    junk[i] = (uint8_t)ck_rand();
  const size_t n = (size_t)ck_rand_below(sizeof(junk));
  if (write(fd, junk, n) == (ssize_t)n)
    CK_ADD(faults[F_JUNK_DISK], 1);
  close(fd);
}

/* ---- Redis values ---- */

#ifdef KVT_HAVE_HIREDIS
static redisReply *cmd(redisContext *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  redisReply *r = redisvCommand(c, fmt, ap);
  va_end(ap);
  return r;
}

/* The Redis key holding key's value (the header and first part):
 * kvt:campaign:{HEX}, or whatever key ends in {HEX}. */
static int redis_name(redisContext *c, const kvt_key *k, char *out, size_t cap) {
  char hex[33];
  hex_of(k, hex);
  snprintf(out, cap, "kvt:campaign:{%s}", hex);
  redisReply *r = cmd(c, "EXISTS %s", out);
  const int found = r && r->type == REDIS_REPLY_INTEGER && r->integer == 1;
  if (r)
    freeReplyObject(r);
  if (found)
    return 0;
  char pat[64];
  snprintf(pat, sizeof(pat), "*{%s}", hex);
  r = cmd(c, "SCAN 0 MATCH %s COUNT 100000", pat);
  int rc = -1;
  if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
      r->element[1]->type == REDIS_REPLY_ARRAY && r->element[1]->elements > 0) {
    snprintf(out, cap, "%s", r->element[1]->element[0]->str);
    rc = 0;
  }
  if (r)
    freeReplyObject(r);
  return rc;
}

/* Sets name to value (binary-safe); 0 on success. */
static int redis_set(redisContext *c, const char *name, const char *v, size_t n) {
  redisReply *w = cmd(c, "SET %s %b", name, v, n);
  const int ok = w && w->type != REDIS_REPLY_ERROR;
  if (w)
    freeReplyObject(w);
  return ok ? 0 : -1;
}

static void redis_fault_one(redisContext *c, int slot, uint32_t idx, int other) {
  char name[128], oname[128];
  const kvt_key k = ck_key_of(CK_REDIS, slot, idx);
  if (redis_name(c, &k, name, sizeof(name)) != 0)
    return;
  redisReply *r = cmd(c, "STRLEN %s", name);
  const long long len = r && r->type == REDIS_REPLY_INTEGER ? r->integer : 0;
  if (r)
    freeReplyObject(r);
  if (len < 2)
    return;
  const uint64_t pick = ck_rand_below(100);
  int kind = -1;
  r = NULL;
  if (other >= 0 && pick < 35) { /* another key's value, copied as it is */
    const kvt_key ok = ck_key_of(CK_REDIS, slot, (uint32_t)other);
    if (redis_name(c, &ok, oname, sizeof(oname)) == 0 && (r = cmd(c, "GET %s", oname)) &&
        r->type == REDIS_REPLY_STRING && redis_set(c, name, r->str, r->len) == 0)
      kind = F_PLANT_REDIS;
  } else if (pick < 50) {
    const long long keep = 1 + (long long)ck_rand_below((uint64_t)len - 1);
    if ((r = cmd(c, "GETRANGE %s 0 %lld", name, keep - 1)) && r->type == REDIS_REPLY_STRING &&
        redis_set(c, name, r->str, r->len) == 0)
      kind = F_TRUNC_REDIS;
  } else {
    /* Half the flips in the 32-byte header, half anywhere. */
    const long long off = (long long)ck_rand_below(pick < 75 && len > 32 ? 32 : (uint64_t)len);
    if ((r = cmd(c, "GETRANGE %s %lld %lld", name, off, off)) && r->type == REDIS_REPLY_STRING &&
        r->len == 1) {
      const char b = (char)(r->str[0] ^ (char)(1u << ck_rand_below(8)));
      redisReply *w = cmd(c, "SETRANGE %s %lld %b", name, off, &b, (size_t)1);
      if (w && w->type == REDIS_REPLY_INTEGER)
        kind = F_FLIP_REDIS;
      if (w)
        freeReplyObject(w);
    }
  }
  if (r)
    freeReplyObject(r);
  if (kind >= 0) {
    ck_log_fault(CK_REDIS, slot, idx); /* the writer is dead: nothing races this */
    CK_ADD(faults[kind], 1);
    ck_trace("fault %s into redis %d key %u", ck_fault_name[kind], slot, idx);
  }
}

void ck_fault_redis(int slot, int n) {
  const struct timeval tv = {3, 0};
  redisContext *c = redisConnectWithTimeout("127.0.0.1", ck_e.redis_port, tv);
  if (!c || c->err) {
    ck_note("fault injection: cannot reach redis on port %d", ck_e.redis_port);
    if (c)
      redisFree(c);
    return;
  }
  uint32_t present[CK_KEYS];
  int np = 0;
  for (uint32_t i = 0; i < ck->nkeys; i++)
    if (ck_log_present(CK_REDIS, slot, i))
      present[np++] = i;
  for (int i = 0; i < n && np > 0; i++) {
    const int a = (int)ck_rand_below((uint64_t)np);
    const int b = np > 1 ? (a + 1 + (int)ck_rand_below((uint64_t)np - 1)) % np : -1;
    redis_fault_one(c, slot, present[a], b >= 0 ? (int)present[b] : -1);
    present[a] = present[--np];
  }
  redisFree(c);
}
#else
void ck_fault_redis(int slot, int n) { (void)slot, (void)n; }
#endif

/* ---- intruders ---- */

typedef struct intruder_arg {
  char dir[300];
  int kind;
} intruder_arg;

typedef struct listing {
  kvt_key keys[64];
  int n;
} listing;

static int collect(void *opaque, const kvt_key *key, uint64_t len) {
  listing *l = opaque;
  (void)len;
  if (l->n < 64)
    l->keys[l->n++] = *key;
  return 0;
}

static const char *const intruder_name[CK_NINTRUDER] = {"a second writer (a tier)",
                                                        "a second writer (a cache)",
                                                        "a read-only tier", "a read-only cache"};

/* What a second process does to a directory: open it (a tier, or a cache
 * accepting any model, as `kvtier store` does; as a writer, or read-only),
 * list it, read what it lists. A writer must be refused; a read-only open
 * must work, and delete nothing (the owner's checks see to that). */
static void intruder_child(void *p) {
  const intruder_arg *a = p;
  const int ro = a->kind == I_RO_TIER || a->kind == I_RO_CACHE;
  const int cache = a->kind == I_CACHE || a->kind == I_RO_CACHE;
  char spec[400];
  snprintf(spec, sizeof(spec), "nvme:%s:%s%s", a->dir, ck_e.nvme_size, ro ? ",readonly=1" : "");
  kvt_ctx *ctx = NULL;
  if (kvt_ctx_create(NULL, &ctx) != 0)
    _exit(4);
  uint8_t *buf = aligned_alloc(4096, CK_VALUE_MAX + 8192);
  listing l = {.n = 0};
  uint64_t len;
  kvt_cache *c = NULL;
  kvt_tier *t = NULL;
  int rc;
  if (cache) {
    kvt_cache_config cfg = KVT_CACHE_CONFIG_INIT;
    cfg.tiers = spec;
    rc = kvt_cache_open(ctx, &cfg, &c);
    t = c ? kvt_cache_tier(c, 0) : NULL;
  } else {
    rc = kvt_tier_open(ctx, spec, &t);
  }
  if (ro)
    ck_check_result("a read-only open (readonly=1) beside a live writer works", rc == 0,
                    "%s on %s: %s (%s)", intruder_name[a->kind], a->dir, kvt_err_name(rc),
                    kvt_ctx_last_error(ctx));
  else
    ck_check_result("a second writer on a live nvme directory is refused with -EBUSY", rc == -EBUSY,
                    "%s on %s: %s", intruder_name[a->kind], a->dir, kvt_err_name(rc));
  if (rc == 0) {
    CK_ADD(intruder_opened, 1);
    kvt_tier_list(t, collect, &l);
    for (int i = 0; i < l.n; i++)
      (void)(c ? kvt_cache_get(c, &l.keys[i], buf, CK_VALUE_MAX + 8192, &len, NULL)
               : kvt_tier_get(t, &l.keys[i], buf, CK_VALUE_MAX + 8192, &len));
  }
  kvt_cache_close(c);
  if (!c)
    kvt_tier_close(t);
  free(buf);
  kvt_ctx_destroy(ctx);
}

pid_t ck_intruder(const char *dir, int kind) {
  intruder_arg a;
  snprintf(a.dir, sizeof(a.dir), "%s", dir);
  a.kind = kind;
  CK_ADD(intruders, 1);
  ck_trace("intruder (%s) on %s", intruder_name[kind], dir);
  return ck_spawn(intruder_name[kind], 60, intruder_child, &a);
}
