#include "runtime/cuda/pinned_staging.h"

#include <algorithm>
#include <cstring>

#include "remat/errors.h"

namespace remat::detail {

// Note [Pinned staging]
// A copy from pageable host memory makes the CUDA driver stage it itself and, for the
// caller's buffer to be reusable on return, completes it before returning: every upload is a
// stall of the host. Instead the runtime copies through two page-locked buffers of `chunk`
// bytes, used in turn: the host fills one while the device copies out of the other, and an
// event recorded after each copy says when its buffer may be filled again. An upload returns
// as soon as its last chunk is enqueued. A download has to wait for the device anyway (the
// caller reads the bytes on return), so it synchronizes once per chunk and the buffer is
// free again when it returns. Chunks keep the pinned memory small and fixed: page-locked
// memory is taken from the host's RAM for good.
PinnedStaging::PinnedStaging(CudaApi& api, CudaStream stream, std::size_t chunk)
    : api_(api), stream_(stream), chunk_(chunk) {}

PinnedStaging::~PinnedStaging() {
  for (Buffer& b : buffers_) {
    if (b.done != nullptr) {
      api_.event_synchronize(b.done);
      api_.event_destroy(b.done);
    }
    if (b.host != nullptr) api_.free_host(b.host);
  }
}

PinnedStaging::Buffer& PinnedStaging::next_buffer() {
  Buffer& b = buffers_[turn_];
  turn_ = (turn_ + 1) % buffers_.size();
  if (b.host == nullptr) {
    CudaError::check(api_.malloc_host(&b.host, chunk_), "cudaMallocHost");
    CudaError::check(api_.event_create(&b.done, /*timing=*/false), "cudaEventCreate");
  }
  if (b.in_flight) {
    CudaError::check(api_.event_synchronize(b.done), "cudaEventSynchronize");
    b.in_flight = false;
  }
  return b;
}

void PinnedStaging::upload(void* dst, const void* src, std::size_t bytes) {
  for (std::size_t at = 0; at < bytes; at += chunk_) {
    const std::size_t n = std::min(chunk_, bytes - at);
    Buffer& b = next_buffer();
    std::memcpy(b.host, static_cast<const char*>(src) + at, n);
    CudaError::check(api_.memcpy_async(static_cast<char*>(dst) + at, b.host, n,
                                       CudaCopy::kHostToDevice, stream_),
                     "cudaMemcpyAsync");
    CudaError::check(api_.event_record(b.done, stream_), "cudaEventRecord");
    b.in_flight = true;
  }
}

void PinnedStaging::download(void* dst, const void* src, std::size_t bytes) {
  for (std::size_t at = 0; at < bytes; at += chunk_) {
    const std::size_t n = std::min(chunk_, bytes - at);
    Buffer& b = next_buffer();
    CudaError::check(api_.memcpy_async(b.host, static_cast<const char*>(src) + at, n,
                                       CudaCopy::kDeviceToHost, stream_),
                     "cudaMemcpyAsync");
    CudaError::check(api_.event_record(b.done, stream_), "cudaEventRecord");
    CudaError::check(api_.event_synchronize(b.done), "cudaEventSynchronize");
    std::memcpy(static_cast<char*>(dst) + at, b.host, n);
  }
}

}  // namespace remat::detail
