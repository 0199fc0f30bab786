/* programs/cli_util.c - option parsing, messages, file I/O with atomic
 * replace, timing and threads for the kvtier subcommands; see cli_util.h. */
#include "cli_util.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

void cli_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("kvtier: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

int cli_usage_error(const char *cmd, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "kvtier %s: ", cmd);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\nTry 'kvtier %s --help'.\n", cmd);
  va_end(ap);
  return CLI_EUSAGE;
}

static const cli_opt *find_opt(const cli_opt *opts, size_t n, const char *arg, size_t len) {
  for (size_t i = 0; i < n; i++) {
    if (strlen(opts[i].name) == len && strncmp(opts[i].name, arg, len) == 0)
      return &opts[i];
    if (opts[i].alias && strlen(opts[i].alias) == len && strncmp(opts[i].alias, arg, len) == 0)
      return &opts[i];
  }
  return NULL;
}

static int set_value(const char *cmd, const cli_opt *o, const char *val) {
  char *end = NULL;
  errno = 0;
  switch (o->kind) {
  case CLI_STR:
    *(const char **)o->dst = val;
    return 0;
  case CLI_U32:
  case CLI_INT: {
    long long v = (o->kind == CLI_U32 && val[0] == '-') ? -1 : strtoll(val, &end, 10);
    if (!end || end == val || *end || errno || (double)v < o->min || (double)v > o->max)
      return cli_usage_error(cmd, "%s: expected an integer in %.0f..%.0f, got '%s'", o->name,
                             o->min, o->max, val);
    if (o->kind == CLI_U32)
      *(uint32_t *)o->dst = (uint32_t)v;
    else
      *(int *)o->dst = (int)v;
    return 0;
  }
  case CLI_DBL: {
    double v = strtod(val, &end);
    if (end == val || *end || errno || !isfinite(v) || v < o->min || v > o->max)
      return cli_usage_error(cmd, "%s: expected a number in %g..%g, got '%s'", o->name, o->min,
                             o->max, val);
    *(double *)o->dst = v;
    return 0;
  }
  default:
    return cli_usage_error(cmd, "%s takes no value", o->name);
  }
}

int cli_parse(const char *cmd, int argc, char **argv, const cli_opt *opts, size_t n_opts,
              const char **pos, size_t max_pos, size_t *n_pos) {
  int only_pos = 0;
  *n_pos = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (only_pos || a[0] != '-' || a[1] == '\0') {
      if (*n_pos == max_pos)
        return cli_usage_error(cmd, "unexpected argument '%s'", a);
      pos[(*n_pos)++] = a;
      continue;
    }
    if (strcmp(a, "--") == 0) {
      only_pos = 1;
      continue;
    }
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0)
      return CLI_HELP;
    const char *eq = strncmp(a, "--", 2) == 0 ? strchr(a, '=') : NULL;
    size_t len = eq ? (size_t)(eq - a) : strlen(a);
    const cli_opt *o = find_opt(opts, n_opts, a, len);
    if (!o)
      return cli_usage_error(cmd, "unknown option '%.*s'", (int)len, a);
    if (o->kind == CLI_FLAG) {
      if (eq)
        return cli_usage_error(cmd, "%s takes no value", o->name);
      *(int *)o->dst = 1;
      continue;
    }
    const char *val = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
    if (!val)
      return cli_usage_error(cmd, "%s needs a value", o->name);
    int rc = set_value(cmd, o, val);
    if (rc)
      return rc;
  }
  return 0;
}

int cli_parse_dtype(const char *s) {
  if (strcmp(s, "bf16") == 0)
    return KVT_DTYPE_BF16;
  if (strcmp(s, "fp16") == 0 || strcmp(s, "f16") == 0)
    return KVT_DTYPE_F16;
  return -1;
}

