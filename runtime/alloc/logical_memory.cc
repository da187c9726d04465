#include "remat/logical_memory.h"

#include <algorithm>
#include <cstdlib>

#include "remat/errors.h"

namespace remat {

LogicalMemory::LogicalMemory(std::size_t budget, bool host) : budget_(budget), host_(host) {}

void LogicalMemory::reset_peaks() {
  stats_.peak_allocated = stats_.allocated;
  stats_.peak_reserved = stats_.reserved;
  stats_.peak_active_blocks = stats_.active_blocks;
}

void* LogicalMemory::do_allocate(std::size_t bytes) {
  while (bytes > budget_ || stats_.allocated > budget_ - bytes) {
    ++stats_.retries;
    ++stats_.reclaims;
    if (reclaimer() == nullptr || !reclaimer()->reclaim(bytes)) {
      ++stats_.ooms;
      OutOfMemoryInfo info;
      info.requested = bytes;
      info.budget = budget_;
      info.reserved = stats_.reserved;
      info.allocated = stats_.allocated;
      throw OutOfMemoryError(std::move(info));
    }
  }
  void* p;
  if (host_) {
    p = std::malloc(bytes == 0 ? 1 : bytes);
    if (p == nullptr) {
      OutOfMemoryInfo info;
      info.requested = bytes;
      info.budget = budget_;
      info.allocated = stats_.allocated;
      throw OutOfMemoryError(std::move(info));
    }
  } else {
    p = reinterpret_cast<void*>(next_fake_);
    next_fake_ += std::max<std::size_t>(bytes, 1);
  }
  stats_.allocated += bytes;
  stats_.requested += bytes;
  stats_.reserved = stats_.allocated;
  stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
  stats_.peak_reserved = stats_.peak_allocated;
  ++stats_.active_blocks;
  stats_.peak_active_blocks = std::max(stats_.peak_active_blocks, stats_.active_blocks);
  ++stats_.allocations;
  return p;
}

void LogicalMemory::do_deallocate(void* p, std::size_t bytes) {
  if (host_) std::free(p);
  stats_.allocated -= bytes;
  stats_.requested -= bytes;
  stats_.reserved = stats_.allocated;
  --stats_.active_blocks;
}

}  // namespace remat
