// The host execution engine for CUDA kernel sources (Note [Host execution of CUDA kernels] in
// cuda_host.h), and the CUDA runtime calls the kernel sources and their tests make.
#include "kernels/cuda/host/cuda_host.h"

#include <ucontext.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <barrier>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cuda/host/include/cuda_runtime.h"

thread_local dim3 threadIdx;
thread_local dim3 blockIdx;
thread_local dim3 blockDim;
thread_local dim3 gridDim;

namespace remat::detail::cuda_host {
namespace {

constexpr unsigned kWarp = 32;
constexpr unsigned kMaxThreads = 1024;
constexpr std::size_t kMaxSharedBytes = 227 * 1024;  // an H100's opt-in maximum per block

// How the threads of one block wait for each other: the block (`warp` < 0) or one warp.
class Engine {
 public:
  virtual ~Engine() = default;
  virtual void wait(int warp) = 0;
};

// What the threads of the running block share.
struct BlockState {
  unsigned size = 0;                                    // threads
  std::vector<std::array<std::uint32_t, kWarp>> lanes;  // per warp: each lane's offered value
  std::vector<unsigned char> shared;                    // dynamic shared memory
  Engine* engine = nullptr;

  unsigned warp_lanes(unsigned warp) const { return std::min(kWarp, size - warp * kWarp); }
  void begin_block() {
    // Uninitialised on a GPU: NaN bytes here, so a kernel that reads before writing shows.
    std::fill(shared.begin(), shared.end(), 0xff);
  }
};

BlockState* block_state = nullptr;
thread_local unsigned linear_id = 0;  // the thread's index in its block, x fastest
std::atomic<cudaError_t> last_error{cudaSuccess};
std::mutex launch_mutex;  // one launch at a time: kernels keep shared arrays in statics
std::set<std::string> names_run;

// Warps are made of consecutive linear thread indices, as on the GPU.
unsigned lane_id() { return linear_id % kWarp; }
unsigned warp_id() { return linear_id / kWarp; }

// Sets the CUDA indices of the thread `linear` of block `b`.
void enter_thread(dim3 grid, dim3 dims, unsigned b, unsigned linear) {
  threadIdx = dim3(linear % dims.x, linear / dims.x % dims.y, linear / (dims.x * dims.y));
  blockIdx = dim3(b % grid.x, b / grid.x % grid.y, b / (grid.x * grid.y));
  blockDim = dims;
  gridDim = grid;
  linear_id = linear;
}

// ---------------------------------------------------------------------------------------
// Fibers: every CUDA thread of a block is a context on the calling thread, switched at
// barriers. Deterministic, and fast enough for every test shape; a barrier that some thread
// of the block never reaches is reported (it would hang or be undefined on a GPU).

struct FiberBarrier {
  unsigned expected = 0;
  unsigned arrived = 0;
  std::uint64_t phase = 0;

  void release() {
    arrived = 0;
    ++phase;
  }
  void drop() {  // a thread that has returned no longer counts
    --expected;
    if (expected > 0 && arrived == expected) release();
  }
};

class FiberEngine final : public Engine {
 public:
  void run(dim3 grid, dim3 dims, BlockState& state, const ThreadBody& body) {
    const unsigned n = state.size;
    body_ = &body;
    fibers_.resize(n);
    while (stacks_.size() < n) stacks_.push_back(std::make_unique<char[]>(kStackBytes));
    const unsigned blocks = grid.x * grid.y * grid.z;
    for (unsigned b = 0; b < blocks; ++b) {
      state.begin_block();
      block_ = FiberBarrier{n};
      warps_.assign((n + kWarp - 1) / kWarp, FiberBarrier{});
      for (unsigned w = 0; w < warps_.size(); ++w) warps_[w].expected = state.warp_lanes(w);
      for (unsigned t = 0; t < n; ++t) start(fibers_[t], t);
      schedule(grid, dims, b);
    }
  }

  void wait(int warp) override {
    FiberBarrier& bar = warp < 0 ? block_ : warps_[static_cast<unsigned>(warp)];
    if (++bar.arrived == bar.expected) {
      bar.release();  // the last to arrive goes on at once
      return;
    }
    Fiber& me = fibers_[running_];
    me.waiting = &bar;
    me.phase = bar.phase;
    swapcontext(&me.context, &scheduler_);
  }

 private:
  static constexpr std::size_t kStackBytes = 256 * 1024;
  struct Fiber {
    ucontext_t context;
    FiberBarrier* waiting = nullptr;
    std::uint64_t phase = 0;
    bool done = false;
  };

