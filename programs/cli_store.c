/* programs/cli_store.c - `kvtier store`: put, get, remove, list and count the
 * payloads of a cache (one tier or several, through the cache manager) from
 * the command line, so an operator can inspect and repair persistent (nvme:)
 * tiers. Every payload is verified on the way in and on the way out. */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cli_util.h"

int cli_store_main(int argc, char **argv);

static const char store_help[] =
    "Usage: kvtier store --tiers 'SPEC[;SPEC...]' SUBCOMMAND [OPTIONS]\n"
    "\n"
    "Inspect and repair a cache of one or more tiers (hottest first): store,\n"
    "fetch, remove and list payloads. --tiers comes before the subcommand.\n"
    "Payloads of any model are accepted (no fingerprint is checked here); a get\n"
    "does not promote.\n"
    "\n"
    "Subcommands:\n"
    "  put [--key HEX] IN.kvt   verify IN.kvt completely (as 'kvtier verify') and\n"
    "                           store it under its chunk key in the first tier with\n"
    "                           room (colder payloads move down); --key, when\n"
    "                           given, must equal the payload's own key\n"
    "  get --key HEX -o OUT.kvt fetch the payload, verify it, and write it to OUT.kvt:\n"
    "                           a new or regular file (or a symlink's target; the\n"
    "                           link stays) atomically (a temporary file beside it,\n"
    "                           fsync, rename), a device or FIFO in place, never\n"
    "                           replaced (/dev/full fails: exit 3); a corrupt or\n"
    "                           foreign value is reported and not written\n"
    "  rm --key HEX             remove the payload from every tier\n"
    "  ls [--json]              every key with its length (and tier, when several),\n"
    "                           sorted by key, and a count\n"
    "  stats [--json]           per tier: capacity, used bytes, items and this\n"
    "                           invocation's counters (hits, demotions, ...)\n"
    "\n"
    "Tier specs, separated by ';' (quote them in the shell):\n"
    "  nvme:DIR:SIZE[,qd=N][,engine=pread]  one file per payload under DIR; persists\n"
    "                           across invocations. Corrupt or torn files are\n"
    "                           misses and are removed when put or rm finds them.\n"
    "                           get, ls and stats open DIR read-only (readonly=1):\n"
    "                           they run beside its writer (kvtier-server) and\n"
    "                           delete nothing; put and rm need DIR to themselves\n"
    "                           and fail (exit 3) naming the process holding it.\n"
    "  dram:SIZE                host memory: works, but is empty at every start,\n"
    "                           so it only makes sense for trying the commands\n"
    "  hbm:DEV:SIZE             GPU memory (CUDA builds): empty at every start too\n"
    "  fault:RULES@SPEC, trace@SPEC  decorators (tests, tracing)\n"
    "  SIZE takes B, KiB, MiB, GiB, TiB (or K, M, G, T) and KB, MB, GB, TB.\n"
    "  Examples: kvtier store --tiers nvme:/var/lib/kvtier:100GiB ls\n"
    "            kvtier store --tiers 'dram:1GiB;nvme:/var/lib/kvtier:100GiB' put p.kvt\n"
    "\n"
    "Exit status:\n"
    "  0  success\n"
    "  1  invalid, corrupt or foreign payload (a stored value that is not a\n"
    "     payload, or the payload of another chunk), key mismatch, key not found\n"
    "  2  usage error: bad option, key or tier spec\n"
    "  3  I/O error: a file or the tier could not be read or written\n"
    "  4  any other failure (tier full, out of memory, ...)\n";

/* Options of every subcommand; each takes the ones its mask names. */
enum { OPT_KEY = 1, OPT_OUT = 2, OPT_JSON = 4 };

typedef struct store_args {
  const char *spec, *key_hex, *out, *file;
  char shown[1024]; /* the tiers as output shows them: kvt_tier_spec's, secrets as *** */
  int json;
  int have_key;
  kvt_key key;
  kvt_ctx *ctx;
  kvt_cache *cache;
} store_args;

/* Tier warnings (a corrupt nvme file found and removed) reach the operator. */
static void log_stderr(void *opaque, int level, const char *msg) {
  (void)opaque;
  (void)level;
  fprintf(stderr, "kvtier: %s\n", msg);
}

