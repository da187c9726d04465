// Planner time against graph size: random layered graphs (after Gagrani et al. 2022,
// App. A: layers of random width, each node reading random nodes of the previous layers,
// random sizes and costs) with a mirrored backward pass, 100 to 20,000 nodes; and twremat
// on DenseNet-like graphs, whose dense skip connections make wide tree decompositions.
#include <benchmark/benchmark.h>

#include <random>
#include <string>
#include <vector>

#include "remat/graph.h"
#include "remat/planner.h"
#include "remat/schedule.h"
#include "tests/support/test_graphs.h"

namespace {

remat::Graph random_layered(int n_forward, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> width(1, 6), bytes(20, 5000), cost(1, 1000);
  std::uniform_real_distribution<double> u(0, 1);
  remat::Graph g;
  g.name = "rlg_bench";
  std::vector<std::vector<int>> layers;
  auto add = [&](std::vector<int> in, remat::Phase ph) {
    remat::Node nd;
    nd.id = g.size();
    nd.name = std::to_string(nd.id);
    nd.bytes = bytes(rng);
    nd.cost = cost(rng);
    nd.inputs = std::move(in);
    nd.phase = ph;
    g.nodes.push_back(nd);
    return nd.id;
  };
  while (g.size() < n_forward) {
    std::vector<int> layer;
    int w = width(rng);
    for (int k = 0; k < w && g.size() < n_forward; ++k) {
      std::vector<int> in;
      if (!layers.empty()) {
        const auto& prev = layers.back();
        in.push_back(prev[rng() % prev.size()]);
        // Skip connections to earlier layers (edge density ~0.2, decaying with distance).
        for (int back = 2; back <= 4 && back <= static_cast<int>(layers.size()); ++back) {
          if (u(rng) < 0.2 / back) {
            const auto& l = layers[layers.size() - back];
            in.push_back(l[rng() % l.size()]);
          }
        }
      }
      layer.push_back(add(in, remat::Phase::kForward));
    }
    layers.push_back(layer);
  }
  // Backward: one node per forward node, in reverse, reading it, its inputs' gradient chain.
  int prev = -1;
  for (int v = n_forward - 1; v >= 0; --v) {
    std::vector<int> in = {v};
    for (int x : g.nodes[v].inputs) in.push_back(x);
    if (prev >= 0) in.push_back(prev);
    prev = add(in, remat::Phase::kBackward);
  }
  return g;
}

// Plans g with algo at fraction of its no-remat peak (1: no budget) and reports the plan.
void bench_planner(benchmark::State& state, const char* algo, const remat::Graph& g,
                   double fraction) {
  remat::Schedule s{g.name, {}};
  for (int v = 0; v < g.size(); ++v) s.order.push_back(v);
  int64_t peak = remat::simulate(g, s).peak_bytes;
  remat::PlanOptions opt;
  if (fraction < 1.0) opt.budget_bytes = static_cast<int64_t>(fraction * peak);
  opt.time_limit_seconds = 20;
  double overhead = 0, feasible = 0, peak_fraction = 0;
  for (auto _ : state) {
    auto p = remat::run_planner(algo, g, opt);
    benchmark::DoNotOptimize(p);
    overhead = p.ok() ? p->sim.overhead : -1;
    feasible = p.ok() && p->feasible;
    peak_fraction =
        p.ok() ? static_cast<double>(p->sim.peak_bytes) / static_cast<double>(peak) : -1;
  }
  state.counters["nodes"] = g.size();
  state.counters["overhead"] = overhead;
  state.counters["feasible"] = feasible;
  state.counters["peak_fraction"] = peak_fraction;
}

void BM_Planner(benchmark::State& state, const char* algo, double fraction) {
  bench_planner(state, algo, random_layered(static_cast<int>(state.range(0)) / 2, 42), fraction);
}

// DenseNet-like graphs (each layer reads every earlier layer of its block), by DenseNet
// depth: 121 (blocks 6, 12, 24, 16: 2,418 nodes) and 169 (6, 12, 32, 32: 4,186 nodes).
void BM_TwRematDense(benchmark::State& state, double fraction) {
  const std::vector<int> blocks =
      state.range(0) == 121 ? std::vector<int>{6, 12, 24, 16} : std::vector<int>{6, 12, 32, 32};
  bench_planner(state, "twremat", remat::testing::dense_net_graph(blocks, 1), fraction);
}

#define SIZES \
  ->Arg(100)->Arg(1000)->Arg(4000)->Arg(20000)->Unit(benchmark::kMillisecond)->Iterations(1)
BENCHMARK_CAPTURE(BM_Planner, noremat, "noremat", 1.0) SIZES;
BENCHMARK_CAPTURE(BM_Planner, mincut, "mincut", 1.0) SIZES;
BENCHMARK_CAPTURE(BM_Planner, chen_0_7, "chen", 0.7) SIZES;
BENCHMARK_CAPTURE(BM_Planner, rotor_0_7, "rotor", 0.7) SIZES;
BENCHMARK_CAPTURE(BM_Planner, greedy_0_8, "greedy", 0.8) SIZES;
BENCHMARK_CAPTURE(BM_Planner, twremat_min, "twremat", 1.0) SIZES;
BENCHMARK_CAPTURE(BM_Planner, twremat_0_5, "twremat", 0.5) SIZES;
#define DEPTHS ->Arg(121)->Arg(169)->Unit(benchmark::kMillisecond)->Iterations(1)
BENCHMARK_CAPTURE(BM_TwRematDense, min, 1.0) DEPTHS;
BENCHMARK_CAPTURE(BM_TwRematDense, 0_5, 0.5) DEPTHS;

}  // namespace

BENCHMARK_MAIN();
