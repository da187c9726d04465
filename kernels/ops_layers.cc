// The op library's layers: normalisation, attention, embedding, the loss, dropout.
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
// Normalisation

LayerNormOut layernorm(Runtime& rt, const Tensor& x, const Tensor& w, const Tensor& b, float eps) {
  auto op = define(
      "layernorm",
      [](SpecList in) {
        require_f32("layernorm", in, {0, 1, 2});
        require(in[1].numel() == last(in[0]) && in[2].numel() == last(in[0]), "layernorm", in,
                "weight and bias must match the last dimension");
        std::vector<i64> stat(in[0].shape.begin(), in[0].shape.end() - 1);
        return Outputs{{in[0]}, {f32(stat)}, {f32(stat)}};
      },
      [](SpecList in) {
        return OpWork{8.0 * in[0].numel(), 2 * fbytes(in)};
      },
      [eps](auto be, const KernelContext& k) {
        be.layernorm_forward(k.input<float>(0), k.input<float>(1), k.input<float>(2),
                             k.output<float>(0), k.output<float>(1), k.output<float>(2),
                             rows(k.input_spec(0)), last(k.input_spec(0)), eps);
      });
  auto out = run(rt, op, {x, w, b});
  return {out[0], out[1], out[2]};
}

LayerNormGrads layernorm_backward(Runtime& rt, const Tensor& dy, const Tensor& x, const Tensor& w,
                                  const Tensor& mean, const Tensor& rstd) {
  const OpPtr& op = cached([] {
    return define(
        "layernorm_backward",
        [](SpecList in) {
          require_f32("layernorm_backward", in, {0, 1, 2, 3, 4});
          require(in[0] == in[1], "layernorm_backward", in, "dy and x must have one shape");
          return Outputs{{in[1]}, {in[2]}, {in[2]}};
        },
        [](SpecList in) {
          return OpWork{12.0 * in[0].numel(), 2 * fbytes(in)};
        },
        [](auto be, const KernelContext& k) {
          be.layernorm_backward(k.input<float>(0), k.input<float>(1), k.input<float>(2),
                                k.input<float>(3), k.input<float>(4), k.output<float>(0),
                                k.output<float>(1), k.output<float>(2), rows(k.input_spec(1)),
                                last(k.input_spec(1)));
        });
  });
  auto out = run(rt, op, {dy, x, w, mean, rstd});
  return {out[0], out[1], out[2]};
}

BatchNormOut batchnorm(Runtime& rt, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                       float eps) {
  auto op = define(
      "batchnorm",
      [](SpecList in) {
        require_f32("batchnorm", in, {0, 1, 2});
        require(in[0].shape.size() == 4, "batchnorm", in, "x must be (N, C, H, W)");
        const i64 c = in[0].shape[1];
        require(in[1].numel() == c && in[2].numel() == c, "batchnorm", in,
                "gamma and beta must have C elements");
        return Outputs{{in[0]}, {f32({c})}, {f32({c})}};
      },
      [](SpecList in) {
        return OpWork{8.0 * in[0].numel(), 3 * fbytes(in)};
      },
      [eps](auto be, const KernelContext& k) {
        const auto& s = k.input_spec(0).shape;
        be.batchnorm_forward(k.input<float>(0), k.input<float>(1), k.input<float>(2),
                             k.output<float>(0), k.output<float>(1), k.output<float>(2), s[0], s[1],
                             s[2] * s[3], eps);
      });
  auto out = run(rt, op, {x, gamma, beta});
  return {out[0], out[1], out[2]};
}

BatchNormGrads batchnorm_backward(Runtime& rt, const Tensor& dy, const Tensor& x,
                                  const Tensor& gamma, const Tensor& mean, const Tensor& rstd) {
  const OpPtr& op = cached([] {
    return define(
        "batchnorm_backward",
        [](SpecList in) {
          require_f32("batchnorm_backward", in, {0, 1, 2, 3, 4});
          require(in[0] == in[1] && in[1].shape.size() == 4, "batchnorm_backward", in,
                  "dy and x must be one (N, C, H, W) shape");
          return Outputs{{in[1]}, {in[2]}, {in[2]}};
        },
        [](SpecList in) {
          return OpWork{12.0 * in[0].numel(), 3 * fbytes(in)};
        },
        [](auto be, const KernelContext& k) {
          const auto& s = k.input_spec(1).shape;
          be.batchnorm_backward(k.input<float>(0), k.input<float>(1), k.input<float>(2),
                                k.input<float>(3), k.input<float>(4), k.output<float>(0),
                                k.output<float>(1), k.output<float>(2), s[0], s[1], s[2] * s[3]);
        });
  });
  auto out = run(rt, op, {dy, x, gamma, mean, rstd});
  return {out[0], out[1], out[2]};
}

