/* tiers/tier_trace.c - the "trace" decorator: forwards every operation to an
 * inner tier and logs it through the context's log at KVT_LOG_INFO, one line
 * per operation:
 *   trace dram:1GiB: GET key=<32 hex> len=4096 out_len=4096 result=OK 12us
 * Spec: trace@INNERSPEC (the generic layer hands over what follows "trace@";
 * a leading '@' is skipped too, so "trace:@SPEC" reads the same).
 *
 * Operations go synchronously through the inner tier's blocking helpers from
 * inside submit, so this tier never has anything in flight of its own. */
#include <errno.h>
#include <inttypes.h>
#include <time.h>

#include "tier_internal.h"

typedef struct trace_state {
  kvt_ctx *ctx;
  kvt_tier *tier; /* ours, to complete operations on */
  kvt_tier *inner;
} trace_state;

static int trace_open(kvt_ctx *ctx, const char *args, kvt_tier *tier, void **state) {
  if (*args == '@')
    args++;
  if (!*args)
    return kvt_fail(ctx, KVT_ESPEC, "trace tier: no inner tier spec (expected trace@SPEC)");
  trace_state *st = kvt_alloc(ctx, sizeof(*st), _Alignof(trace_state));
  if (!st)
    return kvt_fail(ctx, -ENOMEM, "trace tier: allocating its state");
  st->ctx = ctx;
  st->tier = tier;
  st->inner = NULL;
  int rc = kvt_tier_open(ctx, args, &st->inner);
  if (rc) {
    kvt_dealloc(ctx, st);
    return rc;
  }
  *state = st;
  return 0;
}

static void trace_close(void *state) {
  trace_state *st = state;
  kvt_tier_close(st->inner);
  kvt_dealloc(st->ctx, st);
}


static uint64_t now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static void trace_log(const trace_state *st, const kvt_tier_op *op, uint64_t us) {
  static const char *const names[] = {"?", "PUT", "GET", "DEL", "QUERY"};
  static const char hex_digits[] = "0123456789abcdef";
  char hex[2 * sizeof(op->key.bytes) + 1];
  for (size_t i = 0; i < sizeof(op->key.bytes); i++) {
    hex[2 * i] = hex_digits[op->key.bytes[i] >> 4];
    hex[2 * i + 1] = hex_digits[op->key.bytes[i] & 15];
  }
  hex[sizeof(hex) - 1] = '\0';
  kvt_logf(st->ctx, KVT_LOG_INFO,
           "trace %s: %s key=%s len=%" PRIu64 " out_len=%" PRIu64 " result=%s %" PRIu64 "us",
           kvt_tier_spec(st->inner), names[op->opcode <= KVT_TIER_QUERY ? op->opcode : 0], hex,
           op->len, op->out_len, kvt_err_name(op->result), us);
}

static int trace_submit(void *state, kvt_tier_op *op) {
  const trace_state *st = state;
  if (op->opcode < KVT_TIER_PUT || op->opcode > KVT_TIER_QUERY)
    return -EINVAL;
  /* The log settings are fixed when the context is created, so any thread
   * may read them; skip the clock and the formatting when nobody listens. */
  const int logging = st->ctx->log && st->ctx->log_level >= KVT_LOG_INFO;
  const uint64_t t0 = logging ? now_us() : 0;
  kvt_tier_forward(st->inner, op, op->buf, op->len);
  if (logging)
    trace_log(st, op, now_us() - t0);
  kvt_tier_complete(st->tier, op);
  return 0;
}

static int trace_stats(void *state, kvt_tier_stats *out) {
  return kvt_tier_inner_stats(((const trace_state *)state)->inner, out);
}

static int trace_list(void *state, kvt_tier_list_fn fn, void *opaque) {
  const trace_state *st = state;
  return kvt_tier_list(st->inner, fn, opaque);
}

/* What the inner tier is: a decorator changes what happens to operations,
 * not where payloads live. */
static uint32_t trace_traits(void *state) {
  return kvt_tier_traits(((const trace_state *)state)->inner);
}

const kvt_tier_backend kvt_tier_backend_trace = {
    .abi_version = KVT_TIER_ABI_VERSION,
    .struct_size = sizeof(kvt_tier_backend),
    .scheme = "trace",
    .open = trace_open,
    .close = trace_close,
    .submit = trace_submit,
    .progress = NULL,
    .stats = trace_stats,
    .list = trace_list,
    .traits_of = trace_traits,
};
