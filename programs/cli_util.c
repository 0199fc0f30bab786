/* programs/cli_util.c - option parsing, messages, file I/O with atomic
 * replace, timing and threads for the kvtier subcommands; see cli_util.h. */
#include "cli_util.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
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

int cli_without_cuda(const char *cmd, int argc, char **argv, const char *help) {
  if (argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
    fputs(help, stdout);
    return CLI_OK;
  }
  cli_error("%s: this kvtier was built without CUDA", cmd);
  return CLI_EFAIL;
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

/* The directory part of path into dir ("." when it has none). */
static void dir_of(const char *path, char *dir, size_t cap) {
  const char *slash = strrchr(path, '/');
  if (!slash)
    snprintf(dir, cap, ".");
  else
    snprintf(dir, cap, "%.*s", (int)(slash == path ? 1 : slash - path), path);
}

/* The rename is durable only once the directory holding it is synced. */
static void sync_parent_dir(const char *path) {
  char dir[PATH_MAX];
  dir_of(path, dir, sizeof(dir));
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    (void)fsync(fd); /* some file systems refuse fsync on directories */
    close(fd);
  }
}

#define PROC_MAGIC 0x9fa0 /* PROC_SUPER_MAGIC */

/* Whether the link link_st at path may be followed by hand: not one that
 * another user made in a sticky, world-writable directory (/tmp), unless
 * the directory is theirs. The kernel's rule (fs.protected_symlinks),
 * applied whatever that setting: following such a link would let anyone
 * who can write to /tmp choose the file a root kvtier replaces. */
static int link_trusted(const char *path, const struct stat *link_st) {
  char dir[PATH_MAX];
  struct stat d;
  dir_of(path, dir, sizeof(dir));
  if (stat(dir, &d) != 0)
    return 0;
  return !(d.st_mode & S_ISVTX) || !(d.st_mode & S_IWOTH) || link_st->st_uid == geteuid() ||
         link_st->st_uid == d.st_uid;
}

/* Whether path, a symlink, is one of procfs' (/dev/stdout leads to
 * /proc/self/fd/1): what readlink says of those is no path to write to (a
 * pipe, "NAME (deleted)", a file the shell holds open at an offset). */
static int in_procfs(const char *path) {
  char dir[PATH_MAX];
  struct statfs fs;
  dir_of(path, dir, sizeof(dir));
  return statfs(dir, &fs) == 0 && fs.f_type == PROC_MAGIC;
}

/* Follows path while it is a symlink, so the file written and renamed over
 * is the link's target and the link stays. *st is the final file's lstat
 * (st_mode 0 when it does not exist yet). A link of procfs is not followed:
 * *st is then that link's lstat (S_ISLNK), out the link. Returns 0 or an
 * errno (EACCES: a link link_trusted() refuses). */
static int resolve_links(const char *path, char *out, size_t cap, struct stat *st) {
  if (strlen(path) >= cap)
    return ENAMETOOLONG;
  snprintf(out, cap, "%s", path);
  for (int hops = 0; hops < 40; hops++) {
    if (lstat(out, st) != 0) {
      memset(st, 0, sizeof(*st));
      return errno == ENOENT ? 0 : errno;
    }
    if (!S_ISLNK(st->st_mode) || in_procfs(out))
      return 0;
    if (!link_trusted(out, st))
      return EACCES;
    char link[PATH_MAX], dir[PATH_MAX];
    const ssize_t n = readlink(out, link, sizeof(link) - 1);
    if (n < 0)
      return errno;
    link[n] = '\0';
    dir_of(out, dir, sizeof(dir));
    const int w = link[0] == '/' || !strchr(out, '/') ? snprintf(out, cap, "%s", link)
                                                      : snprintf(out, cap, "%s/%s", dir, link);
    if (w < 0 || (size_t)w >= cap)
      return ENAMETOOLONG;
  }
  return ELOOP;
}

/* One output being written: in place (a device, FIFO or other special
 * file), or into tmp, renamed over target on commit. */
typedef struct out_file {
  const char *path;      /* as named on the command line (messages) */
  char target[PATH_MAX]; /* path with its symlinks followed */
  char tmp[PATH_MAX];    /* "" when written in place */
  int fd;
} out_file;

static int out_fail(out_file *o, const char *step, int err) {
  cli_error("%s: %s: %s", o->path, step, strerror(err));
  if (o->fd >= 0)
    close(o->fd);
  o->fd = -1;
  if (o->tmp[0])
    unlink(o->tmp);
  o->tmp[0] = '\0';
  return CLI_EIO;
}

/* A temporary file beside o->target, with the mode the target has (a new
 * file: 0666 less the umask), created exclusively so that a planted
 * symlink or another writer's file is never opened. */
