// Graph transforms between the planner's and the runtime's views of a step: the sites of a
// graph's nodes, the schedule a recorded step realized, held inputs, and a graph as a DTR
// log program.
#include "remat/graph_transforms.h"

#include <absl/strings/str_cat.h>

#include <algorithm>
#include <cmath>

#include "runtime/ir/instances.h"

namespace remat {

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
    if (is_graph_input(node)) {
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
    if (!is_graph_input(g.nodes[v])) sites[v] = {g.nodes[v].site_position, g.nodes[v].site_output};
  return sites;
}

std::vector<StepSite> trace_sites(const Graph& g) {
  std::vector<StepSite> sites(g.nodes.size());
  const std::vector<int> readers = reader_counts(g);
  int position = 0;
  for (std::size_t v = 0; v < g.nodes.size(); ++v) {
    const Node& node = g.nodes[v];
    if (is_graph_input(node)) continue;
    sites[v] = {position++, no_output(node, readers) ? -1 : 0};
  }
  return sites;
}

absl::StatusOr<Schedule> realized_schedule(const Graph& g, const std::vector<StepSite>& sites,
                                           const std::vector<int>& executed) {
  if (sites.size() != g.nodes.size())
    return absl::InvalidArgumentError(
        absl::StrCat("realized_schedule: ", sites.size(), " sites for ", g.nodes.size(), " nodes"));
  std::vector<std::vector<int>> at;  // position -> its nodes, by output
  for (std::size_t v = 0; v < g.nodes.size(); ++v) {
    if (is_graph_input(g.nodes[v]) || sites[v].position < 0) continue;
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
  // A node that ran nowhere in the step (an input, or a node hold_inputs added) comes right
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
    if (p < 0 || static_cast<std::size_t>(p) >= at.size() ||
        at[static_cast<std::size_t>(p)].empty())
      return absl::InvalidArgumentError(
          absl::StrCat("realized_schedule: no node of the graph ran at position ", p));
    for (int v : at[static_cast<std::size_t>(p)]) {
      for (int u : g.nodes[static_cast<std::size_t>(v)].inputs)
        if (sites[static_cast<std::size_t>(u)].position < 0) place(u, place);
      s.order.push_back(v);
      made[static_cast<std::size_t>(v)] = true;
    }
  }
  // What nothing in the step read (the last node hold_inputs adds): at the end, in order.
  for (std::size_t v = 0; v < g.nodes.size(); ++v)
    if (sites[v].position < 0) place(static_cast<int>(v), place);
  return s;
}

Graph hold_inputs(Graph g) {
  std::vector<int> inputs;
  std::vector<bool> input(g.nodes.size(), false);
  for (const Node& node : g.nodes) {
    if (!is_graph_input(node)) continue;
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
  out.whole_groups = g.whole_groups;
  out.nodes.resize(static_cast<std::size_t>(n) + 2);
  for (Node& node : g.nodes) {
    // (Nodes already moved into `out` are read only through `input`.)
    const bool root = !input[static_cast<std::size_t>(node.id)] &&
                      std::all_of(node.inputs.begin(), node.inputs.end(),
                                  [&](int u) { return input[static_cast<std::size_t>(u)]; });
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

bool hold_inputs_to_the_end(const Graph& g, Schedule& s) {
  if (g.nodes.empty() || g.nodes.back().op != "hold_inputs" || s.order.empty()) return false;
  const int sink = g.size() - 1;
  if (s.order.back() == sink) return false;
  const auto before = s.order.size();
  std::erase(s.order, sink);
  if (s.order.size() == before) return false;  // not in the schedule: simulate() will say so
  s.order.push_back(sink);
  return true;
}

}  // namespace remat
