// Tests for the raw CPU kernels: finite-difference checks of every backward against its forward
// (on L = sum(forward_output * R) for a fixed random R, so the upstream gradient is R),
// reference checks against naive implementations, and bitwise determinism.
#include "kernels/cpu/cpu_kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <numbers>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/philox.h"

namespace remat::kernels::cpu {
namespace {

using Vec = std::vector<float>;

Vec random_vec(std::size_t n, std::uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  Vec v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

double dot(const Vec& a, const Vec& b) {
  double s = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

bool bitwise_equal(const Vec& a, const Vec& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Compares `grad` with central differences of loss() w.r.t. each element of x (perturbed in
// place and restored).
void expect_grad_matches(const std::string& what, Vec& x, const Vec& grad,
                         const std::function<double()>& loss, float h = 1e-2f, double rtol = 1e-2,
                         double atol = 2e-3) {
  ASSERT_EQ(x.size(), grad.size()) << what;
  int failures = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float orig = x[i];
    const float hi = orig + h;
    const float lo = orig - h;
    x[i] = hi;
    const double lp = loss();
    x[i] = lo;
    const double lm = loss();
    x[i] = orig;
    const double num = (lp - lm) / (static_cast<double>(hi) - static_cast<double>(lo));
    const double ana = grad[i];
    const double tol = atol + rtol * std::max(std::abs(num), std::abs(ana));
    if (!(std::abs(num - ana) <= tol)) {
      ADD_FAILURE() << what << "[" << i << "]: analytic " << ana << " vs numeric " << num;
      if (++failures >= 5) return;
    }
  }
}

void expect_near(const std::string& what, const Vec& got, const std::vector<double>& want,
                 double tol) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], tol * std::max(1.0, std::abs(want[i]))) << what << "[" << i << "]";
  }
}

// ---------------------------------------------------------------------------------------------
// GEMM

std::vector<double> naive_gemm(bool ta, bool tb, i64 m, i64 n, i64 k, float alpha, const Vec& a,
                               const Vec& b, float beta, const Vec& c) {
  std::vector<double> out(static_cast<std::size_t>(m * n));
  for (i64 i = 0; i < m; ++i) {
    for (i64 j = 0; j < n; ++j) {
      double s = 0.0;
      for (i64 p = 0; p < k; ++p) {
        const double av = ta ? a[p * m + i] : a[i * k + p];
        const double bv = tb ? b[j * k + p] : b[p * n + j];
        s += av * bv;
      }
      out[i * n + j] = alpha * s + static_cast<double>(beta) * c[i * n + j];
    }
  }
  return out;
}

TEST(CpuKernelsTest, GemmMatchesNaiveTripleLoop) {
  struct Size {
    i64 m, n, k;
  };
  for (const Size s : {Size{5, 7, 3}, Size{33, 17, 29}, Size{1, 64, 9}}) {
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        const Vec a = random_vec(s.m * s.k, 1);
        const Vec b = random_vec(s.k * s.n, 2);
        const Vec c0 = random_vec(s.m * s.n, 3);
        Vec c = c0;
        gemm(ta, tb, s.m, s.n, s.k, 0.7f, a.data(), b.data(), 0.3f, c.data());
        expect_near("gemm", c, naive_gemm(ta, tb, s.m, s.n, s.k, 0.7f, a, b, 0.3f, c0), 1e-5);
        // beta == 0 overwrites C, whatever it held (NaN included).
        Vec c2(s.m * s.n, std::numeric_limits<float>::quiet_NaN());
        gemm(ta, tb, s.m, s.n, s.k, 1.0f, a.data(), b.data(), 0.0f, c2.data());
        expect_near("gemm beta=0", c2, naive_gemm(ta, tb, s.m, s.n, s.k, 1.0f, a, b, 0.0f, c0),
                    1e-5);
      }
    }
  }
}

TEST(CpuKernelsTest, GemmGradients) {
  const i64 m = 3, n = 4, k = 5;
  for (int tai = 0; tai < 2; ++tai) {
    for (int tbi = 0; tbi < 2; ++tbi) {
      const bool ta = tai, tb = tbi;
      Vec a = random_vec(m * k, 10), b = random_vec(k * n, 11);
      const Vec r = random_vec(m * n, 12);
      auto loss = [&] {
        Vec c(m * n);
        gemm(ta, tb, m, n, k, 1.0f, a.data(), b.data(), 0.0f, c.data());
        return dot(c, r);
      };
      // dop(A) = R op(B)^T (M x K), dop(B) = op(A)^T R (K x N), stored like A and B.
      Vec da(m * k), db(k * n);
      if (!ta) {
        gemm(false, !tb, m, k, n, 1.0f, r.data(), b.data(), 0.0f, da.data());
      } else {
        gemm(tb, true, k, m, n, 1.0f, b.data(), r.data(), 0.0f, da.data());
      }
      if (!tb) {
        gemm(!ta, false, k, n, m, 1.0f, a.data(), r.data(), 0.0f, db.data());
      } else {
        gemm(true, ta, n, k, m, 1.0f, r.data(), a.data(), 0.0f, db.data());
      }
      const std::string tag = "ta=" + std::to_string(tai) + " tb=" + std::to_string(tbi);
      expect_grad_matches("gemm dA " + tag, a, da, loss);
      expect_grad_matches("gemm dB " + tag, b, db, loss);
    }
  }
}

