// The CUDA backend run on a simulated device (simulated_cuda.h): stream-ordered reuse of
// memory, the errors CUDA calls can return, the device index, start-up memory, pinned
// staging, event timing, expandable segments through virtual memory, and compaction (on
// the host too).
//
// The simulated device runs a kernel's body when its simulated time is up and reports any
// two streams that touched the same bytes unordered, so the property tests below check the
// two things a GPU user needs: no block is handed out while work of another stream that used
// it can still be pending (no races), and every value is bitwise what an unconstrained run on
// the CPU computes.
#include <gtest/gtest.h>

#include <cstring>

#include <algorithm>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "remat/errors.h"
#include "remat/runtime.h"
#include "runtime/cuda/simulated_cuda.h"
#include "tests/support/simulated_device_ops.h"
#include "tests/support/test_ops.h"

namespace remat {
namespace {

using testing::affine;
using testing::combine;
using testing::vec;

// A random program over tensors of one size: constants, then ops reading random live
// tensors; some tensors are read by a long kernel on a side stream, some released.
struct Instruction {
  enum Kind { kAffine, kCombine, kSideRead, kRelease } kind;
  std::size_t a = 0, b = 0;  // operands: positions among the live tensors
  double ns = 0;
};
struct Program {
  std::int64_t n = 0;
  int constants = 0;
  std::vector<Instruction> code;
};

Program random_program(std::mt19937_64& rng) {
  Program p;
  p.n = std::uniform_int_distribution<std::int64_t>(512, 8192)(rng);
  p.constants = 3;
  std::uniform_real_distribution<double> u(0, 1);
  std::size_t live = static_cast<std::size_t>(p.constants);
  for (int i = 0; i < 70; ++i) {
    Instruction in;
    const double r = u(rng);
    in.kind = r < 0.45   ? Instruction::kAffine
              : r < 0.75 ? Instruction::kCombine
              : r < 0.9  ? Instruction::kSideRead
                         : Instruction::kRelease;
    if (in.kind == Instruction::kRelease && live <= 4) in.kind = Instruction::kAffine;
    in.a = std::uniform_int_distribution<std::size_t>(0, live - 1)(rng);
    in.b = std::uniform_int_distribution<std::size_t>(0, live - 1)(rng);
    in.ns = in.kind == Instruction::kSideRead
                ? std::uniform_real_distribution<double>(50e3, 500e3)(rng)
                : std::uniform_real_distribution<double>(1e3, 20e3)(rng);
    if (in.kind == Instruction::kAffine || in.kind == Instruction::kCombine) ++live;
    if (in.kind == Instruction::kRelease) --live;
    p.code.push_back(in);
  }
  return p;
}

// Runs `p` on `rt` and returns every live tensor's values at the end. With `sim`, ops run as
// simulated kernels and side reads are enqueued on `side` (recorded unless `skip_record`).
// With `host_copies`, each side read also begins a copy of `b` to the host and prefetches it
// where it was offloaded (Runtime::copy_to_host, prefetch), beside the victims the runtime
// moves there itself.
std::vector<std::vector<float>> run(Runtime& rt, const Program& p,
                                    const std::shared_ptr<SimulatedCuda>& sim, CudaStream side,
                                    bool skip_record = false, bool host_copies = false) {
  std::vector<Tensor> live;
  for (int c = 0; c < p.constants; ++c)
    live.push_back(rt.constant(vec(p.n), testing::iota(p.n, 1.0f + c).data()));
  for (const Instruction& in : p.code) {
    Tensor& a = live[in.a];
    Tensor& b = live[in.b];
    switch (in.kind) {
      case Instruction::kAffine: {
        OpPtr op = affine(0.5f, 1.0f + static_cast<float>(in.a % 3));
        live.push_back(rt.call1(sim ? on_device(sim, op, in.ns) : op, {a}));
        break;
      }
      case Instruction::kCombine: {
        OpPtr op = combine();
        live.push_back(rt.call1(sim ? on_device(sim, op, in.ns) : op, {a, b}));
        break;
      }
      case Instruction::kSideRead:
        if (sim) {
          // As a CUDA program must: the side stream waits for the runtime's stream, which
          // may not have written `a` yet, then reads it; record_stream keeps its memory.
          const void* data = rt.data(a);
          CudaEvent written = nullptr;
          sim->event_create(&written, false);
          sim->event_record(written, rt.stream());
          sim->stream_wait_event(side, written);
          sim->event_destroy(written);
          const DeviceRange r[] = {{data, a.bytes()}};
          sim->launch(side, in.ns, r, {});
          if (!skip_record) rt.record_stream(a, side);
        }
        if (host_copies) {
          rt.copy_to_host(b);
          rt.prefetch(b);
        }
        break;
      case Instruction::kRelease:
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(in.a));
        break;
    }
  }
  std::vector<std::vector<float>> values;
  for (const Tensor& t : live) values.push_back(testing::read(rt, t));
  return values;
}

struct SweepResult {
  int runs = 0, completed = 0;
  std::size_t races = 0, invalid = 0, mismatches = 0, over_budget = 0;
  std::size_t deferred_frees = 0, stream_waits = 0, evictions = 0, side_reads = 0;
  std::size_t unbacked = 0;  // expandable: reserved bytes the device did not back, or more
  std::size_t compactions = 0, packed = 0;  // storages moved (Note [Compaction])
  std::size_t offloads = 0, restores = 0;
};

struct SweepOptions {
  bool expandable = false;
  bool skip_record = false;
  // Host memory as large as the peak over a fast link: victims go to the host and back on
  // the copy streams (Note [Copy streams]), and side reads copy and prefetch too.
  bool host_memory = false;
};

// The property: random programs at random budgets, on the simulated device.
SweepResult sweep(std::uint64_t seed, int trials, SweepOptions so) {
  const bool expandable = so.expandable;
  SweepResult res;
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < trials; ++trial) {
    const Program p = random_program(rng);
    Runtime reference({.backend = Backend::kCpu});
    const auto expected = run(reference, p, nullptr, nullptr);

    // The peak without a budget, then a budget between 35% and 90% of it.
    std::size_t peak = 0;
    {
      auto sim = std::make_shared<SimulatedCuda>();
      RuntimeOptions o = on_sim(sim, SIZE_MAX);
      o.allocator.expandable_segments = expandable;
      Runtime rt(o);
      CudaStream side = nullptr;
      sim->stream_create(&side);
      run(rt, p, sim, side);
      // Unbudgeted, the arena is not used and segments round the peak up: the arena is
      // measured against what the program really held.
      peak = expandable ? rt.stats().memory.peak_allocated : rt.stats().memory.peak_reserved;
    }
    const double fraction = expandable ? std::uniform_real_distribution<double>(0.6, 1.0)(rng)
                                       : std::uniform_real_distribution<double>(0.35, 0.9)(rng);
    auto sim = std::make_shared<SimulatedCuda>(SimulatedCudaOptions{.granularity = 64 << 10});
    RuntimeOptions o = on_sim(sim, static_cast<std::size_t>(fraction * static_cast<double>(peak)));
    o.allocator.expandable_segments = expandable;
    o.allocator.arena_step = 128 << 10;
    if (so.host_memory) {
      o.host_memory_bytes = peak;
      o.host_link = HostLink{1e3, 0.0};
    }
    ++res.runs;
    try {
      Runtime rt(o);
      CudaStream side = nullptr;
      sim->stream_create(&side);
      const auto got = run(rt, p, sim, side, so.skip_record, so.host_memory);
      ++res.completed;
      if (got != expected) ++res.mismatches;
      const RuntimeStats st = rt.stats();
      if (st.memory.peak_reserved > o.budget) ++res.over_budget;
      res.deferred_frees += st.memory.deferred_frees;
      res.stream_waits += st.memory.stream_waits;
      res.evictions += st.evictions;
      res.compactions += st.compactions;
      res.packed += st.packed_storages;
      res.offloads += st.offloads;
      res.restores += st.restores;
      if (expandable && sim->device_bytes_in_use(0) != st.memory.reserved) ++res.unbacked;
    } catch (const OutOfMemoryError&) {
      // Too tight for this program (pinned constants and an op's own operands); counted.
    }
    for (const Instruction& in : p.code) res.side_reads += in.kind == Instruction::kSideRead;
    res.races += sim->races().size();
    res.invalid += sim->invalid_accesses().size();
  }
  return res;
}

