/* tests/test_server_program.c - the kvtier-server program end to end, run
 * as a child process on 127.0.0.1 (tests/fixtures/server_fixture.c): its options,
 * exit codes and messages, the ready line, SIGTERM and SIGINT (exit 0, and a
 * restart finds the NVMe values), kill -9 in the middle of a run never
 * yields wrong bytes and the clients recover, --stats as Prometheus text.
 * The engine's behaviour is tested in process (test_server.c and
 * test_server_reserve.c). Skips (77) without kvtier-server (a build without
 * programs, such as the TSan one) or the provider. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvtier.h"
#include "server_fixture.h"
#include "tier_test_util.h"

static kvt_ctx *ctx;

static int open_tier(const srv_fixture *f, const char *tenant, const char *token, int timeout_ms,
                     kvt_tier **t) {
  char spec[256];
  srv_spec(f, spec, sizeof(spec), tenant, token, timeout_ms, NULL);
  return kvt_tier_open(ctx, spec, t);
}

static kvt_key key_of(uint32_t a, uint32_t b) {
  kvt_key k;
  memset(&k, 0x3C, sizeof(k));
  memcpy(k.bytes, &a, 4);
  memcpy(k.bytes + 4, &b, 4);
  return k;
}

typedef struct seen {
  int n;
  kvt_key keys[16];
} seen;

static int collect(void *opaque, const kvt_key *key, uint64_t len) {
  seen *s = opaque;
  (void)len;
  if (s->n < 16)
    s->keys[s->n] = *key;
  s->n++;
  return 0;
}

static int run_stats_cli(const srv_fixture *f, char *out, size_t cap) {
  char cmd[512];
  snprintf(cmd, sizeof(cmd), "%s --stats 127.0.0.1:%d", SRV_BIN, f->port);
  FILE *p = popen(cmd, "r");
  if (!p)
    return -1;
  const size_t n = fread(out, 1, cap - 1, p);
  out[n] = 0;
  return pclose(p);
}

static uint64_t prom_value(const char *text, const char *name) {
  char pat[128];
  snprintf(pat, sizeof(pat), "\n%s ", name);
  const char *at = strstr(text, pat);
  return at ? strtoull(at + strlen(pat), NULL, 10) : UINT64_MAX;
}

/* ---- stats ---- */

static void test_stats_request_and_prometheus_text(void **state) {
  (void)state;
  srv_fixture f = {.binary = 1};
  srv_set_args(&f, "--tiers", "dram:8MiB", NULL);
  srv_start_or_fail(&f);
  kvt_tier *t;
  assert_int_equal(open_tier(&f, "default", "", 3000, &t), 0);
  uint8_t v[5000];
  fill(v, sizeof(v), 9);
  for (uint32_t i = 0; i < 3; i++) {
    const kvt_key k = key_of(3, i);
    assert_int_equal(kvt_tier_put(t, &k, v, sizeof(v)), 0);
  }
  kvt_tier_stats s = {.struct_size = sizeof(s)};
  assert_int_equal(kvt_tier_stats_get(t, &s), 0);
  assert_int_equal(s.capacity, 8u << 20);
  assert_int_equal(s.items, 3);
  assert_true(s.used >= 3 * sizeof(v));
  static char text[16384];
  assert_int_equal(run_stats_cli(&f, text, sizeof(text)), 0);
  assert_non_null(strstr(text, "# TYPE kvtier_server_puts_total counter\n"));
  assert_non_null(strstr(text, "# TYPE kvtier_server_capacity_bytes gauge\n"));
  assert_int_equal(prom_value(text, "kvtier_server_puts_total"), 3);
  assert_int_equal(prom_value(text, "kvtier_server_capacity_bytes"), 8u << 20);
  assert_int_equal(prom_value(text, "kvtier_server_sessions"), 2); /* the tier's and --stats' */
  kvt_tier_close(t);
  srv_stop_cleanly(&f, 20);
}

/* ---- shutdown, restart, kill -9 ---- */

