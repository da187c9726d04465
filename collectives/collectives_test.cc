// The collectives of one process alone, and the argument checks every engine makes.
#include "remat/collectives.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <vector>

namespace remat {
namespace {

// The usage example atop remat/collectives.h, as written there.
TEST(SingleProcessCollectivesTest, HeaderExample) {
  std::unique_ptr<remat::Collectives> c = remat::single_process_collectives();
  std::vector<float> grad = {1.0f, 2.0f};
  absl::Status st = c->all_reduce_sum(grad);           // the ranks' sum, on every rank
  absl::StatusOr<std::int64_t> worst = c->all_max(0);  // agreeing on one outcome
  bool went_through = false;
  if (st.ok() && worst.ok() && *worst == 0) went_through = true;
  EXPECT_TRUE(went_through);
  EXPECT_EQ(grad, (std::vector<float>{1.0f, 2.0f}));
}

TEST(SingleProcessCollectivesTest, IsRankZeroOfOneAndLeavesItsSumAlone) {
  std::unique_ptr<Collectives> c = single_process_collectives();
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->size(), 1);
  EXPECT_EQ(c->engine(), "single process");
  std::vector<float> data = {1.5f, -2.0f, 3.25f};
  ASSERT_TRUE(c->all_reduce_sum(data).ok());
  EXPECT_EQ(data, (std::vector<float>{1.5f, -2.0f, 3.25f}));
  std::vector<float> all(3);
  ASSERT_TRUE(c->all_gather(data, all).ok());
  EXPECT_EQ(all, data);
  std::vector<std::byte> bytes(4, std::byte{7});
  EXPECT_TRUE(c->broadcast(bytes, 0).ok());
  EXPECT_EQ(*c->all_max(-5), -5);
}

TEST(SingleProcessCollectivesTest, NamesArgumentsThatDoNotFit) {
  std::unique_ptr<Collectives> c = single_process_collectives();
  std::vector<float> mine(3), all(4);
  const absl::Status gather = c->all_gather(mine, all);
  EXPECT_EQ(gather.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(gather.message().find("need 3 values, the output holds 4"), std::string::npos)
      << gather.message();
  std::vector<std::byte> bytes(2);
  const absl::Status root = c->broadcast(bytes, 1);
  EXPECT_EQ(root.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(root.message().find("root 1 is not a rank"), std::string::npos) << root.message();
  EXPECT_TRUE(check_all_gather(2, 6, 3).ok());
  EXPECT_FALSE(check_root(-1, 2).ok());
}

}  // namespace
}  // namespace remat
