// CUDA kernels that reduce: bias and norm gradients, sum, layer/batch norm, softmax, cross
// entropy, pooling and the embedding backward. No atomics: every output element is owned by
// one thread or one block, which sums in an order fixed by the launch shape alone (strided
// partial sums, then a fixed tree), so a call with the same inputs gives the same bits.
#include <cmath>
#include <cstdint>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace remat::kernels::cuda {
namespace {

using detail::block_max;
using detail::block_sum;
using detail::check_launch;
using detail::grid_blocks;
using detail::grid_for;
using detail::kThreads;
using detail::kWarp;

// Threads for a block that owns one row of `cols` values: a multiple of 32, at most 512.
constexpr int kMaxRowThreads = 512;
int row_threads(i64 cols) {
  const i64 rounded = (cols + kWarp - 1) / kWarp * kWarp;
  return static_cast<int>(std::clamp<i64>(rounded, kWarp, kMaxRowThreads));
}

// ---- Column sums: out[c] = sum_r f(r, c), two at a time. ----
// A 32 x 32 block owns 32 columns: thread (x, y) sums rows y, y + 32, ... of column x, then
// the 32 partial sums of each column are added by a fixed tree.
constexpr int kColTile = 32;

template <class F>
__global__ void __launch_bounds__(kColTile* kColTile)
    column_sum_kernel(i64 rows, i64 cols, F f, float* out0, float* out1) {
  __shared__ float s0[kColTile][kColTile + 1];
  __shared__ float s1[kColTile][kColTile + 1];
  const int tx = threadIdx.x;
  const int ty = threadIdx.y;
  for (i64 tile = blockIdx.x; tile * kColTile < cols; tile += gridDim.x) {
    const i64 col = tile * kColTile + tx;
    float a0 = 0.0f;
    float a1 = 0.0f;
    if (col < cols) {
      for (i64 r = ty; r < rows; r += kColTile) {
        const float2 v = f(r, col);
        a0 += v.x;
        a1 += v.y;
      }
    }
    s0[ty][tx] = a0;
    s1[ty][tx] = a1;
    __syncthreads();
    for (int stride = kColTile / 2; stride > 0; stride /= 2) {
      if (ty < stride) {
        s0[ty][tx] += s0[ty + stride][tx];
        s1[ty][tx] += s1[ty + stride][tx];
      }
      __syncthreads();
    }
    if (ty == 0 && col < cols) {
      out0[col] = s0[0][tx];
      if (out1 != nullptr) out1[col] = s1[0][tx];
    }
    __syncthreads();
  }
}

template <class F>
void launch_column_sum(i64 rows, i64 cols, F f, float* out0, float* out1, cudaStream_t stream,
                       const char* name) {
  if (cols <= 0) return;
  const dim3 block(kColTile, kColTile);
  REMAT_LAUNCH(column_sum_kernel, grid_blocks((cols + kColTile - 1) / kColTile), block, 0, stream)
  (rows, cols, f, out0, out1);
  check_launch(name);
}

struct DyTerm {
  const float* dy;
  i64 cols;
  __device__ float2 operator()(i64 r, i64 c) const { return make_float2(dy[r * cols + c], 0.0f); }
};

// (dy * norm, dy) for LayerNorm's dw and db.
struct LayerNormParamTerm {
  const float* dy;
  const float* x;
  const float* mean;
  const float* rstd;
  i64 cols;
  __device__ float2 operator()(i64 r, i64 c) const {
    const i64 i = r * cols + c;
    const float norm = (x[i] - mean[r]) * rstd[r];
    return make_float2(dy[i] * norm, dy[i]);
  }
};

// ---- sum ----
constexpr int kSumThreads = 1024;

__global__ void sum_kernel(const float* __restrict__ x, float* __restrict__ y, i64 n) {
  __shared__ float scratch[kWarp];
  float acc = 0.0f;
  for (i64 i = threadIdx.x; i < n; i += blockDim.x) acc += x[i];
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) y[0] = acc;
}

// ---- LayerNorm, one block per row ----
__global__ void layernorm_forward_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                         const float* __restrict__ b, float* __restrict__ y,
                                         float* __restrict__ mean, float* __restrict__ rstd,
                                         i64 rows, i64 c, float eps) {
  __shared__ float scratch[kWarp];
  for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * c;
    float* yr = y + r * c;
    float acc = 0.0f;
    for (i64 j = threadIdx.x; j < c; j += blockDim.x) acc += xr[j];
    const float cf = static_cast<float>(c);
    const float total = block_sum(acc, scratch);
    const float m = c > 0 ? total / cf : 0.0f;
    acc = 0.0f;
    for (i64 j = threadIdx.x; j < c; j += blockDim.x) {
      const float d = xr[j] - m;
      acc += d * d;
    }
    const float sq = block_sum(acc, scratch);
    const float var = c > 0 ? sq / cf : 0.0f;
    const float s = 1.0f / sqrtf(var + eps);
    for (i64 j = threadIdx.x; j < c; j += blockDim.x) yr[j] = (xr[j] - m) * s * w[j] + b[j];
    if (threadIdx.x == 0) {
      mean[r] = m;
      rstd[r] = s;
    }
  }
}

