// Causal multi-head self-attention (llm.c layout, see cuda_kernels.h), without atomics.
//
// Forward: one block per (b, h, t) row: scores in shared memory, a fixed-tree softmax, then
// out = att @ v with one thread per channel summing t2 in increasing order.
//
// Backward, three passes so that every output element is summed by a single thread:
//  1. per (b, h, t): datt[t2] = dout_t . v_t2, D_t = sum_t2 att * datt (a fixed tree),
//     dpre[t2] = att * (datt - D_t) * scale, dq_t = sum_t2 dpre[t2] k_t2. D_t is parked in
//     the first value slot of dqkv (b, t, h), which pass 3 overwrites.
//  2. per (b, h, t2): dk_t2 = sum_{t >= t2} dpre[t, t2] q_t, recomputing datt[t, t2] and
//     reading D_t back.
//  3. per (b, h, t2): dv_t2 = sum_{t >= t2} att[t, t2] dout_t.
// The passes run in stream order; the sums go in increasing t (or t2), as on the CPU.
#include <cmath>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace remat::kernels::cuda {
namespace {

using detail::block_max;
using detail::block_sum;
using detail::check_launch;
using detail::grid_blocks;
using detail::kWarp;

constexpr int kAttnThreads = 128;

// Note [Shared memory past the row]
// The kernels read a row of T floats from dynamic shared memory in loops that the compiler
// unrolls by four. Seen under compute-sanitizer memcheck on an H200: the code generator merged
// the remainder's guarded loads into one wider load, which reads up to three floats past the
// row's last one (T = 13: a 12-byte read at the 13th float). Its extra values are never used,
// but a read outside the block's shared memory is an error, and where T floats end on the
// allocation's granule the hardware would fault. Each block therefore asks for four floats
// more than the row.
constexpr i64 kRowPadding = 4;

std::size_t row_smem_bytes(i64 t) {
  return static_cast<std::size_t>(t + kRowPadding) * sizeof(float);
}

struct Dims {
  i64 b, t, c, nh, hs;
  float scale;
};

// Decomposes block item `blk` = (bi * NH + h) * T + ti.
struct Row {
  i64 bi, h, ti;
};

__device__ __forceinline__ Row row_of(i64 blk, const Dims& d) {
  const i64 bh = blk / d.t;
  return Row{bh / d.nh, bh % d.nh, blk - bh * d.t};
}

__device__ __forceinline__ float dot(const float* a, const float* b, i64 n) {
  float acc = 0.0f;
  for (i64 i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

__global__ void attention_forward_kernel(const float* __restrict__ qkv, float* __restrict__ out,
                                         float* __restrict__ att, Dims d) {
  REMAT_DYNAMIC_SHARED(float, s);  // T floats: this row's scores, then its weights
  __shared__ float scratch[kWarp];
  const i64 c3 = 3 * d.c;
  const i64 items = d.b * d.nh * d.t;
  for (i64 blk = blockIdx.x; blk < items; blk += gridDim.x) {
    const Row r = row_of(blk, d);
    const float* qkv_b = qkv + r.bi * d.t * c3;
    const float* q = qkv_b + r.ti * c3 + r.h * d.hs;
    float mx = -INFINITY;
    for (i64 t2 = threadIdx.x; t2 <= r.ti; t2 += blockDim.x) {
      const float score = dot(q, qkv_b + t2 * c3 + d.c + r.h * d.hs, d.hs) * d.scale;
      s[t2] = score;
      mx = fmaxf(mx, score);
    }
    mx = block_max(mx, scratch);
    float acc = 0.0f;
    for (i64 t2 = threadIdx.x; t2 <= r.ti; t2 += blockDim.x) {
      const float e = expf(s[t2] - mx);
      s[t2] = e;
      acc += e;
    }
    const float inv = 1.0f / block_sum(acc, scratch);
    float* att_row = att + blk * d.t;
    for (i64 t2 = threadIdx.x; t2 < d.t; t2 += blockDim.x) {
      if (t2 <= r.ti) {
        const float a = s[t2] * inv;
        s[t2] = a;
        att_row[t2] = a;
      } else {
        att_row[t2] = 0.0f;
      }
    }
    __syncthreads();
    float* o = out + (r.bi * d.t + r.ti) * d.c + r.h * d.hs;
    const float* v = qkv_b + 2 * d.c + r.h * d.hs;
    for (i64 i = threadIdx.x; i < d.hs; i += blockDim.x) {
      float sum = 0.0f;
      for (i64 t2 = 0; t2 <= r.ti; ++t2) sum += s[t2] * v[t2 * c3 + i];
      o[i] = sum;
    }
    __syncthreads();  // s is rewritten by the next row
  }
}

// Pass 1: dq and D_t, one block per (b, h, t).
__global__ void attention_backward_dq_kernel(const float* __restrict__ dout,
                                             const float* __restrict__ qkv,
                                             const float* __restrict__ att,
                                             float* __restrict__ dqkv, Dims d) {
  REMAT_DYNAMIC_SHARED(float, s);  // datt, then dpre, over t2 <= t
  __shared__ float scratch[kWarp];
  const i64 c3 = 3 * d.c;
  const i64 items = d.b * d.nh * d.t;
  for (i64 blk = blockIdx.x; blk < items; blk += gridDim.x) {
    const Row r = row_of(blk, d);
    const float* qkv_b = qkv + r.bi * d.t * c3;
    const float* att_row = att + blk * d.t;
    const float* dout_row = dout + (r.bi * d.t + r.ti) * d.c + r.h * d.hs;
    float acc = 0.0f;
    for (i64 t2 = threadIdx.x; t2 <= r.ti; t2 += blockDim.x) {
      const float datt = dot(qkv_b + t2 * c3 + 2 * d.c + r.h * d.hs, dout_row, d.hs);
      s[t2] = datt;
      acc += att_row[t2] * datt;
    }
    const float dsum = block_sum(acc, scratch);
    for (i64 t2 = threadIdx.x; t2 <= r.ti; t2 += blockDim.x) {
      s[t2] = att_row[t2] * (s[t2] - dsum) * d.scale;
    }
    __syncthreads();
    float* dqkv_row = dqkv + (r.bi * d.t + r.ti) * c3;
    const float* k = qkv_b + d.c + r.h * d.hs;
    for (i64 i = threadIdx.x; i < d.hs; i += blockDim.x) {
      float sum = 0.0f;
      for (i64 t2 = 0; t2 <= r.ti; ++t2) sum += s[t2] * k[t2 * c3 + i];
      dqkv_row[r.h * d.hs + i] = sum;
    }
    if (threadIdx.x == 0) dqkv_row[2 * d.c + r.h * d.hs] = dsum;  // D_t, for pass 2
    __syncthreads();
  }
}

// Pass 2: dk, one block per (b, h, t2).
__global__ void attention_backward_dk_kernel(const float* __restrict__ dout,
                                             const float* __restrict__ qkv,
                                             const float* __restrict__ att,
                                             float* __restrict__ dqkv, Dims d) {
  REMAT_DYNAMIC_SHARED(float, s);  // dpre[t, t2] for t >= t2, at t - t2
  const i64 c3 = 3 * d.c;
  const i64 items = d.b * d.nh * d.t;
  for (i64 blk = blockIdx.x; blk < items; blk += gridDim.x) {
    const Row r = row_of(blk, d);  // r.ti is t2 here
    const i64 t2 = r.ti;
    const float* qkv_b = qkv + r.bi * d.t * c3;
    const float* v2 = qkv_b + t2 * c3 + 2 * d.c + r.h * d.hs;
    const float* att_bh = att + (r.bi * d.nh + r.h) * d.t * d.t;
    for (i64 t = t2 + threadIdx.x; t < d.t; t += blockDim.x) {
      const float datt = dot(v2, dout + (r.bi * d.t + t) * d.c + r.h * d.hs, d.hs);
      const float dsum = dqkv[(r.bi * d.t + t) * c3 + 2 * d.c + r.h * d.hs];
      s[t - t2] = att_bh[t * d.t + t2] * (datt - dsum) * d.scale;
    }
    __syncthreads();
    float* dk = dqkv + (r.bi * d.t + t2) * c3 + d.c + r.h * d.hs;
    const float* q = qkv_b + r.h * d.hs;
    for (i64 i = threadIdx.x; i < d.hs; i += blockDim.x) {
      float sum = 0.0f;
      for (i64 t = t2; t < d.t; ++t) sum += s[t - t2] * q[t * c3 + i];
      dk[i] = sum;
    }
    __syncthreads();
  }
}

// Pass 3: dv (overwriting the parked D_t values), one block per (b, h, t2).
__global__ void attention_backward_dv_kernel(const float* __restrict__ dout,
                                             const float* __restrict__ att,
                                             float* __restrict__ dqkv, Dims d) {
  REMAT_DYNAMIC_SHARED(float, s);  // att[t, t2] for t >= t2, at t - t2
  const i64 c3 = 3 * d.c;
  const i64 items = d.b * d.nh * d.t;
  for (i64 blk = blockIdx.x; blk < items; blk += gridDim.x) {
    const Row r = row_of(blk, d);
    const i64 t2 = r.ti;
    const float* att_bh = att + (r.bi * d.nh + r.h) * d.t * d.t;
    for (i64 t = t2 + threadIdx.x; t < d.t; t += blockDim.x) s[t - t2] = att_bh[t * d.t + t2];
    __syncthreads();
    float* dv = dqkv + (r.bi * d.t + t2) * c3 + 2 * d.c + r.h * d.hs;
    const float* dout_b = dout + r.bi * d.t * d.c + r.h * d.hs;
    for (i64 i = threadIdx.x; i < d.hs; i += blockDim.x) {
      float sum = 0.0f;
      for (i64 t = t2; t < d.t; ++t) sum += s[t - t2] * dout_b[t * d.c + i];
      dv[i] = sum;
    }
    __syncthreads();
  }
}

Dims make_dims(i64 b, i64 t, i64 c, i64 nh) {
  const i64 hs = nh > 0 ? c / nh : 0;
  const float scale = hs > 0 ? 1.0f / std::sqrt(static_cast<float>(hs)) : 1.0f;
  return Dims{b, t, c, nh, hs, scale};
}

}  // namespace

void attention_forward(const float* qkv, float* out, float* att, i64 b, i64 t, i64 c, i64 nh,
                       cudaStream_t stream) {
  const Dims d = make_dims(b, t, c, nh);
  if (b <= 0 || t <= 0 || nh <= 0) return;
  const std::size_t smem = row_smem_bytes(t);
  detail::allow_dynamic_smem(attention_forward_kernel, smem, "attention_forward_kernel");
  REMAT_LAUNCH(attention_forward_kernel, grid_blocks(b * nh * t), kAttnThreads, smem, stream)
  (qkv, out, att, d);
  check_launch("attention_forward_kernel");
}

void attention_backward(const float* dout, const float* qkv, const float* att, float* dqkv, i64 b,
                        i64 t, i64 c, i64 nh, cudaStream_t stream) {
  const Dims d = make_dims(b, t, c, nh);
  if (b <= 0 || t <= 0 || c <= 0) return;
  if (nh <= 0 || d.hs <= 0 || d.nh * d.hs != c) {
    // Channels no head covers get no gradient (as on the CPU); the passes below write only
    // the heads' channels.
    REMAT_CUDA_CHECK(
        cudaMemsetAsync(dqkv, 0, static_cast<std::size_t>(b * t * 3 * c) * sizeof(float), stream));
    if (nh <= 0 || d.hs <= 0) return;
  }
  const std::size_t smem = row_smem_bytes(t);
  const unsigned grid = grid_blocks(b * nh * t);
  detail::allow_dynamic_smem(attention_backward_dq_kernel, smem, "attention_backward_dq_kernel");
  detail::allow_dynamic_smem(attention_backward_dk_kernel, smem, "attention_backward_dk_kernel");
  detail::allow_dynamic_smem(attention_backward_dv_kernel, smem, "attention_backward_dv_kernel");
  REMAT_LAUNCH(attention_backward_dq_kernel, grid, kAttnThreads, smem, stream)
  (dout, qkv, att, dqkv, d);
  check_launch("attention_backward_dq_kernel");
  REMAT_LAUNCH(attention_backward_dk_kernel, grid, kAttnThreads, smem, stream)
  (dout, qkv, att, dqkv, d);
  check_launch("attention_backward_dk_kernel");
  REMAT_LAUNCH(attention_backward_dv_kernel, grid, kAttnThreads, smem, stream)(dout, att, dqkv, d);
  check_launch("attention_backward_dv_kernel");
}

}  // namespace remat::kernels::cuda
