// Page-locked host memory for the host tier (Note [The host tier] in runtime/core): reserved
// from the device in chunks as it is needed, up to a capacity, kept for reuse until the pool
// goes, and cut into blocks by best fit. A block that a copy may still touch is freed behind
// an event and reused only once that event has completed.
//
//   remat::detail::PinnedHostPool pool(api, /*capacity=*/std::size_t{1} << 30);
//   void* host = pool.allocate(bytes);          // null: the capacity is used up
//   api->memcpy_async(host, device, bytes, remat::CudaCopy::kDeviceToHost, copy_stream);
//   api->event_record(done, copy_stream);
//   pool.deallocate(host, done);                // reused once `done` has completed
//
// See Note [A pinned pool] in pinned_host_pool.cc.
#ifndef REMAT_RUNTIME_CUDA_PINNED_HOST_POOL_H_
#define REMAT_RUNTIME_CUDA_PINNED_HOST_POOL_H_

#include <cstddef>
#include <deque>
#include <memory>
#include <vector>

#include "remat/cuda_api.h"
#include "runtime/alloc/detail/best_fit_pool.h"

namespace remat::detail {

class PinnedHostPool {
 public:
  static constexpr std::size_t kDefaultChunk = std::size_t{64} << 20;
  static constexpr std::size_t kAlignment = 512;
  PinnedHostPool(std::shared_ptr<CudaApi> api, std::size_t capacity,
                 std::size_t chunk = kDefaultChunk);
  ~PinnedHostPool();
  PinnedHostPool(const PinnedHostPool&) = delete;
  PinnedHostPool& operator=(const PinnedHostPool&) = delete;

  // A block of at least `bytes`, or null where the reserved chunks hold no such block and
  // reserving another would pass the capacity, even after waiting for the blocks freed
  // behind pending copies. Throws CudaError where a CUDA call fails.
  void* allocate(std::size_t bytes);
  // Frees `p` once `after` has completed (null: at once); the pool owns `after` from here.
  void deallocate(void* p, CudaEvent after);

  std::size_t reserved_bytes() const { return reserved_; }
  std::size_t chunks() const { return chunks_.size(); }

 private:
  struct PendingFree {
    void* p;
    CudaEvent after;
  };
  void* take(std::size_t size);
  bool reserve_chunk(std::size_t size);
  // Frees the pending blocks whose events have completed; with `wait`, waits for the oldest
  // first. Returns whether any block was freed.
  bool reclaim(bool wait);
  void free_block(void* p);

  std::shared_ptr<CudaApi> api_;
  std::size_t capacity_;
  std::size_t chunk_;
  std::size_t reserved_ = 0;
  BestFitPool pool_;
  std::vector<void*> chunks_;
  std::deque<PendingFree> pending_;
};

}  // namespace remat::detail

#endif  // REMAT_RUNTIME_CUDA_PINNED_HOST_POOL_H_
