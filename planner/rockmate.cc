// rockmate: Rockmate (Zhao et al., ICML 2023) on remat-graph-v1. The graph is cut into a
// sequence of blocks (rockmate_blocks.cc); each kind of block gets a family of strategies
// (Checkmate's MILP under a grid of peak and kept-bytes budgets, plus cheap ones); a
// Rotor-style dynamic program over the sequence picks, per block, a strategy or to
// recompute the block from its input (rk-Rotor). The DP's memory is moved until the
// simulator finds the assembled schedule within the budget.
#include <absl/strings/str_cat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <mutex>
#include <optional>

#include "internal.h"
#include "nlohmann/json.hpp"
#include "remat/schedule.h"
#include "rockmate.h"

namespace remat::detail::rockmate {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The step through which each step's instance lives (its last reader, or itself).
std::vector<int> instance_ends(const Graph& g, const std::vector<int>& order) {
  const int n = static_cast<int>(order.size());
  std::vector<int> latest(g.size(), -1), end(n);
  for (int j = 0; j < n; ++j) {
    end[j] = j;
    for (int u : g.nodes[order[j]].inputs)
      if (latest[u] >= 0) end[latest[u]] = j;
    latest[order[j]] = j;
  }
  return end;
}

// Resident bytes at each step, given each instance's last step.
std::vector<int64_t> memory(const Graph& g, const std::vector<int>& order,
                            const std::vector<int>& end) {
  const int n = static_cast<int>(order.size());
  std::vector<int64_t> delta(n + 1, 0), mem(n, 0);
  for (int j = 0; j < n; ++j) {
    delta[j] += g.nodes[order[j]].bytes;
    delta[end[j] + 1] -= g.nodes[order[j]].bytes;
  }
  int64_t cur = 0;
  for (int j = 0; j < n; ++j) mem[j] = cur += delta[j];
  return mem;
}

int64_t max_over(const std::vector<int64_t>& mem, int from, int to) {
  int64_t m = 0;
  for (int j = from; j < to; ++j) m = std::max(m, mem[j]);
  return m;
}

}  // namespace

Strategy measure_strategy(const BlockProblem& p, const std::vector<int>& order,
                          const std::string& source) {
  const Graph& g = p.sub;
  const int n = static_cast<int>(order.size());
  int split = n;
  for (int j = 0; j < n && split == n; ++j)
    if (order[j] >= p.boundary) split = j;
  std::vector<int> end = instance_ends(g, order);
  // Exports stay resident to the end of the forward steps: a later block reads them.
  for (int j = 0; j < split; ++j)
    if (p.exported[order[j]]) end[j] = std::max(end[j], split - 1);
  const std::vector<int64_t> mem = memory(g, order, end);
  Strategy s;
  s.source = source;
  s.fwd_peak = max_over(mem, 0, split);
  s.bwd_peak = max_over(mem, split, n);
  for (int j = 0; j < n; ++j) {
    const int v = order[j];
    if (p.external[v]) continue;
    s.cost += g.nodes[v].cost;
    (j < split ? s.fwd : s.bwd).push_back(v);
    if (j < split && end[j] >= split && !p.exported[v]) s.kept += g.nodes[v].bytes;
  }
  return s;
}

void keep_pareto_front(std::vector<Strategy>* list) {
  auto dominates = [](const Strategy& a, const Strategy& b) {
    return a.cost <= b.cost && a.fwd_peak <= b.fwd_peak && a.bwd_peak <= b.bwd_peak &&
           a.kept <= b.kept;
  };
  std::vector<Strategy> front;
  for (size_t i = 0; i < list->size(); ++i) {
    bool beaten = false;
    for (size_t j = 0; j < list->size() && !beaten; ++j) {
      if (i == j || !dominates((*list)[j], (*list)[i])) continue;
      // Of equal strategies the first is kept.
      beaten = !dominates((*list)[i], (*list)[j]) || j < i;
    }
    if (!beaten) front.push_back(std::move((*list)[i]));
  }
  std::sort(front.begin(), front.end(),
            [](const Strategy& a, const Strategy& b) { return a.cost < b.cost; });
  *list = std::move(front);
}

// ---- The sequence DP (rk-Rotor) -------------------------------------------------------------

