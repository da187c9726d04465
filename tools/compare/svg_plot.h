// An SVG line plot of overhead against budget, one line per method (remat-compare's figure).
//
//   remat::compare::PlotSeries dtr{"dtr", {{0.5, 0.06}, {0.4, 0.12}}};
//   std::string svg = remat::compare::render_overhead_plot({dtr}, {.title = "resnet32"});
//
// The output is a standalone SVG 1.1 document (it opens in any browser). Points are (budget
// fraction, overhead); a budget where a method failed is simply absent from its series.
#ifndef REMAT_TOOLS_COMPARE_SVG_PLOT_H_
#define REMAT_TOOLS_COMPARE_SVG_PLOT_H_

#include <string>
#include <utility>
#include <vector>

namespace remat::compare {

struct PlotSeries {
  std::string name;                               // legend label (escaped for XML)
  std::vector<std::pair<double, double>> points;  // (x, y), any order; sorted by x to draw
};

struct PlotOptions {
  std::string title;
  std::string x_label = "budget (fraction of the unconstrained peak)";
  std::string y_label = "overhead (recomputed cost / base cost)";
  int width = 800;
  int height = 500;
};

std::string render_overhead_plot(const std::vector<PlotSeries>& series, const PlotOptions& options);

}  // namespace remat::compare

#endif  // REMAT_TOOLS_COMPARE_SVG_PLOT_H_
