// What every op definition of the op library shares: the backends one op body runs with
// (CPU, and CUDA where built), `define`, which builds an OpDef from an op's shape rule, work
// and body, the calls that run an op and tell the op observer, and the shape checks. Internal
// to the op library's source files (ops.cc, ops_layers.cc, ops_conv.cc).
#ifndef REMAT_KERNELS_DETAIL_OP_DEFINITION_H_
#define REMAT_KERNELS_DETAIL_OP_DEFINITION_H_

#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/ops.h"
#ifdef REMAT_HAVE_CUDA
#include "kernels/cuda/cuda_kernels.h"
#endif

namespace remat::ops::detail {

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
inline OpPtr define(std::string name, std::function<Outputs(SpecList)> infer,
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
inline thread_local OpObserver op_observer;
inline void observe(const OpPtr& op, std::span<const Tensor> inputs) {
  if (!op_observer) return;
  std::vector<TensorSpec> specs;
  specs.reserve(inputs.size());
  for (const Tensor& t : inputs) specs.push_back(t.spec());
  op_observer(*op, specs);
}
inline std::vector<Tensor> run(Runtime& rt, const OpPtr& op, std::span<const Tensor> inputs) {
  observe(op, inputs);
  return rt.call(op, inputs);
}
inline std::vector<Tensor> run(Runtime& rt, const OpPtr& op, std::initializer_list<Tensor> inputs) {
  return run(rt, op, std::span<const Tensor>(inputs.begin(), inputs.size()));
}
inline Tensor run1(Runtime& rt, const OpPtr& op, std::initializer_list<Tensor> inputs) {
  return run(rt, op, inputs).at(0);
}
inline void run_update(Runtime& rt, const OpPtr& op, std::initializer_list<Tensor> args,
                       std::initializer_list<int> mutated) {
  observe(op, std::span<const Tensor>(args.begin(), args.size()));
  rt.update(op, args, mutated);
}

inline TensorSpec f32(std::vector<i64> shape) { return TensorSpec{std::move(shape), DType::kF32}; }
inline i64 last(const TensorSpec& s) { return s.shape.empty() ? 1 : s.shape.back(); }
inline i64 rows(const TensorSpec& s) {
  const i64 l = last(s);
  return l == 0 ? 0 : s.numel() / l;
}
inline double fbytes(SpecList in) {
  double b = 0;
  for (const TensorSpec& s : in) b += static_cast<double>(s.bytes());
  return b;
}

[[noreturn]] inline void bad_shapes(const std::string& op, SpecList in, const std::string& why) {
  std::vector<std::string> parts;
  for (const TensorSpec& s : in) parts.push_back(s.to_string());
  throw std::invalid_argument(
      absl::StrCat("remat: op '", op, "': ", why, " (inputs ", absl::StrJoin(parts, ", "), ")"));
}
inline void require(bool ok, const std::string& op, SpecList in, const std::string& why) {
  if (!ok) bad_shapes(op, in, why);
}
inline void require_f32(const std::string& op, SpecList in, std::initializer_list<int> which) {
  for (int i : which)
    require(in[static_cast<std::size_t>(i)].dtype == DType::kF32, op, in,
            absl::StrCat("input ", i, " must be f32"));
}

// An elementwise op with one output shaped like input 0 and `arity` inputs of that shape.
inline OpWork elementwise_work(SpecList in) {
  return {static_cast<double>(in[0].numel()), fbytes(in) + static_cast<double>(in[0].bytes())};
}
inline Outputs same_as_first(const std::string& name, SpecList in) {
  for (std::size_t i = 0; i < in.size(); ++i) {
    require(in[i].dtype == DType::kF32, name, in, "inputs must be f32");
    require(in[i].numel() == in[0].numel(), name, in, "inputs must have the same size");
  }
  return Outputs{{in[0]}};
}

// Caches op definitions that take no attributes, so a loop does not rebuild them.
template <class Make>
inline const OpPtr& cached(Make make) {
  static const OpPtr op = make();
  return op;
}

}  // namespace remat::ops::detail

#endif  // REMAT_KERNELS_DETAIL_OP_DEFINITION_H_
