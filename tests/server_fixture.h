/* tests/server_fixture.h - a kvtier server on 127.0.0.1 for the server and
 * fabric-tier tests (tests/server_fixture.c): in this process through
 * kvtier/server.h (the default: a thread runs it), or the built
 * kvtier-server as a child process (f->binary = 1: the tests of the program
 * itself: signals, exit codes, kill -9, --stats). Start (on a free port, or
 * the port of the previous run for a restart), stop (and its outcome as an
 * exit status), the server's counters, specs and scratch directories. */
#ifndef KVT_SERVER_FIXTURE_H
#define KVT_SERVER_FIXTURE_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/wait.h>

#include "kvtier.h"

#define SRV_BIN KVT_BINARY_DIR "/programs/kvtier-server"
#define SRV_MAX_ARGS 24

typedef struct srv_fixture {
  int binary; /* 1: run the kvtier-server program; 0: in this process */
  pid_t pid;  /* binary: the child while it runs */
  int port;   /* 0 until the first start */
  /* Extra arguments as kvtier-server takes them, NULL-terminated (in
   * process: --tiers, --tenant, --evict, --max-request, --max-inflight,
   * --workers, --provider). */
  const char *args[SRV_MAX_ARGS];
  struct srv_runner *run; /* in process, while it runs (on the heap: a failed
                           * assertion may leave it to the teardown) */
} srv_fixture;

/* Whether the default provider opens on 127.0.0.1 (and, binary, whether
 * kvtier-server was built). Says why not (the test then exits 77). */
int srv_can_run(void);
int srv_can_run_binary(void);
int srv_binary_present(void);

/* Starts f with f->args on f->port (0: any free port, learnt from the
 * bound address or the ready line). Returns 0, or -1 when it did not
 * become ready (binary: in 15 s). */
int srv_start(srv_fixture *f);
/* Starts f, failing the test if the server does not say it is ready. */
void srv_start_or_fail(srv_fixture *f);

/* Stops f and waits up to timeout_s: binary, by signal sig; in process,
 * kvt_server_stop (sig must be SIGTERM or SIGINT). Returns the exit status
 * as waitpid gives it (in process: that of an exit with 0 when
 * kvt_server_run returned 0, else 1), or -1 when it did not end in time
 * (a child is then killed; a thread is left). */
int srv_stop(srv_fixture *f, int sig, int timeout_s);
/* Stops f, failing the test unless it ends with 0 within timeout_s. */
void srv_stop_cleanly(srv_fixture *f, int timeout_s);
/* kill -9 (binary only). */
void srv_kill9(srv_fixture *f);

/* Servers started and not yet stopped: a failed assertion longjmps past a
 * test's own stop, and the test's teardown then ends what is left. */
void srv_kill_all(void);
int srv_kill_leftovers(void **state);

/* f's extra arguments: the strings given, up to a NULL. They are kept as
 * pointers, so they must outlive f's runs. */
void srv_set_args(srv_fixture *f, ...);

/* The server's counter `name` (as --stats prints it, without the
 * kvtier_server_ prefix), fetched with kvt_server_stats_fetch (binary: by
 * running kvtier-server --stats); (uint64_t)-1 when it cannot be read. */
uint64_t srv_stat(const srv_fixture *f, const char *name);

/* "fabric://127.0.0.1:PORT?tenant=T&token=K&timeout_ms=MS" plus extra. */
void srv_spec(const srv_fixture *f, char *buf, size_t cap, const char *tenant, const char *token,
              int timeout_ms, const char *extra);

/* A fresh directory under $TMPDIR for an nvme tier; removed by srv_rmdir. */
int srv_mkdtemp(char *dir, size_t cap);
void srv_rmdir(const char *dir);

#endif
