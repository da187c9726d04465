// NCCL's functions, opened at run time (Note [NCCL opened, not linked] in nccl_library.cc).
#ifndef REMAT_COLLECTIVES_NCCL_LIBRARY_H_
#define REMAT_COLLECTIVES_NCCL_LIBRARY_H_

#include <absl/status/statusor.h>
#include <cuda_runtime.h>
#include <nccl.h>

namespace remat::detail {

// The NCCL calls the engine makes, resolved from libnccl.
struct NcclLibrary {
  ncclResult_t (*get_unique_id)(ncclUniqueId*) = nullptr;
  ncclResult_t (*comm_init_rank)(ncclComm_t*, int, ncclUniqueId, int) = nullptr;
  ncclResult_t (*comm_destroy)(ncclComm_t) = nullptr;
  const char* (*get_error_string)(ncclResult_t) = nullptr;
  ncclResult_t (*group_start)() = nullptr;
  ncclResult_t (*group_end)() = nullptr;
  ncclResult_t (*send)(const void*, size_t, ncclDataType_t, int, ncclComm_t,
                       cudaStream_t) = nullptr;
  ncclResult_t (*recv)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*all_gather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t,
                             cudaStream_t) = nullptr;
};

// libnccl, opened once (the library the build found first, then the loader's libnccl.so.2);
// an error that names each place tried where none opens or a function is missing.
absl::StatusOr<const NcclLibrary*> nccl_library();

}  // namespace remat::detail

#endif  // REMAT_COLLECTIVES_NCCL_LIBRARY_H_
