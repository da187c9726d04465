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
  // Keeps `bytes` for storage `s` (empty where kernels do not run: only the size counts),
  // whose copy to the host ends at `copied_at` on the clock.
  void put(Id s, std::size_t size, std::vector<unsigned char> bytes, double copied_at);
  bool contains(Id s) const { return entries_.contains(s); }
  double copied_at(Id s) const { return entries_.at(s).copied_at; }
  // Gives back what `put` kept for `s`, and frees its room.
  std::vector<unsigned char> take(Id s);
  void drop(Id s);  // `s` died on the host: its room is free again
  std::size_t used() const { return used_; }
  std::size_t peak() const { return peak_; }
  void reset_peak() { peak_ = used_; }

  // The copy engines, one each way (Note [Copies beside the kernels]): a copy of `price`
  // asked for at `now` starts when its engine is free, and this returns when it ends.
  double copy_to_host(double now, double price) { return queue(&to_host_free_at_, now, price); }
  double copy_to_device(double now, double price) { return queue(&to_device_free_at_, now, price); }

 private:
  struct Entry {
    std::size_t size = 0;
    std::vector<unsigned char> bytes;
    double copied_at = 0;
  };
  static double queue(double* free_at, double now, double price) {
    *free_at = (*free_at > now ? *free_at : now) + price;
    return *free_at;
  }
  double to_host_free_at_ = 0, to_device_free_at_ = 0;
  std::size_t capacity_;
  std::size_t used_ = 0;
  std::size_t peak_ = 0;
  absl::flat_hash_map<Id, Entry> entries_;
};

}  // namespace remat::detail

#endif  // REMAT_RUNTIME_CORE_HOST_TIER_H_