void expect_sound(const SweepResult& r) {
  EXPECT_EQ(r.races, 0u) << "a block was reused while another stream's work on it was pending";
  EXPECT_EQ(r.invalid, 0u);
  EXPECT_EQ(r.mismatches, 0u);
  EXPECT_EQ(r.over_budget, 0u);
  EXPECT_EQ(r.unbacked, 0u);
  // The sweep is only worth something if it exercised what it checks.
  EXPECT_GE(r.completed * 4, r.runs * 3) << r.completed << " of " << r.runs << " completed";
  EXPECT_GT(r.evictions + r.offloads, 0u);
  EXPECT_GT(r.deferred_frees, 0u);
  EXPECT_GT(r.side_reads, 0u);
}

TEST(StreamOrder, RandomProgramsNeverReuseMemoryUnderPendingWork) {
  expect_sound(sweep(/*seed=*/11, /*trials=*/25, {}));
}

TEST(StreamOrder, RandomProgramsOnExpandableSegments) {
  expect_sound(sweep(/*seed=*/12, /*trials=*/25, {.expandable = true}));
}

// With host memory: copies to the host and back on the copy streams, beside the kernels and
// the side reads, race nothing and bring every byte back.
TEST(StreamOrder, RandomProgramsWithHostMemoryCopyBesideTheKernels) {
  const SweepResult r = sweep(/*seed=*/13, /*trials=*/25, {.host_memory = true});
  expect_sound(r);
  EXPECT_GT(r.offloads, 0u);
  EXPECT_GT(r.restores, 0u);
}