static void test_sigterm_exits_0_and_a_restart_has_the_nvme_values(void **state) {
  (void)state;
  char dir[256], tiers[400];
  assert_int_equal(srv_mkdtemp(dir, sizeof(dir)), 0);
  snprintf(tiers, sizeof(tiers), "dram:1MiB;nvme:%s:64MiB", dir);
  srv_fixture f = {.binary = 1};
  srv_set_args(&f, "--tiers", tiers, "--tenant", "alice:alice-token-0123456", "--tenant",
               "bob:bob-token-0123456789", NULL);
  srv_start_or_fail(&f);
  kvt_tier *t, *u;
  assert_int_equal(open_tier(&f, "alice", "alice-token-0123456", 3000, &t), 0);
  assert_int_equal(open_tier(&f, "bob", "bob-token-0123456789", 3000, &u), 0);
  enum { N = 20, SZ = 300 * 1024 }; /* more than the DRAM tier holds */
  uint8_t *v = malloc(SZ), *got = malloc(SZ);
  assert_true(v && got);
  for (uint32_t i = 0; i < N; i++) {
    const kvt_key k = key_of(4, i);
    fill(v, SZ - i, i);
    assert_int_equal(kvt_tier_put(t, &k, v, SZ - i), 0);
  }
  const kvt_key kb = key_of(4, 0);
  assert_int_equal(kvt_tier_put(u, &kb, v, 10), 0);
  kvt_tier_close(t);
  kvt_tier_close(u);
  srv_stop_cleanly(&f, 20);
  srv_start_or_fail(&f); /* same port, same directory */
  assert_int_equal(open_tier(&f, "alice", "alice-token-0123456", 3000, &t), 0);
  for (uint32_t i = 0; i < N; i++) {
    const kvt_key k = key_of(4, i);
    uint64_t len = 0;
    fill(v, SZ - i, i);
    assert_int_equal(kvt_tier_get(t, &k, got, SZ, &len), 0);
    assert_int_equal(len, SZ - i);
    assert_memory_equal(got, v, len);
  }
  seen s = {0};
  assert_int_equal(kvt_tier_list(t, collect, &s), 0); /* owners come back from the records */
  assert_int_equal(s.n, N);
  kvt_tier_stats st = {.struct_size = sizeof(st)};
  assert_int_equal(kvt_tier_stats_get(t, &st), 0);
  assert_int_equal(st.items, N);
  kvt_tier_close(t);
  srv_stop_cleanly(&f, 20);
  srv_rmdir(dir);
  free(v);
  free(got);
}

#define K_THREADS 4
#define K_KEYS 16
#define K_MAX (64 * 1024)
#define K_HEAD 16

typedef struct killer {
  char spec[256];
  uint32_t id;
  atomic_int *stop;
  atomic_uint *max_version; /* [K_KEYS] per thread: the highest version put (attempted) */
  uint64_t ok_before, ok_after, errors, misses;
  atomic_int *phase; /* 0 before the kill, 1 after the restart */
  const char *wrong;
  int64_t longest_ms;
} killer;

static uint64_t k_len(uint32_t id, uint32_t key, uint32_t ver) {
  return K_HEAD + ((uint64_t)id * 7717 + key * 131 + ver * 977) % (K_MAX - K_HEAD);
}

static void k_value(uint8_t *p, uint32_t id, uint32_t key, uint32_t ver) {
  const uint64_t n = k_len(id, key, ver);
  memcpy(p, &id, 4);
  memcpy(p + 4, &key, 4);
  memcpy(p + 8, &ver, 4);
  memset(p + 12, 0, 4);
  fill(p + K_HEAD, n - K_HEAD, ((uint64_t)id << 40) | ((uint64_t)key << 20) | ver);
}

static int64_t ms_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* What a GET returned must be exactly one version ever put for that key. */
static const char *k_check(const killer *w, uint32_t key, const uint8_t *got, uint64_t len,
                           uint8_t *scratch) {
  uint32_t id, k, ver;
  if (len < K_HEAD)
    return "short value";
  memcpy(&id, got, 4);
  memcpy(&k, got + 4, 4);
  memcpy(&ver, got + 8, 4);
  if (id != w->id || k != key || ver > atomic_load(&w->max_version[key]))
    return "a value of another key, thread or a version never put";
  if (len != k_len(id, k, ver))
    return "wrong length for its version";
  k_value(scratch, id, k, ver);
  return memcmp(scratch, got, len) == 0 ? NULL : "bytes differ from what was put";
}