/* Exit code of a failed tier operation, after printing `what: cause`. */
static int tier_fail(const store_args *a, const char *what, int err) {
  if (err == -ENOSPC) {
    cli_error("%s: no tier of '%s' has room for the payload, even after moving colder "
              "payloads down",
              what, a->shown);
    return CLI_EFAIL;
  }
  cli_error("%s: %s: %s", what, kvt_err_name(err), kvt_strerror(err));
  if (err == -ENOMEM || err <= -4000)
    return CLI_EFAIL;
  return CLI_EIO;
}

static int not_found(const store_args *a) {
  cli_error("%s: not found in %s", a->key_hex, a->shown);
  return CLI_EPAYLOAD;
}

static int store_put(store_args *a) {
  void *buf;
  size_t len;
  int rc = cli_read_file(a->file, &buf, &len);
  if (rc)
    return rc;
  kvt_payload_info info;
  int err = kvt_payload_verify(a->ctx, buf, len, &info);
  char hex[KVT_KEY_HEX_LEN + 1], want[KVT_KEY_HEX_LEN + 1];
  if (err)
    rc = cli_is_payload_error(err) ? cli_report_bad_payload(a->file, a->ctx, err)
                                   : (cli_error("%s: %s", a->file, kvt_strerror(err)), CLI_EFAIL);
  else if (a->have_key && memcmp(&a->key, &info.key, sizeof(info.key)) != 0) {
    cli_error("%s: key mismatch: --key %s, but the payload's chunk key is %s", a->file,
              kvt_key_hex(&a->key, want), kvt_key_hex(&info.key, hex));
    rc = CLI_EPAYLOAD;
  } else if (kvt_cache_query(a->cache, &info.key, NULL, NULL) == 0) {
    printf("%s: already held under %s\n", a->file, kvt_key_hex(&info.key, hex));
  } else if ((err = kvt_cache_put(a->cache, &info.key, NULL, buf, len)) != 0) {
    rc = tier_fail(a, a->file, err);
  } else {
    int t = 0;
    kvt_cache_query(a->cache, &info.key, NULL, &t);
    printf("%s: stored under %s (%zu bytes) in tier %d, %s\n", a->file, kvt_key_hex(&info.key, hex),
           len, t, kvt_tier_spec(kvt_cache_tier(a->cache, t)));
  }
  free(buf);
  return rc;
}

/* Fetches the value of a->key into a new buffer, growing it when the value
 * changed size between the query and the get. */
static int fetch(store_args *a, void **out, uint64_t *out_len) {
  uint64_t len = 0;
  int err = kvt_cache_query(a->cache, &a->key, &len, NULL);
  for (int tries = 0; err == 0 || err == KVT_ENOBUFS; tries++) {
    if (tries == 4)
      break;
    void *buf = malloc(len ? len : 1);
    if (!buf) {
      cli_error("out of memory (%" PRIu64 " bytes)", len);
      return CLI_EFAIL;
    }
    uint64_t got = 0;
    err = kvt_cache_get(a->cache, &a->key, buf, len, &got, NULL);
    if (err == 0) {
      *out = buf;
      *out_len = got;
      return 0;
    }
    free(buf);
    len = got;
  }
  if (err == KVT_ENOTFOUND)
    return not_found(a);
  if (cli_is_payload_error(err)) { /* refused by the cache's header checks */
    char label[KVT_KEY_HEX_LEN + 16];
    snprintf(label, sizeof(label), "%s (stored)", a->key_hex);
    return cli_report_bad_payload(label, a->ctx, err);
  }
  return tier_fail(a, a->key_hex, err);
}

static int store_get(store_args *a) {
  void *buf = NULL;
  uint64_t len = 0;
  int rc = fetch(a, &buf, &len);
  if (rc)
    return rc;
  char label[KVT_KEY_HEX_LEN + 16];
  snprintf(label, sizeof(label), "%s (stored)", a->key_hex);
  kvt_payload_info info;
  const int err = kvt_payload_verify(a->ctx, buf, (size_t)len, &info);
  if (err)
    rc = cli_is_payload_error(err) ? cli_report_bad_payload(label, a->ctx, err)
                                   : (cli_error("%s: %s", label, kvt_strerror(err)), CLI_EFAIL);
  else if (memcmp(&info.key, &a->key, sizeof(a->key)) != 0) {
    char hex[KVT_KEY_HEX_LEN + 1];
    cli_error("%s: holds a payload whose chunk key is %s", label, kvt_key_hex(&info.key, hex));
    rc = CLI_EPAYLOAD;
  } else if ((rc = cli_write_output(a->out, buf, (size_t)len)) == 0)
    fprintf(cli_summary_stream(&a->out, 1), "%s: %" PRIu64 " bytes written to %s\n", a->key_hex,
            len, a->out);
  free(buf);
  return rc;
}

