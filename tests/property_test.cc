// Property tests: random programs of random ops (views, multi-output, in-place and random
// ops included) run on the CPU backend under random budgets must read back exactly the bytes
// of an unconstrained run, and reserved memory must never pass the budget.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <sstream>

#include "remat/replay.h"
#include "remat/runtime.h"
#include "tests/support/oom_contract.h"
#include "tests/support/policy_configs.h"
#include "tests/support/random_order.h"
#include "tests/support/test_ops.h"

namespace remat {
namespace {

using testing::vec;

// A program is a list of steps drawn from a seed; it depends only on shapes, never on what
// the runtime does, so the same program runs under any budget.
struct Program {
  std::uint64_t seed;
  int steps;
  // Also moves tensors to the host tier and back at random (offload, copy_to_host, prefetch).
  bool offloads = false;
};

struct Outcome {
  std::vector<std::vector<char>> reads;  // every read, in order
  RuntimeStats stats;
  RecordedStep recorded;  // when the step options asked for it
};

Outcome run(const Program& p, RuntimeOptions options, StepOptions step = {}) {
  Runtime rt(options);
  rt.begin_step(step);
  std::mt19937_64 rng(p.seed);
  const OpPtr ops[] = {testing::affine(0.75f, 0.25f),
                       testing::affine(-1.5f, 2.0f),
                       testing::combine(),
                       testing::scan_and_square(),
                       testing::second_half(),
                       testing::concat(),
                       testing::dropout(),
                       testing::add_inplace()};
  std::vector<Tensor> pool;
  Outcome out;
  auto pick = [&]() -> Tensor& { return pool[rng() % pool.size()]; };
  auto read = [&](const Tensor& t) {
    std::vector<char> bytes(t.bytes());
    rt.read(t, bytes.data());
    out.reads.push_back(std::move(bytes));
  };
  for (int step = 0; step < p.steps; ++step) {
    const unsigned r = static_cast<unsigned>(rng() % 100);
    if (pool.size() < 2 || r < 6) {
      const std::int64_t n = 16 + static_cast<std::int64_t>(rng() % 1000);
      std::vector<float> data(static_cast<std::size_t>(n));
      for (float& f : data) f = static_cast<float>(rng() % 2000) / 1000.0f - 1.0f;
      pool.push_back(rt.constant(vec(n), data.data()));
    } else if (r < 14) {
      pool.erase(pool.begin() + static_cast<std::ptrdiff_t>(rng() % pool.size()));
    } else if (r < 20) {
      read(pick());
    } else if (p.offloads && r < 24) {
      rt.offload(pick());  // refused for what may not go, or does not fit
    } else if (p.offloads && r < 26) {
      rt.copy_to_host(pick());  // a copy begun early (Note [Copies beside the kernels])
    } else if (p.offloads && r < 28) {
      rt.prefetch(pick());  // refused for what is not on the host
    } else {
      const OpPtr& op = ops[rng() % std::size(ops)];
      Tensor& a = pick();
      // Binary ops need a partner of the same length: use a's own unary result otherwise.
      Tensor b = pick();
      if (b.shape() != a.shape()) b = a;
      if (op->name == "add_") {
        Tensor target = a;  // mutate a copy of the handle, so the pool keeps both versions
        Tensor* args[] = {&target, &b};
        const int mutated[] = {0};
        rt.call_inplace(op, args, mutated);
        pool.push_back(target);
      } else if (op->name == "combine") {
        pool.push_back(rt.call1(op, {a, b}));
      } else if (op->name == "concat") {
        if (a.shape()[0] + b.shape()[0] > 4000) continue;
        pool.push_back(rt.call1(op, {a, b}));
      } else {
        for (Tensor& t : rt.call(op, {a})) pool.push_back(std::move(t));
      }
    }
    if (pool.size() > 60) pool.erase(pool.begin());
  }
  for (const Tensor& t : pool) read(t);
  out.recorded = rt.end_step();
  out.stats = rt.stats();
  return out;
}

// Programs per test: `fallback`, or fewer where REMAT_PROPERTY_TRIALS says (the sanitizer
// builds run a few).
int trials(int fallback) {
  const char* env = std::getenv("REMAT_PROPERTY_TRIALS");
  return env != nullptr && std::atoi(env) > 0 ? std::min(fallback, std::atoi(env)) : fallback;
}

class PropertyTest : public ::testing::TestWithParam<testing::PolicyConfig> {};

TEST_P(PropertyTest, RandomBudgetsReadBackTheUnconstrainedBytes) {
  const testing::PolicyConfig c = GetParam();
  std::mt19937_64 rng(1234);
  int constrained_passes = 0, with_evictions = 0, failures = 0;
  const int n = trials(30);
  for (int trial = 0; trial < n; ++trial) {
    const Program p{rng(), 120 + static_cast<int>(rng() % 120)};
    RuntimeOptions o;
    o.backend = Backend::kCpu;
    o.accounting = c.accounting;
    o.policy = c.policy;
    o.seed = 99;
    o.allocator.small_segment = 16 << 10;
    o.allocator.medium_segment = 64 << 10;
    const Outcome base = run(p, o);
    const std::size_t peak = testing::peak_in(base.stats, c.accounting);
    for (int b = 0; b < 3; ++b) {
      const double fraction = std::uniform_real_distribution<double>(0.35, 1.0)(rng);
      o.budget = static_cast<std::size_t>(fraction * static_cast<double>(peak));
      Outcome got;
      try {
        got = run(p, o);
      } catch (const OutOfMemoryError& e) {
        ++failures;  // a budget below what the program can live in: allowed, and typed
        EXPECT_LE(e.info().reserved, o.budget);
        EXPECT_TRUE(testing::failed_for_want_of_bytes(e))
            << "trial " << trial << " at " << fraction;
        continue;
      } catch (const ThrashError&) {
        ++failures;
        continue;
      }
      ++constrained_passes;
      with_evictions += got.stats.evictions > 0;
      ASSERT_EQ(got.reads.size(), base.reads.size());
      for (std::size_t i = 0; i < base.reads.size(); ++i)
        ASSERT_EQ(got.reads[i], base.reads[i]) << "read " << i << " differs, trial " << trial;
      ASSERT_LE(got.stats.memory.peak_reserved, o.budget);
    }
  }
  // The property must have been exercised: most budgets pass, and they do evict.
  EXPECT_GE(constrained_passes, n * 3 / 2) << failures << " failures";
  EXPECT_GE(with_evictions, n);
}

// With constants moved to the host at random (Note [The host tier]) under random budgets
// and host capacities, every read is the bytes of the run that moved nothing, and reserved
// memory stays within the budget.
TEST(HostTierProperty, RandomOffloadsReadBackTheUnconstrainedBytes) {
  std::mt19937_64 rng(4321);
  int passes = 0, offloads = 0, restores = 0;
  const int n = trials(30);
  for (int trial = 0; trial < n; ++trial) {
    const Program p{rng(), 120 + static_cast<int>(rng() % 120), /*offloads=*/true};
    RuntimeOptions o;
    o.seed = 5;
    o.allocator.small_segment = 16 << 10;
    o.allocator.medium_segment = 64 << 10;
    const Outcome base = run(p, o);  // no host memory: every offload refused
    ASSERT_EQ(base.stats.offloads, 0u);
    for (int b = 0; b < 2; ++b) {
      const double fraction = std::uniform_real_distribution<double>(0.3, 1.0)(rng);
      o.budget = static_cast<std::size_t>(fraction * double(base.stats.memory.peak_reserved));
      o.host_memory_bytes = (std::size_t{1} << (8 + rng() % 12)) * (b == 0 ? 64 : 1);
      // A free link on the second budget: evictions go to the host while it has room
      // (Note [Keep, recompute or offload]).
      o.host_link = b == 0 ? HostLink{} : HostLink{1e9, 0.0};
      Outcome got;
      try {
        got = run(p, o);
      } catch (const OutOfMemoryError& e) {
        EXPECT_LE(e.info().reserved, o.budget);
        continue;
      } catch (const ThrashError&) {
        continue;
      }
      ++passes;
      offloads += static_cast<int>(got.stats.offloads);
      restores += static_cast<int>(got.stats.restores);
      ASSERT_EQ(got.reads.size(), base.reads.size());
      for (std::size_t i = 0; i < base.reads.size(); ++i)
        ASSERT_EQ(got.reads[i], base.reads[i]) << "read " << i << " differs, trial " << trial;
      ASSERT_LE(got.stats.memory.peak_reserved, o.budget);
      ASSERT_LE(got.stats.peak_offloaded_bytes, o.host_memory_bytes);
    }
  }
  EXPECT_GE(passes, n);
  EXPECT_GT(offloads, n);
  EXPECT_GT(restores, n / 2);
}

INSTANTIATE_TEST_SUITE_P(AllPolicies, PropertyTest,
                         ::testing::ValuesIn(testing::all_policy_configs()),
                         testing::policy_config_name);

// A recorded step, written in the DTR log format and parsed back, replays to the very peak
// the live run had (logical accounting), and its graph is well formed: topological, every
// op output a node at its site, views and groups kept.
TEST(RecordingProperty, RecordedTracesReplayToTheLivePeak) {
  std::mt19937_64 rng(77);
  for (int trial = 0; trial < trials(20); ++trial) {
    const Program p{rng(), 80 + static_cast<int>(rng() % 120)};
    RuntimeOptions o;
    o.backend = Backend::kCpu;
    o.accounting = Accounting::kLogical;
    StepOptions step;
    step.record = true;
    const Outcome live = run(p, o, step);
    const Graph& g = live.recorded.graph;
    ASSERT_GT(g.size(), 0);
    int views = 0, grouped = 0;
    for (int v = 0; v < g.size(); ++v) {
      const Node& n = g.nodes[static_cast<std::size_t>(v)];
      ASSERT_EQ(n.id, v);
      for (int u : n.inputs) ASSERT_LT(u, v);
      if (n.kind == NodeKind::kInput) continue;
      ASSERT_GE(n.site_position, 0);
      views += n.kind == NodeKind::kView;
      grouped += n.group.has_value();
    }
    EXPECT_EQ(live.recorded.signature.ops, live.stats.calls);
    std::stringstream text;
    ASSERT_TRUE(write_dtr_trace(live.recorded.trace, text).ok());
    absl::StatusOr<DtrTrace> back = parse_dtr_trace(text, "recorded");
    ASSERT_TRUE(back.ok()) << back.status();
    ASSERT_EQ(back->instructions.size(), live.recorded.trace.instructions.size());
    EXPECT_EQ(replay_baseline(*back).logical_peak_bytes, live.stats.memory.peak_allocated)
        << "trial " << trial << " (" << views << " views, " << grouped << " grouped outputs)";
  }
}

// Runs the program under a budget it may not fit: nothing when the run raised the typed
// out-of-memory or thrashing error (allowed for a budget below what the program needs).
std::optional<Outcome> run_if_it_fits(const Program& p, const RuntimeOptions& options,
                                      const StepOptions& step) {
  try {
    return run(p, options, step);
  } catch (const OutOfMemoryError&) {
    return std::nullopt;
  } catch (const ThrashError&) {
    return std::nullopt;
  }
}

// The CPU backend with small allocator segments, so that budgets well below a small
// program's peak still leave room for several.
RuntimeOptions small_segments_on_cpu(std::uint64_t seed) {
  RuntimeOptions o;
  o.backend = Backend::kCpu;
  o.seed = seed;
  o.allocator.small_segment = 16 << 10;
  o.allocator.medium_segment = 64 << 10;
  return o;
}

// Hints are advice: random keep/recompute marks and random early evictions, under random
// budgets, never change a byte that is read, and reserved memory never passes the budget.
TEST(RecordingProperty, RandomHintsNeverChangeResults) {
  std::mt19937_64 rng(4242);
  int passes = 0, hint_evictions = 0;
  for (int trial = 0; trial < trials(20); ++trial) {
    const Program p{rng(), 120 + static_cast<int>(rng() % 120)};
    RuntimeOptions o = small_segments_on_cpu(5);
    StepOptions record;
    record.record = true;
    const Outcome base = run(p, o, record);
    auto hints = std::make_shared<StepHints>();
    for (const Node& n : base.recorded.graph.nodes) {
      if (n.site_position < 0) continue;
      if (hints->ops.size() <= static_cast<std::size_t>(n.site_position))
        hints->ops.resize(static_cast<std::size_t>(n.site_position) + 1);
      OpHint& h = hints->ops[static_cast<std::size_t>(n.site_position)];
      h.op = n.op;
      if (h.outputs.size() <= static_cast<std::size_t>(n.site_output))
        h.outputs.resize(static_cast<std::size_t>(n.site_output) + 1);
      h.outputs[static_cast<std::size_t>(n.site_output)] = {rng() % 2 == 0, rng() % 3 == 0};
    }
    for (std::size_t q = 0; q < hints->ops.size(); ++q)
      for (int k = 0; k < 2; ++k)
        hints->ops[q + rng() % (hints->ops.size() - q)].evict_after.push_back(
            {static_cast<int>(q), static_cast<int>(rng() % 2)});
    o.policy = "hinted";
    StepOptions hinted;
    hinted.hints = hints;
    for (int b = 0; b < 2; ++b) {
      o.budget = static_cast<std::size_t>(std::uniform_real_distribution<double>(0.4, 1.0)(rng) *
                                          static_cast<double>(base.stats.memory.peak_reserved));
      const std::optional<Outcome> ran = run_if_it_fits(p, o, hinted);
      if (!ran) continue;
      const Outcome& got = *ran;
      ++passes;
      hint_evictions += static_cast<int>(got.stats.hint_evictions);
      EXPECT_EQ(got.stats.hint_mismatches, 0u);
      ASSERT_EQ(got.reads, base.reads) << "trial " << trial;
      ASSERT_LE(got.stats.memory.peak_reserved, o.budget);
    }
  }
  EXPECT_GE(passes, trials(20));
  EXPECT_GT(hint_evictions, 0);
}

// Note [Following a schedule]: a random plan (a random order of the recorded step's nodes,
// so later ops often come first and earlier ones wait deferred, with random recomputations
// and random frees) followed under random budgets never changes a byte that is read, and
// reserved memory never passes the budget.
TEST(RecordingProperty, RandomSchedulesFollowedNeverChangeResults) {
  std::mt19937_64 rng(9090);
  int passes = 0;
  std::size_t deferred = 0, recomputed = 0;
  for (int trial = 0; trial < trials(20); ++trial) {
    const Program p{rng(), 100 + static_cast<int>(rng() % 140)};
    RuntimeOptions o = small_segments_on_cpu(3);
    StepOptions record;
    record.record = true;
    const Outcome base = run(p, o, record);
    const Graph& g = base.recorded.graph;
    auto hints = std::make_shared<StepHints>();
    const std::vector<int> order = testing::random_topological_order(g, rng);
    ASSERT_EQ(order.size(), g.nodes.size());
    std::vector<int> placed;
    for (int v : order) {
      const Node& n = g.nodes[static_cast<std::size_t>(v)];
      if (n.site_position < 0) continue;
      if (hints->ops.size() <= static_cast<std::size_t>(n.site_position))
        hints->ops.resize(static_cast<std::size_t>(n.site_position) + 1);
      hints->ops[static_cast<std::size_t>(n.site_position)].op = n.op;
      hints->schedule.push_back({{n.site_position, n.site_output}, {}, {}});
      placed.push_back(v);
      if (rng() % 4 == 0) {  // recompute something placed before
        const Node& again = g.nodes[static_cast<std::size_t>(placed[rng() % placed.size()])];
        hints->schedule.push_back({{again.site_position, again.site_output}, {}, {}});
      }
      if (rng() % 3 == 0) {  // and free something
        const Node& gone = g.nodes[static_cast<std::size_t>(placed[rng() % placed.size()])];
        hints->schedule.back().free_after.push_back({gone.site_position, gone.site_output});
      }
    }
    o.policy = "hinted";
    StepOptions hinted;
    hinted.hints = hints;
    for (int b = 0; b < 3; ++b) {
      o.budget =
          b == 0 ? SIZE_MAX
                 : static_cast<std::size_t>(std::uniform_real_distribution<double>(0.4, 1.0)(rng) *
                                            static_cast<double>(base.stats.memory.peak_reserved));
      const std::optional<Outcome> ran = run_if_it_fits(p, o, hinted);
      if (!ran) continue;
      const Outcome& got = *ran;
      ++passes;
      deferred += got.stats.deferred_ops;
      recomputed += got.stats.recomputations;
      EXPECT_EQ(got.stats.hint_mismatches, 0u);
      EXPECT_EQ(got.stats.calls, base.stats.calls) << "every op runs once, deferred or not";
      ASSERT_EQ(got.reads, base.reads) << "trial " << trial << " budget " << o.budget;
      ASSERT_LE(got.stats.memory.peak_reserved, o.budget);
    }
  }
  EXPECT_GE(passes, trials(20) * 3 / 2);
  EXPECT_GT(deferred, 0u) << "no plan made the runtime defer an op";
  EXPECT_GT(recomputed, 0u);
}

}  // namespace
}  // namespace remat