// Note [The chain DP's memory]
// opt(s, t, m): the least cost of running blocks s..t forward and backward with m units,
// when a_s (block s's input) is held outside m and the gradients that blocks < t+1 receive
// from blocks > t (grads_in[t+1]) are held inside it. Block s either
//  - runs strategy k: its forward needs grads_in[t+1] + fwd_peak; it keeps kept + a_{s+1}
//    while s+1..t run; its backward needs bwd_peak plus the gradients it does not read
//    (grads_in[s+1] - block_grads_in[s]); or
//  - advances: blocks s..j-1 run keeping only their exports (advance_peak, with their input
//    held), a_j is kept while j..t run, and s..j-1 are solved again with all of m.
// Each block's needs include the rest resident while it runs (Note [The rest in the DP]).
// Exports other than the separators (small pinned values) are not in m.
std::pair<double, int> ChainSolver::best(int s, int t, int m) const {
  const ChainModel& c = *c_;
  const int64_t du = u(c.grads_in[t + 1]);
  const int64_t other_grads = std::max<int64_t>(0, c.grads_in[s + 1] - c.block_grads_in[s]);
  const int64_t rest_f = c.rest_fwd[s], rest_b = c.rest_bwd[s];
  double best = kInf;
  int ch = std::numeric_limits<int>::min();
  const auto& list = *c.strategies[s];
  for (size_t k = 0; k < list.size(); ++k) {
    const Strategy& st = list[k];
    if (m < du + u(st.fwd_peak + rest_f) || m < u(st.bwd_peak + other_grads + rest_b)) continue;
    double v = st.cost;
    if (s < t) {
      const int64_t tape = u(st.kept + c.act[s + 1]);
      if (m < tape) continue;
      v += opt_[at(s + 1, t, static_cast<int>(m - tape))];
    }
    if (v < best) best = v, ch = static_cast<int>(k);
  }
  if (!c.rerunnable[s]) return {best, ch};
  int64_t need = 0;
  double advance = 0;
  for (int j = s + 1; j <= t; ++j) {
    const int i = j - 1;
    if (!c.rerunnable[i]) break;
    need = std::max(need, du + u(c.advance_peak[i] + (i > s ? c.act[i] : 0) + c.rest_fwd[i]));
    advance += c.advance_cost[i];
    if (m < need) break;
    const int64_t aj = u(c.act[j]);
    if (m < aj) continue;
    const double v = advance + opt_[at(j, t, static_cast<int>(m - aj))] + opt_[at(s, j - 1, m)];
    if (v < best) best = v, ch = -j;
  }
  return {best, ch};
}

bool ChainSolver::fill(const ChainModel& c, int64_t top_bytes, int steps) {
  c_ = &c;
  L_ = c.size();
  unit_ = std::max<int64_t>(1, (top_bytes + steps - 1) / steps);
  M_ = static_cast<int>(std::min<int64_t>(top_bytes / unit_, steps));
  const size_t states = static_cast<size_t>(L_) * L_ * (M_ + 1);
  if (states > 40'000'000) return false;
  opt_.assign(states, kInf);
  choice_.assign(states, std::numeric_limits<int>::min());
  for (int len = 0; len < L_; ++len) {
    for (int s = 0; s + len < L_; ++s) {
      for (int m = 0; m <= M_; ++m) {
        auto [v, ch] = best(s, s + len, m);
        opt_[at(s, s + len, m)] = v;
        choice_[at(s, s + len, m)] = ch;
      }
    }
  }
  return true;
}

int64_t ChainSolver::minimum_memory() const {
  if (L_ == 0) return -1;
  for (int m = 0; m <= M_; ++m)
    if (opt_[at(0, L_ - 1, m)] < kInf) return m * unit_;
  return -1;
}

