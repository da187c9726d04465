#include "pytorch/detail/execution.h"

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

void Execution::side_read(Runtime&, const Tensor&, bool) {
  throw std::logic_error("remat_torch: the " + std::string(name()) +
                         " execution has no other stream to read on");
}

std::vector<std::string> execution_names() { return {"cpu", "simulated_cuda"}; }

std::unique_ptr<Execution> make_execution(std::string_view name) {
  if (name == "cpu") return std::make_unique<CpuExecution>();
  if (name == "simulated_cuda") return make_simulated_cuda_execution();
  throw std::invalid_argument("remat_torch: unknown execution '" + std::string(name) +
                              "'; known: " + absl::StrJoin(execution_names(), ", "));
}

std::string default_execution_name() {
  const char* chosen = std::getenv("REMAT_TORCH_EXECUTION");
  return chosen != nullptr && *chosen != '\0' ? chosen : "cpu";
}

}  // namespace remat::torch_backend::detail
