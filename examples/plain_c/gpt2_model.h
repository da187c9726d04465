// A GPT-2 trained by its own plain-C kernels (kernels.h, gpt2_kernels.h), shaped like
// llm.c's train_gpt2.c, twice: Gpt2ReferenceLoop on its own buffers, and Gpt2RematLoop, the
// same loop as a remat::TrainingProgram whose kernels run through the runtime under a
// budget. Both make the same floating-point operations in the same order, so they compute
// the same bits (losses and final parameters).
//
// Per step: token and position embeddings; per layer ln1 -> qkv matmul -> causal
// attention -> projection matmul -> residual add -> ln2 -> fc matmul -> gelu -> fc
// projection matmul -> residual add; a final layernorm, the language-model head (a matmul
// with a weight and bias of its own, not tied to the token embedding) and crossentropy over
// every position; then the backward pass in reverse and AdamW on every parameter.
//
//   plain_c::Gpt2Config config;
//   plain_c::Gpt2ReferenceLoop reference(config);
//   for (int step = 0; step < 6; ++step) reference.step(step);
//   plain_c::Gpt2RematLoop loop(config);
//   remat::StepDriver driver(loop, options);
//   for (int step = 0; step < 6; ++step) driver.run(step);
//   plain_c::Gpt2RematLoop::losses(driver.state()) == reference.losses();  // bit for bit
#ifndef REMAT_EXAMPLES_PLAIN_C_GPT2_MODEL_H_
#define REMAT_EXAMPLES_PLAIN_C_GPT2_MODEL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "remat/step_driver.h"

namespace plain_c {

struct Gpt2Config {
  int batch = 4;       // B
  int seq = 128;       // T: every step's sequences, and the rows of the position embedding
  int layers = 4;      // L
  int channels = 128;  // C
  int heads = 4;       // NH, dividing C
  int vocab = 512;     // V
  float lr = 1e-3f;
  std::uint64_t seed = 7;  // of the initial parameters and the token stream
  // Gpt2RematLoop: keep AdamW's moments in host memory between updates (Runtime::offload),
  // outside the budget. The runtime needs RuntimeOptions::host_memory_bytes for them
  // (Gpt2RematLoop::moment_bytes); without it they stay on the device.
  bool moments_on_host = false;
};

// Empty when `c` can be trained; otherwise what is wrong with it, in a phrase.
std::string gpt2_config_error(const Gpt2Config& c);

// The parameters, in order: wte (V, C), wpe (T, C); per layer ln1 weight and bias (C), qkv
// weight (3C, C) and bias (3C), attention projection weight (C, C) and bias (C), ln2 weight
// and bias (C), fc weight (4C, C) and bias (4C), fc projection weight (C, 4C) and bias (C);
// then the final layernorm's weight and bias (C) and the head's weight (V, C) and bias (V).
std::vector<std::vector<std::int64_t>> gpt2_parameter_shapes(const Gpt2Config& c);
// Drawn from `seed` alone: matrices and embeddings uniform with standard deviation 0.02 (the
// two projections into the residual stream scaled by 1 / sqrt(2L), as GPT-2 does),
// layernorm weights 1, biases 0.
std::vector<std::vector<float>> gpt2_initial_parameters(const Gpt2Config& c);
std::size_t gpt2_parameter_count(const Gpt2Config& c);
// Step `step`'s inputs (B, T) and targets (B, T), in [0, V): each row a window of a byte
// stream of made-up text, its start drawn from (seed, step); the targets are the inputs
// shifted by one position.
void gpt2_step_tokens(const Gpt2Config& c, int step, std::vector<std::int32_t>* inputs,
                      std::vector<std::int32_t>* targets);

// The loop as a plain-C program has it: every buffer its own.
class Gpt2ReferenceLoop {
 public:
  explicit Gpt2ReferenceLoop(Gpt2Config config);
  float step(int step);  // zero the gradients, forward, backward, AdamW; returns the loss
  const std::vector<float>& losses() const { return losses_; }
  const std::vector<std::vector<float>>& parameters() const { return params_; }

 private:
  struct Layer;
  std::vector<float> layer_forward(int l, Layer& a);  // reads a.x, fills a; returns the output
  std::vector<float> layer_backward(int l, const Layer& a, const std::vector<float>& dout);

  Gpt2Config c_;
  std::vector<std::vector<float>> params_, grads_, m_, v_;
  std::vector<float> losses_;
};

// The same loop in remat: parameters, gradients and AdamW's moments are constants, every
// kernel an op; activations are the runtime's, evicted and recomputed under the budget.
class Gpt2RematLoop final : public remat::TrainingProgram {
 public:
  explicit Gpt2RematLoop(Gpt2Config config) : c_(std::move(config)) {}
  std::unique_ptr<State> make_state(remat::Runtime& rt) override;
  void run_step(remat::Runtime& rt, State& state, int step) override;
  remat::PlanCache::Key shape_key(int step) const override;
  std::string name() const override { return "plain_c_gpt2"; }

  // Bytes of AdamW's two moments together: what moments_on_host keeps on the host.
  std::size_t moment_bytes() const { return 2 * sizeof(float) * gpt2_parameter_count(c_); }

  static const std::vector<float>& losses(const State& state);
  static std::vector<std::vector<float>> parameters(remat::Runtime& rt, const State& state);
  // The moments (m and v of every parameter) whose bytes are in host memory now.
  static std::size_t offloaded_moments(const remat::Runtime& rt, const State& state);

 private:
  Gpt2Config c_;
};

}  // namespace plain_c

#endif  // REMAT_EXAMPLES_PLAIN_C_GPT2_MODEL_H_
