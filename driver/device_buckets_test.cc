// GradientBuckets' device path (Note [Buckets on the device]) on the simulated device: a
// backward pass's gradients, packed into device buckets on the runtime's stream and summed
// on the buckets' own stream by a stand-in for NCCL at two ranks, come back with the bits of
// the same sum on the host, no stream reads memory another may still write (the simulated
// device's race detector), and a bucket that does not fit is an out-of-memory error naming
// it. NCCL itself runs only where two GPUs are (collectives/nccl_collectives_test.cc).
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kernels/autograd.h"
#include "kernels/ops.h"
#include "remat/errors.h"
#include "remat/gradient_buckets.h"
#include "tests/support/simulated_device_ops.h"

namespace remat {
namespace {

// Rank 0 of two on the simulated device; rank 1's buffer holds other(i, n) (zero in the
// last element, the failed flag). The sum runs as a kernel of the given stream, in the
// scratch the buckets give it (inside the bucket's budgeted memory).
class SimulatedTwoRanks final : public DeviceCollectives {
 public:
  explicit SimulatedTwoRanks(SimulatedCuda* sim) : sim_(sim) {}
  int rank() const override { return 0; }
  int size() const override { return 2; }
  static float other(std::size_t i, std::size_t n) {
    return i + 1 == n ? 0.0f : 0.125f * static_cast<float>(i % 7) - 0.3f;
  }
  // Rank 1's buffer arrives in the scratch, as NCCL's slices do.
  std::size_t sum_scratch_floats(std::size_t n) const override { return n; }
  absl::Status all_reduce_sum(float* data, std::size_t n, float scale, void* stream,
                              std::span<float> scratch) override {
    if (scratch.size() < n) return absl::InvalidArgumentError("no scratch given");
    const DeviceRange ranges[] = {{data, n * sizeof(float)}, {scratch.data(), n * sizeof(float)}};
    ++sums;
    const CudaResult r = sim_->launch(static_cast<CudaStream>(stream), 20000, {ranges, 1}, ranges,
                                      [data, s = scratch.data(), n, scale] {
                                        for (std::size_t i = 0; i < n; ++i) s[i] = other(i, n);
                                        for (std::size_t i = 0; i < n; ++i)
                                          data[i] = (data[i] + s[i]) * scale;
                                      });
    return r.ok() ? absl::OkStatus() : absl::InternalError(r.message);
  }
  absl::Status all_gather(const float*, std::size_t, float*, void*) override {
    return absl::UnimplementedError("not needed here");
  }
  int sums = 0;

