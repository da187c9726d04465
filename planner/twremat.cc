// twremat: rematerialization by tree decomposition (Kumar et al., NeurIPS 2019, "Efficient
// rematerialization for deep networks").
//
// 1. Tree decomposition of the undirected graph underlying the DAG by the min-fill-in
//    elimination heuristic (bag of v = v and its neighbours when it is eliminated; the
//    parent bag is that of the neighbour eliminated first after v).
// 2. Solve(U): compute every node of U, given that the nodes outside U which U reads are
//    available. Pick a balanced separator S of G[U] (the bag of the weighted centroid of the
//    decomposition restricted to U, found on the virtual tree of U's bags), split U \ S into
//    connected components C_1..C_m (each at most |U|/2). For each s in S in topological
//    order: for each component, Solve(ancestors of s in that component), then compute s
//    (and hold it). Then Solve(C_i) for every component with S held. Values not read any
//    more die by the simulator's accounting, so memory is O(width * log n) values.
//    The recursion recomputes far more than the schedule keeps (prune_unread_instances drops
//    instances nothing reads): on dense graphs (DenseNet blocks, treewidth ~50) it made
//    millions of steps for a few thousand nodes, nearly all dropped. So calls whose every
//    instance would be dropped are skipped, and calls on already computed sets, which
//    recur by the thousand, replay the order they made the first time; the pruned
//    schedule is the same.
// 3. Recursion limit k: at depth k a set is computed in topological order without further
//    recursion (k trades memory for schedule length). With a budget, the recursion stops
//    where the plain computation of the set (plus what enclosing levels hold) already fits;
//    the estimate is tightened until the simulated peak holds.
//
// Nodes that cannot be recomputed and read nothing (inputs, tangents) are not part of the
// decomposition: they are computed right before their first reader and stay resident
// until their last one. Other non-recomputable nodes are computed only the first time.
#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>
#include <absl/strings/str_cat.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <queue>
#include <tuple>

#include "internal.h"
#include "remat/schedule.h"
#include "tree_decomposition.h"

namespace remat::detail {
namespace {

class TwRemat {
 public:
  // `deadline`, where given, bounds the tree decomposition: past it the decomposition stops
  // and timed_out() says so (Note [A deadline for the decomposition]).
  explicit TwRemat(const Graph& g, const Deadline* deadline = nullptr)
      : g_(g), n_(g.size()), deadline_(deadline) {
    core_.assign(n_, 1);
    for (const Node& nd : g.nodes) {
      if (!nd.can_recompute() && nd.inputs.empty()) core_[nd.id] = 0;
    }
    adj_.assign(n_, {});
    for (const Node& nd : g.nodes) {
      if (!core_[nd.id]) continue;
      for (int u : nd.inputs) {
        if (!core_[u] || u == nd.id) continue;
        adj_[nd.id].push_back(u);
        adj_[u].push_back(nd.id);
      }
    }
    for (auto& a : adj_) {
      std::sort(a.begin(), a.end());
      a.erase(std::unique(a.begin(), a.end()), a.end());
    }
    users_ = g.users();
    decomposition_.emplace(adj_, core_, deadline_);
    if (decomposition_->timed_out()) return;
    stamp_.assign(n_ + 1, 0);
    stamp2_.assign(n_ + 1, 0);
    comp_.assign(n_, -1);
  }

  int width() const { return decomposition_->width(); }
  bool timed_out() const { return decomposition_->timed_out(); }

  // Produces an order. depth_limit < 0: unlimited; budget: effective budget for the
  // "plain computation fits" stop rule (kNoBudget: never stop early). shortcuts: skip and
  // replay calls (see Solve); without, the order is the plain recursion's, which prunes to
  // the same schedule (tests compare the two).
  std::vector<int> run(int depth_limit, int64_t budget, double balance = 0.5, bool early = true,
                       bool shortcuts = true) {
    depth_limit_ = depth_limit;
    shortcuts_ = shortcuts;
    balance_ = balance;
    early_components_ = early;
    budget_ = budget;
    order_.clear();
    memo_.clear();
    emitted_.assign(n_, 0);
    held_bytes_ = 0;
    std::vector<int> all;
    for (int v = 0; v < n_; ++v)
      if (core_[v]) all.push_back(v);
    solve(all, {}, 0);
    for (int v = 0; v < n_; ++v) {
      if (!emitted_[v]) {
        order_.push_back(v);
        emitted_[v] = 1;
      }
    }
    return order_;
  }

