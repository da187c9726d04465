// remat as a PyTorch device: tensors and modules moved to remat::torch_backend::device() are
// kept by remat's runtime under a budget, evicted when it is reached and recomputed when read
// (the optional component `remat::torch`, built where PyTorch is found).
//
//   #include <remat/torch.h>
//   #include <torch/torch.h>
//
//   remat::torch_backend::set_budget(size_t{256} << 20);
//   torch::nn::Sequential net(torch::nn::Linear(64, 64), torch::nn::ReLU());
//   remat::torch_backend::move_module(*net, remat::torch_backend::device());
//   torch::optim::SGD sgd(net->parameters(), 0.1);
//   for (int step = 0; step < 10; ++step) {
//     remat::torch_backend::StepScope scope;         // marks a training step
//     auto loss = net->forward(x.to(remat::torch_backend::device())).square().mean();
//     sgd.zero_grad();
//     loss.backward();
//     sgd.step();
//   }
//   remat::torch_backend::stats().evictions;
//
// Every operator runs its CPU kernel over remat's memory, so results are bitwise those of the
// same program on the CPU (docs/pytorch.md says what is supported).
#ifndef REMAT_TORCH_H_
#define REMAT_TORCH_H_

#include <c10/core/Device.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "remat/runtime.h"

namespace at {
class Tensor;
}  // namespace at
namespace torch::nn {
class Module;
}

namespace remat::torch_backend {

// The device: PrivateUse1, index 0 (named "remat" once Python's remat_torch is imported).
c10::Device device();
// The budget on the runtime's reserved bytes (a hard cap); SIZE_MAX: none.
void set_budget(std::size_t bytes);
std::size_t budget();
// The policy: an eviction policy (eviction_policy_names(); "dtr" by default) or "auto" (the
// steps a program marks with StepScope recorded, planned and followed where a plan
// recomputes less than DTR: Note [Planned steps on the device]); only before any tensor is on
// the device.
void set_policy(const std::string& policy);
// Host memory (bytes) the runtime may keep the program's state in while a marked step does not
// read it: at a step's first operator, the constants the step before left unread between its
// first operator and the optimizer (AdamW's moments) move there, out of the budget, and come
// back when the optimizer reads them (Note [State waits on the host], pytorch/backend.cc).
// 0, the default: nothing moves. Only before any tensor is on the device.
void set_host_memory(std::size_t bytes);
std::string policy();
// What ops cost to the eviction policy: "estimated" (the default) from each call's arithmetic
// and memory traffic, the same on every run (Note [Costs without a clock], pytorch/op_work.cc),
// or "measured", each signature timed on its first runs. Applies to the calls made after it.
void set_costs(const std::string& costs);
std::string costs();
// What runs the operators' kernels (executions()): "cpu", each operator's CPU kernel over
// host memory; "simulated_cuda", the runtime on a simulated CUDA device whose memory is host
// memory, the CPU kernels launched on its stream, and races, invalid accesses and the host's
// waits for the device reported (execution_problems()). The default is the environment's
// REMAT_TORCH_EXECUTION, else "cpu". Only before any tensor is on the device.
void set_execution(const std::string& name);
std::string execution();
std::vector<std::string> executions();
// What the execution saw go wrong in the device's memory since the last clear (races and
// invalid accesses, one line each; always empty on "cpu"), and the host's waits for the
// device so far.
std::vector<std::string> execution_problems();
void clear_execution_problems();
std::size_t host_waits();
// For tests of "simulated_cuda": a read of `t`'s storage on another stream, with
// record_stream or without (Execution::side_read).
void side_read(const at::Tensor& t, bool record_stream);

// One candidate `auto` weighed for the recorded step: DTR or a plan, priced by replaying the
// step on the simulated backend under the budget.
struct ScreenedCandidate {
  std::string source;                        // "dtr", or the plan's source
  std::optional<double> simulated_overhead;  // none: it ran out of memory or thrashed
  std::string failure;
  // A plan's requests served at their places in the replay, and whether it gave the
  // placement up (Note [Placed allocations]).
  std::size_t placed_allocations = 0;
  std::size_t placement_misses = 0;
};
// Where `auto` stands.
struct PlanReport {
  // "off" (another policy), "unconstrained", "warm-up", "recording", "trial", "plan", "dtr"
  std::string phase;
  std::string source;                        // the plan followed or tried, or why there is none
  int steps = 0;                             // steps marked under the current budget
  std::optional<double> dtr_step_overhead;   // the recorded step's, on DTR
  std::optional<double> plan_step_overhead;  // the trial step's, on the plan
  // Wall seconds from the step's first operator to the optimizer's first call: the recorded
  // step's on DTR, and the trial step's on the plan (the plan is kept if no slower).
  std::optional<double> dtr_step_seconds;
  std::optional<double> plan_step_seconds;
  double planning_seconds = 0;
  // Bytes of the storages pinned from the recorded step's start to its end that it never read
  // (the optimizer's state), but for those host memory takes off the device in later steps
  // (set_host_memory): the plans are made for the budget less these, and less the most
  // scratch one of its kernels asked for (scratch_bytes).
  std::size_t unread_bytes = 0;
  std::size_t scratch_bytes = 0;
  std::vector<ScreenedCandidate> screened;
};
PlanReport plan_report();
RuntimeStats stats();
// What the program holds on the device, by the operator that made it (most resident first).
std::vector<HeldTensors> held_tensors();
void reset_peaks();
// Moves a module's parameters, their gradients and its buffers to `device` (the remat
// device or the CPU), in place, as Module::to does; the module keeps its tensors' identities.
// LibTorch's own Module::to cannot move to the device (Note [Moving modules in place]).
void move_module(torch::nn::Module& module, c10::Device device);
// Evicts every storage that can be evicted now; returns how many it evicted.
std::size_t evict_all();

// Marks a training step: begins one on construction. end() ends it and raises what ending
// raises (a followed plan's deferred operators run then, and planning); the destructor ends
// a step end() did not, and since it may not throw (it also runs while another exception
// unwinds the step), an error of that ending is a warning (TORCH_WARN). So a program that
// wants ending errors as exceptions calls end(); Python's `with remat_torch.step():` does.
class StepScope {
 public:
  StepScope();
  ~StepScope();
  void end();  // once; later calls do nothing
  StepScope(const StepScope&) = delete;
  StepScope& operator=(const StepScope&) = delete;

 private:
  bool ended_ = false;
};

struct MeterState;

// Counts the CPU tensor bytes c10's allocator hands out while it lives, on any thread, and
// their frees: what is live now and the peak since it began (Note [Measuring a step's CPU
// memory]). Meters nest. A compiled step's peak, which the profiler sees only as the net
// of each compiled call.
class CpuMemoryMeter {
 public:
  CpuMemoryMeter();
  ~CpuMemoryMeter();
  CpuMemoryMeter(const CpuMemoryMeter&) = delete;
  CpuMemoryMeter& operator=(const CpuMemoryMeter&) = delete;
  std::int64_t live_bytes() const;
  std::int64_t peak_bytes() const;

 private:
  std::unique_ptr<MeterState> state_;
};

}  // namespace remat::torch_backend

#endif  // REMAT_TORCH_H_
