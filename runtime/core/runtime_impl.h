// The runtime core: lineage records, residency, locks, eviction and recomputation. A step
// (recording, plan following) joins it through StepHooks and reaches it through StepHost;
// see docs/architecture.md.
#ifndef REMAT_RUNTIME_CORE_RUNTIME_IMPL_H_
#define REMAT_RUNTIME_CORE_RUNTIME_IMPL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "remat/runtime.h"
#include "runtime/core/candidate_index.h"
#include "runtime/core/eviction_policy.h"
#include "runtime/core/host_tier.h"
#include "runtime/core/lineage.h"
#include "runtime/core/step_hooks.h"
#include "runtime/core/window_search.h"
#include "runtime/cuda/cuda_device.h"

namespace remat::detail {

// Requests made while it lives are outside a step's placed sequence (Note [Placed
// allocations] in step_placement.cc): a kernel's scratch, what the simulated traces a
// placement is made from never ask for (`short_lived`: given back when the kernel ends), and
// constants.
class PlacementPause {
 public:
  PlacementPause(CachingAllocator* caching, bool short_lived)
      : caching_(caching), short_lived_(short_lived) {
    if (caching_ != nullptr) caching_->pause_placement(true, short_lived_);
  }
  ~PlacementPause() {
    if (caching_ != nullptr) caching_->pause_placement(false, short_lived_);
  }
  PlacementPause(const PlacementPause&) = delete;
  PlacementPause& operator=(const PlacementPause&) = delete;

 private:
  CachingAllocator* caching_;
  bool short_lived_;
};

class RuntimeImpl final : public MemoryReclaimer, public StepHost {
 public:
  explicit RuntimeImpl(RuntimeOptions options);
  ~RuntimeImpl() override;

  // What the facade asks of it (runtime.cc).
  Id new_constant(const TensorSpec& spec, const void* data);
  // Registers a new op on `inputs` with the given outputs, runs it, and returns the ids of
  // its output tensors, each holding one user handle.
  // `accumulates`: inputs (constants) the kernel also adds into in place (Note [Accumulating
  // into constants] in update.cc).
  std::vector<Id> run_new(const OpPtr& op, const std::vector<Id>& inputs, const Outputs& outputs,
                          double cost, std::span<const int> accumulates = {});
  void make_resident(Id tensor);
  void materialize(Id tensor);  // make_resident, counted by a recording as read back
  // Runs `op` writing into the pinned storages of args[mutated[i]]; see
  // Note [Updating pinned tensors].
  void update_pinned(const OpPtr& op, const std::vector<Id>& args, std::span<const int> mutated);
  void* data_pointer(Id tensor);
  void record_stream(Id tensor, CudaStream stream);
  // The cost an op declares for inputs of `specs`: its work at the roofline, else its cost
  // function; -1 where it declares neither (measured on its first run).
  double declared_cost(const OpDef& op, SpecList specs) const;
  bool evict_tensor(Id tensor);
  // The host tier (host_tier.cc, Note [The host tier]): moves a resident storage's bytes to
  // the host; false where it may not (RuntimeImpl::offloadable).
  bool offload(Id storage) override;
  bool offload_tensor(Id tensor) { return offload(tensors[tensor].storage); }
  // Starts the copy of a resident storage to the host, leaving it resident, so that a later
  // offload need not wait for all of it; and starts the copy back of an offloaded one, which
  // its first use waits for (Note [Copies beside the kernels]).
  bool copy_to_host(Id storage) override;
  bool copy_to_host_tensor(Id tensor) { return copy_to_host(tensors[tensor].storage); }
  bool prefetch(Id storage) override;
  bool prefetch_tensor(Id tensor) { return prefetch(tensors[tensor].storage); }
  bool offloaded_of(Id tensor) const { return storages[tensors[tensor].storage].offloaded; }
  void set_budget(std::size_t budget);
  void retain(Id tensor);
  void release(Id tensor);
  bool reclaim(std::size_t bytes) override;
  RuntimeStats current_stats() const;
  std::vector<HeldTensors> held_tensors() const;
  void reset_peaks();
  const RuntimeOptions& runtime_options() const { return options; }
  MemoryResource& memory_resource() { return *memory; }
  const Timeline& memory_timeline() const { return timeline; }
  double simulated_clock() const { return clock_base + clock; }
  bool kernels_run() const { return runs_kernels; }
  CudaDevice* device() const { return cuda.get(); }
  // Host bytes to a storage's memory and back: through pinned staging on CUDA, memcpy on
  // the host (kernels must run).
  void copy_to_storage(void* dst, const void* host, std::size_t bytes);
  void copy_from_storage(void* host, const void* src, std::size_t bytes);
  const TensorSpec& spec_of(Id tensor) const { return tensors[tensor].spec; }
  bool resident_of(Id tensor) const { return storages[tensors[tensor].storage].resident; }

