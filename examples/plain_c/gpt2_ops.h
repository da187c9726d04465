// The GPT-2 loop's kernels (kernels.h, gpt2_kernels.h) as remat ops: each a shape function,
// the loop's own kernel on the KernelContext's pointers, and the work (flops and bytes) the
// runtime's roofline prices it by. Activations are (B, T, C)-shaped tensors; row-wise ops
// take every leading dimension as rows.
#ifndef REMAT_EXAMPLES_PLAIN_C_GPT2_OPS_H_
#define REMAT_EXAMPLES_PLAIN_C_GPT2_OPS_H_

#include "remat/op.h"

namespace plain_c::gpt2 {

// tokens (B, T) int32, wte (V, C), wpe (T, C) -> (B, T, C)
remat::OpPtr encoder_op();
// A Runtime::update op: args dwte, dwpe, dout (B, T, C), tokens; writes {0, 1}. It makes no
// tensor, only adds into the two gradients, so it is an update rather than an accumulation.
remat::OpPtr encoder_backward_op();

// inp (..., C), weight (C), bias (C) -> out (..., C), mean (rows), rstd (rows)
remat::OpPtr layernorm_op();
// Args dout, inp, weight, mean, rstd, dweight, dbias -> dinp (the shape of inp); adds into
// args 5 and 6 (Runtime::call_accumulate with kLayernormAccumulated).
remat::OpPtr layernorm_backward_op();
inline constexpr int kLayernormAccumulated[] = {5, 6};

// inp (..., C), weight (OC, C), bias (OC) -> out (..., OC)
remat::OpPtr matmul_op();
// Args dout (..., OC), inp (..., C), weight, dweight, dbias -> dinp; adds into args 3 and 4.
remat::OpPtr matmul_backward_op();
inline constexpr int kMatmulAccumulated[] = {3, 4};

// qkv (B, T, 3C) -> (B, T, C), with `heads` heads. The probabilities live in scratch the op
// declares (remat::with_scratch): one (B, NH, T, T) region forward, two backward.
remat::OpPtr attention_op(int heads);
remat::OpPtr attention_backward_op(int heads);  // dout (B, T, C), qkv -> dqkv (B, T, 3C)

remat::OpPtr gelu_op();           // inp -> out
remat::OpPtr gelu_backward_op();  // the forward's input, dout -> dinp
remat::OpPtr add_op();            // a, b -> a + b

// logits (..., V), targets (...) int32 -> the mean loss over the rows (1), probs (..., V)
remat::OpPtr crossentropy_op();
remat::OpPtr crossentropy_backward_op();  // probs, targets -> dlogits

// Runtime::update ops. zero_op zeroes every arg; adamw_op takes (param, grad, m, v) and
// writes {0, 2, 3} for AdamW's step t (from 1).
remat::OpPtr zero_op();
remat::OpPtr adamw_op(float lr, int t);

}  // namespace plain_c::gpt2

#endif  // REMAT_EXAMPLES_PLAIN_C_GPT2_OPS_H_
