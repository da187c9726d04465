// The op library: forward and backward float32 ops for training loops that run through the
// runtime, each an OpDef with an output-shape function, its work (arithmetic and memory
// traffic, `OpDef::work`, which the runtime prices with its roofline) and a CPU and a CUDA
// kernel (kernels/cpu, kernels/cuda). `OpDef::cost` is set too, to the work's price on
// `Roofline::cpu()`, for readers of `cost` that have no roofline of their own; views, which
// run nothing, declare only a token cost. Every function runs its op at once through `rt` and
// returns the outputs, which the runtime may evict and recompute.
//
//   remat::Runtime rt({.budget = size_t{256} << 20});
//   remat::Tensor x = rt.constant({{8, 64}}, input);
//   remat::Tensor w = rt.constant({{32, 64}}, weights), b = rt.constant({{32}}, bias);
//   remat::Tensor h = remat::ops::gelu(rt, remat::ops::linear(rt, x, w, b));   // (8, 32)
//
// Layouts are row-major; "rows" means the product of all dimensions but the last. Shape
// mismatches throw std::invalid_argument naming the op and the shapes. Gradients are
// separate ops (the `_backward` functions); kernels/autograd.h records them on a tape.
#ifndef REMAT_KERNELS_OPS_H_
#define REMAT_KERNELS_OPS_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "remat/runtime.h"

