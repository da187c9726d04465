// Wall-clock time for the runtime's own measurements (search time, measured op costs).
#ifndef REMAT_RUNTIME_CORE_WALL_CLOCK_H_
#define REMAT_RUNTIME_CORE_WALL_CLOCK_H_

#include <chrono>

namespace remat::detail {

using SteadyClock = std::chrono::steady_clock;

inline double seconds_since(SteadyClock::time_point start) {
  return std::chrono::duration<double>(SteadyClock::now() - start).count();
}

}  // namespace remat::detail

#endif  // REMAT_RUNTIME_CORE_WALL_CLOCK_H_
