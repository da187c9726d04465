// An op is a user closure: an output-shape function, a kernel and a cost. Any existing
// kernel can be wrapped:
//
//   auto relu = remat::make_op("relu",
//       [](remat::SpecList in) { return remat::Outputs{{in[0]}}; },   // same shape as input
//       [](const remat::KernelContext& k) {
//         auto* x = k.input<float>(0);
//         auto* y = k.output<float>(0);
//         for (int64_t i = 0; i < k.input_spec(0).numel(); ++i) y[i] = x[i] > 0 ? x[i] : 0;
//       },
//       [](remat::SpecList in) { return double(in[0].numel()); });  // declared cost
//
// On the CUDA backend the runtime runs `OpDef::cuda_kernel` instead (see kernels/ops.h).
//
// Outputs may alias an input (views: `OutputSpec::alias_of`), ops may have several outputs
// (recomputing one makes all), and random ops set `random` and read `KernelContext::rng`:
// the runtime records the counter they drew from, so a recomputation draws the same bits.
#ifndef REMAT_OP_H_
#define REMAT_OP_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "remat/cuda_api.h"
#include "remat/tensor.h"

namespace remat {

// Note [Outputs start uninitialised]
// An output's memory comes from the runtime's allocator, which reuses the blocks of freed and
// evicted tensors: a kernel must write every byte of its outputs, and one that accumulates
// (`y[i] += ...`) must zero first or declare `copy_of`. Such a kernel passes on fresh memory
// and fails once memory is reused; RuntimeOptions::poison_outputs makes it fail at once.
struct OutputSpec {
  TensorSpec spec;
  int alias_of = -1;             // >= 0: a view into the storage of that input
  std::size_t alias_offset = 0;  // byte offset of the view inside the input's data
  // >= 0: the output starts as a copy of that input's bytes (same size) before the kernel
  // runs, on its first run and on every recomputation: the new version of an in-place op
  // (Runtime::call_inplace), or an op that accumulates into a copy of an input it only reads.
  int copy_of = -1;
  OutputSpec() = default;
  OutputSpec(TensorSpec s) : spec(std::move(s)) {}  // NOLINT: implicit on purpose
  OutputSpec(TensorSpec s, int alias, std::size_t offset = 0)
      : spec(std::move(s)), alias_of(alias), alias_offset(offset) {}
};

using SpecList = std::span<const TensorSpec>;
using Outputs = std::vector<OutputSpec>;

// The state a counter-based generator (Philox) needs to draw the same numbers again.
struct RngState {
  std::uint64_t seed = 0;
  std::uint64_t offset = 0;  // first counter this op may use
};

struct KernelContext {
  std::span<const void* const> inputs;
  std::span<const TensorSpec* const> input_specs;
  std::span<void* const> outputs;  // null for alias outputs
  std::span<const TensorSpec* const> output_specs;
  RngState rng;
  bool recompute = false;       // true when this run recomputes an evicted result
  CudaStream stream = nullptr;  // the runtime's stream on the CUDA backend
  // CUDA backend: device memory the runtime keeps for the op library's own use (cuBLAS's
  // workspace), allocated once under the budget and pinned; null elsewhere.
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  // Temporary memory for this kernel, from the runtime's allocator and so under its budget
  // (it may evict tensors to make room, and throws OutOfMemoryError where it cannot); given
  // back when the kernel returns, in stream order. Null where the runtime offers none.
  void* (*scratch_fn)(void* self, std::size_t bytes) = nullptr;
  void* scratch_self = nullptr;
  void* scratch(std::size_t bytes) const {
    return scratch_fn == nullptr ? nullptr : scratch_fn(scratch_self, bytes);
  }

