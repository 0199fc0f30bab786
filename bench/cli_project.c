/* bench/cli_project.c - `kvtier project`: the bandwidth model
 * (kvtier/model.h) as tables, JSON and SVG plots: decode traffic and link
 * shortfall per model and codec, ITL break-even and fit, the saturation
 * curve, and placement advice. Every number comes from the library's
 * functions; this file only parses, loops and prints. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cli_project.h"
#include "cli_util.h"
#include "kvtier/model.h"
#include "model_json.h"

static const char project_help[] =
    "Usage: kvtier project [--model NAME|FILE.json]... [--codec SPEC]... [OPTIONS]\n"
    "       kvtier project breakeven|fit|saturation|advise ...   (each has --help)\n"
    "\n"
    "Projects decode KV traffic: bytes per token (from the codec itself, scales\n"
    "included), bytes per step = batch x KV of one sequence, the bandwidth needed\n"
    "to hold the step time, and per link the shortfall (needed / link) and the\n"
    "longest context the link can feed at that step time.\n"
    "\n"
    "Model (repeatable; 'all' for every preset):\n"
    "  --model NAME        preset: llama-3.1-8b llama-3.1-70b mistral-7b\n"
    "                      mistral-small-24b qwen2.5-0.5b qwen2.5-1.5b qwen2.5-7b\n"
    "                      qwen2.5-72b qwen3-8b phi-4 gemma3-12b deepseek-v3\n"
    "  --model FILE.json   a Hugging Face config.json\n"
    "  --layers L --kv-heads H --head-dim D [--v-head-dim D] [--window W\n"
    "    [--global-every N]] [--params N]  any other model ('custom'); windowed\n"
    "                      layers: all but every N-th (N = 0: all)\n"
    "Codec and load:\n"
    "  --codec SPEC        repeatable (default: raw, k16v8, int4); see kvtier --help\n"
    "  --batch B           sequences per step (default 32)\n"
    "  --context T         tokens per sequence, K = 1024 (default 128K)\n"
    "  --step-ms TAU       target inter-token latency in ms (default 10)\n"
    "  --spec-k K          tokens accepted per speculative verification (default 1)\n"
    "  --weights           add the weight bytes a step reads, the KV fraction of the\n"
    "                      step's bytes with each codec (KV f), and the Amdahl bound\n"
    "                      1/(1 - f(1 - r)) on decode speedup, f of raw KV and r =\n"
    "                      codec bytes / raw bytes\n"
    "  --weight-bits N     bits per weight (default: the model's, 16; DeepSeek 8)\n"
    "Links (default: every preset; repeatable):\n"
    "  --link NAME         a preset: hbm3-h100 hbm3e-h200 hbm3e-b200 nvlink4 nvlink5\n"
    "                      pcie4-x16 pcie5-x16 cxl2 rdma-400g rdma-200g nvme-gen4\n"
    "                      nvme-gen4-x4 nvme-gen5 nvme-gen5-x4\n"
    "  --link NAME=GB/s    any other link\n"
    "Output:\n"
    "  --json              machine-readable output\n"
    "  --svg FILE          write an SVG: needed bandwidth against context with the\n"
    "                      link lines (first 4 models), and a heat map of the\n"
    "                      shortfall of every preset and model given x links\n"
    "                      (first codec)\n"
    "  --list              list the model and link presets\n"
    "\n"
    "Units: GB = 1e9 bytes, TB/s = 1e12 bytes/s. Exit status: 0 ok, 1 bad input\n"
    "file, 2 usage, 3 I/O, 4 other.\n";

/* --- shared parsing -------------------------------------------------------- */

int proj_take_multi(int *argc, char **argv, const char *name, proj_multi *m) {
  const size_t len = strlen(name);
  int out = 1;
  for (int i = 1; i < *argc; i++) {
    const char *a = argv[i];
    if (strncmp(a, name, len) == 0 && (a[len] == '\0' || a[len] == '=')) {
      const char *v = a[len] == '=' ? a + len + 1 : (i + 1 < *argc ? argv[++i] : NULL);
      if (!v)
        return -1;
      if (m->n == PROJ_MAX_ITEMS)
        return -2;
      m->v[m->n++] = v;
      continue;
    }
    argv[out++] = argv[i];
  }
  *argc = out;
  return 0;
}

