/* tests/test_campaign.c - the standing reliability campaign (docs/CAMPAIGN.md):
 * the cache, the nvme and redis tiers and kvtier-server driven from several
 * processes with kill -9 and restarts, bit flips, truncations and planted
 * values on disk and in Redis, intruding processes, a full file system and
 * hostile clients, checking after every step that every get returns the
 * bytes last acknowledged or a clean miss, and that nothing acknowledged as
 * durable is lost. Its parts are in tests/campaign/.
 *
 *   test_campaign [--short | --long] [--duration SECONDS] [--seed N]
 *                 [--only TEST-PATTERN] [--verbose] [--trace]
 *
 * --short (the default, what CI runs) takes about 40 s on a loaded 2-core
 * machine; --long runs the phases for --duration seconds (default 300). The seed is printed;
 * --seed N repeats a run's choices (the moment a kill lands varies). The
 * figures at the end can be quoted. Pieces whose environment is missing
 * (redis-server, libfabric's tcp provider, mount(2)) are skipped, saying why. */
#include <errno.h>
#include <ftw.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "campaign/campaign.h"

#ifdef KVT_HAVE_HIREDIS
#include "redis_fixture.h"
#endif

static int64_t t_start;
static const char *phase_now = "setup";
static int have_fabric;
static char fabric_why[CK_NOTE_LEN];

double ck_phase_budget(double short_s, double share) {
  return ck_opt.mode == CK_LONG ? ck_opt.duration_s * share : short_s;
}

/* ---- writers ---- */

static const char *writer_name(int sub, int slot) {
  static char b[64];
  snprintf(b, sizeof(b), "the %s writer %d", ck_sub_name[sub], slot);
  return b;
}

static pid_t writer_start(int sub, int slot, double run_s, int verify_only) {
  ck_writer_arg a = {.sub = sub, .slot = slot, .run_s = run_s, .verify_only = verify_only};
  return ck_spawn(writer_name(sub, slot), (int)run_s + 240, ck_writer_main, &a);
}

/* Whether (sub, slot)'s writer opened its store (its count of opens grew
 * past before) within timeout_ms. */
static int writer_opened(int sub, int slot, uint64_t before, int timeout_ms) {
  const int64_t end = ck_now_ms() + timeout_ms;
  while (__atomic_load_n(&ck->opened[sub][slot], __ATOMIC_SEQ_CST) == before) {
    if (ck_now_ms() > end)
      return 0;
    ck_sleep_ms(20);
  }
  return 1;
}

static void writer_end(pid_t pid, int sub, int slot, int timeout_ms) {
  const int rc = ck_wait(pid, timeout_ms, writer_name(sub, slot));
  ck_check_result("every writer ends normally", rc == 0, "%s ended with %d", writer_name(sub, slot),
                  rc);
}

/* The writers of one store, one per slot, until end_ms. */
typedef struct crew {
  int sub, n;
  pid_t pid[CK_SLOTS];
  uint64_t opened0[CK_SLOTS]; /* ck->opened[sub][slot] before its start */
  int64_t end_ms;
} crew;

static void crew_start(crew *c, int slot) {
  double left = (double)(c->end_ms - ck_now_ms()) / 1000.0;
  c->opened0[slot] = __atomic_load_n(&ck->opened[c->sub][slot], __ATOMIC_SEQ_CST);
  c->pid[slot] = writer_start(c->sub, slot, left > 0.3 ? left : 0.3, 0);
}

static void crew_kill(crew *c, int slot) {
  ck_trace("kill -9 %s", writer_name(c->sub, slot));
  ck_kill9(c->pid[slot], writer_name(c->sub, slot));
  c->pid[slot] = 0;
  CK_ADD(writer_kills, 1);
}

/* Lets the writers end (each checks every key last), then checks every key
 * once more from a fresh process. */
static void crew_finish(crew *c) {
  for (int s = 0; s < c->n; s++)
    if (c->pid[s] > 0)
      writer_end(c->pid[s], c->sub, s, 240000);
  for (int s = 0; s < c->n; s++) {
    const pid_t pid = writer_start(c->sub, s, 0, 1);
    if (pid > 0)
      writer_end(pid, c->sub, s, 240000);
    c->pid[s] = 0;
  }
}

