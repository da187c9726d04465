// Host execution of the CUDA kernel sources: what `kernels/cuda/*.cu` use of CUDA, served on
// the CPU so that the very sources run (and are tested, also under ThreadSanitizer) on a
// machine without a GPU. Included through the shim's <cuda_runtime.h>; never with nvcc.
//
//   REMAT_LAUNCH(my_kernel, grid, block, smem, stream)(args...);   // in the .cu sources
//
// Note [Host execution of CUDA kernels]
// A launch starts one host thread per CUDA thread of a block and runs the grid's blocks one
// after another on those threads, so that `__shared__` arrays can be function statics (one
// block at a time uses them). `__syncthreads` is a barrier of the block's threads, and the
// warp intrinsics (shuffles, ballots) exchange values through a per-warp buffer between two
// barriers of the warp's lanes, so every lane sees its partners' values as the hardware would
// give them. A thread that returns early drops out of both barriers, as an exited GPU thread
// no longer counts at one. Between blocks all threads meet at a gate, which makes the next
// block's statics and barriers safe to reuse. Work on streams is synchronous: a launch or a
// copy has finished when the call returns. What this cannot show: timing, occupancy, register
// spills, memory coalescing, and races between blocks that run concurrently on a GPU.
#ifndef REMAT_KERNELS_CUDA_HOST_CUDA_HOST_H_
#define REMAT_KERNELS_CUDA_HOST_CUDA_HOST_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#define REMAT_CUDA_HOST_EXECUTION 1

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

struct float2 {
  float x, y;
};
inline float2 make_float2(float x, float y) { return {x, y}; }

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
// One block runs at a time (Note [Host execution of CUDA kernels]), so a block's shared
// arrays can be statics of the kernel function.
#define __shared__ static

extern thread_local dim3 threadIdx;
extern thread_local dim3 blockIdx;
extern thread_local dim3 blockDim;
extern thread_local dim3 gridDim;

namespace remat::detail::cuda_host {

// The work of one CUDA thread: the kernel with this launch's arguments.
class ThreadBody {
 public:
  virtual ~ThreadBody() = default;
  virtual void run() const = 0;  // each call uses its own copy of the arguments
};

// Runs `body` for every thread of every block of the grid (see the Note). Records a launch
// error (a block of no threads or more than 1024, an empty grid, too much shared memory)
// for cudaGetLastError instead of running.
void run_grid(dim3 grid, dim3 block, std::size_t dynamic_smem, const ThreadBody& body,
              const char* kernel);
// The names of the kernels that have run (as written at their launch), since the start.
std::vector<std::string> kernels_run();

// The most blocks grid_for() gives a grid-stride kernel (2^20 unless a test lowers it).
std::int64_t grid_stride_cap();
void set_grid_stride_cap(std::int64_t blocks);

void sync_threads();
std::uint32_t warp_shuffle_xor(std::uint32_t mask, std::uint32_t value, int lane_mask);
std::uint32_t warp_ballot(std::uint32_t mask, bool predicate);
void* dynamic_shared();  // this block's dynamic shared memory

template <class Kernel, class... Args>
class KernelBody final : public ThreadBody {
 public:
  KernelBody(Kernel kernel, Args... args) : kernel_(kernel), args_(std::move(args)...) {}
  void run() const override {
    std::tuple<Args...> mine = args_;  // kernel parameters are the thread's own
    std::apply(kernel_, mine);
  }

 private:
  Kernel kernel_;
  std::tuple<Args...> args_;
};

template <class Kernel>
class Launch {
 public:
  Launch(dim3 grid, dim3 block, std::size_t smem, const char* name, Kernel kernel)
      : grid_(grid), block_(block), smem_(smem), name_(name), kernel_(kernel) {}
  template <class... Args>
  void operator()(Args&&... args) const {
    run_grid(grid_, block_, smem_,
             KernelBody<Kernel, std::decay_t<Args>...>(kernel_, std::forward<Args>(args)...),
             name_);
  }

 private:
  dim3 grid_, block_;
  std::size_t smem_;
  const char* name_;
  Kernel kernel_;
};

struct LaunchConfig {
  dim3 grid, block;
  std::size_t smem;
  const char* name;
  template <class Kernel>
  Launch<Kernel> operator->*(Kernel kernel) const {
    return Launch<Kernel>(grid, block, smem, name, kernel);
  }
};

}  // namespace remat::detail::cuda_host

inline void __syncthreads() { remat::detail::cuda_host::sync_threads(); }

inline float __shfl_xor_sync(unsigned mask, float v, int lane_mask) {
  std::uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  bits = remat::detail::cuda_host::warp_shuffle_xor(mask, bits, lane_mask);
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}
inline unsigned __ballot_sync(unsigned mask, int predicate) {
  return remat::detail::cuda_host::warp_ballot(mask, predicate != 0);
}
inline int __popc(unsigned v) { return __builtin_popcount(v); }

#endif  // REMAT_KERNELS_CUDA_HOST_CUDA_HOST_H_
