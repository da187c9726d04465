#include "kernels/cpu/parallel.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <thread>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/philox.h"

namespace remat::kernels::cpu {
namespace {

using i64 = std::int64_t;

// Every item is visited exactly once, chunk starts respect the alignment, and small loops
// stay on the calling thread.
TEST(ParallelFor, CoversEveryItemOnceWithAlignedChunks) {
  for (i64 n : {0, 1, 7, 1000, 65536, 100003}) {
    for (i64 align : {1, 4, 64}) {
      std::vector<std::atomic<int>> seen(static_cast<std::size_t>(n));
      std::atomic<int> misaligned{0};
      parallel_for(
          n, 1024,
          [&](i64 begin, i64 end) {
            if (begin % align != 0) ++misaligned;
            for (i64 i = begin; i < end; ++i) ++seen[static_cast<std::size_t>(i)];
          },
          align);
      for (i64 i = 0; i < n; ++i) ASSERT_EQ(seen[static_cast<std::size_t>(i)], 1) << n << " " << i;
      EXPECT_EQ(misaligned, 0);
    }
  }
  const std::thread::id caller = std::this_thread::get_id();
  if (cpu_threads() > 1) {  // a large loop really is shared
    std::atomic<int> elsewhere{0};
    parallel_for(1 << 20, 1024,
                 [&](i64, i64) { elsewhere += std::this_thread::get_id() != caller; });
    EXPECT_GT(elsewhere, 0);
  }
  bool inline_run = false;
  parallel_for(100, 1024, [&](i64, i64) { inline_run = std::this_thread::get_id() == caller; });
  EXPECT_TRUE(inline_run);
}

// Callers on several threads at once: each loop still covers its items (a call that finds the
// pool busy runs alone).
TEST(ParallelFor, ConcurrentCallersEachCoverTheirItems) {
  std::vector<std::thread> callers;
  std::atomic<int> wrong{0};
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&] {
      for (int round = 0; round < 50; ++round) {
        std::vector<int> seen(200000, 0);
        parallel_for(200000, 1 << 12, [&](i64 b, i64 e) {
          for (i64 i = b; i < e; ++i) ++seen[static_cast<std::size_t>(i)];
        });
        for (int v : seen) wrong += v != 1;
      }
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(wrong, 0);
}

// The threaded kernels give the bits of one thread doing all the work (Note [Deterministic
// threading]): here the same kernels run on one chunk and on the pool.
TEST(ParallelFor, ThreadedKernelsMatchOneChunkBitwise) {
  const i64 n = 1 << 18;
  std::vector<float> x(n), dy(n);
  for (i64 i = 0; i < n; ++i) {
    x[static_cast<std::size_t>(i)] = std::sin(0.001f * static_cast<float>(i)) * 3.0f;
    dy[static_cast<std::size_t>(i)] = std::cos(0.003f * static_cast<float>(i));
  }
  std::vector<float> y(n), dx(n), y1(n), dx1(n), drop(n), drop1(n);
  std::vector<std::uint8_t> mask(n), mask1(n);
  gelu_forward(x.data(), y.data(), n);
  gelu_backward(x.data(), dy.data(), dx.data(), n);
  dropout_forward(x.data(), drop.data(), mask.data(), n, 0.1f, 7, 3);
  // One element at a time, in order: what a single thread computes.
  for (i64 i = 0; i < n; i += 1) {
    gelu_forward(x.data() + i, y1.data() + i, 1);
    gelu_backward(x.data() + i, dy.data() + i, dx1.data() + i, 1);
  }
  const Philox rng(7, 3);
  for (i64 i = 0; i < n; ++i) {
    const bool kept = rng.uniform(static_cast<std::uint64_t>(i)) >= 0.1f;
    mask1[static_cast<std::size_t>(i)] = kept ? 1 : 0;
    drop1[static_cast<std::size_t>(i)] = kept ? x[static_cast<std::size_t>(i)] / 0.9f : 0.0f;
  }
  EXPECT_EQ(y, y1);
  EXPECT_EQ(dx, dx1);
  EXPECT_EQ(drop, drop1);
  EXPECT_EQ(mask, mask1);
  EXPECT_GE(cpu_threads(), 1);
}

}  // namespace
}  // namespace remat::kernels::cpu