int proj_take_all(const char *cmd, int *argc, char **argv, const char *name, proj_multi *m) {
  const int rc = proj_take_multi(argc, argv, name, m);
  if (rc == -1)
    return cli_usage_error(cmd, "%s needs a value", name);
  if (rc == -2)
    return cli_usage_error(cmd, "%s given more than %d times", name, PROJ_MAX_ITEMS);
  return 0;
}

/* "131072", "128K" (x1024), "1M" (x1048576), "1e5". */
int proj_parse_tokens(const char *s, double *out) {
  char *end;
  double v = strtod(s, &end);
  if (end == s)
    return -1;
  if (*end == 'K' || *end == 'k')
    v *= 1024, end++;
  else if (*end == 'M' || *end == 'm')
    v *= 1048576, end++;
  if (*end || !isfinite(v) || v <= 0)
    return -1;
  *out = v;
  return 0;
}

/* "8.03e9", "8.03B", "671G", "70M": decimal suffixes K M B/G T. */
static int parse_count(const char *s, double *out) {
  char *end;
  double v = strtod(s, &end);
  if (end == s)
    return -1;
  static const char suf[] = "KMBGT";
  static const double mul[] = {1e3, 1e6, 1e9, 1e9, 1e12};
  const char *p = *end ? strchr(suf, *end) : NULL;
  if (p) {
    v *= mul[p - suf];
    end++;
  }
  if (*end || !isfinite(v) || v < 0)
    return -1;
  *out = v;
  return 0;
}

static int ends_with(const char *s, const char *suffix) {
  const size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcasecmp(s + n - m, suffix) == 0;
}

/* One --model value into set: a preset, "all", or a config.json file. */
static int add_model(const char *cmd, kvt_ctx *ctx, const char *v, proj_models *set) {
  if (strcasecmp(v, "all") == 0) {
    for (size_t i = 0; set->n < PROJ_MAX_MODELS && kvt_model_preset_at(i, &set->m[set->n]) == 0;
         i++)
      set->n++;
    return 0;
  }
  if (set->n == PROJ_MAX_MODELS)
    return cli_usage_error(cmd, "more than %d models", PROJ_MAX_MODELS);
  kvt_model_arch *m = &set->m[set->n];
  m->struct_size = sizeof(*m);
  if (kvt_model_preset(v, m) == 0) {
    set->n++;
    return 0;
  }
  if (!ends_with(v, ".json") && !strchr(v, '/'))
    return cli_usage_error(cmd, "unknown model '%s' (presets: 'kvtier project --list'; or a "
                                "config.json file)", v);
  void *buf;
  size_t len;
  int rc = cli_read_file(v, &buf, &len);
  if (rc)
    return rc;
  const char *base = strrchr(v, '/') ? strrchr(v, '/') + 1 : v;
  char name[KVT_ARCH_NAME_MAX];
  snprintf(name, sizeof(name), "%.*s", (int)(strlen(base) - (ends_with(base, ".json") ? 5 : 0)),
           base);
  const int err = kvt_model_from_hf_config(ctx, buf, len, strcmp(name, "config") ? name : NULL, m);
  free(buf);
  if (err) {
    cli_error("%s: %s: %s", v, kvt_err_name(err), kvt_ctx_last_error(ctx));
    return CLI_EPAYLOAD;
  }
  set->n++;
  return 0;
}