 private:
  // Balanced separator of G[U]: the bag (restricted to U) of the deepest node of the
  // decomposition whose subtree holds at least half of U.
  std::vector<int> separator(const std::vector<int>& U) {
    std::vector<int> vt(U);
    const TreeDecomposition& td = *decomposition_;
    auto by_tin = [&](int a, int b) { return td.tin(a) < td.tin(b); };
    std::sort(vt.begin(), vt.end(), by_tin);
    const size_t m = vt.size();
    for (size_t i = 0; i + 1 < m; ++i) vt.push_back(td.lca(vt[i], vt[i + 1]));
    std::sort(vt.begin(), vt.end(), by_tin);
    vt.erase(std::unique(vt.begin(), vt.end()), vt.end());
    int mark = new_stamp();
    for (int u : U) stamp_[u] = mark;
    std::vector<int> vpar(vt.size(), -1), stack;
    std::vector<int64_t> sub(vt.size(), 0);
    for (size_t i = 0; i < vt.size(); ++i) {
      while (!stack.empty() && !td.is_ancestor(vt[stack.back()], vt[i])) stack.pop_back();
      vpar[i] = stack.empty() ? -1 : stack.back();
      stack.push_back(static_cast<int>(i));
      sub[i] = (vt[i] < n_ && stamp_[vt[i]] == mark) ? 1 : 0;
    }
    for (size_t i = vt.size(); i-- > 0;)
      if (vpar[i] >= 0) sub[vpar[i]] += sub[i];
    // Candidates: nodes whose removal leaves branches of at most balance_ * |U| nodes;
    // among them the bag of fewest bytes (the strict centroid when balance_ is 1/2).
    const int64_t W = static_cast<int64_t>(U.size());
    std::vector<int64_t> max_child(vt.size(), 0);
    for (size_t i = 0; i < vt.size(); ++i)
      if (vpar[i] >= 0) max_child[vpar[i]] = std::max(max_child[vpar[i]], sub[i]);
    int best = -1;
    int64_t best_bytes = 0, best_branch = 0;
    const double limit = std::max(0.5, balance_) * static_cast<double>(W);
    for (size_t i = 0; i < vt.size(); ++i) {
      int64_t branch = std::max(max_child[i], W - sub[i]);
      if (static_cast<double>(branch) > limit) continue;
      int64_t bytes = 0;
      if (vt[i] != n_)
        for (int x : td.bag(vt[i]))
          if (stamp_[x] == mark) bytes += g_.nodes[x].bytes;
      if (best < 0 || bytes < best_bytes || (bytes == best_bytes && branch < best_branch)) {
        best = static_cast<int>(i);
        best_bytes = bytes;
        best_branch = branch;
      }
    }
    if (best < 0) {  // fall back to the centroid
      for (size_t i = 0; i < vt.size(); ++i) {
        if (2 * sub[i] >= W && (best < 0 || td.depth(vt[i]) > td.depth(vt[best])))
          best = static_cast<int>(i);
      }
    }
    std::vector<int> S;
    if (best < 0 || vt[best] == n_) return S;
    for (int x : td.bag(vt[best]))
      if (stamp_[x] == mark) S.push_back(x);
    std::sort(S.begin(), S.end());
    return S;
  }

  int new_stamp() { return ++stamp_counter_; }

  void emit(int x) {
    if (emitted_[x] && !g_.nodes[x].can_recompute()) return;
    for (int u : g_.nodes[x].inputs) {
      if (!core_[u] && !emitted_[u]) {
        order_.push_back(u);
        emitted_[u] = 1;
      }
    }
    order_.push_back(x);
    emitted_[x] = 1;
  }