std::optional<std::pair<double, std::vector<ChainOp>>> ChainSolver::solve(int64_t memory) const {
  if (L_ == 0 || memory < 0) return std::nullopt;
  const int m0 = static_cast<int>(std::min<int64_t>(memory / unit_, M_));
  if (opt_[at(0, L_ - 1, m0)] == kInf) return std::nullopt;
  struct Task {
    int s, t, m, backward;  // backward >= 0: emit block s's backward of that strategy
  };
  std::vector<ChainOp> ops;
  std::vector<Task> stack = {{0, L_ - 1, m0, -1}};
  while (!stack.empty()) {
    const Task k = stack.back();
    stack.pop_back();
    if (k.backward >= 0) {
      ops.push_back({ChainOp::kBackward, k.s, k.backward});
      continue;
    }
    const int ch = choice_[at(k.s, k.t, k.m)];
    if (ch >= 0) {
      ops.push_back({ChainOp::kForward, k.s, ch});
      stack.push_back({k.s, k.s, 0, ch});
      if (k.s < k.t) {
        const Strategy& st = (*c_->strategies[k.s])[ch];
        stack.push_back({k.s + 1, k.t, k.m - static_cast<int>(u(st.kept + c_->act[k.s + 1])), -1});
      }
      continue;
    }
    const int j = -ch;
    for (int i = k.s; i < j; ++i) ops.push_back({ChainOp::kAdvance, i, -1});
    stack.push_back({k.s, j - 1, k.m, -1});
    stack.push_back({j, k.t, k.m - static_cast<int>(u(c_->act[j])), -1});
  }
  return std::make_pair(opt_[at(0, L_ - 1, m0)], std::move(ops));
}

}  // namespace remat::detail::rockmate