int proj_models_resolve(const char *cmd, kvt_ctx *ctx, const proj_multi *names,
                        const proj_custom *c, proj_models *set) {
  set->n = 0;
  for (size_t i = 0; i < names->n; i++) {
    int rc = add_model(cmd, ctx, names->v[i], set);
    if (rc)
      return rc;
  }
  if (c->layers || c->kv_heads || c->head_dim) {
    if (!c->layers || !c->kv_heads || !c->head_dim)
      return cli_usage_error(cmd, "--layers, --kv-heads and --head-dim go together");
    if (set->n == PROJ_MAX_MODELS)
      return cli_usage_error(cmd, "more than %d models", PROJ_MAX_MODELS);
    kvt_model_arch m = KVT_MODEL_ARCH_INIT;
    snprintf(m.name, sizeof(m.name), "custom");
    m.layers = c->layers;
    m.kv_heads = c->kv_heads;
    m.k_dim = c->head_dim;
    m.v_dim = c->v_head_dim;
    m.window = c->window;
    if (c->global_every && !c->window)
      return cli_usage_error(cmd, "--global-every needs --window");
    for (uint32_t l = 0; c->window && l < m.layers && l < KVT_ARCH_MAX_LAYERS; l++)
      if (!c->global_every || (l + 1) % c->global_every != 0)
        m.window_layers[l / 64] |= 1ull << (l % 64);
    const int err = kvt_model_validate(ctx, &m);
    if (err)
      return cli_usage_error(cmd, "%s", kvt_ctx_last_error(ctx));
    set->m[set->n++] = m;
  }
  if (c->params_text) {
    double p;
    if (parse_count(c->params_text, &p))
      return cli_usage_error(cmd, "--params %s: expected a count such as 8.03e9 or 8.03B",
                             c->params_text);
    for (size_t i = 0; i < set->n; i++) {
      set->m[i].params = p;
      set->m[i].active_params = 0;
    }
  }
  for (size_t i = 0; c->weight_bits && i < set->n; i++)
    set->m[i].weight_bits = c->weight_bits;
  return 0;
}

int proj_codecs_resolve(const char *cmd, kvt_ctx *ctx, const proj_multi *given,
                        proj_codecs *out) {
  static const char *const dflt[] = {"raw", "k16v8", "int4"};
  const size_t n = given->n ? given->n : 3;
  out->n = 0;
  if (n > PROJ_MAX_CODECS)
    return cli_usage_error(cmd, "more than %d codecs", PROJ_MAX_CODECS);
  for (size_t i = 0; i < n; i++) {
    const char *t = given->n ? given->v[i] : dflt[i];
    if (kvt_codec_parse(ctx, t, &out->spec[i]) != 0)
      return cli_usage_error(cmd, "--codec %s: %s", t, kvt_ctx_last_error(ctx));
    out->name[i] = t;
    out->n++;
  }
  return 0;
}

int proj_links_resolve(const char *cmd, const proj_multi *given, int skip_hbm, proj_links *out) {
  out->n = 0;
  if (!given->n) {
    for (size_t i = 0; kvt_model_link_preset(i) && out->n < PROJ_MAX_LINKS; i++) {
      const kvt_model_link *l = kvt_model_link_preset(i);
      if (!skip_hbm || strncmp(l->name, "hbm", 3) != 0)
        out->l[out->n++] = *l;
    }
    return 0;
  }
  for (size_t i = 0; i < given->n; i++) {
    const char *v = given->v[i], *eq = strchr(v, '=');
    kvt_model_link *l = &out->l[out->n];
    if (!eq) {
      const kvt_model_link *p = kvt_model_link_find(v);
      if (!p)
        return cli_usage_error(cmd, "--link %s: not a preset ('kvtier project --list'); "
                                    "write NAME=GB/s for another link", v);
      *l = *p;
    } else {
      char *end;
      const double g = strtod(eq + 1, &end);
      const size_t nlen = (size_t)(eq - v);
      if (end == eq + 1 || *end || !(g > 0) || !isfinite(g) || nlen == 0 ||
          nlen >= sizeof(out->names[0]))
        return cli_usage_error(cmd, "--link %s: expected NAME=GB/s with GB/s > 0", v);
      memcpy(out->names[out->n], v, nlen);
      out->names[out->n][nlen] = '\0';
      l->name = out->names[out->n];
      l->what = "given on the command line";
      l->GBps = g;
    }
    out->n++;
  }
  return 0;
}