TEST(CpuKernelsTest, GemmIsDeterministic) {
  const i64 m = 192, n = 160, k = 224;
  const Vec a = random_vec(m * k, 20), b = random_vec(k * n, 21);
  Vec c1(m * n), c2(m * n);
  gemm(false, true, m, n, k, 1.0f, a.data(), b.data(), 0.0f, c1.data());
  gemm(false, true, m, n, k, 1.0f, a.data(), b.data(), 0.0f, c2.data());
  EXPECT_TRUE(bitwise_equal(c1, c2));
}

// ---------------------------------------------------------------------------------------------
// Bias, elementwise, activations

TEST(CpuKernelsTest, BiasAddAndBiasGrad) {
  const i64 rows = 4, cols = 6;
  Vec x = random_vec(rows * cols, 30), bias = random_vec(cols, 31);
  const Vec r = random_vec(rows * cols, 32);
  auto loss = [&] {
    Vec y(rows * cols);
    bias_add(x.data(), bias.data(), y.data(), rows, cols);
    return dot(y, r);
  };
  Vec dbias(cols, 123.0f);
  bias_grad(r.data(), dbias.data(), rows, cols);
  expect_grad_matches("bias_add dx", x, r, loss);
  expect_grad_matches("bias_grad", bias, dbias, loss);

  // In place (y == x) gives the same values.
  Vec y(rows * cols), inplace = x;
  bias_add(x.data(), bias.data(), y.data(), rows, cols);
  bias_add(inplace.data(), bias.data(), inplace.data(), rows, cols);
  EXPECT_TRUE(bitwise_equal(y, inplace));
}

TEST(CpuKernelsTest, ElementwiseAddMulScaleSum) {
  const i64 n = 37;
  const Vec a = random_vec(n, 40), b = random_vec(n, 41);
  Vec y(n);
  add(a.data(), b.data(), y.data(), n);
  for (i64 i = 0; i < n; ++i) EXPECT_EQ(y[i], a[i] + b[i]);
  mul(a.data(), b.data(), y.data(), n);
  for (i64 i = 0; i < n; ++i) EXPECT_EQ(y[i], a[i] * b[i]);
  scale(a.data(), -2.5f, y.data(), n);
  for (i64 i = 0; i < n; ++i) EXPECT_EQ(y[i], a[i] * -2.5f);
  float s = 0.0f;
  sum(a.data(), &s, n);
  double want = 0.0;
  for (float v : a) want += v;
  EXPECT_NEAR(s, want, 1e-5);
}

using UnaryFwd = void (*)(const float*, float*, i64);
using UnaryBwd = void (*)(const float*, const float*, float*, i64);

// Checks an activation's backward; `from_output` says the backward takes y instead of x.
void check_activation(const std::string& what, UnaryFwd fwd, UnaryBwd bwd, bool from_output,
                      Vec x) {
  const i64 n = static_cast<i64>(x.size());
  const Vec r = random_vec(n, 50);
  auto loss = [&] {
    Vec y(n);
    fwd(x.data(), y.data(), n);
    return dot(y, r);
  };
  Vec y(n), dx(n);
  fwd(x.data(), y.data(), n);
  bwd(from_output ? y.data() : x.data(), r.data(), dx.data(), n);
  expect_grad_matches(what, x, dx, loss, 1e-3f);
}

TEST(CpuKernelsTest, ActivationGradients) {
  check_activation("gelu", gelu_forward, gelu_backward, false, random_vec(40, 51, -3.0f, 3.0f));
  check_activation("sigmoid", sigmoid_forward, sigmoid_backward, true,
                   random_vec(40, 52, -6.0f, 6.0f));
  check_activation("tanh", tanh_forward, tanh_backward, true, random_vec(40, 53, -2.5f, 2.5f));
  // ReLU away from its kink: |x| >= 0.1.
  Vec xr = random_vec(40, 54, 0.1f, 1.0f);
  for (std::size_t i = 0; i < xr.size(); i += 2) xr[i] = -xr[i];
  check_activation("relu", relu_forward, relu_backward, false, xr);
}

TEST(CpuKernelsTest, ActivationForwardValues) {
  const Vec x = {-3.0f, -1.0f, -0.25f, 0.0f, 0.5f, 2.0f, 30.0f, -30.0f};
  const i64 n = static_cast<i64>(x.size());
  Vec g(n), s(n), t(n), r(n);
  gelu_forward(x.data(), g.data(), n);
  sigmoid_forward(x.data(), s.data(), n);
  tanh_forward(x.data(), t.data(), n);
  relu_forward(x.data(), r.data(), n);
  for (i64 i = 0; i < n; ++i) {
    const double v = x[i];
    const double inner = std::sqrt(2.0 / std::numbers::pi) * (v + 0.044715 * v * v * v);
    const double gw = 0.5 * v * (1.0 + std::tanh(inner));
    EXPECT_NEAR(g[i], gw, 1e-5 * std::max(1.0, std::abs(gw)));
    EXPECT_NEAR(s[i], 1.0 / (1.0 + std::exp(-v)), 1e-6);
    EXPECT_NEAR(t[i], std::tanh(v), 1e-6);
    EXPECT_EQ(r[i], v > 0 ? x[i] : 0.0f);
  }
}

