// Elementwise CUDA kernels: one thread per element (grid-stride), no reductions, so every
// result is a pure function of its own inputs. The formulas are the CPU kernels' own.
#include <cmath>
#include <cstdint>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/philox.h"

namespace remat::kernels::cuda {
namespace {

using detail::check_launch;
using detail::grid_for;
using detail::kThreads;

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCoeff = 0.044715f;

template <class F>
__global__ void map_kernel(i64 n, F f) {
  REMAT_GRID_STRIDE(i, n) f(i);
}

template <class F>
void launch_map(i64 n, F f, cudaStream_t stream, const char* name) {
  if (n <= 0) return;
  REMAT_LAUNCH(map_kernel, grid_for(n), kThreads, 0, stream)(n, f);
  check_launch(name);
}

struct BiasAdd {
  const float* x;
  const float* bias;
  float* y;
  i64 cols;
  __device__ void operator()(i64 i) const { y[i] = x[i] + bias[i % cols]; }
};

struct Add {
  const float* a;
  const float* b;
  float* y;
  __device__ void operator()(i64 i) const { y[i] = a[i] + b[i]; }
};

struct Mul {
  const float* a;
  const float* b;
  float* y;
  __device__ void operator()(i64 i) const { y[i] = a[i] * b[i]; }
};

struct Scale {
  const float* x;
  float s;
  float* y;
  __device__ void operator()(i64 i) const { y[i] = x[i] * s; }
};

struct GeluForward {
  const float* x;
  float* y;
  __device__ void operator()(i64 i) const {
    const float v = x[i];
    const float cube = kGeluCoeff * v * v * v;
    y[i] = 0.5f * v * (1.0f + tanhf(kGeluScale * (v + cube)));
  }
};

struct GeluBackward {
  const float* x;
  const float* dy;
  float* dx;
  __device__ void operator()(i64 i) const {
    const float v = x[i];
    const float cube = kGeluCoeff * v * v * v;
    const float th = tanhf(kGeluScale * (v + cube));
    const float sech2 = 1.0f - th * th;
    const float local =
        0.5f * (1.0f + th) + 0.5f * v * sech2 * kGeluScale * (1.0f + 3.0f * kGeluCoeff * v * v);
    dx[i] = local * dy[i];
  }
};

struct ReluForward {
  const float* x;
  float* y;
  __device__ void operator()(i64 i) const { y[i] = x[i] > 0.0f ? x[i] : 0.0f; }
};

struct ReluBackward {
  const float* x;
  const float* dy;
  float* dx;
  __device__ void operator()(i64 i) const { dx[i] = x[i] > 0.0f ? dy[i] : 0.0f; }
};

struct SigmoidForward {
  const float* x;
  float* y;
  __device__ void operator()(i64 i) const {
    const float v = x[i];
    if (v >= 0.0f) {
      y[i] = 1.0f / (1.0f + expf(-v));
    } else {
      const float e = expf(v);
      y[i] = e / (1.0f + e);
    }
  }
};

struct SigmoidBackward {
  const float* y;
  const float* dy;
  float* dx;
  __device__ void operator()(i64 i) const { dx[i] = dy[i] * y[i] * (1.0f - y[i]); }
};

struct TanhForward {
  const float* x;
  float* y;
  __device__ void operator()(i64 i) const { y[i] = tanhf(x[i]); }
};

struct TanhBackward {
  const float* y;
  const float* dy;
  float* dx;
  __device__ void operator()(i64 i) const { dx[i] = dy[i] * (1.0f - y[i] * y[i]); }
};

// One Philox block per thread, feeding four consecutive elements: element i uses word i % 4
// of block i / 4, exactly the number Philox::uniform(i) (and the CPU kernel) gives it.
struct DropoutForward {
  const float* x;
  float* y;
  std::uint8_t* mask;
  i64 n;
  float p;
  std::uint64_t seed;
  std::uint64_t offset;
  __device__ void operator()(i64 blk_index) const {
    const Philox rng(seed, offset);
    const PhiloxBlock blk = rng.block(static_cast<std::uint64_t>(blk_index));
    const float keep = 1.0f - p;
    const i64 base = blk_index * 4;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const i64 i = base + j;
      if (i >= n) break;
      const float u = static_cast<float>(blk.w[j] >> 8) * (1.0f / 16777216.0f);
      const bool kept = u >= p;
      mask[i] = kept ? 1 : 0;
      y[i] = kept ? x[i] / keep : 0.0f;
    }
  }
};

struct DropoutBackward {
  const float* dy;
  const std::uint8_t* mask;
  float* dx;
  float p;
  __device__ void operator()(i64 i) const {
    const float keep = 1.0f - p;
    dx[i] = mask[i] ? dy[i] / keep : 0.0f;
  }
};

struct EmbeddingForward {
  const std::int32_t* idx;
  const float* wte;
  const float* wpe;
  float* out;
  i64 t;
  i64 c;
  __device__ void operator()(i64 i) const {
    const i64 row = i / c;
    const i64 j = i - row * c;
    const float e = wte[static_cast<i64>(idx[row]) * c + j];
    out[i] = wpe != nullptr ? e + wpe[(row % t) * c + j] : e;
  }
};

struct AvgpoolBackward {
  const float* dy;
  float* dx;
  i64 hw;
  float inv;
  __device__ void operator()(i64 i) const { dx[i] = dy[i / hw] * inv; }
};

struct RunningUpdate {
  float* running_mean;
  float* running_var;
  const float* mean;
  const float* rstd;
  double correction;
  double momentum;
  double eps;
  __device__ void operator()(i64 ch) const {
    const double r = rstd[ch];
    const double var = (1.0 / (r * r) - eps) * correction;
    running_mean[ch] =
        static_cast<float>((1.0 - momentum) * running_mean[ch] + momentum * mean[ch]);
    running_var[ch] = static_cast<float>((1.0 - momentum) * running_var[ch] + momentum * var);
  }
};

struct AdamW {
  float* param;
  float* m;
  float* v;
  const float* grad;
  float lr;
  float beta1;
  float beta2;
  float eps;
  float weight_decay;
  float bc1;
  float bc2;
  __device__ void operator()(i64 i) const {
    const float g = grad[i];
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float mhat = mi / bc1;
    const float vhat = vi / bc2;
    param[i] -= lr * (mhat / (sqrtf(vhat) + eps) + weight_decay * param[i]);
  }
};

}  // namespace

