// greedy: XLA-style rematerialization. Walk to where memory exceeds the budget, pick a value
// resident there but not read there, free it after its last read before that point and
// recompute it right before its next read; choose by memory relieved per unit of cost.
// Memory is measured exactly (docs/formats.md). A final pass drops recomputations that the
// budget no longer needs.
#include <algorithm>
#include <cmath>
#include <random>

#include "internal.h"

namespace remat::detail {
namespace {

struct Eval {
  std::vector<int> last_read;             // per step
  std::vector<std::vector<int>> readers;  // per step: steps reading that instance
  std::vector<int64_t> mem;
  int64_t peak = 0;
  int peak_step = 0;
  double excess = 0;
};

void evaluate(const Graph& g, const std::vector<int>& order, int64_t budget, Eval* e,
              bool want_readers) {
  const int L = static_cast<int>(order.size());
  std::vector<int> latest(g.size(), -1);
  e->last_read.assign(L, 0);
  if (want_readers) e->readers.assign(L, {});
  for (int j = 0; j < L; ++j) {
    e->last_read[j] = j;
    for (int u : g.nodes[order[j]].inputs) {
      int inst = latest[u];
      e->last_read[inst] = j;
      if (want_readers && (e->readers[inst].empty() || e->readers[inst].back() != j))
        e->readers[inst].push_back(j);
    }
    latest[order[j]] = j;
  }
  std::vector<int64_t> delta(L + 1, 0);
  for (int j = 0; j < L; ++j) {
    delta[j] += g.nodes[order[j]].bytes;
    delta[e->last_read[j] + 1] -= g.nodes[order[j]].bytes;
  }
  e->mem.assign(L, 0);
  int64_t cur = 0;
  e->peak = 0;
  e->excess = 0;
  for (int j = 0; j < L; ++j) {
    cur += delta[j];
    e->mem[j] = cur;
    if (cur > e->peak) {
      e->peak = cur;
      e->peak_step = j;
    }
    if (cur > budget) e->excess += static_cast<double>(cur - budget);
  }
}

// The repair's random source (drawn from only with noise > 0).
struct RepairRandom {
  explicit RepairRandom(uint64_t seed) : rng(seed) {}
  std::mt19937_64 rng;
  std::uniform_real_distribution<double> unif{0.0, 1.0};
  double uniform() { return unif(rng); }
};

// The violating step to relieve: the peak (or, with noise, a random violating step).
int step_to_relieve(const Eval& e, int64_t budget, const GreedyParams& p, RepairRandom* rand) {
  int p_step = e.peak_step;
  if (p.noise > 0 && rand->uniform() < 0.3) {
    std::vector<int> viol;
    for (size_t j = 0; j < e.mem.size(); ++j)
      if (e.mem[j] > budget) viol.push_back(static_cast<int>(j));
    p_step = viol[rand->rng() % viol.size()];
  }
  return p_step;
}

// A recomputation to try: instance `inst` again right before its first reader r1 after
// the step to relieve; pre is the bytes-per-cost estimate that ranks it.
struct Cand {
  int inst;
  int r1;
  double pre;
};

// Instances resident at p_step but not read there that may be recomputed, the most
// promising kMax of them.
std::vector<Cand> recompute_candidates(const Graph& g, const std::vector<int>& order, const Eval& e,
                                       int p_step, const GreedyParams& p, RepairRandom* rand) {
  std::vector<Cand> cands;
  for (int i = 0; i < p_step; ++i) {
    if (e.last_read[i] <= p_step) continue;
    int v = order[i];
    if (!g.nodes[v].can_recompute() || g.nodes[v].bytes == 0) continue;
    const auto& rd = e.readers[i];
    if (std::binary_search(rd.begin(), rd.end(), p_step)) continue;
    int r1 = *std::upper_bound(rd.begin(), rd.end(), p_step);
    double pre =
        static_cast<double>(g.nodes[v].bytes) / std::pow(g.nodes[v].cost + 1e-3, p.cost_exp);
    if (p.noise > 0) pre *= std::exp(p.noise * (rand->uniform() - 0.5));
    cands.push_back({i, r1, pre});
  }
  const size_t kMax = order.size() < 2000 ? 150 : 40;
  if (cands.size() > kMax) {
    std::partial_sort(cands.begin(), cands.begin() + kMax, cands.end(),
                      [](const Cand& a, const Cand& b) { return a.pre > b.pre; });
    cands.resize(kMax);
  }
  return cands;
}

// The order with the candidate recomputation that relieves the most excess memory per unit
// of cost; empty when none helps. *trial is scratch space.
std::vector<int> best_recomputation(const Graph& g, const std::vector<int>& order, int64_t budget,
                                    const Eval& e, const std::vector<Cand>& cands, int p_step,
                                    const GreedyParams& p, RepairRandom* rand, Eval* trial) {
  double best_score = 0;
  std::vector<int> best_order;
  for (const Cand& c : cands) {
    std::vector<int> o;
    o.reserve(order.size() + 1);
    o.insert(o.end(), order.begin(), order.begin() + c.r1);
    o.push_back(order[c.inst]);
    o.insert(o.end(), order.begin() + c.r1, order.end());
    evaluate(g, o, budget, trial, false);
    double gain = e.excess - trial->excess;
    if (trial->mem[p_step] >= e.mem[p_step] && gain <= 0) continue;
    double score = (gain + 1e-9 * (e.mem[p_step] - trial->mem[p_step])) /
                   std::pow(g.nodes[order[c.inst]].cost + 1e-3, p.cost_exp);
    if (p.noise > 0) score *= std::exp(p.noise * (rand->uniform() - 0.5));
    if (score > best_score) {
      best_score = score;
      best_order = std::move(o);
    }
  }
  return best_order;
}

// Drops recomputations the budget does not need (latest first), most expensive first.
std::vector<int> drop_unneeded_recomputations(const Graph& g, const std::vector<int>& order,
                                              int64_t budget, const Deadline* deadline,
                                              Eval* trial) {
  std::vector<int> seen(g.size(), 0), recomp;
  for (size_t j = 0; j < order.size(); ++j)
    if (seen[order[j]]++) recomp.push_back(static_cast<int>(j));
  std::sort(recomp.begin(), recomp.end(), [&](int a, int b) {
    return g.nodes[order[a]].cost > g.nodes[order[b]].cost ||
           (g.nodes[order[a]].cost == g.nodes[order[b]].cost && a > b);
  });
  std::vector<char> removed(order.size(), 0);
  for (int j : recomp) {
    if (deadline && deadline->expired()) break;
    removed[j] = 1;
    std::vector<int> o;
    for (size_t k = 0; k < order.size(); ++k)
      if (!removed[k]) o.push_back(order[k]);
    evaluate(g, o, budget, trial, false);
    if (trial->peak > budget) removed[j] = 0;
  }
  std::vector<int> o;
  for (size_t k = 0; k < order.size(); ++k)
    if (!removed[k]) o.push_back(order[k]);
  return o;
}

}  // namespace

std::vector<int> repair_order(const Graph& g, std::vector<int> order, int64_t budget,
                              const GreedyParams& p, const Deadline* deadline) {
  RepairRandom rand(p.seed);
  Eval e, trial;
  evaluate(g, order, budget, &e, true);
  int stall = 0;
  while (e.peak > budget) {
    if (deadline && deadline->expired()) break;
    const int p_step = step_to_relieve(e, budget, p, &rand);
    std::vector<Cand> cands = recompute_candidates(g, order, e, p_step, p, &rand);
    if (cands.empty()) break;
    std::vector<int> best_order =
        best_recomputation(g, order, budget, e, cands, p_step, p, &rand, &trial);
    if (best_order.empty()) {
      if (++stall > 2) break;
      continue;
    }
    stall = 0;
    order = std::move(best_order);
    evaluate(g, order, budget, &e, true);
  }
  if (e.peak <= budget) order = drop_unneeded_recomputations(g, order, budget, deadline, &trial);
  return order;
}

absl::StatusOr<RawPlan> plan_greedy(const Graph& g, const PlanOptions& opt) {
  RawPlan plan;
  std::vector<int> order(g.size());
  for (int v = 0; v < g.size(); ++v) order[v] = v;
  if (!opt.budget_bytes) {
    plan.order = order;
    plan.note = "no budget: nothing to rematerialize";
    return plan;
  }
  Deadline deadline(opt);
  GreedyParams gp;
  plan.order = repair_order(g, order, *opt.budget_bytes, gp, &deadline);
  return plan;
}

}  // namespace remat::detail
