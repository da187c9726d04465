// One call of a torch operator on the device, captured so that a remat op can run it on the
// CPU, first and again when recomputing (Note [Running torch operators as remat ops]).
#ifndef REMAT_PYTORCH_DETAIL_TORCH_CALL_H_
#define REMAT_PYTORCH_DETAIL_TORCH_CALL_H_

#include <ATen/core/Generator.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "pytorch/detail/backend.h"
#include "pytorch/detail/execution.h"
#include "pytorch/detail/layout.h"
#include "remat/op.h"

namespace remat::torch_backend::detail {

// Note [Running torch operators as remat ops]
// The fallback turns a call of a torch operator on device tensors into one remat op whose
// inputs are the remat storages behind the call's tensor arguments (each once) and whose
// outputs are a new storage per fresh result, then a new version per storage the call writes
// (copy-on-write, or the pinned storage itself). The op keeps the call's other arguments and
// every tensor argument's layout, so its kernel rebuilds the call on the CPU over the
// storages' bytes and runs the operator's CPU kernel, on the first run and on every
// recomputation alike. Output layouts come from running the operator on meta tensors first.
// A random operator keeps the CPU generator's state from before its first run and runs a
// recomputation from that state, restoring the generator afterwards, so it draws the same
// numbers as the plain CPU program and leaves the generator where that program would.
struct TensorArg {
  enum class Kind { kDevice, kLiteral, kUndefined };
  Kind kind = Kind::kUndefined;
  int argument = -1;  // the schema argument it is (or is in)
  int input = -1;     // kDevice: the remat op's input holding its storage
  Layout layout;
  bool written = false;
  at::Tensor literal;  // kLiteral: a CPU tensor passed as it is
};

struct TorchCall {
  c10::OperatorHandle op;
  std::vector<c10::IValue> values;            // the arguments, tensors left to `tensors`
  std::vector<TensorArg> tensors;             // every tensor of the arguments, in visiting order
  std::vector<Tensor> inputs;                 // the remat op's inputs
  std::vector<RematStorage*> input_storages;  // null for storages made from CPU tensors
  std::vector<std::size_t> input_bytes;
  std::vector<int> written_inputs;  // inputs the call writes, in output order after the fresh
  std::vector<Layout> fresh;        // layouts of the fresh results, in order
  std::vector<std::size_t> fresh_bytes;
  std::string signature;             // the operator and its arguments' layouts
  std::size_t declared_scratch = 0;  // OpDef::scratch_bytes of the op
  std::optional<at::Generator> rng;  // random operators: the generator before the first run
  // Results of a run made before the op existed (an operator with no meta kernel): the op's
  // first run copies them instead of running again.
  std::optional<std::vector<c10::IValue>> first_results;
  bool ran = false;  // the op's first run is over (a followed plan may defer it)
  // The device tensors of the results exist: their layouts can no longer change.
  bool published = false;
  // The first run found results laid out otherwise than the meta kernel said, and `fresh`
  // took the CPU kernel's layouts (Note [Results take the CPU kernel's layouts]).
  bool relaid = false;

  explicit TorchCall(c10::OperatorHandle handle) : op(std::move(handle)) {}
  // Pops the call's arguments off `stack` and returns them; keeps them without their tensors
  // (which the op must not hold alive). CPU tensors read by the call, but scalars, become
  // constants of the runtime.
  std::vector<c10::IValue> capture(torch::jit::Stack& stack, Runtime& rt);
  // The arguments with device tensors as meta tensors and the device as meta.
  torch::jit::Stack meta_arguments() const;
  // Drops the call's handles on its inputs once the op holds them: the runtime keeps an op's
  // inputs for as long as its lineage needs them, and a handle here would make them tensors
  // the program holds (never freed, frozen by the next update).
  void forget_inputs() {
    inputs.clear();
    input_storages.clear();
  }
  // The remat kernel: runs the operator's kernel over the storages in `ctx`, where the
  // device's execution runs kernels (Note [Executions]).
  void run(const KernelContext& ctx);
  // The output index of input `i` where the call writes it, else -1.
  int version_of(int input) const;
  // Runs the kernel on arguments rebuilt over `ctx` without the bridge (eager calls); its
  // tensor results are on the CPU.
  std::vector<c10::IValue> run_eagerly(const KernelContext& ctx);

 private:
  TensorArg capture_tensor(const at::Tensor& t, int argument, bool written, Runtime& rt);
  // The input holding `storage` (or, for a storage made here, a new one).
  int input_of(RematStorage* storage, const Tensor& tensor, std::size_t bytes);
  // The arguments with every device tensor over its memory in `ctx`, on `device`.
  torch::jit::Stack kernel_arguments(const KernelContext& ctx, c10::Device device) const;
  // The arguments with every device tensor given by `device_tensor(arg)`, literals as they
  // are, and the device replaced by `device`.
  template <typename F>
  torch::jit::Stack rebuild_arguments(c10::Device device, F&& device_tensor) const;
  void copy_fresh_results(const std::vector<c10::IValue>& results, const KernelContext& ctx,
                          c10::Device device);
  void adopt_result_layouts(const std::vector<c10::IValue>& results);
  std::vector<c10::IValue> call_kernel(torch::jit::Stack stack, const KernelContext& ctx,
                                       const Execution& execution);
  // The first run's body: the kernel (or the results of the run made before the op), then
  // the fresh results copied to the outputs.
  void run_here(const KernelContext& ctx, const Execution& execution);
};

// "aten::add.Tensor": the operator's name with its overload.
std::string qualified_name(const c10::OperatorName& name);

// The tensors of the results that alias no argument (fresh ones), flattened in order.
std::vector<at::Tensor> fresh_results(const c10::FunctionSchema& schema,
                                      const std::vector<c10::IValue>& results);

// Every tensor of a boxed value (a tensor, a list of tensors, a list of optional tensors),
// replaced by `f` of it; devices on the remat device replaced by `device`.
template <typename F>
c10::IValue map_tensors(const c10::IValue& v, F&& f, c10::Device device) {
  if (v.isTensor()) return f(v.toTensor());
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorList()) out.push_back(f(t));
    return out;
  }
  if (v.isOptionalTensorList()) {
    c10::List<std::optional<at::Tensor>> out;
    for (const std::optional<at::Tensor>& t : v.toOptionalTensorList())
      out.push_back(t.has_value() ? std::optional<at::Tensor>(f(*t)) : std::nullopt);
    return out;
  }
  if (v.isDevice() && v.toDevice().type() == c10::DeviceType::PrivateUse1) return device;
  return v;
}

}  // namespace remat::torch_backend::detail

#endif  // REMAT_PYTORCH_DETAIL_TORCH_CALL_H_
