#include "runtime/cuda/cuda_segment_source.h"

#include <stdexcept>
#include <utility>

#include "remat/errors.h"

namespace remat {
namespace {

std::size_t granules_for(std::size_t bytes, std::size_t granularity) {
  return (bytes + granularity - 1) / granularity;
}

}  // namespace

CudaSegmentSource::CudaSegmentSource(std::shared_ptr<CudaApi> api, int device)
    : api_(std::move(api)), device_(device) {
  if (api_ == nullptr) throw std::invalid_argument("CudaSegmentSource: no CudaApi");
}

void* CudaSegmentSource::reserve(std::size_t bytes) {
  void* p = nullptr;
  // A zero-byte cudaMalloc gives no address; one byte gives a distinct one, as the host does.
  const CudaResult r = api_->malloc(&p, bytes == 0 ? 1 : bytes);
  if (r.status == CudaStatus::kOutOfMemory) return nullptr;
  CudaError::check(r, "cudaMalloc", device_);
  return p;
}

void CudaSegmentSource::release(void* p, std::size_t /*bytes*/) {
  const CudaResult r = api_->free(p);
  CudaError::check(r, "cudaFree", device_);
}

// Note [Expandable segments through virtual memory]
// An expandable arena reserves one address range as large as its budget and grows and shrinks
// the memory behind its start (SegmentSource::commit_prefix). The range costs no device
// memory; each granule behind it is its own physical allocation, mapped by its own map()
// call, because the driver unmaps only whole mapped ranges: that is what lets a shrinking
// prefix give back any number of granules at its end. A reservation's backed granules are
// always [0, mapped), which is all this source records of it. Growth that runs out of memory
// is undone, so a refusal leaves the arena as it was; other errors throw with `mapped`
// counting what is really mapped, so that release still gives all of it back.

CudaVirtualSegmentSource::CudaVirtualSegmentSource(std::shared_ptr<CudaApi> api, int device,
                                                   std::size_t granularity)
    : api_(std::move(api)), device_(device), granularity_(granularity) {
  if (api_ == nullptr) throw std::invalid_argument("CudaVirtualSegmentSource: no CudaApi");
  if (granularity_ == 0) throw std::invalid_argument("CudaVirtualSegmentSource: granularity 0");
}

void* CudaVirtualSegmentSource::reserve(std::size_t bytes) {
  const std::size_t granules = granules_for(bytes == 0 ? 1 : bytes, granularity_);
  void* p = nullptr;
  const CudaResult r = api_->address_reserve(&p, granules * granularity_);
  if (r.status == CudaStatus::kOutOfMemory) return nullptr;
  CudaError::check(r, "cuMemAddressReserve", device_);
  reservations_[p] = {.granules = granules, .mapped = 0};
  return p;
}

void CudaVirtualSegmentSource::release(void* p, std::size_t /*bytes*/) {
  Reservation& r = find(p);
  shrink(p, r, 0);
  const CudaResult freed = api_->address_free(p, r.granules * granularity_);
  CudaError::check(freed, "cuMemAddressFree", device_);
  reservations_.erase(p);
}

bool CudaVirtualSegmentSource::commit_prefix(void* base, std::size_t bytes) {
  Reservation& r = find(base);
  const std::size_t target = granules_for(bytes, granularity_);
  if (target > r.granules) {
    throw std::invalid_argument("CudaVirtualSegmentSource: prefix beyond the reservation");
  }
  if (target > r.mapped) return grow(base, r, target);
  shrink(base, r, target);
  return true;
}

CudaVirtualSegmentSource::Reservation& CudaVirtualSegmentSource::find(void* base) {
  auto it = reservations_.find(base);
  if (it == reservations_.end()) {
    throw std::invalid_argument("CudaVirtualSegmentSource: not a reservation of this source");
  }
  return it->second;
}

char* CudaVirtualSegmentSource::granule(void* base, std::size_t i) const {
  return static_cast<char*>(base) + i * granularity_;
}

bool CudaVirtualSegmentSource::grow(void* base, Reservation& r, std::size_t target) {
  const std::size_t before = r.mapped;
  while (r.mapped < target) {
    const CudaResult m = api_->map(granule(base, r.mapped), granularity_, device_);
    if (m.status == CudaStatus::kOutOfMemory) {
      shrink(base, r, before);
      return false;
    }
    CudaError::check(m, "cuMemMap", device_);
    ++r.mapped;
  }
  return true;
}

void CudaVirtualSegmentSource::shrink(void* base, Reservation& r, std::size_t target) {
  while (r.mapped > target) {
    const CudaResult u = api_->unmap(granule(base, r.mapped - 1), granularity_);
    CudaError::check(u, "cuMemUnmap", device_);
    --r.mapped;
  }
}

std::unique_ptr<SegmentSource> make_cuda_segment_source(std::shared_ptr<CudaApi> api, int device,
                                                        bool expandable) {
  std::size_t granularity = 0;
  // Any failure of the query (a driver or device without virtual memory) means cudaMalloc:
  // expandable segments are an optimization, never a requirement.
  if (expandable && api != nullptr && api->vmm_granularity(device, &granularity).ok() &&
      granularity > 0) {
    return std::make_unique<CudaVirtualSegmentSource>(std::move(api), device, granularity);
  }
  return std::make_unique<CudaSegmentSource>(std::move(api), device);
}

}  // namespace remat
