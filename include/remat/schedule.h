// remat/schedule.h: schedules (format remat-schedule-v1) and the exact simulator that
// measures them under the memory accounting of docs/formats.md.
//
// Usage:
//   remat::Schedule s{.graph = g.name, .order = {0, 1, 2, 1, 3}};   // node 1 recomputed
//   remat::SimResult r = remat::simulate(g, s, /*budget_bytes=*/1 << 20);
//   if (!r.valid) std::cerr << r.error << "\n";
//   std::cout << r.peak_bytes << " " << r.cost << " " << r.overhead << "\n";
//
// Accounting: the instance made at step i is resident from step i through the last step
// that reads it (a read uses the newest earlier instance); peak = max over steps of the
// resident bytes; cost = sum of the costs of the steps.
#ifndef REMAT_SCHEDULE_H_
#define REMAT_SCHEDULE_H_

#include <absl/status/statusor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "remat/graph.h"

namespace remat {

struct Schedule {
  std::string graph;       // name of the graph it was made for
  std::vector<int> order;  // node ids; a node that appears again is recomputed
  // Optional: the step where the backward region begins (the planner's partition), used
  // for saved_bytes; without it the end of the forward pass is inferred (see SimResult).
  std::optional<int> backward_start = std::nullopt;
};

struct SimResult {
  bool valid = false;  // structurally valid and, if a budget was given, within it
  std::string error;   // why not valid (names the step and the node)
  int64_t peak_bytes = 0;
  int peak_step = -1;
  double cost = 0.0;       // sum of step costs
  double base_cost = 0.0;  // sum of all node costs (every node once)
  double overhead = 0.0;   // cost / base_cost - 1 (0 when base_cost is 0)
  int recomputations = 0;  // steps beyond the first instance of each node
  // Bytes of forward values that the backward phase reads without recomputing them
  // (PyTorch's partitioner's measure): first instances of forward nodes, made by the end
  // of the forward pass (the first instance of the last forward node listed before the
  // first backward step that is not a tangent), and read after it.
  int64_t saved_bytes = 0;
};

// Simulates `s` on `g`. With a budget, a peak above it makes the result invalid.
SimResult simulate(const Graph& g, const Schedule& s,
                   std::optional<int64_t> budget_bytes = std::nullopt);

// The peak of computing every node once in file order, without rematerialization: the
// baseline every budget fraction is of (../shared/graphs/FORMAT.md's reference peaks).
int64_t file_order_peak(const Graph& g);

// Errors name the problem (and the step); read_schedule_file puts the path before them.
absl::StatusOr<Schedule> parse_schedule(std::string_view json_text);
absl::StatusOr<Schedule> read_schedule_file(const std::string& path);
std::string write_schedule(const Schedule& s);

}  // namespace remat

#endif  // REMAT_SCHEDULE_H_
