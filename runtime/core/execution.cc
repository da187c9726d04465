// Running ops: registering a new op, making its inputs resident (recomputing them), running
// its kernel.
#include "runtime/alloc/detail/allocator_hooks.h"
#include "runtime/alloc/detail/blocks.h"
#include "runtime/core/input_check.h"
#include "runtime/core/runtime_impl.h"
#include "runtime/core/wall_clock.h"

#include <absl/strings/str_cat.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>

namespace remat::detail {

std::size_t RuntimeImpl::thrash_limit() const {
  if (options.thrash_limit != 0) return options.thrash_limit;
  return 8 * ops.live() + 1024;
}

// Inputs are locked while their op runs, so they are out of the candidate index; they go
// back in with the use that `run_frames` recorded when the op began.
void RuntimeImpl::unlock_frame(const Frame& f) {
  for (Id s : f.locked) {
    unlock(s);
    if (storages[s].keep_in != request_) linger(s);
  }
}

// Note [Iterative recomputation]
// Making an op's inputs resident may need their producers recomputed, whose inputs may need
// theirs, and so on down a chain as long as the step. The walk keeps an explicit stack of
// frames instead of recursing, so a 100,000-op chain cannot overflow the call stack. A frame
// locks every input it finds resident, at once, so that recomputing a missing input cannot
// evict another input of the same op (which would send the walk in circles); when every
// input is resident and locked the op runs, its frame unlocks them and pops. Each pushed
// frame is one recomputation; past `thrash_limit()` of them for one request the walk gives
// up with ThrashError rather than evicting and recomputing in a circle forever.
// A storage no handle holds (dead, kept only as lineage) that the walk recomputes lingers
// as soon as the op that needed it has run (Note [Lingering storages]): the first thing any
// request for memory takes. Letting the policy weigh it like any other storage would keep it
// too long, but in a DAG whose dead ancestors are shared by several paths, giving it up at
// once would recompute them once per path, exponentially often; so a dead storage
// recomputed a second time within one request is held until that request ends.
void RuntimeImpl::walk_frames(Id root_op, bool recompute, bool hold_root_inputs) {
  ++request_;
  std::vector<Frame> stack;
  stack.push_back({root_op, recompute, {}});
  std::size_t pushed = 0;
  const std::size_t limit = thrash_limit();
  std::vector<bool> held;
  std::vector<Id> wanted;  // with hold_root_inputs: the root's inputs not yet held by it
  if (hold_root_inputs)
    for (Id t : ops[root_op].inputs) wanted.push_back(tensors[t].storage);
  try {
    while (!stack.empty()) {
      Frame& f = stack.back();
      const Id missing = lock_inputs(f, held);
      if (missing != kNone) {
        if (storages[missing].offloaded) {  // brought back, then locked like the others
          restore(missing);
          continue;
        }
        const Id producer = storages[missing].producer;
        if (producer == kNone) throw std::logic_error("remat: a constant is not resident");
        if (++pushed > limit) {
          ++stats.thrashes;
          throw ThrashError(current_op, pushed, limit);
        }
        stack.push_back({producer, true, {}});
        continue;
      }
      const OpRec* waiting = stack.size() > 1 ? &ops[stack[stack.size() - 2].op] : nullptr;
      // An input's last use is when the op reads it, at its start; stamped at the op's end
      // instead, a cheap input would look as fresh as the op's outputs however long the op
      // ran, and be kept over older-but-dearer storages.
      for (Id s : f.locked) wait_ready(s);  // Note [Copies beside the kernels]
      for (Id s : f.locked) storages[s].last_access = clock;
      execute(f.op, f.recompute, waiting);
      if (!wanted.empty() && stack.size() > 1)
        hold_for_root(stack.front(), ops[f.op].out_storages, wanted);
      unlock_frame(stack.back());
      stack.pop_back();
    }
  } catch (...) {
    for (const Frame& f : stack) unlock_frame(f);
    release_request_dead();
    if (step) step->on_request_end();
    throw;
  }
  release_request_dead();
  if (step) step->on_request_end();
}

// Locks each resident input of the frame's op that the frame does not hold yet; returns the
// first one missing (kNone: every input is resident and locked). `held` is scratch space.
Id RuntimeImpl::lock_inputs(Frame& f, std::vector<bool>& held) {
  const OpRec& op = ops[f.op];
  Id missing = kNone;
  held.assign(op.inputs.size(), false);
  for (std::size_t i = 0; i < op.inputs.size(); ++i) {
    const Id s = tensors[op.inputs[i]].storage;
    held[i] = std::find(f.locked.begin(), f.locked.end(), s) != f.locked.end();
  }
  for (std::size_t i = 0; i < op.inputs.size(); ++i) {
    if (held[i]) continue;
    const Id s = tensors[op.inputs[i]].storage;
    if (storages[s].resident) {
      lock(s);
      f.locked.push_back(s);
    } else if (missing == kNone) {
      missing = s;
    }
  }
  return missing;
}

// Locks for the root frame each storage in `wanted` that `made` holds, and takes it out of
// `wanted` (Note [Running a request once more]).
void RuntimeImpl::hold_for_root(Frame& root, const std::vector<Id>& made, std::vector<Id>& wanted) {
  for (Id s : made) {
    if (s == kNone || !storages[s].resident) continue;
    const auto it = std::find(wanted.begin(), wanted.end(), s);
    if (it == wanted.end()) continue;
    wanted.erase(it);
    lock(s);
    root.locked.push_back(s);
  }
}

void RuntimeImpl::release_request_dead() {
  const std::vector<Id> kept = std::move(request_fresh_);
  request_fresh_.clear();
  ++request_;  // nothing is kept for a finished request
  for (Id s : kept) linger(s);
}

// Runs one op whose inputs are resident and locked. Outputs that are not resident get memory
// (locked while the kernel runs); an output whose record has died gets scratch memory, since
// the kernel writes every output. `waiting` is the op the outputs are recomputed for: a dead
// output it reads stays resident until it has run.
void RuntimeImpl::execute(Id op_id, bool recompute, const OpRec* waiting) {
  // A deferred op's first run is a first run wherever it comes from.
  const bool rerun = recompute && !ops[op_id].deferred;
  OutputMemory m;
  m.rerun = rerun;
  m.ptrs.assign(ops[op_id].outputs.size(), nullptr);
  try {
    give_outputs_memory(op_id, m);
  } catch (...) {
    release_outputs(m);
    throw;
  }
  OpRec& op = ops[op_id];
  // A first run that accumulates into constants writes pinned memory from here on, even if
  // its kernel fails half-way: a step that did so cannot run again (StepDriver).
  if (!rerun && !op.accumulates.empty()) ++stats.updates;
  try {
    op.cost = run_op(op, m, rerun);
    if (clock_base + clock > options.clock_limit) {
      ++stats.thrashes;
      throw ThrashError(absl::StrCat("remat: simulated time passed the clock limit of ",
                                     options.clock_limit, " while running op '", current_op, "' (",
                                     stats.recomputations, " recomputations so far)"),
                        stats.recomputations);
    }
  } catch (...) {
    release_outputs(m);                // what the failed run wrote is not kept
    if (!rerun) ++failed_first_runs_;  // its kernel may have drawn or written: not run again
    throw;
  }
  if (rerun) {
    ++stats.recomputations;
    stats.recompute_cost += op.cost;
  } else {
    ++stats.calls;
    stats.base_cost += op.cost;
  }
  if (step) step->on_ran(op_id, !rerun);
  for (auto [p, b] : m.scratch) memory->deallocate(p, b);
  for (Id s : m.held) {
    storages[s].last_access = clock;
    unlock(s);
  }
  settle_fresh_outputs(m.fresh, recompute, waiting);
}

// Outputs that are still resident are locked first, so that making room for the others
// cannot evict them while the kernel is about to write them. Outputs whose records died
// still have to be written somewhere: scratch memory, where kernels run.
void RuntimeImpl::give_outputs_memory(Id op_id, OutputMemory& m) {
  struct Preparing {
    RuntimeImpl& rt;
    Preparing(RuntimeImpl& r, OutputMemory& m) : rt(r) { rt.preparing_ = &m; }
    ~Preparing() { rt.preparing_ = nullptr; }
  } preparing(*this, m);
  take_outputs_memory(op_id, m);
  if (caching != nullptr)
    for (auto [p, b] : m.scratch) AllocatorHooks::set_tag(*caching, p, kNoTag);
}

void RuntimeImpl::take_outputs_memory(Id op_id, OutputMemory& m) {
  const std::size_t n = m.ptrs.size();
  for (std::size_t i = 0; i < n; ++i) {
    const Id s = ops[op_id].out_storages[i];
    if (s == kNone || !storages[s].resident) continue;
    lock(s);
    m.held.push_back(s);
  }
  reserve_declared_scratch(op_id, m);
  for (std::size_t i = 0; i < n; ++i) {
    const Id s = ops[op_id].out_storages[i];
    if (s == kNone || storages[s].resident) continue;  // views and dead ones: below
    allocate_storage(s);
    lock(s);
    m.held.push_back(s);
    m.fresh.push_back(s);
  }
  if (runs_kernels) {
    for (std::size_t i = 0; i < n; ++i) {
      const OpRec& op = ops[op_id];
      if (op.alias_of[i] >= 0 || op.out_storages[i] != kNone) continue;
      m.ptrs[i] = allocate_op_scratch(m, op.output_specs[i].bytes(), /*unplaced=*/false);
    }
  }
  // What the kernel accumulates into: the constants on a first run, scratch on a
  // recomputation (Note [Accumulating into constants] in update.cc).
  const std::vector<int>& acc = ops[op_id].accumulates;
  for (std::size_t j = 0; j < acc.size(); ++j) {
    void* p = nullptr;
    if (runs_kernels && m.rerun) {
      const Id t = ops[op_id].inputs[static_cast<std::size_t>(acc[j])];
      p = allocate_op_scratch(m, tensors[t].spec.bytes(), /*unplaced=*/true);
    }
    m.ptrs.push_back(p);
  }
  // Last: making room for the scratch outputs may have moved the others (Note [Compaction]).
  for (std::size_t i = 0; i < n; ++i) {
    const Id s = ops[op_id].out_storages[i];
    if (s != kNone) m.ptrs[i] = storages[s].ptr;
  }
  for (std::size_t j = 0; j < acc.size() && !m.rerun; ++j) {
    const Id t = ops[op_id].inputs[static_cast<std::size_t>(acc[j])];
    m.ptrs[n + j] = static_cast<char*>(storages[tensors[t].storage].ptr) + tensors[t].offset;
  }
}

// Undoes give_outputs_memory when it could not finish.
void RuntimeImpl::release_outputs(OutputMemory& m) {
  for (Id s : m.held) unlock(s);
  for (Id s : m.fresh)
    if (storages[s].resident) free_storage(s);
  for (auto [p, b] : m.scratch) memory->deallocate(p, b);
}

// Runs the op's kernel on its resident inputs, writing `outs`; returns its cost, measured on
// a first run on the CPU where asked or where the op declares none.
double RuntimeImpl::run_op(const OpRec& op, const OutputMemory& m, bool rerun) {
  const std::vector<void*>& outs = m.ptrs;
  const std::size_t n = outs.size();
  KernelContext ctx;
  std::vector<const void*> in_ptrs;
  std::vector<const TensorSpec*> in_specs;
  std::vector<const TensorSpec*> out_specs;
  bool measure = false;
  if (runs_kernels && has_kernel(*op.op)) {
    kernel_inputs(op.inputs, in_ptrs, in_specs);
    prepare_outputs(op, in_ptrs, outs);
    out_specs.resize(n);
    const std::size_t made = op.output_specs.size();  // then what it accumulates into
    for (std::size_t i = 0; i < n; ++i)
      out_specs[i] = i < made ? &op.output_specs[i]
                              : in_specs[static_cast<std::size_t>(op.accumulates[i - made])];
    ctx = KernelContext{in_ptrs, in_specs, outs, out_specs, op.rng, rerun};
    // First runs are timed where asked, or where the op declares no cost: on the host by
    // the clock, on CUDA by events around the kernel (Note [Kernel checks and timing]).
    measure = !rerun && (options.measure_costs || op.cost < 0);
  }
  std::size_t bytes = 0;
  if (options.record_timeline) {
    for (std::size_t i = 0; i < op.output_specs.size(); ++i)
      if (op.alias_of[i] < 0) bytes += op.output_specs[i].bytes();
  }
  return launch(*op.op, ctx, op.cost, measure,
                rerun ? TimelineEvent::Kind::kRecompute : TimelineEvent::Kind::kCompute, bytes,
                m.reserved);
}

// Before a kernel runs: outputs that start as a copy of an input get it (on the runtime's
// stream on CUDA), and under RuntimeOptions::poison_outputs the others on the host are
// filled with 0xFF (Note [Outputs start uninitialised] in remat/op.h).
void RuntimeImpl::prepare_outputs(const OpRec& op, const std::vector<const void*>& in_ptrs,
                                  const std::vector<void*>& outs) {
  for (std::size_t i = 0; i < op.output_specs.size(); ++i) {
    if (outs[i] == nullptr || op.alias_of[i] >= 0) continue;
    const std::size_t bytes = op.output_specs[i].bytes();
    if (op.copy_of[i] < 0) {
      if (options.poison_outputs && cuda == nullptr) std::memset(outs[i], 0xFF, bytes);
      continue;
    }
    const void* src = in_ptrs[static_cast<std::size_t>(op.copy_of[i])];
    if (cuda != nullptr) {
      cuda->check(
          cuda->api().memcpy_async(outs[i], src, bytes, CudaCopy::kDeviceToDevice, cuda->stream()),
          "cudaMemcpyAsync", op.op->name);
    } else {
      std::memcpy(outs[i], src, bytes);
    }
  }
}

namespace {
// Memory a kernel asked for through KernelContext::scratch, given back when it returns (or
// throws). On CUDA a later kernel that gets the same block is ordered after this one on the
// runtime's stream, so giving it back at once is safe (Note [Stream-ordered reuse]).
class KernelScratch {
 public:
  // A kernel's scratch is not part of a step's traced or placed requests (Note [Placed
  // allocations] in step_placement.cc): kernels do not run on the simulated backend.
  KernelScratch(MemoryResource& memory, CachingAllocator* caching,
                std::pair<void*, std::size_t> reserved)
      : memory_(memory), pause_(caching, /*short_lived=*/true), reserved_(reserved) {}
  ~KernelScratch() {
    for (auto [p, b] : blocks_) memory_.deallocate(p, b);
  }
  KernelScratch(const KernelScratch&) = delete;
  KernelScratch& operator=(const KernelScratch&) = delete;
  static void* allocate(void* self, std::size_t bytes) {
    auto* s = static_cast<KernelScratch*>(self);
    if (s->reserved_.first != nullptr && bytes <= s->reserved_.second) {
      void* p = s->reserved_.first;  // given back by execute(), which reserved it
      s->reserved_ = {nullptr, 0};
      return p;
    }
    void* p = s->memory_.allocate(bytes);
    s->blocks_.emplace_back(p, bytes);
    return p;
  }