  // Peak of computing U (ascending ids) in order without recomputation, counting the
  // values U reads from outside as resident throughout and values read outside U as
  // resident to the end.
  int64_t plain_peak(const std::vector<int>& U) {
    int mark = new_stamp();
    for (int u : U) stamp_[u] = mark;
    int outside = new_stamp();
    int64_t base = 0;
    std::vector<int> last(U.size(), -1);
    // Index of each member for last-reader bookkeeping.
    for (size_t i = 0; i < U.size(); ++i) comp_[U[i]] = static_cast<int>(i);
    std::vector<int64_t> delta(U.size() + 1, 0);
    for (size_t i = 0; i < U.size(); ++i) {
      const Node& nd = g_.nodes[U[i]];
      for (int u : nd.inputs) {
        if (stamp_[u] == mark) {
          last[comp_[u]] = static_cast<int>(i);
        } else if (stamp2_[u] != outside) {
          stamp2_[u] = outside;
          base += g_.nodes[u].bytes;
        }
      }
    }
    for (size_t i = 0; i < U.size(); ++i) {
      int end = last[i] < 0 ? static_cast<int>(i) : last[i];
      for (int w : users_[U[i]]) {
        if (stamp_[w] != mark) {
          end = static_cast<int>(U.size()) - 1;
          break;
        }
      }
      delta[i] += g_.nodes[U[i]].bytes;
      delta[end + 1] -= g_.nodes[U[i]].bytes;
    }
    int64_t cur = 0, peak = 0;
    for (size_t i = 0; i < U.size(); ++i) {
      cur += delta[i];
      peak = std::max(peak, cur);
    }
    return base + peak;
  }

  bool all_emitted(const std::vector<int>& U) const {
    return std::all_of(U.begin(), U.end(), [&](int u) { return emitted_[u]; });
  }

  // Computes U (ascending ids) in order, less the nodes whose instance here nobody reads:
  // those that are not in need, were emitted before and feed no node computed here.
  void emit_needed(const std::vector<int>& U, const std::vector<int>& need) {
    if (!shortcuts_) {
      for (int u : U) emit(u);
      return;
    }
    int in_u = new_stamp();
    for (int u : U) stamp_[u] = in_u;
    int wanted = new_stamp();
    for (int x : need) want_[x] = wanted;
    for (size_t i = U.size(); i-- > 0;) {
      int x = U[i];
      if (want_[x] != wanted && emitted_[x]) continue;
      want_[x] = wanted;
      for (int u : g_.nodes[x].inputs)
        if (stamp_[u] == in_u) want_[u] = wanted;
    }
    for (int u : U)
      if (want_[u] == wanted) emit(u);
  }

  // Kumar et al.'s Solve(U), less the instances no later step can read: need holds the
  // nodes of U that the steps after this call read (before computing them again).
  //
  // A call only matters for the instances the final schedule keeps: those a later step
  // reads (nodes of need) and first instances. Without either, every instance it would make
  // is one prune_unread_instances drops, and the call is skipped. Once every node of U has
  // been computed, a call changes nothing but the order it appends, which then depends only
  // on (U, need, depth, held bytes): the recursion meets the same sets over and over (on
  // dense graphs, thousands of distinct calls make millions of steps), so that order is
  // recorded the first time and copied after.
  void solve(const std::vector<int>& U, const std::vector<int>& need, int depth) {
    if (U.empty()) return;
    if (!shortcuts_) {
      solve_once(U, need, depth);
      return;
    }
    const bool replayable = all_emitted(U);
    if (replayable && need.empty()) return;
    if (!replayable || U.size() <= 2) {
      solve_once(U, need, depth);
      return;
    }
    std::vector<int64_t> key = memo_key(U, need, depth);
    if (auto it = memo_.find(key); it != memo_.end()) {
      replay(it->second);
      return;
    }
    const size_t begin = order_.size();
    solve_once(U, need, depth);
    memo_.emplace(std::move(key), std::make_pair(begin, order_.size()));
  }

  std::vector<int64_t> memo_key(const std::vector<int>& U, const std::vector<int>& need,
                                int depth) const {
    std::vector<int64_t> key(U.begin(), U.end());
    key.push_back(-1);
    key.insert(key.end(), need.begin(), need.end());
    // Depth matters only under a recursion limit, held bytes only under a budget.
    key.push_back(depth_limit_ >= 0 ? depth : -1);
    key.push_back(budget_ != kNoBudget ? held_bytes_ : -1);
    return key;
  }

  // Appends order_[span.first, span.second) again.
  void replay(std::pair<size_t, size_t> span) {
    const size_t size = order_.size() + (span.second - span.first);
    // Grow geometrically: an exact reserve per replay would copy the order every time.
    if (size > order_.capacity()) order_.reserve(std::max(size, 2 * order_.capacity()));
    for (size_t i = span.first; i < span.second; ++i) order_.push_back(order_[i]);
  }

