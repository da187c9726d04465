// Note [Ranks that agree] across mpirun's processes (ctest runs it as 2 and 3 ranks): where
// one rank fails, every rank throws, the others naming it; where none does, none throws.
// GradientBuckets (Note [Buckets beside the backward pass]) over the ranks: sums in rank
// order, and a rank that fails in its backward pass or cannot fit a bucket stops every rank.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "collectives/mpi_test_main.h"
#include "remat/data_parallel.h"
#include "remat/errors.h"
#include "remat/gradient_buckets.h"

namespace remat {
namespace {

Collectives& world() { return testing::mpi_test_world(); }

std::exception_ptr out_of_memory_in(const std::string& op) {
  OutOfMemoryInfo info;
  info.op = op;
  info.requested = 4096;
  info.budget = 1 << 20;
  return std::make_exception_ptr(OutOfMemoryError(info));
}

TEST(DataParallelMpiTest, NoRankFailedAndNoneThrows) {
  EXPECT_NO_THROW(agree_on_step(world(), nullptr));
}

TEST(DataParallelMpiTest, AnOutOfMemoryOnTheLastRankIsThrownOnEveryRank) {
  const int last = world().size() - 1;
  const bool fails = world().rank() == last;
  try {
    agree_on_step(world(), fails ? out_of_memory_in("matmul") : nullptr);
    ADD_FAILURE() << "rank " << world().rank() << " went on";
  } catch (const OutOfMemoryError& e) {
    EXPECT_EQ(e.budget(), std::size_t{1} << 20);
    EXPECT_EQ(e.requested(), 4096u);
    const std::string want = fails ? "matmul" : "matmul on rank " + std::to_string(last);
    EXPECT_EQ(e.info().op, want);
  }
}

// Ranks 1, 2, ... fail, rank 2 with a ThrashError: every rank throws rank 1's error, as its
// type, so that every rank's driver takes the same path.
TEST(DataParallelMpiTest, EveryRankThrowsTheLowestFailingRanksError) {
  std::exception_ptr failure;
  if (world().rank() == 1) failure = std::make_exception_ptr(std::runtime_error("kernel failed"));
  if (world().rank() == 2) failure = std::make_exception_ptr(ThrashError("recomputation", 7, 5));
  try {
    agree_on_step(world(), failure);
    ADD_FAILURE() << "rank " << world().rank() << " went on";
  } catch (const ThrashError& e) {
    ADD_FAILURE() << "rank " << world().rank() << " threw its own error: " << e.what();
  } catch (const std::runtime_error& e) {
    const std::string want = world().rank() == 1 ? "kernel failed" : "rank 1: kernel failed";
    EXPECT_EQ(std::string(e.what()), want);
  }
  EXPECT_NO_THROW(agree_on_step(world(), nullptr)) << "the ranks are still in step";
}

// RankStep: rank 1's backward pass fails; every rank still enters the sum, and every rank
// throws rank 1's error from it. The ranks are in step afterwards.
TEST(DataParallelMpiTest, ASumAfterOneRankFailedThrowsOnEveryRank) {
  Runtime rt(RuntimeOptions{});
  const std::vector<float> values(6, 1.0f);
  Tensor g;
  RankStep ranks(rt, &world());
  ranks.run([&] {
    if (world().rank() == 1) throw std::runtime_error("out of luck");
    g = rt.constant({{6}}, values.data());
  });
  try {
    ranks.all_reduce_sum(world().rank() == 1 ? rt.constant({{6}}) : g);
    ADD_FAILURE() << "rank " << world().rank() << " went on";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), world().rank() == 1 ? "out of luck" : "rank 1: out of luck");
  }
  RankStep next(rt, &world());
  const Tensor sum = next.all_reduce_sum(rt.constant({{6}}, values.data()));
  std::vector<float> out(6);
  rt.read(sum, out.data());
  for (float x : out) EXPECT_EQ(x, static_cast<float>(world().size()));
  const std::vector<float> all = next.all_gather(std::vector<float>{float(world().rank())});
  ASSERT_EQ(all.size(), static_cast<std::size_t>(world().size()));
  for (int r = 0; r < world().size(); ++r) EXPECT_EQ(all[static_cast<std::size_t>(r)], float(r));
  EXPECT_NO_THROW(next.agree());
}

