// remat/mpi_collectives.h: the collectives (remat/collectives.h) of processes started by
// mpirun, over MPI (component `mpi`, target remat::collectives_mpi; OpenMPI on Debian).
//
//   int main(int argc, char** argv) {
//     absl::StatusOr<std::unique_ptr<remat::Collectives>> c =
//         remat::mpi_collectives(&argc, &argv);       // MPI_Init_thread, unless MPI is up
//     if (!c.ok()) return 1;                          // names the MPI call that failed
//     std::vector<float> grad = local_gradient((*c)->rank());
//     absl::Status st = (*c)->all_reduce_sum(grad);
//   }                                                 // MPI_Finalize, if it initialized MPI
//
// A program run without mpirun is one rank of one. Any thread may call the engine, one at a
// time (MPI_THREAD_SERIALIZED; a program that initializes MPI itself must ask for it).
#ifndef REMAT_MPI_COLLECTIVES_H_
#define REMAT_MPI_COLLECTIVES_H_

#include <absl/status/statusor.h>

#include <memory>

#include "remat/collectives.h"

namespace remat {

// Initializes MPI where it is not yet (with `argc` and `argv`, which may be null), and
// returns the collectives of a communicator of its own over MPI_COMM_WORLD's processes.
// Errors name the MPI call and MPI's message.
absl::StatusOr<std::unique_ptr<Collectives>> mpi_collectives(int* argc, char*** argv);

}  // namespace remat

#endif  // REMAT_MPI_COLLECTIVES_H_