void batchnorm_running_update(Runtime& rt, const Tensor& running_mean, const Tensor& running_var,
                              const Tensor& mean, const Tensor& rstd, i64 count, float momentum,
                              float eps) {
  auto op = define(
      "batchnorm_running_update", [](SpecList) { return Outputs{}; },
      [](SpecList in) {
        return OpWork{4.0 * in[0].numel(), fbytes(in)};
      },
      [count, momentum, eps](auto be, const KernelContext& k) {
        be.batchnorm_running_update(k.output<float>(0), k.output<float>(1), k.input<float>(2),
                                    k.input<float>(3), k.input_spec(0).numel(), count, momentum,
                                    eps);
      });
  run_update(rt, op, {running_mean, running_var, mean, rstd}, {0, 1});
}

// ---------------------------------------------------------------------------------------
// Attention, embedding, loss

AttentionOut attention(Runtime& rt, const Tensor& qkv, i64 heads) {
  auto op = define(
      "attention",
      [heads](SpecList in) {
        require_f32("attention", in, {0});
        const auto& s = in[0].shape;
        require(s.size() == 3 && s[2] % 3 == 0 && heads > 0 && (s[2] / 3) % heads == 0, "attention",
                in, absl::StrCat("qkv must be (B, T, 3C) with C divisible by ", heads, " heads"));
        return Outputs{{f32({s[0], s[1], s[2] / 3})}, {f32({s[0], heads, s[1], s[1]})}};
      },
      [heads](SpecList in) {
        const auto& s = in[0].shape;
        const double b = s[0], t = s[1], c = s[2] / 3;
        return OpWork{2.0 * b * t * t * c + 5.0 * b * heads * t * t,
                      fbytes(in) + 4.0 * (b * t * c + b * heads * t * t)};
      },
      [heads](auto be, const KernelContext& k) {
        const auto& s = k.input_spec(0).shape;
        be.attention_forward(k.input<float>(0), k.output<float>(0), k.output<float>(1), s[0], s[1],
                             s[2] / 3, heads);
      });
  auto out = run(rt, op, {qkv});
  return {out[0], out[1]};
}

Tensor attention_backward(Runtime& rt, const Tensor& dout, const Tensor& qkv, const Tensor& att,
                          i64 heads) {
  auto op = define(
      "attention_backward",
      [](SpecList in) {
        require_f32("attention_backward", in, {0, 1, 2});
        return Outputs{{in[1]}};
      },
      [heads](SpecList in) {
        const auto& s = in[1].shape;
        const double b = s[0], t = s[1], c = s[2] / 3;
        return OpWork{4.0 * b * t * t * c + 8.0 * b * heads * t * t, 2 * fbytes(in)};
      },
      [heads](auto be, const KernelContext& k) {
        const auto& s = k.input_spec(1).shape;
        be.attention_backward(k.input<float>(0), k.input<float>(1), k.input<float>(2),
                              k.output<float>(0), s[0], s[1], s[2] / 3, heads);
      });
  return run1(rt, op, {dout, qkv, att});
}

Tensor embedding(Runtime& rt, const Tensor& idx, const Tensor& wte, const Tensor& wpe) {
  const bool pos = wpe.defined();
  auto op = define(
      "embedding",
      [pos](SpecList in) {
        require(in[0].dtype == DType::kI32 && in[0].shape.size() == 2, "embedding", in,
                "idx must be int32 (B, T)");
        require(in[1].shape.size() == 2, "embedding", in, "wte must be (V, C)");
        if (pos)
          require(in[2].shape.size() == 2 && in[2].shape[1] == in[1].shape[1] &&
                      in[2].shape[0] >= in[0].shape[1],
                  "embedding", in, "wpe must be (maxT >= T, C)");
        return Outputs{{f32({in[0].shape[0], in[0].shape[1], in[1].shape[1]})}};
      },
      [](SpecList in) {
        const double n = static_cast<double>(in[0].numel()) * in[1].shape[1];
        return OpWork{n, 12.0 * n};
      },
      [pos](auto be, const KernelContext& k) {
        const auto& s = k.input_spec(0).shape;
        be.embedding_forward(k.input<std::int32_t>(0), k.input<float>(1),
                             pos ? k.input<float>(2) : nullptr, k.output<float>(0), s[0], s[1],
                             k.input_spec(1).shape[1]);
      });
  if (pos) return run1(rt, op, {idx, wte, wpe});
  return run1(rt, op, {idx, wte});
}