static void pause_random(void) {
  ck_sleep_ms(200 + (int64_t)ck_rand_below(ck_opt.mode == CK_LONG ? 1500 : 600));
}

/* A random pause, then whether a round still fits before end_ms - 400: the
 * writers end at end_ms, and a round begun after the pause without asking
 * could find them gone (an intruder then opened a directory nobody held, and
 * the -EBUSY check failed: seed 2082145424223241842, --short). */
static int pause_then_time_left(int64_t end_ms) {
  pause_random();
  return ck_now_ms() < end_ms - 400;
}

/* ---- phase bookkeeping ---- */

typedef struct snap {
  ck_figs f;
  uint32_t failed;
} snap;

static snap snap_now(void) {
  snap s;
  memcpy(&s.f, (const void *)&ck->f, sizeof(s.f));
  s.failed = ck_checks_failed();
  return s;
}

/* Fails the CMocka test when the phase broke the invariant, a process
 * crashed or hung, or a check failed. */
static void phase_end(const snap *before) {
  const snap a = snap_now();
  const uint64_t wrong = a.f.wrong - before->f.wrong, lost = a.f.lost - before->f.lost;
  const uint64_t crashes = a.f.crashes - before->f.crashes, hangs = a.f.hangs - before->f.hangs;
  const uint32_t failed = a.failed - before->failed;
  printf("campaign: %s: %llu operations, %llu detected corruptions, %llu wrong, %llu lost, "
         "%llu crashes, %llu hangs, %u failed checks (%.1f s into the run)\n",
         phase_now, (unsigned long long)(a.f.ops - before->f.ops),
         (unsigned long long)(a.f.detected - before->f.detected), (unsigned long long)wrong,
         (unsigned long long)lost, (unsigned long long)crashes, (unsigned long long)hangs, failed,
         (double)(ck_now_ms() - t_start) / 1000.0);
  if (wrong || lost || crashes || hangs || failed)
    fail_msg("%s: %llu wrong, %llu lost, %llu crashes, %llu hangs, %u failed checks (see the "
             "lines above)",
             phase_now, (unsigned long long)wrong, (unsigned long long)lost,
             (unsigned long long)crashes, (unsigned long long)hangs, failed);
}

/* ---- stores on a directory: the cache and the nvme tier ---- */

/* Restarts (sub, slot)'s writer on a directory holding a FIFO named like a
 * key: it must open (the FIFO skipped), not hang. */
static void restart_past_a_fifo(crew *c, int slot) {
  char fifo[400];
  ck_plant_fifo(c->sub, slot, fifo, sizeof(fifo));
  const uint64_t before = __atomic_load_n(&ck->opened[c->sub][slot], __ATOMIC_SEQ_CST);
  crew_start(c, slot);
  const int ok = writer_opened(c->sub, slot, before, 10000);
  ck_check_result("the nvme tier opens a directory holding a FIFO named like a key", ok,
                  "%s did not open its store within 10 s (hangs on %s)", writer_name(c->sub, slot),
                  fifo);
  if (!ok) { /* carry on without it */
    crew_kill(c, slot);
    if (fifo[0])
      unlink(fifo);
    crew_start(c, slot);
  }
}

static void disk_round(crew *c, int *fifos) {
  const uint64_t r = ck_rand_below(100);
  if (r < 65) { /* kill -9, faults on disk, restart */
    const int both = ck_rand_below(4) == 0;
    const int first = (int)ck_rand_below((uint64_t)c->n);
    for (int i = 0; i < (both ? c->n : 1); i++) {
      const int slot = both ? i : first;
      crew_kill(c, slot);
      ck_fault_disk(c->sub, slot, 1 + (int)ck_rand_below(4));
      if (ck_rand_below(4) == 0)
        ck_plant_junk(c->sub, slot);
      if (c->sub == CK_NVME && (*fifos == 0 || ck_rand_below(8) == 0)) {
        ++*fifos;
        restart_past_a_fifo(c, slot);
      } else {
        crew_start(c, slot);
      }
    }
  } else { /* a second process opens a live directory, as `kvtier store` does */
    const int slot = (int)ck_rand_below((uint64_t)c->n);
    /* Live: its writer, restarted by an earlier round, has opened it (a
     * writer still starting holds nothing, and an intruder opening first is
     * no fault; such a start once failed the -EBUSY check). */
    if (!writer_opened(c->sub, slot, c->opened0[slot], 10000)) {
      ck_trace("no intruder: %s has not opened its store", writer_name(c->sub, slot));
      return;
    }
    const pid_t pid = ck_intruder(ck_e.dir[c->sub][slot], (int)ck_rand_below(CK_NINTRUDER));
    ck_wait_ok(pid, 60000, "an intruder");
  }
}

