// The cuBLAS calls the kernel sources make, served by OpenBLAS on the host (see
// kernels/cuda/host/cuda_host.h). Column-major, as cuBLAS is.
#ifndef REMAT_KERNELS_CUDA_HOST_CUBLAS_V2_H_
#define REMAT_KERNELS_CUDA_HOST_CUBLAS_V2_H_

#include <cstddef>

#include "kernels/cuda/host/include/cuda_runtime.h"

enum cublasStatus_t { CUBLAS_STATUS_SUCCESS = 0, CUBLAS_STATUS_INVALID_VALUE = 7 };
enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 };
enum cublasMath_t { CUBLAS_DEFAULT_MATH = 0 };
enum cublasAtomicsMode_t { CUBLAS_ATOMICS_NOT_ALLOWED = 0, CUBLAS_ATOMICS_ALLOWED = 1 };
enum cublasPointerMode_t { CUBLAS_POINTER_MODE_HOST = 0 };

struct cublasContext {};
using cublasHandle_t = cublasContext*;

const char* cublasGetStatusName(cublasStatus_t status);
const char* cublasGetStatusString(cublasStatus_t status);
cublasStatus_t cublasCreate(cublasHandle_t* handle);
cublasStatus_t cublasDestroy(cublasHandle_t handle);
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream);
cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void* workspace, std::size_t bytes);
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode);
cublasStatus_t cublasSetAtomicsMode(cublasHandle_t handle, cublasAtomicsMode_t mode);
cublasStatus_t cublasSetPointerMode(cublasHandle_t handle, cublasPointerMode_t mode);
cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa,
                           cublasOperation_t transb, int m, int n, int k, const float* alpha,
                           const float* a, int lda, const float* b, int ldb, const float* beta,
                           float* c, int ldc);

namespace remat::detail::cuda_host {
// What this thread's last cublasSetWorkspace call was given, and how many it has made: tests
// check that a GEMM lent a workspace hands cuBLAS that very memory (there is no cuBLAS here
// to use it).
struct BlasWorkspaceCall {
  void* ptr = nullptr;
  std::size_t bytes = 0;
  std::size_t calls = 0;
};
BlasWorkspaceCall last_blas_workspace();
}  // namespace remat::detail::cuda_host

#endif  // REMAT_KERNELS_CUDA_HOST_CUBLAS_V2_H_
