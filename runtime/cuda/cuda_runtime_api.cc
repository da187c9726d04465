// The CudaApi of a GPU build: each call is the CUDA runtime's (cudart, opened at run time:
// Note [cudart opened, not linked] in cudart_library.h), but for the virtual memory calls,
// which only the driver API has (Note [Driver entry points]). A build without CUDA has no such
// API: `cuda_runtime_api()` returns null there.
#include "remat/cuda_api.h"
#include "remat/system_cuda.h"

#include <absl/strings/str_cat.h>

#include <string>

#ifdef REMAT_HAVE_CUDA
#include <cuda.h>          // the driver API's types only: its functions are found at run time
#include <cudaTypedefs.h>  // the PFN_ signatures of those functions
#include <cuda_runtime_api.h>

#include <absl/container/flat_hash_map.h>

#include <cstdint>
#include <mutex>

#include "runtime/cuda/cudart_library.h"
#endif

namespace remat {

#ifdef REMAT_HAVE_CUDA
namespace {

CudaStatus status_of(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return CudaStatus::kOk;
    case cudaErrorMemoryAllocation:
      return CudaStatus::kOutOfMemory;
    case cudaErrorNotReady:
      return CudaStatus::kNotReady;
    default:
      return CudaStatus::kError;
  }
}

using detail::cudart;
using detail::CudartLibrary;

CudaResult result_of(const CudartLibrary& lib, cudaError_t e) {
  return {status_of(e), static_cast<int>(e), lib.get_error_string(e)};
}

// Every call where libcudart did not open: an error that names it and why.
CudaResult cudart_missing(const CudartLibrary& lib) {
  return {CudaStatus::kError, static_cast<int>(cudaErrorSharedObjectInitFailed), lib.error.c_str()};
}

// A failed call also leaves its error as the thread's last error, where the next kernel's
// launch check (cudaGetLastError) would blame that kernel for it. The caller is told of the
// error here, so it is cleared; a sticky error cannot be cleared and is still reported by
// every later call. Not-ready is an answer, not an error, but the runtime records it as the
// last error all the same, so it is cleared too (as PyTorch does after cudaEventQuery).
CudaResult call_result(const CudartLibrary& lib, cudaError_t e) {
  if (e != cudaSuccess) lib.get_last_error();
  return result_of(lib, e);
}

// `fn(args...)` of the opened library, or the error saying that it did not open.
template <typename Fn, typename... Args>
CudaResult call(const CudartLibrary& lib, Fn cudart_function, Args... args) {
  if (!lib.loaded) return cudart_missing(lib);
  return call_result(lib, cudart_function(args...));
}

cudaMemcpyKind memcpy_kind(CudaCopy kind) {
  switch (kind) {
    case CudaCopy::kHostToDevice:
      return cudaMemcpyHostToDevice;
    case CudaCopy::kDeviceToHost:
      return cudaMemcpyDeviceToHost;
    case CudaCopy::kDeviceToDevice:
      return cudaMemcpyDeviceToDevice;
  }
  return cudaMemcpyDefault;
}

// Note [Driver entry points]
// cuMemAddressReserve, cuMemCreate, cuMemMap and the rest exist only in the driver API. Linking
// libcuda would make the library fail to load on machines without a driver (where it must
// still run on the host), so the functions are asked of the runtime instead, once, on first
// use, by the ABI version their PFN_ types describe. Where the driver lacks any of them, every
// virtual-memory call answers "unsupported" and the segment sources fall back to cudaMalloc.
// The calls assume a context is current: the runtime sets the device (which, since CUDA 12,
// makes its primary context current) around everything it asks of a CudaApi.
constexpr unsigned int kDriverAbiVersion = 12000;

struct DriverApi {
  PFN_cuGetErrorString_v6000 get_error_string = nullptr;
  PFN_cuDeviceGet_v2000 device_get = nullptr;
  PFN_cuDeviceGetAttribute_v2000 device_get_attribute = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 granularity = nullptr;
  PFN_cuMemAddressReserve_v10020 address_reserve = nullptr;
  PFN_cuMemAddressFree_v10020 address_free = nullptr;
  PFN_cuMemCreate_v10020 create = nullptr;
  PFN_cuMemRelease_v10020 release = nullptr;
  PFN_cuMemMap_v10020 map = nullptr;
  PFN_cuMemSetAccess_v10020 set_access = nullptr;
  PFN_cuMemUnmap_v10020 unmap = nullptr;
  bool complete = false;  // every function above was found
  // Not needed for virtual memory: where missing, scopes restore the device instead (Note
  // [Restoring the caller's context] in cuda_device.cc).
  PFN_cuCtxGetCurrent_v4000 ctx_get_current = nullptr;
  PFN_cuCtxSetCurrent_v4000 ctx_set_current = nullptr;
};

template <typename Fn>
bool find_entry_point(const char* symbol, Fn* fn) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (!cudart().loaded ||
      cudart().get_driver_entry_point_by_version(symbol, &p, kDriverAbiVersion, cudaEnableDefault,
                                                 &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess || p == nullptr) {
    return false;
  }
  *fn = reinterpret_cast<Fn>(p);
  return true;
}

DriverApi find_driver_api() {
  DriverApi d;
  // Each lookup runs (no short-circuit) so that the error strings are there even where
  // virtual memory management is not.
  bool found = find_entry_point("cuGetErrorString", &d.get_error_string);
  found &= find_entry_point("cuDeviceGet", &d.device_get);
  found &= find_entry_point("cuDeviceGetAttribute", &d.device_get_attribute);
  found &= find_entry_point("cuMemGetAllocationGranularity", &d.granularity);
  found &= find_entry_point("cuMemAddressReserve", &d.address_reserve);
  found &= find_entry_point("cuMemAddressFree", &d.address_free);
  found &= find_entry_point("cuMemCreate", &d.create);
  found &= find_entry_point("cuMemRelease", &d.release);
  found &= find_entry_point("cuMemMap", &d.map);
  found &= find_entry_point("cuMemSetAccess", &d.set_access);
  found &= find_entry_point("cuMemUnmap", &d.unmap);
  d.complete = found;
  find_entry_point("cuCtxGetCurrent", &d.ctx_get_current);
  find_entry_point("cuCtxSetCurrent", &d.ctx_set_current);
  return d;
}

const DriverApi& driver() {
  static const DriverApi api = find_driver_api();
  return api;
}

CudaResult driver_result(CUresult r) {
  CudaStatus status = CudaStatus::kError;
  if (r == CUDA_SUCCESS) status = CudaStatus::kOk;
  if (r == CUDA_ERROR_OUT_OF_MEMORY) status = CudaStatus::kOutOfMemory;
  if (r == CUDA_ERROR_NOT_READY) status = CudaStatus::kNotReady;
  const char* message = "CUDA driver error";
  const char* s = nullptr;
  if (driver().get_error_string != nullptr && driver().get_error_string(r, &s) == CUDA_SUCCESS &&
      s != nullptr) {
    message = s;
  }
  return {status, static_cast<int>(r), message};
}

CudaResult vmm_unsupported(const char* message) {
  return {CudaStatus::kError, static_cast<int>(CUDA_ERROR_NOT_SUPPORTED), message};
}

constexpr const char* kNoDriverVmm =
    "CUDA virtual memory management is unsupported: the driver lacks its entry points";

CUdeviceptr device_ptr(void* p) { return reinterpret_cast<CUdeviceptr>(p); }

CUmemAllocationProp device_memory(int device) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

class CudaRuntimeApi final : public CudaApi {
 public:
  explicit CudaRuntimeApi(const CudartLibrary& lib) : lib_(lib) {}
  const char* name() const override { return "cuda-runtime"; }