static void disk_phase(int sub, double budget_s) {
  crew c = {.sub = sub, .n = 2, .end_ms = ck_now_ms() + (int64_t)(budget_s * 1000)};
  const uint64_t unexpected = ck->f.put_failed_unexpected;
  for (int s = 0; s < c.n; s++)
    crew_start(&c, s);
  int fifos = 0;
  while (ck_now_ms() < c.end_ms - 400) {
    if (!pause_then_time_left(c.end_ms))
      break;
    disk_round(&c, &fifos);
  }
  crew_finish(&c);
  const uint64_t failed = ck->f.put_failed_unexpected - unexpected;
  ck_check_result(sub == CK_CACHE ? "no put or del fails in a cache with room, intruders or not"
                                  : "no put or del fails in an nvme tier with room, intruders or "
                                    "not",
                  failed == 0, "%llu failed (see the notes)", (unsigned long long)failed);
}

static void test_cache_keeps_acknowledged_payloads_through_kill9_flips_and_plants(void **state) {
  (void)state;
  phase_now = "cache over dram and nvme";
  const snap before = snap_now();
  disk_phase(CK_CACHE, ck_phase_budget(3, 0.15));
  phase_end(&before);
}

static void
test_nvme_tier_keeps_acknowledged_values_through_kill9_faults_and_intruders(void **state) {
  (void)state;
  phase_now = "nvme tier";
  const snap before = snap_now();
  disk_phase(CK_NVME, ck_phase_budget(4, 0.2));
  phase_end(&before);
}

/* ---- redis ---- */

static void test_redis_tier_never_returns_flipped_or_planted_values(void **state) {
  (void)state;
  phase_now = "redis tier";
#ifdef KVT_HAVE_HIREDIS
  if (!rfx_have_redis()) {
    ck_check_skip("the redis tier phase ran", "redis-server is not on PATH");
    skip();
  }
  const snap before = snap_now();
  rfx_server rs;
  memset(&rs, 0, sizeof(rs));
  if (rfx_start(&rs) != 0)
    fail_msg("redis-server did not start");
  ck_e.redis_port = rs.port;
  crew c = {.sub = CK_REDIS, .n = 2};
  c.end_ms = ck_now_ms() + (int64_t)(ck_phase_budget(3, 0.15) * 1000);
  for (int s = 0; s < c.n; s++)
    crew_start(&c, s);
  while (ck_now_ms() < c.end_ms - 400) {
    if (!pause_then_time_left(c.end_ms))
      break;
    const int slot = (int)ck_rand_below((uint64_t)c.n);
    crew_kill(&c, slot);
    ck_fault_redis(slot, 1 + (int)ck_rand_below(5));
    crew_start(&c, slot);
  }
  crew_finish(&c);
  rfx_stop(&rs);
  phase_end(&before);
#else
  ck_check_skip("the redis tier phase ran", "built without libhiredis");
  skip();
#endif
}

/* ---- the server ---- */

