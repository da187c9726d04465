// Which kernel torch's scaled_dot_product_attention runs on the device.
//
// Note [Attention picks the CPU's kernel]
// F.scaled_dot_product_attention picks its implementation through a DispatchStub, not the
// dispatcher: a device without an entry gets the math path, which materializes the scores,
// the masked scores and their softmax (each batch x heads x T x T) and saves them for the
// backward pass. The CPU's entry picks the fused flash kernel, which keeps only the output
// and a log-sum-exp per row. The device's entry asks the CPU's kernel of _fused_sdp_choice
// (redispatched to the CPU key, not through the stub, whose entry points vary with the CPU
// features torch was built for), which reads only metadata (dtypes, shapes, strides,
// flags), so the device runs what the program would run on the CPU:
// the same kernel, the same bits, and none of the T x T memory remat would otherwise have to
// evict and recompute. The chosen op (_scaled_dot_product_flash_attention_for_cpu) then comes
// to the device's fallback as any other. Under the `cuda` execution (Note [Executions]) it is
// the math path for now: CUDA's fused choices call operators (the flash kernel's CPU variant
// for a query off CUDA, say) that the device's fallback cannot send to a CUDA kernel yet
// (issue 54).
#include <ATen/SDPBackend.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/_fused_sdp_choice_ops.h>
#include <torch/version.h>

#include "pytorch/detail/backend.h"

namespace remat::torch_backend::detail {
namespace {

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 5)
int64_t choose_as_the_kernels(const at::Tensor& query, const at::Tensor& key,
                              const at::Tensor& value, const std::optional<at::Tensor>& attn_mask,
                              double dropout_p, bool is_causal, std::optional<double> scale,
                              bool enable_gqa) {
  if (Backend::get().execution().kernel_key() != c10::DispatchKey::CPU)
    return static_cast<int64_t>(at::SDPBackend::math);
  return at::_ops::_fused_sdp_choice::redispatch(c10::DispatchKeySet(c10::DispatchKey::CPU), query,
                                                 key, value, attn_mask, dropout_p, is_causal, scale,
                                                 enable_gqa);
}
#endif

}  // namespace
}  // namespace remat::torch_backend::detail

namespace at::native {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 5)
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub,
                              &remat::torch_backend::detail::choose_as_the_kernels)
#endif
}  // namespace at::native
