/* tests/campaign/campaign_state.c - the campaign's shared state
 * (campaign.h): notes and checks in shared memory, the run's randomness,
 * keys and the values of every version, the acknowledgement log and the
 * judgement of a get against it, and the child processes. */
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "campaign.h"

ck_opts ck_opt;
ck_shm *ck;
ck_env ck_e;

const char *const ck_sub_name[CK_NSUB] = {"cache", "nvme", "redis", "fabric"};

const char *const ck_fault_name[CK_NFAULT] = {"bit flips on disk",
                                              "truncated files",
                                              "files planted under another key",
                                              "values planted through a tier",
                                              "junk files named like keys",
                                              "FIFOs named like keys",
                                              "bit flips in redis values",
                                              "values planted in redis",
                                              "truncated redis values",
                                              "puts into a full file system"};

const char *const ck_hostile_name[CK_NHOSTILE] = {
    "garbage tcp",       "half-open tcp",         "wrong tokens",     "forged hello addresses",
    "forged sessions",   "cross-tenant keys",     "out-of-range rma", "direct rma at the server",
    "stalled transfers", "stalled clients killed"};

/* ---- notes and checks ---- */

void ck_note(const char *fmt, ...) {
  char line[CK_NOTE_LEN];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof(line), fmt, ap);
  va_end(ap);
  fprintf(stderr, "campaign: %s\n", line);
  const uint32_t i = __atomic_fetch_add(&ck->n_notes, 1, __ATOMIC_SEQ_CST);
  if (i < CK_NOTES)
    snprintf(ck->notes[i], CK_NOTE_LEN, "%s", line);
}

void ck_trace(const char *fmt, ...) {
  if (!ck_opt.trace)
    return;
  char line[CK_NOTE_LEN];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof(line), fmt, ap);
  va_end(ap);
  fprintf(stderr, "T %lld [%d] %s\n", (long long)ck_now_ms(), (int)getpid(), line);
}

static void lock_checks(void) {
  while (__atomic_exchange_n(&ck->lock, 1, __ATOMIC_ACQUIRE))
    sched_yield();
}

static void unlock_checks(void) { __atomic_store_n(&ck->lock, 0, __ATOMIC_RELEASE); }

/* The entry of name, created on first use; the last entry, which fails,
 * once the table is full (a check must never be dropped). Called with the
 * lock held. */
static ck_check *check_of(const char *name) {
  for (uint32_t i = 0; i < ck->n_checks; i++)
    if (strcmp(ck->checks[i].name, name) == 0)
      return &ck->checks[i];
  if (ck->n_checks == CK_CHECKS) {
    ck_check *last = &ck->checks[CK_CHECKS - 1];
    snprintf(last->name, sizeof(last->name), "more checks than CK_CHECKS (%d)", CK_CHECKS);
    last->failed++;
    return last;
  }
  ck_check *c = &ck->checks[ck->n_checks++];
  memset(c, 0, sizeof(*c));
  snprintf(c->name, sizeof(c->name), "%s", name);
  return c;
}

static void check_record(const char *name, int outcome, const char *fmt, va_list ap) {
  char detail[CK_NOTE_LEN] = "";
  if (fmt)
    vsnprintf(detail, sizeof(detail), fmt, ap);
  lock_checks();
  ck_check *c = check_of(name);
  uint32_t *n = outcome > 0 ? &c->passed : outcome == 0 ? &c->failed : &c->skipped;
  if (*n == 0 && outcome <= 0)
    snprintf(c->detail, sizeof(c->detail), "%s", detail);
  (*n)++;
  unlock_checks();
  if (outcome == 0)
    ck_note("FAILED: %s: %s", name, detail);
  else if (outcome < 0)
    ck_note("skipped: %s: %s", name, detail);
}

void ck_check_result(const char *name, int ok, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  check_record(name, ok ? 1 : 0, fmt, ap);
  va_end(ap);
}

void ck_check_skip(const char *name, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  check_record(name, -1, fmt, ap);
  va_end(ap);
}

uint32_t ck_checks_failed(void) {
  uint32_t n = 0;
  lock_checks();
  for (uint32_t i = 0; i < ck->n_checks; i++)
    n += ck->checks[i].failed;
  unlock_checks();
  return n;
}

/* ---- randomness, time ---- */

