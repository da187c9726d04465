// A binary Tree-LSTM (Tai et al. 2015, the N-ary form with N = 2) classifying random trees of
// tokens: every sample has its own tree shape, so the graph differs sample to sample and step
// to step (the truly dynamic case). Leaves embed their token; an internal node computes
// input, two forget, output and update gates from its children's hidden states.
#ifndef REMAT_EXAMPLES_TREELSTM_MODEL_H_
#define REMAT_EXAMPLES_TREELSTM_MODEL_H_

#include "examples/common/trainer.h"

namespace remat::examples {

struct TreeLstmConfig {
  std::int64_t trees = 16, hidden = 64, vocab = 64, classes = 5, min_leaves = 4, max_leaves = 24;
};

// One step's trees: each one's tokens (its leaves, in order) and label, and the positions at
// which adjacent nodes merge, level by level, until one root is left.
struct StepTrees {
  std::vector<std::vector<std::int32_t>> leaves;
  std::vector<std::int32_t> labels;
  std::vector<std::vector<std::size_t>> merges;
};

class TreeLstmModel final : public Model {
 public:
  explicit TreeLstmModel(TreeLstmConfig c = {}) : c_(c) {}
  std::string name() const override { return "treelstm_train"; }
  void add_flags(cli::FlagSet& flags) override;
  absl::Status check_flags() const override;
  std::vector<HostTensor> init_params(std::uint64_t seed) const override;
  ad::Var loss(ad::Tape& tape, const std::vector<ad::Var>& params,
               const std::vector<Tensor>& buffers, int step, std::uint64_t seed) override;
  double items(int, std::uint64_t) const override { return static_cast<double>(c_.trees); }
  PlanCache::Key shape_key(int step, std::uint64_t seed) const override;
  StepTrees trees(int step, std::uint64_t seed) const;

 private:
  TreeLstmConfig c_;
};

}  // namespace remat::examples

#endif  // REMAT_EXAMPLES_TREELSTM_MODEL_H_