// ---------------------------------------------------------------------------------------------
// LayerNorm, softmax

TEST(CpuKernelsTest, LayerNormGradients) {
  const i64 rows = 3, c = 8;
  const float eps = 1e-5f;
  Vec x = random_vec(rows * c, 60, -2.0f, 2.0f), w = random_vec(c, 61, 0.5f, 1.5f),
      b = random_vec(c, 62);
  const Vec r = random_vec(rows * c, 63);
  auto loss = [&] {
    Vec y(rows * c), mean(rows), rstd(rows);
    layernorm_forward(x.data(), w.data(), b.data(), y.data(), mean.data(), rstd.data(), rows, c,
                      eps);
    return dot(y, r);
  };
  Vec y(rows * c), mean(rows), rstd(rows);
  layernorm_forward(x.data(), w.data(), b.data(), y.data(), mean.data(), rstd.data(), rows, c, eps);
  for (i64 i = 0; i < rows; ++i) {
    double m = 0.0, v = 0.0;
    for (i64 j = 0; j < c; ++j) m += x[i * c + j];
    m /= c;
    for (i64 j = 0; j < c; ++j) v += (x[i * c + j] - m) * (x[i * c + j] - m);
    v /= c;
    EXPECT_NEAR(mean[i], m, 1e-6);
    EXPECT_NEAR(rstd[i], 1.0 / std::sqrt(v + eps), 1e-5 * rstd[i]);
  }
  Vec dx(rows * c), dw(c, 7.0f), db(c, 7.0f);
  layernorm_backward(r.data(), x.data(), w.data(), mean.data(), rstd.data(), dx.data(), dw.data(),
                     db.data(), rows, c);
  expect_grad_matches("layernorm dx", x, dx, loss, 3e-3f);
  expect_grad_matches("layernorm dw", w, dw, loss, 3e-3f);
  expect_grad_matches("layernorm db", b, db, loss, 3e-3f);
}

TEST(CpuKernelsTest, LayerNormBackwardIsDeterministic) {
  const i64 rows = 64, c = 96;
  const Vec x = random_vec(rows * c, 65), w = random_vec(c, 66), dy = random_vec(rows * c, 67),
            b = random_vec(c, 68);
  Vec y(rows * c), mean(rows), rstd(rows);
  layernorm_forward(x.data(), w.data(), b.data(), y.data(), mean.data(), rstd.data(), rows, c,
                    1e-5f);
  Vec dx1(rows * c), dw1(c), db1(c), dx2(rows * c), dw2(c), db2(c);
  layernorm_backward(dy.data(), x.data(), w.data(), mean.data(), rstd.data(), dx1.data(),
                     dw1.data(), db1.data(), rows, c);
  layernorm_backward(dy.data(), x.data(), w.data(), mean.data(), rstd.data(), dx2.data(),
                     dw2.data(), db2.data(), rows, c);
  EXPECT_TRUE(bitwise_equal(dx1, dx2));
  EXPECT_TRUE(bitwise_equal(dw1, dw2));
  EXPECT_TRUE(bitwise_equal(db1, db2));
}

TEST(CpuKernelsTest, SoftmaxGradientsAndRowSums) {
  const i64 rows = 4, cols = 7;
  Vec x = random_vec(rows * cols, 70, -3.0f, 3.0f);
  const Vec r = random_vec(rows * cols, 71);
  auto loss = [&] {
    Vec y(rows * cols);
    softmax_forward(x.data(), y.data(), rows, cols);
    return dot(y, r);
  };
  Vec y(rows * cols), dx(rows * cols);
  softmax_forward(x.data(), y.data(), rows, cols);
  for (i64 i = 0; i < rows; ++i) {
    double s = 0.0;
    for (i64 j = 0; j < cols; ++j) s += y[i * cols + j];
    EXPECT_NEAR(s, 1.0, 1e-6);
  }
  softmax_backward(y.data(), r.data(), dx.data(), rows, cols);
  expect_grad_matches("softmax dx", x, dx, loss, 1e-3f);
}

// ---------------------------------------------------------------------------------------------
// Attention

void naive_attention(const Vec& qkv, Vec& out, i64 b, i64 t, i64 c, i64 nh) {
  const i64 hs = c / nh;
  out.assign(b * t * c, 0.0f);
  for (i64 bi = 0; bi < b; ++bi) {
    for (i64 h = 0; h < nh; ++h) {
      for (i64 i = 0; i < t; ++i) {
        std::vector<double> s(i + 1);
        double mx = -1e300;
        for (i64 j = 0; j <= i; ++j) {
          double d = 0.0;
          for (i64 e = 0; e < hs; ++e) {
            d += static_cast<double>(qkv[(bi * t + i) * 3 * c + h * hs + e]) *
                 qkv[(bi * t + j) * 3 * c + c + h * hs + e];
          }
          s[j] = d / std::sqrt(static_cast<double>(hs));
          mx = std::max(mx, s[j]);
        }
        double z = 0.0;
        for (double& v : s) z += (v = std::exp(v - mx));
        for (i64 e = 0; e < hs; ++e) {
          double o = 0.0;
          for (i64 j = 0; j <= i; ++j) {
            o += s[j] / z * qkv[(bi * t + j) * 3 * c + 2 * c + h * hs + e];
          }
          out[(bi * t + i) * c + h * hs + e] = static_cast<float>(o);
        }
      }
    }
  }
}