uint64_t ck_mix(uint64_t a, uint64_t b) {
  uint64_t x = a ^ (b + 0x9E3779B97F4A7C15ull + (a << 6) + (a >> 2));
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

static uint64_t rng_state;

void ck_reseed(uint64_t s) { rng_state = s; }

uint64_t ck_rand(void) {
  rng_state += 0x9E3779B97F4A7C15ull;
  return ck_mix(rng_state, 0);
}

uint64_t ck_rand_below(uint64_t n) { return n ? ck_rand() % n : 0; }

int64_t ck_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void ck_sleep_ms(int64_t ms) {
  struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
    ;
}

/* ---- keys and values ---- */

static uint64_t key_id(int sub, int slot, uint32_t idx) {
  return (uint64_t)sub << 40 | (uint64_t)slot << 32 | idx;
}

/* Our keys: 8 bytes of a hash (so they spread over the nvme tier's
 * subdirectories and Redis slots), then 'C', sub, slot, 0, idx. */
kvt_key ck_key_of(int sub, int slot, uint32_t idx) {
  if (sub == CK_CACHE)
    return ck->cache_keys[slot][idx];
  kvt_key k;
  const uint64_t h = ck_mix(ck->seed, key_id(sub, slot, idx));
  memcpy(k.bytes, &h, 8);
  k.bytes[8] = 'C';
  k.bytes[9] = (uint8_t)sub;
  k.bytes[10] = (uint8_t)slot;
  k.bytes[11] = 0;
  memcpy(k.bytes + 12, &idx, 4);
  return k;
}

int ck_key_decode(const kvt_key *k, int *sub, int *slot, uint32_t *idx) {
  if (k->bytes[8] == 'C' && k->bytes[9] < CK_NSUB && k->bytes[10] < CK_SLOTS) {
    uint32_t i;
    memcpy(&i, k->bytes + 12, 4);
    if (i < CK_KEYS) {
      const kvt_key want = ck_key_of(k->bytes[9], k->bytes[10], i);
      if (memcmp(want.bytes, k->bytes, 16) == 0) {
        *sub = k->bytes[9], *slot = k->bytes[10], *idx = i;
        return 1;
      }
    }
  }
  for (int s = 0; s < CK_SLOTS; s++)
    for (uint32_t i = 0; i < CK_KEYS; i++)
      if (memcmp(ck->cache_keys[s][i].bytes, k->bytes, 16) == 0) {
        *sub = CK_CACHE, *slot = s, *idx = i;
        return 1;
      }
  return 0;
}

int ck_is_del(int sub, int slot, uint32_t idx, uint32_t v) {
  return v > 1 && ck_mix(ck->seed ^ 0xDE1, key_id(sub, slot, idx) * 7919 + v) % 6 == 0;
}

uint64_t ck_value_len(int sub, int slot, uint32_t idx, uint32_t v) {
  const uint64_t h = ck_mix(ck->seed ^ 0x1E4, key_id(sub, slot, idx) * 7919 + v);
  const uint64_t r = h % 100, x = h >> 20;
  uint64_t len;
  if (r < 50)
    len = 16 + x % 4080;
  else if (r < 85)
    len = 4096 + x % 61440;
  else
    len = 65536 + x % (CK_VALUE_MAX - 65536);
  if ((h >> 8) % 7 == 0 && len >= 4096)
    len &= ~(uint64_t)4095; /* whole blocks: the nvme tier's in-place path */
  return len;
}

/* xorshift bytes from seed. */
static void fill_bytes(uint8_t *p, size_t n, uint64_t seed) {
  uint64_t x = seed | 1;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    memcpy(p + i, &x, 8);
  }
  x ^= x << 13, x ^= x >> 7, x ^= x << 17;
  for (; i < n; i++)
    p[i] = (uint8_t)(x >> (8 * (i & 7)));
}

static kvt_key fp;
static int fp_done;

const kvt_key *ck_fingerprint(void) {
  if (!fp_done) {
    kvt_codec_spec spec;
    kvt_model_desc m = KVT_MODEL_DESC_INIT;
    m.model_id = "campaign/model";
    m.layers = 1;
    m.kv_heads = 1;
    m.head_dim = 64;
    if (kvt_codec_parse(NULL, "raw", &spec) == 0 && kvt_fingerprint(&m, &spec, &fp) == 0)
      fp_done = 1;
  }
  return &fp;
}

/* The cache's payload of key idx of slot: raw bf16, 1 layer x T tokens x 1
 * head x 64 dims, T from the key (8..64: 2 to 16 KiB), values from the key. */