 private:
  MemoryResource& memory_;
  PlacementPause pause_;
  std::vector<std::pair<void*, std::size_t>> blocks_;
  std::pair<void*, std::size_t> reserved_;
};
}  // namespace

// Note [Kernel checks and timing]
// On CUDA a kernel launch returns before the kernel has run, so a faulting kernel is only
// known from a later call, and host time says nothing of the kernel's. After each launch the
// runtime asks for the launch error (a bad configuration, a missing kernel image) and raises
// it as CudaError naming the op; with sync_after_launch (REMAT_CUDA_LAUNCH_BLOCKING=1) it also
// waits for the kernel, so that a fault is raised naming the op that caused it. First runs
// that are measured are timed with events on the stream, which waits for the kernel: once
// per op, then the measured cost is reused by every recomputation.
double RuntimeImpl::launch(const OpDef& op, KernelContext ctx, double cost, bool measure,
                           TimelineEvent::Kind kind, std::size_t bytes,
                           std::pair<void*, std::size_t> reserved) {
  if (runs_kernels && has_kernel(op)) {
    KernelScratch scratch(*memory, caching, reserved);
    ctx.stream = cuda != nullptr ? cuda->stream() : nullptr;
    ctx.workspace = workspace;
    ctx.workspace_bytes = workspace_bytes;
    ctx.scratch_fn = &KernelScratch::allocate;
    ctx.scratch_self = &scratch;
    // Scratch requests from a running kernel must not move what it reads and writes.
    struct Running {
      bool& flag;
      explicit Running(bool& f) : flag(f) { flag = true; }
      ~Running() { flag = false; }
    } running(kernel_running_);
    if (cuda != nullptr) {
      if (measure) cuda->start_timing();
      if (options.cuda.launch)
        options.cuda.launch(op, ctx);
      else
        op.cuda_kernel(ctx);
      cuda->check_launch(op.name);
      if (measure) cost = cuda->stop_timing_ns();
    } else {
      const std::optional<InputCheck> inputs =
          options.check_inputs ? std::optional<InputCheck>(ctx) : std::nullopt;
      const auto start = SteadyClock::now();
      op.kernel(ctx);
      if (measure) cost = seconds_since(start) * 1e9;
      if (inputs) inputs->verify(ctx, op.name);
    }
  }
  if (cost < 0) cost = 0;
  if (options.record_timeline) {
    timeline.events.push_back({kind, op.name, clock_base + clock, cost, bytes});
    note_memory();
  }
  clock += cost;
  return cost;
}

// What becomes of outputs that just got memory: a step may hold them (a followed plan's own
// step); a dead one recomputed for another op lingers once that op has run, or stays until
// the request ends if this request already recomputed it once (Note [Iterative
// recomputation]).
void RuntimeImpl::settle_fresh_outputs(const std::vector<Id>& fresh, bool recompute,
                                       const OpRec* waiting) {
  for (Id s : fresh) {
    policy->on_resident(s);
    refresh_neighbours(s);
    if (step && waiting == nullptr && step->holds_fresh(s)) continue;
    StorageRec& r = storages[s];
    if (r.handles != 0 || !recompute) continue;
    if (r.recomputed_in == request_ && r.keep_in != request_) {
      r.keep_in = request_;
      request_fresh_.push_back(s);
    }
    r.recomputed_in = request_;
    if (r.keep_in == request_) continue;
    bool needed = false;
    if (waiting != nullptr) {
      for (Id t : waiting->inputs) needed |= tensors[t].storage == s;
    }
    if (!needed) linger(s);
  }
}

std::vector<Id> RuntimeImpl::run_new(const OpPtr& op, const std::vector<Id>& inputs,
                                     const Outputs& outputs, double cost,
                                     std::span<const int> accumulates) {
  if (options.backend == Backend::kCuda && !options.cuda.launch && op->kernel && !op->cuda_kernel)
    throw std::invalid_argument(absl::StrCat("remat: op '", op->name, "' has no CUDA kernel"));
  // Checked before the op takes a position: a rejected call leaves the step as it was.
  const std::vector<Id> targets =
      accumulates.empty() ? std::vector<Id>{} : pinned_targets(*op, inputs, accumulates);
  const int position = step ? step->next_position() : -1;
  if (!targets.empty()) prepare_accumulation(targets, position);
  const Id op_id = register_op(op, inputs, cost);
  ops[op_id].accumulates.assign(accumulates.begin(), accumulates.end());
  const std::vector<Id> result = make_outputs(op_id, inputs, outputs);
  current_op = op->name;
  try {
    if (step) {
      step->run_new_op(op_id, position);  // sites and recording first, then the run
    } else {
      run_frames(op_id, /*recompute=*/false);
    }
  } catch (const OutOfMemoryError& e) {
    abandon_new_op(op_id, result);
    throw annotated(e, op->name);
  } catch (...) {
    abandon_new_op(op_id, result);
    throw;
  }
  for (Id t : result) touch(tensors[t].storage);
  if (step) step->after_new_op();
  return result;
}

// The op's record, reading `inputs` (each gains a reference and a consumer).
Id RuntimeImpl::register_op(const OpPtr& op, const std::vector<Id>& inputs, double cost) {
  OpRec rec;
  rec.op = op;
  rec.inputs = inputs;
  rec.in_storages.reserve(inputs.size());
  for (Id t : inputs) rec.in_storages.push_back(tensors[t].storage);
  rec.cost = cost;
  if (op->random) {
    rec.rng = {options.seed, rng_counter_};
    rng_counter_ += op->rng_counters;
  }
  const Id op_id = ops.add(std::move(rec));
  for (Id t : inputs) {
    ++tensors[t].refs;
    storages[tensors[t].storage].consumers.push_back(op_id);
  }
  return op_id;
}

// The op's output tensors, each holding one handle: a view shares its input's storage, any
// other output gets a storage of its own (no memory yet).
std::vector<Id> RuntimeImpl::make_outputs(Id op_id, const std::vector<Id>& inputs,
                                          const Outputs& outputs) {
  std::vector<Id> result;
  result.reserve(outputs.size());
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const OutputSpec& out = outputs[i];
    TensorRec tr;
    tr.spec = out.spec;
    tr.producer = op_id;
    if (out.alias_of >= 0) {
      const TensorRec& base = tensors[inputs.at(static_cast<std::size_t>(out.alias_of))];
      tr.storage = base.storage;
      tr.offset = base.offset + out.alias_offset;
      // Recorded traces declare view sizes that need not fit their base (expand, as_strided);
      // only where kernels really read memory must a view lie inside it.
      if (runs_kernels && tr.offset + out.spec.bytes() > storages[base.storage].bytes) {
        const std::string name = ops[op_id].op->name;
        unregister_op(op_id, inputs, result);
        throw std::invalid_argument(absl::StrCat("remat: view output ", i, " of op '", name, "' (",
                                                 out.spec.to_string(),
                                                 ") lies outside its base storage"));
      }
    } else {
      StorageRec sr;
      sr.bytes = out.spec.bytes();
      sr.producer = op_id;
      tr.storage = storages.add(std::move(sr));
      ++ops[op_id].refs;  // the storage keeps its producer alive: see Note [Lineage lifetime]
    }
    result.push_back(add_output(op_id, std::move(tr), out.alias_of, out.copy_of));
  }
  return result;
}