  void solve_once(const std::vector<int>& U, const std::vector<int>& need, int depth) {
    if (U.size() <= 2 || (depth_limit_ >= 0 && depth >= depth_limit_)) {
      emit_needed(U, need);
      return;
    }
    if (budget_ != kNoBudget && held_bytes_ + plain_peak(U) <= budget_) {
      emit_needed(U, need);
      return;
    }
    std::vector<int> S = separator(U);
    int in_u = new_stamp();
    for (int u : U) stamp_[u] = in_u;
    int in_s = new_stamp();
    for (int s : S) stamp2_[s] = in_s;
    std::vector<std::vector<int>> comps = components_apart(U, in_u, in_s);
    if (comps.size() == 1 && comps[0].size() == U.size()) {  // no separation possible
      emit_needed(U, need);
      return;
    }
    for (auto& c : comps) std::sort(c.begin(), c.end());
    std::vector<std::vector<std::vector<int>>> anc =
        ancestors_by_component(S, comps.size(), in_u, in_s);
    std::vector<std::vector<int>> at = component_slots(S, comps, in_s);
    std::vector<Step> steps = steps_around_separator(S, comps, anc, at);
    std::vector<std::vector<int>> needs = step_needs(steps, S, need);
    run_steps(steps, needs, S, depth);
  }

  // Connected components of U \ S (U stamped in_u in stamp_, S stamped in_s in stamp2_);
  // comp_ holds each member's component.
  std::vector<std::vector<int>> components_apart(const std::vector<int>& U, int in_u, int in_s) {
    std::vector<std::vector<int>> comps;
    for (int u : U) comp_[u] = -1;
    for (int u : U) {
      if (stamp2_[u] == in_s || comp_[u] >= 0) continue;
      int c = static_cast<int>(comps.size());
      comps.push_back({u});
      comp_[u] = c;
      for (size_t i = 0; i < comps[c].size(); ++i) {
        for (int w : adj_[comps[c][i]]) {
          if (stamp_[w] == in_u && stamp2_[w] != in_s && comp_[w] < 0) {
            comp_[w] = c;
            comps[c].push_back(w);
          }
        }
      }
    }
    return comps;
  }

  // Ancestors of each separator node within U \ S, split by component (sorted).
  std::vector<std::vector<std::vector<int>>> ancestors_by_component(const std::vector<int>& S,
                                                                    size_t num_comps, int in_u,
                                                                    int in_s) {
    std::vector<std::vector<std::vector<int>>> anc(S.size());
    for (size_t k = 0; k < S.size(); ++k) {
      int seen = new_stamp();
      std::vector<int> stack = {S[k]};
      std::vector<std::vector<int>> parts(num_comps);
      while (!stack.empty()) {
        int x = stack.back();
        stack.pop_back();
        for (int u : g_.nodes[x].inputs) {
          if (stamp_[u] != in_u || stamp2_[u] == in_s || visit_[u] == seen) continue;
          visit_[u] = seen;
          parts[comp_[u]].push_back(u);
          stack.push_back(u);
        }
      }
      for (auto& p : parts) std::sort(p.begin(), p.end());
      anc[k] = std::move(parts);
    }
    return anc;
  }

  // at[k + 1]: the components to solve right after separator node k (at[0]: before the
  // first). A component is solved as soon as the separator nodes it reads are computed, so
  // that separator nodes die early and little is held while the others are prepared.
  std::vector<std::vector<int>> component_slots(const std::vector<int>& S,
                                                const std::vector<std::vector<int>>& comps,
                                                int in_s) {
    std::vector<int> ready(comps.size(), -1);
    for (size_t k = 0; k < S.size(); ++k) sidx_[S[k]] = static_cast<int>(k);
    for (size_t c = 0; c < comps.size(); ++c) {
      for (int x : comps[c]) {
        for (int u : g_.nodes[x].inputs) {
          if (stamp2_[u] == in_s) ready[c] = std::max(ready[c], sidx_[u]);
        }
      }
    }
    std::vector<std::vector<int>> at(S.size() + 1);
    for (size_t c = 0; c < comps.size(); ++c) at[ready[c] + 1].push_back(static_cast<int>(c));
    if (!early_components_) {
      for (auto& a : at) a.clear();
      for (size_t c = 0; c < comps.size(); ++c) at[S.size()].push_back(static_cast<int>(c));
    }
    return at;
  }

  // One step of Solve(U) around its separator S: a sub-solve of part of U \ S (the
  // ancestors of S[sep] in one component when sep >= 0, else a whole component), or, when
  // part is null, computing and holding S[sep].
  struct Step {
    const std::vector<int>* part;
    int sep;
  };