namespace remat::detail {
namespace {

using rockmate::BlockProblem;
using rockmate::BlockSequence;
using rockmate::ChainModel;
using rockmate::ChainOp;
using rockmate::KindPlan;
using Json = nlohmann::json;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Inputs and tangents: they exist before the step and cannot be recomputed.
bool is_input(const Node& v) { return v.kind == NodeKind::kInput || v.kind == NodeKind::kTangent; }

// grads_in[i]: bytes of backward values made in blocks >= i and read in blocks < i.
std::vector<int64_t> grads_in(const Graph& g, const BlockSequence& b) {
  const int L = b.size();
  std::vector<int64_t> diff(L + 2, 0);
  const auto users = g.users();
  for (const Node& u : g.nodes) {
    const int bu = b.block_of[u.id];
    if (bu < 0 || !b.late[u.id]) continue;
    int lowest = bu;
    for (int w : users[u.id])
      if (b.block_of[w] >= 0) lowest = std::min(lowest, b.block_of[w]);
    if (lowest == bu) continue;
    diff[lowest + 1] += u.bytes;  // held for i in (lowest, bu]
    diff[bu + 1] -= u.bytes;
  }
  std::vector<int64_t> in(L + 1, 0);
  int64_t cur = 0;
  for (int i = 0; i <= L; ++i) in[i] = cur += diff[i];
  return in;
}

// Note [The rest in the DP]
// An input is placed right before its first reader and lives to its last: from the first
// forward of the lowest block that reads it to that block's backward, the last to run. So
// while block i runs, the inputs whose lowest reading block is at most i are resident. An
// input that only forward nodes read (a weight read by its transpose) lives only while the
// forwards of the blocks that read it run. The other values of the rest are made first and
// held throughout. *fwd and *bwd: per block, during its forward and its backward.
void rest_at(const Graph& g, const BlockSequence& b, std::vector<int64_t>* fwd,
             std::vector<int64_t>* bwd) {
  const auto users = g.users();
  const int L = b.size();
  std::vector<int64_t> at(L + 1, 0), only_fwd(L + 1, 0);
  for (int u : b.rest) {
    int lo = L, hi = L - 1;
    bool backward = false;
    for (int w : users[u]) {
      if (b.block_of[w] < 0) continue;
      lo = std::min(lo, b.block_of[w]);
      backward = backward || b.late[w];
    }
    if (!is_input(g.nodes[u]) || lo == L) lo = 0, backward = true;
    if (!backward) {
      hi = lo;
      for (int w : users[u]) hi = std::max(hi, b.block_of[w]);
    }
    auto& diff = backward ? at : only_fwd;
    diff[lo] += g.nodes[u].bytes;
    diff[hi + 1] -= g.nodes[u].bytes;
  }
  fwd->assign(L, 0);
  bwd->assign(L, 0);
  int64_t both = 0, forward = 0;
  for (int i = 0; i < L; ++i) {
    both += at[i];
    forward += only_fwd[i];
    (*bwd)[i] = both;
    (*fwd)[i] = both + forward;
  }
}

ChainModel build_chain_model(const Graph& g, const BlockSequence& b,
                             const std::vector<BlockProblem>& probs,
                             const std::vector<KindPlan>& kinds) {
  const int L = b.size();
  ChainModel c;
  c.act.assign(L + 1, 0);
  for (int i = 1; i <= L; ++i) c.act[i] = g.nodes[b.out[i - 1]].bytes;
  c.grads_in = grads_in(g, b);
  rest_at(g, b, &c.rest_fwd, &c.rest_bwd);
  for (int i = 0; i < L; ++i) {
    const KindPlan& k = kinds[b.kind[i]];
    c.block_grads_in.push_back(probs[i].grad_in_bytes);
    c.advance_peak.push_back(k.advance_peak);
    c.advance_cost.push_back(k.advance_cost);
    c.rerunnable.push_back(b.rerunnable[i]);
    c.strategies.push_back(&k.strategies);
  }
  return c;
}

// Places each input (or tangent) right before the first step that reads it (an input counts from
// its step: a late layer's weights need not be held through the early forward).
std::vector<int> place_inputs_lazily(const Graph& g, const std::vector<int>& order) {
  std::vector<char> placed(g.size(), 0);
  std::vector<int> out;
  out.reserve(order.size());
  for (int v : order) {
    for (int u : g.nodes[v].inputs) {
      if (!is_input(g.nodes[u]) || placed[u]) continue;
      placed[u] = 1;
      out.push_back(u);
    }
    if (is_input(g.nodes[v]) && placed[v]) continue;
    placed[v] = 1;
    out.push_back(v);
  }
  return out;
}

// The schedule of the DP's ops: the rest first (inputs where they are first read), then
// each op's steps in global ids.
std::vector<int> assemble(const Graph& g, const BlockSequence& b,
                          const std::vector<BlockProblem>& probs,
                          const std::vector<KindPlan>& kinds, const std::vector<ChainOp>& ops) {
  std::vector<int> order;
  for (int v : b.rest)
    if (!is_input(g.nodes[v])) order.push_back(v);
  for (const ChainOp& op : ops) {
    const KindPlan& k = kinds[b.kind[op.block]];
    const std::vector<int>& seq = op.kind == ChainOp::kAdvance   ? k.advance
                                  : op.kind == ChainOp::kForward ? k.strategies[op.strategy].fwd
                                                                 : k.strategies[op.strategy].bwd;
    for (int v : seq) order.push_back(probs[op.block].global[v]);
  }
  for (int v : b.rest)
    if (is_input(g.nodes[v])) order.push_back(v);  // unread inputs: at the end
  return place_inputs_lazily(g, order);
}

// Note [Moving the DP's memory]
// The DP's model is conservative in places (the rest held throughout, though inputs are
// placed where first read; sizes rounded up to its unit; pinned values counted twice) and
// blind in others (values that outlive their block in the assembled order), so the memory
// handed to it is searched: from the least memory the DP can work with up to a quarter
// above the budget, by bisection for the largest memory whose assembled schedule the
// simulator finds within the budget, then a sweep below it (the simulated cost is not
// monotone in the DP's memory). Then the simulator's repair (greedy's: add the cheapest
// recomputations that bring the peak within the budget, then drop those it does not need)
// runs on the cheapest probes, fitting or a little over: a probe just above the boundary
// often needs one or two recomputations where the next fitting probe, a unit lower in the
// DP, recomputes whole blocks. The cheapest repaired schedule wins.
class MemorySearch {
 public:
  MemorySearch(const Graph& g, const BlockSequence& b, const std::vector<BlockProblem>& probs,
               const std::vector<KindPlan>& kinds, const rockmate::ChainSolver& solver,
               int64_t budget)
      : g_(g), b_(b), probs_(probs), kinds_(kinds), solver_(solver), budget_(budget) {}

  // Probes until `probes` expires, repairs until `repairs` does.
  void run(const Deadline& probes, const Deadline& repairs) {
    run_probes(probes);
    repair(repairs);
  }

  bool found() const { return !best_.empty(); }
  const std::vector<int>& best() const { return best_; }
  int probes() const { return probes_; }
  int repairs() const { return repairs_; }