TEST(CpuKernelsTest, AttentionForwardMatchesNaive) {
  const i64 b = 2, t = 5, c = 8, nh = 2;
  const Vec qkv = random_vec(b * t * 3 * c, 80, -2.0f, 2.0f);
  Vec out(b * t * c), att(b * nh * t * t, 99.0f), want;
  attention_forward(qkv.data(), out.data(), att.data(), b, t, c, nh);
  naive_attention(qkv, want, b, t, c, nh);
  for (std::size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], want[i], 1e-5) << i;
  for (i64 row = 0; row < b * nh * t; ++row) {
    const i64 ti = row % t;
    double s = 0.0;
    for (i64 t2 = 0; t2 < t; ++t2) {
      const float a = att[row * t + t2];
      if (t2 > ti) {
        EXPECT_EQ(a, 0.0f) << "row " << row << " col " << t2;
      } else {
        EXPECT_GE(a, 0.0f);
      }
      s += a;
    }
    EXPECT_NEAR(s, 1.0, 1e-6) << "row " << row;
  }
}

TEST(CpuKernelsTest, AttentionGradients) {
  const i64 b = 2, t = 5, c = 8, nh = 2;
  Vec qkv = random_vec(b * t * 3 * c, 81);
  const Vec r = random_vec(b * t * c, 82);
  auto loss = [&] {
    Vec out(b * t * c), att(b * nh * t * t);
    attention_forward(qkv.data(), out.data(), att.data(), b, t, c, nh);
    return dot(out, r);
  };
  Vec out(b * t * c), att(b * nh * t * t), dqkv(b * t * 3 * c, 5.0f);
  attention_forward(qkv.data(), out.data(), att.data(), b, t, c, nh);
  attention_backward(r.data(), qkv.data(), att.data(), dqkv.data(), b, t, c, nh);
  expect_grad_matches("attention dqkv", qkv, dqkv, loss, 3e-3f);
}

TEST(CpuKernelsTest, AttentionBackwardIsDeterministic) {
  const i64 b = 2, t = 16, c = 32, nh = 4;
  const Vec qkv = random_vec(b * t * 3 * c, 83), dout = random_vec(b * t * c, 84);
  Vec out(b * t * c), att(b * nh * t * t);
  attention_forward(qkv.data(), out.data(), att.data(), b, t, c, nh);
  Vec d1(b * t * 3 * c), d2(b * t * 3 * c);
  attention_backward(dout.data(), qkv.data(), att.data(), d1.data(), b, t, c, nh);
  attention_backward(dout.data(), qkv.data(), att.data(), d2.data(), b, t, c, nh);
  EXPECT_TRUE(bitwise_equal(d1, d2));
}

// ---------------------------------------------------------------------------------------------
// Embedding, cross-entropy, dropout

TEST(CpuKernelsTest, EmbeddingGradients) {
  const i64 b = 2, t = 3, c = 4, v = 6;
  const std::vector<std::int32_t> idx = {1, 4, 1, 0, 4, 4};  // repeated ids, id 2, 3, 5 unused
  Vec wte = random_vec(v * c, 90), wpe = random_vec(t * c, 91);
  const Vec r = random_vec(b * t * c, 92);
  auto loss = [&] {
    Vec out(b * t * c);
    embedding_forward(idx.data(), wte.data(), wpe.data(), out.data(), b, t, c);
    return dot(out, r);
  };
  Vec dwte(v * c, 3.0f), dwpe(t * c, 3.0f);
  embedding_backward(r.data(), idx.data(), dwte.data(), dwpe.data(), b, t, c, v);
  expect_grad_matches("embedding dwte", wte, dwte, loss);
  expect_grad_matches("embedding dwpe", wpe, dwpe, loss);

  // Without positions: out is the token row alone, and dwte is unchanged.
  Vec out(b * t * c), dwte2(v * c, 3.0f);
  embedding_forward(idx.data(), wte.data(), nullptr, out.data(), b, t, c);
  for (i64 row = 0; row < b * t; ++row) {
    for (i64 j = 0; j < c; ++j) EXPECT_EQ(out[row * c + j], wte[idx[row] * c + j]);
  }
  embedding_backward(r.data(), idx.data(), dwte2.data(), nullptr, b, t, c, v);
  EXPECT_TRUE(bitwise_equal(dwte, dwte2));
}

