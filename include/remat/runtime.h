// The rematerializing runtime: runs ops, records how every tensor was made, evicts tensors
// when the memory budget is reached and recomputes them when they are read again (DTR).
//
//   remat::Runtime rt({.backend = remat::Backend::kCpu, .budget = size_t{64} << 20,
//                      .policy = "dtr"});
//   remat::Tensor w = rt.constant({{256, 256}}, weights);   // pinned
//   remat::Tensor h = rt.call1(matmul, {x, w});             // may be evicted later
//   std::vector<float> out(h.spec().numel());
//   rt.read(h, out.data());                                 // recomputed if it was evicted
//   rt.stats().evictions;
//
// The budget is a hard cap: with `Accounting::kAllocator` on reserved bytes of the caching
// allocator, with `Accounting::kLogical` on the sum of live tensor sizes. A request that
// cannot fit even after evicting everything evictable throws OutOfMemoryError, and the
// runtime stays usable. See docs/architecture.md for how a tensor flows through it.
#ifndef REMAT_RUNTIME_H_
#define REMAT_RUNTIME_H_

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "remat/caching_allocator.h"
#include "remat/cuda_api.h"
#include "remat/dtr_trace.h"
#include "remat/errors.h"
#include "remat/graph.h"
#include "remat/hints.h"
#include "remat/host_link.h"
#include "remat/memory_resource.h"
#include "remat/op.h"
#include "remat/tensor.h"
#include "remat/timeline.h"