  template <typename T>
  const T* input(std::size_t i) const {
    return static_cast<const T*>(inputs[i]);
  }
  // An input as a C kernel's non-const pointer (`void matmul(float* out, float* inp, ...)`):
  // the kernel still must not write through it, since recomputation reads the input again
  // (RuntimeOptions::check_inputs catches a kernel that does).
  template <typename T>
  T* c_input(std::size_t i) const {
    return const_cast<T*>(static_cast<const T*>(inputs[i]));
  }
  template <typename T>
  T* output(std::size_t i) const {
    return static_cast<T*>(outputs[i]);
  }
  const TensorSpec& input_spec(std::size_t i) const { return *input_specs[i]; }
  const TensorSpec& output_spec(std::size_t i) const { return *output_specs[i]; }
};

// What an op does, for a cost model to price: arithmetic and memory traffic.
struct OpWork {
  double flops = 0;
  double bytes = 0;
};

// A roofline: an op takes the longer of its arithmetic and its memory traffic, plus a fixed
// launch overhead, in nanoseconds. Only the ratios between ops steer eviction, so what
// matters is a machine's balance (flops per byte). The runtime prices ops that declare their
// work (`OpDef::work`) with RuntimeOptions::roofline, or with the backend's default.
struct Roofline {
  double flops_per_ns = 20.0;  // a 2-core CPU with OpenBLAS
  double bytes_per_ns = 10.0;
  double launch_ns = 1.0;
  // Defaults per machine: a 2-core CPU (2 flops per byte), and an H100's FP32 peak over its
  // HBM3 bandwidth (about 60 TFLOP/s, 3.35 TB/s: 18 flops per byte, 4 us a launch).
  static constexpr Roofline cpu() { return {20.0, 10.0, 1.0}; }
  static constexpr Roofline gpu() { return {60'000.0, 3'350.0, 4'000.0}; }
  double price(const OpWork& w) const {
    const double compute = w.flops / flops_per_ns;
    const double memory = w.bytes / bytes_per_ns;
    return (compute > memory ? compute : memory) + launch_ns;
  }
};

struct OpDef {
  std::string name;
  std::function<Outputs(SpecList)> infer;            // output specs from input specs
  std::function<void(const KernelContext&)> kernel;  // may be empty for pure views
  // The kernel the CUDA backend runs (device pointers, launched on `KernelContext::stream`);
  // an op with a host kernel but no CUDA kernel cannot run there.
  std::function<void(const KernelContext&)> cuda_kernel;
  std::function<double(SpecList)> cost;  // empty: priced from `work`, or measured (ns)
  // Arithmetic and traffic, priced by the runtime's roofline; used instead of `cost` when
  // set, so that one op library serves machines of different balance.
  std::function<OpWork(SpecList)> work;
  bool random = false;
  std::uint64_t rng_counters = 1;  // counters one call may consume (random ops)
  // Scratch the kernel asks for (KernelContext::scratch), declared: the runtime reserves it
  // with the op's outputs, before the kernel runs, where making room may move other tensors
  // together (Note [Compaction]); the kernel's first scratch request of at most this many
  // bytes gets it. Undeclared requests are served while the kernel runs, when nothing may
  // move. Empty or 0: none declared.
  std::function<std::size_t(SpecList)> scratch_bytes;
};
using OpPtr = std::shared_ptr<const OpDef>;

namespace detail {
inline std::shared_ptr<OpDef> new_op(std::string name, std::function<Outputs(SpecList)> infer,
                                     std::function<void(const KernelContext&)> kernel,
                                     bool random) {
  auto op = std::make_shared<OpDef>();
  op->name = std::move(name);
  op->infer = std::move(infer);
  op->kernel = std::move(kernel);
  op->random = random;
  return op;
}
}  // namespace detail

inline OpPtr make_op(std::string name, std::function<Outputs(SpecList)> infer,
                     std::function<void(const KernelContext&)> kernel,
                     std::function<double(SpecList)> cost = {}, bool random = false) {
  auto op = detail::new_op(std::move(name), std::move(infer), std::move(kernel), random);
  op->cost = std::move(cost);
  return op;
}

// `op` with the scratch its kernel asks for declared (OpDef::scratch_bytes).
inline OpPtr with_scratch(const OpPtr& op, std::function<std::size_t(SpecList)> bytes) {
  auto declared = std::make_shared<OpDef>(*op);
  declared->scratch_bytes = std::move(bytes);
  return declared;
}

// The same with the op's work declared instead of a cost: the runtime prices it with its
// roofline (RuntimeOptions::roofline), as the op library's own ops are.
//
//   auto gemm = remat::make_op_with_work("my_gemm", infer, kernel, [](remat::SpecList in) {
//     const double m = in[0].shape[0], k = in[0].shape[1], n = in[1].shape[1];
//     return remat::OpWork{.flops = 2 * m * k * n, .bytes = 4 * (m * k + k * n + m * n)};
//   });
inline OpPtr make_op_with_work(std::string name, std::function<Outputs(SpecList)> infer,
                               std::function<void(const KernelContext&)> kernel,
                               std::function<OpWork(SpecList)> work, bool random = false) {
  auto op = detail::new_op(std::move(name), std::move(infer), std::move(kernel), random);
  op->work = std::move(work);
  return op;
}

}  // namespace remat

#endif  // REMAT_OP_H_