  // For each separator node in order: solve its ancestors in each component, compute and
  // hold it, then solve the components that became ready.
  static std::vector<Step> steps_around_separator(
      const std::vector<int>& S, const std::vector<std::vector<int>>& comps,
      const std::vector<std::vector<std::vector<int>>>& anc,
      const std::vector<std::vector<int>>& at) {
    std::vector<Step> steps;
    for (int c : at[0]) steps.push_back({&comps[c], -1});
    for (size_t k = 0; k < S.size(); ++k) {
      const int sep = static_cast<int>(k);
      for (const auto& p : anc[k]) steps.push_back({&p, sep});
      steps.push_back({nullptr, sep});
      for (int c : at[k + 1]) steps.push_back({&comps[c], -1});
    }
    return steps;
  }

  // What each sub-solve must leave computed. Sub-solves read nothing of U \ S outside their
  // own part (ancestor parts are closed under ancestors, components are not adjacent), so
  // an instance made in one is read only by the separator node it prepares (its inputs) or,
  // when no later step recomputes it, by the steps after Solve(U) (need).
  std::vector<std::vector<int>> step_needs(const std::vector<Step>& steps,
                                           const std::vector<int>& S,
                                           const std::vector<int>& need) {
    for (size_t i = 0; i < steps.size(); ++i)
      if (steps[i].part)
        for (int x : *steps[i].part) last_step_[x] = static_cast<int>(i);
    int needed = new_stamp();
    for (int x : need) want_[x] = needed;
    std::vector<std::vector<int>> needs(steps.size());
    for (size_t i = 0; i < steps.size(); ++i) {
      if (!steps[i].part) continue;
      int read = new_stamp();
      if (steps[i].sep >= 0)
        for (int u : g_.nodes[S[steps[i].sep]].inputs) visit_[u] = read;
      for (int x : *steps[i].part)
        if (visit_[x] == read || (want_[x] == needed && last_step_[x] == static_cast<int>(i)))
          needs[i].push_back(x);
    }
    return needs;
  }

  void run_steps(const std::vector<Step>& steps, const std::vector<std::vector<int>>& needs,
                 const std::vector<int>& S, int depth) {
    int64_t held_here = 0;
    for (size_t i = 0; i < steps.size(); ++i) {
      if (steps[i].part) {
        solve(*steps[i].part, needs[i], depth + 1);
        continue;
      }
      int s = S[steps[i].sep];
      emit(s);
      held_bytes_ += g_.nodes[s].bytes;
      held_here += g_.nodes[s].bytes;
    }
    held_bytes_ -= held_here;
  }

