/* tests/test_tier_wait.c - operations a caller owns (kvt_tier_submit_owned
 * + kvt_tier_wait): they never reach kvt_tier_poll, so a library can share a
 * tier with other pollers; a wait can time out and be repeated; waits and
 * polls with timeout 0 alone drive the nvme tier's ring. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <errno.h>
#include <string.h>

#include "kvtier.h"

#include "cache_fixture.h"

static kvt_ctx *ctx;

static int setup(void **state) {
  (void)state;
  return kvt_ctx_create(NULL, &ctx);
}

static int teardown(void **state) {
  (void)state;
  kvt_ctx_destroy(ctx);
  return 0;
}

static void test_tier_owned_ops_complete_to_their_waiter_only(void **state) {
  (void)state;
  kvt_tier *t;
  assert_int_equal(kvt_tier_open(ctx, "dram:1MiB", &t), 0);
  uint8_t val[100], back[100];
  memset(val, 7, sizeof(val));
  kvt_key k = {{1, 2, 3}};
  kvt_tier_op put, get, other;
  kvt_tier_op_init(&put, KVT_TIER_PUT, &k, val, sizeof(val), 1);
  kvt_tier_op *p = &put;
  assert_int_equal(kvt_tier_submit_owned(t, &p, 1), 1);
  assert_int_equal(kvt_tier_wait(t, &put, -1), 0);
  kvt_tier_op_init(&get, KVT_TIER_GET, &k, back, sizeof(back), 2);
  p = &get;
  assert_int_equal(kvt_tier_submit_owned(t, &p, 1), 1);
  /* A poller sees nothing of it. */
  kvt_tier_op *done[4];
  assert_int_equal(kvt_tier_poll(t, done, 4, 0), 0);
  assert_int_equal(kvt_tier_wait(t, &get, -1), 0);
  assert_int_equal(get.out_len, sizeof(val));
  assert_memory_equal(back, val, sizeof(val));
  /* A polled operation cannot be waited for. */
  kvt_tier_op_init(&other, KVT_TIER_QUERY, &k, NULL, 0, 3);
  p = &other;
  assert_int_equal(kvt_tier_submit(t, &p, 1), 1);
  assert_int_equal(kvt_tier_wait(t, &other, -1), -EINVAL);
  assert_int_equal(kvt_tier_poll(t, done, 4, -1), 1);
  assert_ptr_equal(done[0], &other);
  kvt_tier_close(t);
}

/* A backend that holds every operation until the test completes it. */
static kvt_tier *held_tier;
static kvt_tier_op *held_op;

static int held_open(kvt_ctx *c, const char *args, kvt_tier *tier, void **state) {
  (void)c, (void)args;
  held_tier = tier;
  *state = NULL;
  return 0;
}
static void held_close(void *state) { (void)state; }
static int held_submit(void *state, kvt_tier_op *op) {
  (void)state;
  held_op = op;
  return 0;
}

static void test_tier_wait_times_out_and_can_wait_again(void **state) {
  (void)state;
  static const kvt_tier_backend held = {KVT_TIER_ABI_VERSION, sizeof(kvt_tier_backend), "held",
                                        held_open, held_close, held_submit, NULL, NULL, NULL,
                                        NULL, NULL, NULL, NULL, NULL, 0, NULL};
  kvt_tier *t;
  assert_int_equal(kvt_tier_open_backend(ctx, &held, "", &t), 0);
  kvt_key k = {{9}};
  kvt_tier_op q;
  kvt_tier_op_init(&q, KVT_TIER_QUERY, &k, NULL, 0, 0);
  kvt_tier_op *p = &q;
  assert_int_equal(kvt_tier_submit_owned(t, &p, 1), 1);
  assert_ptr_equal(held_op, &q);
  assert_int_equal(kvt_tier_wait(t, &q, 0), -ETIMEDOUT);
  assert_int_equal(kvt_tier_wait(t, &q, 30), -ETIMEDOUT);
  q.result = KVT_ENOTFOUND;
  kvt_tier_complete(held_tier, &q);
  kvt_tier_loan loan;
  assert_int_equal(kvt_tier_borrow(t, &k, &loan), KVT_ENOTSUP); /* no borrow member */
  assert_int_equal(kvt_tier_wait(t, &q, 0), KVT_ENOTFOUND);
  assert_int_equal(kvt_tier_wait(t, &q, -1), KVT_ENOTFOUND);
  assert_int_equal(kvt_tier_wait(NULL, &q, 0), -EINVAL);
  kvt_tier_close(t);
}

/* A table built against 0.1's header (it ends before borrow) still opens. */
static void test_tier_backend_table_of_an_older_size_opens(void **state) {
  (void)state;
  kvt_tier_backend old = {KVT_TIER_ABI_VERSION, 0, "old", held_open, held_close, held_submit,
                          NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, NULL};
  old.struct_size = (uint32_t)offsetof(kvt_tier_backend, borrow);
  kvt_tier *t = NULL;
  assert_int_equal(kvt_tier_open_backend(ctx, &old, "", &t), 0);
  kvt_key k = {{1}};
  kvt_tier_loan loan;
  assert_int_equal(kvt_tier_borrow(t, &k, &loan), KVT_ENOTSUP);
  kvt_tier_close(t);
  old.struct_size = 8; /* too short to hold even the required members */
  assert_int_equal(kvt_tier_open_backend(ctx, &old, "", &t), -EINVAL);
}