TEST(CpuKernelsTest, EmbeddingBackwardIsDeterministic) {
  const i64 b = 4, t = 32, c = 16, v = 10;
  std::vector<std::int32_t> idx(b * t);
  for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<std::int32_t>((i * 7) % v);
  const Vec dout = random_vec(b * t * c, 93);
  Vec dwte1(v * c), dwpe1(t * c), dwte2(v * c), dwpe2(t * c);
  embedding_backward(dout.data(), idx.data(), dwte1.data(), dwpe1.data(), b, t, c, v);
  embedding_backward(dout.data(), idx.data(), dwte2.data(), dwpe2.data(), b, t, c, v);
  EXPECT_TRUE(bitwise_equal(dwte1, dwte2));
  EXPECT_TRUE(bitwise_equal(dwpe1, dwpe2));
}

TEST(CpuKernelsTest, CrossEntropyMatchesHandComputation) {
  const Vec logits = {1.0f, 2.0f, 3.0f, 0.0f, 0.0f, 0.0f};
  const std::vector<std::int32_t> targets = {2, 0};
  Vec losses(2);
  cross_entropy_forward(logits.data(), targets.data(), losses.data(), 2, 3);
  // -log(e^3 / (e + e^2 + e^3)) and -log(1/3).
  EXPECT_NEAR(losses[0], 0.4076059644, 1e-6);
  EXPECT_NEAR(losses[1], 1.0986122887, 1e-6);
  const float dloss = 2.0f;
  Vec d(6);
  cross_entropy_backward(logits.data(), targets.data(), &dloss, 0.5f, d.data(), 2, 3);
  const std::vector<double> want = {0.0900305732,  0.2447284711, 0.6652409558 - 1.0,
                                    1.0 / 3 - 1.0, 1.0 / 3,      1.0 / 3};
  expect_near("cross_entropy dlogits", d, want, 1e-6);
}

TEST(CpuKernelsTest, CrossEntropyGradients) {
  const i64 n = 4, v = 5;
  Vec logits = random_vec(n * v, 100, -2.0f, 2.0f);
  const std::vector<std::int32_t> targets = {0, 3, 4, 3};
  const float dloss = 0.7f;
  const float sc = 1.0f / n;
  auto loss = [&] {
    Vec losses(n);
    cross_entropy_forward(logits.data(), targets.data(), losses.data(), n, v);
    double s = 0.0;
    for (float l : losses) s += l;
    return s * dloss * sc;
  };
  Vec d(n * v);
  cross_entropy_backward(logits.data(), targets.data(), &dloss, sc, d.data(), n, v);
  expect_grad_matches("cross_entropy dlogits", logits, d, loss, 1e-2f, 1e-2, 5e-4);
}

TEST(CpuKernelsTest, DropoutMaskAndScaling) {
  const i64 n = 100000;
  const float p = 0.3f;
  const std::uint64_t seed = 1234, offset = 77;
  const Vec x = random_vec(n, 110);
  Vec y(n), y2(n), y3(n);
  std::vector<std::uint8_t> mask(n), mask2(n), mask3(n);
  dropout_forward(x.data(), y.data(), mask.data(), n, p, seed, offset);
  dropout_forward(x.data(), y2.data(), mask2.data(), n, p, seed, offset);
  dropout_forward(x.data(), y3.data(), mask3.data(), n, p, seed, offset + 1);

  EXPECT_TRUE(bitwise_equal(y, y2));
  EXPECT_EQ(mask, mask2);
  EXPECT_NE(mask, mask3);

  const Philox rng(seed, offset);
  i64 kept = 0;
  for (i64 i = 0; i < n; ++i) {
    ASSERT_EQ(mask[i] != 0, rng.uniform(i) >= p) << i;
    if (mask[i]) {
      ++kept;
      ASSERT_EQ(y[i], x[i] / (1.0f - p)) << i;
    } else {
      ASSERT_EQ(y[i], 0.0f) << i;
    }
  }
  EXPECT_NEAR(static_cast<double>(kept) / n, 1.0 - p, 0.01);

  const Vec dy = random_vec(n, 111);
  Vec dx(n);
  dropout_backward(dy.data(), mask.data(), dx.data(), n, p);
  for (i64 i = 0; i < n; ++i) {
    ASSERT_EQ(dx[i], mask[i] ? dy[i] / (1.0f - p) : 0.0f) << i;
  }
}

// ---------------------------------------------------------------------------------------------
// Convolution

struct ConvCfg {
  i64 n, ic, h, w, oc, kh, kw, stride, pad;
  i64 oh() const { return (h + 2 * pad - kh) / stride + 1; }
  i64 ow() const { return (w + 2 * pad - kw) / stride + 1; }
};

std::vector<double> naive_conv(const ConvCfg& g, const Vec& x, const Vec& w, const Vec& bias) {
  std::vector<double> y(g.n * g.oc * g.oh() * g.ow());
  for (i64 ni = 0; ni < g.n; ++ni) {
    for (i64 o = 0; o < g.oc; ++o) {
      for (i64 oy = 0; oy < g.oh(); ++oy) {
        for (i64 ox = 0; ox < g.ow(); ++ox) {
          double s = bias[o];
          for (i64 ci = 0; ci < g.ic; ++ci) {
            for (i64 ki = 0; ki < g.kh; ++ki) {
              for (i64 kj = 0; kj < g.kw; ++kj) {
                const i64 iy = oy * g.stride - g.pad + ki;
                const i64 ix = ox * g.stride - g.pad + kj;
                if (iy < 0 || iy >= g.h || ix < 0 || ix >= g.w) continue;
                s += static_cast<double>(x[((ni * g.ic + ci) * g.h + iy) * g.w + ix]) *
                     w[((o * g.ic + ci) * g.kh + ki) * g.kw + kj];
              }
            }
          }
          y[((ni * g.oc + o) * g.oh() + oy) * g.ow() + ox] = s;
        }
      }
    }
  }
  return y;
}

