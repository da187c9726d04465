// RuntimeOptions::check_inputs: inputs a kernel wrote into. Internal to the runtime.
#ifndef REMAT_RUNTIME_CORE_INPUT_CHECK_H_
#define REMAT_RUNTIME_CORE_INPUT_CHECK_H_

#include <cstdint>
#include <vector>

#include "remat/op.h"

namespace remat::detail {

// Hashes a kernel's inputs when made, and again in `verify`, which throws std::logic_error
// naming the op and the first input whose bytes changed. Inputs that share memory with an
// output (an update's or an accumulation's constants) are skipped: writing them is the op.
class InputCheck {
 public:
  explicit InputCheck(const KernelContext& ctx);
  void verify(const KernelContext& ctx, const std::string& op) const;

 private:
  std::vector<std::int64_t> checked_;  // input indices
  std::vector<std::uint64_t> hashes_;
};

}  // namespace remat::detail

#endif  // REMAT_RUNTIME_CORE_INPUT_CHECK_H_
