#include "remat/segment_source.h"

#include <cstdlib>

namespace remat {
namespace {
constexpr std::size_t kAlignment = 256;
std::size_t align_up(std::size_t n) { return (n + kAlignment - 1) / kAlignment * kAlignment; }
}  // namespace

void* HostSegmentSource::reserve(std::size_t bytes) {
  return std::aligned_alloc(kAlignment, align_up(bytes == 0 ? 1 : bytes));
}

void HostSegmentSource::release(void* p, std::size_t /*bytes*/) { std::free(p); }

// Addresses only grow: a released range is never handed out again, so a stale pointer in a
// simulation can never alias a new segment.
void* SimulatedSegmentSource::reserve(std::size_t bytes) {
  const std::size_t size = align_up(bytes == 0 ? 1 : bytes);
  if (size > capacity_ - held_) return nullptr;
  held_ += size;
  void* p = reinterpret_cast<void*>(next_);
  next_ += size;
  return p;
}

void SimulatedSegmentSource::release(void* /*p*/, std::size_t bytes) {
  held_ -= align_up(bytes == 0 ? 1 : bytes);
}

}  // namespace remat