  // Steps (step_lifecycle.cc): Runtime::begin_step, mark_backward, end_step, abort_step and
  // take_allocation_sequence.
  void begin_step(StepOptions options);
  void mark_backward();
  RecordedStep end_step();
  void abort_step();
  AllocationSequence take_allocation_sequence();

  // StepHost: what a step may ask of the core (step_lifecycle.cc).
  const TensorRec& tensor(Id t) const override { return tensors[t]; }
  const OpRec& op(Id o) const override { return ops[o]; }
  const StorageRec& storage(Id s) const override { return storages[s]; }
  void set_tensor_site(Id t, std::uint32_t stamp, int position, int output) override;
  void set_tensor_node(Id t, int node) override { tensors[t].node = node; }
  void set_op_site(Id op, std::uint32_t stamp, int position) override;
  void set_holds(Id s, std::uint32_t holds) override {
    storages[s].holds = holds;
    if (holds == 0) drop_dead_offload(s);  // a plan's offloaded instance nothing needs now
  }
  void defer(Id op) override;
  void end_deferral(Id op) override { ops[op].deferred = false; }
  void note_deferred(Id op) override;
  void run_op(Id op, bool recompute) override;
  bool evictable(Id s) const override { return evictable(storages[s]); }
  void evict_for_hint(Id s) override;
  void release_if_dead(Id s) override;  // frees a resident storage that nothing holds
  void release_op_ref(Id op) override;  // drops a reference to an op, then whatever that frees
  bool uses_hints() const override;
  void set_hint_weight(Id s, float weight) override;
  void count_hint_mismatch() override { ++stats.hint_mismatches; }
  OutOfMemoryError annotated(const OutOfMemoryError& e) override {
    return annotated(e, current_op);
  }
  // The random-number counter the next random op starts from (Runtime::set_rng_counter).
  std::uint64_t rng_counter() const { return rng_counter_; }
  void rewind_rng(std::uint64_t counter) { rng_counter_ = counter; }

 private:
  // Runs `root_op` (a recomputation if `recompute`) once its inputs are resident, recomputing
  // what they need first (Note [Iterative recomputation]).
  void run_frames(Id root_op, bool recompute);
  // One try of run_frames; with `hold_root_inputs` the root op locks each input as soon as
  // the walk has made it resident (Note [Running a request once more]).
  void walk_frames(Id root_op, bool recompute, bool hold_root_inputs);
  // Evicts every evictable storage; returns how many (Note [Running a request once more]).
  std::size_t evict_everything_evictable();
  bool evictable(const StorageRec& r) const;
  void evict(Id s);
  void free_lingering();  // Note [Lingering storages]; at the end of each step
  // The memory resource's error, counted and completed with the op and the locked bytes.
  OutOfMemoryError annotated(const OutOfMemoryError& e, const std::string& op);
  void note_memory();  // appends a memory sample (timeline on)

  RuntimeOptions options;
  SlotMap<StorageRec> storages;
  SlotMap<TensorRec> tensors;
  SlotMap<OpRec> ops;
  // Simulated time since the current step began (Note [Each step's own clock]), and the
  // time of the steps before it: the policies and the host tier read `clock`, reports the sum.
  double clock = 0;
  double clock_base = 0;
  void start_step_clock();
  // The CUDA backend's device (null elsewhere); declared before `memory`, which uses it to
  // its end.
  std::unique_ptr<CudaDevice> cuda;
  std::unique_ptr<MemoryResource> memory;
  CachingAllocator* caching = nullptr;  // set in allocator accounting
  std::unique_ptr<EvictionPolicy> policy;
  RuntimeStats stats;
  bool runs_kernels = false;
  Roofline roofline;          // prices ops that declare their work
  void* workspace = nullptr;  // CUDA: cuBLAS's workspace, pinned under the budget
  std::size_t workspace_bytes = 0;
  Timeline timeline;
  std::string current_op;            // the op being run or recomputed, for errors
  std::unique_ptr<StepHooks> step;   // the step under way (step.h); null: none
  std::uint32_t steps_begun = 0;     // stamps each step's records (TensorRec::step, OpRec::step)
  std::uint64_t step_rng_start = 0;  // the RNG counter when the step began (abort_step)
  bool step_unfinished = false;      // begun, and not ended without an error

  struct Frame {
    Id op;
    bool recompute;
    std::vector<Id> locked;  // storages this frame holds locked (one entry per lock)
  };
  // Locks for `root` each storage of `made` that is in `wanted`, taking it out of `wanted`.
  void hold_for_root(Frame& root, const std::vector<Id>& made, std::vector<Id>& wanted);