// Adds an output tensor record of the op, holding one handle.
Id RuntimeImpl::add_output(Id op_id, TensorRec tr, int alias_of, int copy_of) {
  ++storages[tr.storage].tensor_refs;
  const Id t = tensors.add(std::move(tr));
  OpRec& o = ops[op_id];
  o.outputs.push_back(t);
  o.output_storage.push_back(tensors[t].storage);
  o.out_storages.push_back(alias_of >= 0 ? kNone : tensors[t].storage);
  o.alias_of.push_back(alias_of);
  o.copy_of.push_back(copy_of);
  o.output_specs.push_back(tensors[t].spec);
  ++o.refs;
  retain(t);
  return t;
}

// Undoes register_op and the outputs made so far, for an op that never ran.
void RuntimeImpl::unregister_op(Id op_id, const std::vector<Id>& inputs,
                                const std::vector<Id>& outputs) {
  for (Id t : outputs) release(t);
  for (Id t : inputs) {
    auto& c = storages[tensors[t].storage].consumers;
    c.erase(std::find(c.begin(), c.end(), op_id));
  }
  ops.remove(op_id);
  for (Id t : inputs) drop_tensor_ref(t);
}

// A new op that failed: its outputs' handles go, and so does its deferral if it had one.
void RuntimeImpl::abandon_new_op(Id op_id, const std::vector<Id>& outputs) {
  const bool deferred = step && step->cancel_new_op(op_id);
  for (Id t : outputs) release(t);
  if (deferred) release_op_ref(op_id);
}

