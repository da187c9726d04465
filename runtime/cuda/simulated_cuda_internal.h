// Helpers the simulated device's source files share (simulated_cuda.cc, its virtual memory in
// simulated_cuda_vmm.cc). Internal to remat::simulated_cuda.
#ifndef REMAT_RUNTIME_CUDA_SIMULATED_CUDA_INTERNAL_H_
#define REMAT_RUNTIME_CUDA_SIMULATED_CUDA_INTERNAL_H_

#include <cstddef>
#include <cstdint>

#include "runtime/cuda/simulated_cuda.h"

namespace remat::detail::simulated_cuda {

inline constexpr std::size_t kMallocAlignment = 256;  // what cudaMalloc guarantees
inline constexpr std::uintptr_t kHandleBase =
    0x5100;  // stream and event handles: never dereferenced

inline std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }
inline std::uintptr_t address(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }
inline const void* pointer(std::uintptr_t a) { return reinterpret_cast<const void*>(a); }
inline std::size_t index(SimulatedCall call) { return static_cast<std::size_t>(call); }

// The entry of a map keyed by base address whose [base, base + bytes) holds `a`.
template <typename Map>
auto containing(Map& map, std::uintptr_t a) -> decltype(map.begin()) {
  auto it = map.upper_bound(a);
  if (it == map.begin()) return map.end();
  --it;
  return a < it->first + it->second.bytes ? it : map.end();
}

inline bool overlap(std::uintptr_t b1, std::uintptr_t e1, std::uintptr_t b2, std::uintptr_t e2) {
  return b1 < e2 && b2 < e1;
}

}  // namespace remat::detail::simulated_cuda

#endif  // REMAT_RUNTIME_CUDA_SIMULATED_CUDA_INTERNAL_H_
