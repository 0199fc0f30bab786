/* tiers/tier_fault.c - the "fault" decorator: injects failures, delays, short
 * writes and corruption into the operations of an inner tier, by rule, so
 * tests can drive the error paths of everything built on a tier.
 *
 * Spec: fault:RULE[;RULE...]@INNERSPEC, a RULE being comma-separated fields
 *   op=put|get|del|query|any  which operations the rule counts (default any)
 *   nth=N or every=N          fire on the Nth counted operation only, or on
 *                             every Nth (1-based; default every=1)
 *   mode=fail                 result -EIO; the inner tier is not called
 *   mode=nospace              result -ENOSPC; the inner tier is not called
 *   mode=delay,ms=M           sleep M milliseconds, then forward
 *   mode=short                (op=put) store only the first half of the bytes
 *                             and report success: a short write
 *   mode=corrupt              (op=get or op=put) flip one byte of the value
 *                             returned, or of the value stored
 * e.g. fault:op=get,nth=3,mode=corrupt@dram:64MiB. Each rule counts its own
 * operations; when several fire on one operation their delays add up and the
 * first other mode applies.
 *
 * Operations go synchronously through the inner tier's blocking helpers from
 * inside submit, so this tier never has anything in flight of its own. */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "tier_internal.h"

#define FAULT_RULE_MAX 256       /* characters in one rule */
#define FAULT_DELAY_MAX_MS 60000 /* a test that sleeps longer is a mistake */

enum fault_mode { MODE_NONE, MODE_FAIL, MODE_NOSPACE, MODE_DELAY, MODE_SHORT, MODE_CORRUPT };

/* Field bits, to catch a field given twice. */
enum { F_OP = 1, F_NTH = 2, F_EVERY = 4, F_MODE = 8, F_MS = 16 };

typedef struct fault_rule {
  uint32_t op; /* enum kvt_tier_opcode, 0 for any */
  int mode;
  uint64_t nth, every, ms;    /* exactly one of nth and every is non-zero */
  atomic_uint_fast64_t seen;  /* operations this rule counted */
  atomic_uint_fast64_t fired; /* faults it injected */
} fault_rule;

typedef struct fault_state {
  kvt_ctx *ctx;
  kvt_tier *tier; /* ours, to complete operations on */
  kvt_tier *inner;
  size_t n_rules;
  fault_rule rules[];
} fault_state;

static const struct {
  const char *name;
  uint32_t op;
} op_names[] = {{"any", 0},
                {"put", KVT_TIER_PUT},
                {"get", KVT_TIER_GET},
                {"del", KVT_TIER_DEL},
                {"query", KVT_TIER_QUERY}};

static const struct {
  const char *name;
  int mode;
} mode_names[] = {{"fail", MODE_FAIL},
                  {"nospace", MODE_NOSPACE},
                  {"delay", MODE_DELAY},
                  {"short", MODE_SHORT},
                  {"corrupt", MODE_CORRUPT}};

#define COUNT_OF(a) (sizeof(a) / sizeof((a)[0]))

/* Decimal digits only: strtoull would take signs, spaces and hex. */
static int parse_u64(const char *s, uint64_t *out) {
  uint64_t v = 0;
  if (!*s)
    return -1;
  for (; *s; s++) {
    if (*s < '0' || *s > '9' || v > (UINT64_MAX - 9) / 10)
      return -1;
    v = v * 10 + (uint64_t)(*s - '0');
  }
  *out = v;
  return 0;
}

static int parse_count(kvt_ctx *ctx, unsigned idx, const char *key, const char *val,
                       uint64_t *out) {
  if (parse_u64(val, out) != 0 || *out == 0)
    return kvt_fail(ctx, KVT_ESPEC, "fault rule %u: %s=%s: expected a positive integer", idx, key,
                    val);
  return 0;
}

