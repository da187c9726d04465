#include "collectives/mpi_test_main.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>

#include "remat/mpi_collectives.h"

namespace remat::testing {
namespace {
Collectives* world = nullptr;
}  // namespace

Collectives& mpi_test_world() { return *world; }

}  // namespace remat::testing

int main(int argc, char** argv) {
  absl::StatusOr<std::unique_ptr<remat::Collectives>> c = remat::mpi_collectives(&argc, &argv);
  if (!c.ok()) {
    std::fprintf(stderr, "%s: %s\n", argv[0], std::string(c.status().message()).c_str());
    return 1;
  }
  remat::testing::world = c->get();
  ::testing::InitGoogleTest(&argc, argv);
  const int failed = RUN_ALL_TESTS();
  c->reset();  // MPI_Finalize
  return failed;
}