static int cache_payload(kvt_ctx *ctx, int slot, uint32_t idx, uint8_t *buf, uint64_t cap,
                         uint64_t *len) {
  const uint32_t tokens = 8 + (uint32_t)(ck_mix(ck->seed ^ 0xCAC4E, key_id(0, slot, idx)) % 57);
  const size_t n = (size_t)tokens * 64;
  uint16_t *k = malloc(n * 2), *v = malloc(n * 2);
  uint8_t *noise = malloc(n * 2);
  int rc = -ENOMEM;
  if (k && v && noise) {
    fill_bytes(noise, n * 2, ck_mix(ck->seed, key_id(0, slot, idx)));
    for (size_t i = 0; i < n; i++) {
      k[i] = kvt_f32_to_bf16((float)(noise[2 * i] - 128) / 64.0f);
      v[i] = kvt_f32_to_bf16((float)(noise[2 * i + 1] - 128) / 32.0f);
    }
    kvt_kv_view view;
    kvt_kv_view_dense(&view, k, v, KVT_DTYPE_BF16, 1, tokens, 1, 64);
    kvt_encode_params p = KVT_ENCODE_PARAMS_INIT;
    size_t got = 0;
    rc = kvt_codec_parse(ctx, "raw", &p.spec);
    p.key = ck->cache_keys[slot][idx];
    p.fingerprint = *ck_fingerprint();
    if (rc == 0)
      rc = kvt_encode(ctx, &p, &view, buf, (size_t)cap, &got);
    *len = got;
  }
  free(k);
  free(v);
  free(noise);
  return rc;
}

int ck_value(kvt_ctx *ctx, int sub, int slot, uint32_t idx, uint32_t v, uint8_t *buf, uint64_t cap,
             uint64_t *len) {
  if (sub == CK_CACHE)
    return cache_payload(ctx, slot, idx, buf, cap, len);
  const uint64_t n = ck_value_len(sub, slot, idx, v);
  if (n > cap)
    return KVT_ENOBUFS;
  /* A self-description first, so wrong bytes say whose they are. */
  buf[0] = 'V';
  buf[1] = (uint8_t)sub;
  buf[2] = (uint8_t)slot;
  buf[3] = 0;
  memcpy(buf + 4, &idx, 4);
  memcpy(buf + 8, &v, 4);
  const uint32_t tag = (uint32_t)ck_mix(ck->seed, key_id(sub, slot, idx) ^ v);
  memcpy(buf + 12, &tag, 4);
  fill_bytes(buf + 16, (size_t)n - 16,
             ck_mix(ck->seed ^ 0xB17E5, key_id(sub, slot, idx) * 131 + v));
  *len = n;
  return 0;
}

/* ---- the acknowledgement log ---- */

#define LD(p) __atomic_load_n(&(p), __ATOMIC_SEQ_CST)
#define ST(p, v) __atomic_store_n(&(p), (v), __ATOMIC_SEQ_CST)

ck_key *ck_log(int sub, int slot, uint32_t idx) { return &ck->keys[sub][slot][idx]; }

uint32_t ck_log_begin(int sub, int slot, uint32_t idx) {
  ck_key *k = ck_log(sub, slot, idx);
  const uint32_t v = LD(k->last) + 1;
  ST(k->last, v);
  ST(k->pending, v);
  return v;
}

void ck_log_end(int sub, int slot, uint32_t idx, uint32_t v, int ok, int uncertain) {
  ck_key *k = ck_log(sub, slot, idx);
  if (ok) {
    ST(k->att, v);
    ST(k->cur, v);
    ST(k->gone, 0);
  } else if (uncertain) {
    ST(k->att, v);
  }
  ST(k->pending, 0);
}

/* Kill -9 between ck_log_begin and ck_log_end leaves a version pending: it
 * may have been applied. Folded in before anything reads the log. */
static void settle(ck_key *k) {
  const uint32_t p = LD(k->pending);
  if (p) {
    if (p > LD(k->att))
      ST(k->att, p);
    ST(k->pending, 0);
  }
}

void ck_log_fault(int sub, int slot, uint32_t idx) {
  ck_key *k = ck_log(sub, slot, idx);
  settle(k);
  ST(k->fault, LD(k->att) + 1);
}

static int is_present_version(int sub, int slot, uint32_t idx, uint32_t v) {
  return v > 0 && !ck_is_del(sub, slot, idx, v);
}

int ck_log_present(int sub, int slot, uint32_t idx) {
  ck_key *k = ck_log(sub, slot, idx);
  settle(k);
  const uint32_t cur = LD(k->cur);
  return LD(k->att) == cur && !LD(k->gone) && is_present_version(sub, slot, idx, cur);
}

/* ---- judging a get ---- */

