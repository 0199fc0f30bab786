/* tests/campaign/campaign_server.c - the campaign's kvtier-server: the
 * engine of kvtier/server.h in a child process of its own (so it can be
 * killed -9 and restarted on the same directory and port), over a DRAM tier
 * in front of an NVMe tier that holds everything; and the checks of what a
 * server must refuse to start with. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "campaign.h"

#ifdef KVT_HAVE_FABRIC
#include "kvt_transport.h"
#endif

#define SERVER_BIN KVT_BINARY_DIR "/programs/kvtier-server"

static kvt_server *srv;
static volatile sig_atomic_t stop_asked;

static void on_term(int sig) {
  (void)sig;
  stop_asked = 1;
  if (srv)
    kvt_server_stop(srv); /* async-signal-safe */
}

static void log_line(void *opaque, int level, const char *msg) {
  (void)opaque, (void)level;
  fprintf(stderr, "campaign: [server] %s\n", msg);
}

static void server_child(void *arg) {
  (void)arg;
  signal(SIGTERM, on_term);
  char tiers[400], port[16], specs[CK_SLOTS][200];
  const char *tenants[CK_SLOTS];
  size_t nt = 0;
  for (int i = 0; i < CK_SLOTS; i++) { /* distinct names (slot 2 is alice again) */
    int seen = 0;
    for (int j = 0; j < i; j++)
      seen |= strcmp(ck_tenant[i], ck_tenant[j]) == 0;
    if (!seen) {
      snprintf(specs[nt], sizeof(specs[nt]), "%s:%s", ck_tenant[i], ck_token[i]);
      tenants[nt] = specs[nt];
      nt++;
    }
  }
  snprintf(tiers, sizeof(tiers), CK_SERVER_TIERS_FMT, ck_e.srv_dir);
  snprintf(port, sizeof(port), "%d", __atomic_load_n(&ck->srv_port, __ATOMIC_SEQ_CST));
  kvt_server_config cfg = KVT_SERVER_CONFIG_INIT;
  cfg.listen_host = "127.0.0.1";
  cfg.listen_port = port;
  cfg.tiers = tiers;
  cfg.tenants = tenants;
  cfg.n_tenants = nt;
  cfg.workers = 2;
  cfg.log = log_line;
  cfg.log_level = KVT_LOG_ERROR;
  kvt_ctx *ctx = NULL;
  int rc = kvt_ctx_create(NULL, &ctx);
  /* The port of a killed server may take a moment to be free again. */
  const int64_t end = ck_now_ms() + 15000;
  while (rc == 0 && (rc = kvt_server_create(ctx, &cfg, &srv)) != 0 && ck_now_ms() < end &&
         (rc == -EADDRINUSE || rc == -EAGAIN || rc == -EBUSY))
    ck_sleep_ms(100);
  if (rc) {
    ck_note("the server did not start: %s (%s)", kvt_err_name(rc),
            ctx ? kvt_ctx_last_error(ctx) : "");
    __atomic_store_n(&ck->srv_rc, rc, __ATOMIC_SEQ_CST);
    _exit(2);
  }
  char host[64];
  uint16_t bound = 0;
  if (kvt_server_address(srv, host, sizeof(host), &bound) == 0)
    __atomic_store_n(&ck->srv_port, (int)bound, __ATOMIC_SEQ_CST);
  if (stop_asked)
    kvt_server_stop(srv);
  __atomic_store_n(&ck->srv_ready, 1, __ATOMIC_SEQ_CST);
  rc = kvt_server_run(srv);
  kvt_server_destroy(srv);
  srv = NULL;
  kvt_ctx_destroy(ctx);
  fflush(stderr);
  _exit(rc ? 1 : 0);
}

pid_t ck_server_start(int limit_s) {
  __atomic_store_n(&ck->srv_ready, 0, __ATOMIC_SEQ_CST);
  __atomic_store_n(&ck->srv_rc, 0, __ATOMIC_SEQ_CST);
  const pid_t pid = ck_spawn("the server", limit_s, server_child, NULL);
  const int64_t end = ck_now_ms() + 30000;
  while (pid > 0 && !__atomic_load_n(&ck->srv_ready, __ATOMIC_SEQ_CST)) {
    int status;
    if (ck_now_ms() > end || waitpid(pid, &status, WNOHANG) == pid) {
      ck_kill9(pid, "the server");
      ck_check_result("the server starts (again) on its directory", 0,
                      "not ready within 30 s (rc %s)", kvt_err_name(ck->srv_rc));
      return -1;
    }
    ck_sleep_ms(20);
  }
  CK_ADD(server_starts, 1);
  ck_check_result("the server starts (again) on its directory", 1, NULL);
  return pid;
}

