/* bench/cli_bench_tier.c - `kvtier bench tier`: PUT and GET throughput of
 * one tier with many operations in flight (kvt_tier_submit/kvt_tier_poll),
 * each against a baseline measured in the same run (STYLE.md): memcpy of the
 * same bytes for dram tiers, fio (io_uring, O_DIRECT) in the tier's
 * directory for nvme tiers. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli_bench_tier.h"
#include "cli_util.h"

static const char tier_help[] =
    "Usage: kvtier bench tier --tiers SPEC [--size 1MiB,4MiB] [--qd 16] [--count N]\n"
    "                         [--reps R] [--json]\n"
    "\n"
    "For each payload size: PUTs --count payloads of random bytes under distinct\n"
    "keys with --qd operations in flight (kvt_tier_submit/kvt_tier_poll), then GETs\n"
    "them all back the same way into 4096-aligned caller buffers, timing each phase;\n"
    "the keys are deleted (untimed) after each repetition. The GET bytes are\n"
    "verified once, outside the timed region. Reports medians of --reps\n"
    "repetitions as GB/s (1e9 bytes/s). Baselines in the same run:\n"
    "  dram:  memcpy of the same buffers (same sizes and count, pre-faulted), timed\n"
    "         in every repetition;\n"
    "  nvme:  fio on a file in the tier's DIR with the same block size, queue\n"
    "         depth and total bytes: --rw=write with --fdatasync=1 (one fdatasync per\n"
    "         block, as the tier does one per payload), then --rw=read; one run of\n"
    "         each after every repetition, so both see the same disk weather. The\n"
    "         first repetition is also shown alone: its PUTs create new files (and\n"
    "         fio's first write allocates its file); later ones overwrite the files\n"
    "         the previous DELs left (and fio overwrites its file). Skipped, and said\n"
    "         so, when fio is not on PATH.\n"
    "\n"
    "Options:\n"
    "  --tiers SPEC   the tier to measure, e.g. dram:2GiB or nvme:/var/tmp/kvt:8GiB\n"
    "  --size LIST    payload sizes, comma-separated (1MiB,4MiB)\n"
    "  --qd N         operations in flight (16)\n"
    "  --count N      payloads per phase (default: 256 MiB worth, at least 8)\n"
    "  --reps R       repetitions per phase, at least 3 (5)\n"
    "  --json         machine-readable output\n";

#define MAX_SIZES 16
#define MAX_REPS 1000
#define ALIGN 4096

typedef struct row {
  uint64_t size, count;
  double put_s, get_s, memcpy_s;       /* medians */
  double put_first_s;                  /* the first repetition's PUT (new files) */
  double fio_w, fio_r;                 /* bytes/s, medians; 0 when not run or failed */
  double fio_w_first;                  /* fio's first write run (allocating its file) */
  char fio_wcmd[1024], fio_rcmd[1024]; /* the command lines */
} row;

typedef struct tb {
  const char *spec, *sizes_s;
  uint32_t qd, count, reps;
  int json;
  int nvme;             /* scheme nvme: compare with fio; else memcpy */
  char dir[1024];       /* nvme: the tier's DIR */
  char fio_version[64]; /* "" when fio is not on PATH */
  kvt_ctx *ctx;
  kvt_tier *tier;
  char shown[1024]; /* the tier's spec as kvt_tier_spec() shows it (secrets as ***),
                     kept past the tier's close for the report */
} tb;

static double gbps(double bytes, double s) { return s > 0 ? bytes / s / 1e9 : 0.0; }
static double rel(double a, double b) { return b > 0 ? a / b : 0.0; }

/* ---- subprocess: fio -------------------------------------------------------- */

static int on_path(const char *name) {
  const char *p = getenv("PATH");
  char buf[4096];
  while (p && *p) {
    const size_t n = strcspn(p, ":");
    snprintf(buf, sizeof(buf), "%.*s/%s", (int)n, n ? p : ".", name);
    if (access(buf, X_OK) == 0)
      return 1;
    p += n + (p[n] == ':');
  }
  return 0;
}

/* Runs argv (no shell) with stdout captured into a malloc'd string (*out;
 * free()); stderr is discarded. Returns the exit status, or -1. */
