// Fitting a plan under the budget with host memory (fit_by_offloads, planner/internal.h).
//
// Note [Fitting by offloads]
// Recomputation cannot go below what one step needs with the values it must keep; host
// memory can, for the values only read far away. Starting from an order over the budget
// (file order, or a plan for a looser budget), each round finds the step where the
// resident bytes peak, and sends to the host the largest instance resident there that the
// step does not read, across the gap between its touches around it (the copy back placed
// as Note [Replacing recomputations by offloads] says, where the budget allows). Rounds go
// on until the peak fits, or nothing resident at the peak can leave, or host memory is
// full. The copies' waits count in the plan's cost; the replacement pass runs afterwards.
#include <algorithm>
#include <cstddef>
#include <optional>

#include "internal.h"
#include "remat/schedule.h"
#include "runtime/ir/instances.h"
#include "runtime/ir/offloads.h"

namespace remat::detail {
namespace {

using std::size_t;

struct Gap {
  int step = -1;  // the instance
  int before = 0, after = 0;
  int64_t bytes = 0;
};

// The largest instance resident at step p, without an offload, that step p neither makes
// nor reads (and no graph input unless `inputs_too`), with the touches around p; step -1
// where there is none.
Gap largest_at(const Graph& g, const OffloadedOrder& w, const Instances& in, int p,
               bool inputs_too) {
  std::vector<char> offloaded(w.order.size(), 0);
  for (const Offload& o : w.offloads) offloaded[static_cast<size_t>(o.step)] = 1;
  Gap best;
  for (int i = 0; i < p; ++i) {
    const Node& node = g.nodes[static_cast<size_t>(w.order[static_cast<size_t>(i)])];
    if (offloaded[static_cast<size_t>(i)] || in.last_read[static_cast<size_t>(i)] <= p ||
        node.bytes <= best.bytes || (!inputs_too && is_graph_input(node)))
      continue;
    const int64_t bytes = node.bytes;
    const std::vector<int> touches = touches_of(g, w.order, i);
    const auto after = std::upper_bound(touches.begin(), touches.end(), p);
    if (after == touches.end() || *(after - 1) == p) continue;  // read at p
    best = {i, *(after - 1), *after, bytes};
  }
  return best;
}

}  // namespace

std::optional<OffloadedOrder> fit_by_offloads(const Graph& g, OffloadedOrder w,
                                              const PlanOptions& opt, const Deadline& deadline) {
  if (!opt.budget_bytes || opt.host_memory_bytes <= 0) return std::nullopt;
  const Instances in = compute_instances(g, w.order);
  if (!in.error.empty()) return std::nullopt;
  while (!deadline.expired()) {
    const Schedule s = schedule_with(g, w.order, w.offloads);
    std::vector<int64_t> mem = memory_profile(g, s.order);
    const std::vector<int64_t> host = apply_offloads(g, s, &mem);
    if (!host.empty() && *std::max_element(host.begin(), host.end()) > opt.host_memory_bytes)
      return std::nullopt;
    const int p = static_cast<int>(std::max_element(mem.begin(), mem.end()) - mem.begin());
    if (mem[static_cast<size_t>(p)] <= *opt.budget_bytes) return w;
    const Gap gap = largest_at(g, w, in, p, opt.offload_inputs);
    if (gap.step < 0) return std::nullopt;
    w.offloads.push_back({gap.step, gap.before + 1, gap.after});
    // The peak's step stays in the gap: the bytes do not fit there.
    if (!place_copies(g, opt, w.order, &w.offloads, w.offloads.size() - 1)) return std::nullopt;
  }
  return std::nullopt;
}

}  // namespace remat::detail
