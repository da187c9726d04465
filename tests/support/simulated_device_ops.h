// Test support: host ops run as kernels of the simulated device (simulated_cuda.h), and the
// runtime's options on it. For the CUDA backend's tests; in no library.
#ifndef REMAT_TESTS_SUPPORT_SIMULATED_DEVICE_OPS_H_
#define REMAT_TESTS_SUPPORT_SIMULATED_DEVICE_OPS_H_

#include <functional>
#include <memory>
#include <vector>

#include "remat/op.h"
#include "remat/runtime.h"
#include "runtime/cuda/simulated_cuda.h"

namespace remat {

// Enqueues host `kernel` as a simulated kernel of `ns` nanoseconds on k.stream, reading k's
// inputs and writing its outputs: its body runs when the kernel completes, on copies of what
// `k` points to. A kernel that declares `scratch_bytes` gets them from the runtime now (as a
// CUDA kernel's launcher takes its workspace before the launch), written by the launch, and
// its body's scratch() returns them.
inline void launch_host_kernel(SimulatedCuda* sim,
                               const std::function<void(const KernelContext&)>& kernel,
                               const KernelContext& k, double ns, std::size_t scratch_bytes = 0) {
  std::vector<const void*> ins(k.inputs.begin(), k.inputs.end());
  std::vector<void*> outs(k.outputs.begin(), k.outputs.end());
  std::vector<TensorSpec> in_specs, out_specs;
  std::vector<DeviceRange> reads, writes;
  for (std::size_t i = 0; i < ins.size(); ++i) {
    in_specs.push_back(k.input_spec(i));
    reads.push_back({ins[i], in_specs.back().bytes()});
  }
  for (std::size_t i = 0; i < outs.size(); ++i) {
    out_specs.push_back(k.output_spec(i));
    if (outs[i] != nullptr) writes.push_back({outs[i], out_specs.back().bytes()});
  }
  void* scratch = scratch_bytes == 0 ? nullptr : k.scratch(scratch_bytes);
  if (scratch != nullptr) writes.push_back({scratch, scratch_bytes});
  sim->launch(k.stream, ns, reads, writes,
              [kernel, ins, outs, in_specs, out_specs, rng = k.rng, rerun = k.recompute, scratch] {
                std::vector<const TensorSpec*> ip, op;
                for (const TensorSpec& s : in_specs) ip.push_back(&s);
                for (const TensorSpec& s : out_specs) op.push_back(&s);
                KernelContext ctx{ins, ip, outs, op, rng, rerun};
                ctx.scratch_self = scratch;
                ctx.scratch_fn = [](void* self, std::size_t) { return self; };
                kernel(ctx);
              });
}

// `host` with a CUDA kernel that runs its host kernel as a simulated kernel of `ns`
// nanoseconds on the runtime's stream: enqueued now, its body run when it completes.
inline OpPtr on_device(const std::shared_ptr<SimulatedCuda>& sim, const OpPtr& host, double ns) {
  auto op = std::make_shared<OpDef>(*host);
  op->cuda_kernel = [sim = sim.get(), kernel = host->kernel, ns](const KernelContext& k) {
    launch_host_kernel(sim, kernel, k, ns);
  };
  return op;
}

// CudaOptions::launch for a whole op library: every op's host kernel runs as a simulated
// kernel, as long as the GPU roofline prices the op's declared work (a microsecond where it
// declares none).
inline std::function<void(const OpDef&, const KernelContext&)> host_kernels_on(
    const std::shared_ptr<SimulatedCuda>& sim) {
  return [sim = sim.get()](const OpDef& op, const KernelContext& k) {
    double ns = 1000;
    std::vector<TensorSpec> specs;
    for (std::size_t i = 0; i < k.inputs.size(); ++i) specs.push_back(k.input_spec(i));
    if (op.work) ns = Roofline::gpu().price(op.work(specs));
    launch_host_kernel(sim, op.kernel, k, ns, op.scratch_bytes ? op.scratch_bytes(specs) : 0);
  };
}

inline RuntimeOptions on_sim(const std::shared_ptr<SimulatedCuda>& sim, std::size_t budget) {
  RuntimeOptions o;
  o.backend = Backend::kCuda;
  o.budget = budget;
  o.cuda.api = sim;
  o.cuda.blas_workspace_bytes = 64 << 10;
  return o;
}

}  // namespace remat

#endif  // REMAT_TESTS_SUPPORT_SIMULATED_DEVICE_OPS_H_
