// The executor that turns "compute v" requests into orders, and the planners built on it:
// noremat, chen, greedy, plus the exhaustive oracle.
#include <absl/strings/str_cat.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <queue>
#include <random>
#include <unordered_map>

#include "internal.h"
#include "remat/schedule.h"

namespace remat::detail {

int64_t minimum_peak_lower_bound(const Graph& g, int* witness) {
  int64_t best = 0;
  if (witness) *witness = -1;
  std::vector<int> mark(g.size(), -1);
  for (const Node& n : g.nodes) {
    int64_t need = n.bytes;
    for (int u : n.inputs) {
      if (mark[u] != n.id) {
        mark[u] = n.id;
        need += g.nodes[u].bytes;
      }
    }
    if (need > best || (witness && *witness < 0)) {
      best = std::max(best, need);
      if (witness && need == best) *witness = n.id;
    }
  }
  return best;
}

Executor::Executor(const Graph& g)
    : g_(g), live_(g.size(), 0), computed_(g.size(), 0), pins_(g.size(), 0) {}

bool Executor::ensure(int v) {
  if (live_[v]) return true;
  struct Frame {
    int node;
    size_t next;
  };
  std::vector<Frame> stack;
  auto push = [&](int x) {
    stack.push_back({x, 0});
    for (int u : g_.nodes[x].inputs) ++pins_[u];
  };
  auto pop = [&]() {
    for (int u : g_.nodes[stack.back().node].inputs) --pins_[u];
    stack.pop_back();
  };
  push(v);
  while (!stack.empty()) {
    Frame& f = stack.back();
    const Node& node = g_.nodes[f.node];
    if (live_[f.node]) {
      pop();
      continue;
    }
    while (f.next < node.inputs.size() && live_[node.inputs[f.next]]) ++f.next;
    if (f.next < node.inputs.size()) {
      int u = node.inputs[f.next];
      if (computed_[u] && !g_.nodes[u].can_recompute()) {
        while (!stack.empty()) pop();
        return false;
      }
      push(u);
      continue;
    }
    if (computed_[f.node] && !node.can_recompute()) {
      while (!stack.empty()) pop();
      return false;
    }
    if (before_compute) before_compute(f.node);
    // A callback must not drop pinned inputs; check anyway.
    bool ok = true;
    for (int u : node.inputs) ok = ok && live_[u];
    if (!ok) {
      f.next = 0;
      continue;
    }
    order_.push_back(f.node);
    live_[f.node] = 1;
    computed_[f.node] = 1;
    live_bytes_ += node.bytes;
    peak_ = std::max(peak_, live_bytes_);
    pop();
  }
  return true;
}

void Executor::drop(int v) {
  if (live_[v]) {
    live_[v] = 0;
    live_bytes_ -= g_.nodes[v].bytes;
  }
}

namespace {

struct UseInfo {
  std::vector<std::vector<int>> users;
  std::vector<int> last_user;      // largest user id, -1 if none
  std::vector<int> last_fwd_user;  // largest forward-phase user id
  std::vector<int> horizon;        // non-recomputable: last step any recomputation may read it
};

UseInfo compute_uses(const Graph& g) {
  UseInfo u;
  u.users = g.users();
  const int n = g.size();
  u.last_user.assign(n, -1);
  u.last_fwd_user.assign(n, -1);
  u.horizon.assign(n, -1);
  for (int v = 0; v < n; ++v) {
    for (int w : u.users[v]) {
      u.last_user[v] = std::max(u.last_user[v], w);
      if (g.nodes[w].phase == Phase::kForward) u.last_fwd_user[v] = std::max(u.last_fwd_user[v], w);
    }
  }
  for (int v = n - 1; v >= 0; --v) {
    int h = u.last_user[v];
    for (int w : u.users[v]) {
      if (g.nodes[w].can_recompute()) h = std::max(h, u.horizon[w]);
    }
    u.horizon[v] = h;
  }
  return u;
}

// The nodes the executor computed from step `start` on, and their inputs: the only values
// whose liveness those steps can have changed.
std::vector<int> touched_since(const Graph& g, const Executor& ex, size_t start) {
  std::vector<int> touched;
  for (size_t j = start; j < ex.order().size(); ++j) {
    const int x = ex.order()[j];
    touched.push_back(x);
    for (int u : g.nodes[x].inputs) touched.push_back(u);
  }
  return touched;
}

// Whether value u can be dropped after target step v (file order), for good.
bool dead(const Graph& g, const UseInfo& ui, int u, int v) {
  if (!g.nodes[u].can_recompute()) return ui.horizon[u] <= v;
  return ui.last_user[u] <= v;
}

}  // namespace

std::vector<int> execute_keep_set_impl(const Graph& g, const std::vector<char>& keep,
                                       bool retain_kept) {
  UseInfo ui = compute_uses(g);
  Executor ex(g);
  const int n = g.size();
  for (int v = 0; v < n; ++v) {
    size_t start = ex.order().size();
    if (!ex.computed(v) || !ex.live(v)) {
      if (ex.computed(v) && !g.nodes[v].can_recompute()) break;
      // Target step: compute v even if an earlier recomputation made it (cannot happen:
      // ancestors of earlier targets have smaller ids).
      ex.ensure(v);
    }
    const bool fwd_step = g.nodes[v].phase == Phase::kForward;
    const std::vector<int> cand = touched_since(g, ex, start);
    for (int u : cand) {
      if (!ex.live(u)) continue;
      if (retain_kept && keep[u] ? ui.horizon[u] <= v : dead(g, ui, u, v)) {
        ex.drop(u);
        continue;
      }
      if (fwd_step && !keep[u] && g.nodes[u].can_recompute() &&
          g.nodes[u].phase == Phase::kForward && ui.last_fwd_user[u] <= v) {
        ex.drop(u);
      }
    }
  }
  return ex.order();
}

std::vector<int> execute_keep_set(const Graph& g, const std::vector<char>& keep) {
  return execute_keep_set_impl(g, keep, false);
}

// As execute_keep_set, but kept values stay resident while any recomputation may read them,
// so recomputation never reaches past them.
std::vector<int> execute_keep_set_retained(const Graph& g, const std::vector<char>& keep) {
  return execute_keep_set_impl(g, keep, true);
}

namespace {

// greedy_order's eviction rule: before each computation, evicts the live value with the
// lowest cost^a / (bytes * distance^b) until the computation fits the budget.
class GreedyEviction {
 public:
  GreedyEviction(const Graph& g, const UseInfo& ui, Executor& ex, const GreedyParams& p)
      : g_(g), ui_(ui), ex_(ex), p_(p), rng_(p.seed), in_list_(g.size(), 0) {}

