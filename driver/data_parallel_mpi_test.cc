// Note [Ranks that agree] across mpirun's processes (ctest runs it as 2 and 3 ranks): where
// one rank fails, every rank throws, the others naming it; where none does, none throws.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "collectives/mpi_test_main.h"
#include "remat/data_parallel.h"
#include "remat/errors.h"

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

}  // namespace
}  // namespace remat
