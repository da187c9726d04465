// Every CUDA call the allocator and the runtime make goes through this interface: the CUDA
// runtime in a GPU build (`cuda_runtime_api()`, remat/system_cuda.h), a simulated device in
// the tests (runtime/cuda/simulated_cuda.h), or a framework's own wrapper.
//
//   std::shared_ptr<remat::CudaApi> api = remat::cuda_runtime_api();  // null: no CUDA build
//   if (remat::cuda_device_available(api.get())) {
//     remat::CudaStream my_stream = nullptr;
//     api->stream_create(&my_stream);
//     remat::Runtime rt({.backend = remat::Backend::kCuda, .budget = std::size_t{8} << 30,
//                        .cuda = {.device = 1, .stream = my_stream, .api = api}});
//   }
//
// Streams and events are the CUDA runtime's own handle types (a `cudaStream_t` converts to
// `CudaStream` without a cast), declared here so that this header needs no CUDA headers.
// Kernels themselves are launched by the ops (kernels/cuda), not through this interface; the
// runtime asks `last_launch_error` after each one.
#ifndef REMAT_CUDA_API_H_
#define REMAT_CUDA_API_H_

#include <cstddef>
#include <cstdint>
#include <memory>

struct CUstream_st;
struct CUevent_st;
struct CUctx_st;

namespace remat {

using CudaStream = CUstream_st*;  // a cudaStream_t; null is the legacy default stream
using CudaEvent = CUevent_st*;    // a cudaEvent_t
using CudaContext = CUctx_st*;    // a CUcontext; null: no context

// How remat acts on a call's result: out-of-memory is a refusal the allocator handles by
// evicting; not-ready is an answer (an event still pending); anything else is an error that
// is raised as CudaError and never turns into eviction.
enum class CudaStatus : std::uint8_t { kOk, kOutOfMemory, kNotReady, kError };

struct CudaResult {
  CudaStatus status = CudaStatus::kOk;
  int code = 0;              // the cudaError_t (or CUresult) value
  const char* message = "";  // the CUDA error string; static storage
  bool ok() const { return status == CudaStatus::kOk; }
};

enum class CudaCopy : std::uint8_t { kHostToDevice, kDeviceToHost, kDeviceToDevice };

class CudaApi {
 public:
  virtual ~CudaApi() = default;
  virtual const char* name() const = 0;

  // The CUDA version the driver supports and the one the runtime library was built for, as
  // 1000 * major + 10 * minor (cudaDriverGetVersion, CUDART_VERSION): a driver older than the
  // runtime makes every call fail. Unknown by default.
  virtual CudaResult versions(int* driver, int* runtime) {
    *driver = *runtime = 0;
    return {CudaStatus::kError, 0, "the CUDA versions are unknown to this CudaApi"};
  }

  // Devices.
  virtual CudaResult device_count(int* count) = 0;
  virtual CudaResult get_device(int* device) = 0;
  virtual CudaResult set_device(int device) = 0;
  // The calling thread's current context (null where it has none), and making a context
  // current (null: none), as cuCtxGetCurrent and cuCtxSetCurrent. Unlike set_device, neither
  // creates a context. Unsupported by default: callers then restore the device instead.
  virtual CudaResult get_context(CudaContext* context) {
    *context = nullptr;
    return {CudaStatus::kError, 801, "contexts are unsupported by this CudaApi"};
  }
  virtual CudaResult set_context(CudaContext /*context*/) {
    return {CudaStatus::kError, 801, "contexts are unsupported by this CudaApi"};
  }
  virtual CudaResult mem_get_info(std::size_t* free_bytes, std::size_t* total_bytes) = 0;
  virtual CudaResult compute_capability(int device, int* major, int* minor) = 0;

  // Device memory (cudaMalloc, cudaFree) and page-locked host memory (cudaMallocHost).
  virtual CudaResult malloc(void** p, std::size_t bytes) = 0;
  virtual CudaResult free(void* p) = 0;
  virtual CudaResult malloc_host(void** p, std::size_t bytes) = 0;
  virtual CudaResult free_host(void* p) = 0;
  // cudaMemcpyAsync: ordered on `stream`; returns before the copy is done.
  virtual CudaResult memcpy_async(void* dst, const void* src, std::size_t bytes, CudaCopy kind,
                                  CudaStream stream) = 0;

  // Streams and events.
  virtual CudaResult stream_create(CudaStream* stream) = 0;  // blocking w.r.t. stream 0
  virtual CudaResult stream_destroy(CudaStream stream) = 0;
  virtual CudaResult stream_synchronize(CudaStream stream) = 0;
  virtual CudaResult stream_wait_event(CudaStream stream, CudaEvent event) = 0;
  // `timing`: the event can be used with event_elapsed_ms (slower to record otherwise).
  virtual CudaResult event_create(CudaEvent* event, bool timing) = 0;
  virtual CudaResult event_destroy(CudaEvent event) = 0;
  virtual CudaResult event_record(CudaEvent event, CudaStream stream) = 0;
  // kOk once the work before the event has completed, kNotReady while it is pending. A
  // failed call, not-ready included, tells its caller and leaves nothing for
  // last_launch_error to blame on the next kernel.
  virtual CudaResult event_query(CudaEvent event) = 0;
  virtual CudaResult event_synchronize(CudaEvent event) = 0;
  virtual CudaResult event_elapsed_ms(float* ms, CudaEvent start, CudaEvent end) = 0;

  // The error of the last kernel launch on this thread, cleared (cudaGetLastError). A sticky
  // error (a kernel that faulted) is reported by every later call too.
  virtual CudaResult last_launch_error() = 0;

  // Virtual memory management (cuMemAddressReserve, cuMemCreate, cuMemMap): what expandable
  // segments are built on. `granularity` is the size mapped ranges are multiples of.
  virtual CudaResult vmm_granularity(int device, std::size_t* granularity) = 0;
  virtual CudaResult address_reserve(void** p, std::size_t bytes) = 0;
  virtual CudaResult address_free(void* p, std::size_t bytes) = 0;
  // Backs [p, p + bytes) of a reserved range with new physical memory of `device`, readable
  // and writable by it; `unmap` releases it. Both take granularity-aligned ranges.
  virtual CudaResult map(void* p, std::size_t bytes, int device) = 0;
  virtual CudaResult unmap(void* p, std::size_t bytes) = 0;
};

}  // namespace remat

#endif  // REMAT_CUDA_API_H_
