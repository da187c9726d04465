#include "pytorch/detail/execution.h"

#include <ATen/CPUGeneratorImpl.h>
#include <absl/strings/str_join.h>

#include <cstdlib>
#include <stdexcept>

namespace remat::torch_backend::detail {
namespace {

class CpuExecution final : public Execution {
 public:
  std::string_view name() const override { return "cpu"; }
  void configure(RuntimeOptions& options) override {
    options.backend = remat::Backend::kCpu;
    options.cuda = CudaOptions{};
  }
};

}  // namespace

at::Generator Execution::generator() const { return at::detail::getDefaultCPUGenerator(); }

void Execution::side_read(Runtime&, const Tensor&, bool) {
  throw std::logic_error("remat_torch: the " + std::string(name()) +
                         " execution has no other stream to read on");
}

std::vector<std::string> execution_names() {
  std::vector<std::string> names{"cpu", "simulated_cuda"};
  if (make_cuda_execution() != nullptr) names.push_back("cuda");
  return names;
}

std::unique_ptr<Execution> make_execution(std::string_view name) {
  if (name == "cpu") return std::make_unique<CpuExecution>();
  if (name == "simulated_cuda") return make_simulated_cuda_execution();
  if (name == "cuda") {
    std::unique_ptr<Execution> cuda = make_cuda_execution();
    if (cuda == nullptr)
      throw std::invalid_argument(
          "remat_torch: the cuda execution was not built (torch or remat without CUDA)");
    return cuda;
  }
  throw std::invalid_argument("remat_torch: unknown execution '" + std::string(name) +
                              "'; known: " + absl::StrJoin(execution_names(), ", "));
}

std::string default_execution_name() {
  const char* chosen = std::getenv("REMAT_TORCH_EXECUTION");
  // `cuda` becomes the default where a GPU is usable once it has run on one.
  return chosen != nullptr && *chosen != '\0' ? chosen : "cpu";
}

}  // namespace remat::torch_backend::detail
