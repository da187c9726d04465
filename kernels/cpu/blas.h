// OpenBLAS's single-precision matrix product for the CPU kernels, safe beside a fork() on
// another thread (Note [BLAS across fork] in blas.cc).
//
//   remat::kernels::cpu::blas_sgemm(false, true, m, n, k, 1.0f, a, k, b, k, 0.0f, c, n);
#ifndef REMAT_KERNELS_CPU_BLAS_H_
#define REMAT_KERNELS_CPU_BLAS_H_

namespace remat::kernels::cpu {

// C = alpha op(A) op(B) + beta C on row-major matrices (cblas_sgemm's arguments, op(A) m x k,
// op(B) k x n, C m x n).
void blas_sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                int lda, const float* b, int ldb, float beta, float* c, int ldc);

}  // namespace remat::kernels::cpu

#endif  // REMAT_KERNELS_CPU_BLAS_H_
