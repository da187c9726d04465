#include "remat/runtime.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "tests/support/test_ops.h"

namespace remat {
namespace {

using testing::add_into_first;
using testing::iota;
using testing::logical;
using testing::read;
using testing::vec;

TEST(RuntimeTest, RunsOpsAndReadsResults) {
  Runtime rt;
  auto x = rt.constant(vec(4), iota(4).data());
  auto y = rt.call1(testing::affine(2, 1), {x});
  EXPECT_EQ(read(rt, y), (std::vector<float>{3, 5, 7, 9}));
  EXPECT_EQ(y.shape(), (std::vector<std::int64_t>{4}));
  EXPECT_EQ(rt.stats().calls, 1u);
}

TEST(RuntimeTest, EvictedTensorIsRecomputedBitwise) {
  Runtime rt(logical(SIZE_MAX));
  auto x = rt.constant(vec(64), iota(64).data());
  auto y = rt.call1(testing::affine(0.3f, 0.7f), {x});
  const auto before = read(rt, y);
  ASSERT_TRUE(rt.evict(y));
  EXPECT_FALSE(y.resident());
  EXPECT_EQ(read(rt, y), before);
  EXPECT_EQ(rt.stats().recomputations, 1u);
  EXPECT_FALSE(rt.evict(x)) << "constants are pinned";
}

// Note [Lingering storages]: dead tensors recomputed for a recomputation stay, as a free
// cache, until memory is needed or the step ends.
TEST(RuntimeTest, DeadTensorsRecomputedForARecomputationLingerUntilMemoryIsNeeded) {
  Runtime rt(logical(SIZE_MAX));
  rt.begin_step({});
  auto x = rt.constant(vec(100), iota(100).data());  // 400 bytes each
  auto a = rt.call1(testing::affine(2, 0), {x});
  auto b = rt.call1(testing::affine(3, 1), {a});
  auto c = rt.call1(testing::affine(1, 2), {b});
  auto d = rt.call1(testing::affine(5, 0), {b});
  const auto c_before = read(rt, c), d_before = read(rt, d);
  a.reset();
  b.reset();  // dead: freed at once, kept as lineage of c and d
  EXPECT_EQ(rt.stats().resident_bytes, 1200u);
  ASSERT_TRUE(rt.evict(c));
  ASSERT_TRUE(rt.evict(d));
  EXPECT_EQ(read(rt, c), c_before);  // recomputes a, b, then c
  EXPECT_EQ(rt.stats().recomputations, 3u);
  EXPECT_EQ(rt.stats().resident_bytes, 1600u) << "a and b linger";
  EXPECT_EQ(read(rt, d), d_before);  // b is still there: only d is recomputed
  EXPECT_EQ(rt.stats().recomputations, 4u);
  // Memory pressure takes the lingering storages first, and they are not evictions.
  const std::size_t evictions = rt.stats().evictions;
  rt.set_budget(1200);
  EXPECT_EQ(rt.stats().resident_bytes, 1200u);
  EXPECT_EQ(rt.stats().evictions, evictions);
  EXPECT_TRUE(c.resident());
  EXPECT_TRUE(d.resident());
  // The end of the step frees what still lingers.
  rt.set_budget(SIZE_MAX);
  ASSERT_TRUE(rt.evict(d));
  EXPECT_EQ(read(rt, d), d_before);  // recomputes a, b, d
  EXPECT_EQ(rt.stats().resident_bytes, 2000u);
  rt.end_step();
  EXPECT_EQ(rt.stats().resident_bytes, 1200u);
  EXPECT_EQ(read(rt, c), c_before);
  // A recomputation between steps (an optimizer reading an evicted gradient) lingers too,
  // until the next step begins.
  ASSERT_TRUE(rt.evict(d));
  EXPECT_EQ(read(rt, d), d_before);
  EXPECT_EQ(rt.stats().resident_bytes, 2000u);
  rt.begin_step({});
  EXPECT_EQ(rt.stats().resident_bytes, 1200u);
  rt.end_step();
}

// Note [Placed allocations] in step_placement.cc: a constant is not part of a step's recorded
// requests, whether made before the step or during it; an op's output is.
TEST(RuntimeTest, ARecordedStepsRequestsLeaveOutItsConstants) {
  RuntimeOptions o = logical(SIZE_MAX);
  o.accounting = Accounting::kAllocator;
  Runtime rt(o);
  auto x = rt.constant(vec(1024), iota(1024).data());
  StepOptions step;
  step.record_allocations = true;
  rt.begin_step(step);
  auto y = rt.call1(testing::affine(2, 1), {x});
  auto z = rt.constant(vec(2048), iota(2048).data());
  auto w = rt.call1(testing::affine(3, 0), {z});
  rt.end_step();
  const AllocationSequence seq = rt.take_allocation_sequence();
  ASSERT_EQ(seq.allocations.size(), 2u);
  EXPECT_EQ(seq.allocations[0].bytes, 4096u);
  EXPECT_EQ(seq.allocations[1].bytes, 8192u);
}

// An input's last use is when its op reads it, at the op's start. a (cost 100) is read when
// b (cost 50) starts, so at the end a has been idle for b's whole run: a's score is
// 100 / (50 + 1), b's 50 / 1, and a goes. Stamped at b's end instead, a would look as fresh as
// b, and b, the cheaper, would go.
TEST(RuntimeTest, AnOpsInputsAreStampedWhenItStarts) {
  Runtime rt(logical(SIZE_MAX, "dtr"));
  auto x = rt.constant(vec(100), iota(100).data());
  const Outputs out{OutputSpec{vec(100)}};
  auto a = rt.call_with(testing::affine(2, 0), std::vector<Tensor>{x}, out, 100).at(0);
  auto b = rt.call_with(testing::affine(3, 0), std::vector<Tensor>{a}, out, 50).at(0);
  rt.set_budget(rt.stats().resident_bytes - 400);  // a or b must go
  EXPECT_FALSE(a.resident());
  EXPECT_TRUE(b.resident());
}

TEST(RuntimeTest, EvictingABaseEvictsItsViews) {
  Runtime rt(logical(SIZE_MAX));
  auto x = rt.constant(vec(8), iota(8).data());
  auto y = rt.call1(testing::affine(1, 1), {x});
  auto v = rt.call1(testing::second_half(), {y});
  EXPECT_EQ(read(rt, v), (std::vector<float>{6, 7, 8, 9}));
  EXPECT_EQ(rt.stats().resident_bytes, 64u) << "a view takes no memory of its own";
  ASSERT_TRUE(rt.evict(y));
  EXPECT_FALSE(v.resident());
  EXPECT_EQ(read(rt, v), (std::vector<float>{6, 7, 8, 9}));
  EXPECT_TRUE(y.resident());
}

TEST(RuntimeTest, RecomputingOneOutputMakesAll) {
  Runtime rt(logical(SIZE_MAX));
  auto x = rt.constant(vec(5), iota(5).data());
  auto outs = rt.call(testing::scan_and_square(), {x});
  const auto s = read(rt, outs[0]), q = read(rt, outs[1]);
  rt.evict(outs[0]);
  rt.evict(outs[1]);
  EXPECT_EQ(read(rt, outs[1]), q);
  EXPECT_TRUE(outs[0].resident());
  EXPECT_EQ(read(rt, outs[0]), s);
  EXPECT_EQ(rt.stats().recomputations, 1u);
}

TEST(RuntimeTest, InPlaceOpIsCopyOnWrite) {
  Runtime rt(logical(SIZE_MAX));
  auto x = rt.constant(vec(3), iota(3).data());
  auto a = rt.call1(testing::affine(1, 0), {x});
  Tensor alias = a;  // another handle to the old version
  Tensor* args[] = {&a, &x};
  const int mutated[] = {0};
  rt.call_inplace(testing::add_inplace(), args, mutated);
  EXPECT_EQ(read(rt, a), (std::vector<float>{2, 4, 6}));
  EXPECT_EQ(read(rt, alias), (std::vector<float>{1, 2, 3}));
  rt.evict(a);
  rt.evict(alias);
  EXPECT_EQ(read(rt, a), (std::vector<float>{2, 4, 6}));
}

// An op that adds 1 to its output in place, reading nothing else: what call_inplace's
// copy-on-write must hand it is the old version.
OpPtr increment_in_place() {
  return make_op(
      "increment_", [](SpecList in) { return Outputs{{in[0]}}; },
      [](const KernelContext& k) {
        float* y = k.output<float>(0);
        for (std::int64_t i = 0; i < k.output_spec(0).numel(); ++i) y[i] += 1.0f;
      },
      testing::numel_cost);
}

// The block a freed tensor of 7s leaves is reused for the new version of x (2s): it starts
// as a copy of x, on the first run and when recomputed after an eviction.
TEST(RuntimeTest, CallInplaceStartsTheNewVersionFromTheOldOne) {
  for (const Accounting accounting : {Accounting::kAllocator, Accounting::kLogical}) {
    RuntimeOptions o;
    o.accounting = accounting;
    Runtime rt(o);
    const std::vector<float> sevens(256, 7.0f), twos(256, 2.0f);
    auto src = rt.constant(vec(256), sevens.data());
    Tensor junk = rt.call1(testing::affine(1, 0), {src});
    junk.reset();  // its block, full of 7s, is free
    auto base = rt.constant(vec(256), twos.data());
    Tensor x = rt.call1(testing::affine(1, 0), {base});
    Tensor* args[] = {&x};
    const int mutated[] = {0};
    rt.call_inplace(increment_in_place(), args, mutated);
    EXPECT_EQ(read(rt, x), std::vector<float>(256, 3.0f));
    ASSERT_TRUE(rt.evict(x));
    EXPECT_EQ(read(rt, x), std::vector<float>(256, 3.0f)) << "recomputed from a copy again";
  }
}

// Note [Outputs start uninitialised]: an op that accumulates into an output it never zeroed
// reads whatever the block held; poisoned, that is NaN at once.
TEST(RuntimeTest, PoisonedOutputsExposeAKernelThatReadsWhatItDidNotWrite) {
  auto accumulate = make_op(
      "accumulate", [](SpecList in) { return Outputs{{in[0]}}; },
      [](const KernelContext& k) {
        const float* x = k.input<float>(0);
        float* y = k.output<float>(0);
        for (std::int64_t i = 0; i < k.output_spec(0).numel(); ++i) y[i] += x[i];  // no zeroing
      },
      testing::numel_cost);
  RuntimeOptions o;
  o.poison_outputs = true;
  Runtime rt(o);
  auto x = rt.constant(vec(16), iota(16).data());
  for (float v : read(rt, rt.call1(accumulate, {x}))) EXPECT_TRUE(std::isnan(v));
  for (float v : read(rt, rt.call1(testing::affine(2, 0), {x}))) EXPECT_FALSE(std::isnan(v));
}

// A C kernel takes its inputs as non-const pointers (KernelContext::c_input); one that writes
// through them is caught by check_inputs, naming the op; updates, which write their
// constants, are not flagged.
TEST(RuntimeTest, CheckInputsCatchesAKernelThatWritesItsInput) {
  auto scribble = make_op(
      "scribble", [](SpecList in) { return Outputs{{in[0]}}; },
      [](const KernelContext& k) {
        float* x = k.c_input<float>(0);
        float* y = k.output<float>(0);
        for (std::int64_t i = 0; i < k.output_spec(0).numel(); ++i) y[i] = x[i]++;
      },
      testing::numel_cost);
  RuntimeOptions o;
  o.check_inputs = true;
  Runtime rt(o);
  auto x = rt.constant(vec(16), iota(16).data());
  try {
    rt.call1(scribble, {x});
    FAIL() << "expected std::logic_error";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("op 'scribble' wrote into its input 0"), std::string::npos)
        << e.what();
  }
  auto w = rt.constant(vec(16), iota(16).data());
  rt.update(testing::add_into_first(), {w, x}, {0});  // writes w, its output: not an input write
  EXPECT_EQ(read(rt, rt.call1(testing::affine(1, 0), {w}))[0], 1.0f + read(rt, x)[0]);
  Runtime unchecked;
  auto z = unchecked.constant(vec(16), iota(16).data());
  EXPECT_NO_THROW(unchecked.call1(scribble, {z}));
}

TEST(RuntimeTest, ACopyOfAnInputOfAnotherSizeIsRejected) {
  Runtime rt;
  auto x = rt.constant(vec(4), iota(4).data());
  OutputSpec wrong(vec(8));
  wrong.copy_of = 0;
  EXPECT_THROW(rt.call_with(testing::affine(1, 0), std::vector<Tensor>{x}, {wrong}, 1.0),
               std::invalid_argument);
  OutputSpec missing(vec(4));
  missing.copy_of = 3;
  EXPECT_THROW(rt.call_with(testing::affine(1, 0), std::vector<Tensor>{x}, {missing}, 1.0),
               std::invalid_argument);
}

TEST(RuntimeTest, RandomOpRecomputesTheSameMask) {
  Runtime rt(logical(SIZE_MAX));
  auto x = rt.constant(vec(256), iota(256).data());
  auto d1 = rt.call1(testing::dropout(), {x});
  auto d2 = rt.call1(testing::dropout(), {x});
  const auto m1 = read(rt, d1), m2 = read(rt, d2);
  EXPECT_NE(m1, m2) << "two calls draw different masks";
  rt.evict(d1);
  EXPECT_EQ(read(rt, d1), m1);
}

TEST(RuntimeTest, DroppingTheLastHandleFreesMemoryAtOnce) {
  Runtime rt(logical(SIZE_MAX));
  auto x = rt.constant(vec(16), iota(16).data());
  auto y = rt.call1(testing::affine(1, 1), {x});
  auto z = rt.call1(testing::affine(1, 1), {y});
  EXPECT_EQ(rt.stats().memory.allocated, 3 * 64u);
  y.reset();
  EXPECT_EQ(rt.stats().memory.allocated, 2 * 64u);
  // y's lineage stays: z can still be recomputed through it.
  rt.evict(z);
  EXPECT_EQ(read(rt, z), read(rt, rt.call1(testing::affine(1, 2), {x})));
  z.reset();
  EXPECT_LE(rt.stats().live_tensors, 2u);
}

TEST(RuntimeTest, HundredThousandOpChainNeitherRecursesNorLeaks) {
  constexpr int kChain = 100000;
  Runtime rt(logical(SIZE_MAX));
  auto x = rt.constant(vec(1), iota(1).data());
  std::vector<Tensor> chain;
  chain.reserve(kChain);
  Tensor t = x;
  const OpPtr step = testing::affine(1, 1);
  for (int i = 0; i < kChain; ++i) {
    t = rt.call1(step, {t});
    chain.push_back(t);
  }
  for (Tensor& c : chain) rt.evict(c);
  std::vector<Tensor>().swap(chain);  // only t holds the chain now, through its lineage
  EXPECT_EQ(read(rt, t)[0], static_cast<float>(kChain + 1));
  EXPECT_EQ(rt.stats().recomputations, static_cast<std::size_t>(kChain));
  t.reset();  // frees the whole lineage on a worklist
  EXPECT_EQ(rt.stats().live_tensors, 1u);
}

TEST(RuntimeTest, InfeasibleBudgetRaisesOutOfMemoryAndRuntimeStaysUsable) {
  Runtime rt(logical(1000));
  auto x = rt.constant(vec(100), iota(100).data());  // 400 bytes, pinned
  auto y = rt.call1(testing::affine(2, 0), {x});     // 400 more: fits
  try {
    rt.call1(testing::concat(), {x, y});  // needs 800 bytes with x and y locked
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    EXPECT_EQ(e.info().op, "concat");
    EXPECT_EQ(e.budget(), 1000u);
    EXPECT_EQ(e.info().pinned, 400u);
    // y was locked as concat's input when nothing could be evicted; x counts as pinned only.
    EXPECT_EQ(e.info().locked, 400u);
    EXPECT_NE(std::string(e.what()).find("concat"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("locked by running ops 400"), std::string::npos);
  }
  EXPECT_EQ(rt.stats().ooms, 1u);
  // Still usable: what existed is intact, and a bigger budget lets the op through.
  EXPECT_EQ(read(rt, y)[99], 200.0f);
  rt.set_budget(4000);
  auto z = rt.call1(testing::concat(), {x, y});
  EXPECT_EQ(read(rt, z)[100], 2.0f);
}

// An op asking for `scratch_floats` of scratch memory: y = x + (the scratch's sum, 0).
OpPtr with_scratch(std::size_t scratch_floats) {
  return make_op(
      "with_scratch", [](SpecList in) { return Outputs{{in[0]}}; },
      [scratch_floats](const KernelContext& k) {
        auto* tmp = static_cast<float*>(k.scratch(scratch_floats * sizeof(float)));
        if (tmp == nullptr) throw std::logic_error("no scratch offered");
        std::fill(tmp, tmp + scratch_floats, 0.0f);
        for (std::int64_t i = 0; i < k.input_spec(0).numel(); ++i)
          k.output<float>(0)[i] = k.input<float>(0)[i] + tmp[i % scratch_floats];
      },
      testing::numel_cost);
}

// Runtime::held_tensors: what the program keeps, by producer, each storage counted once.
TEST(RuntimeTest, HeldTensorsGroupWhatTheProgramKeepsByTheOpThatMadeIt) {
  Runtime rt(logical(SIZE_MAX));
  auto x = rt.constant(vec(100), iota(100).data());  // 400 bytes
  std::vector<Tensor> ys;
  for (int i = 0; i < 3; ++i) ys.push_back(rt.call1(testing::affine(2, 0), {x}));
  Tensor again = ys[0];  // a second handle: the same storage, counted once
  auto z = rt.call1(testing::concat(), {x, ys[1]});  // 800 bytes
  ASSERT_TRUE(rt.evict(ys[2]));
  std::vector<HeldTensors> held = rt.held_tensors();
  ASSERT_EQ(held.size(), 3u);
  EXPECT_EQ(held[0].op, "affine");
  EXPECT_EQ(held[0].tensors, 3u);
  EXPECT_EQ(held[0].bytes, 1200u);
  EXPECT_EQ(held[0].resident_bytes, 800u) << "one was evicted";
  EXPECT_EQ(held[1].op, "concat");
  EXPECT_EQ(held[1].resident_bytes, 800u);
  EXPECT_EQ(held[2].op, "constant");
  z.reset();
  ys.clear();
  again.reset();
  held = rt.held_tensors();
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0].op, "constant");
}

