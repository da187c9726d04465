#include "pytorch/detail/cpu_allocator_bridge.h"

#include <absl/container/flat_hash_map.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <cstring>
#include <iterator>
#include <mutex>

namespace remat::torch_backend::detail {

std::size_t ScratchArena::take(std::size_t bytes) {
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < bytes) continue;
    const std::size_t offset = it->first;
    const std::size_t left = it->second - bytes;
    free_.erase(it);
    if (left > 0) free_.emplace(offset + bytes, left);
    return offset;
  }
  const std::size_t offset = top_;
  top_ += bytes;
  extent_ = std::max(extent_, top_);
  return offset;
}

void ScratchArena::give_back(std::size_t offset, std::size_t bytes) {
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && offset + bytes == next->first) {
    bytes += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      offset = prev->first;
      bytes += prev->second;
      free_.erase(prev);
    }
  }
  if (offset + bytes == top_) {
    top_ = offset;
  } else {
    free_.emplace(offset, bytes);
  }
}

namespace {

thread_local KernelMemory* current_memory = nullptr;
// How the allocator the bridge stands in front of frees what raw_allocate gave out.
c10::DeleterFnPtr base_deleter = nullptr;

// What the bridge lent: the kernel's memory it came from, and its place in the arena.
struct Loan {
  KernelMemory* kernel = nullptr;
  std::size_t offset = 0;
  std::size_t bytes = 0;  // 0: not from the arena
};

std::mutex& loans_mutex() {
  static std::mutex m;
  return m;
}

absl::flat_hash_map<void*, Loan>& loans() {
  static auto* map = new absl::flat_hash_map<void*, Loan>();
  return *map;
}

void give_back(void* p) {
  Loan loan;
  {
    std::lock_guard<std::mutex> lock(loans_mutex());
    auto it = loans().find(p);
    if (it == loans().end()) return;
    loan = it->second;
    loans().erase(it);
  }
  // Freed while its kernel runs, on its thread: the arena may place the next request there.
  if (loan.bytes > 0 && loan.kernel != nullptr && loan.kernel == current_memory)
    loan.kernel->arena.give_back(loan.offset, loan.bytes);
}

void raw_delete(void* p) {
  bool lent = false;
  {
    std::lock_guard<std::mutex> lock(loans_mutex());
    lent = loans().contains(p);
  }
  if (lent) {
    give_back(p);
  } else {
    base_deleter(p);
  }
}

c10::DataPtr lend(void* p, KernelMemory* kernel, std::size_t offset, std::size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(loans_mutex());
    loans()[p] = Loan{kernel, offset, bytes};
  }
  kernel->lent.push_back(p);
  return c10::DataPtr(p, p, &give_back, c10::Device(c10::DeviceType::CPU));
}

// A temporary of the kernel: in the declared block where it fits, else the kernel's scratch.
c10::DataPtr lend_scratch(KernelMemory& memory, std::size_t n) {
  const std::size_t rounded =
      (n + ScratchArena::kAlignment - 1) / ScratchArena::kAlignment * ScratchArena::kAlignment;
  const std::size_t offset = memory.arena.take(rounded);
  if (memory.declared > 0 && memory.block == nullptr)
    memory.block = static_cast<char*>(memory.context->scratch(memory.declared));
  if (memory.block != nullptr && offset + rounded <= memory.declared)
    return lend(memory.block + offset, &memory, offset, rounded);
  // Outside the block: the arena still counts it, so that the next call declares enough.
  void* p = memory.context->scratch(n);
  if (p == nullptr) throw std::logic_error("remat_torch: the runtime offers no scratch");
  return lend(p, &memory, offset, rounded);
}

class BridgeAllocator final : public c10::Allocator {
 public:
  explicit BridgeAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(std::size_t n) override {
    KernelMemory* memory = current_memory;
    if (memory == nullptr || n == 0) return base_->allocate(n);
    for (KernelMemory::Output& out : memory->outputs) {
      if (out.handed_out || out.bytes != n) continue;
      out.handed_out = true;
      return lend(out.ptr, memory, 0, 0);
    }
    return lend_scratch(*memory, n);
  }
  // raw_allocate hands out a DataPtr's address and frees it with this later (oneDNN's
  // buffers do): lent memory goes back to remat with the kernel, the rest to the base.
  c10::DeleterFnPtr raw_deleter() const override { return &raw_delete; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }

 private:
  c10::Allocator* base_;
};

}  // namespace

KernelMemoryScope::KernelMemoryScope(KernelMemory* memory) : previous_(current_memory) {
  current_memory = memory;
}

KernelMemoryScope::~KernelMemoryScope() {
  // What the kernel lent goes back to the runtime with its scratch. A loan still out (a
  // buffer a library frees later) stays known, so that its free does not reach the base
  // allocator, but no longer belongs to an arena.
  {
    std::lock_guard<std::mutex> lock(loans_mutex());
    for (void* p : current_memory->lent) {
      auto it = loans().find(p);
      if (it != loans().end() && it->second.kernel == current_memory) it->second.kernel = nullptr;
    }
  }
  current_memory = previous_;
}

void install_cpu_allocator_bridge() {
  static std::once_flag once;
  std::call_once(once, [] {
    c10::Allocator* base = c10::GetCPUAllocator();
    base_deleter = base->raw_deleter();
    static BridgeAllocator bridge(base);
    // Above the default priority, so that a later default registration does not replace it.
    c10::SetCPUAllocator(&bridge, /*priority=*/1);
  });
}

}  // namespace remat::torch_backend::detail