static int run_capture(char *const *argv, char **out) {
  *out = NULL;
  int fd[2];
  if (pipe(fd) != 0)
    return -1;
  const pid_t pid = fork();
  if (pid < 0) {
    close(fd[0]);
    close(fd[1]);
    return -1;
  }
  if (pid == 0) {
    dup2(fd[1], 1);
    const int null = open("/dev/null", O_WRONLY);
    if (null >= 0)
      dup2(null, 2);
    close(fd[0]);
    close(fd[1]);
    execvp(argv[0], argv);
    _exit(127);
  }
  close(fd[1]);
  size_t len = 0, cap = 65536;
  char *buf = malloc(cap);
  for (;;) {
    if (buf && len + 4096 > cap) {
      char *nb = realloc(buf, cap * 2);
      if (!nb) {
        free(buf);
        buf = NULL;
      } else {
        buf = nb;
        cap *= 2;
      }
    }
    char scratch[4096];
    const ssize_t r = read(fd[0], buf ? buf + len : scratch, buf ? cap - len - 1 : sizeof(scratch));
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      break;
    if (buf)
      len += (size_t)r;
  }
  close(fd[0]);
  int st;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  if (buf)
    buf[len] = '\0';
  *out = buf;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* bw_bytes of the "write" or "read" section of fio's JSON; 0 if absent. */
static double fio_bw(const char *json, const char *section) {
  char key[32];
  snprintf(key, sizeof(key), "\"%s\"", section);
  for (const char *s = strstr(json, key); s; s = strstr(s + 1, key)) {
    const char *v = s + strlen(key); /* the section is an object: "write" : { */
    v += strspn(v, " \t\r\n");
    if (*v++ != ':')
      continue;
    v += strspn(v, " \t\r\n");
    if (*v == '{' && (v = strstr(v, "\"bw_bytes\"")) && (v = strchr(v, ':')))
      return strtod(v + 1, NULL);
  }
  return 0;
}

static void join_argv(char *buf, size_t cap, char *const *argv) {
  size_t n = 0;
  buf[0] = '\0';
  for (size_t i = 0; argv[i] && n < cap; i++)
    n += (size_t)snprintf(buf + n, cap - n, "%s%s", i ? " " : "", argv[i]);
}

/* One fio job; returns bytes/s (0 on failure) and the command line in cmd. */
static double fio_run(const tb *b, const char *rw, uint64_t size, uint64_t total, char *cmd,
                      size_t cmd_cap) {
  char file[1200], bs[64], qd[32], sz[64], fn[1300];
  snprintf(file, sizeof(file), "%s/kvt-bench-fio.%ld.dat", b->dir, (long)getpid());
  snprintf(fn, sizeof(fn), "--filename=%s", file);
  snprintf(bs, sizeof(bs), "--bs=%llu", (unsigned long long)size);
  snprintf(qd, sizeof(qd), "--iodepth=%u", b->qd);
  snprintf(sz, sizeof(sz), "--size=%llu", (unsigned long long)total);
  const int w = strcmp(rw, "write") == 0;
  char rwo[32];
  snprintf(rwo, sizeof(rwo), "--rw=%s", rw);
  char *argv[] = {"fio",
                  "--name=kvtier-bench",
                  fn,
                  "--ioengine=io_uring",
                  "--direct=1",
                  bs,
                  qd,
                  rwo,
                  sz,
                  "--numjobs=1",
                  "--output-format=json",
                  w ? "--fdatasync=1" : NULL,
                  NULL};
  join_argv(cmd, cmd_cap, argv);
  char *out;
  const int st = run_capture(argv, &out);
  const char *j = out ? strchr(out, '{') : NULL;
  const double bw = st == 0 && j ? fio_bw(j, w ? "write" : "read") : 0;
  free(out);
  return bw;
}

static void fio_version(tb *b) {
  b->fio_version[0] = '\0';
  if (!on_path("fio"))
    return;
  char *argv[] = {"fio", "--version", NULL}, *out;
  if (run_capture(argv, &out) == 0 && out)
    snprintf(b->fio_version, sizeof(b->fio_version), "%.*s", (int)strcspn(out, "\r\n"), out);
  else
    snprintf(b->fio_version, sizeof(b->fio_version), "unknown");
  free(out);
}

/* One fio write and one fio read run, for repetition rep. */
static void fio_rep(const tb *b, row *r, double *w, double *rd) {
  const uint64_t total = r->size * r->count;
  *w = fio_run(b, "write", r->size, total, r->fio_wcmd, sizeof(r->fio_wcmd));
  *rd = fio_run(b, "read", r->size, total, r->fio_rcmd, sizeof(r->fio_rcmd));
}

static void fio_done(const tb *b, row *r, double *w, double *rd) {
  char file[1200];
  snprintf(file, sizeof(file), "%s/kvt-bench-fio.%ld.dat", b->dir, (long)getpid());
  unlink(file);
  r->fio_w_first = w[0];
  r->fio_w = cli_median(w, b->reps);
  r->fio_r = cli_median(rd, b->reps);
}

/* ---- the tier ---------------------------------------------------------------- */

static void fill_random(uint8_t *p, size_t n, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i + 8 <= n; i += 8) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    memcpy(p + i, &x, 8);
  }
}