  CudaResult versions(int* driver, int* runtime) override {
    *runtime = CUDART_VERSION;
    *driver = 0;
    return call(lib_, lib_.driver_get_version, driver);
  }
  CudaResult device_count(int* count) override { return call(lib_, lib_.get_device_count, count); }
  CudaResult get_device(int* device) override { return call(lib_, lib_.get_device, device); }
  CudaResult set_device(int device) override { return call(lib_, lib_.set_device, device); }
  CudaResult get_context(CudaContext* context) override;
  CudaResult set_context(CudaContext context) override;
  CudaResult mem_get_info(std::size_t* free_bytes, std::size_t* total_bytes) override {
    return call(lib_, lib_.mem_get_info, free_bytes, total_bytes);
  }
  CudaResult compute_capability(int device, int* major, int* minor) override {
    CudaResult r =
        call(lib_, lib_.device_get_attribute, major, cudaDevAttrComputeCapabilityMajor, device);
    if (!r.ok()) return r;
    return call(lib_, lib_.device_get_attribute, minor, cudaDevAttrComputeCapabilityMinor, device);
  }

  CudaResult malloc(void** p, std::size_t bytes) override {
    return call(lib_, lib_.malloc, p, bytes);
  }
  CudaResult free(void* p) override { return call(lib_, lib_.free, p); }
  CudaResult malloc_host(void** p, std::size_t bytes) override {
    return call(lib_, lib_.malloc_host, p, bytes);
  }
  CudaResult free_host(void* p) override { return call(lib_, lib_.free_host, p); }
  CudaResult memcpy_async(void* dst, const void* src, std::size_t bytes, CudaCopy kind,
                          CudaStream stream) override {
    return call(lib_, lib_.memcpy_async, dst, src, bytes, memcpy_kind(kind), stream);
  }

