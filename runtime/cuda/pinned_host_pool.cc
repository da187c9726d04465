#include "runtime/cuda/pinned_host_pool.h"

#include <algorithm>
#include <utility>

#include "remat/errors.h"

namespace remat::detail {

// Note [A pinned pool]
// A copy between the device and pageable host memory cannot run beside the kernels: the
// driver stages it through page-locked memory of its own and returns only once it is done.
// So the host tier keeps its bytes in page-locked memory. Page-locking is slow (a
// cudaMallocHost of a few megabytes takes milliseconds, and pinning per tensor made
// offloading slower than recomputing in PyTorch's measurements), so the pool reserves
// chunks of at least `chunk` bytes the first time it needs them, never gives them back
// before it goes, and serves requests from them by best fit (BestFitPool, as the device
// allocator does). The host never reads or writes these bytes; only copies on the copy
// streams do, so a block may be handed out again only once the last copy that touched it
// has completed: its owner frees it behind the event recorded after that copy, and the pool
// reuses it once the event has completed (asked without waiting; waited for, oldest first,
// only where nothing else fits).
PinnedHostPool::PinnedHostPool(std::shared_ptr<CudaApi> api, std::size_t capacity,
                               std::size_t chunk)
    : api_(std::move(api)), capacity_(capacity), chunk_(std::max(chunk, kAlignment)) {}

PinnedHostPool::~PinnedHostPool() {
  for (const PendingFree& f : pending_) {
    api_->event_synchronize(f.after);
    api_->event_destroy(f.after);
  }
  for (void* c : chunks_) api_->free_host(c);
}

void* PinnedHostPool::allocate(std::size_t bytes) {
  const std::size_t size =
      (std::max<std::size_t>(bytes, 1) + kAlignment - 1) / kAlignment * kAlignment;
  if (void* p = take(size)) return p;
  if (reclaim(/*wait=*/false))
    if (void* p = take(size)) return p;
  if (reserve_chunk(size)) return take(size);
  while (reclaim(/*wait=*/true))
    if (void* p = take(size)) return p;
  return nullptr;
}

void PinnedHostPool::deallocate(void* p, CudaEvent after) {
  if (after == nullptr) {
    free_block(p);
    return;
  }
  pending_.push_back({p, after});
}

void* PinnedHostPool::take(std::size_t size) {
  Block* b = pool_.take_best_fit(size, /*small=*/false, [](const Block*) { return true; });
  if (b == nullptr) return nullptr;
  if (b->size - size >= kAlignment) pool_.insert_free(pool_.split(b, size));
  pool_.mark_live(b, size);
  return reinterpret_cast<void*>(b->address);
}

bool PinnedHostPool::reserve_chunk(std::size_t size) {
  const std::size_t left = capacity_ - std::min(reserved_, capacity_);
  const std::size_t bytes = std::max(size, std::min(chunk_, left));
  if (bytes > left) return false;
  void* c = nullptr;
  const CudaResult r = api_->malloc_host(&c, bytes);
  if (r.status == CudaStatus::kOutOfMemory) return false;
  CudaError::check(r, "cudaMallocHost");
  chunks_.push_back(c);
  reserved_ += bytes;
  Segment* s = pool_.add_segment(reinterpret_cast<std::uintptr_t>(c), bytes, /*small=*/false,
                                 /*whole=*/false);
  pool_.insert_free(s->first);
  return true;
}

bool PinnedHostPool::reclaim(bool wait) {
  if (pending_.empty()) return false;
  if (wait)
    CudaError::check(api_->event_synchronize(pending_.front().after), "cudaEventSynchronize");
  bool freed = false;
  for (auto it = pending_.begin(); it != pending_.end();) {
    const CudaResult r = api_->event_query(it->after);
    if (r.status == CudaStatus::kNotReady) {
      ++it;
      continue;
    }
    CudaError::check(r, "cudaEventQuery");
    CudaError::check(api_->event_destroy(it->after), "cudaEventDestroy");
    free_block(it->p);
    it = pending_.erase(it);
    freed = true;
  }
  return freed;
}

void PinnedHostPool::free_block(void* p) {
  Block* b = pool_.take_live(p);
  if (b != nullptr) pool_.coalesce(b);
}

}  // namespace remat::detail