/* Distinct per (rep, i); the first bytes hash-like, as real chunk keys are
 * (a tier may shard on them: the nvme tier's subdirectories). */
static void make_key(kvt_key *k, uint64_t size, uint32_t rep, uint64_t i) {
  const uint64_t lo = i | (uint64_t)rep << 32;
  uint64_t h = lo + size * 0x9E3779B97F4A7C15ull;
  h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
  h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
  h ^= h >> 31;
  memcpy(k->bytes, &h, 8);
  memcpy(k->bytes + 8, &lo, 8);
}

/* Runs ops[0..n) with at most qd in flight. 0 or the first error. */
static int pipeline(tb *b, kvt_tier_op **ptr, kvt_tier_op **done, size_t n) {
  size_t sub = 0, fin = 0;
  int err = 0;
  while (fin < n) {
    while (sub < n && sub - fin < b->qd) {
      size_t want = n - sub < b->qd - (sub - fin) ? n - sub : b->qd - (sub - fin);
      const int k = kvt_tier_submit(b->tier, ptr + sub, want);
      if (k == -EAGAIN)
        break;
      if (k < 0)
        return k;
      sub += (size_t)k;
    }
    const int k = kvt_tier_poll(b->tier, done, b->qd, -1);
    if (k < 0)
      return k;
    for (int i = 0; i < k; i++)
      if (done[i]->result && !err)
        err = done[i]->result;
    fin += (size_t)k;
  }
  return err;
}

static int phase(tb *b, kvt_tier_op *ops, kvt_tier_op **ptr, kvt_tier_op **done, int opcode,
                 uint8_t **bufs, uint64_t size, uint64_t count, uint32_t rep, double *t) {
  for (uint64_t i = 0; i < count; i++) {
    kvt_key k;
    make_key(&k, size, rep, i);
    kvt_tier_op_init(&ops[i], opcode, &k, bufs ? bufs[i] : NULL, bufs ? size : 0, i);
    ptr[i] = &ops[i];
  }
  const double t0 = cli_now();
  const int rc = pipeline(b, ptr, done, count);
  if (t)
    *t = cli_now() - t0;
  if (rc == 0 && opcode == KVT_TIER_GET)
    for (uint64_t i = 0; i < count; i++)
      if (ops[i].out_len != size)
        return -EIO;
  return rc;
}

