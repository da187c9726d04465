// A loop with its own kernels, linked against the core alone: a residual tanh stack
// h[l+1] = h[l] + tanh(h[l] W[l]) trained by SGD on 0.5 |h[L]|^2, run twice on the same
// kernels: once on plain buffers, once through remat's runtime under DTR at 0.5 of the bytes
// its tensors need at once unconstrained (or the fraction given as its argument). The backward
// kernel writes the activation gradient and adds into the weight gradient in one op
// (Runtime::call_accumulate). It prints and checks that the runtime evicted and recomputed, and
// that the losses and final weights equal the plain run's bit for bit. Exits 0 when both hold.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "remat/errors.h"
#include "remat/runtime.h"

namespace {

constexpr int kLayers = 16, kSteps = 4;
constexpr std::int64_t kBatch = 512, kWidth = 32;
constexpr float kLr = 1e-3f;
using Buffer = std::vector<float>;

// The loop's own kernels, as a C loop has them. Row-major: h (B, C), w (C, C).
void layer_forward(float* out, const float* h, const float* w, std::int64_t b, std::int64_t c) {
  for (std::int64_t i = 0; i < b; ++i)
    for (std::int64_t j = 0; j < c; ++j) {
      float a = 0.0f;
      for (std::int64_t k = 0; k < c; ++k) a += h[i * c + k] * w[k * c + j];
      out[i * c + j] = h[i * c + j] + std::tanh(a);
    }
}
// dh_in = dh_out + (dh_out * (1 - t^2)) w^T and dw += h^T (dh_out * (1 - t^2)), t recomputed.
void layer_backward(float* dh_in, float* dw, const float* dh_out, const float* h, const float* w,
                    std::int64_t b, std::int64_t c) {
  Buffer da(static_cast<std::size_t>(b * c));
  for (std::int64_t i = 0; i < b; ++i)
    for (std::int64_t j = 0; j < c; ++j) {
      float a = 0.0f;
      for (std::int64_t k = 0; k < c; ++k) a += h[i * c + k] * w[k * c + j];
      const float t = std::tanh(a);
      da[i * c + j] = dh_out[i * c + j] * (1.0f - t * t);
    }
  for (std::int64_t i = 0; i < b; ++i)
    for (std::int64_t k = 0; k < c; ++k) {
      float s = dh_out[i * c + k];
      for (std::int64_t j = 0; j < c; ++j) s += da[i * c + j] * w[k * c + j];
      dh_in[i * c + k] = s;
    }
  for (std::int64_t k = 0; k < c; ++k)
    for (std::int64_t j = 0; j < c; ++j)
      for (std::int64_t i = 0; i < b; ++i) dw[k * c + j] += h[i * c + k] * da[i * c + j];
}
float half_square(const float* h, std::int64_t n) {
  float s = 0.0f;
  for (std::int64_t i = 0; i < n; ++i) s += 0.5f * h[i] * h[i];
  return s;
}
void sgd(float* w, float* dw, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    w[i] -= kLr * dw[i];
    dw[i] = 0.0f;
  }
}

Buffer initial(std::uint32_t seed, std::int64_t n, float scale) {
  Buffer v(static_cast<std::size_t>(n));
  for (float& x : v) {
    seed = seed * 1664525u + 1013904223u;
    x = scale * (static_cast<float>(seed >> 8) / 16777216.0f - 0.5f);
  }
  return v;
}

struct Result {
  std::vector<float> losses;
  std::vector<Buffer> weights;
};

Result plain_loop() {
  Result r;
  std::vector<Buffer> dw(kLayers, Buffer(kWidth * kWidth, 0.0f));
  for (int l = 0; l < kLayers; ++l) r.weights.push_back(initial(l + 1, kWidth * kWidth, 0.4f));
  for (int step = 0; step < kSteps; ++step) {
    std::vector<Buffer> h{initial(100 + step, kBatch * kWidth, 2.0f)};
    for (int l = 0; l < kLayers; ++l) {
      h.emplace_back(kBatch * kWidth);
      layer_forward(h.back().data(), h[l].data(), r.weights[l].data(), kBatch, kWidth);
    }
    r.losses.push_back(half_square(h.back().data(), kBatch * kWidth));
    Buffer dh = h.back(), next(dh.size());
    for (int l = kLayers - 1; l >= 0; --l) {
      layer_backward(next.data(), dw[l].data(), dh.data(), h[l].data(), r.weights[l].data(), kBatch,
                     kWidth);
      dh.swap(next);
    }
    for (int l = 0; l < kLayers; ++l) sgd(r.weights[l].data(), dw[l].data(), kWidth * kWidth);
  }
  return r;
}

std::int64_t dim(const remat::TensorSpec& s, int i) { return s.shape[static_cast<std::size_t>(i)]; }

