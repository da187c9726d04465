#include "pytorch/detail/torch_call.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/clone.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>

#include <chrono>
#include <cstring>
#include <mutex>
#include <stdexcept>

#include "pytorch/detail/cpu_allocator_bridge.h"

namespace remat::torch_backend::detail {
namespace {

// Whether `t` lies in the memory of one of the op's outputs.
bool inside_outputs(const at::Tensor& t, const KernelContext& ctx) {
  if (!t.defined() || t.numel() == 0) return false;
  const auto* p = static_cast<const char*>(t.const_data_ptr());
  for (std::size_t i = 0; i < ctx.outputs.size(); ++i) {
    const auto* base = static_cast<const char*>(ctx.outputs[i]);
    if (base != nullptr && p >= base && p < base + ctx.output_spec(i).bytes()) return true;
  }
  return false;
}

// Draws as the first run did: `gen` at its state from then, put back afterwards.
class RngReplay {
 public:
  RngReplay(at::Generator gen, const at::Generator& from) : gen_(std::move(gen)) {
    std::lock_guard<std::mutex> lock(gen_.mutex());
    saved_ = gen_.clone();
    gen_.set_state(from.get_state());
  }
  ~RngReplay() {
    std::lock_guard<std::mutex> lock(gen_.mutex());
    gen_.set_state(saved_.get_state());
  }
  RngReplay(const RngReplay&) = delete;
  RngReplay& operator=(const RngReplay&) = delete;

