// Embedding backward on CUDA, in O(BT log BT + BT*C + V*C) work.
//
// Note [Embedding backward by sorting]
// dwte[v] is the sum of dout over the tokens whose id is v. Scanning every token for every
// vocabulary row is O(V * BT): for GPT-2 (V = 50257, BT = 8192) some 4e8 comparisons per
// step. Instead the token positions are stably sorted by id (Thrust), which groups each id's
// tokens in increasing (b, t) order; the first position of each group (a head) starts a block
// that sums its group's dout rows per channel, from zero and in that order, as the CPU kernel
// adds them. So the result is bitwise the CPU kernel's, and the same on every run. Rows no
// token uses are zeroed first (the V*C term). The sort's keys, positions and Thrust's own
// temporary storage come from the caller's scratch where it lends memory (the runtime's, under
// its budget, taken back when the op's kernel returns); otherwise from a cache kept per
// stream, as cuBLAS's own workspaces are: memory outside any budget.
#include <thrust/sequence.h>
#include <thrust/sort.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <unordered_map>
#include <utility>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.h"

#ifdef REMAT_CUDA_HOST_EXECUTION
#include <thrust/system/cpp/execution_policy.h>
#else
#include <thrust/system/cuda/execution_policy.h>
#endif

namespace remat::kernels::cuda {
namespace {

using detail::check_launch;
using detail::grid_blocks;
using detail::kThreads;

// Device memory for one stream's sorts, kept between calls: Thrust's allocator interface over
// cached blocks (a block is reused by a request no larger; memory is freed at thread exit).
class ScratchCache {
 public:
  using value_type = char;
  ScratchCache() = default;
  ScratchCache(const ScratchCache&) = delete;
  ScratchCache& operator=(const ScratchCache&) = delete;
  ~ScratchCache() {
    for (auto& [bytes, p] : free_) cudaFree(p);
    for (auto& [p, bytes] : used_) cudaFree(p);
  }

  char* allocate(std::ptrdiff_t n) {
    // At least a byte: every block needs an address of its own (cudaMalloc(0) gives null).
    const std::size_t bytes = std::max<std::size_t>(static_cast<std::size_t>(n), 1);
    auto it = free_.lower_bound(bytes);
    char* p = nullptr;
    std::size_t have = bytes;
    if (it != free_.end()) {
      have = it->first;
      p = it->second;
      free_.erase(it);
    } else {
      void* fresh = nullptr;
      REMAT_CUDA_CHECK(cudaMalloc(&fresh, bytes));
      p = static_cast<char*>(fresh);
    }
    used_.emplace(p, have);
    return p;
  }
  void deallocate(char* p, std::size_t) {
    auto it = used_.find(p);
    free_.emplace(it->second, p);
    used_.erase(it);
  }

 private:
  std::multimap<std::size_t, char*> free_;
  std::unordered_map<char*, std::size_t> used_;
};

ScratchCache& scratch_for(cudaStream_t stream) {
  thread_local std::unordered_map<cudaStream_t, std::unique_ptr<ScratchCache>> caches;
  auto& cache = caches[stream];
  if (cache == nullptr) cache = std::make_unique<ScratchCache>();
  return *cache;
}

// The temporary memory of one embedding_backward call, as Thrust's allocator interface: the
// caller's scratch first, the stream's cache where the scratch gives nothing. Scratch blocks
// are not handed back one by one (the lender takes them all back after the call, in stream
// order, which is also when the cache's blocks may be reused); cache blocks go back to the
// cache when Thrust frees them or, for those still held, when this object dies.
class SortMemory {
 public:
  using value_type = char;
  SortMemory(Scratch scratch, cudaStream_t stream) : scratch_(scratch), stream_(stream) {}
  SortMemory(const SortMemory&) = delete;
  SortMemory& operator=(const SortMemory&) = delete;
  ~SortMemory() {
    for (auto& [p, bytes] : from_cache_) cache().deallocate(p, bytes);
  }

  char* allocate(std::ptrdiff_t n) {
    // At least a byte: a zero-byte request still gets an address of its own.
    const std::size_t bytes = std::max<std::size_t>(static_cast<std::size_t>(n), 1);
    if (char* p = from_scratch(bytes); p != nullptr) return p;
    char* p = cache().allocate(static_cast<std::ptrdiff_t>(bytes));
    from_cache_.emplace(p, bytes);
    return p;
  }
  void deallocate(char* p, std::size_t) {
    auto it = from_cache_.find(p);
    if (it == from_cache_.end()) return;  // the scratch's: taken back after the call
    cache().deallocate(p, it->second);
    from_cache_.erase(it);
  }

