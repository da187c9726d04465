// The runtime core: construction, residency, the candidate index, lingering storages.
#include "runtime/core/runtime_impl.h"

#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>
#include <absl/strings/str_cat.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "remat/logical_memory.h"
#include "remat/segment_source.h"
#include "runtime/alloc/detail/allocator_hooks.h"
#include "runtime/cuda/cuda_segment_source.h"

namespace remat::detail {
namespace {

std::unique_ptr<SegmentSource> make_source(const RuntimeOptions& options, const CudaDevice* cuda) {
  switch (options.backend) {
    case Backend::kCpu:
      return std::make_unique<HostSegmentSource>();
    case Backend::kSimulated:
      return std::make_unique<SimulatedSegmentSource>();
    case Backend::kCuda:
      return make_cuda_segment_source(cuda->shared_api(), cuda->index(),
                                      options.allocator.expandable_segments);
  }
  return nullptr;
}

}  // namespace

RuntimeImpl::RuntimeImpl(RuntimeOptions opts)
    : options(std::move(opts)),
      host_(options.host_memory_bytes),
      sampler_(options.seed ^ 0x9e3779b97f4a7c15ULL) {
  const bool on_cuda = options.backend == Backend::kCuda;
  roofline = options.roofline.value_or(on_cuda ? Roofline::gpu() : Roofline::cpu());
  if (on_cuda) {
    if (options.accounting == Accounting::kLogical)
      throw std::invalid_argument(
          "remat: logical accounting is for the CPU and simulated backends");
    cuda = CudaDevice::open(options.cuda.api, options.cuda.device, options.cuda.stream,
                            options.cuda.sync_after_launch);
  }
  CudaDevice::Scope scope(cuda.get());
  if (options.accounting == Accounting::kLogical) {
    memory = std::make_unique<LogicalMemory>(options.budget, options.backend == Backend::kCpu);
  } else {
    CachingAllocatorOptions a = options.allocator;
    a.budget = options.budget;
    auto alloc = std::make_unique<CachingAllocator>(make_source(options, cuda.get()), a);
    if (on_cuda) alloc->use_stream(&cuda->api(), cuda->stream());
    caching = alloc.get();
    memory = std::move(alloc);
  }
  if (on_cuda) reserve_workspace();
  if (on_cuda && options.host_memory_bytes > 0) host_.use_cuda(cuda->shared_api(), cuda->stream());
  memory->set_reclaimer(this);
  timeline.budget = options.budget;
  runs_kernels = options.backend != Backend::kSimulated;
  policy = make_eviction_policy(
      options.policy, LineageView{&storages, &tensors, &ops, &clock, &clock_base}, options.seed);
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

// Note [CUDA start-up memory]
// Every byte the runtime puts on the device is under the budget: cuBLAS's workspace is taken
// from the allocator at start-up and pinned for the runtime's life (cuBLAS would otherwise
// cudaMalloc its own, outside any cap, on a GEMM's first run). What the runtime cannot
// allocate itself, the CUDA context and the kernels' module images, is in use before it
// starts; cudaMemGetInfo's used bytes at start-up (which also count other processes) are
// reported as outside the budget (RuntimeStats::cuda).
void RuntimeImpl::reserve_workspace() {
  workspace_bytes = options.cuda.blas_workspace_bytes != 0
                        ? options.cuda.blas_workspace_bytes
                        : (cuda->major() >= 9 ? std::size_t{32} << 20 : std::size_t{4} << 20);
  if (memory->rounded_size(workspace_bytes) > options.budget) {
    throw std::invalid_argument(
        absl::StrCat("remat: the budget of ", options.budget,
                     " bytes is smaller than the CUDA start-up overhead: cuBLAS's workspace of ",
                     workspace_bytes, " bytes (CudaOptions::blas_workspace_bytes sets it)"));
  }
  workspace = allocate_for_good(workspace_bytes);
  stats.pinned_bytes += workspace_bytes;
  stats.cuda.device_total_bytes = cuda->total_bytes();
  stats.cuda.outside_bytes = cuda->total_bytes() - cuda->free_bytes_at_open();
  stats.cuda.workspace_bytes = workspace_bytes;
}

// Memory held for the runtime's life at a fixed address (cuBLAS keeps the workspace's):
// a segment of exactly its size, so that no free rest beside it is fenced off from
// compaction and evacuation, which cannot move it. In the expandable arena it is the
// first block. No reclaimer yet: nothing to evict.
void* RuntimeImpl::allocate_for_good(std::size_t bytes) {
  if (caching != nullptr && !options.allocator.expandable_segments) {
    const std::vector<void*> p = AllocatorHooks::allocate_packed(*caching, {bytes});
    if (p.size() == 1) return p[0];
  }
  return memory->allocate(bytes);
}

RuntimeImpl::~RuntimeImpl() {
  CudaDevice::Scope scope(cuda.get());
  memory->set_reclaimer(nullptr);
  if (cuda != nullptr) {
    try {
      cuda->synchronize();  // kernels still running may use what is about to be freed
    } catch (const CudaError&) {
    }
  }
  if (workspace != nullptr) memory->deallocate(workspace, workspace_bytes);
  memory.reset();  // under the scope: its segments go back to this device
}

double RuntimeImpl::declared_cost(const OpDef& op, SpecList specs) const {
  if (op.work) return roofline.price(op.work(specs));
  return op.cost ? op.cost(specs) : -1.0;
}

void RuntimeImpl::record_stream(Id t, CudaStream s) {
  const Id st = tensors[t].storage;
  if (!storages[st].resident) {
    throw std::logic_error(absl::StrCat(
        "remat: record_stream of a tensor that is not resident (tensor ", t,
        "); call it right after data(), before any other call that may evict the tensor"));
  }
  if (caching != nullptr && cuda != nullptr) caching->record_stream(storages[st].ptr, s);
}

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
  if (caching != nullptr) AllocatorHooks::set_tag(*caching, p, s);
  stats.resident_bytes += bytes;
  stats.peak_resident_bytes = std::max(stats.peak_resident_bytes, stats.resident_bytes);
}

// Moves a pinned, resident storage nothing is running on to the lowest free block below it
// (Note [Packing pinned storages] in compaction_support.cc). The copy is ordered on the
// runtime's stream like any kernel; the old block is freed in stream order too.
void RuntimeImpl::pack_pinned(Id s, bool copy_bytes) {
  StorageRec& r = storages[s];
  if (caching == nullptr || !options.compaction || !r.pinned || !r.resident || r.locks > 0 ||
      r.bytes == 0)
    return;
  void* to = AllocatorHooks::allocate_below(*caching, r.bytes, r.ptr);
  if (to == nullptr) return;
  move_storage(s, to, copy_bytes);
  ++stats.packed_storages;
}

// Gives resident storage `s` the block at `to` (already allocated) and frees its old one.
// Its bytes are copied on the runtime's stream on CUDA, by memcpy on the host, not at all
// where kernels do not run or `copy_bytes` is false.
void RuntimeImpl::move_storage(Id s, void* to, bool copy_bytes) {
  host_.order_compute_after(s);  // a copy in flight touches the old block
  StorageRec& r = storages[s];
  if (copy_bytes && runs_kernels && r.bytes > 0) {
    if (cuda != nullptr)
      cuda->copy(to, r.ptr, r.bytes);
    else
      std::memcpy(to, r.ptr, r.bytes);
  }
  AllocatorHooks::moved(*caching, r.ptr, to);  // a trace follows it (Note [Placed allocations])
  memory->deallocate(r.ptr, r.bytes);
  r.ptr = to;
  AllocatorHooks::set_tag(*caching, to, s);
}

void RuntimeImpl::copy_to_storage(void* dst, const void* host, std::size_t bytes) {
  if (cuda != nullptr)
    cuda->upload(dst, host, bytes);
  else
    std::memcpy(dst, host, bytes);
}

void RuntimeImpl::copy_from_storage(void* host, const void* src, std::size_t bytes) {
  if (cuda != nullptr)
    cuda->download(host, src, bytes);
  else
    std::memcpy(host, src, bytes);
}

// Gives a resident storage's bytes back to the memory resource.
void RuntimeImpl::release_memory(Id s) {
  host_.order_compute_after(s);  // Note [Copy streams]
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
// Until memory is needed it is reused for nothing. Lingering storages go at the end of each
// step, so no dead tensor outlives the step it served.
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
  discard_host_copy(s);
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
                               producer == kNone ? std::string() : ops[producer].op->name,
                               clock_base + clock, 0.0, storages[s].bytes});
    note_memory();
  }
}

