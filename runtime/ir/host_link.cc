// Host links by name or bandwidth (remat/host_link.h).
#include "remat/host_link.h"

#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>

#include <cmath>

namespace remat {

std::vector<std::string> host_link_names() { return {"pcie5", "nvlink_c2c"}; }

absl::StatusOr<HostLink> parse_host_link(std::string_view text) {
  if (text == "pcie5") return HostLink::pcie5();
  if (text == "nvlink_c2c") return HostLink::nvlink_c2c();
  double gbps = 0;
  if (!absl::SimpleAtod(std::string(text), &gbps) || !std::isfinite(gbps) || gbps <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "host link '", std::string(text), "' is neither a bandwidth in GB/s above 0 nor one of ",
        absl::StrJoin(host_link_names(), ", ")));
  }
  HostLink link = HostLink::pcie5();
  link.bytes_per_ns = gbps;
  return link;
}

}  // namespace remat
