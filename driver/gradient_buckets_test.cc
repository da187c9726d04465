// GradientBuckets (remat/gradient_buckets.h) in one process: the gradients come back scaled,
// bit for bit, whatever the bucket size and the order they come in; a bucket's memory is
// taken from the budget when its last gradient comes and given back in finish(); a bucket
// that does not fit is an out-of-memory error naming it; the simulated backend makes the
// same requests. Several ranks: data_parallel_mpi_test.cc, under mpirun.
#include "remat/gradient_buckets.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/autograd.h"
#include "kernels/ops.h"
#include "remat/errors.h"

namespace remat {
namespace {

std::vector<float> read_all(Runtime& rt, const Tensor& t) {
  std::vector<float> v(static_cast<std::size_t>(t.spec().numel()));
  rt.read(t, v.data());
  return v;
}

// The usage example atop remat/gradient_buckets.h, on a two-parameter program.
TEST(GradientBucketsTest, HeaderExample) {
  Runtime rt(RuntimeOptions{});
  std::unique_ptr<Collectives> c = single_process_collectives();
  Collectives& collectives = *c;
  const std::vector<float> ones(16, 1.0f);
  ad::Tape tape(rt);
  std::vector<ad::Var> params = {tape.leaf(rt.constant({{4, 4}}, ones.data())),
                                 tape.leaf(rt.constant({{4, 4}}, ones.data()))};
  ad::Var x = tape.input(rt.constant({{1, 4}}, ones.data()));
  ad::Var h = ad::linear(tape, ad::linear(tape, x, params[0], {}), params[1], {});
  ad::Var loss = ad::narrow(tape, ad::reshape(tape, h, {4}), 0, {1});
  const std::vector<TensorSpec> specs = {params[0].spec(), params[1].spec()};
  auto param_of_node = [&](int node) { return node == params[0].node ? 0u : 1u; };
  std::vector<remat::Tensor> updated;
  auto update = [&](const std::vector<remat::Tensor>& g) { updated = g; };

  remat::RankStep ranks(rt, &collectives);
  remat::GradientBuckets buckets(rt, ranks, specs, {.bucket_bytes = 1 << 20, .scale = 0.5f});
  ranks.run([&] {
    tape.backward(loss, [&](int node, remat::Tensor g) {  // each gradient once it is final
      buckets.add(param_of_node(node), std::move(g));
    });
  });
  std::vector<remat::Tensor> grads = buckets.finish();  // summed over the ranks, scaled
  ranks.run([&] { update(grads); });
  ranks.agree();

  ASSERT_EQ(updated.size(), 2u);
  // d loss / d w1[0][j] = (x w0^T)[j] = 4; d loss / d w0[j][k] = w1[0][j] x[k] = 1; halved.
  const std::vector<float> g0 = read_all(rt, updated[0]), g1 = read_all(rt, updated[1]);
  for (float v : g0) EXPECT_EQ(v, 0.5f);
  for (std::size_t j = 0; j < 4; ++j) EXPECT_EQ(g1[j], 2.0f);
  for (std::size_t j = 4; j < 16; ++j) EXPECT_EQ(g1[j], 0.0f);
}

// Random parameter sizes, bucket sizes, arrival orders and missing gradients: each gradient
// comes back as its own bits times the scale, and those that never came are undefined.
TEST(GradientBucketsTest, ReturnsEveryGradientScaledWhateverTheBucketsAndTheOrder) {
  std::mt19937 rng(34);
  for (int trial = 0; trial < 100; ++trial) {
    Runtime rt(RuntimeOptions{});
    RankStep ranks(rt, nullptr);
    const int n = std::uniform_int_distribution<int>(1, 12)(rng);
    std::vector<TensorSpec> specs;
    std::vector<std::vector<float>> values;
    std::uniform_real_distribution<float> u(-4, 4);
    for (int i = 0; i < n; ++i) {
      specs.push_back({{std::uniform_int_distribution<std::int64_t>(1, 700)(rng)}});
      values.emplace_back(static_cast<std::size_t>(specs.back().numel()));
      for (float& v : values.back()) v = u(rng);
    }
    const GradientBucketOptions options{
        .bucket_bytes = std::uniform_int_distribution<std::size_t>(1, 8000)(rng),
        .scale = trial % 3 == 0 ? 1.0f : 1.0f / static_cast<float>(1 + trial % 5)};
    GradientBuckets buckets(rt, ranks, specs, options);
    std::vector<int> order(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) order[static_cast<std::size_t>(i)] = i;
    std::shuffle(order.begin(), order.end(), rng);
    const int missing = trial % 4 == 0 ? order.back() : -1;
    for (int i : order)
      if (i != missing)
        buckets.add(static_cast<std::size_t>(i), rt.constant(specs[i], values[i].data()));
    const std::vector<Tensor> out = buckets.finish();
    ASSERT_EQ(out.size(), specs.size());
    for (int i = 0; i < n; ++i) {
      if (i == missing) {
        EXPECT_FALSE(out[i].defined());
        continue;
      }
      const std::vector<float> got = read_all(rt, out[i]);
      for (std::size_t j = 0; j < got.size(); ++j)
        ASSERT_EQ(got[j], values[i][j] * options.scale) << "trial " << trial << " grad " << i;
    }
    EXPECT_GE(buckets.buckets(), 1u);
    EXPECT_EQ(rt.memory().stats().allocated,
              [&] {
                std::size_t bytes = 0;  // what is left: the summed gradients alone
                for (const Tensor& t : out)
                  if (t.defined()) bytes += rt.memory().rounded_size(t.spec().bytes());
                return bytes;
              }())
        << "trial " << trial;
  }
}

// Rank 0 of two in one process: rank 1's contribution to a sum is peer(i), the sum is made
// slowly (so that the work after a bucket's start runs beside it), and rank 1 never fails.
// The exchange thread then runs as it does under mpirun, where ThreadSanitizer can see it.
class OnePeer final : public Collectives {
 public:
  static float peer(std::size_t i) { return 0.75f - 0.125f * static_cast<float>(i % 9); }
  int rank() const override { return 0; }
  int size() const override { return 2; }
  std::string engine() const override { return "one peer"; }
  absl::Status all_reduce_sum(std::span<float> data) override {
    if (fail_sums) return absl::UnavailableError("the network went away");
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    for (std::size_t i = 0; i + 1 < data.size(); ++i) data[i] += peer(i);  // the flag: 0
    ++sums;
    return absl::OkStatus();
  }
  absl::Status all_gather(std::span<const float>, std::span<float>) override {
    return absl::UnimplementedError("not needed here");
  }
  absl::Status broadcast(std::span<std::byte>, int) override { return absl::OkStatus(); }
  absl::StatusOr<std::int64_t> all_max(std::int64_t value) override { return value; }
  std::atomic<int> sums = 0;
  bool fail_sums = false;
};

TEST(GradientBucketsTest, SumsOnTheExchangeThreadBesideTheWork) {
  std::mt19937 rng(28);
  for (int trial = 0; trial < 10; ++trial) {
    Runtime rt(RuntimeOptions{});
    OnePeer peer;
    RankStep ranks(rt, &peer);
    ASSERT_TRUE(ranks.exchanges());
    std::vector<TensorSpec> specs;
    for (int i = 0; i < 8; ++i)
      specs.push_back({{std::uniform_int_distribution<std::int64_t>(1, 3000)(rng)}});
    GradientBuckets buckets(rt, ranks, specs, {.bucket_bytes = 4000, .scale = 0.5f});
    std::vector<std::vector<float>> values;
    for (std::size_t i = specs.size(); i-- > 0;) {  // last first, as a backward pass
      std::vector<float> v(static_cast<std::size_t>(specs[i].numel()));
      for (std::size_t j = 0; j < v.size(); ++j) v[j] = static_cast<float>(j % 13) * 0.5f - 2;
      values.insert(values.begin(), v);
      ranks.run([&] { buckets.add(i, rt.constant(specs[i], v.data())); });
      // Work of the "backward pass" while the sums run: a kernel on the runtime.
      ranks.run([&] { (void)ops::scale(rt, rt.constant(specs[i], v.data()), 2.0f); });
    }
    const std::vector<Tensor> out = buckets.finish();
    ranks.agree();
    EXPECT_EQ(peer.sums, static_cast<int>(buckets.buckets()));
    EXPECT_GT(buckets.stats().exchange_seconds, 0.0);
    // Where each gradient sits in its bucket decides what the peer added.
    std::size_t at = 0, bytes = 0;
    std::vector<std::size_t> offset(specs.size());
    for (std::size_t i = specs.size(); i-- > 0;) {
      if (i + 1 < specs.size() && bytes >= 4000) at = bytes = 0;
      offset[i] = at;
      at += static_cast<std::size_t>(specs[i].numel());
      bytes += specs[i].bytes();
    }
    for (std::size_t i = 0; i < specs.size(); ++i) {
      const std::vector<float> got = read_all(rt, out[i]);
      for (std::size_t j = 0; j < got.size(); ++j)
        ASSERT_EQ(got[j], (values[i][j] + OnePeer::peer(offset[i] + j)) * 0.5f)
            << "trial " << trial << " gradient " << i << " element " << j;
    }
  }
}

// An exchange that fails on this rank is kept as its error, and finish() returns, so that
// the rank still makes the agreement its peers wait in; agree() then throws it.
TEST(GradientBucketsTest, AnExchangeThatFailsHereIsThrownAtTheNextAgreement) {
  Runtime rt(RuntimeOptions{});
  OnePeer peer;
  peer.fail_sums = true;
  RankStep ranks(rt, &peer);
  const std::vector<TensorSpec> specs = {{{100}}, {{200}}};
  GradientBuckets buckets(rt, ranks, specs, {.bucket_bytes = 1});
  ranks.run([&] {
    for (std::size_t i : {1u, 0u}) buckets.add(i, rt.constant(specs[i]));
  });
  EXPECT_NO_THROW(buckets.finish());
  EXPECT_TRUE(ranks.failed());
  try {
    ranks.agree();
    ADD_FAILURE() << "agree() went on";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("the network went away"), std::string::npos) << e.what();
  }
}

// One bucket per gradient (bucket_bytes 1): buckets go from the last parameter to the first
// and start in order, so the last parameter's gradient starts its bucket at once, the first
// one's waits for those before it, and each started bucket holds its memory and not the
// gradient's.
TEST(GradientBucketsTest, ABucketTakesItsMemoryWhenItStartsAndTheBucketsStartInOrder) {
  Runtime rt(RuntimeOptions{});
  RankStep ranks(rt, nullptr);
  const std::vector<TensorSpec> specs = {{{1000}}, {{3000}}};
  GradientBuckets buckets(rt, ranks, specs, {.bucket_bytes = 1});
  ASSERT_EQ(buckets.buckets(), 2u);
  MemoryResource& memory = rt.memory();
  const std::size_t before = memory.stats().allocated;
  buckets.add(0, rt.constant(specs[0]));  // the second bucket: waits for the first
  EXPECT_EQ(memory.stats().allocated, before + memory.rounded_size(4000));
  buckets.add(1, rt.constant(specs[1]));  // both start; their gradients go
  EXPECT_EQ(memory.stats().allocated,
            before + memory.rounded_size(3001 * 4) + memory.rounded_size(1001 * 4));
  const std::vector<Tensor> out = buckets.finish();
  EXPECT_EQ(memory.stats().allocated,
            before + memory.rounded_size(4000) + memory.rounded_size(12000));
}

TEST(GradientBucketsTest, ABucketThatDoesNotFitIsAnOutOfMemoryErrorNamingIt) {
  RuntimeOptions options;
  options.budget = 64 << 10;
  Runtime rt(options);
  RankStep ranks(rt, nullptr);
  const std::vector<TensorSpec> specs = {{{6000}}, {{6000}}};            // 24 KB each
  GradientBuckets buckets(rt, ranks, specs, {.bucket_bytes = 1 << 20});  // one bucket
  const Tensor a = rt.constant(specs[0]), b = rt.constant(specs[1]);     // held: pinned
  buckets.add(0, a);
  try {
    buckets.add(1, b);  // 48 KB of bucket beside 48 KB pinned
    ADD_FAILURE() << "the bucket fit";
  } catch (const OutOfMemoryError& e) {
    EXPECT_NE(e.info().op.find("gradient bucket 0"), std::string::npos) << e.info().op;
    EXPECT_EQ(e.budget(), std::size_t{64} << 10);
  }
  EXPECT_NO_THROW(rt.constant({{100}})) << "the runtime is still usable";
}

TEST(GradientBucketsTest, RefusesAGradientTwiceOrOfAnotherSpec) {
  Runtime rt(RuntimeOptions{});
  RankStep ranks(rt, nullptr);
  GradientBuckets buckets(rt, ranks, {{{4}}, {{8}}}, {});
  EXPECT_THROW(buckets.add(0, rt.constant({{8}})), std::invalid_argument);
  EXPECT_THROW(buckets.add(2, rt.constant({{4}})), std::invalid_argument);
  buckets.add(0, rt.constant({{4}}));
  EXPECT_THROW(buckets.add(0, rt.constant({{4}})), std::invalid_argument);
  EXPECT_THROW(GradientBuckets(rt, ranks, {{{4}, DType::kI32}}, {}), std::invalid_argument);
}

// The step driver reruns a step on the simulated backend to trace and place its requests:
// buckets make the same requests there, in the same order, as on the CPU.
TEST(GradientBucketsTest, TheSimulatedBackendMakesTheSameRequests) {
  auto run = [](Backend backend) {
    RuntimeOptions options;
    options.backend = backend;
    Runtime rt(options);
    RankStep ranks(rt, nullptr);
    const std::vector<TensorSpec> specs = {{{3000}}, {{500}}, {{70000}}, {{20}}};
    GradientBuckets buckets(rt, ranks, specs, {.bucket_bytes = 8000, .scale = 0.25f});
    for (std::size_t i : {3u, 2u, 1u, 0u}) buckets.add(i, rt.constant(specs[i]));
    const std::vector<Tensor> out = buckets.finish();
    const MemoryStats s = rt.memory().stats();
    return std::vector<std::size_t>{s.allocations, s.peak_allocated, s.allocated};
  };
  EXPECT_EQ(run(Backend::kSimulated), run(Backend::kCpu));
}

}  // namespace
}  // namespace remat
