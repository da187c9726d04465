// The cudaMalloc segment source. Compiled against the CUDA runtime where the toolkit is found;
// elsewhere the same functions report that no device exists.
#include "remat/segment_source.h"

#include <stdexcept>
#include <string>

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

namespace {
void check_copy(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("remat: ") + what + ": " + cudaGetErrorString(e));
}
}  // namespace

void cuda_copy_to_device(void* dst, const void* src, std::size_t bytes, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  check_copy(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s), "copy to device");
  // The host buffer may be reused as soon as we return.
  check_copy(cudaStreamSynchronize(s), "copy to device");
}
void cuda_copy_to_host(void* dst, const void* src, std::size_t bytes, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  check_copy(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s), "copy to host");
  check_copy(cudaStreamSynchronize(s), "copy to host");
}
#else
bool cuda_device_available() { return false; }
std::unique_ptr<SegmentSource> make_cuda_segment_source(int /*device*/) { return nullptr; }
void cuda_copy_to_device(void*, const void*, std::size_t, void*) {
  throw std::runtime_error("remat: built without CUDA");
}
void cuda_copy_to_host(void*, const void*, std::size_t, void*) {
  throw std::runtime_error("remat: built without CUDA");
}
#endif

}  // namespace remat
