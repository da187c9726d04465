// A LibTorch loop on remat's device against the same loop on the CPU.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "remat/torch.h"

namespace {

struct TrainingRun {
  std::vector<torch::Tensor> losses;
  std::vector<torch::Tensor> parameters;
};

torch::nn::Sequential make_net() {
  torch::manual_seed(3);
  torch::nn::Sequential net(torch::nn::Linear(16, 128), torch::nn::ReLU());
  for (int layer = 0; layer < 8; ++layer) {
    net->push_back(torch::nn::Linear(128, 128));
    net->push_back(torch::nn::Tanh());
    net->push_back(torch::nn::Linear(128, 128));
    net->push_back(torch::nn::Sigmoid());
  }
  net->push_back(torch::nn::Linear(128, 4));
  return net;
}

TrainingRun train(const torch::Device& device, int steps, double momentum = 0) {
  torch::nn::Sequential net = make_net();
  remat::torch_backend::move_module(*net, device);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.05).momentum(momentum));
  torch::manual_seed(11);
  TrainingRun result;
  for (int step = 0; step < steps; ++step) {
    torch::Tensor x = torch::randn({1024, 16});
    torch::Tensor y = torch::randn({1024, 4});
    remat::torch_backend::StepScope scope;
    sgd.zero_grad();
    torch::Tensor loss = torch::mse_loss(net->forward(x.to(device)), y.to(device));
    loss.backward();
    sgd.step();
    result.losses.push_back(loss.detach().to(torch::kCPU));
  }
  for (const torch::Tensor& p : net->parameters())
    result.parameters.push_back(p.detach().to(torch::kCPU));
  return result;
}

void expect_bitwise(const TrainingRun& a, const TrainingRun& b) {
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (std::size_t i = 0; i < a.losses.size(); ++i)
    EXPECT_TRUE(torch::equal(a.losses[i], b.losses[i])) << "loss " << i;
  ASSERT_EQ(a.parameters.size(), b.parameters.size());
  for (std::size_t i = 0; i < a.parameters.size(); ++i)
    EXPECT_TRUE(torch::equal(a.parameters[i], b.parameters[i])) << "parameter " << i;
}

// Trains `steps` steps unconstrained on the device, checked against `cpu`, and returns the
// budget at each fraction of the activations' bytes above the parameters and gradients,
// measured by the allocator's peak of live bytes (reserved bytes round up to segments).
std::vector<std::size_t> budgets_after_an_unconstrained_run(const TrainingRun& cpu, int steps,
                                                            std::vector<double> fractions,
                                                            double momentum = 0) {
  remat::torch_backend::set_budget(SIZE_MAX);
  remat::torch_backend::reset_peaks();
  expect_bitwise(train(remat::torch_backend::device(), steps, momentum), cpu);
  const std::size_t peak = remat::torch_backend::stats().memory.peak_allocated;
  std::size_t fixed = 0;  // parameters, their gradients and momentum
  for (const torch::Tensor& p : make_net()->parameters())
    fixed += (momentum > 0 ? 3 : 2) * p.nbytes();
  EXPECT_GT(peak, fixed);
  std::vector<std::size_t> budgets;
  for (double f : fractions)
    budgets.push_back(static_cast<std::size_t>(fixed + f * static_cast<double>(peak - fixed)));
  return budgets;
}

// Each test ends with what the execution saw go wrong in the device's memory checked: under
// REMAT_TORCH_EXECUTION=simulated_cuda, no race and no invalid access (Note [Executions]).
class TorchBackend : public ::testing::Test {
 protected:
  void SetUp() override { remat::torch_backend::clear_execution_problems(); }
  void TearDown() override {
    EXPECT_EQ(remat::torch_backend::execution_problems(), std::vector<std::string>{});
  }
};

TEST_F(TorchBackend, SequentialWithSgdTrainsBitwiseUnderABudget) {
  const TrainingRun cpu = train(torch::kCPU, 4);
  const std::vector<double> fractions = {0.5, 0.3};
  const std::vector<std::size_t> budgets = budgets_after_an_unconstrained_run(cpu, 4, fractions);
  for (std::size_t k = 0; k < fractions.size(); ++k) {
    const double fraction = fractions[k];
    const std::size_t budget = budgets[k];
    remat::torch_backend::set_budget(budget);
    remat::torch_backend::reset_peaks();
    const std::size_t recomputed = remat::torch_backend::stats().recomputations;
    expect_bitwise(train(remat::torch_backend::device(), 4), cpu);
    const remat::RuntimeStats stats = remat::torch_backend::stats();
    EXPECT_LE(stats.memory.peak_reserved, budget) << "fraction " << fraction;
    EXPECT_GT(stats.recomputations, recomputed) << "fraction " << fraction;
  }
  remat::torch_backend::set_budget(SIZE_MAX);
}