static void server_round(crew *c, pid_t *srv) {
  const uint64_t r = ck_rand_below(100);
  if (r < 30) {
    const int slot = (int)ck_rand_below((uint64_t)c->n);
    crew_kill(c, slot);
    crew_start(c, slot);
  } else if (r < 75) { /* the server killed -9, its disk damaged, restarted */
    __atomic_store_n(&ck->outage, 1, __ATOMIC_SEQ_CST);
    ck_kill9(*srv, "the server");
    CK_ADD(server_kills, 1);
    ck_fault_server_disk(1 + (int)ck_rand_below(3));
    *srv = ck_server_start((int)(c->end_ms - ck_now_ms()) / 1000 + 300);
    __atomic_store_n(&ck->outage, 0, __ATOMIC_SEQ_CST);
  } else { /* `kvtier store` on the server's live directory */
    const pid_t pid = ck_intruder(ck_e.srv_dir, (int)ck_rand_below(CK_NINTRUDER));
    ck_wait_ok(pid, 60000, "an intruder");
  }
}

static void test_server_keeps_acknowledged_values_through_kill9_and_disk_faults(void **state) {
  (void)state;
  phase_now = "kvtier-server on dram and nvme";
  if (!have_fabric) {
    ck_check_skip("the server phase ran", "%s", fabric_why);
    skip();
  }
  const snap before = snap_now();
  const double budget = ck_phase_budget(5, 0.25);
  __atomic_store_n(&ck->srv_port, 0, __ATOMIC_SEQ_CST);
  pid_t srv = ck_server_start((int)budget + 300);
  if (srv <= 0)
    fail_msg("the server did not start");
  crew c = {.sub = CK_FABRIC, .n = 2, .end_ms = ck_now_ms() + (int64_t)(budget * 1000)};
  for (int s = 0; s < c.n; s++)
    crew_start(&c, s);
  while (ck_now_ms() < c.end_ms - 400 && srv > 0) {
    if (!pause_then_time_left(c.end_ms))
      break;
    server_round(&c, &srv);
  }
  for (int s = 0; s < c.n; s++)
    if (c.pid[s] > 0)
      writer_end(c.pid[s], CK_FABRIC, s, 240000);
  memset(c.pid, 0, sizeof(c.pid));
  ck_server_stop(srv); /* a clean stop, then everything again after a restart */
  srv = ck_server_start(600);
  crew_finish(&c);
  ck_server_stop(srv);
  phase_end(&before);
}

/* ---- hostile clients ---- */

/* Whether the well-behaved client made progress through the step, or does
 * within 15 s. */
static int good_client_progressed(uint64_t before) {
  const int64_t end = ck_now_ms() + 15000;
  while (__atomic_load_n(&ck->ok_ops[CK_FABRIC][2], __ATOMIC_SEQ_CST) < before + 3 &&
         ck_now_ms() < end)
    ck_sleep_ms(20);
  return __atomic_load_n(&ck->ok_ops[CK_FABRIC][2], __ATOMIC_SEQ_CST) >= before + 3;
}

static void hostile_step(int step, pid_t *srv) {
  const int64_t t0 = ck_now_ms();
  const uint64_t before = __atomic_load_n(&ck->ok_ops[CK_FABRIC][2], __ATOMIC_SEQ_CST);
  int arg = step;
  const uint32_t stalled = __atomic_load_n(&ck->stalled_ready, __ATOMIC_SEQ_CST);
  const pid_t pid = ck_spawn(ck_hostile_name[step], 180, ck_hostile_main, &arg);
  if (step == H_STALLED_KILLED) { /* killed -9 once its transfers are stuck */
    for (const int64_t end = ck_now_ms() + 20000;
         __atomic_load_n(&ck->stalled_ready, __ATOMIC_SEQ_CST) == stalled && ck_now_ms() < end;)
      ck_sleep_ms(20);
    ck_sleep_ms(500);
    ck_kill9(pid, "a stalled client");
  } else {
    ck_wait_ok(pid, 180000, ck_hostile_name[step]);
  }
  int status;
  if (waitpid(*srv, &status, WNOHANG) == *srv) {
    ck_check_result("the server survives hostile clients", 0, "it ended (status %d) during %s",
                    status, ck_hostile_name[step]);
    *srv = ck_server_start(600);
  }
  char name[160];
  snprintf(name, sizeof(name), "a well-behaved client keeps working through %s",
           ck_hostile_name[step]);
  const int progressed = good_client_progressed(before);
  ck_check_result(name, progressed, "no progress within 15 s after the step");
  arg = CK_HOSTILE_SERVED + step; /* and a new client is served */
  const uint32_t failed = ck_checks_failed();
  const pid_t check = ck_spawn("a new client", 60, ck_hostile_main, &arg);
  const int served = ck_wait_ok(check, 60000, "a new client") && ck_checks_failed() == failed;
  if (!progressed || !served) { /* so that the next step starts on a server that works */
    ck_note("restarting the server after %s", ck_hostile_name[step]);
    ck_kill9(*srv, "the server");
    CK_ADD(server_kills, 1);
    *srv = ck_server_start(600);
  }
  if (ck_opt.verbose)
    printf("campaign: hostile step '%s' took %lld ms\n", ck_hostile_name[step],
           (long long)(ck_now_ms() - t0));
}