namespace remat {

enum class Backend : std::uint8_t {
  kCpu,        // kernels run on host memory
  kSimulated,  // nothing runs: memory and time are accounted exactly, addresses are fake
  kCuda,       // kernels run on a CUDA device (memory from cudaMalloc)
};
enum class Accounting : std::uint8_t {
  kAllocator,  // every tensor goes through the caching allocator; the budget caps reserved bytes
  kLogical,    // memory is the sum of live tensor sizes, as the DTR simulator counts it
};

// The CUDA backend's settings (docs/architecture.md, "The CUDA backend").
struct CudaOptions {
  // The device the runtime uses. It is made current around the runtime's own calls and the
  // caller's current device is restored after them.
  int device = 0;
  // The stream every kernel, copy and allocation of the runtime is ordered on. Null: the
  // runtime creates a stream of its own (blocking: ordered with the legacy default stream)
  // and destroys it at the end. A stream given here must outlive the runtime.
  CudaStream stream = nullptr;
  // Synchronize after every kernel and raise a failing kernel's error naming its op (also
  // turned on by the environment variable REMAT_CUDA_LAUNCH_BLOCKING=1). Slow: for debugging.
  bool sync_after_launch = false;
  // Bytes of device memory kept for cuBLAS's workspace, allocated at start-up under the
  // budget and pinned; 0 picks cuBLAS's own default (32 MiB from sm_90 on, 4 MiB before).
  std::size_t blas_workspace_bytes = 0;
  // The CUDA calls go through this (tests give a simulated device); null: the CUDA runtime.
  std::shared_ptr<CudaApi> api = nullptr;
  // Runs an op's kernel (on KernelContext::stream); empty: its `cuda_kernel`. A framework
  // routes launches through its own dispatch or profiler here, and the tests run the host
  // kernels as kernels of the simulated device. An op with either kernel may run then.
  std::function<void(const OpDef& op, const KernelContext& k)> launch = nullptr;
};

// What the CUDA backend measured at start-up (zero on other backends).
struct CudaStartup {
  std::size_t device_total_bytes = 0;
  // In use on the device when the runtime started, by the CUDA context, module images and
  // other processes: memory outside the budget, which the budget does not cap.
  std::size_t outside_bytes = 0;
  std::size_t workspace_bytes = 0;  // allocated under the budget, pinned
};

// The link offloaded storages cross (remat/host_link.h) is priced as Note [The host tier] in
// runtime/core/host_tier.cc says.

struct RuntimeOptions {
  Backend backend = Backend::kCpu;
  Accounting accounting = Accounting::kAllocator;
  std::size_t budget = SIZE_MAX;
  std::string policy = "dtr";           // see eviction_policy_names()
  std::size_t min_evictable_bytes = 0;  // smaller tensors are never evicted
  bool sample_candidates = false;       // score a random sqrt(n) sample instead of all
  // In allocator accounting, evict a contiguous address window big enough for the request
  // rather than the best-scored tensors one by one (see Note [Contiguous eviction]).
  bool contiguous_eviction = true;
  // In allocator accounting, when nothing is left to evict, move pinned and locked storages
  // together to make room before reporting out of memory (Note [Compaction]); and move a
  // storage pinned for good below where it was allocated (Note [Packing pinned storages]).
  // Both move bytes that data() pointers from before the last runtime call point to.
  bool compaction = true;
  std::uint64_t seed = 0;  // seeds random ops and the `random` policy
  // Time every op's first run on the host and use that as its cost instead of the declared
  // estimate (CPU backend). Declared estimates can be far off for kernels that run well below
  // peak (a naive attention loop beside an OpenBLAS GEMM), and eviction ranks by cost.
  bool measure_costs = false;
  // Recomputations allowed for one request before it is reported as thrashing; 0 picks a
  // limit proportional to the lineage.
  std::size_t thrash_limit = 0;
  // Simulated time past which the runtime gives up with ThrashError (a replay's cap on
  // slowdown); unlimited by default.
  double clock_limit = INFINITY;
  // Keep a memory timeline (every op run, recomputation and eviction, with the memory after
  // it) for write_timeline_file. Costs a few bytes per event; off by default.
  bool record_timeline = false;
  // Debugging (CPU backend): fill every new output that is neither a view nor a copy with
  // 0xFF bytes (NaN in float32) before its kernel runs, so that a kernel reading an output it
  // did not write fails at once rather than once memory is reused (Note [Outputs start
  // uninitialised] in remat/op.h).
  bool poison_outputs = false;
  // Debugging (CPU backend): hash every input a kernel is given (but those that share memory
  // with its outputs: updates, accumulations) before and after it runs, and throw
  // std::logic_error naming the op and the input where the bytes changed. For kernels that
  // take inputs as non-const pointers (KernelContext::c_input): a write into an input
  // corrupts what recomputation reads. Costs a pass over the inputs per kernel.
  bool check_inputs = false;
  // Allocator settings; the budget field is replaced by `budget`. The expandable arena is
  // opt-in: pooled segments did better on the recorded steps. On CUDA it is built on the
  // virtual memory API where the device supports it.
  // Host memory the runtime may keep offloaded constants in (Runtime::offload), outside the
  // budget; 0: none, offload() refuses. A transfer's cost is priced by `host_link`.
  std::size_t host_memory_bytes = 0;
  HostLink host_link = {};
  // With host memory: an eviction victim the program holds goes to the host instead where a
  // round trip costs less than recomputing it (Note [Keep, recompute or offload]). Off, only
  // offload() and a request that finds nothing else to free move bytes there.
  bool offload_victims = true;
  CachingAllocatorOptions allocator = {};
  // Prices ops that declare their work (OpDef::work); unset: Roofline::gpu() on the CUDA
  // backend, Roofline::cpu() elsewhere.
  std::optional<Roofline> roofline = std::nullopt;
  CudaOptions cuda = {};
};

std::vector<std::string> eviction_policy_names();

struct RuntimeStats {
  MemoryStats memory;  // of the memory resource
  std::size_t evictions = 0;
  std::size_t recomputations = 0;
  std::size_t calls = 0;      // ops run for the first time
  double base_cost = 0;       // cost of first runs
  double recompute_cost = 0;  // cost of recomputations
  double search_seconds = 0;  // wall time spent choosing what to evict
  std::size_t ooms = 0;
  // Requests that ran out of memory and then ran, once everything evictable was evicted
  // (Note [Running a request once more] in runtime/core/request_retry.cc).
  std::size_t retried_requests = 0;
  std::size_t thrashes = 0;
  std::size_t pinned_bytes = 0;
  // Tensors pinned by update() or call_accumulate() (Note [Updating pinned tensors]).
  std::size_t frozen = 0;
  // update() calls and first runs of call_accumulate() that reached their kernel: pinned
  // memory may have been written (a step that did so cannot be run again).
  std::size_t updates = 0;
  // Pinned storages moved below where they were, so that they do not split free memory
  // (Note [Packing pinned storages]).
  std::size_t packed_storages = 0;
  // Times a request that nothing was left to evict for was served by moving pinned or
  // locked storages together instead, and the bytes moved (Note [Compaction]).
  std::size_t compactions = 0;
  std::size_t compaction_bytes = 0;
  // Segments emptied through the host and reserved again packed, when compaction had nowhere
  // to move blocks to, and the bytes copied (Note [Evacuating segments]).
  std::size_t evacuations = 0;
  std::size_t evacuation_bytes = 0;
  std::size_t hint_evictions = 0;  // storages evicted because a hint said the plan frees them
  std::size_t hint_mismatches =
      0;                           // ops whose hint named another op (see Note [Hints by position])
  std::size_t deferred_ops = 0;    // ops run after later ones, as a followed plan ordered them
                                   // (Note [Following a schedule] in remat/hints.h)
  std::size_t live_tensors = 0;    // tensor records alive (held or kept for lineage)
  std::size_t resident_bytes = 0;  // bytes of resident storages
  std::size_t peak_resident_bytes = 0;
  // The host tier (Runtime::offload): storages moved to host memory, storages brought back,
  // the bytes on the host now and at most, the simulated time the copies took on their
  // engines, and how long the clock waited for them (Note [Copies beside the kernels]).
  std::size_t offloads = 0;
  std::size_t restores = 0;
  std::size_t offloaded_bytes = 0;
  std::size_t peak_offloaded_bytes = 0;
  double transfer_cost = 0;
  double transfer_exposed = 0;
  CudaStartup cuda;
  // Recomputed cost over base cost.
  double compute_overhead() const { return base_cost > 0 ? recompute_cost / base_cost : 0.0; }
  // One line for a log: peak reserved, evictions, recomputations, the compute overhead, and
  // compactions and out-of-memory errors where there were any.
  std::string summary() const;
};

// What begin_step() is told about the step that follows.
struct StepOptions {
  // Hints from a static plan (remat/hints.h); the `hinted` policy acts on them: it follows
  // the plan's schedule where they carry one (Note [Following a schedule]), evicts what the
  // plan frees once the plan frees it, and weighs DTR's scores by what the plan keeps and
  // recomputes. Other policies ignore them.
  std::shared_ptr<const StepHints> hints;
  bool record = false;        // record the step; end_step() returns it as a graph and a trace
  std::string name = "step";  // the recorded graph's and trace's name
  // Allocator accounting only (Note [Placed allocations] in step_placement.cc): record the
  // step's allocations, from begin_step() until take_allocation_sequence(); or serve them at
  // the places a placement of such a sequence gives (holes beside live blocks, then one arena)
  // until the next begin_step(). A step that makes other requests than the recorded ones is served
  // as usual from where it left the sequence, so a placement never changes results.
  bool record_allocations = false;
  std::shared_ptr<const Placement> placement;
};

// A step as the runtime ran it (first runs only; recomputations are the runtime's business).
struct RecordedStep {
  // remat-graph-v1: every op output a node (views kind `view`, several outputs a `group`),
  // with bytes, cost (an equal share of its op's) and phase (backward after mark_backward());
  // tensors made before the step that it reads are `input` nodes; update() calls are
  // zero-byte nodes that may not be recomputed. Each node carries its site (op position,
  // output index), which hints are keyed by. Its outputs are what the program still holds at
  // end_step() and what it read back during the step (data(), read()).
  Graph graph;
  // The same step in the DTR log format (handle k is node k), with the releases the program
  // made, so that remat-replay re-runs exactly what ran.
  DtrTrace trace;
  // The position of every op run in the step, in order, recomputations included: with the
  // graph's sites, the schedule the runtime realized (realized_schedule in graph_transforms.h).
  std::vector<int> executed;
  StepSignature signature;
};

namespace detail {
class RuntimeImpl;
}

class Runtime {
 public:
  explicit Runtime(RuntimeOptions options = {});
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // A tensor that exists before the step (a parameter, an input): pinned forever. `data` is
  // copied in (may be null: the memory is left uninitialised, as on the simulated backend).
  Tensor constant(const TensorSpec& spec, const void* data = nullptr);

