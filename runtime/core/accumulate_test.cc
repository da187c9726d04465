// Runtime::call_accumulate (Note [Accumulating into constants] in update.cc): a kernel that
// makes a new output and adds into constants in place, as an existing loop's backward
// kernels do, recomputed without adding twice.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "remat/errors.h"
#include "remat/runtime.h"
#include "tests/support/test_ops.h"

namespace remat {
namespace {

using testing::read;
using testing::vec;

// Inputs dy, x, w, dw (all of one size): writes dx = dy * w + x (a new output) and adds
// dy * x into dw (the constant it accumulates into, its second output).
OpPtr linear_backward() {
  return make_op(
      "linear_backward", [](SpecList in) { return Outputs{{in[0]}}; },
      [](const KernelContext& k) {
        const float* dy = k.input<float>(0);
        const float* x = k.input<float>(1);
        const float* w = k.input<float>(2);
        float* dx = k.output<float>(0);
        float* dw = k.output<float>(1);
        for (std::int64_t i = 0; i < k.input_spec(0).numel(); ++i) {
          dx[i] = dy[i] * w[i] + x[i];
          dw[i] += dy[i] * x[i];
        }
      },
      testing::numel_cost);
}

struct Trained {
  std::vector<std::vector<float>> dws;
  std::vector<float> dx;
  RuntimeStats stats;
};

// `layers` of h = tanh-free affine maps forward, then the backward chain through
// linear_backward, accumulating each layer's dw twice (two micro-batches).
Trained train(const RuntimeOptions& options, int layers, std::int64_t n, std::uint32_t seed) {
  Runtime rt(options);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<Tensor> ws, dws;
  const std::vector<float> zeros(static_cast<std::size_t>(n), 0.0f);
  for (int l = 0; l < layers; ++l) {
    std::vector<float> w(static_cast<std::size_t>(n));
    for (float& v : w) v = u(rng);
    ws.push_back(rt.constant(vec(n), w.data()));
    dws.push_back(rt.constant(vec(n), zeros.data()));
  }
  Trained t;
  for (int micro = 0; micro < 2; ++micro) {
    std::vector<float> x0(static_cast<std::size_t>(n));
    for (float& v : x0) v = u(rng);
    std::vector<Tensor> hs{rt.constant(vec(n), x0.data())};
    for (int l = 0; l < layers; ++l)
      hs.push_back(rt.call1(testing::affine(0.5f, 0.25f * static_cast<float>(l)), {hs.back()}));
    std::vector<Tensor> gs{rt.call1(testing::affine(1.0f, 0.0f), {hs.back()})};
    const int acc[] = {3};
    for (int l = layers - 1; l >= 0; --l) {
      const Tensor args[] = {gs.back(), hs[static_cast<std::size_t>(l)],
                             ws[static_cast<std::size_t>(l)], dws[static_cast<std::size_t>(l)]};
      gs.push_back(rt.call_accumulate(linear_backward(), args, acc).at(0));
    }
    // Read back every gradient, the early ones last: under a budget they were evicted, and
    // reading them recomputes the accumulating ops.
    t.dx.clear();
    for (const Tensor& g : gs) {
      const std::vector<float> v = read(rt, g);
      t.dx.insert(t.dx.end(), v.begin(), v.end());
    }
  }
  for (const Tensor& dw : dws) t.dws.push_back(read(rt, dw));
  t.stats = rt.stats();
  return t;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Random depths, sizes, budgets, policies and accountings: every run that fits accumulates the
// same bits as the unconstrained run, however much it recomputed.
TEST(AccumulateTest, RandomProgramsAtRandomBudgetsAccumulateOnce) {
  std::mt19937 rng(17);
  int recomputing = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const int layers = 2 + static_cast<int>(rng() % 14);
    const std::int64_t n = 64 << (rng() % 4);
    const std::uint32_t seed = static_cast<std::uint32_t>(rng());
    RuntimeOptions o = testing::logical(SIZE_MAX);
    if (trial % 4 >= 2) o.accounting = Accounting::kAllocator;  // budgets on reserved bytes
    const Trained base = train(o, layers, n, seed);
    const std::size_t peak = o.accounting == Accounting::kAllocator
                                 ? base.stats.memory.peak_reserved
                                 : base.stats.memory.peak_allocated;
    o.budget = static_cast<std::size_t>(static_cast<double>(peak) *
                                        std::uniform_real_distribution<double>(0.3, 1.0)(rng));
    o.policy = trial % 2 == 0 ? "dtr" : "lru";
    Trained run;
    try {
      run = train(o, layers, n, seed);
    } catch (const OutOfMemoryError&) {
      continue;
    }
    SCOPED_TRACE(::testing::Message()
                 << "layers " << layers << " n " << n << " budget " << o.budget);
    ASSERT_EQ(run.dws.size(), base.dws.size());
    for (std::size_t l = 0; l < run.dws.size(); ++l)
      EXPECT_TRUE(same_bits(run.dws[l], base.dws[l])) << "dw of layer " << l;
    EXPECT_TRUE(same_bits(run.dx, base.dx));
    EXPECT_EQ(run.stats.updates, base.stats.updates);
    if (run.stats.recomputations > 0) ++recomputing;
  }
  EXPECT_GT(recomputing, 5) << "too few runs recomputed anything";
}

// Recomputing the new output after an eviction writes its accumulation to scratch: the
// constant keeps the bits of the one accumulation.
TEST(AccumulateTest, RecomputingTheOutputDoesNotAddAgain) {
  Runtime rt;
  const std::vector<float> ones(32, 1.0f), twos(32, 2.0f), zeros(32, 0.0f);
  Tensor x = rt.constant(vec(32), twos.data());
  Tensor w = rt.constant(vec(32), ones.data());
  Tensor dw = rt.constant(vec(32), zeros.data());
  Tensor dy = rt.call1(testing::affine(1.0f, 1.0f), {x});  // 3s
  const int acc[] = {3};
  const Tensor args[] = {dy, x, w, dw};
  Tensor dx = rt.call_accumulate(linear_backward(), args, acc).at(0);
  EXPECT_EQ(read(rt, dw), std::vector<float>(32, 6.0f));
  ASSERT_TRUE(rt.evict(dx));
  ASSERT_TRUE(rt.evict(dy));
  EXPECT_EQ(read(rt, dx), std::vector<float>(32, 5.0f));
  EXPECT_EQ(rt.stats().recomputations, 2u);
  EXPECT_EQ(read(rt, dw), std::vector<float>(32, 6.0f)) << "added twice";
  EXPECT_EQ(rt.stats().updates, 1u);
}

// A held tensor computed from the constant before the accumulation keeps the old bits
// (Note [Updating pinned tensors]), and a target that is not a constant is refused.
TEST(AccumulateTest, FreezesWhatReadTheOldValueAndRefusesNonConstants) {
  Runtime rt(testing::logical(SIZE_MAX));
  const std::vector<float> ones(8, 1.0f);
  Tensor dw = rt.constant(vec(8), ones.data());
  Tensor seen = rt.call1(testing::affine(3.0f, 0.0f), {dw});  // 3s, from the old dw
  Tensor x = rt.constant(vec(8), ones.data());
  const int acc[] = {3};
  const Tensor args[] = {x, x, x, dw};
  rt.call_accumulate(linear_backward(), args, acc);
  EXPECT_FALSE(rt.evict(seen)) << "frozen";
  EXPECT_EQ(read(rt, seen), std::vector<float>(8, 3.0f));
  EXPECT_EQ(read(rt, dw), std::vector<float>(8, 2.0f));
  Tensor not_constant = rt.call1(testing::affine(1.0f, 0.0f), {x});
  const Tensor bad[] = {x, x, x, not_constant};
  EXPECT_THROW(rt.call_accumulate(linear_backward(), bad, acc), std::invalid_argument);
  const int out_of_range[] = {7};
  EXPECT_THROW(rt.call_accumulate(linear_backward(), args, out_of_range), std::invalid_argument);
  // An output that copies what the op accumulates into would change with the accumulation.
  const OpPtr copies_target = make_op(
      "copies_target",
      [](SpecList in) {
        OutputSpec o(in[3]);
        o.copy_of = 3;
        return Outputs{o};
      },
      [](const KernelContext&) {}, testing::numel_cost);
  EXPECT_THROW(rt.call_accumulate(copies_target, args, acc), std::invalid_argument);
  EXPECT_EQ(read(rt, dw), std::vector<float>(8, 2.0f)) << "a rejected call changes nothing";
}

// A second accumulation into the same constant does not freeze the first one's output: by
// the contract it never read what the constant held.
TEST(AccumulateTest, AnotherAccumulationDoesNotFreezeTheFirstOnesOutput) {
  Runtime rt(testing::logical(SIZE_MAX));
  const std::vector<float> ones(8, 1.0f), zeros(8, 0.0f);
  Tensor x = rt.constant(vec(8), ones.data());
  Tensor dw = rt.constant(vec(8), zeros.data());
  const int acc[] = {3};
  const Tensor args[] = {x, x, x, dw};
  Tensor first = rt.call_accumulate(linear_backward(), args, acc).at(0);
  Tensor second = rt.call_accumulate(linear_backward(), args, acc).at(0);
  EXPECT_EQ(rt.stats().frozen, 0u);
  EXPECT_TRUE(rt.evict(first));
  EXPECT_EQ(read(rt, first), std::vector<float>(8, 2.0f));
  EXPECT_EQ(read(rt, dw), std::vector<float>(8, 2.0f));
  EXPECT_EQ(rt.stats().updates, 2u);
}

}  // namespace
}  // namespace remat
