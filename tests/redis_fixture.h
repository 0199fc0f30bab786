/* tests/redis_fixture.h - redis-server processes for the redis tiers' tests:
 * started on 127.0.0.1 on a free port (tried from a random base) with no
 * persistence, in a temporary directory, ready once PING answers; stopped
 * (SIGTERM), killed (SIGKILL) and restarted on the same port; a 3-master
 * Redis Cluster assembled with CLUSTER ADDSLOTSRANGE and CLUSTER MEET.
 * Every server dies with the test (PR_SET_PDEATHSIG, and an atexit hook that
 * also removes the directories), however the test ends. */
#ifndef KVT_REDIS_FIXTURE_H
#define KVT_REDIS_FIXTURE_H

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

/* Each test program uses some of the helpers. */
#define RFX_FN static __attribute__((unused))

#define RFX_MAX_ARGS 24
#define RFX_MAX_SERVERS 8

typedef struct rfx_server {
  pid_t pid; /* 0: not running */
  int port;
  char dir[256];
  const char *args[RFX_MAX_ARGS]; /* extra "--name", "value" pairs */
  int nargs;
  const char *pass; /* for PING while waiting (requirepass) */
} rfx_server;

/* The servers started and not stopped: rfx_all[i] names one (compared,
 * never read: it may be a dead stack frame by exit), with copies of its pid
 * and directory that the exit hook kills and removes. */
static rfx_server *rfx_all[RFX_MAX_SERVERS];
static pid_t rfx_all_pid[RFX_MAX_SERVERS];
static char rfx_all_dir[RFX_MAX_SERVERS][256];

RFX_FN void rfx_sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

RFX_FN int rfx_have_redis(void) {
  return system("command -v redis-server >/dev/null 2>&1") == 0;
}

RFX_FN void rfx_rmdir(const char *dir) {
  DIR *d = opendir(dir);
  if (!d)
    return;
  struct dirent *e;
  char path[512];
  while ((e = readdir(d)) != NULL)
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
      snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
      unlink(path);
    }
  closedir(d);
  rmdir(dir);
}

RFX_FN void rfx_kill_all(void) {
  for (int i = 0; i < RFX_MAX_SERVERS; i++) {
    if (rfx_all_pid[i] > 0) {
      kill(rfx_all_pid[i], SIGKILL);
      waitpid(rfx_all_pid[i], NULL, 0);
    }
    if (rfx_all_dir[i][0])
      rfx_rmdir(rfx_all_dir[i]);
    rfx_all[i] = NULL;
    rfx_all_pid[i] = 0;
    rfx_all_dir[i][0] = '\0';
  }
}

RFX_FN int rfx_slot(const rfx_server *s) {
  for (int i = 0; i < RFX_MAX_SERVERS; i++)
    if (rfx_all[i] == s)
      return i;
  return -1;
}

/* Copies s's pid and directory into its entry (after every change). */
RFX_FN void rfx_track(const rfx_server *s) {
  const int i = rfx_slot(s);
  if (i >= 0) {
    rfx_all_pid[i] = s->pid;
    snprintf(rfx_all_dir[i], sizeof(rfx_all_dir[i]), "%s", s->dir);
  }
}

RFX_FN int rfx_register(rfx_server *s) {
  static int hooked;
  if (!hooked) {
    atexit(rfx_kill_all);
    hooked = 1;
  }
  int i = rfx_slot(s);
  if (i < 0)
    i = rfx_slot(NULL);
  if (i < 0) {
    fprintf(stderr, "redis_fixture: more than %d servers at once; stop some first\n",
            RFX_MAX_SERVERS);
    return -ENOSPC;
  }
  rfx_all[i] = s;
  rfx_track(s);
  return 0;
}

RFX_FN void rfx_unregister(const rfx_server *s) {
  const int i = rfx_slot(s);
  if (i >= 0) {
    rfx_all[i] = NULL;
    rfx_all_pid[i] = 0;
    rfx_all_dir[i][0] = '\0';
  }
}

RFX_FN int rfx_port_free(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const int ok = bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
  close(fd);
  return ok;
}

