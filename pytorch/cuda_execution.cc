// The `cuda` execution (Note [Executions]): the runtime on the GPU, each call rebuilt over
// CUDA tensors made from remat's device pointers and redispatched to the operator's CUDA
// kernel, on the runtime's stream. Built where torch and remat both have CUDA.
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <memory>

#include "pytorch/detail/execution.h"

namespace remat::torch_backend::detail {
namespace {

class CudaExecution final : public Execution {
 public:
  std::string_view name() const override { return "cuda"; }

  void configure(RuntimeOptions& options) override {
    options.backend = remat::Backend::kCuda;
    options.cuda = CudaOptions{};
    options.cuda.device = device_;
    // torch's cuBLAS takes its workspace from torch's allocator; remat's kernels do not run.
    options.cuda.blas_workspace_bytes = 4 << 10;
    // The runtime's own stream; the kernel is host code that enqueues on it (around_kernel
    // makes it torch's current stream), so the launch is the op's kernel itself.
    options.cuda.launch = [](const OpDef& op, const KernelContext& k) { op.kernel(k); };
  }
  c10::Device kernel_device() const override { return c10::Device(c10::kCUDA, device_); }
  c10::DispatchKey kernel_key() const override { return c10::DispatchKey::CUDA; }
  at::Generator generator() const override {
    return at::cuda::detail::getDefaultCUDAGenerator(device_);
  }
  void around_kernel(const KernelContext& ctx, absl::FunctionRef<void()> kernel) override {
    const c10::cuda::CUDAGuard device(device_);
    const c10::cuda::CUDAStreamGuard stream(
        c10::cuda::getStreamFromExternal(reinterpret_cast<cudaStream_t>(ctx.stream), device_));
    kernel();
  }

 private:
  c10::DeviceIndex device_ = 0;
};

}  // namespace

std::unique_ptr<Execution> make_cuda_execution() { return std::make_unique<CudaExecution>(); }

bool cuda_execution_usable() {
  try {
    return c10::cuda::device_count() > 0;
  } catch (...) {  // any error finding a GPU is no GPU
    return false;
  }
}

}  // namespace remat::torch_backend::detail
