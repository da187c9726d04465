// The operators on the device: the boxed fallback every operator without a kernel of its own
// reaches, and the few that need one (Note [Running torch operators as remat ops]).
#ifndef REMAT_PYTORCH_DETAIL_DEVICE_OPS_H_
#define REMAT_PYTORCH_DETAIL_DEVICE_OPS_H_

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace remat::torch_backend::detail {

// Runs `op` on the device tensors of `stack`, through the runtime.
void device_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                     torch::jit::Stack* stack);
// Operators that change a tensor's metadata in place (`t_`, `unsqueeze_`, `resize_`).
void run_inplace_view(const c10::OperatorHandle& op, torch::jit::Stack& stack);
// `set_`: a device tensor given another storage (storage copies, deepcopy).
void run_set(const c10::OperatorHandle& op, torch::jit::Stack& stack);
// `is_set_to`: the same storage, offset, sizes and strides.
void run_is_set_to(const c10::OperatorHandle& op, torch::jit::Stack& stack);
// `_to_copy`: to the device from the CPU (a constant), to the CPU from the device (a read).
// Returns false where both ends are the device (an ordinary op).
bool run_to_copy(const c10::OperatorHandle& op, torch::jit::Stack& stack);

}  // namespace remat::torch_backend::detail

#endif  // REMAT_PYTORCH_DETAIL_DEVICE_OPS_H_