static int bench_size(tb *b, row *r) {
  const uint64_t size = r->size, count = r->count;
  uint8_t **src = calloc(count, sizeof(*src)), **dst = calloc(count, sizeof(*dst));
  kvt_tier_op *ops = calloc(count, sizeof(*ops));
  kvt_tier_op **ptr = calloc(count, sizeof(*ptr)), **done = calloc(b->qd, sizeof(*done));
  double *tp = calloc(b->reps, sizeof(double)), *tg = calloc(b->reps, sizeof(double));
  double *tm = calloc(b->reps, sizeof(double));
  double *fw = calloc(b->reps, sizeof(double)), *fr = calloc(b->reps, sizeof(double));
  const int fio = b->nvme && b->fio_version[0];
  int rc = !src || !dst || !ops || !ptr || !done || !tp || !tg || !tm || !fw || !fr ? -ENOMEM : 0;
  for (uint64_t i = 0; i < count && rc == 0; i++) {
    src[i] = aligned_alloc(ALIGN, size);
    dst[i] = aligned_alloc(ALIGN, size);
    if (!src[i] || !dst[i])
      rc = -ENOMEM;
    else {
      fill_random(src[i], size, size ^ (i << 20));
      memset(dst[i], 0, size); /* pre-faulted; zero, so verification means something */
    }
  }
  const char *what = "allocating buffers";
  for (uint32_t rep = 0; rep < b->reps && rc == 0; rep++) {
    double t0 = cli_now();
    for (uint64_t i = 0; i < count; i++)
      memcpy(dst[i], src[i], size);
    tm[rep] = cli_now() - t0;
    if (rep == 0)
      for (uint64_t i = 0; i < count; i++)
        memset(dst[i], 0, size);
    what = "PUT";
    if ((rc = phase(b, ops, ptr, done, KVT_TIER_PUT, src, size, count, rep, &tp[rep])))
      break;
    what = "GET";
    if ((rc = phase(b, ops, ptr, done, KVT_TIER_GET, dst, size, count, rep, &tg[rep])))
      break;
    if (rep == 0)
      for (uint64_t i = 0; i < count && rc == 0; i++)
        if (memcmp(src[i], dst[i], size) != 0) {
          what = "verifying GET bytes";
          rc = -EIO;
        }
    what = "DEL";
    if (rc == 0)
      rc = phase(b, ops, ptr, done, KVT_TIER_DEL, NULL, size, count, rep, NULL);
    if (rc == 0 && fio)
      fio_rep(b, r, &fw[rep], &fr[rep]);
  }
  if (rc)
    cli_error("bench tier: %s: %llu x %llu bytes: %s", kvt_tier_spec(b->tier),
              (unsigned long long)count, (unsigned long long)size, what);
  else {
    r->put_first_s = tp[0];
    r->put_s = cli_median(tp, b->reps);
    r->get_s = cli_median(tg, b->reps);
    r->memcpy_s = cli_median(tm, b->reps);
  }
  for (uint64_t i = 0; src && dst && i < count; i++) {
    free(src[i]);
    free(dst[i]);
  }
  if (fio)
    fio_done(b, r, fw, fr);
  free(fr), free(fw);
  free(tm), free(tg), free(tp), free(done), free(ptr), free(ops), free(dst), free(src);
  return rc ? CLI_EFAIL : 0;
}

/* ---- report ------------------------------------------------------------------ */

static void print_json(const tb *b, const row *rows, size_t n, const char *cpu) {
  printf("{\"machine\": {\"cpu\": ");
  cli_json_str(stdout, cpu);
  printf(", \"cpus_online\": %u},\n \"tier\": ", cli_cpu_count());
  cli_json_str(stdout, b->shown);
  printf(", \"scheme\": \"%s\", \"qd\": %u, \"reps\": %u, \"baseline\": \"%s\",\n \"fio\": ",
         b->nvme ? "nvme" : "dram", b->qd, b->reps, b->nvme ? "fio" : "memcpy");
  if (b->nvme && b->fio_version[0]) {
    printf("{\"version\": ");
    cli_json_str(stdout, b->fio_version);
    printf(", \"runs\": %u, \"interleaved\": true, \"write_sync\": \"--fdatasync=1\"}", b->reps);
  } else
    printf("null");
  printf(",\n \"sizes\": [");
  for (size_t i = 0; i < n; i++) {
    const row *r = &rows[i];
    const double bytes = (double)r->size * (double)r->count;
    const double p = gbps(bytes, r->put_s), g = gbps(bytes, r->get_s);
    printf("%s\n  {\"size\": %llu, \"count\": %llu, \"put_gbps\": %.4f, \"get_gbps\": %.4f",
           i ? "," : "", (unsigned long long)r->size, (unsigned long long)r->count, p, g);
    if (!b->nvme) {
      const double m = gbps(bytes, r->memcpy_s);
      printf(", \"memcpy_gbps\": %.4f, \"put_vs_memcpy\": %.4f, \"get_vs_memcpy\": %.4f}", m,
             rel(p, m), rel(g, m));
    } else if (b->fio_version[0]) {
      const double w = r->fio_w / 1e9, rd = r->fio_r / 1e9;
      const double pf = gbps(bytes, r->put_first_s), wf = r->fio_w_first / 1e9;
      printf(", \"fio_write_gbps\": %.4f, \"fio_read_gbps\": %.4f, \"put_vs_fio_write\": %.4f, "
             "\"get_vs_fio_read\": %.4f, \"put_first_gbps\": %.4f, \"fio_write_first_gbps\": "
             "%.4f, \"put_first_vs_fio_write_first\": %.4f, \"fio_write_cmd\": ",
             w, rd, rel(p, w), rel(g, rd), pf, wf, rel(pf, wf));
      cli_json_str(stdout, r->fio_wcmd);
      printf(", \"fio_read_cmd\": ");
      cli_json_str(stdout, r->fio_rcmd);
      printf("}");
    } else
      printf("}");
  }
  printf("]}\n");
}