// An out-of-memory error names the held tensors the program could let go of (here the
// inputs the failing op locked).
TEST(RuntimeTest, OutOfMemoryErrorNamesTheTensorsTheProgramHolds) {
  Runtime rt(logical(1500));
  auto x = rt.constant(vec(100), iota(100).data());  // 400 bytes, pinned
  auto y1 = rt.call1(testing::affine(2, 0), {x});    // 400
  auto y2 = rt.call1(testing::affine(3, 0), {x});    // 400
  try {
    rt.call1(testing::concat(), {y1, y2});  // 800 more, with y1 and y2 locked
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    ASSERT_EQ(e.info().held.size(), 1u);
    EXPECT_EQ(e.info().held[0].op, "affine");
    EXPECT_EQ(e.info().held[0].tensors, 2u);
    EXPECT_EQ(e.info().held[0].resident_bytes, 800u);
    const std::string what = e.what();
    EXPECT_NE(what.find("resident unpinned tensors the program holds: 2 from 'affine' (800 bytes)"),
              std::string::npos)
        << what;
  }
}

// In allocator accounting the error's parts are allocated (rounded) sizes and add up to the
// allocated bytes: 400-byte tensors take 512-byte blocks.
TEST(RuntimeTest, OutOfMemoryPartsAddUpToTheAllocatedBytes) {
  RuntimeOptions o;
  o.budget = 2048;
  o.allocator.small_segment = 512;
  Runtime rt(o);
  auto x = rt.constant(vec(100), iota(100).data());  // pinned
  auto y1 = rt.call1(testing::affine(2, 0), {x});
  auto y2 = rt.call1(testing::affine(3, 0), {x});
  try {
    rt.call1(testing::concat(), {y1, y2});  // 1024 more, with y1 and y2 locked
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    const OutOfMemoryInfo& i = e.info();
    EXPECT_EQ(i.pinned, 512u);
    EXPECT_EQ(i.locked, 1024u);
    EXPECT_EQ(i.pinned + i.locked + i.kept + i.untracked, i.allocated);
    EXPECT_NE(
        std::string(e.what()).find("allocated 1536 = pinned 512 + locked by running ops 1024"),
        std::string::npos)
        << e.what();
  }
}

