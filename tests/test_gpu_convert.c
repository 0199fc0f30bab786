/* tests/test_gpu_convert.c - the CPU reference conversions give the same
 * bytes as CUDA's, on every one of the 2^32 fp32 bit patterns: e4m3
 * (__nv_cvt_float_to_fp8 SATFINITE), bf16 and fp16 round-to-nearest-even, and
 * fp16 rounded down and up (the i4 zero and scale). Label gpu: skips (77)
 * without a CUDA build or device. KVT_GPU_CHECK_STEP=N tests every Nth
 * pattern only (default 1: all). */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "codec_internal.h"
#include "kvtier.h"

#ifdef KVT_TEST_HAVE_GPU
#include "kvt_gpu_check.h"

#define BATCH ((size_t)1 << 26)
#define THREADS 16

static kvt_gpu_check *gpu;

typedef struct job {
  int conv;
  uint32_t first;
  size_t begin, end, step;
  const void *got;
  uint64_t mismatches;
  uint32_t first_bad;
} job;

static int is_nan32(uint32_t u) { return (u & 0x7FFFFFFFu) > 0x7F800000u; }

static uint16_t ref16(int conv, float x) {
  switch (conv) {
  case KVT_GPU_CONV_BF16_RN:
    return kvt_f32_to_bf16(x);
  case KVT_GPU_CONV_F16_RN:
    return kvt_f32_to_f16(x);
  case KVT_GPU_CONV_F16_RD:
    return kvt_f32_to_f16_rd(x);
  default:
    return kvt_f32_to_f16_ru(x);
  }
}

static int nan16(int conv, uint16_t h) {
  return conv == KVT_GPU_CONV_BF16_RN ? (h & 0x7FFF) > 0x7F80 : (h & 0x7FFF) > 0x7C00;
}

static void *check_range(void *arg) {
  job *j = arg;
  for (size_t i = j->begin; i < j->end; i += j->step) {
    uint32_t u = j->first + (uint32_t)i;
    float x;
    memcpy(&x, &u, 4);
    int bad;
    if (j->conv == KVT_GPU_CONV_E4M3) {
      bad = ((const uint8_t *)j->got)[i] != kvt_f32_to_e4m3(x);
    } else {
      uint16_t g = ((const uint16_t *)j->got)[i];
      /* NaN payloads are not part of the contract: any NaN matches a NaN. */
      bad = is_nan32(u) ? !nan16(j->conv, g) : g != ref16(j->conv, x);
    }
    if (bad && j->mismatches++ == 0)
      j->first_bad = u;
  }
  return NULL;
}

static void check_conv(int conv, const char *name) {
  size_t step = 1;
  const char *s = getenv("KVT_GPU_CHECK_STEP");
  if (s && atol(s) > 0)
    step = (size_t)atol(s);
  void *out = malloc(BATCH * 2);
  assert_non_null(out);
  char err[256];
  uint64_t bad = 0, checked = 0;
  uint32_t first_bad = 0;
  for (uint64_t first = 0; first < ((uint64_t)1 << 32); first += BATCH) {
    int rc = kvt_gpu_check_run(gpu, conv, (uint32_t)first, BATCH, out, err, sizeof(err));
    if (rc)
      fail_msg("%s: %s", name, err);
    pthread_t th[THREADS];
    job jobs[THREADS];
    size_t per = BATCH / THREADS;
    for (int t = 0; t < THREADS; t++) {
      jobs[t] = (job){conv, (uint32_t)first, per * t, per * (t + 1), step, out, 0, 0};
      pthread_create(&th[t], NULL, check_range, &jobs[t]);
    }
    for (int t = 0; t < THREADS; t++) {
      pthread_join(th[t], NULL);
      if (jobs[t].mismatches && !bad)
        first_bad = jobs[t].first_bad;
      bad += jobs[t].mismatches;
    }
    checked += BATCH / step;
  }
  free(out);
  printf("# %s: %llu patterns checked, %llu mismatches\n", name, (unsigned long long)checked,
         (unsigned long long)bad);
  if (bad)
    fail_msg("%s: %llu mismatches, first at fp32 bits 0x%08x", name, (unsigned long long)bad,
             first_bad);
}

static void test_gpu_e4m3_matches_cpu_on_every_fp32(void **state) {
  (void)state;
  check_conv(KVT_GPU_CONV_E4M3, "e4m3 satfinite");
}
static void test_gpu_bf16_matches_cpu_on_every_fp32(void **state) {
  (void)state;
  check_conv(KVT_GPU_CONV_BF16_RN, "bf16 rn");
}
static void test_gpu_fp16_matches_cpu_on_every_fp32(void **state) {
  (void)state;
  check_conv(KVT_GPU_CONV_F16_RN, "fp16 rn");
}
static void test_gpu_fp16_rd_ru_match_cpu_on_every_fp32(void **state) {
  (void)state;
  check_conv(KVT_GPU_CONV_F16_RD, "fp16 rd");
  check_conv(KVT_GPU_CONV_F16_RU, "fp16 ru");
}

static void test_gpu_e4m3_decode_matches_cpu_for_all_codes(void **state) {
  (void)state;
  float got[256];
  char err[256];
  if (kvt_gpu_check_e4m3_decode(gpu, got, err, sizeof(err)))
    fail_msg("%s", err);
  for (int i = 0; i < 256; i++) {
    float want = kvt_e4m3_to_f32((uint8_t)i);
    if (want != want) {
      assert_true(got[i] != got[i]);
      continue;
    }
    uint32_t a, b;
    memcpy(&a, &got[i], 4);
    memcpy(&b, &want, 4);
    if (a != b)
      fail_msg("code 0x%02x: GPU %a, CPU %a", i, (double)got[i], (double)want);
  }
}

int main(void) {
  char err[256];
  int rc = kvt_gpu_check_create(BATCH, &gpu, err, sizeof(err));
  if (rc == -ENODEV) {
    fprintf(stderr, "skipped: %s\n", err);
    return 77;
  }
  if (rc) {
    fprintf(stderr, "GPU setup failed: %s\n", err);
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gpu_e4m3_decode_matches_cpu_for_all_codes),
      cmocka_unit_test(test_gpu_e4m3_matches_cpu_on_every_fp32),
      cmocka_unit_test(test_gpu_bf16_matches_cpu_on_every_fp32),
      cmocka_unit_test(test_gpu_fp16_matches_cpu_on_every_fp32),
      cmocka_unit_test(test_gpu_fp16_rd_ru_match_cpu_on_every_fp32),
  };
  rc = cmocka_run_group_tests(tests, NULL, NULL);
  kvt_gpu_check_destroy(gpu);
  return rc;
}
#else
int main(void) {
  fprintf(stderr, "skipped: built without CUDA (KVT_ENABLE_CUDA)\n");
  return 77;
}
#endif
