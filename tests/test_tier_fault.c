/* tests/test_tier_fault.c - the decorator tiers through the public API: each
 * fault mode does what it says on exactly the operations its rule picks,
 * rules compose, bad rules fail to open with KVT_ESPEC and a detail naming
 * the rule; the trace tier logs one line per operation. Each test checks
 * that nothing stays allocated through the context after close. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "kvtier.h"
#include "tier_test_util.h"

#define LOG_LINES 16

typedef struct fixture {
  kvt_ctx *ctx;
  atomic_long live; /* allocations outstanding through ctx */
  long live_base;
  pthread_mutex_t mu;
  int n_lines;
  char lines[LOG_LINES][256];
} fixture;

/* Keeps the INFO lines (the trace tier's); DEBUG ones are error details. */
static void fx_log(void *opaque, int level, const char *msg) {
  fixture *f = opaque;
  if (level != KVT_LOG_INFO || strncmp(msg, "trace ", 6) != 0)
    return;
  pthread_mutex_lock(&f->mu);
  if (f->n_lines < LOG_LINES)
    snprintf(f->lines[f->n_lines++], sizeof(f->lines[0]), "%s", msg);
  pthread_mutex_unlock(&f->mu);
}

static int fx_setup_at(void **state, int log_level) {
  fixture *f = calloc(1, sizeof(*f));
  if (!f)
    return -1;
  pthread_mutex_init(&f->mu, NULL);
  kvt_ctx_config cfg = KVT_CTX_CONFIG_INIT;
  cfg.allocator.alloc = counting_alloc;
  cfg.allocator.free = counting_free;
  cfg.allocator.opaque = &f->live;
  cfg.log = fx_log;
  cfg.log_opaque = f;
  cfg.log_level = log_level;
  if (kvt_ctx_create(&cfg, &f->ctx) != 0)
    return -1;
  f->live_base = atomic_load(&f->live);
  *state = f;
  return 0;
}

static int fx_setup(void **state) { return fx_setup_at(state, KVT_LOG_DEBUG); }
static int fx_setup_quiet(void **state) { return fx_setup_at(state, KVT_LOG_WARN); }

/* Every test closes what it opened: nothing may remain allocated. */
static int fx_teardown(void **state) {
  fixture *f = *state;
  const long leaked = atomic_load(&f->live) - f->live_base;
  kvt_ctx_destroy(f->ctx);
  pthread_mutex_destroy(&f->mu);
  free(f);
  if (leaked)
    print_error("%ld allocations outstanding\n", leaked);
  return leaked ? -1 : 0;
}

static kvt_tier *open_ok(fixture *f, const char *spec) {
  kvt_tier *t = NULL;
  const int rc = kvt_tier_open(f->ctx, spec, &t);
  if (rc)
    fail_msg("kvt_tier_open(%s): %s: %s", spec, kvt_err_name(rc), kvt_ctx_last_error(f->ctx));
  return t;
}

static kvt_key key_of(uint32_t id) {
  kvt_key k;
  memset(&k, 0xA7, sizeof(k));
  memcpy(k.bytes + 4, &id, sizeof(id));
  return k;
}