  CudaResult stream_create(CudaStream* stream) override {
    return call(lib_, lib_.stream_create, stream);  // blocking: ordered with the legacy stream
  }
  CudaResult stream_destroy(CudaStream stream) override {
    return call(lib_, lib_.stream_destroy, stream);
  }
  CudaResult stream_synchronize(CudaStream stream) override {
    return call(lib_, lib_.stream_synchronize, stream);
  }
  CudaResult stream_wait_event(CudaStream stream, CudaEvent event) override {
    return call(lib_, lib_.stream_wait_event, stream, event, 0u);
  }
  CudaResult event_create(CudaEvent* event, bool timing) override {
    if (timing) return call(lib_, lib_.event_create, event);
    return call(lib_, lib_.event_create_with_flags, event, cudaEventDisableTiming);
  }
  CudaResult event_destroy(CudaEvent event) override {
    return call(lib_, lib_.event_destroy, event);
  }
  CudaResult event_record(CudaEvent event, CudaStream stream) override {
    return call(lib_, lib_.event_record, event, stream);
  }
  CudaResult event_query(CudaEvent event) override { return call(lib_, lib_.event_query, event); }
  CudaResult event_synchronize(CudaEvent event) override {
    return call(lib_, lib_.event_synchronize, event);
  }
  CudaResult event_elapsed_ms(float* ms, CudaEvent start, CudaEvent end) override {
    return call(lib_, lib_.event_elapsed_time, ms, start, end);
  }

  CudaResult last_launch_error() override {
    if (!lib_.loaded) return cudart_missing(lib_);
    return result_of(lib_, lib_.get_last_error());
  }

  CudaResult vmm_granularity(int device, std::size_t* granularity) override;
  CudaResult address_reserve(void** p, std::size_t bytes) override;
  CudaResult address_free(void* p, std::size_t bytes) override;
  CudaResult map(void* p, std::size_t bytes, int device) override;
  CudaResult unmap(void* p, std::size_t bytes) override;

