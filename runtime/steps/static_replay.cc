#include "remat/static_replay.h"

#include <absl/strings/str_cat.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "runtime/ir/instances.h"

namespace remat {
namespace {

TensorSpec bytes_spec(std::int64_t bytes) {
  return TensorSpec{{std::max<std::int64_t>(bytes, 0)}, DType::kU8};
}

}  // namespace

absl::StatusOr<StaticReplayResult> static_replay(const Graph& g, const Schedule& s,
                                                 const StaticReplayOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  const int n = g.size();
  const std::size_t steps = s.order.size();
  // Instance lifetimes, as docs/formats.md defines them.
  const Instances instances = ComputeInstances(g, s.order);
  if (!instances.error.empty())
    return absl::InvalidArgumentError(absl::StrCat("schedule ", instances.error));
  const std::vector<int>& last_read = instances.last_read;
  const std::vector<int>& next_instance = instances.next_instance;
  std::vector<std::vector<int>> dies_after(steps);
  for (std::size_t j = 0; j < steps; ++j)
    dies_after[static_cast<std::size_t>(last_read[j])].push_back(static_cast<int>(j));

  RuntimeOptions ro;
  ro.backend = Backend::kSimulated;
  ro.accounting = options.accounting;
  ro.policy = "lru";  // never asked: there is no budget
  ro.record_timeline = options.record_timeline;
  ro.allocator = options.allocator;
  Runtime rt(ro);
  const std::vector<int> readers = reader_counts(g);
  std::vector<Tensor> value(static_cast<std::size_t>(n));
  std::vector<OpPtr> op(static_cast<std::size_t>(n));
  StaticReplayResult r;
  double input_cost = 0;
  std::vector<Tensor> args;
  for (std::size_t j = 0; j < steps; ++j) {
    const int v = s.order[j];
    const Node& node = g.nodes[static_cast<std::size_t>(v)];
    Tensor& t = value[static_cast<std::size_t>(v)];
    if (op[static_cast<std::size_t>(v)] == nullptr) {  // first instance
      if (is_graph_input(node)) {
        // Not a constant: a pinned constant stays while any lineage that reads it lives,
        // and the schedule frees inputs after their last read. An op of no inputs frees
        // with its handle; with no budget nothing evicts it, so it is never rerun.
        auto def = std::make_shared<OpDef>();
        def->name = "input";
        op[static_cast<std::size_t>(v)] = def;
        t = rt.call_with(def, {}, Outputs{bytes_spec(node.bytes)}, 0.0).at(0);
        input_cost += node.cost;
      } else {
        auto def = std::make_shared<OpDef>();
        def->name = node.op.empty() ? node.name : node.op;
        op[static_cast<std::size_t>(v)] = def;
        args.clear();
        for (int u : node.inputs) args.push_back(value[static_cast<std::size_t>(u)]);
        Outputs outs;
        if (!no_output(node, readers)) outs.emplace_back(bytes_spec(node.bytes));
        std::vector<Tensor> made = rt.call_with(def, args, outs, node.cost);
        args.clear();  // the handles it holds would keep the inputs alive
        if (!made.empty()) t = std::move(made[0]);
      }
    } else {
      rt.materialize(t);  // its inputs' instances are resident: the schedule made them
    }
    for (int i : dies_after[j]) {
      Tensor& dying = value[static_cast<std::size_t>(s.order[static_cast<std::size_t>(i)])];
      if (next_instance[static_cast<std::size_t>(i)] >= 0) {
        if (rt.evict(dying)) ++r.evictions;
      } else {
        dying.reset();
      }
    }
  }
  const RuntimeStats st = rt.stats();
  r.peak_reserved_bytes = st.memory.peak_reserved;
  r.peak_allocated_bytes = st.memory.peak_allocated;
  r.cost = rt.clock() + input_cost;
  double base = 0;
  for (const Node& node : g.nodes) base += node.cost;
  r.overhead = base > 0 ? r.cost / base - 1.0 : 0.0;
  r.recomputations = st.recomputations;
  if (options.record_timeline) r.timeline = rt.timeline();
  r.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

}  // namespace remat
