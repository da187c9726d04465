// A multi-layer perceptron classifying random vectors by a fixed random teacher: no dropout,
// no randomness in the step at all, so it is the correctness anchor of the examples.
#ifndef REMAT_EXAMPLES_MLP_MODEL_H_
#define REMAT_EXAMPLES_MLP_MODEL_H_

#include "examples/common/trainer.h"

namespace remat::examples {

struct MlpConfig {
  std::int64_t batch = 2048, in = 64, hidden = 256, layers = 6, classes = 10;
};

class MlpModel final : public Model {
 public:
  explicit MlpModel(MlpConfig c = {}) : c_(c) {}
  std::string name() const override { return "mlp_train"; }
  void add_flags(cli::FlagSet& flags) override;
  std::vector<HostTensor> init_params(std::uint64_t seed) const override;
  ad::Var loss(ad::Tape& tape, const std::vector<ad::Var>& params,
               const std::vector<Tensor>& buffers, int step, std::uint64_t seed) override;
  double items(int, std::uint64_t) const override { return static_cast<double>(c_.batch); }

 private:
  MlpConfig c_;
};

}  // namespace remat::examples

#endif  // REMAT_EXAMPLES_MLP_MODEL_H_
