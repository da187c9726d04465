#include "tools/compare/svg_plot.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <boost/property_tree/ptree.hpp>
#include <boost/property_tree/xml_parser.hpp>

namespace remat::compare {
namespace {

using boost::property_tree::ptree;

// Parses `svg` as XML; a parse error (not well-formed) fails the test via the exception.
ptree parse(const std::string& svg) {
  std::istringstream in(svg);
  ptree tree;
  boost::property_tree::read_xml(in, tree);
  return tree;
}

// All elements named `tag` anywhere below `node`.
void collect(const ptree& node, const std::string& tag, std::vector<const ptree*>& found) {
  for (const auto& [name, child] : node) {
    if (name == "<xmlattr>") continue;
    if (name == tag) found.push_back(&child);
    collect(child, tag, found);
  }
}

std::vector<const ptree*> elements(const ptree& root, const std::string& tag) {
  std::vector<const ptree*> found;
  collect(root, tag, found);
  return found;
}

std::string attr(const ptree& element, const std::string& name) {
  return element.get<std::string>("<xmlattr>." + name);
}

// Number of "x,y" pairs in a polyline's points attribute.
int count_points(const std::string& points) {
  std::istringstream in(points);
  std::string pair;
  int count = 0;
  while (in >> pair) {
    EXPECT_NE(pair.find(','), std::string::npos) << pair;
    ++count;
  }
  return count;
}

std::string all_text(const ptree& root) {
  std::string text;
  for (const ptree* t : elements(root, "text")) text += t->data() + "\n";
  return text;
}

TEST(SvgPlotTest, RendersOnePolylinePerSeries) {
  PlotSeries dtr{"dtr", {{0.5, 0.06}, {0.4, 0.12}, {0.3, 0.3}, {1.0, 0.0}}};
  PlotSeries checkmate{"checkmate", {{0.5, 0.04}, {0.3, 0.2}}};
  const std::string svg = render_overhead_plot({dtr, checkmate}, {.title = "resnet32"});
  ptree tree = parse(svg);

  const ptree& root = tree.get_child("svg");
  EXPECT_EQ(attr(root, "xmlns"), "http://www.w3.org/2000/svg");
  EXPECT_EQ(attr(root, "width"), "800.00");
  EXPECT_EQ(attr(root, "height"), "500.00");
  EXPECT_FALSE(attr(root, "viewBox").empty());

  std::vector<const ptree*> lines = elements(root, "polyline");
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(attr(*lines[0], "data-series"), "dtr");
  EXPECT_EQ(count_points(attr(*lines[0], "points")), 4);
  EXPECT_EQ(attr(*lines[0], "fill"), "none");
  EXPECT_EQ(attr(*lines[1], "data-series"), "checkmate");
  EXPECT_EQ(count_points(attr(*lines[1], "points")), 2);
  EXPECT_NE(attr(*lines[0], "stroke"), attr(*lines[1], "stroke"));

  // Six data points and two legend markers.
  EXPECT_EQ(elements(root, "circle").size(), 8u);

  const std::string text = all_text(root);
  EXPECT_NE(text.find("resnet32"), std::string::npos);
  EXPECT_NE(text.find("budget (fraction"), std::string::npos);
  EXPECT_NE(text.find("overhead (recomputed"), std::string::npos);
  EXPECT_NE(text.find("checkmate"), std::string::npos);
  EXPECT_EQ(text.find("no data"), std::string::npos);
}

TEST(SvgPlotTest, DrawsPointsInIncreasingX) {
  PlotSeries s{"s", {{0.9, 0.1}, {0.1, 0.5}, {0.5, 0.2}}};
  ptree tree = parse(render_overhead_plot({s}, {}));
  std::vector<const ptree*> lines = elements(tree, "polyline");
  ASSERT_EQ(lines.size(), 1u);
  std::istringstream in(attr(*lines[0], "points"));
  std::string pair;
  double last_x = -1;
  while (in >> pair) {
    const double x = std::stod(pair.substr(0, pair.find(',')));
    EXPECT_GT(x, last_x);
    last_x = x;
  }
}

TEST(SvgPlotTest, EscapesNames) {
  PlotSeries odd{"a<&>\"'b", {{0.5, 1.0}}};
  const std::string svg =
      render_overhead_plot({odd}, {.title = "x < y & z", .x_label = "\"q\"", .y_label = "'p'"});
  EXPECT_EQ(svg.find("a<&>"), std::string::npos);
  ptree tree = parse(svg);
  std::vector<const ptree*> lines = elements(tree, "polyline");
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(attr(*lines[0], "data-series"), "a<&>\"'b");
  const std::string text = all_text(tree);
  EXPECT_NE(text.find("x < y & z"), std::string::npos);
  EXPECT_NE(text.find("a<&>\"'b"), std::string::npos);
}

TEST(SvgPlotTest, EmptyInputIsAValidDocument) {
  ptree tree = parse(render_overhead_plot({}, {.title = "nothing"}));
  EXPECT_TRUE(elements(tree, "polyline").empty());
  EXPECT_GE(elements(tree, "line").size(), 2u);  // the axes
  EXPECT_NE(all_text(tree).find("no data"), std::string::npos);
}

TEST(SvgPlotTest, SkipsNonFinitePointsAndHandlesDegenerateData) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  PlotSeries zeros{"zeros", {{0.2, 0.0}, {0.6, 0.0}, {nan, 0.1}, {0.4, inf}}};
  PlotSeries single{"single", {{0.5, 0.0}}};
  PlotSeries none{"none", {{nan, nan}}};
  const std::string svg = render_overhead_plot({zeros, single, none}, {});
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  EXPECT_EQ(svg.find("inf"), std::string::npos);
  ptree tree = parse(svg);
  std::vector<const ptree*> lines = elements(tree, "polyline");
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(count_points(attr(*lines[0], "points")), 2);
  EXPECT_EQ(count_points(attr(*lines[1], "points")), 1);
  EXPECT_EQ(count_points(attr(*lines[2], "points")), 0);

  // A single point alone still gets a usable axis.
  ptree one = parse(render_overhead_plot({single}, {}));
  EXPECT_EQ(count_points(attr(*elements(one, "polyline")[0], "points")), 1);
}

TEST(SvgPlotTest, TickCountIsReasonable) {
  PlotSeries s{"s", {{0.1, 0.03}, {0.4, 0.7}, {1.0, 2.3}}};
  ptree tree = parse(render_overhead_plot({s}, {}));
  // Tick labels are the text elements holding a number.
  int numeric = 0;
  for (const ptree* t : elements(tree, "text")) {
    const std::string& d = t->data();
    if (!d.empty() && d.find_first_not_of("0123456789.-") == std::string::npos) ++numeric;
  }
  EXPECT_GE(numeric, 10);  // at least 5 per axis
  EXPECT_LE(numeric, 22);  // at most 11 per axis
}

}  // namespace
}  // namespace remat::compare
