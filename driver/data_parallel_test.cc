// all_reduce_sum inside a runtime (remat/data_parallel.h) with one process's collectives:
// where kernels run, a new tensor of the sum's bits; on the simulated backend, one of the
// same spec, nothing exchanged. The sums of several ranks: examples/data_parallel_check.py
// (gpt_train under mpirun) and collectives/mpi_collectives_test.cc.
#include "remat/data_parallel.h"

#include <gtest/gtest.h>

#include <cstring>
#include <stdexcept>
#include <vector>

#include "kernels/ops.h"

namespace remat {
namespace {

// The usage example atop remat/data_parallel.h, with a gradient of its own making.
TEST(DataParallelTest, HeaderExample) {
  Runtime rt(RuntimeOptions{});
  std::unique_ptr<Collectives> c = single_process_collectives();
  Collectives& collectives = *c;
  const std::vector<float> values = {0.5f, -3.0f, 1e-7f, 42.0f};
  Tensor g = rt.constant({{4}}, values.data());             // this rank's shard's gradient
  g = remat::all_reduce_sum(rt, collectives, g);            // every rank's, summed in order
  g = remat::ops::scale(rt, g, 1.0f / collectives.size());  // the mean over the shards
  std::vector<float> out(4);
  rt.read(g, out.data());
  EXPECT_EQ(std::memcmp(out.data(), values.data(), sizeof(float) * 4), 0);
}

TEST(DataParallelTest, OnTheSimulatedBackendMakesATensorOfTheSameSpec) {
  RuntimeOptions options;
  options.backend = Backend::kSimulated;
  Runtime rt(options);
  std::unique_ptr<Collectives> c = single_process_collectives();
  const Tensor t = rt.constant({{3, 5}});
  const Tensor sum = all_reduce_sum(rt, *c, t);
  EXPECT_EQ(sum.spec(), t.spec());
  EXPECT_NE(sum.id(), t.id());
}

TEST(DataParallelTest, RefusesTensorsThatAreNotFloat32) {
  Runtime rt(RuntimeOptions{});
  std::unique_ptr<Collectives> c = single_process_collectives();
  const std::vector<std::int32_t> labels = {1, 2};
  const Tensor t = rt.constant({{2}, DType::kI32}, labels.data());
  EXPECT_THROW(all_reduce_sum(rt, *c, t), std::invalid_argument);
}

}  // namespace
}  // namespace remat
