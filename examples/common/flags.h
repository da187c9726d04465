// Reading a model's --name value flags into integers and floats, with errors that name the flag.
#ifndef REMAT_EXAMPLES_COMMON_FLAGS_H_
#define REMAT_EXAMPLES_COMMON_FLAGS_H_

#include <absl/status/status.h>
#include <absl/strings/numbers.h>

#include <map>
#include <string>
#include <type_traits>
#include <vector>

namespace remat::examples {

class FlagReader {
 public:
  explicit FlagReader(const std::map<std::string, std::string>& flags) : flags_(flags) {}
  template <class T>
  void read(const std::string& name, T& out, T min_value) {
    auto it = flags_.find(name);
    if (it == flags_.end()) return;
    used_.push_back(name);
    T v{};
    bool ok;
    if constexpr (std::is_floating_point_v<T>)
      ok = absl::SimpleAtof(it->second, &v);
    else
      ok = absl::SimpleAtoi(it->second, &v);
    if (!ok || v < min_value) {
      status_ = absl::InvalidArgumentError("bad value for --" + name + ": " + it->second);
      return;
    }
    out = v;
  }
  absl::Status finish() {
    if (!status_.ok()) return status_;
    for (const auto& [k, v] : flags_) {
      bool known = false;
      for (const std::string& u : used_) known |= u == k;
      if (!known) return absl::InvalidArgumentError("unknown flag --" + k);
    }
    return absl::OkStatus();
  }

 private:
  const std::map<std::string, std::string>& flags_;
  std::vector<std::string> used_;
  absl::Status status_;
};

}  // namespace remat::examples

#endif  // REMAT_EXAMPLES_COMMON_FLAGS_H_
