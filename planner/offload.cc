// Planner "offload": keep, recompute or copy to host memory.
//
// Note [Replacing recomputations by offloads]
// A recompute-only plan that fits the budget is the start (`best`'s). Each of its
// recomputations of a node v is a candidate, the most expensive first: remove the step,
// and the recomputations that only fed it (read_instances), so that v's earlier instance
// serves the removed one's reads. That instance now lives longer; where the steps between
// its last read and the next one leave room, it waits in host memory in between
// (Note [Offloads in a schedule] in runtime/ir/offloads.cc). Its copies are placed by the
// schedule's clock: the fetch moves earlier, step by step, until the copy back has the time
// of the steps before the read to run in, and the free moves later until the copy out has
// ended, each only while the bytes it keeps on the device fit the budget (the clock is read
// with the free last, so that a wait at the free being placed does not count as time the
// copy had). Where no gap is left the instance simply stays. Outputs of one operator computed
// apart are joined the same way (Note [Joining a group computed apart]). The simulator judges the
// result: it is kept when it fits the budget and the host memory, and costs less, copies' waits
// included. So the plan is never worse than the one it started from, and each kept change is
// strictly cheaper.
#include <absl/container/flat_hash_map.h>
#include <absl/strings/str_cat.h>

#include <algorithm>
#include <cstddef>
#include <numeric>

#include "internal.h"
#include "nlohmann/json.hpp"
#include "remat/schedule.h"
#include "runtime/ir/instances.h"
#include "runtime/ir/offloads.h"

namespace remat::detail {
namespace {

using std::size_t;

// A schedule being improved; ids[j] names step j by its position in the order the current
// round of replacements started from (ascending: a join renumbers them).
struct Working {
  std::vector<int> order;
  std::vector<int> ids;
  std::vector<Offload> offloads;
};

// The steps kept[j] of `w`, and its offloads with their steps renumbered: a free or fetch
// moves to the next step kept. An offload whose instance goes, or whose gap closes, goes.
Working keep_steps(const Working& w, const std::vector<char>& kept) {
  std::vector<int> index(w.order.size() + 1, 0);  // new index of the first kept step >= j
  Working out;
  for (size_t j = 0; j < w.order.size(); ++j) {
    index[j] = static_cast<int>(out.order.size());
    if (!kept[j]) continue;
    out.order.push_back(w.order[j]);
    out.ids.push_back(w.ids[j]);
  }
  index[w.order.size()] = static_cast<int>(out.order.size());
  for (const Offload& o : w.offloads) {
    if (!kept[static_cast<size_t>(o.step)]) continue;
    const Offload moved{index[static_cast<size_t>(o.step)], index[static_cast<size_t>(o.free)],
                        index[static_cast<size_t>(o.fetch)]};
    if (moved.free < moved.fetch) out.offloads.push_back(moved);
  }
  return out;
}

class OffloadPass {
 public:
  OffloadPass(const Graph& g, const PlanOptions& opt, const Deadline& deadline)
      : g_(g), opt_(opt), deadline_(deadline) {}

  // Joins the groups computed apart, then rounds over the recomputations left until one
  // changes nothing; again while a join changed something (or until time runs out).
  Working run(Working w) {
    current_ =
        simulate(g_, schedule_with(g_, w.order, w.offloads), opt_.budget_bytes, opt_.host_link);
    if (!current_.valid) return w;
    for (bool joined = true; joined && !deadline_.expired();) {
      joined = opt_.host_memory_bytes > 0 && join_groups(&w);
      for (bool changed = true; changed && !deadline_.expired();) {
        changed = false;
        for (int id : candidates(w)) {
          if (deadline_.expired()) break;
          const auto at = std::find(w.ids.begin(), w.ids.end(), id);
          if (at == w.ids.end()) continue;  // pruned with an earlier replacement
          changed |= try_replace(&w, static_cast<int>(at - w.ids.begin()));
        }
      }
    }
    return w;
  }

 private:
  // The recomputations of `w`, by their ids, the most expensive node first.
  std::vector<int> candidates(const Working& w) const {
    std::vector<char> seen(static_cast<size_t>(g_.size()), 0);
    std::vector<int> steps;
    for (size_t j = 0; j < w.order.size(); ++j)
      if (seen[static_cast<size_t>(w.order[j])]++) steps.push_back(static_cast<int>(j));
    std::stable_sort(steps.begin(), steps.end(),
                     [&](int a, int b) { return cost_of(w, a) > cost_of(w, b); });
    std::vector<int> ids;
    for (int j : steps) ids.push_back(w.ids[static_cast<size_t>(j)]);
    return ids;
  }
  double cost_of(const Working& w, int j) const {
    return g_.nodes[static_cast<size_t>(w.order[static_cast<size_t>(j)])].cost;
  }

