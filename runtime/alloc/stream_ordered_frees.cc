#include "runtime/alloc/detail/stream_ordered_frees.h"

#include <algorithm>
#include <utility>

namespace remat::detail {

// Note [Stream-ordered reuse]
// A CUDA allocation is made on a stream, and freeing it only means the host has no more use
// for it: kernels enqueued earlier may still read or write it. Reusing the block for later
// work on the same stream is safe, since that work is ordered after them. Work on another
// stream is not ordered, so a block that other streams used (`record_stream`, as PyTorch's
// `Tensor.record_stream`) is not freed when the runtime frees it: the allocator records an
// event on each of those streams and keeps the block, still allocated, pending until every
// event has completed. Pending blocks are polled (never waited for) at the start of each
// allocation; a request that nothing cached can serve waits for them before it gives cached
// segments back or asks the runtime to evict, since waiting for a side stream is cheaper
// than recomputing. Errors from the event calls are raised as CudaError.
StreamOrderedFrees::~StreamOrderedFrees() {
  for (auto& p : pending_)
    for (CudaEvent e : p.events) {
      cuda_->event_synchronize(e);
      cuda_->event_destroy(e);
    }
  for (CudaEvent e : spare_events_) cuda_->event_destroy(e);
}

void StreamOrderedFrees::record(std::uintptr_t address, CudaStream stream) {
  if (stream == stream_) return;  // stream order covers its own stream
  auto& streams = by_block_[address];
  if (std::find(streams.begin(), streams.end(), stream) == streams.end()) streams.push_back(stream);
}

CudaEvent StreamOrderedFrees::take_event() {
  if (!spare_events_.empty()) {
    CudaEvent e = spare_events_.back();
    spare_events_.pop_back();
    return e;
  }
  CudaEvent e = nullptr;
  CudaError::check(cuda_->event_create(&e, /*timing=*/false), "cudaEventCreate");
  return e;
}

bool StreamOrderedFrees::defer(Block* b) {
  if (by_block_.empty()) return false;
  auto uses = by_block_.find(b->address);
  if (uses == by_block_.end()) return false;
  PendingFree pending{b, {}};
  try {
    for (CudaStream s : uses->second) {
      pending.events.push_back(take_event());
      CudaError::check(cuda_->event_record(pending.events.back(), s), "cudaEventRecord");
    }
  } catch (const CudaError& e) {
    // A free cannot fail; the block stays pending and the next allocation reports it.
    if (!error_) error_ = e;
  }
  by_block_.erase(uses);
  b->tag = kNoTag;  // no tensor's any more: the runtime may not evict it
  pending_.push_back(std::move(pending));
  ++deferred_;
  return true;
}

void StreamOrderedFrees::poll(bool wait, absl::FunctionRef<void(Block*)> finish) {
  std::erase_if(pending_, [&](PendingFree& p) {
    for (CudaEvent e : p.events) {
      CudaResult r = cuda_->event_query(e);
      if (r.status == CudaStatus::kNotReady && wait) {
        ++waits_;
        r = cuda_->event_synchronize(e);
      }
      if (r.status == CudaStatus::kNotReady) return false;
      CudaError::check(r, wait ? "cudaEventSynchronize" : "cudaEventQuery");
    }
    for (CudaEvent e : p.events) spare_events_.push_back(e);
    finish(p.block);
    return true;
  });
}

void StreamOrderedFrees::raise_error() {
  if (!error_) return;
  const CudaError e = *error_;
  error_.reset();
  throw e;
}

}  // namespace remat::detail
