#include "remat/runtime.h"

#include <absl/container/flat_hash_set.h>
#include <absl/strings/str_cat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "remat/logical_memory.h"
#include "remat/segment_source.h"
#include "runtime/alloc/detail/blocks.h"
#include "runtime/core/runtime_impl.h"

namespace remat {
namespace detail {
namespace {

using SteadyClock = std::chrono::steady_clock;

double seconds_since(SteadyClock::time_point start) {
  return std::chrono::duration<double>(SteadyClock::now() - start).count();
}

std::unique_ptr<SegmentSource> make_source(Backend backend) {
  switch (backend) {
    case Backend::kCpu:
      return std::make_unique<HostSegmentSource>();
    case Backend::kSimulated:
      return std::make_unique<SimulatedSegmentSource>();
    case Backend::kCuda: {
      auto source = make_cuda_segment_source(0);
      if (source == nullptr) throw std::runtime_error("remat: the CUDA backend needs a CUDA device");
      return source;
    }
  }
  return nullptr;
}

}  // namespace

RuntimeImpl::RuntimeImpl(RuntimeOptions opts)
    : options(std::move(opts)), sampler_(options.seed ^ 0x9e3779b97f4a7c15ULL) {
  if (options.accounting == Accounting::kLogical) {
    if (options.backend == Backend::kCuda)
      throw std::invalid_argument("remat: logical accounting is for the CPU and simulated backends");
    memory = std::make_unique<LogicalMemory>(options.budget, options.backend == Backend::kCpu);
  } else {
    CachingAllocatorOptions a = options.allocator;
    a.budget = options.budget;
    auto alloc = std::make_unique<CachingAllocator>(make_source(options.backend), a);
    caching = alloc.get();
    memory = std::move(alloc);
  }
  memory->set_reclaimer(this);
  timeline.budget = options.budget;
  runs_kernels = options.backend != Backend::kSimulated;
  policy = make_eviction_policy(options.policy, LineageView{&storages, &tensors, &ops, &clock},
                                options.seed);
  if (policy == nullptr) {
    throw std::invalid_argument(absl::StrCat("remat: unknown eviction policy '", options.policy,
                                             "' (see eviction_policy_names())"));
  }
  // Candidates enter the index with a cheap lower bound of their key, which best() corrects
  // where it looks (Note [Candidate index]); a use re-enters a candidate, so computing the
  // whole neighbourhood there would walk the lineage on every read. The window search
  // (Note [Contiguous eviction]) prices blocks by these stored lower bounds too, and
  // refreshes the keys of the window it picks.
  // A lingering storage's key is 0: it goes before any storage that anything may still read
  // (Note [Lingering storages]).
  candidates_ = std::make_unique<CandidateIndex>(
      [this](Id s) { return storages[s].lingering ? 0.0 : policy->key(s); },
      policy->staleness_exponent(),
      [this](Id s) { return storages[s].lingering ? 0.0 : policy->key_floor(s); });
  candidates_->on_move = [this](Id s, Id position) { storages[s].candidate_slot = position; };
}

RuntimeImpl::~RuntimeImpl() { memory->set_reclaimer(nullptr); }

// ---------------------------------------------------------------------------------------
// Residency and candidates

bool RuntimeImpl::evictable(const StorageRec& r) const {
  return r.resident && !r.pinned && r.locks == 0 &&
         (r.bytes >= options.min_evictable_bytes || r.lingering) && r.producer != kNone;
}

// Keeps the candidate index equal to the set of evictable storages.
void RuntimeImpl::refresh_candidate(Id s) {
  StorageRec& r = storages[s];
  const bool want = evictable(r);
  if (want && r.candidate_slot == kNone) {
    const Id slot = candidates_->insert(s, r.last_access);
    storages[s].candidate_slot = slot;
  } else if (!want && r.candidate_slot != kNone) {
    candidates_->erase(r.candidate_slot);
    r.candidate_slot = kNone;
  }
}

// Records a use: the storage moves to the newest end of the candidate index.
void RuntimeImpl::touch(Id s) {
  StorageRec& r = storages[s];
  r.last_access = clock;
  if (r.candidate_slot != kNone) reenter_candidate(s);
}

// Takes a storage out of the candidate index and puts it back if it is evictable: its key
// and last access are read afresh.
void RuntimeImpl::reenter_candidate(Id s) {
  StorageRec& r = storages[s];
  if (r.candidate_slot != kNone) {
    candidates_->erase(r.candidate_slot);
    r.candidate_slot = kNone;
  }
  refresh_candidate(s);
}

// A storage that came back shrinks the evicted neighbourhoods around it: the keys of the
// resident storages whose neighbourhoods it cut may drop, and the index only corrects keys
// that grew by itself.
void RuntimeImpl::refresh_neighbours(Id s) {
  policy->for_each_lowered(s, [&](Id n) {
    const Id slot = storages[n].candidate_slot;
    if (slot != kNone) candidates_->lower(slot);
  });
}

void RuntimeImpl::lock(Id s) {
  StorageRec& r = storages[s];
  if (r.locks++ == 0) refresh_candidate(s);
}

void RuntimeImpl::unlock(Id s) {
  StorageRec& r = storages[s];
  if (--r.locks == 0) refresh_candidate(s);
}

void RuntimeImpl::allocate_storage(Id s) {
  const std::size_t bytes = storages[s].bytes;
  void* p = memory->allocate(bytes);  // may evict other storages, never this one
  StorageRec& r = storages[s];
  r.ptr = p;
  r.resident = true;
  if (caching != nullptr) caching->set_tag(p, s);
  stats.resident_bytes += bytes;
  stats.peak_resident_bytes = std::max(stats.peak_resident_bytes, stats.resident_bytes);
}

// Gives a resident storage's bytes back to the memory resource.
void RuntimeImpl::release_memory(Id s) {
  StorageRec& r = storages[s];
  memory->deallocate(r.ptr, r.bytes);
  r.ptr = nullptr;
  r.resident = false;
  stats.resident_bytes -= r.bytes;
}

// Note [Lingering storages]
// A storage with no handles that was recomputed for an op's sake (a dead tensor brought back
// because a recomputation reads it) is not needed by anything the program holds, but the
// next recomputation in the same region often reads it again. Freeing it at once (as DTR's
// runtime does with banishing off) means recomputing it again; keeping it as an ordinary
// candidate (as DTR's simulator does) lets its fresh last use shield it while memory is
// short. Here it lingers: it stays resident as a free cache, with key 0, so that it is the
// first thing any request for memory takes (and its release is not counted as an eviction).
// Until memory is needed it is reused for nothing. On the tree LSTM trace this took the
// slowdown at 0.4 of the peak from 1.1739 to 1.1682 and at 0.3 from 1.2309 to 1.2264. Lingering
// storages go at the end of each step, so no dead tensor outlives the step it served.
void RuntimeImpl::linger(Id s) {
  StorageRec& r = storages[s];
  if (r.lingering || !releasable(r)) return;
  r.lingering = true;
  lingering_.push_back(s);
  reenter_candidate(s);  // with its new key
}

void RuntimeImpl::free_lingering() {
  for (Id s : lingering_) {
    if (storages[s].lingering && storages[s].resident) free_storage(s);
  }
  lingering_.clear();
}

void RuntimeImpl::free_storage(Id s) {
  storages[s].lingering = false;
  release_memory(s);
  refresh_candidate(s);
  policy->on_evicted(s);
}

void RuntimeImpl::evict(Id s) {
  const bool lingering = storages[s].lingering;
  free_storage(s);
  if (lingering) return;  // a free cache, not an eviction
  ++stats.evictions;
  if (options.record_timeline) {
    const Id producer = storages[s].producer;
    timeline.events.push_back({TimelineEvent::Kind::kEvict,
                               producer == kNone ? std::string() : ops[producer].op->name, clock,
                               0.0, storages[s].bytes});
    note_memory();
  }
}

// A storage no user handle can reach is freed at once; its record stays while lineage needs it.
void RuntimeImpl::release_if_dead(Id s) {
  if (releasable(storages[s])) free_storage(s);
}

// Resident, and nothing holds it: no handle, lock, pending read or plan.
bool RuntimeImpl::releasable(const StorageRec& r) const {
  return r.handles == 0 && r.resident && !r.pinned && r.locks == 0 && r.pending_reads == 0 &&
         r.plan_refs == 0 && !r.plan_spec;
}

// ---------------------------------------------------------------------------------------
// Choosing what to evict

// With sampling on, a random sqrt(n) subset is scored (DTR's own option), which bounds the
// cost of one decision at the price of sometimes missing the best victim; otherwise the
// candidate index finds the best one (see Note [Candidate index]).
Id RuntimeImpl::choose_victim() {
  const std::size_t n = candidates_->size();
  if (n == 0) return kNone;
  if (!options.sample_candidates || n <= 64) return candidates_->best(clock);
  const std::size_t k = static_cast<std::size_t>(std::ceil(std::sqrt(static_cast<double>(n))));
  Id best = kNone;
  double best_score = 0;
  candidates_->sample(sampler_, k, [&](Id s) {
    const double score = storages[s].lingering ? 0.0 : policy->score(s);
    if (best == kNone || score < best_score) {
      best = s;
      best_score = score;
    }
  });
  return best != kNone ? best : candidates_->best(clock);
}

// The timer covers choosing what to evict; evicting it (freeing, lineage) is not the search.
bool RuntimeImpl::reclaim(std::size_t bytes) {
  const auto start = SteadyClock::now();
  evicting_.clear();
  const Id victim = choose_victim();
  if (caching != nullptr && options.contiguous_eviction && victim != kNone &&
      !caching->release_would_serve(storages[victim].ptr, bytes))
    choose_window(bytes);
  // A window of free blocks alone frees nothing new (the allocator would have used them).
  if (evicting_.empty() && victim != kNone) evicting_.push_back(victim);
  stats.search_seconds += seconds_since(start);
  if (evicting_.empty()) {
    failed_locked_bytes_ = unpinned_locked_bytes();
    return false;
  }
  for (Id s : evicting_) evict(s);
  return true;
}

// Note [Contiguous eviction]
// In allocator accounting, evicting the best-scored tensors one at a time frees bytes that
// are scattered over segments: a large request may need many evictions before two freed
// blocks happen to be adjacent. Following Coop (Zhang et al., NeurIPS 2023), the runtime
// instead looks at each segment of the request's pool in address order and finds the window
// of adjacent blocks, each free or held by an evictable storage, whose bytes cover the
// request at the least total eviction cost (the policy's score times the size, i.e. the
// cost of the evicted neighbourhood over staleness for the DTR family; scores come from the
// candidate index's stored keys, so weighing a block costs O(1) rather than a walk). Costs are
// non-negative, so a two-pointer sweep finds each segment's best window in linear time
// (`WindowSearch`, Note [Window sweep] in window_search.cc). The other way to make room is
// to empty whole segments, of either pool, so that they can be returned and a new one
// reserved; the cheaper of the two wins.
// The window search weighs every block, which is too dear to do on every decision when ops
// take microseconds (the recorded tree LSTM). So it runs only where fragmentation is the
// problem: when freeing the policy's own best victim would not serve the request (its block
// and free neighbours are too small, and its segment would not empty into enough room),
// which the allocator answers in O(1) (`release_would_serve`). Otherwise the runtime evicts
// that victim, as in logical accounting. On the tree LSTM that took the window search from
// every decision to about a quarter of them, and it brought allocator slowdowns nearer the
// logical ones (treelstm at 0.5: 5.2% above logical, now 3.6%), since per-byte choices are
// what the policies are tuned for.

void RuntimeImpl::choose_window(std::size_t bytes) {
  candidates_->with_pricing(clock, [&](auto score) { choose_window(bytes, score); });
}

// Window costs come from stored keys, lower bounds of the true ones (keys lag behind keys
// that grew, and a lowered key is only its floor); like the candidate index, the search
// checks the window it chose: it refreshes its victims' keys and chooses again while any of
// them turns out dearer than stored, so the window it evicts is priced right and no other
// can be cheaper. Nothing is evicted in between, so the blocks are scanned once, each key
// is refreshed at most once, and a refreshed block reprices only the windows that hold it.
template <typename Score>
void RuntimeImpl::choose_window(std::size_t bytes, Score score) {
  WindowSearch& w = window_search_;
  const std::size_t need = caching->rounded_size(bytes);
  // What evicting the storage in a block costs: 0 for a free block, a barrier where the
  // block cannot be evicted (the candidate index holds exactly the evictable storages). It
  // runs for every block, so the arrays it reads are fetched once, not once a block.
  auto block_cost = [recs = storages.data(), score](std::uint32_t tag) {
    static_assert(CachingAllocator::kNoTag > BlockLayout::kFree);
    if (tag >= BlockLayout::kFree) return tag == BlockLayout::kFree ? 0 : WindowSearch::kBarrier;
    const StorageRec& r = recs[tag];
    if (r.candidate_slot == kNone) return WindowSearch::kBarrier;
    // Sizes are far below 2^63, and a signed conversion is one instruction.
    return score(r.candidate_slot) * static_cast<double>(static_cast<std::int64_t>(r.bytes));
  };
  w.price(
      need, AllocatorBlocks(*caching),
      [&](const SegmentView& segment, std::size_t segment_bytes) {
        return caching->window_serves(segment, segment_bytes, bytes);
      },
      [block_cost](std::size_t, std::uint32_t tag) { return block_cost(tag); });
  const std::vector<std::uint32_t>& tags = w.tags();
  const std::size_t unreserved = caching->unreserved();
  window_refreshed_.assign(tags.size(), false);
  for (int round = 0; round < 8; ++round) {
    if (!w.choose(need, unreserved)) return;
    bool stale = false;
    for (std::size_t i : w.chosen()) {
      if (window_refreshed_[i]) continue;
      window_refreshed_[i] = true;
      candidates_->refresh(storages[tags[i]].candidate_slot);
      stale |= w.reprice(i, block_cost(tags[i]));
    }
    if (!stale) break;
  }
  for (std::size_t i : w.chosen()) evicting_.push_back(tags[i]);
}

// ---------------------------------------------------------------------------------------
// Running ops

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
void RuntimeImpl::run_frames(Id root_op, bool recompute) {
  ++request_;
  std::vector<Frame> stack;
  stack.push_back({root_op, recompute, {}});
  std::size_t pushed = 0;
  const std::size_t limit = thrash_limit();
  std::vector<bool> held;
  try {
    while (!stack.empty()) {
      Frame& f = stack.back();
      const OpRec& op = ops[f.op];
      // Lock each resident input not yet held by this frame; note the first missing one.
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
      if (missing != kNone) {
        const Id producer = storages[missing].producer;
        if (producer == kNone) throw std::logic_error("remat: a constant is not resident");
        if (++pushed > limit) {
          ++stats.thrashes;
          throw ThrashError(current_op_, pushed, limit);
        }
        stack.push_back({producer, true, {}});
        continue;
      }
      const OpRec* waiting = stack.size() > 1 ? &ops[stack[stack.size() - 2].op] : nullptr;
      // An input's last use is when the op reads it, at its start; stamped at the op's end
      // instead, a cheap input would look as fresh as the op's outputs however long the op
      // ran, and be kept over older-but-dearer storages.
      for (Id s : f.locked) storages[s].last_access = clock;
      execute(f.op, f.recompute, waiting);
      unlock_frame(stack.back());
      stack.pop_back();
    }
  } catch (...) {
    for (const Frame& f : stack) unlock_frame(f);
    release_request_dead();
    drop_undeferred();
    throw;
  }
  release_request_dead();
  drop_undeferred();
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
  const std::size_t n = ops[op_id].outputs.size();
  // A deferred op's first run is a first run wherever it comes from.
  const bool rerun = recompute && !ops[op_id].deferred;
  std::vector<void*> outs(n, nullptr);
  std::vector<Id> held;   // live outputs, locked until the kernel has run
  std::vector<Id> fresh;  // the ones this run gives memory to
  std::vector<std::pair<void*, std::size_t>> scratch;
  auto release_partial = [&] {
    for (Id s : held) unlock(s);
    for (Id s : fresh)
      if (storages[s].resident) free_storage(s);
    for (auto [p, b] : scratch) memory->deallocate(p, b);
  };
  try {
    // Outputs that are still resident are locked first, so that making room for the others
    // cannot evict them while the kernel is about to write them.
    for (std::size_t i = 0; i < n; ++i) {
      const Id s = ops[op_id].out_storages[i];
      if (s == kNone || !storages[s].resident) continue;
      lock(s);
      held.push_back(s);
    }
    for (std::size_t i = 0; i < n; ++i) {
      const Id s = ops[op_id].out_storages[i];
      if (s == kNone || storages[s].resident) continue;  // views and dead ones: below
      allocate_storage(s);
      lock(s);
      held.push_back(s);
      fresh.push_back(s);
    }
    for (std::size_t i = 0; i < n; ++i) {
      const Id s = ops[op_id].out_storages[i];
      if (s != kNone) outs[i] = storages[s].ptr;
    }
    if (runs_kernels) {
      // Dead outputs still have to be written somewhere.
      for (std::size_t i = 0; i < n; ++i) {
        const OpRec& op = ops[op_id];
        if (op.alias_of[i] >= 0 || op.out_storages[i] != kNone) continue;
        const std::size_t b = op.output_specs[i].bytes();
        void* p = memory->allocate(b);
        scratch.emplace_back(p, b);
        outs[i] = p;
      }
    }
  } catch (...) {
    release_partial();
    throw;
  }

  OpRec& op = ops[op_id];
  const auto& kernel = kernel_of(*op.op);
  if (runs_kernels && kernel) {
    std::vector<const void*> in_ptrs;
    std::vector<const TensorSpec*> in_specs;
    kernel_inputs(op.inputs, in_ptrs, in_specs);
    std::vector<const TensorSpec*> out_specs(n);
    for (std::size_t i = 0; i < n; ++i) out_specs[i] = &op.output_specs[i];
    KernelContext ctx{in_ptrs, in_specs, outs, out_specs, op.rng, rerun, stream};
    // Host time of an asynchronous CUDA launch says nothing; CUDA ops declare their cost.
    const bool measure = !rerun && options.backend == Backend::kCpu &&
                         (options.measure_costs || (!op.op->cost && op.cost < 0));
    const auto start = SteadyClock::now();
    kernel(ctx);
    if (measure) op.cost = seconds_since(start) * 1e9;
  }
  if (op.cost < 0) op.cost = 0;
  if (options.record_timeline) {
    std::size_t bytes = 0;
    for (std::size_t i = 0; i < n; ++i)
      if (op.alias_of[i] < 0) bytes += op.output_specs[i].bytes();
    timeline.events.push_back({rerun ? TimelineEvent::Kind::kRecompute
                                         : TimelineEvent::Kind::kCompute,
                               op.op->name, clock, op.cost, bytes});
    note_memory();
  }
  clock += op.cost;
  if (clock > options.clock_limit) {
    ++stats.thrashes;
    throw ThrashError(absl::StrCat("remat: simulated time passed the clock limit of ",
                                   options.clock_limit, " while running op '", current_op_,
                                   "' (", stats.recomputations, " recomputations so far)"),
                      stats.recomputations);
  }
  if (rerun) {
    ++stats.recomputations;
    stats.recompute_cost += op.cost;
  } else {
    ++stats.calls;
    stats.base_cost += op.cost;
  }
  note_run(op, !rerun);
  if (op.deferred) undefer(op_id);
  for (auto [p, b] : scratch) memory->deallocate(p, b);
  for (Id s : held) {
    storages[s].last_access = clock;
    unlock(s);
  }
  for (Id s : fresh) {
    policy->on_resident(s);
    refresh_neighbours(s);
    StorageRec& r = storages[s];
    if (plan_run_ && waiting == nullptr) {  // a plan step's op: the plan decides when it goes
      if (!r.plan_spec && r.plan_refs == 0) step_.plan_storages.push_back(s);
      r.plan_spec = true;
      continue;
    }
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
                                     const Outputs& outputs, double cost) {
  if (options.backend == Backend::kCuda && op->kernel && !op->cuda_kernel)
    throw std::invalid_argument(absl::StrCat("remat: op '", op->name, "' has no CUDA kernel"));
  const int position = next_position();
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
  std::vector<Id> result;
  result.reserve(outputs.size());
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const OutputSpec& out = outputs[i];
    TensorRec tr;
    tr.spec = out.spec;
    tr.producer = op_id;
    const std::size_t bytes = out.spec.bytes();
    if (out.alias_of >= 0) {
      const TensorRec& base = tensors[inputs.at(static_cast<std::size_t>(out.alias_of))];
      tr.storage = base.storage;
      tr.offset = base.offset + out.alias_offset;
      // Recorded traces declare view sizes that need not fit their base (expand, as_strided);
      // only where kernels really read memory must a view lie inside it.
      if (runs_kernels && tr.offset + bytes > storages[base.storage].bytes) {
        // Nothing was run yet: undo the registration before reporting.
        for (Id t : result) release(t);
        for (Id t : inputs) {
          auto& c = storages[tensors[t].storage].consumers;
          c.erase(std::find(c.begin(), c.end(), op_id));
        }
        ops.remove(op_id);
        for (Id t : inputs) drop_tensor_ref(t);
        throw std::invalid_argument(absl::StrCat("remat: view output ", i, " of op '", op->name,
                                                 "' (", out.spec.to_string(),
                                                 ") lies outside its base storage"));
      }
    } else {
      StorageRec sr;
      sr.bytes = bytes;
      sr.producer = op_id;
      tr.storage = storages.add(std::move(sr));
      ++ops[op_id].refs;  // the storage keeps its producer alive: see Note [Lineage lifetime]
    }
    ++storages[tr.storage].tensor_refs;
    const Id t = tensors.add(std::move(tr));
    OpRec& o = ops[op_id];
    o.outputs.push_back(t);
    o.output_storage.push_back(tensors[t].storage);
    o.out_storages.push_back(out.alias_of >= 0 ? kNone : tensors[t].storage);
    o.alias_of.push_back(out.alias_of);
    o.output_specs.push_back(out.spec);
    ++o.refs;
    retain(t);
    result.push_back(t);
  }
  current_op_ = op->name;
  // Sites, recording and hint weights first: the op's run (now, or when the plan it follows
  // says) is then recorded at its position.
  const OpHint* hint = on_new_op(op_id, position);
  const bool follow = following();
  try {
    if (follow) {
      follow_schedule(op_id, position, hint);
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
  if (!follow) after_new_op(hint);
  return result;
}

// A new op that failed: its outputs' handles go, and so does its deferral if it had one.
void RuntimeImpl::abandon_new_op(Id op_id, const std::vector<Id>& outputs) {
  const bool deferred = cancel_deferral(op_id);
  for (Id t : outputs) release(t);
  if (deferred) release_op_ref(op_id);
}

// The memory resource's error, counted and completed with what only the runtime knows: the
// op, and the bytes that could not be evicted.
OutOfMemoryError RuntimeImpl::annotated(const OutOfMemoryError& e, const std::string& op) {
  ++stats.ooms;
  OutOfMemoryInfo info = e.info();
  info.op = op;
  info.pinned = stats.pinned_bytes;
  info.locked = failed_locked_bytes_ ? *failed_locked_bytes_ : unpinned_locked_bytes();
  failed_locked_bytes_.reset();
  return OutOfMemoryError(std::move(info));
}

// Locked storages that are not pinned: pinned ones are reported as pinned, once. O(storages),
// paid only when an allocation fails.
std::size_t RuntimeImpl::unpinned_locked_bytes() const {
  std::size_t bytes = 0;
  storages.for_each_slot([&](const StorageRec& r) {
    if (r.resident && r.locks > 0 && !r.pinned) bytes += r.bytes;
  });
  return bytes;
}

Id RuntimeImpl::new_constant(const TensorSpec& spec, const void* data) {
  StorageRec sr;
  sr.bytes = spec.bytes();
  sr.pinned = true;
  const Id s = storages.add(std::move(sr));
  current_op_ = "constant";
  try {
    allocate_storage(s);
  } catch (const OutOfMemoryError& e) {
    storages.remove(s);
    throw annotated(e, "constant");
  }
  stats.pinned_bytes += spec.bytes();
  if (data != nullptr && runs_kernels && spec.bytes() > 0) {
    if (options.backend == Backend::kCuda) {
      cuda_copy_to_device(storages[s].ptr, data, spec.bytes(), stream);
    } else {
      std::memcpy(storages[s].ptr, data, spec.bytes());
    }
  }
  TensorRec tr;
  tr.spec = spec;
  tr.storage = s;
  storages[s].tensor_refs = 1;
  const Id t = tensors.add(std::move(tr));
  retain(t);
  on_constant(t);
  return t;
}

const std::function<void(const KernelContext&)>& RuntimeImpl::kernel_of(const OpDef& op) const {
  return options.backend == Backend::kCuda ? op.cuda_kernel : op.kernel;
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
  current_op_ = ops[storages[s].producer].op->name;
  try {
    run_frames(storages[s].producer, /*recompute=*/true);
  } catch (const OutOfMemoryError& e) {
    throw annotated(e, current_op_);
  }
}

void RuntimeImpl::make_resident(Id t) {
  const Id s = tensors[t].storage;
  if (!storages[s].resident) recompute_storage(s);
  touch(s);
}

void* RuntimeImpl::data_pointer(Id t) {
  make_resident(t);
  on_host_read(t);
  const TensorRec& tr = tensors[t];
  return static_cast<char*>(storages[tr.storage].ptr) + tr.offset;
}

bool RuntimeImpl::evict_tensor(Id t) {
  const Id s = tensors[t].storage;
  if (!evictable(storages[s])) return false;
  evict(s);
  return true;
}

void RuntimeImpl::set_budget(std::size_t budget) {
  options.budget = budget;
  timeline.budget = budget;
  memory->set_budget(budget);
  // Lowering the budget below what is held evicts down to it where it can.
  while (memory->stats().reserved > budget) {
    const Id victim = choose_victim();
    if (victim == kNone) break;
    evict(victim);
    if (caching != nullptr) caching->release_cached();
  }
}

// ---------------------------------------------------------------------------------------
// In-place updates of pinned tensors

// Note [Updating pinned tensors]
// Optimizers write parameters in place, and a parameter is read by the lineage of every
// activation and gradient of the step. If a tensor whose recomputation reads the old value
// were evicted and recomputed after the update, it would come back with new bits. So before
// an update writes a storage, every tensor that the user still holds and that depends on it
// (through any chain of ops whose intermediate results nobody holds) is made resident and
// frozen: pinned, so that it is never evicted and its producer never runs again. Nothing
// else needs freezing: a held tensor's dependents recompute from the frozen bits, and a
// tensor nobody holds and nothing live depends on will never be read. In a training loop
// the frozen tensors are the gradients and the loss; they are freed with their last handle.
// A recorded step shows the freeze as inputs of the update's node: whatever it froze must be
// resident when the update runs, which is what a plan of the step has to budget for.
std::vector<Id> RuntimeImpl::freeze_dependents(const std::vector<Id>& roots) {
  std::vector<Id> work = roots;
  std::vector<Id> frontier;
  absl::flat_hash_set<Id> seen(roots.begin(), roots.end());
  while (!work.empty()) {
    const Id s = work.back();
    work.pop_back();
    for (Id c : storages[s].consumers) {
      for (Id out : ops[c].out_storages) {
        if (out == kNone || !seen.insert(out).second) continue;  // views share `s`'s storage
        const StorageRec& r = storages[out];
        if (r.pinned) continue;
        if (r.handles > 0) {
          frontier.push_back(out);
        } else {
          work.push_back(out);
        }
      }
    }
  }
  for (Id s : frontier) {
    if (!storages[s].resident) recompute_storage(s);
    StorageRec& r = storages[s];
    r.pinned = true;
    stats.pinned_bytes += r.bytes;
    refresh_candidate(s);
    ++stats.frozen;
  }
  return frontier;
}

void RuntimeImpl::update_pinned(const OpPtr& op, const std::vector<Id>& args,
                                std::span<const int> mutated) {
  std::vector<Id> targets;
  for (int m : mutated) {
    if (m < 0 || m >= static_cast<int>(args.size()))
      throw std::invalid_argument(absl::StrCat("remat: update op '", op->name,
                                               "' mutates argument ", m, " of ", args.size()));
    const StorageRec& r = storages[tensors[args[static_cast<std::size_t>(m)]].storage];
    if (!r.pinned || r.producer != kNone)
      throw std::invalid_argument(absl::StrCat("remat: update op '", op->name, "' argument ", m,
                                               " is not a constant; only pinned tensors are "
                                               "updated in place (use call_inplace)"));
    targets.push_back(tensors[args[static_cast<std::size_t>(m)]].storage);
  }
  const auto& kernel = kernel_of(*op);
  if (runs_kernels && !kernel)
    throw std::invalid_argument(absl::StrCat("remat: update op '", op->name,
                                             "' has no kernel for this backend"));
  const int position = next_position();
  settle_before_update(position);
  const std::vector<Id> frozen = freeze_dependents(targets);
  std::vector<Id> held;
  auto unlock_all = [&] {
    for (Id s : held) {
      storages[s].last_access = clock;
      unlock(s);
    }
  };
  try {
    for (Id t : args) {
      make_resident(t);  // an OOM here is annotated with the op being recomputed
      lock(tensors[t].storage);
      held.push_back(tensors[t].storage);
    }
  } catch (...) {
    unlock_all();
    throw;
  }
  std::vector<TensorSpec> specs;
  for (Id t : args) specs.push_back(tensors[t].spec);
  const double cost = op->cost ? op->cost(specs) : 0.0;
  if (runs_kernels) {
    std::vector<const void*> in_ptrs;
    std::vector<const TensorSpec*> in_specs;
    kernel_inputs(args, in_ptrs, in_specs);
    std::vector<void*> outs;
    std::vector<const TensorSpec*> out_specs;
    for (int m : mutated) {
      outs.push_back(const_cast<void*>(in_ptrs[static_cast<std::size_t>(m)]));
      out_specs.push_back(in_specs[static_cast<std::size_t>(m)]);
    }
    KernelContext ctx{in_ptrs, in_specs, outs, out_specs, RngState{}, false, stream};
    try {
      kernel(ctx);
    } catch (...) {
      unlock_all();
      throw;
    }
  }
  if (options.record_timeline) {
    timeline.events.push_back({TimelineEvent::Kind::kCompute, op->name, clock, cost, 0});
    note_memory();
  }
  clock += cost;
  ++stats.calls;
  stats.base_cost += cost;
  unlock_all();
  on_update(*op, args, cost, position, frozen);
}

// ---------------------------------------------------------------------------------------
// Handles and lineage lifetime

void RuntimeImpl::retain(Id t) {
  TensorRec& tr = tensors[t];
  ++tr.handles;
  ++tr.refs;
  ++storages[tr.storage].handles;
}

void RuntimeImpl::release(Id t) {
  TensorRec& tr = tensors[t];
  if (--tr.handles == 0) on_handles_gone(t);
  const Id s = tr.storage;
  --storages[s].handles;
  release_if_dead(s);
  drop_tensor_ref(t);
}

// Note [Lineage lifetime]
// A tensor record lives while a user handle holds it or a live op reads it; a storage record
// lives while a tensor record points at it; an op record lives while one of its output
// tensor records or one of the storages it makes does (a view can keep a storage alive after
// its base tensor died, and the storage must stay recomputable). The memory of a storage is
// freed as soon as no handle can reach it, but its record and its producer stay for as long
// as some live tensor may need it recomputed. Dropping the last handle of a long chain can
// free the whole chain: the cascade runs on an explicit worklist, never by recursion.
void RuntimeImpl::drop_tensor_ref(Id t0) {
  pending_tensors_.push_back(t0);
  drain_tensor_refs();
}

void RuntimeImpl::release_op_ref(Id op_id) {
  drop_op_ref(op_id);
  drain_tensor_refs();
}

void RuntimeImpl::drain_tensor_refs() {
  while (!pending_tensors_.empty()) {
    const Id t = pending_tensors_.back();
    pending_tensors_.pop_back();
    TensorRec& tr = tensors[t];
    if (--tr.refs > 0) continue;
    const Id s = tr.storage;
    const Id producer = tr.producer;
    tensors.remove(t);
    if (producer != kNone) {
      OpRec& op = ops[producer];
      for (std::size_t k = 0; k < op.outputs.size(); ++k)
        if (op.outputs[k] == t) op.outputs[k] = op.output_storage[k] = kNone;
    }
    if (--storages[s].tensor_refs == 0) destroy_storage(s);
    if (producer != kNone) drop_op_ref(producer);
  }
}

// Drops one reference to an op; a dead op releases its inputs (onto the worklist).
void RuntimeImpl::drop_op_ref(Id op_id) {
  OpRec& op = ops[op_id];
  if (--op.refs > 0) return;
  for (Id in : op.inputs) {
    auto& consumers = storages[tensors[in].storage].consumers;
    auto it = std::find(consumers.begin(), consumers.end(), op_id);
    if (it != consumers.end()) {
      *it = consumers.back();
      consumers.pop_back();
    }
  }
  pending_tensors_.insert(pending_tensors_.end(), op.inputs.begin(), op.inputs.end());
  ops.remove(op_id);
}

void RuntimeImpl::destroy_storage(Id s) {
  StorageRec& r = storages[s];
  if (r.resident) {
    if (r.pinned) stats.pinned_bytes -= r.bytes;
    release_memory(s);
  }
  if (r.candidate_slot != kNone) {
    r.locks = 1;  // not evictable: takes it out of the candidates
    refresh_candidate(s);
  }
  policy->on_destroyed(s);
  const Id producer = r.producer;
  storages.remove(s);
  if (producer != kNone) {
    OpRec& op = ops[producer];
    std::replace(op.out_storages.begin(), op.out_storages.end(), s, kNone);
    drop_op_ref(producer);
  }
}

}  // namespace detail

// ---------------------------------------------------------------------------------------
// The public facade

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
}  // namespace

std::vector<std::string> eviction_policy_names() { return detail::policy_names(); }

Runtime::Runtime(RuntimeOptions options)
    : impl_(std::make_unique<detail::RuntimeImpl>(std::move(options))) {}
Runtime::~Runtime() = default;

Tensor Runtime::constant(const TensorSpec& spec, const void* data) {
  return Tensor(this, impl_->new_constant(spec, data));
}

std::vector<Tensor> Runtime::call(const OpPtr& op, std::span<const Tensor> inputs) {
  std::vector<TensorSpec> specs;
  specs.reserve(inputs.size());
  for (const Tensor& t : inputs) specs.push_back(t.spec());
  Outputs outputs = op->infer(specs);
  const double cost = op->cost ? op->cost(specs) : -1.0;
  return call_with(op, inputs, outputs, cost);
}

std::vector<Tensor> Runtime::call_with(const OpPtr& op, std::span<const Tensor> inputs,
                                       const Outputs& outputs, double cost) {
  for (const OutputSpec& o : outputs) {
    if (o.alias_of >= static_cast<int>(inputs.size()))
      throw std::invalid_argument(absl::StrCat("remat: op '", op->name, "' aliases input ",
                                               o.alias_of, " of ", inputs.size()));
  }
  std::vector<detail::Id> ids = impl_->run_new(op, ids_of(inputs, this), outputs, cost);
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
      throw std::invalid_argument(absl::StrCat("remat: op '", op->name, "' mutates argument ", m,
                                               " of ", args.size()));
    outputs.emplace_back(specs[static_cast<std::size_t>(m)]);
  }
  if (cost < 0 && op->cost) cost = op->cost(specs);
  std::vector<Tensor> fresh = call_with(op, inputs, outputs, cost);
  for (std::size_t i = 0; i < mutated.size(); ++i)
    *args[static_cast<std::size_t>(mutated[i])] = std::move(fresh[i]);
}

const void* Runtime::data(const Tensor& t) {
  if (!impl_->runs_kernels)
    throw std::logic_error("remat: tensor data is not readable on the simulated backend");
  return impl_->data_pointer(t.id());
}

void Runtime::read(const Tensor& t, void* dst) {
  const void* src = data(t);
  if (impl_->options.backend == Backend::kCuda) {
    cuda_copy_to_host(dst, src, t.bytes(), impl_->stream);
  } else {
    std::memcpy(dst, src, t.bytes());
  }
}

void Runtime::update(const OpPtr& op, std::span<const Tensor> args,
                     std::span<const int> mutated) {
  impl_->update_pinned(op, ids_of(args, this), mutated);
}

void Runtime::materialize(const Tensor& t) { impl_->make_resident(t.id()); }
bool Runtime::evict(const Tensor& t) { return impl_->evict_tensor(t.id()); }
void Runtime::set_budget(std::size_t budget) { impl_->set_budget(budget); }
void Runtime::begin_step(StepOptions options) { impl_->begin_step(std::move(options)); }
void Runtime::mark_backward() { impl_->mark_backward(); }
RecordedStep Runtime::end_step() { return impl_->end_step(); }
const Timeline& Runtime::timeline() const { return impl_->timeline; }
std::size_t Runtime::budget() const { return impl_->options.budget; }
const RuntimeOptions& Runtime::options() const { return impl_->options; }
MemoryResource& Runtime::memory() { return *impl_->memory; }
double Runtime::clock() const { return impl_->clock; }

RuntimeStats Runtime::stats() const {
  RuntimeStats s = impl_->stats;
  s.memory = impl_->memory->stats();
  s.live_tensors = impl_->tensors.live();
  return s;
}

void Runtime::reset_peaks() {
  impl_->memory->reset_peaks();
  impl_->stats.peak_resident_bytes = impl_->stats.resident_bytes;
}

void Runtime::retain(std::uint32_t id) { impl_->retain(id); }
void Runtime::release(std::uint32_t id) { impl_->release(id); }
const TensorSpec& Runtime::spec_of(std::uint32_t id) const { return impl_->tensors[id].spec; }
bool Runtime::resident_of(std::uint32_t id) const {
  return impl_->storages[impl_->tensors[id].storage].resident;
}

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