 private:
  void run_probes(const Deadline& deadline) {
    int64_t fit = solver_.minimum_memory();
    if (fit < 0 || probe(fit) != 1) return;
    const int64_t top = solver_.top();
    int64_t miss = top + 1;
    if (probe(top) == 1) return;
    while (miss - fit > solver_.unit() && !deadline.expired()) {
      const int64_t mid = fit + (miss - fit) / 2;
      (probe(mid) == 1 ? fit : miss) = mid;
    }
    // The simulated cost is not monotone in the DP's memory: a sweep below the boundary.
    const int64_t lo = solver_.minimum_memory();
    for (int k = 1; k < 24 && !deadline.expired(); ++k) probe(lo + (fit - lo) * k / 24);
  }

  // 1: fits, 0: over the budget, -1: the DP finds nothing.
  int probe(int64_t memory) {
    ++probes_;
    auto r = solver_.solve(memory);
    if (!r) return -1;
    Schedule s{g_.name, prune_unread_instances(g_, assemble(g_, b_, probs_, kinds_, r->second))};
    const SimResult sim = simulate(g_, s, budget_);
    if (verbose_)
      fprintf(stderr,
              "rockmate: DP memory %lld: DP cost %.0f, simulated peak %lld (node %d, block %d) "
              "cost %.0f%s\n",
              static_cast<long long>(memory), r->first, static_cast<long long>(sim.peak_bytes),
              s.order[sim.peak_step], b_.block_of[s.order[sim.peak_step]], sim.cost,
              sim.valid ? "" : (" (" + sim.error + ")").c_str());
    // A schedule over the budget by more than this is left to the lower probes.
    const bool near = sim.peak_bytes <= budget_ + budget_ / 50;
    if (sim.valid || near) probed_.push_back({sim.cost, std::move(s.order)});
    return sim.valid ? 1 : 0;
  }

  // Note [Moving the DP's memory]: the repair of the cheapest probes.
  void repair(const Deadline& deadline) {
    std::sort(probed_.begin(), probed_.end(),
              [](const Probed& a, const Probed& b) { return a.cost < b.cost; });
    for (size_t i = 0; i < probed_.size() && i < kRepairs; ++i) {
      if (i > 0 && deadline.expired()) break;
      ++repairs_;
      std::vector<int> order =
          repair_order(g_, probed_[i].order, budget_, GreedyParams{}, &deadline);
      const SimResult sim = simulate(g_, Schedule{g_.name, order}, budget_);
      if (sim.valid && (best_.empty() || sim.cost < best_cost_)) {
        best_ = std::move(order);
        best_cost_ = sim.cost;
      }
    }
  }

  static constexpr size_t kRepairs = 6;
  struct Probed {
    double cost;
    std::vector<int> order;
  };
  std::vector<Probed> probed_;

  const Graph& g_;
  const BlockSequence& b_;
  const std::vector<BlockProblem>& probs_;
  const std::vector<KindPlan>& kinds_;
  const rockmate::ChainSolver& solver_;
  const int64_t budget_;
  std::vector<int> best_;
  double best_cost_ = 0;
  int probes_ = 0, repairs_ = 0;

 public:
  bool verbose_ = false;
};

// Note [Rockmate on a single block]
// A graph that is no sequence is one block: Rockmate's per-block solver gets the whole
// graph. Checkmate where the MILP is small, Moccasin where the CP model is, and the cheap
// planners; the cheapest schedule that fits wins.
RawPlan whole_graph(const Graph& g, const PlanOptions& opt, const std::string& why, Json* details) {
  Deadline deadline(opt);
  RawPlan best;
  double best_cost = std::numeric_limits<double>::infinity();
  std::string winner;
  auto consider = [&](const char* name, absl::StatusOr<RawPlan> raw) {
    if (!raw.ok() || raw->order.empty()) return;
    // As the block sequence's probes are (Note [Moving the DP's memory]): without the
    // recomputations the budget does not need.
    if (opt.budget_bytes)
      raw->order =
          repair_order(g, std::move(raw->order), *opt.budget_bytes, GreedyParams{}, &deadline);
    const SimResult sim = simulate(g, Schedule{g.name, raw->order}, opt.budget_bytes);
    if (!sim.valid || sim.cost >= best_cost) return;
    best_cost = sim.cost;
    best = *std::move(raw);
    winner = name;
  };
  PlanOptions o = opt;
  for (const char* name : {"greedy", "chen", "twremat"}) {
    if (deadline.expired()) break;
    o.time_limit_seconds = std::max(0.5, deadline.left());
    if (name == std::string("greedy")) consider(name, plan_greedy(g, o));
    if (name == std::string("chen")) consider(name, plan_chen(g, o));
    if (name == std::string("twremat")) consider(name, plan_tw_remat(g, o));
  }
  if (g.size() <= 150 && !deadline.expired()) {
    o.time_limit_seconds = std::max(0.5, deadline.left() * 0.6);
    consider("checkmate", plan_checkmate(g, o));
  }
  if (g.size() <= 400 && opt.budget_bytes && !deadline.expired()) {
    o.time_limit_seconds = std::max(0.5, deadline.left() * 0.8);
    consider("moccasin", plan_moccasin(g, o));
  }
  (*details)["blocks"] = 1;
  (*details)["kinds"] = 1;
  (*details)["single_block"] = why;
  (*details)["solver"] = winner.empty() ? "none fitted" : winner;
  best.note = absl::StrCat("rockmate: one block (", why, "), solved by ",
                           winner.empty() ? "nothing that fits" : winner);
  return best;
}

}  // namespace
}  // namespace remat::detail