// The memory resource's error, counted and completed with what only the runtime knows: the
// op, and the bytes that could not be evicted.
OutOfMemoryError RuntimeImpl::annotated(const OutOfMemoryError& e, const std::string& op) {
  ++stats.ooms;
  OutOfMemoryInfo info = e.info();
  info.op = op;
  const ResidentBreakdown resident = failed_breakdown_ ? *failed_breakdown_ : resident_breakdown();
  failed_breakdown_.reset();
  info.pinned = resident.pinned;
  info.locked = resident.locked;
  info.kept = resident.kept;
  const std::size_t in_storages = resident.pinned + resident.locked + resident.kept;
  info.untracked = info.allocated > in_storages ? info.allocated - in_storages : 0;
  if (resident.moves_refused != nullptr) info.moves_refused = resident.moves_refused;
  info.held.clear();  // an error annotated again (an outer request) is described anew
  std::vector<HeldTensors> held = held_tensors();
  std::erase_if(held, [](const HeldTensors& g) { return g.resident_bytes == g.pinned_bytes; });
  std::sort(held.begin(), held.end(), [](const HeldTensors& a, const HeldTensors& b) {
    return a.resident_bytes - a.pinned_bytes > b.resident_bytes - b.pinned_bytes;
  });
  if (held.size() > 5) held.resize(5);
  info.held = std::move(held);
  return OutOfMemoryError(std::move(info));
}