EmbeddingGrads embedding_backward(Runtime& rt, const Tensor& dout, const Tensor& idx,
                                  const TensorSpec& wte, const TensorSpec* wpe) {
  const bool pos = wpe != nullptr;
  const TensorSpec wpe_spec = pos ? *wpe : TensorSpec{};
  auto op = define(
      "embedding_backward",
      [wte, wpe_spec, pos](SpecList) {
        Outputs o{{wte}};
        if (pos) o.emplace_back(wpe_spec);
        return o;
      },
      [wte](SpecList in) {
        return OpWork{static_cast<double>(in[0].numel()), fbytes(in) + 2.0 * wte.bytes()};
      },
      [pos](auto be, const KernelContext& k) {
        const auto& s = k.input_spec(1).shape;  // (B, T)
        const i64 c = k.output_spec(0).shape[1], v = k.output_spec(0).shape[0];
        float* dwpe = nullptr;
        if (pos) {
          // Rows of wpe past this step's T get no gradient.
          dwpe = k.output<float>(1);
          be.fill_zero(dwpe, k.output_spec(1).bytes());
        }
        be.embedding_backward(k.input<float>(0), k.input<std::int32_t>(1), k.output<float>(0), dwpe,
                              s[0], s[1], c, v);
      });
  auto out = run(rt, op, {dout, idx});
  return {out[0], pos ? out[1] : Tensor()};
}

Tensor cross_entropy(Runtime& rt, const Tensor& logits, const Tensor& targets) {
  const OpPtr& op = cached([] {
    return define(
        "cross_entropy",
        [](SpecList in) {
          require(in[0].dtype == DType::kF32 && in[1].dtype == DType::kI32 &&
                      rows(in[0]) == in[1].numel(),
                  "cross_entropy", in, "needs f32 logits (N, V) and int32 targets (N)");
          return Outputs{{f32({rows(in[0])})}};
        },
        [](SpecList in) {
          return OpWork{4.0 * in[0].numel(), fbytes(in)};
        },
        [](auto be, const KernelContext& k) {
          be.cross_entropy_forward(k.input<float>(0), k.input<std::int32_t>(1), k.output<float>(0),
                                   rows(k.input_spec(0)), last(k.input_spec(0)));
        });
  });
  return run1(rt, op, {logits, targets});
}

Tensor cross_entropy_backward(Runtime& rt, const Tensor& logits, const Tensor& targets,
                              const Tensor& dloss, float scale) {
  auto op = define(
      "cross_entropy_backward", [](SpecList in) { return Outputs{{in[0]}}; },
      [](SpecList in) {
        return OpWork{5.0 * in[0].numel(), 2 * fbytes(in)};
      },
      [scale](auto be, const KernelContext& k) {
        be.cross_entropy_backward(k.input<float>(0), k.input<std::int32_t>(1), k.input<float>(2),
                                  scale, k.output<float>(0), rows(k.input_spec(0)),
                                  last(k.input_spec(0)));
      });
  return run1(rt, op, {logits, targets, dloss});
}

// ---------------------------------------------------------------------------------------
// Dropout

DropoutOut dropout(Runtime& rt, const Tensor& x, float p) {
  auto op = define(
      "dropout",
      [](SpecList in) {
        require_f32("dropout", in, {0});
        return Outputs{{in[0]}, {TensorSpec{in[0].shape, DType::kU8}}};
      },
      [](SpecList in) {
        return OpWork{10.0 * in[0].numel(), 2.25 * in[0].bytes()};
      },
      [p](auto be, const KernelContext& k) {
        be.dropout_forward(k.input<float>(0), k.output<float>(0), k.output<std::uint8_t>(1),
                           k.input_spec(0).numel(), p, k.rng.seed, k.rng.offset);
      },
      /*random=*/true);
  auto out = run(rt, op, {x});
  return {out[0], out[1]};
}

Tensor dropout_backward(Runtime& rt, const Tensor& dy, const Tensor& mask, float p) {
  auto op = define(
      "dropout_backward", [](SpecList in) { return Outputs{{in[0]}}; },
      [](SpecList in) {
        return OpWork{static_cast<double>(in[0].numel()), fbytes(in) * 1.5};
      },
      [p](auto be, const KernelContext& k) {
        be.dropout_backward(k.input<float>(0), k.input<std::uint8_t>(1), k.output<float>(0),
                            k.input_spec(0).numel(), p);
      });
  return run1(rt, op, {dy, mask});
}

}  // namespace remat::ops
