// The executor that turns "compute v" requests into orders, and the planners built on it:
// noremat, chen, greedy, plus the exhaustive oracle.
#include <algorithm>
#include <cmath>
#include <functional>
#include <queue>
#include <random>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "internal.h"
#include "remat/schedule.h"

namespace remat::internal {

int64_t MinimumPeakLowerBound(const Graph& g, int* witness) {
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

bool Executor::Ensure(int v) {
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

void Executor::Drop(int v) {
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

UseInfo ComputeUses(const Graph& g) {
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

// Whether value u can be dropped after target step v (file order), for good.
// The nodes the executor computed from step `start` on, and their inputs: the only values
// whose liveness those steps can have changed.
std::vector<int> TouchedSince(const Graph& g, const Executor& ex, size_t start) {
  std::vector<int> touched;
  for (size_t j = start; j < ex.order().size(); ++j) {
    const int x = ex.order()[j];
    touched.push_back(x);
    for (int u : g.nodes[x].inputs) touched.push_back(u);
  }
  return touched;
}

bool Dead(const Graph& g, const UseInfo& ui, int u, int v) {
  if (!g.nodes[u].can_recompute()) return ui.horizon[u] <= v;
  return ui.last_user[u] <= v;
}

}  // namespace

std::vector<int> ExecuteKeepSetImpl(const Graph& g, const std::vector<char>& keep,
                                    bool retain_kept) {
  UseInfo ui = ComputeUses(g);
  Executor ex(g);
  const int n = g.size();
  for (int v = 0; v < n; ++v) {
    size_t start = ex.order().size();
    if (!ex.computed(v) || !ex.live(v)) {
      if (ex.computed(v) && !g.nodes[v].can_recompute()) break;
      // Target step: compute v even if an earlier recomputation made it (cannot happen:
      // ancestors of earlier targets have smaller ids).
      ex.Ensure(v);
    }
    const bool fwd_step = g.nodes[v].phase == Phase::kForward;
    const std::vector<int> cand = TouchedSince(g, ex, start);
    for (int u : cand) {
      if (!ex.live(u)) continue;
      if (retain_kept && keep[u] ? ui.horizon[u] <= v : Dead(g, ui, u, v)) {
        ex.Drop(u);
        continue;
      }
      if (fwd_step && !keep[u] && g.nodes[u].can_recompute() &&
          g.nodes[u].phase == Phase::kForward && ui.last_fwd_user[u] <= v) {
        ex.Drop(u);
      }
    }
  }
  return ex.order();
}

std::vector<int> ExecuteKeepSet(const Graph& g, const std::vector<char>& keep) {
  return ExecuteKeepSetImpl(g, keep, false);
}

// As ExecuteKeepSet, but kept values stay resident while any recomputation may read them,
// so recomputation never reaches past them.
std::vector<int> ExecuteKeepSetRetained(const Graph& g, const std::vector<char>& keep) {
  return ExecuteKeepSetImpl(g, keep, true);
}

std::vector<int> GreedyOrder(const Graph& g, int64_t budget, const GreedyParams& p) {
  UseInfo ui = ComputeUses(g);
  Executor ex(g);
  const int n = g.size();
  std::mt19937_64 rng(p.seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<int> live_list;  // may contain stale entries; filtered lazily
  std::vector<char> in_list(n, 0);
  int cur = 0;
  auto next_use = [&](int u) {
    const auto& us = ui.users[u];
    auto it = std::upper_bound(us.begin(), us.end(), cur);
    return it == us.end() ? n + 1 : *it;
  };
  ex.before_compute = [&](int x) {
    int64_t need = g.nodes[x].bytes;
    while (ex.live_bytes() + need > budget) {
      int best = -1;
      double best_score = 0;
      size_t w = 0;
      for (size_t k = 0; k < live_list.size(); ++k) {
        int u = live_list[k];
        if (!ex.live(u)) {
          in_list[u] = 0;
          continue;
        }
        live_list[w++] = u;
        if (ex.pinned(u) || !g.nodes[u].can_recompute() || g.nodes[u].bytes == 0) continue;
        double rc = g.nodes[u].cost;
        for (int i : g.nodes[u].inputs)
          if (!ex.live(i)) rc += g.nodes[i].cost;
        double dist = std::max(1, next_use(u) - cur);
        double score = std::pow(rc + 1e-9, p.cost_exp) /
                       (static_cast<double>(g.nodes[u].bytes) * std::pow(dist, p.dist_exp));
        if (p.noise > 0) score *= std::exp(p.noise * normal(rng));
        if (best < 0 || score < best_score) {
          best = u;
          best_score = score;
        }
      }
      live_list.resize(w);
      if (best < 0) break;  // nothing evictable: the budget cannot hold here
      ex.Drop(best);
    }
  };
  for (int v = 0; v < n; ++v) {
    cur = v;
    size_t start = ex.order().size();
    if (!ex.live(v)) {
      if (ex.computed(v) && !g.nodes[v].can_recompute()) break;
      if (!ex.Ensure(v)) break;
    }
    const std::vector<int> cand = TouchedSince(g, ex, start);
    for (int u : cand) {
      if (!ex.live(u)) continue;
      if (Dead(g, ui, u, v)) {
        ex.Drop(u);
      } else if (!in_list[u]) {
        in_list[u] = 1;
        live_list.push_back(u);
      }
    }
  }
  return ex.order();
}

absl::StatusOr<RawPlan> PlanNoRemat(const Graph& g, const PlanOptions&) {
  RawPlan p;
  for (int v = 0; v < g.size(); ++v) p.order.push_back(v);
  return p;
}

absl::StatusOr<RawPlan> PlanChen(const Graph& g, const PlanOptions& opt) {
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
  auto keep_for = [&](double b) {
    // Chen et al.'s greedy: walk the forward nodes, accumulate sizes, checkpoint the node
    // where the running total passes b.
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
  };
  std::vector<double> bs;
  double sq = std::sqrt(static_cast<double>(fwd_total) *
                        static_cast<double>(std::max<int64_t>(fwd_max, 1)));
  bs.push_back(sq);
  double lo = std::max<double>(1.0, static_cast<double>(fwd_max) / 4),
         hi = static_cast<double>(fwd_total) + 1;
  for (int k = 0; k <= 48; ++k) bs.push_back(lo * std::pow(hi / lo, k / 48.0));
  std::vector<int> best_order;
  SimResult best;
  bool have = false;
  Schedule s;
  for (double b : bs) {
    s.order = ExecuteKeepSet(g, keep_for(b));
    SimResult r = simulate(g, s);
    if (!r.valid) continue;
    bool better;
    if (!have)
      better = true;
    else if (opt.budget_bytes) {
      bool fits = r.peak_bytes <= *opt.budget_bytes, bfits = best.peak_bytes <= *opt.budget_bytes;
      better = fits != bfits ? fits : (fits ? r.cost < best.cost : r.peak_bytes < best.peak_bytes);
    } else {
      better =
          r.peak_bytes < best.peak_bytes || (r.peak_bytes == best.peak_bytes && r.cost < best.cost);
    }
    if (better) {
      best = r;
      best_order = s.order;
      have = true;
    }
  }
  p.order = best_order;
  return p;
}

std::optional<ExhaustiveResult> ExhaustiveOptimum(const Graph& g, int64_t budget, size_t max_states,
                                                  bool first_in_id_order) {
  const int n = g.size();
  if (n > 31) return std::nullopt;
  const uint64_t all = (n == 64) ? ~0ULL : ((1ULL << n) - 1);
  std::vector<uint64_t> inmask(n, 0);
  for (int v = 0; v < n; ++v)
    for (int u : g.nodes[v].inputs) inmask[v] |= 1ULL << u;
  struct Info {
    double dist;
    uint64_t parent;
    int action;
    bool closed;
  };
  std::unordered_map<uint64_t, Info> info;
  using QE = std::pair<double, uint64_t>;
  std::priority_queue<QE, std::vector<QE>, std::greater<QE>> pq;
  auto key = [](uint64_t live, uint64_t done) { return live | (done << 32); };
  auto bytes_of = [&](uint64_t m) {
    int64_t b = 0;
    for (int v = 0; v < n; ++v)
      if (m >> v & 1) b += g.nodes[v].bytes;
    return b;
  };
  uint64_t start = key(0, 0);
  info[start] = {0, 0, -1, false};
  pq.push({0, start});
  while (!pq.empty()) {
    auto [d, k] = pq.top();
    pq.pop();
    Info& cur = info[k];
    if (cur.closed || d > cur.dist) continue;
    cur.closed = true;
    uint64_t live = k & 0xffffffffULL, done = k >> 32;
    if (done == all) {
      ExhaustiveResult r;
      r.cost = d;
      uint64_t s = k;
      while (s != start) {
        const Info& in = info[s];
        if (in.action >= 0) r.order.push_back(in.action);
        s = in.parent;
      }
      std::reverse(r.order.begin(), r.order.end());
      return r;
    }
    if (info.size() > max_states) return std::nullopt;
    int64_t lb = bytes_of(live);
    auto relax = [&](uint64_t nk, double nd, int action) {
      auto it = info.find(nk);
      if (it == info.end()) {
        info[nk] = {nd, k, action, false};
        pq.push({nd, nk});
      } else if (!it->second.closed && nd < it->second.dist) {
        it->second = {nd, k, action, false};
        pq.push({nd, nk});
      }
    };
    for (int v = 0; v < n; ++v) {
      uint64_t bit = 1ULL << v;
      if (live & bit) {
        relax(key(live & ~bit, done), d, -1);  // drop v
        continue;
      }
      if ((done & bit) && !g.nodes[v].can_recompute()) continue;
      if (first_in_id_order && !(done & bit) && (done & (bit - 1)) != (bit - 1)) continue;
      if ((inmask[v] & live) != inmask[v]) continue;
      if (lb + g.nodes[v].bytes > budget) continue;
      relax(key(live | bit, done | bit), d + g.nodes[v].cost, v);
    }
  }
  return std::nullopt;
}

}  // namespace remat::internal
