/* tiers/nvme/tier_nvme_open.c - opening and closing the nvme tier: the spec,
 * the directory's owner (a lock), the directory and its 256 subdirectories,
 * the index rebuilt from the header blocks on disk (torn files and stray
 * temporaries removed, entries that are not regular files skipped), the
 * requests and I/O buffers preallocated for the data path, and the engine. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "tier_nvme.h"

static const char *file_kind(mode_t m) {
  if (S_ISFIFO(m))
    return "a FIFO";
  if (S_ISLNK(m))
    return "a symbolic link";
  if (S_ISDIR(m))
    return "a directory";
  return "not a regular file";
}

/* Reads one file's header block: 1 when it names a whole, valid value, 0
 * when it does not (torn), -1 when it is no file of ours to judge: not a
 * regular file (a FIFO's open would wait for a writer forever, a link leads
 * elsewhere), or it cannot be opened. Those are skipped and left alone. */
static int scan_file(const nvme *n, int dfd, const char *sub, const char *name, uint8_t *blk,
                     const kvt_key *k, uint64_t *len) {
  struct stat st;
  if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0)
    return -1; /* gone since readdir */
  int fd = -1;
  if (S_ISREG(st.st_mode)) /* and still one when opened: no link followed, no wait */
    fd = openat(dfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK |
                               (n->direct ? O_DIRECT : 0));
  if (fd >= 0 && (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))) {
    close(fd);
    fd = -1;
  }
  if (fd < 0) {
    kvt_logf(n->ctx, KVT_LOG_WARN, "nvme tier: %s/%s: %s; skipped, left in place", sub, name,
             S_ISREG(st.st_mode) ? strerror(errno) : file_kind(st.st_mode));
    return -1;
  }
  const int ok = pread(fd, blk, NVME_BLK, 0) == (ssize_t)NVME_BLK &&
                 nvme_header_ok(blk, k, len) && (uint64_t)st.st_size == nvme_disk_size(*len);
  close(fd);
  return ok;
}

/* What a torn file and a stray temporary or spare become: removed by the
 * directory's owner, left alone by a reader (readonly=1). */
static void scan_remove(const nvme *n, int dfd, const char *name) {
  if (!n->readonly)
    unlinkat(dfd, name, 0);
}

static int scan_subdir(nvme *n, const char *sub, int dfd, uint8_t *blk) {
  DIR *d = opendir(sub);
  if (!d)
    return -errno;
  int rc = 0;
  struct dirent *de;
  while (rc == 0 && (de = readdir(d)) != NULL) {
    kvt_key k;
    uint64_t len = 0;
    int got;
    if (strncmp(de->d_name, ".tmp-", 5) == 0 || strncmp(de->d_name, ".free-", 6) == 0) {
      /* a PUT that never committed, or a spare (maybe half overwritten); the
       * directory has one writer (lock_take): not another process's PUT */
      scan_remove(n, dfd, de->d_name);
    } else if (nvme_hex_key(de->d_name, &k) != 0) {
      continue; /* ".", "..", or not ours: left alone */
    } else if ((got = scan_file(n, dfd, sub, de->d_name, blk, &k, &len)) < 0) {
      continue;
    } else if (!got) {
      kvt_logf(n->ctx, KVT_LOG_WARN, "nvme tier: %s/%s: bad header or size (torn); %s", sub,
               de->d_name, n->readonly ? "skipped, left in place (read-only)" : "deleted");
      scan_remove(n, dfd, de->d_name);
      n->corrupt++;
    } else if ((rc = kvt_index_reserve(&n->ix, n->ix.items + 1)) == 0) {
      int fresh;
      kvt_index_entry *e = kvt_index_upsert(&n->ix, &k, &fresh);
      e->len = len;
      e->off = nvme_disk_size(len);
      n->used += e->off;
    }
  }
  closedir(d);
  return rc;
}

/* Whether the file system takes O_DIRECT (tmpfs does not) and fallocate. */
static void probe(nvme *n) {
  char path[NVME_PATH];
  snprintf(path, sizeof(path), "%s/.probe-direct", n->dir);
  unlink(path); /* a new file: never a FIFO's open that waits, nor a link */
  const int flags = O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW;
  int fd = open(path, flags | O_DIRECT, 0644);
  n->direct = fd >= 0 || errno != EINVAL;
  if (fd < 0)
    fd = open(path, flags, 0644);
  n->falloc = fd >= 0 && fallocate(fd, 0, 0, NVME_BLK) == 0;
  if (fd >= 0)
    close(fd);
  unlink(path);
  if (!n->direct)
    kvt_logf(n->ctx, KVT_LOG_WARN, "nvme tier: %s refuses O_DIRECT: buffered I/O", n->dir);
}