TEST(RuntimeTest, KernelScratchIsUnderTheBudgetAndGivenBack) {
  Runtime rt({.budget = 8 << 20});
  auto x = rt.constant(vec(1 << 18), iota(1 << 18).data());  // 1 MiB
  std::vector<Tensor> held;
  for (int i = 0; i < 4; ++i) held.push_back(rt.call1(testing::affine(1, 1), {x}));
  const std::size_t allocated = rt.stats().memory.allocated;
  // 4 MiB of scratch does not fit beside 5 MiB of tensors in 8: the runtime evicts.
  auto y = rt.call1(with_scratch(1 << 20), {x});
  EXPECT_GT(rt.stats().evictions, 0u);
  EXPECT_GE(rt.stats().memory.peak_allocated, std::size_t{6} << 20);  // x, y and the scratch
  EXPECT_LE(rt.stats().memory.peak_reserved, std::size_t{8} << 20);
  EXPECT_EQ(read(rt, y)[5], 6.0f);
  std::size_t resident = 0;
  for (const Tensor& t : held) resident += t.resident();
  EXPECT_EQ(rt.stats().memory.allocated, (2 + resident) << 20) << "the scratch went back";
  EXPECT_LT(resident, 4u);
  EXPECT_GT(allocated, rt.stats().memory.allocated - (1 << 20));
  // More scratch than the budget: out of memory in that op; nothing stays locked after.
  try {
    rt.call1(with_scratch(4 << 20), {x});
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    EXPECT_EQ(e.info().op, "with_scratch");
  }
  for (const Tensor& t : held) {
    if (t.resident()) {
      EXPECT_TRUE(rt.evict(t));
    }
  }
  EXPECT_EQ(read(rt, held[0])[3], 5.0f);
}