/* ---- timeouts of 0 driving the nvme tier (fixture: cache_fixture.h) ---- */

static kvt_tier *open_nvme(void) {
  char spec[400];
  snprintf(spec, sizeof(spec), "nvme:%s:64MiB", fx->dir);
  kvt_tier *t = NULL;
  const int r = kvt_tier_open(fx->ctx, spec, &t);
  if (r)
    print_error("open %s: %s (%s)\n", spec, kvt_strerror(r), kvt_ctx_last_error(fx->ctx));
  assert_int_equal(r, 0);
  return t;
}

/* kvt_tier_wait with timeouts 0 and 1 on nvme operations: -ETIMEDOUT until
 * done (each call drives the ring), the result once done and on every later
 * wait, and the bytes are right. */
static void test_tier_wait_timeouts_on_nvme(void **state) {
  (void)state;
  kvt_tier *t = open_nvme();
  enum { LEN = 1 << 20 };
  uint8_t *val = aligned_alloc(4096, LEN), *back = aligned_alloc(4096, LEN);
  for (size_t i = 0; i < LEN; i++)
    val[i] = (uint8_t)(i * 31u + 7u);
  kvt_key k = {{4, 4, 4}};
  kvt_tier_op put, get;
  kvt_tier_op_init(&put, KVT_TIER_PUT, &k, val, LEN, 1);
  kvt_tier_op *p = &put;
  assert_int_equal(kvt_tier_submit_owned(t, &p, 1), 1);
  int rc, spins = 0;
  while ((rc = kvt_tier_wait(t, &put, spins & 1)) == -ETIMEDOUT)
    assert_true(++spins < 1000000);
  assert_int_equal(rc, 0);
  assert_int_equal(kvt_tier_wait(t, &put, 0), 0); /* done stays done */
  kvt_tier_op_init(&get, KVT_TIER_GET, &k, back, LEN, 2);
  p = &get;
  assert_int_equal(kvt_tier_submit_owned(t, &p, 1), 1);
  kvt_tier_op *done[2];
  assert_int_equal(kvt_tier_poll(t, done, 2, 0), 0); /* never reaches poll */
  spins = 0;
  while ((rc = kvt_tier_wait(t, &get, 0)) == -ETIMEDOUT)
    assert_true(++spins < 10000000);
  assert_int_equal(rc, 0);
  assert_int_equal(get.out_len, LEN);
  assert_memory_equal(back, val, LEN);
  free(val);
  free(back);
  kvt_tier_close(t);
}

/* kvt_tier_poll with timeout 0 alone drives the nvme tier: a loop of
 * non-blocking polls collects a PUT and a GET without any blocking call. */
static void test_tier_poll_timeout_0_makes_progress_on_nvme(void **state) {
  (void)state;
  kvt_tier *t = open_nvme();
  uint8_t val[5000], back[5000];
  for (size_t i = 0; i < sizeof(val); i++)
    val[i] = (uint8_t)(i ^ 0x5a);
  kvt_key k = {{5, 5, 5}};
  kvt_tier_op put, get;
  kvt_tier_op_init(&put, KVT_TIER_PUT, &k, val, sizeof(val), 11);
  kvt_tier_op *p = &put, *done[2];
  assert_int_equal(kvt_tier_submit(t, &p, 1), 1);
  int got = 0;
  for (long spins = 0; got == 0; spins++) {
    assert_true(spins < 10000000);
    got = kvt_tier_poll(t, done, 2, 0);
  }
  assert_int_equal(got, 1);
  assert_ptr_equal(done[0], &put);
  assert_int_equal(put.result, 0);
  kvt_tier_op_init(&get, KVT_TIER_GET, &k, back, sizeof(back), 12);
  p = &get;
  assert_int_equal(kvt_tier_submit(t, &p, 1), 1);
  got = 0;
  for (long spins = 0; got == 0; spins++) {
    assert_true(spins < 10000000);
    got = kvt_tier_poll(t, done, 2, 0);
  }
  assert_int_equal(got, 1);
  assert_ptr_equal(done[0], &get);
  assert_int_equal(get.result, 0);
  assert_int_equal(get.out_len, sizeof(val));
  assert_memory_equal(back, val, sizeof(val));
  assert_int_equal(kvt_tier_poll(t, done, 2, 0), 0); /* nothing in flight */
  kvt_tier_close(t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_tier_owned_ops_complete_to_their_waiter_only, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_tier_wait_times_out_and_can_wait_again, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_tier_backend_table_of_an_older_size_opens, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_tier_wait_timeouts_on_nvme, ct_setup, ct_teardown),
      cmocka_unit_test_setup_teardown(test_tier_poll_timeout_0_makes_progress_on_nvme, ct_setup,
                                      ct_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
