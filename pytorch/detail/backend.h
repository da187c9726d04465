// The process's one remat runtime behind PyTorch's PrivateUse1 device, and the storages it
// holds for torch (Note [A torch storage is a remat storage]).
#ifndef REMAT_PYTORCH_DETAIL_BACKEND_H_
#define REMAT_PYTORCH_DETAIL_BACKEND_H_

#include <ATen/core/ivalue.h>
#include <absl/container/flat_hash_set.h>
#include <c10/core/Storage.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "pytorch/detail/execution.h"
#include "pytorch/detail/signature_cache.h"
#include "pytorch/detail/step_plans.h"
#include "remat/runtime.h"

namespace remat::torch_backend::detail {

// Note [A torch storage is a remat storage]
// Every storage of a tensor on the device is an ordinary c10::Storage whose DataPtr holds no
// address: its context is a RematStorage, which owns the remat tensor (bytes, dtype u8) that
// is the storage's current version. So torch keeps its own view metadata (sizes, strides,
// offset) on ordinary TensorImpls, views share the c10::Storage as they do on the CPU,
// `set_data` and shallow copies carry the storage along, and the last torch reference to a
// storage drops the remat tensor. A storage's bytes are reached only through the runtime
// (Runtime::data inside an op), which recomputes them where they were evicted; an in-place op
// rebinds `tensor` to a new version (copy-on-write, Runtime::call_inplace) or writes a pinned
// one in place (Runtime::update), and every view sees it because they share the RematStorage.
struct RematStorage {
  Tensor tensor;
  std::size_t nbytes = 0;
  // Made by Runtime::constant (parameters, buffers, inputs copied in): written in place by
  // Runtime::update, never evicted.
  bool pinned = false;
  std::uint64_t read_in_step = 0;  // the runtime step that last read it (Backend::step_serial)
};

// The runtime and the lock every use of it takes: the autograd engine runs the backward pass
// on a thread of its own for the device, and the runtime is not thread-safe.
class Backend {
 public:
  static Backend& get();
  std::recursive_mutex& mutex() { return mutex_; }
  // The runtime, made on first use with the options set so far.
  Runtime& runtime();
  void set_budget(std::size_t bytes);
  // Replaces the runtime with one under `policy` (an eviction policy, or "auto": Note
  // [Planned steps on the device]); only while no storage is alive.
  void set_policy(const std::string& policy);
  std::string policy() const { return planned_ ? "auto" : options_.policy; }
  // Replaces the execution (Note [Executions]); only while no storage is alive.
  void set_execution(const std::string& name);
  Execution& execution() { return *execution_; }
  // The runtime's host memory (Note [State waits on the host]); only while no storage is
  // alive.
  void set_host_memory(std::size_t bytes);
  // Ops' costs estimated from what they do (true, the default: Note [Costs without a clock])
  // or timed (Note [Costs are remembered]); for the ops made from now on.
  void set_estimated_costs(bool estimated) { estimated_costs_ = estimated; }
  bool estimated_costs() const { return estimated_costs_; }
  // The program's steps (StepScope): under `auto`, recorded, planned and followed.
  void begin_step();
  void end_step();
  // Before each call on the device, where the step stands: `in_backward` (a call of the
  // autograd engine's backward pass) or `outside` autograd (the optimizer's step).
  void note_call(bool in_backward, bool outside);
  PlanReport plan_report() const;
  // Counts the runtime's steps (Note [A step begins at its first operator]); 0 before the first.
  std::uint64_t step_serial() const { return step_serial_; }
  // An operator that runs when called (StepPlans::runs_when_called).
  void note_runs_when_called(const std::string& op) { plans_.runs_when_called(op); }
  std::size_t live_storages() const { return storages_.size(); }
  void storage_made(RematStorage* s) { storages_.insert(s); }
  void storage_dropped(RematStorage* s) { storages_.erase(s); }
  // Evicts every live storage that can be evicted; returns how many were.
  std::size_t evict_all();
  // The most scratch a call of this signature asked for (Note [Torch kernels allocate under
  // the budget]), and the median of its kernel's first three runs (Note [Costs are
  // remembered]); nullopt before its first run.
  std::optional<std::size_t> scratch_estimate(const std::string& signature) const;
  std::optional<double> cost_estimate(const std::string& signature) const;
  void note_run(const std::string& signature, std::size_t scratch, double cost_ns);
  // What the operator's meta kernel returned for a call of this signature (Note [Meta
  // results are remembered]); null before the first.
  const std::vector<c10::IValue>* meta_results(const std::string& signature) const;
  void remember_meta_results(const std::string& signature, std::vector<c10::IValue> results);

