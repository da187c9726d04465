// The runtime's hold on its CUDA device: the API it calls, the device index (made current
// around the runtime's calls, the caller's restored after), the stream it orders work on,
// checks after each kernel, event timing and pinned staging for copies.
//
//   auto device = remat::detail::CudaDevice::open(api, /*index=*/0, /*stream=*/nullptr,
//                                                 /*sync_after_launch=*/false);
//   remat::detail::CudaDevice::Scope scope(device.get());  // device 0 current until the end
//   kernel<<<g, b, 0, device->stream()>>>(...);
//   device->check_launch("my_op");                         // CudaError naming my_op
#ifndef REMAT_RUNTIME_CUDA_CUDA_DEVICE_H_
#define REMAT_RUNTIME_CUDA_CUDA_DEVICE_H_

#include <cstddef>
#include <memory>
#include <string>

#include "remat/cuda_api.h"
#include "runtime/cuda/pinned_staging.h"

namespace remat::detail {

class CudaDevice {
 public:
  // Checks that device `index` exists (std::invalid_argument naming it and the device count
  // where it does not; std::runtime_error where the API reports no device at all), creates a
  // stream where `stream` is null, and measures the device's memory. `api` null: the CUDA
  // runtime. REMAT_CUDA_LAUNCH_BLOCKING=1 in the environment turns on `sync_after_launch`.
  static std::unique_ptr<CudaDevice> open(std::shared_ptr<CudaApi> api, int index,
                                          CudaStream stream, bool sync_after_launch);
  ~CudaDevice();
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  // Makes the device current for its lifetime and restores the caller's after. Nests: an
  // inner scope finds the device current and does nothing.
  class Scope {
   public:
    explicit Scope(const CudaDevice* device) noexcept;
    ~Scope() noexcept;
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    const CudaDevice* device_;
    int previous_ = -1;             // the device to restore, where contexts are unknown
    bool restore_context_ = false;  // else the context, which may be none
    CudaContext previous_context_ = nullptr;
  };

  CudaApi& api() const { return *api_; }
  const std::shared_ptr<CudaApi>& shared_api() const { return api_; }
  int index() const { return index_; }
  CudaStream stream() const { return stream_; }
  bool sync_after_launch() const { return sync_after_launch_; }
  std::size_t total_bytes() const { return total_bytes_; }
  std::size_t free_bytes_at_open() const { return free_bytes_at_open_; }
  int major() const { return major_; }

  // Raises a failed call as CudaError on this device.
  void check(const CudaResult& r, const char* call, const std::string& op = "") const;
  // After a kernel of `op`: its launch error, and with sync_after_launch the error of its
  // run, raised as CudaError naming the op.
  void check_launch(const std::string& op) const;
  // Event timing of the kernels between the two calls, in nanoseconds (waits for them).
  void start_timing();
  double stop_timing_ns();
  void upload(void* dst, const void* src, std::size_t bytes) { staging_->upload(dst, src, bytes); }
  void download(void* dst, const void* src, std::size_t bytes) {
    staging_->download(dst, src, bytes);
  }
  // A device-to-device copy on the runtime's stream (ordered after the kernels before it).
  void copy(void* dst, const void* src, std::size_t bytes) const;
  void synchronize() const;

 private:
  CudaDevice(std::shared_ptr<CudaApi> api, int index);

  std::shared_ptr<CudaApi> api_;
  int index_;
  CudaStream stream_ = nullptr;
  bool owns_stream_ = false;
  bool sync_after_launch_ = false;
  std::size_t total_bytes_ = 0;
  std::size_t free_bytes_at_open_ = 0;
  int major_ = 0;
  CudaEvent timing_start_ = nullptr;
  CudaEvent timing_end_ = nullptr;
  std::unique_ptr<PinnedStaging> staging_;
};

}  // namespace remat::detail

#endif  // REMAT_RUNTIME_CUDA_CUDA_DEVICE_H_
