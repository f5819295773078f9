/* plot_svg.c - standalone SVG line and bar charts (see plot_svg.h). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "tools/plot_svg.h"
#include "core/base/err.h"

/* Canvas: the plot area leaves room for tick labels on the left and bottom and a legend on the right. */
enum { W = 900, H = 540, PL = 90, PR = 230, PT = 56, PB = 72 };

static const char *const palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                      "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
#define N_COLORS (sizeof palette / sizeof palette[0])

static void xml_text(FILE *f, const char *s)
{
    for (; s && *s; s++) {
        switch (*s) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        case '\'': fputs("&apos;", f); break;
        default: fputc(*s, f);
        }
    }
}

static void fmt_default(double v, char *buf, size_t cap) { snprintf(buf, cap, "%g", v); }

void plot_fmt_bytes(double v, char *buf, size_t cap)
{
    static const char *const suf[] = {"", "K", "M", "G", "T"};
    int k = 0;
    while (v >= 1024 && k < 4) v /= 1024, k++;
    snprintf(buf, cap, "%g%s", v, suf[k]);
}

/* One axis mapped onto [p0, p1] pixels. */
typedef struct scale {
    int log;
    double base, lo, hi;  /* in axis units (log_base exponents on a log axis) */
    double p0, p1;
} scale;

static double to_units(const scale *s, double v) { return s->log ? log(v) / log(s->base) : v; }

static double to_px(const scale *s, double v)
{
    return s->p0 + (to_units(s, v) - s->lo) / (s->hi - s->lo) * (s->p1 - s->p0);
}

static double nice_step(double range, int want)
{
    double raw = range / want, mag = pow(10, floor(log10(raw))), r = raw / mag;
    return (r <= 1 ? 1 : r <= 2 ? 2 : r <= 5 ? 5 : 10) * mag;
}

/* Fit the scale to [vmin, vmax] (data units): whole powers on a log axis, nice steps on a linear one. */
static void scale_fit(scale *s, const plot_axis *a, double vmin, double vmax, double p0, double p1)
{
    s->log = a->log;
    s->base = a->log_base > 1 ? a->log_base : 10;
    s->p0 = p0;
    s->p1 = p1;
    double lo = to_units(s, vmin), hi = to_units(s, vmax);
    if (s->log) {
        lo = floor(lo + 1e-9);
        hi = ceil(hi - 1e-9);
        if (hi <= lo) hi = lo + 1;
    } else {
        if (hi <= lo) hi = lo + (lo != 0 ? fabs(lo) : 1);
        double st = nice_step(hi - lo, 6);
        lo = floor(lo / st) * st;
        hi = ceil(hi / st) * st;
    }
    s->lo = lo;
    s->hi = hi;
}

/* Tick values (data units) of the scale, at most cap. */
static int scale_ticks(const scale *s, double *t, int cap)
{
    int n = 0;
    if (s->log) {
        int span = (int)(s->hi - s->lo), every = span / 10 + 1;
        for (int k = 0; k <= span && n < cap; k += every) t[n++] = pow(s->base, s->lo + k);
    } else {
        double st = nice_step(s->hi - s->lo, 6);
        for (double v = s->lo; v <= s->hi + st * 1e-6 && n < cap; v += st) t[n++] = fabs(v) < st * 1e-9 ? 0 : v;
    }
    return n;
}

static void svg_open(FILE *f, const char *title)
{
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\" standalone=\"no\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
               "font-family=\"Helvetica, Arial, sans-serif\" font-size=\"12\">\n"
               "<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"white\"/>\n"
               "<text x=\"%d\" y=\"28\" text-anchor=\"middle\" font-size=\"16\" font-weight=\"bold\">",
            W, H, W, H, W, H, PL + (W - PL - PR) / 2);
    xml_text(f, title);
    fputs("</text>\n", f);
}

/* Grid, ticks and labels of both axes; frame of the plot area. */
static void draw_axes(FILE *f, const scale *sx, const plot_axis *ax, const scale *sy, const plot_axis *ay)
{
    double t[64];
    char buf[64];
    int n = sx ? scale_ticks(sx, t, 64) : 0;
    plot_tick_fmt fx = ax && ax->fmt ? ax->fmt : fmt_default, fy = ay->fmt ? ay->fmt : fmt_default;
    for (int i = 0; sx && i < n; i++) {
        double px = to_px(sx, t[i]);
        fx(t[i], buf, sizeof buf);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#e0e0e0\"/>\n", px, PT, px, H - PB);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"black\"/>\n", px, H - PB, px,
                H - PB + 5);
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">", px, H - PB + 19);
        xml_text(f, buf);
        fputs("</text>\n", f);
    }
    n = scale_ticks(sy, t, 64);
    for (int i = 0; i < n; i++) {
        double py = to_px(sy, t[i]);
        fy(t[i], buf, sizeof buf);
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#e0e0e0\"/>\n", PL, py, W - PR, py);
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"black\"/>\n", PL - 5, py, PL, py);
        fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">", PL - 8, py + 4);
        xml_text(f, buf);
        fputs("</text>\n", f);
    }
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"black\"/>\n", PL, PT,
            W - PL - PR, H - PT - PB);
    if (ax) {
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">", PL + (W - PL - PR) / 2, H - 24);
        xml_text(f, ax->label);
        fputs("</text>\n", f);
    }
    fprintf(f, "<text x=\"22\" y=\"%d\" text-anchor=\"middle\" transform=\"rotate(-90 22 %d)\">",
            PT + (H - PT - PB) / 2, PT + (H - PT - PB) / 2);
    xml_text(f, ay->label);
    fputs("</text>\n", f);
}