static int out_open_tmp(out_file *o, const struct stat *st) {
  if ((size_t)snprintf(o->tmp, sizeof(o->tmp), "%s.tmp.XXXXXX", o->target) >= sizeof(o->tmp)) {
    o->tmp[0] = '\0';
    return out_fail(o, "cannot create a temporary file", ENAMETOOLONG);
  }
  o->fd = mkostemp(o->tmp, O_CLOEXEC);
  if (o->fd < 0) {
    o->tmp[0] = '\0';
    return out_fail(o, "cannot create a temporary file beside it", errno);
  }
  mode_t mode = st->st_mode & 0777;
  if (!S_ISREG(st->st_mode)) {
    const mode_t mask = umask(0); /* reading it means setting it */
    umask(mask);
    mode = 0666 & ~mask;
  }
  if (fchmod(o->fd, mode) != 0)
    return out_fail(o, "fchmod", errno);
  return 0;
}

/* This process's descriptor N when link (a procfs link) is
 * /proc/{self,thread-self,PID}/fd/N, else -1. */
static int own_fd(const char *link) {
  char self[32];
  snprintf(self, sizeof(self), "/proc/%ld/fd/", (long)getpid());
  static const char *const dirs[] = {"/proc/self/fd/", "/proc/thread-self/fd/", "/dev/fd/"};
  const char *n = strncmp(link, self, strlen(self)) == 0 ? link + strlen(self) : NULL;
  for (size_t i = 0; !n && i < sizeof(dirs) / sizeof(dirs[0]); i++)
    if (strncmp(link, dirs[i], strlen(dirs[i])) == 0)
      n = link + strlen(dirs[i]);
  char *end = NULL;
  const long fd = n && *n >= '0' && *n <= '9' ? strtol(n, &end, 10) : -1;
  return end && !*end && fd <= INT_MAX ? (int)fd : -1;
}

/* An output named through procfs (o->target, where resolve_links stopped)
 * is written in place, as a shell's redirection would: this process's own
 * descriptor (-o /dev/stdout, /dev/fd/N) is written through a duplicate, at
 * its offset (or its end, with O_APPEND), so bytes the shell writes to it
 * afterwards follow the output; another link is opened by the kernel and a
 * regular file it leads to truncated. Never replaced by name: readlink's
 * answer there may be a pipe or "NAME (deleted)". */
static int out_open_proc(out_file *o) {
  const int n = own_fd(o->target);
  o->fd = n >= 0 ? fcntl(n, F_DUPFD_CLOEXEC, 0)
                 : open(o->target, O_WRONLY | O_TRUNC | O_NOCTTY | O_CLOEXEC);
  if (o->fd < 0)
    return out_fail(o, "cannot open", errno);
  const int acc = fcntl(o->fd, F_GETFL);
  if (acc < 0 || (acc & O_ACCMODE) == O_RDONLY)
    return out_fail(o, "cannot write", acc < 0 ? errno : EBADF);
  return 0;
}

/* Opens o for path: a special file in place, a regular or new file (or a
 * symlink's target) through a temporary file. The kernel follows the links
 * to a special file (/dev/stdout through /proc/self/fd/1 to a pipe has no
 * name to follow by hand); a regular or new file's name is followed by
 * hand, as the rename needs it. */
