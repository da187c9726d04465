// remat/host_link.h: the link between device and host memory that offloaded tensors cross,
// as both the runtime (RuntimeOptions::host_link) and the planners (PlanOptions::host_link)
// price it.
//
// Usage:
//   absl::StatusOr<remat::HostLink> link = remat::parse_host_link("pcie5");  // or "450"
//   if (!link.ok()) return link.status();
//   double ns = link->price(64 << 20);  // one way, 64 MiB
//
// A transfer of `bytes` one way takes latency_ns + bytes / bytes_per_ns (1 GB/s is one byte
// a nanosecond). Each direction is one copy engine: transfers one way run one after another,
// beside the kernels and beside transfers the other way.
#ifndef REMAT_HOST_LINK_H_
#define REMAT_HOST_LINK_H_

#include <absl/status/statusor.h>

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace remat {

struct HostLink {
  double bytes_per_ns = 50.0;
  double latency_ns = 5'000.0;
  static constexpr HostLink pcie5() { return {50.0, 5'000.0}; }        // PCIe Gen5 x16
  static constexpr HostLink nvlink_c2c() { return {450.0, 2'000.0}; }  // GH200's CPU-GPU link
  double price(std::size_t bytes) const {
    return latency_ns + static_cast<double>(bytes) / bytes_per_ns;
  }
};

// A link by name (host_link_names()) or by bandwidth each way in GB/s ("450", "12.5"); a
// bandwidth keeps PCIe Gen5's latency. Errors name the text and what is accepted.
absl::StatusOr<HostLink> parse_host_link(std::string_view text);
std::vector<std::string> host_link_names();

}  // namespace remat

#endif  // REMAT_HOST_LINK_H_
