#include "remat/static_replay.h"

#include <absl/strings/str_cat.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "runtime/ir/instances.h"
#include "runtime/ir/offloads.h"

namespace remat {
namespace {

TensorSpec bytes_spec(std::int64_t bytes) {
  return TensorSpec{{std::max<std::int64_t>(bytes, 0)}, DType::kU8};
}

RuntimeOptions replay_options(const Graph& g, const Schedule& s,
                              const StaticReplayOptions& options) {
  RuntimeOptions ro;
  ro.host_link = options.host_link;
  for (const Offload& o : s.offloads)  // room for every offload at once
    ro.host_memory_bytes += static_cast<std::size_t>(std::max<std::int64_t>(
        0, g.nodes[static_cast<std::size_t>(s.order[static_cast<std::size_t>(o.step)])].bytes));
  ro.backend = Backend::kSimulated;
  ro.accounting = options.accounting;
  ro.policy = "lru";  // never asked: there is no budget
  ro.record_timeline = options.record_timeline;
  ro.allocator = options.allocator;
  return ro;
}

// A schedule run step by step on a runtime with no budget: each node's tensor, and the op
// that made its first instance.
class ScheduleRun {
 public:
  ScheduleRun(const Graph& g, const Schedule& s, const StaticReplayOptions& options)
      : g_(g),
        rt_(replay_options(g, s, options)),
        readers_(reader_counts(g)),
        value_(g.nodes.size()),
        op_(g.nodes.size()) {}

  // The step computing node v: its first instance is a new op (an input's, an op of no
  // inputs); a later one is the runtime recomputing the evicted tensor.
  void compute(int v) {
    const Node& node = g_.nodes[static_cast<std::size_t>(v)];
    Tensor& t = value_[static_cast<std::size_t>(v)];
    if (op_[static_cast<std::size_t>(v)] != nullptr) {
      rt_.materialize(t);  // its inputs' instances are resident: the schedule made them
      return;
    }
    auto def = std::make_shared<OpDef>();
    op_[static_cast<std::size_t>(v)] = def;
    if (is_graph_input(node)) {
      // Not a constant: a pinned constant stays while any lineage that reads it lives, and
      // the schedule frees inputs after their last read. An op of no inputs frees with its
      // handle; with no budget nothing evicts it, so it is never rerun.
      def->name = "input";
      t = rt_.call_with(def, {}, Outputs{bytes_spec(node.bytes)}, 0.0).at(0);
      input_cost_ += node.cost;
      return;
    }
    def->name = node.op.empty() ? node.name : node.op;
    args_.clear();
    for (int u : node.inputs) args_.push_back(value_[static_cast<std::size_t>(u)]);
    Outputs outs;
    if (!no_output(node, readers_)) outs.emplace_back(bytes_spec(node.bytes));
    std::vector<Tensor> made = rt_.call_with(def, args_, outs, node.cost);
    args_.clear();  // the handles it holds would keep the inputs alive
    if (!made.empty()) t = std::move(made[0]);
  }

  // An instance read for the last time: evicted where another instance follows, else let go.
  void drop(int v, bool another_follows, StaticReplayResult& r) {
    Tensor& dying = value_[static_cast<std::size_t>(v)];
    if (another_follows) {
      if (rt_.evict(dying)) ++r.evictions;
    } else {
      dying.reset();
    }
  }

  // After the step that makes an offloaded instance its copy to the host starts; before
  // step `free` it leaves the device, and before step `fetch` its copy back starts.
  void copy_out(int v) { rt_.copy_to_host(value_[static_cast<std::size_t>(v)]); }
  void offload(int v, StaticReplayResult& r) {
    if (rt_.offload(value_[static_cast<std::size_t>(v)])) ++r.offloads;
  }
  void fetch(int v) { rt_.prefetch(value_[static_cast<std::size_t>(v)]); }

  void finish(StaticReplayResult& r, bool record_timeline) const {
    const RuntimeStats st = rt_.stats();
    r.peak_reserved_bytes = st.memory.peak_reserved;
    r.peak_allocated_bytes = st.memory.peak_allocated;
    r.cost = rt_.clock() + input_cost_;
    r.overhead = g_.total_cost() > 0 ? r.cost / g_.total_cost() - 1.0 : 0.0;
    r.recomputations = st.recomputations;
    if (record_timeline) r.timeline = rt_.timeline();
  }

 private:
  const Graph& g_;
  Runtime rt_;
  std::vector<int> readers_;
  std::vector<Tensor> value_;
  std::vector<OpPtr> op_;
  std::vector<Tensor> args_;
  double input_cost_ = 0;
};

}  // namespace

absl::StatusOr<StaticReplayResult> static_replay(const Graph& g, const Schedule& s,
                                                 const StaticReplayOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  const std::size_t steps = s.order.size();
  // Instance lifetimes, as docs/formats.md defines them.
  const Instances instances = compute_instances(g, s.order);
  if (!instances.error.empty())
    return absl::InvalidArgumentError(absl::StrCat("schedule ", instances.error));
  if (std::string err = check_offloads(g, s, instances); !err.empty())
    return absl::InvalidArgumentError(absl::StrCat("schedule ", err));
  std::vector<std::vector<int>> dies_after(steps), freed_at(steps), fetched_at(steps);
  std::vector<char> copied_after(steps, 0);
  for (std::size_t j = 0; j < steps; ++j)
    dies_after[static_cast<std::size_t>(instances.last_read[j])].push_back(static_cast<int>(j));
  for (const Offload& o : s.offloads) {
    copied_after[static_cast<std::size_t>(o.step)] = 1;
    freed_at[static_cast<std::size_t>(o.free)].push_back(s.order[static_cast<std::size_t>(o.step)]);
    fetched_at[static_cast<std::size_t>(o.fetch)].push_back(
        s.order[static_cast<std::size_t>(o.step)]);
  }
  ScheduleRun run(g, s, options);
  StaticReplayResult r;
  for (std::size_t j = 0; j < steps; ++j) {
    for (int v : freed_at[j]) run.offload(v, r);
    for (int v : fetched_at[j]) run.fetch(v);
    run.compute(s.order[j]);
    if (copied_after[j]) run.copy_out(s.order[j]);
    for (int i : dies_after[j])
      run.drop(s.order[static_cast<std::size_t>(i)],
               instances.next_instance[static_cast<std::size_t>(i)] >= 0, r);
  }
  run.finish(r, options.record_timeline);
  r.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

}  // namespace remat
