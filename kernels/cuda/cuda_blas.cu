// cuBLAS GEMM and the convolutions built on it (im2col / col2im around one GEMM per image),
// with the per-thread cuBLAS state those use.
#include <climits>
#include <cstddef>
#include <unordered_map>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace remat::kernels::cuda {
namespace detail {
namespace {

// The cuBLAS state of one host thread: per device, a handle (FP32 math, no atomics) and, per
// stream it has run on without a workspace of the caller's, a workspace of its own. cuBLAS is
// bitwise reproducible run to run only when concurrent streams do not share a workspace, hence
// one per stream. Workspaces live until the thread exits; they are allocated only for streams
// whose callers lend none, so a runtime that lends its own never gets memory outside its
// budget here.
class BlasThreadState {
 public:
  BlasThreadState() = default;
  BlasThreadState(const BlasThreadState&) = delete;
  BlasThreadState& operator=(const BlasThreadState&) = delete;

  ~BlasThreadState() {
    // Best effort: at process exit the driver may already be going away, so statuses are
    // ignored here.
    for (auto& entry : devices_) {
      Device& d = entry.second;
      for (auto& ws : d.workspaces) cudaFree(ws.second);
      if (d.handle != nullptr) cublasDestroy(d.handle);
    }
  }

  cublasHandle_t bind(cudaStream_t stream, BlasWorkspace lent) {
    int device = 0;
    REMAT_CUDA_CHECK(cudaGetDevice(&device));
    Device& d = devices_[device];
    if (d.handle == nullptr) {
      int major = 0;
      REMAT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
      cublasHandle_t handle = nullptr;
      REMAT_CUBLAS_CHECK(cublasCreate(&handle));
      d.handle = handle;
      // Plain FP32 (no TF32 tensor-op rounding) and no atomics: the same bits on every call.
      REMAT_CUBLAS_CHECK(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH));
      REMAT_CUBLAS_CHECK(cublasSetAtomicsMode(handle, CUBLAS_ATOMICS_NOT_ALLOWED));
      REMAT_CUBLAS_CHECK(cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_HOST));
      // The sizes cuBLAS recommends: 32 MiB from Hopper on, 4 MiB before.
      d.workspace_bytes = (major >= 9 ? 32u : 4u) << 20;
    }
    // cublasSetStream also resets the workspace to the library's shared pool; set ours after,
    // on every call, since the handle is shared by every stream and caller of this thread.
    REMAT_CUBLAS_CHECK(cublasSetStream(d.handle, stream));
    if (lent.ptr != nullptr) {
      REMAT_CUBLAS_CHECK(cublasSetWorkspace(d.handle, lent.ptr, lent.bytes));
      return d.handle;
    }
    auto it = d.workspaces.find(stream);
    if (it == d.workspaces.end()) {
      void* ws = nullptr;
      REMAT_CUDA_CHECK(cudaMalloc(&ws, d.workspace_bytes));
      it = d.workspaces.emplace(stream, ws).first;
    }
    REMAT_CUBLAS_CHECK(cublasSetWorkspace(d.handle, it->second, d.workspace_bytes));
    return d.handle;
  }

 private:
  struct Device {
    cublasHandle_t handle = nullptr;
    std::size_t workspace_bytes = 0;
    std::unordered_map<cudaStream_t, void*> workspaces;
  };
  std::unordered_map<int, Device> devices_;
};

thread_local BlasThreadState blas_state;

int checked_int(i64 v, const char* what) {
  if (v < 0 || v > INT_MAX) {
    throw std::runtime_error(std::string("gemm: ") + what + " = " + std::to_string(v) +
                             " does not fit cuBLAS's int");
  }
  return static_cast<int>(v);
}

__global__ void scale_inplace_kernel(float* c, float beta, i64 n) {
  REMAT_GRID_STRIDE(i, n) c[i] *= beta;
}

