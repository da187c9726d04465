#include "examples/plain_c/gpt2_kernels.h"

#include <cmath>

namespace plain_c {
namespace {

using std::size_t;

size_t at(int i, int stride) { return static_cast<size_t>(i) * static_cast<size_t>(stride); }

// Row t of head h's (T, T) probabilities, in a (B, NH, T, T) region.
float* att_row(float* region, int b, int h, int t, int T, int NH) {
  return region + (at(b, NH) + static_cast<size_t>(h)) * at(T, T) + at(t, T);
}

// The attention probabilities of every (b, h, t), as attention_forward defines them. The
// forward and the backward both call this, so the backward's recomputation gives the bits
// the forward used.
void attention_probabilities(float* att, const float* qkv, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        const float* q = qkv + at(b * T + t, 3 * C) + at(h, hs);
        float* row = att_row(att, b, h, t, T, NH);
        float max = -INFINITY;
        for (int t2 = 0; t2 <= t; ++t2) {
          const float* k = qkv + at(b * T + t2, 3 * C) + static_cast<size_t>(C) + at(h, hs);
          float dot = 0;
          for (int i = 0; i < hs; ++i) dot += q[i] * k[i];
          row[t2] = dot * scale;
          max = std::fmax(max, row[t2]);
        }
        float sum = 0;
        for (int t2 = 0; t2 <= t; ++t2) {
          row[t2] = std::exp(row[t2] - max);
          sum += row[t2];
        }
        const float inv = 1.0f / sum;
        for (int t2 = 0; t2 <= t; ++t2) row[t2] *= inv;
        // The masked future is written too, so that every byte of the region is defined.
        for (int t2 = t + 1; t2 < T; ++t2) row[t2] = 0.0f;
      }
}

}  // namespace

void encoder_forward(float* out, const std::int32_t* tokens, const float* wte, const float* wpe,
                     int B, int T, int C) {
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      float* o = out + at(b * T + t, C);
      const float* e = wte + at(tokens[b * T + t], C);
      const float* p = wpe + at(t, C);
      for (int c = 0; c < C; ++c) o[c] = e[c] + p[c];
    }
}

void encoder_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens,
                      int B, int T, int C) {
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      const float* d = dout + at(b * T + t, C);
      float* de = dwte + at(tokens[b * T + t], C);
      float* dp = dwpe + at(t, C);
      for (int c = 0; c < C; ++c) {
        de[c] += d[c];
        dp[c] += d[c];
      }
    }
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C) {
  const float eps = 1e-5f;
  for (int n = 0; n < N; ++n) {
    const float* x = inp + at(n, C);
    float m = 0;
    for (int c = 0; c < C; ++c) m += x[c];
    m /= static_cast<float>(C);
    float var = 0;
    for (int c = 0; c < C; ++c) var += (x[c] - m) * (x[c] - m);
    var /= static_cast<float>(C);
    const float s = 1.0f / std::sqrt(var + eps);
    float* o = out + at(n, C);
    for (int c = 0; c < C; ++c) o[c] = (x[c] - m) * s * weight[c] + bias[c];
    mean[n] = m;
    rstd[n] = s;
  }
}

// With xhat = (x - mean) * rstd and g = weight * dout, the gradient through the row's mean
// and variance is dx = (g - mean(g) - xhat * mean(g * xhat)) * rstd.
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C) {
  for (int n = 0; n < N; ++n) {
    const float* x = inp + at(n, C);
    const float* d = dout + at(n, C);
    const float m = mean[n], s = rstd[n];
    float g_mean = 0, gx_mean = 0;
    for (int c = 0; c < C; ++c) {
      const float g = weight[c] * d[c];
      g_mean += g;
      gx_mean += g * (x[c] - m) * s;
    }
    g_mean /= static_cast<float>(C);
    gx_mean /= static_cast<float>(C);
    float* dx = dinp + at(n, C);
    for (int c = 0; c < C; ++c) {
      const float xhat = (x[c] - m) * s;
      dx[c] = (weight[c] * d[c] - g_mean - xhat * gx_mean) * s;
      dweight[c] += d[c] * xhat;
      dbias[c] += d[c];
    }
  }
}

void attention_forward(float* out, const float* qkv, float* scratch_att, int B, int T, int C,
                       int NH) {
  const int hs = C / NH;
  attention_probabilities(scratch_att, qkv, B, T, C, NH);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < NH; ++h) {
        const float* row = att_row(scratch_att, b, h, t, T, NH);
        float* o = out + at(b * T + t, C) + at(h, hs);
        for (int i = 0; i < hs; ++i) o[i] = 0.0f;
        for (int t2 = 0; t2 <= t; ++t2) {
          const float* v = qkv + at(b * T + t2, 3 * C) + at(2, C) + at(h, hs);
          for (int i = 0; i < hs; ++i) o[i] += row[t2] * v[i];
        }
      }
}

namespace {

// One (b, h, t) row of attention_backward: `row` the probabilities, `drow` their gradient's
// region, `d` this position's dout for head h. Adds into dqkv's q, k and v of the head.
void attention_backward_row(float* dqkv, const float* qkv, const float* row, float* drow,
                            const float* d, int b, int h, int t, int T, int C, int NH) {
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  // Head h's queries at position `pos` of qkv or dqkv; its keys and values follow C and 2C on.
  auto head_at = [&](auto* base, int pos) { return base + at(b * T + pos, 3 * C) + at(h, hs); };
  // out = att . v: the gradient of the probabilities, and of the values.
  for (int t2 = 0; t2 <= t; ++t2) {
    const float* v = head_at(qkv, t2) + at(2, C);
    float* dv = head_at(dqkv, t2) + at(2, C);
    float acc = 0;
    for (int i = 0; i < hs; ++i) {
      acc += d[i] * v[i];
      dv[i] += row[t2] * d[i];
    }
    drow[t2] = acc;
  }
  // Through the softmax: dpre[t2] = att[t2] * (datt[t2] - sum_t3 att[t3] * datt[t3]),
  // written over datt.
  float dot = 0;
  for (int t2 = 0; t2 <= t; ++t2) dot += row[t2] * drow[t2];
  for (int t2 = 0; t2 <= t; ++t2) drow[t2] = row[t2] * (drow[t2] - dot);
  for (int t2 = t + 1; t2 < T; ++t2) drow[t2] = 0.0f;
  // pre[t2] = scale * q . k[t2]: the gradient of the query and of the keys.
  const float* q = head_at(qkv, t);
  float* dq = head_at(dqkv, t);
  for (int t2 = 0; t2 <= t; ++t2) {
    const float* k = head_at(qkv, t2) + static_cast<size_t>(C);
    float* dk = head_at(dqkv, t2) + static_cast<size_t>(C);
    const float g = drow[t2] * scale;
    for (int i = 0; i < hs; ++i) {
      dq[i] += g * k[i];
      dk[i] += g * q[i];
    }
  }
}

}  // namespace

void attention_backward(float* dqkv, const float* dout, const float* qkv, float* scratch, int B,
                        int T, int C, int NH) {
  const int hs = C / NH;
  float* att = scratch;
  float* datt = scratch + attention_region_floats(B, T, NH);
  attention_probabilities(att, qkv, B, T, C, NH);
  const size_t n = at(B * T, 3 * C);
  for (size_t i = 0; i < n; ++i) dqkv[i] = 0.0f;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t)
        attention_backward_row(dqkv, qkv, att_row(att, b, h, t, T, NH),
                               att_row(datt, b, h, t, T, NH), dout + at(b * T + t, C) + at(h, hs),
                               b, h, t, T, C, NH);
}

}  // namespace plain_c
