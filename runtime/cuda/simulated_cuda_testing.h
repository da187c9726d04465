// For the simulated device's tests: streams, events and memory made with their results
// checked. Not part of any library.
#ifndef REMAT_RUNTIME_CUDA_SIMULATED_CUDA_TESTING_H_
#define REMAT_RUNTIME_CUDA_SIMULATED_CUDA_TESTING_H_

#include <gtest/gtest.h>

#include <cstddef>

#include "runtime/cuda/simulated_cuda.h"

namespace remat::sim_testing {

inline CudaStream make_stream(SimulatedCuda& sim) {
  CudaStream s = nullptr;
  EXPECT_TRUE(sim.stream_create(&s).ok());
  return s;
}

inline CudaEvent make_event(SimulatedCuda& sim, bool timing = false) {
  CudaEvent e = nullptr;
  EXPECT_TRUE(sim.event_create(&e, timing).ok());
  return e;
}

inline char* device_alloc(SimulatedCuda& sim, std::size_t bytes) {
  void* p = nullptr;
  EXPECT_TRUE(sim.malloc(&p, bytes).ok());
  return static_cast<char*>(p);
}

inline char* pinned_alloc(SimulatedCuda& sim, std::size_t bytes) {
  void* p = nullptr;
  EXPECT_TRUE(sim.malloc_host(&p, bytes).ok());
  return static_cast<char*>(p);
}

}  // namespace remat::sim_testing

#endif  // REMAT_RUNTIME_CUDA_SIMULATED_CUDA_TESTING_H_