static int parse_name(kvt_ctx *ctx, unsigned idx, const char *key, const char *val, unsigned *bits,
                      fault_rule *r) {
  if (strcmp(key, "op") == 0) {
    *bits |= F_OP;
    for (size_t i = 0; i < COUNT_OF(op_names); i++)
      if (strcmp(val, op_names[i].name) == 0) {
        r->op = op_names[i].op;
        return 0;
      }
    return kvt_fail(ctx, KVT_ESPEC, "fault rule %u: op=%s: expected put, get, del, query or any",
                    idx, val);
  }
  *bits |= F_MODE;
  for (size_t i = 0; i < COUNT_OF(mode_names); i++)
    if (strcmp(val, mode_names[i].name) == 0) {
      r->mode = mode_names[i].mode;
      return 0;
    }
  return kvt_fail(ctx, KVT_ESPEC,
                  "fault rule %u: mode=%s: expected fail, nospace, delay, short or corrupt", idx,
                  val);
}

/* One "key=value" field of rule idx. */
static int parse_field(kvt_ctx *ctx, unsigned idx, char *field, unsigned *bits, fault_rule *r) {
  static const struct {
    const char *key;
    unsigned bit;
  } keys[] = {{"op", F_OP}, {"nth", F_NTH}, {"every", F_EVERY}, {"mode", F_MODE}, {"ms", F_MS}};
  char *eq = strchr(field, '=');
  if (!eq)
    return kvt_fail(ctx, KVT_ESPEC, "fault rule %u: field '%s' is not key=value", idx, field);
  *eq = '\0';
  const char *key = field, *val = eq + 1;
  unsigned bit = 0;
  for (size_t i = 0; i < COUNT_OF(keys); i++)
    if (strcmp(key, keys[i].key) == 0)
      bit = keys[i].bit;
  if (!bit)
    return kvt_fail(ctx, KVT_ESPEC,
                    "fault rule %u: unknown field '%s' (expected op, nth, every, mode or ms)", idx,
                    key);
  if (*bits & bit)
    return kvt_fail(ctx, KVT_ESPEC, "fault rule %u: field '%s' given twice", idx, key);
  if (bit == F_OP || bit == F_MODE)
    return parse_name(ctx, idx, key, val, bits, r);
  *bits |= bit;
  if (bit == F_NTH)
    return parse_count(ctx, idx, key, val, &r->nth);
  if (bit == F_EVERY)
    return parse_count(ctx, idx, key, val, &r->every);
  if (parse_u64(val, &r->ms) != 0 || r->ms > FAULT_DELAY_MAX_MS)
    return kvt_fail(ctx, KVT_ESPEC, "fault rule %u: ms=%s: expected 0 to %d milliseconds", idx, val,
                    FAULT_DELAY_MAX_MS);
  return 0;
}

/* The fields make sense together. */
static int check_rule(kvt_ctx *ctx, unsigned idx, unsigned bits, fault_rule *r) {
  if (!(bits & F_MODE))
    return kvt_fail(ctx, KVT_ESPEC, "fault rule %u: no mode= given", idx);
  if ((bits & F_NTH) && (bits & F_EVERY))
    return kvt_fail(ctx, KVT_ESPEC, "fault rule %u: nth= and every= exclude each other", idx);
  if (!(bits & (F_NTH | F_EVERY)))
    r->every = 1;
  if (r->mode == MODE_DELAY && !(bits & F_MS))
    return kvt_fail(ctx, KVT_ESPEC, "fault rule %u: mode=delay needs ms=", idx);
  if (r->mode != MODE_DELAY && (bits & F_MS))
    return kvt_fail(ctx, KVT_ESPEC, "fault rule %u: ms= goes only with mode=delay", idx);
  if (r->mode == MODE_SHORT && r->op != KVT_TIER_PUT)
    return kvt_fail(ctx, KVT_ESPEC, "fault rule %u: mode=short applies to op=put only", idx);
  if (r->mode == MODE_CORRUPT && r->op != KVT_TIER_PUT && r->op != KVT_TIER_GET)
    return kvt_fail(ctx, KVT_ESPEC, "fault rule %u: mode=corrupt applies to op=put or op=get", idx);
  return 0;
}

