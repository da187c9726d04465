// Note [cudart opened, not linked] in cudart_library.h.
#include "runtime/cuda/cudart_library.h"

#include <dlfcn.h>

#include <string>
#include <vector>

namespace remat::detail {
namespace {

void* open_library(const std::vector<std::string>& names, std::string* error) {
  for (const std::string& name : names) {
    if (void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) return handle;
    const char* why = dlerror();
    *error += (error->empty() ? "" : "; ") + name + ": " + (why != nullptr ? why : "not found");
  }
  return nullptr;
}

template <typename Fn>
bool find(void* handle, const char* symbol, Fn* fn, std::string* error) {
  *fn = reinterpret_cast<Fn>(dlsym(handle, symbol));
  if (*fn == nullptr) *error += std::string(error->empty() ? "" : "; ") + "no " + symbol;
  return *fn != nullptr;
}

}  // namespace

CudartLibrary open_cudart(const std::vector<std::string>& names) {
  CudartLibrary c;
  void* h = open_library(names, &c.error);
  if (h == nullptr) return c;
  std::string* e = &c.error;
  bool ok = find(h, "cudaGetErrorString", &c.get_error_string, e);
  ok &= find(h, "cudaGetLastError", &c.get_last_error, e);
  ok &= find(h, "cudaGetDeviceCount", &c.get_device_count, e);
  ok &= find(h, "cudaDriverGetVersion", &c.driver_get_version, e);
  ok &= find(h, "cudaGetDevice", &c.get_device, e);
  ok &= find(h, "cudaSetDevice", &c.set_device, e);
  ok &= find(h, "cudaMemGetInfo", &c.mem_get_info, e);
  ok &= find(h, "cudaDeviceGetAttribute", &c.device_get_attribute, e);
  ok &= find(h, "cudaMalloc", &c.malloc, e);
  ok &= find(h, "cudaFree", &c.free, e);
  ok &= find(h, "cudaMallocHost", &c.malloc_host, e);
  ok &= find(h, "cudaFreeHost", &c.free_host, e);
  ok &= find(h, "cudaMemcpyAsync", &c.memcpy_async, e);
  ok &= find(h, "cudaStreamCreate", &c.stream_create, e);
  ok &= find(h, "cudaStreamDestroy", &c.stream_destroy, e);
  ok &= find(h, "cudaStreamSynchronize", &c.stream_synchronize, e);
  ok &= find(h, "cudaStreamWaitEvent", &c.stream_wait_event, e);
  ok &= find(h, "cudaEventCreate", &c.event_create, e);
  ok &= find(h, "cudaEventCreateWithFlags", &c.event_create_with_flags, e);
  ok &= find(h, "cudaEventDestroy", &c.event_destroy, e);
  ok &= find(h, "cudaEventRecord", &c.event_record, e);
  ok &= find(h, "cudaEventQuery", &c.event_query, e);
  ok &= find(h, "cudaEventSynchronize", &c.event_synchronize, e);
  ok &= find(h, "cudaEventElapsedTime", &c.event_elapsed_time, e);
  ok &= find(h, "cudaGetDriverEntryPointByVersion", &c.get_driver_entry_point_by_version, e);
  c.loaded = ok;
  // The handle stays open for the life of the process: the functions above point into it.
  return c;
}

// REMAT_CUDART_PATH is the toolkit's file the build found.
std::vector<std::string> cudart_names() {
  std::vector<std::string> names = {"libcudart.so." + std::to_string(CUDART_VERSION / 1000)};
#ifdef REMAT_CUDART_PATH
  names.emplace_back(REMAT_CUDART_PATH);
#endif
  return names;
}

const CudartLibrary& cudart() {
  static const CudartLibrary library = open_cudart(cudart_names());
  return library;
}

}  // namespace remat::detail