// A gradient's values on `rank`: different on every rank, so a sum out of rank order would
// differ in its last bits.
std::vector<float> gradient_on(int rank, std::size_t param, std::int64_t n) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::size_t j = 0; j < v.size(); ++j)
    v[j] = 1.0f / static_cast<float>(3 + rank * 7 + static_cast<int>(param + j) % 11) +
           static_cast<float>(rank) * 1e4f;
  return v;
}

const std::vector<TensorSpec>& bucket_specs() {
  static const std::vector<TensorSpec> specs = {{{300}}, {{5000}}, {{17}}, {{2000}}, {{900}}};
  return specs;
}

TEST(GradientBucketsMpiTest, SumsEveryBucketInRankOrder) {
  Runtime rt(RuntimeOptions{});
  RankStep ranks(rt, &world());
  const std::vector<TensorSpec>& specs = bucket_specs();
  const float scale = 1.0f / static_cast<float>(world().size());
  GradientBuckets buckets(rt, ranks, specs, {.bucket_bytes = 4096, .scale = scale});
  EXPECT_GE(buckets.buckets(), 3u);
  ranks.run([&] {
    for (std::size_t i : {4u, 2u, 3u, 0u, 1u}) {
      const std::vector<float> v = gradient_on(world().rank(), i, specs[i].numel());
      buckets.add(i, rt.constant(specs[i], v.data()));
    }
  });
  const std::vector<Tensor> out = buckets.finish();
  ranks.agree();
  for (std::size_t i = 0; i < specs.size(); ++i) {
    std::vector<float> want = gradient_on(0, i, specs[i].numel());
    for (int r = 1; r < world().size(); ++r) {
      const std::vector<float> v = gradient_on(r, i, specs[i].numel());
      for (std::size_t j = 0; j < want.size(); ++j) want[j] += v[j];
    }
    for (float& w : want) w *= scale;
    std::vector<float> got(want.size());
    rt.read(out[i], got.data());
    EXPECT_EQ(got, want) << "gradient " << i;
  }
}

// The last rank's backward pass fails after its first gradient: it never fills a bucket,
// yet every rank makes every bucket's exchange and throws its error from finish().
TEST(GradientBucketsMpiTest, ARankThatFailsInItsBackwardPassStopsEveryRank) {
  Runtime rt(RuntimeOptions{});
  RankStep ranks(rt, &world());
  const std::vector<TensorSpec>& specs = bucket_specs();
  const int last = world().size() - 1;
  {
    GradientBuckets buckets(rt, ranks, specs, {.bucket_bytes = 4096});
    ranks.run([&] {
      for (std::size_t i : {4u, 2u, 3u, 0u, 1u}) {
        buckets.add(i, rt.constant(specs[i]));
        if (world().rank() == last) throw std::runtime_error("backward failed");
      }
    });
    try {
      buckets.finish();
      ADD_FAILURE() << "rank " << world().rank() << " went on";
    } catch (const std::runtime_error& e) {
      const std::string want = world().rank() == last
                                   ? "backward failed"
                                   : "rank " + std::to_string(last) + ": backward failed";
      EXPECT_EQ(std::string(e.what()), want);
    }
  }
  RankStep next(rt, &world());
  EXPECT_NO_THROW(next.agree()) << "the ranks are still in step";
}

// Rank 0's budget has no room for the one bucket: every rank stops with its out-of-memory
// error, naming the bucket and the rank.
TEST(GradientBucketsMpiTest, ABucketThatDoesNotFitOnOneRankStopsEveryRank) {
  RuntimeOptions options;
  if (world().rank() == 0) options.budget = 64 << 10;
  Runtime rt(options);
  RankStep ranks(rt, &world());
  const std::vector<TensorSpec> specs = {{{6000}}, {{6000}}};
  const Tensor a = rt.constant(specs[0]), b = rt.constant(specs[1]);  // pinned: 48 KB
  GradientBuckets buckets(rt, ranks, specs, {.bucket_bytes = 1 << 20});
  ranks.run([&] {
    buckets.add(0, a);
    buckets.add(1, b);
  });
  try {
    buckets.finish();
    ADD_FAILURE() << "rank " << world().rank() << " went on";
  } catch (const OutOfMemoryError& e) {
    const std::string want = world().rank() == 0 ? "gradient bucket 0" : "on rank 0";
    EXPECT_NE(e.info().op.find(want), std::string::npos) << e.info().op;
  }
}

}  // namespace
}  // namespace remat