  // The target step being worked on (distances are measured from it).
  void set_step(int v) { cur_ = v; }

  // Makes u a candidate for eviction.
  void track(int u) {
    if (!in_list_[u]) {
      in_list_[u] = 1;
      live_list_.push_back(u);
    }
  }

  void make_room(int x, int64_t budget) {
    int64_t need = g_.nodes[x].bytes;
    while (ex_.live_bytes() + need > budget) {
      int victim = pick_victim();
      if (victim < 0) break;  // nothing evictable: the budget cannot hold here
      ex_.drop(victim);
    }
  }

 private:
  int next_use(int u) const {
    const auto& us = ui_.users[u];
    auto it = std::upper_bound(us.begin(), us.end(), cur_);
    return it == us.end() ? g_.size() + 1 : *it;
  }

  // The evictable value of lowest score, or -1; forgets the values no longer live.
  int pick_victim() {
    int best = -1;
    double best_score = 0;
    size_t w = 0;
    for (size_t k = 0; k < live_list_.size(); ++k) {
      int u = live_list_[k];
      if (!ex_.live(u)) {
        in_list_[u] = 0;
        continue;
      }
      live_list_[w++] = u;
      if (ex_.pinned(u) || !g_.nodes[u].can_recompute() || g_.nodes[u].bytes == 0) continue;
      double rc = g_.nodes[u].cost;
      for (int i : g_.nodes[u].inputs)
        if (!ex_.live(i)) rc += g_.nodes[i].cost;
      double dist = std::max(1, next_use(u) - cur_);
      double score = std::pow(rc + 1e-9, p_.cost_exp) /
                     (static_cast<double>(g_.nodes[u].bytes) * std::pow(dist, p_.dist_exp));
      if (p_.noise > 0) score *= std::exp(p_.noise * normal_(rng_));
      if (best < 0 || score < best_score) {
        best = u;
        best_score = score;
      }
    }
    live_list_.resize(w);
    return best;
  }

