// The plain-C GPT-2 loop (gpt2_kernels.h, gpt2_model.h): every backward kernel it runs
// agrees with central differences of its forward, attention is causal, and the loop moved
// into remat trains to the bits of the loop on its own buffers under DTR at 0.5 and 0.35 of
// its unconstrained peak, with AdamW's moments on the host too.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "examples/plain_c/gpt2_kernels.h"
#include "examples/plain_c/gpt2_model.h"
#include "examples/plain_c/kernels.h"
#include "remat/step_driver.h"

namespace plain_c {
namespace {

using Floats = std::vector<float>;

// Tiny sizes, so that every input element gets its own pair of forward runs.
constexpr int B = 2, T = 4, C = 8, NH = 2, V = 16, BT = B * T;

std::size_t size(int n) { return static_cast<std::size_t>(n); }

// Uniform in [-1, 1) from a linear congruential sequence: fixed test data.
Floats filled(std::size_t n, std::uint32_t seed) {
  Floats v(n);
  std::uint32_t s = seed * 2654435761u + 1;
  for (float& x : v) {
    s = s * 1664525u + 1013904223u;
    x = static_cast<float>(s >> 8) / static_cast<float>(1u << 23) - 1.0f;
  }
  return v;
}

// sum_i w[i] * out[i] in double: the scalar each forward is differentiated through. Its
// gradient in out is w, the dout every backward below is given.
double weighted(const Floats& out, const Floats& w) {
  double s = 0;
  for (std::size_t i = 0; i < out.size(); ++i)
    s += static_cast<double>(out[i]) * static_cast<double>(w[i]);
  return s;
}

// Checks `analytic`, the gradient of `loss` in `x` a backward kernel gave, against central
// differences of the float forward, summed in double. The step of 1e-2 balances the two
// errors of the differences: float rounding in the forward (about 1e-7 of each output,
// divided by the step) and truncation (the step squared times a third derivative of order
// 1); at these sizes both stay under 5e-5, and the tolerance, 1e-4 and 0.1% of the gradient,
// catches a gradient 1% off. The difference is taken over the step the float inputs really
// moved by.
void expect_gradient(Floats& x, const Floats& analytic, const std::function<double()>& loss,
                     const std::string& what) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  constexpr float kStep = 1e-2f;
  double largest = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float saved = x[i];
    const float up = saved + kStep, down = saved - kStep;
    x[i] = up;
    const double f_up = loss();
    x[i] = down;
    const double f_down = loss();
    x[i] = saved;
    const double numeric = (f_up - f_down) / (static_cast<double>(up) - down);
    const double a = analytic[i];
    EXPECT_NEAR(a, numeric, 1e-4 + 1e-3 * std::fabs(numeric)) << what << " element " << i;
    largest = std::fmax(largest, std::fabs(a));
  }
  // A gradient of zeros would pass nothing above unless the loss were flat too.
  EXPECT_GT(largest, 1e-2) << what << ": the check compared only near-zero gradients";
}

// What an accumulating backward added: its target started at kStart.
constexpr float kStart = 0.25f;
Floats added(const Floats& target) {
  Floats d = target;
  for (float& x : d) x -= kStart;
  return d;
}

TEST(Gpt2KernelsTest, EncoderBackwardAddsTheEmbeddingGradients) {
  std::vector<std::int32_t> tokens(size(BT));
  for (int i = 0; i < BT; ++i) tokens[size(i)] = (5 * i + 3) % V;
  tokens[3] = tokens[1];  // one token twice, so that its gradient sums two positions
  Floats wte = filled(size(V * C), 1), wpe = filled(size(T * C), 2), w = filled(size(BT * C), 3);
  Floats out(w.size());
  auto loss = [&] {
    encoder_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
    return weighted(out, w);
  };
  Floats dwte(wte.size(), kStart), dwpe(wpe.size(), kStart);
  encoder_backward(dwte.data(), dwpe.data(), w.data(), tokens.data(), B, T, C);
  expect_gradient(wte, added(dwte), loss, "dwte");
  expect_gradient(wpe, added(dwpe), loss, "dwpe");
}

TEST(Gpt2KernelsTest, LayernormBackwardMatchesDifferences) {
  Floats inp = filled(size(BT * C), 4), weight = filled(size(C), 5), bias = filled(size(C), 6);
  const Floats w = filled(inp.size(), 7);
  Floats out(inp.size()), mean(size(BT)), rstd(size(BT));
  auto loss = [&] {
    layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(),
                      BT, C);
    return weighted(out, w);
  };
  loss();
  Floats dinp(inp.size(), NAN), dweight(size(C), kStart), dbias(size(C), kStart);
  layernorm_backward(dinp.data(), dweight.data(), dbias.data(), w.data(), inp.data(), weight.data(),
                     mean.data(), rstd.data(), BT, C);
  expect_gradient(inp, dinp, loss, "dinp");
  expect_gradient(weight, added(dweight), loss, "dweight");
  expect_gradient(bias, added(dbias), loss, "dbias");
}