/* Rule idx (1-based, for messages) is text[0..n), not NUL-terminated. */
static int parse_rule(kvt_ctx *ctx, unsigned idx, const char *text, size_t n, fault_rule *r) {
  char buf[FAULT_RULE_MAX];
  if (n == 0)
    return kvt_fail(ctx, KVT_ESPEC, "fault rule %u is empty", idx);
  if (n >= sizeof(buf))
    return kvt_fail(ctx, KVT_ESPEC, "fault rule %u is longer than %d characters", idx,
                    FAULT_RULE_MAX - 1);
  memcpy(buf, text, n);
  buf[n] = '\0';
  unsigned bits = 0;
  char *field = buf;
  while (field) {
    char *next = strchr(field, ',');
    if (next)
      *next++ = '\0';
    int rc = parse_field(ctx, idx, field, &bits, r);
    if (rc)
      return rc;
    field = next;
  }
  return check_rule(ctx, idx, bits, r);
}

static int parse_rules(kvt_ctx *ctx, const char *rules, size_t len, fault_state *st) {
  const char *p = rules, *end = rules + len;
  for (size_t i = 0; i < st->n_rules; i++) {
    const char *semi = memchr(p, ';', (size_t)(end - p));
    const char *stop = semi ? semi : end;
    fault_rule *r = &st->rules[i];
    atomic_init(&r->seen, 0);
    atomic_init(&r->fired, 0);
    int rc = parse_rule(ctx, (unsigned)i + 1, p, (size_t)(stop - p), r);
    if (rc)
      return rc;
    p = stop + 1;
  }
  return 0;
}

static int fault_open(kvt_ctx *ctx, const char *args, kvt_tier *tier, void **state) {
  const char *at = strchr(args, '@');
  char shown[512]; /* the inner spec's secrets as "***" */
  kvt_spec_redact(shown, sizeof(shown), args);
  if (!at)
    return kvt_fail(ctx, KVT_ESPEC, "fault tier '%s': expected RULES@INNERSPEC (no '@')", shown);
  if (at == args)
    return kvt_fail(ctx, KVT_ESPEC, "fault tier '%s': no rules before '@'", shown);
  if (!at[1])
    return kvt_fail(ctx, KVT_ESPEC, "fault tier '%s': no inner tier spec after '@'", shown);
  size_t n_rules = 1;
  for (const char *p = args; p < at; p++)
    n_rules += *p == ';';
  fault_state *st =
      kvt_alloc(ctx, sizeof(*st) + n_rules * sizeof(fault_rule), _Alignof(fault_state));
  if (!st)
    return kvt_fail(ctx, -ENOMEM, "fault tier: allocating %zu rules", n_rules);
  memset(st, 0, sizeof(*st) + n_rules * sizeof(fault_rule));
  st->ctx = ctx;
  st->tier = tier;
  st->n_rules = n_rules;
  int rc = parse_rules(ctx, args, (size_t)(at - args), st);
  if (rc == 0)
    rc = kvt_tier_open(ctx, at + 1, &st->inner);
  if (rc) {
    kvt_dealloc(ctx, st);
    return rc;
  }
  *state = st;
  return 0;
}

static void fault_close(void *state) {
  fault_state *st = state;
  for (size_t i = 0; i < st->n_rules; i++)
    kvt_logf(st->ctx, KVT_LOG_DEBUG, "fault rule %zu: %llu operations counted, %llu faults", i + 1,
             (unsigned long long)atomic_load(&st->rules[i].seen),
             (unsigned long long)atomic_load(&st->rules[i].fired));
  kvt_tier_close(st->inner);
  kvt_dealloc(st->ctx, st);
}

