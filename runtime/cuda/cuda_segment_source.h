// Device memory for the caching allocator, through a CudaApi (include/remat/cuda_api.h):
// cudaMalloc segments, or, for expandable segments, address ranges backed granule by granule
// with CUDA virtual memory.
//
//   std::shared_ptr<remat::CudaApi> api = remat::cuda_runtime_api();
//   auto source = remat::make_cuda_segment_source(api, /*device=*/0, /*expandable=*/true);
//   // source->name() is "cuda-vmm", or "cuda" where the device has no virtual memory.
//
// Neither source sets the device: each assumes that the caller made `device` current (the
// runtime sets it, and restores the caller's, around everything it asks of the allocator).
// Neither is thread-safe; the allocator that owns one serializes its calls. A reservation
// still held when a source is destroyed is not given back.
#ifndef REMAT_RUNTIME_CUDA_CUDA_SEGMENT_SOURCE_H_
#define REMAT_RUNTIME_CUDA_CUDA_SEGMENT_SOURCE_H_

#include <absl/container/flat_hash_map.h>

#include <cstddef>
#include <memory>

#include "remat/cuda_api.h"
#include "remat/segment_source.h"

namespace remat {

// A segment is one cudaMalloc. The device running out of memory is a refusal (reserve returns
// nullptr: the allocator evicts, and reports a refusal below its budget as the device's);
// any other failure throws CudaError.
class CudaSegmentSource final : public SegmentSource {
 public:
  CudaSegmentSource(std::shared_ptr<CudaApi> api, int device);
  void* reserve(std::size_t bytes) override;
  void release(void* p, std::size_t bytes) override;
  const char* name() const override { return "cuda"; }
  bool host_accessible() const override { return false; }

 private:
  std::shared_ptr<CudaApi> api_;
  int device_;
};

// Expandable segments (Note [Expandable segments through virtual memory]): `reserve` takes an
// address range with no memory behind it, and `commit_prefix` maps or unmaps granules at its
// end so that exactly a prefix of it is backed.
class CudaVirtualSegmentSource final : public SegmentSource {
 public:
  // `granularity` is what `api->vmm_granularity(device)` reports (make_cuda_segment_source
  // asks for it).
  CudaVirtualSegmentSource(std::shared_ptr<CudaApi> api, int device, std::size_t granularity);
  // The range is rounded up to whole granules; nullptr where the address space is exhausted.
  void* reserve(std::size_t bytes) override;
  // Unmaps whatever of the range at `p` is mapped, then frees the range.
  void release(void* p, std::size_t bytes) override;
  const char* name() const override { return "cuda-vmm"; }
  bool host_accessible() const override { return false; }
  bool lazily_committed() const override { return true; }
  bool release_waits_for_device() const override { return false; }  // unmapping does not
  // Backs exactly the first round_up(bytes, granularity) bytes of the reservation at `base`.
  // False where the device is out of memory, with the reservation backed as it was before.
  bool commit_prefix(void* base, std::size_t bytes) override;
  std::size_t commit_granularity() const override { return granularity_; }

 private:
  struct Reservation {
    std::size_t granules = 0;  // the range's size
    std::size_t mapped = 0;    // granules [0, mapped) are backed
  };
  Reservation& find(void* base);
  char* granule(void* base, std::size_t i) const;
  // Map granules up to `target`; false (with the ones mapped here undone) on out-of-memory.
  bool grow(void* base, Reservation& r, std::size_t target);
  void shrink(void* base, Reservation& r, std::size_t target);

  std::shared_ptr<CudaApi> api_;
  int device_;
  std::size_t granularity_;
  absl::flat_hash_map<void*, Reservation> reservations_;
};

// The device memory source for `device`. With `expandable`, virtual memory where the api
// supports it there (vmm_granularity succeeds); elsewhere, and without `expandable`,
// cudaMalloc. The caller tells which it got from name(): "cuda-vmm" or "cuda".
std::unique_ptr<SegmentSource> make_cuda_segment_source(std::shared_ptr<CudaApi> api, int device,
                                                        bool expandable);

}  // namespace remat

#endif  // REMAT_RUNTIME_CUDA_CUDA_SEGMENT_SOURCE_H_
