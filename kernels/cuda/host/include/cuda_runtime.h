// The CUDA runtime API as the kernel sources and their tests use it, served on the host (see
// kernels/cuda/host/cuda_host.h). Found before the toolkit's header only by the host-execution
// targets; device memory is host memory and every stream operation is synchronous.
#ifndef REMAT_KERNELS_CUDA_HOST_CUDA_RUNTIME_H_
#define REMAT_KERNELS_CUDA_HOST_CUDA_RUNTIME_H_

#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>

#include "kernels/cuda/host/cuda_host.h"

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
};
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};
enum cudaDeviceAttr { cudaDevAttrComputeCapabilityMajor = 75 };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };

struct CUstream_st {};
using cudaStream_t = CUstream_st*;

namespace remat::detail::cuda_host {
cudaError_t take_last_error();
// Records `e` as the last error, as the CUDA runtime does for every call that fails.
cudaError_t record_error(cudaError_t e);
// Tests: the next `n` cudaMalloc calls fail with cudaErrorMemoryAllocation.
void fail_next_mallocs(int n);
bool take_malloc_failure();
}  // namespace remat::detail::cuda_host

inline const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
  }
  return "cudaErrorUnknown";
}
inline const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
  }
  return "unknown error";
}
inline cudaError_t cudaGetLastError() { return remat::detail::cuda_host::take_last_error(); }

inline cudaError_t cudaMalloc(void** p, std::size_t bytes) {
  *p = remat::detail::cuda_host::take_malloc_failure()
           ? nullptr
           : std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  return *p != nullptr ? cudaSuccess
                       : remat::detail::cuda_host::record_error(cudaErrorMemoryAllocation);
}
inline cudaError_t cudaFree(void* p) {
  std::free(p);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes,
                                   cudaMemcpyKind kind, cudaStream_t = nullptr) {
  return cudaMemcpy(dst, src, bytes, kind);
}
inline cudaError_t cudaMemsetAsync(void* p, int value, std::size_t bytes, cudaStream_t = nullptr) {
  if (bytes > 0) std::memset(p, value, bytes);
  return cudaSuccess;
}
inline cudaError_t cudaStreamCreate(cudaStream_t* s) {
  *s = new CUstream_st;
  return cudaSuccess;
}
inline cudaError_t cudaStreamDestroy(cudaStream_t s) {
  delete s;
  return cudaSuccess;
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
inline cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
inline cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}
inline cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr, int) {
  *value = 9;  // answered as a Hopper device
  return cudaSuccess;
}
template <class Kernel>
cudaError_t cudaFuncSetAttribute(Kernel, cudaFuncAttribute, int value) {
  return value >= 0 && value <= 227 * 1024 ? cudaSuccess : cudaErrorInvalidValue;
}

#endif  // REMAT_KERNELS_CUDA_HOST_CUDA_RUNTIME_H_
