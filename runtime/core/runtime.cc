// The public facade: Runtime's members and Tensor handles.
#include "remat/runtime.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "remat/byte_size.h"
#include "runtime/core/runtime_impl.h"

namespace remat {
namespace {
std::vector<detail::Id> ids_of(std::span<const Tensor> tensors, const Runtime* rt) {
  std::vector<detail::Id> ids;
  ids.reserve(tensors.size());
  for (const Tensor& t : tensors) {
    if (!t.defined() || t.runtime() != rt)
      throw std::invalid_argument("remat: an op input is undefined or from another runtime");
    ids.push_back(t.id());
  }
  return ids;
}
detail::Id id_of(const Tensor& t, const Runtime* rt, const char* what) {
  if (!t.defined() || t.runtime() != rt)
    throw std::invalid_argument(
        absl::StrCat("remat: ", what, " of a tensor that is undefined or from another runtime"));
  return t.id();
}
}  // namespace

std::vector<std::string> eviction_policy_names() { return detail::policy_names(); }

std::string RuntimeStats::summary() const {
  std::string line = absl::StrFormat(
      "peak reserved %s (allocated %s), evictions %zu, recomputations %zu, compute overhead "
      "%.4f",
      format_byte_size(memory.peak_reserved), format_byte_size(memory.peak_allocated), evictions,
      recomputations, compute_overhead());
  if (compactions > 0)
    absl::StrAppend(&line, ", compactions ", compactions, " (", format_byte_size(compaction_bytes),
                    ")");
  if (evacuations > 0)
    absl::StrAppend(&line, ", evacuations ", evacuations, " (", format_byte_size(evacuation_bytes),
                    ")");
  if (memory.placed_allocations > 0)
    absl::StrAppend(&line, ", placed allocations ", memory.placed_allocations, " (misses ",
                    memory.placement_misses, ")");
  if (retried_requests > 0) absl::StrAppend(&line, ", requests run again ", retried_requests);
  if (ooms > 0) absl::StrAppend(&line, ", out-of-memory errors ", ooms);
  if (thrashes > 0) absl::StrAppend(&line, ", thrashes ", thrashes);
  return line;
}

Runtime::Runtime(RuntimeOptions options)
    : impl_(std::make_unique<detail::RuntimeImpl>(std::move(options))) {}
Runtime::~Runtime() = default;

// Every member that may reach the device runs with the runtime's device current, and leaves
// the caller's current device as it found it (CudaOptions::device).
using DeviceScope = detail::CudaDevice::Scope;

Tensor Runtime::constant(const TensorSpec& spec, const void* data) {
  DeviceScope scope(impl_->device());
  return Tensor(this, impl_->new_constant(spec, data));
}

std::vector<Tensor> Runtime::call(const OpPtr& op, std::span<const Tensor> inputs) {
  return call_inferred(op, inputs, {});
}

std::vector<Tensor> Runtime::call_with(const OpPtr& op, std::span<const Tensor> inputs,
                                       const Outputs& outputs, double cost) {
  return call_new(op, inputs, outputs, cost, {});
}

std::vector<Tensor> Runtime::call_accumulate(const OpPtr& op, std::span<const Tensor> args,
                                             std::span<const int> accumulated) {
  return call_inferred(op, args, accumulated);
}

// Outputs from the op's shape function, cost from what it declares.
std::vector<Tensor> Runtime::call_inferred(const OpPtr& op, std::span<const Tensor> inputs,
                                           std::span<const int> accumulated) {
  std::vector<TensorSpec> specs;
  specs.reserve(inputs.size());
  for (const Tensor& t : inputs) specs.push_back(t.spec());
  return call_new(op, inputs, op->infer(specs), impl_->declared_cost(*op, specs), accumulated);
}

std::vector<Tensor> Runtime::call_new(const OpPtr& op, std::span<const Tensor> inputs,
                                      const Outputs& outputs, double cost,
                                      std::span<const int> accumulated) {
  auto accumulated_into = [&](int i) {
    return std::find(accumulated.begin(), accumulated.end(), i) != accumulated.end();
  };
  for (const OutputSpec& o : outputs) {
    if (o.alias_of >= static_cast<int>(inputs.size()))
      throw std::invalid_argument(absl::StrCat("remat: op '", op->name, "' aliases input ",
                                               o.alias_of, " of ", inputs.size()));
    // An output read from what the op accumulates into would change with the accumulation.
    if ((o.alias_of >= 0 && accumulated_into(o.alias_of)) ||
        (o.copy_of >= 0 && accumulated_into(o.copy_of)))
      throw std::invalid_argument(absl::StrCat("remat: op '", op->name,
                                               "' has an output that views or copies an "
                                               "argument it accumulates into"));
    if (o.copy_of < 0) continue;
    if (o.alias_of >= 0 || o.copy_of >= static_cast<int>(inputs.size()) ||
        inputs[static_cast<std::size_t>(o.copy_of)].bytes() != o.spec.bytes())
      throw std::invalid_argument(absl::StrCat(
          "remat: op '", op->name, "' declares an output that copies input ", o.copy_of, " of ",
          inputs.size(), ": it must be an input of the same size, and not a view"));
  }
  DeviceScope scope(impl_->device());
  const std::vector<detail::Id> ids =
      impl_->run_new(op, ids_of(inputs, this), outputs, cost, accumulated);
  std::vector<Tensor> result;
  result.reserve(ids.size());
  // run_new gave each output one handle; the Tensor objects take them over.
  for (detail::Id id : ids) result.push_back(Tensor(this, id));
  return result;
}

void Runtime::call_inplace(const OpPtr& op, std::span<Tensor* const> args,
                           std::span<const int> mutated, double cost) {
  std::vector<Tensor> inputs;
  std::vector<TensorSpec> specs;
  for (Tensor* t : args) {
    inputs.push_back(*t);
    specs.push_back(t->spec());
  }
  Outputs outputs;
  for (int m : mutated) {
    if (m < 0 || m >= static_cast<int>(args.size()))
      throw std::invalid_argument(
          absl::StrCat("remat: op '", op->name, "' mutates argument ", m, " of ", args.size()));
    OutputSpec version(specs[static_cast<std::size_t>(m)]);
    version.copy_of = m;  // copy-on-write: the new version starts as the old one
    outputs.push_back(std::move(version));
  }
  if (cost < 0) cost = impl_->declared_cost(*op, specs);
  std::vector<Tensor> fresh = call_with(op, inputs, outputs, cost);
  for (std::size_t i = 0; i < mutated.size(); ++i)
    *args[static_cast<std::size_t>(mutated[i])] = std::move(fresh[i]);
}

const void* Runtime::data(const Tensor& t) {
  if (!impl_->kernels_run())
    throw std::logic_error("remat: tensor data is not readable on the simulated backend");
  DeviceScope scope(impl_->device());
  return impl_->data_pointer(id_of(t, this, "data()"));
}

void Runtime::read(const Tensor& t, void* dst) {
  DeviceScope scope(impl_->device());
  const void* src = data(t);
  impl_->copy_from_storage(dst, src, t.bytes());
}

void Runtime::record_stream(const Tensor& t, CudaStream stream) {
  impl_->record_stream(id_of(t, this, "record_stream"), stream);
}

CudaStream Runtime::stream() const {
  return impl_->device() != nullptr ? impl_->device()->stream() : nullptr;
}

void Runtime::update(const OpPtr& op, std::span<const Tensor> args, std::span<const int> mutated) {
  DeviceScope scope(impl_->device());
  impl_->update_pinned(op, ids_of(args, this), mutated);
}

void Runtime::materialize(const Tensor& t) {
  DeviceScope scope(impl_->device());
  const detail::Id id = id_of(t, this, "materialize");
  impl_->materialize(id);
}
bool Runtime::evict(const Tensor& t) {
  DeviceScope scope(impl_->device());
  return impl_->evict_tensor(id_of(t, this, "evict"));
}
bool Runtime::offload(const Tensor& t) {
  DeviceScope scope(impl_->device());
  return impl_->offload_tensor(id_of(t, this, "offload"));
}
bool Runtime::copy_to_host(const Tensor& t) {
  DeviceScope scope(impl_->device());
  return impl_->copy_to_host_tensor(id_of(t, this, "copy_to_host"));
}
bool Runtime::prefetch(const Tensor& t) {
  DeviceScope scope(impl_->device());
  return impl_->prefetch_tensor(id_of(t, this, "prefetch"));
}
bool Runtime::offloaded(const Tensor& t) const {
  return impl_->offloaded_of(id_of(t, this, "offloaded"));
}
void Runtime::set_budget(std::size_t budget) {
  DeviceScope scope(impl_->device());
  impl_->set_budget(budget);
}
const Timeline& Runtime::timeline() const { return impl_->memory_timeline(); }
std::size_t Runtime::budget() const { return impl_->runtime_options().budget; }
const RuntimeOptions& Runtime::options() const { return impl_->runtime_options(); }
MemoryResource& Runtime::memory() { return impl_->memory_resource(); }
double Runtime::clock() const { return impl_->simulated_clock(); }

RuntimeStats Runtime::stats() const { return impl_->current_stats(); }
std::vector<HeldTensors> Runtime::held_tensors() const { return impl_->held_tensors(); }
void Runtime::reset_peaks() { impl_->reset_peaks(); }

// Steps (step_lifecycle.cc).
void Runtime::begin_step(StepOptions options) { impl_->begin_step(std::move(options)); }
void Runtime::mark_backward() { impl_->mark_backward(); }
RecordedStep Runtime::end_step() { return impl_->end_step(); }
void Runtime::abort_step() { impl_->abort_step(); }
std::uint64_t Runtime::rng_counter() const { return impl_->rng_counter(); }
void Runtime::set_rng_counter(std::uint64_t counter) { impl_->rewind_rng(counter); }
AllocationSequence Runtime::take_allocation_sequence() { return impl_->take_allocation_sequence(); }

void Runtime::retain(std::uint32_t id) { impl_->retain(id); }
void Runtime::release(std::uint32_t id) {
  DeviceScope scope(impl_->device());
  impl_->release(id);
}
const TensorSpec& Runtime::spec_of(std::uint32_t id) const { return impl_->spec_of(id); }
bool Runtime::resident_of(std::uint32_t id) const { return impl_->resident_of(id); }

// ---------------------------------------------------------------------------------------
// Tensor handles

Tensor::Tensor(const Tensor& other) : runtime_(other.runtime_), id_(other.id_) {
  if (runtime_ != nullptr) runtime_->retain(id_);
}
Tensor::Tensor(Tensor&& other) noexcept : runtime_(other.runtime_), id_(other.id_) {
  other.runtime_ = nullptr;
}
Tensor& Tensor::operator=(const Tensor& other) {
  if (this != &other) {
    Tensor copy(other);
    *this = std::move(copy);
  }
  return *this;
}
Tensor& Tensor::operator=(Tensor&& other) noexcept {
  if (this != &other) {
    reset();
    runtime_ = other.runtime_;
    id_ = other.id_;
    other.runtime_ = nullptr;
  }
  return *this;
}
Tensor::~Tensor() { reset(); }
void Tensor::reset() {
  if (runtime_ != nullptr) runtime_->release(id_);
  runtime_ = nullptr;
}
const TensorSpec& Tensor::spec() const {
  if (runtime_ == nullptr) throw std::logic_error("remat: spec() of an undefined tensor");
  return runtime_->spec_of(id_);
}
bool Tensor::resident() const { return runtime_ != nullptr && runtime_->resident_of(id_); }

}  // namespace remat
