// Replays a recorded step (DTR log format) on the simulated backend, through the runtime's
// real eviction and recomputation code, under a budget.
//
//   auto trace = remat::read_dtr_trace_file("../shared/traces/dtr/resnet32.log").value();
//   remat::ReplayOptions opts;
//   opts.policy = "dtr";
//   opts.budget = remat::replay_baseline(trace).logical_peak_bytes / 2;
//   remat::ReplayResult r = remat::replay(trace, opts);   // r.slowdown, r.evictions, ...
#ifndef REMAT_REPLAY_H_
#define REMAT_REPLAY_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "remat/dtr_trace.h"
#include "remat/placement.h"
#include "remat/runtime.h"

namespace remat {

struct ReplayOptions {
  std::string policy = "dtr";
  Accounting accounting = Accounting::kLogical;
  std::size_t budget = SIZE_MAX;
  bool sample_candidates = false;
  bool contiguous_eviction = true;
  bool expandable_segments = false;  // allocator accounting: one growing arena
  std::size_t min_evictable_bytes = 0;
  // A replay whose simulated time passes this multiple of the trace's time stops with status
  // "thrash" (runs past 2x count as failures anyway; this only bounds wasted work).
  double slowdown_cap = 8.0;
  // Hints for the `hinted` policy, keyed by the position of each CALL/MUTATE in the trace.
  std::shared_ptr<const StepHints> hints;
  bool record_timeline = false;
  bool record_executed = false;  // fill ReplayResult::executed
  // Allocator accounting only: record the step's requests (ReplayResult::allocations), the
  // sequence a placement is laid out from (remat/placement.h). With this or `placement`,
  // the trace's constants are made before the step begins, as a program's state is.
  bool record_allocations = false;
  // Allocator accounting only: the step's requests served at these places (a placement of
  // the sequence a replay with record_allocations recorded; Note [Placed allocations] in
  // step_placement.cc).
  std::shared_ptr<const Placement> placement;
  // Ops, by name, that run as soon as they are called although a followed plan would defer
  // them, as the PyTorch backend runs random operators (Note [Random operators run when
  // called] in pytorch/device_fallback.cc); a MUTATE's new version, a CALL's first output.
  std::vector<std::string> run_when_called;
  // Bytes held before the step begins that its trace never reads (a program's optimizer
  // state): one constant of that size, made first.
  std::size_t unread_bytes = 0;
  // The host tier (RuntimeOptions::host_memory_bytes, host_link): victims cheaper to move
  // than to recompute go to the host (Note [Keep, recompute or offload]); 0: none.
  std::size_t host_memory_bytes = 0;
  HostLink host_link = {};
};

struct ReplayBaseline {
  std::size_t logical_peak_bytes = 0;   // peak of the sum of live tensor sizes, no budget
  std::size_t reserved_peak_bytes = 0;  // peak reserved by the caching allocator, no budget
  std::size_t constant_bytes = 0;
};

struct ReplayResult {
  std::string status = "ok";  // ok, oom or thrash
  std::string error;          // the error's message when status is not ok
  std::size_t budget_bytes = 0;
  std::size_t peak_reserved_bytes = 0;
  std::size_t peak_allocated_bytes = 0;
  double slowdown = 0;  // simulated time over the trace's time
  std::size_t evictions = 0;
  std::size_t recomputations = 0;
  std::size_t retried_requests = 0;  // RuntimeStats::retried_requests
  double search_seconds = 0;         // wall time spent choosing victims
  double wall_seconds = 0;           // wall time of the whole replay
  double simulated_seconds = 0;      // simulated time of the replay (its kernels' time)
  double fragmentation = 0;
  std::size_t segment_reserves = 0;  // MemoryStats::segment_reserves
  std::size_t segment_releases = 0;
  double overhead = 0;  // recomputed cost over base cost (slowdown - 1 when all ran)
  std::size_t hint_evictions = 0;
  std::size_t deferred_ops = 0;        // ops a followed plan ran after later ones
  std::size_t placed_allocations = 0;  // with a placement: MemoryStats::placed_allocations
  std::size_t placement_misses = 0;
  std::size_t offloads = 0;  // RuntimeStats::offloads, restores, transfer_cost (in seconds)
  std::size_t restores = 0;
  double transfer_seconds = 0;
  Timeline timeline;               // with ReplayOptions::record_timeline
  std::vector<int> executed;       // with record_executed: RecordedStep::executed of the replay
  AllocationSequence allocations;  // with record_allocations
};

ReplayBaseline replay_baseline(const DtrTrace& trace);
ReplayResult replay(const DtrTrace& trace, const ReplayOptions& options);

// Replays the trace with no budget, recording it: the step as a remat-graph-v1 graph (for the
// planners) and as the trace the runtime saw.
RecordedStep record_replay(const DtrTrace& trace);

}  // namespace remat

#endif  // REMAT_REPLAY_H_
