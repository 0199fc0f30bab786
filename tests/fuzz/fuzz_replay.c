/* tests/fuzz/fuzz_replay.c - runs a libFuzzer target over saved inputs
 * without libFuzzer, so CTest replays the corpus (and the golden payloads)
 * in every build, sanitized or not.
 *
 *   fuzz_payload_replay DIR_OR_FILE...
 *
 * Files in each directory are fed in name order; subdirectories and hidden
 * files are skipped. Exits 0 when every input ran (a finding aborts), 2 on a
 * usage or I/O error, 77 (skipped) when no input was found. */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "%s: %s\n", path, strerror(errno));
    return -1;
  }
  size_t cap = 1 << 16, n = 0;
  uint8_t *buf = malloc(cap);
  for (size_t r; buf && (r = fread(buf + n, 1, cap - n, f)) > 0;) {
    n += r;
    if (n == cap) {
      uint8_t *p = realloc(buf, cap *= 2);
      if (!p)
        free(buf);
      buf = p;
    }
  }
  int err = ferror(f);
  fclose(f);
  if (!buf || err) {
    fprintf(stderr, "%s: read failed\n", path);
    free(buf);
    return -1;
  }
  /* An exact-size copy, as libFuzzer gives, so overreads are caught. */
  uint8_t *exact = malloc(n ? n : 1);
  if (!exact) {
    free(buf);
    return -1;
  }
  memcpy(exact, buf, n);
  free(buf);
  LLVMFuzzerTestOneInput(exact, n);
  free(exact);
  return 0;
}

static int by_name(const struct dirent **a, const struct dirent **b) {
  return strcmp((*a)->d_name, (*b)->d_name);
}

static int run_dir(const char *dir, long *count) {
  struct dirent **names;
  int n = scandir(dir, &names, NULL, by_name);
  if (n < 0) {
    fprintf(stderr, "%s: %s\n", dir, strerror(errno));
    return -1;
  }
  int rc = 0;
  for (int i = 0; i < n; i++) {
    char path[4096];
    struct stat st;
    snprintf(path, sizeof(path), "%s/%s", dir, names[i]->d_name);
    if (names[i]->d_name[0] != '.' && stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
      if (run_file(path) == 0)
        (*count)++;
      else
        rc = -1;
    }
    free(names[i]);
  }
  free(names);
  return rc;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s DIR_OR_FILE...\n", argv[0]);
    return 2;
  }
  long count = 0;
  int rc = 0;
  for (int i = 1; i < argc; i++) {
    struct stat st;
    if (stat(argv[i], &st) != 0) {
      fprintf(stderr, "%s: %s\n", argv[i], strerror(errno));
      rc = -1;
    } else if (S_ISDIR(st.st_mode)) {
      rc |= run_dir(argv[i], &count);
    } else if (run_file(argv[i]) == 0) {
      count++;
    } else {
      rc = -1;
    }
  }
  printf("replayed %ld inputs\n", count);
  if (rc)
    return 2;
  return count ? 0 : 77;
}
