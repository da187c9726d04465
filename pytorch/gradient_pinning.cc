#include "pytorch/detail/gradient_pinning.h"

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <memory>
#include <mutex>

#include "pytorch/detail/backend.h"

namespace remat::torch_backend::detail {
namespace {

class PinGradient final : public torch::autograd::PostAccumulateGradHook {
 public:
  void operator()(const torch::autograd::Variable& leaf) override {
    const at::Tensor& grad = leaf.grad();
    if (!grad.defined()) return;
    RematStorage* s = remat_storage_of(grad.storage());
    if (s == nullptr || s->pinned) return;
    Backend& backend = Backend::get();
    std::lock_guard<std::recursive_mutex> lock(backend.mutex());
    pin_storage(*s, backend.runtime());
  }
};

}  // namespace

void pin_gradients_of(const at::Tensor& leaf) {
  if (!leaf.requires_grad() || !leaf.is_leaf()) return;
  auto& hook = torch::autograd::impl::post_acc_grad_hooks(leaf);
  if (hook != nullptr) return;
  torch::autograd::impl::set_post_acc_grad_hooks(leaf, std::make_unique<PinGradient>());
}

}  // namespace remat::torch_backend::detail