remat::OpPtr forward_op() {
  return remat::make_op(
      "layer_forward", [](remat::SpecList in) { return remat::Outputs{{in[0]}}; },
      [](const remat::KernelContext& k) {
        layer_forward(k.output<float>(0), k.input<float>(0), k.input<float>(1),
                      dim(k.input_spec(0), 0), dim(k.input_spec(0), 1));
      });
}
// Inputs dh_out, h, w, dw; output dh_in, and the kernel's output 1 is dw (accumulated).
remat::OpPtr backward_op() {
  return remat::make_op(
      "layer_backward", [](remat::SpecList in) { return remat::Outputs{{in[0]}}; },
      [](const remat::KernelContext& k) {
        layer_backward(k.output<float>(0), k.output<float>(1), k.input<float>(0), k.input<float>(1),
                       k.input<float>(2), dim(k.input_spec(0), 0), dim(k.input_spec(0), 1));
      });
}
remat::OpPtr sgd_op() {
  return remat::make_op(
      "sgd", [](remat::SpecList) { return remat::Outputs{}; },
      [](const remat::KernelContext& k) {
        sgd(k.output<float>(0), k.output<float>(1), k.output_spec(0).numel());
      });
}

Result remat_loop(remat::Runtime& rt) {
  const remat::TensorSpec square{{kWidth, kWidth}}, batch{{kBatch, kWidth}};
  std::vector<remat::Tensor> w, dw;
  const Buffer zero(kWidth * kWidth, 0.0f);
  for (int l = 0; l < kLayers; ++l) {
    w.push_back(rt.constant(square, initial(l + 1, kWidth * kWidth, 0.4f).data()));
    dw.push_back(rt.constant(square, zero.data()));
  }
  Result r;
  for (int step = 0; step < kSteps; ++step) {
    const Buffer x = initial(100 + step, kBatch * kWidth, 2.0f);
    std::vector<remat::Tensor> h{rt.constant(batch, x.data())};
    for (int l = 0; l < kLayers; ++l) h.push_back(rt.call1(forward_op(), {h[l], w[l]}));
    Buffer top(kBatch * kWidth);
    rt.read(h.back(), top.data());
    r.losses.push_back(half_square(top.data(), kBatch * kWidth));
    remat::Tensor dh = h.back();
    const int accumulated[] = {3};
    for (int l = kLayers - 1; l >= 0; --l) {
      const remat::Tensor args[] = {dh, h[l], w[l], dw[l]};
      dh = rt.call_accumulate(backward_op(), args, accumulated).at(0);
      h.pop_back();  // the loop's own lifetimes: nothing reads h[l + 1] again
    }
    for (int l = 0; l < kLayers; ++l) rt.update(sgd_op(), {w[l], dw[l]}, {0, 1});
  }
  for (const remat::Tensor& t : w) {
    r.weights.emplace_back(kWidth * kWidth);
    rt.read(t, r.weights.back().data());
  }
  return r;
}

bool same_bits(const Result& a, const Result& b) {
  if (a.losses.size() != b.losses.size() || a.weights.size() != b.weights.size()) return false;
  if (std::memcmp(a.losses.data(), b.losses.data(), a.losses.size() * sizeof(float)) != 0)
    return false;
  for (std::size_t i = 0; i < a.weights.size(); ++i)
    if (std::memcmp(a.weights[i].data(), b.weights[i].data(), a.weights[i].size() * 4) != 0)
      return false;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const double fraction = argc > 1 ? std::atof(argv[1]) : 0.5;
  const Result plain = plain_loop();
  std::size_t peak = 0;
  {
    remat::Runtime rt({.backend = remat::Backend::kCpu, .budget = std::size_t{1} << 30});
    remat_loop(rt);
    // Allocated, not reserved: without a budget the allocator rounds up to whole segments.
    peak = rt.stats().memory.peak_allocated;
  }
  const auto budget = static_cast<std::size_t>(fraction * static_cast<double>(peak));
  remat::Runtime rt({.backend = remat::Backend::kCpu, .budget = budget, .policy = "dtr"});
  Result constrained;
  try {
    constrained = remat_loop(rt);
  } catch (const remat::OutOfMemoryError& e) {
    std::printf("out of memory at %.2f of the peak: %s\n", fraction, e.what());
    return 1;
  }
  const remat::RuntimeStats s = rt.stats();
  const bool bitwise = same_bits(plain, constrained);
  std::printf("core only: peak %zu B, budget %zu B (%.2f); %s\n", peak, budget, fraction,
              s.summary().c_str());
  std::printf("losses and weights match the plain loop bit for bit: %s\n", bitwise ? "yes" : "no");
  return bitwise && s.recomputations > 0 && s.memory.peak_reserved <= budget ? 0 : 1;
}
