// The host tier's copies on the CUDA backend: a storage's bytes copied into the pinned pool
// and back on two copy streams of their own, one each way, ordered against the runtime's
// stream with events (Note [Copy streams] in cuda_host_copies.cc). Storages are named by the
// caller's keys.
//
//   remat::detail::CudaHostCopies copies(api, compute_stream, /*capacity=*/bytes);
//   if (copies.copy_out(key, device_ptr, bytes)) {   // begins after the kernels so far
//     copies.order_compute_after(key);                // before device_ptr is freed
//     ...
//     copies.copy_in(key, new_device_ptr);            // begins after the kernels so far
//     copies.order_compute_after(key);                // before a kernel reads it
//   }
#ifndef REMAT_RUNTIME_CUDA_CUDA_HOST_COPIES_H_
#define REMAT_RUNTIME_CUDA_CUDA_HOST_COPIES_H_

#include <absl/container/flat_hash_map.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "remat/cuda_api.h"
#include "runtime/cuda/pinned_host_pool.h"

namespace remat::detail {

class CudaHostCopies {
 public:
  CudaHostCopies(std::shared_ptr<CudaApi> api, CudaStream compute, std::size_t capacity);
  ~CudaHostCopies();
  CudaHostCopies(const CudaHostCopies&) = delete;
  CudaHostCopies& operator=(const CudaHostCopies&) = delete;

  // Begins copying `bytes` at device `src` into pinned memory for `key`, after the work the
  // compute stream has so far; false where the pool has no room (nothing is copied).
  bool copy_out(std::uint64_t key, const void* src, std::size_t bytes);
  // Begins copying `key`'s host bytes into device `dst`, after the work the compute stream
  // has so far (which made `dst` free) and after the copy out; the pinned block is reused
  // once the copy has completed.
  void copy_in(std::uint64_t key, void* dst);
  // The compute stream waits for `key`'s copies in flight: before device memory a copy out
  // reads is freed or written, and before a kernel reads what a copy in writes.
  void order_compute_after(std::uint64_t key);
  // `key`'s host bytes are no longer wanted; the compute stream is ordered after the copy
  // out first (the device bytes may be written or freed next).
  void drop(std::uint64_t key);
  bool holds(std::uint64_t key) const;

  CudaStream to_host_stream() const { return to_host_; }
  CudaStream to_device_stream() const { return to_device_; }
  std::size_t pinned_bytes() const { return pool_.reserved_bytes(); }

 private:
  struct Entry {
    void* host = nullptr;  // in the pool while the bytes are on the host
    std::size_t bytes = 0;
    CudaEvent copied_out = nullptr;  // recorded after the copy out (on to_host_)
    CudaEvent copied_in = nullptr;   // recorded after the copy in (on to_device_)
    bool compute_after_out = false;  // the compute stream already waits for copied_out
  };
  CudaEvent record(CudaStream stream);
  void wait(CudaStream stream, CudaEvent event);
  // `stream` waits for the work the compute stream has so far.
  void after_compute(CudaStream stream);
  void forget_if_idle(std::uint64_t key);

  std::shared_ptr<CudaApi> api_;
  CudaStream compute_;
  CudaStream to_host_ = nullptr;
  CudaStream to_device_ = nullptr;
  PinnedHostPool pool_;
  absl::flat_hash_map<std::uint64_t, Entry> entries_;
};

}  // namespace remat::detail

#endif  // REMAT_RUNTIME_CUDA_CUDA_HOST_COPIES_H_