 private:
  const CudartLibrary& lib_;
  // The physical allocation behind each range `map` mapped, by the range's start, for `unmap`
  // to release. Shared by every thread and device that uses this process-wide instance.
  struct Mapping {
    CUmemGenericAllocationHandle handle;
    std::size_t bytes;
  };
  std::mutex mutex_;
  absl::flat_hash_map<void*, Mapping> mappings_;
};

CudaResult CudaRuntimeApi::get_context(CudaContext* context) {
  *context = nullptr;
  if (driver().ctx_get_current == nullptr)
    return vmm_unsupported("the driver lacks cuCtxGetCurrent");
  CUcontext current = nullptr;
  const CudaResult r = driver_result(driver().ctx_get_current(&current));
  if (r.ok()) *context = current;
  return r;
}

CudaResult CudaRuntimeApi::set_context(CudaContext context) {
  if (driver().ctx_set_current == nullptr)
    return vmm_unsupported("the driver lacks cuCtxSetCurrent");
  return driver_result(driver().ctx_set_current(context));
}

CudaResult CudaRuntimeApi::vmm_granularity(int device, std::size_t* granularity) {
  const DriverApi& d = driver();
  if (!d.complete) return vmm_unsupported(kNoDriverVmm);
  CUdevice dev = 0;
  if (CUresult r = d.device_get(&dev, device); r != CUDA_SUCCESS) return driver_result(r);
  int supported = 0;
  if (CUresult r = d.device_get_attribute(
          &supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev);
      r != CUDA_SUCCESS) {
    return driver_result(r);
  }
  if (supported == 0) {
    return vmm_unsupported("CUDA virtual memory management is unsupported on this device");
  }
  const CUmemAllocationProp prop = device_memory(device);
  return driver_result(d.granularity(granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
}

CudaResult CudaRuntimeApi::address_reserve(void** p, std::size_t bytes) {
  const DriverApi& d = driver();
  if (!d.complete) return vmm_unsupported(kNoDriverVmm);
  CUdeviceptr address = 0;
  const CUresult r = d.address_reserve(&address, bytes, /*alignment=*/0, /*addr=*/0, 0);
  if (r == CUDA_SUCCESS) *p = reinterpret_cast<void*>(address);
  return driver_result(r);
}

CudaResult CudaRuntimeApi::address_free(void* p, std::size_t bytes) {
  const DriverApi& d = driver();
  if (!d.complete) return vmm_unsupported(kNoDriverVmm);
  return driver_result(d.address_free(device_ptr(p), bytes));
}

// One physical allocation per call, so that `unmap` can give back exactly what one `map` took
// (the driver unmaps only whole mapped ranges): callers unmap exactly the ranges they mapped.
CudaResult CudaRuntimeApi::map(void* p, std::size_t bytes, int device) {
  const DriverApi& d = driver();
  if (!d.complete) return vmm_unsupported(kNoDriverVmm);
  const CUmemAllocationProp prop = device_memory(device);
  CUmemGenericAllocationHandle handle = 0;
  if (CUresult r = d.create(&handle, bytes, &prop, 0); r != CUDA_SUCCESS) {
    return driver_result(r);
  }
  CUresult r = d.map(device_ptr(p), bytes, /*offset=*/0, handle, 0);
  if (r == CUDA_SUCCESS) {
    CUmemAccessDesc access = {};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    r = d.set_access(device_ptr(p), bytes, &access, 1);
    if (r != CUDA_SUCCESS) d.unmap(device_ptr(p), bytes);
  }
  if (r != CUDA_SUCCESS) {
    d.release(handle);  // nothing maps it: its memory goes back at once
    return driver_result(r);
  }
  std::lock_guard lock(mutex_);
  mappings_[p] = {handle, bytes};
  return {};
}

CudaResult CudaRuntimeApi::unmap(void* p, std::size_t bytes) {
  const DriverApi& d = driver();
  if (!d.complete) return vmm_unsupported(kNoDriverVmm);
  Mapping mapping{};
  {
    std::lock_guard lock(mutex_);
    auto it = mappings_.find(p);
    if (it == mappings_.end() || it->second.bytes != bytes) {
      return {CudaStatus::kError, static_cast<int>(CUDA_ERROR_INVALID_VALUE),
              "unmap of a range that no single map call mapped"};
    }
    mapping = it->second;
  }
  if (CUresult r = d.unmap(device_ptr(p), bytes); r != CUDA_SUCCESS) return driver_result(r);
  {
    std::lock_guard lock(mutex_);
    mappings_.erase(p);
  }
  return driver_result(d.release(mapping.handle));
}

}  // namespace

namespace detail {
std::shared_ptr<CudaApi> cuda_api_over(const CudartLibrary& library) {
  return std::make_shared<CudaRuntimeApi>(library);
}
}  // namespace detail

std::shared_ptr<CudaApi> cuda_runtime_api() {
  static const std::shared_ptr<CudaApi> api = detail::cuda_api_over(cudart());
  return api;
}
#else
std::shared_ptr<CudaApi> cuda_runtime_api() { return nullptr; }
#endif

bool cuda_device_available(CudaApi* api) { return cuda_unavailable_reason(api).empty(); }

namespace {
std::string version_name(int v) { return absl::StrCat(v / 1000, ".", v % 1000 / 10); }
}  // namespace

// Any error (no driver, a driver older than the toolkit) means no usable device; the reason
// names the versions where they explain it.
std::string cuda_unavailable_reason(CudaApi* api) {
  std::shared_ptr<CudaApi> runtime;
  if (api == nullptr) {
    runtime = cuda_runtime_api();
    api = runtime.get();
  }
  if (api == nullptr) return "this build of remat has no CUDA backend";
  int count = 0;
  const CudaResult counted = api->device_count(&count);
  if (counted.ok() && count > 0) return "";
  int driver = 0, needs = 0;
  if (api->versions(&driver, &needs).ok() && driver > 0 && driver < needs) {
    return absl::StrCat("the CUDA driver supports CUDA ", version_name(driver),
                        "; this build needs ", version_name(needs), " (update the driver)");
  }
  if (counted.ok()) return absl::StrCat(api->name(), " reports no CUDA device");
  return absl::StrCat(api->name(), " reports an error: ", counted.message);
}

}  // namespace remat
