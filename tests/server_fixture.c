/* tests/server_fixture.c - the server tests' scaffolding (server_fixture.h):
 * servers in this process through kvtier/server.h, or the kvtier-server
 * program as a child; their counters; specs and scratch directories. */
#include "server_fixture.h"

#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "../transport/kvt_transport.h"

/* A server in this process and the thread running it. */
typedef struct srv_runner {
  kvt_ctx *ctx;
  kvt_server *srv;
  pthread_t thread;
  int rc;
} srv_runner;

/* Servers running: children (pid) and runners in this process. */
static pid_t srv_live[32];
static srv_runner *srv_live_in[32];

static void track(pid_t pid, srv_runner *f, int add) {
  for (int i = 0; i < 32; i++) {
    if (pid && (add ? srv_live[i] == 0 : srv_live[i] == pid)) {
      srv_live[i] = add ? pid : 0;
      return;
    }
    if (f && (add ? srv_live_in[i] == NULL : srv_live_in[i] == f)) {
      srv_live_in[i] = add ? f : NULL;
      return;
    }
  }
}

int srv_binary_present(void) { return access(SRV_BIN, X_OK) == 0; }

int srv_can_run(void) {
  char err[256];
  kvt_fab *probe = NULL;
  kvt_fab_config pc = {.provider = KVT_FAB_DEFAULT_PROVIDER, .node = "127.0.0.1", .service = "0"};
  if (kvt_fab_open(&pc, &probe, err, sizeof(err)) != 0) {
    printf("[  SKIP    ] %s\n", err);
    return 0;
  }
  kvt_fab_close(probe);
  return 1;
}

int srv_can_run_binary(void) {
  if (!srv_binary_present()) {
    printf("[  SKIP    ] %s not built\n", SRV_BIN);
    return 0;
  }
  return srv_can_run();
}

/* ---- in this process ---- */

static void log_error(void *opaque, int level, const char *msg) {
  (void)opaque, (void)level;
  fprintf(stderr, "server: %s\n", msg);
}

static void *run_thread(void *arg) {
  srv_runner *r = arg;
  r->rc = kvt_server_run(r->srv);
  return NULL;
}

static int size_arg(const char *v, uint64_t *out) { return kvt_parse_size(v, out); }

/* f->args (kvtier-server's options) into cfg; tenants into specs. */
static int config_of(const srv_fixture *f, kvt_server_config *cfg, const char **specs) {
  for (int i = 0; i < SRV_MAX_ARGS && f->args[i]; i += 2) {
    const char *a = f->args[i], *v = f->args[i + 1];
    if (!v)
      return -1;
    if (!strcmp(a, "--tiers"))
      cfg->tiers = v;
    else if (!strcmp(a, "--tenant"))
      specs[cfg->n_tenants++] = v;
    else if (!strcmp(a, "--evict"))
      cfg->evict = !strcmp(v, "none") ? KVT_SERVER_EVICT_NONE : KVT_SERVER_EVICT_LRU;
    else if (!strcmp(a, "--max-request") && size_arg(v, &cfg->max_request) == 0)
      ;
    else if (!strcmp(a, "--max-inflight") && size_arg(v, &cfg->max_inflight) == 0)
      ;
    else if (!strcmp(a, "--workers"))
      cfg->workers = atoi(v);
    else if (!strcmp(a, "--provider"))
      cfg->provider = v;
    else
      return -1;
  }
  return 0;
}

static void runner_free(srv_runner *r) {
  kvt_server_destroy(r->srv);
  kvt_ctx_destroy(r->ctx);
  free(r);
}

