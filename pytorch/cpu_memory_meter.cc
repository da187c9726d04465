// The CPU's live and peak tensor bytes, as c10's allocator sees them (remat/torch.h's
// CpuMemoryMeter, remat_torch.cpu_memory()).
//
// Note [Measuring a step's CPU memory]
// The profiler attributes memory to operator records: a compiled graph is one record, so
// its own peak (the buffers its kernels hold at once) shows only as the net of the call.
// The meter sits in front of c10's CPU allocator and counts every allocation made while it
// is on, on any thread, and every free of those, wherever it happens: live bytes and their
// peak since the meter was started. Allocations made before it started are not counted,
// nor their frees. Meters nest, each with its own start. Off, requests pass through.
#include <ATen/core/Tensor.h>
#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "remat/torch.h"

namespace remat::torch_backend {

struct MeterState {
  std::int64_t base = 0;  // live bytes when the meter began
  std::int64_t peak = 0;  // the most above `base` since
};

namespace {

// Live bytes counted since the first meter began; each meter keeps its own base and peak,
// so that meters nest (a step measured while its first call compiles, and the compiler
// measures kernels).
std::atomic<int> meters_on{0};
std::atomic<std::int64_t> live{0};

std::mutex counted_mutex;  // guards `active` and `counted()`
std::vector<MeterState*>& active() {
  static auto* meters = new std::vector<MeterState*>();
  return *meters;
}

// What the meter counted, by address. c10's allocator hands out simple DataPtrs (the
// context is the address), and callers of raw_allocate rely on it, so the meter's are simple
// too and find their size and the base's deleter here.
struct Counted {
  std::size_t bytes = 0;
  c10::DeleterFnPtr base_deleter = nullptr;
};
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
    if (meters_on.load(std::memory_order_relaxed) == 0 || data == nullptr ||
        inner.get_context() != data || inner.get_deleter() == nullptr)
      return inner;
    const c10::Device device = inner.device();
    {
      std::lock_guard<std::mutex> lock(counted_mutex);
      counted()[data] = Counted{n, inner.get_deleter()};
      const std::int64_t now =
          live.fetch_add(static_cast<std::int64_t>(n)) + static_cast<std::int64_t>(n);
      for (MeterState* m : active()) m->peak = std::max(m->peak, now - m->base);
    }
    (void)inner.release_context();  // freed by free_counted, through the base's deleter
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

CpuMemoryMeter::CpuMemoryMeter() : state_(new MeterState) {
  install_meter();
  std::lock_guard<std::mutex> lock(counted_mutex);
  state_->base = live.load();
  active().push_back(state_.get());
  meters_on.fetch_add(1);
}

CpuMemoryMeter::~CpuMemoryMeter() {
  std::lock_guard<std::mutex> lock(counted_mutex);
  auto& meters = active();
  meters.erase(std::find(meters.begin(), meters.end(), state_.get()));
  meters_on.fetch_sub(1);
}

std::int64_t CpuMemoryMeter::live_bytes() const { return live.load() - state_->base; }

std::int64_t CpuMemoryMeter::peak_bytes() const {
  std::lock_guard<std::mutex> lock(counted_mutex);
  return state_->peak;
}

}  // namespace remat::torch_backend
