#include "kernels/cpu/vector_exp.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace remat::kernels::cpu {
namespace {

// Distance in representable floats between two positive finite floats.
std::int64_t ulp_distance(float a, float b) {
  std::int32_t ia, ib;
  std::memcpy(&ia, &a, sizeof a);
  std::memcpy(&ib, &b, sizeof b);
  return std::llabs(static_cast<std::int64_t>(ia) - ib);
}

float exp1(float x) {
  float out;
  store4(&out, exp4(splat4(x)), 1);
  return out;
}

TEST(VectorExp, WithinFourUlpOfTheTrueValueOverItsRange) {
  std::int64_t worst = 0;
  float at = 0;
  // Every 97th float bit pattern between -87 and 88, positives and negatives.
  for (float lo : {0.0f, -87.0f}) {
    const float hi = lo == 0.0f ? 88.0f : 0.0f;
    std::int32_t a, b;
    std::memcpy(&a, lo == 0.0f ? &lo : &hi, sizeof a);
    const float top = lo == 0.0f ? hi : -lo;
    std::memcpy(&b, &top, sizeof b);
    for (std::int32_t i = a; i < b; i += 97) {
      float m;
      std::memcpy(&m, &i, sizeof m);
      const float x = lo == 0.0f ? m : -m;
      const float want = static_cast<float>(std::exp(static_cast<double>(x)));
      const std::int64_t d = ulp_distance(exp1(x), want);
      if (d > worst) worst = d, at = x;
    }
  }
  EXPECT_LE(worst, 4) << "at x = " << at;
}

TEST(VectorExp, ClampsOutsideTheNormalRange) {
  EXPECT_FLOAT_EQ(exp1(0.0f), 1.0f);
  EXPECT_TRUE(std::isfinite(exp1(1000.0f)));
  EXPECT_GT(exp1(1000.0f), 1e38f);
  EXPECT_GT(exp1(-1000.0f), 0.0f);
  EXPECT_LT(exp1(-1000.0f), 2e-38f);
  // 1 / (1 + exp(-2z)), GELU's sigmoid, is about 0 or 1 at the extremes, never NaN.
  EXPECT_LT(1.0f / (1.0f + exp1(1000.0f)), 1e-37f);
  EXPECT_EQ(1.0f / (1.0f + exp1(-1000.0f)), 1.0f);
}

TEST(VectorExp, EachLaneIsComputedAloneAndTailsArePadded) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> d(-20.0f, 20.0f);
  std::vector<float> x(11), y(11, -1.0f);
  for (float& v : x) v = d(rng);
  for (std::int64_t i = 0; i < 11; i += 4)
    store4(y.data() + i, exp4(load4(x.data() + i, 11 - i)), 11 - i);
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float one = exp1(x[i]);
    EXPECT_EQ(std::memcmp(&one, &y[i], sizeof one), 0) << "lane " << i;
  }
  // The padded lanes read nothing past the end and write nothing past it.
  std::vector<float> guard = {1.0f, 2.0f, 3.0f, 42.0f};
  store4(guard.data(), exp4(load4(guard.data(), 3)), 3);
  EXPECT_EQ(guard[3], 42.0f);
}

}  // namespace
}  // namespace remat::kernels::cpu
