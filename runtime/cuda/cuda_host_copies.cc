#include "runtime/cuda/cuda_host_copies.h"

#include <stdexcept>
#include <utility>

#include "remat/errors.h"

namespace remat::detail {

// Note [Copy streams]
// A copy to or from the host runs on a stream of its own, one each way (a GPU has a copy
// engine each way), so that it overlaps the kernels on the compute stream and the other
// direction's copies. Events order the three streams, never the host:
// - a copy out starts after the compute stream's work so far (the kernel that wrote the
//   bytes); the bytes do not change while it runs (the runtime writes a new storage rather
//   than rewrite one, and an update that does drops the host copy first, which orders the
//   compute stream after it);
// - before the device memory a copy out reads is freed or rewritten, the compute stream
//   waits for the copy out (the allocator then reuses the memory in stream order);
// - a copy in starts after the compute stream's work so far, which freed the block it
//   writes, and after the copy out that filled its host bytes;
// - before a kernel reads the bytes a copy in wrote, or the memory is freed, the compute
//   stream waits for the copy in;
// - a pinned block is reused once its last copy has completed (Note [A pinned pool]).
// The simulated device checks every one of these: without any of them its race detector
// reports the copy and the kernel that overlapped (host_tier_test).
CudaHostCopies::CudaHostCopies(std::shared_ptr<CudaApi> api, CudaStream compute,
                               std::size_t capacity)
    : api_(std::move(api)), compute_(compute), pool_(api_, capacity) {
  CudaError::check(api_->stream_create(&to_host_), "cudaStreamCreate");
  CudaError::check(api_->stream_create(&to_device_), "cudaStreamCreate");
}

CudaHostCopies::~CudaHostCopies() {
  api_->stream_synchronize(to_host_);
  api_->stream_synchronize(to_device_);
  for (auto& [key, e] : entries_) {
    if (e.copied_out != nullptr) api_->event_destroy(e.copied_out);
    if (e.copied_in != nullptr) api_->event_destroy(e.copied_in);
    if (e.host != nullptr) pool_.deallocate(e.host, nullptr);
  }
  api_->stream_destroy(to_host_);
  api_->stream_destroy(to_device_);
}

CudaEvent CudaHostCopies::record(CudaStream stream) {
  CudaEvent e = nullptr;
  CudaError::check(api_->event_create(&e, /*timing=*/false), "cudaEventCreate");
  CudaError::check(api_->event_record(e, stream), "cudaEventRecord");
  return e;
}

void CudaHostCopies::wait(CudaStream stream, CudaEvent event) {
  CudaError::check(api_->stream_wait_event(stream, event), "cudaStreamWaitEvent");
}

void CudaHostCopies::after_compute(CudaStream stream) {
  CudaEvent e = record(compute_);
  wait(stream, e);
  CudaError::check(api_->event_destroy(e), "cudaEventDestroy");  // the wait is enqueued
}

bool CudaHostCopies::copy_out(std::uint64_t key, const void* src, std::size_t bytes) {
  Entry& e = entries_[key];
  if (e.host != nullptr) throw std::logic_error("remat: a storage is already on the host");
  void* host = pool_.allocate(bytes);
  if (host == nullptr) {
    forget_if_idle(key);
    return false;
  }
  after_compute(to_host_);
  if (e.copied_in != nullptr) wait(to_host_, e.copied_in);  // the bytes it copies out
  CudaError::check(api_->memcpy_async(host, src, bytes, CudaCopy::kDeviceToHost, to_host_),
                   "cudaMemcpyAsync");
  if (e.copied_out != nullptr) api_->event_destroy(e.copied_out);
  e.host = host;
  e.bytes = bytes;
  e.copied_out = record(to_host_);
  e.compute_after_out = false;
  return true;
}

void CudaHostCopies::copy_in(std::uint64_t key, void* dst) {
  auto it = entries_.find(key);
  if (it == entries_.end() || it->second.host == nullptr)
    throw std::logic_error("remat: a storage is not on the host");
  Entry& e = it->second;
  after_compute(to_device_);
  wait(to_device_, e.copied_out);
  CudaError::check(api_->memcpy_async(dst, e.host, e.bytes, CudaCopy::kHostToDevice, to_device_),
                   "cudaMemcpyAsync");
  if (e.copied_in != nullptr) api_->event_destroy(e.copied_in);
  e.copied_in = record(to_device_);
  pool_.deallocate(e.host, record(to_device_));
  e.host = nullptr;
  api_->event_destroy(e.copied_out);  // the device memory it read was freed after it
  e.copied_out = nullptr;
}

void CudaHostCopies::order_compute_after(std::uint64_t key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  Entry& e = it->second;
  if (e.copied_out != nullptr && !e.compute_after_out) {
    wait(compute_, e.copied_out);
    e.compute_after_out = true;
  }
  if (e.copied_in != nullptr) {
    wait(compute_, e.copied_in);
    CudaError::check(api_->event_destroy(e.copied_in), "cudaEventDestroy");
    e.copied_in = nullptr;
  }
  forget_if_idle(key);
}

void CudaHostCopies::drop(std::uint64_t key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  Entry& e = it->second;
  if (e.host != nullptr) {
    if (!e.compute_after_out) wait(compute_, e.copied_out);
    pool_.deallocate(e.host, e.copied_out);  // the pool owns the event from here
    e.host = nullptr;
    e.copied_out = nullptr;
  }
  forget_if_idle(key);
}

bool CudaHostCopies::holds(std::uint64_t key) const {
  auto it = entries_.find(key);
  return it != entries_.end() && it->second.host != nullptr;
}

// An entry stays while it holds host bytes or a copy the compute stream has not yet waited
// for; a copy out the compute stream waits for needs nothing more once its bytes are gone.
void CudaHostCopies::forget_if_idle(std::uint64_t key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  Entry& e = it->second;
  if (e.host != nullptr || e.copied_in != nullptr) return;
  if (e.copied_out != nullptr) api_->event_destroy(e.copied_out);
  entries_.erase(it);
}

}  // namespace remat::detail
