/* bench/curve_fit.c - least-squares ITL lines, their break-even, and the
 * saturation (Hill) curve and its fit, for `kvtier project fit`. */
#include "curve_fit.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>

#include "kvtier/error.h"

/* Writes the reason for a failure into why (may be NULL) and returns err. */
__attribute__((format(printf, 4, 5))) static int fail(char *why, size_t cap, int err,
                                                      const char *fmt, ...) {
  if (why && cap) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, cap, fmt, ap);
    va_end(ap);
  }
  return err;
}

int curve_itl_breakeven(double base_slope, double base_intercept, double new_slope,
                        double new_intercept, double *tokens) {
  if (!tokens)
    return -EINVAL;
  if (base_slope == new_slope)
    return KVT_ERANGE;
  *tokens = (new_intercept - base_intercept) / (base_slope - new_slope);
  return isfinite(*tokens) ? 0 : KVT_ERANGE;
}

int curve_fit_line(const double *x, const double *y, size_t n, curve_line_fit *out, char *why,
                   size_t cap) {
  if (!x || !y || !out || n < 2)
    return fail(why, cap, -EINVAL, "a line fit needs at least 2 points");
  double mx = 0, my = 0;
  for (size_t i = 0; i < n; i++) {
    if (!isfinite(x[i]) || !isfinite(y[i]))
      return fail(why, cap, -EINVAL, "point %zu is not finite", i);
    mx += x[i];
    my += y[i];
  }
  mx /= (double)n;
  my /= (double)n;
  double sxx = 0, sxy = 0, syy = 0;
  for (size_t i = 0; i < n; i++) {
    sxx += (x[i] - mx) * (x[i] - mx);
    sxy += (x[i] - mx) * (y[i] - my);
    syy += (y[i] - my) * (y[i] - my);
  }
  if (sxx == 0)
    return fail(why, cap, KVT_ERANGE, "every point has the same x: no slope");
  out->slope = sxy / sxx;
  out->intercept = my - out->slope * mx;
  double ss_res = 0;
  for (size_t i = 0; i < n; i++) {
    const double e = y[i] - (out->slope * x[i] + out->intercept);
    ss_res += e * e;
  }
  out->r2 = syy > 0 ? 1 - ss_res / syy : 1;
  out->n = n;
  return 0;
}

double curve_hill(double smax, double bhalf, double gamma, double batch) {
  if (batch <= 0)
    return 0;
  const double bg = pow(batch, gamma);
  return smax * bg / (pow(bhalf, gamma) + bg);
}

double curve_hill_batch_at(double bhalf, double gamma, double fraction) {
  if (!(fraction > 0 && fraction < 1 && bhalf > 0 && gamma > 0))
    return NAN;
  return bhalf * pow(fraction / (1 - fraction), 1 / gamma);
}

/* Squared error of the best smax for (bhalf, gamma): S is linear in smax,
 * so smax = sum(y h) / sum(h h) with h the curve at smax = 1. */
static double hill_sse(const double *b, const double *y, size_t n, double bhalf, double gamma,
                       double *smax) {
  double hy = 0, hh = 0;
  for (size_t i = 0; i < n; i++) {
    const double h = curve_hill(1, bhalf, gamma, b[i]);
    hy += h * y[i];
    hh += h * h;
  }
  *smax = hh > 0 ? hy / hh : 0;
  double sse = 0;
  for (size_t i = 0; i < n; i++) {
    const double e = y[i] - *smax * curve_hill(1, bhalf, gamma, b[i]);
    sse += e * e;
  }
  return sse;
}

/* Minimises over (log bhalf, log gamma): a coarse grid over a wide range,
 * then a compass search that halves its step until it is negligible. */
static void hill_search(const double *b, const double *y, size_t n, double bmin, double bmax,
                        double *lb_out, double *lg_out) {
  double best = INFINITY, lb = 0, lg = 0, smax;
  const double lo = log(bmin) - log(100.0), hi = log(bmax) + log(100.0);
  for (int i = 0; i <= 60; i++)
    for (int j = 0; j <= 40; j++) {
      const double cb = lo + (hi - lo) * i / 60, cg = log(0.1) + (log(10.0) - log(0.1)) * j / 40;
      const double e = hill_sse(b, y, n, exp(cb), exp(cg), &smax);
      if (e < best && smax > 0) {
        best = e;
        lb = cb;
        lg = cg;
      }
    }
  for (double step = 0.25; step > 1e-10;) {
    int moved = 0;
    static const int dirs[4][2] = {{1, 0}, {-1, 0}, {0, 1}, {0, -1}};
    for (int d = 0; d < 4; d++) {
      const double cb = lb + step * dirs[d][0], cg = lg + step * dirs[d][1];
      const double e = hill_sse(b, y, n, exp(cb), exp(cg), &smax);
      if (e < best && smax > 0) {
        best = e;
        lb = cb;
        lg = cg;
        moved = 1;
      }
    }
    if (!moved)
      step /= 2;
  }
  *lb_out = lb;
  *lg_out = lg;
}

int curve_fit_hill(const double *batch, const double *speedup, size_t n, curve_hill_fit *out,
                   char *why, size_t cap) {
  if (!batch || !speedup || !out || n < 3)
    return fail(why, cap, -EINVAL, "a saturation fit needs at least 3 points");
  double bmin = INFINITY, bmax = 0, my = 0;
  for (size_t i = 0; i < n; i++) {
    if (!isfinite(batch[i]) || !isfinite(speedup[i]) || batch[i] <= 0)
      return fail(why, cap, -EINVAL, "point %zu: batch must be > 0 and values finite", i);
    bmin = batch[i] < bmin ? batch[i] : bmin;
    bmax = batch[i] > bmax ? batch[i] : bmax;
    my += speedup[i];
  }
  my /= (double)n;
  double lb, lg, smax;
  hill_search(batch, speedup, n, bmin, bmax, &lb, &lg);
  const double sse = hill_sse(batch, speedup, n, exp(lb), exp(lg), &smax);
  if (!(smax > 0))
    return fail(why, cap, KVT_ERANGE, "no saturating curve fits (speedups <= 0?)");
  double sst = 0;
  for (size_t i = 0; i < n; i++)
    sst += (speedup[i] - my) * (speedup[i] - my);
  out->smax = smax;
  out->bhalf = exp(lb);
  out->gamma = exp(lg);
  out->r2 = sst > 0 ? 1 - sse / sst : 1;
  out->batch80 = curve_hill_batch_at(out->bhalf, out->gamma, 0.80);
  out->batch95 = curve_hill_batch_at(out->bhalf, out->gamma, 0.95);
  out->n = n;
  return 0;
}
