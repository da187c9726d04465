// The tape's early hand-over of leaf gradients (Note [Gradients ready early]): on random
// programs whose parameters are read by several ops, each leaf's gradient is handed over
// once, with the bits of the gradient a plain backward pass keeps, and before the backward
// pass ends where a later op still runs.
#include "kernels/autograd.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <vector>

namespace remat::ad {
namespace {

constexpr std::int64_t kWidth = 4;

std::vector<float> random_values(std::mt19937& rng, std::int64_t n) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = u(rng);
  return v;
}

std::vector<float> read_all(Runtime& rt, const Tensor& t) {
  std::vector<float> v(static_cast<std::size_t>(t.spec().numel()));
  rt.read(t, v.data());
  return v;
}

// One random program: a chain of ops on a (2, kWidth) activation, each reading parameters
// drawn at random from a small set (so a parameter is read by several ops, some never), and
// a concat of two of them in the middle (the record whose inputs are a list).
struct Program {
  struct Layer {
    int kind;  // 0 linear, 1 mul by a parameter, 2 gelu, 3 concat of two params then narrow
    int a, b;  // parameter indices
  };
  std::vector<Layer> layers;
  std::vector<std::vector<float>> params;  // (kWidth, kWidth) each
};

Program random_program(std::mt19937& rng) {
  Program p;
  const int n_params = std::uniform_int_distribution<int>(1, 5)(rng);
  for (int i = 0; i < n_params; ++i) p.params.push_back(random_values(rng, kWidth * kWidth));
  const int n_layers = std::uniform_int_distribution<int>(1, 8)(rng);
  std::uniform_int_distribution<int> kind(0, 3), param(0, n_params - 1);
  for (int i = 0; i < n_layers; ++i)  // the first reads a parameter: the loss needs a gradient
    p.layers.push_back({i == 0 ? 0 : kind(rng), param(rng), param(rng)});
  return p;
}

// Runs the program's forward and backward passes, with or without the hand-over; returns
// each leaf's gradient by leaf index (absent where none reached it), and in `order` the
// leaves as they were handed over with the number of ops the runtime had run by then.
std::map<int, std::vector<float>> gradients(const Program& p, bool early,
                                            std::vector<std::pair<int, std::size_t>>* order) {
  Runtime rt(RuntimeOptions{.backend = Backend::kCpu});
  Tape tape(rt);
  std::vector<Var> leaves;
  std::map<int, int> leaf_of_node;
  for (const std::vector<float>& v : p.params) {
    leaves.push_back(tape.leaf(rt.constant(TensorSpec{{kWidth, kWidth}, DType::kF32}, v.data())));
    leaf_of_node[leaves.back().node] = static_cast<int>(leaves.size()) - 1;
  }
  const std::vector<float> input = {0.5f, -1, 2, 0.25f, 1, -0.5f, 0.75f, -2};
  Var x = tape.input(rt.constant(TensorSpec{{2, kWidth}, DType::kF32}, input.data()));
  for (const Program::Layer& l : p.layers) {
    if (l.kind == 0) x = linear(tape, x, leaves[l.a], Var{});
    if (l.kind == 1) x = mul(tape, x, narrow(tape, leaves[l.a], 0, {2, kWidth}));
    if (l.kind == 2) x = gelu(tape, x);
    if (l.kind == 3)
      x = add(tape, x, narrow(tape, concat(tape, {leaves[l.a], leaves[l.b]}), 8, {2, kWidth}));
  }
  Var loss = scale(tape, narrow(tape, reshape(tape, x, {2 * kWidth}), 3, {1}), 1.0f);
  std::map<int, std::vector<float>> out;
  if (!early) {
    tape.backward(loss);
    for (std::size_t i = 0; i < leaves.size(); ++i) {
      Tensor g = tape.grad(leaves[i]);
      if (g.defined()) out[static_cast<int>(i)] = read_all(rt, g);
    }
    return out;
  }
  tape.backward(loss, [&](int node, Tensor g) {
    const int leaf = leaf_of_node.at(node);
    EXPECT_FALSE(out.contains(leaf)) << "leaf " << leaf << " handed over twice";
    out[leaf] = read_all(rt, g);
    order->emplace_back(leaf, rt.stats().calls);
  });
  for (const Var& v : leaves) EXPECT_FALSE(tape.grad(v).defined()) << "kept after hand-over";
  return out;
}

TEST(TapeTest, EarlyLeafGradientsHaveTheBitsOfAPlainBackwardPass) {
  std::mt19937 rng(20261127);
  int handed_before_the_end = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const Program p = random_program(rng);
    std::vector<std::pair<int, std::size_t>> order;
    const std::map<int, std::vector<float>> plain = gradients(p, false, nullptr);
    const std::map<int, std::vector<float>> early = gradients(p, true, &order);
    ASSERT_EQ(plain.size(), early.size()) << "trial " << trial;
    for (const auto& [leaf, g] : plain) {
      ASSERT_TRUE(early.contains(leaf)) << "trial " << trial << " leaf " << leaf;
      ASSERT_EQ(0, std::memcmp(g.data(), early.at(leaf).data(), g.size() * sizeof(float)))
          << "trial " << trial << " leaf " << leaf;
    }
    for (std::size_t i = 0; i + 1 < order.size(); ++i)
      handed_before_the_end += order[i].second < order.back().second ? 1 : 0;
  }
  // Programs with several parameters read at different depths hand the deeper ones over
  // while ops of the backward pass are still to run.
  EXPECT_GT(handed_before_the_end, 50);
}

// Two (kWidth, kWidth) leaves of ones and an input, on a tape of their own.
class TwoLeavesTest : public ::testing::Test {
 protected:
  Var leaf() {
    return tape.leaf(rt.constant(TensorSpec{{kWidth, kWidth}, DType::kF32}, ones.data()));
  }
  // The leaves' nodes in the order the backward pass of `h`'s first element hands them over.
  std::vector<int> handed_over(const Var& h) {
    Var loss = narrow(tape, reshape(tape, h, {2 * kWidth}), 0, {1});
    std::vector<int> handed;
    tape.backward(loss, [&](int node, Tensor) { handed.push_back(node); });
    return handed;
  }
  Runtime rt{RuntimeOptions{.backend = Backend::kCpu}};
  Tape tape{rt};
  const std::vector<float> ones = std::vector<float>(kWidth * kWidth, 1.0f);
  Var w0 = leaf(), w1 = leaf();
  Var x = tape.input(rt.constant(TensorSpec{{2, kWidth}, DType::kF32}, ones.data()));
};

TEST_F(TwoLeavesTest, ALeafIsHandedOverAfterItsFirstReaderRuns) {
  // w0 is read first and last: its gradient is final only at the end; w1's in the middle.
  Var h = linear(tape, linear(tape, linear(tape, x, w0, Var{}), w1, Var{}), w0, Var{});
  EXPECT_EQ(handed_over(h), (std::vector<int>{w1.node, w0.node}));
}

// A tape used for a second forward and backward pass hands its leaves over after their first
// readers in the second pass, not the first's.
TEST_F(TwoLeavesTest, ATapeUsedAgainHandsOverByItsNewRecords) {
  EXPECT_EQ(handed_over(linear(tape, linear(tape, x, w0, Var{}), w1, Var{})),
            (std::vector<int>{w1.node, w0.node}));
  EXPECT_EQ(handed_over(linear(tape, linear(tape, x, w1, Var{}), w0, Var{})),
            (std::vector<int>{w0.node, w1.node}));
}

}  // namespace
}  // namespace remat::ad