static void print_text(const tb *b, const row *rows, size_t n, const char *cpu, int argc,
                       char **argv) {
  printf("command: kvtier bench");
  for (int i = 0; i < argc; i++) { /* the spec as the tier shows it: secrets as *** */
    if (strncmp(argv[i], "--tiers=", 8) == 0)
      printf(" --tiers=%s", b->shown);
    else
      printf(" %s", i && !strcmp(argv[i - 1], "--tiers") ? b->shown : argv[i]);
  }
  printf("\nmachine: %s, %u CPUs online\n", cpu, cli_cpu_count());
  printf("tier: %s; %u operations in flight (submit/poll); medians of %u repetitions\n", b->shown,
         b->qd, b->reps);
  if (b->nvme && b->fio_version[0])
    printf("baseline: %s, one run per job after each repetition (medians of %u); writes with "
           "--fdatasync=1 (one fdatasync per block = per payload, as the tier's PUT)\n",
           b->fio_version, b->reps);
  else if (b->nvme)
    printf("baseline: fio is not on PATH: fio comparison skipped\n");
  else
    printf("baseline: memcpy of the same buffers (same sizes and count, pre-faulted)\n");
  printf("\n%10s %7s %9s %9s %9s %9s %8s %8s\n", "size", "count", "PUT", "GET",
         b->nvme ? "fio-wr" : "memcpy", b->nvme ? "fio-rd" : "", b->nvme ? "PUT/fio" : "PUT/mc",
         b->nvme ? "GET/fio" : "GET/mc");
  printf("%10s %7s %9s %9s %9s %9s\n", "bytes", "", "GB/s", "GB/s", "GB/s", b->nvme ? "GB/s" : "");
  for (size_t i = 0; i < n; i++) {
    const row *r = &rows[i];
    const double bytes = (double)r->size * (double)r->count;
    const double p = gbps(bytes, r->put_s), g = gbps(bytes, r->get_s);
    printf("%10llu %7llu %9.3f %9.3f", (unsigned long long)r->size, (unsigned long long)r->count, p,
           g);
    if (!b->nvme) {
      const double m = gbps(bytes, r->memcpy_s);
      printf(" %9.3f %9s %8.3f %8.3f\n", m, "", rel(p, m), rel(g, m));
    } else if (b->fio_version[0]) {
      const double w = r->fio_w / 1e9, rd = r->fio_r / 1e9;
      printf(" %9.3f %9.3f %8.3f %8.3f\n", w, rd, rel(p, w), rel(g, rd));
    } else
      printf(" %9s %9s %8s %8s\n", "-", "-", "-", "-");
  }
  if (b->nvme && b->fio_version[0]) {
    printf("\nfirst repetition alone (the tier creates new files, fio allocates its file):\n");
    for (size_t i = 0; i < n; i++) {
      const row *r = &rows[i];
      const double pf = gbps((double)r->size * (double)r->count, r->put_first_s);
      printf("%10llu  PUT %.3f GB/s  fio-wr %.3f GB/s  PUT/fio %.3f\n", (unsigned long long)r->size,
             pf, r->fio_w_first / 1e9, rel(pf, r->fio_w_first / 1e9));
    }
    for (size_t i = 0; i < n; i++)
      printf("\nfio write: %s\nfio read:  %s", rows[i].fio_wcmd, rows[i].fio_rcmd);
  }
  printf("\n\nGB/s: 1e9 payload bytes per second over the whole phase (first submit to last "
         "completion).\n");
}

