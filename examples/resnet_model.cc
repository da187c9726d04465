#include "examples/resnet_model.h"

#include <cmath>

#include "examples/common/random.h"

namespace remat::examples {

void ResnetModel::add_flags(cli::FlagSet& flags) {
  flags.add("batch", &c_.batch, "images per step (at least 2, for batch norm)", 2);
  flags.add("blocks", &c_.blocks, "residual blocks per stage (three stages)", 1);
  flags.add("width", &c_.width, "channels of the first stage (doubling per stage)", 1);
  flags.add("image", &c_.image, "image height and width", 8);
  flags.add("classes", &c_.classes, "output classes", 2);
}

// The conv layers in order: the stem, then per block its two 3x3 convs and, for the first
// block of stages 2 and 3, the 1x1 stride-2 projection.
std::vector<ResnetModel::Layer> ResnetModel::layers() const {
  std::vector<Layer> out{{3, c_.width, 3, 1, 1}};
  std::int64_t ch = c_.width;
  for (int stage = 0; stage < 3; ++stage) {
    const std::int64_t width = c_.width << stage;
    for (std::int64_t b = 0; b < c_.blocks; ++b) {
      const std::int64_t stride = (stage > 0 && b == 0) ? 2 : 1;
      out.push_back({ch, width, 3, stride, 1});
      out.push_back({width, width, 3, 1, 1});
      if (stride != 1 || ch != width) out.push_back({ch, width, 1, stride, 0});
      ch = width;
    }
  }
  return out;
}

std::vector<HostTensor> ResnetModel::init_params(std::uint64_t seed) const {
  SplitMix rng(seed, 0x4E5);
  std::vector<HostTensor> p;
  for (const Layer& l : layers()) {
    const float std = std::sqrt(2.0f / static_cast<float>(l.in * l.k * l.k));
    p.push_back({"conv", TensorSpec{{l.out, l.in, l.k, l.k}, DType::kF32},
                 normal_values(l.out * l.in * l.k * l.k, std, rng)});
    p.push_back({"gamma", TensorSpec{{l.out}, DType::kF32}, constant_values(l.out, 1.0f)});
    p.push_back({"beta", TensorSpec{{l.out}, DType::kF32}, constant_values(l.out, 0.0f)});
  }
  const std::int64_t ch = c_.width << 2;
  p.push_back({"fcw", TensorSpec{{c_.classes, ch}, DType::kF32},
               normal_values(c_.classes * ch, 1.0f / std::sqrt(static_cast<float>(ch)), rng)});
  p.push_back({"fcb", TensorSpec{{c_.classes}, DType::kF32}, constant_values(c_.classes, 0.0f)});
  return p;
}

std::vector<HostTensor> ResnetModel::init_buffers() const {
  std::vector<HostTensor> b;
  for (const Layer& l : layers()) {
    b.push_back({"running_mean", TensorSpec{{l.out}, DType::kF32}, constant_values(l.out, 0.0f)});
    b.push_back({"running_var", TensorSpec{{l.out}, DType::kF32}, constant_values(l.out, 1.0f)});
  }
  return b;
}

ad::Var ResnetModel::loss(ad::Tape& tape, const std::vector<ad::Var>& params,
                          const std::vector<Tensor>& buffers, int step, std::uint64_t seed) {
  Runtime& rt = tape.rt();
  const std::int64_t B = c_.batch, S = c_.image;
  // Images: a class-dependent colour gradient plus noise, so the task is learnable.
  SplitMix data(seed, 0x1A6E + static_cast<std::uint64_t>(step));
  std::vector<float> images(static_cast<std::size_t>(B * 3 * S * S));
  std::vector<std::int32_t> labels(static_cast<std::size_t>(B));
  for (std::int64_t b = 0; b < B; ++b) {
    const auto label =
        static_cast<std::int32_t>(data.below(static_cast<std::uint64_t>(c_.classes)));
    labels[static_cast<std::size_t>(b)] = label;
    for (std::int64_t c = 0; c < 3; ++c)
      for (std::int64_t i = 0; i < S * S; ++i)
        images[static_cast<std::size_t>((b * 3 + c) * S * S + i)] =
            static_cast<float>(std::sin(0.1 * (label + 1) * (c + 1) * static_cast<double>(i % S)) +
                               0.5 * data.normal());
  }
  const bool runs = rt.options().backend != Backend::kSimulated;
  ad::Var x = tape.input(
      rt.constant(TensorSpec{{B, 3, S, S}, DType::kF32}, runs ? images.data() : nullptr));
  Tensor tgt = rt.constant(TensorSpec{{B}, DType::kI32}, runs ? labels.data() : nullptr);

  const std::vector<Layer> ls = layers();
  std::size_t li = 0;
  // conv -> batch norm (running statistics updated now, once) -> optional ReLU
  auto conv_bn = [&](const ad::Var& in, bool relu) {
    const Layer& l = ls[li];
    const ad::Var* w = &params[3 * li];
    ad::Var h = ad::conv2d(tape, in, w[0], ad::Var{}, l.stride, l.pad);
    ad::BatchNormResult bn = ad::batchnorm(tape, h, w[1], w[2]);
    const auto& s = h.spec().shape;
    ops::batchnorm_running_update(rt, buffers[2 * li], buffers[2 * li + 1], bn.mean, bn.rstd,
                                  s[0] * s[2] * s[3]);
    ++li;
    return relu ? ad::relu(tape, bn.y) : bn.y;
  };
  x = conv_bn(x, true);
  std::int64_t ch = c_.width;
  for (int stage = 0; stage < 3; ++stage) {
    const std::int64_t width = c_.width << stage;
    for (std::int64_t b = 0; b < c_.blocks; ++b) {
      const bool project = (stage > 0 && b == 0) || ch != width;
      ad::Var h = conv_bn(x, true);
      h = conv_bn(h, false);
      ad::Var shortcut = project ? conv_bn(x, false) : x;
      x = ad::relu(tape, ad::add(tape, h, shortcut));
      ch = width;
    }
  }
  ad::Var pooled = ad::avgpool(tape, x);
  ad::Var logits = ad::linear(tape, pooled, params[3 * li], params[3 * li + 1]);
  return ad::cross_entropy_mean(tape, logits, tgt);
}

}  // namespace remat::examples
