// The runtime's internals: lineage records, residency, locks, eviction, recomputation.
#ifndef REMAT_RUNTIME_RUNTIME_IMPL_H_
#define REMAT_RUNTIME_RUNTIME_IMPL_H_

#include <absl/container/flat_hash_map.h>

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <random>
#include <string>
#include <vector>

#include "remat/runtime.h"
#include "runtime/core/candidate_index.h"
#include "runtime/core/lineage.h"
#include "runtime/core/eviction_policy.h"
#include "runtime/core/window_search.h"

namespace remat::detail {

class RuntimeImpl final : public MemoryReclaimer {
 public:
  explicit RuntimeImpl(RuntimeOptions options);
  ~RuntimeImpl() override;

  Id new_constant(const TensorSpec& spec, const void* data);
  // Registers a new op on `inputs` with the given outputs, runs it, and returns the ids of
  // its output tensors, each holding one user handle.
  std::vector<Id> run_new(const OpPtr& op, const std::vector<Id>& inputs, const Outputs& outputs,
                          double cost);
  void make_resident(Id tensor);
  // Runs `op` writing into the pinned storages of args[mutated[i]]; see
  // Note [Updating pinned tensors].
  void update_pinned(const OpPtr& op, const std::vector<Id>& args, std::span<const int> mutated);
  void* data_pointer(Id tensor);
  bool evict_tensor(Id tensor);
  void set_budget(std::size_t budget);

  // Steps, recording and hints (step.cc).
  void begin_step(StepOptions step_options);
  void mark_backward();
  RecordedStep end_step();
  int next_position();  // the position of the op about to be registered (-1 outside a step)
  // After a new op ran (outputs made, not yet touched): sites, hint weights, the recording.
  // Returns the op's hint when the policy is `hinted` and the hint matches the op.
  const OpHint* on_new_op(Id op_id, int position);
  // After its outputs entered the candidate index: the evictions its hint asks for.
  void after_new_op(const OpHint* hint);
  void on_update(const OpDef& op, const std::vector<Id>& args, double cost, int position,
                 const std::vector<Id>& frozen);
  // Note [Following a schedule]: whether a new op is placed by the plan's cursor; running
  // the plan's steps up to the new op at `position` (which may stay deferred); and running
  // what the plan computes before an update at `position` and every deferred op.
  bool following() const { return step_.following; }
  void follow_schedule(Id op_id, int position, const OpHint* hint);
  void settle_before_update(int position);
  bool cancel_deferral(Id op_id);  // ends a deferral without running; false: none
  void on_constant(Id tensor);
  void on_handles_gone(Id tensor);
  void on_host_read(Id tensor);  // the program read it: an output of the recorded step

  void retain(Id tensor);
  void release(Id tensor);
  bool reclaim(std::size_t bytes) override;

  RuntimeOptions options;
  SlotMap<StorageRec> storages;
  SlotMap<TensorRec> tensors;
  SlotMap<OpRec> ops;
  double clock = 0;
  std::unique_ptr<MemoryResource> memory;
  CachingAllocator* caching = nullptr;  // set in allocator accounting
  std::unique_ptr<EvictionPolicy> policy;
  RuntimeStats stats;
  bool runs_kernels = false;
  void* stream = nullptr;  // cudaStream_t of the CUDA backend (null: the default stream)
  Timeline timeline;
  void note_memory();                // appends a memory sample (timeline on)
  // Appends a run of the step's op to the recording; a first run also gives the recorded
  // nodes the op's cost, which is known (measured) only once it has run.
  void note_run(const OpRec& op, bool first_run);

 private:
  struct Frame {
    Id op;
    bool recompute;
    std::vector<Id> locked;  // storages this frame holds locked (one entry per lock)
  };

