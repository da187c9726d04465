#include "pytorch/detail/cpu_allocator_bridge.h"

#include <absl/container/flat_hash_set.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <cstring>
#include <mutex>

namespace remat::torch_backend::detail {
namespace {

thread_local KernelMemory* current_memory = nullptr;
// How the allocator the bridge stands in front of frees what raw_allocate gave out.
c10::DeleterFnPtr base_deleter = nullptr;

class BridgeAllocator final : public c10::Allocator {
 public:
  explicit BridgeAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(std::size_t n) override {
    KernelMemory* memory = current_memory;
    if (memory == nullptr || n == 0) return base_->allocate(n);
    for (KernelMemory::Output& out : memory->outputs) {
      if (out.handed_out || out.bytes != n) continue;
      out.handed_out = true;
      return lend(out.ptr);
    }
    void* p = memory->context->scratch(n);
    return p == nullptr ? base_->allocate(n) : lend(p);
  }
  // raw_allocate hands out a DataPtr's address and frees it with this later (oneDNN's
  // buffers do): lent memory goes back to remat with the kernel, the rest to the base.
  c10::DeleterFnPtr raw_deleter() const override { return &raw_delete; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }

 private:
  static std::mutex& lent_mutex() {
    static std::mutex m;
    return m;
  }
  static absl::flat_hash_set<void*>& lent() {
    static auto* set = new absl::flat_hash_set<void*>();
    return *set;
  }
  static c10::DataPtr lend(void* p) {
    std::lock_guard<std::mutex> lock(lent_mutex());
    lent().insert(p);
    return c10::DataPtr(p, p, &give_back, c10::Device(c10::DeviceType::CPU));
  }
  static bool forget(void* p) {
    std::lock_guard<std::mutex> lock(lent_mutex());
    return lent().erase(p) != 0;
  }
  static void give_back(void* p) { forget(p); }
  static void raw_delete(void* p) {
    if (!forget(p)) base_deleter(p);
  }
  c10::Allocator* base_;
};

}  // namespace

KernelMemoryScope::KernelMemoryScope(KernelMemory* memory) : previous_(current_memory) {
  current_memory = memory;
}

KernelMemoryScope::~KernelMemoryScope() { current_memory = previous_; }

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