TEST(RuntimeTest, AKernelThatThrowsLeavesNothingLockedOrAllocated) {
  Runtime rt({.budget = 8 << 20});
  auto x = rt.constant(vec(1024), iota(1024).data());
  auto y = rt.call1(testing::affine(2, 0), {x});
  const std::size_t allocated = rt.stats().memory.allocated;
  auto bad = make_op(
      "bad",
      [](SpecList in) {
        return Outputs{{in[0]}, {in[0]}};
      },
      [](const KernelContext& k) {
        k.scratch(4096);
        throw std::runtime_error("kernel failed");
      },
      testing::numel_cost);
  EXPECT_THROW(rt.call(bad, {y}), std::runtime_error);
  EXPECT_EQ(rt.stats().memory.allocated, allocated);
  EXPECT_TRUE(rt.evict(y)) << "y is no longer locked";
  EXPECT_EQ(read(rt, y)[7], 16.0f);
}

TEST(RuntimeTest, ConstantOverBudgetIsOutOfMemory) {
  Runtime rt(logical(100));
  EXPECT_THROW(rt.constant(vec(100)), OutOfMemoryError);
  auto small = rt.constant(vec(10));
  EXPECT_EQ(small.bytes(), 40u);
}

TEST(RuntimeTest, ThrashGuardStopsRecomputationThatCannotProgress) {
  RuntimeOptions o = logical(SIZE_MAX);
  o.thrash_limit = 10;
  Runtime rt(o);
  auto x = rt.constant(vec(1), iota(1).data());
  Tensor t = x;
  std::vector<Tensor> chain;
  for (int i = 0; i < 50; ++i) chain.push_back(t = rt.call1(testing::affine(1, 1), {t}));
  for (Tensor& c : chain) rt.evict(c);
  EXPECT_THROW(read(rt, t), ThrashError);
  EXPECT_EQ(rt.stats().thrashes, 1u);
}

