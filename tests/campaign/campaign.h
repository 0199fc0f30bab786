/* tests/campaign/campaign.h - what the parts of the reliability campaign
 * (test_campaign, docs/CAMPAIGN.md) share: the run's settings, the state in
 * shared memory (the acknowledgement log, the figures, the checks), keys and
 * values, child processes, and the stores and their writers.
 *
 * Processes. The parent only orchestrates: it forks every worker (writers,
 * the server, hostile clients, intruders), kills them with SIGKILL, injects
 * faults into files and Redis values while the writer owning them is dead,
 * and reads what the children wrote to shared memory. It never opens a tier
 * or a libfabric endpoint itself, so no child inherits a ring, a socket or a
 * provider's state.
 *
 * The acknowledgement log. Each key has one writer at a time (a slot owns its
 * keys). Before an operation the writer records the version it attempts; once
 * the operation is acknowledged, that version becomes the key's current one.
 * Versions are never reused, and whether a version is a PUT or a DEL and what
 * bytes a PUT stores follow from (seed, store, slot, key, version), so after
 * a kill -9 the log says exactly which outcomes a get may give: the current
 * version's, or one attempted after it whose outcome was unknown. */
#ifndef KVT_CAMPAIGN_H
#define KVT_CAMPAIGN_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "kvtier.h"

/* ---- the run ---- */

enum ck_mode { CK_SHORT = 0, CK_LONG = 1 };

typedef struct ck_opts {
  uint64_t seed;
  int mode;
  double duration_s; /* CK_LONG: the time the phases share */
  int verbose;
  int trace; /* --trace: every operation and fault on stderr */
} ck_opts;

extern ck_opts ck_opt;

/* ---- stores ---- */

enum ck_sub { CK_CACHE, CK_NVME, CK_REDIS, CK_FABRIC, CK_NSUB };
#define CK_SLOTS 4
#define CK_KEYS 160 /* per slot; the short setting uses fewer (ck_shm.nkeys) */

extern const char *const ck_sub_name[CK_NSUB];

/* One key's log entry (see the top). Fields are read and written with
 * __atomic builtins: a writer may die between any two stores. */
typedef struct ck_key {
  uint32_t cur;     /* the version whose outcome is known (0: never written: absent) */
  uint32_t att;     /* the highest version that may have been applied (>= cur) */
  uint32_t last;    /* the highest version number used (never reused) */
  uint32_t pending; /* the version in flight (0: none): a kill leaves it uncertain */
  uint32_t gone;    /* cur is a PUT but the value is known absent (detected or lost) */
  uint32_t fault;   /* att + 1 when a fault was injected into the stored value; 0: none */
  uint32_t wrong;   /* att + 1 when wrong bytes were counted for it (counted once) */
} ck_key;

/* ---- faults and hostile connections, by kind ---- */

enum ck_fault {
  F_FLIP_DISK,   /* one bit of an NVMe file */
  F_TRUNC_DISK,  /* an NVMe file cut short */
  F_PLANT_DISK,  /* key A's file copied over key B's */
  F_PLANT_TIER,  /* key A's bytes put under key B through the tier (a valid file) */
  F_JUNK_DISK,   /* a file of garbage named like a key */
  F_FIFO_DISK,   /* a FIFO named like a key */
  F_FLIP_REDIS,  /* one bit of a Redis value (SETRANGE) */
  F_PLANT_REDIS, /* key A's Redis value copied under key B */
  F_TRUNC_REDIS, /* a Redis value cut short */
  F_FULL_FS,     /* a put into a full file system */
  CK_NFAULT
};

enum ck_hostile {
  H_TCP_GARBAGE,    /* a TCP connection to the server's port sending garbage */
  H_TCP_HALF_OPEN,  /* a TCP connection that sends nothing, or half a message, and stays */
  H_WRONG_TOKEN,    /* a fabric tier opened with a wrong or empty token */
  H_FORGED_ADDR,    /* a HELLO naming an address that is not the sender's */
  H_FORGED_SESSION, /* requests under session ids the sender was not given */
  H_CROSS_TENANT,   /* a tenant naming another tenant's keys */
  H_BAD_RMA,        /* out-of-range or foreign RMA addresses and keys */
  H_DIRECT_RMA,     /* RMA at the server's own endpoint with guessed keys */
  H_STALLED,        /* PUTs and GETs whose client never completes the transfer */
  H_STALLED_KILLED, /* the same client killed -9 mid-transfer */
  CK_NHOSTILE
};

