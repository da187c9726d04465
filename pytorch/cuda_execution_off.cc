// Where torch or remat was built without CUDA: no `cuda` execution (Note [Executions]).
#include <memory>

#include "pytorch/detail/execution.h"

namespace remat::torch_backend::detail {

std::unique_ptr<Execution> make_cuda_execution() { return nullptr; }
bool cuda_execution_usable() { return false; }

}  // namespace remat::torch_backend::detail
