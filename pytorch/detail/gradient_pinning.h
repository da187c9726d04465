// Gradients of parameters on the device are pinned once accumulated (Note [Gradients are
// pinned]).
#ifndef REMAT_PYTORCH_DETAIL_GRADIENT_PINNING_H_
#define REMAT_PYTORCH_DETAIL_GRADIENT_PINNING_H_

#include <ATen/core/Tensor.h>

namespace remat::torch_backend::detail {

// Note [Gradients are pinned]
// A parameter's gradient is held from the backward pass to the optimizer's step, which
// reads every one of them after writing the first parameter; the runtime then freezes every
// held tensor whose recomputation would read the old parameter (Note [Updating pinned
// tensors]): all the gradients. One evicted during the backward pass would have to be
// recomputed there, through the activations it came from, with every other gradient, the
// parameters and the optimizer's state pinned around it: the worst moment to recompute. So
// a leaf that requires grad gets, when an operator on the device first reads it, a hook
// that runs once autograd has accumulated its gradient and makes that gradient a constant
// (Note [State is pinned]). It takes the tensor's one post-accumulate-grad hook slot: a
// Python hook registered on the tensor later replaces it (the gradient is then evictable).
void pin_gradients_of(const at::Tensor& leaf);

}  // namespace remat::torch_backend::detail

#endif  // REMAT_PYTORCH_DETAIL_GRADIENT_PINNING_H_