static int store_rm(store_args *a) {
  const int err = kvt_cache_del(a->cache, &a->key);
  if (err == KVT_ENOTFOUND)
    return not_found(a);
  if (err)
    return tier_fail(a, a->key_hex, err);
  printf("%s: removed from %s\n", a->key_hex, a->shown);
  return CLI_OK;
}

typedef struct ls_entry {
  kvt_key key;
  uint64_t len;
  int tier;
} ls_entry;

typedef struct ls_list {
  ls_entry *v;
  size_t n, cap;
  int tier; /* the tier being listed */
} ls_list;

static int ls_add(void *opaque, const kvt_key *key, uint64_t len) {
  ls_list *l = opaque;
  if (l->n == l->cap) {
    const size_t cap = l->cap ? 2 * l->cap : 64;
    ls_entry *v = realloc(l->v, cap * sizeof(*v));
    if (!v)
      return -ENOMEM;
    l->v = v;
    l->cap = cap;
  }
  l->v[l->n].key = *key;
  l->v[l->n].tier = l->tier;
  l->v[l->n++].len = len;
  return 0;
}

/* Byte order of keys is the order of their lower-case hex. */
static int ls_cmp(const void *x, const void *y) {
  const ls_entry *a = x, *b = y;
  int c = memcmp(&a->key, &b->key, sizeof(kvt_key));
  return c ? c : a->tier - b->tier;
}

static void ls_print(const store_args *a, const ls_list *l) {
  char hex[KVT_KEY_HEX_LEN + 1];
  uint64_t total = 0;
  const int several = kvt_cache_tier_count(a->cache) > 1;
  if (a->json) {
    printf("{\"tier\": ");
    cli_json_str(stdout, a->shown);
    printf(", \"keys\": [");
  }
  for (size_t i = 0; i < l->n; i++) {
    total += l->v[i].len;
    kvt_key_hex(&l->v[i].key, hex);
    if (a->json)
      printf("%s\n  {\"key\": \"%s\", \"len\": %" PRIu64 ", \"tier\": %d}", i ? "," : "", hex,
             l->v[i].len, l->v[i].tier);
    else if (several)
      printf("%s %12" PRIu64 "  tier %d\n", hex, l->v[i].len, l->v[i].tier);
    else
      printf("%s %12" PRIu64 "\n", hex, l->v[i].len);
  }
  if (a->json)
    printf("],\n \"count\": %zu, \"bytes\": %" PRIu64 "}\n", l->n, total);
  else
    printf("%zu keys, %" PRIu64 " bytes\n", l->n, total);
}

static int store_ls(store_args *a) {
  ls_list l = {NULL, 0, 0, 0};
  int err = 0, rc = CLI_OK;
  for (l.tier = 0; !err && l.tier < kvt_cache_tier_count(a->cache); l.tier++)
    err = kvt_tier_list(kvt_cache_tier(a->cache, l.tier), ls_add, &l);
  if (err == KVT_ENOTSUP) {
    cli_error("%s: tier %d cannot list its keys", a->shown, l.tier - 1);
    rc = CLI_EFAIL;
  } else if (err) {
    rc = tier_fail(a, "list", err);
  } else {
    if (l.n)
      qsort(l.v, l.n, sizeof(*l.v), ls_cmp);
    ls_print(a, &l);
  }
  free(l.v);
  return rc;
}