/* Reports a library failure on the inputs as a usage error. */
int proj_fail(const char *cmd, kvt_ctx *ctx, int err, const char *what) {
  return cli_usage_error(cmd, "%s: %s: %s", what, kvt_err_name(err), kvt_ctx_last_error(ctx));
}

int proj_resolve(const char *cmd, kvt_ctx *ctx, const proj_multi *models, const proj_custom *c,
                 const proj_multi *codecs, const proj_multi *links, int skip_hbm,
                 proj_models *m_out, proj_codecs *c_out, proj_links *l_out) {
  int rc;
  if ((rc = proj_models_resolve(cmd, ctx, models, c, m_out)) != 0 ||
      (rc = proj_codecs_resolve(cmd, ctx, codecs, c_out)) != 0 ||
      (rc = proj_links_resolve(cmd, links, skip_hbm, l_out)) != 0)
    return rc;
  if (m_out->n == 0)
    return cli_usage_error(cmd, "name a model: --model NAME|FILE.json|all, or --layers "
                                "--kv-heads --head-dim");
  return 0;
}

int proj_need_params(const char *cmd, const char *why, const proj_models *models) {
  for (size_t k = 0; k < models->n; k++)
    if (!(models->m[k].params > 0))
      return cli_usage_error(cmd, "%s needs the parameter count of '%s': give --params N", why,
                             models->m[k].name);
  return 0;
}

int proj_context(const char *cmd, const char *text, double *out) {
  if (proj_parse_tokens(text, out))
    return cli_usage_error(cmd, "--context %s: expected tokens such as 131072 or 128K", text);
  return 0;
}

/* --- kvtier project -------------------------------------------------------- */

typedef struct proj_args {
  proj_custom custom;
  uint32_t batch;
  const char *context_text;
  double step_ms, spec_k;
  int weights, json, list;
  const char *svg;
} proj_args;

static void print_list(void) {
  kvt_model_arch m = KVT_MODEL_ARCH_INIT;
  printf("%-18s %6s %8s %8s %7s %8s %9s\n", "model", "layers", "KV heads", "head dim", "window",
         "params", "max ctx");
  for (size_t i = 0; kvt_model_preset_at(i, &m) == 0; i++) {
    char dims[24];
    snprintf(dims, sizeof(dims), m.v_dim && m.v_dim != m.k_dim ? "%u+%u" : "%u", m.k_dim,
             m.v_dim);
    printf("%-18s %6u %8u %8s %7u %7.1fB %9u%s\n", m.name, m.layers, m.kv_heads, dims, m.window,
           m.params / 1e9, m.max_context, m.mla ? "  (MLA: RoPE key + latent)" : "");
  }
  printf("\n%-14s %8s  %s\n", "link", "GB/s", "what");
  for (size_t i = 0; kvt_model_link_preset(i); i++)
    printf("%-14s %8.0f  %s\n", kvt_model_link_preset(i)->name, kvt_model_link_preset(i)->GBps,
           kvt_model_link_preset(i)->what);
}

/* Everything `project` prints for one model. */
int proj_compute(kvt_ctx *ctx, const kvt_model_arch *m, const proj_codecs *codecs,
                 const kvt_model_projection_config *cfg, proj_result *out) {
  kvt_codec_spec raw;
  kvt_model_kv_rate raw_rate = KVT_MODEL_KV_RATE_INIT;
  int rc = kvt_codec_parse(ctx, "raw", &raw);
  if (rc || (rc = kvt_model_kv_rate_get(ctx, m, &raw, &raw_rate)) != 0)
    return rc;
  const double raw_seq = kvt_model_seq_bytes(&raw_rate, cfg->context);
  out->weight_bytes = kvt_model_weight_bytes(m);
  for (size_t i = 0; i < codecs->n; i++) {
    proj_codec_result *c = &out->c[i];
    c->rate.struct_size = sizeof(c->rate);
    if ((rc = kvt_model_kv_rate_get(ctx, m, &codecs->spec[i], &c->rate)) != 0 ||
        (rc = kvt_model_project(ctx, &c->rate, cfg, &c->pr)) != 0)
      return rc;
    c->r = c->pr.seq_bytes / raw_seq;
    c->f = c->pr.step_bytes / (c->pr.step_bytes + out->weight_bytes);
    /* f of the uncompressed step: the Amdahl bound is against raw KV */
    const double f_raw = cfg->batch * raw_seq / (cfg->batch * raw_seq + out->weight_bytes);
    c->bound = kvt_model_amdahl_bound(f_raw, c->r);
  }
  return 0;
}