  const Graph& g_;
  const int n_;
  std::vector<char> core_;
  std::vector<std::vector<int>> adj_;
  std::optional<TreeDecomposition> decomposition_;
  const Deadline* deadline_ = nullptr;
  std::vector<int> stamp_, stamp2_, comp_;
  std::vector<int> visit_ = std::vector<int>(n_, 0), sidx_ = std::vector<int>(n_, 0);
  std::vector<int> want_ = std::vector<int>(n_, 0), last_step_ = std::vector<int>(n_, 0);
  int stamp_counter_ = 0;
  std::vector<std::vector<int>> users_;
  // Per run.
  int depth_limit_ = -1;
  int64_t budget_ = kNoBudget;
  int64_t held_bytes_ = 0;
  double balance_ = 0.5;
  bool early_components_ = true;
  bool shortcuts_ = true;
  std::vector<int> order_;
  std::vector<char> emitted_;
  // solve calls on computed sets: key (see memo_key) -> the span of order_ they appended.
  absl::flat_hash_map<std::vector<int64_t>, std::pair<size_t, size_t>> memo_;
};

}  // namespace

std::vector<char> read_instances(const Graph& g, const std::vector<int>& order) {
  // Backward pass: an instance is kept when a kept later step reads it before the node's
  // next instance, or when it is the node's first instance and no later one was kept.
  const int n = g.size();
  std::vector<int> before(order.size()), count(n, 0);
  for (size_t j = 0; j < order.size(); ++j) before[j] = count[order[j]]++;
  std::vector<char> pending(n, 0), kept_later(n, 0), keep(order.size(), 0);
  for (size_t j = order.size(); j-- > 0;) {
    int x = order[j];
    bool k = pending[x] || (before[j] == 0 && !kept_later[x]);
    pending[x] = 0;
    if (!k) continue;
    keep[j] = 1;
    kept_later[x] = 1;
    for (int u : g.nodes[x].inputs) pending[u] = 1;
  }
  return keep;
}

std::vector<int> prune_unread_instances(const Graph& g, const std::vector<int>& order) {
  const std::vector<char> keep = read_instances(g, order);
  std::vector<int> out;
  out.reserve(order.size());
  for (size_t j = 0; j < order.size(); ++j)
    if (keep[j]) out.push_back(order[j]);
  return out;
}

namespace {

// Without a budget, minimises the peak: a few separator rules and component orders, the
// lowest peak wins (k = 0, plain order, included: never above file order).
RawPlan lowest_peak_plan(const Graph& g, TwRemat& tw, int k) {
  RawPlan plan;
  SimResult best;
  std::string how;
  // Large graphs get fewer variants (each run is a full recursion).
  const bool large = g.size() > 5000;
  for (double balance : {0.5, 0.6, 0.7, 0.8}) {
    if (large && (balance == 0.6 || balance == 0.7)) continue;
    for (bool early : {true, false}) {
      if (large && !early) continue;
      for (int kk : {k, 0}) {
        if (kk == 0 && (balance != 0.5 || !early)) continue;
        std::vector<int> o = prune_unread_instances(g, tw.run(kk, kNoBudget, balance, early));
        SimResult r = simulate(g, Schedule{g.name, o, std::nullopt});
        if (!r.valid) continue;
        if (plan.order.empty() || r.peak_bytes < best.peak_bytes ||
            (r.peak_bytes == best.peak_bytes && r.cost < best.cost)) {
          best = r;
          plan.order = std::move(o);
          how = absl::StrCat("balance ", balance, early ? ", early components" : "", ", k=", kk);
        }
      }
    }
  }
  plan.note = absl::StrCat("treewidth bound ", tw.width(), ", ", how);
  return plan;
}

// With a budget: stop recursing where the plain computation fits an effective budget; lower
// the effective budget until the simulated peak holds, keep the cheapest that fits.
RawPlan budgeted_plan(const Graph& g, TwRemat& tw, int k, int64_t budget,
                      const Deadline& deadline) {
  RawPlan plan;
  int64_t eff = budget;
  SimResult best;
  bool have = false;
  std::vector<int> fallback;
  int64_t fallback_peak = 0;
  for (int round = 0; round < 40; ++round) {
    std::vector<int> o = prune_unread_instances(g, tw.run(k, eff));
    SimResult r = simulate(g, Schedule{g.name, o, std::nullopt});
    if (r.valid && r.peak_bytes <= budget) {
      if (!have || r.cost < best.cost) {
        best = r;
        plan.order = o;
        have = true;
      }
      break;
    }
    if (fallback.empty() || (r.valid && r.peak_bytes < fallback_peak)) {
      fallback = o;
      fallback_peak = r.peak_bytes;
    }
    if (eff <= 0) break;
    int64_t over = r.peak_bytes - budget;
    eff -= std::max<int64_t>(over, eff / 16 + 1);
    if (eff < 0 || deadline.expired()) eff = 0;  // last round: full recursion
  }
  if (!have) {
    plan.order = fallback;
    plan.note = absl::StrCat("even full recursion peaks at ", fallback_peak, " bytes");
  } else {
    plan.note = absl::StrCat("treewidth bound ", tw.width(), ", k=", k);
  }
  return plan;
}

}  // namespace

std::vector<int> tw_remat_order_for_test(const Graph& g, int k, int64_t budget, double balance,
                                         bool early, bool shortcuts) {
  return prune_unread_instances(g, TwRemat(g).run(k, budget, balance, early, shortcuts));
}

absl::StatusOr<RawPlan> plan_tw_remat(const Graph& g, const PlanOptions& opt) {
  Deadline deadline(opt);
  TwRemat tw(g, &deadline);
  if (tw.timed_out()) {
    return absl::DeadlineExceededError(
        absl::StrCat("twremat: the tree decomposition did not finish within the time limit (width ",
                     tw.width(), " when it stopped)"));
  }
  const int k = opt.twremat_k;
  if (!opt.budget_bytes) return lowest_peak_plan(g, tw, k);
  return budgeted_plan(g, tw, k, *opt.budget_bytes, deadline);
}

}  // namespace remat::detail
