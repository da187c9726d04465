// A training loop's own kernels, as a plain-C loop has them: raw float pointers, sizes as
// ints, outputs overwritten except where a backward kernel accumulates into parameter
// gradients (`dweight += ...`). Nothing here knows of remat; docs/integrating.md moves these
// kernels and their buffers into it (examples/plain_c/model.cc).
#ifndef REMAT_EXAMPLES_PLAIN_C_KERNELS_H_
#define REMAT_EXAMPLES_PLAIN_C_KERNELS_H_

#include <cstddef>
#include <cstdint>

namespace plain_c {

// out[b][o] = bias[o] + sum_c inp[b][c] * weight[o][c]
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int B,
                    int C, int OC);
// dinp[b][c] = sum_o dout[b][o] * weight[o][c] (written), and, added into what they hold:
// dweight[o][c] += sum_b dout[b][o] * inp[b][c], dbias[o] += sum_b dout[b][o].
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int B, int C, int OC);
void gelu_forward(float* out, const float* inp, int N);
void gelu_backward(float* dinp, const float* inp, const float* dout, int N);
void add_forward(float* out, const float* a, const float* b, int N);
// probs = softmax(logits) per row, loss[0] = mean over rows of -log probs[b][targets[b]].
void crossentropy_forward(float* loss, float* probs, const float* logits, const int32_t* targets,
                          int B, int V);
// dlogits = (probs - onehot(targets)) / B
void crossentropy_backward(float* dlogits, const float* probs, const int32_t* targets, int B,
                           int V);
void zero(float* p, std::size_t n);
void adamw(float* param, const float* grad, float* m, float* v, std::size_t n, float lr, int t);

}  // namespace plain_c

#endif  // REMAT_EXAMPLES_PLAIN_C_KERNELS_H_
