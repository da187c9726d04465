// The worked example of docs/integrating.md: a small residual MLP trained by its own
// plain-C kernels (kernels.h), twice. ReferenceLoop is the loop as it was, on its own
// buffers; RematLoop is the same loop moved into remat, a remat::TrainingProgram whose
// kernels run through the runtime (matmul_backward through Runtime::call_accumulate, adding
// into the parameter gradients in place) and which the step driver runs under a budget. Both
// compute the same bits.
//
//   plain_c::Config config;
//   plain_c::ReferenceLoop reference(config);
//   for (int step = 0; step < 6; ++step) reference.step(step);
//   plain_c::RematLoop loop(config);
//   remat::StepDriver driver(loop, options);
//   for (int step = 0; step < 6; ++step) driver.run(step);
//   loop.losses(driver.state()) == reference.losses();  // bit for bit
#ifndef REMAT_EXAMPLES_PLAIN_C_MODEL_H_
#define REMAT_EXAMPLES_PLAIN_C_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "remat/step_driver.h"

namespace plain_c {

struct Config {
  int channels = 32;  // C
  int hidden = 64;    // H: each block is h + W2 gelu(W1 h + b1) + b2
  int blocks = 16;
  int classes = 16;
  std::vector<int> batches = {512, 384};  // step s has batches[s % size] rows
  float lr = 1e-3f;
  std::uint64_t seed = 7;
};

// The parameters' shapes, in order: per block W1 (H, C), b1 (H), W2 (C, H), b2 (C); then
// the classifier Wc (V, C), bc (V). Their initial values and each step's inputs come from
// (seed, step) alone.
std::vector<std::vector<std::int64_t>> parameter_shapes(const Config& c);
std::vector<std::vector<float>> initial_parameters(const Config& c);
void step_inputs(const Config& c, int step, std::vector<float>* x, std::vector<std::int32_t>* y);

// The loop as a plain-C program has it: every buffer its own.
class ReferenceLoop {
 public:
  explicit ReferenceLoop(Config config);
  float step(int step);  // zero the gradients, forward, backward, AdamW; returns the loss
  const std::vector<float>& losses() const { return losses_; }
  const std::vector<std::vector<float>>& parameters() const { return params_; }

 private:
  Config c_;
  std::vector<std::vector<float>> params_, grads_, m_, v_;
  std::vector<float> losses_;
};

// The same loop in remat: parameters, gradients and AdamW state are constants; activations
// are the runtime's, evicted and recomputed under the budget.
class RematLoop final : public remat::TrainingProgram {
 public:
  explicit RematLoop(Config config) : c_(std::move(config)) {}
  std::unique_ptr<State> make_state(remat::Runtime& rt) override;
  void run_step(remat::Runtime& rt, State& state, int step) override;
  remat::PlanCache::Key shape_key(int step) const override;
  std::string name() const override { return "plain_c"; }

  static const std::vector<float>& losses(const State& state);
  static std::vector<std::vector<float>> parameters(remat::Runtime& rt, const State& state);

 private:
  Config c_;
};

}  // namespace plain_c

#endif  // REMAT_EXAMPLES_PLAIN_C_MODEL_H_
