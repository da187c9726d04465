#include "tools/compare/svg_plot.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace remat::compare {
namespace {

// Tableau 10: distinct, readable on white. Series past the tenth reuse a colour with a dash.
constexpr const char* kPalette[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                    "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};
constexpr std::size_t kPaletteSize = sizeof(kPalette) / sizeof(kPalette[0]);
constexpr const char* kDashes[] = {"", "6,3", "2,2", "8,3,2,3"};
constexpr std::size_t kDashCount = sizeof(kDashes) / sizeof(kDashes[0]);

// Escapes XML special characters; control characters that XML 1.0 forbids become '?'.
std::string escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default: {
        const auto u = static_cast<unsigned char>(c);
        out += (u < 0x20 && c != '\t' && c != '\n' && c != '\r') ? '?' : c;
      }
    }
  }
  return out;
}

// Formats with a fixed number of decimals, independent of the C locale.
std::string fixed(double value, int decimals) {
  if (value == 0) value = 0;  // no "-0"
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), value, std::chars_format::fixed, decimals);
  if (ec != std::errc()) {
    auto [g_end, g_ec] =
        std::to_chars(buf, buf + sizeof(buf), value, std::chars_format::general, 6);
    return g_ec == std::errc() ? std::string(buf, g_end) : std::string("?");
  }
  return std::string(buf, end);
}

std::string format_px(double v) { return fixed(v, 2); }

struct Axis {
  double lo = 0;
  double hi = 1;
  std::vector<double> ticks;
  int decimals = 1;
};

// Ticks at a 1/2/5 x 10^k step covering [min, max], choosing the step that gives the count
// closest to 7 (preferring 5 to 10 ticks).
Axis nice_axis(double min, double max) {
  Axis axis;
  if (!(max > min)) {
    const double pad = min == 0 ? 0.5 : std::abs(min) * 0.1;
    min -= pad;
    max += pad;
  }
  const double range = max - min;
  if (!std::isfinite(range) || range <= 0) {  // values near the limits of double
    axis.lo = min;
    axis.hi = max;
    const double step = max / 4 - min / 4;
    for (int i = 0; i <= 4; ++i) axis.ticks.push_back(min + i * step);
    axis.decimals = 0;
    return axis;
  }
  constexpr double kSlack = 1e-9;  // 0.3 / 0.1 is 2.9999999999999996
  const int top = static_cast<int>(std::floor(std::log10(range)));
  double best_step = 0;
  int best_count = 0;
  int best_exp = 0;
  auto score = [](int count) {
    return std::abs(count - 7) + ((count < 5 || count > 10) ? 100 : 0);
  };
  for (int e = top - 2; e <= top + 1; ++e) {
    for (double m : {1.0, 2.0, 5.0}) {
      const double step = m * std::pow(10.0, e);
      const double lo = std::floor(min / step + kSlack) * step;
      const double hi = std::ceil(max / step - kSlack) * step;
      const int count = static_cast<int>(std::lround((hi - lo) / step)) + 1;
      if (best_count == 0 || score(count) <= score(best_count)) {  // ties: the larger step
        best_step = step;
        best_count = count;
        best_exp = e;
      }
    }
  }
  axis.lo = std::floor(min / best_step + kSlack) * best_step;
  axis.hi = axis.lo + (best_count - 1) * best_step;
  for (int i = 0; i < best_count; ++i) axis.ticks.push_back(axis.lo + i * best_step);
  axis.decimals = std::clamp(-best_exp, 0, 12);
  return axis;
}

}  // namespace

