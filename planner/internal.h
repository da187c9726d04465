// Internal interfaces of the planners (not installed).
#ifndef REMAT_PLANNER_INTERNAL_H_
#define REMAT_PLANNER_INTERNAL_H_

#include <absl/status/statusor.h>

#include <chrono>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "remat/graph.h"
#include "remat/planner.h"

namespace remat::detail {

class Deadline {
 public:
  explicit Deadline(double seconds)
      : end_(std::chrono::steady_clock::now() +
             std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                 std::chrono::duration<double>(seconds))) {}
  // The earlier of opt.deadline and opt.time_limit_seconds from now: a planner run by
  // another with a share of its time stops by the caller's deadline too.
  explicit Deadline(const PlanOptions& opt) : Deadline(opt.time_limit_seconds) {
    if (opt.deadline && *opt.deadline < end_) end_ = *opt.deadline;
  }
  std::chrono::steady_clock::time_point end() const { return end_; }
  double left() const {
    return std::chrono::duration<double>(end_ - std::chrono::steady_clock::now()).count();
  }
  bool expired() const { return left() <= 0; }

 private:
  std::chrono::steady_clock::time_point end_;
};

// What a planner returns before simulation.
struct RawPlan {
  std::vector<int> order;
  bool optimal = false;  // proven optimal (solvers)
  std::string note;      // reason when no order could be produced, or a remark
  std::optional<int> backward_start;
  std::string details;            // a JSON object with planner-specific figures, or empty
  std::vector<Offload> offloads;  // the order's steps in host memory (planner "offload")
};

constexpr int64_t kNoBudget = std::numeric_limits<int64_t>::max();

// Lower bound on the peak of any schedule: max over v of bytes(v) + bytes(distinct inputs).
int64_t minimum_peak_lower_bound(const Graph& g, int* witness);

// Builds orders from "compute v" requests: missing inputs are recomputed recursively,
// values stay resident until drop(). Non-recomputable values are never recomputed (a
// request that needs a dropped one fails). Tracks resident bytes of the live set.
class Executor {
 public:
  explicit Executor(const Graph& g);
  // Makes v resident, computing it (and missing inputs) if needed.
  bool ensure(int v);
  void drop(int v);
  bool live(int v) const { return live_[v]; }
  bool computed(int v) const { return computed_[v]; }
  int64_t live_bytes() const { return live_bytes_; }
  int64_t peak() const { return peak_; }
  std::vector<int>& order() { return order_; }
  const std::vector<int>& order() const { return order_; }
  // Called before each step with the node about to be computed; may drop() values
  // (not the node's inputs, which are pinned) to make room.
  std::function<void(int)> before_compute;
  bool pinned(int v) const { return pins_[v] > 0; }

 private:
  const Graph& g_;
  std::vector<char> live_, computed_;
  std::vector<int> pins_;
  std::vector<int> order_;
  int64_t live_bytes_ = 0, peak_ = 0;
};

// Executes nodes in file order; recomputable forward values not in `keep` are dropped
// after their last forward reader and recomputed on demand by the backward phase; every
// value is dropped after its last reader in file order.
std::vector<int> execute_keep_set(const Graph& g, const std::vector<char>& keep);

// Drops instances that no step reads (keeping one instance of every node): never raises
// memory or cost, keeps the order valid.
std::vector<int> prune_unread_instances(const Graph& g, const std::vector<int>& order);
// The steps prune_unread_instances keeps.
std::vector<char> read_instances(const Graph& g, const std::vector<int>& order);

// Planners.
absl::StatusOr<RawPlan> plan_no_remat(const Graph& g, const PlanOptions& opt);
absl::StatusOr<RawPlan> plan_chen(const Graph& g, const PlanOptions& opt);
absl::StatusOr<RawPlan> plan_greedy(const Graph& g, const PlanOptions& opt);
absl::StatusOr<RawPlan> plan_mincut(const Graph& g, const PlanOptions& opt);
absl::StatusOr<RawPlan> plan_rotor(const Graph& g, const PlanOptions& opt);
absl::StatusOr<RawPlan> plan_checkmate(const Graph& g, const PlanOptions& opt);
absl::StatusOr<RawPlan> plan_tw_remat(const Graph& g, const PlanOptions& opt);
absl::StatusOr<RawPlan> plan_moccasin(const Graph& g, const PlanOptions& opt);
absl::StatusOr<RawPlan> plan_rockmate(const Graph& g, const PlanOptions& opt);
absl::StatusOr<RawPlan> plan_offload(const Graph& g, const PlanOptions& opt);