static size_t bytes_differing(const uint8_t *a, const uint8_t *b, size_t n) {
  size_t d = 0;
  for (size_t i = 0; i < n; i++)
    d += a[i] != b[i];
  return d;
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ---- modes ---- */

static void test_fail_gives_eio_on_exactly_the_nth_matching_op(void **state) {
  fixture *f = *state;
  kvt_tier *t = open_ok(f, "fault:op=get,nth=3,mode=fail@dram:1MiB");
  const kvt_key k = key_of(1);
  uint8_t val[100], got[100];
  uint64_t len = 0;
  fill(val, sizeof(val), 1);
  assert_int_equal(kvt_tier_put(t, &k, val, sizeof(val)), 0);
  const int want[] = {0, 0, -EIO, 0, 0};
  for (int i = 0; i < 5; i++) {
    assert_int_equal(kvt_tier_query(t, &k, &len), 0); /* not a GET: not counted */
    memset(got, 0, sizeof(got));
    assert_int_equal(kvt_tier_get(t, &k, got, sizeof(got), &len), want[i]);
    if (want[i] == 0)
      assert_memory_equal(got, val, sizeof(val));
  }
  kvt_tier_stats s = {.struct_size = sizeof(s)};
  assert_int_equal(kvt_tier_stats_get(t, &s), 0);
  assert_int_equal(s.errors, 1);
  assert_int_equal(s.hits, 4);
  kvt_tier_close(t);
}

static void test_every_fails_each_nth_put_without_storing_it(void **state) {
  fixture *f = *state;
  kvt_tier *t = open_ok(f, "fault:op=put,every=2,mode=fail@dram:1MiB");
  uint8_t val[10] = {0};
  uint64_t len = 0;
  for (uint32_t i = 1; i <= 6; i++) {
    const kvt_key k = key_of(i);
    assert_int_equal(kvt_tier_put(t, &k, val, sizeof(val)), i % 2 ? 0 : -EIO);
    assert_int_equal(kvt_tier_query(t, &k, &len), i % 2 ? 0 : KVT_ENOTFOUND);
  }
  kvt_tier_close(t);
}

static void test_op_any_counts_every_kind_of_op(void **state) {
  fixture *f = *state;
  kvt_tier *t = open_ok(f, "fault:op=any,nth=4,mode=fail@dram:1MiB");
  const kvt_key k = key_of(1);
  uint8_t val[10] = {0};
  uint64_t len = 0;
  assert_int_equal(kvt_tier_put(t, &k, val, sizeof(val)), 0);
  assert_int_equal(kvt_tier_get(t, &k, val, sizeof(val), &len), 0);
  assert_int_equal(kvt_tier_query(t, &k, &len), 0);
  assert_int_equal(kvt_tier_del(t, &k), -EIO); /* the 4th: never reached the inner tier */
  assert_int_equal(kvt_tier_query(t, &k, &len), 0);
  kvt_tier_close(t);
}

static void test_nospace_refuses_the_put_without_storing_it(void **state) {
  fixture *f = *state;
  kvt_tier *t = open_ok(f, "fault:op=put,nth=1,mode=nospace@dram:1MiB");
  const kvt_key k = key_of(1);
  uint8_t val[10] = {0};
  uint64_t len = 0;
  assert_int_equal(kvt_tier_put(t, &k, val, sizeof(val)), -ENOSPC);
  assert_int_equal(kvt_tier_query(t, &k, &len), KVT_ENOTFOUND);
  assert_int_equal(kvt_tier_put(t, &k, val, sizeof(val)), 0);
  assert_int_equal(kvt_tier_query(t, &k, &len), 0);
  kvt_tier_close(t);
}

static void test_short_write_succeeds_but_stores_half_the_bytes(void **state) {
  fixture *f = *state;
  kvt_tier *t = open_ok(f, "fault:op=put,nth=1,mode=short@dram:1MiB");
  const kvt_key k = key_of(1), k2 = key_of(2);
  uint8_t val[1001], got[1001];
  uint64_t len = 0;
  fill(val, sizeof(val), 2);
  assert_int_equal(kvt_tier_put(t, &k, val, sizeof(val)), 0); /* reported as done */
  assert_int_equal(kvt_tier_query(t, &k, &len), 0);
  assert_int_equal(len, sizeof(val) / 2);
  assert_int_equal(kvt_tier_get(t, &k, got, sizeof(got), &len), 0);
  assert_int_equal(len, sizeof(val) / 2);
  assert_memory_equal(got, val, (size_t)len);                  /* the first half, intact */
  assert_int_equal(kvt_tier_put(t, &k2, val, sizeof(val)), 0); /* the 2nd PUT is whole */
  assert_int_equal(kvt_tier_query(t, &k2, &len), 0);
  assert_int_equal(len, sizeof(val));
  kvt_tier_close(t);
}

static void test_corrupt_get_flips_one_byte_and_keeps_the_stored_value(void **state) {
  fixture *f = *state;
  kvt_tier *t = open_ok(f, "fault:op=get,nth=1,mode=corrupt@dram:1MiB");
  const kvt_key k = key_of(1);
  uint8_t val[4097], got[4097];
  uint64_t len = 0;
  fill(val, sizeof(val), 3);
  assert_int_equal(kvt_tier_put(t, &k, val, sizeof(val)), 0);
  assert_int_equal(kvt_tier_get(t, &k, got, sizeof(got), &len), 0);
  assert_int_equal(len, sizeof(val));
  assert_int_equal(bytes_differing(got, val, sizeof(val)), 1);
  assert_int_equal(kvt_tier_get(t, &k, got, sizeof(got), &len), 0);
  assert_memory_equal(got, val, sizeof(val));
  kvt_tier_close(t);
}

static void test_corrupt_put_stores_one_flipped_byte_not_touching_the_callers(void **state) {
  fixture *f = *state;
  kvt_tier *t = open_ok(f, "fault:op=put,nth=1,mode=corrupt@dram:1MiB");
  const kvt_key k = key_of(1);
  uint8_t val[300], orig[300], got[300];
  uint64_t len = 0;
  fill(val, sizeof(val), 4);
  memcpy(orig, val, sizeof(val));
  assert_int_equal(kvt_tier_put(t, &k, val, sizeof(val)), 0);
  assert_memory_equal(val, orig, sizeof(val));
  assert_int_equal(kvt_tier_get(t, &k, got, sizeof(got), &len), 0);
  assert_int_equal(len, sizeof(val));
  assert_int_equal(bytes_differing(got, val, sizeof(val)), 1);
  kvt_tier_close(t);
}

static void test_delay_holds_the_op_at_least_the_given_ms(void **state) {
  fixture *f = *state;
  kvt_tier *t = open_ok(f, "fault:op=get,nth=1,mode=delay,ms=50@dram:1MiB");
  const kvt_key k = key_of(1);
  uint8_t val[64], got[64];
  uint64_t len = 0;
  fill(val, sizeof(val), 5);
  assert_int_equal(kvt_tier_put(t, &k, val, sizeof(val)), 0);
  const double t0 = now_ms();
  assert_int_equal(kvt_tier_get(t, &k, got, sizeof(got), &len), 0);
  assert_true(now_ms() - t0 >= 50.0);
  assert_memory_equal(got, val, sizeof(val)); /* delayed, then done right */
  kvt_tier_close(t);
}

static void test_rules_separated_by_semicolons_each_count_their_own_ops(void **state) {
  fixture *f = *state;
  kvt_tier *t = open_ok(f, "fault:op=get,nth=1,mode=fail;op=put,nth=2,mode=nospace;"
                           "op=get,nth=2,mode=delay,ms=20@dram:1MiB");
  const kvt_key a = key_of(1), b = key_of(2);
  uint8_t val[8] = {0};
  uint64_t len = 0;
  assert_int_equal(kvt_tier_put(t, &a, val, sizeof(val)), 0);
  assert_int_equal(kvt_tier_get(t, &a, val, sizeof(val), &len), -EIO);
  assert_int_equal(kvt_tier_put(t, &b, val, sizeof(val)), -ENOSPC);
  const double t0 = now_ms();
  assert_int_equal(kvt_tier_get(t, &a, val, sizeof(val), &len), 0);
  assert_true(now_ms() - t0 >= 20.0);
  assert_int_equal(kvt_tier_put(t, &b, val, sizeof(val)), 0);
  kvt_tier_close(t);
}

static void test_faults_reach_poll_with_the_callers_user_data(void **state) {
  fixture *f = *state;
  kvt_tier *t = open_ok(f, "fault:op=get,nth=2,mode=fail@dram:1MiB");
  const kvt_key k = key_of(1);
  uint8_t val[32] = {0}, bufs[4][32];
  assert_int_equal(kvt_tier_put(t, &k, val, sizeof(val)), 0);
  kvt_tier_op ops[4], *ptrs[4], *done[8];
  for (int i = 0; i < 4; i++) {
    kvt_tier_op_init(&ops[i], KVT_TIER_GET, &k, bufs[i], sizeof(bufs[i]), 100u + (unsigned)i);
    ptrs[i] = &ops[i];
  }
  assert_int_equal(kvt_tier_submit(t, ptrs, 4), 4);
  int got = 0;
  for (int round = 0; got < 4 && round < 100; round++)
    got += kvt_tier_poll(t, done + got, (size_t)(4 - got), 100);
  assert_int_equal(got, 4);
  for (int i = 0; i < 4; i++)
    assert_int_equal(done[i]->result, done[i]->user_data == 101 ? -EIO : 0);
  kvt_tier_close(t);
}

#define RACERS 8
#define RACER_GETS 50

typedef struct racer {
  kvt_tier *tier;
  int eio, ok, other;
} racer;

static void *racer_main(void *arg) {
  racer *r = arg;
  const kvt_key k = key_of(1);
  uint8_t got[16];
  uint64_t len;
  for (int i = 0; i < RACER_GETS; i++) {
    const int rc = kvt_tier_get(r->tier, &k, got, sizeof(got), &len);
    r->eio += rc == -EIO;
    r->ok += rc == 0;
    r->other += rc != 0 && rc != -EIO;
  }
  return NULL;
}

/* Rules count with atomics: threads racing for the Nth op get one fault. */
static void test_rules_fire_exactly_as_often_under_8_threads(void **state) {
  fixture *f = *state;
  static const struct {
    const char *spec;
    int faults;
  } cases[] = {{"fault:op=get,nth=100,mode=fail@dram:1MiB", 1},
               {"fault:op=get,every=10,mode=fail@dram:1MiB", RACERS * RACER_GETS / 10}};
  for (int c = 0; c < 2; c++) {
    kvt_tier *t = open_ok(f, cases[c].spec);
    const kvt_key k = key_of(1);
    uint8_t val[16] = {0};
    assert_int_equal(kvt_tier_put(t, &k, val, sizeof(val)), 0);
    racer r[RACERS];
    pthread_t th[RACERS];
    for (int i = 0; i < RACERS; i++) {
      r[i] = (racer){t, 0, 0, 0};
      assert_int_equal(pthread_create(&th[i], NULL, racer_main, &r[i]), 0);
    }
    int eio = 0, ok = 0, other = 0;
    for (int i = 0; i < RACERS; i++) {
      assert_int_equal(pthread_join(th[i], NULL), 0);
      eio += r[i].eio, ok += r[i].ok, other += r[i].other;
    }
    assert_int_equal(other, 0);
    assert_int_equal(eio, cases[c].faults);
    assert_int_equal(ok, RACERS * RACER_GETS - cases[c].faults);
    kvt_tier_close(t);
  }
}

/* ---- stats and list go through ---- */

static int count_keys(void *opaque, const kvt_key *key, uint64_t len) {
  (void)key;
  (void)len;
  ++*(int *)opaque;
  return 0;
}

static void test_fault_tier_reports_the_inner_tiers_stats_and_keys(void **state) {
  fixture *f = *state;
  kvt_tier *t = open_ok(f, "fault:op=del,every=1,mode=fail@dram:1MiB");
  uint8_t val[100] = {0};
  for (uint32_t i = 0; i < 3; i++) {
    const kvt_key k = key_of(i);
    assert_int_equal(kvt_tier_put(t, &k, val, sizeof(val)), 0);
  }
  const kvt_key k0 = key_of(0);
  assert_int_equal(kvt_tier_del(t, &k0), -EIO);
  kvt_tier_stats s = {.struct_size = sizeof(s)};
  assert_int_equal(kvt_tier_stats_get(t, &s), 0);
  assert_int_equal(s.capacity, 1u << 20);
  assert_int_equal(s.items, 3);
  assert_true(s.used >= 300);
  assert_int_equal(s.dels, 1);
  assert_int_equal(s.errors, 1);
  int n = 0;
  assert_int_equal(kvt_tier_list(t, count_keys, &n), 0);
  assert_int_equal(n, 3);
  kvt_tier_close(t);
}

/* ---- bad rules ---- */

static void test_bad_rules_fail_to_open_with_espec_naming_the_problem(void **state) {
  fixture *f = *state;
  static const struct {
    const char *spec, *names; /* the detail must contain names */
  } bad[] = {
      {"fault:op=get,nth=3,mode=fail", "@"},
      {"fault:@dram:1MiB", "no rules"},
      {"fault:op=get,mode=fail@", "inner"},
      {"fault:op=write,mode=fail@dram:1MiB", "op=write"},
      {"fault:op=get,nth=0,mode=fail@dram:1MiB", "nth=0"},
      {"fault:op=get,nth=x,mode=fail@dram:1MiB", "nth=x"},
      {"fault:op=get,every=-1,mode=fail@dram:1MiB", "every=-1"},
      {"fault:op=get,nth=99999999999999999999,mode=fail@dram:1MiB", "nth=9999"},
      {"fault:op=get,mode=explode@dram:1MiB", "mode=explode"},
      {"fault:op=get,nth=1@dram:1MiB", "mode"},
      {"fault:op=get,nth=1,every=2,mode=fail@dram:1MiB", "every"},
      {"fault:op=get,mode=delay@dram:1MiB", "ms"},
      {"fault:op=get,mode=fail,ms=5@dram:1MiB", "ms"},
      {"fault:op=get,mode=delay,ms=999999@dram:1MiB", "ms=999999"},
      {"fault:op=get,mode=short@dram:1MiB", "short"},
      {"fault:mode=short@dram:1MiB", "short"},
      {"fault:op=del,mode=corrupt@dram:1MiB", "corrupt"},
      {"fault:op=get,mode=fail,color=red@dram:1MiB", "color"},
      {"fault:op=get,op=put,mode=fail@dram:1MiB", "twice"},
      {"fault:op=get,,mode=fail@dram:1MiB", "key=value"},
      {"fault:nth@dram:1MiB", "'nth'"},
      {"fault:op=get,mode=fail;@dram:1MiB", "rule 2"},
      {"fault:op=get,mode=fail;op=get,mode=boom@dram:1MiB", "rule 2"},
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    kvt_tier *t = (kvt_tier *)f; /* must stay untouched */
    const int rc = kvt_tier_open(f->ctx, bad[i].spec, &t);
    const char *detail = kvt_ctx_last_error(f->ctx);
    if (rc != KVT_ESPEC)
      fail_msg("'%s': %s (%s), not KVT_ESPEC", bad[i].spec, kvt_err_name(rc), detail);
    if (!strstr(detail, bad[i].names))
      fail_msg("'%s': detail '%s' does not name '%s'", bad[i].spec, detail, bad[i].names);
    assert_ptr_equal(t, (kvt_tier *)f);
  }
}

static void test_inner_spec_errors_come_back_from_open(void **state) {
  fixture *f = *state;
  kvt_tier *t = NULL;
  int rc = kvt_tier_open(f->ctx, "fault:op=get,mode=fail@dram:12XB", &t);
  assert_true(rc == KVT_ESPEC || rc == -EINVAL);
  assert_non_null(strstr(kvt_ctx_last_error(f->ctx), "12XB"));
  rc = kvt_tier_open(f->ctx, "fault:op=get,mode=fail@nosuch:1MiB", &t);
  assert_int_equal(rc, KVT_ENOTSUP);
  assert_non_null(strstr(kvt_ctx_last_error(f->ctx), "nosuch"));
  rc = kvt_tier_open(f->ctx, "trace@nosuch:1MiB", &t);
  assert_int_equal(rc, KVT_ENOTSUP);
  rc = kvt_tier_open(f->ctx, "trace@", &t);
  assert_int_equal(rc, KVT_ESPEC);
  assert_non_null(strstr(kvt_ctx_last_error(f->ctx), "trace"));
  assert_null(t);
}

/* ---- trace ---- */

static void test_trace_logs_one_line_per_op_with_key_length_and_result(void **state) {
  fixture *f = *state;
  kvt_tier *t = open_ok(f, "trace@dram:1MiB");
  const kvt_key k = key_of(0x01020304);
  char hex[KVT_KEY_HEX_LEN + 1];
  kvt_key_hex(&k, hex);
  uint8_t val[10] = {0};
  uint64_t len = 0;
  assert_int_equal(kvt_tier_put(t, &k, val, sizeof(val)), 0);
  const kvt_key other = key_of(9);
  assert_int_equal(kvt_tier_get(t, &other, val, sizeof(val), &len), KVT_ENOTFOUND);
  assert_int_equal(kvt_tier_query(t, &k, &len), 0);
  assert_int_equal(f->n_lines, 3);
  assert_non_null(strstr(f->lines[0], "PUT"));
  assert_non_null(strstr(f->lines[0], hex));
  assert_non_null(strstr(f->lines[0], "len=10 "));
  assert_non_null(strstr(f->lines[0], "result=OK"));
  assert_non_null(strstr(f->lines[0], "us"));
  assert_non_null(strstr(f->lines[1], "GET"));
  assert_non_null(strstr(f->lines[1], "result=KVT_ENOTFOUND"));
  assert_non_null(strstr(f->lines[2], "QUERY"));
  assert_non_null(strstr(f->lines[2], "out_len=10 "));
  kvt_tier_close(t);
}

static void test_trace_is_silent_below_info_and_takes_a_colon_spec(void **state) {
  fixture *f = *state;
  kvt_tier *t = open_ok(f, "trace:@dram:1MiB"); /* the leading '@' is skipped */
  const kvt_key k = key_of(1);
  uint8_t val[10] = {0};
  assert_int_equal(kvt_tier_put(t, &k, val, sizeof(val)), 0);
  assert_int_equal(f->n_lines, 0);
  kvt_tier_close(t);
}

static void test_fault_around_trace_keeps_failed_ops_off_the_inner_tier(void **state) {
  fixture *f = *state;
  kvt_tier *t = open_ok(f, "fault:op=get,nth=1,mode=fail@trace@dram:1MiB");
  const kvt_key k = key_of(1);
  uint8_t val[10] = {0};
  uint64_t len = 0;
  assert_int_equal(kvt_tier_get(t, &k, val, sizeof(val), &len), -EIO);
  assert_int_equal(f->n_lines, 0); /* the inner tier never saw it */
  assert_int_equal(kvt_tier_get(t, &k, val, sizeof(val), &len), KVT_ENOTFOUND);
  assert_int_equal(f->n_lines, 1);
  kvt_tier_close(t);
}

#define FX(fn) cmocka_unit_test_setup_teardown(fn, fx_setup, fx_teardown)

int main(void) {
  const struct CMUnitTest tests[] = {
      FX(test_fail_gives_eio_on_exactly_the_nth_matching_op),
      FX(test_every_fails_each_nth_put_without_storing_it),
      FX(test_op_any_counts_every_kind_of_op),
      FX(test_nospace_refuses_the_put_without_storing_it),
      FX(test_short_write_succeeds_but_stores_half_the_bytes),
      FX(test_corrupt_get_flips_one_byte_and_keeps_the_stored_value),
      FX(test_corrupt_put_stores_one_flipped_byte_not_touching_the_callers),
      FX(test_delay_holds_the_op_at_least_the_given_ms),
      FX(test_rules_separated_by_semicolons_each_count_their_own_ops),
      FX(test_faults_reach_poll_with_the_callers_user_data),
      FX(test_rules_fire_exactly_as_often_under_8_threads),
      FX(test_fault_tier_reports_the_inner_tiers_stats_and_keys),
      FX(test_bad_rules_fail_to_open_with_espec_naming_the_problem),
      FX(test_inner_spec_errors_come_back_from_open),
      FX(test_trace_logs_one_line_per_op_with_key_length_and_result),
      cmocka_unit_test_setup_teardown(test_trace_is_silent_below_info_and_takes_a_colon_spec,
                                      fx_setup_quiet, fx_teardown),
      FX(test_fault_around_trace_keeps_failed_ops_off_the_inner_tier),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
