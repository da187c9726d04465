// Force-included (-include) into the host execution of the CUDA sources, before anything else.
//
// Note [CCCL without the toolkit]
// The host build runs CCCL's Thrust on its CPP system, with the shim's <cuda_runtime.h> in
// place of the toolkit's. CCCL decides that a CUDA toolkit is present when
// <cuda_runtime_api.h> is reachable (cuda/std/__cccl/cuda_toolkit.h) and then includes it; on a
// machine whose toolkit headers are also linked into a default include directory
// (/usr/local/include), that pulls the real runtime API in beside the shim, and every type
// the shim defines (cudaError_t, dim3, float2, __global__) is defined twice. This header
// stands in for cuda_toolkit.h (same include guard) with the answer a machine without the
// toolkit gets: no toolkit, version 0. With a CCCL that has no such header the macros are
// simply unused.
#ifndef REMAT_KERNELS_CUDA_HOST_CCCL_WITHOUT_TOOLKIT_H_
#define REMAT_KERNELS_CUDA_HOST_CCCL_WITHOUT_TOOLKIT_H_

#define __CCCL_CUDA_TOOLKIT_H
#define _CCCL_HAS_CTK() 0
#define _CCCL_CTK_MAKE_VERSION(_MAJOR, _MINOR) ((_MAJOR)*1000 + (_MINOR)*10)
#define _CCCL_CTK() (0, 0)
#define _CCCL_CTK_BELOW(...) _CCCL_VERSION_COMPARE(_CCCL_CTK_, _CCCL_CTK, <, __VA_ARGS__)
#define _CCCL_CTK_AT_LEAST(...) _CCCL_VERSION_COMPARE(_CCCL_CTK_, _CCCL_CTK, >=, __VA_ARGS__)

#endif  // REMAT_KERNELS_CUDA_HOST_CCCL_WITHOUT_TOOLKIT_H_
