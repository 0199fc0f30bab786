/* bench/cli_project_svg.c - `kvtier project --svg FILE`: one self-contained
 * SVG (no scripts, fonts or links) with two plots: the decode bandwidth each
 * model and codec needs against context (log-log) with a horizontal line per
 * link, and a heat map of the shortfall (needed / link) over models x links
 * at the projection's batch, context and step time. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli_project.h"

#define W 960
#define PLOT_H 470
#define ML 80   /* left margin */
#define MR 190  /* right margin: link labels */
#define MT 50
#define MB 60
#define T_MIN 1024.0
#define T_MAX 1048576.0

static const char *const palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd",
                                      "#ff7f0e", "#8c564b", "#e377c2", "#17becf"};
static const char *const dashes[] = {"", "8,4", "2,3", "10,3,2,3"};

typedef struct axes {
  double x0, y0, w, h;   /* plot area in pixels */
  double lx0, lx1, ly0, ly1; /* log10 ranges */
} axes;

static double px(const axes *a, double t) {
  return a->x0 + (log10(t) - a->lx0) / (a->lx1 - a->lx0) * a->w;
}
static double py(const axes *a, double v) {
  return a->y0 + a->h - (log10(v) - a->ly0) / (a->ly1 - a->ly0) * a->h;
}

/* Writes s with the XML special characters escaped. */
static void xml_text(FILE *f, const char *s) {
  for (; *s; s++) {
    switch (*s) {
    case '<':
      fputs("&lt;", f);
      break;
    case '>':
      fputs("&gt;", f);
      break;
    case '&':
      fputs("&amp;", f);
      break;
    case '"':
      fputs("&quot;", f);
      break;
    default:
      fputc((unsigned char)*s >= 0x20 ? *s : '?', f);
    }
  }
}

static void fmt_bw(char *buf, size_t cap, double gbps) {
  if (gbps >= 1000)
    snprintf(buf, cap, "%g TB/s", gbps / 1000);
  else
    snprintf(buf, cap, "%g GB/s", gbps);
}

static void draw_axes(FILE *f, const axes *a, const kvt_model_projection_config *cfg) {
  fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
             "stroke=\"#444\"/>\n", a->x0, a->y0, a->w, a->h);
  for (double t = T_MIN; t <= T_MAX; t *= 4) {
    const double x = px(a, t);
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", x,
            a->y0, x, a->y0 + a->h);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%.0fK</text>\n", x,
            a->y0 + a->h + 18, t / 1024);
  }
  for (int e = (int)ceil(a->ly0); e <= (int)floor(a->ly1); e++) {
    const double y = py(a, pow(10, e));
    char lab[32];
    fmt_bw(lab, sizeof(lab), pow(10, e));
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", a->x0,
            y, a->x0 + a->w, y);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", a->x0 - 6, y + 4,
            lab);
  }
  fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">context (tokens per "
             "sequence)</text>\n", a->x0 + a->w / 2, a->y0 + a->h + 40);
  fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"15\" font-weight=\"bold\">KV bandwidth "
             "decode needs: batch %.0f, step %g ms%s</text>\n", ML, MT - 22, cfg->batch,
          cfg->step_ms, cfg->spec_k > 1 ? ", speculative k>1" : "");
}

/* Needed GB/s of one rate at context t. */
static double need(const kvt_model_kv_rate *r, const kvt_model_projection_config *cfg, double t) {
  kvt_model_projection_config c = *cfg;
  kvt_model_projection p;
  c.context = t;
  return kvt_model_project(NULL, r, &c, &p) == 0 ? p.required_Bps / 1e9 : NAN;
}

/* Label heights of the link lines, pushed apart to 11 px so that links of
 * equal or close bandwidth stay readable. */
static void link_labels(const axes *a, const proj_links *links, double *y) {
  size_t order[PROJ_MAX_LINKS];
  for (size_t j = 0; j < links->n; j++) {
    y[j] = py(a, links->l[j].GBps);
    order[j] = j;
  }
  for (size_t i = 1; i < links->n; i++) /* insertion sort by height */
    for (size_t k = i; k > 0 && y[order[k]] < y[order[k - 1]]; k--) {
      const size_t t = order[k];
      order[k] = order[k - 1];
      order[k - 1] = t;
    }
  for (size_t i = 1; i < links->n; i++)
    if (y[order[i]] < y[order[i - 1]] + 11)
      y[order[i]] = y[order[i - 1]] + 11;
}

