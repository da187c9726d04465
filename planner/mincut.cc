// mincut: the max-flow/min-cut choice of the forward values to save for the backward pass
// (AOTAutograd's min_cut_rematerialization_partition): source -> inputs and nodes that may
// not be recomputed (pytorch_banned), backward nodes -> sink, each forward node split in
// two joined by an edge of capacity = its bytes. The cut edges are the saved values; the
// rest of the forward values are recomputed in the backward from them. With a budget the
// XLA-style repair trims the peak further.
#include <algorithm>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <boost/graph/adjacency_list.hpp>
#include <boost/graph/boykov_kolmogorov_max_flow.hpp>

#include "internal.h"
#include "remat/schedule.h"

namespace remat::internal {

std::vector<int> ExecuteKeepSetRetained(const Graph& g, const std::vector<char>& keep);

absl::StatusOr<RawPlan> PlanMincut(const Graph& g, const PlanOptions& opt) {
  using Traits = boost::adjacency_list_traits<boost::vecS, boost::vecS, boost::directedS>;
  using FlowGraph = boost::adjacency_list<
      boost::vecS, boost::vecS, boost::directedS,
      boost::property<boost::vertex_index_t, long,
                      boost::property<boost::vertex_color_t, boost::default_color_type,
                                      boost::property<boost::vertex_distance_t, long,
                                                      boost::property<boost::vertex_predecessor_t,
                                                                      Traits::edge_descriptor>>>>,
      boost::property<
          boost::edge_capacity_t, long long,
          boost::property<boost::edge_residual_capacity_t, long long,
                          boost::property<boost::edge_reverse_t, Traits::edge_descriptor>>>>;
  RawPlan plan;
  const int n = g.size();
  bool has_backward = false;
  long long total = 1;
  for (const Node& v : g.nodes) {
    has_backward |= v.phase == Phase::kBackward;
    total += v.bytes;
  }
  if (!has_backward) {
    for (int v = 0; v < n; ++v) plan.order.push_back(v);
    plan.note = "no backward phase: nothing to partition, file order";
    return plan;
  }
  const long long inf = std::min<long long>(total, (1LL << 60) / (n + 2)) * 4 + 1;
  FlowGraph fg(2 * n + 2);
  const int src = 2 * n, snk = 2 * n + 1;
  auto cap = boost::get(boost::edge_capacity, fg);
  auto rev = boost::get(boost::edge_reverse, fg);
  auto add = [&](int a, int b, long long c) {
    auto e1 = boost::add_edge(a, b, fg).first;
    auto e2 = boost::add_edge(b, a, fg).first;
    cap[e1] = c;
    cap[e2] = 0;
    rev[e1] = e2;
    rev[e2] = e1;
  };
  auto in = [](int v) { return 2 * v; };
  auto out = [](int v) { return 2 * v + 1; };
  auto users = g.users();
  for (const Node& v : g.nodes) {
    if (v.phase == Phase::kBackward) {
      add(in(v.id), snk, inf);
      continue;
    }
    if (!v.can_recompute() || v.pytorch_banned) add(src, in(v.id), inf);
    add(in(v.id), out(v.id), std::max<long long>(v.bytes, 0));
    for (int w : users[v.id]) add(out(v.id), in(w), inf);
  }
  boost::boykov_kolmogorov_max_flow(fg, src, snk);
#pragma GCC diagnostic pop
  auto color = boost::get(boost::vertex_color, fg);
  std::vector<char> keep(n, 0);
  for (const Node& v : g.nodes) {
    if (v.phase == Phase::kBackward) continue;
    bool in_src = color[in(v.id)] == boost::black_color;
    bool out_src = color[out(v.id)] == boost::black_color;
    if (in_src && !out_src) keep[v.id] = 1;
  }
  // Forward graph: the forward nodes on the source side of the cut, in file order; values
  // not saved die after their last reader there. Backward graph: everything else in file
  // order, recomputing what it needs; nothing is freed there before its last reader.
  std::vector<char> in_fwd(n, 0);
  for (const Node& v : g.nodes) {
    in_fwd[v.id] = v.phase == Phase::kForward && color[in(v.id)] == boost::black_color;
  }
  std::vector<int> fwd_left(n, 0), left(n, 0);
  for (const Node& v : g.nodes) {
    for (int u : users[v.id]) {
      ++left[v.id];
      if (in_fwd[u]) ++fwd_left[v.id];
    }
  }
  Executor ex(g);
  for (const Node& v : g.nodes) {
    if (!in_fwd[v.id]) continue;
    ex.Ensure(v.id);
    for (int u : g.nodes[v.id].inputs) {
      if (--fwd_left[u] == 0 && !keep[u] && g.nodes[u].can_recompute()) ex.Drop(u);
    }
    if (fwd_left[v.id] == 0 && !keep[v.id] && v.can_recompute()) ex.Drop(v.id);
  }
  plan.backward_start = static_cast<int>(ex.order().size());
  for (const Node& v : g.nodes) {
    if (in_fwd[v.id]) continue;
    ex.Ensure(v.id);
    for (int u : g.nodes[v.id].inputs) {
      if (--left[u] == 0) ex.Drop(u);
    }
    if (left[v.id] == 0) ex.Drop(v.id);
  }
  plan.order = ex.order();
  if (opt.budget_bytes) {
    Schedule s{g.name, plan.order, std::nullopt};
    if (simulate(g, s).peak_bytes > *opt.budget_bytes) {
      Deadline d(opt.time_limit_seconds);
      GreedyParams gp;
      plan.order = RepairOrder(g, plan.order, *opt.budget_bytes, gp, &d);
      plan.backward_start.reset();
      plan.note = "min-cut partition, then repaired to the budget";
    }
  }
  return plan;
}

}  // namespace remat::internal