static int out_open(out_file *o, const char *path) {
  struct stat st;
  o->path = path;
  o->fd = -1;
  o->tmp[0] = '\0';
  int err = resolve_links(path, o->target, sizeof(o->target), &st);
  if (err)
    return out_fail(o, "cannot look up", err);
  if (S_ISLNK(st.st_mode)) /* one of procfs: see out_open_proc */
    return out_open_proc(o);
  if (stat(path, &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) {
    /* A FIFO's open waits for its reader, as a shell's would. */
    o->fd = open(path, O_WRONLY | O_NOCTTY | O_CLOEXEC);
    if (o->fd < 0)
      return out_fail(o, "cannot open", errno);
    if (fstat(o->fd, &st) != 0)
      return out_fail(o, "cannot stat", errno);
    if (!S_ISREG(st.st_mode))
      return 0;
    close(o->fd); /* replaced by a regular file meanwhile: that is replaced atomically */
    o->fd = -1;
  }
  err = resolve_links(path, o->target, sizeof(o->target), &st);
  if (!err && S_ISLNK(st.st_mode))
    err = EAGAIN; /* became a procfs link meanwhile */
  if (err)
    return out_fail(o, "cannot look up", err);
  if (S_ISDIR(st.st_mode))
    return out_fail(o, "cannot write", EISDIR);
  if (st.st_mode != 0 && !S_ISREG(st.st_mode)) /* a special file appeared meanwhile */
    return out_fail(o, "changed while being opened", EAGAIN);
  return out_open_tmp(o, &st);
}

/* Writes and closes o: a temporary file is fsync'd; a special file is not,
 * as character devices and FIFOs have nothing to sync (EINVAL), except a
 * block device. SIGPIPE is ignored meanwhile, so a FIFO whose reader went
 * away is an error (EPIPE) rather than the end of the program. */
static int out_write(out_file *o, const void *buf, size_t len) {
  struct stat st;
  struct sigaction ign = {0}, old;
  ign.sa_handler = SIG_IGN;
  sigemptyset(&ign.sa_mask);
  const int in_place = !o->tmp[0];
  if (in_place)
    sigaction(SIGPIPE, &ign, &old);
  int err = write_all(o->fd, buf, len);
  if (in_place)
    sigaction(SIGPIPE, &old, NULL);
  if (err)
    return out_fail(o, "write", err);
  const int durable = !in_place || (fstat(o->fd, &st) == 0 && S_ISBLK(st.st_mode));
  if (durable && fsync(o->fd) != 0)
    return out_fail(o, "fsync", errno);
  err = close(o->fd) != 0 ? errno : 0;
  o->fd = -1;
  return err ? out_fail(o, "close", err) : 0;
}

static int out_commit(out_file *o) {
  if (!o->tmp[0])
    return 0;
  if (rename(o->tmp, o->target) != 0)
    return out_fail(o, "rename", errno);
  o->tmp[0] = '\0';
  sync_parent_dir(o->target);
  return 0;
}

int cli_write_outputs(const char *const *paths, const void *const *bufs, const size_t *lens,
                      size_t n) {
  out_file outs[CLI_MAX_OUTPUTS];
  size_t opened = 0;
  int rc = 0;
  if (n > CLI_MAX_OUTPUTS) {
    cli_error("%zu outputs, at most %d", n, CLI_MAX_OUTPUTS);
    return CLI_EFAIL;
  }
  /* Each one written and closed before the next is opened: one reader
   * reading two FIFOs in turn sees the first end before the second opens. */
  for (; rc == 0 && opened < n; opened++)
    if ((rc = out_open(&outs[opened], paths[opened])) == 0)
      rc = out_write(&outs[opened], bufs[opened], lens[opened]);
  for (size_t i = 0; rc == 0 && i < n; i++)
    rc = out_commit(&outs[i]);
  for (size_t i = 0; i < opened; i++)
    if (outs[i].tmp[0])
      unlink(outs[i].tmp);
  return rc;
}

FILE *cli_summary_stream(const char *const *paths, size_t n) {
  struct stat out, st;
  if (fstat(STDOUT_FILENO, &out) != 0)
    return stdout;
  for (size_t i = 0; i < n; i++)
    if (paths[i] && stat(paths[i], &st) == 0 && st.st_dev == out.st_dev && st.st_ino == out.st_ino)
      return stderr;
  return stdout;
}

int cli_write_output(const char *path, const void *buf, size_t len) {
  return cli_write_outputs(&path, &buf, &len, 1);
}

int cli_check_output(const char *cmd, const char *opt, const char *path) {
  if (path && !*path)
    return cli_usage_error(cmd, "%s: the path is empty", opt);
  return 0;
}

/* Where path's file is or would be created: its directory's inode and its
 * own name, symlinks followed. Returns 0 or an errno. */
static int new_file_identity(const char *path, struct stat *dir_st, const char **name, char *buf,
                             size_t cap) {
  struct stat st;
  char dir[PATH_MAX];
  int err = resolve_links(path, buf, cap, &st);
  if (err)
    return err;
  dir_of(buf, dir, sizeof(dir));
  if (stat(dir, dir_st) != 0)
    return errno;
  const char *slash = strrchr(buf, '/');
  *name = slash ? slash + 1 : buf;
  return 0;
}

int cli_same_file(const char *a, const char *b) {
  struct stat sa, sb;
  const int ea = stat(a, &sa) != 0, eb = stat(b, &sb) != 0;
  if (!ea && !eb)
    return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino && S_ISREG(sa.st_mode);
  if (!ea || !eb)
    return 0;
  char ba[PATH_MAX], bb[PATH_MAX];
  const char *na = NULL, *nb = NULL; /* set when new_file_identity returns 0 */
  if (new_file_identity(a, &sa, &na, ba, sizeof(ba)) ||
      new_file_identity(b, &sb, &nb, bb, sizeof(bb)))
    return 0;
  return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino && strcmp(na, nb) == 0;
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