const ConvCfg kConvCfgs[] = {{2, 3, 5, 6, 4, 3, 3, 1, 1}, {2, 3, 5, 6, 4, 3, 3, 2, 0}};

TEST(CpuKernelsTest, Conv2dForwardMatchesDirectConvolution) {
  for (const ConvCfg& g : kConvCfgs) {
    const Vec x = random_vec(g.n * g.ic * g.h * g.w, 120),
              w = random_vec(g.oc * g.ic * g.kh * g.kw, 121), bias = random_vec(g.oc, 122);
    Vec y(g.n * g.oc * g.oh() * g.ow(), 9.0f), cols(g.ic * g.kh * g.kw * g.oh() * g.ow());
    conv2d_forward(x.data(), w.data(), bias.data(), y.data(), cols.data(), g.n, g.ic, g.h, g.w,
                   g.oc, g.kh, g.kw, g.stride, g.pad);
    expect_near("conv2d y stride " + std::to_string(g.stride), y, naive_conv(g, x, w, bias), 1e-5);
    // Without bias.
    const Vec zero_bias(g.oc, 0.0f);
    conv2d_forward(x.data(), w.data(), nullptr, y.data(), cols.data(), g.n, g.ic, g.h, g.w, g.oc,
                   g.kh, g.kw, g.stride, g.pad);
    expect_near("conv2d y no bias", y, naive_conv(g, x, w, zero_bias), 1e-5);
  }
}

TEST(CpuKernelsTest, Conv2dGradients) {
  for (const ConvCfg& g : kConvCfgs) {
    Vec x = random_vec(g.n * g.ic * g.h * g.w, 130), w = random_vec(g.oc * g.ic * g.kh * g.kw, 131),
        bias = random_vec(g.oc, 132);
    const Vec r = random_vec(g.n * g.oc * g.oh() * g.ow(), 133);
    Vec cols(g.ic * g.kh * g.kw * g.oh() * g.ow());
    auto loss = [&] {
      Vec y(g.n * g.oc * g.oh() * g.ow());
      conv2d_forward(x.data(), w.data(), bias.data(), y.data(), cols.data(), g.n, g.ic, g.h, g.w,
                     g.oc, g.kh, g.kw, g.stride, g.pad);
      return dot(y, r);
    };
    Vec dx(x.size(), 4.0f), dw(w.size(), 4.0f), db(g.oc, 4.0f);
    conv2d_backward(r.data(), x.data(), w.data(), dx.data(), dw.data(), db.data(), cols.data(), g.n,
                    g.ic, g.h, g.w, g.oc, g.kh, g.kw, g.stride, g.pad);
    const std::string tag = " stride " + std::to_string(g.stride);
    expect_grad_matches("conv2d dx" + tag, x, dx, loss);
    expect_grad_matches("conv2d dw" + tag, w, dw, loss);
    expect_grad_matches("conv2d dbias" + tag, bias, db, loss);

    // dx == null (first layer): dw and dbias are unchanged.
    Vec dw2(w.size(), 4.0f), db2(g.oc, 4.0f);
    conv2d_backward(r.data(), x.data(), w.data(), nullptr, dw2.data(), db2.data(), cols.data(), g.n,
                    g.ic, g.h, g.w, g.oc, g.kh, g.kw, g.stride, g.pad);
    EXPECT_TRUE(bitwise_equal(dw, dw2));
    EXPECT_TRUE(bitwise_equal(db, db2));
  }
}

TEST(CpuKernelsTest, Conv2dBackwardIsDeterministic) {
  const ConvCfg g{4, 8, 12, 12, 16, 3, 3, 1, 1};
  const Vec x = random_vec(g.n * g.ic * g.h * g.w, 140),
            w = random_vec(g.oc * g.ic * g.kh * g.kw, 141),
            dy = random_vec(g.n * g.oc * g.oh() * g.ow(), 142);
  Vec cols(g.ic * g.kh * g.kw * g.oh() * g.ow());
  Vec dx1(x.size()), dw1(w.size()), db1(g.oc), dx2(x.size()), dw2(w.size()), db2(g.oc);
  conv2d_backward(dy.data(), x.data(), w.data(), dx1.data(), dw1.data(), db1.data(), cols.data(),
                  g.n, g.ic, g.h, g.w, g.oc, g.kh, g.kw, g.stride, g.pad);
  conv2d_backward(dy.data(), x.data(), w.data(), dx2.data(), dw2.data(), db2.data(), cols.data(),
                  g.n, g.ic, g.h, g.w, g.oc, g.kh, g.kw, g.stride, g.pad);
  EXPECT_TRUE(bitwise_equal(dx1, dx2));
  EXPECT_TRUE(bitwise_equal(dw1, dw2));
  EXPECT_TRUE(bitwise_equal(db1, db2));
}