  // Runs `op` on `inputs` and returns its outputs.
  std::vector<Tensor> call(const OpPtr& op, std::span<const Tensor> inputs);
  std::vector<Tensor> call(const OpPtr& op, std::initializer_list<Tensor> inputs) {
    return call(op, std::span<const Tensor>(inputs.begin(), inputs.size()));
  }
  Tensor call1(const OpPtr& op, std::initializer_list<Tensor> inputs) {
    return call(op, inputs).at(0);
  }
  // The same with the output specs and cost given rather than inferred (recorded traces).
  std::vector<Tensor> call_with(const OpPtr& op, std::span<const Tensor> inputs,
                                const Outputs& outputs, double cost);

  // An in-place op, run as copy-on-write: for each i in `mutated` the op's output (in that
  // order) is a new version of `args[i]` that starts as a copy of the old one
  // (OutputSpec::copy_of), so a kernel that updates it in place (`x[j] += 1`) sees the old
  // values; those handles are rebound to the new versions. Other handles to the old versions
  // keep seeing the old data, and a recomputation copies the old version again.
  void call_inplace(const OpPtr& op, std::span<Tensor* const> args, std::span<const int> mutated,
                    double cost = -1);

  // A kernel that makes new outputs and also adds into constants in place, in one call: a
  // backward kernel that writes an activation gradient and accumulates into parameter
  // gradients (`dweight[i] += ...`). The kernel's outputs are the op's own (op->infer), then
  // the memory of args[accumulated[0]], args[accumulated[1]], ..., which must be constants.
  // The new outputs are recomputable like any op's; a recomputation writes its accumulation
  // into scratch that is thrown away, so it adds into the constants exactly once (and the new
  // outputs must not depend on what the constants held). Held tensors whose recomputation
  // reads the constants' old values are frozen first, as update() does.
  std::vector<Tensor> call_accumulate(const OpPtr& op, std::span<const Tensor> args,
                                      std::span<const int> accumulated);