// A storage no user handle can reach is freed at once; its record stays while lineage needs it.
void RuntimeImpl::release_if_dead(Id s) {
  if (releasable(storages[s])) free_storage(s);
}

// Resident, and nothing holds it: no handle, lock, or step's hold.
bool RuntimeImpl::releasable(const StorageRec& r) const {
  return r.handles == 0 && r.resident && !r.pinned && r.locks == 0 && r.holds == 0;
}

void RuntimeImpl::make_resident(Id t) {
  const Id s = tensors[t].storage;
  if (!storages[s].resident) recompute_storage(s);
  wait_ready(s);
  touch(s);
}

void* RuntimeImpl::data_pointer(Id t) {
  make_resident(t);
  if (step) step->on_host_read(t);
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

void RuntimeImpl::note_memory() {
  const MemoryStats m = memory->stats();
  timeline.memory.push_back({clock_base + clock, m.allocated, m.reserved});
}

std::vector<HeldTensors> RuntimeImpl::held_tensors() const {
  absl::flat_hash_map<std::string, HeldTensors> groups;
  absl::flat_hash_set<Id> counted;  // storages, each once (views share their base's)
  for (Id t = 0; t < tensors.slots(); ++t) {
    const TensorRec& tr = tensors[t];
    if (tr.handles == 0 || tr.storage == kNone) continue;
    const std::string op =
        tr.producer == kNone ? std::string("constant") : ops[tr.producer].op->name;
    HeldTensors& g = groups[op];
    g.op = op;
    ++g.tensors;
    if (!counted.insert(tr.storage).second) continue;
    const StorageRec& s = storages[tr.storage];
    g.bytes += s.bytes;
    if (s.resident) g.resident_bytes += s.bytes;
    if (s.resident && s.pinned) g.pinned_bytes += s.bytes;
  }
  std::vector<HeldTensors> out;
  for (auto& [name, g] : groups) out.push_back(std::move(g));
  std::sort(out.begin(), out.end(), [](const HeldTensors& a, const HeldTensors& b) {
    return a.resident_bytes != b.resident_bytes ? a.resident_bytes > b.resident_bytes : a.op < b.op;
  });
  return out;
}

RuntimeStats RuntimeImpl::current_stats() const {
  RuntimeStats s = stats;
  s.memory = memory->stats();
  s.live_tensors = tensors.live();
  s.offloaded_bytes = host_.used();
  s.peak_offloaded_bytes = host_.peak();
  return s;
}

void RuntimeImpl::reset_peaks() {
  memory->reset_peaks();
  stats.peak_resident_bytes = stats.resident_bytes;
  host_.reset_peak();
}

}  // namespace remat::detail
