// Checkmate (Jain et al., MLSys 2020): the rematerialization MILP, solved with CBC.
//
// Stage t computes node t for the first time, preceded by any recomputations it needs;
// within a stage, nodes run in id order. Variables: R[t][i] (compute i in stage t),
// S[t][i] (i is resident on entry to stage t), FREE[t][i][k] (i's instance dies right
// after step k of stage t), U[t][k] (memory during step k of stage t). Memory follows
// FORMAT.md: an instance lives from its step through its last read.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <csignal>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "coin/Cbc_C_Interface.h"
#include "internal.h"

namespace remat::internal {
namespace {

struct Milp {
  std::vector<double> obj, lb, ub;
  std::vector<char> integer;
  std::vector<std::vector<std::pair<int, double>>> cols;  // per column: (row, coef)
  std::vector<double> row_lb, row_ub;

  int AddVar(double cost, double lo, double hi, bool is_int) {
    obj.push_back(cost);
    lb.push_back(lo);
    ub.push_back(hi);
    integer.push_back(is_int);
    cols.emplace_back();
    return static_cast<int>(obj.size()) - 1;
  }
  void AddRow(const std::vector<std::pair<int, double>>& terms, double lo, double hi) {
    int r = static_cast<int>(row_lb.size());
    row_lb.push_back(lo);
    row_ub.push_back(hi);
    for (auto [c, a] : terms) cols[c].push_back({r, a});
  }
};

}  // namespace

absl::StatusOr<RawPlan> PlanCheckmate(const Graph& g, const PlanOptions& opt) {
  RawPlan plan;
  const int n = g.size();
  const double inf = 1e30;
  int64_t total_bytes = 0;
  size_t edges = 0;
  for (const Node& v : g.nodes) { total_bytes += v.bytes; edges += v.inputs.size() + 1; }
  // R, S, U: ~1.5 n^2; FREE: ~ n * (E + n) / 2.
  double est_vars = 1.5 * n * static_cast<double>(n) + 0.5 * n * static_cast<double>(edges);
  if (est_vars > 3e6) {
    plan.note = absl::StrCat("checkmate: graph too large for the MILP (", n, " nodes, ~",
                             static_cast<int64_t>(est_vars), " variables)");
    return plan;
  }
  const double budget = opt.budget_bytes ? static_cast<double>(*opt.budget_bytes) : static_cast<double>(total_bytes);
  // Scale memory to keep coefficients well conditioned.
  double scale = 1.0;
  int64_t maxb = 1;
  for (const Node& v : g.nodes) maxb = std::max(maxb, v.bytes);
  if (maxb > 1e6) scale = 1.0 / static_cast<double>(maxb);
  auto users = g.users();
  std::vector<std::vector<int>> deps(n);  // distinct inputs
  for (int v = 0; v < n; ++v) {
    deps[v] = g.nodes[v].inputs;
    std::sort(deps[v].begin(), deps[v].end());
    deps[v].erase(std::unique(deps[v].begin(), deps[v].end()), deps[v].end());
  }
  Milp m;
  // Index tables.
  std::vector<std::vector<int>> R(n), S(n + 1), U(n);
  for (int t = 0; t < n; ++t) {
    R[t].assign(t + 1, -1);
    for (int i = 0; i <= t; ++i) {
      double hi = (i < t && !g.nodes[i].can_recompute()) ? 0.0 : 1.0;
      double lo = (i == t) ? 1.0 : 0.0;
      R[t][i] = m.AddVar(g.nodes[i].cost, lo, hi, true);
    }
  }
  for (int t = 1; t <= n; ++t) {
    S[t].assign(t, -1);
    if (t == n) continue;  // nothing is retained past the last stage
    for (int i = 0; i < t; ++i) S[t][i] = m.AddVar(0.0, 0.0, 1.0, true);
  }
  auto s_var = [&](int t, int i) { return (t >= 1 && t < n && i < t) ? S[t][i] : -1; };
  for (int t = 0; t < n; ++t) {
    U[t].assign(t + 1, -1);
    for (int k = 0; k <= t; ++k) U[t][k] = m.AddVar(0.0, 0.0, budget * scale, false);
  }
  for (int t = 0; t < n; ++t) {
    // Dependencies: R[t][i] <= R[t][j] + S[t][j].
    for (int i = 0; i <= t; ++i) {
      for (int j : deps[i]) {
        std::vector<std::pair<int, double>> terms = {{R[t][i], 1.0}, {R[t][j], -1.0}};
        if (s_var(t, j) >= 0) terms.push_back({s_var(t, j), -1.0});
        m.AddRow(terms, -inf, 0.0);
      }
      // Never both retain and recompute.
      if (s_var(t, i) >= 0) m.AddRow({{R[t][i], 1.0}, {s_var(t, i), 1.0}}, -inf, 1.0);
    }
    // Retention: S[t+1][i] <= R[t][i] + S[t][i].
    if (t + 1 < n) {
      for (int i = 0; i <= t; ++i) {
        std::vector<std::pair<int, double>> terms = {{S[t + 1][i], 1.0}, {R[t][i], -1.0}};
        if (s_var(t, i) >= 0) terms.push_back({s_var(t, i), -1.0});
        m.AddRow(terms, -inf, 0.0);
      }
    }
    // Memory. U[t][0] = b0 R[t][0] + sum_i b_i S[t][i].
    {
      std::vector<std::pair<int, double>> terms = {{U[t][0], 1.0}, {R[t][0], -scale * g.nodes[0].bytes}};
      for (int i = 0; i < t; ++i) {
        if (s_var(t, i) >= 0) terms.push_back({s_var(t, i), -scale * g.nodes[i].bytes});
      }
      m.AddRow(terms, 0.0, 0.0);
    }
    for (int k = 0; k <= t; ++k) {
      // FREE[t][i][k] for i in deps(k) and k itself.
      std::vector<int> cand = deps[k];
      cand.push_back(k);
      std::vector<std::pair<int, double>> frees;
      for (int i : cand) {
        int f = m.AddVar(0.0, 0.0, 1.0, true);
        // hazards = (1 - R[t][k]) + S[t+1][i] + sum_{j in users(i), k < j <= t} R[t][j]
        std::vector<std::pair<int, double>> hz = {{R[t][k], -1.0}};
        double max_h = 1.0;
        if (s_var(t + 1, i) >= 0) { hz.push_back({s_var(t + 1, i), 1.0}); max_h += 1; }
        for (int j : users[i]) {
          if (j > k && j <= t) { hz.push_back({R[t][j], 1.0}); max_h += 1; }
        }
        // 1 - F <= hazards  ->  hazards + F >= 1  -> (sum hz) + F >= 0 (the constant 1 of (1 - R) moved)
        auto row1 = hz;
        row1.push_back({f, 1.0});
        m.AddRow(row1, 0.0, inf);
        // hazards <= max_h (1 - F)  ->  (sum hz) + 1 + max_h F <= max_h
        auto row2 = hz;
        row2.push_back({f, max_h});
        m.AddRow(row2, -inf, max_h - 1.0);
        frees.push_back({f, static_cast<double>(g.nodes[i].bytes)});
      }
      if (k + 1 <= t) {
        // U[t][k+1] = U[t][k] - sum b_i F[t][i][k] + b_{k+1} R[t][k+1]
        std::vector<std::pair<int, double>> terms = {{U[t][k + 1], 1.0}, {U[t][k], -1.0},
                                                     {R[t][k + 1], -scale * g.nodes[k + 1].bytes}};
        for (auto [f, b] : frees) terms.push_back({f, scale * b});
        m.AddRow(terms, 0.0, 0.0);
      }
    }
  }
  // Column-major arrays for CBC.
  const int ncols = static_cast<int>(m.obj.size());
  std::vector<CoinBigIndex> start(ncols + 1, 0);
  std::vector<int> index;
  std::vector<double> value;
  for (int c = 0; c < ncols; ++c) {
    start[c] = static_cast<CoinBigIndex>(index.size());
    for (auto [r, a] : m.cols[c]) { index.push_back(r); value.push_back(a); }
  }
  start[ncols] = static_cast<CoinBigIndex>(index.size());
  // CBC's time limit is checked during branch and bound only; the root LP of a large
  // model can run far past it. The solve therefore runs in a child process that is
  // killed a little after the limit; the child sends back its status and order.
  int fds[2];
  if (pipe(fds) != 0) return absl::InternalError("checkmate: pipe() failed");
  pid_t pid = fork();
  if (pid < 0) return absl::InternalError("checkmate: fork() failed");
  if (pid == 0) {
    close(fds[0]);
    std::vector<int> out;  // [status, optimal, order...]; status 0 ok, 1 infeasible, 2 none
    Cbc_Model* model = Cbc_newModel();
    Cbc_loadProblem(model, ncols, static_cast<int>(m.row_lb.size()), start.data(), index.data(), value.data(),
                    m.lb.data(), m.ub.data(), m.obj.data(), m.row_lb.data(), m.row_ub.data());
    for (int c = 0; c < ncols; ++c) if (m.integer[c]) Cbc_setInteger(model, c);
    Cbc_setLogLevel(model, opt.verbose ? 1 : 0);
    Cbc_setMaximumSeconds(model, std::max(0.1, opt.time_limit_seconds));
    std::string secs = absl::StrCat(std::max(0.1, opt.time_limit_seconds));
    Cbc_setParameter(model, "sec", secs.c_str());
    Cbc_setParameter(model, "log", opt.verbose ? "1" : "0");
    Cbc_setAllowableGap(model, 1e-7);
    Cbc_solve(model);
    const double* sol = Cbc_bestSolution(model);
    if (sol != nullptr && (Cbc_numberSavedSolutions(model) > 0 || Cbc_isProvenOptimal(model))) {
      out = {0, Cbc_isProvenOptimal(model) != 0};
      for (int t = 0; t < n; ++t) {
        for (int i = 0; i <= t; ++i) if (sol[R[t][i]] > 0.5) out.push_back(i);
      }
    } else {
      out = {Cbc_isProvenInfeasible(model) ? 1 : 2, 0};
    }
    size_t len = out.size() * sizeof(int), off = 0;
    const char* p = reinterpret_cast<const char*>(out.data());
    while (off < len) {
      ssize_t w = write(fds[1], p + off, len - off);
      if (w <= 0) break;
      off += static_cast<size_t>(w);
    }
    close(fds[1]);
    _exit(0);
  }
  close(fds[1]);
  std::vector<char> buf;
  Deadline hard(opt.time_limit_seconds + 2.0 + 0.05 * opt.time_limit_seconds);
  bool killed = false;
  for (;;) {
    int ms = static_cast<int>(std::max(0.0, hard.Left()) * 1000);
    pollfd pfd{fds[0], POLLIN, 0};
    int r = poll(&pfd, 1, ms);
    if (r == 0) { kill(pid, SIGKILL); killed = true; break; }
    if (r < 0) continue;
    char tmp[65536];
    ssize_t got = read(fds[0], tmp, sizeof(tmp));
    if (got <= 0) break;
    buf.insert(buf.end(), tmp, tmp + got);
  }
  close(fds[0]);
  int wstatus = 0;
  waitpid(pid, &wstatus, 0);
  std::vector<int> out(buf.size() / sizeof(int));
  if (!out.empty()) std::memcpy(out.data(), buf.data(), out.size() * sizeof(int));
  if (killed || out.size() < 2) {
    plan.note = absl::StrCat("checkmate: no solution within the time limit of ", opt.time_limit_seconds,
                             " s (the root LP did not finish)");
  } else if (out[0] == 0) {
    plan.optimal = out[1] != 0;
    plan.order.assign(out.begin() + 2, out.end());
  } else if (out[0] == 1) {
    plan.note = "checkmate: the MILP is infeasible: no schedule fits the budget";
  } else {
    plan.note = absl::StrCat("checkmate: no solution within the time limit of ", opt.time_limit_seconds, " s");
  }
  return plan;
}

}  // namespace remat::internal