static void test_server_serves_a_well_behaved_client_through_hostile_clients(void **state) {
  (void)state;
  phase_now = "hostile clients";
  if (!have_fabric) {
    ck_check_skip("the hostile-client phase ran", "%s", fabric_why);
    skip();
  }
  const snap before = snap_now();
  const double budget = ck_phase_budget(0, 0.25);
  pid_t srv = ck_server_start((int)budget + 900);
  if (srv <= 0)
    fail_msg("the server did not start");
  const uint64_t opened = ck->opened[CK_FABRIC][2];
  const pid_t good = writer_start(CK_FABRIC, 2, budget + 900, 0);
  if (!writer_opened(CK_FABRIC, 2, opened, 30000))
    fail_msg("the well-behaved client did not connect");
  const int64_t end = ck_now_ms() + (int64_t)(budget * 1000);
  for (int step = 0; step < CK_NHOSTILE; step++)
    hostile_step(step, &srv);
  while (ck_now_ms() < end)
    hostile_step((int)ck_rand_below(CK_NHOSTILE), &srv);
  ck_kill9(good, "the well-behaved client");
  const int64_t gap = ck->max_gap_ms[CK_FABRIC][2];
  ck_check_result("the well-behaved client is never without service for 15 s", gap < 15000,
                  "its longest wait between two successes was %lld ms", (long long)gap);
  /* alice's values (its earlier writer's and this client's) are intact. */
  for (int slot = 0; slot <= 2; slot += 2) {
    const pid_t pid = writer_start(CK_FABRIC, slot, 0, 1);
    if (pid > 0)
      writer_end(pid, CK_FABRIC, slot, 240000);
  }
  ck_server_stop(srv);
  phase_end(&before);
}

/* ---- a full file system, tokens ---- */

static void test_a_full_file_system_is_enospc_and_the_cache_makes_room(void **state) {
  (void)state;
  phase_now = "full file system";
  const snap before = snap_now();
  ck_full_fs_phase();
  phase_end(&before);
}

static void test_a_server_refuses_empty_tenant_tokens(void **state) {
  (void)state;
  phase_now = "tenant tokens";
  if (!have_fabric) {
    ck_check_skip("kvt_server_create refuses a tenant with an empty token", "%s", fabric_why);
    skip();
  }
  const snap before = snap_now();
  ck_server_token_checks();
  phase_end(&before);
}

/* ---- the report ---- */