  // An op's outputs while it runs: `held` are locked until the kernel has run, `fresh` got
  // memory from this run, `scratch` is memory for outputs whose records died.
  struct OutputMemory {
    bool rerun = false;
    std::vector<void*> ptrs;  // the outputs', then what the op accumulates into
    std::vector<Id> held;
    std::vector<Id> fresh;
    std::vector<std::pair<void*, std::size_t>> scratch;
    std::pair<void*, std::size_t> reserved{nullptr, 0};  // OpDef::scratch_bytes, in `scratch`
  };

  void reserve_workspace();  // Note [CUDA start-up memory]
  void* allocate_for_good(std::size_t bytes);

  // Residency and candidates (runtime_impl.cc).
  void refresh_candidate(Id s);
  void touch(Id s);
  void reenter_candidate(Id s);
  void refresh_neighbours(Id s);
  void linger(Id s);
  void lock(Id s);
  void unlock(Id s);
  void allocate_storage(Id s);
  void release_memory(Id s);
  // Moves pinned storage `s` below where it is when a free block there holds it; with
  // `copy_bytes` false its bytes are not yet written (a constant before its upload).
  void pack_pinned(Id s, bool copy_bytes = true);
  void move_storage(Id s, void* to, bool copy_bytes);
  // Moves pinned and locked storages out of the way of a request nothing is left to evict
  // for (Note [Compaction] in eviction_choice.cc); false when that cannot make room.
  bool compact(std::size_t bytes);
  // What the blocks it moves keep out of (eviction_choice.cc): the chosen blocks' segments,
  // or, where those leave no room, the chosen window's address range.
  AvoidedMemory chosen_segments() const;
  AvoidedMemory chosen_window_range() const;
  // Why no block may move now (a kernel running, compaction off), or nullptr: what
  // compaction and evacuation both refuse on.
  const char* move_refusal() const;
  // Remembers, for an out-of-memory error, why compaction moved nothing; false.
  bool refuse_moves(const char* why);
  // Whether the block tagged `tag` may move: a resident storage's, or a scratch block of the
  // op being prepared, that no other stream uses (not free, not a running kernel's scratch
  // or a workspace).
  bool movable_block(std::uint32_t tag) const;
  // A movable block's bytes and address, and moving it to `to` (a storage's bytes copied).
  std::size_t movable_bytes(std::uint32_t tag) const;
  void* movable_ptr(std::uint32_t tag) const;
  void move_block(std::uint32_t tag, void* to);
  // Empties fragmented segments through the host and reserves their blocks again back to
  // back (Note [Evacuating segments] in runtime/alloc/packed_segment.cc); false when that
  // cannot make room (evacuation.cc).
  bool evacuate(std::size_t bytes);
  // Note [A placed step starts packed] in evacuation.cc.
  void pack_for_placement();
  void evacuate_segment(const std::vector<std::uint32_t>& moving);
  bool slide_down();  // Note [Sliding the arena down] in evacuation.cc
  std::vector<std::vector<unsigned char>> free_to_host(const std::vector<std::uint32_t>& moving);
  void place_evacuated(std::uint32_t tag, void* to, const std::vector<unsigned char>& staged);
  void free_storage(Id s);
  bool releasable(const StorageRec& r) const;
  // Resident memory by why it stays, as allocated (Note [Where the memory went]).
  struct ResidentBreakdown {
    std::size_t pinned = 0, locked = 0, kept = 0;
    const char* moves_refused = nullptr;  // why compaction moved nothing, where it was refused
  };
  ResidentBreakdown resident_breakdown() const;
  void recompute_storage(Id s);

  // Choosing what to evict (eviction_choice.cc).
  Id choose_victim();
  // The window to evict for a request of `bytes` (Note [Contiguous eviction]), into
  // `evicting_`; nothing where none can make room.
  void choose_window(std::size_t bytes);
  template <typename Score>
  void choose_window(std::size_t bytes, Score score);
  template <typename CostOf>
  void price_windows(std::size_t bytes, CostOf cost_of);