  void start(Fiber& f, unsigned t) {
    f.waiting = nullptr;
    f.done = false;
    getcontext(&f.context);
    f.context.uc_stack.ss_sp = stacks_[t].get();
    f.context.uc_stack.ss_size = kStackBytes;
    f.context.uc_link = nullptr;
    makecontext(&f.context, &FiberEngine::entry, 0);
  }

  static void entry() {
    FiberEngine& e = *running_engine_;
    e.body_->run();
    e.block_.drop();
    e.warps_[warp_id()].drop();
    Fiber& me = e.fibers_[e.running_];
    me.done = true;
    setcontext(&e.scheduler_);
  }

  // Round robin over the block's fibers, each running until it waits or returns.
  void schedule(dim3 grid, dim3 dims, unsigned b) {
    running_engine_ = this;
    std::size_t left = fibers_.size();
    while (left > 0) {
      bool moved = false;
      for (unsigned t = 0; t < fibers_.size(); ++t) {
        Fiber& f = fibers_[t];
        if (f.done || (f.waiting != nullptr && f.waiting->phase == f.phase)) continue;
        f.waiting = nullptr;
        running_ = t;
        enter_thread(grid, dims, b, t);
        swapcontext(&scheduler_, &f.context);
        moved = true;
        if (f.done) --left;
      }
      if (!moved) {
        std::fprintf(stderr,
                     "remat host CUDA: block %u waits at a barrier that %zu of its threads "
                     "never reach\n",
                     b, left);
        std::abort();
      }
    }
  }

  inline static FiberEngine* running_engine_ = nullptr;
  const ThreadBody* body_ = nullptr;
  std::vector<Fiber> fibers_;
  std::vector<std::unique_ptr<char[]>> stacks_;
  ucontext_t scheduler_;
  FiberBarrier block_;
  std::vector<FiberBarrier> warps_;
  unsigned running_ = 0;
};

// ---------------------------------------------------------------------------------------
// Threads: one host thread per CUDA thread, for ThreadSanitizer, which sees the kernels'
// shared-memory accesses from real threads ordered only by the barriers.

class ThreadEngine final : public Engine {
 public:
  void run(dim3 grid, dim3 dims, BlockState& state, const ThreadBody& body) {
    const unsigned n = state.size;
    state_ = &state;
    warps_.resize((n + kWarp - 1) / kWarp);
    reset();
    blocks_ = grid.x * grid.y * grid.z;
    next_ = 0;
    gate_engine_ = this;
    std::barrier<void (*)() noexcept> gate(n, &ThreadEngine::next_block);
    std::vector<std::thread> threads;
    threads.reserve(n);
    for (unsigned t = 0; t < n; ++t)
      threads.emplace_back([&, t] { run_thread(grid, dims, t, body, gate); });
    for (std::thread& t : threads) t.join();
  }

  void wait(int warp) override {
    (warp < 0 ? block_ : warps_[static_cast<unsigned>(warp)])->arrive_and_wait();
  }

 private:
  void reset() {
    state_->begin_block();
    block_ = std::make_unique<std::barrier<>>(state_->size);
    for (unsigned w = 0; w < warps_.size(); ++w)
      warps_[w] = std::make_unique<std::barrier<>>(state_->warp_lanes(w));
  }
  // The gate's completion: the next block's barriers, once every thread has left the last.
  static void next_block() noexcept {
    ++gate_engine_->next_;
    gate_engine_->reset();
  }
  void run_thread(dim3 grid, dim3 dims, unsigned t, const ThreadBody& body,
                  std::barrier<void (*)() noexcept>& gate) {
    for (unsigned b = 0; b < blocks_; b = next_) {
      enter_thread(grid, dims, b, t);
      body.run();
      block_->arrive_and_drop();  // a returned thread no longer counts
      warps_[warp_id()]->arrive_and_drop();
      gate.arrive_and_wait();
    }
  }