TEST(RuntimeTest, BudgetCapsReservedBytesWithTheCachingAllocator) {
  RuntimeOptions o;
  o.budget = 3 << 20;
  o.allocator.small_segment = 64 << 10;
  Runtime rt(o);
  auto x = rt.constant(vec(1 << 16), iota(1 << 16).data());  // 256 KiB
  std::vector<Tensor> keep;
  Tensor t = x;
  for (int i = 0; i < 40; ++i) keep.push_back(t = rt.call1(testing::affine(1.0f, 0.5f), {t}));
  EXPECT_GT(rt.stats().evictions, 0u);
  EXPECT_LE(rt.stats().memory.peak_reserved, o.budget);
  EXPECT_EQ(read(rt, keep[3])[0], 3.0f);
  EXPECT_LE(rt.stats().memory.peak_reserved, o.budget);
}

TEST(RuntimeTest, UnknownPolicyIsRejected) {
  RuntimeOptions o;
  o.policy = "nope";
  EXPECT_THROW(Runtime{o}, std::invalid_argument);
  EXPECT_FALSE(eviction_policy_names().empty());
}

TEST(RuntimeTest, ViewOutsideItsBaseIsRejected) {
  Runtime rt;
  auto x = rt.constant(vec(4));
  auto bad = std::make_shared<OpDef>();
  bad->name = "bad_view";
  bad->infer = [](SpecList) { return Outputs{OutputSpec(vec(8), 0, 0)}; };
  EXPECT_THROW(rt.call(bad, {x}), std::invalid_argument);
  EXPECT_EQ(rt.stats().live_tensors, 1u);
}

