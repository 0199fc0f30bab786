/* bench/cli_project_fit.c - `kvtier project breakeven|fit|saturation|advise`:
 * the ITL break-even of two measured lines, least-squares fits of ITL and
 * of the saturation curve from JSON Lines measurements, and placement
 * advice (HBM capacity, restore time per tier, time saved over prefill). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli_project.h"
#include "curve_fit.h"
#include "model_json.h"

static const char breakeven_help[] =
    "Usage: kvtier project breakeven --base SLOPE,INTERCEPT --new SLOPE,INTERCEPT [--json]\n"
    "\n"
    "Two ITL lines, ITL = SLOPE x context + INTERCEPT (ms per token, ms), cross at\n"
    "context (new_intercept - base_intercept) / (base_slope - new_slope). Prints\n"
    "that context and on which side the new one is faster. Example (vLLM, H100,\n"
    "Llama-3.1-8B, bf16 vs fp8 KV): --base 4.37e-5,6.44 --new 2.37e-5,6.58 -> 7000.\n";

static const char fit_help[] =
    "Usage: kvtier project fit FILE.jsonl [--json]\n"
    "\n"
    "Fits ITL = alpha x context + beta by least squares to measurements, one JSON\n"
    "object a line: {\"context\": T, \"itl_ms\": ms} (also \"T\"/\"tokens\" and \"itl\"),\n"
    "optionally with \"series\" (or \"codec\", \"label\") to fit several lines at once;\n"
    "each later series is compared with the first (break-even context). Prints\n"
    "alpha, beta and R^2 per series. A malformed line exits 1 naming it.\n";

static const char saturation_help[] =
    "Usage: kvtier project saturation FILE.jsonl [--json]\n"
    "       kvtier project saturation --smax S --bhalf B --gamma G [--batch N] [--json]\n"
    "\n"
    "Speedup by batch follows S(B) = Smax B^g / (Bh^g + B^g). With a file of\n"
    "{\"batch\": B, \"speedup\": S} lines, fits Smax, Bh and g by least squares and\n"
    "prints R^2; with the parameters given, evaluates the curve (at --batch N).\n"
    "Both print the batch reaching 80% and 95% of Smax: Bh (p/(1-p))^(1/g).\n"
    "Published fit (fused INT4 decode, H100, 14 models): --smax 3.75 --bhalf 5.1\n"
    "--gamma 1.32.\n";

static const char advise_help[] =
    "Usage: kvtier project advise --model M --hbm-free GiB [--batch B] [--context T]\n"
    "       [--codec SPEC]... [--link NAME[=GB/s]]... [--measured NAME=GB/s]...\n"
    "       [--tflops F] [--mfu U] [--json]\n"
    "\n"
    "Per codec: the KV of one sequence at the context, how many such sequences fit\n"
    "in the free HBM (and whether the batch does), and per link the time to restore\n"
    "one sequence's KV (bytes / (link GB/s x efficiency)) against the time to\n"
    "recompute it by prefill, and the time saved. Efficiency is measured / nominal\n"
    "for links given with --measured (e.g. the host-to-device rate `kvtier bench`\n"
    "reports), else 1. Prefill FLOP model: 2 x active params x T, plus per layer\n"
    "2 x causal pairs x query heads x (q.k dim + p.v dim), causal pairs T(T+1)/2\n"
    "(window-bounded on sliding-window layers); time = FLOPs / (F TFLOP/s x U).\n"
    "Defaults: batch 32, context 128K, codecs raw k16v8 int4, every non-HBM link,\n"
    "F = 989 (H100 SXM dense bf16), U = 0.5. Models as in 'kvtier project'.\n";

/* --- breakeven ------------------------------------------------------------ */

/* "SLOPE,INTERCEPT" */
static int parse_pair(const char *s, double *a, double *b) {
  char *end;
  *a = strtod(s, &end);
  if (end == s || *end != ',')
    return -1;
  const char *t = end + 1;
  *b = strtod(t, &end);
  return end == t || *end || !isfinite(*a) || !isfinite(*b) ? -1 : 0;
}