// Policy auto on the same loop: the marked steps warm up, are recorded, planned and followed
// where a plan beats DTR; a plan may defer ops (Note [Following a schedule]), and eager and
// random ones still run when called. Results stay bitwise.
TEST_F(TorchBackend, PlannedStepsTrainBitwise) {
  const TrainingRun cpu = train(torch::kCPU, 5);
  const std::size_t budget = budgets_after_an_unconstrained_run(cpu, 5, {0.3}).front();
  remat::torch_backend::set_policy("auto");
  EXPECT_EQ(remat::torch_backend::policy(), "auto");
  remat::torch_backend::set_budget(budget);
  remat::torch_backend::reset_peaks();
  expect_bitwise(train(remat::torch_backend::device(), 5), cpu);
  const remat::torch_backend::PlanReport report = remat::torch_backend::plan_report();
  EXPECT_EQ(report.steps, 5);
  EXPECT_TRUE(report.phase == "plan" || report.phase == "dtr") << report.phase;
  ASSERT_FALSE(report.screened.empty());
  EXPECT_EQ(report.screened.front().source, "dtr");
  EXPECT_LE(remat::torch_backend::stats().memory.peak_reserved, budget);
  remat::torch_backend::set_budget(SIZE_MAX);
  remat::torch_backend::set_policy("dtr");
}

// Note [State waits on the host]: the momentum buffers leave the device while a marked step
// does not read them, and come back for the optimizer's step; results stay bitwise.
TEST_F(TorchBackend, MomentumWaitsOnTheHostAndTrainsBitwise) {
  const TrainingRun cpu = train(torch::kCPU, 4, 0.9);
  remat::torch_backend::set_host_memory(std::size_t{64} << 20);  // before any device tensor
  const std::size_t budget = budgets_after_an_unconstrained_run(cpu, 4, {0.3}, 0.9).front();
  remat::torch_backend::set_budget(budget);
  remat::torch_backend::reset_peaks();
  const std::size_t offloads = remat::torch_backend::stats().offloads;
  expect_bitwise(train(remat::torch_backend::device(), 4, 0.9), cpu);
  const remat::RuntimeStats stats = remat::torch_backend::stats();
  EXPECT_LE(stats.memory.peak_reserved, budget);
  // Every momentum buffer, at the first operator of each step after the one that made them.
  const std::size_t buffers = make_net()->parameters().size();
  EXPECT_GE(stats.offloads - offloads, 2 * buffers);
  EXPECT_EQ(stats.restores, stats.offloads);  // the optimizer read each back
  remat::torch_backend::set_budget(SIZE_MAX);
  remat::torch_backend::set_host_memory(0);
}

// Note [Moves keep identity]: Module::to moves a LibTorch module in place, as it does to
// CUDA: the members (Linear::weight) and the parameter list keep naming one tensor, and the
// optimizer made before the move trains the moved parameters, bitwise against the CPU.
TEST_F(TorchBackend, ModuleToMovesParametersInPlace) {
  auto train_moved_by_to = [](const torch::Device& device) {
    torch::manual_seed(5);
    torch::nn::Linear first(16, 64), second(64, 4);
    torch::optim::SGD sgd({first->weight, first->bias, second->weight, second->bias}, 0.05);
    first->to(device);
    second->to(device);
    EXPECT_EQ(first->weight.device(), device);
    EXPECT_TRUE(first->weight.is_same(first->parameters()[0]));
    EXPECT_TRUE(sgd.param_groups()[0].params()[0].is_same(first->weight));
    torch::manual_seed(6);
    std::vector<torch::Tensor> losses;
    for (int step = 0; step < 3; ++step) {
      torch::Tensor x = torch::randn({32, 16}).to(device);
      sgd.zero_grad();
      torch::Tensor loss = second->forward(torch::tanh(first->forward(x))).square().mean();
      loss.backward();
      sgd.step();
      losses.push_back(loss.detach().to(torch::kCPU));
    }
    losses.push_back(first->weight.detach().to(torch::kCPU));
    return losses;
  };
  const std::vector<torch::Tensor> cpu = train_moved_by_to(torch::kCPU);
  const std::vector<torch::Tensor> dev = train_moved_by_to(remat::torch_backend::device());
  ASSERT_EQ(cpu.size(), dev.size());
  for (std::size_t i = 0; i < cpu.size(); ++i) EXPECT_TRUE(torch::equal(cpu[i], dev[i])) << i;
}

}  // namespace