TEST(Gpt2KernelsTest, LayernormNormalizesEachRow) {
  const Floats inp = filled(size(BT * C), 8), ones(size(C), 1.0f), zeros(size(C), 0.0f);
  Floats out(inp.size()), mean(size(BT)), rstd(size(BT));
  layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), ones.data(), zeros.data(), BT,
                    C);
  for (int n = 0; n < BT; ++n) {
    double m = 0, sq = 0;
    for (int c = 0; c < C; ++c) m += out[size(n * C + c)];
    for (int c = 0; c < C; ++c) sq += out[size(n * C + c)] * out[size(n * C + c)];
    EXPECT_NEAR(m / C, 0.0, 1e-6) << "row " << n;
    EXPECT_NEAR(sq / C, 1.0, 1e-3) << "row " << n;  // 1e-5 of eps in the variance
  }
}

// attention_forward against the definition, in double: softmax over the past only.
TEST(Gpt2KernelsTest, AttentionIsCausalSoftmaxOverThePast) {
  const Floats qkv = filled(size(BT * 3 * C), 9);
  Floats out(size(BT * C)), att(attention_region_floats(B, T, NH), NAN);
  attention_forward(out.data(), qkv.data(), att.data(), B, T, C, NH);
  const int hs = C / NH;
  auto at = [&](int b, int t, int part, int h, int i) {
    return static_cast<double>(qkv[size((b * T + t) * 3 * C + part * C + h * hs + i)]);
  };
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        std::vector<double> p(size(t + 1));
        double sum = 0;
        for (int t2 = 0; t2 <= t; ++t2) {
          double dot = 0;
          for (int i = 0; i < hs; ++i) dot += at(b, t, 0, h, i) * at(b, t2, 1, h, i);
          p[size(t2)] = std::exp(dot / std::sqrt(static_cast<double>(hs)));
          sum += p[size(t2)];
        }
        const float* row = att.data() + size(((b * NH + h) * T + t) * T);
        for (int t2 = 0; t2 < T; ++t2)
          EXPECT_NEAR(row[t2], t2 <= t ? p[size(t2)] / sum : 0.0, 1e-6);
        for (int i = 0; i < hs; ++i) {
          double o = 0;
          for (int t2 = 0; t2 <= t; ++t2) o += p[size(t2)] / sum * at(b, t2, 2, h, i);
          EXPECT_NEAR(out[size((b * T + t) * C + h * hs + i)], o, 1e-5);
        }
      }
}

TEST(Gpt2KernelsTest, AttentionBackwardMatchesDifferences) {
  Floats qkv = filled(size(BT * 3 * C), 10);
  const Floats w = filled(size(BT * C), 11);
  Floats out(w.size()), att(attention_region_floats(B, T, NH));
  auto loss = [&] {
    attention_forward(out.data(), qkv.data(), att.data(), B, T, C, NH);
    return weighted(out, w);
  };
  // Garbage in the output and the scratch: the kernel must write both before reading them.
  Floats dqkv(qkv.size(), 123.0f), scratch(2 * att.size(), NAN);
  attention_backward(dqkv.data(), w.data(), qkv.data(), scratch.data(), B, T, C, NH);
  expect_gradient(qkv, dqkv, loss, "dqkv");
}

TEST(Gpt2KernelsTest, RowwiseKernelsOverBTRowsMatchDifferences) {
  Floats inp = filled(size(BT * C), 12), weight = filled(size(V * C), 13),
         bias = filled(size(V), 14);
  const Floats w = filled(size(BT * V), 15);
  Floats out(w.size());
  auto matmul = [&] {
    matmul_forward(out.data(), inp.data(), weight.data(), bias.data(), BT, C, V);
    return weighted(out, w);
  };
  Floats dinp(inp.size(), NAN), dweight(weight.size(), kStart), dbias(bias.size(), kStart);
  matmul_backward(dinp.data(), dweight.data(), dbias.data(), w.data(), inp.data(), weight.data(),
                  BT, C, V);
  expect_gradient(inp, dinp, matmul, "matmul dinp");
  expect_gradient(weight, added(dweight), matmul, "matmul dweight");
  expect_gradient(bias, added(dbias), matmul, "matmul dbias");

  Floats x = filled(size(BT * C), 16), gelu(x.size()), dx(x.size());
  const Floats wg = filled(x.size(), 17);
  auto gelu_loss = [&] {
    gelu_forward(gelu.data(), x.data(), BT * C);
    return weighted(gelu, wg);
  };
  gelu_backward(dx.data(), x.data(), wg.data(), BT * C);
  expect_gradient(x, dx, gelu_loss, "gelu");

  Floats logits = filled(size(BT * V), 18), probs(logits.size()), ce(1), dlogits(logits.size());
  for (float& z : logits) z *= 3;  // away from uniform, so the gradient is not tiny
  std::vector<std::int32_t> targets(size(BT));
  for (int i = 0; i < BT; ++i) targets[size(i)] = (7 * i + 1) % V;
  auto ce_loss = [&] {
    crossentropy_forward(ce.data(), probs.data(), logits.data(), targets.data(), BT, V);
    return static_cast<double>(ce[0]);
  };
  ce_loss();
  crossentropy_backward(dlogits.data(), probs.data(), targets.data(), BT, V);
  expect_gradient(logits, dlogits, ce_loss, "crossentropy");
}