static void print_crossing(const char *base, const char *new_name, double base_a, double new_a,
                           double t, int json) {
  const char *side = new_a < base_a ? (t <= 0 ? "everywhere" : "above")
                                    : (t <= 0 ? "nowhere" : "below");
  if (json) {
    printf("{\"base\":\"%s\",\"new\":\"%s\",\"breakeven_tokens\":%.17g,\"new_faster\":\"%s\"}",
           base, new_name, t, side);
    return;
  }
  if (t <= 0)
    printf("break-even %s vs %s: none at a positive context; %s is faster %s\n", new_name,
           base, new_name, new_a < base_a ? "at every context" : "at no context");
  else
    printf("break-even %s vs %s: %.0f tokens; %s is faster %s it\n", new_name, base, t, new_name,
           side);
}

int proj_breakeven_main(int argc, char **argv) {
  const char *cmd = "project breakeven", *base = NULL, *next = NULL;
  int json = 0;
  const cli_opt opts[] = {{"--base", NULL, CLI_STR, &base, 0, 0},
                          {"--new", NULL, CLI_STR, &next, 0, 0},
                          {"--json", NULL, CLI_FLAG, &json, 0, 0}};
  size_t n_pos;
  int rc = cli_parse(cmd, argc, argv, opts, 3, NULL, 0, &n_pos);
  if (rc == CLI_HELP)
    return fputs(breakeven_help, stdout), CLI_OK;
  if (rc)
    return rc;
  double ba, bb, na, nb, t;
  if (!base || !next)
    return cli_usage_error(cmd, "--base and --new are both required");
  if (parse_pair(base, &ba, &bb) || parse_pair(next, &na, &nb))
    return cli_usage_error(cmd, "expected SLOPE,INTERCEPT (ms per token, ms)");
  if (curve_itl_breakeven(ba, bb, na, nb, &t) != 0)
    return cli_usage_error(cmd, "equal slopes: the lines never cross");
  print_crossing("base", "new", ba, na, t, json);
  if (json)
    printf("\n");
  return CLI_OK;
}

/* --- JSON Lines ----------------------------------------------------------- */

#define MAX_SERIES 8

typedef struct points {
  double *x, *y;
  size_t n, cap;
  char name[64];
} points;

typedef struct series_set {
  points s[MAX_SERIES];
  size_t n;
} series_set;

static int push(points *p, double x, double y) {
  if (p->n == p->cap) {
    const size_t cap = p->cap ? 2 * p->cap : 64;
    double *nx = realloc(p->x, cap * sizeof(double));
    if (nx)
      p->x = nx;
    double *ny = nx ? realloc(p->y, cap * sizeof(double)) : NULL;
    if (!nx || !ny)
      return -1;
    p->y = ny;
    p->cap = cap;
  }
  p->x[p->n] = x;
  p->y[p->n++] = y;
  return 0;
}

static void series_free(series_set *s) {
  for (size_t i = 0; i < MAX_SERIES; i++) {
    free(s->s[i].x);
    free(s->s[i].y);
  }
}

static int member_num(const kvt_json *o, const char *const *keys, double *out) {
  kvt_json v;
  for (const char *const *k = keys; *k; k++)
    if (kvt_json_member(o, *k, &v) == 0)
      return kvt_json_number(&v, out) == 0 ? 0 : -2;
  return -1;
}

