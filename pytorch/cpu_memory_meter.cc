// The CPU's live and peak tensor bytes, as c10's allocator sees them (remat/torch.h's
// CpuMemoryMeter, remat_torch.cpu_memory()).
//
// Note [Measuring a step's CPU memory]
// The profiler attributes memory to operator records: a compiled graph is one record, so
// its own peak (the buffers its kernels hold at once) shows only as the net of the call.
// The meter sits in front of c10's CPU allocator and counts every allocation made while it
// is on, on any thread, and every free of those, wherever it happens: live bytes and their
// peak since the meter was started. Allocations made before it started are not counted,
// nor their frees. Off, requests pass through untouched.
#include <ATen/core/Tensor.h>
#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <mutex>
#include <unordered_map>

#include "remat/torch.h"

namespace remat::torch_backend {
namespace {

std::atomic<bool> metering{false};
std::atomic<std::int64_t> live{0};
std::atomic<std::int64_t> peak{0};

void raise_peak(std::int64_t now) {
  std::int64_t seen = peak.load();
  while (now > seen && !peak.compare_exchange_weak(seen, now)) {
  }
}

// What the meter counted, by address. c10's allocator hands out simple DataPtrs (the
// context is the address), and callers of raw_allocate rely on it, so the meter's are simple
// too and find their size and the base's deleter here.
struct Counted {
  std::size_t bytes = 0;
  c10::DeleterFnPtr base_deleter = nullptr;
};
std::mutex counted_mutex;
std::unordered_map<void*, Counted>& counted() {
  static auto* map = new std::unordered_map<void*, Counted>();
  return *map;
}
c10::DeleterFnPtr fallback_deleter = nullptr;  // the base's, for what was not counted

void free_counted(void* ptr) {
  Counted entry{0, fallback_deleter};
  {
    std::lock_guard<std::mutex> lock(counted_mutex);
    auto it = counted().find(ptr);
    if (it != counted().end()) {
      entry = it->second;
      counted().erase(it);
    }
  }
  live.fetch_sub(static_cast<std::int64_t>(entry.bytes));
  if (entry.base_deleter != nullptr) entry.base_deleter(ptr);
}

class MeterAllocator final : public c10::Allocator {
 public:
  explicit MeterAllocator(c10::Allocator* base) : base_(base) {
    fallback_deleter = base->raw_deleter();
  }

  c10::DataPtr allocate(std::size_t n) override {
    c10::DataPtr inner = base_->allocate(n);
    void* data = inner.get();
    // Only simple pointers can be counted by address; others pass through (a remat
    // kernel's outputs, which the bridge serves).
    if (!metering.load(std::memory_order_relaxed) || data == nullptr ||
        inner.get_context() != data || inner.get_deleter() == nullptr)
      return inner;
    const c10::Device device = inner.device();
    {
      std::lock_guard<std::mutex> lock(counted_mutex);
      counted()[data] = Counted{n, inner.get_deleter()};
    }
    (void)inner.release_context();  // freed by free_counted, through the base's deleter
    raise_peak(live.fetch_add(static_cast<std::int64_t>(n)) + static_cast<std::int64_t>(n));
    return c10::DataPtr(data, data, &free_counted, device);
  }
  c10::DeleterFnPtr raw_deleter() const override {
    return fallback_deleter == nullptr ? nullptr : &free_counted;
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    base_->copy_data(dest, src, count);
  }

 private:
  c10::Allocator* base_;
};

void install_meter() {
  static std::once_flag once;
  std::call_once(once, [] {
    static MeterAllocator meter(c10::GetCPUAllocator());
    c10::SetCPUAllocator(&meter, /*priority=*/1);
  });
}

}  // namespace

CpuMemoryMeter::CpuMemoryMeter() {
  install_meter();
  live.store(0);
  peak.store(0);
  metering.store(true);
}

CpuMemoryMeter::~CpuMemoryMeter() { metering.store(false); }

std::int64_t CpuMemoryMeter::live_bytes() const { return live.load(); }

std::int64_t CpuMemoryMeter::peak_bytes() const { return std::max<std::int64_t>(peak.load(), 0); }

}  // namespace remat::torch_backend
