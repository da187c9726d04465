// The exact schedule simulator (docs/formats.md's accounting) and remat-schedule-v1 I/O.
#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>
#include <absl/strings/str_cat.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <optional>
#include <sstream>
#include <unordered_set>

#include "nlohmann/json.hpp"
#include "remat/schedule.h"
#include "runtime/ir/instances.h"
#include "runtime/ir/json_error.h"
#include "runtime/ir/offloads.h"

namespace remat {
namespace {

std::vector<int64_t> profile(const Graph& g, const std::vector<int>& order,
                             const std::vector<int>& last_read) {
  std::vector<int64_t> delta(order.size() + 1, 0);
  for (size_t j = 0; j < order.size(); ++j) {
    int64_t b = g.nodes[order[j]].bytes;
    delta[j] += b;
    delta[last_read[j] + 1] -= b;
  }
  std::vector<int64_t> mem(order.size());
  int64_t cur = 0;
  for (size_t j = 0; j < order.size(); ++j) {
    cur += delta[j];
    mem[j] = cur;
  }
  return mem;
}

}  // namespace

namespace {

// The step where the backward region begins: the first backward step that is not an input or
// a tangent; -1 where there is none.
int first_backward_step(const Graph& g, const Schedule& s) {
  for (size_t j = 0; j < s.order.size(); ++j) {
    const Node& node = g.nodes[s.order[j]];
    if (node.phase == Phase::kBackward && node.kind != NodeKind::kTangent &&
        node.kind != NodeKind::kInput)
      return static_cast<int>(j);
  }
  return -1;
}

// Bytes of forward values the backward keeps (SimResult::saved_bytes). With the planner's
// partition (Schedule::backward_start), the forward values first made before it and read
// after it. Without one, the forward pass ends with the first instance of the last forward
// node listed before the first backward step; forward values made by then (first instances,
// not recomputations) and read after it are what the backward keeps.
int64_t saved_bytes(const Graph& g, const Schedule& s, const std::vector<int>& last_read) {
  int64_t saved = 0;
  std::vector<char> seen(g.size(), 0);
  if (s.backward_start && *s.backward_start >= 0 &&
      *s.backward_start <= static_cast<int>(s.order.size())) {
    for (int j = 0; j < *s.backward_start; ++j) {
      int v = s.order[j];
      if (seen[v]++) continue;
      if (g.nodes[v].phase == Phase::kForward && last_read[j] >= *s.backward_start)
        saved += g.nodes[v].bytes;
    }
    return saved;
  }
  const int first_bwd = first_backward_step(g, s);
  if (first_bwd < 0) return 0;
  std::vector<int> first_instances;
  int boundary = 0;
  for (int j = 0; j < first_bwd; ++j) {
    int v = s.order[j];
    if (seen[v]) continue;
    seen[v] = 1;
    if (g.nodes[v].phase == Phase::kForward) {
      first_instances.push_back(j);
      boundary = j + 1;
    }
  }
  for (int j : first_instances)
    if (last_read[j] >= boundary) saved += g.nodes[s.order[j]].bytes;
  return saved;
}

}  // namespace

namespace {

// Adds the offloads' figures to `r` and their time to its cost; takes their steps on the
// host out of `mem`.
void add_offloads(const Graph& g, const Schedule& s, const HostLink& link,
                  std::vector<int64_t>* mem, SimResult* r) {
  if (s.offloads.empty()) return;
  const std::vector<int64_t> host = apply_offloads(g, s, mem);
  r->host_peak_bytes = host.empty() ? 0 : *std::max_element(host.begin(), host.end());
  r->offloads = static_cast<int>(s.offloads.size());
  for (const Offload& o : s.offloads)
    r->bytes_moved += 2 * g.nodes[static_cast<size_t>(s.order[static_cast<size_t>(o.step)])].bytes;
  const ScheduleTiming t = time_schedule(g, s, link);
  r->transfer_cost = t.transfer;
  r->exposed_transfer_cost = t.exposed;
}

}  // namespace

// Note [Groups that run whole]
// The outputs of a multi-output operator are nodes of one group, each carrying a share of
// its cost. The runtime runs an op whole: recomputing one output runs the op and makes all
// of them. So in a graph the runtime recorded (Graph::whole_groups), a schedule that
// computes one member apart from the others pays for the whole operator, and one that
// computes the members at consecutive steps pays for it once. Priced by shares instead, a
// plan that drops one output of an op from the forward pass (attention's weights, read only
// by the backward pass) and recomputes it there looked half as dear as it ran. The memory of
// the members computed along with it is not counted: the runtime frees an output nothing
// claims at once.
std::vector<double> step_costs(const Graph& g, const std::vector<int>& order) {
  std::vector<double> cost(order.size());
  for (size_t j = 0; j < order.size(); ++j) cost[j] = g.nodes[static_cast<size_t>(order[j])].cost;
  if (!g.whole_groups) return cost;
  absl::flat_hash_map<int64_t, double> whole;  // group -> the operator's cost
  for (const Node& n : g.nodes)
    if (n.group) whole[*n.group] += n.cost;
  for (size_t j = 0; j < order.size();) {
    const Node& first = g.nodes[static_cast<size_t>(order[j])];
    if (!first.group) {
      ++j;
      continue;
    }
    size_t end = j + 1;  // the run: consecutive steps of distinct members of the group
    absl::flat_hash_set<int> members = {first.id};
    while (end < order.size()) {
      const Node& n = g.nodes[static_cast<size_t>(order[end])];
      if (n.group != first.group || !members.insert(n.id).second) break;
      ++end;
    }
    double shares = 0;
    for (size_t k = j; k < end; ++k) shares += cost[k];
    const double op = whole[*first.group];
    for (size_t k = j; k < end; ++k)
      cost[k] = shares > 0 ? cost[k] * op / shares : op / static_cast<double>(end - j);
    j = end;
  }
  return cost;
}

SimResult simulate(const Graph& g, const Schedule& s, std::optional<int64_t> budget_bytes,
                   const HostLink& link) {
  SimResult r;
  r.base_cost = g.total_cost();
  Instances instances = compute_instances(g, s.order);
  const std::vector<int>& last_read = instances.last_read;
  // Cost, recomputations and peak are reported for the steps that were checked even when
  // the order is invalid; `valid` is what counts.
  if (std::string err = check_offloads(g, s, instances); !err.empty()) {
    r.error = err;
    return r;
  }
  std::vector<int64_t> mem = profile(g, s.order, last_read);
  add_offloads(g, s, link, &mem, &r);
  const std::vector<double> cost = step_costs(g, s.order);
  for (size_t j = 0; j < s.order.size(); ++j) {
    r.cost += cost[j];
    if (mem[j] > r.peak_bytes || r.peak_step < 0) {
      r.peak_bytes = mem[j];
      r.peak_step = static_cast<int>(j);
    }
  }
  r.cost += r.exposed_transfer_cost;
  r.recomputations = static_cast<int>(s.order.size()) - g.size();
  r.overhead = r.base_cost > 0 ? r.cost / r.base_cost - 1.0 : 0.0;
  r.saved_bytes = saved_bytes(g, s, last_read);
  r.valid = true;
  if (budget_bytes && r.peak_bytes > *budget_bytes) {
    r.valid = false;
    r.error = absl::StrCat("peak ", r.peak_bytes, " bytes at step ", r.peak_step, " (",
                           node_label(g, s.order[r.peak_step]), ") exceeds the budget of ",
                           *budget_bytes, " bytes");
  }
  return r;
}

int64_t file_order_peak(const Graph& g) {
  Schedule s{g.name, {}, std::nullopt};
  s.order.reserve(static_cast<std::size_t>(g.size()));
  for (int v = 0; v < g.size(); ++v) s.order.push_back(v);
  return simulate(g, s).peak_bytes;
}

std::vector<int64_t> memory_profile(const Graph& g, const std::vector<int>& order) {
  const Instances in = compute_instances(g, order);
  if (!in.error.empty()) return {};
  return profile(g, order, in.last_read);
}

namespace {

// A JSON integer in [min, INT32_MAX], or nothing. nlohmann keeps an integer above INT64_MAX
// unsigned, so it is compared as such rather than read through int64 (where it would wrap).
std::optional<int> int_in(const nlohmann::json& v, int64_t min) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > INT32_MAX || static_cast<int64_t>(u) < min) return std::nullopt;
    return static_cast<int>(u);
  }
  if (!v.is_number_integer()) return std::nullopt;
  const int64_t i = v.get<int64_t>();
  if (i < min || i > INT32_MAX) return std::nullopt;
  return static_cast<int>(i);
}

