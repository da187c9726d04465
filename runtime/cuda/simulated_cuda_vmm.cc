// The simulated device's virtual memory: reserved ranges, granules mapped and unmapped
// (SimulatedCuda's address_reserve, map, unmap), with the host pages behind them.
#include <sys/mman.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "runtime/cuda/simulated_cuda.h"
#include "runtime/cuda/simulated_cuda_internal.h"

namespace remat {

using namespace detail::simulated_cuda;  // NOLINT: the device's own helpers

// --- Virtual memory -------------------------------------------------------------------------

CudaResult SimulatedCuda::vmm_granularity(int device, std::size_t* granularity) {
  if (auto r = begin(SimulatedCall::kVmmGranularity)) return *r;
  if (granularity == nullptr) return invalid_value();
  if (!valid_device(device)) return invalid_device();
  *granularity = options_.granularity;
  return {};
}

CudaResult SimulatedCuda::address_reserve(void** p, std::size_t bytes) {
  if (auto r = begin(SimulatedCall::kAddressReserve)) return *r;
  const std::size_t g = options_.granularity;
  if (p == nullptr || bytes == 0 || bytes % g != 0) return invalid_value();
  // Address space only: the OS commits pages when they are touched.
  const std::size_t mapping_bytes = bytes + g;
  void* mapping = mmap(nullptr, mapping_bytes, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (mapping == MAP_FAILED) return out_of_memory();
  const std::uintptr_t base = round_up(address(mapping), g);
  reservations_[base] = {.bytes = bytes,
                         .mapping = mapping,
                         .mapping_bytes = mapping_bytes,
                         .granule_device = std::vector<int>(bytes / g, -1)};
  *p = reinterpret_cast<void*>(base);
  return {};
}

CudaResult SimulatedCuda::address_free(void* p, std::size_t bytes) {
  if (auto r = begin(SimulatedCall::kAddressFree)) return *r;
  auto it = reservations_.find(address(p));
  if (it == reservations_.end() || it->second.bytes != bytes) return invalid_value();
  const std::vector<int>& devices = it->second.granule_device;
  // CUDA requires the range to be unmapped before its addresses are freed.
  if (std::any_of(devices.begin(), devices.end(), [](int d) { return d >= 0; })) {
    return invalid_value();
  }
  munmap(it->second.mapping, it->second.mapping_bytes);
  reservations_.erase(it);
  return {};
}

const SimulatedCuda::Reservation* SimulatedCuda::find_reservation(std::uintptr_t a,
                                                                  std::uintptr_t* base) const {
  auto it = containing(reservations_, a);
  if (it == reservations_.end()) return nullptr;
  *base = it->first;
  return &it->second;
}

// The reservation that holds the granularity-aligned range [p, p + bytes), and the range's
// granules; null where there is none.
SimulatedCuda::Reservation* SimulatedCuda::granules(void* p, std::size_t bytes, std::size_t* first,
                                                    std::size_t* count) {
  const std::size_t g = options_.granularity;
  if (bytes == 0 || bytes % g != 0 || address(p) % g != 0) return nullptr;
  auto it = containing(reservations_, address(p));
  if (it == reservations_.end() || address(p) + bytes > it->first + it->second.bytes) {
    return nullptr;
  }
  *first = (address(p) - it->first) / g;
  *count = bytes / g;
  return &it->second;
}

CudaResult SimulatedCuda::map(void* p, std::size_t bytes, int device) {
  if (auto r = begin(SimulatedCall::kMap)) return *r;
  if (!valid_device(device)) return invalid_device();
  std::size_t first = 0, count = 0;
  Reservation* r = granules(p, bytes, &first, &count);
  if (r == nullptr) return invalid_value();
  auto granule = r->granule_device.begin() + first;
  if (std::any_of(granule, granule + count, [](int d) { return d >= 0; })) {
    return invalid_value();  // already mapped
  }
  advance(options_.map_ns + static_cast<double>(count) * options_.map_ns_per_granule);
  if (!fits(device, bytes)) return out_of_memory();
  std::fill(granule, granule + count, device);
  used_[device] += bytes;
  return {};
}

CudaResult SimulatedCuda::unmap(void* p, std::size_t bytes) {
  if (auto r = begin(SimulatedCall::kUnmap)) return *r;
  std::size_t first = 0, count = 0;
  Reservation* r = granules(p, bytes, &first, &count);
  if (r == nullptr) return invalid_value();
  auto granule = r->granule_device.begin() + first;
  if (std::any_of(granule, granule + count, [](int d) { return d < 0; })) {
    return invalid_value();  // not mapped
  }
  for (auto it = granule; it != granule + count; ++it) {
    used_[*it] -= options_.granularity;
    *it = -1;
  }
  // The physical memory is gone: a later map gets fresh (zero) pages.
  madvise(p, bytes, MADV_DONTNEED);
  // cuMemUnmap does not wait for the device: work still pending on the range loses its
  // memory (Note [Race detection]).
  const std::uintptr_t lo = address(p), hi = lo + bytes;
  for (auto& [key, item] : pending_) {
    for (const Access& a : item.accesses) {
      if (!overlap(a.begin, a.end, lo, hi)) continue;
      item.skip_body = true;
      invalid_accesses_.push_back(
          {.item = item.id,
           .stream = item.stream,
           .p = pointer(std::max(a.begin, lo)),
           .bytes = std::min(a.end, hi) - std::max(a.begin, lo),
           .write = a.write,
           .start = item.start,
           .what = absl::StrCat(describe(item), " was pending when its memory at 0x",
                                absl::Hex(std::max(a.begin, lo)), " was unmapped")});
    }
  }
  advance(options_.unmap_ns);  // after the unmap took effect: pending work did not finish first
  return {};
}

}  // namespace remat