/* One line's object into the series named by its series key. */
static int take_line(const char *path, size_t line, const kvt_json *o, const char *const *xk,
                     const char *const *yk, series_set *set) {
  double x, y;
  const int ex = member_num(o, xk, &x), ey = ex ? 0 : member_num(o, yk, &y);
  if (ex || ey) {
    cli_error("%s:%zu: needs numbers \"%s\" and \"%s\"", path, line, xk[0], yk[0]);
    return CLI_EPAYLOAD;
  }
  char name[64] = "";
  kvt_json v;
  static const char *const sk[] = {"series", "codec", "label"};
  for (size_t k = 0; k < 3 && !name[0]; k++)
    if (kvt_json_member(o, sk[k], &v) == 0 && kvt_json_string(&v, name, sizeof(name)) != 0 &&
        v.type != KVT_JSON_STRING)
      snprintf(name, sizeof(name), "%.*s", (int)(v.n < 63 ? v.n : 63), v.p);
  size_t i;
  for (i = 0; i < set->n && strcmp(set->s[i].name, name) != 0; i++)
    ;
  if (i == set->n) {
    if (set->n == MAX_SERIES) {
      cli_error("%s:%zu: more than %d series", path, line, MAX_SERIES);
      return CLI_EPAYLOAD;
    }
    snprintf(set->s[set->n++].name, sizeof(set->s[0].name), "%s", name);
  }
  if (push(&set->s[i], x, y)) {
    cli_error("out of memory");
    return CLI_EFAIL;
  }
  return 0;
}

static int read_jsonl(kvt_ctx *ctx, const char *path, const char *const *xk, const char *const *yk,
                      series_set *set) {
  void *buf;
  size_t len;
  int rc = cli_read_file(path, &buf, &len);
  if (rc)
    return rc;
  const char *s = buf, *end = s + len;
  for (size_t line = 1; s < end && rc == 0; line++) {
    const char *nl = memchr(s, '\n', (size_t)(end - s));
    const size_t n = nl ? (size_t)(nl - s) : (size_t)(end - s);
    size_t k = 0;
    while (k < n && (s[k] == ' ' || s[k] == '\t' || s[k] == '\r'))
      k++;
    if (k < n) {
      kvt_json o;
      const int err = kvt_json_parse(ctx, s, n, &o);
      if (err || o.type != KVT_JSON_OBJECT) {
        cli_error("%s:%zu: %s", path, line, err ? kvt_ctx_last_error(ctx) : "not a JSON object");
        rc = CLI_EPAYLOAD;
      } else {
        rc = take_line(path, line, &o, xk, yk, set);
      }
    }
    s += n + (nl ? 1 : 0);
  }
  free(buf);
  if (rc == 0 && set->n == 0) {
    cli_error("%s: no measurements", path);
    rc = CLI_EPAYLOAD;
  }
  return rc;
}

/* --- fit ------------------------------------------------------------------ */

static int one_file(const char *cmd, int argc, char **argv, int *json, const char **file,
                    const cli_opt *extra, size_t n_extra, const char *help, int file_optional) {
  cli_opt opts[8];
  opts[0] = (cli_opt){"--json", NULL, CLI_FLAG, json, 0, 0};
  for (size_t i = 0; i < n_extra; i++)
    opts[1 + i] = extra[i];
  size_t n_pos = 0;
  int rc = cli_parse(cmd, argc, argv, opts, 1 + n_extra, file, 1, &n_pos);
  if (rc == CLI_HELP) {
    fputs(help, stdout);
    return CLI_HELP;
  }
  if (rc)
    return rc;
  if (n_pos == 0 && !file_optional)
    return cli_usage_error(cmd, "name one FILE.jsonl");
  if (n_pos == 0)
    *file = NULL;
  return 0;
}