// "offloads": [{"step": j, "free": f, "fetch": p}, ...]; simulate() checks them against
// the order.
absl::StatusOr<std::vector<Offload>> parse_offloads(const nlohmann::json& v) {
  if (!v.is_array()) return absl::InvalidArgumentError("schedule: 'offloads' is not an array");
  std::vector<Offload> out;
  for (size_t k = 0; k < v.size(); ++k) {
    const nlohmann::json& e = v[k];
    std::optional<int> field[3];
    const char* names[3] = {"step", "free", "fetch"};
    for (int i = 0; i < 3; ++i)
      if (e.is_object() && e.contains(names[i])) field[i] = int_in(e[names[i]], 0);
    if (!field[0] || !field[1] || !field[2]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "schedule: offload ", k, " needs \"step\", \"free\" and \"fetch\" as step indices"));
    }
    out.push_back({*field[0], *field[1], *field[2]});
  }
  return out;
}

}  // namespace

absl::StatusOr<Schedule> parse_schedule(std::string_view text) {
  using json = nlohmann::json;
  json doc = json::parse(text.begin(), text.end(), nullptr, false);
  if (doc.is_discarded()) {
    return absl::InvalidArgumentError(
        absl::StrCat("schedule: bad JSON: ", detail::json_error(text)));
  }
  if (!doc.is_object() || !doc.contains("format") || doc["format"] != "remat-schedule-v1") {
    return absl::InvalidArgumentError("schedule: field 'format' is not \"remat-schedule-v1\"");
  }
  Schedule s;
  if (doc.contains("graph")) {
    if (!doc["graph"].is_string())
      return absl::InvalidArgumentError("schedule: 'graph' is not a string");
    s.graph = doc["graph"].get<std::string>();
  }
  if (!doc.contains("order") || !doc["order"].is_array()) {
    return absl::InvalidArgumentError("schedule: 'order' is missing or not an array");
  }
  if (doc.contains("backward_start")) {
    std::optional<int> b = int_in(doc["backward_start"], INT32_MIN);
    if (!b) return absl::InvalidArgumentError("schedule: 'backward_start' is not an int");
    s.backward_start = *b;
  }
  for (size_t j = 0; j < doc["order"].size(); ++j) {
    std::optional<int> v = int_in(doc["order"][j], 0);
    if (!v) {
      return absl::InvalidArgumentError(
          absl::StrCat("schedule: step ", j, " is not a valid node id"));
    }
    s.order.push_back(*v);
  }
  if (doc.contains("offloads")) {
    absl::StatusOr<std::vector<Offload>> offloads = parse_offloads(doc["offloads"]);
    if (!offloads.ok()) return offloads.status();
    s.offloads = *std::move(offloads);
  }
  return s;
}

absl::StatusOr<Schedule> read_schedule_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open schedule file ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  absl::StatusOr<Schedule> s = parse_schedule(ss.str());
  if (!s.ok())
    return absl::Status(s.status().code(), absl::StrCat(path, ": ", s.status().message()));
  return s;
}

std::string write_schedule(const Schedule& s) {
  nlohmann::json doc;
  doc["format"] = "remat-schedule-v1";
  doc["graph"] = s.graph;
  doc["order"] = s.order;
  if (s.backward_start) doc["backward_start"] = *s.backward_start;
  for (const Offload& o : s.offloads)
    doc["offloads"].push_back({{"step", o.step}, {"free", o.free}, {"fetch", o.fetch}});
  return doc.dump();
}

}  // namespace remat