/* Who holds DIR's lock, from the pid the holder wrote in DIR/.lock:
 * "pid N (comm)". */
static void lock_holder(const nvme *n, char *out, size_t cap) {
  char buf[24] = {0}, path[NVME_PATH], comm[32] = {0};
  char *end = NULL;
  snprintf(path, sizeof(path), "%s/.lock", n->dir);
  const int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  const long pid = fd >= 0 && pread(fd, buf, sizeof(buf) - 1, 0) > 0 ? strtol(buf, &end, 10) : 0;
  if (fd >= 0)
    close(fd);
  if (pid <= 0 || *end != '\n') {
    snprintf(out, cap, "another process (pid not written yet)");
    return;
  }
  snprintf(path, sizeof(path), "/proc/%ld/comm", pid);
  const int cfd = open(path, O_RDONLY | O_CLOEXEC);
  if (cfd >= 0) {
    if (read(cfd, comm, sizeof(comm) - 1) > 0)
      comm[strcspn(comm, "\n")] = '\0';
    close(cfd);
  }
  snprintf(out, cap, "pid %ld%s%s%s%s", pid, comm[0] ? " (" : "", comm, comm[0] ? ")" : "",
           pid == (long)getpid() ? ", this process" : "");
}

/* The holder's pid into DIR/.lock, for the error a second writer gets: the
 * new pid, then the end cut, so a reader sees one pid and its newline. A
 * file that cannot be written (replaced by a FIFO or a link) costs the
 * message its pid, not the lock. */
static void lock_note_pid(nvme *n) {
  char path[NVME_PATH], pid[24];
  snprintf(path, sizeof(path), "%s/.lock", n->dir);
  const int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
  struct stat st;
  const int len = snprintf(pid, sizeof(pid), "%ld\n", (long)getpid());
  if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
      pwrite(fd, pid, (size_t)len, 0) != len || ftruncate(fd, len) != 0)
    kvt_logf(n->ctx, KVT_LOG_WARN, "nvme tier: writing the pid to '%s': %s", path,
             fd < 0 ? strerror(errno) : "not written (not a regular file, or a write failed)");
  if (fd >= 0)
    close(fd);
}

/* A directory has one writer: an exclusive flock() on DIR itself, held
 * until close (on the directory, not on a file in it, which could be
 * deleted or replaced while held - by a cleaner of old files, an operator -
 * and let a second writer lock a new one), the holder's pid written in
 * DIR/.lock for the error a second writer gets (-EBUSY). Opening removes
 * stray temporaries and spares, which would be another writer's PUTs in
 * flight. flock() locks belong to the open file, not to the process: a
 * second open in the same process conflicts too, and a child forked while
 * the tier is open holds it with the parent. Readers (readonly=1) take no
 * lock: they change nothing. */
static int lock_take(nvme *n) {
  const int fd = open(n->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return kvt_fail(n->ctx, -errno, "nvme tier: '%s': %s", n->dir, strerror(errno));
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno == EWOULDBLOCK ? EBUSY : errno;
    close(fd);
    if (err != EBUSY)
      return kvt_fail(n->ctx, -err, "nvme tier: locking '%s': %s", n->dir, strerror(err));
    char who[96];
    lock_holder(n, who, sizeof(who));
    return kvt_fail(n->ctx, -EBUSY,
                    "nvme tier: '%s' is in use by %s: a directory has one writer "
                    "(readonly=1 opens it to read alongside)",
                    n->dir, who);
  }
  lock_note_pid(n);
  n->lock_fd = fd;
  return 0;
}

/* The directory, and the lock of a writer. A writer creates DIR if needed;
 * a reader creates nothing, so DIR must exist. */
static int dir_open(nvme *n) {
  struct stat st;
  if (n->readonly) {
    const int err = stat(n->dir, &st) != 0 ? errno : S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
    if (err)
      return kvt_fail(n->ctx, -err, "nvme tier: '%s': %s (readonly=1 creates nothing)", n->dir,
                      strerror(err));
    return 0;
  }
  if (mkdir(n->dir, 0755) != 0 && errno != EEXIST)
    return kvt_fail(n->ctx, -errno, "nvme tier: cannot create directory '%s': %s", n->dir,
                    strerror(errno));
  const int rc = lock_take(n);
  if (rc == 0)
    probe(n);
  return rc;
}

/* Creates DIR and its 256 subdirectories if needed, keeps a descriptor on
 * each (the data path works relative to them) and rebuilds the index from
 * the header blocks (payloads are verified by GET). A reader opens the
 * subdirectories there are (none is created) and reads with the page cache
 * (it has no file to probe O_DIRECT with). */