// ---------------------------------------------------------------------------------------
// The loop through remat

constexpr int kSteps = 3;

// Many rows and few channels: the activations are most of the peak, as in a real model,
// so that 0.35 of it leaves room for them after the constants. (At B 2, T 32, C 64 the
// parameters, gradients and moments alone are nearly half the peak: 0.35 of it does not
// hold them, and 0.5 leaves no room for the fc activations.)
Gpt2Config small_config() {
  Gpt2Config c;
  c.batch = 16;
  c.seq = 32;
  c.layers = 4;
  c.channels = 32;
  c.heads = 2;
  c.vocab = 128;
  return c;
}

bool same_bits(const Floats& a, const Floats& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Trained once for every test below: the bits they all compare against.
const Gpt2ReferenceLoop& reference() {
  static const Gpt2ReferenceLoop loop = [] {
    Gpt2ReferenceLoop r(small_config());
    for (int s = 0; s < kSteps; ++s) r.step(s);
    return r;
  }();
  return loop;
}

// Runs `loop` under DTR at `fraction` of its unconstrained peak (measured with `runtime`'s
// host memory), with the debugging checks on, and checks the bits and the budget, and that
// `offloaded_moments` moments are on the host at the end.
remat::RuntimeStats train_and_compare(Gpt2RematLoop& loop, double fraction,
                                      remat::RuntimeOptions runtime,
                                      std::size_t offloaded_moments) {
  const std::size_t peak = remat::measure_unconstrained_peak(loop, runtime, kSteps);
  remat::StepDriverOptions options;
  options.runtime = runtime;
  options.runtime.budget = static_cast<std::size_t>(fraction * static_cast<double>(peak));
  options.runtime.poison_outputs = true;  // kernels must write every output byte
  options.runtime.check_inputs = true;    // and never write an input
  options.policy = "dtr";
  remat::StepDriver driver(loop, options);
  for (int s = 0; s < kSteps; ++s) driver.run(s);
  const remat::RuntimeStats stats = driver.runtime().stats();
  EXPECT_LE(stats.memory.peak_reserved, options.runtime.budget);
  EXPECT_GT(stats.evictions, 0u);
  EXPECT_TRUE(same_bits(Gpt2RematLoop::losses(driver.state()), reference().losses()));
  const auto params = Gpt2RematLoop::parameters(driver.runtime(), driver.state());
  EXPECT_EQ(params.size(), reference().parameters().size());
  for (std::size_t i = 0; i < params.size() && i < reference().parameters().size(); ++i)
    EXPECT_TRUE(same_bits(params[i], reference().parameters()[i])) << "parameter " << i;
  EXPECT_EQ(Gpt2RematLoop::offloaded_moments(driver.runtime(), driver.state()), offloaded_moments);
  return stats;
}

TEST(Gpt2RematTest, DtrTrainsToTheReferenceBitsUnderHalfAndAThirdOfThePeak) {
  const Floats& losses = reference().losses();
  ASSERT_EQ(losses.size(), size(kSteps));
  EXPECT_LT(losses.back(), losses.front()) << "the reference loop does not learn";
  for (const double fraction : {0.5, 0.35}) {
    SCOPED_TRACE("dtr at " + std::to_string(fraction));
    Gpt2RematLoop loop(small_config());
    const remat::RuntimeStats stats = train_and_compare(loop, fraction, {}, 0);
    EXPECT_GT(stats.recomputations, 0u);
    EXPECT_EQ(stats.offloads, 0u);  // no host memory given
  }
}

TEST(Gpt2RematTest, MomentsOnTheHostTrainToTheReferenceBits) {
  Gpt2Config config = small_config();
  config.moments_on_host = true;
  Gpt2RematLoop loop(config);
  remat::RuntimeOptions runtime;
  runtime.host_memory_bytes = 2 * loop.moment_bytes();
  // Every moment goes out at the start and after each of its updates, and comes back for
  // each update: all of them are on the host at the end.
  const std::size_t moments = 2 * gpt2_parameter_shapes(config).size();
  const remat::RuntimeStats stats = train_and_compare(loop, 0.5, runtime, moments);
  EXPECT_GE(stats.offloads, moments * (kSteps + 1));
  EXPECT_GE(stats.restores, moments * kSteps);
}

}  // namespace
}  // namespace plain_c
