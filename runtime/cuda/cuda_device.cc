#include "runtime/cuda/cuda_device.h"

#include <absl/strings/str_cat.h>

#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "remat/errors.h"
#include "remat/system_cuda.h"

namespace remat::detail {
namespace {
bool launch_blocking_from_environment() {
  const char* v = std::getenv("REMAT_CUDA_LAUNCH_BLOCKING");
  return v != nullptr && std::strcmp(v, "0") != 0 && v[0] != '\0';
}
}  // namespace

CudaDevice::CudaDevice(std::shared_ptr<CudaApi> api, int index)
    : api_(std::move(api)), index_(index) {}

std::unique_ptr<CudaDevice> CudaDevice::open(std::shared_ptr<CudaApi> api, int index,
                                             CudaStream stream, bool sync_after_launch) {
  if (api == nullptr) api = cuda_runtime_api();
  if (api == nullptr)
    throw std::runtime_error("remat: the CUDA backend needs a build with CUDA (none found)");
  int count = 0;
  const CudaResult counted = api->device_count(&count);
  if (!counted.ok() || count == 0) {
    throw std::runtime_error(absl::StrCat("remat: the CUDA backend needs a CUDA device; ",
                                          cuda_unavailable_reason(api.get())));
  }
  if (index < 0 || index >= count) {
    throw std::invalid_argument(absl::StrCat("remat: CUDA device ", index, " does not exist (",
                                             count, count == 1 ? " device" : " devices",
                                             ", numbered from 0)"));
  }
  std::unique_ptr<CudaDevice> d(new CudaDevice(std::move(api), index));
  Scope scope(d.get());
  d->sync_after_launch_ = sync_after_launch || launch_blocking_from_environment();
  int minor = 0;
  d->check(d->api_->compute_capability(index, &d->major_, &minor), "cudaDeviceGetAttribute");
  if (stream == nullptr) {
    d->check(d->api_->stream_create(&d->stream_), "cudaStreamCreate");
    d->owns_stream_ = true;
  } else {
    d->stream_ = stream;
  }
  d->check(d->api_->mem_get_info(&d->free_bytes_at_open_, &d->total_bytes_), "cudaMemGetInfo");
  d->staging_ = std::make_unique<PinnedStaging>(*d->api_, d->stream_);
  return d;
}

// Nothing here may throw; errors are dropped (a sticky one has been raised already).
CudaDevice::~CudaDevice() {
  Scope scope(this);
  staging_.reset();
  if (timing_start_ != nullptr) api_->event_destroy(timing_start_);
  if (timing_end_ != nullptr) api_->event_destroy(timing_end_);
  if (owns_stream_) {
    api_->stream_synchronize(stream_);
    api_->stream_destroy(stream_);
  }
}

// Note [Restoring the caller's context]
// A scope makes the runtime's device current and gives the caller back what it had. What it
// had is a context, not a device: a thread that never used CUDA has none, yet cudaGetDevice
// answers 0 there, and restoring "device 0" with cudaSetDevice would create device 0's
// primary context (hundreds of megabytes) on a device the program may never use. So the
// scope saves the current context (cuCtxGetCurrent), and restores exactly it, none included
// (cuCtxSetCurrent). A CudaApi that knows no contexts falls back to the device.
//
// A scope never throws (tensor handles release memory under one in their destructors): where
// the device cannot be read or set, the calls that follow fail and raise the error.
CudaDevice::Scope::Scope(const CudaDevice* device) noexcept : device_(device) {
  if (device_ == nullptr) return;
  CudaApi& api = *device_->api_;
  int current = -1;
  CudaContext context = nullptr;
  if (api.get_context(&context).ok()) {
    if (context != nullptr && api.get_device(&current).ok() && current == device_->index_) return;
    if (!api.set_device(device_->index_).ok()) return;
    restore_context_ = true;
    previous_context_ = context;
    return;
  }
  if (!api.get_device(&current).ok() || current == device_->index_) return;
  if (api.set_device(device_->index_).ok()) previous_ = current;
}

CudaDevice::Scope::~Scope() noexcept {
  if (device_ == nullptr) return;
  if (restore_context_)
    device_->api_->set_context(previous_context_);
  else if (previous_ >= 0)
    device_->api_->set_device(previous_);
}

void CudaDevice::check(const CudaResult& r, const char* call, const std::string& op) const {
  CudaError::check(r, call, index_, op);
}

void CudaDevice::check_launch(const std::string& op) const {
  check(api_->last_launch_error(), "kernel launch", op);
  if (sync_after_launch_) check(api_->stream_synchronize(stream_), "cudaStreamSynchronize", op);
}

void CudaDevice::start_timing() {
  if (timing_start_ == nullptr) {
    check(api_->event_create(&timing_start_, /*timing=*/true), "cudaEventCreate");
    check(api_->event_create(&timing_end_, /*timing=*/true), "cudaEventCreate");
  }
  check(api_->event_record(timing_start_, stream_), "cudaEventRecord");
}

double CudaDevice::stop_timing_ns() {
  check(api_->event_record(timing_end_, stream_), "cudaEventRecord");
  check(api_->event_synchronize(timing_end_), "cudaEventSynchronize");
  float ms = 0;
  check(api_->event_elapsed_ms(&ms, timing_start_, timing_end_), "cudaEventElapsedTime");
  return static_cast<double>(ms) * 1e6;
}

void CudaDevice::copy(void* dst, const void* src, std::size_t bytes) const {
  check(api_->memcpy_async(dst, src, bytes, CudaCopy::kDeviceToDevice, stream_), "cudaMemcpyAsync");
}

void CudaDevice::synchronize() const {
  check(api_->stream_synchronize(stream_), "cudaStreamSynchronize");
}

}  // namespace remat::detail
