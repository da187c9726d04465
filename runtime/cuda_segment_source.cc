// The cudaMalloc segment source. Compiled against the CUDA runtime where the toolkit is found;
// elsewhere the same functions report that no device exists.
#include "remat/segment_source.h"

#ifdef REMAT_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace remat {

#ifdef REMAT_HAVE_CUDA
namespace {

class CudaSegmentSource final : public SegmentSource {
 public:
  explicit CudaSegmentSource(int device) : device_(device) {}
  void* reserve(std::size_t bytes) override {
    if (cudaSetDevice(device_) != cudaSuccess) return nullptr;
    void* p = nullptr;
    if (cudaMalloc(&p, bytes == 0 ? 1 : bytes) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky-free error so later calls are not blamed
      return nullptr;
    }
    return p;
  }
  void release(void* p, std::size_t /*bytes*/) override { cudaFree(p); }
  const char* name() const override { return "cuda"; }
  bool host_accessible() const override { return false; }

 private:
  int device_;
};

}  // namespace

bool cuda_device_available() {
  int n = 0;
  // Any error (no driver, a driver too old, no device) means no usable GPU.
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return n > 0;
}

std::unique_ptr<SegmentSource> make_cuda_segment_source(int device) {
  if (!cuda_device_available()) return nullptr;
  return std::make_unique<CudaSegmentSource>(device);
}
#else
bool cuda_device_available() { return false; }
std::unique_ptr<SegmentSource> make_cuda_segment_source(int /*device*/) { return nullptr; }
#endif

}  // namespace remat