/* A connection to the server (authenticated when pass is set), or NULL. */
RFX_FN redisContext *rfx_connect(int port, const char *user, const char *pass) {
  const struct timeval tv = {2, 0};
  redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
  if (!c || c->err) {
    if (c)
      redisFree(c);
    return NULL;
  }
  redisSetTimeout(c, tv);
  if (pass) {
    redisReply *r = user ? redisCommand(c, "AUTH %s %s", user, pass)
                         : redisCommand(c, "AUTH %s", pass);
    const int ok = r && r->type != REDIS_REPLY_ERROR;
    if (r)
      freeReplyObject(r);
    if (!ok) {
      redisFree(c);
      return NULL;
    }
  }
  return c;
}

RFX_FN int rfx_pinged(const rfx_server *s) {
  redisContext *c = rfx_connect(s->port, NULL, s->pass);
  if (!c)
    return 0;
  redisReply *r = redisCommand(c, "PING");
  const int ok = r != NULL;
  if (r)
    freeReplyObject(r);
  redisFree(c);
  return ok;
}

RFX_FN pid_t rfx_spawn(const rfx_server *s) {
  char port[16], log[300];
  snprintf(port, sizeof(port), "%d", s->port);
  snprintf(log, sizeof(log), "%s/redis.log", s->dir);
  const char *argv[RFX_MAX_ARGS + 20] = {"redis-server", "--port", port, "--bind", "127.0.0.1",
                                         "--save", "", "--appendonly", "no", "--dir", s->dir,
                                         "--daemonize", "no", "--protected-mode", "no"};
  int n = 15;
  for (int i = 0; i < s->nargs; i++)
    argv[n++] = s->args[i];
  argv[n] = NULL;
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
      _exit(1);
    const int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    if (chdir(s->dir) != 0)
      _exit(1);
    execvp("redis-server", (char *const *)argv);
    _exit(127);
  }
  return pid;
}

/* Starts s on s->port (0: a free port) and waits until it answers. */
RFX_FN int rfx_start(rfx_server *s) {
  if (!s->dir[0]) {
    const char *base = getenv("TMPDIR");
    snprintf(s->dir, sizeof(s->dir), "%s/kvt_redis_XXXXXX", base ? base : "/tmp");
    if (!mkdtemp(s->dir))
      return -errno;
  }
  const int reg = rfx_register(s);
  if (reg) {
    rfx_rmdir(s->dir);
    s->dir[0] = '\0';
    return reg;
  }
  const int fixed = s->port != 0;
  srand((unsigned)(getpid() ^ time(NULL)));
  for (int attempt = 0; attempt < (fixed ? 1 : 20); attempt++) {
    if (!fixed) {
      s->port = 20000 + rand() % 30000;
      if (!rfx_port_free(s->port) || !rfx_port_free(s->port + 10000))
        continue; /* cluster bus: port + 10000 */
    }
    s->pid = rfx_spawn(s);
    if (s->pid < 0)
      return -errno;
    rfx_track(s);
    for (int i = 0; i < 1000; i++) { /* 10 s */
      if (rfx_pinged(s))
        return 0;
      if (waitpid(s->pid, NULL, WNOHANG) == s->pid)
        break; /* it died: the port was taken */
      rfx_sleep_ms(10);
    }
    kill(s->pid, SIGKILL);
    waitpid(s->pid, NULL, 0);
    s->pid = 0;
    rfx_track(s);
    if (fixed) /* the old socket may linger briefly: one more try */
      for (int i = 0; i < 50 && !rfx_port_free(s->port); i++)
        rfx_sleep_ms(100);
  }
  if (fixed) {
    s->pid = rfx_spawn(s);
    rfx_track(s);
    for (int i = 0; i < 1000 && s->pid > 0; i++) {
      if (rfx_pinged(s))
        return 0;
      rfx_sleep_ms(10);
    }
  }
  return -EADDRINUSE;
}

RFX_FN void rfx_signal(rfx_server *s, int sig) {
  if (s->pid > 0) {
    kill(s->pid, sig);
    waitpid(s->pid, NULL, 0);
    s->pid = 0;
  }
  rfx_track(s);
}

