// Reading, writing and validating remat-graph-v1.
#include <absl/strings/escaping.h>
#include <absl/strings/str_cat.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <string_view>

#include "nlohmann/json.hpp"
#include "remat/graph.h"
#include "runtime/ir/json_error.h"

namespace remat {
namespace {

using json = nlohmann::json;

// A name as an error shows it: escaped and cut short, so that the message stays one line.
std::string shown_name(std::string_view name) {
  constexpr size_t kShown = 64;
  const absl::string_view head(name.data(), std::min(name.size(), kShown));
  return absl::StrCat(absl::CHexEscape(head), name.size() > kShown ? "..." : "");
}

std::string node_label(const json& node, size_t index) {
  std::string label = absl::StrCat("node ", index);
  if (node.is_object() && node.contains("name") && node["name"].is_string()) {
    absl::StrAppend(&label, " ('", shown_name(node["name"].get_ref<const std::string&>()), "')");
  }
  return label;
}

std::string node_label(const Node& n) {
  return absl::StrCat("node ", n.id, " ('", shown_name(n.name), "')");
}

// A JSON integer as int64, or nothing where it is not an integer or lies outside int64
// (nlohmann keeps integers above INT64_MAX unsigned; get<int64_t> would wrap them).
std::optional<int64_t> as_int64(const json& v) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  return std::nullopt;
}

// Reads a non-negative integer that fits int64 from a JSON number.
absl::StatusOr<int64_t> read_size(const json& v, const std::string& what) {
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return absl::InvalidArgumentError(absl::StrCat(what, " overflows a 64-bit size"));
    }
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) {
    int64_t i = v.get<int64_t>();
    if (i < 0) return absl::InvalidArgumentError(absl::StrCat(what, " is negative (", i, ")"));
    return i;
  }
  if (v.is_number_float()) {
    double d = v.get<double>();
    if (!std::isfinite(d)) return absl::InvalidArgumentError(absl::StrCat(what, " is not finite"));
    if (d < 0) return absl::InvalidArgumentError(absl::StrCat(what, " is negative (", d, ")"));
    if (d >= 9.2e18) {
      return absl::InvalidArgumentError(absl::StrCat(what, " overflows a 64-bit size"));
    }
    if (d != std::floor(d)) {
      return absl::InvalidArgumentError(absl::StrCat(what, " is not a whole number (", d, ")"));
    }
    return static_cast<int64_t>(d);
  }
  return absl::InvalidArgumentError(absl::StrCat(what, " is not a number"));
}

absl::StatusOr<std::string> read_string(const json& obj, const char* key, const std::string& where,
                                        bool required) {
  if (!obj.contains(key)) {
    if (required) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": missing field '", key, "'"));
    }
    return std::string();
  }
  if (!obj[key].is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": field '", key, "' is not a string"));
  }
  return obj[key].get<std::string>();
}

// Checks each node on its own: ids, sizes (and that their total fits 64 bits), costs, input
// ids, and that inputs and tangents read nothing.
absl::Status validate_nodes(const Graph& g) {
  const int n = g.size();
  int64_t total = 0;
  for (int i = 0; i < n; ++i) {
    const Node& node = g.nodes[i];
    if (node.id != i) {
      return absl::InvalidArgumentError(absl::StrCat("node at index ", i, " ('", node.name,
                                                     "') has id ", node.id,
                                                     "; ids must equal their index"));
    }
    if (node.bytes < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(node_label(node), ": bytes is negative (", node.bytes, ")"));
    }
    if (node.bytes > std::numeric_limits<int64_t>::max() - total) {
      return absl::InvalidArgumentError(
          absl::StrCat(node_label(node), ": bytes ", node.bytes,
                       " makes the graph's total size overflow 64 bits"));
    }
    total += node.bytes;
    if (!std::isfinite(node.cost) || node.cost < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(node_label(node), ": cost must be finite and >= 0"));
    }
    for (int u : node.inputs) {
      if (u < 0 || u >= n) {
        return absl::InvalidArgumentError(
            absl::StrCat(node_label(node), " reads unknown node id ", u));
      }
    }
    if ((node.kind == NodeKind::kInput || node.kind == NodeKind::kTangent) &&
        !node.inputs.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(node_label(node), " is of kind '",
                                                     kind_name(node.kind), "' but has inputs"));
    }
  }
  return absl::OkStatus();
}

