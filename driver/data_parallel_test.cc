// RankStep (remat/data_parallel.h) in one process: work runs and throws as it would without
// it; where kernels run, a sum is a new tensor of the same bits; on the simulated backend,
// one of the same spec, nothing exchanged. Ranks: data_parallel_mpi_test.cc (ctest runs it
// under mpirun) and examples/data_parallel_check.py (gpt_train).
#include "remat/data_parallel.h"

#include <gtest/gtest.h>

#include <cstring>
#include <stdexcept>
#include <vector>

#include "kernels/ops.h"

namespace remat {
namespace {

std::vector<remat::Tensor> forward_and_backward(Runtime& rt, const std::vector<float>& values) {
  return {rt.constant({{4}}, values.data())};
}

// The usage example atop remat/data_parallel.h, with gradients of its own making.
TEST(DataParallelTest, HeaderExample) {
  Runtime rt(RuntimeOptions{});
  std::unique_ptr<Collectives> c = single_process_collectives();
  Collectives& collectives = *c;
  const std::vector<float> values = {0.5f, -3.0f, 1e-7f, 42.0f};
  auto update = [](const std::vector<remat::Tensor>&) {};

  remat::RankStep ranks(rt, &collectives);  // null collectives: this process alone
  std::vector<remat::Tensor> grads;
  ranks.run([&] { grads = forward_and_backward(rt, values); });  // an error is kept, not thrown
  ranks.agree();                                                 // so every rank has every gradient
  for (remat::Tensor& g : grads) {
    g = ranks.all_reduce_sum(g);  // every rank's, summed in rank order
    ranks.run([&] { g = remat::ops::scale(rt, g, 0.5f); });
  }
  ranks.run([&] { update(grads); });
  ranks.agree();  // throws on every rank where one failed

  std::vector<float> out(4);
  rt.read(grads[0], out.data());
  for (std::size_t i = 0; i < out.size(); ++i) EXPECT_EQ(out[i], values[i] * 0.5f);
}

TEST(DataParallelTest, AloneWorkThrowsAsItWouldWithoutIt) {
  Runtime rt(RuntimeOptions{});
  std::unique_ptr<Collectives> c = single_process_collectives();
  RankStep ranks(rt, c.get());
  EXPECT_FALSE(ranks.exchanges());
  EXPECT_THROW(ranks.run([] { throw std::runtime_error("kernel failed"); }), std::runtime_error);
  EXPECT_EQ(ranks.all_gather(std::vector<float>{1.0f, 2.0f}), (std::vector<float>{1.0f, 2.0f}));
}

TEST(DataParallelTest, OnTheSimulatedBackendMakesATensorOfTheSameSpec) {
  RuntimeOptions options;
  options.backend = Backend::kSimulated;
  Runtime rt(options);
  RankStep ranks(rt, nullptr);
  const Tensor t = rt.constant({{3, 5}});
  const Tensor sum = ranks.all_reduce_sum(t);
  EXPECT_EQ(sum.spec(), t.spec());
  EXPECT_NE(sum.id(), t.id());
  EXPECT_TRUE(ranks.all_gather(std::vector<float>{1.0f}).empty());
}

TEST(DataParallelTest, RefusesTensorsThatAreNotFloat32) {
  Runtime rt(RuntimeOptions{});
  RankStep ranks(rt, nullptr);
  const std::vector<std::int32_t> labels = {1, 2};
  const Tensor t = rt.constant({{2}, DType::kI32}, labels.data());
  EXPECT_THROW(ranks.all_reduce_sum(t), std::invalid_argument);
}

}  // namespace
}  // namespace remat
