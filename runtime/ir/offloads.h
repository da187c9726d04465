// Offloads in a schedule (Schedule::offloads): their checks, their effect on the memory
// profile and the copy engines' timing. Internal to the IR and its users in this repository
// (the planner's offload pass); not installed.
//
//   remat::Instances in = remat::compute_instances(g, s.order);
//   std::string err = remat::check_offloads(g, s, in);
//   remat::ScheduleTiming t = remat::time_schedule(g, s, remat::HostLink::pcie5());
//   // t.start[j]: when step j starts on the compute stream; t.end: when the last one ends
#ifndef REMAT_RUNTIME_IR_OFFLOADS_H_
#define REMAT_RUNTIME_IR_OFFLOADS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "remat/graph.h"
#include "remat/host_link.h"
#include "remat/schedule.h"
#include "runtime/ir/instances.h"

namespace remat {

// Why `s.offloads` do not fit the order (naming the entry and the step), or "". Needs a
// valid order (`in.error` empty).
std::string check_offloads(const Graph& g, const Schedule& s, const Instances& in);

// Takes the steps each offloaded instance spends on the host out of `resident` (resident
// bytes per step), and returns the bytes in host memory per step. Needs checked offloads.
std::vector<int64_t> apply_offloads(const Graph& g, const Schedule& s,
                                    std::vector<int64_t>* resident);

struct ScheduleTiming {
  std::vector<double> start;     // per step: when it starts on the compute stream
  double end = 0;                // when the last step ends
  double transfer = 0;           // the copies' time, both ways
  double exposed = 0;            // how long the steps waited for copies
  std::vector<double> out_done;  // per offload: when its copy to the host ends
  std::vector<double> in_done;   // per offload: when its copy back ends
};

// The compute stream and one copy engine each way (Note [Offloads in a schedule]). Needs a
// valid order and checked offloads.
ScheduleTiming time_schedule(const Graph& g, const Schedule& s, const HostLink& link);

}  // namespace remat

#endif  // REMAT_RUNTIME_IR_OFFLOADS_H_
