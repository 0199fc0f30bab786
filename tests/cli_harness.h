/* tests/cli_harness.h - runs the built kvtier tool in a temporary directory
 * for the CLI integration tests: the directory, the last run's exit status
 * and output, and file helpers relative to the directory. Functions are
 * static inline so a test that uses only some of them still builds with
 * -Werror. Include after <cmocka.h>. */
#ifndef KVT_CLI_HARNESS_H
#define KVT_CLI_HARNESS_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#define CLI_BIN KVT_BINARY_DIR "/programs/kvtier"

static char dir[64]; /* the test program's temporary directory */

typedef struct run_result {
  int rc;          /* exit status, or -1 when it did not exit normally */
  char out[65536]; /* stdout */
  char err[8192];  /* stderr */
} run_result;

static run_result res; /* one at a time; too large for the stack */

static inline void path_of(const char *name, char *path, size_t cap) {
  snprintf(path, cap, "%s/%s", dir, name);
}

static inline void slurp(const char *name, char *buf, size_t cap) {
  char path[256];
  path_of(name, path, sizeof(path));
  buf[0] = '\0';
  FILE *f = fopen(path, "rb");
  if (!f)
    return;
  const size_t n = fread(buf, 1, cap - 1, f);
  buf[n] = '\0';
  fclose(f);
}

/* Runs `kvtier ARGS` in dir; fills res and returns the exit status. */
static inline int run(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline int run(const char *fmt, ...) {
  char args[1024], cmd[1400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(args, sizeof(args), fmt, ap);
  va_end(ap);
  snprintf(cmd, sizeof(cmd), "cd %s && %s %s >stdout.txt 2>stderr.txt", dir, CLI_BIN, args);
  const int st = system(cmd);
  res.rc = st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  slurp("stdout.txt", res.out, sizeof(res.out));
  slurp("stderr.txt", res.err, sizeof(res.err));
  return res.rc;
}

static inline void *read_file(const char *name, size_t *len) {
  *len = 0;
  char path[256];
  path_of(name, path, sizeof(path));
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  fseek(f, 0, SEEK_END);
  const long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  void *buf = malloc(n > 0 ? (size_t)n : 1);
  assert_non_null(buf);
  assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  *len = (size_t)n;
  return buf;
}

static inline void write_file(const char *name, const void *buf, size_t len) {
  char path[256];
  path_of(name, path, sizeof(path));
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(buf, 1, len, f), len);
  assert_int_equal(fclose(f), 0);
}

static inline int exists(const char *name) {
  char path[256];
  path_of(name, path, sizeof(path));
  return access(path, F_OK) == 0;
}

#endif
