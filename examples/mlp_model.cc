#include "examples/mlp_model.h"

#include <cmath>

#include "examples/common/random.h"

namespace remat::examples {

void MlpModel::add_flags(cli::FlagSet& flags) {
  flags.add("batch", &c_.batch, "examples per step", 1);
  flags.add("in", &c_.in, "input features", 1);
  flags.add("hidden", &c_.hidden, "width of the hidden layers", 1);
  flags.add("layers", &c_.layers, "hidden layers", 1);
  flags.add("classes", &c_.classes, "output classes", 2);
}

std::vector<HostTensor> MlpModel::init_params(std::uint64_t seed) const {
  SplitMix rng(seed, 0x31F);
  std::vector<HostTensor> p;
  std::int64_t fan_in = c_.in;
  for (std::int64_t l = 0; l <= c_.layers; ++l) {
    const std::int64_t out = l == c_.layers ? c_.classes : c_.hidden;
    const float std = std::sqrt(2.0f / static_cast<float>(fan_in));
    p.push_back(
        {"w", TensorSpec{{out, fan_in}, DType::kF32}, normal_values(out * fan_in, std, rng)});
    p.push_back({"b", TensorSpec{{out}, DType::kF32}, constant_values(out, 0.0f)});
    fan_in = out;
  }
  return p;
}

ad::Var MlpModel::loss(ad::Tape& tape, const std::vector<ad::Var>& params,
                       const std::vector<Tensor>&, int step, std::uint64_t seed) {
  Runtime& rt = tape.rt();
  // Inputs drawn per step; labels from a teacher fixed by the seed.
  SplitMix data(seed, 0xDA7A + static_cast<std::uint64_t>(step));
  SplitMix teacher_rng(seed, 0x7EAC);
  const std::vector<float> x = normal_values(c_.batch * c_.in, 1.0f, data);
  const std::vector<float> teacher = normal_values(c_.classes * c_.in, 1.0f, teacher_rng);
  std::vector<std::int32_t> labels(static_cast<std::size_t>(c_.batch));
  for (std::int64_t b = 0; b < c_.batch; ++b) {
    float best = -INFINITY;
    for (std::int64_t k = 0; k < c_.classes; ++k) {
      float s = 0;
      for (std::int64_t i = 0; i < c_.in; ++i)
        s += teacher[static_cast<std::size_t>(k * c_.in + i)] *
             x[static_cast<std::size_t>(b * c_.in + i)];
      if (s > best) {
        best = s;
        labels[static_cast<std::size_t>(b)] = static_cast<std::int32_t>(k);
      }
    }
  }
  const bool runs = rt.options().backend != Backend::kSimulated;
  ad::Var h = tape.input(
      rt.constant(TensorSpec{{c_.batch, c_.in}, DType::kF32}, runs ? x.data() : nullptr));
  Tensor tgt = rt.constant(TensorSpec{{c_.batch}, DType::kI32}, runs ? labels.data() : nullptr);
  for (std::int64_t l = 0; l <= c_.layers; ++l) {
    h = ad::linear(tape, h, params[static_cast<std::size_t>(2 * l)],
                   params[static_cast<std::size_t>(2 * l + 1)]);
    if (l < c_.layers) h = ad::relu(tape, h);
  }
  return ad::cross_entropy_mean(tape, h, tgt);
}

}  // namespace remat::examples
