// remat/system_cuda.h: the CUDA installed on this machine, as a CudaApi (remat/cuda_api.h).
// Part of remat::cuda; libcudart is opened on first use, so a program that never asks for
// it runs where no CUDA is installed.
//
//   if (remat::cuda_device_available()) {
//     remat::Runtime rt({.backend = remat::Backend::kCuda, .budget = std::size_t{8} << 30});
//   }
#ifndef REMAT_SYSTEM_CUDA_H_
#define REMAT_SYSTEM_CUDA_H_

#include <memory>
#include <string>

#include "remat/cuda_api.h"

namespace remat {

// The CUDA runtime (cudart, with the driver's virtual-memory calls found through it), shared
// by every user in the process; null in a build without CUDA.
std::shared_ptr<CudaApi> cuda_runtime_api();

// True when `api` (default: the CUDA runtime) reports at least one device. Any error (no
// driver, a driver too old for the toolkit) counts as no device.
bool cuda_device_available(CudaApi* api = nullptr);

// Why `api` (default: the CUDA runtime) offers no device, "" where it does: no CUDA in the
// build, an error, or "the CUDA driver supports CUDA 12.4; this build needs 13.0 ...".
std::string cuda_unavailable_reason(CudaApi* api = nullptr);

}  // namespace remat

#endif  // REMAT_SYSTEM_CUDA_H_
