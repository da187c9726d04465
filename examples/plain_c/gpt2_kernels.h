// The kernels a plain-C GPT-2 loop adds to kernels.h (whose matmul, gelu, add, crossentropy,
// zero and AdamW it reuses, over B*T rows): token and position embeddings, layernorm, and
// causal multi-head self-attention. Raw float pointers and int sizes; nothing here knows of
// remat (examples/plain_c/gpt2_model.cc moves these kernels into it).
//
// Layouts are row-major and contiguous. B is the batch, T the sequence length, C the
// channels, NH the heads (C % NH == 0, head size hs = C / NH), V the vocabulary, N a count
// of rows. As in kernels.h, outputs are overwritten and only parameter gradients are added
// into (`dweight += ...`).
#ifndef REMAT_EXAMPLES_PLAIN_C_GPT2_KERNELS_H_
#define REMAT_EXAMPLES_PLAIN_C_GPT2_KERNELS_H_

#include <cstddef>
#include <cstdint>

namespace plain_c {

// tokens (B, T) int32 in [0, V), wte (V, C), wpe (at least T rows, C):
// out (B, T, C)[b][t] = wte[tokens[b][t]] + wpe[t].
void encoder_forward(float* out, const std::int32_t* tokens, const float* wte, const float* wpe,
                     int B, int T, int C);
// Added into: dwte[tokens[b][t]] += dout[b][t], dwpe[t] += dout[b][t], in (b, t) order.
void encoder_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens,
                      int B, int T, int C);

// inp (N, C), weight and bias (C): per row, mean[n] and rstd[n] = 1 / sqrt(var + 1e-5) over
// its C values (both (N)), out (N, C) = (inp - mean) * rstd * weight + bias.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C);
// dinp (N, C) written from dout (N, C) and what the forward read and saved; added into:
// dweight[c] += sum_n dout[n][c] * normalized[n][c], dbias[c] += sum_n dout[n][c].
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C);

// Floats in one (B, NH, T, T) region of attention probabilities. attention_forward's scratch
// is one region; attention_backward's two.
inline std::size_t attention_region_floats(int B, int T, int NH) {
  return static_cast<std::size_t>(B) * static_cast<std::size_t>(NH) * static_cast<std::size_t>(T) *
         static_cast<std::size_t>(T);
}

// qkv (B, T, 3C): per position the queries in [0, C), the keys in [C, 2C), the values in
// [2C, 3C); head h owns channels [h * hs, (h + 1) * hs) of each. out (B, T, C): head h's
// channels are sum over t2 <= t of att[b][h][t][t2] * v[b][t2][h], where att[b][h][t] is
// softmax over t2 <= t of q[b][t][h] . k[b][t2][h] / sqrt(hs), and 0 for t2 > t.
// scratch_att (B, NH, T, T) receives att: the caller's scratch, not an output (the backward
// computes it again).
void attention_forward(float* out, const float* qkv, float* scratch_att, int B, int T, int C,
                       int NH);
// dqkv (B, T, 3C) written from dout (B, T, C) and qkv. scratch holds two (B, NH, T, T)
// regions: the probabilities, recomputed, then their gradient.
void attention_backward(float* dqkv, const float* dout, const float* qkv, float* scratch, int B,
                        int T, int C, int NH);

}  // namespace plain_c

#endif  // REMAT_EXAMPLES_PLAIN_C_GPT2_KERNELS_H_