// ---------------------------------------------------------------------------------------------
// BatchNorm, pooling

TEST(CpuKernelsTest, BatchNormGradients) {
  const i64 n = 3, c = 2, hw = 4;
  const float eps = 1e-5f;
  Vec x = random_vec(n * c * hw, 150, -2.0f, 2.0f), gamma = random_vec(c, 151, 0.5f, 1.5f),
      beta = random_vec(c, 152);
  const Vec r = random_vec(n * c * hw, 153);
  auto loss = [&] {
    Vec y(n * c * hw), mean(c), rstd(c);
    batchnorm_forward(x.data(), gamma.data(), beta.data(), y.data(), mean.data(), rstd.data(), n, c,
                      hw, eps);
    return dot(y, r);
  };
  Vec y(n * c * hw), mean(c), rstd(c);
  batchnorm_forward(x.data(), gamma.data(), beta.data(), y.data(), mean.data(), rstd.data(), n, c,
                    hw, eps);
  for (i64 ch = 0; ch < c; ++ch) {
    double m = 0.0, v = 0.0;
    for (i64 ni = 0; ni < n; ++ni) {
      for (i64 i = 0; i < hw; ++i) m += x[(ni * c + ch) * hw + i];
    }
    m /= n * hw;
    for (i64 ni = 0; ni < n; ++ni) {
      for (i64 i = 0; i < hw; ++i) {
        const double d = x[(ni * c + ch) * hw + i] - m;
        v += d * d;
      }
    }
    v /= n * hw;
    EXPECT_NEAR(mean[ch], m, 1e-6);
    EXPECT_NEAR(rstd[ch], 1.0 / std::sqrt(v + eps), 1e-5 * rstd[ch]);
  }
  Vec dx(x.size(), 2.0f), dgamma(c, 2.0f), dbeta(c, 2.0f);
  batchnorm_backward(r.data(), x.data(), gamma.data(), mean.data(), rstd.data(), dx.data(),
                     dgamma.data(), dbeta.data(), n, c, hw);
  expect_grad_matches("batchnorm dx", x, dx, loss, 3e-3f);
  expect_grad_matches("batchnorm dgamma", gamma, dgamma, loss, 3e-3f);
  expect_grad_matches("batchnorm dbeta", beta, dbeta, loss, 3e-3f);
}

TEST(CpuKernelsTest, BatchNormRunningUpdateMatchesHandComputation) {
  Vec running_mean = {0.0f, 1.0f}, running_var = {1.0f, 2.0f};
  const Vec mean = {0.5f, -1.0f}, rstd = {2.0f, 0.5f};
  batchnorm_running_update(running_mean.data(), running_var.data(), mean.data(), rstd.data(), 2,
                           /*count=*/4, /*momentum=*/0.1f, /*eps=*/1e-5f);
  // var0 = (0.25 - 1e-5) * 4/3 = 0.33332; var1 = (4 - 1e-5) * 4/3 = 5.33332.
  EXPECT_NEAR(running_mean[0], 0.05, 1e-7);
  EXPECT_NEAR(running_mean[1], 0.8, 1e-7);
  EXPECT_NEAR(running_var[0], 0.933332, 1e-6);
  EXPECT_NEAR(running_var[1], 2.333332, 1e-6);
}

// Distinct values spaced 0.05 apart, so a small perturbation never changes a window's argmax.
Vec distinct_values(i64 n, std::uint32_t seed) {
  std::vector<int> perm(n);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(seed));
  Vec v(n);
  for (i64 i = 0; i < n; ++i) v[i] = 0.05f * static_cast<float>(perm[i] - n / 2);
  return v;
}

TEST(CpuKernelsTest, MaxPoolForwardAndGradients) {
  const i64 n = 2, c = 2, h = 5, wd = 5;
  for (const auto& [k, s] : {std::pair<i64, i64>{2, 2}, std::pair<i64, i64>{3, 2}}) {
    const i64 oh = (h - k) / s + 1, ow = (wd - k) / s + 1;
    Vec x = distinct_values(n * c * h * wd, 160);
    const Vec r = random_vec(n * c * oh * ow, 161);
    Vec y(n * c * oh * ow);
    std::vector<std::int32_t> argmax(y.size());
    maxpool2d_forward(x.data(), y.data(), argmax.data(), n, c, h, wd, k, s);
    for (i64 plane = 0; plane < n * c; ++plane) {
      for (i64 oy = 0; oy < oh; ++oy) {
        for (i64 ox = 0; ox < ow; ++ox) {
          float best = -1e30f;
          for (i64 i = 0; i < k; ++i) {
            for (i64 j = 0; j < k; ++j) {
              best = std::max(best, x[plane * h * wd + (oy * s + i) * wd + ox * s + j]);
            }
          }
          const i64 o = (plane * oh + oy) * ow + ox;
          EXPECT_EQ(y[o], best);
          EXPECT_EQ(x[plane * h * wd + argmax[o]], best);
        }
      }
    }
    auto loss = [&] {
      Vec yy(n * c * oh * ow);
      std::vector<std::int32_t> am(yy.size());
      maxpool2d_forward(x.data(), yy.data(), am.data(), n, c, h, wd, k, s);
      return dot(yy, r);
    };
    Vec dx(x.size(), 6.0f);
    maxpool2d_backward(r.data(), argmax.data(), dx.data(), n, c, h, wd, k, s);
    expect_grad_matches("maxpool dx k=" + std::to_string(k), x, dx, loss, 1e-2f);
  }
}