namespace remat::ops {

// y = x w^T (+ b): x (.., C), w (OC, C), b (OC) or undefined.
Tensor linear(Runtime& rt, const Tensor& x, const Tensor& w, const Tensor& b = {});
// op(a) op(b): a is taken as (rows, last); with trans_a the result is (last, N), else it keeps
// a's leading dimensions with N last. b is taken as (rows, last) the same way.
Tensor matmul(Runtime& rt, const Tensor& a, const Tensor& b, bool trans_a = false,
              bool trans_b = false);
Tensor bias_add(Runtime& rt, const Tensor& x, const Tensor& b);
Tensor bias_grad(Runtime& rt, const Tensor& dy);  // (last,) sums over rows

Tensor add(Runtime& rt, const Tensor& a, const Tensor& b);
Tensor mul(Runtime& rt, const Tensor& a, const Tensor& b);
Tensor scale(Runtime& rt, const Tensor& x, float s);
Tensor sum(Runtime& rt, const Tensor& x);  // (1,)
Tensor zeros(Runtime& rt, const TensorSpec& spec);
Tensor gelu(Runtime& rt, const Tensor& x);
Tensor gelu_backward(Runtime& rt, const Tensor& x, const Tensor& dy);
Tensor relu(Runtime& rt, const Tensor& x);
Tensor relu_backward(Runtime& rt, const Tensor& x, const Tensor& dy);
Tensor sigmoid(Runtime& rt, const Tensor& x);
Tensor sigmoid_backward(Runtime& rt, const Tensor& y, const Tensor& dy);
Tensor tanh(Runtime& rt, const Tensor& x);
Tensor tanh_backward(Runtime& rt, const Tensor& y, const Tensor& dy);
Tensor softmax(Runtime& rt, const Tensor& x);
Tensor softmax_backward(Runtime& rt, const Tensor& y, const Tensor& dy);

// Views (no kernel, no memory): the same bytes with another shape, and a contiguous range
// of elements [offset, offset + numel(shape)).
Tensor reshape(Runtime& rt, const Tensor& x, std::vector<std::int64_t> shape);
Tensor narrow(Runtime& rt, const Tensor& x, std::int64_t offset, std::vector<std::int64_t> shape);
// Concatenation along the first dimension (a copy).
Tensor concat(Runtime& rt, const std::vector<Tensor>& parts);

struct LayerNormOut {
  Tensor y, mean, rstd;
};
LayerNormOut layernorm(Runtime& rt, const Tensor& x, const Tensor& w, const Tensor& b,
                       float eps = 1e-5f);
struct LayerNormGrads {
  Tensor dx, dw, db;
};
LayerNormGrads layernorm_backward(Runtime& rt, const Tensor& dy, const Tensor& x, const Tensor& w,
                                  const Tensor& mean, const Tensor& rstd);

// Causal self-attention over qkv (B, T, 3C) with `heads` heads: out (B, T, C) and the
// attention weights att (B, NH, T, T) the backward pass reads.
struct AttentionOut {
  Tensor out, att;
};
AttentionOut attention(Runtime& rt, const Tensor& qkv, std::int64_t heads);
Tensor attention_backward(Runtime& rt, const Tensor& dout, const Tensor& qkv, const Tensor& att,
                          std::int64_t heads);

// idx (B, T) int32; wte (V, C); wpe (maxT >= T, C) or undefined: out (B, T, C).
Tensor embedding(Runtime& rt, const Tensor& idx, const Tensor& wte, const Tensor& wpe = {});
struct EmbeddingGrads {
  Tensor dwte, dwpe;  // dwpe has wpe's shape (rows past T are zero); undefined without wpe
};
EmbeddingGrads embedding_backward(Runtime& rt, const Tensor& dout, const Tensor& idx,
                                  const TensorSpec& wte, const TensorSpec* wpe);

// Per-row losses (N,) of logits (N, V) against int32 targets (N,).
Tensor cross_entropy(Runtime& rt, const Tensor& logits, const Tensor& targets);
// dlogits = (softmax - onehot) * dloss[0] * scale.
Tensor cross_entropy_backward(Runtime& rt, const Tensor& logits, const Tensor& targets,
                              const Tensor& dloss, float scale);

// Inverted dropout with a Philox mask drawn from the op's recorded RNG state, so that a
// recomputed mask is the same mask. mask is uint8.
struct DropoutOut {
  Tensor y, mask;
};
DropoutOut dropout(Runtime& rt, const Tensor& x, float p);
Tensor dropout_backward(Runtime& rt, const Tensor& dy, const Tensor& mask, float p);

// x (N, IC, H, W), w (OC, IC, KH, KW), b (OC) or undefined.
Tensor conv2d(Runtime& rt, const Tensor& x, const Tensor& w, const Tensor& b, std::int64_t stride,
              std::int64_t pad);
struct Conv2dGrads {
  Tensor dx, dw, db;  // dx undefined unless need_dx; db undefined without a bias
};
Conv2dGrads conv2d_backward(Runtime& rt, const Tensor& dy, const Tensor& x, const Tensor& w,
                            bool has_bias, bool need_dx, std::int64_t stride, std::int64_t pad);

// Batch norm in training mode over x (N, C, H, W): batch statistics mean/rstd (C) are
// outputs; the running statistics are updated separately, once per step, by
// batchnorm_running_update (a recomputation never touches them).
struct BatchNormOut {
  Tensor y, mean, rstd;
};
BatchNormOut batchnorm(Runtime& rt, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                       float eps = 1e-5f);
struct BatchNormGrads {
  Tensor dx, dgamma, dbeta;
};
BatchNormGrads batchnorm_backward(Runtime& rt, const Tensor& dy, const Tensor& x,
                                  const Tensor& gamma, const Tensor& mean, const Tensor& rstd);
void batchnorm_running_update(Runtime& rt, const Tensor& running_mean, const Tensor& running_var,
                              const Tensor& mean, const Tensor& rstd, std::int64_t count,
                              float momentum = 0.1f, float eps = 1e-5f);

struct MaxPoolOut {
  Tensor y, argmax;  // argmax int32
};
MaxPoolOut maxpool2d(Runtime& rt, const Tensor& x, std::int64_t k, std::int64_t s);
Tensor maxpool2d_backward(Runtime& rt, const Tensor& dy, const Tensor& argmax, const TensorSpec& x,
                          std::int64_t k, std::int64_t s);
Tensor avgpool(Runtime& rt, const Tensor& x);  // (N, C, H, W) -> (N, C)
Tensor avgpool_backward(Runtime& rt, const Tensor& dy, const TensorSpec& x);

struct AdamW {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f;
};
// One AdamW step (t >= 1) on pinned param, m and v, in place (Runtime::update).
void adamw(Runtime& rt, const Tensor& param, const Tensor& m, const Tensor& v, const Tensor& grad,
           const AdamW& hp, int t);

// For tests and tools: called on this thread with every op the functions above hand the
// runtime, and its input specs, just before the runtime runs it, so that what the op declares
// (outputs, work, cost) can be checked without going through the runtime's pricing. An empty
// function stops it.
using OpObserver = std::function<void(const OpDef& op, SpecList inputs)>;
void set_op_observer(OpObserver observer);

}  // namespace remat::ops

#endif  // REMAT_KERNELS_OPS_H_