void ck_server_stop(pid_t pid) {
  if (pid <= 0)
    return;
  kill(pid, SIGTERM);
  const int64_t t0 = ck_now_ms();
  const int rc = ck_wait(pid, 25000, "the server (SIGTERM)");
  ck_check_result("the server ends with 0 on SIGTERM, within 25 s", rc == 0,
                  "it ended with %d after %lld ms", rc, (long long)(ck_now_ms() - t0));
  if (rc == 0)
    CK_ADD(clean_stops, 1);
}

/* ---- what a server must refuse ---- */

static void empty_token_child(void *arg) {
  (void)arg;
  const char *tenants[] = {"prefill:"};
  char tiers[64];
  snprintf(tiers, sizeof(tiers), "dram:1MiB");
  kvt_server_config cfg = KVT_SERVER_CONFIG_INIT;
  cfg.listen_port = "0";
  cfg.tiers = tiers;
  cfg.tenants = tenants;
  cfg.n_tenants = 1;
  kvt_ctx *ctx = NULL;
  kvt_server *s = NULL;
  if (kvt_ctx_create(NULL, &ctx) != 0)
    _exit(4);
  const int rc = kvt_server_create(ctx, &cfg, &s);
  ck_check_result("kvt_server_create refuses a tenant with an empty token", rc != 0,
                  "tenant \"prefill:\" was accepted (returned 0)");
  kvt_server_destroy(s);
  kvt_ctx_destroy(ctx);
}

/* kvtier-server --tenant prefill: must exit 2 (a usage error), not serve. */
static void empty_token_binary(void) {
  const char *name = "kvtier-server --tenant prefill: exits 2 instead of serving";
  if (access(SERVER_BIN, X_OK) != 0) {
    ck_check_skip(name, "%s not built", SERVER_BIN);
    return;
  }
  int fds[2];
  if (pipe(fds) != 0)
    return;
  fflush(stdout);
  fflush(stderr);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 1);
    const int devnull = open("/dev/null", O_WRONLY);
    if (devnull >= 0)
      dup2(devnull, 2);
    close(fds[0]);
    execl(SERVER_BIN, SERVER_BIN, "--listen", "127.0.0.1:0", "--tiers", "dram:1MiB", "--tenant",
          "prefill:", "--quiet", (char *)NULL);
    _exit(127);
  }
  close(fds[1]);
  char out[512] = "";
  size_t got = 0;
  int status = 0, ended = 0;
  for (const int64_t end = ck_now_ms() + 15000; !ended && ck_now_ms() < end;) {
    struct pollfd p = {.fd = fds[0], .events = POLLIN};
    if (poll(&p, 1, 50) > 0 && got < sizeof(out) - 1) {
      const ssize_t n = read(fds[0], out + got, sizeof(out) - 1 - got);
      if (n > 0)
        out[got += (size_t)n] = 0;
    }
    ended = waitpid(pid, &status, WNOHANG) == pid;
    if (!ended && strstr(out, "ready on"))
      break;
  }
  close(fds[0]);
  if (!ended) {
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    ck_check_result(name, 0, "it started serving (\"%.60s\")", out);
    return;
  }
  ck_check_result(name, WIFEXITED(status) && WEXITSTATUS(status) == 2, "it ended with status %d",
                  WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
}

void ck_server_token_checks(void) {
  const pid_t pid = ck_spawn("an empty-token server", 60, empty_token_child, NULL);
  ck_wait_ok(pid, 60000, "an empty-token server");
  empty_token_binary();
}

/* ---- whether the provider works here ---- */

#ifdef KVT_HAVE_FABRIC
static void probe_child(void *arg) {
  (void)arg;
  char err[CK_NOTE_LEN];
  kvt_fab *probe = NULL;
  kvt_fab_config pc = {.provider = KVT_FAB_DEFAULT_PROVIDER, .node = "127.0.0.1", .service = "0"};
  if (kvt_fab_open(&pc, &probe, err, sizeof(err)) != 0) {
    snprintf(ck->why, sizeof(ck->why), "%s", err);
    _exit(1);
  }
  kvt_fab_close(probe);
}
#endif

int ck_fabric_available(char *why, size_t cap) {
#ifdef KVT_HAVE_FABRIC
  const pid_t pid = ck_spawn("a provider probe", 60, probe_child, NULL);
  const int rc = pid > 0 ? ck_wait(pid, 60000, "a provider probe") : -1;
  if (rc != 0)
    snprintf(why, cap, "libfabric's %s provider does not open on 127.0.0.1: %s", "tcp;ofi_rxm",
             ck->why);
  return rc == 0;
#else
  snprintf(why, cap, "built without libfabric");
  return 0;
#endif
}