static void print_fits(const series_set *set, const curve_line_fit *f, int json) {
  if (json)
    printf("{\"fits\":[");
  else
    printf("%-16s %7s %16s %10s %8s\n", "series", "points", "alpha ms/token", "beta ms", "R^2");
  for (size_t i = 0; i < set->n; i++) {
    const char *name = set->s[i].name[0] ? set->s[i].name : "-";
    if (json) {
      printf("%s{\"series\":", i ? "," : "");
      cli_json_str(stdout, name);
      printf(",\"points\":%zu,\"alpha_ms_per_token\":%.17g,\"beta_ms\":%.17g,\"r2\":%.17g}",
             f[i].n, f[i].slope, f[i].intercept, f[i].r2);
    } else {
      printf("%-16s %7zu %16.4e %10.4f %8.4f\n", name, f[i].n, f[i].slope, f[i].intercept,
             f[i].r2);
    }
  }
  if (json)
    printf("],\"breakeven\":[");
  for (size_t i = 1; i < set->n; i++) {
    double t;
    if (curve_itl_breakeven(f[0].slope, f[0].intercept, f[i].slope, f[i].intercept, &t) != 0) {
      if (!json)
        printf("%s vs %s: equal slopes, no break-even\n", set->s[i].name, set->s[0].name);
      continue;
    }
    if (json && i > 1)
      printf(",");
    print_crossing(set->s[0].name, set->s[i].name, f[0].slope, f[i].slope, t, json);
  }
  if (json)
    printf("]}\n");
}

int proj_fit_main(int argc, char **argv) {
  const char *cmd = "project fit", *file = NULL;
  int json = 0;
  int rc = one_file(cmd, argc, argv, &json, &file, NULL, 0, fit_help, 0);
  if (rc)
    return rc == CLI_HELP ? CLI_OK : rc;
  kvt_ctx *ctx;
  if ((rc = cli_ctx_create(0, &ctx)) != 0)
    return rc;
  static const char *const xk[] = {"context", "T", "tokens", NULL};
  static const char *const yk[] = {"itl_ms", "itl", NULL};
  series_set set;
  memset(&set, 0, sizeof(set));
  curve_line_fit f[MAX_SERIES];
  rc = read_jsonl(ctx, file, xk, yk, &set);
  for (size_t i = 0; rc == 0 && i < set.n; i++) {
    char why[128];
    const int err = curve_fit_line(set.s[i].x, set.s[i].y, set.s[i].n, &f[i], why, sizeof(why));
    if (err) {
      cli_error("%s: series '%s': %s", file, set.s[i].name, why);
      rc = CLI_EPAYLOAD;
    }
  }
  if (rc == 0)
    print_fits(&set, f, json);
  series_free(&set);
  kvt_ctx_destroy(ctx);
  return rc;
}

/* --- saturation ----------------------------------------------------------- */

static void print_hill(const curve_hill_fit *h, double batch, int json) {
  const double s = batch > 0 ? curve_hill(h->smax, h->bhalf, h->gamma, batch) : NAN;
  if (json) {
    printf("{\"smax\":%.17g,\"bhalf\":%.17g,\"gamma\":%.17g,", h->smax, h->bhalf, h->gamma);
    printf(isnan(h->r2) ? "\"r2\":null," : "\"r2\":%.17g,", h->r2);
    printf("\"points\":%zu,\"batch80\":%.17g,\"batch95\":%.17g", h->n, h->batch80, h->batch95);
    if (batch > 0)
      printf(",\"batch\":%.17g,\"speedup\":%.17g", batch, s);
    printf("}\n");
    return;
  }
  printf("S(B) = %.4g B^%.4g / (%.4g^%.4g + B^%.4g)\n", h->smax, h->gamma, h->bhalf, h->gamma,
         h->gamma);
  printf("Smax %.4f  B1/2 %.4f  gamma %.4f", h->smax, h->bhalf, h->gamma);
  if (!isnan(h->r2))
    printf("  R^2 %.4f (%zu points)", h->r2, h->n);
  printf("\nbatch for 80%% of Smax: %.1f   for 95%%: %.1f\n", h->batch80, h->batch95);
  if (batch > 0)
    printf("S(%g) = %.4f (%.1f%% of Smax)\n", batch, s, 100 * s / h->smax);
}

