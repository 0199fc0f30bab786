/* bench/cli_project.h - what the files of `kvtier project` share:
 * repeated options, model / codec / link lists, per-model results, and the
 * subcommands (breakeven, fit, saturation, advise in cli_project_fit.c; the
 * SVG in cli_project_svg.c). */
#ifndef KVT_CLI_PROJECT_H
#define KVT_CLI_PROJECT_H

#include <stddef.h>
#include <stdint.h>

#include "cli_util.h"
#include "kvtier/model.h"

#define PROJ_MAX_ITEMS 32  /* values of one repeated option */
#define PROJ_MAX_MODELS 48
#define PROJ_MAX_CODECS 8
#define PROJ_MAX_LINKS PROJ_MAX_ITEMS

typedef struct proj_multi {
  const char *v[PROJ_MAX_ITEMS];
  size_t n;
} proj_multi;

/* A model from the command line, and overrides for every model. */
typedef struct proj_custom {
  uint32_t layers, kv_heads, head_dim, v_head_dim, window, global_every, weight_bits;
  const char *params_text;
} proj_custom;

#define PROJ_CUSTOM_OPTS(c)                                                      \
  {"--layers", NULL, CLI_U32, &(c).layers, 1, KVT_ARCH_MAX_LAYERS},              \
      {"--kv-heads", NULL, CLI_U32, &(c).kv_heads, 1, 1024},                     \
      {"--head-dim", NULL, CLI_U32, &(c).head_dim, 1, 1024},                     \
      {"--v-head-dim", NULL, CLI_U32, &(c).v_head_dim, 1, 1024},                 \
      {"--window", NULL, CLI_U32, &(c).window, 1, 4294967295.0},                 \
      {"--global-every", NULL, CLI_U32, &(c).global_every, 1, KVT_ARCH_MAX_LAYERS}, \
  {                                                                              \
    "--params", NULL, CLI_STR, &(c).params_text, 0, 0                            \
  }

typedef struct proj_models {
  kvt_model_arch m[PROJ_MAX_MODELS];
  size_t n;
} proj_models;

typedef struct proj_codecs {
  kvt_codec_spec spec[PROJ_MAX_CODECS];
  const char *name[PROJ_MAX_CODECS];
  size_t n;
} proj_codecs;

typedef struct proj_links {
  kvt_model_link l[PROJ_MAX_LINKS];
  char names[PROJ_MAX_LINKS][32]; /* of links given as NAME=GB/s */
  size_t n;
} proj_links;

typedef struct proj_codec_result {
  kvt_model_kv_rate rate;
  kvt_model_projection pr;
  double r;     /* KV bytes vs raw at the context */
  double f;     /* KV fraction of the step's bytes, this codec */
  double bound; /* Amdahl bound vs raw KV */
  double max_ctx[PROJ_MAX_LINKS];
} proj_codec_result;

typedef struct proj_result {
  double weight_bytes;
  proj_codec_result c[PROJ_MAX_CODECS];
} proj_result;

/* Moves every "NAME V" / "NAME=V" out of argv into m. 0, -1 (no value) or
 * -2 (too many). */
int proj_take_multi(int *argc, char **argv, const char *name, proj_multi *m);
/* The same, reporting a usage error: 0 or CLI_EUSAGE. */
int proj_take_all(const char *cmd, int *argc, char **argv, const char *name, proj_multi *m);
/* Tokens: "131072", "128K" (x1024), "1M" (x2^20). 0 or -1. */
int proj_parse_tokens(const char *s, double *out);

int proj_models_resolve(const char *cmd, kvt_ctx *ctx, const proj_multi *names,
                        const proj_custom *c, proj_models *set);
int proj_codecs_resolve(const char *cmd, kvt_ctx *ctx, const proj_multi *given,
                        proj_codecs *out);
/* skip_hbm: leave HBM presets out of the default list (advise). */
int proj_links_resolve(const char *cmd, const proj_multi *given, int skip_hbm, proj_links *out);
int proj_fail(const char *cmd, kvt_ctx *ctx, int err, const char *what);

/* All three lists of a command line; at least one model. 0 or an exit code. */
int proj_resolve(const char *cmd, kvt_ctx *ctx, const proj_multi *models, const proj_custom *c,
                 const proj_multi *codecs, const proj_multi *links, int skip_hbm,
                 proj_models *m_out, proj_codecs *c_out, proj_links *l_out);
/* CLI_EUSAGE naming the first model without a parameter count, else 0. */
int proj_need_params(const char *cmd, const char *why, const proj_models *models);
/* --context text into *out; 0 or CLI_EUSAGE. */
int proj_context(const char *cmd, const char *text, double *out);

/* Rates, projections and Amdahl bounds of one model for every codec (not
 * max_ctx). Returns 0 or a library error with detail in ctx. */
int proj_compute(kvt_ctx *ctx, const kvt_model_arch *m, const proj_codecs *codecs,
                 const kvt_model_projection_config *cfg, proj_result *out);

/* Writes the plots to path atomically. 0 or an exit code. */
int proj_svg_write(kvt_ctx *ctx, const char *path, const proj_models *models,
                   const proj_codecs *codecs, const proj_links *links,
                   const kvt_model_projection_config *cfg);

int proj_breakeven_main(int argc, char **argv);
int proj_fit_main(int argc, char **argv);
int proj_saturation_main(int argc, char **argv);
int proj_advise_main(int argc, char **argv);

int cli_project_main(int argc, char **argv);

#endif
