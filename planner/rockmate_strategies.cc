// Rockmate's per-block strategies: for one kind of block, a family of ways to run it
// (forward steps, backward steps, what they keep in between), from Checkmate's MILP under a
// grid of (peak, kept) budgets and from cheap constructions.
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "internal.h"
#include "rockmate.h"

namespace remat::detail::rockmate {
namespace {

std::vector<int> file_order(const Graph& g) {
  std::vector<int> order(g.size());
  std::iota(order.begin(), order.end(), 0);
  return order;
}

// Peak and kept bytes as Checkmate's model sees them (exports included, no holding).
struct PlainMeasure {
  int64_t peak = 0, kept = 0;
};
PlainMeasure measure_plain(const BlockProblem& p, const std::vector<int>& order) {
  const Graph& g = p.sub;
  PlainMeasure r;
  std::vector<int> latest(g.size(), -1), end(order.size());
  for (size_t j = 0; j < order.size(); ++j) {
    end[j] = static_cast<int>(j);
    for (int u : g.nodes[order[j]].inputs)
      if (latest[u] >= 0) end[latest[u]] = static_cast<int>(j);
    latest[order[j]] = static_cast<int>(j);
  }
  size_t split = order.size();
  for (size_t j = 0; j < order.size() && split == order.size(); ++j)
    if (order[j] >= p.boundary) split = j;
  std::vector<int64_t> delta(order.size() + 1, 0);
  for (size_t j = 0; j < order.size(); ++j) {
    delta[j] += g.nodes[order[j]].bytes;
    delta[end[j] + 1] -= g.nodes[order[j]].bytes;
    if (j < split && end[j] >= static_cast<int>(split)) r.kept += g.nodes[order[j]].bytes;
  }
  int64_t cur = 0;
  for (size_t j = 0; j < order.size(); ++j) r.peak = std::max(r.peak, cur += delta[j]);
  return r;
}

// Strategies with the orders they came from, for CBC's starts.
struct Candidates {
  std::vector<Strategy> list;
  std::vector<std::vector<int>> orders;
  std::vector<PlainMeasure> plain;

