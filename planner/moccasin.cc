// moccasin: the retention-interval model of Bartan et al. (2023) on Gecode.
//
// Stages are the nodes in id (topological) order: stage t computes node t, preceded by the
// recomputations scheduled at t (in id order). Node v has C retention intervals
// [s_{v,i}, E_{v,i}) of stages; interval 0 is active and starts at v, interval i > 0 is an
// optional recomputation starting after interval i-1 ends. A computation at stage s of
// node w needs every input u to have an active interval covering s. Memory: a cumulative
// resource of capacity `budget` over the active intervals (sizes scaled to keep Gecode's
// integers safe, rounded up, so the model is conservative). The schedule's exact peak is
// then measured by the simulator.
//
// Two phases: (1) reach the budget: minimise the peak by large-neighbourhood search
// (restarts that keep a random part of the best solution) until it fits, the branching
// guided by a seed schedule (the greedy repair's, mapped to intervals); (2) minimise the
// total recomputation cost from that solution until the time limit, by complete branch and
// bound on small models (which proves optimality) and by large-neighbourhood search on
// larger ones.
#include <absl/strings/str_cat.h>

#include <gecode/int.hh>
#include <gecode/minimodel.hh>
#include <gecode/search.hh>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>

#include "internal.h"
#include "remat/schedule.h"

namespace remat::detail {
namespace {

using namespace Gecode;

struct ModelData {
  const Graph* g = nullptr;
  int n = 0, C = 2;
  std::vector<int> intervals;  // per node: how many intervals it may have (1 or C)
  std::vector<int> first;      // index of (v, 0) in the flat arrays
  std::vector<int> usage;      // scaled bytes per node
  int capacity = 0;
  int min_capacity = 0;   // a lower bound on any peak (scaled)
  std::vector<int> cost;  // scaled cost per node
  // Seed values (flat, -1: none).
  std::vector<int> seed_a, seed_t, seed_p;
  double lns_keep = 0.4;
  uint64_t seed = 1;
};

std::vector<int> distinct_inputs(const Graph& g, int v) {
  std::vector<int> ins = g.nodes[v].inputs;
  std::sort(ins.begin(), ins.end());
  ins.erase(std::unique(ins.begin(), ins.end()), ins.end());
  return ins;
}

class IntervalModel : public IntMinimizeSpace {
 public:
  BoolVarArray a;
  IntVarArray t, s, p;
  IntVar total, peak;
  const ModelData* d;
  bool phase1 = false;

  // reach_budget: phase 1, the capacity is a variable to minimise; otherwise it is the
  // budget and the objective is the recomputation cost.
  IntervalModel(const ModelData& data, bool reach_budget) : d(&data), phase1(reach_budget) {
    const int n = data.n;
    const int horizon = n * n;
    int m = data.first.back();
    a = BoolVarArray(*this, m, 0, 1);
    t = IntVarArray(*this, m, 0, n - 1);
    s = IntVarArray(*this, m, 0, horizon - 1);
    p = IntVarArray(*this, m, 1, horizon);
    Posting post(m);
    post_intervals(data, &post);
    post_dependencies(data, &post);
    post_memory(data, reach_budget, post);
    post_branching(data, post.serve);
  }

  IntervalModel(IntervalModel& o) : IntMinimizeSpace(o), d(o.d), phase1(o.phase1) {
    peak.update(*this, o.peak);
    a.update(*this, o.a);
    t.update(*this, o.t);
    s.update(*this, o.s);
    p.update(*this, o.p);
    total.update(*this, o.total);
  }
  Space* copy() override { return new IntervalModel(*this); }
  IntVar cost() const override { return phase1 ? peak : total; }