TEST(RuntimeTest, UpdateWritesPinnedTensorsInPlace) {
  Runtime rt(logical(SIZE_MAX));
  auto w = rt.constant(vec(4), iota(4).data());
  auto one = rt.constant(vec(4), std::vector<float>(4, 1.0f).data());
  rt.update(add_into_first(), {w, one}, {0});
  EXPECT_EQ(read(rt, w), (std::vector<float>{2, 3, 4, 5}));
  EXPECT_EQ(rt.stats().frozen, 0u) << "nothing read w";
}

// A gradient held across the update must keep the bits it had before the parameter changed,
// even when it (or what it is computed from) was evicted: see Note [Updating pinned tensors].
TEST(RuntimeTest, UpdateFreezesHeldDependentsOfTheOldValue) {
  Runtime rt(logical(SIZE_MAX));
  auto w = rt.constant(vec(16), iota(16).data());
  auto x = rt.constant(vec(16), iota(16, 0.5f).data());
  auto h = rt.call1(testing::combine(), {x, w});        // reads w
  auto g = rt.call1(testing::affine(0.5f, 2.0f), {h});  // depends on w through h
  auto unrelated = rt.call1(testing::affine(3.0f, 1.0f), {x});
  const auto g_before = read(rt, g);
  h.reset();  // nobody holds h now
  ASSERT_TRUE(rt.evict(g));
  rt.update(add_into_first(), {w, x}, {0});
  EXPECT_EQ(rt.stats().frozen, 1u) << "only g: unrelated does not read w";
  EXPECT_TRUE(g.resident());
  EXPECT_FALSE(rt.evict(g)) << "a frozen tensor is pinned";
  EXPECT_EQ(read(rt, g), g_before);
  EXPECT_TRUE(rt.evict(unrelated));
  // A new op sees the new parameter.
  auto h2 = rt.call1(testing::combine(), {x, w});
  EXPECT_NE(read(rt, h2)[0], 0.5f + 1.0f * 0.5f);
  // Frozen memory goes with the last handle.
  const auto pinned = rt.stats().pinned_bytes;
  g.reset();
  EXPECT_EQ(rt.stats().pinned_bytes, pinned - 64);
}