__global__ void layernorm_backward_dx_kernel(const float* __restrict__ dy,
                                             const float* __restrict__ x,
                                             const float* __restrict__ w,
                                             const float* __restrict__ mean,
                                             const float* __restrict__ rstd, float* __restrict__ dx,
                                             i64 rows, i64 c) {
  __shared__ float scratch[kWarp];
  for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* dyr = dy + r * c;
    const float* xr = x + r * c;
    float* dxr = dx + r * c;
    const float m = mean[r];
    const float s = rstd[r];
    float acc_a = 0.0f;
    float acc_b = 0.0f;
    for (i64 j = threadIdx.x; j < c; j += blockDim.x) {
      const float norm = (xr[j] - m) * s;
      const float dnorm = w[j] * dyr[j];
      acc_a += dnorm;
      acc_b += dnorm * norm;
    }
    const float a = block_sum(acc_a, scratch) / static_cast<float>(c);
    const float bm = block_sum(acc_b, scratch) / static_cast<float>(c);
    for (i64 j = threadIdx.x; j < c; j += blockDim.x) {
      const float norm = (xr[j] - m) * s;
      dxr[j] = (w[j] * dyr[j] - a - norm * bm) * s;
    }
  }
}

// ---- Softmax and cross entropy, one block per row ----
__global__ void softmax_forward_kernel(const float* __restrict__ x, float* __restrict__ y, i64 rows,
                                       i64 cols) {
  __shared__ float scratch[kWarp];
  for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    float mx = -INFINITY;
    for (i64 j = threadIdx.x; j < cols; j += blockDim.x) mx = fmaxf(mx, xr[j]);
    mx = block_max(mx, scratch);
    float acc = 0.0f;
    for (i64 j = threadIdx.x; j < cols; j += blockDim.x) acc += expf(xr[j] - mx);
    const float inv = 1.0f / block_sum(acc, scratch);
    for (i64 j = threadIdx.x; j < cols; j += blockDim.x) yr[j] = expf(xr[j] - mx) * inv;
  }
}

__global__ void softmax_backward_kernel(const float* __restrict__ y, const float* __restrict__ dy,
                                        float* __restrict__ dx, i64 rows, i64 cols) {
  __shared__ float scratch[kWarp];
  for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* yr = y + r * cols;
    const float* dyr = dy + r * cols;
    float* dxr = dx + r * cols;
    float acc = 0.0f;
    for (i64 j = threadIdx.x; j < cols; j += blockDim.x) acc += yr[j] * dyr[j];
    const float d = block_sum(acc, scratch);
    for (i64 j = threadIdx.x; j < cols; j += blockDim.x) dxr[j] = yr[j] * (dyr[j] - d);
  }
}

// Row r's max and sum of exp(l - max), for both cross-entropy passes.
__device__ float2 row_max_expsum(const float* l, i64 v, float* scratch) {
  float mx = -INFINITY;
  for (i64 j = threadIdx.x; j < v; j += blockDim.x) mx = fmaxf(mx, l[j]);
  mx = block_max(mx, scratch);
  float acc = 0.0f;
  for (i64 j = threadIdx.x; j < v; j += blockDim.x) acc += expf(l[j] - mx);
  return make_float2(mx, block_sum(acc, scratch));
}

__global__ void cross_entropy_forward_kernel(const float* __restrict__ logits,
                                             const std::int32_t* __restrict__ targets,
                                             float* __restrict__ losses, i64 n, i64 v) {
  __shared__ float scratch[kWarp];
  for (i64 r = blockIdx.x; r < n; r += gridDim.x) {
    const float* l = logits + r * v;
    const float2 ms = row_max_expsum(l, v, scratch);
    if (threadIdx.x == 0) losses[r] = logf(ms.y) - (l[targets[r]] - ms.x);
  }
}