 private:
  // Thrust's temporary storage and the int32 arrays want cudaMalloc's alignment; memory from
  // a lender that does not give it is asked for again with room to align.
  static constexpr std::uintptr_t kAlign = 256;
  char* from_scratch(std::size_t bytes) const {
    if (scratch_.fn == nullptr) return nullptr;
    void* p = scratch_.get(bytes);
    if (p == nullptr || reinterpret_cast<std::uintptr_t>(p) % kAlign == 0)
      return static_cast<char*>(p);
    p = scratch_.get(bytes + kAlign - 1);
    if (p == nullptr) return nullptr;
    const std::uintptr_t aligned =
        (reinterpret_cast<std::uintptr_t>(p) + kAlign - 1) & ~(kAlign - 1);
    return static_cast<char*>(p) + (aligned - reinterpret_cast<std::uintptr_t>(p));
  }
  ScratchCache& cache() const { return scratch_for(stream_); }

  Scratch scratch_;
  cudaStream_t stream_;
  std::unordered_map<char*, std::size_t> from_cache_;
};

// A block per sorted position: those that start a group of equal ids (heads) sum the group's
// dout rows, one channel per thread; the others have nothing to do.
__global__ void embedding_dwte_groups_kernel(const float* __restrict__ dout,
                                             const std::int32_t* __restrict__ sorted_ids,
                                             const std::int32_t* __restrict__ positions,
                                             float* __restrict__ dwte, i64 tokens, i64 c, i64 v) {
  for (i64 i = blockIdx.x; i < tokens; i += gridDim.x) {
    const std::int32_t id = sorted_ids[i];
    if (i > 0 && sorted_ids[i - 1] == id) continue;  // not a head
    if (id < 0 || id >= v) continue;                 // no row to write: ignored, not corrupting
    i64 end = i + 1;
    while (end < tokens && sorted_ids[end] == id) ++end;
    for (i64 j = threadIdx.x; j < c; j += blockDim.x) {
      float acc = 0.0f;
      for (i64 p = i; p < end; ++p) acc += dout[static_cast<i64>(positions[p]) * c + j];
      dwte[static_cast<i64>(id) * c + j] = acc;
    }
  }
}

// dwpe[t, j] = sum over b in order of dout[b, t, j]: one thread per (t, j).
__global__ void embedding_dwpe_kernel(const float* __restrict__ dout, float* __restrict__ dwpe,
                                      i64 b, i64 t, i64 c) {
  REMAT_GRID_STRIDE(i, t * c) {
    float acc = 0.0f;
    for (i64 bi = 0; bi < b; ++bi) acc += dout[bi * t * c + i];
    dwpe[i] = acc;
  }
}

// Sorts the token positions by id, stably: `ids` and `positions` (each `tokens` long) come back
// grouped by id, positions increasing within each group.
void sort_positions_by_id(const std::int32_t* idx, std::int32_t* ids, std::int32_t* positions,
                          i64 tokens, SortMemory& memory, cudaStream_t stream) {
  REMAT_CUDA_CHECK(cudaMemcpyAsync(ids, idx, static_cast<std::size_t>(tokens) * sizeof(*ids),
                                   cudaMemcpyDeviceToDevice, stream));
#ifdef REMAT_CUDA_HOST_EXECUTION
  const auto policy = thrust::cpp::par(memory);
#else
  // par would synchronize the stream after each algorithm; everything that reads the sorted
  // arrays, and the scratch memory's release, is ordered on the same stream, so no wait is
  // needed (and a wait per backward step stalls the host's enqueueing).
  const auto policy = thrust::cuda::par_nosync(memory).on(stream);
#endif
  thrust::sequence(policy, positions, positions + tokens);
  thrust::stable_sort_by_key(policy, ids, ids + tokens, positions);
}

}  // namespace

void embedding_backward(const float* dout, const std::int32_t* idx, float* dwte, float* dwpe, i64 b,
                        i64 t, i64 c, i64 v, cudaStream_t stream, Scratch scratch) {
  if (c <= 0) return;
  const i64 tokens = std::max<i64>(b * t, 0);
  if (v > 0) {
    fill_zero(dwte, static_cast<std::size_t>(v * c) * sizeof(float), stream);
    if (tokens > 0) {
      SortMemory memory(scratch, stream);
      const auto bytes =
          static_cast<std::ptrdiff_t>(static_cast<std::size_t>(tokens) * sizeof(std::int32_t));
      auto* ids = reinterpret_cast<std::int32_t*>(memory.allocate(bytes));
      auto* positions = reinterpret_cast<std::int32_t*>(memory.allocate(bytes));
      sort_positions_by_id(idx, ids, positions, tokens, memory, stream);
      REMAT_LAUNCH(embedding_dwte_groups_kernel, grid_blocks(tokens), kThreads, 0, stream)
      (dout, ids, positions, dwte, tokens, c, v);
      check_launch("embedding_dwte_groups_kernel");
      // Stream-ordered: the next user of this memory (the cache's next request, or the
      // lender's) runs after this kernel on this stream. `memory` gives its cache blocks back
      // as it goes out of scope.
    }
  }
  if (dwpe != nullptr && t > 0) {
    REMAT_LAUNCH(embedding_dwpe_kernel, detail::grid_for(t * c), kThreads, 0, stream)
    (dout, dwpe, std::max<i64>(b, 0), t, c);
    check_launch("embedding_dwpe_kernel");
  }
}

}  // namespace remat::kernels::cuda
