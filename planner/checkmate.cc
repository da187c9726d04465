// Checkmate (Jain et al., MLSys 2020): the rematerialization MILP, solved with CBC.
//
// Stage t computes node t for the first time, preceded by any recomputations it needs;
// within a stage, nodes run in id order. Variables: R[t][i] (compute i in stage t),
// S[t][i] (i is resident on entry to stage t), FREE[t][i][k] (i's instance dies right
// after step k of stage t), U[t][k] (memory during step k of stage t). Memory follows
// docs/formats.md: an instance lives from its step through its last read.
#include <absl/strings/str_cat.h>

#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>
#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>

#include "coin/Cbc_C_Interface.h"
#include "internal.h"

namespace remat::detail {
namespace {

constexpr double kInf = 1e30;

using Terms = std::vector<std::pair<int, double>>;

struct Milp {
  std::vector<double> obj, lb, ub;
  std::vector<char> integer;
  std::vector<Terms> cols;  // per column: (row, coef)
  std::vector<double> row_lb, row_ub;

  int add_var(double cost, double lo, double hi, bool is_int) {
    obj.push_back(cost);
    lb.push_back(lo);
    ub.push_back(hi);
    integer.push_back(is_int);
    cols.emplace_back();
    return static_cast<int>(obj.size()) - 1;
  }
  void add_row(const Terms& terms, double lo, double hi) {
    int r = static_cast<int>(row_lb.size());
    row_lb.push_back(lo);
    row_ub.push_back(hi);
    for (auto [c, a] : terms) cols[c].push_back({r, a});
  }
};

// The graph as the model reads it, and the column of each named variable.
struct CheckmateModel {
  const Graph* g = nullptr;
  int n = 0;
  double scale = 1.0;  // bytes -> model units
  std::vector<std::vector<int>> users;
  std::vector<std::vector<int>> deps;     // distinct inputs
  std::vector<std::vector<int>> R, S, U;  // columns of R[t][i], S[t][i], U[t][k]
  // FREE[t][i][k]: per (t, k), the (i, column) pairs.
  std::vector<std::vector<std::vector<std::pair<int, int>>>> F;
  Milp milp;