static void print_figures(void) {
  const ck_figs *f = &ck->f;
  const double secs = (double)(ck_now_ms() - t_start) / 1000.0;
  uint64_t faults = 0, hostile = 0;
  for (int i = 0; i < CK_NFAULT; i++)
    faults += f->faults[i];
  for (int i = 0; i < CK_NHOSTILE; i++)
    hostile += f->hostile[i];
  printf("\ncampaign figures (%s, seed %llu, %.1f s):\n", ck_opt.mode == CK_LONG ? "long" : "short",
         (unsigned long long)ck_opt.seed, secs);
  printf("  operations              %llu (puts %llu, gets %llu, dels %llu)\n",
         (unsigned long long)f->ops, (unsigned long long)f->puts, (unsigned long long)f->gets,
         (unsigned long long)f->dels);
  printf("  faults injected         %llu\n", (unsigned long long)faults);
  for (int i = 0; i < CK_NFAULT; i++)
    if (f->faults[i])
      printf("    %-30s %llu\n", ck_fault_name[i], (unsigned long long)f->faults[i]);
  printf("  detected corruptions    %llu (faults that read back as a clean miss or error)\n",
         (unsigned long long)f->detected);
  printf("  harmless faults         %llu (the value read back exact: a flip in padding)\n",
         (unsigned long long)f->harmless);
  printf("  wrong bytes             %llu (must be 0)\n", (unsigned long long)f->wrong);
  printf("  lost acknowledged       %llu (must be 0)\n", (unsigned long long)f->lost);
  printf("  unanswered gets         %llu\n", (unsigned long long)f->unanswered);
  printf("  failed puts and dels    %llu expected (server down), %llu unexpected\n",
         (unsigned long long)f->put_failed_expected, (unsigned long long)f->put_failed_unexpected);
  printf("  hostile connections     %llu\n", (unsigned long long)hostile);
  for (int i = 0; i < CK_NHOSTILE; i++)
    if (f->hostile[i])
      printf("    %-30s %llu\n", ck_hostile_name[i], (unsigned long long)f->hostile[i]);
  printf("  writers                 %llu started, %llu killed -9\n",
         (unsigned long long)f->writer_starts, (unsigned long long)f->writer_kills);
  printf("  server                  %llu starts, %llu killed -9, %llu clean stops\n",
         (unsigned long long)f->server_starts, (unsigned long long)f->server_kills,
         (unsigned long long)f->clean_stops);
  printf("  intruders               %llu (%llu got the directory open)\n",
         (unsigned long long)f->intruders, (unsigned long long)f->intruder_opened);
  printf("  crashes, hangs          %llu, %llu\n", (unsigned long long)f->crashes,
         (unsigned long long)f->hangs);
  printf("  duration                %.1f s\n", secs);
  uint32_t passed = 0, failed = 0, skipped = 0;
  printf("  checks:\n");
  for (uint32_t i = 0; i < ck->n_checks; i++) {
    const ck_check *c = &ck->checks[i];
    const char *verdict = c->failed ? "FAIL" : c->passed ? "pass" : "skip";
    printf("    %s  %s (%u passed, %u failed%s%s)\n", verdict, c->name, c->passed, c->failed,
           c->failed || (!c->passed && c->skipped) ? ": " : "",
           c->failed || (!c->passed && c->skipped) ? c->detail : "");
    passed += !c->failed && c->passed;
    failed += c->failed > 0;
    skipped += !c->failed && !c->passed;
  }
  printf("  checks                  %u passed, %u failed, %u skipped\n", passed, failed, skipped);
  fflush(stdout);
}

/* ---- setup ---- */

static int rm_cb(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(path);
}

static void on_watchdog(int sig) {
  (void)sig;
  static const char msg[] = "campaign: HANG: the run passed its time limit; ending it\n";
  ssize_t w = write(2, msg, sizeof(msg) - 1);
  (void)w;
  ck_reap_all();
  _exit(1);
}

static int group_setup(void **state) {
  (void)state;
  const char *base = getenv("TMPDIR");
  snprintf(ck_e.root, sizeof(ck_e.root), "%s/kvt_campaign_XXXXXX", base ? base : "/tmp");
  if (!mkdtemp(ck_e.root))
    return -1;
  for (int sub = 0; sub < CK_NSUB; sub++)
    for (int s = 0; s < CK_SLOTS; s++)
      snprintf(ck_e.dir[sub][s], sizeof(ck_e.dir[sub][s]), "%s/%s%d", ck_e.root, ck_sub_name[sub],
               s);
  snprintf(ck_e.srv_dir, sizeof(ck_e.srv_dir), "%s/server", ck_e.root);
  ck_e.nvme_size = "256MiB";
  have_fabric = ck_fabric_available(fabric_why, sizeof(fabric_why));
  if (!have_fabric)
    printf("campaign: the server phases will be skipped: %s\n", fabric_why);
  return 0;
}

