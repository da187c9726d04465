// Internal helpers shared by the CUDA kernel sources (not part of the public interface):
// status checks that throw, launch geometry, and fixed-order (deterministic) reductions.
//
//   REMAT_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream));
//   REMAT_LAUNCH(my_kernel, grid_for(n), kThreads, 0, stream)(...);
//   check_launch("my_kernel");
//
// The sources use REMAT_LAUNCH and REMAT_DYNAMIC_SHARED instead of CUDA's own syntax so that
// they compile for the host too (kernels/cuda/host: Note [Host execution of CUDA kernels]).
#ifndef REMAT_KERNELS_CUDA_CUDA_COMMON_CUH_
#define REMAT_KERNELS_CUDA_CUDA_COMMON_CUH_

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_kernels.h"

namespace remat::kernels::cuda::detail {

// A failed call is also the thread's last error, which the next launch check would report
// as that kernel's failure: it is cleared here, and reported once, by this throw (a sticky
// error cannot be cleared, and every later call reports it too).
inline void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    throw std::runtime_error(std::string(what) + " failed: " + cudaGetErrorName(status) + ": " +
                             cudaGetErrorString(status));
  }
}

inline void check_cublas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw std::runtime_error(std::string(what) + " failed: " + cublasGetStatusName(status) + ": " +
                             cublasGetStatusString(status));
  }
}

// After a <<<...>>> launch: reports a bad configuration or an earlier asynchronous error.
inline void check_launch(const char* kernel) {
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) check_cuda(status, (std::string("launch of ") + kernel).c_str());
}

// kernel<<<grid, block, smem, stream>>>(args...), written REMAT_LAUNCH(kernel, grid, block,
// smem, stream)(args...); on the host the grid runs before the call returns.
#ifdef REMAT_CUDA_HOST_EXECUTION
#define REMAT_LAUNCH(kernel, grid, block, smem, stream)                                  \
  ((void)(stream),                                                                       \
   ::remat::detail::cuda_host::LaunchConfig{dim3(grid), dim3(block), (smem), #kernel}->* \
       [](auto&... remat_args) { kernel(remat_args...); })
#define REMAT_DYNAMIC_SHARED(type, name) \
  type* name = static_cast<type*>(::remat::detail::cuda_host::dynamic_shared())
#else
#define REMAT_LAUNCH(kernel, grid, block, smem, stream) \
  kernel<<<(grid), (block), (smem), (stream)>>>
#define REMAT_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#endif

#define REMAT_CUDA_CHECK(expr) ::remat::kernels::cuda::detail::check_cuda((expr), #expr)
#define REMAT_CUBLAS_CHECK(expr) ::remat::kernels::cuda::detail::check_cublas((expr), #expr)

// The cuBLAS handle of this thread and the current device, bound to `stream` and to
// `workspace` where it is given, else to that stream's own workspace (defined in
// cuda_blas.cu).
cublasHandle_t blas_handle(cudaStream_t stream, BlasWorkspace workspace);

// A kernel whose shared arrays are sized for its block (column_sum_kernel's tiles) declares
// that block size with __launch_bounds__; block_reduce serves any multiple of 32 up to 1024
// threads, so the reductions need none. The build fails where a kernel's registers spill to
// local memory on any architecture built (-Xptxas -warn-spills, kernels/CMakeLists.txt): the
// resource gates a GPU would otherwise only show as slowness.
constexpr int kThreads = 256;  // elementwise and most reduction kernels
constexpr int kWarp = 32;

// Blocks for a grid-stride loop over n items (kernels loop, so the grid may be capped). On
// the host the cap can be lowered, so that tests run every grid-stride loop at grids of 1, 3
// or 5 blocks too.
inline unsigned grid_for(i64 n, int threads = kThreads) {
  const i64 blocks = (n + threads - 1) / threads;
#ifdef REMAT_CUDA_HOST_EXECUTION
  const i64 cap = ::remat::detail::cuda_host::grid_stride_cap();
#else
  const i64 cap = i64{1} << 20;
#endif
  return static_cast<unsigned>(std::clamp<i64>(blocks, 1, cap));
}

// Blocks for a loop of one block per item.
inline unsigned grid_blocks(i64 items) {
  return static_cast<unsigned>(std::clamp<i64>(items, 1, i64{1} << 30));
}

#define REMAT_GRID_STRIDE(i, n)                                                             \
  for (::remat::kernels::cuda::i64 i =                                                      \
           static_cast<::remat::kernels::cuda::i64>(blockIdx.x) * blockDim.x + threadIdx.x; \
       i < (n); i += static_cast<::remat::kernels::cuda::i64>(blockDim.x) * gridDim.x)

struct SumOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// Butterfly reduction inside one warp. Every lane ends with the same bits (each step combines
// the same two values, and both ops are commutative), and the order is fixed, so the result
// depends on the inputs only.
template <class Op>
__device__ __forceinline__ float warp_reduce(float v, Op op) {
#pragma unroll
  for (int off = kWarp / 2; off > 0; off /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// Block-wide reduction for a block of blockDim.x threads (a multiple of 32, at most 1024):
// each warp reduces its lanes, then warp 0 reduces the per-warp values, always in the same
// order. Every thread of the block must call it; all get the result. `scratch` holds 32 floats.
template <class Op>
__device__ __forceinline__ float block_reduce(float v, float* scratch, float identity, Op op) {
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  v = warp_reduce(v, op);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float w = lane < warps ? scratch[lane] : identity;
    w = warp_reduce(w, op);
    if (lane == 0) scratch[0] = w;
  }
  __syncthreads();
  const float result = scratch[0];
  __syncthreads();  // scratch may be reused right away
  return result;
}

__device__ __forceinline__ float warp_sum(float v) { return warp_reduce(v, SumOp{}); }
__device__ __forceinline__ float warp_max(float v) { return warp_reduce(v, MaxOp{}); }
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  return block_reduce(v, scratch, 0.0f, SumOp{});
}
__device__ __forceinline__ float block_max(float v, float* scratch) {
  return block_reduce(v, scratch, -INFINITY, MaxOp{});
}

// Sets the dynamic shared memory a kernel may ask for when it is above the 48 KiB default.
template <class Kernel>
void allow_dynamic_smem(Kernel kernel, std::size_t bytes, const char* name) {
  if (bytes > 48 * 1024) {
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(bytes)),
               (std::string("cudaFuncSetAttribute(") + name + ")").c_str());
  }
}

// Output size of a window sliding over `in` (padded by 2*pad); 0 when the window never fits.
inline i64 out_dim(i64 in, i64 pad, i64 k, i64 stride) {
  const i64 span = in + 2 * pad - k;
  return (span < 0 || k <= 0 || stride <= 0) ? 0 : span / stride + 1;
}

}  // namespace remat::kernels::cuda::detail

#endif  // REMAT_KERNELS_CUDA_CUDA_COMMON_CUH_