/* Stops s and forgets it (it may live on the stack). */
RFX_FN void rfx_stop(rfx_server *s) {
  rfx_signal(s, SIGTERM);
  if (s->dir[0])
    rfx_rmdir(s->dir);
  s->dir[0] = '\0';
  rfx_unregister(s);
}

/* Kills s, keeping its directory and port for rfx_start (a restart); the exit
 * hook removes the directory of one not restarted. */

RFX_FN void rfx_kill9(rfx_server *s) { rfx_signal(s, SIGKILL); }

/* Runs a command on the server; returns the reply (free it) or NULL. */
RFX_FN redisReply *rfx_cmd(int port, const char *fmt, ...) {
  redisContext *c = rfx_connect(port, NULL, NULL);
  if (!c)
    return NULL;
  va_list ap;
  va_start(ap, fmt);
  redisReply *r = redisvCommand(c, fmt, ap);
  va_end(ap);
  redisFree(c);
  return r;
}

RFX_FN int rfx_cmd_ok(int port, const char *fmt, ...) {
  redisContext *c = rfx_connect(port, NULL, NULL);
  if (!c)
    return 0;
  va_list ap;
  va_start(ap, fmt);
  redisReply *r = redisvCommand(c, fmt, ap);
  va_end(ap);
  redisFree(c);
  const int ok = r && r->type != REDIS_REPLY_ERROR;
  if (r)
    freeReplyObject(r);
  return ok;
}

/* ---- a 3-master cluster ---- */

#define RFX_CLUSTER_N 3

static const char *const rfx_cluster_args[] = {
    "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout",
    "3000", "--cluster-require-full-coverage", "no"};

RFX_FN int rfx_cluster_ok(const rfx_server *s) {
  for (int i = 0; i < RFX_CLUSTER_N; i++) {
    redisReply *r = rfx_cmd(s[i].port, "CLUSTER INFO");
    const int ok = r && r->type == REDIS_REPLY_STRING && strstr(r->str, "cluster_state:ok") &&
                   strstr(r->str, "cluster_slots_assigned:16384") &&
                   strstr(r->str, "cluster_known_nodes:3");
    if (r)
      freeReplyObject(r);
    if (!ok)
      return 0;
  }
  return 1;
}

/* Starts 3 masters, gives each a third of the slots, and joins them. */
RFX_FN int rfx_cluster_start(rfx_server *s) {
  for (int i = 0; i < RFX_CLUSTER_N; i++) {
    memset(&s[i], 0, sizeof(s[i]));
    s[i].nargs = (int)(sizeof(rfx_cluster_args) / sizeof(rfx_cluster_args[0]));
    memcpy(s[i].args, rfx_cluster_args, sizeof(rfx_cluster_args));
    const int rc = rfx_start(&s[i]);
    if (rc)
      return rc;
  }
  for (int i = 0; i < RFX_CLUSTER_N; i++) {
    const int lo = i * 16384 / RFX_CLUSTER_N, hi = (i + 1) * 16384 / RFX_CLUSTER_N - 1;
    if (!rfx_cmd_ok(s[i].port, "CLUSTER ADDSLOTSRANGE %d %d", lo, hi))
      return -EPROTO;
    if (i && !rfx_cmd_ok(s[0].port, "CLUSTER MEET 127.0.0.1 %d", s[i].port))
      return -EPROTO;
  }
  for (int i = 0; i < 2000; i++) { /* 20 s */
    if (rfx_cluster_ok(s))
      return 0;
    rfx_sleep_ms(10);
  }
  return -ETIMEDOUT;
}

/* Which of the servers serves slot (by CLUSTER SLOTS on s[0]), or -1. */
RFX_FN int rfx_slot_owner(const rfx_server *s, int n, unsigned slot) {
  redisReply *r = rfx_cmd(s[0].port, "CLUSTER SLOTS");
  int owner = -1;
  for (size_t i = 0; r && r->type == REDIS_REPLY_ARRAY && i < r->elements; i++) {
    const redisReply *e = r->element[i];
    if ((long long)slot >= e->element[0]->integer && (long long)slot <= e->element[1]->integer)
      for (int k = 0; k < n; k++)
        if (e->element[2]->element[1]->integer == s[k].port)
          owner = k;
  }
  if (r)
    freeReplyObject(r);
  return owner;
}

#endif
