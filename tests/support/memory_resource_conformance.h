// The conformance suite every memory resource passes, in the manner of RMM's typed suites:
// distinct pointers for zero bytes, a typed out-of-memory error after which the resource
// still works, disjoint live blocks and exact counters under random sequences, and the
// reclaimer asked before a failure. Instantiate it with types that have
// `static std::unique_ptr<MemoryResource> make()` (a resource whose budget is
// kConformanceBudget) and `static constexpr bool kHost` (its memory may be written):
//
//   using Resources = ::testing::Types<HostCaching, SimulatedArena>;
//   INSTANTIATE_TYPED_TEST_SUITE_P(Alloc, MemoryResourceConformance, Resources);
#ifndef REMAT_TESTS_SUPPORT_MEMORY_RESOURCE_CONFORMANCE_H_
#define REMAT_TESTS_SUPPORT_MEMORY_RESOURCE_CONFORMANCE_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "remat/errors.h"
#include "remat/memory_resource.h"

namespace remat::testing {

inline constexpr std::size_t kConformanceBudget = std::size_t{48} << 20;

// A reclaimer that frees the blocks it was given, one per call.
class FreeingReclaimer : public MemoryReclaimer {
 public:
  explicit FreeingReclaimer(MemoryResource* mem) : mem_(mem) {}
  bool reclaim(std::size_t) override {
    ++calls;
    if (held.empty()) return false;
    mem_->deallocate(held.back().first, held.back().second);
    held.pop_back();
    return true;
  }
  std::vector<std::pair<void*, std::size_t>> held;
  int calls = 0;

 private:
  MemoryResource* mem_;
};

template <typename T>
class MemoryResourceConformance : public ::testing::Test {};
TYPED_TEST_SUITE_P(MemoryResourceConformance);

TYPED_TEST_P(MemoryResourceConformance, ZeroBytesGivesDistinctPointers) {
  auto mem = TypeParam::make();
  void* a = mem->allocate(0);
  void* b = mem->allocate(0);
  EXPECT_NE(a, nullptr);
  EXPECT_NE(a, b);
  mem->deallocate(a, 0);
  mem->deallocate(b, 0);
  EXPECT_EQ(mem->stats().active_blocks, 0u);
}

TYPED_TEST_P(MemoryResourceConformance, OverBudgetThrowsTypedErrorAndStaysUsable) {
  auto mem = TypeParam::make();
  void* a = mem->allocate(kConformanceBudget / 2);
  try {
    mem->allocate(kConformanceBudget);
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    EXPECT_EQ(e.budget(), kConformanceBudget);
    EXPECT_GE(e.requested(), kConformanceBudget);
  }
  EXPECT_EQ(mem->stats().ooms, 1u);
  mem->deallocate(a, kConformanceBudget / 2);
  void* b = mem->allocate(kConformanceBudget / 2 + 1000);  // usable after the failure
  mem->deallocate(b, kConformanceBudget / 2 + 1000);
}

// Random allocate/free sequences: live blocks never overlap, host memory holds what was
// written, and the counters agree with what is live.
TYPED_TEST_P(MemoryResourceConformance, RandomSequencesKeepBlocksDisjointAndCountersRight) {
  auto mem = TypeParam::make();
  std::mt19937_64 rng(7);
  struct Live {
    std::uintptr_t p;
    std::size_t n;
    std::uint8_t tag;
  };
  std::vector<Live> live;
  std::size_t requested = 0;
  for (int step = 0; step < 4000; ++step) {
    const bool alloc = live.empty() || rng() % 100 < 55;
    if (alloc) {
      const std::size_t n = rng() % 4 == 0 ? rng() % (3 << 20) : rng() % 5000;
      if (requested + n > kConformanceBudget / 2) continue;
      void* p = mem->allocate(n);
      const auto tag = static_cast<std::uint8_t>(rng());
      if (TypeParam::kHost && n > 0) {
        static_cast<std::uint8_t*>(p)[0] = tag;
        static_cast<std::uint8_t*>(p)[n - 1] = tag;
      }
      live.push_back({reinterpret_cast<std::uintptr_t>(p), n, tag});
      requested += n;
    } else {
      const std::size_t i = rng() % live.size();
      if (TypeParam::kHost && live[i].n > 0) {
        auto* bytes = reinterpret_cast<std::uint8_t*>(live[i].p);
        ASSERT_EQ(bytes[0], live[i].tag);
        ASSERT_EQ(bytes[live[i].n - 1], live[i].tag);
      }
      mem->deallocate(reinterpret_cast<void*>(live[i].p), live[i].n);
      requested -= live[i].n;
      live[i] = live.back();
      live.pop_back();
    }
    const MemoryStats s = mem->stats();
    ASSERT_EQ(s.active_blocks, live.size());
    ASSERT_EQ(s.requested, requested);
    ASSERT_LE(s.reserved, kConformanceBudget);
    ASSERT_LE(s.allocated, s.reserved);
    ASSERT_LE(s.peak_reserved, kConformanceBudget);
  }
  std::vector<Live> sorted = live;
  std::sort(sorted.begin(), sorted.end(), [](const Live& a, const Live& b) { return a.p < b.p; });
  for (std::size_t i = 1; i < sorted.size(); ++i)
    ASSERT_GE(sorted[i].p, sorted[i - 1].p + std::max<std::size_t>(sorted[i - 1].n, 1));
  for (const Live& l : live) mem->deallocate(reinterpret_cast<void*>(l.p), l.n);
  EXPECT_EQ(mem->stats().allocated, 0u);
}

TYPED_TEST_P(MemoryResourceConformance, AsksTheReclaimerBeforeFailing) {
  auto mem = TypeParam::make();
  FreeingReclaimer reclaimer(mem.get());
  mem->set_reclaimer(&reclaimer);
  for (int i = 0; i < 8; ++i)
    reclaimer.held.emplace_back(mem->allocate(kConformanceBudget / 8 - 4096),
                                kConformanceBudget / 8 - 4096);
  void* p = mem->allocate(kConformanceBudget / 4);
  EXPECT_GT(reclaimer.calls, 0);
  EXPECT_LE(mem->stats().peak_reserved, kConformanceBudget);
  mem->deallocate(p, kConformanceBudget / 4);
  for (auto [q, n] : reclaimer.held) mem->deallocate(q, n);
  reclaimer.held.clear();
  EXPECT_THROW(mem->allocate(kConformanceBudget + 1), OutOfMemoryError);
}

REGISTER_TYPED_TEST_SUITE_P(MemoryResourceConformance, ZeroBytesGivesDistinctPointers,
                            OverBudgetThrowsTypedErrorAndStaysUsable,
                            RandomSequencesKeepBlocksDisjointAndCountersRight,
                            AsksTheReclaimerBeforeFailing);

}  // namespace remat::testing

#endif  // REMAT_TESTS_SUPPORT_MEMORY_RESOURCE_CONFORMANCE_H_