void bias_add(const float* x, const float* bias, float* y, i64 rows, i64 cols,
              cudaStream_t stream) {
  if (cols <= 0) return;
  launch_map(rows * cols, BiasAdd{x, bias, y, cols}, stream, "bias_add");
}

void fill_zero(void* p, std::size_t bytes, cudaStream_t stream) {
  if (bytes > 0) REMAT_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream));
}

void copy_bytes(void* dst, const void* src, std::size_t bytes, cudaStream_t stream) {
  if (bytes > 0) {
    REMAT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
  }
}

void add(const float* a, const float* b, float* y, i64 n, cudaStream_t stream) {
  launch_map(n, Add{a, b, y}, stream, "add");
}

void mul(const float* a, const float* b, float* y, i64 n, cudaStream_t stream) {
  launch_map(n, Mul{a, b, y}, stream, "mul");
}

void scale(const float* x, float s, float* y, i64 n, cudaStream_t stream) {
  launch_map(n, Scale{x, s, y}, stream, "scale");
}

void gelu_forward(const float* x, float* y, i64 n, cudaStream_t stream) {
  launch_map(n, GeluForward{x, y}, stream, "gelu_forward");
}

void gelu_backward(const float* x, const float* dy, float* dx, i64 n, cudaStream_t stream) {
  launch_map(n, GeluBackward{x, dy, dx}, stream, "gelu_backward");
}

void relu_forward(const float* x, float* y, i64 n, cudaStream_t stream) {
  launch_map(n, ReluForward{x, y}, stream, "relu_forward");
}

void relu_backward(const float* x, const float* dy, float* dx, i64 n, cudaStream_t stream) {
  launch_map(n, ReluBackward{x, dy, dx}, stream, "relu_backward");
}

void sigmoid_forward(const float* x, float* y, i64 n, cudaStream_t stream) {
  launch_map(n, SigmoidForward{x, y}, stream, "sigmoid_forward");
}

void sigmoid_backward(const float* y, const float* dy, float* dx, i64 n, cudaStream_t stream) {
  launch_map(n, SigmoidBackward{y, dy, dx}, stream, "sigmoid_backward");
}

void tanh_forward(const float* x, float* y, i64 n, cudaStream_t stream) {
  launch_map(n, TanhForward{x, y}, stream, "tanh_forward");
}

void tanh_backward(const float* y, const float* dy, float* dx, i64 n, cudaStream_t stream) {
  launch_map(n, TanhBackward{y, dy, dx}, stream, "tanh_backward");
}

void dropout_forward(const float* x, float* y, std::uint8_t* mask, i64 n, float p,
                     std::uint64_t seed, std::uint64_t offset, cudaStream_t stream) {
  if (n <= 0) return;
  launch_map((n + 3) / 4, DropoutForward{x, y, mask, n, p, seed, offset}, stream,
             "dropout_forward");
}

void dropout_backward(const float* dy, const std::uint8_t* mask, float* dx, i64 n, float p,
                      cudaStream_t stream) {
  launch_map(n, DropoutBackward{dy, mask, dx, p}, stream, "dropout_backward");
}

void embedding_forward(const std::int32_t* idx, const float* wte, const float* wpe, float* out,
                       i64 b, i64 t, i64 c, cudaStream_t stream) {
  if (b <= 0 || t <= 0 || c <= 0) return;
  launch_map(b * t * c, EmbeddingForward{idx, wte, wpe, out, t, c}, stream, "embedding_forward");
}

void avgpool_backward(const float* dy, float* dx, i64 n, i64 c, i64 hw, cudaStream_t stream) {
  if (hw <= 0) return;
  const float inv = 1.0f / static_cast<float>(hw);
  launch_map(n * c * hw, AvgpoolBackward{dy, dx, hw, inv}, stream, "avgpool_backward");
}

void batchnorm_running_update(float* running_mean, float* running_var, const float* mean,
                              const float* rstd, i64 c, i64 count, float momentum, float eps,
                              cudaStream_t stream) {
  // With a single sample the unbiased variance is undefined; the biased one is used instead
  // (as the CPU kernel does).
  const double correction =
      count > 1 ? static_cast<double>(count) / static_cast<double>(count - 1) : 1.0;
  launch_map(c, RunningUpdate{running_mean, running_var, mean, rstd, correction, momentum, eps},
             stream, "batchnorm_running_update");
}

void adamw_update(float* param, float* m, float* v, const float* grad, i64 n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int t, cudaStream_t stream) {
  const float bc1 = 1.0f - static_cast<float>(std::pow(static_cast<double>(beta1), t));
  const float bc2 = 1.0f - static_cast<float>(std::pow(static_cast<double>(beta2), t));
  launch_map(n, AdamW{param, m, v, grad, lr, beta1, beta2, eps, weight_decay, bc1, bc2}, stream,
             "adamw_update");
}

}  // namespace remat::kernels::cuda
