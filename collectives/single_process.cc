// The collectives of one process alone (remat/collectives.h), and the checks every engine
// makes of its arguments.
#include <absl/strings/str_cat.h>

#include <algorithm>

#include "remat/collectives.h"

namespace remat {

absl::Status check_all_gather(std::size_t mine, std::size_t all, int ranks) {
  if (all != mine * static_cast<std::size_t>(ranks))
    return absl::InvalidArgumentError(absl::StrCat("all_gather: ", ranks, " ranks of ", mine,
                                                   " values need ", mine * ranks,
                                                   " values, the output holds ", all));
  return absl::OkStatus();
}

absl::Status check_root(int root, int ranks) {
  if (root < 0 || root >= ranks)
    return absl::InvalidArgumentError(
        absl::StrCat("broadcast: root ", root, " is not a rank (there are ", ranks, ")"));
  return absl::OkStatus();
}

namespace {

class SingleProcess final : public Collectives {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string engine() const override { return "single process"; }
  absl::Status all_reduce_sum(std::span<float>) override { return absl::OkStatus(); }
  absl::Status all_gather(std::span<const float> mine, std::span<float> all) override {
    if (absl::Status st = check_all_gather(mine.size(), all.size(), 1); !st.ok()) return st;
    std::copy(mine.begin(), mine.end(), all.begin());
    return absl::OkStatus();
  }
  absl::Status broadcast(std::span<std::byte>, int root) override { return check_root(root, 1); }
  absl::StatusOr<std::int64_t> all_max(std::int64_t value) override { return value; }
};

}  // namespace

std::unique_ptr<Collectives> single_process_collectives() {
  return std::make_unique<SingleProcess>();
}

}  // namespace remat