// Names a cycle among the nodes that Kahn's algorithm left blocked (indeg > 0): walks
// backwards along blocked inputs until a node repeats.
absl::Status cycle_error(const Graph& g, const std::vector<int>& indeg) {
  const int n = g.size();
  int v = 0;
  while (indeg[v] == 0) ++v;
  std::vector<int> pos(n, -1);
  std::vector<int> path;
  while (pos[v] < 0) {
    pos[v] = static_cast<int>(path.size());
    path.push_back(v);
    for (int u : g.nodes[v].inputs) {
      if (indeg[u] > 0) {
        v = u;
        break;
      }
    }
  }
  std::string cycle;
  for (size_t k = pos[v]; k < path.size(); ++k) absl::StrAppend(&cycle, path[k], " <- ");
  absl::StrAppend(&cycle, v);
  return absl::InvalidArgumentError(
      absl::StrCat("cycle through ", node_label(g.nodes[v]), ": ", cycle));
}

// Kahn's algorithm on the edges as given.
absl::Status check_acyclic(const Graph& g) {
  const int n = g.size();
  std::vector<int> indeg(n, 0);
  std::vector<std::vector<int>> users(n);
  for (const Node& node : g.nodes) {
    for (int u : node.inputs) {
      users[u].push_back(node.id);
      ++indeg[node.id];
    }
  }
  std::vector<int> stack;
  for (int i = 0; i < n; ++i)
    if (indeg[i] == 0) stack.push_back(i);
  int seen = 0;
  while (!stack.empty()) {
    int v = stack.back();
    stack.pop_back();
    ++seen;
    for (int w : users[v])
      if (--indeg[w] == 0) stack.push_back(w);
  }
  if (seen != n) return cycle_error(g, indeg);
  return absl::OkStatus();
}

// Parses the text, with the position of the first error when it is not JSON (a number beyond
// a double among them: nlohmann reports that as out_of_range, not as a parse error).
absl::StatusOr<json> parse_json(std::string_view text) {
  json doc = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat("bad JSON: ", detail::json_error(text)));
  }
  return doc;
}

// The top level: format, name and source, and that 'nodes' is an array.
absl::Status parse_header(const json& doc, Graph* g) {
  if (!doc.is_object()) return absl::InvalidArgumentError("graph: top level is not a JSON object");
  if (!doc.contains("format") || doc["format"] != "remat-graph-v1") {
    return absl::InvalidArgumentError("graph: field 'format' is not \"remat-graph-v1\"");
  }
  auto name = read_string(doc, "name", "graph", true);
  if (!name.ok()) return name.status();
  g->name = *name;
  auto source = read_string(doc, "source", "graph", false);
  if (!source.ok()) return source.status();
  g->source = *source;
  if (doc.contains("whole_groups")) {
    if (!doc["whole_groups"].is_boolean())
      return absl::InvalidArgumentError("graph: 'whole_groups' is not a boolean");
    g->whole_groups = doc["whole_groups"].get<bool>();
  }
  if (!doc.contains("nodes") || !doc["nodes"].is_array()) {
    return absl::InvalidArgumentError("graph: 'nodes' is missing or not an array");
  }
  return absl::OkStatus();
}