 private:
  at::Generator gen_;
  at::Generator saved_;
};

}  // namespace

std::string qualified_name(const c10::OperatorName& name) {
  return name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
}

std::vector<at::Tensor> fresh_results(const c10::FunctionSchema& schema,
                                      const std::vector<c10::IValue>& results) {
  std::vector<at::Tensor> fresh;
  const auto& returns = schema.returns();
  for (std::size_t r = 0; r < returns.size() && r < results.size(); ++r) {
    if (returns[r].alias_info() != nullptr) continue;
    map_tensors(
        results[r],
        [&](const at::Tensor& t) {
          fresh.push_back(t);
          return t;
        },
        c10::Device(c10::kCPU));
  }
  return fresh;
}

std::vector<c10::IValue> TorchCall::capture(torch::jit::Stack& stack, Runtime& rt) {
  const auto& args = op.schema().arguments();
  const std::size_t n = args.size();
  if (stack.size() < n)
    throw std::logic_error("remat_torch: short stack for " + op.schema().name());
  std::vector<c10::IValue> arguments(
      std::make_move_iterator(stack.end() - static_cast<std::ptrdiff_t>(n)),
      std::make_move_iterator(stack.end()));
  stack.erase(stack.end() - static_cast<std::ptrdiff_t>(n), stack.end());
  signature = qualified_name(op.schema().operator_name());
  for (std::size_t a = 0; a < n; ++a) {
    const bool written = args[a].alias_info() != nullptr && args[a].alias_info()->isWrite();
    bool holds_tensors = false;
    values.push_back(map_tensors(
        arguments[a],
        [&](const at::Tensor& t) {
          holds_tensors = true;
          tensors.push_back(capture_tensor(t, static_cast<int>(a), written, rt));
          return at::Tensor();
        },
        device()));
    // Values other than tensors shape the results too (a view's sizes, a reduction's dims).
    if (!holds_tensors) absl::StrAppend(&signature, "|", c10::str(values.back()));
  }
  return arguments;
}

TensorArg TorchCall::capture_tensor(const at::Tensor& t, int argument, bool written, Runtime& rt) {
  TensorArg arg;
  arg.argument = argument;
  arg.written = written;
  if (!t.defined()) {
    absl::StrAppend(&signature, "|undefined");
    return arg;
  }
  TORCH_CHECK_NOT_IMPLEMENTED(t.layout() == c10::kStrided, "remat_torch: ", op.schema().name(),
                              " got a ", t.layout(), " tensor; remat keeps strided tensors only");
  arg.layout = Layout::of(t);
  if (RematStorage* s = remat_storage_of(t.storage()); s != nullptr) {
    arg.kind = TensorArg::Kind::kDevice;
    arg.input = input_of(s, s->tensor, s->nbytes);
  } else if (t.device().is_cpu() && (written || t.dim() == 0)) {
    arg.kind = TensorArg::Kind::kLiteral;
    // A clone, so that the program's later writes do not reach a recomputation; a Python
    // number stays one (it takes part in type promotion differently).
    arg.literal = written ? t : t.clone();
    if (!written && t.unsafeGetTensorImpl()->is_wrapped_number())
      arg.literal.unsafeGetTensorImpl()->set_wrapped_number(true);
  } else if (t.device().is_cpu()) {
    // A CPU tensor read by a device op: its bytes become a constant of the runtime.
    at::Tensor dense = t.contiguous();
    const std::size_t bytes = dense.nbytes();
    arg.kind = TensorArg::Kind::kDevice;
    arg.layout = Layout::of(dense);
    const void* data = bytes == 0 ? nullptr : dense.const_data_ptr();
    arg.input = input_of(nullptr, rt.constant(storage_spec(bytes), data), bytes);
  } else {
    TORCH_CHECK_NOT_IMPLEMENTED(false, "remat_torch: ", op.schema().name(), " got a tensor on ",
                                t.device().str(), "; only remat and CPU tensors can be mixed");
  }
  absl::StrAppend(&signature, "|", static_cast<int>(arg.kind), c10::toString(arg.layout.dtype), ":",
                  absl::StrJoin(arg.layout.sizes, ","), ":", absl::StrJoin(arg.layout.strides, ","),
                  "+", arg.layout.offset);
  if (arg.kind == TensorArg::Kind::kDevice)
    absl::StrAppend(&signature, "/", input_bytes[static_cast<std::size_t>(arg.input)]);
  else if (arg.literal.unsafeGetTensorImpl()->is_wrapped_number())
    absl::StrAppend(&signature, "w");
  return arg;
}

int TorchCall::input_of(RematStorage* storage, const Tensor& tensor, std::size_t bytes) {
  for (std::size_t i = 0; storage != nullptr && i < input_storages.size(); ++i)
    if (input_storages[i] == storage) return static_cast<int>(i);
  inputs.push_back(tensor);
  input_storages.push_back(storage);
  if (storage != nullptr) storage->read_in_step = Backend::get().step_serial();
  input_bytes.push_back(bytes);
  return static_cast<int>(inputs.size() - 1);
}

template <typename F>
torch::jit::Stack TorchCall::rebuild_arguments(c10::Device device, F&& device_tensor) const {
  torch::jit::Stack stack;
  std::size_t k = 0;
  for (const c10::IValue& v : values) {
    stack.push_back(map_tensors(
        v,
        [&](const at::Tensor& t) {
          const TensorArg& arg = tensors[k++];
          if (arg.kind == TensorArg::Kind::kLiteral) return arg.literal;
          if (arg.kind == TensorArg::Kind::kUndefined) return t;
          return device_tensor(arg);
        },
        device));
  }
  return stack;
}

torch::jit::Stack TorchCall::meta_arguments() const {
  return rebuild_arguments(c10::Device(c10::kMeta), [&](const TensorArg& arg) {
    return arg.layout.on_meta(input_bytes[static_cast<std::size_t>(arg.input)]);
  });
}

int TorchCall::version_of(int input) const {
  for (std::size_t k = 0; k < written_inputs.size(); ++k)
    if (written_inputs[k] == input) return static_cast<int>(fresh.size() + k);
  return -1;
}

torch::jit::Stack TorchCall::kernel_arguments(const KernelContext& ctx, c10::Device device) const {
  return rebuild_arguments(device, [&](const TensorArg& arg) {
    const int version = version_of(arg.input);
    const void* base = version >= 0 ? ctx.outputs[static_cast<std::size_t>(version)]
                                    : ctx.inputs[static_cast<std::size_t>(arg.input)];
    return arg.layout.over(base, device);
  });
}

std::vector<c10::IValue> TorchCall::call_kernel(torch::jit::Stack stack, const KernelContext& ctx,
                                                const Execution& execution) {
  std::optional<RngReplay> replay;
  if (rng.has_value() && ctx.recompute) replay.emplace(execution.generator(), *rng);
  op.redispatchBoxed(c10::DispatchKeySet(execution.kernel_key()), &stack);
  return stack;
}

std::vector<c10::IValue> TorchCall::run_eagerly(const KernelContext& ctx) {
  Execution& execution = Backend::get().execution();
  std::vector<c10::IValue> results;
  execution.around_kernel(ctx, [&] {
    results = call_kernel(kernel_arguments(ctx, execution.kernel_device()), ctx, execution);
    for (c10::IValue& r : results)  // the caller reads them on the host
      r = map_tensors(
          r, [](const at::Tensor& t) { return t.defined() && !t.is_cpu() ? t.cpu() : t; },
          c10::Device(c10::kCPU));
  });
  return results;
}

void TorchCall::run(const KernelContext& ctx) {
  Execution& execution = Backend::get().execution();
  execution.around_kernel(ctx, [&] { run_here(ctx, execution); });
  ran = true;
}

void TorchCall::run_here(const KernelContext& ctx, const Execution& execution) {
  std::vector<c10::IValue> results;
  if (first_results.has_value() && !ctx.recompute) {
    results = std::move(*first_results);
    first_results.reset();
  } else {
    KernelMemory memory;
    memory.context = &ctx;
    memory.declared = declared_scratch;
    for (std::size_t i = 0; i < fresh.size(); ++i)
      memory.outputs.push_back({ctx.outputs[i], fresh_bytes[i]});
    const c10::Device device = execution.kernel_device();
    torch::jit::Stack stack = kernel_arguments(ctx, device);
    if (device.is_cpu()) {
      // The CPU kernel's own allocations come from the op's memory (the allocator bridge),
      // and it has run when it returns: its time is its cost.
      const auto start = std::chrono::steady_clock::now();
      {
        KernelMemoryScope scope(&memory);
        results = call_kernel(std::move(stack), ctx, execution);
      }
      const std::chrono::duration<double, std::nano> took =
          std::chrono::steady_clock::now() - start;
      Backend::get().note_run(signature, memory.arena.extent(), took.count());
    } else {
      // A CUDA kernel's host allocations are the host's, and it returns once launched: the
      // runtime times it with events where costs are measured.
      results = call_kernel(std::move(stack), ctx, execution);
    }
  }
  if (!ctx.recompute && !published) adopt_result_layouts(results);
  copy_fresh_results(results, ctx, execution.kernel_device());
}

// Note [Results take the CPU kernel's layouts]
// A result's layout comes from the operator's meta kernel, and where that differs from what
// the CPU kernel returns the device is no longer the CPU program: a convolution over a
// channels-last input returns channels-last on the CPU (oneDNN's choice) and contiguous on
// meta, and every operator after it then runs on other strides, some with other kernels
// (ConvNeXt's depthwise convolutions' weight gradients differed in their last bits). So a
// first run that finds a fresh result laid out otherwise, in no more bytes than its output
// has, takes the CPU's layout for it, while the result's device tensor does not exist yet
// (a run a followed plan deferred keeps what it published); the caller remembers the layout
// for the signature's later calls (Note [Meta results are remembered]).
void TorchCall::adopt_result_layouts(const std::vector<c10::IValue>& results) {
  const std::vector<at::Tensor> flat = fresh_results(op.schema(), results);
  for (std::size_t i = 0; i < flat.size() && i < fresh.size(); ++i) {
    if (!flat[i].defined()) continue;
    Layout cpu = Layout::of(flat[i]);
    cpu.offset = 0;
    if (cpu.sizes != fresh[i].sizes || cpu.dtype != fresh[i].dtype ||
        cpu.strides == fresh[i].strides || cpu.extent_bytes() > fresh_bytes[i])
      continue;
    fresh[i] = std::move(cpu);
    relaid = true;
  }
}

// Note [Results that landed elsewhere]: a fresh result is copied to its output unless the
// kernel already wrote it there. One that sits in another output's memory is cloned first,
// so that copying an earlier result cannot overwrite it.
void TorchCall::copy_fresh_results(const std::vector<c10::IValue>& results,
                                   const KernelContext& ctx, c10::Device device) {
  const std::vector<at::Tensor> flat = fresh_results(op.schema(), results);
  if (flat.size() != fresh.size())
    throw std::logic_error("remat_torch: " + op.schema().name() + " returned " +
                           std::to_string(flat.size()) + " fresh tensors, its meta kernel " +
                           std::to_string(fresh.size()));
  std::vector<at::Tensor> sources(flat.size());
  for (std::size_t i = 0; i < flat.size(); ++i) {
    const at::Tensor& r = flat[i];
    if (!r.defined() || fresh[i].extent_bytes() == 0) continue;
    at::Tensor dst = fresh[i].over(ctx.outputs[i], device);
    if (r.const_data_ptr() == dst.const_data_ptr() && r.strides() == dst.strides()) continue;
    sources[i] = inside_outputs(r, ctx) ? r.clone() : r;
  }
  for (std::size_t i = 0; i < flat.size(); ++i)
    if (sources[i].defined()) fresh[i].over(ctx.outputs[i], device).copy_(sources[i]);
}

}  // namespace remat::torch_backend::detail
