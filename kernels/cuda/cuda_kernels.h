// Raw float32 CUDA kernels: the twins of kernels/cpu/cpu_kernels.h, same names, same
// parameters (device pointers) and same semantics, plus the stream every launch is queued on.
// Nothing here synchronises the device; a call returns once its work is queued.
//
// Rules every kernel here keeps (the same as the CPU kernels'):
//  - Deterministic: the same inputs give the same bits on every call. No floating-point
//    atomics; every reduction runs in a fixed order. Results agree with the CPU kernels to
//    rounding (dropout masks and maxpool argmax exactly), not bit for bit.
//  - Outputs are overwritten, never accumulated into.
//  - Outputs never alias inputs.
//
// GEMM (and the convolutions built on it) goes through cuBLAS: one handle per host thread and
// device, created on first use, with FP32 math (no TF32) and atomics disallowed. Its workspace
// is the caller's where one is given (`BlasWorkspace`: the runtime passes the one it keeps
// under its budget, KernelContext::workspace); otherwise one per stream it has been used on,
// cudaMalloc'd on that stream's first GEMM and kept until the thread exits, outside any
// budget. A stream's GEMMs thus never share a workspace with another stream's (a lent one is
// lent to one stream at a time), as cuBLAS needs for run-to-run reproducibility.
//
// Embedding backward needs temporary device memory for its sort. A caller that can lend it
// passes a `Scratch` (the runtime passes KernelContext::scratch, memory under its budget);
// otherwise, or where the scratch gives none, it comes from a cache kept per stream and
// thread, cudaMalloc'd and outside any budget.
//
// Failures (a CUDA or cuBLAS status, a launch error) throw std::runtime_error naming the call.
//
//   float *a, *b, *c;  // device buffers of M*K, K*N and M*N floats
//   remat::kernels::cuda::gemm(false, false, M, N, K, 1.0f, a, b, 0.0f, c, stream);
//   remat::kernels::cuda::gemm(false, false, M, N, K, 1.0f, a, b, 0.0f, c, stream,
//                              {workspace, workspace_bytes});  // cuBLAS uses this memory
#ifndef REMAT_KERNELS_CUDA_CUDA_KERNELS_H_
#define REMAT_KERNELS_CUDA_CUDA_KERNELS_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace remat::kernels::cuda {

using i64 = std::int64_t;

// Device memory for cuBLAS's workspace, lent by the caller for the call and the work it
// queues: on the current device, aligned to 256 bytes (cuBLAS refuses less), and used by no
// other stream meanwhile (cuBLAS's reproducibility needs a workspace per stream). cuBLAS
// picks only algorithms that fit in `bytes`; 32 MiB from Hopper on and 4 MiB before are its
// recommendations. A null `ptr` means none is given.
struct BlasWorkspace {
  void* ptr = nullptr;
  std::size_t bytes = 0;
};

// Temporary device memory a kernel may ask for: `fn(self, bytes)` returns memory the kernel
// may use until its entry point returns, and so may the work it queued on its stream by then
// (the lender reuses it only in stream order), or null where it has none to give. It may
// throw (the runtime's OutOfMemoryError), which the kernel lets through. Nothing is handed
// back piecemeal: the lender takes all of it back after the call. The same shape as
// KernelContext::scratch_fn and scratch_self (remat/op.h), so the runtime's passes straight in.
struct Scratch {
  void* (*fn)(void* self, std::size_t bytes) = nullptr;
  void* self = nullptr;
  void* get(std::size_t bytes) const { return fn == nullptr ? nullptr : fn(self, bytes); }
};

// C[M,N] = alpha * op(A) * op(B) + beta * C, row-major. op(A) is M x K: A is stored M x K,
// or K x M when trans_a. op(B) is K x N: B is stored K x N, or N x K when trans_b.
// With beta == 0, C is not read. M, N, K must fit in an int.
// `workspace`: cuBLAS's workspace for this call (see BlasWorkspace); none: the stream's own.
void gemm(bool trans_a, bool trans_b, i64 m, i64 n, i64 k, float alpha, const float* a,
          const float* b, float beta, float* c, cudaStream_t stream, BlasWorkspace workspace = {});

// y[r, c] = x[r, c] + bias[c]
void bias_add(const float* x, const float* bias, float* y, i64 rows, i64 cols, cudaStream_t stream);
// dbias[c] = sum_r dy[r, c]
void bias_grad(const float* dy, float* dbias, i64 rows, i64 cols, cudaStream_t stream);

