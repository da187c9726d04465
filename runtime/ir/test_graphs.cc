#include "runtime/ir/test_graphs.h"

#include <filesystem>
#include <random>

#include "remat/schedule.h"

namespace remat::testing {

std::string SharedGraphsDir() {
  std::filesystem::path p = std::filesystem::path(REMAT_SHARED_DIR) / "graphs";
  std::error_code ec;
  if (std::filesystem::is_directory(p, ec)) return p.string();
  return "";
}

static Node MakeNode(int id, int64_t bytes, double cost, std::vector<int> inputs, Phase ph) {
  Node n;
  n.id = id;
  n.name = "n" + std::to_string(id);
  n.op = "op";
  n.bytes = bytes;
  n.cost = cost;
  n.inputs = std::move(inputs);
  n.phase = ph;
  return n;
}

Graph LinearGraph(int n) {
  Graph g;
  g.name = "linear" + std::to_string(n);
  for (int i = 0; i <= 2 * n; ++i) {
    std::vector<int> in;
    if (i > 0) in.push_back(i - 1);
    if (i > n) in.push_back(2 * n - i);  // edge (2n - i) -> i
    g.nodes.push_back(MakeNode(i, 1, 1, in, i <= n ? Phase::kForward : Phase::kBackward));
  }
  g.outputs = {2 * n};
  return g;
}

Graph RandomDag(int n, double p, int max_bytes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0, 1);
  std::uniform_int_distribution<int> b(1, max_bytes), c(1, 5);
  Graph g;
  g.name = "random" + std::to_string(seed);
  for (int i = 0; i < n; ++i) {
    std::vector<int> in;
    for (int j = 0; j < i; ++j)
      if (u(rng) < p || (j == i - 1 && u(rng) < 0.5)) in.push_back(j);
    g.nodes.push_back(MakeNode(i, b(rng), c(rng), in, Phase::kForward));
  }
  return g;
}

Graph RandomTrainingGraph(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> b(1, 4), c(1, 5);
  Graph g;
  g.name = "train" + std::to_string(seed);
  for (int i = 0; i < n; ++i) {
    std::vector<int> in;
    if (i > 0) in.push_back(i - 1);
    if (i > 1 && rng() % 3 == 0) in.push_back(i - 2);
    g.nodes.push_back(MakeNode(i, b(rng), c(rng), in, Phase::kForward));
  }
  for (int k = 0; k < n; ++k) {
    int id = n + k;
    std::vector<int> in = {id - 1, n - 1 - k};
    g.nodes.push_back(MakeNode(id, b(rng), c(rng), in, Phase::kBackward));
  }
  return g;
}

int64_t NoRematPeak(const Graph& g) {
  Schedule s{g.name, {}};
  for (int v = 0; v < g.size(); ++v) s.order.push_back(v);
  return simulate(g, s).peak_bytes;
}

}  // namespace remat::testing