// Note [Frozen outputs free their inputs]: an optimizer stepped inside the backward pass
// freezes the gradient flowing down at each update. Once the next one is frozen too, the one
// before is needed by nobody and goes, instead of staying pinned under it.
TEST(RuntimeTest, AFrozenTensorsInputsGoOnceItIsFrozen) {
  Runtime rt(logical(SIZE_MAX));
  auto w1 = rt.constant(vec(16), iota(16).data());
  auto w2 = rt.constant(vec(16), iota(16, 2.0f).data());
  auto x = rt.constant(vec(16), iota(16, 0.5f).data());
  auto g2 = rt.call1(testing::combine(), {x, w2});
  rt.update(add_into_first(), {w2, x}, {0});  // freezes g2
  auto g1 = rt.call1(testing::combine(), {g2, w1});
  const auto g1_before = read(rt, g1);
  g2.reset();  // g1's lineage still reads it
  const auto pinned = rt.stats().pinned_bytes;
  const auto live = rt.stats().live_tensors;
  rt.update(add_into_first(), {w1, x}, {0});  // freezes g1: g2 is needed by nobody
  EXPECT_EQ(rt.stats().frozen, 2u);
  EXPECT_EQ(rt.stats().pinned_bytes, pinned) << "g1 frozen, g2 gone";
  EXPECT_EQ(rt.stats().live_tensors, live - 1);
  EXPECT_EQ(read(rt, g1), g1_before);
}