  void add(const BlockProblem& p, std::vector<int> order, const std::string& source) {
    list.push_back(measure_strategy(p, order, source));
    plain.push_back(measure_plain(p, order));
    orders.push_back(std::move(order));
  }
  // The cheapest order within the caps, or empty.
  std::vector<int> start(int64_t peak_cap, int64_t kept_cap) const {
    int best = -1;
    for (size_t i = 0; i < list.size(); ++i) {
      if (plain[i].peak > peak_cap || plain[i].kept > kept_cap) continue;
      if (best < 0 || list[i].cost < list[best].cost) best = static_cast<int>(i);
    }
    return best < 0 ? std::vector<int>{} : orders[best];
  }
};

// Keep sets of growing size: the forward values that are dearest to remake per byte first.
void keep_set_strategies(const BlockProblem& p, Candidates* out) {
  const Graph& g = p.sub;
  std::vector<int> cand;
  int64_t total = 0;
  for (int v = 0; v < p.boundary; ++v) {
    if (p.external[v] || !g.nodes[v].can_recompute() || g.nodes[v].bytes == 0) continue;
    cand.push_back(v);
    total += g.nodes[v].bytes;
  }
  std::sort(cand.begin(), cand.end(), [&](int a, int b) {
    return g.nodes[a].cost * static_cast<double>(g.nodes[b].bytes) >
           g.nodes[b].cost * static_cast<double>(g.nodes[a].bytes);
  });
  for (double q : {0.0, 0.15, 0.3, 0.5, 0.7, 0.85}) {
    std::vector<char> keep(g.size(), 0);
    int64_t acc = 0;
    for (int v : cand) {
      if (static_cast<double>(acc + g.nodes[v].bytes) > q * static_cast<double>(total)) break;
      keep[v] = 1;
      acc += g.nodes[v].bytes;
    }
    out->add(p, execute_keep_set(g, keep), q == 0 ? "recompute all" : "keep set");
  }
}

// Greedy repair of the file order under `levels` peaks between the lower bound and the
// file order's peak.
void greedy_strategies(const BlockProblem& p, int levels, const Deadline& deadline,
                       Candidates* out) {
  const Graph& g = p.sub;
  const std::vector<int> file = file_order(g);
  const int64_t hi = measure_plain(p, file).peak, lo = minimum_peak_lower_bound(g, nullptr);
  for (int a = 0; a < levels && !deadline.expired(); ++a) {
    const int64_t cap = lo + (hi - lo) * a / std::max(1, levels);
    std::vector<int> order = repair_order(g, file, cap, GreedyParams{}, &deadline);
    if (measure_plain(p, order).peak <= cap) out->add(p, std::move(order), "greedy");
  }
}

// The grid point (a, b) of a side x side grid, in an order that solves the coarse grid
// first (dyadic levels), so that a solve cut short by time still covers the range.
std::vector<std::pair<int, int>> grid_order(int side) {
  auto level = [&](int i) {
    if (i == 0 || i == side - 1) return 0;
    return 1 + std::countr_zero(static_cast<unsigned>(side - 1)) -
           std::countr_zero(static_cast<unsigned>(i));
  };
  std::vector<std::pair<int, int>> pts;
  for (int a = 0; a < side; ++a)
    for (int b = 0; b < side; ++b) pts.push_back({a, b});
  std::stable_sort(pts.begin(), pts.end(), [&](auto x, auto y) {
    return std::max(level(x.first), level(x.second)) < std::max(level(y.first), level(y.second));
  });
  return pts;
}

// What a solved grid point proves about smaller budgets.
struct GridResult {
  int64_t peak_cap, kept_cap;
  bool infeasible;   // proven: nothing fits (peak_cap, kept_cap)
  bool optimal;      // proven optimal; then (peak, kept) is what it uses
  PlainMeasure got;  // of the solution
};

// Whether an earlier result already answers the point: a proven infeasible point at larger
// caps, or a proven optimum at larger caps whose solution also fits these.
bool answered(const std::vector<GridResult>& done, int64_t pc, int64_t kc) {
  for (const GridResult& r : done) {
    if (pc > r.peak_cap || kc > r.kept_cap) continue;
    if (r.infeasible) return true;
    if (r.optimal && r.got.peak <= pc && r.got.kept <= kc) return true;
  }
  return false;
}

// Checkmate under the grid of (peak, kept) caps until the grid or the time runs out.
void checkmate_grid(const BlockProblem& p, int side, const Deadline& deadline, double share,
                    bool verbose, Candidates* out, KindPlan* k) {
  const PlainMeasure all = measure_plain(p, file_order(p.sub));
  const int64_t lo = minimum_peak_lower_bound(p.sub, nullptr);
  std::vector<GridResult> done;
  k->grid_side = side;
  for (auto [a, b] : grid_order(side)) {
    const int64_t pc = lo + (all.peak - lo) * a / (side - 1);
    const int64_t kc = all.kept * b / (side - 1);
    if (answered(done, pc, kc)) {
      ++k->grid_skipped;
      continue;
    }
    const double left = deadline.left();
    if (left < 0.5) break;
    PlanOptions o;
    o.budget_bytes = pc;
    o.verbose = verbose;
    // CBC's process is killed 0.3 s past its limit (checkmate.cc): keep that inside the time
    // left.
    o.time_limit_seconds = std::clamp(std::min(left - 0.4, share / 3), 0.1, 60.0);
    auto raw = plan_checkmate_kept(p.sub, o, KeptBound{p.boundary, kc, true, out->start(pc, kc)});
    ++k->grid_solved;
    if (!raw.ok()) break;
    GridResult r{pc, kc, raw->note.find("infeasible") != std::string::npos, raw->optimal, {}};
    if (!raw->order.empty()) {
      r.got = measure_plain(p, raw->order);
      out->add(p, raw->order, "checkmate");
      k->cbc_optimal += raw->optimal;
    }
    done.push_back(r);
  }
}

// Whether the block's MILP is small enough to solve a useful part of the grid in `share`
// seconds: CBC needs roughly a second per 20,000 variables on these models. Blocks of a
// few nodes have nothing for it to find beyond the cheap strategies.
bool cbc_can_solve(const Graph& g, double share) {
  double edges = 0;
  for (const Node& v : g.nodes) edges += static_cast<double>(v.inputs.size()) + 1;
  const double n = g.size();
  const double vars = 1.5 * n * n + 0.5 * n * edges;
  return g.size() >= 4 && vars <= 3e5 && vars / 20'000 <= share / 4;
}

// How the block advances: the ancestors of its exports among its forward nodes, each
// once, exports held to the end.
void advance(const BlockProblem& p, KindPlan* k) {
  const Graph& g = p.sub;
  std::vector<char> need(g.size(), 0);
  for (int v = p.boundary - 1; v >= 0; --v) {
    if (p.external[v]) continue;
    need[v] = need[v] || p.exported[v];
    if (need[v])
      for (int u : g.nodes[v].inputs) need[u] = 1;
  }
  for (int v = 0; v < p.boundary; ++v)
    if (need[v] && !p.external[v]) k->advance.push_back(v);
  const std::vector<int>& seq = k->advance;
  std::vector<int> latest(g.size(), -1), end(seq.size());
  for (size_t j = 0; j < seq.size(); ++j) {
    end[j] = p.exported[seq[j]] ? static_cast<int>(seq.size()) - 1 : static_cast<int>(j);
    for (int u : g.nodes[seq[j]].inputs)
      if (latest[u] >= 0) end[latest[u]] = std::max(end[latest[u]], static_cast<int>(j));
    latest[seq[j]] = static_cast<int>(j);
    k->advance_cost += g.nodes[seq[j]].cost;
  }
  std::vector<int64_t> delta(seq.size() + 1, 0);
  for (size_t j = 0; j < seq.size(); ++j) {
    delta[j] += g.nodes[seq[j]].bytes;
    delta[end[j] + 1] -= g.nodes[seq[j]].bytes;
  }
  int64_t cur = 0;
  for (size_t j = 0; j < seq.size(); ++j)
    k->advance_peak = std::max(k->advance_peak, cur += delta[j]);
}

// At most `cap` strategies, spread over the cost range (the cheapest and the leanest kept).
void thin(size_t cap, std::vector<Strategy>* list) {
  if (list->size() <= cap) return;
  std::vector<Strategy> kept;
  const double step = static_cast<double>(list->size() - 1) / static_cast<double>(cap - 1);
  for (size_t i = 0; i < cap; ++i)
    kept.push_back(std::move((*list)[static_cast<size_t>(std::lround(step * i))]));
  *list = std::move(kept);
}

}  // namespace

KindPlan plan_kind(const BlockProblem& p, double seconds, bool verbose) {
  const auto t0 = std::chrono::steady_clock::now();
  Deadline deadline(seconds);
  KindPlan k;
  k.nodes = p.sub.size();
  Candidates c;
  c.add(p, file_order(p.sub), "keep all");
  keep_set_strategies(p, &c);
  greedy_strategies(p, 8, deadline, &c);
  if (cbc_can_solve(p.sub, seconds)) checkmate_grid(p, 17, deadline, seconds, verbose, &c, &k);
  k.solver = k.grid_solved > 0
                 ? "checkmate"
                 : absl::StrCat("keep sets and greedy (CBC: ", p.sub.size(), " nodes, ",
                                absl::StrFormat("%.2g", seconds), " s share: not tried)");
  std::vector<Strategy> all = std::move(c.list);
  k.candidates = static_cast<int>(all.size());
  keep_pareto_front(&all);
  thin(24, &all);
  k.strategies = std::move(all);
  advance(p, &k);
  k.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (verbose)
    fprintf(stderr, "rockmate: kind of %d nodes: %d strategies from %d (%s, %d grid solves)\n",
            k.nodes, static_cast<int>(k.strategies.size()), k.candidates, k.solver.c_str(),
            k.grid_solved);
  return k;
}

}  // namespace remat::detail::rockmate