static int group_teardown(void **state) {
  (void)state;
  ck_reap_all();
  print_figures();
  nftw(ck_e.root, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
  return 0;
}

static int usage(void) {
  fprintf(stderr, "usage: test_campaign [--short | --long] [--duration SECONDS] [--seed N]\n"
                  "                     [--only TEST-PATTERN] [--verbose] [--trace]\n");
  return 2;
}

static int parse_args(int argc, char **argv) {
  ck_opt.mode = CK_SHORT;
  ck_opt.duration_s = 300;
  int seeded = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--short")) {
      ck_opt.mode = CK_SHORT;
    } else if (!strcmp(a, "--long")) {
      ck_opt.mode = CK_LONG;
    } else if (!strcmp(a, "--duration") && i + 1 < argc) {
      ck_opt.mode = CK_LONG;
      ck_opt.duration_s = atof(argv[++i]);
      if (ck_opt.duration_s < 10)
        return usage();
    } else if (!strcmp(a, "--seed") && i + 1 < argc) {
      ck_opt.seed = strtoull(argv[++i], NULL, 0);
      seeded = 1;
    } else if (!strcmp(a, "--verbose")) {
      ck_opt.verbose = 1;
    } else if (!strcmp(a, "--trace")) {
      ck_opt.trace = 1;
    } else if (!strcmp(a, "--only") && i + 1 < argc) {
      cmocka_set_test_filter(argv[++i]);
    } else {
      return usage();
    }
  }
  if (!seeded && getrandom(&ck_opt.seed, sizeof(ck_opt.seed), 0) != (ssize_t)sizeof(ck_opt.seed))
    ck_opt.seed = (uint64_t)time(NULL) ^ (uint64_t)getpid() << 32;
  return 0;
}

int main(int argc, char **argv) {
  if (parse_args(argc, argv) != 0)
    return 2;
  ck = mmap(NULL, sizeof(*ck), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (ck == MAP_FAILED)
    return 1;
  memset(ck, 0, sizeof(*ck));
  ck->seed = ck_opt.seed;
  ck->nkeys = ck_opt.mode == CK_LONG ? CK_KEYS : 40;
  ck_reseed(ck_opt.seed);
  for (int s = 0; s < CK_SLOTS; s++)
    for (uint32_t i = 0; i < CK_KEYS; i++) {
      const uint32_t tok[4] = {(uint32_t)ck_opt.seed, (uint32_t)(ck_opt.seed >> 32), (uint32_t)s,
                               i};
      kvt_chunk_key(ck_fingerprint(), NULL, tok, 4, &ck->cache_keys[s][i]);
    }
  printf("campaign: seed %llu (repeat with --seed %llu), %s setting%s\n",
         (unsigned long long)ck_opt.seed, (unsigned long long)ck_opt.seed,
         ck_opt.mode == CK_LONG ? "long" : "short", ck_opt.mode == CK_LONG ? "" : " (--short)");
  if (ck_opt.mode == CK_LONG)
    printf("campaign: --duration %.0f s\n", ck_opt.duration_s);
  fflush(stdout);
  signal(SIGPIPE, SIG_IGN);
  signal(SIGALRM, on_watchdog);
  alarm(ck_opt.mode == CK_LONG ? (unsigned)ck_opt.duration_s + 900 : 400);
  t_start = ck_now_ms();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cache_keeps_acknowledged_payloads_through_kill9_flips_and_plants),
      cmocka_unit_test(test_nvme_tier_keeps_acknowledged_values_through_kill9_faults_and_intruders),
      cmocka_unit_test(test_redis_tier_never_returns_flipped_or_planted_values),
      cmocka_unit_test(test_server_keeps_acknowledged_values_through_kill9_and_disk_faults),
      cmocka_unit_test(test_server_serves_a_well_behaved_client_through_hostile_clients),
      cmocka_unit_test(test_a_full_file_system_is_enospc_and_the_cache_makes_room),
      cmocka_unit_test(test_a_server_refuses_empty_tenant_tokens),
  };
  const int failed =
      cmocka_run_group_tests_name("reliability campaign", tests, group_setup, group_teardown);
  munmap(ck, sizeof(*ck));
  return failed ? 1 : 0;
}
