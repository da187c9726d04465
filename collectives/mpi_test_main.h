// The main of a GoogleTest program that runs as mpirun's processes (remat_mpi_test in
// CMakeLists.txt): MPI's collectives are made before the tests, and MPI is finalized after.
#ifndef REMAT_COLLECTIVES_MPI_TEST_MAIN_H_
#define REMAT_COLLECTIVES_MPI_TEST_MAIN_H_

#include "remat/collectives.h"

namespace remat::testing {

// The collectives of every process mpirun started, for the tests to use.
Collectives& mpi_test_world();

}  // namespace remat::testing

#endif  // REMAT_COLLECTIVES_MPI_TEST_MAIN_H_
