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

void set_op_observer(OpObserver observer) { op_observer = std::move(observer); }

// ---------------------------------------------------------------------------------------
// GEMM family

namespace {
struct GemmDims {
  i64 m, n, k;
};
GemmDims gemm_dims(const std::string& name, SpecList in, bool ta, bool tb) {
  require_f32(name, in, {0, 1});
  require(!in[0].shape.empty() && !in[1].shape.empty(), name, in, "operands must not be scalars");
  const i64 ar = rows(in[0]), ac = last(in[0]);
  const i64 br = rows(in[1]), bc = last(in[1]);
  const i64 m = ta ? ac : ar, k = ta ? ar : ac;
  const i64 bk = tb ? bc : br;
  const i64 n = tb ? br : bc;
  require(bk == k, name, in, absl::StrCat("inner dimensions differ: ", k, " and ", bk));
  return {m, n, k};
}
std::vector<i64> gemm_out_shape(const TensorSpec& a, bool ta, const GemmDims& d) {
  if (ta || a.shape.empty()) return {d.m, d.n};
  std::vector<i64> s = a.shape;
  s.back() = d.n;
  return s;
}
}  // namespace

Tensor matmul(Runtime& rt, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  auto make = [](bool ta, bool tb) {
    const std::string name = absl::StrCat("matmul", ta ? "_ta" : "", tb ? "_tb" : "");
    return define(
        name,
        [=](SpecList in) {
          const GemmDims d = gemm_dims(name, in, ta, tb);
          return Outputs{{f32(gemm_out_shape(in[0], ta, d))}};
        },
        [=](SpecList in) {
          const GemmDims d = gemm_dims(name, in, ta, tb);
          return OpWork{2.0 * d.m * d.n * d.k, fbytes(in) + 4.0 * d.m * d.n};
        },
        [=](auto be, const KernelContext& k) {
          const TensorSpec& as = k.input_spec(0);
          const i64 ar = rows(as), ac = last(as);
          const i64 m = ta ? ac : ar, kk = ta ? ar : ac;
          const TensorSpec& bs = k.input_spec(1);
          const i64 n = tb ? rows(bs) : last(bs);
          be.gemm(ta, tb, m, n, kk, 1.0f, k.input<float>(0), k.input<float>(1), 0.0f,
                  k.output<float>(0));
        });
  };
  static const OpPtr table[2][2] = {{make(false, false), make(false, true)},
                                    {make(true, false), make(true, true)}};
  return run1(rt, table[trans_a][trans_b], {a, b});
}

Tensor linear(Runtime& rt, const Tensor& x, const Tensor& w, const Tensor& b) {
  static const OpPtr with_bias = define(
      "linear",
      [](SpecList in) {
        const GemmDims d = gemm_dims("linear", in, false, true);
        require(in[2].numel() == d.n, "linear", in, "bias size must equal out features");
        return Outputs{{f32(gemm_out_shape(in[0], false, d))}};
      },
      [](SpecList in) {
        const GemmDims d = gemm_dims("linear", in, false, true);
        return OpWork{2.0 * d.m * d.n * d.k, fbytes(in) + 4.0 * d.m * d.n};
      },
      [](auto be, const KernelContext& k) {
        const i64 m = rows(k.input_spec(0)), kk = last(k.input_spec(0));
        const i64 n = k.input_spec(1).shape[0];
        float* y = k.output<float>(0);
        // The product, then the bias added in place: no temporary.
        be.gemm(false, true, m, n, kk, 1.0f, k.input<float>(0), k.input<float>(1), 0.0f, y);
        be.bias_add(y, k.input<float>(2), y, m, n);
      });
  if (!b.defined()) return matmul(rt, x, w, false, true);
  return run1(rt, with_bias, {x, w, b});
}

Tensor bias_add(Runtime& rt, const Tensor& x, const Tensor& b) {
  const OpPtr& op = cached([] {
    return define(
        "bias_add",
        [](SpecList in) {
          require_f32("bias_add", in, {0, 1});
          require(in[1].numel() == last(in[0]), "bias_add", in, "bias size must equal last dim");
          return Outputs{{in[0]}};
        },
        elementwise_work,
        [](auto be, const KernelContext& k) {
          be.bias_add(k.input<float>(0), k.input<float>(1), k.output<float>(0),
                      rows(k.input_spec(0)), last(k.input_spec(0)));
        });
  });
  return run1(rt, op, {x, b});
}

Tensor bias_grad(Runtime& rt, const Tensor& dy) {
  const OpPtr& op = cached([] {
    return define(
        "bias_grad",
        [](SpecList in) {
          require_f32("bias_grad", in, {0});
          return Outputs{{f32({last(in[0])})}};
        },
        elementwise_work,
        [](auto be, const KernelContext& k) {
          be.bias_grad(k.input<float>(0), k.output<float>(0), rows(k.input_spec(0)),
                       last(k.input_spec(0)));
        });
  });
  return run1(rt, op, {dy});
}

// ---------------------------------------------------------------------------------------
// Elementwise

namespace {
template <class Fn>
OpPtr elementwise(const std::string& name, Fn fn) {
  return define(
      name, [name](SpecList in) { return same_as_first(name, in); }, elementwise_work, fn);
}
}  // namespace

#define REMAT_UNARY(fname, kernel)                                                 \
  Tensor fname(Runtime& rt, const Tensor& x) {                                     \
    const OpPtr& op = cached([] {                                                  \
      return elementwise(#fname, [](auto be, const KernelContext& k) {             \
        be.kernel(k.input<float>(0), k.output<float>(0), k.input_spec(0).numel()); \
      });                                                                          \
    });                                                                            \
    return run1(rt, op, {x});                                                      \
  }