// Elementwise over n values.
void add(const float* a, const float* b, float* y, i64 n, cudaStream_t stream);
void mul(const float* a, const float* b, float* y, i64 n, cudaStream_t stream);
void scale(const float* x, float s, float* y, i64 n, cudaStream_t stream);
// GELU, tanh approximation (as GPT-2 and llm.c): 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))).
void gelu_forward(const float* x, float* y, i64 n, cudaStream_t stream);
void gelu_backward(const float* x, const float* dy, float* dx, i64 n, cudaStream_t stream);
void relu_forward(const float* x, float* y, i64 n, cudaStream_t stream);
void relu_backward(const float* x, const float* dy, float* dx, i64 n,
                   cudaStream_t stream);  // dx = x > 0 ? dy : 0
void sigmoid_forward(const float* x, float* y, i64 n, cudaStream_t stream);
void sigmoid_backward(const float* y, const float* dy, float* dx, i64 n,
                      cudaStream_t stream);  // from the output y
void tanh_forward(const float* x, float* y, i64 n, cudaStream_t stream);
void tanh_backward(const float* y, const float* dy, float* dx, i64 n,
                   cudaStream_t stream);  // from the output y
// y[0] = sum of x (a fixed summation order).
void sum(const float* x, float* y, i64 n, cudaStream_t stream);
void fill_zero(void* p, std::size_t bytes, cudaStream_t stream);
void copy_bytes(void* dst, const void* src, std::size_t bytes, cudaStream_t stream);

// LayerNorm over the last dimension C of `rows` rows: y = (x - mean) * rstd * w + b, with
// mean[r] and rstd[r] = 1 / sqrt(var + eps) saved for the backward pass (biased variance).
void layernorm_forward(const float* x, const float* w, const float* b, float* y, float* mean,
                       float* rstd, i64 rows, i64 c, float eps, cudaStream_t stream);
// dx, dw and db are all overwritten (dw/db summed over rows).
void layernorm_backward(const float* dy, const float* x, const float* w, const float* mean,
                        const float* rstd, float* dx, float* dw, float* db, i64 rows, i64 c,
                        cudaStream_t stream);

// Softmax over the last dimension.
void softmax_forward(const float* x, float* y, i64 rows, i64 cols, cudaStream_t stream);
void softmax_backward(const float* y, const float* dy, float* dx, i64 rows, i64 cols,
                      cudaStream_t stream);

// Causal multi-head self-attention as in llm.c. qkv is (B, T, 3C): for each position the
// queries, then the keys, then the values, each C = NH * HS wide with head h at [h*HS,
// (h+1)*HS). att (B, NH, T, T) receives the post-softmax weights, scale 1/sqrt(HS), entries
// above the diagonal (t2 > t) set to 0. out (B, T, C) = att @ v, heads side by side.
// Needs 4*T bytes of shared memory per block (T up to about 58000 on sm_90).
void attention_forward(const float* qkv, float* out, float* att, i64 b, i64 t, i64 c, i64 nh,
                       cudaStream_t stream);
// dqkv (B, T, 3C) overwritten (its value slots serve as scratch between the internal passes).
void attention_backward(const float* dout, const float* qkv, const float* att, float* dqkv, i64 b,
                        i64 t, i64 c, i64 nh, cudaStream_t stream);

// out[b, t, :] = wte[idx[b, t], :] + (wpe ? wpe[t, :] : 0). idx values are in [0, V).
void embedding_forward(const std::int32_t* idx, const float* wte, const float* wpe, float* out,
                       i64 b, i64 t, i64 c, cudaStream_t stream);
// dwte (V, C) = scatter-sum of dout rows by token id (rows added in increasing (b, t) order);
// dwpe (T, C) = sum over b (skipped when dwpe is null). Both overwritten. The sort by id takes
// about 8*B*T bytes of temporary memory plus Thrust's own, from `scratch` where it gives them
// (Note [Embedding backward by sorting] in cuda_embedding.cu).
void embedding_backward(const float* dout, const std::int32_t* idx, float* dwte, float* dwpe, i64 b,
                        i64 t, i64 c, i64 v, cudaStream_t stream, Scratch scratch = {});