int ck_is_corruption(int rc) {
  return rc == KVT_ECHECKSUM || rc == KVT_EFOREIGN || rc == KVT_ECORRUPT || rc == KVT_EFORMAT ||
         rc == KVT_ETRUNC || rc == KVT_EVERSION;
}

int ck_is_transient(int rc) {
  return rc == -ETIMEDOUT || rc == -ECONNRESET || rc == -ECONNREFUSED || rc == -ENOTCONN ||
         rc == -EAGAIN || rc == -EBUSY || rc == -ESHUTDOWN || rc == -EPIPE || rc == -ECONNABORTED ||
         rc == -EHOSTUNREACH || rc == KVT_EBACKEND;
}

/* What wrong bytes are: another key's value (ours describe themselves). */
static void describe(int sub, const uint8_t *buf, uint64_t len, char *out, size_t cap) {
  if (sub != CK_CACHE && len >= 16 && buf[0] == 'V' && buf[1] < CK_NSUB && buf[2] < CK_SLOTS) {
    uint32_t idx, v;
    memcpy(&idx, buf + 4, 4);
    memcpy(&v, buf + 8, 4);
    snprintf(out, cap, "%llu bytes starting as %s slot %d key %u v%u", (unsigned long long)len,
             ck_sub_name[buf[1]], buf[2], idx, v);
  } else {
    snprintf(out, cap, "%llu bytes not starting as any value of ours", (unsigned long long)len);
  }
}

/* Whether buf holds version v's bytes. */
static int holds(kvt_ctx *ctx, int sub, int slot, uint32_t idx, uint32_t v, const uint8_t *buf,
                 uint64_t len, uint8_t *scratch) {
  uint64_t want = 0;
  if (sub != CK_CACHE && ck_value_len(sub, slot, idx, v) != len)
    return 0;
  if (ck_value(ctx, sub, slot, idx, v, scratch, CK_VALUE_MAX + 4096, &want) != 0)
    return 0;
  return want == len && memcmp(scratch, buf, (size_t)len) == 0;
}

static void judge_hit(kvt_ctx *ctx, int sub, int slot, uint32_t idx, const uint8_t *buf,
                      uint64_t len, uint8_t *scratch, int *verdict) {
  ck_key *k = ck_log(sub, slot, idx);
  const uint32_t cur = LD(k->cur), att = LD(k->att);
  for (uint32_t v = cur; v <= att; v++) {
    if (v == cur && LD(k->gone))
      continue;
    if (is_present_version(sub, slot, idx, v) && holds(ctx, sub, slot, idx, v, buf, len, scratch)) {
      ST(k->cur, v);
      ST(k->att, v);
      ST(k->gone, 0);
      if (LD(k->fault) > cur)
        CK_ADD(harmless, 1); /* a fault the value did not notice: a flip in padding */
      ST(k->fault, 0);
      *verdict = 0;
      return;
    }
  }
  if (LD(k->wrong) != att + 1) {
    ST(k->wrong, att + 1);
    CK_ADD(wrong, 1);
    char what[160];
    describe(sub, buf, len, what, sizeof(what));
    ck_note("WRONG BYTES: %s slot %d key %u (log: v%u..v%u%s%s): got %s", ck_sub_name[sub], slot,
            idx, cur, att, LD(k->gone) ? ", gone" : "", LD(k->fault) > cur ? ", faulted" : "",
            what);
  }
  *verdict = -1;
}

static void judge_miss(int sub, int slot, uint32_t idx, int rc, int durable, int *verdict) {
  ck_key *k = ck_log(sub, slot, idx);
  const uint32_t cur = LD(k->cur), att = LD(k->att);
  *verdict = 0;
  if (cur == 0 || !is_present_version(sub, slot, idx, cur) || LD(k->gone)) {
    ST(k->att, cur); /* absent, as known: nothing after it applied */
    if (rc != KVT_ENOTFOUND && LD(k->fault) <= cur)
      ck_note("%s slot %d key %u: an absent value reads as %s", ck_sub_name[sub], slot, idx,
              kvt_err_name(rc));
    return;
  }
  for (uint32_t v = att; v > cur; v--)
    if (!is_present_version(sub, slot, idx, v)) { /* a DEL that may have applied */
      ST(k->cur, v);
      ST(k->att, v);
      return;
    }
  ST(k->gone, 1);
  ST(k->att, cur);
  if (LD(k->fault) > cur) {
    CK_ADD(detected, 1); /* the fault marker stays: the value may keep failing so */
    return;
  }
  if (!durable)
    return; /* evicted */
  CK_ADD(lost, 1);
  ck_note("LOST: %s slot %d key %u v%u (acknowledged) reads as %s", ck_sub_name[sub], slot, idx,
          cur, kvt_err_name(rc));
  *verdict = -1;
}