static void *killer_main(void *arg) {
  killer *w = arg;
  kvt_tier *t = NULL;
  uint8_t *v = malloc(K_MAX), *got = malloc(K_MAX), *scratch = malloc(K_MAX);
  uint32_t ver[K_KEYS] = {0};
  kvt_ctx *own = NULL;
  int rc = kvt_ctx_create(NULL, &own);
  for (int i = 0; rc == 0 && i < 20; i++) { /* timeout_ms is short: a slow start may miss it */
    if ((rc = kvt_tier_open(own, w->spec, &t)) == 0)
      break;
    if (i < 19)
      rc = 0, nanosleep(&(struct timespec){0, 250000000}, NULL);
  }
  if (rc || !v || !got || !scratch) {
    w->wrong = "open";
    goto out;
  }
  for (uint32_t it = 0; !atomic_load(w->stop) && !w->wrong; it++) {
    const uint32_t key = (it / 2) % K_KEYS; /* a PUT of a key, then a GET of it */
    const kvt_key k = key_of(200 + w->id, key);
    const int64_t t0 = ms_now();
    if (it % 2 == 0) {
      const uint32_t nv = ++ver[key];
      atomic_store(&w->max_version[key], nv);
      k_value(v, w->id, key, nv);
      rc = kvt_tier_put(t, &k, v, k_len(w->id, key, nv));
    } else {
      uint64_t len = 0;
      rc = kvt_tier_get(t, &k, got, K_MAX, &len);
      if (rc == 0)
        w->wrong = k_check(w, key, got, len, scratch);
      w->misses += rc == KVT_ENOTFOUND;
    }
    const int64_t took = ms_now() - t0;
    if (took > w->longest_ms)
      w->longest_ms = took;
    if (rc == 0)
      __atomic_fetch_add(atomic_load(w->phase) ? &w->ok_after : &w->ok_before, 1,
                         __ATOMIC_RELAXED); /* the main thread watches ok_before */
    else if (rc != KVT_ENOTFOUND) {
      w->errors++;
      struct timespec ts = {0, 20000000};
      nanosleep(&ts, NULL);
    }
  }
out:
  kvt_tier_close(t);
  kvt_ctx_destroy(own);
  free(v);
  free(got);
  free(scratch);
  return NULL;
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static void test_kill9_mid_run_never_returns_wrong_bytes_and_clients_recover(void **state) {
  (void)state;
  char dir[256], tiers[400];
  assert_int_equal(srv_mkdtemp(dir, sizeof(dir)), 0);
  snprintf(tiers, sizeof(tiers), "dram:4MiB;nvme:%s:256MiB", dir);
  srv_fixture f = {.binary = 1};
  srv_set_args(&f, "--tiers", tiers, NULL);
  srv_start_or_fail(&f);
  atomic_int stop = 0, phase = 0;
  static atomic_uint maxv[K_THREADS][K_KEYS];
  killer w[K_THREADS];
  pthread_t th[K_THREADS];
  for (uint32_t i = 0; i < K_THREADS; i++) {
    w[i] = (killer){.id = i, .stop = &stop, .max_version = maxv[i], .phase = &phase};
    srv_spec(&f, w[i].spec, sizeof(w[i].spec), "default", "", 1000, NULL);
    assert_int_equal(pthread_create(&th[i], NULL, killer_main, &w[i]), 0);
  }
  /* Kill once every client is well under way (slow builds take longer). */
  for (int i = 0, all = 0; i < 300 && !all; i++) {
    sleep_ms(100);
    all = i >= 15;
    for (int j = 0; j < K_THREADS; j++)
      all = all && __atomic_load_n(&w[j].ok_before, __ATOMIC_RELAXED) >= 20;
  }
  srv_kill9(&f);
  sleep_ms(1500); /* every client sees the server gone */
  srv_start_or_fail(&f);
  atomic_store(&phase, 1);
  sleep_ms(3000);
  atomic_store(&stop, 1);
  for (int i = 0; i < K_THREADS; i++)
    pthread_join(th[i], NULL);
  for (int i = 0; i < K_THREADS; i++) {
    print_message("client %d: %llu ok before the kill, %llu after the restart, %llu errors, "
                  "%llu misses, longest op %lld ms\n",
                  i, (unsigned long long)w[i].ok_before, (unsigned long long)w[i].ok_after,
                  (unsigned long long)w[i].errors, (unsigned long long)w[i].misses,
                  (long long)w[i].longest_ms);
    if (w[i].wrong)
      fail_msg("client %d: %s", i, w[i].wrong);
    if (w[i].ok_before == 0 || w[i].ok_after == 0)
      fail_msg("client %d: %llu ops ok before the kill, %llu after the restart", i,
               (unsigned long long)w[i].ok_before, (unsigned long long)w[i].ok_after);
    if (w[i].longest_ms > 5000) /* timeout_ms=1000 bounds every wait */
      fail_msg("client %d: an op took %lld ms", i, (long long)w[i].longest_ms);
  }
  srv_stop_cleanly(&f, 20);
  srv_rmdir(dir);
}

/* ---- options, exit codes, the ready line, signals ---- */

/* Runs kvtier-server with args (a shell word list), stdout and stderr into
 * out; returns its exit status (137: killed after 20 s, a server that
 * started serving where it should have refused). */
static int run_cli(const char *args, char *out, size_t cap) {
  char cmd[1024];
  snprintf(cmd, sizeof(cmd), "timeout -s KILL 20 %s %s 2>&1", SRV_BIN, args);
  FILE *p = popen(cmd, "r");
  if (!p)
    return -1;
  const size_t n = fread(out, 1, cap - 1, p);
  out[n] = 0;
  const int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_bad_options_exit_2_with_a_message(void **state) {
  (void)state;
  static const struct {
    const char *args, *msg;
  } bad[] = {
      {"--bogus x", "kvtier-server: unknown option '--bogus' (see --help)\n"},
      {"--listen", "kvtier-server: --listen: missing value (or unknown option; see --help)\n"},
      {"--listen nowhere", "kvtier-server: --listen 'nowhere': expected HOST:PORT\n"},
      {"--tenant alice", "kvtier-server: --tenant: 'alice': expected NAME:TOKEN\n"},
      {"--tenant 'a b:x'", "kvtier-server: --tenant: tenant 'a b': 1-64 of [A-Za-z0-9._-]\n"},
      {"--tenant a:x-0123456789abcdef --tenant a:y-0123456789abcdef",
       "kvtier-server: --tenant: tenant 'a' given twice\n"},
      /* what `--tenant prefill:$(cat FILE)` gives when FILE is missing */
      {"--tenant prefill:",
       "kvtier-server: --tenant: tenant 'prefill': empty token (a token is 16 to 128 bytes)\n"},
      {"--tenant prefill:0123456789abcde",
       "kvtier-server: --tenant: tenant 'prefill': token of 15 bytes (a token is 16 to 128 "
       "bytes)\n"},
      {"--listen 0.0.0.0:0 --tiers dram:1MiB",
       "kvtier-server: --listen 0.0.0.0:0 is not loopback and no --tenant is given: the tenant "
       "\"default\" has no token, so anyone who reaches it could read and write every value; "
       "give --tenant NAME:TOKEN (or --insecure)\n"},
      {"--workers 0", "kvtier-server: --workers '0': 1 to 256\n"},
      {"--evict some", "kvtier-server: --evict 'some': lru or none\n"},
      {"--max-request 0", "kvtier-server: --max-request '0': expected a size, e.g. 64MiB\n"},
      {"--stats nowhere", "kvtier-server: --stats 'nowhere': expected HOST:PORT\n"},
      {"--tenants /nonexistent/t",
       "kvtier-server: --tenants /nonexistent/t: No such file or directory\n"},
  };
  static char out[8192];
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    assert_int_equal(run_cli(bad[i].args, out, sizeof(out)), 2);
    if (strcmp(out, bad[i].msg) != 0)
      fail_msg("%s: said '%s', expected '%s'", bad[i].args, out, bad[i].msg);
  }
  assert_int_equal(run_cli("--help", out, sizeof(out)), 0);
  assert_non_null(strstr(out, "usage: kvtier-server [options]\n"));
  assert_non_null(strstr(out, "  --stats HOST:PORT       print a running server's counters"));
  /* A tier that does not open: exit 1, the tier named. */
  assert_int_equal(run_cli("--listen 127.0.0.1:0 --tiers bogus:1 --quiet", out, sizeof(out)), 1);
  assert_non_null(strstr(out, "kvtier-server: tier 'bogus:1': "));
  /* No server there: --stats exits 1, saying so. */
  assert_int_equal(run_cli("--stats 127.0.0.1:1", out, sizeof(out)), 1);
  assert_string_equal(out, "kvtier-server --stats 127.0.0.1:1: nothing is listening (connection "
                           "refused)\n");
}

static void test_empty_token_lines_in_a_tenants_file_are_refused(void **state) {
  (void)state;
  char dir[256], path[300], args[400];
  assert_int_equal(srv_mkdtemp(dir, sizeof(dir)), 0);
  snprintf(path, sizeof(path), "%s/tenants", dir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs("# two tenants\nprefill:0123456789abcdef0123\ndecode:\n", f);
  fclose(f);
  snprintf(args, sizeof(args), "--listen 127.0.0.1:0 --tenants %s", path);
  static char out[4096], want[600];
  const int st = run_cli(args, out, sizeof(out));
  unlink(path);
  srv_rmdir(dir);
  assert_int_equal(st, 2);
  snprintf(want, sizeof(want),
           "kvtier-server: %s:3: tenant 'decode': empty token (a token is 16 to 128 bytes)\n",
           path);
  assert_string_equal(out, want);
}

/* A --tenants file that names no tenant is refused rather than read as "no
 * --tenant" (the tokenless default tenant), and a comment of any length
 * stays a comment: a long one's tail is not read as a tenant line. */
static void test_tenants_files_without_tenants_or_with_long_comments(void **state) {
  (void)state;
  char dir[256], path[300], args[400];
  assert_int_equal(srv_mkdtemp(dir, sizeof(dir)), 0);
  snprintf(path, sizeof(path), "%s/tenants", dir);
  static char out[4096], want[600];
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs("# tokens come later\n\n", f);
  fclose(f);
  snprintf(args, sizeof(args), "--listen 127.0.0.1:0 --tiers dram:1MiB --tenants %s", path);
  assert_int_equal(run_cli(args, out, sizeof(out)), 2);
  snprintf(want, sizeof(want), "kvtier-server: --tenants %s: no NAME:TOKEN line\n", path);
  assert_string_equal(out, want);
  /* a commented-out tenant past the 511th byte of a comment */
  f = fopen(path, "w");
  assert_non_null(f);
  fputs("# ", f);
  for (int i = 0; i < 600; i++)
    fputc('x', f);
  fputs("old:0123456789abcdefOLD\n", f);
  fclose(f);
  assert_int_equal(run_cli(args, out, sizeof(out)), 2);
  assert_string_equal(out, want);
  unlink(path);
  srv_rmdir(dir);
}

/* Without libfabric.so.1 (a file of that name that does not load, first in
 * the search path), the server says so and exits 1 before a tier opens:
 * libkvtier loads it on first use instead of linking it. */
static void test_a_missing_libfabric_is_a_clear_start_up_error(void **state) {
  (void)state;
  char dir[256], path[300], cmd[1024];
  assert_int_equal(srv_mkdtemp(dir, sizeof(dir)), 0);
  snprintf(path, sizeof(path), "%s/libfabric.so.1", dir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs("not a shared object\n", f);
  fclose(f);
  snprintf(cmd, sizeof(cmd),
           "LD_LIBRARY_PATH=%s timeout -s KILL 20 %s --listen 127.0.0.1:0 --tiers "
           "nvme:%s/store:1MiB --quiet 2>&1",
           dir, SRV_BIN, dir);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  static char out[4096];
  const size_t n = fread(out, 1, sizeof(out) - 1, p);
  out[n] = 0;
  const int st = pclose(p);
  char store[300];
  snprintf(store, sizeof(store), "%s/store", dir);
  const int store_made = access(store, F_OK) == 0;
  unlink(path);
  srv_rmdir(dir);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 1)
    fail_msg("exit status %d, said '%s'", st, out);
  if (!strstr(out, "kvtier-server: libfabric.so.1 not found: "))
    fail_msg("said '%s'", out);
  assert_false(store_made); /* refused before the nvme tier opened */
}

/* Reads the child's lines until one contains want or 15 s pass. */
static int read_until(FILE *in, const char *want, char *line, size_t cap) {
  while (fgets(line, (int)cap, in))
    if (strstr(line, want))
      return 0;
  return -1;
}

/* Starts kvtier-server with listen and extra (NULL or one more option),
 * stdout and stderr into *in. */
static pid_t spawn_server(const char *listen, const char *extra, FILE **in) {
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  const pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    close(fds[0]);
    close(fds[1]);
    execl(SRV_BIN, SRV_BIN, "--listen", listen, "--tiers", "dram:8MiB", extra, (char *)NULL);
    _exit(127);
  }
  close(fds[1]);
  *in = fdopen(fds[0], "r");
  assert_non_null(*in);
  return pid;
}

static void test_ready_line_and_sigint_exit_0(void **state) {
  (void)state;
  /* Not --quiet: the lines an operator sees, on stderr and stdout. */
  FILE *in = NULL;
  const pid_t pid = spawn_server("127.0.0.1:0", NULL, &in);
  char line[512];
  assert_int_equal(read_until(in, "no --tenant given", line, sizeof(line)), 0);
  assert_string_equal(line,
                      "kvtier-server: no --tenant given: one tenant, \"default\", empty token\n");
  assert_int_equal(read_until(in, "ready on", line, sizeof(line)), 0);
  unsigned port = 0;
  char prov[64] = "";
  assert_int_equal(sscanf(line,
                          "kvtier-server: ready on 127.0.0.1:%u (provider %63[^,], 1 tenants)",
                          &port, prov),
                   2);
  assert_true(port > 0 && port < 65536);
  assert_non_null(strstr(prov, "tcp"));
  kill(pid, SIGINT);
  assert_int_equal(read_until(in, "stopped", line, sizeof(line)), 0);
  assert_string_equal(line, "kvtier-server: stopped\n");
  fclose(in);
  int st = 0;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 0);
}