static int start_in_process(srv_fixture *f) {
  static const char *specs[SRV_MAX_ARGS];
  kvt_server_config cfg = KVT_SERVER_CONFIG_INIT;
  char port[16];
  snprintf(port, sizeof(port), "%d", f->port);
  cfg.listen_host = "127.0.0.1";
  cfg.listen_port = port;
  cfg.tenants = specs;
  cfg.log = log_error;
  cfg.log_level = KVT_LOG_ERROR; /* as --quiet */
  srv_runner *r = calloc(1, sizeof(*r));
  if (!r || config_of(f, &cfg, specs) != 0 || kvt_ctx_create(NULL, &r->ctx) != 0) {
    free(r);
    return -1;
  }
  int rc = kvt_server_create(r->ctx, &cfg, &r->srv);
  char host[64];
  uint16_t bound = 0;
  if (rc == 0)
    rc = kvt_server_address(r->srv, host, sizeof(host), &bound);
  if (rc == 0)
    rc = pthread_create(&r->thread, NULL, run_thread, r) ? -EAGAIN : 0;
  if (rc) {
    fprintf(stderr, "server: %s (%s)\n", kvt_ctx_last_error(r->ctx), kvt_strerror(rc));
    runner_free(r);
    return -1;
  }
  f->port = bound;
  f->run = r;
  track(0, r, 1);
  return 0;
}

/* Stops r and frees it once its thread returned: the exit status of
 * exit(0) when kvt_server_run returned 0, else of exit(1); -1 when it did
 * not return within timeout_s (left running: a thread cannot be ended). */
static int stop_in_process(srv_runner *r, int timeout_s) {
  kvt_server_stop(r->srv);
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += timeout_s;
  track(0, r, 0);
  if (pthread_timedjoin_np(r->thread, NULL, &until) != 0)
    return -1;
  const int status = r->rc == 0 ? 0 : 1 << 8;
  runner_free(r);
  return status;
}

/* ---- the program ---- */

static int start_binary(srv_fixture *f) {
  int fds[2];
  if (pipe(fds) != 0)
    return -1;
  char listen[64];
  snprintf(listen, sizeof(listen), "127.0.0.1:%d", f->port);
  const char *argv[SRV_MAX_ARGS + 8];
  int n = 0;
  argv[n++] = SRV_BIN;
  argv[n++] = "--listen";
  argv[n++] = listen;
  argv[n++] = "--quiet";
  for (int i = 0; i < SRV_MAX_ARGS && f->args[i]; i++)
    argv[n++] = f->args[i];
  argv[n] = NULL;
  const pid_t pid = fork();
  if (pid < 0)
    return -1;
  if (pid == 0) {
    dup2(fds[1], 1);
    close(fds[0]);
    close(fds[1]);
    execv(SRV_BIN, (char *const *)argv);
    _exit(127);
  }
  close(fds[1]);
  f->pid = pid;
  track(pid, NULL, 1);
  char line[512];
  size_t got = 0;
  const time_t deadline = time(NULL) + 15;
  int ready = 0;
  while (!ready && time(NULL) < deadline && got < sizeof(line) - 1) {
    struct pollfd p = {.fd = fds[0], .events = POLLIN};
    if (poll(&p, 1, 200) <= 0)
      continue;
    const ssize_t r = read(fds[0], line + got, sizeof(line) - 1 - got);
    if (r <= 0)
      break; /* it exited */
    got += (size_t)r;
    line[got] = 0;
    const char *at = strstr(line, "ready on 127.0.0.1:");
    if (at && strchr(at, '\n')) {
      f->port = atoi(at + strlen("ready on 127.0.0.1:"));
      ready = 1;
    }
  }
  close(fds[0]);
  if (!ready) {
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    track(pid, NULL, 0);
    f->pid = 0;
    return -1;
  }
  return 0;
}

static int stop_binary(srv_fixture *f, int sig, int timeout_s) {
  if (f->pid <= 0)
    return -1;
  kill(f->pid, sig);
  int status = 0;
  const time_t deadline = time(NULL) + timeout_s;
  for (;;) {
    const pid_t w = waitpid(f->pid, &status, WNOHANG);
    if (w == f->pid)
      break;
    if (time(NULL) > deadline) {
      kill(f->pid, SIGKILL);
      waitpid(f->pid, NULL, 0);
      track(f->pid, NULL, 0);
      f->pid = 0;
      return -1;
    }
    struct timespec ts = {0, 20000000};
    nanosleep(&ts, NULL);
  }
  track(f->pid, NULL, 0);
  f->pid = 0;
  return status;
}

/* ---- either ---- */

int srv_start(srv_fixture *f) { return f->binary ? start_binary(f) : start_in_process(f); }