static void fmt_tokens(char *buf, size_t cap, double t) {
  if (isinf(t))
    snprintf(buf, cap, "any");
  else if (t < 1e10)
    snprintf(buf, cap, "%.0f", t);
  else
    snprintf(buf, cap, "%.2e", t);
}

static void fmt_short(char *buf, size_t cap, double s) {
  snprintf(buf, cap, s >= 100 ? "%.0fx" : s >= 10 ? "%.1fx" : "%.2fx", s);
}

static void print_model_text(const kvt_model_arch *m, const proj_codecs *codecs,
                             const proj_result *res, const proj_links *links,
                             const kvt_model_projection_config *cfg, int weights) {
  printf("%s: %u layers, %u KV head%s, head dim %u", m->name, m->layers, m->kv_heads,
         m->kv_heads == 1 ? "" : "s", m->k_dim);
  if (m->v_dim && m->v_dim != m->k_dim)
    printf("+%u%s", m->v_dim, m->mla ? " (MLA latent)" : "");
  if (m->window)
    printf(", window %u", m->window);
  printf("; batch %.0f, context %.0f, step %g ms%s", cfg->batch, cfg->context, cfg->step_ms,
         cfg->spec_k > 1 ? "" : "\n");
  if (cfg->spec_k > 1)
    printf(", spec-k %g\n", cfg->spec_k);
  if (m->max_context && cfg->context > m->max_context)
    printf("  (note: context beyond the model's %u tokens)\n", m->max_context);
  printf("%-14s %7s %11s %10s %11s %6s", "codec", "B/elem", "B/token", "GB/step", "need TB/s",
         "r");
  if (weights)
    printf(" %10s %6s %8s", "weights GB", "KV f", "Amdahl");
  printf("\n");
  for (size_t i = 0; i < codecs->n; i++) {
    const proj_codec_result *c = &res->c[i];
    printf("%-14s %7.3f %11.0f %10.2f %11.2f %6.3f", codecs->name[i],
           kvt_model_bytes_per_element(&c->rate), c->pr.bytes_per_token, c->pr.step_bytes / 1e9,
           c->pr.required_Bps / 1e12, c->r);
    if (weights)
      printf(" %10.2f %6.3f %7.2fx", res->weight_bytes / 1e9, c->f, c->bound);
    printf("\n");
  }
  printf("\n%22s", "");
  for (size_t i = 0; i < codecs->n; i++)
    printf(i + 1 < codecs->n ? " | %-18.18s" : " | %.18s", codecs->name[i]);
  printf("\n%-14s %7s", "link", "GB/s");
  for (size_t i = 0; i < codecs->n; i++)
    printf(" | %7s %10s", "short", "max ctx");
  printf("\n");
  for (size_t j = 0; j < links->n; j++) {
    printf("%-14s %7.0f", links->l[j].name, links->l[j].GBps);
    for (size_t i = 0; i < codecs->n; i++) {
      char s[24], t[24];
      fmt_short(s, sizeof(s),
                kvt_model_shortfall(res->c[i].pr.required_Bps, links->l[j].GBps * 1e9));
      fmt_tokens(t, sizeof(t), res->c[i].max_ctx[j]);
      printf(" | %7s %10s", s, t);
    }
    printf("\n");
  }
}