TEST(RuntimeTest, UpdateRejectsTensorsThatAreNotConstants) {
  Runtime rt(logical(SIZE_MAX));
  auto w = rt.constant(vec(4), iota(4).data());
  auto y = rt.call1(testing::affine(1, 1), {w});
  EXPECT_THROW(rt.update(add_into_first(), {y, w}, {0}), std::invalid_argument);
  EXPECT_THROW(rt.update(add_into_first(), {w, y}, {2}), std::invalid_argument);
  EXPECT_EQ(read(rt, y), (std::vector<float>{2, 3, 4, 5})) << "nothing was written";
}

// Note [Contiguous eviction]: four 256 KiB tensors fill the only segment the budget allows;
// a 512 KiB request needs two adjacent ones gone. The policy's own victim (the oldest cheap
// one) is next to the dear one, so the runtime evicts the cheapest adjacent pair instead,
// and nothing else.
TEST(RuntimeTest, WindowSearchEvictsTheCheapestAdjacentPair) {
  RuntimeOptions o;
  o.backend = Backend::kSimulated;
  o.accounting = Accounting::kAllocator;
  o.budget = std::size_t{1} << 20;
  o.allocator.medium_segment = std::size_t{1} << 20;
  auto run = [](bool contiguous, RuntimeOptions options) {
    options.contiguous_eviction = contiguous;
    Runtime rt(options);
    auto make = make_op("make", [](SpecList) { return Outputs{{vec(64 << 10)}}; }, {});
    const Outputs quarter{{vec(64 << 10)}};
    std::vector<Tensor> t;
    for (double cost : {1.0, 1000.0, 1.0, 1.0})
      t.push_back(rt.call_with(make, {}, quarter, cost)[0]);
    auto big = rt.call_with(make, {}, Outputs{{vec(128 << 10)}}, 1.0)[0];
    EXPECT_TRUE(big.resident());
    EXPECT_LE(rt.stats().memory.peak_reserved, options.budget);
    std::vector<bool> resident;
    for (const Tensor& x : t) resident.push_back(x.resident());
    return std::make_pair(resident, rt.stats().evictions);
  };
  const auto [window, window_evictions] = run(true, o);
  EXPECT_EQ(window, (std::vector<bool>{true, true, false, false}));
  EXPECT_EQ(window_evictions, 2u);
  // Evicting by score alone takes the oldest cheap tensor first, which frees nothing usable.
  const auto [by_score, score_evictions] = run(false, o);
  EXPECT_FALSE(by_score[0]);
  EXPECT_GT(score_evictions, 2u);
}

TEST(TensorSpecTest, BytesOverflowIsAnError) {
  TensorSpec s{{std::int64_t{1} << 40, std::int64_t{1} << 40}, DType::kF32};
  EXPECT_THROW(s.bytes(), std::overflow_error);
  TensorSpec neg{{-1}, DType::kF32};
  EXPECT_THROW(neg.bytes(), std::overflow_error);
  EXPECT_EQ((TensorSpec{{2, 3}, DType::kF64}.bytes()), 48u);
}

}  // namespace
}  // namespace remat

namespace remat {
namespace {}  // namespace
}  // namespace remat

namespace remat {
namespace {}  // namespace
}  // namespace remat
