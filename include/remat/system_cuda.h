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

#include "remat/cuda_api.h"

namespace remat {

// The CUDA runtime (cudart, with the driver's virtual-memory calls found through it), shared
// by every user in the process; null in a build without CUDA.
std::shared_ptr<CudaApi> cuda_runtime_api();

// True when `api` (default: the CUDA runtime) reports at least one device. Any error (no
// driver, a driver too old for the toolkit) counts as no device.
bool cuda_device_available(CudaApi* api = nullptr);

}  // namespace remat

#endif  // REMAT_SYSTEM_CUDA_H_