  // Removes the recomputation at step r and keeps its earlier instance instead, resident or
  // in host memory across the gap it leaves, whichever is cheaper; keeps the result where it
  // is cheaper than `w` (Note [Replacing recomputations by offloads]).
  bool try_replace(Working* w, int r) {
    const int v = w->order[static_cast<size_t>(r)];
    int earlier = r - 1;
    while (earlier >= 0 && w->order[static_cast<size_t>(earlier)] != v) --earlier;
    // A replacement earlier in this round may have pruned the instance before it (an
    // instance nothing read any more): this step is then v's first, nothing to replace.
    if (earlier < 0) return false;
    for (const Offload& o : w->offloads)
      if (o.step == earlier || o.step == r) return false;  // one offload an instance
    std::vector<char> kept(w->order.size(), 1);
    kept[static_cast<size_t>(r)] = 0;
    Working removed = keep_steps(*w, kept);
    Working resident = keep_steps(removed, read_instances(g_, removed.order));
    const auto index_of = [&](int id) {
      return static_cast<int>(std::lower_bound(resident.ids.begin(), resident.ids.end(), id) -
                              resident.ids.begin());
    };
    const int instance = index_of(w->ids[static_cast<size_t>(earlier)]);
    const int gap_end = index_of(w->ids[static_cast<size_t>(r)]);
    bool changed = consider(resident, w);
    if (opt_.host_memory_bytes > 0) {
      Working offloaded = resident;
      if (add_offload(&offloaded, instance, gap_end)) changed |= consider(offloaded, w);
    }
    return changed;
  }

  // Note [Joining a group computed apart]
  // In a graph whose groups run whole, a plan may compute one output of an operator in the
  // forward pass and another only where the backward pass reads it (attention's weights,
  // 402 MB a layer in GPT-2 124M at batch 8): the operator then runs twice, though no node
  // is computed twice. Such a member is moved to run beside its sibling, and its instance
  // waits in host memory until its read. The simulator judges it as it judges a replacement.
  bool join_groups(Working* w) {
    bool any = false;
    for (bool changed = true; changed && !deadline_.expired();) {
      changed = false;
      for (const auto& [early, late] : apart(*w)) {
        if (deadline_.expired()) break;
        if ((changed = try_join(w, early, late))) break;  // steps moved: find them again
      }
      any |= changed;
    }
    return any;
  }

  // Pairs (e, r): step r makes the first instance of a member of the group whose first
  // step is e, not in e's run of consecutive members.
  std::vector<std::pair<int, int>> apart(const Working& w) const {
    std::vector<std::pair<int, int>> pairs;
    if (!g_.whole_groups) return pairs;
    absl::flat_hash_map<int64_t, int> first_step;  // group -> its first step
    std::vector<char> seen(static_cast<size_t>(g_.size()), 0);
    for (size_t j = 0; j < w.order.size(); ++j) {
      const Node& n = g_.nodes[static_cast<size_t>(w.order[j])];
      if (seen[static_cast<size_t>(n.id)]++ || !n.group) continue;
      const auto [it, fresh] = first_step.try_emplace(*n.group, static_cast<int>(j));
      if (fresh) continue;
      int run_end = it->second + 1;
      while (run_end < static_cast<int>(j) && same_group(w, run_end, *n.group)) ++run_end;
      if (run_end < static_cast<int>(j)) pairs.emplace_back(run_end, static_cast<int>(j));
    }
    return pairs;
  }
  bool same_group(const Working& w, int j, int64_t group) const {
    return g_.nodes[static_cast<size_t>(w.order[static_cast<size_t>(j)])].group == group;
  }

  // Moves step `late` to position `at` (its sibling's run ends there), with the offloads'
  // steps following; its instance stays resident until its first read, or waits in host
  // memory, whichever is cheaper.
  bool try_join(Working* w, int at, int late) {
    Working moved = *w;
    const int v = moved.order[static_cast<size_t>(late)];
    moved.order.erase(moved.order.begin() + late);
    moved.order.insert(moved.order.begin() + at, v);
    std::iota(moved.ids.begin(), moved.ids.end(), 0);
    // Steps between shift by one; a free or fetch before `late` stays before the step that
    // followed it.
    const auto step = [&](int x) { return x == late ? at : (x >= at && x < late ? x + 1 : x); };
    const auto bound = [&](int x) { return x >= at && x <= late ? x + 1 : x; };
    for (Offload& o : moved.offloads) o = {step(o.step), bound(o.free), bound(o.fetch)};
    bool changed = consider(moved, w);
    if (add_offload(&moved, at, at + 1)) changed |= consider(moved, w);
    return changed;
  }

