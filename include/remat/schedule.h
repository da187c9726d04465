// remat/schedule.h: schedules (format remat-schedule-v1) and the exact simulator that
// measures them under the memory accounting of docs/formats.md.
//
// Usage:
//   remat::Schedule s{.graph = g.name, .order = {0, 1, 2, 1, 3}};   // node 1 recomputed
//   remat::SimResult r = remat::simulate(g, s, /*budget_bytes=*/1 << 20);
//   if (!r.valid) std::cerr << r.error << "\n";
//   std::cout << r.peak_bytes << " " << r.cost << " " << r.overhead << "\n";
//
//   // Node 0's instance waits in host memory from step 2 until step 4 fetches it back.
//   remat::Schedule o{.graph = g.name, .order = {0, 1, 2, 3, 4},
//                     .offloads = {{.step = 0, .free = 2, .fetch = 4}}};
//   remat::SimResult t = remat::simulate(g, o, std::nullopt, remat::HostLink::pcie5());
//   std::cout << t.exposed_transfer_cost << "\n";  // what the copies could not hide
//
// Accounting: the instance made at step i is resident from step i through the last step
// that reads it (a read uses the newest earlier instance), less the steps it spends on the
// host; peak = max over steps of the resident bytes; cost = sum of the costs of the steps,
// plus the time the steps wait for copies (Note [Offloads in a schedule] in
// runtime/ir/offloads.cc).
#ifndef REMAT_SCHEDULE_H_
#define REMAT_SCHEDULE_H_

#include <absl/status/statusor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "remat/graph.h"
#include "remat/host_link.h"

namespace remat {

// An instance that waits in host memory between two of its reads. Steps index
// Schedule::order.
struct Offload {
  int step = 0;   // the step that made the instance; its copy to the host starts after it
  int free = 0;   // it leaves the device before this step, once its copy out has finished
  int fetch = 0;  // its copy back starts before this step, which it occupies memory from
};

struct Schedule {
  std::string graph;       // name of the graph it was made for
  std::vector<int> order;  // node ids; a node that appears again is recomputed
  // Optional: the step where the backward region begins (the planner's partition), used
  // for saved_bytes; without it the end of the forward pass is inferred (see SimResult).
  std::optional<int> backward_start = std::nullopt;
  // Instances that wait on the host, at most one entry per instance.
  std::vector<Offload> offloads = {};
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
  // Offloads (Schedule::offloads): how many, the bytes they copy both ways, the copies'
  // time, the part of it the steps waited for (included in `cost`), and the most bytes held
  // in host memory at once.
  int offloads = 0;
  int64_t bytes_moved = 0;
  double transfer_cost = 0.0;
  double exposed_transfer_cost = 0.0;
  int64_t host_peak_bytes = 0;
};

// Simulates `s` on `g`. With a budget, a peak above it makes the result invalid. The
// copies of offloads are priced by `link`, in the graph's cost unit taken as nanoseconds.
SimResult simulate(const Graph& g, const Schedule& s,
                   std::optional<int64_t> budget_bytes = std::nullopt,
                   const HostLink& link = HostLink::pcie5());

// What each step of `order` costs: its node's cost; in a graph whose groups run whole
// (Graph::whole_groups), a run of consecutive steps computing distinct members of one group
// costs the operator once, the members' costs summed over the whole group and shared by the
// run's steps in proportion to their own, so a member computed apart costs the operator's
// whole cost. simulate() sums these (Note [Groups that run whole] in schedule.cc).
std::vector<double> step_costs(const Graph& g, const std::vector<int>& order);

// The peak of computing every node once in file order, without rematerialization: the
// baseline every budget fraction is of (../shared/graphs/FORMAT.md's reference peaks).
int64_t file_order_peak(const Graph& g);

// Errors name the problem (and the step); read_schedule_file puts the path before them.
absl::StatusOr<Schedule> parse_schedule(std::string_view json_text);
absl::StatusOr<Schedule> read_schedule_file(const std::string& path);
std::string write_schedule(const Schedule& s);

}  // namespace remat

#endif  // REMAT_SCHEDULE_H_