namespace remat::detail {
namespace {

// Note [Strategies across calls]
// A kind's strategies do not depend on the budget: only the DP does. A caller that plans
// the same step at several budgets (remat-compare's sweep, the trainer's policy auto at
// five fractions) would solve every kind's grid again each time, so solved kinds are kept
// by signature for the process, at most kMaxCachedKinds of them, and a later call takes
// them as they are (its report says `cached`). The first call's time share is what they
// got; a later call with more time does not improve them.
constexpr size_t kMaxCachedKinds = 512;

class KindCache {
 public:
  std::optional<KindPlan> find(const std::vector<int64_t>& signature) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = kinds_.find(signature);
    if (it == kinds_.end()) return std::nullopt;
    return it->second;
  }
  void insert(std::vector<int64_t> signature, const KindPlan& k) {
    std::lock_guard<std::mutex> lock(mu_);
    if (kinds_.size() >= kMaxCachedKinds) kinds_.clear();
    kinds_.emplace(std::move(signature), k);
  }

 private:
  std::mutex mu_;
  std::map<std::vector<int64_t>, KindPlan> kinds_;
};

KindCache& solved_kinds() {
  static KindCache* cache = new KindCache;
  return *cache;
}

// Per kind: its strategies (Note [Strategies across calls]), within a share of `seconds` in
// proportion to its size.
std::vector<KindPlan> plan_kinds(const Graph& g, const BlockSequence& b,
                                 const std::vector<BlockProblem>& probs, double seconds,
                                 bool verbose) {
  const int K = static_cast<int>(b.representative.size());
  std::vector<double> weight(K);
  double total = 0;
  for (int k = 0; k < K; ++k) {
    const double n = probs[b.representative[k]].sub.size();
    total += weight[k] = n;
  }
  std::vector<KindPlan> kinds(K);
  Deadline deadline(seconds);
  double left_weight = total;
  for (int k = 0; k < K; ++k) {
    const BlockProblem& p = probs[b.representative[k]];
    std::vector<int64_t> signature = rockmate::block_signature(g, p);
    if (std::optional<KindPlan> cached = solved_kinds().find(signature)) {
      left_weight -= weight[k];
      kinds[k] = *std::move(cached);
      kinds[k].cached = true;
    } else {
      const double share = std::max(0.0, deadline.left()) * weight[k] / left_weight;
      left_weight -= weight[k];
      kinds[k] = rockmate::plan_kind(p, share, verbose);
      // A kind cut short by the time limit (no time for even the cheap strategies) is not
      // kept: a later call may have the time.
      if (!kinds[k].strategies.empty()) solved_kinds().insert(std::move(signature), kinds[k]);
    }
    kinds[k].first_block = b.representative[k];
    kinds[k].blocks = static_cast<int>(std::count(b.kind.begin(), b.kind.end(), k));
  }
  return kinds;
}

Json kinds_json(const std::vector<KindPlan>& kinds) {
  Json list = Json::array();
  for (const KindPlan& k : kinds) {
    list.push_back({{"first_block", k.first_block},
                    {"blocks", k.blocks},
                    {"nodes", k.nodes},
                    {"strategies", k.strategies.size()},
                    {"candidates", k.candidates},
                    {"solver", k.solver},
                    {"grid", absl::StrCat(k.grid_side, "x", k.grid_side)},
                    {"grid_solved", k.grid_solved},
                    {"grid_skipped", k.grid_skipped},
                    {"grid_optimal", k.cbc_optimal},
                    {"cached", k.cached},
                    {"seconds", k.seconds}});
  }
  return list;
}

// The DP's memory steps: as many as the table allows, up to 400.
int memory_steps(int blocks) {
  const int64_t l2 = static_cast<int64_t>(blocks) * blocks;
  return static_cast<int>(std::clamp<int64_t>(20'000'000 / std::max<int64_t>(l2, 1), 50, 400));
}

}  // namespace