// The oracle sees what record_stream prevents: without it, memory a side stream still reads
// is reused by the runtime's stream.
TEST(StreamOrder, WithoutRecordStreamTheSimulatorSeesRaces) {
  const SweepResult r = sweep(/*seed=*/11, /*trials=*/25, {.skip_record = true});
  EXPECT_GT(r.races, 0u);
  EXPECT_EQ(r.deferred_frees, 0u);
}

// ---------------------------------------------------------------------------------------
// Errors

// Note [Compaction], on the host and on the simulated device: two segments of 4 MiB (the
// device's BLAS workspace has a segment of its own) hold constants with holes between them,
// 3 MiB free in pieces of 1 MiB, nothing evictable; an op then needs 2 MiB. Moving one
// constant into the other segment's hole serves it; without compaction the request is out
// of memory. Every value stays exact, and on the device the copy is ordered with the kernels
// (no races).
void compaction_scenario(Backend backend, bool compaction) {
  auto sim = std::make_shared<SimulatedCuda>();
  const std::size_t ws = backend == Backend::kCuda ? 64 << 10 : 0;
  RuntimeOptions o = on_sim(sim, 2 * (std::size_t{4} << 20) + ws);
  o.backend = backend;
  o.allocator.medium_segment = std::size_t{4} << 20;
  o.compaction = compaction;
  Runtime rt(o);
  const OpPtr op = backend == Backend::kCuda ? on_device(sim, affine(2, 1), 1000) : affine(2, 1);
  const std::int64_t mib = 1 << 18;  // floats
  Tensor d = rt.constant(vec(2 * mib), testing::iota(2 * mib).data());
  std::vector<Tensor> constants, transients;
  for (int i = 0; i < 3; ++i) {
    constants.push_back(rt.constant(vec(mib), testing::iota(mib, 10.0f * i).data()));
    transients.push_back(rt.call1(op, {constants.back()}));
  }
  EXPECT_EQ(rt.stats().memory.reserved, o.budget);
  transients.clear();  // three 1 MiB holes, one per constant
  if (!compaction) {
    EXPECT_THROW(rt.call1(op, {d}), OutOfMemoryError);
    return;
  }
  Tensor y = rt.call1(op, {d});
  EXPECT_GE(rt.stats().compactions, 1u);
  EXPECT_GE(rt.stats().compaction_bytes, std::size_t{1} << 20);
  EXPECT_LE(rt.stats().memory.peak_reserved, o.budget);
  const std::vector<float> got = testing::read(rt, y);
  ASSERT_EQ(got.size(), static_cast<std::size_t>(2 * mib));
  for (std::int64_t i = 0; i < 2 * mib; i += 4099)
    EXPECT_EQ(got[static_cast<std::size_t>(i)], (1.0f + static_cast<float>(i)) * 2 + 1) << i;
  for (int c = 0; c < 3; ++c)
    EXPECT_EQ(testing::read(rt, constants[static_cast<std::size_t>(c)]),
              testing::iota(mib, 10.0f * c))
        << "constant " << c << " kept its bytes when it moved";
  EXPECT_TRUE(sim->races().empty());
  EXPECT_TRUE(sim->invalid_accesses().empty());
}