// Note [Where the memory went]
// An out-of-memory error splits the allocated bytes into what kept them from being evicted,
// each resident storage once and at its allocated (rounded) size, so that the parts add up
// to the allocator's own figure: pinned (constants, frozen tensors), locked by the ops
// running now (a pinned one counts as pinned), and kept (resident, neither pinned nor
// locked, yet no eviction candidate: recomputed twice in this request, or held for an op a
// followed plan deferred). What no storage owns is a running kernel's scratch and the
// runtime's workspace. O(storages), paid only when an allocation fails.
RuntimeImpl::ResidentBreakdown RuntimeImpl::resident_breakdown() const {
  ResidentBreakdown b;
  storages.for_each_slot([&](const StorageRec& r) {
    if (!r.resident || r.bytes == 0) return;
    const std::size_t bytes = memory->rounded_size(r.bytes);
    if (r.pinned)
      b.pinned += bytes;
    else if (r.locks > 0)
      b.locked += bytes;
    else
      b.kept += bytes;
  });
  return b;
}

Id RuntimeImpl::new_constant(const TensorSpec& spec, const void* data) {
  StorageRec sr;
  sr.bytes = spec.bytes();
  sr.pinned = true;
  sr.last_access = clock;
  const Id s = storages.add(std::move(sr));
  current_op = "constant";
  // Not part of a placed sequence (Note [Placed allocations] in step_placement.cc): a program
  // makes constants where a step's trace cannot tell, before the step or during it.
  const PlacementPause pause(caching, /*short_lived=*/false);
  try {
    allocate_storage(s);
  } catch (const OutOfMemoryError& e) {
    storages.remove(s);
    throw annotated(e, "constant");
  }
  stats.pinned_bytes += spec.bytes();
  pack_pinned(s, /*copy_bytes=*/false);
  if (data != nullptr && runs_kernels && spec.bytes() > 0) {
    copy_to_storage(storages[s].ptr, data, spec.bytes());
  }
  TensorRec tr;
  tr.spec = spec;
  tr.storage = s;
  storages[s].tensor_refs = 1;
  const Id t = tensors.add(std::move(tr));
  retain(t);
  if (step) step->on_constant(t);
  return t;
}