  const Graph& g_;
  const UseInfo& ui_;
  Executor& ex_;
  const GreedyParams& p_;
  std::mt19937_64 rng_;
  std::normal_distribution<double> normal_{0.0, 1.0};
  std::vector<int> live_list_;  // may contain stale entries; filtered lazily
  std::vector<char> in_list_;
  int cur_ = 0;
};

}  // namespace

std::vector<int> greedy_order(const Graph& g, int64_t budget, const GreedyParams& p) {
  UseInfo ui = compute_uses(g);
  Executor ex(g);
  const int n = g.size();
  GreedyEviction eviction(g, ui, ex, p);
  ex.before_compute = [&](int x) { eviction.make_room(x, budget); };
  for (int v = 0; v < n; ++v) {
    eviction.set_step(v);
    size_t start = ex.order().size();
    if (!ex.live(v)) {
      if (ex.computed(v) && !g.nodes[v].can_recompute()) break;
      if (!ex.ensure(v)) break;
    }
    const std::vector<int> cand = touched_since(g, ex, start);
    for (int u : cand) {
      if (!ex.live(u)) continue;
      if (dead(g, ui, u, v)) {
        ex.drop(u);
      } else {
        eviction.track(u);
      }
    }
  }
  return ex.order();
}

absl::StatusOr<RawPlan> plan_no_remat(const Graph& g, const PlanOptions&) {
  RawPlan p;
  for (int v = 0; v < g.size(); ++v) p.order.push_back(v);
  return p;
}

namespace {

// Chen et al.'s greedy: walk the forward nodes, accumulate sizes, checkpoint the node where
// the running total passes b.
std::vector<char> chen_keep_set(const Graph& g, double b) {
  std::vector<char> keep(g.size(), 0);
  double temp = 0;
  for (const Node& n : g.nodes) {
    if (n.phase != Phase::kForward || !n.can_recompute()) continue;
    temp += static_cast<double>(n.bytes);
    if (temp > b) {
      keep[n.id] = 1;
      temp = 0;
    }
  }
  return keep;
}

// The thresholds to try: Chen's sqrt(total * largest), then a geometric sweep from a
// quarter of the largest forward value to the total.
std::vector<double> chen_thresholds(int64_t fwd_total, int64_t fwd_max) {
  std::vector<double> bs;
  double sq = std::sqrt(static_cast<double>(fwd_total) *
                        static_cast<double>(std::max<int64_t>(fwd_max, 1)));
  bs.push_back(sq);
  double lo = std::max<double>(1.0, static_cast<double>(fwd_max) / 4),
         hi = static_cast<double>(fwd_total) + 1;
  for (int k = 0; k <= 48; ++k) bs.push_back(lo * std::pow(hi / lo, k / 48.0));
  return bs;
}

// With a budget: fitting first, then the cheapest (or, when neither fits, the lower peak).
// Without: the lowest peak, then the cheapest.
bool better_chen(const SimResult& r, const SimResult& best, const PlanOptions& opt) {
  if (opt.budget_bytes) {
    bool fits = r.peak_bytes <= *opt.budget_bytes, bfits = best.peak_bytes <= *opt.budget_bytes;
    return fits != bfits ? fits : (fits ? r.cost < best.cost : r.peak_bytes < best.peak_bytes);
  }
  return r.peak_bytes < best.peak_bytes || (r.peak_bytes == best.peak_bytes && r.cost < best.cost);
}

}  // namespace

absl::StatusOr<RawPlan> plan_chen(const Graph& g, const PlanOptions& opt) {
  RawPlan p;
  bool has_backward = false;
  int64_t fwd_total = 0, fwd_max = 0;
  for (const Node& n : g.nodes) {
    if (n.phase == Phase::kBackward)
      has_backward = true;
    else if (n.can_recompute()) {
      fwd_total += n.bytes;
      fwd_max = std::max(fwd_max, n.bytes);
    }
  }
  if (!has_backward) {
    p.order.resize(g.size());
    for (int v = 0; v < g.size(); ++v) p.order[v] = v;
    p.note = "no backward phase: nothing to checkpoint, file order";
    return p;
  }
  std::vector<int> best_order;
  SimResult best;
  bool have = false;
  Schedule s;
  const Deadline deadline(opt);
  for (double b : chen_thresholds(fwd_total, fwd_max)) {
    if (have && deadline.expired()) break;  // Chen's own threshold comes first
    s.order = execute_keep_set(g, chen_keep_set(g, b));
    SimResult r = simulate(g, s);
    if (!r.valid) continue;
    if (!have || better_chen(r, best, opt)) {
      best = r;
      best_order = s.order;
      have = true;
    }
  }
  p.order = best_order;
  return p;
}

namespace {

// Dijkstra over (live set, computed set) states of at most 31 nodes, each packed in one
// 64-bit key: computing a node costs its cost, dropping a value is free.
class ExhaustiveSearch {
 public:
  ExhaustiveSearch(const Graph& g, int64_t budget, bool first_in_id_order)
      : g_(g), n_(g.size()), budget_(budget), first_in_id_order_(first_in_id_order) {
    all_ = (n_ == 64) ? ~0ULL : ((1ULL << n_) - 1);
    inmask_.assign(n_, 0);
    for (int v = 0; v < n_; ++v)
      for (int u : g.nodes[v].inputs) inmask_[v] |= 1ULL << u;
  }