 private:
  SimulatedCuda* sim_;
};

struct Program {
  std::vector<TensorSpec> specs = {{{8, 8}}, {{8}}, {{8, 8}}, {{8}}, {{8, 8}}, {{8}}};
  std::vector<std::vector<float>> values;
  Program() {
    for (std::size_t p = 0; p < specs.size(); ++p) {
      values.emplace_back(static_cast<std::size_t>(specs[p].numel()));
      for (std::size_t j = 0; j < values.back().size(); ++j)
        values.back()[j] = 0.01f * static_cast<float>((j * 7 + p * 3) % 23) - 0.1f;
    }
  }
};

// The program's forward and backward passes on `rt`, each gradient to `on_grad`.
void backward(Runtime& rt, const Program& p,
              const std::function<void(std::size_t, Tensor)>& on_grad) {
  ad::Tape tape(rt);
  std::vector<ad::Var> leaves;
  std::vector<std::size_t> param_of_node;
  for (std::size_t i = 0; i < p.specs.size(); ++i) {
    leaves.push_back(tape.leaf(rt.constant(p.specs[i], p.values[i].data())));
    param_of_node.resize(static_cast<std::size_t>(leaves.back().node) + 1);
    param_of_node.back() = i;
  }
  const std::vector<float> input(16, 0.5f);
  ad::Var h = tape.input(rt.constant({{2, 8}}, input.data()));
  for (std::size_t l = 0; l < 3; ++l)
    h = ad::gelu(tape, ad::linear(tape, h, leaves[2 * l], leaves[2 * l + 1]));
  ad::Var loss = ad::narrow(tape, ad::reshape(tape, h, {16}), 5, {1});
  tape.backward(loss, [&](int node, Tensor g) {
    on_grad(param_of_node[static_cast<std::size_t>(node)], std::move(g));
  });
}

std::vector<float> read_all(Runtime& rt, const Tensor& t) {
  std::vector<float> v(static_cast<std::size_t>(t.spec().numel()));
  rt.read(t, v.data());
  return v;
}

TEST(DeviceBucketsTest, SumsOnTheirOwnStreamWithTheBitsOfTheHostAndNoRaces) {
  const Program p;
  constexpr float kScale = 0.5f;
  // The gradients on the CPU, and the sum as the host computes it.
  Runtime cpu(RuntimeOptions{});
  std::vector<std::vector<float>> want(p.specs.size());
  backward(cpu, p, [&](std::size_t i, Tensor g) { want[i] = read_all(cpu, g); });

  auto sim = std::make_shared<SimulatedCuda>();
  RuntimeOptions o = on_sim(sim, std::size_t{64} << 20);
  // Kernels of 50 us: the runtime's stream runs far behind the host, so a sum that did not
  // wait for the packing would start while the copies into its bucket are still queued.
  o.cuda.launch = [sim = sim.get()](const OpDef& op, const KernelContext& k) {
    launch_host_kernel(sim, op.kernel, k, 50000);
  };
  Runtime rt(o);
  SimulatedTwoRanks nccl(sim.get());
  RankStep ranks(rt, nullptr);
  GradientBuckets buckets(rt, ranks, p.specs,
                          {.bucket_bytes = 200, .scale = kScale, .device = &nccl});
  ASSERT_GE(buckets.buckets(), 3u);
  backward(rt, p, [&](std::size_t i, Tensor g) { buckets.add(i, std::move(g)); });
  // The host is still ahead of the device: packing a bucket made it wait for no stream (a
  // copy from or to pageable host memory would have).
  CudaEvent behind = nullptr;
  ASSERT_TRUE(sim->event_create(&behind, false).ok());
  ASSERT_TRUE(sim->event_record(behind, rt.stream()).ok());
  EXPECT_EQ(sim->event_query(behind).status, CudaStatus::kNotReady);
  const std::vector<Tensor> out = buckets.finish();
  sim->event_destroy(behind);
  EXPECT_EQ(nccl.sums, static_cast<int>(buckets.buckets()));

  // What rank 1 added to an element depends on its place in its bucket: the buckets take
  // the parameters from the last, each closing at 200 bytes.
  std::size_t bucket_floats = 0, bytes = 0;
  std::vector<std::pair<std::size_t, std::size_t>> at(p.specs.size());  // offset, bucket size
  std::vector<std::size_t> members;
  auto close = [&] {
    for (std::size_t m : members) at[m].second = bucket_floats + 1;
    members.clear();
    bucket_floats = bytes = 0;
  };
  for (std::size_t i = p.specs.size(); i-- > 0;) {
    if (!members.empty() && bytes >= 200) close();
    at[i].first = bucket_floats;
    members.push_back(i);
    bucket_floats += static_cast<std::size_t>(p.specs[i].numel());
    bytes += p.specs[i].bytes();
  }
  close();
  for (std::size_t i = 0; i < p.specs.size(); ++i) {
    const std::vector<float> got = read_all(rt, out[i]);
    for (std::size_t j = 0; j < got.size(); ++j) {
      const float sum =
          (want[i][j] + SimulatedTwoRanks::other(at[i].first + j, at[i].second)) * kScale;
      ASSERT_EQ(got[j], sum) << "gradient " << i << " element " << j;
    }
  }
  EXPECT_TRUE(sim->races().empty()) << sim->races().size() << " races";
  const GradientBucketStats s = buckets.stats();
  EXPECT_GT(s.exchange_seconds, 0.0) << "the exchange stream's events measured the sums";
}

// A loop that keeps one DeviceExchange: its second step creates no stream, event or pinned
// memory, and frees no pinned memory (which would wait for the whole device).
TEST(DeviceBucketsTest, StepsSharingAnExchangeMakeItsStreamAndBuffersOnce) {
  const Program p;
  auto sim = std::make_shared<SimulatedCuda>();
  RuntimeOptions o = on_sim(sim, std::size_t{64} << 20);
  o.cuda.launch = host_kernels_on(sim);
  Runtime rt(o);
  SimulatedTwoRanks nccl(sim.get());
  std::shared_ptr<DeviceExchange> exchange = make_device_exchange();
  auto step = [&] {
    RankStep ranks(rt, nullptr);
    GradientBuckets buckets(rt, ranks, p.specs,
                            {.bucket_bytes = 200, .device = &nccl, .exchange = exchange});
    backward(rt, p, [&](std::size_t i, Tensor g) { buckets.add(i, std::move(g)); });
    return buckets.finish();
  };
  step();
  const auto count = [&] {
    return std::vector<std::size_t>{
        sim->calls(SimulatedCall::kStreamCreate), sim->calls(SimulatedCall::kEventCreate),
        sim->calls(SimulatedCall::kMallocHost), sim->calls(SimulatedCall::kFreeHost),
        sim->calls(SimulatedCall::kStreamDestroy)};
  };
  const std::vector<std::size_t> after_one = count();
  EXPECT_GE(after_one[0], 1u);
  step();
  EXPECT_EQ(count(), after_one);
  EXPECT_TRUE(sim->races().empty());
}

// The step driver reruns a step on the simulated backend to record, screen and place it: its
// buckets must ask the budget for what the device's do, the scratch included.
TEST(DeviceBucketsTest, TheSimulatedBackendAsksForWhatTheDeviceDoes) {
  auto run = [](bool on_device) {
    auto sim = std::make_shared<SimulatedCuda>();
    RuntimeOptions o = on_sim(sim, std::size_t{64} << 20);
    if (!on_device) o = RuntimeOptions{.backend = Backend::kSimulated, .budget = o.budget};
    Runtime rt(o);
    SimulatedTwoRanks nccl(sim.get());
    RankStep ranks(rt, nullptr);
    const std::vector<TensorSpec> specs = {{{3000}}, {{500}}, {{70000}}, {{20}}};
    std::vector<Tensor> grads;
    for (const TensorSpec& s : specs) grads.push_back(rt.constant(s));
    const MemoryStats before = rt.memory().stats();
    GradientBuckets buckets(rt, ranks, specs,
                            {.bucket_bytes = 8000, .scale = 0.25f, .device = &nccl});
    for (std::size_t i : {3u, 2u, 1u, 0u}) buckets.add(i, std::move(grads[i]));
    const std::vector<Tensor> out = buckets.finish();
    const MemoryStats after = rt.memory().stats();
    return std::vector<std::size_t>{after.allocations - before.allocations,
                                    after.peak_allocated - before.allocated,
                                    after.requested - before.requested};
  };
  EXPECT_EQ(run(false), run(true));
}

TEST(DeviceBucketsTest, ABucketThatDoesNotFitIsAnOutOfMemoryErrorNamingIt) {
  auto sim = std::make_shared<SimulatedCuda>();
  Runtime rt(on_sim(sim, (std::size_t{64} << 10) + (std::size_t{200} << 10)));
  SimulatedTwoRanks nccl(sim.get());
  RankStep ranks(rt, nullptr);
  const std::vector<TensorSpec> specs = {{{20000}}, {{20000}}};       // 80 KB each
  const Tensor a = rt.constant(specs[0]), b = rt.constant(specs[1]);  // pinned
  GradientBuckets buckets(rt, ranks, specs, {.bucket_bytes = 1 << 20, .device = &nccl});
  buckets.add(0, a);
  try {
    buckets.add(1, b);
    ADD_FAILURE() << "the bucket fit";
  } catch (const OutOfMemoryError& e) {
    // The buckets' scratch or the bucket itself, whichever the budget refused first.
    EXPECT_NE(e.info().op.find("gradient bucket"), std::string::npos) << e.info().op;
  }
  EXPECT_EQ(nccl.sums, 1) << "the bucket was still exchanged, as a failed rank's";
}

}  // namespace
}  // namespace remat