  // S[t][i], or -1 where the model has no such variable: nothing is resident on entry to
  // stage 0, nor retained past the last stage.
  int s(int t, int i) const { return (t >= 1 && t < n && i < t) ? S[t][i] : -1; }
  double bytes(int i) const { return static_cast<double>(g->nodes[i].bytes); }
};

// A note when the MILP would be too large to build and solve; empty when it fits.
// Why the MILP of `g` is not worth building: over 3 million variables (gigabytes of model),
// or more than CBC's root LP gets through in the time limit (about half a million variables
// a second here), in which case building it only spends the time and memory.
std::string too_large_note(const Graph& g, double seconds) {
  const int n = g.size();
  size_t edges = 0;
  for (const Node& v : g.nodes) edges += v.inputs.size() + 1;
  // R, S, U: ~1.5 n^2; FREE: ~ n * (E + n) / 2.
  double est_vars = 1.5 * n * static_cast<double>(n) + 0.5 * n * static_cast<double>(edges);
  if (est_vars > 3e6)
    return absl::StrCat("checkmate: graph too large for the MILP (", n, " nodes, ~",
                        static_cast<int64_t>(est_vars), " variables)");
  if (est_vars > 5e5 * seconds)
    return absl::StrCat("checkmate: no plan in time: the MILP of ", n, " nodes (~",
                        static_cast<int64_t>(est_vars), " variables) needs more than ", seconds,
                        " s");
  return "";
}

// Memory is scaled to keep the coefficients well conditioned.
double memory_scale(const Graph& g) {
  int64_t maxb = 1;
  for (const Node& v : g.nodes) maxb = std::max(maxb, v.bytes);
  return maxb > 1e6 ? 1.0 / static_cast<double>(maxb) : 1.0;
}

std::vector<std::vector<int>> distinct_inputs(const Graph& g) {
  std::vector<std::vector<int>> deps(g.size());
  for (int v = 0; v < g.size(); ++v) {
    deps[v] = g.nodes[v].inputs;
    std::sort(deps[v].begin(), deps[v].end());
    deps[v].erase(std::unique(deps[v].begin(), deps[v].end()), deps[v].end());
  }
  return deps;
}

// R, S and U; the FREE variables are added with the memory rows that read them.
void add_stage_variables(double budget, const KeptBound& kept, CheckmateModel* cm) {
  const int n = cm->n;
  const Graph& g = *cm->g;
  // Rockmate's blocks recompute only forward values, and only in the backward section.
  auto barred = [&](int t, int i) {
    return kept.boundary >= 1 && kept.backward_only && (t < kept.boundary || i >= kept.boundary);
  };
  cm->R.assign(n, {});
  cm->S.assign(n + 1, {});
  cm->U.assign(n, {});
  for (int t = 0; t < n; ++t) {
    cm->R[t].assign(t + 1, -1);
    for (int i = 0; i <= t; ++i) {
      double hi = (i < t && (!g.nodes[i].can_recompute() || barred(t, i))) ? 0.0 : 1.0;
      double lo = (i == t) ? 1.0 : 0.0;
      cm->R[t][i] = cm->milp.add_var(g.nodes[i].cost, lo, hi, true);
    }
  }
  for (int t = 1; t <= n; ++t) {
    cm->S[t].assign(t, -1);
    if (t == n) continue;  // nothing is retained past the last stage
    for (int i = 0; i < t; ++i) cm->S[t][i] = cm->milp.add_var(0.0, 0.0, 1.0, true);
  }
  for (int t = 0; t < n; ++t) {
    cm->U[t].assign(t + 1, -1);
    for (int k = 0; k <= t; ++k)
      cm->U[t][k] = cm->milp.add_var(0.0, 0.0, budget * cm->scale, false);
  }
}

// Dependencies, R[t][i] <= R[t][j] + S[t][j], and never both retain and recompute; then
// retention, S[t+1][i] <= R[t][i] + S[t][i].
void add_dependency_rows(int t, CheckmateModel* cm) {
  const auto& R = cm->R;
  for (int i = 0; i <= t; ++i) {
    for (int j : cm->deps[i]) {
      Terms terms = {{R[t][i], 1.0}, {R[t][j], -1.0}};
      if (cm->s(t, j) >= 0) terms.push_back({cm->s(t, j), -1.0});
      cm->milp.add_row(terms, -kInf, 0.0);
    }
    if (cm->s(t, i) >= 0) cm->milp.add_row({{R[t][i], 1.0}, {cm->s(t, i), 1.0}}, -kInf, 1.0);
  }
  if (t + 1 < cm->n) {
    for (int i = 0; i <= t; ++i) {
      Terms terms = {{cm->S[t + 1][i], 1.0}, {R[t][i], -1.0}};
      if (cm->s(t, i) >= 0) terms.push_back({cm->s(t, i), -1.0});
      cm->milp.add_row(terms, -kInf, 0.0);
    }
  }
}

// Adds FREE[t][i][k] for i in deps(k) and k itself, with the rows that tie it to its
// hazards; returns each (column, bytes).
Terms add_free_variables(int t, int k, CheckmateModel* cm) {
  const auto& R = cm->R;
  std::vector<int> cand = cm->deps[k];
  cand.push_back(k);
  Terms frees;
  for (int i : cand) {
    int f = cm->milp.add_var(0.0, 0.0, 1.0, true);
    cm->F[t][k].push_back({i, f});
    // hazards = (1 - R[t][k]) + S[t+1][i] + sum_{j in users(i), k < j <= t} R[t][j]
    Terms hz = {{R[t][k], -1.0}};
    double max_h = 1.0;
    if (cm->s(t + 1, i) >= 0) {
      hz.push_back({cm->s(t + 1, i), 1.0});
      max_h += 1;
    }
    for (int j : cm->users[i]) {
      if (j > k && j <= t) {
        hz.push_back({R[t][j], 1.0});
        max_h += 1;
      }
    }
    // 1 - F <= hazards  ->  hazards + F >= 1  ->  (sum hz) + F >= 0 (the constant 1 of
    // (1 - R) moved)
    Terms row1 = hz;
    row1.push_back({f, 1.0});
    cm->milp.add_row(row1, 0.0, kInf);
    // hazards <= max_h (1 - F)  ->  (sum hz) + 1 + max_h F <= max_h
    Terms row2 = hz;
    row2.push_back({f, max_h});
    cm->milp.add_row(row2, -kInf, max_h - 1.0);
    frees.push_back({f, cm->bytes(i)});
  }
  return frees;
}

// Memory through stage t: U[t][0] = b0 R[t][0] + sum_i b_i S[t][i], then
// U[t][k+1] = U[t][k] - sum b_i F[t][i][k] + b_{k+1} R[t][k+1].
void add_memory_rows(int t, CheckmateModel* cm) {
  const auto& R = cm->R;
  const auto& U = cm->U;
  const double scale = cm->scale;
  cm->F[t].assign(t + 1, {});
  {
    Terms terms = {{U[t][0], 1.0}, {R[t][0], -scale * cm->bytes(0)}};
    for (int i = 0; i < t; ++i) {
      if (cm->s(t, i) >= 0) terms.push_back({cm->s(t, i), -scale * cm->bytes(i)});
    }
    cm->milp.add_row(terms, 0.0, 0.0);
  }
  for (int k = 0; k <= t; ++k) {
    Terms frees = add_free_variables(t, k, cm);
    if (k + 1 <= t) {
      Terms terms = {{U[t][k + 1], 1.0}, {U[t][k], -1.0}, {R[t][k + 1], -scale * cm->bytes(k + 1)}};
      for (auto [f, b] : frees) terms.push_back({f, scale * b});
      cm->milp.add_row(terms, 0.0, 0.0);
    }
  }
}

// Rockmate's bound on what a block keeps from its forward to its backward: the bytes of the
// nodes below `boundary` resident on entry to stage `boundary`.
void add_kept_row(const KeptBound& kept, CheckmateModel* cm) {
  if (kept.boundary < 1 || kept.boundary >= cm->n) return;
  Terms terms;
  for (int i = 0; i < kept.boundary; ++i) {
    if (cm->s(kept.boundary, i) >= 0 && cm->bytes(i) > 0)
      terms.push_back({cm->s(kept.boundary, i), cm->scale * cm->bytes(i)});
  }
  if (!terms.empty())
    cm->milp.add_row(terms, -kInf, cm->scale * static_cast<double>(kept.max_bytes));
}

// False when the deadline passed before the model was complete.
bool build_checkmate_model(const Graph& g, double budget, const KeptBound& kept,
                           const Deadline& deadline, CheckmateModel* cm) {
  cm->g = &g;
  cm->n = g.size();
  cm->scale = memory_scale(g);
  cm->users = g.users();
  cm->deps = distinct_inputs(g);
  add_stage_variables(budget, kept, cm);
  cm->F.assign(cm->n, {});
  for (int t = 0; t < cm->n; ++t) {
    if (deadline.expired()) return false;
    add_dependency_rows(t, cm);
    add_memory_rows(t, cm);
  }
  add_kept_row(kept, cm);
  return true;
}

// The constraint matrix in the column-major arrays that CBC loads.
struct ColumnMajor {
  std::vector<CoinBigIndex> start;
  std::vector<int> index;
  std::vector<double> value;
};

ColumnMajor to_column_major(const Milp& m) {
  const int ncols = static_cast<int>(m.obj.size());
  ColumnMajor a;
  a.start.assign(ncols + 1, 0);
  for (int c = 0; c < ncols; ++c) {
    a.start[c] = static_cast<CoinBigIndex>(a.index.size());
    for (auto [r, v] : m.cols[c]) {
      a.index.push_back(r);
      a.value.push_back(v);
    }
  }
  a.start[ncols] = static_cast<CoinBigIndex>(a.index.size());
  return a;
}

// The order's steps by stage (stage t ends with the first computation of t), each
// stage's recomputations in id order as the model runs them; empty when first
// computations are not in id order.
std::vector<std::vector<int>> stages_of(int n, const std::vector<int>& order) {
  std::vector<std::vector<int>> stages(n);
  std::vector<char> seen(n, 0);
  int t = 0;
  for (int v : order) {
    if (v < 0 || v >= n || t >= n) return {};
    if (!seen[v] && v != t) return {};
    stages[t].push_back(v);
    if (!seen[v]) {
      seen[v] = 1;
      std::sort(stages[t].begin(), stages[t].end());
      stages[t].erase(std::unique(stages[t].begin(), stages[t].end()), stages[t].end());
      ++t;
    }
  }
  return t == n ? stages : std::vector<std::vector<int>>{};
}

// Note [Checkmate's MIP start]
// CBC's heuristics can take many seconds to find any solution of a block's MILP while a
// cheap planner already has a good one. A start is given as every integer column's value:
// R from the stages, S[t][i] when the newest instance of i made before stage t is read in
// stage t or later, FREE[t][i][k] exactly when the model's hazards are all zero. CBC
// checks it and ignores it when it breaks a row (the budget, say).
std::vector<std::pair<int, double>> mip_start(const CheckmateModel& cm,
                                              const std::vector<int>& order) {
  const int n = cm.n;
  const std::vector<std::vector<int>> stages = stages_of(n, order);
  if (stages.empty()) return {};
  std::vector<int> flat, stage_of;
  for (int t = 0; t < n; ++t)
    for (int v : stages[t]) flat.push_back(v), stage_of.push_back(t);
  std::vector<int> latest(n, -1), last_read_stage(flat.size(), -1);
  std::vector<std::vector<char>> live_in(n + 1, std::vector<char>(n, 0));  // S values
  for (size_t j = 0; j < flat.size(); ++j) {
    for (int u : cm.deps[flat[j]]) {
      if (latest[u] < 0) return {};
      last_read_stage[latest[u]] = stage_of[j];
    }
    latest[flat[j]] = static_cast<int>(j);
  }
  for (size_t j = 0; j < flat.size(); ++j)
    for (int t = stage_of[j] + 1; t <= last_read_stage[j]; ++t) live_in[t][flat[j]] = 1;
  std::vector<std::pair<int, double>> start;
  std::vector<char> in_stage(n, 0);
  for (int t = 0; t < n; ++t) {
    for (int v : stages[t]) in_stage[v] = 1;
    for (int i = 0; i <= t; ++i) start.push_back({cm.R[t][i], in_stage[i] ? 1.0 : 0.0});
    for (int i = 0; i < t; ++i)
      if (cm.s(t, i) >= 0) start.push_back({cm.s(t, i), live_in[t][i] ? 1.0 : 0.0});
    for (int k = 0; k <= t; ++k) {
      for (auto [i, col] : cm.F[t][k]) {
        bool free = in_stage[k] && !(cm.s(t + 1, i) >= 0 && live_in[t + 1][i]);
        for (int j : cm.users[i]) free = free && !(j > k && j <= t && in_stage[j]);
        start.push_back({col, free ? 1.0 : 0.0});
      }
    }
    for (int v : stages[t]) in_stage[v] = 0;
  }
  return start;
}

// The child's reply: [status, optimal, order...]; status 0 ok, 1 infeasible, 2 none.
std::vector<int> run_cbc(const CheckmateModel& cm, const ColumnMajor& a, const PlanOptions& opt,
                         double seconds, const std::vector<int>& start_order) {
  const Milp& m = cm.milp;
  const int ncols = static_cast<int>(m.obj.size());
  Cbc_Model* model = Cbc_newModel();
  Cbc_loadProblem(model, ncols, static_cast<int>(m.row_lb.size()), a.start.data(), a.index.data(),
                  a.value.data(), m.lb.data(), m.ub.data(), m.obj.data(), m.row_lb.data(),
                  m.row_ub.data());
  for (int c = 0; c < ncols; ++c)
    if (m.integer[c]) Cbc_setInteger(model, c);
  Cbc_setLogLevel(model, opt.verbose ? 1 : 0);
  Cbc_setMaximumSeconds(model, seconds);
  std::string secs = absl::StrCat(seconds);
  Cbc_setParameter(model, "sec", secs.c_str());
  Cbc_setParameter(model, "log", opt.verbose ? "1" : "0");
  Cbc_setAllowableGap(model, 1e-7);
  if (!start_order.empty()) {
    const auto start = mip_start(cm, start_order);
    std::vector<int> cols;
    std::vector<double> vals;
    for (auto [c, v] : start) cols.push_back(c), vals.push_back(v);
    if (!cols.empty())
      Cbc_setMIPStartI(model, static_cast<int>(cols.size()), cols.data(), vals.data());
  }
  Cbc_solve(model);
  const double* sol = Cbc_bestSolution(model);
  if (sol != nullptr && (Cbc_numberSavedSolutions(model) > 0 || Cbc_isProvenOptimal(model))) {
    std::vector<int> out = {0, Cbc_isProvenOptimal(model) != 0};
    for (int t = 0; t < cm.n; ++t) {
      for (int i = 0; i <= t; ++i)
        if (sol[cm.R[t][i]] > 0.5) out.push_back(i);
    }
    return out;
  }
  return {Cbc_isProvenInfeasible(model) ? 1 : 2, 0};
}

void write_all(int fd, const std::vector<int>& words) {
  size_t len = words.size() * sizeof(int), off = 0;
  const char* p = reinterpret_cast<const char*>(words.data());
  while (off < len) {
    ssize_t w = write(fd, p + off, len - off);
    if (w <= 0) break;
    off += static_cast<size_t>(w);
  }
}

// Reads the child's reply until it closes the pipe or the deadline passes, when the child
// is killed (*killed). Reaps the child either way; *signal is the signal that ended it
// otherwise (0: it exited).
std::vector<int> collect_reply(int fd, pid_t pid, double seconds, bool* killed, int* signal) {
  std::vector<char> buf;
  Deadline hard(seconds);
  *killed = false;
  for (;;) {
    int ms = static_cast<int>(std::max(0.0, hard.left()) * 1000);
    pollfd pfd{fd, POLLIN, 0};
    int r = poll(&pfd, 1, ms);
    if (r == 0) {
      kill(pid, SIGKILL);
      *killed = true;
      break;
    }
    if (r < 0) continue;
    char tmp[65536];
    ssize_t got = read(fd, tmp, sizeof(tmp));
    if (got <= 0) break;
    buf.insert(buf.end(), tmp, tmp + got);
  }
  close(fd);
  int wstatus = 0;
  waitpid(pid, &wstatus, 0);
  *signal = !*killed && WIFSIGNALED(wstatus) ? WTERMSIG(wstatus) : 0;
  std::vector<int> out(buf.size() / sizeof(int));
  if (!out.empty()) std::memcpy(out.data(), buf.data(), out.size() * sizeof(int));
  return out;
}

struct SolveResult {
  bool killed = false;
  int signal = 0;          // the signal the solving child died of (CBC crashed), or 0
  std::vector<int> reply;  // as run_cbc returns it
};

// CBC's time limit is checked during branch and bound only; the root LP of a large model
// can run far past it. The solve therefore runs in a child process, told to stop a little
// before the deadline and killed a little after it; the child sends back its status and
// order.
absl::StatusOr<SolveResult> solve_with_cbc(const CheckmateModel& cm, const PlanOptions& opt,
                                           const Deadline& deadline,
                                           const std::vector<int>& start_order) {
  const ColumnMajor a = to_column_major(cm.milp);
  const double left = std::max(0.0, deadline.left());
  const double cbc_seconds = std::max(0.05, left - 0.2);
  int fds[2];
  if (pipe(fds) != 0) return absl::InternalError("checkmate: pipe() failed");
  fflush(nullptr);  // a child that flushes must not repeat what the parent buffered
  pid_t pid = fork();
  if (pid < 0) return absl::InternalError("checkmate: fork() failed");
  if (pid == 0) {
    close(fds[0]);
    write_all(fds[1], run_cbc(cm, a, opt, cbc_seconds, start_order));
    close(fds[1]);
    _exit(0);
  }
  close(fds[1]);
  SolveResult result;
  result.reply =
      collect_reply(fds[0], pid, std::max(left, 0.1) + 0.3, &result.killed, &result.signal);
  return result;
}

void decode_schedule(const SolveResult& r, const PlanOptions& opt, RawPlan* plan) {
  const std::vector<int>& out = r.reply;
  if (r.signal != 0) {
    plan->note = absl::StrCat("checkmate: CBC crashed solving the MILP (signal ", r.signal, ", ",
                              strsignal(r.signal), ")");
  } else if (r.killed || out.size() < 2) {
    plan->note = absl::StrCat("checkmate: no solution within the time limit of ",
                              opt.time_limit_seconds, " s (the root LP did not finish)");
  } else if (out[0] == 0) {
    plan->optimal = out[1] != 0;
    plan->order.assign(out.begin() + 2, out.end());
  } else if (out[0] == 1) {
    plan->note = "checkmate: the MILP is infeasible: no schedule fits the budget";
  } else {
    plan->note = absl::StrCat("checkmate: no solution within the time limit of ",
                              opt.time_limit_seconds, " s");
  }
}

}  // namespace

absl::StatusOr<RawPlan> plan_checkmate(const Graph& g, const PlanOptions& opt) {
  return plan_checkmate_kept(g, opt, KeptBound{});
}

absl::StatusOr<RawPlan> plan_checkmate_kept(const Graph& g, const PlanOptions& opt,
                                            const KeptBound& kept) {
  const Deadline deadline(opt);
  RawPlan plan;
  plan.note = too_large_note(g, opt.time_limit_seconds);
  if (!plan.note.empty()) return plan;
  int64_t total_bytes = 0;
  for (const Node& v : g.nodes) total_bytes += v.bytes;
  const double budget =
      opt.budget_bytes ? static_cast<double>(*opt.budget_bytes) : static_cast<double>(total_bytes);
  CheckmateModel cm;
  if (!build_checkmate_model(g, budget, kept, deadline, &cm)) {
    plan.note = absl::StrCat("checkmate: no plan in time: building the MILP took the ",
                             opt.time_limit_seconds, " s");
    return plan;
  }
  absl::StatusOr<SolveResult> solved = solve_with_cbc(cm, opt, deadline, kept.start);
  if (!solved.ok()) return solved.status();
  decode_schedule(*solved, opt, &plan);
  return plan;
}

}  // namespace remat::detail
