#include "remat/static_replay.h"

#include "remat/instances.h"

#include <absl/strings/str_cat.h>

#include <algorithm>
#include <chrono>
#include <cmath>

namespace remat {
namespace {

bool is_input(const Node& n) { return n.kind == NodeKind::kInput || n.kind == NodeKind::kTangent; }

TensorSpec bytes_spec(std::int64_t bytes) {
  return TensorSpec{{std::max<std::int64_t>(bytes, 0)}, DType::kU8};
}

// A node with no bytes that nothing reads is run for its cost only (no output tensor): an
// allocator would round even an empty request up to its smallest block.
bool no_output(const Node& n, const std::vector<int>& readers) {
  return n.bytes == 0 && readers[static_cast<std::size_t>(n.id)] == 0;
}

std::vector<int> reader_counts(const Graph& g) {
  std::vector<int> readers(g.nodes.size(), 0);
  for (const Node& n : g.nodes)
    for (int u : n.inputs)
      if (u >= 0 && u < g.size()) ++readers[static_cast<std::size_t>(u)];
  return readers;
}

}  // namespace

absl::StatusOr<StaticReplayResult> static_replay(const Graph& g, const Schedule& s,
                                                 const StaticReplayOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  const int n = g.size();
  const std::size_t steps = s.order.size();
  // Instance lifetimes, as FORMAT.md defines them.
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
      if (is_input(node)) {
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
  r.wall_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

DtrTrace dtr_trace_from_graph(const Graph& g) {
  DtrTrace trace;
  trace.name = g.name;
  const std::size_t n = g.nodes.size();
  const std::vector<int> readers = reader_counts(g);
  std::vector<int> last_reader(n, -1);
  for (const Node& node : g.nodes)
    for (int u : node.inputs) last_reader[static_cast<std::size_t>(u)] = node.id;
  double max_cost = 0;
  for (const Node& node : g.nodes) max_cost = std::max(max_cost, node.cost);
  const double scale = max_cost > 0 ? 1e9 / max_cost : 1.0;
  std::vector<std::vector<int>> release_after(n);
  for (std::size_t v = 0; v < n; ++v) {
    const int at = last_reader[v] >= 0 ? last_reader[v] : static_cast<int>(v);
    release_after[static_cast<std::size_t>(at)].push_back(static_cast<int>(v));
  }
  bool backward = false;
  for (std::size_t v = 0; v < n; ++v) {
    const Node& node = g.nodes[v];
    trace.handle_names.push_back(absl::StrCat("n", v));
    DtrInstruction in;
    if (is_input(node)) {
      in.kind = DtrInstruction::Kind::kConstant;
      in.results = {static_cast<std::uint32_t>(v)};
      in.bytes = {static_cast<std::uint64_t>(std::max<std::int64_t>(node.bytes, 0))};
    } else {
      if (!backward && node.phase == Phase::kBackward) {
        backward = true;
        DtrInstruction mark;
        mark.kind = DtrInstruction::Kind::kBackward;
        trace.instructions.push_back(mark);
      }
      in.kind = DtrInstruction::Kind::kCall;
      in.op = node.op.empty() ? node.name : node.op;
      for (int u : node.inputs) in.args.push_back(static_cast<std::uint32_t>(u));
      in.time_ns = static_cast<std::uint64_t>(std::llround(std::max(0.0, node.cost) * scale));
      trace.total_time_ns += in.time_ns;
      if (!no_output(node, readers)) {
        in.results = {static_cast<std::uint32_t>(v)};
        in.bytes = {static_cast<std::uint64_t>(std::max<std::int64_t>(node.bytes, 0))};
        in.alias = {-1};
      }
    }
    const bool made = !in.results.empty();
    trace.instructions.push_back(std::move(in));
    for (int u : release_after[v]) {
      if (static_cast<std::size_t>(u) == v && !made) continue;
      DtrInstruction rel;
      rel.kind = DtrInstruction::Kind::kRelease;
      rel.dst = static_cast<std::uint32_t>(u);
      trace.instructions.push_back(rel);
    }
  }
  return trace;
}

std::vector<StepSite> recorded_sites(const Graph& g) {
  std::vector<StepSite> sites(g.nodes.size());
  for (std::size_t v = 0; v < g.nodes.size(); ++v)
    if (!is_input(g.nodes[v])) sites[v] = {g.nodes[v].site_position, g.nodes[v].site_output};
  return sites;
}

std::vector<StepSite> trace_sites(const Graph& g) {
  std::vector<StepSite> sites(g.nodes.size());
  const std::vector<int> readers = reader_counts(g);
  int position = 0;
  for (std::size_t v = 0; v < g.nodes.size(); ++v) {
    const Node& node = g.nodes[v];
    if (is_input(node)) continue;
    sites[v] = {position++, no_output(node, readers) ? -1 : 0};
  }
  return sites;
}

absl::StatusOr<Schedule> realized_schedule(const Graph& g, const std::vector<StepSite>& sites,
                                           const std::vector<int>& executed) {
  if (sites.size() != g.nodes.size())
    return absl::InvalidArgumentError(absl::StrCat("realized_schedule: ", sites.size(),
                                                   " sites for ", g.nodes.size(), " nodes"));
  std::vector<std::vector<int>> at;  // position -> its nodes, by output
  for (std::size_t v = 0; v < g.nodes.size(); ++v) {
    if (is_input(g.nodes[v]) || sites[v].position < 0) continue;
    const auto p = static_cast<std::size_t>(sites[v].position);
    if (at.size() <= p) at.resize(p + 1);
    at[p].push_back(static_cast<int>(v));
  }
  for (auto& nodes : at)
    std::sort(nodes.begin(), nodes.end(), [&](int a, int b) {
      return sites[static_cast<std::size_t>(a)].output < sites[static_cast<std::size_t>(b)].output;
    });
  Schedule s;
  s.graph = g.name;
  std::vector<bool> made(g.nodes.size(), false);
  // A node that ran nowhere in the step (an input, or a node HoldInputs added) comes right
  // before its first reader, after its own inputs (their ids are smaller: no recursion).
  auto place = [&](int v, auto&& self) -> void {
    if (made[static_cast<std::size_t>(v)]) return;
    for (int u : g.nodes[static_cast<std::size_t>(v)].inputs)
      if (!made[static_cast<std::size_t>(u)] && sites[static_cast<std::size_t>(u)].position < 0)
        self(u, self);
    s.order.push_back(v);
    made[static_cast<std::size_t>(v)] = true;
  };
  for (int p : executed) {
    if (p < 0 || static_cast<std::size_t>(p) >= at.size() || at[static_cast<std::size_t>(p)].empty())
      return absl::InvalidArgumentError(
          absl::StrCat("realized_schedule: no node of the graph ran at position ", p));
    for (int v : at[static_cast<std::size_t>(p)]) {
      for (int u : g.nodes[static_cast<std::size_t>(v)].inputs)
        if (sites[static_cast<std::size_t>(u)].position < 0) place(u, place);
      s.order.push_back(v);
      made[static_cast<std::size_t>(v)] = true;
    }
  }
  // What nothing in the step read (the last node HoldInputs adds): at the end, in order.
  for (std::size_t v = 0; v < g.nodes.size(); ++v)
    if (sites[v].position < 0) place(static_cast<int>(v), place);
  return s;
}

Graph HoldInputs(Graph g) {
  std::vector<int> inputs;
  std::vector<bool> input(g.nodes.size(), false);
  for (const Node& node : g.nodes) {
    if (!is_input(node)) continue;
    inputs.push_back(node.id);
    input[static_cast<std::size_t>(node.id)] = true;
  }
  if (inputs.empty()) return g;
  // New ids: the inputs first, in their order, then `inputs_ready`, then the other nodes.
  const int n = g.size();
  std::vector<int> id(static_cast<std::size_t>(n));
  int next = 0;
  for (int v : inputs) id[static_cast<std::size_t>(v)] = next++;
  const int ready = next++;
  for (int v = 0; v < n; ++v)
    if (!input[static_cast<std::size_t>(v)]) id[static_cast<std::size_t>(v)] = next++;
  Graph out;
  out.name = g.name;
  out.source = g.source;
  out.peer = g.peer;
  out.nodes.resize(static_cast<std::size_t>(n) + 2);
  for (Node& node : g.nodes) {
    // (Nodes already moved into `out` are read only through `input`.)
    const bool root = !input[static_cast<std::size_t>(node.id)] &&
                      std::all_of(node.inputs.begin(), node.inputs.end(), [&](int u) {
                        return input[static_cast<std::size_t>(u)];
                      });
    for (int& u : node.inputs) u = id[static_cast<std::size_t>(u)];
    if (root) node.inputs.push_back(ready);
    node.id = id[static_cast<std::size_t>(node.id)];
    out.nodes[static_cast<std::size_t>(node.id)] = std::move(node);
  }
  for (int v : g.outputs) out.outputs.push_back(id[static_cast<std::size_t>(v)]);
  Node& start = out.nodes[static_cast<std::size_t>(ready)];
  start.id = ready;
  start.name = start.op = "inputs_ready";
  start.phase = Phase::kForward;
  for (int v : inputs) start.inputs.push_back(id[static_cast<std::size_t>(v)]);
  Node& sink = out.nodes.back();
  sink.id = n + 1;
  sink.name = sink.op = "hold_inputs";
  sink.phase = Phase::kBackward;
  sink.recomputable = false;
  sink.inputs = start.inputs;
  return out;
}

bool HoldInputsToTheEnd(const Graph& g, Schedule& s) {
  if (g.nodes.empty() || g.nodes.back().op != "hold_inputs" || s.order.empty()) return false;
  const int sink = g.size() - 1;
  if (s.order.back() == sink) return false;
  const auto before = s.order.size();
  std::erase(s.order, sink);
  if (s.order.size() == before) return false;  // not in the schedule: Simulate() will say so
  s.order.push_back(sink);
  return true;
}

}  // namespace remat