void srv_start_or_fail(srv_fixture *f) {
  if (srv_start(f) != 0)
    fail_msg("the server did not start");
}

int srv_stop(srv_fixture *f, int sig, int timeout_s) {
  if (f->binary)
    return stop_binary(f, sig, timeout_s);
  if (!f->run || (sig != SIGTERM && sig != SIGINT))
    return -1;
  srv_runner *r = f->run;
  f->run = NULL;
  return stop_in_process(r, timeout_s);
}

void srv_stop_cleanly(srv_fixture *f, int timeout_s) {
  const int st = srv_stop(f, SIGTERM, timeout_s);
  if (st < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
    fail_msg("the server did not end with 0 when stopped (status %d)", st);
}

void srv_kill9(srv_fixture *f) {
  if (!f->binary)
    fail_msg("kill -9 needs the server as a process (f->binary)");
  (void)stop_binary(f, SIGKILL, 5);
}

void srv_kill_all(void) {
  for (int i = 0; i < 32; i++) {
    if (srv_live[i] > 0) {
      kill(srv_live[i], SIGKILL);
      waitpid(srv_live[i], NULL, 0);
      srv_live[i] = 0;
    }
    if (srv_live_in[i])
      (void)stop_in_process(srv_live_in[i], 30);
  }
}

int srv_kill_leftovers(void **state) {
  (void)state;
  srv_kill_all();
  return 0;
}

void srv_set_args(srv_fixture *f, ...) {
  va_list ap;
  va_start(ap, f);
  int n = 0;
  const char *a;
  while ((a = va_arg(ap, const char *)) != NULL && n < SRV_MAX_ARGS - 1)
    f->args[n++] = a;
  f->args[n] = NULL;
  va_end(ap);
}

static uint64_t stat_of_text(const char *text, const char *name) {
  char pat[128];
  snprintf(pat, sizeof(pat), "\nkvtier_server_%s ", name);
  const char *at = strstr(text, pat);
  return at ? strtoull(at + strlen(pat), NULL, 10) : (uint64_t)-1;
}

uint64_t srv_stat(const srv_fixture *f, const char *name) {
  if (f->binary) {
    char cmd[512];
    static char text[16384];
    snprintf(cmd, sizeof(cmd), "%s --stats 127.0.0.1:%d", SRV_BIN, f->port);
    FILE *p = popen(cmd, "r");
    if (!p)
      return (uint64_t)-1;
    const size_t n = fread(text, 1, sizeof(text) - 1, p);
    text[n] = 0;
    pclose(p);
    return stat_of_text(text, name);
  }
  kvt_ctx *own = NULL;
  if (kvt_ctx_create(NULL, &own) != 0)
    return (uint64_t)-1;
  char port[16];
  snprintf(port, sizeof(port), "%d", f->port);
  uint64_t v[64];
  size_t n = 0;
  uint64_t out = (uint64_t)-1;
  if (kvt_server_stats_fetch(own, "127.0.0.1", port, NULL, NULL, NULL, v, 64, &n) == 0)
    for (size_t i = 0; i < n; i++)
      if (strcmp(kvt_server_stat_name(i), name) == 0)
        out = v[i];
  kvt_ctx_destroy(own);
  return out;
}

void srv_spec(const srv_fixture *f, char *buf, size_t cap, const char *tenant, const char *token,
              int timeout_ms, const char *extra) {
  snprintf(buf, cap, "fabric://127.0.0.1:%d?tenant=%s&token=%s&timeout_ms=%d%s%s", f->port, tenant,
           token, timeout_ms, extra && *extra ? "&" : "", extra ? extra : "");
}

int srv_mkdtemp(char *dir, size_t cap) {
  const char *base = getenv("TMPDIR");
  snprintf(dir, cap, "%s/kvt_server_XXXXXX", base ? base : "/tmp");
  return mkdtemp(dir) ? 0 : -1;
}

void srv_rmdir(const char *dir) {
  char cmd[512];
  if (dir[0] && strstr(dir, "kvt_server_")) {
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    int rc = system(cmd);
    (void)rc;
  }
}
