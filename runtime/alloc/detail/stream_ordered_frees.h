// The caching allocator's stream-ordered reuse (Note [Stream-ordered reuse]): which live
// blocks other streams use, and the frees of such blocks, deferred until the work those
// streams had enqueued completes. Internal to the runtime.
//
//   detail::StreamOrderedFrees frees(cuda, stream);
//   frees.record(block, side_stream);      // a kernel on side_stream reads the block
//   if (!frees.defer(block)) finish(block);  // freed: reusable at once only if no other
//                                            // stream used it
//   frees.poll(/*wait=*/false, finish);    // later: blocks whose events completed
#ifndef REMAT_RUNTIME_ALLOC_DETAIL_STREAM_ORDERED_FREES_H_
#define REMAT_RUNTIME_ALLOC_DETAIL_STREAM_ORDERED_FREES_H_

#include <absl/container/flat_hash_map.h>
#include <absl/functional/function_ref.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "remat/cuda_api.h"
#include "remat/errors.h"
#include "runtime/alloc/detail/blocks.h"

namespace remat::detail {

class StreamOrderedFrees {
 public:
  // `api` must outlive this; `stream` is the one every block is allocated on.
  StreamOrderedFrees(CudaApi* api, CudaStream stream) : cuda_(api), stream_(stream) {}
  StreamOrderedFrees(const StreamOrderedFrees&) = delete;
  StreamOrderedFrees& operator=(const StreamOrderedFrees&) = delete;
  // Waits for every pending free's events and destroys them; errors are dropped.
  ~StreamOrderedFrees();

  CudaApi* api() const { return cuda_; }
  CudaStream stream() const { return stream_; }
  void set_stream(CudaApi* api, CudaStream stream) {
    cuda_ = api;
    stream_ = stream;
  }

  // The live block at `address` is used by work on `stream` too.
  void record(std::uintptr_t address, CudaStream stream);
  bool used_by_other_streams(std::uintptr_t address) const {
    return !by_block_.empty() && by_block_.contains(address);
  }
  // Where other streams used `b`, now freed: records an event on each, keeps `b` pending
  // and returns true. False where `b` may be reused at once. Never throws: an error is kept
  // for the next allocation (`raise_error`).
  bool defer(Block* b);
  // Calls `finish` on every pending block whose events have completed; with `wait`, waits
  // for them all first. Raises CudaError from the event calls.
  void poll(bool wait, absl::FunctionRef<void(Block*)> finish);
  bool has_pending() const { return !pending_.empty(); }
  // Throws, once, the error a deferred free met.
  void raise_error();

  // Counters for MemoryStats: frees deferred, still pending, and waits for other streams.
  std::size_t deferred() const { return deferred_; }
  std::size_t pending() const { return pending_.size(); }
  std::size_t waits() const { return waits_; }

 private:
  struct PendingFree {
    Block* block;
    std::vector<CudaEvent> events;
  };
  CudaEvent take_event();

  CudaApi* cuda_;
  CudaStream stream_;
  absl::flat_hash_map<std::uintptr_t, std::vector<CudaStream>> by_block_;  // live blocks
  std::vector<PendingFree> pending_;
  std::vector<CudaEvent> spare_events_;
  std::optional<CudaError> error_;  // from a free, raised by the next allocation
  std::size_t deferred_ = 0;
  std::size_t waits_ = 0;
};

}  // namespace remat::detail

#endif  // REMAT_RUNTIME_ALLOC_DETAIL_STREAM_ORDERED_FREES_H_