static void bandwidth_plot(FILE *f, const proj_models *models, const proj_result *res,
                           const proj_codecs *codecs, const proj_links *links,
                           const kvt_model_projection_config *cfg) {
  const size_t nm = models->n < 4 ? models->n : 4;
  double lo = INFINITY, hi = 0;
  for (size_t k = 0; k < nm; k++)
    for (size_t i = 0; i < codecs->n; i++) {
      const double a = need(&res[k].c[i].rate, cfg, T_MIN), b = need(&res[k].c[i].rate, cfg, T_MAX);
      lo = fmin(lo, fmin(a, b));
      hi = fmax(hi, fmax(a, b));
    }
  for (size_t j = 0; j < links->n; j++) {
    lo = fmin(lo, links->l[j].GBps);
    hi = fmax(hi, links->l[j].GBps);
  }
  axes a = {ML, MT, W - ML - MR, PLOT_H - MT - MB, log10(T_MIN), log10(T_MAX),
            floor(log10(lo)), ceil(log10(hi))};
  if (a.ly1 <= a.ly0)
    a.ly1 = a.ly0 + 1;
  draw_axes(f, &a, cfg);
  if (cfg->context >= T_MIN && cfg->context <= T_MAX) /* the projection's context */
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#000\" "
               "stroke-dasharray=\"1,3\"/><text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" "
               "text-anchor=\"middle\">T = %.0f</text>\n", px(&a, cfg->context), a.y0,
            px(&a, cfg->context), a.y0 + a.h, px(&a, cfg->context), a.y0 - 4, cfg->context);
  double label_y[PROJ_MAX_LINKS];
  link_labels(&a, links, label_y);
  for (size_t j = 0; j < links->n; j++) {
    const double y = py(&a, links->l[j].GBps);
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#888\" "
               "stroke-dasharray=\"4,3\"/>\n<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" "
               "fill=\"#555\">", a.x0, y, a.x0 + a.w, y, a.x0 + a.w + 4, label_y[j] + 3);
    xml_text(f, links->l[j].name);
    fprintf(f, " %g</text>\n", links->l[j].GBps);
  }
  for (size_t k = 0; k < nm; k++)
    for (size_t i = 0; i < codecs->n; i++) {
      fprintf(f, "<polyline fill=\"none\" stroke-width=\"2\" stroke=\"%s\" "
                 "stroke-dasharray=\"%s\" points=\"", palette[i % 8], dashes[k % 4]);
      for (int s = 0; s <= 80; s++) {
        const double t = T_MIN * pow(T_MAX / T_MIN, s / 80.0);
        fprintf(f, "%.1f,%.1f ", px(&a, t), py(&a, need(&res[k].c[i].rate, cfg, t)));
      }
      fputs("\"/>\n", f);
    }
  fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"230\" height=\"%.1f\" fill=\"#fff\" "
             "fill-opacity=\"0.85\" stroke=\"#ccc\"/>\n", a.x0 + 4, a.y0 + 4,
          15.0 * (double)(nm * codecs->n) + 6);
  size_t legend = 0;
  for (size_t k = 0; k < nm; k++)
    for (size_t i = 0; i < codecs->n; i++, legend++) {
      const double ly = a.y0 + 16 + 15.0 * (double)legend;
      fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
                 "stroke-width=\"2\" stroke=\"%s\" stroke-dasharray=\"%s\"/>",
              a.x0 + 8, ly - 4, a.x0 + 36, ly - 4, palette[i % 8], dashes[k % 4]);
      fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" fill=\"%s\">", a.x0 + 42, ly, palette[i % 8]);
      xml_text(f, models->m[k].name);
      fputs(" / ", f);
      xml_text(f, codecs->name[i]);
      fputs("</text>\n", f);
    }
}

/* Green where the link suffices, yellow to dark red from 1x to 1000x short. */
static void heat_color(char *buf, size_t cap, double s) {
  if (s < 1) {
    snprintf(buf, cap, "hsl(120,45%%,%.0f%%)", 75 - 30 * fmin(1, -log10(s) / 2));
    return;
  }
  const double t = fmin(1, log10(s) / 3);
  snprintf(buf, cap, "hsl(%.0f,85%%,%.0f%%)", 55 * (1 - t), 75 - 40 * t);
}

