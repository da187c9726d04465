// The host tier (Note [The host tier] in host_tier.cc): constants moved to host memory out of
// the budget, brought back bitwise by whatever needs them.
#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "remat/errors.h"
#include "remat/runtime.h"
#include "runtime/cuda/simulated_cuda.h"
#include "tests/support/simulated_device_ops.h"
#include "tests/support/test_ops.h"

namespace remat {
namespace {

using testing::iota;
using testing::read;
using testing::vec;

constexpr std::int64_t kMiB = (1 << 20) / 4;  // floats in a MiB

RuntimeOptions with_host(std::size_t budget, std::size_t host_bytes) {
  RuntimeOptions o = testing::logical(budget);
  o.host_memory_bytes = host_bytes;
  return o;
}

TEST(HostTier, AnOffloadedConstantReadsBackItsBytes) {
  Runtime rt(with_host(SIZE_MAX, 1 << 20));
  const std::vector<float> values = iota(1000, -3.5f);
  Tensor c = rt.constant(vec(1000), values.data());
  const std::size_t pinned = rt.stats().pinned_bytes;
  ASSERT_TRUE(rt.offload(c));
  EXPECT_TRUE(rt.offloaded(c));
  EXPECT_EQ(rt.stats().offloads, 1u);
  EXPECT_EQ(rt.stats().offloaded_bytes, 4000u);
  EXPECT_EQ(rt.stats().pinned_bytes, pinned - 4000);
  EXPECT_EQ(rt.stats().memory.allocated, 0u);
  EXPECT_EQ(read(rt, c), values);
  EXPECT_FALSE(rt.offloaded(c));
  EXPECT_EQ(rt.stats().restores, 1u);
  EXPECT_EQ(rt.stats().offloaded_bytes, 0u);
  EXPECT_EQ(rt.stats().peak_offloaded_bytes, 4000u);
  EXPECT_EQ(rt.stats().pinned_bytes, pinned);
  // Each way costs the link's price on the clock.
  EXPECT_DOUBLE_EQ(rt.stats().transfer_cost, 2 * rt.options().host_link.price(4000));
}

TEST(HostTier, OnlyHeldResidentStoragesThatFitAreOffloaded) {
  Runtime rt(with_host(SIZE_MAX, 8192));
  const std::vector<float> values = iota(1000);
  Tensor c = rt.constant(vec(1000), values.data());
  Tensor big = rt.constant(vec(3000), iota(3000).data());
  Tensor y = rt.call1(testing::affine(2.0f, 1.0f), {c});
  EXPECT_FALSE(rt.offload(big));  // 12000 bytes, the host has 8192
  EXPECT_TRUE(rt.offload(c));
  EXPECT_FALSE(rt.offload(c));  // already there
  EXPECT_TRUE(rt.offload(y));   // held by the program: its bytes go, its lineage stays
  EXPECT_EQ(rt.stats().offloads, 2u);
  EXPECT_FALSE(rt.offloaded(big));
  std::vector<float> twice = values;
  for (float& v : twice) v = v * 2.0f + 1.0f;
  EXPECT_EQ(read(rt, y), twice);
  EXPECT_EQ(rt.stats().recomputations, 0u);  // brought back, not recomputed
  Runtime none(with_host(SIZE_MAX, 0));      // no host tier: nothing moves
  EXPECT_FALSE(none.offload(none.constant(vec(4), iota(4).data())));
}

// Note [Keep, recompute or offload]: a victim whose round trip over the host link costs less
// than rerunning its producer goes to the host; over a slow link it is evicted and recomputed.
// Either way the bytes read back are the unconstrained run's.
TEST(HostTier, AVictimCheaperToMoveThanToRecomputeGoesToTheHost) {
  auto run = [](HostLink link, bool offload_victims = true) {
    RuntimeOptions o = with_host(3 * 4 * 4096, 1 << 20);  // three of the tensors below
    o.host_link = link;
    o.offload_victims = offload_victims;
    Runtime rt(o);
    Tensor x = rt.constant(vec(4096), iota(4096, 0.25f).data());
    std::vector<Tensor> chain{x};
    for (int i = 0; i < 6; ++i)
      chain.push_back(rt.call1(testing::affine(1.5f, 0.5f * i), {chain.back()}));
    std::vector<float> all;
    for (const Tensor& t : chain) {
      const std::vector<float> v = read(rt, t);
      all.insert(all.end(), v.begin(), v.end());
    }
    return std::make_pair(all, rt.stats());
  };
  Runtime plain(with_host(SIZE_MAX, 0));
  Tensor x = plain.constant(vec(4096), iota(4096, 0.25f).data());
  std::vector<float> expected = read(plain, x);
  for (int i = 0; i < 6; ++i) {
    x = plain.call1(testing::affine(1.5f, 0.5f * i), {x});
    const std::vector<float> v = read(plain, x);
    expected.insert(expected.end(), v.begin(), v.end());
  }
  const auto [fast_bytes, fast] = run(HostLink{1e9, 0.0});  // a round trip costs nothing
  EXPECT_EQ(fast_bytes, expected);
  EXPECT_GT(fast.offloads, 0u);
  EXPECT_GT(fast.restores, 0u);
  EXPECT_EQ(fast.recomputations, 0u);
  const auto [slow_bytes, slow] = run(HostLink{1e-6, 1e9});  // dearer than any kernel
  EXPECT_EQ(slow_bytes, expected);
  EXPECT_EQ(slow.offloads, 0u);
  EXPECT_GT(slow.recomputations, 0u);
  const auto [off_bytes, off] = run(HostLink{1e9, 0.0}, /*offload_victims=*/false);
  EXPECT_EQ(off_bytes, expected);
  EXPECT_EQ(off.offloads, 0u);
}

// A storage with lineage the program lets go of while offloaded loses its host bytes and
// stays recomputable.
TEST(HostTier, ALetGoActivationLeavesTheHostAndStaysRecomputable) {
  Runtime rt(with_host(SIZE_MAX, 1 << 20));
  Tensor x = rt.constant(vec(1000), iota(1000).data());
  Tensor y = rt.call1(testing::affine(3.0f, 0.0f), {x});
  Tensor z = rt.call1(testing::affine(1.0f, 1.0f), {y});
  ASSERT_TRUE(rt.offload(y));
  y = Tensor();
  EXPECT_EQ(rt.stats().offloaded_bytes, 0u);
  ASSERT_TRUE(rt.evict(z));
  std::vector<float> expected = iota(1000);
  for (float& v : expected) v = v * 3.0f + 1.0f;
  EXPECT_EQ(read(rt, z), expected);  // z recomputed from y, y recomputed from x
  EXPECT_EQ(rt.stats().recomputations, 2u);
}

// An op reading an offloaded constant, and an update writing one, bring it back first.
TEST(HostTier, OpsAndUpdatesBringOffloadedConstantsBack) {
  Runtime rt(with_host(SIZE_MAX, 1 << 20));
  Tensor w = rt.constant(vec(256), iota(256).data());
  Tensor x = rt.constant(vec(256), iota(256, 10.0f).data());
  ASSERT_TRUE(rt.offload(w));
  Tensor y = rt.call1(testing::combine(), {w, x});
  Runtime plain(with_host(SIZE_MAX, 0));
  Tensor pw = plain.constant(vec(256), iota(256).data());
  Tensor px = plain.constant(vec(256), iota(256, 10.0f).data());
  EXPECT_EQ(read(rt, y), read(plain, plain.call1(testing::combine(), {pw, px})));
  ASSERT_TRUE(rt.offload(w));
  rt.update(testing::add_into_first(), {w, x}, {0});
  plain.update(testing::add_into_first(), {pw, px}, {0});
  EXPECT_EQ(read(rt, w), read(plain, pw));
  EXPECT_EQ(rt.stats().restores, 2u);
}

// What the budget could not hold beside a pinned constant fits with it on the host, moved
// there by the program or, when a request finds nothing else to make room, by the runtime.
TEST(HostTier, OffloadingAConstantMakesRoomUnderTheBudget) {
  auto run = [](std::size_t host_bytes, bool offload) {
    Runtime rt(with_host(4 << 20, host_bytes));
    Tensor state = rt.constant(vec(2 * kMiB), iota(2 * kMiB).data());  // never read below
    Tensor x = rt.constant(vec(kMiB), iota(kMiB, 0.5f).data());
    if (offload) {
      EXPECT_TRUE(rt.offload(state));
    }
    Tensor y = rt.call1(testing::affine(0.5f, 1.0f), {x});
    Tensor z = rt.call1(testing::combine(), {x, y});  // x, y and z at once: 3 MiB
    std::vector<float> out = read(rt, z);
    EXPECT_EQ(rt.stats().offloads, 1u);
    y = Tensor();
    x = Tensor();
    EXPECT_EQ(read(rt, state), iota(2 * kMiB));  // back beside z: 3 MiB
    EXPECT_LE(rt.stats().memory.peak_allocated, std::size_t{4} << 20);
    return out;
  };
  EXPECT_THROW(run(0, false), OutOfMemoryError);
  EXPECT_EQ(run(4 << 20, true), run(4 << 20, false));
}

// A request that finds nothing to evict sends the constant read longest ago to the host
// instead of failing; with no host memory it fails.
TEST(HostTier, ARequestWithNothingToEvictOffloadsTheColdestConstant) {
  for (std::size_t host : {std::size_t{0}, std::size_t{4} << 20}) {
    Runtime rt(with_host(3 << 20, host));
    Tensor cold = rt.constant(vec(kMiB), iota(kMiB, 1.0f).data());
    Tensor warm = rt.constant(vec(kMiB), iota(kMiB, 5.0f).data());
    read(rt, cold);
    read(rt, warm);  // read last: cold is the older
    if (host == 0) {
      EXPECT_THROW(rt.call1(testing::concat(), {warm, warm}), OutOfMemoryError);
      continue;
    }
    Tensor both = rt.call1(testing::concat(), {warm, warm});  // 2 MiB beside warm
    EXPECT_TRUE(rt.offloaded(cold));
    EXPECT_FALSE(rt.offloaded(warm));
    EXPECT_EQ(rt.stats().offloads, 1u);
    both = Tensor();
    EXPECT_EQ(read(rt, cold), iota(kMiB, 1.0f));
  }
}

// A restore the budget cannot hold fails like any request; the bytes stay on the host, and
// once the program lets go of enough they come back.
TEST(HostTier, ARestoreThatDoesNotFitKeepsTheBytesOnTheHost) {
  Runtime rt(with_host(3 << 20, 2 << 20));  // room for `state` alone
  Tensor state = rt.constant(vec(2 * kMiB), iota(2 * kMiB).data());
  ASSERT_TRUE(rt.offload(state));
  Tensor a = rt.constant(vec(kMiB), iota(kMiB).data());
  Tensor b = rt.constant(vec(kMiB), iota(kMiB, 2.0f).data());
  EXPECT_THROW(read(rt, state), OutOfMemoryError);
  EXPECT_TRUE(rt.offloaded(state));
  EXPECT_EQ(rt.stats().offloaded_bytes, std::size_t{2} << 20);
  b = Tensor();
  EXPECT_EQ(read(rt, state), iota(2 * kMiB));
}

TEST(HostTier, ADeadOffloadedConstantFreesItsHostMemory) {
  Runtime rt(with_host(SIZE_MAX, 1 << 20));
  Tensor c = rt.constant(vec(1000), iota(1000).data());
  ASSERT_TRUE(rt.offload(c));
  EXPECT_EQ(rt.stats().offloaded_bytes, 4000u);
  c = Tensor();
  EXPECT_EQ(rt.stats().offloaded_bytes, 0u);
  Tensor d = rt.constant(vec(250000), nullptr);  // the whole host memory again
  EXPECT_TRUE(rt.offload(d));
}

// The caching allocator: the constant comes back into a block of its own, under the budget.
TEST(HostTier, TheCachingAllocatorTakesRestoredConstantsBack) {
  RuntimeOptions o;
  o.budget = 3 << 20;
  o.host_memory_bytes = 2 << 20;
  Runtime rt(o);
  Tensor state = rt.constant(vec(kMiB), iota(kMiB, 7.0f).data());
  Tensor x = rt.constant(vec(kMiB / 2), iota(kMiB / 2).data());
  ASSERT_TRUE(rt.offload(state));
  EXPECT_LE(rt.stats().memory.allocated, std::size_t{1} << 20);
  Tensor y = rt.call1(testing::affine(3.0f, 1.0f), {x});
  Tensor z = rt.call1(testing::combine(), {x, y});
  EXPECT_EQ(read(rt, state), iota(kMiB, 7.0f));
  EXPECT_EQ(read(rt, z).size(), static_cast<std::size_t>(kMiB / 2));
  EXPECT_LE(rt.stats().memory.peak_reserved, o.budget);
}

// On a device the bytes cross to the host and back (the simulated one: device memory is
// real host memory there), and no copy races a kernel.
TEST(HostTier, ADeviceCopiesToTheHostAndBack) {
  auto sim = std::make_shared<SimulatedCuda>();
  RuntimeOptions o = on_sim(sim, 8 << 20);
  o.host_memory_bytes = 1 << 20;
  Runtime rt(o);
  Tensor a = rt.constant(vec(1000), iota(1000, 2.0f).data());
  Tensor b = rt.constant(vec(3000), iota(3000, -9.0f).data());
  ASSERT_TRUE(rt.offload(a));
  ASSERT_TRUE(rt.offload(b));
  EXPECT_EQ(rt.stats().offloaded_bytes, 16000u);
  EXPECT_EQ(read(rt, b), iota(3000, -9.0f));
  EXPECT_EQ(read(rt, a), iota(1000, 2.0f));
  EXPECT_TRUE(sim->races().empty());
}

// On the simulated backend only sizes and the clock move.
TEST(HostTier, TheSimulatedBackendPricesTransfers) {
  RuntimeOptions o = with_host(SIZE_MAX, 1 << 20);
  o.backend = Backend::kSimulated;
  o.host_link = HostLink::nvlink_c2c();
  Runtime rt(o);
  Tensor c = rt.constant(vec(1000));
  const double before = rt.clock();
  ASSERT_TRUE(rt.offload(c));
  rt.materialize(c);
  EXPECT_DOUBLE_EQ(rt.clock() - before, 2 * HostLink::nvlink_c2c().price(4000));
  EXPECT_EQ(rt.stats().restores, 1u);
}

// Note [Copies beside the kernels]: a copy begun early, and a copy back begun ahead of the
// use, cost the clock nothing where the kernels between take longer; on demand they cost
// their whole price.
TEST(HostTier, CopiesBegunEarlyRunBesideTheKernels) {
  for (bool early : {true, false}) {
    SCOPED_TRACE(early ? "early" : "on demand");
    RuntimeOptions o = with_host(SIZE_MAX, 1 << 20);
    o.host_link = HostLink{1.0, 0.0};  // 4000 bytes: 4000 ns each way
    Runtime rt(o);
    Tensor x = rt.constant(vec(1000), iota(1000, 1.0f).data());
    Tensor a = rt.call1(testing::affine(2.0f, 1.0f), {x});  // 1001 ns an affine
    const std::vector<float> values = read(rt, a);
    auto kernels = [&](int n) {
      Tensor y = x;
      for (int i = 0; i < n; ++i) y = rt.call1(testing::affine(0.5f, 0.0f), {y});
    };
    if (early) {
      ASSERT_TRUE(rt.copy_to_host(a));
    }
    kernels(early ? 5 : 0);
    ASSERT_TRUE(rt.offload(a));
    if (early) {
      ASSERT_TRUE(rt.prefetch(a));
    }
    kernels(early ? 5 : 0);
    EXPECT_EQ(read(rt, a), values);
    EXPECT_DOUBLE_EQ(rt.stats().transfer_cost, 8000);
    EXPECT_DOUBLE_EQ(rt.stats().transfer_exposed, early ? 0 : 8000);
    EXPECT_EQ(rt.stats().restores, 1u);
  }
}

// A use waits for what is left of a copy back in flight.
TEST(HostTier, AUseWaitsForThePrefetchStillCopying) {
  RuntimeOptions o = with_host(SIZE_MAX, 1 << 20);
  o.host_link = HostLink{1.0, 0.0};
  Runtime rt(o);
  Tensor x = rt.constant(vec(1000), iota(1000, 1.0f).data());
  Tensor a = rt.call1(testing::affine(2.0f, 1.0f), {x});
  ASSERT_TRUE(rt.offload(a));  // on demand: 4000 exposed
  ASSERT_TRUE(rt.prefetch(a));
  Tensor b = rt.call1(testing::affine(1.0f, 0.0f), {x});  // 1001 of the 4000 pass
  const double before = rt.clock();
  Tensor c = rt.call1(testing::affine(1.0f, 0.0f), {a});
  EXPECT_DOUBLE_EQ(rt.clock() - before, (4000 - 1001) + 1001);
  EXPECT_DOUBLE_EQ(rt.stats().transfer_exposed, 4000 + (4000 - 1001));
  EXPECT_FALSE(rt.prefetch(a));  // resident: nothing to bring back
}

// An update writes a constant whose copy had begun: the stale copy goes, and the offload
// that follows copies the new bytes.
TEST(HostTier, AnUpdateDropsAnEarlyCopy) {
  Runtime rt(with_host(SIZE_MAX, 1 << 20));
  Tensor w = rt.constant(vec(256), iota(256).data());
  Tensor x = rt.constant(vec(256), iota(256, 10.0f).data());
  ASSERT_TRUE(rt.copy_to_host(w));
  EXPECT_EQ(rt.stats().offloaded_bytes, 1024u);
  rt.update(testing::add_into_first(), {w, x}, {0});
  EXPECT_EQ(rt.stats().offloaded_bytes, 0u);
  const std::vector<float> updated = read(rt, w);
  ASSERT_TRUE(rt.offload(w));
  EXPECT_EQ(read(rt, w), updated);
  EXPECT_NE(updated, iota(256));
}

// On the simulated device the early copy, the offload and the prefetch move the bytes with
// no copy racing a kernel.
TEST(HostTier, ADeviceCopiesEarlyAndPrefetchesWithoutRaces) {
  auto sim = std::make_shared<SimulatedCuda>();
  RuntimeOptions o = on_sim(sim, 8 << 20);
  o.host_memory_bytes = 1 << 20;
  Runtime rt(o);
  Tensor c = rt.constant(vec(1000), iota(1000, 2.0f).data());
  Tensor a = rt.call1(on_device(sim, testing::affine(3.0f, -1.0f), 500.0), {c});
  const std::vector<float> values = read(rt, a);
  ASSERT_TRUE(rt.copy_to_host(a));
  ASSERT_TRUE(rt.copy_to_host(c));
  ASSERT_TRUE(rt.offload(a));
  ASSERT_TRUE(rt.offload(c));
  ASSERT_TRUE(rt.prefetch(a));
  EXPECT_EQ(read(rt, a), values);
  EXPECT_EQ(read(rt, c), iota(1000, 2.0f));
  EXPECT_TRUE(sim->races().empty());
}

}  // namespace
}  // namespace remat