  // Running ops (execution.cc).
  Id register_op(const OpPtr& op, const std::vector<Id>& inputs, double cost);
  std::vector<Id> make_outputs(Id op_id, const std::vector<Id>& inputs, const Outputs& outputs);
  Id add_output(Id op_id, TensorRec tr, int alias_of, int copy_of);
  void unregister_op(Id op_id, const std::vector<Id>& inputs, const std::vector<Id>& outputs);
  void abandon_new_op(Id op_id, const std::vector<Id>& outputs);
  std::size_t thrash_limit() const;
  Id lock_inputs(Frame& f, std::vector<bool>& held);
  void unlock_frame(const Frame& f);
  void release_request_dead();
  void execute(Id op, bool recompute, const OpRec* waiting);
  void give_outputs_memory(Id op_id, OutputMemory& m);
  void take_outputs_memory(Id op_id, OutputMemory& m);
  // Scratch for the op being prepared, in m.scratch and tagged movable until it launches
  // (Note [Scratch moves until its kernel launches] in op_scratch.cc).
  void* allocate_op_scratch(OutputMemory& m, std::size_t bytes, bool unplaced);
  void move_op_scratch(std::size_t k, void* to);
  void place_op_scratch(std::size_t k, void* to);
  void reserve_declared_scratch(Id op_id, OutputMemory& m);
  void release_outputs(OutputMemory& m);
  void settle_fresh_outputs(const std::vector<Id>& fresh, bool recompute, const OpRec* waiting);
  double run_op(const OpRec& op, const OutputMemory& m, bool rerun);
  void prepare_outputs(const OpRec& op, const std::vector<const void*>& in_ptrs,
                       const std::vector<void*>& outs);
  bool has_kernel(const OpDef& op) const;  // one this backend can run
  void kernel_inputs(const std::vector<Id>& inputs, std::vector<const void*>& ptrs,
                     std::vector<const TensorSpec*>& specs) const;
  // The one place an op's run takes time: runs its kernel where kernels run, measured if
  // asked, and advances the clock by its cost with a timeline event. Returns the cost.
  // `reserved`: scratch reserved before the kernel (OpDef::scratch_bytes).
  double launch(const OpDef& op, KernelContext ctx, double cost, bool measure,
                TimelineEvent::Kind kind, std::size_t bytes,
                std::pair<void*, std::size_t> reserved = {nullptr, 0});

  // Updates of pinned tensors (update.cc).
  std::vector<Id> pinned_targets(const OpDef& op, const std::vector<Id>& args,
                                 std::span<const int> mutated) const;
  std::vector<Id> freeze_dependents(const std::vector<Id>& roots);  // the storages frozen
  void release_inputs_if_frozen(Id op);
  // Before a new op that accumulates into the constants `targets` runs at `position`.
  void prepare_accumulation(const std::vector<Id>& targets, int position);
  void* allocate_unplaced(std::size_t bytes);

  void restore(Id s);     // an offloaded storage's bytes back on the device
  void wait_ready(Id s);  // the clock waits for a copy back in flight
  void wait_until(double t);
  void discard_host_copy(Id s);  // a resident storage's copy on the host is stale or unneeded
  bool offload_coldest();        // when nothing else makes room: Note [The host tier]
  bool offloadable(const StorageRec& r) const;
  void evict_or_offload(Id s);  // Note [Keep, recompute or offload]
  void drop_dead_offload(Id s);

  // Lineage lifetime (lineage_lifetime.cc).
  void drop_tensor_ref(Id tensor);
  void drop_op_ref(Id op);
  void drain_tensor_refs();
  void destroy_storage(Id s);

  HostTier host_;
  std::unique_ptr<CandidateIndex> candidates_;
  // The window search (Note [Contiguous eviction]) and which of its blocks' keys it
  // refreshed, kept to reuse their buffers.
  WindowSearch window_search_;
  std::vector<bool> window_refreshed_;
  std::vector<Id> evicting_;  // what `reclaim` chose
  // Resident memory when `reclaim` last found nothing to evict: what the out-of-memory error
  // reports, since the locks are gone once the failed op has unwound.
  std::optional<ResidentBreakdown> failed_breakdown_;
  // First runs whose kernel started and failed (Note [Running a request once more]).
  std::size_t failed_first_runs_ = 0;
  // Storages that lingered (Note [Lingering storages]); freed at the end of each step.
  std::vector<Id> lingering_;
  std::uint64_t rng_counter_ = 0;
  std::mt19937_64 sampler_;
  std::vector<Id> pending_tensors_;
  std::vector<Id> request_fresh_;      // dead storages kept until the running request ends
  std::uint32_t request_ = 0;          // counts top-level requests (run_frames calls)
  bool kernel_running_ = false;        // a kernel may be asking for scratch: nothing moves
  OutputMemory* preparing_ = nullptr;  // the op whose memory is being taken, if any
  // Compactions and evacuations are bounded per top-level request (Note [Compaction]), so
  // that two layouts cannot trade blocks forever.
  static constexpr int kMaxCompactionsPerRequest = 8;
  struct PerRequestCount {
    std::uint32_t request = 0;
    int count = 0;
    // The count for request `current`, from 0 where it is a new one.
    int& in(std::uint32_t current) {
      if (request != current) {
        request = current;
        count = 0;
      }
      return count;
    }
  };
  PerRequestCount compactions_, evacuations_;
  // Why the last compaction was refused (OutOfMemoryInfo::moves_refused); nullptr where it
  // was tried.
  const char* moves_refused_ = nullptr;
};

}  // namespace remat::detail

#endif  // REMAT_RUNTIME_CORE_RUNTIME_IMPL_H_