static void json_num(const char *key, double v, int comma) {
  printf("\"%s\":", key);
  if (isfinite(v))
    printf("%.17g", v);
  else
    printf("null");
  if (comma)
    printf(",");
}

static void print_model_json(const kvt_model_arch *m, const proj_codecs *codecs,
                             const proj_result *res, const proj_links *links, int weights) {
  printf("{\"name\":");
  cli_json_str(stdout, m->name);
  printf(",\"layers\":%u,\"kv_heads\":%u,\"k_dim\":%u,\"v_dim\":%u,\"window\":%u,\"mla\":%s,",
         m->layers, m->kv_heads, m->k_dim, m->v_dim ? m->v_dim : m->k_dim, m->window,
         m->mla ? "true" : "false");
  json_num("params", m->params, 1);
  if (weights)
    json_num("weight_bytes", res->weight_bytes, 1);
  printf("\"codecs\":[");
  for (size_t i = 0; i < codecs->n; i++) {
    const proj_codec_result *c = &res->c[i];
    printf("%s{\"codec\":", i ? "," : "");
    cli_json_str(stdout, codecs->name[i]);
    printf(",");
    json_num("bytes_per_element", kvt_model_bytes_per_element(&c->rate), 1);
    json_num("full_bytes_per_token", c->rate.full_bytes, 1);
    json_num("window_bytes_per_token", c->rate.window_bytes, 1);
    json_num("bytes_per_token", c->pr.bytes_per_token, 1);
    json_num("seq_bytes", c->pr.seq_bytes, 1);
    json_num("step_bytes", c->pr.step_bytes, 1);
    json_num("required_GBps", c->pr.required_Bps / 1e9, 1);
    json_num("ratio_vs_raw", c->r, 1);
    if (weights) {
      json_num("kv_fraction", c->f, 1);
      json_num("amdahl_bound", c->bound, 1);
    }
    printf("\"links\":[");
    for (size_t j = 0; j < links->n; j++) {
      printf("%s{\"link\":", j ? "," : "");
      cli_json_str(stdout, links->l[j].name);
      printf(",");
      json_num("GBps", links->l[j].GBps, 1);
      json_num("shortfall", kvt_model_shortfall(c->pr.required_Bps, links->l[j].GBps * 1e9), 1);
      json_num("max_context", c->max_ctx[j], 0);
      printf("}");
    }
    printf("]}");
  }
  printf("]}");
}

static int project_parse(int *argc, char **argv, proj_args *a, proj_multi *models,
                         proj_multi *codecs, proj_multi *links) {
  const char *cmd = "project";
  int rc;
  if ((rc = proj_take_all(cmd, argc, argv, "--model", models)) ||
      (rc = proj_take_all(cmd, argc, argv, "--codec", codecs)) ||
      (rc = proj_take_all(cmd, argc, argv, "--link", links)))
    return rc;
  a->batch = 32;
  a->context_text = "128K";
  a->step_ms = 10;
  a->spec_k = 1;
  const cli_opt opts[] = {
      {"--batch", NULL, CLI_U32, &a->batch, 1, 1e9},
      {"--context", NULL, CLI_STR, &a->context_text, 0, 0},
      {"--step-ms", NULL, CLI_DBL, &a->step_ms, 1e-6, 1e9},
      {"--spec-k", NULL, CLI_DBL, &a->spec_k, 1, 1e6},
      {"--weights", NULL, CLI_FLAG, &a->weights, 0, 0},
      {"--weight-bits", NULL, CLI_U32, &a->custom.weight_bits, 1, 64},
      {"--json", NULL, CLI_FLAG, &a->json, 0, 0},
      {"--svg", NULL, CLI_STR, &a->svg, 0, 0},
      {"--list", NULL, CLI_FLAG, &a->list, 0, 0},
      PROJ_CUSTOM_OPTS(a->custom),
  };
  size_t n_pos;
  return cli_parse(cmd, *argc, argv, opts, sizeof(opts) / sizeof(opts[0]), NULL, 0, &n_pos);
}