  std::optional<ExhaustiveResult> run(size_t max_states) {
    const uint64_t start = key(0, 0);
    info_[start] = {0, 0, -1, false};
    pq_.push({0, start});
    while (!pq_.empty()) {
      auto [d, k] = pq_.top();
      pq_.pop();
      Info& cur = info_[k];
      if (cur.closed || d > cur.dist) continue;
      cur.closed = true;
      if ((k >> 32) == all_) return trace_path(start, k, d);
      if (info_.size() > max_states) return std::nullopt;
      expand(k, d);
    }
    return std::nullopt;
  }

 private:
  // The best known distance of a state and how it was reached (action: the node computed,
  // -1 for a drop).
  struct Info {
    double dist;
    uint64_t parent;
    int action;
    bool closed;
  };

  static uint64_t key(uint64_t live, uint64_t done) { return live | (done << 32); }

  int64_t bytes_of(uint64_t m) const {
    int64_t b = 0;
    for (int v = 0; v < n_; ++v)
      if (m >> v & 1) b += g_.nodes[v].bytes;
    return b;
  }

  void relax(uint64_t from, uint64_t nk, double nd, int action) {
    auto it = info_.find(nk);
    if (it == info_.end()) {
      info_[nk] = {nd, from, action, false};
      pq_.push({nd, nk});
    } else if (!it->second.closed && nd < it->second.dist) {
      it->second = {nd, from, action, false};
      pq_.push({nd, nk});
    }
  }

  // Successors of state k: drop a live value, or compute a node whose inputs are live
  // within the budget.
  void expand(uint64_t k, double d) {
    uint64_t live = k & 0xffffffffULL, done = k >> 32;
    int64_t lb = bytes_of(live);
    for (int v = 0; v < n_; ++v) {
      uint64_t bit = 1ULL << v;
      if (live & bit) {
        relax(k, key(live & ~bit, done), d, -1);  // drop v
        continue;
      }
      if ((done & bit) && !g_.nodes[v].can_recompute()) continue;
      if (first_in_id_order_ && !(done & bit) && (done & (bit - 1)) != (bit - 1)) continue;
      if ((inmask_[v] & live) != inmask_[v]) continue;
      if (lb + g_.nodes[v].bytes > budget_) continue;
      relax(k, key(live | bit, done | bit), d + g_.nodes[v].cost, v);
    }
  }

  ExhaustiveResult trace_path(uint64_t start, uint64_t k, double d) const {
    ExhaustiveResult r;
    r.cost = d;
    uint64_t s = k;
    while (s != start) {
      const Info& in = info_.at(s);
      if (in.action >= 0) r.order.push_back(in.action);
      s = in.parent;
    }
    std::reverse(r.order.begin(), r.order.end());
    return r;
  }

  using QE = std::pair<double, uint64_t>;
  const Graph& g_;
  const int n_;
  const int64_t budget_;
  const bool first_in_id_order_;
  uint64_t all_ = 0;
  std::vector<uint64_t> inmask_;
  std::unordered_map<uint64_t, Info> info_;
  std::priority_queue<QE, std::vector<QE>, std::greater<QE>> pq_;
};

}  // namespace

std::optional<ExhaustiveResult> exhaustive_optimum(const Graph& g, int64_t budget,
                                                   size_t max_states, bool first_in_id_order) {
  if (g.size() > 31) return std::nullopt;
  return ExhaustiveSearch(g, budget, first_in_id_order).run(max_states);
}

}  // namespace remat::detail
