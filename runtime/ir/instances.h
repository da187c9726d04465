// The instance lifetimes of a schedule under the memory accounting of docs/formats.md: the
// one computation the simulator, the hint builder and static replay all need. Internal to
// the IR (remat::ir) and its users in this repository; not installed.
//
//   remat::Instances in = remat::compute_instances(g, schedule.order);
//   if (!in.error.empty()) return Invalid(in.error);
//   // in.last_read[j]: the last step reading the instance step j made (j if none)
#ifndef REMAT_RUNTIME_IR_INSTANCES_H_
#define REMAT_RUNTIME_IR_INSTANCES_H_

#include <absl/strings/str_cat.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "remat/graph.h"

namespace remat {

struct Instances {
  std::vector<int> last_read;      // per step: the last step that reads its instance
  std::vector<int> next_instance;  // per step: the step making the next instance of its node, -1
  std::string error;               // why the order is invalid (names step and node); "" if valid
};

inline std::string node_label(const Graph& g, int v) {
  return absl::StrCat("node ", v, " ('", g.nodes[static_cast<std::size_t>(v)].name, "')");
}

// A read at step j uses the newest instance made before j. Stops at the first structural
// error: an unknown id, a read before any instance, a node that may not be recomputed
// computed again, or a node never computed.
inline Instances compute_instances(const Graph& g, const std::vector<int>& order) {
  Instances r;
  const int n = g.size();
  std::vector<int> latest(static_cast<std::size_t>(n), -1);
  r.last_read.assign(order.size(), 0);
  r.next_instance.assign(order.size(), -1);
  for (std::size_t j = 0; j < order.size(); ++j) {
    const int v = order[j];
    if (v < 0 || v >= n) {
      r.error = absl::StrCat("step ", j, ": unknown node id ", v);
      return r;
    }
    const Node& node = g.nodes[static_cast<std::size_t>(v)];
    r.last_read[j] = static_cast<int>(j);
    for (int u : node.inputs) {
      const int inst = latest[static_cast<std::size_t>(u)];
      if (inst < 0) {
        r.error = absl::StrCat("step ", j, ": ", node_label(g, v), " reads ", node_label(g, u),
                               " before any instance of it");
        return r;
      }
      r.last_read[static_cast<std::size_t>(inst)] = static_cast<int>(j);
    }
    if (const int prev = latest[static_cast<std::size_t>(v)]; prev >= 0) {
      if (!node.can_recompute()) {
        r.error = absl::StrCat("step ", j, ": ", node_label(g, v), " (kind '", kind_name(node.kind),
                               node.recomputable ? "" : ", not recomputable",
                               "') is computed a second time");
        return r;
      }
      r.next_instance[static_cast<std::size_t>(prev)] = static_cast<int>(j);
    }
    latest[static_cast<std::size_t>(v)] = static_cast<int>(j);
  }
  for (int v = 0; v < n; ++v) {
    if (latest[static_cast<std::size_t>(v)] < 0) {
      r.error = absl::StrCat(node_label(g, v), " is never computed");
      return r;
    }
  }
  return r;
}

// Inputs and tangents: made before the step, never computed by it.
inline bool is_graph_input(const Node& n) {
  return n.kind == NodeKind::kInput || n.kind == NodeKind::kTangent;
}

// Per node: how many nodes read it.
inline std::vector<int> reader_counts(const Graph& g) {
  std::vector<int> readers(g.nodes.size(), 0);
  for (const Node& n : g.nodes)
    for (int u : n.inputs)
      if (u >= 0 && u < g.size()) ++readers[static_cast<std::size_t>(u)];
  return readers;
}

// A node with no bytes that nothing reads is run for its cost only (no output tensor): an
// allocator would round even an empty request up to its smallest block.
inline bool no_output(const Node& n, const std::vector<int>& readers) {
  return n.bytes == 0 && readers[static_cast<std::size_t>(n.id)] == 0;
}

// Resident bytes at every step of `order` (empty where the order is invalid).
std::vector<int64_t> memory_profile(const Graph& g, const std::vector<int>& order);

}  // namespace remat

#endif  // REMAT_RUNTIME_IR_INSTANCES_H_