  // Takes `candidate` where it fits both memories and costs less than the plan so far.
  bool consider(const Working& candidate, Working* w) {
    const SimResult r = simulate(g_, schedule_with(g_, candidate.order, candidate.offloads),
                                 opt_.budget_bytes, opt_.host_link);
    if (!r.valid || r.host_peak_bytes > opt_.host_memory_bytes ||
        r.cost >= current_.cost - 1e-9 * std::max(1.0, current_.cost))
      return false;
    *w = candidate;
    current_ = r;
    return true;
  }

  // Offloads the instance made at step i across the gap before the first read at or after
  // step gap_end, where there is one, with its copies placed by the clock. Returns whether
  // it did.
  bool add_offload(Working* w, int i, int gap_end) {
    const std::vector<int> touches = touches_of(g_, w->order, i);
    const auto next = std::lower_bound(touches.begin(), touches.end(), gap_end);
    if (next == touches.end() || next == touches.begin()) return false;
    const int read = *next, before = *(next - 1);
    if (read - before < 2) return false;  // no step between
    w->offloads.push_back({i, before + 1, read});
    return place_copies(g_, opt_, w->order, &w->offloads, w->offloads.size() - 1);
  }

  const Graph& g_;
  const PlanOptions& opt_;
  const Deadline& deadline_;
  SimResult current_;
};

}  // namespace

Schedule schedule_with(const Graph& g, const std::vector<int>& order,
                       const std::vector<Offload>& offloads) {
  Schedule s{g.name, order};
  s.offloads = offloads;
  return s;
}

std::vector<int> touches_of(const Graph& g, const std::vector<int>& order, int i) {
  std::vector<int> touches = {i};
  const int v = order[static_cast<size_t>(i)];
  for (size_t j = static_cast<size_t>(i) + 1; j < order.size(); ++j) {
    const std::vector<int>& in = g.nodes[static_cast<size_t>(order[j])].inputs;
    if (std::find(in.begin(), in.end(), v) != in.end()) touches.push_back(static_cast<int>(j));
    if (order[j] == v) break;  // a newer instance serves the reads after it
  }
  return touches;
}

bool place_copies(const Graph& g, const PlanOptions& opt, const std::vector<int>& order,
                  std::vector<Offload>* offloads, size_t k) {
  const Schedule s = schedule_with(g, order, *offloads);
  std::vector<int64_t> mem = memory_profile(g, s.order);
  if (mem.empty()) return false;
  apply_offloads(g, s, &mem);
  // Timed with this offload's free as late as it can be: the stream's wait for its copy out
  // at a free placed too early would delay every later step, and the free would seem to be
  // reached after the copy had ended.
  Schedule timed = s;
  timed.offloads[k].free = std::max(timed.offloads[k].free, timed.offloads[k].fetch - 1);
  const ScheduleTiming t = time_schedule(g, timed, opt.host_link);
  Offload& o = (*offloads)[k];
  const int64_t bytes = g.nodes[static_cast<size_t>(order[static_cast<size_t>(o.step)])].bytes;
  const int64_t budget = opt.budget_bytes.value_or(kNoBudget);
  auto fits = [&](int step) { return mem[static_cast<size_t>(step)] + bytes <= budget; };
  const std::vector<double> cost = step_costs(g, order);
  auto arrival = [&](int step) {  // when the compute stream reaches `step`, before waiting
    return t.start[static_cast<size_t>(step - 1)] + cost[static_cast<size_t>(step - 1)];
  };
  const double price = opt.host_link.price(static_cast<size_t>(bytes));
  const int read = o.fetch;
  while (o.fetch - 1 > o.free && arrival(read) - arrival(o.fetch) < price && fits(o.fetch - 1))
    --o.fetch;
  while (o.free < o.fetch && arrival(o.free) < t.out_done[k] && fits(o.free)) ++o.free;
  if (o.free < o.fetch) return true;
  offloads->erase(offloads->begin() + static_cast<long>(k));
  return false;
}

OffloadedOrder add_offloads(const Graph& g, OffloadedOrder start, const PlanOptions& opt,
                            const Deadline& deadline) {
  Working w{std::move(start.order), {}, std::move(start.offloads)};
  w.ids.resize(w.order.size());
  std::iota(w.ids.begin(), w.ids.end(), 0);
  Working done = OffloadPass(g, opt, deadline).run(std::move(w));
  return {std::move(done.order), std::move(done.offloads)};
}

// Note [Offload against recompute-only]
// The replacement pass with no host memory only keeps instead of recomputing: a
// recompute-only plan from the same start and the same search. Both are made here from
// `best`'s plan (or the plan given as PlanOptions::start, `remat-plan --start`: then the
// result is never dearer than that plan), and the offload plan is the cheapest of: that plan
// with offloads, file order
// fitted by offloads (Note [Fitting by offloads]), and where `best` met no plan, `best`'s plan
// for a looser budget fitted; never dearer than the recompute-only plan of equal effort
// (`best` runs until its deadline, so two separate runs of it differ by what the time
// allowed). `details` reports both.
namespace {

class OffloadSearch {
 public:
  OffloadSearch(const Graph& g, const PlanOptions& opt) : g_(g), opt_(opt), deadline_(opt) {}