// Replaces recomputations in a valid `order` by offloads where the copies cost less over
// opt.host_link within opt's budgets (planner/offload.cc); `offloads` are the order's own.
struct OffloadedOrder {
  std::vector<int> order;
  std::vector<Offload> offloads;
};
OffloadedOrder add_offloads(const Graph& g, OffloadedOrder start, const PlanOptions& opt,
                            const Deadline& deadline);
// Brings the peak of a valid `start` within opt's budget by sending instances resident
// across the peak to host memory, largest first (planner/offload_fit.cc); nothing where it
// cannot.
std::optional<OffloadedOrder> fit_by_offloads(const Graph& g, OffloadedOrder start,
                                              const PlanOptions& opt, const Deadline& deadline);
// `order` with `offloads`, as a schedule of `g`.
Schedule schedule_with(const Graph& g, const std::vector<int>& order,
                       const std::vector<Offload>& offloads);
// The instance made at step i of `order` and the steps that read it, in order.
std::vector<int> touches_of(const Graph& g, const std::vector<int>& order, int i);
// Moves offloads[k]'s fetch earlier until its copy back has the steps before the read to
// run in, and its free later until its copy out has ended, each only while the bytes fit
// the budget (Note [Replacing recomputations by offloads]). Drops it, returning false,
// where no gap is left.
bool place_copies(const Graph& g, const PlanOptions& opt, const std::vector<int>& order,
                  std::vector<Offload>* offloads, std::size_t k);

// Checkmate with Rockmate's second budget: at most max_bytes of the nodes below `boundary`
// resident on entry to stage `boundary` (a block's forward values kept for its backward).
// boundary < 1 leaves it out.
struct KeptBound {
  int boundary = -1;
  int64_t max_bytes = 0;
  // Recomputation only of nodes below `boundary`, only in stages from `boundary` on.
  bool backward_only = false;
  // A schedule to start CBC from (first computations in id order), or empty.
  std::vector<int> start;
};
absl::StatusOr<RawPlan> plan_checkmate_kept(const Graph& g, const PlanOptions& opt,
                                            const KeptBound& kept);

// Greedy eviction with a scoring rule; exposed for `best` and tests.
struct GreedyParams {
  double cost_exp = 1.0;  // score = cost^a / (bytes * distance^b); lowest evicted first
  double dist_exp = 1.0;
  double noise = 0.0;  // random perturbation of scores (0: deterministic)
  uint64_t seed = 1;
};
std::vector<int> greedy_order(const Graph& g, int64_t budget, const GreedyParams& p);
// XLA-style repair of `order` until its peak fits the budget (see greedy.cc).
std::vector<int> repair_order(const Graph& g, std::vector<int> order, int64_t budget,
                              const GreedyParams& p, const Deadline* deadline);

// Exhaustive search for the minimum-cost valid schedule within the budget (small graphs
// only; returns nullopt when no schedule fits or the state space exceeds max_states).
struct ExhaustiveResult {
  double cost = 0;
  std::vector<int> order;
};
// With first_in_id_order, first computations follow the id order (Checkmate's model).
std::optional<ExhaustiveResult> exhaustive_optimum(const Graph& g, int64_t budget,
                                                   size_t max_states = 5'000'000,
                                                   bool first_in_id_order = false);

// Rotor's dynamic program on a chain of stages.
struct RotorChain {
  // Stage i reads activation a_i and produces a_{i+1}.
  std::vector<double> fwd_cost;      // advance through stage i without keeping its tape
  std::vector<double> fwd_all_cost;  // forward through stage i keeping its tape
  std::vector<double> bwd_cost;      // backward of stage i
  std::vector<int64_t> act_bytes;    // size of a_i (i = 0..L; a_0 is the chain input)
  std::vector<int64_t> tape_bytes;   // memory held by stage i's tape (includes a_{i+1})
  std::vector<int64_t> leaf_bytes;   // transient memory to run fwd_all + bwd of stage i at once
};
struct RotorOp {
  enum Kind { kForward, kForwardAll, kBackward, kCheckpoint } kind;
  int stage;
};
// Minimum cost to run forward and backward of all stages with `memory` bytes available
// beyond a_0 (which is always resident), and the op sequence; nullopt when impossible.
std::optional<std::pair<double, std::vector<RotorOp>>> rotor_solve(const RotorChain& c,
                                                                   int64_t memory,
                                                                   int memory_steps = 0);

}  // namespace remat::detail

#endif  // REMAT_PLANNER_INTERNAL_H_
