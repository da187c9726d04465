// remat/nccl_collectives.h: collectives over device memory between processes with a GPU
// each, over NCCL (component `nccl`, target remat::collectives_nccl, built where the CUDA
// toolkit and NCCL are found), started from the ranks of host collectives (MPI) as llm.c
// starts them.
//
//   auto host = remat::mpi_collectives(&argc, &argv);                     // mpirun's ranks
//   auto gpus = remat::nccl_collectives(**host, (*host)->rank() % devices); // NCCL over them
//   absl::Status st = (*gpus)->all_reduce_sum(grad, n, 1.0f, stream, {}); // on `stream`
//
// Sums are in rank order, as the host collectives' are (Note [Sums in rank order] in
// collectives/mpi_collectives.cc), so one process adding the ranks' buffers in order gets
// the same bits (DeviceCollectives, in remat/collectives.h). The calls enqueue work on the
// given stream and return; one engine serves one stream at a time (its exchange buffer is
// shared).
#ifndef REMAT_NCCL_COLLECTIVES_H_
#define REMAT_NCCL_COLLECTIVES_H_

#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include <cstddef>
#include <memory>

#include "remat/collectives.h"

namespace remat {

// NCCL over the processes of `bootstrap` (rank 0's unique id goes to every rank through it),
// this process on CUDA device `device`. Errors name the CUDA or NCCL call.
absl::StatusOr<std::unique_ptr<DeviceCollectives>> nccl_collectives(Collectives& bootstrap,
                                                                    int device);

}  // namespace remat

#endif  // REMAT_NCCL_COLLECTIVES_H_