int proj_saturation_main(int argc, char **argv) {
  const char *cmd = "project saturation", *file = NULL;
  int json = 0;
  double smax = 0, bhalf = 0, gamma = 0, batch = 0;
  const cli_opt extra[] = {{"--smax", NULL, CLI_DBL, &smax, 1e-12, 1e12},
                           {"--bhalf", NULL, CLI_DBL, &bhalf, 1e-12, 1e12},
                           {"--gamma", NULL, CLI_DBL, &gamma, 1e-6, 1e3},
                           {"--batch", NULL, CLI_DBL, &batch, 1e-12, 1e12}};
  int rc = one_file(cmd, argc, argv, &json, &file, extra, 4, saturation_help, 1);
  if (rc)
    return rc == CLI_HELP ? CLI_OK : rc;
  curve_hill_fit h;
  memset(&h, 0, sizeof(h));
  if (!file) {
    if (!smax || !bhalf || !gamma)
      return cli_usage_error(cmd, "give FILE.jsonl, or --smax, --bhalf and --gamma");
    h.smax = smax;
    h.bhalf = bhalf;
    h.gamma = gamma;
    h.r2 = NAN;
    h.batch80 = curve_hill_batch_at(bhalf, gamma, 0.80);
    h.batch95 = curve_hill_batch_at(bhalf, gamma, 0.95);
    print_hill(&h, batch, json);
    return CLI_OK;
  }
  if (smax || bhalf || gamma)
    return cli_usage_error(cmd, "a file is fitted: --smax, --bhalf and --gamma do not apply");
  kvt_ctx *ctx;
  if ((rc = cli_ctx_create(0, &ctx)) != 0)
    return rc;
  static const char *const xk[] = {"batch", "B", NULL};
  static const char *const yk[] = {"speedup", "S", NULL};
  series_set set;
  memset(&set, 0, sizeof(set));
  rc = read_jsonl(ctx, file, xk, yk, &set);
  if (rc == 0 && set.n != 1) {
    cli_error("%s: one series expected, found %zu", file, set.n);
    rc = CLI_EPAYLOAD;
  }
  char why[128];
  if (rc == 0 && curve_fit_hill(set.s[0].x, set.s[0].y, set.s[0].n, &h, why, sizeof(why)) != 0) {
    cli_error("%s: %s", file, why);
    rc = CLI_EPAYLOAD;
  }
  if (rc == 0)
    print_hill(&h, batch, json);
  series_free(&set);
  kvt_ctx_destroy(ctx);
  return rc;
}

/* --- advise --------------------------------------------------------------- */

typedef struct advise_args {
  proj_custom custom;
  double hbm_gib, tflops, mfu;
  uint32_t batch;
  const char *context_text;
  int json;
} advise_args;

/* Efficiency of each link: measured / nominal where --measured names it. */
static int efficiencies(const char *cmd, const proj_multi *measured, const proj_links *links,
                        double *eff) {
  for (size_t j = 0; j < links->n; j++)
    eff[j] = 1;
  for (size_t i = 0; i < measured->n; i++) {
    const char *v = measured->v[i], *eq = strchr(v, '=');
    char *end;
    const double g = eq ? strtod(eq + 1, &end) : 0;
    if (!eq || end == eq + 1 || *end || !(g > 0))
      return cli_usage_error(cmd, "--measured %s: expected LINK=GB/s", v);
    size_t j;
    for (j = 0; j < links->n; j++)
      if (strlen(links->l[j].name) == (size_t)(eq - v) &&
          strncmp(links->l[j].name, v, (size_t)(eq - v)) == 0)
        break;
    if (j == links->n)
      return cli_usage_error(cmd, "--measured %s: no such link in the list", v);
    eff[j] = g / links->l[j].GBps;
  }
  return 0;
}