  inline static ThreadEngine* gate_engine_ = nullptr;
  BlockState* state_ = nullptr;
  std::unique_ptr<std::barrier<>> block_;
  std::vector<std::unique_ptr<std::barrier<>>> warps_;
  unsigned blocks_ = 0;
  unsigned next_ = 0;
};

#if defined(__SANITIZE_THREAD__)
using DefaultEngine = ThreadEngine;
#else
using DefaultEngine = FiberEngine;
#endif

bool valid_launch(dim3 grid, dim3 block, std::size_t smem) {
  const unsigned long long threads = 1ull * block.x * block.y * block.z;
  if (threads == 0 || threads > kMaxThreads || grid.x == 0 || grid.y == 0 || grid.z == 0) {
    last_error = cudaErrorInvalidConfiguration;
    return false;
  }
  if (smem > kMaxSharedBytes) {
    last_error = cudaErrorInvalidValue;
    return false;
  }
  return true;
}

}  // namespace

void run_grid(dim3 grid, dim3 dims, std::size_t dynamic_smem, const ThreadBody& body,
              const char* kernel) {
  if (!valid_launch(grid, dims, dynamic_smem)) return;
  std::lock_guard<std::mutex> lock(launch_mutex);
  names_run.insert(kernel);
  static DefaultEngine engine;
  BlockState state;
  state.size = dims.x * dims.y * dims.z;
  state.lanes.resize((state.size + kWarp - 1) / kWarp);
  state.shared.resize(dynamic_smem);
  state.engine = &engine;
  block_state = &state;
  engine.run(grid, dims, state, body);
  block_state = nullptr;
}

std::vector<std::string> kernels_run() {
  std::lock_guard<std::mutex> lock(launch_mutex);
  return {names_run.begin(), names_run.end()};
}

std::atomic<std::int64_t> stride_cap{std::int64_t{1} << 20};
std::int64_t grid_stride_cap() { return stride_cap; }
void set_grid_stride_cap(std::int64_t blocks) { stride_cap = std::max<std::int64_t>(blocks, 1); }

void sync_threads() { block_state->engine->wait(-1); }

// A warp intrinsic called by a lane outside its mask, or naming lanes the warp does not have,
// is undefined on a GPU: reported here. The host serves only masks of the whole warp (its
// exchange waits for every lane), which is all the sources use; a narrower mask is reported
// rather than left to hang.
void check_mask(std::uint32_t mask, const char* what) {
  const unsigned lane = lane_id();
  const unsigned lanes = block_state->warp_lanes(warp_id());
  const std::uint32_t live = lanes >= 32 ? 0xffffffffu : (1u << lanes) - 1u;
  if ((mask >> lane & 1u) == 0) {
    std::fprintf(stderr,
                 "remat host CUDA: lane %u calls %s with mask 0x%08x, which leaves it out\n", lane,
                 what, mask);
    std::abort();
  }
  if ((mask & live) != live || (mask & ~live) != 0) {
    std::fprintf(stderr,
                 "remat host CUDA: %s with mask 0x%08x in a warp of %u lanes: host execution "
                 "serves whole-warp masks only\n",
                 what, mask, lanes);
    std::abort();
  }
}

std::uint32_t warp_shuffle_xor(std::uint32_t mask, std::uint32_t value, int lane_mask) {
  check_mask(mask, "__shfl_xor_sync");
  BlockState& b = *block_state;
  const unsigned warp = warp_id();
  const unsigned lane = lane_id();
  b.lanes[warp][lane] = value;
  b.engine->wait(static_cast<int>(warp));
  const unsigned partner = lane ^ static_cast<unsigned>(lane_mask);
  // A partner beyond the warp's last lane (a partial warp) gives the lane its own value.
  const std::uint32_t got = partner < b.warp_lanes(warp) ? b.lanes[warp][partner] : value;
  b.engine->wait(static_cast<int>(warp));  // the buffer is free again
  return got;
}

std::uint32_t warp_ballot(std::uint32_t mask, bool predicate) {
  check_mask(mask, "__ballot_sync");
  BlockState& b = *block_state;
  const unsigned warp = warp_id();
  b.lanes[warp][lane_id()] = predicate ? 1u : 0u;
  b.engine->wait(static_cast<int>(warp));
  std::uint32_t bits = 0;
  for (unsigned l = 0; l < b.warp_lanes(warp); ++l)
    if (b.lanes[warp][l] != 0) bits |= 1u << l;
  b.engine->wait(static_cast<int>(warp));
  return bits & mask;
}

void* dynamic_shared() { return block_state->shared.data(); }

cudaError_t take_last_error() { return last_error.exchange(cudaSuccess); }

cudaError_t record_error(cudaError_t e) {
  if (e != cudaSuccess) last_error = e;
  return e;
}

std::atomic<int> malloc_failures{0};
void fail_next_mallocs(int n) { malloc_failures = n; }
bool take_malloc_failure() {
  int n = malloc_failures.load();
  while (n > 0 && !malloc_failures.compare_exchange_weak(n, n - 1)) {
  }
  return n > 0;
}

}  // namespace remat::detail::cuda_host
