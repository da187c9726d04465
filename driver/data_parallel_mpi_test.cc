// Note [Ranks that agree] across mpirun's processes (ctest runs it as 2 and 3 ranks): where
// one rank fails, every rank throws, the others naming it; where none does, none throws.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>

#include "remat/data_parallel.h"
#include "remat/errors.h"
#include "remat/mpi_collectives.h"

namespace remat {
namespace {

Collectives* world = nullptr;

std::exception_ptr out_of_memory_in(const std::string& op) {
  OutOfMemoryInfo info;
  info.op = op;
  info.requested = 4096;
  info.budget = 1 << 20;
  return std::make_exception_ptr(OutOfMemoryError(info));
}

TEST(DataParallelMpiTest, NoRankFailedAndNoneThrows) {
  EXPECT_NO_THROW(agree_on_step(*world, nullptr));
}

TEST(DataParallelMpiTest, AnOutOfMemoryOnTheLastRankIsThrownOnEveryRank) {
  const int last = world->size() - 1;
  const bool fails = world->rank() == last;
  try {
    agree_on_step(*world, fails ? out_of_memory_in("matmul") : nullptr);
    ADD_FAILURE() << "rank " << world->rank() << " went on";
  } catch (const OutOfMemoryError& e) {
    EXPECT_EQ(e.budget(), std::size_t{1} << 20);
    EXPECT_EQ(e.requested(), 4096u);
    const std::string want = fails ? "matmul" : "matmul on rank " + std::to_string(last);
    EXPECT_EQ(e.info().op, want);
  }
}

TEST(DataParallelMpiTest, TheLowestFailingRankIsNamed) {
  const bool fails = world->rank() >= 1;
  try {
    agree_on_step(*world, fails ? std::make_exception_ptr(std::runtime_error(
                                      "kernel failed on " + std::to_string(world->rank())))
                                : nullptr);
    ADD_FAILURE() << "rank " << world->rank() << " went on";
  } catch (const std::runtime_error& e) {
    const std::string want =
        fails ? "kernel failed on " + std::to_string(world->rank()) : "rank 1: kernel failed on 1";
    EXPECT_EQ(std::string(e.what()), want);
  }
  EXPECT_NO_THROW(agree_on_step(*world, nullptr)) << "the ranks are still in step";
}

}  // namespace
}  // namespace remat

int main(int argc, char** argv) {
  absl::StatusOr<std::unique_ptr<remat::Collectives>> c = remat::mpi_collectives(&argc, &argv);
  if (!c.ok()) {
    std::fprintf(stderr, "data_parallel_mpi_test: %s\n", std::string(c.status().message()).c_str());
    return 1;
  }
  remat::world = c->get();
  ::testing::InitGoogleTest(&argc, argv);
  const int failed = RUN_ALL_TESTS();
  c->reset();
  return failed;
}
