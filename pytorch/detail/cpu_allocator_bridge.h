// PyTorch's CPU allocator, bridged to remat's memory while a remat kernel runs a torch CPU
// kernel (Note [Torch kernels allocate under the budget]).
#ifndef REMAT_PYTORCH_DETAIL_CPU_ALLOCATOR_BRIDGE_H_
#define REMAT_PYTORCH_DETAIL_CPU_ALLOCATOR_BRIDGE_H_

#include <cstddef>
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
struct KernelMemory {
  struct Output {
    void* ptr = nullptr;
    std::size_t bytes = 0;
    bool handed_out = false;
  };
  std::vector<Output> outputs;
  const KernelContext* context = nullptr;
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