TEST(Compaction, MovesAConstantToServeARequestOnTheHost) {
  compaction_scenario(Backend::kCpu, true);
  compaction_scenario(Backend::kCpu, false);
}

TEST(Compaction, MovesAConstantToServeARequestOnTheSimulatedDevice) {
  compaction_scenario(Backend::kCuda, true);
  compaction_scenario(Backend::kCuda, false);
}

// The same fragmented memory, and an op whose kernel asks for 2 MiB of scratch (its output
// is 4 bytes): a request from a running kernel may not move anything, so undeclared it is out
// of memory; declared (OpDef::scratch_bytes) it is reserved before the kernel runs, where
// compaction makes the room, and the kernel gets it.
TEST(Compaction, DeclaredScratchIsReservedWhereCompactionCanServeIt) {
  for (const bool declared : {false, true}) {
    SCOPED_TRACE(declared ? "declared" : "undeclared");
    RuntimeOptions o;
    o.budget = std::size_t{8} << 20;
    o.allocator.medium_segment = std::size_t{4} << 20;
    Runtime rt(o);
    const std::int64_t mib = 1 << 18;  // floats
    Tensor d = rt.constant(vec(2 * mib), testing::iota(2 * mib).data());
    std::vector<Tensor> constants, transients;
    for (int i = 0; i < 3; ++i) {
      constants.push_back(rt.constant(vec(mib), testing::iota(mib, 10.0f * i).data()));
      transients.push_back(rt.call1(affine(2, 1), {constants.back()}));
    }
    transients.clear();  // three 1 MiB holes
    OpPtr sum = make_op(
        "sum_through_scratch", [](SpecList) { return Outputs{{vec(1)}}; },
        [](const KernelContext& k) {
          const std::size_t n = static_cast<std::size_t>(k.input_spec(0).numel());
          auto* copy = static_cast<float*>(k.scratch(n * sizeof(float)));
          if (copy == nullptr) throw std::runtime_error("no scratch");
          std::memcpy(copy, k.input<float>(0), n * sizeof(float));
          double total = 0;
          for (std::size_t i = 0; i < n; ++i) total += copy[i];
          k.output<float>(0)[0] = static_cast<float>(total);
        },
        [](SpecList in) { return static_cast<double>(in[0].numel()); });
    if (declared) sum = with_scratch(sum, [](SpecList in) { return in[0].bytes(); });
    if (!declared) {
      try {
        rt.call1(sum, {d});
        ADD_FAILURE() << "expected OutOfMemoryError";
      } catch (const OutOfMemoryError& e) {  // it says why nothing moved, not "could not join"
        EXPECT_EQ(e.info().moves_refused.rfind("a kernel was running", 0), 0u) << e.what();
      }
      continue;
    }
    Tensor y = rt.call1(sum, {d});
    EXPECT_GE(rt.stats().compactions, 1u);
    EXPECT_LE(rt.stats().memory.peak_reserved, o.budget);
    double expected = 0;
    for (std::int64_t i = 0; i < 2 * mib; ++i) expected += 1.0 + static_cast<double>(i);
    EXPECT_EQ(testing::read(rt, y)[0], static_cast<float>(expected));
    for (int c = 0; c < 3; ++c)
      EXPECT_EQ(testing::read(rt, constants[static_cast<std::size_t>(c)]),
                testing::iota(mib, 10.0f * c));
  }
}

// A device with less free memory than the budget (another process holds the rest): its
// out-of-memory is a refusal, handled by evicting; a request it can never serve is an
// OutOfMemoryError that says the device refused below the budget; the runtime goes on.
TEST(CudaErrors, OutOfMemoryFromTheDeviceIsARefusalAndTheRuntimeStaysUsable) {
  auto sim = std::make_shared<SimulatedCuda>(SimulatedCudaOptions{.capacity = 24 << 20});
  Runtime rt(on_sim(sim, 256 << 20));
  const OpPtr op = on_device(sim, affine(2, 1), 1000);
  Tensor x = rt.constant(vec(1 << 18), testing::iota(1 << 18).data());  // 1 MiB
  std::vector<Tensor> chain{rt.call1(op, {x})};
  for (int i = 0; i < 60; ++i) chain.push_back(rt.call1(op, {chain.back()}));
  EXPECT_GT(rt.stats().memory.source_refusals, 0u);
  EXPECT_GT(rt.stats().evictions, 0u) << "the refusals were met by evicting";
  try {
    rt.constant(vec(16 << 20), nullptr);  // 64 MiB: under the budget, over the device
    FAIL() << "expected the device's refusal";
  } catch (const OutOfMemoryError& e) {
    EXPECT_GT(e.info().source_refused, 0u) << e.what();
    EXPECT_EQ(e.info().source, "cuda");
  }
  // Still usable, and still exact: the first link recomputed from the constant.
  EXPECT_EQ(testing::read(rt, chain[0])[0], 1.0f * 2 + 1);
  Tensor z = rt.call1(op, {chain[0]});
  EXPECT_EQ(testing::read(rt, z)[0], (1.0f * 2 + 1) * 2 + 1);
  EXPECT_TRUE(sim->races().empty());
}

