// Offloading storages to host memory and bringing them back.
#include "runtime/core/host_tier.h"

#include <cstring>
#include <stdexcept>
#include <utility>

#include "runtime/core/runtime_impl.h"

namespace remat::detail {

// Note [The host tier]
// A storage can be resident, evicted (its bytes gone, its lineage kept to recompute them),
// or offloaded: its bytes copied to host memory and its device memory given back, out of the
// budget. Constants are what only the host tier can free: they have no lineage, and a
// training step holds some it never reads between two optimizer steps (AdamW's moments are
// twice the parameters). Runtime::offload moves one when the caller asks; the first use
// that needs its bytes (an op reading it, data(), read(), an update writing it) brings them
// back into a block of its own, as new_constant would have made it (not part of a placed
// sequence), before anything reads it. And where a request finds nothing left to evict and
// no block to move, the constant read longest ago goes to the host instead of the request
// failing (offload_coldest). Each transfer costs HostLink::price of simulated time on a copy
// engine beside the kernels (Note [Copies beside the kernels]). The host memory is
// bounded (RuntimeOptions::host_memory_bytes): an offload that does not fit is refused and
// the constant stays. Storages with lineage go there too where that is the cheaper way back
// (Note [Keep, recompute or offload]). The bytes are kept in plain memory on the CPU, in a
// pinned pool on CUDA (Note [A pinned pool] in runtime/cuda/pinned_host_pool.cc); an
// offload the pool cannot hold is refused like one over the capacity.
void HostTier::use_cuda(std::shared_ptr<CudaApi> api, CudaStream compute) {
  cuda_copies_ = std::make_unique<CudaHostCopies>(std::move(api), compute, capacity_);
}

bool HostTier::put(Id s, const void* src, std::size_t size, double now, double price) {
  if (!has_room(size)) throw std::logic_error("remat: host tier over its capacity");
  Entry entry{.size = size, .bytes = {}, .copied_at = 0};
  if (src != nullptr && size > 0) {
    if (cuda_copies_) {
      if (!cuda_copies_->copy_out(s, src, size)) return false;
    } else {
      entry.bytes.assign(static_cast<const unsigned char*>(src),
                         static_cast<const unsigned char*>(src) + size);
    }
  }
  entry.copied_at = copy_to_host(now, price);
  entries_[s] = std::move(entry);
  used_ += size;
  peak_ = std::max(peak_, used_);
  return true;
}

void HostTier::take(Id s, void* dst) {
  auto it = entries_.find(s);
  if (it == entries_.end()) throw std::logic_error("remat: a storage is not on the host");
  if (dst != nullptr && it->second.size > 0) {
    if (cuda_copies_)
      cuda_copies_->copy_in(s, dst);
    else
      std::memcpy(dst, it->second.bytes.data(), it->second.size);
  }
  used_ -= it->second.size;
  entries_.erase(it);
}

void HostTier::drop(Id s) {
  if (cuda_copies_) cuda_copies_->drop(s);
  auto it = entries_.find(s);
  if (it == entries_.end()) return;
  used_ -= it->second.size;
  entries_.erase(it);
}

// A constant, or a storage with lineage that the program or a followed plan holds (a dead
// one is evicted: its memory is free for nothing).
bool RuntimeImpl::offloadable(const StorageRec& r) const {
  const bool held =
      r.pinned || ((r.handles > 0 || r.holds > 0) && !r.lingering && r.producer != kNone);
  return held && r.resident && r.locks == 0 && !kernel_running_ && host_.has_room(r.bytes);
}

// Note [Copies beside the kernels]
// A copy between device and host runs on a copy engine, one each way, beside the kernels:
// HostTier queues each copy after the ones before it on its engine and says when it ends.
// The clock (the compute stream) only waits where it needs a copy to have ended: where an
// offload gives the device memory back (the copy out must be done), and where something
// uses a storage whose copy back is in flight (StorageRec::ready_at). So a copy started
// early costs nothing: copy_to_host starts the copy out while the storage stays resident
// (its bytes never change: copy-on-write), and prefetch starts the copy back ahead of the
// first use, its device memory taken from then on. Used on demand, both ways cost their
// whole price, as before. RuntimeStats::transfer_cost counts the copies' time and
// transfer_exposed what the clock waited for. On the CPU the bytes are copied at once; on
// CUDA the copies run on copy streams, one each way, ordered against the runtime's stream
// by events where the clock waits (Note [Copy streams] in runtime/cuda/cuda_host_copies.cc).
bool RuntimeImpl::copy_to_host(Id s) {
  StorageRec& r = storages[s];
  if (host_.contains(s) || !offloadable(r)) return false;
  wait_ready(s);  // a copy out cannot start before the copy in has ended
  const double price = options.host_link.price(r.bytes);
  if (!host_.put(s, runs_kernels ? r.ptr : nullptr, r.bytes, clock, price)) return false;
  stats.transfer_cost += price;
  return true;
}

bool RuntimeImpl::offload(Id s) {
  StorageRec& r = storages[s];
  if (!host_.contains(s) && !copy_to_host(s)) return false;
  if (!r.resident || r.locks > 0 || kernel_running_) return false;
  wait_until(host_.copied_at(s));  // the memory is reused from here
  release_memory(s);
  r.offloaded = true;
  if (r.pinned) {
    stats.pinned_bytes -= r.bytes;
  } else {  // to the policies, as evicted: not resident, its neighbours' costs grow
    refresh_candidate(s);
    policy->on_evicted(s);
  }
  ++stats.offloads;
  return true;
}

// Note [Keep, recompute or offload]
// The policy picks what leaves the device; how it comes back is priced per storage. Where
// the host tier has room and a round trip over the host link (HostLink::price each way)
// costs less than rerunning the storage's producer, the bytes go to the host instead of
// being evicted: a transfer costs its bytes, a recomputation its kernels. Only storages the
// program holds are offloaded; a dead one lingering for a recomputation is simply freed. The
// choice of victim stays the policy's, priced by recomputation: scoring victims with the
// cheaper of the two ways back, and charging an offloaded storage in an evicted chain its
// copy, were measured slower on the shared traces (docs/measurements.md, Host tier). A
// victim's copies are made on demand, so they cost their whole price; prefetching where the
// recorded step says a storage returns is next (issue 33).
void RuntimeImpl::evict_or_offload(Id s) {
  const StorageRec& r = storages[s];
  if (options.host_memory_bytes > 0 && options.offload_victims &&
      2 * options.host_link.price(r.bytes) < policy->view().cost_of(s) && offload(s))
    return;
  evict(s);
}

// The program let go of an offloaded storage with lineage: its host bytes go, and it stays
// recomputable like any evicted storage. (One a deferred op still holds keeps them until its
// record dies.)
void RuntimeImpl::drop_dead_offload(Id s) {
  StorageRec& r = storages[s];
  if (!r.offloaded || r.pinned || r.handles > 0 || r.holds > 0) return;
  host_.drop(s);
  r.offloaded = false;
}

// When a request finds nothing left to evict and no block to move, the constant read
// longest ago that no running op holds goes to the host, rather than the request failing.
bool RuntimeImpl::offload_coldest() {
  if (options.host_memory_bytes == 0 || kernel_running_) return false;
  Id coldest = kNone;
  for (Id s = 0; s < storages.slots(); ++s) {
    const StorageRec& r = storages[s];
    if (!r.pinned || r.bytes == 0 || !offloadable(r)) continue;
    if (coldest == kNone || r.last_access < storages[coldest].last_access) coldest = s;
  }
  return coldest != kNone && offload(coldest);
}

// Brings an offloaded storage's bytes back into device memory of its own, and waits for
// them; on an out-of-memory error they stay on the host.
void RuntimeImpl::restore(Id s) {
  prefetch(s);
  wait_ready(s);
}

bool RuntimeImpl::prefetch(Id s) {
  if (!storages[s].offloaded || kernel_running_) return false;
  const PlacementPause pause(caching, /*short_lived=*/false);
  allocate_storage(s);  // may evict others
  StorageRec& r = storages[s];
  if (r.pinned) pack_pinned(s, /*copy_bytes=*/false);
  host_.take(s, runs_kernels ? r.ptr : nullptr);
  r.offloaded = false;
  const double price = options.host_link.price(r.bytes);
  r.ready_at = host_.copy_to_device(clock, price);
  stats.transfer_cost += price;
  if (r.pinned) {
    stats.pinned_bytes += r.bytes;
  } else {  // a candidate again, as a recomputed storage would be
    policy->on_resident(s);
    refresh_candidate(s);
    refresh_neighbours(s);
    touch(s);
  }
  ++stats.restores;
  return true;
}

void RuntimeImpl::wait_ready(Id s) {
  wait_until(storages[s].ready_at);
  host_.order_compute_after(s);
}

void RuntimeImpl::wait_until(double t) {
  if (t <= clock) return;
  stats.transfer_exposed += t - clock;
  clock = t;
}

void RuntimeImpl::discard_host_copy(Id s) {
  if (!storages[s].offloaded) host_.drop(s);
}

}  // namespace remat::detail