bool RuntimeImpl::has_kernel(const OpDef& op) const {
  if (options.backend != Backend::kCuda) return static_cast<bool>(op.kernel);
  if (options.cuda.launch) return op.kernel || op.cuda_kernel;
  return static_cast<bool>(op.cuda_kernel);
}

// The data pointers and specs of `inputs`, as a kernel sees them (all resident).
void RuntimeImpl::kernel_inputs(const std::vector<Id>& inputs, std::vector<const void*>& ptrs,
                                std::vector<const TensorSpec*>& specs) const {
  ptrs.clear();
  specs.clear();
  for (Id t : inputs) {
    const TensorRec& tr = tensors[t];
    ptrs.push_back(static_cast<const char*>(storages[tr.storage].ptr) + tr.offset);
    specs.push_back(&tr.spec);
  }
}

// Reruns the producer of an evicted storage; an OOM names the op that could not run.
void RuntimeImpl::recompute_storage(Id s) {
  if (storages[s].offloaded) {
    current_op = "restoring an offloaded storage";
    try {
      restore(s);
    } catch (const OutOfMemoryError& e) {
      throw annotated(e, current_op);
    }
    return;
  }
  current_op = ops[storages[s].producer].op->name;
  try {
    run_frames(storages[s].producer, /*recompute=*/true);
  } catch (const OutOfMemoryError& e) {
    throw annotated(e, current_op);
  }
}

}  // namespace remat::detail