/* Counts op against every rule; returns the mode to apply and adds up the
 * delays of the rules that fire. */
static int fault_pick(fault_state *st, uint32_t opcode, uint64_t *delay_ms) {
  int mode = MODE_NONE;
  *delay_ms = 0;
  for (size_t i = 0; i < st->n_rules; i++) {
    fault_rule *r = &st->rules[i];
    if (r->op && r->op != opcode)
      continue;
    const uint64_t n = atomic_fetch_add(&r->seen, 1) + 1;
    if (r->nth ? n != r->nth : n % r->every != 0)
      continue;
    atomic_fetch_add(&r->fired, 1);
    if (r->mode == MODE_DELAY)
      *delay_ms += r->ms;
    else if (mode == MODE_NONE)
      mode = r->mode;
  }
  return mode;
}

static void sleep_ms(uint64_t ms) {
  struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* Runs op on the inner tier, storing put_len bytes of put_buf for a PUT. */

/* The caller's payload is const to us: corrupt a copy. The copy comes from
 * malloc, not the context's allocator, which core.h promises is called from
 * one thread at a time while submit runs on many; this is a test tier. */
static void put_corrupted(fault_state *st, kvt_tier_op *op) {
  if (op->len == 0) {
    kvt_tier_forward(st->inner, op, op->buf, op->len);
    return;
  }
  uint8_t *copy = malloc((size_t)op->len);
  if (!copy) {
    op->result = -ENOMEM;
    op->out_len = 0;
    return;
  }
  memcpy(copy, op->buf, (size_t)op->len);
  copy[op->len / 2] ^= 0xFF;
  kvt_tier_forward(st->inner, op, copy, op->len);
  free(copy);
}

static int fault_submit(void *state, kvt_tier_op *op) {
  fault_state *st = state;
  if (op->opcode < KVT_TIER_PUT || op->opcode > KVT_TIER_QUERY)
    return -EINVAL;
  uint64_t delay_ms;
  const int mode = fault_pick(st, op->opcode, &delay_ms);
  if (delay_ms)
    sleep_ms(delay_ms);
  switch (mode) {
  case MODE_FAIL:
  case MODE_NOSPACE:
    op->result = mode == MODE_FAIL ? -EIO : -ENOSPC;
    op->out_len = 0;
    break;
  case MODE_SHORT:
    kvt_tier_forward(st->inner, op, op->buf, op->len / 2);
    break;
  case MODE_CORRUPT:
    if (op->opcode == KVT_TIER_PUT) {
      put_corrupted(st, op);
      break;
    }
    kvt_tier_forward(st->inner, op, op->buf, op->len);
    if (op->result == 0 && op->out_len > 0)
      ((uint8_t *)op->buf)[op->out_len / 2] ^= 0xFF;
    break;
  default:
    kvt_tier_forward(st->inner, op, op->buf, op->len);
    break;
  }
  kvt_tier_complete(st->tier, op);
  return 0;
}

static int fault_stats(void *state, kvt_tier_stats *out) {
  return kvt_tier_inner_stats(((const fault_state *)state)->inner, out);
}

static int fault_list(void *state, kvt_tier_list_fn fn, void *opaque) {
  const fault_state *st = state;
  return kvt_tier_list(st->inner, fn, opaque);
}

/* What the inner tier is: a decorator changes what happens to operations,
 * not where payloads live. */
static uint32_t fault_traits(void *state) {
  return kvt_tier_traits(((const fault_state *)state)->inner);
}

const kvt_tier_backend kvt_tier_backend_fault = {
    .abi_version = KVT_TIER_ABI_VERSION,
    .struct_size = sizeof(kvt_tier_backend),
    .scheme = "fault",
    .open = fault_open,
    .close = fault_close,
    .submit = fault_submit,
    .progress = NULL,
    .stats = fault_stats,
    .list = fault_list,
    .traits_of = fault_traits,
};