#define REMAT_BINARY(fname, kernel)                                         \
  Tensor fname(Runtime& rt, const Tensor& a, const Tensor& b) {             \
    const OpPtr& op = cached([] {                                           \
      return elementwise(#fname, [](auto be, const KernelContext& k) {      \
        be.kernel(k.input<float>(0), k.input<float>(1), k.output<float>(0), \
                  k.input_spec(0).numel());                                 \
      });                                                                   \
    });                                                                     \
    return run1(rt, op, {a, b});                                            \
  }
REMAT_UNARY(gelu, gelu_forward)
REMAT_UNARY(relu, relu_forward)
REMAT_UNARY(sigmoid, sigmoid_forward)
REMAT_UNARY(tanh, tanh_forward)
REMAT_BINARY(add, add)
REMAT_BINARY(mul, mul)
REMAT_BINARY(gelu_backward, gelu_backward)
REMAT_BINARY(relu_backward, relu_backward)
REMAT_BINARY(sigmoid_backward, sigmoid_backward)
REMAT_BINARY(tanh_backward, tanh_backward)
#undef REMAT_UNARY
#undef REMAT_BINARY

Tensor scale(Runtime& rt, const Tensor& x, float s) {
  auto op = elementwise("scale", [s](auto be, const KernelContext& k) {
    be.scale(k.input<float>(0), s, k.output<float>(0), k.input_spec(0).numel());
  });
  return run1(rt, op, {x});
}

Tensor sum(Runtime& rt, const Tensor& x) {
  const OpPtr& op = cached([] {
    return define(
        "sum",
        [](SpecList in) {
          require_f32("sum", in, {0});
          return Outputs{{f32({1})}};
        },
        elementwise_work,
        [](auto be, const KernelContext& k) {
          be.sum(k.input<float>(0), k.output<float>(0), k.input_spec(0).numel());
        });
  });
  return run1(rt, op, {x});
}

Tensor zeros(Runtime& rt, const TensorSpec& spec) {
  auto op = define(
      "zeros", [spec](SpecList) { return Outputs{{spec}}; },
      [spec](SpecList) {
        return OpWork{0, static_cast<double>(spec.bytes())};
      },
      [](auto be, const KernelContext& k) {
        be.fill_zero(k.output<void>(0), k.output_spec(0).bytes());
      });
  return run(rt, op, std::span<const Tensor>{}).at(0);
}

Tensor softmax(Runtime& rt, const Tensor& x) {
  const OpPtr& op = cached([] {
    return elementwise("softmax", [](auto be, const KernelContext& k) {
      be.softmax_forward(k.input<float>(0), k.output<float>(0), rows(k.input_spec(0)),
                         last(k.input_spec(0)));
    });
  });
  return run1(rt, op, {x});
}

Tensor softmax_backward(Runtime& rt, const Tensor& y, const Tensor& dy) {
  const OpPtr& op = cached([] {
    return elementwise("softmax_backward", [](auto be, const KernelContext& k) {
      be.softmax_backward(k.input<float>(0), k.input<float>(1), k.output<float>(0),
                          rows(k.input_spec(0)), last(k.input_spec(0)));
    });
  });
  return run1(rt, op, {y, dy});
}

// ---------------------------------------------------------------------------------------
// Views and copies

Tensor reshape(Runtime& rt, const Tensor& x, std::vector<i64> shape) {
  return narrow(rt, x, 0, std::move(shape));
}

Tensor narrow(Runtime& rt, const Tensor& x, i64 offset, std::vector<i64> shape) {
  auto op = std::make_shared<OpDef>();
  op->name = "view";
  op->infer = [offset, shape](SpecList in) {
    TensorSpec out{shape, in[0].dtype};
    require(offset >= 0 && offset + out.numel() <= in[0].numel(), "view", in,
            absl::StrCat("elements [", offset, ", ", offset + out.numel(), ") lie outside"));
    return Outputs{OutputSpec(out, 0, static_cast<std::size_t>(offset) * dtype_size(in[0].dtype))};
  };
  // A view launches nothing and moves no bytes, so it declares a token cost and no work: a
  // roofline would charge it a kernel launch (4 us on the GPU's) that it never makes.
  op->cost = [](SpecList) { return 1.0; };
  return run1(rt, op, {x});
}

Tensor concat(Runtime& rt, const std::vector<Tensor>& parts) {
  const OpPtr& op = cached([] {
    return define(
        "concat",
        [](SpecList in) {
          require(!in.empty(), "concat", in, "needs at least one input");
          TensorSpec out = in[0];
          require(!out.shape.empty(), "concat", in, "inputs must have a first dimension");
          out.shape[0] = 0;
          for (const TensorSpec& s : in) {
            require(s.dtype == in[0].dtype && s.shape.size() == in[0].shape.size() &&
                        std::equal(s.shape.begin() + 1, s.shape.end(), in[0].shape.begin() + 1),
                    "concat", in, "inputs must agree past the first dimension");
            out.shape[0] += s.shape[0];
          }
          return Outputs{{out}};
        },
        [](SpecList in) {
          return OpWork{0, 2 * fbytes(in)};
        },
        [](auto be, const KernelContext& k) {
          char* dst = k.output<char>(0);
          for (std::size_t i = 0; i < k.inputs.size(); ++i) {
            const std::size_t b = k.input_spec(i).bytes();
            be.copy_bytes(dst, k.inputs[i], b);
            dst += b;
          }
        });
  });
  return run(rt, op, std::span<const Tensor>(parts)).at(0);
}

}  // namespace remat::ops