TEST(CudaErrors, AnyOtherMallocErrorIsACudaErrorNotAnEviction) {
  auto sim = std::make_shared<SimulatedCuda>();
  Runtime rt(on_sim(sim, 256 << 20));
  Tensor x = rt.constant(vec(1024), testing::iota(1024).data());
  sim->inject(SimulatedCall::kMalloc, SimulatedCuda::illegal_address());
  try {
    rt.constant(vec(16 << 20), nullptr);  // 64 MiB: needs a new segment
    FAIL() << "expected a CUDA error";
  } catch (const CudaError& e) {
    EXPECT_EQ(e.call(), "cudaMalloc");
    EXPECT_EQ(e.code(), 700);
    EXPECT_NE(std::string(e.what()).find("illegal memory access"), std::string::npos);
  }
  EXPECT_EQ(rt.stats().evictions, 0u);
  EXPECT_EQ(rt.stats().memory.source_refusals, 0u);
}

TEST(CudaErrors, AStickyKernelFaultNamesTheOp) {
  auto sim = std::make_shared<SimulatedCuda>();
  Runtime rt(on_sim(sim, 64 << 20));
  Tensor x = rt.constant(vec(1024), testing::iota(1024).data());
  auto boom = std::make_shared<OpDef>(*on_device(sim, affine(1, 0), 1000));
  boom->name = "boom";
  sim->inject_sticky_fault();
  try {
    rt.call1(boom, {x});
    FAIL() << "expected a CUDA error";
  } catch (const CudaError& e) {
    EXPECT_EQ(e.op(), "boom");
    EXPECT_EQ(e.code(), 700);
    EXPECT_EQ(e.device(), 0);
  }
  EXPECT_EQ(rt.stats().evictions, 0u);
  // The fault is sticky: the next call fails as a CUDA error too, never as out-of-memory.
  EXPECT_THROW(rt.call1(on_device(sim, affine(1, 0), 1000), {x}), CudaError);
}

// A kernel that faults while it runs is only seen by a later call; synchronizing after each
// launch names it.
TEST(CudaErrors, SyncAfterLaunchNamesTheFailingOp) {
  for (bool from_environment : {false, true}) {
    auto sim = std::make_shared<SimulatedCuda>();
    RuntimeOptions o = on_sim(sim, 64 << 20);
    if (from_environment) {
      setenv("REMAT_CUDA_LAUNCH_BLOCKING", "1", 1);
    } else {
      o.cuda.sync_after_launch = true;
    }
    Runtime rt(o);
    unsetenv("REMAT_CUDA_LAUNCH_BLOCKING");
    Tensor x = rt.constant(vec(1024), testing::iota(1024).data());
    Tensor y = rt.call1(on_device(sim, affine(1, 0), 1000), {x});
    auto bad = std::make_shared<OpDef>(*on_device(sim, affine(1, 0), 1000));
    bad->name = "faulting_kernel";
    sim->inject(SimulatedCall::kStreamSynchronize, SimulatedCuda::illegal_address());
    try {
      rt.call1(bad, {y});
      FAIL() << "expected a CUDA error";
    } catch (const CudaError& e) {
      EXPECT_EQ(e.op(), "faulting_kernel");
      EXPECT_EQ(e.call(), "cudaStreamSynchronize");
    }
  }
}