static void stats_print(const store_args *a, int t, const kvt_cache_stats *s, int first) {
  static const char *const names[] = {"capacity",  "used",       "items",     "hits",
                                      "misses",    "puts",       "bytes_in",  "bytes_out",
                                      "demotions", "promotions", "evictions", "errors"};
  const uint64_t vals[] = {s->capacity,  s->used,       s->items,     s->hits,
                           s->misses,    s->puts,       s->bytes_in,  s->bytes_out,
                           s->demotions, s->promotions, s->evictions, s->errors};
  const char *spec = kvt_tier_spec(kvt_cache_tier(a->cache, t));
  if (a->json) {
    printf("%s\n  {\"index\": %d, \"tier\": ", first ? "" : ",", t);
    cli_json_str(stdout, spec);
  } else {
    printf("%stier       %d %s\n", first ? "" : "\n", t, spec);
  }
  for (size_t i = 0; i < sizeof(vals) / sizeof(vals[0]); i++) {
    if (a->json)
      printf(", \"%s\": %" PRIu64, names[i], vals[i]);
    else
      printf("%-10s %" PRIu64 "\n", names[i], vals[i]);
  }
  if (a->json)
    printf("}");
}

static int store_stats(store_args *a) {
  if (a->json)
    printf("{\"tiers\": [");
  for (int t = 0; t < kvt_cache_tier_count(a->cache); t++) {
    kvt_cache_stats s;
    memset(&s, 0, sizeof(s));
    s.struct_size = sizeof(s);
    const int err = kvt_cache_stats_get(a->cache, t, &s);
    if (err)
      return tier_fail(a, "stats", err);
    stats_print(a, t, &s, t == 0);
  }
  if (a->json)
    printf("]}\n");
  return CLI_OK;
}

typedef struct store_sub {
  const char *name, *cmd; /* "put", "store put" */
  int (*fn)(store_args *);
  int opts;  /* OPT_* accepted */
  int need;  /* OPT_* required */
  int files; /* positional files expected */
} store_sub;

static const store_sub subs[] = {
    {"put", "store put", store_put, OPT_KEY, 0, 1},
    {"get", "store get", store_get, OPT_KEY | OPT_OUT, OPT_KEY | OPT_OUT, 0},
    {"rm", "store rm", store_rm, OPT_KEY, OPT_KEY, 0},
    {"ls", "store ls", store_ls, OPT_JSON, 0, 0},
    {"stats", "store stats", store_stats, OPT_JSON, 0, 0},
};

/* Parses the subcommand's own arguments (argv[0] is its name). */
static int parse_sub(const store_sub *sub, int argc, char **argv, store_args *a) {
  const cli_opt all[] = {{"--key", NULL, CLI_STR, &a->key_hex, 0, 0},
                         {"--output", "-o", CLI_STR, &a->out, 0, 0},
                         {"--json", NULL, CLI_FLAG, &a->json, 0, 0}};
  cli_opt opts[3];
  size_t n_opts = 0;
  for (size_t i = 0; i < 3; i++)
    if (sub->opts & (1 << i))
      opts[n_opts++] = all[i];
  size_t n_pos;
  int rc = cli_parse(sub->cmd, argc, argv, opts, n_opts, &a->file, 1, &n_pos);
  if (rc)
    return rc;
  if (n_pos != (size_t)sub->files)
    return cli_usage_error(sub->cmd, sub->files ? "name one payload file" : "takes no files");
  if ((sub->need & OPT_KEY) && !a->key_hex)
    return cli_usage_error(sub->cmd, "--key HEX is required");
  if ((sub->need & OPT_OUT) && !a->out)
    return cli_usage_error(sub->cmd, "-o OUT.kvt is required");
  if ((rc = cli_check_output(sub->cmd, "-o", a->out)) != 0)
    return rc;
  if (a->key_hex) {
    if (kvt_key_from_hex(a->key_hex, &a->key) != 0)
      return cli_usage_error(sub->cmd, "--key: expected 32 hex digits, got '%s'", a->key_hex);
    a->have_key = 1;
  }
  return 0;
}

/* Index of the subcommand: the first argument that is neither an option nor
 * the value of --tiers; argc when there is none. */
static int find_sub(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--tiers") == 0)
      i++;
    else if (argv[i][0] != '-')
      return i;
  }
  return argc;
}

/* The tier list with ",readonly=1" after each nvme: spec (the last of its
 * ';'-separated piece; a decorator's inner spec ends it too). The read
 * subcommands open nvme tiers so: they run beside the directory's writer
 * (kvtier-server, a put) and change nothing on disk, not even a file that
 * does not verify. NULL when out of memory. */