/* The whole projection: models x codecs x links. */
static int project_run(kvt_ctx *ctx, const proj_args *a, const proj_models *models,
                       const proj_codecs *codecs, const proj_links *links,
                       const kvt_model_projection_config *cfg) {
  static proj_result res[PROJ_MAX_MODELS]; /* large: not on the stack */
  for (size_t k = 0; k < models->n; k++) {
    int rc = proj_compute(ctx, &models->m[k], codecs, cfg, &res[k]);
    if (rc)
      return proj_fail("project", ctx, rc, models->m[k].name);
    for (size_t i = 0; i < codecs->n; i++)
      for (size_t j = 0; j < links->n; j++)
        kvt_model_max_context(ctx, &res[k].c[i].rate, cfg, links->l[j].GBps * 1e9,
                              &res[k].c[i].max_ctx[j]);
  }
  if (a->json) {
    printf("{\"batch\":%.17g,\"context\":%.17g,\"step_ms\":%.17g,\"spec_k\":%.17g,\"models\":[",
           cfg->batch, cfg->context, cfg->step_ms, cfg->spec_k);
    for (size_t k = 0; k < models->n; k++) {
      printf("%s", k ? "," : "");
      print_model_json(&models->m[k], codecs, &res[k], links, a->weights);
    }
    printf("]}\n");
  } else {
    for (size_t k = 0; k < models->n; k++) {
      printf("%s", k ? "\n" : "");
      print_model_text(&models->m[k], codecs, &res[k], links, cfg, a->weights);
    }
  }
  if (a->svg) {
    int rc = proj_svg_write(ctx, a->svg, models, codecs, links, cfg);
    if (rc)
      return rc;
    if (!a->json)
      printf("\nwrote %s\n", a->svg);
  }
  return 0;
}

static int sub_dispatch(int argc, char **argv, int *handled) {
  static const struct {
    const char *name;
    int (*fn)(int, char **);
  } subs[] = {{"breakeven", proj_breakeven_main},
              {"fit", proj_fit_main},
              {"saturation", proj_saturation_main},
              {"advise", proj_advise_main}};
  *handled = 0;
  if (argc < 2)
    return 0;
  for (size_t i = 0; i < sizeof(subs) / sizeof(subs[0]); i++)
    if (strcmp(argv[1], subs[i].name) == 0) {
      *handled = 1;
      return subs[i].fn(argc - 1, argv + 1);
    }
  return 0;
}

int cli_project_main(int argc, char **argv) {
  int handled;
  int rc = sub_dispatch(argc, argv, &handled);
  if (handled)
    return rc;
  proj_args a;
  memset(&a, 0, sizeof(a));
  proj_multi mnames = {{0}, 0}, cnames = {{0}, 0}, lnames = {{0}, 0};
  rc = project_parse(&argc, argv, &a, &mnames, &cnames, &lnames);
  if (rc == CLI_HELP) {
    fputs(project_help, stdout);
    return CLI_OK;
  }
  if (rc)
    return rc;
  if (a.list) {
    print_list();
    return CLI_OK;
  }
  kvt_model_projection_config cfg = KVT_MODEL_PROJECTION_CONFIG_INIT;
  cfg.batch = a.batch;
  cfg.step_ms = a.step_ms;
  cfg.spec_k = a.spec_k;
  kvt_ctx *ctx;
  if ((rc = proj_context("project", a.context_text, &cfg.context)) != 0 ||
      (rc = cli_ctx_create(0, &ctx)) != 0)
    return rc;
  static proj_models models;
  proj_codecs codecs;
  proj_links links;
  if (!(rc = proj_resolve("project", ctx, &mnames, &a.custom, &cnames, &lnames, 0, &models,
                          &codecs, &links)) &&
      !(rc = a.weights ? proj_need_params("project", "--weights", &models) : 0))
    rc = project_run(ctx, &a, &models, &codecs, &links, &cfg);
  kvt_ctx_destroy(ctx);
  return rc;
}
