/* tests/campaign/campaign_fullfs.c - a full file system under the nvme tier
 * and under the cache: a small tmpfs, and a small ext4 image on a loop
 * device (O_DIRECT and fallocate as on an NVMe drive's file system), each
 * mounted in the run's directory (we run as root; where one does not mount,
 * its checks are skipped, saying why).
 * A put that does not fit must say -ENOSPC with either engine, what was
 * acknowledged before must read back exactly, and the cache must make room
 * (evict) rather than fail its puts. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "campaign.h"

#define FS_SIZE "1m" /* tmpfs */
#define IMAGE_SIZE                                                                                 \
  3u /* MiB of the ext4 image: about 1 MiB free once the tier made its 256 directories */
#define CACHE_PUTS 300 /* ~13 KiB each on disk: several times the file system */

static const char *const engine_name[2] = {"io_uring", "pread"};
static const char *const engine_opt[2] = {"", ",engine=pread"};

static const char *const fs_name[2] = {"tmpfs", "ext4"};

typedef struct full_arg {
  char dir[512];
  int engine, fs;
} full_arg;

static const char *tier_check(int fs, int engine) {
  static char name[2][2][120];
  snprintf(name[fs][engine], sizeof(name[fs][engine]),
           "a put into a full file system is -ENOSPC (nvme tier, %s engine, %s)",
           engine_name[engine], fs_name[fs]);
  return name[fs][engine];
}

static const char *cache_check(int fs, int engine) {
  static char name[2][2][120];
  snprintf(name[fs][engine], sizeof(name[fs][engine]),
           "the cache evicts to make room on a full file system (nvme, %s engine, %s)",
           engine_name[engine], fs_name[fs]);
  return name[fs][engine];
}

/* Fills the file system through an nvme tier with room to spare on paper,
 * then reads back every acknowledged value. */
static void tier_child(void *p) {
  const full_arg *a = p;
  char spec[600];
  snprintf(spec, sizeof(spec), "nvme:%s:64MiB%s", a->dir, engine_opt[a->engine]);
  kvt_ctx *ctx = NULL;
  kvt_tier *t = NULL;
  int rc = kvt_ctx_create(NULL, &ctx);
  if (rc == 0)
    rc = kvt_tier_open(ctx, spec, &t);
  if (rc) {
    ck_check_result(tier_check(a->fs, a->engine), 0, "the tier did not open: %s", kvt_err_name(rc));
    _exit(1);
  }
  /* Values of 20 to 140 KB from buffers aligned or not (the in-place and
   * the pool paths of the io_uring engine), until one does not fit. */
  enum { VMAX = 140000, BUF = 36 * 4096 /* VMAX + 8, rounded up to 4096 */ };
  uint8_t *buf = aligned_alloc(4096, BUF), *got = aligned_alloc(4096, BUF);
  uint64_t lens[200];
  uint32_t acked = 0;
  int fail = 0;
  for (uint32_t i = 0; i < 200 && !fail; i++) {
    const kvt_key k = ck_key_of(CK_NVME, 3, i);
    uint8_t *v = buf + (i % 2 ? 8 : 0);
    lens[i] = 20000 + ck_mix(i, 77) % (VMAX - 20000);
    for (uint64_t j = 0; j < lens[i]; j++)
      v[j] = (uint8_t)ck_mix(i, j);
    rc = kvt_tier_put(t, &k, v, lens[i]);
    if (rc == 0)
      acked++;
    else
      fail = rc;
  }
  CK_ADD(faults[F_FULL_FS], 1);
  ck_check_result(tier_check(a->fs, a->engine), fail == -ENOSPC, "after %u puts: %s", acked,
                  fail ? kvt_err_name(fail) : "no failure");
  for (uint32_t i = 0; i < acked; i++) {
    const kvt_key k = ck_key_of(CK_NVME, 3, i);
    uint64_t n = 0;
    rc = kvt_tier_get(t, &k, got, BUF, &n);
    for (uint64_t j = 0; j < lens[i]; j++)
      buf[j] = (uint8_t)ck_mix(i, j);
    CK_ADD(gets, 1);
    if (rc == 0 && (n != lens[i] || memcmp(got, buf, lens[i]) != 0)) {
      CK_ADD(wrong, 1);
      ck_note("WRONG BYTES: full file system (%s): value %u", engine_name[a->engine], i);
    } else if (rc) {
      CK_ADD(lost, 1);
      ck_note("LOST: full file system (%s): acknowledged value %u reads as %s",
              engine_name[a->engine], i, kvt_err_name(rc));
    }
  }
  CK_ADD(puts, acked + 1);
  CK_ADD(ops, 2 * acked + 1);
  kvt_tier_close(t);
  kvt_ctx_destroy(ctx);
  free(buf);
  free(got);
}

/* Puts several file systems' worth of payloads through a cache on an NVMe
 * tier that believes it has 64 MiB: the cache must evict to make room. */
