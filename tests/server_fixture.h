/* tests/server_fixture.h - runs the built kvtier-server as a child process on
 * 127.0.0.1 for the remote-tier tests: start (on a free port, or the port of
 * the previous run for a restart), wait until it says it is ready, stop with
 * SIGTERM (and collect its exit status), kill -9. Include after <cmocka.h>. */
#ifndef KVT_SERVER_FIXTURE_H
#define KVT_SERVER_FIXTURE_H

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SRV_BIN KVT_BINARY_DIR "/programs/kvtier-server"
#define SRV_MAX_ARGS 24

typedef struct srv_fixture {
  pid_t pid;
  int port; /* 0 until the first start */
  const char *args[SRV_MAX_ARGS]; /* extra arguments, NULL-terminated */
} srv_fixture;

/* Servers started and not yet stopped: a failed assertion longjmps past a
 * test's own stop, and the test's teardown then kills what is left. */
static pid_t srv_live[32];

static inline void srv_track(pid_t pid, int add) {
  for (int i = 0; i < 32; i++)
    if (add ? srv_live[i] == 0 : srv_live[i] == pid) {
      srv_live[i] = add ? pid : 0;
      return;
    }
}

static inline void srv_kill_all(void) {
  for (int i = 0; i < 32; i++)
    if (srv_live[i] > 0) {
      kill(srv_live[i], SIGKILL);
      waitpid(srv_live[i], NULL, 0);
      srv_live[i] = 0;
    }
}

static inline int srv_binary_present(void) { return access(SRV_BIN, X_OK) == 0; }

/* The server's counters (its STATS, as --stats prints them). */
static inline uint64_t srv_stat(const srv_fixture *f, const char *name) {
  char cmd[512];
  static char text[16384];
  snprintf(cmd, sizeof(cmd), "%s --stats 127.0.0.1:%d", SRV_BIN, f->port);
  FILE *p = popen(cmd, "r");
  if (!p)
    return (uint64_t)-1;
  const size_t n = fread(text, 1, sizeof(text) - 1, p);
  text[n] = 0;
  pclose(p);
  char pat[128];
  snprintf(pat, sizeof(pat), "\nkvtier_server_%s ", name);
  const char *at = strstr(text, pat);
  return at ? strtoull(at + strlen(pat), NULL, 10) : (uint64_t)-1;
}

/* A test's teardown: kills the servers a failed assertion left running. */
static inline int srv_kill_leftovers(void **state) {
  (void)state;
  srv_kill_all();
  return 0;
}

#ifdef KVT_TRANSPORT_H
/* Whether the server tests can run here: kvtier-server built, and the
 * default provider opening on 127.0.0.1. Says why not (the test then exits
 * 77, skipped). */
static inline int srv_can_run(void) {
  if (!srv_binary_present()) {
    printf("[  SKIP    ] %s not built\n", SRV_BIN);
    return 0;
  }
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
#endif

/* Starts the server with f->args on f->port (0: any free port, learnt from
 * the ready line). Returns 0, or -1 when it did not become ready in 15 s. */
static inline int srv_start(srv_fixture *f) {
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
  srv_track(pid, 1);
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
    srv_track(pid, 0);
    f->pid = 0;
    return -1;
  }
  return 0;
}

/* Sends sig and waits up to timeout_s for the exit. Returns the exit
 * status as waitpid gives it, or -1 when it did not exit in time (it is then
 * killed). */
static inline int srv_stop(srv_fixture *f, int sig, int timeout_s) {
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
      srv_track(f->pid, 0);
      f->pid = 0;
      return -1;
    }
    struct timespec ts = {0, 20000000};
    nanosleep(&ts, NULL);
  }
  srv_track(f->pid, 0);
  f->pid = 0;
  return status;
}

/* f's extra arguments: the strings given, up to a NULL. They are kept as
 * pointers, so they must outlive f's runs. */
static inline void srv_set_args(srv_fixture *f, ...) {
  va_list ap;
  va_start(ap, f);
  int n = 0;
  const char *a;
  while ((a = va_arg(ap, const char *)) != NULL && n < SRV_MAX_ARGS - 1)
    f->args[n++] = a;
  f->args[n] = NULL;
  va_end(ap);
}

/* Starts f, failing the test if the server does not say it is ready. */
static inline void srv_start_or_fail(srv_fixture *f) {
  if (srv_start(f) != 0)
    fail_msg("kvtier-server did not start");
}

/* Stops f with SIGTERM, failing the test unless it exits 0 within
 * timeout_s seconds. */
static inline void srv_stop_cleanly(srv_fixture *f, int timeout_s) {
  const int st = srv_stop(f, SIGTERM, timeout_s);
  if (st < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
    fail_msg("kvtier-server did not exit 0 on SIGTERM (status %d)", st);
}

static inline void srv_kill9(srv_fixture *f) { (void)srv_stop(f, SIGKILL, 5); }

/* "fabric://127.0.0.1:PORT?tenant=T&token=K&timeout_ms=MS" plus extra. */
static inline void srv_spec(const srv_fixture *f, char *buf, size_t cap, const char *tenant,
                            const char *token, int timeout_ms, const char *extra) {
  snprintf(buf, cap, "fabric://127.0.0.1:%d?tenant=%s&token=%s&timeout_ms=%d%s%s", f->port,
           tenant, token, timeout_ms, extra && *extra ? "&" : "", extra ? extra : "");
}

/* A fresh directory under $TMPDIR for an nvme tier; removed by srv_rmdir. */
static inline int srv_mkdtemp(char *dir, size_t cap) {
  const char *base = getenv("TMPDIR");
  snprintf(dir, cap, "%s/kvt_server_XXXXXX", base ? base : "/tmp");
  return mkdtemp(dir) ? 0 : -1;
}

static inline void srv_rmdir(const char *dir) {
  char cmd[512];
  if (dir[0] && strstr(dir, "kvt_server_")) {
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    int rc = system(cmd);
    (void)rc;
  }
}

#endif