  // Runs `op` in place on pinned tensors (parameters, optimizer state, running statistics):
  // the kernel's output i is the memory of `args[mutated[i]]`, which must be constants; the
  // other arguments are read. Tensors still held whose recomputation would read the old
  // values are first made resident and pinned, so they keep their bits. Optimizers use it
  // (kernels/ops.h `adamw`); it is never recorded in the lineage and never recomputed.
  void update(const OpPtr& op, std::span<const Tensor> args, std::span<const int> mutated);
  void update(const OpPtr& op, std::initializer_list<Tensor> args,
              std::initializer_list<int> mutated) {
    update(op, std::span<const Tensor>(args.begin(), args.size()),
           std::span<const int>(mutated.begin(), mutated.size()));
  }

  // Makes the tensor resident (recomputing it if needed) and returns its data. The pointer
  // is valid until the next call into the runtime: any later call may evict the tensor and
  // reuse its memory. On the CUDA backend it is device memory, and "valid" is in stream
  // order: work enqueued on the runtime's stream before that next call may use it; work on
  // another stream may use it only if `record_stream` says so (Note [Stream-ordered reuse]).
  const void* data(const Tensor& t);
  template <typename T>
  const T* data(const Tensor& t) {
    return static_cast<const T*>(data(t));
  }
  // Copies the tensor's bytes to host memory at `dst`.
  void read(const Tensor& t, void* dst);
  // CUDA backend: says that work on `stream` (a user kernel, a copy, a collective) uses the
  // memory of `t`, which must be resident (just after data()). When the runtime frees or
  // evicts it, the memory is reused only once the work `stream` had enqueued by then has
  // completed. No-op on the other backends (their kernels run synchronously); throws
  // std::invalid_argument for an undefined or released tensor, or one from another runtime,
  // and std::logic_error for one that is not resident.
  void record_stream(const Tensor& t, CudaStream stream);
  // The stream the runtime orders its work on (CUDA backend; null elsewhere).
  CudaStream stream() const;
  // Makes the tensor resident as reading it would, without reading it: the simulated
  // backend's stand-in for read() (a recorded step counts it as read back).
  void materialize(const Tensor& t);
  // Evicts the tensor's storage now if it is evictable; returns whether it did.
  bool evict(const Tensor& t);
  // Moves the bytes of the tensor's storage to host memory (RuntimeOptions::host_memory_bytes),
  // out of the budget; the first use that needs them (an op reading it, data(), read(), an
  // update) brings them back. Returns whether it moved them: not for a storage that is not
  // resident, is in use by a running op, does not fit in the host memory left, or is neither
  // a constant nor held by a handle (Note [The host tier] in runtime/core/host_tier.cc).
  // Under a budget the runtime also offloads by itself where moving a victim costs less than
  // recomputing it (Note [Keep, recompute or offload]).
  bool offload(const Tensor& t);
  bool offloaded(const Tensor& t) const;  // its bytes are on the host now
  // Starts copying a resident tensor's bytes to the host while it stays resident, so that a
  // later offload() need only wait for what is left of the copy (the same conditions as
  // offload(); false where it may not, or a copy exists). And starts copying an offloaded
  // tensor back, its device memory taken now and its first use waiting for the copy: the
  // copies run beside the kernels (Note [Copies beside the kernels] in
  // runtime/core/host_tier.cc). On CUDA they are still synchronous.
  bool copy_to_host(const Tensor& t);
  bool prefetch(const Tensor& t);