// losses[i] = -log softmax(logits[i, :])[targets[i]], for N rows of V logits.
void cross_entropy_forward(const float* logits, const std::int32_t* targets, float* losses, i64 n,
                           i64 v, cudaStream_t stream);
// dlogits[i, j] = (softmax(logits[i, :])[j] - (j == targets[i])) * dloss[0] * scale
// dloss is a one-element device tensor (the upstream gradient of the reduced loss).
void cross_entropy_backward(const float* logits, const std::int32_t* targets, const float* dloss,
                            float scale, float* dlogits, i64 n, i64 v, cudaStream_t stream);

// Inverted dropout on a Philox stream (kernels/philox.h): element i is kept when
// Philox(seed, offset).uniform(i) >= p; y = kept ? x / (1 - p) : 0, mask[i] = kept.
// The mask equals the CPU kernel's bit for bit.
void dropout_forward(const float* x, float* y, std::uint8_t* mask, i64 n, float p,
                     std::uint64_t seed, std::uint64_t offset, cudaStream_t stream);
void dropout_backward(const float* dy, const std::uint8_t* mask, float* dx, i64 n, float p,
                      cudaStream_t stream);

// 2-D convolution, NCHW, weight (OC, IC, KH, KW), optional bias (OC) (null: none), square
// stride and zero padding; OH = (H + 2 pad - KH) / stride + 1, likewise OW. im2col + cuBLAS
// GEMM, one image at a time: `cols` is device scratch of IC*KH*KW*OH*OW floats. `workspace`
// as for gemm.
void conv2d_forward(const float* x, const float* w, const float* bias, float* y, float* cols, i64 n,
                    i64 ic, i64 h, i64 wd, i64 oc, i64 kh, i64 kw, i64 stride, i64 pad,
                    cudaStream_t stream, BlasWorkspace workspace = {});
// dx, dw, dbias (when not null) overwritten; dx may be null (the first layer needs none).
void conv2d_backward(const float* dy, const float* x, const float* w, float* dx, float* dw,
                     float* dbias, float* cols, i64 n, i64 ic, i64 h, i64 wd, i64 oc, i64 kh,
                     i64 kw, i64 stride, i64 pad, cudaStream_t stream,
                     BlasWorkspace workspace = {});

// Batch norm in training mode over NCHW (statistics per channel over N*H*W, biased variance):
// y = (x - mean) * rstd * gamma + beta, mean/rstd (C) saved.
void batchnorm_forward(const float* x, const float* gamma, const float* beta, float* y, float* mean,
                       float* rstd, i64 n, i64 c, i64 hw, float eps, cudaStream_t stream);
void batchnorm_backward(const float* dy, const float* x, const float* gamma, const float* mean,
                        const float* rstd, float* dx, float* dgamma, float* dbeta, i64 n, i64 c,
                        i64 hw, cudaStream_t stream);
// running = (1 - momentum) * running + momentum * batch, with the unbiased batch variance
// var = (1/rstd^2 - eps) * count / (count - 1), count = N*H*W. Updates in place.
void batchnorm_running_update(float* running_mean, float* running_var, const float* mean,
                              const float* rstd, i64 c, i64 count, float momentum, float eps,
                              cudaStream_t stream);

// Max pooling, NCHW, square window k and stride s, no padding; argmax holds the flat index
// (h * W + w) inside the input plane of the chosen element (the first maximum on ties).
void maxpool2d_forward(const float* x, float* y, std::int32_t* argmax, i64 n, i64 c, i64 h, i64 wd,
                       i64 k, i64 s, cudaStream_t stream);
void maxpool2d_backward(const float* dy, const std::int32_t* argmax, float* dx, i64 n, i64 c, i64 h,
                        i64 wd, i64 k, i64 s, cudaStream_t stream);
// Global average pooling: y (N, C) = mean over each H*W plane.
void avgpool_forward(const float* x, float* y, i64 n, i64 c, i64 hw, cudaStream_t stream);
void avgpool_backward(const float* dy, float* dx, i64 n, i64 c, i64 hw, cudaStream_t stream);

// AdamW (decoupled weight decay), in place, step t >= 1:
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
//   p -= lr * ((m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps) + wd * p)
void adamw_update(float* param, float* m, float* v, const float* grad, i64 n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int t, cudaStream_t stream);

}  // namespace remat::kernels::cuda

#endif  // REMAT_KERNELS_CUDA_CUDA_KERNELS_H_