  bool evictable(const StorageRec& r) const;
  void refresh_candidate(Id s);
  void touch(Id s);
  void reenter_candidate(Id s);
  void refresh_neighbours(Id s);
  void linger(Id s);
  void free_lingering();
  void lock(Id s);
  void unlock(Id s);
  void allocate_storage(Id s);
  void release_memory(Id s);
  void free_storage(Id s);
  void abandon_new_op(Id op_id, const std::vector<Id>& outputs);
  OutOfMemoryError annotated(const OutOfMemoryError& e, const std::string& op);
  std::size_t unpinned_locked_bytes() const;
  void evict(Id s);
  void release_if_dead(Id s);
  bool releasable(const StorageRec& r) const;
  Id choose_victim();
  // The window to evict for a request of `bytes` (Note [Contiguous eviction]), into
  // `evicting_`; nothing where none can make room.
  void choose_window(std::size_t bytes);
  template <typename Score>
  void choose_window(std::size_t bytes, Score score);
  std::vector<Id> freeze_dependents(const std::vector<Id>& roots);  // the storages frozen
  void recompute_storage(Id s);
  const std::function<void(const KernelContext&)>& kernel_of(const OpDef& op) const;
  void kernel_inputs(const std::vector<Id>& inputs, std::vector<const void*>& ptrs,
                     std::vector<const TensorSpec*>& specs) const;
  void run_frames(Id root_op, bool recompute);
  void execute(Id op, bool recompute, const OpRec* waiting);
  void unlock_frame(const Frame& f);
  void release_request_dead();
  void drop_tensor_ref(Id tensor);
  void drop_op_ref(Id op);
  void release_op_ref(Id op);      // drop_op_ref, then whatever that frees
  void drain_tensor_refs();
  void undefer(Id op);             // a deferred op is running: its pending reads end
  void drop_undeferred();          // the references deferred ops held until they ran
  void destroy_storage(Id s);
  std::size_t thrash_limit() const;

  struct Recording {
    Graph graph;
    DtrTrace trace;
    std::vector<std::pair<Id, int>> made;  // (tensor, node) of the step's op outputs
    std::vector<int> executed;             // positions of every op run, recomputations too
    std::vector<int> host_read;            // nodes the program read back (data(), read())
    // Per position: the op's CALL in the trace and its first node (-1: none).
    std::vector<std::pair<int, int>> call_at;
  };
  struct StepState {
    bool active = false;
    std::uint32_t stamp = 0;
    int position = 0;          // of the next op
    Phase phase = Phase::kForward;
    std::shared_ptr<const StepHints> hints;  // null unless the policy is `hinted`
    std::vector<std::vector<Id>> outputs;    // per position: the output tensors
    std::vector<Id> ops_at;                  // per position: the op (kNone: an update)
    bool following = false;                  // a schedule is being followed
    std::size_t cursor = 0;                  // its next step
    std::vector<Id> deferred;                // ops deferred in this step, in order
    std::vector<Id> plan_storages;           // storages the plan holds (plan_refs, plan_spec)
    StepSignature signature;
    std::unique_ptr<Recording> recording;
  };
  void enter_position(const std::string& name, const std::vector<Id>& inputs,
                      std::span<const TensorSpec> outputs, int position);
  int recorded_node(Id tensor);
  void record_call(Id op_id, int position);
  bool is_step_tensor(Id t, int position, int output) const;
  Id op_at(int position) const;
  Id site_tensor(const StepSite& site) const;
  void run_plan_through(int last, Id called = kNone);
  void run_plan_step(const PlanStep& step);
  void free_planned(const StepSite& site, bool evict_held);
  void run_remaining_plan(int end);
  void run_deferred();
  void claim_for_plan(Id s);
  void stop_following();
  void abandon_step();

  StepState step_;
  std::uint32_t step_stamp_ = 0;
  std::unique_ptr<CandidateIndex> candidates_;
  // The window search (Note [Contiguous eviction]) and which of its blocks' keys it
  // refreshed, kept to reuse their buffers.
  WindowSearch window_search_;
  std::vector<bool> window_refreshed_;
  std::vector<Id> evicting_;  // what `reclaim` chose
  std::string current_op_;
  // Unpinned bytes that were locked when `reclaim` last found nothing to evict: what the
  // out-of-memory error reports, since the locks are gone once the failed op has unwound.
  std::optional<std::size_t> failed_locked_bytes_;
  // Storages that lingered (Note [Lingering storages]); freed at the end of each step.
  std::vector<Id> lingering_;
  std::uint64_t rng_counter_ = 0;
  std::mt19937_64 sampler_;
  std::vector<Id> pending_tensors_;
  std::vector<Id> undeferred_;     // deferred ops run by the current request
  bool plan_run_ = false;          // a plan step is running: its op's outputs stay resident
  std::vector<Id> request_fresh_;  // dead storages kept until the running request ends
  std::uint32_t request_ = 0;      // counts top-level requests (run_frames calls)
};

}  // namespace remat::detail

#endif  // REMAT_RUNTIME_RUNTIME_IMPL_H_