extern const char *const ck_fault_name[CK_NFAULT];
extern const char *const ck_hostile_name[CK_NHOSTILE];

/* ---- checks: named expectations, each passed, failed or skipped ---- */

#define CK_CHECKS 128
#define CK_NOTES 96
#define CK_NOTE_LEN 240

typedef struct ck_check {
  char name[120];
  uint32_t passed, failed, skipped;
  char detail[CK_NOTE_LEN]; /* the first failure's, or why it was skipped */
} ck_check;

/* ---- shared memory ---- */

typedef struct ck_figs {
  uint64_t ops, puts, gets, dels;
  uint64_t wrong, lost, detected, harmless, unanswered;
  uint64_t put_failed_expected; /* during a server outage, a full file system */
  uint64_t put_failed_unexpected;
  uint64_t faults[CK_NFAULT];
  uint64_t hostile[CK_NHOSTILE];
  uint64_t writer_kills, writer_starts, server_kills, server_starts, clean_stops;
  uint64_t intruders, intruder_opened, crashes, hangs;
} ck_figs;

typedef struct ck_shm {
  uint64_t seed;
  uint32_t nkeys;
  ck_key keys[CK_NSUB][CK_SLOTS][CK_KEYS];
  kvt_key cache_keys[CK_SLOTS][CK_KEYS];
  ck_figs f;
  /* Writers' progress (the good client of the hostile phase is watched). */
  uint64_t opened[CK_NSUB][CK_SLOTS]; /* writers that opened their store */
  uint64_t ok_ops[CK_NSUB][CK_SLOTS];
  int64_t last_ok_ms[CK_NSUB][CK_SLOTS];
  int64_t max_gap_ms[CK_NSUB][CK_SLOTS]; /* longest time between two successes */
  uint32_t stalled_ready; /* a stalled client has sent its requests (then it is killed) */
  uint32_t outage;        /* 1 while the parent has the server down: failures are expected */
  /* The server child. */
  int srv_port;
  int srv_ready;
  int srv_rc;
  char why[CK_NOTE_LEN]; /* a child's reason, for the parent (a probe) */
  uint32_t lock;         /* checks: a spin lock (creating an entry) */
  uint32_t n_checks;
  ck_check checks[CK_CHECKS];
  uint32_t n_notes;
  char notes[CK_NOTES][CK_NOTE_LEN];
} ck_shm;

extern ck_shm *ck;

/* Adds to a figure (atomically: many processes). */
#define CK_ADD(field, n) __atomic_fetch_add(&ck->f.field, (uint64_t)(n), __ATOMIC_SEQ_CST)

/* A line for the report (kept in shared memory, first CK_NOTES) and stderr. */
void ck_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Records one outcome of the named check; detail says what happened (kept
 * for the first failure, or the first skip). */
