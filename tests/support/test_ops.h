// Small float32 CPU ops for the runtime's tests: unary, binary, multi-output, views, random
// and in-place ops, each with a declared cost. Deterministic kernels, so a recomputation
// must reproduce every bit.
#ifndef REMAT_TESTS_SUPPORT_TEST_OPS_H_
#define REMAT_TESTS_SUPPORT_TEST_OPS_H_

#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/philox.h"
#include "remat/op.h"
#include "remat/runtime.h"

namespace remat::testing {

inline TensorSpec vec(std::int64_t n) { return TensorSpec{{n}, DType::kF32}; }
inline double numel_cost(SpecList in) {
  double c = 1;
  for (const TensorSpec& s : in) c += static_cast<double>(s.numel());
  return c;
}

// y = x * a + b
inline OpPtr affine(float a, float b) {
  return make_op(
      "affine", [](SpecList in) { return Outputs{{in[0]}}; },
      [a, b](const KernelContext& k) {
        const float* x = k.input<float>(0);
        float* y = k.output<float>(0);
        for (std::int64_t i = 0; i < k.input_spec(0).numel(); ++i) y[i] = x[i] * a + b;
      },
      numel_cost);
}

// y = x0 + x1 * x0 (non-linear, so the order of inputs matters)
inline OpPtr combine() {
  return make_op(
      "combine", [](SpecList in) { return Outputs{{in[0]}}; },
      [](const KernelContext& k) {
        const float* x0 = k.input<float>(0);
        const float* x1 = k.input<float>(1);
        float* y = k.output<float>(0);
        for (std::int64_t i = 0; i < k.input_spec(0).numel(); ++i) y[i] = x0[i] + x1[i] * x0[i];
      },
      numel_cost);
}

// Two outputs with storages of their own: the running prefix sum and the elementwise square.
inline OpPtr scan_and_square() {
  return make_op(
      "scan_and_square",
      [](SpecList in) {
        return Outputs{{in[0]}, {in[0]}};
      },
      [](const KernelContext& k) {
        const float* x = k.input<float>(0);
        float* s = k.output<float>(0);
        float* q = k.output<float>(1);
        float acc = 0;
        for (std::int64_t i = 0; i < k.input_spec(0).numel(); ++i) {
          acc = acc * 0.5f + x[i];
          s[i] = acc;
          q[i] = x[i] * x[i];
        }
      },
      numel_cost);
}

// A view of the second half of the input (an alias with an offset): no kernel.
inline OpPtr second_half() {
  auto op = std::make_shared<OpDef>();
  op->name = "second_half";
  op->infer = [](SpecList in) {
    const std::int64_t n = in[0].numel();
    return Outputs{OutputSpec(vec(n - n / 2), 0, static_cast<std::size_t>(n / 2) * 4)};
  };
  op->cost = [](SpecList) { return 1.0; };
  return op;
}

// [x0, x1]
inline OpPtr concat() {
  return make_op(
      "concat", [](SpecList in) { return Outputs{{vec(in[0].numel() + in[1].numel())}}; },
      [](const KernelContext& k) {
        const std::size_t a = k.input_spec(0).bytes(), b = k.input_spec(1).bytes();
        std::memcpy(k.output<char>(0), k.inputs[0], a);
        std::memcpy(k.output<char>(0) + a, k.inputs[1], b);
      },
      numel_cost);
}

// Dropout with p = 1/2 on a Philox stream: the mask is drawn from the op's recorded counter.
inline OpPtr dropout() {
  auto op = make_op(
      "dropout", [](SpecList in) { return Outputs{{in[0]}}; },
      [](const KernelContext& k) {
        const Philox rng(k.rng.seed, k.rng.offset);
        const float* x = k.input<float>(0);
        float* y = k.output<float>(0);
        for (std::int64_t i = 0; i < k.input_spec(0).numel(); ++i)
          y[i] = rng.uniform(static_cast<std::uint64_t>(i)) < 0.5f ? 0.0f : 2.0f * x[i];
      },
      numel_cost, /*random=*/true);
  std::const_pointer_cast<OpDef>(op)->rng_counters = 1u << 20;
  return op;
}

// For call_inplace: writes x0 + x1 as the new version of argument 0.
inline OpPtr add_inplace() {
  return make_op(
      "add_", [](SpecList in) { return Outputs{{in[0]}}; },
      [](const KernelContext& k) {
        const float* x0 = k.input<float>(0);
        const float* x1 = k.input<float>(1);
        float* y = k.output<float>(0);
        for (std::int64_t i = 0; i < k.output_spec(0).numel(); ++i) y[i] = x0[i] + x1[i];
      },
      numel_cost);
}

// w += x, in place on pinned tensors (an optimizer step's shape).
inline OpPtr add_into_first() {
  return make_op(
      "add_into_first", [](SpecList) { return Outputs{}; },
      [](const KernelContext& k) {
        float* w = k.output<float>(0);
        const float* x = k.input<float>(1);
        for (std::int64_t i = 0; i < k.input_spec(0).numel(); ++i) w[i] += x[i];
      },
      [](SpecList in) { return double(in[0].numel()); });
}

// n values in [-1, 1) drawn from (seed, tag) alone: a constant's values in the property
// tests, the same in every run that asks for them.
inline std::vector<float> seeded_values(std::uint64_t seed, std::uint64_t tag, std::int64_t n) {
  std::mt19937_64 rng(seed * 1000003u + tag);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& f : v) f = static_cast<float>(rng() % 2000) / 1000.0f - 1.0f;
  return v;
}

// 1, 2, 3, ... (from `start`), n values.
inline std::vector<float> iota(std::int64_t n, float start = 1.0f) {
  std::vector<float> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), start);
  return v;
}

// The tensor's values, read back (recomputed if it was evicted).
inline std::vector<float> read(Runtime& rt, const Tensor& t) {
  std::vector<float> out(static_cast<std::size_t>(t.spec().numel()));
  rt.read(t, out.data());
  return out;
}

// Logical accounting under `budget`, as the DTR simulator counts memory.
inline RuntimeOptions logical(std::size_t budget, const std::string& policy = "dtr") {
  RuntimeOptions o;
  o.accounting = Accounting::kLogical;
  o.budget = budget;
  o.policy = policy;
  return o;
}

}  // namespace remat::testing

#endif  // REMAT_TESTS_SUPPORT_TEST_OPS_H_