  // Large-neighbourhood search: after a restart, keep a random part of the best solution.
  bool slave(const MetaInfo& mi) override {
    if (mi.type() == MetaInfo::RESTART && mi.last() != nullptr) {
      const auto& best = static_cast<const IntervalModel&>(*mi.last());
      std::mt19937_64 rng(d->seed * 1000003ULL + mi.restart());
      std::uniform_real_distribution<double> u(0, 1);
      // Keep whole nodes (all their intervals) from a random window-free sample.
      for (int v = 0; v < d->n; ++v) {
        if (u(rng) >= d->lns_keep) continue;
        for (int i = 0; i < d->intervals[v]; ++i) {
          int k = d->first[v] + i;
          rel(*this, a[k] == best.a[k].val());
          if (best.a[k].val()) {
            rel(*this, t[k] == best.t[k].val());
            rel(*this, p[k] == best.p[k].val());
          }
        }
      }
      return false;
    }
    return true;
  }

 private:
  // Per-interval arrays that the constraints share while the model is posted.
  struct Posting {
    explicit Posting(int m) : ends(m), reach(m), use(m), w(m), opt(m) {}
    IntVarArgs ends;
    std::vector<IntVarArgs> reach;  // candidate ends: own slot + 1, and each served read + 1
    IntArgs use;
    IntArgs w;
    BoolVarArgs opt;
    BoolVarArgs serve;  // whether an interval serves a read, one per (reader, input interval)
  };

  void post_intervals(const ModelData& data, Posting* post) {
    const int n = data.n;
    const int horizon = n * n;
    for (int v = 0; v < n; ++v) {
      for (int i = 0; i < data.intervals[v]; ++i) {
        int k = data.first[v] + i;
        // Slot of a computation of v in stage t: t * n + v (a stage runs its
        // recomputations in id order, then its own node).
        rel(*this, s[k] == n * t[k] + v);
        post->ends[k] = expr(*this, s[k] + p[k]);
        rel(*this, post->ends[k] <= horizon);
        post->reach[k] << expr(*this, s[k] + 1);
        post->use[k] = data.usage[v];
        post->w[k] = i == 0 ? 0 : data.cost[v];
        post->opt[k] = a[k];
        if (i == 0) {
          rel(*this, a[k] == 1);
          rel(*this, t[k] == v);
        } else {
          rel(*this, a[k] <= a[k - 1]);
          // Active: starts after the previous interval ends. Inactive: fixed.
          rel(*this, s[k], IRT_GQ, post->ends[k - 1], Reify(a[k], RM_IMP));
          BoolVar off = expr(*this, !a[k]);
          rel(*this, t[k], IRT_EQ, n - 1, Reify(off, RM_IMP));
          rel(*this, p[k], IRT_EQ, 1, Reify(off, RM_IMP));
        }
      }
    }
  }

  // Whether interval ku of an input serves the computation kw: then ku is active and
  // covers kw's slot, and it ends right after the last read it serves (exact accounting).
  BoolVar post_serve(int ku, int kw, int horizon, Posting* post) {
    BoolVar b(*this, 0, 1);
    rel(*this, b <= a[ku]);
    rel(*this, s[ku], IRT_LE, s[kw], Reify(b, RM_IMP));
    rel(*this, post->ends[ku], IRT_GR, s[kw], Reify(b, RM_IMP));
    IntVar after = expr(*this, s[kw] + 1);
    IntVar term(*this, 0, horizon);
    ite(*this, b, after, IntVar(*this, 0, 0), term);
    post->reach[ku] << term;
    return b;
  }

  // Dependencies: every active computation of w finds each input u resident.
  void post_dependencies(const ModelData& data, Posting* post) {
    const int horizon = data.n * data.n;
    for (int wv = 0; wv < data.n; ++wv) {
      std::vector<int> ins = distinct_inputs(*data.g, wv);
      for (int i = 0; i < data.intervals[wv]; ++i) {
        int kw = data.first[wv] + i;
        for (int u : ins) {
          BoolVarArgs cover;
          for (int j = data.intervals[u] - 1; j >= 0; --j) {  // newest first
            BoolVar b = post_serve(data.first[u] + j, kw, horizon, post);
            cover << b;
            post->serve << b;
          }
          clause(*this, BOT_OR, cover, BoolVarArgs() << a[kw], 1);
        }
      }
    }
  }