static void cache_child(void *p) {
  const full_arg *a = p;
  char spec[600];
  snprintf(spec, sizeof(spec), "nvme:%s:64MiB%s", a->dir, engine_opt[a->engine]);
  kvt_ctx *ctx = NULL;
  kvt_cache *c = NULL;
  kvt_cache_config cfg = KVT_CACHE_CONFIG_INIT;
  cfg.tiers = spec;
  cfg.fingerprint = ck_fingerprint();
  int rc = kvt_ctx_create(NULL, &ctx);
  if (rc == 0)
    rc = kvt_cache_open(ctx, &cfg, &c);
  if (rc) {
    ck_check_result(cache_check(a->fs, a->engine), 0, "the cache did not open: %s",
                    kvt_err_name(rc));
    _exit(1);
  }
  uint8_t *v = aligned_alloc(4096, CK_VALUE_MAX), *got = aligned_alloc(4096, CK_VALUE_MAX);
  int failed = 0, first = 0;
  uint32_t ok = 0;
  for (uint32_t i = 0; i < CACHE_PUTS; i++) {
    const int slot = 2 + (int)(i / CK_KEYS);
    const uint32_t idx = i % CK_KEYS;
    uint64_t len = 0;
    rc = ck_value(ctx, CK_CACHE, slot, idx, 1, v, CK_VALUE_MAX, &len);
    if (rc == 0)
      rc = kvt_cache_put(c, &ck->cache_keys[slot][idx], NULL, v, len);
    if (rc == 0)
      ok++;
    else if (failed++ == 0)
      first = rc;
  }
  CK_ADD(puts, CACHE_PUTS);
  CK_ADD(faults[F_FULL_FS], 1);
  ck_check_result(cache_check(a->fs, a->engine), failed == 0,
                  "%d of %d puts failed, the first with %s", failed, CACHE_PUTS,
                  kvt_err_name(first));
  for (uint32_t i = 0; i < CACHE_PUTS; i++) { /* exact bytes, or evicted */
    const int slot = 2 + (int)(i / CK_KEYS);
    const uint32_t idx = i % CK_KEYS;
    uint64_t len = 0, n = 0;
    ck_value(ctx, CK_CACHE, slot, idx, 1, v, CK_VALUE_MAX, &len);
    rc = kvt_cache_get(c, &ck->cache_keys[slot][idx], got, CK_VALUE_MAX, &n, NULL);
    CK_ADD(gets, 1);
    if (rc == 0 && (n != len || memcmp(got, v, len) != 0)) {
      CK_ADD(wrong, 1);
      ck_note("WRONG BYTES: cache on a full file system (%s): payload %u", engine_name[a->engine],
              i);
    } else if (rc && rc != KVT_ENOTFOUND) {
      ck_note("cache on a full file system (%s): a get of payload %u failed with %s",
              engine_name[a->engine], i, kvt_err_name(rc));
    }
  }
  CK_ADD(ops, 2 * CACHE_PUTS);
  kvt_cache_close(c);
  kvt_ctx_destroy(ctx);
  free(v);
  free(got);
}

static void rm_tree(const char *dir) {
  char cmd[600];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
  const int rc = system(cmd);
  (void)rc;
}

/* Mounts a small file system of kind fs at mnt: a tmpfs (mount(2)), or an
 * ext4 image on a loop device (mkfs.ext4, mount(8)). 0, or -1 with the
 * reason in why. */
static int mount_small(int fs, const char *mnt, char *why, size_t cap) {
  if (fs == 0) {
    if (mount("tmpfs", mnt, "tmpfs", MS_NOSUID | MS_NODEV, "size=" FS_SIZE) == 0)
      return 0;
    snprintf(why, cap, "mounting a tmpfs: %s", strerror(errno));
    return -1;
  }
  char img[260], cmd[1600];
  snprintf(img, sizeof(img), "%s/fullfs.img", ck_e.root);
  snprintf(cmd, sizeof(cmd),
           "truncate -s %uM '%s' && mkfs.ext4 -q -F -N 2048 '%s' >/dev/null 2>&1 && "
           "mount -o loop '%s' '%s' >/dev/null 2>&1",
           IMAGE_SIZE, img, img, img, mnt);
  if (system(cmd) == 0)
    return 0;
  unlink(img);
  snprintf(why, cap, "no ext4 image mounts here (mkfs.ext4 and mount -o loop)");
  return -1;
}

static void on_one_fs(int fs) {
  char mnt[300], why[200];
  snprintf(mnt, sizeof(mnt), "%s/full-%s", ck_e.root, fs_name[fs]);
  mkdir(mnt, 0755);
  if (mount_small(fs, mnt, why, sizeof(why)) != 0) {
    for (int engine = 0; engine < 2; engine++) {
      ck_check_skip(tier_check(fs, engine), "%s", why);
      ck_check_skip(cache_check(fs, engine), "%s", why);
    }
    rmdir(mnt);
    return;
  }
  for (int engine = 0; engine < 2; engine++) {
    const int64_t t0 = ck_now_ms();
    full_arg a = {.engine = engine, .fs = fs};
    snprintf(a.dir, sizeof(a.dir), "%s/tier", mnt);
    pid_t pid = ck_spawn("a tier on a full file system", 120, tier_child, &a);
    ck_wait_ok(pid, 120000, "a tier on a full file system");
    rm_tree(a.dir);
    snprintf(a.dir, sizeof(a.dir), "%s/cache", mnt);
    const int64_t t1 = ck_now_ms();
    pid = ck_spawn("a cache on a full file system", 120, cache_child, &a);
    ck_wait_ok(pid, 120000, "a cache on a full file system");
    rm_tree(a.dir);
    if (ck_opt.verbose)
      printf("campaign: full %s, %s engine: the tier took %lld ms, the cache %lld ms\n",
             fs_name[fs], engine_name[engine], (long long)(t1 - t0), (long long)(ck_now_ms() - t1));
  }
  if (umount2(mnt, MNT_DETACH) != 0)
    ck_note("unmounting %s: %s", mnt, strerror(errno));
  rmdir(mnt);
  char img[300];
  snprintf(img, sizeof(img), "%s/fullfs.img", ck_e.root);
  unlink(img);
}

void ck_full_fs_phase(void) {
  on_one_fs(0);
  on_one_fs(1);
}