static void advise_text(const kvt_model_arch *m, const proj_codecs *codecs,
                        const kvt_model_advice *adv, const proj_links *links, const double *eff,
                        const kvt_model_advice_config *c) {
  printf("%s: context %.0f, batch %.0f, %.1f GiB of HBM free; prefill %.3g TFLOP = %.2f s\n",
         m->name, c->context, c->batch, c->hbm_free_bytes / 1073741824.0,
         adv[0].prefill_flops / 1e12, adv[0].prefill_s);
  printf("%-14s %12s %10s %10s\n", "codec", "GB/sequence", "fit in HBM", "batch fits");
  for (size_t i = 0; i < codecs->n; i++)
    printf("%-14s %12.3f %10.0f %10s\n", codecs->name[i], adv[i].seq_bytes / 1e9,
           adv[i].sequences_fit, adv[i].batch_fits ? "yes" : "no");
  printf("\nrestore one sequence (s) and time saved over prefill (s):\n%29s", "");
  for (size_t i = 0; i < codecs->n; i++)
    printf(i + 1 < codecs->n ? " | %-17.17s" : " | %.17s", codecs->name[i]);
  printf("\n%-14s %8s %5s", "link", "GB/s", "eff");
  for (size_t i = 0; i < codecs->n; i++)
    printf(" | %8s %8s", "restore", "saved");
  printf("\n");
  for (size_t j = 0; j < links->n; j++) {
    printf("%-14s %8.0f %5.2f", links->l[j].name, links->l[j].GBps, eff[j]);
    for (size_t i = 0; i < codecs->n; i++) {
      const double t = kvt_model_restore_seconds(adv[i].seq_bytes, links->l[j].GBps * 1e9, eff[j]);
      printf(" | %8.3f %8.3f", t, adv[i].prefill_s - t);
    }
    printf("\n");
  }
}

static void advise_json(const kvt_model_arch *m, const proj_codecs *codecs,
                        const kvt_model_advice *adv, const proj_links *links, const double *eff) {
  printf("{\"model\":");
  cli_json_str(stdout, m->name);
  printf(",\"prefill_flops\":%.17g,\"prefill_s\":%.17g,\"codecs\":[", adv[0].prefill_flops,
         adv[0].prefill_s);
  for (size_t i = 0; i < codecs->n; i++) {
    printf("%s{\"codec\":", i ? "," : "");
    cli_json_str(stdout, codecs->name[i]);
    printf(",\"seq_bytes\":%.17g,\"sequences_fit\":%.17g,\"batch_fits\":%s,\"links\":[",
           adv[i].seq_bytes, adv[i].sequences_fit, adv[i].batch_fits ? "true" : "false");
    for (size_t j = 0; j < links->n; j++) {
      const double t = kvt_model_restore_seconds(adv[i].seq_bytes, links->l[j].GBps * 1e9, eff[j]);
      printf("%s{\"link\":", j ? "," : "");
      cli_json_str(stdout, links->l[j].name);
      printf(",\"GBps\":%.17g,\"efficiency\":%.17g,\"restore_s\":%.17g,\"saved_s\":%.17g}",
             links->l[j].GBps, eff[j], t, adv[i].prefill_s - t);
    }
    printf("]}");
  }
  printf("]}");
}

