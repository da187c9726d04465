// CachingAllocator forwards to its core (runtime/alloc/detail/allocator_core.h), which
// composes the parts: the best-fit pool, the expandable arena, stream-ordered frees and the
// step placement.
#include "remat/caching_allocator.h"

#include <utility>

#include "runtime/alloc/detail/allocator_core.h"

namespace remat {

CachingAllocator::CachingAllocator(std::unique_ptr<SegmentSource> source,
                                   CachingAllocatorOptions options)
    : core_(std::make_unique<detail::AllocatorCore>(std::move(source), options)) {}

CachingAllocator::~CachingAllocator() = default;

void* CachingAllocator::do_allocate(std::size_t bytes) {
  return core_->allocate(bytes, reclaimer());
}
void CachingAllocator::do_deallocate(void* p, std::size_t /*bytes*/) { core_->deallocate(p); }

MemoryStats CachingAllocator::stats() const { return core_->stats(); }
void CachingAllocator::reset_peaks() { core_->reset_peaks(); }
std::size_t CachingAllocator::budget() const { return core_->budget(); }
void CachingAllocator::set_budget(std::size_t budget) { core_->set_budget(budget); }
std::size_t CachingAllocator::rounded_size(std::size_t bytes) const {
  return core_->rounded_size(bytes);
}
void CachingAllocator::release_cached() { core_->release_cached(); }

void CachingAllocator::use_stream(CudaApi* api, CudaStream stream) {
  core_->use_stream(api, stream);
}
void CachingAllocator::record_stream(const void* p, CudaStream stream) {
  core_->record_stream(p, stream);
}
void CachingAllocator::synchronize_pending() { core_->synchronize_pending(); }
std::size_t CachingAllocator::largest_free_block() const { return core_->largest_free_block(); }
const SegmentSource& CachingAllocator::source() const { return core_->source(); }

void CachingAllocator::record_allocations() { core_->placement().record_allocations(); }
AllocationSequence CachingAllocator::take_allocations() {
  return core_->placement().take_allocations();
}
bool CachingAllocator::begin_placement(std::shared_ptr<const Placement> placement) {
  return core_->begin_placement(std::move(placement));
}
void CachingAllocator::end_placement() { core_->end_placement(); }
std::optional<CachingAllocator::PlacementOutcome> CachingAllocator::last_placement() const {
  return core_->placement().outcome;
}
void CachingAllocator::pause_placement(bool paused, bool short_lived) {
  core_->placement().pause(paused, short_lived);
}

}  // namespace remat