/* Without a tenant, any address but loopback takes --insecure (refused
 * without it: test_bad_options_exit_2_with_a_message). */
static void test_insecure_serves_the_tokenless_tenant_on_any_address(void **state) {
  (void)state;
  FILE *in = NULL;
  const pid_t pid = spawn_server("0.0.0.0:0", "--insecure", &in);
  char line[512];
  assert_int_equal(read_until(in, "no --tenant given", line, sizeof(line)), 0);
  assert_string_equal(line, "kvtier-server: no --tenant given: one tenant, \"default\", empty "
                            "token (--insecure: anyone who reaches the server may use it)\n");
  assert_int_equal(read_until(in, "ready on", line, sizeof(line)), 0);
  assert_non_null(strstr(line, "kvtier-server: ready on 0.0.0.0:"));
  kill(pid, SIGTERM);
  int st = 0;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  fclose(in);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 0);
}

static int setup(void **state) {
  (void)state;
  return kvt_ctx_create(NULL, &ctx);
}

static int teardown(void **state) {
  (void)state;
  kvt_ctx_destroy(ctx);
  return 0;
}

int main(void) {
  if (!srv_can_run_binary())
    return 77;
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bad_options_exit_2_with_a_message),
      cmocka_unit_test(test_empty_token_lines_in_a_tenants_file_are_refused),
      cmocka_unit_test(test_tenants_files_without_tenants_or_with_long_comments),
      cmocka_unit_test(test_a_missing_libfabric_is_a_clear_start_up_error),
      cmocka_unit_test_teardown(test_ready_line_and_sigint_exit_0, srv_kill_leftovers),
      cmocka_unit_test_teardown(test_insecure_serves_the_tokenless_tenant_on_any_address,
                                srv_kill_leftovers),
      cmocka_unit_test_teardown(test_stats_request_and_prometheus_text, srv_kill_leftovers),
      cmocka_unit_test_teardown(test_sigterm_exits_0_and_a_restart_has_the_nvme_values,
                                srv_kill_leftovers),
      cmocka_unit_test_teardown(test_kill9_mid_run_never_returns_wrong_bytes_and_clients_recover,
                                srv_kill_leftovers),
  };
  return cmocka_run_group_tests_name("kvtier-server program", tests, setup, teardown);
}
