// The host tier: the bytes of storages moved off the device (Runtime::offload), in host
// memory, within a capacity. Internal to the runtime; see Note [The host tier] in
// host_tier.cc.
#ifndef REMAT_RUNTIME_CORE_HOST_TIER_H_
#define REMAT_RUNTIME_CORE_HOST_TIER_H_

#include <absl/container/flat_hash_map.h>

#include <cstddef>
#include <memory>
#include <vector>

#include "runtime/core/lineage.h"
#include "runtime/cuda/cuda_host_copies.h"

namespace remat::detail {

class HostTier {
 public:
  explicit HostTier(std::size_t capacity) : capacity_(capacity) {}

  // On the CUDA backend the bytes go to a pinned pool over copy streams of their own
  // (Note [Copy streams] in runtime/cuda/cuda_host_copies.cc); in plain memory elsewhere.
  void use_cuda(std::shared_ptr<CudaApi> api, CudaStream compute);

  bool has_room(std::size_t bytes) const { return bytes <= capacity_ - used_; }
  // Begins copying storage `s`'s `size` bytes at `src` to the host (null where kernels do
  // not run: only the size counts), a copy of `price` asked for at `now` on the copy engine
  // to the host; false where the pinned pool has no room left.
  bool put(Id s, const void* src, std::size_t size, double now, double price);
  bool contains(Id s) const { return entries_.contains(s); }
  double copied_at(Id s) const { return entries_.at(s).copied_at; }
  // Begins copying `s`'s bytes back into `dst` (null: none), and frees its room.
  void take(Id s, void* dst);
  void drop(Id s);  // `s` died on the host, or its device bytes change: its room is free
  // CUDA: the runtime's stream waits for `s`'s copies in flight (before its device memory is
  // freed or moved, or a kernel reads it); nothing elsewhere, where copies end at once.
  void order_compute_after(Id s) {
    if (cuda_copies_) cuda_copies_->order_compute_after(s);
  }
  std::size_t used() const { return used_; }
  std::size_t peak() const { return peak_; }
  void reset_peak() { peak_ = used_; }

  // The copy engines, one each way (Note [Copies beside the kernels]): a copy of `price`
  // asked for at `now` starts when its engine is free, and this returns when it ends.
  double copy_to_host(double now, double price) { return queue(&to_host_free_at_, now, price); }
  double copy_to_device(double now, double price) { return queue(&to_device_free_at_, now, price); }
  // Moves every time it holds `by` earlier: the runtime's clock was set back by that much
  // (Note [Each step's own clock]).
  void shift_times(double by) {
    to_host_free_at_ -= by;
    to_device_free_at_ -= by;
    for (auto& [id, entry] : entries_) entry.copied_at -= by;
  }

 private:
  struct Entry {
    std::size_t size = 0;
    std::vector<unsigned char> bytes;  // in plain memory (not on CUDA)
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
  std::unique_ptr<CudaHostCopies> cuda_copies_;
};

}  // namespace remat::detail

#endif  // REMAT_RUNTIME_CORE_HOST_TIER_H_
