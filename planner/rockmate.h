// Internal interfaces of the Rockmate planner (rockmate.cc, rockmate_blocks.cc); exposed for
// rockmate_test.cc.
#ifndef REMAT_PLANNER_ROCKMATE_H_
#define REMAT_PLANNER_ROCKMATE_H_

#include <absl/status/statusor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "remat/graph.h"

namespace remat::detail::rockmate {

// The graph cut into a sequence of blocks (Rockmate's rk-GB on remat-graph-v1). Block i
// runs its forward nodes fwd[i] after block i-1's and its backward nodes bwd[i] after block
// i+1's; it reads from earlier blocks only out[i-1] and small pinned values, and from later
// blocks only backward values.
struct BlockSequence {
  std::vector<std::vector<int>> fwd;  // forward nodes of each block, ascending ids
  std::vector<std::vector<int>> bwd;  // backward nodes of each block, ascending ids
  std::vector<int> out;               // the separator each block ends with
  std::vector<int> block_of;          // per node; -1: the rest; -2: shared (every block
                                      // that reads it makes its own copy)
  std::vector<int> rest;              // inputs and shared parameter-like values: run first
  std::vector<char> pinned;           // per node: small value read across blocks
  std::vector<char> late;             // per node: on the backward side (Note [The backward side])
  std::vector<char> rerunnable;       // per block: no forward node that runs only once
  std::vector<int> kind;              // per block: index of its kind (identical blocks)
  std::vector<int> representative;    // per kind: its first block
  int merges = 0;                     // blocks merged because values crossed them
  std::string note;                   // why the graph is a single block, if it is
  int size() const { return static_cast<int>(fwd.size()); }
};

// Detects the blocks. A graph that is no sequence (no backward, a forward node reading a
// backward one, crossings everywhere) gives one block and a note.
BlockSequence detect_blocks(const Graph& g, int max_blocks = 80);

// A block as a graph of its own (local ids): external forward inputs (0 bytes: the DP
// accounts for them), the block's forward nodes, external backward inputs (the gradients
// it receives, at their size), its backward nodes. Reads of the rest are dropped.
struct BlockProblem {
  Graph sub;
  std::vector<int> global;     // local id -> global id
  std::vector<char> external;  // local id is an external input (never emitted)
  std::vector<char> exported;  // local forward node read outside the block
  int boundary = 0;            // first local id of the backward section
  int64_t grad_in_bytes = 0;   // bytes of the external backward inputs
};
BlockProblem build_block_problem(const Graph& g, const BlockSequence& b, int block);

// The canonical signature of a block problem: equal for blocks with the same structure,
// bytes (external inputs at their real size) and costs, in topological order.
std::vector<int64_t> block_signature(const Graph& g, const BlockProblem& p);

// One way to run a block: its forward steps, its backward steps (local ids), and what the
// sequence DP needs to know about them.
struct Strategy {
  std::vector<int> fwd, bwd;
  int64_t fwd_peak = 0;  // memory of the block during its forward steps
  int64_t bwd_peak = 0;  // during its backward steps (kept values and gradients included)
  int64_t kept = 0;      // forward values held from forward to backward (exports excluded)
  double cost = 0;
  std::string source;  // "keep all", "recompute all", "keep set", "checkmate", "greedy"
};

// Measures a full order of the block problem (local ids, every node at least once, first
// computations of forward nodes before the backward section) as a strategy.
Strategy measure_strategy(const BlockProblem& p, const std::vector<int>& order,
                          const std::string& source);

// Drops strategies that another one beats or equals on all four measures.
void keep_pareto_front(std::vector<Strategy>* list);

// The strategies of one kind of block and how it advances (runs its forward keeping only
// what other blocks read), with a report for the planner's JSON.
struct KindPlan {
  std::vector<Strategy> strategies;
  std::vector<int> advance;  // local ids
  int64_t advance_peak = 0;
  double advance_cost = 0;
  // Report.
  int first_block = 0, blocks = 0, nodes = 0;
  bool cached = false;  // solved by an earlier call (Note [Strategies across calls])
  std::string solver;   // "checkmate", or why not and what was used instead
  int grid_side = 0, grid_solved = 0, grid_skipped = 0, cbc_optimal = 0, candidates = 0;
  double seconds = 0;
};

// Strategies for a kind within `seconds`: keep all, recompute all, keep sets, greedy repair
// under a grid of peaks, and Checkmate under a grid of (peak, kept) budgets where the block
// is small enough; the Pareto front of them.
KindPlan plan_kind(const BlockProblem& p, double seconds, bool verbose);

// The chain the sequence DP plans (rk-Rotor). Memory is in bytes beyond the pinned values
// and the input of the segment being solved; each block's needs include the rest resident
// while it runs.
struct ChainModel {
  std::vector<int64_t> act;             // act[i]: bytes of block i's input a_i (act[0] = 0), L+1
  std::vector<int64_t> grads_in;        // grads_in[i]: backward bytes made in blocks >= i and read
                                        // in blocks < i (held while blocks < i run), L+1
  std::vector<int64_t> block_grads_in;  // per block: bytes of its external backward inputs
  std::vector<int64_t> advance_peak;    // per block: peak of running it keeping only exports
  std::vector<double> advance_cost;
  // Per block: bytes of the rest resident while its forward, and its backward, run.
  std::vector<int64_t> rest_fwd, rest_bwd;
  std::vector<char> rerunnable;
  std::vector<const std::vector<Strategy>*> strategies;  // per block
  int size() const { return static_cast<int>(advance_cost.size()); }
};

struct ChainOp {
  enum Kind { kAdvance, kForward, kBackward } kind;
  int block;
  int strategy;  // kForward, kBackward
};

// The DP's table for one memory unit: fill once, then solve for any memory up to the top.
class ChainSolver {
 public:
  // False when the table would be too large.
  bool fill(const ChainModel& c, int64_t top_bytes, int steps);
  // Minimum cost and ops with `memory` bytes; nullopt when the DP finds no way.
  std::optional<std::pair<double, std::vector<ChainOp>>> solve(int64_t memory) const;
  int64_t unit() const { return unit_; }
  int64_t top() const { return unit_ * M_; }
  // The least memory (bytes) with which the DP finds a way; -1 if none up to the top.
  int64_t minimum_memory() const;

 private:
  size_t at(int s, int t, int m) const { return (static_cast<size_t>(s) * L_ + t) * (M_ + 1) + m; }
  std::pair<double, int> best(int s, int t, int m) const;
  int64_t u(int64_t bytes) const { return (bytes + unit_ - 1) / unit_; }

  const ChainModel* c_ = nullptr;
  int L_ = 0, M_ = 0;
  int64_t unit_ = 1;
  std::vector<double> opt_;
  std::vector<int> choice_;  // >= 0: strategy; < 0: -j, advance to block j
};

}  // namespace remat::detail::rockmate

#endif  // REMAT_PLANNER_ROCKMATE_H_