/* ---- entry ------------------------------------------------------------------- */

static int parse_sizes(const char *s, row *rows, size_t *n) {
  char buf[256];
  snprintf(buf, sizeof(buf), "%s", s);
  *n = 0;
  for (char *save, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    uint64_t v;
    if (*n == MAX_SIZES || kvt_parse_size(tok, &v) != 0 || v == 0 || v > (1ull << 30))
      return cli_usage_error("bench tier", "--size: bad size '%s' (1 B .. 1 GiB, at most %d)", tok,
                             MAX_SIZES);
    rows[(*n)++].size = v;
  }
  return *n ? 0 : cli_usage_error("bench tier", "--size: no size given");
}

int cli_bench_tier_main(int argc, char **argv) {
  tb b;
  memset(&b, 0, sizeof(b));
  b.sizes_s = "1MiB,4MiB";
  b.qd = 16;
  b.reps = 5;
  const cli_opt opts[] = {
      {"--tiers", NULL, CLI_STR, &b.spec, 0, 0},
      {"--size", NULL, CLI_STR, &b.sizes_s, 0, 0},
      {"--qd", NULL, CLI_U32, &b.qd, 1, 4096},
      {"--count", NULL, CLI_U32, &b.count, 1, 1 << 20},
      {"--reps", NULL, CLI_U32, &b.reps, 3, MAX_REPS},
      {"--json", NULL, CLI_FLAG, &b.json, 0, 0},
  };
  size_t n_pos, n_rows;
  int rc =
      cli_parse("bench tier", argc, argv, opts, sizeof(opts) / sizeof(opts[0]), NULL, 0, &n_pos);
  if (rc == CLI_HELP)
    fputs(tier_help, stdout);
  if (rc)
    return rc == CLI_HELP ? CLI_OK : rc;
  if (!b.spec)
    return cli_usage_error("bench tier", "--tiers SPEC is required (e.g. dram:2GiB)");
  row rows[MAX_SIZES];
  memset(rows, 0, sizeof(rows));
  if ((rc = parse_sizes(b.sizes_s, rows, &n_rows)))
    return rc;
  /* The innermost tier of decorators ("trace@nvme:..."): its scheme and DIR. */
  const char *base = strrchr(b.spec, '@') ? strrchr(b.spec, '@') + 1 : b.spec;
  if (strncmp(base, "hbm:", 4) == 0)
    return cli_usage_error("bench tier",
                           "'%s': device memory has no host baseline here; "
                           "'kvtier bench gpu' measures loads from HBM against cudaMemcpy",
                           b.spec);
  if (strncmp(base, "nvme:", 5) == 0) {
    b.nvme = 1;
    const char *last = strrchr(base + 5, ':');
    snprintf(b.dir, sizeof(b.dir), "%.*s", last ? (int)(last - (base + 5)) : 0, base + 5);
    fio_version(&b);
  }
  for (size_t i = 0; i < n_rows; i++) {
    const uint64_t auto_n = (256ull << 20) / rows[i].size;
    rows[i].count = b.count ? b.count : auto_n < 8 ? 8 : auto_n;
  }
  if ((rc = cli_ctx_create(KVT_SIMD_AUTO, &b.ctx)))
    return rc;
  if ((rc = kvt_tier_open(b.ctx, b.spec, &b.tier))) {
    /* The detail names the tier (its secrets as ***), the spec is not repeated. */
    cli_error("bench tier: cannot open the tier: %s: %s", kvt_err_name(rc),
              kvt_ctx_last_error(b.ctx));
    kvt_ctx_destroy(b.ctx);
    return CLI_EFAIL;
  }
  snprintf(b.shown, sizeof(b.shown), "%s", kvt_tier_spec(b.tier));
  for (size_t i = 0; i < n_rows && rc == 0; i++)
    rc = bench_size(&b, &rows[i]);
  kvt_tier_close(b.tier);
  b.tier = NULL;
  kvt_ctx_destroy(b.ctx);
  if (rc)
    return rc;
  char cpu[256];
  cli_cpu_model(cpu, sizeof(cpu));
  if (b.json)
    print_json(&b, rows, n_rows, cpu);
  else
    print_text(&b, rows, n_rows, cpu, argc, argv);
  return CLI_OK;
}
