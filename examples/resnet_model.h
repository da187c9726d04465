// A CIFAR-shaped ResNet (He et al. 2016, the 6n+2 family): a 3x3 stem, three stages of basic
// blocks (conv, batch norm, ReLU) with stride-2 projection shortcuts, global average pooling
// and a linear classifier, on generated 32x32 images. Batch norm runs in training mode; its
// running statistics are pinned buffers updated once per step.
#ifndef REMAT_EXAMPLES_RESNET_MODEL_H_
#define REMAT_EXAMPLES_RESNET_MODEL_H_

#include "examples/common/trainer.h"

namespace remat::examples {

struct ResnetConfig {
  std::int64_t batch = 16, blocks = 1, width = 16, image = 32, classes = 10;
};

class ResnetModel final : public Model {
 public:
  explicit ResnetModel(ResnetConfig c = {}) : c_(c) {}
  std::string name() const override { return "resnet_train"; }
  void add_flags(cli::FlagSet& flags) override;
  std::vector<HostTensor> init_params(std::uint64_t seed) const override;
  std::vector<HostTensor> init_buffers() const override;
  ad::Var loss(ad::Tape& tape, const std::vector<ad::Var>& params,
               const std::vector<Tensor>& buffers, int step, std::uint64_t seed) override;
  double items(int, std::uint64_t) const override { return static_cast<double>(c_.batch); }

 private:
  // One conv + batch norm (+ ReLU) layer as the model lays them out.
  struct Layer {
    std::int64_t in, out, k, stride, pad;
  };
  std::vector<Layer> layers() const;
  ResnetConfig c_;
};

}  // namespace remat::examples

#endif  // REMAT_EXAMPLES_RESNET_MODEL_H_