void ck_check_result(const char *name, int ok, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void ck_check_skip(const char *name, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Failed outcomes recorded so far, over every check. */
uint32_t ck_checks_failed(void);

/* ---- randomness, time ---- */

uint64_t ck_mix(uint64_t a, uint64_t b);
/* The parent's generator (seeded by --seed); a child reseeds its own copy. */
uint64_t ck_rand(void);
uint64_t ck_rand_below(uint64_t n);
void ck_reseed(uint64_t s);
int64_t ck_now_ms(void);
void ck_sleep_ms(int64_t ms);

/* ---- keys and values ---- */

kvt_key ck_key_of(int sub, int slot, uint32_t idx);
/* Which (sub, slot, idx) a key is; 0 when it is none of ours. */
int ck_key_decode(const kvt_key *k, int *sub, int *slot, uint32_t *idx);
int ck_is_del(int sub, int slot, uint32_t idx, uint32_t v);
uint64_t ck_value_len(int sub, int slot, uint32_t idx, uint32_t v);
#define CK_VALUE_MAX (256u << 10)
/* The value of version v (a PUT). For the cache it is the key's payload,
 * the same for every version (keys name content). */
int ck_value(kvt_ctx *ctx, int sub, int slot, uint32_t idx, uint32_t v, uint8_t *buf, uint64_t cap,
             uint64_t *len);
/* The cache's model fingerprint. */
const kvt_key *ck_fingerprint(void);

/* ---- the acknowledgement log ---- */

ck_key *ck_log(int sub, int slot, uint32_t idx);
/* The writer's side: the version to attempt next, and its outcome. */
uint32_t ck_log_begin(int sub, int slot, uint32_t idx);
/* rc 0: acknowledged. uncertain: it failed in a way that may still have
 * applied it (a timeout, a connection lost). */
void ck_log_end(int sub, int slot, uint32_t idx, uint32_t v, int ok, int uncertain);
/* The parent's side, writer dead: a fault goes into the stored value. */
void ck_log_fault(int sub, int slot, uint32_t idx);
/* Whether the key is expected to hold a value (cur a PUT, not gone, and
 * nothing uncertain after it): fault targets. */
int ck_log_present(int sub, int slot, uint32_t idx);

/* Classifies a get's outcome against the log and counts it: returns 0 when
 * it is allowed (exact bytes of an allowed version, or an allowed miss), 1
 * for a transient error (try again), -1 when it broke the invariant (wrong
 * bytes, or an acknowledged value missing from a durable store), -2 for an
 * error that is neither (the caller tries again, then counts it
 * unanswered). */
int ck_judge_get(kvt_ctx *ctx, int sub, int slot, uint32_t idx, int rc, const uint8_t *buf,
                 uint64_t len, int durable, uint8_t *scratch);

/* --trace: a line on stderr (time, pid, then fmt). */
void ck_trace(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Whether rc says "this value is corrupt or not ours" (a clean refusal). */
int ck_is_corruption(int rc);
/* Whether rc is a transient error of a remote tier (the peer away). */
int ck_is_transient(int rc);

/* ---- child processes ---- */

typedef void (*ck_child_fn)(void *arg);

/* Forks a child running fn(arg) under an alarm of limit_s seconds (a hang
 * dies by SIGALRM), which then exits 0 (fn may _exit with another code).
 * The parent tracks it for ck_reap_all. */
pid_t ck_spawn(const char *what, int limit_s, ck_child_fn fn, void *arg);
/* Waits up to timeout_ms for pid; returns its exit code, 128 + signal when
 * a signal ended it (a crash or a hang: counted, with a note), or -1 when
 * it did not end in time (then it is killed and counted as a hang). */
int ck_wait(pid_t pid, int timeout_ms, const char *what);
/* ck_wait, and the check "every process ends normally" (exit 0). Returns
 * whether it did. */
int ck_wait_ok(pid_t pid, int timeout_ms, const char *what);
/* SIGKILL and reap. Returns 0, or the child's earlier end (it had already
 * exited: counted as a crash when abnormal). */
int ck_kill9(pid_t pid, const char *what);
/* Whether pid still runs (not reaped). */
int ck_alive(pid_t pid);
/* Ends every child still tracked (exit, a failed check). */
void ck_reap_all(void);

/* ---- the environment of the stores ---- */

typedef struct ck_env {
  char root[200];                   /* the run's scratch directory */
  char dir[CK_NSUB][CK_SLOTS][240]; /* nvme directories (cache, nvme) */
  char srv_dir[240];                /* the server's nvme directory */
  int redis_port;
  const char *nvme_size; /* capacity of the stores' nvme tiers */
} ck_env;

extern ck_env ck_e;

/* Tenants of the server: slot i of the fabric store is tenant ck_tenant[i]. */
extern const char *const ck_tenant[CK_SLOTS];
extern const char *const ck_token[CK_SLOTS];

/* ---- stores (campaign_store.c) ---- */

typedef struct ck_store {
  int sub, slot;
  kvt_ctx *ctx;
  kvt_cache *cache;
  kvt_tier *tier;
} ck_store;

int ck_store_open(ck_store *s, int sub, int slot);
void ck_store_close(ck_store *s);
int ck_store_put(ck_store *s, uint32_t idx, const void *buf, uint64_t len);
int ck_store_get(ck_store *s, uint32_t idx, void *buf, uint64_t cap, uint64_t *len);
int ck_store_del(ck_store *s, uint32_t idx);
/* Whether the store's acknowledged values must survive (no eviction). */
int ck_store_durable(int sub);

typedef struct ck_writer_arg {
  int sub, slot;
  double run_s;    /* random operations for this long after the first check, then a last check */
  int verify_only; /* check every key and exit */
} ck_writer_arg;

/* A writer child: opens its store (retrying while a server restarts),
 * checks every key of its slot against the log, then runs random puts,
 * dels and gets (each get checked) for run_s, checks every key again. */
void ck_writer_main(void *arg);

/* ---- faults (campaign_fault.c) ---- */

/* Path of key's file in an nvme directory (dir/xx/hex). */
void ck_nvme_path(const char *dir, const kvt_key *k, char *out, size_t cap);
/* Injects n faults into the files of (sub, slot)'s present keys, the
 * writer being dead; kinds chosen at random among flips, truncations and
 * plants (a file copied over another; and, for the cache, A's payload put
 * under B through an nvme tier opened in a child). */
void ck_fault_disk(int sub, int slot, int n);
/* The same for the server's directory (server dead): records found by
 * their header, planted by file or through an nvme tier. */
void ck_fault_server_disk(int n);
/* Flips, truncations and plants in Redis values of (CK_REDIS, slot). */
void ck_fault_redis(int slot, int n);
/* A FIFO / a junk file named like an unused key of (sub, slot)'s dir. */
void ck_plant_fifo(int sub, int slot, char *path, size_t cap);
void ck_plant_junk(int sub, int slot);

/* Intruders: a second process opening a live directory, as `kvtier store`
 * does (a tier, or a cache and a get of every key), as a writer (which
 * must be refused) or read-only (which must work and delete nothing).
 * Returns the child's pid. */
enum ck_intruder { I_TIER, I_CACHE, I_RO_TIER, I_RO_CACHE, CK_NINTRUDER };
pid_t ck_intruder(const char *dir, int kind);

/* ---- the server (campaign_server.c) ---- */

#define CK_SERVER_TIERS_FMT "dram:1MiB;nvme:%s:256MiB"

/* Starts the server in a child (alarm: limit_s) on ck->srv_port (0: any;
 * the child reports it) over ck_e.srv_dir. Returns its pid, or -1 when it
 * did not become ready in time (a failed check). */
pid_t ck_server_start(int limit_s);
/* Asks it to stop (SIGTERM) and waits: its check passes when it exits 0
 * within 25 s (it drains for up to 10 s). */
void ck_server_stop(pid_t pid);
/* Whether kvt_server_create and (if built) kvtier-server refuse an empty
 * tenant token: checks. */
void ck_server_token_checks(void);
/* Whether libfabric's default provider opens on 127.0.0.1 (probed in a
 * child). */
int ck_fabric_available(char *why, size_t cap);

/* ---- hostile clients (campaign_hostile.c) ---- */

/* One hostile step (enum ck_hostile) against the server at ck->srv_port,
 * run in a child; or, for CK_HOSTILE_SERVED + step, the check that a new
 * client (a fabric tier: a new session) is served after that step. */
#define CK_HOSTILE_SERVED 100
void ck_hostile_main(void *arg);

/* ---- a full file system (campaign_fullfs.c) ---- */

/* Mounts a small tmpfs under the run's directory and fills it through nvme
 * tiers and caches on either engine (checks; skipped where mount fails). */
void ck_full_fs_phase(void);

/* ---- the phases (test_campaign.c) ---- */

/* Seconds a phase has: its share of --duration, or the short setting's. */
double ck_phase_budget(double short_s, double share);

#endif