static char *readonly_specs(const char *list) {
  static const char ro[] = ",readonly=1";
  size_t pieces = 1;
  for (const char *p = list; *p; p++)
    pieces += *p == ';';
  char *out = malloc(strlen(list) + pieces * (sizeof(ro) - 1) + 1);
  if (!out)
    return NULL;
  char *o = out;
  for (const char *piece = list;; piece++) {
    const size_t len = strcspn(piece, ";");
    memcpy(o, piece, len);
    o += len;
    if (strncmp(piece, "nvme:", 5) == 0 || memmem(piece, len, "@nvme:", 6)) {
      memcpy(o, ro, sizeof(ro) - 1);
      o += sizeof(ro) - 1;
    }
    piece += len;
    if (!*piece)
      break;
    *o++ = ';';
  }
  *o = '\0';
  return out;
}

static int open_cache(store_args *a, int readonly) {
  kvt_ctx_config cfg = KVT_CTX_CONFIG_INIT;
  cfg.log = log_stderr;
  cfg.log_level = KVT_LOG_WARN;
  int err = kvt_ctx_create(&cfg, &a->ctx);
  if (err) {
    cli_error("cannot create a context: %s", kvt_strerror(err));
    return CLI_EFAIL;
  }
  kvt_cache_config cc = KVT_CACHE_CONFIG_INIT;
  char *ro = readonly ? readonly_specs(a->spec) : NULL;
  if (readonly && !ro) {
    cli_error("out of memory");
    return CLI_EFAIL;
  }
  cc.tiers = ro ? ro : a->spec;
  cc.flags = KVT_CACHE_NO_PROMOTE;
  err = kvt_cache_open(a->ctx, &cc, &a->cache);
  free(ro);
  if (err == 0) {
    for (int t = 0; t < kvt_cache_tier_count(a->cache); t++) {
      const size_t n = strlen(a->shown);
      snprintf(a->shown + n, sizeof(a->shown) - n, "%s%s", t ? ";" : "",
               kvt_tier_spec(kvt_cache_tier(a->cache, t)));
    }
    return 0;
  }
  /* The detail names the tier that failed (its secrets as ***); the value
   * of --tiers is not repeated, as it may hold a password or token. */
  const char *detail = kvt_ctx_last_error(a->ctx);
  if (!detail || !*detail)
    detail = kvt_strerror(err);
  if (err == -EINVAL || err == KVT_ESPEC || err == KVT_ENOTSUP)
    return cli_usage_error("store", "--tiers: %s", detail);
  cli_error("cannot open tiers: %s", detail);
  return err == -ENOMEM || err <= -4000 ? CLI_EFAIL : CLI_EIO;
}

int cli_store_main(int argc, char **argv) {
  store_args a;
  memset(&a, 0, sizeof(a));
  const int k = find_sub(argc, argv);
  const cli_opt top[] = {{"--tiers", NULL, CLI_STR, &a.spec, 0, 0}};
  size_t n_pos;
  int rc = cli_parse("store", k, argv, top, 1, NULL, 0, &n_pos);
  if (rc == CLI_HELP)
    return fputs(store_help, stdout), CLI_OK;
  if (rc)
    return rc;
  if (k == argc)
    return cli_usage_error("store", "name a subcommand: put, get, rm, ls or stats");
  const store_sub *sub = NULL;
  for (size_t i = 0; i < sizeof(subs) / sizeof(subs[0]); i++)
    if (strcmp(argv[k], subs[i].name) == 0)
      sub = &subs[i];
  if (!sub)
    return cli_usage_error("store", "unknown subcommand '%s' (put, get, rm, ls, stats)", argv[k]);
  rc = parse_sub(sub, argc - k, argv + k, &a);
  if (rc == CLI_HELP)
    return fputs(store_help, stdout), CLI_OK;
  if (rc)
    return rc;
  if (!a.spec)
    return cli_usage_error("store", "--tiers SPEC is required (e.g. nvme:DIR:100GiB)");
  const int reads = sub->fn != store_put && sub->fn != store_rm; /* see readonly_specs */
  if ((rc = open_cache(&a, reads)) == 0)
    rc = sub->fn(&a);
  kvt_cache_close(a.cache);
  kvt_ctx_destroy(a.ctx);
  return rc;
}