// A node's id, name, op, kind and phase.
absl::Status parse_node_identity(const json& jn, size_t i, const std::string& where, Node* node) {
  if (!jn.contains("id") || !jn["id"].is_number_integer()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": 'id' is missing or not an integer"));
  }
  const std::optional<int64_t> id = as_int64(jn["id"]);
  if (!id) return absl::InvalidArgumentError(absl::StrCat(where, ": 'id' is out of range"));
  if (*id != static_cast<int64_t>(i)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " has id ", *id, "; nodes[i].id must equal i"));
  }
  node->id = static_cast<int>(i);
  auto nm = read_string(jn, "name", where, false);
  if (!nm.ok()) return nm.status();
  node->name = nm->empty() ? std::to_string(i) : *nm;
  auto op = read_string(jn, "op", where, false);
  if (!op.ok()) return op.status();
  node->op = *op;
  auto kind = read_string(jn, "kind", where, false);
  if (!kind.ok()) return kind.status();
  if (kind->empty() || *kind == "compute")
    node->kind = NodeKind::kCompute;
  else if (*kind == "view")
    node->kind = NodeKind::kView;
  else if (*kind == "input")
    node->kind = NodeKind::kInput;
  else if (*kind == "tangent")
    node->kind = NodeKind::kTangent;
  else
    return absl::InvalidArgumentError(absl::StrCat(where, ": unknown kind '", *kind, "'"));
  auto phase = read_string(jn, "phase", where, false);
  if (!phase.ok()) return phase.status();
  if (phase->empty() || *phase == "forward")
    node->phase = Phase::kForward;
  else if (*phase == "backward")
    node->phase = Phase::kBackward;
  else
    return absl::InvalidArgumentError(absl::StrCat(where, ": unknown phase '", *phase, "'"));
  return absl::OkStatus();
}

// A node's bytes, cost, flops and inputs (each an id below num_nodes).
absl::Status parse_node_figures(const json& jn, size_t num_nodes, const std::string& where,
                                Node* node) {
  if (!jn.contains("bytes")) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": missing field 'bytes'"));
  }
  auto bytes = read_size(jn["bytes"], absl::StrCat(where, ": bytes"));
  if (!bytes.ok()) return bytes.status();
  node->bytes = *bytes;
  if (jn.contains("cost")) {
    if (!jn["cost"].is_number()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": cost is not a number"));
    }
    node->cost = jn["cost"].get<double>();
    if (!std::isfinite(node->cost) || node->cost < 0) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": cost must be finite and >= 0"));
    }
  }
  if (jn.contains("flops") && !jn["flops"].is_null()) {
    if (!jn["flops"].is_number()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": flops is not a number"));
    }
    node->flops = jn["flops"].get<double>();
  }
  if (jn.contains("inputs")) {
    if (!jn["inputs"].is_array()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": 'inputs' is not an array"));
    }
    for (const json& u : jn["inputs"]) {
      if (!u.is_number_integer()) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": an input id is not an integer"));
      }
      const std::optional<int64_t> uid = as_int64(u);
      if (!uid || *uid < 0 || *uid >= static_cast<int64_t>(num_nodes)) {
        return absl::InvalidArgumentError(absl::StrCat(where, " reads unknown node id ", u.dump()));
      }
      node->inputs.push_back(static_cast<int>(*uid));
    }
  }
  return absl::OkStatus();
}

// A node's optional annotations: group, recomputable, site and pytorch_banned.
absl::Status parse_node_annotations(const json& jn, const std::string& where, Node* node) {
  if (jn.contains("group") && !jn["group"].is_null()) {
    if (!jn["group"].is_number_integer()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": 'group' is not an integer"));
    }
    node->group = as_int64(jn["group"]);
    if (!node->group) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": 'group' is out of range"));
    }
  }
  if (jn.contains("recomputable")) {
    if (!jn["recomputable"].is_boolean()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": 'recomputable' is not a boolean"));
    }
    node->recomputable = jn["recomputable"].get<bool>();
  }
  if (jn.contains("site")) {
    const auto& site = jn["site"];
    if (!site.is_array() || site.size() != 2 || !site[0].is_number_integer() ||
        !site[1].is_number_integer() || site[0].get<int64_t>() < 0 || site[1].get<int64_t>() < 0 ||
        site[0].get<int64_t>() > INT32_MAX || site[1].get<int64_t>() > INT32_MAX) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": 'site' is not a pair of non-negative integers [position, output]"));
    }
    node->site_position = site[0].get<int>();
    node->site_output = site[1].get<int>();
  }
  if (jn.contains("pytorch_banned")) {
    if (!jn["pytorch_banned"].is_boolean()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": 'pytorch_banned' is not a boolean"));
    }
    node->pytorch_banned = jn["pytorch_banned"].get<bool>();
  }
  return absl::OkStatus();
}