// cols[(ci*KH + ki)*KW + kj, oy*OW + ox] = x[ci, oy*s - pad + ki, ox*s - pad + kj] (0 outside).
__global__ void im2col_kernel(const float* __restrict__ x, float* __restrict__ cols, i64 h, i64 wd,
                              i64 kh, i64 kw, i64 stride, i64 pad, i64 oh, i64 ow, i64 total) {
  const i64 p = oh * ow;
  REMAT_GRID_STRIDE(idx, total) {
    const i64 row = idx / p;
    const i64 col = idx - row * p;
    const i64 ci = row / (kh * kw);
    const i64 rem = row - ci * kh * kw;
    const i64 ki = rem / kw;
    const i64 kj = rem - ki * kw;
    const i64 oy = col / ow;
    const i64 ox = col - oy * ow;
    const i64 ih = oy * stride - pad + ki;
    const i64 iw = ox * stride - pad + kj;
    cols[idx] = (ih >= 0 && ih < h && iw >= 0 && iw < wd) ? x[(ci * h + ih) * wd + iw] : 0.0f;
  }
}

// The adjoint of im2col as a gather: each input element sums the column entries it fed, in
// increasing (ki, kj) order (the order the CPU kernel's scatter adds them in).
__global__ void col2im_kernel(const float* __restrict__ cols, float* __restrict__ dx, i64 h, i64 wd,
                              i64 kh, i64 kw, i64 stride, i64 pad, i64 oh, i64 ow, i64 total) {
  const i64 p = oh * ow;
  REMAT_GRID_STRIDE(idx, total) {
    const i64 ci = idx / (h * wd);
    const i64 rem = idx - ci * h * wd;
    const i64 ih = rem / wd;
    const i64 iw = rem - ih * wd;
    float acc = 0.0f;
    for (i64 ki = 0; ki < kh; ++ki) {
      const i64 ynum = ih + pad - ki;
      if (ynum < 0 || ynum % stride != 0) continue;
      const i64 oy = ynum / stride;
      if (oy >= oh) continue;
      for (i64 kj = 0; kj < kw; ++kj) {
        const i64 xnum = iw + pad - kj;
        if (xnum < 0 || xnum % stride != 0) continue;
        const i64 ox = xnum / stride;
        if (ox >= ow) continue;
        acc += cols[((ci * kh + ki) * kw + kj) * p + oy * ow + ox];
      }
    }
    dx[idx] = acc;
  }
}

// y[(n*OC + o)*P + j] += bias[o]
__global__ void conv_bias_kernel(float* __restrict__ y, const float* __restrict__ bias, i64 oc,
                                 i64 p, i64 total) {
  REMAT_GRID_STRIDE(idx, total) y[idx] += bias[(idx / p) % oc];
}

// dbias[o] = sum over images and positions of dy[n, o, :], one block per channel.
__global__ void conv_dbias_kernel(const float* __restrict__ dy, float* __restrict__ dbias, i64 n,
                                  i64 oc, i64 p) {
  __shared__ float scratch[kWarp];
  const i64 count = n * p;
  for (i64 o = blockIdx.x; o < oc; o += gridDim.x) {
    float acc = 0.0f;
    for (i64 f = threadIdx.x; f < count; f += blockDim.x) {
      const i64 ni = f / p;
      acc += dy[(ni * oc + o) * p + (f - ni * p)];
    }
    acc = block_sum(acc, scratch);
    if (threadIdx.x == 0) dbias[o] = acc;
  }
}

}  // namespace

cublasHandle_t blas_handle(cudaStream_t stream, BlasWorkspace workspace) {
  return blas_state.bind(stream, workspace);
}

}  // namespace detail

using detail::check_launch;
using detail::grid_for;
using detail::kThreads;

void gemm(bool trans_a, bool trans_b, i64 m, i64 n, i64 k, float alpha, const float* a,
          const float* b, float beta, float* c, cudaStream_t stream, BlasWorkspace workspace) {
  if (m <= 0 || n <= 0) return;
  const int mi = detail::checked_int(m, "m");
  const int ni = detail::checked_int(n, "n");
  if (k <= 0) {  // op(A) op(B) is all zeros: C = beta * C (beta == 0 overwrites).
    if (beta == 0.0f) {
      REMAT_CUDA_CHECK(
          cudaMemsetAsync(c, 0, static_cast<std::size_t>(m * n) * sizeof(float), stream));
    } else if (beta != 1.0f) {
      REMAT_LAUNCH(detail::scale_inplace_kernel, grid_for(m * n), kThreads, 0, stream)
      (c, beta, m * n);
      check_launch("scale_inplace_kernel");
    }
    return;
  }
  const int ki = detail::checked_int(k, "k");
  // Row-major C (M x N) is column-major C^T (N x M) = op(B)^T op(A)^T, where a row-major
  // matrix read column-major is its transpose: so B comes first, and each keeps its op.
  cublasHandle_t handle = detail::blas_handle(stream, workspace);
  REMAT_CUBLAS_CHECK(cublasSgemm(handle, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                 trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, ni, mi, ki, &alpha, b,
                                 trans_b ? ki : ni, a, trans_a ? mi : ki, &beta, c, ni));
}

