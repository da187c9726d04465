// The op library's convolution, pooling and optimizer ops.
#include "kernels/ops.h"

#include <absl/strings/str_cat.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "kernels/detail/op_definition.h"

namespace remat::ops {

using namespace detail;  // NOLINT(google-build-using-namespace): the op library's helpers

// ---------------------------------------------------------------------------------------
// Convolution and pooling

namespace {
struct ConvDims {
  i64 n, ic, h, w, oc, kh, kw, oh, ow;
};
ConvDims conv_dims(const std::string& name, SpecList in, int x, int w, i64 stride, i64 pad) {
  const auto& xs = in[static_cast<std::size_t>(x)].shape;
  const auto& ws = in[static_cast<std::size_t>(w)].shape;
  require(xs.size() == 4 && ws.size() == 4 && xs[1] == ws[1] && stride > 0 && pad >= 0, name, in,
          "needs x (N, IC, H, W) and w (OC, IC, KH, KW)");
  ConvDims d{xs[0], xs[1], xs[2], xs[3], ws[0], ws[2], ws[3], 0, 0};
  d.oh = (d.h + 2 * pad - d.kh) / stride + 1;
  d.ow = (d.w + 2 * pad - d.kw) / stride + 1;
  require(d.oh > 0 && d.ow > 0, name, in, "the kernel is larger than the padded input");
  return d;
}
double conv_flops(const ConvDims& d) { return 2.0 * d.n * d.oc * d.oh * d.ow * d.ic * d.kh * d.kw; }
TensorSpec cols_spec(const ConvDims& d) { return f32({d.ic * d.kh * d.kw * d.oh * d.ow}); }
}  // namespace

// The im2col scratch is a second output, dropped at once: its bytes go through the budget
// like any other, instead of a side allocation the budget cannot see.
Tensor conv2d(Runtime& rt, const Tensor& x, const Tensor& w, const Tensor& b, i64 stride, i64 pad) {
  const bool bias = b.defined();
  auto op = define(
      "conv2d",
      [=](SpecList in) {
        const ConvDims d = conv_dims("conv2d", in, 0, 1, stride, pad);
        if (bias) require(in[2].numel() == d.oc, "conv2d", in, "bias must have OC elements");
        return Outputs{{f32({d.n, d.oc, d.oh, d.ow})}, {cols_spec(d)}};
      },
      [=](SpecList in) {
        const ConvDims d = conv_dims("conv2d", in, 0, 1, stride, pad);
        return OpWork{conv_flops(d), fbytes(in) + 4.0 * d.n * d.oc * d.oh * d.ow};
      },
      [=](auto be, const KernelContext& k) {
        const auto& xs = k.input_spec(0).shape;
        const auto& ws = k.input_spec(1).shape;
        be.conv2d_forward(k.input<float>(0), k.input<float>(1), bias ? k.input<float>(2) : nullptr,
                          k.output<float>(0), k.output<float>(1), xs[0], xs[1], xs[2], xs[3], ws[0],
                          ws[2], ws[3], stride, pad);
      });
  if (bias) return run(rt, op, {x, w, b}).at(0);
  return run(rt, op, {x, w}).at(0);
}

Conv2dGrads conv2d_backward(Runtime& rt, const Tensor& dy, const Tensor& x, const Tensor& w,
                            bool has_bias, bool need_dx, i64 stride, i64 pad) {
  auto op = define(
      "conv2d_backward",
      [=](SpecList in) {
        const ConvDims d = conv_dims("conv2d_backward", in, 1, 2, stride, pad);
        Outputs o;
        if (need_dx) o.emplace_back(in[1]);
        o.emplace_back(in[2]);
        if (has_bias) o.emplace_back(f32({d.oc}));
        o.emplace_back(cols_spec(d));
        return o;
      },
      [=](SpecList in) {
        const ConvDims d = conv_dims("conv2d_backward", in, 1, 2, stride, pad);
        return OpWork{(need_dx ? 2 : 1) * conv_flops(d), 2 * fbytes(in)};
      },
      [=](auto be, const KernelContext& k) {
        const auto& xs = k.input_spec(1).shape;
        const auto& ws = k.input_spec(2).shape;
        std::size_t o = 0;
        float* dx = need_dx ? k.output<float>(o++) : nullptr;
        float* dw = k.output<float>(o++);
        float* db = has_bias ? k.output<float>(o++) : nullptr;
        float* cols = k.output<float>(o++);
        be.conv2d_backward(k.input<float>(0), k.input<float>(1), k.input<float>(2), dx, dw, db,
                           cols, xs[0], xs[1], xs[2], xs[3], ws[0], ws[2], ws[3], stride, pad);
      });
  auto out = run(rt, op, {dy, x, w});
  Conv2dGrads g;
  std::size_t o = 0;
  if (need_dx) g.dx = out[o++];
  g.dw = out[o++];
  if (has_bias) g.db = out[o++];
  return g;
}

MaxPoolOut maxpool2d(Runtime& rt, const Tensor& x, i64 kernel, i64 s) {
  auto op = define(
      "maxpool2d",
      [=](SpecList in) {
        const auto& xs = in[0].shape;
        require(in[0].dtype == DType::kF32 && xs.size() == 4 && kernel > 0 && s > 0 &&
                    xs[2] >= kernel && xs[3] >= kernel,
                "maxpool2d", in, "needs x (N, C, H, W) at least the window's size");
        const std::vector<i64> o{xs[0], xs[1], (xs[2] - kernel) / s + 1, (xs[3] - kernel) / s + 1};
        return Outputs{{f32(o)}, {TensorSpec{o, DType::kI32}}};
      },
      [=](SpecList in) {
        return OpWork{static_cast<double>(in[0].numel()) * kernel * kernel / (s * s),
                      1.5 * fbytes(in)};
      },
      [=](auto be, const KernelContext& k) {
        const auto& xs = k.input_spec(0).shape;
        be.maxpool2d_forward(k.input<float>(0), k.output<float>(0), k.output<std::int32_t>(1),
                             xs[0], xs[1], xs[2], xs[3], kernel, s);
      });
  auto out = run(rt, op, {x});
  return {out[0], out[1]};
}

Tensor maxpool2d_backward(Runtime& rt, const Tensor& dy, const Tensor& argmax, const TensorSpec& x,
                          i64 kernel, i64 s) {
  auto op = define(
      "maxpool2d_backward", [x](SpecList) { return Outputs{{x}}; },
      [x](SpecList in) {
        return OpWork{static_cast<double>(x.numel()), fbytes(in) + x.bytes()};
      },
      [=](auto be, const KernelContext& k) {
        const auto& xs = x.shape;
        be.maxpool2d_backward(k.input<float>(0), k.input<std::int32_t>(1), k.output<float>(0),
                              xs[0], xs[1], xs[2], xs[3], kernel, s);
      });
  return run1(rt, op, {dy, argmax});
}

Tensor avgpool(Runtime& rt, const Tensor& x) {
  const OpPtr& op = cached([] {
    return define(
        "avgpool",
        [](SpecList in) {
          require(in[0].dtype == DType::kF32 && in[0].shape.size() == 4, "avgpool", in,
                  "needs x (N, C, H, W)");
          return Outputs{{f32({in[0].shape[0], in[0].shape[1]})}};
        },
        elementwise_work,
        [](auto be, const KernelContext& k) {
          const auto& xs = k.input_spec(0).shape;
          be.avgpool_forward(k.input<float>(0), k.output<float>(0), xs[0], xs[1], xs[2] * xs[3]);
        });
  });
  return run1(rt, op, {x});
}

Tensor avgpool_backward(Runtime& rt, const Tensor& dy, const TensorSpec& x) {
  auto op = define(
      "avgpool_backward", [x](SpecList) { return Outputs{{x}}; },
      [x](SpecList) {
        return OpWork{static_cast<double>(x.numel()), 1.25 * x.bytes()};
      },
      [x](auto be, const KernelContext& k) {
        be.avgpool_backward(k.input<float>(0), k.output<float>(0), x.shape[0], x.shape[1],
                            x.shape[2] * x.shape[3]);
      });
  return run1(rt, op, {dy});
}

// ---------------------------------------------------------------------------------------
// Optimizer

void adamw(Runtime& rt, const Tensor& param, const Tensor& m, const Tensor& v, const Tensor& grad,
           const AdamW& hp, int t) {
  auto op = define(
      "adamw",
      [](SpecList in) {
        for (std::size_t i = 1; i < 4; ++i)
          require(in[i].numel() == in[0].numel(), "adamw", in, "param, m, v, grad must agree");
        return Outputs{};
      },
      [](SpecList in) {
        return OpWork{10.0 * in[0].numel(), 7.0 * in[0].bytes()};
      },
      [hp, t](auto be, const KernelContext& k) {
        be.adamw_update(k.output<float>(0), k.output<float>(1), k.output<float>(2),
                        k.input<float>(3), k.input_spec(0).numel(), hp.lr, hp.beta1, hp.beta2,
                        hp.eps, hp.weight_decay, t);
      });
  run_update(rt, op, {param, m, v, grad}, {0, 1, 2});
}

}  // namespace remat::ops