  absl::StatusOr<RawPlan> run() {
    absl::StatusOr<Plan> base = opt_.start ? given_start() : best_for(opt_.budget_bytes, 0.6);
    if (!base.ok()) return base.status();
    if (base->feasible) {
      PlanOptions no_host = opt_;
      no_host.host_memory_bytes = 0;
      kept_ = add_offloads(g_, {base->schedule.order, {}}, no_host, share(0.25));
      kept_sim_ = simulate(g_, Schedule{g_.name, kept_.order}, opt_.budget_bytes);
      consider(kept_, "recompute-only");
      consider(add_offloads(g_, {base->schedule.order, {}}, opt_, share(0.33)), "best");
    }
    std::vector<int> file(static_cast<size_t>(g_.size()));
    std::iota(file.begin(), file.end(), 0);
    fit_and_consider(file, "file order", share(0.5));
    if (!base->feasible && opt_.budget_bytes) {
      absl::StatusOr<Plan> looser =
          best_for(std::min(file_order_peak(g_), *opt_.budget_bytes * 3 / 2), 0.5);
      if (looser.ok() && looser->feasible)
        fit_and_consider(looser->schedule.order, "best at 1.5x the budget", deadline_);
    }
    return result(*base);
  }

 private:
  // PlanOptions::start as the recompute-only plan to begin from.
  absl::StatusOr<Plan> given_start() const {
    Plan p;
    p.algo = "start";
    p.schedule = Schedule{g_.name, opt_.start->order};
    if (!opt_.start->offloads.empty())
      return absl::InvalidArgumentError("the start schedule of planner offload has offloads");
    p.sim = simulate(g_, p.schedule, opt_.budget_bytes);
    p.feasible = p.sim.valid;
    p.reason = p.feasible ? "the start schedule" : "the start schedule: " + p.sim.error;
    return p;
  }

  Deadline share(double fraction) const {
    return Deadline(std::max(0.0, deadline_.left()) * fraction);
  }

  absl::StatusOr<Plan> best_for(std::optional<int64_t> budget, double fraction) const {
    PlanOptions o = opt_;
    o.budget_bytes = budget;
    o.time_limit_seconds = std::max(0.0, deadline_.left()) * fraction;
    return run_planner("best", g_, o);
  }

  void fit_and_consider(const std::vector<int>& order, const char* from, const Deadline& d) {
    std::optional<OffloadedOrder> fitted = fit_by_offloads(g_, {order, {}}, opt_, d);
    if (fitted) consider(add_offloads(g_, *std::move(fitted), opt_, d), from);
  }

  void consider(OffloadedOrder w, const char* from) {
    const SimResult r =
        simulate(g_, schedule_with(g_, w.order, w.offloads), opt_.budget_bytes, opt_.host_link);
    if (!r.valid || r.host_peak_bytes > opt_.host_memory_bytes) return;
    if (have_ && r.cost >= best_sim_.cost) return;
    best_ = std::move(w);
    best_sim_ = r;
    from_ = from;
    have_ = true;
  }

  RawPlan result(const Plan& base) {
    RawPlan raw;
    if (!have_) {
      raw.note = base.feasible ? "no plan fits" : base.reason + "; nor by offloads";
      return raw;
    }
    raw.order = std::move(best_.order);
    raw.offloads = std::move(best_.offloads);
    raw.note = absl::StrCat("from ", from_, ", ", raw.offloads.size(), " offloads");
    nlohmann::json d = {{"from", from_}};
    if (base.feasible) {
      d["start_cost"] = base.sim.cost;
      d["recompute_only_cost"] = kept_sim_.cost;
      d["recompute_only_recomputations"] = kept_sim_.recomputations;
    }
    raw.details = d.dump();
    return raw;
  }

  const Graph& g_;
  const PlanOptions& opt_;
  const Deadline deadline_;
  OffloadedOrder kept_, best_;
  SimResult kept_sim_, best_sim_;
  std::string from_;
  bool have_ = false;
};

}  // namespace

absl::StatusOr<RawPlan> plan_offload(const Graph& g, const PlanOptions& opt) {
  return OffloadSearch(g, opt).run();
}

}  // namespace remat::detail
