#include "pytorch/detail/backend.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <utility>
#include <vector>

#include "remat/caching_allocator.h"

namespace remat::torch_backend::detail {
namespace {

// The DataPtr deleter of every device storage: drops the remat tensor under the lock (torch
// may free a storage on the autograd engine's thread).
void delete_remat_storage(void* context) {
  auto* storage = static_cast<RematStorage*>(context);
  Backend& backend = Backend::get();
  std::lock_guard<std::recursive_mutex> lock(backend.mutex());
  backend.storage_dropped(storage);
  delete storage;
}

}  // namespace

Backend& Backend::get() {
  // Never destroyed: storages may outlive static destruction (a module held by Python).
  static Backend* backend = new Backend();
  return *backend;
}

Backend::Backend() : execution_(make_execution(default_execution_name())) {
  execution_->configure(options_);
  options_.accounting = Accounting::kAllocator;
  options_.policy = "dtr";
  // Host memory holds the optimizer's state only (Note [State waits on the host]): on this
  // device the host is the same memory, and activations sent there would only dodge the budget.
  options_.offload_victims = false;
}

Runtime& Backend::runtime() {
  if (runtime_ == nullptr) runtime_ = std::make_unique<Runtime>(options_);
  return *runtime_;
}

void Backend::set_budget(std::size_t bytes) {
  options_.budget = bytes;
  if (runtime_ != nullptr) runtime_->set_budget(bytes);
}

void Backend::set_policy(const std::string& policy) {
  bool known = policy == "auto";
  for (const std::string& name : eviction_policy_names()) known = known || name == policy;
  if (!known) throw std::invalid_argument("remat_torch: unknown policy '" + policy + "'");
  if (policy == this->policy()) return;
  if (!storages_.empty())
    throw std::logic_error("remat_torch: set_policy while " + std::to_string(storages_.size()) +
                           " storages are on the device; set it before moving tensors there");
  planned_ = policy == "auto";
  options_.policy = planned_ ? "hinted" : policy;  // `auto` follows plans as `hinted` does
  plans_.reset();
  runtime_.reset();
}

void Backend::set_execution(const std::string& name) {
  if (name == execution_->name()) return;
  std::unique_ptr<Execution> chosen = make_execution(name);  // an unknown name changes nothing
  if (!storages_.empty())
    throw std::logic_error("remat_torch: set_execution while " + std::to_string(storages_.size()) +
                           " storages are on the device; set it before moving tensors there");
  runtime_.reset();
  execution_ = std::move(chosen);
  execution_->configure(options_);
}

void Backend::set_host_memory(std::size_t bytes) {
  if (bytes == options_.host_memory_bytes) return;
  if (!storages_.empty())
    throw std::logic_error("remat_torch: set_host_memory while " +
                           std::to_string(storages_.size()) +
                           " storages are on the device; set it before moving tensors there");
  options_.host_memory_bytes = bytes;
  runtime_.reset();
}

// Note [A step begins at its first operator]
// The program marks a step before its first line, which often drops the last step's
// gradients (optimizer.zero_grad() sets them to None) before any operator runs. The runtime's
// step begins at the first operator called inside the mark instead: by then those bytes are
// free, so the step's placement (Note [Placed allocations]) finds room for its arena, and the
// storages pinned at its start are those it keeps (Note [What the trace does not see]).
void Backend::begin_step() {
  end_step();
  step_pending_ = true;
}

void Backend::begin_runtime_step() {
  step_pending_ = false;
  ++step_serial_;
  Runtime& rt = runtime();
  offload_unread();  // first: a placed step's arena takes the room they leave
  const StepOptions options = planned_ ? plans_.begin_step(rt.budget()) : StepOptions{};
  rt.begin_step(options);
  step_start_ = rt.stats();
  step_started_ = std::chrono::steady_clock::now();
  step_max_scratch_ = 0;
  pinned_at_start_.clear();
  if (planned_ || options_.host_memory_bytes > 0)
    for (RematStorage* s : storages_)
      if (s->pinned) pinned_at_start_.push_back(s);
  step_open_ = true;
  step_in_backward_ = false;
}

PlanReport Backend::plan_report() const {
  if (planned_) return plans_.report();
  PlanReport off;
  off.phase = "off";
  off.source = "policy " + options_.policy + " plans nothing";
  return off;
}

void Backend::note_call(bool in_backward, bool outside) {
  if (step_pending_) begin_runtime_step();
  if (!step_open_) return;
  if (in_backward && !step_in_backward_) {
    runtime().mark_backward();
    step_in_backward_ = true;
  } else if (outside && step_in_backward_) {
    end_step();  // the optimizer's updates are not planned: constants, never evicted
  }
}

void Backend::end_step() {
  step_pending_ = false;
  if (!step_open_) return;
  step_open_ = false;
  Runtime& rt = runtime();
  RecordedStep step = rt.end_step();
  unread_last_step_ = unread_pinned();
  if (!planned_) return;
  // The optimizer's updates, and the gradients they pin, are not in the recording: the
  // placement ends with the runtime's step (Note [Placed allocations]).
  if (auto* caching = dynamic_cast<CachingAllocator*>(&rt.memory())) caching->end_placement();
  const RuntimeStats now = rt.stats();
  const double base = now.base_cost - step_start_.base_cost;
  const double overhead = base > 0 ? (now.recompute_cost - step_start_.recompute_cost) / base : 0;
  plans_.end_step(
      {.step = std::move(step),
       .overhead = overhead,
       .seconds =
           std::chrono::duration<double>(std::chrono::steady_clock::now() - step_started_).count(),
       .hint_mismatches = now.hint_mismatches - step_start_.hint_mismatches,
       .unread_bytes = unread_resident_bytes(unread_last_step_),
       .max_scratch_bytes = step_max_scratch_});
}

// A storage freed during the step whose address a new one took would count too; the list
// is an estimate (Note [What the trace does not see]).
std::vector<RematStorage*> Backend::unread_pinned() const {
  std::vector<RematStorage*> unread;
  for (RematStorage* s : pinned_at_start_)
    if (storages_.contains(s) && s->pinned && s->read_in_step != step_serial_) unread.push_back(s);
  return unread;
}

// Note [State waits on the host]
// Between two optimizer steps a training step reads its parameters but not the optimizer's
// state, which AdamW keeps at twice the parameters' bytes: pinned through the forward and
// backward passes, where the peak is, for nothing. With host memory
// (RuntimeOptions::host_memory_bytes) and a budget, the constants the last step did not
// read, from its first operator to the optimizer's first call, move to the host tier at the
// next step's first operator (Note [The host tier]); the optimizer's first read of each
// brings it back. Under `auto` the plans are made for the budget with them gone, as far as
// the host memory holds them (Note [What the trace does not see]). What the program reads
// after all comes back where it reads it; results do not change.
void Backend::offload_unread() {
  Runtime& rt = runtime();
  if (options_.host_memory_bytes == 0 || rt.budget() == SIZE_MAX) {  // no budget: no need
    unread_last_step_.clear();
    return;
  }
  for (RematStorage* s : unread_last_step_)
    if (storages_.contains(s) && s->pinned) rt.offload(s->tensor);
  unread_last_step_.clear();
}

// The bytes of `unread` the host memory cannot take, in the order offload_unread offers them.
std::size_t Backend::unread_resident_bytes(const std::vector<RematStorage*>& unread) const {
  std::size_t room = options_.host_memory_bytes, resident = 0;
  for (RematStorage* s : unread) {
    if (s->nbytes <= room)
      room -= s->nbytes;
    else
      resident += s->nbytes;
  }
  return resident;
}

std::optional<std::size_t> Backend::scratch_estimate(const std::string& signature) const {
  const KnownCall* known = known_calls_.find(signature);
  if (known == nullptr) return std::nullopt;
  return known->scratch;
}

std::optional<double> Backend::cost_estimate(const std::string& signature) const {
  const KnownCall* known = known_calls_.find(signature);
  if (known == nullptr) return std::nullopt;
  return known->cost_ns;
}

void Backend::note_run(const std::string& signature, std::size_t scratch, double cost_ns) {
  KnownCall& known = known_calls_[signature];
  known.scratch = std::max(known.scratch, scratch);
  if (step_open_) step_max_scratch_ = std::max(step_max_scratch_, scratch);
  // The first run, the faster of two, then the median of three, which stays.
  const std::array<double, 3>& t = known.times;
  switch (known.runs) {
    case 0:
      known.cost_ns = known.times[0] = cost_ns;
      break;
    case 1:
      known.times[1] = cost_ns;
      known.cost_ns = std::min(t[0], t[1]);
      break;
    case 2:
      known.times[2] = cost_ns;
      known.cost_ns = std::max(std::min(t[0], t[1]), std::min(std::max(t[0], t[1]), t[2]));
      break;
    default:
      return;
  }
  ++known.runs;
}

const std::vector<c10::IValue>* Backend::meta_results(const std::string& signature) const {
  return meta_.find(signature);
}

void Backend::remember_meta_results(const std::string& signature,
                                    std::vector<c10::IValue> results) {
  meta_.insert_or_assign(signature, std::move(results));
}

std::size_t Backend::evict_all() {
  if (runtime_ == nullptr) return 0;
  std::size_t evicted = 0;
  for (RematStorage* s : storages_)
    if (!s->pinned && runtime_->evict(s->tensor)) ++evicted;
  return evicted;
}

void pin_storage(RematStorage& s, Runtime& rt) {
  if (s.pinned) return;
  std::vector<std::byte> bytes(s.tensor.bytes());
  rt.read(s.tensor, bytes.data());
  s.tensor = rt.constant(s.tensor.spec(), bytes.data());
  s.pinned = true;
}

c10::Device device() { return c10::Device(c10::DeviceType::PrivateUse1, 0); }

TensorSpec storage_spec(std::size_t nbytes) {
  return TensorSpec{{static_cast<std::int64_t>(std::max<std::size_t>(nbytes, 1))}, DType::kU8};
}

// Note [Stand-in addresses]
// Programs and libraries tell storages apart by address: `data_ptr()`, `untyped_storage()
// .data_ptr()` (safetensors and transformers find tied weights that way before saving), and
// torch's Python storages refuse every method (`copy_`, `cpu()`, so deepcopy and torch.save)
// where the address is null and the size is not. So each storage gets an address of its own,
// as a device allocation has: a range of its size in an address space no process maps
// (from 2^60 up, never reused), which nothing on the host can read by mistake: its bytes
// are reached only through the runtime.
void* stand_in_address(std::size_t nbytes) {
  static std::atomic<std::uintptr_t> next{std::uintptr_t{1} << 60};
  const std::uintptr_t span = (std::max<std::size_t>(nbytes, 1) + 511) / 512 * 512;
  return reinterpret_cast<void*>(next.fetch_add(span));
}

c10::DataPtr make_data_ptr(Tensor t, std::size_t nbytes, bool pinned) {
  auto* storage = new RematStorage{std::move(t), nbytes, pinned};
  Backend::get().storage_made(storage);
  return c10::DataPtr(stand_in_address(nbytes), storage, &delete_remat_storage, device());
}

c10::Storage make_storage(Tensor t, std::size_t nbytes, bool pinned) {
  return c10::Storage(c10::Storage::use_byte_size_t(), nbytes,
                      make_data_ptr(std::move(t), nbytes, pinned), nullptr, /*resizable=*/false);
}

RematStorage* remat_storage_of(const c10::Storage& storage) {
  if (!storage) return nullptr;
  const c10::DataPtr& data = storage.data_ptr();
  if (data.get_deleter() != &delete_remat_storage) return nullptr;
  return static_cast<RematStorage*>(data.get_context());
}

}  // namespace remat::torch_backend::detail
