// A memory resource that counts the sum of live allocation sizes against its budget, as the
// DTR simulator does: no rounding, no segments, no fragmentation. Memory comes from an
// optional upstream (host memory for the CPU backend); without one, addresses are fake.
//
//   remat::LogicalMemory mem(/*budget=*/1 << 20, /*host=*/false);
//   void* p = mem.allocate(1000);   // counts 1000 bytes
#ifndef REMAT_LOGICAL_MEMORY_H_
#define REMAT_LOGICAL_MEMORY_H_

#include <cstddef>
#include <cstdint>

#include "remat/memory_resource.h"

namespace remat {

class LogicalMemory final : public MemoryResource {
 public:
  LogicalMemory(std::size_t budget, bool host);
  MemoryStats stats() const override { return stats_; }
  void reset_peaks() override;
  std::size_t budget() const override { return budget_; }
  void set_budget(std::size_t budget) override { budget_ = budget; }
  std::size_t rounded_size(std::size_t bytes) const override { return bytes; }

 protected:
  void* do_allocate(std::size_t bytes) override;
  void do_deallocate(void* p, std::size_t bytes) override;

 private:
  std::size_t budget_;
  bool host_;
  std::uintptr_t next_fake_ = std::uintptr_t{1} << 44;
  MemoryStats stats_;
};

}  // namespace remat

#endif  // REMAT_LOGICAL_MEMORY_H_