  // Interval ends, the objective, and memory as a cumulative resource.
  void post_memory(const ModelData& data, bool reach_budget, const Posting& post) {
    const int m = data.first.back();
    for (int k = 0; k < m; ++k) max(*this, post.reach[k], post.ends[k]);
    total = IntVar(*this, 0, Int::Limits::max);
    linear(*this, post.w, a, IRT_EQ, total);
    if (reach_budget) {
      int64_t all = 0;
      for (int v = 0; v < data.n; ++v) all += data.usage[v];
      peak = IntVar(*this, data.min_capacity,
                    static_cast<int>(std::min<int64_t>(all, Int::Limits::max)));
      cumulative(*this, peak, s, p, post.ends, post.use, post.opt);
    } else {
      peak = IntVar(*this, data.capacity, data.capacity);
      cumulative(*this, data.capacity, s, p, post.ends, post.use, post.opt);
    }
  }

  // Branching, interleaved per interval: whether it is active, then its stage; seed values
  // first, otherwise active and as late as possible (a recomputation right before its
  // reader holds memory least). Then which intervals serve the reads, the lengths, and the
  // peak.
  void post_branching(const ModelData& data, const BoolVarArgs& serve) {
    const int m = data.first.back();
    IntVarArgs dec;
    std::vector<int> seed_vals;
    for (int k = 0; k < m; ++k) {
      dec << channel(*this, a[k]);
      seed_vals.push_back(data.seed_a.empty() ? -1 : data.seed_a[k]);
      dec << t[k];
      seed_vals.push_back(data.seed_t.empty() ? -1 : data.seed_t[k]);
    }
    auto sv = std::make_shared<std::vector<int>>(std::move(seed_vals));
    branch(*this, dec, INT_VAR_NONE(), INT_VAL([sv](const Space&, IntVar x, int i) {
      int v = (*sv)[i];
      return (v >= 0 && x.in(v)) ? v : x.max();
    }));
    branch(*this, serve, BOOL_VAR_NONE(), BOOL_VAL_MAX());
    branch(*this, p, INT_VAR_NONE(), INT_VAL_MIN());  // fixed by propagation already
    branch(*this, peak, INT_VAL_MIN());
  }
};

// The stage of each step of `order`: the next first computation at or after it. False when
// the first computations do not follow id order (the model's stages).
bool stages_of_steps(const std::vector<int>& order, int n, std::vector<int>* stage) {
  stage->assign(order.size(), 0);
  int next_first = 0;
  std::vector<char> seen(n, 0);
  for (size_t j = 0; j < order.size(); ++j) {
    if (!seen[order[j]]) {
      if (order[j] != next_first) return false;
      seen[order[j]] = 1;
      ++next_first;
    }
  }
  if (next_first != n) return false;
  int t = n;
  std::fill(seen.begin(), seen.end(), 0);
  std::vector<char> is_first(order.size(), 0);
  for (size_t j = 0; j < order.size(); ++j) {
    if (!seen[order[j]]) {
      seen[order[j]] = 1;
      is_first[j] = 1;
    }
  }
  for (size_t j = order.size(); j-- > 0;) {
    if (is_first[j]) t = order[j];
    (*stage)[j] = t;
  }
  return true;
}

// Maps an order whose first computations follow id order to interval values; false when
// it does not fit the model (then there is no seed).
bool seed_from_order(const Graph& g, const std::vector<int>& order, ModelData* d) {
  const int n = g.size();
  std::vector<int> stage;
  if (!stages_of_steps(order, n, &stage)) return false;
  // Slots: stage * n + node; an instance lasts through the slot of its last reader.
  auto slot = [&](size_t j) { return stage[j] * n + order[j]; };
  std::vector<int> latest(n, -1), last_read(order.size());
  for (size_t j = 0; j < order.size(); ++j) {
    last_read[j] = slot(j);
    for (int u : g.nodes[order[j]].inputs) {
      last_read[latest[u]] = std::max(last_read[latest[u]], slot(j));
    }
    latest[order[j]] = static_cast<int>(j);
  }
  int m = d->first.back();
  d->seed_a.assign(m, 0);
  d->seed_t.assign(m, -1);
  d->seed_p.assign(m, -1);
  std::vector<int> count(n, 0);
  for (size_t j = 0; j < order.size(); ++j) {
    int v = order[j];
    int i = count[v]++;
    if (i >= d->intervals[v]) continue;  // more instances than the model allows
    int k = d->first[v] + i;
    // Instances of the same node in one stage merge into one interval.
    if (i > 0 && d->seed_t[k - 1] == stage[j]) {
      --count[v];
      d->seed_p[k - 1] = std::max(d->seed_p[k - 1], last_read[j] - (stage[j] * n + v) + 1);
      continue;
    }
    d->seed_a[k] = 1;
    d->seed_t[k] = stage[j];
    d->seed_p[k] = last_read[j] - slot(j) + 1;
  }
  return true;
}

std::vector<int> extract(const ModelData& d, const IntervalModel& m) {
  std::vector<std::vector<int>> at(d.n);
  for (int v = 0; v < d.n; ++v) {
    for (int i = 1; i < d.intervals[v]; ++i) {
      int k = d.first[v] + i;
      if (m.a[k].val()) at[m.t[k].val()].push_back(v);
    }
  }
  std::vector<int> order;
  for (int t = 0; t < d.n; ++t) {
    std::sort(at[t].begin(), at[t].end());
    for (int v : at[t]) order.push_back(v);
    order.push_back(t);
  }
  return order;
}

// Costs as Gecode integers: whole costs up to 1e6 are kept, others are scaled so that the
// largest is 10000.
double cost_scale_of(const Graph& g) {
  double max_cost = 0;
  for (const Node& nd : g.nodes) max_cost = std::max(max_cost, nd.cost);
  double cost_scale = max_cost > 0 ? 10000.0 / max_cost : 1.0;
  bool integral = true;
  for (const Node& nd : g.nodes) {
    integral = integral && nd.cost == std::floor(nd.cost) && nd.cost <= 1e6;
  }
  if (integral) cost_scale = 1.0;
  return cost_scale;
}

// Sizes are counted in units that keep the capacity within a million, well inside Gecode's
// integers, and coarse enough that Gecode's cumulative accepts the model: it refuses one
// where (the largest capacity) x (the sum of the start domains' widths) x (the number of
// intervals) overflows a long long. The capacity reaches the sum of all sizes when the peak
// is minimised. Sizes round up, so a plan of the model fits the budget in bytes.
int64_t size_unit(const Graph& g, int64_t budget, int intervals_per_node) {
  const double horizon = static_cast<double>(g.size()) * g.size();
  double total = 0, intervals = 0;
  for (const Node& nd : g.nodes) {
    total += static_cast<double>(nd.bytes);
    intervals += nd.can_recompute() ? intervals_per_node : 1;
  }
  const double largest = std::max({total, static_cast<double>(budget), 1.0});
  // (largest / unit) x (intervals x horizon) x intervals <= 2e18, half of the limit.
  const double by_energy = largest * intervals * horizon * intervals / 2e18;
  const int64_t by_capacity = (budget + 999'999) / 1'000'000;
  return std::max<int64_t>({1, by_capacity, static_cast<int64_t>(std::ceil(by_energy))});
}

// The model's sizes, in units of `unit` bytes rounded up, and its intervals: C for a node
// that may be recomputed, 1 for one that may not.
ModelData build_model_data(const Graph& g, const PlanOptions& opt, int64_t budget, int64_t unit) {
  ModelData d;
  d.g = &g;
  d.n = g.size();
  d.C = std::max(1, opt.moccasin_intervals);
  d.seed = opt.seed;
  d.capacity = static_cast<int>(budget / unit);
  const double cost_scale = cost_scale_of(g);
  d.first.push_back(0);
  for (const Node& nd : g.nodes) {
    int c = nd.can_recompute() ? d.C : 1;
    d.intervals.push_back(c);
    d.first.push_back(d.first.back() + c);
    d.usage.push_back(static_cast<int>((nd.bytes + unit - 1) / unit));
    d.cost.push_back(static_cast<int>(std::lround(nd.cost * cost_scale)));
  }
  return d;
}

// A lower bound on any peak: each node with its distinct inputs, capped at the capacity.
int min_capacity(const Graph& g, const ModelData& d) {
  int min_capacity = 0;
  for (int v = 0; v < d.n; ++v) {
    int64_t need = d.usage[v];
    for (int u : distinct_inputs(g, v)) need += d.usage[u];
    min_capacity =
        static_cast<int>(std::max<int64_t>(min_capacity, std::min<int64_t>(need, d.capacity)));
  }
  return min_capacity;
}

// Diagnostics: does the seed satisfy the model?
void report_seed(const Graph& g, const ModelData& d, const std::vector<int>& seed_order) {
  IntervalModel probe(d, false);
  for (int k = 0; k < d.first.back(); ++k) {
    rel(probe, probe.a[k] == d.seed_a[k]);
    if (d.seed_a[k]) {
      rel(probe, probe.t[k] == d.seed_t[k]);
      rel(probe, probe.p[k] == d.seed_p[k]);
    }
  }
  fprintf(stderr, "moccasin: seed of %zu steps (peak %ld) %s the model\n", seed_order.size(),
          static_cast<long>(simulate(g, Schedule{g.name, seed_order, std::nullopt}).peak_bytes),
          probe.status() == SS_FAILED ? "violates" : "satisfies");
}

// Runs branch and bound (complete, or LNS restarts) from `root` until `done` says so or
// time runs out; returns the last solution, and sets *exhausted when the complete search
// covered the whole space.
template <typename Done>
std::unique_ptr<IntervalModel> run_search(IntervalModel* root, double seconds, Done done,
                                          bool* exhausted, bool complete) {
  std::unique_ptr<IntervalModel> last;
  Search::Options so;
  Search::TimeStop stop(static_cast<unsigned long>(std::max(0.02, seconds) * 1000));
  so.stop = &stop;
  *exhausted = false;
  if (complete) {
    BAB<IntervalModel> bab(root, so);
    while (IntervalModel* sol = bab.next()) {
      last.reset(sol);
      if (done(*sol)) return last;
    }
    *exhausted = !bab.stopped();
  } else {
    so.cutoff = Search::Cutoff::luby(100);
    RBS<IntervalModel, BAB> rbs(root, so);
    while (IntervalModel* sol = rbs.next()) {
      last.reset(sol);
      if (done(*sol)) return last;
    }
  }
  return last;
}

// Phase 1: minimise the peak until it fits the budget. Null, with plan->note saying why,
// when it does not.
std::unique_ptr<IntervalModel> reach_budget(const ModelData& d, const Deadline& deadline,
                                            bool* exhausted, RawPlan* plan) {
  IntervalModel p1(d, true);
  if (p1.status() == SS_FAILED) {
    plan->note = "moccasin: the model is infeasible";
    return nullptr;
  }
  auto reach = run_search(
      &p1, deadline.left() * 0.6,
      [&](const IntervalModel& m) { return m.peak.val() <= d.capacity; }, exhausted,
      /*complete=*/false);
  if (!reach || reach->peak.val() > d.capacity) {
    plan->note = absl::StrCat("moccasin (C=", d.C, ") did not reach the budget in time");
    return nullptr;
  }
  return reach;
}

// Phase 2: minimise the recomputation cost, starting from the phase-1 solution (the
// branching follows it first).
absl::StatusOr<std::unique_ptr<IntervalModel>> minimise_cost(ModelData* d, const Deadline& deadline,
                                                             std::unique_ptr<IntervalModel> reach,
                                                             bool* exhausted) {
  const int m = d->first.back();
  d->seed_a.resize(m);
  d->seed_t.resize(m);
  d->seed_p.resize(m);
  for (int k = 0; k < m; ++k) {
    d->seed_a[k] = reach->a[k].val();
    d->seed_t[k] = reach->t[k].val();
    d->seed_p[k] = reach->p[k].val();
  }
  IntervalModel p2(*d, false);
  if (p2.status() == SS_FAILED) return absl::InternalError("moccasin: phase 2 model failed");
  // Small models: complete branch and bound, which proves optimality.
  auto best = run_search(
      &p2, deadline.left(), [](const IntervalModel&) { return false; }, exhausted,
      /*complete=*/d->n <= 40);
  if (!best) best = std::move(reach);
  return best;
}

// Both phases. Null, with plan->note saying why, when phase 1 finds nothing that fits.
absl::StatusOr<std::unique_ptr<IntervalModel>> solve_model(ModelData* d, const Deadline& deadline,
                                                           bool* exhausted, RawPlan* plan) {
  try {
    std::unique_ptr<IntervalModel> reach = reach_budget(*d, deadline, exhausted, plan);
    if (!reach) return std::unique_ptr<IntervalModel>();
    return minimise_cost(d, deadline, std::move(reach), exhausted);
  } catch (const Exception& e) {
    return absl::InternalError(absl::StrCat("moccasin model: ", e.what()));
  }
}

constexpr int kMoccasinMaxNodes = 3000;

}  // namespace

absl::StatusOr<RawPlan> plan_moccasin(const Graph& g, const PlanOptions& opt) {
  RawPlan plan;
  Deadline deadline(opt);
  const int n = g.size();
  // The model has O(n^2) slots (its horizon is n^2 stages): past a few thousand nodes it
  // would take gigabytes before the search starts.
  if (n > kMoccasinMaxNodes) {
    plan.note = absl::StrCat("moccasin: graph too large for the CP model (", n, " nodes, at most ",
                             kMoccasinMaxNodes, ")");
    return plan;
  }
  std::vector<int> file(n);
  for (int v = 0; v < n; ++v) file[v] = v;
  if (!opt.budget_bytes) {
    plan.order = file;
    plan.note = "no budget: nothing to rematerialize";
    return plan;
  }
  const int64_t budget = *opt.budget_bytes;
  if (simulate(g, Schedule{g.name, file, std::nullopt}).peak_bytes <= budget) {
    plan.order = file;
    plan.optimal = true;
    return plan;
  }
  const int64_t unit = size_unit(g, budget, std::max(1, opt.moccasin_intervals));
  ModelData d = build_model_data(g, opt, budget, unit);
  for (int v = 0; v < n; ++v) {
    if (d.usage[v] > d.capacity) {
      plan.note = absl::StrCat("node ", v, " ('", g.nodes[v].name, "') alone exceeds the budget");
      return plan;
    }
  }
  // Seed: the greedy repair's plan, when it fits the model.
  GreedyParams gp;
  std::vector<int> seed_order = repair_order(g, file, budget, gp, &deadline);
  bool seeded = seed_from_order(g, prune_unread_instances(g, seed_order), &d);
  d.min_capacity = min_capacity(g, d);
  if (opt.verbose && seeded) report_seed(g, d, seed_order);
  bool exhausted = false;
  absl::StatusOr<std::unique_ptr<IntervalModel>> best =
      solve_model(&d, deadline, &exhausted, &plan);
  if (!best.ok()) return best.status();
  if (*best == nullptr) return plan;
  plan.order = extract(d, **best);
  plan.optimal = exhausted && unit == 1;
  plan.note = absl::StrCat("moccasin C=", d.C, exhausted ? ", optimal for the model" : "");
  return plan;
}

}  // namespace remat::detail
