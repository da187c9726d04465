// How the device runs its operators' kernels: the runtime's backend underneath the capture,
// lineage and replay that every execution shares (Note [Executions]).
#ifndef REMAT_PYTORCH_DETAIL_EXECUTION_H_
#define REMAT_PYTORCH_DETAIL_EXECUTION_H_

#include <ATen/core/Generator.h>
#include <absl/functional/function_ref.h>
#include <c10/core/Device.h>
#include <c10/core/DispatchKey.h>

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "remat/runtime.h"

namespace remat::torch_backend::detail {

// Note [Executions]
// Everything the device does above a kernel (capturing a call, its meta results, lineage,
// scratch through the allocator bridge, random-number replay, costs) is the same whatever
// runs the kernel; an execution decides only the runtime's backend and how a kernel is
// launched on it:
//  - `cpu`: the runtime on the CPU backend, each operator's CPU kernel over host memory.
//  - `simulated_cuda`: the runtime on the CUDA backend over a simulated device
//    (runtime/cuda/simulated_cuda.h), whose memory is host memory: each operator's CPU
//    kernel runs over the device's memory when it is launched, and the launch is recorded
//    with what it read and wrote (Note [Host code run as a kernel]). The runtime's own
//    copies, stream-ordered frees and host tier then run as they do on a GPU, and the
//    simulator reports races, invalid accesses and the host's waits, which the tests check.
//  - `cuda` (where torch and remat were built with CUDA): the runtime on the GPU, each call
//    rebuilt over CUDA tensors made from remat's device pointers and redispatched to the
//    operator's CUDA kernel on the runtime's stream, random operators drawing from and
//    replaying the CUDA generator. Its kernels' own temporaries still come from torch's CUDA
//    allocator, outside the budget (issue 54, next).
// A kernel's call is rebuilt over `kernel_device()` tensors and redispatched to
// `kernel_key()`, inside `around_kernel`. The execution is chosen before the first tensor
// (Backend::set_execution): its default is the environment's REMAT_TORCH_EXECUTION, else
// `cpu` (`cuda` once it has run on a GPU).
class Execution {
 public:
  virtual ~Execution() = default;
  virtual std::string_view name() const = 0;
  // Sets the runtime's backend, and on CUDA its options (the device, the launch).
  virtual void configure(RuntimeOptions& options) = 0;
  // Where a kernel's tensors are, the kernel it redispatches to, and the generator a random
  // operator draws from (kept at its call, replayed by its recomputations).
  virtual c10::Device kernel_device() const { return c10::Device(c10::kCPU); }
  virtual c10::DispatchKey kernel_key() const { return c10::DispatchKey::CPU; }
  virtual at::Generator generator() const;
  // Runs `kernel` (a call rebuilt over the memory of `ctx`, and the copies of its results)
  // where the execution's kernels run: on CUDA, the runtime's stream made torch's current.
  virtual void around_kernel(const KernelContext& ctx, absl::FunctionRef<void()> kernel) {
    (void)ctx;
    kernel();
  }
  // What the device saw go wrong so far (races, invalid accesses), one line each; and
  // forgetting them.
  virtual std::vector<std::string> problems() const { return {}; }
  virtual void clear_problems() {}
  // Times the host waited for the device so far.
  virtual std::size_t host_waits() const { return 0; }
  // For tests: a read of `t`'s bytes on another stream, ordered after the runtime's stream,
  // as a program's side stream would make it, with the runtime told (record_stream) or not.
  // std::logic_error where the execution has no other stream.
  virtual void side_read(Runtime& rt, const Tensor& t, bool record_stream);
};

// The execution called `name` (execution_names()); std::invalid_argument naming the known
// ones for any other.
std::unique_ptr<Execution> make_execution(std::string_view name);
std::vector<std::string> execution_names();
// REMAT_TORCH_EXECUTION where set, else "cpu".
std::string default_execution_name();
// The simulated device's execution (simulated_cuda_execution.cc), and the GPU's
// (cuda_execution.cc; null where torch or remat was built without CUDA) with whether a GPU
// is there to run it.
std::unique_ptr<Execution> make_simulated_cuda_execution();
std::unique_ptr<Execution> make_cuda_execution();
bool cuda_execution_usable();

}  // namespace remat::torch_backend::detail

#endif  // REMAT_PYTORCH_DETAIL_EXECUTION_H_
