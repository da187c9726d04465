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

namespace remat::detail {

std::vector<int> execute_keep_set_retained(const Graph& g, const std::vector<char>& keep);

namespace {

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

int in(int v) { return 2 * v; }
int out(int v) { return 2 * v + 1; }

// Builds the flow network and cuts it; returns, for in(v) and out(v) of every node v,
// whether that vertex is on the source side of the minimum cut.
std::vector<char> min_cut_source_side(const Graph& g, const std::vector<std::vector<int>>& users) {
  const int n = g.size();
  long long total = 1;
  for (const Node& v : g.nodes) total += v.bytes;
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
  auto color = boost::get(boost::vertex_color, fg);
  std::vector<char> source_side(2 * n, 0);
  for (int x = 0; x < 2 * n; ++x) source_side[x] = color[x] == boost::black_color;
  return source_side;
}

}  // namespace
#pragma GCC diagnostic pop

namespace {

// Forward graph: the forward nodes on the source side of the cut (in_fwd), in file order;
// values not saved (keep) die after their last reader there. Backward graph: everything
// else in file order, recomputing what it needs; nothing is freed there before its last
// reader.
void execute_partition(const Graph& g, const std::vector<std::vector<int>>& users,
                       const std::vector<char>& keep, const std::vector<char>& in_fwd,
                       RawPlan* plan) {
  const int n = g.size();
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
    ex.ensure(v.id);
    for (int u : g.nodes[v.id].inputs) {
      if (--fwd_left[u] == 0 && !keep[u] && g.nodes[u].can_recompute()) ex.drop(u);
    }
    if (fwd_left[v.id] == 0 && !keep[v.id] && v.can_recompute()) ex.drop(v.id);
  }
  plan->backward_start = static_cast<int>(ex.order().size());
  for (const Node& v : g.nodes) {
    if (in_fwd[v.id]) continue;
    ex.ensure(v.id);
    for (int u : g.nodes[v.id].inputs) {
      if (--left[u] == 0) ex.drop(u);
    }
    if (left[v.id] == 0) ex.drop(v.id);
  }
  plan->order = ex.order();
}

// With a budget the partition's order goes through the XLA-style repair when it peaks
// above it.
void repair_to_budget(const Graph& g, const PlanOptions& opt, RawPlan* plan) {
  if (!opt.budget_bytes) return;
  Schedule s{g.name, plan->order, std::nullopt};
  if (simulate(g, s).peak_bytes > *opt.budget_bytes) {
    Deadline d(opt);
    GreedyParams gp;
    plan->order = repair_order(g, plan->order, *opt.budget_bytes, gp, &d);
    plan->backward_start.reset();
    plan->note = "min-cut partition, then repaired to the budget";
  }
}

}  // namespace

absl::StatusOr<RawPlan> plan_mincut(const Graph& g, const PlanOptions& opt) {
  RawPlan plan;
  const int n = g.size();
  bool has_backward = false;
  for (const Node& v : g.nodes) has_backward |= v.phase == Phase::kBackward;
  if (!has_backward) {
    for (int v = 0; v < n; ++v) plan.order.push_back(v);
    plan.note = "no backward phase: nothing to partition, file order";
    return plan;
  }
  auto users = g.users();
  const std::vector<char> source_side = min_cut_source_side(g, users);
  // Saved values: forward nodes whose split edge is cut. The forward graph: the forward
  // nodes that the cut leaves on the source side.
  std::vector<char> keep(n, 0), in_fwd(n, 0);
  for (const Node& v : g.nodes) {
    if (v.phase == Phase::kBackward) continue;
    if (source_side[in(v.id)] && !source_side[out(v.id)]) keep[v.id] = 1;
    in_fwd[v.id] = v.phase == Phase::kForward && source_side[in(v.id)];
  }
  execute_partition(g, users, keep, in_fwd, &plan);
  repair_to_budget(g, opt, &plan);
  return plan;
}

}  // namespace remat::detail