  // A training step: ops are numbered from here (their position), hints apply by position,
  // and the step may be recorded. Steps do not nest; begin_step() ends an unfinished one.
  void begin_step(StepOptions options = {});
  // Marks the start of the backward pass (recorded as the phase of the nodes that follow).
  void mark_backward();
  // Ends the step; returns what was recorded (empty unless StepOptions::record) and the
  // step's signature.
  RecordedStep end_step();
  // Ends the step after an error the program caught (an OutOfMemoryError, say) without
  // running what it deferred, and rewinds the random-number counter to where the step
  // began, so that the program can run the same step again (with a plan, say) and draw the
  // same random numbers: the rerun computes what the step would have. The program lets go
  // of the step's tensors first; an update that already ran is not undone.
  void abort_step();
  // The counter of the random-number stream (Philox's, with RuntimeOptions::seed as its key)
  // that the next random op starts from; each random op takes the counters after it. A
  // data-parallel program sets it at each shard of a step (one micro-batch, one rank's part),
  // so that the shard draws the same numbers whichever process runs it and whatever ran
  // before. Recomputations keep the counters their op first had.
  std::uint64_t rng_counter() const;
  void set_rng_counter(std::uint64_t counter);
  // Ends the recording StepOptions::record_allocations began and returns it (empty in logical
  // accounting). Take it once the program has let go of the step's tensors, so that their
  // frees are in it.
  AllocationSequence take_allocation_sequence();

  // The memory timeline since construction (RuntimeOptions::record_timeline).
  const Timeline& timeline() const;

  // The tensors the program holds handles to, by the op that made them, the groups with the
  // most resident bytes first: what keeps memory alive that only the program can let go of.
  std::vector<HeldTensors> held_tensors() const;

  void set_budget(std::size_t budget);
  std::size_t budget() const;
  RuntimeStats stats() const;
  void reset_peaks();
  const RuntimeOptions& options() const;
  MemoryResource& memory();
  // Simulated time: the sum of the costs of every op run so far, recomputations included.
  double clock() const;

 private:
  friend class Tensor;
  std::vector<Tensor> call_inferred(const OpPtr& op, std::span<const Tensor> inputs,
                                    std::span<const int> accumulated);
  std::vector<Tensor> call_new(const OpPtr& op, std::span<const Tensor> inputs,
                               const Outputs& outputs, double cost,
                               std::span<const int> accumulated);
  void retain(std::uint32_t id);
  void release(std::uint32_t id);
  const TensorSpec& spec_of(std::uint32_t id) const;
  bool resident_of(std::uint32_t id) const;

  std::unique_ptr<detail::RuntimeImpl> impl_;
};

}  // namespace remat

#endif  // REMAT_RUNTIME_H_