__global__ void cross_entropy_backward_kernel(const float* __restrict__ logits,
                                              const std::int32_t* __restrict__ targets,
                                              const float* __restrict__ dloss, float scale,
                                              float* __restrict__ dlogits, i64 n, i64 v) {
  __shared__ float scratch[kWarp];
  const float g = dloss[0] * scale;
  for (i64 r = blockIdx.x; r < n; r += gridDim.x) {
    const float* l = logits + r * v;
    float* d = dlogits + r * v;
    const float2 ms = row_max_expsum(l, v, scratch);
    const float inv = 1.0f / ms.y;
    const i64 tgt = targets[r];
    for (i64 j = threadIdx.x; j < v; j += blockDim.x) {
      const float p = expf(l[j] - ms.x) * inv;
      d[j] = (p - (j == tgt ? 1.0f : 0.0f)) * g;
    }
  }
}

// ---- BatchNorm, one block per channel over its N*HW values ----
__global__ void batchnorm_forward_kernel(const float* __restrict__ x,
                                         const float* __restrict__ gamma,
                                         const float* __restrict__ beta, float* __restrict__ y,
                                         float* __restrict__ mean, float* __restrict__ rstd, i64 n,
                                         i64 c, i64 hw, float eps) {
  __shared__ float scratch[kWarp];
  const i64 count = n * hw;
  for (i64 ch = blockIdx.x; ch < c; ch += gridDim.x) {
    float acc = 0.0f;
    for (i64 f = threadIdx.x; f < count; f += blockDim.x) {
      const i64 ni = f / hw;
      acc += x[(ni * c + ch) * hw + (f - ni * hw)];
    }
    const float total = block_sum(acc, scratch);
    const float m = count > 0 ? total / static_cast<float>(count) : 0.0f;
    acc = 0.0f;
    for (i64 f = threadIdx.x; f < count; f += blockDim.x) {
      const i64 ni = f / hw;
      const float d = x[(ni * c + ch) * hw + (f - ni * hw)] - m;
      acc += d * d;
    }
    const float sq = block_sum(acc, scratch);
    const float var = count > 0 ? sq / static_cast<float>(count) : 0.0f;
    const float s = 1.0f / sqrtf(var + eps);
    const float g = gamma[ch] * s;
    const float bt = beta[ch];
    for (i64 f = threadIdx.x; f < count; f += blockDim.x) {
      const i64 ni = f / hw;
      const i64 i = (ni * c + ch) * hw + (f - ni * hw);
      y[i] = (x[i] - m) * g + bt;
    }
    if (threadIdx.x == 0) {
      mean[ch] = m;
      rstd[ch] = s;
    }
  }
}

__global__ void batchnorm_backward_kernel(const float* __restrict__ dy, const float* __restrict__ x,
                                          const float* __restrict__ gamma,
                                          const float* __restrict__ mean,
                                          const float* __restrict__ rstd, float* __restrict__ dx,
                                          float* __restrict__ dgamma, float* __restrict__ dbeta,
                                          i64 n, i64 c, i64 hw) {
  __shared__ float scratch[kWarp];
  const i64 count = n * hw;
  for (i64 ch = blockIdx.x; ch < c; ch += gridDim.x) {
    const float m = mean[ch];
    const float s = rstd[ch];
    float acc_dy = 0.0f;
    float acc_dyx = 0.0f;
    for (i64 f = threadIdx.x; f < count; f += blockDim.x) {
      const i64 ni = f / hw;
      const i64 i = (ni * c + ch) * hw + (f - ni * hw);
      const float xhat = (x[i] - m) * s;
      acc_dy += dy[i];
      acc_dyx += dy[i] * xhat;
    }
    const float sdy = block_sum(acc_dy, scratch);
    const float sdyx = block_sum(acc_dyx, scratch);
    if (threadIdx.x == 0) {
      dbeta[ch] = sdy;
      dgamma[ch] = sdyx;
    }
    if (count == 0) continue;
    const float mdy = sdy / static_cast<float>(count);
    const float mdyx = sdyx / static_cast<float>(count);
    const float g = gamma[ch] * s;
    for (i64 f = threadIdx.x; f < count; f += blockDim.x) {
      const i64 ni = f / hw;
      const i64 i = (ni * c + ch) * hw + (f - ni * hw);
      const float xhat = (x[i] - m) * s;
      dx[i] = g * (dy[i] - mdy - xhat * mdyx);
    }
  }
}