void conv2d_forward(const float* x, const float* w, const float* bias, float* y, float* cols, i64 n,
                    i64 ic, i64 h, i64 wd, i64 oc, i64 kh, i64 kw, i64 stride, i64 pad,
                    cudaStream_t stream, BlasWorkspace workspace) {
  const i64 oh = detail::out_dim(h, pad, kh, stride);
  const i64 ow = detail::out_dim(wd, pad, kw, stride);
  const i64 p = oh * ow;
  const i64 kdim = ic * kh * kw;
  if (n <= 0 || oc <= 0 || p <= 0) return;
  // One image at a time: `cols` is reused, and the stream orders each image's im2col after
  // the previous image's GEMM.
  for (i64 ni = 0; ni < n; ++ni) {
    if (kdim * p > 0) {
      REMAT_LAUNCH(detail::im2col_kernel, grid_for(kdim * p), kThreads, 0, stream)
      (x + ni * ic * h * wd, cols, h, wd, kh, kw, stride, pad, oh, ow, kdim * p);
      check_launch("im2col_kernel");
    }
    gemm(false, false, oc, p, kdim, 1.0f, w, cols, 0.0f, y + ni * oc * p, stream, workspace);
  }
  if (bias != nullptr) {
    REMAT_LAUNCH(detail::conv_bias_kernel, grid_for(n * oc * p), kThreads, 0, stream)
    (y, bias, oc, p, n * oc * p);
    check_launch("conv_bias_kernel");
  }
}

void conv2d_backward(const float* dy, const float* x, const float* w, float* dx, float* dw,
                     float* dbias, float* cols, i64 n, i64 ic, i64 h, i64 wd, i64 oc, i64 kh,
                     i64 kw, i64 stride, i64 pad, cudaStream_t stream, BlasWorkspace workspace) {
  const i64 oh = detail::out_dim(h, pad, kh, stride);
  const i64 ow = detail::out_dim(wd, pad, kw, stride);
  const i64 p = oh * ow;
  const i64 kdim = ic * kh * kw;
  if (dbias != nullptr && oc > 0) {
    REMAT_LAUNCH(detail::conv_dbias_kernel, detail::grid_blocks(oc), kThreads, 0, stream)
    (dy, dbias, n, oc, p);
    check_launch("conv_dbias_kernel");
  }
  if (n <= 0) {
    if (oc * kdim > 0) {
      REMAT_CUDA_CHECK(
          cudaMemsetAsync(dw, 0, static_cast<std::size_t>(oc * kdim) * sizeof(float), stream));
    }
    return;
  }
  const i64 image = ic * h * wd;
  for (i64 ni = 0; ni < n; ++ni) {
    const float* dyi = dy + ni * oc * p;
    if (kdim * p > 0) {
      REMAT_LAUNCH(detail::im2col_kernel, grid_for(kdim * p), kThreads, 0, stream)
      (x + ni * image, cols, h, wd, kh, kw, stride, pad, oh, ow, kdim * p);
      check_launch("im2col_kernel");
    }
    // dw (+)= dy_i (OC x P) @ cols_i^T (P x K): overwritten by the first image, then
    // accumulated image by image in order.
    gemm(false, true, oc, kdim, p, 1.0f, dyi, cols, ni == 0 ? 0.0f : 1.0f, dw, stream, workspace);
    if (dx != nullptr && image > 0) {
      // dcols = w^T (K x OC) @ dy_i (OC x P), gathered back into dx_i by col2im.
      gemm(true, false, kdim, p, oc, 1.0f, w, dyi, 0.0f, cols, stream, workspace);
      REMAT_LAUNCH(detail::col2im_kernel, grid_for(image), kThreads, 0, stream)
      (cols, dx + ni * image, h, wd, kh, kw, stride, pad, oh, ow, image);
      check_launch("col2im_kernel");
    }
  }
}

}  // namespace remat::kernels::cuda