namespace {

using Points = std::vector<std::vector<std::pair<double, double>>>;

// Where the plot area lies and how data maps into it.
struct Frame {
  static constexpr double kLeft = 70, kTop = 50, kBottom = 60, kLegendWidth = 170;
  double width, height, plot_w, plot_h;
  Axis xa, ya;
  double px(double x) const { return kLeft + (x - xa.lo) / (xa.hi - xa.lo) * plot_w; }
  double py(double y) const { return kTop + plot_h - (y - ya.lo) / (ya.hi - ya.lo) * plot_h; }
  double x0() const { return kLeft; }
  double x1() const { return kLeft + plot_w; }
  double y0() const { return kTop + plot_h; }
  double y1() const { return kTop; }
};

// Finite points of each series, sorted by x, and the frame that holds them all.
Frame frame_for(const std::vector<PlotSeries>& series, const PlotOptions& options, Points& points) {
  Frame f;
  f.width = std::max(options.width, 320);
  f.height = std::max(options.height, 200);
  f.plot_w = f.width - Frame::kLeft - Frame::kLegendWidth;
  f.plot_h = f.height - Frame::kTop - Frame::kBottom;
  points.assign(series.size(), {});
  double x_min = INFINITY, x_max = -INFINITY, y_min = 0, y_max = 0;
  bool any = false;
  for (std::size_t s = 0; s < series.size(); ++s) {
    for (const auto& [x, y] : series[s].points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      points[s].emplace_back(x, y);
      x_min = std::min(x_min, x);
      x_max = std::max(x_max, x);
      y_min = std::min(y_min, y);
      y_max = std::max(y_max, y);
      any = true;
    }
    std::stable_sort(points[s].begin(), points[s].end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
  }
  if (!any) {
    x_min = 0;
    x_max = 1;
  }
  if (y_max == y_min) y_max = y_min + 1;  // all zero (or no data): a unit axis
  f.xa = nice_axis(x_min, x_max);
  f.ya = nice_axis(y_min, y_max);
  return f;
}

void write_header(const Frame& f, const PlotOptions& options, std::string& svg) {
  svg += "<?xml version=\"1.0\" encoding=\"UTF-8\" standalone=\"no\"?>\n";
  svg += "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"" + format_px(f.width) +
         "\" height=\"" + format_px(f.height) + "\" viewBox=\"0 0 " + format_px(f.width) + " " +
         format_px(f.height) + "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  svg += "<rect x=\"0\" y=\"0\" width=\"" + format_px(f.width) + "\" height=\"" +
         format_px(f.height) + "\" fill=\"white\"/>\n";
  svg += "<text x=\"" + format_px(Frame::kLeft + f.plot_w / 2) +
         "\" y=\"28\" text-anchor=\"middle\" font-size=\"16\" font-weight=\"bold\">" +
         escape(options.title) + "</text>\n";
}

std::string line(double x1, double y1, double x2, double y2) {
  return "<line x1=\"" + format_px(x1) + "\" y1=\"" + format_px(y1) + "\" x2=\"" + format_px(x2) +
         "\" y2=\"" + format_px(y2) + "\"/>\n";
}

// Grid, axes, ticks, tick labels and axis titles.
void write_axes(const Frame& f, const PlotOptions& options, std::string& svg) {
  svg += "<g stroke=\"#e0e0e0\" stroke-width=\"1\">\n";
  for (double t : f.xa.ticks) svg += line(f.px(t), f.y0(), f.px(t), f.y1());
  for (double t : f.ya.ticks) svg += line(f.x0(), f.py(t), f.x1(), f.py(t));
  svg += "</g>\n<g stroke=\"black\" stroke-width=\"1\">\n";
  svg += line(f.x0(), f.y0(), f.x1(), f.y0());
  svg += line(f.x0(), f.y0(), f.x0(), f.y1());
  for (double t : f.xa.ticks) svg += line(f.px(t), f.y0(), f.px(t), f.y0() + 5);
  for (double t : f.ya.ticks) svg += line(f.x0() - 5, f.py(t), f.x0(), f.py(t));
  svg += "</g>\n<g fill=\"black\">\n";
  for (double t : f.xa.ticks) {
    svg += "<text x=\"" + format_px(f.px(t)) + "\" y=\"" + format_px(f.y0() + 18) +
           "\" text-anchor=\"middle\">" + fixed(t, f.xa.decimals) + "</text>\n";
  }
  for (double t : f.ya.ticks) {
    svg += "<text x=\"" + format_px(f.x0() - 8) + "\" y=\"" + format_px(f.py(t) + 4) +
           "\" text-anchor=\"end\">" + fixed(t, f.ya.decimals) + "</text>\n";
  }
  svg += "</g>\n";
  const double mid_y = Frame::kTop + f.plot_h / 2;
  svg += "<text x=\"" + format_px(Frame::kLeft + f.plot_w / 2) + "\" y=\"" +
         format_px(f.height - 15) + "\" text-anchor=\"middle\">" + escape(options.x_label) +
         "</text>\n";
  svg += "<text x=\"18\" y=\"" + format_px(mid_y) +
         "\" text-anchor=\"middle\" transform=\"rotate(-90 18 " + format_px(mid_y) + ")\">" +
         escape(options.y_label) + "</text>\n";
}

std::string dash_attribute(const std::string& dash) {
  return dash.empty() ? "" : " stroke-dasharray=\"" + dash + "\"";
}

// One polyline (and a circle per point) per series.
void write_series(const Frame& f, const std::vector<PlotSeries>& series, const Points& points,
                  std::string& svg) {
  for (std::size_t s = 0; s < series.size(); ++s) {
    const std::string colour = kPalette[s % kPaletteSize];
    const std::string dash = kDashes[(s / kPaletteSize) % kDashCount];
    std::string coords;
    for (const auto& [x, y] : points[s]) {
      if (!coords.empty()) coords += ' ';
      coords += format_px(f.px(x)) + "," + format_px(f.py(y));
    }
    svg += "<g>\n<polyline data-series=\"" + escape(series[s].name) + "\" points=\"" + coords +
           "\" fill=\"none\" stroke=\"" + colour + "\" stroke-width=\"2\"" + dash_attribute(dash) +
           "/>\n";
    for (const auto& [x, y] : points[s]) {
      svg += "<circle cx=\"" + format_px(f.px(x)) + "\" cy=\"" + format_px(f.py(y)) +
             "\" r=\"3\" fill=\"" + colour + "\"/>\n";
    }
    svg += "</g>\n";
  }
}

void write_legend(const Frame& f, const std::vector<PlotSeries>& series, std::string& svg) {
  svg += "<g>\n";
  for (std::size_t s = 0; s < series.size(); ++s) {
    const std::string colour = kPalette[s % kPaletteSize];
    const std::string dash = kDashes[(s / kPaletteSize) % kDashCount];
    const double ly = Frame::kTop + 10 + 20.0 * static_cast<double>(s);
    const double lx = f.x1() + 15;
    svg += "<line x1=\"" + format_px(lx) + "\" y1=\"" + format_px(ly) + "\" x2=\"" +
           format_px(lx + 24) + "\" y2=\"" + format_px(ly) + "\" stroke=\"" + colour +
           "\" stroke-width=\"2\"" + dash_attribute(dash) + "/>\n";
    svg += "<circle cx=\"" + format_px(lx + 12) + "\" cy=\"" + format_px(ly) +
           "\" r=\"3\" fill=\"" + colour + "\"/>\n";
    svg += "<text x=\"" + format_px(lx + 30) + "\" y=\"" + format_px(ly + 4) + "\">" +
           escape(series[s].name) + "</text>\n";
  }
  svg += "</g>\n";
}

}  // namespace

std::string render_overhead_plot(const std::vector<PlotSeries>& series,
                                 const PlotOptions& options) {
  Points points;
  const Frame f = frame_for(series, options, points);
  std::string svg;
  write_header(f, options, svg);
  write_axes(f, options, svg);
  if (series.empty()) {
    svg += "<text x=\"" + format_px(Frame::kLeft + f.plot_w / 2) + "\" y=\"" +
           format_px(Frame::kTop + f.plot_h / 2) +
           "\" text-anchor=\"middle\" fill=\"#808080\">no data</text>\n";
  }
  write_series(f, series, points, svg);
  write_legend(f, series, svg);
  svg += "</svg>\n";
  return svg;
}

}  // namespace remat::compare