absl::StatusOr<Node> parse_node(const json& nodes, size_t i) {
  const json& jn = nodes[i];
  std::string where = node_label(jn, i);
  if (!jn.is_object()) return absl::InvalidArgumentError(absl::StrCat(where, " is not an object"));
  Node node;
  absl::Status st = parse_node_identity(jn, i, where, &node);
  if (st.ok()) st = parse_node_figures(jn, nodes.size(), where, &node);
  if (st.ok()) st = parse_node_annotations(jn, where, &node);
  if (!st.ok()) return st;
  return node;
}

absl::Status parse_outputs(const json& doc, Graph* g) {
  if (!doc.contains("outputs")) return absl::OkStatus();
  if (!doc["outputs"].is_array()) {
    return absl::InvalidArgumentError("graph: 'outputs' is not an array");
  }
  for (const json& o : doc["outputs"]) {
    if (!o.is_number_integer()) {
      return absl::InvalidArgumentError("graph: an output id is not an integer");
    }
    const std::optional<int64_t> oid = as_int64(o);
    if (!oid || *oid < 0 || *oid >= g->size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("graph: output id ", o.dump(), " names no node"));
    }
    g->outputs.push_back(static_cast<int>(*oid));
  }
  return absl::OkStatus();
}

// A byte count among the peer figures: a whole number in int64 (an integral float too), or
// nothing. Converting any other double to int64 would be undefined.
std::optional<int64_t> peer_bytes(const json& v) {
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!(d >= -9.2e18 && d <= 9.2e18) || d != std::floor(d)) return std::nullopt;
    return static_cast<int64_t>(d);
  }
  return as_int64(v);
}

// The peer figures are informational: fields of the wrong type (or out of range) are skipped,
// not rejected.
void parse_peer(const json& doc, Graph* g) {
  if (!doc.contains("peer") || !doc["peer"].is_object()) return;
  const json& p = doc["peer"];
  if (p.contains("pytorch_mincut_saved_bytes")) {
    g->peer.pytorch_mincut_saved_bytes = peer_bytes(p["pytorch_mincut_saved_bytes"]);
  }
  if (p.contains("pytorch_default_saved_bytes")) {
    g->peer.pytorch_default_saved_bytes = peer_bytes(p["pytorch_default_saved_bytes"]);
  }
  if (p.contains("pytorch_mincut_seconds") && p["pytorch_mincut_seconds"].is_number()) {
    g->peer.pytorch_mincut_seconds = p["pytorch_mincut_seconds"].get<double>();
  }
  if (p.contains("pytorch_mincut_saved") && p["pytorch_mincut_saved"].is_array()) {
    for (const json& s : p["pytorch_mincut_saved"]) {
      const std::optional<int64_t> id = as_int64(s);
      if (id && *id >= 0 && *id <= std::numeric_limits<int>::max()) {
        g->peer.pytorch_mincut_saved.push_back(static_cast<int>(*id));
      }
    }
  }
}

}  // namespace

const char* phase_name(Phase p) { return p == Phase::kForward ? "forward" : "backward"; }

std::vector<std::vector<int>> Graph::users() const {
  std::vector<std::vector<int>> users(nodes.size());
  for (const Node& n : nodes) {
    for (int u : n.inputs) {
      if (u >= 0 && u < size() && (users[u].empty() || users[u].back() != n.id)) {
        users[u].push_back(n.id);
      }
    }
  }
  return users;
}

double Graph::total_cost() const {
  double c = 0;
  for (const Node& n : nodes) c += n.cost;
  return c;
}

