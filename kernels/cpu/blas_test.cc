// Note [BLAS across fork]: products on one thread while another forks again and again, each
// child running a product of its own. Every product finishes, with the bits a product gives
// alone; without the fork handler, OpenBLAS's threads stopped under a product in flight and it
// never returned.
#include "kernels/cpu/blas.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace remat::kernels::cpu {
namespace {

TEST(BlasTest, AForkBesideProductsInFlightLeavesThemToFinish) {
  constexpr int n = 192;  // large enough for OpenBLAS to use its threads
  std::vector<float> a(n * n), b(n * n), want(n * n);
  for (int i = 0; i < n * n; ++i) {
    a[static_cast<std::size_t>(i)] = static_cast<float>(i % 17) * 0.25f - 2.0f;
    b[static_cast<std::size_t>(i)] = static_cast<float>(i % 13) * 0.5f - 3.0f;
  }
  blas_sgemm(false, true, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, want.data(), n);
  std::atomic<bool> done{false};
  std::atomic<int> products{0}, wrong{0};
  std::thread worker([&] {
    std::vector<float> c(n * n);
    for (int i = 0; i < 300; ++i) {
      blas_sgemm(false, true, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
      if (std::memcmp(c.data(), want.data(), c.size() * sizeof(float)) != 0) ++wrong;
      ++products;
    }
    done = true;
  });
  int forks = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!done) {
    if (std::chrono::steady_clock::now() > deadline) {
      // The worker is stuck in a product: nothing can join it, so the test ends here.
      std::fprintf(stderr, "BlasTest: a product did not return within 60 s of forks (%d done)\n",
                   products.load());
      std::_Exit(1);
    }
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      // The child runs a product too (a data loader's worker might): a lock left taken
      // would stop it here, and alarm() ends it with SIGALRM.
      alarm(20);
      std::vector<float> c(n * n);
      blas_sgemm(false, true, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
      _exit(std::memcmp(c.data(), want.data(), c.size() * sizeof(float)) == 0 ? 0 : 3);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "a forked child's product: status " << status;
    ++forks;
  }
  worker.join();
  EXPECT_EQ(products.load(), 300);
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_GT(forks, 0);
}

}  // namespace
}  // namespace remat::kernels::cpu
