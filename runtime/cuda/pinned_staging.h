// Copies between pageable host memory and device memory through page-locked (pinned) staging
// buffers, so that uploads are asynchronous and reads take one synchronization.
//
//   remat::detail::PinnedStaging staging(api, stream);
//   staging.upload(device_ptr, host_data, bytes);    // returns once host_data may be reused
//   staging.download(host_out, device_ptr, bytes);   // returns with the bytes in host_out
//
// See Note [Pinned staging] in pinned_staging.cc.
#ifndef REMAT_RUNTIME_CUDA_PINNED_STAGING_H_
#define REMAT_RUNTIME_CUDA_PINNED_STAGING_H_

#include <array>
#include <cstddef>

#include "remat/cuda_api.h"

namespace remat::detail {

class PinnedStaging {
 public:
  static constexpr std::size_t kDefaultChunk = std::size_t{4} << 20;
  PinnedStaging(CudaApi& api, CudaStream stream, std::size_t chunk = kDefaultChunk);
  ~PinnedStaging();
  PinnedStaging(const PinnedStaging&) = delete;
  PinnedStaging& operator=(const PinnedStaging&) = delete;

  // Enqueues a copy of `bytes` from host `src` to device `dst` on the stream. `src` may be
  // reused on return; the copy completes in stream order.
  void upload(void* dst, const void* src, std::size_t bytes);
  // Copies `bytes` from device `src` to host `dst` once the stream's earlier work is done.
  void download(void* dst, const void* src, std::size_t bytes);

 private:
  struct Buffer {
    void* host = nullptr;      // pinned, `chunk_` bytes; allocated on first use
    CudaEvent done = nullptr;  // recorded after the last copy that reads it
    bool in_flight = false;
  };
  Buffer& next_buffer();  // the next buffer in turn, once its last copy has completed

  CudaApi& api_;
  CudaStream stream_;
  std::size_t chunk_;
  std::array<Buffer, 2> buffers_;
  std::size_t turn_ = 0;
};

}  // namespace remat::detail

#endif  // REMAT_RUNTIME_CUDA_PINNED_STAGING_H_
