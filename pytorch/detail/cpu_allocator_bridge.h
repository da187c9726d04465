// PyTorch's CPU allocator, bridged to remat's memory while a remat kernel runs a torch CPU
// kernel (Note [Torch kernels allocate under the budget]).
#ifndef REMAT_PYTORCH_DETAIL_CPU_ALLOCATOR_BRIDGE_H_
#define REMAT_PYTORCH_DETAIL_CPU_ALLOCATOR_BRIDGE_H_

#include <cstddef>
#include <map>
#include <vector>

#include "remat/op.h"

namespace remat::torch_backend::detail {

// Note [Torch kernels allocate under the budget]
// A torch CPU kernel allocates its outputs and temporaries itself, through c10's CPU
// allocator, so a remat op that runs one would hold its outputs twice (torch's, then the
// copy into remat's) and its temporaries outside the budget. While a remat kernel runs,
// the bridge serves the CPU allocator from remat instead: a request of exactly the size of
// one of the op's outputs not yet handed out gets that output's memory (kernels allocate
// their outputs first, so the result usually lands where remat wants it and no copy is
// needed; where it does not, the op copies it there, which is right whatever took the
// output's memory, since every temporary is dead once the kernel returns), and any other
// request is the kernel's scratch (KernelContext::scratch), under the budget, evicting to
// make room, given back when the kernel returns. Outside a remat kernel, and on other
// threads (a kernel's worker threads), requests go to the allocator that was there before.
//
// Scratch requested while the kernel runs cannot make room by moving other storages (Note
// [Compaction]), so a kernel that asks for much can fail where free memory lies in pieces.
// The op declares the scratch its call needed before (OpDef::scratch_bytes, reserved with
// its outputs, where moving is allowed), and the kernel's temporaries are placed in that
// block by ScratchArena, which reuses what the kernel frees: the block is the peak of the
// temporaries live at once, not their sum. A request that does not fit (the first run of a
// call, which declares a guess) is served as the kernel's own scratch.
class ScratchArena {
 public:
  static constexpr std::size_t kAlignment = 64;  // what c10's CPU allocator aligns to
  // The offset of a new block of `bytes` (first fit, else above every block).
  std::size_t take(std::size_t bytes);
  void give_back(std::size_t offset, std::size_t bytes);
  // The extent the blocks have reached: the arena a kernel like this one needs.
  std::size_t extent() const { return extent_; }

 private:
  std::map<std::size_t, std::size_t> free_;  // offset -> bytes, below top_
  std::size_t top_ = 0;
  std::size_t extent_ = 0;
};

struct KernelMemory {
  struct Output {
    void* ptr = nullptr;
    std::size_t bytes = 0;
    bool handed_out = false;
  };
  std::vector<Output> outputs;
  const KernelContext* context = nullptr;
  std::size_t declared = 0;  // scratch the op declared
  char* block = nullptr;     // the declared scratch, once the first request took it
  ScratchArena arena;
  std::vector<void*> lent;  // what this kernel lent (forgotten when it returns)
};

// Serves this thread's CPU allocations from `memory` while alive.
class KernelMemoryScope {
 public:
  explicit KernelMemoryScope(KernelMemory* memory);
  ~KernelMemoryScope();
  KernelMemoryScope(const KernelMemoryScope&) = delete;
  KernelMemoryScope& operator=(const KernelMemoryScope&) = delete;

 private:
  KernelMemory* previous_;
};

// Puts the bridge in front of c10's CPU allocator; idempotent.
void install_cpu_allocator_bridge();

}  // namespace remat::torch_backend::detail

#endif  // REMAT_PYTORCH_DETAIL_CPU_ALLOCATOR_BRIDGE_H_