int cli_is_payload_error(int err) {
  switch (err) {
  case KVT_EFORMAT:
  case KVT_EVERSION:
  case KVT_ETRUNC:
  case KVT_ECORRUPT:
  case KVT_ECHECKSUM:
  case KVT_ETOOBIG:
  case KVT_EFOREIGN:
    return 1;
  default:
    return 0;
  }
}

int cli_report_bad_payload(const char *path, kvt_ctx *ctx, int err) {
  const char *detail = kvt_ctx_last_error(ctx);
  fprintf(stderr, "%s: %s: %s\n", path, kvt_err_name(err),
          detail && *detail ? detail : kvt_strerror(err));
  return CLI_EPAYLOAD;
}

int cli_ctx_create(int simd, kvt_ctx **out) {
  kvt_ctx_config cfg = KVT_CTX_CONFIG_INIT;
  cfg.simd = simd;
  int rc = kvt_ctx_create(&cfg, out);
  if (rc == 0)
    return 0;
  if (rc == KVT_ENOTSUP) {
    cli_error("the requested SIMD path is not available on this CPU or build");
    return CLI_EUSAGE;
  }
  cli_error("cannot create a context: %s", kvt_strerror(rc));
  return CLI_EFAIL;
}

/* Reads path; when expect is not SIZE_MAX, a file of another size is an
 * error that names both sizes. */
static int read_impl(const char *path, size_t expect, const char *what, void **out,
                     size_t *out_len) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    cli_error("%s: cannot open: %s", path, strerror(errno));
    return CLI_EIO;
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    cli_error("%s: cannot stat: %s", path, strerror(errno));
    close(fd);
    return CLI_EIO;
  }
  if (S_ISDIR(st.st_mode)) {
    cli_error("%s: is a directory", path);
    close(fd);
    return CLI_EIO;
  }
  if (expect != SIZE_MAX && S_ISREG(st.st_mode) && (uint64_t)st.st_size != expect) {
    cli_error("%s: expected %zu bytes (%s), file has %lld", path, expect, what,
              (long long)st.st_size);
    close(fd);
    return CLI_EUSAGE;
  }
  size_t cap = S_ISREG(st.st_mode) ? (size_t)st.st_size + 1 : 1 << 20, len = 0;
  uint8_t *buf = malloc(cap);
  int rc = buf ? 0 : CLI_EFAIL;
  if (!buf)
    cli_error("%s: out of memory for %zu bytes", path, cap);
  while (rc == 0) {
    if (len == cap) {
      uint8_t *nb = realloc(buf, cap * 2);
      if (!nb) {
        cli_error("%s: out of memory for %zu bytes", path, cap * 2);
        rc = CLI_EFAIL;
        break;
      }
      buf = nb;
      cap *= 2;
    }
    ssize_t n = read(fd, buf + len, cap - len);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0) {
      cli_error("%s: read: %s", path, strerror(errno));
      rc = CLI_EIO;
    } else if (n == 0) {
      break;
    } else {
      len += (size_t)n;
    }
  }
  close(fd);
  if (rc == 0 && expect != SIZE_MAX && len != expect) {
    cli_error("%s: expected %zu bytes (%s), file has %zu", path, expect, what, len);
    rc = CLI_EUSAGE;
  }
  if (rc) {
    free(buf);
    return rc;
  }
  *out = buf;
  if (out_len)
    *out_len = len;
  return 0;
}

int cli_read_file(const char *path, void **buf, size_t *len) {
  return read_impl(path, SIZE_MAX, NULL, buf, len);
}

int cli_read_exact(const char *path, size_t expect, const char *what, void **buf) {
  return read_impl(path, expect, what, buf, NULL);
}

