// The NCCL collectives as mpirun's processes, one GPU each (ctest runs it as 2 ranks where 2
// GPUs exist; `--probe` alone exits 77, a skip, where fewer do). Every rank checks the
// device sum against the rank-order sum it computes from every rank's inputs, bit for bit.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "remat/mpi_collectives.h"
#include "remat/nccl_collectives.h"

namespace remat {
namespace {

Collectives* host = nullptr;
DeviceCollectives* gpus = nullptr;

std::vector<float> inputs(int rank, std::size_t n) {
  std::mt19937 rng(static_cast<unsigned>(77 + rank));
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-20, 20);
  std::vector<float> v(n);
  for (float& x : v) x = std::ldexp(unit(rng), exponent(rng));
  return v;
}

// `n` floats on the device, filled from `values`, read back by value().
struct DeviceBuffer {
  explicit DeviceBuffer(std::size_t n) : n(n) { cudaMalloc(&p, std::max<std::size_t>(n, 1) * 4); }
  ~DeviceBuffer() { cudaFree(p); }
  void fill(const std::vector<float>& values) {
    cudaMemcpy(p, values.data(), values.size() * sizeof(float), cudaMemcpyHostToDevice);
  }
  std::vector<float> value() const {
    std::vector<float> out(n);
    cudaMemcpy(out.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost);
    return out;
  }
  float* data() { return static_cast<float*>(p); }
  std::size_t n;
  void* p = nullptr;
};

// With the engine's own scratch and with the caller's (a gradient bucket's, in its budget).
TEST(NcclCollectivesTest, SumsEveryElementInRankOrderOnEveryRank) {
  for (const bool given_scratch : {false, true}) {
    for (const float scale : {1.0f, 0.5f}) {
      for (std::size_t n : {1u, 7u, 100003u}) {
        DeviceBuffer d(n), scratch(gpus->sum_scratch_floats(n));
        d.fill(inputs(host->rank(), n));
        const std::span<float> s =
            given_scratch ? std::span<float>(scratch.data(), scratch.n) : std::span<float>();
        ASSERT_TRUE(gpus->all_reduce_sum(d.data(), n, scale, nullptr, s).ok());
        std::vector<float> want = inputs(0, n);
        for (int r = 1; r < host->size(); ++r) {
          const std::vector<float> x = inputs(r, n);
          for (std::size_t i = 0; i < n; ++i) want[i] += x[i];
        }
        for (float& w : want) w *= scale;
        const std::vector<float> got = d.value();
        EXPECT_EQ(std::memcmp(got.data(), want.data(), n * sizeof(float)), 0)
            << "n = " << n << ", scale " << scale << (given_scratch ? ", scratch given" : "");
      }
    }
  }
}

TEST(NcclCollectivesTest, GathersEveryRanksValuesInRankOrder) {
  DeviceBuffer mine(3), all(3 * static_cast<std::size_t>(host->size()));
  mine.fill(inputs(host->rank(), 3));
  ASSERT_TRUE(gpus->all_gather(mine.data(), 3, all.data(), nullptr).ok());
  const std::vector<float> got = all.value();
  for (int r = 0; r < host->size(); ++r) {
    const std::vector<float> want = inputs(r, 3);
    EXPECT_EQ(std::memcmp(got.data() + 3 * r, want.data(), 3 * sizeof(float)), 0) << "rank " << r;
  }
}

}  // namespace
}  // namespace remat

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  if (argc > 1 && std::string(argv[1]) == "--probe") {
    if (devices >= 2) return 0;
    std::printf("skipped: %d CUDA devices; the NCCL test needs 2\n", devices);
    return 77;
  }
  auto host = remat::mpi_collectives(&argc, &argv);
  if (!host.ok()) {
    std::fprintf(stderr, "%s\n", std::string(host.status().message()).c_str());
    return 1;
  }
  auto gpus = remat::nccl_collectives(**host, (*host)->rank() % std::max(devices, 1));
  if (!gpus.ok()) {
    std::fprintf(stderr, "%s\n", std::string(gpus.status().message()).c_str());
    return 1;
  }
  remat::host = host->get();
  remat::gpus = gpus->get();
  ::testing::InitGoogleTest(&argc, argv);
  const int failed = RUN_ALL_TESTS();
  gpus->reset();
  host->reset();
  return failed;
}
