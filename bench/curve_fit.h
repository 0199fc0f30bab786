/* bench/curve_fit.h - the curve fits of `kvtier project fit`: least-squares
 * ITL lines and their break-even context, and the saturation (Hill) curve of
 * speedup by batch. Tool code, not library API: nothing in libkvtier calls
 * them, so they are linked into the CLI (and its tests) only.
 *
 * Functions that can fail return 0, -EINVAL or KVT_ERANGE (kvtier/error.h)
 * and write a one-line reason into why[0..cap) (why may be NULL). Pure
 * computation: thread-safe, no allocation. */
#ifndef KVT_CURVE_FIT_H
#define KVT_CURVE_FIT_H

#include <stddef.h>

/* ITL = slope * T + intercept (ms per token, ms). */
typedef struct curve_line_fit {
  double slope, intercept;
  double r2; /* coefficient of determination; 1 when y has no variance */
  size_t n;  /* points used */
} curve_line_fit;

/* Context where two ITL lines cross: (new_b - base_b) / (base_a - new_a).
 * Returns 0, -EINVAL (tokens NULL) or KVT_ERANGE when the slopes are equal
 * (no crossing). The result may be negative (new is faster at every context
 * when its slope is also smaller). */
int curve_itl_breakeven(double base_slope, double base_intercept, double new_slope,
                        double new_intercept, double *tokens);

/* Least-squares line through (x[i], y[i]). Returns 0, -EINVAL (NULL, n < 2,
 * non-finite value) or KVT_ERANGE (all x equal). */
int curve_fit_line(const double *x, const double *y, size_t n, curve_line_fit *out, char *why,
                   size_t cap);

/* Speedup by batch: S(B) = smax B^gamma / (bhalf^gamma + B^gamma). */
typedef struct curve_hill_fit {
  double smax, bhalf, gamma;
  double r2;      /* of the fit to the points; NAN when not fitted */
  double batch80; /* batch reaching 80% of smax: bhalf 4^(1/gamma) */
  double batch95; /* 95%: bhalf 19^(1/gamma) */
  size_t n;
} curve_hill_fit;

double curve_hill(double smax, double bhalf, double gamma, double batch);

/* Batch at which S reaches fraction (0 < fraction < 1) of smax:
 * bhalf (fraction / (1 - fraction))^(1/gamma). NAN outside the domain. */
double curve_hill_batch_at(double bhalf, double gamma, double fraction);

/* Least squares over (batch[i], speedup[i]), batches > 0, n >= 3: smax in
 * closed form for each (bhalf, gamma), those two by a coarse log grid then
 * pattern search. Returns 0, -EINVAL or KVT_ERANGE (no fit: e.g. all
 * speedups <= 0). */
int curve_fit_hill(const double *batch, const double *speedup, size_t n, curve_hill_fit *out,
                   char *why, size_t cap);

#endif