// ---- Pooling ----
// Global average pooling: one warp per plane.
__global__ void avgpool_forward_kernel(const float* __restrict__ x, float* __restrict__ y,
                                       i64 planes, i64 hw) {
  const int lane = threadIdx.x % kWarp;
  const i64 warps_per_grid = static_cast<i64>(gridDim.x) * (blockDim.x / kWarp);
  for (i64 plane = static_cast<i64>(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
       plane < planes; plane += warps_per_grid) {
    const float* xp = x + plane * hw;
    float acc = 0.0f;
    for (i64 i = lane; i < hw; i += kWarp) acc += xp[i];
    acc = detail::warp_sum(acc);
    if (lane == 0) y[plane] = hw > 0 ? acc / static_cast<float>(hw) : 0.0f;
  }
}

// One thread per output; the first maximum (row-major window order) wins ties.
__global__ void maxpool2d_forward_kernel(const float* __restrict__ x, float* __restrict__ y,
                                         std::int32_t* __restrict__ argmax, i64 h, i64 wd, i64 k,
                                         i64 s, i64 oh, i64 ow, i64 total) {
  const i64 p = oh * ow;
  REMAT_GRID_STRIDE(idx, total) {
    const i64 plane = idx / p;
    const i64 j = idx - plane * p;
    const i64 oy = j / ow;
    const i64 ox = j - oy * ow;
    const float* xp = x + plane * h * wd;
    const i64 y0 = oy * s;
    const i64 x0 = ox * s;
    i64 best_idx = y0 * wd + x0;
    float best = xp[best_idx];
    for (i64 ky = 0; ky < k; ++ky) {
      const float* row = xp + (y0 + ky) * wd + x0;
      for (i64 kx = 0; kx < k; ++kx) {
        if (row[kx] > best) {
          best = row[kx];
          best_idx = (y0 + ky) * wd + x0 + kx;
        }
      }
    }
    y[idx] = best;
    argmax[idx] = static_cast<std::int32_t>(best_idx);
  }
}

// A gather: each input element sums dy over the windows that chose it, in increasing output
// order (the order the CPU kernel's scatter adds them in).
__global__ void maxpool2d_backward_kernel(const float* __restrict__ dy,
                                          const std::int32_t* __restrict__ argmax,
                                          float* __restrict__ dx, i64 h, i64 wd, i64 k, i64 s,
                                          i64 oh, i64 ow, i64 total) {
  const i64 p = oh * ow;
  REMAT_GRID_STRIDE(idx, total) {
    const i64 plane = idx / (h * wd);
    const i64 flat = idx - plane * h * wd;
    const i64 iy = flat / wd;
    const i64 ix = flat - iy * wd;
    // Windows oy with oy*s <= iy < oy*s + k, likewise ox.
    const i64 oy_lo = iy - k + 1 > 0 ? (iy - k + 1 + s - 1) / s : 0;
    const i64 oy_hi = std::min<i64>(iy / s, oh - 1);
    const i64 ox_lo = ix - k + 1 > 0 ? (ix - k + 1 + s - 1) / s : 0;
    const i64 ox_hi = std::min<i64>(ix / s, ow - 1);
    const float* dyp = dy + plane * p;
    const std::int32_t* ap = argmax + plane * p;
    float acc = 0.0f;
    for (i64 oy = oy_lo; oy <= oy_hi; ++oy) {
      for (i64 ox = ox_lo; ox <= ox_hi; ++ox) {
        const i64 j = oy * ow + ox;
        if (ap[j] == flat) acc += dyp[j];
      }
    }
    dx[idx] = acc;
  }
}

}  // namespace

void bias_grad(const float* dy, float* dbias, i64 rows, i64 cols, cudaStream_t stream) {
  launch_column_sum(rows, cols, DyTerm{dy, cols}, dbias, nullptr, stream, "bias_grad");
}

void sum(const float* x, float* y, i64 n, cudaStream_t stream) {
  REMAT_LAUNCH(sum_kernel, 1, kSumThreads, 0, stream)(x, y, n);
  check_launch("sum_kernel");
}

void layernorm_forward(const float* x, const float* w, const float* b, float* y, float* mean,
                       float* rstd, i64 rows, i64 c, float eps, cudaStream_t stream) {
  if (rows <= 0) return;
  REMAT_LAUNCH(layernorm_forward_kernel, grid_blocks(rows), row_threads(c), 0, stream)
  (x, w, b, y, mean, rstd, rows, c, eps);
  check_launch("layernorm_forward_kernel");
}

void layernorm_backward(const float* dy, const float* x, const float* w, const float* mean,
                        const float* rstd, float* dx, float* dw, float* db, i64 rows, i64 c,
                        cudaStream_t stream) {
  if (c <= 0) return;
  if (rows > 0) {
    REMAT_LAUNCH(layernorm_backward_dx_kernel, grid_blocks(rows), row_threads(c), 0, stream)
    (dy, x, w, mean, rstd, dx, rows, c);
    check_launch("layernorm_backward_dx_kernel");
  }
  launch_column_sum(rows, c, LayerNormParamTerm{dy, x, mean, rstd, c}, dw, db, stream,
                    "layernorm_backward (dw, db)");
}