namespace {

// What the plan's details say of the blocks, their kinds and the DP.
void note_chain_details(const Graph& g, const BlockSequence& b, const std::vector<KindPlan>& kinds,
                        const rockmate::ChainSolver& solver, const MemorySearch& search,
                        Json& details) {
  int64_t held = 0;  // outside every block, or pinned
  for (int v : b.rest) held += g.nodes[v].bytes;
  for (int v = 0; v < g.size(); ++v) held += b.pinned[v] ? g.nodes[v].bytes : 0;
  details["blocks"] = b.size();
  details["kinds"] = kinds.size();
  details["merged_blocks"] = b.merges;
  details["kind_list"] = kinds_json(kinds);
  details["dp"] = {{"memory_steps", memory_steps(b.size())},
                   {"unit_bytes", solver.unit()},
                   {"probes", search.probes()},
                   {"repaired_probes", search.repairs()},
                   {"held_bytes", held}};
}

}  // namespace

absl::StatusOr<RawPlan> plan_rockmate(const Graph& g, const PlanOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  Deadline deadline(opt);
  const BlockSequence b = rockmate::detect_blocks(g);
  Json details;
  details["seconds"]["detection"] = seconds_since(t0);
  if (b.size() < 2) {
    RawPlan plan = whole_graph(g, opt, b.note, &details);
    details["seconds"]["total"] = seconds_since(t0);
    plan.details = details.dump();
    return plan;
  }
  auto out_of_time = [&](const char* phase) {
    RawPlan none;
    none.note = absl::StrCat("rockmate: no plan in time (", phase, " took the time limit)");
    details["seconds"]["total"] = seconds_since(t0);
    none.details = details.dump();
    return none;
  };
  if (deadline.expired()) return out_of_time("detecting the blocks");
  std::vector<BlockProblem> probs;
  for (int i = 0; i < b.size(); ++i) {
    if (deadline.expired()) return out_of_time("building the blocks' problems");
    probs.push_back(rockmate::build_block_problem(g, b, i));
  }
  const auto t1 = std::chrono::steady_clock::now();
  // Most of the time goes to the blocks' MILPs; the DP and its probes take the rest.
  const std::vector<KindPlan> kinds = plan_kinds(g, b, probs, deadline.left() * 0.6, opt.verbose);
  details["seconds"]["strategies"] = seconds_since(t1);
  const auto t2 = std::chrono::steady_clock::now();
  const ChainModel chain = build_chain_model(g, b, probs, kinds);
  const int64_t budget = opt.budget_bytes ? *opt.budget_bytes : file_order_peak(g);
  rockmate::ChainSolver solver;
  RawPlan plan;
  // The DP's memory may exceed the budget where its model is conservative: the search
  // looks up to a quarter above it.
  if (!solver.fill(chain, budget + budget / 4, memory_steps(b.size())))
    return absl::InternalError("rockmate: the DP table is too large");
  MemorySearch search(g, b, probs, kinds, solver, budget);
  search.verbose_ = opt.verbose;
  // The probes stop with a fifth of the time left, which the repair of the best ones takes.
  search.run(Deadline(deadline.left() * 0.8), deadline);
  details["seconds"]["dp"] = seconds_since(t2);
  if (search.found()) plan.order = search.best();
  note_chain_details(g, b, kinds, solver, search, details);
  details["seconds"]["total"] = seconds_since(t0);
  plan.details = details.dump();
  plan.note = absl::StrCat("rockmate: ", b.size(), " blocks of ", kinds.size(), " kinds");
  if (!search.found()) absl::StrAppend(&plan.note, "; the DP found no schedule within the budget");
  return plan;
}

}  // namespace remat::detail