static ppn_status svg_close(FILE *f, const char *path)
{
    fputs("</svg>\n", f);
    int bad = ferror(f);
    int e = errno;
    if (fclose(f) != 0 && !bad) bad = 1, e = errno;
    if (bad) return ppn_err(PPN_EIO, "plot %s: write failed: %s", path, strerror(e));
    return PPN_OK;
}

static ppn_status check_point(const plot_series *s, int i, const plot_axis *x, const plot_axis *y)
{
    double vx = s->x[i], vy = s->y[i];
    if (!isfinite(vx) || !isfinite(vy) || (x->log && vx <= 0) || (y->log && vy <= 0))
        return ppn_err(PPN_EINVAL, "plot: series '%s' point %d (%g, %g) cannot be drawn on %s axes", s->name, i, vx,
                       vy, x->log || y->log ? "log" : "linear");
    return PPN_OK;
}

/* Legend row k on the right of the plot area: a line (series) or a swatch (bar) and the name. */
static void legend_entry(FILE *f, int k, const char *color, int line, const char *name)
{
    int ly = PT + 10 + 18 * k;
    if (line)
        fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"2\"%s/>\n", W - PR + 14,
                ly, W - PR + 38, ly, color, k >= (int)N_COLORS ? " stroke-dasharray=\"6 3\"" : "");
    else
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"24\" height=\"10\" fill=\"%s\"/>\n", W - PR + 14, ly - 5, color);
    fprintf(f, "<text x=\"%d\" y=\"%d\">", W - PR + 44, ly + 4);
    xml_text(f, name);
    fputs("</text>\n", f);
}

static void draw_series(FILE *f, const plot_series *s, int k, const scale *sx, const scale *sy)
{
    const char *c = palette[k % N_COLORS];
    fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s points=\"", c,
            k >= (int)N_COLORS ? " stroke-dasharray=\"6 3\"" : "");
    for (int i = 0; i < s->n; i++) fprintf(f, "%s%.1f,%.1f", i ? " " : "", to_px(sx, s->x[i]), to_px(sy, s->y[i]));
    fputs("\"/>\n", f);
    for (int i = 0; i < s->n; i++)
        fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", to_px(sx, s->x[i]), to_px(sy, s->y[i]),
                c);
    legend_entry(f, k, c, 1, s->name);
}

ppn_status plot_svg_lines(const char *path, const char *title, const plot_axis *x, const plot_axis *y,
                          const plot_series *s, int n)
{
    double xmin = INFINITY, xmax = -INFINITY, ymin = INFINITY, ymax = -INFINITY;
    for (int k = 0; k < n; k++)
        for (int i = 0; i < s[k].n; i++) {
            PPN_CHECK(check_point(&s[k], i, x, y));
            xmin = fmin(xmin, s[k].x[i]), xmax = fmax(xmax, s[k].x[i]);
            ymin = fmin(ymin, s[k].y[i]), ymax = fmax(ymax, s[k].y[i]);
        }
    if (!(xmin <= xmax)) return ppn_err(PPN_EINVAL, "plot %s: no point to draw", path);
    FILE *f = fopen(path, "w");
    if (!f) return ppn_err(PPN_EIO, "plot %s: cannot open for writing: %s", path, strerror(errno));
    scale sx, sy;
    scale_fit(&sx, x, xmin, xmax, PL, W - PR);
    scale_fit(&sy, y, ymin, ymax, H - PB, PT);
    svg_open(f, title);
    draw_axes(f, &sx, x, &sy, y);
    for (int k = 0; k < n; k++) draw_series(f, &s[k], k, &sx, &sy);
    return svg_close(f, path);
}

ppn_status plot_svg_bars(const char *path, const char *title, const char *ylabel, const char *const *labels,
                         const double *values, int n)
{
    if (n < 1) return ppn_err(PPN_EINVAL, "plot %s: no bar to draw", path);
    double vmax = 0;
    for (int i = 0; i < n; i++)
        if (isfinite(values[i]) && values[i] > vmax) vmax = values[i];
    FILE *f = fopen(path, "w");
    if (!f) return ppn_err(PPN_EIO, "plot %s: cannot open for writing: %s", path, strerror(errno));
    plot_axis ay = {.label = ylabel};
    scale sy;
    scale_fit(&sy, &ay, 0, vmax > 0 ? vmax : 1, H - PB, PT);
    svg_open(f, title);
    draw_axes(f, NULL, NULL, &sy, &ay);
    double slot = (double)(W - PL - PR) / n, bw = slot * 0.6;
    for (int i = 0; i < n; i++) {
        double cx = PL + slot * (i + 0.5), v = values[i];
        int ok = isfinite(v) && v >= 0;
        double top = ok ? to_px(&sy, v) : H - PB;
        if (ok)
            fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"/>\n", cx - bw / 2, top,
                    bw, (H - PB) - top, palette[i % N_COLORS]);
        if (ok) fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%.4g</text>\n", cx, top - 5, v);
        else fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" fill=\"#7f7f7f\">n/a</text>\n", cx, H - PB - 5);
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"end\" transform=\"rotate(-30 %.1f %d)\">", cx, H - PB + 16,
                cx, H - PB + 16);
        xml_text(f, labels[i]);
        fputs("</text>\n", f);
        legend_entry(f, i, palette[i % N_COLORS], 0, labels[i]);
    }
    return svg_close(f, path);
}