void softmax_forward(const float* x, float* y, i64 rows, i64 cols, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  REMAT_LAUNCH(softmax_forward_kernel, grid_blocks(rows), row_threads(cols), 0, stream)
  (x, y, rows, cols);
  check_launch("softmax_forward_kernel");
}

void softmax_backward(const float* y, const float* dy, float* dx, i64 rows, i64 cols,
                      cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  REMAT_LAUNCH(softmax_backward_kernel, grid_blocks(rows), row_threads(cols), 0, stream)
  (y, dy, dx, rows, cols);
  check_launch("softmax_backward_kernel");
}

void cross_entropy_forward(const float* logits, const std::int32_t* targets, float* losses, i64 n,
                           i64 v, cudaStream_t stream) {
  if (n <= 0 || v <= 0) return;
  REMAT_LAUNCH(cross_entropy_forward_kernel, grid_blocks(n), row_threads(v), 0, stream)
  (logits, targets, losses, n, v);
  check_launch("cross_entropy_forward_kernel");
}

void cross_entropy_backward(const float* logits, const std::int32_t* targets, const float* dloss,
                            float scale, float* dlogits, i64 n, i64 v, cudaStream_t stream) {
  if (n <= 0 || v <= 0) return;
  REMAT_LAUNCH(cross_entropy_backward_kernel, grid_blocks(n), row_threads(v), 0, stream)
  (logits, targets, dloss, scale, dlogits, n, v);
  check_launch("cross_entropy_backward_kernel");
}

void batchnorm_forward(const float* x, const float* gamma, const float* beta, float* y, float* mean,
                       float* rstd, i64 n, i64 c, i64 hw, float eps, cudaStream_t stream) {
  if (c <= 0) return;
  REMAT_LAUNCH(batchnorm_forward_kernel, grid_blocks(c), kThreads, 0, stream)
  (x, gamma, beta, y, mean, rstd, n, c, hw, eps);
  check_launch("batchnorm_forward_kernel");
}

void batchnorm_backward(const float* dy, const float* x, const float* gamma, const float* mean,
                        const float* rstd, float* dx, float* dgamma, float* dbeta, i64 n, i64 c,
                        i64 hw, cudaStream_t stream) {
  if (c <= 0) return;
  REMAT_LAUNCH(batchnorm_backward_kernel, grid_blocks(c), kThreads, 0, stream)
  (dy, x, gamma, mean, rstd, dx, dgamma, dbeta, n, c, hw);
  check_launch("batchnorm_backward_kernel");
}

void maxpool2d_forward(const float* x, float* y, std::int32_t* argmax, i64 n, i64 c, i64 h, i64 wd,
                       i64 k, i64 s, cudaStream_t stream) {
  const i64 oh = detail::out_dim(h, 0, k, s);
  const i64 ow = detail::out_dim(wd, 0, k, s);
  const i64 total = n * c * oh * ow;
  if (total <= 0) return;
  REMAT_LAUNCH(maxpool2d_forward_kernel, grid_for(total), kThreads, 0, stream)
  (x, y, argmax, h, wd, k, s, oh, ow, total);
  check_launch("maxpool2d_forward_kernel");
}

void maxpool2d_backward(const float* dy, const std::int32_t* argmax, float* dx, i64 n, i64 c, i64 h,
                        i64 wd, i64 k, i64 s, cudaStream_t stream) {
  const i64 oh = detail::out_dim(h, 0, k, s);
  const i64 ow = detail::out_dim(wd, 0, k, s);
  const i64 total = n * c * h * wd;
  if (total <= 0) return;
  REMAT_LAUNCH(maxpool2d_backward_kernel, grid_for(total), kThreads, 0, stream)
  (dy, argmax, dx, h, wd, k, s, oh, ow, total);
  check_launch("maxpool2d_backward_kernel");
}

void avgpool_forward(const float* x, float* y, i64 n, i64 c, i64 hw, cudaStream_t stream) {
  const i64 planes = n * c;
  if (planes <= 0) return;
  constexpr int kPlanesPerBlock = kThreads / kWarp;
  REMAT_LAUNCH(avgpool_forward_kernel,
               grid_blocks((planes + kPlanesPerBlock - 1) / kPlanesPerBlock), kThreads, 0, stream)
  (x, y, planes, hw);
  check_launch("avgpool_forward_kernel");
}

}  // namespace remat::kernels::cuda