static int advise_parse(int *argc, char **argv, advise_args *a, proj_multi *mn, proj_multi *cn,
                        proj_multi *ln, proj_multi *meas) {
  const char *cmd = "project advise";
  int rc;
  if ((rc = proj_take_all(cmd, argc, argv, "--model", mn)) ||
      (rc = proj_take_all(cmd, argc, argv, "--codec", cn)) ||
      (rc = proj_take_all(cmd, argc, argv, "--link", ln)) ||
      (rc = proj_take_all(cmd, argc, argv, "--measured", meas)))
    return rc;
  a->batch = 32;
  a->context_text = "128K";
  a->hbm_gib = -1;
  const cli_opt opts[] = {
      {"--hbm-free", NULL, CLI_DBL, &a->hbm_gib, 0, 1e9},
      {"--batch", NULL, CLI_U32, &a->batch, 1, 1e9},
      {"--context", NULL, CLI_STR, &a->context_text, 0, 0},
      {"--tflops", NULL, CLI_DBL, &a->tflops, 1e-6, 1e9},
      {"--mfu", NULL, CLI_DBL, &a->mfu, 1e-6, 1},
      {"--weight-bits", NULL, CLI_U32, &a->custom.weight_bits, 1, 64},
      {"--json", NULL, CLI_FLAG, &a->json, 0, 0},
      PROJ_CUSTOM_OPTS(a->custom),
  };
  size_t n_pos;
  rc = cli_parse(cmd, *argc, argv, opts, sizeof(opts) / sizeof(opts[0]), NULL, 0, &n_pos);
  if (rc == CLI_HELP)
    fputs(advise_help, stdout);
  if (rc == 0 && a->hbm_gib < 0)
    rc = cli_usage_error(cmd, "--hbm-free GiB is required");
  return rc;
}

static int advise_run(kvt_ctx *ctx, const advise_args *a, const proj_models *models,
                      const proj_codecs *codecs, const proj_links *links, const double *eff,
                      const kvt_model_advice_config *c) {
  if (a->json)
    printf("{\"batch\":%.17g,\"context\":%.17g,\"hbm_free_bytes\":%.17g,\"models\":[", c->batch,
           c->context, c->hbm_free_bytes);
  for (size_t k = 0; k < models->n; k++) {
    kvt_model_advice adv[PROJ_MAX_CODECS];
    for (size_t i = 0; i < codecs->n; i++) {
      kvt_model_kv_rate r = KVT_MODEL_KV_RATE_INIT;
      int rc = kvt_model_kv_rate_get(ctx, &models->m[k], &codecs->spec[i], &r);
      if (rc == 0)
        rc = kvt_model_advise(ctx, &models->m[k], &r, c, &adv[i]);
      if (rc)
        return proj_fail("project advise", ctx, rc, models->m[k].name);
    }
    if (a->json) {
      printf("%s", k ? "," : "");
      advise_json(&models->m[k], codecs, adv, links, eff);
    } else {
      printf("%s", k ? "\n" : "");
      advise_text(&models->m[k], codecs, adv, links, eff, c);
    }
  }
  if (a->json)
    printf("]}\n");
  return 0;
}

int proj_advise_main(int argc, char **argv) {
  const char *cmd = "project advise";
  advise_args a;
  memset(&a, 0, sizeof(a));
  proj_multi mn = {{0}, 0}, cn = {{0}, 0}, ln = {{0}, 0}, meas = {{0}, 0};
  int rc = advise_parse(&argc, argv, &a, &mn, &cn, &ln, &meas);
  if (rc)
    return rc == CLI_HELP ? CLI_OK : rc;
  kvt_model_advice_config c = KVT_MODEL_ADVICE_CONFIG_INIT;
  c.hbm_free_bytes = a.hbm_gib * 1073741824.0;
  c.batch = a.batch;
  c.tflops = a.tflops;
  c.mfu = a.mfu;
  kvt_ctx *ctx;
  if ((rc = proj_context(cmd, a.context_text, &c.context)) != 0 ||
      (rc = cli_ctx_create(0, &ctx)) != 0)
    return rc;
  static proj_models models;
  proj_codecs codecs;
  proj_links links;
  double eff[PROJ_MAX_LINKS];
  if (!(rc = proj_resolve(cmd, ctx, &mn, &a.custom, &cn, &ln, 1, &models, &codecs, &links)) &&
      !(rc = proj_need_params(cmd, "the prefill FLOP model", &models)) &&
      !(rc = efficiencies(cmd, &meas, &links, eff)))
    rc = advise_run(ctx, &a, &models, &codecs, &links, eff, &c);
  kvt_ctx_destroy(ctx);
  return rc;
}