TEST(CpuKernelsTest, MaxPoolTiesPickTheFirstMaximum) {
  const Vec x = {1.0f, 3.0f, 3.0f, 3.0f};  // one 2x2 plane
  Vec y(1);
  std::int32_t argmax = -1;
  maxpool2d_forward(x.data(), y.data(), &argmax, 1, 1, 2, 2, 2, 2);
  EXPECT_EQ(y[0], 3.0f);
  EXPECT_EQ(argmax, 1);
}

TEST(CpuKernelsTest, AvgPoolGradients) {
  const i64 n = 2, c = 3, hw = 5;
  Vec x = random_vec(n * c * hw, 170);
  const Vec r = random_vec(n * c, 171);
  auto loss = [&] {
    Vec y(n * c);
    avgpool_forward(x.data(), y.data(), n, c, hw);
    return dot(y, r);
  };
  Vec y(n * c);
  avgpool_forward(x.data(), y.data(), n, c, hw);
  for (i64 p = 0; p < n * c; ++p) {
    double m = 0.0;
    for (i64 i = 0; i < hw; ++i) m += x[p * hw + i];
    EXPECT_NEAR(y[p], m / hw, 1e-6);
  }
  Vec dx(x.size(), 8.0f);
  avgpool_backward(r.data(), dx.data(), n, c, hw);
  expect_grad_matches("avgpool dx", x, dx, loss);
}

// ---------------------------------------------------------------------------------------------
// AdamW, degenerate sizes

TEST(CpuKernelsTest, AdamWMatchesScalarReference) {
  const i64 n = 9;
  const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
  Vec p = random_vec(n, 180), m(n, 0.0f), v(n, 0.0f);
  std::vector<double> rp(p.begin(), p.end()), rm(n, 0.0), rv(n, 0.0);
  for (int t = 1; t <= 3; ++t) {
    const Vec g = random_vec(n, 181 + t);
    adamw_update(p.data(), m.data(), v.data(), g.data(), n, lr, b1, b2, eps, wd, t);
    for (i64 i = 0; i < n; ++i) {
      rm[i] = b1 * rm[i] + (1.0 - b1) * g[i];
      rv[i] = b2 * rv[i] + (1.0 - b2) * static_cast<double>(g[i]) * g[i];
      const double mhat = rm[i] / (1.0 - std::pow(static_cast<double>(b1), t));
      const double vhat = rv[i] / (1.0 - std::pow(static_cast<double>(b2), t));
      rp[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + wd * rp[i]);
    }
    expect_near("adamw param step " + std::to_string(t), p, rp, 1e-5);
    expect_near("adamw m step " + std::to_string(t), m, rm, 1e-6);
    expect_near("adamw v step " + std::to_string(t), v, rv, 1e-6);
  }
}

TEST(CpuKernelsTest, DegenerateSizesAreSafe) {
  // Nothing is read or written through null pointers when the size is zero.
  add(nullptr, nullptr, nullptr, 0);
  gelu_forward(nullptr, nullptr, 0);
  gemm(false, false, 0, 4, 3, 1.0f, nullptr, nullptr, 0.0f, nullptr);
  attention_forward(nullptr, nullptr, nullptr, 0, 4, 8, 2);
  dropout_forward(nullptr, nullptr, nullptr, 0, 0.5f, 1, 2);
  float s = 5.0f;
  sum(nullptr, &s, 0);
  EXPECT_EQ(s, 0.0f);
  // k == 0: C = beta * C.
  Vec c(6, std::numeric_limits<float>::quiet_NaN());
  gemm(false, false, 2, 3, 0, 1.0f, nullptr, nullptr, 0.0f, c.data());
  for (float v : c) EXPECT_EQ(v, 0.0f);
  // Empty batches still overwrite the weight gradients with zeros.
  Vec dwte(12, 1.0f), dwpe(8, 1.0f);
  embedding_backward(nullptr, nullptr, dwte.data(), dwpe.data(), 0, 2, 4, 3);
  for (float v : dwte) EXPECT_EQ(v, 0.0f);
  for (float v : dwpe) EXPECT_EQ(v, 0.0f);
  Vec dw(2 * 3 * 9, 1.0f), db(2, 1.0f);
  conv2d_backward(nullptr, nullptr, nullptr, nullptr, dw.data(), db.data(), nullptr, 0, 3, 4, 4, 2,
                  3, 3, 1, 1);
  for (float v : dw) EXPECT_EQ(v, 0.0f);
  for (float v : db) EXPECT_EQ(v, 0.0f);
  Vec dbias(3, 1.0f);
  bias_grad(nullptr, dbias.data(), 0, 3);
  for (float v : dbias) EXPECT_EQ(v, 0.0f);
}

}  // namespace
}  // namespace remat::kernels::cpu
