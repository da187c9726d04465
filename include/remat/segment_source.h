// Where a caching allocator gets its memory from: big segments, reserved and released whole.
//
//   auto host = std::make_unique<remat::HostSegmentSource>();        // real host memory
//   auto sim  = std::make_unique<remat::SimulatedSegmentSource>();   // addresses only
//   remat::CachingAllocator alloc(std::move(sim), {.budget = 1 << 30});
//
// `reserve` returns nullptr when the source itself is out of memory; the caller decides
// whether that is an error. Addresses from a simulated source must never be dereferenced.
#ifndef REMAT_SEGMENT_SOURCE_H_
#define REMAT_SEGMENT_SOURCE_H_

#include <cstddef>
#include <cstdint>
#include <memory>

namespace remat {

class SegmentSource {
 public:
  virtual ~SegmentSource() = default;
  virtual void* reserve(std::size_t bytes) = 0;
  virtual void release(void* p, std::size_t bytes) = 0;
  virtual const char* name() const = 0;
  // True where the memory can be read and written by the host.
  virtual bool host_accessible() const = 0;
  // True where a reservation costs nothing until its pages are used, so that an allocator can
  // reserve a large range once and count only the part it hands out (expandable arena).
  virtual bool lazily_committed() const { return false; }
  // For a lazily committed reservation at `base`: makes its first `bytes` usable, backing or
  // unbacking what lies beyond the prefix it had (CUDA's virtual memory maps and unmaps
  // physical pages there; host and simulated memory need nothing). Returns false where the
  // device refused the memory. `bytes` is a multiple of `commit_granularity()`.
  virtual bool commit_prefix(void* /*base*/, std::size_t /*bytes*/) { return true; }
  virtual std::size_t commit_granularity() const { return 1; }
  // False where `release` (and unbacking by commit_prefix) gives memory back at once, without
  // waiting for device work queued on it (CUDA's unmap; cudaFree waits): the caller must wait
  // for the work that used it first.
  virtual bool release_waits_for_device() const { return true; }
};

// Host memory, 256-byte aligned (the alignment cudaMalloc gives).
class HostSegmentSource final : public SegmentSource {
 public:
  void* reserve(std::size_t bytes) override;
  void release(void* p, std::size_t bytes) override;
  const char* name() const override { return "host"; }
  bool host_accessible() const override { return true; }
  bool lazily_committed() const override { return true; }  // the OS maps pages on first touch
};

// A simulated address space: distinct, aligned addresses and no memory behind them. Used to
// replay recorded steps through the real allocator on machines with no accelerator.
class SimulatedSegmentSource final : public SegmentSource {
 public:
  explicit SimulatedSegmentSource(std::size_t capacity = SIZE_MAX) : capacity_(capacity) {}
  void* reserve(std::size_t bytes) override;
  void release(void* p, std::size_t bytes) override;
  const char* name() const override { return "simulated"; }
  bool host_accessible() const override { return false; }
  bool lazily_committed() const override { return true; }

 private:
  std::size_t capacity_;
  std::size_t held_ = 0;
  std::uintptr_t next_ = std::uintptr_t{1} << 40;
};

// Device memory (cudaMalloc, or CUDA virtual memory for expandable segments) is in
// runtime/cuda/cuda_segment_source.h.

}  // namespace remat

#endif  // REMAT_SEGMENT_SOURCE_H_