TEST(CudaErrors, FailingFreeIsACudaError) {
  auto sim = std::make_shared<SimulatedCuda>();
  Runtime rt(on_sim(sim, 256 << 20));
  {
    Tensor big = rt.constant(vec(16 << 20), nullptr);  // a segment of its own
  }
  sim->inject(SimulatedCall::kFree, SimulatedCuda::invalid_value());
  try {
    rt.set_budget(1 << 20);  // gives cached segments back
    FAIL() << "expected a CUDA error";
  } catch (const CudaError& e) {
    EXPECT_EQ(e.call(), "cudaFree");
  }
}

TEST(CudaErrors, FailingEventRecordIsReportedByTheNextAllocation) {
  auto sim = std::make_shared<SimulatedCuda>();
  Runtime rt(on_sim(sim, 64 << 20));
  CudaStream side = nullptr;
  sim->stream_create(&side);
  const OpPtr op = on_device(sim, affine(2, 0), 1000);
  Tensor x = rt.constant(vec(1024), testing::iota(1024).data());
  Tensor y = rt.call1(op, {x});
  rt.data(y);
  rt.record_stream(y, side);
  sim->inject(SimulatedCall::kEventRecord, SimulatedCuda::invalid_value());
  y.reset();  // a free cannot throw; the error waits for the next allocation
  try {
    rt.call1(op, {x});
    FAIL() << "expected a CUDA error";
  } catch (const CudaError& e) {
    EXPECT_EQ(e.call(), "cudaEventRecord");
  }
}

// ---------------------------------------------------------------------------------------
// Bad input

TEST(CudaInput, RecordStreamNeedsALiveResidentTensorOfThisRuntime) {
  auto sim = std::make_shared<SimulatedCuda>();
  Runtime rt(on_sim(sim, 64 << 20));
  Runtime other(on_sim(sim, 64 << 20));
  CudaStream side = nullptr;
  sim->stream_create(&side);
  Tensor x = rt.constant(vec(1024), testing::iota(1024).data());
  Tensor y = rt.call1(on_device(sim, affine(2, 0), 1000), {x});
  Tensor foreign = other.constant(vec(4), nullptr);
  EXPECT_THROW(rt.record_stream(Tensor(), side), std::invalid_argument);
  EXPECT_THROW(rt.record_stream(foreign, side), std::invalid_argument);
  ASSERT_TRUE(rt.evict(y));
  EXPECT_THROW(rt.record_stream(y, side), std::logic_error);
  rt.data(y);
  EXPECT_NO_THROW(rt.record_stream(y, side));
}

TEST(CudaInput, ADeviceThatDoesNotExistIsNamed) {
  auto sim = std::make_shared<SimulatedCuda>(SimulatedCudaOptions{.devices = 2});
  RuntimeOptions o = on_sim(sim, 64 << 20);
  o.cuda.device = 3;
  try {
    Runtime rt(o);
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("device 3 does not exist (2 devices"), std::string::npos)
        << e.what();
  }
  o.cuda.device = -1;
  EXPECT_THROW(Runtime{o}, std::invalid_argument);
}