static int write_all(int fd, const uint8_t *p, size_t len) {
  while (len) {
    ssize_t n = write(fd, p, len);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return n < 0 ? errno : EIO;
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

/* The rename is durable only once the directory holding it is synced. */
static void sync_parent_dir(const char *path) {
  char dir[PATH_MAX];
  const char *slash = strrchr(path, '/');
  if (!slash)
    snprintf(dir, sizeof(dir), ".");
  else
    snprintf(dir, sizeof(dir), "%.*s", (int)(slash == path ? 1 : slash - path), path);
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    (void)fsync(fd); /* some file systems refuse fsync on directories */
    close(fd);
  }
}

int cli_write_atomic(const char *path, const void *buf, size_t len) {
  char tmp[PATH_MAX];
  if ((size_t)snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= sizeof(tmp)) {
    cli_error("%s: path too long", path);
    return CLI_EIO;
  }
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) {
    cli_error("%s: cannot create: %s", tmp, strerror(errno));
    return CLI_EIO;
  }
  const char *step = "write";
  int err = write_all(fd, buf, len);
  if (!err && fsync(fd) != 0) {
    step = "fsync";
    err = errno;
  }
  if (close(fd) != 0 && !err) {
    step = "close";
    err = errno;
  }
  if (!err && rename(tmp, path) != 0) {
    step = "rename";
    err = errno;
  }
  if (err) {
    cli_error("%s: %s: %s", tmp, step, strerror(err));
    unlink(tmp);
    return CLI_EIO;
  }
  sync_parent_dir(path);
  return 0;
}

void *cli_alloc_faulted(size_t n) {
  size_t cap = (n + 63) / 64 * 64;
  void *p = aligned_alloc(64, cap ? cap : 64);
  if (!p) {
    cli_error("out of memory for %zu bytes", n);
    return NULL;
  }
  memset(p, 0, cap ? cap : 64);
  return p;
}

double cli_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void cli_json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\')
      fprintf(f, "\\%c", *p);
    else if (*p < 0x20)
      fprintf(f, "\\u%04x", *p);
    else
      fputc(*p, f);
  }
  fputc('"', f);
}

typedef struct par_job {
  void (*fn)(void *, unsigned, unsigned);
  void *arg;
  unsigned i, n;
} par_job;

static void *par_main(void *p) {
  par_job *j = p;
  j->fn(j->arg, j->i, j->n);
  return NULL;
}

void cli_parallel(unsigned n, void (*fn)(void *arg, unsigned i, unsigned n), void *arg) {
  enum { MAX_THREADS = 64 };
  pthread_t th[MAX_THREADS];
  par_job jobs[MAX_THREADS];
  int started[MAX_THREADS] = {0};
  if (n > MAX_THREADS)
    n = MAX_THREADS;
  for (unsigned i = 1; i < n; i++) {
    jobs[i] = (par_job){fn, arg, i, n};
    started[i] = pthread_create(&th[i], NULL, par_main, &jobs[i]) == 0;
  }
  fn(arg, 0, n ? n : 1);
  for (unsigned i = 1; i < n; i++) {
    if (started[i])
      pthread_join(th[i], NULL);
    else
      fn(arg, i, n);
  }
}

unsigned cli_cpu_count(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (unsigned)n : 1;
}

void cli_cpu_model(char *buf, size_t cap) {
  snprintf(buf, cap, "unknown");
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f)
    return;
  char line[512];
  while (fgets(line, sizeof(line), f)) {
    if (strncmp(line, "model name", 10) != 0)
      continue;
    const char *v = strchr(line, ':');
    if (!v)
      continue;
    v++;
    while (*v == ' ' || *v == '\t')
      v++;
    size_t n = strcspn(v, "\n");
    snprintf(buf, cap, "%.*s", (int)n, v);
    break;
  }
  fclose(f);
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

double cli_median(double *v, size_t n) {
  if (n == 0)
    return 0.0;
  qsort(v, n, sizeof(*v), cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void cli_f16_table_fill(cli_f16_table *t, int dtype) {
  for (uint32_t i = 0; i < 65536; i++)
    t->v[i] = dtype == KVT_DTYPE_BF16 ? kvt_bf16_to_f32((uint16_t)i) : kvt_f16_to_f32((uint16_t)i);
}
