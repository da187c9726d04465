// remat/graph.h: the computation-graph IR of the offline planner (format remat-graph-v1).
//
// Usage:
//   absl::StatusOr<remat::Graph> g = remat::read_graph_file("../shared/graphs/rlg_n100.json");
//   if (!g.ok()) { std::cerr << g.status() << "\n"; return 1; }
//   for (const remat::Node& n : g->nodes) std::cout << n.name << " " << n.bytes << "\n";
//   std::string text = remat::write_graph(*g);   // round-trips through parse_graph
//
// A graph lists its nodes in topological order, nodes[i].id == i, and every input id of a
// node is smaller than its own id. validate_graph() checks this for graphs built in code.
#ifndef REMAT_GRAPH_H_
#define REMAT_GRAPH_H_

#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace remat {

enum class NodeKind { kCompute, kView, kInput, kTangent };
enum class Phase { kForward, kBackward };

// Inline, so that the runtime (which reads graphs but does not link the planner) has it too.
inline const char* kind_name(NodeKind k) {
  switch (k) {
    case NodeKind::kCompute:
      return "compute";
    case NodeKind::kView:
      return "view";
    case NodeKind::kInput:
      return "input";
    case NodeKind::kTangent:
      return "tangent";
  }
  return "compute";
}
const char* phase_name(Phase p);

struct Node {
  int id = 0;
  std::string name;
  std::string op;
  NodeKind kind = NodeKind::kCompute;
  Phase phase = Phase::kForward;
  int64_t bytes = 0;
  double cost = 0.0;
  std::optional<double> flops;
  std::vector<int> inputs;       // ids of the nodes it reads, all smaller than id
  std::optional<int64_t> group;  // multi-output operator this node belongs to
  bool recomputable = true;      // false: may be computed only once
  bool pytorch_banned = false;   // PyTorch's partitioner would never recompute it
  // Extension of remat-graph-v1 for steps the runtime recorded (written as "site": [p, k]):
  // the node is output `site_output` of the op at position `site_position` in the step
  // (the runtime's n-th call of the step). Hints are keyed by it; -1 where unknown.
  int site_position = -1;
  int site_output = 0;

  // Whether a schedule may compute this node more than once.
  bool can_recompute() const {
    return recomputable && kind != NodeKind::kInput && kind != NodeKind::kTangent;
  }
};

// Reference figures from other systems; planners ignore them.
struct PeerFigures {
  std::optional<int64_t> pytorch_mincut_saved_bytes;
  std::vector<int> pytorch_mincut_saved;
  std::optional<double> pytorch_mincut_seconds;
  std::optional<int64_t> pytorch_default_saved_bytes;
};

struct Graph {
  std::string name;
  std::string source;
  std::vector<Node> nodes;
  std::vector<int> outputs;
  PeerFigures peer;
  // Whether a group's operator makes all its outputs in one run, as the runtime runs an op
  // (a step it recorded): then a run of consecutive steps computing members of one group
  // costs the operator's whole cost once, and a member computed apart costs it all (see
  // step_costs in remat/schedule.h). Written "whole_groups": true; false in the shared
  // graphs, where each member is its own step.
  bool whole_groups = false;

  int size() const { return static_cast<int>(nodes.size()); }
  // users()[v]: the ids of the nodes reading v, ascending, without duplicates.
  std::vector<std::vector<int>> users() const;
  // Sum of all node costs: the cost of computing every node once.
  double total_cost() const;
};

// Checks the structural rules of remat-graph-v1; the error names the offending node.
absl::Status validate_graph(const Graph& g);

absl::StatusOr<Graph> parse_graph(std::string_view json_text);
absl::StatusOr<Graph> read_graph_file(const std::string& path);
std::string write_graph(const Graph& g);
absl::Status write_graph_file(const Graph& g, const std::string& path);

}  // namespace remat

#endif  // REMAT_GRAPH_H_
