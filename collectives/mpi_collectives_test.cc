// The MPI collectives, run by ctest as mpirun's processes (2 and 3 ranks): every rank checks
// the results against what it computes alone from every rank's inputs, which derive from the
// rank. A rank whose check fails makes mpirun fail; one that skips a collective leaves the
// others waiting until ctest's timeout.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "collectives/mpi_test_main.h"

namespace remat {
namespace {

Collectives& world() { return testing::mpi_test_world(); }

// Rank `rank`'s n values for round `round`: magnitudes from 2^-20 to 2^20, so that the order
// of a sum changes its bits.
std::vector<float> inputs(int rank, std::size_t n, int round) {
  std::mt19937 rng(static_cast<unsigned>(1000 * round + rank));
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-20, 20);
  std::vector<float> v(n);
  for (float& x : v) x = std::ldexp(unit(rng), exponent(rng));
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(MpiCollectivesTest, HasTheRanksMpirunStarted) {
  EXPECT_EQ(world().engine(), "mpi");
  if (const char* expect = std::getenv("REMAT_EXPECT_RANKS")) {
    EXPECT_EQ(world().size(), std::atoi(expect));
  }
  EXPECT_GE(world().rank(), 0);
  EXPECT_LT(world().rank(), world().size());
}

// Note [Sums in rank order]: lengths shorter than the ranks, uneven slices, and long ones.
TEST(MpiCollectivesTest, SumsEveryElementInRankOrderOnEveryRank) {
  int round = 0;
  bool order_mattered = false;
  for (std::size_t n : {0u, 1u, 2u, 7u, 1000u, 100003u}) {
    SCOPED_TRACE("n = " + std::to_string(n));
    std::vector<float> data = inputs(world().rank(), n, ++round);
    std::vector<float> want = inputs(0, n, round), reversed = inputs(world().size() - 1, n, round);
    for (int r = 1; r < world().size(); ++r) {
      const std::vector<float> x = inputs(r, n, round);
      for (std::size_t i = 0; i < n; ++i) want[i] += x[i];
    }
    for (int r = world().size() - 2; r >= 0; --r) {
      const std::vector<float> x = inputs(r, n, round);
      for (std::size_t i = 0; i < n; ++i) reversed[i] += x[i];
    }
    order_mattered |= !same_bits(want, reversed);
    ASSERT_TRUE(world().all_reduce_sum(data).ok());
    EXPECT_TRUE(same_bits(data, want));
  }
  if (world().size() > 2) {
    EXPECT_TRUE(order_mattered) << "the inputs cannot tell orders apart";
  }
}

TEST(MpiCollectivesTest, GathersBroadcastsAndAgreesOnTheLargest) {
  const std::vector<float> mine = inputs(world().rank(), 5, 99);
  std::vector<float> all(5 * static_cast<std::size_t>(world().size()));
  ASSERT_TRUE(world().all_gather(mine, all).ok());
  for (int r = 0; r < world().size(); ++r)
    EXPECT_TRUE(same_bits(std::vector<float>(all.begin() + 5 * r, all.begin() + 5 * r + 5),
                          inputs(r, 5, 99)))
        << "rank " << r << "'s values";
  const int root = world().size() - 1;
  std::vector<std::byte> bytes(3, std::byte{static_cast<unsigned char>(world().rank())});
  ASSERT_TRUE(world().broadcast(bytes, root).ok());
  for (std::byte b : bytes) EXPECT_EQ(static_cast<int>(b), root);
  absl::StatusOr<std::int64_t> largest = world().all_max(10 * world().rank() - 7);
  ASSERT_TRUE(largest.ok()) << largest.status();
  EXPECT_EQ(*largest, 10 * (world().size() - 1) - 7);
}

TEST(MpiCollectivesTest, RefusesArgumentsThatDoNotFitOnEveryRank) {
  std::vector<float> mine(2), all(3);
  EXPECT_EQ(world().all_gather(mine, all).code(), absl::StatusCode::kInvalidArgument);
  std::vector<std::byte> bytes(1);
  EXPECT_EQ(world().broadcast(bytes, world().size()).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace remat
