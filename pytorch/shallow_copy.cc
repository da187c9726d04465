// Which tensors may take a device tensor's contents in place, and the reverse: the device's
// answer to `_has_compatible_shallow_copy_type`.
//
// Note [Moves keep identity]
// `Module.to(device)` (Python's Module._apply, C++'s Module::to) and `param.data = t` keep a
// parameter's identity only where `set_data` may shallow-copy the converted tensor into the
// old one, which it asks `_has_compatible_shallow_copy_type`. Its default answer lists the
// dense backends by name (CPU, CUDA, ...), and PrivateUse1 is not among them, so before this
// kernel every module that held a parameter got a new Parameter of its own: two modules
// sharing one weight (a language model's tied embedding and output layer) trained two
// copies, an optimizer built before the move kept the old ones, and hooks registered on a
// parameter were left behind. torch lets a PrivateUse1 backend answer for itself; a device
// tensor is an ordinary strided TensorImpl over a storage (Note [A torch storage is a remat
// storage]), which `shallow_copy_from` moves like any dense tensor's, so the answer is yes
// between the device and a dense backend. The move then takes the path `.to('cuda')` takes:
// the same Python object, the same autograd metadata (hooks, `retain_grad`), a gradient
// accumulator made anew because the device changed. Buffers are not covered: Module._apply
// gives each module the converted copy of its buffer on every device (CUDA too), so a buffer
// two modules share becomes two, as it does there.
#include <ATen/core/Tensor.h>
#include <c10/core/TensorImpl.h>
#include <torch/library.h>

#include <typeinfo>

namespace remat::torch_backend::detail {
namespace {

// A plain strided tensor (not a wrapper, a quantized, sparse or nested tensor: those have
// TensorImpl kinds of their own) on the device or on a dense backend.
bool plain_dense(const at::Tensor& t) {
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  if (typeid(*impl) != typeid(c10::TensorImpl) || t.layout() != c10::kStrided) return false;
  if (!t.key_set().has(c10::DispatchKey::Dense) || t.key_set().has(c10::DispatchKey::Python))
    return false;
  switch (t.device().type()) {
    case c10::DeviceType::PrivateUse1:
    case c10::DeviceType::CPU:
    case c10::DeviceType::CUDA:
    case c10::DeviceType::HIP:
    case c10::DeviceType::XPU:
    case c10::DeviceType::MPS:
      return true;
    default:
      return false;
  }
}

bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  if (plain_dense(self) && plain_dense(from)) return true;
  // Anything else answers as torch's own check would.
  return self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set());
}

}  // namespace
}  // namespace remat::torch_backend::detail

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_has_compatible_shallow_copy_type",
         TORCH_FN(remat::torch_backend::detail::has_compatible_shallow_copy_type));
}
