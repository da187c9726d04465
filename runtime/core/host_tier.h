// The host tier: the bytes of storages moved off the device (Runtime::offload), in host
// memory, within a capacity. Internal to the runtime; see Note [The host tier] in
// host_tier.cc.
#ifndef REMAT_RUNTIME_CORE_HOST_TIER_H_
#define REMAT_RUNTIME_CORE_HOST_TIER_H_

#include <absl/container/flat_hash_map.h>

#include <cstddef>
#include <vector>

#include "runtime/core/lineage.h"

namespace remat::detail {

class HostTier {
 public:
  explicit HostTier(std::size_t capacity) : capacity_(capacity) {}

  bool has_room(std::size_t bytes) const { return bytes <= capacity_ - used_; }
  // Keeps `bytes` for storage `s` (empty where kernels do not run: only the size counts).
  void put(Id s, std::size_t size, std::vector<unsigned char> bytes);
  // Gives back what `put` kept for `s`, and frees its room.
  std::vector<unsigned char> take(Id s);
  void drop(Id s);  // `s` died on the host: its room is free again
  std::size_t used() const { return used_; }
  std::size_t peak() const { return peak_; }
  void reset_peak() { peak_ = used_; }

 private:
  struct Entry {
    std::size_t size = 0;
    std::vector<unsigned char> bytes;
  };
  std::size_t capacity_;
  std::size_t used_ = 0;
  std::size_t peak_ = 0;
  absl::flat_hash_map<Id, Entry> entries_;
};

}  // namespace remat::detail

#endif  // REMAT_RUNTIME_CORE_HOST_TIER_H_
