// BestFitPool alone: best fit with ties to the oldest segment and lowest address, splitting,
// and merging on free, checked against a model under random sequences.
#include "runtime/alloc/detail/best_fit_pool.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <vector>

namespace remat::detail {
namespace {

constexpr std::uintptr_t kBase = std::uintptr_t{1} << 40;

auto any_block = [](const Block*) { return true; };

// The free blocks of `s` in address order, as (offset, size).
std::vector<std::pair<std::size_t, std::size_t>> free_runs(const Segment& s) {
  std::vector<std::pair<std::size_t, std::size_t>> out;
  for (const Block* b = s.first; b != nullptr; b = b->next)
    if (!b->allocated) out.emplace_back(b->address - s.address, b->size);
  return out;
}

TEST(BestFitPoolTest, TakesTheSmallestBlockThatFitsAndTheOldestOfEquals) {
  BestFitPool pool;
  Segment* a = pool.add_segment(kBase, 8192, false, false);
  Segment* b = pool.add_segment(kBase + 65536, 4096, false, false);
  Segment* c = pool.add_segment(kBase + 131072, 4096, false, false);
  for (Segment* s : {a, b, c}) pool.insert_free(s->first);
  EXPECT_EQ(pool.take_best_fit(3000, false, any_block), b->first);  // 4096, older than c's
  EXPECT_EQ(pool.take_best_fit(3000, false, any_block), c->first);
  EXPECT_EQ(pool.take_best_fit(3000, false, any_block), a->first);
  EXPECT_EQ(pool.take_best_fit(1, false, any_block), nullptr);
  EXPECT_LT(a->serial, b->serial);
}

TEST(BestFitPoolTest, SkipsWhatTheCallerRefusesAndKeepsPoolsApart) {
  BestFitPool pool;
  Segment* small = pool.add_segment(kBase, 4096, true, false);
  Segment* large = pool.add_segment(kBase + 65536, 4096, false, false);
  pool.insert_free(small->first);
  pool.insert_free(large->first);
  auto not_large = [&](const Block* b) { return b->segment != large; };
  EXPECT_EQ(pool.take_best_fit(100, false, not_large), nullptr);
  EXPECT_EQ(pool.take_best_fit(100, true, any_block), small->first);
  EXPECT_EQ(pool.largest_free(), 4096u);
}

TEST(BestFitPoolTest, AFreedBlockMergesWithBothNeighbours) {
  BestFitPool pool;
  Segment* s = pool.add_segment(kBase, 3 * 4096, false, false);
  Block* first = s->first;
  Block* second = pool.split(first, 4096);
  Block* third = pool.split(second, 4096);
  EXPECT_EQ(s->blocks, 3u);
  for (Block* b : {first, second, third}) pool.mark_live(b, 4000);
  EXPECT_EQ(pool.live_block(reinterpret_cast<void*>(second->address)), second);
  pool.coalesce(pool.take_live(reinterpret_cast<void*>(kBase)));
  pool.coalesce(pool.take_live(reinterpret_cast<void*>(kBase + 8192)));
  EXPECT_EQ(free_runs(*s),
            (std::vector<std::pair<std::size_t, std::size_t>>{{0, 4096}, {8192, 4096}}));
  Block* merged = pool.coalesce(pool.take_live(reinterpret_cast<void*>(kBase + 4096)));
  EXPECT_EQ(merged, s->first);
  EXPECT_EQ(merged->size, s->size);
  EXPECT_EQ(s->blocks, 1u);
  EXPECT_EQ(s->live_blocks, 0u);
  EXPECT_EQ(pool.take_live(reinterpret_cast<void*>(kBase)), nullptr);  // no longer live
}

// Random takes (with splits) and frees against a model of which bytes are live: blocks tile
// their segments, free runs never touch, and the free sets hold exactly the free blocks.
TEST(BestFitPoolTest, RandomSequencesKeepTheTilingAndTheSets) {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 20; ++trial) {
    BestFitPool pool;
    for (std::uintptr_t k = 0; k < 3; ++k) {
      Segment* s = pool.add_segment(kBase + (k << 24), 1 << 20, false, false);
      pool.insert_free(s->first);
    }
    std::map<std::uintptr_t, std::size_t> live;  // address -> size
    for (int step = 0; step < 400; ++step) {
      if (!live.empty() && rng() % 2 == 0) {
        auto it = std::next(live.begin(), static_cast<long>(rng() % live.size()));
        pool.coalesce(pool.take_live(reinterpret_cast<void*>(it->first)));
        live.erase(it);
        continue;
      }
      const std::size_t size = (1 + rng() % 64) * 512;
      Block* b = pool.take_best_fit(size, false, any_block);
      if (b == nullptr) continue;
      if (b->size > size) pool.insert_free(pool.split(b, size));
      pool.mark_live(b, size);
      ASSERT_TRUE(live.emplace(b->address, size).second);
    }
    std::size_t free_blocks = 0;
    for (const Segment* s : pool.segments()) {
      std::size_t covered = 0;
      bool last_free = false;
      for (const Block* b = s->first; b != nullptr; b = b->next) {
        ASSERT_EQ(b->address, s->address + covered);
        ASSERT_FALSE(last_free && !b->allocated) << "two free neighbours were not merged";
        ASSERT_EQ(b->allocated, live.count(b->address) == 1);
        last_free = !b->allocated;
        free_blocks += last_free ? 1 : 0;
        covered += b->size;
      }
      ASSERT_EQ(covered, s->size);
    }
    ASSERT_EQ(pool.free_set(false).size(), free_blocks);
  }
}

}  // namespace
}  // namespace remat::detail
