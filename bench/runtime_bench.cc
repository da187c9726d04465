// Google Benchmark harness for the runtime:
//   - the cached allocate+free pair of the caching allocator against the system allocator;
//   - RMM-style random allocations against a budget;
//   - one eviction decision with 1k, 10k and 100k live evictable tensors;
//   - replay of every shared trace, reporting bookkeeping (victim search) as a share of the
//     replay's simulated kernel time.
//
//   build/bin/remat_bench --benchmark_filter=AllocFree
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <filesystem>
#include <random>
#include <vector>

#include "remat/caching_allocator.h"
#include "remat/errors.h"
#include "remat/replay.h"
#include "remat/runtime.h"

namespace remat {
namespace {

void BM_CachingAllocFree(benchmark::State& state) {
  CachingAllocator alloc(std::make_unique<HostSegmentSource>());
  const auto size = static_cast<std::size_t>(state.range(0));
  alloc.deallocate(alloc.allocate(size), size);  // warm the cache
  for (auto _ : state) {
    void* p = alloc.allocate(size);
    benchmark::DoNotOptimize(p);
    alloc.deallocate(p, size);
  }
}
BENCHMARK(BM_CachingAllocFree)->Arg(256)->Arg(64 << 10)->Arg(8 << 20);

void BM_SystemMallocFree(benchmark::State& state) {
  const auto size = static_cast<std::size_t>(state.range(0));
  for (auto _ : state) {
    void* p = std::malloc(size);
    benchmark::DoNotOptimize(p);
    std::free(p);
  }
}
BENCHMARK(BM_SystemMallocFree)->Arg(256)->Arg(64 << 10)->Arg(8 << 20);

// Random allocations and frees of random sizes with up to `range(0)` live, under a budget.
// Sizes average about 5 MB, so 1000 live may not fit the 4 GiB budget: where a request does
// not fit, a random live allocation is freed instead (what eviction would do), as in a
// runtime under a budget.
void BM_RandomAllocations(benchmark::State& state) {
  CachingAllocatorOptions o;
  o.budget = std::size_t{4} << 30;
  CachingAllocator alloc(std::make_unique<SimulatedSegmentSource>(), o);
  std::mt19937_64 rng(1);
  std::vector<std::pair<void*, std::size_t>> live;
  const auto max_live = static_cast<std::size_t>(state.range(0));
  std::size_t full = 0;
  for (auto _ : state) {
    bool free_one = !(live.size() < max_live && (live.empty() || rng() % 2 == 0));
    if (!free_one) {
      const std::size_t n = std::size_t{1} << (6 + rng() % 20);
      try {
        live.emplace_back(alloc.allocate(n + rng() % n), n);
      } catch (const OutOfMemoryError&) {
        ++full;
        free_one = !live.empty();
      }
    }
    if (free_one) {
      const std::size_t i = rng() % live.size();
      alloc.deallocate(live[i].first, live[i].second);
      live[i] = live.back();
      live.pop_back();
    }
  }
  for (auto [p, n] : live) alloc.deallocate(p, n);
  state.counters["budget_full"] = static_cast<double>(full);
}
BENCHMARK(BM_RandomAllocations)->Arg(100)->Arg(1000);

// `range(0)` live evictable tensors of assorted sizes and costs; each iteration makes one
// more tensor under a full budget, which needs an eviction decision (plus the bookkeeping of
// the call), and keeps it, so the number of candidates stays near `range(0)`.
void BM_EvictionDecision(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  RuntimeOptions o;
  o.backend = Backend::kSimulated;
  o.accounting = Accounting::kLogical;
  o.policy = state.range(1) == 0 ? "dtr" : "dtr_eq";
  Runtime rt(o);
  auto op = std::make_shared<OpDef>();
  op->name = "op";
  std::mt19937_64 rng(3);
  const Tensor x = rt.constant(TensorSpec{{1024}, DType::kU8});
  std::vector<Tensor> live;
  live.reserve(n);
  Tensor prev = x;
  for (std::size_t i = 0; i < n; ++i) {
    // A random DAG: each op reads the previous tensor and one random earlier one.
    const Tensor& other = live.empty() ? x : live[rng() % live.size()];
    const Tensor inputs[] = {prev, other};
    const auto bytes = static_cast<std::int64_t>(1024 + rng() % 4096);
    prev = rt.call_with(op, inputs, {OutputSpec(TensorSpec{{bytes}, DType::kU8})},
                        static_cast<double>(100 + rng() % 10000))[0];
    live.push_back(prev);
  }
  rt.set_budget(rt.stats().memory.allocated);
  const std::size_t evictions_before = rt.stats().evictions;
  const double search_before = rt.stats().search_seconds;
  std::vector<Tensor> made;
  made.reserve(1 << 22);
  for (auto _ : state) {
    const Tensor in[] = {x};
    made.push_back(rt.call_with(op, in, {OutputSpec(TensorSpec{{4096}, DType::kU8})}, 1.0)[0]);
  }
  const RuntimeStats s = rt.stats();
  state.counters["evictions_per_iter"] =
      static_cast<double>(s.evictions - evictions_before) / static_cast<double>(state.iterations());
  state.counters["search_ns_per_eviction"] =
      (s.search_seconds - search_before) * 1e9 /
      static_cast<double>(s.evictions - evictions_before + 1);
}
BENCHMARK(BM_EvictionDecision)
    ->ArgsProduct({{1000, 10000, 100000}, {0, 1}})
    ->ArgNames({"live", "eq"});

// Replays a shared trace at half its peak with dtr; `bookkeeping_pct` is the victim search's
// wall time over the replay's simulated kernel time, `overhead_pct` the whole replay's wall
// time (all runtime bookkeeping, no kernels) over that same kernel time.
void BM_Replay(benchmark::State& state, const std::string& name, const std::string& policy,
               Accounting accounting) {
  const std::filesystem::path path =
      std::filesystem::path(REMAT_SHARED_DIR) / "traces" / "dtr" / (name + ".log");
  auto trace = read_dtr_trace_file(path.string());
  if (!trace.ok()) {
    state.SkipWithError("trace not found (../shared is absent)");
    return;
  }
  ReplayOptions o;
  o.policy = policy;
  o.accounting = accounting;
  o.budget = replay_baseline(*trace).logical_peak_bytes / 2;
  double search = 0, simulated = 0, wall = 0, slowdown = 0;
  for (auto _ : state) {
    const ReplayResult r = replay(*trace, o);
    search += r.search_seconds;
    simulated += r.simulated_seconds;
    wall += r.wall_seconds;
    slowdown = r.slowdown;
  }
  state.counters["bookkeeping_pct"] = 100.0 * search / simulated;
  state.counters["overhead_pct"] = 100.0 * wall / simulated;
  state.counters["slowdown"] = slowdown;
}

void register_replays() {
  for (const char* name : {"resnet32", "transformer", "unet", "treelstm"}) {
    for (const char* policy : {"dtr", "dtr_eq", "msps"}) {
      for (Accounting acc : {Accounting::kLogical, Accounting::kAllocator}) {
        const std::string label = std::string("BM_Replay/") + name + "/" + policy + "/" +
                                  (acc == Accounting::kLogical ? "logical" : "allocator");
        benchmark::RegisterBenchmark(label.c_str(), BM_Replay, name, policy, acc)
            ->Unit(benchmark::kMillisecond);
      }
    }
  }
}

}  // namespace
}  // namespace remat

int main(int argc, char** argv) {
  remat::register_replays();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
