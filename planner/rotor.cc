// rotor: the optimal checkpointing dynamic program for heterogeneous chains (Beaumont et
// al. 2019), applied to the chain of blocks between 1-separators of the forward graph
// (the Rockmate decomposition). The chain plan is turned into an order by the executor
// and measured by the simulator; the memory handed to the DP is lowered until the
// measured peak fits the budget.
#include <absl/strings/str_cat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

#include "internal.h"
#include "remat/schedule.h"

namespace remat::detail {
namespace {

// The chain in memory units and the dynamic program's tables: opt[at(s, t, m)] is the
// minimum cost to run stages s..t forward and backward with m units, choice[at(s, t, m)]
// how (-1 leaf, 0 all, j > 0 checkpoint at j).
struct RotorTable {
  int L = 0, M = 0;
  std::vector<int64_t> act, tape, leaf;
  std::vector<double> pre;  // pre[i]: cost of advancing through stages 0..i-1
  std::vector<double> opt;
  std::vector<int> choice;
  size_t at(int s, int t, int m) const { return (static_cast<size_t>(s) * L + t) * (M + 1) + m; }
};

constexpr double kInf = std::numeric_limits<double>::infinity();

// Discretises memory into units (sizes round up, memory rounds down) and sizes the
// tables; false when they would be too large.
bool discretise_chain(const RotorChain& c, int64_t memory, int memory_steps, RotorTable* t) {
  const int L = static_cast<int>(c.fwd_cost.size());
  int64_t unit = 1;
  if (memory_steps > 0 && memory > memory_steps) unit = (memory + memory_steps - 1) / memory_steps;
  auto units = [&](int64_t b) -> int64_t {
    return b >= (int64_t{1} << 61) ? (int64_t{1} << 40) : (b + unit - 1) / unit;
  };
  const int M = static_cast<int>(std::min<int64_t>(memory / unit, 1 << 20));
  t->L = L;
  t->M = M;
  t->act.resize(L + 1);
  t->tape.resize(L);
  t->leaf.resize(L);
  for (int i = 0; i <= L; ++i) t->act[i] = units(c.act_bytes[i]);
  for (int i = 0; i < L; ++i) {
    t->tape[i] = units(c.tape_bytes[i]);
    t->leaf[i] = units(c.leaf_bytes[i]);
  }
  t->pre.assign(L + 1, 0);
  for (int i = 0; i < L; ++i) t->pre[i + 1] = t->pre[i] + c.fwd_cost[i];
  const size_t states = static_cast<size_t>(L) * L * (M + 1);
  if (states > 60'000'000) return false;
  t->opt.assign(states, kInf);
  t->choice.assign(states, -2);
  return true;
}

// The best way to run stages s..t with m units, from the entries for shorter ranges.
std::pair<double, int> best_rotor_choice(const RotorChain& c, const RotorTable& t, int s, int e,
                                         int m) {
  double best = kInf;
  int ch = -2;
  if (s == e) {
    if (m >= t.leaf[s]) {
      best = c.fwd_all_cost[s] + c.bwd_cost[s];
      ch = -1;
    }
    return {best, ch};
  }
  if (m >= t.tape[s]) {
    double v = t.opt[t.at(s + 1, e, m - static_cast<int>(t.tape[s]))];
    if (v < kInf) {
      best = c.fwd_all_cost[s] + v + c.bwd_cost[s];
      ch = 0;
    }
  }
  for (int j = s + 1; j <= e; ++j) {
    if (m < t.act[j]) continue;
    double a = t.opt[t.at(j, e, m - static_cast<int>(t.act[j]))];
    double b = t.opt[t.at(s, j - 1, m)];
    if (a == kInf || b == kInf) continue;
    double v = t.pre[j] - t.pre[s] + a + b;
    if (v < best) {
      best = v;
      ch = j;
    }
  }
  return {best, ch};
}

void fill_rotor_table(const RotorChain& c, RotorTable* t) {
  for (int len = 0; len < t->L; ++len) {
    for (int s = 0; s + len < t->L; ++s) {
      for (int m = 0; m <= t->M; ++m) {
        auto [best, ch] = best_rotor_choice(c, *t, s, s + len, m);
        t->opt[t->at(s, s + len, m)] = best;
        t->choice[t->at(s, s + len, m)] = ch;
      }
    }
  }
}

// The op sequence of the choices made for the whole chain with all the memory.
std::vector<RotorOp> rotor_ops(const RotorTable& t) {
  std::vector<RotorOp> ops;
  // Iterative reconstruction with an explicit stack of (s, t, m, pending backward).
  struct Task {
    int s, t, m;
    int kind;
  };  // kind 0: solve; 1: emit backward s
  std::vector<Task> stack = {{0, t.L - 1, t.M, 0}};
  while (!stack.empty()) {
    Task k = stack.back();
    stack.pop_back();
    if (k.kind == 1) {
      ops.push_back({RotorOp::kBackward, k.s});
      continue;
    }
    int ch = t.choice[t.at(k.s, k.t, k.m)];
    if (ch == -1) {
      ops.push_back({RotorOp::kForwardAll, k.s});
      ops.push_back({RotorOp::kBackward, k.s});
    } else if (ch == 0) {
      ops.push_back({RotorOp::kForwardAll, k.s});
      stack.push_back({k.s, 0, 0, 1});
      stack.push_back({k.s + 1, k.t, k.m - static_cast<int>(t.tape[k.s]), 0});
    } else {
      for (int i = k.s; i < ch; ++i) ops.push_back({RotorOp::kForward, i});
      ops.push_back({RotorOp::kCheckpoint, ch});
      stack.push_back({k.s, ch - 1, k.m, 0});
      stack.push_back({ch, k.t, k.m - static_cast<int>(t.act[ch]), 0});
    }
  }
  return ops;
}

}  // namespace

std::optional<std::pair<double, std::vector<RotorOp>>> rotor_solve(const RotorChain& c,
                                                                   int64_t memory,
                                                                   int memory_steps) {
  const int L = static_cast<int>(c.fwd_cost.size());
  if (L == 0) return std::make_pair(0.0, std::vector<RotorOp>{});
  if (memory < 0) return std::nullopt;
  RotorTable t;
  if (!discretise_chain(c, memory, memory_steps, &t)) return std::nullopt;
  fill_rotor_table(c, &t);
  if (t.opt[t.at(0, L - 1, t.M)] == kInf) return std::nullopt;
  std::vector<RotorOp> ops = rotor_ops(t);
  return std::make_pair(t.opt[t.at(0, L - 1, t.M)], ops);
}

namespace {

struct Blocks {
  std::vector<std::vector<int>> fwd;  // forward recomputable nodes of each block, in order
  std::vector<std::vector<int>> bwd;  // backward nodes of each block, in file order
  std::vector<int> block_of;          // -1 for nodes outside the chain (inputs etc.)
  std::vector<int> rest;              // nodes outside the chain, computed first
};

// Values that depend on inputs only (transposed weights, attention masks) or are small
// may cross block boundaries, as Rockmate treats parameters: they do not break the chain.
std::vector<char> const_like_nodes(const Graph& g) {
  std::vector<char> const_like(g.size(), 0);
  for (const Node& v : g.nodes) {
    bool c = v.phase == Phase::kForward && (!v.can_recompute() || !v.inputs.empty());
    if (c && v.can_recompute())
      for (int u : v.inputs) c = c && const_like[u];
    const_like[v.id] = c;
  }
  return const_like;
}

// Cuts the forward recomputable nodes `fwd` (in file order) into blocks after each node v
// such that no earlier value (other than const-like ones) that a node after v reads is
// larger than 1/16 of v: v is then nearly all that crosses the boundary.
std::vector<std::vector<int>> cut_at_separators(const Graph& g, const std::vector<int>& fwd,
                                                const std::vector<char>& const_like) {
  std::vector<int> pos(g.size(), -1);
  for (size_t k = 0; k < fwd.size(); ++k) pos[fwd[k]] = static_cast<int>(k);
  std::vector<int> far(fwd.size(), 0);
  for (size_t k = 0; k < fwd.size(); ++k) far[k] = static_cast<int>(k);
  for (const Node& v : g.nodes) {
    if (pos[v.id] < 0) continue;
    for (int u : v.inputs)
      if (pos[u] >= 0) far[pos[u]] = std::max(far[pos[u]], pos[v.id]);
  }
  std::vector<std::vector<int>> blocks;
  // active: values made so far that a later forward node reads.
  std::vector<std::vector<int>> expire(fwd.size() + 1);
  std::multiset<int64_t> active_bytes;  // of the values that count
  std::vector<int> cur;
  for (size_t k = 0; k < fwd.size(); ++k) {
    for (int u : expire[k]) active_bytes.erase(active_bytes.find(g.nodes[u].bytes));
    cur.push_back(fwd[k]);
    int v = fwd[k];
    bool sep = true;
    int64_t limit = g.nodes[v].bytes / 16;
    if (!active_bytes.empty() && *active_bytes.rbegin() > limit) sep = false;
    if (sep) {
      blocks.push_back(cur);
      cur.clear();
    }
    if (far[k] > static_cast<int>(k) && !const_like[v]) {
      active_bytes.insert(g.nodes[v].bytes);
      expire[far[k]].push_back(v);
    }
  }
  if (!cur.empty()) blocks.push_back(cur);
  return blocks;
}

// Merges neighbouring blocks so that the chain has at most kMaxBlocks stages.
void merge_blocks(const Graph& g, const std::vector<int>& fwd,
                  std::vector<std::vector<int>>* blocks) {
  const size_t kMaxBlocks = 40;
  if (blocks->size() <= kMaxBlocks) return;
  double total = 0;
  for (int v : fwd) total += g.nodes[v].cost + 1e-9;
  std::vector<std::vector<int>> merged;
  std::vector<int> acc;
  double acc_cost = 0;
  for (auto& blk : *blocks) {
    acc.insert(acc.end(), blk.begin(), blk.end());
    for (int v : blk) acc_cost += g.nodes[v].cost + 1e-9;
    if (acc_cost >= total / kMaxBlocks) {
      merged.push_back(acc);
      acc.clear();
      acc_cost = 0;
    }
  }
  if (!acc.empty()) merged.push_back(acc);
  *blocks = std::move(merged);
}

// Places every node outside the forward blocks: forward ones in b->rest, backward ones in
// a block's backward list.
void assign_rest(const Graph& g, Blocks* b) {
  const int nb = static_cast<int>(b->fwd.size());
  for (const Node& v : g.nodes) {
    if (v.phase == Phase::kForward) {
      if (b->block_of[v.id] < 0) b->rest.push_back(v.id);  // inputs, non-recomputable nodes
      continue;
    }
    // A backward node joins the latest block whose forward values it reads, but no later
    // than the blocks of the backward values it reads (blocks run backward in reverse).
    int mx = -1, mn = nb - 1;
    for (int u : v.inputs) {
      int bu = b->block_of[u];
      if (bu < 0) continue;
      if (g.nodes[u].phase == Phase::kForward)
        mx = std::max(mx, bu);
      else
        mn = std::min(mn, bu);
    }
    int blk = mx >= 0 ? std::min(mx, mn) : mn;
    b->block_of[v.id] = std::max(blk, 0);
  }
  b->bwd.assign(nb, {});
  for (const Node& v : g.nodes) {
    if (v.phase == Phase::kBackward && b->block_of[v.id] >= 0)
      b->bwd[b->block_of[v.id]].push_back(v.id);
  }
}

Blocks find_blocks(const Graph& g) {
  Blocks b;
  b.block_of.assign(g.size(), -1);
  const std::vector<char> const_like = const_like_nodes(g);
  std::vector<int> fwd;
  for (const Node& v : g.nodes)
    if (v.phase == Phase::kForward && v.can_recompute()) fwd.push_back(v.id);
  b.fwd = cut_at_separators(g, fwd, const_like);
  merge_blocks(g, fwd, &b.fwd);
  for (size_t i = 0; i < b.fwd.size(); ++i)
    for (int v : b.fwd[i]) b.block_of[v] = static_cast<int>(i);
  assign_rest(g, &b);
  return b;
}

// Turns the op sequence into an order through the executor.
std::vector<int> realise(const Graph& g, const Blocks& b, const std::vector<RotorOp>& ops) {
  Executor ex(g);
  const int n = g.size();
  auto users = g.users();
  std::vector<int> remaining(n, 0);  // backward readers not yet run
  std::vector<char> done(n, 0);
  for (int v = 0; v < n; ++v) remaining[v] = static_cast<int>(users[v].size());
  std::vector<char> keep(n, 0);
  for (int v : b.rest) ex.ensure(v);
  auto drop_dead = [&](int v) {
    if (ex.live(v) && remaining[v] == 0 && g.nodes[v].can_recompute()) ex.drop(v);
  };
  auto mark_done = [&](int v) {
    if (done[v]) return;
    done[v] = 1;
    for (int u : g.nodes[v].inputs) {
      --remaining[u];
      if (!keep[u]) drop_dead(u);
    }
    drop_dead(v);
  };
  const int nb = static_cast<int>(b.fwd.size());
  for (const RotorOp& op : ops) {
    if (op.kind == RotorOp::kCheckpoint) {
      if (op.stage > 0 && op.stage <= nb) keep[b.fwd[op.stage - 1].back()] = 1;
      continue;
    }
    if (op.kind == RotorOp::kForward || op.kind == RotorOp::kForwardAll) {
      const auto& blk = b.fwd[op.stage];
      for (int v : blk) {
        ex.ensure(v);
        if (!done[v]) mark_done(v);
      }
      if (op.kind == RotorOp::kForward) {
        for (size_t k = 0; k + 1 < blk.size(); ++k)
          if (!keep[blk[k]]) ex.drop(blk[k]);
      }
      continue;
    }
    // Backward of a block, then free its values that nothing later reads.
    for (int v : b.bwd[op.stage]) {
      ex.ensure(v);
      mark_done(v);
      for (int u : g.nodes[v].inputs) drop_dead(u);
    }
    for (int v : b.fwd[op.stage]) {
      keep[v] = 0;
      if (g.nodes[v].can_recompute()) ex.drop(v);
    }
    if (op.stage > 0) keep[b.fwd[op.stage - 1].back()] = 0;
  }
  // Anything never reached (should not happen) is computed at the end.
  for (int v = 0; v < n; ++v)
    if (!ex.computed(v)) ex.ensure(v);
  return ex.order();
}

}  // namespace

namespace {

// One stage per block; *fixed: the bytes of the nodes outside the chain.
RotorChain build_chain(const Graph& g, const Blocks& b, int64_t* fixed) {
  const int L = static_cast<int>(b.fwd.size());
  RotorChain c;
  *fixed = 0;
  for (int v : b.rest) *fixed += g.nodes[v].bytes;
  c.act_bytes.assign(L + 1, 0);
  for (int i = 0; i < L; ++i) {
    double fc = 0, bc = 0;
    int64_t tape = 0, bwd_bytes = 0;
    for (int v : b.fwd[i]) {
      fc += g.nodes[v].cost;
      tape += g.nodes[v].bytes;
    }
    for (int v : b.bwd[i]) {
      bc += g.nodes[v].cost;
      bwd_bytes = std::max(bwd_bytes, g.nodes[v].bytes);
    }
    c.fwd_cost.push_back(fc);
    c.fwd_all_cost.push_back(fc);
    c.bwd_cost.push_back(bc);
    c.tape_bytes.push_back(tape);
    c.leaf_bytes.push_back(tape + 2 * bwd_bytes);
    c.act_bytes[i + 1] = g.nodes[b.fwd[i].back()].bytes;
  }
  return c;
}

// Hands the DP less and less memory until the measured peak fits; keeps the cheapest
// order that fits, or else the last attempt (to report its peak).
std::vector<int> fit_to_budget(const Graph& g, const Blocks& b, const RotorChain& c, int64_t fixed,
                               const PlanOptions& opt) {
  Deadline deadline(opt);
  Schedule s{g.name, {}};
  std::vector<int> best, last;
  double best_cost = 0;
  std::vector<double> fs = {4.0, 2.0, 1.5, 1.25, 1.1};
  for (double f = 1.0; f > 0.02; f *= 0.93) fs.push_back(f);
  for (double f : fs) {
    if (deadline.expired()) break;
    int64_t mem = static_cast<int64_t>(f * static_cast<double>(*opt.budget_bytes - fixed));
    if (mem <= 0) break;
    auto r = rotor_solve(c, mem, 200);
    if (opt.verbose)
      fprintf(stderr, "rotor: f=%.3f mem=%lld dp=%s\n", f, static_cast<long long>(mem),
              r ? "ok" : "none");
    if (!r) continue;
    s.order = realise(g, b, r->second);
    SimResult sim = simulate(g, s, opt.budget_bytes);
    if (sim.valid) {
      if (best.empty() || sim.cost < best_cost) {
        best = s.order;
        best_cost = sim.cost;
      }
      break;
    }
    if (best.empty()) last = s.order;
  }
  return best.empty() ? last : best;
}

}  // namespace

absl::StatusOr<RawPlan> plan_rotor(const Graph& g, const PlanOptions& opt) {
  RawPlan plan;
  bool has_backward = false;
  for (const Node& v : g.nodes) has_backward |= v.phase == Phase::kBackward;
  if (!has_backward) {
    for (int v = 0; v < g.size(); ++v) plan.order.push_back(v);
    plan.note = "no backward phase: rotor does not apply, file order";
    return plan;
  }
  Blocks b = find_blocks(g);
  const int L = static_cast<int>(b.fwd.size());
  if (L == 0) {
    for (int v = 0; v < g.size(); ++v) plan.order.push_back(v);
    plan.note = "no recomputable forward chain: file order";
    return plan;
  }
  int64_t fixed = 0;
  RotorChain c = build_chain(g, b, &fixed);
  if (!opt.budget_bytes) {
    auto r = rotor_solve(c, int64_t{1} << 60, 200);
    if (r) plan.order = realise(g, b, r->second);
    return plan;
  }
  plan.order = fit_to_budget(g, b, c, fixed, opt);
  plan.note = absl::StrCat("rotor: chain of ", L, " blocks");
  return plan;
}

}  // namespace remat::detail