TEST(CudaInput, ABudgetBelowTheStartUpOverheadIsNamed) {
  auto sim = std::make_shared<SimulatedCuda>();
  RuntimeOptions o = on_sim(sim, 1 << 20);
  o.cuda.blas_workspace_bytes = 0;  // cuBLAS's default: 32 MiB on sm_90
  try {
    Runtime rt(o);
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("smaller than the CUDA start-up overhead"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(sim->live_allocations(), 0u);
}

// ---------------------------------------------------------------------------------------
// Devices, start-up memory, staging, timing

TEST(CudaDevice, TheCallersDeviceIsRestoredAndMemoryGoesToTheRuntimes) {
  auto sim = std::make_shared<SimulatedCuda>(SimulatedCudaOptions{.devices = 2});
  sim->set_device(1);
  RuntimeOptions o = on_sim(sim, 64 << 20);
  o.cuda.device = 0;
  {
    Runtime rt(o);
    int current = -1;
    sim->get_device(&current);
    EXPECT_EQ(current, 1);
    Tensor x = rt.constant(vec(4096), testing::iota(4096).data());
    Tensor y = rt.call1(on_device(sim, affine(2, 0), 1000), {x});
    sim->get_device(&current);
    EXPECT_EQ(current, 1);
    EXPECT_EQ(testing::read(rt, y)[1], 4.0f);
    sim->get_device(&current);
    EXPECT_EQ(current, 1);
    EXPECT_GT(sim->device_bytes_in_use(0), 0u);
    EXPECT_EQ(sim->device_bytes_in_use(1), 0u);
  }
  EXPECT_EQ(sim->device_bytes_in_use(0), 0u);  // everything given back, to device 0
  int current = -1;
  sim->get_device(&current);
  EXPECT_EQ(current, 1);
}

// Note [Restoring the caller's context]: a thread that has no context gets none back, and no
// device the program never asked for gets a primary context.
TEST(CudaDevice, AThreadWithoutAContextGetsNoneBack) {
  auto sim = std::make_shared<SimulatedCuda>(SimulatedCudaOptions{.devices = 2});
  RuntimeOptions o = on_sim(sim, 64 << 20);
  o.cuda.device = 1;
  {
    Runtime rt(o);
    Tensor x = rt.constant(vec(4096), testing::iota(4096).data());
    Tensor y = rt.call1(on_device(sim, affine(2, 0), 1000), {x});
    EXPECT_EQ(testing::read(rt, y)[1], 4.0f);
    EXPECT_EQ(sim->current_context_device(), -1);
  }
  EXPECT_EQ(sim->current_context_device(), -1);
  EXPECT_TRUE(sim->has_primary_context(1));
  EXPECT_FALSE(sim->has_primary_context(0)) << "a context on a device the program never used";
}

TEST(CudaDevice, StartUpMemoryIsMeasuredAndTheWorkspaceIsUnderTheBudget) {
  auto sim = std::make_shared<SimulatedCuda>(
      SimulatedCudaOptions{.capacity = std::size_t{1} << 30, .context_bytes = 300 << 20});
  RuntimeOptions o = on_sim(sim, 128 << 20);
  o.cuda.blas_workspace_bytes = 0;
  Runtime rt(o);
  const RuntimeStats st = rt.stats();
  EXPECT_EQ(st.cuda.device_total_bytes, std::size_t{1} << 30);
  EXPECT_EQ(st.cuda.outside_bytes, std::size_t{300} << 20);
  EXPECT_EQ(st.cuda.workspace_bytes, std::size_t{32} << 20);
  EXPECT_GE(st.memory.allocated, std::size_t{32} << 20);
  EXPECT_LE(st.memory.reserved, o.budget);

  // Kernels see it.
  void* seen = nullptr;
  std::size_t seen_bytes = 0;
  auto probe = std::make_shared<OpDef>(*on_device(sim, affine(1, 0), 100));
  auto inner = probe->cuda_kernel;
  probe->cuda_kernel = [&, inner](const KernelContext& k) {
    seen = k.workspace;
    seen_bytes = k.workspace_bytes;
    inner(k);
  };
  Tensor x = rt.constant(vec(16), testing::iota(16).data());
  rt.call1(probe, {x});
  EXPECT_NE(seen, nullptr);
  EXPECT_EQ(seen_bytes, std::size_t{32} << 20);

  auto older = std::make_shared<SimulatedCuda>(SimulatedCudaOptions{.major = 8});
  RuntimeOptions oa = on_sim(older, 128 << 20);
  oa.cuda.blas_workspace_bytes = 0;
  EXPECT_EQ(Runtime(oa).stats().cuda.workspace_bytes, std::size_t{4} << 20);
}

// Uploads return before the copy is done, through two pinned buffers; a buffer filled again
// before its copy completed would upload the wrong bytes (the simulator copies at completion).
TEST(CudaDevice, UploadsThroughPinnedStagingKeepEveryByte) {
  auto sim = std::make_shared<SimulatedCuda>(SimulatedCudaOptions{.copy_bytes_per_ns = 0.5});
  Runtime rt(on_sim(sim, 256 << 20));
  std::vector<Tensor> ts;
  std::vector<std::vector<float>> want;
  for (int i = 0; i < 12; ++i) {
    const std::int64_t n = (std::int64_t{1} << 18) * (1 + i % 5);  // 1-5 MiB: chunks and tails
    std::vector<float> buffer = testing::iota(n, static_cast<float>(i * 1000));
    ts.push_back(rt.constant(vec(n), buffer.data()));
    want.push_back(buffer);
    std::fill(buffer.begin(), buffer.end(), -1.0f);  // the caller reuses its buffer at once
  }
  EXPECT_GT(sim->calls(SimulatedCall::kMemcpy), 12u);
  EXPECT_LT(sim->calls(SimulatedCall::kStreamSynchronize), 3u) << "uploads should not wait";
  for (std::size_t i = 0; i < ts.size(); ++i) EXPECT_EQ(testing::read(rt, ts[i]), want[i]);
  EXPECT_TRUE(sim->races().empty());
}

TEST(CudaDevice, FirstRunsAreTimedWithEvents) {
  auto sim = std::make_shared<SimulatedCuda>();
  RuntimeOptions o = on_sim(sim, 64 << 20);
  o.measure_costs = true;
  Runtime rt(o);
  Tensor x = rt.constant(vec(64), testing::iota(64).data());
  const double before = rt.clock();
  rt.call1(on_device(sim, affine(1, 0), 123456), {x});
  EXPECT_NEAR(rt.clock() - before, 123456, 1);
}

TEST(CudaDevice, DeclaredWorkIsPricedByTheGpuRoofline) {
  auto sim = std::make_shared<SimulatedCuda>();
  auto op = std::make_shared<OpDef>(*on_device(sim, affine(1, 0), 100));
  op->cost = nullptr;
  op->work = [](SpecList in) { return OpWork{0, static_cast<double>(in[0].bytes()) * 2}; };
  const Roofline gpu = Roofline::gpu();
  {
    Runtime rt(on_sim(sim, 64 << 20));
    Tensor x = rt.constant(vec(1 << 20), nullptr);
    rt.call1(op, {x});
    EXPECT_DOUBLE_EQ(rt.clock(), gpu.price({0, 8.0 * (1 << 20)}));
  }
  RuntimeOptions o = on_sim(sim, 64 << 20);
  o.roofline = Roofline{1, 1, 0};
  Runtime rt(o);
  Tensor x = rt.constant(vec(1 << 20), nullptr);
  rt.call1(op, {x});
  EXPECT_DOUBLE_EQ(rt.clock(), 8.0 * (1 << 20));
}

TEST(CudaDevice, ExpandableSegmentsUseVirtualMemory) {
  auto sim = std::make_shared<SimulatedCuda>(SimulatedCudaOptions{.granularity = 1 << 20});
  RuntimeOptions o = on_sim(sim, 32 << 20);
  o.allocator.expandable_segments = true;
  Runtime rt(o);
  EXPECT_STREQ(static_cast<CachingAllocator&>(rt.memory()).source().name(), "cuda-vmm");
  const OpPtr op = on_device(sim, affine(2, 0), 1000);
  Tensor x = rt.constant(vec(1 << 18), testing::iota(1 << 18).data());
  std::vector<Tensor> keep;
  for (int i = 0; i < 40; ++i) keep.push_back(rt.call1(op, {i == 0 ? x : keep.back()}));
  const RuntimeStats st = rt.stats();
  EXPECT_GT(st.evictions, 0u);
  EXPECT_LE(st.memory.peak_reserved, o.budget);
  EXPECT_EQ(sim->device_bytes_in_use(0), st.memory.reserved);
  EXPECT_EQ(sim->live_allocations(), 0u) << "nothing came from cudaMalloc";
  EXPECT_EQ(testing::read(rt, keep.back())[0], static_cast<float>(std::int64_t{1} << 40));
}

// Unmapping does not wait for the device as cudaFree does: the arena's tail, freed while the
// kernel that wrote it is still running, is given back only after it has completed.
TEST(CudaDevice, ShrinkingTheArenaWaitsForPendingKernels) {
  auto sim = std::make_shared<SimulatedCuda>(SimulatedCudaOptions{.granularity = 1 << 20});
  RuntimeOptions o = on_sim(sim, 64 << 20);
  o.allocator.expandable_segments = true;
  Runtime rt(o);
  Tensor x = rt.constant(vec(1 << 18), testing::iota(1 << 18).data());
  Tensor y = rt.call1(on_device(sim, affine(2, 0), 1e9), {x});  // a second of kernel
  const std::size_t reserved = rt.stats().memory.reserved;
  y.reset();               // freed in stream order: the kernel still writes it
  rt.set_budget(2 << 20);  // below what is reserved: the arena's free tail goes back
  EXPECT_LT(rt.stats().memory.reserved, reserved);
  EXPECT_EQ(sim->device_bytes_in_use(0), rt.stats().memory.reserved);
  sim->synchronize_all();
  EXPECT_TRUE(sim->invalid_accesses().empty()) << sim->invalid_accesses()[0].what;
}

}  // namespace
}  // namespace remat
