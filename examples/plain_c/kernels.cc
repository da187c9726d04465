#include "examples/plain_c/kernels.h"

#include <cmath>

namespace plain_c {

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int B,
                    int C, int OC) {
  for (int b = 0; b < B; ++b) {
    const float* x = inp + static_cast<std::size_t>(b) * C;
    for (int o = 0; o < OC; ++o) {
      const float* w = weight + static_cast<std::size_t>(o) * C;
      float acc = bias[o];
      for (int c = 0; c < C; ++c) acc += x[c] * w[c];
      out[static_cast<std::size_t>(b) * OC + o] = acc;
    }
  }
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int B, int C, int OC) {
  for (int b = 0; b < B; ++b) {
    float* dx = dinp + static_cast<std::size_t>(b) * C;
    for (int c = 0; c < C; ++c) dx[c] = 0.0f;
    for (int o = 0; o < OC; ++o) {
      const float g = dout[static_cast<std::size_t>(b) * OC + o];
      const float* w = weight + static_cast<std::size_t>(o) * C;
      for (int c = 0; c < C; ++c) dx[c] += g * w[c];
    }
  }
  for (int o = 0; o < OC; ++o) {
    float* dw = dweight + static_cast<std::size_t>(o) * C;
    for (int b = 0; b < B; ++b) {
      const float g = dout[static_cast<std::size_t>(b) * OC + o];
      const float* x = inp + static_cast<std::size_t>(b) * C;
      for (int c = 0; c < C; ++c) dw[c] += g * x[c];
      dbias[o] += g;
    }
  }
}

// GELU with the tanh approximation.
void gelu_forward(float* out, const float* inp, int N) {
  const float s = std::sqrt(2.0f / 3.14159265358979f);
  for (int i = 0; i < N; ++i) {
    const float x = inp[i];
    out[i] = 0.5f * x * (1.0f + std::tanh(s * (x + 0.044715f * x * x * x)));
  }
}

void gelu_backward(float* dinp, const float* inp, const float* dout, int N) {
  const float s = std::sqrt(2.0f / 3.14159265358979f);
  for (int i = 0; i < N; ++i) {
    const float x = inp[i];
    const float u = s * (x + 0.044715f * x * x * x);
    const float t = std::tanh(u);
    const float du = s * (1.0f + 3.0f * 0.044715f * x * x);
    const float grad = 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
    dinp[i] = grad * dout[i];
  }
}

void add_forward(float* out, const float* a, const float* b, int N) {
  for (int i = 0; i < N; ++i) out[i] = a[i] + b[i];
}

void crossentropy_forward(float* loss, float* probs, const float* logits, const int32_t* targets,
                          int B, int V) {
  double total = 0;
  for (int b = 0; b < B; ++b) {
    const float* z = logits + static_cast<std::size_t>(b) * V;
    float* p = probs + static_cast<std::size_t>(b) * V;
    float max = z[0];
    for (int v = 1; v < V; ++v) max = std::fmax(max, z[v]);
    float sum = 0;
    for (int v = 0; v < V; ++v) {
      p[v] = std::exp(z[v] - max);
      sum += p[v];
    }
    for (int v = 0; v < V; ++v) p[v] /= sum;
    total -= std::log(p[targets[b]]);
  }
  loss[0] = static_cast<float>(total / B);
}

void crossentropy_backward(float* dlogits, const float* probs, const int32_t* targets, int B,
                           int V) {
  for (int b = 0; b < B; ++b)
    for (int v = 0; v < V; ++v) {
      const std::size_t i = static_cast<std::size_t>(b) * V + v;
      dlogits[i] = (probs[i] - (v == targets[b] ? 1.0f : 0.0f)) / static_cast<float>(B);
    }
}

void zero(float* p, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) p[i] = 0.0f;
}

void adamw(float* param, const float* grad, float* m, float* v, std::size_t n, float lr, int t) {
  const float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, decay = 0.01f;
  const float c1 = 1.0f - std::pow(beta1, static_cast<float>(t));
  const float c2 = 1.0f - std::pow(beta2, static_cast<float>(t));
  for (std::size_t i = 0; i < n; ++i) {
    m[i] = beta1 * m[i] + (1.0f - beta1) * grad[i];
    v[i] = beta2 * v[i] + (1.0f - beta2) * grad[i] * grad[i];
    const float mhat = m[i] / c1, vhat = v[i] / c2;
    param[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + decay * param[i]);
  }
}

}  // namespace plain_c
