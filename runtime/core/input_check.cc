#include "runtime/core/input_check.h"

#include <absl/strings/str_cat.h>

#include <cstddef>
#include <stdexcept>
#include <string>

namespace remat::detail {
namespace {

// FNV-1a over the bytes: a debugging aid, not a defence.
std::uint64_t hash_bytes(const void* p, std::size_t n) {
  const auto* b = static_cast<const unsigned char*>(p);
  std::uint64_t h = 1469598103934665603ULL;
  for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ULL;
  return h;
}

bool overlaps_an_output(const KernelContext& ctx, const void* p, std::size_t bytes) {
  const auto* begin = static_cast<const unsigned char*>(p);
  for (std::size_t j = 0; j < ctx.outputs.size(); ++j) {
    const auto* out = static_cast<const unsigned char*>(ctx.outputs[j]);
    if (out == nullptr) continue;
    const std::size_t out_bytes = ctx.output_specs[j]->bytes();
    if (begin < out + out_bytes && out < begin + bytes) return true;
  }
  return false;
}

}  // namespace

InputCheck::InputCheck(const KernelContext& ctx) {
  for (std::size_t i = 0; i < ctx.inputs.size(); ++i) {
    const std::size_t bytes = ctx.input_specs[i]->bytes();
    if (ctx.inputs[i] == nullptr || bytes == 0 || overlaps_an_output(ctx, ctx.inputs[i], bytes))
      continue;
    checked_.push_back(static_cast<std::int64_t>(i));
    hashes_.push_back(hash_bytes(ctx.inputs[i], bytes));
  }
}

void InputCheck::verify(const KernelContext& ctx, const std::string& op) const {
  for (std::size_t k = 0; k < checked_.size(); ++k) {
    const auto i = static_cast<std::size_t>(checked_[k]);
    if (hash_bytes(ctx.inputs[i], ctx.input_specs[i]->bytes()) != hashes_[k]) {
      throw std::logic_error(absl::StrCat(
          "remat: the kernel of op '", op, "' wrote into its input ", i,
          " (RuntimeOptions::check_inputs); a kernel may write only its outputs, since "
          "recomputation reads its inputs again"));
    }
  }
}

}  // namespace remat::detail
