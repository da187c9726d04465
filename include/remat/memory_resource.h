// The allocation interface every remat memory resource implements, in the manner of RMM's
// device_memory_resource: `allocate` either returns memory or throws OutOfMemoryError.
//
//   remat::CachingAllocator alloc(std::make_unique<remat::HostSegmentSource>(),
//                                 {.budget = 64 << 20});
//   void* p = alloc.allocate(1000);
//   alloc.deallocate(p, 1000);
//
// A resource that runs out asks its `MemoryReclaimer` (the runtime, which evicts tensors) to
// free memory before it gives up.
#ifndef REMAT_MEMORY_RESOURCE_H_
#define REMAT_MEMORY_RESOURCE_H_

#include <cstddef>
#include <cstdint>

namespace remat {

struct MemoryStats {
  std::size_t allocated = 0;  // bytes in live allocations (rounded sizes)
  std::size_t peak_allocated = 0;
  std::size_t requested = 0;  // bytes the callers asked for, live
  std::size_t reserved = 0;   // bytes held from the segment source (never above budget)
  std::size_t peak_reserved = 0;
  std::size_t active_blocks = 0;  // live allocations
  std::size_t peak_active_blocks = 0;
  std::size_t segments = 0;
  // Reservations from the segment source and returns to it (on CUDA: cudaMalloc and cudaFree,
  // each a stall of the device), the expandable arena's growth and shrinking included.
  std::size_t segment_reserves = 0;
  std::size_t segment_releases = 0;
  std::size_t allocations = 0;  // allocate calls served
  std::size_t retries = 0;      // times the resource had to release caches or reclaim
  std::size_t reclaims = 0;     // reclaim requests sent to the reclaimer
  std::size_t ooms = 0;
  // Reservations the segment source refused although the budget had room for them (on CUDA:
  // cudaMalloc failed below the budget, because the device has less free memory than that).
  std::size_t source_refusals = 0;
  // Frees whose reuse waited on other streams' work (Note [Stream-ordered reuse] in
  // stream_ordered_frees.cc): all of them, those still waiting, and the times the allocator
  // had to block on such work because it needed the memory.
  std::size_t deferred_frees = 0;
  std::size_t pending_frees = 0;
  std::size_t stream_waits = 0;
  // Requests served at a placement's offset, and placements abandoned: a step whose requests
  // left the traced sequence, whose arena the budget had no room for, or where a request
  // the placement does not place found no room outside it (Note [Placed allocations] in
  // step_placement.cc).
  std::size_t placed_allocations = 0;
  std::size_t placement_misses = 0;
  // 1 - peak allocated / peak reserved: the share of the peak reservation that never held data.
  double fragmentation() const {
    return peak_reserved == 0
               ? 0.0
               : 1.0 - static_cast<double>(peak_allocated) / static_cast<double>(peak_reserved);
  }
};

// Called by a resource that cannot serve a request. Returns true when it freed something, so
// that the request is worth retrying; false when nothing more can be freed.
class MemoryReclaimer {
 public:
  virtual ~MemoryReclaimer() = default;
  virtual bool reclaim(std::size_t bytes) = 0;
};

class MemoryResource {
 public:
  virtual ~MemoryResource() = default;
  MemoryResource() = default;
  MemoryResource(const MemoryResource&) = delete;
  MemoryResource& operator=(const MemoryResource&) = delete;

  // Returns at least `bytes` bytes (a distinct, non-null pointer even for 0 bytes), or throws
  // OutOfMemoryError once the reclaimer can free nothing more.
  void* allocate(std::size_t bytes) { return do_allocate(bytes); }
  void deallocate(void* p, std::size_t bytes) { do_deallocate(p, bytes); }

  virtual MemoryStats stats() const = 0;
  virtual void reset_peaks() = 0;
  virtual std::size_t budget() const = 0;
  // Lowering the budget below what is reserved releases cached segments; it never fails.
  virtual void set_budget(std::size_t budget) = 0;
  // The size an allocation of `bytes` really takes (after rounding).
  virtual std::size_t rounded_size(std::size_t bytes) const = 0;
  void set_reclaimer(MemoryReclaimer* reclaimer) { reclaimer_ = reclaimer; }

 protected:
  virtual void* do_allocate(std::size_t bytes) = 0;
  virtual void do_deallocate(void* p, std::size_t bytes) = 0;
  MemoryReclaimer* reclaimer() const { return reclaimer_; }

 private:
  MemoryReclaimer* reclaimer_ = nullptr;
};

}  // namespace remat

#endif  // REMAT_MEMORY_RESOURCE_H_
