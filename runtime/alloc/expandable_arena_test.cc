// ExpandableArena alone: the reserved prefix grows at its end within the budget, in the
// source's granules, and a free tail goes back in whole granules.
#include "runtime/alloc/detail/expandable_arena.h"

#include <gtest/gtest.h>

#include <memory>

namespace remat::detail {
namespace {

// A lazily committed source with 64 KiB granules that can be told to refuse backing.
class GranularSource final : public SegmentSource {
 public:
  void* reserve(std::size_t bytes) override { return inner_.reserve(bytes); }
  void release(void* p, std::size_t bytes) override { inner_.release(p, bytes); }
  const char* name() const override { return "granular"; }
  bool host_accessible() const override { return false; }
  bool lazily_committed() const override { return true; }
  bool commit_prefix(void*, std::size_t bytes) override {
    EXPECT_EQ(bytes % commit_granularity(), 0u);
    if (refuse) return false;
    committed = bytes;
    return true;
  }
  std::size_t commit_granularity() const override { return 64 << 10; }
  bool refuse = false;
  std::size_t committed = 0;

 private:
  SimulatedSegmentSource inner_;
};

constexpr std::size_t kBudget = 4 << 20;

TEST(ExpandableArenaTest, GrowsByItsStepWithinTheBudget) {
  BestFitPool pool;
  GranularSource source;
  ExpandableArena arena(pool, source, /*step=*/1 << 20);
  EXPECT_EQ(arena.segment(), nullptr);
  auto g = arena.grow(1000, kBudget, kBudget);
  ASSERT_NE(g.tail, nullptr);
  EXPECT_EQ(g.bytes, std::size_t{1} << 20);  // a whole step for a small request
  EXPECT_EQ(arena.segment()->capacity, kBudget);
  EXPECT_EQ(source.committed, std::size_t{1} << 20);
  // Where the budget has less room than a step, what room it has, in whole granules.
  pool.mark_live(g.tail, 1 << 20);
  g = arena.grow(100 << 10, kBudget, (192 << 10) + 1000);
  ASSERT_NE(g.tail, nullptr);
  EXPECT_EQ(g.bytes, std::size_t{192} << 10);
  EXPECT_EQ(arena.room(kBudget), kBudget - arena.segment()->size);
  EXPECT_EQ(arena.grow(1 << 20, kBudget, 64 << 10).tail, nullptr);  // no room
}

TEST(ExpandableArenaTest, AFreeTailIsExtendedNotDuplicated) {
  BestFitPool pool;
  GranularSource source;
  ExpandableArena arena(pool, source, /*step=*/64 << 10);
  auto g = arena.grow(64 << 10, kBudget, kBudget);
  pool.insert_free(g.tail);
  g = arena.grow(192 << 10, kBudget, kBudget);  // the free 64 KiB tail grows by 128 KiB
  ASSERT_NE(g.tail, nullptr);
  EXPECT_EQ(g.bytes, std::size_t{128} << 10);
  EXPECT_EQ(g.tail->size, std::size_t{192} << 10);
  EXPECT_EQ(arena.segment()->blocks, 1u);
  EXPECT_TRUE(pool.free_set(false).empty());  // the caller hands the tail out
}

TEST(ExpandableArenaTest, ShrinkGivesBackWholeGranulesOfAFreeTail) {
  BestFitPool pool;
  GranularSource source;
  ExpandableArena arena(pool, source, /*step=*/1 << 20);
  Block* tail = arena.grow(1 << 20, kBudget, kBudget).tail;
  Block* rest = pool.split(tail, 100 << 10);  // 100 KiB live, the rest free
  pool.mark_live(tail, 100 << 10);
  pool.insert_free(rest);
  EXPECT_EQ(arena.shrinkable(), (std::size_t{1} << 20) - (128 << 10));
  EXPECT_EQ(arena.shrink(), (std::size_t{1} << 20) - (128 << 10));
  EXPECT_EQ(arena.segment()->size, std::size_t{128} << 10);
  EXPECT_EQ(source.committed, std::size_t{128} << 10);
  EXPECT_EQ(rest->size, std::size_t{28} << 10);  // the part of a granule stays reserved
  EXPECT_EQ(arena.shrink(), 0u);
}

TEST(ExpandableArenaTest, ARefusalIsReportedAndChangesNothing) {
  BestFitPool pool;
  GranularSource source;
  ExpandableArena arena(pool, source, /*step=*/1 << 20);
  source.refuse = true;
  const auto g = arena.grow(1000, kBudget, kBudget);
  EXPECT_EQ(g.tail, nullptr);
  EXPECT_EQ(g.refused, std::size_t{1} << 20);
  EXPECT_EQ(arena.segment()->size, 0u);
}

}  // namespace
}  // namespace remat::detail
