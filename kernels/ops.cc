#include "kernels/ops.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#ifdef REMAT_HAVE_CUDA
#include "kernels/cuda/cuda_kernels.h"
#endif

namespace remat::ops {
namespace {

using i64 = std::int64_t;

// Every raw kernel the ops call, so that one op body serves both backends. On CUDA the
// kernels take the stream last; the GEMM family also takes the runtime's cuBLAS workspace,
// and embedding_backward its scratch memory (see kernels/cuda/cuda_kernels.h).
// clang-format off
#define REMAT_KERNEL_LIST(X)                                                                    \
  X(bias_add) X(bias_grad) X(add) X(mul) X(scale) X(gelu_forward) X(gelu_backward)              \
  X(relu_forward) X(relu_backward) X(sigmoid_forward) X(sigmoid_backward) X(tanh_forward)       \
  X(tanh_backward) X(sum) X(layernorm_forward) X(layernorm_backward) X(softmax_forward)         \
  X(softmax_backward) X(attention_forward) X(attention_backward) X(embedding_forward)          \
  X(cross_entropy_forward) X(cross_entropy_backward) X(dropout_forward)                        \
  X(dropout_backward) X(batchnorm_forward) X(batchnorm_backward) X(batchnorm_running_update)   \
  X(maxpool2d_forward) X(maxpool2d_backward) X(avgpool_forward) X(avgpool_backward)            \
  X(adamw_update) X(fill_zero) X(copy_bytes)
#define REMAT_BLAS_KERNEL_LIST(X) X(gemm) X(conv2d_forward) X(conv2d_backward)
#define REMAT_SCRATCH_KERNEL_LIST(X) X(embedding_backward)
// clang-format on

struct CpuBackend {
#define REMAT_FORWARD(f)                    \
  template <class... A>                     \
  void f(A&&... a) const {                  \
    kernels::cpu::f(std::forward<A>(a)...); \
  }
  REMAT_KERNEL_LIST(REMAT_FORWARD)
  REMAT_BLAS_KERNEL_LIST(REMAT_FORWARD)
  REMAT_SCRATCH_KERNEL_LIST(REMAT_FORWARD)
#undef REMAT_FORWARD
};

#ifdef REMAT_HAVE_CUDA
struct CudaBackend {
  const KernelContext* k;
  cudaStream_t s() const { return k->stream; }  // CudaStream is cudaStream_t
  // The runtime's workspace, pinned under its budget: cuBLAS then allocates nothing of its
  // own that the budget cannot see.
  kernels::cuda::BlasWorkspace ws() const { return {k->workspace, k->workspace_bytes}; }
  kernels::cuda::Scratch scratch() const { return {k->scratch_fn, k->scratch_self}; }
#define REMAT_FORWARD(f)                          \
  template <class... A>                           \
  void f(A&&... a) const {                        \
    kernels::cuda::f(std::forward<A>(a)..., s()); \
  }
  REMAT_KERNEL_LIST(REMAT_FORWARD)
#undef REMAT_FORWARD
#define REMAT_FORWARD(f)                                \
  template <class... A>                                 \
  void f(A&&... a) const {                              \
    kernels::cuda::f(std::forward<A>(a)..., s(), ws()); \
  }
  REMAT_BLAS_KERNEL_LIST(REMAT_FORWARD)
#undef REMAT_FORWARD
#define REMAT_FORWARD(f)                                     \
  template <class... A>                                      \
  void f(A&&... a) const {                                   \
    kernels::cuda::f(std::forward<A>(a)..., s(), scratch()); \
  }
  REMAT_SCRATCH_KERNEL_LIST(REMAT_FORWARD)
#undef REMAT_FORWARD
};
#endif

// Builds an OpDef whose kernels run `body(backend, ctx)` with the CPU or the CUDA backend, and
// that declares `work`. Its `cost` is that work priced on the CPU roofline: the figures these
// ops declared before they declared work, for whoever reads `cost` rather than `work`.
template <class Body>
OpPtr define(std::string name, std::function<Outputs(SpecList)> infer,
             std::function<OpWork(SpecList)> work, Body body, bool random = false) {
  auto op = std::make_shared<OpDef>();
  op->name = std::move(name);
  op->infer = std::move(infer);
  op->cost = [work](SpecList in) { return Roofline::cpu().price(work(in)); };
  op->work = std::move(work);
  op->kernel = [body](const KernelContext& k) { body(CpuBackend{}, k); };
#ifdef REMAT_HAVE_CUDA
  op->cuda_kernel = [body](const KernelContext& k) { body(CudaBackend{&k}, k); };
#endif
  op->random = random;
  // A dropout call draws one Philox block per four elements; 2^32 blocks per call keeps the
  // streams of different calls apart for tensors of up to 2^34 elements.
  if (random) op->rng_counters = std::uint64_t{1} << 32;
  return op;
}

// The observer of set_op_observer, and the calls into the runtime that tell it.
thread_local OpObserver op_observer;
void observe(const OpPtr& op, std::span<const Tensor> inputs) {
  if (!op_observer) return;
  std::vector<TensorSpec> specs;
  specs.reserve(inputs.size());
  for (const Tensor& t : inputs) specs.push_back(t.spec());
  op_observer(*op, specs);
}
std::vector<Tensor> run(Runtime& rt, const OpPtr& op, std::span<const Tensor> inputs) {
  observe(op, inputs);
  return rt.call(op, inputs);
}
std::vector<Tensor> run(Runtime& rt, const OpPtr& op, std::initializer_list<Tensor> inputs) {
  return run(rt, op, std::span<const Tensor>(inputs.begin(), inputs.size()));
}
Tensor run1(Runtime& rt, const OpPtr& op, std::initializer_list<Tensor> inputs) {
  return run(rt, op, inputs).at(0);
}
void run_update(Runtime& rt, const OpPtr& op, std::initializer_list<Tensor> args,
                std::initializer_list<int> mutated) {
  observe(op, std::span<const Tensor>(args.begin(), args.size()));
  rt.update(op, args, mutated);
}

TensorSpec f32(std::vector<i64> shape) { return TensorSpec{std::move(shape), DType::kF32}; }
i64 last(const TensorSpec& s) { return s.shape.empty() ? 1 : s.shape.back(); }
i64 rows(const TensorSpec& s) {
  const i64 l = last(s);
  return l == 0 ? 0 : s.numel() / l;
}
double fbytes(SpecList in) {
  double b = 0;
  for (const TensorSpec& s : in) b += static_cast<double>(s.bytes());
  return b;
}

[[noreturn]] void bad_shapes(const std::string& op, SpecList in, const std::string& why) {
  std::vector<std::string> parts;
  for (const TensorSpec& s : in) parts.push_back(s.to_string());
  throw std::invalid_argument(
      absl::StrCat("remat: op '", op, "': ", why, " (inputs ", absl::StrJoin(parts, ", "), ")"));
}
void require(bool ok, const std::string& op, SpecList in, const std::string& why) {
  if (!ok) bad_shapes(op, in, why);
}
void require_f32(const std::string& op, SpecList in, std::initializer_list<int> which) {
  for (int i : which)
    require(in[static_cast<std::size_t>(i)].dtype == DType::kF32, op, in,
            absl::StrCat("input ", i, " must be f32"));
}

// An elementwise op with one output shaped like input 0 and `arity` inputs of that shape.
OpWork elementwise_work(SpecList in) {
  return {static_cast<double>(in[0].numel()), fbytes(in) + static_cast<double>(in[0].bytes())};
}
Outputs same_as_first(const std::string& name, SpecList in) {
  for (std::size_t i = 0; i < in.size(); ++i) {
    require(in[i].dtype == DType::kF32, name, in, "inputs must be f32");
    require(in[i].numel() == in[0].numel(), name, in, "inputs must have the same size");
  }
  return Outputs{{in[0]}};
}

// Caches op definitions that take no attributes, so a loop does not rebuild them.
template <class Make>
const OpPtr& cached(Make make) {
  static const OpPtr op = make();
  return op;
}

}  // namespace

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
