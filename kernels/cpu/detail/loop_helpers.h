// What the CPU kernels' source files share: how finely a loop is split across threads, and
// zeroing. Internal to kernels/cpu.
#ifndef REMAT_KERNELS_CPU_DETAIL_LOOP_HELPERS_H_
#define REMAT_KERNELS_CPU_DETAIL_LOOP_HELPERS_H_

#include <algorithm>
#include <cstring>

#include "kernels/cpu/cpu_kernels.h"

namespace remat::kernels::cpu::detail {

// Items below which a loop is not worth waking another thread for (Note [Deterministic
// threading] in parallel.h): about 20 us of simple float work.
constexpr i64 kGrain = i64{1} << 15;
inline i64 row_grain(i64 cols) { return std::max<i64>(1, kGrain / std::max<i64>(cols, 1)); }

inline void zero(float* p, i64 n) {
  if (n > 0) std::memset(p, 0, static_cast<std::size_t>(n) * sizeof(float));
}

}  // namespace remat::kernels::cpu::detail

#endif  // REMAT_KERNELS_CPU_DETAIL_LOOP_HELPERS_H_
