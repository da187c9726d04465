// The CUDA runtime library (libcudart), opened at run time rather than linked.
//
// Note [cudart opened, not linked]
// The core of remat (remat::remat) is what a CPU-only program links, and it must load and run
// on a machine with no CUDA installed at all: no libcudart there, no driver. A linked libcudart
// would be a load-time dependency of every such program (and of the package, through its
// exported link interface). So the CUDA runtime's CudaApi finds the library on first use: the
// soname of the toolkit it was compiled against (libcudart.so.<major>), then the toolkit's own
// copy by the path CMake found at build time. A process that already has the library loaded
// (a program that also links remat's CUDA kernels, or a framework) gets that same instance,
// and so the same device state. Where neither opens, every call answers an error naming the
// library and the loader's reason, which `cuda_device_available` reads as "no device".
#ifndef REMAT_RUNTIME_CUDA_CUDART_LIBRARY_H_
#define REMAT_RUNTIME_CUDA_CUDART_LIBRARY_H_

#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <vector>

#include "remat/cuda_api.h"

namespace remat::detail {

// The cudart functions the runtime's CudaApi calls; null where the library did not open.
struct CudartLibrary {
  decltype(&::cudaGetErrorString) get_error_string = nullptr;
  decltype(&::cudaGetLastError) get_last_error = nullptr;
  decltype(&::cudaGetDeviceCount) get_device_count = nullptr;
  decltype(&::cudaDriverGetVersion) driver_get_version = nullptr;
  decltype(&::cudaGetDevice) get_device = nullptr;
  decltype(&::cudaSetDevice) set_device = nullptr;
  decltype(&::cudaMemGetInfo) mem_get_info = nullptr;
  decltype(&::cudaDeviceGetAttribute) device_get_attribute = nullptr;
  decltype(&::cudaMalloc) malloc = nullptr;
  decltype(&::cudaFree) free = nullptr;
  decltype(&::cudaMallocHost) malloc_host = nullptr;
  decltype(&::cudaFreeHost) free_host = nullptr;
  decltype(&::cudaMemcpyAsync) memcpy_async = nullptr;
  decltype(&::cudaStreamCreate) stream_create = nullptr;
  decltype(&::cudaStreamDestroy) stream_destroy = nullptr;
  decltype(&::cudaStreamSynchronize) stream_synchronize = nullptr;
  decltype(&::cudaStreamWaitEvent) stream_wait_event = nullptr;
  decltype(&::cudaEventCreate) event_create = nullptr;
  decltype(&::cudaEventCreateWithFlags) event_create_with_flags = nullptr;
  decltype(&::cudaEventDestroy) event_destroy = nullptr;
  decltype(&::cudaEventRecord) event_record = nullptr;
  decltype(&::cudaEventQuery) event_query = nullptr;
  decltype(&::cudaEventSynchronize) event_synchronize = nullptr;
  decltype(&::cudaEventElapsedTime) event_elapsed_time = nullptr;
  decltype(&::cudaGetDriverEntryPointByVersion) get_driver_entry_point_by_version = nullptr;

  bool loaded = false;  // the library opened and every function above was found
  std::string error;    // why not: the names tried and the loader's messages
};

// The process's one instance, opened on first call (thread-safe), from `cudart_names()`.
const CudartLibrary& cudart();

// The names `cudart()` tries, in order: the soname of the toolkit this was compiled against,
// then that toolkit's own file.
std::vector<std::string> cudart_names();

// Opens the first of `names` that the loader finds and looks up every function; the handle
// stays open for the life of the process.
CudartLibrary open_cudart(const std::vector<std::string>& names);

// The CUDA runtime's CudaApi over `library`, which must outlive it: cuda_runtime_api() is this
// over cudart(); tests give it a library of stand-ins (cudart_library_test.cc).
std::shared_ptr<CudaApi> cuda_api_over(const CudartLibrary& library);

}  // namespace remat::detail

#endif  // REMAT_RUNTIME_CUDA_CUDART_LIBRARY_H_