static void heatmap(FILE *f, double y0, const proj_models *rows, const proj_result *res,
                    const proj_links *links, const char *codec,
                    const kvt_model_projection_config *cfg) {
  const double cw = 56, rh = 22, x0 = 150;
  fprintf(f, "<text x=\"%d\" y=\"%.1f\" font-size=\"15\" font-weight=\"bold\">Shortfall "
             "(needed / link), codec ", ML, y0);
  xml_text(f, codec);
  fprintf(f, ", batch %.0f, context %.0f, step %g ms</text>\n", cfg->batch, cfg->context,
          cfg->step_ms);
  y0 += 14;
  for (size_t j = 0; j < links->n; j++) {
    const double x = x0 + cw * (double)j + cw / 2;
    fprintf(f, "<text font-size=\"10\" text-anchor=\"start\" transform=\"translate(%.1f,%.1f) "
               "rotate(-40)\">", x - 4, y0 + 64);
    xml_text(f, links->l[j].name);
    fputs("</text>\n", f);
  }
  y0 += 72;
  for (size_t k = 0; k < rows->n; k++) {
    const double y = y0 + rh * (double)k;
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">", x0 - 6, y + 15);
    xml_text(f, rows->m[k].name);
    fputs("</text>\n", f);
    for (size_t j = 0; j < links->n; j++) {
      const double s = kvt_model_shortfall(res[k].c[0].pr.required_Bps, links->l[j].GBps * 1e9);
      char col[48], lab[24];
      heat_color(col, sizeof(col), s);
      snprintf(lab, sizeof(lab), s >= 100 ? "%.0f" : s >= 10 ? "%.1f" : "%.2f", s);
      fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\" "
                 "stroke=\"#fff\"/><text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" "
                 "text-anchor=\"middle\" fill=\"%s\">%s</text>\n", x0 + cw * (double)j, y, cw,
              rh, col, x0 + cw * (double)j + cw / 2, y + 15, s >= 100 ? "#fff" : "#000", lab);
    }
  }
}

/* The heat map's rows: every preset, then the models given that are not. */
static int heat_rows(kvt_ctx *ctx, const proj_models *given, const proj_codecs *codecs,
                     const kvt_model_projection_config *cfg, proj_models *rows, proj_result *res) {
  rows->n = 0;
  while (rows->n < PROJ_MAX_MODELS && kvt_model_preset_at(rows->n, &rows->m[rows->n]) == 0)
    rows->n++;
  const size_t presets = rows->n;
  for (size_t k = 0; k < given->n && rows->n < PROJ_MAX_MODELS; k++) {
    size_t i;
    for (i = 0; i < presets && strcmp(rows->m[i].name, given->m[k].name) != 0; i++)
      ;
    if (i == presets) /* a config.json or --layers model */
      rows->m[rows->n++] = given->m[k];
  }
  proj_codecs first = *codecs;
  first.n = 1;
  for (size_t k = 0; k < rows->n; k++) {
    const int rc = proj_compute(ctx, &rows->m[k], &first, cfg, &res[k]);
    if (rc)
      return proj_fail("project", ctx, rc, rows->m[k].name);
  }
  return 0;
}

int proj_svg_write(kvt_ctx *ctx, const char *path, const proj_models *models,
                   const proj_codecs *codecs, const proj_links *links,
                   const kvt_model_projection_config *cfg) {
  static proj_result res[PROJ_MAX_MODELS], heat_res[PROJ_MAX_MODELS];
  static proj_models rows;
  int rc;
  for (size_t k = 0; k < models->n && k < 4; k++)
    if ((rc = proj_compute(ctx, &models->m[k], codecs, cfg, &res[k])) != 0)
      return proj_fail("project", ctx, rc, models->m[k].name);
  if ((rc = heat_rows(ctx, models, codecs, cfg, &rows, heat_res)) != 0)
    return rc;
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (!f) {
    cli_error("out of memory for the SVG");
    return CLI_EFAIL;
  }
  const double heat_h = 120 + 22.0 * (double)rows.n;
  const double width = fmax(W, 150 + 56.0 * (double)links->n + 80);
  fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/"
             "svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
             "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%%\" "
             "height=\"100%%\" fill=\"#fff\"/>\n", width, PLOT_H + heat_h + 20, width,
          PLOT_H + heat_h + 20);
  bandwidth_plot(f, models, res, codecs, links, cfg);
  heatmap(f, PLOT_H + 20, &rows, heat_res, links, codecs->name[0], cfg);
  fputs("</svg>\n", f);
  if (fclose(f) != 0) {
    free(buf);
    cli_error("out of memory for the SVG");
    return CLI_EFAIL;
  }
  rc = cli_write_output(path, buf, len);
  free(buf);
  return rc;
}