absl::Status validate_graph(const Graph& g) {
  const int n = g.size();
  absl::Status st = validate_nodes(g);
  if (!st.ok()) return st;
  // A cycle is reported before the order rule so that it is named as such.
  st = check_acyclic(g);
  if (!st.ok()) return st;
  for (const Node& node : g.nodes) {
    for (int u : node.inputs) {
      if (u >= node.id) {
        return absl::InvalidArgumentError(
            absl::StrCat(node_label(node), " reads node ", u,
                         ", which is not listed before it (nodes must be in topological order)"));
      }
    }
  }
  // The members of a group are the outputs of one operator, made together: one cannot be an
  // input of another (a planner would have to run the operator before itself).
  for (const Node& node : g.nodes) {
    if (!node.group) continue;
    for (int u : node.inputs) {
      if (g.nodes[u].group == node.group) {
        return absl::InvalidArgumentError(
            absl::StrCat(node_label(node), " reads ", node_label(g.nodes[u]), " of its own group ",
                         *node.group, " (the outputs of one operator cannot read each other)"));
      }
    }
  }
  for (int o : g.outputs) {
    if (o < 0 || o >= n) {
      return absl::InvalidArgumentError(absl::StrCat("output id ", o, " names no node"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Graph> parse_graph(std::string_view text) {
  absl::StatusOr<json> doc = parse_json(text);
  if (!doc.ok()) return doc.status();
  Graph g;
  absl::Status st = parse_header(*doc, &g);
  if (!st.ok()) return st;
  const json& nodes = (*doc)["nodes"];
  g.nodes.reserve(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    absl::StatusOr<Node> node = parse_node(nodes, i);
    if (!node.ok()) return node.status();
    g.nodes.push_back(*std::move(node));
  }
  st = parse_outputs(*doc, &g);
  if (!st.ok()) return st;
  parse_peer(*doc, &g);
  st = validate_graph(g);
  if (!st.ok()) return st;
  return g;
}

absl::StatusOr<Graph> read_graph_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open graph file ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  auto g = parse_graph(ss.str());
  if (!g.ok()) {
    return absl::Status(g.status().code(), absl::StrCat(path, ": ", g.status().message()));
  }
  return g;
}

std::string write_graph(const Graph& g) {
  json doc;
  doc["format"] = "remat-graph-v1";
  doc["name"] = g.name;
  doc["source"] = g.source;
  if (g.whole_groups) doc["whole_groups"] = true;
  json nodes = json::array();
  for (const Node& n : g.nodes) {
    json jn;
    jn["id"] = n.id;
    jn["name"] = n.name;
    jn["op"] = n.op;
    jn["kind"] = std::string(kind_name(n.kind));
    jn["phase"] = std::string(phase_name(n.phase));
    jn["bytes"] = n.bytes;
    jn["cost"] = n.cost;
    if (n.flops) jn["flops"] = *n.flops;
    jn["inputs"] = n.inputs;
    if (n.group) jn["group"] = *n.group;
    if (!n.recomputable) jn["recomputable"] = false;
    if (n.pytorch_banned) jn["pytorch_banned"] = true;
    if (n.site_position >= 0) jn["site"] = {n.site_position, n.site_output};
    nodes.push_back(std::move(jn));
  }
  doc["nodes"] = std::move(nodes);
  doc["outputs"] = g.outputs;
  json peer = json::object();
  const PeerFigures& gp = g.peer;
  if (gp.pytorch_mincut_saved_bytes) {
    peer["pytorch_mincut_saved_bytes"] = *gp.pytorch_mincut_saved_bytes;
  }
  if (!gp.pytorch_mincut_saved.empty()) peer["pytorch_mincut_saved"] = gp.pytorch_mincut_saved;
  if (gp.pytorch_mincut_seconds) peer["pytorch_mincut_seconds"] = *gp.pytorch_mincut_seconds;
  if (gp.pytorch_default_saved_bytes) {
    peer["pytorch_default_saved_bytes"] = *gp.pytorch_default_saved_bytes;
  }
  if (!peer.empty()) doc["peer"] = std::move(peer);
  return doc.dump(1);
}

absl::Status write_graph_file(const Graph& g, const std::string& path) {
  std::ofstream out(path, std::ios::binary);
  if (!out) return absl::PermissionDeniedError(absl::StrCat("cannot write ", path));
  out << write_graph(g) << "\n";
  return out ? absl::OkStatus() : absl::DataLossError(absl::StrCat("write failed: ", path));
}

}  // namespace remat