int ck_judge_get(kvt_ctx *ctx, int sub, int slot, uint32_t idx, int rc, const uint8_t *buf,
                 uint64_t len, int durable, uint8_t *scratch) {
  settle(ck_log(sub, slot, idx));
  int verdict = 0;
  if (rc == 0)
    judge_hit(ctx, sub, slot, idx, buf, len, scratch, &verdict);
  else if (rc == KVT_ENOTFOUND || ck_is_corruption(rc))
    judge_miss(sub, slot, idx, rc, durable, &verdict);
  else if (ck_is_transient(rc))
    verdict = 1;
  else
    verdict = -2;
  return verdict;
}

/* ---- child processes ---- */

#define CK_MAX_CHILDREN 256

static struct {
  pid_t pid;
  char what[64];
} children[CK_MAX_CHILDREN];
static uint64_t n_spawned;

static void track(pid_t pid, const char *what) {
  for (int i = 0; i < CK_MAX_CHILDREN; i++)
    if (children[i].pid == 0) {
      children[i].pid = pid;
      snprintf(children[i].what, sizeof(children[i].what), "%s", what);
      return;
    }
}

static void untrack(pid_t pid) {
  for (int i = 0; i < CK_MAX_CHILDREN; i++)
    if (children[i].pid == pid)
      children[i].pid = 0;
}

pid_t ck_spawn(const char *what, int limit_s, ck_child_fn fn, void *arg) {
  fflush(stdout);
  fflush(stderr);
  const uint64_t child_seed = ck_mix(ck->seed, ++n_spawned);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    ck_note("fork for %s: %s", what, strerror(errno));
    return -1;
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
      _exit(99);
    signal(SIGALRM, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGPIPE, SIG_IGN);
    memset(children, 0, sizeof(children));
    ck_reseed(child_seed);
    alarm((unsigned)limit_s);
    fn(arg);
    fflush(stdout);
    fflush(stderr);
    _exit(0);
  }
  track(pid, what);
  return pid;
}

static int outcome(pid_t pid, int status, const char *what) {
  untrack(pid);
  if (WIFEXITED(status))
    return WEXITSTATUS(status);
  const int sig = WTERMSIG(status);
  if (sig == SIGALRM) {
    CK_ADD(hangs, 1);
    ck_note("HANG: %s ran past its time limit (killed by its alarm)", what);
  } else {
    CK_ADD(crashes, 1);
    ck_note("CRASH: %s ended by signal %d (%s)", what, sig, strsignal(sig));
  }
  return 128 + sig;
}

int ck_wait(pid_t pid, int timeout_ms, const char *what) {
  const int64_t end = ck_now_ms() + timeout_ms;
  for (;;) {
    int status = 0;
    const pid_t w = waitpid(pid, &status, WNOHANG);
    if (w == pid)
      return outcome(pid, status, what);
    if (w < 0) {
      untrack(pid);
      return -1;
    }
    if (ck_now_ms() > end)
      break;
    ck_sleep_ms(10);
  }
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  untrack(pid);
  CK_ADD(hangs, 1);
  ck_note("HANG: %s did not end within %d ms (killed)", what, timeout_ms);
  return -1;
}

int ck_wait_ok(pid_t pid, int timeout_ms, const char *what) {
  const int rc = pid > 0 ? ck_wait(pid, timeout_ms, what) : -1;
  ck_check_result("every process ends normally", rc == 0, "%s ended with %d", what, rc);
  return rc == 0;
}

int ck_alive(pid_t pid) {
  for (int i = 0; i < CK_MAX_CHILDREN; i++)
    if (children[i].pid == pid)
      return 1;
  return 0;
}

int ck_kill9(pid_t pid, const char *what) {
  if (pid <= 0 || !ck_alive(pid))
    return 0;
  int status = 0;
  if (waitpid(pid, &status, WNOHANG) == pid) {
    const int rc = outcome(pid, status, what);
    return rc ? rc : 0;
  }
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  untrack(pid);
  return 0;
}

void ck_reap_all(void) {
  for (int i = 0; i < CK_MAX_CHILDREN; i++)
    if (children[i].pid > 0) {
      kill(children[i].pid, SIGKILL);
      waitpid(children[i].pid, NULL, 0);
      children[i].pid = 0;
    }
}
