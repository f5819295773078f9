/* plot_svg.h - a tiny standalone SVG chart writer for the benchmark subcommands: line charts (linear or log
 * axes, one polyline with point markers per series, a legend) and bar charts. No external plotting tool.
 * The files are complete SVG documents (XML prolog, <svg> root with width/height/viewBox); text is escaped.
 */
#ifndef PPN_PLOT_SVG_H
#define PPN_PLOT_SVG_H

#include "ppn.h"

/* Formats an axis tick value into buf (cap bytes). NULL: "%g". */
typedef void (*plot_tick_fmt)(double v, char *buf, size_t cap);

typedef struct plot_axis {
    const char *label;
    int log;              /* 1: logarithmic (every value must be > 0) */
    double log_base;      /* tick spacing of a log axis: ticks at powers of this (0: 10) */
    plot_tick_fmt fmt;
} plot_axis;

typedef struct plot_series {
    const char *name;     /* legend entry */
    int n;
    const double *x, *y;  /* n points; drawn in order */
} plot_series;

/* A line chart of n series to path.
 * @return PPN_OK, PPN_EINVAL (no point at all, or a value <= 0 or not finite on a log axis: the message names
 *         the series and the point), PPN_EIO (path cannot be written: the message names it and errno). */
ppn_status plot_svg_lines(const char *path, const char *title, const plot_axis *x, const plot_axis *y,
                          const plot_series *s, int n);

/* A vertical bar chart: one bar per label, value on a linear y axis from 0; the value is printed above each
 * bar. A bar whose value is negative or not finite is drawn as "n/a" (no bar).
 * @return PPN_OK, PPN_EINVAL (n < 1), PPN_EIO (path cannot be written). */
ppn_status plot_svg_bars(const char *path, const char *title, const char *ylabel, const char *const *labels,
                         const double *values, int n);

/* Tick formatter for byte sizes with binary suffixes: 4096 -> "4K", 1048576 -> "1M". */
void plot_fmt_bytes(double v, char *buf, size_t cap);

#endif
