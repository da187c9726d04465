// Property tests: random programs of random ops (views, multi-output, in-place and random
// ops included) run on the CPU backend under random budgets must read back exactly the bytes
// of an unconstrained run, and reserved memory must never pass the budget.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "remat/runtime.h"
#include "tests/test_ops.h"

namespace remat {
namespace {

using testing::vec;

// A program is a list of steps drawn from a seed; it depends only on shapes, never on what
// the runtime does, so the same program runs under any budget.
struct Program {
  std::uint64_t seed;
  int steps;
};

struct Outcome {
  std::vector<std::vector<char>> reads;  // every read, in order
  RuntimeStats stats;
};

Outcome run(const Program& p, RuntimeOptions options) {
  Runtime rt(options);
  std::mt19937_64 rng(p.seed);
  const OpPtr ops[] = {testing::affine(0.75f, 0.25f), testing::affine(-1.5f, 2.0f),
                       testing::combine(), testing::scan_and_square(), testing::second_half(),
                       testing::concat(), testing::dropout(), testing::add_inplace()};
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
  out.stats = rt.stats();
  return out;
}

struct Config {
  std::string policy;
  Accounting accounting;
};

class PropertyTest : public ::testing::TestWithParam<Config> {};

TEST_P(PropertyTest, RandomBudgetsReadBackTheUnconstrainedBytes) {
  const Config c = GetParam();
  std::mt19937_64 rng(1234);
  int constrained_passes = 0, with_evictions = 0, failures = 0;
  for (int trial = 0; trial < 30; ++trial) {
    const Program p{rng(), 120 + static_cast<int>(rng() % 120)};
    RuntimeOptions o;
    o.backend = Backend::kCpu;
    o.accounting = c.accounting;
    o.policy = c.policy;
    o.seed = 99;
    o.allocator.small_segment = 16 << 10;
    o.allocator.medium_segment = 64 << 10;
    const Outcome base = run(p, o);
    const std::size_t peak = c.accounting == Accounting::kLogical ? base.stats.memory.peak_allocated
                                                                  : base.stats.memory.peak_reserved;
    for (int b = 0; b < 3; ++b) {
      const double fraction = std::uniform_real_distribution<double>(0.35, 1.0)(rng);
      o.budget = static_cast<std::size_t>(fraction * static_cast<double>(peak));
      Outcome got;
      try {
        got = run(p, o);
      } catch (const OutOfMemoryError& e) {
        ++failures;  // a budget below what the program can live in: allowed, and typed
        EXPECT_LE(e.info().reserved, o.budget);
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
  EXPECT_GE(constrained_passes, 45) << failures << " failures";
  EXPECT_GE(with_evictions, 30);
}

std::vector<Config> configs() {
  std::vector<Config> out;
  for (const std::string& p : eviction_policy_names()) {
    out.push_back({p, Accounting::kLogical});
    out.push_back({p, Accounting::kAllocator});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(AllPolicies, PropertyTest, ::testing::ValuesIn(configs()),
                         [](const ::testing::TestParamInfo<Config>& info) {
                           return info.param.policy + (info.param.accounting == Accounting::kLogical
                                                           ? "_logical"
                                                           : "_allocator");
                         });

}  // namespace
}  // namespace remat