 private:
  Backend();
  std::recursive_mutex mutex_;
  RuntimeOptions options_;
  std::unique_ptr<Execution> execution_;  // configures options_; outlives runtime_
  std::unique_ptr<Runtime> runtime_;
  absl::flat_hash_set<RematStorage*> storages_;
  struct KnownCall {
    std::size_t scratch = 0;
    double cost_ns = 0;  // Note [Costs are remembered]
    int runs = 0;        // timed so far, up to three
    std::array<double, 3> times{};
  };
  // Note [Signatures forgotten]: each holds at most twice kSignatures.
  static constexpr std::size_t kSignatures = std::size_t{1} << 14;
  mutable SignatureCache<KnownCall> known_calls_{kSignatures};
  mutable SignatureCache<std::vector<c10::IValue>> meta_{kSignatures};
  bool planned_ = false;  // policy `auto`
  bool estimated_costs_ = true;
  StepPlans plans_;
  RuntimeStats step_start_;  // the stats when the current step began
  std::chrono::steady_clock::time_point step_started_;
  // Begins the runtime's step (Note [A step begins at its first operator]).
  void begin_runtime_step();
  // The program's step has begun and no operator has been called in it yet.
  bool step_pending_ = false;
  // The runtime's step: open from the first operator in the program's step until the
  // optimizer's first call (Note [Planned steps on the device]); whether its backward pass
  // has begun.
  bool step_open_ = false;
  bool step_in_backward_ = false;
  // Under `auto` or with host memory, the storages pinned when the step began.
  std::vector<RematStorage*> pinned_at_start_;
  // Of those, the ones the last step did not read: they wait on the host through the next
  // (Note [State waits on the host]).
  std::vector<RematStorage*> unread_last_step_;
  void offload_unread();
  std::size_t step_max_scratch_ = 0;  // the most scratch a kernel of the step asked for
  std::uint64_t step_serial_ = 0;
  // Of the storages pinned when the step began, those still alive and not read in it.
  std::vector<RematStorage*> unread_pinned() const;
  // Of their bytes, those that will not wait on the host in the next step.
  std::size_t unread_resident_bytes(const std::vector<RematStorage*>& unread) const;
};

// The remat spec of a storage of `nbytes`: bytes (u8), at least one (a zero-byte tensor
// still needs a block the runtime can track).
TensorSpec storage_spec(std::size_t nbytes);
// A c10::Storage of `nbytes` on the device whose bytes are the remat tensor `t`.
c10::Storage make_storage(Tensor t, std::size_t nbytes, bool pinned);
// The same as a DataPtr (what an allocator returns).
c10::DataPtr make_data_ptr(Tensor t, std::size_t nbytes, bool pinned);
// The RematStorage behind a tensor on the device; null for any other tensor.
RematStorage* remat_storage_of(const c10::Storage& storage);
// Makes `s` a constant of the runtime with its current bytes (Note [State is pinned]).
void pin_storage(RematStorage& s, Runtime& rt);
// The device: PrivateUse1, index 0.
c10::Device device();

}  // namespace remat::torch_backend::detail

#endif  // REMAT_PYTORCH_DETAIL_BACKEND_H_