static int nvme_scan(nvme *n) {
  int rc = dir_open(n);
  if (rc)
    return rc;
  uint8_t *blk = kvt_alloc(n->ctx, NVME_BLK, NVME_BLK);
  if (!blk)
    return kvt_fail(n->ctx, -ENOMEM, "nvme tier: allocating a header buffer");
  for (unsigned i = 0; i < NVME_SUBDIRS && rc == 0; i++) {
    char sub[NVME_PATH];
    snprintf(sub, sizeof(sub), "%s/%02x", n->dir, i);
    if (!n->readonly && mkdir(sub, 0755) != 0 && errno != EEXIST)
      rc = -errno;
    else if ((n->subs[i].fd = open(sub, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
      rc = n->readonly && errno == ENOENT ? 0 : -errno;
    if (rc == 0 && n->subs[i].fd < 0)
      continue; /* a reader, and no such subdirectory: no values there */
    if (rc)
      rc = kvt_fail(n->ctx, rc, "nvme tier: cannot %s directory '%s': %s",
                    n->readonly ? "open" : "create", sub, strerror(-rc));
    else if ((rc = scan_subdir(n, sub, n->subs[i].fd, blk)) != 0)
      rc = kvt_fail(n->ctx, rc, "nvme tier: scanning '%s': %s", sub, kvt_strerror(rc));
  }
  kvt_dealloc(n->ctx, blk);
  return rc;
}

/* DIR:SIZE[,qd=N][,engine=pread][,readonly=1]; DIR may itself contain ':'. */
static int parse_args(nvme *n, const char *args, int *force_pread) {
  const char *colon = args ? strrchr(args, ':') : NULL;
  if (!colon || colon == args || (size_t)(colon - args) >= sizeof(n->dir))
    return kvt_fail(n->ctx, KVT_ESPEC, "nvme tier: '%s': expected DIR:SIZE (e.g. %s)",
                    args ? args : "", "nvme:/var/cache/kvtier:100GiB");
  memcpy(n->dir, args, (size_t)(colon - args));
  n->dir[colon - args] = '\0';
  char opts[128];
  snprintf(opts, sizeof(opts), "%s", colon + 1);
  char *save = NULL, *tok = strtok_r(opts, ",", &save);
  if (!tok || kvt_parse_size(tok, &n->capacity) != 0 || n->capacity == 0)
    return kvt_fail(n->ctx, KVT_ESPEC, "nvme tier: '%s': the size '%s' %s", args, tok ? tok : "",
                    kvt_size_why(tok ? tok : ""));
  while ((tok = strtok_r(NULL, ",", &save)) != NULL) {
    char *end = NULL;
    if (strncmp(tok, "qd=", 3) == 0) {
      const unsigned long qd = strtoul(tok + 3, &end, 10);
      if (!*(tok + 3) || *end || qd == 0 || qd > 4096)
        return kvt_fail(n->ctx, KVT_ESPEC, "nvme tier: '%s': qd must be 1..4096", args);
      n->qd = (unsigned)qd;
    } else if (strcmp(tok, "engine=pread") == 0) {
      *force_pread = 1;
    } else if (strcmp(tok, "readonly=1") == 0 || strcmp(tok, "readonly=0") == 0) {
      n->readonly = tok[9] == '1';
    } else {
      return kvt_fail(n->ctx, KVT_ESPEC, "nvme tier: '%s': unknown option '%s'", args, tok);
    }
  }
  return 0;
}

/* The data path's memory, all of it, so that it never allocates (but for
 * the slow paths tier_nvme.h names). */
static int buffers_init(nvme *n) {
  n->reqs = kvt_alloc(n->ctx, (size_t)n->qd * sizeof(nreq), 64);
  n->scratch = kvt_alloc(n->ctx, (size_t)n->qd * 2 * NVME_BLK, NVME_BLK);
  n->pool_mem = kvt_alloc(n->ctx, (size_t)NVME_POOL_BUFS * NVME_POOL_BYTES, NVME_BLK);
  if (!n->reqs || !n->scratch || !n->pool_mem)
    return kvt_fail(n->ctx, -ENOMEM, "nvme tier: allocating %u requests and %u I/O buffers",
                    n->qd, NVME_POOL_BUFS);
  memset(n->reqs, 0, (size_t)n->qd * sizeof(nreq));
  for (unsigned i = n->qd; i-- > 0;) {
    nreq *r = &n->reqs[i];
    r->n = n;
    r->id = i;
    r->fd = -1;
    r->pool = -1;
    r->hdr = n->scratch + (size_t)i * 2 * NVME_BLK;
    r->tail = r->hdr + NVME_BLK;
    r->next = n->free_reqs;
    n->free_reqs = r;
  }
  for (unsigned i = 0; i < NVME_POOL_BUFS; i++)
    n->free_pool[n->n_free_pool++] = (int)(NVME_POOL_BUFS - 1 - i);
  return 0;
}

static void engine_init(nvme *n, int force_pread) {
  const char *env = getenv("KVT_NVME_FORCE_PREAD");
  char why[160] = "liburing not built in";
  if (force_pread || (env && strcmp(env, "1") == 0)) {
    snprintf(why, sizeof(why), "%s",
             force_pread ? "engine=pread in the spec" : "KVT_NVME_FORCE_PREAD=1");
  } else {
#ifdef KVT_HAVE_URING
    if (nvme_ring_init(n, why, sizeof(why)) == 0) {
      n->uring = 1;
      return;
    }
#endif
  }
  kvt_logf(n->ctx, KVT_LOG_WARN, "nvme tier: io_uring unavailable (%s): using pread/pwrite", why);
}

void nvme_close(void *state) {
  nvme *n = state;
  nvme_spares_free(n);
#ifdef KVT_HAVE_URING
  if (n->uring)
    nvme_ring_exit(n);
  pthread_mutex_destroy(&n->rmu);
#endif
  for (unsigned i = 0; i < NVME_SUBDIRS; i++)
    if (n->subs[i].fd >= 0)
      close(n->subs[i].fd);
  if (n->lock_fd >= 0)
    close(n->lock_fd); /* the last: the next writer may clean up what this one left */
  pthread_cond_destroy(&n->idle);
  pthread_mutex_destroy(&n->qmu);
  pthread_mutex_destroy(&n->mu);
  kvt_index_free(&n->ix);
  kvt_dealloc(n->ctx, n->pool_mem);
  kvt_dealloc(n->ctx, n->scratch);
  kvt_dealloc(n->ctx, n->reqs);
  kvt_dealloc(n->ctx, n);
}

int nvme_open(kvt_ctx *ctx, const char *args, kvt_tier *tier, void **state) {
  nvme *n = kvt_alloc(ctx, sizeof(*n), 64);
  if (!n)
    return kvt_fail(ctx, -ENOMEM, "nvme tier: allocating its state");
  memset(n, 0, sizeof(*n));
  n->ctx = ctx;
  n->tier = tier;
  n->qd = NVME_QD_DEFAULT;
  n->lock_fd = -1;
  for (unsigned i = 0; i < NVME_SUBDIRS; i++)
    n->subs[i].fd = -1;
  kvt_index_init(&n->ix, ctx);
  pthread_mutex_init(&n->mu, NULL);
  pthread_mutex_init(&n->qmu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&n->idle, &ca);
  pthread_condattr_destroy(&ca);
#ifdef KVT_HAVE_URING
  pthread_mutex_init(&n->rmu, NULL);
#endif
  int force_pread = 0;
  int rc = parse_args(n, args, &force_pread);
  if (rc == 0)
    rc = nvme_scan(n);
  if (rc == 0)
    rc = buffers_init(n);
  if (rc) {
    nvme_close(n);
    return rc;
  }
  engine_init(n, force_pread);
  kvt_logf(ctx, KVT_LOG_INFO,
           "nvme tier: %s: %llu values, %llu of %llu bytes used, %llu torn files %s, %s%s",
           n->dir, (unsigned long long)n->ix.items, (unsigned long long)n->used,
           (unsigned long long)n->capacity, (unsigned long long)n->corrupt,
           n->readonly ? "found" : "removed", n->uring ? "io_uring" : "pread/pwrite",
           n->readonly ? ", read-only" : "");
  *state = n;
  return 0;
}

int nvme_stats(void *state, kvt_tier_stats *out) {
  nvme *n = state;
  pthread_mutex_lock(&n->mu);
  out->capacity = n->capacity;
  out->used = n->used - n->spare_bytes; /* spares are given back whenever room is needed */
  out->items = n->ix.items;
  pthread_mutex_unlock(&n->mu);
  out->item_overhead = NVME_BLK; /* the file's header block */
  out->granule = NVME_BLK;       /* payloads padded for O_DIRECT */
  return 0;
}

/* fn runs on a copy, so it may call back into the tier. */
int nvme_list(void *state, kvt_tier_list_fn fn, void *opaque) {
  nvme *n = state;
  pthread_mutex_lock(&n->mu);
  const uint64_t cnt = n->ix.items;
  kvt_index_item *all = cnt ? kvt_alloc(n->ctx, (size_t)cnt * sizeof(*all), 64) : NULL;
  const uint64_t k = all ? kvt_index_snapshot(&n->ix, all, cnt) : 0;
  pthread_mutex_unlock(&n->mu);
  if (cnt && !all)
    return -ENOMEM;
  int rc = 0;
  for (uint64_t i = 0; i < k && rc == 0; i++)
    rc = fn(opaque, &all[i].key, all[i].len);
  kvt_dealloc(n->ctx, all);
  return rc;
}
