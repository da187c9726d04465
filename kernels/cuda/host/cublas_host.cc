// cuBLAS on the host: the calls kernels/cuda/cuda_blas.cu makes, with GEMM by OpenBLAS.

#include <cstdint>

#include "kernels/cpu/blas.h"
#include "kernels/cuda/host/include/cublas_v2.h"

const char* cublasGetStatusName(cublasStatus_t status) {
  return status == CUBLAS_STATUS_SUCCESS ? "CUBLAS_STATUS_SUCCESS" : "CUBLAS_STATUS_INVALID_VALUE";
}
const char* cublasGetStatusString(cublasStatus_t status) {
  return status == CUBLAS_STATUS_SUCCESS ? "success" : "an invalid value was used as an argument";
}
cublasStatus_t cublasCreate(cublasHandle_t* handle) {
  *handle = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t, cudaStream_t) { return CUBLAS_STATUS_SUCCESS; }
namespace {
thread_local remat::detail::cuda_host::BlasWorkspaceCall last_workspace;
}  // namespace

remat::detail::cuda_host::BlasWorkspaceCall remat::detail::cuda_host::last_blas_workspace() {
  return last_workspace;
}

cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void* workspace, std::size_t bytes) {
  // cuBLAS refuses a workspace aligned to less than 256 bytes; so does the shim, so that the
  // host run catches a caller lending one.
  if (handle == nullptr || reinterpret_cast<std::uintptr_t>(workspace) % 256 != 0)
    return CUBLAS_STATUS_INVALID_VALUE;
  last_workspace.ptr = workspace;
  last_workspace.bytes = bytes;
  ++last_workspace.calls;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t, cublasMath_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetAtomicsMode(cublasHandle_t, cublasAtomicsMode_t) {
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetPointerMode(cublasHandle_t, cublasPointerMode_t) {
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa,
                           cublasOperation_t transb, int m, int n, int k, const float* alpha,
                           const float* a, int lda, const float* b, int ldb, const float* beta,
                           float* c, int ldc) {
  // cuBLAS's own argument checks, which the kernel sources rely on reporting.
  if (handle == nullptr || m < 0 || n < 0 || k < 0 || ldc < (m > 1 ? m : 1))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  // Column-major C = op(A) op(B) is row-major C = op(B) op(A) on the same memory, which is
  // what cblas does with CblasColMajor; through blas_sgemm, a fork() on another thread
  // waits for the product (Note [BLAS across fork] in kernels/cpu/blas.cc).
  remat::kernels::cpu::blas_sgemm(transb == CUBLAS_OP_T, transa == CUBLAS_OP_T, n, m, k, *alpha, b,
                                  ldb, a, lda, *beta, c, ldc);
  return CUBLAS_STATUS_SUCCESS;
}
